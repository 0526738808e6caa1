/* trainer/train.c: the per-rank training loop — building the run from its
 * settings, one optimizer step (micro-steps, gradient sync seam, norm,
 * clipping, AdamW), validation, and the whole run with metrics, signals and
 * the final weights (trainrun/trainer.h). */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "trainrun/error.h"
#include "trainrun/fault.h"     /* --debug.fault */
#include "trainrun/heartbeat.h" /* beats to the node daemon */
#include "trainrun/kernels.h"   /* AdamW, norms */
#include "trainrun/log.h"
#include "trainrun/metrics.h"     /* the metric line and files */
#include "trainrun/param.h"       /* RANK, restart count (faults) */
#include "trainrun/pipelining.h"  /* the step's actions and executor */
#include "trainrun/safetensors.h" /* the final weights */
#include "trainer/internal.h" /* the step's device and checkpoint parts */
#include "trainrun/trainer.h"
#include "core/internal.h" /* tr__mkdir_p */

/* ---- building a run ---- */

/* Seconds-and-pid entropy for a run without debug.seed. */
static uint64_t pick_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = (uint64_t)ts.tv_sec * 1000000007ULL ^ (uint64_t)ts.tv_nsec ^
               ((uint64_t)getpid() << 32);
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ULL;
  return (x ^ (x >> 29)) % 1000000000ULL;
}

/* The validation data of v over an already opened training set train_ds
 * (may be NULL): a separate dataset (*own = 1) or a split of train_ds. */
static int open_val(const tr_trainer_validation_t* v,
                    const tr_dataset_t* train_ds, int64_t vocab,
                    tr_dataset_t** val_ds, int64_t* begin, int* own,
                    tr_errmsg_t* err) {
  *val_ds = NULL;
  *begin = 0;
  *own = 0;
  if (v->dataset_path) {
    TR_CHECK(tr_dataset_open(val_ds, v->dataset_path, TR_DATA_VAL, vocab, err));
    *own = 1;
    return 0;
  }
  if (v->split_fraction > 0 && train_ds) {
    *val_ds = (tr_dataset_t*)train_ds;
    *begin =
        tr_data_split_point(tr_dataset_ntokens(train_ds), v->split_fraction);
    return 0;
  }
  return tr_errmsg_set(err, TR_ECONFIG,
                       "validation needs data: set validation.dataset_path "
                       "or validation.split_fraction");
}

static int val_batches(const tr_loader_t* ld, int64_t B, int dp, int64_t steps,
                       int64_t* out, tr_errmsg_t* err) {
  if (steps > 0) {
    *out = steps;
    return 0;
  }
  int64_t n = ld->nsamples / (B * dp);
  if (n == 0)
    return tr_errmsg_set(err, TR_EINVAL,
                         "the validation data holds %" PRId64
                         " sequences of %" PRId64
                         " tokens, fewer than one batch of %" PRId64
                         " (validation.local_batch_size x %d ranks)",
                         ld->nsamples, ld->seq_len + 1, B * dp, dp);
  *out = n;
  return 0;
}

