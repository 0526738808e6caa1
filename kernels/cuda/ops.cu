// kernels/cuda/ops.cu: the "cuda" table of trainrun/kernels.h and its bf16
// table: the entry points, each running the CUDA kernels on the calling
// thread's stream (tr_kern_set_stream), registered when the library loads.
// One template per entry point, instantiated for fp32 and bf16.
//
// A few entries synchronize that stream, because their contract returns
// something to the host: sum_squares (a host double) and xent_fwd (targets
// out of range give TR_EINVAL, naming the first); step_tail_wait waits for
// an event only. The bf16 training path
// calls the kernels_cuda.h functions instead, which never synchronize.
#include "kernels/cuda/common.cuh"

#include <limits.h>
#include <pthread.h>
#include <string.h>

extern "C" void tr__cuda_matmul_release(void);

// ---- table entries ----

namespace {

cudaStream_t cur(void) { return (cudaStream_t)tr_kern_get_stream(); }

template <tr_dtype_t DT>
int cu_embedding_fwd(float* out, const int32_t* tok, const float* wte,
                     const float* wpe, int B, int T, int C) {
  // the table does not pass the vocabulary size: the tensor entry point
  // checks tokens on the host for CPU tensors only
  return tr_kern_cuda_embedding_fwd(DT, out, tok, wte, wpe, B, T, C,
                                    INT_MAX, cur());
}

template <tr_dtype_t DT>
int cu_embedding_bwd(float* dwte, float* dwpe, const float* dout,
                     const int32_t* tok, int B, int T, int C) {
  return tr_kern_cuda_embedding_bwd(DT, dwte, dwpe, dout, tok, B, T, C,
                                    INT_MAX, cur());
}

template <tr_dtype_t DT>
int cu_embedding_rows_fwd(float* out, const int32_t* tok, const float* wte,
                          int64_t row0, int64_t rows, int B, int T, int C) {
  TR_CUDA_REQUIRE(rows <= INT_MAX, "embedding_rows_fwd: %lld rows",
                  (long long)rows);
  return tr_kern_cuda_embedding_rows_fwd(DT, out, tok, wte, row0, (int)rows, B,
                                         T, C, cur());
}

template <tr_dtype_t DT>
int cu_embedding_rows_bwd(float* dwte, float* dwpe, const float* dout,
                          const int32_t* tok, int64_t row0, int64_t rows, int B,
                          int T, int C) {
  TR_CUDA_REQUIRE(rows <= INT_MAX, "embedding_rows_bwd: %lld rows",
                  (long long)rows);
  return tr_kern_cuda_embedding_rows_bwd(DT, dwte, dwpe, dout, tok, row0,
                                         (int)rows, B, T, C, cur());
}

template <tr_dtype_t DT>
int cu_layernorm_fwd(float* out, float* mean, float* rstd, const float* inp,
                     const float* w, const float* b, int64_t N, int C,
                     float eps) {
  return tr_kern_cuda_layernorm_fwd(DT, out, mean, rstd, inp, w, b, N, C,
                                    eps, cur());
}

template <tr_dtype_t DT>
int cu_residual_layernorm_fwd(float* resid, float* out, float* mean,
                              float* rstd, const float* a, const float* b_in,
                              const float* w, const float* b, int64_t N, int C,
                              float eps) {
  return tr_kern_cuda_residual_layernorm_fwd(DT, resid, out, mean, rstd, a,
                                             b_in, w, b, N, C, eps, cur());
}

template <tr_dtype_t DT>
int cu_layernorm_bwd(float* dinp, float* dw, float* db, const float* dout,
                     const float* inp, const float* w, const float* mean,
                     const float* rstd, int64_t N, int C) {
  return tr_kern_cuda_layernorm_bwd(DT, dinp, dw, db, dout, inp, w, mean,
                                    rstd, N, C, cur());
}

template <tr_dtype_t DT>
int cu_rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* w,
                   int64_t N, int C, float eps) {
  return tr_kern_cuda_rmsnorm_fwd(DT, out, rstd, inp, w, N, C, eps, cur());
}

