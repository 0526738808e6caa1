/* tests/check_super.c: supervision of real training jobs -- fault injection
 * (--debug.fault), worker heartbeats and --worker-timeout, restarts from a
 * checkpoint after a kill -9, SIGTERM, `trainrun status` and
 * --metrics-port (Prometheus text over HTTP), a lost node below MIN, many
 * nodes on loopback training to the losses of one process (plain,
 * Slurm-style, mpirun-style, --standalone), and the errors users meet
 * (endpoint unreachable, port in use, bad flags, bad fault specs), and
 * the lifecycle of issue 21: set-up waits that give up on the failure
 * report or a stop, exit code 2 without restarts, a damaged checkpoint
 * skipped for an older one, --exec children and orphans killed, SIGHUP on
 * one rank, the dump folder's lock, a busy rendezvous endpoint, the final
 * report blaming the verdict's rank, errors found before the work. Every
 * test checks that its jobs left no process, segment, socket or port.
 *
 * Units: fault specs and their errors, arming by rank and restart, each
 * fault's effect in a child process, the heartbeat page. Processes:
 * trainrun and trainrund on loopback with examples/debug.toml on the CPU,
 * ports picked by binding port 0. */
#include "config.h"

#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h> /* FS_IOC_SETFLAGS */
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "trainrun/error.h"
#include "trainrun/fault.h"
#include "trainrun/heartbeat.h"
#include "trainrun/param.h"
#include "trainrun/pg.h"
#include "trainrun/store.h"
#include "trainrun/tensor.h"
#include "tests/procs.h"

/* ---- helpers ---- */

static double test_t0;

static char env_quiet[] = "TRAINRUN_LOG_LEVEL=warn";
static char env_stop[] = "TRAINRUN_STOP_TIMEOUT=2";
static char* env_defaults[] = {env_quiet, env_stop, NULL};

/* tp_tmpdir_make() has tp_cleanup() run at exit too: a failed assertion
 * exits the test's process, which then kills the processes the test
 * started (their workers die with them) and removes the test's folder,
 * which the teardown would not. */
static void setup(void) {
  test_t0 = tp_now_s();
  tp_env_defaults = env_defaults;
  tp_tmpdir_make("check_super");
}

/* Every test ends with nothing of its jobs left: no process, ring segment
 * or status socket. */
static void teardown(void) {
  fprintf(stderr, "(test took %.2fs)\n", tp_now_s() - test_t0);
  tp_assert_all_gone();
  tp_cleanup();
}

/* argv of `trainrun [launcher...] debug.toml <small CPU job> [extra...]`:
 * a fixed seed, metrics.jsonl every step into <tp_tmpdir>/<dump>. */
typedef struct {
  char* v[96];
  int n;
  char job[600], data[600], dumparg[700], dump[600];
} cmd_t;

static void cmd_init(cmd_t* c, const char* dump) {
  memset(c, 0, sizeof *c);
  snprintf(c->job, sizeof c->job, "%s/examples/debug.toml", tp_srcdir());
  snprintf(c->data, sizeof c->data, "%s/examples/data/tinytales.txt",
           tp_srcdir());
  snprintf(c->dump, sizeof c->dump, "%s/%s", tp_tmpdir, dump);
  snprintf(c->dumparg, sizeof c->dumparg, "--job.dump_folder=%s", c->dump);
  c->v[c->n++] = (char*)tp_bin("trainrun");
}

static void cmd_add(cmd_t* c, const char* a) {
  ck_assert_int_lt(c->n, 94);
  c->v[c->n++] = (char*)a;
  c->v[c->n] = NULL;
}

/* The job and its small settings (after the launcher flags). */
static void cmd_job(cmd_t* c, const char* steps, const char* batch) {
  const char* a[] = {c->job,
                     "--training.steps",
                     steps,
                     "--training.local_batch_size",
                     batch,
                     "--training.seq_len",
                     "32",
                     "--lr_scheduler.warmup_steps",
                     "0",
                     "--validation.enable=false",
                     "--debug.seed",
                     "42",
                     "--metrics.log_freq",
                     "1",
                     "--metrics.enable_jsonl=true",
                     "--training.dataset_path",
                     c->data,
                     c->dumparg};
  for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) cmd_add(c, a[i]);
}

/* tp_run() that also asserts the job left nothing behind
 * (tp_assert_job_gone; port > 0: its rendezvous port too). */
static int run_job(const char* tag, char* const* argv, char* const* env,
                   char** out, char** err, double timeout, int port) {
  tp_proc_t p;
  tp_proc_start(&p, tag, argv, env);
  int rc = tp_proc_finish(&p, timeout);
  *out = tp_slurp(p.out);
  *err = tp_slurp(p.err);
  tp_assert_job_gone(&p, port);
  return rc;
}

/* ---- fault specs ---- */

static void expect_spec_error(const char* spec, const char* want) {
  tr_fault_t f;
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  ck_assert_int_eq(tr_fault_parse(spec, &f, &err), TR_EINVAL);
  ck_assert_str_eq(err.message, want);
}

START_TEST(test_fault_parse) {
  tr_fault_t f;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_fault_parse("kill:rank=3:step=5", &f, &err), 0);
  ck_assert_int_eq(f.kind, TR_FAULT_KILL);
  ck_assert_int_eq(f.rank, 3);
  ck_assert_int_eq(f.step, 5);
  ck_assert_int_eq(f.restart, 0);
  ck_assert_str_eq(f.spec, "kill:rank=3:step=5");
  ck_assert_int_eq(tr_fault_parse("exit:rank=1:step=2:code=7", &f, &err), 0);
  ck_assert_int_eq(f.kind, TR_FAULT_EXIT);
  ck_assert_int_eq(f.code, 7);
  ck_assert_int_eq(tr_fault_parse("exit:step=2", &f, &err), 0);
  ck_assert_int_eq(f.code, 1);  /* default */
  ck_assert_int_eq(f.rank, -1); /* every rank */
  ck_assert_int_eq(tr_fault_parse("slow:rank=0:ms=500", &f, &err), 0);
  ck_assert_int_eq(f.kind, TR_FAULT_SLOW);
  ck_assert_int_eq(f.ms, 500);
  ck_assert_int_eq(f.step, -1);
  ck_assert_int_eq(tr_fault_parse("hang:rank=3:step=5:restart=1", &f, &err), 0);
  ck_assert_int_eq(f.kind, TR_FAULT_HANG);
  ck_assert_int_eq(f.restart, 1);
  ck_assert_int_eq(tr_fault_parse("skip_collective:rank=2:step=4", &f, &err),
                   0);
  ck_assert_int_eq(f.kind, TR_FAULT_SKIP_COLLECTIVE);
  ck_assert_int_eq(tr_fault_parse("mismatch:rank=2:step=4", &f, &err), 0);
  ck_assert_int_eq(f.kind, TR_FAULT_MISMATCH);

  expect_spec_error("kil:rank=3:step=5",
                    "debug.fault 'kil:rank=3:step=5': unknown kind 'kil' "
                    "(kill, hang, exit, slow, skip_collective or mismatch)");
  expect_spec_error("kill:rank=3",
                    "debug.fault 'kill:rank=3': kill needs step=N");
  expect_spec_error("slow:rank=0",
                    "debug.fault 'slow:rank=0': slow needs ms=MILLISECONDS");
  expect_spec_error("kill:rank=x:step=1",
                    "debug.fault 'kill:rank=x:step=1': rank: expected a "
                    "number >= 0, got 'x'");
  expect_spec_error("kill:step=0",
                    "debug.fault 'kill:step=0': step: expected "
                    "a number >= 1, got '0'");
  expect_spec_error("exit:step=1:code=256",
                    "debug.fault 'exit:step=1:code=256': code: expected an "
                    "exit code 0 to 255, got '256'");
  expect_spec_error("kill:step=1:code=3",
                    "debug.fault 'kill:step=1:code=3': 'code' is no field of "
                    "kill (rank, step, restart)");
  expect_spec_error("kill:rank",
                    "debug.fault 'kill:rank': expected "
                    "name=value, got 'rank'");
}
END_TEST

/* Run fn in a child; its wait status. */
static int in_child(void (*fn)(void), double kill_after) {
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) {
    fn();
    _exit(0);
  }
  int st;
  double t0 = tp_now_s();
  for (;;) {
    if (waitpid(p, &st, WNOHANG) == p) return st;
    if (kill_after > 0 && tp_now_s() - t0 > kill_after) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
      return -1; /* still running when killed: it hung */
    }
    usleep(2000);
  }
}

static void arm(const char* spec, int rank, int restart) {
  const char* v[1] = {spec};
  tr_errmsg_t err;
  ck_assert_int_eq(tr_fault_arm(v, 1, rank, restart, &err), 0);
}

static void steps_1_to_5(void) {
  for (int s = 1; s <= 5; s++) tr_fault_step(s);
}

