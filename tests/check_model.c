/* tests/check_model.c: the GPT-2 and Llama-3 models.
 *
 * Configs and parameter tables (published dims, HF names and layouts,
 * counts, FLOPs), deterministic init (independent of sharding and threads;
 * the generator's floats against libm Box-Muller, its normal statistics and
 * truncation bounds), the loss of a fresh model (~ ln vocab), gradients of
 * every block and of whole tiny models (GPT-2, and Llama with GQA) against
 * central differences of the model's own fp32 forward, bit-identical
 * results for 1 and 2 threads and the same seed, hooks, activation memory
 * returned by the backward, block ranges (pipeline stages), stage-local
 * allocation (allocator counters), the tensor-parallel seam (calls per
 * layer, styles), the backward split into input and weight gradients (bit
 * for bit the combined pass's, every block kind, both families, every
 * checkpointing mode) and the Hugging Face config fields.
 *
 * Gradient checks use directional derivatives. For a tensor x with analytic
 * gradient g: u = g / max|g|, and the numeric derivative along u comes from
 * central differences with steps h and h/2 combined by Richardson
 * extrapolation (error O(h^4)), h = 20% of x's RMS (2e-2 when x is all
 * zero, like a fresh bias); it must match g.u = |g|^2 / max|g| (a wrong
 * gradient g' gives g.g' != |g'|^2). A second direction, sign(g) times
 * random weights in (0, 1), catches errors in how the gradient spreads over
 * the elements, without the cancellation of a fully random direction whose
 * small derivative drowns in fp32 noise. The forward is fp32 (~1e-7
 * relative noise on the loss), hence the tolerance
 *   |analytic - numeric| <= 2e-2 |numeric| + 1e-3 |g| |u|
 * (observed errors stay below 7e-3; wiring mistakes give O(1) errors; the
 * kernels themselves are checked to 1e-3 in check_kernels).
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/model.h"
#include "trainrun/tensor.h"

static uint64_t rng_state = 99;
static double urand(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-52 - 1.0;
}

static void tiny_gpt2(tr_model_config_t* c) {
  ck_assert_int_eq(tr_model_config_get("gpt2", "debugmodel", c), 0);
  c->vocab_size = 29;
  c->max_seq_len = 12;
  c->dim = 16;
  c->n_layers = 2;
  c->n_heads = 2;
  c->n_kv_heads = 2;
  c->head_dim = 8;
  c->ffn_dim = 64;
}

static void tiny_llama(tr_model_config_t* c) {
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", c), 0);
  c->vocab_size = 37;
  c->max_seq_len = 16;
  c->dim = 32;
  c->n_layers = 2;
  c->n_heads = 4;
  c->n_kv_heads = 2; /* GQA: two query heads per kv head */
  c->head_dim = 8;
  c->multiple_of = 16;
  c->ffn_dim = tr_model_llama_ffn_dim(32, 0, 16);
  c->rope_scaling.original_max_pos = 16; /* low dims scaled, one blended */
}

static void make_model(tr_model_t* m, const tr_model_config_t* c,
                       uint64_t seed) {
  ck_assert_int_eq(tr_model_init(m, c), 0);
  ck_assert_int_eq(tr_model_alloc(m, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(m, seed), 0);
}

static void make_batch(int V, int B, int T, int32_t* tok, int32_t* tgt,
                       int ignore_one) {
  for (int i = 0; i < B * T; i++) {
    tok[i] = (int32_t)((urand() + 1) / 2 * V) % V;
    tgt[i] = (int32_t)((urand() + 1) / 2 * V) % V;
  }
  if (ignore_one) tgt[1] = TR_IGNORE_INDEX;
}

/* mean loss of a full forward (no grad kept) */
static double loss_of(tr_model_t* m, int B, int T, const int32_t* tok,
                      const int32_t* tgt) {
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(m, &mb, B, T, tok, tgt), 0);
  mb.no_grad = 1;
  ck_assert_int_eq(tr_model_forward(m, &mb, 0, m->n_blocks), 0);
  double l = tr_model_mb_loss(&mb);
  tr_model_mb_release(m, &mb);
  return l;
}

static double train_step(tr_model_t* m, int B, int T, const int32_t* tok,
                         const int32_t* tgt) {
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_zero_grad(m), 0);
  ck_assert_int_eq(tr_model_mb_init(m, &mb, B, T, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(m, &mb, 0, m->n_blocks), 0);
  double l = tr_model_mb_loss(&mb);
  ck_assert_int_eq(tr_model_backward(m, &mb, 0, m->n_blocks), 0);
  tr_model_mb_release(m, &mb);
  return l;
}

/* ---- configs and tables ---- */

START_TEST(test_config_flavors) {
  tr_model_config_t c;
  ck_assert_int_eq(tr_model_config_get("llama3", "8B", &c), 0);
  ck_assert_int_eq(c.dim, 4096);
  ck_assert_int_eq(c.n_layers, 32);
  ck_assert_int_eq(c.n_kv_heads, 8);
  ck_assert_int_eq(c.ffn_dim, 14336);
  ck_assert_int_eq(c.vocab_size, 128256);
  ck_assert(c.rope_theta == 500000.0f && c.rope_scaling.factor == 8.0f);
  ck_assert_int_eq(tr_model_config_num_params(&c), 8030261248LL);
  ck_assert_int_eq(tr_model_config_get("llama3", "70B", &c), 0);
  ck_assert_int_eq(c.ffn_dim, 28672);
  ck_assert_int_eq(tr_model_config_num_params(&c), 70553706496LL);
  ck_assert_int_eq(tr_model_config_get("llama3", "1B", &c), 0);
  ck_assert_int_eq(c.ffn_dim, 8192);
  ck_assert_int_eq(c.tie_embeddings, 1);
  ck_assert(c.rope_scaling.factor == 32.0f);
  ck_assert_int_eq(tr_model_config_num_params(&c), 1235814400LL);
  ck_assert_int_eq(tr_model_config_get("llama3", "3B", &c), 0);
  ck_assert_int_eq(c.head_dim, 128);
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", &c), 0);
  ck_assert_int_eq(c.dim, 256);
  ck_assert_int_eq(c.n_heads, 16);
  ck_assert_int_eq(c.ffn_dim, 768);
  ck_assert_int_eq(tr_model_config_get("gpt2", "d12", &c), 0);
  ck_assert_str_eq(c.flavor, "124M");
  ck_assert_int_eq(tr_model_config_num_params(&c), 124439808LL);
  /* torchtitan's count: 6 (N - wpe) + 12 L H D T with the tied table */
  ck_assert(tr_model_flops_per_token(&c, 1024) ==
            6.0 * (124439808.0 - 1024 * 768) + 12.0 * 12 * 12 * 64 * 1024);
  ck_assert_int_eq(tr_model_config_get("gpt2", "1558M", &c), 0);
  ck_assert_int_eq(c.n_heads, 25);
  ck_assert_int_eq(tr_model_config_get("gpt2", "d48", &c), 0);
  ck_assert_int_eq(tr_model_config_get("gpt2", "13B", &c), TR_ENOTFOUND);
  ck_assert_int_eq(tr_model_config_get("bert", "base", &c), TR_ENOTFOUND);
  ck_assert_ptr_nonnull(tr_model_flavors("llama3"));
  ck_assert_str_eq(tr_model_flavors("gpt2")[1], "124M");
  /* checks name the bad field */
  char err[160];
  ck_assert_int_eq(tr_model_config_get("llama3", "8B", &c), 0);
  c.n_kv_heads = 7;
  ck_assert_int_eq(tr_model_config_check(&c, err, sizeof err), TR_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err, "n_kv_heads 7"));
  tr_model_t m;
  ck_assert_int_eq(tr_model_init(&m, &c), TR_ECONFIG);
}
END_TEST

START_TEST(test_param_table_hf_names) {
  tr_model_config_t c;
  tr_model_t m;
  ck_assert_int_eq(tr_model_config_get("gpt2", "124M", &c), 0);
  ck_assert_int_eq(tr_model_init(&m, &c), 0); /* table only: no memory */
  ck_assert_int_eq(m.n_params, 2 + 12 * 12 + 2);
  ck_assert_int_eq(m.n_blocks, 14);
  ck_assert_int_eq(tr_model_num_params(&m), 124439808LL);
  int i = tr_model_find_param(&m, "transformer.h.11.mlp.c_proj.weight");
  ck_assert_int_ge(i, 0);
  ck_assert_int_eq(m.params[i].shape[0], 768);
  ck_assert_int_eq(m.params[i].shape[1], 3072);
  ck_assert_int_eq(m.params[i].hf_layout, TR_HF_TRANSPOSED);
  ck_assert_int_eq(m.params[i].block, 12);
  ck_assert(fabsf(m.params[i].init.std - 0.02f / sqrtf(24.0f)) < 1e-9f);
  i = tr_model_find_param(&m, "transformer.h.0.attn.c_attn.bias");
  ck_assert_int_eq(m.params[i].shape[0], 2304);
  ck_assert_int_eq(m.params[i].decay, 0);
  ck_assert_int_eq(m.params[i].layout.shape[0], 2304);
  ck_assert_ptr_null(m.params[i].layout.placement);
  ck_assert_int_eq(tr_model_find_param(&m, "lm_head.weight"), -1); /* tied */
  /* the head block uses the tied table too */
  int wte = tr_model_find_param(&m, "transformer.wte.weight");
  const tr_model_block_t* head = &m.blocks[13];
  ck_assert_int_eq(head->kind, TR_BLOCK_HEAD);
  ck_assert_int_eq(head->params[head->n_params - 1], wte);
  ck_assert_str_eq(m.blocks[3].name, "layers.2");
  tr_model_release(&m);

  ck_assert_int_eq(tr_model_config_get("llama3", "8B", &c), 0);
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  ck_assert_int_eq(m.n_params, 1 + 32 * 9 + 2);
  i = tr_model_find_param(&m, "model.layers.31.self_attn.k_proj.weight");
  ck_assert_int_eq(m.params[i].shape[0], 1024);
  ck_assert_int_eq(m.params[i].shape[1], 4096);
  ck_assert_int_eq(m.params[i].hf_layout, TR_HF_SAME);
  ck_assert_int_eq(m.params[i].init.kind, TR_INIT_TRUNC_NORMAL);
  i = tr_model_find_param(&m, "model.layers.3.mlp.down_proj.weight");
  ck_assert(fabsf(m.params[i].init.std - 0.02f / sqrtf(8.0f)) < 1e-9f);
  i = tr_model_find_param(&m, "lm_head.weight");
  ck_assert_int_eq(m.params[i].shape[0], 128256);
  ck_assert(fabsf(m.params[i].init.hi - 3.0f / 64.0f) < 1e-7f);
  ck_assert_int_eq(tr_model_num_params(&m), 8030261248LL);
  tr_model_release(&m);
}
END_TEST

