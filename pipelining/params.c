/* pipelining/params.c: the model's parameters over the pipeline's ranks —
 * which rank's stages use a parameter, which rank counts it once (norms,
 * clipping), and the gradient of a table tied between the end stages summed
 * between their ranks (trainrun/pipelining.h). */
#include "config.h"

#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

int tr_pp_param_used(const tr_model_t* m, const tr_pp_split_t* sp, int rank,
                     int idx) {
  for (int s = 0; s < sp->n_stages; s++)
    if (sp->stage_rank[s] == rank &&
        tr_model_param_in_blocks(m, idx, sp->blocks[s].first,
                                 sp->blocks[s].last))
      return 1;
  return 0;
}

int tr_pp_param_counted(const tr_model_t* m, const tr_pp_split_t* sp, int rank,
                        int idx) {
  for (int s = 0; s < sp->n_stages; s++)
    if (tr_model_param_in_blocks(m, idx, sp->blocks[s].first,
                                 sp->blocks[s].last))
      return sp->stage_rank[s] == rank;
  return 0;
}

int tr_pp_sum_tied_grads(tr_model_t* m, const tr_pp_split_t* sp, tr_pg_t* pg,
                         int rank) {
  int last = sp->n_stages - 1;
  int r0 = sp->stage_rank[0], r1 = sp->stage_rank[last];
  if (r0 == r1) return 0; /* one rank holds both ends: one tensor */
  const tr_pp_range_t* b0 = &sp->blocks[0];
  const tr_pp_range_t* b1 = &sp->blocks[last];
  for (int i = 0; i < m->n_params; i++) {
    if (!tr_model_param_in_blocks(m, i, b0->first, b0->last) ||
        !tr_model_param_in_blocks(m, i, b1->first, b1->last))
      continue;
    tr_param_t* p = &m->params[i];
    if (rank == r0 || rank == r1) {
      TR_CHECK(tr_pg_all_reduce(pg, &p->grad, TR_PG_SUM, NULL));
      continue;
    }
    /* a rank between the ends joins with zeros */
    tr_tensor_t z = {0};
    TR_CHECK(tr_tensor_zeros(&z, TR_F32, m->device, p->ndim, p->layout.shape));
    int rc = tr_pg_all_reduce(pg, &z, TR_PG_SUM, NULL);
    tr_tensor_release(&z);
    TR_CHECK(rc);
  }
  return 0;
}
