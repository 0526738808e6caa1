/* pipelining/validate.c: PyTorch's _validate_schedule on a compute-only
 * schedule, its faults reported as PyTorch words them, with the Step ×
 * Rank grid pointing at the offending step (trainrun/pipelining.h). */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

typedef struct {
  const tr_pp_schedule_t* s;
  char* err;
  size_t errlen;
} report_t;

/* A fault without a step: just the message. */
static int fault(report_t* rp, const char* fmt, ...) {
  if (rp->err && rp->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rp->err, rp->errlen, fmt, ap);
    va_end(ap);
  }
  return TR_EINVAL;
}

/* A fault at rank r's step: "Rank r, step t: <what>", then the grid. */
static int fault_at(report_t* rp, int r, int64_t t, const char* what) {
  if (!rp->err || !rp->errlen) return TR_EINVAL;
  char* grid = tr_pp_schedule_format(rp->s, t);
  snprintf(rp->err, rp->errlen,
           "Rank %d, step %" PRId64 ": %s\n\nFull pipeline schedule:\n%s", r, t,
           what, grid ? grid : "(no memory for the grid)\n");
  free(grid);
  return TR_EINVAL;
}

enum { SEEN_F = 1, SEEN_B = 2, SEEN_I = 4, SEEN_W = 8 };

/* The walk's state: what ran per stage and micro-batch, and who owns each
 * stage. */
typedef struct {
  report_t* rp;
  int n_stages;
  int64_t n_micro;
  uint8_t* seen;
  int* owner;
} walk_t;

/* One plain action a at rank r's step t. */
static int check(walk_t* v, int r, int64_t t, const tr_pp_action_t* a) {
  char what[256], buf[TR_PP_ACTION_STRLEN];
  int st = a->stage;
  if (st < 0 || st >= v->n_stages) {
    snprintf(what, sizeof what, "%s: stage %d is not one of the %d stages",
             tr_pp_action_str(a, buf, sizeof buf), st, v->n_stages);
    return fault_at(v->rp, r, t, what);
  }
  int compute = a->type == TR_PP_F || a->type == TR_PP_B ||
                a->type == TR_PP_I || a->type == TR_PP_W;
  if (compute && (a->micro < 0 || a->micro >= v->n_micro)) {
    snprintf(what, sizeof what,
             "%s: microbatch %" PRId64 " is not one of the %" PRId64
             " microbatches",
             tr_pp_action_str(a, buf, sizeof buf), a->micro, v->n_micro);
    return fault_at(v->rp, r, t, what);
  }
  if (compute) {
    uint8_t* c = &v->seen[(size_t)st * (size_t)v->n_micro + (size_t)a->micro];
    const char* run = NULL;
    if ((a->type == TR_PP_B || a->type == TR_PP_I) && !(*c & SEEN_F))
      run = a->type == TR_PP_B ? "Full Backward" : "Backward Input";
    if (run) {
      snprintf(what, sizeof what,
               "Running %s for stage %d, microbatch %" PRId64
               " without first running Forward",
               run, st, a->micro);
      return fault_at(v->rp, r, t, what);
    }
    if (a->type == TR_PP_W && !(*c & SEEN_I)) {
      snprintf(what, sizeof what,
               "Running Backward Weight for stage %d, microbatch %" PRId64
               " without first running Backward Input",
               st, a->micro);
      return fault_at(v->rp, r, t, what);
    }
    *c |= a->type == TR_PP_F   ? SEEN_F
          : a->type == TR_PP_B ? SEEN_B
          : a->type == TR_PP_I ? SEEN_I
                               : SEEN_W;
  }
  if (v->owner[st] < 0) {
    v->owner[st] = r;
  } else if (v->owner[st] != r) {
    snprintf(what, sizeof what,
             "Stage %d is assigned to both rank %d and rank %d", st, r,
             v->owner[st]);
    return fault_at(v->rp, r, t, what);
  }
  return 0;
}

int tr_pp_validate(const tr_pp_schedule_t* s, int pp, int n_stages,
                   int64_t n_micro, int* stage_to_rank, char* err,
                   size_t errlen) {
  report_t rp = {.s = s, .err = err, .errlen = errlen};
  if (s->n_ranks != pp)
    return fault(&rp,
                 "Schedule has incorrect number of ranks - expected %d, "
                 "actual %d",
                 pp, s->n_ranks);
  if (n_stages < 1 || n_micro < 1)
    return fault(&rp, "no stages or no micro-batches (%d, %" PRId64 ")",
                 n_stages, n_micro);
  uint8_t* seen = calloc((size_t)n_stages * (size_t)n_micro, 1);
  int* owner = malloc((size_t)n_stages * sizeof *owner);
  int rc = 0;
  if (!seen || !owner) {
    rc = TR_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n_stages; i++) owner[i] = -1;
  walk_t v = {.rp = &rp,
              .n_stages = n_stages,
              .n_micro = n_micro,
              .seen = seen,
              .owner = owner};
  for (int r = 0; r < s->n_ranks && rc == 0; r++)
    for (int64_t t = 0; t < s->len[r] && rc == 0; t++) {
      const tr_pp_action_t* a = &s->acts[r][t];
      if (a->type == TR_PP_NONE) continue;
      if (a->type != TR_PP_OVERLAP_F_B) {
        rc = check(&v, r, t, a);
        continue;
      }
      /* an OVERLAP_F_B: its forward, then its backward, at its step */
      for (int k = 0; k < 2 && rc == 0; k++) {
        tr_pp_action_t half = {.stage = a->sub[k].stage,
                               .type = a->sub[k].type,
                               .micro = a->sub[k].micro};
        rc = check(&v, r, t, &half);
      }
    }
  for (int st = 0; st < n_stages && rc == 0; st++) {
    int64_t nf = 0, nb = 0, ni = 0, nw = 0;
    for (int64_t m = 0; m < n_micro; m++) {
      uint8_t c = seen[(size_t)st * (size_t)n_micro + (size_t)m];
      nf += !!(c & SEEN_F);
      nb += !!(c & SEEN_B);
      ni += !!(c & SEEN_I);
      nw += !!(c & SEEN_W);
    }
    if (nf != n_micro)
      rc = fault(
          &rp, "Got %" PRId64 " F microbatches for stage %d, expected %" PRId64,
          nf, st, n_micro);
    else if (ni != nw)
      rc = fault(&rp,
                 "Invalid backward microbatches for stage %d: I and W must "
                 "have equal counts, but got I=%" PRId64 ", W=%" PRId64,
                 st, ni, nw);
    else if (nb + (ni + nw) / 2 != n_micro)
      rc = fault(&rp,
                 "Invalid backward microbatches for stage %d: expected %" PRId64
                 " total backwards, but got B=%" PRId64 ", I=%" PRId64
                 ", W=%" PRId64,
                 st, n_micro, nb, ni, nw);
  }
  if (rc == 0 && stage_to_rank)
    memcpy(stage_to_rank, owner, (size_t)n_stages * sizeof *owner);
out:
  free(seen);
  free(owner);
  return rc;
}