/* ---- init ---- */

static void stats(const tr_model_t* m, const char* name, double* mean,
                  double* std, double* lo, double* hi) {
  int i = tr_model_find_param(m, name);
  ck_assert_int_ge(i, 0);
  const float* p = tr_tensor_data(&m->params[i].data);
  int64_t n = tr_tensor_numel(&m->params[i].data);
  double s = 0, s2 = 0;
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int64_t k = 0; k < n; k++) {
    s += p[k];
    s2 += (double)p[k] * p[k];
    *lo = fmin(*lo, p[k]);
    *hi = fmax(*hi, p[k]);
  }
  *mean = s / n;
  *std = sqrt(s2 / n - *mean * *mean);
}

START_TEST(test_init_rules_and_determinism) {
  tr_model_config_t c;
  tr_model_t m, m2;
  double mean, std, lo, hi;
  ck_assert_int_eq(tr_model_config_get("gpt2", "debugmodel", &c), 0);
  make_model(&m, &c, 7);
  stats(&m, "transformer.h.1.attn.c_attn.weight", &mean, &std, &lo, &hi);
  ck_assert(fabs(mean) < 1e-3 && fabs(std - 0.02) < 0.02 * 0.03);
  stats(&m, "transformer.h.1.mlp.c_proj.weight", &mean, &std, &lo, &hi);
  ck_assert(fabs(std - 0.02 / sqrt(8.0)) < 0.02 / sqrt(8.0) * 0.03);
  stats(&m, "transformer.h.1.ln_2.weight", &mean, &std, &lo, &hi);
  ck_assert(lo == 1.0 && hi == 1.0);
  stats(&m, "transformer.h.1.ln_2.bias", &mean, &std, &lo, &hi);
  ck_assert(lo == 0.0 && hi == 0.0);
  /* same seed: same bits; another seed: different values */
  make_model(&m2, &c, 7);
  for (int i = 0; i < m.n_params; i++)
    ck_assert(memcmp(tr_tensor_data(&m.params[i].data),
                     tr_tensor_data(&m2.params[i].data),
                     tr_tensor_nbytes(&m.params[i].data)) == 0);
  ck_assert_int_eq(tr_model_init_weights(&m2, 8), 0);
  ck_assert(((float*)tr_tensor_data(&m.params[0].data))[5] !=
            ((float*)tr_tensor_data(&m2.params[0].data))[5]);
  tr_model_release(&m);
  tr_model_release(&m2);

  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", &c), 0);
  make_model(&m, &c, 7);
  stats(&m, "model.embed_tokens.weight", &mean, &std, &lo, &hi);
  ck_assert(fabs(std - 1.0) < 0.02);
  stats(&m, "model.layers.5.self_attn.o_proj.weight", &mean, &std, &lo, &hi);
  ck_assert(fabs(std - 0.02 / sqrt(12.0)) < 0.02 / sqrt(12.0) * 0.03);
  stats(&m, "lm_head.weight", &mean, &std, &lo, &hi);
  ck_assert(lo >= -3.0 / 16 && hi <= 3.0 / 16 && hi > 2.5 / 16);
  /* truncation at 3 std shrinks the std a little: 0.9866 * 1/16 */
  ck_assert(fabs(std - 0.98659 / 16) < 0.03 / 16);
  tr_model_release(&m);
}
END_TEST

START_TEST(test_init_independent_of_sharding) {
  tr_model_config_t c;
  tr_model_t full, shard;
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", &c), 0);
  make_model(&full, &c, 11);
  ck_assert_int_eq(tr_model_init(&shard, &c), 0);
  int q = tr_model_find_param(&shard, "model.layers.2.self_attn.q_proj.weight");
  int e = tr_model_find_param(&shard, "model.embed_tokens.weight");
  /* rows [96, 160) and columns [64, 192) of q; rows [200, 256) of embed */
  shard.params[q].layout.offset[0] = 96;
  shard.params[q].layout.shape[0] = 64;
  shard.params[q].layout.offset[1] = 64;
  shard.params[q].layout.shape[1] = 128;
  shard.params[e].layout.offset[0] = 200;
  shard.params[e].layout.shape[0] = 56;
  ck_assert_int_eq(tr_model_alloc(&shard, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(&shard, 11), 0);
  const float* fq = tr_tensor_data(&full.params[q].data);
  const float* sq = tr_tensor_data(&shard.params[q].data);
  for (int r = 0; r < 64; r++)
    for (int k = 0; k < 128; k++)
      ck_assert(sq[r * 128 + k] == fq[(96 + r) * 256 + 64 + k]);
  const float* fe = tr_tensor_data(&full.params[e].data);
  const float* se = tr_tensor_data(&shard.params[e].data);
  ck_assert(memcmp(se, fe + 200 * 256, 56 * 256 * sizeof(float)) == 0);
  tr_model_release(&full);
  tr_model_release(&shard);
}
END_TEST

/* ---- the init generator itself ----
 *
 * A reference of the documented generator (model/params.c): key =
 * mix64(seed ^ FNV-1a(name)); draw d's stream keys k1 = mix64(key ^
 * mix64(d)), k2 = mix64(k1 ^ 0xd1b54a32d192ed03); pair i's uniforms from
 * the top 52 bits of mix64(k1 + i G) and mix64(k2 + i G); element 2i is
 * the cosine half and 2i + 1 the sine half of Box-Muller. The reference
 * uses libm's log, sqrt and sincos; trainrun's own polynomials must give
 * the same floats but for rare one-ulp roundings. */

static uint64_t ref_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double ref_unit(uint64_t r) {
  return ((double)(r >> 12) + 0.5) * 0x1p-52;
}

static uint64_t ref_key(uint64_t seed, const char* name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *name; name++) h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
  return ref_mix64(seed ^ h);
}

/* std * (normal number `draw` of element g), libm Box-Muller */
static double ref_normal(uint64_t key, uint64_t g, uint64_t draw, float sd) {
  uint64_t k1 = ref_mix64(key ^ ref_mix64(draw));
  uint64_t k2 = ref_mix64(k1 ^ 0xd1b54a32d192ed03ull);
  uint64_t i = g >> 1;
  double u1 = ref_unit(ref_mix64(k1 + i * 0x9e3779b97f4a7c15ull));
  double u2 = ref_unit(ref_mix64(k2 + i * 0x9e3779b97f4a7c15ull));
  double rad = sqrt(-2.0 * log(u1)), s, c;
  sincos(6.283185307179586 * u2, &s, &c);
  return sd * (rad * ((g & 1) ? s : c));
}

static float ref_value(const tr_init_rule_t* r, uint64_t key, uint64_t g,
                       int* redrawn) {
  for (uint64_t d = 0; d < 1000; d++) {
    double v = ref_normal(key, g, d, r->std);
    if (r->kind != TR_INIT_TRUNC_NORMAL || (v >= r->lo && v <= r->hi))
      return (float)v;
    *redrawn = 1;
  }
  return 0.0f;
}

/* A Llama with 2^22-element embedding (N(0, 1)) and output (N(0, 1/256)
 * truncated to +-3 std) weights. */
static void big_vocab_llama(tr_model_t* m, uint64_t seed) {
  tr_model_config_t c;
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", &c), 0);
  c.vocab_size = 16384;
  c.n_layers = 1;
  ck_assert_int_eq(c.dim, 256);
  make_model(m, &c, seed);
}

static int64_t float_ulps(float a, float b) {
  int32_t x, y;
  memcpy(&x, &a, sizeof x);
  memcpy(&y, &b, sizeof y);
  if ((x < 0) != (y < 0)) return a == b ? 0 : INT32_MAX; /* +-0 */
  return x > y ? (int64_t)x - y : (int64_t)y - x;
}

START_TEST(test_init_matches_libm_box_muller) {
  tr_model_t m;
  big_vocab_llama(&m, 21);
  const char* names[] = {"model.embed_tokens.weight", "lm_head.weight"};
  for (int t = 0; t < 2; t++) {
    const tr_param_t* p = &m.params[tr_model_find_param(&m, names[t])];
    const float* x = tr_tensor_data(&p->data);
    int64_t n = tr_tensor_numel(&p->data), ndiff = 0, nredrawn = 0, worst = 0;
    uint64_t key = ref_key(21, p->name);
    for (int64_t g = 0; g < n; g++) {
      int redrawn = 0;
      float want = ref_value(&p->init, key, (uint64_t)g, &redrawn);
      nredrawn += redrawn;
      int64_t u = float_ulps(x[g], want);
      ndiff += u != 0;
      if (u > worst) worst = u;
    }
    /* seen: 0 differences in 2 x 4.2M values (and in 4e7 draws of a
     * separate sweep); one ulp is the documented bound */
    ck_assert_msg(worst <= 1 && ndiff <= n / 500000,
                  "%s: %lld of %lld values differ from libm, worst by %lld "
                  "ulp",
                  p->name, (long long)ndiff, (long long)n, (long long)worst);
    if (p->init.kind == TR_INIT_TRUNC_NORMAL) /* ~0.27% outside 3 std */
      ck_assert_msg(nredrawn > n / 500 && nredrawn < n / 250, "%lld redrawn",
                    (long long)nredrawn);
  }
  tr_model_release(&m);
}
END_TEST

