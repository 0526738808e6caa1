// kernels/cuda/matmul.cu: GEMMs through cuBLASLt (bf16 or fp32 operands,
// fp32 accumulation) with the bias and GELU epilogues fused, and the linear
// layer's forward and backward built on them.
//
// Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T,
// so cuBLASLt is called with the operands swapped. A plan (the operation
// descriptor, the three layouts and the algorithm chosen, below) is
// built once per shape, dtypes, epilogue, pointer alignment and device and
// cached; later calls only set the epilogue pointers and launch. When
// cuBLASLt offers no algorithm for an epilogue, the plain GEMM runs and the
// epilogue follows as separate kernels (reduce.cu, gelu.cu) with the same
// result.
//
// The linear backward's bias gradient, colsum(dout), is reduce.cu's column
// sum (added into dbias), not cuBLASLt's BGRADB epilogue on the weight-
// gradient GEMM: cuBLASLt runs that epilogue as a separate reduction kernel
// anyway, slower than ours (GPT-2 124M on an H200, 2026-11-28, three runs
// each alternating: median tokens/s of steps 11-40 568.4K-572.5K with the
// column sum, 565.6K-566.2K with the epilogue, +0.7%; bench/results/
// 2026-11-28-session12), and it needed a temporary and an add.
//
// A strided batch (tr_cuda_gemm_t.batch: async tensor parallel's chunk of
// rows of every sequence, the weight's stride 0) is one cuBLASLt call with
// batched layouts and the aux batch stride; the bias is shared (its batch
// stride left 0). Where cuBLASLt offers no batched algorithm the batches
// run one GEMM each.
//
// The heuristic's first algorithm is not always the fastest for a shape.
// A plan keeps its first TRAINRUN_GEMM_TUNE (8; tr_kern_cuda_set_gemm_tune;
// 1 under [debug] deterministic) candidates. At the plan's first use the
// candidates run once each to warm up, then 5 rounds of one run
// each, in turn, with an event after every run, on the same stream before
// the real GEMM and with the real operands. Interleaved, every candidate
// runs at the same clocks: a GEMM's time depends on the load just before it
// (8-20% on an H200, bench/results/2026-11-28-session15), and timed one
// candidate after the other the first ran after an idle gap. C is
// the real one where beta is 0 (the real GEMM then overwrites it), else a
// scratch room of up to 256 MiB (larger, or with an aux that overlaps C,
// the plan keeps the heuristic's pick). The host never waits for them:
// tr_kern_cuda_gemm_tune_apply, which the trainer calls before each step,
// reads the timings that have completed and switches a plan to the
// candidate with the shortest run where that beats the heuristic's shortest
// by 3% (and takes over 20 us: tr__tune_pick), so that a step's GEMMs (an
// activation recomputation's too) keep one algorithm each. The scratch and
// the candidates' workspace come from the stream's pool, which keeps its
// memory for later temporaries (runtime.cu). PyTorch's TunableOp times cuBLASLt's
// candidates too (synchronously, on buffers of its own). The first step
// runs the heuristic's picks and pays for the timings (~50 GEMMs a shape);
// timed picks may differ from one run to the next, as timings do.
//
// cuBLASLt is not linked: the first handle loads it (cublaslt_load.cu) and
// every call goes through that table (lt->cublasLt...).
#include "kernels/cuda/common.cuh"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/param.h"

#define WORKSPACE_BYTES ((size_t)32 << 20)  // cuBLAS's advice for Hopper
#define TUNE_MAX TR_TUNE_CANDS              // TRAINRUN_GEMM_TUNE's bound (16)
#define TUNE_SCRATCH_MAX ((size_t)256 << 20)  // beta != 0: C's scratch

// cuBLASLt's functions (cublaslt_load.cu), set with the first handle;
// lt_check runs only on statuses those returned
static const tr__cublaslt_t* lt;

static int lt_check(cublasStatus_t st, const char* what, const char* file,
                    int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return 0;
  TR_LOG_ERROR(KERN, "%s failed at %s:%d: %s", what, file, line,
               lt->cublasLtGetStatusString(st));
  return st == CUBLAS_STATUS_ALLOC_FAILED ? TR_ENOMEM : TR_ECUDA;
}
#define LT(call) lt_check((call), #call, __FILE__, __LINE__)

// ---- plans ----

typedef struct {
  int dev, ta, tb;
  int64_t M, N, K, lda, ldb, ldc, ldaux;
  int64_t batch, sa, sb, sc, saux;  // batch 0: not batched
  int ab_type, c_type, epi, tf32;
  int align_a, align_b, align_c, align_aux;
} plan_key_t;

typedef enum { TUNE_OFF = 0, TUNE_TODO, TUNE_TIMING } tune_state_t;

