/* tests/check_kernels.c: the CPU kernels against double-precision references.
 *
 * Every forward is compared with a reference written here in double. Every
 * backward is compared with central differences of that double reference:
 * the objective is L = sum(w * out) for a random w (the upstream gradient
 * fed to the fp32 backward), dL/dx_j ~ (L(x + h e_j) - L(x - h e_j)) / 2h
 * with h = 1e-5 in double, so the numeric side is exact to ~1e-9 and the
 * comparison measures the fp32 kernel. Tolerance (stated once, used for all
 * gradients): |analytic - numeric| <= 1e-3 |numeric| + 1e-4 max|numeric|.
 * Inputs are random (never zeros). Also: BLAS vs blocked GEMM agreement,
 * bit-identical results across thread counts, AdamW against a step worked
 * by hand, the dispatch table and the thread pool.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lin_kinds.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/param.h"
#include "trainrun/tensor.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x1234567;

static double urand(void) { /* uniform in [-1, 1) */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-52 - 1.0;
}

/* fp32 tensor with random values in [-scale, scale] and its double copy */
static void rnd(tr_tensor_t* t, double** dcopy, double scale, int ndim, ...) {
  int64_t shape[TR_MAX_DIMS];
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; i++) shape[i] = va_arg(ap, int64_t);
  va_end(ap);
  ck_assert_int_eq(tr_tensor_empty(t, TR_F32, TR_DEVICE_CPU, ndim, shape), 0);
  int64_t n = tr_tensor_numel(t);
  float* p = tr_tensor_data(t);
  if (dcopy) *dcopy = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    p[i] = (float)(scale * urand());
    if (dcopy) (*dcopy)[i] = p[i];
  }
}

static void zeros(tr_tensor_t* t, int ndim, ...) {
  int64_t shape[TR_MAX_DIMS];
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; i++) shape[i] = va_arg(ap, int64_t);
  va_end(ap);
  ck_assert_int_eq(tr_tensor_zeros(t, TR_F32, TR_DEVICE_CPU, ndim, shape), 0);
}

static float* fp(const tr_tensor_t* t) { return tr_tensor_data(t); }

static double max_abs(const double* x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
  return m;
}

/* forward output vs double reference: |y - ref| <= 1e-5 (|ref| + max|ref|) */
static void check_fwd(const char* what, const float* y, const double* ref,
                      int64_t n) {
  double scale = max_abs(ref, n);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(fabs(y[i] - ref[i]) <= 1e-5 * (fabs(ref[i]) + scale),
                  "%s[%lld]: %.9g vs reference %.9g", what, (long long)i,
                  (double)y[i], ref[i]);
}

/* Gradient check of one input array x (double copy xd of n elements) whose
 * fp32 analytic gradient is g. obj() evaluates the double objective with
 * the current xd. Checks every coordinate when n <= max_coords, else
 * max_coords coordinates spread over the array. */
typedef double (*obj_fn)(void* ctx);
static void check_grad(const char* what, double* xd, int64_t n, const float* g,
                       obj_fn obj, void* ctx, int max_coords) {
  const double h = 1e-5;
  int64_t step = n <= max_coords ? 1 : n / max_coords;
  int64_t cnt = 0;
  double* num = malloc(sizeof(double) * (size_t)(n / step + 1));
  int64_t* idx = malloc(sizeof(int64_t) * (size_t)(n / step + 1));
  for (int64_t j = (step > 1 ? step / 2 : 0); j < n; j += step) {
    double keep = xd[j];
    xd[j] = keep + h;
    double lp = obj(ctx);
    xd[j] = keep - h;
    double lm = obj(ctx);
    xd[j] = keep;
    num[cnt] = (lp - lm) / (2 * h);
    idx[cnt++] = j;
  }
  double scale = max_abs(num, cnt);
  ck_assert_msg(scale > 0, "%s: gradient is identically zero", what);
  for (int64_t c = 0; c < cnt; c++) {
    double a = g[idx[c]], nu = num[c];
    ck_assert_msg(fabs(a - nu) <= 1e-3 * fabs(nu) + 1e-4 * scale,
                  "%s[%lld]: analytic %.9g vs numeric %.9g", what,
                  (long long)idx[c], a, nu);
  }
  free(num);
  free(idx);
}

static double dot(const double* w, const double* y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += w[i] * y[i];
  return s;
}

/* ---- GEMM ---- */

static void gemm_ref(int ta, int tb, int64_t M, int64_t N, int64_t K,
                     double alpha, const float* A, int64_t lda, const float* B,
                     int64_t ldb, double beta, const float* C0, int64_t ldc,
                     double* out) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++)
        s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
             (tb ? B[j * ldb + k] : B[k * ldb + j]);
      out[i * N + j] = alpha * s + (beta != 0 ? beta * C0[i * ldc + j] : 0);
    }
}

static void gemm_case(int ta, int tb, int64_t M, int64_t N, int64_t K,
                      int64_t pad, float alpha, float beta) {
  int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  int64_t arows = ta ? K : M, brows = tb ? N : K;
  tr_tensor_t A, B, C, C2;
  rnd(&A, NULL, 1.0, 2, arows, lda);
  rnd(&B, NULL, 1.0, 2, brows, ldb);
  rnd(&C, NULL, 1.0, 2, M, ldc);
  rnd(&C2, NULL, 1.0, 2, M, ldc);
  memcpy(fp(&C2), fp(&C), sizeof(float) * (size_t)(M * ldc));
  if (beta == 0.0f) /* beta == 0 must not read C: poison it */
    for (int64_t i = 0; i < M * ldc; i++) fp(&C)[i] = fp(&C2)[i] = NAN;
  double* ref = malloc(sizeof(double) * (size_t)(M * N));
  gemm_ref(ta, tb, M, N, K, alpha, fp(&A), lda, fp(&B), ldb, beta, fp(&C), ldc,
           ref);
  ck_assert_int_eq(tr_kern_cpu_gemm_blocked(ta, tb, M, N, K, alpha, fp(&A), lda,
                                            fp(&B), ldb, beta, fp(&C), ldc),
                   0);
  double scale = max_abs(ref, M * N);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++)
      ck_assert_msg(fabs(fp(&C)[i * ldc + j] - ref[i * N + j]) <=
                        1e-5 * (fabs(ref[i * N + j]) + scale),
                    "blocked gemm ta=%d tb=%d [%lld,%lld]: %g vs %g", ta, tb,
                    (long long)i, (long long)j, (double)fp(&C)[i * ldc + j],
                    ref[i * N + j]);
  /* the table's GEMM (OpenBLAS when built in) agrees with the fallback */
  ck_assert_int_eq(tr_kern_ops(TR_DEV_CPU)
                       ->gemm(ta, tb, M, N, K, alpha, fp(&A), lda, fp(&B), ldb,
                              beta, fp(&C2), ldc),
                   0);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++)
      ck_assert_msg(fabs(fp(&C2)[i * ldc + j] - fp(&C)[i * ldc + j]) <=
                        1e-5 * (fabs(ref[i * N + j]) + scale),
                    "gemm impls disagree at [%lld,%lld]", (long long)i,
                    (long long)j);
  /* padding columns untouched */
  if (pad && beta != 0.0f)
    for (int64_t i = 0; i < M; i++)
      ck_assert(fp(&C)[i * ldc + N] == fp(&C2)[i * ldc + N]);
  free(ref);
  tr_tensor_release(&A);
  tr_tensor_release(&B);
  tr_tensor_release(&C);
  tr_tensor_release(&C2);
}

START_TEST(test_gemm_blocked_vs_reference_and_blas) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_case(ta, tb, 37, 53, 71, 0, 1.0f, 0.0f);
      gemm_case(ta, tb, 7, 5, 3, 3, 0.5f, 1.0f);
      gemm_case(ta, tb, 1, 17, 1, 1, -2.0f, 0.25f);
    }
  /* shapes across every block boundary (MC 96, NC 256, KC 256) */
  gemm_case(0, 1, 200, 300, 270, 5, 1.0f, 1.0f);
  gemm_case(1, 0, 97, 257, 513, 0, 1.0f, 0.0f);
}
END_TEST

START_TEST(test_gemm_impl_switch) {
  ck_assert_int_eq(tr_kern_cpu_set_gemm(TR_GEMM_BLOCKED), 0);
  ck_assert_int_eq(tr_kern_cpu_gemm(), TR_GEMM_BLOCKED);
  ck_assert_int_eq(tr_kern_cpu_set_gemm(TR_GEMM_BLAS),
                   tr_kern_cpu_have_blas() ? 0 : TR_EUNSUPPORTED);
  ck_assert_int_eq(tr_kern_cpu_set_gemm(TR_GEMM_AUTO), 0);
  ck_assert_int_eq(tr_kern_cpu_gemm(),
                   tr_kern_cpu_have_blas() ? TR_GEMM_BLAS : TR_GEMM_BLOCKED);
  ck_assert_int_eq(tr_kern_cpu_set_gemm((tr_gemm_impl_t)7), TR_EINVAL);
  /* the tensor entry point with a padded (narrowed) view */
  tr_tensor_t a, b, c, cv = {0};
  rnd(&a, NULL, 1.0, 2, (int64_t)4, (int64_t)3);
  rnd(&b, NULL, 1.0, 2, (int64_t)5, (int64_t)3);
  rnd(&c, NULL, 1.0, 2, (int64_t)4, (int64_t)8);
  ck_assert_int_eq(tr_tensor_narrow(&cv, &c, 1, 2, 5), 0);
  ck_assert_int_eq(tr_kern_gemm(&cv, &a, 0, &b, 1, 1.0f, 0.0f), 0);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 5; j++) {
      double s = 0;
      for (int k = 0; k < 3; k++) s += fp(&a)[i * 3 + k] * fp(&b)[j * 3 + k];
      ck_assert(fabs(fp(&c)[i * 8 + 2 + j] - s) < 1e-5);
    }
  ck_assert_int_eq(tr_kern_gemm(&cv, &a, 1, &b, 1, 1.0f, 0.0f), TR_ESHAPE);
  tr_tensor_release(&cv);
  tr_tensor_release(&a);
  tr_tensor_release(&b);
  tr_tensor_release(&c);
}
END_TEST

/* ---- linear ---- */

typedef struct {
  double *x, *w, *b, *dy;
  int64_t N, IC, OC;
} lin_ctx;

static double lin_obj(void* p) {
  lin_ctx* c = p;
  double s = 0;
  for (int64_t n = 0; n < c->N; n++)
    for (int64_t o = 0; o < c->OC; o++) {
      double y = c->b[o];
      for (int64_t i = 0; i < c->IC; i++)
        y += c->x[n * c->IC + i] * c->w[o * c->IC + i];
      s += c->dy[n * c->OC + o] * y;
    }
  return s;
}

static void linear_case(tr_gemm_impl_t impl) {
  if (impl == TR_GEMM_BLAS && !tr_kern_cpu_have_blas()) return;
  ck_assert_int_eq(tr_kern_cpu_set_gemm(impl), 0);
  lin_ctx c = {.N = 6, .IC = 11, .OC = 9};
  tr_tensor_t x, w, b, dy, y, dx, dw, db;
  rnd(&x, &c.x, 1.0, 3, (int64_t)2, (int64_t)3, c.IC);
  rnd(&w, &c.w, 0.5, 2, c.OC, c.IC);
  rnd(&b, &c.b, 0.5, 1, c.OC);
  rnd(&dy, &c.dy, 1.0, 3, (int64_t)2, (int64_t)3, c.OC);
  zeros(&y, 3, (int64_t)2, (int64_t)3, c.OC);
  ck_assert_int_eq(tr_kern_linear_fwd(&y, &x, &w, &b), 0);
  double* ref = malloc(sizeof(double) * (size_t)(c.N * c.OC));
  for (int64_t n = 0; n < c.N; n++)
    for (int64_t o = 0; o < c.OC; o++) {
      ref[n * c.OC + o] = c.b[o];
      for (int64_t i = 0; i < c.IC; i++)
        ref[n * c.OC + o] += c.x[n * c.IC + i] * c.w[o * c.IC + i];
    }
  check_fwd("linear out", fp(&y), ref, c.N * c.OC);
  zeros(&dx, 3, (int64_t)2, (int64_t)3, c.IC);
  zeros(&dw, 2, c.OC, c.IC);
  zeros(&db, 1, c.OC);
  ck_assert_int_eq(tr_kern_linear_bwd(&dx, &dw, &db, &dy, &x, &w), 0);
  check_grad("linear dx", c.x, c.N * c.IC, fp(&dx), lin_obj, &c, 1000);
  check_grad("linear dw", c.w, c.OC * c.IC, fp(&dw), lin_obj, &c, 1000);
  check_grad("linear db", c.b, c.OC, fp(&db), lin_obj, &c, 1000);
  /* backward accumulates: a second call doubles every gradient */
  float dw0 = fp(&dw)[5], dx0 = fp(&dx)[7], db0 = fp(&db)[2];
  ck_assert_int_eq(tr_kern_linear_bwd(&dx, &dw, &db, &dy, &x, &w), 0);
  ck_assert(fabsf(fp(&dw)[5] - 2 * dw0) <= 1e-6f * fabsf(dw0) + 1e-7f);
  ck_assert(fabsf(fp(&dx)[7] - 2 * dx0) <= 1e-6f * fabsf(dx0) + 1e-7f);
  ck_assert(fabsf(fp(&db)[2] - 2 * db0) <= 1e-6f * fabsf(db0) + 1e-7f);
  /* shape errors are caught */
  tr_tensor_t bad;
  zeros(&bad, 2, c.OC, c.IC + 1);
  ck_assert_int_eq(tr_kern_linear_fwd(&y, &x, &bad, &b), TR_ESHAPE);
  tr_tensor_release(&bad);
  tr_tensor_t* ts[] = {&x, &w, &b, &dy, &y, &dx, &dw, &db};
  for (int i = 0; i < 8; i++) tr_tensor_release(ts[i]);
  free(ref);
  free(c.x);
  free(c.w);
  free(c.b);
  free(c.dy);
  tr_kern_cpu_set_gemm(TR_GEMM_AUTO);
}

START_TEST(test_linear_grad_blas) { linear_case(TR_GEMM_BLAS); }
END_TEST
START_TEST(test_linear_grad_blocked) { linear_case(TR_GEMM_BLOCKED); }
END_TEST

/* ---- embedding ---- */

typedef struct {
  double *wte, *wpe, *dy;
  const int32_t* tok;
  int B, T, C;
} emb_ctx;

static double emb_obj(void* p) {
  emb_ctx* c = p;
  double s = 0;
  for (int r = 0; r < c->B * c->T; r++)
    for (int k = 0; k < c->C; k++)
      s += c->dy[r * c->C + k] *
           (c->wte[c->tok[r] * c->C + k] + c->wpe[(r % c->T) * c->C + k]);
  return s;
}

