/* daemon/internal.h: what the daemon's files share -- the daemon's state,
 * its signals, the rendezvous result, worker output streams, process
 * spawning and device discovery. Not installed. */
#ifndef TRAINRUN_DAEMON_INTERNAL_H
#define TRAINRUN_DAEMON_INTERNAL_H

#include <sched.h> /* cpu_set_t */
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* pid_t */

#include "core/buf.h" /* tr__buf_t */
#include "trainrun/daemon.h"
#include "trainrun/errmsg.h"
#include "trainrun/heartbeat.h"
#include "trainrun/store.h"

/* Bits of tr_daemon_opts_t.tr__given: flags the user gave. */
enum {
  TR__DOPT_NNODES = 1u << 0,
  TR__DOPT_NPROC = 1u << 1,
  TR__DOPT_NODE_RANK = 1u << 2,
  TR__DOPT_ENDPOINT = 1u << 3,
  TR__DOPT_PORT = 1u << 4,
  TR__DOPT_RUN_ID = 1u << 5
};

/* 1 once the daemon received SIGINT, SIGTERM or SIGHUP (blocking waits such
 * as the rendezvous give up then; signals.c). */
int tr__daemon_interrupted(void);
/* That signal's number, 0 when none (signals.c). */
int tr__daemon_stop_signal(void);
/* "KILL" for SIGKILL; "?" when unknown. */
const char* tr__daemon_signame(int sig);

/* "killed by signal 9 (SIGKILL)" / "exited with code 7" for a wait status,
 * into buf. */
const char* tr__daemon_describe_status(int status, char* buf, size_t cap);

/* ---- rendezvous.c ---- */

/* One node as it joined a round. */
typedef struct {
  char* host;    /* gethostname() */
  int nproc;     /* its workers */
  int want_rank; /* --node-rank, -1 none */
  int prev_rank; /* its node rank in an earlier round, -1 none */
  int arrival;   /* order of arrival in the round, from 0 */
  int pid;       /* the daemon's */
  int gpus;      /* GPUs it sees */
  int nnodes_min, nnodes_max;
} tr__rdzv_node_t;

/* The result of a round, the same on every node but for the "me" fields. */
typedef struct {
  int round;
  int nnodes;
  int node_rank;          /* me */
  int world_size;         /* sum of nproc */
  int rank_base;          /* RANK of my first worker */
  int local_base;         /* LOCAL_RANK of my first worker (host-wide) */
  int local_world;        /* workers of every node on my host */
  tr__rdzv_node_t* nodes; /* nnodes of them, by node rank */
} tr__rdzv_t;

/* Join round `round` under the run's prefix store, as `me` (arrival is
 * filled in). Returns 0 with *out filled when this node is in the round,
 * 1 when the round closed without it (it arrived after MAX nodes, or after
 * the last call), or an error with a message: TR_ETIMEDOUT (fewer than MIN
 * nodes within join_timeout), TR_EINVAL (nodes disagree on --nnodes, node
 * ranks clash), store errors. After an error in a closed round, out->round
 * and out->nnodes still say which round (out->nodes is NULL). */
int tr__rdzv_join(tr_store_prefix_t* st, int round, tr__rdzv_node_t* me,
                  const tr_daemon_opts_t* o, tr__rdzv_t* out, tr_errmsg_t* err);
void tr__rdzv_release(tr__rdzv_t* r);

/* Node-rank assignment of a closed round (exposed for the tests): nodes[i]
 * holds the i-th arrival; on success rank_of[i] is its node rank. Ranks
 * asked for with --node-rank are kept; then earlier ranks where free; then
 * the rest in order of arrival. TR_EINVAL with a message when two nodes
 * ask for one rank or a rank is not below n. */
int tr__rdzv_assign(const tr__rdzv_node_t* nodes, int n, int* rank_of,
                    tr_errmsg_t* err);

/* Serialise / parse a node record (bytes from the network: checked). */
char* tr__rdzv_node_encode(const tr__rdzv_node_t* n);
int tr__rdzv_node_decode(const char* buf, size_t len, tr__rdzv_node_t* n);

/* Find or host the store as the options say. On success *server is the
 * server this process hosts (NULL when another node does), *client a
 * connected client, and host/port what workers get as MASTER_ADDR and
 * MASTER_PORT (malloc()ed host). */
int tr__rdzv_store_open(const tr_daemon_opts_t* o, tr_store_server_t** server,
                        tr_store_client_t** client, char** host, int* port,
                        tr_errmsg_t* err);

/* ---- output.c ---- */

#define TR__TAIL_LINES 10

/* The last lines a worker printed (both streams), for failure reports. */
typedef struct {
  char* line[TR__TAIL_LINES];
  int next, count;
} tr__tail_t;

