/* tests/check_daemon.c: the node daemon and the launcher.
 *
 * Units: launcher flags and their messages, Slurm and Open MPI
 * environments, Slurm host lists, node-rank assignment, node records,
 * worker output streams, CPU lists. Processes: trainrund and trainrun run
 * tests/fake_worker (which prints its environment, exits with a chosen
 * code, kills itself or hangs) on loopback, ports picked by binding port 0:
 * worker environment, output prefixes and log files, --local-ranks-filter,
 * restarts and the final report, signals, two nodes (plain, Slurm-style,
 * mpirun-style), a lost node, start-up time. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "trainrun/daemon.h"
#include "trainrun/error.h"
#include "trainrun/param.h"
#include "tests/procs.h"

/* ---- helpers ---- */

static int count(const char* hay, const char* needle) {
  int n = 0;
  for (const char* p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static char env_quiet[] = "TRAINRUN_LOG_LEVEL=warn"; /* messages are asserted */
static char* env_defaults[] = {env_quiet, NULL};

static void setup(void) {
  tp_env_defaults = env_defaults;
  tp_tmpdir_make("check_daemon");
}
static void teardown(void) { tp_cleanup(); }

/* ---- Slurm host lists ---- */

static void expect_hosts(const char* list, const char* const* want, size_t n) {
  char** h;
  size_t got;
  ck_assert_int_eq(tr_nodelist_expand(list, &h, &got), 0);
  ck_assert_uint_eq(got, n);
  for (size_t i = 0; i < n; i++) ck_assert_str_eq(h[i], want[i]);
  tr_nodelist_free(h, got);
}

START_TEST(test_nodelist_expand) {
  static const char* const a[] = {"node01", "node02", "node03", "node04",
                                  "node07"};
  expect_hosts("node[01-04,07]", a, 5);
  static const char* const b[] = {"login", "gpu3-ib", "gpu4-ib", "x"};
  expect_hosts("login,gpu[3-4]-ib,x", b, 4);
  static const char* const c[] = {"r1-n1", "r1-n2", "r2-n1", "r2-n2"};
  expect_hosts("r[1-2]-n[1-2]", c, 4);
  /* padding follows the first bound */
  static const char* const d[] = {"n8", "n9", "n10", "n098", "n099", "n100"};
  expect_hosts("n[8-10],n[098-100]", d, 6);
  static const char* const e[] = {"127.0.0.1"};
  expect_hosts("127.0.0.1", e, 1);
  static const char* const f[] = {"a5", "b"};
  expect_hosts("a[5],b", f, 2);
}
END_TEST

START_TEST(test_nodelist_first_and_errors) {
  char first[64];
  ck_assert_int_eq(
      tr_nodelist_first("gpu-a[017-020,031],cpu[1-2]", first, sizeof first), 0);
  ck_assert_str_eq(first, "gpu-a017");
  ck_assert_int_eq(tr_nodelist_first("node[01-04]", first, 4), TR_ERANGE);
  static const char* const bad[] = {"",       "node[1-", "node[]", "node[3-1]",
                                    "a,,b",   "a]",      "n[1,]",  "n[1-2",
                                    "n[[1]]", "n[a-b]",  "a,",     "n[1--2]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char** h;
    size_t n;
    ck_assert_msg(tr_nodelist_expand(bad[i], &h, &n) == TR_EINVAL,
                  "'%s' should be refused", bad[i]);
  }
  char** h;
  size_t n;
  ck_assert_int_eq(tr_nodelist_expand("n[0-99999999]", &h, &n), TR_ELIMIT);
}
END_TEST

/* ---- flags ---- */

/* Parse a command line of flags into o; the first error's message. */
static int parse(tr_daemon_opts_t* o, const char* const* args, int n,
                 tr_errmsg_t* err) {
  tr_daemon_opts_init(o);
  tr_errmsg_clear(err);
  for (int i = 0; i < n;) {
    int k = tr_daemon_opts_flag(o, n, (char* const*)args, i, err);
    if (k <= 0) return k < 0 ? k : i;
    i += k;
  }
  return n;
}

START_TEST(test_flags_parse) {
  tr_daemon_opts_t o;
  tr_errmsg_t err;
  const char* a[] = {"--nnodes",
                     "2:4",
                     "--nproc_per_node=3",
                     "--node-rank",
                     "1",
                     "--rdzv-endpoint",
                     "[::1]:29400",
                     "--rdzv-id=job7",
                     "--max-restarts",
                     "5",
                     "--monitor-interval",
                     "0.5",
                     "--local-ranks-filter",
                     "0,2-3",
                     "--tee",
                     "0:1,1:3",
                     "--redirects",
                     "2",
                     "--log-dir",
                     "/tmp/x",
                     "--rdzv-conf",
                     "join_timeout=5,last_call_timeout=1,"
                     "keep_alive_interval=0.5,is_host=0",
                     "--rdzv-backend",
                     "c10d",
                     "job.toml"};
  int n = (int)(sizeof a / sizeof a[0]);
  ck_assert_int_eq(parse(&o, a, n, &err), n - 1); /* stops at the job */
  ck_assert_int_eq(o.nnodes_min, 2);
  ck_assert_int_eq(o.nnodes_max, 4);
  ck_assert_int_eq(o.nproc_per_node, 3);
  ck_assert_int_eq(o.node_rank, 1);
  ck_assert_str_eq(o.rdzv_host, "::1");
  ck_assert_int_eq(o.rdzv_port, 29400);
  ck_assert_str_eq(o.run_id, "job7");
  ck_assert_int_eq(o.max_restarts, 5);
  ck_assert(o.monitor_interval == 0.5);
  ck_assert_int_eq(o.nranks_filter, 3);
  ck_assert_int_eq(o.ranks_filter[0], 0);
  ck_assert_int_eq(o.ranks_filter[1], 2);
  ck_assert_int_eq(o.ranks_filter[2], 3);
  ck_assert_int_eq(tr_daemon_std_for(&o.tee, 0), TR_STD_OUT);
  ck_assert_int_eq(tr_daemon_std_for(&o.tee, 1), TR_STD_ALL);
  ck_assert_int_eq(tr_daemon_std_for(&o.tee, 2), TR_STD_NONE);
  ck_assert_int_eq(tr_daemon_std_for(&o.redirects, 9), TR_STD_ERR);
  ck_assert_str_eq(o.log_dir, "/tmp/x");
  ck_assert(o.join_timeout == 5 && o.last_call_timeout == 1);
  ck_assert(o.keep_alive_interval == 0.5);
  ck_assert_int_eq(o.is_host, 0);
  tr_daemon_opts_release(&o);

  /* a host without a port keeps 29500; --master-addr/--master-port too */
  const char* b[] = {"--rdzv-endpoint", "head", "--standalone"};
  ck_assert_int_eq(parse(&o, b, 3, &err), 3);
  ck_assert_str_eq(o.rdzv_host, "head");
  ck_assert_int_eq(o.rdzv_port, 29500);
  ck_assert_int_eq(o.standalone, 1);
  tr_daemon_opts_release(&o);
  const char* c[] = {"--master-addr=10.0.0.1", "--master-port", "1234"};
  ck_assert_int_eq(parse(&o, c, 3, &err), 3);
  ck_assert_str_eq(o.rdzv_host, "10.0.0.1");
  ck_assert_int_eq(o.rdzv_port, 1234);
  tr_daemon_opts_release(&o);
  /* words */
  const char* d[] = {"--nproc-per-node", "gpu"};
  ck_assert_int_eq(parse(&o, d, 2, &err), 2);
  ck_assert_int_eq(o.nproc_per_node, TR_DAEMON_NPROC_GPU);
  tr_daemon_opts_release(&o);
  /* config overrides and other flags are not the launcher's */
  const char* e[] = {"--training.steps", "5"};
  ck_assert_int_eq(parse(&o, e, 2, &err), 0);
  tr_daemon_opts_release(&o);
}
END_TEST

static void expect_flag_error(const char* flag, const char* value,
                              const char* msg) {
  tr_daemon_opts_t o;
  tr_errmsg_t err;
  const char* a[] = {flag, value};
  ck_assert_int_eq(parse(&o, a, value ? 2 : 1, &err), TR_EINVAL);
  ck_assert_str_eq(err.message, msg);
  tr_daemon_opts_release(&o);
}

START_TEST(test_flags_errors) {
  expect_flag_error("--nnodes", "0",
                    "--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, "
                    "got '0'");
  expect_flag_error("--nnodes", "4:2",
                    "--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, "
                    "got '4:2'");
  expect_flag_error("--nproc-per-node", "many",
                    "--nproc-per-node: expected a number, gpu, cpu or auto, "
                    "got 'many'");
  expect_flag_error("--rdzv-endpoint", "host:99999",
                    "--rdzv-endpoint: expected HOST[:PORT], got "
                    "'host:99999'");
  expect_flag_error("--rdzv-endpoint", ":80",
                    "--rdzv-endpoint: expected HOST[:PORT], got ':80'");
  expect_flag_error("--max-restarts", "-1",
                    "--max-restarts: expected a number >= 0, got '-1'");
  expect_flag_error("--tee", "4",
                    "--tee: expected 0-3 (none, stdout, stderr, both) or "
                    "LOCAL_RANK:0-3,..., got '4'");
  expect_flag_error("--local-ranks-filter", "1,x",
                    "--local-ranks-filter: expected ranks such as 0,2,4-7, "
                    "got '1,x'");
  expect_flag_error("--rdzv-conf", "joint_timeout=3",
                    "--rdzv-conf: unknown key 'joint_timeout' (known: "
                    "join_timeout, last_call_timeout, keep_alive_interval, "
                    "keep_alive_max_attempt, read_timeout, is_host)");
  expect_flag_error("--rdzv-backend", "etcd",
                    "--rdzv-backend: 'etcd' is not supported (trainrun "
                    "rendezvouses through its own TCPStore: c10d or "
                    "static)");
  expect_flag_error("--rdzv-id", "a/b",
                    "--rdzv-id: expected a word without '/' or spaces, got "
                    "'a/b'");
  expect_flag_error("--nnodes", NULL, "--nnodes: missing value");
  expect_flag_error("--standalone=1", NULL, "--standalone takes no value");
}
END_TEST

static void expect_finish_error(const char* const* args, int n,
                                const char* msg) {
  tr_daemon_opts_t o;
  tr_errmsg_t err;
  ck_assert_int_eq(parse(&o, args, n, &err), n);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_CPU, &err),
                   TR_EINVAL);
  ck_assert_str_eq(err.message, msg);
  tr_daemon_opts_release(&o);
}

