/* kernels/cpu/gelu.c: GELU with the tanh approximation (GPT-2's gelu_new),
 * forward and backward, elementwise in fixed-size chunks, and the linear
 * layers fused with it (linear_gelu_fwd, linear_dgelu_bwd), which run the
 * same linear and GELU code so their bits equal the separate calls'. */
#include "config.h"

#include <math.h>

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"

#define CHUNK 16384
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* d gelu(x) / dx, shared by every backward here so their bits agree */
static inline float gelu_grad(float x) {
  float u = GELU_K * (x + GELU_C * x * x * x);
  float th = tanhf(u);
  float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

typedef struct {
  float* out;
  const float* dout;
  const float* inp;
  int64_t n;
} gelu_t;

static void gelu_fwd_task(void* ctx, int64_t task) {
  const gelu_t* a = ctx;
  int64_t i1 = (task + 1) * CHUNK < a->n ? (task + 1) * CHUNK : a->n;
  for (int64_t i = task * CHUNK; i < i1; i++) {
    float x = a->inp[i];
    float u = GELU_K * (x + GELU_C * x * x * x);
    a->out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

int tr__cpu_gelu_fwd(float* out, const float* inp, int64_t n) {
  gelu_t a = {out, NULL, inp, n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), gelu_fwd_task, &a);
  return 0;
}

static void gelu_bwd_task(void* ctx, int64_t task) {
  const gelu_t* a = ctx;
  int64_t i1 = (task + 1) * CHUNK < a->n ? (task + 1) * CHUNK : a->n;
  for (int64_t i = task * CHUNK; i < i1; i++)
    a->out[i] += a->dout[i] * gelu_grad(a->inp[i]);
}

int tr__cpu_gelu_bwd(float* dinp, const float* dout, const float* inp,
                     int64_t n) {
  gelu_t a = {dinp, dout, inp, n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), gelu_bwd_task, &a);
  return 0;
}

/* out[i] = 0 + out[i] * gelu'(inp[i]) in place: the value gelu_bwd_task
 * adds to a zeroed buffer (the 0 + keeps a -0 product a +0, as there) */
static void dgelu_inplace_task(void* ctx, int64_t task) {
  const gelu_t* a = ctx;
  int64_t i1 = (task + 1) * CHUNK < a->n ? (task + 1) * CHUNK : a->n;
  for (int64_t i = task * CHUNK; i < i1; i++) {
    float d = a->out[i];
    a->out[i] = 0.0f + d * gelu_grad(a->inp[i]);
  }
}

int tr__cpu_linear_gelu_fwd(float* out, float* pre, const float* inp,
                            const float* w, const float* bias, int64_t N,
                            int IC, int OC) {
  TR_CHECK(tr__cpu_linear_fwd(pre, inp, w, bias, N, IC, OC, OC));
  return tr__cpu_gelu_fwd(out, pre, N * OC);
}

int tr__cpu_linear_dgelu_bwd(float* dinp, float* dw, float* dbias,
                             const float* dout, const float* inp,
                             const float* w, const float* pre, int64_t N,
                             int IC, int OC) {
  /* dinp = dout w as linear_bwd accumulates it into a zeroed buffer, then
   * scaled by gelu'(pre) in place */
  TR_CHECK(tr__cpu_zero(dinp, N * IC));
  TR_CHECK(tr__cpu_linear_bwd(dinp, dw, dbias, dout, inp, w, N, IC, OC, OC));
  gelu_t a = {dinp, NULL, pre, N * IC};
  tr__cpu_parallel(tr__cpu_ntasks(N * IC, CHUNK), dgelu_inplace_task, &a);
  return 0;
}
