// kernels/cuda/norms.cu: LayerNorm and RMSNorm over the last dim, forward
// (optionally fused with the residual add that precedes them, saving mean
// and/or 1/std per row) and backward: the input gradient, and the weight
// (and bias) gradients in the same pass (per-chunk partials that reduce.cu's
// deterministic final column sum adds) where every output is wanted and the
// shared memory holds them, else through reduce.cu's column sums.
//
// One warp per row: each lane strides the row in 16-byte packs. Statistics
// are fp32: the mean first, then the centred sum of squares in a second pass
// (the row is re-read from L1/L2), so large means do not cancel.
#include "kernels/cuda/common.cuh"

#define ROWS_PER_BLOCK 8  // warps per block, one row each

// ---- kernels ----

namespace {

// x = a (+ b_in, rounded to T and stored to resid when RESID); out =
// norm(x) * w (+ bias). RMS: no mean, no bias.
template <typename T, int V, bool RESID, bool RMS>
__global__ void norm_fwd_kernel(T* out, T* resid, float* mean, float* rstd,
                                const T* a, const T* b_in, const T* w,
                                const T* bias, int64_t N, int C, float eps) {
  int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
  if (row >= N) return;
  int lane = threadIdx.x & 31;
  const T* x = RESID ? resid + row * C : a + row * C;
  float s = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V];
    tr_load<T, V>(xv, a + row * C + c);
    if (RESID) {
      float bv[V];
      tr_load<T, V>(bv, b_in + row * C + c);
#pragma unroll
      for (int j = 0; j < V; j++) xv[j] = tr_f(tr_to<T>(xv[j] + bv[j]));
      tr_store<T, V>(resid + row * C + c, xv);
    }
#pragma unroll
    for (int j = 0; j < V; j++) s += RMS ? xv[j] * xv[j] : xv[j];
  }
  s = tr_warp_sum(s);
  float m = 0.0f, rs;
  if (RMS) {
    rs = rsqrtf(s / C + eps);
  } else {
    m = s / C;
    float v = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
      float xv[V];
      tr_load<T, V>(xv, x + c);
#pragma unroll
      for (int j = 0; j < V; j++) v += (xv[j] - m) * (xv[j] - m);
    }
    v = tr_warp_sum(v);
    rs = rsqrtf(v / C + eps);
  }
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], wv[V], bv[V];
    tr_load<T, V>(xv, x + c);
    tr_load<T, V>(wv, w + c);
    if (bias) {
      tr_load<T, V>(bv, bias + c);
    } else {
#pragma unroll
      for (int j = 0; j < V; j++) bv[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < V; j++) xv[j] = (xv[j] - m) * rs * wv[j] + bv[j];
    tr_store<T, V>(out + row * C + c, xv);
  }
  if (lane == 0) {
    if (!RMS) mean[row] = m;
    rstd[row] = rs;
  }
}

// One row's backward, by one warp: dinp += (dn - mean(dn) - n mean(dn n))
// rstd, n = (x - mean) rstd, dn = dout w; RMS: mean 0 and no mean(dn) term.
// dw != NULL: each lane also adds dout n of its columns into dw (and dout
// into db, LayerNorm), column c at slot (c % V) (C / V) + c / V: for one j
// the 32 lanes' slots are consecutive, no shared-memory bank conflicts
// (column-major, lane l's V columns would be V words apart: V-way).
template <typename T, int V, bool RMS>
__device__ __forceinline__ void norm_bwd_row(T* di, const T* x, const T* d,
                                             const T* w, float m, float rs,
                                             int C, int lane, float* dw,
                                             float* db) {
  const int cv = C / V;
  float sdn = 0.0f, sdnn = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V];
    tr_load<T, V>(xv, x + c);
    tr_load<T, V>(dv, d + c);
    tr_load<T, V>(wv, w + c);
#pragma unroll
    for (int j = 0; j < V; j++) {
      float dn = dv[j] * wv[j];
      sdn += dn;
      sdnn += dn * ((xv[j] - m) * rs);
    }
  }
  float md = RMS ? 0.0f : tr_warp_sum(sdn) / C;
  float mdn = tr_warp_sum(sdnn) / C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V], gv[V];
    tr_load<T, V>(xv, x + c);
    tr_load<T, V>(dv, d + c);
    tr_load<T, V>(wv, w + c);
    tr_load<T, V>(gv, di + c);