START_TEST(test_flags_combinations) {
  const char* a[] = {"--nnodes", "2"};
  expect_finish_error(a, 2,
                      "--nnodes 2 needs --rdzv-endpoint HOST:PORT (or a run "
                      "under srun or mpirun)");
  const char* b[] = {"--nnodes", "2", "--standalone"};
  expect_finish_error(b, 3,
                      "--standalone runs one node; it cannot be combined "
                      "with --nnodes 2");
  const char* c[] = {"--nnodes",        "2", "--node-rank", "2",
                     "--rdzv-endpoint", "h"};
  expect_finish_error(c, 6,
                      "--node-rank 2 is not below the 2 nodes of --nnodes");
  /* GPUs are counted from CUDA_VISIBLE_DEVICES when it is set */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  tr_param_reset();
  const char* d[] = {"--nproc-per-node", "gpu"};
  expect_finish_error(d, 2,
                      "--nproc-per-node gpu: no GPU found (none in "
                      "/proc/driver/nvidia/gpus or CUDA_VISIBLE_DEVICES)");
  setenv("CUDA_VISIBLE_DEVICES", "3,1,2", 1);
  tr_param_reset();
  tr_daemon_opts_t o;
  tr_errmsg_t err;
  ck_assert_int_eq(parse(&o, d, 2, &err), 2);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_CPU, &err), 0);
  ck_assert_int_eq(o.nproc_per_node, 3);
  tr_daemon_opts_release(&o);
  /* defaults: CPU jobs run one worker, "auto" every GPU */
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_CPU, &err), 0);
  ck_assert_int_eq(o.nproc_per_node, 1);
  ck_assert_str_eq(o.run_id, "none");
  tr_daemon_opts_release(&o);
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_AUTO, &err), 0);
  ck_assert_int_eq(o.nproc_per_node, 3);
  tr_daemon_opts_release(&o);
  setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
  tr_param_reset();
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_AUTO, &err), 0);
  ck_assert_int_eq(o.nproc_per_node, 1);
  tr_daemon_opts_release(&o);
  unsetenv("CUDA_VISIBLE_DEVICES");
  tr_param_reset();
}
END_TEST

/* ---- cluster environments ---- */

static void clear_cluster_env(void) {
  static const char* const vars[] = {"SLURM_STEP_NUM_NODES",
                                     "SLURM_STEP_NUM_TASKS",
                                     "SLURM_STEP_NODELIST",
                                     "SLURM_JOB_NODELIST",
                                     "SLURM_NODEID",
                                     "SLURM_PROCID",
                                     "SLURM_JOB_ID",
                                     "SLURM_NNODES",
                                     "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_RANK",
                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                     "MASTER_ADDR",
                                     "MASTER_PORT"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  tr_param_reset();
}

START_TEST(test_env_slurm) {
  clear_cluster_env();
  setenv("SLURM_STEP_NUM_NODES", "4", 1);
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  setenv("SLURM_STEP_NODELIST", "gpu[07-09,12]", 1);
  setenv("SLURM_JOB_NODELIST", "other[1-9]", 1);
  setenv("SLURM_NODEID", "2", 1);
  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_JOB_ID", "4242", 1);
  tr_param_reset();
  tr_daemon_opts_t o;
  tr_errmsg_t err;
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_CPU, &err), 0);
  ck_assert_str_eq(o.env_source, "slurm");
  ck_assert_int_eq(o.nnodes_min, 4);
  ck_assert_int_eq(o.nnodes_max, 4);
  ck_assert_int_eq(o.node_rank, 2);
  ck_assert_str_eq(o.rdzv_host, "gpu07");
  ck_assert_int_eq(o.rdzv_port, 29500);
  ck_assert_str_eq(o.run_id, "4242");
  tr_daemon_opts_release(&o);

  /* flags win over the environment */
  const char* a[] = {"--nnodes", "2",         "--rdzv-endpoint",
                     "h:7",      "--rdzv-id", "x"};
  ck_assert_int_eq(parse(&o, a, 6, &err), 6);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), 0);
  ck_assert_int_eq(o.nnodes_max, 2);
  ck_assert_int_eq(o.node_rank, 2);
  ck_assert_str_eq(o.rdzv_host, "h");
  ck_assert_int_eq(o.rdzv_port, 7);
  ck_assert_str_eq(o.run_id, "x");
  tr_daemon_opts_release(&o);

  /* 8 tasks on 2 nodes: every task is a node with one worker */
  setenv("SLURM_STEP_NUM_NODES", "2", 1);
  setenv("SLURM_STEP_NUM_TASKS", "8", 1);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NODEID", "1", 1);
  tr_param_reset();
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_GPU, &err), 0);
  ck_assert_int_eq(o.nnodes_max, 8);
  ck_assert_int_eq(o.node_rank, 5);
  ck_assert_int_eq(o.nproc_per_node, 1);
  tr_daemon_opts_release(&o);

  /* one node under srun: a private store, not port 29500 of the host */
  setenv("SLURM_STEP_NUM_NODES", "1", 1);
  setenv("SLURM_STEP_NUM_TASKS", "1", 1);
  setenv("SLURM_NODEID", "0", 1);
  setenv("SLURM_PROCID", "0", 1);
  tr_param_reset();
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_CPU, &err), 0);
  ck_assert_ptr_null(o.rdzv_host);
  ck_assert_int_eq(o.nnodes_max, 1);
  ck_assert_int_eq(o.node_rank, 0);
  tr_daemon_opts_release(&o);

  /* a bad host list names the variable */
  setenv("SLURM_STEP_NODELIST", "gpu[07-", 1);
  tr_param_reset();
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), TR_EINVAL);
  ck_assert_str_eq(err.message,
                   "SLURM_STEP_NODELIST: cannot read the first host of "
                   "'gpu[07-' (give --rdzv-endpoint HOST:PORT)");
  tr_daemon_opts_release(&o);

  /* an allocation without an srun step is not a multi-node run */
  clear_cluster_env();
  setenv("SLURM_NNODES", "4", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-4]", 1);
  tr_param_reset();
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), 0);
  ck_assert_ptr_null(o.env_source);
  ck_assert_int_eq(o.nnodes_max, 1);
  ck_assert_ptr_null(o.rdzv_host);
  tr_daemon_opts_release(&o);
  clear_cluster_env();
}
END_TEST

