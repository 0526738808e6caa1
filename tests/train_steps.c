/* tests/train_steps.c: AdamW moments and steps for the suites that train
 * by hand on forked ranks (tests/train_steps.h). */
#include "config.h"

#include <stdlib.h>

#include "tests/pg_suite.h"
#include "tests/train_steps.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"

void ts_moments(tr_model_t* m, const unsigned char* own, tr_tensor_t** mom,
                tr_tensor_t** var) {
  *mom = calloc((size_t)m->n_params + 1, sizeof **mom);
  *var = calloc((size_t)m->n_params + 1, sizeof **var);
  PCHECK(*mom && *var);
  for (int i = 0; i < m->n_params; i++) {
    if (own && !own[i]) continue;
    tr_param_t* p = &m->params[i];
    PCHECK_RC(tr_tensor_zeros(&(*mom)[i], TR_F32, TR_DEVICE_CPU, p->ndim,
                              p->layout.shape));
    PCHECK_RC(tr_tensor_zeros(&(*var)[i], TR_F32, TR_DEVICE_CPU, p->ndim,
                              p->layout.shape));
  }
}

void ts_free_moments(tr_model_t* m, tr_tensor_t* mom, tr_tensor_t* var) {
  for (int i = 0; i < m->n_params; i++) {
    tr_tensor_release(&mom[i]);
    tr_tensor_release(&var[i]);
  }
  free(mom);
  free(var);
}

void ts_adamw(tr_model_t* m, tr_tensor_t* mom, tr_tensor_t* var,
              const unsigned char* own, int64_t step) {
  tr_adamw_args_t a = {.lr = 1e-3f,
                       .beta1 = 0.9f,
                       .beta2 = 0.95f,
                       .eps = 1e-8f,
                       .grad_scale = 1.0f,
                       .step = step};
  for (int i = 0; i < m->n_params; i++) {
    if (own && !own[i]) continue;
    tr_param_t* p = &m->params[i];
    a.weight_decay = p->decay ? 0.1f : 0.0f;
    PCHECK_RC(tr_kern_adamw(&p->data, &p->grad, &mom[i], &var[i], &a));
  }
}
