/* fsdp2/fsdp.c: fully sharded data parallel in the model's block hooks —
 * dim-0 shards in the parameter table, one group per layer plus the root,
 * flat all-gather with copy-in/copy-out and padding, reduce-scatter (and
 * the HSDP all-reduce) of gradients, reshard_after_forward, prefetch, and
 * the trainer's seam (trainrun/fsdp2.h). */
#include "config.h"

#include <math.h> /* NAN */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp2/internal.h"
#include "trainrun/error.h"
#include "trainrun/fsdp2.h"
#include "trainrun/kernels.h" /* accumulate, scale */
#include "trainrun/log.h"
#include "trainrun/pg_waits.h" /* how the compute waits */

typedef struct {
  tr__fsdp_group_t def; /* blocks, params, offsets (fsdp2/internal.h) */
  tr_fsdp_state_t state;
  int grads_live;     /* the unsharded grads are the params' grads */
  tr_tensor_t ag_in;  /* [S] param_dtype, while gathering */
  tr_tensor_t ag_out; /* [n*S] param_dtype, while gathering */
  tr_pg_work_t* ag;   /* the all-gather in flight */
  tr_tensor_t full;   /* [n*S] param_dtype: unsharded params, param-major */
  tr_tensor_t gfull;  /* [n*S] fp32: unsharded grads, param-major */
  /* pipelined: the group's blocks on this rank, and those whose stage's
   * REDUCE_GRAD has not come yet this step; its block backwards begun
   * (pre_backward: B, or I) and not ended (post_backward: B, or W) */
  int n_held, reduce_left, bwd_open;
} fsdp_group_t;

/* A gradient reduction in flight: its reduce-scatter (stage 0), then
 * under HSDP its all-reduce across replicas (stage 1). */
typedef struct {
  int g, stage;
  tr_tensor_t in, out;
  tr_pg_work_t* w;
} fsdp_pending_t;

struct tr_fsdp {
  tr_fsdp_opts_t o;
  int n, r;              /* shard group size and rank */
  int nrep, rrep;        /* replicate group size and rank (1, 0 without) */
  tr_mesh_shape_t shape; /* the mesh the placements are on (dp_shard ...) */
  int norm_replicas;     /* ranks holding each grad shard; -1: it varies */
  tr_model_t* m;         /* the sharded model, NULL before */
  tr__fsdp_plan_t plan;
  fsdp_group_t* groups;
  tr_tensor_t* sh_data; /* per param: the shard while p->data is whole */
  tr_tensor_t* sh_grad; /* per param: the shard while p->grad is whole */
  fsdp_pending_t pend[2];
  int npend;
  int whole; /* tr_fsdp_gather_full ran: hooks do nothing */
  /* the step is a pipeline schedule (tr_dp_t.pipelined): gathered once,
   * reduced once per step */
  int pipelined;
  int64_t syncs;
  tr_fsdp_stats_t stats;
  /* how the compute waits for the collectives (collectives/waits.c) */
  tr_pg_waits_t waits;
  int measure;         /* this pass counts in the comm timing (not eval) */
  int64_t timed_steps; /* tr_fsdp_step_end calls with comm_timing on */
};

/* ---- options ---- */

static const char* const reshard_names[] = {"default", "always", "never"};

int tr_fsdp_reshard_parse(const char* s, tr_fsdp_reshard_t* out) {
  for (int i = 0; i < 3; i++)
    if (s && strcmp(s, reshard_names[i]) == 0) {
      *out = (tr_fsdp_reshard_t)i;
      return 0;
    }
  return TR_EINVAL;
}

const char* tr_fsdp_reshard_name(tr_fsdp_reshard_t r) {
  return (unsigned)r < 3 ? reshard_names[r] : "?";
}

void tr_fsdp_opts_init(tr_fsdp_opts_t* opts) {
  memset(opts, 0, sizeof *opts);
  opts->reshard_after_forward = TR_FSDP_RESHARD_DEFAULT;
  opts->prefetch_depth = 1;
  opts->param_dtype = TR_F32;
  opts->reduce_dtype = TR_F32;
}

