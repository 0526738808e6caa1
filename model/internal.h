/* model/internal.h: what the model's files share — the family table each
 * family file fills (model/gpt2.c, model/llama3.c), parameter slots of each
 * block kind, the parameter-table builder (model/table.c), and the helpers
 * below the families (model/act.c).
 *
 * Files and who references whom (no cycle between the objects):
 *
 *   config.c  --> gpt2.c, llama3.c   (the family registry)
 *   params.c  --> config.c, table.c  (tr_model_init builds through the table)
 *   model.c   --> recompute.c, act.c (blocks reach the family through
 *                                     m->family, a pointer, not a symbol)
 *   gpt2.c, llama3.c --> act.c, table.c
 */
#ifndef TRAINRUN_MODEL_INTERNAL_H
#define TRAINRUN_MODEL_INTERNAL_H

#include "trainrun/model.h"

/* Slots in tr_model_block_t.params, per family and block kind. */
enum { EMB_WTE = 0, EMB_WPE = 1 };

/* The parameter in a block's slot. */
static inline tr_param_t* tr__param(tr_model_t* m, int block, int slot) {
  return &m->params[m->blocks[block].params[slot]];
}
/* The weight a block reads: the compute copy when there is one. */
static inline tr_tensor_t* tr__weight(tr_model_t* m, int block, int slot) {
  tr_param_t* p = tr__param(m, block, slot);
  return p->compute.storage ? &p->compute : &p->data;
}
#define W(m, blk, slot) tr__weight((m), (blk), (slot))
#define G(m, blk, slot) (&tr__param((m), (blk), (slot))->grad)

/* ---- the parameter-table builder (model/table.c) ---- */

typedef struct {
  tr_model_t* m;
  size_t cap; /* parameters m->params has room for */
} tr__table_t;

tr_init_rule_t tr__rule(tr_init_kind_t k, float std, float lo, float hi);
#define TR__ZEROS tr__rule(TR_INIT_ZEROS, 0, 0, 0)
#define TR__ONES tr__rule(TR_INIT_ONES, 0, 0, 0)
#define TR__NORMAL(s) tr__rule(TR_INIT_NORMAL, (s), 0, 0)
/* torch.nn.init.trunc_normal_ defaults: a = -2, b = 2 (absolute) */
#define TR__TRUNC(s) tr__rule(TR_INIT_TRUNC_NORMAL, (s), -2.0f, 2.0f)

/* What a family declares about one parameter besides its name. */
typedef struct {
  tr_init_rule_t init;
  int hf_transposed; /* HF holds the transpose (GPT-2 Conv1D) */
  tr_tp_style_t tp;
  int tp_parts; /* 0 or 1: one part; 3: GPT-2's fused q|k|v */
} tr__pdecl_t;

/* Add a parameter ([d0] when ndim is 1, [d0, d1] when 2) to the table and
 * to block blk's list; returns its index or a negative error. */
