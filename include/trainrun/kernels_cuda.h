/* trainrun/kernels_cuda.h: the CUDA kernels' own entry points (bf16 and
 * fp32), for the fast training path and for tests and benchmarks.
 *
 * The tensor-level API (trainrun/kernels.h, tr_kern_*) runs these kernels
 * for fp32 cuda tensors through the "cuda" table, which this module
 * registers when the library loads. Code that wants bf16 compute (the GPU
 * trainer) calls the functions below directly. They exist only in builds
 * with HAVE_CUDA.
 *
 * Conventions:
 *
 *  - dt is the element type of activations and weights of one call:
 *    TR_BF16 (compute in fp32 registers, store bf16) or TR_F32. Anything
 *    else gives TR_EDTYPE. Parameter gradients, saved statistics (mean,
 *    rstd, lse), losses and optimizer state are always fp32 ("float*").
 *  - Pointers are device pointers of the calling thread's current device.
 *    Row-major; N rows (tokens, B*T) of C channels. Contiguous unless a
 *    row stride (in elements) is given.
 *  - Every function takes the stream it enqueues on (NULL: the legacy
 *    default stream), never synchronizes the host (except where noted),
 *    checks its shapes (TR_EINVAL, logged) and the launch (TR_ECUDA, with
 *    CUDA's message logged). Errors of a kernel that already ran show up
 *    at a later call or synchronization, as CUDA reports them.
 *  - Backward functions ACCUMULATE (+=) into every gradient they produce,
 *    like the tr_kern_* contract, unless they take an `accumulate` flag.
 *  - Deterministic: the same inputs on the same GPU give the same bits;
 *    no float atomics. Sums are done in fp32 over fixed-size chunks, then
 *    the chunks in order.
 *  - Temporary device memory comes from the device's stream-ordered pool
 *    (cudaMallocAsync), so calls may be captured into CUDA graphs.
 */
#ifndef TRAINRUN_KERNELS_CUDA_H
#define TRAINRUN_KERNELS_CUDA_H

#include <stdint.h>

#include "trainrun/kernels.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Same type as cudaStream_t, without including CUDA's headers. */
typedef struct CUstream_st* tr_cuda_stream_t;
/* A bf16 value as stored (see tr_f32_to_bf16 / tr_bf16_to_f32). */
typedef uint16_t tr_bf16_t;

/* ---- module ---- */

/* Register the "cuda" table of trainrun/kernels.h (done at load time; call
 * it from programs that link libtrainrun statically). */
void tr_kern_cuda_register(void);
/* Create the current device's cuBLASLt handle and memory-pool settings now
 * rather than at the first call (keeps that cost out of a timed region). */
int tr_kern_cuda_init(void);
/* Destroy handles and cached GEMM plans of every device. Not to be called
 * while kernels are being enqueued. */
void tr_kern_cuda_release(void);

/* fp32 GEMMs of the fp32 path: 0 = full fp32 (default), 1 = TF32 tensor
 * cores (about 1e-3 relative error). Process-wide. */
void tr_kern_cuda_set_tf32(int on);
/* GEMM algorithms timed at a GEMM shape's first use (kernels/cuda/
 * matmul.cu): cuBLASLt's first n candidates; 1: the heuristic's pick only;
 * 0 (or never called): TRAINRUN_GEMM_TUNE. Plans built before the call
 * keep theirs. Under tr_kern_cuda_set_deterministic every plan built takes
 * the heuristic's pick (timed picks vary from run to run). Process-wide.
 * The candidates write C where beta is 0 (else a scratch room) and an aux
 * the GEMM writes: a GEMM whose C the real call reads is never tuned in
 * place (an aux overlapping C is not tuned). */
void tr_kern_cuda_set_gemm_tune(int n);
/* Switch every plan whose candidates' timings have completed (no wait) to
 * its fastest candidate where that beats the heuristic's pick by 3%. Until then, and between two calls, a plan keeps
 * its algorithm: call it between steps (the trainer does, before each),
 * so that recomputed activations equal the first pass's bits. */
void tr_kern_cuda_gemm_tune_apply(void);
/* The process's GEMM plans whose candidates were timed and compared, and
 * those of them where another candidate than the heuristic's won. */
void tr_kern_cuda_gemm_tune_stats(int64_t* timed, int64_t* changed);

