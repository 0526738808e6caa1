/* trainrun/daemon.h: trainrund, the node daemon -- rendezvous, worker spawn,
 * supervision and restarts (torchrun's elastic agent, in C).
 *
 * One daemon runs per node (a node is one agent: usually one machine; under
 * `srun --ntasks-per-node=8` or `mpirun -npernode 8`, one task). The
 * `trainrun` launcher runs it in its own process; `trainrund` runs it alone
 * around any program. The daemon
 *
 *   1. finds the store: the daemon that can bind the rendezvous endpoint
 *      hosts the TCPStore server (a libuv thread); the others connect to it
 *      (--standalone, or one node without an endpoint: a private store on
 *      127.0.0.1 and an ephemeral port);
 *   2. joins a rendezvous round through the store (node ranks from
 *      --node-rank, else the previous round's, else order of arrival;
 *      hostnames and worker counts exchanged; MIN:MAX nodes closing at MAX,
 *      or last_call_timeout after MIN arrived);
 *   3. spawns one worker per local device with torchrun's environment
 *      (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK,
 *      MASTER_ADDR and MASTER_PORT naming the store, TORCHELASTIC_* and
 *      TRAINRUN_RESTART_COUNT), CPU affinity near its GPU;
 *   4. supervises: worker output prefixed "[rank3]:" (and per-rank files),
 *      exit codes and signals, node heartbeats through the store; the first
 *      failure on any node stops every worker of the round and starts a new
 *      round, up to max_restarts; SIGINT/SIGTERM are forwarded once (the
 *      workers finish their step and exit 0) and reach the other nodes
 *      through the store; a second signal kills the workers.
 *
 * LOCAL_RANK and LOCAL_WORLD_SIZE count the workers of every agent on the
 * same host (by hostname), so two agents on one machine use different
 * devices; with one agent per host they equal torchrun's.
 *
 * Typical use (what `trainrund` does):
 *
 *   tr_daemon_opts_t o;
 *   tr_daemon_opts_init(&o);
 *   for (i = 1; i < argc;) {             // flags, then the worker command
 *     int n = tr_daemon_opts_flag(&o, argc, argv, i, &err);
 *     if (n < 0) { report err.message; exit 2 }
 *     if (n == 0) break;
 *     i += n;
 *   }
 *   tr_daemon_opts_from_env(&o, &err);   // Slurm, Open MPI
 *   tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_AUTO, &err);
 *   tr_daemon_report_t rep;
 *   tr_daemon_run(&o, argv + i, &rep);   // blocks until the job ends
 *   ... print rep.message, exit(rep.exit_code) ...
 *   tr_daemon_report_release(&rep);
 *   tr_daemon_opts_release(&o);
 */
#ifndef TRAINRUN_DAEMON_H
#define TRAINRUN_DAEMON_H

#include <stddef.h>
#include <stdio.h>

#include "trainrun/errmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which of a worker's streams a --redirects/--tee value names. */
enum { TR_STD_NONE = 0, TR_STD_OUT = 1, TR_STD_ERR = 2, TR_STD_ALL = 3 };

/* torchrun's Std value: one value for every local rank ("3"), or a value
 * per local rank ("0:1,1:2"; ranks not listed: none). */
typedef struct {
  int def;    /* TR_STD_* for ranks not in the map */
  int n;      /* entries in the map */
  int* rank;  /* local ranks, n of them */
  int* value; /* their TR_STD_* */
} tr_daemon_std_t;

/* --nproc-per-node words, resolved by tr_daemon_opts_finish. */
enum {
  TR_DAEMON_NPROC_UNSET = 0,
  TR_DAEMON_NPROC_GPU = -1, /* every visible GPU (error without one) */
  TR_DAEMON_NPROC_CPU = -2, /* one per CPU this process may run on */
  TR_DAEMON_NPROC_AUTO = -3 /* every visible GPU, else 1 */
};

/* What the workers compute on, for the default --nproc-per-node. */
typedef enum {
  TR_DAEMON_DEVICE_AUTO = 0, /* GPUs when there are any, else the CPU */
  TR_DAEMON_DEVICE_CPU = 1,  /* one worker */
  TR_DAEMON_DEVICE_GPU = 2   /* one worker per visible GPU */
} tr_daemon_device_t;

