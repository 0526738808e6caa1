/* kernels/cpu/residual.c: the residual add (out = a + b), accumulation
 * (y += x, the residual's backward) and zeroing, elementwise in chunks. */
#include "config.h"

#include <string.h>

#include "kernels/cpu/cpu.h"

#define CHUNK 16384

typedef struct {
  float* out;
  const float* a;
  const float* b;
  int64_t n;
} res_t;

static void add_task(void* ctx, int64_t task) {
  const res_t* r = ctx;
  int64_t i1 = (task + 1) * CHUNK < r->n ? (task + 1) * CHUNK : r->n;
  for (int64_t i = task * CHUNK; i < i1; i++) r->out[i] = r->a[i] + r->b[i];
}

int tr__cpu_add(float* out, const float* a, const float* b, int64_t n) {
  res_t r = {out, a, b, n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), add_task, &r);
  return 0;
}

static void acc_task(void* ctx, int64_t task) {
  const res_t* r = ctx;
  int64_t i1 = (task + 1) * CHUNK < r->n ? (task + 1) * CHUNK : r->n;
  for (int64_t i = task * CHUNK; i < i1; i++) r->out[i] += r->a[i];
}

int tr__cpu_accumulate(float* y, const float* x, int64_t n) {
  res_t r = {y, x, NULL, n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), acc_task, &r);
  return 0;
}

static void zero_task(void* ctx, int64_t task) {
  const res_t* r = ctx;
  int64_t i0 = task * CHUNK, i1 = i0 + CHUNK < r->n ? i0 + CHUNK : r->n;
  memset(r->out + i0, 0, (size_t)(i1 - i0) * sizeof(float));
}

int tr__cpu_zero(float* x, int64_t n) {
  res_t r = {x, NULL, NULL, n};
  tr__cpu_parallel(tr__cpu_ntasks(n, CHUNK), zero_task, &r);
  return 0;
}
