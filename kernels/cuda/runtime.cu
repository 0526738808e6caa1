// kernels/cuda/runtime.cu: the CUDA runtime side of the kernels: error
// conversion (CUDA's message logged, TR_ECUDA returned), stream-ordered
// temporaries from each device's memory pool, and cached device properties.
#include "kernels/cuda/common.cuh"

#include <pthread.h>

#define MAX_DEV TR_MAX_DEVICES

int tr__cuda_error(cudaError_t e, const char* what, const char* file,
                   int line) {
  if (e == cudaSuccess) return 0;
  TR_LOG_ERROR(KERN, "%s failed at %s:%d: %s (%s)", what, file, line,
               cudaGetErrorString(e), cudaGetErrorName(e));
  return e == cudaErrorMemoryAllocation ? TR_ENOMEM : TR_ECUDA;
}

// ---- per-device state ----

typedef struct {
  int ready;
  int sm_count;
  int smem_optin;
} dev_info_t;

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static dev_info_t dev_info[MAX_DEV];

int tr__cuda_device(int* dev) {
  int rc = TR_CUDA_CALL(cudaGetDevice(dev));
  if (rc < 0) return rc;
  if (*dev < 0 || *dev >= MAX_DEV) {
    TR_LOG_ERROR(KERN, "cuda:%d is beyond the %d devices trainrun handles",
                 *dev, MAX_DEV);
    return TR_EDEVICE;
  }
  return 0;
}

// Fill dev_info[dev] once: properties, and a memory pool that keeps what is
// freed (the default release threshold of 0 would hand memory back to the
// driver at every synchronization and make each temporary a fresh mapping).
static int dev_setup(int* out_dev) {
  int dev, rc;
  TR_CHECK(tr__cuda_device(&dev));
  *out_dev = dev;
  if (__atomic_load_n(&dev_info[dev].ready, __ATOMIC_ACQUIRE)) return 0;
  pthread_mutex_lock(&dev_lock);
  rc = 0;
  if (!dev_info[dev].ready) {
    int sms = 0, optin = 0;
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    rc = TR_CUDA_CALL(
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (rc == 0)
      rc = TR_CUDA_CALL(cudaDeviceGetAttribute(
          &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (rc == 0) rc = TR_CUDA_CALL(cudaDeviceGetDefaultMemPool(&pool, dev));
    if (rc == 0)
      rc = TR_CUDA_CALL(cudaMemPoolSetAttribute(
          pool, cudaMemPoolAttrReleaseThreshold, &keep));
    if (rc == 0) {
      dev_info[dev].sm_count = sms;
      dev_info[dev].smem_optin = optin;
      __atomic_store_n(&dev_info[dev].ready, 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&dev_lock);
  return rc;
}

int tr__cuda_sm_count(void) {
  int dev;
  if (dev_setup(&dev) < 0) return 1;
  return dev_info[dev].sm_count;
}

int tr__cuda_smem_optin(void) {
  int dev;
  if (dev_setup(&dev) < 0) return 48 * 1024;
  return dev_info[dev].smem_optin;
}

int tr__cuda_tmp_alloc(void** p, size_t bytes, cudaStream_t s) {
  int dev;
  TR_CHECK(dev_setup(&dev));
  return TR_CUDA_CALL(cudaMallocAsync(p, bytes ? bytes : 16, s));
}

void tr__cuda_tmp_free(void* p, cudaStream_t s) {
  if (p) TR_CUDA_CALL(cudaFreeAsync(p, s));
}

// Device setup for tr_kern_cuda_init (matmul.cu adds the cuBLASLt handle).
extern "C" int tr__cuda_runtime_init(void) {
  int dev;
  return dev_setup(&dev);
}
