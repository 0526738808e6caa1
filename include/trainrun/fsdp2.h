/* trainrun/fsdp2.h: fully sharded data parallel (PyTorch's FSDP2,
 * `fully_shard`) and HSDP for the trainer, living entirely in the model's
 * block hooks.
 *
 * Sharding. Every parameter is split on dim 0 over the shard group with
 * torch.chunk semantics: with n ranks, chunk rows c = ceil(dim0 / n), rank
 * r holds rows [r*c, min(dim0, (r+1)*c)) — uneven, and empty on trailing
 * ranks when dim0 < n*c - c. The model's parameter table describes the
 * local shard (layout.offset/shape), so the optimizer, gradient clipping
 * and checkpoints see shards; init is by global index, so a sharded model
 * starts from exactly the slices of the one-rank model.
 *
 * Groups (one `fully_shard` call each): one per transformer layer, plus a
 * root group holding the embedding and the head (final norm, output; a
 * tied table is in both). A group is one all-gather and one reduce-scatter.
 *
 *   all-gather  copy-in: every parameter's shard padded to c rows (zeros)
 *               goes into one flat input of S elements (param_dtype; the
 *               cast of the fp32 shards is the copy); all_gather_into_tensor
 *               gives n*S; copy-out: rank j's slice of each parameter goes
 *               to rows [j*c, (j+1)*c) of that parameter's unsharded buffer,
 *               whose first dim0 rows are what the blocks read.
 *   reduce-     the unsharded grads (zero padding rows) are laid out rank
 *   scatter     by rank in reduce_dtype (n*S), reduce-scattered (SUM), then
 *               (HSDP) all-reduced (SUM) across the replicate group,
 *               divided by divide_factor, and added to the sharded grads.
 *
 * When (per block b of group g):
 *   pre_forward   issue g's all-gather if g is sharded, issue the next
 *                 prefetch_depth groups' all-gathers (forward order; they
 *                 run on the group's communication thread while b
 *                 computes), wait for g's and copy out;
 *   post_forward  after g's last block: free the unsharded parameters when
 *                 reshard_after_forward says so (always: yes; never: no;
 *                 default: all but the root group) or when the pass keeps
 *                 no activations (eval);
 *   pre_backward  as pre_forward, prefetching in reverse block order, and
 *                 zeroed unsharded grads for g;
 *   post_backward after g's first block: the reductions issued before
 *                 move on (they ran during this block's backward): the
 *                 previous group's reduce-scatter is waited for and, under
 *                 HSDP, its all-reduce across replicas issued (async; it
 *                 is waited for one group later), else added into the
 *                 grads; then g's unsharded parameters are freed, its
 *                 grads laid out and freed, and its reduce-scatter issued
 *                 (async). tr_fsdp_sync_grads completes what is left.
 * Gradient accumulation: each backward reduce-scatters and adds into the
 * sharded grads (PyTorch's default).
 *
 * Under pipeline parallelism (tr_dp_t.pipelined, set by the trainer
 * before setup_model; the seam's stage_op runs the executor's stage
 * actions): a group gathered at its first use in the step (the stage's
 * UNSHARD, or its first forward) stays gathered through every
 * micro-batch — post_forward frees nothing but no_grad passes, and
 * post_backward neither frees nor reduces — while the unsharded grads
 * accumulate; the stage's REDUCE_GRAD reduce-scatters each of its groups
 * once (HSDP: all-reduces once), at the later REDUCE_GRAD for a group on
 * two stages of the rank, and frees it; RESHARD frees gathered
 * parameters; tr_fsdp_sync_grads reduces what is left and frees every
 * group for the optimizer. One all-gather and one reduce-scatter a group
 * a step, the rank's stages' parameters and fp32 grads held unsharded
 * for the step. With reshard_after_forward "always" (torchtitan's
 * explicit "always" under pp) each forward frees its groups (not while a
 * backward of the group is open: a zero-bubble W still to come) and the
 * backward gathers them again; the reductions stay one a step.
 *
 * Typical use (what a worker of `trainrun --nproc-per-node 4` does):
 *
 *     tr_fsdp_opts_t o;
 *     tr_fsdp_opts_init(&o);
 *     o.shard_pg = shard;           // dp_shard group (size n)
 *     o.replicate_pg = replicate;   // dp_replicate group, NULL for FSDP
 *     o.divide_factor = 1;          // the trainer scales the loss globally
 *     tr_fsdp_t* f;
 *     TR_CHECK(tr_fsdp_new(&o, &f));
 *     tr_dp_t dist;
 *     tr_fsdp_dp(f, &dist);         // setup_model shards the table
 *     tr_trainer_opts_t to = {.dist = &dist};
 *     rc = tr_train(&settings, &to, &stopped, &err);  // trainrun/trainer.h
 *     tr_fsdp_free(f);
 *
 * or by hand on a model: tr_model_init, tr_fsdp_shard_model, tr_model_alloc,
 * tr_model_init_weights, forward/backward, tr_fsdp_sync_grads.
 *
 * Dtypes: param_dtype is the dtype of the all-gather and the unsharded
 * parameters (the compute dtype; bf16 on GPU under mixed precision, fp32 on
 * CPU), reduce_dtype that of the reduce-scatter (fp32 default). The
 * unsharded grads are fp32 (the kernels accumulate parameter gradients in
 * fp32; PyTorch keeps them in param_dtype). The sharded parameters, grads
 * and optimizer state stay in the dtype the model allocated (fp32 master
 * weights).
 */
