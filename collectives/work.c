/* collectives/work.c: work handles -- one per issued op or coalesced group:
 * reference counting, completion (status, the error message naming group,
 * op, sequence number and peers), wait with a timeout, test, the completion
 * callback, and the flight-recorder start/complete hooks. */
#include "config.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "collectives/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

tr_pg_work_t* tr__work_new(tr_pg_t* pg, int n_ops) {
  tr_pg_work_t* w = calloc(1, sizeof *w);
  if (!w) return NULL;
  if (n_ops <= 1) {
    w->ops = &w->op0;
  } else if (!(w->ops = calloc((size_t)n_ops, sizeof *w->ops))) {
    free(w);
    return NULL;
  }
  w->n_ops = n_ops;
  w->refs = 1;
  w->status = 1;
  w->pg = pg;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  return w;
}

void tr__work_ref(tr_pg_work_t* w) {
  __atomic_add_fetch(&w->refs, 1, __ATOMIC_RELAXED);
}

/* The work's references to its tensors (staged copies and the caller's
 * own), dropped. */
static void drop_tensors(tr_pg_work_t* w) {
  for (int i = 0; i < w->n_ops; i++) {
    tr__pg_op_t* op = &w->ops[i];
    tr_tensor_release(&op->in);
    tr_tensor_release(&op->out);
    tr_tensor_release(&op->user);
  }
}

