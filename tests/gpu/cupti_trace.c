/* tests/gpu/cupti_trace.c: a timeline of a CUDA program's GPU work and its
 * host's CUDA calls, for the GPU machines, which have CUPTI but not Nsight
 * Systems. An injection library: the CUDA driver loads it into every
 * process that has CUDA_INJECTION64_PATH set and calls InitializeInjection
 * before the first CUDA call, so trainrun's workers are traced without
 * being rebuilt.
 *
 * Build it on the GPU machine (the CPU machine has no CUPTI headers):
 *   tests/gpu/trace_gaps.py --build DIR     (writes DIR/libcupti_trace.so)
 * Run:
 *   CUDA_INJECTION64_PATH=DIR/libcupti_trace.so TRACE_DIR=T ./trainrun ...
 *   tests/gpu/trace_gaps.py T/trace-PID.txt
 *
 * Each process writes TRACE_DIR/trace-PID.txt (default /tmp) at exit, one
 * line per record, times in ns on CUPTI's clock:
 *   K start end stream corr name      a kernel
 *   M start end stream corr memset|memcpyKIND bytes
 *   A start end tid corr cbid name    a runtime or driver API call
 *                                     (cudaLaunchKernel, cuLaunchKernel,
 *                                     cudaStreamSynchronize, ...)
 * KREC is the kernel record struct of the installed CUPTI (the newest
 * CUpti_ActivityKernelN in cupti_activity.h; trace_gaps.py --build finds
 * it). */
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KREC
#error "build with -DKREC=CUpti_ActivityKernelN (trace_gaps.py --build)"
#endif
#ifndef MREC
#error "build with -DMREC=CUpti_ActivityMemcpyN"
#endif
#ifndef SREC
#error "build with -DSREC=CUpti_ActivityMemsetN"
#endif
#ifndef AREC
#define AREC CUpti_ActivityAPI
#endif

#define BUF_BYTES (8u << 20)

static FILE* out;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI buf_request(uint8_t** buf, size_t* size, size_t* max) {
  *buf = aligned_alloc(8, BUF_BYTES);
  *size = *buf ? BUF_BYTES : 0;
  *max = 0;
}

static void emit(CUpti_Activity* r) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      KREC* k = (KREC*)r;
      fprintf(out, "K %llu %llu %u %u %s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->streamId, k->correlationId,
              k->name ? k->name : "?");
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      MREC* m = (MREC*)r;
      fprintf(out, "M %llu %llu %u %u memcpy%u %llu\n",
              (unsigned long long)m->start, (unsigned long long)m->end,
              m->streamId, m->correlationId, (unsigned)m->copyKind,
              (unsigned long long)m->bytes);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      SREC* m = (SREC*)r;
      fprintf(out, "M %llu %llu %u %u memset %llu\n",
              (unsigned long long)m->start, (unsigned long long)m->end,
              m->streamId, m->correlationId, (unsigned long long)m->bytes);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      AREC* a = (AREC*)r;
      const char* name = "?";
      cuptiGetCallbackName(r->kind == CUPTI_ACTIVITY_KIND_DRIVER
                               ? CUPTI_CB_DOMAIN_DRIVER_API
                               : CUPTI_CB_DOMAIN_RUNTIME_API,
                           a->cbid, &name);
      fprintf(out, "A %llu %llu %u %u %u %s\n", (unsigned long long)a->start,
              (unsigned long long)a->end, a->threadId, a->correlationId,
              a->cbid, name ? name : "?");
      break;
    }
    default:
      break;
  }
}

static void CUPTIAPI buf_done(CUcontext ctx, uint32_t stream, uint8_t* buf,
                              size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity* r = NULL;
  pthread_mutex_lock(&out_lock);
  if (out)
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) emit(r);
  pthread_mutex_unlock(&out_lock);
  free(buf);
}

static void finish(void) {
  cuptiActivityFlushAll(1);
  pthread_mutex_lock(&out_lock);
  if (out) fclose(out);
  out = NULL;
  pthread_mutex_unlock(&out_lock);
}

static int enable(CUpti_ActivityKind k, const char* what) {
  CUptiResult rc = cuptiActivityEnable(k);
  if (rc == CUPTI_SUCCESS) return 0;
  const char* s = "?";
  cuptiGetResultString(rc, &s);
  fprintf(stderr, "cupti_trace: cannot trace %s: %s\n", what, s);
  return -1;
}

int InitializeInjection(void) {
  const char* dir = getenv("TRACE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/trace-%d.txt", dir && *dir ? dir : "/tmp",
           (int)getpid());
  out = fopen(path, "w");
  if (!out) {
    perror(path);
    return 0;
  }
  if (cuptiActivityRegisterCallbacks(buf_request, buf_done) != CUPTI_SUCCESS) {
    fprintf(stderr, "cupti_trace: cannot register the activity buffers\n");
    return 0;
  }
  enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "kernels");
  enable(CUPTI_ACTIVITY_KIND_MEMCPY, "copies");
  enable(CUPTI_ACTIVITY_KIND_MEMSET, "memsets");
  enable(CUPTI_ACTIVITY_KIND_RUNTIME, "runtime calls");
  /* cuDNN, cuBLASLt and NCCL launch through the driver API */
  enable(CUPTI_ACTIVITY_KIND_DRIVER, "driver calls");
  atexit(finish);
  return 1;
}