typedef struct {
  plan_key_t key;
  int supported;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;  // the one that runs
  size_t ws;
  // the heuristic's candidates (cand[0] its pick) and their timings
  tune_state_t tune;
  int ncand;
  cublasLtMatmulAlgo_t cand[TUNE_MAX];
  size_t cand_ws[TUNE_MAX];
  tr__tune_t timing;
} plan_t;

static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t handles[TR_MAX_DEVICES];
static plan_t** plans;
static int n_plans, cap_plans;
static int use_tf32;
static int gemm_tune = -1;  // tr_kern_cuda_set_gemm_tune; -1: the param
static int64_t tune_timed, tune_changed;  // tr_kern_cuda_gemm_tune_stats
static int tune_pending;  // plans in TUNE_TIMING: apply has nothing else
static int gemm_pick = -1;                // tr_kern_cuda_set_gemm_pick
static int64_t gemm_pick_misses;  // runs whose plan lacked that candidate

static cudaDataType_t cuda_type(int dt) {
  return dt == TR_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static int align_of(const void* p) {
  uintptr_t u = (uintptr_t)p;
  int a = 16;
  while (a > 1 && (u & (uintptr_t)(a - 1))) a >>= 1;
  return a;
}

// The alignment every batch of an operand keeps: its base's and its
// stride's (bytes).
static int align_batched(const void* p, int64_t stride, int dt) {
  int a = align_of(p);
  if (stride <= 0) return a;
  int s = align_of((
      const void*)(uintptr_t)(stride * (int64_t)tr_dtype_size((tr_dtype_t)dt)));
  return s < a ? s : a;
}

static void plan_free(plan_t* p) {
  if (!p) return;
  if (p->tune == TUNE_TIMING)
    __atomic_sub_fetch(&tune_pending, 1, __ATOMIC_RELAXED);
  tr__tune_free(&p->timing);
  if (p->desc) lt->cublasLtMatmulDescDestroy(p->desc);
  if (p->la) lt->cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) lt->cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) lt->cublasLtMatrixLayoutDestroy(p->lc);
  free(p);
}

// Called with lt_lock held.
static int handle_get(int dev, cublasLtHandle_t* out) {
  if (!lt) TR_CHECK(tr__cublaslt(&lt));
  if (!handles[dev]) TR_CHECK(LT(lt->cublasLtCreate(&handles[dev])));
  *out = handles[dev];
  return 0;
}

