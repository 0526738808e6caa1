/* tests/check_kernels_cuda.c: the CUDA kernels against the CPU kernels.
 *
 * Every op runs on random inputs (never zeros) twice: in fp32 through the
 * tensor API (tr_kern_* on cuda tensors: the "cuda" table) and in bf16
 * through kernels_cuda.h; the CPU kernels on the same values (bf16 inputs
 * are rounded first, so both sides see identical numbers) give the
 * reference. Error measure: ||gpu - ref||_2 / ||ref||_2 over each output.
 * Tolerances, stated once:
 *   fp32 (full fp32 arithmetic, another summation order):  1e-5
 *   bf16 storage, fp32 arithmetic (tensor-core GEMMs):     1e-2
 * Backward outputs start from random values, so the accumulate (+=)
 * contract is checked too. Also: determinism (bit-identical repeats), the
 * fused epilogues against their unfused form, out-of-range tokens and
 * targets, AdamW with the bf16 copy and a device-side gradient scale.
 * Each comparison prints one line to stdout. Also that cuBLASLt is mapped
 * only from the first GEMM on (checked before the GPU question). Exits 77
 * (skipped) when the build has no CUDA or the machine no GPU.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lin_kinds.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/tensor.h"

#ifdef HAVE_CUDA
#include "trainrun/kernels_cuda.h"

#define TOL_F32 1e-5
#define TOL_BF16 1e-2

static const tr_device_t GPU = {TR_DEV_CUDA, 0};

/* ---- helpers ---- */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static double urand(void) { /* uniform in [-1, 1) */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-52 - 1.0;
}

static float rb(float x) { return tr_bf16_to_f32(tr_f32_to_bf16(x)); }

/* host fp32 tensor, random in [-scale, scale] (rounded to bf16 values when
 * dt is TR_BF16, so CPU and GPU see the same numbers) */
static void hrand(tr_tensor_t* t, tr_dtype_t dt, double scale, int ndim,
                  const int64_t* shape) {
  ck_assert_int_eq(tr_tensor_empty(t, TR_F32, TR_DEVICE_CPU, ndim, shape), 0);
  float* p = tr_tensor_data(t);
  for (int64_t i = 0; i < tr_tensor_numel(t); i++) {
    float v = (float)(scale * urand());
    p[i] = dt == TR_BF16 ? rb(v) : v;
  }
}

static float* F(const tr_tensor_t* t) { return tr_tensor_data(t); }

/* device tensor of dtype dt holding the values of host fp32 tensor h */
static void todev(tr_tensor_t* d, const tr_tensor_t* h, tr_dtype_t dt) {
  ck_assert_int_eq(tr_tensor_empty(d, dt, GPU, h->ndim, h->shape), 0);
  if (dt == TR_F32) {
    ck_assert_int_eq(tr_tensor_copy(d, h), 0);
    return;
  }
  tr_tensor_t tmp;
  ck_assert_int_eq(tr_tensor_empty(&tmp, dt, TR_DEVICE_CPU, h->ndim, h->shape),
                   0);
  ck_assert_int_eq(tr_tensor_copy(&tmp, h), 0);
  ck_assert_int_eq(tr_tensor_copy(d, &tmp), 0);
  tr_tensor_release(&tmp);
}

/* host fp32 copy of device tensor d (synchronizes) */
static void tohost(tr_tensor_t* h, const tr_tensor_t* d) {
  tr_tensor_t tmp;
  ck_assert_int_eq(
      tr_tensor_empty(&tmp, d->dtype, TR_DEVICE_CPU, d->ndim, d->shape), 0);
  ck_assert_int_eq(tr_tensor_copy(&tmp, d), 0);
  ck_assert_int_eq(tr_tensor_empty(h, TR_F32, TR_DEVICE_CPU, d->ndim, d->shape),
                   0);
  ck_assert_int_eq(tr_tensor_copy(h, &tmp), 0);
  tr_tensor_release(&tmp);
}

static void hdup(tr_tensor_t* dst, const tr_tensor_t* src) {
  ck_assert_int_eq(
      tr_tensor_empty(dst, TR_F32, TR_DEVICE_CPU, src->ndim, src->shape), 0);
  ck_assert_int_eq(tr_tensor_copy(dst, src), 0);
}

static void* D(const tr_tensor_t* t) { return tr_tensor_data(t); }

/* ||y - ref|| / ||ref|| over n floats; a NaN anywhere gives infinity */
static double relerr(const float* y, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(y[i]) || isinf(y[i])) return INFINITY;
    double d = (double)y[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* compare device tensor d with host reference ref (same numel); prints the
 * figure and asserts it is within tol */
static void expect_close(const char* what, const tr_tensor_t* d,
                         const tr_tensor_t* ref, double tol) {
  tr_tensor_t h;
  tohost(&h, d);
  ck_assert_int_eq(tr_tensor_numel(&h), tr_tensor_numel(ref));
  double e = relerr(F(&h), F(ref), tr_tensor_numel(ref));
  printf("%-44s %-8s rel_err %.3e  tol %.0e  %s\n", what,
         tr_dtype_name(d->dtype), e, tol, e <= tol ? "ok" : "FAIL");
  fflush(stdout);
  tr_tensor_release(&h);
  ck_assert_msg(e <= tol, "%s: relative error %.3e above %.0e", what, e, tol);
}

static void expect_host_close(const char* what, const char* dt, const float* y,
                              const float* ref, int64_t n, double tol) {
  double e = relerr(y, ref, n);
  printf("%-44s %-8s rel_err %.3e  tol %.0e  %s\n", what, dt, e, tol,
         e <= tol ? "ok" : "FAIL");
  fflush(stdout);
  ck_assert_msg(e <= tol, "%s: relative error %.3e above %.0e", what, e, tol);
}

static int bits_equal(const tr_tensor_t* a, const tr_tensor_t* b) {
  tr_tensor_t ha, hb;
  tohost(&ha, a);
  tohost(&hb, b);
  int eq = memcmp(D(&ha), D(&hb), tr_tensor_nbytes(&ha)) == 0;
  tr_tensor_release(&ha);
  tr_tensor_release(&hb);
  return eq;
}

static double tol_of(tr_dtype_t dt) {
  return dt == TR_BF16 ? TOL_BF16 : TOL_F32;
}

#define REL(...)                                               \
  do {                                                         \
    tr_tensor_t* _ts[] = {__VA_ARGS__};                        \
    for (size_t _i = 0; _i < sizeof _ts / sizeof _ts[0]; _i++) \
      tr_tensor_release(_ts[_i]);                              \
  } while (0)

#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* ---- the table ---- */

START_TEST(test_table_registered) {
  const tr_kern_ops_t* ops = tr_kern_ops(TR_DEV_CUDA);
  ck_assert_ptr_nonnull(ops);
  ck_assert_str_eq(ops->name, "cuda");
  ck_assert_ptr_nonnull(ops->attention_bwd);
  ck_assert_ptr_nonnull(ops->zero);
  ck_assert_int_eq(tr_kern_cuda_init(), 0);
}
END_TEST

/* ---- elementwise ---- */

static void run_elementwise(tr_dtype_t dt, int64_t n) {
  tr_tensor_t a, b, y, da, db, dy, r;
  hrand(&a, dt, 1.0, 1, SH(n));
  hrand(&b, dt, 1.0, 1, SH(n));
  hrand(&y, dt, 1.0, 1, SH(n));
  todev(&da, &a, dt);
  todev(&db, &b, dt);
  todev(&dy, &y, dt);
  hdup(&r, &y);
  char what[64];
  /* add */
  ck_assert_int_eq(tr_kern_add(&r, &a, &b), 0);
  if (dt == TR_F32)
    ck_assert_int_eq(tr_kern_add(&dy, &da, &db), 0);
  else
    ck_assert_int_eq(tr_kern_cuda_add(dt, D(&dy), D(&da), D(&db), n, NULL), 0);
  snprintf(what, sizeof what, "add n=%lld", (long long)n);
  expect_close(what, &dy, &r, tol_of(dt));
  /* accumulate: y += a, then scale y *= -0.75 */
  ck_assert_int_eq(tr_kern_accumulate(&r, &a), 0);
  ck_assert_int_eq(tr_kern_scale(&r, -0.75f), 0);
  if (dt == TR_F32) {
    ck_assert_int_eq(tr_kern_accumulate(&dy, &da), 0);
    ck_assert_int_eq(tr_kern_scale(&dy, -0.75f), 0);
  } else {
    ck_assert_int_eq(tr_kern_cuda_accumulate(dt, D(&dy), D(&da), n, NULL), 0);
    ck_assert_int_eq(tr_kern_cuda_scale(dt, D(&dy), -0.75f, n, NULL), 0);
  }
  snprintf(what, sizeof what, "accumulate+scale n=%lld", (long long)n);
  expect_close(what, &dy, &r, tol_of(dt));
  REL(&a, &b, &y, &da, &db, &dy, &r);
}

START_TEST(test_elementwise) {
  run_elementwise(TR_F32, 100003);
  run_elementwise(TR_BF16, 100003);
  run_elementwise(TR_BF16, 4096);
  /* zero through the table */
  tr_tensor_t h, d;
  hrand(&h, TR_F32, 1.0, 1, SH(1001));
  todev(&d, &h, TR_F32);
  ck_assert_int_eq(tr_kern_zero(&d), 0);
  tr_tensor_t back;
  tohost(&back, &d);
  for (int i = 0; i < 1001; i++) ck_assert_float_eq(F(&back)[i], 0.0f);
  REL(&h, &d, &back);
}
END_TEST

START_TEST(test_convert) {
  const int64_t n = 4099;
  tr_tensor_t h, d32, d16, b16, back;
  hrand(&h, TR_F32, 3.0, 1, SH(n));
  todev(&d32, &h, TR_F32);
  ck_assert_int_eq(tr_tensor_empty(&d16, TR_BF16, GPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_tensor_empty(&b16, TR_F32, GPU, 1, SH(n)), 0);
  ck_assert_int_eq(
      tr_kern_cuda_convert(TR_BF16, D(&d16), TR_F32, D(&d32), n, NULL), 0);
  ck_assert_int_eq(
      tr_kern_cuda_convert(TR_F32, D(&b16), TR_BF16, D(&d16), n, NULL), 0);
  tohost(&back, &b16);
  for (int64_t i = 0; i < n; i++)
    ck_assert_float_eq(F(&back)[i], rb(F(&h)[i])); /* round to nearest even */
  printf("%-44s %-8s exact\n", "convert f32 -> bf16 -> f32", "bfloat16");
  REL(&h, &d32, &d16, &b16, &back);
}
END_TEST

/* ---- activations ---- */

static void run_gelu(tr_dtype_t dt, int64_t n) {
  tr_tensor_t x, g, dx, ref_out, dref, dd_x, dd_g, dd_out, dd_dx;
  hrand(&x, dt, 3.0, 1, SH(n));
  hrand(&g, dt, 1.0, 1, SH(n));
  hrand(&dx, dt, 0.5, 1, SH(n));
  hdup(&dref, &dx);
  ck_assert_int_eq(tr_tensor_empty(&ref_out, TR_F32, TR_DEVICE_CPU, 1, SH(n)),
                   0);
  ck_assert_int_eq(tr_kern_gelu_fwd(&ref_out, &x), 0);
  ck_assert_int_eq(tr_kern_gelu_bwd(&dref, &g, &x), 0);
  todev(&dd_x, &x, dt);
  todev(&dd_g, &g, dt);
  todev(&dd_dx, &dx, dt);
  ck_assert_int_eq(tr_tensor_empty(&dd_out, dt, GPU, 1, SH(n)), 0);
  if (dt == TR_F32) {
    ck_assert_int_eq(tr_kern_gelu_fwd(&dd_out, &dd_x), 0);
    ck_assert_int_eq(tr_kern_gelu_bwd(&dd_dx, &dd_g, &dd_x), 0);
  } else {
    ck_assert_int_eq(tr_kern_cuda_gelu_fwd(dt, D(&dd_out), D(&dd_x), n, NULL),
                     0);
    ck_assert_int_eq(
        tr_kern_cuda_gelu_bwd(dt, D(&dd_dx), D(&dd_g), D(&dd_x), n, NULL), 0);
  }
  expect_close("gelu_fwd", &dd_out, &ref_out, tol_of(dt));
  expect_close("gelu_bwd (+=)", &dd_dx, &dref, tol_of(dt));
  REL(&x, &g, &dx, &ref_out, &dref, &dd_x, &dd_g, &dd_out, &dd_dx);
}

static void run_swiglu(tr_dtype_t dt, int64_t n) {
  tr_tensor_t gt, up, go, dg, du, ref, rdg, rdu, d_gt, d_up, d_go, d_dg, d_du,
      d_out;
  hrand(&gt, dt, 4.0, 1, SH(n));
  hrand(&up, dt, 2.0, 1, SH(n));
  hrand(&go, dt, 1.0, 1, SH(n));
  hrand(&dg, dt, 0.5, 1, SH(n));
  hrand(&du, dt, 0.5, 1, SH(n));
  hdup(&rdg, &dg);
  hdup(&rdu, &du);
  ck_assert_int_eq(tr_tensor_empty(&ref, TR_F32, TR_DEVICE_CPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_kern_swiglu_fwd(&ref, &gt, &up), 0);
  ck_assert_int_eq(tr_kern_swiglu_bwd(&rdg, &rdu, &go, &gt, &up), 0);
  todev(&d_gt, &gt, dt);
  todev(&d_up, &up, dt);
  todev(&d_go, &go, dt);
  todev(&d_dg, &dg, dt);
  todev(&d_du, &du, dt);
  ck_assert_int_eq(tr_tensor_empty(&d_out, dt, GPU, 1, SH(n)), 0);
  if (dt == TR_F32) {
    ck_assert_int_eq(tr_kern_swiglu_fwd(&d_out, &d_gt, &d_up), 0);
    ck_assert_int_eq(tr_kern_swiglu_bwd(&d_dg, &d_du, &d_go, &d_gt, &d_up), 0);
  } else {
    ck_assert_int_eq(
        tr_kern_cuda_swiglu_fwd(dt, D(&d_out), D(&d_gt), D(&d_up), n, NULL), 0);
    ck_assert_int_eq(tr_kern_cuda_swiglu_bwd(dt, D(&d_dg), D(&d_du), D(&d_go),
                                             D(&d_gt), D(&d_up), n, NULL),
                     0);
  }
  expect_close("swiglu_fwd", &d_out, &ref, tol_of(dt));
  expect_close("swiglu_bwd dgate (+=)", &d_dg, &rdg, tol_of(dt));
  expect_close("swiglu_bwd dup (+=)", &d_du, &rdu, tol_of(dt));
  REL(&gt, &up, &go, &dg, &du, &ref, &rdg, &rdu, &d_gt, &d_up, &d_go, &d_dg,
      &d_du, &d_out);
}

START_TEST(test_activations) {
  run_gelu(TR_F32, 65537);
  run_gelu(TR_BF16, 65537);
  run_swiglu(TR_F32, 65537);
  run_swiglu(TR_BF16, 65536);
}
END_TEST

/* ---- norms ---- */

/* rms: RMSNorm (no mean, no bias); resid: fused residual add first */
static void run_norm(tr_dtype_t dt, int64_t N, int C, int rms, int resid) {
  char what[96];
  const char* name = rms ? "rmsnorm" : "layernorm";
  tr_tensor_t a, b2, x, w, bias, dout, dinp, dw, db, out, mean, rstd, rdinp,
      rdw, rdb;
  hrand(&a, dt, 2.0, 2, SH(N, C));
  hrand(&b2, dt, 1.0, 2, SH(N, C));
  hrand(&w, dt, 1.0, 1, SH(C));
  hrand(&bias, dt, 0.5, 1, SH(C));
  hrand(&dout, dt, 1.0, 2, SH(N, C));
  hrand(&dinp, dt, 0.5, 2, SH(N, C));
  hrand(&dw, TR_F32, 0.5, 1, SH(C));
  hrand(&db, TR_F32, 0.5, 1, SH(C));
  /* for a fused residual the input is round(a + b2), as the kernel keeps */
  hdup(&x, &a);
  if (resid) {
    ck_assert_int_eq(tr_kern_accumulate(&x, &b2), 0);
    if (dt == TR_BF16)
      for (int64_t i = 0; i < N * C; i++) F(&x)[i] = rb(F(&x)[i]);
  }
  ck_assert_int_eq(tr_tensor_empty(&out, TR_F32, TR_DEVICE_CPU, 2, SH(N, C)),
                   0);
  ck_assert_int_eq(tr_tensor_empty(&mean, TR_F32, TR_DEVICE_CPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&rstd, TR_F32, TR_DEVICE_CPU, 1, SH(N)), 0);
  hdup(&rdinp, &dinp);
  hdup(&rdw, &dw);
  hdup(&rdb, &db);
  if (rms) {
    ck_assert_int_eq(tr_kern_rmsnorm_fwd(&out, &rstd, &x, &w, 1e-5f), 0);
    ck_assert_int_eq(tr_kern_rmsnorm_bwd(&rdinp, &rdw, &dout, &x, &w, &rstd),
                     0);
  } else {
    ck_assert_int_eq(
        tr_kern_layernorm_fwd(&out, &mean, &rstd, &x, &w, &bias, 1e-5f), 0);
    ck_assert_int_eq(
        tr_kern_layernorm_bwd(&rdinp, &rdw, &rdb, &dout, &x, &w, &mean, &rstd),
        0);
  }
  tr_tensor_t d_a, d_b2, d_w, d_bias, d_dout, d_dinp, d_dw, d_db, d_out, d_mean,
      d_rstd, d_res;
  todev(&d_a, &a, dt);
  todev(&d_b2, &b2, dt);
  todev(&d_w, &w, dt);
  todev(&d_bias, &bias, dt);
  todev(&d_dout, &dout, dt);
  todev(&d_dinp, &dinp, dt);
  todev(&d_dw, &dw, TR_F32);
  todev(&d_db, &db, TR_F32);
  ck_assert_int_eq(tr_tensor_empty(&d_out, dt, GPU, 2, SH(N, C)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_res, dt, GPU, 2, SH(N, C)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_mean, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_rstd, TR_F32, GPU, 1, SH(N)), 0);
  if (dt == TR_F32 && !resid) { /* through the table */
    if (rms) {
      ck_assert_int_eq(tr_kern_rmsnorm_fwd(&d_out, &d_rstd, &d_a, &d_w, 1e-5f),
                       0);
      ck_assert_int_eq(
          tr_kern_rmsnorm_bwd(&d_dinp, &d_dw, &d_dout, &d_a, &d_w, &d_rstd), 0);
    } else {
      ck_assert_int_eq(tr_kern_layernorm_fwd(&d_out, &d_mean, &d_rstd, &d_a,
                                             &d_w, &d_bias, 1e-5f),
                       0);
      ck_assert_int_eq(tr_kern_layernorm_bwd(&d_dinp, &d_dw, &d_db, &d_dout,
                                             &d_a, &d_w, &d_mean, &d_rstd),
                       0);
    }
  } else {
    void* xin = D(&d_a);
    if (resid) {
      xin = D(&d_res);
      if (rms)
        ck_assert_int_eq(tr_kern_cuda_residual_rmsnorm_fwd(
                             dt, D(&d_res), D(&d_out), D(&d_rstd), D(&d_a),
                             D(&d_b2), D(&d_w), N, C, 1e-5f, NULL),
                         0);
      else
        ck_assert_int_eq(
            tr_kern_cuda_residual_layernorm_fwd(
                dt, D(&d_res), D(&d_out), D(&d_mean), D(&d_rstd), D(&d_a),
                D(&d_b2), D(&d_w), D(&d_bias), N, C, 1e-5f, NULL),
            0);
    } else if (rms) {
      ck_assert_int_eq(
          tr_kern_cuda_rmsnorm_fwd(dt, D(&d_out), D(&d_rstd), D(&d_a), D(&d_w),
                                   N, C, 1e-5f, NULL),
          0);
    } else {
      ck_assert_int_eq(tr_kern_cuda_layernorm_fwd(
                           dt, D(&d_out), D(&d_mean), D(&d_rstd), D(&d_a),
                           D(&d_w), D(&d_bias), N, C, 1e-5f, NULL),
                       0);
    }
    if (rms)
      ck_assert_int_eq(
          tr_kern_cuda_rmsnorm_bwd(dt, D(&d_dinp), D(&d_dw), D(&d_dout), xin,
                                   D(&d_w), D(&d_rstd), N, C, NULL),
          0);
    else
      ck_assert_int_eq(tr_kern_cuda_layernorm_bwd(
                           dt, D(&d_dinp), D(&d_dw), D(&d_db), D(&d_dout), xin,
                           D(&d_w), D(&d_mean), D(&d_rstd), N, C, NULL),
                       0);
  }
  double tol = tol_of(dt);
  snprintf(what, sizeof what, "%s%s_fwd N=%lld C=%d", resid ? "residual_" : "",
           name, (long long)N, C);
  expect_close(what, &d_out, &out, tol);
  if (resid) {
    snprintf(what, sizeof what, "%s residual sum", name);
    expect_close(what, &d_res, &x, tol);
  }
  snprintf(what, sizeof what, "%s rstd", name);
  expect_close(what, &d_rstd, &rstd, dt == TR_F32 ? TOL_F32 : 1e-3);
  if (!rms)
    expect_close("layernorm mean", &d_mean, &mean,
                 dt == TR_F32 ? TOL_F32 : 1e-3);
  snprintf(what, sizeof what, "%s_bwd dinp (+=) N=%lld C=%d", name,
           (long long)N, C);
  expect_close(what, &d_dinp, &rdinp, tol);
  snprintf(what, sizeof what, "%s_bwd dweight (+=, fp32)", name);
  expect_close(what, &d_dw, &rdw, tol);
  if (!rms) expect_close("layernorm_bwd dbias (+=, fp32)", &d_db, &rdb, tol);
  /* determinism: the weight gradient again from the same start */
  if (!resid) {
    tr_tensor_t d_dw2;
    todev(&d_dw2, &dw, TR_F32);
    if (rms)
      ck_assert_int_eq(
          tr_kern_cuda_rmsnorm_bwd(dt, NULL, D(&d_dw2), D(&d_dout), D(&d_a),
                                   D(&d_w), D(&d_rstd), N, C, NULL),
          0);
    else
      ck_assert_int_eq(tr_kern_cuda_layernorm_bwd(
                           dt, NULL, D(&d_dw2), NULL, D(&d_dout), D(&d_a),
                           D(&d_w), D(&d_mean), D(&d_rstd), N, C, NULL),
                       0);
    ck_assert_msg(bits_equal(&d_dw, &d_dw2),
                  "%s weight gradient differs between runs", name);
    tr_tensor_release(&d_dw2);
  }
  REL(&a, &b2, &x, &w, &bias, &dout, &dinp, &dw, &db, &out, &mean, &rstd,
      &rdinp, &rdw, &rdb, &d_a, &d_b2, &d_w, &d_bias, &d_dout, &d_dinp, &d_dw,
      &d_db, &d_out, &d_mean, &d_rstd, &d_res);
}

START_TEST(test_layernorm) {
  run_norm(TR_F32, 300, 768, 0, 0);
  run_norm(TR_F32, 67, 100, 0, 0); /* C not a multiple of the pack */
  run_norm(TR_BF16, 300, 768, 0, 0);
  run_norm(TR_BF16, 67, 100, 0, 0);
  run_norm(TR_BF16, 1000, 2048, 0, 1);
  run_norm(TR_F32, 128, 256, 0, 1);
}
END_TEST

START_TEST(test_rmsnorm) {
  run_norm(TR_F32, 300, 512, 1, 0);
  run_norm(TR_F32, 45, 60, 1, 0);
  run_norm(TR_BF16, 300, 512, 1, 0);
  run_norm(TR_BF16, 1000, 4096, 1, 1);
}
END_TEST

/* ---- GEMM and linear ---- */

static void run_gemm(tr_dtype_t ab, tr_dtype_t c, int ta, int tb, int64_t M,
                     int64_t N, int64_t K, float alpha, float beta) {
  tr_tensor_t A, B, C0, R, dA, dB, dC;
  hrand(&A, ab, 1.0, 2, ta ? SH(K, M) : SH(M, K));
  hrand(&B, ab, 1.0, 2, tb ? SH(N, K) : SH(K, N));
  hrand(&C0, c, 1.0, 2, SH(M, N));
  hdup(&R, &C0);
  ck_assert_int_eq(tr_kern_gemm(&R, &A, ta, &B, tb, alpha, beta), 0);
  todev(&dA, &A, ab);
  todev(&dB, &B, ab);
  todev(&dC, &C0, c);
  if (ab == TR_F32 && c == TR_F32) {
    ck_assert_int_eq(tr_kern_gemm(&dC, &dA, ta, &dB, tb, alpha, beta), 0);
  } else {
    tr_cuda_gemm_t g;
    memset(&g, 0, sizeof g);
    g.transa = ta;
    g.transb = tb;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = D(&dA);
    g.lda = ta ? M : K;
    g.B = D(&dB);
    g.ldb = tb ? K : N;
    g.C = D(&dC);
    g.ldc = N;
    g.ab_type = ab;
    g.c_type = c;
    g.alpha = alpha;
    g.beta = beta;
    ck_assert_int_eq(tr_kern_cuda_gemm(&g, NULL), 0);
  }
  char what[96];
  snprintf(what, sizeof what, "gemm %s%s %lldx%lldx%lld b=%g -> %s",
           ta ? "T" : "N", tb ? "T" : "N", (long long)M, (long long)N,
           (long long)K, beta, tr_dtype_name(c));
  expect_close(what, &dC, &R, ab == TR_BF16 ? TOL_BF16 : TOL_F32);
  REL(&A, &B, &C0, &R, &dA, &dB, &dC);
}

START_TEST(test_gemm) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      run_gemm(TR_F32, TR_F32, ta, tb, 96, 80, 64, 1.0f, 0.0f);
      run_gemm(TR_F32, TR_F32, ta, tb, 37, 53, 29, 0.5f, 1.0f);
      run_gemm(TR_BF16, TR_BF16, ta, tb, 256, 192, 320, 1.0f, 0.0f);
      run_gemm(TR_BF16, TR_F32, ta, tb, 128, 96, 512, 1.0f, 1.0f);
    }
  run_gemm(TR_BF16, TR_BF16, 0, 0, 33, 17, 9, 1.0f, 0.5f);
}
END_TEST

/* Whether this process maps a file whose path contains name. */
static int maps_have(const char* name) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  if (!f) return -1;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, name) != NULL;
  fclose(f);
  return found;
}

