/* bench/coll_bench.c: bus bandwidth of all_reduce, all_gather and
 * reduce_scatter through trainrun's process groups, over a range of sizes,
 * as nccl-tests reports it (algbw = size / time; busbw = algbw x 2(n-1)/n
 * for all_reduce, x (n-1)/n for all_gather and reduce_scatter, size being
 * the whole buffer: the all_reduce tensor, the all_gather output, the
 * reduce_scatter input). With NCCL, --raw times the same calls made
 * directly on a communicator of its own in the same run, next to ours;
 * --raw-events adds raw NCCL with the process group's stream protocol
 * (the comm stream waits for an event of the user stream, a done event per
 * op; sync mode: the user stream waits for it), which tells the cost of
 * that protocol from the cost of our host code.
 *
 * --mode sync (the default): every op but the last of a batch is a
 * blocking call (no handle; the user stream waits for it), the last one's
 * handle is waited on the host. --mode async: every op returns a handle,
 * all are waited at the end of the batch -- how DDP's buckets and FSDP's
 * prefetches use the group, and what raw NCCL's timing (back to back on
 * one stream, one synchronisation at the end) compares with. --reps N
 * times each variant N times, interleaved, and keeps the fastest.
 * --op-timing turns the group's op timing on (tr_pg_set_op_timing) and adds
 * dev(us), the mean duration of the ops with handles (async: all; sync:
 * the last of each batch) as the backend measured it -- on GPUs the device
 * time between the op's start and end events: an op whose issue(us)
 * exceeds dev(us) is bound by the host. Timed ops record one event more.
 * --issue-costs (nccl) first prints the host time of each CUDA / NCCL call
 * that issuing an op makes, each timed alone in a loop on the raw
 * communicator, next to one blocking tr_pg_all_reduce: where the host time
 * of an op goes.
 *
 *   coll_bench -b gloo -n 2 --max 64M           # CPU, 2 forked ranks
 *   coll_bench -b nccl --raw --max 1G           # one rank per GPU
 *   coll_bench -b nccl --raw --raw-events --mode async -i 200 --reps 3
 *   mpirun -np 4 coll_bench -b mpi              # MPI's ranks
 *
 * Ranks are forked from this process (not under mpirun) and rendezvous
 * through a store server on 127.0.0.1. Rank 0 prints one line per op and
 * size; the time is the slowest rank's mean over the timed iterations;
 * issue(us) is the host time of one call (ours, then raw NCCL's). */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef HAVE_NCCL
#include <cuda_runtime_api.h> /* raw NCCL timing: streams, buffers */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#endif

#include "trainrun/error.h"
#include "trainrun/pg.h"
#include "trainrun/store.h"
#include "trainrun/tensor.h"

typedef struct {
  const char* backend;
  int n;
  int64_t min_bytes, max_bytes;
  int factor;
  int warmup, iters;
  tr_dtype_t dtype;
  int ops; /* bit i: op i of k_ops */
  int raw;
  int check;
  int gpu;        /* CUDA tensors */
  int async;      /* --mode async */
  int reps;       /* --reps */
  int raw_events; /* --raw-events */
  int op_timing;  /* --op-timing */
  int costs;      /* --issue-costs */
} opts_t;

static const struct {
  const char* name;
  tr_pg_op_t op;
} k_ops[] = {{"all_reduce", TR_PG_OP_ALL_REDUCE},
             {"all_gather", TR_PG_OP_ALL_GATHER},
             {"reduce_scatter", TR_PG_OP_REDUCE_SCATTER}};
#define NOPS 3

static void die(const char* what, int rc) {
  fprintf(stderr, "coll_bench: %s: %s\n", what, tr_strerror(rc));
  exit(1);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'k':
    case 'K':
      v *= 1024;
      break;
    case 'm':
    case 'M':
      v *= 1024 * 1024;
      break;
    case 'g':
    case 'G':
      v *= 1024.0 * 1024 * 1024;
      break;
    default:
      break;
  }
  return (int64_t)v;
}

