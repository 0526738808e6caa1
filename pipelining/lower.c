/* pipelining/lower.c: a compute-only schedule lowered into what each rank
 * runs (PyTorch's _prepare_schedule_with_comms): FSDP's UNSHARD / RESHARD
 * around the stages in use (_add_unshard_reshard), REDUCE_GRAD after a
 * stage's last backward (_add_reduce_grad), and the SEND / RECV pairs
 * between ranks (_add_send_recv); and the check of a loaded CSV's format
 * (trainrun/pipelining.h). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipelining/internal.h"
#include "trainrun/error.h"
#include "trainrun/pipelining.h"

static tr_pp_action_t mk(int stage, tr_pp_type_t t, int64_t micro) {
  tr_pp_action_t a = {.stage = stage, .type = t, .micro = micro};
  return a;
}

static int is_compute(tr_pp_type_t t) {
  return t == TR_PP_F || t == TR_PP_I || t == TR_PP_W || t == TR_PP_B ||
         t == TR_PP_OVERLAP_F_B;
}

/* ---- _add_unshard_reshard ---- */

/* next_stage_indices: the first `count` distinct stages computed from
 * list[i..] on (an OVERLAP_F_B adds both halves' stages, then stops when
 * there are count or more) into out; returns their number. */
static int next_stages(const tr_pp_action_t* list, int64_t i, int64_t n,
                       int count, int* out) {
  int k = 0;
  for (; i < n; i++) {
    const tr_pp_action_t* a = &list[i];
    if (a->type == TR_PP_NONE) continue;
    if (a->type == TR_PP_OVERLAP_F_B) {
      for (int h = 0; h < 2; h++) {
        int seen = 0;
        for (int j = 0; j < k; j++) seen |= out[j] == a->sub[h].stage;
        if (!seen) out[k++] = a->sub[h].stage;
      }
      if (k >= count) break;
    } else {
      int seen = 0;
      for (int j = 0; j < k; j++) seen |= out[j] == a->stage;
      if (!seen) {
        out[k++] = a->stage;
        if (k == count) break;
      }
    }
  }
  return k;
}

int tr_pp_add_unshard_reshard(const tr_pp_action_t* in, int64_t n,
                              int max_active, tr_pp_action_t** out,
                              int64_t* n_out) {
  *out = NULL;
  *n_out = 0;
  if (max_active < 1 || n < 0) return TR_EINVAL;
  int max_stage = 0;
  for (int64_t i = 0; i < n; i++) {
    int st = in[i].type == TR_PP_OVERLAP_F_B
                 ? (in[i].sub[0].stage > in[i].sub[1].stage ? in[i].sub[0].stage
                                                            : in[i].sub[1].stage)
                 : in[i].stage;
    if (in[i].type != TR_PP_NONE && st < 0) return TR_EINVAL;
    if (st > max_stage) max_stage = st;
  }
  /* each action, and per action at most max_active + 1 unshards and as many
   * reshards, and the final reshards */
  size_t cap = (size_t)n * (size_t)(2 * max_active + 4) + (size_t)max_stage + 2;
  tr_pp_action_t* o = malloc(cap * sizeof *o);
  unsigned char* active = calloc((size_t)max_stage + 1, 1);
  int* next = malloc(((size_t)max_active + 2) * sizeof *next);
  if (!o || !active || !next) {
    free(o);
    free(active);
    free(next);
    return TR_ENOMEM;
  }
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    if (in[i].type == TR_PP_NONE) continue;
    int nn = next_stages(in, i, n, max_active, next);
    /* evict what is not needed next (Python's set order: ascending for
     * the small stage indices of a pipeline), then fetch in order */
    for (int s = 0; s <= max_stage; s++) {
      if (!active[s]) continue;
      int needed = 0;
      for (int j = 0; j < nn; j++) needed |= next[j] == s;
      if (!needed) {
        active[s] = 0;
        o[k++] = mk(s, TR_PP_RESHARD, -1);
      }
    }
    for (int j = 0; j < nn; j++)
      if (!active[next[j]]) {
        active[next[j]] = 1;
        o[k++] = mk(next[j], TR_PP_UNSHARD, -1);
      }
    o[k++] = in[i];
  }
  for (int s = 0; s <= max_stage; s++)
    if (active[s]) o[k++] = mk(s, TR_PP_RESHARD, -1);
  free(active);
  free(next);
  *out = o;
  *n_out = k;
  return 0;
}

