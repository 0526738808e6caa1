/* dtensor/tp.c: tensor parallelism (Megatron-style, torchtitan's plan with
 * vocabulary-parallel embedding, loss parallel and sequence parallel) --
 * the plan that turns each parameter's declared tp style into placements
 * on the mesh dim "tp", the model's tp hook (the seam's sums, max,
 * all-gathers and reduce-scatters over the tp group, with the reorders that
 * batch-major [B, T, C] needs; blocking ops, or under [metrics]
 * comm_overlap ops with work handles that the compute waits for through
 * the timed waits of collectives/waits.c), the gather of a tp-sharded
 * tensor, and the
 * squared gradient norm that counts a tp-replicated parameter once
 * (trainrun/dtensor.h). */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/internal.h"
#include "trainrun/dtensor.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h" /* tr_kern_sum_squares_multi */
#include "trainrun/log.h"
#include "trainrun/pg_waits.h" /* the timed hook's waits */

/* ---- the plan ---- */

int tr_tp_placement(const tr_param_t* p, int tp, tr_placement_t* out) {
  switch (p->tp_style) {
    case TR_TP_COLWISE:
      *out = tr_placement_shard_parts(0, p->tp_parts > 1 ? p->tp_parts : 1);
      return 1;
    case TR_TP_ROWWISE:
      *out = tr_placement_shard(1);
      return 1;
    case TR_TP_VOCAB: /* vocabulary rows, where tp divides them */
    case TR_TP_OUTPUT:
      if (tp > 1 && p->shape[0] % tp == 0) {
        *out = tr_placement_shard(0);
        return 1;
      }
      break;
    case TR_TP_REPLICATE: /* norms, row-parallel biases, positions */
      break;
  }
  *out = tr_placement_replicate();
  return 0;
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
    if (!tr_tp_placement(p, tp, &pl)) continue;
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
    if (!tr_tp_placement(p, mesh->sizes[t], &pl[t])) continue;
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

/* The style, and for the vocabulary tables whether the plan split them
 * (split) or could not (tp: another parameter is split, so tp > 1). */
static const char* style_name(tr_tp_style_t s, int split, int tp) {
  switch (s) {
    case TR_TP_COLWISE:
      return "colwise";
    case TR_TP_ROWWISE:
      return "rowwise";
    case TR_TP_VOCAB:
      return split ? "vocab (rows split)"
             : tp  ? "vocab (replicated: V % tp != 0)"
                   : "vocab (replicated)";
    case TR_TP_OUTPUT:
      return split ? "output (rows split)"
             : tp  ? "output (replicated: V % tp != 0)"
                   : "output (replicated)";
    default:
      return "replicate";
  }
}

int tr_tp_plan_describe(const tr_model_t* m, FILE* f) {
  int64_t whole = 0, held = 0;
  int tp = 0;
  for (int i = 0; i < m->n_params; i++) tp |= tr_tp_sharded(&m->params[i]);
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
                style_name(p->tp_style, tr_tp_sharded(p), tp), buf, shape,
                local) < 0)
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

void tr_tp_opts_init(tr_tp_opts_t* o) {
  o->sequence_parallel = 1;
  o->loss_parallel = 1;
  o->async = 0;
  o->comm = NULL;
}

/* The timed hook's state ([metrics] comm_overlap), or the waits of the
 * async ring without timing. */
struct tr_tp_comm {
  tr_pg_t* pg;
  tr_pg_waits_t waits;
  int timed;     /* op timing on (comm_overlap) */
  int measure;   /* 0: the ops go uncounted (validation, or untimed) */
  int64_t steps; /* tr_tp_comm_step_end calls since the take */
};

/* Works held on CUDA before the host waits for the oldest: two layers'
 * forward ops under sequence parallel (the work keeps its buffers, so a
 * longer lead would hold more activation-sized memory). */
enum { COMM_LAG = 8 };

int tr_tp_comm_new(tr_pg_t* tp, int timed, tr_tp_comm_t** out) {
  *out = NULL;
  if (!tp) return TR_EINVAL;
  tr_tp_comm_t* c = calloc(1, sizeof *c);
  if (!c) return TR_ENOMEM;
  int rc = tr_pg_waits_init(&c->waits, COMM_LAG);
  if (rc == 0 && timed && (rc = tr_pg_set_op_timing(tp, 1)) < 0)
    tr_pg_waits_release(&c->waits);
  if (rc < 0) {
    free(c);
    return rc;
  }
  c->pg = tp;
  c->timed = timed != 0;
  c->measure = c->timed;
  *out = c;
  return 0;
}

