/* tests/check_pg.c: process groups -- backend specs, the fake backend's
 * shape checks, sub-groups, coalescing and hooks in one process; then Gloo
 * on 2, 3 and 4 forked ranks over loopback: every op x dtype x reduce op
 * with uneven sizes, sub-groups and splits, async overlap and work handles,
 * a timeout that fires and is reported, a rank that dies mid-collective,
 * the flight-recorder hooks and op timing. */
#include "config.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "tests/pg_suite.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/pg.h"

/* ---- one process ---- */

static tr_pg_t* fake_world(int rank, int size) {
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  o.rank = rank;
  o.world_size = size;
  o.backend = "fake";
  tr_pg_t* pg = NULL;
  ck_assert_int_eq(tr_pg_new(&o, &pg), 0);
  return pg;
}

static tr_tensor_t vec(tr_dtype_t dt, int64_t n, double fill) {
  tr_tensor_t t;
  int64_t shape[1] = {n};
  ck_assert_int_eq(tr_tensor_empty(&t, dt, TR_DEVICE_CPU, 1, shape), 0);
  ck_assert_int_eq(tr_tensor_fill(&t, fill), 0);
  return t;
}

START_TEST(test_names) {
  ck_assert_str_eq(tr_pg_op_name(TR_PG_OP_ALL_REDUCE), "all_reduce");
  ck_assert_str_eq(tr_pg_op_name(TR_PG_OP_ALL_GATHER), "_all_gather_base");
  ck_assert_str_eq(tr_pg_op_name(TR_PG_OP_REDUCE_SCATTER),
                   "_reduce_scatter_base");
  ck_assert_str_eq(tr_pg_op_name(TR_PG_OP_COALESCED), "coalesced");
  ck_assert_str_eq(tr_pg_reduce_op_name(TR_PG_PRODUCT), "product");
  ck_assert_str_eq(tr_pg_reduce_op_name(TR_PG_AVG), "avg");
  ck_assert_str_eq(tr_pg_backend_name(TR_PG_BACKEND_NCCL), "nccl");
  ck_assert_int_eq(tr_pg_backend_available(TR_PG_BACKEND_FAKE), 1);
#ifdef HAVE_GLOO
  ck_assert_int_eq(tr_pg_backend_available(TR_PG_BACKEND_GLOO), 1);
#else
  ck_assert_int_eq(tr_pg_backend_available(TR_PG_BACKEND_GLOO), 0);
#endif
}
END_TEST

START_TEST(test_backend_specs) {
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  ck_assert_str_eq(o.backend, "cpu:gloo,cuda:nccl");
  ck_assert_int_eq(o.timeout_ms, 300000);
  o.rank = 0;
  o.world_size = 2;
  tr_pg_t* pg = (tr_pg_t*)1;
  const char* bad[] = {
      "bogus", "cuda:gloo", "cpu:nccl", "cpu:", "cpu:gloo,", "gpu:nccl", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.backend = bad[i];
    ck_assert_msg(tr_pg_new(&o, &pg) == TR_EINVAL, "%s", bad[i]);
    ck_assert_ptr_null(pg);
  }
  /* gloo and nccl rendezvous through a store */
  o.backend = "cpu:gloo,cuda:nccl";
  ck_assert_int_eq(tr_pg_new(&o, &pg), TR_EINVAL);
  o.backend = "fake";
  o.rank = 2;
  ck_assert_int_eq(tr_pg_new(&o, &pg), TR_EINVAL);
  o.rank = 1;
  ck_assert_int_eq(tr_pg_new(&o, &pg), 0);
  ck_assert_int_eq(tr_pg_backend(pg, TR_DEV_CPU), TR_PG_BACKEND_FAKE);
  ck_assert_int_eq(tr_pg_backend(pg, TR_DEV_CUDA), TR_PG_BACKEND_FAKE);
  ck_assert_str_eq(tr_pg_name(pg), "0");
  ck_assert_str_eq(tr_pg_desc(pg), "default_pg");
  ck_assert_int_eq(tr_pg_rank(pg), 1);
  ck_assert_int_eq(tr_pg_size(pg), 2);
  tr_pg_free(pg);
}
END_TEST

/* The one parser of the backend grammar, with the messages the launcher
 * puts after file:line:col. */