// Build the plan for key (lt_lock held). A plan whose heuristic finds no
// algorithm is kept with supported = 0, so the question is asked once.
static int plan_build(const plan_key_t* k, plan_t** out) {
  cublasLtHandle_t h;
  TR_CHECK(handle_get(k->dev, &h));
  plan_t* p = (plan_t*)calloc(1, sizeof *p);
  if (!p) return TR_ENOMEM;
  p->key = *k;
  int rc = 0;
  cublasComputeType_t ct = (k->ab_type == TR_F32 && k->tf32)
                               ? CUBLAS_COMPUTE_32F_FAST_TF32
                               : CUBLAS_COMPUTE_32F;
  cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // A' = our B
  cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // B' = our A
  cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epi;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res[TUNE_MAX];
  int nres = 0, want = __atomic_load_n(&gemm_tune, __ATOMIC_RELAXED);
  if (want < 1) want = (int)tr_param_int(TR_PARAM_GEMM_TUNE);
  if (want > TUNE_MAX) want = TUNE_MAX;
  if (tr__cuda_deterministic()) want = 1;  // picks that timings choose vary
  size_t ws = WORKSPACE_BYTES;
  uint32_t al_a = (uint32_t)k->align_b, al_b = (uint32_t)k->align_a,
           al_c = (uint32_t)k->align_c;
  if ((rc = LT(lt->cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F))) < 0)
    goto out_free;
  if ((rc = LT(lt->cublasLtMatmulDescSetAttribute(
           p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa))) < 0 ||
      (rc = LT(lt->cublasLtMatmulDescSetAttribute(
           p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb))) < 0 ||
      (rc = LT(lt->cublasLtMatmulDescSetAttribute(
           p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi))) < 0)
    goto out_free;
  if (epi & CUBLASLT_EPILOGUE_BIAS) {
    cudaDataType_t bt = cuda_type(k->c_type);
    if ((rc = LT(lt->cublasLtMatmulDescSetAttribute(
             p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt))) <
        0)
      goto out_free;
  }
  if (epi == CUBLASLT_EPILOGUE_GELU_AUX ||
      epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
      epi == CUBLASLT_EPILOGUE_DGELU) {
    int64_t ld = k->ldaux;
    if ((rc = LT(lt->cublasLtMatmulDescSetAttribute(
             p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld))) <
        0)
      goto out_free;
  }
  // A' = our B: [N,K] column-major (no transpose) or [K,N] (transposed)
  if ((rc = LT(lt->cublasLtMatrixLayoutCreate(
           &p->la, cuda_type(k->ab_type), k->tb ? k->K : k->N,
           k->tb ? k->N : k->K, k->ldb))) < 0 ||
      (rc = LT(lt->cublasLtMatrixLayoutCreate(
           &p->lb, cuda_type(k->ab_type), k->ta ? k->M : k->K,
           k->ta ? k->K : k->M, k->lda))) < 0 ||
      (rc = LT(lt->cublasLtMatrixLayoutCreate(&p->lc, cuda_type(k->c_type),
                                              k->N, k->M, k->ldc))) < 0)
    goto out_free;
  if (k->batch > 1) {  // strided batch: la is our B, lb our A
    int32_t n = (int32_t)k->batch;
    cublasLtMatrixLayout_t ls[3] = {p->la, p->lb, p->lc};
    int64_t st[3] = {k->sb, k->sa, k->sc};
    for (int i = 0; i < 3; i++)
      if ((rc = LT(lt->cublasLtMatrixLayoutSetAttribute(
               ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n))) < 0 ||
          (rc = LT(lt->cublasLtMatrixLayoutSetAttribute(
               ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i],
               sizeof st[i]))) < 0)
        goto out_free;
    if (k->ldaux &&
        (rc = LT(lt->cublasLtMatmulDescSetAttribute(
             p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &k->saux,
             sizeof k->saux))) < 0)
      goto out_free;
  }
  if ((rc = LT(lt->cublasLtMatmulPreferenceCreate(&pref))) < 0) goto out_free;
  if ((rc = LT(lt->cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))) <
          0 ||
      (rc = LT(lt->cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
           sizeof al_a))) < 0 ||
      (rc = LT(lt->cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
           sizeof al_b))) < 0 ||
      (rc = LT(lt->cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
           sizeof al_c))) < 0 ||
      (rc = LT(lt->cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
           sizeof al_c))) < 0)
    goto out_pref;
  {
    cublasStatus_t st = lt->cublasLtMatmulAlgoGetHeuristic(
        h, p->desc, p->la, p->lb, p->lc, p->lc, pref, want, res, &nres);
    if (st == CUBLAS_STATUS_SUCCESS && nres > 0) {
      p->supported = 1;
      p->algo = res[0].algo;
      p->ws = res[0].workspaceSize;
      for (int i = 0; i < nres; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) {
          p->cand[p->ncand] = res[i].algo;
          p->cand_ws[p->ncand++] = res[i].workspaceSize;
        }
      if (p->ncand > 0) {  // the heuristic's pick: its first that succeeded
        p->algo = p->cand[0];
        p->ws = p->cand_ws[0];
      }
      p->tune = p->ncand > 1 ? TUNE_TODO : TUNE_OFF;
    } else if (st != CUBLAS_STATUS_SUCCESS &&
               st != CUBLAS_STATUS_NOT_SUPPORTED) {
      rc = lt_check(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
      goto out_pref;
    }
  }
  lt->cublasLtMatmulPreferenceDestroy(pref);
  *out = p;
  return 0;
out_pref:
  lt->cublasLtMatmulPreferenceDestroy(pref);
out_free:
  plan_free(p);
  return rc;
}

// The cached plan for key, built on first use (lt_lock held).
static int plan_get(const plan_key_t* k, plan_t** out) {
  for (int i = 0; i < n_plans; i++)
    if (memcmp(&plans[i]->key, k, sizeof *k) == 0) {
      *out = plans[i];
      return 0;
    }
  if (n_plans == cap_plans) {
    int cap = cap_plans ? 2 * cap_plans : 64;
    plan_t** np = (plan_t**)realloc(plans, sizeof(plan_t*) * (size_t)cap);
    if (!np) return TR_ENOMEM;
    plans = np;
    cap_plans = cap;
  }
  TR_CHECK(plan_build(k, out));
  plans[n_plans++] = *out;
  return 0;
}

// One launch of a candidate of plan p into C, with workspace ws (NULL when
// ws_bytes is 0). The status is returned as is: a candidate's failure is
// not an error.
static cublasStatus_t cand_launch(plan_t* p, cublasLtHandle_t h,
                                  const tr_cuda_gemm_t* g, void* C, int i,
                                  void* ws, cudaStream_t s) {
  return lt->cublasLtMatmul(h, p->desc, &g->alpha, g->B, p->la, g->A, p->lb,
                            &g->beta, C, p->lc, C, p->lc, &p->cand[i], ws,
                            p->cand_ws[i], s);
}