int tr_trainer_init(tr_trainer_t* t, const tr_trainer_settings_t* s,
                    const tr_trainer_opts_t* opts, tr_errmsg_t* err) {
  memset(t, 0, sizeof *t);
  tr_errmsg_clear(err);
  t->settings = *s;
  s = &t->settings;
  if (opts) t->opts = *opts;
  if (t->opts.dist) {
    t->dist = *t->opts.dist;
    t->opts.dist = NULL;
  } else {
    t->dist.dp_size = 1;
  }
  if (t->opts.tp) {
    t->tp = *t->opts.tp;
    t->opts.tp = NULL;
    if (!t->tp.pg || tr_pg_size(t->tp.pg) < 2) memset(&t->tp, 0, sizeof t->tp);
  }
  if (t->opts.pp) {
    t->pp = *t->opts.pp;
    t->opts.pp = NULL;
    if (!t->pp.pg || tr_pg_size(t->pp.pg) < 2) memset(&t->pp, 0, sizeof t->pp);
  }
  if (t->opts.cp) {
    t->cp = *t->opts.cp;
    t->opts.cp = NULL;
    if (!t->cp.pg || tr_pg_size(t->cp.pg) < 2) memset(&t->cp, 0, sizeof t->cp);
  }
  if (t->dist.dp_size < 1 || t->dist.dp_rank < 0 ||
      t->dist.dp_rank >= t->dist.dp_size)
    return tr_errmsg_set(err, TR_EINVAL, "bad data-parallel rank %d of %d",
                         t->dist.dp_rank, t->dist.dp_size);
  int dp = t->dist.dp_size;
  int tp = t->tp.pg ? tr_pg_size(t->tp.pg) : 1;
  int pp = t->pp.pg ? tr_pg_size(t->pp.pg) : 1;
  int pp_rank = t->pp.pg ? tr_pg_rank(t->pp.pg) : 0;
  int cp = t->cp.pg ? tr_pg_size(t->cp.pg) : 1;
  int cp_rank = t->cp.pg ? tr_pg_rank(t->cp.pg) : 0;
  t->rank = ((pp_rank * dp + t->dist.dp_rank) * cp + cp_rank) * tp +
            (t->tp.pg ? tr_pg_rank(t->tp.pg) : 0);
  t->world = pp * dp * cp * tp;
  int rc = 0;
  t->B = s->training.local_batch_size;
  t->T = s->training.seq_len;
  t->G = s->training.global_batch_size;
  if (t->B < 1 || t->G < 1 || t->G % (t->B * dp) != 0)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.global_batch_size %" PRId64
                         " is not a multiple of local_batch_size x "
                         "data-parallel degree (%" PRId64 " x %d)",
                         t->G, t->B, dp);
  t->grad_accum = t->G / (t->B * dp);
  if (t->B * t->T > INT32_MAX)
    return tr_errmsg_set(err, TR_ECONFIG, "training: batch too large");
  if (t->T % (2 * cp))
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.seq_len %" PRId64
                         " does not split into 2 x %d equal chunks (context "
                         "parallel)",
                         t->T, cp);
  if (!t->pp.pg) { /* the step: one stage, 1F1B over the micro-batches */
    t->actions = calloc((size_t)(2 * t->grad_accum), sizeof *t->actions);
    if (!t->actions) return TR_ENOMEM;
    TR_CHECK_GOTO(tr_pp_schedule_one_stage(t->grad_accum, t->actions), rc,
                  out_release);
  }

  TR_CHECK(tr__trainer_device_pick(t, err));

  /* the model */
  const tr_model_config_t mc = s->model;
  if (t->T > mc.max_seq_len)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.seq_len %" PRId64
                         " exceeds the model's max_seq_len %d",
                         t->T, mc.max_seq_len);
  t->seed = s->debug.seed_set ? s->debug.seed : pick_seed();
  rc = tr_model_init(&t->model, &mc);
  if (rc < 0) {
    char msg[256] = "";
    tr_model_config_check(&mc, msg, sizeof msg);
    return tr_errmsg_set(err, rc, "cannot build the model: %s",
                         msg[0] ? msg : tr_strerror(rc));
  }
  if (t->tp.pg) { /* TP first: FSDP composes its shards onto the plan's */
    tr_tp_opts_t o;
    tr_tp_opts_init(&o);
    o.sequence_parallel = t->tp.sequence_parallel;
    o.loss_parallel = t->tp.loss_parallel;
    o.async = t->tp.async;
    if ((t->tp.comm_timing || t->tp.async) &&
        (rc = tr_tp_comm_new(t->tp.pg, t->tp.comm_timing, &t->tp_comm)) < 0)
      goto out_fail;
    o.comm = t->tp_comm;
    rc = tr_tp_check_seq_len(tr_pg_size(t->tp.pg), (int)(t->T / cp), &o,
                             err); /* the rows a cp rank keeps */
    if (rc == 0) rc = tr_tp_plan_apply(&t->model, &t->tp.mesh, err);
    if (rc < 0) goto out_release;
    tr_tp_install(&t->model, t->tp.pg, &o);
  }
  tr_cp_install(&t->model, t->cp.pg ? &t->cp : NULL);
  if (t->pp.pg && (rc = tr__trainer_pp_init(t, err)) < 0) goto out_release;
  if (t->dist.setup_model) /* FSDP: shard placements and hooks */
    TR_CHECK_GOTO(t->dist.setup_model(t->dist.arg, &t->model, &t->dist), rc,
                  out_fail);
  if (t->dist.grads_sharded < 0) {
    rc = tr_errmsg_set(err, TR_EUNSUPPORTED,
                       "the gradient norm needs every parameter's gradient "
                       "held by the same number of data-parallel ranks");
    goto out_release;
  }
  TR_CHECK_GOTO(t->pp.pg ? tr__trainer_pp_alloc(t)
                         : tr_model_alloc(&t->model, t->device),
                rc, out_fail);
  TR_CHECK_GOTO(tr_model_init_weights(&t->model, t->seed), rc, out_fail);
  TR_CHECK_GOTO(tr__trainer_device_setup(t), rc, out_fail);
  if ((rc = tr_model_set_activation_checkpoint_config(
           &t->model, s->activation_checkpoint.mode,
           s->activation_checkpoint.selective_ac_option, err)) < 0)
    goto out_release;
  t->flops_per_token = tr_model_flops_per_token(&mc, (int)t->T);

  /* AdamW state */
  int np = t->model.n_params;
  t->adam_m = calloc((size_t)np + 1, sizeof *t->adam_m);
  t->adam_v = calloc((size_t)np + 1, sizeof *t->adam_v);
  if (!t->adam_m || !t->adam_v) {
    rc = TR_ENOMEM;
    goto out_fail;
  }
  for (int i = 0; i < np; i++) {
    const tr_tensor_t* g = &t->model.params[i].grad;
    if (!g->storage) continue; /* another pipeline stage's */
    TR_CHECK_GOTO(
        tr_tensor_zeros(&t->adam_m[i], TR_F32, g->device, g->ndim, g->shape),
        rc, out_fail);
    TR_CHECK_GOTO(
        tr_tensor_zeros(&t->adam_v[i], TR_F32, g->device, g->ndim, g->shape),
        rc, out_fail);
  }
  if (strcmp(s->optimizer.name, "AdamW") != 0 &&
      strcmp(s->optimizer.name, "Adam") != 0) {
    rc = tr_errmsg_set(err, TR_ECONFIG, "optimizer.name: unknown '%s'",
                       s->optimizer.name);
    goto out_release;
  }
  const tr_trainer_lr_scheduler_t* ls = &s->lr_scheduler;
  rc = tr_lr_schedule_init(&t->lr, s->optimizer.lr, ls->warmup_steps,
                           ls->total_steps, ls->decay_ratio, ls->decay_type,
                           ls->min_lr_factor, err);
  if (rc < 0) goto out_release;

  /* data */
  if (!s->training.dataset_path) {
    rc = tr_errmsg_set(err, TR_ECONFIG,
                       "training.dataset_path is not set (trainrun reads "
                       "llm.c token shards or text files; dataset '%s' is a "
                       "name, not a path)",
                       s->training.dataset);
    goto out_release;
  }
  rc = tr_dataset_open(&t->train_data, s->training.dataset_path, TR_DATA_TRAIN,
                       mc.vocab_size, err);
  if (rc < 0) goto out_release;
  int64_t train_end = -1;
  if (!s->validation.dataset_path && s->validation.split_fraction > 0)
    train_end = tr_data_split_point(tr_dataset_ntokens(t->train_data),
                                    s->validation.split_fraction);
  rc = tr_loader_init(&t->train, t->train_data, 0, train_end, t->T, t->seed, 1,
                      err);
  if (rc < 0) goto out_release;
  if (s->validation.enable) {
    int64_t vbegin;
    int own;
    rc = open_val(&s->validation, t->train_data, mc.vocab_size, &t->val_data,
                  &vbegin, &own, err);
    if (rc < 0) goto out_release;
    if (!own) t->val_data = NULL; /* a split: not ours to free */
    t->val_B = s->validation.local_batch_size;
    t->val_T = s->validation.seq_len;
    rc = tr_loader_init(&t->val, own ? t->val_data : t->train_data, vbegin, -1,
                        t->val_T, t->seed, 0, err);
    if (rc == 0 && t->val_T % (2 * cp))
      rc = tr_errmsg_set(err, TR_ECONFIG,
                         "validation.seq_len %" PRId64
                         " does not split into 2 x %d equal chunks (context "
                         "parallel)",
                         t->val_T, cp);
    if (rc == 0)
      rc = val_batches(&t->val, t->val_B, dp, s->validation.steps,
                       &t->val_steps, err);
    if (rc < 0) goto out_release;
    t->has_val = 1;
  }
  int64_t n = t->B * t->T;
  if (t->has_val && t->val_B * t->val_T > n) n = t->val_B * t->val_T;
  t->inputs = malloc((size_t)n * sizeof *t->inputs);
  t->targets = malloc((size_t)n * sizeof *t->targets);
  if (!t->inputs || !t->targets) {
    rc = TR_ENOMEM;
    goto out_fail;
  }
  return 0;