void tr_tp_comm_free(tr_tp_comm_t* c) {
  if (!c) return;
  tr_pg_waits_release(&c->waits);
  if (c->timed) tr_pg_set_op_timing(c->pg, 0); /* the group outlives c */
  free(c);
}

void tr_tp_comm_measure(tr_tp_comm_t* c, int on) {
  c->measure = on && c->timed;
}

int tr_tp_comm_step_end(tr_tp_comm_t* c) {
  int rc = tr_pg_waits_drain(&c->waits);
  c->steps++;
  return rc;
}

void tr_tp_comm_take(tr_tp_comm_t* c, tr_pg_comm_t* out) {
  tr_pg_waits_take(&c->waits, &c->steps, out);
}

/* After an op issued on c's group with a work handle into *w (c ? w :
 * NULL; read here, after the issue): the compute waits for it through c's
 * waits (timed while measuring); without c the op was blocking. rc: the
 * issue's status. */
static int await(tr_tp_comm_t* c, int rc, tr_pg_work_t** w,
                 const tr_tensor_t* t, const char* what) {
  if (!c || rc < 0) return rc;
  return tr_pg_waits_wait(&c->waits, *w, t->device.type == TR_DEV_CUDA, 1,
                          c->measure, what, "group", tr_pg_desc(c->pg));
}

/* *t becomes out (its reference moved), the old one released. */
static void take(tr_tensor_t* t, tr_tensor_t* out) {
  tr_tensor_release(t);
  *t = *out;
  *out = (tr_tensor_t){0};
}

/* Block b of the rows [r Tl, (r+1) Tl) of seq [B, T, W], a contiguous
 * [1, Tl, W] view, in *v; and the matching run (r B + b) of a flat
 * [k B Tl W] buffer, in *f. */
static int seq_views(const tr_tensor_t* seq, const tr_tensor_t* flat, int r,
                     int b, int64_t Tl, tr_tensor_t* v, tr_tensor_t* f) {
  int64_t B = seq->shape[0], W = seq->shape[2], run = Tl * W;
  int64_t shape[3] = {1, Tl, W};
  TR_CHECK(tr_tensor_narrow(v, seq, 0, b, 1));
  TR_CHECK(tr_tensor_narrow(v, v, 1, (int64_t)r * Tl, Tl));
  TR_CHECK(tr_tensor_narrow(f, flat, 0, ((int64_t)r * B + b) * run, run));
  return tr_tensor_reshape(f, f, 3, shape);
}

/* [B, Tl, W] -> [B, k Tl, W]: the all-gather's [k][B][Tl][W] reordered
 * (dir 0), or [B, k Tl, W] -> its reduce-scatter's [B, Tl, W] through the
 * reorder the other way (dir 1). */
static int seq_collective(tr_pg_t* pg, tr_tp_comm_t* c, tr_tensor_t* t,
                          int scatter) {
  int k = tr_pg_size(pg);
  int64_t B = t->shape[0], W = t->shape[2];
  int64_t Tl = scatter ? t->shape[1] / k : t->shape[1];
  int64_t n = B * Tl * W, flat_shape[1] = {n * k};
  int64_t out_shape[3] = {B, scatter ? Tl : Tl * k, W};
  if (t->ndim != 3 || (scatter && t->shape[1] % k)) return TR_ESHAPE;
  tr_tensor_t src = {0}, flat = {0}, out = {0};
  tr_pg_work_t* w = NULL;
  int rc;
  TR_CHECK_GOTO(tr_tensor_contiguous(&src, t), rc, done);
  TR_CHECK_GOTO(tr_tensor_empty(&flat, t->dtype, t->device, 1, flat_shape), rc,
                done);
  TR_CHECK_GOTO(tr_tensor_empty(&out, t->dtype, t->device, 3, out_shape), rc,
                done);
  if (!scatter)
    TR_CHECK_GOTO(await(c, tr_pg_all_gather(pg, &flat, &src, c ? &w : NULL), &w,
                        t, "all-gather"),
                  rc, done);
  for (int r = 0; r < k; r++)
    for (int64_t b = 0; b < B; b++) {
      tr_tensor_t v = {0}, f = {0};
      rc = seq_views(scatter ? &src : &out, &flat, r, (int)b, Tl, &v, &f);
      if (rc == 0)
        rc = scatter ? tr_tensor_copy(&f, &v) : tr_tensor_copy(&v, &f);
      tr_tensor_release(&v);
      tr_tensor_release(&f);
      if (rc < 0) goto done;
    }
  if (scatter)
    TR_CHECK_GOTO(
        await(c,
              tr_pg_reduce_scatter(pg, &out, &flat, TR_PG_SUM, c ? &w : NULL),
              &w, t, "reduce-scatter"),
        rc, done);
  take(t, &out);
  rc = 0;
done:
  tr_tensor_release(&src);
  tr_tensor_release(&flat);
  tr_tensor_release(&out);
  return rc;
}

