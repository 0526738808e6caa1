/* model/params.c: the parameter table and blocks of each family (Hugging
 * Face names, shapes, init rules), their memory, the deterministic
 * counter-based initialisation, and the hook list. */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* ---- building the table ---- */

typedef struct {
  tr_model_t* m;
  int cap;
} build_t;

static tr_init_rule_t rule(tr_init_kind_t k, float std, float lo, float hi) {
  tr_init_rule_t r = {k, std, lo, hi};
  return r;
}
#define ZEROS rule(TR_INIT_ZEROS, 0, 0, 0)
#define ONES rule(TR_INIT_ONES, 0, 0, 0)
#define NORMAL(s) rule(TR_INIT_NORMAL, (s), 0, 0)
/* torch.nn.init.trunc_normal_ defaults: a = -2, b = 2 (absolute) */
#define TRUNC(s) rule(TR_INIT_TRUNC_NORMAL, (s), -2.0f, 2.0f)

/* Add a parameter to the table and to block blk's list; returns its index
 * or a negative error. */
static int add_param(build_t* b, int blk, tr_init_rule_t init, int hf_t,
                     int ndim, int64_t d0, int64_t d1, const char* fmt, ...)
    __attribute__((format(printf, 8, 9)));
static int add_param(build_t* b, int blk, tr_init_rule_t init, int hf_t,
                     int ndim, int64_t d0, int64_t d1, const char* fmt, ...) {
  tr_model_t* m = b->m;
  if (m->n_params == b->cap) {
    int cap = b->cap ? 2 * b->cap : 64;
    tr_param_t* p = realloc(m->params, (size_t)cap * sizeof *p);
    if (!p) return TR_ENOMEM;
    m->params = p;
    b->cap = cap;
  }
  tr_param_t* p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->name, sizeof p->name, fmt, ap);
  va_end(ap);
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = d1;
  p->hf_layout = hf_t ? TR_HF_TRANSPOSED : TR_HF_SAME;
  p->init = init;
  p->block = blk;
  p->decay = ndim >= 2;
  for (int i = 0; i < ndim; i++) p->layout.shape[i] = p->shape[i];
  tr_model_block_t* bl = &m->blocks[blk];
  bl->params[bl->n_params++] = m->n_params;
  return m->n_params++;
}

static void use_param(tr_model_t* m, int blk, int idx) {
  tr_model_block_t* bl = &m->blocks[blk];
  bl->params[bl->n_params++] = idx;
}

#define ADD(...)                       \
  do {                                 \
    int rc__ = add_param(__VA_ARGS__); \
    if (rc__ < 0) return rc__;         \
  } while (0)

static int build_gpt2(build_t* b) {
  tr_model_t* m = b->m;
  const tr_model_config_t* c = &m->cfg;
  int64_t C = c->dim, F = c->ffn_dim, L = c->n_layers;
  float proj_std = 0.02f / sqrtf(2.0f * (float)L);
  int wte = add_param(b, 0, NORMAL(0.02f), 0, 2, c->vocab_size, C,
                      "transformer.wte.weight");
  if (wte < 0) return wte;
  ADD(b, 0, NORMAL(0.02f), 0, 2, c->max_seq_len, C, "transformer.wpe.weight");
  for (int l = 0; l < L; l++) {
    int blk = l + 1;
    const char* h = "transformer.h";
    ADD(b, blk, ONES, 0, 1, C, 0, "%s.%d.ln_1.weight", h, l);
    ADD(b, blk, ZEROS, 0, 1, C, 0, "%s.%d.ln_1.bias", h, l);
    ADD(b, blk, NORMAL(0.02f), 1, 2, 3 * C, C, "%s.%d.attn.c_attn.weight", h,
        l);
    ADD(b, blk, ZEROS, 0, 1, 3 * C, 0, "%s.%d.attn.c_attn.bias", h, l);
    ADD(b, blk, NORMAL(proj_std), 1, 2, C, C, "%s.%d.attn.c_proj.weight", h, l);
    ADD(b, blk, ZEROS, 0, 1, C, 0, "%s.%d.attn.c_proj.bias", h, l);
    ADD(b, blk, ONES, 0, 1, C, 0, "%s.%d.ln_2.weight", h, l);
    ADD(b, blk, ZEROS, 0, 1, C, 0, "%s.%d.ln_2.bias", h, l);
    ADD(b, blk, NORMAL(0.02f), 1, 2, F, C, "%s.%d.mlp.c_fc.weight", h, l);
    ADD(b, blk, ZEROS, 0, 1, F, 0, "%s.%d.mlp.c_fc.bias", h, l);
    ADD(b, blk, NORMAL(proj_std), 1, 2, C, F, "%s.%d.mlp.c_proj.weight", h, l);
    ADD(b, blk, ZEROS, 0, 1, C, 0, "%s.%d.mlp.c_proj.bias", h, l);
  }
  int head = (int)L + 1;
  ADD(b, head, ONES, 0, 1, C, 0, "transformer.ln_f.weight");
  ADD(b, head, ZEROS, 0, 1, C, 0, "transformer.ln_f.bias");
  use_param(m, head, wte); /* lm_head.weight is tied to wte */
  return 0;
}