START_TEST(test_embedding) {
  int32_t tok[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 0}; /* repeats */
  emb_ctx c = {.tok = tok, .B = 2, .T = 6, .C = 70};
  tr_tensor_t tt, wte, wpe, dy, y, dwte, dwpe;
  int64_t tshape[2] = {2, 6};
  ck_assert_int_eq(tr_tensor_wrap(&tt, tok, TR_I32, TR_DEVICE_CPU, 2, tshape),
                   0);
  rnd(&wte, &c.wte, 1.0, 2, (int64_t)10, (int64_t)c.C);
  rnd(&wpe, &c.wpe, 1.0, 2, (int64_t)8, (int64_t)c.C);
  rnd(&dy, &c.dy, 1.0, 3, (int64_t)2, (int64_t)6, (int64_t)c.C);
  zeros(&y, 3, (int64_t)2, (int64_t)6, (int64_t)c.C);
  ck_assert_int_eq(tr_kern_embedding_fwd(&y, &tt, &wte, &wpe), 0);
  for (int r = 0; r < 12; r++)
    for (int k = 0; k < c.C; k++)
      ck_assert(fp(&y)[r * c.C + k] ==
                fp(&wte)[tok[r] * c.C + k] + fp(&wpe)[(r % 6) * c.C + k]);
  zeros(&dwte, 2, (int64_t)10, (int64_t)c.C);
  zeros(&dwpe, 2, (int64_t)8, (int64_t)c.C);
  ck_assert_int_eq(tr_kern_embedding_bwd(&dwte, &dwpe, &dy, &tt), 0);
  check_grad("embedding dwte", c.wte, 10 * c.C, fp(&dwte), emb_obj, &c, 2000);
  check_grad("embedding dwpe", c.wpe, 8 * c.C, fp(&dwpe), emb_obj, &c, 2000);
  /* without positions: a pure lookup */
  ck_assert_int_eq(tr_kern_embedding_fwd(&y, &tt, &wte, NULL), 0);
  ck_assert(fp(&y)[13] == fp(&wte)[tok[0] * c.C + 13]);
  /* a token outside the vocabulary is refused */
  tok[4] = 10;
  ck_assert_int_eq(tr_kern_embedding_fwd(&y, &tt, &wte, &wpe), TR_EINVAL);
  tok[4] = -1;
  ck_assert_int_eq(tr_kern_embedding_bwd(&dwte, &dwpe, &dy, &tt), TR_EINVAL);
  tr_tensor_t* ts[] = {&tt, &wte, &wpe, &dy, &y, &dwte, &dwpe};
  for (int i = 0; i < 7; i++) tr_tensor_release(ts[i]);
  free(c.wte);
  free(c.wpe);
  free(c.dy);
}
END_TEST

/* The vocabulary-parallel lookup: three slices of a 12-row table; the sum
 * of their outputs is the whole table's lookup bit for bit (each token in
 * one slice, 0 elsewhere), their gradients are the whole table's rows. */
START_TEST(test_embedding_rows) {
  int32_t tok[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 11, 0};
  int64_t tshape[2] = {2, 6}, C = 20;
  tr_tensor_t tt, wte, wpe, dy, y, part, sum, dwte, dwpe, sdw, sdp, w, g;
  double *dw, *dp, *dd;
  ck_assert_int_eq(tr_tensor_wrap(&tt, tok, TR_I32, TR_DEVICE_CPU, 2, tshape),
                   0);
  rnd(&wte, &dw, 1.0, 2, (int64_t)12, C);
  rnd(&wpe, &dp, 1.0, 2, (int64_t)6, C);
  rnd(&dy, &dd, 1.0, 3, (int64_t)2, (int64_t)6, C);
  zeros(&y, 3, (int64_t)2, (int64_t)6, C);
  zeros(&part, 3, (int64_t)2, (int64_t)6, C);
  zeros(&sum, 3, (int64_t)2, (int64_t)6, C);
  ck_assert_int_eq(tr_kern_embedding_fwd(&y, &tt, &wte, NULL), 0);
  zeros(&dwte, 2, (int64_t)12, C);
  zeros(&dwpe, 2, (int64_t)6, C);
  zeros(&sdw, 2, (int64_t)12, C);
  zeros(&sdp, 2, (int64_t)6, C);
  ck_assert_int_eq(tr_kern_embedding_bwd(&dwte, &dwpe, &dy, &tt), 0);
  for (int r = 0; r < 3; r++) {
    memset(&w, 0, sizeof w);
    memset(&g, 0, sizeof g);
    ck_assert_int_eq(tr_tensor_narrow(&w, &wte, 0, 4 * r, 4), 0);
    ck_assert_int_eq(tr_tensor_narrow(&g, &sdw, 0, 4 * r, 4), 0);
    ck_assert_int_eq(tr_kern_embedding_rows_fwd(&part, &tt, &w, 4 * r, 12), 0);
    for (int64_t i = 0; i < 12; i++) { /* 0 where the slice lacks it */
      int mine = tok[i] >= 4 * r && tok[i] < 4 * r + 4;
      for (int64_t k = 0; k < C; k++)
        if (!mine) ck_assert(fp(&part)[i * C + k] == 0.0f);
    }
    ck_assert_int_eq(tr_kern_add(&sum, &sum, &part), 0);
    /* positions once: from the first slice only */
    ck_assert_int_eq(
        tr_kern_embedding_rows_bwd(&g, r ? NULL : &sdp, &dy, &tt, 4 * r), 0);
    tr_tensor_release(&w);
    tr_tensor_release(&g);
  }
  ck_assert(memcmp(fp(&sum), fp(&y), tr_tensor_nbytes(&y)) == 0);
  ck_assert(memcmp(fp(&sdw), fp(&dwte), tr_tensor_nbytes(&dwte)) == 0);
  ck_assert(memcmp(fp(&sdp), fp(&dwpe), tr_tensor_nbytes(&dwpe)) == 0);
  /* a token outside the whole vocabulary, or a slice past it: refused */
  ck_assert_int_eq(tr_tensor_narrow(&w, &wte, 0, 8, 4), 0);
  ck_assert_int_eq(tr_kern_embedding_rows_fwd(&part, &tt, &w, 8, 11),
                   TR_EINVAL);
  tok[2] = 12;
  ck_assert_int_eq(tr_kern_embedding_rows_fwd(&part, &tt, &w, 8, 12),
                   TR_EINVAL);
  tr_tensor_release(&w);
  tr_tensor_t* ts[] = {&tt,  &wte,  &wpe,  &dy,  &y,  &part,
                       &sum, &dwte, &dwpe, &sdw, &sdp};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  free(dw);
  free(dp);
  free(dd);
}
END_TEST

/* ---- LayerNorm and RMSNorm ---- */

typedef struct {
  double *x, *w, *b, *dy;
  int64_t N, C;
  int rms;
  double eps;
} norm_ctx;

static void norm_ref(norm_ctx* c, double* y) {
  for (int64_t n = 0; n < c->N; n++) {
    const double* x = c->x + n * c->C;
    double m = 0, v = 0;
    if (!c->rms) {
      for (int64_t k = 0; k < c->C; k++) m += x[k];
      m /= c->C;
    }
    for (int64_t k = 0; k < c->C; k++) v += (x[k] - m) * (x[k] - m);
    double r = 1.0 / sqrt(v / c->C + c->eps);
    for (int64_t k = 0; k < c->C; k++)
      y[n * c->C + k] = (x[k] - m) * r * c->w[k] + (c->rms ? 0 : c->b[k]);
  }
}

static double norm_obj(void* p) {
  norm_ctx* c = p;
  double* y = malloc(sizeof(double) * (size_t)(c->N * c->C));
  norm_ref(c, y);
  double s = dot(c->dy, y, c->N * c->C);
  free(y);
  return s;
}

static void norm_case(int rms) {
  norm_ctx c = {.N = 37, .C = 150, .rms = rms, .eps = 1e-5};
  tr_tensor_t x, w, b, dy, y, mean, rstd, dx, dw, db;
  rnd(&x, &c.x, 2.0, 2, c.N, c.C);
  for (int64_t i = 0; i < c.N * c.C; i++) { /* offset rows: a real mean */
    fp(&x)[i] += 0.5f;
    c.x[i] = fp(&x)[i];
  }
  rnd(&w, &c.w, 1.0, 1, c.C);
  rnd(&b, &c.b, 1.0, 1, c.C);
  rnd(&dy, &c.dy, 1.0, 2, c.N, c.C);
  zeros(&y, 2, c.N, c.C);
  zeros(&mean, 1, c.N);
  zeros(&rstd, 1, c.N);
  if (rms)
    ck_assert_int_eq(tr_kern_rmsnorm_fwd(&y, &rstd, &x, &w, 1e-5f), 0);
  else
    ck_assert_int_eq(tr_kern_layernorm_fwd(&y, &mean, &rstd, &x, &w, &b, 1e-5f),
                     0);
  double* ref = malloc(sizeof(double) * (size_t)(c.N * c.C));
  norm_ref(&c, ref);
  check_fwd(rms ? "rmsnorm out" : "layernorm out", fp(&y), ref, c.N * c.C);
  zeros(&dx, 2, c.N, c.C);
  zeros(&dw, 1, c.C);
  zeros(&db, 1, c.C);
  if (rms) {
    ck_assert_int_eq(tr_kern_rmsnorm_bwd(&dx, &dw, &dy, &x, &w, &rstd), 0);
  } else {
    ck_assert_int_eq(
        tr_kern_layernorm_bwd(&dx, &dw, &db, &dy, &x, &w, &mean, &rstd), 0);
    check_grad("layernorm db", c.b, c.C, fp(&db), norm_obj, &c, 200);
  }
  check_grad(rms ? "rmsnorm dx" : "layernorm dx", c.x, c.N * c.C, fp(&dx),
             norm_obj, &c, 600);
  check_grad(rms ? "rmsnorm dw" : "layernorm dw", c.w, c.C, fp(&dw), norm_obj,
             &c, 200);
  tr_tensor_t* ts[] = {&x, &w, &b, &dy, &y, &mean, &rstd, &dx, &dw, &db};
  for (int i = 0; i < 10; i++) tr_tensor_release(ts[i]);
  free(ref);
  free(c.x);
  free(c.w);
  free(c.b);
  free(c.dy);
}

START_TEST(test_layernorm) { norm_case(0); }
END_TEST
START_TEST(test_rmsnorm) { norm_case(1); }
END_TEST

/* ---- RoPE ---- */

START_TEST(test_rope_table_llama31_scaling) {
  /* D = 8, theta = 500000: inv_freq = 1, 0.0376, 0.00141, 5.3e-5, i.e.
   * wavelengths 6.3, 167, 4440, 118000. With original_max_pos 16, low 1,
   * high 4, factor 8: wavelength 6.3 lies between 16/4 and 16/1 (blended),
   * the others exceed 16 (divided by 8). */
  tr_rope_scaling_t sc = {8.0f, 1.0f, 4.0f, 16};
  float cs[3 * 4], sn[3 * 4];
  ck_assert_int_eq(tr_kern_rope_table(cs, sn, 3, 8, 500000.0, &sc), 0);
  double f[4];
  for (int i = 0; i < 4; i++) f[i] = pow(500000.0, -2.0 * i / 8);
  double wl0 = 2 * M_PI / f[0];
  double smooth = (16.0 / wl0 - 1.0) / (4.0 - 1.0);
  double want0 = (1 - smooth) * f[0] / 8 + smooth * f[0];
  ck_assert(fabs(sn[4 + 0] - sin(want0)) < 1e-6); /* t = 1 */
  ck_assert(fabs(cs[8 + 0] - cos(2 * want0)) < 1e-6);
  for (int i = 1; i < 4; i++)
    ck_assert(fabs(sn[8 + i] - sin(2 * f[i] / 8)) < 1e-7);
  /* without scaling, and a high-frequency dim kept as is under scaling */
  ck_assert_int_eq(tr_kern_rope_table(cs, sn, 3, 8, 500000.0, NULL), 0);
  ck_assert(fabs(sn[4 + 1] - sin(f[1])) < 1e-7);
  tr_rope_scaling_t big = {8.0f, 1.0f, 4.0f, 8192};
  ck_assert_int_eq(tr_kern_rope_table(cs, sn, 3, 8, 500000.0, &big), 0);
  ck_assert(fabs(sn[4 + 0] - sin(f[0])) < 1e-7);
  ck_assert_int_eq(tr_kern_rope_table(cs, sn, 3, 7, 500000.0, NULL), TR_EINVAL);
}
END_TEST

typedef struct {
  double *x, *dy;
  const float *cs, *sn;
  int B, T, H, D;
} rope_ctx;

static void rope_ref(rope_ctx* c, const double* x, double* y) {
  int half = c->D / 2;
  for (int r = 0; r < c->B * c->T; r++)
    for (int h = 0; h < c->H; h++)
      for (int i = 0; i < half; i++) {
        int64_t o = ((int64_t)r * c->H + h) * c->D;
        double cs = c->cs[(r % c->T) * half + i],
               sn = c->sn[(r % c->T) * half + i];
        y[o + i] = x[o + i] * cs - x[o + i + half] * sn;
        y[o + i + half] = x[o + i + half] * cs + x[o + i] * sn;
      }
}

static double rope_obj(void* p) {
  rope_ctx* c = p;
  int64_t n = (int64_t)c->B * c->T * c->H * c->D;
  double* y = malloc(sizeof(double) * (size_t)n);
  rope_ref(c, c->x, y);
  double s = dot(c->dy, y, n);
  free(y);
  return s;
}

START_TEST(test_rope_forward_and_inverse) {
  rope_ctx c = {.B = 2, .T = 5, .H = 3, .D = 8};
  float cs[5 * 4], sn[5 * 4];
  tr_rope_scaling_t sc = {8.0f, 1.0f, 4.0f, 16};
  ck_assert_int_eq(tr_kern_rope_table(cs, sn, 5, 8, 10000.0, &sc), 0);
  c.cs = cs;
  c.sn = sn;
  int64_t n = 2 * 5 * 3 * 8, tshape[2] = {5, 4};
  tr_tensor_t x, dy, tc, ts_;
  rnd(&x, &c.x, 1.0, 3, (int64_t)2, (int64_t)5, (int64_t)24);
  rnd(&dy, &c.dy, 1.0, 3, (int64_t)2, (int64_t)5, (int64_t)24);
  ck_assert_int_eq(tr_tensor_wrap(&tc, cs, TR_F32, TR_DEVICE_CPU, 2, tshape),
                   0);
  ck_assert_int_eq(tr_tensor_wrap(&ts_, sn, TR_F32, TR_DEVICE_CPU, 2, tshape),
                   0);
  ck_assert_int_eq(tr_kern_rope(&x, 3, &tc, &ts_, 0), 0);
  double* ref = malloc(sizeof(double) * (size_t)n);
  rope_ref(&c, c.x, ref);
  check_fwd("rope out", fp(&x), ref, n);
  /* backward = inverse rotation of dy, checked against differences */
  ck_assert_int_eq(tr_kern_rope(&dy, 3, &tc, &ts_, 1), 0);
  check_grad("rope dx", c.x, n, fp(&dy), rope_obj, &c, 1000);
  /* inverse(forward(x)) == x */
  ck_assert_int_eq(tr_kern_rope(&x, 3, &tc, &ts_, 1), 0);
  for (int64_t i = 0; i < n; i++) ck_assert(fabs(fp(&x)[i] - c.x[i]) < 1e-6);
  /* a strided column slice (q of a fused buffer) rotates only its columns */
  tr_tensor_t wide, sl = {0};
  rnd(&wide, NULL, 1.0, 3, (int64_t)2, (int64_t)5, (int64_t)40);
  float keep = fp(&wide)[30];
  ck_assert_int_eq(tr_tensor_narrow(&sl, &wide, 2, 0, 24), 0);
  ck_assert_int_eq(tr_kern_rope(&sl, 3, &tc, &ts_, 0), 0);
  ck_assert(fp(&wide)[30] == keep);
  ck_assert_int_eq(tr_kern_rope(&sl, 5, &tc, &ts_, 0), TR_ESHAPE);
  tr_tensor_t* ts[] = {&x, &dy, &tc, &ts_, &wide, &sl};
  for (int i = 0; i < 6; i++) tr_tensor_release(ts[i]);
  free(ref);
  free(c.x);
  free(c.dy);
}
END_TEST