/* [..., Wl] -> [..., k Wl], rank r's columns at [r Wl, (r+1) Wl). */
static int gather_last(tr_pg_t* pg, tr_tp_comm_t* c, tr_tensor_t* t) {
  int k = tr_pg_size(pg), d = t->ndim - 1;
  int64_t Wl = t->shape[d], n = tr_tensor_numel(t), rows = n / Wl;
  int64_t flat_shape[1] = {n * k}, piece[2] = {rows, Wl},
          wide[2] = {rows, Wl * k};
  int64_t out_shape[TR_MAX_DIMS];
  memcpy(out_shape, t->shape, sizeof out_shape);
  out_shape[d] = Wl * k;
  tr_tensor_t src = {0}, flat = {0}, out = {0}, out2 = {0};
  tr_pg_work_t* w = NULL;
  int rc;
  if (t->device.type != TR_DEV_CPU) {
    TR_LOG_ERROR(DT,
                 "disable_loss_parallel: gathering the logits over tp needs "
                 "host tensors (a strided column copy); loss parallel works "
                 "on devices");
    return TR_EUNSUPPORTED;
  }
  TR_CHECK_GOTO(tr_tensor_contiguous(&src, t), rc, done);
  TR_CHECK_GOTO(tr_tensor_empty(&flat, t->dtype, t->device, 1, flat_shape), rc,
                done);
  TR_CHECK_GOTO(tr_tensor_empty(&out, t->dtype, t->device, t->ndim, out_shape),
                rc, done);
  TR_CHECK_GOTO(await(c, tr_pg_all_gather(pg, &flat, &src, c ? &w : NULL), &w,
                      t, "all-gather"),
                rc, done);
  TR_CHECK_GOTO(tr_tensor_reshape(&out2, &out, 2, wide), rc, done);
  for (int r = 0; r < k; r++) {
    tr_tensor_t f = {0}, v = {0};
    rc = tr_tensor_narrow(&f, &flat, 0, r * n, n);
    if (rc == 0) rc = tr_tensor_reshape(&f, &f, 2, piece);
    if (rc == 0) rc = tr_tensor_narrow(&v, &out2, 1, r * Wl, Wl);
    if (rc == 0) rc = tr_tensor_copy(&v, &f); /* strided */
    tr_tensor_release(&f);
    tr_tensor_release(&v);
    if (rc < 0) goto done;
  }
  take(t, &out);
  rc = 0;
done:
  tr_tensor_release(&src);
  tr_tensor_release(&flat);
  tr_tensor_release(&out);
  tr_tensor_release(&out2);
  return rc;
}

/* The op over pg; c: issued with a work handle and waited for through c
 * (NULL: blocking). */
static int collective(tr_pg_t* pg, tr_tp_comm_t* c, tr_tp_op_t op,
                      tr_tensor_t* t) {
  tr_pg_work_t* w = NULL;
  switch (op) {
    case TR_TP_SUM:
    case TR_TP_MAX:
      return await(
          c,
          tr_pg_all_reduce(pg, t, op == TR_TP_SUM ? TR_PG_SUM : TR_PG_MAX,
                           c ? &w : NULL),
          &w, t, "all-reduce");
    case TR_TP_GATHER:
      return seq_collective(pg, c, t, 0);
    case TR_TP_SCATTER:
      return seq_collective(pg, c, t, 1);
    case TR_TP_GATHER_LAST:
      return gather_last(pg, c, t);
    default:
      return TR_EINVAL;
  }
}