typedef struct {
  int nnodes_min, nnodes_max; /* --nnodes N or MIN:MAX; default 1:1 */
  int nproc_per_node;         /* > 0, or a TR_DAEMON_NPROC_* word */
  int node_rank;              /* --node-rank; -1: order of arrival */
  char* rdzv_host;            /* --rdzv-endpoint host; NULL: none */
  int rdzv_port;              /* its port (default 29500) */
  char* run_id;               /* --rdzv-id; default "none" */
  int standalone;             /* --standalone: private store, one node */
  int max_restarts;           /* --max-restarts; default 0 */
  double monitor_interval;    /* --monitor-interval seconds; default 0.1 */
  /* --rdzv-conf key=value,...: seconds */
  double join_timeout;        /* join_timeout: wait for MIN nodes (600) */
  double last_call_timeout;   /* last_call_timeout: after MIN (30) */
  double keep_alive_interval; /* keep_alive_interval: heartbeat period (5) */
  int keep_alive_max_attempt; /* keep_alive_max_attempt: missed beats
                                 before a node is lost (3) */
  double read_timeout;        /* read_timeout: store calls (60) */
  int is_host;                /* is_host: 1 host the store, 0 never, -1
                                 (default) when the endpoint binds here */
  char* log_dir;              /* --log-dir; NULL: no per-rank files */
  tr_daemon_std_t redirects;  /* --redirects: file only, not the console */
  tr_daemon_std_t tee;        /* --tee: console and file */
  int* ranks_filter;          /* --local-ranks-filter; NULL: every rank */
  int nranks_filter;
  /* --worker-timeout seconds: a worker that heartbeat once
   * (trainrun/heartbeat.h) and then not for this long fails the round
   * like a crash; 0: off. Default 300. */
  double worker_timeout;
  /* --metrics-port: serve `trainrun status`'s figures in Prometheus text
   * format over HTTP on every interface at this port (0: a free one,
   * printed); -1 (default): none. */
  int metrics_port;
  char* role;       /* --role; default "default" */
  const char* prog; /* message prefix: "trainrun" (default) */
  /* Where the node flags came from when not from flags: "slurm",
   * "openmpi" or NULL (tr_daemon_opts_from_env). */
  const char* env_source;
  /* Private: which flags were given (TR__DOPT_* bits). */
  unsigned tr__given;
} tr_daemon_opts_t;

/* Fill o with the defaults above. */
void tr_daemon_opts_init(tr_daemon_opts_t* o);

/* Free what o owns; o may be initialised again. */
void tr_daemon_opts_release(tr_daemon_opts_t* o);

/* Parse the launcher flag at argv[i] (argc arguments in all): torchrun's
 * --nnodes, --nproc-per-node, --node-rank, --rdzv-endpoint, --rdzv-id,
 * --rdzv-backend (c10d or static), --rdzv-conf, --standalone,
 * --max-restarts, --monitor-interval, --local-ranks-filter, --tee,
 * --log-dir, --redirects, --role, --master-addr, --master-port, and
 * trainrun's --worker-timeout and --metrics-port; both
 * `--flag value` and `--flag=value`, dashes or underscores. Returns the
 * number of arguments used (1 or 2), 0 when argv[i] is not one of these
 * flags, or TR_EINVAL with a message naming the flag ("--nnodes: expected
 * N or MIN:MAX, got 'x'"). */
int tr_daemon_opts_flag(tr_daemon_opts_t* o, int argc, char* const* argv, int i,
                        tr_errmsg_t* err);

/* Fill what no flag set from the cluster the process runs in:
 *  - Slurm, inside an srun step (SLURM_STEP_NUM_NODES set): nnodes from
 *    SLURM_STEP_NUM_NODES, node rank SLURM_NODEID, endpoint the first host
 *    of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) on port 29500, run id
 *    SLURM_JOB_ID; with several tasks per node (SLURM_STEP_NUM_TASKS >
 *    nodes) every task is a node: nnodes = tasks, node rank SLURM_PROCID,
 *    one worker each unless --nproc-per-node says otherwise;
 *  - Open MPI (OMPI_COMM_WORLD_SIZE set): nnodes OMPI_COMM_WORLD_SIZE, node
 *    rank OMPI_COMM_WORLD_RANK, one worker per process when several run on
 *    a host; the endpoint from MASTER_ADDR[:MASTER_PORT] when set, else
 *    127.0.0.1 when every process runs on this host, else an error asking
 *    for --rdzv-endpoint.
 * Sets o->env_source. Returns 0, or TR_EINVAL (bad values) with a message
 * naming the variable. */