START_TEST(test_env_openmpi) {
  clear_cluster_env();
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  setenv("MASTER_ADDR", "head", 1);
  setenv("MASTER_PORT", "2222", 1);
  tr_param_reset();
  tr_daemon_opts_t o;
  tr_errmsg_t err;
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), 0);
  ck_assert_str_eq(o.env_source, "openmpi");
  ck_assert_int_eq(o.nnodes_max, 4);
  ck_assert_int_eq(o.node_rank, 3);
  ck_assert_str_eq(o.rdzv_host, "head");
  ck_assert_int_eq(o.rdzv_port, 2222);
  tr_daemon_opts_release(&o);
  /* across hosts without MASTER_ADDR: ask for the endpoint */
  unsetenv("MASTER_ADDR");
  tr_param_reset();
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), TR_EINVAL);
  ck_assert_str_eq(err.message,
                   "under mpirun across hosts the rendezvous host is "
                   "unknown: give --rdzv-endpoint HOST:PORT, or export "
                   "MASTER_ADDR (mpirun -x MASTER_ADDR=HOST)");
  tr_daemon_opts_release(&o);
  /* every process on this host: loopback, one worker each */
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  tr_param_reset();
  ck_assert_int_eq(parse(&o, NULL, 0, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_from_env(&o, &err), 0);
  ck_assert_int_eq(tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_GPU, &err), 0);
  ck_assert_str_eq(o.rdzv_host, "127.0.0.1");
  ck_assert_int_eq(o.nproc_per_node, 1);
  tr_daemon_opts_release(&o);
  clear_cluster_env();
}
END_TEST

/* ---- rendezvous pieces ---- */

START_TEST(test_assign_ranks) {
  tr__rdzv_node_t n[4];
  memset(n, 0, sizeof n);
  const char* hosts[] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; i++) {
    n[i].host = (char*)hosts[i];
    n[i].want_rank = n[i].prev_rank = -1;
  }
  int r[4];
  tr_errmsg_t err;
  /* order of arrival */
  ck_assert_int_eq(tr__rdzv_assign(n, 4, r, &err), 0);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(r[i], i);
  /* --node-rank first, earlier ranks next, the rest fill the gaps */
  n[0].want_rank = 3;
  n[2].prev_rank = 0;
  ck_assert_int_eq(tr__rdzv_assign(n, 4, r, &err), 0);
  ck_assert_int_eq(r[0], 3);
  ck_assert_int_eq(r[2], 0);
  ck_assert_int_eq(r[1], 1);
  ck_assert_int_eq(r[3], 2);
  /* an earlier rank taken by a --node-rank is given up */
  n[3].want_rank = 0;
  ck_assert_int_eq(tr__rdzv_assign(n, 4, r, &err), 0);
  ck_assert_int_eq(r[3], 0);
  ck_assert_int_eq(r[0], 3);
  ck_assert_int_eq(r[1], 1);
  ck_assert_int_eq(r[2], 2);
  /* clashes and ranks out of range are refused, naming the nodes */
  n[1].want_rank = 3;
  ck_assert_int_eq(tr__rdzv_assign(n, 4, r, &err), TR_EINVAL);
  ck_assert_str_eq(err.message,
                   "nodes 'a' and 'b' both asked for --node-rank 3");
  n[1].want_rank = 4;
  ck_assert_int_eq(tr__rdzv_assign(n, 4, r, &err), TR_EINVAL);
  ck_assert_str_eq(err.message,
                   "node 'b' asked for --node-rank 4 but the round has 4 "
                   "nodes");
}
END_TEST

START_TEST(test_node_record) {
  tr__rdzv_node_t a = {0}, b;
  a.host = "gpu-node-17";
  a.nproc = 8;
  a.want_rank = 3;
  a.prev_rank = -1;
  a.pid = 4242;
  a.gpus = 8;
  a.nnodes_min = 2;
  a.nnodes_max = 4;
  char* s = tr__rdzv_node_encode(&a);
  ck_assert_int_eq(tr__rdzv_node_decode(s, strlen(s), &b), 0);
  ck_assert_str_eq(b.host, "gpu-node-17");
  ck_assert_int_eq(b.nproc, 8);
  ck_assert_int_eq(b.want_rank, 3);
  ck_assert_int_eq(b.prev_rank, -1);
  ck_assert_int_eq(b.pid, 4242);
  ck_assert_int_eq(b.nnodes_min, 2);
  ck_assert_int_eq(b.nnodes_max, 4);
  free(b.host);
  free(s);
  /* bytes from the network are checked */
  static const char* const bad[] = {
      "v=1\nhost=a\nnproc=0\nnmin=1\nnmax=1\n",  /* no workers */
      "v=1\nhost=a\nnproc=1\nnmin=1\n",          /* missing key */
      "v=2\nhost=a\nnproc=1\nnmin=1\nnmax=1\n",  /* unknown version */
      "v=1\nhost=\nnproc=1\nnmin=1\nnmax=1\n",   /* empty host */
      "v=1\nhost=a\nnproc=1x\nnmin=1\nnmax=1\n", /* not a number */
      "v=1\nhost=a\nnproc=1\nnmin=1\nnmax=1",    /* cut short */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(tr__rdzv_node_decode(bad[i], strlen(bad[i]), &b) == TR_EPROTO,
                  "record %zu accepted", i);
}
END_TEST

/* ---- output ---- */

START_TEST(test_stream_prefix_file_tail) {
  int worker[2], console[2];
  ck_assert_int_eq(pipe(worker), 0);
  ck_assert_int_eq(pipe(console), 0);
  fcntl(worker[0], F_SETFL, O_NONBLOCK);
  char path[600];
  snprintf(path, sizeof path, "%s/f.log", tp_tmpdir);
  int file = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  tr__stream_t s;
  tr__tail_t tail = {0};
  tr__stream_init(&s, worker[0], console[1], file, 3);
  const char* a = "one\r\ntwo\nthr";
  ck_assert_int_eq(write(worker[1], a, strlen(a)), (int)strlen(a));
  ck_assert_int_eq(tr__stream_read(&s, &tail), 0);
  const char* b = "ee\n";
  ck_assert_int_eq(write(worker[1], b, strlen(b)), (int)strlen(b));
  ck_assert_int_eq(tr__stream_read(&s, &tail), 0);
  ck_assert_int_eq(write(worker[1], "tail", 4), 4);
  close(worker[1]);
  ck_assert_int_eq(tr__stream_read(&s, &tail), 1); /* EOF: flushed, closed */
  ck_assert_int_eq(s.fd, -1);
  close(console[1]);
  char got[256] = {0};
  ssize_t n = read(console[0], got, sizeof got - 1);
  ck_assert_int_gt(n, 0);
  ck_assert_str_eq(got,
                   "[rank3]:one\r\n[rank3]:two\n[rank3]:three\n[rank3]:tail\n");
  char* f = tp_slurp(path);
  ck_assert_str_eq(f, "one\r\ntwo\nthree\ntail"); /* the bytes as written */
  free(f);
  char* t = tr__tail_format(&tail, "  ");
  ck_assert_str_eq(t, "  one\n  two\n  three\n  tail\n");
  free(t);
  /* the tail keeps the last lines only */
  for (int i = 0; i < 25; i++) {
    char l[16];
    snprintf(l, sizeof l, "l%d", i);
    tr__tail_push(&tail, l, strlen(l));
  }
  t = tr__tail_format(&tail, "");
  ck_assert_int_eq(count(t, "\n"), TR__TAIL_LINES);
  ck_assert_ptr_nonnull(strstr(t, "l15\nl16\n"));
  ck_assert_ptr_nonnull(strstr(t, "l24\n"));
  free(t);
  tr__tail_release(&tail);
  close(console[0]);
}
END_TEST

START_TEST(test_cpulist) {
  cpu_set_t s;
  ck_assert_int_eq(tr__cpulist_parse("0-3,8,10-11\n", &s), 0);
  ck_assert_int_eq(CPU_COUNT(&s), 7);
  ck_assert(CPU_ISSET(8, &s) && CPU_ISSET(11, &s) && !CPU_ISSET(9, &s));
  ck_assert_int_eq(tr__cpulist_parse("3-1", &s), TR_EINVAL);
  ck_assert_int_eq(tr__cpulist_parse("x", &s), TR_EINVAL);
  ck_assert_int_eq(tr__cpulist_parse("", &s), TR_EINVAL);
}
END_TEST

/* ---- processes ---- */

/* Common environment for daemon runs: quick stops. */
static char env_stop[] = "TRAINRUN_STOP_TIMEOUT=2";

START_TEST(test_spawn_env) {
  char* out;
  char* err;
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "3",
                  "--rdzv-id",
                  "envtest",
                  (char*)tp_bin("tests/fake_worker"),
                  "--env",
                  NULL};
  char* env[] = {env_stop, NULL};
  ck_assert_int_eq(tp_run("env", argv, env, &out, &err, 20), 0);
  for (int r = 0; r < 3; r++) {
    char want[64];
#define HAS(fmt, ...)                            \
  snprintf(want, sizeof want, fmt, __VA_ARGS__); \
  ck_assert_msg(strstr(out, want), "missing '%s' in:\n%s", want, out)
    HAS("[rank%d]:RANK=%d\n", r, r);
    HAS("[rank%d]:LOCAL_RANK=%d\n", r, r);
    HAS("[rank%d]:ROLE_RANK=%d\n", r, r);
    HAS("[rank%d]:WORLD_SIZE=3\n", r);
    HAS("[rank%d]:LOCAL_WORLD_SIZE=3\n", r);
    HAS("[rank%d]:GROUP_RANK=0\n", r);
    HAS("[rank%d]:GROUP_WORLD_SIZE=1\n", r);
    HAS("[rank%d]:ROLE_NAME=default\n", r);
    HAS("[rank%d]:MASTER_ADDR=127.0.0.1\n", r);
    HAS("[rank%d]:TORCHELASTIC_RESTART_COUNT=0\n", r);
    HAS("[rank%d]:TRAINRUN_RESTART_COUNT=0\n", r);
    HAS("[rank%d]:TORCHELASTIC_RUN_ID=envtest\n", r);
    HAS("[rank%d]:TORCHELASTIC_USE_AGENT_STORE=True\n", r);
    HAS("[rank%d]:TRAINRUN_WORKER=1\n", r);
#undef HAS
  }
  /* MASTER_PORT is the private store's port, the same for every rank */
  const char* p = strstr(out, "[rank0]:MASTER_PORT=");
  ck_assert_ptr_nonnull(p);
  int port = atoi(p + strlen("[rank0]:MASTER_PORT="));
  ck_assert_int_gt(port, 0);
  char want[64];
  snprintf(want, sizeof want, "[rank2]:MASTER_PORT=%d\n", port);
  ck_assert_ptr_nonnull(strstr(out, want));
  snprintf(want, sizeof want, "[rank1]:TRAINRUN_STORE=127.0.0.1:%d\n", port);
  ck_assert_ptr_nonnull(strstr(out, want));
  ck_assert_str_eq(err, "");
  free(out);
  free(err);
}
END_TEST

