// kernels/cuda/attention.cu: causal attention with grouped-query heads,
// forward and backward, never holding a T x T matrix: the portable kernels
// (fp32 or bf16 storage, fp32 arithmetic on CUDA cores, head dims up to 256)
// and the dispatcher that sends bf16 work to cuDNN's fused attention
// (cudnn_attention.cu, in builds with cuDNN) or the tensor-core kernels of
// flash_attention.cu when they apply. The implementation comes from
// tr_kern_cuda_set_attention, else TRAINRUN_ATTENTION (read once). Every
// implementation's lse is the natural-log log-sum-exp of the scaled scores,
// so a forward and its backward need not use the same one: when cuDNN
// declines a shape (warned once per shape) the flash/SIMT kernels run.
//
// The portable kernels work on 32 x 32 tiles kept in shared memory as fp32
// (rows padded by one float, so column walks do not collide in a bank):
//  - forward: a block per (batch, head, 32 queries) walks the key tiles up
//    to the diagonal with an online softmax (running max and sum per row),
//    and writes out and the log-sum-exp of each row;
//  - backward: D_i = dout_i . out_i first; then a block per (batch, kv
//    head, 32 keys) walks the query heads of its group and the query tiles
//    from the diagonal on, rebuilding P = exp(s - lse) and dS = P (dP - D)
//    and summing dK and dV in registers; a second kernel, a block per
//    (batch, head, 32 queries), rebuilds them again for dQ. Every gradient
//    element is summed by one thread in a fixed order: no atomics.
//
// Masks (tr_kern_attn_mask_t): row i sees keys lo(i)..last(i), last(i) =
// min(i + q_shift, T - 1) (i without a shift). The forward and dQ blocks
// walk the key tiles from the smallest lo of their rows to the last key
// of their last row; the dK/dV blocks start at the first query tile whose
// rows reach their keys and skip the tiles none of whose rows' lo does;
// inside a tile the keys outside a row's run are masked like future keys.
// A row that sees no key (a shifted chunk) gets out 0 and lse -inf.
// Of the masked calls only document masks (no window, no shift) go to
// cuDNN, each document a sequence of a ragged graph (cudnn_attention.cu);
// windows and shifted chunks have per-row bounds its graphs lack.
#include "kernels/cuda/common.cuh"

#include <pthread.h>
#include <string.h>

#include "trainrun/param.h"  // TRAINRUN_ATTENTION

#define TILE 32
#define THREADS 256  // 8 warps; thread t owns row t / 8 and dims t % 8 + 8 m

// ---- kernels ----

