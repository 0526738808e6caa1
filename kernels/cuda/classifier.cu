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
//
// The vocabulary-parallel steps (loss parallel) are plain one-block-per-row
// reductions over a slice of the columns, kept simple: row max and owned
// target logit, sum of exponentials under the global max, the loss from
// the reduced values, and the gradient with the slice's column offset.
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

// ---- vocabulary-parallel steps ----

template <typename T>
__global__ void shard_stats_kernel(float* max, float* tgt, const T* logits,
                                   int64_t ld, const int32_t* targets,
                                   int Vocab, int64_t voff) {
  __shared__ float sh[32];
  int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < Vocab; c += blockDim.x)
    m = fmaxf(m, tr_f(x[c]));
  float M = tr_block_max(m, sh);
  if (threadIdx.x == 0) {
    int32_t t = targets[row];
    int64_t j = (int64_t)t - voff;
    max[row] = M;
    tgt[row] = t != TR_IGNORE_INDEX && j >= 0 && j < Vocab ? tr_f(x[j]) : 0.0f;
  }
}

template <typename T>
__global__ void shard_sumexp_kernel(float* sum, const T* logits, int64_t ld,
                                    const float* max, int Vocab) {
  __shared__ float sh[32];
  int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  float m = max[row], acc = 0.0f;
  for (int c = threadIdx.x; c < Vocab; c += blockDim.x)
    acc += expf(tr_f(x[c]) - m);
  float S = tr_block_sum(acc, sh);
  if (threadIdx.x == 0) sum[row] = S;
}

__global__ void shard_loss_kernel(float* losses, float* lse, const float* max,
                                  const float* sum, const float* tgt,
                                  const int32_t* targets, int64_t N) {
  int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= N) return;
  float l = max[r] + logf(sum[r]);
  lse[r] = l;
  losses[r] = targets[r] == TR_IGNORE_INDEX ? 0.0f : l - tgt[r];
}

template <typename T>
__global__ void shard_bwd_kernel(T* logits, int64_t ld, const float* lse,
                                 const int32_t* targets, int Vocab,
                                 int64_t voff, float scale) {
  int64_t row = blockIdx.x;
  T* x = logits + row * ld;
  int32_t t = targets[row];
  bool ignore = t == TR_IGNORE_INDEX;
  int64_t j = (int64_t)t - voff;
  float l = lse[row];
  for (int64_t c = threadIdx.x; c < ld; c += blockDim.x) {
    float g = 0.0f;
    if (!ignore && c < Vocab) {
      g = scale * expf(tr_f(x[c]) - l);
      if (c == j) g -= scale;
    }
    x[c] = (T)g;
  }
}

int shard_check(int64_t N, int Vocab, int64_t ld) {
  TR_CUDA_REQUIRE(N >= 0 && N <= 0x7fffffff && Vocab > 0 && ld >= Vocab,
                  "xent_shard: bad shape N=%lld V=%d ld=%lld", (long long)N,
                  Vocab, (long long)ld);
  return 0;
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

extern "C" int tr_kern_cuda_xent_shard_stats(tr_dtype_t dt, float* max,
                                             float* tgt, const void* logits,
                                             int64_t ld, const int32_t* targets,
                                             int64_t N, int V, int64_t voff,
                                             tr_cuda_stream_t s) {
  TR_CHECK(shard_check(N, V, ld));
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    shard_stats_kernel<T><<<(unsigned)N, 256, 0, s>>>(
        max, tgt, (const T*)logits, ld, targets, V, voff);
  });
  return TR_CUDA_LAUNCHED("shard_stats_kernel");
}

extern "C" int tr_kern_cuda_xent_shard_sumexp(tr_dtype_t dt, float* sum,
                                              const void* logits, int64_t ld,
                                              const float* max, int64_t N,
                                              int V, tr_cuda_stream_t s) {
  TR_CHECK(shard_check(N, V, ld));
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    shard_sumexp_kernel<T>
        <<<(unsigned)N, 256, 0, s>>>(sum, (const T*)logits, ld, max, V);
  });
  return TR_CUDA_LAUNCHED("shard_sumexp_kernel");
}

extern "C" int tr_kern_cuda_xent_shard_loss(float* losses, float* lse,
                                            const float* max, const float* sum,
                                            const float* tgt,
                                            const int32_t* targets, int64_t N,
                                            tr_cuda_stream_t s) {
  if (N <= 0) return 0;
  shard_loss_kernel<<<tr__blocks(N, 256), 256, 0, s>>>(losses, lse, max, sum,
                                                       tgt, targets, N);
  return TR_CUDA_LAUNCHED("shard_loss_kernel");
}

extern "C" int tr_kern_cuda_xent_shard_bwd(tr_dtype_t dt, void* logits,
                                           int64_t ld, const float* lse,
                                           const int32_t* targets, int64_t N,
                                           int V, int64_t voff, float scale,
                                           tr_cuda_stream_t s) {
  TR_CHECK(shard_check(N, V, ld));
  if (N == 0) return 0;
  TR_CUDA_DISPATCH(dt, T, {
    shard_bwd_kernel<T><<<(unsigned)N, 256, 0, s>>>((T*)logits, ld, lse,
                                                    targets, V, voff, scale);
  });
  return TR_CUDA_LAUNCHED("shard_bwd_kernel");
}