START_TEST(test_init_normal_statistics) {
  tr_model_t m;
  big_vocab_llama(&m, 5);
  const tr_param_t* p =
      &m.params[tr_model_find_param(&m, "model.embed_tokens.weight")];
  const float* x = tr_tensor_data(&p->data);
  int64_t n = tr_tensor_numel(&p->data);
  ck_assert_int_eq(n, 1 << 22);
  /* moments of all, of the cosine (even) and sine (odd) halves, the
   * correlation inside a pair and between neighbouring pairs, tails and
   * the CDF at -2 .. 2 */
  double s[2] = {0}, s2[2] = {0}, s4 = 0, c01 = 0, c02 = 0, amax = 0;
  int64_t beyond3 = 0, beyond4 = 0, below[5] = {0};
  for (int64_t k = 0; k < n; k++) {
    double z = x[k];
    s[k & 1] += z;
    s2[k & 1] += z * z;
    s4 += z * z * z * z;
    if (!(k & 1)) c01 += z * x[k + 1];
    if (k + 2 < n) c02 += z * x[k + 2];
    beyond3 += fabs(z) > 3;
    beyond4 += fabs(z) > 4;
    amax = fmax(amax, fabs(z));
    for (int b = 0; b < 5; b++) below[b] += z < b - 2;
  }
  double h = n / 2.0, se = 1 / sqrt(h); /* one half's standard error */
  for (int e = 0; e < 2; e++) {
    ck_assert_msg(fabs(s[e] / h) < 5 * se, "half %d mean %g", e, s[e] / h);
    ck_assert_msg(fabs(s2[e] / h - 1) < 5 * sqrt(2.0) * se, "half %d var %g", e,
                  s2[e] / h);
  }
  double mean = (s[0] + s[1]) / n;
  double var = (s2[0] + s2[1]) / n - mean * mean;
  ck_assert_msg(fabs(mean) < 5 / sqrt(n), "mean %g", mean);
  ck_assert_msg(fabs(sqrt(var) - 1) < 5 / sqrt(2.0 * n), "std %g", sqrt(var));
  ck_assert_msg(fabs(s4 / n - 3) < 5 * sqrt(96.0 / n), "E z^4 %g", s4 / n);
  ck_assert_msg(fabs(c01 / h) < 5 * se, "pair corr %g", c01 / h);
  ck_assert_msg(fabs(c02 / n) < 5 / sqrt(n), "lag-2 corr %g", c02 / n);
  /* P(|z| > 3) = 2.6998e-3, P(|z| > 4) = 6.334e-5: 5 binomial sigmas */
  double p3 = 2.6998e-3, p4 = 6.334e-5;
  ck_assert_msg(fabs((double)beyond3 / n - p3) < 5 * sqrt(p3 / n),
                "beyond 3 sigma %g", (double)beyond3 / n);
  ck_assert_msg(fabs((double)beyond4 / n - p4) < 5 * sqrt(p4 / n),
                "beyond 4 sigma %g", (double)beyond4 / n);
  /* 52-bit uniforms: |z| <= sqrt(2 ln 2^53) = 8.57 */
  ck_assert_msg(amax > 4.5 && amax < 8.58, "max |z| %g", amax);
  const double cdf[5] = {0.0227501, 0.1586553, 0.5, 0.8413447, 0.9772499};
  for (int b = 0; b < 5; b++) {
    double f = (double)below[b] / n;
    ck_assert_msg(fabs(f - cdf[b]) < 5 * sqrt(cdf[b] * (1 - cdf[b]) / n),
                  "P(z < %d) = %g", b - 2, f);
  }

  /* truncated: inside [lo, hi], both tails reached, std of N(0, 1/256)
   * truncated at 3 std = 0.98659 / 16 */
  p = &m.params[tr_model_find_param(&m, "lm_head.weight")];
  ck_assert_int_eq(p->init.kind, TR_INIT_TRUNC_NORMAL);
  x = tr_tensor_data(&p->data);
  double lo = INFINITY, hi = -INFINITY, t2 = 0;
  for (int64_t k = 0; k < n; k++) {
    ck_assert(x[k] >= p->init.lo && x[k] <= p->init.hi);
    lo = fmin(lo, x[k]);
    hi = fmax(hi, x[k]);
    t2 += (double)x[k] * x[k];
  }
  ck_assert(lo < 0.999 * p->init.lo && hi > 0.999 * p->init.hi);
  ck_assert_msg(fabs(sqrt(t2 / n) - 0.98659 / 16) < 0.002 / 16, "std %g",
                sqrt(t2 / n));
  tr_model_release(&m);
}
END_TEST

/* The same values for 1 and 3 threads, and for 2-D shards whose row and
 * column ranges start and end inside a Box-Muller pair, for a normal (q)
 * and a truncated normal with redraws (lm_head, bounds at 3 std). */
START_TEST(test_init_threads_and_odd_2d_shards) {
  tr_model_config_t c;
  tr_model_t full, full3, shard;
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", &c), 0);
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(1), 0);
  make_model(&full, &c, 3);
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(3), 0);
  make_model(&full3, &c, 3);
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(0), 0);
  for (int i = 0; i < full.n_params; i++)
    ck_assert_msg(memcmp(tr_tensor_data(&full.params[i].data),
                         tr_tensor_data(&full3.params[i].data),
                         tr_tensor_nbytes(&full.params[i].data)) == 0,
                  "%s differs for 1 and 3 threads", full.params[i].name);
  tr_model_release(&full3);

  ck_assert_int_eq(tr_model_init(&shard, &c), 0);
  const char* names[] = {"model.layers.1.self_attn.q_proj.weight",
                         "lm_head.weight"};
  int64_t r0 = 33, nr = 91, c0 = 63, nc = 127;
  int idx[2];
  for (int t = 0; t < 2; t++) {
    idx[t] = tr_model_find_param(&shard, names[t]);
    tr_param_t* p = &shard.params[idx[t]];
    ck_assert_int_eq(p->shape[1], 256);
    p->layout.offset[0] = r0;
    p->layout.shape[0] = nr;
    p->layout.offset[1] = c0;
    p->layout.shape[1] = nc;
  }
  ck_assert_int_eq(tr_model_alloc(&shard, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(&shard, 3), 0);
  int redrawn = 0;
  for (int t = 0; t < 2; t++) {
    const float* f = tr_tensor_data(&full.params[idx[t]].data);
    const float* s = tr_tensor_data(&shard.params[idx[t]].data);
    for (int64_t r = 0; r < nr; r++)
      for (int64_t k = 0; k < nc; k++) {
        ck_assert(s[r * nc + k] == f[(r0 + r) * 256 + c0 + k]);
        if (t == 1) {
          /* the values the first draw would give outside the bounds */
          const tr_param_t* p = &shard.params[idx[t]];
          uint64_t key = ref_key(3, p->name);
          double v = ref_normal(key, (uint64_t)((r0 + r) * 256 + c0 + k), 0,
                                p->init.std);
          redrawn += !(v >= p->init.lo && v <= p->init.hi);
        }
      }
  }
  ck_assert_int_gt(redrawn, 5); /* the redraw path inside a 2-D shard */
  tr_model_release(&full);
  tr_model_release(&shard);
}
END_TEST

/* ---- loss at init ---- */

START_TEST(test_fresh_loss_near_ln_vocab) {
  tr_model_config_t c;
  tr_model_t m;
  int B = 4, T = 64;
  int32_t tok[256], tgt[256];
  ck_assert_int_eq(tr_model_config_get("gpt2", "debugmodel", &c), 0);
  make_model(&m, &c, 1);
  make_batch(c.vocab_size, B, T, tok, tgt, 0);
  double l = loss_of(&m, B, T, tok, tgt);
  /* logits ~ N(0, 0.02^2 * dim): ln V + 0.026 expected */
  ck_assert_msg(fabs(l - log(256.0)) < 0.1, "gpt2 fresh loss %g", l);
  tr_model_release(&m);
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", &c), 0);
  make_model(&m, &c, 1);
  l = loss_of(&m, B, T, tok, tgt);
  /* output std dim^-1/2 on unit-RMS features: logits ~ N(0, ~1), so
   * ln V + ~0.5 */
  ck_assert_msg(l > log(256.0) && l < log(256.0) + 1.0, "llama fresh loss %g",
                l);
  tr_model_release(&m);
}
END_TEST

/* ---- gradient checks ---- */

typedef struct {
  tr_model_t* m;
  int B, T;
  const int32_t* tok;
  const int32_t* tgt;
  int blk;          /* -1: the whole model (objective = mean loss) */
  const float* x0;  /* block input [B,T,C] (layer and head blocks) */
  const double* dy; /* upstream gradient (embed and layer blocks) */
  int64_t nout;
} obj_t;

static double objective(obj_t* o) {
  tr_model_t* m = o->m;
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(m, &mb, o->B, o->T, o->tok, o->tgt), 0);
  mb.no_grad = 1;
  double r;
  if (o->blk < 0) {
    ck_assert_int_eq(tr_model_forward(m, &mb, 0, m->n_blocks), 0);
    r = tr_model_mb_loss(&mb);
  } else {
    if (o->x0) {
      int64_t sh[3] = {o->B, o->T, m->cfg.dim};
      ck_assert_int_eq(
          tr_tensor_empty(&mb.hidden, TR_F32, TR_DEVICE_CPU, 3, sh), 0);
      memcpy(tr_tensor_data(&mb.hidden), o->x0, tr_tensor_nbytes(&mb.hidden));
    }
    ck_assert_int_eq(tr_model_block_forward(m, &mb, o->blk), 0);
    if (m->blocks[o->blk].kind == TR_BLOCK_HEAD) {
      r = tr_model_mb_loss(&mb);
    } else {
      const float* y = tr_tensor_data(&mb.hidden);
      r = 0;
      for (int64_t i = 0; i < o->nout; i++) r += o->dy[i] * y[i];
    }
  }
  tr_model_mb_release(m, &mb);
  return r;
}

/* Directional check of a float array x (the parameter data or the block
 * input) against its analytic gradient g. */
static void dir_check(const char* what, float* x, const float* g, int64_t n,
                      obj_t* o) {
  double gmax = 0, gnorm = 0, xrms = 0;
  for (int64_t i = 0; i < n; i++) {
    gmax = fmax(gmax, fabs(g[i]));
    gnorm += (double)g[i] * g[i];
    xrms += (double)x[i] * x[i];
  }
  /* a step of 20% of the tensor's RMS (2e-2 for an all-zero tensor, such as
   * a fresh bias): large enough that fp32 rounding of the objective stays
   * small beside the change, small enough to stay nearly linear */
  const double h = xrms > 0 ? 0.2 * sqrt(xrms / n) : 2e-2;
  gnorm = sqrt(gnorm);
  ck_assert_msg(gmax > 0, "%s: zero gradient", what);
  float* keep = malloc(sizeof(float) * (size_t)n);
  float* u = malloc(sizeof(float) * (size_t)n);
  memcpy(keep, x, sizeof(float) * (size_t)n);
  for (int dir = 0; dir < 2; dir++) {
    double unorm = 0, an = 0;
    for (int64_t i = 0; i < n; i++) {
      u[i] = dir == 0 ? (float)(g[i] / gmax)
                      : (float)((g[i] < 0 ? -0.5 : 0.5) * (urand() + 1));
      unorm += (double)u[i] * u[i];
      an += (double)g[i] * u[i];
    }
    double d[2]; /* central differences with h and h/2 */
    for (int k = 0; k < 2; k++) {
      double hk = k ? h / 2 : h;
      for (int64_t i = 0; i < n; i++) x[i] = keep[i] + (float)(hk * u[i]);
      double lp = objective(o);
      for (int64_t i = 0; i < n; i++) x[i] = keep[i] - (float)(hk * u[i]);
      double lm = objective(o);
      d[k] = (lp - lm) / (2 * hk);
    }
    memcpy(x, keep, sizeof(float) * (size_t)n);
    double num = (4 * d[1] - d[0]) / 3; /* Richardson: cancels the h^2 term */
    double tol = 2e-2 * fabs(num) + 1e-3 * gnorm * sqrt(unorm);
    if (getenv("TR_GRADCHECK_VERBOSE"))
      fprintf(stderr, "%-48s %s h=%.1e rel err %.2e\n", what,
              dir ? "rnd" : "grd", h, fabs(an - num) / fabs(num));
    ck_assert_msg(fabs(an - num) <= tol,
                  "%s (%s direction): analytic %.8g vs numeric %.8g", what,
                  dir == 0 ? "gradient" : "weighted", an, num);
  }
  free(keep);
  free(u);
}