/* Benchmarks (bench/kernels_bench -a): every GEMM runs its plan's
 * candidate k (0: the heuristic's pick; plans built after
 * tr_kern_cuda_set_gemm_tune(n) hold n), whatever the timings chose;
 * -1 (the default): the plan's own pick. A run whose plan holds no
 * candidate k runs the plan's pick and counts in
 * tr_kern_cuda_gemm_pick_misses. Process-wide. */
void tr_kern_cuda_set_gemm_pick(int k);
int64_t tr_kern_cuda_gemm_pick_misses(void);

/* ---- embedding ---- */

/* out[B*T, C] = wte[tok] (+ wpe[t] when wpe != NULL). A token outside
 * [0, V) gives a row of NaNs (no out-of-bounds read). */
int tr_kern_cuda_embedding_fwd(tr_dtype_t dt, void* out, const int32_t* tok,
                               const void* wte, const void* wpe, int B, int T,
                               int C, int V, tr_cuda_stream_t s);
/* dwte[tok] += dout, dwpe[t] += dout (dwpe may be NULL); fp32 grads. The
 * rows of each token are summed in position order after a stable sort of
 * the tokens, so the result does not depend on scheduling. Tokens outside
 * [0, V) are skipped. */
int tr_kern_cuda_embedding_bwd(tr_dtype_t dt, float* dwte, float* dwpe,
                               const void* dout, const int32_t* tok, int B,
                               int T, int C, int V, tr_cuda_stream_t s);
/* The vocabulary-parallel slice: wte holds the table's rows [row0, row0 +
 * rows); a token outside them gives a row of zeros (no positions), and no
 * gradient (dwpe still gets every row's). */
int tr_kern_cuda_embedding_rows_fwd(tr_dtype_t dt, void* out,
                                    const int32_t* tok, const void* wte,
                                    int64_t row0, int rows, int B, int T, int C,
                                    tr_cuda_stream_t s);
int tr_kern_cuda_embedding_rows_bwd(tr_dtype_t dt, float* dwte, float* dwpe,
                                    const void* dout, const int32_t* tok,
                                    int64_t row0, int rows, int B, int T, int C,
                                    tr_cuda_stream_t s);

/* ---- norms ---- */

/* LayerNorm over C: out = (x - mean) * rstd * w + b (b may be NULL);
 * mean[N], rstd[N] saved. */
int tr_kern_cuda_layernorm_fwd(tr_dtype_t dt, void* out, float* mean,
                               float* rstd, const void* inp, const void* w,
                               const void* b, int64_t N, int C, float eps,
                               tr_cuda_stream_t s);
/* Fused residual add + LayerNorm: resid = a + b_in (stored, rounded to dt),
 * then out = LayerNorm(resid). The backward of the pair is
 * tr_kern_cuda_layernorm_bwd accumulating into the residual stream's
 * gradient (which also flows to a and b_in unchanged). */
int tr_kern_cuda_residual_layernorm_fwd(tr_dtype_t dt, void* resid, void* out,
                                        float* mean, float* rstd, const void* a,
                                        const void* b_in, const void* w,
                                        const void* b, int64_t N, int C,
                                        float eps, tr_cuda_stream_t s);
/* dinp (dt) += ..., dw and db (fp32) += ...; any of the three may be NULL. */
int tr_kern_cuda_layernorm_bwd(tr_dtype_t dt, void* dinp, float* dw, float* db,
                               const void* dout, const void* inp, const void* w,
                               const float* mean, const float* rstd, int64_t N,
                               int C, tr_cuda_stream_t s);
/* RMSNorm: out = x * rstd * w, rstd = (mean(x^2) + eps)^-1/2. */
int tr_kern_cuda_rmsnorm_fwd(tr_dtype_t dt, void* out, float* rstd,
                             const void* inp, const void* w, int64_t N, int C,
                             float eps, tr_cuda_stream_t s);
int tr_kern_cuda_residual_rmsnorm_fwd(tr_dtype_t dt, void* resid, void* out,
                                      float* rstd, const void* a,
                                      const void* b_in, const void* w,
                                      int64_t N, int C, float eps,
                                      tr_cuda_stream_t s);
int tr_kern_cuda_rmsnorm_bwd(tr_dtype_t dt, void* dinp, float* dw,
                             const void* dout, const void* inp, const void* w,
                             const float* rstd, int64_t N, int C,
                             tr_cuda_stream_t s);

/* ---- GEMM (cuBLASLt) ---- */

