// kernels/cuda/classifier.cu: the fused classifier: softmax, cross-entropy
// and its gradient over the vocabulary, one block per token row.
//
// The first pass streams the row once with an online max and rescaled sum
// (per 16-byte pack: one max, one rescale), giving the log-sum-exp and the
// loss; the second pass streams it again and overwrites it with
// scale * (softmax - onehot). The probabilities never get a buffer of their
// own, and the logits buffer becomes the gradient buffer (llm.c's fused
// classifier). Padding columns (ld > V, GPT-2's padded vocab) are skipped
// by the softmax and zeroed in the gradient.
#include "kernels/cuda/common.cuh"

// ---- kernels ----

namespace {

__device__ __forceinline__ float nan_f(void) {
  return __int_as_float(0x7fc00000);
}

// FWD: losses/lse; GRAD: gradient from the lse computed here (fused) or
// read from lse_in (backward only).
template <typename T, int V, bool FWD, bool GRAD>
__global__ void classifier_kernel(T* logits, int64_t ld, float* losses,
                                  float* lse_out, const float* lse_in,
                                  const int32_t* targets, int Vocab,
                                  float scale, int* err) {
  __shared__ float sh[32];
  int64_t row = blockIdx.x;
  T* x = logits + row * ld;
  int32_t tgt = targets[row];
  bool ignore = tgt == TR_IGNORE_INDEX;
  bool bad = !ignore && (tgt < 0 || tgt >= Vocab);
  float lse;
  if (FWD) {
    float m = -INFINITY, s = 0.0f;
    for (int64_t c = (int64_t)threadIdx.x * V; c < Vocab;
         c += (int64_t)blockDim.x * V) {
      float v[V];
      tr_load<T, V>(v, x + c);
      float mp = -INFINITY;
#pragma unroll
      for (int j = 0; j < V; j++)
        if (c + j < Vocab) mp = fmaxf(mp, v[j]);
      if (mp > m) {
        s *= expf(m - mp);
        m = mp;
      }
#pragma unroll
      for (int j = 0; j < V; j++)
        if (c + j < Vocab) s += expf(v[j] - m);
    }
    float M = tr_block_max(m, sh);
    float S = tr_block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), sh);
    lse = M + logf(S);
    if (threadIdx.x == 0) {
      if (lse_out) lse_out[row] = lse;
      if (ignore) {
        losses[row] = 0.0f;
      } else if (bad) {
        losses[row] = nan_f();
        if (err) atomicMin(err, (int)row);
      } else {
        losses[row] = lse - tr_f(x[tgt]);
      }
    }
    // the gradient pass overwrites x[tgt]: everyone is past reading it
    if (GRAD) __syncthreads();
  } else {
    lse = lse_in[row];
  }
  if (GRAD) {
    for (int64_t c = (int64_t)threadIdx.x * V; c < ld;
         c += (int64_t)blockDim.x * V) {
      float v[V];
      tr_load<T, V>(v, x + c);
#pragma unroll
      for (int j = 0; j < V; j++) {
        int64_t col = c + j;
        float g = 0.0f;
        if (!ignore && !bad && col < Vocab) {
          g = scale * expf(v[j] - lse);
          if (col == tgt) g -= scale;
        }
        v[j] = g;
      }
      tr_store<T, V>(x + c, v);
    }
  }
}

template <typename T, int V, bool FWD, bool GRAD>
int launch(void* logits, int64_t ld, float* losses, float* lse_out,
           const float* lse_in, const int32_t* targets, int64_t N, int Vocab,
           float scale, int* err, cudaStream_t s) {
  int threads = ld / V >= 4096 ? 1024 : (ld / V >= 1024 ? 512 : 128);
  classifier_kernel<T, V, FWD, GRAD><<<(unsigned)N, threads, 0, s>>>(
      (T*)logits, ld, losses, lse_out, lse_in, targets, Vocab, scale, err);
  return TR_CUDA_LAUNCHED("classifier_kernel");
}

template <bool FWD, bool GRAD>
int dispatch(tr_dtype_t dt, void* logits, int64_t ld, float* losses,
             float* lse_out, const float* lse_in, const int32_t* targets,
             int64_t N, int Vocab, float scale, int* err, cudaStream_t s) {
  TR_CUDA_REQUIRE(N >= 0 && Vocab > 0 && ld >= Vocab,
                  "classifier: bad shape N=%lld V=%d ld=%lld", (long long)N,
                  Vocab, (long long)ld);
  TR_CUDA_REQUIRE(N <= 0x7fffffff, "classifier: %lld rows", (long long)N);
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    constexpr int VN = tr_vec<T>::n;
    if (tr__aligned16(logits) && ld % VN == 0)
      return launch<T, VN, FWD, GRAD>(logits, ld, losses, lse_out, lse_in,
                                      targets, N, Vocab, scale, err, s);
    return launch<T, 1, FWD, GRAD>(logits, ld, losses, lse_out, lse_in, targets,
                                   N, Vocab, scale, err, s);
  });
}

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_classifier(tr_dtype_t dt, void* logits, int64_t ld,
                                       float* losses, float* lse,
                                       const int32_t* targets, int64_t N, int V,
                                       float scale, int want_grad, int* err,
                                       tr_cuda_stream_t s) {
  if (want_grad)
    return dispatch<true, true>(dt, logits, ld, losses, lse, NULL, targets, N,
                                V, scale, err, s);
  return dispatch<true, false>(dt, logits, ld, losses, lse, NULL, targets, N, V,
                               scale, err, s);
}

extern "C" int tr_kern_cuda_xent_fwd(tr_dtype_t dt, float* losses, float* lse,
                                     const void* logits, int64_t ld,
                                     const int32_t* targets, int64_t N, int V,
                                     int* err, tr_cuda_stream_t s) {
  return dispatch<true, false>(dt, (void*)logits, ld, losses, lse, NULL,
                               targets, N, V, 0.0f, err, s);
}

extern "C" int tr_kern_cuda_xent_bwd(tr_dtype_t dt, void* logits, int64_t ld,
                                     const float* lse, const int32_t* targets,
                                     int64_t N, int V, float scale,
                                     tr_cuda_stream_t s) {
  return dispatch<false, true>(dt, logits, ld, NULL, NULL, lse, targets, N, V,
                               scale, NULL, s);
}
