/* trainrun/kernels.h: the local compute kernels behind one dispatch table.
 *
 * Every op the model needs (embedding, LayerNorm, RMSNorm, linear/GEMM,
 * RoPE, causal attention with grouped-query heads, GELU-tanh, SwiGLU, fused
 * softmax + cross-entropy, AdamW, grad norm, residual add) has a forward and,
 * where it has parameters or inputs that need gradients, a backward.
 *
 * Two levels:
 *
 *  - tr_kern_<op>(...) take tr_tensor_t arguments. They check dtype (fp32,
 *    int32 for tokens/targets), device (all on one device), contiguity and
 *    shapes, then call the table of the tensors' device. They return 0,
 *    TR_EDTYPE, TR_EDEVICE, TR_ESHAPE, TR_EINVAL, or TR_EUNSUPPORTED for a
 *    device type whose table is not registered (cuda tensors until the CUDA
 *    kernels register theirs). This is what model/ calls.
 *
 *  - tr_kern_ops_t is the per-device table of raw entry points: pointers
 *    (host pointers for the CPU table, device pointers for CUDA) plus dims.
 *    tr_kern_ops(TR_DEV_CPU) is always filled; tr_kern_register() installs
 *    another device type's table (kernels/cuda does this at load time).
 *    Raw entry points trust their arguments; they return 0 or a TR_E* code.
 *
 * Conventions shared by every op:
 *
 *  - Row-major. "N" is the number of rows (tokens: B*T), "C" channels.
 *  - Backward kernels ACCUMULATE (+=) into every gradient they produce, input
 *    gradients and parameter gradients alike: callers zero a buffer before
 *    its first use. This lets residual streams, tied weights and gradient
 *    accumulation work without extra passes. Documented exceptions:
 *    tr_kern_rope (both directions) and tr_kern_xent_bwd (turns logits into
 *    dlogits) work in place, tr_kern_attention_bwd overwrites dq, dk
 *    and dv (the one writer of a layer's q|k|v gradient), and
 *    tr_kern_linear_dgelu_bwd and tr_kern_linear_bwd_write overwrite dinp
 *    and tr_kern_swiglu_bwd_write dgate and dup (the first writer of an
 *    input gradient needs no zeroed buffer).
 *  - Deterministic: a result never depends on the number of threads. Every
 *    output element is summed in one fixed order by one thread; global
 *    reductions (loss, norms) sum fixed-size chunks, then the chunks in
 *    order. Same inputs, same bits, with 1 or 64 threads.
 *  - The CUDA table will run on the calling thread's current stream
 *    (tr_kern_set_stream); the CPU table ignores it.
 *
 * Threads (CPU): one pool per process, sized from TRAINRUN_NUM_THREADS, else
 * OMP_NUM_THREADS, else the number of online cores; the caller's thread is
 * one of them. Kernels may be called from one thread at a time (the pool is
 * not re-entrant; a nested call runs serially). OpenBLAS, when built in, is
 * called from the pool's threads with its own threading set to 1.
 */
#ifndef TRAINRUN_KERNELS_H
#define TRAINRUN_KERNELS_H

#include <stdint.h>

#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_IGNORE_INDEX (-100) /* targets equal to this add no loss */

/* An attention mask beyond causality, as the attention entries take it
 * (FlexAttention's document and sliding-window masks, and both at once).
 * Query row i of batch b sees the keys j with
 *
 *     lo(b, i) <= j <= i,  lo = max(doc_start[b*T + i], i - window + 1)
 *
 * so each row sees one contiguous run of keys ending at itself.
 *
 *  - doc_start [B*T] int32 (device memory of the table's device), or NULL
 *    for one document per row: the position where row i's document
 *    begins, doc_start[i - 1] <= doc_start[i] <= i (documents are
 *    contiguous runs of positions). tr_kern_attn_doc_start derives it
 *    from the tokens (torchtitan's block_causal mask).
 *  - window > 0: each query sees at most the `window` most recent keys,
 *    itself included (torchtitan's get_sliding_window_mask_mod:
 *    q - k < window; window 1 sees only itself); 0: no window.
 *
 *  - q_shift: query row i stands at key position i + q_shift (the
 *    query and key rows are two chunks of one sequence, q_shift = the
 *    query chunk's start minus the key chunk's: context parallelism).
 *    Row i then sees keys lo(i)..min(i + q_shift, T - 1) with the
 *    window counted from its position (lo >= i + q_shift - window + 1)
 *    and doc_start[i] the start of its document in key rows (0 when it
 *    began before the key chunk, up to i + q_shift); a row that sees no
 *    key gets out = 0 and lse = -inf. The CPU kernel and the CUDA SIMT
 *    and flash kernels take it; cuDNN only a shift under which every row
 *    sees every key (unmasked). 0: the same positions.
 *
 *  - n_docs, longest_doc: doc_start's documents over all B rows (each
 *    row's position 0 starts one) and the rows of the longest, when the
 *    host knows them (tr_kern_attn_doc_count; they must be exact), else 0.
 *    The cuDNN path sizes its ragged graph from them; without them it
 *    reads them back from the device, which waits for the stream at
 *    every call.
 *
 * A NULL mask, or doc_start NULL and window and q_shift 0, is plain causal
 * attention with the same bits as before masks existed. */
typedef struct {
  const int32_t* doc_start;
  int window;
  int q_shift;
  int n_docs;
  int longest_doc;
} tr_kern_attn_mask_t;

/* Llama 3.1 RoPE frequency scaling. factor <= 0 (or 1 with equal low/high
 * factors) turns it off. Published values for Llama 3.1: factor 8,
 * low_freq_factor 1, high_freq_factor 4, original_max_pos 8192 (3.2: 32). */
