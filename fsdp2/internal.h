/* fsdp2/internal.h: what the files of fsdp2/ share — the layout of a
 * sharded model (groups, each parameter's rows and its place in its group's
 * flat all-gather input), computed from the parameter table alone
 * (plan.c). */
#ifndef TRAINRUN_FSDP2_INTERNAL_H
#define TRAINRUN_FSDP2_INTERNAL_H

#include <stdint.h>

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

#endif /* TRAINRUN_FSDP2_INTERNAL_H */
