/* model/config.c: the family registry (names to family tables), flavor
 * look-up, the config checks every family shares, parameter counts, FLOPs
 * per token and the Hugging Face config fields — each asking the family's
 * table (model/gpt2.c, model/llama3.c) for what is its own. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

static const tr__family_t* const families[] = {&tr__gpt2_family,
                                               &tr__llama3_family};
#define N_FAMILIES (sizeof families / sizeof families[0])

const tr__family_t* tr__family_of(tr_model_family_t id) {
  for (size_t i = 0; i < N_FAMILIES; i++)
    if (families[i]->id == id) return families[i];
  return NULL;
}

static const tr__family_t* by_name(const char* name) {
  for (size_t i = 0; name && i < N_FAMILIES; i++)
    if (strcmp(families[i]->name, name) == 0) return families[i];
  return NULL;
}

const char* tr_model_family_name(tr_model_family_t f) {
  const tr__family_t* fam = tr__family_of(f);
  return fam ? fam->name : "?";
}

int tr_model_family_from_name(const char* name, tr_model_family_t* out) {
  const tr__family_t* fam = by_name(name);
  if (!fam) return TR_ENOTFOUND;
  *out = fam->id;
  return 0;
}

const char* const* tr_model_flavors(const char* name) {
  const tr__family_t* fam = by_name(name);
  return fam ? fam->flavor_names : NULL;
}

int tr_model_config_get(const char* name, const char* flavor,
                        tr_model_config_t* out) {
  const tr__family_t* fam = by_name(name);
  if (!fam) {
    TR_LOG_ERROR(MODEL, "unknown model '%s' (known: gpt2, llama3)",
                 name ? name : "");
    return TR_ENOTFOUND;
  }
  if (flavor && fam->flavor(flavor, out) == 0) return 0;
  char known[128] = "";
  for (size_t i = 0; fam->flavor_names[i]; i++) {
    if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
    strncat(known, fam->flavor_names[i], sizeof known - strlen(known) - 1);
  }
  TR_LOG_ERROR(MODEL, "unknown %s flavor '%s' (known: %s)", name,
               flavor ? flavor : "", known);
  return TR_ENOTFOUND;
}

int tr_model_config_check(const tr_model_config_t* c, char* err,
                          size_t errlen) {
  char buf[160];
  buf[0] = 0;
  const tr__family_t* fam = tr__family_of(c->family);
  if (!fam)
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
  else if (c->dim != c->n_heads * c->head_dim)
    snprintf(buf, sizeof buf, "dim %d != n_heads %d * head_dim %d", c->dim,
             c->n_heads, c->head_dim);
  else if (fam->check(c, buf, sizeof buf)) {
    /* the family's message is in buf */
  } else if (!(c->norm_eps > 0))
    snprintf(buf, sizeof buf, "norm_eps must be positive");
  else if (c->attn_mask != TR_ATTN_CAUSAL &&
           c->attn_mask != TR_ATTN_BLOCK_CAUSAL)
    snprintf(buf, sizeof buf, "unknown attention mask %d", (int)c->attn_mask);
  else if (c->attn_mask == TR_ATTN_BLOCK_CAUSAL &&
           (c->eos_id < 0 || c->eos_id >= c->vocab_size))
    snprintf(buf, sizeof buf,
             "eos_id %d is not a token of the %d-token vocabulary",
             (int)c->eos_id, c->vocab_size);
  else if (c->sliding_window < 0)
    snprintf(buf, sizeof buf, "sliding_window must be >= 0, not %d",
             c->sliding_window);
  else if (c->document_positions && c->attn_mask != TR_ATTN_BLOCK_CAUSAL)
    snprintf(buf, sizeof buf, "document_positions needs block_causal masks");
  if (!buf[0]) return 0;
  if (err && errlen) snprintf(err, errlen, "%s", buf);
  return TR_ECONFIG;
}

int64_t tr_model_config_num_params(const tr_model_config_t* c) {
  const tr__family_t* fam = tr__family_of(c->family);
  return fam ? fam->num_params(c) : 0;
}

int64_t tr_model_activation_bytes(const tr_model_config_t* c, int first,
                                  int last, int64_t tokens, int tp,
                                  int act_size) {
  const tr__family_t* fam = tr__family_of(c->family);
  int L = c->n_layers;
  if (!fam || tp < 1 || first < 0 || last > L + 2 || first >= last) return 0;
  int64_t C = c->dim, rows = tokens / tp; /* the residual stream's */
  int64_t V = c->vocab_size % tp == 0 ? c->vocab_size / tp : c->vocab_size;
  int64_t f32 = 0, layer_f32 = 0;
  /* the range's input: the embedding's output, or the activations a
   * later stage receives */
  int64_t act = rows * C;
  int lo = first > 1 ? first : 1, hi = last < L + 1 ? last : L + 1;
  if (hi > lo) {
    act += (hi - lo) * fam->layer_act_elems(c, tokens, tp, &layer_f32);
    f32 += (hi - lo) * layer_f32;
  }
  /* the head: the final norm's output (gathered for the output
   * projection), its statistics (GPT-2's LayerNorm: mean and rstd), the
   * logits (turned into their gradient in place), the log-sum-exps and
   * the losses */
  if (last == L + 2) {
    act += tokens * C + tokens * V;
    f32 += rows * (c->family == TR_MODEL_GPT2 ? 2 : 1) + 2 * tokens;
  }
  return act * act_size + f32 * 4;
}

double tr_model_flops_per_token(const tr_model_config_t* c, int seq_len) {
  const tr__family_t* fam = tr__family_of(c->family);
  if (!fam) return 0.0;
  double n = (double)fam->num_params(c);
  double emb = (double)c->vocab_size * c->dim;
  if (!c->tie_embeddings) n -= emb; /* a lookup, not a matmul */
  n -= (double)fam->lookup_params(c);
  return 6.0 * n + 12.0 * c->n_layers * c->n_heads * c->head_dim * seq_len;
}

int tr_model_fixed_context(const tr_model_config_t* c) {
  const tr__family_t* fam = tr__family_of(c->family);
  return fam ? fam->fixed_context : 0;
}

int tr_model_hf_config(const tr_model_config_t* c, tr_hf_field_t* out,
                       int cap) {
  const tr__family_t* fam = tr__family_of(c->family);
  if (!fam) return TR_EINVAL;
  return fam->hf_config(c, out, cap);
}
