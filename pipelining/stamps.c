/* pipelining/stamps.c: the start and end times of the actions one rank
 * executes in a step (pipelining/internal.h) — the host's monotonic clock on
 * the CPU; on CUDA, events on the compute stream, so that a computation's
 * span is the device's, not the host's enqueueing. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core/clock.h" /* tr__now */
#include "pipelining/internal.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h" /* the compute stream */
#include "trainrun/log.h"
#include "trainrun/tensor.h" /* tr_cuda_synchronize */
#ifdef HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

struct tr__pp_stamps {
  double* times; /* the caller's: 2 per action */
  int64_t n;
  int cuda;
#ifdef HAVE_CUDA
  cudaEvent_t base;
  cudaEvent_t* ev; /* 2 per action; NULL where not recorded */
  double base_t;   /* host time at which base ran */
#endif
};

int tr__pp_stamps_new(tr__pp_stamps_t** out, double* times, int64_t n,
                      int cuda) {
  *out = NULL;
  tr__pp_stamps_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  s->times = times;
  s->n = n;
  for (int64_t k = 0; k < 2 * n; k++) times[k] = 0;
#ifdef HAVE_CUDA
  if (cuda) {
    s->cuda = 1;
    s->ev = calloc((size_t)(2 * n + 1), sizeof *s->ev);
    if (!s->ev) {
      free(s);
      return TR_ENOMEM;
    }
    /* the stream drained, base runs at once: its host time is the
     * device's zero */
    int rc = tr_cuda_synchronize();
    if (rc == 0 && cudaEventCreate(&s->base) != cudaSuccess) rc = TR_ECUDA;
    if (rc == 0 &&
        cudaEventRecord(s->base, (cudaStream_t)tr_kern_get_stream()) !=
            cudaSuccess)
      rc = TR_ECUDA;
    if (rc == 0 && cudaEventSynchronize(s->base) != cudaSuccess) rc = TR_ECUDA;
    if (rc < 0) {
      cudaGetLastError();
      free(s->ev);
      free(s);
      return rc;
    }
    s->base_t = tr__now();
  }
#else
  (void)cuda;
#endif
  *out = s;
  return 0;
}

void tr__pp_stamps_mark(tr__pp_stamps_t* s, int64_t k, int end) {
  if (!s || k < 0 || k >= s->n) return;
  int64_t i = 2 * k + (end ? 1 : 0);
  if (!s->cuda) {
    s->times[i] = tr__now();
    return;
  }
#ifdef HAVE_CUDA
  if (s->ev[i]) return; /* the first mark wins */
  cudaEvent_t e;
  if (cudaEventCreate(&e) != cudaSuccess) {
    cudaGetLastError();
    return; /* left out of the trace */
  }
  if (cudaEventRecord(e, (cudaStream_t)tr_kern_get_stream()) != cudaSuccess) {
    cudaGetLastError();
    cudaEventDestroy(e);
    return;
  }
  s->ev[i] = e;
#endif
}

int tr__pp_stamps_is_marked(const tr__pp_stamps_t* s, int64_t k, int end) {
  if (!s || k < 0 || k >= s->n) return 1;
  int64_t i = 2 * k + (end ? 1 : 0);
#ifdef HAVE_CUDA
  if (s->cuda) return s->ev[i] != NULL;
#endif
  return s->times[i] > 0;
}

int tr__pp_stamps_free(tr__pp_stamps_t* s) {
  if (!s) return 0;
  int rc = 0;
#ifdef HAVE_CUDA
  if (s->cuda) {
    rc = tr_cuda_synchronize();
    for (int64_t i = 0; i < 2 * s->n; i++) {
      if (!s->ev[i]) continue;
      float ms = 0;
      if (rc == 0 &&
          cudaEventElapsedTime(&ms, s->base, s->ev[i]) == cudaSuccess)
        s->times[i] = s->base_t + ms * 1e-3;
      else
        cudaGetLastError(); /* 0: left out */
      cudaEventDestroy(s->ev[i]);
    }
    cudaEventDestroy(s->base);
    free(s->ev);
  }
#endif
  free(s);
  return rc;
}
