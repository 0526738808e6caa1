/* daemon/supervise.c: tr_daemon_run -- the daemon's life: the store, then
 * rounds of rendezvous, spawn and supervision until the job ends.
 *
 * One thread, one poll() loop per round over: a self-pipe the signal
 * handlers write to (SIGCHLD, SIGINT, SIGTERM, SIGHUP), the workers' output
 * pipes and the status socket. Every --monitor-interval it looks at the
 * store; every keep_alive_interval it beats its heartbeat and checks the
 * other nodes'.
 *
 * How a round ends, under "trainrun/<run id>/r<round>/":
 *
 *   endclaim  COMPARE_SET "" -> "<kind> <node> <pid>": the first daemon to
 *             end the round wins; it ADDs 1 to "failures" (for a failure),
 *             SETs r<round+1>/expect (the nodes the next round waits for;
 *             daemon/rendezvous.c) and then SETs
 *   end       "fail" (a worker failed), "lost" (a node stopped beating),
 *             "abort" (a worker could not be started: no restart helps),
 *             "input" (a worker exited with code 2, a configuration, usage
 *             or data error: no restart helps either),
 *             "scale" (a node waits to join: start a bigger round), "stop"
 *             (a stop signal: every rank finishes its step and exits)
 *   failure   COMPARE_SET: the first failure's report (rank, how, last
 *             lines)
 *   left      ADD 1 by a daemon once its workers are gone; the last one
 *             SETs "alldone"
 *   hb/<n>    ADD 1 every keep_alive_interval by node n
 *   exited    ADD 1 by a daemon leaving the job; the last SETs "allexited",
 *             which the daemon hosting the store waits for before it stops
 *             the store
 *
 * Every daemon that sees "end" stops its workers (SIGTERM, SIGKILL after
 * TRAINRUN_STOP_TIMEOUT), then joins round + 1 when restarts are left
 * (failures <= --max-restarts) or ends with the failure's report. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"
#include "daemon/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

/* ---- round-end bookkeeping in the store ---- */

enum {
  END_NONE,
  END_FAIL,
  END_LOST,
  END_ABORT,
  END_SCALE,
  END_STOP,
  END_INPUT
};
static const char* const end_names[] = {"",      "fail", "lost", "abort",
                                        "scale", "stop", "input"};

static int end_parse(const char* s, size_t len) {
  for (int k = END_FAIL; k <= END_INPUT; k++)
    if (strlen(end_names[k]) == len && memcmp(s, end_names[k], len) == 0)
      return k;
  return END_FAIL; /* a value we do not know: treat as a failure */
}

static void rkey(const tr__daemon_t* d, char* buf, size_t cap,
                 const char* name) {
  snprintf(buf, cap, "r%d/%s", d->rdzv.round, name);
}

/* End the round as `kind` unless another daemon did first. */
static int post_end(tr__daemon_t* d, int kind) {
  char k_claim[48], k_end[48], mine[96];
  rkey(d, k_claim, sizeof k_claim, "endclaim");
  rkey(d, k_end, sizeof k_end, "end");
  int n = snprintf(mine, sizeof mine, "%s %d %d", end_names[kind],
                   d->rdzv.node_rank, (int)getpid());
  void* cur = NULL;
  size_t clen = 0;
  TR_CHECK(tr_store_prefix_compare_set(&d->st, k_claim, "", 0, mine, (size_t)n,
                                       &cur, &clen));
  int won = clen == (size_t)n && memcmp(cur, mine, clen) == 0;
  free(cur);
  if (!won) return 0;
  if (kind == END_FAIL || kind == END_LOST || kind == END_ABORT ||
      kind == END_INPUT)
    TR_CHECK(tr_store_prefix_add(&d->st, "failures", 1, NULL));
  if (kind == END_FAIL || kind == END_LOST || kind == END_SCALE) {
    /* the next round expects the nodes of this one: all of them after a
     * worker failure, one less after a lost node, plus those waiting */
    int64_t expect = d->rdzv.nnodes - (kind == END_LOST ? 1 : 0);
    if (kind == END_SCALE) {
      char k_wait[48];
      int64_t waiting = 0;
      rkey(d, k_wait, sizeof k_wait, "waiting");
      TR_CHECK(tr_store_prefix_add(&d->st, k_wait, 0, &waiting));
      expect += waiting;
    }
    if (expect > d->o->nnodes_max) expect = d->o->nnodes_max;
    if (expect >= 1) {
      char k_expect[48], v[24];
      snprintf(k_expect, sizeof k_expect, "r%d/expect", d->rdzv.round + 1);
      int vl = snprintf(v, sizeof v, "%lld", (long long)expect);
      TR_CHECK(tr_store_prefix_set(&d->st, k_expect, v, (size_t)vl));
    }
  }
  return tr_store_prefix_set(&d->st, k_end, end_names[kind],
                             strlen(end_names[kind]));
}

/* Record the first failure's report (the others are kept out). */
static int post_failure(tr__daemon_t* d, const char* msg) {
  char k[48];
  rkey(d, k, sizeof k, "failure");
  void* cur = NULL;
  size_t clen;
  int rc = tr_store_prefix_compare_set(&d->st, k, "", 0, msg, strlen(msg), &cur,
                                       &clen);
  free(cur);
  return rc;
}

/* The round's failure report, or NULL. */
static char* read_failure(tr__daemon_t* d) {
  char k[48];
  rkey(d, k, sizeof k, "failure");
  const char* keys[1] = {k};
  int ready = 0;
  if (tr_store_prefix_check(&d->st, keys, 1, &ready) < 0 || !ready) return NULL;
  void* v = NULL;
  size_t len;
  if (tr_store_prefix_get(&d->st, k, &v, &len) < 0) return NULL;
  return v; /* NUL-terminated by the client */
}

/* ---- workers ---- */

static int running_count(const tr__daemon_t* d) {
  int n = 0;
  for (int i = 0; i < d->nworkers; i++) n += d->workers[i].running;
  return n;
}

/* Signal every running worker's process group (the worker and what it
 * started, as torchrun does). */
static void signal_workers(tr__daemon_t* d, int sig) {
  for (int i = 0; i < d->nworkers; i++) {
    tr__worker_t* w = &d->workers[i];
    if (w->running && w->pid > 0) kill(-w->pid, sig);
  }
}

static char* blame_report(const tr__daemon_t* d);

