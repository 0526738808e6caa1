/* kernels/cpu/crossentropy.c: fused softmax + cross-entropy with an ignore
 * index. The forward gives each row's loss and log-sum-exp (summed in
 * double); the backward turns the logits into dlogits in place, so the
 * probabilities never need a buffer of their own. */
#include "config.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

typedef struct {
  float* losses;
  float* lse;
  float* logits;
  const float* clogits;
  const float* clse;
  const int32_t* targets;
  int V;
  int64_t ld; /* row stride of the logits */
  float scale;
} xent_t;

static int check_targets(const int32_t* targets, int64_t N, int V) {
  for (int64_t i = 0; i < N; i++) {
    if (targets[i] == TR_IGNORE_INDEX) continue;
    if (targets[i] < 0 || targets[i] >= V) {
      TR_LOG_ERROR(KERN, "target %d at position %lld is outside [0, %d)",
                   targets[i], (long long)i, V);
      return TR_EINVAL;
    }
  }
  return 0;
}

static void xent_fwd_task(void* ctx, int64_t r) {
  const xent_t* a = ctx;
  const float* x = a->clogits + r * a->ld;
  float m = -INFINITY;
  for (int j = 0; j < a->V; j++) m = x[j] > m ? x[j] : m;
  double s = 0.0;
  for (int j = 0; j < a->V; j++) s += expf(x[j] - m);
  float lse = m + (float)log(s);
  a->lse[r] = lse;
  int32_t t = a->targets[r];
  a->losses[r] = t == TR_IGNORE_INDEX ? 0.0f : lse - x[t];
}

int tr__cpu_xent_fwd(float* losses, float* lse, const float* logits,
                     const int32_t* targets, int64_t N, int V, int64_t ld) {
  TR_CHECK(check_targets(targets, N, V));
  xent_t a = {.losses = losses,
              .lse = lse,
              .clogits = logits,
              .targets = targets,
              .V = V,
              .ld = ld};
  tr__cpu_parallel(N, xent_fwd_task, &a);
  return 0;
}

static void xent_bwd_task(void* ctx, int64_t r) {
  const xent_t* a = ctx;
  float* x = a->logits + r * a->ld;
  int32_t t = a->targets[r];
  if (t == TR_IGNORE_INDEX) {
    memset(x, 0, (size_t)a->V * sizeof(float));
    return;
  }
  float lse = a->clse[r];
  for (int j = 0; j < a->V; j++) x[j] = a->scale * expf(x[j] - lse);
  x[t] -= a->scale;
}

int tr__cpu_xent_fused(float* losses, float* lse, float* logits,
                       const int32_t* targets, int64_t N, int V, int64_t ld,
                       float scale) {
  TR_CHECK(tr__cpu_xent_fwd(losses, lse, logits, targets, N, V, ld));
  return tr__cpu_xent_bwd(logits, lse, targets, N, V, ld, scale);
}

int tr__cpu_xent_bwd(float* logits, const float* lse, const int32_t* targets,
                     int64_t N, int V, int64_t ld, float scale) {
  TR_CHECK(check_targets(targets, N, V));
  xent_t a = {.logits = logits,
              .clse = lse,
              .targets = targets,
              .V = V,
              .ld = ld,
              .scale = scale};
  tr__cpu_parallel(N, xent_bwd_task, &a);
  return 0;
}