static double bus_factor(tr_pg_op_t op, int n) {
  if (n <= 1) return 0;
  return op == TR_PG_OP_ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

/* The slowest rank's value, through the group's CPU backend when it has
 * one, else on the GPU. */
static int64_t max_over_ranks(tr_pg_t* pg, int64_t v, tr_device_t dev) {
  tr_tensor_t t, h;
  int64_t one[1] = {1};
  if (tr_pg_backend(pg, TR_DEV_CPU) != TR_PG_BACKEND_NONE) dev = TR_DEVICE_CPU;
  if (tr_tensor_empty(&h, TR_I64, TR_DEVICE_CPU, 1, one) < 0) return v;
  *(int64_t*)tr_tensor_data(&h) = v;
  if (dev.type == TR_DEV_CPU) {
    t = h;
  } else {
    if (tr_tensor_empty(&t, TR_I64, dev, 1, one) < 0) return v;
    tr_tensor_copy(&t, &h);
  }
  int rc = tr_pg_all_reduce(pg, &t, TR_PG_MAX, NULL);
  if (rc < 0) die("all_reduce of the timings", rc);
  if (dev.type != TR_DEV_CPU) {
    tr_tensor_copy(&h, &t);
    tr_tensor_release(&t);
  }
  v = *(int64_t*)tr_tensor_data(&h);
  tr_tensor_release(&h);
  return v;
}

static int issue(tr_pg_t* pg, tr_pg_op_t op, tr_tensor_t* a, tr_tensor_t* b,
                 tr_pg_work_t** w) {
  switch (op) {
    case TR_PG_OP_ALL_REDUCE:
      return tr_pg_all_reduce(pg, a, TR_PG_SUM, w);
    case TR_PG_OP_ALL_GATHER:
      return tr_pg_all_gather(pg, b, a, w); /* a: shard, b: full */
    default:
      return tr_pg_reduce_scatter(pg, a, b, TR_PG_SUM, w); /* b full */
  }
}

/* Times of one op, ns: the mean over a batch, the mean host time of
 * issuing one, and (--op-timing) the mean duration the backend measured. */
typedef struct {
  int64_t total, issue, dev;
} timing_t;

/* n ops back to back, waited as o->async says (see the top of the file);
 * ws holds n handles. */
static timing_t batch(tr_pg_t* pg, const opts_t* o, tr_pg_op_t op,
                      tr_tensor_t* a, tr_tensor_t* b, int n,
                      tr_pg_work_t** ws) {
  timing_t t = {0, 0, 0};
  double dev_us = 0;
  int rc;
  int64_t t0 = now_ns();
  for (int i = 0; i < n; i++) {
    tr_pg_work_t** w = o->async ? &ws[i] : i == n - 1 ? &ws[0] : NULL;
    rc = issue(pg, op, a, b, w);
    if (rc < 0) die(tr_pg_op_name(op), rc);
  }
  t.issue = (now_ns() - t0) / n;
  for (int i = 0; i < (o->async ? n : 1); i++) {
    rc = tr_pg_work_wait(ws[i], 0);
    if (rc < 0) die(tr_pg_op_name(op), rc);
    double us = 0;
    if (o->op_timing) {
      rc = tr_pg_work_duration_us(ws[i], &us);
      if (rc < 0) die("tr_pg_work_duration_us", rc);
    }
    dev_us += us;
    tr_pg_work_free(ws[i]);
  }
  t.total = (now_ns() - t0) / n;
  t.dev = (int64_t)(dev_us * 1000 / (o->async ? n : 1));
  return t;
}

/* Warm-up, a barrier, then the timed batch of o->iters (this rank). */
static timing_t time_op(tr_pg_t* pg, const opts_t* o, tr_pg_op_t op,
                        tr_tensor_t* a, tr_tensor_t* b) {
  int cap = o->iters > o->warmup ? o->iters : o->warmup;
  tr_pg_work_t** ws = calloc((size_t)cap, sizeof *ws);
  if (!ws) die("allocation", TR_ENOMEM);
  if (o->warmup > 0) batch(pg, o, op, a, b, o->warmup, ws);
  int rc = tr_pg_barrier(pg, NULL);
  if (rc < 0) die("barrier", rc);
  timing_t t = batch(pg, o, op, a, b, o->iters, ws);
  free(ws);
  return t;
}

#ifdef HAVE_NCCL
/* The same op straight on NCCL: a communicator and stream of its own. */
typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t ready; /* --raw-events: on the user stream */
  cudaEvent_t* done; /* one per op of a batch */
  int ndone;
} raw_t;

