/* trainrun/model.h: GPT-2 and Llama-3 models as a parameter table and a list
 * of blocks with hand-written forward and backward passes.
 *
 * A model is:
 *
 *  - a config (tr_model_config_t), looked up by family name and flavor
 *    ("gpt2"/"124M", "llama3"/"8B", ...) and then adjustable (vocab size to
 *    the tokenizer's, max_seq_len to the run's);
 *  - a family: one file per family (model/gpt2.c, model/llama3.c) owns all
 *    that differs between them — flavors, parameter table, embedding, final
 *    norm, transformer layer, Hugging Face config — behind a table of
 *    functions the model reaches through tr_model_t.family;
 *  - a parameter table (tr_param_t): every tensor with its Hugging Face name,
 *    global shape, how HF lays it out, its init rule, its tensor-parallel
 *    style, a layout (which part of the global tensor this rank holds; the
 *    whole tensor until dtensor/FSDP set one) and the local data and grad
 *    tensors the kernels read;
 *  - a list of blocks: block 0 embeds tokens, blocks 1..n_layers are the
 *    transformer layers, block n_layers+1 is the final norm + output + loss.
 *    Each block runs forward and backward on a micro-batch (tr_model_mb_t),
 *    surrounded by the hooks the trainer installs (FSDP: gather before,
 *    free after, reduce-scatter after backward; DDP: bucketed all-reduce in
 *    post_backward). A block's backward can also run as two calls, the
 *    input gradient (I) and the weight gradient (W), for zero-bubble
 *    pipeline schedules; a pipeline stage allocates only its blocks'
 *    parameters (tr_model_alloc_blocks).
 *
 * Typical single-rank use (the trainer adds optimizer, clipping, logging):
 *
 *     tr_model_config_t cfg;
 *     tr_model_config_get("llama3", "debugmodel", &cfg);
 *     cfg.vocab_size = 256;
 *     tr_model_t m;
 *     tr_model_init(&m, &cfg);              // table + blocks, no memory
 *     tr_model_alloc(&m, TR_DEVICE_CPU);    // local data + zeroed grads
 *     tr_model_init_weights(&m, 1234);      // deterministic
 *     tr_model_mb_t mb;
 *     tr_model_mb_init(&m, &mb, B, T, tokens, targets);   // int32 host arrays
 *     tr_model_zero_grad(&m);
 *     tr_model_forward(&m, &mb, 0, m.n_blocks);  // mb.loss_sum, mb.n_valid
 *     tr_model_backward(&m, &mb, 0, m.n_blocks); // grads += d(mean loss)
 *     tr_model_mb_release(&m, &mb);
 *     tr_model_release(&m);
 *
 * Math conventions follow the Hugging Face models, so safetensors export
 * needs no permutation except GPT-2's Conv1D transposes (recorded per
 * parameter): Llama RoPE rotates (i, i + D/2) pairs like HF's rotate_half
 * (torchtitan's interleaved-pair weights equal ours after HF's q/k row
 * permutation). Every op is fp32 on CPU; results do not depend on the
 * number of threads.
 */
#ifndef TRAINRUN_MODEL_H
#define TRAINRUN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/errmsg.h"
#include "trainrun/kernels.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configs ---- */

typedef enum { TR_MODEL_GPT2 = 0, TR_MODEL_LLAMA3 = 1 } tr_model_family_t;

typedef enum {
  TR_ATTN_CAUSAL = 0,      /* one document per row */
  TR_ATTN_BLOCK_CAUSAL = 1 /* a document ends at each eos_id token (which
                              belongs to it), as torchtitan's block_causal */
} tr_attn_mask_type_t;

typedef struct {
  tr_model_family_t family;
  char flavor[32]; /* "124M", "debugmodel", ... (informational) */
  int vocab_size;  /* rows of the embedding and of the output */
  int max_seq_len; /* gpt2: rows of wpe; llama3: longest T allowed */
  int dim;         /* model width C */
  int n_layers;
  int n_heads;
  int n_kv_heads;           /* == n_heads for GPT-2; < n_heads for GQA */
  int head_dim;             /* dim / n_heads */
  int ffn_dim;              /* MLP hidden width (gpt2: 4*dim) */
  float ffn_dim_multiplier; /* llama3: inputs of tr_model_llama_ffn_dim */
  int multiple_of;
  float norm_eps;                 /* LayerNorm / RMSNorm epsilon */
  float rope_theta;               /* llama3 only */
  tr_rope_scaling_t rope_scaling; /* llama3 only; factor 0 = none */
  int tie_embeddings; /* output projection reuses the token embedding */
  int bias;           /* linear and LayerNorm biases (gpt2) */
  /* Attention masks ([model] attn_mask_type, sliding_window,
   * document_positions; the kernels' tr_kern_attn_mask_t). A flavor sets
   * causal attention, no window, and its tokenizer's end-of-text id. */
  tr_attn_mask_type_t attn_mask;
  int32_t eos_id;         /* ends a document (block_causal): gpt2 50256,
                             llama3 128001 <|end_of_text|>, debugmodel 0
                             (the byte tokenizer's TR_BYTE_EOT) */
  int sliding_window;     /* W > 0: a query sees its W most recent keys */
  int document_positions; /* positions (GPT-2's wpe row, Llama's RoPE
                             angle) restart at 0 at each document start;
                             needs block_causal */
} tr_model_config_t;

