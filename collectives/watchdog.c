/* collectives/watchdog.c: one watchdog thread per world. Every
 * TRAINRUN_PG_WATCHDOG_MS it walks the groups' ops in flight: it polls CUDA
 * works, fails ops past their deadline with the timeout message, and for a
 * group that broke it aborts the communicators, writes the message under
 * the group's store key "<group prefix>/error", sets
 * "<store prefix>/exception_dump" to this rank and runs the flight
 * recorder's dump hook. Ops in flight for a while make it look for other
 * ranks' reports of their group (and for exception_dump), so a rank blocked
 * on a peer that failed gets an error, not a hang; so does the job's
 * failure report (tr_pg_opts_t.failure_key, written by the daemon when a
 * worker dies). The watchdog talks to the store through its own client. */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "collectives/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

/* How long an op must be in flight before the watchdog asks the store
 * whether another rank reported its group. */
static int64_t remote_check_ns(void) {
  int64_t ms = tr_param_int(TR_PARAM_PG_WATCHDOG_MS) * 5;
  if (ms < 500) ms = 500;
  return ms * 1000000;
}

static void call_dump(tr__pg_world_t* wd, int origin, const char* reason) {
  pthread_mutex_lock(&wd->mu);
  int first = !wd->dump_done;
  wd->dump_done = 1;
  pthread_mutex_unlock(&wd->mu);
  const tr_pg_hooks_t* h = tr__pg_hooks();
  if (first && h->dump) h->dump(h->arg, origin, reason);
}

static void fail_inflight(tr_pg_t* pg, const char* msg);

/* Tell everyone that pg broke. The communicators are aborted first, so
 * that an op of ours that outlived its deadline cannot still complete with
 * a late peer; then the group's error key and exception_dump are set (the
 * first report of a group, and of the job, stays). remote: another rank
 * reported it (origin); nothing to write. */
static void report(tr__pg_world_t* wd, tr_pg_t* pg, const char* msg, int remote,
                   int origin) {
  TR_LOG_ERROR(COLL, "%s", msg);
  for (int d = 0; d < TR__PG_NDEV; d++) {
    tr__pg_backend_t* be = pg->be[d];
    if (be && !__atomic_exchange_n(&be->aborted, 1, __ATOMIC_ACQ_REL) &&
        be->vt->abort)
      be->vt->abort(be);
  }
  if (!remote && wd->wd_store) {
    size_t n = strlen(msg) + 32;
    char* val = malloc(n);
    if (val) {
      int len = snprintf(val, n, "%d\n%s", wd->rank, msg);
      void* cur = NULL;
      size_t clen = 0;
      int rc = tr_store_prefix_compare_set(&pg->wd_sp, "error", "", 0, val,
                                           (size_t)len, &cur, &clen);
      if (rc < 0)
        TR_LOG_WARN(COLL,
                    "cannot report the error of group '%s' to the "
                    "store: %s",
                    pg->name, tr_strerror(rc));
      free(cur);
      free(val);
    }
    int32_t me = wd->rank;
    char key[512];
    snprintf(key, sizeof key, "%s/exception_dump", wd->store_prefix);
    void* cur = NULL;
    size_t clen = 0;
    int rc = tr_store_client_compare_set(wd->wd_store, key, "", 0, &me,
                                         sizeof me, &cur, &clen);
    if (rc < 0)
      TR_LOG_WARN(COLL, "cannot set '%s' in the store: %s", key,
                  tr_strerror(rc));
    free(cur);
  }
  fail_inflight(pg, msg);
  call_dump(wd, remote ? origin : wd->rank, msg);
}

/* Fail what is still in flight on pg: it cannot complete any more. */
static void fail_inflight(tr_pg_t* pg, const char* msg) {
  for (;;) {
    tr_pg_work_t* w = NULL;
    pthread_mutex_lock(&pg->mu);
    for (tr_pg_work_t* x = pg->inflight; x; x = x->if_next)
      if (!tr__work_is_done(x)) {
        w = x;
        tr__work_ref(w);
        break;
      }
    pthread_mutex_unlock(&pg->mu);
    if (!w) break;
    tr__work_finish(w, TR_EABORTED, "aborted after an earlier error: %s", msg);
    tr__work_unref(w);
  }
}

/* Another rank reported pg broken? Returns 1 and fills *msg (malloc()ed)
 * and *origin (the reporter's global rank). */
