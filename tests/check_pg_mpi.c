/* tests/check_pg_mpi.c: the process-group suite on the MPI backend. The
 * Check tests start a store server and run this same program under
 * `mpirun --oversubscribe -np N` with a scenario name; the ranks it starts
 * (OMPI_COMM_WORLD_SIZE set) run the shared bodies of tests/pg_suite.c.
 * Without mpirun the program exits 77 (skipped). */
#include "config.h"

#include <check.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/pg_suite.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/pg.h"

extern char** environ;

/* ---- inside mpirun: one rank ---- */

static int rank_main(const char* scenario) {
  const char* port = getenv("TR_TEST_STORE_PORT");
  if (!port) return 2;
  tr_store_client_t* c = pg_client(atoi(port));
  if (!c) return 2;
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  o.backend = "mpi";
  o.store = c;
  o.timeout_ms = 30000;
  tr_pg_t* world = NULL;
  int rc = tr_pg_new(&o, &world);
  if (rc < 0) {
    fprintf(stderr, "tr_pg_new: %s\n", tr_strerror(rc));
    return 2;
  }
  pg_test_rank = tr_pg_rank(world);
  tr_log_set_rank(pg_test_rank);
  pg_ctx_t ctx = {"mpi", TR_DEV_CPU,        1,
                  c,     tr_pg_rank(world), tr_pg_size(world)};
  if (!strcmp(scenario, "ops"))
    pg_body_ops(world, &ctx);
  else if (!strcmp(scenario, "sub"))
    pg_body_subgroups(world, &ctx);
  else if (!strcmp(scenario, "async"))
    pg_body_async(world, &ctx);
  else if (!strcmp(scenario, "timeout"))
    pg_body_timeout(world, &ctx);
  else if (!strcmp(scenario, "die"))
    pg_body_die(world, &ctx);
  else if (!strcmp(scenario, "hooks"))
    pg_body_hooks(world, &ctx);
  else if (!strcmp(scenario, "timing"))
    pg_body_timing(world, &ctx);
  else
    return 2;
  tr_pg_free(world);
  tr_store_client_free(c);
  return 0; /* MPI_Finalize runs at exit */
}

/* ---- the Check side: mpirun per test ---- */

static char g_self[4096];
static char g_mpirun[4096];

