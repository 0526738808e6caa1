/* collectives/nccl.c: the NCCL backend for CUDA tensors. Per group: one
 * communicator (unique id through the store, after a store barrier that
 * bounds the wait for the other ranks; or ncclCommSplit of the parent's),
 * aborted by the watchdog when an op passes its deadline; one
 * high-priority comm stream. An op records an event on the group's user
 * stream and makes the comm stream wait for it, records a start event only
 * when something reads it (the start hook with tr_pg_set_cuda_start_events
 * on, or op timing), issues the NCCL calls (one group call when there are
 * several), records a done event, and for a blocking call makes the user
 * stream wait for it -- no host synchronisation anywhere.
 * The watchdog (and waiters) poll the events: start -> start hook, done ->
 * complete; an op past its deadline gets ncclCommAbort. uint16 reductions
 * are staged through uint32 and integer AVG is SUM then a division
 * (collectives/nccl_cuda.cu).
 *
 * The issue path is what bounds small collectives (measured on H200s: the
 * CUDA and NCCL calls take ~11 us an op, NVLink moves 1 MiB in less), so
 * it makes no CUDA call that the protocol does not need: events come from
 * a free list, the device is set only when it is not current, no start
 * event by default (PyTorch records one only with
 * TORCH_NCCL_ENABLE_TIMING), no group call around a single op. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h> /* streams, events, stream-ordered malloc */
/* nccl.h declares `ncclGroupStart()` without void */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "core/clock.h"
#include "collectives/internal.h"
#include "collectives/nccl_cuda.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* The backend state of one issued work, recycled through a free list with
 * its events (each made the first time a work needs it): once the backend
 * has had as many works in flight as it will have, an op creates and
 * destroys nothing. */
typedef struct nccl_work nccl_work_t;
struct nccl_work {
  cudaEvent_t start, done;   /* without timing */
  cudaEvent_t tstart, tdone; /* with timing: op timing's pair */
  cudaEvent_t ev_start;      /* the start event this op records, or NULL */
  cudaEvent_t ev_done;       /* the done event it records: done or tdone */
  int start_seen;            /* the start hook needs nothing more */
  tr_pg_work_t* w;           /* while pending */
  nccl_work_t* prev;         /* pending list, in issue order */
  nccl_work_t* next;         /* pending list, or the free list */
};

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t ready; /* recorded on the user stream, waited by ours */
  int device;
  pthread_mutex_t mu;
  int aborted;
  nccl_work_t* free_nw;     /* recycled, events kept */
  nccl_work_t *head, *tail; /* issued, not retired; oldest first */
  int npending;
} nccl_impl_t;

/* Make the group's device current when it is not: cudaGetDevice is a
 * thread-local read, cudaSetDevice costs more even when nothing changes
 * (PyTorch's c10::cuda::SetDevice makes the same check). */
static void use_device(const nccl_impl_t* im) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != im->device)
    cudaSetDevice(im->device);
}

/* ---- errors at the boundary ---- */

static int cuda_fail(cudaError_t e, const char* what, char* err,
                     size_t errlen) {
  if (e == cudaSuccess) return 0;
  snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? TR_ENOMEM : TR_ECUDA;
}

static int nccl_fail(ncclResult_t r, ncclComm_t comm, const char* what,
                     char* err, size_t errlen) {
  if (r == ncclSuccess) return 0;
  const char* last = ncclGetLastError(comm);
  snprintf(err, errlen, "%s: %s%s%s", what, ncclGetErrorString(r),
           last && *last ? ": " : "", last ? last : "");
  return TR_ENCCL;
}

/* Wait until comm leaves ncclInProgress (set-up and calls return it only
 * on nonblocking communicators; checked all the same). */
static int wait_ready(ncclComm_t comm, int64_t deadline_ns, const char* what,
                      char* err, size_t errlen) {
  long sleep_ns = 1000;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return nccl_fail(r, comm, what, err, errlen);
    if (st == ncclSuccess) return 0;
    if (st != ncclInProgress) return nccl_fail(st, comm, what, err, errlen);
    if (tr__now_ns() >= deadline_ns) {
      snprintf(err, errlen, "%s: timed out", what);
      return TR_ETIMEDOUT;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
  }
}

