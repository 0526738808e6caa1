// kernels/cuda/encoder.cu: token (+ learned position) embedding, forward
// and deterministic backward, of the whole table or of a vocabulary-parallel
// slice of its rows (tokens the slice does not hold give 0 and no gradient).
//
// The backward cannot scatter-add rows (tokens repeat, and float atomics
// would make the sum depend on scheduling). It sorts (token, position)
// pairs with CUB's stable radix sort, then one thread per token and
// channel pack sums that token's rows in position order and adds the sum
// to dwte once. dwpe sums over the batch for each position, in batch order.
#include "kernels/cuda/common.cuh"

#include <cub/device/device_radix_sort.cuh>  // cub::DeviceRadixSort

// ---- kernels ----

namespace {

// thread per (row, pack of V channels); the table holds rows [row0, row0 +
// Vocab); a token outside them gives NaNs, or zeros for a slice
template <typename T, int V>
__global__ void embedding_fwd_kernel(T* out, const int32_t* tok, const T* wte,
                                     const T* wpe, int64_t N, int T_, int C,
                                     int Vocab, int64_t row0, bool slice) {
  int cv = C / V;
  int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= N * cv) return;
  int64_t r = idx / cv;
  int c = (int)(idx % cv) * V;
  int64_t t = (int64_t)tok[r] - row0;
  float e[V];
  if (t < 0 || t >= Vocab) {
    float f = slice ? 0.0f : __int_as_float(0x7fc00000);  // NaN
#pragma unroll
    for (int j = 0; j < V; j++) e[j] = f;
  } else {
    tr_load<T, V>(e, wte + t * C + c);
    if (wpe) {
      float p[V];
      tr_load<T, V>(p, wpe + (r % T_) * C + c);
#pragma unroll
      for (int j = 0; j < V; j++) e[j] += p[j];
    }
  }
  tr_store<T, V>(out + r * C + c, e);
}

// keys: the token's row in the table (rows [row0, row0 + Vocab)), or
// Vocab for one out of range (sorted last, skipped); unsigned, so the radix
// sort's bit range covers them as they are
__global__ void embedding_keys_kernel(uint32_t* keys, int32_t* vals,
                                      const int32_t* tok, int64_t N, int Vocab,
                                      int64_t row0) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  int64_t t = (int64_t)tok[i] - row0;
  keys[i] = (uint32_t)((t < 0 || t >= Vocab) ? Vocab : t);
  vals[i] = (int32_t)i;
}

// thread per (sorted position, pack): the first position of each token's
// run sums the run in order
template <typename T, int V>
__global__ void embedding_dwte_kernel(float* dwte, const T* dout,
                                      const uint32_t* keys, const int32_t* rows,
                                      int64_t N, int C, int Vocab) {
  int cv = C / V;
  int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= N * cv) return;
  int64_t i = idx / cv;
  int c = (int)(idx % cv) * V;
  uint32_t key = keys[i];
  if (key >= (uint32_t)Vocab || (i > 0 && keys[i - 1] == key)) return;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; j++) acc[j] = 0.0f;
  for (int64_t k = i; k < N && keys[k] == key; k++) {
    float d[V];
    tr_load<T, V>(d, dout + (int64_t)rows[k] * C + c);
#pragma unroll
    for (int j = 0; j < V; j++) acc[j] += d[j];
  }
  float* dst = dwte + (int64_t)key * C + c;
#pragma unroll
  for (int j = 0; j < V; j++) dst[j] += acc[j];
}

// thread per (position, pack): sum over the batch in order
template <typename T, int V>
__global__ void embedding_dwpe_kernel(float* dwpe, const T* dout, int B, int T_,
                                      int C) {
  int cv = C / V;
  int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (int64_t)T_ * cv) return;
  int t = (int)(idx / cv);
  int c = (int)(idx % cv) * V;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; j++) acc[j] = 0.0f;
  for (int b = 0; b < B; b++) {
    float d[V];
    tr_load<T, V>(d, dout + ((int64_t)b * T_ + t) * C + c);
#pragma unroll
    for (int j = 0; j < V; j++) acc[j] += d[j];
  }
  float* dst = dwpe + (int64_t)t * C + c;
