/* fsdp2/reduce.c: what every data-parallel layer (DDP, FSDP, HSDP) shares
 * for its scalars — the exact rank-ordered sum over a group
 * (trainrun/dp.h). */
#include "config.h"

#include <stdlib.h>

#include "trainrun/dp.h"
#include "trainrun/error.h"

int tr_dp_sum_over(tr_pg_t* pg, double* vals, int n) {
  if (!pg || n <= 0) return 0;
  int size = tr_pg_size(pg);
  if (size <= 1) return 0;
  int64_t len = (int64_t)n * (int64_t)sizeof(double);
  int64_t all_len = len * size;
  double* all = malloc((size_t)all_len);
  if (!all) return TR_ENOMEM;
  tr_tensor_t in = {0}, out = {0};
  /* bytes, so every backend moves them unchanged */
  int rc = tr_tensor_wrap(&in, vals, TR_U8, TR_DEVICE_CPU, 1, &len);
  if (rc == 0)
    rc = tr_tensor_wrap(&out, all, TR_U8, TR_DEVICE_CPU, 1, &all_len);
  if (rc == 0) rc = tr_pg_all_gather(pg, &out, &in, NULL);
  if (rc == 0)
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int r = 0; r < size; r++) s += all[(int64_t)r * n + j];
      vals[j] = s;
    }
  tr_tensor_release(&in);
  tr_tensor_release(&out);
  free(all);
  return rc;
}