template <tr_dtype_t DT>
int cu_residual_rmsnorm_fwd(float* resid, float* out, float* rstd,
                            const float* a, const float* b_in, const float* w,
                            int64_t N, int C, float eps) {
  return tr_kern_cuda_residual_rmsnorm_fwd(DT, resid, out, rstd, a, b_in, w, N,
                                           C, eps, cur());
}

template <tr_dtype_t DT>
int cu_rmsnorm_bwd(float* dinp, float* dw, const float* dout, const float* inp,
                   const float* w, const float* rstd, int64_t N, int C) {
  return tr_kern_cuda_rmsnorm_bwd(DT, dinp, dw, dout, inp, w, rstd, N, C,
                                  cur());
}

// One GEMM on raw pointers: A and B of type ab, C of type c.
int plain_gemm(tr_dtype_t ab, tr_dtype_t c, int transa, int transb, int64_t M,
               int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
               const void* B, int64_t ldb, float beta, void* C, int64_t ldc) {
  tr_cuda_gemm_t g;
  memset(&g, 0, sizeof g);
  g.transa = transa;
  g.transb = transb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A;
  g.lda = lda;
  g.B = B;
  g.ldb = ldb;
  g.C = C;
  g.ldc = ldc;
  g.ab_type = ab;
  g.c_type = c;
  g.alpha = alpha;
  g.beta = beta;
  return tr_kern_cuda_gemm(&g, cur());
}

template <tr_dtype_t DT>
int cu_gemm(int transa, int transb, int64_t M, int64_t N, int64_t K,
            float alpha, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc) {
  return plain_gemm(DT, DT, transa, transb, M, N, K, alpha, A, lda, B, ldb,
                    beta, C, ldc);
}

// One GEMM of a linear layer whose output (gradient) rows are ld apart:
// the padded logits of the output projection.
int strided_gemm(tr_dtype_t ab, tr_dtype_t c, int transa, int transb,
                 int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                 const void* B, int64_t ldb, void* C, int64_t ldc, float beta) {
  return plain_gemm(ab, c, transa, transb, M, N, K, 1.0f, A, lda, B, ldb, beta,
                    C, ldc);
}

// Padded rows (ld a multiple of 8, OC not: GPT-2's vocabulary of 50257):
// cuBLASLt falls back to 1-element-aligned kernels, 5-10x slower, when the
// contiguous extent of an operand is odd, so each GEMM runs on the aligned
// first OC & ~7 columns and, separately, on the few left (a thin GEMM).
template <tr_dtype_t DT>
int cu_linear_fwd(float* out, const float* inp, const float* w,
                  const float* bias, int64_t N, int IC, int OC, int64_t ldo) {
  if (ldo == OC || N <= 1)
    return tr_kern_cuda_linear_fwd(DT, out, NULL, inp, w, bias, N, IC, OC, 0,
                                   cur());
  if (bias) {
    TR_LOG_ERROR(KERN, "linear_fwd: a bias with padded output rows");
    return TR_EUNSUPPORTED;
  }
  const size_t es = DT == TR_BF16 ? 2 : 4;
  int64_t a = OC & ~(int64_t)7, r = OC - a;
  if (a > 0)
    TR_CHECK(
        strided_gemm(DT, DT, 0, 1, N, a, IC, inp, IC, w, IC, out, ldo, 0.0f));
  if (r > 0)
    TR_CHECK(strided_gemm(DT, DT, 0, 1, N, r, IC, inp, IC,
                          (const char*)w + (size_t)a * IC * es, IC,
                          (char*)out + (size_t)a * es, ldo, 0.0f));
  return 0;
}