// A candidate's run for tr__tune_rounds: cand_launch in a context.
typedef struct {
  plan_t* p;
  cublasLtHandle_t h;
  const tr_cuda_gemm_t* g;
  void *C, *ws;
  cudaStream_t s;
} cand_ctx_t;

static int cand_run(void* ctx, int i) {
  cand_ctx_t* c = (cand_ctx_t*)ctx;
  return cand_launch(c->p, c->h, c->g, c->C, i, c->p->cand_ws[i] ? c->ws : NULL,
                     c->s) != CUBLAS_STATUS_SUCCESS;
}

// The bytes a row-major [M, N] operand with row stride ld spans, over
// batch batches stride apart (elements of size es).
static size_t span_bytes(int64_t M, int64_t N, int64_t ld, int64_t batch,
                         int64_t stride, size_t es) {
  size_t n = (size_t)((M - 1) * ld + N);
  if (batch > 1) n += (size_t)(stride * (batch - 1));
  return n * es;
}

// Enqueue the candidates' timings on s, before the real GEMM (lt_lock
// held, the epilogue pointers set). C is the real one where beta is 0 (the
// real GEMM after them writes it whole, and an aux it writes), else a
// scratch room; a plan whose scratch would pass TUNE_SCRATCH_MAX, whose aux
// overlaps C (an in-place epilogue: the candidates would change what the
// real GEMM reads), or whose timings cannot start keeps the heuristic's
// pick. Quiet: what fails here leaves no error behind.
static void tune_start(plan_t* p, cublasLtHandle_t h, const tr_cuda_gemm_t* g,
                       const void* aux, cudaStream_t s) {
  p->tune = TUNE_OFF;
  if (!tr__tune_may_start(s)) return;
  const plan_key_t* k = &p->key;
  size_t es = tr_dtype_size((tr_dtype_t)k->c_type);
  size_t cbytes = span_bytes(k->M, k->N, k->ldc, k->batch, k->sc, es);
  if (aux) {
    const char *c0 = (const char*)g->C, *a0 = (const char*)aux;
    size_t abytes = span_bytes(k->M, k->N, k->ldaux, k->batch, k->saux, es);
    if (a0 < c0 + cbytes && c0 < a0 + abytes) return;
  }
  size_t bytes = g->beta != 0.0f ? cbytes : 0, wsb = 0;
  if (bytes > TUNE_SCRATCH_MAX) return;
  for (int i = 0; i < p->ncand; i++)
    if (p->cand_ws[i] > wsb) wsb = p->cand_ws[i];
  void *C = g->C, *ws = NULL;
  int failed = 0, live[TUNE_MAX], nlive = 0;
  if (bytes && cudaMallocAsync(&C, bytes, s) != cudaSuccess) {
    C = NULL;
    failed = 1;
  }
  if (C && wsb && cudaMallocAsync(&ws, wsb, s) != cudaSuccess) {
    ws = NULL;
    failed = 1;
  }
  for (int i = 0; i < p->ncand; i++) {  // the warm-up round
    live[i] = C && (ws || !wsb) &&
              cand_launch(p, h, g, C, i, p->cand_ws[i] ? ws : NULL, s) ==
                  CUBLAS_STATUS_SUCCESS;
    nlive += live[i];
    failed |= !live[i];
  }
  cand_ctx_t cc = {p, h, g, C, ws, s};
  int timing = tr__tune_rounds(&p->timing, p->ncand, live, cand_run, &cc, s);
  if (ws && cudaFreeAsync(ws, s) != cudaSuccess) failed = 1;
  if (bytes && C && cudaFreeAsync(C, s) != cudaSuccess) failed = 1;
  // what failed here is not the caller's error: the later launch checks
  // (TR_CUDA_LAUNCHED) must not see it
  if (failed) (void)cudaGetLastError();
  if (timing) {
    p->tune = TUNE_TIMING;
    __atomic_add_fetch(&tune_pending, 1, __ATOMIC_RELAXED);
  }
}