typedef enum {
  TR_CUDA_EPI_NONE = 0,
  TR_CUDA_EPI_BIAS = 1, /* + bias[n] */
  TR_CUDA_EPI_GELU = 2, /* gelu(. [+ bias]); the input of the GELU is
                                stored in aux when aux != NULL */
  TR_CUDA_EPI_DGELU = 3 /* (. ) * gelu'(aux): the GELU's backward fused
                                into the GEMM that produces its input
                                gradient; needs beta == 0 */
} tr_cuda_epilogue_t;

/* C[M,N] = epilogue(alpha op(A)[M,K] op(B)[K,N] + beta C), row-major,
 * fp32 accumulation. transa: A is stored [K,M] (lda >= M), else [M,K]
 * (lda >= K); same for B. A and B have type ab_type (TR_BF16 or TR_F32);
 * C has c_type (TR_BF16, or TR_F32 also with bf16 A and B: fp32 gradients
 * accumulated with beta = 1). bias [N] and aux [M,N] (row stride ldaux,
 * a multiple of 8) have type c_type.
 * Plans (descriptors and an algorithm: tr_kern_cuda_set_gemm_tune) are
 * cached per shape, dtype, alignment and device; an epilogue cuBLASLt does
 * not offer for a case runs as separate kernels with the same result.
 * beta == 0 ignores C's old contents (NaNs included). */
typedef struct {
  int transa, transb;
  int64_t M, N, K;
  const void* A;
  int64_t lda;
  const void* B;
  int64_t ldb;
  void* C;
  int64_t ldc;
  tr_dtype_t ab_type, c_type;
  float alpha, beta;
  tr_cuda_epilogue_t epilogue;
  int with_bias; /* add bias (TR_CUDA_EPI_BIAS and TR_CUDA_EPI_GELU) */
  const void* bias;
  void* aux;
  int64_t ldaux;
  /* Strided batch (0 or 1: one GEMM): batch GEMMs of the sizes above,
   * the b-th on A + b stride_a, B + b stride_b, C + b stride_c and aux +
   * b stride_aux (elements); a stride of 0 shares the operand (a linear
   * layer's weight), and bias is shared. One cuBLASLt call (strided batch
   * layouts); where cuBLASLt has no algorithm, one GEMM a batch. The bias
   * gradient epilogue is not batched. */
  int64_t batch;
  int64_t stride_a, stride_b, stride_c, stride_aux;
} tr_cuda_gemm_t;
int tr_kern_cuda_gemm(const tr_cuda_gemm_t* g, tr_cuda_stream_t s);

/* Linear layer (weight [OC, IC], y = x w^T + bias): out[N,OC] (dt);
 * bias [OC] or NULL. gelu != 0 applies GELU and, with pre != NULL, stores
 * its input in pre [N,OC] (for tr_kern_cuda_linear_bwd's pre). */
int tr_kern_cuda_linear_fwd(tr_dtype_t dt, void* out, void* pre,
                            const void* inp, const void* w, const void* bias,
                            int64_t N, int IC, int OC, int gelu,
                            tr_cuda_stream_t s);
/* dinp (dt) [N,IC] += dout w, or with pre != NULL (the input of a GELU
 * that precedes this layer, [N,IC]) dinp = (dout w) * gelu'(pre)
 * (overwritten: the GELU backward fused into the GEMM);
 * dw (fp32) [OC,IC] += dout^T inp; dbias (fp32) [OC] += colsum(dout).
 * dinp, dw, dbias may each be NULL. */
int tr_kern_cuda_linear_bwd(tr_dtype_t dt, void* dinp, float* dw, float* dbias,
                            const void* dout, const void* inp, const void* w,
                            const void* pre, int64_t N, int IC, int OC,
                            tr_cuda_stream_t s);
/* dbias[j] += sum over rows of dout[i, j] (dout [N, OC] of dt). */
int tr_kern_cuda_bias_bwd(tr_dtype_t dt, float* dbias, const void* dout,
                          int64_t N, int OC, tr_cuda_stream_t s);

/* ---- RoPE ---- */

/* x [B,T,H*D] with row stride `stride`, in place, Hugging Face rotate_half
 * pairs (i, i + D/2); cos/sin [>= T, D/2] fp32 (tr_kern_rope_table copied
 * to the device). inverse = the backward. */
int tr_kern_cuda_rope(tr_dtype_t dt, void* x, const float* cos_t,
                      const float* sin_t, int B, int T, int H, int D,
                      int64_t stride, int inverse, tr_cuda_stream_t s);

/* ---- activations ---- */

