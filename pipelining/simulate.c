/* pipelining/simulate.c: the dry runs of a compute-only schedule
 * (trainrun/pipelining.h). The lock-step one: steps, bubble fraction,
 * peak in-flight micro-batches per stage and the timeline it ran; every
 * action takes one step (an OVERLAP_F_B too), and an action needing
 * another rank's output waits for the step after it. The timed one: every
 * computation in its rank's order as soon as the rank is free and its
 * inputs exist, at a cost per stage and kind; with the costs measured in
 * an executed step it predicts that step's idle time per rank, next to the
 * measured one: what an executor with free communication and no host
 * overhead would reach. */
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

/* The micro-batches s's computations name (the largest index + 1);
 * TR_EINVAL with err for one outside n_stages. */
static int micro_batches(const tr_pp_schedule_t* s, int n_stages,
                         int64_t* n_micro, char* err, size_t errlen) {
  *n_micro = 0;
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
        if (h[k].micro + 1 > *n_micro) *n_micro = h[k].micro + 1;
      }
    }
  return 0;
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
  TR_CHECK(micro_batches(s, n_stages, &d.n_micro, err, errlen));
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

/* ---- the timed simulation and an executed step's idle time ---- */

void tr_pp_idle_release(tr_pp_idle_t* st) {
  free(st->busy);
  free(st->idle);
  free(st->sim_idle);
  memset(st, 0, sizeof *st);
}

/* F, B, I, W: their index in a stage's costs; -1 for the rest */
static int kind_of(tr_pp_type_t t) {
  switch (t) {
    case TR_PP_F:
      return 0;
    case TR_PP_B:
      return 1;
    case TR_PP_I:
      return 2;
    case TR_PP_W:
      return 3;
    default:
      return -1;
  }
}

typedef struct {
  int n_stages;
  int64_t n_micro;
  double* f_end; /* [stage][micro]: when its F ended; < 0 not yet */
  double* b_end; /* its B or I */
} deps_t;

static double* end_at(double* tab, const deps_t* d, int stage, int64_t micro) {
  return &tab[(int64_t)stage * d->n_micro + micro];
}

/* When the inputs of plain action a exist; < 0 while they do not. */
static double inputs_at(const deps_t* d, const tr_pp_action_t* a) {
  double t = 0, u;
  switch (a->type) {
    case TR_PP_F:
      return a->stage == 0 ? 0 : *end_at(d->f_end, d, a->stage - 1, a->micro);
    case TR_PP_B:
    case TR_PP_I:
      t = *end_at(d->f_end, d, a->stage, a->micro);
      if (t < 0 || a->stage == d->n_stages - 1) return t;
      u = *end_at(d->b_end, d, a->stage + 1, a->micro);
      return u < 0 ? u : (u > t ? u : t);
    default: /* W */
      return *end_at(d->b_end, d, a->stage, a->micro);
  }
}

/* The timed simulation: every computation of s in its rank's order, as
 * soon as its rank is free and its inputs exist. */
static int simulate(const tr_pp_schedule_t* s, int n_stages, const double* cost,
                    const double* const* own, double* span, double* busy,
                    char* err, size_t errlen) {
  int R = s->n_ranks;
  deps_t d = {.n_stages = n_stages};
  TR_CHECK(micro_batches(s, n_stages, &d.n_micro, err, errlen));
  size_t cells = (size_t)n_stages * (size_t)(d.n_micro ? d.n_micro : 1);
  d.f_end = malloc(cells * sizeof *d.f_end);
  d.b_end = malloc(cells * sizeof *d.b_end);
  int64_t* pos = calloc((size_t)R, sizeof *pos);
  double* free_at = calloc((size_t)R, sizeof *free_at);
  int rc = 0;
  *span = 0;
  if (!d.f_end || !d.b_end || !pos || !free_at) {
    rc = TR_ENOMEM;
    goto out;
  }
  for (size_t c = 0; c < cells; c++) d.f_end[c] = d.b_end[c] = -1;
  if (busy)
    for (int r = 0; r < R; r++) busy[r] = 0;
  for (int left = 1; left;) {
    left = 0;
    int moved = 0;
    for (int r = 0; r < R; r++) {
      for (;;) {
        while (pos[r] < s->len[r] && !is_compute(s->acts[r][pos[r]].type))
          pos[r]++;
        if (pos[r] == s->len[r]) break;
        const tr_pp_action_t* a = &s->acts[r][pos[r]];
        tr_pp_action_t h[2];
        int nh = halves(a, h);
        double start = free_at[r], dur = 0;
        int ok = 1;
        for (int k = 0; k < nh && ok; k++) {
          double in = inputs_at(&d, &h[k]);
          if (in < 0)
            ok = 0;
          else if (in > start)
            start = in;
          dur += cost[h[k].stage * 4 + kind_of(h[k].type)];
        }
        if (!ok) break;
        if (nh == 2 && own && own[r])
          dur = own[r][2 * pos[r] + 1] - own[r][2 * pos[r]];
        double end = start + dur;
        for (int k = 0; k < nh; k++) {
          if (h[k].type == TR_PP_F)
            *end_at(d.f_end, &d, h[k].stage, h[k].micro) = end;
          else if (h[k].type == TR_PP_B || h[k].type == TR_PP_I)
            *end_at(d.b_end, &d, h[k].stage, h[k].micro) = end;
        }
        free_at[r] = end;
        if (busy) busy[r] += dur;
        if (end > *span) *span = end;
        pos[r]++;
        moved = 1;
      }
      if (pos[r] < s->len[r]) left = 1;
    }
    if (left && !moved) {
      char name[TR_PP_ACTION_STRLEN];
      for (int r = 0; r < R; r++)
        if (pos[r] < s->len[r]) {
          say(err, errlen,
              "the schedule does not progress: rank %d waits at %s", r,
              tr_pp_action_str(&s->acts[r][pos[r]], name, sizeof name));
          break;
        }
      rc = TR_EINVAL;
      break;
    }
  }
out:
  free(d.f_end);
  free(d.b_end);
  free(pos);
  free(free_at);
  return rc;
}

