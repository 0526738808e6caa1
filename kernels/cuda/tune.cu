// kernels/cuda/tune.cu: candidates timed in interleaved rounds, for the
// tunings at first use: the GEMMs' cuBLASLt algorithms (matmul.cu) and
// cuDNN attention's engine configs (cudnn_attention.cu). Each candidate runs
// once per round, in turn, with an event after every run: interleaved, every
// candidate runs at the same clocks (a kernel's time depends on the load just
// before it: 8-20% for a GEMM on an H200, bench/results/2026-11-28-session15),
// and the host never waits: the timings are read once their last event has
// completed (cudaEventQuery), before a later step.
#include "kernels/cuda/common.cuh"

int tr__tune_may_start(cudaStream_t s) {
  if (cudaPeekAtLastError() != cudaSuccess) return 0;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cap) != cudaSuccess ||
      cap != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return 0;
  }
  return 1;
}

void tr__tune_free(tr__tune_t* t) {
  for (int j = 0; j < t->n; j++) cudaEventDestroy(t->ev[j]);
  t->n = 0;
}

int tr__tune_rounds(tr__tune_t* t, int ncand, const int* live,
                    tr__tune_launch_fn launch, void* ctx, cudaStream_t s) {
  t->n = 0;
  int nlive = 0, want, failed = 0;
  if (ncand > TR_TUNE_CANDS) ncand = TR_TUNE_CANDS;
  for (int i = 0; i < ncand; i++) nlive += live[i] != 0;
  // no timed rounds without the pick to compare with
  want = ncand > 0 && live[0] && nlive > 1 ? 1 + TR_TUNE_REPS * nlive : 0;
  int made = 0;
  for (; made < want; made++)
    if (cudaEventCreate(&t->ev[made]) != cudaSuccess) {
      failed = 1;
      break;
    }
  int nrec = 0;
  if (made == want && want) {
    if (cudaEventRecord(t->ev[0], s) == cudaSuccess)
      nrec = 1;
    else
      failed = 1;
  }
  // where a launch or a record fails, the runs stop there (an event must
  // follow each run for the runs' times to be told apart)
  for (int r = 0; nrec && r < TR_TUNE_REPS; r++)
    for (int i = 0; nrec && i < ncand; i++) {
      if (!live[i]) continue;
      if (launch(ctx, i) != 0 ||
          cudaEventRecord(t->ev[nrec], s) != cudaSuccess) {
        failed = 1;
        r = TR_TUNE_REPS;
        break;
      }
      t->cand[nrec++] = (signed char)i;
    }
  for (int j = nrec; j < made; j++) cudaEventDestroy(t->ev[j]);
  t->n = nrec;
  // what failed here is not the caller's error: its later launch checks
  // (TR_CUDA_LAUNCHED) must not see it
  if (failed) (void)cudaGetLastError();
  if (t->n > 1) return 1;
  tr__tune_free(t);
  return 0;
}

#define TUNE_MARGIN 0.03f    // another candidate must be this much faster
#define TUNE_FLOOR_MS 0.02f  // runs this short may time the host's launches

int tr__tune_pick(const float* best, int n) {
  int pick = -1;
  for (int i = 1; i < n; i++)
    if (best[i] >= 0.0f && (pick < 0 || best[i] < best[pick])) pick = i;
  if (n < 1 || best[0] < 0.0f || pick < 0) return -1;
  if (best[pick] >= (1.0f - TUNE_MARGIN) * best[0] || best[0] < TUNE_FLOOR_MS)
    pick = 0;
  return pick;
}

int tr__tune_read(tr__tune_t* t, int ncand, float* best) {
  if (t->n < 2) return -1;
  cudaError_t q = cudaEventQuery(t->ev[t->n - 1]);
  if (q == cudaErrorNotReady) {  // no error (the runtime keeps it as one)
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return 0;
  }
  for (int i = 0; i < ncand; i++) best[i] = -1.0f;
  int failed = q != cudaSuccess;
  for (int j = 1; !failed && j < t->n; j++) {
    float ms;
    int i = t->cand[j];
    if (cudaEventElapsedTime(&ms, t->ev[j - 1], t->ev[j]) != cudaSuccess) {
      failed = 1;
      break;
    }
    if (i < ncand && (best[i] < 0.0f || ms < best[i])) best[i] = ms;
  }
  if (failed) (void)cudaGetLastError();  // not the caller's error either
  tr__tune_free(t);
  return failed ? -1 : 1;
}