START_TEST(test_backend_parse) {
  tr_pg_backend_spec_t bs;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_pg_backend_parse("cpu:mpi,cuda:nccl", &bs, &err), 0);
  ck_assert_int_eq(bs.cpu, TR_PG_BACKEND_MPI);
  ck_assert_int_eq(bs.cuda, TR_PG_BACKEND_NCCL);
  ck_assert_int_eq(tr_pg_backend_parse("gloo", &bs, &err), 0);
  ck_assert_int_eq(bs.cpu, TR_PG_BACKEND_GLOO);
  ck_assert_int_eq(bs.cuda, TR_PG_BACKEND_NONE);
  static const struct {
    const char *spec, *msg;
  } bad[] = {
      {"cpu:nccl", "nccl cannot serve cpu tensors"},
      {"cpu:gloo,tpu:x",
       "'tpu:x' is not device:backend with device cpu or cuda and backend "
       "gloo, nccl, mpi or fake"},
      {"ucc",
       "expected gloo, nccl, mpi, fake or a list of device:backend pairs "
       "like 'cpu:gloo,cuda:nccl', got 'ucc'"},
      {"cpu:gloo,cpu:mpi", "'cpu:gloo,cpu:mpi' names cpu twice"},
      {"cpu:gloo,",
       "'' is not device:backend with device cpu or cuda and backend gloo, "
       "nccl, mpi or fake"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(tr_pg_backend_parse(bad[i].spec, &bs, &err), TR_EINVAL);
    ck_assert_str_eq(err.message, bad[i].msg);
  }
}
END_TEST

START_TEST(test_fake_shapes) {
  tr_pg_t* pg = fake_world(3, 8);
  tr_tensor_t in = vec(TR_F32, 5, 1), out = vec(TR_F32, 40, 7);
  tr_tensor_t small = vec(TR_F32, 39, 0), other = vec(TR_BF16, 40, 0);
  /* all_gather: size x input, same dtype; no data moves: every peer is
   * taken to hold this rank's input */
  ck_assert_int_eq(tr_tensor_fill(&out, 7), 0);
  for (int64_t i = 0; i < 5; i++)
    ((float*)tr_tensor_data(&in))[i] = (float)(i + 1);
  ck_assert_int_eq(tr_pg_all_gather(pg, &out, &in, NULL), 0);
  for (int64_t i = 0; i < 40; i++)
    ck_assert_double_eq(tr_tensor_get(&out, i), (double)(i % 5 + 1));
  ck_assert_int_eq(tr_pg_all_gather(pg, &small, &in, NULL), TR_ESHAPE);
  ck_assert_int_eq(tr_pg_all_gather(pg, &other, &in, NULL), TR_EDTYPE);
  /* reduce_scatter: input is size x output; this rank (3) keeps its own
   * chunk, the peers add nothing */
  for (int64_t i = 0; i < 40; i++) ((float*)tr_tensor_data(&out))[i] = (float)i;
  ck_assert_int_eq(tr_pg_reduce_scatter(pg, &in, &out, TR_PG_SUM, NULL), 0);
  for (int64_t i = 0; i < 5; i++)
    ck_assert_double_eq(tr_tensor_get(&in, i), (double)(15 + i));
  ck_assert_int_eq(tr_pg_reduce_scatter(pg, &in, &small, TR_PG_SUM, NULL),
                   TR_ESHAPE);
  ck_assert_int_eq(tr_pg_reduce_scatter(pg, &in, &out, 17, NULL), TR_EINVAL);
  ck_assert_int_eq(tr_pg_all_reduce(pg, &in, (tr_pg_reduce_op_t)-1, NULL),
                   TR_EINVAL);
  /* roots and peers are group ranks */
  ck_assert_int_eq(tr_pg_broadcast(pg, &in, 8, NULL), TR_EINVAL);
  ck_assert_int_eq(tr_pg_broadcast(pg, &in, 7, NULL), 0);
  ck_assert_int_eq(tr_pg_reduce(pg, &in, -1, TR_PG_MAX, NULL), TR_EINVAL);
  ck_assert_int_eq(tr_pg_send(pg, &in, 3, 0, NULL), TR_EINVAL); /* self */
  ck_assert_int_eq(tr_pg_send(pg, &in, 2, -1, NULL), TR_EINVAL);
  ck_assert_int_eq(tr_pg_recv(pg, &in, 0, 0, NULL), 0);
  /* all_to_all: equal pieces, or splits covering dim 0 */
  int64_t sh[2] = {6, 2};
  tr_tensor_t a, b;
  ck_assert_int_eq(tr_tensor_zeros(&a, TR_I32, TR_DEVICE_CPU, 2, sh), 0);
  ck_assert_int_eq(tr_tensor_zeros(&b, TR_I32, TR_DEVICE_CPU, 2, sh), 0);
  ck_assert_int_eq(tr_pg_all_to_all(pg, &b, &a, NULL, NULL, NULL), TR_ESHAPE);
  int64_t ok[8] = {1, 0, 2, 0, 0, 3, 0, 0}, bad[8] = {1, 0, 2, 0, 0, 2, 0, 0};
  ck_assert_int_eq(tr_pg_all_to_all(pg, &b, &a, ok, ok, NULL), 0);
  ck_assert_int_eq(tr_pg_all_to_all(pg, &b, &a, ok, bad, NULL), TR_ESHAPE);
  tr_tensor_t empty = {0};
  ck_assert_int_eq(tr_pg_all_reduce(pg, &empty, TR_PG_SUM, NULL), TR_EINVAL);
  ck_assert_int_eq(tr_pg_barrier(pg, NULL), 0);

  /* only ops that were issued count */
  tr_pg_stats_t st;
  tr_pg_stats(pg, &st);
  ck_assert_int_eq(st.calls[TR_PG_OP_ALL_GATHER], 1);
  ck_assert_int_eq(st.bytes[TR_PG_OP_ALL_GATHER], 20);
  ck_assert_int_eq(st.calls[TR_PG_OP_REDUCE_SCATTER], 1);
  ck_assert_int_eq(st.bytes[TR_PG_OP_REDUCE_SCATTER], 160);
  ck_assert_int_eq(st.calls[TR_PG_OP_BROADCAST], 1);
  ck_assert_int_eq(st.calls[TR_PG_OP_ALL_TO_ALL], 1);
  ck_assert_int_eq(st.calls[TR_PG_OP_RECV], 1);
  ck_assert_int_eq(st.calls[TR_PG_OP_SEND], 0);
  ck_assert_int_eq(st.calls[TR_PG_OP_BARRIER], 1);
  ck_assert_ptr_null(tr_pg_error(pg));
  tr_tensor_release(&a);
  tr_tensor_release(&b);
  tr_tensor_release(&in);
  tr_tensor_release(&out);
  tr_tensor_release(&small);
  tr_tensor_release(&other);
  tr_pg_free(pg);
}
END_TEST