out_fail:
  tr_errmsg_set(err, rc, "cannot set up training: %s", tr_strerror(rc));
out_release:
  tr_trainer_release(t);
  return rc;
}

int tr__trainer_sum_all(tr_trainer_t* t, double* vals, int n) {
  /* the data-parallel layer's ranks: dp, and cp with it */
  if ((t->dist.dp_size > 1 || t->cp.pg) && t->dist.all_reduce_sum)
    TR_CHECK(t->dist.all_reduce_sum(t->dist.arg, vals, n));
  if (t->tp.pg) TR_CHECK(tr_dp_sum_over(t->tp.pg, vals, n));
  return t->pp.pg ? tr_dp_sum_over(t->pp.pg, vals, n) : 0;
}

void tr_trainer_release(tr_trainer_t* t) {
  tr__trainer_checkpoint_release(t); /* joins a background write first */
  tr__trainer_pp_release(t);
  tr__trainer_device_release(t);
  if (t->adam_m || t->adam_v)
    for (int i = 0; i < t->model.n_params; i++) {
      if (t->adam_m) tr_tensor_release(&t->adam_m[i]);
      if (t->adam_v) tr_tensor_release(&t->adam_v[i]);
    }
  free(t->adam_m);
  free(t->adam_v);
  tr_model_release(&t->model);
  tr_tp_comm_free(t->tp_comm); /* after the model, whose hook used it */
  tr_dataset_free(t->val_data);
  tr_dataset_free(t->train_data);
  free(t->inputs);
  free(t->targets);
  free(t->actions);
  memset(t, 0, sizeof *t);
}

/* ---- one step ---- */

/* The step's micro-batches, as the executor asks for them: the data and
 * the loss scale before a forward, the losses after the backward. */
typedef struct {
  tr_trainer_t* t;
  double sums[2]; /* loss sum, valid targets */
  float scale;
  tr_errmsg_t* err;
} step_ctx_t;

static int step_mb_begin(void* arg, int64_t micro, tr_model_mb_t* mb) {
  step_ctx_t* c = arg;
  tr_trainer_t* t = c->t;
  tr_model_t* m = &t->model;
  int rc;
  if (t->dist.pre_micro_step) { /* DDP: arm the overlapped all-reduce */
    rc = t->dist.pre_micro_step(t->dist.arg, m, t->step + 1, micro,
                                t->grad_accum);
    if (rc < 0)
      return tr_errmsg_set(c->err, rc, "step %" PRId64 ": gradient sync: %s",
                           t->step + 1, tr_strerror(rc));
  }
  TR_CHECK(tr_loader_next(&t->train, t->B, t->dist.dp_rank, t->dist.dp_size,
                          t->inputs, t->targets, c->err));
  rc = tr_model_mb_init(m, mb, (int)t->B, (int)t->T, t->inputs, t->targets);
  if (rc < 0)
    return tr_errmsg_set(c->err, rc, "step %" PRId64 ": bad batch: %s",
                         t->step + 1, tr_strerror(rc));
  mb->loss_scale = c->scale;
  mb->defer_loss = m->device.type != TR_DEV_CPU; /* summed at the end */
  return 0;
}