#ifndef TRAINRUN_FSDP2_H
#define TRAINRUN_FSDP2_H

#include <stdint.h>

#include "trainrun/errmsg.h"
#include "trainrun/model.h"
#include "trainrun/pg.h"
#include "trainrun/tensor.h"
#include "trainrun/dp.h"      /* tr_dp_t, the trainer's seam */
#include "trainrun/dtensor.h" /* placements: the one sharding truth */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- shard arithmetic (torch.chunk on dim 0) ---- */

/* Rows each rank's padded shard has: ceil(dim0 / n) (0 when dim0 is 0). */
int64_t tr_fsdp_padded_rows(int64_t dim0, int n);
/* Rows [*start, *start + *rows) of dim0 that rank r of n holds. */
void tr_fsdp_shard_rows(int64_t dim0, int n, int r, int64_t* start,
                        int64_t* rows);

/* ---- options ---- */

typedef enum {
  TR_FSDP_RESHARD_DEFAULT = 0, /* every group but the root */
  TR_FSDP_RESHARD_ALWAYS = 1,  /* ZeRO-3 */
  TR_FSDP_RESHARD_NEVER = 2    /* ZeRO-2: keep for backward */
} tr_fsdp_reshard_t;

/* "default", "always", "never" ([parallelism] fsdp_reshard_after_forward);
 * TR_EINVAL otherwise. */
int tr_fsdp_reshard_parse(const char* s, tr_fsdp_reshard_t* out);
const char* tr_fsdp_reshard_name(tr_fsdp_reshard_t r);