// beta_in 1: dinp += dout w; 0: dinp = dout w (the first GEMM into dinp
// ignores its old contents, so the buffer needs no zeroing pass).
template <tr_dtype_t DT>
int linear_bwd(float* dinp, float* dw, float* dbias, const float* dout,
               const float* inp, const float* w, int64_t N, int IC, int OC,
               int64_t ldd, float beta_in) {
  if (ldd == OC || N <= 1) {
    if (beta_in == 1.0f)
      return tr_kern_cuda_linear_bwd(DT, dinp, dw, dbias, dout, inp, w, NULL, N,
                                     IC, OC, cur());
    if (dinp)
      TR_CHECK(plain_gemm(DT, DT, 0, 0, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f,
                          dinp, IC));
    if (!dw && !dbias) return 0;
    return tr_kern_cuda_linear_bwd(DT, NULL, dw, dbias, dout, inp, w, NULL, N,
                                   IC, OC, cur());
  }
  if (dbias) {
    TR_LOG_ERROR(KERN, "linear_bwd: a bias gradient with padded rows");
    return TR_EUNSUPPORTED;
  }
  const size_t es = DT == TR_BF16 ? 2 : 4;
  int64_t a = OC & ~(int64_t)7, r = OC - a;
  if (dinp && a > 0)
    TR_CHECK(strided_gemm(DT, DT, 0, 0, N, IC, a, dout, ldd, w, IC, dinp, IC,
                          beta_in));
  if (dinp && r > 0)
    TR_CHECK(strided_gemm(DT, DT, 0, 0, N, IC, r,
                          (const char*)dout + (size_t)a * es, ldd,
                          (const char*)w + (size_t)a * IC * es, IC, dinp, IC,
                          a > 0 ? 1.0f : beta_in));
  // the weight gradient by rows too: with all OC rows cuBLASLt's heuristic
  // took an sm80 CUTLASS kernel for GPT-2's head (9.9 ms a step on an H100
  // where the same GEMM on 50256 rows runs Hopper kernels in about 7.3 ms)
  if (dw && a > 0)
    TR_CHECK(strided_gemm(DT, TR_F32, 1, 0, a, IC, N, dout, ldd, inp, IC, dw,
                          IC, 1.0f));
  if (dw && r > 0)
    TR_CHECK(strided_gemm(DT, TR_F32, 1, 0, r, IC, N,
                          (const char*)dout + (size_t)a * es, ldd, inp, IC,
                          dw + (size_t)a * IC, IC, 1.0f));
  return 0;
}

template <tr_dtype_t DT>
int cu_linear_bwd(float* dinp, float* dw, float* dbias, const float* dout,
                  const float* inp, const float* w, int64_t N, int IC, int OC,
                  int64_t ldd) {
  return linear_bwd<DT>(dinp, dw, dbias, dout, inp, w, N, IC, OC, ldd, 1.0f);
}

template <tr_dtype_t DT>
int cu_linear_bwd_write(float* dinp, float* dw, float* dbias, const float* dout,
                        const float* inp, const float* w, int64_t N, int IC,
                        int OC, int64_t ldd) {
  return linear_bwd<DT>(dinp, dw, dbias, dout, inp, w, N, IC, OC, ldd, 0.0f);
}

// GELU in the GEMM's epilogue, the pre-activation kept in `pre` (aux).
// cuBLASLt wants the aux rows a multiple of 8 elements apart; other widths
// run the two kernels.
template <tr_dtype_t DT>
int cu_linear_gelu_fwd(float* out, float* pre, const float* inp, const float* w,
                       const float* bias, int64_t N, int IC, int OC) {
  cudaStream_t s = cur();
  if (OC % 8 == 0)
    return tr_kern_cuda_linear_fwd(DT, out, pre, inp, w, bias, N, IC, OC, 1, s);
  TR_CHECK(
      tr_kern_cuda_linear_fwd(DT, pre, NULL, inp, w, bias, N, IC, OC, 0, s));
  return tr_kern_cuda_gelu_fwd(DT, out, pre, N * OC, s);
}