/* ---- async tensor parallel: the chunked ring ----
 *
 * The SP all-gather before the column-parallel linears and the
 * reduce-scatter after the row-parallel ones, cut into the tp sequence
 * chunks and moved around the ring with point-to-point transfers (one
 * coalesced group a step: send to r + 1, receive from r - 1) while the
 * model's chunk callback computes on what the rank holds (trainrun/model.h,
 * tr_model_tp_t.overlap). On Gloo the transfers run on the group's thread
 * while the host runs the GEMM; on NCCL on the group's stream while the
 * compute stream runs it, and the compute stream waits for a step's
 * transfers only before it needs them (the waits of collectives/waits.c,
 * no host wait).
 *
 * Layout: activations are batch-major [B, T, W], so rank j's chunk of the
 * sequence is B runs of [T/tp, W] rows at a batch stride of T W. Each ring
 * step moves ONE contiguous [B, T/tp, W] buffer (one send and one receive)
 * and runs the callback ONCE on it, whose GEMMs read or write the runs of
 * the batch-major tensors as one batch-strided [B, T/tp, W] view (one
 * strided-batched GEMM a linear on CUDA: tr_kern_linear_fwd's
 * batch-strided views). Why this and not per-run transfers and GEMMs (the
 * first version: B sends and B receives a step, B GEMMs of T/tp rows a
 * linear; at Llama 1B B8 TP 2 16 GEMMs of 1024 rows where blocking TP runs
 * one of 16384, and no faster than blocking on 2 H200s): the transfer
 * count and the GEMM count are then those of one chunk, whatever B.
 * Nor a chunk-major layout through the layer ([tp, B, T/tp, W]): the
 * column-parallel outputs (q, k, v, gate, up) and the tensors the backward
 * keeps must stay batch-major (attention, RoPE and the weight gradients
 * read them so), so every output would need a reorder copy; with the
 * batch stride in the GEMM only the gathered input is reordered.
 * The gather receives each chunk into a staging buffer (two, reused:
 * 2/tp of the gathered tensor at tp >= 3, 1/2 at tp 2) and copies it into
 * the gathered batch-major tensor after its GEMMs (the tensor the weight
 * gradients and the backward read): (tp - 1)/tp of the gathered tensor is
 * read and written once more than by the blocking all-gather (at Llama 1B
 * B8 x T2048, W 2048 bf16, TP 2: 32 MiB each way a gather, 4 gathers a
 * layer). The scatter's partial sums are computed straight into
 * contiguous [B, T/tp, W] buffers, which travel as they are. On NCCL a
 * buffer received into again is safe: the group's stream waits for the
 * compute stream (its earlier GEMMs and copy) before each transfer. */

/* The compute waits for a ring step's transfers: through c's waits (timed
 * while measuring; on CUDA a stream wait, the handle held), or without c
 * on the host. The handle is taken. */
static int ring_wait(tr_tp_comm_t* c, tr_pg_work_t* w, int cuda,
                     const char* what) {
  if (!w) return 0;
  if (c)
    return tr_pg_waits_wait(&c->waits, w, cuda, 1, c->measure, what, "group",
                            tr_pg_desc(c->pg));
  int rc = tr_pg_work_wait(w, 0);
  tr_pg_work_free(w);
  return rc;
}

/* One ring step's transfers as one coalesced group: snd to the next rank,
 * rcv from the previous one (both contiguous). */
static int ring_start(tr_pg_t* pg, const tr_tensor_t* snd, tr_tensor_t* rcv,
                      tr_pg_work_t** w) {
  int k = tr_pg_size(pg), r = tr_pg_rank(pg);
  *w = NULL;
  TR_CHECK(tr_pg_coalesce_begin(pg));
  int rc = tr_pg_send(pg, snd, (r + 1) % k, 0, NULL);
  if (rc == 0) rc = tr_pg_recv(pg, rcv, (r + k - 1) % k, 0, NULL);
  int rc2 = tr_pg_coalesce_end(pg, w);
  return rc < 0 ? rc : rc2;
}

/* chunk [B, n, W] (contiguous) into rows [t0, t0 + n) of every sequence of
 * out [B, T, W]: one copy a batch row (device copies are contiguous). */
static int place(tr_tensor_t* out, int64_t t0, const tr_tensor_t* chunk) {
  int64_t n = chunk->shape[1];
  int rc = 0;
  for (int64_t b = 0; b < chunk->shape[0] && rc == 0; b++) {
    tr_tensor_t dst = {0}, src = {0};
    rc = tr_tensor_narrow(&dst, out, 0, b, 1);
    if (rc == 0) rc = tr_tensor_narrow(&dst, &dst, 1, t0, n);
    if (rc == 0) rc = tr_tensor_narrow(&src, chunk, 0, b, 1);
    if (rc == 0) rc = tr_tensor_copy(&dst, &src);
    tr_tensor_release(&dst);
    tr_tensor_release(&src);
  }
  return rc;
}