static int build_llama(build_t* b) {
  tr_model_t* m = b->m;
  const tr_model_config_t* c = &m->cfg;
  int64_t C = c->dim, F = c->ffn_dim, D = c->head_dim;
  int64_t HD = (int64_t)c->n_heads * D, KVD = (int64_t)c->n_kv_heads * D;
  float out_std = 1.0f / sqrtf((float)C);
  tr_init_rule_t out_rule =
      rule(TR_INIT_TRUNC_NORMAL, out_std, -3 * out_std, 3 * out_std);
  int wte = add_param(b, 0, c->tie_embeddings ? out_rule : NORMAL(1.0f), 0, 2,
                      c->vocab_size, C, "model.embed_tokens.weight");
  if (wte < 0) return wte;
  for (int l = 0; l < c->n_layers; l++) {
    int blk = l + 1;
    const char* p = "model.layers";
    /* torchtitan's depth init: 0.02 / sqrt(2 (layer + 1)) */
    float std = 0.02f / sqrtf(2.0f * (float)(l + 1));
    ADD(b, blk, ONES, 0, 1, C, 0, "%s.%d.input_layernorm.weight", p, l);
    ADD(b, blk, TRUNC(0.02f), 0, 2, HD, C, "%s.%d.self_attn.q_proj.weight", p,
        l);
    ADD(b, blk, TRUNC(0.02f), 0, 2, KVD, C, "%s.%d.self_attn.k_proj.weight", p,
        l);
    ADD(b, blk, TRUNC(0.02f), 0, 2, KVD, C, "%s.%d.self_attn.v_proj.weight", p,
        l);
    ADD(b, blk, TRUNC(std), 0, 2, C, HD, "%s.%d.self_attn.o_proj.weight", p, l);
    ADD(b, blk, ONES, 0, 1, C, 0, "%s.%d.post_attention_layernorm.weight", p,
        l);
    ADD(b, blk, TRUNC(0.02f), 0, 2, F, C, "%s.%d.mlp.gate_proj.weight", p, l);
    ADD(b, blk, TRUNC(std), 0, 2, F, C, "%s.%d.mlp.up_proj.weight", p, l);
    ADD(b, blk, TRUNC(std), 0, 2, C, F, "%s.%d.mlp.down_proj.weight", p, l);
  }
  int head = c->n_layers + 1;
  ADD(b, head, ONES, 0, 1, C, 0, "model.norm.weight");
  if (c->tie_embeddings)
    use_param(m, head, wte);
  else
    ADD(b, head, out_rule, 0, 2, c->vocab_size, C, "lm_head.weight");
  return 0;
}

int tr_model_init(tr_model_t* m, const tr_model_config_t* cfg) {
  memset(m, 0, sizeof *m);
  char err[160];
  if (tr_model_config_check(cfg, err, sizeof err) < 0) {
    TR_LOG_ERROR(MODEL, "bad %s config: %s", tr_model_family_name(cfg->family),
                 err);
    return TR_ECONFIG;
  }
  m->cfg = *cfg;
  m->device = TR_DEVICE_CPU;
  m->n_blocks = cfg->n_layers + 2;
  m->blocks = calloc((size_t)m->n_blocks, sizeof *m->blocks);
  if (!m->blocks) return TR_ENOMEM;
  for (int i = 0; i < m->n_blocks; i++) {
    tr_model_block_t* bl = &m->blocks[i];
    if (i == 0) {
      bl->kind = TR_BLOCK_EMBED;
      bl->layer = -1;
      snprintf(bl->name, sizeof bl->name, "embed");
    } else if (i == m->n_blocks - 1) {
      bl->kind = TR_BLOCK_HEAD;
      bl->layer = -1;
      snprintf(bl->name, sizeof bl->name, "head");
    } else {
      bl->kind = TR_BLOCK_LAYER;
      bl->layer = i - 1;
      snprintf(bl->name, sizeof bl->name, "layers.%d", i - 1);
    }
  }
  build_t b = {m, 0};
  int rc = cfg->family == TR_MODEL_GPT2 ? build_gpt2(&b) : build_llama(&b);
  if (rc < 0) tr_model_release(m);
  return rc;
}

int tr_model_alloc(tr_model_t* m, tr_device_t dev) {
  m->device = dev;
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    if (p->data.storage) continue;
    TR_CHECK(tr_tensor_empty(&p->data, TR_F32, dev, p->ndim, p->layout.shape));
    TR_CHECK(tr_tensor_zeros(&p->grad, TR_F32, dev, p->ndim, p->layout.shape));
  }
  return 0;
}