typedef struct {
  tr_pg_t* shard_pg; /* borrowed, required: the dp_shard group */
  /* The job mesh's shape (copied): the parameters' placements are on it;
   * it must have a dim "dp_shard" (and "dp_replicate" under HSDP) whose
   * size and coordinate are the groups'. NULL: a [dp_replicate, dp_shard]
   * mesh of the two groups. */
  const tr_mesh_shape_t* mesh;
  tr_pg_t* replicate_pg; /* borrowed: the dp_replicate group (HSDP); NULL
                            or size 1: plain FSDP */
  tr_fsdp_reshard_t reshard_after_forward;
  /* Groups whose all-gather is issued ahead of their use: 1 (default) is
   * FSDP2's implicit prefetch (the next group), k > 1 its explicit
   * set_modules_to_forward/backward_prefetch with k groups, 0 none (each
   * all-gather waited right after it is issued). The job config's
   * [parallelism] fsdp_prefetch_depth. */
  int prefetch_depth;
  tr_dtype_t param_dtype;  /* default TR_F32 */
  tr_dtype_t reduce_dtype; /* default TR_F32 */
  /* The reduced gradient is divided by this; 0 (default) means the
   * data-parallel size (replicate x shard, FSDP2's average). The trainer
   * passes 1: its loss is already scaled by the global token count. */
  double divide_factor;
  /* > 0: the groups' timeout once the first gradient sync completed. */
  int64_t train_timeout_ms;
  /* 1: time the collectives and the compute's waits for them (op timing
   * on the groups; CUDA events around the stream waits); read with
   * tr_fsdp_comm_take. [metrics] comm_overlap. */
  int comm_timing;
} tr_fsdp_opts_t;

/* Fill opts with the defaults above (no groups). */
void tr_fsdp_opts_init(tr_fsdp_opts_t* opts);

/* ---- the sharded model ---- */

typedef struct tr_fsdp tr_fsdp_t;

/* A sharding layer over opts' groups (which must outlive it). TR_EINVAL
 * without a shard group, with a negative prefetch depth or divide factor,
 * or a dtype that is not a float type; TR_ENOMEM. Free with
 * tr_fsdp_free. */
int tr_fsdp_new(const tr_fsdp_opts_t* opts, tr_fsdp_t** out);

/* Shard m: call after tr_model_init and before tr_model_alloc (TR_EINVAL
 * when m already has memory, or was sharded). Sets every parameter's
 * layout to this rank's rows, builds the groups and adds the four hooks.
 * A parameter used by blocks of two groups (other than the root's tied
 * table) is TR_EUNSUPPORTED. m must stay at its address. One model per
 * tr_fsdp_t. */
int tr_fsdp_shard_model(tr_fsdp_t* f, tr_model_t* m);

/* Complete every reduction in flight: afterwards each parameter's grad is
 * its shard of the reduced gradient (summed over every backward since the
 * grads were zeroed). On CUDA "afterwards" is in the device's order: the
 * legacy default stream and the kernels' stream wait for the reductions,
 * the host does not (as for every FSDP wait there; see below). */
int tr_fsdp_sync_grads(tr_fsdp_t* f);

/* Waiting on CUDA. The compute never holds the host up for a collective:
 * the legacy default stream (where tensors are copied and freed) and the
 * kernels' stream (tr_kern_get_stream) wait for the op's completion event,
 * and the host keeps launching. The work handles are held until the host
 * sees them complete — at the latest when the host runs 2 x
 * (prefetch_depth + 2) collectives ahead of the device, which bounds the
 * memory the ops in flight keep — and a failed op's error comes out of
 * the hook, tr_fsdp_sync_grads or tr_fsdp_step_end that settles it. On the
 * CPU the host waits, as the compute runs on it. */

/* Call once per optimizer step after the step's device synchronisation
 * (the trainer does after reading the loss and the norm): settles the
 * collectives still held — no wait then, the device has run them — and
 * reads the comm timing's events. Returns the first error among them.
 * Without it the held works are settled as later ones are issued. */
int tr_fsdp_step_end(tr_fsdp_t* f);

/* Communication overlap (opts.comm_timing): totals since the last take
 * (ops: all-gathers, reduce-scatters, replica all-reduces of training
 * passes; exposed: CUDA, the kernels' stream between events around each
 * stream wait; CPU, the host inside each wait). */
/* Fill *out with the totals since the last call (or since f was made) and
 * start new ones. All zero (hidden NaN) when comm_timing is off. */
void tr_fsdp_comm_take(tr_fsdp_t* f, tr_pg_comm_t* out);