int tr_fsdp_new(const tr_fsdp_opts_t* opts, tr_fsdp_t** out) {
  *out = NULL;
  if (!opts || !opts->shard_pg || opts->prefetch_depth < 0 ||
      opts->divide_factor < 0 || opts->train_timeout_ms < 0 ||
      !tr_dtype_is_float(opts->param_dtype) ||
      !tr_dtype_is_float(opts->reduce_dtype) ||
      (unsigned)opts->reshard_after_forward > TR_FSDP_RESHARD_NEVER)
    return TR_EINVAL;
  tr_fsdp_t* f = calloc(1, sizeof *f);
  if (!f) return TR_ENOMEM;
  f->o = *opts;
  f->n = tr_pg_size(opts->shard_pg);
  f->r = tr_pg_rank(opts->shard_pg);
  f->nrep = opts->replicate_pg ? tr_pg_size(opts->replicate_pg) : 1;
  f->rrep = opts->replicate_pg ? tr_pg_rank(opts->replicate_pg) : 0;
  if (f->o.divide_factor == 0)
    f->o.divide_factor = (double)f->n * (double)f->nrep;
  f->norm_replicas = f->nrep;
  int rc;
  if (opts->mesh) { /* the job's mesh: its dp dims must be these groups */
    f->shape = *opts->mesh;
    int i = tr_mesh_shape_index(&f->shape, "dp_shard");
    int j = tr_mesh_shape_index(&f->shape, "dp_replicate");
    rc = i >= 0 && f->shape.sizes[i] == f->n && f->shape.coords[i] == f->r &&
                 (j < 0 ? f->nrep == 1
                        : f->shape.sizes[j] == f->nrep &&
                              f->shape.coords[j] == f->rrep)
             ? 0
             : TR_EINVAL;
  } else { /* the groups alone: a [dp_replicate, dp_shard] mesh */
    static const char* const names[2] = {"dp_replicate", "dp_shard"};
    int sizes[2] = {f->nrep, f->n}, coords[2] = {f->rrep, f->r};
    rc = tr_mesh_shape_init(&f->shape, 2, names, sizes, coords);
  }
  if (rc < 0) {
    TR_LOG_ERROR(FSDP,
                 "the mesh's dp_shard / dp_replicate dims are not the "
                 "shard and replicate groups");
    free(f);
    return rc;
  }
  /* the host may run this many collectives ahead of the device: two per
   * group (all-gather and reduce-scatter) over the prefetched groups and
   * the one computing, plus one group's slack */
  rc = tr_pg_waits_init(&f->waits, 2 * (opts->prefetch_depth + 2));
  if (rc == 0 && opts->comm_timing) {
    rc = tr_pg_set_op_timing(opts->shard_pg, 1);
    if (rc == 0 && opts->replicate_pg)
      rc = tr_pg_set_op_timing(opts->replicate_pg, 1);
  }
  if (rc < 0) {
    tr_pg_waits_release(&f->waits);
    free(f);
    return rc;
  }
  f->measure = 1;
  *out = f;
  return 0;
}

/* ---- flat views ---- */

/* dst = elements [off, off+len) of the 1-D tensor flat, shaped like
 * (ndim, shape) when ndim > 0. */
static int flat_view(tr_tensor_t* dst, const tr_tensor_t* flat, int64_t off,
                     int64_t len, int ndim, const int64_t* shape) {
  memset(dst, 0, sizeof *dst);
  TR_CHECK(tr_tensor_narrow(dst, flat, 0, off, len));
  if (ndim > 0) {
    int rc = tr_tensor_reshape(dst, dst, ndim, shape);
    if (rc < 0) {
      tr_tensor_release(dst);
      return rc;
    }
  }
  return 0;
}

/* Copy len elements: src[soff..] into dst[doff..] (1-D tensors; dtypes
 * convert). */
static int flat_copy(tr_tensor_t* dst, int64_t doff, const tr_tensor_t* src,
                     int64_t soff, int64_t len) {
  if (len == 0) return 0;
  tr_tensor_t d, s;
  TR_CHECK(flat_view(&d, dst, doff, len, 0, NULL));
  int rc = flat_view(&s, src, soff, len, 0, NULL);
  if (rc == 0) rc = tr_tensor_copy(&d, &s);
  tr_tensor_release(&d);
  tr_tensor_release(&s);
  return rc;
}

/* The compute (CUDA: its stream; CPU: the host) waits for w, an op of
 * group g (collectives/waits.c); w is taken. consume 0: nobody reads its
 * output. */
static int wait_op(tr_fsdp_t* f, tr_pg_work_t* w, int consume, const char* what,
                   int g) {
  return tr_pg_waits_wait(&f->waits, w, f->m->device.type == TR_DEV_CUDA,
                          consume, f->o.comm_timing && f->measure, what,
                          "group", f->groups[g].def.name);
}

/* The sharded parameter / grad of p, wherever it is now. */
static tr_tensor_t* shard_data(tr_fsdp_t* f, int p) {
  const fsdp_group_t* g = &f->groups[f->plan.param_group[p]];
  return g->state == TR_FSDP_UNSHARDED ? &f->sh_data[p] : &f->m->params[p].data;
}

static tr_tensor_t* shard_grad(tr_fsdp_t* f, int p) {
  const fsdp_group_t* g = &f->groups[f->plan.param_group[p]];
  return g->grads_live ? &f->sh_grad[p] : &f->m->params[p].grad;
}

/* ---- all-gather ---- */

