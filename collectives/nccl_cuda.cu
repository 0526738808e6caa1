// collectives/nccl_cuda.cu: kernels of the NCCL backend (see nccl_cuda.h):
// uint16 <-> uint32 staging for reductions NCCL cannot do on uint16, and the
// integer division after a SUM that makes AVG. Launchers take the comm
// stream and check the launch.
#include "config.h"

#include <cuda_runtime.h>
#include <stdint.h>

#include "collectives/nccl_cuda.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/tensor.h"

// ---- kernels ----

__global__ static void widen_kernel(const uint16_t* src, uint32_t* dst,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ static void narrow_kernel(const uint32_t* src, uint16_t* dst,
                                     int64_t n, int divisor) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = (uint16_t)((uint16_t)src[i] / (unsigned)divisor);
}

template <typename T>
__global__ static void div_kernel(T* x, int64_t n, int divisor) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = (T)(x[i] / (T)divisor);
}

// ---- launchers ----

static unsigned blocks_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  if (b < 1) b = 1;
  if (b > 4096) b = 4096;
  return (unsigned)b;
}

static int launched(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  TR_LOG_ERROR(COLL, "%s launch failed: %s", what, cudaGetErrorString(e));
  return TR_ECUDA;
}

extern "C" int tr__nccl_u16_to_u32(const void* src, void* dst, int64_t n,
                                   void* stream) {
  if (n <= 0) return 0;
  widen_kernel<<<blocks_for(n), 256, 0, (cudaStream_t)stream>>>(
      (const uint16_t*)src, (uint32_t*)dst, n);
  return launched("u16 widen");
}

extern "C" int tr__nccl_u32_to_u16(const void* src, void* dst, int64_t n,
                                   int divisor, void* stream) {
  if (n <= 0) return 0;
  narrow_kernel<<<blocks_for(n), 256, 0, (cudaStream_t)stream>>>(
      (const uint32_t*)src, (uint16_t*)dst, n, divisor < 1 ? 1 : divisor);
  return launched("u16 narrow");
}

extern "C" int tr__nccl_div_int(void* x, int dtype, int64_t n, int divisor,
                                void* stream) {
  if (n <= 0 || divisor <= 1) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  unsigned b = blocks_for(n);
  switch (dtype) {
    case TR_I32:
      div_kernel<int32_t><<<b, 256, 0, s>>>((int32_t*)x, n, divisor);
      break;
    case TR_I64:
      div_kernel<int64_t><<<b, 256, 0, s>>>((int64_t*)x, n, divisor);
      break;
    case TR_U16:
      div_kernel<uint16_t><<<b, 256, 0, s>>>((uint16_t*)x, n, divisor);
      break;
    case TR_U8:
      div_kernel<uint8_t><<<b, 256, 0, s>>>((uint8_t*)x, n, divisor);
      break;
    default:
      return TR_EDTYPE;
  }
  return launched("integer divide");
}