/* GELU, tanh approximation. out may equal inp. */
int tr_kern_cuda_gelu_fwd(tr_dtype_t dt, void* out, const void* inp, int64_t n,
                          tr_cuda_stream_t s);
/* dinp += dout * gelu'(inp). */
int tr_kern_cuda_gelu_bwd(tr_dtype_t dt, void* dinp, const void* dout,
                          const void* inp, int64_t n, tr_cuda_stream_t s);
/* out = silu(gate) * up. */
int tr_kern_cuda_swiglu_fwd(tr_dtype_t dt, void* out, const void* gate,
                            const void* up, int64_t n, tr_cuda_stream_t s);
/* dgate += ..., dup += ... */
int tr_kern_cuda_swiglu_bwd(tr_dtype_t dt, void* dgate, void* dup,
                            const void* dout, const void* gate, const void* up,
                            int64_t n, tr_cuda_stream_t s);

/* ---- classifier: softmax + cross-entropy ---- */

/* logits [N, V] with row stride ld >= V (GPT-2 pads its vocab to Vp
 * columns; padding columns are ignored). targets [N] int32; a target equal
 * to TR_IGNORE_INDEX adds no loss and gets a zero gradient row; one outside
 * [0, V) gives a NaN loss (and a zero gradient row) and, when err != NULL,
 * stores the smallest such row index in *err (device int, which the caller
 * sets to INT32_MAX beforehand).
 *
 * Fused forward + backward in one pass over each row (reading it twice,
 * writing it once): losses[N] (fp32), lse[N] (fp32, may be NULL), and the
 * logits overwritten with dlogits = scale * (softmax - onehot) in dt
 * (padding columns set to 0). scale is d(objective)/d(each token's loss).
 * want_grad == 0 computes the losses only and leaves logits unchanged
 * (evaluation). */
int tr_kern_cuda_classifier(tr_dtype_t dt, void* logits, int64_t ld,
                            float* losses, float* lse, const int32_t* targets,
                            int64_t N, int V, float scale, int want_grad,
                            int* err, tr_cuda_stream_t s);
/* The two halves, for the fp32 table: forward only (losses, lse), and the
 * backward that turns logits into dlogits in place from a saved lse. */
int tr_kern_cuda_xent_fwd(tr_dtype_t dt, float* losses, float* lse,
                          const void* logits, int64_t ld,
                          const int32_t* targets, int64_t N, int V, int* err,
                          tr_cuda_stream_t s);
int tr_kern_cuda_xent_bwd(tr_dtype_t dt, void* logits, int64_t ld,
                          const float* lse, const int32_t* targets, int64_t N,
                          int V, float scale, tr_cuda_stream_t s);
/* Vocabulary-parallel cross-entropy over the columns [voff, voff + V) of
 * the vocabulary (tr_kern_ops_t.xent_shard_*; one block per row, no
 * target range check). */
int tr_kern_cuda_xent_shard_stats(tr_dtype_t dt, float* max, float* tgt,
                                  const void* logits, int64_t ld,
                                  const int32_t* targets, int64_t N, int V,
                                  int64_t voff, tr_cuda_stream_t s);
int tr_kern_cuda_xent_shard_sumexp(tr_dtype_t dt, float* sum,
                                   const void* logits, int64_t ld,
                                   const float* max, int64_t N, int V,
                                   tr_cuda_stream_t s);
int tr_kern_cuda_xent_shard_loss(float* losses, float* lse, const float* max,
                                 const float* sum, const float* tgt,
                                 const int32_t* targets, int64_t N,
                                 tr_cuda_stream_t s);
int tr_kern_cuda_xent_shard_bwd(tr_dtype_t dt, void* logits, int64_t ld,
                                const float* lse, const int32_t* targets,
                                int64_t N, int V, int64_t voff, float scale,
                                tr_cuda_stream_t s);

/* ---- attention ---- */

typedef enum {
  TR_CUDA_ATTN_AUTO = 0,  /* cuDNN's fused attention in builds with cuDNN
                             when it applies (bf16, D % 8 == 0, D <= 128,
                             16-byte aligned rows) and cuDNN accepts the
                             shape; else the tensor-core flash kernel when
                             it applies (bf16, D in {64, 128}, 16-byte
                             aligned rows); else the SIMT kernel */
  TR_CUDA_ATTN_SIMT = 1,  /* portable kernel: any dtype, D <= 256 */
  TR_CUDA_ATTN_FLASH = 2, /* tensor-core kernel (TR_EUNSUPPORTED when it
                             does not apply) */
  TR_CUDA_ATTN_CUDNN = 3  /* cuDNN fused attention (TR_EUNSUPPORTED when
                             it does not apply, the build has no cuDNN, or
                             cuDNN declines the shape) */
} tr_cuda_attn_impl_t;
/* Choose the implementation (process-wide). The default is AUTO, or what
 * TRAINRUN_ATTENTION (auto, cudnn, flash, simt) says. The lse of every
 * implementation is the natural-log log-sum-exp of the scaled scores, so
 * the backward may run another implementation than its forward. */