static int copy_in(tr_fsdp_t* f, int gi, tr_tensor_t* out) {
  const tr__fsdp_group_t* d = &f->groups[gi].def;
  int64_t S = d->shard_numel;
  TR_CHECK(tr_tensor_zeros(out, f->o.param_dtype, f->m->device, 1, &S));
  int rc = 0;
  for (int k = 0; k < d->n && rc == 0; k++) {
    int p = d->params[k];
    const tr__fsdp_param_t* pp = &f->plan.params[p];
    const tr_tensor_t* sh = shard_data(f, p);
    if (pp->rows == 0) continue; /* an empty shard: all padding */
    tr_tensor_t v;
    rc = flat_view(&v, out, pp->off, pp->rows * pp->row_numel, sh->ndim,
                   sh->shape);
    if (rc == 0) rc = tr_tensor_copy(&v, sh);
    tr_tensor_release(&v);
  }
  if (rc < 0) tr_tensor_release(out);
  return rc;
}

int tr_fsdp_copy_in(tr_fsdp_t* f, int g, tr_tensor_t* out) {
  memset(out, 0, sizeof *out);
  if (!f->m || g < 0 || g >= f->plan.ngroups ||
      f->groups[g].state != TR_FSDP_SHARDED)
    return TR_EINVAL;
  return copy_in(f, g, out);
}

static int issue_gather(tr_fsdp_t* f, int gi, int prefetch) {
  fsdp_group_t* g = &f->groups[gi];
  int64_t total = g->def.shard_numel * f->n;
  TR_CHECK(copy_in(f, gi, &g->ag_in));
  int rc =
      tr_tensor_empty(&g->ag_out, f->o.param_dtype, f->m->device, 1, &total);
  if (rc == 0)
    rc = tr_pg_all_gather(f->o.shard_pg, &g->ag_out, &g->ag_in, &g->ag);
  if (rc < 0) {
    tr_tensor_release(&g->ag_in);
    tr_tensor_release(&g->ag_out);
    return rc;
  }
  g->state = TR_FSDP_GATHERING;
  f->stats.all_gathers++;
  if (prefetch) f->stats.prefetches++;
  return 0;
}

/* Wait for group gi's all-gather, copy out, and point the params at their
 * unsharded tensors. */
static int finish_gather(tr_fsdp_t* f, int gi) {
  fsdp_group_t* g = &f->groups[gi];
  const tr__fsdp_group_t* d = &g->def;
  /* CUDA: the copy-out below is ordered after the op on the device; the
   * host goes on (collectives/waits.c says why releasing ag_in is safe) */
  int rc = wait_op(f, g->ag, 1, "all-gather", gi);
  g->ag = NULL;
  tr_tensor_release(&g->ag_in);
  int64_t S = d->shard_numel, n = f->n;
  int64_t total = S * n;
  if (rc == 0)
    rc = tr_tensor_empty(&g->full, f->o.param_dtype, f->m->device, 1, &total);
  /* copy-out: rank j's piece of param p goes to its rows [j*c, (j+1)*c) */
  for (int64_t j = 0; j < n && rc == 0; j++)
    for (int k = 0; k < d->n && rc == 0; k++) {
      const tr__fsdp_param_t* pp = &f->plan.params[d->params[k]];
      rc = flat_copy(&g->full, n * pp->off + j * pp->pad, &g->ag_out,
                     j * S + pp->off, pp->pad);
    }
  tr_tensor_release(&g->ag_out);
  if (rc < 0) {
    tr_tensor_release(&g->full);
    g->state = TR_FSDP_SHARDED;
    return rc;
  }
  for (int k = 0; k < d->n; k++) {
    int p = d->params[k];
    tr_param_t* prm = &f->m->params[p];
    const tr__fsdp_param_t* pp = &f->plan.params[p];
    tr_tensor_t v;
    rc = flat_view(&v, &g->full, n * pp->off, pp->numel, prm->ndim, pp->shape);
    if (rc < 0) { /* undo the swaps made so far */
      for (int q = 0; q < k; q++) {
        int pq = d->params[q];
        tr_tensor_release(&f->m->params[pq].data);
        f->m->params[pq].data = f->sh_data[pq];
        memset(&f->sh_data[pq], 0, sizeof f->sh_data[pq]);
      }
      tr_tensor_release(&g->full);
      g->state = TR_FSDP_SHARDED;
      return rc;
    }
    f->sh_data[p] = prm->data; /* moved */
    prm->data = v;
  }
  g->state = TR_FSDP_UNSHARDED;
  return 0;
}

