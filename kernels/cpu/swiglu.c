/* kernels/cpu/swiglu.c: SwiGLU (Llama's MLP gate), out = silu(gate) * up,
 * forward and backward (accumulating or overwriting), elementwise in
 * fixed-size chunks. */
#include "config.h"

#include <math.h>

#include "kernels/cpu/cpu.h"

#define CHUNK 16384

typedef struct {
  float* out;
  float* dgate;
  float* dup;
  const float* dout;
  const float* gate;
  const float* up;
  int64_t n;
  int acc; /* backward: += into dgate, dup (else overwrite them) */
} swiglu_t;

static void swiglu_fwd_task(void* ctx, int64_t task) {
  const swiglu_t* a = ctx;
  int64_t i1 = (task + 1) * CHUNK < a->n ? (task + 1) * CHUNK : a->n;
  for (int64_t i = task * CHUNK; i < i1; i++) {
    float g = a->gate[i];
    a->out[i] = g / (1.0f + expf(-g)) * a->up[i];
  }
}

int tr__cpu_swiglu_fwd(float* out, const float* gate, const float* up,
                       int64_t n) {
  swiglu_t a = {.out = out, .gate = gate, .up = up, .n = n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), swiglu_fwd_task, &a);
  return 0;
}

/* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g) */
static void swiglu_bwd_task(void* ctx, int64_t task) {
  const swiglu_t* a = ctx;
  int64_t i1 = (task + 1) * CHUNK < a->n ? (task + 1) * CHUNK : a->n;
  for (int64_t i = task * CHUNK; i < i1; i++) {
    float g = a->gate[i], u = a->up[i], d = a->dout[i];
    float s = 1.0f / (1.0f + expf(-g));
    /* overwrite: the bits of += into zeros (0 + x, sign of zero too) */
    float g0 = a->acc ? a->dgate[i] : 0.0f, u0 = a->acc ? a->dup[i] : 0.0f;
    a->dgate[i] = g0 + d * u * s * (1.0f + g * (1.0f - s));
    a->dup[i] = u0 + d * g * s;
  }
}

int tr__cpu_swiglu_bwd(float* dgate, float* dup, const float* dout,
                       const float* gate, const float* up, int64_t n) {
  swiglu_t a = {.dgate = dgate,
                .dup = dup,
                .dout = dout,
                .gate = gate,
                .up = up,
                .n = n,
                .acc = 1};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), swiglu_bwd_task, &a);
  return 0;
}

int tr__cpu_swiglu_bwd_write(float* dgate, float* dup, const float* dout,
                             const float* gate, const float* up, int64_t n) {
  swiglu_t a = {
      .dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up, .n = n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), swiglu_bwd_task, &a);
  return 0;
}