static void check_params_of(tr_model_t* m, int blk, obj_t* o) {
  const tr_model_block_t* bl = &m->blocks[blk];
  for (int k = 0; k < bl->n_params; k++) {
    tr_param_t* p = &m->params[bl->params[k]];
    if (p->block != blk && o->blk >= 0) continue; /* tied: owner checks */
    dir_check(p->name, tr_tensor_data(&p->data), tr_tensor_data(&p->grad),
              tr_tensor_numel(&p->data), o);
  }
}

static void whole_model_grad(const tr_model_config_t* c) {
  tr_model_t m;
  make_model(&m, c, 3);
  int B = 2, T = 9;
  int32_t tok[18], tgt[18];
  make_batch(c->vocab_size, B, T, tok, tgt, 1);
  train_step(&m, B, T, tok, tgt);
  obj_t o = {&m, B, T, tok, tgt, -1, NULL, NULL, 0};
  for (int i = 0; i < m.n_params; i++) {
    tr_param_t* p = &m.params[i];
    dir_check(p->name, tr_tensor_data(&p->data), tr_tensor_data(&p->grad),
              tr_tensor_numel(&p->data), &o);
  }
  tr_model_release(&m);
}

START_TEST(test_whole_model_grad_gpt2) {
  tr_model_config_t c;
  tiny_gpt2(&c);
  whole_model_grad(&c);
}
END_TEST

START_TEST(test_whole_model_grad_llama_gqa) {
  tr_model_config_t c;
  tiny_llama(&c);
  whole_model_grad(&c);
}
END_TEST

/* Each block alone: random input and upstream gradient (layers), the loss
 * (head), or an upstream gradient on the embedding output. */
static void block_grads(const tr_model_config_t* c) {
  tr_model_t m;
  make_model(&m, c, 5);
  int B = 2, T = 9, C = c->dim;
  int64_t n = (int64_t)B * T * C;
  int32_t tok[18], tgt[18];
  make_batch(c->vocab_size, B, T, tok, tgt, 1);
  float* x0 = malloc(sizeof(float) * (size_t)n);
  float* dyf = malloc(sizeof(float) * (size_t)n);
  double* dy = malloc(sizeof(double) * (size_t)n);
  for (int blk = 0; blk < m.n_blocks; blk++) {
    const tr_model_block_t* bl = &m.blocks[blk];
    for (int64_t i = 0; i < n; i++) {
      x0[i] = (float)urand();
      dyf[i] = (float)urand();
      dy[i] = dyf[i];
    }
    obj_t o = {&m, B, T, tok, tgt, blk, bl->kind == TR_BLOCK_EMBED ? NULL : x0,
               dy, n};
    /* analytic: forward, set dhidden, backward */
    tr_model_mb_t mb;
    ck_assert_int_eq(tr_model_zero_grad(&m), 0);
    ck_assert_int_eq(tr_model_mb_init(&m, &mb, B, T, tok, tgt), 0);
    int64_t sh[3] = {B, T, C};
    if (o.x0) {
      ck_assert_int_eq(
          tr_tensor_empty(&mb.hidden, TR_F32, TR_DEVICE_CPU, 3, sh), 0);
      memcpy(tr_tensor_data(&mb.hidden), x0, sizeof(float) * (size_t)n);
    }
    ck_assert_int_eq(tr_model_block_forward(&m, &mb, blk), 0);
    if (bl->kind != TR_BLOCK_HEAD) {
      ck_assert_int_eq(
          tr_tensor_empty(&mb.dhidden, TR_F32, TR_DEVICE_CPU, 3, sh), 0);
      memcpy(tr_tensor_data(&mb.dhidden), dyf, sizeof(float) * (size_t)n);
    }
    ck_assert_int_eq(tr_model_block_backward(&m, &mb, blk), 0);
    if (bl->kind == TR_BLOCK_EMBED) {
      ck_assert_ptr_null(mb.dhidden.storage); /* consumed */
    } else {
      /* the input gradient */
      float* dx = malloc(sizeof(float) * (size_t)n);
      memcpy(dx, tr_tensor_data(&mb.dhidden), sizeof(float) * (size_t)n);
      dir_check(bl->name, x0, dx, n, &o);
      free(dx);
    }
    tr_model_mb_release(&m, &mb);
    check_params_of(&m, blk, &o);
  }
  free(x0);
  free(dyf);
  free(dy);
  tr_model_release(&m);
}

START_TEST(test_block_grads_gpt2) {
  tr_model_config_t c;
  tiny_gpt2(&c);
  block_grads(&c);
}
END_TEST

START_TEST(test_block_grads_llama) {
  tr_model_config_t c;
  tiny_llama(&c);
  block_grads(&c);
}
END_TEST

/* ---- determinism, implementations ---- */

static uint64_t grads_hash(const tr_model_t* m) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < m->n_params; i++) {
    const unsigned char* p = tr_tensor_data(&m->params[i].grad);
    size_t n = tr_tensor_nbytes(&m->params[i].grad);
    for (size_t k = 0; k < n; k++) h = (h ^ p[k]) * 1099511628211ull;
  }
  return h;
}

static void determinism(const char* name, const char* flavor) {
  tr_model_config_t c;
  ck_assert_int_eq(tr_model_config_get(name, flavor, &c), 0);
  int B = 2, T = 80; /* T crosses the attention tile */
  int32_t tok[160], tgt[160];
  rng_state = 5;
  make_batch(c.vocab_size, B, T, tok, tgt, 1);
  double loss[2];
  uint64_t hash[2];
  for (int run = 0; run < 2; run++) {
    tr_kern_cpu_set_num_threads(run + 1);
    tr_model_t m;
    make_model(&m, &c, 1234);
    loss[run] = train_step(&m, B, T, tok, tgt);
    hash[run] = grads_hash(&m);
    tr_model_release(&m);
  }
  tr_kern_cpu_set_num_threads(0);
  ck_assert_msg(memcmp(&loss[0], &loss[1], sizeof(double)) == 0,
                "%s loss %.17g (1 thread) vs %.17g (2 threads)", name, loss[0],
                loss[1]);
  ck_assert_msg(hash[0] == hash[1], "%s grads differ across thread counts",
                name);
}

START_TEST(test_bit_identical_1_vs_2_threads) {
  determinism("gpt2", "debugmodel");
  determinism("llama3", "debugmodel");
}
END_TEST

START_TEST(test_blas_and_blocked_agree) {
  if (!tr_kern_cpu_have_blas()) return;
  tr_model_config_t c;
  tiny_llama(&c);
  int32_t tok[18], tgt[18];
  make_batch(c.vocab_size, 2, 9, tok, tgt, 0);
  tr_model_t a, b;
  make_model(&a, &c, 9);
  make_model(&b, &c, 9);
  tr_kern_cpu_set_gemm(TR_GEMM_BLAS);
  double la = train_step(&a, 2, 9, tok, tgt);
  tr_kern_cpu_set_gemm(TR_GEMM_BLOCKED);
  double lb = train_step(&b, 2, 9, tok, tgt);
  tr_kern_cpu_set_gemm(TR_GEMM_AUTO);
  ck_assert(fabs(la - lb) < 1e-5 * la);
  for (int i = 0; i < a.n_params; i++) {
    const float* ga = tr_tensor_data(&a.params[i].grad);
    const float* gb = tr_tensor_data(&b.params[i].grad);
    int64_t n = tr_tensor_numel(&a.params[i].grad);
    double mx = 0;
    for (int64_t k = 0; k < n; k++) mx = fmax(mx, fabs(ga[k]));
    for (int64_t k = 0; k < n; k++)
      ck_assert_msg(fabs(ga[k] - gb[k]) <= 1e-4 * mx, "%s[%lld]",
                    a.params[i].name, (long long)k);
  }
  tr_model_release(&a);
  tr_model_release(&b);
}
END_TEST

/* ---- losses, ignore index, no_grad ---- */

/* ---- attention masks ---- */

#define EOS 3

/* Two rows of T tokens packed from documents of the lengths in len[] (0
 * ends a row); every document but a row's last ends with EOS. Targets
 * are the next token inside a document, ignored at its last token (the
 * next document is not predicted from this one). */
static int pack_docs(int V, int T, const int* len, int32_t* tok, int32_t* tgt) {
  int row = 0, t = 0, ndocs = 0;
  for (int d = 0; len[d] || row == 0; d++) {
    if (!len[d]) { /* next row */
      ck_assert_int_eq(t, T);
      row++, t = 0;
      continue;
    }
    int last_of_row = len[d + 1] == 0;
    for (int i = 0; i < len[d]; i++, t++) {
      int32_t x = (int32_t)((urand() + 1) / 2 * (V - 4)) % (V - 4) + 4;
      tok[row * T + t] = i == len[d] - 1 && !last_of_row ? EOS : x;
    }
    ndocs++;
  }
  ck_assert_int_eq(row, 1);
  ck_assert_int_eq(t, T);
  for (int r = 0, d = 0; r < 2; r++, d++)
    for (int t0 = 0; len[d]; t0 += len[d++])
      for (int i = 0; i < len[d]; i++)
        tgt[r * T + t0 + i] =
            i + 1 < len[d] ? tok[r * T + t0 + i + 1] : TR_IGNORE_INDEX;
  return ndocs;
}

/* block_causal with positions restarting per document: the packed
 * batch's mean loss is the token-weighted mean of each document's loss
 * computed alone (within 1e-6). */
static void packed_equals_separate(tr_model_config_t* c, int T,
                                   const int* len) {
  c->attn_mask = TR_ATTN_BLOCK_CAUSAL;
  c->eos_id = EOS;
  c->document_positions = 1;
  tr_model_t m;
  make_model(&m, c, 11);
  int32_t tok[64], tgt[64];
  pack_docs(c->vocab_size, T, len, tok, tgt);
  double packed = loss_of(&m, 2, T, tok, tgt);
  double sum = 0;
  int64_t n = 0;
  for (int r = 0, d = 0; r < 2; r++, d++)
    for (int t0 = 0; len[d]; t0 += len[d++]) {
      if (len[d] < 2) continue; /* no target */
      double l = loss_of(&m, 1, len[d], tok + r * T + t0, tgt + r * T + t0);
      sum += l * (len[d] - 1);
      n += len[d] - 1;
    }
  double sep = sum / (double)n;
  fprintf(stderr, "%s packed %.9f separate %.9f |diff| %.2g\n",
          tr_model_family_name(c->family), packed, sep, fabs(packed - sep));
  ck_assert_msg(fabs(packed - sep) <= 1e-6,
                "packed loss %.9f vs documents alone %.9f", packed, sep);
  tr_model_release(&m);
}

