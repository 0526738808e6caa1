// checkpoint/stage_cuda.cu: the CUDA side of staging a save (declared in
// checkpoint/dma.h): device-to-host copies on a non-blocking stream of
// their own per device, ordered after the caller's kernels with an event and
// each followed by an event of its own (reused across saves), so the caller
// goes on computing while the copies run, its optimizer waits on the device
// for them, and the writer thread waits for each chunk before writing it.
#include "config.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/dma.h"
#include "trainrun/tensor.h" /* TR_MAX_DEVICES */
#include "trainrun/error.h"
#include "trainrun/log.h"

struct tr__ckpt_dma {
  cudaStream_t stream[TR_MAX_DEVICES];                 // created on first use
  cudaEvent_t t0[TR_MAX_DEVICES], t1[TR_MAX_DEVICES];  // timing: a span
  cudaEvent_t* ev;  // by index; ev_dev: its device
  int* ev_dev;
  size_t nev;
};

static int check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  TR_LOG_ERROR(CKPT, "%s failed: %s (%s)", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
  return e == cudaErrorMemoryAllocation ? TR_ENOMEM : TR_ECUDA;
}

// Make `device` the calling thread's device (when it is not already).
static int dev_use(int device, int* prev) {
  if (device < 0 || device >= TR_MAX_DEVICES) return TR_EDEVICE;
  if (cudaGetDevice(prev) != cudaSuccess) *prev = -1;
  if (*prev == device) return 0;
  return check(cudaSetDevice(device), "cudaSetDevice");
}

extern "C" int tr__ckpt_dma_new(tr__ckpt_dma_t** out) {
  *out = (tr__ckpt_dma_t*)calloc(1, sizeof **out);
  return *out ? 0 : TR_ENOMEM;
}

extern "C" void tr__ckpt_dma_free(tr__ckpt_dma_t* d) {
  if (!d) return;
  for (size_t i = 0; i < d->nev; i++)
    if (d->ev[i]) cudaEventDestroy(d->ev[i]);
  for (int k = 0; k < TR_MAX_DEVICES; k++) {
    if (d->stream[k]) cudaStreamDestroy(d->stream[k]);
    if (d->t0[k]) cudaEventDestroy(d->t0[k]);
    if (d->t1[k]) cudaEventDestroy(d->t1[k]);
  }
  free(d->ev);
  free(d->ev_dev);
  free(d);
}

// The copy stream of the current device `device`: non-blocking, so the
// legacy default stream's kernels neither wait for it nor it for them.
static int stream_of(tr__ckpt_dma_t* d, int device, cudaStream_t* out) {
  if (!d->stream[device]) {
    int rc = check(
        cudaStreamCreateWithFlags(&d->stream[device], cudaStreamNonBlocking),
        "cudaStreamCreateWithFlags");
    if (rc < 0) return rc;
  }
  *out = d->stream[device];
  return 0;
}

// Event `ev` on the current device `device`. Blocking sync: the writer
// thread sleeps in cudaEventSynchronize instead of spinning on a core.
static int event_of(tr__ckpt_dma_t* d, size_t ev, int device,
                    cudaEvent_t* out) {
  if (ev >= d->nev) {
    size_t n = ev + 1 > 2 * d->nev ? ev + 1 : 2 * d->nev;
    cudaEvent_t* e = (cudaEvent_t*)realloc(d->ev, n * sizeof *e);
    if (!e) return TR_ENOMEM;
    d->ev = e;
    int* dv = (int*)realloc(d->ev_dev, n * sizeof *dv);
    if (!dv) return TR_ENOMEM;
    d->ev_dev = dv;
    memset(d->ev + d->nev, 0, (n - d->nev) * sizeof *e);
    for (size_t i = d->nev; i < n; i++) d->ev_dev[i] = -1;
    d->nev = n;
  }
  if (d->ev[ev] && d->ev_dev[ev] != device) {
    cudaEventDestroy(d->ev[ev]);
    d->ev[ev] = NULL;
  }
  if (!d->ev[ev]) {
    int rc =
        check(cudaEventCreateWithFlags(
                  &d->ev[ev], cudaEventDisableTiming | cudaEventBlockingSync),
              "cudaEventCreateWithFlags");
    if (rc < 0) return rc;
    d->ev_dev[ev] = device;
  }
  *out = d->ev[ev];
  return 0;
}

