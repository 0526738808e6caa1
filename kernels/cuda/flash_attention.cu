// kernels/cuda/flash_attention.cu: causal flash attention on tensor cores
// (bf16 operands, fp32 accumulation; mma.sync m16n8k16 with ldmatrix, so
// it runs on sm_80 and sm_90), grouped-query heads, head dims 64 and 128.
//
// Forward (FlashAttention-2's schedule): a block of 4 warps takes 128
// queries of one (batch, head) at D = 64 (32 rows a warp) or 64 at
// D = 128 (16 rows a warp); it walks the 64-key tiles up to the diagonal,
// S = Q K^T in registers, an online softmax in base 2, then O += P V with
// P turned into bf16 A-fragments without a trip through shared memory. K and V tiles are
// double-buffered with cp.async. Writes O and each row's log-sum-exp.
//
// Backward, deterministic (no atomics): one kernel per 64-key tile of one
// (batch, kv head) walks the query heads of its group and the query tiles
// from the diagonal on (double-buffered), rebuilding S^T = K Q^T and
// dP^T = V dO^T and summing dV += P^T dO and dK += dS^T Q in registers; a
// second kernel per 64-query tile rebuilds S and dP for dQ += dS K. The
// extra S and dP cost two more small GEMMs per tile pair than
// FlashAttention-2's atomic dQ, and buy bit-identical results.
//
// Measured on an H100 (GPT-2 124M shapes, B 64): forward 154 TFLOP/s,
// backward 114 TFLOP/s (bench/kernels_bench). Nsight Compute finds both
// latency-bound (8-12 warps per SM, 37-46% issue slots busy), not limited
// by any pipe; cuDNN's fused SDPA or a wgmma kernel is the next step.
//
// Masks (tr_kern_attn_mask_t, row i sees keys lo(i)..last(i), last(i) =
// min(i + q_shift, T - 1), both non-decreasing in i): the forward and dQ
// blocks walk the key tiles from their first row's lo to their last row's
// last key and a warp skips the tiles outside its own rows' runs; the
// dK/dV block walks only the query tiles from the first row whose last
// key reaches its keys (k0 - q_shift) to the last row whose lo does (a
// binary search over the rows); inside a tile the keys outside a row's
// run are masked like future keys. A row that sees no key (a shifted
// chunk) gets out 0 and lse -inf; its P is 0 in the backward.
#include "kernels/cuda/common.cuh"

#define FA_THREADS 128
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

// ---- kernels ----

namespace {

struct fa_args {
  int B, T, H, KVH;
  int64_t qs, kvs;
  float scale;
  const int32_t* doc_start;  // [B*T] or NULL
  int window;                // 0: none
  int shift;                 // query row i stands at key position i + shift
};

// first key row i of batch b sees; a.T (nothing) for rows past the end
__device__ __forceinline__ int fa_lo(const fa_args& a, int b, int i) {
  if (i >= a.T) return a.T;
  int lo = a.doc_start ? a.doc_start[(int64_t)b * a.T + i] : 0;
  int w = i + a.shift - a.window + 1;
  if (a.window > 0 && w > lo) lo = w;
  return lo;
}

// the key tiles [first, end) of BK keys that rows q0..qlast see, where
// first is the tile of lo(q0) (end = first when they see none)
__device__ __forceinline__ int fa_tiles_end(const fa_args& a, int qlast,
                                            int first, int BK) {
  int last = min(qlast + a.shift, a.T - 1);  // last key of the last row
  return last < first * BK ? first : last / BK + 1;
}

// one past the last query row whose keys reach key `key` (lo(i) <= key;
// lo is non-decreasing, so these rows are a prefix of 0..T-1)
__device__ int fa_rows_end(const fa_args& a, int b, int key) {
  int l = -1, r = a.T;  // lo(l) <= key (l = -1: none); find the first past
  while (l + 1 < r) {
    int m = l + (r - l) / 2;
    if (fa_lo(a, b, m) <= key)
      l = m;
    else
      r = m;
  }
  return l + 1;
}

__device__ __forceinline__ int warp_min(int x) {
  for (int o = 16; o > 0; o /= 2)
    x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ int warp_max(int x) {
  for (int o = 16; o > 0; o /= 2)
    x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src,
                                           bool valid) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(smem_u32(p)));
}