static int step_mb_end(void* arg, int64_t micro, tr_model_mb_t* mb) {
  (void)micro;
  step_ctx_t* c = arg;
  int rc = tr__trainer_loss_add(c->t, mb, &c->sums[0]);
  c->sums[1] += (double)mb->n_valid;
  return rc;
}

int tr_trainer_step(tr_trainer_t* t, tr_step_stats_t* st, tr_errmsg_t* err) {
  double t0 = tr__now();
  tr_fault_step(t->step + 1); /* kill, exit, slow */
  tr_model_t* m = &t->model;
  tr_kern_step_begin(m->device.type); /* CUDA: the GEMMs' timed picks */
  int rc = tr_model_zero_grad(m);
  if (rc < 0) return tr_errmsg_set(err, rc, "zero_grad: %s", tr_strerror(rc));
  /* the step's actions: one stage, 1F1B over the micro-batches (the
   * gradient-accumulation loop) */
  step_ctx_t ctx = {.t = t,
                    .scale = (float)(1.0 / ((double)t->G * (double)t->T)),
                    .err = err};
  tr_errmsg_clear(err);
  tr_pp_exec_t x = {.model = m,
                    .first_block = 0,
                    .last_block = m->n_blocks,
                    .n_micro = t->grad_accum,
                    .mb_begin = step_mb_begin,
                    .mb_end = step_mb_end,
                    .arg = &ctx};
  if (t->pp.pg) /* the pipeline's schedule over its group */
    rc = tr__trainer_pp_run(t, ctx.scale, step_mb_end, &ctx, err);
  else
    rc = tr_pp_exec_run(&x, t->actions, 2 * t->grad_accum);
  if (rc < 0)
    return err && err->code
               ? err->code
               : tr_errmsg_set(err, rc,
                               "step %" PRId64 ": forward/backward: %s",
                               t->step + 1, tr_strerror(rc));
  double* sums = ctx.sums;
  tr_fault_before_sync(t->step + 1); /* hang */
  if (t->dist.post_backward) {
    tr_heartbeat_phase("sync"); /* waiting for the peers from here */
    rc = t->dist.post_backward(t->dist.arg, m, t->step + 1);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "step %" PRId64 ": gradient sync: %s",
                           t->step + 1, tr_strerror(rc));
  }
  if (t->pp.pg && (rc = tr__trainer_pp_sum_tied(t, err)) < 0) return rc;
  /* the global gradient norm, before clipping; the device's losses. Where
   * the norm needs no collective (CUDA without FSDP, TP or PP), the device
   * clips and updates without the host waiting for the norm first: the
   * host reads it and the losses while the update runs */
  double sq = 0;
  double max_norm = t->settings.training.max_norm;
  double lr = tr_lr_schedule_lr(&t->lr, t->step + 1);
  int tail = tr__trainer_tail_ok(t);
  if (tail) {
    /* an async checkpoint may still be copying the weights and moments */
    tr__trainer_checkpoint_before_update(t);
    rc = tr__trainer_step_tail(t, lr, max_norm, &sq, &sums[0]);
  } else {
    rc = tr__trainer_grad_sumsq(t, &sq);
    if (rc == 0) rc = tr__trainer_loss_take(t, &sums[0]);
  }
  if (rc == 0 && t->pp.pg) { /* the stages' squares; the last one's loss */
    double v[3] = {sums[0], sums[1], sq};
    rc = tr_dp_sum_over(t->pp.pg, v, 3);
    sums[0] = v[0];
    sums[1] = v[1];
    sq = v[2];
  }
  /* FSDP: --debug.fault skip_collective / mismatch act on this one */
  int fs = t->dist.grads_sharded ? tr_fault_sharded_sync(t->step + 1)
                                 : TR_FAULT_SYNC_NONE;
  if (rc == 0 && t->dist.all_reduce_sum && fs != TR_FAULT_SYNC_SKIP) {
    double v[4] = {sums[0], sums[1], sq, 0};
    int nv = t->dist.grads_sharded ? 3 : 2;
    rc = t->dist.all_reduce_sum(t->dist.arg, v,
                                fs == TR_FAULT_SYNC_MISMATCH ? nv + 1 : nv);
    sums[0] = v[0];
    sums[1] = v[1];
    if (t->dist.grads_sharded) sq = v[2] / t->dist.grads_sharded;
  }
  if (rc < 0)
    return tr_errmsg_set(err, rc, "step %" PRId64 ": gradient norm: %s",
                         t->step + 1, tr_strerror(rc));
  /* the device has run the step's collectives (the norm and the losses
   * were read): their errors, and their timing (FSDP, DDP) */
  if (t->dist.step_end && (rc = t->dist.step_end(t->dist.arg)) < 0)
    return tr_errmsg_set(err, rc, "step %" PRId64 ": collectives: %s",
                         t->step + 1, tr_strerror(rc));
  if (t->tp_comm && (rc = tr_tp_comm_step_end(t->tp_comm)) < 0)
    return tr_errmsg_set(err, rc, "step %" PRId64 ": tp collectives: %s",
                         t->step + 1, tr_strerror(rc));
  double norm = sqrt(sq);
  double loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  /* (after a device-clipped update the weights already took this step:
   * the run stops here without saving them) */
  if (!isfinite(loss) || !isfinite(norm))
    return tr_errmsg_set(err, TR_ERANGE, "%s is %s at step %" PRId64,
                         isfinite(loss) ? "the gradient norm" : "the loss",
                         isfinite(loss) ? (isnan(norm) ? "nan" : "inf")
                                        : (isnan(loss) ? "nan" : "inf"),
                         t->step + 1);
  if (!tail) {
    double clip = max_norm > 0 ? tr_kern_clip_coef(norm, max_norm) : 1.0;
    /* an async checkpoint may still be copying the weights and moments */
    tr__trainer_checkpoint_before_update(t);
    rc = tr__trainer_adamw(t, lr, clip);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "step %" PRId64 ": optimizer: %s",
                           t->step + 1, tr_strerror(rc));
  }
  t->step++;
  tr_pg_t* any = t->tp.pg   ? t->tp.pg
                 : t->cp.pg ? t->cp.pg
                            : t->pp.pg; /* _all: the world's */
  if (t->step == 1 && any && t->opts.train_timeout_ms > 0)
    tr_pg_set_timeout_all(any, t->opts.train_timeout_ms);
  if (st) {
    st->step = t->step;
    st->loss = loss;
    st->grad_norm = norm;
    st->lr = lr;
    /* the replica's tokens over the ranks that share them (tp, cp, pp),
     * as torchtitan counts tokens per device */
    st->tokens = t->B * t->T * t->grad_accum * t->dist.dp_size / t->world;
    st->seconds = tr__now() - t0;
  }
  return 0;
}

