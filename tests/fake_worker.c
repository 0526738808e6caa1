/* tests/fake_worker.c: a stand-in for a training rank, so the daemon's
 * logic is tested without the trainer. It prints its environment and text,
 * then exits with a chosen code, kills itself with a signal, or hangs;
 * actions can be limited to one rank and to the first restarts.
 *
 *   fake_worker [--ready DIR] [--env] [--out TEXT] [--err TEXT]
 *               [--partial TEXT] [--lines N] [--sleep MS]
 *               [--term-exit CODE] [--rank R] [--until-restart K]
 *               [--others-hang]
 *               [--exit CODE | --kill SIG | --hang]
 *
 * --ready DIR      create DIR/ready.<RANK> once started
 * --env            print NAME=value for each launcher variable (unset: "-")
 * --out/--err      print TEXT and a newline on stdout / stderr
 * --partial TEXT   print TEXT on stdout with no newline
 * --lines N        print "line I of rank R" N times on stdout
 * --affinity       print "affinity=N" (CPUs it may run on)
 * --sleep MS       sleep before the action
 * --term-exit C    on SIGTERM print "rank R got SIGTERM" and exit C
 *                  (default: SIGTERM kills it)
 * --term-ignore    ignore SIGTERM and SIGINT (print "rank R ignores SIGTERM")
 * --rank R         the action applies to rank R only (others exit 0)
 * --until-restart K  ... and only while TRAINRUN_RESTART_COUNT < K
 * --others-hang    ranks the action does not apply to hang (default: exit 0)
 * --exit C / --kill SIG / --hang   the action (default: exit 0)
 *
 * Test code reads its environment with getenv: it is no part of trainrun.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int term_code = -1;
static int my_rank;

static void on_ignore(int sig) {
  char buf[64];
  int n = snprintf(buf, sizeof buf, "rank %d ignores SIG%s\n", my_rank,
                   sig == SIGTERM ? "TERM" : "INT");
  ssize_t w = write(1, buf, (size_t)n);
  (void)w;
}

static void on_term(int sig) {
  (void)sig;
  char buf[64];
  int n = snprintf(buf, sizeof buf, "rank %d got SIGTERM\n", my_rank);
  ssize_t w = write(1, buf, (size_t)n);
  (void)w;
  _exit(term_code);
}

static const char* env_or_dash(const char* name) {
  const char* v = getenv(name);
  return v ? v : "-";
}

int main(int argc, char** argv) {
  static const char* const vars[] = {"RANK",
                                     "LOCAL_RANK",
                                     "WORLD_SIZE",
                                     "LOCAL_WORLD_SIZE",
                                     "GROUP_RANK",
                                     "GROUP_WORLD_SIZE",
                                     "ROLE_RANK",
                                     "ROLE_NAME",
                                     "ROLE_WORLD_SIZE",
                                     "MASTER_ADDR",
                                     "MASTER_PORT",
                                     "TORCHELASTIC_RESTART_COUNT",
                                     "TORCHELASTIC_MAX_RESTARTS",
                                     "TORCHELASTIC_RUN_ID",
                                     "TORCHELASTIC_USE_AGENT_STORE",
                                     "TRAINRUN_RESTART_COUNT",
                                     "TRAINRUN_STORE",
                                     "TRAINRUN_WORKER",
                                     "OMP_NUM_THREADS"};
  my_rank = atoi(env_or_dash("RANK"));
  int restart =
      atoi(getenv("TRAINRUN_RESTART_COUNT") ? getenv("TRAINRUN_RESTART_COUNT")
                                            : "0");
  int only_rank = -1, until = -1, action = 0, arg = 0, others_hang = 0;
  long sleep_ms = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(a, "--ready") == 0) {
      char path[4096];
      snprintf(path, sizeof path, "%s/ready.%d", v, my_rank);
      FILE* f = fopen(path, "w");
      if (f) fclose(f);
      i++;
    } else if (strcmp(a, "--env") == 0) {
      for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++)
        printf("%s=%s\n", vars[k], env_or_dash(vars[k]));
    } else if (strcmp(a, "--out") == 0) {
      printf("%s\n", v);
      i++;
    } else if (strcmp(a, "--err") == 0) {
      fprintf(stderr, "%s\n", v);
      i++;
    } else if (strcmp(a, "--partial") == 0) {
      printf("%s", v);
      fflush(stdout);
      i++;
    } else if (strcmp(a, "--lines") == 0) {
      for (int k = 0, n = atoi(v); k < n; k++)
        printf("line %d of rank %d\n", k, my_rank);
      i++;
    } else if (strcmp(a, "--affinity") == 0) {
      cpu_set_t set;
      sched_getaffinity(0, sizeof set, &set);
      printf("affinity=%d\n", CPU_COUNT(&set));
    } else if (strcmp(a, "--sleep") == 0) {
      sleep_ms = atol(v);
      i++;
    } else if (strcmp(a, "--term-exit") == 0) {
      term_code = atoi(v);
      signal(SIGTERM, on_term);
      i++;
    } else if (strcmp(a, "--term-ignore") == 0) {
      struct sigaction sa;
      memset(&sa, 0, sizeof sa);
      sa.sa_handler = on_ignore;
      sigaction(SIGTERM, &sa, NULL);
      sigaction(SIGINT, &sa, NULL);
    } else if (strcmp(a, "--rank") == 0) {
      only_rank = atoi(v);
      i++;
    } else if (strcmp(a, "--until-restart") == 0) {
      until = atoi(v);
      i++;
    } else if (strcmp(a, "--others-hang") == 0) {
      others_hang = 1;
    } else if (strcmp(a, "--exit") == 0) {
      action = 'e', arg = atoi(v);
      i++;
    } else if (strcmp(a, "--kill") == 0) {
      action = 'k', arg = atoi(v);
      i++;
    } else if (strcmp(a, "--hang") == 0) {
      action = 'h';
    } else {
      fprintf(stderr, "fake_worker: unknown argument '%s'\n", a);
      return 64;
    }
  }
  fflush(stdout);
  if (sleep_ms > 0) {
    struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  int applies =
      (only_rank < 0 || only_rank == my_rank) && (until < 0 || restart < until);
  if (!applies && !others_hang) return 0;
  if (!applies) action = 'h';
  switch (action) {
    case 'e':
      return arg;
    case 'k':
      signal(arg, SIG_DFL);
      raise(arg);
      return 99;
    case 'h':
      for (;;) pause();
  }
  return 0;
}
