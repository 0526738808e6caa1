/* dtensor/redistribute.c: changing a DTensor's placements -- the plan (which
 * mesh dim changes how, in which order) and the steps that run it: all-gather,
 * all-reduce, reduce-scatter and all-to-all with padding for uneven pieces,
 * and the local chunk / partial steps; sync, or async through a work handle
 * whose wait runs what is left -- and the two redistributes from and to a
 * whole tensor, distribute and full_tensor. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "dtensor/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* ---- the plan ---- */

typedef enum {
  STEP_GATHER,         /* Shard(d) -> Replicate: all-gather */
  STEP_ALL_TO_ALL,     /* Shard(d) -> Shard(d2): all-to-all */
  STEP_REDUCE_SCATTER, /* Partial -> Shard(d): reduce-scatter */
  STEP_ALL_REDUCE,     /* Partial -> Replicate: all-reduce */
  STEP_CHUNK,          /* Replicate -> Shard(d): local piece */
  STEP_PARTIAL         /* Replicate -> Partial: local */
} step_kind_t;

typedef struct {
  step_kind_t kind;
  int mesh_dim;
  tr_placement_t from, to;
  /* placements of every mesh dim before the step */
  tr_placement_t before[TR_MESH_MAX_DIMS];
} step_t;

#define MAX_STEPS (2 * TR_MESH_MAX_DIMS)

static int is_shard(tr_placement_t p, int d) {
  return p.kind == TR_PLACEMENT_SHARD && p.dim == d;
}

/* Could mesh dim i turn Shard(d) into Shard(d2) by one all-to-all? Dim d2
 * must then be cut at level i exactly as the target has it: the mesh dims
 * before i that shard d2 now are those that shard it in the target, and no
 * later mesh dim shards it (nor d) now. */
static int all_to_all_ok(const tr_placement_t* cur, const tr_placement_t* dst,
                         int m, int i, int d, int d2) {
  for (int j = 0; j < m; j++) {
    if (j == i) continue;
    if (j < i && is_shard(cur[j], d2) != is_shard(dst[j], d2)) return 0;
    if (j > i && (is_shard(cur[j], d2) || is_shard(cur[j], d))) return 0;
  }
  return 1;
}

static int plan(const tr_placement_t* src, const tr_placement_t* dst, int m,
                int ndim, step_t* steps, int* nsteps) {
  tr_placement_t cur[TR_MESH_MAX_DIMS];
  int keep[TR_MESH_MAX_DIMS] = {0};
  int n = 0;
  memcpy(cur, src, sizeof(tr_placement_t) * (size_t)m);
  for (int i = 0; i < m; i++)
    if (src[i].kind == TR_PLACEMENT_PARTIAL &&
        dst[i].kind == TR_PLACEMENT_PARTIAL && src[i].op != dst[i].op) {
      char a[32], b[32];
      TR_LOG_ERROR(DT, "redistribute %s -> %s on mesh dim %d is not supported",
                   tr_placement_str(src[i], a, sizeof a),
                   tr_placement_str(dst[i], b, sizeof b), i);
      return TR_EUNSUPPORTED;
    }
  /* Mesh dims that cut a tensor dim the same way in both, in the same
   * order from the first mesh dim on (the common prefix), stay. */
  for (int d = 0; d < ndim; d++) {
    int a = 0, b = 0;
    for (;;) {
      while (a < m && !is_shard(src[a], d)) a++;
      while (b < m && !is_shard(dst[b], d)) b++;
      if (a == m || b == m || a != b) break;
      keep[a] = 1;
      a++;
      b++;
    }
  }
  /* 1: undo the other shards, last mesh dim first */
  for (int i = m - 1; i >= 0; i--) {
    if (cur[i].kind != TR_PLACEMENT_SHARD || keep[i]) continue;
    step_t* s = &steps[n++];
    s->mesh_dim = i;
    s->from = cur[i];
    memcpy(s->before, cur, sizeof(tr_placement_t) * (size_t)m);
    if (dst[i].kind == TR_PLACEMENT_SHARD && dst[i].dim != cur[i].dim &&
        all_to_all_ok(cur, dst, m, i, cur[i].dim, dst[i].dim)) {
      s->kind = STEP_ALL_TO_ALL;
      s->to = dst[i];
    } else {
      s->kind = STEP_GATHER;
      s->to = tr_placement_replicate();
    }
    cur[i] = s->to;
  }
  /* 2: reductions and new shards, first mesh dim first */
  for (int i = 0; i < m; i++) {
    if (tr_placement_eq(cur[i], dst[i])) continue;
    step_t* s = &steps[n];
    s->mesh_dim = i;
    s->from = cur[i];
    s->to = dst[i];
    memcpy(s->before, cur, sizeof(tr_placement_t) * (size_t)m);
    if (cur[i].kind == TR_PLACEMENT_REPLICATE)
      s->kind = dst[i].kind == TR_PLACEMENT_SHARD ? STEP_CHUNK : STEP_PARTIAL;
    else if (cur[i].kind == TR_PLACEMENT_PARTIAL)
      s->kind = dst[i].kind == TR_PLACEMENT_SHARD ? STEP_REDUCE_SCATTER
                                                  : STEP_ALL_REDUCE;
    else
      return TR_EINTERNAL; /* every shard not kept was undone above */
    cur[i] = dst[i];
    n++;
  }
  *nsteps = n;
  return 0;
}

