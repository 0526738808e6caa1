/* kernels/cpu/matmul.c: GEMM and the linear layer, forward and backward.
 *
 * Two GEMMs behind tr__cpu_gemm: OpenBLAS's cblas_sgemm (when configure
 * found it) and a cache-blocked fallback written here. Both are threaded by
 * the pool over tiles of C whose split depends only on the matrix shapes,
 * so C's bits never depend on the thread count; OpenBLAS is told to use
 * one thread per call.
 *
 * The fallback packs a KC x NC panel of op(B) into NR-column strips and an
 * MC x KC block of op(A) into MR-row strips (zero-padded at the edges), and
 * a 6 x 16 micro-kernel accumulates over the panel with 16-float vectors
 * (GCC vector extensions, compiled for AVX-512, AVX2 and baseline x86-64
 * and picked at load time). Each task owns one MC x NC tile of C and walks
 * K in one fixed order.
 */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* ---- implementation choice ---- */

static int gemm_impl = TR_GEMM_AUTO;

int tr_kern_cpu_have_blas(void) {
#ifdef HAVE_OPENBLAS
  return 1;
#else
  return 0;
#endif
}

int tr_kern_cpu_set_gemm(tr_gemm_impl_t impl) {
  if (impl != TR_GEMM_AUTO && impl != TR_GEMM_BLAS && impl != TR_GEMM_BLOCKED)
    return TR_EINVAL;
  if (impl == TR_GEMM_BLAS && !tr_kern_cpu_have_blas()) return TR_EUNSUPPORTED;
  __atomic_store_n(&gemm_impl, (int)impl, __ATOMIC_RELAXED);
  return 0;
}

tr_gemm_impl_t tr_kern_cpu_gemm(void) {
  int impl = __atomic_load_n(&gemm_impl, __ATOMIC_RELAXED);
  if (impl == TR_GEMM_AUTO)
    return tr_kern_cpu_have_blas() ? TR_GEMM_BLAS : TR_GEMM_BLOCKED;
  return (tr_gemm_impl_t)impl;
}

/* ---- the blocked fallback ---- */

#define MR 6
#define NR 16
#define MC 96  /* rows of C per task: 16 strips of MR */
#define NC 256 /* columns of C per task: 16 strips of NR */
#define KC 256 /* depth of one packed panel */

typedef float v16f __attribute__((vector_size(64)));

typedef struct {
  int transa, transb;
  int64_t M, N, K;
  float alpha, beta;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float* C;
  int64_t ldc;
  int64_t ntiles_n;
} blocked_t;

/* op(A)[i0:i0+mc, k0:k0+kc] into MR-row strips: strip s holds, for each k,
 * MR consecutive floats. Rows past mc are zero. */
static void pack_a(float* dst, const blocked_t* g, int64_t i0, int64_t mc,
                   int64_t k0, int64_t kc) {
  for (int64_t s = 0; s < mc; s += MR) {
    for (int64_t k = 0; k < kc; k++) {
      for (int r = 0; r < MR; r++) {
        int64_t i = s + r;
        float v = 0.0f;
        if (i < mc) {
          int64_t gi = i0 + i, gk = k0 + k;
          v = g->transa ? g->A[gk * g->lda + gi] : g->A[gi * g->lda + gk];
        }
        *dst++ = v;
      }
    }
  }
}

/* op(B)[k0:k0+kc, j0:j0+nc] into NR-column strips. Columns past nc are 0. */
static void pack_b(float* dst, const blocked_t* g, int64_t j0, int64_t nc,
                   int64_t k0, int64_t kc) {
  for (int64_t s = 0; s < nc; s += NR) {
    int64_t w = nc - s < NR ? nc - s : NR;
    for (int64_t k = 0; k < kc; k++) {
      int64_t gk = k0 + k;
      if (!g->transb && w == NR) {
        memcpy(dst, g->B + gk * g->ldb + j0 + s, NR * sizeof(float));
      } else {
        for (int64_t c = 0; c < NR; c++) {
          float v = 0.0f;
          if (c < w) {
            int64_t gj = j0 + s + c;
            v = g->transb ? g->B[gj * g->ldb + gk] : g->B[gk * g->ldb + gj];
          }
          dst[c] = v;
        }
      }
      dst += NR;
    }
  }
}

/* unaligned 16-float load (a macro: a v16f-returning function would change
 * the ABI of the non-AVX-512 clones) */
#define LOAD16(v, p) memcpy(&(v), (p), sizeof(v))