/* Fill *out with a published flavor. name: "gpt2" or "llama3". Flavors:
 *   gpt2:   debugmodel (dim 128, 4 layers, 4 heads, vocab 256, T 256),
 *           124M (alias d12), 350M (d24), 774M (d36), 1558M (d48)
 *           — vocab 50257, max_seq_len 1024, LayerNorm eps 1e-5;
 *   llama3: debugmodel (torchtitan's: dim 256, 6 layers, 16 heads, theta
 *           500000, Llama 3.1 scaling; vocab 256 for the byte tokenizer),
 *           1B, 3B (Llama 3.2, tied embeddings), 8B, 70B (Llama 3.1)
 *           — vocab 128256, norm eps 1e-5.
 * Returns TR_ENOTFOUND for an unknown name or flavor (and logs the flavors
 * that exist). */
int tr_model_config_get(const char* name, const char* flavor,
                        tr_model_config_t* out);
/* Family name ("gpt2", "llama3"; "?" for an unknown id). */
const char* tr_model_family_name(tr_model_family_t f);
/* The family of a name ("gpt2", "llama3") in *out; TR_ENOTFOUND. */
int tr_model_family_from_name(const char* name, tr_model_family_t* out);
/* 1 when max_seq_len is a hard limit of the model (GPT-2: it sizes the
 * learned position table), 0 when it only states the context a run uses
 * (Llama: RoPE works at any length; a trainer may raise it). */
int tr_model_fixed_context(const tr_model_config_t* cfg);
/* NULL-terminated list of the flavors of a family name, or NULL. */
const char* const* tr_model_flavors(const char* name);
/* Check a (possibly edited) config: positive sizes, n_heads % n_kv_heads,
 * dim == n_heads * head_dim, even head_dim for RoPE. TR_ECONFIG with a
 * message in err (may be NULL) naming the bad field. */
int tr_model_config_check(const tr_model_config_t* cfg, char* err,
                          size_t errlen);
/* torchtitan's FeedForward width: int(2*4*dim/3), times the multiplier when
 * > 0, rounded up to multiple_of. 8B: 14336; 70B: 28672; 1B, 3B: 8192. */
int tr_model_llama_ffn_dim(int dim, float ffn_dim_multiplier, int multiple_of);

/* A Hugging Face config.json (GPT2LMHeadModel, LlamaForCausalLM) as the
 * ordered list of its fields, which checkpoint/ writes as JSON. A field of
 * kind TR_HF_OBJECT opens a nested object whose fields follow up to a
 * TR_HF_END; TR_HF_STRING_LIST is a list of one string (s). Floats are
 * written as the shortest decimal that reads back as f. */
typedef enum {
  TR_HF_STRING = 0,      /* s */
  TR_HF_STRING_LIST = 1, /* [s] */
  TR_HF_INT = 2,         /* i */
  TR_HF_FLOAT = 3,       /* f */
  TR_HF_BOOL = 4,        /* i != 0 */
  TR_HF_NULL = 5,
  TR_HF_OBJECT = 6, /* { the fields up to the matching TR_HF_END } */
  TR_HF_END = 7     /* closes an object (key NULL) */
} tr_hf_kind_t;

typedef struct {
  const char* key; /* static strings */
  tr_hf_kind_t kind;
  const char* s;
  int64_t i;
  float f;
} tr_hf_field_t;

#define TR_HF_CONFIG_MAX 64 /* enough fields for every family */

/* Fill out[0 .. cap) with cfg's HF config fields; returns their number,
 * TR_ERANGE when cap is too small, TR_EINVAL for an unknown family. */
int tr_model_hf_config(const tr_model_config_t* cfg, tr_hf_field_t* out,
                       int cap);

/* Number of parameters (tied tensors once) for a config. */
int64_t tr_model_config_num_params(const tr_model_config_t* cfg);
/* Training FLOPs per token as torchtitan counts them (models/utils.py):
 *   6 * (params - embedding-table params) + 12 * L * H * head_dim * T
 * where the embedding tables (token table unless tied, and GPT-2's position
 * table) are lookups, not matmuls. llm.c's figure for GPT-2 is
 * 6 * all params + 6 * L * C * T (it counts the tied table and half the
 * attention, for causality). */
double tr_model_flops_per_token(const tr_model_config_t* cfg, int seq_len);
/* The bytes a training forward of blocks [first, last) (0, n_layers + 2:
 * the whole model; a pipeline stage's range) holds for its backward over a
 * micro-batch of `tokens` tokens (a rank's rows: its chunks under context
 * parallelism) on a rank of tensor-parallel degree tp (1: none; above 1
 * with sequence parallelism, as trainrun always runs it: the residual
 * stream's rows split over tp, the gathered inputs of the column-parallel
 * layers whole, heads, FFN width and a vocabulary that tp divides split):
 * the range's input (the embedding's output, or the activations a later
 * stage receives), each layer's saved record and output, the head's
 * record, logits and losses, without activation checkpointing; act_size
 * bytes per compute-dtype element, 4 per float32 statistic (norms, the
 * attention's log-sum-exp, losses). Transient buffers are not counted.
 * What the CPU forward holds, byte for byte (tests/check_model,
 * tests/check_tp); on CUDA the logits' rows are padded to 64 columns. 0
 * for an empty or out-of-range range. */
int64_t tr_model_activation_bytes(const tr_model_config_t* cfg, int first,
                                  int last, int64_t tokens, int tp,
                                  int act_size);

