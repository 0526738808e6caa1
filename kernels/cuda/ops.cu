// kernels/cuda/ops.cu: the "cuda" table of trainrun/kernels.h: the fp32
// entry points, each running the CUDA kernels on the calling thread's
// stream (tr_kern_set_stream), registered when the library loads.
//
// A few entries synchronize that stream, because their contract returns
// something to the host: sum_squares (a host double) and xent_fwd (targets
// out of range give TR_EINVAL, naming the first). The bf16 training path
// calls the kernels_cuda.h functions instead, which never synchronize.
#include "kernels/cuda/common.cuh"

#include <limits.h>
#include <pthread.h>
#include <string.h>

extern "C" void tr__cuda_matmul_release(void);

// ---- table entries ----

namespace {

cudaStream_t cur(void) { return (cudaStream_t)tr_kern_get_stream(); }

int cu_embedding_fwd(float* out, const int32_t* tok, const float* wte,
                     const float* wpe, int B, int T, int C) {
  // the table does not pass the vocabulary size: the tensor entry point
  // checks tokens on the host for CPU tensors only
  return tr_kern_cuda_embedding_fwd(TR_F32, out, tok, wte, wpe, B, T, C,
                                    INT_MAX, cur());
}

int cu_embedding_bwd(float* dwte, float* dwpe, const float* dout,
                     const int32_t* tok, int B, int T, int C) {
  return tr_kern_cuda_embedding_bwd(TR_F32, dwte, dwpe, dout, tok, B, T, C,
                                    INT_MAX, cur());
}

int cu_layernorm_fwd(float* out, float* mean, float* rstd, const float* inp,
                     const float* w, const float* b, int64_t N, int C,
                     float eps) {
  return tr_kern_cuda_layernorm_fwd(TR_F32, out, mean, rstd, inp, w, b, N, C,
                                    eps, cur());
}

int cu_layernorm_bwd(float* dinp, float* dw, float* db, const float* dout,
                     const float* inp, const float* w, const float* mean,
                     const float* rstd, int64_t N, int C) {
  return tr_kern_cuda_layernorm_bwd(TR_F32, dinp, dw, db, dout, inp, w, mean,
                                    rstd, N, C, cur());
}

int cu_rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* w,
                   int64_t N, int C, float eps) {
  return tr_kern_cuda_rmsnorm_fwd(TR_F32, out, rstd, inp, w, N, C, eps, cur());
}

int cu_rmsnorm_bwd(float* dinp, float* dw, const float* dout, const float* inp,
                   const float* w, const float* rstd, int64_t N, int C) {
  return tr_kern_cuda_rmsnorm_bwd(TR_F32, dinp, dw, dout, inp, w, rstd, N, C,
                                  cur());
}

int cu_gemm(int transa, int transb, int64_t M, int64_t N, int64_t K,
            float alpha, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc) {
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
  g.ab_type = g.c_type = TR_F32;
  g.alpha = alpha;
  g.beta = beta;
  return tr_kern_cuda_gemm(&g, cur());
}

int cu_linear_fwd(float* out, const float* inp, const float* w,
                  const float* bias, int64_t N, int IC, int OC) {
  return tr_kern_cuda_linear_fwd(TR_F32, out, NULL, inp, w, bias, N, IC, OC, 0,
                                 cur());
}

int cu_linear_bwd(float* dinp, float* dw, float* dbias, const float* dout,
                  const float* inp, const float* w, int64_t N, int IC, int OC) {
  return tr_kern_cuda_linear_bwd(TR_F32, dinp, dw, dbias, dout, inp, w, NULL, N,
                                 IC, OC, cur());
}

int cu_rope(float* x, const float* cos_t, const float* sin_t, int B, int T,
            int H, int D, int64_t stride, int inverse) {
  return tr_kern_cuda_rope(TR_F32, x, cos_t, sin_t, B, T, H, D, stride, inverse,
                           cur());
}

int cu_attention_fwd(float* out, float* lse, const float* q, const float* k,
                     const float* v, int B, int T, int H, int KVH, int D,
                     int64_t q_stride, int64_t kv_stride) {
  return tr_kern_cuda_attention_fwd(TR_F32, out, lse, q, k, v, B, T, H, KVH, D,
                                    q_stride, kv_stride, cur());
}

int cu_attention_bwd(float* dq, float* dk, float* dv, const float* dout,
                     const float* q, const float* k, const float* v,
                     const float* out, const float* lse, int B, int T, int H,
                     int KVH, int D, int64_t q_stride, int64_t kv_stride) {
  return tr_kern_cuda_attention_bwd(TR_F32, dq, dk, dv, dout, q, k, v, out, lse,
                                    B, T, H, KVH, D, q_stride, kv_stride, 1,
                                    cur());
}

