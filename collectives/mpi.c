/* collectives/mpi.c: the MPI backend (Open MPI). Each group gets its own
 * communicator (a dup of MPI_COMM_WORLD for the world, MPI_Comm_create_group
 * for sub-groups; errors return instead of aborting). Ops are posted as
 * MPI's nonblocking calls on the group's communication thread and tested
 * by its progress loop, so async ops overlap and a timeout never leaves the
 * thread stuck inside MPI: an op past its deadline is failed by the
 * watchdog and abandoned (MPI cannot cancel a collective; the process then
 * skips MPI_Finalize, which would wait for it). bf16/f16 reductions go
 * through float32; AVG is a SUM divided afterwards. Our global ranks are
 * MPI_COMM_WORLD's ranks. */
#include "config.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "collectives/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* With MPI_THREAD_MULTIPLE our threads call MPI freely; at a lower level
 * every call of ours runs under this lock. */
static pthread_mutex_t g_mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_multiple;
static int g_unclean;
static int g_atexit;

static void mpi_lock(void) {
  if (!g_multiple) pthread_mutex_lock(&g_mpi_mu);
}

static void mpi_unlock(void) {
  if (!g_multiple) pthread_mutex_unlock(&g_mpi_mu);
}

static void finalize_at_exit(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return;
  if (__atomic_load_n(&g_unclean, __ATOMIC_ACQUIRE)) {
    TR_LOG_WARN(COLL,
                "an MPI op was abandoned after a timeout: not calling "
                "MPI_Finalize");
    return;
  }
  MPI_Finalize();
}

int tr__mpi_world_init(int* rank, int* size, int* we_initialised) {
  *we_initialised = 0;
  pthread_mutex_lock(&g_mpi_mu);
  int init = 0, fin = 0, rc = MPI_SUCCESS;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) {
    pthread_mutex_unlock(&g_mpi_mu);
    TR_LOG_ERROR(COLL, "MPI was finalised already");
    return TR_EMPI;
  }
  int provided = 0;
  if (!init) {
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc == MPI_SUCCESS) {
      *we_initialised = 1;
      if (!g_atexit) {
        g_atexit = 1;
        atexit(finalize_at_exit);
      }
    }
  } else
    MPI_Query_thread(&provided);
  g_multiple = provided >= MPI_THREAD_MULTIPLE;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(MPI_COMM_WORLD, rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(MPI_COMM_WORLD, size);
  pthread_mutex_unlock(&g_mpi_mu);
  if (rc != MPI_SUCCESS) {
    TR_LOG_ERROR(COLL, "cannot initialise MPI (error %d)", rc);
    return TR_EMPI;
  }
  return 0;
}

void tr__mpi_world_release(int we_initialised, int clean) {
  (void)we_initialised;
  if (!clean) __atomic_store_n(&g_unclean, 1, __ATOMIC_RELEASE);
}

static void mpi_errstr(int rc, char* err, size_t errlen) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) len = 0;
  buf[len] = '\0';
  snprintf(err, errlen, "%s", len ? buf : "MPI error");
}

typedef struct {
  MPI_Comm comm;
  tr_pg_work_t* pending[4096]; /* posted works, in order */
  int npending;
} mpi_impl_t;

/* Per op: its request and staging. */
typedef struct {
  MPI_Request req;
  float* f_in; /* float32 staging of half types */
  float* f_out;
  int* counts; /* alltoallv: scounts, sdispls, rcounts, rdispls */
} mpi_op_t;

static MPI_Datatype mpi_type(tr_dtype_t dt) {
  switch (dt) {
    case TR_F32:
      return MPI_FLOAT;
    case TR_I32:
      return MPI_INT32_T;
    case TR_I64:
      return MPI_INT64_T;
    case TR_U8:
      return MPI_UINT8_T;
    default:
      return MPI_UINT16_T; /* u16, and halves moved as bits */
  }
}

static MPI_Op mpi_op(tr_pg_reduce_op_t op) {
  switch (op) {
    case TR_PG_PRODUCT:
      return MPI_PROD;
    case TR_PG_MAX:
      return MPI_MAX;
    case TR_PG_MIN:
      return MPI_MIN;
    default:
      return MPI_SUM;
  }
}

static int is_half(tr_dtype_t dt) { return dt == TR_BF16 || dt == TR_F16; }