/* C[0:mr, 0:nr] += alpha * (A strip) x (B strip) over kc, for every pair of
 * strips in the packed block; six named accumulators stay in registers. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
macro_kernel(const float* ap, const float* bp, int64_t mc, int64_t nc,
             int64_t kc, float alpha, float* C, int64_t ldc) {
  for (int64_t js = 0; js < nc; js += NR) {
    const float* b0 = bp + js * kc;
    int64_t nr = nc - js < NR ? nc - js : NR;
    for (int64_t is = 0; is < mc; is += MR) {
      const float* a = ap + is * kc;
      int64_t mr = mc - is < MR ? mc - is : MR;
      v16f c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, c4 = {0}, c5 = {0};
      const float* b = b0;
      for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        v16f bv;
        LOAD16(bv, b);
        c0 += a[0] * bv;
        c1 += a[1] * bv;
        c2 += a[2] * bv;
        c3 += a[3] * bv;
        c4 += a[4] * bv;
        c5 += a[5] * bv;
      }
      v16f acc[MR] = {c0, c1, c2, c3, c4, c5};
      for (int64_t r = 0; r < mr; r++) {
        float* c = C + (is + r) * ldc + js;
        if (nr == NR) {
          v16f old;
          LOAD16(old, c);
          old += alpha * acc[r];
          memcpy(c, &old, sizeof old);
        } else {
          for (int64_t j = 0; j < nr; j++) c[j] += alpha * acc[r][j];
        }
      }
    }
  }
}

static void blocked_task(void* ctx, int64_t task) {
  const blocked_t* g = ctx;
  int64_t ti = task / g->ntiles_n, tj = task % g->ntiles_n;
  int64_t i0 = ti * MC, j0 = tj * NC;
  int64_t mc = g->M - i0 < MC ? g->M - i0 : MC;
  int64_t nc = g->N - j0 < NC ? g->N - j0 : NC;
  float* C = g->C + i0 * g->ldc + j0;
  /* beta first, so beta == 0 never reads the old C (NaN-safe) */
  if (g->beta != 1.0f) {
    for (int64_t i = 0; i < mc; i++) {
      float* c = C + i * g->ldc;
      if (g->beta == 0.0f)
        memset(c, 0, (size_t)nc * sizeof(float));
      else
        for (int64_t j = 0; j < nc; j++) c[j] *= g->beta;
    }
  }
  if (g->alpha == 0.0f || g->K == 0) return;
  float* abuf = tr__cpu_scratch(0, sizeof(float) * MC * KC);
  float* bbuf = tr__cpu_scratch(1, sizeof(float) * NC * KC);
  for (int64_t k0 = 0; k0 < g->K; k0 += KC) {
    int64_t kc = g->K - k0 < KC ? g->K - k0 : KC;
    pack_b(bbuf, g, j0, nc, k0, kc);
    pack_a(abuf, g, i0, mc, k0, kc);
    macro_kernel(abuf, bbuf, mc, nc, kc, g->alpha, C, g->ldc);
  }
}

int tr_kern_cpu_gemm_blocked(int transa, int transb, int64_t M, int64_t N,
                             int64_t K, float alpha, const float* A,
                             int64_t lda, const float* B, int64_t ldb,
                             float beta, float* C, int64_t ldc) {
  if (M < 0 || N < 0 || K < 0 || ldc < N) return TR_EINVAL;
  if (lda < (transa ? M : K) || ldb < (transb ? K : N)) return TR_EINVAL;
  if (M == 0 || N == 0) return 0;
  blocked_t g = {transa, transb, M, N,   K, alpha, beta,
                 A,      lda,    B, ldb, C, ldc,   (N + NC - 1) / NC};
  tr__cpu_parallel(((M + MC - 1) / MC) * g.ntiles_n, blocked_task, &g);
  return 0;
}

/* ---- OpenBLAS, one thread per call, tiles split by shape ---- */

#ifdef HAVE_OPENBLAS
typedef struct {
  int transa, transb;
  int64_t M, N, K;
  float alpha, beta;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float* C;
  int64_t ldc;
  int split_rows; /* 1: tasks are row chunks of C, else column chunks */
  int64_t chunk;
} blas_t;

static void blas_task(void* ctx, int64_t task) {
  const blas_t* g = ctx;
  enum CBLAS_TRANSPOSE ta = g->transa ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = g->transb ? CblasTrans : CblasNoTrans;
  int64_t start = task * g->chunk;
  if (g->split_rows) {
    int64_t m = g->M - start < g->chunk ? g->M - start : g->chunk;
    const float* a = g->transa ? g->A + start : g->A + start * g->lda;
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)g->N, (blasint)g->K,
                g->alpha, a, (blasint)g->lda, g->B, (blasint)g->ldb, g->beta,
                g->C + start * g->ldc, (blasint)g->ldc);
  } else {
    int64_t n = g->N - start < g->chunk ? g->N - start : g->chunk;
    const float* b = g->transb ? g->B + start * g->ldb : g->B + start;
    cblas_sgemm(CblasRowMajor, ta, tb, (blasint)g->M, (blasint)n, (blasint)g->K,
                g->alpha, g->A, (blasint)g->lda, b, (blasint)g->ldb, g->beta,
                g->C + start, (blasint)g->ldc);
  }
}

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