void tr__work_unref(tr_pg_work_t* w) {
  if (!w || __atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  drop_tensors(w);
  for (int i = 0; i < w->n_ops; i++) {
    tr__pg_op_t* op = &w->ops[i];
    free(op->in_counts);
    free(op->out_counts);
  }
  if (w->ops != &w->op0) free(w->ops);
  free(w->err);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

void tr__rank_list_str(const int* r, int n, char* buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && off + 1 < len;) {
    int j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
    int k;
    if (j > i)
      k = snprintf(buf + off, len - off, "%s%d-%d", i ? ", " : "", r[i], r[j]);
    else
      k = snprintf(buf + off, len - off, "%s%d", i ? ", " : "", r[i]);
    if (k < 0) break;
    off += (size_t)k;
    i = j + 1;
  }
  if (off >= len && len > 4) strcpy(buf + len - 4, "...");
}

static int cmp_int(const void* a, const void* b) {
  int x = *(const int*)a, y = *(const int*)b;
  return (x > y) - (x < y);
}

/* The peers of w as global ranks: every other member for collectives, the
 * peers of its p2p ops otherwise. */
static void peers_str(const tr_pg_work_t* w, char* buf, size_t len) {
  const tr_pg_t* pg = w->pg;
  int* r = malloc(sizeof(int) * (size_t)(pg->size + w->n_ops + 1));
  int n = 0;
  if (!r) {
    snprintf(buf, len, "?");
    return;
  }
  if (w->is_p2p) {
    for (int i = 0; i < w->n_ops; i++) {
      int g = pg->granks[w->ops[i].peer];
      int dup = 0;
      for (int k = 0; k < n; k++) dup |= r[k] == g;
      if (!dup) r[n++] = g;
    }
    qsort(r, (size_t)n, sizeof(int), cmp_int);
  } else {
    for (int i = 0; i < pg->size; i++)
      if (i != pg->rank) r[n++] = pg->granks[i];
    qsort(r, (size_t)n, sizeof(int), cmp_int);
  }
  if (n == 0)
    snprintf(buf, len, "none");
  else
    tr__rank_list_str(r, n, buf, len);
  free(r);
}

static void run_start_hooks(tr_pg_work_t* w, int64_t t) {
  const tr_pg_hooks_t* h = tr__pg_hooks();
  if (!h->start) return;
  for (int i = 0; i < w->n_ops; i++) h->start(h->arg, w->ops[i].fr_id, t);
  if (w->coalesced) h->start(h->arg, w->fr_id, t);
}

void tr__work_started(tr_pg_work_t* w) {
  /* under the lock, so a completion racing with us is recorded after */
  pthread_mutex_lock(&w->mu);
  if (!w->started) {
    w->started = 1;
    run_start_hooks(w, tr__wall_ns());
  }
  pthread_mutex_unlock(&w->mu);
}

int tr__work_is_done(tr_pg_work_t* w) {
  return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
}

int tr__work_finish(tr_pg_work_t* w, int status, const char* detail_fmt, ...) {
  char* msg = NULL;
  if (status < 0) {
    char detail[1024], peers[256];
    va_list ap;
    va_start(ap, detail_fmt);
    vsnprintf(detail, sizeof detail, detail_fmt, ap);
    va_end(ap);
    peers_str(w, peers, sizeof peers);
    tr_pg_t* pg = w->pg;
    size_t n = strlen(detail) + strlen(peers) + strlen(pg->name) +
               strlen(pg->desc) + 256;
    msg = malloc(n);
    if (msg)
      snprintf(msg, n,
               "process group '%s' (%s) rank %d/%d: %s seq %lld %s; "
               "peers: %s",
               pg->name, pg->desc, pg->rank, pg->size, w->profiling_name,
               (long long)(w->is_p2p ? w->p2p_seq : w->seq), detail, peers);
  }

  /* Copy staged outputs back before anyone can see the work done. */
  if (status == 0 && !tr__work_is_done(w)) {
    for (int i = 0; i < w->n_ops; i++) {
      tr__pg_op_t* op = &w->ops[i];
      if (op->user.storage) {
        int rc = tr_tensor_copy(&op->user, &op->out);
        if (rc < 0) status = rc;
      }
    }
  }

  pthread_mutex_lock(&w->mu);
  if (w->done) {
    pthread_mutex_unlock(&w->mu);
    free(msg);
    return 0;
  }
  /* The group breaks before anyone can see the work failed. */
  if (status < 0 && msg) {
    int remote = status == TR_EABORTED && strstr(msg, " reported: ") != NULL;
    tr__pg_break(w->pg, status, msg, remote);
  }
  /* A work that succeeded is done with its buffers: they are freed before
   * a waiter can see it done, so that the memory a caller releases after
   * its wait is free then, not whenever this thread retires the work (a
   * failed one keeps them: a backend may still be writing). */
  if (status == 0) drop_tensors(w);
  w->status = status;
  w->err = msg;
  if (w->timed && !w->dur_set) {
    int64_t t0 = __atomic_load_n(&w->t_start_ns, __ATOMIC_RELAXED);
    w->dur_us = (double)(tr__now_ns() - (t0 ? t0 : w->t_issue_ns)) / 1e3;
  }
  int was_started = w->started;
  w->started = 1;
  /* The flight recorder hears of the completion before any waiter can see
   * it: a rank that dumps right after its wait finds the op completed. */
  const tr_pg_hooks_t* h = tr__pg_hooks();
  int64_t t = tr__wall_ns();
  if (!was_started && status == 0) run_start_hooks(w, t);
  if (h->complete) {
    for (int i = 0; i < w->n_ops; i++)
      h->complete(h->arg, w->ops[i].fr_id, t, status);
    if (w->coalesced) h->complete(h->arg, w->fr_id, t, status);
  }
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  tr_pg_work_cb cb = w->cb;
  void* cb_arg = w->cb_arg;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (cb) cb(w, status, cb_arg);
  return 1;
}

void tr__work_retire(tr_pg_work_t* w) {
  tr_pg_t* pg = w->pg;
  pthread_mutex_lock(&pg->mu);
  if (w->in_flight) {
    if (w->if_prev)
      w->if_prev->if_next = w->if_next;
    else
      pg->inflight = w->if_next;
    if (w->if_next) w->if_next->if_prev = w->if_prev;
    w->if_prev = w->if_next = NULL;
    w->in_flight = 0;
    if (!pg->inflight) pthread_cond_broadcast(&pg->cv);
  }
  pthread_mutex_unlock(&pg->mu);
  tr__work_unref(w);
}

/* ---- public ---- */

int tr_pg_work_wait(tr_pg_work_t* w, int64_t timeout_ms) {
  if (!w) return TR_EINVAL;
  /* CUDA works complete when their event does: poll it here rather than
   * wait for the watchdog's next round. (A done work's backend may be
   * freed already: its group was.) */
  if (!tr__work_is_done(w) && w->be && w->be->vt->poll) {
    /* yield for the first 2 ms (a sleep lasts 50 us more than asked: the
     * timer slack), then sleep 20, 40, 50, 50... us: a wait that outlasts
     * the yielding sees the completion at most ~100 us late (a 200 us cap
     * cost short collectives several percent) */
    int64_t start = tr__now_ns();
    int64_t end = timeout_ms > 0 ? start + timeout_ms * 1000000 : 0;
    int64_t sleep_ns = 20000;
    while (!tr__work_is_done(w)) {
      if (w->be->vt->poll(w->be, w)) break;
      int64_t now = tr__now_ns();
      if (end && now >= end) return TR_ETIMEDOUT;
      if (now - start < 2000000) {
        sched_yield();
        continue;
      }
      struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      sleep_ns *= 2;
      if (sleep_ns > 50000) sleep_ns = 50000;
    }
  }
  pthread_mutex_lock(&w->mu);
  if (timeout_ms > 0) {
    struct timespec ts = tr__deadline_ms(timeout_ms);
    while (!w->done) {
      if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT &&
          !w->done) {
        pthread_mutex_unlock(&w->mu);
        return TR_ETIMEDOUT;
      }
    }
  } else {
    while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
  }
  int st = w->status;
  pthread_mutex_unlock(&w->mu);
  return st;
}