/* cuBLASLt is loaded by the first GEMM (main checks that it was not
 * mapped before): after one, the library is there. */
START_TEST(test_cublaslt_loaded_by_gemm) {
  run_gemm(TR_F32, TR_F32, 0, 1, 24, 16, 8, 1.0f, 0.0f);
  ck_assert_int_eq(maps_have("libcublasLt.so"), 1);
}
END_TEST

/* A linear layer's host inputs (x, w, bv, dout; dinp, dw, db: what the
 * backward adds to) and the CPU reference (out; rdinp, rdw, rdb: dinp, dw
 * and db after the backward's +=) */
typedef struct {
  tr_tensor_t x, w, bv, dout, dinp, dw, db, out, rdinp, rdw, rdb;
} lin_ref_t;

static void lin_ref(lin_ref_t* r, tr_dtype_t dt, int64_t N, int IC, int OC,
                    int bias) {
  hrand(&r->x, dt, 1.0, 2, SH(N, IC));
  hrand(&r->w, dt, 0.2, 2, SH(OC, IC));
  hrand(&r->bv, dt, 0.5, 1, SH(OC));
  hrand(&r->dout, dt, 1.0, 2, SH(N, OC));
  hrand(&r->dinp, dt, 0.5, 2, SH(N, IC));
  hrand(&r->dw, TR_F32, 0.5, 2, SH(OC, IC));
  hrand(&r->db, TR_F32, 0.5, 1, SH(OC));
  hdup(&r->rdinp, &r->dinp);
  hdup(&r->rdw, &r->dw);
  hdup(&r->rdb, &r->db);
  ck_assert_int_eq(
      tr_tensor_empty(&r->out, TR_F32, TR_DEVICE_CPU, 2, SH(N, OC)), 0);
  ck_assert_int_eq(
      tr_kern_linear_fwd(&r->out, &r->x, &r->w, bias ? &r->bv : NULL), 0);
  ck_assert_int_eq(tr_kern_linear_bwd(&r->rdinp, &r->rdw, bias ? &r->rdb : NULL,
                                      &r->dout, &r->x, &r->w),
                   0);
}

static void lin_ref_release(lin_ref_t* r) {
  REL(&r->x, &r->w, &r->bv, &r->dout, &r->dinp, &r->dw, &r->db, &r->out,
      &r->rdinp, &r->rdw, &r->rdb);
}

/* linear forward/backward; gelu: GELU fused after the forward GEMM (pre
 * kept) and, in the backward, fused into the GEMM of the layer that
 * consumes the GELU's output */
static void run_linear(tr_dtype_t dt, int64_t N, int IC, int OC, int bias) {
  char what[96];
  lin_ref_t r;
  lin_ref(&r, dt, N, IC, OC, bias);
  tr_tensor_t d_x, d_w, d_b, d_dout, d_dinp, d_dw, d_db, d_out;
  todev(&d_x, &r.x, dt);
  todev(&d_w, &r.w, dt);
  todev(&d_b, &r.bv, dt);
  todev(&d_dout, &r.dout, dt);
  todev(&d_dinp, &r.dinp, dt);
  todev(&d_dw, &r.dw, TR_F32);
  todev(&d_db, &r.db, TR_F32);
  ck_assert_int_eq(tr_tensor_empty(&d_out, dt, GPU, 2, SH(N, OC)), 0);
  if (dt == TR_F32) {
    ck_assert_int_eq(tr_kern_linear_fwd(&d_out, &d_x, &d_w, bias ? &d_b : NULL),
                     0);
    ck_assert_int_eq(tr_kern_linear_bwd(&d_dinp, &d_dw, bias ? &d_db : NULL,
                                        &d_dout, &d_x, &d_w),
                     0);
  } else {
    ck_assert_int_eq(
        tr_kern_cuda_linear_fwd(dt, D(&d_out), NULL, D(&d_x), D(&d_w),
                                bias ? D(&d_b) : NULL, N, IC, OC, 0, NULL),
        0);
    ck_assert_int_eq(tr_kern_cuda_linear_bwd(
                         dt, D(&d_dinp), D(&d_dw), bias ? D(&d_db) : NULL,
                         D(&d_dout), D(&d_x), D(&d_w), NULL, N, IC, OC, NULL),
                     0);
  }
  double tol = tol_of(dt);
  snprintf(what, sizeof what, "linear_fwd%s %lldx%d->%d", bias ? "+bias" : "",
           (long long)N, IC, OC);
  expect_close(what, &d_out, &r.out, tol);
  expect_close("linear_bwd dinp (+=)", &d_dinp, &r.rdinp, tol);
  expect_close("linear_bwd dweight (+=, fp32)", &d_dw, &r.rdw, tol);
  if (bias) expect_close("linear_bwd dbias (+=, fp32)", &d_db, &r.rdb, tol);
  lin_ref_release(&r);
  REL(&d_x, &d_w, &d_b, &d_dout, &d_dinp, &d_dw, &d_db, &d_out);
}

/* GEMM algorithms timed at first use (TRAINRUN_GEMM_TUNE): the candidates
 * run before the real GEMM, on C itself where beta is 0 and on a scratch
 * room where the GEMM adds to C (the weight and input gradients here), so
 * every call's result is the reference's. tr_kern_cuda_gemm_tune_apply
 * right after the first calls (the timings not done yet) changes nothing
 * and leaves no error behind; after a sync it switches the three plans
 * (forward, input and weight gradients) to their fastest, which then
 * stay: the last two calls give the same bits. */
