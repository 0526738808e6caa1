// kernels/cuda/elementwise.cu: the residual add (out = a + b), gradient
// accumulation (y += x), scaling (x *= alpha) and fp32 <-> bf16 conversion,
// in 16-byte accesses where the pointers allow.
#include "kernels/cuda/common.cuh"

// ---- kernels ----

namespace {

template <typename T>
struct add_op {
  T* out;
  const T* a;
  const T* b;
  template <int V>
  __device__ void apply(int64_t i) const {
    float x[V], y[V];
    tr_load<T, V>(x, a + i);
    tr_load<T, V>(y, b + i);
#pragma unroll
    for (int j = 0; j < V; j++) x[j] += y[j];
    tr_store<T, V>(out + i, x);
  }
};

template <typename T>
struct acc_op {
  T* y;
  const T* x;
  template <int V>
  __device__ void apply(int64_t i) const {
    float a[V], b[V];
    tr_load<T, V>(a, y + i);
    tr_load<T, V>(b, x + i);
#pragma unroll
    for (int j = 0; j < V; j++) a[j] += b[j];
    tr_store<T, V>(y + i, a);
  }
};

template <typename T>
struct scale_op {
  T* x;
  float alpha;
  template <int V>
  __device__ void apply(int64_t i) const {
    float a[V];
    tr_load<T, V>(a, x + i);
#pragma unroll
    for (int j = 0; j < V; j++) a[j] *= alpha;
    tr_store<T, V>(x + i, a);
  }
};

// V counts elements of the narrower type, so both sides stay whole packs.
template <typename D, typename S>
struct convert_op {
  D* dst;
  const S* src;
  template <int V>
  __device__ void apply(int64_t i) const {
    float a[V];
    tr_load<S, V>(a, src + i);
    tr_store<D, V>(dst + i, a);
  }
};

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_add(tr_dtype_t dt, void* out, const void* a,
                                const void* b, int64_t n, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "add: negative size %lld", (long long)n);
  bool vec = tr__aligned16(out) && tr__aligned16(a) && tr__aligned16(b);
  TR_CUDA_DISPATCH(dt, T, {
    add_op<T> op{(T*)out, (const T*)a, (const T*)b};
    return tr__ew_launch<tr_vec<T>::n>(op, n, vec, s, "add");
  });
}

extern "C" int tr_kern_cuda_accumulate(tr_dtype_t dt, void* y, const void* x,
                                       int64_t n, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "accumulate: negative size %lld", (long long)n);
  bool vec = tr__aligned16(y) && tr__aligned16(x);
  TR_CUDA_DISPATCH(dt, T, {
    acc_op<T> op{(T*)y, (const T*)x};
    return tr__ew_launch<tr_vec<T>::n>(op, n, vec, s, "accumulate");
  });
}

extern "C" int tr_kern_cuda_scale(tr_dtype_t dt, void* x, float alpha,
                                  int64_t n, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "scale: negative size %lld", (long long)n);
  bool vec = tr__aligned16(x);
  TR_CUDA_DISPATCH(dt, T, {
    scale_op<T> op{(T*)x, alpha};
    return tr__ew_launch<tr_vec<T>::n>(op, n, vec, s, "scale");
  });
}

extern "C" int tr_kern_cuda_convert(tr_dtype_t dst_dt, void* dst,
                                    tr_dtype_t src_dt, const void* src,
                                    int64_t n, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "convert: negative size %lld", (long long)n);
  bool vec = tr__aligned16(dst) && tr__aligned16(src);
  if (dst_dt == TR_BF16 && src_dt == TR_F32) {
    convert_op<bf16, float> op{(bf16*)dst, (const float*)src};
    return tr__ew_launch<4>(op, n, vec, s, "convert");
  }
  if (dst_dt == TR_F32 && src_dt == TR_BF16) {
    convert_op<float, bf16> op{(float*)dst, (const bf16*)src};
    return tr__ew_launch<4>(op, n, vec, s, "convert");
  }
  if (dst_dt == src_dt && (dst_dt == TR_F32 || dst_dt == TR_BF16))
    return TR_CUDA_CALL(cudaMemcpyAsync(dst, src,
                                        (size_t)n * tr_dtype_size(dst_dt),
                                        cudaMemcpyDeviceToDevice, s));
  TR_LOG_ERROR(KERN, "convert: %s to %s is not supported",
               tr_dtype_name(src_dt), tr_dtype_name(dst_dt));
  return TR_EDTYPE;
}