#pragma unroll
  for (int j = 0; j < V; j++) dst[j] += acc[j];
}

template <typename T, int V>
int fwd_launch(void* out, const int32_t* tok, const void* wte, const void* wpe,
               int64_t N, int T_, int C, int Vocab, int64_t row0, bool slice,
               cudaStream_t s) {
  int64_t n = N * (C / V);
  embedding_fwd_kernel<T, V><<<tr__blocks(n, 256), 256, 0, s>>>(
      (T*)out, tok, (const T*)wte, (const T*)wpe, N, T_, C, Vocab, row0, slice);
  return TR_CUDA_LAUNCHED("embedding_fwd_kernel");
}

template <typename T, int V>
int bwd_launch(float* dwte, float* dwpe, const void* dout, const uint32_t* keys,
               const int32_t* rows, int B, int T_, int C, int Vocab,
               cudaStream_t s) {
  int64_t N = (int64_t)B * T_;
  if (dwte) {
    int64_t n = N * (C / V);
    embedding_dwte_kernel<T, V><<<tr__blocks(n, 256), 256, 0, s>>>(
        dwte, (const T*)dout, keys, rows, N, C, Vocab);
    TR_CHECK(TR_CUDA_LAUNCHED("embedding_dwte_kernel"));
  }
  if (dwpe) {
    int64_t n = (int64_t)T_ * (C / V);
    embedding_dwpe_kernel<T, V>
        <<<tr__blocks(n, 256), 256, 0, s>>>(dwpe, (const T*)dout, B, T_, C);
    TR_CHECK(TR_CUDA_LAUNCHED("embedding_dwpe_kernel"));
  }
  return 0;
}

int check(const char* op, int B, int T_, int C, int Vocab) {
  TR_CUDA_REQUIRE(B >= 0 && T_ >= 0 && C > 0 && Vocab > 0,
                  "%s: bad shape B=%d T=%d C=%d V=%d", op, B, T_, C, Vocab);
  TR_CUDA_REQUIRE((int64_t)B * T_ < 0x7fffffff,
                  "%s: %lld tokens is more than one call takes", op,
                  (long long)B * T_);
  return 0;
}

}  // namespace

// ---- launchers ----

namespace {

int fwd(tr_dtype_t dt, void* out, const int32_t* tok, const void* wte,
        const void* wpe, int B, int T_, int C, int Vocab, int64_t row0,
        bool slice, cudaStream_t s) {
  TR_CHECK(check("embedding_fwd", B, T_, C, Vocab));
  int64_t N = (int64_t)B * T_;
  if (N == 0) return 0;
  bool vec =
      tr__aligned16(out) && tr__aligned16(wte) && (!wpe || tr__aligned16(wpe));
  TR_CUDA_DISPATCH(dt, T, {
    if (vec && C % tr_vec<T>::n == 0)
      return fwd_launch<T, tr_vec<T>::n>(out, tok, wte, wpe, N, T_, C, Vocab,
                                         row0, slice, s);
    return fwd_launch<T, 1>(out, tok, wte, wpe, N, T_, C, Vocab, row0, slice,
                            s);
  });
}

}  // namespace

extern "C" int tr_kern_cuda_embedding_fwd(tr_dtype_t dt, void* out,
                                          const int32_t* tok, const void* wte,
                                          const void* wpe, int B, int T_, int C,
                                          int Vocab, tr_cuda_stream_t s) {
  return fwd(dt, out, tok, wte, wpe, B, T_, C, Vocab, 0, false, s);
}

