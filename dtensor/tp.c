/* dtensor/tp.c: tensor parallelism (Megatron-style, torchtitan's plan
 * without sequence or loss parallel) -- the plan that turns each
 * parameter's declared tp style into placements on the mesh dim "tp", the
 * model's tp hook (all-reduce of the partial row-parallel outputs and of
 * the column-parallel input gradients), the gather of a tp-sharded tensor,
 * and the squared gradient norm that counts a tp-replicated parameter once
 * (trainrun/dtensor.h). */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/internal.h"
#include "trainrun/dtensor.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h" /* tr_kern_sum_squares_multi */

/* ---- the plan ---- */

int tr_tp_placement(const tr_param_t* p, tr_placement_t* out) {
  switch (p->tp_style) {
    case TR_TP_COLWISE:
      *out = tr_placement_shard_parts(0, p->tp_parts > 1 ? p->tp_parts : 1);
      return 1;
    case TR_TP_ROWWISE:
      *out = tr_placement_shard(1);
      return 1;
    default: /* norms, row-parallel biases, embedding and output tables */
      *out = tr_placement_replicate();
      return 0;
  }
}

/* TR_ECONFIG when tp does not divide what it splits. */
static int check_divides(const tr_model_t* m, int tp, tr_errmsg_t* err) {
  const tr_model_config_t* c = &m->cfg;
  if (c->n_heads % tp)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "tensor_parallel_degree %d does not divide the %d "
                         "attention heads",
                         tp, c->n_heads);
  if (c->n_kv_heads % tp)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "tensor_parallel_degree %d does not divide the %d "
                         "key/value heads",
                         tp, c->n_kv_heads);
  for (int i = 0; i < m->n_params; i++) {
    const tr_param_t* p = &m->params[i];
    tr_placement_t pl;
    if (!tr_tp_placement(p, &pl)) continue;
    int parts = pl.parts > 1 ? pl.parts : 1;
    int64_t n = p->shape[pl.dim];
    if (n % parts || (n / parts) % tp)
      return tr_errmsg_set(err, TR_ECONFIG,
                           "tensor_parallel_degree %d does not divide dim %d "
                           "(%" PRId64 " in %d part%s) of '%s'",
                           tp, pl.dim, n, parts, parts > 1 ? "s" : "", p->name);
  }
  return 0;
}

int tr_tp_plan_apply(tr_model_t* m, const tr_mesh_shape_t* mesh,
                     tr_errmsg_t* err) {
  int t = tr_mesh_shape_index(mesh, "tp");
  if (t < 0 || mesh->sizes[t] == 1) return 0; /* nothing is split */
  int rc = check_divides(m, mesh->sizes[t], err);
  if (rc < 0) return rc;
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    if (p->data.storage || tr_dtensor_param_placement(p))
      return tr_errmsg_set(err, TR_EINVAL,
                           "tensor parallel plan: '%s' is already allocated "
                           "or placed (the plan comes first)",
                           p->name);
  }
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    tr_placement_t pl[TR_MESH_MAX_DIMS];
    for (int d = 0; d < mesh->ndim; d++) pl[d] = tr_placement_replicate();
    if (!tr_tp_placement(p, &pl[t])) continue;
    rc = tr_dtensor_param_place(p, mesh, pl, NULL);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "tensor parallel plan: cannot place '%s'",
                           p->name);
  }
  return 0;
}

