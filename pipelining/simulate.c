/* pipelining/simulate.c: the lock-step dry run of a compute-only schedule
 * — steps, bubble fraction, peak in-flight micro-batches per stage, and the
 * timeline it ran (trainrun/pipelining.h). Every action takes one step (an
 * OVERLAP_F_B too); an action needing another rank's output waits for the
 * step after it. */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

void tr_pp_sim_release(tr_pp_sim_t* sim) {
  free(sim->peak_inflight);
  memset(sim, 0, sizeof *sim);
}

static int is_compute(tr_pp_type_t t) {
  return t == TR_PP_F || t == TR_PP_B || t == TR_PP_I || t == TR_PP_W ||
         t == TR_PP_OVERLAP_F_B;
}

/* The plain actions of a: itself, or an OVERLAP_F_B's two halves. */
static int halves(const tr_pp_action_t* a, tr_pp_action_t out[2]) {
  if (a->type != TR_PP_OVERLAP_F_B) {
    out[0] = *a;
    return 1;
  }
  for (int k = 0; k < 2; k++)
    out[k] = (tr_pp_action_t){.stage = a->sub[k].stage,
                              .type = a->sub[k].type,
                              .micro = a->sub[k].micro};
  return 2;
}

static void say(char* err, size_t errlen, const char* fmt, ...) {
  if (!err || !errlen) return;
  size_t used = strnlen(err, errlen);
  if (used + 1 >= errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + used, errlen - used, fmt, ap);
  va_end(ap);
}

typedef struct {
  int n_stages;
  int64_t n_micro;
  int64_t* f_at; /* step a stage's forward of a micro-batch ran, or -1 */
  int64_t* b_at; /* its B or I */
} done_t;

static int64_t* at(int64_t* tab, const done_t* d, int stage, int64_t micro) {
  return &tab[(int64_t)stage * d->n_micro + micro];
}

/* ran before step t */
static int before(int64_t when, int64_t t) { return when >= 0 && when < t; }

static int ready(const done_t* d, const tr_pp_action_t* a, int64_t t) {
  switch (a->type) {
    case TR_PP_F:
      return a->stage == 0 ||
             before(*at(d->f_at, d, a->stage - 1, a->micro), t);
    case TR_PP_B:
    case TR_PP_I:
      if (!before(*at(d->f_at, d, a->stage, a->micro), t)) return 0;
      return a->stage == d->n_stages - 1 ||
             before(*at(d->b_at, d, a->stage + 1, a->micro), t);
    default: /* W */
      return before(*at(d->b_at, d, a->stage, a->micro), t);
  }
}

int tr_pp_simulate(const tr_pp_schedule_t* s, int n_stages, tr_pp_sim_t* out,
                   tr_pp_schedule_t* timeline, char* err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (timeline) memset(timeline, 0, sizeof *timeline);
  if (err && errlen) err[0] = 0;
  if (n_stages < 1) return TR_EINVAL;
  done_t d = {.n_stages = n_stages};
  for (int r = 0; r < s->n_ranks; r++)
    for (int64_t i = 0; i < s->len[r]; i++) {
      const tr_pp_action_t* a = &s->acts[r][i];
      if (!is_compute(a->type)) continue;
      tr_pp_action_t h[2];
      for (int k = halves(a, h) - 1; k >= 0; k--) {
        if (h[k].stage < 0 || h[k].stage >= n_stages || h[k].micro < 0) {
          char buf[TR_PP_ACTION_STRLEN];
          say(err, errlen, "rank %d, step %" PRId64 ": %s is outside %d stages",
              r, i, tr_pp_action_str(a, buf, sizeof buf), n_stages);
          return TR_EINVAL;
        }
        if (h[k].micro + 1 > d.n_micro) d.n_micro = h[k].micro + 1;
      }
    }
  size_t cells = (size_t)n_stages * (size_t)(d.n_micro ? d.n_micro : 1);
  d.f_at = malloc(cells * sizeof *d.f_at);
  d.b_at = malloc(cells * sizeof *d.b_at);
  int64_t* pos = calloc((size_t)s->n_ranks, sizeof *pos);
  int64_t* inflight = calloc((size_t)n_stages, sizeof *inflight);
  out->peak_inflight = calloc((size_t)n_stages, sizeof *out->peak_inflight);
  out->n_stages = n_stages;
  int rc = 0;
  if (!d.f_at || !d.b_at || !pos || !inflight || !out->peak_inflight) {
    rc = TR_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < cells; i++) d.f_at[i] = d.b_at[i] = -1;
  if (timeline)
    TR_CHECK_GOTO(tr_pp_schedule_init(timeline, s->n_ranks), rc, out);
  for (int64_t t = 0;; t++) {
    int left = 0, moved = 0;
    for (int r = 0; r < s->n_ranks; r++) {
      /* idle slots and communication / FSDP actions take no step here */
      while (pos[r] < s->len[r] && !is_compute(s->acts[r][pos[r]].type))
        pos[r]++;
      if (pos[r] == s->len[r]) continue;
      left = 1;
      const tr_pp_action_t* a = &s->acts[r][pos[r]];
      /* an OVERLAP_F_B runs when both its halves can */
      tr_pp_action_t h[2];
      int nh = halves(a, h), ok = 1;
      for (int k = 0; k < nh; k++) ok = ok && ready(&d, &h[k], t);
      if (!ok) continue;
      for (int k = 0; k < nh; k++) {
        const tr_pp_action_t* x = &h[k];
        switch (x->type) {
          case TR_PP_F:
            *at(d.f_at, &d, x->stage, x->micro) = t;
            if (++inflight[x->stage] > out->peak_inflight[x->stage])
              out->peak_inflight[x->stage] = inflight[x->stage];
            break;
          case TR_PP_B:
            *at(d.b_at, &d, x->stage, x->micro) = t;
            inflight[x->stage]--;
            break;
          case TR_PP_I:
            *at(d.b_at, &d, x->stage, x->micro) = t;
            break;
          default: /* W: the activations go with the weight gradient */
            inflight[x->stage]--;
            break;
        }
      }
      if (timeline) {
        while (timeline->len[r] < t)
          TR_CHECK_GOTO(tr_pp_schedule_push(
                            timeline, r,
                            (tr_pp_action_t){.type = TR_PP_NONE, .micro = -1}),
                        rc, out);
        TR_CHECK_GOTO(tr_pp_schedule_push(timeline, r, *a), rc, out);
      }
      pos[r]++;
      out->busy++;
      out->steps = t + 1;
      moved = 1;
    }
    if (!left) break;
    if (!moved) {
      say(err, errlen, "schedule is not progressing at step %" PRId64 ":", t);
      for (int r = 0; r < s->n_ranks; r++)
        if (pos[r] < s->len[r]) {
          char buf[TR_PP_ACTION_STRLEN];
          say(err, errlen, " rank %d waits at %s;", r,
              tr_pp_action_str(&s->acts[r][pos[r]], buf, sizeof buf));
        }
      rc = TR_EINVAL;
      goto out;
    }
  }
  out->bubble = out->steps ? 1.0 - (double)out->busy /
                                       ((double)out->steps * (double)s->n_ranks)
                           : 0.0;
out:
  free(d.f_at);
  free(d.b_at);
  free(pos);
  free(inflight);
  if (rc < 0) {
    tr_pp_sim_release(out);
    if (timeline && timeline->len) tr_pp_schedule_release(timeline);
  }
  return rc;
}
