/* kernels/cpu/cpu.h: internals shared by the CPU kernels — the thread pool,
 * the fixed chunking that keeps reductions independent of the thread count,
 * and the raw entry points that kernels/cpu/ops.c gathers into the table. */
#ifndef TRAINRUN_KERNELS_CPU_H
#define TRAINRUN_KERNELS_CPU_H

#include <stdint.h>

#include "trainrun/kernels.h"

/* Run fn(ctx, i) for i in [0, ntasks) on the pool (the caller's thread
 * included) and wait for all. Which thread runs a task is unspecified: a
 * task must write only outputs that no other task writes. Inside a task a
 * nested call runs serially. */
typedef void (*tr__cpu_task_fn)(void* ctx, int64_t task);
void tr__cpu_parallel(int64_t ntasks, tr__cpu_task_fn fn, void* ctx);

/* Index of the calling pool thread (0 = the caller), for per-thread
 * scratch; in [0, tr_kern_cpu_num_threads()). */
int tr__cpu_thread_index(void);

/* Per-thread scratch memory (64-byte aligned, contents undefined), grown on
 * demand and freed when the thread exits; valid until the same thread asks
 * for the same slot again. Aborts when out of memory (callers ask for a few
 * rows' worth, never for activation-sized buffers). */
#define TR__CPU_SCRATCH_SLOTS 4
void* tr__cpu_scratch(int slot, size_t bytes);

/* Split n items into tasks of `grain` items (the last may be short): the
 * split depends only on n and grain, never on the thread count. */
static inline int64_t tr__cpu_ntasks(int64_t n, int64_t grain) {
  return n <= 0 ? 0 : (n + grain - 1) / grain;
}

/* The CPU table (kernels/cpu/ops.c). */
extern const tr_kern_ops_t tr__cpu_ops;

/* Raw CPU entry points (contracts in trainrun/kernels.h, tr_kern_ops_t). */
int tr__cpu_embedding_fwd(float* out, const int32_t* tok, const float* wte,
                          const float* wpe, int B, int T, int C);
int tr__cpu_embedding_rows_fwd(float* out, const int32_t* tok, const float* wte,
                               int64_t row0, int64_t rows, int B, int T, int C);
int tr__cpu_embedding_rows_bwd(float* dwte, float* dwpe, const float* dout,
                               const int32_t* tok, int64_t row0, int64_t rows,
                               int B, int T, int C);
int tr__cpu_embedding_bwd(float* dwte, float* dwpe, const float* dout,
                          const int32_t* tok, int B, int T, int C);
int tr__cpu_layernorm_fwd(float* out, float* mean, float* rstd,
                          const float* inp, const float* w, const float* b,
                          int64_t N, int C, float eps);
int tr__cpu_residual_layernorm_fwd(float* resid, float* out, float* mean,
                                   float* rstd, const float* a,
                                   const float* b_in, const float* w,
                                   const float* b, int64_t N, int C, float eps);
int tr__cpu_layernorm_bwd(float* dinp, float* dw, float* db, const float* dout,
                          const float* inp, const float* w, const float* mean,
                          const float* rstd, int64_t N, int C);
int tr__cpu_rmsnorm_fwd(float* out, float* rstd, const float* inp,
                        const float* w, int64_t N, int C, float eps);
int tr__cpu_residual_rmsnorm_fwd(float* resid, float* out, float* rstd,
                                 const float* a, const float* b_in,
                                 const float* w, int64_t N, int C, float eps);
int tr__cpu_rmsnorm_bwd(float* dinp, float* dw, const float* dout,
                        const float* inp, const float* w, const float* rstd,
                        int64_t N, int C);
int tr__cpu_gemm(int transa, int transb, int64_t M, int64_t N, int64_t K,
                 float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc);
int tr__cpu_linear_fwd(float* out, const float* inp, const float* w,
                       const float* bias, int64_t N, int IC, int OC,
                       int64_t ldo);
