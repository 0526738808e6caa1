// kernels/cuda/gelu.cu: GELU with the tanh approximation (GPT-2's
// gelu_new), forward and accumulating backward, elementwise; plus the
// row-wise in-place forms that stand in for cuBLASLt's GELU epilogues.
#include "kernels/cuda/common.cuh"

// ---- kernels ----

namespace {

template <typename T>
struct gelu_fwd_op {
  T* out;
  const T* inp;
  template <int V>
  __device__ void apply(int64_t i) const {
    float x[V];
    tr_load<T, V>(x, inp + i);
#pragma unroll
    for (int j = 0; j < V; j++) x[j] = tr_gelu(x[j]);
    tr_store<T, V>(out + i, x);
  }
};

template <typename T>
struct gelu_bwd_op {
  T* dinp;
  const T* dout;
  const T* inp;
  template <int V>
  __device__ void apply(int64_t i) const {
    float x[V], d[V], g[V];
    tr_load<T, V>(x, inp + i);
    tr_load<T, V>(d, dout + i);
    tr_load<T, V>(g, dinp + i);
#pragma unroll
    for (int j = 0; j < V; j++) g[j] += d[j] * tr_gelu_grad(x[j]);
    tr_store<T, V>(dinp + i, g);
  }
};

// One row of an [M, N] matrix per blockIdx.y, columns over x.
template <typename T>
__global__ void gelu_rows_kernel(T* y, int64_t ld, T* aux, int64_t ldaux,
                                 int64_t N, int dgelu) {
  int64_t r = blockIdx.y;
  T* yr = y + r * ld;
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < N;
       c += (int64_t)gridDim.x * blockDim.x) {
    float v = tr_f(yr[c]);
    if (dgelu) {
      yr[c] = tr_to<T>(v * tr_gelu_grad(tr_f(aux[r * ldaux + c])));
    } else {
      if (aux) aux[r * ldaux + c] = yr[c];
      yr[c] = tr_to<T>(tr_gelu(v));
    }
  }
}

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_gelu_fwd(tr_dtype_t dt, void* out, const void* inp,
                                     int64_t n, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "gelu_fwd: negative size %lld", (long long)n);
  bool vec = tr__aligned16(out) && tr__aligned16(inp);
  TR_CUDA_DISPATCH(dt, T, {
    gelu_fwd_op<T> op{(T*)out, (const T*)inp};
    return tr__ew_launch<tr_vec<T>::n>(op, n, vec, s, "gelu_fwd");
  });
}

extern "C" int tr_kern_cuda_gelu_bwd(tr_dtype_t dt, void* dinp,
                                     const void* dout, const void* inp,
                                     int64_t n, tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(n >= 0, "gelu_bwd: negative size %lld", (long long)n);
  bool vec = tr__aligned16(dinp) && tr__aligned16(dout) && tr__aligned16(inp);
  TR_CUDA_DISPATCH(dt, T, {
    gelu_bwd_op<T> op{(T*)dinp, (const T*)dout, (const T*)inp};
    return tr__ew_launch<tr_vec<T>::n>(op, n, vec, s, "gelu_bwd");
  });
}

int tr__cuda_gelu_rows(tr_dtype_t dt, void* y, int64_t ld, void* aux,
                       int64_t ldaux, int64_t M, int64_t N, int dgelu,
                       cudaStream_t s) {
  if (M <= 0 || N <= 0) return 0;
  TR_CUDA_REQUIRE(M <= 65535 * 1024LL, "gelu epilogue: %lld rows",
                  (long long)M);
  TR_CUDA_REQUIRE(!dgelu || aux, "dgelu epilogue needs the GELU input");
  // rows beyond gridDim.y's limit go in slices
  for (int64_t r0 = 0; r0 < M; r0 += 65535) {
    int64_t rows = M - r0 < 65535 ? M - r0 : 65535;
    unsigned bx = tr__blocks(N, 256);
    dim3 grid(bx < 64 ? bx : 64, (unsigned)rows);
    TR_CUDA_DISPATCH(dt, T, {
      gelu_rows_kernel<T><<<grid, 256, 0, s>>>(
          (T*)y + r0 * ld, ld, aux ? (T*)aux + r0 * ldaux : (T*)nullptr, ldaux,
          N, dgelu);
    });
    TR_CHECK(TR_CUDA_LAUNCHED("gelu_rows_kernel"));
  }
  return 0;
}