START_TEST(test_fake_groups_and_work) {
  tr_pg_t* pg = fake_world(3, 8);
  int r1[3] = {5, 0, 3};
  tr_pg_t* g = NULL;
  ck_assert_int_eq(tr_pg_new_group(pg, r1, 3, "tp", &g), 0);
  ck_assert_ptr_nonnull(g);
  ck_assert_str_eq(tr_pg_name(g), "1");
  ck_assert_str_eq(tr_pg_desc(g), "tp");
  ck_assert_int_eq(tr_pg_rank(g), 1); /* sorted: 0, 3, 5 */
  ck_assert_int_eq(tr_pg_size(g), 3);
  ck_assert_int_eq(tr_pg_global_rank(g, 2), 5);
  ck_assert_int_eq(tr_pg_global_rank(g, 3), -1);
  ck_assert_int_eq(tr_pg_group_rank(g, 5), 2);
  ck_assert_int_eq(tr_pg_group_rank(g, 4), -1);
  ck_assert_int_ne(tr_pg_uid(g), tr_pg_uid(pg));
  int r2[2] = {0, 1};
  tr_pg_t* h = (tr_pg_t*)1;
  ck_assert_int_eq(tr_pg_new_group(pg, r2, 2, NULL, &h), 0);
  ck_assert_ptr_null(h); /* not a member */
  int dup[2] = {1, 1}, out_of[2] = {1, 8};
  ck_assert_int_eq(tr_pg_new_group(pg, dup, 2, NULL, &h), TR_EINVAL);
  ck_assert_int_eq(tr_pg_new_group(pg, out_of, 2, NULL, &h), TR_EINVAL);
  /* split needs the others' colors: not without a store */
  ck_assert_int_eq(tr_pg_split(pg, 0, 0, NULL, &h), TR_EUNSUPPORTED);
  /* the group's shapes: all_gather over 3 */
  tr_tensor_t in = vec(TR_U8, 4, 1), out = vec(TR_U8, 12, 0),
              wrong = vec(TR_U8, 32, 0);
  ck_assert_int_eq(tr_pg_all_gather(g, &out, &in, NULL), 0);
  ck_assert_int_eq(tr_pg_all_gather(g, &wrong, &in, NULL), TR_ESHAPE);

  /* timeouts: per group, or the whole world */
  ck_assert_int_eq(tr_pg_timeout(g), 300000);
  tr_pg_set_timeout(g, 1234);
  ck_assert_int_eq(tr_pg_timeout(g), 1234);
  ck_assert_int_eq(tr_pg_timeout(pg), 300000);
  tr_pg_set_timeout_all(pg, 777);
  ck_assert_int_eq(tr_pg_timeout(g), 777);
  ck_assert_int_eq(tr_pg_timeout(pg), 777);
  tr_pg_set_timeout(pg, 0); /* ignored */
  ck_assert_int_eq(tr_pg_timeout(pg), 777);

  /* async work of the fake backend is complete at once */
  tr_pg_work_t* w = NULL;
  ck_assert_int_eq(tr_pg_all_reduce(g, &in, TR_PG_AVG, &w), 0);
  ck_assert_int_eq(tr_pg_work_test(w), 1);
  ck_assert_int_eq(tr_pg_work_status(w), 0);
  ck_assert_int_eq(tr_pg_work_wait(w, 10), 0);
  ck_assert_ptr_null(tr_pg_work_error(w));
  tr_pg_work_free(w);

  /* coalesced: ops take no work of their own; one work at the end */
  ck_assert_int_eq(tr_pg_coalesce_begin(g), 0);
  ck_assert_int_eq(tr_pg_all_reduce(g, &in, TR_PG_SUM, NULL), 0);
  ck_assert_int_eq(tr_pg_all_gather(g, &out, &in, NULL), 0);
  ck_assert_int_eq(tr_pg_all_reduce(g, &in, TR_PG_SUM, &w), TR_EINVAL);
  ck_assert_int_eq(tr_pg_coalesce_end(g, &w), 0);
  ck_assert_int_eq(tr_pg_work_wait(w, 0), 0);
  tr_pg_work_free(w);
  ck_assert_int_eq(tr_pg_coalesce_end(g, &w), TR_EINVAL);
  tr_pg_stats_t st;
  tr_pg_stats(g, &st);
  ck_assert_int_eq(st.calls[TR_PG_OP_ALL_GATHER], 2);
  ck_assert_int_eq(st.calls[TR_PG_OP_ALL_REDUCE], 2);
  ck_assert_int_eq(st.calls[TR_PG_OP_COALESCED], 1);

  tr_tensor_release(&in);
  tr_tensor_release(&out);
  tr_tensor_release(&wrong);
  tr_pg_free(pg); /* groups may outlive the world group */
  tr_pg_free(g);
}
END_TEST