static int raw_init(raw_t* r, tr_store_client_t* c, int rank, int n,
                    const opts_t* o) {
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) return TR_ENCCL;
    TR_CHECK(tr_store_client_set(c, "bench/raw_uid", &id, sizeof id));
  } else {
    void* v = NULL;
    size_t len = 0;
    TR_CHECK(tr_store_client_get(c, "bench/raw_uid", &v, &len));
    if (len != sizeof id) return TR_EPROTO;
    memcpy(&id, v, sizeof id);
    free(v);
  }
  if (ncclCommInitRank(&r->comm, n, id, rank) != ncclSuccess) return TR_ENCCL;
  if (cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking) !=
      cudaSuccess)
    return TR_ECUDA;
  r->ndone = o->iters > o->warmup ? o->iters : o->warmup;
  r->done = calloc((size_t)r->ndone, sizeof *r->done);
  if (!r->done) return TR_ENOMEM;
  if (cudaEventCreateWithFlags(&r->ready, cudaEventDisableTiming) !=
      cudaSuccess)
    return TR_ECUDA;
  for (int i = 0; i < r->ndone; i++)
    if (cudaEventCreateWithFlags(&r->done[i], cudaEventDisableTiming) !=
        cudaSuccess)
      return TR_ECUDA;
  return 0;
}

static void raw_release(raw_t* r) {
  ncclCommDestroy(r->comm);
  for (int i = 0; i < r->ndone; i++)
    if (r->done[i]) cudaEventDestroy(r->done[i]);
  free(r->done);
  cudaEventDestroy(r->ready);
  cudaStreamDestroy(r->stream);
}

static ncclDataType_t raw_type(tr_dtype_t dt) {
  switch (dt) {
    case TR_BF16:
      return ncclBfloat16;
    case TR_F16:
      return ncclFloat16;
    case TR_I32:
      return ncclInt32;
    case TR_I64:
      return ncclInt64;
    case TR_U8:
      return ncclUint8;
    default:
      return ncclFloat32;
  }
}

static void raw_call(raw_t* r, tr_pg_op_t op, void* pa, void* pb, size_t na,
                     ncclDataType_t t) {
  ncclResult_t rc;
  if (op == TR_PG_OP_ALL_REDUCE)
    rc = ncclAllReduce(pa, pa, na, t, ncclSum, r->comm, r->stream);
  else if (op == TR_PG_OP_ALL_GATHER)
    rc = ncclAllGather(pa, pb, na, t, r->comm, r->stream);
  else
    rc = ncclReduceScatter(pb, pa, na, t, ncclSum, r->comm, r->stream);
  if (rc != ncclSuccess) die("raw NCCL call", TR_ENCCL);
}

static void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "coll_bench: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

/* n raw calls. Plain: back to back on the raw stream, one synchronisation
 * at the end. events: the process group's protocol -- the raw stream waits
 * for an event recorded on the user stream (the legacy default stream, the
 * group's in this bench), a done event after each call; sync mode: the
 * user stream waits for it too, and the last one is waited on the host;
 * async: every done event is waited on the host, in order. */
static timing_t raw_batch(raw_t* r, const opts_t* o, tr_pg_op_t op,
                          tr_tensor_t* a, tr_tensor_t* b, int n, int events) {
  void* pa = tr_tensor_data(a);
  void* pb = tr_tensor_data(b);
  size_t na = (size_t)tr_tensor_numel(a);
  ncclDataType_t t = raw_type(a->dtype);
  timing_t tm = {0, 0, 0};
  int64_t t0 = now_ns();
  for (int i = 0; i < n; i++) {
    if (events) {
      cuda_ok(cudaEventRecord(r->ready, NULL), "cudaEventRecord");
      cuda_ok(cudaStreamWaitEvent(r->stream, r->ready, 0),
              "cudaStreamWaitEvent");
    }
    raw_call(r, op, pa, pb, na, t);
    if (events) {
      cuda_ok(cudaEventRecord(r->done[i], r->stream), "cudaEventRecord");
      if (!o->async && i < n - 1)
        cuda_ok(cudaStreamWaitEvent(NULL, r->done[i], 0),
                "cudaStreamWaitEvent");
    }
  }
  tm.issue = (now_ns() - t0) / n;
  if (!events)
    cuda_ok(cudaStreamSynchronize(r->stream), "cudaStreamSynchronize");
  else if (!o->async)
    cuda_ok(cudaEventSynchronize(r->done[n - 1]), "cudaEventSynchronize");
  else
    for (int i = 0; i < n; i++)
      cuda_ok(cudaEventSynchronize(r->done[i]), "cudaEventSynchronize");
  tm.total = (now_ns() - t0) / n;
  return tm;
}