typedef struct {
  float factor;
  float low_freq_factor;
  float high_freq_factor;
  int original_max_pos;
} tr_rope_scaling_t;

/* AdamW as torch.optim.AdamW (decoupled weight decay, bias correction):
 *   g  = grad * grad_scale
 *   p *= 1 - lr * weight_decay
 *   m  = beta1 m + (1 - beta1) g ;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * step counts from 1. grad_scale folds gradient clipping (or an averaging
 * factor) into the update; use 1 for none. */
typedef struct {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float grad_scale;
  int64_t step;
} tr_adamw_args_t;

/* ---- the per-device table of raw entry points ----
 * Shapes of the raw arguments are given in brackets; q_stride/kv_stride are
 * the distance in elements between the rows of consecutive tokens, so q, k
 * and v may be column slices of one fused [N, 3C] buffer (GPT-2's c_attn). */
/* One tensor of a multi-tensor AdamW step (raw device pointers). */
typedef struct tr_kern_adamw_tensor {
  float* param;      /* fp32 master weights */
  const float* grad; /* fp32 */
  float* m;          /* fp32 first moment */
  float* v;          /* fp32 second moment */
  void* param_bf16;  /* NULL, or the bf16 compute copy to refresh */
  int64_t n;
  int decay; /* 1: apply args->weight_decay; 0: none */
} tr_kern_adamw_tensor_t;

/* n elements of dtype (TR_F32 or TR_BF16) at x. */
typedef struct tr_kern_span {
  const void* x;
  tr_dtype_t dtype;
  int64_t n;
} tr_kern_span_t;

/* A linear layer over batch-strided slices (tr_kern_ops_t.linear_batched):
 * slice b of an activation operand starts at ptr + b * its stride
 * (elements) and holds N packed rows; w [OC, IC] and bias [OC] are shared
 * (cuBLASLt: one strided-batched GEMM, the weight's batch stride 0). */
typedef enum {
  TR_KERN_LIN_FWD = 0,        /* out [N,OC] = x [N,IC] w^T + bias */
  TR_KERN_LIN_FWD_GELU = 1,   /* pre = x w^T + bias, out = gelu(pre) */
  TR_KERN_LIN_DINP = 2,       /* out [N,IC] += x [N,OC] w (x: dout) */
  TR_KERN_LIN_DINP_WRITE = 3, /* out = x w (overwritten) */
  TR_KERN_LIN_DINP_DGELU = 4  /* out = (x w) * gelu'(pre), overwritten */
} tr_kern_lin_kind_t;
typedef struct tr_kern_lin_batch {
  tr_kern_lin_kind_t kind;
  float* out;
  float* pre; /* FWD_GELU (written), DINP_DGELU (read); else NULL */
  const float* x;
  const float *w, *bias; /* bias: FWD, FWD_GELU; may be NULL */
  int64_t batch, N;      /* slices, rows a slice */
  int IC, OC;
  int64_t out_stride, pre_stride, x_stride; /* elements between slices */
} tr_kern_lin_batch_t;

