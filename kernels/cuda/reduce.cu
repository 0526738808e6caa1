// kernels/cuda/reduce.cu: deterministic column sums of row-major gradients
// (bias gradients, LayerNorm/RMSNorm weight and bias gradients) and the
// bias add that stands in for cuBLASLt's bias epilogue.
//
// A column sum runs in two launches. The first splits the N rows into
// chunks (their number depends on N alone) and writes one fp32 partial sum
// per chunk and column, each summed by fixed threads in a fixed order; the
// second adds the partials of each column in chunk order and accumulates
// into the output. No atomics, so the bits never depend on scheduling.
#include "kernels/cuda/common.cuh"

#define COLSUM_YT 8  // row-parallel threads of a partial block
#define COLSUM_MAX_CHUNKS 512
#define COLSUM_MIN_ROWS 64

// ---- kernels ----

namespace {

// grid (column blocks of 32 * V, chunks), block (32, COLSUM_YT).
// part: [nchunks][2][C]
template <typename T, int V, int MODE>
__global__ void colsum_partial_kernel(float* part, const T* dout, const T* inp,
                                      const float* mean, const float* rstd,
                                      int64_t N, int C, int64_t rows_per) {
  __shared__ float sh[2][COLSUM_YT][32 * V];
  int tx = threadIdx.x, ty = threadIdx.y;
  int c = (blockIdx.x * 32 + tx) * V;
  int64_t r0 = (int64_t)blockIdx.y * rows_per;
  int64_t r1 = r0 + rows_per < N ? r0 + rows_per : N;
  float a1[V], a2[V];
#pragma unroll
  for (int j = 0; j < V; j++) a1[j] = a2[j] = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + ty; r < r1; r += COLSUM_YT) {
      float d[V];
      tr_load<T, V>(d, dout + r * C + c);
      if (MODE == TR__COLSUM_BIAS) {
#pragma unroll
        for (int j = 0; j < V; j++) a1[j] += d[j];
      } else {
        float x[V];
        tr_load<T, V>(x, inp + r * C + c);
        float m = MODE == TR__COLSUM_LN ? mean[r] : 0.0f;
        float rs = rstd[r];
#pragma unroll
        for (int j = 0; j < V; j++) {
          a1[j] += d[j] * ((x[j] - m) * rs);
          a2[j] += d[j];
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; j++) {
    sh[0][ty][tx * V + j] = a1[j];
    sh[1][ty][tx * V + j] = a2[j];
  }
  __syncthreads();
  // thread (tx, ty) finishes element tx*V.. of output ty (ty < 2)
  if (ty < 2 && c < C) {
    float* dst = part + ((int64_t)blockIdx.y * 2 + ty) * C + c;
#pragma unroll
    for (int j = 0; j < V; j++) {
      float t = 0.0f;
#pragma unroll
      for (int y = 0; y < COLSUM_YT; y++) t += sh[ty][y][tx * V + j];
      dst[j] = t;
    }
  }
}

// grid: column blocks of 32; block (32, COLSUM_YT): thread row ty sums the
// chunks ty, ty + YT, ... then the YT sums are added in order.
__global__ void colsum_final_kernel(float* out1, float* out2, const float* part,
                                    int nchunks, int C) {
  __shared__ float sh[2][COLSUM_YT][32];
  int tx = threadIdx.x, ty = threadIdx.y;
  int c = blockIdx.x * 32 + tx;
  float s1 = 0.0f, s2 = 0.0f;
  if (c < C) {
    for (int k = ty; k < nchunks; k += COLSUM_YT) {
      s1 += part[((int64_t)k * 2) * C + c];
      s2 += part[((int64_t)k * 2 + 1) * C + c];
    }
  }
  sh[0][ty][tx] = s1;
  sh[1][ty][tx] = s2;
  __syncthreads();
  if (ty == 0 && c < C) {
    float t1 = 0.0f, t2 = 0.0f;
#pragma unroll
    for (int y = 0; y < COLSUM_YT; y++) {
      t1 += sh[0][y][tx];
      t2 += sh[1][y][tx];
    }
    if (out1) out1[c] += t1;
    if (out2) out2[c] += t2;
  }
}

template <typename T>
__global__ void add_bias_kernel(T* y, int64_t ld, const T* bias, int64_t N) {
  T* yr = y + (int64_t)blockIdx.y * ld;
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < N;
       c += (int64_t)gridDim.x * blockDim.x)
    yr[c] = tr_to<T>(tr_f(yr[c]) + tr_f(bias[c]));
}

template <typename T, int V>
static int colsum_launch(int mode, float* part, const T* dout, const T* inp,
                         const float* mean, const float* rstd, int64_t N, int C,
                         int nchunks, int64_t rows_per, cudaStream_t s) {
  dim3 grid(tr__blocks(C, 32 * V), (unsigned)nchunks), block(32, COLSUM_YT);
  switch (mode) {
    case TR__COLSUM_BIAS:
      colsum_partial_kernel<T, V, TR__COLSUM_BIAS>
          <<<grid, block, 0, s>>>(part, dout, inp, mean, rstd, N, C, rows_per);
      break;
    case TR__COLSUM_LN:
      colsum_partial_kernel<T, V, TR__COLSUM_LN>
          <<<grid, block, 0, s>>>(part, dout, inp, mean, rstd, N, C, rows_per);
      break;
    default:
      colsum_partial_kernel<T, V, TR__COLSUM_RMS>
          <<<grid, block, 0, s>>>(part, dout, inp, mean, rstd, N, C, rows_per);
      break;
  }
  return TR_CUDA_LAUNCHED("colsum_partial_kernel");
}

}  // namespace

