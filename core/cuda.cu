// core/cuda.cu: CUDA runtime calls for core/ (device and pinned allocation,
// copies) and the element-wise dtype conversion and fill kernels behind
// tr_tensor_copy and tr_tensor_fill for cuda tensors.
#include "config.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "core/cuda.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/tensor.h"

// Convert a CUDA error at the boundary: log CUDA's text, return TR_ECUDA.
static int cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 0;
  TR_LOG_ERROR(CORE, "%s failed: %s (%s)", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
  return e == cudaErrorMemoryAllocation ? TR_ENOMEM : TR_ECUDA;
}

// ---- kernels ----

__device__ static double load_elem(const void* p, int dt, int64_t i) {
  switch (dt) {
    case TR_F32: return ((const float*)p)[i];
    case TR_BF16: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    case TR_F16: return __half2float(((const __half*)p)[i]);
    case TR_I32: return ((const int32_t*)p)[i];
    case TR_I64: return (double)((const int64_t*)p)[i];
    case TR_U16: return ((const uint16_t*)p)[i];
    default: return ((const uint8_t*)p)[i];
  }
}

__device__ static void store_elem(void* p, int dt, int64_t i, double v) {
  switch (dt) {
    case TR_F32: ((float*)p)[i] = (float)v; break;
    case TR_BF16: ((__nv_bfloat16*)p)[i] = __float2bfloat16((float)v); break;
    case TR_F16: ((__half*)p)[i] = __float2half((float)v); break;
    case TR_I32: ((int32_t*)p)[i] = (int32_t)v; break;
    case TR_I64: ((int64_t*)p)[i] = (int64_t)v; break;
    case TR_U16: ((uint16_t*)p)[i] = (uint16_t)v; break;
    default: ((uint8_t*)p)[i] = (uint8_t)v; break;
  }
}

__global__ static void convert_kernel(void* dst, int ddt, const void* src,
                                      int sdt, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    store_elem(dst, ddt, i, load_elem(src, sdt, i));
}

__global__ static void fill_kernel(void* dst, int dt, double v, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    store_elem(dst, dt, i, v);
}

// ---- launchers ----

static unsigned grid_for(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  return (unsigned)(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// Device memory comes from each device's stream-ordered pool, allocated and
// freed on the legacy default stream: a free is ordered after the kernels
// already enqueued there that use the block, and the block is reused by the
// next allocation without a device synchronization (cudaFree would wait for
// the whole device). The pool keeps what it has (release threshold: all),
// like PyTorch's caching allocator; work on other streams that reads a block
// must be ordered against the default stream (the process group does so with
// events).
static void pool_setup(int device) {
  static int done[TR_MAX_DEVICES];
  if (device < 0 || device >= TR_MAX_DEVICES ||
      __atomic_load_n(&done[device], __ATOMIC_ACQUIRE))
    return;
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  cudaGetLastError();
  __atomic_store_n(&done[device], 1, __ATOMIC_RELEASE);
}

extern "C" int tr__cuda_malloc(int device, size_t n, void** out) {
  int rc = cuda_check(cudaSetDevice(device), "cudaSetDevice");
  if (rc < 0) return rc;
  pool_setup(device);
  return cuda_check(cudaMallocAsync(out, n, 0), "cudaMallocAsync");
}

extern "C" void tr__cuda_free(int device, void* p) {
  cudaSetDevice(device);
  cuda_check(cudaFreeAsync(p, 0), "cudaFreeAsync");
}

extern "C" int tr__cuda_host_alloc(size_t n, void** out) {
  return cuda_check(cudaHostAlloc(out, n, cudaHostAllocPortable),
                    "cudaHostAlloc");
}

extern "C" void tr__cuda_host_free(void* p) {
  cuda_check(cudaFreeHost(p), "cudaFreeHost");
}

// Asked once per process: without a driver every cudaGetDeviceCount searches
// the library path for libcuda again (some 80 failed opens each time).
extern "C" int tr__cuda_device_count(void) {
  static int cached = -1;
  int n = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
  if (n >= 0) return n;
  n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    n = 0;
  }
  __atomic_store_n(&cached, n, __ATOMIC_RELEASE);
  return n;
}

extern "C" int tr__cuda_set_device(int device, char* name, size_t cap) {
  int rc = cuda_check(cudaSetDevice(device), "cudaSetDevice");
  if (rc < 0 || !name || !cap) return rc;
  cudaDeviceProp prop;
  rc = cuda_check(cudaGetDeviceProperties(&prop, device),
                  "cudaGetDeviceProperties");
  if (rc == 0) snprintf(name, cap, "%s", prop.name);
  return rc;
}

extern "C" int tr__cuda_synchronize(void) {
  return cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

extern "C" int tr__cuda_memcpy(void* dst, const void* src, size_t n) {
  return cuda_check(cudaMemcpy(dst, src, n, cudaMemcpyDefault), "cudaMemcpy");
}

extern "C" int tr__cuda_convert(int device, void* dst, int dst_dtype,
                                const void* src, int src_dtype, int64_t n) {
  int rc = cuda_check(cudaSetDevice(device), "cudaSetDevice");
  if (rc < 0 || n == 0) return rc;
  convert_kernel<<<grid_for(n), 256>>>(dst, dst_dtype, src, src_dtype, n);
  return cuda_check(cudaGetLastError(), "convert_kernel launch");
}

extern "C" int tr__cuda_fill(int device, void* dst, int dtype, double value,
                             int64_t n) {
  int rc = cuda_check(cudaSetDevice(device), "cudaSetDevice");
  if (rc < 0 || n == 0) return rc;
  fill_kernel<<<grid_for(n), 256>>>(dst, dtype, value, n);
  return cuda_check(cudaGetLastError(), "fill_kernel launch");
}