// d += a b for one m16n8k16 tile (a: 4 regs, b: 2 regs, d: 4 fp32)
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Address a lane gives ldmatrix for a 16 x 16 block at (r0, c0) of a
// row-major shared tile with row stride lds, so that the four registers
// come out as an mma A operand (rows r0.., k = columns) or, with .trans, as
// the B operands of two n-tiles (k = rows, n = columns).
__device__ __forceinline__ const bf16* addr_a(const bf16* s, int lds, int r0,
                                              int c0) {
  int lane = threadIdx.x & 31;
  return s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * lds + c0 +
         (lane >> 4) * 8;
}
// For a tile stored [n][k] (n = rows): the B operands of n-tiles n0 and
// n0 + 8 over k-step k0 (registers b0, b1 of the first, then the second).
__device__ __forceinline__ const bf16* addr_b(const bf16* s, int lds, int n0,
                                              int k0) {
  int lane = threadIdx.x & 31;
  return s + (n0 + (lane & 7) + (lane >> 4) * 8) * lds + k0 +
         ((lane >> 3) & 1) * 8;
}

// rows [r0, r0 + R) of a [*, D] bf16 slice (row stride rs) into a shared
// tile with row stride D + 8, by NT threads; rows >= nvalid are zero-filled
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int r0,
                                          int nvalid, int64_t rs) {
  constexpr int CPR = D / 8;
#pragma unroll
  for (int c = threadIdx.x; c < R * CPR; c += NT) {
    int r = c / CPR, cc = (c % CPR) * 8;
    bool ok = r0 + r < nvalid;
    cp_async16(s + r * (D + 8) + cc, ok ? g + (int64_t)(r0 + r) * rs + cc : g,
               ok);
  }
}

__device__ __forceinline__ void zero(float (&x)[4]) {
  x[0] = x[1] = x[2] = x[3] = 0.0f;
}

// The A operand of the next MMA from two accumulator n-tiles (the C layout
// of m16n8 tiles 2k, 2k+1 is the A layout of an m16k16 tile)
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = pack2(c0[0], c0[1]);
  a[1] = pack2(c0[2], c0[3]);
  a[2] = pack2(c1[0], c1[1]);
  a[3] = pack2(c1[2], c1[3]);
}