/* ---- the parameter table ---- */

typedef enum {
  TR_INIT_ZEROS = 0,
  TR_INIT_ONES = 1,
  TR_INIT_NORMAL = 2,      /* N(0, std^2) */
  TR_INIT_TRUNC_NORMAL = 3 /* N(0, std^2) restricted to [lo, hi] */
} tr_init_kind_t;

typedef struct {
  tr_init_kind_t kind;
  float std;
  float lo, hi; /* TR_INIT_TRUNC_NORMAL bounds (absolute, as torch's a, b) */
} tr_init_rule_t;

/* How the Hugging Face checkpoint stores a tensor relative to ours. */
typedef enum {
  TR_HF_SAME = 0,      /* same shape and element order */
  TR_HF_TRANSPOSED = 1 /* GPT-2 Conv1D: HF holds [in, out], we hold [out, in] */
} tr_hf_layout_t;

/* How tensor parallelism splits a parameter (torchtitan's plan), declared
 * by the family when it builds the table; dtensor's tp plan turns styles
 * into placements. The model's blocks run on whatever local shard they
 * are given and call the tp hook (tr_model_tp_t) at the fixed points. */
typedef enum {
  TR_TP_REPLICATE = 0, /* whole on every tp rank: norms, GPT-2's position
                          table, the biases of row-parallel layers (added
                          once, after the reduction) */
  TR_TP_COLWISE = 1,   /* Shard(0) of [out, in] (and of its bias): output
                          features split; q, k, v (by heads), w1, w3, GPT-2
                          c_attn and c_fc */
  TR_TP_ROWWISE = 2,   /* Shard(1): input features split, the output a
                          partial sum reduced at TR_TP_FWD_OUT; wo, w2,
                          GPT-2 attn.c_proj and mlp.c_proj */
  TR_TP_VOCAB = 3,     /* the token embedding, Shard(0) over the vocab (a
                          table tied to the output is split so for both) */
  TR_TP_OUTPUT = 4     /* the output projection, Shard(0) over the vocab
                          (loss parallel) */
} tr_tp_style_t;       /* dtensor's plan (tr_tp_plan_apply) splits VOCAB and
                    OUTPUT only where tp divides the vocabulary */

/* Which part of the global tensor this rank holds. tr_model_init sets the
 * whole tensor (offset 0, shape = global shape, placement NULL). Only
 * dtensor sets offset/shape, from the placement (tr_dtensor_param_place,
 * tr_dtensor_param_shard), before tr_model_alloc; FSDP2 composes its
 * shard there and swaps data/grad in its hooks. */
typedef struct {
  int64_t offset[TR_MAX_DIMS]; /* first global index held, per dim */
  int64_t shape[TR_MAX_DIMS];  /* local extent, per dim */
  /* 1: the piece is the box [offset, offset + shape). P > 1 (a strided
   * tensor-parallel shard of a fused projection, GPT-2's q|k|v): along dim
   * 0 the tensor-parallel piece is P equal runs of part_rows rows, run j
   * starting at global row j x shape_global[0] / P + offset[0], and the
   * rank holds rows [skip, skip + shape[0]) of that piece, taken in run
   * order: all of it (skip 0, shape[0] = P x part_rows) unless a later
   * mesh dim cut it again (FSDP over tensor parallelism, PyTorch's
   * _StridedShard), whose rows may straddle runs (q|k, k|v). The other
   * dims are as for a box. tr_param_layout_runs lists the rows as boxes. */
  int parts;
  int64_t part_rows; /* parts > 1: rows of each run of the tp piece */
  int64_t skip;      /* parts > 1: rows of the tp piece before the first held */
  /* The placement this layout comes from: a tr_param_placement_t
   * (trainrun/dtensor.h, the one truth about sharding), a single heap
   * block that dtensor sets and tr_model_release frees; NULL = the whole
   * tensor on every rank. */
  void* placement;
} tr_param_layout_t;

/* Rows of a layout along dim 0 that are one box of the global tensor:
 * local rows [local, local + rows) are global rows [global, global +
 * rows). */
typedef struct {
  int64_t local, global, rows;
} tr_param_run_t;

/* The dim-0 runs of layout l of a tensor of global_rows rows, in local
 * order, into runs (room for TR_PARAM_MAX_RUNS): one for a box (empty
 * when it holds no row), for a strided layout one per tp part it holds
 * rows of (at least one). Returns the count, or TR_EINVAL for parts above
 * TR_PARAM_MAX_RUNS or runs that do not fit the layout. */
#define TR_PARAM_MAX_RUNS 8
int tr_param_layout_runs(const tr_param_layout_t* l, int64_t global_rows,
                         tr_param_run_t* runs);