static int remote_report(tr__pg_world_t* wd, tr_pg_t* pg, char** msg,
                         int* origin) {
  const char* key = "error";
  int ready = 0;
  if (tr_store_prefix_check(&pg->wd_sp, &key, 1, &ready) < 0 || !ready)
    return 0;
  void* val = NULL;
  size_t len = 0;
  if (tr_store_prefix_get(&pg->wd_sp, key, &val, &len) < 0) return 0;
  char* nl = memchr(val, '\n', len);
  *origin = atoi(val);
  const char* text = nl ? nl + 1 : val;
  size_t n = strlen(text) + 64;
  *msg = malloc(n);
  if (*msg) snprintf(*msg, n, "rank %d reported: %s", *origin, text);
  free(val);
  return *msg != NULL;
}

/* The job's failure report (opts.failure_key), if one was written: 1 and
 * *msg (malloc()ed) "the job failed: <its first line>". */
static int job_failure(tr__pg_world_t* wd, char** msg) {
  if (!wd->failure_key || !wd->wd_store) return 0;
  const char* key = wd->failure_key;
  int ready = 0;
  if (tr_store_client_check(wd->wd_store, &key, 1, &ready) < 0 || !ready)
    return 0;
  void* val = NULL;
  size_t len = 0;
  if (tr_store_client_get(wd->wd_store, key, &val, &len) < 0) return 0;
  const char* text = val;
  size_t line = 0;
  while (line < len && text[line] != '\n' && text[line] != '\0') line++;
  size_t n = line + 32;
  *msg = malloc(n);
  if (*msg) snprintf(*msg, n, "the job failed: %.*s", (int)line, text);
  free(val);
  return *msg != NULL;
}

static void check_exception_dump(tr__pg_world_t* wd) {
  pthread_mutex_lock(&wd->mu);
  int done = wd->dump_done;
  pthread_mutex_unlock(&wd->mu);
  if (done || !wd->wd_store) return;
  char key[512];
  snprintf(key, sizeof key, "%s/exception_dump", wd->store_prefix);
  const char* k = key;
  int ready = 0;
  if (tr_store_client_check(wd->wd_store, &k, 1, &ready) < 0 || !ready) return;
  void* val = NULL;
  size_t len = 0;
  if (tr_store_client_get(wd->wd_store, key, &val, &len) < 0) return;
  int32_t origin = -1;
  if (len == sizeof origin) memcpy(&origin, val, sizeof origin);
  free(val);
  char reason[128];
  snprintf(reason, sizeof reason, "rank %d reported an error", origin);
  call_dump(wd, origin, reason);
}