START_TEST(test_output_lines_whole) {
  /* 3 ranks x 3000 lines at once: every console line is one whole line of
   * one rank, and each rank's lines arrive complete and in order */
  char* out;
  char* err;
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "3",
                  (char*)tp_bin("tests/fake_worker"),
                  "--lines",
                  "3000",
                  "--partial",
                  "no newline",
                  "--err",
                  "to stderr",
                  NULL};
  ck_assert_int_eq(tp_run("lines", argv, NULL, &out, &err, 30), 0);
  int next[3] = {0, 0, 0}, partial = 0;
  for (char* line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    int r, k, r2;
    if (sscanf(line, "[rank%d]:line %d of rank %d", &r, &k, &r2) == 3) {
      ck_assert_int_eq(r, r2);
      ck_assert_int_eq(k, next[r]);
      next[r]++;
    } else {
      ck_assert_msg(strstr(line, "]:no newline") != NULL, "odd line '%s'",
                    line);
      partial++;
    }
  }
  for (int r = 0; r < 3; r++) ck_assert_int_eq(next[r], 3000);
  ck_assert_int_eq(partial, 3);
  ck_assert_int_eq(count(err, "]:to stderr\n"), 3);
  ck_assert_ptr_nonnull(strstr(err, "[rank1]:to stderr\n"));
  free(out);
  free(err);
}
END_TEST

START_TEST(test_log_dir_redirects_filter) {
  char logs[600];
  snprintf(logs, sizeof logs, "%s/logs", tp_tmpdir);
  char* out;
  char* err;
  /* --redirects 1: stdout only in the files; --local-ranks-filter 1: only
   * rank 1 on the console; the files hold every rank, unprefixed */
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "3",
                  "--log-dir",
                  logs,
                  "--redirects",
                  "1",
                  "--local-ranks-filter",
                  "1",
                  (char*)tp_bin("tests/fake_worker"),
                  "--out",
                  "to stdout",
                  "--err",
                  "to stderr",
                  NULL};
  ck_assert_int_eq(tp_run("logs", argv, NULL, &out, &err, 20), 0);
  ck_assert_str_eq(out, "");
  ck_assert_str_eq(err, "[rank1]:to stderr\n");
  for (int r = 0; r < 3; r++) {
    char p[700];
    snprintf(p, sizeof p, "%s/attempt_0/%d/stdout.log", logs, r);
    char* f = tp_slurp(p);
    ck_assert_str_eq(f, "to stdout\n");
    free(f);
    snprintf(p, sizeof p, "%s/attempt_0/%d/stderr.log", logs, r);
    f = tp_slurp(p);
    ck_assert_str_eq(f, "to stderr\n");
    free(f);
  }
  free(out);
  free(err);

  /* --tee 2 without --log-dir: a folder is made and named */
  char tmp_env[700];
  snprintf(tmp_env, sizeof tmp_env, "TMPDIR=%s", tp_tmpdir);
  char* env[] = {tmp_env, NULL};
  char* argv2[] = {(char*)tp_bin("trainrund"),
                   "--tee",
                   "2",
                   (char*)tp_bin("tests/fake_worker"),
                   "--err",
                   "teed",
                   NULL};
  ck_assert_int_eq(tp_run("tee", argv2, env, &out, &err, 20), 0);
  char want[700];
  snprintf(want, sizeof want, "trainrund: worker logs in %s/trainrun_none_",
           tp_tmpdir);
  ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "stderr: %s", err);
  ck_assert_ptr_nonnull(strstr(err, "[rank0]:teed\n"));
  char dir[700];
  sscanf(err, "trainrund: worker logs in %699s", dir);
  char p[800];
  snprintf(p, sizeof p, "%s/attempt_0/0/stderr.log", dir);
  char* f = tp_slurp(p);
  ck_assert_str_eq(f, "teed\n");
  free(f);
  free(out);
  free(err);
}
END_TEST

START_TEST(test_restarts_then_report) {
  /* rank 1 fails every round: 1 + 2 restarts, then exit 1 naming it */
  char* out;
  char* err;
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "3",
                  "--max-restarts",
                  "2",
                  (char*)tp_bin("tests/fake_worker"),
                  "--out",
                  "round $TRAINRUN_RESTART_COUNT",
                  "--err",
                  "something broke",
                  "--rank",
                  "1",
                  "--exit",
                  "7",
                  "--others-hang",
                  NULL};
  char* env[] = {env_stop, NULL};
  ck_assert_int_eq(tp_run("restarts", argv, env, &out, &err, 30), 1);
  ck_assert_int_eq(count(out, "[rank1]:round"), 3);
  ck_assert_int_eq(count(err, "restarting the workers (restart 1 of 2)"), 1);
  ck_assert_int_eq(count(err, "restarting the workers (restart 2 of 2)"), 1);
  ck_assert_int_eq(count(err, "(restart 3"), 0);
  /* the last lines: the failure, then the rank's own last lines */
  const char* rep = strstr(err, "trainrund: rank 1 (local rank 1, pid ");
  ck_assert_ptr_nonnull(rep);
  const char* last = NULL;
  for (const char* p = rep; (p = strstr(p, "trainrund: rank 1 (")); p++)
    last = p;
  ck_assert_ptr_nonnull(strstr(last, ") on node 0 '"));
  ck_assert_ptr_nonnull(strstr(last,
                               "' exited with code 7\n"
                               "last lines of rank 1:\n"
                               "  round $TRAINRUN_RESTART_COUNT\n"
                               "  something broke\n"));
  free(out);
  free(err);
}
END_TEST