typedef struct {
  char name[96]; /* HF name: "transformer.h.0.attn.c_attn.weight",
                             "model.layers.0.self_attn.q_proj.weight" */
  int ndim;
  int64_t shape[TR_MAX_DIMS]; /* global shape in our layout */
  tr_hf_layout_t hf_layout;
  tr_init_rule_t init;
  int block; /* block that owns it (first user) */
  tr_tp_style_t tp_style;
  /* Equal parts along the split dim, each split on its own: 1, or 3 for
   * GPT-2's fused c_attn (q | k | v rows, each split by heads, so that a
   * rank holds q, k and v of its heads as one [3 x local, in] tensor and
   * still runs one GEMM). */
  int tp_parts;
  /* 1 for matrices and embeddings, 0 for norms and biases: the trainer's
   * AdamW decays only the former (as llm.c and nanoGPT; torchtitan decays
   * everything) */
  int decay;
  tr_param_layout_t layout;
  /* The tensors the kernels read and accumulate into, shaped like
   * layout.shape. tr_model_alloc allocates them (grad zeroed); hooks may
   * replace them (e.g. FSDP's unsharded tensors) as long as they have the
   * shape the block expects when the block runs. Released by
   * tr_model_release. */
  tr_tensor_t data;
  tr_tensor_t grad;
  /* data in the model's compute dtype (bf16 on CUDA), which the blocks
   * read instead of data when it exists; grads stay fp32. Made by
   * tr_model_set_compute_dtype, refreshed by tr_model_refresh_compute or
   * by an optimizer that writes both (the fused CUDA AdamW). Empty when the
   * compute dtype is data's, or when hooks supply weights in the compute
   * dtype themselves (FSDP's all-gather in param_dtype). */
  tr_tensor_t compute;
} tr_param_t;

/* ---- blocks and hooks ---- */

typedef enum {
  TR_BLOCK_EMBED = 0, /* tokens -> hidden */
  TR_BLOCK_LAYER = 1, /* hidden -> hidden */
  TR_BLOCK_HEAD = 2   /* hidden -> norm -> logits -> loss */
} tr_block_kind_t;

#define TR_BLOCK_MAX_PARAMS 16

typedef struct {
  tr_block_kind_t kind;
  int layer;     /* layer index for TR_BLOCK_LAYER, else -1 */
  char name[32]; /* "embed", "layers.3", "head" */
  int n_params;
  int params[TR_BLOCK_MAX_PARAMS]; /* indices into tr_model_t.params; a tied
                                       tensor appears in both blocks */
} tr_model_block_t;

typedef enum {
  TR_HOOK_PRE_FORWARD = 0,
  TR_HOOK_POST_FORWARD = 1,
  TR_HOOK_PRE_BACKWARD = 2,
  TR_HOOK_POST_BACKWARD = 3,
  TR_HOOK__COUNT
} tr_hook_point_t;

struct tr_model;
struct tr_model_mb;
/* A hook: called with the block index around that block's compute; a
 * negative return stops the pass and is returned by it. */
typedef int (*tr_model_hook_fn)(void* arg, struct tr_model* m, int block,
                                struct tr_model_mb* mb);

typedef struct {
  tr_model_hook_fn fn;
  void* arg;
} tr_model_hook_t;

