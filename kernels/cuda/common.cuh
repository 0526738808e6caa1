// kernels/cuda/common.cuh: what every CUDA kernel file shares: the error
// conversion at the CUDA boundary, element types and 16-byte packed
// loads/stores, warp and block reductions, the dtype dispatch of launchers,
// stream-ordered temporaries, and the internal entry points that one op file
// offers another (column sums, the fp32 table).
#ifndef TRAINRUN_KERNELS_CUDA_COMMON_CUH
#define TRAINRUN_KERNELS_CUDA_COMMON_CUH

#include "config.h"

#include <cuda_bf16.h>     // __nv_bfloat16 and its conversions
#include <cuda_runtime.h>  // runtime API, streams, events
#include <cublasLt.h>      // cuBLASLt types (the library: tr__cublaslt)
#include <math.h>
#include <stdint.h>

#include "trainrun/error.h"         // TR_E* codes
#include "trainrun/kernels_cuda.h"  // the public contracts
#include "trainrun/log.h"           // TR_LOG_ERROR(KERN, ...)

typedef __nv_bfloat16 bf16;

// ---- errors at the CUDA boundary ----

// Log CUDA's message for e (with what failed and where) and return TR_ECUDA
// (TR_ENOMEM for an allocation failure); 0 for cudaSuccess.
int tr__cuda_error(cudaError_t e, const char* what, const char* file, int line);
#define TR_CUDA_CALL(call) tr__cuda_error((call), #call, __FILE__, __LINE__)
// After a kernel launch: the launch error, if any, named after the kernel.
#define TR_CUDA_LAUNCHED(name) \
  tr__cuda_error(cudaGetLastError(), name " launch", __FILE__, __LINE__)
// A launcher's shape/argument assertion: log and return TR_EINVAL.
#define TR_CUDA_REQUIRE(cond, ...)     \
  do {                                 \
    if (!(cond)) {                     \
      TR_LOG_ERROR(KERN, __VA_ARGS__); \
      return TR_EINVAL;                \
    }                                  \
  } while (0)

// Run `body` with T bound to the C++ element type of dt (float or bf16);
// any other dtype logs and returns TR_EDTYPE from the enclosing function.
#define TR_CUDA_DISPATCH(dt, T, ...)                                          \
  switch (dt) {                                                               \
    case TR_F32: {                                                            \
      typedef float T;                                                        \
      __VA_ARGS__;                                                            \
    } break;                                                                  \
    case TR_BF16: {                                                           \
      typedef bf16 T;                                                         \
      __VA_ARGS__;                                                            \
    } break;                                                                  \
    default:                                                                  \
      TR_LOG_ERROR(KERN, "the CUDA kernels take float32 or bfloat16, not %s", \
                   tr_dtype_name(dt));                                        \
      return TR_EDTYPE;                                                       \
  }

static inline bool tr__aligned16(const void* p) {
  return ((uintptr_t)p & 15u) == 0;
}

// Blocks for n items at `per` items a block, at least 1.
static inline unsigned tr__blocks(int64_t n, int64_t per) {
  int64_t b = (n + per - 1) / per;
  return (unsigned)(b < 1 ? 1 : b);
}

// ---- element types ----

