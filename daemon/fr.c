/* daemon/fr.c: the daemon's half of the flight recorder. Each worker of a
 * round records into a ring in shared memory whose name the daemon picks
 * (TRAINRUN_FR_SHM); the daemon maps the rings read-only and, from its
 * monitor tick, dumps them (flight_recorder/dump.c) when:
 *
 *   - a worker asks: SIGUSR1 (that rank), or its watchdog found a collective
 *     timeout or error (every rank);
 *   - the store key "<worker store prefix>/exception_dump" appears (any rank
 *     of the job reported an error; PyTorch's kStoreDumpKey);
 *   - a worker that has collectives in flight makes no progress for its
 *     [comm] hang_timeout_seconds;
 *   - a worker crashes or exits non-zero;
 *   - `trainrun fr dump` asks through the status socket.
 *
 * The daemon unlinks a ring's name as soon as it has mapped it, so that no
 * segment outlives the worker and the daemon. Automatic triggers dump
 * every local ring once per round and set
 * exception_dump, so the other nodes' daemons dump theirs. The rings are
 * read even when a worker is hung inside a collective or dead. The status
 * socket also serves `trainrun fr follow` ("fr tail N": the last entries of
 * every ring as tab-separated lines). */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "daemon/internal.h"
#include "trainrun/error.h"
#include "trainrun/flight_recorder.h"
#include "trainrun/fr_analyze.h" /* the verdict after an automatic dump */
#include "trainrun/log.h"

typedef struct {
  tr_fr_ring_t* ring;
  char name[256];
  uint64_t progress;  /* last value seen */
  double progress_at; /* when it last changed, or when work was not waited */
  uint64_t dump_req;  /* last request counter seen */
  int auto_dumped;    /* dumped by an automatic trigger this round */
} fr_worker_t;

struct tr__fr {
  int n;
  fr_worker_t* w;
  double next_store_check;
  int job_dumped; /* an automatic trigger fired this round */
  int store_ok;   /* the supervisor's last word on the store */
  char store_prefix[128];
  char dump_dir[512], dump_prefix[128]; /* of the last dump */
  /* a worker died: the job dump waits until the node's other workers have
   * exited or PENDING_S passed (see tr__fr_worker_failed) */
  double pending_until; /* 0: none */
  int pending_origin;
  char pending_why[160];
};

/* How long a dump after a worker's death waits for the survivors. */
#define PENDING_S 2.0

void tr__fr_ring_name(const tr__daemon_t* d, const tr__worker_t* w, char* buf,
                      size_t cap) {
  char job[64];
  size_t n = 0;
  for (const char* p = d->o->run_id ? d->o->run_id : "none";
       *p && n < sizeof job - 1; p++) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             (c >= '0' && c <= '9') || c == '_' || c == '.';
    job[n++] = ok ? c : '_';
  }
  job[n] = '\0';
  snprintf(buf, cap, "/trainrun-%s-%d-r%d-%d", job, (int)getpid(),
           d->rdzv.round, w->rank);
}

static struct tr__fr* state(tr__daemon_t* d) {
  if (d->fr && d->fr->n == d->nworkers) return d->fr;
  if (d->fr) tr__fr_round_end(d);
  struct tr__fr* f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->w = calloc((size_t)(d->nworkers > 0 ? d->nworkers : 1), sizeof *f->w);
  if (!f->w) {
    free(f);
    return NULL;
  }
  f->n = d->nworkers;
  f->store_ok = 1;
  double now = tr__now();
  for (int i = 0; i < f->n; i++) {
    tr__fr_ring_name(d, &d->workers[i], f->w[i].name, sizeof f->w[i].name);
    f->w[i].progress_at = now;
  }
  d->fr = f;
  return f;
}

/* Map worker i's ring once it exists. */
static tr_fr_ring_t* ring_of(tr__daemon_t* d, struct tr__fr* f, int i) {
  fr_worker_t* fw = &f->w[i];
  if (fw->ring) return fw->ring;
  if (tr_fr_ring_open(fw->name, &fw->ring) < 0) return NULL;
  /* mapped by the worker and by us: no name needed any more, and none is
   * left behind in /dev/shm if both of us die */
  tr_fr_ring_unlink(fw->name);
  tr_fr_ring_info_t info;
  tr_fr_ring_info(fw->ring, &info);
  fw->progress = info.progress;
  fw->dump_req = info.dump_req;
  fw->progress_at = tr__now();
  if (!f->store_prefix[0] && info.store_prefix[0])
    snprintf(f->store_prefix, sizeof f->store_prefix, "%s", info.store_prefix);
  (void)d;
  return fw->ring;
}

