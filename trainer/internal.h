/* trainer/internal.h: what the trainer's files share and nobody else
 * calls -- the checkpoint driver's hooks into the step
 * (trainer/checkpointing.c) and the device-dependent parts of a step
 * (trainer/device.c). */
#ifndef TRAINRUN_TRAINER_INTERNAL_H
#define TRAINRUN_TRAINER_INTERNAL_H

#include "trainrun/trainer.h"

/* Before the weights or AdamW moments change: order the update after an
 * async save's copies of them (tr_trainer_step calls it before its
 * optimizer step; a no-op without one): device copies are waited for on
 * the device (the host goes on), host copies on the host; never the
 * write to disk. */
void tr__trainer_checkpoint_before_update(tr_trainer_t* t);
/* Free the checkpoint state (tr_trainer_release calls it). */
void tr__trainer_checkpoint_release(tr_trainer_t* t);

/* The rows of a sequence of T tokens this rank computes: T, or T / cp
 * under context parallelism (its 2 chunks of 2 cp). */
static inline int64_t tr__trainer_cp_rows(const tr_trainer_t* t, int64_t T) {
  return t->cp.pg ? T / tr_pg_size(t->cp.pg) : T;
}

/* Sum n doubles over every rank of the run (t->world: the data-parallel
 * ranks, then the tp ranks), in place; every rank gets the same bits.
 * Local on one rank. */
int tr__trainer_sum_all(tr_trainer_t* t, double* vals, int n);

/* trainer/pipeline.c: the trainer under pipeline parallelism (t->pp.pg).
 * init (after the model's table is built and before its memory): the
 * schedule (split, lists) and the norm's skip mask; alloc: this rank's
 * stages' parameters; run: a step's micro-batches through the executor
 * (mb_end on the last stage's rank); gather: every parameter onto rank 0 (host
 * tensors) for the final weights; release. */
int tr__trainer_pp_init(tr_trainer_t* t, tr_errmsg_t* err);
int tr__trainer_pp_alloc(tr_trainer_t* t);
int tr__trainer_pp_run(tr_trainer_t* t, float scale,
                       int (*mb_end)(void* arg, int64_t micro,
                                     tr_model_mb_t* mb),
                       void* end_arg, tr_errmsg_t* err);
/* After the data-parallel gradient sync (FSDP's reduce-scatters have
 * landed): a tied table's gradient summed between the end stages. */
int tr__trainer_pp_sum_tied(tr_trainer_t* t, tr_errmsg_t* err);
int tr__trainer_pp_gather(tr_trainer_t* t, tr_errmsg_t* err);
/* tr_trainer_validate under pp: each validation batch forward only
 * through the stages (tr_pp_build_eval's lists); every rank gets the
 * mean loss and the tokens. */
int tr__trainer_pp_validate(tr_trainer_t* t, double* loss, int64_t* ntokens,
                            tr_errmsg_t* err);
void tr__trainer_pp_release(tr_trainer_t* t);

/* trainer/device.c: what depends on the device. pick: t->device,
 * device_name, compute_dtype from the settings (and the current CUDA
 * device); setup (after the weights exist): compute copies and the loss
 * accumulator; loss_add: a micro-batch's losses into *sum (CPU) or the
 * device accumulator; loss_take: the accumulator added into *sum and
 * cleared (one host synchronization); grad_sumsq: *sq += sum of squares of
 * every local grad; adamw: the update of every parameter (and its compute
 * copy). */
int tr__trainer_device_pick(tr_trainer_t* t, tr_errmsg_t* err);
int tr__trainer_device_setup(tr_trainer_t* t);
void tr__trainer_device_release(tr_trainer_t* t);
int tr__trainer_loss_add(tr_trainer_t* t, const tr_model_mb_t* mb, double* sum);
int tr__trainer_loss_take(tr_trainer_t* t, double* sum);
int tr__trainer_grad_sumsq(tr_trainer_t* t, double* sq);
int tr__trainer_adamw(tr_trainer_t* t, double lr, double clip);
/* 1 when the step can end on the device: CUDA, AdamW, and a norm that
 * needs no collective (no FSDP, TP or PP). */
int tr__trainer_tail_ok(const tr_trainer_t* t);
/* The norm, clipping to max_norm and AdamW enqueued on the device with
 * nothing for the host to wait on before the update (tr_kern_step_tail),
 * then *sq = the squared norm and *loss_sum += the losses once their
 * copies arrive (the update may still run). TR_EUNSUPPORTED: a device
 * without it. */
int tr__trainer_step_tail(tr_trainer_t* t, double lr, double max_norm,
                          double* sq, double* loss_sum);

#endif /* TRAINRUN_TRAINER_INTERNAL_H */