/* Tensor-parallel seam: the one place where the blocks talk to the other
 * ranks of their tensor-parallel group. When fn is set (dtensor's
 * tr_tp_install), the blocks call it at fixed points with an op saying
 * what to do to t; NULL (tp = 1): nothing happens and the bits are those of
 * a model without the seam. Local head counts, widths and vocabulary rows
 * are taken from the local weight shapes, so TP-sharded weights just work.
 *
 * Ops (the hook does exactly this over the group):
 *   TR_TP_SUM      all-reduce sum of t, in place
 *   TR_TP_MAX      all-reduce max of t, in place
 *   TR_TP_GATHER   all-gather along dim 1 (the sequence): t [B, T/tp, W]
 *                  becomes [B, T, W], rank r's rows at [r T/tp, (r+1) T/tp)
 *   TR_TP_SCATTER  reduce-scatter (sum) along dim 1: t [B, T, W] becomes
 *                  this rank's [B, T/tp, W] of the sum
 *   TR_TP_GATHER_LAST  all-gather along the last dim: [..., W/tp] becomes
 *                  [..., W], rank r's columns at [r W/tp, (r+1) W/tp)
 * For the three gathers and scatters the hook replaces *t by a new tensor
 * (releasing its reference to the old one).
 *
 * Points, per layer of both families (sequence_parallel 0 / 1):
 *   TR_TP_FWD_OUT  each row-parallel linear's output (Llama o_proj,
 *                  down_proj; GPT-2 attn.c_proj, mlp.c_proj), a partial
 *                  sum, before the residual add: SUM / SCATTER; a
 *                  row-parallel bias (GPT-2) is added after it, once
 *   TR_TP_FWD_IN   SP only: the norm output (a sequence shard) before the
 *                  column-parallel linears (q/k/v or c_attn, gate/up or
 *                  c_fc): GATHER
 *   TR_TP_BWD_IN   the gradient w.r.t. the input of the column-parallel
 *                  linears, a partial sum: SUM / SCATTER
 *   TR_TP_BWD_OUT  SP only: the gradient of a row-parallel output (a
 *                  sequence shard) before its backward: GATHER
 *   TR_TP_GRAD     SP only: the norms' weight (and bias) gradients of this
 *                  rank's tokens, summed in a temporary: SUM (one call per
 *                  norm), then added to the grads, so every tp rank holds
 *                  the whole gradient
 * So per layer: without SP two SUMs forward (again in a recomputed forward)
 * and two backward (in the I pass when split); with SP two GATHERs and two
 * SCATTERs forward, two GATHERs, two SCATTERs and two TR_TP_GRAD SUMs
 * backward. The embedding and the head:
 *   TR_TP_EMBED_OUT  a vocabulary-parallel embedding's output (each rank
 *                  looked up the tokens of its rows, 0 elsewhere): SUM /
 *                  SCATTER, then GPT-2's positions are added once; a
 *                  replicated table under SP just keeps its rows of T. Its
 *                  backward under SP gathers the output gradient
 *                  (TR_TP_BWD_OUT) and adds to the rows it holds only
 *   TR_TP_FWD_IN / TR_TP_BWD_IN / TR_TP_GRAD  the head under SP: the final
 *                  norm's output gathered before the output projection;
 *                  with a vocabulary-split output its input gradient is a
 *                  partial sum (SUM / SCATTER), with a replicated one each
 *                  rank keeps its rows
 *   TR_TP_LOSS     a vocabulary-split output projection (logits [B, T,
 *                  V/tp]): loss parallel — the rows' max (MAX), then their
 *                  sums of exponentials and target logits (one SUM of
 *                  both); or, with loss_parallel 0, the logits gathered
 *                  (GATHER_LAST) for the ordinary cross-entropy
 * Losses and log-sum-exps come out identical on every tp rank.
 *
 * Asynchronous tensor parallel ([parallelism] enable_async_tensor_parallel,
 * sequence parallel only): when overlap is set, the layers ask for the
 * SP GATHER before their column-parallel linears (TR_TP_FWD_IN, and in
 * backward TR_TP_BWD_OUT before the row-parallel dgrad) and the SP SCATTER
 * after their row-parallel ones (TR_TP_FWD_OUT, and TR_TP_BWD_IN after the
 * column-parallel dgrads) through overlap instead of fn, with a chunk
 * callback: the op is cut into the tp sequence chunks of [T/tp] rows and
 * moves them around the ring (rank r sends to r + 1, receives from r - 1)
 * while the callback computes on the chunk it holds, so the GEMM of one
 * chunk runs while the next travels:
 *   TR_TP_GATHER   t [B, T/tp, W] (contiguous) becomes [B, T, W] as for
 *                  fn; chunk(ctx, t0, n, part) is called once per rank's
 *                  rows [t0, t0 + n) of every sequence (n = T/tp, this
 *                  rank's first, then r - 1, r - 2, ...) once they are
 *                  here, part a contiguous [B, n, W] tensor holding them
 *                  (they are copied into the gathered tensor after)
 *   TR_TP_SCATTER  t is this rank's [B, T/tp, W] (allocated), set to its
 *                  rows of the sum over tp of what the callbacks write:
 *                  chunk(ctx, t0, n, part) is called once per rank's rows
 *                  of every sequence, part a contiguous [B, n, W] buffer
 *                  the callback OVERWRITES with this rank's partial sums of
 *                  those rows; each rank adds what it receives to its own
 *                  and passes the sum on, the rows' owner last
 * One transfer each way a ring step, one callback: its GEMMs run once over
 * the B sequences' rows (batch-strided views of the [B, T, *] tensors,
 * trainrun/kernels.h).
 * The sums of a SCATTER over more than 2 ranks are added in ring order, not
 * in the order of the blocking reduce-scatter (a last-bit difference). */
typedef enum {
  TR_TP_FWD_OUT = 0,
  TR_TP_BWD_IN = 1,
  TR_TP_FWD_IN = 2,
  TR_TP_BWD_OUT = 3,
  TR_TP_GRAD = 4,
  TR_TP_EMBED_OUT = 5,
  TR_TP_LOSS = 6,
  TR_TP__POINTS
} tr_tp_point_t;
typedef enum {
  TR_TP_SUM = 0,
  TR_TP_MAX = 1,
  TR_TP_GATHER = 2,
  TR_TP_SCATTER = 3,
  TR_TP_GATHER_LAST = 4,
  TR_TP__OPS
} tr_tp_op_t;
/* An async op's computation on one chunk of rows (see tr_model_tp_t): a
 * negative return stops the op and is returned by it. */
typedef int (*tr_tp_chunk_fn)(void* ctx, int64_t t0, int64_t n,
                              tr_tensor_t* part);
typedef struct {
  int (*fn)(void* arg, tr_tp_point_t point, tr_tp_op_t op, tr_tensor_t* t);
  /* async tensor parallel: GATHER or SCATTER overlapped with chunk (NULL:
   * off, the layers call fn) */
  int (*overlap)(void* arg, tr_tp_point_t point, tr_tp_op_t op, tr_tensor_t* t,
                 tr_tp_chunk_fn chunk, void* ctx);
  void* arg;
  int size, rank;        /* the tp group's size and this rank's index */
  int sequence_parallel; /* 1: the residual stream between blocks is this
                            rank's T/tp rows of the sequence [B, T/tp, C]
                            (mb->hidden, mb->dhidden); T % size must be 0
                            (TR_ECONFIG at the embedding otherwise) */
  int loss_parallel;     /* 1: vocabulary-sharded cross-entropy; 0: gather
                            the logits (disable_loss_parallel) */
} tr_model_tp_t;

/* Context-parallel seam (dtensor's tr_cp_install, trainrun/cp.h): when fwd
 * is set, a micro-batch (tr_model_mb_init) takes whole sequences of T
 * tokens and keeps this rank's two chunks of T / (2 size) tokens (chunks
 * rank and 2 size - 1 - rank, head-tail) as its T / size rows; positions
 * (GPT-2's wpe rows, Llama's RoPE angles) are each token's in the whole
 * sequence (or in its document, document_positions); the mask's doc_start
 * stays the whole sequence's [B, T] (every rank sees every token); and
 * each layer's attention calls fwd / bwd with its q, k, v of the local
 * rows instead of the attention kernels. Losses and token counts are this
 * rank's rows': the caller sums them over cp, and the parameter gradients
 * are partial sums over cp (FSDP over dp_shard x cp sums them). NULL (cp
 * = 1): nothing changes. */
