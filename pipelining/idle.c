/* pipelining/idle.c: how long each pipeline rank sat idle in an executed
 * step, and what the simulator predicts with the costs measured in that
 * step (trainrun/pipelining.h). The prediction runs every rank's
 * computations in their list order, each as soon as its rank is free and
 * its inputs exist (the dependencies of tr_pp_simulate), each taking the
 * mean measured time of its kind on its stage: what an executor with free
 * communication and no host overhead would reach. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

void tr_pp_idle_release(tr_pp_idle_t* st) {
  free(st->busy);
  free(st->idle);
  free(st->sim_idle);
  memset(st, 0, sizeof *st);
}

static void say(char* err, size_t errlen, const char* fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* F, B, I, W: their index in a stage's costs; -1 for the rest */
static int kind_of(tr_pp_type_t t) {
  switch (t) {
    case TR_PP_F: return 0;
    case TR_PP_B: return 1;
    case TR_PP_I: return 2;
    case TR_PP_W: return 3;
    default: return -1;
  }
}

static int is_compute(tr_pp_type_t t) {
  return kind_of(t) >= 0 || t == TR_PP_OVERLAP_F_B;
}

typedef struct {
  int n_stages;
  int64_t n_micro;
  double* f_end; /* [stage][micro]: when its F ended; < 0 not yet */
  double* b_end; /* its B or I */
} deps_t;

static double* at(double* tab, const deps_t* d, int stage, int64_t micro) {
  return &tab[(int64_t)stage * d->n_micro + micro];
}

/* When the inputs of plain action a exist; < 0 while they do not. */
static double inputs_at(const deps_t* d, const tr_pp_action_t* a) {
  double t = 0, u;
  switch (a->type) {
    case TR_PP_F:
      return a->stage == 0 ? 0 : *at(d->f_end, d, a->stage - 1, a->micro);
    case TR_PP_B:
    case TR_PP_I:
      t = *at(d->f_end, d, a->stage, a->micro);
      if (t < 0 || a->stage == d->n_stages - 1) return t;
      u = *at(d->b_end, d, a->stage + 1, a->micro);
      return u < 0 ? u : (u > t ? u : t);
    default: /* W */
      return *at(d->b_end, d, a->stage, a->micro);
  }
}

static int halves(const tr_pp_action_t* a, tr_pp_action_t h[2]) {
  if (a->type != TR_PP_OVERLAP_F_B) {
    h[0] = *a;
    return 1;
  }
  for (int k = 0; k < 2; k++)
    h[k] = (tr_pp_action_t){.stage = a->sub[k].stage,
                            .type = a->sub[k].type,
                            .micro = a->sub[k].micro};
  return 2;
}

/* The timed simulation: every computation of s in its rank's order, as
 * soon as its rank is free and its inputs exist. */
static int simulate(const tr_pp_schedule_t* s, int n_stages,
                    const double* cost, const double* const* own, double* span,
                    double* busy, char* err, size_t errlen) {
  int R = s->n_ranks;
  deps_t d = {.n_stages = n_stages};
  for (int r = 0; r < R; r++)
    for (int64_t i = 0; i < s->len[r]; i++) {
      const tr_pp_action_t* a = &s->acts[r][i];
      if (!is_compute(a->type)) continue;
      tr_pp_action_t h[2];
      for (int k = halves(a, h) - 1; k >= 0; k--) {
        if (h[k].stage < 0 || h[k].stage >= n_stages || h[k].micro < 0) {
          char name[TR_PP_ACTION_STRLEN];
          say(err, errlen, "rank %d: %s is outside %d stages", r,
              tr_pp_action_str(a, name, sizeof name), n_stages);
          return TR_EINVAL;
        }
        if (h[k].micro + 1 > d.n_micro) d.n_micro = h[k].micro + 1;
      }
    }
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
            *at(d.f_end, &d, h[k].stage, h[k].micro) = end;
          else if (h[k].type == TR_PP_B || h[k].type == TR_PP_I)
            *at(d.b_end, &d, h[k].stage, h[k].micro) = end;
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
          say(err, errlen, "the schedule does not progress: rank %d waits at %s",
              r, tr_pp_action_str(&s->acts[r][pos[r]], name, sizeof name));
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
                       const double* const* times, tr_pp_idle_t* out,
                       char* err, size_t errlen) {
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
