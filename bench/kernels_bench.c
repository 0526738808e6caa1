/* bench/kernels_bench.c: per-kernel timings of the CUDA kernels at the
 * shapes of a GPT-2 124M step (B 64, T 1024, bf16) and of a Llama-3 1B-like
 * layer, with the two ceilings they are judged against measured first: a
 * device-to-device copy (bytes read + written per second) and a large bf16
 * GEMM through the same cuBLASLt path.
 *
 * Each figure is the median of `iters` launches timed one by one with CUDA
 * events, after warm-up. A figure depends on what ran just before it: on an
 * H200 a GEMM row timed right after a pause ran 8-20% faster than the same
 * algorithm after other GEMMs (the power limit's clocks, most likely;
 * bench/results/2026-11-28-session15), so compare rows timed in the same
 * state (the -a rows with each other, rows under -w) or whole training
 * steps. Inputs are random (never zeros): one host block of random
 * bf16/fp32 values tiled over each buffer. GB/s counts the bytes a kernel
 * must move at least (each input read once, each output written once); TFLOP/s counts 2 flops per multiply-add (attention: the causal
 * half only, the backward as 2.5 forwards, FlashAttention's convention).
 *
 * Context parallel ("cp ..."): one rank's ring attention at CP 2 against
 * the whole sequence. Document masks ("docs ..."): Llama 1B attention
 * over B2 x T8192 and B8 x T2048 cut into documents of mean length 1024
 * (TFLOP/s counts each document's causal square), cuDNN's ragged graph
 * against the flash kernel.
 *
 * usage: kernels_bench [-q] [-d] [-i iters] [-f filter] [-a n] [-c n]
 *   -q        quick: smaller batch (B 8), fewer iterations
 *   -a n      each GEMM row again with each of cuBLASLt's first n
 *             candidate algorithms ("#k"; #1 is the heuristic's pick)
 *   -c n      each cuDNN attention row (attention ... cudnn, docs cudnn)
 *             again with cuDNN's engine configs 1 to n ("cfg k"; config 0,
 *             the heuristics' first, is the plain row, no configs timed;
 *             tr_kern_cuda_set_attn_config; `TRAINRUN_LOG_LEVEL=debug
 *             TRAINRUN_LOG_SUBSYS=kernels` names each config's engine and
 *             knobs). Without -c the plain row runs the config that the
 *             timings at first use chose (TRAINRUN_CUDNN_ATTN_TUNE)
 *   -w ms     before each row, ms of large GEMMs with no gap before the
 *             timed runs: rows timed at a loaded GPU's clocks
 *   -d        deterministic kernels ([debug] deterministic: cuDNN's
 *             attention backward writes dQ directly, no fp32 atomics)
 *   -f text   only benchmarks whose name contains text
 * Exits 77 without a GPU.
 */
#include "config.h"

#include <cuda_runtime_api.h> /* events, malloc, memcpy (C API) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainrun/cp.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/kernels_cuda.h"
#include "trainrun/tensor.h"

/* kernels/cuda/flash_attention.cu's forward variant at head dim 64 (a
 * switch for this benchmark, not an API): 0 = 4 warps of 32 query rows
 * (the default), 1 = 4 warps of 16 */
void tr__flash_set_fwd_variant(int variant);

static int iters = 50;
static const char* filter;