START_TEST(test_gemm_tune) {
  const int64_t N = 1024;
  const int IC = 768, OC = 1280;
  tr_kern_cuda_set_gemm_tune(8);
  lin_ref_t r;
  lin_ref(&r, TR_BF16, N, IC, OC, 1);
  tr_tensor_t d_x, d_w, d_b, d_dout, d_out[4], d_dinp[4], d_dw[4], d_db[4];
  todev(&d_x, &r.x, TR_BF16);
  todev(&d_w, &r.w, TR_BF16);
  todev(&d_b, &r.bv, TR_BF16);
  todev(&d_dout, &r.dout, TR_BF16);
  for (int rep = 0; rep < 4; rep++) {
    todev(&d_dinp[rep], &r.dinp, TR_BF16);
    todev(&d_dw[rep], &r.dw, TR_F32);
    todev(&d_db[rep], &r.db, TR_F32);
    ck_assert_int_eq(tr_tensor_empty(&d_out[rep], TR_BF16, GPU, 2, SH(N, OC)),
                     0);
  }
  for (int rep = 0; rep < 4; rep++) {
    if (rep == 2) { /* the timings have run: switch to the fastest */
      ck_assert_int_eq(tr_cuda_synchronize(), 0);
      tr_kern_cuda_gemm_tune_apply();
    }
    ck_assert_int_eq(
        tr_kern_cuda_linear_fwd(TR_BF16, D(&d_out[rep]), NULL, D(&d_x),
                                D(&d_w), D(&d_b), N, IC, OC, 0, NULL),
        0);
    ck_assert_int_eq(
        tr_kern_cuda_linear_bwd(TR_BF16, D(&d_dinp[rep]), D(&d_dw[rep]),
                                D(&d_db[rep]), D(&d_dout), D(&d_x), D(&d_w),
                                NULL, N, IC, OC, NULL),
        0);
    if (rep == 0) /* before the timings are done: nothing to switch */
      tr_kern_cuda_gemm_tune_apply();
  }
  /* no error left behind: the runtime's last error is clear */
  ck_assert_int_eq(tr_cuda_synchronize(), 0);
  for (int rep = 0; rep < 4; rep++) {
    char what[96];
    snprintf(what, sizeof what, "tuned linear_fwd+bias, call %d", rep + 1);
    expect_close(what, &d_out[rep], &r.out, TOL_BF16);
    snprintf(what, sizeof what, "tuned linear_bwd dinp (+=), call %d", rep + 1);
    expect_close(what, &d_dinp[rep], &r.rdinp, TOL_BF16);
    snprintf(what, sizeof what, "tuned linear_bwd dweight (+=), call %d",
             rep + 1);
    expect_close(what, &d_dw[rep], &r.rdw, TOL_BF16);
    snprintf(what, sizeof what, "tuned linear_bwd dbias (+=), call %d",
             rep + 1);
    expect_close(what, &d_db[rep], &r.rdb, TOL_BF16);
  }
  ck_assert_msg(bits_equal(&d_out[2], &d_out[3]) &&
                    bits_equal(&d_dinp[2], &d_dinp[3]) &&
                    bits_equal(&d_dw[2], &d_dw[3]),
                "tuned GEMMs: the pick changed between two applies");
  int64_t timed = -1, changed = -1;
  tr_kern_cuda_gemm_tune_stats(&timed, &changed);
  printf("GEMM plans timed %lld, another candidate won %lld\n",
         (long long)timed, (long long)changed);
  ck_assert_msg(timed >= 3,
                "%lld GEMM plans had their candidates timed, not the 3 "
                "(forward, input and weight gradients)",
                (long long)timed);
  lin_ref_release(&r);
  REL(&d_x, &d_w, &d_b, &d_dout);
  for (int rep = 0; rep < 4; rep++)
    REL(&d_out[rep], &d_dinp[rep], &d_dw[rep], &d_db[rep]);
}
END_TEST

START_TEST(test_linear) {
  run_linear(TR_F32, 200, 96, 160, 1);
  run_linear(TR_F32, 77, 33, 45, 0);
  run_linear(TR_BF16, 512, 256, 384, 1);
  run_linear(TR_BF16, 300, 128, 64, 0);
}
END_TEST

/* fc (GELU fused, pre kept) then proj whose backward fuses the GELU's */
static void run_mlp_gelu(tr_dtype_t dt) {
  const int64_t N = 256;
  const int C = 128, H4 = 512;
  tr_tensor_t x, w1, b1, w2, dy, rpre, ract, rdact, rdpre;
  hrand(&x, dt, 1.0, 2, SH(N, C));
  hrand(&w1, dt, 0.2, 2, SH(H4, C));
  hrand(&b1, dt, 0.5, 1, SH(H4));
  hrand(&w2, dt, 0.1, 2, SH(C, H4));
  hrand(&dy, dt, 1.0, 2, SH(N, C));
  /* reference: pre = x w1^T + b1 ; act = gelu(pre) ; dact = dy w2 ;
   * dpre = dact * gelu'(pre) */
  ck_assert_int_eq(tr_tensor_empty(&rpre, TR_F32, TR_DEVICE_CPU, 2, SH(N, H4)),
                   0);
  ck_assert_int_eq(tr_tensor_empty(&ract, TR_F32, TR_DEVICE_CPU, 2, SH(N, H4)),
                   0);
  ck_assert_int_eq(tr_tensor_zeros(&rdact, TR_F32, TR_DEVICE_CPU, 2, SH(N, H4)),
                   0);
  ck_assert_int_eq(tr_tensor_zeros(&rdpre, TR_F32, TR_DEVICE_CPU, 2, SH(N, H4)),
                   0);
  ck_assert_int_eq(tr_kern_linear_fwd(&rpre, &x, &w1, &b1), 0);
  if (dt == TR_BF16) /* the kernel keeps pre in bf16 */
    for (int64_t i = 0; i < N * H4; i++) F(&rpre)[i] = rb(F(&rpre)[i]);
  ck_assert_int_eq(tr_kern_gelu_fwd(&ract, &rpre), 0);
  ck_assert_int_eq(tr_kern_linear_bwd(&rdact, NULL, NULL, &dy, &ract, &w2), 0);
  ck_assert_int_eq(tr_kern_gelu_bwd(&rdpre, &rdact, &rpre), 0);
  tr_tensor_t d_x, d_w1, d_b1, d_w2, d_dy, d_pre, d_act, d_dpre;
  todev(&d_x, &x, dt);
  todev(&d_w1, &w1, dt);
  todev(&d_b1, &b1, dt);
  todev(&d_w2, &w2, dt);
  todev(&d_dy, &dy, dt);
  ck_assert_int_eq(tr_tensor_empty(&d_pre, dt, GPU, 2, SH(N, H4)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_act, dt, GPU, 2, SH(N, H4)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_dpre, dt, GPU, 2, SH(N, H4)), 0);
  ck_assert_int_eq(
      tr_kern_cuda_linear_fwd(dt, D(&d_act), D(&d_pre), D(&d_x), D(&d_w1),
                              D(&d_b1), N, C, H4, 1, NULL),
      0);
  ck_assert_int_eq(
      tr_kern_cuda_linear_bwd(dt, D(&d_dpre), NULL, NULL, D(&d_dy), D(&d_act),
                              D(&d_w2), D(&d_pre), N, H4, C, NULL),
      0);
  double tol = tol_of(dt);
  expect_close("linear_fwd + fused gelu: pre", &d_pre, &rpre, tol);
  expect_close("linear_fwd + fused gelu: out", &d_act, &ract, tol);
  expect_close("linear_bwd + fused dgelu: dpre", &d_dpre, &rdpre, tol);
  REL(&x, &w1, &b1, &w2, &dy, &rpre, &ract, &rdact, &rdpre, &d_x, &d_w1, &d_b1,
      &d_w2, &d_dy, &d_pre, &d_act, &d_dpre);
}

START_TEST(test_mlp_gelu_epilogues) {
  run_mlp_gelu(TR_F32);
  run_mlp_gelu(TR_BF16);
}
END_TEST

/* the fused table entries through the tensor API (tr_kern_linear_gelu_fwd,
 * tr_kern_linear_dgelu_bwd; bf16 tensors pick the bf16 table) against the
 * CPU's. The backward's reference runs on the GPU's own pre and GELU output
 * (bf16 values for bf16), so both sides see the same inputs. */
static void run_linear_gelu_table(tr_dtype_t dt, int64_t N, int C, int H4,
                                  int bias) {
  char what[96];
  tr_tensor_t x, w1, b1, w2, dy, pre, act, dinp, dw, db, hpre, hact;
  hrand(&x, dt, 1.0, 2, SH(N, C));
  hrand(&w1, dt, 0.2, 2, SH(H4, C));
  hrand(&b1, dt, 0.5, 1, SH(H4));
  hrand(&w2, dt, 0.1, 2, SH(C, H4));
  hrand(&dy, dt, 1.0, 2, SH(N, C));
  hrand(&dinp, dt, 1.0, 2, SH(N, H4));   /* overwritten */
  hrand(&dw, TR_F32, 0.5, 2, SH(C, H4)); /* += */
  hrand(&db, TR_F32, 0.5, 1, SH(C));     /* += */
  ck_assert_int_eq(tr_tensor_empty(&pre, TR_F32, TR_DEVICE_CPU, 2, SH(N, H4)),
                   0);
  ck_assert_int_eq(tr_tensor_empty(&act, TR_F32, TR_DEVICE_CPU, 2, SH(N, H4)),
                   0);
  ck_assert_int_eq(
      tr_kern_linear_gelu_fwd(&act, &pre, &x, &w1, bias ? &b1 : NULL), 0);
  tr_tensor_t d_x, d_w1, d_b1, d_w2, d_dy, d_pre, d_act, d_dinp, d_dinp2, d_dw,
      d_db;
  todev(&d_x, &x, dt);
  todev(&d_w1, &w1, dt);
  todev(&d_b1, &b1, dt);
  todev(&d_w2, &w2, dt);
  todev(&d_dy, &dy, dt);
  todev(&d_dinp, &dinp, dt);
  todev(&d_dw, &dw, TR_F32);
  todev(&d_db, &db, TR_F32);
  ck_assert_int_eq(tr_tensor_empty(&d_pre, dt, GPU, 2, SH(N, H4)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_act, dt, GPU, 2, SH(N, H4)), 0);
  ck_assert_int_eq(
      tr_kern_linear_gelu_fwd(&d_act, &d_pre, &d_x, &d_w1, bias ? &d_b1 : NULL),
      0);
  double tol = tol_of(dt);
  snprintf(what, sizeof what, "linear_gelu_fwd%s %lldx%d->%d: pre",
           bias ? "+bias" : "", (long long)N, C, H4);
  expect_close(what, &d_pre, &pre, tol);
  snprintf(what, sizeof what, "linear_gelu_fwd%s %lldx%d->%d: out",
           bias ? "+bias" : "", (long long)N, C, H4);
  expect_close(what, &d_act, &act, tol);
  /* backward on the GPU's pre and act */
  tohost(&hpre, &d_pre);
  tohost(&hact, &d_act);
  /* twice: the parameter gradients get two increments, an overwrite
   * would leave one; dinp is the same after both */
  for (int rep = 0; rep < 2; rep++) {
    ck_assert_int_eq(tr_kern_linear_dgelu_bwd(&dinp, &dw, bias ? &db : NULL,
                                              &dy, &hact, &w2, &hpre),
                     0);
    ck_assert_int_eq(
        tr_kern_linear_dgelu_bwd(&d_dinp, &d_dw, bias ? &d_db : NULL, &d_dy,
                                 &d_act, &d_w2, &d_pre),
        0);
  }
  expect_close("linear_dgelu_bwd dinp (overwritten)", &d_dinp, &dinp, tol);
  expect_close("linear_dgelu_bwd dweight (+= twice, fp32)", &d_dw, &dw, tol);
  if (bias)
    expect_close("linear_dgelu_bwd dbias (+= twice, fp32)", &d_db, &db, tol);
  /* dinp is overwritten: from other old contents (zeros rather than
   * random values), the same bits */
  ck_assert_int_eq(tr_tensor_zeros(&d_dinp2, dt, GPU, 2, SH(N, H4)), 0);
  ck_assert_int_eq(tr_kern_linear_dgelu_bwd(&d_dinp2, NULL, NULL, &d_dy, &d_act,
                                            &d_w2, &d_pre),
                   0);
  ck_assert_msg(bits_equal(&d_dinp, &d_dinp2),
                "linear_dgelu_bwd: dinp depends on its old contents");
  /* deterministic parameter gradients: two runs from zeros, same bits */
  tr_tensor_t e_dw[2], e_db[2];
  for (int rep = 0; rep < 2; rep++) {
    ck_assert_int_eq(tr_tensor_zeros(&e_dw[rep], TR_F32, GPU, 2, SH(C, H4)), 0);
    ck_assert_int_eq(tr_tensor_zeros(&e_db[rep], TR_F32, GPU, 1, SH(C)), 0);
    ck_assert_int_eq(tr_kern_linear_dgelu_bwd(&d_dinp2, &e_dw[rep], &e_db[rep],
                                              &d_dy, &d_act, &d_w2, &d_pre),
                     0);
  }
  ck_assert_msg(
      bits_equal(&e_dw[0], &e_dw[1]) && bits_equal(&e_db[0], &e_db[1]),
      "linear_dgelu_bwd: dweight or dbias differs between runs");
  REL(&x, &w1, &b1, &w2, &dy, &pre, &act, &dinp, &dw, &db, &hpre, &hact, &d_x,
      &d_w1, &d_b1, &d_w2, &d_dy, &d_pre, &d_act, &d_dinp, &d_dinp2, &d_dw,
      &d_db, &e_dw[0], &e_dw[1], &e_db[0], &e_db[1]);
}

START_TEST(test_linear_gelu_table) {
  run_linear_gelu_table(TR_F32, 333, 96, 384, 1);
  run_linear_gelu_table(TR_F32, 77, 40, 160, 0);
  run_linear_gelu_table(TR_BF16, 333, 128, 512, 1);
  run_linear_gelu_table(TR_BF16, 300, 64, 256, 0);
  /* hidden widths that are not a multiple of 8 (no cuBLASLt epilogue) */
  run_linear_gelu_table(TR_F32, 50, 24, 100, 1);
  run_linear_gelu_table(TR_BF16, 70, 32, 36, 1);
}
END_TEST

/* ---- fused entries of the table: residual norms, overwriting linear
 * backward ---- */

/* tr_kern_residual_{layer,rms}norm_fwd through the tensor API against the
 * CPU's add then norm (on round(a + b) for bf16, the sum the kernel
 * keeps), in place (resid = a) too; and bit for bit against the GPU's own
 * tr_kern_add then norm, which activation checkpointing's recomputation
 * runs. */
static void run_residual_norm_table(tr_dtype_t dt, int64_t N, int C, int rms) {
  char what[96];
  const char* name = rms ? "residual_rmsnorm_fwd" : "residual_layernorm_fwd";
  tr_tensor_t a, b, w, bias, x, out, mean, rstd;
  hrand(&a, dt, 2.0, 2, SH(N, C));
  hrand(&b, dt, 1.0, 2, SH(N, C));
  hrand(&w, dt, 1.0, 1, SH(C));
  hrand(&bias, dt, 0.5, 1, SH(C));
  hdup(&x, &a);
  ck_assert_int_eq(tr_kern_accumulate(&x, &b), 0);
  if (dt == TR_BF16)
    for (int64_t i = 0; i < N * C; i++) F(&x)[i] = rb(F(&x)[i]);
  ck_assert_int_eq(tr_tensor_empty(&out, TR_F32, TR_DEVICE_CPU, 2, SH(N, C)),
                   0);
  ck_assert_int_eq(tr_tensor_empty(&mean, TR_F32, TR_DEVICE_CPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&rstd, TR_F32, TR_DEVICE_CPU, 1, SH(N)), 0);
  if (rms)
    ck_assert_int_eq(tr_kern_rmsnorm_fwd(&out, &rstd, &x, &w, 1e-5f), 0);
  else
    ck_assert_int_eq(
        tr_kern_layernorm_fwd(&out, &mean, &rstd, &x, &w, &bias, 1e-5f), 0);
  tr_tensor_t d_a, d_b, d_w, d_bias, d_x, d_out, d_mean, d_rstd, u_x, u_out,
      u_mean, u_rstd;
  todev(&d_a, &a, dt);
  todev(&d_b, &b, dt);
  todev(&d_w, &w, dt);
  todev(&d_bias, &bias, dt);
  ck_assert_int_eq(tr_tensor_empty(&d_x, dt, GPU, 2, SH(N, C)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_out, dt, GPU, 2, SH(N, C)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_mean, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_rstd, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&u_x, dt, GPU, 2, SH(N, C)), 0);
  ck_assert_int_eq(tr_tensor_empty(&u_out, dt, GPU, 2, SH(N, C)), 0);
  ck_assert_int_eq(tr_tensor_empty(&u_mean, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&u_rstd, TR_F32, GPU, 1, SH(N)), 0);
  if (rms) {
    ck_assert_int_eq(tr_kern_residual_rmsnorm_fwd(&d_x, &d_out, &d_rstd, &d_a,
                                                  &d_b, &d_w, 1e-5f),
                     0);
    ck_assert_int_eq(tr_kern_add(&u_x, &d_a, &d_b), 0);
    ck_assert_int_eq(tr_kern_rmsnorm_fwd(&u_out, &u_rstd, &u_x, &d_w, 1e-5f),
                     0);
  } else {
    ck_assert_int_eq(
        tr_kern_residual_layernorm_fwd(&d_x, &d_out, &d_mean, &d_rstd, &d_a,
                                       &d_b, &d_w, &d_bias, 1e-5f),
        0);
    ck_assert_int_eq(tr_kern_add(&u_x, &d_a, &d_b), 0);
    ck_assert_int_eq(tr_kern_layernorm_fwd(&u_out, &u_mean, &u_rstd, &u_x, &d_w,
                                           &d_bias, 1e-5f),
                     0);
  }
  double tol = tol_of(dt);
  snprintf(what, sizeof what, "%s N=%lld C=%d: sum", name, (long long)N, C);
  expect_close(what, &d_x, &x, tol);
  snprintf(what, sizeof what, "%s N=%lld C=%d: out", name, (long long)N, C);
  expect_close(what, &d_out, &out, tol);
  expect_close("  rstd (fp32)", &d_rstd, &rstd, TOL_F32 * 10);
  if (!rms) expect_close("  mean (fp32)", &d_mean, &mean, TOL_F32 * 10);
  ck_assert_msg(bits_equal(&d_x, &u_x) && bits_equal(&d_out, &u_out) &&
                    bits_equal(&d_rstd, &u_rstd) &&
                    (rms || bits_equal(&d_mean, &u_mean)),
                "%s: not the bits of add then the norm", name);
  /* in place: the sum over a */
  if (rms)
    ck_assert_int_eq(tr_kern_residual_rmsnorm_fwd(&d_a, &d_out, &d_rstd, &d_a,
                                                  &d_b, &d_w, 1e-5f),
                     0);
  else
    ck_assert_int_eq(
        tr_kern_residual_layernorm_fwd(&d_a, &d_out, &d_mean, &d_rstd, &d_a,
                                       &d_b, &d_w, &d_bias, 1e-5f),
        0);
  ck_assert_msg(bits_equal(&d_a, &u_x) && bits_equal(&d_out, &u_out),
                "%s: in place differs", name);
  REL(&a, &b, &w, &bias, &x, &out, &mean, &rstd, &d_a, &d_b, &d_w, &d_bias,
      &d_x, &d_out, &d_mean, &d_rstd, &u_x, &u_out, &u_mean, &u_rstd);
}

