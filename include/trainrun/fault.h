/* trainrun/fault.h: fault injection for resilience tests -- `--debug.fault
 * SPEC[,SPEC...]` makes chosen ranks fail in chosen ways at chosen steps.
 *
 * A spec is KIND followed by `:name=value` fields:
 *
 *   kill:rank=3:step=5          rank 3 sends itself SIGKILL as step 5 starts
 *   hang:rank=3:step=5          rank 3 blocks forever in step 5, after its
 *                               backward and before the gradient collective
 *                               (its peers wait in that collective)
 *   exit:rank=1:step=2:code=7   rank 1 exits with code 7 as step 2 starts
 *                               (code: 0 to 255, default 1)
 *   slow:rank=0:ms=500          rank 0 sleeps 500 ms in every step (with
 *                               step=N: in step N only)
 *   skip_collective:rank=2:step=4  rank 2 leaves out the gradient
 *                               collectives of step 4 (DDP: its gradient
 *                               all-reduces; FSDP: the gradient-norm
 *                               all-reduce), so its collective sequence
 *                               numbers fall behind its peers'
 *   mismatch:rank=2:step=4      rank 2 issues a gradient collective of step
 *                               4 of the wrong size (DDP: the first bucket
 *                               with one element fewer; FSDP: the
 *                               gradient-norm all-reduce with one value
 *                               more)
 *
 * Fields: rank (the global RANK; left out: every rank), step (optimizer
 * steps count from 1; needed by all kinds but slow), code, ms, and
 * restart=N: the restart count (TRAINRUN_RESTART_COUNT) in which the
 * fault fires (default 0: the first attempt only, so that a restarted job
 * recovers).
 *
 * The faults are process-wide: tr_fault_arm selects those of this rank and
 * attempt; the trainer calls tr_fault_step as each step starts,
 * tr_fault_before_sync before its gradient sync, the data-parallel layer
 * (DDP) calls tr_fault_grad_sync in place of its collectives, and with
 * sharded gradients (FSDP, whose collectives run in the block hooks) the
 * trainer asks tr_fault_sharded_sync at its gradient-norm all-reduce. Every
 * fault
 * that fires prints "trainrun: rank R: debug.fault 'SPEC': ..." on stderr
 * first, so a test (or a user) sees it in the rank's log. */
#ifndef TRAINRUN_FAULT_H
#define TRAINRUN_FAULT_H

#include <stdint.h>

#include "trainrun/errmsg.h"
#include "trainrun/pg.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TR_FAULT_KILL = 0,
  TR_FAULT_HANG,
  TR_FAULT_EXIT,
  TR_FAULT_SLOW,
  TR_FAULT_SKIP_COLLECTIVE,
  TR_FAULT_MISMATCH
} tr_fault_kind_t;

typedef struct {
  tr_fault_kind_t kind;
  int rank;      /* -1: every rank */
  int64_t step;  /* -1: every step (slow only) */
  int code;      /* exit */
  int64_t ms;    /* slow */
  int restart;   /* the attempt it fires in */
  char spec[96]; /* the text, for messages (cut at 95 bytes) */
} tr_fault_t;

/* Parse one spec into *f. TR_EINVAL with a message that quotes the spec
 * and says what is wrong ("debug.fault 'kill:rank=x': rank: expected a
 * number >= 0, got 'x'"). */
int tr_fault_parse(const char* spec, tr_fault_t* f, tr_errmsg_t* err);

/* Parse every spec (n of them) and keep, process-wide, those that fire on
 * `rank` in attempt `restart`; an earlier arming is replaced. Errors as
 * tr_fault_parse (nothing is armed then). n = 0 disarms. */
int tr_fault_arm(const char* const* specs, int n, int rank, int restart,
                 tr_errmsg_t* err);

/* How many faults are armed in this process. */
int tr_fault_armed(void);

/* At the start of optimizer step `step` (from 1): kill, exit and slow
 * faults act here. Returns (the others do not return). */
void tr_fault_step(int64_t step);

/* After the last backward of `step`, before its gradient collectives: a
 * hang fault blocks here for good. */
void tr_fault_before_sync(int64_t step);

/* The gradient collectives of `step` over pg, `flat` being the first
 * gradient buffer: returns 1 when a fault took the place of the
 * collectives (skip_collective: nothing issued; mismatch: an all-reduce of
 * flat's first numel - 1 elements, waited for), 0 when none applies (issue
 * them as usual), or the error of the mismatched collective. */
int tr_fault_grad_sync(tr_pg_t* pg, tr_tensor_t* flat, int64_t step);

/* With sharded gradients (FSDP), what the gradient-norm all-reduce of
 * `step` does: */
enum {
  TR_FAULT_SYNC_NONE = 0, /* as usual */
  TR_FAULT_SYNC_SKIP,     /* skip_collective: left out */
  TR_FAULT_SYNC_MISMATCH  /* mismatch: one value more than the peers' */
};
/* The TR_FAULT_SYNC_* a fault asks for (announced when not NONE). */
int tr_fault_sharded_sync(int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_FAULT_H */
