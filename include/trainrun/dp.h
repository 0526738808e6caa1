/* trainrun/dp.h: the data-parallel seam — what the trainer asks of a
 * data-parallel layer (DDP, FSDP, HSDP: fsdp2/), and the pieces those
 * layers share: the exact rank-ordered sum of scalars (the
 * communication-overlap figures, tr_pg_comm_t, and the waits that measure
 * them are collectives/', trainrun/pg_waits.h).
 *
 * The trainer holds one tr_dp_t, filled by tr_ddp_dp() or tr_fsdp_dp()
 * (all NULL / 1 on one rank), and calls it at fixed points of a step:
 *
 *   tr_trainer_init   setup_model (after the parameter table is built,
 *                     before its memory: layouts, hooks)
 *   each micro-step   pre_micro_step (before its forward)
 *   after backward    post_backward (the grads become the sum over the
 *                     data-parallel ranks)
 *   step's scalars    all_reduce_sum (loss sum, token count, and the
 *                     squared gradient norm when grads_sharded)
 *   step's end        step_end (after the device synchronisation), then
 *                     comm_take when [metrics] comm_overlap is on
 *   end of the run    gather_model (every parameter whole on every rank)
 *
 * Under pipeline parallelism the trainer sets `pipelined` before
 * setup_model, and the executor's UNSHARD / RESHARD / REDUCE_GRAD actions
 * of a stage call stage_op with the stage's blocks (PyTorch's pipeline
 * runtime calls the stage's FSDP modules' unshard, reshard and
 * post-backward reduction there).
 *
 * This header sits in fsdp2/ (below trainer/), so a data-parallel layer
 * never needs the trainer: the callbacks see the model and the step
 * number only. */
#ifndef TRAINRUN_DP_H
#define TRAINRUN_DP_H

#include <stdint.h>

#include "trainrun/model.h"
#include "trainrun/pg.h"
#include "trainrun/pg_waits.h" /* tr_pg_comm_t: comm_take */

#ifdef __cplusplus
extern "C" {
#endif

/* Sum n doubles over the ranks of pg, in place: every rank's values are
 * gathered and added in rank order in double precision, so every rank
 * gets the same bits (an all-reduce would not promise that). A group of
 * one rank (or NULL) leaves them. Collective over pg. */
int tr_dp_sum_over(tr_pg_t* pg, double* vals, int n);

/* A pipeline stage's data-parallel action (the executor's UNSHARD,
 * RESHARD, REDUCE_GRAD). */
typedef enum {
  TR_DP_UNSHARD = 0,    /* start gathering the blocks' parameters */
  TR_DP_RESHARD = 1,    /* free their gathered parameters */
  TR_DP_REDUCE_GRAD = 2 /* the step's last backward of the blocks ran:
                           reduce their accumulated gradients */
} tr_dp_stage_op_t;

/* The seam. */
typedef struct tr_dp {
  int dp_rank, dp_size; /* 0 and 1 on one rank */
  /* After the last micro-step's backward, before the gradient norm: make
   * every parameter's grad the SUM over data-parallel ranks (the losses are
   * already scaled by the global token count), e.g. by waiting for the
   * bucketed all-reduces started in the model's post-backward hooks.
   * step: the optimizer step in progress, from 1. */
  int (*post_backward)(void* arg, tr_model_t* m, int64_t step);
  /* Sum n doubles over the data-parallel ranks, in place (loss sums, token
   * counts; the squared grad norm when grads_sharded). */
  int (*all_reduce_sum)(void* arg, double* vals, int n);
  /* k >= 1 when each rank holds only a shard of every gradient and each
   * shard is held by k ranks: the squared norm is summed over the ranks
   * and divided by k. The layer derives k from the parameters' placements
   * (the mesh dims that shard them are summed over, the replicating dims
   * counted once: FSDP 1, HSDP the replicate degree). 0: whole grads. */
  int grads_sharded;
  /* Called by tr_trainer_init after the model's table is built, before its
   * memory is allocated: set parameter placements (shards) and install
   * block hooks, and set dp->grads_sharded (the trainer's copy of this
   * seam) from the placements it set. NULL: nothing. */
  int (*setup_model)(void* arg, tr_model_t* m, struct tr_dp* dp);
  /* Called on every rank before rank 0 writes the final weights: make
   * every parameter whole (FSDP all-gathers). NULL: they are. */
  int (*gather_model)(void* arg, tr_model_t* m);
  /* Called before each micro-step's forward, micro = 0 .. n_micro - 1 of
   * optimizer step `step`. The backward of the last one makes the grads
   * final: DDP's post-backward hooks then start each bucket's all-reduce
   * as soon as its grads are final. NULL: nothing. */
  int (*pre_micro_step)(void* arg, tr_model_t* m, int64_t step, int64_t micro,
                        int64_t n_micro);
  /* Called once per optimizer step after the step's device synchronisation
   * (the loss and the norm were read): settle the communication still held
   * and read its timing; the first error. NULL: nothing. */
  int (*step_end)(void* arg);
  /* The communication overlap measured since the last call (steps 0: not
   * measured). NULL: never measured. */
  void (*comm_take)(void* arg, tr_pg_comm_t* out);
  /* Set by the trainer before setup_model when a step is a pipeline
   * schedule (several micro-batches over this rank's stages): the layer
   * then reduces each gradient once per step (FSDP: parameters gathered
   * at their first use stay gathered, the unsharded gradients accumulate
   * over the micro-batches, and stage_op's REDUCE_GRAD, or post_backward
   * for what is left, reduce-scatters them; DDP: post_backward all-reduces
   * after the schedule). */
  int pipelined;
  /* A pipeline stage's action on blocks [first, last) (pipelined only).
   * NULL: the layer has none (the executor then does nothing there). */
  int (*stage_op)(void* arg, tr_model_t* m, tr_dp_stage_op_t op, int first,
                  int last);
  void* arg;
} tr_dp_t;

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_DP_H */