static int find_mpirun(void) {
  const char* path = getenv("PATH");
  if (!path) return 0;
  char* dup = strdup(path);
  int found = 0;
  for (char* d = strtok(dup, ":"); d && !found; d = strtok(NULL, ":")) {
    snprintf(g_mpirun, sizeof g_mpirun, "%s/mpirun", d);
    found = access(g_mpirun, X_OK) == 0;
  }
  free(dup);
  return found;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* mpirun -np n <self> scenario; its exit status, -1 when it ran past
 * limit_s (then killed); *ms: how long it ran. */
static int mpirun(int n, const char* scenario, int limit_s, int64_t* ms) {
  int port = 0;
  pid_t srv = pg_server_fork(&port);
  ck_assert_int_gt(srv, 0);
  char np[16], portenv[64];
  snprintf(np, sizeof np, "%d", n);
  snprintf(portenv, sizeof portenv, "%d", port);
  setenv("TR_TEST_STORE_PORT", portenv, 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  /* Open MPI keeps memory until exit: not a leak of ours. A later option
   * wins in ASAN_OPTIONS, so append to whatever the caller (CI) set. */
  const char* asan = getenv("ASAN_OPTIONS");
  char asan_opts[512];
  snprintf(asan_opts, sizeof asan_opts, "%s%sdetect_leaks=0", asan ? asan : "",
           asan && *asan ? ":" : "");
  setenv("ASAN_OPTIONS", asan_opts, 1);
  char* argv[32];
  int k = 0;
  argv[k++] = g_mpirun;
  argv[k++] = "--allow-run-as-root";
  argv[k++] = "--oversubscribe";
  argv[k++] = "--bind-to";
  argv[k++] = "none";
  argv[k++] = "-np";
  argv[k++] = np;
  const char* pass[] = {"TR_TEST_STORE_PORT", "LD_LIBRARY_PATH",
                        "ASAN_OPTIONS",       "UBSAN_OPTIONS",
                        "TRAINRUN_LOG_LEVEL", "TRAINRUN_PG_WATCHDOG_MS"};
  for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++)
    if (getenv(pass[i])) {
      argv[k++] = "-x";
      argv[k++] = (char*)pass[i];
    }
  argv[k++] = g_self;
  argv[k++] = (char*)scenario;
  argv[k] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid;
  int64_t t0 = now_ms();
  ck_assert_int_eq(posix_spawn(&pid, g_mpirun, NULL, NULL, argv, environ), 0);
  int status = -1, st;
  while (now_ms() - t0 < limit_s * 1000) {
    if (waitpid(pid, &st, WNOHANG) == pid) {
      status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    usleep(10000);
  }
  *ms = now_ms() - t0;
  if (status == -1) {
    fprintf(stderr, "mpirun -np %d %s still running after %d s: killed\n", n,
            scenario, limit_s);
    kill(pid, SIGTERM);
    usleep(500000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  kill(srv, SIGKILL);
  waitpid(srv, NULL, 0);
  return status;
}

START_TEST(test_mpi_ops) {
  int64_t ms;
  int n = 2 + _i;
  ck_assert_int_eq(mpirun(n, "ops", 120, &ms), 0);
}
END_TEST

START_TEST(test_mpi_subgroups) {
  int64_t ms;
  ck_assert_int_eq(mpirun(4, "sub", 60, &ms), 0);
}
END_TEST

START_TEST(test_mpi_async) {
  int64_t ms;
  ck_assert_int_eq(mpirun(3, "async", 60, &ms), 0);
}
END_TEST

START_TEST(test_mpi_timeout) {
  int64_t ms;
  ck_assert_int_eq(mpirun(2, "timeout", 60, &ms), 0);
}
END_TEST

START_TEST(test_mpi_hooks) {
  int64_t ms;
  ck_assert_int_eq(mpirun(2, "hooks", 60, &ms), 0);
}
END_TEST

START_TEST(test_mpi_timing) {
  int64_t ms;
  ck_assert_int_eq(mpirun(2, "timing", 60, &ms), 0);
}
END_TEST

/* A rank that dies mid-collective: Open MPI ends the whole job (the others
 * may or may not see an error first) -- the job fails, and fast. */
START_TEST(test_mpi_rank_dies) {
  int64_t ms;
  int st = mpirun(3, "die", 60, &ms);
  ck_assert_int_ne(st, 0);
  ck_assert_int_ne(st, -1);
  ck_assert_int_lt(ms, 30000);
}
END_TEST

int main(int argc, char** argv) {
  if (getenv("OMPI_COMM_WORLD_SIZE")) return rank_main(argc > 1 ? argv[1] : "");
#ifndef HAVE_MPI
  fprintf(stderr, "this build has no MPI backend: skipped\n");
  return 77;
#endif
  if (!find_mpirun()) {
    fprintf(stderr, "mpirun not found: skipped\n");
    return 77;
  }
  ssize_t len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
  if (len <= 0) return 77;
  g_self[len] = '\0';
  Suite* s = suite_create("pg_mpi");
  TCase* tc = tcase_create("mpi");
  tcase_set_timeout(tc, 150);
  tcase_add_loop_test(tc, test_mpi_ops, 0, 3);
  tcase_add_test(tc, test_mpi_subgroups);
  tcase_add_test(tc, test_mpi_async);
  tcase_add_test(tc, test_mpi_timeout);
  tcase_add_test(tc, test_mpi_hooks);
  tcase_add_test(tc, test_mpi_timing);
  tcase_add_test(tc, test_mpi_rank_dies);
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
