/* kernels/cpu/global_norm.c: sum of squares (for the global gradient norm)
 * and in-place scaling (for clipping). The sum adds fixed chunks in double,
 * then the chunk sums in order: the same bits for any thread count. */
#include "config.h"

#include <stdlib.h>

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"

#define SUM_CHUNK 65536
#define CHUNK 16384

typedef struct {
  const float* x;
  float* y;
  double* partial;
  int64_t n;
  float s;
} norm_t;

static void sumsq_task(void* ctx, int64_t task) {
  const norm_t* a = ctx;
  int64_t i1 = (task + 1) * SUM_CHUNK < a->n ? (task + 1) * SUM_CHUNK : a->n;
  double s = 0.0;
  for (int64_t i = task * SUM_CHUNK; i < i1; i++)
    s += (double)a->x[i] * a->x[i];
  a->partial[task] = s;
}

int tr__cpu_sum_squares(double* out, const float* x, int64_t n) {
  int64_t nt = tr__cpu_ntasks(n, SUM_CHUNK);
  double one;
  double* partial = nt <= 1 ? &one : malloc((size_t)nt * sizeof(double));
  if (!partial) return TR_ENOMEM;
  norm_t a = {.x = x, .partial = partial, .n = n};
  if (nt == 0) one = 0.0;
  tr__cpu_parallel(nt, sumsq_task, &a);
  double s = 0.0;
  for (int64_t i = 0; i < (nt ? nt : 1); i++) s += partial[i];
  if (partial != &one) free(partial);
  *out = s;
  return 0;
}

static void scale_task(void* ctx, int64_t task) {
  const norm_t* a = ctx;
  int64_t i1 = (task + 1) * CHUNK < a->n ? (task + 1) * CHUNK : a->n;
  for (int64_t i = task * CHUNK; i < i1; i++) a->y[i] *= a->s;
}

int tr__cpu_scale(float* x, float s, int64_t n) {
  norm_t a = {.y = x, .n = n, .s = s};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), scale_task, &a);
  return 0;
}