// dinp overwritten by the DGELU epilogue of the dinp GEMM (beta = 0); for
// widths that are not a multiple of 8, dout w goes to a zeroed temporary
// and gelu_bwd into the zeroed dinp.
template <tr_dtype_t DT>
int cu_linear_dgelu_bwd(float* dinp, float* dw, float* dbias, const float* dout,
                        const float* inp, const float* w, const float* pre,
                        int64_t N, int IC, int OC) {
  cudaStream_t s = cur();
  if (IC % 8 == 0)
    return tr_kern_cuda_linear_bwd(DT, dinp, dw, dbias, dout, inp, w, pre, N,
                                   IC, OC, s);
  const size_t bytes = (size_t)N * IC * (DT == TR_BF16 ? 2 : 4);
  if (bytes == 0)
    return tr_kern_cuda_linear_bwd(DT, NULL, dw, dbias, dout, inp, w, NULL, N,
                                   IC, OC, s);
  void* tmp = NULL;
  TR_CHECK(tr__cuda_tmp_alloc(&tmp, bytes, s));
  int rc = TR_CUDA_CALL(cudaMemsetAsync(tmp, 0, bytes, s));
  if (rc == 0)
    rc = tr_kern_cuda_linear_bwd(DT, tmp, dw, dbias, dout, inp, w, NULL, N, IC,
                                 OC, s);
  if (rc == 0) rc = TR_CUDA_CALL(cudaMemsetAsync(dinp, 0, bytes, s));
  if (rc == 0) rc = tr_kern_cuda_gelu_bwd(DT, dinp, tmp, pre, N * IC, s);
  tr__cuda_tmp_free(tmp, s);
  return rc;
}

// The batch-strided linears (trainrun/kernels.h, tr_kern_lin_batch_t): one
// strided-batched GEMM with the weight's batch stride 0, its epilogue
// fused as in the entries above. The GELU widths those entries run
// unfused (not a multiple of 8) go through them one slice at a time.
template <tr_dtype_t DT>
int cu_linear_batched(const tr_kern_lin_batch_t* l) {
  TR_CUDA_REQUIRE(l->batch >= 1 && l->N >= 0 && l->IC > 0 && l->OC > 0,
                  "linear_batched: bad shape batch=%lld N=%lld IC=%d OC=%d",
                  (long long)l->batch, (long long)l->N, l->IC, l->OC);
  const size_t es = DT == TR_BF16 ? 2 : 4;
  int gelu = l->kind == TR_KERN_LIN_FWD_GELU,
      dgelu = l->kind == TR_KERN_LIN_DINP_DGELU;
  if ((gelu && l->OC % 8) || (dgelu && l->IC % 8)) {
    for (int64_t b = 0; b < l->batch; b++) {
      float* o = (float*)((char*)l->out + (size_t)(b * l->out_stride) * es);
      float* p = (float*)((char*)l->pre + (size_t)(b * l->pre_stride) * es);
      const float* x =
          (const float*)((const char*)l->x + (size_t)(b * l->x_stride) * es);
      TR_CHECK(gelu ? cu_linear_gelu_fwd<DT>(o, p, x, l->w, l->bias, l->N,
                                             l->IC, l->OC)
                    : cu_linear_dgelu_bwd<DT>(o, NULL, NULL, x, NULL, l->w, p,
                                              l->N, l->IC, l->OC));
    }
    return 0;
  }
  tr_cuda_gemm_t g;
  memset(&g, 0, sizeof g);
  g.M = l->N;
  g.A = l->x;
  g.B = l->w;
  g.C = l->out;
  g.ab_type = g.c_type = DT;
  g.alpha = 1.0f;
  g.batch = l->batch;
  g.stride_a = l->x_stride;
  g.stride_b = 0;  // the weight, shared
  g.stride_c = l->out_stride;
  if (l->kind == TR_KERN_LIN_FWD || gelu) {  // out = x w^T (+ bias)
    g.transb = 1;
    g.N = l->OC;
    g.K = l->IC;
    g.lda = g.ldb = l->IC;
    g.ldc = l->OC;
    g.with_bias = l->bias != NULL;
    g.bias = l->bias;
    g.epilogue = gelu ? TR_CUDA_EPI_GELU
                      : (l->bias ? TR_CUDA_EPI_BIAS : TR_CUDA_EPI_NONE);
    if (gelu) {
      g.aux = l->pre;
      g.ldaux = l->OC;
      g.stride_aux = l->pre_stride;
    }
  } else {  // out (+)= dout w (* gelu'(pre))
    g.N = l->IC;
    g.K = l->OC;
    g.lda = l->OC;
    g.ldb = l->IC;
    g.ldc = l->IC;
    g.beta = l->kind == TR_KERN_LIN_DINP ? 1.0f : 0.0f;
    if (dgelu) {
      g.epilogue = TR_CUDA_EPI_DGELU;
      g.aux = l->pre;
      g.ldaux = l->IC;
      g.stride_aux = l->pre_stride;
    }
  }
  return tr_kern_cuda_gemm(&g, cur());
}