// ---- launchers ----

int tr__cuda_colsum(tr_dtype_t dt, int mode, float* out1, float* out2,
                    const void* dout, const void* inp, const float* mean,
                    const float* rstd, int64_t N, int C, cudaStream_t s) {
  TR_CUDA_REQUIRE(N >= 0 && C >= 0, "column sum: bad shape [%lld, %d]",
                  (long long)N, C);
  if (mode == TR__COLSUM_RMS) out2 = NULL;
  if (N == 0 || C == 0 || (!out1 && !out2)) return 0;
  TR_CUDA_REQUIRE(mode == TR__COLSUM_BIAS || (inp && rstd),
                  "column sum: norm gradients need the input and rstd");
  int nchunks;
  int64_t rows_per;
  tr__cuda_colsum_chunks(N, &nchunks, &rows_per);
  float* part = NULL;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&part,
                              sizeof(float) * 2 * (size_t)nchunks * C, s));
  int rc = 0;
  bool vec = tr__aligned16(dout) && (!inp || tr__aligned16(inp));
  TR_CUDA_DISPATCH(dt, T, {
    if (vec && C % tr_vec<T>::n == 0)
      rc = colsum_launch<T, tr_vec<T>::n>(mode, part, (const T*)dout,
                                          (const T*)inp, mean, rstd, N, C,
                                          (int)nchunks, rows_per, s);
    else
      rc = colsum_launch<T, 1>(mode, part, (const T*)dout, (const T*)inp, mean,
                               rstd, N, C, (int)nchunks, rows_per, s);
  });
  if (rc == 0) rc = tr__cuda_colsum_final(out1, out2, part, nchunks, C, s);
  tr__cuda_tmp_free(part, s);
  return rc;
}

void tr__cuda_colsum_chunks(int64_t N, int* nchunks, int64_t* rows_per) {
  int64_t n = (N + COLSUM_MIN_ROWS - 1) / COLSUM_MIN_ROWS;
  if (n > COLSUM_MAX_CHUNKS) n = COLSUM_MAX_CHUNKS;
  if (n < 1) n = 1;
  int64_t per = (N + n - 1) / n;
  if (per < 1) per = 1;
  *rows_per = per;
  *nchunks = (int)((N + per - 1) / per);
}

int tr__cuda_colsum_final(float* out1, float* out2, const float* part,
                          int nchunks, int C, cudaStream_t s) {
  if (nchunks <= 0 || C <= 0 || (!out1 && !out2)) return 0;
  colsum_final_kernel<<<tr__blocks(C, 32), dim3(32, COLSUM_YT), 0, s>>>(
      out1, out2, part, nchunks, C);
  return TR_CUDA_LAUNCHED("colsum_final_kernel");
}

int tr__cuda_add_bias(tr_dtype_t dt, void* y, int64_t ld, const void* bias,
                      int64_t M, int64_t N, cudaStream_t s) {
  if (M <= 0 || N <= 0) return 0;
  for (int64_t r0 = 0; r0 < M; r0 += 65535) {
    int64_t rows = M - r0 < 65535 ? M - r0 : 65535;
    unsigned bx = tr__blocks(N, 256);
    dim3 grid(bx < 64 ? bx : 64, (unsigned)rows);
    TR_CUDA_DISPATCH(dt, T, {
      add_bias_kernel<T>
          <<<grid, 256, 0, s>>>((T*)y + r0 * ld, ld, (const T*)bias, N);
    });
    TR_CHECK(TR_CUDA_LAUNCHED("add_bias_kernel"));
  }
  return 0;
}

extern "C" int tr_kern_cuda_bias_bwd(tr_dtype_t dt, float* dbias,
                                     const void* dout, int64_t N, int OC,
                                     tr_cuda_stream_t s) {
  return tr__cuda_colsum(dt, TR__COLSUM_BIAS, dbias, NULL, dout, NULL, NULL,
                         NULL, N, OC, s);
}