static timing_t raw_time(raw_t* r, const opts_t* o, tr_pg_op_t op,
                         tr_tensor_t* a, tr_tensor_t* b, int events) {
  if (o->warmup > 0) raw_batch(r, o, op, a, b, o->warmup, events);
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return raw_batch(r, o, op, a, b, o->iters, events);
}
#endif

#ifdef HAVE_NCCL
/* --issue-costs: mean host ns of one call, over batches of COST_N (small
 * enough that launches never wait for the device), the slowest rank's. */
enum { COST_N = 400 };

#define COST(label, call)                                                   \
  do {                                                                      \
    int64_t t0_ = now_ns();                                                 \
    for (int i_ = 0; i_ < COST_N; i_++) call;                               \
    int64_t v_ = max_over_ranks(pg, (now_ns() - t0_), dev);                 \
    cuda_ok(cudaStreamSynchronize(r->stream), "synchronize");               \
    cuda_ok(cudaDeviceSynchronize(), "synchronize");                        \
    if (rank == 0) printf("#   %-46s %8.0f\n", label, (double)v_ / COST_N); \
  } while (0)

static void issue_costs(raw_t* r, tr_pg_t* pg, tr_device_t dev) {
  int rank = tr_pg_rank(pg), cur = 0;
  int64_t shape[1] = {256};
  tr_tensor_t a;
  if (tr_tensor_zeros(&a, TR_F32, dev, 1, shape) < 0)
    die("allocation", TR_ENOMEM);
  void* p = tr_tensor_data(&a);
  cudaEvent_t ev, evt;
  cuda_ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event");
  cuda_ok(cudaEventCreate(&evt), "event");
  if (rank == 0) printf("# issue costs: host ns per call, 1 KiB f32\n");
  COST("cudaGetDevice", cudaGetDevice(&cur));
  COST("cudaSetDevice (current)", cudaSetDevice(dev.index));
  COST("cudaEventRecord (comm stream)", cudaEventRecord(ev, r->stream));
  COST("cudaEventRecord (comm stream, timing event)",
       cudaEventRecord(evt, r->stream));
  COST("cudaEventRecord (legacy default stream)", cudaEventRecord(ev, NULL));
  COST("cudaStreamWaitEvent (comm waits)",
       cudaStreamWaitEvent(r->stream, ev, 0));
  COST("cudaStreamWaitEvent (legacy default waits)",
       cudaStreamWaitEvent(NULL, ev, 0));
  COST("cudaEventQuery", cudaEventQuery(ev));
  COST("ncclAllReduce",
       ncclAllReduce(p, p, 256, ncclFloat32, ncclSum, r->comm, r->stream));
  COST("ncclGroupStart + ncclAllReduce + ncclGroupEnd",
       (ncclGroupStart(),
        ncclAllReduce(p, p, 256, ncclFloat32, ncclSum, r->comm, r->stream),
        ncclGroupEnd()));
  COST("raw event protocol (sync mode) + ncclAllReduce",
       (cudaEventRecord(r->ready, NULL),
        cudaStreamWaitEvent(r->stream, r->ready, 0),
        ncclAllReduce(p, p, 256, ncclFloat32, ncclSum, r->comm, r->stream),
        cudaEventRecord(ev, r->stream), cudaStreamWaitEvent(NULL, ev, 0)));
  COST("tr_pg_all_reduce (blocking)",
       tr_pg_all_reduce(pg, &a, TR_PG_SUM, NULL));
  tr_pg_work_t* w = NULL;
  COST("tr_pg_all_reduce (handle) + tr_pg_work_free",
       (tr_pg_all_reduce(pg, &a, TR_PG_SUM, &w), tr_pg_work_free(w)));
  cudaEventDestroy(ev);
  cudaEventDestroy(evt);
  tr_tensor_release(&a);
}
#undef COST
#endif