/* Free group gi's unsharded params (its grads are not live). */
static void reshard(tr_fsdp_t* f, int gi) {
  fsdp_group_t* g = &f->groups[gi];
  if (g->state == TR_FSDP_GATHERING) { /* a prefetch nobody used */
    /* its work keeps the buffers until it completes; an error surfaces
     * with the next wait */
    wait_op(f, g->ag, 0, "all-gather", gi);
    g->ag = NULL;
    tr_tensor_release(&g->ag_in);
    tr_tensor_release(&g->ag_out);
    g->state = TR_FSDP_SHARDED;
  }
  if (g->state != TR_FSDP_UNSHARDED) return;
  for (int k = 0; k < g->def.n; k++) {
    int p = g->def.params[k];
    tr_tensor_release(&f->m->params[p].data);
    f->m->params[p].data = f->sh_data[p];
    memset(&f->sh_data[p], 0, sizeof f->sh_data[p]);
  }
  tr_tensor_release(&g->full);
  g->state = TR_FSDP_SHARDED;
}

/* Block b is about to run (dir +1 forward, -1 backward): its group
 * unsharded, the next groups' all-gathers issued. */
static int use_group(tr_fsdp_t* f, int b, int dir) {
  int gi = f->plan.block_group[b];
  if (gi < 0) return 0;
  if (f->groups[gi].state == TR_FSDP_SHARDED) TR_CHECK(issue_gather(f, gi, 0));
  int seen = 0, last = gi;
  for (int k = b + dir;
       k >= 0 && k < f->m->n_blocks && seen < f->o.prefetch_depth; k += dir) {
    int h = f->plan.block_group[k];
    if (h < 0 || h == gi || h == last) continue;
    last = h;
    seen++;
    if (f->groups[h].state == TR_FSDP_SHARDED) TR_CHECK(issue_gather(f, h, 1));
  }
  if (f->groups[gi].state == TR_FSDP_GATHERING) TR_CHECK(finish_gather(f, gi));
  return 0;
}

/* ---- reduce-scatter ---- */

/* Divide the reduced shard out (group g's flat layout) and add it into
 * the sharded grads. */
static int accumulate(tr_fsdp_t* f, int g, const tr_tensor_t* out) {
  const tr__fsdp_group_t* d = &f->groups[g].def;
  if (d->n == 0) return 0;
  tr_tensor_t acc = {0};
  tr_dtype_t gdt = shard_grad(f, d->params[0])->dtype;
  int rc = 0;
  if (out->dtype == gdt) {
    tr_tensor_view(&acc, out);
  } else {
    rc = tr_tensor_empty(&acc, gdt, out->device, 1, out->shape);
    if (rc == 0) rc = tr_tensor_copy(&acc, out);
  }
  if (rc == 0 && f->o.divide_factor != 1.0)
    rc = tr_kern_scale(&acc, (float)(1.0 / f->o.divide_factor));
  for (int k = 0; k < d->n && rc == 0; k++) {
    int p = d->params[k];
    const tr__fsdp_param_t* pp = &f->plan.params[p];
    tr_tensor_t* sg = shard_grad(f, p);
    if (pp->rows == 0) continue;
    tr_tensor_t v;
    rc = flat_view(&v, &acc, pp->off, pp->rows * pp->row_numel, sg->ndim,
                   sg->shape);
    if (rc == 0) rc = tr_kern_accumulate(sg, &v);
    tr_tensor_release(&v);
  }
  tr_tensor_release(&acc);
  return rc;
}

/* Move the oldest reduction on: a finished reduce-scatter starts its
 * all-reduce across replicas (HSDP, async) or is added into the grads; a
 * finished all-reduce is added into the grads. The entry leaves the queue
 * when done (or failed). */
static int advance_oldest(tr_fsdp_t* f) {
  fsdp_pending_t* pe = &f->pend[0];
  /* CUDA: the all-reduce and the accumulation below are ordered after it
   * on the device */
  int rc =
      wait_op(f, pe->w, 1,
              pe->stage == 0 ? "reduce-scatter" : "replica all-reduce", pe->g);
  pe->w = NULL;
  tr_tensor_release(&pe->in);
  if (rc == 0 && pe->stage == 0 && f->nrep > 1) {
    rc = tr_pg_all_reduce(f->o.replicate_pg, &pe->out, TR_PG_SUM, &pe->w);
    if (rc == 0) {
      f->stats.all_reduces++;
      pe->stage = 1;
      return 0;
    }
  }
  if (rc == 0) rc = accumulate(f, pe->g, &pe->out);
  tr_tensor_release(&pe->out);
  memmove(&f->pend[0], &f->pend[1], sizeof f->pend[0]);
  memset(&f->pend[1], 0, sizeof f->pend[1]);
  f->npend--;
  return rc;
}