static void die(const char* what, cudaError_t e) {
  fprintf(stderr, "kernels_bench: %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}
#define CK(call)                           \
  do {                                     \
    cudaError_t _e = (call);               \
    if (_e != cudaSuccess) die(#call, _e); \
  } while (0)
#define OK(call)                                                      \
  do {                                                                \
    int _rc = (call);                                                 \
    if (_rc != 0) {                                                   \
      fprintf(stderr, "kernels_bench: %s failed (%d)\n", #call, _rc); \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

/* ---- buffers ---- */

static void* rnd_src_bf16;
static void* rnd_src_f32;
#define RND_ELEMS ((size_t)1 << 24)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)((double)(z >> 11) * 0x1p-52 - 1.0);
}

static void rnd_init(void) {
  uint16_t* hb = malloc(RND_ELEMS * 2);
  float* hf = malloc(RND_ELEMS * 4);
  for (size_t i = 0; i < RND_ELEMS; i++) {
    hf[i] = urand();
    hb[i] = tr_f32_to_bf16(hf[i]);
  }
  CK(cudaMalloc(&rnd_src_bf16, RND_ELEMS * 2));
  CK(cudaMalloc(&rnd_src_f32, RND_ELEMS * 4));
  CK(cudaMemcpy(rnd_src_bf16, hb, RND_ELEMS * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(rnd_src_f32, hf, RND_ELEMS * 4, cudaMemcpyHostToDevice));
  free(hb);
  free(hf);
}

/* device buffer of n elements of dt, filled with random values in [-1, 1)
 * times scale */
static void* dbuf(tr_dtype_t dt, int64_t n, float scale) {
  size_t es = tr_dtype_size(dt);
  void* p;
  CK(cudaMalloc(&p, (size_t)n * es + 256));
  const char* src = dt == TR_BF16 ? rnd_src_bf16 : rnd_src_f32;
  for (int64_t off = 0; off < n; off += (int64_t)RND_ELEMS) {
    int64_t m = n - off < (int64_t)RND_ELEMS ? n - off : (int64_t)RND_ELEMS;
    CK(cudaMemcpy((char*)p + off * es, src, (size_t)m * es,
                  cudaMemcpyDeviceToDevice));
  }
  if (scale != 1.0f) OK(tr_kern_cuda_scale(dt, p, scale, n, NULL));
  return p;
}

static int32_t* dtokens(int64_t n, int V) {
  int32_t* h = malloc(sizeof(int32_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    h[i] = (int32_t)((urand() + 1.0f) * 0.5f * (float)V) % V;
  int32_t* d;
  CK(cudaMalloc((void**)&d, sizeof(int32_t) * (size_t)n));
  CK(cudaMemcpy(d, h, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

/* ---- timing ---- */

typedef void (*bench_fn)(void* ctx);

static int cmp_f(const void* a, const void* b) {
  float x = *(const float*)a, y = *(const float*)b;
  return x < y ? -1 : x > y;
}

static double heat_ms; /* -w: GEMMs run this long before each row */
static void heat(void);

/* median milliseconds of one call */
static double time_ms(bench_fn fn, void* ctx) {
  int warm = 3;
  for (int i = 0; i < warm; i++) fn(ctx);
  CK(cudaDeviceSynchronize());
  /* the GEMMs' timed candidates (TRAINRUN_GEMM_TUNE) are read and the
   * fastest kept, as the trainer does before each step */
  tr_kern_cuda_gemm_tune_apply();
  tr_kern_cuda_attn_tune_apply(); /* cuDNN attention's too */
  if (heat_ms > 0) heat(); /* the timed runs follow it with no gap */
  cudaEvent_t* ev = malloc(sizeof(cudaEvent_t) * (size_t)(2 * iters));
  for (int i = 0; i < 2 * iters; i++) CK(cudaEventCreate(&ev[i]));
  for (int i = 0; i < iters; i++) {
    CK(cudaEventRecord(ev[2 * i], 0));
    fn(ctx);
    CK(cudaEventRecord(ev[2 * i + 1], 0));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  float* t = malloc(sizeof(float) * (size_t)iters);
  for (int i = 0; i < iters; i++)
    CK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
  qsort(t, (size_t)iters, sizeof(float), cmp_f);
  double med =
      iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
  for (int i = 0; i < 2 * iters; i++) cudaEventDestroy(ev[i]);
  free(ev);
  free(t);
  return med;
}

static int wanted(const char* name) {
  return !filter || strstr(name, filter) != NULL;
}

/* print one row: flops and bytes may be 0 (not reported) */
static void report(const char* name, const char* shape, double ms, double flops,
                   double bytes) {
  printf("%-34s %-30s %9.3f ms", name, shape, ms);
  if (flops > 0) printf("  %7.1f TFLOP/s", flops / (ms * 1e-3) / 1e12);
  if (bytes > 0) printf("  %7.0f GB/s", bytes / (ms * 1e-3) / 1e9);
  printf("\n");
  fflush(stdout);
}

#define BENCH(name, shape, flops, bytes, ctx, fn) \
  do {                                            \
    if (wanted(name)) {                           \
      double _ms = time_ms(fn, ctx);              \
      report(name, shape, _ms, flops, bytes);     \
    }                                             \
  } while (0)

/* The rows of a cuDNN attention pair (fwd, bwd) again with engine
 * configs 1 to -c's n (tr_kern_cuda_set_attn_config): the plans are built
 * again (an untimed call of each first); where a graph has no config k
 * that builds (it would run config 0), a note instead of the rows */
static int attn_configs;
static void attn_config_rows(const char* fname, const char* bname,
                             const char* shape, double fl, void* ctx,
                             bench_fn fwd, bench_fn bwd) {
  for (int k = 1; k <= attn_configs; k++) {
    char fk[96], bk[96];
    snprintf(fk, sizeof fk, "%s cfg %d", fname, k);
    snprintf(bk, sizeof bk, "%s cfg %d", bname, k);
    if (!wanted(fk) && !wanted(bk)) continue;
    CK(cudaDeviceSynchronize());
    tr_kern_cuda_set_attn_config(k);
    int64_t m0 = tr_kern_cuda_attn_config_misses();
    fwd(ctx);
    int fmiss = tr_kern_cuda_attn_config_misses() != m0;
    bwd(ctx);
    int bmiss = tr_kern_cuda_attn_config_misses() != m0 + fmiss;
    if (fmiss)
      printf("%s: no config %d (none, or it does not build)\n", fname, k);
    else
      BENCH(fk, shape, fl, 0, ctx, fwd);
    if (bmiss)
      printf("%s: no config %d (none, or it does not build)\n", bname, k);
    else
      BENCH(bk, shape, 2.5 * fl, 0, ctx, bwd);
  }
  if (attn_configs > 0) {
    CK(cudaDeviceSynchronize());
    tr_kern_cuda_set_attn_config(-1);
  }
}

/* A GEMM's row, then with -a N one row per cuBLASLt candidate k < N
 * (tr_kern_cuda_set_gemm_pick): what each algorithm takes at the same
 * protocol, to check what the first-use timings (TRAINRUN_GEMM_TUNE) pick */
static int algos;
static void gemm_bench(const char* name, const char* shape, double flops,
                       void* ctx, bench_fn fn) {
  if (!wanted(name)) return;
  report(name, shape, time_ms(fn, ctx), flops, 0);
  for (int k = 0; k < algos; k++) {
    char nk[80];
    snprintf(nk, sizeof nk, "%s #%d", name, k + 1);
    tr_kern_cuda_set_gemm_pick(k);
    int64_t m0 = tr_kern_cuda_gemm_pick_misses();
    double ms = time_ms(fn, ctx);
    if (tr_kern_cuda_gemm_pick_misses() == m0)
      report(nk, shape, ms, flops, 0);
    else
      printf("%s: no candidate %d (cuBLASLt offered fewer)\n", name, k + 1);
    tr_kern_cuda_set_gemm_pick(-1);
  }
}

/* ---- ceilings ---- */

typedef struct {
  void *a, *b;
  size_t n;
} copy_ctx;
static void run_copy(void* c) {
  copy_ctx* x = c;
  CK(cudaMemcpyAsync(x->b, x->a, x->n, cudaMemcpyDeviceToDevice, 0));
}

typedef struct {
  tr_cuda_gemm_t g;
} gemm_ctx;
static void run_gemm(void* c) { OK(tr_kern_cuda_gemm(&((gemm_ctx*)c)->g, 0)); }

static void gemm_setup(gemm_ctx* c, int ta, int tb, int64_t M, int64_t N,
                       int64_t K, tr_dtype_t ab, tr_dtype_t ct, float beta) {
  memset(c, 0, sizeof *c);
  c->g.transa = ta;
  c->g.transb = tb;
  c->g.M = M;
  c->g.N = N;
  c->g.K = K;
  c->g.A = dbuf(ab, M * K, 1.0f);
  c->g.lda = ta ? M : K;
  c->g.B = dbuf(ab, K * N, 1.0f);
  c->g.ldb = tb ? K : N;
  c->g.C = dbuf(ct, M * N, 1.0f);
  c->g.ldc = N;
  c->g.ab_type = ab;
  c->g.c_type = ct;
  c->g.alpha = 1.0f;
  c->g.beta = beta;
}
static void gemm_free(gemm_ctx* c) {
  cudaFree((void*)c->g.A);
  cudaFree((void*)c->g.B);
  cudaFree(c->g.C);
}

/* -w: before each row, bf16 GEMMs (4096 x 8192 x 8192, ~0.7 ms each on
 * an H100 or H200) for heat_ms, enqueued right before the timed runs, so
 * every row is timed at the clocks of a loaded GPU (as in a training step)
 * rather than after the pause of its set-up */
static gemm_ctx heat_c;
static double heat_unit_ms;
static void heat(void) {
  if (!heat_c.g.A) {
    gemm_setup(&heat_c, 0, 1, 4096, 8192, 8192, TR_BF16, TR_BF16, 0.0f);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++) run_gemm(&heat_c);
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < 10; i++) run_gemm(&heat_c);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    heat_unit_ms = ms / 10 > 0.01 ? ms / 10 : 0.01;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  for (double t = 0; t < heat_ms; t += heat_unit_ms) run_gemm(&heat_c);
}

static void ceilings(void) {
  if (wanted("ceiling copy")) {
    copy_ctx c = {NULL, NULL, (size_t)1 << 30};
    CK(cudaMalloc(&c.a, c.n));
    CK(cudaMalloc(&c.b, c.n));
    CK(cudaMemset(c.a, 1, c.n));
    double ms = time_ms(run_copy, &c);
    report("ceiling copy d2d", "1 GiB", ms, 0, 2.0 * (double)c.n);
    cudaFree(c.a);
    cudaFree(c.b);
  }
  if (wanted("ceiling gemm")) {
    gemm_ctx c;
    gemm_setup(&c, 0, 1, 8192, 8192, 8192, TR_BF16, TR_BF16, 0.0f);
    gemm_bench("ceiling gemm bf16", "8192^3 NT", 2.0 * 8192.0 * 8192 * 8192, &c,
               run_gemm);
    gemm_free(&c);
  }
}

/* ---- GEMMs of the model ---- */

typedef struct {
  int64_t N;
  int IC, OC, gelu, bias;
  void *x, *w, *b, *out, *pre, *dout, *dinp;
  float *dw, *db;
} lin_ctx;

static void lin_setup(lin_ctx* c, int64_t N, int IC, int OC, int gelu,
                      int bias) {
  memset(c, 0, sizeof *c);
  c->N = N;
  c->IC = IC;
  c->OC = OC;
  c->gelu = gelu;
  c->bias = bias;
  c->x = dbuf(TR_BF16, N * IC, 1.0f);
  c->w = dbuf(TR_BF16, (int64_t)OC * IC, 0.05f);
  c->b = dbuf(TR_BF16, OC, 0.1f);
  c->out = dbuf(TR_BF16, N * OC, 1.0f);
  c->pre = gelu ? dbuf(TR_BF16, N * OC, 1.0f) : NULL;
  c->dout = dbuf(TR_BF16, N * OC, 1.0f);
  c->dinp = dbuf(TR_BF16, N * IC, 1.0f);
  c->dw = dbuf(TR_F32, (int64_t)OC * IC, 0.01f);
  c->db = dbuf(TR_F32, OC, 0.01f);
}
static void lin_free(lin_ctx* c) {
  void* ps[] = {c->x,    c->w,    c->b,  c->out, c->pre,
                c->dout, c->dinp, c->dw, c->db};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
    if (ps[i]) cudaFree(ps[i]);
}
static void run_lin_fwd(void* p) {
  lin_ctx* c = p;
  OK(tr_kern_cuda_linear_fwd(TR_BF16, c->out, c->pre, c->x, c->w,
                             c->bias ? c->b : NULL, c->N, c->IC, c->OC, c->gelu,
                             0));
}
static void run_lin_dinp(void* p) {
  lin_ctx* c = p;
  OK(tr_kern_cuda_linear_bwd(TR_BF16, c->dinp, NULL, NULL, c->dout, c->x, c->w,
                             NULL, c->N, c->IC, c->OC, 0));
}
static void run_lin_dw(void* p) {
  lin_ctx* c = p;
  OK(tr_kern_cuda_linear_bwd(TR_BF16, NULL, c->dw, c->bias ? c->db : NULL,
                             c->dout, c->x, c->w, NULL, c->N, c->IC, c->OC, 0));
}

static void bench_linear(const char* tag, int64_t N, int IC, int OC, int gelu,
                         int bias) {
  char name[64], shape[64];
  int any = 0;
  const char* parts[3] = {"fwd", "bwd dinp", "bwd dw+db"};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "linear %s %s", tag, parts[i]);
    any |= wanted(name);
  }
  if (!any) return;
  lin_ctx c;
  lin_setup(&c, N, IC, OC, gelu, bias);
  double fl = 2.0 * (double)N * IC * OC;
  snprintf(shape, sizeof shape, "%lldx%d->%d%s", (long long)N, IC, OC,
           gelu ? " +gelu" : (bias ? " +bias" : ""));
  snprintf(name, sizeof name, "linear %s fwd", tag);
  gemm_bench(name, shape, fl, &c, run_lin_fwd);
  snprintf(name, sizeof name, "linear %s bwd dinp", tag);
  gemm_bench(name, shape, fl, &c, run_lin_dinp);
  snprintf(name, sizeof name, "linear %s bwd dw+db", tag);
  gemm_bench(name, shape, fl, &c, run_lin_dw);
  lin_free(&c);
}

/* ---- norms, activations, rope, embedding ---- */

typedef struct {
  int64_t N;
  int C;
  void *a, *b, *res, *out, *w, *bias, *dout, *dinp;
  float *mean, *rstd, *dw, *db;
} norm_ctx;

static void norm_setup(norm_ctx* c, int64_t N, int C) {
  memset(c, 0, sizeof *c);
  c->N = N;
  c->C = C;
  c->a = dbuf(TR_BF16, N * C, 1.0f);
  c->b = dbuf(TR_BF16, N * C, 1.0f);
  c->res = dbuf(TR_BF16, N * C, 1.0f);
  c->out = dbuf(TR_BF16, N * C, 1.0f);
  c->w = dbuf(TR_BF16, C, 1.0f);
  c->bias = dbuf(TR_BF16, C, 0.1f);
  c->dout = dbuf(TR_BF16, N * C, 1.0f);
  c->dinp = dbuf(TR_BF16, N * C, 1.0f);
  c->mean = dbuf(TR_F32, N, 0.1f);
  c->rstd = dbuf(TR_F32, N, 1.0f);
  c->dw = dbuf(TR_F32, C, 0.1f);
  c->db = dbuf(TR_F32, C, 0.1f);
  OK(tr_kern_cuda_layernorm_fwd(TR_BF16, c->out, c->mean, c->rstd, c->a, c->w,
                                c->bias, N, C, 1e-5f, 0));
}
static void norm_free(norm_ctx* c) {
  void* ps[] = {c->a,    c->b,    c->res,  c->out,  c->w,  c->bias,
                c->dout, c->dinp, c->mean, c->rstd, c->dw, c->db};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) cudaFree(ps[i]);
}
static void run_ln_fwd(void* p) {
  norm_ctx* c = p;
  OK(tr_kern_cuda_layernorm_fwd(TR_BF16, c->out, c->mean, c->rstd, c->a, c->w,
                                c->bias, c->N, c->C, 1e-5f, 0));
}
static void run_res_ln_fwd(void* p) {
  norm_ctx* c = p;
  OK(tr_kern_cuda_residual_layernorm_fwd(TR_BF16, c->res, c->out, c->mean,
                                         c->rstd, c->a, c->b, c->w, c->bias,
                                         c->N, c->C, 1e-5f, 0));
}
static void run_ln_bwd(void* p) {
  norm_ctx* c = p;
  OK(tr_kern_cuda_layernorm_bwd(TR_BF16, c->dinp, c->dw, c->db, c->dout, c->a,
                                c->w, c->mean, c->rstd, c->N, c->C, 0));
}
static void run_rms_fwd(void* p) {
  norm_ctx* c = p;
  OK(tr_kern_cuda_rmsnorm_fwd(TR_BF16, c->out, c->rstd, c->a, c->w, c->N, c->C,
                              1e-5f, 0));
}
static void run_rms_bwd(void* p) {
  norm_ctx* c = p;
  OK(tr_kern_cuda_rmsnorm_bwd(TR_BF16, c->dinp, c->dw, c->dout, c->a, c->w,
                              c->rstd, c->N, c->C, 0));
}

typedef struct {
  int64_t n;
  void *x, *y, *g, *dx, *dy;
} ew_ctx;
static void run_gelu_fwd(void* p) {
  ew_ctx* c = p;
  OK(tr_kern_cuda_gelu_fwd(TR_BF16, c->y, c->x, c->n, 0));
}
static void run_gelu_bwd(void* p) {
  ew_ctx* c = p;
  OK(tr_kern_cuda_gelu_bwd(TR_BF16, c->dx, c->g, c->x, c->n, 0));
}
static void run_swiglu_fwd(void* p) {
  ew_ctx* c = p;
  OK(tr_kern_cuda_swiglu_fwd(TR_BF16, c->y, c->x, c->g, c->n, 0));
}
static void run_swiglu_bwd(void* p) {
  ew_ctx* c = p;
  OK(tr_kern_cuda_swiglu_bwd(TR_BF16, c->dx, c->dy, c->y, c->x, c->g, c->n, 0));
}

typedef struct {
  int B, T, H, D;
  int64_t stride;
  void* x;
  float *cs, *sn;
} rope_ctx;
static void run_rope(void* p) {
  rope_ctx* c = p;
  OK(tr_kern_cuda_rope(TR_BF16, c->x, c->cs, c->sn, c->B, c->T, c->H, c->D,
                       c->stride, 0, 0));
}

typedef struct {
  int B, T, C, V;
  int32_t* tok;
  void *wte, *wpe, *out, *dout;
  float *dwte, *dwpe;
} emb_ctx;
static void run_emb_fwd(void* p) {
  emb_ctx* c = p;
  OK(tr_kern_cuda_embedding_fwd(TR_BF16, c->out, c->tok, c->wte, c->wpe, c->B,
                                c->T, c->C, c->V, 0));
}
static void run_emb_bwd(void* p) {
  emb_ctx* c = p;
  OK(tr_kern_cuda_embedding_bwd(TR_BF16, c->dwte, c->dwpe, c->dout, c->tok,
                                c->B, c->T, c->C, c->V, 0));
}

/* ---- classifier ---- */

typedef struct {
  int64_t N, ld;
  int V;
  void* logits;
  float *losses, *lse;
  int32_t* tg;
} cls_ctx;
static void run_cls(void* p) {
  cls_ctx* c = p;
  OK(tr_kern_cuda_classifier(TR_BF16, c->logits, c->ld, c->losses, c->lse,
                             c->tg, c->N, c->V, 1.0f / (float)c->N, 1, NULL,
                             0));
}

/* ---- attention ---- */

typedef struct {
  int B, T, H, KVH, D;
  int64_t W;
  char *qkv, *dqkv;
  void *out, *dout;
  float* lse;
} att_ctx;
static void run_att_fwd(void* p) {
  att_ctx* c = p;
  size_t ko = (size_t)c->H * c->D * 2, vo = (size_t)(c->H + c->KVH) * c->D * 2;
  OK(tr_kern_cuda_attention_fwd(TR_BF16, c->out, c->lse, c->qkv, c->qkv + ko,
                                c->qkv + vo, c->B, c->T, c->H, c->KVH, c->D,
                                c->W, c->W, NULL, 0));
}
static void run_att_bwd(void* p) {
  att_ctx* c = p;
  size_t ko = (size_t)c->H * c->D * 2, vo = (size_t)(c->H + c->KVH) * c->D * 2;
  OK(tr_kern_cuda_attention_bwd(TR_BF16, c->dqkv, c->dqkv + ko, c->dqkv + vo,
                                c->dout, c->qkv, c->qkv + ko, c->qkv + vo,
                                c->out, c->lse, c->B, c->T, c->H, c->KVH, c->D,
                                c->W, c->W, NULL, 0, 0));
}

static void bench_attention(const char* tag, int B, int T, int H, int KVH,
                            int D) {
  char name[64], shape[64];
  int any = 0;
  /* cudnn: cuDNN's fused attention (builds with cuDNN; skipped with a note
   * when cuDNN declines the shape) */
  const char* impls[3] = {"flash", "simt", "cudnn"};
  const tr_cuda_attn_impl_t ids[3] = {TR_CUDA_ATTN_FLASH, TR_CUDA_ATTN_SIMT,
                                      TR_CUDA_ATTN_CUDNN};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "attention %s %s fwd", tag, impls[i]);
    any |= wanted(name);
    snprintf(name, sizeof name, "attention %s %s bwd", tag, impls[i]);
    any |= wanted(name);
  }
  if (!any) return;
  att_ctx c = {B,    T,    H,    KVH,  D,   (int64_t)(H + 2 * KVH) * D,
               NULL, NULL, NULL, NULL, NULL};
  int64_t N = (int64_t)B * T;
  c.qkv = dbuf(TR_BF16, N * c.W, 1.0f);
  c.dqkv = dbuf(TR_BF16, N * c.W, 1.0f);
  c.out = dbuf(TR_BF16, N * H * D, 1.0f);
  c.dout = dbuf(TR_BF16, N * H * D, 1.0f);
  c.lse = dbuf(TR_F32, N * H, 1.0f);
  double fl = 4.0 * B * H * (double)T * T * D / 2.0;
  snprintf(shape, sizeof shape, "B%d T%d H%d/%d D%d", B, T, H, KVH, D);
  for (int i = 0; i < 3; i++) {
    tr_kern_cuda_set_attention(ids[i]);
    char fname[64], bname[64];
    snprintf(fname, sizeof fname, "attention %s %s fwd", tag, impls[i]);
    snprintf(bname, sizeof bname, "attention %s %s bwd", tag, impls[i]);
    if (ids[i] == TR_CUDA_ATTN_CUDNN) { /* one untimed call: usable here? */
      if (!wanted(fname) && !wanted(bname)) continue;
      size_t ko = (size_t)H * D * 2, vo = (size_t)(H + KVH) * D * 2;
      int rc = tr_kern_cuda_attention_fwd(TR_BF16, c.out, c.lse, c.qkv,
                                          c.qkv + ko, c.qkv + vo, B, T, H,
                                          KVH, D, c.W, c.W, NULL, 0);
      if (rc == 0)
        rc = tr_kern_cuda_attention_bwd(
            TR_BF16, c.dqkv, c.dqkv + ko, c.dqkv + vo, c.dout, c.qkv,
            c.qkv + ko, c.qkv + vo, c.out, c.lse, B, T, H, KVH, D, c.W, c.W,
            NULL, 0, 0);
      if (rc != 0) {
        printf("attention %s cudnn: not available (%s)\n", tag,
               tr_strerror(rc));
        continue;
      }
    }
    BENCH(fname, shape, fl, 0, &c, run_att_fwd);
    if (i == 0 && D == 64) { /* the other forward variant */
      tr__flash_set_fwd_variant(1);
      snprintf(name, sizeof name, "attention %s flash fwd (16 rows/warp)", tag);
      BENCH(name, shape, fl, 0, &c, run_att_fwd);
      tr__flash_set_fwd_variant(0);
    }
    BENCH(bname, shape, 2.5 * fl, 0, &c, run_att_bwd);
    if (ids[i] == TR_CUDA_ATTN_CUDNN)
      attn_config_rows(fname, bname, shape, fl, &c, run_att_fwd, run_att_bwd);
  }
  tr_kern_cuda_set_attention(TR_CUDA_ATTN_AUTO);
  cudaFree(c.qkv);
  cudaFree(c.dqkv);
  cudaFree(c.out);
  cudaFree(c.dout);
  cudaFree(c.lse);
}

/* ---- context parallel ---- */

/* One rank's attention at context parallel 2 of a Llama 1B sequence
 * (32 query heads, 8 kv heads of 64) against the whole sequence on one
 * GPU: the core (tr_cp_attention_*, every key chunk at hand, no
 * communication) for rank 0's chunks {0, 3} and rank 1's {1, 2} of 4,
 * the two kinds of chunk pair it is made of (the diagonal, causal; a
 * query chunk against an earlier key chunk, full) and the merge. Half the
 * whole sequence's time is what a rank's share would cost without
 * overhead. */
/* q, k, v, out, lse and the gradients of one attention call over rows */
typedef struct {
  tr_tensor_t q, k, v, o, l, dq, dk, dv;
} att_set;

typedef struct {
  tr_tensor_t q, k, v, out, lse, dq, dk, dv, dout; /* one rank's */
  att_set f;                                       /* the whole sequence */
  att_set p;                                       /* one chunk pair */
  tr_tensor_t acc, acl;
  int chunks[2];
  int q_shift;
} cp_ctx;

static void cp_tensor(tr_tensor_t* t, tr_dtype_t dt, int64_t a, int64_t b,
                      int64_t c) {
  int64_t shape[3] = {a, b, c};
  tr_device_t dev = {TR_DEV_CUDA, 0};
  OK(tr_tensor_empty(t, dt, dev, 3, shape));
  int64_t n = tr_tensor_numel(t);
  size_t es = tr_dtype_size(dt);
  const char* src = dt == TR_BF16 ? rnd_src_bf16 : rnd_src_f32;
  for (int64_t off = 0; off < n; off += (int64_t)RND_ELEMS) {
    int64_t m = n - off < (int64_t)RND_ELEMS ? n - off : (int64_t)RND_ELEMS;
    CK(cudaMemcpy((char*)tr_tensor_data(t) + off * es, src, (size_t)m * es,
                  cudaMemcpyDeviceToDevice));
  }
}

/* a Llama 1B attention set of `rows` rows (32 heads, 8 kv heads of 64) */
static void att_set_init(att_set* a, int64_t rows) {
  cp_tensor(&a->q, TR_BF16, 1, rows, 2048);
  cp_tensor(&a->k, TR_BF16, 1, rows, 512);
  cp_tensor(&a->v, TR_BF16, 1, rows, 512);
  cp_tensor(&a->o, TR_BF16, 1, rows, 2048);
  cp_tensor(&a->l, TR_F32, 1, 32, rows);
  cp_tensor(&a->dq, TR_BF16, 1, rows, 2048);
  cp_tensor(&a->dk, TR_BF16, 1, rows, 512);
  cp_tensor(&a->dv, TR_BF16, 1, rows, 512);
}

static void att_set_release(att_set* a) {
  tr_tensor_t* ts[] = {&a->q, &a->k,  &a->v,  &a->o,
                       &a->l, &a->dq, &a->dk, &a->dv};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}

static void run_cp_core_fwd(void* p) {
  cp_ctx* c = p;
  OK(tr_cp_attention_fwd(&c->out, &c->lse, &c->q, &c->k, &c->v, 32, 8,
                         c->chunks, 2, 4, NULL, 0));
}
static void run_cp_core_bwd(void* p) {
  cp_ctx* c = p;
  OK(tr_cp_attention_bwd(&c->dq, &c->dk, &c->dv, &c->dout, &c->q, &c->k, &c->v,
                         &c->out, &c->lse, 32, 8, c->chunks, 2, 4, NULL, 0));
}
static void run_cp_whole_fwd(void* p) {
  cp_ctx* c = p;
  OK(tr_kern_attention_fwd(&c->f.o, &c->f.l, &c->f.q, &c->f.k, &c->f.v, 32, 8));
}
static void run_cp_whole_bwd(void* p) {
  cp_ctx* c = p;
  OK(tr_kern_attention_bwd(&c->f.dq, &c->f.dk, &c->f.dv, &c->f.o, &c->f.q,
                           &c->f.k, &c->f.v, &c->f.o, &c->f.l, 32, 8));
}
static void run_cp_pair_fwd(void* p) {
  cp_ctx* c = p;
  OK(tr_kern_attention_masked_fwd(&c->p.o, &c->p.l, &c->p.q, &c->p.k, &c->p.v,
                                  32, 8, NULL, 0, c->q_shift));
}
static void run_cp_pair_bwd(void* p) {
  cp_ctx* c = p;
  OK(tr_kern_attention_masked_bwd(&c->p.dq, &c->p.dk, &c->p.dv, &c->p.o,
                                  &c->p.q, &c->p.k, &c->p.v, &c->p.o, &c->p.l,
                                  32, 8, NULL, 0, c->q_shift));
}
static void run_cp_merge(void* p) {
  cp_ctx* c = p;
  OK(tr_kern_attn_merge(&c->acc, &c->acl, &c->p.o, &c->p.l, 32));
}

static void bench_cp(int T) {
  static const char* names[] = {"cp whole sequence", "cp core rank",
                                "cp pair diagonal", "cp pair full", "cp merge"};
  int any = 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    any |= wanted(names[i]) || (filter && strstr(filter, names[i]));
  if (!any) return;
  const int64_t C = 2048, KV = 512, c = T / 4;
  cp_ctx x;
  memset(&x, 0, sizeof x);
  att_set_init(&x.f, T);
  cp_tensor(&x.q, TR_BF16, 1, 2 * c, C);
  cp_tensor(&x.out, TR_BF16, 1, 2 * c, C);
  cp_tensor(&x.lse, TR_F32, 1, 32, 2 * c);
  cp_tensor(&x.dq, TR_BF16, 1, 2 * c, C);
  cp_tensor(&x.dout, TR_BF16, 1, 2 * c, C);
  cp_tensor(&x.dk, TR_BF16, 1, T, KV);
  cp_tensor(&x.dv, TR_BF16, 1, T, KV);
  tr_tensor_view(&x.k, &x.f.k);
  tr_tensor_view(&x.v, &x.f.v);
  att_set_init(&x.p, c);
  cp_tensor(&x.acc, TR_F32, 1, c, C);
  cp_tensor(&x.acl, TR_F32, 1, 32, c);
  char shape[64];
  double fl = 4.0 * 32 * (double)T * T * 64 / 2.0; /* causal, whole */
  snprintf(shape, sizeof shape, "B1 T%d H32/8 D64", T);
  BENCH("cp whole sequence fwd", shape, fl, 0, &x, run_cp_whole_fwd);
  BENCH("cp whole sequence bwd", shape, 2.5 * fl, 0, &x, run_cp_whole_bwd);
  static const int ranks[2][2] = {{0, 3}, {1, 2}};
  for (int r = 0; r < 2; r++) {
    char fname[64], bname[64];
    x.chunks[0] = ranks[r][0];
    x.chunks[1] = ranks[r][1];
    snprintf(shape, sizeof shape, "chunks %d,%d of 4 x %lld", x.chunks[0],
             x.chunks[1], (long long)c);
    snprintf(fname, sizeof fname, "cp core rank %d fwd", r);
    snprintf(bname, sizeof bname, "cp core rank %d bwd", r);
    /* a rank's share: half the whole causal work */
    BENCH(fname, shape, fl / 2, 0, &x, run_cp_core_fwd);
    BENCH(bname, shape, 2.5 * fl / 2, 0, &x, run_cp_core_bwd);
  }
  double pf = 4.0 * 32 * (double)c * c * 64; /* a full pair */
  snprintf(shape, sizeof shape, "c%lld", (long long)c);
  x.q_shift = 0;
  BENCH("cp pair diagonal fwd", shape, pf / 2, 0, &x, run_cp_pair_fwd);
  BENCH("cp pair diagonal bwd", shape, 2.5 * pf / 2, 0, &x, run_cp_pair_bwd);
  x.q_shift = (int)c;
  BENCH("cp pair full fwd", shape, pf, 0, &x, run_cp_pair_fwd);
  BENCH("cp pair full bwd", shape, 2.5 * pf, 0, &x, run_cp_pair_bwd);
  BENCH("cp merge", shape, 0, (double)c * C * (2 + 4 + 4) + c * 32 * 12.0, &x,
        run_cp_merge);
  att_set_release(&x.f);
  att_set_release(&x.p);
  tr_tensor_t* ts[] = {&x.q,  &x.k,  &x.v,    &x.out, &x.lse, &x.dq,
                       &x.dk, &x.dv, &x.dout, &x.acc, &x.acl};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}

/* ---- document masks ---- */

/* Llama 1B attention (32 heads, 8 kv heads of 64) over B rows of T
 * tokens cut into documents (block_causal), each implementation through
 * the masked entries: cuDNN's ragged graph and the flash kernel. The
 * lengths are drawn as bench/gpu/make_shard.py --doc-len draws them
 * (geometric, mean 1024; a row's last document cut at its end), from a
 * fixed seed; TFLOP/s counts each document's causal half. */
typedef struct {
  att_set a;
  tr_tensor_t ds; /* doc_start [B, T] int32 on the device */
  int H, KVH;
} docs_ctx;

static void run_docs_fwd(void* p) {
  docs_ctx* c = p;
  OK(tr_kern_attention_masked_fwd(&c->a.o, &c->a.l, &c->a.q, &c->a.k, &c->a.v,
                                  c->H, c->KVH, &c->ds, 0, 0));
}
static void run_docs_bwd(void* p) {
  docs_ctx* c = p;
  OK(tr_kern_attention_masked_bwd(&c->a.dq, &c->a.dk, &c->a.dv, &c->a.o,
                                  &c->a.q, &c->a.k, &c->a.v, &c->a.o, &c->a.l,
                                  c->H, c->KVH, &c->ds, 0, 0));
}

static void bench_docs(int B, int T) {
  static const char* impls[2] = {"cudnn", "flash"};
  static const tr_cuda_attn_impl_t ids[2] = {TR_CUDA_ATTN_CUDNN,
                                             TR_CUDA_ATTN_FLASH};
  char fname[64], bname[64], shape[64];
  int any = 0;
  for (int i = 0; i < 2; i++) {
    snprintf(fname, sizeof fname, "docs %s fwd", impls[i]);
    snprintf(bname, sizeof bname, "docs %s bwd", impls[i]);
    any |= wanted(fname) || wanted(bname);
  }
  if (!any) return;
  int64_t N = (int64_t)B * T;
  int32_t* tok = malloc(sizeof(int32_t) * (size_t)N);
  int32_t* start = malloc(sizeof(int32_t) * (size_t)N);
  if (!tok || !start) {
    fprintf(stderr, "kernels_bench: out of memory\n");
    exit(1);
  }
  /* geometric lengths (mean 1024) from an LCG: P(end here) = 1/1024 */
  uint64_t x = 0x9E3779B97F4A7C15ull;
  double fl = 0.0;
  int ndocs = 0;
  for (int b = 0; b < B; b++) {
    int len = 0;
    for (int t = 0; t < T; t++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      int end = (x >> 11) % 1024 == 0 || t == T - 1;
      tok[(int64_t)b * T + t] = end ? 1 : 7;
      len++;
      if (end) {
        fl += 4.0 * 32 * 64 * (double)len * len / 2.0;
        ndocs++;
        len = 0;
      }
    }
  }
  tr_kern_attn_doc_start(start, NULL, tok, B, T, 1);
  docs_ctx c;
  memset(&c, 0, sizeof c);
  c.H = 32;
  c.KVH = 8;
  att_set_init(&c.a, N);
  /* att_set_init's tensors are [1, rows, *]: view them as [B, T, *] */
  tr_tensor_t* ts[] = {&c.a.q,  &c.a.k,  &c.a.v, &c.a.o,
                       &c.a.dq, &c.a.dk, &c.a.dv};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    int64_t sh[3] = {B, T, ts[i]->shape[2]};
    OK(tr_tensor_reshape(ts[i], ts[i], 3, sh));
  }
  int64_t lsh[3] = {B, 32, T};
  OK(tr_tensor_reshape(&c.a.l, &c.a.l, 3, lsh));
  int64_t dsh[2] = {B, T};
  tr_device_t dev = {TR_DEV_CUDA, 0};
  OK(tr_tensor_empty(&c.ds, TR_I32, dev, 2, dsh));
  CK(cudaMemcpy(tr_tensor_data(&c.ds), start, sizeof(int32_t) * (size_t)N,
                cudaMemcpyHostToDevice));
  snprintf(shape, sizeof shape, "B%d T%d H32/8 D64, %d docs", B, T, ndocs);
  for (int i = 0; i < 2; i++) {
    tr_kern_cuda_set_attention(ids[i]);
    snprintf(fname, sizeof fname, "docs %s fwd", impls[i]);
    snprintf(bname, sizeof bname, "docs %s bwd", impls[i]);
    BENCH(fname, shape, fl, 0, &c, run_docs_fwd);
    BENCH(bname, shape, 2.5 * fl, 0, &c, run_docs_bwd);
    if (ids[i] == TR_CUDA_ATTN_CUDNN)
      attn_config_rows(fname, bname, shape, fl, &c, run_docs_fwd, run_docs_bwd);
  }
  tr_kern_cuda_set_attention(TR_CUDA_ATTN_AUTO);
  att_set_release(&c.a);
  tr_tensor_release(&c.ds);
  free(tok);
  free(start);
}

/* ---- optimizer ---- */

typedef struct {
  int n;
  tr_cuda_adamw_tensor_t* t;
  tr_adamw_args_t args;
  tr_cuda_span_t* spans;
  double* sumsq;
  float* factor;
} opt_ctx;
static void run_adamw(void* p) {
  opt_ctx* c = p;
  OK(tr_kern_cuda_adamw(c->t, c->n, &c->args, c->factor, 0));
}
static void run_norm2(void* p) {
  opt_ctx* c = p;
  OK(tr_kern_cuda_sum_squares(c->sumsq, c->spans, c->n, 0));
  OK(tr_kern_cuda_clip_factor(c->factor, NULL, c->sumsq, 1.0f, 0));
}

/* GPT-2 124M's parameter list: wte, wpe, then per layer 12 tensors */
static void bench_optimizer(void) {
  if (!wanted("adamw") && !wanted("grad norm")) return;
  int64_t sizes[2 + 12 * 12 + 2];
  int n = 0;
  sizes[n++] = 50304LL * 768;
  sizes[n++] = 1024LL * 768;
  for (int l = 0; l < 12; l++) {
    int64_t per[12] = {768, 768, 2304LL * 768, 2304, 768LL * 768,  768,
                       768, 768, 3072LL * 768, 3072, 768LL * 3072, 768};
    for (int i = 0; i < 12; i++) sizes[n++] = per[i];
  }
  sizes[n++] = 768;
  sizes[n++] = 768;
  opt_ctx c;
  memset(&c, 0, sizeof c);
  c.n = n;
  c.t = calloc((size_t)n, sizeof *c.t);
  c.spans = calloc((size_t)n, sizeof *c.spans);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    c.t[i].n = sizes[i];
    c.t[i].param = dbuf(TR_F32, sizes[i], 0.1f);
    c.t[i].grad = dbuf(TR_F32, sizes[i], 0.01f);
    c.t[i].m = dbuf(TR_F32, sizes[i], 0.001f);
    /* v >= 0: every byte 0x3c makes each float 0.0115 */
    CK(cudaMalloc((void**)&c.t[i].v, sizeof(float) * (size_t)sizes[i]));
    CK(cudaMemset(c.t[i].v, 0x3c, sizeof(float) * (size_t)sizes[i]));
    c.t[i].param_bf16 = dbuf(TR_BF16, sizes[i], 1.0f);
    c.t[i].decay = sizes[i] > 4096;
    c.spans[i] = (tr_cuda_span_t){c.t[i].grad, TR_F32, sizes[i]};
    total += sizes[i];
  }
  CK(cudaMalloc((void**)&c.sumsq, sizeof(double)));
  CK(cudaMalloc((void**)&c.factor, sizeof(float)));
  c.args = (tr_adamw_args_t){6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10};
  OK(tr_kern_cuda_sum_squares(c.sumsq, c.spans, n, 0));
  OK(tr_kern_cuda_clip_factor(c.factor, NULL, c.sumsq, 1.0f, 0));
  char shape[64];
  snprintf(shape, sizeof shape, "%lld params, %d tensors", (long long)total, n);
  /* p rw, g r, m rw, v rw, bf16 copy w */
  BENCH("adamw multi-tensor +bf16 copy", shape, 0, 30.0 * (double)total, &c,
        run_adamw);
  BENCH("grad norm + clip factor", shape, 0, 4.0 * (double)total, &c,
        run_norm2);
  for (int i = 0; i < n; i++) {
    cudaFree(c.t[i].param);
    cudaFree((void*)c.t[i].grad);
    cudaFree(c.t[i].m);
    cudaFree(c.t[i].v);
    cudaFree(c.t[i].param_bf16);
  }
  cudaFree(c.sumsq);
  cudaFree(c.factor);
  free(c.t);
  free(c.spans);
}

/* ---- main ---- */

int main(int argc, char** argv) {
  int quick = 0, opt;
  while ((opt = getopt(argc, argv, "qdi:f:a:c:w:")) != -1) {
    char* end = NULL;
    if (opt == 'w') {
      heat_ms = strtod(optarg, &end);
      if (*end || heat_ms < 0 || heat_ms > 60000) {
        fprintf(stderr, "%s: -w %s: milliseconds from 0 to 60000\n", argv[0],
                optarg);
        return 2;
      }
    } else if (opt == 'a') {
      algos = (int)strtol(optarg, &end, 10);
      if (*end || algos < 0 || algos > 16) {
        fprintf(stderr, "%s: -a %s: candidates from 0 to 16\n", argv[0],
                optarg);
        return 2;
      }
      if (algos > 1) tr_kern_cuda_set_gemm_tune(algos); /* plans hold them */
    } else if (opt == 'c') {
      attn_configs = (int)strtol(optarg, &end, 10);
      if (*end || attn_configs < 0 || attn_configs > 64) {
        fprintf(stderr, "%s: -c %s: engine configs from 0 to 64\n", argv[0],
                optarg);
        return 2;
      }
      if (attn_configs > 0) tr_kern_cuda_set_attn_tune(1); /* config 0 */
    } else if (opt == 'q') {
      quick = 1;
    } else if (opt == 'd') {
      tr_kern_cuda_set_deterministic(1, 0);
    } else if (opt == 'i') {
      iters = atoi(optarg);
    } else if (opt == 'f') {
      filter = optarg;
    } else {
      fprintf(stderr,
              "usage: %s [-q] [-d] [-i iters] [-f filter] [-a n] [-c n] "
              "[-w ms]\n",
              argv[0]);
      return 2;
    }
  }
  if (tr_cuda_device_count() == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  if (quick && iters == 50) iters = 10;
  if (iters < 1) iters = 1;
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, %.0f GiB; median of %d timed runs\n", prop.name,
         prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30),
         iters);
  OK(tr_kern_cuda_init());
  rnd_init();
  ceilings();

  /* GPT-2 124M: B 64 (8 quick), T 1024, C 768, 12 heads, Vp 50304 */
  const int B = quick ? 8 : 64, T = 1024, C = 768, V = 50257, Vp = 50304;
  const int64_t N = (int64_t)B * T;
  bench_linear("gpt2 qkv", N, C, 3 * C, 0, 1);
  bench_linear("gpt2 attn.proj", N, C, C, 0, 1);
  bench_linear("gpt2 fc+gelu", N, C, 4 * C, 1, 1);
  bench_linear("gpt2 mlp.proj", N, 4 * C, C, 0, 1);
  bench_linear("gpt2 lm_head", N, C, Vp, 0, 0);
  bench_attention("gpt2", B, T, 12, 12, 64);
  {
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%d", (long long)N, C);
    int any = wanted("layernorm") || wanted("residual+layernorm");
    if (any) {
      norm_ctx c;
      norm_setup(&c, N, C);
      double nc = (double)N * C;
      BENCH("layernorm fwd", shape, 0, nc * 4 + N * 8.0, &c, run_ln_fwd);
      BENCH("residual+layernorm fwd", shape, 0, nc * 8 + N * 8.0, &c,
            run_res_ln_fwd);
      BENCH("layernorm bwd (+dw,db)", shape, 0, nc * 8 + N * 8.0, &c,
            run_ln_bwd);
      norm_free(&c);
    }
  }
  if (wanted("gelu")) {
    ew_ctx c;
    c.n = N * 4 * C;
    c.x = dbuf(TR_BF16, c.n, 2.0f);
    c.y = dbuf(TR_BF16, c.n, 1.0f);
    c.g = dbuf(TR_BF16, c.n, 1.0f);
    c.dx = dbuf(TR_BF16, c.n, 1.0f);
    c.dy = NULL;
    char shape[64];
    snprintf(shape, sizeof shape, "%lld", (long long)c.n);
    BENCH("gelu fwd", shape, 0, 4.0 * c.n, &c, run_gelu_fwd);
    BENCH("gelu bwd", shape, 0, 8.0 * c.n, &c, run_gelu_bwd);
    cudaFree(c.x);
    cudaFree(c.y);
    cudaFree(c.g);
    cudaFree(c.dx);
  }
  if (wanted("embedding")) {
    emb_ctx c = {B,
                 T,
                 C,
                 V,
                 dtokens(N, V),
                 dbuf(TR_BF16, (int64_t)Vp * C, 1),
                 dbuf(TR_BF16, (int64_t)T * C, 1),
                 dbuf(TR_BF16, N * C, 1),
                 dbuf(TR_BF16, N * C, 1),
                 dbuf(TR_F32, (int64_t)Vp * C, 1),
                 dbuf(TR_F32, (int64_t)T * C, 1)};
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d C%d", B, T, C);
    BENCH("embedding fwd", shape, 0, N * C * 6.0, &c, run_emb_fwd);
    BENCH("embedding bwd", shape, 0, N * C * 10.0, &c, run_emb_bwd);
    void* ps[] = {c.tok, c.wte, c.wpe, c.out, c.dout, c.dwte, c.dwpe};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) cudaFree(ps[i]);
  }
  if (wanted("classifier")) {
    cls_ctx c = {N,
                 Vp,
                 V,
                 dbuf(TR_BF16, N * Vp, 4.0f),
                 dbuf(TR_F32, N, 1),
                 dbuf(TR_F32, N, 1),
                 dtokens(N, V)};
    /* the kernel turns logits into gradients: each run reads what the last
     * wrote, the same traffic */
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%d (ld %d)", (long long)N, V, Vp);
    BENCH("classifier fused fwd+bwd", shape, 0, 3.0 * 2 * (double)N * Vp, &c,
          run_cls);
    cudaFree(c.logits);
    cudaFree(c.losses);
    cudaFree(c.lse);
    cudaFree(c.tg);
  }
  bench_optimizer();
  bench_cp(quick ? 4096 : 16384);
  bench_docs(quick ? 1 : 2, 8192);
  /* documents at Llama 3.2 1B's one-GPU training shape (B8 T2048,
   * bench/gpu_train.sh llama1b); "attention llama" below is causal over the
   * same tokens as B16 T1024 */
  bench_docs(quick ? 2 : 8, 2048);

  /* Llama-3 1B-like layer: C 2048, 32 heads of 64, 8 kv heads, FFN 8192 */
  {
    const int LB = quick ? 2 : 16, LC = 2048, LF = 8192;
    const int64_t LN = (int64_t)LB * T;
    /* the model's GEMMs: wq, wk and wv (wk's shape twice), w1 and w3 (w1's
     * twice), w2; then "qkv" and "w1|w3", one GEMM over the concatenated
     * weights, which the model does not run: what fusing would gain */
    bench_linear("llama wq", LN, LC, LC, 0, 0);
    bench_linear("llama wk", LN, LC, 512, 0, 0);
    bench_linear("llama w1", LN, LC, LF, 0, 0);
    bench_linear("llama w2", LN, LF, LC, 0, 0);
    bench_linear("llama qkv", LN, LC, LC + 2 * 512, 0, 0);
    bench_linear("llama w1|w3", LN, LC, 2 * LF, 0, 0);
    bench_attention("llama", LB, T, 32, 8, 64);
    if (wanted("rmsnorm")) {
      norm_ctx c;
      norm_setup(&c, LN, LC);
      char shape[64];
      snprintf(shape, sizeof shape, "%lldx%d", (long long)LN, LC);
      double nc = (double)LN * LC;
      BENCH("rmsnorm fwd", shape, 0, nc * 4 + LN * 4.0, &c, run_rms_fwd);
      BENCH("rmsnorm bwd (+dw)", shape, 0, nc * 8 + LN * 4.0, &c, run_rms_bwd);
      norm_free(&c);
    }
    if (wanted("swiglu")) {
      ew_ctx c;
      c.n = LN * LF;
      c.x = dbuf(TR_BF16, c.n, 2.0f);
      c.g = dbuf(TR_BF16, c.n, 1.0f);
      c.y = dbuf(TR_BF16, c.n, 1.0f);
      c.dx = dbuf(TR_BF16, c.n, 1.0f);
      c.dy = dbuf(TR_BF16, c.n, 1.0f);
      char shape[64];
      snprintf(shape, sizeof shape, "%lld", (long long)c.n);
      BENCH("swiglu fwd", shape, 0, 6.0 * c.n, &c, run_swiglu_fwd);
      BENCH("swiglu bwd", shape, 0, 14.0 * c.n, &c, run_swiglu_bwd);
      cudaFree(c.x);
      cudaFree(c.g);
      cudaFree(c.y);
      cudaFree(c.dx);
      cudaFree(c.dy);
    }
    if (wanted("rope")) {
      rope_ctx c = {LB, T, 32, 64, LC + 2 * 512, NULL, NULL, NULL};
      c.x = dbuf(TR_BF16, LN * c.stride, 1.0f);
      float* hc = malloc(sizeof(float) * T * 32);
      float* hs = malloc(sizeof(float) * T * 32);
      OK(tr_kern_rope_table(hc, hs, T, 64, 500000.0, NULL));
      CK(cudaMalloc((void**)&c.cs, sizeof(float) * T * 32));
      CK(cudaMalloc((void**)&c.sn, sizeof(float) * T * 32));
      CK(cudaMemcpy(c.cs, hc, sizeof(float) * T * 32, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(c.sn, hs, sizeof(float) * T * 32, cudaMemcpyHostToDevice));
      char shape[64];
      snprintf(shape, sizeof shape, "B%d T%d H32 D64 (q)", LB, T);
      BENCH("rope (q, in place)", shape, 0, 4.0 * LN * LC, &c, run_rope);
      free(hc);
      free(hs);
      cudaFree(c.x);
      cudaFree(c.cs);
      cudaFree(c.sn);
    }
  }
  CK(cudaDeviceSynchronize());
  tr_kern_cuda_release();
  return 0;
}
