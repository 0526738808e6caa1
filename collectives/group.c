/* collectives/group.c: what the parts of a process group share, below
 * pg.c: the names of ops, reductions and backends; the process-wide hooks
 * (the flight recorder's) and the CUDA start-event switch; a group's
 * timeout; breaking a group (and waking the watchdog to act on it); the
 * group's own store connections for set-up steps. work.c, queue.c,
 * watchdog.c and the backends call these; this file calls none of them,
 * so the files of collectives/ form no cycle (tests/layers.test). */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/internal.h"
#include "core/clock.h"
#include "trainrun/error.h"

/* ---- names ---- */

static const char* const k_op_names[] = {
#define TR__PG_OP_STR(name, str) str,
    TR_PG_OP_MAP(TR__PG_OP_STR)
#undef TR__PG_OP_STR
};

const char* tr_pg_op_name(tr_pg_op_t op) {
  return (unsigned)op < TR_PG_OP__COUNT ? k_op_names[op] : "unknown";
}

const char* tr_pg_reduce_op_name(tr_pg_reduce_op_t op) {
  switch (op) {
    case TR_PG_SUM:
      return "sum";
    case TR_PG_AVG:
      return "avg";
    case TR_PG_MAX:
      return "max";
    case TR_PG_MIN:
      return "min";
    case TR_PG_PRODUCT:
      return "product";
    default:
      return "unknown";
  }
}

const char* tr_pg_backend_name(tr_pg_backend_t b) {
  switch (b) {
    case TR_PG_BACKEND_GLOO:
      return "gloo";
    case TR_PG_BACKEND_NCCL:
      return "nccl";
    case TR_PG_BACKEND_MPI:
      return "mpi";
    case TR_PG_BACKEND_FAKE:
      return "fake";
    default:
      return "none";
  }
}

/* ---- hooks ---- */

static tr_pg_hooks_t g_hooks;

void tr_pg_set_hooks(const tr_pg_hooks_t* hooks) {
  if (hooks)
    g_hooks = *hooks;
  else
    memset(&g_hooks, 0, sizeof g_hooks);
}

const tr_pg_hooks_t* tr__pg_hooks(void) { return &g_hooks; }

static int g_cuda_start_events;

void tr_pg_set_cuda_start_events(int on) {
  __atomic_store_n(&g_cuda_start_events, on != 0, __ATOMIC_RELAXED);
}

int tr__pg_cuda_start_events(void) {
  return __atomic_load_n(&g_cuda_start_events, __ATOMIC_RELAXED);
}

/* ---- the group's state ---- */

int64_t tr_pg_timeout(const tr_pg_t* pg) {
  tr_pg_t* p = (tr_pg_t*)pg;
  pthread_mutex_lock(&p->mu);
  int64_t t = p->timeout_ms;
  pthread_mutex_unlock(&p->mu);
  return t;
}

void tr__pg_break(tr_pg_t* pg, int rc, const char* msg, int remote) {
  pthread_mutex_lock(&pg->mu);
  int first = !pg->broken;
  if (first) {
    pg->broken = 1;
    pg->remote = remote;
    pg->error_rc = rc;
    pg->broken_ns = tr__now_ns();
    pg->error = strdup(msg);
  }
  pthread_mutex_unlock(&pg->mu);
  if (!first) return;
  tr__pg_world_t* wd = pg->world;
  pthread_mutex_lock(&wd->mu);
  if (!wd->first_error) wd->first_error = strdup(msg);
  pthread_mutex_unlock(&wd->mu);
  tr__watchdog_kick(wd);
}

int tr__pg_store_open(tr_pg_t* pg, tr_store_client_t** c,
                      tr_store_prefix_t* p) {
  tr__pg_world_t* wd = pg->world;
  *c = NULL;
  if (!wd->store) return TR_EINVAL;
  pthread_mutex_lock(&wd->store_mu);
  int rc = tr_store_client_clone(wd->store, c);
  pthread_mutex_unlock(&wd->store_mu);
  if (rc < 0) return rc;
  tr_store_client_set_timeout(*c, tr_pg_timeout(pg));
  rc = tr_store_prefix_init(p, *c, pg->prefix);
  if (rc < 0) {
    tr_store_client_free(*c);
    *c = NULL;
  }
  return rc;
}

void tr__pg_store_close(tr_store_client_t* c, tr_store_prefix_t* p) {
  if (!c) return;
  tr_store_prefix_release(p);
  tr_store_client_free(c);
}

/* Why a set-up wait gives up early (into err), or 0 to go on waiting. */
static int give_up(tr_pg_t* pg, const int* stop, tr_store_client_t* c,
                   char* err, size_t errlen) {
  if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
    snprintf(err, errlen, "the group is being shut down");
    return 1;
  }
  pthread_mutex_lock(&pg->mu);
  int broken = pg->broken;
  if (broken)
    snprintf(err, errlen, "the group broke: %s",
             pg->error ? pg->error : "an earlier error");
  pthread_mutex_unlock(&pg->mu);
  if (broken) return 1;
  const char* key = pg->world->failure_key;
  int ready = 0;
  if (!key || tr_store_client_check(c, &key, 1, &ready) < 0 || !ready) return 0;
  void* val = NULL;
  size_t len = 0;
  if (tr_store_client_get(c, key, &val, &len) < 0) len = 0;
  const char* text = val ? val : "";
  size_t line = 0;
  while (line < len && text[line] != '\n' && text[line] != '\0') line++;
  snprintf(err, errlen, "the job failed: %.*s", (int)line, text);
  free(val);
  return 1;
}

int tr__pg_store_wait(tr_pg_t* pg, const int* stop, tr_store_client_t* c,
                      tr_store_prefix_t* p, const char* const* keys, size_t n,
                      int64_t timeout_ms, char* err, size_t errlen) {
  int64_t deadline = tr__now_ns() + timeout_ms * 1000000;
  for (;;) {
    if (give_up(pg, stop, c, err, errlen)) return TR_EABORTED;
    int64_t left = (deadline - tr__now_ns()) / 1000000;
    if (left <= 0) {
      snprintf(err, errlen, "timed out after %lld ms", (long long)timeout_ms);
      return TR_ETIMEDOUT;
    }
    int rc = tr_store_prefix_wait(p, keys, n, left < 200 ? left : 200);
    if (rc == 0) return 0;
    if (rc != TR_ETIMEDOUT) {
      snprintf(err, errlen, "%s", tr_strerror(rc));
      return rc;
    }
  }
}

void tr__watchdog_kick(tr__pg_world_t* wd) {
  if (!wd->wd_started) return;
  pthread_mutex_lock(&wd->wd_mu);
  wd->wd_kick = 1;
  pthread_cond_signal(&wd->wd_cv);
  pthread_mutex_unlock(&wd->wd_mu);
}
