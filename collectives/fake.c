/* collectives/fake.c: the fake backend for dry runs. One process plays one
 * rank of an N-rank world: pg.c has already checked every op's shapes,
 * dtypes and peers against N and counted it, so an op here completes at
 * once and no data leaves the process. Outputs are what they would be if
 * every peer held what this rank holds and added nothing to reductions:
 * an all-gather repeats this rank's input N times, a reduce-scatter keeps
 * this rank's chunk of its input; all-reduce, broadcast, reduce, recv and
 * all-to-all leave their outputs as they were. So values stay finite and a
 * training step runs its real shapes and memory (`comm.mode =
 * "fake_backend"`); `trainrun plan` and config checks drive whole parallel
 * layouts through it. */
#include "config.h"

#include <stdio.h>

#include "collectives/internal.h"
#include "trainrun/error.h"

static int fake_create(tr__pg_backend_t* be, char* err, size_t errlen) {
  (void)be;
  (void)err;
  (void)errlen;
  return 0;
}

/* dst = src's elements [start, start + n) as a flat view, or the reverse. */
static int copy_flat(tr_tensor_t* dst, int64_t dst_start,
                     const tr_tensor_t* src, int64_t src_start, int64_t n) {
  int64_t flat[1] = {-1};
  tr_tensor_t d = {0}, s = {0};
  int rc = tr_tensor_reshape(&d, dst, 1, flat);
  if (rc == 0) rc = tr_tensor_reshape(&s, src, 1, flat);
  if (rc == 0) rc = tr_tensor_narrow(&d, &d, 0, dst_start, n);
  if (rc == 0) rc = tr_tensor_narrow(&s, &s, 0, src_start, n);
  if (rc == 0) rc = tr_tensor_copy(&d, &s);
  tr_tensor_release(&d);
  tr_tensor_release(&s);
  return rc;
}

static int fake_op(const tr_pg_t* pg, tr__pg_op_t* op) {
  switch (op->type) {
    case TR_PG_OP_ALL_GATHER: {
      int64_t n = tr_tensor_numel(&op->in);
      for (int r = 0; r < pg->size; r++)
        TR_CHECK(copy_flat(&op->out, r * n, &op->in, 0, n));
      return 0;
    }
    case TR_PG_OP_REDUCE_SCATTER: {
      int64_t n = tr_tensor_numel(&op->out);
      return copy_flat(&op->out, 0, &op->in, pg->rank * n, n);
    }
    default:
      return 0;
  }
}

static int fake_start(tr__pg_backend_t* be, tr_pg_work_t* w, char* err,
                      size_t errlen) {
  (void)be;
  for (int i = 0; i < w->n_ops; i++) {
    int rc = fake_op(w->pg, &w->ops[i]);
    if (rc < 0) {
      snprintf(err, errlen, "fake %s: %s", tr_pg_op_name(w->ops[i].type),
               tr_strerror(rc));
      return rc;
    }
  }
  return 0;
}

static void fake_destroy(tr__pg_backend_t* be) { (void)be; }

const tr__pg_backend_vt_t tr__pg_fake_vt = {
    .kind = TR_PG_BACKEND_FAKE,
    .name = "fake",
    .threaded = 0,
    .create = fake_create,
    .start = fake_start,
    .destroy = fake_destroy,
};
