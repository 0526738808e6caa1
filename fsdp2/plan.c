/* fsdp2/plan.c: the arithmetic of FSDP2 sharding — torch.chunk rows on
 * dim 0, padding to ceil(dim0 / n) rows, the groups of a model and each
 * parameter's place in its group's flat all-gather input — and the
 * per-rank memory plan `trainrun plan` prints. No communication. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp2/internal.h"
#include "trainrun/error.h"
#include "trainrun/fsdp2.h"
#include "trainrun/log.h"

int64_t tr_fsdp_padded_rows(int64_t dim0, int n) {
  if (dim0 <= 0 || n < 1) return 0;
  int64_t start, rows;
  tr_chunk_range(dim0, n, 0, &start, &rows); /* the first chunk is largest */
  return rows;
}

void tr_fsdp_shard_rows(int64_t dim0, int n, int r, int64_t* start,
                        int64_t* rows) {
  tr_chunk_range(dim0, n, r, start, rows);
}

/* Parameter p's shard as its FSDP placement says. */
static int param_rows(const tr_param_t* p, const tr_param_placement_t* pl,
                      tr__fsdp_param_t* pp) {
  tr_param_layout_t base, own, first;
  int i = tr_mesh_shape_index(&pl->mesh, "dp_shard");
  if (i < 0 || pl->placements[i].kind != TR_PLACEMENT_SHARD ||
      pl->placements[i].dim != 0 || pl->order[pl->mesh.ndim - 1] != i)
    return TR_EINVAL;
  /* the piece before dp_shard cuts it, this rank's cut, coordinate 0's
   * (the largest: ceil(rows / n)) */
  TR_CHECK(tr_param_placement_layout(pl, p->ndim, p->shape, "dp_shard", 0, 1,
                                     &base));
  TR_CHECK(tr_param_placement_layout(pl, p->ndim, p->shape, NULL, 0, 0, &own));
  TR_CHECK(tr_param_placement_layout(pl, p->ndim, p->shape, "dp_shard", 0, 0,
                                     &first));
  pp->row_numel = 1;
  for (int d = 0; d < p->ndim; d++) pp->shape[d] = base.shape[d];
  for (int d = 1; d < p->ndim; d++) pp->row_numel *= base.shape[d];
  pp->numel = base.shape[0] * pp->row_numel;
  /* the first row held, in the piece's order: a piece in parts (GPT-2's
   * q|k|v under tp) is cut in its run order, so its rows are skipped rows */
  pp->start =
      own.parts > 1 ? own.skip - base.skip : own.offset[0] - base.offset[0];
  pp->rows = own.shape[0];
  pp->pad = first.shape[0] * pp->row_numel;
  return 0;
}

void tr__fsdp_plan_release(tr__fsdp_plan_t* pl) {
  free(pl->params);
  free(pl->param_group);
  free(pl->block_group);
  free(pl->groups);
  free(pl->storage);
  memset(pl, 0, sizeof *pl);
}

