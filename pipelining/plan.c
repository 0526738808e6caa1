/* pipelining/plan.c: a schedule of every pipeline rank (PyTorch's
 * pipeline_order) — per-rank action lists that grow, and their Step × Rank
 * grid (PyTorch's _format_pipeline_order) (trainrun/pipelining.h). */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

int tr_pp_schedule_init(tr_pp_schedule_t* s, int n_ranks) {
  memset(s, 0, sizeof *s);
  if (n_ranks < 1) return TR_EINVAL;
  s->len = calloc((size_t)n_ranks, sizeof *s->len);
  s->cap = calloc((size_t)n_ranks, sizeof *s->cap);
  s->acts = calloc((size_t)n_ranks, sizeof *s->acts);
  s->n_ranks = n_ranks;
  if (!s->len || !s->cap || !s->acts) {
    tr_pp_schedule_release(s);
    return TR_ENOMEM;
  }
  return 0;
}

void tr_pp_schedule_release(tr_pp_schedule_t* s) {
  if (s->acts)
    for (int r = 0; r < s->n_ranks; r++) free(s->acts[r]);
  free(s->acts);
  free(s->len);
  free(s->cap);
  memset(s, 0, sizeof *s);
}

int tr_pp_schedule_push(tr_pp_schedule_t* s, int rank, tr_pp_action_t a) {
  if (rank < 0 || rank >= s->n_ranks) return TR_EINVAL;
  if (s->len[rank] == s->cap[rank]) {
    int64_t cap = s->cap[rank] ? 2 * s->cap[rank] : 32;
    tr_pp_action_t* p = realloc(s->acts[rank], (size_t)cap * sizeof *p);
    if (!p) return TR_ENOMEM;
    s->acts[rank] = p;
    s->cap[rank] = cap;
  }
  s->acts[rank][s->len[rank]++] = a;
  return 0;
}

int64_t tr_pp_schedule_steps(const tr_pp_schedule_t* s) {
  int64_t n = 0;
  for (int r = 0; r < s->n_ranks; r++)
    if (s->len[r] > n) n = s->len[r];
  return n;
}

/* A string that grows; a failed append leaves it NULL. */
typedef struct {
  char* p;
  size_t len, cap;
} sbuf_t;

static void sb_put(sbuf_t* b, const char* s, size_t n) {
  if (!b->p && b->cap) return; /* failed before */
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->len + n + 1 > cap) cap *= 2;
    char* q = realloc(b->p, cap);
    if (!q) {
      free(b->p);
      b->p = NULL;
      b->cap = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

/* s left-justified in a field of width w */
static void sb_pad(sbuf_t* b, const char* s, size_t w) {
  size_t n = strlen(s);
  sb_put(b, s, n);
  for (; n < w; n++) sb_put(b, " ", 1);
}

static const char* cell(const tr_pp_schedule_t* s, int r, int64_t t, char* buf,
                        size_t n) {
  if (t >= s->len[r]) return "";
  return tr_pp_action_str(&s->acts[r][t], buf, n);
}

char* tr_pp_schedule_format(const tr_pp_schedule_t* s, int64_t error_step) {
  int64_t steps = tr_pp_schedule_steps(s);
  /* "Step " and the last step's number's digits, zero-filled */
  int digits = snprintf(NULL, 0, "%" PRId64, steps > 0 ? steps - 1 : 0);
  size_t label_w = 5 + (size_t)digits;
  size_t* w = calloc((size_t)s->n_ranks, sizeof *w);
  if (!w) return NULL;
  char buf[TR_PP_ACTION_STRLEN];
  for (int r = 0; r < s->n_ranks; r++) {
    w[r] = label_w; /* PyTorch sizes column k with step label k too */
    for (int64_t t = 0; t < s->len[r]; t++) {
      size_t n = strlen(cell(s, r, t, buf, sizeof buf));
      if (n > w[r]) w[r] = n;
    }
  }
  sbuf_t b = {0};
  for (size_t i = 0; i < label_w + 2; i++) sb_put(&b, " ", 1);
  for (int r = 0; r < s->n_ranks; r++) {
    char label[24];
    snprintf(label, sizeof label, "Rank %d", r);
    if (r) sb_put(&b, " ", 1);
    sb_pad(&b, label, w[r]);
  }
  sb_put(&b, "\n", 1);
  for (int64_t t = 0; t < steps; t++) {
    char label[48];
    int n = snprintf(label, sizeof label, "Step %0*" PRId64 ": ", digits, t);
    sb_put(&b, label, (size_t)n);
    for (int r = 0; r < s->n_ranks; r++) {
      if (r) sb_put(&b, " ", 1);
      sb_pad(&b, cell(s, r, t, buf, sizeof buf), w[r]);
    }
    if (t == error_step) sb_put(&b, " <-- ERROR HERE", 15);
    sb_put(&b, "\n", 1);
  }
  free(w);
  if (!b.p) return NULL;
  return b.p;
}