int cu_gelu_fwd(float* out, const float* inp, int64_t n) {
  return tr_kern_cuda_gelu_fwd(TR_F32, out, inp, n, cur());
}

int cu_gelu_bwd(float* dinp, const float* dout, const float* inp, int64_t n) {
  return tr_kern_cuda_gelu_bwd(TR_F32, dinp, dout, inp, n, cur());
}

int cu_swiglu_fwd(float* out, const float* gate, const float* up, int64_t n) {
  return tr_kern_cuda_swiglu_fwd(TR_F32, out, gate, up, n, cur());
}

int cu_swiglu_bwd(float* dgate, float* dup, const float* dout,
                  const float* gate, const float* up, int64_t n) {
  return tr_kern_cuda_swiglu_bwd(TR_F32, dgate, dup, dout, gate, up, n, cur());
}

int cu_xent_fwd(float* losses, float* lse, const float* logits,
                const int32_t* targets, int64_t N, int V) {
  cudaStream_t s = cur();
  static const int none = INT_MAX;
  int* err = NULL;
  int herr = INT_MAX, rc;
  TR_CHECK(tr__cuda_tmp_alloc((void**)&err, sizeof(int), s));
  rc = TR_CUDA_CALL(
      cudaMemcpyAsync(err, &none, sizeof none, cudaMemcpyHostToDevice, s));
  if (rc == 0)
    rc = tr_kern_cuda_xent_fwd(TR_F32, losses, lse, logits, V, targets, N, V,
                               err, s);
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

int cu_xent_bwd(float* logits, const float* lse, const int32_t* targets,
                int64_t N, int V, float scale) {
  return tr_kern_cuda_xent_bwd(TR_F32, logits, V, lse, targets, N, V, scale,
                               cur());
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

int cu_sum_squares(double* out, const float* x, int64_t n) {
  cudaStream_t s = cur();
  double* d = NULL;
  tr_cuda_span_t span = {x, TR_F32, n};
  TR_CHECK(tr__cuda_tmp_alloc((void**)&d, sizeof(double), s));
  int rc = tr_kern_cuda_sum_squares(d, &span, 1, s);
  if (rc == 0)
    rc = TR_CUDA_CALL(
        cudaMemcpyAsync(out, d, sizeof(double), cudaMemcpyDeviceToHost, s));
  tr__cuda_tmp_free(d, s);
  if (rc == 0) rc = TR_CUDA_CALL(cudaStreamSynchronize(s));
  return rc;
}

int cu_scale(float* x, float a, int64_t n) {
  return tr_kern_cuda_scale(TR_F32, x, a, n, cur());
}

int cu_add(float* out, const float* a, const float* b, int64_t n) {
  return tr_kern_cuda_add(TR_F32, out, a, b, n, cur());
}

int cu_accumulate(float* y, const float* x, int64_t n) {
  return tr_kern_cuda_accumulate(TR_F32, y, x, n, cur());
}

int cu_zero(float* x, int64_t n) {
  if (n <= 0) return 0;
  return TR_CUDA_CALL(cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), cur()));
}

tr_kern_ops_t cuda_ops;

void fill_table(void) {
  cuda_ops.name = "cuda";
  cuda_ops.embedding_fwd = cu_embedding_fwd;
  cuda_ops.embedding_bwd = cu_embedding_bwd;
  cuda_ops.layernorm_fwd = cu_layernorm_fwd;
  cuda_ops.layernorm_bwd = cu_layernorm_bwd;
  cuda_ops.rmsnorm_fwd = cu_rmsnorm_fwd;
  cuda_ops.rmsnorm_bwd = cu_rmsnorm_bwd;
  cuda_ops.gemm = cu_gemm;
  cuda_ops.linear_fwd = cu_linear_fwd;
  cuda_ops.linear_bwd = cu_linear_bwd;
  cuda_ops.rope = cu_rope;
  cuda_ops.attention_fwd = cu_attention_fwd;
  cuda_ops.attention_bwd = cu_attention_bwd;
  cuda_ops.gelu_fwd = cu_gelu_fwd;
  cuda_ops.gelu_bwd = cu_gelu_bwd;
  cuda_ops.swiglu_fwd = cu_swiglu_fwd;
  cuda_ops.swiglu_bwd = cu_swiglu_bwd;
  cuda_ops.xent_fwd = cu_xent_fwd;
  cuda_ops.xent_bwd = cu_xent_bwd;
  cuda_ops.adamw = cu_adamw;
  cuda_ops.sum_squares = cu_sum_squares;
  cuda_ops.scale = cu_scale;
  cuda_ops.add = cu_add;
  cuda_ops.accumulate = cu_accumulate;
  cuda_ops.zero = cu_zero;
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

extern "C" void tr_kern_cuda_release(void) { tr__cuda_matmul_release(); }
