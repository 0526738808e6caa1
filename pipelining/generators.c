/* pipelining/generators.c: PyTorch's schedules as per-rank action lists —
 * GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble,
 * ZBVZeroBubble, DualPipeV — and its _add_reduce_grad
 * (trainrun/pipelining.h). The multi-stage lists follow PyTorch's
 * generators step for step, idle slots included; the single-stage ones are
 * their action orders laid out in lock step by the simulator. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pipelining/internal.h"
#include "trainrun/error.h"
#include "trainrun/pipelining.h"

static const char* const kind_names[] = {
    [TR_PP_GPIPE] = "GPipe",
    [TR_PP_1F1B] = "1F1B",
    [TR_PP_INTERLEAVED_1F1B] = "Interleaved1F1B",
    [TR_PP_LOOPED_BFS] = "LoopedBFS",
    [TR_PP_INTERLEAVED_ZB] = "InterleavedZeroBubble",
    [TR_PP_ZBV] = "ZBVZeroBubble",
    [TR_PP_DUALPIPEV] = "DualPipeV"};
enum { NKINDS = sizeof kind_names / sizeof kind_names[0] };

const char* tr_pp_kind_name(tr_pp_kind_t k) {
  return (unsigned)k < NKINDS ? kind_names[k] : "?";
}

int tr_pp_kind_parse(const char* name, tr_pp_kind_t* out) {
  for (int k = 0; name && k < (int)NKINDS; k++)
    if (strcasecmp(name, kind_names[k]) == 0) {
      *out = (tr_pp_kind_t)k;
      return 0;
    }
  return TR_ENOTFOUND;
}

static tr_pp_action_t act(int stage, tr_pp_type_t t, int64_t micro) {
  return (tr_pp_action_t){.stage = stage, .type = t, .micro = micro};
}

static const tr_pp_action_t idle = {
    .stage = 0, .type = TR_PP_NONE, .micro = -1};

static int push_idle(tr_pp_schedule_t* s, int r, int64_t n) {
  for (int64_t i = 0; i < n; i++) TR_CHECK(tr_pp_schedule_push(s, r, idle));
  return 0;
}

/* GPipe's order on rank r: every forward, then every backward. */
static int gpipe_order(tr_pp_schedule_t* s, int r, int64_t m) {
  for (int64_t i = 0; i < m; i++)
    TR_CHECK(tr_pp_schedule_push(s, r, act(r, TR_PP_F, i)));
  for (int64_t i = 0; i < m; i++)
    TR_CHECK(tr_pp_schedule_push(s, r, act(r, TR_PP_B, i)));
  return 0;
}

/* 1F1B's order on rank r of pp: pp - r forwards of warm-up, then backward /
 * forward pairs, then the remaining backwards. */
static int one_f_one_b_order(tr_pp_schedule_t* s, int r, int pp, int64_t m) {
  int64_t warm = pp - r < m ? pp - r : m, f = 0, b = 0;
  while (f < warm) TR_CHECK(tr_pp_schedule_push(s, r, act(r, TR_PP_F, f++)));
  while (f < m) {
    TR_CHECK(tr_pp_schedule_push(s, r, act(r, TR_PP_B, b++)));
    TR_CHECK(tr_pp_schedule_push(s, r, act(r, TR_PP_F, f++)));
  }
  while (b < m) TR_CHECK(tr_pp_schedule_push(s, r, act(r, TR_PP_B, b++)));
  return 0;
}

/* The interleaved lists of rank r (PyTorch's _calculate_single_rank_
 * operations and _get_1f1b_rank_ops). Interleaved1F1B: r idle slots, a
 * warm-up of forwards over the rank's stages round by round, idle slots
 * until the first backward can come back, forward / backward pairs, and a
 * cool-down of idle / backward pairs. InterleavedZeroBubble (zb): a
 * warm-up shorter by one forward per hop, p - r - 1 idle slots, backwards
 * split into I and W, the W running r micro-batches behind the I, the
 * rest of them at the end. */