typedef struct tr_kern_ops {
  const char* name; /* "cpu", "cuda" */

  /* out[B*T,C] = wte[tok] (+ wpe[t] when wpe != NULL). */
  int (*embedding_fwd)(float* out, const int32_t* tok, const float* wte,
                       const float* wpe, int B, int T, int C);
  /* dwte[tok] += dout, dwpe[t] += dout (dwpe may be NULL). */
  int (*embedding_bwd)(float* dwte, float* dwpe, const float* dout,
                       const int32_t* tok, int B, int T, int C);
  /* A vocabulary-parallel slice wte[rows, C] holding the table's rows
   * [row0, row0 + rows): out = wte[tok - row0] for the tokens it holds, 0
   * for the others (no positions). The backward adds to the rows it holds
   * only; dwpe[t] += dout for every row (dwpe may be NULL, dwte too). */
  int (*embedding_rows_fwd)(float* out, const int32_t* tok, const float* wte,
                            int64_t row0, int64_t rows, int B, int T, int C);
  int (*embedding_rows_bwd)(float* dwte, float* dwpe, const float* dout,
                            const int32_t* tok, int64_t row0, int64_t rows,
                            int B, int T, int C);

  /* LayerNorm over C with saved mean[N] and rstd[N]; b may be NULL. */
  int (*layernorm_fwd)(float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int64_t N, int C,
                       float eps);
  /* resid[N,C] = a + b (the residual add, element by element), then
   * layernorm_fwd of resid into out, mean, rstd, in one pass over each row.
   * resid may be a or b (in place); out overlaps none of them. NULL in a
   * table that lacks it (the tensor entry then runs add and layernorm). */
  int (*residual_layernorm_fwd)(float* resid, float* out, float* mean,
                                float* rstd, const float* a, const float* b,
                                const float* w, const float* bias, int64_t N,
                                int C, float eps);
  /* dinp, dw, db (db may be NULL) += gradients. */
  int (*layernorm_bwd)(float* dinp, float* dw, float* db, const float* dout,
                       const float* inp, const float* w, const float* mean,
                       const float* rstd, int64_t N, int C);
  /* RMSNorm: out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps). */
  int (*rmsnorm_fwd)(float* out, float* rstd, const float* inp, const float* w,
                     int64_t N, int C, float eps);
  /* resid = a + b, then rmsnorm_fwd of resid; as residual_layernorm_fwd. */
  int (*residual_rmsnorm_fwd)(float* resid, float* out, float* rstd,
                              const float* a, const float* b, const float* w,
                              int64_t N, int C, float eps);
  int (*rmsnorm_bwd)(float* dinp, float* dw, const float* dout,
                     const float* inp, const float* w, const float* rstd,
                     int64_t N, int C);

  /* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, row-major; transa means
   * A is stored [K,M] (lda >= M), else [M,K] (lda >= K); same for B.
   * beta == 0 ignores C's old contents (NaNs included). */
  int (*gemm)(int transa, int transb, int64_t M, int64_t N, int64_t K,
              float alpha, const float* A, int64_t lda, const float* B,
              int64_t ldb, float beta, float* C, int64_t ldc);
  /* out[N,OC] = inp[N,IC] w[OC,IC]^T + bias[OC] (bias may be NULL); the
   * rows of out are ldo >= OC elements apart (CUDA: no bias then). */
  int (*linear_fwd)(float* out, const float* inp, const float* w,
                    const float* bias, int64_t N, int IC, int OC, int64_t ldo);
  /* dinp += dout w ; dw += dout^T inp ; dbias += colsum(dout). Any of
   * dinp, dw, dbias may be NULL (not wanted). The rows of dout are ldd >=
   * OC elements apart (CUDA: no dbias then). */
  int (*linear_bwd)(float* dinp, float* dw, float* dbias, const float* dout,
                    const float* inp, const float* w, int64_t N, int IC, int OC,
                    int64_t ldd);
  /* linear_bwd with dinp (not NULL) OVERWRITTEN: dinp = dout w, the
   * bits of linear_bwd into a zeroed dinp; dw and dbias accumulate as in
   * linear_bwd. NULL in a table that lacks it (the tensor entry then zeroes
   * dinp and calls linear_bwd). */
  int (*linear_bwd_write)(float* dinp, float* dw, float* dbias,
                          const float* dout, const float* inp, const float* w,
                          int64_t N, int IC, int OC, int64_t ldd);
  /* A linear layer followed by GELU-tanh (gelu_fwd's formula), contiguous
   * rows: pre[N,OC] = inp[N,IC] w[OC,IC]^T + bias[OC] (bias may be NULL),
   * out[N,OC] = gelu(pre). Both are written. */
  int (*linear_gelu_fwd)(float* out, float* pre, const float* inp,
                         const float* w, const float* bias, int64_t N, int IC,
                         int OC);
  /* The backward of a GELU followed by a linear layer, the GELU's gradient
   * fused in: dinp[N,IC] = (dout[N,OC] w[OC,IC]) * gelu'(pre[N,IC]),
   * OVERWRITTEN (every element is written, no zeroing needed); dw +=
   * dout^T inp and dbias += colsum(dout) accumulate as in linear_bwd (each
   * may be NULL). inp is gelu(pre), the linear layer's input. */
  int (*linear_dgelu_bwd)(float* dinp, float* dw, float* dbias,
                          const float* dout, const float* inp, const float* w,
                          const float* pre, int64_t N, int IC, int OC);
  /* One linear layer's activation side over `batch` slices of N rows
   * that are not evenly spaced (a chunk of rows of every sequence of a
   * [B, T, C] tensor: async tensor parallel's ring chunks), the weight and
   * bias shared by every slice: see tr_kern_lin_batch_t. NULL in a table
   * that lacks it (the tensor entries then call the entries above once a
   * slice, with the same bits). */
  int (*linear_batched)(const struct tr_kern_lin_batch* l);

  /* Rotate x[B,T,H,D] in place, Hugging Face "rotate_half" layout: pair
   * (i, i + D/2) for i < D/2, angle cos/sin[t, i] ([T, D/2] tables from
   * tr_kern_rope_table). inverse rotates by minus the angle, which is the
   * backward (the rotation is orthogonal). Row stride as above. */
  int (*rope)(float* x, const float* cos_t, const float* sin_t, int B, int T,
              int H, int D, int64_t stride, int inverse);

  /* Causal attention, softmax(q k^T / sqrt(D)) v. q[B,T,H,D], k and v
   * [B,T,KVH,D] (query head h reads kv head h / (H/KVH)); out[B,T,H*D]
   * contiguous; lse[B,H,T] (log-sum-exp of each score row) is saved for the
   * backward, which recomputes the scores: O(B H T) memory, not O(T^2).
   * mask (NULL: plain causal) narrows each row further (see
   * tr_kern_attn_mask_t); key blocks no row of a tile sees are skipped. */
  int (*attention_fwd)(float* out, float* lse, const float* q, const float* k,
                       const float* v, int B, int T, int H, int KVH, int D,
                       int64_t q_stride, int64_t kv_stride,
                       const tr_kern_attn_mask_t* mask);
  /* dq, dk, dv = gradients (overwritten, unlike the other backward
   * entries: every element is written, and a fused dq|dk|dv buffer needs
   * no zeroing); they use the same strides as q, k, v. mask: the
   * forward's. */
  int (*attention_bwd)(float* dq, float* dk, float* dv, const float* dout,
                       const float* q, const float* k, const float* v,
                       const float* out, const float* lse, int B, int T, int H,
                       int KVH, int D, int64_t q_stride, int64_t kv_stride,
                       const tr_kern_attn_mask_t* mask);
  /* The log-sum-exp merge of two attentions of the same queries over
   * disjoint keys (context parallelism's chunk pairs): for each (b, h, t)
   * with L = log(exp(lse) + exp(plse)),
   *   acc[b, t, h*D..] = exp(lse - L) acc + exp(plse - L) pout,  lse = L,
   * both untouched when lse and plse are -inf (no key seen yet). acc
   * [B, T, H*D] and lse, plse [B, H, T] are fp32 in every table; pout
   * [B, T, H*D] is an activation (bf16 in the bf16 table). Weights in
   * double on the CPU, fp32 on devices. */
  int (*attn_merge)(float* acc, float* lse, const float* pout,
                    const float* plse, int B, int T, int H, int D);

  /* GELU, tanh approximation (GPT-2's "gelu_new"). */
  int (*gelu_fwd)(float* out, const float* inp, int64_t n);
  int (*gelu_bwd)(float* dinp, const float* dout, const float* inp, int64_t n);
  /* SwiGLU: out = silu(gate) * up. */
  int (*swiglu_fwd)(float* out, const float* gate, const float* up, int64_t n);
  int (*swiglu_bwd)(float* dgate, float* dup, const float* dout,
                    const float* gate, const float* up, int64_t n);
  /* swiglu_bwd with dgate and dup OVERWRITTEN (the bits of swiglu_bwd into
   * zeros), or NULL in a table that lacks it (then zero + swiglu_bwd). */
  int (*swiglu_bwd_write)(float* dgate, float* dup, const float* dout,
                          const float* gate, const float* up, int64_t n);

  /* Cross-entropy of logits[N,V] (rows ld >= V apart) against targets[N]:
   * losses[N] (0 where the target is TR_IGNORE_INDEX) and lse[N] saved for
   * the backward. Targets outside [0, V) other than the ignore index give
   * TR_EINVAL. */
  int (*xent_fwd)(float* losses, float* lse, const float* logits,
                  const int32_t* targets, int64_t N, int V, int64_t ld);
  /* In place: logits become scale * (softmax - onehot) (rows with an
   * ignored target become 0). scale is d(loss)/d(each token's loss), e.g.
   * 1 / (number of non-ignored targets in the global batch). */
  int (*xent_bwd)(float* logits, const float* lse, const int32_t* targets,
                  int64_t N, int V, int64_t ld, float scale);
  /* xent_fwd then xent_bwd in one pass over each row where the device can
   * (the CUDA classifier reads the logits twice and writes them once). */
  int (*xent_fused)(float* losses, float* lse, float* logits,
                    const int32_t* targets, int64_t N, int V, int64_t ld,
                    float scale);
  /* Vocabulary-parallel cross-entropy (loss parallel): logits[N,V] are
   * the columns [voff, voff + V) of the whole vocabulary's, and the caller
   * reduces over the slices between the steps. stats: max[N] = the row's
   * max, tgt[N] = the target's logit where this slice holds it, else 0
   * (and for ignored targets); sumexp: sum[N] = sum_j exp(x - max[r]) for
   * the global max (summed in double); loss: lse = max + log(sum), losses
   * = lse - tgt (0 where ignored), from the reduced values; bwd: in place,
   * scale * (exp(x - lse) - onehot), the onehot where this slice holds the
   * target (ignored rows 0). Targets are not range-checked here. */
  int (*xent_shard_stats)(float* max, float* tgt, const float* logits,
                          const int32_t* targets, int64_t N, int V, int64_t ld,
                          int64_t voff);
  int (*xent_shard_sumexp)(float* sum, const float* logits, const float* max,
                           int64_t N, int V, int64_t ld);
  int (*xent_shard_loss)(float* losses, float* lse, const float* max,
                         const float* sum, const float* tgt,
                         const int32_t* targets, int64_t N);
  int (*xent_shard_bwd)(float* logits, const float* lse, const int32_t* targets,
                        int64_t N, int V, int64_t ld, int64_t voff,
                        float scale);

  int (*adamw)(float* p, const float* g, float* m, float* v, int64_t n,
               const tr_adamw_args_t* args);
  /* adamw over many tensors at once (each with its decay flag; a bf16
   * compute copy refreshed where given), or NULL in a table that lacks it
   * (the tensor entry then calls adamw per tensor). */
  int (*adamw_multi)(const struct tr_kern_adamw_tensor* ts, int n,
                     const tr_adamw_args_t* args);
  /* *out = the sum of x^2 over every span, accumulated in double (host
   * pointer out), or NULL (the tensor entry sums span by span). */
  int (*sum_squares_multi)(double* out, const struct tr_kern_span* spans,
                           int n);
  /* *out = sum of x^2 accumulated in double (host pointer out). */
  int (*sum_squares)(double* out, const float* x, int64_t n);
  /* The end of a step without the host waiting for the gradient norm
   * (tr_kern_step_tail), or NULL in a table that lacks it: enqueue the
   * sum of squares over spans (as sum_squares_multi adds it), its copy
   * and the nloss losses' copy to the host, the losses' zeroing, and
   * adamw_multi with the gradients also multiplied by min(1, max_norm /
   * (sqrt(sum) + 1e-6)) (max_norm <= 0: by 1); step_tail_wait waits for
   * the copies only and returns the sum and the losses added in index
   * order in double; step_tail_release frees the calling thread's
   * buffers. */
  int (*step_tail)(const struct tr_kern_adamw_tensor* ts, int n,
                   const tr_adamw_args_t* args,
                   const struct tr_kern_span* spans, int nspans,
                   double max_norm, float* losses, int64_t nloss);
  int (*step_tail_wait)(double* sumsq, double* loss_sum);
  void (*step_tail_release)(void);
  /* Before a training step (NULL: nothing to do): CUDA switches GEMM
   * plans whose candidates' timings completed to the fastest
   * (tr_kern_cuda_gemm_tune_apply). */
  void (*step_begin)(void);
  int (*scale)(float* x, float s, int64_t n);            /* x *= s */
  int (*add)(float* out, const float* a, const float* b, /* out = a + b */
             int64_t n);
  int (*accumulate)(float* y, const float* x, int64_t n); /* y += x */
  int (*zero)(float* x, int64_t n);

  /* The same entry points for bfloat16 activations and weights, or NULL
   * (CPU). In that table every pointer to an activation, a weight, or an
   * activation's gradient points at bf16 elements (typed float* to share
   * this struct); parameter gradients, statistics (mean, rstd, lse),
   * losses, RoPE tables and optimizer state stay fp32. Arithmetic is fp32
   * in registers. */
  const struct tr_kern_ops* bf16;
} tr_kern_ops_t;