static void release_workers(tr__daemon_t* d) {
  d->nblamed = 0;
  tr__fr_round_end(d); /* before the workers' records go */
  free(d->blame);
  d->blame = d->nblamed > 0 ? blame_report(d) : NULL;
  for (int i = 0; i < d->nworkers; i++) {
    tr__worker_t* w = &d->workers[i];
    tr__stream_close(&w->out, &w->tail);
    tr__stream_close(&w->err, &w->tail);
    tr__tail_release(&w->tail);
    tr_heartbeat_destroy(w->hb_page, w->hb_fd);
    free(w->timeout_how);
  }
  free(d->workers);
  d->workers = NULL;
  d->nworkers = 0;
}

/* Read what is left in a worker's pipes (it has exited: no more comes,
 * except from children it left behind, which we do not wait for). */
static void drain(tr__worker_t* w) {
  while (tr__stream_read(&w->out, &w->tail) == 2) {
  }
  while (tr__stream_read(&w->err, &w->tail) == 2) {
  }
}

/* "rank 3 (local rank 1, pid 4242) on node 1 'hostb' exited with code 7"
 * followed by its last lines. */
static char* failure_report(const tr__daemon_t* d, const tr__worker_t* w,
                            const char* how) {
  char* tail = tr__tail_format(&w->tail, "  ");
  char* s = NULL;
  int rc;
  if (tail && *tail)
    rc = asprintf(&s,
                  "rank %d (local rank %d, pid %d) on node %d '%s' %s\n"
                  "last lines of rank %d:\n%s",
                  w->rank, w->local_rank, (int)w->pid, d->rdzv.node_rank,
                  d->host, how, w->rank, tail);
  else
    rc = asprintf(&s, "rank %d (local rank %d, pid %d) on node %d '%s' %s",
                  w->rank, w->local_rank, (int)w->pid, d->rdzv.node_rank,
                  d->host, how);
  free(tail);
  if (rc < 0) return NULL;
  size_t n = strlen(s); /* no trailing newline */
  while (n && s[n - 1] == '\n') s[--n] = '\0';
  return s;
}

/* The node rank of the round that global rank `rank` ran on; -1. */
static int node_of_rank(const tr__daemon_t* d, int rank) {
  int base = 0;
  for (int n = 0; n < d->rdzv.nnodes && d->rdzv.nodes; n++) {
    if (rank >= base && rank < base + d->rdzv.nodes[n].nproc) return n;
    base += d->rdzv.nodes[n].nproc;
  }
  return -1;
}

/* The ranks the flight recorder's verdict blames, as the final report's
 * first lines: the first of them that ran on this node with how it ended
 * and its last lines, else the node it ran on. */
static char* blame_report(const tr__daemon_t* d) {
  char who[128] = "";
  size_t used = 0;
  for (int i = 0; i < d->nblamed && used + 16 < sizeof who; i++)
    used += (size_t)snprintf(who + used, sizeof who - used, "%s%d",
                             i ? ", " : "", d->blamed[i]);
  char* rep = NULL;
  for (int i = 0; i < d->nworkers && !rep; i++) {
    const tr__worker_t* w = &d->workers[i];
    int hit = 0;
    for (int k = 0; k < d->nblamed; k++) hit |= d->blamed[k] == w->rank;
    if (!hit) continue;
    char how[256];
    if (w->timeout_how)
      snprintf(how, sizeof how, "%s", w->timeout_how);
    else if (w->running)
      snprintf(how, sizeof how, "was still running");
    else
      tr__daemon_describe_status(w->status, how, sizeof how);
    rep = failure_report(d, w, how);
  }
  if (!rep) { /* on another node: say which */
    int node = node_of_rank(d, d->blamed[0]);
    if (node >= 0 && asprintf(&rep, "rank %d on node %d '%s'", d->blamed[0],
                              node, d->rdzv.nodes[node].host) < 0)
      rep = NULL;
    if (node < 0 && asprintf(&rep, "rank %d", d->blamed[0]) < 0) rep = NULL;
  }
  if (!rep) return NULL;
  /* "<first line>: the flight recorder's verdict blames it", then the rest */
  size_t n1 = strcspn(rep, "\n");
  char* out = NULL;
  int rc = d->nblamed == 1
               ? asprintf(&out,
                          "%.*s: the flight recorder's verdict blames "
                          "it%s",
                          (int)n1, rep, rep + n1)
               : asprintf(&out,
                          "the flight recorder's verdict blames ranks "
                          "%s: %s",
                          who, rep);
  free(rep);
  return rc < 0 ? NULL : out;
}

/* The job's final report: the round's first failure, after the ranks the
 * verdict blames when it names others (the first rank to fail is often the
 * one that waited for them: a timeout, a closed connection). Takes
 * failure (may be NULL), returns what to report (malloc()ed or NULL). */
static char* blame_first(const tr__daemon_t* d, char* failure) {
  if (!d->blame || !failure) return failure;
  int r = -1;
  if (sscanf(failure, "rank %d", &r) == 1)
    for (int i = 0; i < d->nblamed; i++)
      if (d->blamed[i] == r) return failure; /* the same rank */
  if (sscanf(failure, "node %d", &r) == 1 && node_of_rank(d, d->blamed[0]) == r)
    return failure; /* a lost node: the blamed rank's */
  char* out = NULL;
  if (asprintf(&out, "%s\nthe first to fail, waiting for it: %s", d->blame,
               failure) < 0)
    return failure;
  free(failure);
  return out;
}

/* The first line of a report. */
static void first_line(const char* s, char* out, size_t cap) {
  size_t n = strcspn(s, "\n");
  if (n >= cap) n = cap - 1;
  memcpy(out, s, n);
  out[n] = '\0';
}

static int make_log_dir(tr__daemon_t* d, tr_errmsg_t* err) {
  const tr_daemon_opts_t* o = d->o;
  int any = o->redirects.def || o->tee.def || o->redirects.n || o->tee.n;
  if (o->log_dir || !any || d->tmp_log_dir) return 0;
  char* dir = NULL;
  if (asprintf(&dir, "%s/trainrun_%s_XXXXXX", tr_param_str(TR_PARAM_TMPDIR),
               o->run_id) < 0)
    return TR_ENOMEM;
  if (!mkdtemp(dir)) {
    int rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot create a log folder '%s': %s", dir,
                  tr_strerror(rc));
    free(dir);
    return rc;
  }
  d->tmp_log_dir = dir;
  fprintf(stderr, "%s: worker logs in %s\n", o->prog, dir);
  return 0;
}

static int shown(const tr_daemon_opts_t* o, int local_rank) {
  if (!o->ranks_filter) return 1;
  for (int i = 0; i < o->nranks_filter; i++)
    if (o->ranks_filter[i] == local_rank) return 1;
  return 0;
}

static int cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  return 1;
}

