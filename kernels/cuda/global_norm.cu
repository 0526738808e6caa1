// kernels/cuda/global_norm.cu: the global gradient norm over many tensors
// (multi-tensor, like adamw.cu) and the clipping factor, computed and kept
// on the device so a training step needs no host synchronization.
//
// Every block sums a fixed chunk of one tensor in fp32 and writes one
// partial; a single block then adds the partials in double, each thread a
// fixed stride of them, then a fixed shuffle tree. Same bits every time.
#include "kernels/cuda/common.cuh"

#include <string.h>

#define MT_MAX 64
#define CHUNK 8192
#define THREADS 256
#define FINAL_THREADS 1024

// ---- kernels ----

namespace {

struct span_table {
  const void* x[MT_MAX];
  int64_t n[MT_MAX];
  int bf[MT_MAX];  // 1: bf16, 0: fp32
  int first_block[MT_MAX + 1];
  int count;
};

__global__ void __launch_bounds__(THREADS)
    sumsq_partial_kernel(const __grid_constant__ span_table tab,
                         float* partial) {
  __shared__ float sh[32];
  int b = blockIdx.x;
  int lo = 0, hi = tab.count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (tab.first_block[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  int t = lo;
  int64_t start = (int64_t)(b - tab.first_block[t]) * CHUNK;
  int64_t end = start + CHUNK < tab.n[t] ? start + CHUNK : tab.n[t];
  float s = 0.0f;
  if (tab.bf[t]) {
    const bf16* x = (const bf16*)tab.x[t];
    for (int64_t i = start + threadIdx.x; i < end; i += THREADS) {
      float v = __bfloat162float(x[i]);
      s += v * v;
    }
  } else {
    const float* x = (const float*)tab.x[t];
    for (int64_t i = start + threadIdx.x; i < end; i += THREADS) {
      float v = x[i];
      s += v * v;
    }
  }
  s = tr_block_sum(s, sh);
  if (threadIdx.x == 0) partial[b] = s;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(FINAL_THREADS)
    sumsq_final_kernel(double* out, const float* partial, int64_t n) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += FINAL_THREADS) s += partial[i];
  s = warp_sum_d(s);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = sh[threadIdx.x];
    s = warp_sum_d(s);
    if (threadIdx.x == 0) *out = s;
  }
}

__global__ void clip_kernel(float* factor, float* norm, const double* sumsq,
                            double max_norm) {
  double nrm = sqrt(*sumsq);
  double f = max_norm / (nrm + 1e-6);
  *factor = (float)(f < 1.0 ? f : 1.0);
  if (norm) *norm = (float)nrm;
}

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_sum_squares(double* out_dev,
                                        const tr_cuda_span_t* spans,
                                        int n_spans, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(out_dev, "sum_squares: no output");
  TR_CUDA_REQUIRE(n_spans >= 0 && (spans || n_spans == 0),
                  "sum_squares: bad span list");
  int64_t total = 0;
  for (int i = 0; i < n_spans; i++) {
    TR_CUDA_REQUIRE(spans[i].n >= 0 && (spans[i].x || spans[i].n == 0),
                    "sum_squares: span %d has no data", i);
    TR_CUDA_REQUIRE(spans[i].dtype == TR_F32 || spans[i].dtype == TR_BF16,
                    "sum_squares: span %d is %s", i,
                    tr_dtype_name(spans[i].dtype));
    total += (spans[i].n + CHUNK - 1) / CHUNK;
  }
  TR_CUDA_REQUIRE(total < 0x7fffffffLL, "sum_squares: too many elements");
  float* partial = NULL;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&partial,
                              sizeof(float) * (size_t)(total ? total : 1), s));
  int rc = 0;
  int64_t done = 0;
  int i = 0;
  while (rc == 0 && i < n_spans) {
    span_table tab;
    memset(&tab, 0, sizeof tab);
    int blocks = 0;
    for (; i < n_spans && tab.count < MT_MAX; i++) {
      if (spans[i].n == 0) continue;
      int c = tab.count++;
      tab.x[c] = spans[i].x;
      tab.n[c] = spans[i].n;
      tab.bf[c] = spans[i].dtype == TR_BF16;
      tab.first_block[c] = blocks;
      blocks += (int)((spans[i].n + CHUNK - 1) / CHUNK);
    }
    if (tab.count == 0) continue;
    tab.first_block[tab.count] = blocks;
    sumsq_partial_kernel<<<(unsigned)blocks, THREADS, 0, s>>>(tab,
                                                              partial + done);
    rc = TR_CUDA_LAUNCHED("sumsq_partial_kernel");
    done += blocks;
  }
  if (rc == 0) {
    sumsq_final_kernel<<<1, FINAL_THREADS, 0, s>>>(out_dev, partial, done);
    rc = TR_CUDA_LAUNCHED("sumsq_final_kernel");
  }
  tr__cuda_tmp_free(partial, s);
  return rc;
}

extern "C" int tr_kern_cuda_clip_factor(float* factor_dev, float* norm_dev,
                                        const double* sumsq_dev,
                                        double max_norm, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(factor_dev && sumsq_dev, "clip_factor: missing pointers");
  clip_kernel<<<1, 1, 0, s>>>(factor_dev, norm_dev, sumsq_dev, max_norm);
  return TR_CUDA_LAUNCHED("clip_kernel");
}