static void fill_check(tr_pg_t* pg, tr_pg_op_t op, tr_tensor_t* a,
                       tr_tensor_t* b, int n) {
  /* ones in, n (all_reduce, reduce_scatter) or ones (all_gather) out */
  tr_tensor_fill(a, 1);
  tr_tensor_fill(b, 1);
  int rc = issue(pg, op, a, b, NULL);
  if (rc < 0) die(tr_pg_op_name(op), rc);
  tr_tensor_t* out = op == TR_PG_OP_ALL_GATHER ? b : a;
  tr_tensor_t h;
  if (tr_tensor_empty(&h, out->dtype, TR_DEVICE_CPU, out->ndim, out->shape) < 0)
    return;
  tr_tensor_copy(&h, out);
  double want = op == TR_PG_OP_ALL_GATHER ? 1 : n;
  int64_t k = tr_tensor_numel(&h);
  for (int64_t i = 0; i < k; i += k / 7 + 1)
    if (tr_tensor_get(&h, i) != want) {
      fprintf(stderr, "coll_bench: %s: element %lld is %g, not %g\n",
              tr_pg_op_name(op), (long long)i, tr_tensor_get(&h, i), want);
      exit(1);
    }
  tr_tensor_release(&h);
}

static void run(tr_pg_t* pg, tr_store_client_t* store, const opts_t* o,
                tr_device_t dev) {
  int n = tr_pg_size(pg), rank = tr_pg_rank(pg);
  const char* be = tr_pg_backend_name(tr_pg_backend(pg, dev.type));
  size_t esz = tr_dtype_size(o->dtype);
#ifdef HAVE_NCCL
  raw_t raw;
  int use_raw = o->raw && dev.type == TR_DEV_CUDA && store;
  if (use_raw) {
    cudaSetDevice(dev.index);
    int rc = raw_init(&raw, store, rank, n, o);
    if (rc < 0) die("raw NCCL set-up", rc);
  }
#else
  int use_raw = 0;
  (void)store;
#endif
  int use_ev = use_raw && o->raw_events;
#ifdef HAVE_NCCL
  if (use_raw && o->costs) issue_costs(&raw, pg, dev);
#endif
  if (rank == 0) {
    printf(
        "# coll_bench: %s, %d ranks, %s, %d iterations (%d warm-up), %s "
        "mode, best of %d\n",
        be, n, tr_dtype_name(o->dtype), o->iters, o->warmup,
        o->async ? "async" : "sync", o->reps);
    printf("# %12s  %-15s %12s %12s %12s%s%s %9s%s%s\n", "size(B)", "op",
           "time(us)", "algbw(GB/s)", "busbw(GB/s)",
           use_raw ? "    raw(GB/s)  ratio" : "",
           use_ev ? "  rawev(GB/s)  ratio" : "", "issue(us)",
           use_raw ? " raw_issue(us)" : "", o->op_timing ? "   dev(us)" : "");
  }
  for (int64_t size = o->min_bytes; size <= o->max_bytes; size *= o->factor) {
    /* whole buffer: a multiple of n elements */
    int64_t elems = size / (int64_t)esz / n * n;
    if (elems < n) elems = n;
    for (int k = 0; k < NOPS; k++) {
      if (!(o->ops & (1 << k))) continue;
      tr_pg_op_t op = k_ops[k].op;
      int64_t full[1] = {elems}, part[1] = {elems / n};
      tr_tensor_t a, b;
      int rc = tr_tensor_empty(&a, o->dtype, dev, 1,
                               op == TR_PG_OP_ALL_REDUCE ? full : part);
      if (rc == 0) rc = tr_tensor_empty(&b, o->dtype, dev, 1, full);
      if (rc < 0) die("allocation", rc);
      if (op == TR_PG_OP_ALL_REDUCE) tr_tensor_fill(&a, 0);
      if (o->check) fill_check(pg, op, &a, &b, n);
      /* the fastest of o->reps, each the slowest rank's; interleaved */
      int64_t t = INT64_MAX, ti = 0, td = 0, traw = INT64_MAX, trawi = 0;
      int64_t tev = INT64_MAX;
      for (int r = 0; r < o->reps; r++) {
        timing_t m = time_op(pg, o, op, &a, &b);
        int64_t v = max_over_ranks(pg, m.total, dev);
        int64_t vi = max_over_ranks(pg, m.issue, dev);
        int64_t vd = max_over_ranks(pg, m.dev, dev);
        if (v < t) {
          t = v;
          ti = vi;
          td = vd;
        }
#ifdef HAVE_NCCL
        if (use_raw) {
          m = raw_time(&raw, o, op, &a, &b, 0);
          v = max_over_ranks(pg, m.total, dev);
          vi = max_over_ranks(pg, m.issue, dev);
          if (v < traw) {
            traw = v;
            trawi = vi;
          }
        }
        if (use_ev) {
          m = raw_time(&raw, o, op, &a, &b, 1);
          v = max_over_ranks(pg, m.total, dev);
          if (v < tev) tev = v;
        }
#endif
      }
      if (rank == 0) {
        double bytes = (double)elems * (double)esz;
        double alg = bytes / (double)t; /* bytes/ns = GB/s */
        double bus = alg * bus_factor(op, n);
        printf("  %12.0f  %-15s %12.2f %12.3f %12.3f", bytes, k_ops[k].name,
               (double)t / 1000, alg, bus);
        if (use_raw) {
          double rbus = bytes / (double)traw * bus_factor(op, n);
          printf(" %12.3f %6.3f", rbus, rbus > 0 ? bus / rbus : 0);
        }
        if (use_ev) {
          double ebus = bytes / (double)tev * bus_factor(op, n);
          printf(" %12.3f %6.3f", ebus, ebus > 0 ? bus / ebus : 0);
        }
        printf(" %9.2f", (double)ti / 1000);
        if (use_raw) printf(" %13.2f", (double)trawi / 1000);
        if (o->op_timing) printf(" %9.2f", (double)td / 1000);
        printf("\n");
        fflush(stdout);
      }
      tr_tensor_release(&a);
      tr_tensor_release(&b);
    }
  }
#ifdef HAVE_NCCL
  if (use_raw) raw_release(&raw);
#endif
}

