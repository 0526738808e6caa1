/* trainer/device.c: the parts of a step that depend on where the model
 * lives — picking the rank's device and compute dtype, adding up the
 * per-token losses, the global gradient norm and the AdamW update. On the
 * CPU they go tensor by tensor through trainrun/kernels.h. On CUDA the
 * losses stay on the device until the step ends, the norm is one
 * multi-tensor reduction and the update one multi-tensor AdamW that also
 * refreshes the bf16 compute copies. What still waits for the device: the
 * classifier's check of the targets against the vocabulary (once per
 * micro-batch), the tokens' copy to the device, and the loss and norm at
 * the end of the step (the metrics and clipping need them). */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/dtensor.h" /* tr_tp_sharded */
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/log.h"
#include "trainer/internal.h" /* the step's device and checkpoint parts */
#include "trainrun/trainer.h"

static int on_cuda(const tr_trainer_t* t) {
  return t->model.device.type == TR_DEV_CUDA;
}

int tr__trainer_device_pick(tr_trainer_t* t, tr_errmsg_t* err) {
  const tr_trainer_settings_t* s = &t->settings;
  t->device = s->device;
  snprintf(t->device_name, sizeof t->device_name, "cpu");
  t->compute_dtype = TR_F32;
  if (t->device.type != TR_DEV_CUDA) return 0;
  if (!tr_kern_ops(TR_DEV_CUDA))
    return tr_errmsg_set(err, TR_EUNSUPPORTED,
                         "training.device: cuda needs the CUDA kernels, "
                         "which this build does not have");
  int rc = tr_cuda_set_device(t->device.index, t->device_name,
                              sizeof t->device_name);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot use cuda:%d: %s", t->device.index,
                         tr_strerror(rc));
  t->compute_dtype = s->compute_dtype;
  if (t->compute_dtype != TR_F32 && t->compute_dtype != TR_BF16)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.mixed_precision_param: '%s' is not "
                         "float32 or bfloat16",
                         tr_dtype_name(t->compute_dtype));
  if (strcmp(s->optimizer.name, "Adam") == 0 && s->optimizer.weight_decay != 0)
    return tr_errmsg_set(err, TR_EUNSUPPORTED,
                         "optimizer.name: 'Adam' with weight_decay (an L2 "
                         "term) runs on the CPU only; use AdamW on cuda");
  return 0;
}

int tr__trainer_device_setup(tr_trainer_t* t) {
  if (!on_cuda(t)) return 0;
  /* FSDP gathers the weights in param_dtype itself: no compute copies */
  TR_CHECK(tr_model_set_compute_dtype(&t->model, t->compute_dtype,
                                      t->dist.grads_sharded == 0));
  /* a micro-batch's per-token losses: B sequences, or a pipeline's
   * micro-batch, of the rows this rank keeps (T / cp under context
   * parallel) */
  int64_t shape[2] = {t->pp.pg ? t->pp.microbatch_size : t->B,
                      tr__trainer_cp_rows(t, t->T)};
  return tr_tensor_zeros(&t->loss_acc, TR_F32, t->device, 2, shape);
}

void tr__trainer_device_release(tr_trainer_t* t) {
  tr_tensor_release(&t->loss_acc);
  if (on_cuda(t)) tr_kern_step_tail_release(TR_DEV_CUDA);
}

/* ---- losses ---- */

int tr__trainer_loss_add(tr_trainer_t* t, const tr_model_mb_t* mb,
                         double* sum) {
  if (!mb->defer_loss) {
    *sum += mb->loss_sum;
    return 0;
  }
  return tr_kern_accumulate(&t->loss_acc, &mb->losses);
}

int tr__trainer_loss_take(tr_trainer_t* t, double* sum) {
  if (!on_cuda(t)) return 0;
  tr_tensor_t h = {0};
  TR_CHECK(tr_tensor_empty(&h, TR_F32, TR_DEVICE_CPU, t->loss_acc.ndim,
                           t->loss_acc.shape));
  int rc = tr_tensor_copy(&h, &t->loss_acc);
  if (rc == 0) {
    const float* l = tr_tensor_data(&h);
    double s = 0.0;
    for (int64_t i = 0; i < tr_tensor_numel(&h); i++) s += l[i];
    *sum += s;
    rc = tr_kern_zero(&t->loss_acc);
  }
  tr_tensor_release(&h);
  return rc;
}

/* ---- gradient norm ---- */

int tr__trainer_grad_sumsq(tr_trainer_t* t, double* sq) {
  /* tp-sharded grads summed over tp, replicated ones once; this rank's
   * stages only, a tied table's second copy left out. One multi-tensor
   * launch a kind on CUDA (one synchronisation each). */
  double v = 0;
  TR_CHECK(tr_tp_grad_sq_norm(&t->model, t->tp.pg, t->norm_skip, &v));
  *sq += v;
  return 0;
}