int tr__table_add(tr__table_t* t, int blk, tr__pdecl_t d, int ndim, int64_t d0,
                  int64_t d1, const char* fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* List an existing parameter (a tied table) in block blk too. */
void tr__table_use(tr__table_t* t, int blk, int idx);
/* Append k HF config fields to out[*n ..] (tr_model_hf_config), *n += k;
 * TR_ERANGE when they do not fit in cap. */
int tr__hf_append(tr_hf_field_t* out, int cap, int* n, const tr_hf_field_t* f,
                  int k);

/* ---- helpers below the families (model/act.c) ---- */

/* Activations: [B, T, w] in the compute dtype on the model's device,
 * uninitialised or 0. */
int tr__act(tr_model_t* m, tr_tensor_t* t, int B, int T, int64_t w);
int tr__act_zeros(tr_model_t* m, tr_tensor_t* t, int B, int T, int64_t w);
/* A copy of an activation (what the I pass keeps for the W pass). */
int tr__act_copy(tr_model_t* m, tr_tensor_t* dst, const tr_tensor_t* src);
/* [n] fp32 (statistics) */
int tr__vec(tr_model_t* m, tr_tensor_t* t, int64_t n);
/* Make sure the RoPE tables cover T positions. */
int tr__rope_ensure(tr_model_t* m, int T);
/* dst [B, T] int32 on the model's device from a host array (tokens,
 * targets, the mask's doc_start and positions) */
int tr__act_i32(tr_model_t* m, tr_tensor_t* dst, const int32_t* src, int B,
                int T);

/* model/mask.c: a micro-batch's attention mask (block_causal: doc_start,
 * and with document_positions the positions, or for Llama their RoPE
 * tables), built from the host tokens [B, T] (the whole sequences) by
 * tr_model_mb_init. Under context parallelism doc_start is the whole
 * sequences' and the positions (always set then) are those of this rank's
 * rows in the whole sequence (or in their documents). */
int tr__mask_mb_init(tr_model_t* m, tr_model_mb_t* mb, const int32_t* tokens,
                     int T);
/* dst [B, T / cp] = this cp rank's two chunks of each row of src [B, T]
 * (head-tail: chunks rank and 2 cp - 1 - rank of 2 cp) */
void tr__mask_cp_rows(const tr_model_t* m, int32_t* dst, const int32_t* src,
                      int B, int T);
/* The layers' attention: the context-parallel seam when installed, else
 * the masked attention kernels with mb's mask and the config's window. */
int tr__attention_fwd(tr_model_t* m, const tr_model_mb_t* mb, tr_tensor_t* out,
                      tr_tensor_t* lse, const tr_tensor_t* q,
                      const tr_tensor_t* k, const tr_tensor_t* v, int H,
                      int KVH);
int tr__attention_bwd(tr_model_t* m, const tr_model_mb_t* mb, tr_tensor_t* dq,
                      tr_tensor_t* dk, tr_tensor_t* dv, const tr_tensor_t* dout,
                      const tr_tensor_t* q, const tr_tensor_t* k,
                      const tr_tensor_t* v, const tr_tensor_t* out,
                      const tr_tensor_t* lse, int H, int KVH);
void tr__mask_mb_release(tr_model_mb_t* mb);
/* mb's doc_start / document positions, NULL when it has none */
const tr_tensor_t* tr__mask_doc_start(const tr_model_mb_t* mb);
const tr_tensor_t* tr__mask_pos(const tr_model_mb_t* mb);
/* RoPE of x [B,T,heads*D] at the micro-batch's positions: 0..T-1 from the
 * model's tables (tr__rope_ensure first), or each token's document
 * position */
int tr__mask_rope(tr_model_t* m, const tr_model_mb_t* mb, tr_tensor_t* x,
                  int heads, int inverse);
/* Release a list of tensors. */
void tr__release_all(tr_tensor_t* ts, int n);

/* The tensor-parallel seam (tr_model_tp_t): a no-op without a hook. */
int tr__tp(tr_model_t* m, tr_tp_point_t pt, tr_tp_op_t op, tr_tensor_t* t);
/* 1 under sequence parallel (a hook, its flag, more than one rank). */
int tr__tp_sp(const tr_model_t* m);
/* The rows of the sequence a rank's residual stream holds: T / tp under
 * sequence parallel, else T. */
int tr__tp_rows(const tr_model_t* m, int T);
/* A partial sum at point pt: TR_TP_SUM, under SP TR_TP_SCATTER (t becomes
 * this rank's rows of the sequence). */
int tr__tp_reduce(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t);
/* Under SP only: t, this rank's rows of the sequence, becomes the whole
 * sequence (TR_TP_GATHER at pt). */
int tr__tp_gather(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t);
/* The gradient of a row-parallel (or vocabulary-parallel) output for its
 * backward: a view of d, under SP d gathered over the sequence
 * (TR_TP_BWD_OUT), in *out. */
int tr__tp_out_grad(tr_model_t* m, const tr_tensor_t* d, tr_tensor_t* out);
/* The gradients of a norm of the residual stream (n = 1 or 2 tensors of
 * [C]: weight, bias): part[i] is what the norm's backward accumulates
 * into — the grads themselves, or under SP zeroed temporaries (partial
 * sums over this rank's rows) that _end sums over tp (TR_TP_GRAD, one
 * call) and adds to the grads. _end releases; rc is the backward's so
 * far (nothing is reduced after an error), its result returned. _begin
 * releases what it made when it fails. */
typedef struct {
  int n;
  tr_tensor_t* dst[2];
  tr_tensor_t buf, part[2];
} tr__tp_grads_t;
int tr__tp_grads_begin(tr_model_t* m, tr__tp_grads_t* g, int n, tr_tensor_t* g0,
                       tr_tensor_t* g1);
int tr__tp_grads_end(tr_model_t* m, tr__tp_grads_t* g, int rc);
/* Under SP only: t [B, T, W], the same on every tp rank, becomes this
 * rank's rows of the sequence [B, T/tp, W] (a copy, no communication). */
int tr__tp_keep_rows(tr_model_t* m, tr_tensor_t* t);
/* The token embedding under a tp hook (the families' embed_fwd and
 * embed_bwd). out [B, T, C]: a vocabulary-split wte (fewer rows than the
 * vocabulary: rows [rank Vl, (rank+1) Vl)) looks up the tokens it holds,
 * the sum over tp (TR_TP_EMBED_OUT; under SP a reduce-scatter) completes
 * it, and the positions (wpe, or NULL) of this rank's rows are added once:
 * rows 0..T-1, or those pos [B, T] names (document positions, a cp rank's
 * chunks; NULL: 0..T-1); a whole wte runs the one-rank lookup and under SP
 * keeps its rows. T % tp under SP: TR_ECONFIG. The backward takes the
 * whole sequence's dout and adds to the rows of wte it holds (and to the
 * positions' rows of dwpe). */
int tr__tp_embed(tr_model_t* m, tr_tensor_t* out, const tr_tensor_t* tokens,
                 const tr_tensor_t* pos, const tr_tensor_t* wte,
                 const tr_tensor_t* wpe);
int tr__tp_embed_bwd(tr_model_t* m, tr_tensor_t* dwte, tr_tensor_t* dwpe,
                     const tr_tensor_t* dout, const tr_tensor_t* tokens,
                     const tr_tensor_t* pos);
/* A row-parallel linear layer's forward, out ({0} on entry, allocated
 * here) = inp w^T (+ bias), with the TR_TP_FWD_OUT reduction on its output
 * (under SP out becomes this rank's rows of the sequence; under async TP
 * the GEMM is cut into the reduce-scatter's chunks,
 * tr__tp_linears_reduce). Without a tp hook the bias goes into the GEMM
 * (the bits of tr_kern_linear_fwd); with one it is added after the
 * reduction, so once and not once per rank. */
int tr__row_linear_fwd(tr_model_t* m, tr_tensor_t* out, const tr_tensor_t* inp,
                       const tr_tensor_t* w, const tr_tensor_t* bias);

/* A linear layer's GEMM on [B, T, *] tensors for the helpers below, which
 * run it whole or, under async tensor parallel (tr_model_tp_t.overlap),
 * one sequence chunk at a time: one kernel call on the chunk's rows of all
 * B sequences ([B, T/tp, *] batch-strided views). */
typedef enum {
  TR__LIN_FWD = 0,       /* out = x w^T + bias (tr_kern_linear_fwd) */
  TR__LIN_FWD_GELU = 1,  /* pre = x w^T + bias, out = gelu(pre)
                           (tr_kern_linear_gelu_fwd) */
  TR__LIN_DINP = 2,      /* out = x w, x the output gradient and inp the
                           forward input; dw, dbias += (tr_kern_linear_bwd,
                           _write for the first writer of out) */
  TR__LIN_DINP_DGELU = 3 /* out = (x w) * gelu'(pre), inp = gelu(pre)
                            (tr_kern_linear_dgelu_bwd) */
} tr__lin_kind_t;
typedef struct {
  tr__lin_kind_t kind;
  tr_tensor_t* out;       /* NULL for tr__tp_linears_reduce (its output) */
  tr_tensor_t* pre;       /* FWD_GELU, DINP_DGELU */
  const tr_tensor_t* x;   /* NULL for tr__tp_gather_linears (the gathered) */
  const tr_tensor_t* inp; /* DINP, DINP_DGELU */
  const tr_tensor_t *w, *bias; /* FWD, FWD_GELU: bias may be NULL */
  tr_tensor_t *dw, *dbias;     /* DINP, DINP_DGELU: may be NULL */
} tr__lin_t;
/* The column side: t (under SP this rank's rows of the sequence) is
 * gathered at pt (TR_TP_FWD_IN, TR_TP_BWD_OUT: tr__tp_gather) and is the x
 * of the n lins, which run on it (their outputs allocated by the caller).
 * Under async TP the gather and the GEMMs overlap chunk by chunk (the
 * weight and bias gradients of DINP lins then run whole after). t is the
 * gathered tensor after. */
int tr__tp_gather_linears(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t,
                          const tr__lin_t* lins, int n);
/* tr__tp_gather_linears on a view of d (a row-parallel output's gradient,
 * the residual stream's): the gathered gradient in *out, as
 * tr__tp_out_grad. */
int tr__tp_out_grad_linears(tr_model_t* m, const tr_tensor_t* d,
                            tr_tensor_t* out, const tr__lin_t* lins, int n);
/* The row side: out ({0} on entry) = the sum of the n lins' outputs (the
 * first writes, the others add) of width columns and the rows of their x,
 * reduced at pt (TR_TP_FWD_OUT, TR_TP_BWD_IN: tr__tp_reduce; under SP out
 * is this rank's rows). Under async TP the GEMMs run chunk by chunk into
 * the reduce-scatter's ring (the weight and bias gradients of DINP lins
 * whole after). */
int tr__tp_linears_reduce(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* out,
                          int64_t width, const tr__lin_t* lins, int n);

/* ---- the family table ---- */

/* What a family owns. Layer records (void* saved) are the family's own:
 * layer_fwd makes one (NULL under no_grad), and exactly one of layer_bwd
 * (combined), layer_bwd_weight (after layer_bwd_input) or layer_free
 * consumes it. */
struct tr_model_family {
  tr_model_family_t id;
  const char* name;                /* "gpt2", "llama3" */
  const char* const* flavor_names; /* NULL-terminated */
  /* what selective op checkpointing recomputes besides the norms ("GELU") */
  const char* ac_op_name;
  int fixed_context; /* 1: max_seq_len sizes a learned position table */

  /* ---- configs ---- */
  /* Fill *out with a flavor (name or alias); TR_ENOTFOUND. */
  int (*flavor)(const char* flavor, tr_model_config_t* out);
  /* The family's own rules beyond config.c's common ones: a message in
   * buf (cap > 0) and 1 when broken, else 0. */
  int (*check)(const tr_model_config_t* c, char* buf, size_t cap);
  /* Parameters (tied once), and those of lookup tables other than the
   * token table (GPT-2's positions), which FLOPs leave out. */
  int64_t (*num_params)(const tr_model_config_t* c);
  int64_t (*lookup_params)(const tr_model_config_t* c);
  /* Elements a layer's forward holds for its backward over `tokens`
   * tokens at tensor-parallel degree tp (sequence parallel above 1): its
   * saved record without checkpointing and its output, in the compute
   * dtype (returned) and in float32 (*f32): tr_model_activation_bytes. */
  int64_t (*layer_act_elems)(const tr_model_config_t* c, int64_t tokens,
                             int tp, int64_t* f32);
  /* Hugging Face config.json fields (tr_model_hf_config). */
  int (*hf_config)(const tr_model_config_t* c, tr_hf_field_t* out, int cap);

  /* ---- the parameter table: every parameter with its name, shape, init
   * rule, HF layout and tp style, in blocks 0 .. n_layers + 1 ---- */
  int (*build)(tr__table_t* t);

  /* ---- embedding block ---- */
  /* out [B,T,C] allocated; under TP (tr__tp_embed) it may become this
   * rank's rows of the sequence. pos: each token's position
   * (document_positions), or NULL for 0..T-1; families without a position
   * table ignore it */
  int (*embed_fwd)(tr_model_t* m, tr_tensor_t* out, const tr_tensor_t* tokens,
                   const tr_tensor_t* pos);
  /* the table gradients from the block's output gradient, the whole
   * sequence's (weights only: tokens have no gradient) */
  int (*embed_bwd)(tr_model_t* m, const tr_tensor_t* dout,
                   const tr_tensor_t* tokens, const tr_tensor_t* pos);

  /* ---- head block: the final norm (the output projection and the loss
   * are model.c's) ---- */
  int head_out_slot; /* slot of the output projection in the head block */
  /* out = norm(x); rstd [N] allocated by the caller, mean by the family
   * when its norm has one */
  int (*norm_fwd)(tr_model_t* m, int blk, tr_tensor_t* out, tr_tensor_t* mean,
                  tr_tensor_t* rstd, const tr_tensor_t* x);
  /* dx += norm'(dout); the norm's parameter gradients accumulate into dw
   * and db (the head's slots 0 and 1 or temporaries, tr__tp_grads_t; db
   * unused by a norm without bias) */
  int (*norm_bwd)(tr_model_t* m, int blk, tr_tensor_t* dx, tr_tensor_t* dw,
                  tr_tensor_t* db, const tr_tensor_t* dout,
                  const tr_tensor_t* x, const tr_tensor_t* mean,
                  const tr_tensor_t* rstd);
  int head_norm_params; /* the final norm's parameters: slots 0 .. n-1 */

  /* ---- transformer layers: mb->hidden in, mb->hidden out; backward
   * mb->dhidden (output gradient) in, the input gradient out ---- */
  int (*layer_fwd)(tr_model_t* m, tr_model_mb_t* mb, int blk, void** saved);
  int (*layer_bwd)(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved);
  /* I: the input gradient and the norms' gradients; on success the record
   * now holds what the W pass needs (the linear layers' inputs and output
   * gradients); never consumes it */
  int (*layer_bwd_input)(tr_model_t* m, tr_model_mb_t* mb, int blk,
                         void* saved);
  /* W: the linear layers' weight and bias gradients; consumes the record */
  int (*layer_bwd_weight)(tr_model_t* m, int blk, void* saved);
  void (*layer_free)(void* saved);
  /* Selective "op" checkpointing (model/recompute.c): slim releases what
   * the backward can recompute cheaply from the record (the norm outputs
   * and the GELU / SwiGLU product), refill recomputes it with the
   * forward's kernels (bit-identical) before the backward. */
  void (*layer_slim)(void* saved);
  int (*layer_refill)(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved);
};
typedef struct tr_model_family tr__family_t;

extern const tr__family_t tr__gpt2_family;
extern const tr__family_t tr__llama3_family;

/* The table of a family id, or NULL (model/config.c). */
const tr__family_t* tr__family_of(tr_model_family_t id);

/* Every layer pass goes through these (model/recompute.c): they apply the
 * model's checkpointing policy around the family's layer functions. The
 * record they save is their own; free it with tr__ac_layer_free. _bwd
 * consumes the record; _bwd_input turns it into the family's record that
 * the W pass (m->family->layer_bwd_weight) consumes, in *wrec. */
int tr__ac_layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** saved);
int tr__ac_layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved);
int tr__ac_layer_bwd_input(tr_model_t* m, tr_model_mb_t* mb, int blk,
                           void* saved, void** wrec);
void tr__ac_layer_free(tr_model_t* m, void* saved);

#endif /* TRAINRUN_MODEL_INTERNAL_H */