static int rank_main(const opts_t* o, int rank, int port) {
  tr_store_client_t* c = NULL;
  if (port > 0) {
    tr_store_client_opts_t co;
    tr_store_client_opts_init(&co);
    co.host = "127.0.0.1";
    co.port = port;
    co.timeout_ms = 60000;
    int rc = tr_store_client_connect(&co, &c);
    if (rc < 0) die("store", rc);
  }
  tr_pg_opts_t po;
  tr_pg_opts_init(&po);
  po.rank = rank;
  po.world_size = o->n;
  po.store = c;
  po.backend = o->backend;
  po.timeout_ms = 600000;
  tr_pg_t* pg = NULL;
  int rc = tr_pg_new(&po, &pg);
  if (rc < 0) die("tr_pg_new", rc);
  if (o->op_timing) tr_pg_set_op_timing(pg, 1);
  tr_device_t dev = TR_DEVICE_CPU;
  if (o->gpu) {
    int ng = tr_cuda_device_count();
    dev = (tr_device_t){TR_DEV_CUDA, ng > 0 ? tr_pg_rank(pg) % ng : 0};
  }
  run(pg, c, o, dev);
  tr_pg_free(pg);
  tr_store_client_free(c);
  return 0;
}

static void usage(void) {
  fprintf(
      stderr,
      "usage: coll_bench [-b gloo|nccl|mpi] [-n ranks] [-o ops] [-d dtype]\n"
      "                  [--min SIZE] [--max SIZE] [-f factor] [-w warmup]\n"
      "                  [-i iters] [--raw] [--raw-events] [--check]\n"
      "                  [--mode sync|async] [--reps N] [--op-timing]\n"
      "                  [--issue-costs]\n"
      "  ops: comma list of all_reduce, all_gather, reduce_scatter\n"
      "  SIZE: bytes with K/M/G suffixes (1K .. 64M; nccl: 1K .. 1G)\n"
      "  --raw: nccl only, time raw NCCL calls next to ours\n"
      "  --raw-events: also raw NCCL with the group's event protocol\n"
      "  --op-timing: time every op (tr_pg_set_op_timing), print dev(us)\n"
      "  --issue-costs: nccl only, first the host time of each call an op\n"
      "          makes (implies --raw)\n"
      "  --mode: sync (blocking calls, the default) or async (handles,\n"
      "          waited at the end of each batch)\n"
      "  --reps: time each variant N times, keep the fastest\n");
  exit(2);
}

/* Device count without initialising CUDA here (ranks are forked). */
static int count_gpus(void) {
  pid_t p = fork();
  if (p == 0) _exit(tr_cuda_device_count() & 0x7f);
  int st = 0;
  if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st)) return 0;
  return WEXITSTATUS(st);
}