/* One stream of one worker: the pipe it writes, where its lines go. */
typedef struct {
  int fd;          /* read end of the worker's pipe; -1 once closed */
  int console_fd;  /* 1 or 2 to show lines there, -1 not shown */
  int file_fd;     /* the per-rank log file, -1 none */
  char prefix[24]; /* "[rank3]:" */
  tr__buf_t line;  /* the unfinished line */
  int console_err; /* a console write failed: stop trying */
} tr__stream_t;

void tr__stream_init(tr__stream_t* s, int fd, int console_fd, int file_fd,
                     int rank);
/* Read what the pipe holds (non-blocking): whole lines go to the console
 * (prefixed) and the tail, every byte to the file. Returns 1 at EOF (the
 * stream is then closed), 0 when the pipe is empty, 2 when it may hold more
 * (read 1 MiB: call again after serving the others), or a negative
 * error. */
int tr__stream_read(tr__stream_t* s, tr__tail_t* tail);
/* Flush an unfinished line and close the pipe and file. */
void tr__stream_close(tr__stream_t* s, tr__tail_t* tail);

void tr__tail_push(tr__tail_t* t, const char* line, size_t len);
/* The tail as "  line\n" lines (malloc()ed, "" when empty). */
char* tr__tail_format(const tr__tail_t* t, const char* indent);
void tr__tail_release(tr__tail_t* t);

/* Open (creating folders) <log_dir>/attempt_<round>/<rank>/<name>.log for
 * writing; returns the fd or a negative error with a message. */
int tr__log_file_open(const char* log_dir, int round, int rank,
                      const char* name, tr_errmsg_t* err);

/* ---- spawn.c ---- */

/* A growable environment: "NAME=value" strings, NULL-terminated. */
typedef struct {
  char** v;
  size_t n, cap;
} tr__env_t;