/* ---- attention ---- */

typedef struct {
  double *q, *k, *v, *dy; /* q [B,T,H,D], k/v [B,T,KVH,D] contiguous */
  int B, T, H, KVH, D;
} att_ctx;

static void att_ref(att_ctx* c, double* y) {
  double* s = malloc(sizeof(double) * (size_t)c->T);
  double scale = 1.0 / sqrt((double)c->D);
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->H; h++) {
      int kh = h / (c->H / c->KVH);
      for (int t = 0; t < c->T; t++) {
        const double* q = c->q + (((int64_t)b * c->T + t) * c->H + h) * c->D;
        double m = -INFINITY, l = 0;
        for (int j = 0; j <= t; j++) {
          const double* k =
              c->k + (((int64_t)b * c->T + j) * c->KVH + kh) * c->D;
          s[j] = 0;
          for (int d = 0; d < c->D; d++) s[j] += q[d] * k[d];
          s[j] *= scale;
          m = fmax(m, s[j]);
        }
        for (int j = 0; j <= t; j++) l += (s[j] = exp(s[j] - m));
        double* o = y + (((int64_t)b * c->T + t) * c->H + h) * c->D;
        for (int d = 0; d < c->D; d++) o[d] = 0;
        for (int j = 0; j <= t; j++) {
          const double* v =
              c->v + (((int64_t)b * c->T + j) * c->KVH + kh) * c->D;
          for (int d = 0; d < c->D; d++) o[d] += s[j] / l * v[d];
        }
      }
    }
  free(s);
}

static double att_obj(void* p) {
  att_ctx* c = p;
  int64_t n = (int64_t)c->B * c->T * c->H * c->D;
  double* y = malloc(sizeof(double) * (size_t)n);
  att_ref(c, y);
  double s = dot(c->dy, y, n);
  free(y);
  return s;
}

/* fused: q, k, v are column slices of one [B, T, (H + 2 KVH) D] buffer */
static void attention_case(int B, int T, int H, int KVH, int D, int fused) {
  att_ctx c = {.B = B, .T = T, .H = H, .KVH = KVH, .D = D};
  int64_t HD = (int64_t)H * D, KD = (int64_t)KVH * D, W = HD + 2 * KD;
  int64_t nq = (int64_t)B * T * HD, nk = (int64_t)B * T * KD;
  tr_tensor_t buf, dbuf, q = {0}, k = {0}, v = {0}, dq = {0}, dk = {0},
                         dv = {0}, dy, y, lse;
  if (fused) {
    rnd(&buf, NULL, 1.5, 3, (int64_t)B, (int64_t)T, W);
    zeros(&dbuf, 3, (int64_t)B, (int64_t)T, W);
    ck_assert_int_eq(tr_tensor_narrow(&q, &buf, 2, 0, HD), 0);
    ck_assert_int_eq(tr_tensor_narrow(&k, &buf, 2, HD, KD), 0);
    ck_assert_int_eq(tr_tensor_narrow(&v, &buf, 2, HD + KD, KD), 0);
    ck_assert_int_eq(tr_tensor_narrow(&dq, &dbuf, 2, 0, HD), 0);
    ck_assert_int_eq(tr_tensor_narrow(&dk, &dbuf, 2, HD, KD), 0);
    ck_assert_int_eq(tr_tensor_narrow(&dv, &dbuf, 2, HD + KD, KD), 0);
  } else {
    rnd(&q, NULL, 1.5, 3, (int64_t)B, (int64_t)T, HD);
    rnd(&k, NULL, 1.5, 3, (int64_t)B, (int64_t)T, KD);
    rnd(&v, NULL, 1.5, 3, (int64_t)B, (int64_t)T, KD);
    zeros(&dq, 3, (int64_t)B, (int64_t)T, HD);
    zeros(&dk, 3, (int64_t)B, (int64_t)T, KD);
    zeros(&dv, 3, (int64_t)B, (int64_t)T, KD);
  }
  /* contiguous double copies and contiguous views of the gradients */
  c.q = malloc(sizeof(double) * (size_t)nq);
  c.k = malloc(sizeof(double) * (size_t)nk);
  c.v = malloc(sizeof(double) * (size_t)nk);
  for (int64_t i = 0; i < nq; i++) c.q[i] = tr_tensor_get(&q, i);
  for (int64_t i = 0; i < nk; i++) {
    c.k[i] = tr_tensor_get(&k, i);
    c.v[i] = tr_tensor_get(&v, i);
  }
  rnd(&dy, &c.dy, 1.0, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&y, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&lse, 3, (int64_t)B, (int64_t)H, (int64_t)T);
  ck_assert_int_eq(tr_kern_attention_fwd(&y, &lse, &q, &k, &v, H, KVH), 0);
  double* ref = malloc(sizeof(double) * (size_t)nq);
  att_ref(&c, ref);
  check_fwd("attention out", fp(&y), ref, nq);
  /* the backward overwrites its gradients: start them as garbage */
  if (fused) {
    ck_assert_int_eq(tr_tensor_fill(&dbuf, 7.0), 0);
  } else {
    ck_assert_int_eq(tr_tensor_fill(&dq, 7.0), 0);
    ck_assert_int_eq(tr_tensor_fill(&dk, -3.0), 0);
    ck_assert_int_eq(tr_tensor_fill(&dv, 5.0), 0);
  }
  ck_assert_int_eq(
      tr_kern_attention_bwd(&dq, &dk, &dv, &dy, &q, &k, &v, &y, &lse, H, KVH),
      0);
  float* g = malloc(sizeof(float) * (size_t)nq);
  for (int64_t i = 0; i < nq; i++) g[i] = (float)tr_tensor_get(&dq, i);
  check_grad("attention dq", c.q, nq, g, att_obj, &c, 300);
  for (int64_t i = 0; i < nk; i++) g[i] = (float)tr_tensor_get(&dk, i);
  check_grad("attention dk", c.k, nk, g, att_obj, &c, 300);
  for (int64_t i = 0; i < nk; i++) g[i] = (float)tr_tensor_get(&dv, i);
  check_grad("attention dv", c.v, nk, g, att_obj, &c, 300);
  free(g);
  free(ref);
  free(c.q);
  free(c.k);
  free(c.v);
  free(c.dy);
  tr_tensor_t* ts[] = {&q, &k, &v, &dq, &dk, &dv, &dy, &y, &lse};
  for (int i = 0; i < 9; i++) tr_tensor_release(ts[i]);
  if (fused) {
    tr_tensor_release(&buf);
    tr_tensor_release(&dbuf);
  }
}

START_TEST(test_attention_small) { attention_case(2, 7, 2, 2, 4, 0); }
END_TEST
START_TEST(test_attention_gqa_across_tiles) {
  /* T = 70 crosses the 64-row query tile; 4 query heads share 2 kv heads */
  attention_case(2, 70, 4, 2, 4, 0);
}
END_TEST
START_TEST(test_attention_fused_strided) { attention_case(1, 9, 3, 1, 6, 1); }
END_TEST

/* ---- masked attention against explicit [T, T] masks ---- */

/* The mask as torchtitan builds it, written out whole: document ids from
 * the EOS positions (get_document_mask_mod: a token's id counts the EOS
 * tokens before it, so an EOS belongs to the document it ends), then
 * keep[b][i][j] = causal && same document (when eos >= 0) && i - j <
 * window (when window > 0; get_sliding_window_mask_mod). */
static unsigned char* explicit_mask(const int32_t* tok, int B, int T, int eos,
                                    int window) {
  unsigned char* keep = malloc((size_t)B * T * T);
  int* id = malloc(sizeof(int) * (size_t)T);
  for (int b = 0; b < B; b++) {
    int n = 0;
    for (int i = 0; i < T; i++) {
      id[i] = n;
      n += eos >= 0 && tok[(int64_t)b * T + i] == eos;
    }
    for (int i = 0; i < T; i++)
      for (int j = 0; j < T; j++)
        keep[((int64_t)b * T + i) * T + j] =
            j <= i && id[i] == id[j] && (window <= 0 || i - j < window);
  }
  free(id);
  return keep;
}

/* Naive attention in double with a full mask: y, lse and, for dy, the
 * gradients dq, dk, dv (contiguous [B,T,H|KVH,D]). */
static void masked_ref(const att_ctx* c, const unsigned char* keep, double* y,
                       double* lse, double* gq, double* gk, double* gv) {
  int T = c->T, D = c->D;
  double scale = 1.0 / sqrt((double)D);
  double* P = malloc(sizeof(double) * (size_t)T * T);
  int64_t nq = (int64_t)c->B * T * c->H * D;
  int64_t nk = (int64_t)c->B * T * c->KVH * D;
  memset(gq, 0, sizeof(double) * (size_t)nq);
  memset(gk, 0, sizeof(double) * (size_t)nk);
  memset(gv, 0, sizeof(double) * (size_t)nk);
#define QI(b, t, h) ((((int64_t)(b) * T + (t)) * c->H + (h)) * D)
#define KI(b, t, h) ((((int64_t)(b) * T + (t)) * c->KVH + (h)) * D)
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->H; h++) {
      int kh = h / (c->H / c->KVH);
      for (int i = 0; i < T; i++) {
        const unsigned char* km = keep + ((int64_t)b * T + i) * T;
        double m = -INFINITY, l = 0;
        for (int j = 0; j < T; j++) {
          double sc = 0;
          for (int d = 0; d < D; d++)
            sc += c->q[QI(b, i, h) + d] * c->k[KI(b, j, kh) + d];
          P[(int64_t)i * T + j] = km[j] ? sc * scale : -INFINITY;
          if (km[j]) m = fmax(m, sc * scale);
        }
        for (int j = 0; j < T; j++)
          l += (P[(int64_t)i * T + j] =
                    km[j] ? exp(P[(int64_t)i * T + j] - m) : 0.0);
        for (int j = 0; j < T; j++) P[(int64_t)i * T + j] /= l;
        lse[((int64_t)b * c->H + h) * T + i] = m + log(l);
        double* o = y + QI(b, i, h);
        for (int d = 0; d < D; d++) {
          o[d] = 0;
          for (int j = 0; j < T; j++)
            o[d] += P[(int64_t)i * T + j] * c->v[KI(b, j, kh) + d];
        }
      }
      for (int i = 0; i < T; i++) {
        const double* dyi = c->dy + QI(b, i, h);
        double Di = 0;
        for (int d = 0; d < D; d++) Di += dyi[d] * y[QI(b, i, h) + d];
        for (int j = 0; j < T; j++) {
          double p = P[(int64_t)i * T + j];
          if (p == 0) continue;
          double dp = 0;
          for (int d = 0; d < D; d++) dp += dyi[d] * c->v[KI(b, j, kh) + d];
          double ds = p * (dp - Di) * scale;
          for (int d = 0; d < D; d++) {
            gv[KI(b, j, kh) + d] += p * dyi[d];
            gq[QI(b, i, h) + d] += ds * c->k[KI(b, j, kh) + d];
            gk[KI(b, j, kh) + d] += ds * c->q[QI(b, i, h) + d];
          }
        }
      }
    }
#undef QI
#undef KI
  free(P);
}

static double max_diff(const tr_tensor_t* t, const double* ref, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    m = fmax(m, fabs(tr_tensor_get(t, i) - ref[i]));
  return m;
}

/* tokens: eos (>= 0) at a few positions per row (none when eos < 0); the
 * kernel gets doc_start from tr_kern_attn_doc_start and the window; out,
 * lse, dq, dk, dv must match the explicit-mask reference within 1e-6. */
static void masked_case(int B, int T, int H, int KVH, int D, int eos,
                        int window) {
  att_ctx c = {.B = B, .T = T, .H = H, .KVH = KVH, .D = D};
  int64_t HD = (int64_t)H * D, KD = (int64_t)KVH * D;
  int64_t nq = (int64_t)B * T * HD, nk = (int64_t)B * T * KD;
  int32_t* tok = malloc(sizeof(int32_t) * (size_t)B * T);
  for (int64_t i = 0; i < (int64_t)B * T; i++) {
    int t = (int)(i % T), b = (int)(i / T);
    /* documents of 1, 2, 17, 40, 70 ... tokens; an EOS first and last */
    int is_eos = t == 0 || t == 1 || t == 3 || t == 20 + b || t == 60 ||
                 t == 130 || t == T - 1;
    tok[i] = eos >= 0 && is_eos ? eos : 5 + (int)(i % 7);
  }
  unsigned char* keep = explicit_mask(tok, B, T, eos, window);
  tr_tensor_t q, k, v, dy, y, lse, dq, dk, dv, ds = {0};
  rnd(&q, &c.q, 1.5, 3, (int64_t)B, (int64_t)T, HD);
  rnd(&k, &c.k, 1.5, 3, (int64_t)B, (int64_t)T, KD);
  rnd(&v, &c.v, 1.5, 3, (int64_t)B, (int64_t)T, KD);
  rnd(&dy, &c.dy, 1.0, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&y, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&lse, 3, (int64_t)B, (int64_t)H, (int64_t)T);
  zeros(&dq, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&dk, 3, (int64_t)B, (int64_t)T, KD);
  zeros(&dv, 3, (int64_t)B, (int64_t)T, KD);
  if (eos >= 0) {
    int64_t sh[2] = {B, T};
    ck_assert_int_eq(tr_tensor_empty(&ds, TR_I32, TR_DEVICE_CPU, 2, sh), 0);
    tr_kern_attn_doc_start(tr_tensor_data(&ds), NULL, tok, B, T, eos);
    /* doc_start agrees with the explicit mask: the first kept key */
    const int32_t* st = tr_tensor_data(&ds);
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
      int j = 0;
      while (!keep[i * T + j]) j++;
      if (window <= 0) ck_assert_int_eq(st[i], j);
    }
  }
  tr_tensor_t* dsp = eos >= 0 ? &ds : NULL;
  ck_assert_int_eq(tr_kern_attention_masked_fwd(&y, &lse, &q, &k, &v, H, KVH,
                                                dsp, window, 0),
                   0);
  ck_assert_int_eq(tr_tensor_fill(&dq, 7.0), 0);
  ck_assert_int_eq(tr_tensor_fill(&dk, -3.0), 0);
  ck_assert_int_eq(tr_kern_attention_masked_bwd(&dq, &dk, &dv, &dy, &q, &k, &v,
                                                &y, &lse, H, KVH, dsp, window,
                                                0),
                   0);
  double* ry = malloc(sizeof(double) * (size_t)nq);
  double* rl = malloc(sizeof(double) * (size_t)B * H * T);
  double* gq = malloc(sizeof(double) * (size_t)nq);
  double* gk = malloc(sizeof(double) * (size_t)nk);
  double* gv = malloc(sizeof(double) * (size_t)nk);
  masked_ref(&c, keep, ry, rl, gq, gk, gv);
  double e[5] = {max_diff(&y, ry, nq), max_diff(&lse, rl, (int64_t)B * H * T),
                 max_diff(&dq, gq, nq), max_diff(&dk, gk, nk),
                 max_diff(&dv, gv, nk)};
  const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++)
    ck_assert_msg(e[i] <= 1e-6, "masked attention (eos %d, window %d) %s: "
                  "max |kernel - explicit mask| = %.3g > 1e-6",
                  eos, window, names[i], e[i]);
  fprintf(stderr,
          "masked attention B%d T%d H%d KVH%d eos %d window %d: max error "
          "out %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n",
          B, T, H, KVH, eos, window, e[0], e[1], e[2], e[3], e[4]);
  free(ry);
  free(rl);
  free(gq);
  free(gk);
  free(gv);
  free(keep);
  free(tok);
  free(c.q);
  free(c.k);
  free(c.v);
  free(c.dy);
  tr_tensor_t* ts[] = {&q, &k, &v, &dq, &dk, &dv, &dy, &y, &lse, &ds};
  for (int i = 0; i < 10; i++) tr_tensor_release(ts[i]);
}

