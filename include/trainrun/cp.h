/* trainrun/cp.h: the attention core of context parallelism, without the
 * communication: a sequence is cut into 2N equal chunks, each of the N cp
 * ranks keeps two query chunks (head-tail load balancing), and attention
 * of a query chunk runs against each key/value chunk separately and is
 * merged with the log-sum-exp the attention kernels keep:
 *
 *     lse = log sum_j exp(lse_j),   out = sum_j exp(lse_j - lse) out_j
 *
 * The backward runs each (query chunk, key chunk) pair's attention
 * backward with the merged out and lse, which is the full attention's
 * backward restricted to that pair; dq sums over key chunks, dk and dv
 * over query chunks. What moves the key/value chunks between ranks (an
 * all-gather, or their rotation in a ring) and reduce-scatters dk and dv
 * to their owners is not here: these functions take every key/value chunk
 * in sequence order, as an all-gather leaves them. RoPE positions are the
 * chunks' own (chunk i starts at position i * chunk length): the caller
 * rotates each chunk with its rows of the angle tables.
 *
 * CPU float32 tensors (the chunk-pair kernels with a query shift are
 * CPU-only so far). */
#ifndef TRAINRUN_CP_H
#define TRAINRUN_CP_H

#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* torchtitan's "headtail" load balancer: rank r of n holds chunks r and
 * 2n - 1 - r of the 2n, in that order, so each rank has the same causal
 * work. TR_EINVAL unless 0 <= rank < n. */
int tr_cp_headtail(int n, int rank, int chunks[2]);

/* Forward for one rank. q [B, nq*c, H*D]: the query chunks q_chunks[0..nq)
 * (indices into the n_chunks chunks of the sequence, c tokens each)
 * concatenated; k, v [B, n_chunks*c, KVH*D]: every key/value chunk in
 * sequence order. Each query chunk attends causally to the keys at or
 * before its positions: one masked attention per key chunk at or before
 * it (tr_kern_attention_masked_fwd with q_shift = (query chunk - key
 * chunk) * c), merged as above. out [B, nq*c, H*D], lse [B, H, nq*c]
 * (natural log, as the kernels'). Grouped-query heads as the kernels:
 * query head h reads kv head h / (H / KVH). */
int tr_cp_attention_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                        const tr_tensor_t* q, const tr_tensor_t* k,
                        const tr_tensor_t* v, int n_heads, int n_kv_heads,
                        const int* q_chunks, int nq, int n_chunks);

/* Backward for one rank, from the merged out and lse of the forward:
 * dq like q (overwritten); dk, dv like k, v (overwritten): this rank's
 * share of the key/value gradients, summed over its query chunks (the
 * gradients of the whole sequence are the sum over the cp ranks). */
int tr_cp_attention_bwd(tr_tensor_t* dq, tr_tensor_t* dk, tr_tensor_t* dv,
                        const tr_tensor_t* dout, const tr_tensor_t* q,
                        const tr_tensor_t* k, const tr_tensor_t* v,
                        const tr_tensor_t* out, const tr_tensor_t* lse,
                        int n_heads, int n_kv_heads, const int* q_chunks,
                        int nq, int n_chunks);

#ifdef __cplusplus
}
#endif

#endif /* TRAINRUN_CP_H */
