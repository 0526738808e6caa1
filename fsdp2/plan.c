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
  return (dim0 + n - 1) / n;
}

void tr_fsdp_shard_rows(int64_t dim0, int n, int r, int64_t* start,
                        int64_t* rows) {
  int64_t c = tr_fsdp_padded_rows(dim0, n);
  int64_t s = c * r, e = c * (r + 1);
  if (s > dim0) s = dim0;
  if (e > dim0) e = dim0;
  *start = s;
  *rows = e - s;
}

void tr__fsdp_plan_release(tr__fsdp_plan_t* pl) {
  free(pl->params);
  free(pl->param_group);
  free(pl->block_group);
  free(pl->groups);
  free(pl->storage);
  memset(pl, 0, sizeof *pl);
}

int tr__fsdp_plan_build(tr__fsdp_plan_t* pl, const tr_model_t* m, int n,
                        int r) {
  memset(pl, 0, sizeof *pl);
  if (n < 1 || r < 0 || r >= n) return TR_EINVAL;
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
      pp->row_numel = 1;
      for (int d = 1; d < p->ndim; d++) pp->row_numel *= p->shape[d];
      pp->numel = p->shape[0] * pp->row_numel;
      tr_fsdp_shard_rows(p->shape[0], n, r, &pp->start, &pp->rows);
      pp->pad = tr_fsdp_padded_rows(p->shape[0], n) * pp->row_numel;
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
  TR_CHECK(tr__fsdp_plan_build(&pl, m, dp_shard, 0)); /* rank 0 holds most */
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
