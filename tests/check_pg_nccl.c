/* tests/check_pg_nccl.c: the process-group suite on NCCL (CUDA tensors,
 * backend "cpu:gloo,cuda:nccl") with one rank per GPU: every op x dtype x
 * reduce op, sub-groups split from the world's communicator, async overlap
 * of two groups, a timeout that fires and is reported, a rank that dies,
 * the flight-recorder hooks and op timing. Exits 77 (skipped) in builds
 * without NCCL or on machines with fewer than two GPUs. */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/pg_suite.h"
#include "trainrun/error.h"
#include "trainrun/pg.h"

#ifdef HAVE_NCCL
static int g_ngpu;

static void run(int n, pg_body_fn body, int limit_s, int* st) {
  ck_assert_int_eq(pg_spawn(n, "cpu:gloo,cuda:nccl", TR_DEV_CUDA, 0, 30000,
                            body, limit_s, st),
                   0);
}

static void all_ok(int n, const int* st) {
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}

START_TEST(test_nccl_ops) {
  int st[16], n = g_ngpu;
  run(n, pg_body_ops, 240, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_nccl_subgroups) {
  int st[16], n = g_ngpu;
  run(n, pg_body_subgroups, 120, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_nccl_async) {
  int st[16], n = g_ngpu;
  run(n, pg_body_async, 120, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_nccl_timeout) {
  int st[2];
  run(2, pg_body_timeout, 60, st);
  all_ok(2, st);
}
END_TEST

START_TEST(test_nccl_rank_dies) {
  int st[16], n = g_ngpu;
  run(n, pg_body_die, 60, st);
  ck_assert_int_eq(st[n - 1], PG_DIE_STATUS);
  all_ok(n - 1, st);
}
END_TEST

START_TEST(test_nccl_hooks) {
  int st[16], n = g_ngpu;
  run(n, pg_body_hooks, 60, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_nccl_timing) {
  int st[16], n = g_ngpu;
  run(n, pg_body_timing, 60, st);
  all_ok(n, st);
}
END_TEST

START_TEST(test_nccl_waits) {
  int st[16], n = g_ngpu;
  run(n, pg_body_waits, 60, st);
  all_ok(n, st);
}
END_TEST

/* CUDA must not be initialised in a process that forks ranks: count the
 * devices in a child. */
static int count_gpus(void) {
  pid_t p = fork();
  if (p == 0) {
    int n = tr_cuda_device_count();
    _exit(n > 16 ? 16 : n);
  }
  int st = 0;
  if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st)) return 0;
  return WEXITSTATUS(st);
}
#endif

int main(void) {
#ifndef HAVE_NCCL
  fprintf(stderr, "this build has no NCCL: skipped\n");
  return 77;
#else
  g_ngpu = count_gpus();
  if (g_ngpu < 2) {
    fprintf(stderr, "%d CUDA device(s); the NCCL suite needs 2: skipped\n",
            g_ngpu);
    return 77;
  }
  Suite* s = suite_create("pg_nccl");
  TCase* tc = tcase_create("nccl");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_nccl_ops);
  tcase_add_test(tc, test_nccl_subgroups);
  tcase_add_test(tc, test_nccl_async);
  tcase_add_test(tc, test_nccl_timeout);
  tcase_add_test(tc, test_nccl_rank_dies);
  tcase_add_test(tc, test_nccl_hooks);
  tcase_add_test(tc, test_nccl_timing);
  tcase_add_test(tc, test_nccl_waits);
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
#endif
}
