/* tests/check_tp_async.c: async tensor parallel's chunked rings
 * (dtensor/tp.c, tr_model_tp_t.overlap in trainrun/model.h) on 2 and 4
 * forked Gloo ranks, against the blocking collectives of the same hook:
 *   - the all-gather ring with a linear layer on each chunk (a batch of 3
 *     sequences, so each rank's rows are 3 strided runs of the gathered
 *     tensor) gives the blocking all-gather's tensor byte for byte and the
 *     linear's output on the gathered tensor byte for byte, every chunk
 *     computed once as one contiguous [B, T/tp, W] part and one linear
 *     call on the batch-strided view of its rows of every sequence;
 *   - the reduce-scatter ring with each rank's partial linear outputs
 *     computed chunk by chunk (one call a chunk, its input a batch-strided
 *     view) gives the blocking reduce-scatter of the
 *     whole partial output: byte for byte on 2 ranks (a sum of two is the
 *     same either way), within 1e-6 relative on 4 (summed in ring order);
 *   - both again through a timed tr_tp_comm_t (the waits of
 *     collectives/waits.c): the same bytes, and the ring's steps counted
 *     as the tp communication (k - 1 per op).
 * The GEMMs use the blocked CPU kernel, whose bits do not depend on how
 * many rows a call has (OpenBLAS's may, by an ulp). */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/pg_suite.h"
#include "trainrun/dtensor.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/model.h"
#include "trainrun/pg_waits.h"

enum { B = 3, TL = 4, IC = 24, OC = 20 };

/* t [d0, d1, d2] filled with values that depend on seed and the index */
static void fill(tr_tensor_t* t, int64_t d0, int64_t d1, int64_t d2, int seed) {
  int64_t shape[3] = {d0, d1, d2};
  PCHECK_RC(tr_tensor_empty(t, TR_F32, TR_DEVICE_CPU, 3, shape));
  float* p = tr_tensor_data(t);
  for (int64_t i = 0; i < d0 * d1 * d2; i++)
    p[i] = (float)sin(0.37 * (double)i + 1.3 * seed) * 0.5f;
}

static void weight(tr_tensor_t* w, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  PCHECK_RC(tr_tensor_empty(w, TR_F32, TR_DEVICE_CPU, 2, shape));
  float* p = tr_tensor_data(w);
  for (int64_t i = 0; i < rows * cols; i++)
    p[i] = (float)cos(0.11 * (double)i) * 0.3f;
}

/* What the chunk callbacks see and do. */
typedef struct {
  const tr_tensor_t* w;
  tr_tensor_t* out;       /* gather: the linear's output [B, T, OC] */
  const tr_tensor_t* inp; /* scatter: the partial's input [B, T, IC] */
  int seen[4];            /* calls per chunk */
  int64_t tl;
} chunk_ctx_t;

/* part must be a contiguous [B, n, *] */
static void whole_chunk(const tr_tensor_t* part, int64_t n) {
  PCHECK(part->ndim == 3 && part->shape[0] == B && part->shape[1] == n &&
         tr_tensor_is_contiguous(part));
}

/* gather side: part is the gathered input rows; out's rows = part w^T,
 * written through the batch-strided view of those rows */
static int gather_chunk(void* arg, int64_t t0, int64_t n, tr_tensor_t* part) {
  chunk_ctx_t* c = arg;
  tr_tensor_t o = {0};
  PCHECK(n == c->tl && t0 % n == 0);
  whole_chunk(part, n);
  c->seen[t0 / n]++;
  int rc = tr_tensor_narrow(&o, c->out, 1, t0, n);
  if (rc == 0) rc = tr_kern_linear_fwd(&o, part, c->w, NULL);
  tr_tensor_release(&o);
  return rc;
}

/* scatter side: part = inp's rows w^T */
static int scatter_chunk(void* arg, int64_t t0, int64_t n, tr_tensor_t* part) {
  chunk_ctx_t* c = arg;
  tr_tensor_t x = {0};
  PCHECK(n == c->tl && t0 % n == 0);
  whole_chunk(part, n);
  c->seen[t0 / n]++;
  int rc = tr_tensor_narrow(&x, c->inp, 1, t0, n);
  if (rc == 0) rc = tr_kern_linear_fwd(part, &x, c->w, NULL);
  tr_tensor_release(&x);
  return rc;
}

static void seen_once(const chunk_ctx_t* c, int k) {
  for (int j = 0; j < k; j++) PCHECK(c->seen[j] == 1);
}

/* max |a - b| / max(|b|, 1e-3) over the elements; -1 when shapes differ */
static double rel_diff(const tr_tensor_t* a, const tr_tensor_t* b) {
  int64_t n = tr_tensor_numel(b);
  if (tr_tensor_numel(a) != n) return -1;
  const float* x = tr_tensor_data(a);
  const float* y = tr_tensor_data(b);
  double d = 0;
  for (int64_t i = 0; i < n; i++) {
    double s = fabs((double)y[i]) > 1e-3 ? fabs((double)y[i]) : 1e-3;
    double e = fabs((double)x[i] - y[i]) / s;
    if (e > d) d = e;
  }
  return d;
}

static int same_bytes(const tr_tensor_t* a, const tr_tensor_t* b) {
  return tr_tensor_numel(a) == tr_tensor_numel(b) &&
         memcmp(tr_tensor_data(a), tr_tensor_data(b),
                sizeof(float) * (size_t)tr_tensor_numel(b)) == 0;
}