/* ---- validation ---- */

/* Mean loss over `steps` batches of B sequences per rank from sample 0 of
 * ld. */
static int eval_loop(tr_model_t* m, const tr_loader_t* ld, int64_t B,
                     int64_t steps, const tr_dp_t* dist, int32_t* inputs,
                     int32_t* targets, double* loss, int64_t* ntokens,
                     tr_errmsg_t* err) {
  int rank = dist ? dist->dp_rank : 0, dp = dist ? dist->dp_size : 1;
  int64_t T = ld->seq_len;
  double sums[2] = {0, 0};
  for (int64_t s = 0; s < steps; s++) {
    int64_t first = s * B * dp + (int64_t)rank * B;
    for (int64_t b = 0; b < B; b++)
      TR_CHECK(tr_loader_sample(ld, first + b, inputs + b * T, targets + b * T,
                                err));
    tr_model_mb_t mb;
    int rc = tr_model_mb_init(m, &mb, (int)B, (int)T, inputs, targets);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "validation: bad batch: %s",
                           tr_strerror(rc));
    mb.no_grad = 1;
    rc = tr_model_forward(m, &mb, 0, m->n_blocks);
    sums[0] += mb.loss_sum;
    sums[1] += (double)mb.n_valid;
    tr_model_mb_release(m, &mb);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "validation: forward: %s", tr_strerror(rc));
  }
  if (dist && dist->all_reduce_sum) {
    int rc = dist->all_reduce_sum(dist->arg, sums, 2);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "validation: all-reduce: %s",
                           tr_strerror(rc));
  }
  *loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  *ntokens = (int64_t)sums[1];
  return 0;
}

int tr_trainer_validate(tr_trainer_t* t, double* loss, int64_t* ntokens,
                        tr_errmsg_t* err) {
  if (!t->has_val)
    return tr_errmsg_set(err, TR_EINVAL, "validation is not enabled");
  if (t->tp_comm) tr_tp_comm_measure(t->tp_comm, 0); /* not a step's */
  int rc = t->pp.pg
               ? tr__trainer_pp_validate(t, loss, ntokens, err)
               : eval_loop(&t->model, &t->val, t->val_B, t->val_steps, &t->dist,
                           t->inputs, t->targets, loss, ntokens, err);
  if (t->tp_comm) tr_tp_comm_measure(t->tp_comm, 1);
  return rc;
}

int tr_eval_loss(tr_model_t* m, const tr_trainer_settings_t* s, double* loss,
                 int64_t* ntokens, tr_errmsg_t* err) {
  const tr_trainer_validation_t* v = &s->validation;
  tr_dataset_t* train = NULL;
  tr_dataset_t* val = NULL;
  int64_t begin;
  int own, rc;
  if (!v->dataset_path && s->training.dataset_path && v->split_fraction > 0)
    TR_CHECK(tr_dataset_open(&train, s->training.dataset_path, TR_DATA_TRAIN,
                             m->cfg.vocab_size, err));
  rc = open_val(v, train, m->cfg.vocab_size, &val, &begin, &own, err);
  if (rc < 0) goto out;
  int64_t T = v->seq_len, B = v->local_batch_size;
  if (T > m->cfg.max_seq_len) {
    rc = tr_errmsg_set(err, TR_ECONFIG,
                       "validation.seq_len %" PRId64
                       " exceeds the model's max_seq_len %d",
                       T, m->cfg.max_seq_len);
    goto out;
  }
  tr_loader_t ld;
  int64_t steps = 0;
  rc = tr_loader_init(&ld, val, begin, -1, T, 0, 0, err);
  if (rc == 0) rc = val_batches(&ld, B, 1, v->steps, &steps, err);
  if (rc < 0) goto out;
  int32_t* in = malloc((size_t)(B * T) * sizeof *in);
  int32_t* tg = malloc((size_t)(B * T) * sizeof *tg);
  if (!in || !tg)
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  else
    rc = eval_loop(m, &ld, B, steps, NULL, in, tg, loss, ntokens, err);
  free(in);
  free(tg);
out:
  if (own) tr_dataset_free(val);
  tr_dataset_free(train);
  return rc;
}