template <tr_dtype_t DT>
int cu_rope(float* x, const float* cos_t, const float* sin_t, int B, int T,
            int H, int D, int64_t stride, int inverse) {
  return tr_kern_cuda_rope(DT, x, cos_t, sin_t, B, T, H, D, stride, inverse,
                           cur());
}

template <tr_dtype_t DT>
int cu_attention_fwd(float* out, float* lse, const float* q, const float* k,
                     const float* v, int B, int T, int H, int KVH, int D,
                     int64_t q_stride, int64_t kv_stride,
                     const tr_kern_attn_mask_t* mask) {
  return tr_kern_cuda_attention_fwd(DT, out, lse, q, k, v, B, T, H, KVH, D,
                                    q_stride, kv_stride, mask, cur());
}

template <tr_dtype_t DT>
int cu_attention_bwd(float* dq, float* dk, float* dv, const float* dout,
                     const float* q, const float* k, const float* v,
                     const float* out, const float* lse, int B, int T, int H,
                     int KVH, int D, int64_t q_stride, int64_t kv_stride,
                     const tr_kern_attn_mask_t* mask) {
  return tr_kern_cuda_attention_bwd(DT, dq, dk, dv, dout, q, k, v, out, lse,
                                    B, T, H, KVH, D, q_stride, kv_stride, mask,
                                    0, cur());
}

template <tr_dtype_t DT>
int cu_gelu_fwd(float* out, const float* inp, int64_t n) {
  return tr_kern_cuda_gelu_fwd(DT, out, inp, n, cur());
}

template <tr_dtype_t DT>
int cu_gelu_bwd(float* dinp, const float* dout, const float* inp, int64_t n) {
  return tr_kern_cuda_gelu_bwd(DT, dinp, dout, inp, n, cur());
}

template <tr_dtype_t DT>
int cu_swiglu_fwd(float* out, const float* gate, const float* up, int64_t n) {
  return tr_kern_cuda_swiglu_fwd(DT, out, gate, up, n, cur());
}

template <tr_dtype_t DT>
int cu_swiglu_bwd_write(float* dgate, float* dup, const float* dout,
                        const float* gate, const float* up, int64_t n) {
  return tr__cuda_swiglu_bwd_write(DT, dgate, dup, dout, gate, up, n, cur());
}

template <tr_dtype_t DT>
int cu_swiglu_bwd(float* dgate, float* dup, const float* dout,
                  const float* gate, const float* up, int64_t n) {
  return tr_kern_cuda_swiglu_bwd(DT, dgate, dup, dout, gate, up, n, cur());
}

// Run a cross-entropy kernel with a device flag for targets outside
// [0, V), then report the first one (TR_EINVAL): the table's contract. One
// stream synchronization per call.
template <typename F>
int with_target_check(const int32_t* targets, int V, F launch) {
  cudaStream_t s = cur();
  static const int none = INT_MAX;
  int* err = NULL;
  int herr = INT_MAX, rc;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&err, sizeof(int), s));
  rc = TR_CUDA_CALL(
      cudaMemcpyAsync(err, &none, sizeof none, cudaMemcpyHostToDevice, s));
  if (rc == 0) rc = launch(err, s);
  if (rc == 0)
    rc = TR_CUDA_CALL(
        cudaMemcpyAsync(&herr, err, sizeof herr, cudaMemcpyDeviceToHost, s));
  tr__cuda_tmp_free(err, s);
  if (rc == 0) rc = TR_CUDA_CALL(cudaStreamSynchronize(s));
  if (rc == 0 && herr != INT_MAX) {
    int32_t t = 0;
    TR_CHECK(TR_CUDA_CALL(
        cudaMemcpy(&t, targets + herr, sizeof t, cudaMemcpyDeviceToHost)));
    TR_LOG_ERROR(KERN, "target %d at position %d is outside [0, %d)", t, herr,
                 V);
    return TR_EINVAL;
  }
  return rc;
}

