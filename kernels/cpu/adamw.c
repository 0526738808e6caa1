/* kernels/cpu/adamw.c: one AdamW step (torch.optim.AdamW's arithmetic:
 * decoupled weight decay, bias-corrected moments), elementwise. */
#include "config.h"

#include <math.h>

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"

#define CHUNK 16384

typedef struct {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  float decay, b1, b2, step_size, bc2_sqrt, eps, gscale;
} adamw_t;

static void adamw_task(void* ctx, int64_t task) {
  const adamw_t* a = ctx;
  int64_t i1 = (task + 1) * CHUNK < a->n ? (task + 1) * CHUNK : a->n;
  for (int64_t i = task * CHUNK; i < i1; i++) {
    float g = a->g[i] * a->gscale;
    float p = a->p[i] * a->decay;
    float m = a->b1 * a->m[i] + (1.0f - a->b1) * g;
    float v = a->b2 * a->v[i] + (1.0f - a->b2) * g * g;
    float denom = sqrtf(v) / a->bc2_sqrt + a->eps;
    a->p[i] = p - a->step_size * (m / denom);
    a->m[i] = m;
    a->v[i] = v;
  }
}

int tr__cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n,
                  const tr_adamw_args_t* args) {
  if (args->step < 1) return TR_EINVAL;
  double bc1 = 1.0 - pow(args->beta1, (double)args->step);
  double bc2 = 1.0 - pow(args->beta2, (double)args->step);
  adamw_t a = {p,
               g,
               m,
               v,
               n,
               1.0f - args->lr * args->weight_decay,
               args->beta1,
               args->beta2,
               (float)(args->lr / bc1),
               (float)sqrt(bc2),
               args->eps,
               args->grad_scale};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), adamw_task, &a);
  return 0;
}