namespace {

struct attn_args {
  int B, T, H, KVH, D;
  int64_t qs, kvs;
  float scale;
  const int32_t* doc_start;  // [B*T] or NULL
  int window;                // 0: none
  int shift;                 // query row i stands at key position i + shift
};

// first key row i (< T) of batch b sees
__device__ inline int row_lo(const attn_args& a, int b, int i) {
  int lo = a.doc_start ? a.doc_start[(int64_t)b * a.T + i] : 0;
  int w = i + a.shift - a.window + 1;
  if (a.window > 0 && w > lo) lo = w;
  return lo;
}

// last key row i (< T) sees (< row_lo: none)
__device__ inline int row_last(const attn_args& a, int i) {
  return min(i + a.shift, a.T - 1);
}

// one past the last key tile the rows q0..q0+TILE-1 see (the first tile
// when they see none)
__device__ inline int tile_end(const attn_args& a, int q0, int kt0) {
  int last = row_last(a, min(q0 + TILE - 1, a.T - 1));
  return last < kt0 * TILE ? kt0 : last / TILE + 1;
}

// lo_s[r] = row_lo of row q0 + r (T for rows past the end, which see
// nothing); returns the smallest over the tile. Called by the whole block.
__device__ int tile_lo(int* lo_s, const attn_args& a, int b, int q0) {
  __shared__ int min_s;
  if (threadIdx.x < 32) {
    int qi = q0 + threadIdx.x;
    int lo = qi < a.T ? row_lo(a, b, qi) : a.T;
    lo_s[threadIdx.x] = lo;
    int m = lo;
    for (int o = 16; o > 0; o /= 2)
      m = min(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) min_s = m;
  }
  __syncthreads();
  return min_s;
}

// Shared-memory layout (floats): tiles of TILE rows with stride LD = D + 1.
__host__ __device__ inline int tile_floats(int D) { return TILE * (D + 1); }

// rows [r0, r0 + TILE) of a [*, D] slice with row stride rs -> smem (fp32),
// rows >= nvalid become zeros
template <typename T>
__device__ void load_tile(float* dst, const T* src, int r0, int nvalid,
                          int64_t rs, int D) {
  int ld = D + 1;
  for (int e = threadIdx.x; e < TILE * D; e += THREADS) {
    int r = e / D, d = e % D;
    dst[r * ld + d] =
        r0 + r < nvalid ? tr_f(src[(int64_t)(r0 + r) * rs + d]) : 0.0f;
  }
}

// S[i][j] = a_i . b_j over D for the 4 entries (t / 8, t % 8 + 8 k) of
// this thread
__device__ void dot_tile(float (&out)[4], const float* a, const float* b,
                         int D) {
  int ld = D + 1, i = threadIdx.x / 8, j0 = threadIdx.x % 8;
#pragma unroll
  for (int k = 0; k < 4; k++) out[k] = 0.0f;
  for (int d = 0; d < D; d++) {
    float av = a[i * ld + d];
#pragma unroll
    for (int k = 0; k < 4; k++) out[k] += av * b[(j0 + 8 * k) * ld + d];
  }
}

template <typename T, int MAXM>
__global__ void __launch_bounds__(THREADS)
    attn_fwd_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                    attn_args a) {
  extern __shared__ float smem[];
  int D = a.D, ld = D + 1;
  float* Qs = smem;
  float* Ks = Qs + tile_floats(D);
  float* Vs = Ks + tile_floats(D);
  float* S = Vs + tile_floats(D);  // [TILE][TILE + 1]
  float* mrow = S + TILE * (TILE + 1);
  float* lrow = mrow + TILE;
  float* corr = lrow + TILE;
  int* lo_s = (int*)(corr + TILE);
  int nq = gridDim.x;
  int qt = nq - 1 - blockIdx.x;  // heaviest tiles first
  int h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (a.H / a.KVH);
  int q0 = qt * TILE;
  const T* qb = q + (int64_t)b * a.T * a.qs + (int64_t)h * D;
  const T* kb = k + (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  const T* vb = v + (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  load_tile(Qs, qb, q0, a.T, a.qs, D);
  if (threadIdx.x < TILE) {
    mrow[threadIdx.x] = -INFINITY;
    lrow[threadIdx.x] = 0.0f;
  }
  int i = threadIdx.x / 8, dm = threadIdx.x % 8;
  float acc[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; m++) acc[m] = 0.0f;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int kt0 = tile_lo(lo_s, a, b, q0) / TILE, kt1 = tile_end(a, q0, kt0);
  int lo_i = lo_s[i];
  for (int kt = kt0; kt < kt1; kt++) {
    int k0 = kt * TILE;
    __syncthreads();  // previous tile's readers are done
    load_tile(Ks, kb, k0, a.T, a.kvs, D);
    load_tile(Vs, vb, k0, a.T, a.kvs, D);
    __syncthreads();
    float sc[4];
    dot_tile(sc, Qs, Ks, D);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      int j = threadIdx.x % 8 + 8 * kk;
      bool ok = k0 + j <= q0 + i + a.shift && k0 + j < a.T && k0 + j >= lo_i;
      S[i * (TILE + 1) + j] = ok ? sc[kk] * a.scale : -INFINITY;
    }
    __syncthreads();
    // online softmax: warp w updates rows 4w .. 4w + 3, lane = key
    for (int r = warp * 4; r < warp * 4 + 4; r++) {
      float s = S[r * (TILE + 1) + lane];
      float mt = tr_warp_max(s);
      float mo = mrow[r];
      float mn = fmaxf(mo, mt);
      float p = s == -INFINITY ? 0.0f : expf(s - mn);
      float ps = tr_warp_sum(p);
      __syncwarp();
      S[r * (TILE + 1) + lane] = p;
      if (lane == 0) {
        float c = mo == -INFINITY ? 0.0f : expf(mo - mn);
        corr[r] = c;
        lrow[r] = lrow[r] * c + ps;
        mrow[r] = mn;
      }
    }
    __syncthreads();
    float c = corr[i];
#pragma unroll
    for (int m = 0; m < MAXM; m++) {
      int d = dm + 8 * m;
      if (d < D) {
        float t = acc[m] * c;
        for (int j = 0; j < TILE; j++)
          t += S[i * (TILE + 1) + j] * Vs[j * ld + d];
        acc[m] = t;
      }
    }
  }
  __syncthreads();
  int qi = q0 + i;
  if (qi < a.T) {
    float l = lrow[i];  // 0: the row sees no key (out 0, lse -inf)
    T* o = out + ((int64_t)b * a.T + qi) * ((int64_t)a.H * D) + (int64_t)h * D;
#pragma unroll
    for (int m = 0; m < MAXM; m++) {
      int d = dm + 8 * m;
      if (d < D) o[d] = tr_to<T>(l > 0.0f ? acc[m] / l : 0.0f);
    }
    if (dm == 0)
      lse[((int64_t)b * a.H + h) * a.T + qi] =
          l > 0.0f ? mrow[i] + logf(l) : -INFINITY;
  }
}

// dsum[b,h,t] = sum_d dout . out (warp per row)
template <typename T>
__global__ void attn_dsum_kernel(float* dsum, const T* dout, const T* out,
                                 int B, int T_, int H, int D) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= (int64_t)B * T_ * H) return;
  int lane = threadIdx.x % 32;
  int h = (int)(row % H);
  int64_t bt = row / H;
  const T* o = out + bt * ((int64_t)H * D) + (int64_t)h * D;
  const T* g = dout + bt * ((int64_t)H * D) + (int64_t)h * D;
  float s = 0.0f;
  for (int d = lane; d < D; d += 32) s += tr_f(o[d]) * tr_f(g[d]);
  s = tr_warp_sum(s);
  if (lane == 0) {
    int64_t b = bt / T_, t = bt % T_;
    dsum[(b * H + h) * T_ + t] = s;
  }
}