// Once the candidates' runs are done (no wait: cudaEventQuery), keep the
// one with the shortest run where it beats the heuristic's shortest by
// 3% (tr__tune_pick; lt_lock held). Not yet done: ask again at the next
// apply.
static void tune_finish(plan_t* p) {
  float best_ms[TUNE_MAX];
  int got = tr__tune_read(&p->timing, p->ncand, best_ms);
  if (got == 0) return;
  if (got < 0)
    for (int i = 0; i < p->ncand; i++) best_ms[i] = -1;
  if (tr_log_enabled(TR_LOG_DEBUG, TR_SUB_KERN)) {
    char line[512];
    int n = 0;
    for (int i = 0; i < p->ncand && n < (int)sizeof line - 32; i++)
      n += snprintf(line + n, sizeof line - (size_t)n, " #%d %.4f", i + 1,
                    best_ms[i]);
    TR_LOG_DEBUG(KERN, "GEMM M=%lld N=%lld K=%lld: candidates' shortest ms:%s",
                 (long long)p->key.M, (long long)p->key.N, (long long)p->key.K,
                 line);
  }
  int best = tr__tune_pick(best_ms, p->ncand);
  if (best >= 0) {  // the heuristic's pick was timed against another
    tune_timed++;
    if (best > 0) tune_changed++;
    p->algo = p->cand[best];
    p->ws = p->cand_ws[best];
    TR_LOG_DEBUG(KERN,
                 "GEMM M=%lld N=%lld K=%lld batch=%lld: candidate %d of %d, "
                 "%.4f ms (the heuristic's pick: %.4f ms)",
                 (long long)p->key.M, (long long)p->key.N, (long long)p->key.K,
                 (long long)p->key.batch, best + 1, p->ncand, best_ms[best],
                 best_ms[0]);
  }
  p->tune = TUNE_OFF;
  __atomic_sub_fetch(&tune_pending, 1, __ATOMIC_RELAXED);
}

// Run one plan (lt_lock held): set the epilogue pointers, start the
// candidates' timings at its first use, take workspace from the stream's
// pool, launch (the picks change only in tr_kern_cuda_gemm_tune_apply).
static int plan_run(plan_t* p, const tr_cuda_gemm_t* g, const void* bias,
                    void* aux, cudaStream_t s) {
  cublasLtHandle_t h;
  TR_CHECK(handle_get(p->key.dev, &h));
  cublasLtEpilogue_t epi = (cublasLtEpilogue_t)p->key.epi;
  if (epi & CUBLASLT_EPILOGUE_BIAS)
    TR_CHECK(LT(lt->cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)));
  if (epi == CUBLASLT_EPILOGUE_GELU_AUX ||
      epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU)
    TR_CHECK(LT(lt->cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux)));
  if (p->tune == TUNE_TODO) tune_start(p, h, g, aux, s);
  const cublasLtMatmulAlgo_t* algo = &p->algo;
  size_t wsb = p->ws;
  if (gemm_pick >= 0 && gemm_pick < p->ncand) {
    algo = &p->cand[gemm_pick];
    wsb = p->cand_ws[gemm_pick];
  } else if (gemm_pick >= 0) {
    gemm_pick_misses++;
  }
  void* ws = NULL;
  if (wsb) TR_CHECK(tr__cuda_tmp_alloc(&ws, wsb, s));
  int rc = LT(lt->cublasLtMatmul(h, p->desc, &g->alpha, g->B, p->la, g->A,
                                 p->lb, &g->beta, g->C, p->lc, g->C, p->lc,
                                 algo, ws, wsb, s));
  tr__cuda_tmp_free(ws, s);
  return rc;
}

