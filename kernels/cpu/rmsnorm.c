/* kernels/cpu/rmsnorm.c: RMSNorm (Llama) over the last dim, forward (saving
 * 1/rms per row, optionally after the residual add that precedes it) and
 * backward; same two-pass split as layernorm.c. */
#include "config.h"

#include <math.h>

#include "kernels/cpu/cpu.h"

#define ROWS 16
#define COLS 64

typedef struct {
  float* out;
  float* resid; /* residual variant: resid = inp + b_in, normalised */
  const float* b_in;
  float* rstd;
  float* dinp;
  float* dw;
  const float* dout;
  const float* inp;
  const float* w;
  const float* crstd;
  int64_t N;
  int C;
  float eps;
} rms_t;

static void rms_fwd_task(void* ctx, int64_t task) {
  const rms_t* a = ctx;
  int64_t r1 = (task + 1) * ROWS < a->N ? (task + 1) * ROWS : a->N;
  for (int64_t r = task * ROWS; r < r1; r++) {
    const float* x = a->inp + r * a->C;
    if (a->resid) { /* the add of tr__cpu_add, row by row */
      float* y = a->resid + r * a->C;
      const float* b = a->b_in + r * a->C;
      for (int c = 0; c < a->C; c++) y[c] = x[c] + b[c];
      x = y;
    }
    double ss = 0.0;
    for (int c = 0; c < a->C; c++) ss += (double)x[c] * x[c];
    float rs = (float)(1.0 / sqrt(ss / a->C + a->eps));
    float* o = a->out + r * a->C;
    for (int c = 0; c < a->C; c++) o[c] = x[c] * rs * a->w[c];
    a->rstd[r] = rs;
  }
}

int tr__cpu_rmsnorm_fwd(float* out, float* rstd, const float* inp,
                        const float* w, int64_t N, int C, float eps) {
  rms_t a = {
      .out = out, .rstd = rstd, .inp = inp, .w = w, .N = N, .C = C, .eps = eps};
  tr__cpu_parallel(tr__cpu_ntasks(N, ROWS), rms_fwd_task, &a);
  return 0;
}

int tr__cpu_residual_rmsnorm_fwd(float* resid, float* out, float* rstd,
                                 const float* a, const float* b_in,
                                 const float* w, int64_t N, int C, float eps) {
  rms_t t = {.out = out,
             .resid = resid,
             .b_in = b_in,
             .rstd = rstd,
             .inp = a,
             .w = w,
             .N = N,
             .C = C,
             .eps = eps};
  tr__cpu_parallel(tr__cpu_ntasks(N, ROWS), rms_fwd_task, &t);
  return 0;
}

/* y = x r w with r = (mean(x^2) + eps)^-1/2:
 * dx = r (dn - n mean(dn n)), n = x r, dn = dy w. */
static void rms_bwd_rows_task(void* ctx, int64_t task) {
  const rms_t* a = ctx;
  int64_t r1 = (task + 1) * ROWS < a->N ? (task + 1) * ROWS : a->N;
  for (int64_t r = task * ROWS; r < r1; r++) {
    const float* x = a->inp + r * a->C;
    const float* d = a->dout + r * a->C;
    float rs = a->crstd[r];
    double sdn = 0.0;
    for (int c = 0; c < a->C; c++)
      sdn += (double)(d[c] * a->w[c]) * (x[c] * rs);
    float mdn = (float)(sdn / a->C);
    float* di = a->dinp + r * a->C;
    for (int c = 0; c < a->C; c++)
      di[c] += (d[c] * a->w[c] - x[c] * rs * mdn) * rs;
  }
}

static void rms_bwd_cols_task(void* ctx, int64_t task) {
  const rms_t* a = ctx;
  int c0 = (int)task * COLS, c1 = c0 + COLS < a->C ? c0 + COLS : a->C;
  float gw[COLS] = {0};
  for (int64_t r = 0; r < a->N; r++) {
    const float* x = a->inp + r * a->C;
    const float* d = a->dout + r * a->C;
    float rs = a->crstd[r];
    for (int c = c0; c < c1; c++) gw[c - c0] += d[c] * (x[c] * rs);
  }
  for (int c = c0; c < c1; c++) a->dw[c] += gw[c - c0];
}

int tr__cpu_rmsnorm_bwd(float* dinp, float* dw, const float* dout,
                        const float* inp, const float* w, const float* rstd,
                        int64_t N, int C) {
  rms_t a = {.dinp = dinp,
             .dw = dw,
             .dout = dout,
             .inp = inp,
             .w = w,
             .crstd = rstd,
             .N = N,
             .C = C};
  if (dinp) tr__cpu_parallel(tr__cpu_ntasks(N, ROWS), rms_bwd_rows_task, &a);
  if (dw) tr__cpu_parallel(tr__cpu_ntasks(C, COLS), rms_bwd_cols_task, &a);
  return 0;
}