/* ---- the whole run ---- */

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

static const char* model_summary(const tr_model_t* m, char* buf, size_t cap) {
  double n = (double)tr_model_num_params(m);
  const char* unit = "";
  if (n >= 1e9) {
    n /= 1e9;
    unit = "B";
  } else if (n >= 1e6) {
    n /= 1e6;
    unit = "M";
  } else if (n >= 1e3) {
    n /= 1e3;
    unit = "K";
  }
  snprintf(buf, cap, "%s %s (%.2f%s parameters, %d layers, dim %d, vocab %d)",
           tr_model_family_name(m->cfg.family), m->cfg.flavor, n, unit,
           m->cfg.n_layers, m->cfg.dim, m->cfg.vocab_size);
  return buf;
}

/* Every tp-sharded parameter made whole on every tp rank (after the
 * data-parallel layer's gather): all-gathered over tp into a host tensor,
 * its layout the whole tensor again. The end of a run only: the model is
 * no longer tensor-parallel (nor all on its device) after it. */
static int tp_gather_weights(tr_trainer_t* t, tr_errmsg_t* err) {
  tr_model_t* m = &t->model;
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    if (!tr_tp_sharded(p) || !p->data.storage) continue; /* or not here */
    tr_tensor_t whole = {0}; /* on the host, where the export reads it */
    int rc = tr_tp_gather(p, &p->data, t->tp.pg, &whole);
    if (rc == 0) rc = tr_dtensor_param_unshard(p, "tp");
    if (rc < 0) {
      tr_tensor_release(&whole);
      return tr_errmsg_set(err, rc, "gathering '%s' over tp: %s", p->name,
                           tr_strerror(rc));
    }
    tr_tensor_release(&p->data);
    p->data = whole;
  }
  return 0;
}

static int write_weights(tr_trainer_t* t, FILE* con, tr_errmsg_t* err) {
  const tr_trainer_settings_t* s = &t->settings;
  tr_dtype_t dt = TR_F32;
  if (tr_dtype_parse(s->checkpoint.export_dtype, &dt) < 0) dt = TR_F32;
  TR_CHECK(tr__mkdir_p(s->dump_folder, err));
  size_t cap = strlen(s->dump_folder) + 32;
  char* path = malloc(cap);
  if (!path) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  snprintf(path, cap, "%s/model.safetensors", s->dump_folder);
  int rc = tr_st_export_model(&t->model, path, dt, err);
  if (rc == 0) {
    if (con) fprintf(con, "wrote %s\n", path);
    snprintf(path, cap, "%s/config.json", s->dump_folder);
    rc = tr_hf_write_config(&t->model.cfg, path, err);
  }
  free(path);
  return rc;
}

static int open_metrics(tr_trainer_t* t, FILE* con, tr_metrics_logger_t** out,
                        tr_errmsg_t* err) {
  const tr_trainer_metrics_t* mt = &t->settings.metrics;
  int files = t->rank == 0 || mt->save_for_all_ranks;
  const char* dump = t->settings.dump_folder;
  char* jsonl = NULL;
  char* tb = NULL;
  size_t cap = strlen(dump) + strlen(mt->save_jsonl_file) +
               strlen(mt->save_tb_folder) + 64;
  if (files && mt->enable_jsonl) {
    if (!(jsonl = malloc(cap)))
      return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    if (t->world > 1 && mt->save_for_all_ranks)
      snprintf(jsonl, cap, "%s/rank_%d_%s", dump, t->rank,
               mt->save_jsonl_file);
    else
      snprintf(jsonl, cap, "%s/%s", dump, mt->save_jsonl_file);
  }
  if (files && mt->enable_tensorboard) {
    if (!(tb = malloc(cap))) {
      free(jsonl);
      return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    }
    char stamp[32];
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M", &tmv);
    int n = snprintf(tb, cap, "%s/%s/%s", dump, mt->save_tb_folder, stamp);
    if (t->world > 1 && mt->save_for_all_ranks)
      snprintf(tb + n, cap - (size_t)n, "/rank_%d", t->rank);
  }
  tr_metrics_opts_t mo = {
      .console = con,
      .color = con && !mt->disable_color_printing && isatty(fileno(con)),
      .jsonl_path = jsonl,
      .tb_dir = tb};
  int rc = tr_metrics_open(out, &mo, err);
  free(jsonl);
  free(tb);
  return rc;
}

