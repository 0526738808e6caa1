/* model/internal.h: what the model's files share — parameter slots of each
 * block kind, the saved-activation records, and small tensor helpers. */
#ifndef TRAINRUN_MODEL_INTERNAL_H
#define TRAINRUN_MODEL_INTERNAL_H

#include "trainrun/model.h"

/* Slots in tr_model_block_t.params, per family and block kind. */
enum { EMB_WTE = 0, EMB_WPE = 1 };
enum { HEAD_NORM_W = 0, HEAD_NORM_B = 1, HEAD_OUT_GPT2 = 2 };
enum { HEAD_OUT_LLAMA = 1 };
enum {
  G_LN1_W,
  G_LN1_B,
  G_QKV_W,
  G_QKV_B,
  G_PROJ_W,
  G_PROJ_B,
  G_LN2_W,
  G_LN2_B,
  G_FC_W,
  G_FC_B,
  G_FCP_W,
  G_FCP_B,
  G__COUNT
};
enum {
  L_ATTN_NORM,
  L_WQ,
  L_WK,
  L_WV,
  L_WO,
  L_FFN_NORM,
  L_W1,
  L_W3,
  L_W2,
  L__COUNT
};

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

/* Activations: [B, T, w] in the compute dtype on the model's device,
 * uninitialised or 0. */
int tr__act(tr_model_t* m, tr_tensor_t* t, int B, int T, int64_t w);
int tr__act_zeros(tr_model_t* m, tr_tensor_t* t, int B, int T, int64_t w);
/* [n] fp32 (statistics) */
int tr__vec(tr_model_t* m, tr_tensor_t* t, int64_t n);
/* Make sure the RoPE tables cover T positions. */
int tr__rope_ensure(tr_model_t* m, int T);

/* Family layer passes (model/gpt2.c, model/llama3.c). *saved receives the
 * record the backward needs (NULL under no_grad); the backward consumes and
 * frees it. */
int tr__gpt2_layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** saved);
int tr__gpt2_layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved);
void tr__gpt2_layer_free(void* saved);
int tr__llama_layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk,
                        void** saved);
int tr__llama_layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved);
void tr__llama_layer_free(void* saved);

/* Release a list of tensors. */
void tr__release_all(tr_tensor_t* ts, int n);

/* Selective "op" checkpointing (model/recompute.c): _slim releases what
 * the backward can recompute cheaply from the record (the norm outputs and
 * the GELU / SwiGLU product), _refill recomputes it with the forward's
 * kernels (bit-identical) before the backward. */
void tr__gpt2_layer_slim(void* saved);
int tr__gpt2_layer_refill(tr_model_t* m, tr_model_mb_t* mb, int blk,
                          void* saved);
void tr__llama_layer_slim(void* saved);
int tr__llama_layer_refill(tr_model_t* m, tr_model_mb_t* mb, int blk,
                           void* saved);

/* Every layer pass goes through these (model/recompute.c): they apply the
 * model's checkpointing policy around the family's layer functions. The
 * record they save is their own; free it with tr__ac_layer_free. */
int tr__ac_layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** saved);
int tr__ac_layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved);
void tr__ac_layer_free(tr_model_t* m, void* saved);

#endif /* TRAINRUN_MODEL_INTERNAL_H */
