// kernels/cuda/swiglu.cu: SwiGLU (Llama's MLP gate), out = silu(gate) * up,
// forward and accumulating backward, elementwise in 16-byte accesses.
#include "kernels/cuda/common.cuh"

// ---- kernels ----

namespace {

__device__ __forceinline__ float sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

template <typename T>
struct swiglu_fwd_op {
  T* out;
  const T* gate;
  const T* up;
  template <int V>
  __device__ void apply(int64_t i) const {
    float g[V], u[V];
    tr_load<T, V>(g, gate + i);
    tr_load<T, V>(u, up + i);
#pragma unroll
    for (int j = 0; j < V; j++) g[j] = g[j] * sigmoid(g[j]) * u[j];
    tr_store<T, V>(out + i, g);
  }
};

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
template <typename T>
struct swiglu_bwd_op {
  T* dgate;
  T* dup;
  const T* dout;
  const T* gate;
  const T* up;
  bool acc; // += into dgate and dup; false: overwrite them (not read)
  template <int V>
  __device__ void apply(int64_t i) const {
    float g[V], u[V], d[V], dg[V], du[V];
    tr_load<T, V>(g, gate + i);
    tr_load<T, V>(u, up + i);
    tr_load<T, V>(d, dout + i);
    if (acc) {
      tr_load<T, V>(dg, dgate + i);
      tr_load<T, V>(du, dup + i);
    } else {
#pragma unroll
      for (int j = 0; j < V; j++) dg[j] = du[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < V; j++) {
      float sg = sigmoid(g[j]);
      dg[j] += d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
      du[j] += d[j] * g[j] * sg;
    }
    tr_store<T, V>(dgate + i, dg);
    tr_store<T, V>(dup + i, du);
  }
};

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_swiglu_fwd(tr_dtype_t dt, void* out,
                                       const void* gate, const void* up,
                                       int64_t n, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "swiglu_fwd: negative size %lld", (long long)n);
  bool vec = tr__aligned16(out) && tr__aligned16(gate) && tr__aligned16(up);
  TR_CUDA_DISPATCH(dt, T, {
    swiglu_fwd_op<T> op{(T*)out, (const T*)gate, (const T*)up};
    return tr__ew_launch<tr_vec<T>::n>(op, n, vec, s, "swiglu_fwd");
  });
}

static int swiglu_bwd(tr_dtype_t dt, void* dgate, void* dup, const void* dout,
                      const void* gate, const void* up, int64_t n, bool acc,
                      cudaStream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "swiglu_bwd: negative size %lld", (long long)n);
  bool vec = tr__aligned16(dgate) && tr__aligned16(dup) &&
             tr__aligned16(dout) && tr__aligned16(gate) && tr__aligned16(up);
  TR_CUDA_DISPATCH(dt, T, {
    swiglu_bwd_op<T> op{(T*)dgate,      (T*)dup,        (const T*)dout,
                        (const T*)gate, (const T*)up,   acc};
    return tr__ew_launch<tr_vec<T>::n>(op, n, vec, s, "swiglu_bwd");
  });
}

extern "C" int tr_kern_cuda_swiglu_bwd(tr_dtype_t dt, void* dgate, void* dup,
                                       const void* dout, const void* gate,
                                       const void* up, int64_t n,
                                       tr_cuda_stream_t s) {
  return swiglu_bwd(dt, dgate, dup, dout, gate, up, n, true, s);
}

int tr__cuda_swiglu_bwd_write(tr_dtype_t dt, void* dgate, void* dup,
                              const void* dout, const void* gate,
                              const void* up, int64_t n, cudaStream_t s) {
  return swiglu_bwd(dt, dgate, dup, dout, gate, up, n, false, s);
}