/* ---- _add_send_recv ---- */

/* Whether compute action a (not OVERLAP_F_B) sends to another rank. */
static int has_comms(const tr_pp_action_t* a, const int* stage_rank,
                     int n_stages) {
  if (a->type == TR_PP_F)
    return a->stage != n_stages - 1 &&
           stage_rank[a->stage + 1] != stage_rank[a->stage];
  if (a->type == TR_PP_I || a->type == TR_PP_B)
    return a->stage != 0 && stage_rank[a->stage - 1] != stage_rank[a->stage];
  return 0;
}

/* What a rank has done (PyTorch's prev_actions set), per stage and
 * micro-batch: bits of the types below. */
enum {
  DONE_F = 1,
  DONE_I = 2,
  DONE_B = 4,
  DONE_RECV_F = 8,
  DONE_RECV_B = 16
};

typedef struct {
  int n_stages;
  int64_t n_micro;
  unsigned char* bits; /* [rank][stage][micro] */
} done_t;

static unsigned char* done_at(done_t* d, int rank, int stage, int64_t micro) {
  return &d->bits[((size_t)rank * (size_t)d->n_stages + (size_t)stage) *
                      (size_t)d->n_micro +
                  (size_t)micro];
}

static int has(done_t* d, int rank, int stage, int64_t micro, int bit) {
  if (stage < 0 || stage >= d->n_stages || micro < 0 || micro >= d->n_micro)
    return 0;
  return (*done_at(d, rank, stage, micro) & bit) != 0;
}

/* _ready_to_schedule */
static int ready(done_t* d, int rank, const tr_pp_action_t* a) {
  if (a->type == TR_PP_F && a->stage != 0)
    return has(d, rank, a->stage, a->micro, DONE_RECV_F) ||
           has(d, rank, a->stage - 1, a->micro, DONE_F);
  if ((a->type == TR_PP_I || a->type == TR_PP_B) &&
      a->stage != d->n_stages - 1)
    return has(d, rank, a->stage, a->micro, DONE_RECV_B) ||
           has(d, rank, a->stage + 1, a->micro, DONE_I | DONE_B);
  return 1;
}

static void mark(done_t* d, int rank, const tr_pp_action_t* a) {
  int bit = a->type == TR_PP_F        ? DONE_F
            : a->type == TR_PP_I      ? DONE_I
            : a->type == TR_PP_B      ? DONE_B
            : a->type == TR_PP_RECV_F ? DONE_RECV_F
            : a->type == TR_PP_RECV_B ? DONE_RECV_B
                                      : 0;
  if (bit && a->stage >= 0 && a->stage < d->n_stages && a->micro >= 0 &&
      a->micro < d->n_micro)
    *done_at(d, rank, a->stage, a->micro) |= (unsigned char)bit;
}