/* Sum n doubles over the data-parallel ranks (shard, then replicate
 * group) with tr_dp_sum_over: every rank gets the same bits. */
int tr_fsdp_all_reduce_sum(tr_fsdp_t* f, double* vals, int n);

/* Make every parameter whole on this rank for good (collective): all
 * groups are gathered, layouts become the whole tensors, the hooks stop
 * acting. For exporting the final weights. */
int tr_fsdp_gather_full(tr_fsdp_t* f);

/* Fill *dist for the trainer: dp rank and size (replicate x shard), the
 * model set-up, gradient sync, scalar sums and full gather of f (arg = f),
 * grads_sharded = the replicate degree (each shard's grad is held by that
 * many ranks). */
void tr_fsdp_dp(tr_fsdp_t* f, tr_dp_t* dist);

/* Free f's buffers and references (the model keeps what it holds). NULL
 * is a no-op. */
void tr_fsdp_free(tr_fsdp_t* f);

/* ---- introspection (tests, `trainrun plan`, logs) ---- */

typedef enum {
  TR_FSDP_SHARDED = 0,
  TR_FSDP_GATHERING = 1, /* all-gather issued, not yet copied out */
  TR_FSDP_UNSHARDED = 2
} tr_fsdp_state_t;

typedef struct {
  char name[32]; /* "root", "layers.0", ... */
  int n_params;
  int is_root;
  int64_t shard_numel;  /* S: padded elements per rank (all-gather input) */
  int64_t global_numel; /* unpadded elements of the whole parameters */
  tr_fsdp_state_t state;
} tr_fsdp_group_info_t;

int tr_fsdp_ngroups(const tr_fsdp_t* f);
/* TR_EINVAL for a bad index. */
int tr_fsdp_group_info(const tr_fsdp_t* f, int g, tr_fsdp_group_info_t* out);
/* Group of a block, or -1. */
int tr_fsdp_group_of_block(const tr_fsdp_t* f, int block);
/* The flat all-gather input of group g as copy-in builds it (shards padded
 * with zero rows, param_dtype) into *out (allocated here; release it).
 * The group must be sharded. */
int tr_fsdp_copy_in(tr_fsdp_t* f, int g, tr_tensor_t* out);

typedef struct {
  int64_t all_gathers;     /* issued */
  int64_t prefetches;      /* of them, issued ahead of their group's use */
  int64_t reduce_scatters; /* issued */
  int64_t all_reduces;     /* HSDP gradient all-reduces */
} tr_fsdp_stats_t;

void tr_fsdp_stats(const tr_fsdp_t* f, tr_fsdp_stats_t* out);

/* ---- memory plan ---- */

typedef struct {
  int dp_replicate, dp_shard;
  int64_t params;          /* elements held by the rank holding most (rank 0) */
  int64_t param_bytes;     /* sharded parameters (master dtype) */
  int64_t grad_bytes;      /* sharded gradients */
  int64_t optim_bytes;     /* AdamW's two moments */
  int64_t group_bytes;     /* largest group unsharded: parameters in
                           param_dtype and their grads, padded */
  char group_name[32];     /* which group that is */
  int64_t unsharded_bytes; /* params + grads + optimizer on one rank */
} tr_fsdp_plan_t;

/* The per-rank memory of m's table (built, not allocated) under FSDP over
 * dp_shard ranks (x dp_replicate replicas), master/grad/optimizer in
 * master_dtype and unsharded groups in param_dtype. Parameters placed
 * already (a tensor-parallel plan) count their pieces: their mesh must have
 * the dims dp_replicate and dp_shard of those sizes (TR_EINVAL). */
int tr_fsdp_plan(const tr_model_t* m, int dp_replicate, int dp_shard,
                 tr_dtype_t master_dtype, tr_dtype_t param_dtype,
                 tr_fsdp_plan_t* out);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_FSDP2_H */