static int comm_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return 0;
  char e[256];
  mpi_errstr(rc, e, sizeof e);
  TR_LOG_ERROR(COLL, "%s failed: %s", what, e);
  return TR_EMPI;
}

int tr__mpi_comm_world(tr_pg_t* world) {
  MPI_Comm c = MPI_COMM_NULL;
  mpi_lock();
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
  if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  mpi_unlock();
  TR_CHECK(comm_check(rc, "MPI_Comm_dup"));
  world->mpi_comm = c;
  return 0;
}

int tr__mpi_comm_split(tr_pg_t* parent, tr_pg_t* child, int color, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  mpi_lock();
  int rc = MPI_Comm_split((MPI_Comm)parent->mpi_comm,
                          color < 0 ? MPI_UNDEFINED : color, key, &c);
  if (rc == MPI_SUCCESS && c != MPI_COMM_NULL)
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  mpi_unlock();
  TR_CHECK(comm_check(rc, "MPI_Comm_split"));
  if (child)
    child->mpi_comm = c;
  else if (c != MPI_COMM_NULL)
    MPI_Comm_free(&c);
  return 0;
}

int tr__mpi_exchange(tr_pg_t* parent, const int mine[2], int* all) {
  mpi_lock();
  int rc = MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT,
                         (MPI_Comm)parent->mpi_comm);
  mpi_unlock();
  return comm_check(rc, "MPI_Allgather");
}

void tr__mpi_comm_release(tr_pg_t* pg) {
  MPI_Comm c = (MPI_Comm)pg->mpi_comm;
  pg->mpi_comm = NULL;
  if (c == MPI_COMM_NULL || c == NULL) return;
  /* after an abandoned op the communicator may still be in use */
  if (__atomic_load_n(&g_unclean, __ATOMIC_ACQUIRE)) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  mpi_lock();
  MPI_Comm_free(&c);
  mpi_unlock();
}

static int mpi_create(tr__pg_backend_t* be, char* err, size_t errlen) {
  tr_pg_t* pg = be->pg;
  if (!pg->mpi_comm) {
    snprintf(err, errlen, "group '%s' has no MPI communicator", pg->name);
    return TR_EMPI;
  }
  mpi_impl_t* im = calloc(1, sizeof *im);
  if (!im) return TR_ENOMEM;
  im->comm = (MPI_Comm)pg->mpi_comm;
  be->impl = im;
  return 0;
}

static int fits_int(int64_t n, char* err, size_t errlen) {
  if (n <= INT_MAX) return 1;
  snprintf(err, errlen, "%lld elements are more than MPI's int counts",
           (long long)n);
  return 0;
}

