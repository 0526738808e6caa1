/* model/config.c: the GPT-2 and Llama-3 flavors, config checks, parameter
 * counts and FLOPs per token. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

int tr_model_llama_ffn_dim(int dim, float ffn_dim_multiplier, int multiple_of) {
  int hidden = (int)(2 * (4 * (int64_t)dim) / 3);
  if (ffn_dim_multiplier > 0) hidden = (int)(ffn_dim_multiplier * hidden);
  if (multiple_of < 1) multiple_of = 1;
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

typedef struct {
  const char* flavor;
  const char* alias;
  int dim, n_layers, n_heads, n_kv_heads;
  float ffn_mult;
  int multiple_of;
  float scaling_factor; /* llama3: Llama 3.1 (8) or 3.2 (32) scaling */
  int tie;
  int vocab, max_seq_len;
} flavor_t;

static const flavor_t gpt2_flavors[] = {
    {"debugmodel", NULL, 128, 4, 4, 4, 0, 0, 0, 1, 256, 256},
    {"124M", "d12", 768, 12, 12, 12, 0, 0, 0, 1, 50257, 1024},
    {"350M", "d24", 1024, 24, 16, 16, 0, 0, 0, 1, 50257, 1024},
    {"774M", "d36", 1280, 36, 20, 20, 0, 0, 0, 1, 50257, 1024},
    {"1558M", "d48", 1600, 48, 25, 25, 0, 0, 0, 1, 50257, 1024},
};

static const flavor_t llama3_flavors[] = {
    {"debugmodel", NULL, 256, 6, 16, 16, 0, 256, 8, 0, 256, 131072},
    {"1B", NULL, 2048, 16, 32, 8, 1.5f, 256, 32, 1, 128256, 131072},
    {"3B", NULL, 3072, 28, 24, 8, 1.0f, 256, 32, 1, 128256, 131072},
    {"8B", NULL, 4096, 32, 32, 8, 1.3f, 1024, 8, 0, 128256, 131072},
    {"70B", NULL, 8192, 80, 64, 8, 1.3f, 4096, 8, 0, 128256, 131072},
};

static const char* const gpt2_names[] = {"debugmodel", "124M",  "350M",
                                         "774M",       "1558M", NULL};
static const char* const llama3_names[] = {"debugmodel", "1B",  "3B",
                                           "8B",         "70B", NULL};

const char* tr_model_family_name(tr_model_family_t f) {
  return f == TR_MODEL_GPT2 ? "gpt2" : f == TR_MODEL_LLAMA3 ? "llama3" : "?";
}

const char* const* tr_model_flavors(const char* name) {
  if (name && strcmp(name, "gpt2") == 0) return gpt2_names;
  if (name && strcmp(name, "llama3") == 0) return llama3_names;
  return NULL;
}

int tr_model_config_get(const char* name, const char* flavor,
                        tr_model_config_t* out) {
  const flavor_t* list;
  size_t n;
  tr_model_family_t fam;
  if (name && strcmp(name, "gpt2") == 0) {
    list = gpt2_flavors;
    n = sizeof gpt2_flavors / sizeof gpt2_flavors[0];
    fam = TR_MODEL_GPT2;
  } else if (name && strcmp(name, "llama3") == 0) {
    list = llama3_flavors;
    n = sizeof llama3_flavors / sizeof llama3_flavors[0];
    fam = TR_MODEL_LLAMA3;
  } else {
    TR_LOG_ERROR(MODEL, "unknown model '%s' (known: gpt2, llama3)",
                 name ? name : "");
    return TR_ENOTFOUND;
  }
  const flavor_t* f = NULL;
  for (size_t i = 0; i < n && flavor; i++)
    if (strcmp(list[i].flavor, flavor) == 0 ||
        (list[i].alias && strcmp(list[i].alias, flavor) == 0))
      f = &list[i];
  if (!f) {
    char known[128] = "";
    for (size_t i = 0; i < n; i++) {
      if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
      strncat(known, list[i].flavor, sizeof known - strlen(known) - 1);
    }
    TR_LOG_ERROR(MODEL, "unknown %s flavor '%s' (known: %s)", name,
                 flavor ? flavor : "", known);
    return TR_ENOTFOUND;
  }
  memset(out, 0, sizeof *out);
  out->family = fam;
  snprintf(out->flavor, sizeof out->flavor, "%s", f->flavor);
  out->vocab_size = f->vocab;
  out->max_seq_len = f->max_seq_len;
  out->dim = f->dim;
  out->n_layers = f->n_layers;
  out->n_heads = f->n_heads;
  out->n_kv_heads = f->n_kv_heads;
  out->head_dim = f->dim / f->n_heads;
  out->norm_eps = 1e-5f;
  out->tie_embeddings = f->tie;
  if (fam == TR_MODEL_GPT2) {
    out->ffn_dim = 4 * f->dim;
    out->bias = 1;
  } else {
    out->ffn_dim_multiplier = f->ffn_mult;
    out->multiple_of = f->multiple_of;
    out->ffn_dim = tr_model_llama_ffn_dim(f->dim, f->ffn_mult, f->multiple_of);
    out->rope_theta = 500000.0f;
    out->rope_scaling.factor = f->scaling_factor;
    out->rope_scaling.low_freq_factor = 1.0f;
    out->rope_scaling.high_freq_factor = 4.0f;
    out->rope_scaling.original_max_pos = 8192;
  }
  return 0;
}