// Forward: NW warps of MT m-tiles (16 query rows each); K/V tiles of 64
// keys double-buffered (the next tile's cp.async runs under this tile's
// math). With MT = 2 every K and V fragment read from shared memory feeds
// two MMAs: shared-memory bandwidth, not the tensor cores, limits a warp
// that owns only 16 rows.
template <int D, int NW, int MT>
__global__ void __launch_bounds__(NW * 32)
    flash_fwd_kernel(bf16* out, float* lse, const bf16* q, const bf16* k,
                     const bf16* v, fa_args a) {
  constexpr int NT_ = NW * 32, BQ = 16 * NW * MT, BK = 64, LDS = D + 8,
                NT = BK / 8, DT = D / 8, KD = D / 16;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  bf16* Qs = (bf16*)fa_smem;
  bf16* Ks = Qs + BQ * LDS;             // [2][BK][LDS]
  bf16* Vs = Ks + 2 * BK * LDS;         // [2][BK][LDS]
  int qt = gridDim.x - 1 - blockIdx.x;  // heaviest tiles first
  int h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (a.H / a.KVH);
  int q0 = qt * BQ;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int g = lane >> 2, t4 = lane & 3;
  int wr0 = q0 + w * 16 * MT;  // this warp's first query row
  const bf16* qb = q + (int64_t)b * a.T * a.qs + (int64_t)h * D;
  const bf16* kb = k + (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  const bf16* vb = v + (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  int qlast = q0 + BQ - 1 < a.T - 1 ? q0 + BQ - 1 : a.T - 1;
  int first = fa_lo(a, b, q0) / BK;  // first key tile (lo non-decreasing)
  int last = fa_tiles_end(a, qlast, first, BK) - 1;  // last one
  load_tile<BQ, D, NT_>(Qs, qb, q0, a.T, a.qs);
  load_tile<BK, D, NT_>(Ks, kb, first * BK, a.T, a.kvs);
  load_tile<BK, D, NT_>(Vs, vb, first * BK, a.T, a.kvs);
  cp_async_commit();
  float o[MT][DT][4];
  float mrow[MT][2], lrow[MT][2];
  int lo[MT][2];  // first key of this thread's rows
#pragma unroll
  for (int m = 0; m < MT; m++) {
#pragma unroll
    for (int i = 0; i < DT; i++) zero(o[m][i]);
    mrow[m][0] = mrow[m][1] = -INFINITY;
    lrow[m][0] = lrow[m][1] = 0.0f;
    lo[m][0] = fa_lo(a, b, wr0 + m * 16 + g);
    lo[m][1] = fa_lo(a, b, wr0 + m * 16 + g + 8);
  }
  // the warp's smallest and largest lo: tiles before the first are
  // skipped, tiles from the second on need no lo test
  int wlo = warp_min(min(lo[0][0], lo[MT - 1][1]));
  int whi = warp_max(max(lo[0][0], lo[MT - 1][1]));
  bool masked = a.doc_start || a.window > 0;
  int wlast = wr0 + 16 * MT - 1 + a.shift;  // the warp's last key
  uint32_t qf[MT][KD][4];
  const float sl2 = a.scale * FA_LOG2E;
  for (int kt = first; kt <= last; kt++) {
    int k0 = kt * BK, buf = (kt - first) & 1;
    if (kt < last) {
      load_tile<BK, D, NT_>(Ks + (buf ^ 1) * BK * LDS, kb, k0 + BK, a.T, a.kvs);
      load_tile<BK, D, NT_>(Vs + (buf ^ 1) * BK * LDS, vb, k0 + BK, a.T, a.kvs);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == first) {
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
          ldsm_x4(qf[m][kk], addr_a(Qs, LDS, (w * MT + m) * 16, kk * 16));
    }
    // a warp whose rows all precede this tile's keys, or all start after
    // them, has nothing to add
    if (k0 <= wlast && k0 + BK - 1 >= wlo) {
      const bf16* Kt = Ks + buf * BK * LDS;
      const bf16* Vt = Vs + buf * BK * LDS;
      float s[MT][NT][4];
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < NT; i++) zero(s[m][i]);
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
          uint32_t r[4];
          ldsm_x4(r, addr_b(Kt, LDS, np * 16, kk * 16));
#pragma unroll
          for (int m = 0; m < MT; m++) {
            mma16816(s[m][2 * np], qf[m][kk], r[0], r[1]);
            mma16816(s[m][2 * np + 1], qf[m][kk], r[2], r[3]);
          }
        }
      }
      bool mask =
          k0 + BK - 1 > wr0 + a.shift || k0 + BK > a.T || (masked && k0 < whi);
#pragma unroll
      for (int m = 0; m < MT; m++) {
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            float x = s[m][nt][e];
            if (mask) {
              int row = wr0 + m * 16 + g + (e >> 1) * 8;
              int col = k0 + nt * 8 + t4 * 2 + (e & 1);
              if (col > row + a.shift || col >= a.T || col < lo[m][e >> 1])
                x = -INFINITY;
            }
            s[m][nt][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
          }
        float ms[2], corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          // running max in the base-2 domain of the scaled scores
          float mn = fmaxf(mrow[m][r], mx[r] * sl2);
          ms[r] = mn == -INFINITY ? 0.0f : mn;
          corr[r] = exp2f(mrow[m][r] - ms[r]);
          mrow[m][r] = mn;
        }
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            float p = exp2f(fmaf(s[m][nt][e], sl2, -ms[e >> 1]));
            s[m][nt][e] = p;
            ls[e >> 1] += p;
          }
#pragma unroll
        for (int r = 0; r < 2; r++) lrow[m][r] = lrow[m][r] * corr[r] + ls[r];
#pragma unroll
        for (int i = 0; i < DT; i++)
#pragma unroll
          for (int e = 0; e < 4; e++) o[m][i][e] *= corr[e >> 1];
      }