int tr_daemon_opts_from_env(tr_daemon_opts_t* o, tr_errmsg_t* err);

/* Resolve --nproc-per-node words and defaults for device, and check the
 * combination (--node-rank below nnodes, --standalone with one node, an
 * endpoint for more than one node). Returns 0 or TR_EINVAL. */
int tr_daemon_opts_finish(tr_daemon_opts_t* o, tr_daemon_device_t device,
                          tr_errmsg_t* err);

/* The TR_STD_* value of s for local rank r. */
int tr_daemon_std_for(const tr_daemon_std_t* s, int r);

/* ---- devices ---- */

/* GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when set,
 * else the NVIDIA GPUs the driver lists (/proc/driver/nvidia/gpus), without
 * initialising CUDA. */
int tr_daemon_gpu_count(void);

/* ---- Slurm host lists ---- */

/* Expand a Slurm host list ("node[01-04,07],gpu[1-2]-ib,login") into host
 * names in order ("node01" ... "node07", "gpu1-ib", "gpu2-ib", "login");
 * ranges keep the zero padding of their first bound and several bracket
 * groups in one name expand as a product. *hosts (n names) is malloc()ed:
 * free it with tr_nodelist_free. Returns 0, TR_EINVAL for a malformed list
 * (unbalanced brackets, a bad range), or TR_ELIMIT past 1 << 20 names. */
int tr_nodelist_expand(const char* list, char*** hosts, size_t* n);
void tr_nodelist_free(char** hosts, size_t n);

/* The first host of a Slurm host list into out (cap bytes): 0 or the
 * errors of tr_nodelist_expand (TR_ERANGE when it does not fit). */
int tr_nodelist_first(const char* list, char* out, size_t cap);

/* ---- running ---- */

typedef struct {
  /* What the program should exit with: 0 (every worker of the last round
   * exited 0, also after a forwarded stop signal), 1 (a worker failed and
   * no restart was left, or the daemon itself failed), 2 (the rendezvous
   * refused this node's settings), or 128 + N after a second signal N. */
  int exit_code;
  int restarts;    /* rounds started again after failures */
  int stop_signal; /* the first SIGINT/SIGTERM/SIGHUP received; 0 none */
  /* Why the job failed, for the user: one or more lines without the
   * program prefix ("rank 3 (local rank 1, pid 4242) on node 1 'b'
   * exited with code 7\nlast lines of rank 3:\n  ..."); NULL on success.
   * malloc()ed. */
  char* message;
} tr_daemon_report_t;

/* Run the job: find the store, rendezvous, spawn `argv` (argv[0] is run
 * from PATH; NULL-terminated) once per worker, supervise and restart as
 * described at the top, until the job ends. Blocks; installs handlers for
 * SIGINT, SIGTERM, SIGHUP and SIGCHLD for its duration (restored at the
 * end). Progress lines ("prog: rank 3 exited with code 7; restarting (1 of
 * 3)") go to stderr. Returns 0 when the workers ran (rep->exit_code says
 * how the job ended), or a negative TR_E* code when the daemon could not
 * run them (store, rendezvous, spawn errors), with rep->message set and
 * rep->exit_code non-zero. Release rep with tr_daemon_report_release. */
int tr_daemon_run(const tr_daemon_opts_t* o, char* const* argv,
                  tr_daemon_report_t* rep);

void tr_daemon_report_release(tr_daemon_report_t* rep);

/* ---- status ---- */

/* Folder of the daemons' status sockets: /tmp/trainrun-<uid>, or
 * $TMPDIR/trainrun-<uid>. Written into out (cap bytes). */
int tr_daemon_status_dir(char* out, size_t cap);

/* Print what every daemon of this user on this machine reports through its
 * status socket (run id, round, node, ranks with pid, state and last output
 * line) to out. *found (may be NULL) receives the number of daemons that
 * answered; sockets of daemons that are gone are removed. */
int tr_daemon_status_print(FILE* out, int* found);

/* The same with a request line ("status\n", "fr dump\n", "fr tail N\n":
 * the flight recorder, daemon/fr.c): every daemon's answer to out. */
int tr_daemon_request(const char* req, FILE* out, int* found);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_DAEMON_H */