/* ---- tensor helpers ---- */

/* v: a view of src with dims front[0..nf) first, the others after in
 * their order. Takes a reference. */
static void front_view(tr_tensor_t* v, const tr_tensor_t* src, const int* front,
                       int nf) {
  int perm[TR_MAX_DIMS], k = 0;
  for (int f = 0; f < nf; f++) perm[k++] = front[f];
  for (int d = 0; d < src->ndim; d++) {
    int in_front = 0;
    for (int f = 0; f < nf; f++) in_front |= front[f] == d;
    if (!in_front) perm[k++] = d;
  }
  tr_tensor_view(v, src);
  for (int j = 0; j < src->ndim; j++) {
    v->shape[j] = src->shape[perm[j]];
    v->stride[j] = src->stride[perm[j]];
  }
}

/* The same permutation applied to a shape. */
static void front_shape(int64_t* out, const int64_t* shape, int ndim,
                        const int* front, int nf) {
  int k = 0;
  for (int f = 0; f < nf; f++) out[k++] = shape[front[f]];
  for (int d = 0; d < ndim; d++) {
    int in_front = 0;
    for (int f = 0; f < nf; f++) in_front |= front[f] == d;
    if (!in_front) out[k++] = shape[d];
  }
}

/* dst[rows of dim 0 from ds] <- src[rows from ss], n rows; more narrows on
 * dim 1 when w1 >= 0 (both from column 0, w1 wide). */
static int copy_rows(tr_tensor_t* dst, int64_t ds, const tr_tensor_t* src,
                     int64_t ss, int64_t n, int64_t dst1, int64_t src1,
                     int64_t w1) {
  if (n == 0 || w1 == 0) return 0;
  tr_tensor_t a, b;
  TR_CHECK(tr_tensor_narrow(&a, dst, 0, ds, n));
  int rc = tr_tensor_narrow(&b, src, 0, ss, n);
  if (rc == 0 && w1 >= 0) {
    rc = tr_tensor_narrow(&a, &a, 1, dst1, w1);
    if (rc == 0) rc = tr_tensor_narrow(&b, &b, 1, src1, w1);
  }
  if (rc == 0) rc = tr_tensor_copy(&a, &b);
  tr_tensor_release(&a);
  tr_tensor_release(&b);
  return rc;
}

static int clone(tr_tensor_t* out, const tr_tensor_t* src) {
  memset(out, 0, sizeof *out);
  TR_CHECK(
      tr_tensor_empty(out, src->dtype, src->device, src->ndim, src->shape));
  int rc = tr_tensor_copy(out, src);
  if (rc < 0) tr_tensor_release(out);
  return rc;
}

/* Every dim before d has size 1: dim d's pieces are contiguous runs. */
static int leading(const tr_tensor_t* t, int d) {
  for (int j = 0; j < d; j++)
    if (t->shape[j] != 1) return 0;
  return 1;
}

/* ---- the work: running a plan ---- */

struct tr_dtensor_work_s {
  tr_dtensor_spec_t target;
  tr_dtensor_t* out;
  int in_place; /* out is the source */
  int coords[TR_MESH_MAX_DIMS];
  step_t steps[MAX_STEPS];
  int nsteps, next;
  tr_tensor_t cur; /* the local tensor so far */
  /* the collective in flight */
  int active;
  const step_t* st;
  tr_pg_work_t* pw;
  tr_tensor_t send, recv;
  int post; /* recv needs copying into the result */
  int64_t n_level, pad, m_level, pad2;
  int k, c, d, d2;
  int done, status;
};