int tr_pp_simulate_costs(const tr_pp_schedule_t* s, int n_stages,
                         const double* cost, double* span, double* busy,
                         char* err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!s || n_stages < 1 || !cost || !span) return TR_EINVAL;
  return simulate(s, n_stages, cost, NULL, span, busy, err, errlen);
}

int tr_pp_idle_measure(const tr_pp_schedule_t* s, int n_stages,
                       const double* const* times, tr_pp_idle_t* out, char* err,
                       size_t errlen) {
  memset(out, 0, sizeof *out);
  if (err && errlen) err[0] = 0;
  if (!s || n_stages < 1 || !times) return TR_EINVAL;
  int R = s->n_ranks;
  /* the measured step: its span over every rank, the costs */
  double t0 = 0, t1 = 0;
  int have = 0;
  for (int r = 0; r < R; r++)
    for (int64_t i = 0; i < s->len[r]; i++) {
      const tr_pp_action_t* a = &s->acts[r][i];
      if (!is_compute(a->type)) continue;
      if (!times[r] || !(times[r][2 * i] > 0) ||
          !(times[r][2 * i + 1] >= times[r][2 * i])) {
        char name[TR_PP_ACTION_STRLEN];
        say(err, errlen, "rank %d: %s has no measured time", r,
            tr_pp_action_str(a, name, sizeof name));
        return TR_EINVAL;
      }
      if (!have || times[r][2 * i] < t0) t0 = times[r][2 * i];
      if (!have || times[r][2 * i + 1] > t1) t1 = times[r][2 * i + 1];
      have = 1;
    }
  if (!have) {
    say(err, errlen, "the step ran no computation");
    return TR_EINVAL;
  }
  double* cost = calloc((size_t)n_stages * 4, sizeof *cost);
  int64_t* count = calloc((size_t)n_stages * 4, sizeof *count);
  out->busy = calloc((size_t)R, sizeof *out->busy);
  out->idle = calloc((size_t)R, sizeof *out->idle);
  out->sim_idle = calloc((size_t)R, sizeof *out->sim_idle);
  out->n_ranks = R;
  int rc = 0;
  if (!cost || !count || !out->busy || !out->idle || !out->sim_idle) {
    rc = TR_ENOMEM;
    goto out;
  }
  for (int r = 0; r < R; r++)
    for (int64_t i = 0; i < s->len[r]; i++) {
      const tr_pp_action_t* a = &s->acts[r][i];
      int k = kind_of(a->type);
      /* an overlapped pair keeps its own time */
      if (k < 0 || a->stage < 0 || a->stage >= n_stages) continue;
      cost[a->stage * 4 + k] += times[r][2 * i + 1] - times[r][2 * i];
      count[a->stage * 4 + k]++;
    }
  for (int c = 0; c < n_stages * 4; c++)
    if (count[c]) cost[c] /= (double)count[c];
  /* the simulated busy time is the measured one: each kind's mean times
   * its count on its rank, each overlapped pair its own */
  rc = simulate(s, n_stages, cost, times, &out->sim_span, out->busy, err,
                errlen);
  if (rc < 0) goto out;
  out->span = t1 - t0;
  for (int r = 0; r < R; r++) {
    out->idle[r] = out->span > 0 ? 1.0 - out->busy[r] / out->span : 0;
    out->sim_idle[r] =
        out->sim_span > 0 ? 1.0 - out->busy[r] / out->sim_span : 0;
  }
out:
  free(cost);
  free(count);
  if (rc < 0) tr_pp_idle_release(out);
  return rc;
}