int tr__cpu_linear_bwd(float* dinp, float* dw, float* dbias, const float* dout,
                       const float* inp, const float* w, int64_t N, int IC,
                       int OC, int64_t ldd);
int tr__cpu_linear_bwd_write(float* dinp, float* dw, float* dbias,
                             const float* dout, const float* inp,
                             const float* w, int64_t N, int IC, int OC,
                             int64_t ldd);
int tr__cpu_linear_gelu_fwd(float* out, float* pre, const float* inp,
                            const float* w, const float* bias, int64_t N,
                            int IC, int OC);
int tr__cpu_linear_dgelu_bwd(float* dinp, float* dw, float* dbias,
                             const float* dout, const float* inp,
                             const float* w, const float* pre, int64_t N,
                             int IC, int OC);
int tr__cpu_rope(float* x, const float* cos_t, const float* sin_t, int B, int T,
                 int H, int D, int64_t stride, int inverse);
int tr__cpu_attention_fwd(float* out, float* lse, const float* q,
                          const float* k, const float* v, int B, int T, int H,
                          int KVH, int D, int64_t q_stride, int64_t kv_stride,
                          const tr_kern_attn_mask_t* mask);
int tr__cpu_attention_bwd(float* dq, float* dk, float* dv, const float* dout,
                          const float* q, const float* k, const float* v,
                          const float* out, const float* lse, int B, int T,
                          int H, int KVH, int D, int64_t q_stride,
                          int64_t kv_stride, const tr_kern_attn_mask_t* mask);
int tr__cpu_attn_merge(float* acc, float* lse, const float* pout,
                       const float* plse, int B, int T, int H, int D);
int tr__cpu_gelu_fwd(float* out, const float* inp, int64_t n);
int tr__cpu_gelu_bwd(float* dinp, const float* dout, const float* inp,
                     int64_t n);
int tr__cpu_swiglu_fwd(float* out, const float* gate, const float* up,
                       int64_t n);
int tr__cpu_swiglu_bwd(float* dgate, float* dup, const float* dout,
                       const float* gate, const float* up, int64_t n);
int tr__cpu_swiglu_bwd_write(float* dgate, float* dup, const float* dout,
                             const float* gate, const float* up, int64_t n);
int tr__cpu_xent_shard_stats(float* max, float* tgt, const float* logits,
                             const int32_t* targets, int64_t N, int V,
                             int64_t ld, int64_t voff);
int tr__cpu_xent_shard_sumexp(float* sum, const float* logits, const float* max,
                              int64_t N, int V, int64_t ld);
int tr__cpu_xent_shard_loss(float* losses, float* lse, const float* max,
                            const float* sum, const float* tgt,
                            const int32_t* targets, int64_t N);
int tr__cpu_xent_shard_bwd(float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int V, int64_t ld,
                           int64_t voff, float scale);
int tr__cpu_xent_fwd(float* losses, float* lse, const float* logits,
                     const int32_t* targets, int64_t N, int V, int64_t ld);
int tr__cpu_xent_bwd(float* logits, const float* lse, const int32_t* targets,
                     int64_t N, int V, int64_t ld, float scale);
int tr__cpu_xent_fused(float* losses, float* lse, float* logits,
                       const int32_t* targets, int64_t N, int V, int64_t ld,
                       float scale);
int tr__cpu_adamw(float* p, const float* g, float* m, float* v, int64_t n,
                  const tr_adamw_args_t* args);
int tr__cpu_sum_squares(double* out, const float* x, int64_t n);
int tr__cpu_scale(float* x, float s, int64_t n);
int tr__cpu_add(float* out, const float* a, const float* b, int64_t n);
int tr__cpu_accumulate(float* y, const float* x, int64_t n);
int tr__cpu_zero(float* x, int64_t n);

#endif /* TRAINRUN_KERNELS_CPU_H */