START_TEST(test_residual_norm_table) {
  run_residual_norm_table(TR_F32, 300, 768, 0);
  run_residual_norm_table(TR_F32, 77, 70, 1);
  run_residual_norm_table(TR_BF16, 512, 768, 0);
  run_residual_norm_table(TR_BF16, 333, 2048, 1);
  run_residual_norm_table(TR_BF16, 65, 36, 0); /* not 16-byte packs */
}
END_TEST

/* tr_kern_linear_bwd_write: dinp overwritten (from random old contents)
 * against the CPU's linear_bwd into zeros, dweight and dbias += as
 * linear_bwd; ld > OC: dout a column slice of padded rows, OC not a
 * multiple of 8 (the output projection's GEMMs, split in two) */
static void run_linear_bwd_write(tr_dtype_t dt, int64_t N, int IC, int OC,
                                 int64_t ld, int bias) {
  char what[96];
  tr_tensor_t x, w, wide, dout, dinp, dw, db, rdinp;
  hrand(&x, dt, 1.0, 2, SH(N, IC));
  hrand(&w, dt, 0.2, 2, SH(OC, IC));
  hrand(&wide, dt, 1.0, 2, SH(N, ld));
  ck_assert_int_eq(tr_tensor_narrow(&dout, &wide, 1, 0, OC), 0);
  hrand(&dinp, dt, 0.5, 2, SH(N, IC)); /* old contents, overwritten */
  hrand(&dw, TR_F32, 0.5, 2, SH(OC, IC));
  hrand(&db, TR_F32, 0.5, 1, SH(OC));
  tr_tensor_t d_x, d_w, d_wide, d_dout, d_dinp, d_dw, d_db, d_dinp2;
  todev(&d_x, &x, dt);
  todev(&d_w, &w, dt);
  todev(&d_wide, &wide, dt);
  ck_assert_int_eq(tr_tensor_narrow(&d_dout, &d_wide, 1, 0, OC), 0);
  todev(&d_dinp, &dinp, dt);
  todev(&d_dw, &dw, TR_F32);
  todev(&d_db, &db, TR_F32);
  ck_assert_int_eq(tr_tensor_zeros(&rdinp, TR_F32, TR_DEVICE_CPU, 2, SH(N, IC)),
                   0);
  ck_assert_int_eq(
      tr_kern_linear_bwd(&rdinp, &dw, bias ? &db : NULL, &dout, &x, &w), 0);
  ck_assert_int_eq(tr_kern_linear_bwd_write(&d_dinp, &d_dw, bias ? &d_db : NULL,
                                            &d_dout, &d_x, &d_w),
                   0);
  double tol = tol_of(dt);
  snprintf(what, sizeof what, "linear_bwd_write %lldx%d<-%d ld %lld: dinp",
           (long long)N, IC, OC, (long long)ld);
  expect_close(what, &d_dinp, &rdinp, tol);
  expect_close("  dweight (+=, fp32)", &d_dw, &dw, tol);
  if (bias) expect_close("  dbias (+=, fp32)", &d_db, &db, tol);
  /* from other old contents (zeros), the same bits */
  ck_assert_int_eq(tr_tensor_zeros(&d_dinp2, dt, GPU, 2, SH(N, IC)), 0);
  ck_assert_int_eq(
      tr_kern_linear_bwd_write(&d_dinp2, NULL, NULL, &d_dout, &d_x, &d_w), 0);
  ck_assert_msg(bits_equal(&d_dinp, &d_dinp2),
                "linear_bwd_write: dinp depends on its old contents");
  REL(&x, &w, &wide, &dout, &dinp, &dw, &db, &rdinp, &d_x, &d_w, &d_wide,
      &d_dout, &d_dinp, &d_dw, &d_db, &d_dinp2);
}

START_TEST(test_linear_bwd_write) {
  run_linear_bwd_write(TR_F32, 200, 96, 160, 160, 1);
  run_linear_bwd_write(TR_BF16, 512, 256, 768, 768, 1);
  run_linear_bwd_write(TR_BF16, 300, 128, 64, 64, 0);
  run_linear_bwd_write(TR_BF16, 130, 64, 203, 256, 0); /* padded rows */
  run_linear_bwd_write(TR_F32, 70, 32, 5, 64, 0);      /* only the tail */
}
END_TEST

/* The batch-strided linears (async tensor parallel's chunks: rows
 * [t0, t0 + n) of every sequence of [B, T, *] tensors, one strided-batched
 * GEMM) against the CPU's, which run the entries once a sequence: every
 * kind, the whole output tensors compared (the rows outside the chunk keep
 * their old values on both sides). */
static int sliced_linear(tr_kern_lin_kind_t kind, int64_t t0, int64_t n,
                         tr_tensor_t* out, tr_tensor_t* pre,
                         const tr_tensor_t* x, const tr_tensor_t* dy,
                         const tr_tensor_t* pre_in, const tr_tensor_t* w,
                         const tr_tensor_t* bias) {
  tr_tensor_t vo, vp, vx, vd, vq;
  ck_assert_int_eq(tr_tensor_narrow(&vo, out, 1, t0, n), 0);
  ck_assert_int_eq(tr_tensor_narrow(&vp, pre, 1, t0, n), 0);
  ck_assert_int_eq(tr_tensor_narrow(&vx, x, 1, t0, n), 0);
  ck_assert_int_eq(tr_tensor_narrow(&vd, dy, 1, t0, n), 0);
  ck_assert_int_eq(tr_tensor_narrow(&vq, pre_in, 1, t0, n), 0);
  int rc = lk_call(kind, &vo, &vp, &vx, &vd, &vq, w, bias);
  REL(&vo, &vp, &vx, &vd, &vq);
  return rc;
}

static void run_linear_batched(tr_dtype_t dt, int64_t B, int64_t T, int64_t t0,
                               int64_t n, int IC, int OC) {
  static const char* names[] = {"fwd", "fwd_gelu", "dinp", "dinp_write",
                                "dinp_dgelu"};
  char what[96];
  tr_tensor_t x, dy, pre_in, w, bias;
  hrand(&x, dt, 1.0, 3, SH(B, T, IC));
  hrand(&dy, dt, 1.0, 3, SH(B, T, OC));
  hrand(&pre_in, dt, 2.0, 3, SH(B, T, IC));
  hrand(&w, dt, 0.2, 2, SH(OC, IC));
  hrand(&bias, dt, 0.5, 1, SH(OC));
  tr_tensor_t d_x, d_dy, d_pre_in, d_w, d_bias;
  todev(&d_x, &x, dt);
  todev(&d_dy, &dy, dt);
  todev(&d_pre_in, &pre_in, dt);
  todev(&d_w, &w, dt);
  todev(&d_bias, &bias, dt);
  for (int kind = TR_KERN_LIN_FWD; kind <= TR_KERN_LIN_DINP_DGELU; kind++) {
    int64_t width = kind >= TR_KERN_LIN_DINP ? IC : OC;
    tr_tensor_t out, pre, d_out, d_pre;
    hrand(&out, dt, 1.0, 3, SH(B, T, width)); /* old contents */
    hrand(&pre, dt, 1.0, 3, SH(B, T, width));
    todev(&d_out, &out, dt);
    todev(&d_pre, &pre, dt);
    ck_assert_int_eq(sliced_linear((tr_kern_lin_kind_t)kind, t0, n, &out, &pre,
                                   &x, &dy, &pre_in, &w, &bias),
                     0);
    ck_assert_int_eq(
        sliced_linear((tr_kern_lin_kind_t)kind, t0, n, &d_out, &d_pre, &d_x,
                      &d_dy, &d_pre_in, &d_w, &d_bias),
        0);
    snprintf(what, sizeof what, "linear %s [%lld, %lld of %lld]x%d->%d: out",
             names[kind], (long long)B, (long long)n, (long long)T, IC, OC);
    expect_close(what, &d_out, &out, tol_of(dt));
    if (kind == TR_KERN_LIN_FWD_GELU)
      expect_close("  pre", &d_pre, &pre, tol_of(dt));
    REL(&out, &pre, &d_out, &d_pre);
  }
  REL(&x, &dy, &pre_in, &w, &bias, &d_x, &d_dy, &d_pre_in, &d_w, &d_bias);
}

START_TEST(test_linear_batched) {
  run_linear_batched(TR_F32, 3, 64, 32, 16, 96, 160);
  run_linear_batched(TR_BF16, 4, 128, 64, 32, 256, 768);
  run_linear_batched(TR_BF16, 2, 32, 8, 8, 60, 36); /* unfused GELU widths */
  run_linear_batched(TR_BF16, 8, 256, 0, 128, 128, 64); /* tp 2's first */
}
END_TEST

/* tr_kern_swiglu_bwd_write from random old contents against the CPU's
 * swiglu_bwd into zeros; and from zeros, the GPU's own bits again */