static int pick_device(tr__pg_world_t* wd, int* dev, char* err, size_t errlen) {
  int n = tr_cuda_device_count();
  if (n <= 0) {
    snprintf(err, errlen, "no CUDA device for NCCL");
    return TR_EDEVICE;
  }
  *dev = wd->cuda_device >= 0 ? wd->cuda_device : wd->rank % n;
  if (*dev >= n) {
    snprintf(err, errlen, "CUDA device %d does not exist (%d visible)", *dev,
             n);
    return TR_EDEVICE;
  }
  return 0;
}

/* The stream and event of a communicator that exists. */
static int impl_new(ncclComm_t comm, int dev, nccl_impl_t** out, char* err,
                    size_t errlen) {
  nccl_impl_t* im = calloc(1, sizeof *im);
  if (!im) return TR_ENOMEM;
  im->comm = comm;
  im->device = dev;
  int lo = 0, hi = 0, rc;
  cudaDeviceGetStreamPriorityRange(&lo, &hi);
  rc = cuda_fail(
      cudaStreamCreateWithPriority(&im->stream, cudaStreamNonBlocking, hi),
      "cudaStreamCreateWithPriority", err, errlen);
  if (rc == 0)
    rc = cuda_fail(cudaEventCreateWithFlags(&im->ready, cudaEventDisableTiming),
                   "cudaEventCreate", err, errlen);
  if (rc < 0) {
    if (im->stream) cudaStreamDestroy(im->stream);
    free(im);
    return rc;
  }
  pthread_mutex_init(&im->mu, NULL);
  *out = im;
  return 0;
}

static int nccl_create(tr__pg_backend_t* be, char* err, size_t errlen) {
  tr_pg_t* pg = be->pg;
  int dev, rc;
  TR_CHECK(pick_device(pg->world, &dev, err, errlen));
  TR_CHECK(cuda_fail(cudaSetDevice(dev), "cudaSetDevice", err, errlen));
  int64_t timeout = tr_pg_timeout(pg);
  int64_t deadline = tr__now_ns() + timeout * 1000000;

  ncclUniqueId id;
  tr_store_client_t* sc = NULL;
  tr_store_prefix_t sp;
  rc = tr__pg_store_open(pg, &sc, &sp);
  if (rc < 0) {
    snprintf(err, errlen, "cannot connect to the store: %s", tr_strerror(rc));
    return rc;
  }
  if (pg->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    rc = nccl_fail(r, NULL, "ncclGetUniqueId", err, errlen);
    if (rc == 0) {
      rc = tr_store_prefix_set(&sp, "nccl/uid", &id, sizeof id);
      if (rc < 0)
        snprintf(err, errlen, "cannot publish the NCCL id: %s",
                 tr_strerror(rc));
    }
  } else {
    void* v = NULL;
    size_t n = 0;
    const char* k = "nccl/uid";
    char why[512] = "";
    rc = tr__pg_store_wait(pg, NULL, sc, &sp, &k, 1, timeout, why, sizeof why);
    if (rc == 0) rc = tr_store_prefix_get(&sp, k, &v, &n);
    if (rc < 0) {
      snprintf(err, errlen, "cannot get the NCCL id from rank 0: %s",
               why[0] ? why : tr_strerror(rc));
    } else if (n != sizeof id) {
      snprintf(err, errlen, "the NCCL id in the store has %zu bytes, not %zu",
               n, sizeof id);
      rc = TR_EPROTO;
    } else {
      memcpy(&id, v, sizeof id);
    }
    free(v);
  }
  /* Everyone must have arrived before anyone enters ncclCommInitRank,
   * which blocks until all ranks do: this wait is bounded, that one is
   * not. */
  if (rc == 0) {
    int64_t v = 0;
    rc = tr_store_prefix_add(&sp, "nccl/arrived", 1, &v);
    if (rc == 0 && v == pg->size)
      rc = tr_store_prefix_set(&sp, "nccl/all_arrived", "1", 1);
    const char* k = "nccl/all_arrived";
    char why[512] = "";
    if (rc == 0)
      rc =
          tr__pg_store_wait(pg, NULL, sc, &sp, &k, 1, timeout, why, sizeof why);
    if (rc == TR_EABORTED)
      snprintf(err, errlen, "gave up setting up NCCL: %s", why);
    else if (rc < 0)
      snprintf(err, errlen,
               "not every rank of the group came to set up "
               "NCCL within %lld ms: %s",
               (long long)timeout, tr_strerror(rc));
  }
  tr__pg_store_close(sc, &sp);
  if (rc < 0) return rc;

  /* Blocking communicators: a nonblocking one launches every group call
   * from a thread of its own (~100 us an op). */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, pg->size, id, pg->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    return nccl_fail(r, comm, "ncclCommInitRankConfig", err, errlen);
  rc = wait_ready(comm, deadline, "ncclCommInitRankConfig", err, errlen);
  nccl_impl_t* im = NULL;
  if (rc == 0) rc = impl_new(comm, dev, &im, err, errlen);
  if (rc < 0) {
    if (comm) ncclCommAbort(comm);
    return rc;
  }
  be->impl = im;
  return 0;
}

