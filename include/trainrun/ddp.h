/* trainrun/ddp.h: DDP, the replicate-only data parallelism (fsdp2/ddp.c)
 * -- the gradient all-reduce (bucketed, SUM) and the scalar sums behind
 * the trainer's data-parallel seam (trainrun/dp.h), over a process group
 * (trainrun/pg.h).
 *
 * Typical use (what a worker of `trainrun --nproc-per-node 4 job.toml`
 * does):
 *
 *     tr_ddp_opts_t o;
 *     tr_ddp_opts_init(&o);
 *     o.pg = world;                       // every rank of the group trains
 *     o.train_timeout_ms = 100000;        // [comm] train_timeout_seconds
 *     tr_ddp_t* ddp;
 *     TR_CHECK(tr_ddp_new(&o, &ddp));
 *     tr_dp_t dist;
 *     tr_ddp_dp(ddp, &dist);
 *     tr_trainer_opts_t to = {.dist = &dist};
 *     rc = tr_train(&settings, &to, &stopped, &err);  // trainrun/trainer.h
 *     tr_ddp_free(ddp);
 *
 * Gradients: the parameters are grouped, in reverse parameter order (the
 * order backward finishes them, as PyTorch's DDP does), into flat buckets
 * of about bucket_bytes (one dtype and device per bucket). During the
 * backward of the last micro-step of a step, the model's post-backward
 * hook (installed by the trainer's setup_model seam) copies each bucket's
 * grads into its flat buffer and issues its all-reduce SUM (async) as
 * soon as the backward has passed the first block using each of its
 * parameters (for a tied table: the embedding), so communication overlaps
 * the rest of the backward; buckets are issued in bucket order on every
 * rank. The trainer's post_backward issues any left and has the sums
 * copied back into the grads before the gradient norm: on the CPU (Gloo,
 * MPI) the host waits for each bucket and copies it; on CUDA (NCCL) the
 * streams wait (tr_pg_work_wait_stream: the legacy default stream and the
 * kernels' stream) and the copy-back is enqueued behind the wait, with no
 * host wait; the works are held until the trainer's step_end (after it
 * read the norm), where the host sees them complete and their first error
 * fails the step (held works of a step that failed before it are settled
 * at the next step's start). Either way an all-reduce that failed is
 * logged as "all-reduce of gradient bucket <b>: <error>". Earlier
 * micro-steps only accumulate locally. The trainer scales the loss by the global token
 * count, so the sum is the gradient of the global mean loss. The buckets
 * and their summation are the same with or without overlap (opts.overlap),
 * so both give the same bits.
 *
 * Scalars (loss sums, token counts): every rank's values are gathered and
 * summed in rank order in double precision, so every rank gets the same
 * bits.
 *
 * Communication overlap (opts.comm_timing, from [metrics] comm_overlap;
 * tr_dp_t's comm_take): op timing is on for the group, each step adds its bucket
 * all-reduces' durations (comm) and the time the compute waited for them
 * (exposed: on the CPU the host's time in post_backward's waits, on CUDA
 * the kernels' stream's stall between two events around each stream
 * wait); hidden = 1 - exposed / comm, clamped to [0, 1]. The trainer puts
 * them on the step line, in metrics.jsonl and TensorBoard. Timing changes
 * no result: the same bits with it on and off.
 *
 * Under pipeline parallelism (the trainer calls no pre_micro_step) the
 * buckets cover the grads this rank holds (its stages' parameters) and
 * post_backward all-reduces all of them once, after the schedule.
 *
 * The group's timeout switches to train_timeout_ms once the first
 * gradient sync has completed (set-up and the first step run under the
 * init timeout the group was made with). */
#ifndef TRAINRUN_DDP_H
#define TRAINRUN_DDP_H

#include <stdint.h>

#include "trainrun/pg.h"
#include "trainrun/dp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_ddp tr_ddp_t;

typedef struct {
  tr_pg_t* pg;              /* borrowed: the data-parallel group */
  int64_t bucket_bytes;     /* target bucket size; default 25 MiB */
  int64_t train_timeout_ms; /* > 0: the group's timeout after the first
                               sync; 0 keeps it */
  int overlap;     /* 1 (default): all-reduce from the backward hooks; 0: all
                  after the backward, in post_backward */
  int comm_timing; /* 1: time the all-reduces and the compute's waits for
                      them (comm_take); [metrics] comm_overlap. Default 0 */
  /* Fault injection (--debug.fault skip_collective / mismatch; the
   * launcher passes tr_fault_grad_sync): asked once per step before the
   * first bucket's all-reduce with the group, the first bucket's flat and
   * the step; > 0: it took the collectives' place (the step's buckets are
   * not all-reduced), < 0: an error. NULL: none. */
  int (*sync_fault)(tr_pg_t* pg, tr_tensor_t* flat, int64_t step);
} tr_ddp_opts_t;

/* Fill opts with the defaults (pg NULL, overlap 1). */
void tr_ddp_opts_init(tr_ddp_opts_t* opts);

/* A data-parallel layer over opts->pg (which must outlive it). Buckets are
 * laid out at the first step, from the model the trainer passes.
 * TR_EINVAL without a group or with bucket_bytes < 1; TR_ENOMEM. *out is
 * freed with tr_ddp_free. */
int tr_ddp_new(const tr_ddp_opts_t* opts, tr_ddp_t** out);

/* Fill *dist with the rank, size and the hooks of d (arg = d): setup_model,
 * pre_micro_step, post_backward, step_end, comm_take, all_reduce_sum. */
void tr_ddp_dp(tr_ddp_t* d, tr_dp_t* dist);

/* Number of buckets (0 before the first step), the bucket all-reduces
 * issued so far, and how many of those were issued from the backward hooks
 * (before the trainer's post_backward). */
int tr_ddp_nbuckets(const tr_ddp_t* d);
int64_t tr_ddp_reduces(const tr_ddp_t* d);
int64_t tr_ddp_overlapped(const tr_ddp_t* d);

/* Wait for any all-reduce in flight or held, free the buckets and d (and
 * turn the group's op timing off again if d turned it on). Free the
 * trainer (its model holds d's hook) first. NULL is a no-op. */
void tr_ddp_free(tr_ddp_t* d);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_DDP_H */