void tr_kern_cuda_set_attention(tr_cuda_attn_impl_t impl);
tr_cuda_attn_impl_t tr_kern_cuda_get_attention(void);
/* cuDNN attention's engine config (kernels/cuda/cudnn_attention.cu):
 * config 0 is the first of cuDNN's heuristics' list that builds (the
 * default); config k the k-th entry after it in that list, which goes on
 * with variants of config 0 with one knob changed. A graph whose entry k
 * does not build, or has none, runs config 0 and counts in
 * tr_kern_cuda_attn_config_misses. -1: TRAINRUN_CUDNN_ATTN_CONFIG (default
 * 0). Drops every cached cuDNN attention plan: call it with no cuDNN
 * attention in flight (bench/kernels_bench -c and the tests do, between
 * runs). No-ops in builds without cuDNN. Process-wide. */
void tr_kern_cuda_set_attn_config(int k);
int64_t tr_kern_cuda_attn_config_misses(void);
/* cuDNN attention's engine configs timed at each graph's first use, as
 * the GEMMs' algorithms are (tr_kern_cuda_set_gemm_tune): config 0 and the
 * next n - 1 entries of the list above that build (a workspace of at most
 * 256 MiB, or config 0's) run once each, then in 5 interleaved rounds with
 * an event after each run, on the call's stream and tensors before its
 * real run; tr_kern_cuda_attn_tune_apply then keeps the fastest where it
 * beats config 0 by 3% (and config 0 takes 20 us or more, as for GEMMs).
 * 1: config 0 only, no timing; 0 or -1: TRAINRUN_CUDNN_ATTN_TUNE (default 4). A config k set above, [debug]
 * deterministic, and the backward before cuDNN 9.6 time nothing. Drops
 * every cached cuDNN attention plan, as tr_kern_cuda_set_attn_config. */
void tr_kern_cuda_set_attn_tune(int n);
/* Switch every cuDNN attention graph whose timings have completed (no
 * wait) to its fastest config; between steps, as
 * tr_kern_cuda_gemm_tune_apply (the trainer calls both before each). */
void tr_kern_cuda_attn_tune_apply(void);
/* The graphs whose candidates were timed, and those where another config
 * than config 0 won. */
void tr_kern_cuda_attn_tune_stats(int64_t* timed, int64_t* changed);

/* [debug] deterministic (process-wide; set before the first kernel):
 * refuse the kernels whose results are not bit-reproducible. The one such
 * choice is cuDNN's attention backward, which by default sums dQ through
 * fp32 atomics (as PyTorch's flash and cuDNN backward do): with on, it
 * runs the graph that writes dQ directly, and a shape no engine of that
 * graph takes (or whose every engine wants a workspace above a quarter of
 * the free memory: they keep dS, B H T^2 bf16) is declined and the
 * deterministic flash/SIMT backward runs; with warn_only as well, the
 * atomic graph runs there with a warning. cuBLAS(Lt) matmuls are
 * deterministic given their algorithm (one stream and one workspace per
 * handle, no atomics mode); with on, plans built after the call take the
 * heuristic's pick instead of timing candidates (tr_kern_cuda_set_gemm_tune).
 * Call it before the first GEMM. */
void tr_kern_cuda_set_deterministic(int on, int warn_only);

/* Causal attention, softmax(q k^T / sqrt(D)) v, grouped-query heads
 * (query head h reads kv head h / (H / KVH)). q [B,T,H*D] with row stride
 * qs; k and v [B,T,KVH*D] with row stride kvs (column slices of a fused
 * qkv buffer are fine); out [B,T,H*D] contiguous; lse [B,H,T] fp32.
 * mask: NULL (causal) or a document / sliding-window mask
 * (tr_kern_attn_mask_t; doc_start in device memory). The SIMT and flash
 * kernels take every mask and skip the key tiles no row of a query tile
 * sees. cuDNN takes document masks alone (no window, no shift) as a
 * ragged graph (cuDNN 9.6 or later; a batch whose documents it declines,
 * kernels/cuda/common.cuh, goes to flash under AUTO) and a shift under
 * which every row sees every key (context parallelism's full chunk pairs)
 * as unmasked attention; other masks go to flash or SIMT under AUTO and
 * are TR_EUNSUPPORTED under an explicit cuDNN choice. */