int tr_model_config_check(const tr_model_config_t* c, char* err,
                          size_t errlen) {
  char buf[160];
  buf[0] = 0;
  if (c->family != TR_MODEL_GPT2 && c->family != TR_MODEL_LLAMA3)
    snprintf(buf, sizeof buf, "unknown model family %d", (int)c->family);
  else if (c->vocab_size < 1)
    snprintf(buf, sizeof buf, "vocab_size must be positive, not %d",
             c->vocab_size);
  else if (c->max_seq_len < 1)
    snprintf(buf, sizeof buf, "max_seq_len must be positive, not %d",
             c->max_seq_len);
  else if (c->dim < 1 || c->n_layers < 1 || c->n_heads < 1 ||
           c->n_kv_heads < 1 || c->ffn_dim < 1 || c->head_dim < 1)
    snprintf(buf, sizeof buf,
             "dim, n_layers, n_heads, n_kv_heads, head_dim and ffn_dim must "
             "be positive");
  else if (c->n_heads % c->n_kv_heads)
    snprintf(buf, sizeof buf, "n_heads %d is not a multiple of n_kv_heads %d",
             c->n_heads, c->n_kv_heads);
  else if (c->family == TR_MODEL_GPT2 && c->n_kv_heads != c->n_heads)
    snprintf(buf, sizeof buf, "gpt2 needs n_kv_heads == n_heads");
  else if (c->dim != c->n_heads * c->head_dim)
    snprintf(buf, sizeof buf, "dim %d != n_heads %d * head_dim %d", c->dim,
             c->n_heads, c->head_dim);
  else if (c->family == TR_MODEL_LLAMA3 && c->head_dim % 2)
    snprintf(buf, sizeof buf, "head_dim %d must be even for RoPE", c->head_dim);
  else if (c->family == TR_MODEL_LLAMA3 && !(c->rope_theta > 0))
    snprintf(buf, sizeof buf, "rope_theta must be positive");
  else if (!(c->norm_eps > 0))
    snprintf(buf, sizeof buf, "norm_eps must be positive");
  if (!buf[0]) return 0;
  if (err && errlen) snprintf(err, errlen, "%s", buf);
  return TR_ECONFIG;
}

int64_t tr_model_config_num_params(const tr_model_config_t* c) {
  int64_t C = c->dim, V = c->vocab_size, F = c->ffn_dim, L = c->n_layers;
  int64_t n = V * C; /* token table */
  if (c->family == TR_MODEL_GPT2) {
    n += (int64_t)c->max_seq_len * C;
    int64_t layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C +
                    (F * C + F) + (C * F + C);
    n += L * layer + 2 * C;
  } else {
    int64_t D = c->head_dim;
    int64_t layer = C + C * c->n_heads * D + 2 * C * c->n_kv_heads * D +
                    c->n_heads * D * C + C + 3 * C * F;
    n += L * layer + C;
  }
  if (!c->tie_embeddings) n += V * C;
  return n;
}

double tr_model_flops_per_token(const tr_model_config_t* c, int seq_len) {
  double n = (double)tr_model_config_num_params(c);
  double emb = (double)c->vocab_size * c->dim;
  if (!c->tie_embeddings) n -= emb; /* a lookup, not a matmul */
  if (c->family == TR_MODEL_GPT2) n -= (double)c->max_seq_len * c->dim;
  return 6.0 * n + 12.0 * c->n_layers * c->n_heads * c->head_dim * seq_len;
}
