/* collectives/waits.c: how the compute waits for a collective's work --
 * the host on the CPU; on CUDA the compute stream, with the work handles
 * held until the host sees them complete (errors, a bounded lead of the
 * host over the device) -- and the optional timing of both sides: the
 * collectives' durations and how long the compute waited for them (the
 * stall timer). Shared by data parallelism (fsdp2/: FSDP's all-gathers and
 * reduce-scatters, HSDP's and DDP's all-reduces) and tensor parallelism's
 * timed hook (dtensor/tp.c); trainrun/pg_waits.h. */
#include "config.h"

#include <math.h> /* NAN */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h" /* tr__now */
#include "trainrun/error.h"
#include "trainrun/kernels.h" /* the compute stream */
#include "trainrun/log.h"
#include "trainrun/pg_waits.h"
#ifdef HAVE_CUDA
#include <cuda_runtime_api.h> /* events around the stream waits */
#endif

/* A pair of events around one stream wait; the stall is their elapsed
 * time. */
typedef struct {
#ifdef HAVE_CUDA
  cudaEvent_t before, after;
#else
  int unused;
#endif
} stall_pair_t;

/* A wait being timed: stall_begin fills it before the wait, stall_end
 * closes it after. */
typedef struct {
  double t0; /* CPU: the clock before the wait */
  int pair;  /* CUDA: 1 + the pair recorded before, 0 untimed */
} stall_mark_t;

/* Stall pairs held before the oldest complete ones are read on the way
 * (stall_read reads every complete one). */
enum { PAIRS_SOFT_CAP = 512 };

double tr_pg_comm_hidden(double comm_ms, double exposed_ms) {
  if (!(comm_ms > 0)) return NAN;
  double h = 1.0 - exposed_ms / comm_ms;
  return h < 0 ? 0 : h > 1 ? 1 : h;
}

int tr_pg_waits_init(tr_pg_waits_t* q, int lag) {
  memset(q, 0, sizeof *q);
  q->lag = lag > 0 ? lag : 1;
  q->held = calloc((size_t)q->lag + 1, sizeof *q->held);
  return q->held ? 0 : TR_ENOMEM;
}

/* The end of a completed op's life: its status logged when it failed, its
 * duration counted, the handle freed. */
static int settle(tr_pg_waits_t* q, const tr_pg_held_t* h, int rc) {
  if (rc < 0) {
    const char* msg = tr_pg_work_error(h->w);
    TR_LOG_ERROR(COLL, "%s of %s %s: %s", h->what, h->kind, h->name,
                 msg ? msg : tr_strerror(rc));
  }
  double us;
  if (h->timed && rc == 0 && tr_pg_work_duration_us(h->w, &us) == 0) {
    q->comm_us += us;
    q->ops++;
  }
  tr_pg_work_free(h->w);
  return rc;
}

/* Wait (host) for the oldest held work and settle it. */
static int pop_oldest(tr_pg_waits_t* q) {
  tr_pg_held_t h = q->held[0];
  memmove(&q->held[0], &q->held[1], sizeof h * (size_t)(q->nheld - 1));
  q->nheld--;
  return settle(q, &h, tr_pg_work_wait(h.w, 0));
}

#ifdef HAVE_CUDA
/* Read the complete stall pairs, oldest first, without waiting (all of
 * them when all): the elapsed times go into exposed_us and the events are
 * kept for reuse. */
static void read_stalls(tr_pg_stall_t* q) {
  stall_pair_t* p = q->pairs;
  int done = 0;
  while (done < q->npairs && cudaEventQuery(p[done].after) == cudaSuccess) {
    float ms = 0;
    /* a record that failed leaves an older one: a negative span, skipped */
    if (cudaEventElapsedTime(&ms, p[done].before, p[done].after) ==
            cudaSuccess &&
        ms > 0)
      q->exposed_us += (double)ms * 1000.0;
    done++;
  }
  cudaGetLastError(); /* a NotReady query is no error */
  if (done == 0) return;
  /* rotate the read pairs behind the pending ones */
  stall_pair_t tmp[64];
  while (done > 0) {
    int k = done < 64 ? done : 64;
    memcpy(tmp, p, sizeof *p * (size_t)k);
    memmove(p, p + k, sizeof *p * (size_t)(q->npairs - k));
    memcpy(p + q->npairs - k, tmp, sizeof *p * (size_t)k);
    q->npairs -= k;
    done -= k;
  }
}