/* Hook records of the fake backend: one process, so checked here. */
static int64_t n_enq, last_seq, last_p2p, last_op;
static char last_name[64];
static int n_start, n_complete;

static int64_t fk_enqueue(void* arg, const tr_pg_record_t* r) {
  (void)arg;
  n_enq++;
  last_seq = r->collective_seq_id;
  last_p2p = r->p2p_seq_id;
  last_op = r->op_id;
  snprintf(last_name, sizeof last_name, "%s", r->profiling_name);
  return n_enq;
}
static void fk_start(void* arg, int64_t id, int64_t t) {
  (void)arg;
  (void)id;
  (void)t;
  n_start++;
}
static void fk_complete(void* arg, int64_t id, int64_t t, int st) {
  (void)arg;
  (void)id;
  (void)t;
  if (st == 0) n_complete++;
}

START_TEST(test_fake_hooks) {
  tr_pg_hooks_t h = {NULL, NULL, fk_enqueue, fk_start, fk_complete, NULL};
  tr_pg_set_hooks(&h);
  tr_pg_t* pg = fake_world(0, 4);
  tr_tensor_t t = vec(TR_F16, 3, 1);
  ck_assert_int_eq(tr_pg_all_reduce(pg, &t, TR_PG_SUM, NULL), 0);
  ck_assert_str_eq(last_name, "fake:all_reduce");
  ck_assert_int_eq(last_seq, 1);
  ck_assert_int_eq(last_op, 1);
  ck_assert_int_eq(tr_pg_send(pg, &t, 2, 0, NULL), 0);
  ck_assert_str_eq(last_name, "fake:send 0->2");
  ck_assert_int_eq(last_seq, 1);
  ck_assert_int_eq(last_p2p, 1);
  ck_assert_int_eq(tr_pg_recv(pg, &t, 3, 0, NULL), 0);
  ck_assert_str_eq(last_name, "fake:recv 0<-3");
  ck_assert_int_eq(last_p2p, 2);
  ck_assert_int_eq(tr_pg_coalesce_begin(pg), 0);
  ck_assert_int_eq(tr_pg_all_reduce(pg, &t, TR_PG_MIN, NULL), 0);
  ck_assert_int_eq(tr_pg_all_reduce(pg, &t, TR_PG_MAX, NULL), 0);
  ck_assert_int_eq(tr_pg_coalesce_end(pg, NULL), 0);
  ck_assert_str_eq(last_name, "fake:coalesced");
  ck_assert_int_eq(last_seq, 2); /* one collective launch */
  ck_assert_int_eq(last_op, 6);
  ck_assert_int_eq(n_enq, 6);
  ck_assert_int_eq(n_start, 6);
  ck_assert_int_eq(n_complete, 6);
  tr_pg_set_hooks(NULL);
  tr_tensor_release(&t);
  tr_pg_free(pg);
}
END_TEST

