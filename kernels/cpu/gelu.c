/* kernels/cpu/gelu.c: GELU with the tanh approximation (GPT-2's gelu_new),
 * forward and backward, elementwise in fixed-size chunks. */
#include "config.h"

#include <math.h>

#include "kernels/cpu/cpu.h"

#define CHUNK 16384
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

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
  for (int64_t i = task * CHUNK; i < i1; i++) {
    float x = a->inp[i];
    float u = GELU_K * (x + GELU_C * x * x * x);
    float th = tanhf(u);
    float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    a->out[i] += a->dout[i] * g;
  }
}

int tr__cpu_gelu_bwd(float* dinp, const float* dout, const float* inp,
                     int64_t n) {
  gelu_t a = {dinp, dout, inp, n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), gelu_bwd_task, &a);
  return 0;
}