// Record the timing event ev[device] on the copy stream cs.
static int mark(cudaEvent_t* ev, int device, cudaStream_t cs) {
  if (!ev[device]) {
    int rc = check(cudaEventCreateWithFlags(&ev[device], cudaEventBlockingSync),
                   "cudaEventCreateWithFlags");
    if (rc < 0) return rc;
  }
  return check(cudaEventRecord(ev[device], cs), "cudaEventRecord");
}

extern "C" int tr__ckpt_dma_after(tr__ckpt_dma_t* d, int device, void* stream) {
  int prev;
  int rc = dev_use(device, &prev);
  cudaStream_t cs = NULL;
  cudaEvent_t e = NULL;
  if (rc == 0) rc = stream_of(d, device, &cs);
  if (rc == 0)
    rc = check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
  // after the caller's stream and the legacy default stream (where
  // tr_tensor_copy converts dtypes)
  cudaStream_t waits[2] = {(cudaStream_t)stream, cudaStreamLegacy};
  for (int k = 0; k < (stream ? 2 : 1) && rc == 0; k++) {
    rc = check(cudaEventRecord(e, waits[k] ? waits[k] : cudaStreamLegacy),
               "cudaEventRecord");
    if (rc == 0)
      rc = check(cudaStreamWaitEvent(cs, e, 0), "cudaStreamWaitEvent");
  }
  if (e) cudaEventDestroy(e);  // released once the waits are done with it
  if (rc == 0) rc = mark(d->t0, device, cs);
  // the trainer's thread keeps its device (a context it already has)
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
  return rc;
}

extern "C" int tr__ckpt_dma_end(tr__ckpt_dma_t* d, int device) {
  int prev;
  int rc = dev_use(device, &prev);
  cudaStream_t cs = NULL;
  if (rc == 0) rc = stream_of(d, device, &cs);
  if (rc == 0) rc = mark(d->t1, device, cs);
  return rc;
}

extern "C" int tr__ckpt_dma_span(tr__ckpt_dma_t* d, int device,
                                 double* seconds) {
  *seconds = 0;
  if (device < 0 || device >= TR_MAX_DEVICES || !d->t0[device] ||
      !d->t1[device])
    return 0;
  float ms = 0;
  int rc = check(cudaEventSynchronize(d->t1[device]), "cudaEventSynchronize");
  if (rc == 0)
    rc = check(cudaEventElapsedTime(&ms, d->t0[device], d->t1[device]),
               "cudaEventElapsedTime");
  if (rc == 0) *seconds = ms / 1e3;
  return rc;
}

extern "C" int tr__ckpt_dma_copy(tr__ckpt_dma_t* d, int device, void* dst,
                                 const void* src, size_t n, size_t ev) {
  int prev;
  int rc = dev_use(device, &prev);
  cudaStream_t cs = NULL;
  cudaEvent_t e = NULL;
  if (rc == 0) rc = stream_of(d, device, &cs);
  if (rc == 0) rc = event_of(d, ev, device, &e);
  if (rc == 0)
    rc = check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cs),
               "cudaMemcpyAsync");
  if (rc == 0) rc = check(cudaEventRecord(e, cs), "cudaEventRecord");
  return rc;
}

extern "C" int tr__ckpt_dma_wait(tr__ckpt_dma_t* d, size_t ev) {
  if (ev >= d->nev || !d->ev[ev]) return 0;
  return check(cudaEventSynchronize(d->ev[ev]), "cudaEventSynchronize");
}

extern "C" int tr__ckpt_dma_order(tr__ckpt_dma_t* d, size_t ev, void* stream) {
  if (ev >= d->nev || !d->ev[ev]) return 0;
  return check(cudaStreamWaitEvent((cudaStream_t)stream, d->ev[ev], 0),
               "cudaStreamWaitEvent");
}