/* ---- Gloo on forked ranks ---- */

#ifdef HAVE_GLOO
static void run(int n, const char* backend, pg_body_fn body, int limit_s,
                int* st) {
  ck_assert_int_eq(
      pg_spawn(n, backend, TR_DEV_CPU, 1, 30000, body, limit_s, st), 0);
}

static void all_ok(int n, const int* st) {
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}

START_TEST(test_gloo_ops) {
  int n = 2 + _i, st[4];
  run(n, "gloo", pg_body_ops, 90, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_gloo_subgroups) {
  int n = 3 + _i, st[4];
  /* the dispatching spec: CPU tensors go to gloo */
  run(n, "cpu:gloo,cuda:nccl", pg_body_subgroups, 60, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_gloo_async) {
  int n = 2 + _i, st[3];
  run(n, "gloo", pg_body_async, 60, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_gloo_timeout) {
  int st[2];
  run(2, "gloo", pg_body_timeout, 30, st);
  all_ok(2, st);
}
END_TEST

START_TEST(test_gloo_rank_dies) {
  int st[3];
  run(3, "gloo", pg_body_die, 30, st);
  ck_assert_int_eq(st[2], PG_DIE_STATUS);
  all_ok(2, st);
}
END_TEST

START_TEST(test_gloo_job_failure) {
  int st[2];
  pg_failure_key = "trainrun/test/r0/failure";
  run(2, "gloo", pg_body_job_failure, 30, st);
  pg_failure_key = NULL;
  all_ok(2, st);
}
END_TEST

START_TEST(test_gloo_hooks) {
  int st[3];
  run(3, "gloo", pg_body_hooks, 30, st);
  all_ok(3, st);
}
END_TEST

START_TEST(test_gloo_timing) {
  int st[2];
  run(2, "gloo", pg_body_timing, 30, st);
  all_ok(2, st);
}
END_TEST

START_TEST(test_gloo_waits) {
  int st[2];
  run(2, "gloo", pg_body_waits, 30, st);
  all_ok(2, st);
}
END_TEST
#endif

static Suite* pg_suite(void) {
  Suite* s = suite_create("pg");
  TCase* tc = tcase_create("local");
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_backend_specs);
  tcase_add_test(tc, test_backend_parse);
  tcase_add_test(tc, test_fake_shapes);
  tcase_add_test(tc, test_fake_groups_and_work);
  tcase_add_test(tc, test_fake_hooks);
  suite_add_tcase(s, tc);
#ifdef HAVE_GLOO
  tc = tcase_create("gloo");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_gloo_ops, 0, 3);
  tcase_add_loop_test(tc, test_gloo_subgroups, 0, 2);
  tcase_add_loop_test(tc, test_gloo_async, 0, 2);
  tcase_add_test(tc, test_gloo_timeout);
  tcase_add_test(tc, test_gloo_rank_dies);
  tcase_add_test(tc, test_gloo_job_failure);
  tcase_add_test(tc, test_gloo_hooks);
  tcase_add_test(tc, test_gloo_timing);
  tcase_add_test(tc, test_gloo_waits);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(pg_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