int tr__fsdp_plan_build(tr__fsdp_plan_t* pl, const tr_model_t* m,
                        const tr_mesh_shape_t* mesh, int placed) {
  memset(pl, 0, sizeof *pl);
  if (!mesh || tr_mesh_shape_index(mesh, "dp_shard") < 0) return TR_EINVAL;
  int np = m->n_params, nb = m->n_blocks;
  pl->nparams = np;
  pl->nblocks = nb;
  pl->params = calloc((size_t)np + 1, sizeof *pl->params);
  pl->param_group = calloc((size_t)np + 1, sizeof *pl->param_group);
  pl->block_group = calloc((size_t)nb + 1, sizeof *pl->block_group);
  pl->groups = calloc((size_t)nb + 1, sizeof *pl->groups);
  pl->storage = calloc((size_t)np + 1, sizeof *pl->storage);
  if (!pl->params || !pl->param_group || !pl->block_group || !pl->groups ||
      !pl->storage) {
    tr__fsdp_plan_release(pl);
    return TR_ENOMEM;
  }
  /* groups: 0 is the root (embedding and head blocks), then the layers */
  tr__fsdp_group_t* root = &pl->groups[0];
  snprintf(root->name, sizeof root->name, "root");
  root->is_root = 1;
  root->first_block = nb;
  root->last_block = -1;
  pl->ngroups = 1;
  for (int b = 0; b < nb; b++) {
    const tr_model_block_t* bl = &m->blocks[b];
    int g = 0;
    if (!tr_model_block_held(m, b)) { /* another pipeline stage's */
      pl->block_group[b] = -1;
      continue;
    }
    if (bl->kind == TR_BLOCK_LAYER) {
      g = pl->ngroups++;
      snprintf(pl->groups[g].name, sizeof pl->groups[g].name, "%s", bl->name);
      pl->groups[g].first_block = pl->groups[g].last_block = b;
    } else {
      if (b < root->first_block) root->first_block = b;
      if (b > root->last_block) root->last_block = b;
    }
    pl->block_group[b] = g;
  }
  /* each parameter belongs to the group of the blocks that use it */
  for (int i = 0; i < np; i++) pl->param_group[i] = -1;
  for (int b = 0; b < nb; b++) {
    const tr_model_block_t* bl = &m->blocks[b];
    if (pl->block_group[b] < 0) continue;
    for (int k = 0; k < bl->n_params; k++) {
      int i = bl->params[k];
      if (pl->param_group[i] >= 0 && pl->param_group[i] != pl->block_group[b]) {
        TR_LOG_ERROR(FSDP, "parameter '%s' is used by groups %s and %s",
                     m->params[i].name, pl->groups[pl->param_group[i]].name,
                     pl->groups[pl->block_group[b]].name);
        tr__fsdp_plan_release(pl);
        return TR_EUNSUPPORTED;
      }
      pl->param_group[i] = pl->block_group[b];
    }
  }
  /* shards, and the flat layout of each group */
  int* next = pl->storage;
  for (int g = 0; g < pl->ngroups; g++) {
    tr__fsdp_group_t* gr = &pl->groups[g];
    gr->params = next;
    for (int i = 0; i < np; i++) {
      if (pl->param_group[i] != g) continue;
      const tr_param_t* p = &m->params[i];
      tr__fsdp_param_t* pp = &pl->params[i];
      if (p->ndim < 1) {
        TR_LOG_ERROR(FSDP, "parameter '%s' has no dim 0 to shard", p->name);
        tr__fsdp_plan_release(pl);
        return TR_EUNSUPPORTED;
      }
      tr_param_placement_t own;
      const tr_param_placement_t* at = tr_dtensor_param_placement(p);
      int rc = 0;
      if (!placed) { /* what FSDP would compose (`trainrun plan`) */
        rc = tr_param_placement_compose(at, mesh, "dp_shard", 0, p->ndim, &own);
        at = &own;
      }
      if (rc == 0) rc = at ? param_rows(p, at, pp) : TR_EINVAL;
      if (rc < 0) {
        TR_LOG_ERROR(FSDP,
                     "parameter '%s': its placement does not shard dim 0 "
                     "on dp_shard last",
                     p->name);
        tr__fsdp_plan_release(pl);
        return rc;
      }
      pp->off = gr->shard_numel;
      gr->shard_numel += pp->pad;
      gr->global_numel += pp->numel;
      gr->params[gr->n++] = i;
      next++;
    }
  }
  return 0;
}

int tr_fsdp_plan(const tr_model_t* m, int dp_replicate, int dp_shard,
                 tr_dtype_t master_dtype, tr_dtype_t param_dtype,
                 tr_fsdp_plan_t* out) {
  memset(out, 0, sizeof *out);
  if (dp_replicate < 1 || dp_shard < 1) return TR_EINVAL;
  tr__fsdp_plan_t pl;
  /* rank 0 holds most */
  static const char* const names[2] = {"dp_replicate", "dp_shard"};
  int sizes[2] = {dp_replicate, dp_shard}, coords[2] = {0, 0};
  tr_mesh_shape_t mesh;
  TR_CHECK(tr_mesh_shape_init(&mesh, 2, names, sizes, coords));
  /* parameters placed already (a TP plan) carry the job's mesh: FSDP
   * composes onto it */
  const tr_mesh_shape_t* on = &mesh;
  for (int i = 0; i < m->n_params; i++) {
    const tr_param_placement_t* at = tr_dtensor_param_placement(&m->params[i]);
    if (!at) continue;
    if (tr_mesh_shape_index(&at->mesh, "dp_shard") < 0 ||
        tr_mesh_shape_index(&at->mesh, "dp_replicate") < 0)
      return TR_EINVAL;
    on = &at->mesh;
    break;
  }
  TR_CHECK(tr__fsdp_plan_build(&pl, m, on, 0));
  int64_t ms = (int64_t)tr_dtype_size(master_dtype);
  int64_t ps = (int64_t)tr_dtype_size(param_dtype);
  int64_t total = 0;
  for (int i = 0; i < pl.nparams; i++) {
    out->params += pl.params[i].rows * pl.params[i].row_numel;
    total += pl.params[i].numel;
  }
  out->dp_replicate = dp_replicate;
  out->dp_shard = dp_shard;
  out->param_bytes = out->params * ms;
  out->grad_bytes = out->params * ms;
  out->optim_bytes = 2 * out->params * ms;
  out->unsharded_bytes = 4 * total * ms;
  for (int g = 0; g < pl.ngroups; g++) {
    /* params and grads, each dp_shard padded shards */
    int64_t b = 2 * pl.groups[g].shard_numel * dp_shard * ps;
    if (b > out->group_bytes) {
      out->group_bytes = b;
      snprintf(out->group_name, sizeof out->group_name, "%s",
               pl.groups[g].name);
    }
  }
  tr__fsdp_plan_release(&pl);
  return 0;
}