/* t [B, n, W] -> [B, k n, W]; step s computes on chunk r - s (held: t
 * itself, then a staging buffer) while it goes to r + 1 and chunk r - s - 1
 * comes from r - 1 into the other buffer; the held chunk is then copied
 * into the gathered tensor. */
static int ring_gather(tr_pg_t* pg, tr_tp_comm_t* c, tr_tensor_t* t,
                       tr_tp_chunk_fn fn, void* ctx) {
  int k = tr_pg_size(pg), r = tr_pg_rank(pg);
  if (t->ndim != 3 || !tr_tensor_is_contiguous(t)) return TR_ESHAPE;
  int64_t B = t->shape[0], n = t->shape[1];
  int64_t shape[3] = {B, n * k, t->shape[2]};
  int cuda = t->device.type == TR_DEV_CUDA;
  tr_tensor_t out = {0}, buf[2] = {{0}};
  TR_CHECK(tr_tensor_empty(&out, t->dtype, t->device, 3, shape));
  int rc = 0;
  for (int i = 0; i < 2 && i < k - 1 && rc == 0; i++) /* k 2: one */
    rc = tr_tensor_empty(&buf[i], t->dtype, t->device, 3, t->shape);
  if (rc == 0) rc = place(&out, (int64_t)r * n, t); /* this rank's rows */
  for (int s = 0; s < k && rc == 0; s++) {
    int64_t held = (int64_t)((r - s + k) % k) * n;
    tr_tensor_t* src = s == 0 ? t : &buf[(s - 1) % 2];
    tr_pg_work_t* w = NULL;
    if (s < k - 1) rc = ring_start(pg, src, &buf[s % 2], &w);
    if (rc == 0) rc = fn(ctx, held, n, src);
    if (rc == 0 && s > 0) rc = place(&out, held, src);
    int wrc = ring_wait(c, w, cuda, "all-gather ring step");
    if (rc == 0) rc = wrc;
  }
  if (rc == 0) take(t, &out);
  tr_tensor_release(&out);
  tr_tensor_release(&buf[0]);
  tr_tensor_release(&buf[1]);
  return rc;
}

/* t [B, n, W] = this rank's rows of the sum: step s computes the partial
 * sums of chunk r - 1 - s (the owner r last) while the previous step's
 * sum goes to r + 1 and the one for this chunk comes from r - 1, added
 * after. */
static int ring_scatter(tr_pg_t* pg, tr_tp_comm_t* c, tr_tensor_t* t,
                        tr_tp_chunk_fn fn, void* ctx) {
  int k = tr_pg_size(pg), r = tr_pg_rank(pg);
  if (t->ndim != 3 || !tr_tensor_is_contiguous(t)) return TR_ESHAPE;
  int64_t n = t->shape[1];
  int cuda = t->device.type == TR_DEV_CUDA;
  tr_tensor_t acc[2] = {{0}}, in = {0};
  int rc = 0;
  for (int i = 0; i < 2 && i < k - 1 && rc == 0; i++) /* k 2: one */
    rc = tr_tensor_empty(&acc[i], t->dtype, t->device, 3, t->shape);
  if (rc == 0) rc = tr_tensor_empty(&in, t->dtype, t->device, 3, t->shape);
  for (int s = 0; s < k && rc == 0; s++) {
    int64_t t0 = (int64_t)((r - 1 - s + 2 * k) % k) * n;
    tr_tensor_t* dst = s == k - 1 ? t : &acc[s % 2];
    tr_pg_work_t* w = NULL;
    if (s > 0) rc = ring_start(pg, &acc[(s - 1) % 2], &in, &w);
    if (rc == 0) rc = fn(ctx, t0, n, dst);
    int wrc = ring_wait(c, w, cuda, "reduce-scatter ring step");
    if (rc == 0) rc = wrc;
    if (rc == 0 && s > 0) rc = tr_kern_add(dst, dst, &in);
  }
  tr_tensor_release(&acc[0]);
  tr_tensor_release(&acc[1]);
  tr_tensor_release(&in);
  return rc;
}

/* The async op over pg; c: waited for through c (NULL: on the host). */
static int overlap(tr_pg_t* pg, tr_tp_comm_t* c, tr_tp_op_t op, tr_tensor_t* t,
                   tr_tp_chunk_fn fn, void* ctx) {
  switch (op) {
    case TR_TP_GATHER:
      return ring_gather(pg, c, t, fn, ctx);
    case TR_TP_SCATTER:
      return ring_scatter(pg, c, t, fn, ctx);
    default:
      return TR_EINVAL;
  }
}