#pragma unroll
    for (int j = 0; j < V; j++) {
      float n = (xv[j] - m) * rs;
      gv[j] += (dv[j] * wv[j] - md - n * mdn) * rs;
      if (dw) dw[j * cv + c / V] += dv[j] * n;
      if (!RMS && db) db[j * cv + c / V] += dv[j];
    }
    tr_store<T, V>(di + c, gv);
  }
}

template <typename T, int V, bool RMS>
__global__ void norm_bwd_kernel(T* dinp, const T* dout, const T* inp,
                                const T* w, const float* mean,
                                const float* rstd, int64_t N, int C) {
  int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
  if (row >= N) return;
  norm_bwd_row<T, V, RMS>(dinp + row * C, inp + row * C, dout + row * C, w,
                          RMS ? 0.0f : mean[row], rstd[row], C,
                          threadIdx.x & 31, NULL, NULL);
}

// The backward with the weight (and LayerNorm bias) gradients in the same
// pass over the rows: block k takes row chunk k of reduce.cu's column sums
// (tr__cuda_colsum_chunks), each of its W warps the rows w, w + W, ... of
// it; lane l adds its columns' terms into its warp's slice of shared
// memory (norm_bwd_row's bank-free slots); the block then adds the W
// slices in warp order into part[k], which tr__cuda_colsum_final adds in
// chunk order. A fixed order throughout (no atomics), and dout and the
// input are read once instead of again by a separate column sum.
template <typename T, int V, bool RMS>
__global__ void norm_bwd_fused_kernel(T* dinp, float* part, const T* dout,
                                      const T* inp, const T* w,
                                      const float* mean, const float* rstd,
                                      int64_t N, int C, int64_t rows_per) {
  constexpr int NS = RMS ? 1 : 2;  // sums: dw (and db)
  extern __shared__ float acc[];   // [W][NS][C], in slots
  int W = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < W * NS * C; i += blockDim.x) acc[i] = 0.0f;
  __syncthreads();
  float* mine = acc + (size_t)warp * NS * C;
  int64_t r0 = (int64_t)blockIdx.x * rows_per;
  int64_t r1 = r0 + rows_per < N ? r0 + rows_per : N;
  for (int64_t row = r0 + warp; row < r1; row += W)
    norm_bwd_row<T, V, RMS>(dinp + row * C, inp + row * C, dout + row * C, w,
                            RMS ? 0.0f : mean[row], rstd[row], C, lane, mine,
                            RMS ? NULL : mine + C);
  __syncthreads();
  // slot by slot (consecutive threads, consecutive words), to its column
  float* dst = part + (int64_t)blockIdx.x * 2 * C;
  int cv = C / V;
  for (int q = threadIdx.x; q < C; q += blockDim.x) {
    float s1 = 0.0f, s2 = 0.0f;
    for (int k = 0; k < W; k++) {
      s1 += acc[(size_t)k * NS * C + q];
      if (!RMS) s2 += acc[((size_t)k * NS + 1) * C + q];
    }
    int col = (q % cv) * V + q / cv;
    dst[col] = s1;
    dst[C + col] = s2;
  }
}

template <typename T, bool RESID, bool RMS>
static int fwd_launch(void* out, void* resid, float* mean, float* rstd,
                      const void* a, const void* b_in, const void* w,
                      const void* bias, int64_t N, int C, float eps,
                      cudaStream_t s) {
  constexpr int VN = tr_vec<T>::n;
  bool vec = C % VN == 0 && tr__aligned16(out) && tr__aligned16(a) &&
             tr__aligned16(w) && (!RESID || tr__aligned16(resid)) &&
             (!RESID || tr__aligned16(b_in)) && (!bias || tr__aligned16(bias));
  unsigned grid = tr__blocks(N, ROWS_PER_BLOCK);
  if (vec)
    norm_fwd_kernel<T, VN, RESID, RMS><<<grid, 32 * ROWS_PER_BLOCK, 0, s>>>(
        (T*)out, (T*)resid, mean, rstd, (const T*)a, (const T*)b_in,
        (const T*)w, (const T*)bias, N, C, eps);
  else
    norm_fwd_kernel<T, 1, RESID, RMS><<<grid, 32 * ROWS_PER_BLOCK, 0, s>>>(
        (T*)out, (T*)resid, mean, rstd, (const T*)a, (const T*)b_in,
        (const T*)w, (const T*)bias, N, C, eps);
  return TR_CUDA_LAUNCHED("norm_fwd_kernel");
}

