/* collectives/internal.h: what the files of collectives/ share -- the world
 * (store clients, watchdog, the list of groups), groups, works (one per
 * issued op or coalesced group), the backend interface every backend
 * implements, the CPU communication thread, and local reductions.
 *
 * Life of an op: pg.c checks the arguments and builds a work holding
 * references to (contiguous) tensors; tr__pg_submit hands it to the
 * backend of its device -- straight to vt->start on the issuing thread
 * (nccl, fake) or through the group's queue to its communication thread
 * (gloo, mpi; queue.c). The backend finishes the work (tr__work_finish: the
 * result, the message, hooks, callback) and, when it no longer touches the
 * buffers, retires it (tr__work_retire: off the group's in-flight list, the
 * engine's reference dropped). The watchdog finishes works that pass their
 * deadline and breaks their group.
 */
#ifndef TRAINRUN_COLLECTIVES_INTERNAL_H
#define TRAINRUN_COLLECTIVES_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "trainrun/pg.h"
#include "trainrun/store.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr__pg_world tr__pg_world_t;
typedef struct tr__pg_backend tr__pg_backend_t;

/* Device slots of a group: one backend per device type. */
#define TR__PG_NDEV 2

/* Extra time a backend's own timeout gets past the op's deadline, so that
 * the watchdog is the one that reports a timeout (one message format). */
#define TR__PG_GRACE_MS 2000

/* ---- ops and works ---- */

typedef struct {
  tr_pg_op_t type;
  tr_pg_reduce_op_t rop;
  int peer;           /* root (broadcast, reduce) or peer (send, recv) */
  int tag;            /* send / recv */
  tr_tensor_t in;     /* contiguous input: all_gather, reduce_scatter,
                       all_to_all, send (holds nothing otherwise) */
  tr_tensor_t out;    /* contiguous output; the buffer of in-place ops */
  tr_tensor_t user;   /* caller's non-contiguous output that out is staged
                       for (copied back on success); else nothing */
  int64_t* in_counts; /* all_to_all: elements per rank; NULL: equal */
  int64_t* out_counts;
  int64_t op_id;
  int64_t fr_id; /* what hooks->enqueue returned */
  int done;      /* backend bookkeeping (p2p completion) */
} tr__pg_op_t;

struct tr_pg_work_s {
  int refs; /* atomic */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  int status;
  char* err;
  tr_pg_work_cb cb;
  void* cb_arg;
  int cb_set;
  int started; /* the start hook ran */

  tr_pg_t* pg; /* valid until retired */
  tr__pg_backend_t* be;
  tr_device_type_t dev;
  int n_ops;
  tr__pg_op_t* ops; /* &op0 for one op; coalesced works grow it apart */
  int coalesced;
  int block_stream; /* no handle: the group's CUDA stream must wait for w
                       (nccl's start does it, sparing the issuing thread a
                       second trip into the backend) */
  int is_p2p;
  int64_t seq;     /* collective_seq_id at issue */
  int64_t p2p_seq; /* p2p_seq_id at issue */
  int64_t op_id;   /* of the coalesced entry (coalesced works) */
  int64_t fr_id;   /* of the coalesced entry */
  char profiling_name[64];
  int64_t timeout_ms;
  int64_t t_issue_ns;  /* CLOCK_MONOTONIC */
  int64_t deadline_ns; /* CLOCK_MONOTONIC */
  /* Op timing (tr_pg_set_op_timing was on at issue). CPU backends: the
   * monotonic time the backend began w (0: never began: the duration then
   * runs from t_issue_ns); tr__work_finish turns it into dur_us unless the
   * backend set dur_us itself (CUDA: the events' elapsed time) and
   * dur_set. */
  int timed;
  int dur_set;
  int64_t t_start_ns;
  double dur_us;

  tr_pg_work_t* q_next;  /* backend queue */
  tr_pg_work_t* if_prev; /* group in-flight list */
  tr_pg_work_t* if_next;
  int in_flight;
  void* be_data;   /* backend state of this work */
  tr__pg_op_t op0; /* the ops of a single-op work: one allocation a work */
};

