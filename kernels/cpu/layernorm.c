/* kernels/cpu/layernorm.c: LayerNorm over the last dim, forward (saving
 * mean and 1/std per row, optionally after the residual add that precedes
 * it) and backward. Row statistics are summed in
 * double. The backward makes two passes: rows for the input gradient,
 * channel slices for the weight and bias gradients (each summed by one task
 * over the rows in order). */
#include "config.h"

#include <math.h>

#include "kernels/cpu/cpu.h"

#define ROWS 16
#define COLS 64

typedef struct {
  float* out;
  float* resid; /* residual variant: resid = inp + b_in, normalised */
  const float* b_in;
  float* mean;
  float* rstd;
  float* dinp;
  float* dw;
  float* db;
  const float* dout;
  const float* inp;
  const float* w;
  const float* b;
  const float* cmean;
  const float* crstd;
  int64_t N;
  int C;
  float eps;
} ln_t;

static void ln_fwd_task(void* ctx, int64_t task) {
  const ln_t* a = ctx;
  int64_t r1 = (task + 1) * ROWS < a->N ? (task + 1) * ROWS : a->N;
  for (int64_t r = task * ROWS; r < r1; r++) {
    const float* x = a->inp + r * a->C;
    if (a->resid) { /* the add of tr__cpu_add, row by row */
      float* y = a->resid + r * a->C;
      const float* b = a->b_in + r * a->C;
      for (int c = 0; c < a->C; c++) y[c] = x[c] + b[c];
      x = y;
    }
    double s = 0.0;
    for (int c = 0; c < a->C; c++) s += x[c];
    double m = s / a->C, v = 0.0;
    for (int c = 0; c < a->C; c++) v += (x[c] - m) * (x[c] - m);
    float mf = (float)m;
    float rs = (float)(1.0 / sqrt(v / a->C + a->eps));
    float* o = a->out + r * a->C;
    for (int c = 0; c < a->C; c++) {
      float n = (x[c] - mf) * rs;
      o[c] = n * a->w[c] + (a->b ? a->b[c] : 0.0f);
    }
    a->mean[r] = mf;
    a->rstd[r] = rs;
  }
}

int tr__cpu_layernorm_fwd(float* out, float* mean, float* rstd,
                          const float* inp, const float* w, const float* b,
                          int64_t N, int C, float eps) {
  ln_t a = {.out = out,
            .mean = mean,
            .rstd = rstd,
            .inp = inp,
            .w = w,
            .b = b,
            .N = N,
            .C = C,
            .eps = eps};
  tr__cpu_parallel(tr__cpu_ntasks(N, ROWS), ln_fwd_task, &a);
  return 0;
}

int tr__cpu_residual_layernorm_fwd(float* resid, float* out, float* mean,
                                   float* rstd, const float* a,
                                   const float* b_in, const float* w,
                                   const float* b, int64_t N, int C,
                                   float eps) {
  ln_t t = {.out = out,
            .resid = resid,
            .b_in = b_in,
            .mean = mean,
            .rstd = rstd,
            .inp = a,
            .w = w,
            .b = b,
            .N = N,
            .C = C,
            .eps = eps};
  tr__cpu_parallel(tr__cpu_ntasks(N, ROWS), ln_fwd_task, &t);
  return 0;
}

static void ln_bwd_rows_task(void* ctx, int64_t task) {
  const ln_t* a = ctx;
  int64_t r1 = (task + 1) * ROWS < a->N ? (task + 1) * ROWS : a->N;
  for (int64_t r = task * ROWS; r < r1; r++) {
    const float* x = a->inp + r * a->C;
    const float* d = a->dout + r * a->C;
    float m = a->cmean[r], rs = a->crstd[r];
    double sd = 0.0, sdn = 0.0;
    for (int c = 0; c < a->C; c++) {
      float n = (x[c] - m) * rs;
      float dn = d[c] * a->w[c];
      sd += dn;
      sdn += (double)dn * n;
    }
    float md = (float)(sd / a->C), mdn = (float)(sdn / a->C);
    float* di = a->dinp + r * a->C;
    for (int c = 0; c < a->C; c++) {
      float n = (x[c] - m) * rs;
      float dn = d[c] * a->w[c];
      di[c] += (dn - md - n * mdn) * rs;
    }
  }
}

static void ln_bwd_cols_task(void* ctx, int64_t task) {
  const ln_t* a = ctx;
  int c0 = (int)task * COLS, c1 = c0 + COLS < a->C ? c0 + COLS : a->C;
  float gw[COLS] = {0}, gb[COLS] = {0};
  for (int64_t r = 0; r < a->N; r++) {
    const float* x = a->inp + r * a->C;
    const float* d = a->dout + r * a->C;
    float m = a->cmean[r], rs = a->crstd[r];
    for (int c = c0; c < c1; c++) {
      gw[c - c0] += d[c] * ((x[c] - m) * rs);
      gb[c - c0] += d[c];
    }
  }
  for (int c = c0; c < c1; c++) {
    if (a->dw) a->dw[c] += gw[c - c0];
    if (a->db) a->db[c] += gb[c - c0];
  }
}

int tr__cpu_layernorm_bwd(float* dinp, float* dw, float* db, const float* dout,
                          const float* inp, const float* w, const float* mean,
                          const float* rstd, int64_t N, int C) {
  ln_t a = {.dinp = dinp,
            .dw = dw,
            .db = db,
            .dout = dout,
            .inp = inp,
            .w = w,
            .cmean = mean,
            .crstd = rstd,
            .N = N,
            .C = C};
  if (dinp) tr__cpu_parallel(tr__cpu_ntasks(N, ROWS), ln_bwd_rows_task, &a);
  if (dw || db) tr__cpu_parallel(tr__cpu_ntasks(C, COLS), ln_bwd_cols_task, &a);
  return 0;
}