int tr_train(const tr_trainer_settings_t* settings,
             const tr_trainer_opts_t* opts, int* stopped, tr_errmsg_t* err) {
  if (stopped) *stopped = 0;
  tr_trainer_t t;
  TR_CHECK(tr_trainer_init(&t, settings, opts, err));
  const tr_trainer_settings_t* s = &t.settings;
  FILE* con = t.opts.quiet || t.rank != 0
                  ? NULL
                  : (t.opts.console ? t.opts.console : stdout);
  tr_metrics_logger_t* ml = NULL;
  int rc = tr_fault_arm(s->debug.faults, (int)s->debug.n_faults,
                        (int)tr_param_int(TR_PARAM_RANK),
                        (int)tr_param_int(TR_PARAM_RESTART_COUNT), err);
  if (rc == 0) rc = open_metrics(&t, con, &ml, err);
  if (rc == 0) rc = tr_trainer_checkpoint_start(&t, con, ml, err);
  if (rc < 0) goto out;
  tr_heartbeat_set_total(s->training.steps);
  tr_heartbeat_beat("init", t.step, NAN, 0);

  if (con) {
    char ms[160];
    fprintf(con,
            "model %s | data '%s': %" PRId64 " tokens, %" PRId64
            " sequences of %" PRId64 " per epoch | seed %" PRIu64 "%s\n",
            model_summary(&t.model, ms, sizeof ms), s->training.dataset_path,
            t.train.end - t.train.begin, t.train.nsamples, t.T, t.seed,
            s->debug.seed_set ? "" : " (picked; set debug.seed to repeat)");
    const tr_model_tp_t* tp = &t.model.tp;
    if (tp->size > 1)
      fprintf(con,
              "tensor parallel %d: sequence parallel %s, loss parallel %s, "
              "%s\n",
              tp->size, tp->sequence_parallel ? "on" : "off",
              tp->loss_parallel ? "on" : "off",
              tp->overlap ? "async (chunk rings overlapped with the GEMMs)"
                          : "blocking collectives");
    if (t.device.type == TR_DEV_CUDA) {
      char ds[32];
      fprintf(con, "device %s (%s), %s compute, float32 master weights\n",
              tr_device_str(t.device, ds, sizeof ds), t.device_name,
              tr_dtype_name(t.compute_dtype));
    }
    fflush(con);
  }

  /* SIGHUP (a closed terminal or ssh session) stops as SIGTERM does, as
   * the daemon makes it for several ranks */
  struct sigaction sa, old_int, old_term, old_hup;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESETHAND; /* a second signal acts as usual */
  sigemptyset(&sa.sa_mask);
  stop_signal = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);

  double start = tr__now(), last = start;
  int64_t last_step = 0, tokens = 0;
  int64_t steps = s->training.steps, log_freq = s->metrics.log_freq;
  tr_mem_kind_t mk = t.device.type == TR_DEV_CUDA ? TR_MEM_DEVICE : TR_MEM_HOST;
  int dev = t.device.type == TR_DEV_CUDA ? t.device.index : 0;
  double peak = tr_peak_bf16_flops(t.device_name); /* 0 (MFU n/a): unknown */
  while (t.step < steps) {
    tr_step_stats_t st;
    rc = tr_trainer_step(&t, &st, err);
    if (rc < 0) break;
    tr_heartbeat_beat("step", st.step, st.loss,
                      st.seconds > 0 ? (double)st.tokens / st.seconds : 0);
    tokens += st.tokens;
    int stopping = stop_signal != 0;
    if (t.world > 1) {
      /* every rank stops after the same step, or the others would wait in
       * the next step's collectives for the one that left */
      double any = stopping;
      rc = tr__trainer_sum_all(&t, &any, 1);
      if (rc < 0) {
        tr_errmsg_set(err, rc, "step %" PRId64 ": stop agreement: %s", st.step,
                      tr_strerror(rc));
        break;
      }
      stopping = any > 0;
    }
    if (st.step == 1 || st.step % log_freq == 0 || st.step == steps ||
        stopping) {
      double now = tr__now(), dt = now - last;
      tr_mem_stats_t ms;
      tr_mem_stats(mk, dev, &ms);
      double tps = dt > 0 ? (double)tokens / dt : 0;
      tr_metrics_t mt = {
          .step = st.step,
          .total_steps = steps,
          .loss = st.loss,
          .grad_norm = st.grad_norm,
          .lr = st.lr,
          .tps = tps,
          .tflops = t.flops_per_token * tps / 1e12,
          .mfu = peak > 0 ? 100.0 * t.flops_per_token * tps / peak : NAN,
          .mem_current = ms.current_bytes,
          .mem_peak = ms.peak_bytes,
          .elapsed = now - start,
          .eta =
              (double)(steps - st.step) * dt / (double)(st.step - last_step)};
      if (t.dist.comm_take) { /* [metrics] comm_overlap: per step */
        tr_pg_comm_t fc = {0};
        t.dist.comm_take(t.dist.arg, &fc);
        if (fc.steps > 0) {
          mt.comm_ms = fc.comm_ms / (double)fc.steps;
          mt.comm_exposed_ms = fc.exposed_ms / (double)fc.steps;
          mt.comm_hidden = fc.hidden;
        }
      }
      if (t.tp_comm && t.tp.comm_timing) { /* the tp hook's ops, per step,
                                              on this rank */
        tr_pg_comm_t tc;
        tr_tp_comm_take(t.tp_comm, &tc);
        if (tc.steps > 0) {
          mt.tp_comm_ms = tc.comm_ms / (double)tc.steps;
          mt.tp_comm_exposed_ms = tc.exposed_ms / (double)tc.steps;
          mt.tp_comm_hidden = tc.hidden;
        }
      }
      rc = tr_metrics_log(ml, &mt, err);
      if (rc < 0) break;
      last = now;
      last_step = st.step;
      tokens = 0;
    }
    if (t.has_val &&
        (st.step % s->validation.freq == 0 || st.step == steps || stopping)) {
      double vl;
      int64_t vn;
      double v0 = tr__now();
      rc = tr_trainer_validate(&t, &vl, &vn, err);
      if (rc == 0) rc = tr_metrics_log_val(ml, st.step, steps, vl, vn, err);
      if (rc < 0) break;
      last += tr__now() - v0; /* keep validation out of tok/s */
    }
    rc = tr_trainer_checkpoint_step(&t, &st, st.step == steps || stopping,
                                    err);
    if (rc < 0) break;
    if (stopping) {
      if (con)
        fprintf(con, "stopping after step %" PRId64 " (%s)\n", st.step,
                stop_signal == SIGINT    ? "SIGINT"
                : stop_signal == SIGTERM ? "SIGTERM"
                : stop_signal == SIGHUP  ? "SIGHUP"
                                         : "another rank was signalled");
      if (stopped) *stopped = 1;
      break;
    }
  }
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGHUP, &old_hup, NULL);
  if (rc == 0) rc = tr_trainer_checkpoint_finish(&t, err);
  if (rc == 0 && t.dist.gather_model) {
    rc = t.dist.gather_model(t.dist.arg, &t.model);
    if (rc < 0)
      tr_errmsg_set(err, rc, "gathering the weights: %s", tr_strerror(rc));
  }
  if (rc == 0 && t.tp.pg) rc = tp_gather_weights(&t, err);
  if (rc == 0 && t.pp.pg) rc = tr__trainer_pp_gather(&t, err);
  if (rc == 0 && t.rank == 0) rc = write_weights(&t, con, err);