#pragma unroll
      for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
          acc_to_a(pa[m], s[m][2 * kk], s[m][2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
          uint32_t r[4];
          ldsm_x4_t(r, addr_a(Vt, LDS, kk * 16, dp * 16));
#pragma unroll
          for (int m = 0; m < MT; m++) {
            mma16816(o[m][2 * dp], pa[m], r[0], r[1]);
            mma16816(o[m][2 * dp + 1], pa[m], r[2], r[3]);
          }
        }
      }
    }
    __syncthreads();  // this buffer is refilled two tiles from now
  }
  cp_async_wait<0>();  // the first tiles' copies when no tile was walked
  int64_t HD = (int64_t)a.H * D;
#pragma unroll
  for (int m = 0; m < MT; m++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float l = lrow[m][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      int row = wr0 + m * 16 + g + r * 8;
      if (row < a.T) {
        float inv = l > 0.0f ? 1.0f / l : 0.0f;  // 0: sees no key
        bf16* orow = out + ((int64_t)b * a.T + row) * HD + (int64_t)h * D;
#pragma unroll
        for (int i = 0; i < DT; i++)
          *reinterpret_cast<uint32_t*>(orow + i * 8 + t4 * 2) =
              pack2(o[m][i][2 * r] * inv, o[m][i][2 * r + 1] * inv);
        if (t4 == 0)
          lse[((int64_t)b * a.H + h) * a.T + row] =
              l > 0.0f ? (mrow[m][r] + log2f(l)) * FA_LN2 : -INFINITY;
      }
    }
}

// Stores (or adds to) two consecutive bf16 values
__device__ __forceinline__ void put2(bf16* p, float x, float y, int acc) {
  uint32_t* u = reinterpret_cast<uint32_t*>(p);
  if (acc) {
    __nv_bfloat162 old = *reinterpret_cast<__nv_bfloat162*>(p);
    x += __bfloat162float(old.x);
    y += __bfloat162float(old.y);
  }
  *u = pack2(x, y);
}