/* The table for a device type, or NULL when none is registered. */
const tr_kern_ops_t* tr_kern_ops(tr_device_type_t type);
/* Install (or with NULL remove) the table of a device type other than
 * TR_DEV_CPU. The table must outlive its use. TR_EINVAL for TR_DEV_CPU. */
int tr_kern_register(tr_device_type_t type, const tr_kern_ops_t* ops);
/* Stream for the calling thread's CUDA kernels (cudaStream_t; NULL = the
 * default stream). Stored per thread; ignored by the CPU table. */
void tr_kern_set_stream(void* stream);
void* tr_kern_get_stream(void);

/* ---- tensor entry points ----
 * fp32 tensors unless noted; tokens and targets are int32. Leading dims of
 * activations may be [N, C] or [B, T, C] (flattened to rows).
 * Activations and weights (and their gradients, e.g. dinp, dq) may instead
 * all be bfloat16 on a device whose table has a bf16 table (CUDA): the
 * first one decides, the others must match (TR_EDTYPE otherwise, and for
 * bf16 on the CPU). Parameter gradients (dweight, dbias, dwte, dwpe),
 * mean/rstd/lse, losses and the RoPE tables are fp32 in every case; the
 * element-wise ops (add, accumulate, scale, zero, sum_squares) take either
 * dtype. */