int tr__nccl_split(tr__pg_backend_t* parent, tr_pg_t* child, int color, int key,
                   char* err, size_t errlen) {
  nccl_impl_t* pim = parent->impl;
  int rc;
  pthread_mutex_lock(&pim->mu);
  if (pim->aborted) {
    pthread_mutex_unlock(&pim->mu);
    snprintf(err, errlen, "the parent communicator was aborted");
    return TR_EABORTED;
  }
  use_device(pim);
  int64_t deadline = tr__now_ns() + tr_pg_timeout(parent->pg) * 1000000;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommSplit(
      pim->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    rc = nccl_fail(r, pim->comm, "ncclCommSplit", err, errlen);
    pthread_mutex_unlock(&pim->mu);
    return rc;
  }
  rc = wait_ready(pim->comm, deadline, "ncclCommSplit", err, errlen);
  if (rc == 0 && comm)
    rc = wait_ready(comm, deadline, "ncclCommSplit", err, errlen);
  pthread_mutex_unlock(&pim->mu);
  if (rc < 0) {
    if (comm) ncclCommAbort(comm);
    return rc;
  }
  if (!child) {
    if (comm) ncclCommDestroy(comm);
    return 0;
  }
  tr__pg_backend_t* be = calloc(1, sizeof *be);
  nccl_impl_t* im = NULL;
  if (!be) rc = TR_ENOMEM;
  if (rc == 0) rc = impl_new(comm, pim->device, &im, err, errlen);
  if (rc < 0) {
    free(be);
    ncclCommAbort(comm);
    return rc;
  }
  be->vt = &tr__pg_nccl_vt;
  be->pg = child;
  be->dev = TR_DEV_CUDA;
  be->impl = im;
  pthread_mutex_lock(&child->mu);
  child->be[TR_DEV_CUDA] = be;
  pthread_mutex_unlock(&child->mu);
  return 0;
}

/* ---- ops ---- */

static ncclDataType_t nccl_type(tr_dtype_t dt) {
  switch (dt) {
    case TR_F32:
      return ncclFloat32;
    case TR_BF16:
      return ncclBfloat16;
    case TR_F16:
      return ncclFloat16;
    case TR_I32:
      return ncclInt32;
    case TR_I64:
      return ncclInt64;
    case TR_U16:
      return ncclUint32; /* staged */
    default:
      return ncclUint8;
  }
}

static int is_int(tr_dtype_t dt) {
  return dt == TR_I32 || dt == TR_I64 || dt == TR_U16 || dt == TR_U8;
}

/* AVG of integers is SUM and a division afterwards. */
static ncclRedOp_t nccl_op(tr_pg_reduce_op_t op, tr_dtype_t dt) {
  switch (op) {
    case TR_PG_AVG:
      return is_int(dt) ? ncclSum : ncclAvg;
    case TR_PG_MAX:
      return ncclMax;
    case TR_PG_MIN:
      return ncclMin;
    case TR_PG_PRODUCT:
      return ncclProd;
    default:
      return ncclSum;
  }
}

static int reducing(tr_pg_op_t t) {
  return t == TR_PG_OP_ALL_REDUCE || t == TR_PG_OP_REDUCE_SCATTER ||
         t == TR_PG_OP_REDUCE;
}

/* uint16 staging buffers of one op. */
typedef struct {
  void* in;
  void* out;
} stage_t;