static int gemm_blas(int transa, int transb, int64_t M, int64_t N, int64_t K,
                     float alpha, const float* A, int64_t lda, const float* B,
                     int64_t ldb, float beta, float* C, int64_t ldc) {
  pthread_once(&blas_once, blas_single_thread);
  if (M == 0 || N == 0) return 0;
  blas_t g = {transa, transb, M,   N, K,   alpha, beta, A,
              lda,    B,      ldb, C, ldc, 0,     0};
  /* split the larger of M and N into at most 16 chunks of >= 64, rounded
   * to 16: a function of the shape only */
  g.split_rows = M >= N;
  int64_t dim = g.split_rows ? M : N;
  int64_t chunk = (dim + 15) / 16;
  chunk = (chunk + 15) / 16 * 16;
  if (chunk < 64) chunk = 64;
  g.chunk = chunk;
  tr__cpu_parallel(tr__cpu_ntasks(dim, chunk), blas_task, &g);
  return 0;
}
#endif

int tr__cpu_gemm(int transa, int transb, int64_t M, int64_t N, int64_t K,
                 float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M < 0 || N < 0 || K < 0 || ldc < N) return TR_EINVAL;
  if (lda < (transa ? M : K) || ldb < (transb ? K : N)) return TR_EINVAL;
#ifdef HAVE_OPENBLAS
  if (tr_kern_cpu_gemm() == TR_GEMM_BLAS && M < INT32_MAX && N < INT32_MAX &&
      K < INT32_MAX && lda < INT32_MAX && ldb < INT32_MAX && ldc < INT32_MAX)
    return gemm_blas(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                     ldc);
#endif
  return tr_kern_cpu_gemm_blocked(transa, transb, M, N, K, alpha, A, lda, B,
                                  ldb, beta, C, ldc);
}

/* ---- linear ---- */

typedef struct {
  float* out;
  const float* bias;
  int64_t N;
  int OC;
  int64_t ld;
} bias_fill_t;

static void bias_fill_task(void* ctx, int64_t task) {
  const bias_fill_t* a = ctx;
  int64_t r0 = task * 64, r1 = r0 + 64 < a->N ? r0 + 64 : a->N;
  for (int64_t r = r0; r < r1; r++)
    memcpy(a->out + r * a->ld, a->bias, (size_t)a->OC * sizeof(float));
}

int tr__cpu_linear_fwd(float* out, const float* inp, const float* w,
                       const float* bias, int64_t N, int IC, int OC,
                       int64_t ldo) {
  if (bias) {
    bias_fill_t a = {out, bias, N, OC, ldo};
    tr__cpu_parallel(tr__cpu_ntasks(N, 64), bias_fill_task, &a);
  }
  return tr__cpu_gemm(0, 1, N, OC, IC, 1.0f, inp, IC, w, IC, bias ? 1.0f : 0.0f,
                      out, ldo);
}

typedef struct {
  float* dbias;
  const float* dout;
  int64_t N;
  int OC;
  int64_t ld;
} dbias_t;

#define DBIAS_COLS 64

static void dbias_task(void* ctx, int64_t task) {
  const dbias_t* a = ctx;
  int c0 = (int)task * DBIAS_COLS;
  int c1 = c0 + DBIAS_COLS < a->OC ? c0 + DBIAS_COLS : a->OC;
  float acc[DBIAS_COLS] = {0};
  for (int64_t r = 0; r < a->N; r++) {
    const float* d = a->dout + r * a->ld;
    for (int c = c0; c < c1; c++) acc[c - c0] += d[c];
  }
  for (int c = c0; c < c1; c++) a->dbias[c] += acc[c - c0];
}

/* beta_in: 1 adds dout w into dinp, 0 overwrites it (the GEMM zeroes C
 * first and then accumulates in the same order: the bits of a zeroed
 * buffer's accumulation) */
static int linear_bwd(float* dinp, float* dw, float* dbias, const float* dout,
                      const float* inp, const float* w, int64_t N, int IC,
                      int OC, int64_t ldd, float beta_in) {
  if (dinp)
    TR_CHECK(tr__cpu_gemm(0, 0, N, IC, OC, 1.0f, dout, ldd, w, IC, beta_in,
                          dinp, IC));
  if (dw)
    TR_CHECK(
        tr__cpu_gemm(1, 0, OC, IC, N, 1.0f, dout, ldd, inp, IC, 1.0f, dw, IC));
  if (dbias) {
    dbias_t a = {dbias, dout, N, OC, ldd};
    tr__cpu_parallel(tr__cpu_ntasks(OC, DBIAS_COLS), dbias_task, &a);
  }
  return 0;
}

int tr__cpu_linear_bwd(float* dinp, float* dw, float* dbias, const float* dout,
                       const float* inp, const float* w, int64_t N, int IC,
                       int OC, int64_t ldd) {
  return linear_bwd(dinp, dw, dbias, dout, inp, w, N, IC, OC, ldd, 1.0f);
}

int tr__cpu_linear_bwd_write(float* dinp, float* dw, float* dbias,
                             const float* dout, const float* inp,
                             const float* w, int64_t N, int IC, int OC,
                             int64_t ldd) {
  return linear_bwd(dinp, dw, dbias, dout, inp, w, N, IC, OC, ldd, 0.0f);
}