typedef struct {
  int (*fwd)(void* arg, tr_tensor_t* out, tr_tensor_t* lse,
             const tr_tensor_t* q, const tr_tensor_t* k, const tr_tensor_t* v,
             int n_heads, int n_kv_heads, const tr_tensor_t* doc_start,
             int window);
  int (*bwd)(void* arg, tr_tensor_t* dq, tr_tensor_t* dk, tr_tensor_t* dv,
             const tr_tensor_t* dout, const tr_tensor_t* q,
             const tr_tensor_t* k, const tr_tensor_t* v, const tr_tensor_t* out,
             const tr_tensor_t* lse, int n_heads, int n_kv_heads,
             const tr_tensor_t* doc_start, int window);
  void* arg;
  int size, rank; /* the cp group's size and this rank's index */
} tr_model_cp_t;

struct tr_model_family; /* model/internal.h */

typedef struct tr_model {
  tr_model_config_t cfg;
  /* the family's table (set by tr_model_init from cfg.family) */
  const struct tr_model_family* family;
  tr_device_t device;
  int n_params;
  tr_param_t* params;
  int n_blocks; /* n_layers + 2 */
  tr_model_block_t* blocks;
  tr_model_tp_t tp;
  tr_model_cp_t cp;
  /* dtype of activations and of the weights the blocks read: TR_F32
   * (default, every device) or TR_BF16 (CUDA) */
  tr_dtype_t compute_dtype;
  /* private */
  tr_model_hook_t* hooks[TR_HOOK__COUNT];
  int n_hooks[TR_HOOK__COUNT];
  tr_tensor_t rope_cos, rope_sin; /* [T, head_dim/2], grown on demand */
  int rope_T;
  int ac_mode;  /* tr_model_ac_mode_t (tr_model_set_activation_checkpoint) */
  int ac_every; /* TR_AC_LAYERS: every ac_every-th layer */
  /* tr_model_alloc_blocks: its calls, and 1 once a call covered less than
   * every block (a pipeline rank: parameters without memory are not its) */
  int n_alloc_calls;
  int partial;
  /* the blocks this rank runs (tr_model_hold_blocks), n_blocks flags;
   * NULL: every block */
  unsigned char* held;
} tr_model_t;

/* Build the parameter table and the blocks for cfg (checked with
 * tr_model_config_check). No tensor memory yet. TR_ECONFIG, TR_ENOMEM. */
int tr_model_init(tr_model_t* m, const tr_model_config_t* cfg);
/* Allocate every parameter's data (uninitialised) and grad (zero) on dev,
 * shaped by its layout. Called once. tr_model_alloc_blocks(m, dev, 0,
 * m->n_blocks). */
int tr_model_alloc(tr_model_t* m, tr_device_t dev);
/* A pipeline stage's allocation: the parameters that blocks [first, last)
 * use get data and grad (a table tied between the embedding and the head
 * belongs to both end stages); called once per stage a rank holds (an
 * interleaved schedule's rank holds several; parameters allocated already
 * are kept, so a range again is a no-op). Parameters of no allocated
 * block keep no memory, and tr_model_init_weights, tr_model_zero_grad and
 * the compute copies skip them. Forward and backward of the allocated
 * blocks work as with the whole model. TR_EINVAL for an empty or
 * out-of-range range, or another device than an earlier call's. */
int tr_model_alloc_blocks(tr_model_t* m, tr_device_t dev, int first, int last);
/* Declare, before the layers above compose their shards, that this rank
 * runs blocks [first, last) (a pipeline stage; once per stage it holds):
 * FSDP then groups only these blocks' parameters. tr_model_alloc_blocks
 * declares its range too. TR_EINVAL for an empty or out-of-range range,
 * TR_ENOMEM. */
int tr_model_hold_blocks(tr_model_t* m, int first, int last);
/* 1 when this rank runs block b: every block until a range is declared. */
int tr_model_block_held(const tr_model_t* m, int b);
/* 1 when parameter idx is used by a block in [first, last), else 0. */
int tr_model_param_in_blocks(const tr_model_t* m, int idx, int first, int last);
/* Fill every parameter from its init rule. Element values depend only on
 * (seed, parameter name, global element index): a counter-based generator
 * (SplitMix64 hashing), so shards, thread counts and table order do not
 * change them. GPT-2: N(0, 0.02), c_proj weights 0.02/sqrt(2 n_layers),
 * biases 0, LayerNorm 1/0. Llama (torchtitan): embedding N(0, 1); wq, wk,
 * wv, w1 trunc-normal 0.02; wo, w2, w3 trunc-normal 0.02/sqrt(2(layer+1));
 * norms 1; output trunc-normal dim^-0.5 cut at 3 std (a tied table uses
 * the output's rule). Device tensors are filled through a host
 * copy; compute copies are refreshed. */