/* Zeroed unsharded grads for group gi, made the params' grads. */
static int grads_on(tr_fsdp_t* f, int gi) {
  fsdp_group_t* g = &f->groups[gi];
  const tr__fsdp_group_t* d = &g->def;
  if (g->grads_live) return 0;
  int64_t total = d->shard_numel * f->n;
  /* fp32 whatever param_dtype: the kernels accumulate parameter
   * gradients in fp32 */
  TR_CHECK(tr_tensor_zeros(&g->gfull, TR_F32, f->m->device, 1, &total));
  for (int k = 0; k < d->n; k++) {
    int p = d->params[k];
    tr_param_t* prm = &f->m->params[p];
    const tr__fsdp_param_t* pp = &f->plan.params[p];
    tr_tensor_t v;
    int rc = flat_view(&v, &g->gfull, f->n * pp->off, pp->numel, prm->ndim,
                       pp->shape);
    if (rc < 0) {
      for (int q = 0; q < k; q++) {
        int pq = d->params[q];
        tr_tensor_release(&f->m->params[pq].grad);
        f->m->params[pq].grad = f->sh_grad[pq];
        memset(&f->sh_grad[pq], 0, sizeof f->sh_grad[pq]);
      }
      tr_tensor_release(&g->gfull);
      return rc;
    }
    f->sh_grad[p] = prm->grad; /* moved */
    prm->grad = v;
  }
  g->grads_live = 1;
  return 0;
}

static void grads_off(tr_fsdp_t* f, int gi) {
  fsdp_group_t* g = &f->groups[gi];
  if (!g->grads_live) return;
  for (int k = 0; k < g->def.n; k++) {
    int p = g->def.params[k];
    tr_tensor_release(&f->m->params[p].grad);
    f->m->params[p].grad = f->sh_grad[p];
    memset(&f->sh_grad[p], 0, sizeof f->sh_grad[p]);
  }
  tr_tensor_release(&g->gfull);
  g->grads_live = 0;
}

/* Group gi's backward is done: lay its grads out rank by rank in
 * reduce_dtype, free the unsharded params and grads, issue the
 * reduce-scatter and complete the one before. */
static int reduce_group(tr_fsdp_t* f, int gi) {
  fsdp_group_t* g = &f->groups[gi];
  const tr__fsdp_group_t* d = &g->def;
  int64_t S = d->shard_numel, n = f->n, total = S * n;
  fsdp_pending_t pe = {.g = gi};
  /* the reductions before had this block's backward to run in: the one
   * two groups back finishes its all-reduce (HSDP), the last one its
   * reduce-scatter, before this one takes memory */
  int rc = 0;
  if (f->npend > 0 && f->pend[0].stage == 1) rc = advance_oldest(f);
  if (rc == 0 && f->npend > 0 && f->pend[0].stage == 0) rc = advance_oldest(f);
  reshard(f, gi); /* the params are spent; their grads are not yet */
  if (rc == 0)
    rc = tr_tensor_empty(&pe.in, f->o.reduce_dtype, f->m->device, 1, &total);
  for (int64_t j = 0; j < n && rc == 0; j++)
    for (int k = 0; k < d->n && rc == 0; k++) {
      const tr__fsdp_param_t* pp = &f->plan.params[d->params[k]];
      rc = flat_copy(&pe.in, j * S + pp->off, &g->gfull,
                     n * pp->off + j * pp->pad, pp->pad);
    }
  grads_off(f, gi);
  if (rc == 0)
    rc = tr_tensor_empty(&pe.out, f->o.reduce_dtype, f->m->device, 1, &S);
  if (rc == 0)
    rc = tr_pg_reduce_scatter(f->o.shard_pg, &pe.out, &pe.in, TR_PG_SUM, &pe.w);
  if (rc < 0) {
    tr_tensor_release(&pe.in);
    tr_tensor_release(&pe.out);
    return rc;
  }
  f->stats.reduce_scatters++;
  f->pend[f->npend++] = pe;
  return 0;
}

int tr_fsdp_sync_grads(tr_fsdp_t* f) {
  int rc = 0;
  if (f->pipelined) /* what no REDUCE_GRAD reduced; every group sharded for
                       the optimizer; the countdowns for the next step */
    for (int gi = f->plan.ngroups - 1; gi >= 0 && f->groups; gi--) {
      fsdp_group_t* g = &f->groups[gi];
      if (g->grads_live && rc == 0) rc = reduce_group(f, gi);
      g->reduce_left = g->n_held;
      g->bwd_open = 0;
    }
  while (f->npend > 0) {
    int r2 = advance_oldest(f);
    if (rc == 0) rc = r2;
  }
  for (int gi = 0; f->pipelined && gi < f->plan.ngroups; gi++) reshard(f, gi);
  if (rc == 0 && f->syncs++ == 0 && f->o.train_timeout_ms > 0)
    tr_pg_set_timeout_all(f->o.shard_pg, f->o.train_timeout_ms);
  return rc;
}