// dK, dV of 64 keys of one (batch, kv head): 4 warps of 16 keys; the
// (head, query tile) steps are double-buffered.
template <int D, int BQ>
__global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_dkdv_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                          const bf16* k, const bf16* v, const float* dsum,
                          const float* lse, fa_args a, int accumulate) {
  constexpr int BK = 64, LDS = D + 8, QT = BQ / 8, DT = D / 8, KD = D / 16;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  bf16* Ks = (bf16*)fa_smem;
  bf16* Vs = Ks + BK * LDS;
  bf16* Qs = Vs + BK * LDS;                     // [2][BQ][LDS]
  bf16* dOs = Qs + 2 * BQ * LDS;                // [2][BQ][LDS]
  float* lse_s = (float*)(dOs + 2 * BQ * LDS);  // [2][BQ]
  float* dsum_s = lse_s + 2 * BQ;               // [2][BQ]
  int* lo_s = (int*)(dsum_s + 2 * BQ);          // [2][BQ]
  int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  int k0 = kt * BK;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int g = lane >> 2, t4 = lane & 3;
  int group = a.H / a.KVH;
  int64_t HD = (int64_t)a.H * D;
  int64_t kvoff = (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  // the rows that see any of these keys start at k0 - shift (their last
  // key reaches k0) and end before qend
  int qstart = (max(k0 - a.shift, 0) / BQ) * BQ;
  int klast = k0 + BK - 1 < a.T - 1 ? k0 + BK - 1 : a.T - 1;
  int qend = a.doc_start || a.window > 0 ? fa_rows_end(a, b, klast) : a.T;
  int nq = max((qend - qstart + BQ - 1) / BQ, 0);  // query tiles per head
  int nsteps = group * nq;
  // step i: head kvh * group + i / nq, query tile qstart + (i % nq) * BQ
  auto issue = [&](int i, int bb) {
    int h = kvh * group + i / nq;
    int q0 = qstart + (i % nq) * BQ;
    load_tile<BQ, D, FA_THREADS>(Qs + bb * BQ * LDS,
                                 q + (int64_t)b * a.T * a.qs + (int64_t)h * D,
                                 q0, a.T, a.qs);
    load_tile<BQ, D, FA_THREADS>(dOs + bb * BQ * LDS,
                                 dout + (int64_t)b * a.T * HD + (int64_t)h * D,
                                 q0, a.T, HD);
    const float* lb = lse + ((int64_t)b * a.H + h) * a.T;
    const float* db = dsum + ((int64_t)b * a.H + h) * a.T;
    for (int j = threadIdx.x; j < BQ; j += FA_THREADS) {
      bool ok = q0 + j < a.T;
      lse_s[bb * BQ + j] = ok ? lb[q0 + j] * FA_LOG2E : 0.0f;
      dsum_s[bb * BQ + j] = ok ? db[q0 + j] : 0.0f;
      lo_s[bb * BQ + j] = fa_lo(a, b, q0 + j);
    }
  };
  load_tile<BK, D, FA_THREADS>(Ks, k + kvoff, k0, a.T, a.kvs);
  load_tile<BK, D, FA_THREADS>(Vs, v + kvoff, k0, a.T, a.kvs);
  issue(0, 0);
  cp_async_commit();
  float dka[DT][4], dva[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++) {
    zero(dka[i]);
    zero(dva[i]);
  }
  const float sl2 = a.scale * FA_LOG2E;
  int kr0 = k0 + w * 16 + g;  // this thread's key rows kr0, kr0 + 8
  for (int i = 0; i < nsteps; i++) {
    int bb = i & 1;
    int q0 = qstart + (i % nq) * BQ;
    if (i + 1 < nsteps) {
      issue(i + 1, bb ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    // skip when every query of the tile precedes this warp's keys
    if (q0 + BQ - 1 + a.shift >= k0 + w * 16) {
      const bf16* Qt = Qs + bb * BQ * LDS;
      const bf16* dOt = dOs + bb * BQ * LDS;
      const float* ls = lse_s + bb * BQ;
      const float* ds = dsum_s + bb * BQ;
      const int* los = lo_s + bb * BQ;
      float st[QT][4], dpt[QT][4];
#pragma unroll
      for (int j = 0; j < QT; j++) {
        zero(st[j]);
        zero(dpt[j]);
      }
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        uint32_t ka[4], va[4];
        ldsm_x4(ka, addr_a(Ks, LDS, w * 16, kk * 16));
        ldsm_x4(va, addr_a(Vs, LDS, w * 16, kk * 16));
#pragma unroll
        for (int np = 0; np < QT / 2; np++) {
          uint32_t r[4];
          ldsm_x4(r, addr_b(Qt, LDS, np * 16, kk * 16));
          mma16816(st[2 * np], ka, r[0], r[1]);
          mma16816(st[2 * np + 1], ka, r[2], r[3]);
          ldsm_x4(r, addr_b(dOt, LDS, np * 16, kk * 16));
          mma16816(dpt[2 * np], va, r[0], r[1]);
          mma16816(dpt[2 * np + 1], va, r[2], r[3]);
        }
      }
      // P^T and dS^T (rows: keys, columns: queries)
#pragma unroll
      for (int nt = 0; nt < QT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int key = kr0 + (e >> 1) * 8;
          int qc = nt * 8 + t4 * 2 + (e & 1);
          int qi = q0 + qc;
          bool ok =
              key <= qi + a.shift && qi < a.T && key < a.T && key >= los[qc];
          float p = ok ? exp2f(fmaf(st[nt][e], sl2, -ls[qc])) : 0.0f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - ds[qc]);
        }
#pragma unroll
      for (int kk = 0; kk < BQ / 16; kk++) {
        uint32_t pa[4], da[4];
        acc_to_a(pa, st[2 * kk], st[2 * kk + 1]);
        acc_to_a(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
          uint32_t r[4];
          ldsm_x4_t(r, addr_a(dOt, LDS, kk * 16, dp * 16));
          mma16816(dva[2 * dp], pa, r[0], r[1]);
          mma16816(dva[2 * dp + 1], pa, r[2], r[3]);
          ldsm_x4_t(r, addr_a(Qt, LDS, kk * 16, dp * 16));
          mma16816(dka[2 * dp], da, r[0], r[1]);
          mma16816(dka[2 * dp + 1], da, r[2], r[3]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled two steps from now
  }
  cp_async_wait<0>();  // the first step's copies when there were none
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int key = kr0 + r * 8;
    if (key >= a.T) continue;
    bf16* dkr = dk + kvoff + (int64_t)key * a.kvs;
    bf16* dvr = dv + kvoff + (int64_t)key * a.kvs;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      int c = i * 8 + t4 * 2;
      put2(dkr + c, dka[i][2 * r] * a.scale, dka[i][2 * r + 1] * a.scale,
           accumulate);
      put2(dvr + c, dva[i][2 * r], dva[i][2 * r + 1], accumulate);
    }
  }
}

// dQ of 64 queries of one (batch, head): 4 warps of 16 rows; K/V tiles
// double-buffered.
template <int D>
__global__ void __launch_bounds__(FA_THREADS)
    flash_bwd_dq_kernel(bf16* dq, const bf16* dout, const bf16* q,
                        const bf16* k, const bf16* v, const float* dsum,
                        const float* lse, fa_args a, int accumulate) {
  constexpr int BQ = 64, BK = 64, LDS = D + 8, NT = BK / 8, DT = D / 8,
                KD = D / 16;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  bf16* Qs = (bf16*)fa_smem;
  bf16* dOs = Qs + BQ * LDS;
  bf16* Ks = dOs + BQ * LDS;     // [2][BK][LDS]
  bf16* Vs = Ks + 2 * BK * LDS;  // [2][BK][LDS]
  float* lse_s = (float*)(Vs + 2 * BK * LDS);
  float* dsum_s = lse_s + BQ;
  int qt = gridDim.x - 1 - blockIdx.x;
  int h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (a.H / a.KVH);
  int q0 = qt * BQ;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int g = lane >> 2, t4 = lane & 3;
  int64_t HD = (int64_t)a.H * D;
  int64_t qoff = (int64_t)b * a.T * a.qs + (int64_t)h * D;
  int64_t kvoff = (int64_t)b * a.T * a.kvs + (int64_t)kvh * D;
  load_tile<BQ, D, FA_THREADS>(Qs, q + qoff, q0, a.T, a.qs);
  load_tile<BQ, D, FA_THREADS>(
      dOs, dout + (int64_t)b * a.T * HD + (int64_t)h * D, q0, a.T, HD);
  int first = fa_lo(a, b, q0) / BK;  // first key tile (lo non-decreasing)
  int qlast = q0 + BQ - 1 < a.T - 1 ? q0 + BQ - 1 : a.T - 1;
  int last = fa_tiles_end(a, qlast, first, BK) - 1;
  load_tile<BK, D, FA_THREADS>(Ks, k + kvoff, first * BK, a.T, a.kvs);
  load_tile<BK, D, FA_THREADS>(Vs, v + kvoff, first * BK, a.T, a.kvs);
  cp_async_commit();
  for (int i = threadIdx.x; i < BQ; i += FA_THREADS) {
    bool ok = q0 + i < a.T;
    int64_t o = ((int64_t)b * a.H + h) * a.T + q0 + i;
    lse_s[i] = ok ? lse[o] * FA_LOG2E : 0.0f;
    dsum_s[i] = ok ? dsum[o] : 0.0f;
  }
  float dqa[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++) zero(dqa[i]);
  const float sl2 = a.scale * FA_LOG2E;
  int lr0 = w * 16 + g;  // local query rows lr0, lr0 + 8
  int wr0 = q0 + w * 16;
  int lo[2] = {fa_lo(a, b, q0 + lr0), fa_lo(a, b, q0 + lr0 + 8)};
  int wlo = warp_min(lo[0]);
  for (int kt = first; kt <= last; kt++) {
    int k0 = kt * BK, buf = (kt - first) & 1;
    if (kt < last) {
      load_tile<BK, D, FA_THREADS>(Ks + (buf ^ 1) * BK * LDS, k + kvoff,
                                   k0 + BK, a.T, a.kvs);
      load_tile<BK, D, FA_THREADS>(Vs + (buf ^ 1) * BK * LDS, v + kvoff,
                                   k0 + BK, a.T, a.kvs);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (k0 <= wr0 + 15 + a.shift && k0 + BK - 1 >= wlo) {
      const bf16* Kt = Ks + buf * BK * LDS;
      const bf16* Vt = Vs + buf * BK * LDS;
      float s[NT][4], dp[NT][4];
#pragma unroll
      for (int i = 0; i < NT; i++) {
        zero(s[i]);
        zero(dp[i]);
      }
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        uint32_t qa[4], ga[4];
        ldsm_x4(qa, addr_a(Qs, LDS, w * 16, kk * 16));
        ldsm_x4(ga, addr_a(dOs, LDS, w * 16, kk * 16));
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
          uint32_t r[4];
          ldsm_x4(r, addr_b(Kt, LDS, np * 16, kk * 16));
          mma16816(s[2 * np], qa, r[0], r[1]);
          mma16816(s[2 * np + 1], qa, r[2], r[3]);
          ldsm_x4(r, addr_b(Vt, LDS, np * 16, kk * 16));
          mma16816(dp[2 * np], ga, r[0], r[1]);
          mma16816(dp[2 * np + 1], ga, r[2], r[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int lr = lr0 + (e >> 1) * 8;
          int qi = q0 + lr;
          int key = k0 + nt * 8 + t4 * 2 + (e & 1);
          bool ok =
              key <= qi + a.shift && key < a.T && qi < a.T && key >= lo[e >> 1];
          float p = ok ? exp2f(fmaf(s[nt][e], sl2, -lse_s[lr])) : 0.0f;
          dp[nt][e] = p * (dp[nt][e] - dsum_s[lr]);
        }
#pragma unroll
      for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t da[4];
        acc_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int dd = 0; dd < D / 16; dd++) {
          uint32_t r[4];
          ldsm_x4_t(r, addr_a(Kt, LDS, kk * 16, dd * 16));
          mma16816(dqa[2 * dd], da, r[0], r[1]);
          mma16816(dqa[2 * dd + 1], da, r[2], r[3]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled two tiles from now
  }
  cp_async_wait<0>();  // the first tiles' copies when no tile was walked
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int qi = q0 + lr0 + r * 8;
    if (qi >= a.T) continue;
    bf16* row = dq + qoff + (int64_t)qi * a.qs;
#pragma unroll
    for (int i = 0; i < DT; i++)
      put2(row + i * 8 + t4 * 2, dqa[i][2 * r] * a.scale,
           dqa[i][2 * r + 1] * a.scale, accumulate);
  }
}

template <typename K>
int raise_smem(K kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return 0;
  if (bytes > (size_t)tr__cuda_smem_optin()) return TR_EUNSUPPORTED;
  return TR_CUDA_CALL(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int D, int NW, int MT>
int fwd_launch(bf16* out, float* lse, const bf16* q, const bf16* k,
               const bf16* v, const fa_args& a, cudaStream_t s) {
  constexpr int BQ = 16 * NW * MT;
  size_t sm = (size_t)(BQ + 4 * 64) * (D + 8) * sizeof(bf16);
  TR_CHECK(raise_smem(flash_fwd_kernel<D, NW, MT>, sm));
  dim3 grid((a.T + BQ - 1) / BQ, a.H, a.B);
  flash_fwd_kernel<D, NW, MT><<<grid, NW * 32, sm, s>>>(out, lse, q, k, v, a);
  return TR_CUDA_LAUNCHED("flash_fwd_kernel");
}

template <int D>
int bwd_launch(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
               const bf16* k, const bf16* v, const float* dsum,
               const float* lse, const fa_args& a, int accumulate,
               cudaStream_t s) {
  // 32 query rows a step at D = 128 keep dK, dV, S^T and dP^T in registers
  constexpr int BQ = D == 128 ? 32 : 64;
  size_t sm = (size_t)(2 * 64 + 4 * BQ) * (D + 8) * sizeof(bf16) +
              4 * BQ * sizeof(float) + 2 * BQ * sizeof(int);
  size_t sm_dq = (size_t)(2 * 64 + 4 * 64) * (D + 8) * sizeof(bf16) +
                 2 * 64 * sizeof(float);
  TR_CHECK(raise_smem(flash_bwd_dkdv_kernel<D, BQ>, sm));
  TR_CHECK(raise_smem(flash_bwd_dq_kernel<D>, sm_dq));
  int nt = (a.T + 63) / 64;
  flash_bwd_dkdv_kernel<D, BQ><<<dim3(nt, a.KVH, a.B), FA_THREADS, sm, s>>>(
      dk, dv, dout, q, k, v, dsum, lse, a, accumulate);
  TR_CHECK(TR_CUDA_LAUNCHED("flash_bwd_dkdv_kernel"));
  flash_bwd_dq_kernel<D><<<dim3(nt, a.H, a.B), FA_THREADS, sm_dq, s>>>(
      dq, dout, q, k, v, dsum, lse, a, accumulate);
  return TR_CUDA_LAUNCHED("flash_bwd_dq_kernel");
}

// Forward variant at D = 64: 0 = 4 warps of two m-tiles (128 rows; the
// default), 1 = 4 warps of one (64 rows). On an H100 (2026-11-21, B 64
// GPT-2 shapes) the first ran at 153-155 TFLOP/s in two runs, the second
// at 154 and 134: the kernel is latency-bound (Nsight Compute: 8-12 warps
// per SM, 38% of issue slots used, no pipe saturated) more than limited by
// shared-memory reads. bench/kernels_bench times both.
int g_fwd_variant64 = 0;

}  // namespace

// ---- launchers ----

// Variant selection for bench/kernels_bench (0 or 1, as above).
extern "C" void tr__flash_set_fwd_variant(int variant) {
  __atomic_store_n(&g_fwd_variant64, variant == 1 ? 1 : 0, __ATOMIC_RELAXED);
}

int tr__flash_applies(tr_dtype_t dt, int D, const void* q, const void* k,
                      const void* v, int64_t qs, int64_t kvs) {
  return dt == TR_BF16 && (D == 64 || D == 128) && tr__aligned16(q) &&
         tr__aligned16(k) && tr__aligned16(v) && qs % 8 == 0 && kvs % 8 == 0;
}

static fa_args make_args(int B, int T, int H, int KVH, int D, int64_t qs,
                         int64_t kvs, const tr_kern_attn_mask_t* mask) {
  fa_args a = {B,
               T,
               H,
               KVH,
               qs,
               kvs,
               1.0f / sqrtf((float)D),
               mask ? mask->doc_start : NULL,
               mask ? mask->window : 0,
               mask ? mask->q_shift : 0};
  return a;
}

int tr__flash_fwd(bf16* out, float* lse, const bf16* q, const bf16* k,
                  const bf16* v, int B, int T, int H, int KVH, int D,
                  int64_t qs, int64_t kvs, const tr_kern_attn_mask_t* mask,
                  cudaStream_t s) {
  fa_args a = make_args(B, T, H, KVH, D, qs, kvs, mask);
  if (D == 64) {
    if (__atomic_load_n(&g_fwd_variant64, __ATOMIC_RELAXED) == 1)
      return fwd_launch<64, 4, 1>(out, lse, q, k, v, a, s);
    return fwd_launch<64, 4, 2>(out, lse, q, k, v, a, s);
  }
  return fwd_launch<128, 4, 1>(out, lse, q, k, v, a, s);
}

int tr__flash_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                  const bf16* k, const bf16* v, const float* dsum,
                  const float* lse, int B, int T, int H, int KVH, int D,
                  int64_t qs, int64_t kvs, const tr_kern_attn_mask_t* mask,
                  int accumulate, cudaStream_t s) {
  fa_args a = make_args(B, T, H, KVH, D, qs, kvs, mask);
  if (D == 64)
    return bwd_launch<64>(dq, dk, dv, dout, q, k, v, dsum, lse, a, accumulate,
                          s);
  return bwd_launch<128>(dq, dk, dv, dout, q, k, v, dsum, lse, a, accumulate,
                         s);
}