/* The next free pair of events (made on first use); NULL when CUDA cannot
 * make one (that wait goes untimed). */
static stall_pair_t* next_pair(tr_pg_stall_t* q) {
  if (q->npairs >= PAIRS_SOFT_CAP) read_stalls(q);
  if (q->npairs == q->cappairs) {
    int cap = q->cappairs ? 2 * q->cappairs : 64;
    stall_pair_t* p = realloc(q->pairs, sizeof *p * (size_t)cap);
    if (!p) return NULL;
    q->pairs = p;
    for (int i = q->cappairs; i < cap; i++) {
      if (cudaEventCreate(&p[i].before) != cudaSuccess) {
        cudaGetLastError();
        q->cappairs = i;
        return NULL;
      }
      if (cudaEventCreate(&p[i].after) != cudaSuccess) {
        cudaEventDestroy(p[i].before);
        cudaGetLastError();
        q->cappairs = i;
        return NULL;
      }
    }
    q->cappairs = cap;
  }
  return &((stall_pair_t*)q->pairs)[q->npairs++];
}
#endif

/* ---- the stall timer ----
 * How long the compute waited: on the CPU the host's time inside the wait;
 * on CUDA the kernels' stream's stall between two events recorded around
 * the stream wait, read once complete (never a host wait of its own). */

static void stall_begin(tr_pg_stall_t* s, int cuda, stall_mark_t* mk) {
  mk->t0 = 0;
  mk->pair = 0;
  if (!cuda) {
    mk->t0 = tr__now();
    return;
  }
#ifdef HAVE_CUDA
  stall_pair_t* sp = next_pair(s);
  if (!sp) return;
  if (cudaEventRecord(sp->before, (cudaStream_t)tr_kern_get_stream()) !=
      cudaSuccess) {
    cudaGetLastError();
    s->npairs--; /* this wait goes untimed */
    return;
  }
  mk->pair = s->npairs; /* 1 + its index */
#endif
}

static void stall_end(tr_pg_stall_t* s, int cuda, const stall_mark_t* mk) {
  if (!cuda) {
    s->exposed_us += (tr__now() - mk->t0) * 1e6;
    return;
  }
#ifdef HAVE_CUDA
  if (mk->pair <= 0 || mk->pair > s->npairs) return;
  stall_pair_t* sp = &((stall_pair_t*)s->pairs)[mk->pair - 1];
  if (cudaEventRecord(sp->after, (cudaStream_t)tr_kern_get_stream()) !=
      cudaSuccess)
    cudaGetLastError(); /* read later as a negative span: skipped */
#endif
}

/* Add the complete CUDA pairs to exposed_us, without waiting. */
static void stall_read(tr_pg_stall_t* s) {
#ifdef HAVE_CUDA
  if (s->npairs > 0) read_stalls(s);
#else
  (void)s;
#endif
}

static void stall_release(tr_pg_stall_t* s) {
  stall_read(s);
#ifdef HAVE_CUDA
  stall_pair_t* p = s->pairs;
  for (int i = 0; i < s->cappairs; i++) {
    cudaEventDestroy(p[i].before);
    cudaEventDestroy(p[i].after);
  }
  cudaGetLastError();
#endif
  free(s->pairs);
  memset(s, 0, sizeof *s);
}

/* ---- waiting ---- */