template <typename T, bool RMS>
static int bwd_launch(void* dinp, const void* dout, const void* inp,
                      const void* w, const float* mean, const float* rstd,
                      int64_t N, int C, cudaStream_t s) {
  constexpr int VN = tr_vec<T>::n;
  bool vec = C % VN == 0 && tr__aligned16(dinp) && tr__aligned16(dout) &&
             tr__aligned16(inp) && tr__aligned16(w);
  unsigned grid = tr__blocks(N, ROWS_PER_BLOCK);
  if (vec)
    norm_bwd_kernel<T, VN, RMS><<<grid, 32 * ROWS_PER_BLOCK, 0, s>>>(
        (T*)dinp, (const T*)dout, (const T*)inp, (const T*)w, mean, rstd, N, C);
  else
    norm_bwd_kernel<T, 1, RMS><<<grid, 32 * ROWS_PER_BLOCK, 0, s>>>(
        (T*)dinp, (const T*)dout, (const T*)inp, (const T*)w, mean, rstd, N, C);
  return TR_CUDA_LAUNCHED("norm_bwd_kernel");
}

template <typename T, int V, bool RMS>
static int fused_go(void* dinp, float* part, const void* dout, const void* inp,
                    const void* w, const float* mean, const float* rstd,
                    int64_t N, int C, int64_t rows_per, int nchunks, int W,
                    size_t smem, cudaStream_t s) {
  auto k = norm_bwd_fused_kernel<T, V, RMS>;
  // above the default: opt in, once per device and size (not every step)
  static int opted[TR_MAX_DEVICES];
  int dev;
  TR_CHECK(tr__cuda_device(&dev));
  if (smem > 48 * 1024 &&
      (size_t)__atomic_load_n(&opted[dev], __ATOMIC_RELAXED) < smem) {
    TR_CHECK(TR_CUDA_CALL(cudaFuncSetAttribute(
        k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)));
    __atomic_store_n(&opted[dev], (int)smem, __ATOMIC_RELAXED);
  }
  k<<<nchunks, 32 * W, smem, s>>>((T*)dinp, part, (const T*)dout, (const T*)inp,
                                  (const T*)w, mean, rstd, N, C, rows_per);
  return TR_CUDA_LAUNCHED("norm_bwd_fused_kernel");
}

// The fused backward (dinp and the weight/bias gradients in one pass) when
// every output is wanted and W >= 2 warps' slices of every block fit the
// shared memory in one wave: 1 done, 0 not taken (the caller runs the two
// launches), < 0 error.
template <typename T, bool RMS>
static int bwd_fused_launch(void* dinp, float* dw, float* db, const void* dout,
                            const void* inp, const void* w, const float* mean,
                            const float* rstd, int64_t N, int C,
                            cudaStream_t s) {
  constexpr int NS = RMS ? 1 : 2;
  if (!dinp || !dw || (!RMS && !db)) return 0;
  int nchunks;
  int64_t rows_per;
  tr__cuda_colsum_chunks(N, &nchunks, &rows_per);
  // W: as many warps as let every chunk's block run in one wave (a second,
  // partial wave of blocks that each loop over their rows would leave most
  // of the GPU idle), at most ROWS_PER_BLOCK; the shared memory a
  // multiprocessor has, less 1 KiB a block, over the blocks it must hold
  size_t per_warp = (size_t)NS * C * sizeof(float);
  int sms = tr__cuda_sm_count();
  int64_t per_sm = (nchunks + sms - 1) / (sms > 0 ? sms : 1);
  int64_t room = (int64_t)tr__cuda_smem_optin() / per_sm - 1024;
  int64_t fit = room > 0 ? room / (int64_t)per_warp : 0;
  int W = fit < ROWS_PER_BLOCK ? (int)fit : ROWS_PER_BLOCK;
  if (W < 2) return 0;
  float* part = NULL;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&part,
                              sizeof(float) * 2 * (size_t)nchunks * C, s));
  constexpr int VN = tr_vec<T>::n;
  bool vec = C % VN == 0 && tr__aligned16(dinp) && tr__aligned16(dout) &&
             tr__aligned16(inp) && tr__aligned16(w);
  size_t smem = (size_t)W * per_warp;
  int rc = vec ? fused_go<T, VN, RMS>(dinp, part, dout, inp, w, mean, rstd, N,
                                      C, rows_per, nchunks, W, smem, s)
               : fused_go<T, 1, RMS>(dinp, part, dout, inp, w, mean, rstd, N, C,
                                     rows_per, nchunks, W, smem, s);
  if (rc == 0)
    rc = tr__cuda_colsum_final(dw, RMS ? NULL : db, part, nchunks, C, s);
  tr__cuda_tmp_free(part, s);
  return rc < 0 ? rc : 1;
}

