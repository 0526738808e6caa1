/* pipelining/split.c: the model's blocks over the pipeline's stages, as
 * torchtitan splits them (pipeline_llm and generate_llm_fqn_per_model_part:
 * the embedding and the output each weigh a number of layers), and the
 * stages over the ranks ("loop" or "V" placement) (trainrun/pipelining.h). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipelining/internal.h"
#include "trainrun/error.h"
#include "trainrun/pipelining.h"

int tr_pp_kind_single_stage(tr_pp_kind_t k) {
  return k == TR_PP_GPIPE || k == TR_PP_1F1B;
}

int tr_pp_kind_v(tr_pp_kind_t k) {
  return k == TR_PP_ZBV || k == TR_PP_DUALPIPEV;
}

/* pipeline_llm: the number of stages per rank. */
static int stages_per_rank(int n_layers, int pp, tr_pp_kind_t kind,
                           int layers_per_stage, int first_less, int last_less,
                           char* err, size_t errlen) {
  int single = tr_pp_kind_single_stage(kind);
  if (layers_per_stage <= 0) return single ? 1 : 2;
  int eff = n_layers + first_less + last_less;
  int n = (eff + layers_per_stage - 1) / layers_per_stage;
  if (n % pp != 0)
    return tr__pp_fail(
        err, errlen, TR_ECONFIG,
        "pipeline_parallel_layers_per_stage: %d layers (+ %d + %d for "
        "the embedding and the output) at %d per stage make %d "
        "stages, not a multiple of pipeline_parallel_degree %d",
        n_layers, first_less, last_less, layers_per_stage, n, pp);
  int v = n / pp;
  if (single && v != 1)
    return tr__pp_fail(
        err, errlen, TR_ECONFIG,
        "pipeline_parallel_layers_per_stage: schedule %s runs one "
        "stage per rank, but %d layers at %d per stage make %d stages "
        "on %d ranks (%d per rank); use %d or more",
        tr_pp_kind_name(kind), n_layers, layers_per_stage, n, pp, v,
        n_layers / pp);
  if (!single && v < 2)
    return tr__pp_fail(
        err, errlen, TR_ECONFIG,
        "pipeline_parallel_layers_per_stage: schedule %s runs at "
        "least 2 stages per rank, but %d layers at %d per stage make "
        "%d stages on %d ranks; use a smaller value",
        tr_pp_kind_name(kind), n_layers, layers_per_stage, n, pp);
  return v;
}

int tr_pp_split_init(tr_pp_split_t* out, int n_layers, int pp,
                     tr_pp_kind_t kind, int layers_per_stage, int first_less,
                     int last_less, char* err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (n_layers < 1 || pp < 1)
    return tr__pp_fail(
        err, errlen, TR_ECONFIG,
        "pipeline split: %d layers over pipeline_parallel_degree %d", n_layers,
        pp);
  if (first_less < 0 || last_less < 0)
    return tr__pp_fail(
        err, errlen, TR_ECONFIG,
        "pipeline_parallel_first_stage_less_layers (%d) and "
        "pipeline_parallel_last_stage_less_layers (%d) must be >= 0",
        first_less, last_less);
  int v = stages_per_rank(n_layers, pp, kind, layers_per_stage, first_less,
                          last_less, err, errlen);
  if (v < 0) return v;
  int V = tr_pp_kind_v(kind);
  if (V && v != 2)
    return tr__pp_fail(err, errlen, TR_ECONFIG,
                       "schedule %s places 2 stages per rank (the V), not %d",
                       tr_pp_kind_name(kind), v);
  int n = pp * v;
  int eff = n_layers + first_less + last_less;
  int per = n > 1 ? eff / n : 0, extra = n > 1 ? eff % n : 0;
  if (n > 1) {
    if (n > eff)
      return tr__pp_fail(
          err, errlen, TR_ECONFIG,
          "pipeline split: %d stages (pipeline_parallel_degree %d x "
          "%d per rank) but only %d effective layers (%d layers + "
          "first_stage_less_layers %d + last_stage_less_layers %d)",
          n, pp, v, eff, n_layers, first_less, last_less);
    if (first_less > per)
      return tr__pp_fail(
          err, errlen, TR_ECONFIG,
          "pipeline_parallel_first_stage_less_layers (%d) exceeds "
          "the fewest layers of a stage (%d: %d effective layers "
          "over %d stages)",
          first_less, per, eff, n);
    if (last_less > per)
      return tr__pp_fail(
          err, errlen, TR_ECONFIG,
          "pipeline_parallel_last_stage_less_layers (%d) exceeds "
          "the fewest layers of a stage (%d: %d effective layers "
          "over %d stages)",
          last_less, per, eff, n);
  }
  out->blocks = calloc((size_t)n, sizeof *out->blocks);
  out->stage_rank = calloc((size_t)n, sizeof *out->stage_rank);
  if (!out->blocks || !out->stage_rank) {
    tr_pp_split_release(out);
    return TR_ENOMEM;
  }
  out->pp = pp;
  out->v = v;
  out->n_stages = n;
  out->placement = V ? TR_PP_PLACE_V : TR_PP_PLACE_LOOP;
  /* block 0 the embedding, 1..n_layers the layers, n_layers+1 the head */
  if (n == 1) {
    out->blocks[0].first = 0;
    out->blocks[0].last = n_layers + 2;
  } else {
    int next = 1; /* the next layer's block */
    for (int s = 0; s < n; s++) {
      int e = per + (s < extra);
      int layers = s == 0 ? e - first_less : s == n - 1 ? e - last_less : e;
      out->blocks[s].first = s == 0 ? 0 : next;
      next += layers;
      out->blocks[s].last = s == n - 1 ? n_layers + 2 : next;
    }
  }
  for (int s = 0; s < n; s++)
    out->stage_rank[s] = tr_pp_stage_rank(s, pp, out->placement);
  return 0;
}

void tr_pp_split_release(tr_pp_split_t* sp) {
  free(sp->blocks);
  free(sp->stage_rank);
  memset(sp, 0, sizeof *sp);
}

int tr_pp_stage_rank(int stage, int pp, tr_pp_placement_t placement) {
  if (placement == TR_PP_PLACE_LOOP) return stage % pp;
  /* V: 0 .. pp-1 then pp-1 .. 0, alternating per group of pp stages */
  int g = stage / pp, i = stage % pp;
  return g % 2 == 0 ? i : pp - 1 - i;
}

int tr_pp_split_rank_stages(const tr_pp_split_t* sp, int rank, int* out) {
  if (rank < 0 || rank >= sp->pp) return TR_EINVAL;
  int k = 0;
  for (int s = 0; s < sp->n_stages; s++)
    if (sp->stage_rank[s] == rank) out[k++] = s;
  return k;
}