__device__ __forceinline__ float tr_f(float x) { return x; }
__device__ __forceinline__ float tr_f(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T tr_to(float x);
template <>
__device__ __forceinline__ float tr_to<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 tr_to<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements of T in one 16-byte access.
template <typename T>
struct tr_vec {
  static constexpr int n = 16 / (int)sizeof(T);
};

// V consecutive elements moved as one access (16 bytes when V is
// tr_vec<T>::n, a plain element when V is 1).
template <typename T, int V>
struct alignas(sizeof(T) * V) tr_pack {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ void tr_load(float (&f)[V], const T* p) {
  tr_pack<T, V> k = *reinterpret_cast<const tr_pack<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = tr_f(k.v[i]);
}

template <typename T, int V>
__device__ __forceinline__ void tr_store(T* p, const float (&f)[V]) {
  tr_pack<T, V> k;
#pragma unroll
  for (int i = 0; i < V; i++) k.v[i] = tr_to<T>(f[i]);
  *reinterpret_cast<tr_pack<T, V>*>(p) = k;
}

// ---- reductions (fixed shuffle trees: deterministic) ----

__device__ __forceinline__ float tr_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float tr_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. sh: 32 floats of shared memory.
__device__ __forceinline__ float tr_block_sum(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int nw = blockDim.x >> 5;
  v = tr_warp_sum(v);
  __syncthreads();  // sh may still be read by a previous reduction
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.0f;
  return tr_warp_sum(v);
}

__device__ __forceinline__ float tr_block_max(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int nw = blockDim.x >> 5;
  v = tr_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -INFINITY;
  return tr_warp_max(v);
}

// ---- GELU (tanh approximation), shared by gelu.cu and matmul.cu ----

#define TR_GELU_K 0.7978845608028654f  // sqrt(2/pi)
#define TR_GELU_C 0.044715f

__device__ __forceinline__ float tr_gelu(float x) {
  float u = TR_GELU_K * (x + TR_GELU_C * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float tr_gelu_grad(float x) {
  float u = TR_GELU_K * (x + TR_GELU_C * x * x * x);
  float th = tanhf(u);
  float du = TR_GELU_K * (1.0f + 3.0f * TR_GELU_C * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// ---- elementwise launch ----

// Grid-stride elementwise kernel: op.template apply<V>(i) handles elements
// [i, i + V). The first n / V groups go in V-wide accesses, the remaining
// n % V elements one at a time.
template <int V, typename Op>
__global__ void tr__ew_kernel(Op op, int64_t n) {
  int64_t nv = n / V;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t i = i0; i < nv; i += stride) op.template apply<V>(i * V);
  if (V > 1 && i0 < n - nv * V) op.template apply<1>(nv * V + i0);
}

// Launch op over n elements: VN-wide accesses when vec_ok (every pointer
// 16-byte aligned), else one element per access.
template <int VN, typename Op>
static int tr__ew_launch(const Op& op, int64_t n, bool vec_ok, cudaStream_t s,
                         const char* name) {
  if (n <= 0) return 0;
  const int threads = 256;
  unsigned b = tr__blocks(vec_ok ? n / VN + 1 : n, threads);
  unsigned grid = b < 16384u ? b : 16384u;
  if (vec_ok)
    tr__ew_kernel<VN, Op><<<grid, threads, 0, s>>>(op, n);
  else
    tr__ew_kernel<1, Op><<<grid, threads, 0, s>>>(op, n);
  return tr__cuda_error(cudaGetLastError(), name, __FILE__, __LINE__);
}

// ---- runtime helpers (runtime.cu) ----

// Temporary device memory on stream s from the current device's pool
// (cudaMallocAsync; the pool keeps freed memory for reuse). Free with
// tr__cuda_tmp_free on the same stream once the kernels using it are
// enqueued.
int tr__cuda_tmp_alloc(void** p, size_t bytes, cudaStream_t s);
void tr__cuda_tmp_free(void* p, cudaStream_t s);
// Current device and its properties (cached per device).
int tr__cuda_device(int* dev);
int tr__cuda_sm_count(void);
// Largest dynamic shared memory a block may opt into, in bytes.
int tr__cuda_smem_optin(void);

// ---- candidates timed in interleaved rounds (tune.cu): the GEMMs'
// algorithms and cuDNN attention's engine configs ----

#define TR_TUNE_CANDS 16  // candidates a timing holds
#define TR_TUNE_REPS 5    // timed runs a candidate

typedef struct {
  // ev[0] before the first timed run, ev[j] (0 < j < n) after a run of
  // candidate cand[j]
  cudaEvent_t ev[1 + TR_TUNE_REPS * TR_TUNE_CANDS];
  signed char cand[1 + TR_TUNE_REPS * TR_TUNE_CANDS];
  int n;
} tr__tune_t;

// One launch of candidate i in the caller's context ctx: 0, or nonzero
// when it failed.
typedef int (*tr__tune_launch_fn)(void* ctx, int i);

// Enqueue on s: ev[0], then TR_TUNE_REPS rounds of one launch of each
// candidate i < ncand with live[i] (the caller's warm-up round found it
// runs), in turn, an event after each; a failed launch or record stops the
// rounds there. Nothing unless live[0] (the pick to compare with) and
// another candidate are live. 1: timings under way (t->n > 1); 0: none (t
// empty). An error it met is cleared: it is not the caller's.
int tr__tune_rounds(tr__tune_t* t, int ncand, const int* live,
                    tr__tune_launch_fn launch, void* ctx, cudaStream_t s);
// No wait: once t's last event has completed, best[i] (i < ncand) gets
// candidate i's shortest run in ms (-1: none), t's events are freed and 1
// is returned; -1 (t freed) when the timings failed or t holds none; 0
// while they still run.
int tr__tune_read(tr__tune_t* t, int ncand, float* best);
void tr__tune_free(tr__tune_t* t);
// The candidate to keep from tr__tune_read's best[] (n candidates, 0 the
// pick to compare with): the one with the shortest run where it beats
// candidate 0's by 3% and candidate 0's run took at least 20 us (shorter
// ones may time the host's launches, not the GPU's), else 0; -1 when
// candidate 0 or every other has no run (nothing was compared).
int tr__tune_pick(const float* best, int n);
// 1 when timings may be enqueued on s: no error pending (it is the
// caller's: timing runs would clear it) and s not capturing a graph.
int tr__tune_may_start(cudaStream_t s);

// ---- swiglu.cu ----

// tr_kern_cuda_swiglu_bwd with dgate and dup overwritten (not added to):
// the table's swiglu_bwd_write.
int tr__cuda_swiglu_bwd_write(tr_dtype_t dt, void* dgate, void* dup,
                              const void* dout, const void* gate,
                              const void* up, int64_t n, cudaStream_t s);

// ---- cuBLASLt, loaded on first use (cublaslt_load.cu) ----

// Every cuBLASLt function trainrun calls, each once: X(name). The library
// is not linked; matmul.cu calls these only through tr__cublaslt's table.
#define TR__CUBLASLT_FUNCS(X)             \
  X(cublasLtGetVersion)                   \
  X(cublasLtGetStatusString)              \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)     \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmul)

// One pointer per function, named and typed after it (t->cublasLtMatmul).
#define TR__CUBLASLT_MEMBER(fn) decltype(&::fn) fn;
typedef struct {
  TR__CUBLASLT_FUNCS(TR__CUBLASLT_MEMBER)
} tr__cublaslt_t;
#undef TR__CUBLASLT_MEMBER

// The table, after loading libcublasLt (the soname of the headers' major
// version, else libcublasLt.so) with dlopen and resolving every function,
// once per process (thread-safe); later calls return the same table. A
// failed load, a missing function or another major version logs the library
// and dlerror() and returns TR_ECUDA, then and on every later call.
int tr__cublaslt(const tr__cublaslt_t** out);

// ---- internal entry points between op files ----

// Column sums of a row-major [N, C] gradient, fixed-order, into fp32
// accumulators (+=); see reduce.cu. Modes:
//   TR__COLSUM_BIAS: out1[c] += sum_r dout[r,c]
//   TR__COLSUM_LN:   out1[c] += sum_r dout[r,c] (x[r,c] - mean[r]) rstd[r]
//                    out2[c] += sum_r dout[r,c]
//   TR__COLSUM_RMS:  out1[c] += sum_r dout[r,c] x[r,c] rstd[r]
// Outputs may be NULL (not wanted).
enum { TR__COLSUM_BIAS = 0, TR__COLSUM_LN = 1, TR__COLSUM_RMS = 2 };
int tr__cuda_colsum(tr_dtype_t dt, int mode, float* out1, float* out2,
                    const void* dout, const void* inp, const float* mean,
                    const float* rstd, int64_t N, int C, cudaStream_t s);
// The chunking of those sums (a function of N alone): nchunks row chunks of
// rows_per rows (the last may be shorter), and the second launch that adds
// partials [nchunks][2][C] (fp32, chunk k's two sums at (2k)C and (2k+1)C)
// in chunk order into out1/out2 (+=; either may be NULL): the fused norm
// backward (norms.cu) writes such partials itself.
void tr__cuda_colsum_chunks(int64_t N, int* nchunks, int64_t* rows_per);
int tr__cuda_colsum_final(float* out1, float* out2, const float* part,
                          int nchunks, int C, cudaStream_t s);

// y[r, c] += bias[c] for an [M, N] matrix with row stride ld (matmul.cu's
// fallback when cuBLASLt offers no bias epilogue); bias has C's dtype.
int tr__cuda_add_bias(tr_dtype_t dt, void* y, int64_t ld, const void* bias,
                      int64_t M, int64_t N, cudaStream_t s);
// In place on an [M, N] matrix with row stride ld: y = gelu(y) with the
// input kept in aux (ldaux) when aux != NULL, or (dgelu) y = y *
// gelu'(aux). gelu.cu; matmul.cu's epilogue fallback.
int tr__cuda_gelu_rows(tr_dtype_t dt, void* y, int64_t ld, void* aux,
                       int64_t ldaux, int64_t M, int64_t N, int dgelu,
                       cudaStream_t s);

// Tensor-core flash attention (flash_attention.cu): 1 when it handles these
// arguments, then the two calls below do the work.
int tr__flash_applies(tr_dtype_t dt, int D, const void* q, const void* k,
                      const void* v, int64_t qs, int64_t kvs);
int tr__flash_fwd(bf16* out, float* lse, const bf16* q, const bf16* k,
                  const bf16* v, int B, int T, int H, int KVH, int D,
                  int64_t qs, int64_t kvs, const tr_kern_attn_mask_t* mask,
                  cudaStream_t s);
int tr__flash_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                  const bf16* k, const bf16* v, const float* dsum,
                  const float* lse, int B, int T, int H, int KVH, int D,
                  int64_t qs, int64_t kvs, const tr_kern_attn_mask_t* mask,
                  int accumulate, cudaStream_t s);

// cuDNN fused attention (cudnn_attention.cu, builds with HAVE_CUDNN): 1
// when the arguments are of a kind cuDNN may take (bf16, D % 8 == 0,
// D <= 128, 16-byte aligned pointers and rows). fwd/bwd return
// TR_EUNSUPPORTED, having enqueued nothing, when cuDNN declines the shape
// (warned once per shape); the caller then runs the flash or SIMT kernels.
// Their lse/Stats is the natural-log log-sum-exp, as the other kernels'.
// causal 1: row i sees keys 0..i; 0: every row sees every key. docs (or
// NULL; with causal 1): a mask with a document table [B*T] on the device,
// without window or shift: each document runs as a sequence of its own (a
// ragged graph), sized by the mask's n_docs and longest_doc, or when
// those are 0 by a count on the device that the host waits for.
// TR_EUNSUPPORTED too when the table is not one of contiguous
// documents, cuDNN is older than 9.6, H is not a multiple of 4, the
// padded sequences (document count and longest document, each rounded up
// to a power of two) exceed 32 times the rows, or the backward's dense
// buffers over them would take more than a quarter of the free memory.
int tr__cudnn_attn_applies(tr_dtype_t dt, int D, const void* q, const void* k,
                           const void* v, int64_t qs, int64_t kvs);
int tr__cudnn_attn_fwd(bf16* out, float* lse, const bf16* q, const bf16* k,
                       const bf16* v, int B, int T, int H, int KVH, int D,
                       int64_t qs, int64_t kvs, int causal,
                       const tr_kern_attn_mask_t* docs, cudaStream_t s);
int tr__cudnn_attn_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                       const bf16* q, const bf16* k, const bf16* v,
                       const bf16* out, const float* lse, int B, int T, int H,
                       int KVH, int D, int64_t qs, int64_t kvs, int accumulate,
                       int causal, const tr_kern_attn_mask_t* docs,
                       cudaStream_t s);
// What tr_kern_cuda_set_deterministic asked for: 0 (default), 1
// (deterministic kernels only), 2 (deterministic, warn instead of refusing).
int tr__cuda_deterministic(void);
// Destroy cached cuDNN plans and handles (from tr_kern_cuda_release).
void tr__cudnn_attn_release(void);

#endif  // TRAINRUN_KERNELS_CUDA_COMMON_CUH