static void check_group(tr__pg_world_t* wd, tr_pg_t* pg, int* stuck) {
  /* Backends that can retire all their completed works at once do so
   * first (blocking CUDA calls leave many behind, which would otherwise
   * keep their tensors and events until polled below, 64 a round). */
  tr__pg_backend_t* bes[TR__PG_NDEV];
  pthread_mutex_lock(&pg->mu);
  for (int d = 0; d < TR__PG_NDEV; d++) bes[d] = pg->be[d];
  pthread_mutex_unlock(&pg->mu);
  for (int d = 0; d < TR__PG_NDEV; d++)
    if (bes[d] && bes[d]->vt->reap) bes[d]->vt->reap(bes[d]);

  int64_t now = tr__now_ns();
  /* Snapshot the works in flight (with references). */
  tr_pg_work_t* list[64];
  int n = 0;
  int64_t oldest = now;
  pthread_mutex_lock(&pg->mu);
  for (tr_pg_work_t* w = pg->inflight; w; w = w->if_next) {
    if (tr__work_is_done(w)) continue;
    if (w->t_issue_ns < oldest) oldest = w->t_issue_ns;
    if (n < 64) { /* the rest in later rounds */
      tr__work_ref(w);
      list[n++] = w;
    }
  }
  int broken = pg->broken, reported = pg->reported;
  /* at most one look at the store per group and second */
  int look = now - pg->remote_check_ns >= remote_check_ns() * 2;
  if (look && !broken && n > 0 && now - oldest >= remote_check_ns())
    pg->remote_check_ns = now;
  else
    look = 0;
  pthread_mutex_unlock(&pg->mu);

  for (int i = 0; i < n; i++) {
    tr_pg_work_t* w = list[i];
    if (w->be && w->be->vt->poll) w->be->vt->poll(w->be, w);
    if (!tr__work_is_done(w) && now >= w->deadline_ns)
      tr__work_finish(w, TR_ETIMEDOUT, "timed out after %lld ms",
                      (long long)w->timeout_ms);
    tr__work_unref(w);
  }

  if (look) {
    *stuck = 1;
    char* msg = NULL;
    int origin = -1;
    int job = 0;
    if (wd->wd_store && (remote_report(wd, pg, &msg, &origin) ||
                         (job = job_failure(wd, &msg)))) {
      tr__pg_break(pg, TR_EABORTED, msg, 1);
      /* the peer is gone, not in an error of its own: our ops end with
       * the job's report before the abort makes them fail with the
       * backend's echo of it */
      if (job) fail_inflight(pg, msg);
      pthread_mutex_lock(&pg->mu);
      int mine = !pg->reported && pg->remote;
      pg->reported |= mine;
      pthread_mutex_unlock(&pg->mu);
      if (mine) report(wd, pg, msg, 1, origin);
      free(msg);
      return;
    }
  }

  /* A break of our own. A timeout is reported at once. Any other failure
   * (a connection closed...) is often the echo of a peer's abort: give the
   * peer's report a moment to arrive, and defer to it when it does. */
  pthread_mutex_lock(&pg->mu);
  broken = pg->broken;
  reported = pg->reported;
  int remote = pg->remote, rc = pg->error_rc;
  int64_t since = now - pg->broken_ns;
  char* msg = broken && !reported && pg->error ? strdup(pg->error) : NULL;
  pthread_mutex_unlock(&pg->mu);
  if (!msg) return;
  int origin = -1;
  if (!remote && rc != TR_ETIMEDOUT && wd->wd_store) {
    if (since < remote_check_ns() / 2) {
      free(msg);
      return; /* next round */
    }
    char* theirs = NULL;
    if (remote_report(wd, pg, &theirs, &origin)) {
      remote = 1;
      TR_LOG_INFO(COLL, "group '%s': %s", pg->name, theirs);
      free(theirs);
    }
  }
  pthread_mutex_lock(&pg->mu);
  int mine = !pg->reported;
  pg->reported = 1;
  pthread_mutex_unlock(&pg->mu);
  if (mine) report(wd, pg, msg, remote, origin);
  free(msg);
}

static void* watchdog_main(void* arg) {
  tr__pg_world_t* wd = arg;
  sigset_t set; /* store writes to a dead server: EPIPE, not SIGPIPE */
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  int64_t period = tr_param_int(TR_PARAM_PG_WATCHDOG_MS);
  pthread_mutex_lock(&wd->wd_mu);
  while (!wd->wd_stop) {
    if (!wd->wd_kick) {
      struct timespec ts = tr__deadline_ms(period);
      pthread_cond_timedwait(&wd->wd_cv, &wd->wd_mu, &ts);
    }
    wd->wd_kick = 0;
    if (wd->wd_stop) break;
    pthread_mutex_unlock(&wd->wd_mu);

    int stuck = 0;
    pthread_mutex_lock(&wd->mu);
    tr_pg_t* g = wd->groups;
    while (g) {
      g->wd_busy = 1;
      pthread_mutex_unlock(&wd->mu);
      check_group(wd, g, &stuck);
      pthread_mutex_lock(&wd->mu);
      tr_pg_t* next = g->w_next;
      g->wd_busy = 0;
      pthread_cond_broadcast(&wd->cv);
      g = next;
    }
    pthread_mutex_unlock(&wd->mu);
    if (stuck) check_exception_dump(wd);

    pthread_mutex_lock(&wd->wd_mu);
  }
  pthread_mutex_unlock(&wd->wd_mu);
  return NULL;
}

int tr__watchdog_start(tr__pg_world_t* wd) {
  pthread_mutex_init(&wd->wd_mu, NULL);
  pthread_cond_init(&wd->wd_cv, NULL);
  int rc = pthread_create(&wd->wd_thread, NULL, watchdog_main, wd);
  if (rc != 0) {
    pthread_mutex_destroy(&wd->wd_mu);
    pthread_cond_destroy(&wd->wd_cv);
    return -rc;
  }
  wd->wd_started = 1;
  return 0;
}

void tr__watchdog_stop(tr__pg_world_t* wd) {
  if (!wd->wd_started) return;
  pthread_mutex_lock(&wd->wd_mu);
  wd->wd_stop = 1;
  pthread_cond_signal(&wd->wd_cv);
  pthread_mutex_unlock(&wd->wd_mu);
  pthread_join(wd->wd_thread, NULL);
  wd->wd_started = 0;
  pthread_mutex_destroy(&wd->wd_mu);
  pthread_cond_destroy(&wd->wd_cv);
}