static int interleaved_list(tr_pp_schedule_t* s, int r, int pp, int64_t m,
                            int v, int zb) {
  int64_t rounds = m / pp > 1 ? m / pp : 1, per_round = m / rounds;
  int64_t warm = (int64_t)(v - 1) * per_round + (zb ? 1 : 2) * (pp - 1 - r);
  if (warm > m * v) warm = m * v;
  int64_t fwd_bwd = m * v - warm, total = warm + fwd_bwd + warm;
  int64_t post_warm =
      zb ? pp - r - 1 : ((int64_t)v * pp + 2 * (pp - 1 - r)) - (warm + r);
  int64_t* fmb = calloc((size_t)v, sizeof *fmb);
  int64_t* bmb = calloc((size_t)v, sizeof *bmb);
  int64_t* wmb = calloc((size_t)v, sizeof *wmb);
  int* bwd_local = malloc((size_t)(total + 1) * sizeof *bwd_local);
  int64_t n_bwd = 0, n_w = 0;
  int rc = 0;
  if (!fmb || !bmb || !wmb || !bwd_local) {
    rc = TR_ENOMEM;
    goto out;
  }
  TR_CHECK_GOTO(push_idle(s, r, r), rc, out);
  for (int64_t op = 0; op < total; op++) {
    int fl = (int)((op / per_round) % v);
    if (op < warm + fwd_bwd)
      TR_CHECK_GOTO(
          tr_pp_schedule_push(s, r, act(fl * pp + r, TR_PP_F, fmb[fl]++)), rc,
          out);
    if (op == warm - 1) TR_CHECK_GOTO(push_idle(s, r, post_warm), rc, out);
    if (op < warm) continue;
    if (op >= warm + fwd_bwd && !zb) TR_CHECK_GOTO(push_idle(s, r, 1), rc, out);
    int bl = v - 1 - (int)(((op - warm) / per_round) % v);
    TR_CHECK_GOTO(
        tr_pp_schedule_push(
            s, r, act(bl * pp + r, zb ? TR_PP_I : TR_PP_B, bmb[bl]++)),
        rc, out);
    bwd_local[n_bwd++] = bl;
    if (zb && op - warm >= r) {
      int wl = bwd_local[n_w++];
      TR_CHECK_GOTO(
          tr_pp_schedule_push(s, r, act(wl * pp + r, TR_PP_W, wmb[wl]++)), rc,
          out);
    }
  }
  while (zb && n_w < n_bwd) {
    int wl = bwd_local[n_w++];
    TR_CHECK_GOTO(
        tr_pp_schedule_push(s, r, act(wl * pp + r, TR_PP_W, wmb[wl]++)), rc,
        out);
  }
out:
  free(fmb);
  free(bmb);
  free(wmb);
  free(bwd_local);
  return rc;
}

/* PyTorch's _add_bubbles_to_actions for InterleavedZeroBubble: in lock
 * step over the ranks, a forward of stage s > 0 whose micro-batch stage
 * s - 1 has not forwarded in an earlier step waits an idle slot. */