START_TEST(test_restart_recovers) {
  /* rank 0 is killed by SIGKILL in the first round only: the job ends 0,
   * and the second round's workers see restart count 1 */
  char* out;
  char* err;
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "2",
                  "--max-restarts",
                  "3",
                  (char*)tp_bin("tests/fake_worker"),
                  "--env",
                  "--rank",
                  "0",
                  "--until-restart",
                  "1",
                  "--kill",
                  "9",
                  NULL};
  char* env[] = {env_stop, NULL};
  ck_assert_int_eq(tp_run("recover", argv, env, &out, &err, 30), 0);
  ck_assert_ptr_nonnull(strstr(err, "trainrund: rank 0 (local rank 0, pid "));
  ck_assert_ptr_nonnull(strstr(err,
                               "was killed by signal 9 (SIGKILL); "
                               "restarting the workers (restart 1 of "
                               "3)\n"));
  ck_assert_ptr_nonnull(strstr(out, "[rank0]:TRAINRUN_RESTART_COUNT=1\n"));
  ck_assert_ptr_nonnull(strstr(out, "[rank1]:TORCHELASTIC_RESTART_COUNT=1\n"));
  ck_assert_int_eq(count(err, "restarting"), 1);
  free(out);
  free(err);

  /* no restarts: a signal death is reported as such */
  char* argv2[] = {(char*)tp_bin("trainrund"),
                   (char*)tp_bin("tests/fake_worker"), "--kill", "11", NULL};
  ck_assert_int_eq(tp_run("segv", argv2, env, &out, &err, 20), 1);
  ck_assert_ptr_nonnull(strstr(err, "was killed by signal 11 (SIGSEGV"));
  free(out);
  free(err);
}
END_TEST

START_TEST(test_bad_program_and_flags) {
  char* out;
  char* err;
  char* a[] = {(char*)tp_bin("trainrund"), "no-such-program-here", NULL};
  ck_assert_int_eq(tp_run("noprog", a, NULL, &out, &err, 20), 2);
  ck_assert_str_eq(err,
                   "trainrund: cannot run 'no-such-program-here': not found "
                   "in PATH\n");
  free(out);
  free(err);
  char* b[] = {(char*)tp_bin("trainrund"), "--nnodes", "x", "prog", NULL};
  ck_assert_int_eq(tp_run("badflag", b, NULL, &out, &err, 20), 2);
  ck_assert_str_eq(err,
                   "trainrund: --nnodes: expected N or MIN:MAX with 1 <= MIN "
                   "<= MAX, got 'x'\n");
  free(out);
  free(err);
  char* c[] = {(char*)tp_bin("trainrund"), "--bogus", "prog", NULL};
  ck_assert_int_eq(tp_run("unknown", c, NULL, &out, &err, 20), 2);
  ck_assert_str_eq(
      err, "trainrund: unknown flag '--bogus' (see trainrund --help)\n");
  free(out);
  free(err);
}
END_TEST

START_TEST(test_sigterm_graceful) {
  /* SIGTERM to the daemon: forwarded once, ranks finish and exit 0 */
  char ready[700];
  snprintf(ready, sizeof ready, "%s/ready", tp_tmpdir);
  mkdir(ready, 0755);
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "2",
                  (char*)tp_bin("tests/fake_worker"),
                  "--term-exit",
                  "0",
                  "--ready",
                  ready,
                  "--hang",
                  NULL};
  tp_proc_t p;
  tp_proc_start(&p, "term", argv, NULL);
  char f[800];
  for (int r = 0; r < 2; r++) {
    snprintf(f, sizeof f, "%s/ready.%d", ready, r);
    tp_wait_file(f, 20);
  }
  kill(p.pid, SIGTERM);
  ck_assert_int_eq(tp_proc_finish(&p, 20), 0);
  char* out = tp_slurp(p.out);
  char* err = tp_slurp(p.err);
  ck_assert_ptr_nonnull(strstr(out, "[rank0]:rank 0 got SIGTERM\n"));
  ck_assert_ptr_nonnull(strstr(out, "[rank1]:rank 1 got SIGTERM\n"));
  ck_assert_str_eq(err,
                   "trainrund: got SIGTERM: stopping every rank after its "
                   "current step (again to kill them now)\n");
  free(out);
  free(err);
}
END_TEST

START_TEST(test_second_signal_kills) {
  char ready[700];
  snprintf(ready, sizeof ready, "%s/ready2", tp_tmpdir);
  mkdir(ready, 0755);
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "2",
                  (char*)tp_bin("tests/fake_worker"),
                  "--term-ignore",
                  "--ready",
                  ready,
                  "--hang",
                  NULL};
  tp_proc_t p;
  tp_proc_start(&p, "int2", argv, NULL);
  char f[800];
  for (int r = 0; r < 2; r++) {
    snprintf(f, sizeof f, "%s/ready.%d", ready, r);
    tp_wait_file(f, 20);
  }
  kill(p.pid, SIGINT);
  /* the ranks saw the first one before the second comes */
  double t0 = tp_now_s();
  for (;;) {
    char* out = tp_slurp(p.out);
    int n = count(out, "ignores SIGINT");
    free(out);
    if (n == 2) break;
    ck_assert_msg(tp_now_s() - t0 < 20, "the ranks never saw SIGINT");
    usleep(5000);
  }
  kill(p.pid, SIGINT);
  ck_assert_int_eq(tp_proc_finish(&p, 20), 128 + SIGINT);
  char* err = tp_slurp(p.err);
  ck_assert_ptr_nonnull(strstr(err, "got SIGINT again: killing the workers"));
  ck_assert_ptr_nonnull(strstr(err, "trainrund: stopped by a second signal"));
  free(err);
}
END_TEST

/* Two daemons on loopback: node A with `extra_a` args, B with `extra_b`. */
static void two_nodes(const char* tag, char* const* env_a, char* const* env_b,
                      char* const* args, int nargs, int* rc, char** out,
                      char** err) {
  tp_proc_t p[2];
  for (int k = 0; k < 2; k++) {
    char* argv[40];
    int n = 0;
    argv[n++] = (char*)tp_bin("trainrund");
    for (int i = 0; i < nargs; i++) argv[n++] = args[i];
    argv[n] = NULL;
    char t[64];
    snprintf(t, sizeof t, "%s%d", tag, k);
    tp_proc_start(&p[k], t, argv, k == 0 ? env_a : env_b);
  }
  for (int k = 0; k < 2; k++) {
    rc[k] = tp_proc_finish(&p[k], 30);
    out[k] = tp_slurp(p[k].out);
    err[k] = tp_slurp(p[k].err);
  }
}

/* The value of NAME printed by rank r (fake_worker --env), or -1. */
static int env_of(const char* out, int r, const char* name) {
  char key[96];
  snprintf(key, sizeof key, "[rank%d]:%s=", r, name);
  const char* p = strstr(out, key);
  return p ? atoi(p + strlen(key)) : -1;
}

START_TEST(test_two_nodes) {
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", tp_free_port());
  char* args[] = {"--nnodes",
                  "2",
                  "--nproc-per-node",
                  "2",
                  "--rdzv-endpoint",
                  ep,
                  (char*)tp_bin("tests/fake_worker"),
                  "--env"};
  int rc[2];
  char* out[2];
  char* err[2];
  two_nodes("two", NULL, NULL, args, 8, rc, out, err);
  ck_assert_int_eq(rc[0], 0);
  ck_assert_int_eq(rc[1], 0);
  /* the nodes got ranks 0 and 1 (in order of arrival), each two workers;
   * every rank appears once, with the same world */
  int seen[4] = {0};
  for (int k = 0; k < 2; k++)
    for (int r = 0; r < 4; r++) {
      if (env_of(out[k], r, "RANK") < 0) continue;
      seen[r]++;
      ck_assert_int_eq(env_of(out[k], r, "RANK"), r);
      ck_assert_int_eq(env_of(out[k], r, "WORLD_SIZE"), 4);
      ck_assert_int_eq(env_of(out[k], r, "GROUP_WORLD_SIZE"), 2);
      ck_assert_int_eq(env_of(out[k], r, "GROUP_RANK"), r / 2);
      /* both nodes are on this host: local ranks count across them */
      ck_assert_int_eq(env_of(out[k], r, "LOCAL_RANK"), r);
      ck_assert_int_eq(env_of(out[k], r, "LOCAL_WORLD_SIZE"), 4);
      int port = atoi(ep + strlen("127.0.0.1:"));
      ck_assert_int_eq(env_of(out[k], r, "MASTER_PORT"), port);
    }
  for (int r = 0; r < 4; r++) ck_assert_int_eq(seen[r], 1);
  /* each daemon ran one node's two ranks */
  ck_assert_int_eq(env_of(out[0], 0, "RANK") >= 0,
                   env_of(out[0], 1, "RANK") >= 0);
  for (int k = 0; k < 2; k++) {
    free(out[k]);
    free(err[k]);
  }
}
END_TEST

