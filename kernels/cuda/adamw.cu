// kernels/cuda/adamw.cu: multi-tensor fused AdamW: fp32 master weights,
// gradients and moments, and optionally the bf16 compute copy of the
// weights refreshed in the same pass. Many tensors go in one launch: the
// kernel parameters carry a table of up to MT_MAX tensors and the first
// block of each; a block finds its tensor by binary search.
#include "kernels/cuda/common.cuh"

#include <string.h>

#define MT_MAX 48   // tensors per launch (kernel parameters < 4 KiB)
#define CHUNK 4096  // elements per block
#define THREADS 256

// ---- kernels ----

namespace {

struct adamw_table {
  float* p[MT_MAX];
  const float* g[MT_MAX];
  float* m[MT_MAX];
  float* v[MT_MAX];
  bf16* pb[MT_MAX];
  int64_t n[MT_MAX];
  float decay[MT_MAX];          // 1 - lr * weight_decay (or 1)
  int first_block[MT_MAX + 1];  // prefix sums of each tensor's blocks
  int count;
};

struct adamw_scalars {
  float b1, b2, eps, step_size, bc2_sqrt, gscale;
};

__global__ void __launch_bounds__(THREADS)
    adamw_kernel(const __grid_constant__ adamw_table tab, adamw_scalars a,
                 const float* gscale_dev) {
  int b = blockIdx.x;
  int lo = 0, hi = tab.count - 1;
  while (lo < hi) {  // last tensor whose first block is <= b
    int mid = (lo + hi + 1) / 2;
    if (tab.first_block[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  int t = lo;
  int64_t start = (int64_t)(b - tab.first_block[t]) * CHUNK;
  int64_t end = start + CHUNK < tab.n[t] ? start + CHUNK : tab.n[t];
  float gs = a.gscale * (gscale_dev ? *gscale_dev : 1.0f);
  float decay = tab.decay[t];
  float* P = tab.p[t];
  const float* G = tab.g[t];
  float* M = tab.m[t];
  float* Vv = tab.v[t];
  bf16* PB = tab.pb[t];
  for (int64_t i = start + threadIdx.x; i < end; i += THREADS) {
    float g = G[i] * gs;
    float p = P[i] * decay;
    float m = a.b1 * M[i] + (1.0f - a.b1) * g;
    float v = a.b2 * Vv[i] + (1.0f - a.b2) * g * g;
    float denom = sqrtf(v) / a.bc2_sqrt + a.eps;
    p = p - a.step_size * (m / denom);
    P[i] = p;
    M[i] = m;
    Vv[i] = v;
    if (PB) PB[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

// ---- launchers ----

extern "C" int tr_kern_cuda_adamw(const tr_cuda_adamw_tensor_t* tensors,
                                  int n_tensors, const tr_adamw_args_t* args,
                                  const float* grad_scale_dev,
                                  tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(args && args->step >= 1, "adamw: step must be >= 1");
  TR_CUDA_REQUIRE(n_tensors >= 0 && (tensors || n_tensors == 0),
                  "adamw: bad tensor list");
  double bc1 = 1.0 - pow(args->beta1, (double)args->step);
  double bc2 = 1.0 - pow(args->beta2, (double)args->step);
  adamw_scalars sc;
  sc.b1 = args->beta1;
  sc.b2 = args->beta2;
  sc.eps = args->eps;
  sc.step_size = (float)(args->lr / bc1);
  sc.bc2_sqrt = (float)sqrt(bc2);
  sc.gscale = args->grad_scale;
  float decay = 1.0f - args->lr * args->weight_decay;
  int i = 0;
  while (i < n_tensors) {
    adamw_table tab;
    memset(&tab, 0, sizeof tab);
    int64_t blocks = 0;
    for (; i < n_tensors && tab.count < MT_MAX; i++) {
      const tr_cuda_adamw_tensor_t* t = &tensors[i];
      TR_CUDA_REQUIRE(
          t->n >= 0 && (t->n == 0 || (t->param && t->grad && t->m && t->v)),
          "adamw: tensor %d lacks a buffer", i);
      if (t->n == 0) continue;
      int64_t nb = (t->n + CHUNK - 1) / CHUNK;
      if (tab.count > 0 && blocks + nb > 0x7fffffffLL) break;
      TR_CUDA_REQUIRE(nb <= 0x7fffffffLL, "adamw: tensor %d too large", i);
      int c = tab.count++;
      tab.p[c] = t->param;
      tab.g[c] = t->grad;
      tab.m[c] = t->m;
      tab.v[c] = t->v;
      tab.pb[c] = (bf16*)t->param_bf16;
      tab.n[c] = t->n;
      tab.decay[c] = t->decay ? decay : 1.0f;
      tab.first_block[c] = (int)blocks;
      blocks += nb;
    }
    if (tab.count == 0) continue;
    tab.first_block[tab.count] = (int)blocks;
    adamw_kernel<<<(unsigned)blocks, THREADS, 0, s>>>(tab, sc, grad_scale_dev);
    TR_CHECK(TR_CUDA_LAUNCHED("adamw_kernel"));
  }
  return 0;
}