static int add_bubbles(const tr_pp_schedule_t* in, int n_stages, int64_t m,
                       tr_pp_schedule_t* out) {
  int rc = tr_pp_schedule_init(out, in->n_ranks);
  if (rc < 0) return rc;
  int64_t cells = (int64_t)n_stages * m;
  int64_t* f_at = malloc((size_t)cells * sizeof *f_at);
  int64_t* pos = calloc((size_t)in->n_ranks, sizeof *pos);
  if (!f_at || !pos) {
    rc = TR_ENOMEM;
    goto out;
  }
  for (int64_t i = 0; i < cells; i++) f_at[i] = -1;
  for (int64_t t = 0;; t++) {
    int left = 0;
    for (int r = 0; r < in->n_ranks; r++) {
      if (pos[r] >= in->len[r]) continue;
      left = 1;
      const tr_pp_action_t* a = &in->acts[r][pos[r]];
      if (a->type == TR_PP_F && a->stage > 0) {
        int64_t done = f_at[(int64_t)(a->stage - 1) * m + a->micro];
        if (done < 0 || done >= t) {
          TR_CHECK_GOTO(tr_pp_schedule_push(out, r, idle), rc, out);
          continue;
        }
      }
      if (a->type == TR_PP_F) f_at[(int64_t)a->stage * m + a->micro] = t;
      TR_CHECK_GOTO(tr_pp_schedule_push(out, r, *a), rc, out);
      pos[r]++;
    }
    if (!left) break;
  }
out:
  free(f_at);
  free(pos);
  if (rc < 0) tr_pp_schedule_release(out);
  return rc;
}

/* ZBVZeroBubble's list of rank r (PyTorch's ScheduleZBVZeroBubble): the
 * rank's stages r and 2pp - 1 - r (the V), over max(2pp - 1, m)
 * micro-batches — a warm-up of forwards down the V and F I W of its
 * bottom, a steady phase of F I W on both stages, a cool-down of I's and
 * the W's left — the micro-batches past m then idle slots. */
static int zbv_list(tr_pp_schedule_t* s, int r, int pp, int64_t m) {
  int64_t n = 2 * (int64_t)pp - 1 > m ? 2 * (int64_t)pp - 1 : m;
  int c0 = r, c1 = 2 * pp - 1 - r;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  int64_t base = s->len[r];
#define ZBV_PUSH(stage, type, micro) \
  TR_CHECK(tr_pp_schedule_push(s, r, act((stage), (type), (micro))))
  TR_CHECK(push_idle(s, r, r));
  for (int i = 0; i < 2 * (pp - r) - 1; i++) ZBV_PUSH(c0, TR_PP_F, f0++);
  for (int i = 0; i < r; i++) {
    ZBV_PUSH(c1, TR_PP_F, f1++);
    ZBV_PUSH(c0, TR_PP_F, f0++);
  }
  for (int i = 0; i < pp - r; i++) {
    ZBV_PUSH(c1, TR_PP_F, f1++);
    ZBV_PUSH(c1, TR_PP_I, b1);
    ZBV_PUSH(c1, TR_PP_W, b1++);
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) ZBV_PUSH(c0, TR_PP_F, f0++);
    ZBV_PUSH(c0, TR_PP_I, b0);
    ZBV_PUSH(c0, TR_PP_W, b0++);
    ZBV_PUSH(c1, TR_PP_F, f1++);
    ZBV_PUSH(c1, TR_PP_I, b1);
    ZBV_PUSH(c1, TR_PP_W, b1++);
  }
  int64_t w0 = b0, w1 = b1;
  for (int i = 0; i < r; i++) {
    ZBV_PUSH(c0, TR_PP_I, b0++);
    ZBV_PUSH(c1, TR_PP_I, b1++);
  }
  for (int i = 0; i < pp - r; i++) {
    ZBV_PUSH(c0, TR_PP_I, b0++);
    ZBV_PUSH(c0, TR_PP_W, w0++);
  }
  while (w1 < b1) ZBV_PUSH(c1, TR_PP_W, w1++);
  while (w0 < b0) ZBV_PUSH(c0, TR_PP_W, w0++);
#undef ZBV_PUSH
  for (int64_t i = base; i < s->len[r]; i++)
    if (s->acts[r][i].type != TR_PP_NONE && s->acts[r][i].micro >= m)
      s->acts[r][i] = idle;
  return 0;
}

/* LoopedBFS's list of rank r: r idle slots, every micro-batch's forward
 * of each stage in turn, 2 idle slots per hop to the last rank, then the
 * backwards in reverse (last stage first, last micro-batch first). */