int tr_pp_add_send_recv(const tr_pp_schedule_t* in, const int* stage_rank,
                        int n_stages, int64_t n_micro, tr_pp_schedule_t* out,
                        char* err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (n_stages < 1 || n_micro < 1 || !stage_rank) return TR_EINVAL;
  int R = in->n_ranks;
  for (int s = 0; s < n_stages; s++)
    if (stage_rank[s] < 0 || stage_rank[s] >= R)
      return tr__pp_fail(err, errlen, TR_EINVAL, "stage %d on rank %d of %d", s,
                         stage_rank[s], R);
  /* check the actions' ranges once */
  for (int r = 0; r < R; r++)
    for (int64_t i = 0; i < in->len[r]; i++) {
      const tr_pp_action_t* a = &in->acts[r][i];
      int nh = a->type == TR_PP_OVERLAP_F_B ? 2 : a->type == TR_PP_NONE ? 0 : 1;
      for (int h = 0; h < nh; h++) {
        int st = nh == 2 ? a->sub[h].stage : a->stage;
        int64_t mi = nh == 2 ? a->sub[h].micro : a->micro;
        tr_pp_type_t t = nh == 2 ? a->sub[h].type : a->type;
        char name[TR_PP_ACTION_STRLEN];
        if (st < 0 || st >= n_stages ||
            (mi >= n_micro || (mi < 0 && is_compute(t))))
          return tr__pp_fail(
              err, errlen, TR_EINVAL,
              "rank %d, action %lld: %s is outside %d stages or %lld "
              "micro-batches",
              r, (long long)i, tr_pp_action_str(a, name, sizeof name), n_stages,
              (long long)n_micro);
      }
    }
  done_t d = {n_stages, n_micro, NULL};
  d.bits = calloc((size_t)R * (size_t)n_stages * (size_t)n_micro, 1);
  int64_t* pos = calloc((size_t)R, sizeof *pos);
  int rc = d.bits && pos ? tr_pp_schedule_init(out, R) : TR_ENOMEM;
  for (int64_t step = 0; rc == 0; step++) {
    int left = 0, progress = 0;
    for (int r = 0; r < R && rc == 0; r++) {
      if (pos[r] >= in->len[r]) continue;
      left = 1;
      const tr_pp_action_t* a = &in->acts[r][pos[r]];
      const tr_pp_action_t* parts = a;
      tr_pp_action_t sub[2];
      int np = 1;
      if (a->type == TR_PP_OVERLAP_F_B) {
        for (int h = 0; h < 2; h++)
          sub[h] = mk(a->sub[h].stage, a->sub[h].type, a->sub[h].micro);
        parts = sub;
        np = 2;
      }
      int ok = 1;
      if (a->type != TR_PP_NONE)
        for (int h = 0; h < np; h++) ok &= ready(&d, r, &parts[h]);
      if (!ok) continue;
      if (a->type != TR_PP_NONE) {
        rc = tr_pp_schedule_push(out, r, *a);
        for (int h = 0; h < np && rc == 0; h++) {
          mark(&d, r, &parts[h]);
          if (!has_comms(&parts[h], stage_rank, n_stages)) continue;
          int fwd = parts[h].type == TR_PP_F;
          int to = fwd ? parts[h].stage + 1 : parts[h].stage - 1;
          rc = tr_pp_schedule_push(
              out, r,
              mk(parts[h].stage, fwd ? TR_PP_SEND_F : TR_PP_SEND_B,
                 parts[h].micro));
          tr_pp_action_t recv =
              mk(to, fwd ? TR_PP_RECV_F : TR_PP_RECV_B, parts[h].micro);
          if (rc == 0) rc = tr_pp_schedule_push(out, stage_rank[to], recv);
          mark(&d, stage_rank[to], &recv);
        }
      }
      pos[r]++;
      progress = 1;
    }
    if (rc < 0 || !left) break;
    if (!progress) {
      char msg[1024];
      size_t k = 0;
      msg[0] = 0;
      for (int r = 0; r < R; r++) {
        if (pos[r] >= in->len[r]) continue;
        char name[TR_PP_ACTION_STRLEN];
        k += (size_t)snprintf(
            msg + k, k < sizeof msg ? sizeof msg - k : 0, " rank %d waits at %s;",
            r, tr_pp_action_str(&in->acts[r][pos[r]], name, sizeof name));
        if (k >= sizeof msg) break;
      }
      rc = tr__pp_fail(
          err, errlen, TR_EINVAL,
          "malformed compute schedule, can't schedule sends/recvs:%s", msg);
    }
  }
  free(d.bits);
  free(pos);
  if (rc < 0) tr_pp_schedule_release(out);
  return rc;
}