template <tr_dtype_t DT>
int cu_xent_fwd(float* losses, float* lse, const float* logits,
                const int32_t* targets, int64_t N, int V, int64_t ld) {
  return with_target_check(targets, V, [&](int* err, cudaStream_t s) {
    return tr_kern_cuda_xent_fwd(DT, losses, lse, logits, ld, targets, N, V,
                                 err, s);
  });
}

template <tr_dtype_t DT>
int cu_xent_fused(float* losses, float* lse, float* logits,
                  const int32_t* targets, int64_t N, int V, int64_t ld,
                  float scale) {
  return with_target_check(targets, V, [&](int* err, cudaStream_t s) {
    return tr_kern_cuda_classifier(DT, logits, ld, losses, lse, targets, N, V,
                                   scale, 1, err, s);
  });
}

template <tr_dtype_t DT>
int cu_xent_bwd(float* logits, const float* lse, const int32_t* targets,
                int64_t N, int V, int64_t ld, float scale) {
  return tr_kern_cuda_xent_bwd(DT, logits, ld, lse, targets, N, V, scale,
                               cur());
}

template <tr_dtype_t DT>
int cu_xent_shard_stats(float* max, float* tgt, const float* logits,
                        const int32_t* targets, int64_t N, int V, int64_t ld,
                        int64_t voff) {
  return tr_kern_cuda_xent_shard_stats(DT, max, tgt, logits, ld, targets, N, V,
                                       voff, cur());
}

template <tr_dtype_t DT>
int cu_xent_shard_sumexp(float* sum, const float* logits, const float* max,
                         int64_t N, int V, int64_t ld) {
  return tr_kern_cuda_xent_shard_sumexp(DT, sum, logits, ld, max, N, V, cur());
}

int cu_xent_shard_loss(float* losses, float* lse, const float* max,
                       const float* sum, const float* tgt,
                       const int32_t* targets, int64_t N) {
  return tr_kern_cuda_xent_shard_loss(losses, lse, max, sum, tgt, targets, N,
                                      cur());
}

template <tr_dtype_t DT>
int cu_xent_shard_bwd(float* logits, const float* lse, const int32_t* targets,
                      int64_t N, int V, int64_t ld, int64_t voff, float scale) {
  return tr_kern_cuda_xent_shard_bwd(DT, logits, ld, lse, targets, N, V, voff,
                                     scale, cur());
}

int cu_adamw(float* p, const float* g, float* m, float* v, int64_t n,
             const tr_adamw_args_t* args) {
  tr_cuda_adamw_tensor_t t;
  memset(&t, 0, sizeof t);
  t.param = p;
  t.grad = g;
  t.m = m;
  t.v = v;
  t.n = n;
  t.decay = 1;
  return tr_kern_cuda_adamw(&t, 1, args, NULL, cur());
}


int cu_adamw_multi(const tr_kern_adamw_tensor_t* ts, int n,
                   const tr_adamw_args_t* args) {
  return tr_kern_cuda_adamw(ts, n, args, NULL, cur());
}

/* One launch over every span; the double comes back with one
 * synchronisation (what the gradient norm waits for anyway). */
int cu_sum_squares_multi(double* out, const tr_kern_span_t* spans, int n) {
  cudaStream_t s = cur();
  double* d = NULL;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&d, sizeof(double), s));
  int rc = tr_kern_cuda_sum_squares(d, spans, n, s);
  if (rc == 0)
    rc = TR_CUDA_CALL(
        cudaMemcpyAsync(out, d, sizeof(double), cudaMemcpyDeviceToHost, s));
  tr__cuda_tmp_free(d, s);
  if (rc == 0) rc = TR_CUDA_CALL(cudaStreamSynchronize(s));
  return rc;
}

// The step's end without a host wait (tr_kern_step_tail): per thread, as
// the stream is, a pinned buffer [squared norm, losses...] the copies land
// in and an event recorded after them; the update is enqueued behind the
// event, so step_tail_wait returns while it may still run.
struct tail_state {
  double* host;  // pinned: [0] the squared norm, then the losses (floats)
  size_t cap;    // bytes of host
  cudaEvent_t ev;
  int64_t nloss;
  int pending;  // copies enqueued and not yet waited for
};
__thread tail_state tail;

// Before each training step: the GEMMs' and cuDNN attention's timed picks.
static void cu_step_begin(void) {
  tr_kern_cuda_gemm_tune_apply();
  tr_kern_cuda_attn_tune_apply();
}