/* out [B,T,C]; tokens [B,T] int32 in [0, V); wte [V,C]; wpe [maxT,C] with
 * maxT >= T, or NULL. TR_EINVAL names the first token out of range. */
int tr_kern_embedding_fwd(tr_tensor_t* out, const tr_tensor_t* tokens,
                          const tr_tensor_t* wte, const tr_tensor_t* wpe);
int tr_kern_embedding_bwd(tr_tensor_t* dwte, tr_tensor_t* dwpe,
                          const tr_tensor_t* dout, const tr_tensor_t* tokens);
/* Vocabulary-parallel lookup: wte [Vl, C] holds rows [row0, row0 + Vl) of
 * a vocab-row table; out [B,T,C] = the rows of the tokens it holds, 0 for
 * the others (a sum over the slices gives the whole lookup; positions are
 * added after it). TR_EINVAL names the first token outside [0, vocab). The
 * backward adds dout to the rows held (dwte [Vl, C]) and, with dwpe
 * [>= T, C], to every position's row. */
int tr_kern_embedding_rows_fwd(tr_tensor_t* out, const tr_tensor_t* tokens,
                               const tr_tensor_t* wte, int64_t row0,
                               int64_t vocab);
int tr_kern_embedding_rows_bwd(tr_tensor_t* dwte, tr_tensor_t* dwpe,
                               const tr_tensor_t* dout,
                               const tr_tensor_t* tokens, int64_t row0);

/* out [N,C], mean and rstd [N]; weight [C]; bias [C] or NULL. */
int tr_kern_layernorm_fwd(tr_tensor_t* out, tr_tensor_t* mean,
                          tr_tensor_t* rstd, const tr_tensor_t* inp,
                          const tr_tensor_t* weight, const tr_tensor_t* bias,
                          float eps);
/* The residual add and the norm that reads its sum, fused: resid = a + b
 * (a, b, resid [N,C]; resid may be a or b, in place), then out, mean and
 * rstd as tr_kern_layernorm_fwd(out, mean, rstd, resid, weight, bias, eps).
 * One pass over each row on CUDA (the sum is stored once and re-read from
 * cache); on the CPU the bits of tr_kern_add then tr_kern_layernorm_fwd.
 * The backward is tr_kern_layernorm_bwd on resid, whose dinp is the
 * gradient of both a and b. */
int tr_kern_residual_layernorm_fwd(tr_tensor_t* resid, tr_tensor_t* out,
                                   tr_tensor_t* mean, tr_tensor_t* rstd,
                                   const tr_tensor_t* a, const tr_tensor_t* b,
                                   const tr_tensor_t* weight,
                                   const tr_tensor_t* bias, float eps);
int tr_kern_layernorm_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                          tr_tensor_t* dbias, const tr_tensor_t* dout,
                          const tr_tensor_t* inp, const tr_tensor_t* weight,
                          const tr_tensor_t* mean, const tr_tensor_t* rstd);
int tr_kern_rmsnorm_fwd(tr_tensor_t* out, tr_tensor_t* rstd,
                        const tr_tensor_t* inp, const tr_tensor_t* weight,
                        float eps);
/* resid = a + b, then tr_kern_rmsnorm_fwd(out, rstd, resid, weight, eps),
 * fused as tr_kern_residual_layernorm_fwd. */
int tr_kern_residual_rmsnorm_fwd(tr_tensor_t* resid, tr_tensor_t* out,
                                 tr_tensor_t* rstd, const tr_tensor_t* a,
                                 const tr_tensor_t* b,
                                 const tr_tensor_t* weight, float eps);
int tr_kern_rmsnorm_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                        const tr_tensor_t* dout, const tr_tensor_t* inp,
                        const tr_tensor_t* weight, const tr_tensor_t* rstd);

/* out [N,OC] = inp [N,IC] weight[OC,IC]^T + bias[OC] (bias may be NULL).
 * out (and linear_bwd's dout) may have padded rows (a column slice of a
 * wider buffer, stride[last] == 1): the output projection writes its logits
 * into rows padded to a multiple of 64 elements on CUDA, where GEMMs and
 * the classifier want aligned rows (no bias then on CUDA). */
/* Batch-strided views (async tensor parallel's chunks): the activations of
 * tr_kern_linear_fwd, _gelu_fwd, _bwd, _bwd_write and _dgelu_bwd (inp, out,
 * pre, dout, dinp) may instead be [B, n, W] views with packed rows
 * (stride {s, W, 1}) whose slices are any s >= n W elements apart, each
 * operand its own s (rows [t0, t0 + n) of every sequence of a [B, T, W]
 * tensor, or a contiguous [B, n, W]): the op then runs once over the B
 * slices, the weight and bias shared (CUDA: one strided-batched GEMM; CPU:
 * the op per slice, the bits of B calls on the slices). Only the input
 * gradient is computed so: dweight and dbias must be NULL (they sum over
 * every row: run them on the whole tensors). */