static void run_swiglu_bwd_write(tr_dtype_t dt, int64_t n) {
  tr_tensor_t g, u, dy, dg, du, rdg, rdu;
  hrand(&g, dt, 4.0, 1, SH(n));
  hrand(&u, dt, 2.0, 1, SH(n));
  hrand(&dy, dt, 1.0, 1, SH(n));
  hrand(&dg, dt, 1.0, 1, SH(n)); /* old contents, overwritten */
  hrand(&du, dt, 1.0, 1, SH(n));
  ck_assert_int_eq(tr_tensor_zeros(&rdg, TR_F32, TR_DEVICE_CPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_tensor_zeros(&rdu, TR_F32, TR_DEVICE_CPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_kern_swiglu_bwd(&rdg, &rdu, &dy, &g, &u), 0);
  tr_tensor_t d_g, d_u, d_dy, d_dg, d_du, z_dg, z_du;
  todev(&d_g, &g, dt);
  todev(&d_u, &u, dt);
  todev(&d_dy, &dy, dt);
  todev(&d_dg, &dg, dt);
  todev(&d_du, &du, dt);
  ck_assert_int_eq(tr_kern_swiglu_bwd_write(&d_dg, &d_du, &d_dy, &d_g, &d_u),
                   0);
  double tol = tol_of(dt);
  expect_close("swiglu_bwd_write dgate (overwritten)", &d_dg, &rdg, tol);
  expect_close("swiglu_bwd_write dup (overwritten)", &d_du, &rdu, tol);
  ck_assert_int_eq(tr_tensor_zeros(&z_dg, dt, GPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_tensor_zeros(&z_du, dt, GPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_kern_swiglu_bwd(&z_dg, &z_du, &d_dy, &d_g, &d_u), 0);
  ck_assert_msg(bits_equal(&d_dg, &z_dg) && bits_equal(&d_du, &z_du),
                "swiglu_bwd_write: not the bits of swiglu_bwd into zeros");
  REL(&g, &u, &dy, &dg, &du, &rdg, &rdu, &d_g, &d_u, &d_dy, &d_dg, &d_du, &z_dg,
      &z_du);
}

START_TEST(test_swiglu_bwd_write) {
  run_swiglu_bwd_write(TR_F32, 10007);
  run_swiglu_bwd_write(TR_BF16, 1 << 16);
  run_swiglu_bwd_write(TR_BF16, 1001); /* a scalar tail */
}
END_TEST

/* ---- RoPE ---- */

static void run_rope(tr_dtype_t dt, int B, int T, int H, int D_, int pad) {
  int64_t W = (int64_t)H * D_ + pad; /* row stride: a slice of a wider row */
  tr_tensor_t full, ref_full, cs, sn, d_full, d_cs, d_sn;
  hrand(&full, dt, 1.0, 3, SH(B, T, W));
  hdup(&ref_full, &full);
  ck_assert_int_eq(
      tr_tensor_empty(&cs, TR_F32, TR_DEVICE_CPU, 2, SH(T, D_ / 2)), 0);
  ck_assert_int_eq(
      tr_tensor_empty(&sn, TR_F32, TR_DEVICE_CPU, 2, SH(T, D_ / 2)), 0);
  tr_rope_scaling_t sc = {8.0f, 1.0f, 4.0f, 64};
  ck_assert_int_eq(tr_kern_rope_table(F(&cs), F(&sn), T, D_, 500000.0, &sc), 0);
  tr_tensor_t rv;
  ck_assert_int_eq(tr_tensor_narrow(&rv, &ref_full, 2, 0, (int64_t)H * D_), 0);
  ck_assert_int_eq(tr_kern_rope(&rv, H, &cs, &sn, 0), 0);
  todev(&d_full, &full, dt);
  todev(&d_cs, &cs, TR_F32);
  todev(&d_sn, &sn, TR_F32);
  tr_tensor_t dv;
  ck_assert_int_eq(tr_tensor_narrow(&dv, &d_full, 2, 0, (int64_t)H * D_), 0);
  if (dt == TR_F32)
    ck_assert_int_eq(tr_kern_rope(&dv, H, &d_cs, &d_sn, 0), 0);
  else
    ck_assert_int_eq(tr_kern_cuda_rope(dt, D(&dv), F(&d_cs), F(&d_sn), B, T, H,
                                       D_, W, 0, NULL),
                     0);
  char what[96];
  snprintf(what, sizeof what, "rope B=%d T=%d H=%d D=%d stride=%lld", B, T, H,
           D_, (long long)W);
  expect_close(what, &d_full, &ref_full, tol_of(dt));
  /* the inverse (the backward) gives the input back */
  if (dt == TR_F32)
    ck_assert_int_eq(tr_kern_rope(&dv, H, &d_cs, &d_sn, 1), 0);
  else
    ck_assert_int_eq(tr_kern_cuda_rope(dt, D(&dv), F(&d_cs), F(&d_sn), B, T, H,
                                       D_, W, 1, NULL),
                     0);
  expect_close("rope inverse restores the input", &d_full, &full,
               dt == TR_BF16 ? TOL_BF16 : 1e-6);
  REL(&full, &ref_full, &cs, &sn, &d_full, &d_cs, &d_sn, &rv, &dv);
}

START_TEST(test_rope) {
  run_rope(TR_F32, 2, 33, 4, 64, 128);
  run_rope(TR_F32, 1, 17, 3, 6, 5);
  run_rope(TR_BF16, 2, 64, 8, 128, 256);
  run_rope(TR_BF16, 2, 19, 2, 10, 4);
}
END_TEST

/* ---- embedding ---- */

static void run_embedding(tr_dtype_t dt, int B, int T, int C, int V,
                          int with_wpe) {
  tr_tensor_t tok, wte, wpe, dout, dwte, dwpe, out, rdwte, rdwpe;
  ck_assert_int_eq(tr_tensor_empty(&tok, TR_I32, TR_DEVICE_CPU, 2, SH(B, T)),
                   0);
  for (int i = 0; i < B * T; i++) /* few distinct tokens: many repeats */
    ((int32_t*)D(&tok))[i] = (int32_t)((urand() + 1.0) * 0.5 * (V / 4 + 1)) % V;
  hrand(&wte, dt, 1.0, 2, SH(V, C));
  hrand(&wpe, dt, 1.0, 2, SH(T + 3, C));
  hrand(&dout, dt, 1.0, 3, SH(B, T, C));
  hrand(&dwte, TR_F32, 0.5, 2, SH(V, C));
  hrand(&dwpe, TR_F32, 0.5, 2, SH(T + 3, C));
  hdup(&rdwte, &dwte);
  hdup(&rdwpe, &dwpe);
  ck_assert_int_eq(tr_tensor_empty(&out, TR_F32, TR_DEVICE_CPU, 3, SH(B, T, C)),
                   0);
  ck_assert_int_eq(
      tr_kern_embedding_fwd(&out, &tok, &wte, with_wpe ? &wpe : NULL), 0);
  ck_assert_int_eq(
      tr_kern_embedding_bwd(&rdwte, with_wpe ? &rdwpe : NULL, &dout, &tok), 0);
  tr_tensor_t d_tok, d_wte, d_wpe, d_dout, d_dwte, d_dwpe, d_out, d_dwte2;
  ck_assert_int_eq(tr_tensor_empty(&d_tok, TR_I32, GPU, 2, SH(B, T)), 0);
  ck_assert_int_eq(tr_tensor_copy(&d_tok, &tok), 0);
  todev(&d_wte, &wte, dt);
  todev(&d_wpe, &wpe, dt);
  todev(&d_dout, &dout, dt);
  todev(&d_dwte, &dwte, TR_F32);
  todev(&d_dwte2, &dwte, TR_F32);
  todev(&d_dwpe, &dwpe, TR_F32);
  ck_assert_int_eq(tr_tensor_empty(&d_out, dt, GPU, 3, SH(B, T, C)), 0);
  if (dt == TR_F32) {
    ck_assert_int_eq(
        tr_kern_embedding_fwd(&d_out, &d_tok, &d_wte, with_wpe ? &d_wpe : NULL),
        0);
    ck_assert_int_eq(tr_kern_embedding_bwd(&d_dwte, with_wpe ? &d_dwpe : NULL,
                                           &d_dout, &d_tok),
                     0);
  } else {
    ck_assert_int_eq(tr_kern_cuda_embedding_fwd(
                         dt, D(&d_out), D(&d_tok), D(&d_wte),
                         with_wpe ? D(&d_wpe) : NULL, B, T, C, V, NULL),
                     0);
    ck_assert_int_eq(
        tr_kern_cuda_embedding_bwd(dt, D(&d_dwte), with_wpe ? D(&d_dwpe) : NULL,
                                   D(&d_dout), D(&d_tok), B, T, C, V, NULL),
        0);
  }
  ck_assert_int_eq(tr_kern_cuda_embedding_bwd(dt, D(&d_dwte2), NULL, D(&d_dout),
                                              D(&d_tok), B, T, C, V, NULL),
                   0);
  char what[96];
  snprintf(what, sizeof what, "embedding_fwd%s B=%d T=%d C=%d V=%d",
           with_wpe ? "+wpe" : "", B, T, C, V);
  expect_close(what, &d_out, &out, tol_of(dt));
  expect_close("embedding_bwd dwte (+=, fp32)", &d_dwte, &rdwte, tol_of(dt));
  if (with_wpe)
    expect_close("embedding_bwd dwpe (+=, fp32)", &d_dwpe, &rdwpe, tol_of(dt));
  ck_assert_msg(bits_equal(&d_dwte, &d_dwte2),
                "embedding backward differs between runs");
  REL(&tok, &wte, &wpe, &dout, &dwte, &dwpe, &out, &rdwte, &rdwpe, &d_tok,
      &d_wte, &d_wpe, &d_dout, &d_dwte, &d_dwpe, &d_out, &d_dwte2);
}

START_TEST(test_embedding) {
  run_embedding(TR_F32, 4, 64, 96, 500, 1);
  run_embedding(TR_F32, 3, 50, 30, 77, 0);
  run_embedding(TR_BF16, 8, 128, 256, 1000, 1);
  run_embedding(TR_BF16, 2, 31, 20, 50, 1);
}
END_TEST

START_TEST(test_embedding_bad_token) {
  const int B = 1, T = 4, C = 16, V = 10;
  int32_t toks[4] = {1, 10, -3, 2};
  tr_tensor_t tok, d_tok, wte, d_wte, d_out, out;
  ck_assert_int_eq(
      tr_tensor_wrap(&tok, toks, TR_I32, TR_DEVICE_CPU, 2, SH(B, T)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_tok, TR_I32, GPU, 2, SH(B, T)), 0);
  ck_assert_int_eq(tr_tensor_copy(&d_tok, &tok), 0);
  hrand(&wte, TR_BF16, 1.0, 2, SH(V, C));
  todev(&d_wte, &wte, TR_BF16);
  ck_assert_int_eq(tr_tensor_empty(&d_out, TR_BF16, GPU, 3, SH(B, T, C)), 0);
  ck_assert_int_eq(
      tr_kern_cuda_embedding_fwd(TR_BF16, D(&d_out), D(&d_tok), D(&d_wte), NULL,
                                 B, T, C, V, NULL),
      0);
  tohost(&out, &d_out);
  for (int c = 0; c < C; c++) {
    ck_assert_float_eq(F(&out)[c], F(&wte)[1 * C + c]);
    ck_assert(isnan(F(&out)[1 * C + c]));
    ck_assert(isnan(F(&out)[2 * C + c]));
    ck_assert_float_eq(F(&out)[3 * C + c], F(&wte)[2 * C + c]);
  }
  printf("%-44s %-8s NaN rows as documented\n", "embedding_fwd bad tokens",
         "bfloat16");
  REL(&tok, &d_tok, &wte, &d_wte, &d_out, &out);
}
END_TEST

/* ---- classifier ---- */

static void make_targets(int32_t* t, int64_t N, int V) {
  for (int64_t i = 0; i < N; i++)
    t[i] = (int32_t)((urand() + 1.0) * 0.5 * V) % V;
  t[N / 3] = TR_IGNORE_INDEX;
}

START_TEST(test_xent_table) {
  const int64_t N = 70;
  const int V = 1003;
  tr_tensor_t lg, tg, losses, lse, d_lg, d_tg, d_losses, d_lse;
  hrand(&lg, TR_F32, 4.0, 2, SH(N, V));
  ck_assert_int_eq(tr_tensor_empty(&tg, TR_I32, TR_DEVICE_CPU, 1, SH(N)), 0);
  make_targets(D(&tg), N, V);
  ck_assert_int_eq(tr_tensor_empty(&losses, TR_F32, TR_DEVICE_CPU, 1, SH(N)),
                   0);
  ck_assert_int_eq(tr_tensor_empty(&lse, TR_F32, TR_DEVICE_CPU, 1, SH(N)), 0);
  todev(&d_lg, &lg, TR_F32);
  ck_assert_int_eq(tr_tensor_empty(&d_tg, TR_I32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_copy(&d_tg, &tg), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_losses, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_lse, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_kern_xent_fwd(&losses, &lse, &lg, &tg), 0);
  ck_assert_int_eq(tr_kern_xent_bwd(&lg, &lse, &tg, 0.01f), 0);
  ck_assert_int_eq(tr_kern_xent_fwd(&d_losses, &d_lse, &d_lg, &d_tg), 0);
  ck_assert_int_eq(tr_kern_xent_bwd(&d_lg, &d_lse, &d_tg, 0.01f), 0);
  expect_close("xent_fwd losses", &d_losses, &losses, TOL_F32);
  expect_close("xent_fwd lse", &d_lse, &lse, TOL_F32);
  expect_close("xent_bwd dlogits (in place)", &d_lg, &lg, TOL_F32);
  /* a target out of range: TR_EINVAL */
  int32_t bad = V;
  tr_tensor_t one;
  ck_assert_int_eq(tr_tensor_narrow(&one, &d_tg, 0, 5, 1), 0);
  tr_tensor_t hb;
  ck_assert_int_eq(tr_tensor_wrap(&hb, &bad, TR_I32, TR_DEVICE_CPU, 1, SH(1)),
                   0);
  ck_assert_int_eq(tr_tensor_copy(&one, &hb), 0);
  ck_assert_int_eq(tr_kern_xent_fwd(&d_losses, &d_lse, &d_lg, &d_tg),
                   TR_EINVAL);
  printf("%-44s %-8s TR_EINVAL\n", "xent_fwd target out of range", "float32");
  REL(&lg, &tg, &losses, &lse, &d_lg, &d_tg, &d_losses, &d_lse, &one, &hb);
}
END_TEST

/* ---- vocabulary-parallel (tensor parallel's embedding and loss) ---- */

/* host fp32 zeros */
static void hzeros(tr_tensor_t* t, int ndim, const int64_t* shape) {
  ck_assert_int_eq(tr_tensor_zeros(t, TR_F32, TR_DEVICE_CPU, ndim, shape), 0);
}

/* host tensor a, its device copy d (fp32 or int32 alike) */
static void hdev(tr_tensor_t* d, const tr_tensor_t* a) {
  ck_assert_int_eq(tr_tensor_empty(d, a->dtype, GPU, a->ndim, a->shape), 0);
  ck_assert_int_eq(tr_tensor_copy(d, a), 0);
}

/* Tensor parallel's vocabulary-sharded kernels on the device against the
 * CPU table, over two slices [0, cut) and [cut, V) of one table: the
 * rows lookup (tokens outside a slice give 0) and its backward with
 * positions, then loss parallel's steps with the reductions between them
 * (max, sum of exponentials, target logit) done on the host, as the tp
 * group does; the losses and lse of the slices together also equal
 * xent_fwd's on the whole logits, and each slice's dlogits the columns of
 * xent_bwd's. */
START_TEST(test_vocab_parallel) {
  const int B = 2, T = 37, C = 40;
  const int64_t N = (int64_t)B * T, V = 1003, cut = 512;
  const float scale = 1.0f / (float)N;
  tr_tensor_t tok, d_tok, tg, d_tg, lg, wl, wlse, gmax, gsum, gtgt;
  ck_assert_int_eq(tr_tensor_empty(&tok, TR_I32, TR_DEVICE_CPU, 2, SH(B, T)),
                   0);
  for (int64_t i = 0; i < N; i++)
    ((int32_t*)D(&tok))[i] = (int32_t)((urand() + 1.0) * 0.5 * (double)V) % V;
  hdev(&d_tok, &tok);
  ck_assert_int_eq(tr_tensor_empty(&tg, TR_I32, TR_DEVICE_CPU, 1, SH(N)), 0);
  make_targets(D(&tg), N, (int)V);
  hdev(&d_tg, &tg);
  hrand(&lg, TR_F32, 4.0, 2, SH(N, V));
  hzeros(&wl, 1, SH(N));
  hzeros(&wlse, 1, SH(N));
  tr_tensor_t whole;
  hdup(&whole, &lg);
  ck_assert_int_eq(tr_kern_xent_fwd(&wl, &wlse, &whole, &tg), 0);
  ck_assert_int_eq(tr_kern_xent_bwd(&whole, &wlse, &tg, scale), 0);
  hzeros(&gsum, 1, SH(N));
  hzeros(&gtgt, 1, SH(N));
  ck_assert_int_eq(tr_tensor_empty(&gmax, TR_F32, TR_DEVICE_CPU, 1, SH(N)), 0);
  for (int64_t r = 0; r < N; r++) F(&gmax)[r] = -INFINITY;
  tr_tensor_t lgs[2], d_lgs[2];
  int64_t row0[2] = {0, cut}, rows[2] = {cut, V - cut};
  for (int s = 0; s < 2; s++) {
    char what[96];
    /* the embedding rows [row0, row0 + rows) */
    tr_tensor_t wte, d_wte, out, d_out, dout, d_dout, dw, d_dw, dp, d_dp;
    hrand(&wte, TR_F32, 1.0, 2, SH(rows[s], C));
    hdev(&d_wte, &wte);
    hzeros(&out, 3, SH(B, T, C));
    hdev(&d_out, &out);
    ck_assert_int_eq(tr_kern_embedding_rows_fwd(&out, &tok, &wte, row0[s], V),
                     0);
    ck_assert_int_eq(
        tr_kern_embedding_rows_fwd(&d_out, &d_tok, &d_wte, row0[s], V), 0);
    snprintf(what, sizeof what, "embedding_rows_fwd rows [%lld, %lld)",
             (long long)row0[s], (long long)(row0[s] + rows[s]));
    expect_close(what, &d_out, &out, TOL_F32);
    hrand(&dout, TR_F32, 1.0, 3, SH(B, T, C));
    hdev(&d_dout, &dout);
    hrand(&dw, TR_F32, 0.5, 2, SH(rows[s], C)); /* added to */
    hdev(&d_dw, &dw);
    hrand(&dp, TR_F32, 0.5, 2, SH(T, C));
    hdev(&d_dp, &dp);
    ck_assert_int_eq(tr_kern_embedding_rows_bwd(&dw, &dp, &dout, &tok, row0[s]),
                     0);
    ck_assert_int_eq(
        tr_kern_embedding_rows_bwd(&d_dw, &d_dp, &d_dout, &d_tok, row0[s]), 0);
    expect_close("embedding_rows_bwd dwte (+=)", &d_dw, &dw, TOL_F32);
    expect_close("embedding_rows_bwd dwpe (+=)", &d_dp, &dp, TOL_F32);
    REL(&wte, &d_wte, &out, &d_out, &dout, &d_dout, &dw, &d_dw, &dp, &d_dp);
    /* the logit columns of the same slice: stats */
    ck_assert_int_eq(
        tr_tensor_empty(&lgs[s], TR_F32, TR_DEVICE_CPU, 2, SH(N, rows[s])), 0);
    for (int64_t r = 0; r < N; r++)
      memcpy(F(&lgs[s]) + r * rows[s], F(&lg) + r * V + row0[s],
             sizeof(float) * (size_t)rows[s]);
    hdev(&d_lgs[s], &lgs[s]);
    tr_tensor_t mx, tt, d_mx, d_tt;
    hzeros(&mx, 1, SH(N));
    hzeros(&tt, 1, SH(N));
    hdev(&d_mx, &mx);
    hdev(&d_tt, &tt);
    ck_assert_int_eq(
        tr_kern_xent_shard_stats(&mx, &tt, &lgs[s], &tg, row0[s], V), 0);
    ck_assert_int_eq(
        tr_kern_xent_shard_stats(&d_mx, &d_tt, &d_lgs[s], &d_tg, row0[s], V),
        0);
    expect_close("xent_shard_stats max", &d_mx, &mx, TOL_F32);
    expect_close("xent_shard_stats target logit", &d_tt, &tt, TOL_F32);
    for (int64_t r = 0; r < N; r++) { /* the tp group's MAX and SUM */
      F(&gmax)[r] = fmaxf(F(&gmax)[r], F(&mx)[r]);
      F(&gtgt)[r] += F(&tt)[r];
    }
    REL(&mx, &tt, &d_mx, &d_tt);
  }
  tr_tensor_t d_gmax, d_gsum, d_gtgt;
  hdev(&d_gmax, &gmax);
  for (int s = 0; s < 2; s++) {
    tr_tensor_t sm, d_sm;
    hzeros(&sm, 1, SH(N));
    hdev(&d_sm, &sm);
    ck_assert_int_eq(tr_kern_xent_shard_sumexp(&sm, &lgs[s], &gmax), 0);
    ck_assert_int_eq(tr_kern_xent_shard_sumexp(&d_sm, &d_lgs[s], &d_gmax), 0);
    expect_close("xent_shard_sumexp", &d_sm, &sm, TOL_F32);
    for (int64_t r = 0; r < N; r++) F(&gsum)[r] += F(&sm)[r];
    REL(&sm, &d_sm);
  }
  hdev(&d_gsum, &gsum);
  hdev(&d_gtgt, &gtgt);
  tr_tensor_t ls, lse, d_ls, d_lse;
  hzeros(&ls, 1, SH(N));
  hzeros(&lse, 1, SH(N));
  hdev(&d_ls, &ls);
  hdev(&d_lse, &lse);
  ck_assert_int_eq(
      tr_kern_xent_shard_loss(&ls, &lse, &gmax, &gsum, &gtgt, &tg), 0);
  ck_assert_int_eq(
      tr_kern_xent_shard_loss(&d_ls, &d_lse, &d_gmax, &d_gsum, &d_gtgt, &d_tg),
      0);
  expect_close("xent_shard_loss losses", &d_ls, &ls, TOL_F32);
  expect_close("xent_shard_loss losses = xent_fwd's", &d_ls, &wl, TOL_F32);
  expect_close("xent_shard_loss lse = xent_fwd's", &d_lse, &wlse, TOL_F32);
  for (int s = 0; s < 2; s++) {
    tr_tensor_t cols;
    ck_assert_int_eq(
        tr_kern_xent_shard_bwd(&lgs[s], &lse, &tg, row0[s], scale), 0);
    ck_assert_int_eq(
        tr_kern_xent_shard_bwd(&d_lgs[s], &d_lse, &d_tg, row0[s], scale), 0);
    expect_close("xent_shard_bwd dlogits (in place)", &d_lgs[s], &lgs[s],
                 TOL_F32);
    ck_assert_int_eq(
        tr_tensor_empty(&cols, TR_F32, TR_DEVICE_CPU, 2, SH(N, rows[s])), 0);
    for (int64_t r = 0; r < N; r++)
      memcpy(F(&cols) + r * rows[s], F(&whole) + r * V + row0[s],
             sizeof(float) * (size_t)rows[s]);
    expect_close("xent_shard_bwd = xent_bwd's columns", &d_lgs[s], &cols,
                 TOL_F32);
    REL(&cols, &lgs[s], &d_lgs[s]);
  }
  REL(&tok, &d_tok, &tg, &d_tg, &lg, &wl, &wlse, &gmax, &gsum, &gtgt, &whole,
      &d_gmax, &d_gsum, &d_gtgt, &ls, &lse, &d_ls, &d_lse);
}
END_TEST

/* fused forward + backward, padded rows (ld > V) */
static void run_classifier(tr_dtype_t dt, int64_t N, int V, int64_t ld) {
  tr_tensor_t full, ref, tg, losses, lse, d_full, d_tg, d_losses, d_lse;
  hrand(&full, dt, 5.0, 2, SH(N, ld));
  ck_assert_int_eq(tr_tensor_empty(&tg, TR_I32, TR_DEVICE_CPU, 1, SH(N)), 0);
  make_targets(D(&tg), N, V);
  /* reference on the unpadded columns: a contiguous copy */
  ck_assert_int_eq(tr_tensor_empty(&ref, TR_F32, TR_DEVICE_CPU, 2, SH(N, V)),
                   0);
  for (int64_t r = 0; r < N; r++)
    memcpy(F(&ref) + r * V, F(&full) + r * ld, sizeof(float) * (size_t)V);
  ck_assert_int_eq(tr_tensor_empty(&losses, TR_F32, TR_DEVICE_CPU, 1, SH(N)),
                   0);
  ck_assert_int_eq(tr_tensor_empty(&lse, TR_F32, TR_DEVICE_CPU, 1, SH(N)), 0);
  float scale = 1.0f / (float)N;
  ck_assert_int_eq(tr_kern_xent_fwd(&losses, &lse, &ref, &tg), 0);
  ck_assert_int_eq(tr_kern_xent_bwd(&ref, &lse, &tg, scale), 0);
  todev(&d_full, &full, dt);
  ck_assert_int_eq(tr_tensor_empty(&d_tg, TR_I32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_copy(&d_tg, &tg), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_losses, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_lse, TR_F32, GPU, 1, SH(N)), 0);
  ck_assert_int_eq(
      tr_kern_cuda_classifier(dt, D(&d_full), ld, D(&d_losses), D(&d_lse),
                              D(&d_tg), N, V, scale, 1, NULL, NULL),
      0);
  char what[96];
  snprintf(what, sizeof what, "classifier losses N=%lld V=%d ld=%lld",
           (long long)N, V, (long long)ld);
  expect_close(what, &d_losses, &losses, dt == TR_F32 ? TOL_F32 : 1e-3);
  expect_close("classifier lse", &d_lse, &lse, dt == TR_F32 ? TOL_F32 : 1e-3);
  tr_tensor_t back;
  tohost(&back, &d_full);
  float* g = malloc(sizeof(float) * (size_t)(N * V));
  for (int64_t r = 0; r < N; r++) {
    memcpy(g + r * V, F(&back) + r * ld, sizeof(float) * (size_t)V);
    for (int64_t c = V; c < ld; c++)
      ck_assert_float_eq(F(&back)[r * ld + c], 0);
  }
  expect_host_close("classifier dlogits (fused, in place)", tr_dtype_name(dt),
                    g, F(&ref), N * V, tol_of(dt));
  free(g);
  REL(&full, &ref, &tg, &losses, &lse, &d_full, &d_tg, &d_losses, &d_lse,
      &back);
}

START_TEST(test_classifier) {
  run_classifier(TR_F32, 64, 1000, 1024);
  run_classifier(TR_BF16, 128, 50257, 50304);
  run_classifier(TR_BF16, 33, 301, 301);
}
END_TEST

/* ---- attention ---- */

static const char* impl_name(tr_cuda_attn_impl_t impl) {
  switch (impl) {
    case TR_CUDA_ATTN_FLASH:
      return "flash";
    case TR_CUDA_ATTN_CUDNN:
      return "cudnn";
    case TR_CUDA_ATTN_SIMT:
      return "simt";
    default:
      return "auto";
  }
}

/* lse of rows that may see no key (a shifted chunk): the -inf rows of
 * the reference must be -inf on the device too, the others close */
static void expect_lse_close(const char* what, const tr_tensor_t* d,
                             const tr_tensor_t* ref, double tol) {
  tr_tensor_t h;
  tohost(&h, d);
  int64_t n = tr_tensor_numel(ref), m = 0, empty = 0;
  ck_assert_int_eq(tr_tensor_numel(&h), n);
  float* y = malloc(sizeof(float) * (size_t)n);
  float* r = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    float a = F(&h)[i], b = F(ref)[i];
    if (isinf(b) && b < 0) {
      ck_assert_msg(isinf(a) && a < 0, "%s: row %lld sees no key: lse %g", what,
                    (long long)i, a);
      empty++;
      continue;
    }
    y[m] = a;
    r[m++] = b;
  }
  printf("%-44s (%lld of %lld rows see no key)\n", what, (long long)empty,
         (long long)n);
  expect_host_close(what, tr_dtype_name(d->dtype), y, r, m, tol);
  free(y);
  free(r);
  tr_tensor_release(&h);
}

/* qkv: one fused buffer [B, T, (H + 2 KVH) D], as GPT-2's c_attn writes.
 * The forward runs impl, the backward impl_bwd (its lse from impl's
 * forward). docs (block_causal's doc_start): 1, documents of 1 to 120
 * tokens in every row; 2, the same but the last row one document
 * spanning it; 3, one document per row (no end-of-text token). window: a
 * sliding window (0: none). shift: the query rows stand at key
 * positions i + shift (context parallelism's chunk pairs; with docs the
 * documents are those of the T + shift tokens from the key chunk's start,
 * so doc_start[i] is the document start of position i + shift, in key
 * rows); all against the CPU kernel with the same mask. */
static void run_attention_masked(tr_dtype_t dt, tr_cuda_attn_impl_t impl,
                                 tr_cuda_attn_impl_t impl_bwd, int B, int T,
                                 int H, int KVH, int Dh, int accumulate,
                                 int docs, int window, int shift) {
  int64_t W = (int64_t)(H + 2 * KVH) * Dh;
  tr_tensor_t ds = {0}, d_ds = {0}, *dsp = NULL, *d_dsp = NULL;
  if (docs) {
    ck_assert(shift >= 0); /* documents from the key chunk's start */
    int L = T + shift;
    int32_t* tok = malloc(sizeof(int32_t) * (size_t)B * L);
    int32_t* full = malloc(sizeof(int32_t) * (size_t)B * L);
    for (int64_t i = 0; i < (int64_t)B * L; i++) {
      int t = (int)(i % L), b = (int)(i / L);
      int split = docs == 1 || (docs == 2 && b < B - 1);
      tok[i] = split && (t == 0 || t == 2 || t == 40 + b || t == 130 ||
                         t == 250)
                   ? 1
                   : 7;
    }
    tr_kern_attn_doc_start(full, NULL, tok, B, L, 1);
    ck_assert_int_eq(tr_tensor_empty(&ds, TR_I32, TR_DEVICE_CPU, 2, SH(B, T)),
                     0);
    int32_t* dsv = tr_tensor_data(&ds);
    for (int b = 0; b < B; b++)
      for (int i = 0; i < T; i++)
        dsv[(int64_t)b * T + i] = full[(int64_t)b * L + i + shift];
    ck_assert_int_eq(tr_tensor_empty(&d_ds, TR_I32, GPU, 2, SH(B, T)), 0);
    ck_assert_int_eq(tr_tensor_copy(&d_ds, &ds), 0);
    free(tok);
    free(full);
    dsp = &ds;
    d_dsp = &d_ds;
  }
  tr_kern_attn_mask_t mask = {.doc_start = docs ? tr_tensor_data(&d_ds) : NULL,
                              .window = window,
                              .q_shift = shift};
  const tr_kern_attn_mask_t* maskp = docs || window || shift ? &mask : NULL;
  /* the same mask with the documents counted on the host: the second
   * backward below, and a second forward, take it and must give the same
   * bits (cuDNN then reads no count back from the device) */
  tr_kern_attn_mask_t counted = mask;
  if (docs)
    tr_kern_attn_doc_count(tr_tensor_data(&ds), B, T, &counted.n_docs,
                           &counted.longest_doc);
  const tr_kern_attn_mask_t* maskp2 = maskp ? &counted : NULL;
  tr_tensor_t qkv, dqkv, rdqkv, dout, out, lse;
  hrand(&qkv, dt, 1.5, 3, SH(B, T, W));
  hrand(&dout, dt, 1.0, 3, SH(B, T, (int64_t)H * Dh));
  if (accumulate) {
    hrand(&dqkv, dt, 0.5, 3, SH(B, T, W));
  } else { /* overwritten: start from garbage on the device */
    ck_assert_int_eq(
        tr_tensor_zeros(&dqkv, TR_F32, TR_DEVICE_CPU, 3, SH(B, T, W)), 0);
  }
  hdup(&rdqkv, &dqkv);
  ck_assert_int_eq(tr_tensor_empty(&out, TR_F32, TR_DEVICE_CPU, 3,
                                   SH(B, T, (int64_t)H * Dh)),
                   0);
  ck_assert_int_eq(tr_tensor_empty(&lse, TR_F32, TR_DEVICE_CPU, 3, SH(B, H, T)),
                   0);
  tr_tensor_t q, k, v, dq, dk, dv;
  ck_assert_int_eq(tr_tensor_narrow(&q, &qkv, 2, 0, (int64_t)H * Dh), 0);
  ck_assert_int_eq(
      tr_tensor_narrow(&k, &qkv, 2, (int64_t)H * Dh, (int64_t)KVH * Dh), 0);
  ck_assert_int_eq(
      tr_tensor_narrow(&v, &qkv, 2, (int64_t)(H + KVH) * Dh, (int64_t)KVH * Dh),
      0);
  ck_assert_int_eq(tr_tensor_narrow(&dq, &rdqkv, 2, 0, (int64_t)H * Dh), 0);
  ck_assert_int_eq(
      tr_tensor_narrow(&dk, &rdqkv, 2, (int64_t)H * Dh, (int64_t)KVH * Dh), 0);
  ck_assert_int_eq(tr_tensor_narrow(&dv, &rdqkv, 2, (int64_t)(H + KVH) * Dh,
                                    (int64_t)KVH * Dh),
                   0);
  ck_assert_int_eq(tr_kern_attention_masked_fwd(&out, &lse, &q, &k, &v, H, KVH,
                                                dsp, window, shift),
                   0);
  if (dt == TR_BF16) /* the GPU keeps out in bf16: the backward reads it */
    for (int64_t i = 0; i < tr_tensor_numel(&out); i++)
      F(&out)[i] = rb(F(&out)[i]);
  ck_assert_int_eq(
      tr_kern_attention_masked_bwd(&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse,
                                   H, KVH, dsp, window, shift),
      0);
  if (accumulate) /* the CPU backward overwrites: add what was there */
    for (int64_t i = 0; i < tr_tensor_numel(&rdqkv); i++)
      F(&rdqkv)[i] += F(&dqkv)[i];
  tr_tensor_t d_qkv, d_dqkv, d_dout, d_out, d_lse, d_dqkv2;
  todev(&d_qkv, &qkv, dt);
  todev(&d_dout, &dout, dt);
  if (accumulate) {
    todev(&d_dqkv, &dqkv, dt);
    todev(&d_dqkv2, &dqkv, dt);
  } else {
    tr_tensor_t junk;
    hrand(&junk, dt, 9.0, 3, SH(B, T, W));
    todev(&d_dqkv, &junk, dt);
    todev(&d_dqkv2, &junk, dt);
    tr_tensor_release(&junk);
  }
  ck_assert_int_eq(
      tr_tensor_empty(&d_out, dt, GPU, 3, SH(B, T, (int64_t)H * Dh)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_lse, TR_F32, GPU, 3, SH(B, H, T)), 0);
  tr_kern_cuda_set_attention(impl);
  char* base = D(&d_qkv);
  char* dbase = D(&d_dqkv);
  char* dbase2 = D(&d_dqkv2);
  size_t es = tr_dtype_size(dt);
  size_t ko = (size_t)H * Dh * es, vo = (size_t)(H + KVH) * Dh * es;
  if (dt == TR_F32 && !accumulate) { /* the table (it overwrites): views */
    tr_tensor_t gq, gk, gv, gdq, gdk, gdv;
    ck_assert_int_eq(tr_tensor_narrow(&gq, &d_qkv, 2, 0, (int64_t)H * Dh), 0);
    ck_assert_int_eq(
        tr_tensor_narrow(&gk, &d_qkv, 2, (int64_t)H * Dh, (int64_t)KVH * Dh),
        0);
    ck_assert_int_eq(tr_tensor_narrow(&gv, &d_qkv, 2, (int64_t)(H + KVH) * Dh,
                                      (int64_t)KVH * Dh),
                     0);
    ck_assert_int_eq(tr_tensor_narrow(&gdq, &d_dqkv, 2, 0, (int64_t)H * Dh), 0);
    ck_assert_int_eq(
        tr_tensor_narrow(&gdk, &d_dqkv, 2, (int64_t)H * Dh, (int64_t)KVH * Dh),
        0);
    ck_assert_int_eq(tr_tensor_narrow(&gdv, &d_dqkv, 2, (int64_t)(H + KVH) * Dh,
                                      (int64_t)KVH * Dh),
                     0);
    ck_assert_int_eq(tr_kern_attention_masked_fwd(&d_out, &d_lse, &gq, &gk, &gv,
                                                  H, KVH, d_dsp, window, shift),
                     0);
    ck_assert_int_eq(tr_kern_attention_masked_bwd(&gdq, &gdk, &gdv, &d_dout,
                                                  &gq, &gk, &gv, &d_out, &d_lse,
                                                  H, KVH, d_dsp, window, shift),
                     0);
    REL(&gq, &gk, &gv, &gdq, &gdk, &gdv);
  } else {
    ck_assert_int_eq(
        tr_kern_cuda_attention_fwd(dt, D(&d_out), D(&d_lse), base, base + ko,
                                   base + vo, B, T, H, KVH, Dh, W, W, maskp,
                                   NULL),
        0);
    tr_kern_cuda_set_attention(impl_bwd);
    ck_assert_int_eq(tr_kern_cuda_attention_bwd(
                         dt, dbase, dbase + ko, dbase + vo, D(&d_dout), base,
                         base + ko, base + vo, D(&d_out), D(&d_lse), B, T, H,
                         KVH, Dh, W, W, maskp, accumulate, NULL),
                     0);
  }
  ck_assert_int_eq(tr_kern_cuda_attention_bwd(
                       dt, dbase2, dbase2 + ko, dbase2 + vo, D(&d_dout), base,
                       base + ko, base + vo, D(&d_out), D(&d_lse), B, T, H, KVH,
                       Dh, W, W, maskp2, accumulate, NULL),
                   0);
  tr_kern_cuda_set_attention(impl);
  tr_tensor_t d_out2, d_lse2;
  ck_assert_int_eq(
      tr_tensor_empty(&d_out2, dt, GPU, 3, SH(B, T, (int64_t)H * Dh)), 0);
  ck_assert_int_eq(tr_tensor_empty(&d_lse2, TR_F32, GPU, 3, SH(B, H, T)), 0);
  ck_assert_int_eq(tr_kern_cuda_attention_fwd(dt, D(&d_out2), D(&d_lse2), base,
                                              base + ko, base + vo, B, T, H,
                                              KVH, Dh, W, W, maskp2, NULL),
                   0);
  ck_assert_msg(bits_equal(&d_out, &d_out2) && bits_equal(&d_lse, &d_lse2),
                "attention forward differs with the documents counted");
  REL(&d_out2, &d_lse2);
  tr_kern_cuda_set_attention(TR_CUDA_ATTN_AUTO);
  char iname[32];
  if (impl_bwd == impl)
    snprintf(iname, sizeof iname, "%s", impl_name(impl));
  else
    snprintf(iname, sizeof iname, "%s>%s", impl_name(impl),
             impl_name(impl_bwd));
  char what[128];
  double tol = tol_of(dt);
  snprintf(what, sizeof what,
           "attn_fwd %s B=%d T=%d H=%d/%d D=%d docs=%d shift=%d", iname, B, T,
           H, KVH, Dh, docs, shift);
  expect_close(what, &d_out, &out, tol);
  snprintf(what, sizeof what, "attn_fwd %s lse", iname);
  expect_lse_close(what, &d_lse, &lse, dt == TR_F32 ? TOL_F32 : 1e-3);
  /* the three gradients, compared slice by slice */
  tr_tensor_t h_d;
  tohost(&h_d, &d_dqkv);
  int64_t rows = (int64_t)B * T;
  int64_t offs[3] = {0, (int64_t)H * Dh, (int64_t)(H + KVH) * Dh};
  int64_t widths[3] = {(int64_t)H * Dh, (int64_t)KVH * Dh, (int64_t)KVH * Dh};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int s = 0; s < 3; s++) {
    float* y = malloc(sizeof(float) * (size_t)(rows * widths[s]));
    float* r = malloc(sizeof(float) * (size_t)(rows * widths[s]));
    for (int64_t i = 0; i < rows; i++) {
      memcpy(y + i * widths[s], F(&h_d) + i * W + offs[s],
             sizeof(float) * (size_t)widths[s]);
      memcpy(r + i * widths[s], F(&rdqkv) + i * W + offs[s],
             sizeof(float) * (size_t)widths[s]);
    }
    snprintf(what, sizeof what, "attn_bwd %s %s%s", iname, names[s],
             accumulate ? " (+=)" : " (=)");
    expect_host_close(what, tr_dtype_name(dt), y, r, rows * widths[s], tol);
    free(y);
    free(r);
  }
  ck_assert_msg(bits_equal(&d_dqkv, &d_dqkv2),
                "attention backward differs between runs (the second with "
                "the documents counted on the host)");
  REL(&qkv, &dqkv, &rdqkv, &dout, &out, &lse, &q, &k, &v, &dq, &dk, &dv, &d_qkv,
      &d_dqkv, &d_dout, &d_out, &d_lse, &d_dqkv2, &h_d, &ds, &d_ds);
}

static void run_attention_mixed(tr_dtype_t dt, tr_cuda_attn_impl_t impl,
                                tr_cuda_attn_impl_t impl_bwd, int B, int T,
                                int H, int KVH, int Dh, int accumulate) {
  run_attention_masked(dt, impl, impl_bwd, B, T, H, KVH, Dh, accumulate, 0, 0,
                       0);
}

static void run_attention(tr_dtype_t dt, tr_cuda_attn_impl_t impl, int B, int T,
                          int H, int KVH, int Dh, int accumulate) {
  run_attention_mixed(dt, impl, impl, B, T, H, KVH, Dh, accumulate);
}

START_TEST(test_attention_simt) {
  run_attention(TR_F32, TR_CUDA_ATTN_SIMT, 2, 100, 4, 2, 32, 1);
  run_attention(TR_F32, TR_CUDA_ATTN_SIMT, 1, 70, 2, 1, 16, 0);
  run_attention(TR_BF16, TR_CUDA_ATTN_SIMT, 2, 96, 4, 4, 64, 1);
  run_attention(TR_BF16, TR_CUDA_ATTN_SIMT, 1, 45, 4, 1, 128, 0);
}
END_TEST

/* document and sliding-window masks: SIMT (fp32, bf16) and flash (D 64,
 * 128), the tile skipping across 32- and 64-row tiles, each against the
 * CPU kernel with the same mask; cuDNN declines a window */
START_TEST(test_attention_masked) {
  tr_cuda_attn_impl_t S = TR_CUDA_ATTN_SIMT, F = TR_CUDA_ATTN_FLASH;
  run_attention_masked(TR_F32, S, S, 2, 150, 4, 2, 32, 0, 1, 0, 0);
  run_attention_masked(TR_F32, S, S, 1, 150, 2, 2, 16, 1, 0, 40, 0);
  run_attention_masked(TR_BF16, S, S, 2, 150, 4, 1, 64, 0, 1, 17, 0);
  run_attention_masked(TR_BF16, F, F, 2, 200, 4, 2, 64, 0, 1, 0, 0);
  run_attention_masked(TR_BF16, F, F, 2, 200, 4, 4, 64, 1, 0, 70, 0);
  run_attention_masked(TR_BF16, F, F, 1, 200, 4, 2, 128, 0, 1, 33, 0);
  run_attention_masked(TR_BF16, F, S, 1, 130, 2, 1, 64, 0, 1, 5, 0);
  tr_kern_attn_mask_t win = {.doc_start = NULL, .window = 8};
  tr_tensor_t d_x, d_o, d_l;
  ck_assert_int_eq(tr_tensor_zeros(&d_x, TR_BF16, GPU, 1, SH(2 * 16 * 64)), 0);
  ck_assert_int_eq(tr_tensor_zeros(&d_o, TR_BF16, GPU, 1, SH(2 * 16 * 64)), 0);
  ck_assert_int_eq(tr_tensor_zeros(&d_l, TR_F32, GPU, 1, SH(2 * 16)), 0);
  tr_kern_cuda_set_attention(TR_CUDA_ATTN_CUDNN);
  ck_assert_int_eq(
      tr_kern_cuda_attention_fwd(TR_BF16, D(&d_o), D(&d_l), D(&d_x), D(&d_x),
                                 D(&d_x), 2, 16, 1, 1, 64, 64, 64, &win, NULL),
      TR_EUNSUPPORTED);
  tr_kern_cuda_set_attention(TR_CUDA_ATTN_AUTO);
  REL(&d_x, &d_o, &d_l);
}
END_TEST

/* context parallelism's chunk pairs: the query rows stand at key
 * positions i + q_shift (a shift that is not a tile multiple, the chunk
 * length and twice it, a negative one), alone and composed with documents
 * and windows, GQA heads; rows that see no key (out 0, lse -inf) and key
 * tiles no row sees; a pair whose rows all see every key on cuDNN's full
 * graph (alone, and feeding or fed by the flash kernel); each against the
 * CPU kernel with the same mask */
START_TEST(test_attention_shifted) {
  tr_cuda_attn_impl_t S = TR_CUDA_ATTN_SIMT, F = TR_CUDA_ATTN_FLASH;
#ifdef HAVE_CUDNN
  tr_cuda_attn_impl_t C = TR_CUDA_ATTN_CUDNN;
  run_attention_masked(TR_BF16, C, C, 2, 200, 4, 2, 64, 0, 0, 0, 200);
  run_attention_masked(TR_BF16, C, C, 1, 128, 4, 4, 128, 1, 0, 0, 256);
  run_attention_masked(TR_BF16, C, F, 2, 128, 4, 2, 64, 0, 0, 0, 127);
  run_attention_masked(TR_BF16, F, C, 1, 96, 4, 1, 64, 1, 0, 0, 192);
#endif
  run_attention_masked(TR_F32, S, S, 2, 150, 4, 2, 32, 0, 0, 0, 37);
  run_attention_masked(TR_F32, S, S, 1, 150, 2, 2, 16, 1, 1, 0, 150);
  run_attention_masked(TR_F32, S, S, 2, 96, 4, 1, 32, 0, 1, 50, 96);
  run_attention_masked(TR_F32, S, S, 1, 150, 4, 2, 32, 1, 0, 0, -40);
  run_attention_masked(TR_BF16, S, S, 2, 150, 4, 1, 64, 0, 1, 200, 300);
  run_attention_masked(TR_BF16, S, S, 1, 128, 4, 4, 128, 1, 0, 0, 128);
  run_attention_masked(TR_BF16, F, F, 2, 200, 4, 2, 64, 0, 1, 0, 200);
  run_attention_masked(TR_BF16, F, F, 2, 200, 4, 4, 64, 1, 0, 70, 200);
  run_attention_masked(TR_BF16, F, F, 1, 200, 4, 2, 128, 0, 1, 33, 57);
  run_attention_masked(TR_BF16, F, F, 1, 128, 4, 2, 128, 1, 0, 0, 256);
  run_attention_masked(TR_BF16, F, F, 2, 200, 4, 2, 64, 0, 0, 250, 400);
  run_attention_masked(TR_BF16, F, F, 1, 200, 4, 2, 64, 0, 0, 0, -70);
  run_attention_masked(TR_BF16, F, S, 1, 130, 2, 1, 64, 0, 1, 5, 130);
  run_attention_masked(TR_BF16, S, F, 2, 128, 4, 2, 64, 1, 1, 0, 64);
}
END_TEST

/* attn_merge (context parallelism's log-sum-exp merge) against the CPU
 * table: fp32 accumulator, pout fp32 or bf16, rows where either side or
 * both have seen no key (lse -inf) */
static void run_attn_merge(tr_dtype_t dt) {
  int B = 2, T = 37, H = 3, Dh = 40;
  tr_tensor_t acc, lse, po, pl, racc, rlse, d_acc, d_lse, d_po, d_pl;
  hrand(&acc, TR_F32, 1.0, 3, SH(B, T, (int64_t)H * Dh));
  hrand(&po, dt, 1.0, 3, SH(B, T, (int64_t)H * Dh));
  hrand(&lse, TR_F32, 3.0, 3, SH(B, H, T));
  hrand(&pl, TR_F32, 3.0, 3, SH(B, H, T));
  for (int64_t i = 0; i < (int64_t)B * H * T; i++) {
    if (i % 5 == 0) F(&lse)[i] = -INFINITY;
    if (i % 7 == 0) F(&pl)[i] = -INFINITY;
  }
  hdup(&racc, &acc);
  hdup(&rlse, &lse);
  ck_assert_int_eq(tr_kern_attn_merge(&racc, &rlse, &po, &pl, H), 0);
  todev(&d_acc, &acc, TR_F32);
  todev(&d_lse, &lse, TR_F32);
  todev(&d_po, &po, dt);
  todev(&d_pl, &pl, TR_F32);
  ck_assert_int_eq(tr_kern_attn_merge(&d_acc, &d_lse, &d_po, &d_pl, H), 0);
  expect_close("attn_merge acc", &d_acc, &racc, TOL_F32);
  expect_lse_close("attn_merge lse", &d_lse, &rlse, TOL_F32);
  REL(&acc, &lse, &po, &pl, &racc, &rlse, &d_acc, &d_lse, &d_po, &d_pl);
}

START_TEST(test_attn_merge) {
  run_attn_merge(TR_F32);
  run_attn_merge(TR_BF16);
}
END_TEST

START_TEST(test_attention_flash) {
  run_attention(TR_BF16, TR_CUDA_ATTN_FLASH, 2, 200, 4, 4, 64, 1);
  run_attention(TR_BF16, TR_CUDA_ATTN_FLASH, 2, 256, 8, 2, 64, 0);
  run_attention(TR_BF16, TR_CUDA_ATTN_FLASH, 1, 130, 4, 2, 128, 1);
  run_attention(TR_BF16, TR_CUDA_ATTN_FLASH, 2, 64, 2, 1, 128, 0);
}
END_TEST

/* cuDNN's fused attention (TR_CUDA_ATTN_CUDNN fails instead of falling
 * back, so these prove cuDNN ran): GQA and MHA, D 64 and 128 (and 32),
 * T not a multiple of 64, q/k/v and their gradients as column slices of
 * fused buffers, += into random gradients and = over garbage. */
#ifdef HAVE_CUDNN
START_TEST(test_attention_cudnn) {
  run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 2, 200, 8, 2, 64, 1);
  run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 1, 200, 8, 2, 128, 0);
  run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 2, 128, 4, 4, 64, 0);
  run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 1, 77, 4, 1, 128, 1);
  run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 2, 96, 4, 2, 32, 1);
  /* [debug] deterministic: the backward graph that writes dQ directly
   * (the default above sums it with atomics) */
  tr_kern_cuda_set_deterministic(1, 0);
  run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 2, 200, 8, 2, 64, 1);
  run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 1, 77, 4, 1, 128, 1);
  tr_kern_cuda_set_deterministic(0, 0);
}
END_TEST