int tr_fsdp_step_end(tr_fsdp_t* f) {
  int rc = tr_pg_waits_drain(&f->waits);
  if (f->o.comm_timing) f->timed_steps++;
  return rc;
}

void tr_fsdp_comm_take(tr_fsdp_t* f, tr_pg_comm_t* out) {
  tr_pg_waits_take(&f->waits, &f->timed_steps, out);
}

/* ---- the hooks ---- */

static int hook_pre_forward(void* arg, tr_model_t* m, int b,
                            tr_model_mb_t* mb) {
  (void)m;
  tr_fsdp_t* f = arg;
  f->measure = !mb->no_grad; /* eval passes stay out of the comm timing */
  return f->whole ? 0 : use_group(f, b, +1);
}

static int hook_post_forward(void* arg, tr_model_t* m, int b,
                             tr_model_mb_t* mb) {
  (void)m;
  tr_fsdp_t* f = arg;
  int gi = f->plan.block_group[b];
  if (f->whole || gi < 0 || f->groups[gi].def.last_block != b) return 0;
  const fsdp_group_t* g = &f->groups[gi];
  int free_it = mb->no_grad;
  if (f->pipelined) { /* held for the step's other micro-batches, unless
                         "always": gathered again by the backward (and
                         not while a backward of the group is open: a W
                         to come reads the parameters' shapes) */
    free_it |= f->o.reshard_after_forward == TR_FSDP_RESHARD_ALWAYS;
    if (free_it && g->bwd_open == 0) reshard(f, gi);
    return 0;
  }
  switch (f->o.reshard_after_forward) {
    case TR_FSDP_RESHARD_ALWAYS:
      free_it = 1;
      break;
    case TR_FSDP_RESHARD_NEVER:
      break;
    case TR_FSDP_RESHARD_DEFAULT:
      free_it |= !g->def.is_root;
      break;
  }
  if (free_it && !g->grads_live) reshard(f, gi);
  return 0;
}

static int hook_pre_backward(void* arg, tr_model_t* m, int b,
                             tr_model_mb_t* mb) {
  (void)m;
  (void)mb;
  tr_fsdp_t* f = arg;
  int gi = f->plan.block_group[b];
  f->measure = 1;
  if (f->whole || gi < 0) return 0;
  if (f->pipelined) f->groups[gi].bwd_open++;
  TR_CHECK(use_group(f, b, -1));
  return grads_on(f, gi);
}

static int hook_post_backward(void* arg, tr_model_t* m, int b,
                              tr_model_mb_t* mb) {
  (void)m;
  (void)mb;
  tr_fsdp_t* f = arg;
  int gi = f->plan.block_group[b];
  if (f->whole || gi < 0) return 0;
  if (f->pipelined) { /* the grads accumulate until the stage's
                         REDUCE_GRAD; the parameters stay gathered */
    f->groups[gi].bwd_open--;
    return 0;
  }
  if (f->groups[gi].def.first_block != b) return 0;
  return reduce_group(f, gi);
}

/* ---- pipeline stages (tr_dp_t.stage_op) ----
 *
 * PyTorch's pipeline runtime with FSDP stages: UNSHARD starts a stage's
 * all-gathers (unshard(async_op=True)); the groups then stay gathered
 * through every micro-batch's forward and backward (no reshard after
 * forward: torchtitan's default under pipeline parallelism, nor after a
 * backward: set_reshard_after_backward(False)), their unsharded grads
 * accumulating (set_requires_gradient_sync(False)); REDUCE_GRAD, after the
 * stage's last backward, reduce-scatters each group once (and under HSDP
 * all-reduces it over the replicas), freeing its gathered parameters and
 * grads; RESHARD frees gathered parameters. A group used by two stages
 * of this rank (the root's embedding and head on the V placement) is
 * reduced at the later of their REDUCE_GRADs. With reshard_after_forward
 * "always" (set explicitly: torchtitan's "always" under pp) each forward
 * frees its groups' parameters and the backward gathers them again, the
 * grads still reduced once. */

static int stage_unshard(tr_fsdp_t* f, int gi) {
  if (f->groups[gi].state != TR_FSDP_SHARDED || f->groups[gi].def.n == 0)
    return 0;
  return issue_gather(f, gi, 1);
}

static int stage_reduce(tr_fsdp_t* f, int gi) {
  fsdp_group_t* g = &f->groups[gi];
  if (g->reduce_left > 0 && --g->reduce_left > 0) return 0;
  return g->grads_live ? reduce_group(f, gi) : 0;
}