/* A new work for pg with n_ops zeroed ops, one reference (the caller's).
 * n_ops <= 1 uses w->op0 (w->ops == &w->op0: never freed or reallocated
 * apart from w). */
tr_pg_work_t* tr__work_new(tr_pg_t* pg, int n_ops);
void tr__work_ref(tr_pg_work_t* w);
/* Drop a reference; the last frees the tensors and the work. */
void tr__work_unref(tr_pg_work_t* w);

/* Complete w once (later calls are ignored; returns 1 when this call did
 * it). status < 0 builds the message "<group> rank r/n: <profiling name> seq
 * N <detail>; peers: ..." and breaks the group (the watchdog reports it);
 * TR_EABORTED from a remote report breaks the group without reporting
 * again. On success, staged outputs are copied back first. Fires the
 * complete hooks and the callback. */
int tr__work_finish(tr_pg_work_t* w, int status, const char* detail_fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The backend no longer touches w's buffers: off the in-flight list, drop
 * the engine's reference. */
void tr__work_retire(tr_pg_work_t* w);
/* Run the start hooks once (backends call it when the op begins). */
void tr__work_started(tr_pg_work_t* w);
int tr__work_is_done(tr_pg_work_t* w);

/* "1-3, 5" from sorted ints into buf. */
void tr__rank_list_str(const int* r, int n, char* buf, size_t len);

/* ---- backends ---- */

typedef struct {
  tr_pg_backend_t kind;
  const char* name;
  int threaded; /* runs on the group's communication thread (queue.c) */
  /* Set up (rendezvous): collective over the group, on the issuing thread.
   * On failure writes a short reason into err. */
  int (*create)(tr__pg_backend_t* be, char* err, size_t errlen);
  /* Begin w: 0 when it completed (the caller finishes it), 1 when it is
   * pending (the backend finishes and retires it later), < 0 on failure
   * with the reason in err (the caller finishes it with "failed: err").
   * Non-threaded backends that return 1 for a w->block_stream work have
   * made the group's CUDA stream wait for it (or cleared block_stream). */
  int (*start)(tr__pg_backend_t* be, tr_pg_work_t* w, char* err, size_t errlen);
  /* Threaded backends with pending works: make progress for up to
   * timeout_ms (returns early when woken); finishes and retires works. */
  void (*progress)(tr__pg_backend_t* be, int64_t timeout_ms);
  /* Interrupt progress (a new work was queued, or stop). Any thread. */
  void (*wake)(tr__pg_backend_t* be);
  /* Abort the communicators so blocked calls return. Any thread. */
  void (*abort)(tr__pg_backend_t* be);
  /* Non-threaded asynchronous backends (nccl): check w, finishing and
   * retiring it when complete. 1: done, 0: pending. Any thread. */
  int (*poll)(tr__pg_backend_t* be, tr_pg_work_t* w);
  /* Make a CUDA stream wait for w (nccl). */
  int (*wait_stream)(tr__pg_backend_t* be, tr_pg_work_t* w, void* stream);
  /* Free everything (after the thread stopped, no work in flight). */
  void (*destroy)(tr__pg_backend_t* be);
  /* Non-threaded asynchronous backends (nccl), from the watchdog once a
   * round: finish and retire every pending work that completed (the
   * per-work polls see 64 a round). May be NULL
   * (last member: gloo.cc fills this table by position). */
  void (*reap)(tr__pg_backend_t* be);
} tr__pg_backend_vt_t;

struct tr__pg_backend {
  const tr__pg_backend_vt_t* vt;
  tr_pg_t* pg;
  tr_device_type_t dev;
  int aborted; /* atomic */
  void* impl;

  /* communication thread (threaded backends; queue.c) */
  pthread_t thread;
  int thread_started;
  pthread_mutex_t qmu;
  pthread_cond_t qcv;
  tr_pg_work_t* qhead;
  tr_pg_work_t* qtail;
  int stop;
  int ready;     /* set-up done (vt->create ran on the thread) */
  int create_rc; /* its result */
  char create_err[512];
  int npending; /* works started and pending in the backend (atomic) */
};

extern const tr__pg_backend_vt_t tr__pg_fake_vt;
#ifdef HAVE_GLOO
extern const tr__pg_backend_vt_t tr__pg_gloo_vt;
#endif
#ifdef HAVE_MPI
extern const tr__pg_backend_vt_t tr__pg_mpi_vt;
/* MPI set-up for the world: initialise MPI when needed, read rank/size. */
int tr__mpi_world_init(int* rank, int* size, int* we_initialised);
void tr__mpi_world_release(int we_initialised, int clean);
/* Communicators are made when groups are (collective calls must come in
 * program order on every rank, which lazy set-up on threads cannot
 * promise): the world's dups MPI_COMM_WORLD; a child's is an MPI_Comm_split
 * of its parent's, called by every member of the parent (child NULL and
 * color -1 outside it). */
int tr__mpi_comm_world(tr_pg_t* world);
int tr__mpi_comm_split(tr_pg_t* parent, tr_pg_t* child, int color, int key);
/* Every parent rank's two ints (color, key) without a store. */
int tr__mpi_exchange(tr_pg_t* parent, const int mine[2], int* all);
void tr__mpi_comm_release(tr_pg_t* pg);
#endif
#ifdef HAVE_NCCL
extern const tr__pg_backend_vt_t tr__pg_nccl_vt;
/* ncclCommSplit of parent's communicator, called by every member of
 * parent's group: child is the new group (NULL for ranks outside it, who
 * pass color -1). On success child->be[TR_DEV_CUDA] is set up. */
int tr__nccl_split(tr__pg_backend_t* parent, tr_pg_t* child, int color, int key,
                   char* err, size_t errlen);
#endif

/* queue.c: start the thread, which first sets the backend up (vt->create,
 * so set-ups of different groups never wait for each other); queue a work
 * (the queue takes the engine's reference); wait for the set-up; stop
 * (drain) and join. */
int tr__queue_start(tr__pg_backend_t* be);
int tr__queue_wait_ready(tr__pg_backend_t* be, char* err, size_t errlen);
void tr__queue_push(tr__pg_backend_t* be, tr_pg_work_t* w);
void tr__queue_stop(tr__pg_backend_t* be);
/* For progress loops: 1 when works wait in the queue or stop was asked. */
int tr__queue_has_news(tr__pg_backend_t* be);

/* ---- groups and the world ---- */

struct tr__pg_world {
  int refs; /* groups alive (under mu) */
  int rank, size;
  char* store_prefix;
  tr_store_client_t* store; /* cloned (under store_mu) for set-ups */
  pthread_mutex_t store_mu;
  tr_store_client_t* wd_store; /* the watchdog's */
  tr_pg_backend_t kinds[TR__PG_NDEV];
  char* gloo_host;
  char* failure_key; /* tr_pg_opts_t.failure_key; NULL: none */
  int cuda_device;
  int mpi_we_initialised;
  int mpi_unclean; /* an MPI op was abandoned: do not finalise */

  pthread_mutex_t mu; /* groups list, counters, busy flags */
  pthread_cond_t cv;
  tr_pg_t* groups;
  int64_t next_uid;
  int dump_done;
  char* first_error;

  /* watchdog (watchdog.c) */
  pthread_t wd_thread;
  int wd_started;
  int wd_stop;
  int wd_kick;
  pthread_mutex_t wd_mu;
  pthread_cond_t wd_cv;
};

struct tr_pg_s {
  tr__pg_world_t* world;
  int64_t uid;
  char* name;
  char* desc;
  int rank, size;
  int* granks;             /* group rank -> global rank */
  char* prefix;            /* the group's store namespace */
  tr_store_prefix_t wd_sp; /* prefix on world->wd_store */
  tr_pg_backend_t kinds[TR__PG_NDEV];
  tr__pg_backend_t* be[TR__PG_NDEV];
  void* cuda_stream;
  void* mpi_comm;      /* MPI_Comm (mpi.c) */
  pthread_mutex_t bmu; /* backend set-up */

  int op_timing; /* atomic: tr_pg_set_op_timing */

  pthread_mutex_t mu; /* everything below */
  pthread_cond_t cv;  /* in-flight list emptied */
  int64_t seq_coll, seq_p2p, op_id;
  int64_t timeout_ms;
  int64_t children; /* groups made from this one */
  tr_pg_work_t* inflight;
  int broken;
  int reported;            /* the watchdog has reported the break */
  int remote;              /* broken by another rank's report */
  int error_rc;            /* the status that broke it */
  int64_t remote_check_ns; /* the watchdog's last look at the store */
  int64_t broken_ns;
  char* error;
  int coalescing;
  tr_pg_work_t* coal; /* ops held since coalesce_begin */
  int coal_cap;
  tr_pg_stats_t stats;
  /* world list, under world->mu */
  tr_pg_t* w_next;
  int wd_busy;
};

/* A store connection of its own for a set-up step that may block on peers
 * (rendezvous, color exchange): a clone of the world's client with pg's
 * timeout, and pg's prefix on it in *p. tr__pg_store_close frees both. */
int tr__pg_store_open(tr_pg_t* pg, tr_store_client_t** c, tr_store_prefix_t* p);
void tr__pg_store_close(tr_store_client_t* c, tr_store_prefix_t* p);

/* Wait until keys (under p, opened by tr__pg_store_open) exist, up to
 * timeout_ms, in slices of at most 200 ms. Between slices it gives up with
 * TR_EABORTED and a reason in err when the world's failure report
 * (tr_pg_opts_t.failure_key) exists, pg is broken, or *stop (may be NULL;
 * read atomically: a backend's queue stop) is set: a set-up that waits for
 * a peer that died, or in a process that is shutting down, ends in a
 * fraction of a second rather than at the timeout. TR_ETIMEDOUT at the
 * timeout, other store errors as they come. */
int tr__pg_store_wait(tr_pg_t* pg, const int* stop, tr_store_client_t* c,
                      tr_store_prefix_t* p, const char* const* keys, size_t n,
                      int64_t timeout_ms, char* err, size_t errlen);

/* The process-wide hooks (a copy; fields may be NULL). */
const tr_pg_hooks_t* tr__pg_hooks(void);
/* tr_pg_set_cuda_start_events. */
int tr__pg_cuda_start_events(void);

/* Start / stop the world's watchdog (watchdog.c); wake it, an error to
 * report (group.c). */
int tr__watchdog_start(tr__pg_world_t* w);
void tr__watchdog_stop(tr__pg_world_t* w);
void tr__watchdog_kick(tr__pg_world_t* w);

/* Break pg with msg (first one wins) because of status rc; the watchdog
 * reports. remote: broken by another rank's report (no report of our
 * own). */
void tr__pg_break(tr_pg_t* pg, int rc, const char* msg, int remote);

/* ---- local reductions (reduce.c) ---- */

/* dst[i] = a[i] op b[i] for n elements of dt (AVG reduces as SUM). dst may
 * alias a or b. Half types compute in float and round per element. */
void tr__reduce(tr_dtype_t dt, tr_pg_reduce_op_t op, void* dst, const void* a,
                const void* b, size_t n);
/* x[i] /= divisor (ints: truncating; the AVG step). */
void tr__divide(tr_dtype_t dt, void* x, size_t n, int divisor);
/* Half types and SUM/AVG/PRODUCT reduce through float32 on CPU backends. */
int tr__reduce_in_f32(tr_dtype_t dt, tr_pg_reduce_op_t op);
void tr__to_f32(tr_dtype_t dt, const void* src, float* dst, size_t n);
void tr__from_f32(tr_dtype_t dt, const float* src, void* dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_COLLECTIVES_INTERNAL_H */
