/* trainrun/cp.h: context parallelism -- a sequence is cut into 2N equal
 * chunks, each of the N cp ranks keeps two of them (head-tail load
 * balancing), and attention of a query chunk runs against each key/value
 * chunk separately and is merged with the log-sum-exp the attention
 * kernels keep:
 *
 *     lse = log sum_j exp(lse_j),   out = sum_j exp(lse_j - lse) out_j
 *
 * The backward runs each (query chunk, key chunk) pair's attention
 * backward with the merged out and lse, which is the full attention's
 * backward restricted to that pair; dq sums over key chunks, dk and dv
 * over query chunks.
 *
 * Two layers: the core (tr_cp_attention_fwd/_bwd) takes every key/value
 * chunk in sequence order, as an all-gather leaves them, and moves
 * nothing; the ring (tr_cp_ring_fwd/_bwd) takes this rank's two chunks of
 * q, k and v and does the communication over the cp group, by the rotate
 * method torchtitan names:
 *
 *  - "allgather": the key/value chunks all-gathered and put in sequence
 *    order, the core run on them; in backward the key/value gradients of
 *    the whole sequence are reduce-scattered back to their owners (each
 *    owner's two chunks).
 *  - "alltoall": the key/value chunk pairs rotate around the ring (send to
 *    rank + 1, receive from rank - 1, N - 1 times), so a rank holds two
 *    pairs at once, never all of them; the partial results are merged as
 *    they come (the next pair's transfer overlaps the current pair's
 *    attention). In backward the pairs rotate again, each with the
 *    gradient of its keys and values, which every rank adds its part to;
 *    after N moves each gradient is back at its owner.
 *
 * Masks compose: doc_start [B, T] int32 of the WHOLE sequence (every cp
 * rank knows every token) and a sliding window; a pair's mask is the
 * query rows' document starts relative to the key chunk. RoPE positions
 * are the chunks' own (chunk i starts at position i * chunk length): the
 * caller rotates each chunk with its rows of the angle tables (the model
 * does it with each token's position, model/mask.c).
 *
 * CPU float32 tensors (the chunk-pair kernels with a query shift are
 * CPU-only so far); q, k, v, dq, dk, dv may be strided 3-d views (GPT-2's
 * fused q|k|v). */
#ifndef TRAINRUN_CP_H
#define TRAINRUN_CP_H

#include "trainrun/model.h"
#include "trainrun/pg.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* torchtitan's "headtail" load balancer: rank r of n holds chunks r and
 * 2n - 1 - r of the 2n, in that order, so each rank has the same causal
 * work. TR_EINVAL unless 0 <= rank < n. */
int tr_cp_headtail(int n, int rank, int chunks[2]);

/* ---- the core: every key/value chunk at hand ---- */

/* Forward for one rank. q [B, nq*c, H*D]: the query chunks q_chunks[0..nq)
 * (indices into the n_chunks chunks of the sequence, c tokens each)
 * concatenated; k, v [B, n_chunks*c, KVH*D]: every key/value chunk in
 * sequence order. Each query chunk attends to the keys at or before its
 * positions that the mask lets it see: one masked attention per key
 * chunk at or before it (tr_kern_attention_masked_fwd with q_shift =
 * (query chunk - key chunk) * c), merged as above. doc_start: [B,
 * n_chunks*c] int32 of the whole sequence or NULL; window: 0 or the
 * sliding window (tr_kern_attn_mask_t). out [B, nq*c, H*D], lse [B, H,
 * nq*c] (natural log, as the kernels'). Grouped-query heads as the
 * kernels: query head h reads kv head h / (H / KVH). */
int tr_cp_attention_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                        const tr_tensor_t* q, const tr_tensor_t* k,
                        const tr_tensor_t* v, int n_heads, int n_kv_heads,
                        const int* q_chunks, int nq, int n_chunks,
                        const tr_tensor_t* doc_start, int window);

/* Backward for one rank, from the merged out and lse of the forward:
 * dq like q (overwritten); dk, dv like k, v (overwritten): this rank's
 * share of the key/value gradients, summed over its query chunks (the
 * gradients of the whole sequence are the sum over the cp ranks). */
int tr_cp_attention_bwd(tr_tensor_t* dq, tr_tensor_t* dk, tr_tensor_t* dv,
                        const tr_tensor_t* dout, const tr_tensor_t* q,
                        const tr_tensor_t* k, const tr_tensor_t* v,
                        const tr_tensor_t* out, const tr_tensor_t* lse,
                        int n_heads, int n_kv_heads, const int* q_chunks,
                        int nq, int n_chunks, const tr_tensor_t* doc_start,
                        int window);

/* ---- the ring: the communication over the cp group ---- */

typedef enum {
  TR_CP_ALLGATHER = 0, /* context_parallel_rotate_method = "allgather" */
  TR_CP_ALLTOALL = 1   /* "alltoall": the pairs rotate around the ring */
} tr_cp_rotate_t;

/* "allgather" / "alltoall" into *out; TR_EINVAL for another name. */
int tr_cp_rotate_parse(const char* name, tr_cp_rotate_t* out);

typedef struct {
  tr_pg_t* pg; /* the cp group (mesh dim "cp"); rank r holds chunks r and
                  2 size - 1 - r */
  tr_cp_rotate_t rotate;
} tr_cp_t;

/* This rank's attention: q [B, 2c, H*D], k, v [B, 2c, KVH*D] its two
 * chunks (tr_cp_headtail) in that order; out [B, 2c, H*D], lse [B, H,
 * 2c]. doc_start [B, 2 size c] int32 of the whole sequence, or NULL;
 * window as the kernels'. Collective over cp->pg. */
int tr_cp_ring_fwd(const tr_cp_t* cp, tr_tensor_t* out, tr_tensor_t* lse,
                   const tr_tensor_t* q, const tr_tensor_t* k,
                   const tr_tensor_t* v, int n_heads, int n_kv_heads,
                   const tr_tensor_t* doc_start, int window);
/* Its backward: dq, dk, dv (shaped like q, k, v; overwritten) of this
 * rank's chunks, dk and dv summed over every rank's queries. Collective
 * over cp->pg. */
int tr_cp_ring_bwd(const tr_cp_t* cp, tr_tensor_t* dq, tr_tensor_t* dk,
                   tr_tensor_t* dv, const tr_tensor_t* dout,
                   const tr_tensor_t* q, const tr_tensor_t* k,
                   const tr_tensor_t* v, const tr_tensor_t* out,
                   const tr_tensor_t* lse, int n_heads, int n_kv_heads,
                   const tr_tensor_t* doc_start, int window);

/* Install the ring as m's attention (the model seam tr_model_cp_t): m's
 * micro-batches then take whole sequences and keep this rank's chunks,
 * positions are each token's in the whole sequence, and every layer's
 * attention runs tr_cp_ring_fwd/_bwd over cp. cp is borrowed (it must
 * outlive m's passes); NULL or a group of one rank uninstalls it. */
void tr_cp_install(tr_model_t* m, const tr_cp_t* cp);

#ifdef __cplusplus
}
#endif

#endif /* TRAINRUN_CP_H */