static int looped_bfs_list(tr_pp_schedule_t* s, int r, int pp, int64_t m,
                           int v) {
  TR_CHECK(push_idle(s, r, r));
  for (int l = 0; l < v; l++)
    for (int64_t i = 0; i < m; i++)
      TR_CHECK(tr_pp_schedule_push(s, r, act(l * pp + r, TR_PP_F, i)));
  TR_CHECK(push_idle(s, r, 2 * (int64_t)(pp - 1 - r)));
  for (int l = v - 1; l >= 0; l--)
    for (int64_t i = m - 1; i >= 0; i--)
      TR_CHECK(tr_pp_schedule_push(s, r, act(l * pp + r, TR_PP_B, i)));
  return 0;
}

/* DualPipeV's list of rank r (PyTorch's ScheduleDualPipeV, after
 * DeepSeek's DualPipe): on the rank's two stages of the V, c[0] = r and
 * c[1] = 2pp - 1 - r, eight phases — forwards of c[0]; F of both; I W F
 * of c[1]; OVERLAP_F_B pairs (F of one stage with B of the other); B of
 * c[1] with OVERLAP_F_B; B of both, the second half as I; W then B (or I)
 * of c[0]; the W's left. A W is the oldest I without one. */
typedef struct {
  tr_pp_schedule_t* s;
  int r;
  int c[2];
  int64_t f[2], i[2]; /* next F, next B or I, per chunk */
  int* wq_chunk;      /* I's still without their W, oldest first */
  int64_t* wq_micro;
  int64_t wq_head, wq_tail;
} dpv_t;

static int dpv_one(dpv_t* d, int chunk, tr_pp_type_t t) {
  int64_t micro = t == TR_PP_F ? d->f[chunk]++ : d->i[chunk]++;
  if (t == TR_PP_I) {
    d->wq_chunk[d->wq_tail] = chunk;
    d->wq_micro[d->wq_tail++] = micro;
  }
  return tr_pp_schedule_push(d->s, d->r, act(d->c[chunk], t, micro));
}

static int dpv_w(dpv_t* d) {
  if (d->wq_head == d->wq_tail) return 0;
  int chunk = d->wq_chunk[d->wq_head];
  int64_t micro = d->wq_micro[d->wq_head++];
  return tr_pp_schedule_push(d->s, d->r, act(d->c[chunk], TR_PP_W, micro));
}

/* F of chunk fc overlapped with B of the other */
static int dpv_overlap(dpv_t* d, int fc) {
  int bc = 1 - fc;
  tr_pp_action_t a = {.stage = -1, .type = TR_PP_OVERLAP_F_B, .micro = -1};
  a.sub[0] = (struct tr_pp_sub){d->c[fc], TR_PP_F, d->f[fc]++};
  a.sub[1] = (struct tr_pp_sub){d->c[bc], TR_PP_B, d->i[bc]++};
  return tr_pp_schedule_push(d->s, d->r, a);
}

