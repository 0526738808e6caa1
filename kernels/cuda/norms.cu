// kernels/cuda/norms.cu: LayerNorm and RMSNorm over the last dim, forward
// (optionally fused with the residual add that precedes them, saving mean
// and/or 1/std per row) and backward (input gradient here; weight and bias
// gradients through the deterministic column sums of reduce.cu).
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

// dinp += (dn - mean(dn) - n mean(dn n)) rstd, n = (x - mean) rstd, dn = dout
// w; RMS: mean 0 and no mean(dn) term.
template <typename T, int V, bool RMS>
__global__ void norm_bwd_kernel(T* dinp, const T* dout, const T* inp,
                                const T* w, const float* mean,
                                const float* rstd, int64_t N, int C) {
  int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
  if (row >= N) return;
  int lane = threadIdx.x & 31;
  const T* x = inp + row * C;
  const T* d = dout + row * C;
  float m = RMS ? 0.0f : mean[row], rs = rstd[row];
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
  T* di = dinp + row * C;
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
    }
    tr_store<T, V>(di + c, gv);
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
  if (dinp) {
    TR_CUDA_DISPATCH(dt, T, {
      TR_CHECK((bwd_launch<T, true>(dinp, dout, inp, w, NULL, rstd, N, C, s)));
    });
  }
  return tr__cuda_colsum(dt, TR__COLSUM_RMS, dw, NULL, dout, inp, NULL, rstd, N,
                         C, s);
}