int tr_kern_linear_fwd(tr_tensor_t* out, const tr_tensor_t* inp,
                       const tr_tensor_t* weight, const tr_tensor_t* bias);
/* dinp, dweight, dbias may each be NULL. */
int tr_kern_linear_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                       tr_tensor_t* dbias, const tr_tensor_t* dout,
                       const tr_tensor_t* inp, const tr_tensor_t* weight);
/* tr_kern_linear_bwd with dinp OVERWRITTEN instead of added to:
 * dinp = dout weight (on CUDA the GEMM runs with beta 0; on the CPU the
 * bits of tr_kern_zero then tr_kern_linear_bwd). For the first writer of
 * an input gradient, which then needs no zeroing pass; dweight and dbias
 * accumulate as in tr_kern_linear_bwd. */
int tr_kern_linear_bwd_write(tr_tensor_t* dinp, tr_tensor_t* dweight,
                             tr_tensor_t* dbias, const tr_tensor_t* dout,
                             const tr_tensor_t* inp, const tr_tensor_t* weight);
/* The MLP's first linear layer and its GELU in one call (on CUDA, with OC
 * a multiple of 8, the GELU runs in the GEMM's epilogue on the fp32
 * accumulator): pre [N,OC] = inp [N,IC] weight[OC,IC]^T + bias[OC] (bias
 * may be NULL), out [N,OC] = gelu(pre), as tr_kern_linear_fwd then
 * tr_kern_gelu_fwd. All contiguous. On the CPU the bits equal the two
 * calls'; on CUDA out is rounded once from fp32, so a bf16 out may differ
 * from gelu_fwd(pre) in the last bit. */
int tr_kern_linear_gelu_fwd(tr_tensor_t* out, tr_tensor_t* pre,
                            const tr_tensor_t* inp, const tr_tensor_t* weight,
                            const tr_tensor_t* bias);
/* The backward of the MLP's second linear layer (input inp = gelu(pre),
 * inp and pre [N,IC], weight [OC,IC], dout [N,OC]) with the GELU's backward
 * fused into the input gradient: dinp [N,IC] = (dout weight) * gelu'(pre),
 * OVERWRITTEN (an exception to the += rule: dinp needs no zeroing);
 * dweight += dout^T inp and dbias += colsum(dout) accumulate (fp32; each
 * may be NULL). On the CPU the bits equal tr_kern_linear_bwd into a zeroed
 * buffer followed by tr_kern_gelu_bwd into a zeroed dinp. */
int tr_kern_linear_dgelu_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                             tr_tensor_t* dbias, const tr_tensor_t* dout,
                             const tr_tensor_t* inp, const tr_tensor_t* weight,
                             const tr_tensor_t* pre);
/* c = alpha op(a) op(b) + beta c on 2-D tensors whose rows may be padded
 * (stride[1] == 1, stride[0] >= width). */
int tr_kern_gemm(tr_tensor_t* c, const tr_tensor_t* a, int transa,
                 const tr_tensor_t* b, int transb, float alpha, float beta);

/* x [B,T,H*D] (rows may be strided: a column slice of a wider buffer), in
 * place. cos/sin [Tmax, D/2] with Tmax >= T. */
int tr_kern_rope(tr_tensor_t* x, int n_heads, const tr_tensor_t* cos_t,
                 const tr_tensor_t* sin_t, int inverse);
/* Host helper: fill cos/sin [T, D/2] (host float arrays) for positions
 * 0..T-1, inv_freq[i] = theta^(-2i/D) then the Llama 3.1 scaling. Computed in
 * double, stored as float. TR_EINVAL for odd D or T < 0. */
int tr_kern_rope_table(float* cos_t, float* sin_t, int T, int D, double theta,
                       const tr_rope_scaling_t* scaling);

/* q [B,T,H*D], k and v [B,T,KVH*D] (rows may be strided slices; k and v must
 * share a stride), out [B,T,H*D] contiguous, lse [B,H,T]. H % KVH == 0. */
int tr_kern_attention_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                          const tr_tensor_t* q, const tr_tensor_t* k,
                          const tr_tensor_t* v, int n_heads, int n_kv_heads);
int tr_kern_attention_bwd(tr_tensor_t* dq, tr_tensor_t* dk, tr_tensor_t* dv,
                          const tr_tensor_t* dout, const tr_tensor_t* q,
                          const tr_tensor_t* k, const tr_tensor_t* v,
                          const tr_tensor_t* out, const tr_tensor_t* lse,
                          int n_heads, int n_kv_heads);
/* The same with a mask (tr_kern_attn_mask_t): doc_start [B, T] int32 on
 * q's device, or NULL; window >= 0 (0: none); q_shift (0: q and k at the
 * same positions). On the CPU every doc_start[b, i] is checked to lie
 * in [doc_start[b, i - 1], i + max(q_shift, 0)]
 * (TR_EINVAL). */
int tr_kern_attention_masked_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                                 const tr_tensor_t* q, const tr_tensor_t* k,
                                 const tr_tensor_t* v, int n_heads,
                                 int n_kv_heads, const tr_tensor_t* doc_start,
                                 int window, int q_shift);
int tr_kern_attention_masked_bwd(tr_tensor_t* dq, tr_tensor_t* dk,
                                 tr_tensor_t* dv, const tr_tensor_t* dout,
                                 const tr_tensor_t* q, const tr_tensor_t* k,
                                 const tr_tensor_t* v, const tr_tensor_t* out,
                                 const tr_tensor_t* lse, int n_heads,
                                 int n_kv_heads, const tr_tensor_t* doc_start,
                                 int window, int q_shift);