static int dualpipev_list(tr_pp_schedule_t* s, int r, int pp, int64_t m) {
  dpv_t d = {.s = s, .r = r, .c = {r, 2 * pp - 1 - r}};
  d.wq_chunk = malloc((size_t)(2 * m + 1) * sizeof *d.wq_chunk);
  d.wq_micro = malloc((size_t)(2 * m + 1) * sizeof *d.wq_micro);
  int rc = 0;
  if (!d.wq_chunk || !d.wq_micro) {
    rc = TR_ENOMEM;
    goto out;
  }
  for (int64_t k = 0; k < 2 * (int64_t)(pp - r - 1); k++)
    TR_CHECK_GOTO(dpv_one(&d, 0, TR_PP_F), rc, out);
  for (int k = 0; k < r + 1; k++) {
    TR_CHECK_GOTO(dpv_one(&d, 0, TR_PP_F), rc, out);
    TR_CHECK_GOTO(dpv_one(&d, 1, TR_PP_F), rc, out);
  }
  for (int k = 0; k < pp - r - 1; k++) {
    TR_CHECK_GOTO(dpv_one(&d, 1, TR_PP_I), rc, out);
    TR_CHECK_GOTO(dpv_w(&d), rc, out);
    TR_CHECK_GOTO(dpv_one(&d, 1, TR_PP_F), rc, out);
  }
  for (int64_t k = 0; k < m - 2 * (int64_t)pp + r + 1; k++) {
    if (k == 0 && r == pp - 1) { /* not overlapped: a smaller bubble */
      TR_CHECK_GOTO(dpv_one(&d, 0, TR_PP_F), rc, out);
      TR_CHECK_GOTO(dpv_one(&d, 1, TR_PP_B), rc, out);
    } else {
      TR_CHECK_GOTO(dpv_overlap(&d, 0), rc, out);
    }
    TR_CHECK_GOTO(dpv_overlap(&d, 1), rc, out);
  }
  for (int k = 0; k < pp - r - 1; k++) {
    TR_CHECK_GOTO(dpv_one(&d, 1, TR_PP_B), rc, out);
    TR_CHECK_GOTO(dpv_overlap(&d, 1), rc, out);
  }
  int zb = 0, n6 = r + 1;
  for (int k = 0; k < n6; k++) {
    if (k == n6 / 2 && r % 2 == 1) zb = 1;
    TR_CHECK_GOTO(dpv_one(&d, 1, zb ? TR_PP_I : TR_PP_B), rc, out);
    if (k == n6 / 2 && r % 2 == 0) zb = 1;
    TR_CHECK_GOTO(dpv_one(&d, 0, zb ? TR_PP_I : TR_PP_B), rc, out);
  }
  for (int k = 0; k < pp - r - 1; k++) {
    TR_CHECK_GOTO(dpv_w(&d), rc, out);
    TR_CHECK_GOTO(dpv_one(&d, 0, zb ? TR_PP_I : TR_PP_B), rc, out);
  }
  for (int k = 0; k < r + 1; k++) TR_CHECK_GOTO(dpv_w(&d), rc, out);
out:
  free(d.wq_chunk);
  free(d.wq_micro);
  return rc;
}