int tr_model_set_compute_dtype(tr_model_t* m, tr_dtype_t dt, int copies) {
  if (dt != TR_F32 && dt != TR_BF16) return TR_EDTYPE;
  if (dt == TR_BF16 && m->device.type == TR_DEV_CPU) {
    TR_LOG_ERROR(MODEL, "bfloat16 compute needs a CUDA device");
    return TR_EDTYPE;
  }
  m->compute_dtype = dt;
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    tr_tensor_release(&p->compute);
    if (!copies || !p->data.storage || p->data.dtype == dt) continue;
    TR_CHECK(tr_tensor_empty(&p->compute, dt, p->data.device, p->data.ndim,
                             p->data.shape));
  }
  return tr_model_refresh_compute(m);
}

int tr_model_refresh_compute(tr_model_t* m) {
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    if (p->compute.storage) TR_CHECK(tr_tensor_copy(&p->compute, &p->data));
  }
  return 0;
}

int tr_model_zero_grad(tr_model_t* m) {
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i].grad.storage) TR_CHECK(tr_kern_zero(&m->params[i].grad));
  return 0;
}

void tr_model_release(tr_model_t* m) {
  for (int i = 0; i < m->n_params; i++) {
    tr_tensor_release(&m->params[i].data);
    tr_tensor_release(&m->params[i].grad);
    tr_tensor_release(&m->params[i].compute);
  }
  free(m->params);
  free(m->blocks);
  tr_model_clear_hooks(m);
  tr_tensor_release(&m->rope_cos);
  tr_tensor_release(&m->rope_sin);
  memset(m, 0, sizeof *m);
}

int tr_model_find_param(const tr_model_t* m, const char* name) {
  for (int i = 0; i < m->n_params; i++)
    if (strcmp(m->params[i].name, name) == 0) return i;
  return -1;
}

int64_t tr_model_num_params(const tr_model_t* m) {
  int64_t n = 0;
  for (int i = 0; i < m->n_params; i++) {
    int64_t k = 1;
    for (int d = 0; d < m->params[i].ndim; d++) k *= m->params[i].shape[d];
    n += k;
  }
  return n;
}

/* ---- hooks ---- */

int tr_model_add_hook(tr_model_t* m, tr_hook_point_t point, tr_model_hook_fn fn,
                      void* arg) {
  if ((unsigned)point >= TR_HOOK__COUNT || !fn) return TR_EINVAL;
  tr_model_hook_t* h =
      realloc(m->hooks[point], (size_t)(m->n_hooks[point] + 1) * sizeof *h);
  if (!h) return TR_ENOMEM;
  h[m->n_hooks[point]].fn = fn;
  h[m->n_hooks[point]].arg = arg;
  m->hooks[point] = h;
  m->n_hooks[point]++;
  return 0;
}

void tr_model_clear_hooks(tr_model_t* m) {
  for (int i = 0; i < TR_HOOK__COUNT; i++) {
    free(m->hooks[i]);
    m->hooks[i] = NULL;
    m->n_hooks[i] = 0;
  }
}