static int issue(nccl_impl_t* im, tr_pg_t* pg, tr__pg_op_t* op, stage_t* st,
                 char* err, size_t errlen) {
  ncclComm_t c = im->comm;
  cudaStream_t s = im->stream;
  tr_dtype_t dt = op->out.storage ? op->out.dtype : op->in.dtype;
  void* out = op->out.storage ? tr_tensor_data(&op->out) : NULL;
  void* in = op->in.storage ? tr_tensor_data(&op->in) : NULL;
  size_t nout = op->out.storage ? (size_t)tr_tensor_numel(&op->out) : 0;
  size_t bout = op->out.storage ? tr_tensor_nbytes(&op->out) : 0;
  size_t bin = op->in.storage ? tr_tensor_nbytes(&op->in) : 0;
  ncclDataType_t nt = nccl_type(dt);
  ncclRedOp_t no = nccl_op(op->rop, dt);
  ncclResult_t r = ncclSuccess;
  if (dt == TR_U16 && st->out) { /* staged uint16 reduction */
    out = st->out;
    in = st->in;
  }
  switch (op->type) {
    case TR_PG_OP_ALL_REDUCE:
      r = ncclAllReduce(out, out, nout, nt, no, c, s);
      break;
    case TR_PG_OP_ALL_GATHER:
      r = ncclAllGather(in, out, bin, ncclUint8, c, s);
      break;
    case TR_PG_OP_REDUCE_SCATTER:
      r = ncclReduceScatter(in, out, nout, nt, no, c, s);
      break;
    case TR_PG_OP_BROADCAST:
      r = ncclBroadcast(out, out, bout, ncclUint8, op->peer, c, s);
      break;
    case TR_PG_OP_REDUCE:
      r = ncclReduce(out, out, nout, nt, no, op->peer, c, s);
      break;
    case TR_PG_OP_ALL_TO_ALL: {
      size_t esz = tr_dtype_size(dt), so = 0, ro = 0;
      for (int j = 0; j < pg->size && r == ncclSuccess; j++) {
        size_t sb = op->in_counts ? (size_t)op->in_counts[j] * esz
                                  : bin / (size_t)pg->size;
        size_t rb = op->out_counts ? (size_t)op->out_counts[j] * esz
                                   : bout / (size_t)pg->size;
        r = ncclSend((char*)in + so, sb, ncclUint8, j, c, s);
        if (r == ncclSuccess)
          r = ncclRecv((char*)out + ro, rb, ncclUint8, j, c, s);
        so += sb;
        ro += rb;
      }
      break;
    }
    case TR_PG_OP_SEND:
      r = ncclSend(in, bin, ncclUint8, op->peer, c, s);
      break;
    case TR_PG_OP_RECV:
      r = ncclRecv(out, bout, ncclUint8, op->peer, c, s);
      break;
    default:
      snprintf(err, errlen, "%s is not an NCCL op", tr_pg_op_name(op->type));
      return TR_EINVAL;
  }
  return nccl_fail(r, c, tr_pg_op_name(op->type), err, errlen);
}

/* Before the NCCL calls: widen uint16 reductions into uint32 buffers. */
static int pre_op(nccl_impl_t* im, tr__pg_op_t* op, stage_t* st, char* err,
                  size_t errlen) {
  if (!reducing(op->type) || op->out.dtype != TR_U16) return 0;
  cudaStream_t s = im->stream;
  size_t nout = (size_t)tr_tensor_numel(&op->out);
  const tr_tensor_t* src =
      op->type == TR_PG_OP_REDUCE_SCATTER ? &op->in : &op->out;
  size_t nsrc = (size_t)tr_tensor_numel(src);
  TR_CHECK(cuda_fail(cudaMallocAsync(&st->out, 4 * (nout ? nout : 1), s),
                     "cudaMallocAsync", err, errlen));
  if (op->type == TR_PG_OP_REDUCE_SCATTER) {
    TR_CHECK(cuda_fail(cudaMallocAsync(&st->in, 4 * (nsrc ? nsrc : 1), s),
                       "cudaMallocAsync", err, errlen));
    return tr__nccl_u16_to_u32(tr_tensor_data(src), st->in, (int64_t)nsrc, s);
  }
  st->in = st->out;
  return tr__nccl_u16_to_u32(tr_tensor_data(src), st->out, (int64_t)nsrc, s);
}