START_TEST(test_block_causal_packed_equals_separate) {
  /* rows of 12: documents of 4, 5, 3 and 1, 6, 5 tokens */
  const int len[] = {4, 5, 3, 0, 1, 6, 5, 0};
  tr_model_config_t c;
  tiny_gpt2(&c);
  packed_equals_separate(&c, 12, len);
  tiny_llama(&c);
  packed_equals_separate(&c, 12, len);
}
END_TEST

/* The gradient of one document's loss with respect to the embeddings of
 * the other documents' tokens (the first layer's input) is exactly 0. */
static void doc_grad_isolated(tr_model_config_t* c, int positions) {
  c->attn_mask = TR_ATTN_BLOCK_CAUSAL;
  c->eos_id = EOS;
  c->document_positions = positions;
  c->sliding_window = positions ? 0 : 5; /* and with a window */
  tr_model_t m;
  make_model(&m, c, 5);
  const int T = 12, len[] = {4, 5, 3, 0, 7, 5, 0};
  int32_t tok[24], tgt[24];
  pack_docs(c->vocab_size, T, len, tok, tgt);
  /* only document 1 of row 0 (positions 4..8) has targets */
  for (int i = 0; i < 2 * T; i++)
    if (i < 4 || i > 8) tgt[i] = TR_IGNORE_INDEX;
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_zero_grad(&m), 0);
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, T, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
  ck_assert_int_eq(tr_model_backward(&m, &mb, 1, m.n_blocks), 0);
  const float* g = tr_tensor_data(&mb.dhidden);
  int C = c->dim;
  for (int i = 0; i < 2 * T; i++) {
    double a = 0;
    for (int j = 0; j < C; j++) a += fabs(g[(int64_t)i * C + j]);
    if (i >= 4 && i < 8) /* (its last token predicts nothing) */
      ck_assert_msg(a > 0, "token %d of the document: no gradient", i);
    else if (i > 8 || i < 4)
      ck_assert_msg(a == 0, "token %d of another document: |grad| %g", i, a);
  }
  tr_model_mb_release(&m, &mb);
  tr_model_release(&m);
}

START_TEST(test_block_causal_gradient_isolated) {
  tr_model_config_t c;
  for (int p = 0; p < 2; p++) {
    tiny_gpt2(&c);
    doc_grad_isolated(&c, p);
    tiny_llama(&c);
    doc_grad_isolated(&c, p);
  }
}
END_TEST

/* A window as long as the sequence, or block_causal over tokens without
 * an EOS, is causal attention: the same bits; a shorter window is not. */
START_TEST(test_masks_that_mask_nothing) {
  tr_model_config_t c;
  tiny_llama(&c);
  int32_t tok[24], tgt[24];
  make_batch(c.vocab_size, 2, 12, tok, tgt, 0);
  for (int i = 0; i < 24; i++) tok[i] = tok[i] == EOS ? EOS + 1 : tok[i];
  tr_model_t m;
  make_model(&m, &c, 4);
  double base = loss_of(&m, 2, 12, tok, tgt);
  m.cfg.sliding_window = 12;
  ck_assert(loss_of(&m, 2, 12, tok, tgt) == base);
  m.cfg.sliding_window = 0;
  m.cfg.attn_mask = TR_ATTN_BLOCK_CAUSAL;
  m.cfg.eos_id = EOS;
  ck_assert(loss_of(&m, 2, 12, tok, tgt) == base);
  m.cfg.sliding_window = 3;
  ck_assert(loss_of(&m, 2, 12, tok, tgt) != base);
  tr_model_release(&m);
  /* the config checks */
  char err[160];
  tiny_gpt2(&c);
  c.attn_mask = TR_ATTN_BLOCK_CAUSAL;
  c.eos_id = c.vocab_size;
  ck_assert_int_eq(tr_model_config_check(&c, err, sizeof err), TR_ECONFIG);
  ck_assert_str_eq(err, "eos_id 29 is not a token of the 29-token vocabulary");
  c.attn_mask = TR_ATTN_CAUSAL;
  c.document_positions = 1;
  ck_assert_int_eq(tr_model_config_check(&c, err, sizeof err), TR_ECONFIG);
  ck_assert_str_eq(err, "document_positions needs block_causal masks");
  /* the flavors' end-of-text tokens */
  ck_assert_int_eq(tr_model_config_get("gpt2", "124M", &c), 0);
  ck_assert_int_eq(c.eos_id, 50256);
  ck_assert_int_eq(tr_model_config_get("llama3", "8B", &c), 0);
  ck_assert_int_eq(c.eos_id, 128001);
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", &c), 0);
  ck_assert_int_eq(c.eos_id, 0);
  ck_assert_int_eq(c.attn_mask, TR_ATTN_CAUSAL);
}
END_TEST

START_TEST(test_ignore_index_and_eval) {
  tr_model_config_t c;
  tiny_gpt2(&c);
  tr_model_t m;
  make_model(&m, &c, 2);
  int32_t tok[18], tgt[18];
  make_batch(c.vocab_size, 2, 9, tok, tgt, 1);
  tgt[5] = TR_IGNORE_INDEX;
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, 9, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
  ck_assert_int_eq(mb.n_valid, 16);
  const float* l = tr_tensor_data(&mb.losses);
  double s = 0;
  for (int i = 0; i < 18; i++) s += l[i];
  ck_assert(l[1] == 0.0f && l[5] == 0.0f);
  ck_assert(fabs(tr_model_mb_loss(&mb) - s / 16) < 1e-12);
  ck_assert_int_eq(mb.logits.shape[2], 29);
  tr_model_mb_release(&m, &mb);
  /* no_grad: same loss, and a backward is refused */
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, 9, tok, tgt), 0);
  mb.no_grad = 1;
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
  ck_assert(fabs(tr_model_mb_loss(&mb) - s / 16) < 1e-12);
  ck_assert_int_eq(tr_model_backward(&m, &mb, 0, m.n_blocks), TR_EINVAL);
  tr_model_mb_release(&m, &mb);
  /* no targets: logits for sampling, no loss */
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, 9, tok, NULL), 0);
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
  ck_assert_int_eq(mb.n_valid, 0);
  ck_assert(isnan(tr_model_mb_loss(&mb)));
  ck_assert_int_eq(tr_tensor_numel(&mb.logits), 2 * 9 * 29);
  tr_model_mb_release(&m, &mb);
  /* too long a sequence and bad tokens are refused */
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, 1, 13, tok, NULL), TR_EINVAL);
  tok[3] = 29;
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, 9, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), TR_EINVAL);
  tr_model_mb_release(&m, &mb);
  tr_model_release(&m);
}
END_TEST

START_TEST(test_loss_scale_and_accumulation) {
  /* two micro-batches with loss_scale = 1/(all valid tokens) accumulate the
   * gradient of the mean over both: twice the same batch == one batch */
  tr_model_config_t c;
  tiny_llama(&c);
  tr_model_t m;
  make_model(&m, &c, 4);
  int32_t tok[18], tgt[18];
  make_batch(c.vocab_size, 2, 9, tok, tgt, 0);
  train_step(&m, 2, 9, tok, tgt);
  int w = tr_model_find_param(&m, "model.layers.1.mlp.up_proj.weight");
  int64_t n = tr_tensor_numel(&m.params[w].grad);
  float* one = malloc(sizeof(float) * (size_t)n);
  memcpy(one, tr_tensor_data(&m.params[w].grad), sizeof(float) * (size_t)n);
  ck_assert_int_eq(tr_model_zero_grad(&m), 0);
  for (int rep = 0; rep < 2; rep++) {
    tr_model_mb_t mb;
    ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, 9, tok, tgt), 0);
    mb.loss_scale = 1.0f / 36;
    ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
    ck_assert_int_eq(tr_model_backward(&m, &mb, 0, m.n_blocks), 0);
    tr_model_mb_release(&m, &mb);
  }
  const float* two = tr_tensor_data(&m.params[w].grad);
  for (int64_t k = 0; k < n; k++)
    ck_assert(fabsf(two[k] - one[k]) <= 1e-6f * (fabsf(one[k]) + 1e-3f));
  free(one);
  tr_model_release(&m);
}
END_TEST

/* ---- hooks, memory, ranges, TP seam ---- */

typedef struct {
  int n;
  int point[256];
  int block[256];
  int64_t bytes[256];
  int fail_at; /* pre_forward of this block fails */
  tr_model_mb_t* mb;
  int saved_freed_ok;
} trace_t;

static int record(trace_t* t, int point, int blk) {
  tr_mem_stats_t st;
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  t->point[t->n] = point;
  t->block[t->n] = blk;
  t->bytes[t->n] = st.current_bytes;
  t->n++;
  return 0;
}
static int h_pre_f(void* a, tr_model_t* m, int blk, tr_model_mb_t* mb) {
  trace_t* t = a;
  (void)m;
  (void)mb;
  if (blk == t->fail_at) return TR_EABORTED;
  return record(t, TR_HOOK_PRE_FORWARD, blk);
}
static int h_post_f(void* a, tr_model_t* m, int blk, tr_model_mb_t* mb) {
  (void)m;
  (void)mb;
  return record(a, TR_HOOK_POST_FORWARD, blk);
}
static int h_pre_b(void* a, tr_model_t* m, int blk, tr_model_mb_t* mb) {
  (void)m;
  (void)mb;
  return record(a, TR_HOOK_PRE_BACKWARD, blk);
}
static int h_post_b(void* a, tr_model_t* m, int blk, tr_model_mb_t* mb) {
  trace_t* t = a;
  (void)m;
  if (mb->saved[blk] != NULL) t->saved_freed_ok = 0;
  return record(t, TR_HOOK_POST_BACKWARD, blk);
}