/* ---- deterministic initialisation ---- */

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t name_hash(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

/* Uniform in (0, 1) from 53 bits. */
static double unit(uint64_t r) { return ((double)(r >> 11) + 0.5) * 0x1p-53; }

/* Standard normal number `draw` of element g under key. Box-Muller makes
 * two normals from one pair of uniforms: elements 2i and 2i+1 share the
 * pair (key, i, draw) and take its cosine and sine halves. */
static double normal_at(uint64_t key, uint64_t g, uint64_t draw) {
  uint64_t r1 = mix64(key ^ mix64((g >> 1) * 0x9e3779b97f4a7c15ull + draw));
  uint64_t r2 = mix64(r1 ^ 0xd1b54a32d192ed03ull);
  double rad = sqrt(-2.0 * log(unit(r1)));
  double ang = 6.283185307179586 * unit(r2);
  return rad * ((g & 1) ? sin(ang) : cos(ang));
}

/* Both halves of draw 0 of a pair at once (sincos gives sin's and cos's
 * bits). */
static void normal_pair(uint64_t key, uint64_t pair, double* z0, double* z1) {
  uint64_t r1 = mix64(key ^ mix64(pair * 0x9e3779b97f4a7c15ull));
  uint64_t r2 = mix64(r1 ^ 0xd1b54a32d192ed03ull);
  double rad = sqrt(-2.0 * log(unit(r1)));
  double s, c;
  sincos(6.283185307179586 * unit(r2), &s, &c);
  *z0 = rad * c;
  *z1 = rad * s;
}

static float init_value(const tr_init_rule_t* r, uint64_t key, uint64_t g) {
  switch (r->kind) {
    case TR_INIT_ZEROS:
      return 0.0f;
    case TR_INIT_ONES:
      return 1.0f;
    case TR_INIT_NORMAL:
      return (float)(r->std * normal_at(key, g, 0));
    case TR_INIT_TRUNC_NORMAL:
      /* redraw until inside [lo, hi]: the draw count is part of the
       * counter, so the value still depends only on (key, g) */
      for (uint64_t d = 0; d < 1000; d++) {
        double v = r->std * normal_at(key, g, d);
        if (v >= r->lo && v <= r->hi) return (float)v;
      }
      return 0.0f;
  }
  return 0.0f;
}

typedef struct {
  const tr_param_t* p;
  float* data;
  uint64_t key;
  int64_t n;
  int64_t base; /* global index of local element 0; -1: not one run */
} init_job_t;

#define INIT_CHUNK 65536

/* Global flat index of local element 0 when the local part is one run of
 * the global flat order (the whole tensor, or whole rows as FSDP shards
 * along dim 0): local i is then global base + i. -1 otherwise. */
static int64_t contiguous_base(const tr_param_t* p) {
  int64_t base = 0, stride = 1;
  for (int d = p->ndim - 1; d >= 0; d--) {
    if (d > 0 &&
        (p->layout.offset[d] != 0 || p->layout.shape[d] != p->shape[d]))
      return -1;
    base += p->layout.offset[d] * stride;
    stride *= p->shape[d];
  }
  return base;
}

/* Fill local [i0, i1) of a contiguous run (global index base + i): one
 * log and one sincos per pair of global indices instead of one each per
 * element. A truncated normal keeps both halves of draw 0 when they are
 * inside the bounds (nearly always) and falls back to init_value's redraws
 * otherwise, so every value is the one init_value gives. */
static void fill_pairs(const init_job_t* j, int64_t i0, int64_t i1) {
  const tr_init_rule_t* r = &j->p->init;
  int trunc = r->kind == TR_INIT_TRUNC_NORMAL;
  for (int64_t i = i0; i < i1;) {
    uint64_t g = (uint64_t)(j->base + i);
    double z[2];
    normal_pair(j->key, g >> 1, &z[0], &z[1]);
    /* the pair's elements that fall inside [i0, i1) */
    for (uint64_t h = g & 1; h < 2 && i < i1; h++, i++) {
      double v = r->std * z[h];
      if (trunc && !(v >= r->lo && v <= r->hi))
        j->data[i] = init_value(r, j->key, (g & ~1ull) | h);
      else
        j->data[i] = (float)v;
    }
  }
}

static void init_task(void* ctx, int64_t task) {
  const init_job_t* j = ctx;
  const tr_param_t* p = j->p;
  int64_t i0 = task * INIT_CHUNK;
  int64_t i1 = i0 + INIT_CHUNK < j->n ? i0 + INIT_CHUNK : j->n;
  if (j->base >= 0 && (p->init.kind == TR_INIT_NORMAL ||
                       p->init.kind == TR_INIT_TRUNC_NORMAL)) {
    fill_pairs(j, i0, i1);
    return;
  }
  for (int64_t i = i0; i < i1; i++) {
    /* local flat index -> global flat index through the layout */
    int64_t rem = i, g = 0, gstride = 1;
    for (int d = p->ndim - 1; d >= 0; d--) {
      int64_t ld = p->layout.shape[d];
      int64_t li = ld ? rem % ld : 0;
      rem = ld ? rem / ld : 0;
      g += (p->layout.offset[d] + li) * gstride;
      gstride *= p->shape[d];
    }
    j->data[i] = init_value(&p->init, j->key, (uint64_t)g);
  }
}

int tr_model_init_weights(tr_model_t* m, uint64_t seed) {
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    if (!p->data.storage) {
      TR_LOG_ERROR(MODEL, "init of '%s' before tr_model_alloc", p->name);
      return TR_EINVAL;
    }
    /* generated on the host, then copied to a device tensor */
    tr_tensor_t host = {0};
    if (p->data.device.type == TR_DEV_CPU && p->data.dtype == TR_F32)
      tr_tensor_view(&host, &p->data);
    else
      TR_CHECK(tr_tensor_empty(&host, TR_F32, TR_DEVICE_CPU, p->data.ndim,
                               p->data.shape));
    init_job_t j = {p, tr_tensor_data(&host), mix64(seed ^ name_hash(p->name)),
                    tr_tensor_numel(&host), contiguous_base(p)};
    tr_kern_cpu_parallel((j.n + INIT_CHUNK - 1) / INIT_CHUNK, init_task, &j);
    int rc = host.storage == p->data.storage ? 0 : tr_tensor_copy(&p->data, &host);
    tr_tensor_release(&host);
    TR_CHECK(rc);
  }
  return tr_model_refresh_compute(m);
}