/* The environment every worker of this round shares. */
static int base_env(tr__daemon_t* d, tr__env_t* e) {
  const tr_daemon_opts_t* o = d->o;
  const tr__rdzv_t* r = &d->rdzv;
  TR_CHECK(tr__env_init(e));
  int rc = 0;
#define SET(...) \
  if (rc == 0) rc = tr__env_set(e, __VA_ARGS__)
  SET("WORLD_SIZE", "%d", r->world_size);
  SET("LOCAL_WORLD_SIZE", "%d", r->local_world);
  SET("GROUP_RANK", "%d", r->node_rank);
  SET("GROUP_WORLD_SIZE", "%d", r->nnodes);
  SET("ROLE_NAME", "%s", o->role);
  SET("ROLE_WORLD_SIZE", "%d", r->world_size);
  SET("MASTER_ADDR", "%s", d->store_host);
  SET("MASTER_PORT", "%d", d->store_port);
  SET("TORCHELASTIC_RESTART_COUNT", "%d", r->round);
  SET("TORCHELASTIC_MAX_RESTARTS", "%d", o->max_restarts);
  SET("TORCHELASTIC_RUN_ID", "%s", o->run_id);
  SET("TORCHELASTIC_USE_AGENT_STORE", "True");
  SET("TRAINRUN_RESTART_COUNT", "%d", r->round);
  SET("TRAINRUN_STORE", "%s:%d", d->store_host, d->store_port);
  SET("TRAINRUN_WORKER", "1");
  /* several CPU-hungry workers per host: share the cores, as torchrun's
   * OMP_NUM_THREADS=1 does, less bluntly */
  if (r->local_world > 1 && !tr_param_is_set(TR_PARAM_OMP_NUM_THREADS) &&
      !tr__env_get(e, "OMP_NUM_THREADS")) {
    int t = cpu_count() / r->local_world;
    SET("OMP_NUM_THREADS", "%d", t > 0 ? t : 1);
  }
  /* glibc backs the workers' heaps with transparent huge pages (where the
   * kernel's THP mode is "madvise" or "always"): a training process
   * touches hundreds of MB of fresh heap in its first steps (weights,
   * gradients, optimizer state, gathered shards), and one fault per 2 MiB
   * instead of per 4 KiB took the start-up job's 16 processes from 144K
   * page faults to 21K and 5-10% of their CPU time (docs/PERFORMANCE.md).
   * A GLIBC_TUNABLES of the user's that names the tunable wins. */
  const char* tun = tr__env_get(e, "GLIBC_TUNABLES");
  if (!tun || !*tun) {
    SET("GLIBC_TUNABLES", "%s", "glibc.malloc.hugetlb=1");
  } else if (!strstr(tun, "glibc.malloc.hugetlb")) {
    SET("GLIBC_TUNABLES", "%s:%s", tun, "glibc.malloc.hugetlb=1");
  }
  /* where this round's failure report appears: the workers' process groups
   * give up on an op that waits for a peer once it does (a dead peer on
   * NCCL never closes a socket) */
  char fk[48];
  rkey(d, fk, sizeof fk, "failure");
  char* failure_key = tr_store_prefix_key(&d->st, fk);
  if (!failure_key && rc == 0) rc = TR_ENOMEM;
  SET("TRAINRUN_FAILURE_KEY", "%s", failure_key);
  free(failure_key);
  if (tr_daemon_gpu_count() > 0 && !tr_param_is_set(TR_PARAM_CUDA_DEVICE_ORDER))
    SET("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
#undef SET
  if (rc < 0) tr__env_release(e);
  return rc;
}

static int spawn_workers(tr__daemon_t* d, tr_errmsg_t* err) {
  const tr_daemon_opts_t* o = d->o;
  int n = o->nproc_per_node, rc = 0;
  d->workers = calloc((size_t)n, sizeof *d->workers);
  if (!d->workers) return TR_ENOMEM;
  d->nworkers = n;
  for (int i = 0; i < n; i++) {
    tr__worker_t* w = &d->workers[i];
    w->index = i;
    w->local_rank = d->rdzv.local_base + i;
    w->rank = d->rdzv.rank_base + i;
    tr__stream_init(&w->out, -1, -1, -1, w->rank);
    tr__stream_init(&w->err, -1, -1, -1, w->rank);
    w->hb_fd = -1;
  }
  TR_CHECK(make_log_dir(d, err));
  const char* log_dir = o->log_dir ? o->log_dir : d->tmp_log_dir;

  /* CPU affinity near each worker's GPU (LOCAL_RANK modulo the GPUs) */
  int gpus = tr_daemon_gpu_count();
  cpu_set_t* sets = NULL;
  int* found = NULL;
  if (gpus > 0) {
    sets = calloc((size_t)n, sizeof *sets);
    found = calloc((size_t)n, sizeof *found);
    int* ord = calloc((size_t)n, sizeof *ord);
    if (sets && found && ord) {
      for (int i = 0; i < n; i++) ord[i] = d->workers[i].local_rank % gpus;
      tr__gpu_cpusets(ord, n, sets, found);
    }
    free(ord);
  }

  tr__env_t base;
  rc = base_env(d, &base);
  for (int i = 0; i < n && rc == 0; i++) {
    tr__worker_t* w = &d->workers[i];
    tr__env_t e = {0};
    rc = tr__env_copy(&e, base.v); /* the shared part, then this worker's */
    if (rc == 0) rc = tr__env_set(&e, "RANK", "%d", w->rank);
    if (rc == 0) rc = tr__env_set(&e, "LOCAL_RANK", "%d", w->local_rank);
    if (rc == 0) rc = tr__env_set(&e, "ROLE_RANK", "%d", w->rank);
    char fr_name[256]; /* its flight-recorder ring (daemon/fr.c) */
    tr__fr_ring_name(d, w, fr_name, sizeof fr_name);
    if (rc == 0) rc = tr__env_set(&e, "TRAINRUN_FR_SHM", "%s", fr_name);
    if (rc == 0) {
      /* the heartbeat page; without one the worker is only not watched */
      int fd = tr_heartbeat_create(&w->hb_page);
      if (fd >= 0) {
        w->hb_fd = fd;
        rc = tr__env_set(&e, "TRAINRUN_HEARTBEAT_FD", "%d", fd);
      } else {
        TR_LOG_WARN(DAEMON, "rank %d: no heartbeat page: %s", w->rank,
                    tr_strerror(fd));
      }
    }
    int out_file = -1, err_file = -1;
    if (rc == 0 && log_dir) {
      out_file = rc =
          tr__log_file_open(log_dir, d->rdzv.round, w->rank, "stdout", err);
      if (rc >= 0)
        err_file = rc =
            tr__log_file_open(log_dir, d->rdzv.round, w->rank, "stderr", err);
      if (rc >= 0) rc = 0;
    }
    int out_fd = -1, err_fd = -1;
    if (rc == 0) {
      tr__spawn_req_t req = {d->path, d->argv, e.v,
                             found && found[i] ? &sets[i] : NULL, w->hb_fd};
      rc = tr__spawn(&req, &w->pid, &out_fd, &err_fd, err);
    }
    if (w->hb_fd >= 0) { /* the worker has it now; the mapping stays */
      close(w->hb_fd);
      w->hb_fd = -1;
    }
    if (rc == 0) {
      int red = tr_daemon_std_for(&o->redirects, w->local_rank);
      int vis = shown(o, w->local_rank);
      tr__stream_init(&w->out, out_fd, vis && !(red & TR_STD_OUT) ? 1 : -1,
                      out_file, w->rank);
      tr__stream_init(&w->err, err_fd, vis && !(red & TR_STD_ERR) ? 2 : -1,
                      err_file, w->rank);
      w->running = 1;
      w->started = tr__now();
    } else {
      if (out_file >= 0) close(out_file);
      if (err_file >= 0) close(err_file);
    }
    tr__env_release(&e);
  }
  if (base.v) tr__env_release(&base);
  free(sets);
  free(found);
  return rc;
}

/* ---- one round ---- */

enum {
  OUT_DONE,    /* every node's workers ended (check "failure") */
  OUT_RESTART, /* a failure or a lost node: new round if restarts are left */
  OUT_SCALE,   /* a node waits: new round */
  OUT_ABORT,   /* a worker could not start: the job ends */
  OUT_INPUT,   /* a worker exited with code 2: the job ends */
  OUT_HARD,    /* a second signal killed the workers */
  OUT_ERROR    /* the store is gone */
};

/* Seconds healthy workers get to finish their step (and checkpoint it)
 * when a new node makes the daemons start a bigger round; a failed round's
 * workers get TRAINRUN_STOP_TIMEOUT. */
#define SCALE_STOP_S 60.0

typedef struct {
  int stopping;   /* workers were told to stop */
  double kill_at; /* SIGKILL the rest then; 0: not planned */
  int end_kind;   /* what "end" says, once seen */
  int left;       /* we ADDed "left" */
  int alldone;
  int stop_forwarded;
  int lost;          /* a node stopped beating */
  int store_err;     /* a store call failed */
  int local_failure; /* a worker of this node failed first */
  int swept;         /* the workers' leftovers were killed */
  int64_t* hb;       /* last heartbeat counts, by node rank */
  double* hb_at;     /* when they last changed */
  double next_tick, next_hb;
} round_t;

static void begin_stop(tr__daemon_t* d, round_t* r, int sig, double grace) {
  if (!r->stopping) signal_workers(d, sig);
  r->stopping = 1;
  double at = tr__now() + grace;
  if (!r->kill_at || at < r->kill_at) r->kill_at = at;
}

static void store_failed(tr__daemon_t* d, round_t* r, int rc,
                         tr_errmsg_t* err) {
  if (r->store_err) return;
  r->store_err = 1;
  tr_errmsg_set(err, rc, "lost the rendezvous store at %s: %s",
                tr_store_client_peer(d->client), tr_strerror(rc));
  if (running_count(d) > 0)
    fprintf(stderr, "%s: %s: stopping the workers\n", d->o->prog, err->message);
  begin_stop(d, r, SIGTERM, tr_param_double(TR_PARAM_STOP_TIMEOUT));
}

static void on_worker_exit(tr__daemon_t* d, round_t* r, tr__worker_t* w,
                           tr_errmsg_t* err) {
  char how[256];
  tr__daemon_describe_status(w->status, how, sizeof how);
  TR_LOG_INFO(DAEMON, "rank %d (pid %d) %s", w->rank, (int)w->pid, how);
  int ok = WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0;
  if (ok) return;
  if (w->timeout_how) snprintf(how, sizeof how, "%s", w->timeout_how);
  /* killed by the stop signal we forwarded: stopped, not failed */
  if (d->stop_signal && WIFSIGNALED(w->status) &&
      (WTERMSIG(w->status) == d->stop_signal || WTERMSIG(w->status) == SIGTERM))
    return;
  /* the store is gone: the report is about that, and every store call
   * would only wait out read_timeout reconnecting */
  if (d->hard_signal || r->store_err) return;
  int stopping_for_other =
      r->stopping && !d->stop_signal && r->end_kind != END_STOP;
  if (stopping_for_other) return; /* we stopped it after another failed */
  tr__fr_worker_failed(d, w, how);
  char* rep = failure_report(d, w, how);
  if (!rep) return;
  if (r->end_kind == END_NONE && !d->stop_signal) r->local_failure = 1;
  int rc = post_failure(d, rep);
  /* exit code 2 is trainrun's (and argparse's) for bad configuration,
   * usage or data: the same input fails every restart the same way */
  int input = WIFEXITED(w->status) && WEXITSTATUS(w->status) == 2;
  if (rc == 0 && !d->stop_signal && r->end_kind != END_STOP)
    rc = post_end(d, input ? END_INPUT : END_FAIL);
  free(rep);
  if (rc < 0) store_failed(d, r, rc, err);
  if (!r->stopping)
    begin_stop(d, r, SIGTERM, tr_param_double(TR_PARAM_STOP_TIMEOUT));
}

static void on_signal_received(tr__daemon_t* d, round_t* r, int sig) {
  if (!d->stop_signal) {
    d->stop_signal = sig;
    fprintf(stderr,
            "%s: got SIG%s: stopping every rank after its current step "
            "(again to kill them now)\n",
            d->o->prog, tr__daemon_signame(sig));
    signal_workers(d, sig == SIGHUP ? SIGTERM : sig);
    r->stopping = 1;
    if (d->in_round && !r->store_err && r->end_kind == END_NONE)
      post_end(d, END_STOP); /* the other nodes stop too */
  } else if (!d->hard_signal) {
    d->hard_signal = sig;
    fprintf(stderr, "%s: got SIG%s again: killing the workers\n", d->o->prog,
            tr__daemon_signame(sig));
    signal_workers(d, SIGKILL);
  }
}

/* Workers' heartbeats: one that beat once and then not for
 * --worker-timeout (twice that while it waits in a gradient collective, so
 * that the rank holding its peers up is the one caught first, or writes a
 * checkpoint) is killed
 * and fails the round like a crash. */
static void check_workers(tr__daemon_t* d, round_t* r) {
  tr__heartbeat_poll(d);
  double limit = d->o->worker_timeout;
  if (limit <= 0 || r->stopping || d->stop_signal) return;
  double now = tr__now();
  /* the one most past its limit: the round fails with it, the others are
   * stopped as for any failure */
  tr__worker_t* worst = NULL;
  double worst_over = 0;
  for (int i = 0; i < d->nworkers; i++) {
    tr__worker_t* w = &d->workers[i];
    if (w->running && w->timeout_how) return; /* one is being killed */
    if (!w->running || w->hb_beats == 0 || w->timeout_how) continue;
    int in_sync = strcmp(w->hb.phase, "sync") == 0 ||
                  strcmp(w->hb.phase, "checkpoint") == 0;
    double over = now - w->hb_at - (in_sync ? 2 * limit : limit);
    if (over > 0 && (!worst || over > worst_over)) {
      worst = w;
      worst_over = over;
    }
  }
  if (!worst) return;
  char* how = NULL;
  if (asprintf(&how,
               "stopped heartbeating: no beat for %.1fs (--worker-timeout "
               "%gs) after step %lld, %s; killed with SIGKILL",
               now - worst->hb_at, limit, (long long)worst->hb.step,
               strcmp(worst->hb.phase, "sync") == 0
                   ? "waiting in its gradient collective"
               : strcmp(worst->hb.phase, "checkpoint") == 0
                   ? "writing a checkpoint"
                   : "not in a collective") < 0)
    return;
  worst->timeout_how = how;
  fprintf(stderr, "%s: rank %d %s\n", d->o->prog, worst->rank, how);
  kill(-worst->pid, SIGKILL);
}

/* Heartbeats: beat ours, check the others'. */
static int heartbeat(tr__daemon_t* d, round_t* r) {
  int N = d->rdzv.nnodes;
  char k[48];
  snprintf(k, sizeof k, "r%d/hb/%d", d->rdzv.round, d->rdzv.node_rank);
  TR_CHECK(tr_store_prefix_add(&d->st, k, 1, NULL));
  if (N == 1) return 0;
  char** keys = calloc((size_t)N, sizeof *keys);
  void** vals = calloc((size_t)N, sizeof *vals);
  size_t* lens = calloc((size_t)N, sizeof *lens);
  int rc = keys && vals && lens ? 0 : TR_ENOMEM;
  for (int i = 0; i < N && rc == 0; i++)
    if (asprintf(&keys[i], "r%d/hb/%d", d->rdzv.round, i) < 0) rc = TR_ENOMEM;
  int ready = 0;
  if (rc == 0)
    rc = tr_store_prefix_check(&d->st, (const char* const*)keys, (size_t)N,
                               &ready);
  if (rc == 0 && ready)
    rc = tr_store_prefix_multi_get(&d->st, (const char* const*)keys, (size_t)N,
                                   vals, lens);
  double now = tr__now();
  double limit = d->o->keep_alive_interval * d->o->keep_alive_max_attempt;
  for (int i = 0; i < N && rc == 0; i++) {
    if (ready) {
      int64_t v = vals[i] ? strtoll(vals[i], NULL, 10) : 0;
      if (v != r->hb[i]) {
        r->hb[i] = v;
        r->hb_at[i] = now;
      }
    } else if (!keys[i]) {
      continue;
    }
    if (i == d->rdzv.node_rank || r->lost || now - r->hb_at[i] <= limit)
      continue;
    r->lost = 1;
    char* msg = NULL;
    if (asprintf(&msg,
                 "node %d '%s' stopped sending heartbeats (none for %.1fs): "
                 "its daemon died or cannot reach the store",
                 i, d->rdzv.nodes[i].host, now - r->hb_at[i]) < 0) {
      rc = TR_ENOMEM;
      break;
    }
    if (r->end_kind != END_NONE) /* nobody else will say it */
      fprintf(stderr, "%s: %s\n", d->o->prog, msg);
    else {
      rc = post_failure(d, msg);
      if (rc == 0) rc = post_end(d, END_LOST);
    }
    free(msg);
  }
  for (int i = 0; i < N; i++) {
    if (keys) free(keys[i]);
    if (vals) free(vals[i]);
  }
  free(keys);
  free(vals);
  free(lens);
  return rc;
}

/* What the store says, every monitor interval. */
static int tick(tr__daemon_t* d, round_t* r) {
  char k_end[48], k_done[48], k_wait[48];
  rkey(d, k_end, sizeof k_end, "end");
  rkey(d, k_done, sizeof k_done, "alldone");
  rkey(d, k_wait, sizeof k_wait, "waiting");
  int ready = 0;
  const char* keys[1] = {k_end};
  if (r->end_kind == END_NONE) {
    TR_CHECK(tr_store_prefix_check(&d->st, keys, 1, &ready));
    if (ready) {
      void* v;
      size_t len;
      TR_CHECK(tr_store_prefix_get(&d->st, k_end, &v, &len));
      r->end_kind = end_parse(v, len);
      free(v);
      if (r->end_kind == END_STOP) {
        if (!d->stop_signal && !r->stop_forwarded) {
          fprintf(stderr,
                  "%s: another node got a stop signal: stopping every rank "
                  "after its current step\n",
                  d->o->prog);
          signal_workers(d, SIGTERM);
          r->stopping = 1;
        }
        r->stop_forwarded = 1;
      } else if (r->end_kind != END_SCALE) {
        char* f = read_failure(d);
        char line[512];
        first_line(f ? f : "a worker failed", line, sizeof line);
        if (running_count(d) > 0 && !r->local_failure)
          fprintf(stderr, "%s: %s: stopping the workers\n", d->o->prog, line);
        free(f);
        begin_stop(d, r, SIGTERM, tr_param_double(TR_PARAM_STOP_TIMEOUT));
      } else {
        fprintf(stderr,
                "%s: a new node waits to join: restarting the "
                "workers in a bigger round\n",
                d->o->prog);
        /* healthy workers: they finish the step and save it */
        begin_stop(d, r, SIGTERM, SCALE_STOP_S);
      }
    }
  }
  double now = tr__now();
  if (now >= r->next_hb) {
    r->next_hb = now + d->o->keep_alive_interval;
    TR_CHECK(heartbeat(d, r));
  }
  if (r->left && !r->alldone) {
    const char* dk[1] = {k_done};
    TR_CHECK(tr_store_prefix_check(&d->st, dk, 1, &r->alldone));
  }
  /* a node that arrived late waits: grow the round */
  if (r->end_kind == END_NONE && d->rdzv.nnodes < d->o->nnodes_max &&
      !d->stop_signal) {
    const char* wk[1] = {k_wait};
    TR_CHECK(tr_store_prefix_check(&d->st, wk, 1, &ready));
    if (ready) TR_CHECK(post_end(d, END_SCALE));
  }
  return 0;
}

static int supervise(tr__daemon_t* d, tr_errmsg_t* err) {
  const tr_daemon_opts_t* o = d->o;
  round_t r = {0};
  int N = d->rdzv.nnodes;
  r.hb = calloc((size_t)N, sizeof *r.hb);
  r.hb_at = calloc((size_t)N, sizeof *r.hb_at);
  if (!r.hb || !r.hb_at) {
    free(r.hb);
    free(r.hb_at);
    return TR_ENOMEM;
  }
  double t0 = tr__now();
  for (int i = 0; i < N; i++) r.hb_at[i] = t0;
  r.next_tick = t0;
  r.next_hb = t0;
  d->phase = "running";

  int rc = spawn_workers(d, err);
  if (rc < 0) {
    /* a worker that cannot start will not start on a restart either */
    fprintf(stderr, "%s: %s\n", o->prog, err->message);
    char* msg = NULL;
    if (asprintf(&msg, "node %d '%s' could not start its workers: %s",
                 d->rdzv.node_rank, d->host, err->message) >= 0) {
      if (post_failure(d, msg) == 0) post_end(d, END_ABORT);
      free(msg);
    }
    r.end_kind = END_ABORT;
    begin_stop(d, &r, SIGTERM, tr_param_double(TR_PARAM_STOP_TIMEOUT));
  }

  int n = d->nworkers;
  struct pollfd* fds = calloc((size_t)(2 * n + 3), sizeof *fds);
  int outcome = -1;
  if (!fds) outcome = OUT_ERROR;
  while (outcome < 0) {
    /* what to wait for */
    int k = 0;
    fds[k].fd = d->sig_pipe[0];
    fds[k++].events = POLLIN;
    fds[k].fd = d->status_fd;
    fds[k++].events = POLLIN;
    fds[k].fd = d->metrics_fd;
    fds[k++].events = POLLIN;
    for (int i = 0; i < n; i++) {
      fds[k].fd = d->workers[i].out.fd;
      fds[k++].events = POLLIN;
      fds[k].fd = d->workers[i].err.fd;
      fds[k++].events = POLLIN;
    }
    double now = tr__now();
    double until = r.next_tick;
    if (r.kill_at && r.kill_at < until) until = r.kill_at;
    int timeout = until <= now ? 0 : (int)((until - now) * 1000) + 1;
    if (r.left && !r.alldone && !r.store_err && timeout > 0 &&
        (r.end_kind == END_NONE || r.end_kind == END_STOP)) {
      /* done here, the others still run: wait in the store, which wakes
       * us the moment the last node is done (signals wait that long) */
      char k_done[48];
      rkey(d, k_done, sizeof k_done, "alldone");
      const char* dk[1] = {k_done};
      rc = tr_store_prefix_wait(&d->st, dk, 1, timeout);
      if (rc == 0)
        r.alldone = 1;
      else if (rc != TR_ETIMEDOUT)
        store_failed(d, &r, rc, err);
      timeout = 0;
    }
    int pr = poll(fds, (nfds_t)k, timeout);
    if (pr < 0 && errno != EINTR) {
      rc = tr_err_from_errno();
      tr_errmsg_set(err, rc, "poll: %s", tr_strerror(rc));
      signal_workers(d, SIGKILL);
      outcome = OUT_ERROR;
      break;
    }
    /* signals (SIGCHLD only wakes the loop: exits are looked at below) */
    if (pr > 0 && (fds[0].revents & POLLIN)) {
      unsigned char sigs[64];
      ssize_t got;
      while ((got = read(d->sig_pipe[0], sigs, sizeof sigs)) > 0)
        for (ssize_t i = 0; i < got; i++)
          if (sigs[i] != SIGCHLD) on_signal_received(d, &r, sigs[i]);
    }
    if (pr > 0 && d->status_fd >= 0 && (fds[1].revents & POLLIN)) {
      tr__heartbeat_poll(d);
      tr__status_serve(d->status_fd, d);
    }
    if (pr > 0 && d->metrics_fd >= 0 && (fds[2].revents & POLLIN)) {
      tr__heartbeat_poll(d);
      tr__metrics_serve(d->metrics_fd, d);
    }
    /* output */
    for (int i = 0; pr > 0 && i < n; i++) {
      tr__worker_t* w = &d->workers[i];
      if (fds[3 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))
        tr__stream_read(&w->out, &w->tail);
      if (fds[4 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))
        tr__stream_read(&w->err, &w->tail);
    }
    /* exits: every worker is looked at (SIGCHLDs merge, and a worker
     * can end while we were busy elsewhere) */
    for (int i = 0; i < n; i++) {
      tr__worker_t* w = &d->workers[i];
      if (!w->running) continue;
      int st;
      pid_t p = waitpid(w->pid, &st, WNOHANG);
      if (p != w->pid) continue;
      w->running = 0;
      w->status = st;
      w->ended = tr__now();
      /* what it started and left in its group goes with it */
      kill(-w->pid, SIGKILL);
      drain(w);
      on_worker_exit(d, &r, w, err);
    }
    now = tr__now();
    if (r.kill_at && now >= r.kill_at && running_count(d) > 0) {
      TR_LOG_WARN(DAEMON,
                  "%d worker%s still running %.3gs after SIGTERM: "
                  "killing",
                  running_count(d), running_count(d) == 1 ? "" : "s",
                  r.end_kind == END_SCALE
                      ? SCALE_STOP_S
                      : tr_param_double(TR_PARAM_STOP_TIMEOUT));
      signal_workers(d, SIGKILL);
      r.kill_at = 0;
    }
    if (now >= r.next_tick) {
      r.next_tick = now + o->monitor_interval;
      check_workers(d, &r);
      tr__fr_tick(d, !r.store_err);
      if (!r.store_err) {
        rc = tick(d, &r);
        if (rc < 0) store_failed(d, &r, rc, err);
      }
    }
    if (running_count(d) > 0) continue;

    /* every worker of this node is gone; so is what they left behind */
    if (!r.swept) {
      char what[512];
      int left = tr__spawn_reap_orphans(what, sizeof what);
      if (left > 0)
        TR_LOG_WARN(DAEMON, "killed %d process%s the workers left running: %s",
                    left, left == 1 ? "" : "es", what);
      r.swept = 1;
    }
    if (d->hard_signal) {
      outcome = OUT_HARD;
      break;
    }
    if (r.store_err) {
      outcome = OUT_ERROR;
      break;
    }
    if (!r.left) {
      char k_left[48], k_done[48];
      rkey(d, k_left, sizeof k_left, "left");
      rkey(d, k_done, sizeof k_done, "alldone");
      int64_t v;
      rc = tr_store_prefix_add(&d->st, k_left, 1, &v);
      if (rc == 0 && v >= N) rc = tr_store_prefix_set(&d->st, k_done, "1", 1);
      if (rc < 0) {
        store_failed(d, &r, rc, err);
        continue;
      }
      r.left = 1;
      r.next_tick = now; /* look at the store now */
      d->phase = "waiting for the other nodes";
    }
    switch (r.end_kind) {
      case END_FAIL:
      case END_LOST:
        outcome = OUT_RESTART;
        break;
      case END_SCALE:
        outcome = OUT_SCALE;
        break;
      case END_ABORT:
        outcome = OUT_ABORT;
        break;
      case END_INPUT:
        outcome = OUT_INPUT;
        break;
      default:
        if (r.alldone || r.lost) outcome = OUT_DONE;
    }
  }
  free(fds);
  free(r.hb);
  free(r.hb_at);
  d->lost_node = r.end_kind == END_LOST;
  return outcome;
}

/* ---- a node that arrived after its round closed ---- */

/* Wait for the round to end; 1 when it ended in a new round, 0 when the
 * job finished, < 0 on errors. */
static int wait_round_end(tr__daemon_t* d, int round, tr_errmsg_t* err) {
  char k_wait[48], k_end[48], k_done[48];
  snprintf(k_wait, sizeof k_wait, "r%d/waiting", round);
  snprintf(k_end, sizeof k_end, "r%d/end", round);
  snprintf(k_done, sizeof k_done, "r%d/alldone", round);
  int rc = tr_store_prefix_add(&d->st, k_wait, 1, NULL);
  fprintf(stderr,
          "%s: round %d of the rendezvous closed before this node joined: "
          "waiting for the next\n",
          d->o->prog, round);
  d->phase = "waiting for a round";
  while (rc == 0) {
    if (tr__daemon_interrupted())
      return tr_errmsg_set(err, TR_ECANCELED,
                           "interrupted while waiting "
                           "for a rendezvous round");
    int ready;
    const char* ke[1] = {k_end};
    const char* kd[1] = {k_done};
    rc = tr_store_prefix_check(&d->st, kd, 1, &ready);
    if (rc == 0 && ready) return 0;
    if (rc == 0) rc = tr_store_prefix_wait(&d->st, ke, 1, 200);
    if (rc == 0) return 1;
    if (rc == TR_ETIMEDOUT) rc = 0;
  }
  return tr_errmsg_set(err, rc, "lost the rendezvous store at %s: %s",
                       tr_store_client_peer(d->client), tr_strerror(rc));
}

/* ---- the job ---- */

/* Tell the store we leave; the host waits for every node of the round
 * (so nobody loses the store while reading its last answer). */
static void exit_barrier(tr__daemon_t* d) {
  if (d->rdzv.nnodes < 1 || !d->client) return;
  char k_ex[48], k_all[48];
  rkey(d, k_ex, sizeof k_ex, "exited");
  rkey(d, k_all, sizeof k_all, "allexited");
  int64_t v;
  if (tr_store_prefix_add(&d->st, k_ex, 1, &v) < 0) return;
  if (v >= d->rdzv.nnodes) tr_store_prefix_set(&d->st, k_all, "1", 1);
  if (!d->server || d->rdzv.nnodes == 1) return;
  const char* keys[1] = {k_all};
  double limit = d->o->keep_alive_interval * d->o->keep_alive_max_attempt;
  if (tr_store_prefix_wait(&d->st, keys, 1, (int64_t)(limit * 1000)) < 0)
    TR_LOG_WARN(DAEMON,
                "not every node left the job within %.0fs; stopping "
                "the store anyway",
                limit);
}

void tr_daemon_report_release(tr_daemon_report_t* rep) {
  free(rep->message);
  rep->message = NULL;
}

static void set_message(tr_daemon_report_t* rep, const char* msg) {
  free(rep->message);
  rep->message = msg ? strdup(msg) : NULL;
}

/* msg, then a line of its own (formatted); msg alone when out of memory. */
static void set_message_and(tr_daemon_report_t* rep, const char* msg,
                            const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_message_and(tr_daemon_report_t* rep, const char* msg,
                            const char* fmt, ...) {
  char* line = NULL;
  char* all = NULL;
  va_list ap;
  va_start(ap, fmt);
  int n = vasprintf(&line, fmt, ap);
  va_end(ap);
  if (n >= 0 && asprintf(&all, "%s\n%s", msg, line) >= 0) {
    set_message(rep, all);
  } else {
    all = NULL;
    set_message(rep, msg);
  }
  if (n >= 0) free(line);
  free(all);
}

int tr_daemon_run(const tr_daemon_opts_t* o, char* const* argv,
                  tr_daemon_report_t* rep) {
  memset(rep, 0, sizeof *rep);
  rep->exit_code = 1;
  tr__daemon_t d;
  memset(&d, 0, sizeof d);
  d.o = o;
  d.argv = argv;
  d.prev_node_rank = -1;
  d.sig_pipe[0] = d.sig_pipe[1] = -1;
  d.status_fd = -1;
  d.metrics_fd = -1;
  d.phase = "starting";
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  struct sigaction old[5];
  int rc, signals_set = 0, was_subreaper = -1;

  if (!argv || !argv[0]) {
    rc = tr_errmsg_set(&err, TR_EINVAL, "no worker program given");
    rep->exit_code = 2;
    goto out;
  }
  rc = tr__spawn_resolve(argv[0], &d.path, &err);
  if (rc < 0) {
    rep->exit_code = 2;
    goto out;
  }
  if (gethostname(d.host, sizeof d.host - 1) != 0) strcpy(d.host, "?");
  /* descendants that outlive their worker (a child that left the worker's
   * process group) come to this process, which kills them at the round's
   * end */
  if (prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper) < 0) was_subreaper = 0;
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  /* until the store answers there is nothing to stop: signals keep their
   * default action (a Ctrl-C while the endpoint is down ends the wait) */
  d.phase = "connecting to the store";
  TR_CHECK_GOTO(tr__rdzv_store_open(o, &d.server, &d.client, &d.store_host,
                                    &d.store_port, &err),
                rc, out);
  TR_CHECK_GOTO(tr__daemon_signals_setup(&d, old), rc, out);
  signals_set = 1;
  {
    char prefix[300];
    snprintf(prefix, sizeof prefix, "trainrun/%s", o->run_id);
    TR_CHECK_GOTO(tr_store_prefix_init(&d.st, d.client, prefix), rc, out);
  }
  tr__status_open(&d.status_fd, &d.status_path);
  if (o->metrics_port >= 0) {
    int bound;
    TR_CHECK_GOTO(
        tr__metrics_open(o->metrics_port, &d.metrics_fd, &bound, &err), rc,
        out);
    fprintf(stderr, "%s: metrics at http://%s:%d/metrics\n", o->prog, d.host,
            bound);
  }

  int64_t round;
  rc = tr_store_prefix_add(&d.st, "round", 0, &round);
  if (rc < 0) {
    tr_errmsg_set(&err, rc, "store at %s: %s", tr_store_client_peer(d.client),
                  tr_strerror(rc));
    goto out;
  }
  for (;;) {
    tr__rdzv_node_t me = {0};
    me.host = d.host;
    me.nproc = o->nproc_per_node;
    me.want_rank = o->node_rank;
    me.prev_rank = d.prev_node_rank;
    me.pid = (int)getpid();
    me.gpus = tr_daemon_gpu_count();
    me.nnodes_min = o->nnodes_min;
    me.nnodes_max = o->nnodes_max;
    d.phase = "rendezvous";
    if (d.in_round) tr__rdzv_release(&d.rdzv);
    d.in_round = 0;
    rc = tr__rdzv_join(&d.st, (int)round, &me, o, &d.rdzv, &err);
    if (rc == 1) {
      rc = wait_round_end(&d, (int)round, &err);
      if (rc < 0) goto out;
      if (rc == 0) {
        rc = tr_errmsg_set(&err, TR_ECANCELED,
                           "the job finished before this node could join");
        goto out;
      }
      round++;
      continue;
    }
    if (rc < 0) {
      if (rc != TR_EINVAL) goto out;
      /* every node of the round reached the same verdict: leave together
       * so that the host keeps the store until the others read it */
      rep->exit_code = 2;
      set_message(rep, err.message);
      exit_barrier(&d);
      goto out;
    }
    d.in_round = 1;
    d.prev_node_rank = d.rdzv.node_rank;
    TR_LOG_INFO(DAEMON,
                "round %d: node %d of %d, ranks %d-%d of %d, store %s:%d",
                d.rdzv.round, d.rdzv.node_rank, d.rdzv.nnodes, d.rdzv.rank_base,
                d.rdzv.rank_base + o->nproc_per_node - 1, d.rdzv.world_size,
                d.store_host, d.store_port);
    int out = supervise(&d, &err);
    release_workers(&d);
    if (out == OUT_HARD) {
      rep->exit_code = 128 + d.hard_signal;
      rep->stop_signal = d.stop_signal;
      set_message(rep, "stopped by a second signal: the workers were killed");
      rc = 0;
      goto out_barrier;
    }
    if (out == OUT_ERROR) {
      rc = err.code ? err.code : TR_EIO;
      goto out;
    }
    if (out == OUT_SCALE) {
      round++;
      continue;
    }
    char* failure = blame_first(&d, read_failure(&d));
    if (out == OUT_DONE) {
      rep->stop_signal = d.stop_signal;
      rep->exit_code = failure ? 1 : 0;
      set_message(rep, failure);
      free(failure);
      rc = 0;
      goto out_barrier;
    }
    int64_t failures = 0;
    rc = tr_store_prefix_add(&d.st, "failures", 0, &failures);
    if (rc < 0) {
      free(failure);
      tr_errmsg_set(&err, rc, "lost the rendezvous store at %s: %s",
                    tr_store_client_peer(d.client), tr_strerror(rc));
      goto out;
    }
    d.failures = (int)failures;
    const char* why = failure ? failure : "a worker failed";
    if (out == OUT_RESTART && d.lost_node &&
        d.rdzv.nnodes - 1 < o->nnodes_min) {
      /* the job goes on only while MIN nodes remain */
      set_message_and(rep, why,
                      "%d of the round's %d nodes remain, fewer than the %d "
                      "that --nnodes %d:%d needs: stopping",
                      d.rdzv.nnodes - 1, d.rdzv.nnodes, o->nnodes_min,
                      o->nnodes_min, o->nnodes_max);
      rep->exit_code = 1;
      free(failure);
      rc = 0;
      goto out_barrier;
    }
    if (out == OUT_INPUT) {
      /* no restart: the next attempt would read the same input */
      set_message_and(rep, why,
                      "exit code 2 is a configuration, usage or data error, "
                      "which a restart cannot fix: not restarting");
      rep->exit_code = 2;
      free(failure);
      rc = 0;
      goto out_barrier;
    }
    if (out == OUT_ABORT || failures > o->max_restarts || d.stop_signal) {
      rep->exit_code = 1;
      set_message(rep, why);
      free(failure);
      rc = 0;
      goto out_barrier;
    }
    char line[512];
    first_line(why, line, sizeof line);
    fprintf(stderr, "%s: %s; restarting the workers (restart %lld of %d)\n",
            o->prog, line, (long long)failures, o->max_restarts);
    free(failure);
    rep->restarts = (int)failures;
    /* the next round; CAS so that only the first daemon moves the counter */
    char cur[24], next[24];
    snprintf(cur, sizeof cur, "%lld", (long long)round);
    snprintf(next, sizeof next, "%lld", (long long)round + 1);
    void* v = NULL;
    size_t vl;
    tr_store_prefix_compare_set(&d.st, "round", cur, strlen(cur), next,
                                strlen(next), &v, &vl);
    free(v);
    round++;
  }
out_barrier:
  exit_barrier(&d);
out:
  if (rc < 0) {
    if (rep->exit_code == 0) rep->exit_code = 1;
    int stop = tr__daemon_stop_signal();
    if (rc == TR_ECANCELED && stop) {
      rep->exit_code = 128 + stop;
      rep->stop_signal = stop;
    }
    set_message(rep, err.message[0] ? err.message : tr_strerror(rc));
  }
  release_workers(&d);
  if (d.in_round) tr__rdzv_release(&d.rdzv);
  tr__status_close(d.status_fd, d.status_path);
  if (d.metrics_fd >= 0) close(d.metrics_fd);
  tr_store_prefix_release(&d.st);
  tr_store_client_free(d.client);
  tr_store_server_stop(d.server);
  free(d.store_host);
  free(d.blame);
  free(d.path);
  free(d.tmp_log_dir);
  if (signals_set) tr__daemon_signals_restore(&d, old);
  if (was_subreaper >= 0) prctl(PR_SET_CHILD_SUBREAPER, was_subreaper);
  return rc;
}