// acc, lse merged with pout, plse (trainrun/kernels.h's attn_merge): a
// warp per (batch, row, head), lanes along the head dim
template <typename T>
__global__ void attn_merge_kernel(float* acc, float* lse, const T* pout,
                                  const float* plse, int B, int T_, int H,
                                  int D) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= (int64_t)B * T_ * H) return;
  int lane = threadIdx.x % 32;
  int h = (int)(row % H);
  int64_t bt = row / H, b = bt / T_, t = bt % T_;
  int64_t li = (b * H + h) * T_ + t;
  float x = lse[li], y = plse[li], mx = fmaxf(x, y);
  if (mx == -INFINITY) return;  // neither has seen a key
  float L = mx + logf(expf(x - mx) + expf(y - mx));
  float wx = expf(x - L), wy = expf(y - L);
  __syncwarp();  // every lane has read lse[li]
  if (lane == 0) lse[li] = L;
  int64_t o = bt * ((int64_t)H * D) + (int64_t)h * D;
  for (int d = lane; d < D; d += 32)
    acc[o + d] = wx * acc[o + d] + wy * tr_f(pout[o + d]);
}

// P and dS of one (query tile, key tile) pair into Ps / dSs
__device__ void p_ds_tile(float* Ps, float* dSs, const float* Qs,
                          const float* Ks, const float* dOs, const float* Vs,
                          const float* lse_s, const float* dsum_s,
                          const int* lo_s, int q0, int k0, int T, int D,
                          float scale, int shift) {
  float sc[4], dp[4];
  dot_tile(sc, Qs, Ks, D);
  dot_tile(dp, dOs, Vs, D);
  int i = threadIdx.x / 8;
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    int j = threadIdx.x % 8 + 8 * kk;
    bool ok = k0 + j <= q0 + i + shift && k0 + j < T && q0 + i < T &&
              k0 + j >= lo_s[i];
    float p = ok ? expf(sc[kk] * scale - lse_s[i]) : 0.0f;
    Ps[i * (TILE + 1) + j] = p;
    dSs[i * (TILE + 1) + j] = p * (dp[kk] - dsum_s[i]);
  }
}