static void exit_at_3(void) {
  arm("exit:rank=1:step=3:code=7", 1, 0);
  steps_1_to_5();
}
static void exit_other_rank(void) {
  arm("exit:rank=1:step=3:code=7", 0, 0);
  steps_1_to_5();
}
static void exit_other_restart(void) {
  arm("exit:rank=1:step=3:code=7", 1, 1);
  steps_1_to_5();
}
static void kill_at_2(void) {
  arm("kill:step=2", 4, 0);
  steps_1_to_5();
}
static void hang_at_2(void) {
  arm("hang:rank=0:step=2", 0, 0);
  tr_fault_before_sync(1);
  tr_fault_before_sync(2);
}
static void hang_in_attempt_1(void) {
  arm("hang:rank=0:step=2:restart=1", 0, 1);
  tr_fault_before_sync(2);
}

START_TEST(test_fault_effects) {
  int st = in_child(exit_at_3, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 7);
  /* another rank, or another attempt: nothing happens */
  st = in_child(exit_other_rank, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  st = in_child(exit_other_restart, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  st = in_child(kill_at_2, 0);
  ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  /* a hang stays hung (the child is killed after 0.3 s) */
  ck_assert_int_eq(in_child(hang_at_2, 0.3), -1);
  ck_assert_int_eq(in_child(hang_in_attempt_1, 0.3), -1);

  /* slow: every step of the rank (or just step=N) */
  arm("slow:rank=2:ms=40", 2, 0);
  ck_assert_int_eq(tr_fault_armed(), 1);
  double t0 = tp_now_s();
  tr_fault_step(1);
  tr_fault_step(2);
  double took = tp_now_s() - t0;
  ck_assert_msg(took >= 0.08 && took < 1.0, "two slow steps took %.3fs", took);
  arm("slow:rank=2:ms=40:step=3", 2, 0);
  t0 = tp_now_s();
  tr_fault_step(1);
  ck_assert_double_lt(tp_now_s() - t0, 0.03);
  tr_fault_step(3);
  ck_assert_double_ge(tp_now_s() - t0, 0.04);
  /* not for this rank: not armed */
  arm("slow:rank=2:ms=40", 1, 0);
  ck_assert_int_eq(tr_fault_armed(), 0);
  /* a bad spec arms nothing and says which */
  const char* v[2] = {"slow:ms=1", "hang:rank=1"};
  tr_errmsg_t err;
  ck_assert_int_eq(tr_fault_arm(v, 2, 1, 0, &err), TR_EINVAL);
  ck_assert_str_eq(err.message, "debug.fault 'hang:rank=1': hang needs step=N");
  /* skip_collective and mismatch act in the gradient sync only */
  arm("skip_collective:rank=0:step=4", 0, 0);
  ck_assert_int_eq(tr_fault_grad_sync(NULL, NULL, 3), 0);
  ck_assert_int_eq(tr_fault_grad_sync(NULL, NULL, 4), 1);
  ck_assert_int_eq(tr_fault_sharded_sync(3), TR_FAULT_SYNC_NONE);
  ck_assert_int_eq(tr_fault_sharded_sync(4), TR_FAULT_SYNC_SKIP);
  arm("mismatch:rank=0:step=4", 0, 0);
  ck_assert_int_eq(tr_fault_sharded_sync(4), TR_FAULT_SYNC_MISMATCH);
  tr_fault_step(4); /* no effect at the step start */
  ck_assert_int_eq(tr_fault_arm(NULL, 0, 0, 0, &err), 0);
  ck_assert_int_eq(tr_fault_armed(), 0);
}
END_TEST

/* ---- the heartbeat page ---- */

START_TEST(test_heartbeat_page) {
  void* page;
  int fd = tr_heartbeat_create(&page);
  ck_assert_int_ge(fd, 0);
  tr_heartbeat_slot_t s;
  ck_assert_int_eq(tr_heartbeat_read(page, &s), 0);
  ck_assert_int_eq(s.beats, 0); /* nobody beat yet */
  pid_t p = fork();
  ck_assert_int_ge(p, 0);
  if (p == 0) {
    /* what a worker sees: the fd named in its environment */
    char v[16];
    snprintf(v, sizeof v, "%d", fd);
    setenv("TRAINRUN_HEARTBEAT_FD", v, 1);
    tr_param_reset();
    tr_heartbeat_set_total(10);
    tr_heartbeat_beat("init", 0, NAN, 0);
    tr_heartbeat_beat("step", 3, 2.5, 1234.0);
    tr_heartbeat_phase("sync");
    _exit(0);
  }
  int st;
  waitpid(p, &st, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ck_assert_int_eq(tr_heartbeat_read(page, &s), 0);
  ck_assert_int_eq(s.beats, 3);
  ck_assert_int_eq(s.step, 3);
  ck_assert_int_eq(s.total_steps, 10);
  ck_assert_double_eq(s.loss, 2.5);
  ck_assert_double_eq(s.tokens_per_s, 1234.0);
  ck_assert_str_eq(s.phase, "sync");
  ck_assert_int_eq(s.pid, p);
  ck_assert_double_lt(fabs(s.time - (double)time(NULL)), 5);
  /* a page that is not a heartbeat page */
  ((tr_heartbeat_slot_t*)page)->magic = 1;
  ck_assert_int_eq(tr_heartbeat_read(page, &s), TR_EINVAL);
  tr_heartbeat_destroy(page, fd);
  /* no fd in the environment: beating does nothing */
  tr_heartbeat_beat("step", 1, 1.0, 1.0);
}
END_TEST

/* ---- set-up waits give up ---- */

static tr_store_client_t* client_of(int port) {
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 30000;
  tr_store_client_t* c = NULL;
  ck_assert_int_eq(tr_store_client_connect(&o, &c), 0);
  return c;
}

/* Rank 1 of 2 alone (rank 0 never comes) with a 60 s set-up timeout: an
 * all-reduce waits in Gloo's rendezvous for rank 0's address. */
static tr_pg_t* lonely_rank(tr_store_client_t* c, const char* prefix,
                            tr_tensor_t* t, tr_pg_work_t** w) {
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  o.rank = 1;
  o.world_size = 2;
  o.store = c;
  o.store_prefix = prefix;
  o.backend = "cpu:gloo";
  o.timeout_ms = 60000;
  o.failure_key = "job/r0/failure";
  tr_pg_t* pg = NULL;
  ck_assert_int_eq(tr_pg_new(&o, &pg), 0);
  int64_t shape[1] = {4};
  ck_assert_int_eq(tr_tensor_empty(t, TR_F32, TR_DEVICE_CPU, 1, shape), 0);
  memset(tr_tensor_data(t), 0, 16);
  ck_assert_int_eq(tr_pg_all_reduce(pg, t, TR_PG_SUM, w), 0);
  return pg;
}

START_TEST(test_setup_gives_up) {
  tr_store_server_opts_t so;
  tr_store_server_opts_init(&so);
  so.host = "127.0.0.1";
  so.port = 0;
  tr_store_server_t* srv = NULL;
  ck_assert_int_eq(tr_store_server_start(&so, &srv), 0);
  int port = tr_store_server_port(srv);
  tr_store_client_t* c = client_of(port);

  /* the job's failure report appears: the connect gives up with it */
  tr_tensor_t t;
  tr_pg_work_t* w = NULL;
  tr_pg_t* pg = lonely_rank(c, "a", &t, &w);
  ck_assert_int_eq(tr_pg_work_wait(w, 300), TR_ETIMEDOUT); /* it waits */
  double t0 = tp_now_s();
  const char* rep = "rank 0 (pid 1) exited with code 2\nlast lines: x";
  ck_assert_int_eq(tr_store_client_set(c, "job/r0/failure", rep, strlen(rep)),
                   0);
  ck_assert_int_lt(tr_pg_work_wait(w, 0), 0);
  double took = tp_now_s() - t0;
  const char* e = tr_pg_work_error(w);
  ck_assert_msg(e && strstr(e,
                            "waiting for 'rank_0': the job failed: rank 0 "
                            "(pid 1) exited with code 2"),
                "%s", e ? e : "(no error)");
  ck_assert_ptr_null(strstr(e, "last lines"));
  ck_assert_msg(took < 5, "gave up after %.1fs", took);
  tr_pg_work_free(w);
  tr_pg_free(pg);
  tr_tensor_release(&t);

  /* no report, but the group is freed (the worker exits): the connect
   * stops at once instead of at its 60 s timeout */
  tr_store_client_t* c2 = client_of(port);
  int deleted = 0;
  ck_assert_int_eq(tr_store_client_delete_key(c2, "job/r0/failure", &deleted),
                   0);
  pg = lonely_rank(c2, "b", &t, &w);
  ck_assert_int_eq(tr_pg_work_wait(w, 300), TR_ETIMEDOUT);
  t0 = tp_now_s();
  tr_pg_free(pg);
  took = tp_now_s() - t0;
  ck_assert_msg(took < 5, "freeing the group took %.1fs", took);
  ck_assert_int_lt(tr_pg_work_wait(w, 0), 0);
  e = tr_pg_work_error(w);
  ck_assert_msg(e && strstr(e, "the group is being shut down"), "%s",
                e ? e : "(no error)");
  tr_pg_work_free(w);
  tr_tensor_release(&t);
  tr_store_client_free(c2);
  tr_store_client_free(c);
  tr_store_server_stop(srv);
}
END_TEST

/* ---- faults in real jobs ---- */

START_TEST(test_fault_exit_report) {
  cmd_t c;
  cmd_init(&c, "exit");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_job(&c, "4", "2");
  cmd_add(&c, "--debug.fault");
  cmd_add(&c, "exit:rank=1:step=2:code=7");
  char* out;
  char* err;
  ck_assert_int_eq(tp_run("exit", c.v, NULL, &out, &err, 60), 1);
  /* which rank failed first, how, and its last lines */
  ck_assert_msg(strstr(err, "trainrun: rank 1 (local rank 1, pid "), "%s", err);
  ck_assert_ptr_nonnull(
      strstr(err, "exited with code 7\nlast lines of rank 1:"));
  ck_assert_ptr_nonnull(
      strstr(err,
             "\n  trainrun: rank 1: debug.fault 'exit:rank=1:step=2:code=7': "
             "exit code 7 at step 2\n"));
  ck_assert_ptr_nonnull(strstr(out, "[rank0]:step 1/4 | loss "));
  ck_assert_ptr_null(strstr(out, "[rank0]:step 2/4"));
  free(out);
  free(err);
}
END_TEST

START_TEST(test_collective_faults) {
  /* a rank that skips a collective or issues one of the wrong size: the
   * job fails (the collectives' error or timeout), the fault is named */
  const char* specs[2] = {"skip_collective:rank=1:step=2",
                          "mismatch:rank=1:step=2"};
  for (int k = 0; k < 2; k++) {
    cmd_t c;
    cmd_init(&c, "coll");
    cmd_add(&c, "--nproc-per-node");
    cmd_add(&c, "2");
    cmd_job(&c, "3", "2");
    cmd_add(&c, "--comm.train_timeout_seconds");
    cmd_add(&c, "3");
    cmd_add(&c, "--debug.fault");
    cmd_add(&c, specs[k]);
    char* out;
    char* err;
    ck_assert_int_eq(tp_run("coll", c.v, NULL, &out, &err, 60), 1);
    char want[160];
    snprintf(want, sizeof want, "trainrun: rank 1: debug.fault '%s", specs[k]);
    ck_assert_msg(strstr(out, want) || strstr(err, want), "%s\n%s", out, err);
    ck_assert_ptr_nonnull(strstr(err, "trainrun: rank "));
    ck_assert_ptr_nonnull(strstr(out, "[rank0]:step 1/3 | loss "));
    ck_assert_ptr_null(strstr(out, "[rank0]:step 3/3"));
    free(out);
    free(err);
  }
}
END_TEST

START_TEST(test_hang_worker_timeout) {
  /* rank 1 hangs before step 2's gradient collective: its heartbeat stops,
   * the daemon kills it after --worker-timeout and names it; rank 0 waits
   * in the collective meanwhile (twice as long before it would be
   * blamed) */
  cmd_t c;
  cmd_init(&c, "hang");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_add(&c, "--worker-timeout");
  cmd_add(&c, "2.5");
  cmd_job(&c, "4", "2");
  cmd_add(&c, "--debug.fault");
  cmd_add(&c, "hang:rank=1:step=2");
  char* out;
  char* err;
  double t0 = tp_now_s();
  ck_assert_int_eq(tp_run("hang", c.v, NULL, &out, &err, 60), 1);
  double took = tp_now_s() - t0;
  ck_assert_msg(
      strstr(err, "trainrun: rank 1 stopped heartbeating: no beat for "), "%s",
      err);
  ck_assert_ptr_nonnull(strstr(err, "trainrun: rank 1 (local rank 1, pid "));
  ck_assert_ptr_nonnull(strstr(err,
                               "(--worker-timeout 2.5s) after step 1, not in "
                               "a collective; killed with SIGKILL\n"
                               "last lines of rank 1:"));
  ck_assert_ptr_nonnull(strstr(err,
                               "hanging in step 2 before the gradient "
                               "collective"));
  ck_assert_ptr_null(strstr(err, "trainrun: rank 0 stopped heartbeating"));
  ck_assert_msg(took < 20, "the hang took %.1fs to end", took);
  free(out);
  free(err);
}
END_TEST

START_TEST(test_exit_2_stops_at_once) {
  /* a worker's exit code 2 (bad configuration or data) ends the job at
   * once with its report: no restart is burned on it */
  cmd_t c;
  cmd_init(&c, "exit2");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_add(&c, "--max-restarts");
  cmd_add(&c, "3");
  cmd_job(&c, "4", "2");
  cmd_add(&c, "--debug.fault");
  cmd_add(&c, "exit:rank=1:step=2:code=2");
  char* out;
  char* err;
  ck_assert_int_eq(run_job("exit2", c.v, NULL, &out, &err, 60, 0), 2);
  ck_assert_msg(strstr(err, "trainrun: rank 1 (local rank 1, pid "), "%s", err);
  ck_assert_ptr_nonnull(
      strstr(err, "exited with code 2\nlast lines of rank 1:"));
  ck_assert_ptr_nonnull(
      strstr(err,
             "\nexit code 2 is a configuration, usage or data error, which a "
             "restart cannot fix: not restarting\n"));
  ck_assert_ptr_null(strstr(err, "restarting the workers"));
  /* one attempt only */
  const char* first = strstr(out, "[rank0]:step 1/4 | loss ");
  ck_assert_ptr_nonnull(first);
  ck_assert_ptr_null(strstr(first + 1, "[rank0]:step 1/4 | loss "));
  free(out);
  free(err);
}
END_TEST

START_TEST(test_exec_children_killed) {
  /* rank 1 fails; rank 0's shell has a child in its process group and one
   * that left it (setsid): neither outlives the job */
  char* a[] = {(char*)tp_bin("trainrun"),
               "--nproc-per-node",
               "2",
               "--exec",
               "/bin/sh",
               "-c",
               "if [ $RANK = 1 ]; then sleep 1; exit 1; fi; "
               "setsid sleep 127 & sleep 126; :",
               NULL};
  char* out;
  char* err;
  double t0 = tp_now_s();
  ck_assert_int_eq(run_job("orphans", a, NULL, &out, &err, 60, 0), 1);
  ck_assert_msg(strstr(err, "trainrun: rank 1 (local rank 1, pid "), "%s", err);
  ck_assert_ptr_nonnull(strstr(err, "exited with code 1"));
  ck_assert_double_lt(tp_now_s() - t0, 30);
  free(out);
  free(err);
}
END_TEST

START_TEST(test_peer_dies_before_first_collective) {
  /* rank 0 exits before its first collective (after 2 s in step 1) while
   * rank 1 waits in Gloo's rendezvous for it: rank 1 gives up once the
   * failure is reported and exits by itself, long before the 60 s stop
   * timeout's SIGKILL */
  cmd_t c;
  cmd_init(&c, "early");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_job(&c, "4", "2");
  cmd_add(&c, "--debug.fault");
  cmd_add(&c, "slow:rank=0:ms=2000:step=1,exit:rank=0:step=1");
  char stop[] = "TRAINRUN_STOP_TIMEOUT=60";
  char* env[] = {stop, NULL};
  char* out;
  char* err;
  double t0 = tp_now_s();
  ck_assert_int_eq(run_job("early", c.v, env, &out, &err, 90, 0), 1);
  double took = tp_now_s() - t0;
  ck_assert_msg(strstr(err, "trainrun: rank 0 (local rank 0, pid "), "%s", err);
  ck_assert_ptr_null(strstr(err, "still running"));
  ck_assert_msg(strstr(out, "[rank1]:") && (strstr(out,
                                                   "the job failed: rank 0 "
                                                   "(local rank 0") ||
                                            strstr(err,
                                                   "the job failed: rank 0 "
                                                   "(local rank 0")),
                "%s\n%s", out, err);
  ck_assert_msg(took < 20, "the job took %.1fs to end", took);
  free(out);
  free(err);
}
END_TEST

START_TEST(test_summary_blames_verdict) {
  /* rank 1 hangs: rank 0's collective times out (5 s) and it exits first;
   * the flight recorder's verdict names rank 1, and so does the summary's
   * first line. Rank 1 ignores SIGTERM (it hangs): the default stop
   * timeout bounds the end. */
  char* quiet_only[] = {env_quiet, NULL};
  tp_env_defaults = quiet_only; /* TRAINRUN_STOP_TIMEOUT: its default */
  cmd_t c;
  cmd_init(&c, "blame");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_job(&c, "6", "2");
  cmd_add(&c, "--comm.train_timeout_seconds");
  cmd_add(&c, "5");
  cmd_add(&c, "--debug.fault");
  cmd_add(&c, "hang:rank=1:step=3");
  char* out;
  char* err;
  double t0 = tp_now_s();
  ck_assert_int_eq(run_job("blame", c.v, NULL, &out, &err, 90, 0), 1);
  double took = tp_now_s() - t0;
  tp_env_defaults = env_defaults;
  ck_assert_msg(strstr(err, "trainrun: flight recorder: rank 1 never entered "),
                "%s", err);
  const char* sum = strstr(err, "trainrun: rank 1 (local rank 1, pid ");
  ck_assert_msg(sum, "%s", err);
  ck_assert_ptr_nonnull(strstr(sum,
                               ": the flight recorder's verdict blames "
                               "it\nlast lines of rank 1:\n"));
  ck_assert_ptr_nonnull(strstr(sum,
                               "hanging in step 3 before the gradient "
                               "collective\n"));
  ck_assert_ptr_nonnull(strstr(sum,
                               "\nthe first to fail, waiting for it: "
                               "rank 0 (local rank 0, pid "));
  ck_assert_ptr_null(strstr(err, "trainrun: rank 0 (local rank 0"));
  ck_assert_msg(took < 25, "the job took %.1fs after a 5 s timeout", took);
  free(out);
  free(err);

  /* node 1 (not the store's host) is killed: node 0's summary names its
   * rank, as the verdict does, not rank 0 that saw the connection close */
  int port = tp_free_port();
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
  cmd_t n[2];
  tp_proc_t p[2];
  for (int k = 0; k < 2; k++) {
    char tag[16];
    snprintf(tag, sizeof tag, "node%d", k);
    cmd_init(&n[k], tag);
    cmd_add(&n[k], "--nnodes");
    cmd_add(&n[k], "2");
    cmd_add(&n[k], k == 0 ? "--node-rank=0" : "--node-rank=1");
    cmd_add(&n[k], "--rdzv-endpoint");
    cmd_add(&n[k], ep);
    cmd_add(&n[k], "--rdzv-conf");
    cmd_add(&n[k], k == 0 ? "keep_alive_interval=0.5,keep_alive_max_attempt=4"
                          : "is_host=false,keep_alive_interval=0.5,"
                            "keep_alive_max_attempt=4");
    cmd_job(&n[k], "1000", "2");
    cmd_add(&n[k], "--debug.fault");
    cmd_add(&n[k], "slow:ms=50");
    tp_proc_start(&p[k], tag, n[k].v, NULL);
  }
  tp_wait_text(p[0].out, "[rank0]:step 2/1000", 60);
  kill(p[1].pid, SIGKILL); /* its worker dies with it */
  ck_assert_int_eq(tp_proc_finish(&p[1], 30), 128 + SIGKILL);
  ck_assert_int_eq(tp_proc_finish(&p[0], 60), 1);
  char* st_argv[] = {(char*)tp_bin("trainrun"), "status", NULL};
  tp_run("status", st_argv, NULL, &out, &err, 20); /* node 1's socket */
  free(out);
  free(err);
  tp_assert_job_gone(&p[1], 0);
  tp_assert_job_gone(&p[0], port);
  err = tp_slurp(p[0].err);
  ck_assert_msg(strstr(err, "trainrun: flight recorder: rank 1 "), "%s", err);
  ck_assert_ptr_nonnull(strstr(err, "\ntrainrun: rank 1 on node 1 '"));
  ck_assert_ptr_nonnull(strstr(err,
                               "': the flight recorder's verdict blames it\n"
                               "the first to fail, waiting for it: rank 0 "));
  free(err);
}
END_TEST

/* ---- kill -9 and restart from the checkpoint ---- */

static int have_checkpoints(void) {
  char p[700];
  struct stat st;
  snprintf(p, sizeof p, "%s/include/trainrun/checkpoint.h", tp_srcdir());
  return stat(p, &st) == 0;
}

START_TEST(test_kill_restart_resumes) {
  if (!have_checkpoints()) {
    fprintf(stderr, "skipped: no checkpoint module in this tree\n");
    return;
  }
  enum { STEPS = 6 };
  double loss[2];
  for (int k = 0; k < 2; k++) {
    cmd_t c;
    cmd_init(&c, k == 0 ? "plain" : "killed");
    cmd_add(&c, "--nproc-per-node");
    cmd_add(&c, "2");
    cmd_add(&c, "--max-restarts");
    cmd_add(&c, "1");
    cmd_job(&c, "6", "2");
    cmd_add(&c, "--checkpoint.enable=true");
    cmd_add(&c, "--checkpoint.interval");
    cmd_add(&c, "2");
    if (k == 1) {
      cmd_add(&c, "--debug.fault");
      cmd_add(&c, "kill:rank=1:step=4"); /* after step 3: the last is 2 */
    }
    char* out;
    char* err;
    int rc = tp_run(k == 0 ? "plain" : "killed", c.v, NULL, &out, &err, 90);
    ck_assert_msg(rc == 0, "rc %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
    if (k == 1) {
      ck_assert_msg(strstr(err, "trainrun: rank 1 (local rank 1, pid "), "%s",
                    err);
      ck_assert_ptr_nonnull(
          strstr(err,
                 "was killed by signal 9 (SIGKILL); restarting the "
                 "workers (restart 1 of 1)"));
      /* the second attempt resumed from step 2, not from scratch */
      ck_assert_msg(strstr(out, "[rank0]:resumed from '"), "stdout:\n%s", out);
      ck_assert_ptr_nonnull(strstr(out, "' at step 2\n"));
    }
    free(out);
    free(err);
    loss[k] = tp_loss_at(c.dump, STEPS);
  }
  ck_assert_msg(loss[0] == loss[1],
                "final loss %.17g after a kill -9 and a restart, %.17g "
                "uninterrupted",
                loss[1], loss[0]);
}
END_TEST

/* Flip the byte at offset `at` of path. */
static void flip_byte(const char* path, long at) {
  int fd = open(path, O_RDWR);
  ck_assert_int_ge(fd, 0);
  unsigned char b;
  ck_assert_int_eq(pread(fd, &b, 1, at), 1);
  b ^= 0xff;
  ck_assert_int_eq(pwrite(fd, &b, 1, at), 1);
  close(fd);
}

START_TEST(test_damaged_checkpoint_fallback) {
  if (!have_checkpoints()) {
    fprintf(stderr, "skipped: no checkpoint module in this tree\n");
    return;
  }
  /* 6 steps, 2 ranks (FSDP: each reads its half of every tensor), a
   * checkpoint every 2 */
  cmd_t c;
  cmd_init(&c, "ck");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_job(&c, "6", "2");
  cmd_add(&c, "--checkpoint.enable=true");
  cmd_add(&c, "--checkpoint.interval");
  cmd_add(&c, "2");
  char* out;
  char* err;
  ck_assert_int_eq(run_job("ck", c.v, NULL, &out, &err, 90, 0), 0);
  free(out);
  free(err);
  char f[800];
  /* a flipped byte in rank 0's file of step 6: only rank 0 reads it */
  snprintf(f, sizeof f, "%s/checkpoint/step-6/rank-00000.bin", c.dump);
  flip_byte(f, 1000);
  /* step 4's other file cut in half */
  snprintf(f, sizeof f, "%s/checkpoint/step-4/rank-00001.bin", c.dump);
  struct stat st;
  ck_assert_int_eq(stat(f, &st), 0);
  ck_assert_int_eq(truncate(f, st.st_size / 2), 0);
  char folder[700];
  snprintf(folder, sizeof folder, "%s/checkpoint", c.dump);
  char* ls[] = {(char*)tp_bin("trainrun"), "ckpt", "ls", folder, NULL};
  ck_assert_int_eq(tp_run("ls", ls, NULL, &out, &err, 30), 0);
  ck_assert_msg(strstr(out, "\n4          truncated "), "%s", out);
  ck_assert_ptr_nonnull(strstr(out, "\n2          complete "));
  free(out);
  free(err);

  /* resume, 8 steps: step 6 and step 4 are skipped, loudly; step 2 loads,
   * and the run trains on to step 8 */
  cmd_init(&c, "ck");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_add(&c, "--max-restarts");
  cmd_add(&c, "1");
  cmd_job(&c, "8", "2");
  cmd_add(&c, "--checkpoint.enable=true");
  cmd_add(&c, "--checkpoint.interval");
  cmd_add(&c, "2");
  ck_assert_int_eq(run_job("resume", c.v, NULL, &out, &err, 90, 0), 0);
  ck_assert_msg(strstr(err,
                       "checkpoint step 6 does not load: cannot load "
                       "checkpoint: '"),
                "%s", err);
  ck_assert_ptr_nonnull(strstr(err, "rank-00000.bin': checksum mismatch"));
  ck_assert_ptr_nonnull(strstr(
      err, "checkpoint step 4 does not load: cannot load checkpoint: '"));
  ck_assert_ptr_nonnull(strstr(err, "rank-00001.bin' is truncated: "));
  char want[900];
  snprintf(want, sizeof want,
           "[rank0]:resumed from '%s/checkpoint/step-2' at step 2, the newest "
           "step that loads: step 6 is damaged (cannot load checkpoint: '",
           c.dump);
  ck_assert_msg(strstr(out, want), "%s", out);
  ck_assert_ptr_nonnull(strstr(out, "[rank0]:step 8/8 | loss "));
  ck_assert_msg(!strstr(err, "restarting the workers"), "%s", err);
  free(out);
  free(err);

  /* nothing that loads: exit 2 at once, naming the newest */
  snprintf(f, sizeof f, "%s/checkpoint/step-2/rank-00000.bin", c.dump);
  unlink(f);
  snprintf(f, sizeof f, "%s/checkpoint/step-8/rank-00001.bin", c.dump);
  flip_byte(f, 100);
  for (int s = 4; s <= 6; s += 2) { /* the steps rewritten: damage again */
    snprintf(f, sizeof f, "%s/checkpoint/step-%d/metadata.json", c.dump, s);
    ck_assert_int_eq(truncate(f, 10), 0);
  }
  ck_assert_int_eq(run_job("none", c.v, NULL, &out, &err, 90, 0), 2);
  snprintf(want, sizeof want,
           "no complete checkpoint in '%s/checkpoint' loads: the newest, "
           "step 8, cannot load checkpoint: '",
           c.dump);
  ck_assert_msg(strstr(err, want), "%s", err);
  ck_assert_ptr_null(strstr(err, "restarting the workers"));
  free(out);
  free(err);
}
END_TEST

/* ---- status, metrics, SIGTERM ---- */

/* GET path from 127.0.0.1:port: the whole answer (malloc()ed). */
static char* http_get(int port, const char* path) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(s, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  ck_assert_int_eq(connect(s, (struct sockaddr*)&a, sizeof a), 0);
  char req[256];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path);
  ck_assert_int_eq(write(s, req, (size_t)n), n);
  size_t cap = 1 << 16, len = 0;
  char* buf = malloc(cap);
  ssize_t r;
  while ((r = read(s, buf + len, cap - 1 - len)) > 0) len += (size_t)r;
  buf[len] = '\0';
  close(s);
  return buf;
}

/* Check the Prometheus text exposition format line by line: "# HELP name
 * text" and "# TYPE name gauge|counter" before a family's samples, each
 * sample `name{label="value",...} number`. Returns the value of the sample
 * `name{...rank="r"...}`, NaN when absent. */
static double prom_value(const char* body, const char* name, int rank) {
  double found = NAN;
  char typed[128] = "";
  const char* p = body;
  while (*p) {
    const char* e = strchr(p, '\n');
    ck_assert_msg(e != NULL, "the last line has no newline");
    char line[1024];
    size_t n = (size_t)(e - p);
    ck_assert_uint_lt(n, sizeof line);
    memcpy(line, p, n);
    line[n] = '\0';
    p = e + 1;
    if (strncmp(line, "# HELP ", 7) == 0) continue;
    if (strncmp(line, "# TYPE ", 7) == 0) {
      char t[32];
      ck_assert_int_eq(sscanf(line + 7, "%127s %31s", typed, t), 2);
      ck_assert(strcmp(t, "gauge") == 0 || strcmp(t, "counter") == 0);
      continue;
    }
    /* a sample: metric name, labels, value */
    size_t nl = strspn(line, "abcdefghijklmnopqrstuvwxyz_:0123456789");
    ck_assert_msg(nl > 0 && line[nl] == '{', "bad sample line '%s'", line);
    ck_assert_msg(strncmp(line, typed, nl) == 0 && typed[nl] == '\0',
                  "sample '%s' without its # TYPE line", line);
    char* close_b = strstr(line, "} ");
    ck_assert_msg(close_b != NULL, "bad labels in '%s'", line);
    for (char* l = line + nl + 1; l < close_b;) {
      size_t ln = strspn(l, "abcdefghijklmnopqrstuvwxyz_");
      ck_assert_msg(ln > 0 && l[ln] == '=' && l[ln + 1] == '"',
                    "bad label in '%s'", line);
      char* q = l + ln + 2;
      while (*q && *q != '"') q += *q == '\\' ? 2 : 1;
      ck_assert_msg(*q == '"', "unterminated label in '%s'", line);
      l = q + 1;
      if (*l == ',') l++;
    }
    char* end;
    const char* vs = close_b + 2;
    double v = strcmp(vs, "NaN") == 0 ? NAN : strtod(vs, &end);
    if (strcmp(vs, "NaN") != 0)
      ck_assert_msg(*end == '\0', "bad value in '%s'", line);
    char want[64];
    snprintf(want, sizeof want, "rank=\"%d\"", rank);
    if (strncmp(line, name, nl) == 0 && name[nl] == '\0' &&
        (rank < 0 || strstr(line, want)))
      found = v;
  }
  return found;
}

START_TEST(test_status_metrics_sigterm) {
  cmd_t c;
  cmd_init(&c, "live");
  cmd_add(&c, "--standalone");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_add(&c, "--metrics-port");
  cmd_add(&c, "0");
  cmd_add(&c, "--rdzv-id");
  cmd_add(&c, "live\"job");
  cmd_job(&c, "1000", "2");
  cmd_add(&c, "--debug.fault");
  cmd_add(&c, "slow:ms=60");
  if (have_checkpoints()) {
    cmd_add(&c, "--checkpoint.enable=true");
    cmd_add(&c, "--checkpoint.interval");
    cmd_add(&c, "1000");
  }
  tp_proc_t p;
  tp_proc_start(&p, "live", c.v, NULL);
  tp_wait_text(p.err, "/metrics\n", 30);
  char* e = tp_slurp(p.err);
  const char* m = strstr(e, "trainrun: metrics at http://");
  ck_assert_ptr_nonnull(m);
  const char* colon = strchr(m + strlen("trainrun: metrics at http://"), ':');
  int port = atoi(colon + 1);
  free(e);
  ck_assert_int_gt(port, 0);
  /* until both ranks finished step 2 */
  char* body = NULL;
  double t0 = tp_now_s();
  for (;;) {
    body = http_get(port, "/metrics");
    char* b = strstr(body, "\r\n\r\n");
    ck_assert_ptr_nonnull(b);
    double s0 = prom_value(b + 4, "trainrun_rank_step", 0);
    double s1 = prom_value(b + 4, "trainrun_rank_step", 1);
    if (s0 >= 2 && s1 >= 2) break;
    ck_assert_msg(tp_now_s() - t0 < 40, "no step 2 in:\n%s", body);
    free(body);
    usleep(50000);
  }
  ck_assert_ptr_nonnull(strstr(body, "HTTP/1.1 200 OK\r\n"));
  ck_assert_ptr_nonnull(
      strstr(body, "Content-Type: text/plain; version=0.0.4"));
  const char* b = strstr(body, "\r\n\r\n") + 4;
  for (int r = 0; r < 2; r++) {
    ck_assert_double_eq(prom_value(b, "trainrun_rank_up", r), 1);
    double loss = prom_value(b, "trainrun_rank_loss", r);
    ck_assert_msg(loss > 0.5 && loss < 10, "loss %g", loss);
    ck_assert_double_gt(prom_value(b, "trainrun_rank_tokens_per_second", r), 0);
    ck_assert_double_eq(prom_value(b, "trainrun_rank_total_steps", r), 1000);
    ck_assert_double_lt(
        prom_value(b, "trainrun_rank_last_heartbeat_age_seconds", r), 5);
    double ts =
        prom_value(b, "trainrun_rank_last_heartbeat_timestamp_seconds", r);
    ck_assert_double_lt(fabs(ts - (double)time(NULL)), 30);
  }
  ck_assert_double_eq(prom_value(b, "trainrun_round", -1), 0);
  ck_assert_double_eq(prom_value(b, "trainrun_world_size", -1), 2);
  ck_assert_ptr_nonnull(strstr(b, "run_id=\"live\\\"job\""));
  free(body);
  body = http_get(port, "/nothing");
  ck_assert_ptr_nonnull(strstr(body, "HTTP/1.1 404 Not Found\r\n"));
  free(body);

  /* trainrun status: both ranks with step, loss, tokens/s, heartbeat */
  char tmp_env[700];
  snprintf(tmp_env, sizeof tmp_env, "TMPDIR=%s", tp_tmpdir);
  char* env[] = {tmp_env, NULL};
  char* sa[] = {(char*)tp_bin("trainrun"), "status", NULL};
  char* out;
  char* err;
  ck_assert_int_eq(tp_run("status", sa, env, &out, &err, 20), 0);
  ck_assert_ptr_nonnull(strstr(out, "run 'live\"job', running\n"));
  ck_assert_ptr_nonnull(strstr(out, "node 0: '"));
  for (int r = 0; r < 2; r++) {
    char k[64];
    snprintf(k, sizeof k, "  rank %d (local rank %d, pid ", r, r);
    const char* line = strstr(out, k);
    ck_assert_msg(line != NULL, "%s", out);
    long long step, total;
    double loss, tps, age;
    const char* at = strstr(line, ", step ");
    ck_assert_ptr_nonnull(at);
    ck_assert_int_eq(sscanf(at, ", step %lld/%lld", &step, &total), 2);
    at = strstr(at, ", loss ");
    ck_assert_ptr_nonnull(at);
    ck_assert_int_eq(sscanf(at,
                            ", loss %lf, %lf tokens/s, last heartbeat %lfs "
                            "ago",
                            &loss, &tps, &age),
                     3);
    ck_assert_msg(loss > 0.5 && loss < 10, "loss %g", loss);
    ck_assert_int_ge(step, 2);
    ck_assert_int_eq(total, 1000);
    ck_assert_double_gt(tps, 0);
    ck_assert_double_lt(age, 5);
  }
  free(out);
  free(err);

  /* SIGTERM: every rank stops after its step, exit 0 */
  kill(p.pid, SIGTERM);
  ck_assert_int_eq(tp_proc_finish(&p, 60), 0);
  out = tp_slurp(p.out);
  err = tp_slurp(p.err);
  ck_assert_msg(strstr(err,
                       "trainrun: got SIGTERM: stopping every rank after "
                       "its current step"),
                "%s", err);
  ck_assert_msg(strstr(out, "[rank0]:stopping after step "), "%s", out);
  char f[800];
  struct stat st;
  snprintf(f, sizeof f, "%s/model.safetensors", c.dump);
  ck_assert_int_eq(stat(f, &st), 0);
  if (have_checkpoints()) {
    /* the step it stopped after is saved (and complete) */
    const char* s = strstr(out, "[rank0]:stopping after step ");
    int step = atoi(s + strlen("[rank0]:stopping after step "));
    snprintf(f, sizeof f, "%s/checkpoint/step-%d/metadata.json", c.dump, step);
    ck_assert_msg(stat(f, &st) == 0, "no %s", f);
  }
  free(out);
  free(err);
}
END_TEST

START_TEST(test_sighup_single_rank) {
  /* one rank, no daemon: SIGHUP stops after the step, saves, exits 0 */
  cmd_t c;
  cmd_init(&c, "hup");
  cmd_job(&c, "1000", "2");
  cmd_add(&c, "--debug.fault");
  cmd_add(&c, "slow:ms=50");
  cmd_add(&c, "--checkpoint.enable=true");
  cmd_add(&c, "--checkpoint.interval");
  cmd_add(&c, "1000");
  tp_proc_t p;
  tp_proc_start(&p, "hup", c.v, NULL);
  tp_wait_text(p.out, "step 2/1000", 30);
  kill(p.pid, SIGHUP);
  ck_assert_int_eq(tp_proc_finish(&p, 60), 0);
  tp_assert_job_gone(&p, 0);
  char* out = tp_slurp(p.out);
  const char* s = strstr(out, "stopping after step ");
  ck_assert_msg(s && strstr(s, " (SIGHUP)\n"), "%s", out);
  int step = atoi(s + strlen("stopping after step "));
  char f[800];
  struct stat st;
  snprintf(f, sizeof f, "%s/model.safetensors", c.dump);
  ck_assert_int_eq(stat(f, &st), 0);
  snprintf(f, sizeof f, "%s/checkpoint/step-%d/metadata.json", c.dump, step);
  ck_assert_msg(stat(f, &st) == 0, "no %s", f);
  free(out);
}
END_TEST

START_TEST(test_dump_folder_lock) {
  /* job A (2 ranks) holds its dump folder: job B is refused at once,
   * naming A; once A is killed (its lock left behind), job C takes the
   * stale lock over with a warning, and removes it when done */
  cmd_t a;
  cmd_init(&a, "shared");
  cmd_add(&a, "--nproc-per-node");
  cmd_add(&a, "2");
  cmd_job(&a, "1000", "2");
  cmd_add(&a, "--debug.fault");
  cmd_add(&a, "slow:ms=50");
  tp_proc_t pa;
  tp_proc_start(&pa, "A", a.v, NULL);
  tp_wait_text(pa.out, "[rank0]:step 1/1000", 30);
  cmd_t b;
  cmd_init(&b, "shared");
  cmd_job(&b, "2", "2");
  char* out;
  char* err;
  ck_assert_int_eq(run_job("B", b.v, NULL, &out, &err, 30, 0), 2);
  char want[800];
  snprintf(want, sizeof want,
           "trainrun: the dump folder '%s' is in use by another job (pid %d "
           "on host '",
           a.dump, (int)pa.pid);
  ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s", err);
  snprintf(want, sizeof want,
           "): give this job another job.dump_folder, or remove "
           "'%s/trainrun.lock' if that job is gone\n",
           a.dump);
  ck_assert_ptr_nonnull(strstr(err, want));
  ck_assert_str_eq(out, "");
  free(out);
  free(err);

  kill(pa.pid, SIGKILL); /* its workers die with it; the lock stays */
  ck_assert_int_eq(tp_proc_finish(&pa, 30), 128 + SIGKILL);
  /* so does its status socket, which `trainrun status` removes */
  char* st_argv[] = {(char*)tp_bin("trainrun"), "status", NULL};
  tp_run("status", st_argv, NULL, &out, &err, 20);
  free(out);
  free(err);
  tp_assert_job_gone(&pa, 0);
  char lock[700];
  snprintf(lock, sizeof lock, "%s/trainrun.lock", a.dump);
  struct stat st;
  ck_assert_int_eq(stat(lock, &st), 0);
  ck_assert_int_eq(run_job("C", b.v, NULL, &out, &err, 60, 0), 0);
  snprintf(want, sizeof want,
           "WARN launch: taking over the lock of '%s': its owner, pid %d "
           "(since ",
           a.dump, (int)pa.pid);
  ck_assert_msg(strstr(err, want), "%s", err);
  ck_assert_ptr_nonnull(strstr(out, "step 2/2 | loss "));
  ck_assert_int_eq(stat(lock, &st), -1);
  free(out);
  free(err);
}
END_TEST

/* ---- many nodes on loopback ---- */

/* Run `nodes` trainrun processes of `nproc` workers each for a job of
 * global batch 8, 3 steps, with --nnodes and --rdzv-endpoint when flags
 * has F_ENDPOINT; env_fn(k, ...) fills node k's extra env (up to 4
 * entries). The losses of rank 0 into loss[3]. */
typedef void (*node_env_fn)(int k, int nodes, int port, char** env);

static void run_nodes(const char* tag, int nodes, int nproc, int flags,
                      node_env_fn env_fn, double* loss) {
  enum { F_ENDPOINT = 1 };
  int port = tp_free_port();
  char ep[64], nn[16], np[16], batch[16];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
  snprintf(nn, sizeof nn, "%d", nodes);
  snprintf(np, sizeof np, "%d", nproc);
  snprintf(batch, sizeof batch, "%d", 8 / (nodes * nproc));
  tp_proc_t p[8];
  cmd_t c[8];
  char envs[8][4][128];
  for (int k = 0; k < nodes; k++) {
    char t[64];
    snprintf(t, sizeof t, "%s%d", tag, k);
    cmd_init(&c[k], t);
    if (flags & F_ENDPOINT) {
      cmd_add(&c[k], "--nnodes");
      cmd_add(&c[k], nn);
      cmd_add(&c[k], "--rdzv-endpoint");
      cmd_add(&c[k], ep);
    }
    cmd_add(&c[k], "--nproc-per-node");
    cmd_add(&c[k], np);
    cmd_job(&c[k], "3", batch);
    char* env[5] = {NULL};
    for (int i = 0; i < 4; i++) envs[k][i][0] = '\0';
    if (env_fn) {
      char* slots[4] = {envs[k][0], envs[k][1], envs[k][2], envs[k][3]};
      env_fn(k, nodes, port, slots);
      int n = 0;
      for (int i = 0; i < 4; i++)
        if (envs[k][i][0]) env[n++] = envs[k][i];
    }
    tp_proc_start(&p[k], t, c[k].v, env);
  }
  for (int k = 0; k < nodes; k++) {
    int rc = tp_proc_finish(&p[k], 90);
    char* err = tp_slurp(p[k].err);
    char* out = tp_slurp(p[k].out);
    ck_assert_msg(rc == 0, "%s node %d: rc %d\n%s\n%s", tag, k, rc, out, err);
    free(err);
    free(out);
  }
  /* rank 0 wrote the metrics: find the node that ran it */
  int found = 0;
  for (int k = 0; k < nodes && !found; k++) {
    char f[800];
    struct stat st;
    snprintf(f, sizeof f, "%s/metrics.jsonl", c[k].dump);
    if (stat(f, &st) != 0) continue;
    for (int s = 1; s <= 3; s++) loss[s - 1] = tp_loss_at(c[k].dump, s);
    found = 1;
  }
  ck_assert_msg(found, "%s: no node wrote metrics.jsonl", tag);
}

static void one_process(double* loss) {
  cmd_t c;
  cmd_init(&c, "single");
  cmd_job(&c, "3", "8");
  char* out;
  char* err;
  ck_assert_int_eq(tp_run("single", c.v, NULL, &out, &err, 60), 0);
  free(out);
  free(err);
  for (int s = 1; s <= 3; s++) loss[s - 1] = tp_loss_at(c.dump, s);
  ck_assert_double_lt(loss[2], loss[0] - 0.3); /* it trained */
}

static void same_losses(const char* what, const double* a, const double* b) {
  for (int i = 0; i < 3; i++) {
    double rel = fabs(a[i] - b[i]) / fabs(b[i]);
    ck_assert_msg(rel <= 1e-5,
                  "%s: step %d: loss %.12g, one process %.12g (relative "
                  "difference %.3g)",
                  what, i + 1, a[i], b[i], rel);
  }
}

START_TEST(test_eight_nodes_one_rank) {
  double one[3], eight[3];
  one_process(one);
  run_nodes("n8_", 8, 1, 1, NULL, eight);
  same_losses("8 nodes x 1 rank", eight, one);
}
END_TEST

/* Slurm's srun: every node the same flags, its place from the env. */
static void slurm_env(int k, int nodes, int port, char** env) {
  snprintf(env[0], 128, "SLURM_STEP_NUM_NODES=%d", nodes);
  snprintf(env[1], 128, "SLURM_NODEID=%d", k);
  snprintf(env[2], 128, "SLURM_STEP_NODELIST=localhost");
  snprintf(env[3], 128, "SLURM_JOB_ID=sj%d", port);
}

/* Open MPI's mpirun: ranks on this host; the endpoint from MASTER_*. */
static void ompi_env(int k, int nodes, int port, char** env) {
  snprintf(env[0], 128, "OMPI_COMM_WORLD_SIZE=%d", nodes);
  snprintf(env[1], 128, "OMPI_COMM_WORLD_RANK=%d", k);
  snprintf(env[2], 128, "OMPI_COMM_WORLD_LOCAL_SIZE=%d", nodes);
  snprintf(env[3], 128, "MASTER_PORT=%d", port);
}

static int port_29500_free(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(29500);
  int one_ = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one_, sizeof one_);
  int busy = bind(s, (struct sockaddr*)&a, sizeof a) != 0;
  close(s);
  return !busy;
}

START_TEST(test_two_by_two_slurm_mpirun) {
  double one[3], got[3];
  one_process(one);
  /* 2 nodes x 2 ranks as srun starts them (srun's port is trainrun's
   * default 29500: with flags when another program holds it) */
  if (port_29500_free()) {
    run_nodes("slurm_", 2, 2, 0, slurm_env, got);
    same_losses("Slurm-style, 2 nodes x 2 ranks", got, one);
  } else {
    fprintf(stderr, "port 29500 is in use: 2 x 2 with flags, not srun's\n");
    run_nodes("n2x2_", 2, 2, 1, NULL, got);
    same_losses("2 nodes x 2 ranks", got, one);
  }
  run_nodes("mpi_", 4, 1, 0, ompi_env, got);
  same_losses("mpirun-style, 4 processes", got, one);
}
END_TEST

/* ---- a node lost below MIN; errors ---- */

START_TEST(test_lost_node_below_min) {
  /* --nnodes 2: node B's daemon dies; A notices within the heartbeat
   * limit and stops (MIN 2 cannot be met), naming the node */
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", tp_free_port());
  char conf[] =
      "keep_alive_interval=0.2,keep_alive_max_attempt=5,is_host=false";
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nnodes",
                  "2",
                  "--max-restarts",
                  "3",
                  "--rdzv-endpoint",
                  ep,
                  "--rdzv-conf",
                  conf + 0,
                  NULL,
                  (char*)tp_bin("tests/fake_worker"),
                  "--hang",
                  NULL};
  char conf_a[] = "keep_alive_interval=0.2,keep_alive_max_attempt=5";
  tp_proc_t p[2];
  argv[8] = conf_a;
  argv[9] = "--node-rank=0";
  tp_proc_start(&p[0], "minA", argv, NULL);
  argv[8] = conf;
  argv[9] = "--node-rank=1";
  tp_proc_start(&p[1], "minB", argv, NULL);
  /* both nodes' workers run once B's daemon says so */
  char tmp_env[700];
  snprintf(tmp_env, sizeof tmp_env, "TMPDIR=%s", tp_tmpdir);
  char* env[] = {tmp_env, NULL};
  char* sa[] = {(char*)tp_bin("trainrun"), "status", NULL};
  double t0 = tp_now_s();
  for (;;) {
    char* out;
    char* err;
    tp_run("st", sa, env, &out, &err, 20);
    int n = 0;
    for (const char* q = out; (q = strstr(q, "): running for ")); q++) n++;
    free(out);
    free(err);
    if (n == 2) break;
    ck_assert_msg(tp_now_s() - t0 < 20, "the two workers never ran");
    usleep(50000);
  }
  t0 = tp_now_s();
  kill(p[1].pid, SIGKILL);
  ck_assert_int_eq(tp_proc_finish(&p[1], 20), 128 + SIGKILL);
  ck_assert_int_eq(tp_proc_finish(&p[0], 30), 1);
  double took = tp_now_s() - t0;
  char* err = tp_slurp(p[0].err);
  ck_assert_msg(strstr(err, "trainrund: node 1 '"), "%s", err);
  ck_assert_ptr_nonnull(strstr(err, "' stopped sending heartbeats"));
  ck_assert_ptr_nonnull(strstr(err,
                               "1 of the round's 2 nodes remain, fewer than "
                               "the 2 that --nnodes 2:2 needs: stopping\n"));
  ck_assert_ptr_null(strstr(err, "restarting"));
  ck_assert_msg(took < 10, "took %.1fs", took);
  free(err);
}
END_TEST

START_TEST(test_clear_errors) {
  char* out;
  char* err;
  cmd_t c;
  /* nothing listens at the endpoint */
  int closed = tp_free_port();
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", closed);
  char* a[] = {(char*)tp_bin("trainrun"),
               "--nnodes",
               "2",
               "--rdzv-endpoint",
               ep,
               "--rdzv-conf",
               "is_host=false,join_timeout=1",
               "--exec",
               "/bin/true",
               NULL};
  ck_assert_int_eq(tp_run("unreach", a, NULL, &out, &err, 30), 1);
  char want[200];
  snprintf(want, sizeof want,
           "trainrun: cannot reach the rendezvous store at %s: timed out "
           "(is the node that hosts it up?)\n",
           ep);
  ck_assert_msg(strstr(err, want), "%s", err);
  free(out);
  free(err);
  /* --metrics-port on a port in use */
  int busy_fd;
  int busy = tp_port_on_loopback(1, &busy_fd);
  char bp[16];
  snprintf(bp, sizeof bp, "%d", busy);
  cmd_init(&c, "busy");
  cmd_add(&c, "--metrics-port");
  cmd_add(&c, bp);
  cmd_add(&c, "--exec");
  cmd_add(&c, "/bin/true");
  ck_assert_int_eq(tp_run("busy", c.v, NULL, &out, &err, 30), 1);
  snprintf(want, sizeof want,
           "trainrun: --metrics-port %d: cannot listen: address already in "
           "use\n",
           busy);
  ck_assert_str_eq(err, want);
  /* ... and at the rendezvous endpoint: no store answers there */
  snprintf(ep, sizeof ep, "127.0.0.1:%d", busy);
  char* b[] = {(char*)tp_bin("trainrun"),
               "--nnodes",
               "2",
               "--rdzv-endpoint",
               ep,
               "--rdzv-conf",
               "join_timeout=1",
               "--exec",
               "/bin/true",
               NULL};
  free(out);
  free(err);
  ck_assert_int_eq(tp_run("inuse", b, NULL, &out, &err, 30), 1);
  snprintf(want, sizeof want,
           "trainrun: the rendezvous endpoint %s is in use by a program that "
           "is not a trainrun store (timed out): pick another port\n",
           ep);
  ck_assert_msg(strstr(err, want), "%s", err);
  close(busy_fd);
  free(out);
  free(err);
  /* bad flags and specs, refused before any worker starts */
  struct {
    const char* flag;
    const char* value;
    const char* want;
  } bad[] = {
      {"--worker-timeout", "soon",
       "trainrun: --worker-timeout: expected seconds (0 to 604800; 0: off), "
       "got 'soon'\n"},
      {"--metrics-port", "70000",
       "trainrun: --metrics-port: expected a port 0 to 65535 (0: any free "
       "one), got '70000'\n"},
      {"--debug.fault", "kill:rnk=1:step=2",
       "trainrun: debug.fault 'kill:rnk=1:step=2': 'rnk' is no field of kill "
       "(rank, step, restart)\n"},
      {"--debug.fault", "kill:rank=2:step=2",
       "trainrun: debug.fault 'kill:rank=2:step=2': rank 2 is not below the "
       "world size 2\n"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cmd_init(&c, "bad");
    cmd_add(&c, "--nproc-per-node");
    cmd_add(&c, "2");
    if (strncmp(bad[i].flag, "--debug", 7) != 0) {
      cmd_add(&c, bad[i].flag);
      cmd_add(&c, bad[i].value);
    }
    cmd_job(&c, "2", "1");
    if (strncmp(bad[i].flag, "--debug", 7) == 0) {
      cmd_add(&c, bad[i].flag);
      cmd_add(&c, bad[i].value);
    }
    ck_assert_int_eq(tp_run("bad", c.v, NULL, &out, &err, 30), 2);
    ck_assert_str_eq(err, bad[i].want);
    ck_assert_str_eq(out, "");
    free(out);
    free(err);
  }
}
END_TEST

/* tcase_add_test, but with SUPER_TEST=name in the environment only that
 * test (to run one while working on it). */
static void add(TCase* tc, const TTest* t) {
  const char* only = getenv("SUPER_TEST");
  if (!only || !*only || strcmp(only, t->name) == 0) tcase_add_test(tc, t);
}

START_TEST(test_busy_endpoint) {
  /* job A hosts its store at an endpoint; job B (another run id) given the
   * same endpoint stops at once naming A, well within its join_timeout */
  int port = tp_free_port();
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
  char* a[] = {(char*)tp_bin("trainrun"),
               "--nnodes",
               "1",
               "--rdzv-endpoint",
               ep,
               "--rdzv-id",
               "jobA",
               "--exec",
               "/bin/sleep",
               "60",
               NULL};
  tp_proc_t pa;
  tp_proc_start(&pa, "A", a, NULL);
  char tmp_env[700];
  snprintf(tmp_env, sizeof tmp_env, "TMPDIR=%s", tp_tmpdir);
  char* env[] = {tmp_env, NULL};
  char* sa[] = {(char*)tp_bin("trainrun"), "status", NULL};
  double t0 = tp_now_s();
  for (;;) { /* until A's worker runs */
    char* out;
    char* err;
    tp_run("st", sa, env, &out, &err, 20);
    int up = strstr(out, "): running for ") != NULL;
    free(out);
    free(err);
    if (up) break;
    ck_assert_msg(tp_now_s() - t0 < 20, "job A never ran");
    usleep(50000);
  }
  char* b[] = {(char*)tp_bin("trainrun"),
               "--nnodes",
               "1",
               "--rdzv-endpoint",
               ep,
               "--rdzv-id",
               "jobB",
               "--rdzv-conf",
               "join_timeout=8",
               "--exec",
               "/bin/true",
               NULL};
  char* out;
  char* err;
  t0 = tp_now_s();
  ck_assert_int_eq(run_job("B", b, NULL, &out, &err, 30, 0), 1);
  double took = tp_now_s() - t0;
  char want[300];
  snprintf(want, sizeof want,
           "trainrun: the rendezvous endpoint %s is held by another job: run "
           "'jobA' (its store is hosted by pid %d on host '",
           ep, (int)pa.pid);
  ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s", err);
  ck_assert_ptr_nonnull(strstr(err,
                               "); give this job another --rdzv-endpoint "
                               "port, or the same --rdzv-id to join that "
                               "job\n"));
  ck_assert_msg(took < 8, "took %.1fs", took);
  free(out);
  free(err);
  /* A runs on; stopped, it leaves nothing, its port included */
  ck_assert_int_eq(waitpid(pa.pid, NULL, WNOHANG), 0);
  kill(pa.pid, SIGTERM);
  ck_assert_int_eq(tp_proc_finish(&pa, 30), 0);
  tp_assert_job_gone(&pa, port);
}
END_TEST

/* ---- errors found before the work ---- */

/* Make folder read-only for this process: immutable (root ignores
 * permissions; ext4 and others honour FS_IMMUTABLE_FL even for root), else
 * mode 0555 when we are not root. 1 when it worked; undo with
 * read_only(folder, 0). */
static int read_only(const char* folder, int on) {
  int fd = open(folder, O_RDONLY | O_DIRECTORY);
  ck_assert_int_ge(fd, 0);
  int flags = 0, ok = 0;
  if (ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
    flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
    ok = ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
  }
  close(fd);
  if (!ok && geteuid() != 0) ok = chmod(folder, on ? 0555 : 0755) == 0;
  return ok;
}

START_TEST(test_errors_before_work) {
  /* each is refused with exit code 2 and where it came from, before any
   * worker starts (nothing on stdout) and nothing is left behind */
  char* out;
  char* err;
  cmd_t c;
  char want[1200];

  /* an empty dump folder (one rank, no daemon) */
  cmd_init(&c, "empty");
  cmd_job(&c, "2", "2");
  cmd_add(&c, "--job.dump_folder=");
  ck_assert_int_eq(run_job("empty", c.v, NULL, &out, &err, 30, 0), 2);
  ck_assert_str_eq(err,
                   "trainrun: --job.dump_folder: empty; it names the folder "
                   "for checkpoints, metrics and the weights\n");
  ck_assert_str_eq(out, "");
  free(out);
  free(err);

  /* a checkpoint folder that cannot be written (2 ranks: the daemon) */
  cmd_init(&c, "ro");
  char ck[700];
  snprintf(ck, sizeof ck, "%s/checkpoint", c.dump);
  ck_assert_int_eq(mkdir(c.dump, 0755), 0);
  ck_assert_int_eq(mkdir(ck, 0755), 0);
  if (read_only(ck, 1)) {
    cmd_add(&c, "--nproc-per-node");
    cmd_add(&c, "2");
    cmd_job(&c, "2", "2");
    cmd_add(&c, "--checkpoint.enable=true");
    int rc = run_job("ro", c.v, NULL, &out, &err, 30, 0);
    read_only(ck, 0);
    ck_assert_int_eq(rc, 2);
    snprintf(want, sizeof want, "cannot write in '%s': ", ck);
    ck_assert_msg(strncmp(err, "trainrun: ", 10) == 0 && strstr(err, want) &&
                      strstr(err, ": checkpoint.folder: cannot write in"),
                  "%s", err);
    ck_assert_str_eq(out, "");
    free(out);
    free(err);
  } else {
    fprintf(stderr, "no read-only folder here: that case is skipped\n");
  }

  /* a data glob that matches nothing */
  cmd_init(&c, "glob");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_job(&c, "2", "2");
  char glob_arg[700];
  snprintf(glob_arg, sizeof glob_arg, "--training.dataset_path=%s/none*.bin",
           tp_tmpdir);
  cmd_add(&c, glob_arg);
  ck_assert_int_eq(run_job("glob", c.v, NULL, &out, &err, 30, 0), 2);
  snprintf(want, sizeof want,
           "trainrun: --training.dataset_path: no file matches "
           "'%s/none*.bin'\n",
           tp_tmpdir);
  ck_assert_str_eq(err, want);
  ck_assert_str_eq(out, "");
  free(out);
  free(err);

  /* a FIFO as data: refused, not waited on */
  char fifo[700];
  snprintf(fifo, sizeof fifo, "%s/data.fifo", tp_tmpdir);
  ck_assert_int_eq(mkfifo(fifo, 0644), 0);
  cmd_init(&c, "fifo");
  cmd_job(&c, "2", "2");
  char fifo_arg[760];
  snprintf(fifo_arg, sizeof fifo_arg, "--training.dataset_path=%s", fifo);
  cmd_add(&c, fifo_arg);
  ck_assert_int_eq(run_job("fifo", c.v, NULL, &out, &err, 30, 0), 2);
  snprintf(want, sizeof want,
           "trainrun: --training.dataset_path: '%s' is a FIFO, not a data "
           "file\n",
           fifo);
  ck_assert_str_eq(err, want);
  free(out);
  free(err);

  /* training.seq_len = 2^62 in a job file: `trainrun config` refuses it
   * too, with file:line:col */
  char toml[700];
  snprintf(toml, sizeof toml, "%s/big.toml", tp_tmpdir);
  FILE* f = fopen(toml, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "[training]\nseq_len = 4611686018427387904\n");
  fclose(f);
  char* cfg_argv[] = {(char*)tp_bin("trainrun"), "config", toml, NULL};
  ck_assert_int_eq(run_job("seqcfg", cfg_argv, NULL, &out, &err, 30, 0), 2);
  snprintf(want, sizeof want,
           "trainrun: %s:2:11: training.seq_len: too large\n", toml);
  ck_assert_str_eq(err, want);
  free(out);
  free(err);
  cmd_init(&c, "seq");
  cmd_add(&c, "--nproc-per-node");
  cmd_add(&c, "2");
  cmd_add(&c, toml);
  cmd_add(&c, c.dumparg);
  ck_assert_int_eq(run_job("seq", c.v, NULL, &out, &err, 30, 0), 2);
  ck_assert_str_eq(err, want);
  ck_assert_str_eq(out, "");
  free(out);
  free(err);
}
END_TEST

static Suite* super_suite(void) {
  Suite* s = suite_create("super");
  TCase* u = tcase_create("units");
  tcase_add_checked_fixture(u, setup, teardown);
  add(u, test_fault_parse);
  add(u, test_fault_effects);
  add(u, test_heartbeat_page);
  add(u, test_setup_gives_up);
  suite_add_tcase(s, u);
  TCase* p = tcase_create("jobs");
  tcase_add_checked_fixture(p, setup, teardown);
  tcase_set_timeout(p, 120);
  add(p, test_fault_exit_report);
  add(p, test_peer_dies_before_first_collective);
  add(p, test_exit_2_stops_at_once);
  add(p, test_exec_children_killed);
  add(p, test_collective_faults);
  add(p, test_hang_worker_timeout);
  add(p, test_summary_blames_verdict);
  add(p, test_kill_restart_resumes);
  add(p, test_damaged_checkpoint_fallback);
  add(p, test_status_metrics_sigterm);
  add(p, test_sighup_single_rank);
  add(p, test_dump_folder_lock);
  add(p, test_lost_node_below_min);
  add(p, test_clear_errors);
  add(p, test_errors_before_work);
  add(p, test_busy_endpoint);
  add(p, test_eight_nodes_one_rank);
  add(p, test_two_by_two_slurm_mpirun);
  suite_add_tcase(s, p);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(super_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