START_TEST(test_two_nodes_failure_spreads) {
  /* rank 3 (node 1) fails; node 0's hanging ranks are stopped; both
   * daemons restart once, then both report rank 3 and exit 1 */
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", tp_free_port());
  char* args[] = {"--nnodes",
                  "2",
                  "--node-rank",
                  NULL,
                  "--nproc-per-node",
                  "2",
                  "--max-restarts",
                  "1",
                  "--rdzv-endpoint",
                  ep,
                  (char*)tp_bin("tests/fake_worker"),
                  "--rank",
                  "3",
                  "--exit",
                  "5",
                  "--others-hang"};
  tp_proc_t p[2];
  for (int k = 0; k < 2; k++) {
    char* argv[32];
    int n = 0;
    argv[n++] = (char*)tp_bin("trainrund");
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++)
      argv[n++] = i == 3 ? (k ? "1" : "0") : args[i];
    argv[n] = NULL;
    char* env[] = {env_stop, NULL};
    tp_proc_start(&p[k], k ? "fail1" : "fail0", argv, env);
  }
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(tp_proc_finish(&p[k], 30), 1);
    char* err = tp_slurp(p[k].err);
    ck_assert_int_eq(count(err, "(restart 1 of 1)"), 1);
    ck_assert_msg(strstr(err, "trainrund: rank 3 (local rank 3, pid ") &&
                      strstr(err, ") on node 1 '") &&
                      strstr(err, "' exited with code 5\n"),
                  "node %d stderr:\n%s", k, err);
    free(err);
  }
}
END_TEST

START_TEST(test_two_nodes_refused) {
  /* both ask for node rank 1: both refuse the round with one message */
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", tp_free_port());
  char* args[] = {"--nnodes",        "2", "--node-rank", "1",
                  "--rdzv-endpoint", ep,  "/bin/true"};
  int rc[2];
  char* out[2];
  char* err[2];
  two_nodes("clash", NULL, NULL, args, 7, rc, out, err);
  for (int k = 0; k < 2; k++) {
    ck_assert_int_eq(rc[k], 2);
    ck_assert_msg(strstr(err[k], "' both asked for --node-rank 1\n"),
                  "node %d: %s", k, err[k]);
    free(out[k]);
    free(err[k]);
  }
}
END_TEST

START_TEST(test_slurm_and_mpirun_style) {
  int port = tp_free_port();
  char mp[64];
  snprintf(mp, sizeof mp, "%d", port);
  /* srun: SLURM_* give nodes, node ranks and the host list */
  char* common[] = {"SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NUM_TASKS=2",
                    "SLURM_STEP_NODELIST=127.0.0.[1-1]", "SLURM_JOB_ID=77"};
  char* ea[] = {common[0],        common[1],        common[2], common[3],
                "SLURM_NODEID=1", "SLURM_PROCID=1", NULL};
  char* eb[] = {common[0],        common[1],        common[2], common[3],
                "SLURM_NODEID=0", "SLURM_PROCID=0", NULL};
  char* args[] = {"--master-port",
                  mp,
                  "--nproc-per-node",
                  "1",
                  (char*)tp_bin("tests/fake_worker"),
                  "--env"};
  int rc[2];
  char* out[2];
  char* err[2];
  two_nodes("slurm", ea, eb, args, 6, rc, out, err);
  ck_assert_int_eq(rc[0], 0);
  ck_assert_int_eq(rc[1], 0);
  /* node A asked for node rank 1 through SLURM_NODEID */
  ck_assert_int_eq(env_of(out[0], 1, "GROUP_RANK"), 1);
  ck_assert_int_eq(env_of(out[1], 0, "GROUP_RANK"), 0);
  ck_assert_int_eq(env_of(out[0], 1, "WORLD_SIZE"), 2);
  ck_assert_ptr_nonnull(strstr(out[0], "[rank1]:TORCHELASTIC_RUN_ID=77\n"));
  for (int k = 0; k < 2; k++) {
    free(out[k]);
    free(err[k]);
  }
  /* mpirun: OMPI_COMM_WORLD_* and MASTER_ADDR/MASTER_PORT */
  char maddr[] = "MASTER_ADDR=127.0.0.1";
  char mport[64];
  snprintf(mport, sizeof mport, "MASTER_PORT=%d", tp_free_port());
  char* ma[] = {"OMPI_COMM_WORLD_SIZE=2",
                "OMPI_COMM_WORLD_RANK=0",
                "OMPI_COMM_WORLD_LOCAL_SIZE=2",
                maddr,
                mport,
                NULL};
  char* mb[] = {"OMPI_COMM_WORLD_SIZE=2",
                "OMPI_COMM_WORLD_RANK=1",
                "OMPI_COMM_WORLD_LOCAL_SIZE=2",
                maddr,
                mport,
                NULL};
  char* margs[] = {(char*)tp_bin("tests/fake_worker"), "--env"};
  two_nodes("mpi", ma, mb, margs, 2, rc, out, err);
  ck_assert_int_eq(rc[0], 0);
  ck_assert_int_eq(rc[1], 0);
  /* several processes per host: one worker each, ranks from mpirun */
  ck_assert_int_eq(env_of(out[0], 0, "GROUP_RANK"), 0);
  ck_assert_int_eq(env_of(out[1], 1, "GROUP_RANK"), 1);
  ck_assert_int_eq(env_of(out[1], 1, "WORLD_SIZE"), 2);
  ck_assert_int_eq(env_of(out[1], 1, "LOCAL_RANK"), 1);
  for (int k = 0; k < 2; k++) {
    free(out[k]);
    free(err[k]);
  }
}
END_TEST

START_TEST(test_lost_node_elastic) {
  /* nodes 1:2; node B's daemon is killed with SIGKILL: node A notices the
   * missing heartbeats, restarts alone (MIN is 1) and finishes */
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", tp_free_port());
  char ready[700];
  snprintf(ready, sizeof ready, "%s/ready3", tp_tmpdir);
  mkdir(ready, 0755);
  char conf[] =
      "keep_alive_interval=0.2,keep_alive_max_attempt=5,last_call_timeout=0.3";
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nnodes",
                  "1:2",
                  "--nproc-per-node",
                  "1",
                  "--max-restarts",
                  "1",
                  "--rdzv-endpoint",
                  ep,
                  "--rdzv-conf",
                  conf,
                  NULL,
                  (char*)tp_bin("tests/fake_worker"),
                  "--ready",
                  ready,
                  "--until-restart",
                  "1",
                  "--hang",
                  NULL};
  char* env[] = {env_stop, NULL};
  tp_proc_t p[2];
  argv[11] = "--node-rank=0";
  tp_proc_start(&p[0], "lostA", argv, env);
  /* B never hosts the store: losing B is losing a node, not the store */
  argv[11] = "--node-rank=1";
  char conf_b[sizeof conf + 32];
  snprintf(conf_b, sizeof conf_b, "%s,is_host=false", conf);
  argv[10] = conf_b;
  tp_proc_start(&p[1], "lostB", argv, env);
  char f[800];
  for (int r = 0; r < 2; r++) {
    snprintf(f, sizeof f, "%s/ready.%d", ready, r);
    tp_wait_file(f, 20);
  }
  double t0 = tp_now_s();
  kill(p[1].pid, SIGKILL);
  ck_assert_int_eq(tp_proc_finish(&p[1], 20), 128 + SIGKILL);
  ck_assert_int_eq(tp_proc_finish(&p[0], 20), 0);
  double took = tp_now_s() - t0;
  char* err = tp_slurp(p[0].err);
  ck_assert_ptr_nonnull(strstr(err, "node 1 '"));
  ck_assert_ptr_nonnull(strstr(err, "' stopped sending heartbeats"));
  ck_assert_ptr_nonnull(strstr(err, "(restart 1 of 1)"));
  ck_assert_msg(took < 10, "the lost node took %.1fs to notice", took);
  free(err);
}
END_TEST