template <typename T, int MAXM>
__global__ void __launch_bounds__(THREADS)
    attn_bwd_dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k,
                         const T* v, const float* dsum, const float* lse,
                         attn_args a, int accumulate) {
  extern __shared__ float smem[];
  int D = a.D, ld = D + 1;
  float* Ks = smem;
  float* Vs = Ks + tile_floats(D);
  float* Qs = Vs + tile_floats(D);
  float* dOs = Qs + tile_floats(D);
  float* Ps = dOs + tile_floats(D);
  float* dSs = Ps + TILE * (TILE + 1);
  float* lse_s = dSs + TILE * (TILE + 1);
  float* dsum_s = lse_s + TILE;
  int* lo_s = (int*)(dsum_s + TILE);
  int nt = gridDim.x;
  int kt = blockIdx.x;
  int kvh = blockIdx.y, b = blockIdx.z;
  int group = a.H / a.KVH;
  int k0 = kt * TILE;
  int64_t kvoff = (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  load_tile(Ks, k + kvoff, k0, a.T, a.kvs, D);
  load_tile(Vs, v + kvoff, k0, a.T, a.kvs, D);
  int j = threadIdx.x / 8, dm = threadIdx.x % 8;
  float ak[MAXM], av[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; m++) ak[m] = av[m] = 0.0f;
  int64_t HD = (int64_t)a.H * D;
  // the first query row that reaches these keys is k0 - shift
  int qt0 = max(k0 - a.shift, 0) / TILE;
  for (int h = kvh * group; h < (kvh + 1) * group; h++) {
    const T* qb = q + (int64_t)b * a.T * a.qs + (int64_t)h * D;
    const T* gb = dout + (int64_t)b * a.T * HD + (int64_t)h * D;
    const float* lb = lse + ((int64_t)b * a.H + h) * a.T;
    const float* db = dsum + ((int64_t)b * a.H + h) * a.T;
    for (int qt = qt0; qt < nt; qt++) {
      int q0 = qt * TILE;
      __syncthreads();
      // no row of this query tile reaches these keys
      if (tile_lo(lo_s, a, b, q0) > k0 + TILE - 1) continue;
      load_tile(Qs, qb, q0, a.T, a.qs, D);
      load_tile(dOs, gb, q0, a.T, HD, D);
      if (threadIdx.x < TILE) {
        int qi = q0 + threadIdx.x;
        lse_s[threadIdx.x] = qi < a.T ? lb[qi] : 0.0f;
        dsum_s[threadIdx.x] = qi < a.T ? db[qi] : 0.0f;
      }
      __syncthreads();
      p_ds_tile(Ps, dSs, Qs, Ks, dOs, Vs, lse_s, dsum_s, lo_s, q0, k0, a.T, D,
                a.scale, a.shift);
      __syncthreads();
#pragma unroll
      for (int m = 0; m < MAXM; m++) {
        int d = dm + 8 * m;
        if (d < D) {
          float sv = av[m], sk = ak[m];
          for (int i = 0; i < TILE; i++) {
            sv += Ps[i * (TILE + 1) + j] * dOs[i * ld + d];
            sk += dSs[i * (TILE + 1) + j] * Qs[i * ld + d];
          }
          av[m] = sv;
          ak[m] = sk;
        }
      }
    }
  }
  int kj = k0 + j;
  if (kj < a.T) {
    T* dkr = dk + kvoff + (int64_t)kj * a.kvs;
    T* dvr = dv + kvoff + (int64_t)kj * a.kvs;
#pragma unroll
    for (int m = 0; m < MAXM; m++) {
      int d = dm + 8 * m;
      if (d < D) {
        float gk = ak[m] * a.scale, gv = av[m];
        if (accumulate) {
          gk += tr_f(dkr[d]);
          gv += tr_f(dvr[d]);
        }
        dkr[d] = tr_to<T>(gk);
        dvr[d] = tr_to<T>(gv);
      }
    }
  }
}

template <typename T, int MAXM>
__global__ void __launch_bounds__(THREADS)
    attn_bwd_dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v,
                       const float* dsum, const float* lse, attn_args a,
                       int accumulate) {
  extern __shared__ float smem[];
  int D = a.D;
  float* Qs = smem;
  float* dOs = Qs + tile_floats(D);
  float* Ks = dOs + tile_floats(D);
  float* Vs = Ks + tile_floats(D);
  float* Ps = Vs + tile_floats(D);
  float* dSs = Ps + TILE * (TILE + 1);
  float* lse_s = dSs + TILE * (TILE + 1);
  float* dsum_s = lse_s + TILE;
  int* lo_s = (int*)(dsum_s + TILE);
  int nq = gridDim.x;
  int qt = nq - 1 - blockIdx.x;
  int h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (a.H / a.KVH);
  int q0 = qt * TILE;
  int64_t HD = (int64_t)a.H * D;
  int64_t qoff = (int64_t)b * a.T * a.qs + (int64_t)h * D;
  int64_t kvoff = (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  load_tile(Qs, q + qoff, q0, a.T, a.qs, D);
  load_tile(dOs, dout + (int64_t)b * a.T * HD + (int64_t)h * D, q0, a.T, HD, D);
  if (threadIdx.x < TILE) {
    int qi = q0 + threadIdx.x;
    int64_t o = ((int64_t)b * a.H + h) * a.T + qi;
    lse_s[threadIdx.x] = qi < a.T ? lse[o] : 0.0f;
    dsum_s[threadIdx.x] = qi < a.T ? dsum[o] : 0.0f;
  }
  int i = threadIdx.x / 8, dm = threadIdx.x % 8;
  int ld = D + 1;
  float aq[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; m++) aq[m] = 0.0f;
  int kt0 = tile_lo(lo_s, a, b, q0) / TILE, kt1 = tile_end(a, q0, kt0);
  for (int kt = kt0; kt < kt1; kt++) {
    int k0 = kt * TILE;
    __syncthreads();
    load_tile(Ks, k + kvoff, k0, a.T, a.kvs, D);
    load_tile(Vs, v + kvoff, k0, a.T, a.kvs, D);
    __syncthreads();
    p_ds_tile(Ps, dSs, Qs, Ks, dOs, Vs, lse_s, dsum_s, lo_s, q0, k0, a.T, D,
              a.scale, a.shift);
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MAXM; m++) {
      int d = dm + 8 * m;
      if (d < D) {
        float t = aq[m];
        for (int j = 0; j < TILE; j++)
          t += dSs[i * (TILE + 1) + j] * Ks[j * ld + d];
        aq[m] = t;
      }
    }
  }
  int qi = q0 + i;
  if (qi < a.T) {
    T* r = dq + qoff + (int64_t)qi * a.qs;
#pragma unroll
    for (int m = 0; m < MAXM; m++) {
      int d = dm + 8 * m;
      if (d < D) {
        float g = aq[m] * a.scale;
        if (accumulate) g += tr_f(r[d]);
        r[d] = tr_to<T>(g);
      }
    }
  }
}