/* Copy the process environment; or a NULL-terminated list. */
int tr__env_init(tr__env_t* e);
int tr__env_copy(tr__env_t* e, char* const* from);
/* Set (replacing) NAME to the formatted value. */
int tr__env_set(tr__env_t* e, const char* name, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* NAME's value or NULL. */
const char* tr__env_get(const tr__env_t* e, const char* name);
void tr__env_release(tr__env_t* e);

/* Find a program as execvp would (names with a '/' as they are, others in
 * PATH); *path is malloc()ed. TR_ENOENT / TR_EACCES with a message. */
int tr__spawn_resolve(const char* name, char** path, tr_errmsg_t* err);

typedef struct {
  const char* path; /* resolved program */
  char* const* argv;
  char* const* envp;
  const cpu_set_t* cpus; /* NULL: inherit */
  int keep_fd;           /* a close-on-exec fd the worker inherits; -1 */
} tr__spawn_req_t;

/* Fork and exec one worker in a process group of its own (so a terminal's
 * SIGINT reaches only the daemon, which forwards it once, and the daemon's
 * signals reach the worker's children too), killed with the
 * daemon (PR_SET_PDEATHSIG), stdout and stderr to two new non-blocking
 * pipes (*out_fd, *err_fd: read ends). An exec failure is reported here
 * (TR_ENOENT, TR_EACCES ... "cannot run 'prog': ..."). */
int tr__spawn(const tr__spawn_req_t* req, pid_t* pid, int* out_fd, int* err_fd,
              tr_errmsg_t* err);

/* Kill (SIGKILL, with their process groups) and reap every child of this
 * process: with the daemon a child subreaper (PR_SET_CHILD_SUBREAPER), the
 * descendants of exited workers that outlived them (a worker's own group is
 * killed when it exits, but a child may have left it with setsid) come to
 * the daemon; call it once the round's workers are all reaped. Returns how
 * many it killed, "pid 'name', ..." of them in what. */
int tr__spawn_reap_orphans(char* what, size_t cap);

/* ---- devices.c ---- */

/* PCI bus ids ("0000:18:00.0") of the NVIDIA GPUs the driver lists, sorted
 * (CUDA's PCI_BUS_ID order). *ids malloc()ed; free with tr__gpu_ids_free. */
int tr__gpu_pci_ids(char*** ids, int* n);
void tr__gpu_ids_free(char** ids, int n);

/* The CPUs near the GPUs that CUDA devices ordinals[0..n) are (ordinals
 * of CUDA_VISIBLE_DEVICES when set), within this process's affinity:
 * found[i] = 1 with sets[i] filled, 0 when unknown (no GPU, a UUID in
 * CUDA_VISIBLE_DEVICES, no locality information). */
int tr__gpu_cpusets(const int* ordinals, int n, cpu_set_t* sets, int* found);

/* Parse a Linux CPU list ("0-3,8,10-11") into set; TR_EINVAL if bad. */
int tr__cpulist_parse(const char* s, cpu_set_t* set);

/* ---- status.c ---- */

struct tr__daemon;

/* Listen on <status dir>/<pid>.sock; *fd and *path (malloc()ed). Failure
 * only disables `trainrun status` (logged). */
int tr__status_open(int* fd, char** path);
/* Answer one connection on the listening fd with the daemon's state. */
void tr__status_serve(int fd, const struct tr__daemon* d);
void tr__status_close(int fd, char* path);

/* --metrics-port: listen on every interface at port (0: any free one);
 * *fd, and *bound the port in use. */
int tr__metrics_open(int port, int* fd, int* bound, tr_errmsg_t* err);
/* Answer one HTTP connection on the listening fd: GET /metrics (or /) in
 * Prometheus text format (version 0.0.4), 404 otherwise. */
void tr__metrics_serve(int fd, const struct tr__daemon* d);
/* The exposition text (malloc()ed; exposed for the tests). */
char* tr__metrics_text(const struct tr__daemon* d);
/* Refresh every worker's heartbeat snapshot (w->hb, hb_beats, hb_at). */
void tr__heartbeat_poll(struct tr__daemon* d);

/* ---- supervise.c: the daemon's state ---- */

typedef struct {
  int index;      /* on this node, 0 .. nproc-1 */
  int local_rank; /* LOCAL_RANK */
  int rank;       /* RANK */
  pid_t pid;      /* 0 before the spawn */
  int running;
  int status; /* wait status once exited */
  double started, ended;
  tr__stream_t out, err;
  tr__tail_t tail;
  /* heartbeat (trainrun/heartbeat.h): its page, the last beat count seen
   * and when it changed (monotonic), the last snapshot */
  int hb_fd;
  void* hb_page;
  int64_t hb_beats;
  double hb_at;
  tr_heartbeat_slot_t hb;
  char* timeout_how; /* set when it stopped beating and was killed */
} tr__worker_t;

typedef struct tr__daemon {
  const tr_daemon_opts_t* o;
  char* const* argv;
  char* path; /* argv[0] resolved */
  char host[256];
  tr_store_server_t* server; /* this node hosts the store */
  tr_store_client_t* client;
  tr_store_prefix_t st; /* "trainrun/<run id>" */
  char* store_host;     /* MASTER_ADDR for the workers */
  int store_port;
  tr__rdzv_t rdzv;
  int in_round; /* rdzv holds a round */
  int prev_node_rank;
  int failures;  /* rounds that ended in a failure */
  int lost_node; /* the last round ended because a node was lost */
  tr__worker_t* workers;
  int nworkers;
  int sig_pipe[2];
  int stop_signal;   /* first stop signal received */
  int hard_signal;   /* a second one */
  const char* phase; /* "rendezvous", "running", "stopping" ... */
  int status_fd;
  char* status_path;
  int metrics_fd;    /* --metrics-port listener, -1 none */
  char* tmp_log_dir; /* a log folder made for --redirects/--tee */
  struct tr__fr* fr;  /* flight-recorder rings of the round (daemon/fr.c) */
  /* the ranks the flight recorder's verdict of the last round blames
   * (node 0 analyzes; none elsewhere), and the report that names them
   * first (supervise.c) */
  int blamed[8];
  int nblamed;
  char* blame;
} tr__daemon_t;

/* ---- signals.c ---- */

/* Open d->sig_pipe and route SIGINT, SIGTERM, SIGHUP and SIGCHLD to it
 * (SIGPIPE ignored); old gets the 5 previous actions. Clears the stop
 * signal. 0 or a negated errno. */
struct sigaction;
int tr__daemon_signals_setup(tr__daemon_t* d, struct sigaction* old);
/* Put the old actions back and close the pipe. */
void tr__daemon_signals_restore(tr__daemon_t* d, const struct sigaction* old);

/* ---- fr.c: the workers' flight-recorder rings ---- */

/* The shared-memory name of worker w's ring this round (its
 * TRAINRUN_FR_SHM): "/trainrun-<run id>-<daemon pid>-r<round>-<rank>". */
void tr__fr_ring_name(const tr__daemon_t* d, const tr__worker_t* w, char* buf,
                      size_t cap);
/* Every monitor interval: map new rings, dump on a worker's request, on
 * exception_dump in the store and on no progress for hang_timeout.
 * store_ok 0: the store is gone (it is not asked, nor told). */
void tr__fr_tick(tr__daemon_t* d, int store_ok);
/* Worker w failed (how: "exited with code 1"): dump every local ring and
 * set exception_dump so the other nodes dump theirs. */
void tr__fr_worker_failed(tr__daemon_t* d, const tr__worker_t* w,
                          const char* how);
/* The round's workers are gone: a last look at exception_dump, the
 * verdict after an automatic dump (node 0; the ranks it blames into
 * d->blamed), then unmap and unlink the rings. */
void tr__fr_round_end(tr__daemon_t* d);
/* Answer a status-socket request starting "fr " on connection c. */
void tr__fr_serve(const tr__daemon_t* d, int c, const char* req);

#endif /* TRAINRUN_DAEMON_INTERNAL_H */