int tr_pp_generate(tr_pp_schedule_t* out, tr_pp_kind_t k, int pp,
                   int64_t n_micro, int v, char* err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if ((unsigned)k >= NKINDS)
    return tr__pp_fail(err, errlen, TR_EINVAL, "unknown schedule");
  const char* name = kind_names[k];
  if (pp < 1 || n_micro < 1 || v < 1)
    return tr__pp_fail(
        err, errlen, TR_EINVAL,
        "%s needs at least 1 rank, 1 micro-batch and 1 stage per "
        "rank (pp %d, %lld micro-batches, %d stages per rank)",
        name, pp, (long long)n_micro, v);
  int single = k == TR_PP_GPIPE || k == TR_PP_1F1B;
  if (single && v != 1)
    return tr__pp_fail(err, errlen, TR_EINVAL,
                       "%s runs 1 stage per rank, not %d", name, v);
  if ((k == TR_PP_ZBV || k == TR_PP_DUALPIPEV) && v != 2)
    return tr__pp_fail(err, errlen, TR_EINVAL,
                       "ZBV requires exactly 2 stages per rank, but got %d.",
                       v);
  if (k == TR_PP_1F1B && n_micro < pp)
    return tr__pp_fail(
        err, errlen, TR_EINVAL,
        "Number of microbatches (%lld) must be greater than or equal "
        "to the number of stages (%d).",
        (long long)n_micro, pp);
  if (k == TR_PP_DUALPIPEV && n_micro < 2 * (int64_t)pp)
    return tr__pp_fail(
        err, errlen, TR_EINVAL,
        "DualPipeV requires at least as many microbatches as stages, "
        "but got %lld microbatches and %d stages.",
        (long long)n_micro, 2 * pp);
  if (k == TR_PP_INTERLEAVED_1F1B || k == TR_PP_INTERLEAVED_ZB) {
    int64_t rounds = n_micro / pp > 1 ? n_micro / pp : 1;
    if (n_micro % rounds != 0)
      return tr__pp_fail(
          err, errlen, TR_EINVAL,
          "%s requires the number of microbatches to be a multiple "
          "of the number of rounds (%lld), but got %lld.",
          k == TR_PP_INTERLEAVED_ZB ? "Zero bubble" : "Interleaved 1F1B",
          (long long)rounds, (long long)n_micro);
  }
  tr_pp_schedule_t order;
  int rc;
  TR_CHECK(tr_pp_schedule_init(&order, pp));
  for (int r = 0; r < pp; r++) {
    switch (k) {
      case TR_PP_GPIPE:
        rc = gpipe_order(&order, r, n_micro);
        break;
      case TR_PP_1F1B:
        rc = one_f_one_b_order(&order, r, pp, n_micro);
        break;
      case TR_PP_INTERLEAVED_1F1B:
      case TR_PP_INTERLEAVED_ZB:
        rc = interleaved_list(&order, r, pp, n_micro, v,
                              k == TR_PP_INTERLEAVED_ZB);
        break;
      case TR_PP_ZBV:
        rc = zbv_list(&order, r, pp, n_micro);
        break;
      case TR_PP_DUALPIPEV:
        rc = dualpipev_list(&order, r, pp, n_micro);
        break;
      default:
        rc = looped_bfs_list(&order, r, pp, n_micro, v);
        break;
    }
    if (rc < 0) goto fail;
  }
  if (k == TR_PP_INTERLEAVED_ZB) {
    rc = add_bubbles(&order, pp * v, n_micro, out);
    tr_pp_schedule_release(&order);
    return rc;
  }
  if (!single) {
    *out = order;
    return 0;
  }
  /* the single-stage orders in lock step: the simulator's timeline */
  tr_pp_sim_t sim;
  rc = tr_pp_simulate(&order, pp, &sim, out, err, errlen);
  if (rc < 0) goto fail;
  tr_pp_sim_release(&sim);
  tr_pp_schedule_release(&order);
  return 0;
fail:
  tr_pp_schedule_release(&order);
  return rc;
}

static int reduces_grad(tr_pp_type_t t) { return t == TR_PP_B || t == TR_PP_W; }

int tr_pp_add_reduce_grad(const tr_pp_action_t* in, int64_t n, int64_t n_micro,
                          tr_pp_action_t* out, int64_t* n_out) {
  int max_stage = -1;
  for (int64_t i = 0; i < n; i++) {
    const tr_pp_action_t* a = &in[i];
    if (a->type == TR_PP_NONE) continue;
    int st = a->type == TR_PP_OVERLAP_F_B ? a->sub[1].stage : a->stage;
    if (st < 0 || (a->type == TR_PP_OVERLAP_F_B && a->sub[0].stage < 0))
      return TR_EINVAL;
    if (st > max_stage) max_stage = st;
  }
  int64_t* count = calloc((size_t)max_stage + 1, sizeof *count);
  if (!count) return TR_ENOMEM;
  int64_t o = 0;
  for (int64_t i = 0; i < n; i++) {
    const tr_pp_action_t* a = &in[i];
    if (a->type == TR_PP_NONE) continue;
    out[o++] = *a;
    /* an OVERLAP_F_B's backward is its second half */
    int st = a->type == TR_PP_OVERLAP_F_B ? a->sub[1].stage : a->stage;
    tr_pp_type_t t = a->type == TR_PP_OVERLAP_F_B ? a->sub[1].type : a->type;
    if (reduces_grad(t) && ++count[st] == n_micro)
      out[o++] = act(st, TR_PP_REDUCE_GRAD, -1);
  }
  free(count);
  *n_out = o;
  return 0;
}
