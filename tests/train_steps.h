/* tests/train_steps.h: the optimizer side of the suites that train a
 * model by hand on forked ranks against one rank (check_tp,
 * check_pp_exec): AdamW moments shaped like each parameter's piece, and
 * the AdamW step over them (torch's semantics, decay on matrices). A
 * parameter mask (own[i] 0: another pipeline stage's) may leave some out;
 * NULL: every one. Failures are PCHECK's (tests/pg_suite.h). */
#ifndef TRAINRUN_TESTS_TRAIN_STEPS_H
#define TRAINRUN_TESTS_TRAIN_STEPS_H

#include <stdint.h>

#include "trainrun/model.h"
#include "trainrun/tensor.h"

/* Zeroed first and second moments of every parameter own leaves in. */
void ts_moments(tr_model_t* m, const unsigned char* own, tr_tensor_t** mom,
                tr_tensor_t** var);
void ts_free_moments(tr_model_t* m, tr_tensor_t* mom, tr_tensor_t* var);
/* One AdamW step (lr 1e-3, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1
 * on parameters that decay) of the parameters own leaves in. */
void ts_adamw(tr_model_t* m, tr_tensor_t* mom, tr_tensor_t* var,
              const unsigned char* own, int64_t step);

#endif /* TRAINRUN_TESTS_TRAIN_STEPS_H */