START_TEST(test_hooks_order_and_memory) {
  tr_model_config_t c;
  ck_assert_int_eq(tr_model_config_get("gpt2", "debugmodel", &c), 0);
  tr_model_t m;
  make_model(&m, &c, 1);
  trace_t t = {.fail_at = -1, .saved_freed_ok = 1};
  ck_assert_int_eq(tr_model_add_hook(&m, TR_HOOK_PRE_FORWARD, h_pre_f, &t), 0);
  ck_assert_int_eq(tr_model_add_hook(&m, TR_HOOK_POST_FORWARD, h_post_f, &t),
                   0);
  ck_assert_int_eq(tr_model_add_hook(&m, TR_HOOK_PRE_BACKWARD, h_pre_b, &t), 0);
  ck_assert_int_eq(tr_model_add_hook(&m, TR_HOOK_POST_BACKWARD, h_post_b, &t),
                   0);
  ck_assert_int_eq(tr_model_add_hook(&m, (tr_hook_point_t)9, h_pre_b, &t),
                   TR_EINVAL);
  int B = 2, T = 64;
  int32_t tok[128], tgt[128];
  make_batch(c.vocab_size, B, T, tok, tgt, 0);
  tr_mem_stats_t st;
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  int64_t before = st.current_bytes;
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, B, T, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
  ck_assert_int_eq(tr_model_backward(&m, &mb, 0, m.n_blocks), 0);
  tr_model_mb_release(&m, &mb);
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  ck_assert_int_eq(st.current_bytes, before); /* nothing left behind */
  int nb = m.n_blocks;
  ck_assert_int_eq(t.n, 4 * nb);
  for (int b = 0; b < nb; b++) { /* forward in order, backward reversed */
    ck_assert(t.point[2 * b] == TR_HOOK_PRE_FORWARD && t.block[2 * b] == b);
    ck_assert(t.point[2 * b + 1] == TR_HOOK_POST_FORWARD &&
              t.block[2 * b + 1] == b);
    int k = 2 * nb + 2 * b;
    ck_assert(t.point[k] == TR_HOOK_PRE_BACKWARD && t.block[k] == nb - 1 - b);
    ck_assert(t.point[k + 1] == TR_HOOK_POST_BACKWARD &&
              t.block[k + 1] == nb - 1 - b);
  }
  /* activations grow through the forward and are handed back by each
   * block's backward: memory after each post_backward only falls */
  ck_assert(t.bytes[2 * nb - 1] > t.bytes[0]);
  for (int b = 1; b < nb; b++)
    ck_assert_msg(t.bytes[2 * nb + 2 * b + 1] < t.bytes[2 * nb + 2 * b - 1],
                  "memory did not fall after backward of block %d",
                  t.block[2 * nb + 2 * b + 1]);
  ck_assert_int_eq(t.saved_freed_ok, 1);
  /* a failing hook stops the pass with its error */
  t.n = 0;
  t.fail_at = 2;
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, B, T, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), TR_EABORTED);
  ck_assert_int_eq(t.n, 4); /* blocks 0 and 1 only */
  tr_model_mb_release(&m, &mb);
  tr_model_clear_hooks(&m);
  tr_model_release(&m);
}
END_TEST

/* tr_model_activation_bytes is what a training forward holds when it
 * ends, byte for byte: both families (GPT-2's LayerNorm statistics and
 * fused q|k|v, Llama's grouped-query heads), the first forward's RoPE
 * tables (a model cache) left out by a warm-up */
START_TEST(test_activation_bytes) {
  for (int llama = 0; llama < 2; llama++) {
    tr_model_config_t c;
    ck_assert_int_eq(
        tr_model_config_get(llama ? "llama3" : "gpt2", "debugmodel", &c), 0);
    if (llama) c.n_kv_heads = c.n_heads / 4;
    tr_model_t m;
    make_model(&m, &c, 1);
    int B = 2, T = 64;
    int32_t tok[128], tgt[128];
    make_batch(c.vocab_size, B, T, tok, tgt, 0);
    for (int pass = 0; pass < 2; pass++) {
      tr_mem_stats_t a, b;
      tr_model_mb_t mb;
      ck_assert_int_eq(tr_model_mb_init(&m, &mb, B, T, tok, tgt), 0);
      tr_mem_stats(TR_MEM_HOST, 0, &a);
      ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
      tr_mem_stats(TR_MEM_HOST, 0, &b);
      tr_model_mb_release(&m, &mb);
      if (pass == 0) continue;
      ck_assert_int_eq(
          b.current_bytes - a.current_bytes,
          tr_model_activation_bytes(&c, 0, m.n_blocks, B * T, 1, 4));
    }
    /* as pipeline stages: blocks [0, 3) and [3, end), the second's input
     * (the activations a stage receives) held before it starts */
    tr_mem_stats_t a, b, e;
    tr_model_mb_t mb;
    ck_assert_int_eq(tr_model_mb_init(&m, &mb, B, T, tok, tgt), 0);
    tr_mem_stats(TR_MEM_HOST, 0, &a);
    ck_assert_int_eq(tr_model_forward(&m, &mb, 0, 3), 0);
    tr_mem_stats(TR_MEM_HOST, 0, &b);
    ck_assert_int_eq(tr_model_forward(&m, &mb, 3, m.n_blocks), 0);
    tr_mem_stats(TR_MEM_HOST, 0, &e);
    tr_model_mb_release(&m, &mb);
    ck_assert_int_eq(b.current_bytes - a.current_bytes,
                     tr_model_activation_bytes(&c, 0, 3, B * T, 1, 4));
    ck_assert_int_eq(e.current_bytes - b.current_bytes +
                         (int64_t)B * T * c.dim * 4,
                     tr_model_activation_bytes(&c, 3, m.n_blocks, B * T, 1, 4));
    tr_model_release(&m);
  }
}
END_TEST

START_TEST(test_block_ranges_like_pipeline_stages) {
  tr_model_config_t c;
  tiny_llama(&c);
  c.n_layers = 4;
  tr_model_t a, b;
  make_model(&a, &c, 6);
  make_model(&b, &c, 6);
  int32_t tok[18], tgt[18];
  make_batch(c.vocab_size, 2, 9, tok, tgt, 0);
  double la = train_step(&a, 2, 9, tok, tgt);
  /* stage 0 = blocks [0, 3), stage 1 = [3, 6): the hidden state and its
   * gradient cross between them through a separate micro-batch */
  tr_model_mb_t s0, s1;
  ck_assert_int_eq(tr_model_mb_init(&b, &s0, 2, 9, tok, NULL), 0);
  ck_assert_int_eq(tr_model_mb_init(&b, &s1, 2, 9, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&b, &s0, 0, 3), 0);
  ck_assert_int_eq(tr_tensor_contiguous(&s1.hidden, &s0.hidden), 0); /* send */
  ck_assert_int_eq(tr_model_forward(&b, &s1, 3, b.n_blocks), 0);
  ck_assert(memcmp(&la, &(double){tr_model_mb_loss(&s1)}, sizeof la) == 0);
  ck_assert_int_eq(tr_model_backward(&b, &s1, 3, b.n_blocks), 0);
  tr_tensor_view(&s0.dhidden, &s1.dhidden); /* send back */
  ck_assert_int_eq(tr_model_backward(&b, &s0, 0, 3), 0);
  ck_assert(grads_hash(&a) == grads_hash(&b));
  tr_model_mb_release(&b, &s0);
  tr_model_mb_release(&b, &s1);
  tr_model_release(&a);
  tr_model_release(&b);
}
END_TEST

/* ---- the tensor-parallel seam ---- */

static int tp_counts[TR_TP__POINTS];
static int tp_width; /* the residual width the hook must see */
static int tp_reduce(void* arg, tr_tp_point_t pt, tr_tp_op_t op,
                     tr_tensor_t* t) {
  (void)arg;
  ck_assert_int_eq(op, TR_TP_SUM); /* no sequence parallel */
  ck_assert_int_eq(t->shape[2], tp_width);
  tp_counts[pt]++;
  return 0;
}

/* Calls per point of each block's forward, backward, and I and W. */
static void tp_points(const tr_model_config_t* c) {
  tr_model_t m;
  make_model(&m, c, 6);
  m.tp.fn = tp_reduce;
  tp_width = c->dim;
  int32_t tok[18], tgt[18];
  make_batch(c->vocab_size, 2, 9, tok, tgt, 0);
  for (int split = 0; split < 2; split++) {
    tr_model_mb_t mb;
    ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, 9, tok, tgt), 0);
    for (int b = 0; b < m.n_blocks; b++) {
      int layer = m.blocks[b].kind == TR_BLOCK_LAYER;
      memset(tp_counts, 0, sizeof tp_counts);
      ck_assert_int_eq(tr_model_block_forward(&m, &mb, b), 0);
      ck_assert_int_eq(tp_counts[TR_TP_FWD_OUT], layer ? 2 : 0);
      ck_assert_int_eq(tp_counts[TR_TP_BWD_IN], 0);
    }
    for (int b = m.n_blocks - 1; b >= 0; b--) {
      int layer = m.blocks[b].kind == TR_BLOCK_LAYER;
      memset(tp_counts, 0, sizeof tp_counts);
      if (split) {
        ck_assert_int_eq(tr_model_block_backward_input(&m, &mb, b), 0);
        ck_assert_int_eq(tp_counts[TR_TP_BWD_IN], layer ? 2 : 0);
        ck_assert_int_eq(tr_model_block_backward_weight(&m, &mb, b), 0);
      } else {
        ck_assert_int_eq(tr_model_block_backward(&m, &mb, b), 0);
      }
      ck_assert_int_eq(tp_counts[TR_TP_FWD_OUT], 0);
      ck_assert_int_eq(tp_counts[TR_TP_BWD_IN], layer ? 2 : 0);
    }
    tr_model_mb_release(&m, &mb);
  }
  tr_model_release(&m);
}

START_TEST(test_tp_seam_points) {
  tr_model_config_t c;
  tiny_llama(&c);
  tp_points(&c);
  tiny_gpt2(&c);
  tp_points(&c);
}
END_TEST

/* With an identity hook the layers compute what they compute without one:
 * the same bits for Llama; GPT-2 adds its row-parallel biases after the
 * hook (once), which rounds differently but gives the same loss. */
START_TEST(test_tp_identity_hook_keeps_results) {
  for (int fam = 0; fam < 2; fam++) {
    tr_model_config_t c;
    if (fam)
      tiny_llama(&c);
    else
      tiny_gpt2(&c);
    tr_model_t a, b;
    make_model(&a, &c, 3);
    make_model(&b, &c, 3);
    /* non-zero biases, so adding one twice would show */
    for (int i = 0; i < b.n_params; i++) {
      if (!strstr(b.params[i].name, "c_proj.bias")) continue;
      float* x = tr_tensor_data(&a.params[i].data);
      float* y = tr_tensor_data(&b.params[i].data);
      for (int64_t k = 0; k < b.params[i].shape[0]; k++)
        x[k] = y[k] = 0.5f + 0.01f * (float)k;
    }
    b.tp.fn = tp_reduce;
    tp_width = c.dim;
    int32_t tok[18], tgt[18];
    make_batch(c.vocab_size, 2, 9, tok, tgt, 0);
    double la = train_step(&a, 2, 9, tok, tgt);
    double lb = train_step(&b, 2, 9, tok, tgt);
    if (fam) {
      ck_assert(memcmp(&la, &lb, sizeof la) == 0);
      ck_assert(grads_hash(&a) == grads_hash(&b));
    } else {
      ck_assert_msg(fabs(la - lb) <= 1e-5 * fabs(la), "gpt2 loss %.9g vs %.9g",
                    la, lb);
    }
    tr_model_release(&a);
    tr_model_release(&b);
  }
}
END_TEST

