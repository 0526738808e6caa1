/* fsdp2/internal.h: what the files of fsdp2/ share — the layout of a
 * sharded model (groups, each parameter's rows and its place in its group's
 * flat all-gather input), computed from the parameter table alone
 * (plan.c), and how the compute waits for the collectives (overlap.c). */
#ifndef TRAINRUN_FSDP2_INTERNAL_H
#define TRAINRUN_FSDP2_INTERNAL_H

#include <stdint.h>

#include "trainrun/dp.h"      /* tr_dp_comm_t */
#include "trainrun/dtensor.h" /* placements: where the rows come from */
#include "trainrun/model.h"
#include "trainrun/pg.h"

/* One parameter under sharding over n ranks, seen from rank r, as its
 * placement says (dtensor: Shard(0) on dp_shard, cutting the piece the
 * other mesh dims leave — the whole tensor without tensor parallelism). */
typedef struct {
  int64_t start, rows; /* this rank's rows of dim 0 of that piece */
  int64_t row_numel;   /* elements per dim-0 row */
  int64_t pad;         /* padded shard: ceil(dim0 / n) rows, in elements */
  int64_t off;         /* first element in its group's flat shard */
  int64_t numel;       /* elements of the piece (what the blocks read) */
  int64_t shape[TR_MAX_DIMS]; /* the piece's shape: the unsharded tensor */
} tr__fsdp_param_t;

/* One fully_shard group. */
typedef struct {
  char name[32];
  int is_root;
  int first_block, last_block; /* lowest and highest block index */
  int n;                       /* params (each once, table order) */
  int* params;                 /* points into the plan's storage */
  int64_t shard_numel;         /* S: sum of pad */
  int64_t global_numel;        /* sum of numel */
} tr__fsdp_group_t;

typedef struct {
  int nparams, nblocks, ngroups;
  tr__fsdp_param_t* params; /* [nparams] */
  int* param_group;         /* [nparams] */
  int* block_group;         /* [nblocks]; -1: no group */
  tr__fsdp_group_t* groups; /* [ngroups]; 0 is the root */
  int* storage;             /* the groups' param lists */
} tr__fsdp_plan_t;

/* Groups of m (root: the embedding and head blocks; one per layer) and
 * each parameter's shard on this rank of mesh, from the parameter's
 * placement: with placed, the one in the table (FSDP has composed it
 * there); without, the table's composed with Shard(0) on "dp_shard" here
 * (the table is not changed: `trainrun plan`). TR_EUNSUPPORTED when a
 * parameter is used by blocks of two groups or has no dims; TR_EINVAL
 * when a placement does not shard dim 0 on dp_shard; TR_ENOMEM. */
int tr__fsdp_plan_build(tr__fsdp_plan_t* pl, const tr_model_t* m,
                        const tr_mesh_shape_t* mesh, int placed);
void tr__fsdp_plan_release(tr__fsdp_plan_t* pl);

/* ---- waiting for the collectives (fsdp2/overlap.c) ----
 * Shared by FSDP/HSDP (fsdp.c) and DDP (ddp.c). */

/* How long the compute waited for communication: on the CPU the host's
 * time inside each wait; on CUDA the kernels' stream's stall between two
 * events recorded around each stream wait, read once complete (never a
 * host wait of its own). */
typedef struct {
  void* pairs;          /* CUDA event pairs around the stream waits */
  int npairs, cappairs; /* pending, made */
  double exposed_us;    /* waits read so far (the caller zeroes it) */
} tr__dp_stall_t;

/* A wait being timed: tr__dp_stall_begin fills it before the wait,
 * tr__dp_stall_end closes it after. */
typedef struct {
  double t0; /* CPU: the clock before the wait */
  int pair;  /* CUDA: 1 + the pair recorded before, 0 untimed */
} tr__dp_stall_mark_t;

void tr__dp_stall_begin(tr__dp_stall_t* s, int cuda, tr__dp_stall_mark_t* mk);
void tr__dp_stall_end(tr__dp_stall_t* s, int cuda,
                      const tr__dp_stall_mark_t* mk);
/* Add the complete CUDA pairs to exposed_us, without waiting. */
void tr__dp_stall_read(tr__dp_stall_t* s);
void tr__dp_stall_release(tr__dp_stall_t* s);

/* A work whose consumer already waits for it on the device, held until
 * the host sees it complete. */
typedef struct {
  tr_pg_work_t* w;
  const char* what; /* "all-gather", ... for messages */
  const char* kind; /* "group", "bucket" */
  const char* name; /* its group's or bucket's name (the caller's storage,
                       alive while the work is held) */
  int timed;        /* its duration counts */
} tr__dp_held_t;

typedef struct {
  int lag;             /* works held at most before the host waits */
  tr__dp_held_t* held; /* [lag + 1], oldest first */
  int nheld;
  tr__dp_stall_t stall; /* the compute's waits */
  /* since the counters were last zeroed by the caller */
  double comm_us; /* durations of the timed collectives */
  int64_t ops;    /* collectives timed */
} tr__dp_waits_t;

int tr__dp_waits_init(tr__dp_waits_t* q, int lag);
/* The compute waits for w's op and w is taken (freed now or later). CPU
 * (cuda 0): the host waits; returns the op's status. CUDA: when consume,
 * the compute stream and the legacy default stream wait (no host wait)
 * and the handle is held; consume 0 (an op nobody reads: an unused
 * prefetch) only holds it. Held works that completed are settled on the
 * way, and past `lag` held the host waits for the oldest: the error of
 * any of them is returned (and logged as "<what> of <kind> <name>: ...").
 * timed: count the op's duration (its group has op timing on) and the
 * wait. */
int tr__dp_wait(tr__dp_waits_t* q, tr_pg_work_t* w, int cuda, int consume,
                int timed, const char* what, const char* kind,
                const char* name);
/* Host-wait for every held work (no device wait once the device has run
 * the step) and read the complete stall events; the first error. */
int tr__dp_waits_drain(tr__dp_waits_t* q);
/* Drain and free. */
void tr__dp_waits_release(tr__dp_waits_t* q);
/* The totals since the last take into *out (steps: *steps, the layer's
 * count of timed steps), and start new ones (*steps too). */
void tr__dp_waits_take(tr__dp_waits_t* q, int64_t* steps, tr_dp_comm_t* out);

#endif /* TRAINRUN_FSDP2_INTERNAL_H */