size_t fwd_smem(int D) {
  return sizeof(float) *
         (3 * (size_t)tile_floats(D) + TILE * (TILE + 1) + 4 * TILE);
}
size_t bwd_smem(int D) {
  return sizeof(float) *
         (4 * (size_t)tile_floats(D) + 2 * TILE * (TILE + 1) + 3 * TILE);
}

// Raise a kernel's dynamic shared-memory limit to what it needs.
template <typename K>
int smem_limit(K kernel, size_t bytes, const char* name) {
  if (bytes <= 48 * 1024) return 0;
  if (bytes > (size_t)tr__cuda_smem_optin()) {
    TR_LOG_ERROR(KERN,
                 "%s: needs %zu bytes of shared memory, the device "
                 "offers %d",
                 name, bytes, tr__cuda_smem_optin());
    return TR_EUNSUPPORTED;
  }
  return TR_CUDA_CALL(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <typename T, int MAXM>
int simt_fwd(void* out, float* lse, const void* q, const void* k, const void* v,
             const attn_args& a, cudaStream_t s) {
  size_t sm = fwd_smem(a.D);
  TR_CHECK(smem_limit(attn_fwd_kernel<T, MAXM>, sm, "attention_fwd"));
  dim3 grid((a.T + TILE - 1) / TILE, a.H, a.B);
  attn_fwd_kernel<T, MAXM><<<grid, THREADS, sm, s>>>(
      (T*)out, lse, (const T*)q, (const T*)k, (const T*)v, a);
  return TR_CUDA_LAUNCHED("attn_fwd_kernel");
}

template <typename T, int MAXM>
int simt_bwd(void* dq, void* dk, void* dv, const void* dout, const void* q,
             const void* k, const void* v, const float* dsum, const float* lse,
             const attn_args& a, int accumulate, cudaStream_t s) {
  size_t sm = bwd_smem(a.D);
  TR_CHECK(smem_limit(attn_bwd_dkdv_kernel<T, MAXM>, sm, "attention_bwd"));
  TR_CHECK(smem_limit(attn_bwd_dq_kernel<T, MAXM>, sm, "attention_bwd"));
  int nt = (a.T + TILE - 1) / TILE;
  attn_bwd_dkdv_kernel<T, MAXM><<<dim3(nt, a.KVH, a.B), THREADS, sm, s>>>(
      (T*)dk, (T*)dv, (const T*)dout, (const T*)q, (const T*)k, (const T*)v,
      dsum, lse, a, accumulate);
  TR_CHECK(TR_CUDA_LAUNCHED("attn_bwd_dkdv_kernel"));
  attn_bwd_dq_kernel<T, MAXM><<<dim3(nt, a.H, a.B), THREADS, sm, s>>>(
      (T*)dq, (const T*)dout, (const T*)q, (const T*)k, (const T*)v, dsum, lse,
      a, accumulate);
  return TR_CUDA_LAUNCHED("attn_bwd_dq_kernel");
}

// MAXM: dims per thread, D <= 8 * MAXM (three sizes keep the number of
// instantiations, and the compile time, down)
#define TR__MAXM_DISPATCH(D, M, ...) \
  if ((D) <= 64) {                   \
    constexpr int M = 8;             \
    __VA_ARGS__;                     \
  } else if ((D) <= 128) {           \
    constexpr int M = 16;            \
    __VA_ARGS__;                     \
  } else {                           \
    constexpr int M = 32;            \
    __VA_ARGS__;                     \
  }

int check_args(const char* op, int B, int T, int H, int KVH, int D, int64_t qs,
               int64_t kvs) {
  TR_CUDA_REQUIRE(B >= 0 && T >= 0 && H > 0 && KVH > 0 && H % KVH == 0,
                  "%s: bad heads B=%d T=%d H=%d KVH=%d", op, B, T, H, KVH);
  TR_CUDA_REQUIRE(D > 0 && D <= 256, "%s: head dim %d not in [1, 256]", op, D);
  TR_CUDA_REQUIRE(qs >= (int64_t)H * D && kvs >= (int64_t)KVH * D,
                  "%s: row strides %lld/%lld too small", op, (long long)qs,
                  (long long)kvs);
  TR_CUDA_REQUIRE(B <= 65535 && H <= 65535, "%s: grid too large", op);
  return 0;
}

tr_cuda_attn_impl_t g_impl = TR_CUDA_ATTN_AUTO;
int g_deterministic = 0;  // tr_kern_cuda_set_deterministic
pthread_once_t g_impl_once = PTHREAD_ONCE_INIT;

// The default implementation from TRAINRUN_ATTENTION (once, before the
// first set or get).
void impl_from_env(void) {
  const char* v = tr_param_str(TR_PARAM_ATTENTION);
  tr_cuda_attn_impl_t impl = TR_CUDA_ATTN_AUTO;
  if (strcmp(v, "cudnn") == 0)
    impl = TR_CUDA_ATTN_CUDNN;
  else if (strcmp(v, "flash") == 0)
    impl = TR_CUDA_ATTN_FLASH;
  else if (strcmp(v, "simt") == 0)
    impl = TR_CUDA_ATTN_SIMT;
  else if (strcmp(v, "auto") != 0 && v[0] != '\0')
    TR_LOG_WARN(KERN,
                "TRAINRUN_ATTENTION='%s' is not auto, cudnn, flash or simt: "
                "using auto",
                v);
  __atomic_store_n(&g_impl, impl, __ATOMIC_RELAXED);
}

}  // namespace

// ---- launchers ----

extern "C" void tr_kern_cuda_set_attention(tr_cuda_attn_impl_t impl) {
  pthread_once(&g_impl_once, impl_from_env);
  __atomic_store_n(&g_impl, impl, __ATOMIC_RELAXED);
}

extern "C" void tr_kern_cuda_set_deterministic(int on, int warn_only) {
  __atomic_store_n(&g_deterministic, on ? (warn_only ? 2 : 1) : 0,
                   __ATOMIC_RELAXED);
}

int tr__cuda_deterministic(void) {
  return __atomic_load_n(&g_deterministic, __ATOMIC_RELAXED);
}

extern "C" tr_cuda_attn_impl_t tr_kern_cuda_get_attention(void) {
  pthread_once(&g_impl_once, impl_from_env);
  return __atomic_load_n(&g_impl, __ATOMIC_RELAXED);
}

// A shifted call whose every row sees every key (context parallelism's
// pair of a query chunk and an earlier key chunk, no documents or window):
// cuDNN's full graph runs it.
static bool full_attention(const tr_kern_attn_mask_t* m, int T) {
  return m && !m->doc_start && m->window <= 0 && m->q_shift >= T - 1;
}

// Document masks alone (no window, no shift): cuDNN's ragged graph.
static bool docs_only(const tr_kern_attn_mask_t* m) {
  return m && m->doc_start && m->window <= 0 && m->q_shift == 0;
}

// cuDNN for this call? 1: try it (AUTO may still fall back when cuDNN
// declines), 0: no, < 0: error (CUDNN requested, not usable). A call with
// a window, or a shift that leaves a row part of the keys (bounded, a
// masked call that is not docs_only nor full_attention), never uses it.
static int use_cudnn(tr_dtype_t dt, int D, const void* q, const void* k,
                     const void* v, int64_t qs, int64_t kvs, bool others_ok,
                     bool bounded) {
  tr_cuda_attn_impl_t impl = tr_kern_cuda_get_attention();
  if (impl != TR_CUDA_ATTN_AUTO && impl != TR_CUDA_ATTN_CUDNN) return 0;
  if (bounded) {
    if (impl == TR_CUDA_ATTN_AUTO) return 0;
    TR_LOG_ERROR(KERN,
                 "attention: cuDNN attention does not take sliding-window "
                 "masks or a query chunk that sees part of a key chunk "
                 "(TRAINRUN_ATTENTION=flash or simt does)");
    return TR_EUNSUPPORTED;
  }
#ifdef HAVE_CUDNN
  int ok = others_ok && tr__cudnn_attn_applies(dt, D, q, k, v, qs, kvs);
#else
  (void)dt, (void)D, (void)q, (void)k, (void)v, (void)qs, (void)kvs;
  (void)others_ok;
  int ok = 0;
#endif
  if (impl == TR_CUDA_ATTN_CUDNN && !ok) {
    TR_LOG_ERROR(KERN,
                 "attention: cuDNN attention needs a build with cuDNN, "
                 "bfloat16, a head dim that is a multiple of 8 up to 128 "
                 "and 16-byte aligned rows");
    return TR_EUNSUPPORTED;
  }
  return ok;
}

// 1: tensor-core kernel, 0: SIMT, < 0: error (FLASH requested, not usable)
// (others_ok: the remaining buffers are 16-byte aligned too)
static int use_flash(tr_dtype_t dt, int D, const void* q, const void* k,
                     const void* v, int64_t qs, int64_t kvs, bool others_ok) {
  tr_cuda_attn_impl_t impl = tr_kern_cuda_get_attention();
  if (impl == TR_CUDA_ATTN_SIMT || impl == TR_CUDA_ATTN_CUDNN) return 0;
  int ok = others_ok && tr__flash_applies(dt, D, q, k, v, qs, kvs);
  if (impl == TR_CUDA_ATTN_FLASH && !ok) {
    TR_LOG_ERROR(KERN,
                 "attention: the tensor-core kernel needs bfloat16, "
                 "head dim 64 or 128 and 16-byte aligned rows");
    return TR_EUNSUPPORTED;
  }
  return ok;
}

extern "C" int tr_kern_cuda_attention_fwd(tr_dtype_t dt, void* out, float* lse,
                                          const void* q, const void* k,
                                          const void* v, int B, int T, int H,
                                          int KVH, int D, int64_t qs,
                                          int64_t kvs,
                                          const tr_kern_attn_mask_t* mask,
                                          tr_cuda_stream_t s) {
  TR_CHECK(check_args("attention_fwd", B, T, H, KVH, D, qs, kvs));
  if ((int64_t)B * T == 0) return 0;
  bool masked =
      mask && (mask->doc_start || mask->window > 0 || mask->q_shift != 0);
  bool full = masked && full_attention(mask, T);
  bool docs = masked && docs_only(mask);
  int cu = use_cudnn(dt, D, q, k, v, qs, kvs, tr__aligned16(out),
                     masked && !full && !docs);
  if (cu < 0) return cu;
#ifdef HAVE_CUDNN
  if (cu) {
    int rc = tr__cudnn_attn_fwd((bf16*)out, lse, (const bf16*)q, (const bf16*)k,
                                (const bf16*)v, B, T, H, KVH, D, qs, kvs, !full,
                                docs ? mask : NULL, s);
    // cuDNN declined the shape: an explicit request fails, AUTO falls back
    if (rc != TR_EUNSUPPORTED) return rc;
    if (tr_kern_cuda_get_attention() == TR_CUDA_ATTN_CUDNN) {
      TR_LOG_ERROR(KERN, "attention_fwd: cuDNN declined this shape");
      return rc;
    }
  }
#endif
  int fl = use_flash(dt, D, q, k, v, qs, kvs, tr__aligned16(out));
  if (fl < 0) return fl;
  if (fl)
    return tr__flash_fwd((bf16*)out, lse, (const bf16*)q, (const bf16*)k,
                         (const bf16*)v, B, T, H, KVH, D, qs, kvs,
                         masked ? mask : NULL, s);
  attn_args a = {B,
                 T,
                 H,
                 KVH,
                 D,
                 qs,
                 kvs,
                 1.0f / sqrtf((float)D),
                 masked ? mask->doc_start : NULL,
                 masked ? mask->window : 0,
                 masked ? mask->q_shift : 0};
  TR_CUDA_DISPATCH(dt, TT, {
    TR__MAXM_DISPATCH(D, M, return (simt_fwd<TT, M>(out, lse, q, k, v, a, s)));
  });
}

extern "C" int tr_kern_cuda_attn_merge(tr_dtype_t dt, float* acc, float* lse,
                                       const void* pout, const float* plse,
                                       int B, int T, int H, int D,
                                       tr_cuda_stream_t s) {
  TR_CUDA_REQUIRE(B >= 0 && T >= 0 && H > 0 && D > 0,
                  "attn_merge: bad shape B=%d T=%d H=%d D=%d", B, T, H, D);
  int64_t rows = (int64_t)B * T * H;
  if (rows == 0) return 0;
  TR_CUDA_DISPATCH(dt, TT, {
    attn_merge_kernel<TT><<<tr__blocks(rows, 8), 256, 0, s>>>(
        acc, lse, (const TT*)pout, plse, B, T, H, D);
    return TR_CUDA_LAUNCHED("attn_merge_kernel");
  });
}

extern "C" int tr_kern_cuda_attention_bwd(
    tr_dtype_t dt, void* dq, void* dk, void* dv, const void* dout,
    const void* q, const void* k, const void* v, const void* out,
    const float* lse, int B, int T, int H, int KVH, int D, int64_t qs,
    int64_t kvs, const tr_kern_attn_mask_t* mask, int accumulate,
    tr_cuda_stream_t s) {
  TR_CHECK(check_args("attention_bwd", B, T, H, KVH, D, qs, kvs));
  if ((int64_t)B * T == 0) return 0;
  if (dt != TR_F32 && dt != TR_BF16) {
    TR_LOG_ERROR(KERN, "attention_bwd: %s is not supported", tr_dtype_name(dt));
    return TR_EDTYPE;
  }
  bool others = tr__aligned16(dout) && tr__aligned16(dq) && tr__aligned16(dk) &&
                tr__aligned16(dv);
  bool masked =
      mask && (mask->doc_start || mask->window > 0 || mask->q_shift != 0);
  bool full = masked && full_attention(mask, T);
  bool docs = masked && docs_only(mask);
  int cu = use_cudnn(dt, D, q, k, v, qs, kvs, others && tr__aligned16(out),
                     masked && !full && !docs);
  if (cu < 0) return cu;
#ifdef HAVE_CUDNN
  if (cu) {
    int rc = tr__cudnn_attn_bwd(
        (bf16*)dq, (bf16*)dk, (bf16*)dv, (const bf16*)dout, (const bf16*)q,
        (const bf16*)k, (const bf16*)v, (const bf16*)out, lse, B, T, H, KVH, D,
        qs, kvs, accumulate, !full, docs ? mask : NULL, s);
    if (rc != TR_EUNSUPPORTED) return rc;
    if (tr_kern_cuda_get_attention() == TR_CUDA_ATTN_CUDNN) {
      TR_LOG_ERROR(KERN, "attention_bwd: cuDNN declined this shape");
      return rc;
    }
  }
#endif
  int fl = use_flash(dt, D, q, k, v, qs, kvs, others);
  if (fl < 0) return fl;
  float* dsum = NULL;
  int64_t rows = (int64_t)B * T * H;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&dsum, sizeof(float) * (size_t)rows, s));
  attn_args a = {B,
                 T,
                 H,
                 KVH,
                 D,
                 qs,
                 kvs,
                 1.0f / sqrtf((float)D),
                 masked ? mask->doc_start : NULL,
                 masked ? mask->window : 0,
                 masked ? mask->q_shift : 0};
  int rc = 0;
  TR_CUDA_DISPATCH(dt, TT, {
    attn_dsum_kernel<TT><<<tr__blocks(rows, 8), 256, 0, s>>>(
        dsum, (const TT*)dout, (const TT*)out, B, T, H, D);
    rc = TR_CUDA_LAUNCHED("attn_dsum_kernel");
    if (rc == 0 && fl)
      rc = tr__flash_bwd((bf16*)dq, (bf16*)dk, (bf16*)dv, (const bf16*)dout,
                         (const bf16*)q, (const bf16*)k, (const bf16*)v, dsum,
                         lse, B, T, H, KVH, D, qs, kvs, masked ? mask : NULL,
                         accumulate, s);
    else if (rc == 0)
      TR__MAXM_DISPATCH(D, M,
                        rc = (simt_bwd<TT, M>(dq, dk, dv, dout, q, k, v, dsum,
                                              lse, a, accumulate, s)));
  });
  tr__cuda_tmp_free(dsum, s);
  return rc;
}