/* Size of tensor dim d at mesh dim i's level: the global size cut by the
 * mesh dims before i that shard d (in the placements `before`). */
static int64_t level_size(const tr_dtensor_work_t* w, const step_t* st, int d) {
  int64_t n = w->target.shape[d];
  for (int j = 0; j < st->mesh_dim; j++)
    if (is_shard(st->before[j], d)) {
      int64_t s, len;
      tr_chunk_range(n, tr_mesh_dim(w->target.mesh, j)->size, w->coords[j], &s,
                     &len);
      n = len;
    }
  return n;
}

static void drop_collective(tr_dtensor_work_t* w) {
  tr_pg_work_free(w->pw);
  w->pw = NULL;
  tr_tensor_release(&w->send);
  tr_tensor_release(&w->recv);
  w->active = 0;
}

/* Replace the current local tensor by res (taken over). */
static void advance(tr_dtensor_work_t* w, tr_tensor_t* res) {
  tr_tensor_release(&w->cur);
  w->cur = *res;
  memset(res, 0, sizeof *res);
}

static int local_step(tr_dtensor_work_t* w, const step_t* st) {
  const tr_tensor_t* in = &w->cur;
  const tr_mesh_dim_t* md = tr_mesh_dim(w->target.mesh, st->mesh_dim);
  tr_tensor_t res;
  memset(&res, 0, sizeof res);
  int rc;
  if (st->kind == STEP_CHUNK) {
    int d = st->to.dim;
    if (in->shape[d] != level_size(w, st, d)) return TR_EINTERNAL;
    tr_tensor_t v;
    TR_CHECK(tr_tensor_chunk(&v, in, d, md->size, md->coord));
    rc = clone(&res, &v);
    tr_tensor_release(&v);
  } else if (st->to.op == TR_PG_SUM && md->coord != 0) {
    rc = tr_tensor_zeros(&res, in->dtype, in->device, in->ndim, in->shape);
  } else {
    rc = clone(&res, in);
  }
  if (rc == 0) advance(w, &res);
  return rc;
}

/* Prepare and issue the collective of step st (async). When every piece
 * is empty, the result is made here and nothing is issued (w->active 0). */