/* Every parameter declares its tensor-parallel style (torchtitan's plan). */
START_TEST(test_tp_styles) {
  static const struct {
    const char* family;
    const char* name;
    tr_tp_style_t style;
    int parts;
  } want[] = {
      {"gpt2", "transformer.wte.weight", TR_TP_VOCAB, 1},
      {"gpt2", "transformer.wpe.weight", TR_TP_REPLICATE, 1},
      {"gpt2", "transformer.h.1.ln_1.weight", TR_TP_REPLICATE, 1},
      {"gpt2", "transformer.h.1.attn.c_attn.weight", TR_TP_COLWISE, 3},
      {"gpt2", "transformer.h.1.attn.c_attn.bias", TR_TP_COLWISE, 3},
      {"gpt2", "transformer.h.1.attn.c_proj.weight", TR_TP_ROWWISE, 1},
      {"gpt2", "transformer.h.1.attn.c_proj.bias", TR_TP_REPLICATE, 1},
      {"gpt2", "transformer.h.1.mlp.c_fc.weight", TR_TP_COLWISE, 1},
      {"gpt2", "transformer.h.1.mlp.c_fc.bias", TR_TP_COLWISE, 1},
      {"gpt2", "transformer.h.1.mlp.c_proj.weight", TR_TP_ROWWISE, 1},
      {"gpt2", "transformer.h.1.mlp.c_proj.bias", TR_TP_REPLICATE, 1},
      {"gpt2", "transformer.ln_f.bias", TR_TP_REPLICATE, 1},
      {"llama3", "model.embed_tokens.weight", TR_TP_VOCAB, 1},
      {"llama3", "model.layers.1.input_layernorm.weight", TR_TP_REPLICATE, 1},
      {"llama3", "model.layers.1.self_attn.q_proj.weight", TR_TP_COLWISE, 1},
      {"llama3", "model.layers.1.self_attn.k_proj.weight", TR_TP_COLWISE, 1},
      {"llama3", "model.layers.1.self_attn.v_proj.weight", TR_TP_COLWISE, 1},
      {"llama3", "model.layers.1.self_attn.o_proj.weight", TR_TP_ROWWISE, 1},
      {"llama3", "model.layers.1.mlp.gate_proj.weight", TR_TP_COLWISE, 1},
      {"llama3", "model.layers.1.mlp.up_proj.weight", TR_TP_COLWISE, 1},
      {"llama3", "model.layers.1.mlp.down_proj.weight", TR_TP_ROWWISE, 1},
      {"llama3", "model.norm.weight", TR_TP_REPLICATE, 1},
      {"llama3", "lm_head.weight", TR_TP_OUTPUT, 1},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    tr_model_config_t c;
    ck_assert_int_eq(tr_model_config_get(want[i].family, "debugmodel", &c), 0);
    tr_model_t m;
    ck_assert_int_eq(tr_model_init(&m, &c), 0);
    int k = tr_model_find_param(&m, want[i].name);
    ck_assert_msg(k >= 0, "%s", want[i].name);
    ck_assert_msg(m.params[k].tp_style == want[i].style &&
                      m.params[k].tp_parts == want[i].parts,
                  "%s: style %d x%d", want[i].name, m.params[k].tp_style,
                  m.params[k].tp_parts);
    tr_model_release(&m);
  }
}
END_TEST

/* ---- backward split into input (I) and weight (W) gradients ---- */

static void assert_same_grads(const tr_model_t* a, const tr_model_t* b,
                              const char* what) {
  for (int i = 0; i < a->n_params; i++) {
    const tr_tensor_t* x = &a->params[i].grad;
    const tr_tensor_t* y = &b->params[i].grad;
    if (!x->storage && !y->storage) continue;
    ck_assert_msg(
        memcmp(tr_tensor_data(x), tr_tensor_data(y), tr_tensor_nbytes(x)) == 0,
        "%s: grad of %s differs", what, a->params[i].name);
  }
}

static int hook_count(void* a, tr_model_t* m, int blk, tr_model_mb_t* mb) {
  (void)m;
  (void)mb;
  (void)blk;
  ++*(int*)a;
  return 0;
}

/* Forward, then I for every block, then W for every block: each block's
 * input gradient (mb.dhidden after its I) and, in the end, every
 * parameter gradient equal the combined backward's bit for bit. Twice
 * over, so W accumulates into non-zero gradients too. */
static void split_equals_combined(const tr_model_config_t* c,
                                  tr_model_ac_mode_t ac, const char* what) {
  tr_model_t a, b;
  make_model(&a, c, 9);
  make_model(&b, c, 9);
  ck_assert_int_eq(tr_model_set_activation_checkpoint(&a, ac, 2), 0);
  ck_assert_int_eq(tr_model_set_activation_checkpoint(&b, ac, 2), 0);
  int pre = 0, post = 0;
  ck_assert_int_eq(
      tr_model_add_hook(&b, TR_HOOK_PRE_BACKWARD, hook_count, &pre), 0);
  ck_assert_int_eq(
      tr_model_add_hook(&b, TR_HOOK_POST_BACKWARD, hook_count, &post), 0);
  int B = 2, T = 9, nb = a.n_blocks;
  int32_t tok[18], tgt[18];
  make_batch(c->vocab_size, B, T, tok, tgt, 1);
  for (int round = 0; round < 2; round++) {
    tr_model_mb_t ma, mbb;
    ck_assert_int_eq(tr_model_mb_init(&a, &ma, B, T, tok, tgt), 0);
    ck_assert_int_eq(tr_model_mb_init(&b, &mbb, B, T, tok, tgt), 0);
    ck_assert_int_eq(tr_model_forward(&a, &ma, 0, nb), 0);
    ck_assert_int_eq(tr_model_forward(&b, &mbb, 0, nb), 0);
    /* W before I is refused */
    ck_assert_int_eq(tr_model_block_backward_weight(&b, &mbb, nb - 1),
                     TR_EINVAL);
    for (int blk = nb - 1; blk >= 0; blk--) {
      ck_assert_int_eq(tr_model_block_backward(&a, &ma, blk), 0);
      ck_assert_int_eq(tr_model_block_backward_input(&b, &mbb, blk), 0);
      if (blk == 0) { /* the embedding consumes its output gradient */
        ck_assert_ptr_null(ma.dhidden.storage);
        ck_assert_ptr_null(mbb.dhidden.storage);
        continue;
      }
      ck_assert_msg(
          memcmp(tr_tensor_data(&ma.dhidden), tr_tensor_data(&mbb.dhidden),
                 tr_tensor_nbytes(&ma.dhidden)) == 0,
          "%s: input gradient of block %d differs", what, blk);
    }
    ck_assert_int_eq(pre, (round + 1) * nb);
    ck_assert_int_eq(post, round * nb); /* after W only */
    /* a second I before W is refused */
    ck_assert_int_eq(tr_model_block_backward_input(&b, &mbb, 1), TR_EINVAL);
    ck_assert_int_eq(tr_model_backward_weight(&b, &mbb, 0, nb), 0);
    ck_assert_int_eq(post, (round + 1) * nb);
    assert_same_grads(&a, &b, what);
    tr_model_mb_release(&a, &ma);
    tr_model_mb_release(&b, &mbb);
  }
  tr_model_release(&a);
  tr_model_release(&b);
}

static void split_all_modes(const tr_model_config_t* c, const char* name) {
  static const struct {
    tr_model_ac_mode_t mode;
    const char* what;
  } modes[] = {{TR_AC_NONE, "ac none"},
               {TR_AC_FULL, "ac full"},
               {TR_AC_OPS, "ac op"},
               {TR_AC_LAYERS, "ac selective 2"}};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    char what[64];
    snprintf(what, sizeof what, "%s %s", name, modes[i].what);
    split_equals_combined(c, modes[i].mode, what);
  }
}

START_TEST(test_split_backward_gpt2) {
  tr_model_config_t c;
  tiny_gpt2(&c);
  split_all_modes(&c, "gpt2");
}
END_TEST

START_TEST(test_split_backward_llama) {
  tr_model_config_t c;
  tiny_llama(&c);
  split_all_modes(&c, "llama3");
  c.tie_embeddings = 1; /* the table in both end blocks */
  split_all_modes(&c, "llama3 tied");
}
END_TEST

/* An I pass whose W never runs leaves nothing behind once the micro-batch
 * is released. */
START_TEST(test_split_pending_w_released) {
  tr_model_config_t c;
  tiny_llama(&c);
  tr_model_t m;
  make_model(&m, &c, 2);
  int32_t tok[18], tgt[18];
  make_batch(c.vocab_size, 2, 9, tok, tgt, 0);
  loss_of(&m, 2, 9, tok, tgt); /* the RoPE tables stay with the model */
  tr_mem_stats_t st;
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  int64_t before = st.current_bytes;
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, 2, 9, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
  ck_assert_int_eq(tr_model_backward_input(&m, &mb, 0, m.n_blocks), 0);
  tr_model_mb_release(&m, &mb);
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  ck_assert_int_eq(st.current_bytes, before);
  tr_model_release(&m);
}
END_TEST

/* ---- stage-local allocation ---- */

static int64_t stage_param_bytes(const tr_model_t* m, int first, int last) {
  int64_t n = 0;
  for (int i = 0; i < m->n_params; i++) {
    if (!tr_model_param_in_blocks(m, i, first, last)) continue;
    int64_t k = 1;
    for (int d = 0; d < m->params[i].ndim; d++) k *= m->params[i].shape[d];
    n += 2 * k * (int64_t)sizeof(float); /* data and grad */
  }
  return n;
}

/* Allocate blocks [first, last) of a model: the allocator's counter grows
 * by exactly those blocks' parameter bytes, the others hold nothing. */
static void alloc_stage(tr_model_t* m, const tr_model_config_t* c, int first,
                        int last) {
  tr_mem_stats_t st;
  ck_assert_int_eq(tr_model_init(m, c), 0);
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  int64_t before = st.current_bytes;
  ck_assert_int_eq(tr_model_alloc_blocks(m, TR_DEVICE_CPU, first, last), 0);
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  ck_assert_int_eq(st.current_bytes - before,
                   stage_param_bytes(m, first, last));
  for (int i = 0; i < m->n_params; i++) {
    int in = tr_model_param_in_blocks(m, i, first, last);
    ck_assert_msg(
        !in == !m->params[i].data.storage && !in == !m->params[i].grad.storage,
        "%s: in stage %d, allocated %d", m->params[i].name, in,
        m->params[i].data.storage != NULL);
  }
  ck_assert_int_eq(tr_model_init_weights(m, 6), 0);
}