START_TEST(test_attention_block_causal) {
  /* T = 150: three query tiles, documents crossing tile edges; GQA */
  masked_case(2, 150, 4, 2, 8, 0, 0);
}
END_TEST

START_TEST(test_attention_sliding_window) {
  masked_case(2, 150, 4, 2, 8, -1, 1);  /* itself only */
  masked_case(2, 150, 4, 2, 8, -1, 5);  /* inside one tile */
  masked_case(1, 150, 2, 2, 8, -1, 70); /* wider than a tile */
}
END_TEST

START_TEST(test_attention_block_causal_window) {
  masked_case(2, 150, 4, 1, 8, 3, 9);
  masked_case(1, 150, 2, 2, 8, 3, 100);
}
END_TEST

/* A mask that masks nothing beyond causality (one document, a window as
 * long as the sequence) gives the unmasked kernel's bits; a doc_start past
 * its row is refused. */
START_TEST(test_attention_mask_noop_and_refused) {
  int B = 2, T = 70, H = 2, D = 8;
  int64_t HD = (int64_t)H * D, sh[2] = {B, T};
  tr_tensor_t q, k, v, y0, y1, l0, l1, ds;
  rnd(&q, NULL, 1.5, 3, (int64_t)B, (int64_t)T, HD);
  rnd(&k, NULL, 1.5, 3, (int64_t)B, (int64_t)T, HD);
  rnd(&v, NULL, 1.5, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&y0, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&y1, 3, (int64_t)B, (int64_t)T, HD);
  zeros(&l0, 3, (int64_t)B, (int64_t)H, (int64_t)T);
  zeros(&l1, 3, (int64_t)B, (int64_t)H, (int64_t)T);
  ck_assert_int_eq(tr_tensor_zeros(&ds, TR_I32, TR_DEVICE_CPU, 2, sh), 0);
  ck_assert_int_eq(tr_kern_attention_fwd(&y0, &l0, &q, &k, &v, H, H), 0);
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&y1, &l1, &q, &k, &v, H, H, &ds, T, 0), 0);
  ck_assert_mem_eq(fp(&y0), fp(&y1), sizeof(float) * (size_t)(B * T * HD));
  ck_assert_mem_eq(fp(&l0), fp(&l1), sizeof(float) * (size_t)(B * H * T));
  ((int32_t*)tr_tensor_data(&ds))[T + 3] = 4; /* row 3 of batch 1 */
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&y1, &l1, &q, &k, &v, H, H, &ds, 0, 0),
      TR_EINVAL);
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&y1, &l1, &q, &k, &v, H, H, NULL, -1, 0),
      TR_EINVAL);
  tr_tensor_t* ts[] = {&q, &k, &v, &y0, &y1, &l0, &l1, &ds};
  for (int i = 0; i < 8; i++) tr_tensor_release(ts[i]);
}
END_TEST

/* chunk i (c rows of dim 1) of x, contiguous */
static void chunk_of(tr_tensor_t* dst, const tr_tensor_t* x, int i, int64_t c) {
  tr_tensor_t view;
  ck_assert_int_eq(tr_tensor_narrow(&view, x, 1, i * c, c), 0);
  ck_assert_int_eq(tr_tensor_contiguous(dst, &view), 0);
  tr_tensor_release(&view);
}

/* tr_kern_attn_merge: query chunk 1 against key chunk 0 (q_shift c, all
 * keys seen) and key chunk 1 (causal), merged from an empty accumulator,
 * equals full causal attention's rows of chunk 1; the first merge copies
 * the partial exactly; a partial whose rows saw no key (lse -inf) leaves
 * the accumulator's bits alone. */
START_TEST(test_attn_merge) {
  int B = 2, H = 4, KVH = 2, D = 8;
  int64_t c = 40, T = 2 * c, HD = (int64_t)H * D, KD = (int64_t)KVH * D;
  tr_tensor_t q, k, v, y, l, q1, k0, k1, v0, v1, pa, la, pb, lb, acc, al;
  rnd(&q, NULL, 1.5, 3, (int64_t)B, T, HD);
  rnd(&k, NULL, 1.5, 3, (int64_t)B, T, KD);
  rnd(&v, NULL, 1.5, 3, (int64_t)B, T, KD);
  zeros(&y, 3, (int64_t)B, T, HD);
  zeros(&l, 3, (int64_t)B, (int64_t)H, T);
  ck_assert_int_eq(tr_kern_attention_fwd(&y, &l, &q, &k, &v, H, KVH), 0);
  chunk_of(&q1, &q, 1, c);
  chunk_of(&k0, &k, 0, c);
  chunk_of(&k1, &k, 1, c);
  chunk_of(&v0, &v, 0, c);
  chunk_of(&v1, &v, 1, c);
  zeros(&pa, 3, (int64_t)B, c, HD);
  zeros(&pb, 3, (int64_t)B, c, HD);
  zeros(&acc, 3, (int64_t)B, c, HD);
  zeros(&la, 3, (int64_t)B, (int64_t)H, c);
  zeros(&lb, 3, (int64_t)B, (int64_t)H, c);
  zeros(&al, 3, (int64_t)B, (int64_t)H, c);
  ck_assert_int_eq(tr_tensor_fill(&al, -INFINITY), 0);
  ck_assert_int_eq(tr_kern_attention_masked_fwd(&pa, &la, &q1, &k0, &v0, H, KVH,
                                                NULL, 0, (int)c),
                   0);
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&pb, &lb, &q1, &k1, &v1, H, KVH, NULL, 0, 0),
      0);
  size_t no = sizeof(float) * (size_t)(B * c * HD),
         nl = sizeof(float) * (size_t)(B * H * c);
  ck_assert_int_eq(tr_kern_attn_merge(&acc, &al, &pa, &la, H), 0);
  ck_assert_mem_eq(fp(&acc), fp(&pa), no);
  ck_assert_mem_eq(fp(&al), fp(&la), nl);
  ck_assert_int_eq(tr_kern_attn_merge(&acc, &al, &pb, &lb, H), 0);
  tr_tensor_t yc, lc;
  chunk_of(&yc, &y, 1, c);
  int64_t lsh[3] = {B, H, c}; /* the last c of each (b, h) row of l */
  ck_assert_int_eq(tr_tensor_empty(&lc, TR_F32, TR_DEVICE_CPU, 3, lsh), 0);
  float *L = fp(&l), *Lc = fp(&lc);
  for (int64_t r = 0; r < (int64_t)B * H; r++)
    memcpy(Lc + r * c, L + r * T + c, sizeof(float) * (size_t)c);
  for (int64_t i = 0; i < (int64_t)B * c * HD; i++)
    ck_assert_msg(
        fabsf(fp(&acc)[i] - fp(&yc)[i]) <= 1e-5f * (1 + fabsf(fp(&yc)[i])),
        "out[%lld] %g vs %g", (long long)i, fp(&acc)[i], fp(&yc)[i]);
  for (int64_t i = 0; i < (int64_t)B * H * c; i++)
    ck_assert_msg(fabsf(fp(&al)[i] - Lc[i]) <= 1e-5f * (1 + fabsf(Lc[i])),
                  "lse[%lld] %g vs %g", (long long)i, fp(&al)[i], Lc[i]);
  /* a partial that saw nothing leaves the bits alone */
  float* keep_o = malloc(no);
  float* keep_l = malloc(nl);
  memcpy(keep_o, fp(&acc), no);
  memcpy(keep_l, fp(&al), nl);
  ck_assert_int_eq(tr_tensor_fill(&lb, -INFINITY), 0);
  ck_assert_int_eq(tr_kern_attn_merge(&acc, &al, &pb, &lb, H), 0);
  ck_assert_mem_eq(fp(&acc), keep_o, no);
  ck_assert_mem_eq(fp(&al), keep_l, nl);
  free(keep_o);
  free(keep_l);
  /* pout of another shape is refused */
  ck_assert_int_eq(tr_kern_attn_merge(&acc, &al, &q1, &lb, 2 * H), TR_ESHAPE);
  tr_tensor_t* ts[] = {&q,  &k,  &v,  &y,  &l,  &q1,  &k0, &k1, &v0,
                       &v1, &pa, &la, &pb, &lb, &acc, &al, &yc, &lc};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}
END_TEST

/* tr_kern_attn_doc_start: an EOS closes its document; positions restart
 * after it; each row starts a document at 0. */
START_TEST(test_attn_doc_start) {
  const int32_t tok[2 * 6] = {4, 9, 4, 4, 1, 2, /* row 1 */ 9, 9, 1, 1, 1, 9};
  int32_t ds[12], pos[12];
  tr_kern_attn_doc_start(ds, pos, tok, 2, 6, 9);
  const int32_t want_ds[12] = {0, 0, 2, 2, 2, 2, 0, 1, 2, 2, 2, 2};
  const int32_t want_pos[12] = {0, 1, 0, 1, 2, 3, 0, 0, 0, 1, 2, 3};
  ck_assert_mem_eq(ds, want_ds, sizeof ds);
  ck_assert_mem_eq(pos, want_pos, sizeof pos);
  /* row 0: [0,1] [2..5]; row 1: [0] [1] [2..5] */
  int n = -1, longest = -1;
  tr_kern_attn_doc_count(ds, 2, 6, &n, &longest);
  ck_assert_int_eq(n, 5);
  ck_assert_int_eq(longest, 4);
  tr_kern_attn_doc_count(ds, 1, 2, &n, &longest); /* row 0's first two */
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(longest, 2);
}
END_TEST

/* tr_kern_attention_docs_fwd/bwd: with the documents counted they give
 * the bits of the uncounted call; a count that is not the table's, or
 * that no [B, T] table can have, is refused (TR_EINVAL) */
START_TEST(test_attn_docs_count) {
  enum { B = 2, T = 6, H = 2, D = 4 };
  const int32_t tok[B * T] = {4, 9, 4, 4, 1, 2, 9, 9, 1, 1, 1, 9};
  int64_t sh[3] = {B, T, H * D}, lsh[3] = {B, H, T}, dsh[2] = {B, T};
  tr_tensor_t q, y0, y1, l0, l1, g0[3], g1[3], ds;
  ck_assert_int_eq(tr_tensor_empty(&q, TR_F32, TR_DEVICE_CPU, 3, sh), 0);
  float* qv = tr_tensor_data(&q);
  for (int i = 0; i < B * T * H * D; i++) qv[i] = (float)((i * 37) % 11) / 7;
  ck_assert_int_eq(tr_tensor_empty(&ds, TR_I32, TR_DEVICE_CPU, 2, dsh), 0);
  tr_kern_attn_doc_start(tr_tensor_data(&ds), NULL, tok, B, T, 9);
  int n, longest;
  tr_kern_attn_doc_count(tr_tensor_data(&ds), B, T, &n, &longest);
  tr_tensor_t* outs[] = {&y0,    &y1,    &g0[0], &g0[1],
                         &g0[2], &g1[0], &g1[1], &g1[2]};
  for (int i = 0; i < 8; i++)
    ck_assert_int_eq(tr_tensor_zeros(outs[i], TR_F32, TR_DEVICE_CPU, 3, sh), 0);
  ck_assert_int_eq(tr_tensor_zeros(&l0, TR_F32, TR_DEVICE_CPU, 3, lsh), 0);
  ck_assert_int_eq(tr_tensor_zeros(&l1, TR_F32, TR_DEVICE_CPU, 3, lsh), 0);
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&y0, &l0, &q, &q, &q, H, H, &ds, 0, 0), 0);
  ck_assert_int_eq(tr_kern_attention_docs_fwd(&y1, &l1, &q, &q, &q, H, H, &ds,
                                              n, longest, 0, 0),
                   0);
  ck_assert_mem_eq(tr_tensor_data(&y0), tr_tensor_data(&y1),
                   sizeof(float) * B * T * H * D);
  ck_assert_mem_eq(tr_tensor_data(&l0), tr_tensor_data(&l1),
                   sizeof(float) * B * T * H);
  ck_assert_int_eq(
      tr_kern_attention_masked_bwd(&g0[0], &g0[1], &g0[2], &q, &q, &q, &q, &y0,
                                   &l0, H, H, &ds, 0, 0),
      0);
  ck_assert_int_eq(
      tr_kern_attention_docs_bwd(&g1[0], &g1[1], &g1[2], &q, &q, &q, &q, &y1,
                                 &l1, H, H, &ds, n, longest, 0, 0),
      0);
  for (int i = 0; i < 3; i++)
    ck_assert_mem_eq(tr_tensor_data(&g0[i]), tr_tensor_data(&g1[i]),
                     sizeof(float) * B * T * H * D);
  /* wrong counts: the table's other than given, and impossible ones */
  const int bad[][2] = {{n + 1, longest}, {n, longest - 1}, {1, longest},
                        {n, T + 1},       {B * T + 1, 1},   {n, 0},
                        {-1, 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(tr_kern_attention_docs_fwd(&y1, &l1, &q, &q, &q, H, H, &ds,
                                                bad[i][0], bad[i][1], 0, 0),
                     TR_EINVAL);
    ck_assert_int_eq(
        tr_kern_attention_docs_bwd(&g1[0], &g1[1], &g1[2], &q, &q, &q, &q, &y1,
                                   &l1, H, H, &ds, bad[i][0], bad[i][1], 0, 0),
        TR_EINVAL);
  }
  for (int i = 0; i < 8; i++) tr_tensor_release(outs[i]);
  tr_tensor_release(&q);
  tr_tensor_release(&l0);
  tr_tensor_release(&l1);
  tr_tensor_release(&ds);
}
END_TEST