/* Buffer lifetimes on CUDA, why releasing them right after a stream wait
 * is safe. Device memory comes from the device's stream-ordered pool,
 * allocated and freed on the legacy default stream (core/cuda.cu:
 * cudaMallocAsync / cudaFreeAsync on stream 0; core/mem.c keeps no cache
 * of its own). NCCL runs the op on its group's stream after an event
 * recorded on the group's user stream when the op was issued (the legacy
 * stream: nobody sets another), so it sees what the default stream wrote
 * before. The op's work keeps references to its tensors (collectives/
 * work.c releases them when the last handle is dropped), so a buffer goes
 * back to the pool by whichever drops the last reference:
 *  - the work, when it is retired: a host thread saw the op's done event
 *    complete, so cudaFreeAsync comes after the op;
 *  - the caller (FSDP's or TP's tr_tensor_release after this wait): the free is enqueued on
 *    the legacy stream after its wait for the op's done event, so the pool
 *    hands the block out again only to work ordered after the op (other
 *    streams get it only once the free is known complete, or with a
 *    dependency the pool adds).
 * Either way no input is reused and no output freed while the op runs.
 * The compute (the kernels' stream, tr_kern_get_stream: the legacy stream
 * unless someone set one) waits too; the tensor copies the callers make
 * (FSDP's copy-out and grad layout, TP's sequence reorders) run on the
 * legacy stream, which is why that one always waits. */
int tr_pg_waits_wait(tr_pg_waits_t* q, tr_pg_work_t* w, int cuda, int consume,
                     int timed, const char* what, const char* kind,
                     const char* name) {
  tr_pg_held_t h = {
      .w = w, .what = what, .kind = kind, .name = name, .timed = timed};
  stall_mark_t mk;
  if (!cuda) {
    if (timed) stall_begin(&q->stall, 0, &mk);
    int rc = tr_pg_work_wait(w, 0);
    if (timed) stall_end(&q->stall, 0, &mk);
    return settle(q, &h, rc);
  }
#ifdef HAVE_CUDA
  int rc = 0;
  if (consume) {
    void* ks = tr_kern_get_stream();
    if (timed) stall_begin(&q->stall, 1, &mk);
    rc = tr_pg_work_wait_stream(w, NULL);
    if (rc == 0 && ks) rc = tr_pg_work_wait_stream(w, ks);
    if (timed) stall_end(&q->stall, 1, &mk);
  }
  if (rc < 0) return settle(q, &h, rc);
  /* held until the host sees it complete: the ones done already leave
   * now; past the lag the host waits for the oldest, which the device
   * finished long ago unless communication is what holds it up */
  q->held[q->nheld++] = h;
  while (rc == 0 && q->nheld > 0 && tr_pg_work_test(q->held[0].w) == 1)
    rc = pop_oldest(q);
  while (rc == 0 && q->nheld > q->lag) rc = pop_oldest(q);
  return rc;
#else
  (void)consume;
  (void)mk;
  return settle(q, &h, tr_pg_work_wait(w, 0));
#endif
}

int tr_pg_waits_drain(tr_pg_waits_t* q) {
  int rc = 0;
  while (q->nheld > 0) {
    int r2 = pop_oldest(q);
    if (rc == 0) rc = r2;
  }
  stall_read(&q->stall);
  return rc;
}

void tr_pg_waits_release(tr_pg_waits_t* q) {
  tr_pg_waits_drain(q);
  stall_release(&q->stall);
  free(q->held);
  memset(q, 0, sizeof *q);
}

void tr_pg_waits_take(tr_pg_waits_t* q, int64_t* steps, tr_pg_comm_t* out) {
  memset(out, 0, sizeof *out);
  out->steps = *steps;
  out->ops = q->ops;
  out->comm_ms = q->comm_us / 1000.0;
  out->exposed_ms = q->stall.exposed_us / 1000.0;
  out->hidden = tr_pg_comm_hidden(out->comm_ms, out->exposed_ms);
  *steps = 0;
  q->ops = 0;
  q->comm_us = q->stall.exposed_us = 0;
}