START_TEST(test_elastic_scale_up) {
  /* --nnodes 1:2: A starts alone after the last call; B arrives later and
   * waits; A's round ends ("scale") and both run round 1 as a world of 2 */
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", tp_free_port());
  char ready[700];
  snprintf(ready, sizeof ready, "%s/ready6", tp_tmpdir);
  mkdir(ready, 0755);
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nnodes",
                  "1:2",
                  "--rdzv-endpoint",
                  ep,
                  "--rdzv-conf",
                  "last_call_timeout=0.1",
                  (char*)tp_bin("tests/fake_worker"),
                  "--env",
                  "--ready",
                  ready,
                  "--until-restart",
                  "1",
                  "--hang",
                  NULL};
  char* env[] = {env_stop, NULL};
  tp_proc_t a, b;
  tp_proc_start(&a, "scaleA", argv, env);
  char f[800];
  snprintf(f, sizeof f, "%s/ready.0", ready);
  tp_wait_file(f, 20);
  tp_proc_start(&b, "scaleB", argv, env);
  ck_assert_int_eq(tp_proc_finish(&a, 20), 0);
  ck_assert_int_eq(tp_proc_finish(&b, 20), 0);
  char* out = tp_slurp(a.out);
  char* err = tp_slurp(a.err);
  char* outb = tp_slurp(b.out);
  /* round 0: A alone; round 1: A is node 0 again, B node 1 */
  ck_assert_ptr_nonnull(strstr(out, "[rank0]:WORLD_SIZE=1\n"));
  ck_assert_ptr_nonnull(strstr(out, "[rank0]:WORLD_SIZE=2\n"));
  ck_assert_ptr_nonnull(strstr(out, "[rank0]:TRAINRUN_RESTART_COUNT=1\n"));
  ck_assert_ptr_nonnull(strstr(outb, "[rank1]:WORLD_SIZE=2\n"));
  ck_assert_ptr_nonnull(strstr(outb, "[rank1]:GROUP_RANK=1\n"));
  ck_assert_ptr_nonnull(strstr(err, "a new node waits to join"));
  ck_assert_int_eq(count(err, "restarting the workers (restart"), 0);
  free(out);
  free(err);
  free(outb);
}
END_TEST

START_TEST(test_store_lost) {
  /* the node hosting the store dies: the other stops its workers and
   * exits 1 naming the store */
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", tp_free_port());
  char ready[700];
  snprintf(ready, sizeof ready, "%s/ready5", tp_tmpdir);
  mkdir(ready, 0755);
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nnodes",
                  "2",
                  "--rdzv-endpoint",
                  ep,
                  "--rdzv-conf",
                  "is_host=true",
                  (char*)tp_bin("tests/fake_worker"),
                  "--ready",
                  ready,
                  "--hang",
                  NULL};
  char* env[] = {env_stop, NULL};
  tp_proc_t p[2];
  tp_proc_start(&p[0], "hostA", argv, env);
  argv[6] = "is_host=false";
  tp_proc_start(&p[1], "clientB", argv, env);
  char f[800];
  for (int r = 0; r < 2; r++) {
    snprintf(f, sizeof f, "%s/ready.%d", ready, r);
    tp_wait_file(f, 20);
  }
  kill(p[0].pid, SIGKILL);
  ck_assert_int_eq(tp_proc_finish(&p[0], 20), 128 + SIGKILL);
  ck_assert_int_eq(tp_proc_finish(&p[1], 20), 1);
  char* err = tp_slurp(p[1].err);
  char want[128];
  snprintf(want, sizeof want,
           "trainrund: lost the rendezvous store at %s: ", ep);
  ck_assert_msg(strstr(err, want), "stderr:\n%s", err);
  free(err);
}
END_TEST

START_TEST(test_launcher) {
  char* out;
  char* err;
  /* --exec: any program, with the same flags */
  char* a[] = {(char*)tp_bin("trainrun"),
               "--nproc-per-node",
               "2",
               "--exec",
               (char*)tp_bin("tests/fake_worker"),
               "--env",
               NULL};
  ck_assert_int_eq(tp_run("exec", a, NULL, &out, &err, 20), 0);
  ck_assert_int_eq(env_of(out, 1, "WORLD_SIZE"), 2);
  ck_assert_int_eq(env_of(out, 1, "RANK"), 1);
  free(out);
  free(err);
  /* --dry-run: the layout and the job resolved for its world */
  char job[600];
  snprintf(job, sizeof job, "%s/examples/debug.toml", tp_srcdir());
  char* b[] = {(char*)tp_bin("trainrun"),
               "--dry-run",
               "--nnodes",
               "2",
               "--rdzv-endpoint",
               "head",
               "--nproc-per-node",
               "4",
               job,
               NULL};
  ck_assert_int_eq(tp_run("dry", b, NULL, &out, &err, 20), 0);
  ck_assert_msg(strstr(out,
                       "layout: 2 nodes x 4 workers = 8 ranks; "
                       "rendezvous head:29500, run 'none'; node ranks "
                       "by order of arrival; max restarts 0\n"),
                "stdout: %s\nstderr: %s", out, err);
  ck_assert_ptr_nonnull(strstr(out, "world 8 = dp replicate 1 x shard 8"));
  free(out);
  free(err);
  /* a layout the job cannot take names the key */
  char* c[] = {(char*)tp_bin("trainrun"),
               "--dry-run",
               "--nproc-per-node",
               "3",
               job,
               "--parallelism.tensor_parallel_degree",
               "2",
               NULL};
  ck_assert_int_eq(tp_run("drybad", c, NULL, &out, &err, 20), 2);
  ck_assert_ptr_nonnull(strstr(err, "trainrun: "));
  ck_assert_ptr_nonnull(strstr(err, "tensor_parallel_degree"));
  free(out);
  free(err);
  /* launcher flag errors */
  char* d[] = {(char*)tp_bin("trainrun"), "--max-restarts", "many", job, NULL};
  ck_assert_int_eq(tp_run("lbad", d, NULL, &out, &err, 20), 2);
  ck_assert_str_eq(err,
                   "trainrun: --max-restarts: expected a number >= 0, got "
                   "'many'\n");
  free(out);
  free(err);
  /* status with no daemon running for this TMPDIR */
  char tmp_env[700];
  snprintf(tmp_env, sizeof tmp_env, "TMPDIR=%s", tp_tmpdir);
  char* env[] = {tmp_env, NULL};
  char* e[] = {(char*)tp_bin("trainrun"), "status", NULL};
  ck_assert_int_eq(tp_run("status0", e, env, &out, &err, 20), 1);
  ck_assert_str_eq(err, "trainrun: no trainrun job runs on this machine\n");
  free(out);
  free(err);
}
END_TEST

START_TEST(test_launcher_trains_one_rank) {
  /* trainrun -> the daemon in its process -> a worker `trainrun JOB.toml`
   * that trains one step, its output prefixed and in the log folder */
  char job[600], data[600], dump[700], logs[700], dumparg[720];
  snprintf(job, sizeof job, "%s/examples/debug.toml", tp_srcdir());
  snprintf(data, sizeof data, "%s/examples/data/tinytales.txt", tp_srcdir());
  snprintf(dump, sizeof dump, "%s/out", tp_tmpdir);
  snprintf(logs, sizeof logs, "%s/logs", tp_tmpdir);
  snprintf(dumparg, sizeof dumparg, "--job.dump_folder=%s", dump);
  char* a[] = {(char*)tp_bin("trainrun"),
               "--max-restarts",
               "1",
               "--log-dir",
               logs,
               job,
               "--training.steps",
               "1",
               "--training.local_batch_size",
               "1",
               "--training.seq_len",
               "16",
               "--lr_scheduler.warmup_steps",
               "0",
               "--validation.enable=false",
               "--training.dataset_path",
               data,
               dumparg,
               NULL};
  char* out;
  char* err;
  ck_assert_int_eq(tp_run("train", a, NULL, &out, &err, 60), 0);
  ck_assert_msg(strstr(out, "[rank0]:step 1/1 | loss "), "stdout:\n%s\n%s", out,
                err);
  char p[800];
  snprintf(p, sizeof p, "%s/model.safetensors", dump);
  struct stat st;
  ck_assert_int_eq(stat(p, &st), 0);
  snprintf(p, sizeof p, "%s/attempt_0/0/stdout.log", logs);
  char* f = tp_slurp(p);
  ck_assert_ptr_nonnull(strstr(f, "\nstep 1/1 | loss "));
  free(f);
  free(out);
  free(err);
  /* what the launcher refuses before any worker starts */
  char* b[] = {(char*)tp_bin("trainrun"), "--max-restarts", "1", job,
               "--validation.enable",     "false",          NULL};
  ck_assert_int_eq(tp_run("twofiles", b, NULL, &out, &err, 20), 2);
  char want[800];
  snprintf(want, sizeof want,
           "trainrun: more than one job file ('%s', 'false')\n", job);
  ck_assert_str_eq(err, want);
  free(out);
  free(err);
  /* a worker of several ranks needs the daemon's store */
  char* e[] = {(char*)tp_bin("trainrun"), job, NULL};
  char* env[] = {"TRAINRUN_WORKER=1", "WORLD_SIZE=2", "RANK=1",
                 "MASTER_ADDR=", NULL};
  ck_assert_int_ne(tp_run("dpw", e, env, &out, &err, 20), 0);
  ck_assert_str_eq(err, "trainrun: rank 1: MASTER_ADDR is not set\n");
  free(out);
  free(err);
}
END_TEST