int tr_model_init_weights(tr_model_t* m, uint64_t seed);
/* Compute in dt (TR_F32 or TR_BF16; after tr_model_alloc). With copies
 * != 0 and dt differing from the parameters' dtype, every parameter gets a
 * compute copy, filled now; with copies == 0 the hooks provide weights in
 * dt (FSDP). Activations are dt from the next forward; statistics, losses
 * and parameter gradients stay fp32. TR_EDTYPE for other dtypes. */
int tr_model_set_compute_dtype(tr_model_t* m, tr_dtype_t dt, int copies);
/* Convert every parameter's data into its compute copy (after the weights
 * change other than through an optimizer that writes both: loading a
 * checkpoint). Enqueued on the device; no-op without copies. */
int tr_model_refresh_compute(tr_model_t* m);
/* Zero every grad. */
int tr_model_zero_grad(tr_model_t* m);
/* Free everything (tensors, table, hooks). Safe on a zeroed struct. */
void tr_model_release(tr_model_t* m);

/* Index of the parameter with that HF name, or -1. */
int tr_model_find_param(const tr_model_t* m, const char* name);
/* Sum of numel over the table (tied once). */
int64_t tr_model_num_params(const tr_model_t* m);

/* Append a hook at a point; hooks run in the order added. */
int tr_model_add_hook(tr_model_t* m, tr_hook_point_t point, tr_model_hook_fn fn,
                      void* arg);
void tr_model_clear_hooks(tr_model_t* m);

/* ---- micro-batches and the passes ---- */

/* One micro-batch in flight: its inputs, the hidden state between blocks,
 * and each block's saved activations. Several may be in flight at once
 * (pipeline schedules). Tensors below are on the model's device. */
typedef struct tr_model_mb {
  int B, T;
  tr_tensor_t tokens;  /* [B,T] int32 */
  tr_tensor_t targets; /* [B,T] int32, or nothing (no loss) */
  /* The residual stream between blocks: forward of block i reads `hidden`
   * (block i's input) and leaves its output there; backward of block i
   * reads `dhidden` (gradient of its output) and leaves the gradient of its
   * input there. A pipeline stage receives into / sends from these. */
  tr_tensor_t hidden;  /* [B,T,C]; under sequence parallel [B,T/tp,C] */
  tr_tensor_t dhidden; /* [B,T,C]; under sequence parallel [B,T/tp,C] */
  /* After the head block's forward: logits [B,T,V] and per-token losses
   * [B,T]. A forward that will be followed by a backward (targets given,
   * not no_grad) leaves dlogits there already (one fused pass, with the
   * loss_scale below); its backward frees them. Under no_grad (eval,
   * sampling) they stay logits for the caller. Under tensor parallelism
   * with the vocabulary split over tp, logits (and dlogits) are this
   * rank's columns [B,T,V/tp], except after a forward without targets,
   * which gathers them whole; losses are whole on every rank. The head
   * consumes `hidden`, which is then empty. */
  tr_tensor_t logits;
  tr_tensor_t losses;
  double loss_sum; /* sum of the losses of non-ignored targets */
  int64_t n_valid; /* number of targets != TR_IGNORE_INDEX (counted on the
                      host by tr_model_mb_init) */
  /* 1: the head leaves the per-token losses in `losses` (0 at ignored
   * targets) and does not sum them, so loss_sum stays 0: the caller adds
   * them up later, and a device step needs no host synchronization per
   * micro-batch. */
  int defer_loss;
  /* d(objective)/d(each token's loss) for the backward; 0 (the default)
   * means 1/n_valid, the mean over this micro-batch. Set it to
   * 1/(valid tokens in the global batch) for accumulation or DP. */
  float loss_scale;
  int no_grad; /* 1: forward keeps no activations (eval, sampling) */
  /* The attention mask, made from the tokens by tr_model_mb_init when the
   * config asks for block_causal (empty otherwise): doc_start [B,T] int32
   * (tr_kern_attn_doc_start); with document_positions each token's
   * position in its document, as pos [B,T] int32 (gpt2's wpe rows) or as
   * RoPE tables rope_cos/rope_sin [B*T, head_dim/2] (llama3). Under
   * context parallelism doc_start is the whole sequences' [B, cp T] and
   * the positions (or RoPE tables) are always set: each of this rank's
   * tokens at its place in the whole sequence (or its document).
   * n_docs, longest_doc: doc_start's documents and the rows of the
   * longest (tr_kern_attn_doc_count), counted once on the host. */
  tr_tensor_t doc_start, pos, rope_cos, rope_sin;
  int n_docs, longest_doc;
  /* private: per-block saved activations, freed by that block's backward
   * (or turned by the I pass into what the W pass needs, in wsaved) */
  void** saved;
  void** wsaved;
  int n_blocks;
} tr_model_mb_t;

/* Prepare a micro-batch: copies tokens (and targets, may be NULL) from host
 * int32 arrays [B*T] to the model's device. T <= cfg.max_seq_len. Tokens are
 * checked against the vocab at the embedding (TR_EINVAL names the first bad
 * one). Under a context-parallel seam (tr_model_cp_t) tokens and targets
 * are the whole sequences and the micro-batch keeps this rank's chunks:
 * mb->T = T / cp, n_valid counts its targets; T % (2 cp) != 0 is
 * TR_EINVAL. */
int tr_model_mb_init(tr_model_t* m, tr_model_mb_t* mb, int B, int T,
                     const int32_t* tokens, const int32_t* targets);
/* Free everything the micro-batch holds. */
void tr_model_mb_release(tr_model_t* m, tr_model_mb_t* mb);