void cu_step_tail_release(void) {
  if (tail.host) cudaFreeHost(tail.host);
  if (tail.ev) cudaEventDestroy(tail.ev);
  memset(&tail, 0, sizeof tail);
}

int cu_step_tail(const tr_kern_adamw_tensor_t* ts, int n,
                 const tr_adamw_args_t* args, const tr_kern_span_t* spans,
                 int nspans, double max_norm, float* losses, int64_t nloss) {
  cudaStream_t s = cur();
  size_t need = sizeof(double) + sizeof(float) * (size_t)(losses ? nloss : 0);
  if (need > tail.cap) {
    if (tail.host) cudaFreeHost(tail.host);
    tail.host = NULL;
    tail.cap = 0;
    TR_CHECK(TR_CUDA_CALL(cudaHostAlloc((void**)&tail.host, need, 0)));
    tail.cap = need;
  }
  if (!tail.ev)
    TR_CHECK(TR_CUDA_CALL(
        cudaEventCreateWithFlags(&tail.ev, cudaEventDisableTiming)));
  double* d = NULL;  // the squared norm, then the factor (a float)
  TR_CHECK(tr__cuda_tmp_alloc((void**)&d, 2 * sizeof(double), s));
  float* factor = (float*)(d + 1);
  int rc = tr_kern_cuda_sum_squares(d, spans, nspans, s);
  if (rc == 0)
    rc = TR_CUDA_CALL(cudaMemcpyAsync(tail.host, d, sizeof(double),
                                      cudaMemcpyDeviceToHost, s));
  tail.nloss = losses ? nloss : 0;
  if (rc == 0 && tail.nloss > 0)
    rc = TR_CUDA_CALL(cudaMemcpyAsync(tail.host + 1, losses,
                                      sizeof(float) * (size_t)tail.nloss,
                                      cudaMemcpyDeviceToHost, s));
  if (rc == 0 && tail.nloss > 0)
    rc = TR_CUDA_CALL(
        cudaMemsetAsync(losses, 0, sizeof(float) * (size_t)tail.nloss, s));
  if (rc == 0) rc = TR_CUDA_CALL(cudaEventRecord(tail.ev, s));
  if (rc == 0) tail.pending = 1;
  int clip = max_norm > 0;
  if (rc == 0 && clip)
    rc = tr_kern_cuda_clip_factor(factor, NULL, d, max_norm, s);
  if (rc == 0) rc = tr_kern_cuda_adamw(ts, n, args, clip ? factor : NULL, s);
  tr__cuda_tmp_free(d, s);
  return rc;
}

int cu_step_tail_wait(double* sumsq, double* loss_sum) {
  if (!tail.pending) return TR_EINVAL;
  tail.pending = 0;
  TR_CHECK(TR_CUDA_CALL(cudaEventSynchronize(tail.ev)));
  *sumsq = tail.host[0];
  const float* l = (const float*)(tail.host + 1);
  double sum = 0.0;
  for (int64_t i = 0; i < tail.nloss; i++) sum += l[i];
  *loss_sum = sum;
  return 0;
}

template <tr_dtype_t DT>
int cu_sum_squares(double* out, const float* x, int64_t n) {
  tr_kern_span_t span = {x, DT, n};
  return cu_sum_squares_multi(out, &span, 1);
}

template <tr_dtype_t DT>
int cu_scale(float* x, float a, int64_t n) {
  return tr_kern_cuda_scale(DT, x, a, n, cur());
}

template <tr_dtype_t DT>
int cu_attn_merge(float* acc, float* lse, const float* pout, const float* plse,
                  int B, int T, int H, int D) {
  return tr_kern_cuda_attn_merge(DT, acc, lse, pout, plse, B, T, H, D, cur());
}

template <tr_dtype_t DT>
int cu_add(float* out, const float* a, const float* b, int64_t n) {
  return tr_kern_cuda_add(DT, out, a, b, n, cur());
}

template <tr_dtype_t DT>
int cu_accumulate(float* y, const float* x, int64_t n) {
  return tr_kern_cuda_accumulate(DT, y, x, n, cur());
}