static int stage_op(void* arg, tr_model_t* m, tr_dp_stage_op_t op, int first,
                    int last) {
  tr_fsdp_t* f = arg;
  if (f->whole || m != f->m || first < 0 || last > m->n_blocks) return 0;
  /* blocks in backward order for the reductions, as the hooks run them */
  for (int k = 0; k < last - first; k++) {
    int b = op == TR_DP_REDUCE_GRAD ? last - 1 - k : first + k;
    int gi = f->plan.block_group[b];
    if (gi < 0) continue;
    int rc = 0;
    switch (op) {
      case TR_DP_UNSHARD:
        rc = stage_unshard(f, gi);
        break;
      case TR_DP_RESHARD:
        if (f->groups[gi].bwd_open == 0) reshard(f, gi);
        break;
      case TR_DP_REDUCE_GRAD:
        rc = stage_reduce(f, gi);
        break;
    }
    if (rc < 0) return rc;
  }
  return 0;
}

/* ---- set-up ---- */

int tr_fsdp_shard_model(tr_fsdp_t* f, tr_model_t* m) {
  if (f->m) return TR_EINVAL;
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i].data.storage) {
      TR_LOG_ERROR(FSDP, "shard the model before allocating it ('%s')",
                   m->params[i].name);
      return TR_EINVAL;
    }
  /* the one truth: Shard(0) on dp_shard composed onto each parameter's
   * placement (cutting last, after tensor parallelism); the rows below
   * come from it */
  static const char* const dp_dims[2] = {"dp_replicate", "dp_shard"};
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    int rc = tr_dtensor_param_shard(p, &f->shape, "dp_shard", 0);
    if (rc < 0) {
      TR_LOG_ERROR(FSDP, "cannot shard '%s' on dp_shard over its placement",
                   p->name);
      return rc;
    }
    int64_t k = tr_dtensor_param_replicas(p, &f->shape, dp_dims, 2);
    if (i == 0)
      f->norm_replicas = (int)k;
    else if (k != f->norm_replicas)
      f->norm_replicas = -1;
  }
  TR_CHECK(tr__fsdp_plan_build(&f->plan, m, &f->shape, 1));
  int np = m->n_params, ng = f->plan.ngroups;
  f->groups = calloc((size_t)ng + 1, sizeof *f->groups);
  f->sh_data = calloc((size_t)np + 1, sizeof *f->sh_data);
  f->sh_grad = calloc((size_t)np + 1, sizeof *f->sh_grad);
  if (!f->groups || !f->sh_data || !f->sh_grad) {
    free(f->groups);
    free(f->sh_data);
    free(f->sh_grad);
    f->groups = NULL;
    f->sh_data = f->sh_grad = NULL;
    tr__fsdp_plan_release(&f->plan);
    return TR_ENOMEM;
  }
  for (int g = 0; g < ng; g++) f->groups[g].def = f->plan.groups[g];
  for (int b = 0; b < m->n_blocks; b++)
    if (f->plan.block_group[b] >= 0) f->groups[f->plan.block_group[b]].n_held++;
  for (int g = 0; g < ng; g++) f->groups[g].reduce_left = f->groups[g].n_held;
  static const struct {
    tr_hook_point_t pt;
    tr_model_hook_fn fn;
  } hooks[] = {{TR_HOOK_PRE_FORWARD, hook_pre_forward},
               {TR_HOOK_POST_FORWARD, hook_post_forward},
               {TR_HOOK_PRE_BACKWARD, hook_pre_backward},
               {TR_HOOK_POST_BACKWARD, hook_post_backward}};
  for (size_t k = 0; k < sizeof hooks / sizeof hooks[0]; k++)
    TR_CHECK(tr_model_add_hook(m, hooks[k].pt, hooks[k].fn, f));
  f->m = m;
  TR_LOG_INFO(FSDP,
              "fsdp: %d groups over %d shard rank%s x %d replica%s, "
              "reshard_after_forward %s, prefetch %d",
              ng, f->n, f->n == 1 ? "" : "s", f->nrep, f->nrep == 1 ? "" : "s",
              tr_fsdp_reshard_name(f->o.reshard_after_forward),
              f->o.prefetch_depth);
  return 0;
}

int tr_fsdp_gather_full(tr_fsdp_t* f) {
  if (!f->m || f->whole) return 0;
  TR_CHECK(tr_fsdp_sync_grads(f));
  for (int gi = 0; gi < f->plan.ngroups; gi++) {
    fsdp_group_t* g = &f->groups[gi];
    grads_off(f, gi);
    if (g->def.n == 0) continue; /* a pipeline stage without it */
    if (g->state == TR_FSDP_SHARDED) TR_CHECK(issue_gather(f, gi, 0));
    if (g->state == TR_FSDP_GATHERING) TR_CHECK(finish_gather(f, gi));
  }
  for (int gi = 0; gi < f->plan.ngroups; gi++) {
    fsdp_group_t* g = &f->groups[gi];
    for (int k = 0; k < g->def.n; k++) {
      int p = g->def.params[k];
      TR_CHECK(tr_dtensor_param_unshard(&f->m->params[p], "dp_shard"));
      tr_tensor_release(&f->sh_data[p]);
    }
    tr_tensor_release(&g->full); /* the params' views keep it */
  }
  f->whole = 1;
  return tr_pg_waits_drain(&f->waits);
}