/* cuDNN's other engine configs (tr_kern_cuda_set_attn_config: the
 * heuristics' later configs, then knob variants of the first; a graph
 * without config k runs config 0): each computes the same attention, D 64
 * and 128, GQA and MQA, += and =, and documents (the ragged graph) */
START_TEST(test_attention_cudnn_configs) {
  for (int k = 1; k <= 6; k++) {
    tr_kern_cuda_set_attn_config(k);
    int64_t m0 = tr_kern_cuda_attn_config_misses();
    run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 2, 200, 8, 2, 64, 1);
    run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 1, 77, 4, 1, 128, 0);
    run_attention_masked(TR_BF16, TR_CUDA_ATTN_CUDNN, TR_CUDA_ATTN_CUDNN, 2,
                         160, 8, 2, 64, 0, 1, 0, 0);
    ck_assert_int_eq(tr_cuda_synchronize(), 0);
    /* which ran: each call builds a forward and a backward plan */
    printf("cudnn attention config %d: %lld plans had none, ran config 0\n", k,
           (long long)(tr_kern_cuda_attn_config_misses() - m0));
  }
  tr_kern_cuda_set_attn_config(-1);
}
END_TEST

/* cuDNN engine configs timed at first use (tr_kern_cuda_set_attn_tune):
 * the first calls time the candidates and still compute the right
 * result; after tr_kern_cuda_attn_tune_apply (the trainer's step begin)
 * each graph runs its fastest config, which computes it too */