/* The same with doc_start's documents counted by the host (n_docs,
 * longest_doc: tr_kern_attn_mask_t's; 0 0: not counted, as above), which
 * spares the cuDNN path a stream synchronisation per call. A CPU doc_start
 * is checked against them (TR_EINVAL). */
int tr_kern_attention_docs_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                               const tr_tensor_t* q, const tr_tensor_t* k,
                               const tr_tensor_t* v, int n_heads,
                               int n_kv_heads, const tr_tensor_t* doc_start,
                               int n_docs, int longest_doc, int window,
                               int q_shift);
int tr_kern_attention_docs_bwd(tr_tensor_t* dq, tr_tensor_t* dk,
                               tr_tensor_t* dv, const tr_tensor_t* dout,
                               const tr_tensor_t* q, const tr_tensor_t* k,
                               const tr_tensor_t* v, const tr_tensor_t* out,
                               const tr_tensor_t* lse, int n_heads,
                               int n_kv_heads, const tr_tensor_t* doc_start,
                               int n_docs, int longest_doc, int window,
                               int q_shift);
/* acc, lse merged with pout, plse (the table's attn_merge): acc [B, T,
 * H*D] float32, lse and plse [B, H, T] float32, pout [B, T, H*D] float32
 * or bfloat16, all contiguous on one device. */
int tr_kern_attn_merge(tr_tensor_t* acc, tr_tensor_t* lse,
                       const tr_tensor_t* pout, const tr_tensor_t* plse,
                       int n_heads);
/* Host helper: doc_start [B*T] from tokens [B*T] for torchtitan's
 * block_causal mask (get_document_mask_mod): a document ends with (and
 * includes) each token equal to eos_id, and the next one begins after it,
 * so doc_start[b, i] = 1 + the last position p < i with tokens[b, p] ==
 * eos_id, else 0. Each row b starts a document at position 0. When pos is
 * not NULL it also receives each token's position inside its document,
 * i - doc_start[b, i] (positions restarting per document). */
void tr_kern_attn_doc_start(int32_t* doc_start, int32_t* pos,
                            const int32_t* tokens, int B, int T,
                            int32_t eos_id);
/* Host helper: the documents of a host doc_start [B*T] (a new one at each
 * row's position 0 and wherever doc_start changes) and the rows of the
 * longest: what tr_kern_attention_docs_fwd/bwd take. */
void tr_kern_attn_doc_count(const int32_t* doc_start, int B, int T, int* n_docs,
                            int* longest_doc);

int tr_kern_gelu_fwd(tr_tensor_t* out, const tr_tensor_t* inp);
int tr_kern_gelu_bwd(tr_tensor_t* dinp, const tr_tensor_t* dout,
                     const tr_tensor_t* inp);
int tr_kern_swiglu_fwd(tr_tensor_t* out, const tr_tensor_t* gate,
                       const tr_tensor_t* up);
int tr_kern_swiglu_bwd(tr_tensor_t* dgate, tr_tensor_t* dup,
                       const tr_tensor_t* dout, const tr_tensor_t* gate,
                       const tr_tensor_t* up);

/* tr_kern_swiglu_bwd with dgate and dup OVERWRITTEN instead of added to
 * (the first writer of both, which then need no zeroing pass); on the CPU
 * the bits of tr_kern_swiglu_bwd into zeroed buffers. */
int tr_kern_swiglu_bwd_write(tr_tensor_t* dgate, tr_tensor_t* dup,
                             const tr_tensor_t* dout, const tr_tensor_t* gate,
                             const tr_tensor_t* up);

/* logits [N,V] (or [B,T,V]; rows may be padded), targets [N] int32,
 * losses [N], lse [N]. */
int tr_kern_xent_fwd(tr_tensor_t* losses, tr_tensor_t* lse,
                     const tr_tensor_t* logits, const tr_tensor_t* targets);
int tr_kern_xent_bwd(tr_tensor_t* logits, const tr_tensor_t* lse,
                     const tr_tensor_t* targets, float scale);
/* Both at once, for training: losses and lse as tr_kern_xent_fwd, then the
 * logits become dlogits as tr_kern_xent_bwd with scale. Same values as the
 * two calls (bit for bit on the CPU). */
int tr_kern_xent_fused(tr_tensor_t* losses, tr_tensor_t* lse,
                       tr_tensor_t* logits, const tr_tensor_t* targets,
                       float scale);
/* The vocabulary-parallel steps (tr_kern_ops_t.xent_shard_*): logits
 * [N, Vl] (rows may be padded) are the columns [voff, voff + Vl) of a
 * vocab-column whole; max, tgt, sum, losses, lse [N] fp32. A caller runs
 * stats, all-reduces max (MAX) over the slices, runs sumexp, all-reduces
 * sum and tgt (SUM), runs loss: losses and lse are then those of
 * tr_kern_xent_fwd on the whole logits, on every slice's rank. bwd turns
 * the slice into its part of the dlogits. TR_EINVAL names the first
 * target outside [0, vocab) (checked by stats on host tensors). */
int tr_kern_xent_shard_stats(tr_tensor_t* max, tr_tensor_t* tgt,
                             const tr_tensor_t* logits,
                             const tr_tensor_t* targets, int64_t voff,
                             int64_t vocab);
int tr_kern_xent_shard_sumexp(tr_tensor_t* sum, const tr_tensor_t* logits,
                              const tr_tensor_t* max);
int tr_kern_xent_shard_loss(tr_tensor_t* losses, tr_tensor_t* lse,
                            const tr_tensor_t* max, const tr_tensor_t* sum,
                            const tr_tensor_t* tgt, const tr_tensor_t* targets);