static int start_collective(tr_dtensor_work_t* w, const step_t* st) {
  const tr_tensor_t* in = &w->cur;
  const tr_mesh_dim_t* md = tr_mesh_dim(w->target.mesh, st->mesh_dim);
  int k = md->size, c = md->coord, ndim = in->ndim;
  tr_dtype_t dt = in->dtype;
  tr_device_t dev = in->device;
  int64_t shape[TR_MAX_DIMS], fs[TR_MAX_DIMS];
  tr_tensor_t res;
  int rc = 0;
  memset(&res, 0, sizeof res);
  memcpy(shape, in->shape, sizeof shape);
  w->st = st;
  w->k = k;
  w->c = c;
  w->post = 0;
  if (st->kind == STEP_ALL_REDUCE) {
    TR_CHECK(clone(&w->recv, in));
    w->active = 1;
    rc = tr_pg_all_reduce(md->pg, &w->recv, st->from.op, &w->pw);
    if (rc < 0) drop_collective(w);
    return rc;
  }
  int d = st->kind == STEP_REDUCE_SCATTER ? st->to.dim : st->from.dim;
  int64_t n = level_size(w, st, d), pad = (n + k - 1) / k, s0, len;
  tr_chunk_range(n, k, c, &s0, &len);
  w->d = d;
  w->n_level = n;
  w->pad = pad;
  /* the local size on d before and after the step */
  int64_t have = st->kind == STEP_REDUCE_SCATTER ? n : len;
  if (in->shape[d] != have) return TR_EINTERNAL;
  int front[2] = {d, 0};
  int64_t rest = 1;
  if (st->kind == STEP_ALL_TO_ALL) {
    int d2 = st->to.dim;
    front[1] = d2;
    w->d2 = d2;
    w->m_level = in->shape[d2];
    w->pad2 = (w->m_level + k - 1) / k;
    for (int j = 0; j < ndim; j++)
      if (j != d && j != d2) rest *= in->shape[j];
    int64_t s2, l2;
    tr_chunk_range(w->m_level, k, c, &s2, &l2);
    if (pad * w->pad2 * rest == 0) { /* every piece is empty */
      shape[d] = n;
      shape[d2] = l2;
      TR_CHECK(tr_tensor_empty(&res, dt, dev, ndim, shape));
      advance(w, &res);
      return 0;
    }
  } else {
    for (int j = 0; j < ndim; j++)
      if (j != d) rest *= in->shape[j];
    if (pad * rest == 0) {
      shape[d] = st->kind == STEP_GATHER ? n : len;
      TR_CHECK(tr_tensor_empty(&res, dt, dev, ndim, shape));
      advance(w, &res);
      return 0;
    }
  }
  int even = n == pad * k && leading(in, d) && tr_tensor_is_contiguous(in);
  tr_pg_t* pg = md->pg;
  tr_tensor_t iv;
  memset(&iv, 0, sizeof iv);
  if (st->kind == STEP_GATHER) {
    shape[d] = n;
    if (even) { /* the pieces land where they belong */
      tr_tensor_view(&w->send, in);
      TR_CHECK_GOTO(tr_tensor_empty(&w->recv, dt, dev, ndim, shape), rc, fail);
    } else {
      shape[d] = pad;
      front_shape(fs, shape, ndim, front, 1);
      TR_CHECK_GOTO(tr_tensor_empty(&w->send, dt, dev, ndim, fs), rc, fail);
      if (len < pad) TR_CHECK_GOTO(tr_tensor_fill(&w->send, 0), rc, fail);
      front_view(&iv, in, front, 1);
      TR_CHECK_GOTO(copy_rows(&w->send, 0, &iv, 0, len, 0, 0, -1), rc, fail);
      fs[0] = pad * k;
      TR_CHECK_GOTO(tr_tensor_empty(&w->recv, dt, dev, ndim, fs), rc, fail);
      w->post = 1;
    }
    w->active = 1;
    TR_CHECK_GOTO(tr_pg_all_gather(pg, &w->recv, &w->send, &w->pw), rc, fail);
  } else if (st->kind == STEP_REDUCE_SCATTER) {
    if (even) {
      tr_tensor_view(&w->send, in);
      shape[d] = pad;
      TR_CHECK_GOTO(tr_tensor_empty(&w->recv, dt, dev, ndim, shape), rc, fail);
    } else {
      shape[d] = pad * k;
      front_shape(fs, shape, ndim, front, 1);
      TR_CHECK_GOTO(tr_tensor_empty(&w->send, dt, dev, ndim, fs), rc, fail);
      if (n < pad * k) TR_CHECK_GOTO(tr_tensor_fill(&w->send, 0), rc, fail);
      front_view(&iv, in, front, 1);
      for (int q = 0; q < k; q++) {
        int64_t s, l;
        tr_chunk_range(n, k, q, &s, &l);
        TR_CHECK_GOTO(copy_rows(&w->send, q * pad, &iv, s, l, 0, 0, -1), rc,
                      fail);
      }
      fs[0] = pad;
      TR_CHECK_GOTO(tr_tensor_empty(&w->recv, dt, dev, ndim, fs), rc, fail);
      w->post = 1;
    }
    w->active = 1;
    TR_CHECK_GOTO(
        tr_pg_reduce_scatter(pg, &w->recv, &w->send, st->from.op, &w->pw), rc,
        fail);
  } else { /* STEP_ALL_TO_ALL: pieces [pad rows of d, pad2 of d2, rest] */
    int d2 = w->d2;
    int64_t m = w->m_level, pad2 = w->pad2;
    shape[d] = pad * k;
    shape[d2] = pad2;
    front_shape(fs, shape, ndim, front, 2);
    TR_CHECK_GOTO(tr_tensor_empty(&w->send, dt, dev, ndim, fs), rc, fail);
    if (len < pad || m < pad2 * k)
      TR_CHECK_GOTO(tr_tensor_fill(&w->send, 0), rc, fail);
    front_view(&iv, in, front, 2);
    for (int q = 0; q < k; q++) {
      int64_t s2, l2;
      tr_chunk_range(m, k, q, &s2, &l2);
      TR_CHECK_GOTO(copy_rows(&w->send, q * pad, &iv, 0, len, 0, s2, l2), rc,
                    fail);
    }
    TR_CHECK_GOTO(tr_tensor_empty(&w->recv, dt, dev, ndim, fs), rc, fail);
    w->post = 1;
    w->active = 1;
    TR_CHECK_GOTO(tr_pg_all_to_all(pg, &w->recv, &w->send, NULL, NULL, &w->pw),
                  rc, fail);
  }
  tr_tensor_release(&iv);
  return 0;
fail:
  tr_tensor_release(&iv);
  drop_collective(w);
  return rc;
}