template <tr_dtype_t DT>
int cu_zero(float* x, int64_t n) {
  if (n <= 0) return 0;
  size_t elem = DT == TR_BF16 ? 2 : 4;
  return TR_CUDA_CALL(cudaMemsetAsync(x, 0, (size_t)n * elem, cur()));
}

tr_kern_ops_t cuda_ops;
tr_kern_ops_t cuda_bf16_ops;

template <tr_dtype_t DT>
void fill(tr_kern_ops_t* t, const char* name) {
  t->name = name;
  t->embedding_fwd = cu_embedding_fwd<DT>;
  t->embedding_bwd = cu_embedding_bwd<DT>;
  t->embedding_rows_fwd = cu_embedding_rows_fwd<DT>;
  t->embedding_rows_bwd = cu_embedding_rows_bwd<DT>;
  t->layernorm_fwd = cu_layernorm_fwd<DT>;
  t->residual_layernorm_fwd = cu_residual_layernorm_fwd<DT>;
  t->layernorm_bwd = cu_layernorm_bwd<DT>;
  t->rmsnorm_fwd = cu_rmsnorm_fwd<DT>;
  t->residual_rmsnorm_fwd = cu_residual_rmsnorm_fwd<DT>;
  t->rmsnorm_bwd = cu_rmsnorm_bwd<DT>;
  t->gemm = cu_gemm<DT>;
  t->linear_fwd = cu_linear_fwd<DT>;
  t->linear_bwd = cu_linear_bwd<DT>;
  t->linear_bwd_write = cu_linear_bwd_write<DT>;
  t->linear_gelu_fwd = cu_linear_gelu_fwd<DT>;
  t->linear_dgelu_bwd = cu_linear_dgelu_bwd<DT>;
  t->linear_batched = cu_linear_batched<DT>;
  t->rope = cu_rope<DT>;
  t->attention_fwd = cu_attention_fwd<DT>;
  t->attention_bwd = cu_attention_bwd<DT>;
  t->attn_merge = cu_attn_merge<DT>;
  t->gelu_fwd = cu_gelu_fwd<DT>;
  t->gelu_bwd = cu_gelu_bwd<DT>;
  t->swiglu_fwd = cu_swiglu_fwd<DT>;
  t->swiglu_bwd = cu_swiglu_bwd<DT>;
  t->swiglu_bwd_write = cu_swiglu_bwd_write<DT>;
  t->xent_fwd = cu_xent_fwd<DT>;
  t->xent_bwd = cu_xent_bwd<DT>;
  t->xent_fused = cu_xent_fused<DT>;
  t->xent_shard_stats = cu_xent_shard_stats<DT>;
  t->xent_shard_sumexp = cu_xent_shard_sumexp<DT>;
  t->xent_shard_loss = cu_xent_shard_loss;
  t->xent_shard_bwd = cu_xent_shard_bwd<DT>;
  t->adamw = cu_adamw;
  t->adamw_multi = cu_adamw_multi;
  t->sum_squares = cu_sum_squares<DT>;
  t->sum_squares_multi = cu_sum_squares_multi;
  t->step_tail = cu_step_tail;
  t->step_tail_wait = cu_step_tail_wait;
  t->step_tail_release = cu_step_tail_release;
  t->step_begin = cu_step_begin;
  t->scale = cu_scale<DT>;
  t->add = cu_add<DT>;
  t->accumulate = cu_accumulate<DT>;
  t->zero = cu_zero<DT>;
}

void fill_table(void) {
  fill<TR_F32>(&cuda_ops, "cuda");
  fill<TR_BF16>(&cuda_bf16_ops, "cuda-bf16");
  cuda_ops.bf16 = &cuda_bf16_ops;
}

__attribute__((constructor)) void register_at_load(void) {
  tr_kern_cuda_register();
}

}  // namespace

// ---- module ----

extern "C" void tr_kern_cuda_register(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fill_table);
  tr_kern_register(TR_DEV_CUDA, &cuda_ops);
}

extern "C" void tr_kern_cuda_release(void) {
  tr__cuda_matmul_release();
#ifdef HAVE_CUDNN
  tr__cudnn_attn_release();
#endif
}