int main(int argc, char** argv) {
  opts_t o = {"gloo", 2, 1024, -1, 2, 5, 20, TR_F32, 7, 0, 0, 0, 0, 1, 0, 0, 0};
  static const struct option lo[] = {{"min", required_argument, 0, 1},
                                     {"max", required_argument, 0, 2},
                                     {"raw", no_argument, 0, 3},
                                     {"check", no_argument, 0, 4},
                                     {"mode", required_argument, 0, 5},
                                     {"reps", required_argument, 0, 6},
                                     {"raw-events", no_argument, 0, 7},
                                     {"op-timing", no_argument, 0, 8},
                                     {"issue-costs", no_argument, 0, 9},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  int ch, n_set = 0;
  while ((ch = getopt_long(argc, argv, "b:n:o:d:f:w:i:h", lo, NULL)) != -1) {
    switch (ch) {
      case 'b':
        o.backend = optarg;
        break;
      case 'n':
        o.n = atoi(optarg);
        n_set = 1;
        break;
      case 'o':
        o.ops = 0;
        for (int k = 0; k < NOPS; k++)
          if (strstr(optarg, k_ops[k].name)) o.ops |= 1 << k;
        if (!o.ops) usage();
        break;
      case 'd':
        if (tr_dtype_parse(optarg, &o.dtype) < 0) usage();
        break;
      case 'f':
        o.factor = atoi(optarg);
        break;
      case 'w':
        o.warmup = atoi(optarg);
        break;
      case 'i':
        o.iters = atoi(optarg);
        break;
      case 1:
        o.min_bytes = parse_size(optarg);
        break;
      case 2:
        o.max_bytes = parse_size(optarg);
        break;
      case 3:
        o.raw = 1;
        break;
      case 4:
        o.check = 1;
        break;
      case 5:
        if (!strcmp(optarg, "async"))
          o.async = 1;
        else if (!strcmp(optarg, "sync"))
          o.async = 0;
        else
          usage();
        break;
      case 6:
        o.reps = atoi(optarg);
        break;
      case 7:
        o.raw = o.raw_events = 1;
        break;
      case 8:
        o.op_timing = 1;
        break;
      case 9:
        o.raw = o.costs = 1;
        break;
      default:
        usage();
    }
  }
  int gpu = strstr(o.backend, "nccl") != NULL;
  o.gpu = gpu;
  if (o.max_bytes < 0) o.max_bytes = gpu ? (int64_t)1 << 30 : 64 << 20;
  if (o.factor < 2 || o.iters < 1 || o.warmup < 0 || o.min_bytes < 1 ||
      o.reps < 1)
    usage();

  const char* mpi_size = getenv("OMPI_COMM_WORLD_SIZE");
  if (mpi_size) { /* under mpirun: MPI's ranks, no store */
    o.n = atoi(mpi_size);
    return rank_main(&o, atoi(getenv("OMPI_COMM_WORLD_RANK")), 0);
  }
  if (gpu && !n_set) o.n = count_gpus();
  if (o.n < 1 || o.n > 64) {
    fprintf(stderr, "coll_bench: need 1..64 ranks (GPUs: %d)\n", o.n);
    return 1;
  }

  /* the store server in a process of its own; ranks forked from here */
  int fd[2];
  if (pipe(fd) < 0) die("pipe", tr_err_from_errno());
  pid_t srv = fork();
  if (srv == 0) {
    tr_store_server_opts_t so;
    tr_store_server_opts_init(&so);
    so.host = "127.0.0.1";
    tr_store_server_t* s = NULL;
    int port =
        tr_store_server_start(&so, &s) < 0 ? -1 : tr_store_server_port(s);
    if (write(fd[1], &port, sizeof port) != (ssize_t)sizeof port) _exit(1);
    for (;;) pause();
  }
  int port = -1;
  if (read(fd[0], &port, sizeof port) != (ssize_t)sizeof port || port <= 0)
    die("store server", TR_EIO);
  pid_t pids[64];
  fflush(stdout);
  for (int r = 0; r < o.n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(rank_main(&o, r, port));
  }
  int failed = 0;
  for (int r = 0; r < o.n; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  kill(srv, SIGKILL);
  waitpid(srv, NULL, 0);
  return failed;
}