START_TEST(test_attention_cudnn_tune) {
  tr_kern_cuda_set_attn_tune(4);
  int64_t t0 = 0, c0 = 0, t1 = 0, c1 = 0;
  tr_kern_cuda_attn_tune_stats(&t0, &c0);
  for (int pass = 0; pass < 2; pass++) {
    run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 2, 200, 8, 2, 64, 1);
    run_attention(TR_BF16, TR_CUDA_ATTN_CUDNN, 1, 77, 4, 1, 128, 0);
    run_attention_masked(TR_BF16, TR_CUDA_ATTN_CUDNN, TR_CUDA_ATTN_CUDNN, 2,
                         160, 8, 2, 64, 0, 1, 0, 0);
    ck_assert_int_eq(tr_cuda_synchronize(), 0);
    tr_kern_cuda_attn_tune_apply();
  }
  tr_kern_cuda_attn_tune_stats(&t1, &c1);
  printf("cudnn attention tuning: %lld graphs timed, %lld switched\n",
         (long long)(t1 - t0), (long long)(c1 - c0));
  ck_assert_msg(t1 > t0, "no cuDNN attention graph had a second config");
  tr_kern_cuda_set_attn_tune(-1);
}
END_TEST

/* document masks on cuDNN (each document a sequence of a ragged graph;
 * TR_CUDA_ATTN_CUDNN fails instead of falling back, so these prove it
 * ran): documents of 1 to 120 rows in every row, then with the last row
 * one document spanning it, and one document per row (the causal graph);
 * GQA, MQA and MHA, D 64 and 128, += and =; the atomic and (under
 * deterministic) the direct dQ graph; lse fed to and from the flash
 * kernel; each against the CPU kernel with the same mask */
START_TEST(test_attention_cudnn_docs) {
  tr_cuda_attn_impl_t C = TR_CUDA_ATTN_CUDNN, F = TR_CUDA_ATTN_FLASH;
  run_attention_masked(TR_BF16, C, C, 2, 300, 8, 2, 64, 1, 2, 0, 0);
  run_attention_masked(TR_BF16, C, C, 2, 200, 4, 1, 128, 0, 1, 0, 0);
  run_attention_masked(TR_BF16, C, C, 2, 256, 4, 4, 64, 0, 2, 0, 0);
  run_attention_masked(TR_BF16, C, C, 2, 130, 4, 2, 128, 1, 3, 0, 0);
  run_attention_masked(TR_BF16, C, F, 2, 300, 8, 2, 64, 0, 2, 0, 0);
  run_attention_masked(TR_BF16, F, C, 2, 200, 4, 2, 128, 1, 1, 0, 0);
}
END_TEST

/* The same through the direct-dQ graph ([debug] deterministic). */
START_TEST(test_attention_cudnn_docs_det) {
  tr_cuda_attn_impl_t C = TR_CUDA_ATTN_CUDNN;
  tr_kern_cuda_set_deterministic(1, 0);
  run_attention_masked(TR_BF16, C, C, 2, 300, 8, 2, 64, 1, 2, 0, 0);
  run_attention_masked(TR_BF16, C, C, 2, 200, 4, 4, 128, 0, 1, 0, 0);
  tr_kern_cuda_set_deterministic(0, 0);
}
END_TEST

/* lse of cuDNN's forward and of the other kernels is the same quantity
 * (natural-log log-sum-exp): each backward accepts the other's forward. */
START_TEST(test_attention_cudnn_mixed) {
  run_attention_mixed(TR_BF16, TR_CUDA_ATTN_CUDNN, TR_CUDA_ATTN_FLASH, 2, 200,
                      8, 2, 64, 1);
  run_attention_mixed(TR_BF16, TR_CUDA_ATTN_FLASH, TR_CUDA_ATTN_CUDNN, 1, 130,
                      4, 2, 128, 0);
  run_attention_mixed(TR_BF16, TR_CUDA_ATTN_CUDNN, TR_CUDA_ATTN_SIMT, 1, 70, 4,
                      4, 64, 1);
}
END_TEST
#endif /* HAVE_CUDNN */

/* Without cuDNN, or for what cuDNN cannot take (fp32 here), an explicit
 * TR_CUDA_ATTN_CUDNN is an error and AUTO still runs. */