/* After them: narrow uint16 back, divide integer AVG. */
static int post_op(nccl_impl_t* im, tr_pg_t* pg, tr__pg_op_t* op, stage_t* st) {
  if (!reducing(op->type)) return 0;
  if (op->type == TR_PG_OP_REDUCE && pg->rank != op->peer) return 0;
  tr_dtype_t dt = op->out.dtype;
  int64_t n = tr_tensor_numel(&op->out);
  int div = op->rop == TR_PG_AVG ? pg->size : 1;
  if (dt == TR_U16)
    return tr__nccl_u32_to_u16(st->out, tr_tensor_data(&op->out), n, div,
                               im->stream);
  if (is_int(dt) && div > 1)
    return tr__nccl_div_int(tr_tensor_data(&op->out), (int)dt, n, div,
                            im->stream);
  return 0;
}

/* A work's state (recycled, or new) with the events w needs, made on
 * im->device (current) the first time: timed works record tstart/tdone;
 * others done, and start when the start hook wants device start times.
 * 0, TR_ENOMEM or TR_ECUDA. Under im->mu. */
static int nw_get(nccl_impl_t* im, int timed, int start_hook,
                  nccl_work_t** out) {
  nccl_work_t* nw = im->free_nw;
  if (nw) {
    im->free_nw = nw->next;
    nw->next = NULL;
  } else if (!(nw = calloc(1, sizeof *nw))) {
    return TR_ENOMEM;
  }
  cudaError_t e = cudaSuccess;
  if (timed) {
    if (!nw->tstart) e = cudaEventCreateWithFlags(&nw->tstart, 0);
    if (e == cudaSuccess && !nw->tdone)
      e = cudaEventCreateWithFlags(&nw->tdone, 0);
    nw->ev_start = nw->tstart;
    nw->ev_done = nw->tdone;
  } else {
    if (start_hook && !nw->start)
      e = cudaEventCreateWithFlags(&nw->start, cudaEventDisableTiming);
    if (e == cudaSuccess && !nw->done)
      e = cudaEventCreateWithFlags(&nw->done, cudaEventDisableTiming);
    nw->ev_start = start_hook ? nw->start : NULL;
    nw->ev_done = nw->done;
  }
  nw->start_seen = !start_hook;
  if (e != cudaSuccess) {
    /* the events made so far stay with it on the free list */
    nw->next = im->free_nw;
    im->free_nw = nw;
    return TR_ECUDA;
  }
  *out = nw;
  return 0;
}

/* A timed work's device time, found complete: into w before it is
 * finished (under w->mu, so a finish racing with us wins cleanly). */
static void set_duration(tr_pg_work_t* w, const nccl_work_t* nw) {
  float ms = 0;
  if (!w->timed ||
      cudaEventElapsedTime(&ms, nw->tstart, nw->tdone) != cudaSuccess)
    return;
  pthread_mutex_lock(&w->mu);
  if (!w->done) {
    w->dur_us = (double)ms * 1e3;
    w->dur_set = 1;
  }
  pthread_mutex_unlock(&w->mu);
}

/* Back on the free list (under im->mu). Its events may still be pending
 * on the stream: recording them again later is fine. */
static void nw_put(nccl_impl_t* im, nccl_work_t* nw) {
  nw->w = NULL;
  nw->prev = NULL;
  nw->next = im->free_nw;
  im->free_nw = nw;
}