void tr_fsdp_free(tr_fsdp_t* f) {
  if (!f) return;
  for (int k = 0; k < f->npend; k++) {
    if (f->pend[k].w) tr_pg_work_wait(f->pend[k].w, 0);
    tr_pg_work_free(f->pend[k].w);
    tr_tensor_release(&f->pend[k].in);
    tr_tensor_release(&f->pend[k].out);
  }
  for (int g = 0; g < f->plan.ngroups && f->groups; g++) {
    fsdp_group_t* gr = &f->groups[g];
    if (gr->ag) {
      tr_pg_work_wait(gr->ag, 0);
      tr_pg_work_free(gr->ag);
    }
    tr_tensor_release(&gr->ag_in);
    tr_tensor_release(&gr->ag_out);
    tr_tensor_release(&gr->full);
    tr_tensor_release(&gr->gfull);
  }
  tr_pg_waits_release(&f->waits);
  for (int i = 0; i < f->plan.nparams; i++) {
    if (f->sh_data) tr_tensor_release(&f->sh_data[i]);
    if (f->sh_grad) tr_tensor_release(&f->sh_grad[i]);
  }
  free(f->groups);
  free(f->sh_data);
  free(f->sh_grad);
  tr__fsdp_plan_release(&f->plan);
  free(f);
}

/* ---- scalars ---- */

int tr_fsdp_all_reduce_sum(tr_fsdp_t* f, double* vals, int n) {
  if (n <= 0) return 0;
  TR_CHECK(tr_dp_sum_over(f->o.shard_pg, vals, n));
  TR_CHECK(tr_dp_sum_over(f->o.replicate_pg, vals, n));
  return 0;
}

/* ---- the trainer's seam ---- */

static int dist_setup(void* arg, tr_model_t* m, tr_dp_t* dp) {
  tr_fsdp_t* f = arg;
  f->pipelined = dp->pipelined;
  TR_CHECK(tr_fsdp_shard_model(f, m));
  /* how the squared norm is reduced, as the placements say */
  dp->grads_sharded = f->norm_replicas;
  return 0;
}

static int dist_post_backward(void* arg, tr_model_t* m, int64_t step) {
  (void)m;
  (void)step;
  return tr_fsdp_sync_grads(arg);
}

static int dist_sum(void* arg, double* vals, int n) {
  return tr_fsdp_all_reduce_sum(arg, vals, n);
}

static int dist_gather(void* arg, tr_model_t* m) {
  (void)m;
  return tr_fsdp_gather_full(arg);
}

static int dist_step_end(void* arg) { return tr_fsdp_step_end(arg); }

static void dist_comm_take(void* arg, tr_pg_comm_t* out) {
  tr_fsdp_comm_take(arg, out);
}

void tr_fsdp_dp(tr_fsdp_t* f, tr_dp_t* dist) {
  memset(dist, 0, sizeof *dist);
  dist->dp_rank = f->rrep * f->n + f->r;
  dist->dp_size = f->nrep * f->n;
  dist->post_backward = dist_post_backward;
  dist->all_reduce_sum = dist_sum;
  dist->grads_sharded = f->nrep;
  dist->setup_model = dist_setup;
  dist->gather_model = dist_gather;
  dist->step_end = dist_step_end;
  dist->comm_take = dist_comm_take;
  dist->stage_op = stage_op;
  dist->arg = f;
}

/* ---- introspection ---- */

int tr_fsdp_ngroups(const tr_fsdp_t* f) { return f->m ? f->plan.ngroups : 0; }

int tr_fsdp_group_info(const tr_fsdp_t* f, int g, tr_fsdp_group_info_t* out) {
  memset(out, 0, sizeof *out);
  if (!f->m || g < 0 || g >= f->plan.ngroups) return TR_EINVAL;
  const tr__fsdp_group_t* d = &f->groups[g].def;
  snprintf(out->name, sizeof out->name, "%s", d->name);
  out->n_params = d->n;
  out->is_root = d->is_root;
  out->shard_numel = d->shard_numel;
  out->global_numel = d->global_numel;
  out->state = f->groups[g].state;
  return 0;
}

int tr_fsdp_group_of_block(const tr_fsdp_t* f, int block) {
  if (!f->m || block < 0 || block >= f->m->n_blocks) return -1;
  return f->plan.block_group[block];
}

void tr_fsdp_stats(const tr_fsdp_t* f, tr_fsdp_stats_t* out) {
  *out = f->stats;
}
