/* model/params.c: the model's parameter table and blocks (built by the
 * family's table), their memory (all of it, or a stage's blocks only), the
 * deterministic counter-based initialisation, and the hook list. */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

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
  m->family = tr__family_of(cfg->family);
  tr__table_t t = {m, 0};
  int rc = m->family->build(&t);
  if (rc < 0) tr_model_release(m);
  return rc;
}

int tr_model_param_in_blocks(const tr_model_t* m, int idx, int first,
                             int last) {
  for (int b = first < 0 ? 0 : first; b < last && b < m->n_blocks; b++)
    for (int k = 0; k < m->blocks[b].n_params; k++)
      if (m->blocks[b].params[k] == idx) return 1;
  return 0;
}

int tr_model_hold_blocks(tr_model_t* m, int first, int last) {
  if (first < 0 || last > m->n_blocks || first >= last) return TR_EINVAL;
  if (!m->held && !(m->held = calloc((size_t)m->n_blocks, 1))) return TR_ENOMEM;
  for (int b = first; b < last; b++) m->held[b] = 1;
  return 0;
}

int tr_model_block_held(const tr_model_t* m, int b) {
  return b >= 0 && b < m->n_blocks && (!m->held || m->held[b]);
}

int tr_model_alloc_blocks(tr_model_t* m, tr_device_t dev, int first, int last) {
  if (first < 0 || last > m->n_blocks || first >= last) return TR_EINVAL;
  if (first > 0 || last < m->n_blocks) TR_CHECK(tr_model_hold_blocks(m, first, last));
  if (m->n_alloc_calls && (dev.type != m->device.type ||
                           dev.index != m->device.index)) {
    TR_LOG_ERROR(MODEL, "blocks [%d, %d) on another device than before",
                 first, last);
    return TR_EINVAL;
  }
  m->device = dev;
  m->n_alloc_calls++;
  if (first > 0 || last < m->n_blocks) m->partial = 1;
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    if (p->data.storage || !tr_model_param_in_blocks(m, i, first, last))
      continue;
    TR_CHECK(tr_tensor_empty(&p->data, TR_F32, dev, p->ndim, p->layout.shape));
    TR_CHECK(tr_tensor_zeros(&p->grad, TR_F32, dev, p->ndim, p->layout.shape));
  }
  return 0;
}

int tr_model_alloc(tr_model_t* m, tr_device_t dev) {
  return tr_model_alloc_blocks(m, dev, 0, m->n_blocks);
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
    free(m->params[i].layout.placement); /* a plain heap block (dtensor) */
  }
  free(m->params);
  free(m->blocks);
  free(m->held);
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

/* ---- deterministic initialisation ----
 *
 * The value of global flat element g of a parameter is a function of
 * (seed, parameter name, g) only, so it is the same for every shard layout
 * and thread count. Elements 2i and 2i+1 share one pair of uniforms (u1,
 * u2) hashed from (key, i, draw) and take the cosine and sine halves of
 * Box-Muller: sqrt(-2 ln u1) * (cos, sin)(2 pi u2).
 *
 * The logarithm and the sine and cosine are this file's own polynomials,
 * built only from IEEE-exact operations (+ - * / sqrt and bit moves) in a
 * fixed order, with floating-point contraction off (no fused multiply-add;
 * GCC through the optimize pragma below, clang through STDC FP_CONTRACT,
 * which clang's -ffp-contract=fast alone overrides), so every compiler,
 * flag set (-O0 .. -O3, -march=native) and ISA gives the same bits; libm's
 * log and sincos differ between versions and machines. Their error against
 * long-double references over 4e7 points: det_log 3.2e-16 relative,
 * det_sincos2pi 1.5e-16 absolute. The floats they give were equal to
 * libm-based Box-Muller on the same uniforms in all of 4e7 draws;
 * tests/check_model.c bounds the difference at one float ulp.
 *
 * The work is done a block of pairs at a time, in loops GCC -O2
 * vectorises: hash the block's uniforms, uniforms to (-2 ln u1, sin, cos),
 * then the square roots (scalar: GCC's errno check around sqrt keeps that
 * loop from vectorising) and the scaled stores. */

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