int check_shape(const char* op, int64_t N, int C) {
  TR_CUDA_REQUIRE(N >= 0 && C > 0, "%s: bad shape [%lld, %d]", op, (long long)N,
                  C);
  TR_CUDA_REQUIRE(N / ROWS_PER_BLOCK < 0x7fffffffLL, "%s: %lld rows", op,
                  (long long)N);
  return 0;
}

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_layernorm_fwd(tr_dtype_t dt, void* out, float* mean,
                                          float* rstd, const void* inp,
                                          const void* w, const void* b,
                                          int64_t N, int C, float eps,
                                          tr_cuda_stream_t s) {
  TR_CHECK(check_shape("layernorm_fwd", N, C));
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    return fwd_launch<T, false, false>(out, NULL, mean, rstd, inp, NULL, w, b,
                                       N, C, eps, s);
  });
}

extern "C" int tr_kern_cuda_residual_layernorm_fwd(
    tr_dtype_t dt, void* resid, void* out, float* mean, float* rstd,
    const void* a, const void* b_in, const void* w, const void* b, int64_t N,
    int C, float eps, tr_cuda_stream_t s) {
  TR_CHECK(check_shape("residual_layernorm_fwd", N, C));
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    return fwd_launch<T, true, false>(out, resid, mean, rstd, a, b_in, w, b, N,
                                      C, eps, s);
  });
}

extern "C" int tr_kern_cuda_layernorm_bwd(tr_dtype_t dt, void* dinp, float* dw,
                                          float* db, const void* dout,
                                          const void* inp, const void* w,
                                          const float* mean, const float* rstd,
                                          int64_t N, int C,
                                          tr_cuda_stream_t s) {
  TR_CHECK(check_shape("layernorm_bwd", N, C));
  if (N == 0) return 0;
  int fused = 0;
  TR_CUDA_DISPATCH(dt, T, {
    fused = bwd_fused_launch<T, false>(dinp, dw, db, dout, inp, w, mean, rstd,
                                       N, C, s);
  });
  if (fused) return fused < 0 ? fused : 0;
  if (dinp) {
    TR_CUDA_DISPATCH(dt, T, {
      TR_CHECK((bwd_launch<T, false>(dinp, dout, inp, w, mean, rstd, N, C, s)));
    });
  }
  return tr__cuda_colsum(dt, TR__COLSUM_LN, dw, db, dout, inp, mean, rstd, N, C,
                         s);
}

extern "C" int tr_kern_cuda_rmsnorm_fwd(tr_dtype_t dt, void* out, float* rstd,
                                        const void* inp, const void* w,
                                        int64_t N, int C, float eps,
                                        tr_cuda_stream_t s) {
  TR_CHECK(check_shape("rmsnorm_fwd", N, C));
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    return fwd_launch<T, false, true>(out, NULL, NULL, rstd, inp, NULL, w, NULL,
                                      N, C, eps, s);
  });
}

extern "C" int tr_kern_cuda_residual_rmsnorm_fwd(
    tr_dtype_t dt, void* resid, void* out, float* rstd, const void* a,
    const void* b_in, const void* w, int64_t N, int C, float eps,
    tr_cuda_stream_t s) {
  TR_CHECK(check_shape("residual_rmsnorm_fwd", N, C));
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    return fwd_launch<T, true, true>(out, resid, NULL, rstd, a, b_in, w, NULL,
                                     N, C, eps, s);
  });
}

extern "C" int tr_kern_cuda_rmsnorm_bwd(tr_dtype_t dt, void* dinp, float* dw,
                                        const void* dout, const void* inp,
                                        const void* w, const float* rstd,
                                        int64_t N, int C, tr_cuda_stream_t s) {
  TR_CHECK(check_shape("rmsnorm_bwd", N, C));
  if (N == 0) return 0;
  int fused = 0;
  TR_CUDA_DISPATCH(dt, T, {
    fused = bwd_fused_launch<T, true>(dinp, dw, NULL, dout, inp, w, NULL, rstd,
                                      N, C, s);
  });
  if (fused) return fused < 0 ? fused : 0;
  if (dinp) {
    TR_CUDA_DISPATCH(dt, T, {
      TR_CHECK((bwd_launch<T, true>(dinp, dout, inp, w, NULL, rstd, N, C, s)));
    });
  }
  return tr__cuda_colsum(dt, TR__COLSUM_RMS, dw, NULL, dout, inp, NULL, rstd, N,
                         C, s);
}