/* ---- GELU and SwiGLU ---- */

typedef struct {
  double *x, *u, *dy;
  int64_t n;
  int swiglu;
} act_ctx;

static double gelu_d(double x) {
  return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double act_obj(void* p) {
  act_ctx* c = p;
  double s = 0;
  for (int64_t i = 0; i < c->n; i++)
    s += c->dy[i] * (c->swiglu ? c->x[i] / (1 + exp(-c->x[i])) * c->u[i]
                               : gelu_d(c->x[i]));
  return s;
}

START_TEST(test_gelu) {
  act_ctx c = {.n = 40000}; /* > one 16384-element chunk */
  tr_tensor_t x, dy, y, dx;
  rnd(&x, &c.x, 4.0, 1, c.n);
  rnd(&dy, &c.dy, 1.0, 1, c.n);
  zeros(&y, 1, c.n);
  zeros(&dx, 1, c.n);
  ck_assert_int_eq(tr_kern_gelu_fwd(&y, &x), 0);
  double* ref = malloc(sizeof(double) * (size_t)c.n);
  for (int64_t i = 0; i < c.n; i++) ref[i] = gelu_d(c.x[i]);
  check_fwd("gelu out", fp(&y), ref, c.n);
  ck_assert_int_eq(tr_kern_gelu_bwd(&dx, &dy, &x), 0);
  /* elementwise: d/dx_i touches one term; check a spread of coordinates */
  check_grad("gelu dx", c.x, c.n, fp(&dx), act_obj, &c, 400);
  tr_tensor_t* ts[] = {&x, &dy, &y, &dx};
  for (int i = 0; i < 4; i++) tr_tensor_release(ts[i]);
  free(ref);
  free(c.x);
  free(c.dy);
}
END_TEST

/* ---- linear + GELU, fused ---- */

static double gelu_grad_d(double x) {
  double k = sqrt(2 / M_PI), th = tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + th) +
         0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x);
}

/* a copy of t's shape filled with v (NaN: "must be overwritten") */
static void filled(tr_tensor_t* t, const tr_tensor_t* like, float v) {
  ck_assert_int_eq(
      tr_tensor_empty(t, TR_F32, TR_DEVICE_CPU, like->ndim, like->shape), 0);
  for (int64_t i = 0; i < tr_tensor_numel(t); i++) fp(t)[i] = v;
}

static void dup_tensor(tr_tensor_t* t, const tr_tensor_t* src) {
  filled(t, src, 0.0f);
  memcpy(fp(t), fp(src), sizeof(float) * (size_t)tr_tensor_numel(src));
}

static void assert_same_bits(const char* what, const tr_tensor_t* a,
                             const tr_tensor_t* b) {
  int64_t n = tr_tensor_numel(a);
  ck_assert_int_eq(n, tr_tensor_numel(b));
  for (int64_t i = 0; i < n; i++) {
    uint32_t x, y;
    memcpy(&x, fp(a) + i, 4);
    memcpy(&y, fp(b) + i, 4);
    ck_assert_msg(x == y, "%s[%lld]: fused %a (0x%08x) vs unfused %a (0x%08x)",
                  what, (long long)i, (double)fp(a)[i], x, (double)fp(b)[i], y);
  }
}

/* The MLP of a GPT-2 layer, B*T = 303 rows (not a multiple of the GEMM's
 * 96-row or 256-deep tiles nor of GELU's chunk), hidden 300 (not a multiple
 * of the 256-column tile), both with biases and without: the fused entries
 * give the bits of linear_fwd + gelu_fwd and of linear_bwd into a zeroed
 * buffer + gelu_bwd into a zeroed buffer. */
static void linear_gelu_case(tr_gemm_impl_t impl, int with_bias) {
  if (impl == TR_GEMM_BLAS && !tr_kern_cpu_have_blas()) return;
  ck_assert_int_eq(tr_kern_cpu_set_gemm(impl), 0);
  const int64_t B = 3, T = 101, C = 40, H = 300;
  tr_tensor_t x, w1, b1, w2, dy;
  rnd(&x, NULL, 1.0, 3, B, T, C);
  rnd(&w1, NULL, 0.5, 2, H, C);
  rnd(&b1, NULL, 0.5, 1, H);
  rnd(&w2, NULL, 0.2, 2, C, H);
  rnd(&dy, NULL, 1.0, 3, B, T, C);
  for (int64_t i = 0; i < C; i++) fp(&dy)[5 * C + i] = 0.0f; /* a zero row */
  /* forward: fused vs linear_fwd + gelu_fwd */
  tr_tensor_t pre, out, pre_ref, out_ref;
  rnd(&pre, NULL, 1.0, 3, B, T, H);
  filled(&out, &pre, NAN);
  zeros(&pre_ref, 3, B, T, H);
  zeros(&out_ref, 3, B, T, H);
  ck_assert_int_eq(
      tr_kern_linear_gelu_fwd(&out, &pre, &x, &w1, with_bias ? &b1 : NULL), 0);
  ck_assert_int_eq(
      tr_kern_linear_fwd(&pre_ref, &x, &w1, with_bias ? &b1 : NULL), 0);
  ck_assert_int_eq(tr_kern_gelu_fwd(&out_ref, &pre_ref), 0);
  assert_same_bits("linear_gelu_fwd pre", &pre, &pre_ref);
  assert_same_bits("linear_gelu_fwd out", &out, &out_ref);
  /* backward: fused vs linear_bwd into zeros + gelu_bwd into zeros; the
   * parameter gradients start from random values (they accumulate), the
   * fused dinp from NaN (it is overwritten) */
  tr_tensor_t dw, db, dw_ref, db_ref, dfc, dfc_ref, dgelu;
  rnd(&dw, NULL, 1.0, 2, C, H);
  rnd(&db, NULL, 1.0, 1, C);
  dup_tensor(&dw_ref, &dw);
  dup_tensor(&db_ref, &db);
  filled(&dfc, &pre, NAN);
  zeros(&dgelu, 3, B, T, H);
  zeros(&dfc_ref, 3, B, T, H);
  ck_assert_int_eq(tr_kern_linear_dgelu_bwd(&dfc, &dw, with_bias ? &db : NULL,
                                            &dy, &out, &w2, &pre),
                   0);
  ck_assert_int_eq(
      tr_kern_linear_bwd(&dgelu, &dw_ref, with_bias ? &db_ref : NULL, &dy, &out,
                         &w2),
      0);
  ck_assert_int_eq(tr_kern_gelu_bwd(&dfc_ref, &dgelu, &pre), 0);
  assert_same_bits("linear_dgelu_bwd dinp", &dfc, &dfc_ref);
  assert_same_bits("linear_dgelu_bwd dw", &dw, &dw_ref);
  assert_same_bits("linear_dgelu_bwd db", &db, &db_ref);
  /* and not a sequence that happens to agree with itself: dinp is
   * (dout w2) * gelu'(pre), checked in double at a few points */
  for (int64_t n = 0; n < B * T; n += 37)
    for (int64_t h = 0; h < H; h += 29) {
      double g = 0;
      for (int64_t c = 0; c < C; c++)
        g += (double)fp(&dy)[n * C + c] * fp(&w2)[c * H + h];
      double ref = g * gelu_grad_d(fp(&pre)[n * H + h]);
      ck_assert_msg(fabs(fp(&dfc)[n * H + h] - ref) <= 1e-5 * (fabs(ref) + 1),
                    "dinp[%lld, %lld] %.9g vs %.9g", (long long)n, (long long)h,
                    (double)fp(&dfc)[n * H + h], ref);
    }
  /* dinp is overwritten: a second call gives the same dinp */
  ck_assert_int_eq(
      tr_kern_linear_dgelu_bwd(&dfc, NULL, NULL, &dy, &out, &w2, &pre), 0);
  assert_same_bits("linear_dgelu_bwd dinp again", &dfc, &dfc_ref);
  /* shape errors */
  tr_tensor_t bad;
  zeros(&bad, 3, B, T, H + 1);
  ck_assert_int_eq(tr_kern_linear_gelu_fwd(&out, &bad, &x, &w1, NULL),
                   TR_ESHAPE);
  ck_assert_int_eq(
      tr_kern_linear_dgelu_bwd(&dfc, NULL, NULL, &dy, &out, &w2, &bad),
      TR_ESHAPE);
  ck_assert_int_eq(
      tr_kern_linear_dgelu_bwd(&bad, NULL, NULL, &dy, &out, &w2, &pre),
      TR_ESHAPE);
  tr_tensor_t* ts[] = {&x,      &w1,      &b1,      &w2,    &dy, &pre,
                       &out,    &pre_ref, &out_ref, &dw,    &db, &dw_ref,
                       &db_ref, &dfc,     &dfc_ref, &dgelu, &bad};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  tr_kern_cpu_set_gemm(TR_GEMM_AUTO);
}

START_TEST(test_linear_gelu_fused_blocked) {
  linear_gelu_case(TR_GEMM_BLOCKED, 1);
  linear_gelu_case(TR_GEMM_BLOCKED, 0);
}
END_TEST

START_TEST(test_linear_gelu_fused_blas) {
  linear_gelu_case(TR_GEMM_BLAS, 1);
  linear_gelu_case(TR_GEMM_BLAS, 0);
}
END_TEST

START_TEST(test_swiglu) {
  act_ctx c = {.n = 1000, .swiglu = 1};
  tr_tensor_t g, u, dy, y, dg, du;
  rnd(&g, &c.x, 4.0, 1, c.n);
  rnd(&u, &c.u, 2.0, 1, c.n);
  rnd(&dy, &c.dy, 1.0, 1, c.n);
  zeros(&y, 1, c.n);
  zeros(&dg, 1, c.n);
  zeros(&du, 1, c.n);
  ck_assert_int_eq(tr_kern_swiglu_fwd(&y, &g, &u), 0);
  double* ref = malloc(sizeof(double) * (size_t)c.n);
  for (int64_t i = 0; i < c.n; i++)
    ref[i] = c.x[i] / (1 + exp(-c.x[i])) * c.u[i];
  check_fwd("swiglu out", fp(&y), ref, c.n);
  ck_assert_int_eq(tr_kern_swiglu_bwd(&dg, &du, &dy, &g, &u), 0);
  check_grad("swiglu dgate", c.x, c.n, fp(&dg), act_obj, &c, 300);
  check_grad("swiglu dup", c.u, c.n, fp(&du), act_obj, &c, 300);
  /* the overwriting entry: from NaN, the bits of += into zeros; twice,
   * still the same (not doubled) */
  tr_tensor_t dg2, du2;
  filled(&dg2, &dg, NAN);
  filled(&du2, &du, NAN);
  for (int rep = 0; rep < 2; rep++) {
    ck_assert_int_eq(tr_kern_swiglu_bwd_write(&dg2, &du2, &dy, &g, &u), 0);
    assert_same_bits("swiglu_bwd_write dgate", &dg2, &dg);
    assert_same_bits("swiglu_bwd_write dup", &du2, &du);
  }
  tr_tensor_release(&dg2);
  tr_tensor_release(&du2);
  tr_tensor_t* ts[] = {&g, &u, &dy, &y, &dg, &du};
  for (int i = 0; i < 6; i++) tr_tensor_release(ts[i]);
  free(ref);
  free(c.x);
  free(c.u);
  free(c.dy);
}
END_TEST

/* ---- cross-entropy ---- */

typedef struct {
  double* x;
  const int32_t* t;
  int64_t N;
  int V;
  double scale;
} xent_ctx;

static double xent_obj(void* p) { /* scale * sum of non-ignored losses */
  xent_ctx* c = p;
  double s = 0;
  for (int64_t n = 0; n < c->N; n++) {
    if (c->t[n] == TR_IGNORE_INDEX) continue;
    const double* x = c->x + n * c->V;
    double m = -INFINITY, l = 0;
    for (int j = 0; j < c->V; j++) m = fmax(m, x[j]);
    for (int j = 0; j < c->V; j++) l += exp(x[j] - m);
    s += m + log(l) - x[c->t[n]];
  }
  return c->scale * s;
}

START_TEST(test_cross_entropy) {
  int32_t t[6] = {3, TR_IGNORE_INDEX, 0, 29, 7, 3};
  xent_ctx c = {.t = t, .N = 6, .V = 30, .scale = 1.0 / 5};
  tr_tensor_t x, tt, losses, lse;
  rnd(&x, &c.x, 3.0, 2, (int64_t)6, (int64_t)30);
  int64_t n6 = 6;
  ck_assert_int_eq(tr_tensor_wrap(&tt, t, TR_I32, TR_DEVICE_CPU, 1, &n6), 0);
  zeros(&losses, 1, (int64_t)6);
  zeros(&lse, 1, (int64_t)6);
  ck_assert_int_eq(tr_kern_xent_fwd(&losses, &lse, &x, &tt), 0);
  double total = 0;
  for (int n = 0; n < 6; n++) {
    xent_ctx one = c;
    one.x = c.x + n * 30;
    one.t = t + n;
    one.N = 1;
    one.scale = 1;
    double want = xent_obj(&one);
    ck_assert_msg(fabs(fp(&losses)[n] - want) < 1e-5 * (1 + want),
                  "loss[%d] %g vs %g", n, (double)fp(&losses)[n], want);
    total += fp(&losses)[n];
  }
  ck_assert(fp(&losses)[1] == 0.0f); /* ignored */
  ck_assert(fabs(total * c.scale - xent_obj(&c)) < 1e-5);
  ck_assert_int_eq(tr_kern_xent_bwd(&x, &lse, &tt, (float)c.scale), 0);
  for (int j = 0; j < 30; j++) ck_assert(fp(&x)[30 + j] == 0.0f);
  check_grad("xent dlogits", c.x, 6 * 30, fp(&x), xent_obj, &c, 1000);
  /* the fused entry gives the same bits as the two calls, also on padded
   * rows (a column slice of a wider buffer) */
  tr_tensor_t wide, xf, lf, ef;
  zeros(&wide, 2, (int64_t)6, (int64_t)37);
  ck_assert_int_eq(tr_tensor_narrow(&xf, &wide, 1, 0, 30), 0);
  for (int64_t i = 0; i < 6 * 30; i++)
    fp(&wide)[(i / 30) * 37 + i % 30] = (float)c.x[i];
  zeros(&lf, 1, (int64_t)6);
  zeros(&ef, 1, (int64_t)6);
  ck_assert_int_eq(tr_kern_xent_fused(&lf, &ef, &xf, &tt, (float)c.scale), 0);
  ck_assert(memcmp(fp(&lf), fp(&losses), 6 * sizeof(float)) == 0);
  ck_assert(memcmp(fp(&ef), fp(&lse), 6 * sizeof(float)) == 0);
  for (int64_t i = 0; i < 6 * 30; i++)
    ck_assert(fp(&wide)[(i / 30) * 37 + i % 30] == fp(&x)[i]);
  /* a target outside the vocabulary is an error */
  t[2] = 30;
  ck_assert_int_eq(tr_kern_xent_fwd(&losses, &lse, &x, &tt), TR_EINVAL);
  ck_assert_int_eq(tr_kern_xent_fused(&lf, &ef, &xf, &tt, 1.0f), TR_EINVAL);
  tr_tensor_t* ts[] = {&x, &tt, &losses, &lse, &wide, &xf, &lf, &ef};
  for (int i = 0; i < 8; i++) tr_tensor_release(ts[i]);
  free(c.x);
}
END_TEST