static int nccl_start(tr__pg_backend_t* be, tr_pg_work_t* w, char* err,
                      size_t errlen) {
  nccl_impl_t* im = be->impl;
  tr_pg_t* pg = be->pg;
  const tr_pg_hooks_t* h = tr__pg_hooks();
  /* the start hook gets the device's start time when it asks for it, or
   * for free when op timing records a start event anyway */
  int start_hook = h->start && (w->timed || tr__pg_cuda_start_events());
  /* one op goes to NCCL alone (it makes its own group); all_to_all's
   * sends and receives, and coalesced ops, need one group call */
  int grouped = w->n_ops > 1 || w->ops[0].type == TR_PG_OP_ALL_TO_ALL;
  int rc = 0;
  pthread_mutex_lock(&im->mu);
  if (im->aborted) {
    pthread_mutex_unlock(&im->mu);
    snprintf(err, errlen, "the communicator was aborted");
    return TR_EABORTED;
  }
  /* one op (the common case) stages on the stack */
  stage_t one = {NULL, NULL};
  stage_t* st = w->n_ops == 1 ? &one : calloc((size_t)w->n_ops, sizeof *st);
  if (!st) {
    pthread_mutex_unlock(&im->mu);
    return TR_ENOMEM;
  }
  use_device(im);
  cudaStream_t user = (cudaStream_t)pg->cuda_stream;
  nccl_work_t* nw = NULL;
  rc = nw_get(im, w->timed, start_hook, &nw);
  if (rc < 0) {
    if (st != &one) free(st);
    pthread_mutex_unlock(&im->mu);
    if (rc == TR_ECUDA) snprintf(err, errlen, "cannot create CUDA events");
    return rc;
  }
  TR_CHECK_GOTO(cuda_fail(cudaEventRecord(im->ready, user), "cudaEventRecord",
                          err, errlen),
                rc, out_fail);
  TR_CHECK_GOTO(cuda_fail(cudaStreamWaitEvent(im->stream, im->ready, 0),
                          "cudaStreamWaitEvent", err, errlen),
                rc, out_fail);
  for (int i = 0; i < w->n_ops; i++)
    TR_CHECK_GOTO(pre_op(im, &w->ops[i], &st[i], err, errlen), rc, out_fail);
  if (nw->ev_start)
    TR_CHECK_GOTO(cuda_fail(cudaEventRecord(nw->ev_start, im->stream),
                            "cudaEventRecord", err, errlen),
                  rc, out_fail);
  if (grouped)
    TR_CHECK_GOTO(
        nccl_fail(ncclGroupStart(), im->comm, "ncclGroupStart", err, errlen),
        rc, out_fail);
  for (int i = 0; i < w->n_ops && rc == 0; i++)
    rc = issue(im, pg, &w->ops[i], &st[i], err, errlen);
  if (grouped) {
    ncclResult_t r = ncclGroupEnd();
    if (rc == 0 && r == ncclInProgress)
      rc = wait_ready(im->comm, w->deadline_ns, "ncclGroupEnd", err, errlen);
    else if (rc == 0)
      rc = nccl_fail(r, im->comm, "ncclGroupEnd", err, errlen);
  }
  if (rc < 0) goto out_fail;
  for (int i = 0; i < w->n_ops; i++)
    TR_CHECK_GOTO(post_op(im, pg, &w->ops[i], &st[i]), rc, out_fail);
  TR_CHECK_GOTO(cuda_fail(cudaEventRecord(nw->ev_done, im->stream),
                          "cudaEventRecord", err, errlen),
                rc, out_fail);
  /* A blocking call: the user stream waits here, while the device is set
   * and the lock held, rather than in a second call into the backend. */
  if (w->block_stream) {
    char why[256];
    if (cuda_fail(cudaStreamWaitEvent(user, nw->ev_done, 0),
                  "cudaStreamWaitEvent", why, sizeof why) < 0) {
      TR_LOG_ERROR(COLL, "%s", why);
      w->block_stream = 0; /* the caller goes through wait_stream */
    }
  }
  for (int i = 0; i < w->n_ops; i++) {
    if (st[i].in && st[i].in != st[i].out) cudaFreeAsync(st[i].in, im->stream);
    if (st[i].out) cudaFreeAsync(st[i].out, im->stream);
  }
  if (st != &one) free(st);
  /* pending, at the tail (issue order) */
  nw->w = w;
  nw->prev = im->tail;
  nw->next = NULL;
  if (im->tail)
    im->tail->next = nw;
  else
    im->head = nw;
  im->tail = nw;
  im->npending++;
  w->be_data = nw;
  pthread_mutex_unlock(&im->mu);
  return 1;

out_fail:
  for (int i = 0; i < w->n_ops; i++) {
    if (st[i].in && st[i].in != st[i].out) cudaFreeAsync(st[i].in, im->stream);
    if (st[i].out) cudaFreeAsync(st[i].out, im->stream);
  }
  if (st != &one) free(st);
  nw_put(im, nw);
  pthread_mutex_unlock(&im->mu);
  return rc;
}

/* Take w off the pending list (under im->mu); 1 when it was there. */
static int claim(nccl_impl_t* im, tr_pg_work_t* w) {
  nccl_work_t* nw = w->be_data;
  if (!nw) return 0;
  if (nw->prev)
    nw->prev->next = nw->next;
  else
    im->head = nw->next;
  if (nw->next)
    nw->next->prev = nw->prev;
  else
    im->tail = nw->prev;
  im->npending--;
  w->be_data = NULL;
  nw_put(im, nw);
  return 1;
}