/* One round of both rings against the blocking ops, through m's hook. */
static void round_trip(tr_model_t* m, tr_pg_t* tp, int rank, int k) {
  int64_t T = (int64_t)TL * k;
  tr_tensor_t w = {0}, wr = {0};
  weight(&w, OC, IC);
  weight(&wr, OC, IC);
  /* gather: each rank's sequence rows differ */
  tr_tensor_t x = {0}, xb = {0}, out = {0}, ref = {0};
  fill(&x, B, TL, IC, 1 + rank);
  fill(&xb, B, TL, IC, 1 + rank);
  int64_t oshape[3] = {B, T, OC};
  PCHECK_RC(tr_tensor_empty(&out, TR_F32, TR_DEVICE_CPU, 3, oshape));
  PCHECK_RC(tr_tensor_empty(&ref, TR_F32, TR_DEVICE_CPU, 3, oshape));
  chunk_ctx_t c = {.w = &w, .out = &out, .tl = TL};
  PCHECK_RC(m->tp.overlap(m->tp.arg, TR_TP_FWD_IN, TR_TP_GATHER, &x,
                          gather_chunk, &c));
  seen_once(&c, k);
  PCHECK_RC(tr_tp_collective(tp, TR_TP_FWD_IN, TR_TP_GATHER, &xb));
  PCHECK(x.shape[1] == T && same_bytes(&x, &xb));
  PCHECK_RC(tr_kern_linear_fwd(&ref, &xb, &w, NULL));
  PCHECK(same_bytes(&out, &ref));
  /* scatter: each rank's partial products of the whole sequence */
  tr_tensor_t inp = {0}, part = {0}, mine = {0};
  fill(&inp, B, T, IC, 7 + 3 * rank);
  int64_t pshape[3] = {B, T, OC}, mshape[3] = {B, TL, OC};
  PCHECK_RC(tr_tensor_empty(&part, TR_F32, TR_DEVICE_CPU, 3, pshape));
  PCHECK_RC(tr_tensor_empty(&mine, TR_F32, TR_DEVICE_CPU, 3, mshape));
  chunk_ctx_t s = {.w = &wr, .inp = &inp, .tl = TL};
  PCHECK_RC(m->tp.overlap(m->tp.arg, TR_TP_FWD_OUT, TR_TP_SCATTER, &mine,
                          scatter_chunk, &s));
  seen_once(&s, k);
  PCHECK_RC(tr_kern_linear_fwd(&part, &inp, &wr, NULL));
  PCHECK_RC(tr_tp_collective(tp, TR_TP_FWD_OUT, TR_TP_SCATTER, &part));
  PCHECK(part.shape[1] == TL);
  if (k == 2) {
    PCHECK(same_bytes(&mine, &part));
  } else {
    double d = rel_diff(&mine, &part);
    if (rank == 0)
      fprintf(stderr, "tp %d: ring reduce-scatter within %.2g relative\n", k,
              d);
    PCHECK(d >= 0 && d < 1e-6);
  }
  tr_tensor_t* ts[] = {&w, &wr, &x, &xb, &out, &ref, &inp, &part, &mine};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}

static void body_rings(tr_pg_t* world, pg_ctx_t* ctx) {
  int k = ctx->size;
  PCHECK_RC(tr_kern_cpu_set_gemm(TR_GEMM_BLOCKED));
  tr_model_t m;
  memset(&m, 0, sizeof m); /* only its tp seam is used */
  tr_tp_opts_t o;
  tr_tp_opts_init(&o);
  PCHECK(o.async == 0);
  tr_tp_install(&m, world, &o);
  PCHECK(m.tp.overlap == NULL); /* off by default */
  o.async = 1;
  o.sequence_parallel = 0;
  tr_tp_install(&m, world, &o);
  PCHECK(m.tp.overlap == NULL); /* sequence parallel only */
  o.sequence_parallel = 1;
  tr_tp_install(&m, world, &o);
  PCHECK(m.tp.overlap != NULL && m.tp.fn == tr_tp_collective);
  round_trip(&m, world, ctx->rank, k);
  /* through a timed comm: the same results, the ring's steps counted */
  tr_tp_comm_t* c;
  PCHECK_RC(tr_tp_comm_new(world, 1, &c));
  o.comm = c;
  tr_tp_install(&m, world, &o);
  PCHECK(m.tp.arg == (void*)c);
  round_trip(&m, world, ctx->rank, k);
  PCHECK_RC(tr_tp_comm_step_end(c));
  tr_pg_comm_t tc;
  tr_tp_comm_take(c, &tc);
  PCHECK(tc.steps == 1 && tc.ops == 2 * (k - 1) && tc.comm_ms > 0 &&
         tc.exposed_ms >= 0 && tc.hidden >= 0 && tc.hidden <= 1);
  tr_tp_comm_free(c);
  /* untimed waits: nothing counted */
  PCHECK_RC(tr_tp_comm_new(world, 0, &c));
  o.comm = c;
  tr_tp_install(&m, world, &o);
  round_trip(&m, world, ctx->rank, k);
  PCHECK_RC(tr_tp_comm_step_end(c));
  tr_tp_comm_take(c, &tc);
  PCHECK(tc.ops == 0 && tc.comm_ms == 0);
  tr_tp_comm_free(c);
}

START_TEST(test_rings) {
  int n = 2 * _i, st[4];
  ck_assert_int_eq(
      pg_spawn(n, "gloo", TR_DEV_CPU, 1, 30000, body_rings, 120, st), 0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}
END_TEST

static Suite* tp_async_suite(void) {
  Suite* s = suite_create("tp_async");
  TCase* tc = tcase_create("ranks");
  tcase_set_timeout(tc, 150);
  tcase_add_loop_test(tc, test_rings, 1, 3); /* 2, 4 ranks */
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(tp_async_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