/* Dump worker i's ring; 0 or an error (logged). */
static int dump_one(tr__daemon_t* d, struct tr__fr* f, int i, char* path,
                    size_t cap) {
  tr_fr_ring_t* r = ring_of(d, f, i);
  if (!r) return TR_ENOENT;
  tr_fr_snapshot_t s;
  int rc = tr_fr_snapshot(r, &s);
  if (rc == 0) {
    rc = tr_fr_dump_write(&s, NULL, NULL, path, cap);
    snprintf(f->dump_dir, sizeof f->dump_dir, "%s", s.dump_dir);
    snprintf(f->dump_prefix, sizeof f->dump_prefix, "%s", s.dump_prefix);
    tr_fr_snapshot_release(&s);
  }
  if (rc < 0)
    TR_LOG_WARN(DAEMON, "cannot dump the flight recorder of rank %d: %s",
                d->workers[i].rank, tr_strerror(rc));
  return rc;
}

/* Set exception_dump (the first report stays) so every node dumps. */
static void post_exception(tr__daemon_t* d, struct tr__fr* f, int origin) {
  if (!f->store_prefix[0] || !d->client || !f->store_ok) return;
  char key[200];
  snprintf(key, sizeof key, "%s/exception_dump", f->store_prefix);
  int32_t me = origin;
  void* cur = NULL;
  size_t clen = 0;
  int rc = tr_store_client_compare_set(d->client, key, "", 0, &me, sizeof me,
                                       &cur, &clen);
  free(cur);
  if (rc < 0)
    TR_LOG_WARN(DAEMON, "cannot set '%s' in the store: %s", key,
                tr_strerror(rc));
}