extern "C" int tr_kern_cuda_embedding_rows_fwd(tr_dtype_t dt, void* out,
                                               const int32_t* tok,
                                               const void* wte, int64_t row0,
                                               int rows, int B, int T_, int C,
                                               tr_cuda_stream_t s) {
  return fwd(dt, out, tok, wte, NULL, B, T_, C, rows, row0, true, s);
}

namespace {

int bwd(tr_dtype_t dt, float* dwte, float* dwpe, const void* dout,
        const int32_t* tok, int B, int T_, int C, int Vocab, int64_t row0,
        cudaStream_t s) {
  TR_CHECK(check("embedding_bwd", B, T_, C, Vocab));
  if (dt != TR_F32 && dt != TR_BF16) {
    TR_LOG_ERROR(KERN, "embedding_bwd: %s is not supported", tr_dtype_name(dt));
    return TR_EDTYPE;
  }
  int N = B * T_;
  if (N == 0 || (!dwte && !dwpe)) return 0;
  int end_bit = 1;
  while (end_bit < 32 && (1LL << end_bit) <= Vocab) end_bit++;
  // one temporary: keys in/out, rows in/out, then CUB's scratch
  size_t cub_bytes = 0;
  TR_CHECK(TR_CUDA_CALL(cub::DeviceRadixSort::SortPairs(
      (void*)NULL, cub_bytes, (const uint32_t*)NULL, (uint32_t*)NULL,
      (const int32_t*)NULL, (int32_t*)NULL, N, 0, end_bit, s)));
  size_t arr = ((size_t)N * sizeof(int32_t) + 255) & ~(size_t)255;
  char* tmp = NULL;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&tmp, 4 * arr + cub_bytes, s));
  uint32_t* keys_in = (uint32_t*)tmp;
  uint32_t* keys = (uint32_t*)(tmp + arr);
  int32_t* rows_in = (int32_t*)(tmp + 2 * arr);
  int32_t* rows = (int32_t*)(tmp + 3 * arr);
  int rc = 0;
  if (dwte) {
    embedding_keys_kernel<<<tr__blocks(N, 256), 256, 0, s>>>(
        keys_in, rows_in, tok, N, Vocab, row0);
    rc = TR_CUDA_LAUNCHED("embedding_keys_kernel");
    if (rc == 0)
      rc = TR_CUDA_CALL(cub::DeviceRadixSort::SortPairs(
          (void*)(tmp + 4 * arr), cub_bytes, keys_in, keys, rows_in, rows, N, 0,
          end_bit, s));
  }
  if (rc == 0) {
    bool vec = tr__aligned16(dout) && (!dwte || tr__aligned16(dwte)) &&
               (!dwpe || tr__aligned16(dwpe));
    TR_CUDA_DISPATCH(dt, T, {
      if (vec && C % tr_vec<T>::n == 0)
        rc = bwd_launch<T, tr_vec<T>::n>(dwte, dwpe, dout, keys, rows, B, T_, C,
                                         Vocab, s);
      else
        rc = bwd_launch<T, 1>(dwte, dwpe, dout, keys, rows, B, T_, C, Vocab, s);
    });
  }
  tr__cuda_tmp_free(tmp, s);
  return rc;
}

}  // namespace

extern "C" int tr_kern_cuda_embedding_bwd(tr_dtype_t dt, float* dwte,
                                          float* dwpe, const void* dout,
                                          const int32_t* tok, int B, int T_,
                                          int C, int Vocab,
                                          tr_cuda_stream_t s) {
  return bwd(dt, dwte, dwpe, dout, tok, B, T_, C, Vocab, 0, s);
}

extern "C" int tr_kern_cuda_embedding_rows_bwd(tr_dtype_t dt, float* dwte,
                                               float* dwpe, const void* dout,
                                               const int32_t* tok, int64_t row0,
                                               int rows, int B, int T_, int C,
                                               tr_cuda_stream_t s) {
  return bwd(dt, dwte, dwpe, dout, tok, B, T_, C, rows, row0, s);
}