static int ring_overlap(void* arg, tr_tp_point_t point, tr_tp_op_t op,
                        tr_tensor_t* t, tr_tp_chunk_fn fn, void* ctx) {
  (void)point;
  return overlap(arg, NULL, op, t, fn, ctx);
}

/* The async ops with waits: arg is a tr_tp_comm_t. */
static int timed_overlap(void* arg, tr_tp_point_t point, tr_tp_op_t op,
                         tr_tensor_t* t, tr_tp_chunk_fn fn, void* ctx) {
  (void)point;
  tr_tp_comm_t* c = arg;
  return overlap(c->pg, c, op, t, fn, ctx);
}

int tr_tp_collective(void* arg, tr_tp_point_t point, tr_tp_op_t op,
                     tr_tensor_t* t) {
  (void)point; /* what to do is the op; the point says where */
  return collective(arg, NULL, op, t);
}

/* The hook under [metrics] comm_overlap: arg is a tr_tp_comm_t. */
static int timed_collective(void* arg, tr_tp_point_t point, tr_tp_op_t op,
                            tr_tensor_t* t) {
  (void)point;
  tr_tp_comm_t* c = arg;
  return collective(c->pg, c, op, t);
}

void tr_tp_install(tr_model_t* m, tr_pg_t* tp, const tr_tp_opts_t* opts) {
  tr_tp_opts_t o;
  tr_tp_opts_init(&o);
  if (opts) o = *opts;
  memset(&m->tp, 0, sizeof m->tp);
  if (!tp || tr_pg_size(tp) < 2) return; /* the bits of no seam */
  m->tp.fn = o.comm ? timed_collective : tr_tp_collective;
  m->tp.arg = o.comm ? (void*)o.comm : (void*)tp;
  m->tp.size = tr_pg_size(tp);
  m->tp.rank = tr_pg_rank(tp);
  m->tp.sequence_parallel = o.sequence_parallel != 0;
  m->tp.loss_parallel = o.loss_parallel != 0;
  if (o.async && o.sequence_parallel)
    m->tp.overlap = o.comm ? timed_overlap : ring_overlap;
}

int tr_tp_check_seq_len(int tp, int seq_len, const tr_tp_opts_t* opts,
                        tr_errmsg_t* err) {
  tr_tp_opts_t o;
  tr_tp_opts_init(&o);
  if (opts) o = *opts;
  if (tp > 1 && o.sequence_parallel && seq_len % tp)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "tensor_parallel_degree %d does not divide the "
                         "sequence length %d (sequence parallel)",
                         tp, seq_len);
  return 0;
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
    tr_param_layout_t l;
    int64_t nr = 1;
    TR_CHECK(tr_param_placement_layout(pp, p->ndim, p->shape, "tp", r, 0, &l));
    for (int d = 0; d < p->ndim; d++) nr *= l.shape[d];
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
  int64_t row_numel = 1;
  for (int d = 1; d < p->ndim; d++) row_numel *= p->layout.shape[d];
  for (int r = 0; r < k; r++) {
    tr_param_layout_t l;
    tr_param_run_t runs[TR_PARAM_MAX_RUNS];
    TR_CHECK_GOTO(
        tr_param_placement_layout(pp, p->ndim, p->shape, "tp", r, 0, &l), rc,
        done);
    /* rank r's piece: runs of rows (P of them for parts), each a box */
    int nrun = tr_param_layout_runs(&l, p->shape[0], runs);
    TR_CHECK_GOTO(nrun, rc, done);
    for (int j = 0; j < nrun; j++) {
      tr_tensor_t src = {0}, flat = {0}, tmp = {0};
      int64_t rs[TR_MAX_DIMS];
      memcpy(rs, l.shape, sizeof rs);
      rs[0] = runs[j].rows;
      rc = tr_tensor_narrow(&flat, &all, 0, r * n + runs[j].local * row_numel,
                            runs[j].rows * row_numel);
      if (rc == 0) rc = tr_tensor_reshape(&src, &flat, p->ndim, rs);
      if (rc == 0)
        rc = tr_tensor_narrow(&tmp, out, 0, runs[j].global, runs[j].rows);
      for (int d = 1; rc == 0 && d < p->ndim; d++)
        rc = tr_tensor_narrow(&tmp, &tmp, d, l.offset[d], l.shape[d]);
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
