// kernels/cuda/rope.cu: rotary position embedding in Hugging Face's
// rotate_half layout (dim i pairs with i + D/2), in place on rows that may
// be column slices of a fused qkv buffer; the backward is the inverse
// rotation. cos/sin tables are fp32 [T, D/2] (tr_kern_rope_table).
#include "kernels/cuda/common.cuh"

// ---- kernels ----

namespace {

// thread per (row, head, pack of V pair indices)
template <typename T, int V>
__global__ void rope_kernel(T* x, const float* cos_t, const float* sin_t,
                            int64_t N, int T_, int H, int D, int64_t stride,
                            float sign) {
  int half = D / 2;
  int per_head = half / V;
  int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= N * H * per_head) return;
  int i = (int)(idx % per_head) * V;
  int64_t rh = idx / per_head;
  int h = (int)(rh % H);
  int64_t r = rh / H;
  int t = (int)(r % T_);
  T* p = x + r * stride + (int64_t)h * D + i;
  float x1[V], x2[V];
  tr_load<T, V>(x1, p);
  tr_load<T, V>(x2, p + half);
  const float* cs = cos_t + (int64_t)t * half + i;
  const float* sn = sin_t + (int64_t)t * half + i;
#pragma unroll
  for (int j = 0; j < V; j++) {
    float c = cs[j], s = sign * sn[j];
    float a = x1[j], b = x2[j];
    x1[j] = a * c - b * s;
    x2[j] = b * c + a * s;
  }
  tr_store<T, V>(p, x1);
  tr_store<T, V>(p + half, x2);
}

template <typename T, int V>
int rope_launch(void* x, const float* cos_t, const float* sin_t, int64_t N,
                int T_, int H, int D, int64_t stride, float sign,
                cudaStream_t s) {
  int64_t n = N * H * (D / 2 / V);
  rope_kernel<T, V><<<tr__blocks(n, 256), 256, 0, s>>>((T*)x, cos_t, sin_t, N,
                                                       T_, H, D, stride, sign);
  return TR_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_rope(tr_dtype_t dt, void* x, const float* cos_t,
                                 const float* sin_t, int B, int T_, int H,
                                 int D, int64_t stride, int inverse,
                                 tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(B >= 0 && T_ >= 0 && H > 0 && D > 0 && D % 2 == 0,
                  "rope: bad shape B=%d T=%d H=%d D=%d", B, T_, H, D);
  TR_CUDA_REQUIRE(stride >= (int64_t)H * D, "rope: row stride %lld < H*D",
                  (long long)stride);
  int64_t N = (int64_t)B * T_;
  if (N == 0) return 0;
  float sign = inverse ? -1.0f : 1.0f;
  TR_CUDA_DISPATCH(dt, T, {
    constexpr int VN = tr_vec<T>::n;
    bool vec = tr__aligned16(x) && (D / 2) % VN == 0 && stride % VN == 0;
    if (vec)
      return rope_launch<T, VN>(x, cos_t, sin_t, N, T_, H, D, stride, sign, s);
    return rope_launch<T, 1>(x, cos_t, sin_t, N, T_, H, D, stride, sign, s);
  });
}