/* The vocabulary-parallel cross-entropy over slices of 12, 12 and 6
 * columns, with the reductions done here as the tp seam does them, gives
 * the whole-vocabulary losses and lse (1e-6) and, slice by slice, its
 * dlogits (1e-7); the columns may be padded rows. */
START_TEST(test_cross_entropy_shards) {
  int32_t t[6] = {3, TR_IGNORE_INDEX, 0, 29, 14, 12};
  int64_t n6 = 6, cut[4] = {0, 12, 24, 30};
  tr_tensor_t x, tt, losses, lse, dl;
  double* xd;
  rnd(&x, &xd, 3.0, 2, (int64_t)6, (int64_t)30);
  ck_assert_int_eq(tr_tensor_wrap(&tt, t, TR_I32, TR_DEVICE_CPU, 1, &n6), 0);
  zeros(&losses, 1, n6);
  zeros(&lse, 1, n6);
  zeros(&dl, 2, n6, (int64_t)30);
  ck_assert_int_eq(tr_tensor_copy(&dl, &x), 0);
  ck_assert_int_eq(tr_kern_xent_fused(&losses, &lse, &dl, &tt, 0.25f), 0);
  tr_tensor_t sx[3], mx[3], tg[3], sm[3];
  float gmax[6], gsum[6], gtgt[6];
  for (int r = 0; r < 3; r++) { /* slice r, its rows padded to 16 */
    int64_t w = cut[r + 1] - cut[r];
    tr_tensor_t wide;
    zeros(&wide, 2, n6, (int64_t)16);
    memset(&sx[r], 0, sizeof sx[r]);
    ck_assert_int_eq(tr_tensor_narrow(&sx[r], &wide, 1, 0, w), 0);
    for (int64_t i = 0; i < 6; i++)
      for (int64_t j = 0; j < w; j++)
        fp(&wide)[i * 16 + j] = fp(&x)[i * 30 + cut[r] + j];
    tr_tensor_release(&wide);
    zeros(&mx[r], 1, n6);
    zeros(&tg[r], 1, n6);
    zeros(&sm[r], 1, n6);
    ck_assert_int_eq(
        tr_kern_xent_shard_stats(&mx[r], &tg[r], &sx[r], &tt, cut[r], 30), 0);
  }
  for (int i = 0; i < 6; i++) { /* all-reduce max */
    gmax[i] = fmaxf(fp(&mx[0])[i], fmaxf(fp(&mx[1])[i], fp(&mx[2])[i]));
    gtgt[i] = fp(&tg[0])[i] + fp(&tg[1])[i] + fp(&tg[2])[i];
  }
  for (int r = 0; r < 3; r++) {
    memcpy(fp(&mx[r]), gmax, sizeof gmax);
    ck_assert_int_eq(tr_kern_xent_shard_sumexp(&sm[r], &sx[r], &mx[r]), 0);
  }
  for (int i = 0; i < 6; i++) /* all-reduce sum */
    gsum[i] = fp(&sm[0])[i] + fp(&sm[1])[i] + fp(&sm[2])[i];
  for (int r = 0; r < 3; r++) {
    tr_tensor_t l, e;
    zeros(&l, 1, n6);
    zeros(&e, 1, n6);
    memcpy(fp(&sm[r]), gsum, sizeof gsum);
    memcpy(fp(&tg[r]), gtgt, sizeof gtgt);
    ck_assert_int_eq(
        tr_kern_xent_shard_loss(&l, &e, &mx[r], &sm[r], &tg[r], &tt), 0);
    for (int i = 0; i < 6; i++) {
      ck_assert(fabsf(fp(&l)[i] - fp(&losses)[i]) < 1e-6f);
      ck_assert(fabsf(fp(&e)[i] - fp(&lse)[i]) < 1e-6f);
    }
    ck_assert(fp(&l)[1] == 0.0f); /* ignored */
    ck_assert_int_eq(tr_kern_xent_shard_bwd(&sx[r], &e, &tt, cut[r], 0.25f), 0);
    for (int64_t i = 0; i < 6; i++)
      for (int64_t j = 0; j < cut[r + 1] - cut[r]; j++)
        ck_assert(fabsf(((float*)tr_tensor_data(&sx[r]))[i * 16 + j] -
                        fp(&dl)[i * 30 + cut[r] + j]) < 1e-7f);
    tr_tensor_release(&l);
    tr_tensor_release(&e);
  }
  /* a target outside the vocabulary */
  t[0] = 30;
  ck_assert_int_eq(tr_kern_xent_shard_stats(&mx[0], &tg[0], &sx[0], &tt, 0, 30),
                   TR_EINVAL);
  for (int r = 0; r < 3; r++) {
    tr_tensor_release(&sx[r]);
    tr_tensor_release(&mx[r]);
    tr_tensor_release(&tg[r]);
    tr_tensor_release(&sm[r]);
  }
  tr_tensor_t* ts[] = {&x, &tt, &losses, &lse, &dl};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  free(xd);
}
END_TEST

/* ---- AdamW, norms, elementwise ---- */

/* The step's end on the device (tr_kern_step_tail) is CUDA's: on CPU
 * tensors it refuses with TR_EUNSUPPORTED (the trainer then takes the
 * host path) after checking its arguments, and a wait without a table
 * entry is TR_EUNSUPPORTED too; nothing is updated. */
