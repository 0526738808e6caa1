/* collectives/queue.c: the communication thread of a CPU backend (Gloo,
 * MPI) of one group. Works run in the order they were queued; a backend's
 * start either completes a work or leaves it pending (p2p ops, MPI's
 * nonblocking calls) and its progress finishes pending ones while the queue
 * is empty. So ops of one group keep their order, ops of different groups
 * overlap, and the issuing thread never blocks on the network. */
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

static tr_pg_work_t* pop(tr__pg_backend_t* be) {
  tr_pg_work_t* w = be->qhead;
  if (w) {
    be->qhead = w->q_next;
    if (!be->qhead) be->qtail = NULL;
    w->q_next = NULL;
  }
  return w;
}

static void run_one(tr__pg_backend_t* be, tr_pg_work_t* w) {
  tr_pg_t* pg = be->pg;
  if (be->create_rc < 0) {
    tr__work_finish(w, be->create_rc, "failed: %s", be->create_err);
    tr__work_retire(w);
    return;
  }
  pthread_mutex_lock(&pg->mu);
  int broken = pg->broken;
  char* why = broken && pg->error ? strdup(pg->error) : NULL;
  pthread_mutex_unlock(&pg->mu);
  if (broken || __atomic_load_n(&be->aborted, __ATOMIC_ACQUIRE)) {
    tr__work_finish(w, TR_EABORTED, "aborted after an earlier error: %s",
                    why ? why : "the group was aborted");
    free(why);
    tr__work_retire(w);
    return;
  }
  if (tr__work_is_done(w)) { /* timed out while queued */
    tr__work_retire(w);
    return;
  }
  tr__work_started(w);
  /* op timing: the wall clock of this thread, from here to the finish */
  if (w->timed)
    __atomic_store_n(&w->t_start_ns, tr__now_ns(), __ATOMIC_RELAXED);
  char err[1024] = "";
  int rc = be->vt->start(be, w, err, sizeof err);
  if (rc == 1) {
    __atomic_add_fetch(&be->npending, 1, __ATOMIC_RELAXED);
    return; /* the backend finishes and retires it */
  }
  if (rc < 0)
    tr__work_finish(w, rc, "failed: %s", err[0] ? err : tr_strerror(rc));
  else
    tr__work_finish(w, 0, NULL);
  tr__work_retire(w);
}

static void* comm_thread(void* arg) {
  tr__pg_backend_t* be = arg;
  /* A peer that dies must give an error, not kill us: writes to its socket
   * raise SIGPIPE in the writing thread. Blocked here, and in the threads
   * the backend starts from here (Gloo's event loop), the write fails with
   * EPIPE instead. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  char err[sizeof be->create_err] = "";
  int rc = be->vt->create(be, err, sizeof err);
  pthread_mutex_lock(&be->qmu);
  be->create_rc = rc;
  snprintf(be->create_err, sizeof be->create_err, "%s",
           err[0] ? err : tr_strerror(rc));
  be->ready = 1;
  pthread_cond_broadcast(&be->qcv);
  pthread_mutex_unlock(&be->qmu);
  for (;;) {
    pthread_mutex_lock(&be->qmu);
    while (!be->qhead && !be->stop &&
           __atomic_load_n(&be->npending, __ATOMIC_RELAXED) == 0)
      pthread_cond_wait(&be->qcv, &be->qmu);
    tr_pg_work_t* w = pop(be);
    int stop = be->stop;
    pthread_mutex_unlock(&be->qmu);
    if (w) {
      run_one(be, w);
      continue;
    }
    if (__atomic_load_n(&be->npending, __ATOMIC_RELAXED) > 0) {
      /* Pending works end by their deadlines (the watchdog aborts the
       * backend), so stopping waits for them unless already aborted; then
       * one last look collects what completed. */
      if (stop && __atomic_load_n(&be->aborted, __ATOMIC_ACQUIRE)) {
        be->vt->progress(be, 0);
        break;
      }
      be->vt->progress(be, 100);
      continue;
    }
    if (stop) break;
  }
  return NULL;
}

int tr__queue_start(tr__pg_backend_t* be) {
  pthread_mutex_init(&be->qmu, NULL);
  pthread_cond_init(&be->qcv, NULL);
  int rc = pthread_create(&be->thread, NULL, comm_thread, be);
  if (rc != 0) {
    pthread_mutex_destroy(&be->qmu);
    pthread_cond_destroy(&be->qcv);
    return -rc;
  }
  be->thread_started = 1;
  return 0;
}

int tr__queue_wait_ready(tr__pg_backend_t* be, char* err, size_t errlen) {
  pthread_mutex_lock(&be->qmu);
  while (!be->ready) pthread_cond_wait(&be->qcv, &be->qmu);
  int rc = be->create_rc;
  if (rc < 0) snprintf(err, errlen, "%s", be->create_err);
  pthread_mutex_unlock(&be->qmu);
  return rc;
}

void tr__queue_push(tr__pg_backend_t* be, tr_pg_work_t* w) {
  pthread_mutex_lock(&be->qmu);
  w->q_next = NULL;
  if (be->qtail)
    be->qtail->q_next = w;
  else
    be->qhead = w;
  be->qtail = w;
  pthread_cond_broadcast(&be->qcv);
  pthread_mutex_unlock(&be->qmu);
  if (be->vt->wake) be->vt->wake(be);
}

int tr__queue_has_news(tr__pg_backend_t* be) {
  pthread_mutex_lock(&be->qmu);
  int news = be->qhead != NULL || be->stop;
  pthread_mutex_unlock(&be->qmu);
  return news;
}

void tr__queue_stop(tr__pg_backend_t* be) {
  if (!be->thread_started) return;
  pthread_mutex_lock(&be->qmu);
  be->stop = 1;
  pthread_cond_signal(&be->qcv);
  pthread_mutex_unlock(&be->qmu);
  if (be->vt->wake) be->vt->wake(be);
  pthread_join(be->thread, NULL);
  be->thread_started = 0;
  pthread_mutex_destroy(&be->qmu);
  pthread_cond_destroy(&be->qcv);
}
