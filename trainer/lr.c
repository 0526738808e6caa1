/* trainer/lr.c: torchtitan's warmup-stable-decay learning-rate schedule
 * (trainrun/trainer.h has the formulas). */
#include "config.h"

#include <fenv.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/trainer.h"

int tr_lr_schedule_init(tr_lr_schedule_t* s, double lr, int64_t warmup_steps,
                        int64_t total_steps, double decay_ratio,
                        const char* decay_type, double min_lr_factor,
                        tr_errmsg_t* err) {
  memset(s, 0, sizeof *s);
  if (total_steps < 1)
    return tr_errmsg_set(err, TR_EINVAL,
                         "lr_scheduler: total_steps %" PRId64 " is below 1",
                         total_steps);
  if (warmup_steps < 0)
    return tr_errmsg_set(err, TR_EINVAL,
                         "lr_scheduler: warmup_steps %" PRId64 " is negative",
                         warmup_steps);
  if (decay_ratio > 1)
    return tr_errmsg_set(err, TR_EINVAL,
                         "lr_scheduler: decay_ratio %g is not in [0, 1]",
                         decay_ratio);
  if (!(min_lr_factor >= 0 && min_lr_factor <= 1))
    return tr_errmsg_set(err, TR_EINVAL,
                         "lr_scheduler: min_lr_factor %g is not in [0, 1]",
                         min_lr_factor);
  if (!decay_type || strcmp(decay_type, "linear") == 0)
    s->decay = TR_LR_DECAY_LINEAR;
  else if (strcmp(decay_type, "sqrt") == 0)
    s->decay = TR_LR_DECAY_SQRT;
  else if (strcmp(decay_type, "cosine") == 0)
    s->decay = TR_LR_DECAY_COSINE;
  else
    return tr_errmsg_set(err, TR_EINVAL,
                         "lr_scheduler: unknown decay_type '%s' (linear, "
                         "sqrt, cosine)",
                         decay_type);
  if (warmup_steps > total_steps) {
    TR_LOG_WARN(TRAIN,
                "warmup steps (%" PRId64 ") exceed total steps (%" PRId64
                "); using %" PRId64,
                warmup_steps, total_steps, total_steps);
    warmup_steps = total_steps;
  }
  int64_t decay;
  if (decay_ratio >= 0) {
    /* Python's round(): halves go to the even neighbour, which is what
     * nearbyint does in the default rounding mode */
    decay = (int64_t)nearbyint((double)total_steps * decay_ratio);
    if (warmup_steps + decay > total_steps) {
      TR_LOG_WARN(TRAIN,
                  "warmup (%" PRId64 ") + decay (%" PRId64
                  ") steps exceed total steps (%" PRId64
                  "); decaying over %" PRId64,
                  warmup_steps, decay, total_steps, total_steps - warmup_steps);
      decay = total_steps - warmup_steps;
    }
  } else {
    decay = total_steps - warmup_steps;
  }
  s->lr = lr;
  s->total_steps = total_steps;
  s->warmup_steps = warmup_steps;
  s->decay_steps = decay;
  s->stable_steps = total_steps + 1 - warmup_steps - decay;
  s->min_lr_factor = min_lr_factor;
  return 0;
}

double tr_lr_schedule_factor(const tr_lr_schedule_t* s, int64_t step) {
  int64_t k = step - 1; /* LambdaLR's count: 0 for the first step */
  if (k < 0) k = 0;
  if (k < s->warmup_steps) return (double)(k + 1) / (double)s->warmup_steps;
  int64_t ws = s->warmup_steps + s->stable_steps;
  if (k < ws || s->decay_steps == 0) return 1.0;
  double p = (double)(k + 1 - ws) / (double)s->decay_steps;
  if (p > 1) p = 1;
  double g;
  switch (s->decay) {
    case TR_LR_DECAY_SQRT:
      g = 1 - sqrt(p);
      break;
    case TR_LR_DECAY_COSINE:
      g = 0.5 * (1.0 + cos(M_PI * p));
      break;
    default:
      g = 1 - p;
      break;
  }
  return s->min_lr_factor + (1 - s->min_lr_factor) * g;
}

double tr_lr_schedule_lr(const tr_lr_schedule_t* s, int64_t step) {
  return s->lr * tr_lr_schedule_factor(s, step);
}