out:
  tr_metrics_close(ml);
  tr_trainer_release(&t);
  return rc;
}

/* ---- sampling ---- */

static uint64_t rng_next(uint64_t* s) { /* SplitMix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static int pick_token(const float* logits, int V, const tr_sample_opts_t* o,
                      uint64_t* rng, double* work, int* idx) {
  if (!(o->temperature > 0)) {
    int best = 0;
    for (int i = 1; i < V; i++)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  int k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
  for (int i = 0; i < V; i++) idx[i] = i;
  if (k < V) { /* partial selection: the k largest first */
    for (int i = 0; i < k; i++) {
      int b = i;
      for (int j = i + 1; j < V; j++)
        if (logits[idx[j]] > logits[idx[b]]) b = j;
      int tmp = idx[i];
      idx[i] = idx[b];
      idx[b] = tmp;
    }
  }
  double mx = -INFINITY;
  for (int i = 0; i < k; i++)
    if (logits[idx[i]] > mx) mx = logits[idx[i]];
  double sum = 0;
  for (int i = 0; i < k; i++) {
    work[i] = exp(((double)logits[idx[i]] - mx) / o->temperature);
    sum += work[i];
  }
  double u = (double)(rng_next(rng) >> 11) * 0x1.0p-53 * sum;
  for (int i = 0; i < k; i++) {
    u -= work[i];
    if (u < 0) return idx[i];
  }
  return idx[k - 1];
}

int tr_sample(tr_model_t* m, const int32_t* prompt, int64_t n,
              const tr_sample_opts_t* o, int32_t* out, int64_t* nout,
              tr_errmsg_t* err) {
  *nout = 0;
  int V = m->cfg.vocab_size, maxT = m->cfg.max_seq_len;
  int64_t cap = n + o->max_new_tokens + 1;
  int32_t* ctx = malloc((size_t)cap * sizeof *ctx);
  double* work = malloc((size_t)V * sizeof *work);
  int* idx = malloc((size_t)V * sizeof *idx);
  int rc = 0;
  if (!ctx || !work || !idx) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  int64_t len = 0;
  if (n == 0) ctx[len++] = TR_BYTE_EOT; /* an empty prompt starts a document */
  for (int64_t i = 0; i < n; i++) {
    if (prompt[i] < 0 || prompt[i] >= V) {
      rc = tr_errmsg_set(err, TR_EINVAL,
                         "prompt token %" PRId32 " at %" PRId64
                         " is not below the vocabulary size %d",
                         prompt[i], i, V);
      goto out;
    }
    ctx[len++] = prompt[i];
  }
  uint64_t rng = o->seed;
  for (int64_t g = 0; g < o->max_new_tokens; g++) {
    int64_t T = len < maxT ? len : maxT;
    tr_model_mb_t mb;
    rc = tr_model_mb_init(m, &mb, 1, (int)T, ctx + len - T, NULL);
    if (rc == 0) {
      mb.no_grad = 1;
      rc = tr_model_forward(m, &mb, 0, m->n_blocks);
    }
    if (rc < 0) {
      tr_model_mb_release(m, &mb);
      rc = tr_errmsg_set(err, rc, "sampling: forward: %s", tr_strerror(rc));
      goto out;
    }
    const float* logits =
        (const float*)tr_tensor_data(&mb.logits) + (T - 1) * (int64_t)V;
    int tok = pick_token(logits, V, o, &rng, work, idx);
    tr_model_mb_release(m, &mb);
    ctx[len++] = tok;
    out[(*nout)++] = tok;
    if (o->stop_at_eot && tok == TR_BYTE_EOT) break;
  }
out:
  free(ctx);
  free(work);
  free(idx);
  return rc;
}