/* ---- the whole lowering ---- */

int tr_pp_lower(const tr_pp_schedule_t* compute, int pp, int n_stages,
                int64_t n_micro, int unshard_reshard, tr_pp_schedule_t* out,
                int* stage_rank, char* err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (compute->n_ranks != pp)
    return tr__pp_fail(err, errlen, TR_EINVAL,
                       "schedule has incorrect number of ranks - expected %d, "
                       "actual %d",
                       pp, compute->n_ranks);
  int rc = tr_pp_schedule_check_format(compute, TR_PP_COMPUTE_ONLY, "schedule",
                                       err, errlen);
  if (rc < 0) return rc;
  int* map = malloc((size_t)n_stages * sizeof *map);
  if (!map) return TR_ENOMEM;
  rc = tr_pp_validate(compute, pp, n_stages, n_micro, map, err, errlen);
  tr_pp_schedule_t mid;
  memset(&mid, 0, sizeof mid);
  if (rc == 0) rc = tr_pp_schedule_init(&mid, pp);
  for (int r = 0; r < pp && rc == 0; r++) {
    tr_pp_action_t* a = NULL;
    int64_t na = 0;
    if (unshard_reshard) {
      rc = tr_pp_add_unshard_reshard(compute->acts[r], compute->len[r], 3, &a,
                                     &na);
    } else {
      a = malloc(((size_t)compute->len[r] + 1) * sizeof *a);
      rc = a ? 0 : TR_ENOMEM;
      if (rc == 0) memcpy(a, compute->acts[r], (size_t)compute->len[r] * sizeof *a);
      na = compute->len[r];
    }
    tr_pp_action_t* b = NULL;
    int64_t nb = 0;
    if (rc == 0) {
      b = malloc(((size_t)na + (size_t)n_stages + 1) * sizeof *b);
      rc = b ? tr_pp_add_reduce_grad(a, na, n_micro, b, &nb) : TR_ENOMEM;
    }
    for (int64_t i = 0; i < nb && rc == 0; i++)
      rc = tr_pp_schedule_push(&mid, r, b[i]);
    free(a);
    free(b);
  }
  if (rc == 0)
    rc = tr_pp_add_send_recv(&mid, map, n_stages, n_micro, out, err, errlen);
  if (rc == 0 && stage_rank) memcpy(stage_rank, map, (size_t)n_stages * sizeof *map);
  tr_pp_schedule_release(&mid);
  free(map);
  return rc;
}

int tr_pp_schedule_check_format(const tr_pp_schedule_t* s, tr_pp_format_t fmt,
                                const char* name, char* err, size_t errlen) {
  for (int r = 0; r < s->n_ranks; r++)
    for (int64_t i = 0; i < s->len[r]; i++) {
      const tr_pp_action_t* a = &s->acts[r][i];
      char txt[TR_PP_ACTION_STRLEN];
      if (fmt == TR_PP_COMPUTE_ONLY && a->type != TR_PP_NONE &&
          !is_compute(a->type))
        return tr__pp_fail(
            err, errlen, TR_EPARSE,
            "%s:%d: cell %lld: expected a compute-only schedule but "
            "found communication action '%s' at rank %d, position "
            "%lld",
            name, r + 1, (long long)i + 1, tr_pp_action_str(a, txt, sizeof txt),
            r, (long long)i);
      if (fmt == TR_PP_COMPUTE_COMMS && a->type == TR_PP_NONE)
        return tr__pp_fail(
            err, errlen, TR_EPARSE,
            "%s:%d: cell %lld: an idle slot at rank %d, position %lld: "
            "a compute_comms schedule lists only actions",
            name, r + 1, (long long)i + 1, r, (long long)i);
    }
  return 0;
}