/* Post op i of w. */
static int post(mpi_impl_t* im, tr_pg_t* pg, tr__pg_op_t* op, mpi_op_t* m,
                char* err, size_t errlen) {
  MPI_Comm comm = im->comm;
  tr_dtype_t dt = op->out.storage ? op->out.dtype : op->in.dtype;
  MPI_Datatype mt = mpi_type(dt);
  void* out = op->out.storage ? tr_tensor_data(&op->out) : NULL;
  void* in = op->in.storage ? tr_tensor_data(&op->in) : NULL;
  int64_t nout = op->out.storage ? tr_tensor_numel(&op->out) : 0;
  int64_t nin = op->in.storage ? tr_tensor_numel(&op->in) : 0;
  if (!fits_int(nout, err, errlen) || !fits_int(nin, err, errlen))
    return TR_ELIMIT;
  int half = is_half(dt);
  MPI_Op mo = mpi_op(op->rop);
  m->req = MPI_REQUEST_NULL;
  switch (op->type) {
    case TR_PG_OP_ALL_REDUCE:
      if (half) {
        if (!(m->f_out = malloc(sizeof(float) * (size_t)(nout ? nout : 1))))
          return TR_ENOMEM;
        tr__to_f32(dt, out, m->f_out, (size_t)nout);
        return MPI_Iallreduce(MPI_IN_PLACE, m->f_out, (int)nout, MPI_FLOAT, mo,
                              comm, &m->req);
      }
      return MPI_Iallreduce(MPI_IN_PLACE, out, (int)nout, mt, mo, comm,
                            &m->req);
    case TR_PG_OP_ALL_GATHER:
      return MPI_Iallgather(in, (int)nin, mt, out, (int)nin, mt, comm, &m->req);
    case TR_PG_OP_REDUCE_SCATTER:
      if (half) {
        m->f_in = malloc(sizeof(float) * (size_t)(nin ? nin : 1));
        m->f_out = malloc(sizeof(float) * (size_t)(nout ? nout : 1));
        if (!m->f_in || !m->f_out) return TR_ENOMEM;
        tr__to_f32(dt, in, m->f_in, (size_t)nin);
        return MPI_Ireduce_scatter_block(m->f_in, m->f_out, (int)nout,
                                         MPI_FLOAT, mo, comm, &m->req);
      }
      return MPI_Ireduce_scatter_block(in, out, (int)nout, mt, mo, comm,
                                       &m->req);
    case TR_PG_OP_BROADCAST:
      return MPI_Ibcast(out, (int)nout, mt, op->peer, comm, &m->req);
    case TR_PG_OP_REDUCE: {
      int root = pg->rank == op->peer;
      void* buf = out;
      MPI_Datatype t = mt;
      if (half) {
        if (!(m->f_out = malloc(sizeof(float) * (size_t)(nout ? nout : 1))))
          return TR_ENOMEM;
        tr__to_f32(dt, out, m->f_out, (size_t)nout);
        buf = m->f_out;
        t = MPI_FLOAT;
      }
      if (root)
        return MPI_Ireduce(MPI_IN_PLACE, buf, (int)nout, t, mo, op->peer, comm,
                           &m->req);
      return MPI_Ireduce(buf, NULL, (int)nout, t, mo, op->peer, comm, &m->req);
    }
    case TR_PG_OP_ALL_TO_ALL: {
      if (!op->in_counts)
        return MPI_Ialltoall(in, (int)(nin / pg->size), mt, out,
                             (int)(nout / pg->size), mt, comm, &m->req);
      int n = pg->size;
      if (!(m->counts = malloc(sizeof(int) * 4 * (size_t)n))) return TR_ENOMEM;
      int *sc = m->counts, *sd = sc + n, *rcn = sd + n, *rd = rcn + n;
      int64_t so = 0, ro = 0;
      for (int i = 0; i < n; i++) {
        sc[i] = (int)op->in_counts[i];
        rcn[i] = (int)op->out_counts[i];
        sd[i] = (int)so;
        rd[i] = (int)ro;
        so += op->in_counts[i];
        ro += op->out_counts[i];
      }
      return MPI_Ialltoallv(in, sc, sd, mt, out, rcn, rd, mt, comm, &m->req);
    }
    case TR_PG_OP_SEND:
      return MPI_Isend(in, (int)nin, mt, op->peer, op->tag, comm, &m->req);
    case TR_PG_OP_RECV:
      return MPI_Irecv(out, (int)nout, mt, op->peer, op->tag, comm, &m->req);
    case TR_PG_OP_BARRIER:
      return MPI_Ibarrier(comm, &m->req);
    default:
      return TR_EINVAL;
  }
}

static void free_ops(tr_pg_work_t* w) {
  mpi_op_t* m = w->be_data;
  if (!m) return;
  for (int i = 0; i < w->n_ops; i++) {
    free(m[i].f_in);
    free(m[i].f_out);
    free(m[i].counts);
  }
  free(m);
  w->be_data = NULL;
}

static int mpi_start(tr__pg_backend_t* be, tr_pg_work_t* w, char* err,
                     size_t errlen) {
  mpi_impl_t* im = be->impl;
  if (im->npending == (int)(sizeof im->pending / sizeof im->pending[0])) {
    snprintf(err, errlen, "too many MPI ops in flight");
    return TR_ELIMIT;
  }
  mpi_op_t* m = calloc((size_t)w->n_ops, sizeof *m);
  if (!m) return TR_ENOMEM;
  w->be_data = m;
  for (int i = 0; i < w->n_ops; i++) m[i].req = MPI_REQUEST_NULL;
  mpi_lock();
  int rc = 0;
  for (int i = 0; i < w->n_ops && rc == 0; i++)
    rc = post(im, be->pg, &w->ops[i], &m[i], err, errlen);
  mpi_unlock();
  if (rc != 0) {
    if (rc > 0) { /* an MPI error code */
      mpi_errstr(rc, err, errlen);
      rc = TR_EMPI;
    }
    /* Posted requests of this work (coalesced) stay with MPI. */
    int posted = 0;
    for (int i = 0; i < w->n_ops; i++) posted |= m[i].req != MPI_REQUEST_NULL;
    if (posted) {
      __atomic_store_n(&g_unclean, 1, __ATOMIC_RELEASE);
      w->be_data = NULL; /* leak: MPI may still use the buffers */
    } else {
      free_ops(w);
    }
    return rc;
  }
  im->pending[im->npending++] = w;
  return 1;
}