int tr_pg_work_wait_stream(tr_pg_work_t* w, void* stream) {
  if (!w) return TR_EINVAL;
  if (!tr__work_is_done(w) && w->be && w->be->vt->wait_stream)
    return w->be->vt->wait_stream(w->be, w, stream);
  return tr_pg_work_wait(w, 0);
}

int tr_pg_work_test(tr_pg_work_t* w) {
  if (!w) return TR_EINVAL;
  if (!tr__work_is_done(w) && w->be && w->be->vt->poll)
    w->be->vt->poll(w->be, w);
  return tr__work_is_done(w);
}

int tr_pg_work_status(tr_pg_work_t* w) {
  if (!w) return TR_EINVAL;
  if (!tr_pg_work_test(w)) return 1;
  pthread_mutex_lock(&w->mu);
  int st = w->status;
  pthread_mutex_unlock(&w->mu);
  return st;
}

const char* tr_pg_work_error(tr_pg_work_t* w) {
  if (!w || !tr__work_is_done(w)) return NULL;
  return w->err;
}

int tr_pg_work_on_complete(tr_pg_work_t* w, tr_pg_work_cb cb, void* arg) {
  if (!w || !cb) return TR_EINVAL;
  pthread_mutex_lock(&w->mu);
  if (w->cb_set) {
    pthread_mutex_unlock(&w->mu);
    return TR_EINVAL;
  }
  w->cb_set = 1;
  if (!w->done) {
    w->cb = cb;
    w->cb_arg = arg;
    pthread_mutex_unlock(&w->mu);
    return 0;
  }
  int st = w->status;
  pthread_mutex_unlock(&w->mu);
  cb(w, st, arg);
  return 0;
}

void tr_pg_work_free(tr_pg_work_t* w) { tr__work_unref(w); }

int tr_pg_work_duration_us(tr_pg_work_t* w, double* us) {
  if (!w || !us || !w->timed) return TR_EINVAL;
  /* tr_pg_work_test polls (an event query at most): it never waits */
  if (tr_pg_work_test(w) != 1) return TR_EAGAIN;
  /* written before done was published (release), read after (acquire) */
  *us = w->dur_us;
  return 0;
}