int tr_kern_cuda_attention_fwd(tr_dtype_t dt, void* out, float* lse,
                               const void* q, const void* k, const void* v,
                               int B, int T, int H, int KVH, int D, int64_t qs,
                               int64_t kvs, const tr_kern_attn_mask_t* mask,
                               tr_cuda_stream_t s);
/* dq, dk, dv (strides of q, k, v): accumulate != 0 adds (+=), else
 * overwrites. Recomputes the scores from lse (no T x T buffer). mask: the
 * forward's. */
int tr_kern_cuda_attention_bwd(tr_dtype_t dt, void* dq, void* dk, void* dv,
                               const void* dout, const void* q, const void* k,
                               const void* v, const void* out, const float* lse,
                               int B, int T, int H, int KVH, int D, int64_t qs,
                               int64_t kvs, const tr_kern_attn_mask_t* mask,
                               int accumulate, tr_cuda_stream_t s);

/* ---- optimizer and gradient norm ---- */

/* One tensor of a multi-tensor AdamW step: the dispatch table's
 * (trainrun/kernels.h; param_bf16 points at tr_bf16_t elements). */
typedef tr_kern_adamw_tensor_t tr_cuda_adamw_tensor_t;
/* AdamW (torch.optim.AdamW's arithmetic, as tr_adamw_args_t documents) on
 * every listed tensor in as few launches as fit the kernel parameters.
 * The gradient multiplier is args->grad_scale times *grad_scale_dev when
 * grad_scale_dev != NULL (a device float, e.g. the clipping factor from
 * tr_kern_cuda_clip_factor, so no host synchronization is needed). */
int tr_kern_cuda_adamw(const tr_cuda_adamw_tensor_t* tensors, int n_tensors,
                       const tr_adamw_args_t* args, const float* grad_scale_dev,
                       tr_cuda_stream_t s);

/* A span of device memory holding n elements of dtype (TR_F32 or TR_BF16):
 * the dispatch table's span (trainrun/kernels.h). */
typedef tr_kern_span_t tr_cuda_span_t;
/* *out_dev (a device double) = sum of x^2 over all spans: fp32 partial sums
 * of fixed-size chunks, then the partials added in order in double. */
int tr_kern_cuda_sum_squares(double* out_dev, const tr_cuda_span_t* spans,
                             int n_spans, tr_cuda_stream_t s);
/* *factor_dev = min(1, max_norm / (sqrt(*sumsq_dev) + 1e-6)) and, when
 * norm_dev != NULL, *norm_dev = sqrt(*sumsq_dev) (torch's
 * clip_grad_norm_), all on the device. */
int tr_kern_cuda_clip_factor(float* factor_dev, float* norm_dev,
                             const double* sumsq_dev, double max_norm,
                             tr_cuda_stream_t s);

/* ---- elementwise ---- */

/* acc (fp32 [B, T, H*D]), lse (fp32 [B, H, T]) merged with pout (dt),
 * plse: the table's attn_merge (trainrun/kernels.h). */
int tr_kern_cuda_attn_merge(tr_dtype_t dt, float* acc, float* lse,
                            const void* pout, const float* plse, int B, int T,
                            int H, int D, tr_cuda_stream_t s);
int tr_kern_cuda_add(tr_dtype_t dt, void* out, const void* a, const void* b,
                     int64_t n, tr_cuda_stream_t s); /* out = a + b */
int tr_kern_cuda_accumulate(tr_dtype_t dt, void* y, const void* x, int64_t n,
                            tr_cuda_stream_t s); /* y += x */
int tr_kern_cuda_scale(tr_dtype_t dt, void* x, float alpha, int64_t n,
                       tr_cuda_stream_t s); /* x *= alpha */
/* dst (dst_dt) = src (src_dt) converted, n elements (f32 <-> bf16). */
int tr_kern_cuda_convert(tr_dtype_t dst_dt, void* dst, tr_dtype_t src_dt,
                         const void* src, int64_t n, tr_cuda_stream_t s);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_KERNELS_CUDA_H */