/* A completed work: AVG, float32 back to the dtype. */
static void finish_ops(tr_pg_t* pg, tr_pg_work_t* w) {
  mpi_op_t* m = w->be_data;
  for (int i = 0; i < w->n_ops; i++) {
    tr__pg_op_t* op = &w->ops[i];
    if (op->type != TR_PG_OP_ALL_REDUCE &&
        op->type != TR_PG_OP_REDUCE_SCATTER && op->type != TR_PG_OP_REDUCE)
      continue;
    if (op->type == TR_PG_OP_REDUCE && pg->rank != op->peer) continue;
    size_t n = (size_t)tr_tensor_numel(&op->out);
    void* out = tr_tensor_data(&op->out);
    if (m[i].f_out) {
      if (op->rop == TR_PG_AVG) tr__divide(TR_F32, m[i].f_out, n, pg->size);
      tr__from_f32(op->out.dtype, m[i].f_out, out, n);
    } else if (op->rop == TR_PG_AVG) {
      tr__divide(op->out.dtype, out, n, pg->size);
    }
  }
}

static void mpi_progress(tr__pg_backend_t* be, int64_t timeout_ms) {
  mpi_impl_t* im = be->impl;
  int64_t end = tr__now_ns() + timeout_ms * 1000000;
  long sleep_ns = 1000;
  for (;;) {
    int completed = 0;
    for (int k = 0; k < im->npending;) {
      tr_pg_work_t* w = im->pending[k];
      mpi_op_t* m = w->be_data;
      int flag = 1, rc = MPI_SUCCESS;
      mpi_lock();
      for (int i = 0; i < w->n_ops && rc == MPI_SUCCESS; i++) {
        int f = 1;
        if (m[i].req != MPI_REQUEST_NULL)
          rc = MPI_Test(&m[i].req, &f, MPI_STATUS_IGNORE);
        flag &= f;
      }
      mpi_unlock();
      if (rc == MPI_SUCCESS && !flag) {
        k++;
        continue;
      }
      memmove(&im->pending[k], &im->pending[k + 1],
              sizeof im->pending[0] * (size_t)(im->npending - k - 1));
      im->npending--;
      if (rc != MPI_SUCCESS) {
        char e[256];
        mpi_errstr(rc, e, sizeof e);
        tr__work_finish(w, TR_EMPI, "failed: %s", e);
      } else {
        if (!tr__work_is_done(w)) finish_ops(be->pg, w);
        tr__work_finish(w, 0, NULL);
      }
      free_ops(w);
      tr__work_retire(w);
      __atomic_sub_fetch(&be->npending, 1, __ATOMIC_RELAXED);
      completed++;
    }
    if (completed || im->npending == 0 || tr__queue_has_news(be) ||
        tr__now_ns() >= end)
      return;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 500000) sleep_ns *= 2;
  }
}

static void mpi_destroy(tr__pg_backend_t* be) {
  mpi_impl_t* im = be->impl;
  if (!im) return;
  int clean = im->npending == 0;
  /* Abandoned ops (after a timeout): MPI may still write into their
   * buffers, so they are leaked on purpose. */
  for (int k = 0; k < im->npending; k++) {
    tr_pg_work_t* w = im->pending[k];
    tr__work_finish(w, TR_EABORTED, "aborted: the group was freed");
    tr__work_ref(w);
    tr__work_retire(w);
  }
  if (!clean) {
    __atomic_store_n(&g_unclean, 1, __ATOMIC_RELEASE);
    be->pg->world->mpi_unclean = 1;
  }
  /* the communicator belongs to the group (tr__mpi_comm_release) */
  free(im);
  be->impl = NULL;
}

const tr__pg_backend_vt_t tr__pg_mpi_vt = {
    .kind = TR_PG_BACKEND_MPI,
    .name = "mpi",
    .threaded = 1,
    .create = mpi_create,
    .start = mpi_start,
    .progress = mpi_progress,
    .destroy = mpi_destroy,
};
