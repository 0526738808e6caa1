/* pipelining/build.c: a pipeline's whole set-up from the job's settings —
 * the stage split, every rank's compute-only schedule (generated, or read
 * from PyTorch's CSV), and its lowering — the same on every rank
 * (trainrun/pipelining.h). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipelining/internal.h"
#include "trainrun/error.h"
#include "trainrun/pipelining.h"

/* The compute-only schedule of a CSV file: checked for its format, its
 * rank count and the split's stages and placement. */
static int from_csv(tr_pp_build_t* b, const tr_pp_build_opts_t* o, char* err,
                    size_t errlen) {
  int rc = tr_pp_csv_load(o->schedule_csv, &b->compute, err, errlen);
  if (rc < 0) return rc;
  rc = tr_pp_schedule_check_format(&b->compute, TR_PP_COMPUTE_ONLY,
                                   o->schedule_csv, err, errlen);
  if (rc < 0) return rc;
  if (b->compute.n_ranks != o->pp)
    return tr__pp_fail(
        err, errlen, TR_ECONFIG,
        "%s: %d rows (ranks), but pipeline_parallel_degree is %d",
        o->schedule_csv, b->compute.n_ranks, o->pp);
  int n = b->split.n_stages;
  int* map = malloc((size_t)n * sizeof *map);
  if (!map) return TR_ENOMEM;
  char verr[4096];
  rc = tr_pp_validate(&b->compute, o->pp, n, o->n_micro, map, verr,
                      sizeof verr);
  if (rc < 0)
    rc = tr__pp_fail(err, errlen, TR_ECONFIG,
                     "%s: %s (the split makes %d stages)", o->schedule_csv,
                     verr, n);
  for (int s = 0; s < n && rc == 0; s++)
    if (map[s] != b->split.stage_rank[s])
      rc = tr__pp_fail(
          err, errlen, TR_ECONFIG,
          "%s: stage %d runs on rank %d, but schedule %s places it on "
          "rank %d",
          o->schedule_csv, s, map[s], tr_pp_kind_name(o->kind),
          b->split.stage_rank[s]);
  free(map);
  return rc;
}

int tr_pp_build_init(tr_pp_build_t* b, const tr_pp_build_opts_t* o, char* err,
                     size_t errlen) {
  memset(b, 0, sizeof *b);
  if (o->n_micro < 1)
    return tr__pp_fail(err, errlen, TR_ECONFIG, "%lld micro-batches",
                       (long long)o->n_micro);
  int rc = tr_pp_split_init(&b->split, o->n_layers, o->pp, o->kind,
                            o->layers_per_stage, o->first_less, o->last_less,
                            err, errlen);
  if (rc < 0) return rc;
  b->n_micro = o->n_micro;
  if (o->schedule_csv && *o->schedule_csv) {
    rc = from_csv(b, o, err, errlen);
  } else {
    rc = tr_pp_generate(&b->compute, o->kind, o->pp, o->n_micro, b->split.v,
                        err, errlen);
    if (rc < 0) rc = TR_ECONFIG;
  }
  if (rc == 0)
    rc = tr_pp_lower(&b->compute, o->pp, b->split.n_stages, o->n_micro,
                     o->unshard_reshard, &b->lowered, NULL, err, errlen);
  if (rc < 0) tr_pp_build_release(b);
  return rc;
}

void tr_pp_build_release(tr_pp_build_t* b) {
  tr_pp_split_release(&b->split);
  tr_pp_schedule_release(&b->compute);
  tr_pp_schedule_release(&b->lowered);
  memset(b, 0, sizeof *b);
}

int tr_pp_build_eval(const tr_pp_build_t* b, int64_t n_micro,
                     tr_pp_schedule_t* out, char* err, size_t errlen) {
  const tr_pp_split_t* sp = &b->split;
  memset(out, 0, sizeof *out);
  if (n_micro < 1)
    return tr__pp_fail(err, errlen, TR_EINVAL, "%lld micro-batches",
                       (long long)n_micro);
  tr_pp_schedule_t fwd;
  int rc = tr_pp_schedule_init(&fwd, sp->pp);
  for (int s = 0; s < sp->n_stages && rc == 0; s++)
    for (int64_t i = 0; i < n_micro && rc == 0; i++) {
      tr_pp_action_t a = {.stage = s, .type = TR_PP_F, .micro = i};
      rc = tr_pp_schedule_push(&fwd, sp->stage_rank[s], a);
    }
  if (rc == 0)
    rc = tr_pp_add_send_recv(&fwd, sp->stage_rank, sp->n_stages, n_micro, out,
                             err, errlen);
  tr_pp_schedule_release(&fwd);
  return rc;
}

void tr_pp_build_exec(const tr_pp_build_t* b, tr_pp_exec_t* x) {
  x->n_micro = b->n_micro;
  x->n_stages = b->split.n_stages;
  x->stage_blocks = b->split.blocks;
  x->stage_rank = b->split.stage_rank;
}