START_TEST(test_step_tail_cpu) {
  float p[3] = {1, 2, 3}, g[3] = {1, 1, 1}, m[3] = {0}, v[3] = {0};
  int64_t n = 3;
  tr_tensor_t tp, tg, tm, tv;
  tr_tensor_wrap(&tp, p, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&tg, g, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&tm, m, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&tv, v, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_kern_adamw_set_t set = {&tp, &tg, &tm, &tv, NULL, 1};
  const tr_tensor_t* gl[1] = {&tg};
  tr_adamw_args_t a = {.lr = 0.1f,
                       .beta1 = 0.9f,
                       .beta2 = 0.999f,
                       .eps = 1e-8f,
                       .grad_scale = 1.0f,
                       .step = 1};
  ck_assert_int_eq(tr_kern_step_tail(&set, 1, &a, gl, 1, 1.0, NULL),
                   TR_EUNSUPPORTED);
  ck_assert_int_eq(tr_kern_step_tail(&set, 0, &a, gl, 1, 1.0, NULL), TR_EINVAL);
  a.step = 0;
  ck_assert_int_eq(tr_kern_step_tail(&set, 1, &a, gl, 1, 1.0, NULL), TR_EINVAL);
  tr_kern_adamw_set_t bad = set;
  bad.m = NULL;
  a.step = 1;
  ck_assert_int_eq(tr_kern_step_tail(&bad, 1, &a, gl, 1, 1.0, NULL), TR_EINVAL);
  double sq = -1, ls = -1;
  ck_assert_int_eq(tr_kern_step_tail_wait(TR_DEV_CPU, &sq, &ls),
                   TR_EUNSUPPORTED);
  ck_assert(p[0] == 1 && p[1] == 2 && p[2] == 3 && m[0] == 0 && v[0] == 0);
  tr_kern_step_tail_release(TR_DEV_CPU); /* nothing to free: fine */
  tr_tensor_release(&tp);
  tr_tensor_release(&tg);
  tr_tensor_release(&tm);
  tr_tensor_release(&tv);
}
END_TEST

START_TEST(test_adamw_hand_computed) {
  /* p = 1, lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1.
   * step 1, g = 0.5: p = 1 * (1 - 0.01) = 0.99; m = 0.05, v = 0.00025;
   *   m/(1-0.9) = 0.5, sqrt(v/(1-0.999)) = 0.5: p = 0.99 - 0.1 = 0.89.
   * step 2, g = -0.25: p = 0.89 * 0.99 = 0.8811; m = 0.045 - 0.025 = 0.02,
   *   v = 0.00024975 + 0.0000625 = 0.00031225; m/(1-0.81) = 0.1052632,
   *   sqrt(v/(1-0.998001)) = 0.3952252: p = 0.8811 - 0.0266337 = 0.8544663.
   * A zero gradient with m = v = 0 only decays: 2 -> 2 * 0.99 = 1.98. */
  float p[2] = {1.0f, 2.0f}, g[2] = {0.5f, 0.0f}, m[2] = {0, 0}, v[2] = {0, 0};
  tr_tensor_t tp, tg, tm, tv;
  int64_t n = 2;
  tr_tensor_wrap(&tp, p, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&tg, g, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&tm, m, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&tv, v, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_adamw_args_t a = {.lr = 0.1f,
                       .beta1 = 0.9f,
                       .beta2 = 0.999f,
                       .eps = 1e-8f,
                       .weight_decay = 0.1f,
                       .grad_scale = 1.0f,
                       .step = 1};
  ck_assert_int_eq(tr_kern_adamw(&tp, &tg, &tm, &tv, &a), 0);
  ck_assert_msg(fabsf(p[0] - 0.89f) < 1e-6f, "step 1: %.9g", (double)p[0]);
  ck_assert(fabsf(m[0] - 0.05f) < 1e-7f && fabsf(v[0] - 0.00025f) < 1e-8f);
  ck_assert(fabsf(p[1] - 1.98f) < 1e-6f);
  g[0] = -0.25f;
  a.step = 2;
  ck_assert_int_eq(tr_kern_adamw(&tp, &tg, &tm, &tv, &a), 0);
  ck_assert_msg(fabsf(p[0] - 0.8544663f) < 1e-6f, "step 2: %.9g", (double)p[0]);
  /* grad_scale scales the gradient: g = 1.0 scaled by 0.5 acts like 0.5 */
  float p2 = 1.0f, g2 = 1.0f, m2 = 0, v2 = 0;
  n = 1;
  tr_tensor_t a1, a2, a3, a4;
  tr_tensor_wrap(&a1, &p2, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&a2, &g2, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&a3, &m2, TR_F32, TR_DEVICE_CPU, 1, &n);
  tr_tensor_wrap(&a4, &v2, TR_F32, TR_DEVICE_CPU, 1, &n);
  a.step = 1;
  a.grad_scale = 0.5f;
  ck_assert_int_eq(tr_kern_adamw(&a1, &a2, &a3, &a4, &a), 0);
  ck_assert(fabsf(m2 - 0.05f) < 1e-7f && fabsf(p2 - 0.89f) < 1e-6f);
  a.step = 0;
  ck_assert_int_eq(tr_kern_adamw(&a1, &a2, &a3, &a4, &a), TR_EINVAL);
  tr_tensor_t* ts[] = {&tp, &tg, &tm, &tv, &a1, &a2, &a3, &a4};
  for (int i = 0; i < 8; i++) tr_tensor_release(ts[i]);
}
END_TEST

START_TEST(test_grad_norm_and_clip) {
  tr_tensor_t x, y;
  double* xd;
  rnd(&x, &xd, 1.0, 1, (int64_t)200003); /* several 65536 chunks */
  rnd(&y, NULL, 1.0, 1, (int64_t)3);
  fp(&y)[0] = 3.0f;
  fp(&y)[1] = 4.0f;
  fp(&y)[2] = 12.0f;
  double ref = 0, s = 0;
  for (int64_t i = 0; i < 200003; i++) ref += xd[i] * xd[i];
  ck_assert_int_eq(tr_kern_sum_squares(&x, &s), 0);
  ck_assert(fabs(s - ref) <= 1e-12 * ref);
  double s2 = 0;
  ck_assert_int_eq(tr_kern_sum_squares(&y, &s2), 0);
  ck_assert(s2 == 169.0);
  /* clip to max_norm 6.5 of a norm-13 vector: factor ~0.5 */
  double coef = tr_kern_clip_coef(sqrt(s2), 6.5);
  ck_assert(fabs(coef - 6.5 / (13.0 + 1e-6)) < 1e-12);
  ck_assert(tr_kern_clip_coef(1.0, 6.5) == 1.0);
  ck_assert_int_eq(tr_kern_scale(&y, (float)coef), 0);
  ck_assert(fabsf(fp(&y)[2] - 6.0f) < 1e-5f);
  tr_tensor_release(&x);
  tr_tensor_release(&y);
  free(xd);
}
END_TEST

START_TEST(test_add_accumulate_zero) {
  tr_tensor_t a, b, out;
  rnd(&a, NULL, 1.0, 1, (int64_t)50000);
  rnd(&b, NULL, 1.0, 1, (int64_t)50000);
  zeros(&out, 1, (int64_t)50000);
  ck_assert_int_eq(tr_kern_add(&out, &a, &b), 0);
  for (int i = 0; i < 50000; i += 997)
    ck_assert(fp(&out)[i] == fp(&a)[i] + fp(&b)[i]);
  ck_assert_int_eq(tr_kern_accumulate(&out, &a), 0);
  for (int i = 0; i < 50000; i += 997)
    ck_assert(fp(&out)[i] == (fp(&a)[i] + fp(&b)[i]) + fp(&a)[i]);
  ck_assert_int_eq(tr_kern_zero(&out), 0);
  for (int i = 0; i < 50000; i++) ck_assert(fp(&out)[i] == 0.0f);
  tr_tensor_release(&a);
  tr_tensor_release(&b);
  tr_tensor_release(&out);
}
END_TEST

/* ---- determinism across thread counts ---- */

static void run_suite_once(float* outs[4]) {
  rng_state = 42;
  int B = 2, T = 70, H = 4, KVH = 2, D = 8, C = 300;
  tr_tensor_t q, k, v, y, lse, dy, dq, dk, dv, x, w, dw, gb, mean, rstd, lx;
  rnd(&q, NULL, 1, 3, (int64_t)B, (int64_t)T, (int64_t)H * D);
  rnd(&k, NULL, 1, 3, (int64_t)B, (int64_t)T, (int64_t)KVH * D);
  rnd(&v, NULL, 1, 3, (int64_t)B, (int64_t)T, (int64_t)KVH * D);
  rnd(&dy, NULL, 1, 3, (int64_t)B, (int64_t)T, (int64_t)H * D);
  zeros(&y, 3, (int64_t)B, (int64_t)T, (int64_t)H * D);
  zeros(&lse, 1, (int64_t)B * H * T);
  zeros(&dq, 3, (int64_t)B, (int64_t)T, (int64_t)H * D);
  zeros(&dk, 3, (int64_t)B, (int64_t)T, (int64_t)KVH * D);
  zeros(&dv, 3, (int64_t)B, (int64_t)T, (int64_t)KVH * D);
  tr_kern_attention_fwd(&y, &lse, &q, &k, &v, H, KVH);
  tr_kern_attention_bwd(&dq, &dk, &dv, &dy, &q, &k, &v, &y, &lse, H, KVH);
  rnd(&x, NULL, 1, 2, (int64_t)333, (int64_t)C);
  rnd(&w, NULL, 1, 2, (int64_t)257, (int64_t)C);
  zeros(&dw, 2, (int64_t)257, (int64_t)C);
  zeros(&gb, 1, (int64_t)C);
  zeros(&mean, 1, (int64_t)333);
  zeros(&rstd, 1, (int64_t)333);
  zeros(&lx, 2, (int64_t)333, (int64_t)C);
  tr_tensor_t dout;
  rnd(&dout, NULL, 1, 2, (int64_t)333, (int64_t)257);
  tr_kern_linear_bwd(NULL, &dw, NULL, &dout, &x, &w);
  tr_kern_layernorm_fwd(&lx, &mean, &rstd, &x, &gb, NULL, 1e-5f);
  tr_tensor_t gw;
  zeros(&gw, 1, (int64_t)C);
  tr_kern_layernorm_bwd(NULL, &gw, NULL, &x, &x, &gb, &mean, &rstd);
  int64_t sz[4] = {tr_tensor_numel(&dq), tr_tensor_numel(&dk),
                   tr_tensor_numel(&dw), tr_tensor_numel(&gw)};
  tr_tensor_t* src[4] = {&dq, &dk, &dw, &gw};
  for (int i = 0; i < 4; i++) {
    outs[i] = malloc(sizeof(float) * (size_t)sz[i]);
    memcpy(outs[i], fp(src[i]), sizeof(float) * (size_t)sz[i]);
  }
  tr_tensor_t* ts[] = {&q, &k, &v,  &y,  &lse,  &dy,   &dq, &dk,   &dv,
                       &x, &w, &dw, &gb, &mean, &rstd, &lx, &dout, &gw};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}

START_TEST(test_bit_identical_across_thread_counts) {
  float *a[4], *b[4];
  size_t sz[4] = {2 * 70 * 32, 2 * 70 * 16, 257 * 300, 300};
  for (int impl = 1; impl <= 2; impl++) {
    if (impl == TR_GEMM_BLAS && !tr_kern_cpu_have_blas()) continue;
    tr_kern_cpu_set_gemm((tr_gemm_impl_t)impl);
    tr_kern_cpu_set_num_threads(1);
    run_suite_once(a);
    tr_kern_cpu_set_num_threads(3);
    run_suite_once(b);
    for (int i = 0; i < 4; i++) {
      ck_assert_msg(memcmp(a[i], b[i], sz[i] * sizeof(float)) == 0,
                    "output %d differs between 1 and 3 threads (gemm %d)", i,
                    impl);
      free(a[i]);
      free(b[i]);
    }
  }
  tr_kern_cpu_set_gemm(TR_GEMM_AUTO);
  tr_kern_cpu_set_num_threads(0);
}
END_TEST

/* ---- dispatch and the pool ---- */

/* ---- fused residual + norm, overwriting linear backward ---- */

/* N = 111 rows (not a multiple of the 16-row task), C = 70: the fused
 * residual norms give the bits of tr_kern_add then the norm, into a
 * separate sum buffer and in place (resid = a), with and without a bias. */
static void residual_norm_case(int rms, int with_bias) {
  const int64_t B = 3, T = 37, C = 70;
  tr_tensor_t a, b, w, bias;
  rnd(&a, NULL, 2.0, 3, B, T, C);
  rnd(&b, NULL, 1.0, 3, B, T, C);
  rnd(&w, NULL, 1.0, 1, C);
  rnd(&bias, NULL, 0.5, 1, C);
  for (int64_t i = 0; i < C; i++) fp(&a)[4 * C + i] = 3.0f; /* b-only row */
  tr_tensor_t sum_ref, out_ref, mean_ref, rstd_ref;
  zeros(&sum_ref, 3, B, T, C);
  zeros(&out_ref, 3, B, T, C);
  zeros(&mean_ref, 1, B * T);
  zeros(&rstd_ref, 1, B * T);
  ck_assert_int_eq(tr_kern_add(&sum_ref, &a, &b), 0);
  if (rms)
    ck_assert_int_eq(
        tr_kern_rmsnorm_fwd(&out_ref, &rstd_ref, &sum_ref, &w, 1e-5f), 0);
  else
    ck_assert_int_eq(
        tr_kern_layernorm_fwd(&out_ref, &mean_ref, &rstd_ref, &sum_ref, &w,
                              with_bias ? &bias : NULL, 1e-5f),
        0);
  for (int inplace = 0; inplace < 2; inplace++) {
    tr_tensor_t resid, out, mean, rstd;
    if (inplace)
      dup_tensor(&resid, &a);
    else
      filled(&resid, &a, NAN);
    filled(&out, &a, NAN);
    filled(&mean, &mean_ref, NAN);
    filled(&rstd, &rstd_ref, NAN);
    const tr_tensor_t* first = inplace ? &resid : &a;
    if (rms)
      ck_assert_int_eq(tr_kern_residual_rmsnorm_fwd(&resid, &out, &rstd, first,
                                                    &b, &w, 1e-5f),
                       0);
    else
      ck_assert_int_eq(
          tr_kern_residual_layernorm_fwd(&resid, &out, &mean, &rstd, first, &b,
                                         &w, with_bias ? &bias : NULL, 1e-5f),
          0);
    assert_same_bits("residual norm sum", &resid, &sum_ref);
    assert_same_bits("residual norm out", &out, &out_ref);
    assert_same_bits("residual norm rstd", &rstd, &rstd_ref);
    if (!rms) assert_same_bits("residual norm mean", &mean, &mean_ref);
    tr_tensor_t* ts[] = {&resid, &out, &mean, &rstd};
    for (size_t i = 0; i < 4; i++) tr_tensor_release(ts[i]);
  }
  /* the sum is a + b, and the output a normalised row of it (the norm
   * itself is checked against double in test_layernorm / test_rmsnorm) */
  for (int64_t i = 0; i < B * T * C; i += 13)
    ck_assert_float_eq(fp(&sum_ref)[i], fp(&a)[i] + fp(&b)[i]);
  double ss = 0, s1 = 0;
  for (int64_t c = 0; c < C; c++) {
    double n = (fp(&out_ref)[4 * C + c] - (rms         ? 0
                                           : with_bias ? fp(&bias)[c]
                                                       : 0)) /
               fp(&w)[c];
    s1 += n;
    ss += n * n;
  }
  ck_assert_double_eq_tol(ss / C, 1.0, 1e-3);
  if (!rms) ck_assert_double_eq_tol(s1 / C, 0.0, 1e-3);
  /* shape errors name the operand */
  tr_tensor_t bad, o2, r2;
  zeros(&bad, 3, B, T, C + 1);
  zeros(&o2, 3, B, T, C);
  zeros(&r2, 1, B * T);
  if (rms)
    ck_assert_int_eq(
        tr_kern_residual_rmsnorm_fwd(&o2, &o2, &r2, &a, &bad, &w, 1e-5f),
        TR_ESHAPE);
  else
    ck_assert_int_eq(tr_kern_residual_layernorm_fwd(&bad, &o2, &r2, &r2, &a, &b,
                                                    &w, NULL, 1e-5f),
                     TR_ESHAPE);
  tr_tensor_t* ts[] = {&a,        &b,        &w,   &bias, &sum_ref, &out_ref,
                       &mean_ref, &rstd_ref, &bad, &o2,   &r2};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}

START_TEST(test_residual_norms_fused) {
  residual_norm_case(0, 1);
  residual_norm_case(0, 0);
  residual_norm_case(1, 0);
}
END_TEST

/* linear_bwd_write into a NaN-filled dinp gives the bits of linear_bwd into
 * a zeroed one (dw and dbias still accumulate), contiguous and with padded
 * dout rows, with each GEMM behind the CPU table */
static void linear_bwd_write_case(tr_gemm_impl_t impl, int padded) {
  if (impl == TR_GEMM_BLAS && !tr_kern_cpu_have_blas()) return;
  ck_assert_int_eq(tr_kern_cpu_set_gemm(impl), 0);
  const int64_t N = 303, IC = 40, OC = 300, LD = padded ? 320 : OC;
  tr_tensor_t x, w, wide, dy, dw, db, dw_ref, db_ref, dx, dx_ref;
  rnd(&x, NULL, 1.0, 2, N, IC);
  rnd(&w, NULL, 0.5, 2, OC, IC);
  rnd(&wide, NULL, 1.0, 2, N, LD);
  ck_assert_int_eq(tr_tensor_narrow(&dy, &wide, 1, 0, OC), 0);
  rnd(&dw, NULL, 1.0, 2, OC, IC);
  rnd(&db, NULL, 1.0, 1, OC);
  dup_tensor(&dw_ref, &dw);
  dup_tensor(&db_ref, &db);
  filled(&dx, &x, NAN);
  zeros(&dx_ref, 2, N, IC);
  tr_tensor_t* dbias = padded ? NULL : &db; /* contiguous only on CUDA */
  tr_tensor_t* dbias_ref = padded ? NULL : &db_ref;
  ck_assert_int_eq(tr_kern_linear_bwd_write(&dx, &dw, dbias, &dy, &x, &w), 0);
  ck_assert_int_eq(tr_kern_linear_bwd(&dx_ref, &dw_ref, dbias_ref, &dy, &x, &w),
                   0);
  assert_same_bits("linear_bwd_write dinp", &dx, &dx_ref);
  assert_same_bits("linear_bwd_write dw", &dw, &dw_ref);
  assert_same_bits("linear_bwd_write db", &db, &db_ref);
  /* overwritten, not added: a second call leaves the same dinp, while
   * linear_bwd doubles it */
  ck_assert_int_eq(tr_kern_linear_bwd_write(&dx, NULL, NULL, &dy, &x, &w), 0);
  assert_same_bits("linear_bwd_write dinp again", &dx, &dx_ref);
  ck_assert_int_eq(tr_kern_linear_bwd(&dx_ref, NULL, NULL, &dy, &x, &w), 0);
  ck_assert_float_eq(fp(&dx_ref)[7], 2.0f * fp(&dx)[7]);
  ck_assert_float_ne(fp(&dx)[7], 0.0f);
  tr_tensor_t* ts[] = {&x,  &w,      &wide,   &dy, &dw,
                       &db, &dw_ref, &db_ref, &dx, &dx_ref};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  tr_kern_cpu_set_gemm(TR_GEMM_AUTO);
}

START_TEST(test_linear_bwd_write) {
  linear_bwd_write_case(TR_GEMM_BLOCKED, 0);
  linear_bwd_write_case(TR_GEMM_BLOCKED, 1);
  linear_bwd_write_case(TR_GEMM_BLAS, 0);
  linear_bwd_write_case(TR_GEMM_BLAS, 1);
}
END_TEST

/* Batch-strided views (async tensor parallel's chunks): each linear entry
 * on rows [t0, t0 + n) of every sequence of [B, T, *] tensors, in one
 * call, gives the bits of the same entry called once a sequence on those
 * rows and leaves the other rows as they were; a weight gradient over such
 * views and a view with padded rows are refused. */
enum { SB = 3, ST = 7, SN = 3, ST0 = 2, SIC = 12, SOC = 10 };

/* rows [ST0, ST0 + SN) of sequence b of t (b < 0: of every sequence, a
 * batch-strided [SB, SN, W] view) */
static void seq_rows(tr_tensor_t* v, const tr_tensor_t* t, int b) {
  if (b < 0) {
    ck_assert_int_eq(tr_tensor_narrow(v, t, 1, ST0, SN), 0);
    return;
  }
  ck_assert_int_eq(tr_tensor_narrow(v, t, 0, b, 1), 0);
  ck_assert_int_eq(tr_tensor_narrow(v, v, 1, ST0, SN), 0);
}

/* b a copy of a */
static void twin(tr_tensor_t* b, const tr_tensor_t* a) {
  ck_assert_int_eq(tr_tensor_empty(b, a->dtype, a->device, a->ndim, a->shape),
                   0);
  ck_assert_int_eq(tr_tensor_copy(b, a), 0);
}

/* kind's entry on the views of sequence b (-1: all at once) */
static int sliced_call(tr_kern_lin_kind_t kind, int b, tr_tensor_t* out,
                       tr_tensor_t* pre, const tr_tensor_t* x,
                       const tr_tensor_t* dy, const tr_tensor_t* pre_in,
                       const tr_tensor_t* w, const tr_tensor_t* bias) {
  tr_tensor_t vo = {0}, vp = {0}, vx = {0}, vd = {0}, vq = {0};
  seq_rows(&vo, out, b);
  seq_rows(&vp, pre, b);
  seq_rows(&vx, x, b);
  seq_rows(&vd, dy, b);
  seq_rows(&vq, pre_in, b);
  int rc = lk_call(kind, &vo, &vp, &vx, &vd, &vq, w, bias);
  tr_tensor_t* ts[] = {&vo, &vp, &vx, &vd, &vq};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  return rc;
}

static void linear_sliced_case(tr_gemm_impl_t impl) {
  ck_assert_int_eq(tr_kern_cpu_set_gemm(impl), 0);
  tr_tensor_t x = {0}, dy = {0}, pre_in = {0}, w = {0}, bias = {0};
  rnd(&x, NULL, 1.0, 3, (int64_t)SB, (int64_t)ST, (int64_t)SIC);
  rnd(&dy, NULL, 1.0, 3, (int64_t)SB, (int64_t)ST, (int64_t)SOC);
  rnd(&pre_in, NULL, 2.0, 3, (int64_t)SB, (int64_t)ST, (int64_t)SIC);
  rnd(&w, NULL, 0.5, 2, (int64_t)SOC, (int64_t)SIC);
  rnd(&bias, NULL, 0.5, 1, (int64_t)SOC);
  for (int kind = TR_KERN_LIN_FWD; kind <= TR_KERN_LIN_DINP_DGELU; kind++) {
    int dinp = kind >= TR_KERN_LIN_DINP;
    int64_t width = dinp ? SIC : SOC;
    tr_tensor_t out = {0}, pre = {0}, out_ref = {0}, pre_ref = {0},
                before = {0};
    /* the rows outside the chunk (and DINP's old values) are random */
    rnd(&out, NULL, 1.0, 3, (int64_t)SB, (int64_t)ST, width);
    rnd(&pre, NULL, 1.0, 3, (int64_t)SB, (int64_t)ST, width);
    twin(&out_ref, &out);
    twin(&pre_ref, &pre);
    twin(&before, &out);
    ck_assert_int_eq(sliced_call((tr_kern_lin_kind_t)kind, -1, &out, &pre, &x,
                                 &dy, &pre_in, &w, &bias),
                     0);
    for (int b = 0; b < SB; b++)
      ck_assert_int_eq(sliced_call((tr_kern_lin_kind_t)kind, b, &out_ref,
                                   &pre_ref, &x, &dy, &pre_in, &w, &bias),
                       0);
    assert_same_bits("batch-strided linear out", &out, &out_ref);
    assert_same_bits("batch-strided linear pre", &pre, &pre_ref);
    /* the chunk's rows were written, the next row not */
    int64_t in_chunk = (1 * ST + ST0) * width, after = in_chunk + SN * width;
    ck_assert_float_ne(fp(&out)[in_chunk], fp(&before)[in_chunk]);
    ck_assert_float_eq(fp(&out)[after], fp(&before)[after]);
    tr_tensor_t* ts[] = {&out, &pre, &out_ref, &pre_ref, &before};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
      tr_tensor_release(ts[i]);
  }
  /* refused: a weight gradient over the slices, padded rows */
  tr_tensor_t dx = {0}, dw = {0}, vdx = {0}, vdy = {0}, vx = {0}, narrow = {0},
              w2 = {0}, out2 = {0}, vo2 = {0};
  zeros(&dx, 3, (int64_t)SB, (int64_t)ST, (int64_t)SIC);
  zeros(&dw, 2, (int64_t)SOC, (int64_t)SIC);
  seq_rows(&vdx, &dx, -1);
  seq_rows(&vdy, &dy, -1);
  seq_rows(&vx, &x, -1);
  ck_assert_int_eq(tr_kern_linear_bwd(&vdx, &dw, NULL, &vdy, &vx, &w),
                   TR_EINVAL);
  ck_assert_int_eq(tr_tensor_narrow(&narrow, &vx, 2, 0, SIC - 2), 0);
  rnd(&w2, NULL, 0.5, 2, (int64_t)SOC, (int64_t)(SIC - 2));
  zeros(&out2, 3, (int64_t)SB, (int64_t)ST, (int64_t)SOC);
  seq_rows(&vo2, &out2, -1);
  ck_assert_int_eq(tr_kern_linear_fwd(&vo2, &narrow, &w2, NULL), TR_ESHAPE);
  tr_tensor_t* ts[] = {&x,   &dy,  &pre_in, &w,      &bias, &dx,   &dw,
                       &vdx, &vdy, &vx,     &narrow, &w2,   &out2, &vo2};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  tr_kern_cpu_set_gemm(TR_GEMM_AUTO);
}

START_TEST(test_linear_batch_strided) {
  linear_sliced_case(TR_GEMM_BLOCKED);
  linear_sliced_case(TR_GEMM_BLAS);
}
END_TEST

/* A device table registered without the fused entries (NULL): the tensor
 * entries run the unfused sequence on it, with the same bits. The "device"
 * is the CPU table under the cuda label, on host memory. */
START_TEST(test_fused_entries_fall_back) {
  static tr_kern_ops_t plain;
  plain = *tr_kern_ops(TR_DEV_CPU);
  plain.name = "plain";
  plain.residual_layernorm_fwd = NULL;
  plain.residual_rmsnorm_fwd = NULL;
  plain.linear_bwd_write = NULL;
  plain.swiglu_bwd_write = NULL;
  const tr_kern_ops_t* loaded = tr_kern_ops(TR_DEV_CUDA);
  ck_assert_int_eq(tr_kern_register(TR_DEV_CUDA, &plain), 0);
  enum { N = 5, C = 8, OC = 3 };
  static float a[N * C], b[N * C], w[C], wo[OC * C], dy[N * OC];
  static float r1[N * C], o1[N * C], m1[N], s1[N], d1[N * C];
  static float r2[N * C], o2[N * C], m2[N], s2[N];
  for (int i = 0; i < N * C; i++) {
    a[i] = (float)urand();
    b[i] = (float)urand();
    d1[i] = NAN;
  }
  for (int i = 0; i < C; i++) w[i] = 1.0f + 0.1f * (float)i;
  for (int i = 0; i < OC * C; i++) wo[i] = (float)urand();
  for (int i = 0; i < N * OC; i++) dy[i] = (float)urand();
  tr_device_t cuda = {TR_DEV_CUDA, 0};
  int64_t sh[2] = {N, C}, shn = N, shc = C, shw[2] = {OC, C}, shy[2] = {N, OC};
  tr_tensor_t ta, tb, tw, two, tdy, tr1, to1, tm1, ts1, td1;
  ck_assert_int_eq(tr_tensor_wrap(&ta, a, TR_F32, cuda, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&tb, b, TR_F32, cuda, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&tw, w, TR_F32, cuda, 1, &shc), 0);
  ck_assert_int_eq(tr_tensor_wrap(&two, wo, TR_F32, cuda, 2, shw), 0);
  ck_assert_int_eq(tr_tensor_wrap(&tdy, dy, TR_F32, cuda, 2, shy), 0);
  ck_assert_int_eq(tr_tensor_wrap(&tr1, r1, TR_F32, cuda, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&to1, o1, TR_F32, cuda, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&tm1, m1, TR_F32, cuda, 1, &shn), 0);
  ck_assert_int_eq(tr_tensor_wrap(&ts1, s1, TR_F32, cuda, 1, &shn), 0);
  ck_assert_int_eq(tr_tensor_wrap(&td1, d1, TR_F32, cuda, 2, sh), 0);
  ck_assert_int_eq(tr_kern_residual_layernorm_fwd(&tr1, &to1, &tm1, &ts1, &ta,
                                                  &tb, &tw, NULL, 1e-5f),
                   0);
  ck_assert_int_eq(tr_kern_linear_bwd_write(&td1, NULL, NULL, &tdy, &ta, &two),
                   0);
  /* swiglu_bwd_write over NaN: r1 and o1 become dgate and dup */
  static float sg[N * C], su[N * C];
  memcpy(sg, r1, sizeof sg);
  memcpy(su, o1, sizeof su);
  for (int i = 0; i < N * C; i++) r1[i] = o1[i] = NAN;
  tr_tensor_t tsg, tsu;
  ck_assert_int_eq(tr_tensor_wrap(&tsg, sg, TR_F32, cuda, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&tsu, su, TR_F32, cuda, 2, sh), 0);
  ck_assert_int_eq(tr_kern_swiglu_bwd_write(&tr1, &to1, &ta, &tsg, &tsu), 0);
  for (int i = 0; i < N * C; i++) {
    float s = 1.0f / (1.0f + expf(-sg[i]));
    ck_assert_float_eq(r1[i],
                       0.0f + a[i] * su[i] * s * (1.0f + sg[i] * (1.0f - s)));
    ck_assert_float_eq(o1[i], 0.0f + a[i] * sg[i] * s);
  }
  tr_tensor_release(&tsg);
  tr_tensor_release(&tsu);
  /* the fused norm again for the comparison below */
  ck_assert_int_eq(tr_kern_residual_layernorm_fwd(&tr1, &to1, &tm1, &ts1, &ta,
                                                  &tb, &tw, NULL, 1e-5f),
                   0);
  ck_assert_int_eq(tr_kern_register(TR_DEV_CUDA, loaded), 0);
  /* the CPU's own fused entry on the same inputs */
  tr_tensor_t ca, cb, cw, cr, co, cm, cs;
  ck_assert_int_eq(tr_tensor_wrap(&ca, a, TR_F32, TR_DEVICE_CPU, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&cb, b, TR_F32, TR_DEVICE_CPU, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&cw, w, TR_F32, TR_DEVICE_CPU, 1, &shc), 0);
  ck_assert_int_eq(tr_tensor_wrap(&cr, r2, TR_F32, TR_DEVICE_CPU, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&co, o2, TR_F32, TR_DEVICE_CPU, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_wrap(&cm, m2, TR_F32, TR_DEVICE_CPU, 1, &shn), 0);
  ck_assert_int_eq(tr_tensor_wrap(&cs, s2, TR_F32, TR_DEVICE_CPU, 1, &shn), 0);
  ck_assert_int_eq(tr_kern_residual_layernorm_fwd(&cr, &co, &cm, &cs, &ca, &cb,
                                                  &cw, NULL, 1e-5f),
                   0);
  tr_tensor_t* cts[] = {&ca, &cb, &cw, &cr, &co, &cm, &cs};
  for (size_t i = 0; i < sizeof cts / sizeof cts[0]; i++)
    tr_tensor_release(cts[i]);
  ck_assert_int_eq(memcmp(r1, r2, sizeof r1), 0);
  ck_assert_int_eq(memcmp(o1, o2, sizeof o1), 0);
  ck_assert_int_eq(memcmp(m1, m2, sizeof m1), 0);
  ck_assert_int_eq(memcmp(s1, s2, sizeof s1), 0);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      float acc = 0.0f;
      for (int k = 0; k < OC; k++) acc += dy[n * OC + k] * wo[k * C + c];
      ck_assert_float_eq_tol(d1[n * C + c], acc, 1e-5f);
    }
  tr_tensor_t* ts[] = {&ta, &tb, &tw, &two, &tdy, &tr1, &to1, &tm1, &ts1, &td1};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}
END_TEST

static int fake_calls;
static int fake_gelu(float* out, const float* inp, int64_t n) {
  (void)out;
  (void)inp;
  fake_calls += (int)n;
  return 0;
}

START_TEST(test_dispatch_by_device) {
  float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, buf2[8];
  int64_t n = 8;
  tr_tensor_t hc, dc, dc2;
  tr_device_t cuda = {TR_DEV_CUDA, 0};
  ck_assert_int_eq(tr_tensor_wrap(&hc, buf, TR_F32, TR_DEVICE_CPU, 1, &n), 0);
  ck_assert_int_eq(tr_tensor_wrap(&dc, buf, TR_F32, cuda, 1, &n), 0);
  ck_assert_int_eq(tr_tensor_wrap(&dc2, buf2, TR_F32, cuda, 1, &n), 0);
  ck_assert_ptr_nonnull(tr_kern_ops(TR_DEV_CPU));
  ck_assert_str_eq(tr_kern_ops(TR_DEV_CPU)->name, "cpu");
  /* no CUDA table registered: cuda tensors are unsupported (builds with
   * CUDA register kernels/cuda's table at load time: take it out here) */
  const tr_kern_ops_t* loaded = tr_kern_ops(TR_DEV_CUDA);
  ck_assert_int_eq(tr_kern_register(TR_DEV_CUDA, NULL), 0);
  ck_assert_ptr_null(tr_kern_ops(TR_DEV_CUDA));
  ck_assert_int_eq(tr_kern_gelu_fwd(&dc2, &dc), TR_EUNSUPPORTED);
  /* mixed devices are refused before any table is looked at */
  ck_assert_int_eq(tr_kern_gelu_fwd(&dc2, &hc), TR_EDEVICE);
  /* a registered table receives the cuda calls */
  static tr_kern_ops_t fake = {.name = "fake", .gelu_fwd = fake_gelu};
  ck_assert_int_eq(tr_kern_register(TR_DEV_CUDA, &fake), 0);
  fake_calls = 0;
  ck_assert_int_eq(tr_kern_gelu_fwd(&dc2, &dc), 0);
  ck_assert_int_eq(fake_calls, 8);
  ck_assert_int_eq(tr_kern_register(TR_DEV_CUDA, loaded), 0);
  ck_assert_int_eq(tr_kern_register(TR_DEV_CPU, &fake), TR_EINVAL);
  /* dtype checks */
  tr_tensor_t it;
  int32_t ib[8];
  ck_assert_int_eq(tr_tensor_wrap(&it, ib, TR_I32, TR_DEVICE_CPU, 1, &n), 0);
  ck_assert_int_eq(tr_kern_gelu_fwd(&it, &hc), TR_EDTYPE);
  /* the stream slot is per thread */
  tr_kern_set_stream(&n);
  ck_assert_ptr_eq(tr_kern_get_stream(), &n);
  tr_kern_set_stream(NULL);
  tr_tensor_t* ts[] = {&hc, &dc, &dc2, &it};
  for (int i = 0; i < 4; i++) tr_tensor_release(ts[i]);
}
END_TEST

static void count_task(void* ctx, int64_t i) {
  int* hits = ctx;
  __atomic_add_fetch(&hits[i], 1, __ATOMIC_RELAXED);
}

START_TEST(test_thread_pool) {
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(3), 0);
  ck_assert_int_eq(tr_kern_cpu_num_threads(), 3);
  int hits[1000] = {0};
  for (int rep = 0; rep < 50; rep++)
    tr_kern_cpu_parallel(1000, count_task, hits);
  for (int i = 0; i < 1000; i++) ck_assert_int_eq(hits[i], 50);
  /* sized from the environment: TRAINRUN_NUM_THREADS, then OMP_NUM_THREADS */
  setenv("TRAINRUN_NUM_THREADS", "2", 1);
  setenv("OMP_NUM_THREADS", "5", 1);
  tr_param_reset();
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(0), 0);
  ck_assert_int_eq(tr_kern_cpu_num_threads(), 2);
  unsetenv("TRAINRUN_NUM_THREADS");
  tr_param_reset();
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(0), 0);
  ck_assert_int_eq(tr_kern_cpu_num_threads(), 5);
  unsetenv("OMP_NUM_THREADS");
  tr_param_reset();
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(0), 0);
  ck_assert_int_ge(tr_kern_cpu_num_threads(), 1);
  ck_assert_int_eq(tr_kern_cpu_set_num_threads(-1), TR_EINVAL);
}
END_TEST