static int64_t numel(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static const char* style_name(tr_tp_style_t s) {
  switch (s) {
    case TR_TP_COLWISE:
      return "colwise";
    case TR_TP_ROWWISE:
      return "rowwise";
    case TR_TP_VOCAB:
      return "vocab (replicated)";
    case TR_TP_OUTPUT:
      return "output (replicated)";
    default:
      return "replicate";
  }
}

int tr_tp_plan_describe(const tr_model_t* m, FILE* f) {
  int64_t whole = 0, held = 0;
  for (int i = 0; i < m->n_params; i++) {
    const tr_param_t* p = &m->params[i];
    const tr_param_placement_t* pp = tr_dtensor_param_placement(p);
    char buf[48] = "Replicate()";
    if (pp) {
      int t = tr_mesh_shape_index(&pp->mesh, "tp");
      if (t >= 0) tr_placement_str(pp->placements[t], buf, sizeof buf);
    }
    char shape[64], local[64];
    if (p->ndim == 2) {
      snprintf(shape, sizeof shape, "[%" PRId64 ", %" PRId64 "]", p->shape[0],
               p->shape[1]);
      snprintf(local, sizeof local, "[%" PRId64 ", %" PRId64 "]",
               p->layout.shape[0], p->layout.shape[1]);
    } else {
      snprintf(shape, sizeof shape, "[%" PRId64 "]", p->shape[0]);
      snprintf(local, sizeof local, "[%" PRId64 "]", p->layout.shape[0]);
    }
    if (fprintf(f, "  %-44s %-20s %-18s %-14s local %s\n", p->name,
                style_name(p->tp_style), buf, shape, local) < 0)
      return TR_EIO;
    whole += numel(p->ndim, p->shape);
    held += numel(p->ndim, p->layout.shape);
  }
  /* fp32 weights, gradients and the two AdamW moments */
  if (fprintf(f,
              "  per rank: %" PRId64 " of %" PRId64 " parameter elements, "
              "%.1f MiB of fp32 weights, gradients and AdamW moments\n",
              held, whole, 16.0 * (double)held / (1024.0 * 1024.0)) < 0)
    return TR_EIO;
  return 0;
}

/* ---- the hook ---- */

int tr_tp_reduce(void* arg, tr_tp_point_t point, tr_tensor_t* t) {
  (void)point; /* both points sum over the group (no sequence parallel) */
  return tr_pg_all_reduce(arg, t, TR_PG_SUM, NULL);
}

void tr_tp_install(tr_model_t* m, tr_pg_t* tp) {
  m->tp.reduce = tp && tr_pg_size(tp) > 1 ? tr_tp_reduce : NULL;
  m->tp.arg = m->tp.reduce ? tp : NULL;
}

/* ---- gather and norm ---- */

/* The index of the mesh dim "tp" in p's placement when it shards p, else
 * -1. */
static int tp_dim(const tr_param_t* p) {
  const tr_param_placement_t* pp = tr_dtensor_param_placement(p);
  if (!pp) return -1;
  int t = tr_mesh_shape_index(&pp->mesh, "tp");
  return t >= 0 && pp->placements[t].kind == TR_PLACEMENT_SHARD ? t : -1;
}

int tr_tp_sharded(const tr_param_t* p) { return tp_dim(p) >= 0; }

int tr_tp_gather(const tr_param_t* p, const tr_tensor_t* local, tr_pg_t* tp,
                 tr_tensor_t* out) {
  int t = tp_dim(p);
  if (!tr_tensor_is_contiguous(local)) return TR_EUNSUPPORTED;
  for (int d = 0; d < p->ndim; d++)
    if (local->ndim != p->ndim || local->shape[d] != p->layout.shape[d])
      return TR_ESHAPE;
  if (t < 0) { /* whole already */
    TR_CHECK(
        tr_tensor_empty(out, local->dtype, TR_DEVICE_CPU, p->ndim, p->shape));
    int rc = tr_tensor_copy(out, local);
    if (rc < 0) tr_tensor_release(out);
    return rc;
  }
  const tr_param_placement_t* pp = tr_dtensor_param_placement(p);
  for (int i = 0; i < pp->mesh.ndim; i++)
    if (i != t && pp->placements[i].kind == TR_PLACEMENT_SHARD)
      return TR_EUNSUPPORTED; /* only tp cuts it (FSDP gathers first) */
  int k = pp->mesh.sizes[t];
  int64_t n = tr_tensor_numel(local), all_shape[1] = {n * k};
  for (int r = 0; r < k; r++) { /* an all-gather needs equal pieces */
    int64_t ls[TR_MAX_DIMS], off[TR_MAX_DIMS], nr = 1;
    TR_CHECK(
        tr_param_placement_layout(pp, p->ndim, p->shape, "tp", r, 0, ls, off));
    for (int d = 0; d < p->ndim; d++) nr *= ls[d];
    if (nr != n) return TR_EUNSUPPORTED;
  }
  tr_tensor_t all = {0}, dev = {0};
  int rc;
  TR_CHECK(tr_tensor_empty(&all, local->dtype, TR_DEVICE_CPU, 1, all_shape));
  TR_CHECK_GOTO(
      tr_tensor_empty(out, local->dtype, TR_DEVICE_CPU, p->ndim, p->shape), rc,
      done);
  if (local->device.type == TR_DEV_CPU) {
    TR_CHECK_GOTO(tr_pg_all_gather(tp, &all, local, NULL), rc, done);
  } else { /* gathered where the pieces are (NCCL), reordered on the host */
    TR_CHECK_GOTO(
        tr_tensor_empty(&dev, local->dtype, local->device, 1, all_shape), rc,
        done);
    TR_CHECK_GOTO(tr_pg_all_gather(tp, &dev, local, NULL), rc, done);
    TR_CHECK_GOTO(tr_tensor_copy(&all, &dev), rc, done);
  }
  int P = pp->placements[t].parts > 1 ? pp->placements[t].parts : 1;
  for (int r = 0; r < k; r++) {
    int64_t ls[TR_MAX_DIMS], off[TR_MAX_DIMS];
    TR_CHECK_GOTO(
        tr_param_placement_layout(pp, p->ndim, p->shape, "tp", r, 0, ls, off),
        rc, done);
    /* rank r's piece, P runs along dim 0 */
    int64_t lrows = ls[0] / P, grows = p->shape[0] / P;
    for (int j = 0; j < P; j++) {
      tr_tensor_t src = {0}, flat = {0}, tmp = {0};
      int64_t rs[TR_MAX_DIMS];
      memcpy(rs, ls, sizeof rs);
      rs[0] = lrows;
      int64_t run = n / P, start = r * n + j * run;
      rc = tr_tensor_narrow(&flat, &all, 0, start, run);
      if (rc == 0) rc = tr_tensor_reshape(&src, &flat, p->ndim, rs);
      if (rc == 0)
        rc = tr_tensor_narrow(&tmp, out, 0, j * grows + off[0], lrows);
      for (int d = 1; rc == 0 && d < p->ndim; d++)
        rc = tr_tensor_narrow(&tmp, &tmp, d, off[d], ls[d]);
      if (rc == 0) rc = tr_tensor_copy(&tmp, &src);
      tr_tensor_release(&src);
      tr_tensor_release(&flat);
      tr_tensor_release(&tmp);
      if (rc < 0) goto done;
    }
  }
  rc = 0;
done:
  tr_tensor_release(&all);
  tr_tensor_release(&dev);
  if (rc < 0) tr_tensor_release(out);
  return rc;
}

/* The sum of squares of the grads of the parameters whose tp-shardedness
 * is `sharded`, added into *sq: one multi-tensor launch (one
 * synchronisation on CUDA). */
static int sum_squares_of(const tr_model_t* m, int sharded,
                          const unsigned char* skip, double* sq) {
  const tr_tensor_t** gs = calloc((size_t)m->n_params + 1, sizeof *gs);
  if (!gs) return TR_ENOMEM;
  int n = 0;
  for (int i = 0; i < m->n_params; i++) {
    const tr_param_t* p = &m->params[i];
    if (p->grad.storage && !(skip && skip[i]) && tr_tp_sharded(p) == sharded)
      gs[n++] = &p->grad;
  }
  int rc = n ? tr_kern_sum_squares_multi(gs, n, sq) : 0;
  free(gs);
  return rc;
}

int tr_tp_grad_sq_norm(const tr_model_t* m, tr_pg_t* tp,
                       const unsigned char* skip, double* out) {
  double rep = 0, shard = 0;
  TR_CHECK(sum_squares_of(m, 0, skip, &rep));
  TR_CHECK(sum_squares_of(m, 1, skip, &shard));
  int k = tp ? tr_pg_size(tp) : 1;
  if (k > 1) { /* every rank's sharded sum, added in rank order */
    int64_t one[1] = {sizeof(double)}, all[1] = {(int64_t)sizeof(double) * k};
    tr_tensor_t a = {0}, b = {0};
    int rc;
    TR_CHECK(tr_tensor_empty(&a, TR_U8, TR_DEVICE_CPU, 1, one));
    TR_CHECK_GOTO(tr_tensor_empty(&b, TR_U8, TR_DEVICE_CPU, 1, all), rc, out);
    memcpy(tr_tensor_data(&a), &shard, sizeof shard);
    TR_CHECK_GOTO(tr_pg_all_gather(tp, &b, &a, NULL), rc, out);
    const unsigned char* bytes = tr_tensor_data(&b);
    shard = 0;
    for (int r = 0; r < k; r++) {
      double v;
      memcpy(&v, bytes + (size_t)r * sizeof v, sizeof v);
      shard += v;
    }
    rc = 0;
  out:
    tr_tensor_release(&a);
    tr_tensor_release(&b);
    TR_CHECK(rc);
  }
  *out = rep + shard;
  return 0;
}