/* Forward blocks [first, last) with their hooks. A range that ends at the
 * head block computes the loss when targets were given. */
int tr_model_forward(tr_model_t* m, tr_model_mb_t* mb, int first, int last);
/* Backward blocks [first, last) in reverse order with their hooks;
 * parameter grads accumulate (+=). A range that starts below the head needs
 * mb->dhidden set (a pipeline stage receives it). Each block frees its saved
 * activations as it finishes; the embedding's backward frees dhidden. */
int tr_model_backward(tr_model_t* m, tr_model_mb_t* mb, int first, int last);
/* One block, hooks included (what the two above loop over). */
int tr_model_block_forward(tr_model_t* m, tr_model_mb_t* mb, int block);
int tr_model_block_backward(tr_model_t* m, tr_model_mb_t* mb, int block);

/* Backward split into I and W (zero-bubble pipeline schedules). The
 * combined tr_model_block_backward stays the fast path (fused kernels, no
 * kept copies); I then W gives the same bits on the CPU.
 *
 *  - I, tr_model_block_backward_input: the gradient w.r.t. the block's
 *    input (into mb->dhidden, as the combined call) and the norms'
 *    gradients (they come out of the same kernel as the input gradient);
 *    the tp seam's TR_TP_BWD_IN points run here. The block keeps what W
 *    needs (the linear layers' inputs and output gradients; the
 *    embedding: its output gradient) and frees the rest of its record.
 *    Runs the PRE_BACKWARD hooks first (FSDP's gather serves both passes).
 *    The embedding has no input gradient: its I only takes mb->dhidden.
 *  - W, tr_model_block_backward_weight: the linear layers' weight and bias
 *    gradients (the embedding: its tables'; the head: the output
 *    projection's), accumulated (+=) from what I kept, which it frees.
 *    Runs the POST_BACKWARD hooks after (the block's gradients are then
 *    complete: FSDP reduce-scatters them there). The block's weights must
 *    still be there (gathered) between I and W.
 *
 * Gradients of different parameters do not interact, so any order of the
 * W calls gives the combined pass's bits, except a table tied between the
 * embedding and the head (GPT-2, tied Llama), where the head's W must come
 * before the embedding's as in the combined pass (the range call below
 * runs W in reverse block order). TR_EINVAL for I without a forward
 * record or for W without an I. */
int tr_model_block_backward_input(tr_model_t* m, tr_model_mb_t* mb, int block);
int tr_model_block_backward_weight(tr_model_t* m, tr_model_mb_t* mb, int block);
/* The two over blocks [first, last), in reverse order. */
int tr_model_backward_input(tr_model_t* m, tr_model_mb_t* mb, int first,
                            int last);
int tr_model_backward_weight(tr_model_t* m, tr_model_mb_t* mb, int first,
                             int last);

/* Mean loss of the last forward (loss_sum / n_valid; NaN when none). */
double tr_model_mb_loss(const tr_model_mb_t* mb);

/* ---- activation checkpointing (model/recompute.c) ----
 *
 * Trade compute for memory in the transformer layers (torchtitan's
 * [activation_checkpoint]). A checkpointed layer's forward keeps only a
 * view of its input; its backward first re-runs the layer's forward from
 * that input (after the pre-backward hooks, so FSDP's gathered parameters
 * serve it; the forward hooks do not run again, as FSDP2's do nothing
 * during a recomputation) and then the backward. The kernels are
 * deterministic and the model has no dropout, so the recomputed
 * activations, and hence losses and gradients, are bit-identical to a run
 * without checkpointing. The embedding and head blocks always keep theirs.
 */
typedef enum {
  TR_AC_NONE = 0,   /* keep every activation (the default) */
  TR_AC_FULL = 1,   /* every layer recomputes its forward in backward */
  TR_AC_LAYERS = 2, /* selective N: layers with (layer + 1) % N == 0 recompute,
                       as torchtitan counts them (N = 2: layers 1, 3, ...) */
  TR_AC_OPS = 3     /* selective op: keep the matmul and attention outputs
                       (gpt2: qkv, attention out, fc; llama3: q, k, v after
                       RoPE, attention out, gate, up) and recompute the
                       norm outputs and the GELU / SwiGLU products */
} tr_model_ac_mode_t;

/* Set the policy for the forwards that follow (a record saved before
 * keeps the policy it was saved under). every_n >= 1 for TR_AC_LAYERS
 * (ignored otherwise). TR_EINVAL for a bad mode or every_n. */
int tr_model_set_activation_checkpoint(tr_model_t* m, tr_model_ac_mode_t mode,
                                       int every_n);
/* Whether layer `layer` (0-based) recomputes its forward under the current
 * policy (TR_AC_OPS: 0, it keeps part of its activations). */
int tr_model_ac_recomputes(const tr_model_t* m, int layer);
/* Set the policy from [activation_checkpoint] mode and selective_ac_option
 * strings ("none", "full", "selective" with "op" or a number N >= 1).
 * TR_ECONFIG with a message in err (may be NULL) naming the key for an
 * unknown mode, "memory_budget" (not supported) or a bad option. Logs the
 * policy (which layers recompute) at info level. */
int tr_model_set_activation_checkpoint_config(tr_model_t* m, const char* mode,
                                              const char* option,
                                              tr_errmsg_t* err);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_MODEL_H */
