/* kernels/cpu/crossentropy.c: fused softmax + cross-entropy with an ignore
 * index. The forward gives each row's loss and log-sum-exp (summed in
 * double); the backward turns the logits into dlogits in place, so the
 * probabilities never need a buffer of their own. The vocabulary-parallel
 * variant (loss parallel) works on a slice of the vocabulary's columns in
 * three local steps between which the caller reduces over the slices: row
 * max and owned target logit, sum of exponentials, loss; its backward is
 * the whole table's with the slice's column offset. */
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
  int64_t voff; /* the slice's first column in the vocabulary (0: whole) */
  float* max;   /* shard steps: per-row max, target logit, sum of exp */
  float* tgt;
  float* sum;
  const float* cmax;
  const float* csum;
  const float* ctgt;
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
  int64_t j = (int64_t)t - a->voff; /* the onehot, where this slice has it */
  if (j >= 0 && j < a->V) x[j] -= a->scale;
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

/* ---- vocabulary-parallel (a slice of the columns) ---- */

static void shard_stats_task(void* ctx, int64_t r) {
  const xent_t* a = ctx;
  const float* x = a->clogits + r * a->ld;
  float m = -INFINITY;
  for (int j = 0; j < a->V; j++) m = x[j] > m ? x[j] : m;
  a->max[r] = m;
  int64_t j = (int64_t)a->targets[r] - a->voff;
  a->tgt[r] =
      a->targets[r] != TR_IGNORE_INDEX && j >= 0 && j < a->V ? x[j] : 0.0f;
}

int tr__cpu_xent_shard_stats(float* max, float* tgt, const float* logits,
                             const int32_t* targets, int64_t N, int V,
                             int64_t ld, int64_t voff) {
  xent_t a = {.max = max,
              .tgt = tgt,
              .clogits = logits,
              .targets = targets,
              .V = V,
              .ld = ld,
              .voff = voff};
  tr__cpu_parallel(N, shard_stats_task, &a);
  return 0;
}

static void shard_sumexp_task(void* ctx, int64_t r) {
  const xent_t* a = ctx;
  const float* x = a->clogits + r * a->ld;
  float m = a->cmax[r];
  double s = 0.0;
  for (int j = 0; j < a->V; j++) s += expf(x[j] - m);
  a->sum[r] = (float)s;
}

int tr__cpu_xent_shard_sumexp(float* sum, const float* logits, const float* max,
                              int64_t N, int V, int64_t ld) {
  xent_t a = {.sum = sum, .clogits = logits, .cmax = max, .V = V, .ld = ld};
  tr__cpu_parallel(N, shard_sumexp_task, &a);
  return 0;
}

int tr__cpu_xent_shard_loss(float* losses, float* lse, const float* max,
                            const float* sum, const float* tgt,
                            const int32_t* targets, int64_t N) {
  for (int64_t r = 0; r < N; r++) {
    lse[r] = max[r] + logf(sum[r]);
    losses[r] = targets[r] == TR_IGNORE_INDEX ? 0.0f : lse[r] - tgt[r];
  }
  return 0;
}

int tr__cpu_xent_shard_bwd(float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int V, int64_t ld,
                           int64_t voff, float scale) {
  xent_t a = {.logits = logits,
              .clse = lse,
              .targets = targets,
              .V = V,
              .ld = ld,
              .scale = scale,
              .voff = voff};
  tr__cpu_parallel(N, xent_bwd_task, &a);
  return 0;
}