static int nccl_poll(tr__pg_backend_t* be, tr_pg_work_t* w) {
  nccl_impl_t* im = be->impl;
  char err[512] = "";
  int status = 1, started = 0;
  pthread_mutex_lock(&im->mu);
  nccl_work_t* nw = w->be_data;
  if (!nw) {
    pthread_mutex_unlock(&im->mu);
    return 1;
  }
  use_device(im);
  if (!nw->start_seen && cudaEventQuery(nw->ev_start) == cudaSuccess)
    nw->start_seen = started = 1;
  cudaError_t q = cudaEventQuery(nw->ev_done);
  if (__atomic_load_n(&im->aborted, __ATOMIC_ACQUIRE)) {
    /* an aborted kernel ends early: its event says nothing of the data */
    status = TR_EABORTED;
    snprintf(err, sizeof err, "the NCCL communicator was aborted");
  } else if (q == cudaSuccess) {
    status = 0;
    set_duration(w, nw);
  } else if (q != cudaErrorNotReady) {
    status = cuda_fail(q, "cudaEventQuery", err, sizeof err);
  } else if (im->comm) {
    ncclResult_t st = ncclSuccess;
    if (ncclCommGetAsyncError(im->comm, &st) == ncclSuccess &&
        st != ncclSuccess && st != ncclInProgress)
      status = nccl_fail(st, im->comm, "NCCL", err, sizeof err);
  }
  if (status != 1) claim(im, w);
  pthread_mutex_unlock(&im->mu);
  if (started) tr__work_started(w);
  if (status == 1) return 0;
  if (status == 0)
    tr__work_finish(w, 0, NULL);
  else
    tr__work_finish(w, status, "failed: %s", err);
  tr__work_retire(w);
  return 1;
}

static int nccl_wait_stream(tr__pg_backend_t* be, tr_pg_work_t* w,
                            void* stream) {
  nccl_impl_t* im = be->impl;
  int rc = 0;
  pthread_mutex_lock(&im->mu);
  nccl_work_t* nw = w->be_data;
  if (nw) {
    use_device(im);
    char err[256];
    rc = cuda_fail(cudaStreamWaitEvent((cudaStream_t)stream, nw->ev_done, 0),
                   "cudaStreamWaitEvent", err, sizeof err);
    if (rc < 0) TR_LOG_ERROR(COLL, "%s", err);
  }
  pthread_mutex_unlock(&im->mu);
  /* Claimed by a poll or the sweep, which finishes it at once: its status
   * (not "pending") is the answer. */
  if (!nw) return tr_pg_work_wait(w, 0);
  return rc;
}

/* 1 when nw's done event has completed. */
static int nw_done(const nccl_work_t* nw) {
  return cudaEventQuery(nw->ev_done) == cudaSuccess;
}

/* The watchdog's sweep, once a round: finish and retire, oldest first,
 * the works whose done event has completed, a chunk at a time so that an
 * issuing thread never waits long for im->mu. Without it, works issued
 * with no handle (blocking calls) would leave only through the watchdog's
 * per-work polls, 64 a round. Done events complete in issue order (all are
 * recorded on im->stream), so the completed prefix of a chunk is found by
 * bisection: a few event queries a chunk instead of one a work (blocking
 * calls leave thousands a round, and every query takes the driver's locks
 * that the issuing thread needs). Errors are left to the per-work polls;
 * a busy im->mu skips the sweep until the next round. */
static void nccl_reap(tr__pg_backend_t* be) {
  nccl_impl_t* im = be->impl;
  enum { CHUNK = 64 };
  for (;;) {
    nccl_work_t* at[CHUNK];
    tr_pg_work_t* list[CHUNK];
    int m = 0, n = 0;
    /* never wait here: a call stuck in NCCL holds im->mu, and the
     * watchdog must go on to time it out */
    if (pthread_mutex_trylock(&im->mu) != 0) return;
    if (__atomic_load_n(&im->aborted, __ATOMIC_ACQUIRE) || !im->head) {
      pthread_mutex_unlock(&im->mu);
      return;
    }
    use_device(im);
    for (nccl_work_t* nw = im->head; nw && m < CHUNK; nw = nw->next)
      at[m++] = nw;
    /* n: the length of the completed prefix of at[0..m) */
    if (!nw_done(at[0])) {
      n = 0;
    } else if (nw_done(at[m - 1])) {
      n = m;
    } else { /* at[lo - 1] is done, at[hi] is not */
      int lo = 1, hi = m - 1;
      while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (nw_done(at[mid]))
          lo = mid + 1;
        else
          hi = mid;
      }
      n = lo;
    }
    /* an aborted kernel ends early: its event says nothing of the data */
    if (__atomic_load_n(&im->aborted, __ATOMIC_ACQUIRE)) n = 0;
    for (int i = 0; i < n; i++) {
      list[i] = at[i]->w;
      set_duration(list[i], at[i]);
      claim(im, list[i]);
    }
    int more = n == CHUNK && im->head;
    pthread_mutex_unlock(&im->mu);
    for (int i = 0; i < n; i++) {
      tr__work_finish(list[i], 0, NULL);
      tr__work_retire(list[i]);
    }
    if (!more) return;
  }
}

