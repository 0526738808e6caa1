/* trainrun/pg_waits.h: how the compute waits for a collective's work, and
 * the optional timing of both sides -- what a parallelism layer shares when
 * it issues collectives with work handles (collectives/waits.c):
 *
 *   - on the CPU the host waits for the op;
 *   - on CUDA the compute stream (the kernels' stream, trainrun/kernels.h,
 *     and the legacy default stream) waits for it, no host wait: the
 *     handle is held until the host sees the op complete, at most `lag`
 *     of them (then the host waits for the oldest), so errors surface at a
 *     later wait or at the drain and the host's lead over the device stays
 *     bounded;
 *   - with timing, the durations of the ops issued with op timing on
 *     (tr_pg_set_op_timing) are summed once they complete, and so is how
 *     long the compute waited for them: the host's time inside each wait on
 *     the CPU; on CUDA the compute stream's stall between two events
 *     recorded around each stream wait, read once complete (never a host
 *     synchronisation of its own).
 *
 * Data parallelism (fsdp2/: FSDP, HSDP, DDP) and tensor parallelism's timed
 * hook (dtensor/tp.c) use it; the trainer reports the totals per step
 * ([metrics] comm_overlap):
 *
 *   tr_pg_waits_t q;
 *   tr_pg_waits_init(&q, 8);
 *   tr_pg_set_op_timing(pg, 1);
 *   tr_pg_work_t* w;
 *   tr_pg_all_reduce(pg, &t, TR_PG_SUM, &w);
 *   tr_pg_waits_wait(&q, w, cuda, 1, 1, "all-reduce", "bucket", "b0");
 *   ... the step ...
 *   tr_pg_waits_drain(&q);                 // the step's end: errors
 *   steps++;
 *   tr_pg_comm_t c;
 *   tr_pg_waits_take(&q, &steps, &c);      // totals since the last take
 *   tr_pg_waits_release(&q);
 */
#ifndef TRAINRUN_PG_WAITS_H
#define TRAINRUN_PG_WAITS_H

#include <stdint.h>

#include "trainrun/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Communication overlap over the steps since the last take: totals, and
 * hidden = 1 - exposed / comm (tr_pg_comm_hidden). */
typedef struct {
  int64_t steps;     /* steps measured (0: nothing measured) */
  int64_t ops;       /* collectives timed */
  double comm_ms;    /* the sum of their durations */
  double exposed_ms; /* how long the compute waited for them */
  double hidden;     /* within [0, 1]; NaN when nothing was timed */
} tr_pg_comm_t;

/* 1 - exposed_ms / comm_ms clamped to [0, 1] (a wait also covers its own
 * overhead -- event pairs, clock reads, ops queued before the one waited
 * for -- so the raw ratio can pass 1); NAN when comm_ms is not positive. */
double tr_pg_comm_hidden(double comm_ms, double exposed_ms);

/* The compute's waits (the stall timer): private fields. */
typedef struct {
  void* pairs;          /* CUDA event pairs around the stream waits */
  int npairs, cappairs; /* pending, made */
  double exposed_us;    /* waits read so far (zeroed by the take) */
} tr_pg_stall_t;

/* A work whose consumer already waits for it on the device, held until
 * the host sees it complete. */
typedef struct {
  tr_pg_work_t* w;
  const char* what; /* "all-gather", ... for messages */
  const char* kind; /* "group", "bucket", "tp point" */
  const char* name; /* its group's or bucket's name (the caller's storage,
                       alive while the work is held) */
  int timed;        /* its duration counts */
} tr_pg_held_t;

typedef struct {
  int lag;            /* works held at most before the host waits */
  tr_pg_held_t* held; /* [lag + 1], oldest first */
  int nheld;
  tr_pg_stall_t stall; /* the compute's waits */
  /* since the last take */
  double comm_us; /* durations of the timed collectives */
  int64_t ops;    /* collectives timed */
} tr_pg_waits_t;

/* lag < 1 counts as 1. TR_ENOMEM. */
int tr_pg_waits_init(tr_pg_waits_t* q, int lag);
/* The compute waits for w's op and w is taken (freed now or later). CPU
 * (cuda 0): the host waits; returns the op's status. CUDA: when consume,
 * the compute stream and the legacy default stream wait (no host wait)
 * and the handle is held; consume 0 (an op nobody reads: an unused
 * prefetch) only holds it. Held works that completed are settled on the
 * way, and past `lag` held the host waits for the oldest: the error of
 * any of them is returned (and logged as "<what> of <kind> <name>: ...").
 * timed: count the op's duration (its group had op timing on when it was
 * issued) and the wait. */
int tr_pg_waits_wait(tr_pg_waits_t* q, tr_pg_work_t* w, int cuda, int consume,
                     int timed, const char* what, const char* kind,
                     const char* name);
/* Host-wait for every held work (no device wait once the device has run
 * the step) and read the complete stall events; the first error. */
int tr_pg_waits_drain(tr_pg_waits_t* q);
/* Drain and free. */
void tr_pg_waits_release(tr_pg_waits_t* q);
/* The totals since the last take into *out (steps: *steps, the caller's
 * count of timed steps), and start new ones (*steps too). */
void tr_pg_waits_take(tr_pg_waits_t* q, int64_t* steps, tr_pg_comm_t* out);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_PG_WAITS_H */