static Suite* kernels_suite(void) {
  Suite* s = suite_create("kernels");
  TCase* tc = tcase_create("gemm");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_gemm_blocked_vs_reference_and_blas);
  tcase_add_test(tc, test_gemm_impl_switch);
  tcase_add_test(tc, test_linear_grad_blas);
  tcase_add_test(tc, test_linear_grad_blocked);
  tcase_add_test(tc, test_linear_gelu_fused_blocked);
  tcase_add_test(tc, test_linear_gelu_fused_blas);
  tcase_add_test(tc, test_linear_bwd_write);
  tcase_add_test(tc, test_linear_batch_strided);
  suite_add_tcase(s, tc);
  tc = tcase_create("ops");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_embedding);
  tcase_add_test(tc, test_embedding_rows);
  tcase_add_test(tc, test_layernorm);
  tcase_add_test(tc, test_rmsnorm);
  tcase_add_test(tc, test_residual_norms_fused);
  tcase_add_test(tc, test_rope_table_llama31_scaling);
  tcase_add_test(tc, test_rope_forward_and_inverse);
  tcase_add_test(tc, test_attention_small);
  tcase_add_test(tc, test_attention_gqa_across_tiles);
  tcase_add_test(tc, test_attention_fused_strided);
  tcase_add_test(tc, test_attention_block_causal);
  tcase_add_test(tc, test_attention_sliding_window);
  tcase_add_test(tc, test_attention_block_causal_window);
  tcase_add_test(tc, test_attention_mask_noop_and_refused);
  tcase_add_test(tc, test_attn_doc_start);
  tcase_add_test(tc, test_attn_docs_count);
  tcase_add_test(tc, test_attn_merge);
  tcase_add_test(tc, test_gelu);
  tcase_add_test(tc, test_swiglu);
  tcase_add_test(tc, test_cross_entropy);
  tcase_add_test(tc, test_cross_entropy_shards);
  tcase_add_test(tc, test_adamw_hand_computed);
  tcase_add_test(tc, test_step_tail_cpu);
  tcase_add_test(tc, test_grad_norm_and_clip);
  tcase_add_test(tc, test_add_accumulate_zero);
  suite_add_tcase(s, tc);
  tc = tcase_create("runtime");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_bit_identical_across_thread_counts);
  tcase_add_test(tc, test_dispatch_by_device);
  tcase_add_test(tc, test_fused_entries_fall_back);
  tcase_add_test(tc, test_thread_pool);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(kernels_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