/* The watchdog's abort. A call stuck inside NCCL (the first send/recv of a
 * pair waits for the peer to post one) holds im->mu: after a while the
 * communicator is aborted anyway, as PyTorch's watchdog does, which makes
 * that call return. */
static void nccl_abort(tr__pg_backend_t* be) {
  nccl_impl_t* im = be->impl;
  if (!im) return;
  struct timespec until = tr__deadline_ms(2000);
  if (pthread_mutex_timedlock(&im->mu, &until) != 0) {
    TR_LOG_ERROR(COLL,
                 "group '%s': an NCCL call is stuck; aborting the "
                 "communicator under it",
                 be->pg->name);
    ncclComm_t c = __atomic_exchange_n(&im->comm, NULL, __ATOMIC_ACQ_REL);
    __atomic_store_n(&im->aborted, 1, __ATOMIC_RELEASE);
    use_device(im);
    if (c) ncclCommAbort(c);
    return; /* the stuck call fails; destroy retires what is left */
  }
  if (!im->aborted) {
    im->aborted = 1;
    use_device(im);
    ncclComm_t c = __atomic_exchange_n(&im->comm, NULL, __ATOMIC_ACQ_REL);
    if (c) ncclCommAbort(c);
  }
  int n = im->npending;
  tr_pg_work_t** list = malloc(sizeof *list * (size_t)(n ? n : 1));
  n = 0;
  for (nccl_work_t* nw = im->head; list && nw; nw = nw->next) list[n++] = nw->w;
  for (int i = 0; list && i < n; i++) claim(im, list[i]);
  pthread_mutex_unlock(&im->mu);
  for (int i = 0; list && i < n; i++) {
    tr__work_finish(list[i], TR_EABORTED,
                    "aborted: the NCCL communicator was aborted");
    tr__work_retire(list[i]);
  }
  free(list);
}

static void nccl_destroy(tr__pg_backend_t* be) {
  nccl_impl_t* im = be->impl;
  if (!im) return;
  if (im->npending) nccl_abort(be); /* none are left after tr_pg_free */
  use_device(im);
  if (im->comm) {
    char err[256];
    int64_t deadline = tr__now_ns() + (int64_t)10000 * 1000000;
    ncclResult_t r = ncclCommFinalize(im->comm);
    int rc = r == ncclSuccess || r == ncclInProgress
                 ? wait_ready(im->comm, deadline, "ncclCommFinalize", err,
                              sizeof err)
                 : nccl_fail(r, im->comm, "ncclCommFinalize", err, sizeof err);
    if (rc == 0) {
      ncclCommDestroy(im->comm);
    } else {
      TR_LOG_WARN(COLL, "%s; aborting the communicator", err);
      ncclCommAbort(im->comm);
    }
  }
  while (im->free_nw) {
    nccl_work_t* nw = im->free_nw;
    im->free_nw = nw->next;
    cudaEvent_t evs[4] = {nw->start, nw->done, nw->tstart, nw->tdone};
    for (int i = 0; i < 4; i++)
      if (evs[i]) cudaEventDestroy(evs[i]);
    free(nw);
  }
  cudaEventDestroy(im->ready);
  cudaStreamDestroy(im->stream);
  pthread_mutex_destroy(&im->mu);
  free(im);
  be->impl = NULL;
}

const tr__pg_backend_vt_t tr__pg_nccl_vt = {
    .kind = TR_PG_BACKEND_NCCL,
    .name = "nccl",
    .threaded = 0,
    .create = nccl_create,
    .start = nccl_start,
    .abort = nccl_abort,
    .poll = nccl_poll,
    .wait_stream = nccl_wait_stream,
    .destroy = nccl_destroy,
    .reap = nccl_reap,
};