START_TEST(test_attention_cudnn_unsupported) {
  int64_t n = 2 * 16 * 64;
  tr_tensor_t d_x, d_o, d_l;
  ck_assert_int_eq(tr_tensor_zeros(&d_x, TR_F32, GPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_tensor_zeros(&d_o, TR_F32, GPU, 1, SH(n)), 0);
  ck_assert_int_eq(tr_tensor_zeros(&d_l, TR_F32, GPU, 1, SH(2 * 16)), 0);
  tr_kern_cuda_set_attention(TR_CUDA_ATTN_CUDNN);
  ck_assert_int_eq(tr_kern_cuda_get_attention(), TR_CUDA_ATTN_CUDNN);
  ck_assert_int_eq(
      tr_kern_cuda_attention_fwd(TR_F32, D(&d_o), D(&d_l), D(&d_x), D(&d_x),
                                 D(&d_x), 2, 16, 1, 1, 64, 64, 64, NULL, NULL),
      TR_EUNSUPPORTED);
  tr_kern_cuda_set_attention(TR_CUDA_ATTN_AUTO);
  ck_assert_int_eq(
      tr_kern_cuda_attention_fwd(TR_F32, D(&d_o), D(&d_l), D(&d_x), D(&d_x),
                                 D(&d_x), 2, 16, 1, 1, 64, 64, 64, NULL, NULL),
      0);
  REL(&d_x, &d_o, &d_l);
}
END_TEST

/* ---- optimizer and norms ---- */

START_TEST(test_adamw_table) {
  const int64_t n = 100001;
  tr_tensor_t p, g, m, v, dp, dg, dm, dv;
  hrand(&p, TR_F32, 1.0, 1, SH(n));
  hrand(&g, TR_F32, 1.0, 1, SH(n));
  hrand(&m, TR_F32, 0.1, 1, SH(n));
  hrand(&v, TR_F32, 0.1, 1, SH(n));
  for (int64_t i = 0; i < n; i++) F(&v)[i] = fabsf(F(&v)[i]);
  todev(&dp, &p, TR_F32);
  todev(&dg, &g, TR_F32);
  todev(&dm, &m, TR_F32);
  todev(&dv, &v, TR_F32);
  tr_adamw_args_t a = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 7};
  ck_assert_int_eq(tr_kern_adamw(&p, &g, &m, &v, &a), 0);
  ck_assert_int_eq(tr_kern_adamw(&dp, &dg, &dm, &dv, &a), 0);
  expect_close("adamw param", &dp, &p, TOL_F32);
  expect_close("adamw m", &dm, &m, TOL_F32);
  expect_close("adamw v", &dv, &v, TOL_F32);
  REL(&p, &g, &m, &v, &dp, &dg, &dm, &dv);
}
END_TEST

/* several tensors in one call, a device-side gradient factor, the bf16
 * copy, and decay on some tensors only */
START_TEST(test_adamw_multi) {
  enum { NT = 60 }; /* more than one launch's table */
  tr_tensor_t p[NT], g[NT], m[NT], v[NT], dp[NT], dg[NT], dm[NT], dv[NT],
      pb[NT];
  tr_cuda_adamw_tensor_t list[NT];
  tr_adamw_args_t a = {3e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 1.0f, 3};
  float factor = 0.37f;
  tr_tensor_t hf, df;
  ck_assert_int_eq(
      tr_tensor_wrap(&hf, &factor, TR_F32, TR_DEVICE_CPU, 1, SH(1)), 0);
  todev(&df, &hf, TR_F32);
  for (int i = 0; i < NT; i++) {
    int64_t n = i == 3 ? 300000 : 17 + 977 * i;
    hrand(&p[i], TR_F32, 1.0, 1, SH(n));
    hrand(&g[i], TR_F32, 1.0, 1, SH(n));
    hrand(&m[i], TR_F32, 0.1, 1, SH(n));
    hrand(&v[i], TR_F32, 0.1, 1, SH(n));
    for (int64_t j = 0; j < n; j++) F(&v[i])[j] = fabsf(F(&v[i])[j]);
    todev(&dp[i], &p[i], TR_F32);
    todev(&dg[i], &g[i], TR_F32);
    todev(&dm[i], &m[i], TR_F32);
    todev(&dv[i], &v[i], TR_F32);
    ck_assert_int_eq(tr_tensor_empty(&pb[i], TR_BF16, GPU, 1, SH(n)), 0);
    list[i] = (tr_cuda_adamw_tensor_t){
        D(&dp[i]), D(&dg[i]), D(&dm[i]), D(&dv[i]), D(&pb[i]), n, i % 2};
    tr_adamw_args_t ai = a;
    ai.grad_scale = factor;
    ai.weight_decay = i % 2 ? a.weight_decay : 0.0f;
    ck_assert_int_eq(tr_kern_adamw(&p[i], &g[i], &m[i], &v[i], &ai), 0);
  }
  ck_assert_int_eq(tr_kern_cuda_adamw(list, NT, &a, D(&df), NULL), 0);
  double worst = 0;
  for (int i = 0; i < NT; i++) {
    tr_tensor_t hp, hb;
    tohost(&hp, &dp[i]);
    tohost(&hb, &pb[i]);
    int64_t n = tr_tensor_numel(&p[i]);
    double e = relerr(F(&hp), F(&p[i]), n);
    worst = e > worst ? e : worst;
    for (int64_t j = 0; j < n; j++)
      ck_assert_float_eq(F(&hb)[j], rb(F(&hp)[j]));
    REL(&hp, &hb);
  }
  printf("%-44s %-8s rel_err %.3e  tol %.0e  %s\n",
         "adamw multi-tensor (60) + bf16 copy", "float32", worst, TOL_F32,
         worst <= TOL_F32 ? "ok" : "FAIL");
  ck_assert(worst <= TOL_F32);
  for (int i = 0; i < NT; i++)
    REL(&p[i], &g[i], &m[i], &v[i], &dp[i], &dg[i], &dm[i], &dv[i], &pb[i]);
  REL(&hf, &df);
}
END_TEST

/* The step's end on the device (what the trainer runs on CUDA without
 * FSDP, TP or PP) against the host path it replaces: the norm read back,
 * clipped on the host, tr_kern_adamw_multi. Same bits: the squared norm,
 * the losses' sum, weights, moments and the bf16 copies; the losses are
 * zeroed; without clipping too. */
START_TEST(test_step_tail) {
  enum { NT = 7, NL = 4099 };
  for (int round = 0; round < 2; round++) {
    tr_tensor_t h[NT], p[2][NT], g[NT], m[2][NT], v[2][NT], b[2][NT];
    tr_kern_adamw_set_t sets[2][NT];
    const tr_tensor_t* gl[NT];
    for (int i = 0; i < NT; i++) {
      int64_t n = 1 + 4093 * i;
      hrand(&h[i], TR_F32, 1.0, 1, SH(n));
      todev(&g[i], &h[i], TR_F32);
      gl[i] = &g[i];
      for (int k = 0; k < 2; k++) {
        todev(&p[k][i], &h[i], TR_F32);
        todev(&m[k][i], &h[i], TR_F32);
        ck_assert_int_eq(tr_kern_scale(&m[k][i], 0.1f), 0);
        todev(&v[k][i], &h[i], TR_F32);
        ck_assert_int_eq(tr_kern_scale(&v[k][i], 0.0f), 0);
        ck_assert_int_eq(tr_tensor_empty(&b[k][i], TR_BF16, GPU, 1, SH(n)), 0);
        sets[k][i] = (tr_kern_adamw_set_t){&p[k][i], &g[i],    &m[k][i],
                                           &v[k][i], &b[k][i], i % 2};
      }
    }
    tr_tensor_t hl, dl[2];
    hrand(&hl, TR_F32, 3.0, 2, SH(1, NL));
    todev(&dl[0], &hl, TR_F32);
    todev(&dl[1], &hl, TR_F32);
    tr_adamw_args_t a = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 5};
    /* the host path */
    double sq = 0;
    ck_assert_int_eq(tr_kern_sum_squares_multi(gl, NT, &sq), 0);
    double max_norm = round == 0 ? 0.5 * sqrt(sq) : 0.0;
    double clip = max_norm > 0 ? tr_kern_clip_coef(sqrt(sq), max_norm) : 1.0;
    tr_adamw_args_t ah = a;
    ah.grad_scale = (float)clip;
    ck_assert_int_eq(tr_kern_adamw_multi(sets[0], NT, &ah), 0);
    tr_tensor_t l0;
    tohost(&l0, &dl[0]);
    double lsum = 0;
    for (int j = 0; j < NL; j++) lsum += F(&l0)[j];
    /* the device's */
    double sq1 = -1, lsum1 = -1;
    ck_assert_int_eq(
        tr_kern_step_tail(sets[1], NT, &a, gl, NT, max_norm, &dl[1]), 0);
    ck_assert_int_eq(tr_kern_step_tail_wait(TR_DEV_CUDA, &sq1, &lsum1), 0);
    ck_assert(sq1 == sq);
    ck_assert(lsum1 == lsum);
    ck_assert_int_eq(tr_kern_step_tail_wait(TR_DEV_CUDA, &sq1, &lsum1),
                     TR_EINVAL); /* nothing pending */
    for (int i = 0; i < NT; i++) {
      ck_assert_msg(bits_equal(&p[0][i], &p[1][i]), "param %d", i);
      ck_assert_msg(bits_equal(&m[0][i], &m[1][i]), "m %d", i);
      ck_assert_msg(bits_equal(&v[0][i], &v[1][i]), "v %d", i);
      ck_assert_msg(bits_equal(&b[0][i], &b[1][i]), "bf16 copy %d", i);
    }
    tr_tensor_t l1;
    tohost(&l1, &dl[1]);
    for (int j = 0; j < NL; j++) ck_assert(F(&l1)[j] == 0.0f);
    printf("%-44s %-8s %s\n",
           round == 0 ? "step tail (clipped) = host path"
                      : "step tail (no clipping) = host path",
           "float32", "bits ok");
    for (int i = 0; i < NT; i++)
      REL(&h[i], &g[i], &p[0][i], &p[1][i], &m[0][i], &m[1][i], &v[0][i],
          &v[1][i], &b[0][i], &b[1][i]);
    REL(&hl, &dl[0], &dl[1], &l0, &l1);
  }
  tr_kern_step_tail_release(TR_DEV_CUDA);
}
END_TEST

START_TEST(test_grad_norm) {
  /* through the table: one tensor */
  tr_tensor_t x, dx;
  hrand(&x, TR_F32, 2.0, 1, SH(1000003));
  todev(&dx, &x, TR_F32);
  double ref = 0, got = 0;
  ck_assert_int_eq(tr_kern_sum_squares(&x, &ref), 0);
  ck_assert_int_eq(tr_kern_sum_squares(&dx, &got), 0);
  expect_host_close("sum_squares (table)", "float32", (float[]){(float)got},
                    (float[]){(float)ref}, 1, 1e-6);
  /* spans of both dtypes, then the clipping factor, on the device */
  enum { NS = 70 };
  tr_tensor_t h[NS], d[NS];
  tr_cuda_span_t spans[NS];
  double want = 0;
  for (int i = 0; i < NS; i++) {
    tr_dtype_t dt = i % 3 ? TR_F32 : TR_BF16;
    hrand(&h[i], dt, 1.0, 1, SH(1 + 3001 * i));
    todev(&d[i], &h[i], dt);
    ck_assert_int_eq(tr_kern_sum_squares(&h[i], &want), 0);
    spans[i] = (tr_cuda_span_t){D(&d[i]), dt, tr_tensor_numel(&h[i])};
  }
  /* the device double travels as 8 raw bytes (there is no float64 dtype) */
  tr_tensor_t dsum, dfac, dnorm;
  ck_assert_int_eq(tr_tensor_empty(&dsum, TR_I64, GPU, 1, SH(1)), 0);
  ck_assert_int_eq(tr_tensor_empty(&dfac, TR_F32, GPU, 1, SH(1)), 0);
  ck_assert_int_eq(tr_tensor_empty(&dnorm, TR_F32, GPU, 1, SH(1)), 0);
  ck_assert_int_eq(tr_kern_cuda_sum_squares(D(&dsum), spans, NS, NULL), 0);
  float max_norm = (float)(0.5 * sqrt(want));
  ck_assert_int_eq(
      tr_kern_cuda_clip_factor(D(&dfac), D(&dnorm), D(&dsum), max_norm, NULL),
      0);
  double hsum;
  tr_tensor_t hs, hfac, hnorm;
  ck_assert_int_eq(tr_tensor_wrap(&hs, &hsum, TR_I64, TR_DEVICE_CPU, 1, SH(1)),
                   0);
  ck_assert_int_eq(tr_tensor_copy(&hs, &dsum), 0);
  tohost(&hfac, &dfac);
  tohost(&hnorm, &dnorm);
  expect_host_close("sum_squares multi-span (70, f32+bf16)", "mixed",
                    (float[]){(float)hsum}, (float[]){(float)want}, 1, 1e-6);
  float coef = (float)tr_kern_clip_coef(sqrt(want), max_norm);
  expect_host_close("clip factor (device)", "float32", F(&hfac), &coef, 1,
                    1e-6);
  expect_host_close("grad norm (device)", "float32", F(&hnorm),
                    (float[]){(float)sqrt(want)}, 1, 1e-6);
  for (int i = 0; i < NS; i++) REL(&h[i], &d[i]);
  REL(&x, &dx, &dsum, &dfac, &dnorm, &hs, &hfac, &hnorm);
}
END_TEST

static void gemm_heuristic_only(void) { tr_kern_cuda_set_gemm_tune(1); }

static Suite* cuda_suite(void) {
  Suite* s = suite_create("kernels_cuda");
  TCase* tc = tcase_create("ops");
  tcase_set_timeout(tc, 120);
  /* each test (a forked process) with the heuristic's GEMM picks: the
   * bit-equality checks repeat GEMMs; test_gemm_tune turns timing on */
  tcase_add_checked_fixture(tc, gemm_heuristic_only, NULL);
  tcase_add_test(tc, test_table_registered);
  tcase_add_test(tc, test_gemm_tune);
  tcase_add_test(tc, test_elementwise);
  tcase_add_test(tc, test_convert);
  tcase_add_test(tc, test_activations);
  tcase_add_test(tc, test_layernorm);
  tcase_add_test(tc, test_rmsnorm);
  tcase_add_test(tc, test_cublaslt_loaded_by_gemm);
  tcase_add_test(tc, test_gemm);
  tcase_add_test(tc, test_linear);
  tcase_add_test(tc, test_mlp_gelu_epilogues);
  tcase_add_test(tc, test_linear_gelu_table);
  tcase_add_test(tc, test_residual_norm_table);
  tcase_add_test(tc, test_linear_bwd_write);
  tcase_add_test(tc, test_linear_batched);
  tcase_add_test(tc, test_swiglu_bwd_write);
  tcase_add_test(tc, test_rope);
  tcase_add_test(tc, test_embedding);
  tcase_add_test(tc, test_embedding_bad_token);
  tcase_add_test(tc, test_xent_table);
  tcase_add_test(tc, test_vocab_parallel);
  tcase_add_test(tc, test_classifier);
  tcase_add_test(tc, test_attention_simt);
  tcase_add_test(tc, test_attention_flash);
  tcase_add_test(tc, test_attention_shifted);
  tcase_add_test(tc, test_attn_merge);
  tcase_add_test(tc, test_attention_masked);
#ifdef HAVE_CUDNN
  tcase_add_test(tc, test_attention_cudnn);
  tcase_add_test(tc, test_attention_cudnn_configs);
  tcase_add_test(tc, test_attention_cudnn_tune);
  tcase_add_test(tc, test_attention_cudnn_mixed);
  tcase_add_test(tc, test_attention_cudnn_docs_det);
  tcase_add_test(tc, test_attention_cudnn_docs);
#endif
  tcase_add_test(tc, test_attention_cudnn_unsupported);
  tcase_add_test(tc, test_adamw_table);
  tcase_add_test(tc, test_adamw_multi);
  tcase_add_test(tc, test_step_tail);
  tcase_add_test(tc, test_grad_norm);
  suite_add_tcase(s, tc);
  return s;
}

/* Whether a GPU is there, asked in a child: CUDA must not be initialized in
 * the parent, which forks every test. */
static int have_gpu(void) {
  pid_t pid = fork();
  if (pid < 0) return 0;
  if (pid == 0) _exit(tr_cuda_device_count() > 0 ? 0 : 1);
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* linked, cuBLASLt would cost every process (launcher, daemon, CPU
   * workers) its load time: it must be loaded by the first GEMM only */
  if (maps_have("libcublasLt.so") != 0) {
    printf("libcublasLt is mapped before any GEMM (or no /proc/self/maps)\n");
    return 1;
  }
  if (!have_gpu()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  SRunner* sr = srunner_create(cuda_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}

#else /* !HAVE_CUDA */

int main(void) {
  printf("built without CUDA: skipped\n");
  return 77;
}

#endif