/* Wait for the collective in flight and make the step's result. */
static int finish_collective(tr_dtensor_work_t* w) {
  const step_t* st = w->st;
  int rc = tr_pg_work_wait(w->pw, 0);
  tr_tensor_t res;
  memset(&res, 0, sizeof res);
  if (rc < 0) {
    const char* e = tr_pg_work_error(w->pw);
    TR_LOG_ERROR(DT, "redistribute on mesh dim %d ('%s'): %s", st->mesh_dim,
                 tr_mesh_dim(w->target.mesh, st->mesh_dim)->name,
                 e ? e : tr_strerror(rc));
    drop_collective(w);
    return rc;
  }
  if (!w->post) {
    res = w->recv;
    memset(&w->recv, 0, sizeof w->recv);
    drop_collective(w);
    advance(w, &res);
    return 0;
  }
  const tr_tensor_t* in = &w->cur;
  int ndim = in->ndim, d = w->d, k = w->k, c = w->c;
  int64_t shape[TR_MAX_DIMS], s0, len;
  int front[2] = {d, st->kind == STEP_ALL_TO_ALL ? w->d2 : 0};
  int nf = st->kind == STEP_ALL_TO_ALL ? 2 : 1;
  memcpy(shape, in->shape, sizeof shape);
  tr_chunk_range(w->n_level, k, c, &s0, &len);
  tr_tensor_t rv;
  memset(&rv, 0, sizeof rv);
  if (st->kind == STEP_GATHER) {
    shape[d] = w->n_level;
  } else if (st->kind == STEP_REDUCE_SCATTER) {
    shape[d] = len;
  } else {
    int64_t s2, l2;
    tr_chunk_range(w->m_level, k, c, &s2, &l2);
    shape[d] = w->n_level;
    shape[w->d2] = l2;
  }
  TR_CHECK_GOTO(tr_tensor_empty(&res, in->dtype, in->device, ndim, shape), rc,
                out);
  front_view(&rv, &res, front, nf);
  if (st->kind == STEP_GATHER) {
    /* the first n rows of the padded pieces are the data, in order */
    TR_CHECK_GOTO(copy_rows(&rv, 0, &w->recv, 0, w->n_level, 0, 0, -1), rc,
                  out);
  } else if (st->kind == STEP_REDUCE_SCATTER) {
    TR_CHECK_GOTO(copy_rows(&rv, 0, &w->recv, 0, len, 0, 0, -1), rc, out);
  } else {
    for (int q = 0; q < k; q++) {
      int64_t s, l;
      tr_chunk_range(w->n_level, k, q, &s, &l);
      TR_CHECK_GOTO(
          copy_rows(&rv, s, &w->recv, q * w->pad, l, 0, 0, shape[w->d2]), rc,
          out);
    }
  }
out:
  tr_tensor_release(&rv);
  drop_collective(w);
  if (rc < 0) {
    tr_tensor_release(&res);
    return rc;
  }
  advance(w, &res);
  return 0;
}

/* Run the plan on from step w->next. With stop_after_issue, return once a
 * collective is in flight. */
static int run(tr_dtensor_work_t* w, int stop_after_issue) {
  if (w->active) TR_CHECK(finish_collective(w));
  while (w->next < w->nsteps) {
    const step_t* st = &w->steps[w->next++];
    if (st->kind == STEP_CHUNK || st->kind == STEP_PARTIAL) {
      TR_CHECK(local_step(w, st));
      continue;
    }
    TR_CHECK(start_collective(w, st));
    if (!w->active) continue;
    if (stop_after_issue) return 0;
    TR_CHECK(finish_collective(w));
  }
  return 0;
}

/* Hand the result to out, or drop it on error. */
static void complete(tr_dtensor_work_t* w, int rc) {
  w->done = 1;
  w->status = rc;
  if (rc < 0) {
    if (w->active) {
      tr_pg_work_wait(w->pw, 0);
      drop_collective(w);
    }
    tr_tensor_release(&w->cur);
    return;
  }
  if (w->in_place) tr_tensor_release(&w->out->local);
  w->out->spec = w->target;
  w->out->local = w->cur;
  memset(&w->cur, 0, sizeof w->cur);
}