/* An automatic trigger: dump every local ring not dumped yet this round. */
static void dump_job(tr__daemon_t* d, struct tr__fr* f, const char* why,
                     int origin, int post) {
  char dir[600] = "";
  int lo = -1, hi = -1, n = 0;
  for (int i = 0; i < f->n; i++) {
    if (f->w[i].auto_dumped) continue;
    char path[4096];
    if (dump_one(d, f, i, path, sizeof path) < 0) continue;
    f->w[i].auto_dumped = 1;
    char* slash = strrchr(path, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int rk = d->workers[i].rank;
    if (lo < 0 || rk < lo) lo = rk;
    if (rk > hi) hi = rk;
    n++;
  }
  if (n > 0) {
    if (n == 1)
      fprintf(stderr, "%s: flight recorder: %s: dumped rank %d to %s\n",
              d->o->prog, why, lo, dir);
    else
      fprintf(stderr, "%s: flight recorder: %s: dumped ranks %d-%d to %s\n",
              d->o->prog, why, lo, hi, dir);
  }
  if (!f->job_dumped && post) post_exception(d, f, origin);
  f->job_dumped = 1;
}

/* Did a rank set exception_dump? Returns its rank, or -2. */
static int exception_key(tr__daemon_t* d, struct tr__fr* f) {
  if (!f->store_prefix[0] || !d->client || !f->store_ok) return -2;
  char key[200];
  snprintf(key, sizeof key, "%s/exception_dump", f->store_prefix);
  const char* k = key;
  int ready = 0;
  if (tr_store_client_check(d->client, &k, 1, &ready) < 0 || !ready) return -2;
  void* v = NULL;
  size_t len = 0;
  int origin = -1;
  if (tr_store_client_get(d->client, key, &v, &len) == 0 &&
      len == sizeof(int32_t)) {
    int32_t o;
    memcpy(&o, v, sizeof o);
    origin = o;
  }
  free(v);
  return origin;
}

/* The dump a worker's death asked for, when it is due (force: now). */
static void pending_dump(tr__daemon_t* d, struct tr__fr* f, int force) {
  if (!f->pending_until || f->job_dumped) {
    f->pending_until = 0;
    return;
  }
  int running = 0;
  for (int i = 0; i < d->nworkers; i++) running += d->workers[i].running;
  if (!force && running > 0 && tr__now() < f->pending_until) return;
  f->pending_until = 0;
  dump_job(d, f, f->pending_why, f->pending_origin, 1);
}

void tr__fr_tick(tr__daemon_t* d, int store_ok) {
  if (!d->in_round || d->nworkers == 0) return;
  struct tr__fr* f = state(d);
  if (!f) return;
  f->store_ok = store_ok;
  pending_dump(d, f, 0);
  if (f->pending_until) return; /* a death's dump comes first */
  double now = tr__now();
  for (int i = 0; i < f->n; i++) {
    fr_worker_t* fw = &f->w[i];
    if (!fw->ring && !d->workers[i].running) continue;
    tr_fr_ring_t* r = ring_of(d, f, i);
    if (!r) continue;
    tr_fr_ring_info_t info;
    tr_fr_ring_info(r, &info);
    int rk = d->workers[i].rank;
    if (info.dump_req != fw->dump_req) {
      fw->dump_req = info.dump_req;
      if (info.dump_scope == 0) {
        char path[4096];
        if (dump_one(d, f, i, path, sizeof path) == 0)
          fprintf(stderr, "%s: flight recorder: rank %d asked: dumped to %s\n",
                  d->o->prog, rk, path);
      } else if (!f->job_dumped) {
        char why[96];
        snprintf(why, sizeof why, "rank %d reported a collective error", rk);
        dump_job(d, f, why, rk, 1);
      }
    }
    if (info.in_flight == 0 || info.progress != fw->progress) {
      fw->progress = info.progress;
      fw->progress_at = now;
    } else if (info.hang_timeout_s > 0 && !f->job_dumped &&
               d->workers[i].running &&
               now - fw->progress_at >= info.hang_timeout_s) {
      char why[128];
      snprintf(why, sizeof why,
               "rank %d made no collective progress for %ds "
               "([comm] hang_timeout_seconds)",
               rk, info.hang_timeout_s);
      dump_job(d, f, why, rk, 1);
    }
  }
  if (!f->job_dumped && now >= f->next_store_check) {
    f->next_store_check = now + 0.5;
    int origin = exception_key(d, f);
    if (origin > -2) {
      char why[96];
      snprintf(why, sizeof why, "rank %d reported a collective error", origin);
      dump_job(d, f, why, origin, 0);
    }
  }
}

void tr__fr_worker_failed(tr__daemon_t* d, const tr__worker_t* w,
                          const char* how) {
  struct tr__fr* f = d->in_round ? state(d) : NULL;
  if (!f || f->job_dumped) return;
  int any = 0;
  for (int i = 0; i < f->n; i++) any |= ring_of(d, f, i) != NULL;
  if (!any) return; /* not a recording program */
  char why[160];
  snprintf(why, sizeof why, "rank %d %s", w->rank, how);
  /* it failed because its watchdog found an error: say that */
  int i = (int)(w - d->workers);
  if (i >= 0 && i < f->n && f->w[i].ring) {
    tr_fr_ring_info_t info;
    tr_fr_ring_info(f->w[i].ring, &info);
    if (info.dump_req != f->w[i].dump_req && info.dump_scope == 1)
      snprintf(why, sizeof why, "rank %d reported a collective error", w->rank);
  }
  /* The survivors' rings are read once they have exited (the stop follows
   * at once) or PENDING_S later: a rank that was still computing when its
   * peer died has then entered the collective that waits for it, which is
   * what the verdict names. */
  if (!f->pending_until) {
    f->pending_until = tr__now() + PENDING_S;
    f->pending_origin = w->rank;
    snprintf(f->pending_why, sizeof f->pending_why, "%s", why);
  }
  pending_dump(d, f, 0);
}

/* After an automatic dump, node 0 waits a moment for every rank's dump
 * (other nodes write theirs) and prints the analyzer's verdict. */
static void print_verdict(tr__daemon_t* d, struct tr__fr* f) {
  if (d->rdzv.node_rank != 0 || !f->dump_dir[0]) return;
  double until = tr__now() + 5.0;
  for (;;) {
    int have = 0;
    for (int r = 0; r < d->rdzv.world_size; r++) {
      char p[1024];
      snprintf(p, sizeof p, "%s/%s%d", f->dump_dir, f->dump_prefix, r);
      have += access(p, R_OK) == 0;
    }
    if (have >= d->rdzv.world_size || tr__now() >= until) break;
    usleep(100000);
  }
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  o.prefix = f->dump_prefix;
  o.allow_incomplete_ranks = 1;
  tr_fra_t* a = NULL;
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  if (tr_fra_load_dir(&a, f->dump_dir, &o, &err) == 0 &&
      tr_fra_analyze(a, &err) >= 0) {
    const char* v = tr_fra_verdict(a);
    if (v && *v)
      fprintf(stderr, "%s: flight recorder: %s\n%s: (trainrun fr analyze %s)\n",
              d->o->prog, v, d->o->prog, f->dump_dir);
    /* the final report leads with the ranks the verdict names */
    int p = tr_fra_primary(a);
    const tr_fra_finding_t* fi = p >= 0 ? tr_fra_finding(a, (size_t)p) : NULL;
    d->nblamed = 0;
    for (size_t i = 0; fi && i < fi->n_culprits && d->nblamed < 8; i++)
      d->blamed[d->nblamed++] = fi->culprits[i];
  } else {
    TR_LOG_WARN(DAEMON, "cannot analyze the dumps in '%s': %s", f->dump_dir,
                err.message);
  }
  tr_fra_free(a);
}

void tr__fr_round_end(tr__daemon_t* d) {
  struct tr__fr* f = d->fr;
  if (!f) return;
  if (d->in_round) pending_dump(d, f, 1);
  /* a report that came in while the workers were stopping */
  if (!f->job_dumped && d->in_round && f->n == d->nworkers) {
    int origin = exception_key(d, f);
    if (origin > -2) {
      char why[96];
      snprintf(why, sizeof why, "rank %d reported a collective error", origin);
      dump_job(d, f, why, origin, 0);
    }
  }
  if (f->job_dumped) print_verdict(d, f);
  for (int i = 0; i < f->n; i++) {
    tr_fr_ring_close(f->w[i].ring);
    tr_fr_ring_unlink(f->w[i].name); /* the worker may have died */
  }
  free(f->w);
  free(f);
  d->fr = NULL;
}

/* ---- the status socket: "fr dump", "fr tail N" ---- */

static void sendf(int c, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void sendf(int c, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  size_t len = (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1;
  size_t off = 0;
  while (off < len) {
    ssize_t w = send(c, buf + off, len - off, MSG_NOSIGNAL);
    if (w <= 0) return;
    off += (size_t)w;
  }
}

static void sizes_str(const tr_fr_entry_t* e, char* buf, size_t cap) {
  const tr_pg_tensor_meta_t* m = e->n_inputs    ? &e->inputs[0]
                                 : e->n_outputs ? &e->outputs[0]
                                                : NULL;
  size_t n = 0;
  buf[0] = '\0';
  if (!m) return;
  for (int d = 0; d < m->ndim && n + 24 < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? "x" : "",
                          (long long)m->shape[d]);
  snprintf(buf + n, cap - n, " %s", tr_dtype_name(m->dtype));
}

static void serve_tail(tr__daemon_t* d, struct tr__fr* f, int c, long want) {
  if (want < 1) want = 1;
  if (want > 100000) want = 100000;
  sendf(c, "J\t%s\t%d\t%d\n", d->o->run_id, d->rdzv.round, d->rdzv.world_size);
  for (int i = 0; i < f->n; i++) {
    const tr__worker_t* w = &d->workers[i];
    tr_fr_ring_t* r = ring_of(d, f, i);
    if (!r) {
      sendf(c, "R\t%d\t%d\t-\n", w->rank, (int)w->pid);
      continue;
    }
    tr_fr_snapshot_t s;
    if (tr_fr_snapshot_last(r, (size_t)want, &s) < 0) continue;
    tr_fr_ring_info_t info;
    tr_fr_ring_info(r, &info);
    sendf(c, "R\t%d\t%d\t%s\t%d\n", w->rank, (int)w->pid,
          w->running ? "running" : "exited", info.in_flight);
    for (int g = 0; g < s.npgs; g++)
      sendf(c, "G\t%d\t%s\t%s\t%d\t%lld\n", w->rank, s.pgs[g].name,
            s.pgs[g].desc, s.pgs[g].n, (long long)s.pgs[g].last_completed);
    size_t first = s.nentries > (size_t)want ? s.nentries - (size_t)want : 0;
    for (size_t k = first; k < s.nentries; k++) {
      const tr_fr_entry_t* e = &s.entries[k];
      char sz[256];
      sizes_str(e, sz, sizeof sz);
      sendf(c, "E\t%d\t%lld\t%s\t%s\t%d\t%lld\t%s\t%s\t%lld\t%lld\t%lld\t%s\n",
            w->rank, (long long)e->record_id, e->pg_name, e->pg_desc, e->is_p2p,
            (long long)(e->is_p2p ? e->p2p_seq_id : e->collective_seq_id),
            e->profiling_name, tr_fr_state_name(e->state),
            (long long)e->time_created_ns, (long long)e->time_started_ns,
            (long long)e->time_completed_ns, sz);
    }
    tr_fr_snapshot_release(&s);
  }
}

void tr__fr_serve(const tr__daemon_t* cd, int c, const char* req) {
  tr__daemon_t* d = (tr__daemon_t*)cd; /* the rings are the daemon's cache */
  struct tr__fr* f = d->in_round && d->nworkers ? state(d) : NULL;
  if (strncmp(req, "fr tail", 7) == 0) {
    if (f) serve_tail(d, f, c, strtol(req + 7, NULL, 10));
    return;
  }
  if (strncmp(req, "fr dump", 7) == 0) {
    if (!f) {
      sendf(c, "daemon %d: no workers running\n", (int)getpid());
      return;
    }
    for (int i = 0; i < f->n; i++) {
      char path[4096];
      int rc = dump_one(d, f, i, path, sizeof path);
      if (rc == 0)
        sendf(c, "rank %d: %s\n", d->workers[i].rank, path);
      else
        sendf(c, "rank %d: no dump: %s\n", d->workers[i].rank,
              rc == TR_ENOENT ? "it records no flight-recorder ring"
                              : tr_strerror(rc));
    }
    return;
  }
  sendf(c, "unknown request\n");
}