static inline __attribute__((always_inline)) uint64_t mix64(uint64_t z) {
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

static inline __attribute__((always_inline)) double from_bits(uint64_t b) {
  double d;
  memcpy(&d, &b, sizeof d);
  return d;
}

static inline __attribute__((always_inline)) uint64_t to_bits(double d) {
  uint64_t b;
  memcpy(&b, &d, sizeof b);
  return b;
}

/* The two stream keys of draw `draw` under a parameter's key: pair i's
 * uniforms come from the SplitMix64 outputs mix64(k1 + i G) and
 * mix64(k2 + i G), G the golden-ratio increment. */
static void draw_keys(uint64_t key, uint64_t draw, uint64_t* k1, uint64_t* k2) {
  *k1 = mix64(key ^ mix64(draw));
  *k2 = mix64(*k1 ^ 0xd1b54a32d192ed03ull);
}

/* Uniform in (0, 1): (the top 52 bits of r + 1/2) 2^-52, from the bits of
 * 1 + (r >> 12) 2^-52 by one exact subtraction. */
static inline __attribute__((always_inline)) double unit(uint64_t r) {
  return from_bits(0x3ff0000000000000ull | (r >> 12)) - (1.0 - 0x1p-53);
}

/* The two uniforms of pair `pair` under stream keys k1, k2. */
static inline __attribute__((always_inline)) void pair_uniforms(
    uint64_t k1, uint64_t k2, uint64_t pair, double* u1, double* u2) {
  *u1 = unit(mix64(k1 + pair * 0x9e3779b97f4a7c15ull));
  *u2 = unit(mix64(k2 + pair * 0x9e3779b97f4a7c15ull));
}

#define SQRT_HALF_BITS 0x3fe6a09e667f3bcdull /* sqrt(1/2) */
#define MANT_MASK 0x000fffffffffffffull

/* ln u for a positive normal u <= 1 (relative error <= 3.2e-16). u =
 * 2^e x with x in [sqrt(1/2), sqrt(2)) by integer moves on the bits; then
 * ln x = 2 atanh(s), s = (x - 1) / (x + 1), |s| <= 0.1716, as
 * 2s + 2s z L(z), z = s^2, L a degree-6 Chebyshev fit of
 * (atanh(sqrt z) / sqrt z - 1) / z (fit error 1.6e-16, scaled by z <= 0.03
 * in the result). */
static inline __attribute__((always_inline)) double det_log(double u) {
  uint64_t t = to_bits(u) + (0x3ff0000000000000ull - SQRT_HALF_BITS);
  /* t's exponent field is e + 1023, made a double exactly */
  double e = from_bits(0x4330000000000000ull | (t >> 52)) - (0x1p52 + 1023.0);
  double x = from_bits((t & MANT_MASK) + SQRT_HALF_BITS);
  double f = x - 1.0; /* exact */
  double s = f / (2.0 + f);
  double z = s * s;
  double l = 0x1.5555555555558p-2 +
             z * (0x1.99999999952e2p-3 +
                  z * (0x1.2492492df148dp-3 +
                       z * (0x1.c71c62e5800a1p-4 +
                            z * (0x1.7462b4ab2ef6bp-4 +
                                 z * (0x1.39fe606542ddep-4 +
                                      z * 0x1.2b584aae78a57p-4)))));
  double s2 = s + s;
  return e * 0x1.62e42fefa39efp-1 + (s2 + s2 * z * l);
}

/* sin and cos of 2 pi u for u in (0, 1] (absolute error <= 1.5e-16). 4u =
 * k + d with k the nearest integer and |d| <= 1/2 (both exact), so the
 * angle is k quarter turns plus pi/2 d: sin(pi/2 d) = d S(d^2) and
 * cos(pi/2 d) = 1 + d^2 C(d^2), S and C degree-6 Chebyshev fits (errors
 * 5e-18 and 5e-19), then rotated by k quarter turns with bit moves. */
static inline __attribute__((always_inline)) void det_sincos2pi(double u,
                                                                double* sn,
                                                                double* cs) {
  double t = 4.0 * u;             /* exact */
  double kb = t + 0x1.8p52;       /* k in the low mantissa bits */
  double d = t - (kb - 0x1.8p52); /* exact */
  uint64_t q = to_bits(kb);       /* low 2 bits: k mod 4 */
  double y = d * d;
  double sp = d * (0x1.921fb54442d18p+0 +
                   y * (-0x1.4abbce625be41p-1 +
                        y * (0x1.466bc677587f8p-4 +
                             y * (-0x1.32d2cce2e5b19p-8 +
                                  y * (0x1.50782fda12d96p-13 +
                                       y * (-0x1.e30071afc3e59p-19 +
                                            y * 0x1.e3f38399551bfp-25))))));
  double cp =
      1.0 + y * (-0x1.3bd3cc9be45dep+0 +
                 y * (0x1.03c1f081b5ac0p-2 +
                      y * (-0x1.55d3c7e3cb241p-6 +
                           y * (0x1.e1f5068688d5bp-11 +
                                y * (-0x1.a6d1eef479be1p-16 +
                                     y * (0x1.f9ce245cada0bp-22 +
                                          y * -0x1.b2f3eb054afcdp-28))))));
  /* quarter turns: k = 1 maps (s, c) to (c, -s), k = 2 to (-s, -c), k = 3
   * to (-c, s) */
  uint64_t swap = 0 - (q & 1);
  uint64_t sb = to_bits(sp), cb = to_bits(cp);
  uint64_t rs = (sb & ~swap) | (cb & swap);
  uint64_t rc = (cb & ~swap) | (sb & swap);
  *sn = from_bits(rs ^ ((q & 2) << 62));
  *cs = from_bits(rc ^ (((q + 1) & 2) << 62));
}

/* Box-Muller from uniforms u1, u2: the normals are sqrt(*w) * *c (the
 * cosine half) and sqrt(*w) * *s (the sine half). The square root is left
 * to the caller: GCC's errno check around sqrt would stop the block loop
 * from vectorising. */
static inline __attribute__((always_inline)) void box_muller(
    double u1, double u2, double* w, double* s, double* c) {
  *w = -2.0 * det_log(u1);
  det_sincos2pi(u2, s, c);
}

/* Standard normal number `draw` of element g under key. */
static double normal_at(uint64_t key, uint64_t g, uint64_t draw) {
  uint64_t k1, k2;
  double u1, u2, w, s, c;
  draw_keys(key, draw, &k1, &k2);
  pair_uniforms(k1, k2, g >> 1, &u1, &u2);
  box_muller(u1, u2, &w, &s, &c);
  double rad = sqrt(w);
  return (g & 1) ? rad * s : rad * c;
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
  uint64_t k1, k2; /* draw 0's stream keys */
  int64_t n;
  int64_t base; /* global index of local element 0; -1: not one run */
} init_job_t;

#define INIT_CHUNK 65536
#define INIT_BLOCK 128 /* pairs per block */

/* On x86-64 the block loops also come as AVX2 and AVX-512 clones, picked
 * at load time (1.6x and 2x the SSE2 clone's speed): the same operations
 * on wider vectors, contraction off in every clone, so the same bits. */
#if defined(__GNUC__) && __GNUC__ >= 11 && !defined(__clang__) && \
    defined(__x86_64__) && defined(__ELF__)
#define INIT_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define INIT_CLONES
#endif

int tr_param_layout_runs(const tr_param_layout_t* l, int64_t global_rows,
                         tr_param_run_t* runs) {
  int P = l->parts > 1 ? l->parts : 1;
  if (P == 1) {
    runs[0] = (tr_param_run_t){0, l->offset[0], l->shape[0]};
    return 1;
  }
  int64_t L = l->part_rows, stride = global_rows / P;
  if (P > TR_PARAM_MAX_RUNS || L < 0 || l->skip < 0 || l->shape[0] < 0 ||
      l->skip + l->shape[0] > P * L || global_rows % P ||
      l->offset[0] + L > stride)
    return TR_EINVAL;
  int n = 0;
  for (int64_t y = l->skip, end = l->skip + l->shape[0]; y < end;) {
    int64_t j = y / L, in = y % L;
    int64_t rows = L - in < end - y ? L - in : end - y;
    runs[n++] =
        (tr_param_run_t){y - l->skip, j * stride + l->offset[0] + in, rows};
    y += rows;
  }
  if (n == 0) runs[n++] = (tr_param_run_t){0, l->offset[0], 0};
  return n;
}

/* Global flat index of local element 0 when the local part is one run of
 * the global flat order (the whole tensor, or whole rows as FSDP shards
 * along dim 0): local i is then global base + i. -1 otherwise. */
static int64_t contiguous_base(const tr_param_t* p) {
  int64_t base = 0, stride = 1;
  if (p->layout.parts > 1) return -1;
  for (int d = p->ndim - 1; d >= 0; d--) {
    if (d > 0 &&
        (p->layout.offset[d] != 0 || p->layout.shape[d] != p->shape[d]))
      return -1;
    base += p->layout.offset[d] * stride;
    stride *= p->shape[d];
  }
  return base;
}

/* Draw 0 of pairs pair0 .. pair0 + INIT_BLOCK - 1, scaled by sd: global
 * element 2 (pair0 + i) is v0[i] and 2 (pair0 + i) + 1 is v1[i]. The loop
 * from uniforms to w, s, c has a fixed trip count and no calls, so GCC
 * vectorises it (the AVX clones the hashing too; the square roots stay
 * scalar); every operation is normal_at's, in its order, hence the same
 * bits. */
static inline __attribute__((always_inline)) void normal_block(
    const init_job_t* j, uint64_t pair0, double sd, double* v0, double* v1) {
  double u1[INIT_BLOCK], u2[INIT_BLOCK], w[INIT_BLOCK];
  for (int i = 0; i < INIT_BLOCK; i++)
    pair_uniforms(j->k1, j->k2, pair0 + (uint64_t)i, &u1[i], &u2[i]);
  for (int i = 0; i < INIT_BLOCK; i++)
    box_muller(u1[i], u2[i], &w[i], &v1[i], &v0[i]);
  for (int i = 0; i < INIT_BLOCK; i++) {
    double rad = sqrt(w[i]);
    v0[i] = sd * (rad * v0[i]);
    v1[i] = sd * (rad * v1[i]);
  }
}

/* out[0, n) = the values of global elements g0 .. g0 + n - 1. A truncated
 * normal keeps draw 0 when it is inside the bounds (nearly always) and
 * otherwise takes init_value's redraws, so every value is init_value's. */
/* Global index on dim d of local index i (a strided layout's dim 0 is
 * rows of parts runs: tr_param_layout_t). */
static int64_t global_index(const tr_param_t* p, int d, int64_t i) {
  const tr_param_layout_t* l = &p->layout;
  if (d > 0 || l->parts <= 1) return l->offset[d] + i;
  int64_t y = l->skip + i;
  return y / l->part_rows * (p->shape[0] / l->parts) + l->offset[0] +
         y % l->part_rows;
}

INIT_CLONES static void fill_run(const init_job_t* j, float* out, uint64_t g0,
                                 int64_t n) {
  const tr_init_rule_t* r = &j->p->init;
  int trunc = r->kind == TR_INIT_TRUNC_NORMAL;
  double sd = r->std, lo = r->lo, hi = r->hi;
  double v0[INIT_BLOCK], v1[INIT_BLOCK];
  uint64_t g = g0, gend = g0 + (uint64_t)n;
  while (g < gend) {
    uint64_t pair0 = g >> 1;
    normal_block(j, pair0, sd, v0, v1);
    uint64_t bend = 2 * (pair0 + INIT_BLOCK);
    if (bend > gend) bend = gend;
    float* o = out + (g - g0);
    if (!(g & 1) && bend == 2 * (pair0 + INIT_BLOCK)) {
      /* the whole block: plain stores, then the bounds (both loops
       * vectorise; a double flag keeps the second in one vector type) */
      for (int i = 0; i < INIT_BLOCK; i++) {
        o[2 * i] = (float)v0[i];
        o[2 * i + 1] = (float)v1[i];
      }
      double out_of_bounds = 0.0;
      if (trunc)
        for (int i = 0; i < INIT_BLOCK; i++)
          out_of_bounds =
              ((v0[i] < lo) | (v0[i] > hi) | (v1[i] < lo) | (v1[i] > hi))
                  ? 1.0
                  : out_of_bounds;
      if (out_of_bounds == 0.0) {
        g = bend;
        continue;
      }
    }
    for (; g < bend; g++) {
      uint64_t i = (g >> 1) - pair0;
      double x = (g & 1) ? v1[i] : v0[i];
      if (trunc && !(x >= lo && x <= hi))
        out[g - g0] = init_value(r, j->key, g);
      else
        out[g - g0] = (float)x;
    }
  }
}

static void init_task(void* ctx, int64_t task) {
  const init_job_t* j = ctx;
  const tr_param_t* p = j->p;
  int64_t i0 = task * INIT_CHUNK;
  int64_t i1 = i0 + INIT_CHUNK < j->n ? i0 + INIT_CHUNK : j->n;
  if (p->init.kind == TR_INIT_ZEROS || p->init.kind == TR_INIT_ONES) {
    float v = p->init.kind == TR_INIT_ONES ? 1.0f : 0.0f;
    for (int64_t i = i0; i < i1; i++) j->data[i] = v;
    return;
  }
  if (j->base >= 0) {
    fill_run(j, j->data + i0, (uint64_t)(j->base + i0), i1 - i0);
    return;
  }
  /* a block of the last dimension (2-D shards): each local row is a run
   * of the global order (of a part, when the last dim is strided) */
  int nd = p->ndim;
  int64_t ld = p->layout.shape[nd - 1];
  for (int64_t i = i0; i < i1;) {
    int64_t rem = i / ld, col = i % ld;
    int64_t g = global_index(p, nd - 1, col), gstride = p->shape[nd - 1];
    for (int d = nd - 2; d >= 0; d--) {
      int64_t lsd = p->layout.shape[d];
      g += global_index(p, d, rem % lsd) * gstride;
      rem /= lsd;
      gstride *= p->shape[d];
    }
    int64_t run = ld - col;
    if (nd == 1 && p->layout.parts > 1) { /* to the end of its part */
      int64_t lrows = p->layout.part_rows;
      run = lrows - (p->layout.skip + col) % lrows;
    }
    int64_t len = run < i1 - i ? run : i1 - i;
    fill_run(j, j->data + i, (uint64_t)g, len);
    i += len;
  }
}

int tr_model_init_weights(tr_model_t* m, uint64_t seed) {
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    /* a pipeline rank initialises its stages' parameters only */
    if (m->partial && !p->data.storage) continue;
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
    init_job_t j = {.p = p,
                    .data = tr_tensor_data(&host),
                    .key = mix64(seed ^ name_hash(p->name)),
                    .n = tr_tensor_numel(&host),
                    .base = contiguous_base(p)};
    draw_keys(j.key, 0, &j.k1, &j.k2);
    tr_kern_cpu_parallel((j.n + INIT_CHUNK - 1) / INIT_CHUNK, init_task, &j);
    int rc =
        host.storage == p->data.storage ? 0 : tr_tensor_copy(&p->data, &host);
    tr_tensor_release(&host);
    TR_CHECK(rc);
  }
  return tr_model_refresh_compute(m);
}

#if defined(__clang__)
#pragma STDC FP_CONTRACT DEFAULT
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