START_TEST(test_launcher_data_parallel) {
  /* two ranks of 4 sequences (Gloo gradient all-reduce) train like one
   * rank of 8: the same global batch, so the same losses step by step */
  char job[600], data[600];
  snprintf(job, sizeof job, "%s/examples/debug.toml", tp_srcdir());
  snprintf(data, sizeof data, "%s/examples/data/tinytales.txt", tp_srcdir());
  const char* batch[2] = {"4", "8"};
  enum { STEPS = 3 };
  double loss[2][STEPS];
  for (int k = 0; k < 2; k++) {
    char dump[300], dumparg[340];
    snprintf(dump, sizeof dump, "%s/out%d", tp_tmpdir, k);
    snprintf(dumparg, sizeof dumparg, "--job.dump_folder=%s", dump);
    char* a[] = {(char*)tp_bin("trainrun"),
                 "--nproc-per-node",
                 k == 0 ? "2" : "1",
                 job,
                 "--training.steps",
                 "3",
                 "--metrics.log_freq",
                 "1",
                 "--training.local_batch_size",
                 (char*)batch[k],
                 "--training.seq_len",
                 "32",
                 "--validation.enable=false",
                 "--debug.seed",
                 "42",
                 "--metrics.enable_jsonl=true",
                 "--training.dataset_path",
                 data,
                 dumparg,
                 NULL};
    char* out;
    char* err;
    ck_assert_int_eq(tp_run(k == 0 ? "dp2" : "dp1", a, NULL, &out, &err, 60),
                     0);
    if (k == 0) {
      /* rank 0 logs; both ranks trained the global batch of 8 */
      ck_assert_msg(strstr(out, "[rank0]:step 3/3 | loss "), "stdout:\n%s\n%s",
                    out, err);
      ck_assert_ptr_null(strstr(out, "[rank1]:step "));
      ck_assert_ptr_nonnull(
          strstr(out,
                 "[rank1]:job 'Llama 3 debug training': llama3 "
                 "debugmodel, 3 steps, batch 4 x 32 tokens per rank "
                 "(global 8, 1 accumulation step)"));
    }
    free(out);
    free(err);
    tp_read_losses(dump, loss[k], STEPS);
  }
  for (int i = 0; i < STEPS; i++) {
    double rel = fabs(loss[0][i] - loss[1][i]) / fabs(loss[1][i]);
    ck_assert_msg(rel <= 1e-5,
                  "step %d: loss %.12g on 2 ranks, %.12g on 1 (relative "
                  "difference %.3g)",
                  i + 1, loss[0][i], loss[1][i], rel);
  }
  /* training changed the loss: the comparison is not of two constants */
  ck_assert_double_lt(loss[1][STEPS - 1], loss[1][0] - 0.5);
}
END_TEST

START_TEST(test_status) {
  char tmp_env[700];
  snprintf(tmp_env, sizeof tmp_env, "TMPDIR=%s", tp_tmpdir);
  char ready[700];
  snprintf(ready, sizeof ready, "%s/ready4", tp_tmpdir);
  mkdir(ready, 0755);
  char* env[] = {tmp_env, NULL};
  char* argv[] = {(char*)tp_bin("trainrund"),
                  "--nproc-per-node",
                  "2",
                  "--rdzv-id",
                  "st",
                  (char*)tp_bin("tests/fake_worker"),
                  "--ready",
                  ready,
                  "--out",
                  "working hard",
                  "--hang",
                  NULL};
  tp_proc_t p;
  tp_proc_start(&p, "stat", argv, env);
  char f[800];
  for (int r = 0; r < 2; r++) {
    snprintf(f, sizeof f, "%s/ready.%d", ready, r);
    tp_wait_file(f, 20);
  }
  char* out;
  char* err;
  /* the output line may still be on its way: ask until it is there */
  double t0 = tp_now_s();
  for (;;) {
    char* e[] = {(char*)tp_bin("trainrun"), "status", NULL};
    int rc = tp_run("status", e, env, &out, &err, 20);
    if (rc == 0 && count(out, ": working hard") == 2) break;
    ck_assert_msg(tp_now_s() - t0 < 20, "status: rc %d\n%s%s", rc, out, err);
    free(out);
    free(err);
    usleep(10000);
  }
  ck_assert_ptr_nonnull(strstr(out, "run 'st', running\n"));
  ck_assert_ptr_nonnull(strstr(out,
                               "round 0 (0 restarts after failures), "
                               "node 0 of 1, ranks 0-1 of 2"));
  ck_assert_ptr_nonnull(strstr(out, "  rank 1 (local rank 1, pid "));
  ck_assert_ptr_nonnull(strstr(out, "): running for "));
  free(out);
  free(err);
  kill(p.pid, SIGTERM);
  ck_assert_int_eq(tp_proc_finish(&p, 20), 0);
}
END_TEST

START_TEST(test_startup_time) {
  /* the launcher's whole life for 4 workers of /bin/true: store,
   * rendezvous, spawn, supervision, exit (torchrun takes seconds) */
  char* d[] = {(char*)tp_bin("trainrund"), "--nproc-per-node", "4", "/bin/true",
               NULL};
  char* l[] = {(char*)tp_bin("trainrun"),
               "--nproc-per-node",
               "4",
               "--exec",
               "/bin/true",
               NULL};
  char* const* cmds[2] = {d, l};
  const char* names[2] = {"trainrund --nproc-per-node 4 /bin/true",
                          "trainrun --nproc-per-node 4 --exec /bin/true"};
  for (int c = 0; c < 2; c++) {
    double best = 1e9;
    for (int i = 0; i < 5; i++) {
      char* out;
      char* err;
      double t0 = tp_now_s();
      ck_assert_int_eq(tp_run("startup", cmds[c], NULL, &out, &err, 20), 0);
      double t = tp_now_s() - t0;
      if (t < best) best = t;
      free(out);
      free(err);
    }
    fprintf(stderr,
            "startup: %s, start to exit: %.1f ms (best of 5, through the "
            "libtool wrapper)\n",
            names[c], best * 1e3);
    ck_assert_msg(best < 1.0, "%s took %.3fs", names[c], best);
  }
}
END_TEST

static Suite* daemon_suite(void) {
  Suite* s = suite_create("daemon");
  TCase* u = tcase_create("units");
  tcase_add_checked_fixture(u, setup, teardown);
  tcase_add_test(u, test_nodelist_expand);
  tcase_add_test(u, test_nodelist_first_and_errors);
  tcase_add_test(u, test_flags_parse);
  tcase_add_test(u, test_flags_errors);
  tcase_add_test(u, test_flags_combinations);
  tcase_add_test(u, test_env_slurm);
  tcase_add_test(u, test_env_openmpi);
  tcase_add_test(u, test_assign_ranks);
  tcase_add_test(u, test_node_record);
  tcase_add_test(u, test_stream_prefix_file_tail);
  tcase_add_test(u, test_cpulist);
  suite_add_tcase(s, u);
  TCase* p = tcase_create("processes");
  tcase_add_checked_fixture(p, setup, teardown);
  tcase_set_timeout(p, 60);
  tcase_add_test(p, test_spawn_env);
  tcase_add_test(p, test_output_lines_whole);
  tcase_add_test(p, test_log_dir_redirects_filter);
  tcase_add_test(p, test_restarts_then_report);
  tcase_add_test(p, test_restart_recovers);
  tcase_add_test(p, test_bad_program_and_flags);
  tcase_add_test(p, test_sigterm_graceful);
  tcase_add_test(p, test_second_signal_kills);
  tcase_add_test(p, test_two_nodes);
  tcase_add_test(p, test_two_nodes_failure_spreads);
  tcase_add_test(p, test_two_nodes_refused);
  tcase_add_test(p, test_slurm_and_mpirun_style);
  tcase_add_test(p, test_lost_node_elastic);
  tcase_add_test(p, test_store_lost);
  tcase_add_test(p, test_elastic_scale_up);
  tcase_add_test(p, test_launcher);
  tcase_add_test(p, test_launcher_trains_one_rank);
  tcase_add_test(p, test_launcher_data_parallel);
  tcase_add_test(p, test_status);
  tcase_add_test(p, test_startup_time);
  suite_add_tcase(s, p);
  return s;
}

int main(void) {
  SRunner* r = srunner_create(daemon_suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