int tr_kern_xent_shard_bwd(tr_tensor_t* logits, const tr_tensor_t* lse,
                           const tr_tensor_t* targets, int64_t voff,
                           float scale);

/* One AdamW step on a parameter; grad, m, v have its shape. */
int tr_kern_adamw(tr_tensor_t* param, const tr_tensor_t* grad, tr_tensor_t* m,
                  tr_tensor_t* v, const tr_adamw_args_t* args);
/* *out += sum of squares of x (double). For a global grad norm, add every
 * gradient's sum (then across ranks) and take the square root. */
int tr_kern_sum_squares(const tr_tensor_t* x, double* out);
/* The optimizer step and the gradient norm over a whole parameter list,
 * through the table (one fused launch on CUDA, tensor by tensor on the
 * CPU with the bits of the single-tensor entries in list order). */
typedef struct {
  tr_tensor_t* param;      /* fp32 */
  const tr_tensor_t* grad; /* fp32 */
  tr_tensor_t* m;          /* fp32 */
  tr_tensor_t* v;          /* fp32 */
  tr_tensor_t* compute;    /* NULL, or param's bf16 copy to refresh */
  int decay;               /* args->weight_decay applies (else 0) */
} tr_kern_adamw_set_t;
/* tr_kern_adamw on each set (args->weight_decay where decay, else 0), all
 * on one device. TR_EDEVICE for mixed devices, TR_EUNSUPPORTED for a
 * compute copy on a device whose table has no adamw_multi. */
int tr_kern_adamw_multi(const tr_kern_adamw_set_t* sets, int n,
                        const tr_adamw_args_t* args);
/* *out += the sum of squares of every x[i] (empty ones skipped), all on
 * one device. */
int tr_kern_sum_squares_multi(const tr_tensor_t* const* xs, int n, double* out);
/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm/(norm + 1e-6)). */
double tr_kern_clip_coef(double total_norm, double max_norm);
/* The end of a training step with nothing for the host to wait on before
 * the update (a device whose table has it: CUDA; TR_EUNSUPPORTED
 * elsewhere, and the caller takes the norm with tr_kern_sum_squares_multi,
 * clips on the host and calls tr_kern_adamw_multi). Enqueued on the
 * calling thread's stream: the squared norm of grads, its clipping factor
 * for max_norm (<= 0: no clipping) and AdamW with it (args->grad_scale
 * multiplies too) -- the same bits as that host path -- plus copies of
 * the squared norm and of losses (fp32, may be NULL) to the host, after
 * which losses is zeroed. tr_kern_step_tail_wait then waits for those
 * copies only (the update may still run) and gives the squared norm and
 * the losses' sum (in index order, in double). A non-finite norm is
 * found only then: the update has already used it. */
int tr_kern_step_tail(const tr_kern_adamw_set_t* sets, int n,
                      const tr_adamw_args_t* args,
                      const tr_tensor_t* const* grads, int ngrads,
                      double max_norm, tr_tensor_t* losses);
int tr_kern_step_tail_wait(tr_device_type_t type, double* sumsq,
                           double* loss_sum);
/* Free the calling thread's step-tail buffers (pinned host memory, an
 * event); the next tr_kern_step_tail makes new ones. */
void tr_kern_step_tail_release(tr_device_type_t type);
/* What a device's kernels do before each training step (ops->step_begin;
 * a device without it: nothing). */
void tr_kern_step_begin(tr_device_type_t type);
int tr_kern_scale(tr_tensor_t* x, float s);
int tr_kern_add(tr_tensor_t* out, const tr_tensor_t* a, const tr_tensor_t* b);
int tr_kern_accumulate(tr_tensor_t* y, const tr_tensor_t* x);
int tr_kern_zero(tr_tensor_t* x);

/* ---- CPU specifics ---- */

/* Threads the CPU kernels use (>= 1). */
int tr_kern_cpu_num_threads(void);
/* Resize the pool; n = 0 re-reads TRAINRUN_NUM_THREADS / OMP_NUM_THREADS /
 * the core count. Not to be called while kernels run. */
int tr_kern_cpu_set_num_threads(int n);

/* Run fn(ctx, i) for i in [0, ntasks) on the kernel pool and wait. Tasks
 * must write disjoint outputs; the mapping of tasks to threads is
 * unspecified, so a task's result must not depend on it. A call from inside
 * a task runs serially. For host-side loops of other modules (weight init,
 * data preparation). */
void tr_kern_cpu_parallel(int64_t ntasks, void (*fn)(void* ctx, int64_t i),
                          void* ctx);

typedef enum {
  TR_GEMM_AUTO = 0,   /* OpenBLAS when built in, else blocked */
  TR_GEMM_BLAS = 1,   /* OpenBLAS cblas_sgemm; TR_EUNSUPPORTED without */
  TR_GEMM_BLOCKED = 2 /* trainrun's cache-blocked, threaded fallback */
} tr_gemm_impl_t;
/* Choose the GEMM behind the CPU table (process-wide). */
int tr_kern_cpu_set_gemm(tr_gemm_impl_t impl);
tr_gemm_impl_t tr_kern_cpu_gemm(void); /* the one in use: BLAS or BLOCKED */
/* 1 when this build has OpenBLAS. */
int tr_kern_cpu_have_blas(void);
/* The fallback GEMM itself, callable directly (same contract as
 * tr_kern_ops_t.gemm, host pointers), whatever tr_kern_cpu_set_gemm says. */
int tr_kern_cpu_gemm_blocked(int transa, int transb, int64_t M, int64_t N,
                             int64_t K, float alpha, const float* A,
                             int64_t lda, const float* B, int64_t ldb,
                             float beta, float* C, int64_t ldc);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_KERNELS_H */