int tr_dtensor_redistribute(const tr_dtensor_t* src,
                            const tr_placement_t* placements, tr_dtensor_t* out,
                            tr_dtensor_work_t** work) {
  if (work) *work = NULL;
  const tr_dtensor_spec_t* ss = &src->spec;
  tr_dtensor_work_t* w = calloc(1, sizeof *w);
  if (!w) return TR_ENOMEM;
  int rc = tr_dtensor_spec_init(&w->target, ss->mesh, placements, ss->ndim,
                                ss->shape);
  int64_t ls[TR_MAX_DIMS], off[TR_MAX_DIMS];
  if (rc == 0) rc = tr_dtensor_local_layout(ss, NULL, ls, off);
  for (int d = 0; rc == 0 && d < ss->ndim; d++)
    if (src->local.ndim != ss->ndim || src->local.shape[d] != ls[d]) {
      char got[96];
      TR_LOG_ERROR(DT,
                   "redistribute: local tensor %s is not this rank's piece "
                   "(%lld on dim %d)",
                   tr_tensor_shape_str(&src->local, got, sizeof got),
                   (long long)ls[d], d);
      rc = TR_ESHAPE;
    }
  if (rc == 0)
    rc = plan(ss->placements, w->target.placements, ss->mesh_ndim, ss->ndim,
              w->steps, &w->nsteps);
  if (rc < 0) {
    free(w);
    return rc;
  }
  tr_mesh_coords(ss->mesh, w->coords);
  w->out = out;
  w->in_place = out == src;
  tr_tensor_view(&w->cur, &src->local);
  rc = run(w, work != NULL);
  if (!work || rc < 0) {
    complete(w, rc);
    free(w);
    return rc;
  }
  /* nothing in flight (local steps only): a handle that is done */
  if (!w->active) complete(w, 0);
  *work = w;
  return 0;
}

int tr_dtensor_work_wait(tr_dtensor_work_t* w) {
  if (w->done) return w->status;
  complete(w, run(w, 0));
  return w->status;
}

void tr_dtensor_work_free(tr_dtensor_work_t* w) {
  if (!w) return;
  if (!w->done) {
    int rc = tr_dtensor_work_wait(w);
    if (rc < 0)
      TR_LOG_WARN(DT, "redistribute freed before its wait failed: %s",
                  tr_strerror(rc));
  }
  free(w);
}

/* ---- whole tensors: distribute and full_tensor, both redistributes ---- */

int tr_dtensor_distribute(tr_dtensor_t* dt, const tr_tensor_t* full,
                          tr_mesh_t* mesh, const tr_placement_t* placements) {
  tr_placement_t rep[TR_MESH_MAX_DIMS];
  for (int i = 0; i < tr_mesh_ndim(mesh); i++)
    rep[i] = tr_placement_replicate();
  tr_dtensor_t whole;
  TR_CHECK(tr_dtensor_from_local(&whole, full, mesh, rep, full->shape));
  /* Replicate -> Shard / Partial are local steps: no communication */
  int rc = tr_dtensor_redistribute(&whole, placements, dt, NULL);
  if (rc == 0 && dt->local.storage == full->storage) {
    /* every mesh dim Replicate: the result is a view; copy it */
    tr_tensor_t c;
    memset(&c, 0, sizeof c);
    rc =
        tr_tensor_empty(&c, full->dtype, full->device, full->ndim, full->shape);
    if (rc == 0) rc = tr_tensor_copy(&c, full);
    tr_tensor_release(&dt->local);
    if (rc == 0)
      dt->local = c;
    else
      tr_tensor_release(&c);
  }
  tr_dtensor_release(&whole);
  return rc;
}

int tr_dtensor_full_tensor(const tr_dtensor_t* dt, tr_tensor_t* out) {
  tr_placement_t rep[TR_MESH_MAX_DIMS];
  for (int i = 0; i < dt->spec.mesh_ndim; i++)
    rep[i] = tr_placement_replicate();
  tr_dtensor_t r;
  memset(&r, 0, sizeof r);
  TR_CHECK(tr_dtensor_redistribute(dt, rep, &r, NULL));
  *out = r.local;
  return 0;
}