static cublasLtEpilogue_t epilogue_of(const tr_cuda_gemm_t* g) {
  switch (g->epilogue) {
    case TR_CUDA_EPI_GELU:
      if (g->aux)
        return g->with_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                            : CUBLASLT_EPILOGUE_GELU_AUX;
      return g->with_bias ? CUBLASLT_EPILOGUE_GELU_BIAS
                          : CUBLASLT_EPILOGUE_GELU;
    case TR_CUDA_EPI_DGELU:
      return CUBLASLT_EPILOGUE_DGELU;
    default:
      return g->with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
}

static int gemm_checked(const tr_cuda_gemm_t* g, cudaStream_t s);

// A batched GEMM cuBLASLt has no strided-batch algorithm for: one GEMM a
// batch, each on its operands' offsets (said once a process: a timing of
// async tensor parallel then measures the per-batch GEMMs).
static int gemm_per_batch(const tr_cuda_gemm_t* g, cudaStream_t s) {
  static int warned;
  if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    TR_LOG_WARN(KERN,
                "no strided-batched cuBLASLt algorithm for a %s GEMM of %lld "
                "batches M=%lld N=%lld K=%lld: one GEMM a batch",
                tr_dtype_name(g->ab_type), (long long)g->batch,
                (long long)g->M, (long long)g->N, (long long)g->K);
  size_t ab = tr_dtype_size(g->ab_type), cs = tr_dtype_size(g->c_type);
  for (int64_t b = 0; b < g->batch; b++) {
    tr_cuda_gemm_t one = *g;
    one.batch = 0;
    one.stride_a = one.stride_b = one.stride_c = one.stride_aux = 0;
    one.A = (const char*)g->A + (size_t)(b * g->stride_a) * ab;
    one.B = (const char*)g->B + (size_t)(b * g->stride_b) * ab;
    one.C = (char*)g->C + (size_t)(b * g->stride_c) * cs;
    if (g->aux) one.aux = (char*)g->aux + (size_t)(b * g->stride_aux) * cs;
    TR_CHECK(gemm_checked(&one, s));
  }
  return 0;
}

static int gemm_checked(const tr_cuda_gemm_t* g, cudaStream_t s) {
  plan_key_t k;
  memset(&k, 0, sizeof k);  // padding bytes take part in memcmp
  TR_CHECK(tr__cuda_device(&k.dev));
  k.ta = g->transa ? 1 : 0;
  k.tb = g->transb ? 1 : 0;
  k.M = g->M;
  k.N = g->N;
  k.K = g->K;
  k.lda = g->lda;
  k.ldb = g->ldb;
  k.ldc = g->ldc;
  k.ab_type = g->ab_type;
  k.c_type = g->c_type;
  k.tf32 = __atomic_load_n(&use_tf32, __ATOMIC_RELAXED);
  int batched = g->batch > 1;
  if (batched) {
    k.batch = g->batch;
    k.sa = g->stride_a;
    k.sb = g->stride_b;
    k.sc = g->stride_c;
    k.saux = g->aux ? g->stride_aux : 0;
  }
  k.align_a = align_batched(g->A, k.sa, g->ab_type);
  k.align_b = align_batched(g->B, k.sb, g->ab_type);
  k.align_c = align_batched(g->C, k.sc, g->c_type);
  k.epi = epilogue_of(g);
  if (g->aux) {
    k.ldaux = g->ldaux;
    k.align_aux = align_batched(g->aux, k.saux, g->c_type);
  }
  // cuBLASLt wants the aux batch stride a multiple of 8 elements
  if (batched && g->aux && g->stride_aux % 8) return gemm_per_batch(g, s);
  int rc;
  pthread_mutex_lock(&lt_lock);
  plan_t* p = NULL;
  rc = plan_get(&k, &p);
  if (rc == 0 && p->supported) {
    rc = plan_run(p, g, g->bias, g->aux, s);
    pthread_mutex_unlock(&lt_lock);
    return rc;
  }
  // no fused algorithm: the plain GEMM, then the epilogue as kernels
  if (rc == 0) {
    k.epi = CUBLASLT_EPILOGUE_DEFAULT;
    k.ldaux = 0;
    k.saux = 0;
    k.align_aux = 0;
    rc = plan_get(&k, &p);
    if (rc == 0 && !p->supported && batched) {
      pthread_mutex_unlock(&lt_lock);
      return gemm_per_batch(g, s);
    }
    if (rc == 0 && !p->supported) {
      TR_LOG_ERROR(KERN,
                   "cuBLASLt has no algorithm for a %s GEMM M=%lld N=%lld "
                   "K=%lld",
                   tr_dtype_name(g->ab_type), (long long)g->M, (long long)g->N,
                   (long long)g->K);
      rc = TR_EUNSUPPORTED;
    }
    if (rc == 0) rc = plan_run(p, g, NULL, NULL, s);
  }
  pthread_mutex_unlock(&lt_lock);
  if (rc < 0) return rc;
  bool bias = g->with_bias && g->epilogue != TR_CUDA_EPI_DGELU;
  size_t cs = tr_dtype_size(g->c_type);
  for (int64_t b = 0; b < (batched ? g->batch : 1); b++) {  // each batch's
    void* C = (char*)g->C + (size_t)(b * g->stride_c) * cs;
    void* aux =
        g->aux ? (char*)g->aux + (size_t)(b * g->stride_aux) * cs : NULL;
    if (bias)
      TR_CHECK(tr__cuda_add_bias(g->c_type, C, g->ldc, g->bias, g->M, g->N, s));
    if (g->epilogue == TR_CUDA_EPI_GELU)
      TR_CHECK(tr__cuda_gelu_rows(g->c_type, C, g->ldc, aux, g->ldaux, g->M,
                                  g->N, 0, s));
    else if (g->epilogue == TR_CUDA_EPI_DGELU)
      TR_CHECK(tr__cuda_gelu_rows(g->c_type, C, g->ldc, aux, g->ldaux, g->M,
                                  g->N, 1, s));
  }
  return 0;
}

// ---- launchers ----

extern "C" int tr_kern_cuda_gemm(const tr_cuda_gemm_t* g, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(g, "gemm: no arguments");
  TR_CUDA_REQUIRE(g->M >= 0 && g->N >= 0 && g->K >= 0,
                  "gemm: negative size M=%lld N=%lld K=%lld", (long long)g->M,
                  (long long)g->N, (long long)g->K);
  TR_CUDA_REQUIRE(g->ab_type == TR_BF16 || g->ab_type == TR_F32,
                  "gemm: operands must be bfloat16 or float32");
  TR_CUDA_REQUIRE(g->c_type == TR_F32 || g->c_type == g->ab_type,
                  "gemm: a %s result of %s operands is not supported",
                  tr_dtype_name(g->c_type), tr_dtype_name(g->ab_type));
  TR_CUDA_REQUIRE(g->lda >= (g->transa ? g->M : g->K) && g->lda > 0,
                  "gemm: lda %lld too small", (long long)g->lda);
  TR_CUDA_REQUIRE(g->ldb >= (g->transb ? g->K : g->N) && g->ldb > 0,
                  "gemm: ldb %lld too small", (long long)g->ldb);
  TR_CUDA_REQUIRE(g->ldc >= g->N && g->ldc > 0, "gemm: ldc %lld too small",
                  (long long)g->ldc);
  TR_CUDA_REQUIRE(!g->with_bias || g->bias, "gemm: bias requested, none given");
  TR_CUDA_REQUIRE(g->epilogue != TR_CUDA_EPI_DGELU || (g->aux && g->beta == 0),
                  "gemm: the dgelu epilogue needs aux and beta == 0");
  TR_CUDA_REQUIRE(!g->aux || (g->ldaux >= g->N && g->ldaux % 8 == 0),
                  "gemm: ldaux %lld must be >= N and a multiple of 8",
                  (long long)g->ldaux);
  TR_CUDA_REQUIRE(g->batch >= 0, "gemm: batch %lld", (long long)g->batch);
  TR_CUDA_REQUIRE(
      g->batch <= 1 || (g->K > 0 && g->stride_a >= 0 && g->stride_b >= 0 &&
                        g->stride_c > 0 && g->stride_aux >= 0),
      "gemm: a batch of %lld needs K > 0 and strides >= 0 (C's "
      "> 0)",
      (long long)g->batch);
  if (g->M == 0 || g->N == 0) return 0;
  if (g->K == 0) {
    // no products: C = beta C (+ epilogue), which cuBLASLt may refuse
    tr_cuda_gemm_t z = *g;
    TR_CUDA_REQUIRE(g->ldc == g->N || g->beta == 0,
                    "gemm: K == 0 with padded C rows and beta != 0");
    if (g->beta == 0)
      TR_CHECK(TR_CUDA_CALL(cudaMemset2DAsync(
          g->C, (size_t)g->ldc * tr_dtype_size(g->c_type), 0,
          (size_t)g->N * tr_dtype_size(g->c_type), (size_t)g->M, s)));
    else
      TR_CHECK(tr_kern_cuda_scale(g->c_type, g->C, g->beta, g->M * g->N, s));
    if (z.with_bias && z.epilogue != TR_CUDA_EPI_DGELU)
      TR_CHECK(
          tr__cuda_add_bias(g->c_type, g->C, g->ldc, g->bias, g->M, g->N, s));
    if (z.epilogue == TR_CUDA_EPI_GELU || z.epilogue == TR_CUDA_EPI_DGELU)
      TR_CHECK(tr__cuda_gelu_rows(g->c_type, g->C, g->ldc, g->aux, g->ldaux,
                                  g->M, g->N, z.epilogue == TR_CUDA_EPI_DGELU,
                                  s));
    return 0;
  }
  return gemm_checked(g, s);
}

extern "C" int tr_kern_cuda_linear_fwd(tr_dtype_t dt, void* out, void* pre,
                                       const void* inp, const void* w,
                                       const void* bias, int64_t N, int IC,
                                       int OC, int gelu, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(N >= 0 && IC > 0 && OC > 0,
                  "linear_fwd: bad shape N=%lld IC=%d OC=%d", (long long)N, IC,
                  OC);
  TR_CUDA_REQUIRE(!pre || gelu, "linear_fwd: pre is only kept with gelu");
  tr_cuda_gemm_t g;
  memset(&g, 0, sizeof g);
  g.transa = 0;
  g.transb = 1;
  g.M = N;
  g.N = OC;
  g.K = IC;
  g.A = inp;
  g.lda = IC;
  g.B = w;
  g.ldb = IC;
  g.C = out;
  g.ldc = OC;
  g.ab_type = g.c_type = dt;
  g.alpha = 1.0f;
  g.beta = 0.0f;
  g.epilogue =
      gelu ? TR_CUDA_EPI_GELU : (bias ? TR_CUDA_EPI_BIAS : TR_CUDA_EPI_NONE);
  g.with_bias = bias != NULL;
  g.bias = bias;
  g.aux = pre;
  g.ldaux = OC;
  return tr_kern_cuda_gemm(&g, s);
}

extern "C" int tr_kern_cuda_linear_bwd(tr_dtype_t dt, void* dinp, float* dw,
                                       float* dbias, const void* dout,
                                       const void* inp, const void* w,
                                       const void* pre, int64_t N, int IC,
                                       int OC, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(N >= 0 && IC > 0 && OC > 0,
                  "linear_bwd: bad shape N=%lld IC=%d OC=%d", (long long)N, IC,
                  OC);
  tr_cuda_gemm_t g;
  if (dinp) {
    memset(&g, 0, sizeof g);
    g.transa = 0;
    g.transb = 0;
    g.M = N;
    g.N = IC;
    g.K = OC;
    g.A = dout;
    g.lda = OC;
    g.B = w;
    g.ldb = IC;
    g.C = dinp;
    g.ldc = IC;
    g.ab_type = g.c_type = dt;
    g.alpha = 1.0f;
    g.beta = pre ? 0.0f : 1.0f;
    g.epilogue = pre ? TR_CUDA_EPI_DGELU : TR_CUDA_EPI_NONE;
    g.aux = (void*)pre;
    g.ldaux = IC;
    TR_CHECK(tr_kern_cuda_gemm(&g, s));
  }
  if (dw) {
    memset(&g, 0, sizeof g);
    g.transa = 1;
    g.transb = 0;
    g.M = OC;
    g.N = IC;
    g.K = N;
    g.A = dout;
    g.lda = OC;
    g.B = inp;
    g.ldb = IC;
    g.C = dw;
    g.ldc = IC;
    g.ab_type = dt;
    g.c_type = TR_F32;
    g.alpha = 1.0f;
    g.beta = 1.0f;
    TR_CHECK(tr_kern_cuda_gemm(&g, s));
  }
  if (dbias) TR_CHECK(tr_kern_cuda_bias_bwd(dt, dbias, dout, N, OC, s));
  return 0;
}

// ---- module ----

extern "C" int tr__cuda_runtime_init(void);

extern "C" int tr_kern_cuda_init(void) {
  int dev;
  cublasLtHandle_t h;
  TR_CHECK(tr__cuda_runtime_init());
  TR_CHECK(tr__cuda_device(&dev));
  pthread_mutex_lock(&lt_lock);
  int rc = handle_get(dev, &h);
  pthread_mutex_unlock(&lt_lock);
  return rc;
}

extern "C" void tr_kern_cuda_set_tf32(int on) {
  __atomic_store_n(&use_tf32, on ? 1 : 0, __ATOMIC_RELAXED);
}

extern "C" void tr_kern_cuda_set_gemm_tune(int n) {
  __atomic_store_n(&gemm_tune, n, __ATOMIC_RELAXED);
}

extern "C" void tr_kern_cuda_gemm_tune_apply(void) {
  // every step calls this: once the timings are read, it takes no lock
  if (__atomic_load_n(&tune_pending, __ATOMIC_RELAXED) == 0) return;
  pthread_mutex_lock(&lt_lock);
  int64_t t0 = tune_timed, c0 = tune_changed;
  for (int i = 0; i < n_plans; i++)
    if (plans[i]->tune == TUNE_TIMING) tune_finish(plans[i]);
  if (tune_timed > t0)  // what changed, once an apply finds timings done
    TR_LOG_INFO(KERN,
                "GEMM tuning: %lld more shape(s) timed, another algorithm "
                "than cuBLASLt's heuristic pick kept for %lld (so far %lld "
                "of %lld)",
                (long long)(tune_timed - t0), (long long)(tune_changed - c0),
                (long long)tune_changed, (long long)tune_timed);
  pthread_mutex_unlock(&lt_lock);
}

extern "C" void tr_kern_cuda_set_gemm_pick(int k) {
  pthread_mutex_lock(&lt_lock);
  gemm_pick = k;
  pthread_mutex_unlock(&lt_lock);
}

extern "C" int64_t tr_kern_cuda_gemm_pick_misses(void) {
  pthread_mutex_lock(&lt_lock);
  int64_t n = gemm_pick_misses;
  pthread_mutex_unlock(&lt_lock);
  return n;
}

extern "C" void tr_kern_cuda_gemm_tune_stats(int64_t* timed,
                                             int64_t* changed) {
  pthread_mutex_lock(&lt_lock);
  if (timed) *timed = tune_timed;
  if (changed) *changed = tune_changed;
  pthread_mutex_unlock(&lt_lock);
}

extern "C" void tr__cuda_matmul_release(void) {
  pthread_mutex_lock(&lt_lock);
  for (int i = 0; i < n_plans; i++) plan_free(plans[i]);
  free(plans);
  plans = NULL;
  n_plans = cap_plans = 0;
  for (int d = 0; d < TR_MAX_DEVICES; d++)
    if (handles[d]) {
      lt->cublasLtDestroy(handles[d]);
      handles[d] = NULL;
    }
  pthread_mutex_unlock(&lt_lock);
}