START_TEST(test_stage_local_allocation) {
  /* GPT-2: the tied table belongs to both end stages */
  tr_model_config_t c;
  tiny_gpt2(&c);
  c.n_layers = 4;
  tr_model_t g0, g1;
  alloc_stage(&g0, &c, 0, 3);
  alloc_stage(&g1, &c, 3, c.n_layers + 2);
  int wte = tr_model_find_param(&g0, "transformer.wte.weight");
  int wpe = tr_model_find_param(&g0, "transformer.wpe.weight");
  ck_assert_ptr_nonnull(g0.params[wte].data.storage);
  ck_assert_ptr_nonnull(g1.params[wte].data.storage);
  ck_assert_ptr_nonnull(g0.params[wpe].data.storage);
  ck_assert_ptr_null(g1.params[wpe].data.storage);
  /* a stage holds less than the whole model */
  tr_model_t whole;
  ck_assert_int_eq(tr_model_init(&whole, &c), 0);
  ck_assert(stage_param_bytes(&whole, 0, 3) <
            stage_param_bytes(&whole, 0, whole.n_blocks));
  /* a range again, or inside, adds nothing; another stage's range adds
   * its parameters (an interleaved rank's second stage) */
  ck_assert_int_eq(tr_model_alloc_blocks(&g0, TR_DEVICE_CPU, 0, 2), 0);
  ck_assert_int_eq(tr_model_alloc_blocks(&g0, TR_DEVICE_CPU, 0, 3), 0);
  int lnf = tr_model_find_param(&g0, "transformer.ln_f.weight");
  int h2 = tr_model_find_param(&g0, "transformer.h.2.ln_1.weight");
  ck_assert_ptr_null(g0.params[lnf].data.storage);
  ck_assert_int_eq(
      tr_model_alloc_blocks(&g0, TR_DEVICE_CPU, g0.n_blocks - 1, g0.n_blocks),
      0);
  ck_assert_ptr_nonnull(g0.params[lnf].data.storage);
  ck_assert_ptr_null(g0.params[h2].data.storage); /* block 3: no stage's */
  ck_assert_int_eq(tr_model_alloc_blocks(&whole, TR_DEVICE_CPU, 2, 2),
                   TR_EINVAL);
  tr_model_release(&whole);
  tr_model_release(&g0);
  tr_model_release(&g1);

  /* Llama: two stages train as the whole model does, bit for bit */
  tiny_llama(&c);
  c.n_layers = 4;
  tr_model_t a, s0, s1;
  make_model(&a, &c, 6);
  int32_t tok[18], tgt[18];
  make_batch(c.vocab_size, 2, 9, tok, tgt, 0);
  double la = train_step(&a, 2, 9, tok, tgt);
  alloc_stage(&s0, &c, 0, 3);
  alloc_stage(&s1, &c, 3, c.n_layers + 2);
  tr_model_mb_t m0, m1;
  ck_assert_int_eq(tr_model_mb_init(&s0, &m0, 2, 9, tok, NULL), 0);
  ck_assert_int_eq(tr_model_mb_init(&s1, &m1, 2, 9, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(&s0, &m0, 0, 3), 0);
  ck_assert_int_eq(tr_tensor_contiguous(&m1.hidden, &m0.hidden), 0);
  ck_assert_int_eq(tr_model_forward(&s1, &m1, 3, s1.n_blocks), 0);
  ck_assert(memcmp(&la, &(double){tr_model_mb_loss(&m1)}, sizeof la) == 0);
  ck_assert_int_eq(tr_model_backward(&s1, &m1, 3, s1.n_blocks), 0);
  tr_tensor_view(&m0.dhidden, &m1.dhidden);
  ck_assert_int_eq(tr_model_backward(&s0, &m0, 0, 3), 0);
  for (int i = 0; i < a.n_params; i++) {
    tr_model_t* s = s0.params[i].grad.storage ? &s0 : &s1;
    ck_assert_ptr_nonnull(s->params[i].grad.storage);
    ck_assert_msg(memcmp(tr_tensor_data(&a.params[i].grad),
                         tr_tensor_data(&s->params[i].grad),
                         tr_tensor_nbytes(&a.params[i].grad)) == 0,
                  "grad of %s differs", a.params[i].name);
  }
  tr_model_mb_release(&s0, &m0);
  tr_model_mb_release(&s1, &m1);
  tr_model_release(&a);
  tr_model_release(&s0);
  tr_model_release(&s1);
}
END_TEST

/* ---- Hugging Face config fields ---- */

START_TEST(test_hf_config_fields) {
  tr_model_config_t c;
  tr_hf_field_t f[TR_HF_CONFIG_MAX];
  ck_assert_int_eq(tr_model_config_get("gpt2", "124M", &c), 0);
  int n = tr_model_hf_config(&c, f, TR_HF_CONFIG_MAX);
  ck_assert_int_eq(n, 17);
  ck_assert_str_eq(f[0].key, "architectures");
  ck_assert_str_eq(f[0].s, "GPT2LMHeadModel");
  ck_assert_str_eq(f[5].key, "n_embd");
  ck_assert_int_eq(f[5].i, 768);
  ck_assert_int_eq(f[8].kind, TR_HF_NULL); /* n_inner: HF's 4 x n_embd */
  ck_assert_int_eq(tr_model_fixed_context(&c), 1); /* position table */
  ck_assert_int_eq(tr_model_hf_config(&c, f, 3), TR_ERANGE);
  ck_assert_int_eq(tr_model_config_get("llama3", "8B", &c), 0);
  n = tr_model_hf_config(&c, f, TR_HF_CONFIG_MAX);
  ck_assert_int_eq(n, 25);
  ck_assert_str_eq(f[0].s, "LlamaForCausalLM");
  ck_assert_int_eq(tr_model_fixed_context(&c), 0); /* RoPE */
  ck_assert_str_eq(f[12].key, "rope_scaling");
  ck_assert_int_eq(f[12].kind, TR_HF_OBJECT);
  ck_assert_int_eq(f[18].kind, TR_HF_END);
  c.rope_scaling.factor = 0; /* no scaling: null */
  ck_assert_int_eq(tr_model_hf_config(&c, f, TR_HF_CONFIG_MAX), 19);
  ck_assert_int_eq(f[12].kind, TR_HF_NULL);
  tr_model_family_t fam;
  ck_assert_int_eq(tr_model_family_from_name("llama3", &fam), 0);
  ck_assert_int_eq(fam, TR_MODEL_LLAMA3);
  ck_assert_int_eq(tr_model_family_from_name("gpt3", &fam), TR_ENOTFOUND);
}
END_TEST

START_TEST(test_training_reduces_loss) {
  /* a few AdamW steps on one batch must drive its loss down */
  tr_model_config_t c;
  tiny_llama(&c);
  tr_model_t m;
  make_model(&m, &c, 8);
  int32_t tok[18], tgt[18];
  make_batch(c.vocab_size, 2, 9, tok, tgt, 0);
  tr_tensor_t* mo = calloc((size_t)m.n_params, sizeof *mo);
  tr_tensor_t* vo = calloc((size_t)m.n_params, sizeof *vo);
  for (int i = 0; i < m.n_params; i++) {
    ck_assert_int_eq(tr_tensor_zeros(&mo[i], TR_F32, TR_DEVICE_CPU,
                                     m.params[i].ndim, m.params[i].shape),
                     0);
    ck_assert_int_eq(tr_tensor_zeros(&vo[i], TR_F32, TR_DEVICE_CPU,
                                     m.params[i].ndim, m.params[i].shape),
                     0);
  }
  double first = 0, last = 0;
  for (int step = 1; step <= 20; step++) {
    last = train_step(&m, 2, 9, tok, tgt);
    if (step == 1) first = last;
    tr_adamw_args_t a = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step};
    for (int i = 0; i < m.n_params; i++)
      ck_assert_int_eq(tr_kern_adamw(&m.params[i].data, &m.params[i].grad,
                                     &mo[i], &vo[i], &a),
                       0);
  }
  ck_assert_msg(last < 0.5 * first, "loss %g -> %g", first, last);
  for (int i = 0; i < m.n_params; i++) {
    tr_tensor_release(&mo[i]);
    tr_tensor_release(&vo[i]);
  }
  free(mo);
  free(vo);
  tr_model_release(&m);
}
END_TEST

static Suite* model_suite(void) {
  Suite* s = suite_create("model");
  TCase* tc = tcase_create("table");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_config_flavors);
  tcase_add_test(tc, test_param_table_hf_names);
  tcase_add_test(tc, test_init_rules_and_determinism);
  tcase_add_test(tc, test_init_independent_of_sharding);
  tcase_add_test(tc, test_init_matches_libm_box_muller);
  tcase_add_test(tc, test_init_normal_statistics);
  tcase_add_test(tc, test_init_threads_and_odd_2d_shards);
  tcase_add_test(tc, test_fresh_loss_near_ln_vocab);
  suite_add_tcase(s, tc);
  tc = tcase_create("grad");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_whole_model_grad_gpt2);
  tcase_add_test(tc, test_whole_model_grad_llama_gqa);
  tcase_add_test(tc, test_block_grads_gpt2);
  tcase_add_test(tc, test_block_grads_llama);
  tcase_add_test(tc, test_blas_and_blocked_agree);
  tcase_add_test(tc, test_loss_scale_and_accumulation);
  tcase_add_test(tc, test_training_reduces_loss);
  suite_add_tcase(s, tc);
  tc = tcase_create("passes");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_bit_identical_1_vs_2_threads);
  tcase_add_test(tc, test_ignore_index_and_eval);
  tcase_add_test(tc, test_block_causal_packed_equals_separate);
  tcase_add_test(tc, test_block_causal_gradient_isolated);
  tcase_add_test(tc, test_masks_that_mask_nothing);
  tcase_add_test(tc, test_hooks_order_and_memory);
  tcase_add_test(tc, test_activation_bytes);
  tcase_add_test(tc, test_block_ranges_like_pipeline_stages);
  tcase_add_test(tc, test_tp_seam_points);
  tcase_add_test(tc, test_tp_identity_hook_keeps_results);
  tcase_add_test(tc, test_tp_styles);
  tcase_add_test(tc, test_stage_local_allocation);
  tcase_add_test(tc, test_hf_config_fields);
  suite_add_tcase(s, tc);
  tc = tcase_create("split");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_split_backward_gpt2);
  tcase_add_test(tc, test_split_backward_llama);
  tcase_add_test(tc, test_split_pending_w_released);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(model_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