/* ---- AdamW ---- */

/* Adam (not W): weight decay as an L2 term in the gradient, on the host. */
static int add_l2(tr_param_t* p, float wd, float grad_scale) {
  if (p->grad.device.type != TR_DEV_CPU) return TR_EDEVICE;
  float* g = tr_tensor_data(&p->grad);
  const float* w = tr_tensor_data(&p->data);
  int64_t n = tr_tensor_numel(&p->grad);
  /* the kernel multiplies g by grad_scale: pre-divide the L2 term */
  for (int64_t i = 0; i < n; i++) g[i] += wd * w[i] / grad_scale;
  return 0;
}

/* The update's tensors (*sets, *n) and arguments; Adam's L2 term added to
 * the grads (the CPU) with clip. */
static int adamw_sets(tr_trainer_t* t, double lr, double clip,
                      tr_kern_adamw_set_t** out, int* n, tr_adamw_args_t* a) {
  const tr_trainer_optimizer_t* o = &t->settings.optimizer;
  int adam_l2 = strcmp(o->name, "Adam") == 0;
  *a =
      (tr_adamw_args_t){.lr = (float)lr,
                        .beta1 = (float)o->beta1,
                        .beta2 = (float)o->beta2,
                        .eps = (float)o->eps,
                        .weight_decay = adam_l2 ? 0.0f : (float)o->weight_decay,
                        .grad_scale = (float)clip,
                        .step = t->step + 1};
  tr_model_t* m = &t->model;
  tr_kern_adamw_set_t* sets = calloc((size_t)m->n_params + 1, sizeof *sets);
  if (!sets) return TR_ENOMEM;
  int rc = 0, k = 0;
  for (int i = 0; i < m->n_params && rc == 0; i++) {
    tr_param_t* p = &m->params[i];
    if (!p->data.storage) continue; /* another pipeline stage's */
    /* decay: matrices and embeddings (ndim >= 2) */
    if (adam_l2 && p->decay && o->weight_decay != 0)
      rc = add_l2(p, (float)o->weight_decay, (float)clip);
    sets[k++] = (tr_kern_adamw_set_t){
        .param = &p->data,
        .grad = &p->grad,
        .m = &t->adam_m[i],
        .v = &t->adam_v[i],
        .compute = p->compute.storage && p->compute.dtype == TR_BF16
                       ? &p->compute
                       : NULL,
        .decay = p->decay};
  }
  if (rc < 0) {
    free(sets);
    return rc;
  }
  *out = sets;
  *n = k;
  return 0;
}

int tr__trainer_adamw(tr_trainer_t* t, double lr, double clip) {
  tr_kern_adamw_set_t* sets = NULL;
  tr_adamw_args_t a;
  int n;
  TR_CHECK(adamw_sets(t, lr, clip, &sets, &n, &a));
  /* one fused launch on CUDA, which refreshes the bf16 compute copies
   * too; tensor by tensor on the CPU (no compute copies there) */
  int rc = tr_kern_adamw_multi(sets, n, &a);
  free(sets);
  return rc;
}

/* ---- the step's end on the device ---- */

int tr__trainer_tail_ok(const tr_trainer_t* t) {
  const tr_model_t* m = &t->model;
  if (!on_cuda(t) || t->pp.pg || t->tp.pg || t->norm_skip ||
      t->dist.grads_sharded || strcmp(t->settings.optimizer.name, "AdamW") != 0)
    return 0;
  for (int i = 0; i < m->n_params; i++)
    if (tr_tp_sharded(&m->params[i])) return 0; /* summed apart */
  return 1;
}

int tr__trainer_step_tail(tr_trainer_t* t, double lr, double max_norm,
                          double* sq, double* loss_sum) {
  tr_model_t* m = &t->model;
  const tr_tensor_t** gs = calloc((size_t)m->n_params + 1, sizeof *gs);
  if (!gs) return TR_ENOMEM;
  int ng = 0; /* the grads tr__trainer_grad_sumsq adds, in its order */
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i].grad.storage) gs[ng++] = &m->params[i].grad;
  tr_kern_adamw_set_t* sets = NULL;
  tr_adamw_args_t a;
  int n;
  int rc = adamw_sets(t, lr, 1.0, &sets, &n, &a);
  if (rc == 0)
    rc = tr_kern_step_tail(sets, n, &a, gs, ng, max_norm, &t->loss_acc);
  free(sets);
  free(gs);
  double losses = 0;
  if (rc == 0) rc = tr_kern_step_tail_wait(t->model.device.type, sq, &losses);
  if (rc == 0) *loss_sum += losses;
  return rc;
}
