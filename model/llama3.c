/* model/llama3.c: the Llama-3 family — its flavors (torchtitan's) and
 * config rules, its parameter table (Hugging Face names, torchtitan's init
 * rules, tp styles), its Hugging Face config.json, the embedding, the final
 * RMSNorm, and the transformer layer (pre-RMSNorm, separate q/k/v
 * projections with RoPE, grouped-query causal attention, SwiGLU MLP, no
 * biases) forward and backward, combined or split into input (I) and
 * weight (W) gradients. Head counts and the MLP width come from the local
 * weight shapes, so tensor-parallel shards of the weights run the same
 * code; the TP reductions sit at the seam points of tr_model_tp_t. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* slots in a layer block's parameter list, in table order */
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
enum { HEAD_NORM_W = 0, HEAD_OUT = 1 };

/* ---- flavors and config ---- */

int tr_model_llama_ffn_dim(int dim, float ffn_dim_multiplier, int multiple_of) {
  int hidden = (int)(2 * (4 * (int64_t)dim) / 3);
  if (ffn_dim_multiplier > 0) hidden = (int)(ffn_dim_multiplier * hidden);
  if (multiple_of < 1) multiple_of = 1;
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

typedef struct {
  const char* flavor;
  int dim, n_layers, n_heads, n_kv_heads;
  float ffn_mult;
  int multiple_of;
  float scaling_factor; /* Llama 3.1 (8) or 3.2 (32) scaling */
  int tie;
  int vocab, max_seq_len;
} flavor_t;

static const flavor_t flavors[] = {
    {"debugmodel", 256, 6, 16, 16, 0, 256, 8, 0, 256, 131072},
    {"1B", 2048, 16, 32, 8, 1.5f, 256, 32, 1, 128256, 131072},
    {"3B", 3072, 28, 24, 8, 1.0f, 256, 32, 1, 128256, 131072},
    {"8B", 4096, 32, 32, 8, 1.3f, 1024, 8, 0, 128256, 131072},
    {"70B", 8192, 80, 64, 8, 1.3f, 4096, 8, 0, 128256, 131072},
};

static const char* const flavor_names[] = {"debugmodel", "1B",  "3B",
                                           "8B",         "70B", NULL};

static int flavor(const char* name, tr_model_config_t* out) {
  const flavor_t* f = NULL;
  for (size_t i = 0; i < sizeof flavors / sizeof flavors[0]; i++)
    if (strcmp(flavors[i].flavor, name) == 0) f = &flavors[i];
  if (!f) return TR_ENOTFOUND;
  memset(out, 0, sizeof *out);
  out->family = TR_MODEL_LLAMA3;
  snprintf(out->flavor, sizeof out->flavor, "%s", f->flavor);
  out->vocab_size = f->vocab;
  out->max_seq_len = f->max_seq_len;
  out->dim = f->dim;
  out->n_layers = f->n_layers;
  out->n_heads = f->n_heads;
  out->n_kv_heads = f->n_kv_heads;
  out->head_dim = f->dim / f->n_heads;
  out->norm_eps = 1e-5f;
  out->tie_embeddings = f->tie;
  out->ffn_dim_multiplier = f->ffn_mult;
  out->multiple_of = f->multiple_of;
  out->ffn_dim = tr_model_llama_ffn_dim(f->dim, f->ffn_mult, f->multiple_of);
  out->rope_theta = 500000.0f;
  out->rope_scaling.factor = f->scaling_factor;
  out->rope_scaling.low_freq_factor = 1.0f;
  out->rope_scaling.high_freq_factor = 4.0f;
  out->rope_scaling.original_max_pos = 8192;
  /* <|end_of_text|> of the Llama 3 tokenizer (torchtitan's eos_id); the
   * byte tokenizer's EOT for the 256-token debug model */
  out->eos_id = f->vocab == 256 ? 0 : 128001;
  return 0;
}

static int check(const tr_model_config_t* c, char* buf, size_t cap) {
  if (c->head_dim % 2)
    snprintf(buf, cap, "head_dim %d must be even for RoPE", c->head_dim);
  else if (!(c->rope_theta > 0))
    snprintf(buf, cap, "rope_theta must be positive");
  else
    return 0;
  return 1;
}

static int64_t num_params(const tr_model_config_t* c) {
  int64_t C = c->dim, V = c->vocab_size, F = c->ffn_dim, L = c->n_layers;
  int64_t D = c->head_dim;
  int64_t layer = C + C * c->n_heads * D + 2 * C * c->n_kv_heads * D +
                  c->n_heads * D * C + C + 3 * C * F;
  int64_t n = V * C + L * layer + C;
  if (!c->tie_embeddings) n += V * C;
  return n;
}

static int64_t lookup_params(const tr_model_config_t* c) {
  (void)c; /* no table besides the tokens' */
  return 0;
}

static int hf_config(const tr_model_config_t* c, tr_hf_field_t* out, int cap) {
  const tr_hf_field_t head[] = {
      {"architectures", TR_HF_STRING_LIST, .s = "LlamaForCausalLM"},
      {"model_type", TR_HF_STRING, .s = "llama"},
      {"vocab_size", TR_HF_INT, .i = c->vocab_size},
      {"hidden_size", TR_HF_INT, .i = c->dim},
      {"intermediate_size", TR_HF_INT, .i = c->ffn_dim},
      {"num_hidden_layers", TR_HF_INT, .i = c->n_layers},
      {"num_attention_heads", TR_HF_INT, .i = c->n_heads},
      {"num_key_value_heads", TR_HF_INT, .i = c->n_kv_heads},
      {"head_dim", TR_HF_INT, .i = c->head_dim},
      {"max_position_embeddings", TR_HF_INT, .i = c->max_seq_len},
      {"rms_norm_eps", TR_HF_FLOAT, .f = c->norm_eps},
      {"rope_theta", TR_HF_FLOAT, .f = c->rope_theta},
  };
  const tr_hf_field_t scaling[] = {
      {"rope_scaling", TR_HF_OBJECT, .s = NULL},
      {"rope_type", TR_HF_STRING, .s = "llama3"},
      {"factor", TR_HF_FLOAT, .f = c->rope_scaling.factor},
      {"low_freq_factor", TR_HF_FLOAT, .f = c->rope_scaling.low_freq_factor},
      {"high_freq_factor", TR_HF_FLOAT, .f = c->rope_scaling.high_freq_factor},
      {"original_max_position_embeddings", TR_HF_INT,
       .i = c->rope_scaling.original_max_pos},
      {NULL, TR_HF_END, .s = NULL},
  };
  const tr_hf_field_t no_scaling[] = {{"rope_scaling", TR_HF_NULL, .s = NULL}};
  const tr_hf_field_t tail[] = {
      {"tie_word_embeddings", TR_HF_BOOL, .i = c->tie_embeddings},
      {"hidden_act", TR_HF_STRING, .s = "silu"},
      {"attention_bias", TR_HF_BOOL, .i = 0},
      {"mlp_bias", TR_HF_BOOL, .i = 0},
      {"initializer_range", TR_HF_FLOAT, .f = 0.02f},
      {"torch_dtype", TR_HF_STRING, .s = "float32"},
  };
#define N(a) (int)(sizeof(a) / sizeof(a)[0])
  int n = 0;
  TR_CHECK(tr__hf_append(out, cap, &n, head, N(head)));
  if (c->rope_scaling.factor > 0)
    TR_CHECK(tr__hf_append(out, cap, &n, scaling, N(scaling)));
  else
    TR_CHECK(tr__hf_append(out, cap, &n, no_scaling, N(no_scaling)));
  TR_CHECK(tr__hf_append(out, cap, &n, tail, N(tail)));
#undef N
  return n;
}

/* ---- the parameter table ---- */

static tr__pdecl_t decl(tr_init_rule_t init, tr_tp_style_t tp) {
  tr__pdecl_t d = {init, 0, tp, 1};
  return d;
}

#define ADD(...)                           \
  do {                                     \
    int rc__ = tr__table_add(__VA_ARGS__); \
    if (rc__ < 0) return rc__;             \
  } while (0)

static int build(tr__table_t* t) {
  const tr_model_config_t* c = &t->m->cfg;
  int64_t C = c->dim, F = c->ffn_dim, D = c->head_dim;
  int64_t HD = (int64_t)c->n_heads * D, KVD = (int64_t)c->n_kv_heads * D;
  float out_std = 1.0f / sqrtf((float)C);
  tr_init_rule_t out_rule =
      tr__rule(TR_INIT_TRUNC_NORMAL, out_std, -3 * out_std, 3 * out_std);
  tr__pdecl_t norm = decl(TR__ONES, TR_TP_REPLICATE);
  int wte = tr__table_add(
      t, 0, decl(c->tie_embeddings ? out_rule : TR__NORMAL(1.0f), TR_TP_VOCAB),
      2, c->vocab_size, C, "model.embed_tokens.weight");
  if (wte < 0) return wte;
  for (int l = 0; l < c->n_layers; l++) {
    int blk = l + 1;
    const char* p = "model.layers";
    /* torchtitan's depth init: 0.02 / sqrt(2 (layer + 1)) */
    float std = 0.02f / sqrtf(2.0f * (float)(l + 1));
    tr__pdecl_t col = decl(TR__TRUNC(0.02f), TR_TP_COLWISE);
    ADD(t, blk, norm, 1, C, 0, "%s.%d.input_layernorm.weight", p, l);
    ADD(t, blk, col, 2, HD, C, "%s.%d.self_attn.q_proj.weight", p, l);
    ADD(t, blk, col, 2, KVD, C, "%s.%d.self_attn.k_proj.weight", p, l);
    ADD(t, blk, col, 2, KVD, C, "%s.%d.self_attn.v_proj.weight", p, l);
    ADD(t, blk, decl(TR__TRUNC(std), TR_TP_ROWWISE), 2, C, HD,
        "%s.%d.self_attn.o_proj.weight", p, l);
    ADD(t, blk, norm, 1, C, 0, "%s.%d.post_attention_layernorm.weight", p, l);
    ADD(t, blk, col, 2, F, C, "%s.%d.mlp.gate_proj.weight", p, l);
    ADD(t, blk, decl(TR__TRUNC(std), TR_TP_COLWISE), 2, F, C,
        "%s.%d.mlp.up_proj.weight", p, l);
    ADD(t, blk, decl(TR__TRUNC(std), TR_TP_ROWWISE), 2, C, F,
        "%s.%d.mlp.down_proj.weight", p, l);
  }
  int head = c->n_layers + 1;
  ADD(t, head, norm, 1, C, 0, "model.norm.weight");
  if (c->tie_embeddings)
    tr__table_use(t, head, wte);
  else
    ADD(t, head, decl(out_rule, TR_TP_OUTPUT), 2, c->vocab_size, C,
        "lm_head.weight");
  return 0;
}

/* ---- embedding and final norm ---- */

static int embed_fwd(tr_model_t* m, tr_tensor_t* out,
                     const tr_tensor_t* tokens, const tr_tensor_t* pos) {
  (void)pos; /* positions are RoPE's (tr__mask_rope) */
  if (m->tp.fn)
    return tr__tp_embed(m, out, tokens, NULL, W(m, 0, EMB_WTE), NULL);
  return tr_kern_embedding_fwd(out, tokens, W(m, 0, EMB_WTE), NULL);
}

static int embed_bwd(tr_model_t* m, const tr_tensor_t* dout,
                     const tr_tensor_t* tokens, const tr_tensor_t* pos) {
  (void)pos;
  if (m->tp.fn)
    return tr__tp_embed_bwd(m, G(m, 0, EMB_WTE), NULL, dout, tokens, NULL);
  return tr_kern_embedding_bwd(G(m, 0, EMB_WTE), NULL, dout, tokens);
}

static int norm_fwd(tr_model_t* m, int blk, tr_tensor_t* out, tr_tensor_t* mean,
                    tr_tensor_t* rstd, const tr_tensor_t* x) {
  (void)mean; /* RMSNorm has none */
  return tr_kern_rmsnorm_fwd(out, rstd, x, W(m, blk, HEAD_NORM_W),
                             m->cfg.norm_eps);
}

static int norm_bwd(tr_model_t* m, int blk, tr_tensor_t* dx, tr_tensor_t* dw,
                    tr_tensor_t* db, const tr_tensor_t* dout,
                    const tr_tensor_t* x, const tr_tensor_t* mean,
                    const tr_tensor_t* rstd) {
  (void)mean; /* RMSNorm has neither */
  (void)db;
  return tr_kern_rmsnorm_bwd(dx, dw, dout, x, W(m, blk, HEAD_NORM_W), rstd);
}

/* ---- the layer ---- */

typedef struct {
  tr_tensor_t x;        /* input [B,T,C] */
  tr_tensor_t h, rstd1; /* attention_norm(x) */
  tr_tensor_t q, k, v;  /* after RoPE: [B,T,H*D], [B,T,KVH*D] x2 */
  tr_tensor_t atty, lse;
  tr_tensor_t x2;        /* x + attention branch */
  tr_tensor_t h2, rstd2; /* ffn_norm(x2) */
  tr_tensor_t g, u, sw;  /* gate, up, silu(gate)*up: [B,T,F] */
  /* kept by the I pass for the W pass: the output gradients of w2, w1,
   * w3, wo, wq, wk, wv (their inputs are sw, h2, h2, atty, h, h, h) */
  tr_tensor_t d_w2, d_g, d_u, d_wo, d_q, d_k, d_v;
} llama_saved_t;

#define NSAVED (sizeof(llama_saved_t) / sizeof(tr_tensor_t))

static void layer_free(void* p) {
  llama_saved_t* s = p;
  if (!s) return;
  tr__release_all(&s->x, (int)NSAVED);
  free(s);
}

typedef struct {
  int H, KVH, D;
  int64_t F;
} dims_t;

static int local_dims(tr_model_t* m, int blk, dims_t* d) {
  d->D = m->cfg.head_dim;
  d->H = (int)(W(m, blk, L_WQ)->shape[0] / d->D);
  d->KVH = (int)(W(m, blk, L_WK)->shape[0] / d->D);
  d->F = W(m, blk, L_W1)->shape[0];
  if (d->H < 1 || d->KVH < 1 || d->H % d->KVH) {
    TR_LOG_ERROR(MODEL, "layer %d: %d local heads, %d local kv heads", blk - 1,
                 d->H, d->KVH);
    return TR_ESHAPE;
  }
  return 0;
}

/* llama_saved_t over `tokens` tokens: h and h2 (gathered whole under
 * SP), x2 and the output (the residual stream's rows), q and atty (H / tp
 * heads), k and v (KVH / tp), gate, up and their product (F / tp each); in
 * float32 lse (H / tp) and two rstds (rows). x is the block before's
 * output. */
static int64_t layer_act_elems(const tr_model_config_t* c, int64_t tokens,
                               int tp, int64_t* f32) {
  int64_t C = c->dim, D = c->head_dim, rows = tokens / tp;
  int64_t H = c->n_heads / tp, KVH = c->n_kv_heads / tp;
  *f32 = tokens * H + 2 * rows;
  return 2 * tokens * C + 2 * rows * C +
         tokens * (2 * H * D + 2 * KVH * D + 3 * (int64_t)c->ffn_dim / tp);
}

static int layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** saved) {
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  int Tl = tr__tp_rows(m, T); /* the residual stream's rows */
  int64_t N = (int64_t)B * Tl;
  dims_t d;
  TR_CHECK(local_dims(m, blk, &d));
  TR_CHECK(tr__rope_ensure(m, T));
  llama_saved_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  tr_tensor_t o = {0}, dn = {0};
  int rc;
  tr_tensor_view(&s->x, &mb->hidden);
  tr_tensor_release(&mb->hidden);
  /* attention branch */
  TR_CHECK_GOTO(tr__act(m, &s->h, B, Tl, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->rstd1, N), rc, fail);
  TR_CHECK_GOTO(tr_kern_rmsnorm_fwd(&s->h, &s->rstd1, &s->x,
                                    W(m, blk, L_ATTN_NORM), c->norm_eps),
                rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->q, B, T, (int64_t)d.H * d.D), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->k, B, T, (int64_t)d.KVH * d.D), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->v, B, T, (int64_t)d.KVH * d.D), rc, fail);
  { /* h gathered under SP, then q, k, v */
    tr__lin_t qkv[3] = {
        {.kind = TR__LIN_FWD, .out = &s->q, .w = W(m, blk, L_WQ)},
        {.kind = TR__LIN_FWD, .out = &s->k, .w = W(m, blk, L_WK)},
        {.kind = TR__LIN_FWD, .out = &s->v, .w = W(m, blk, L_WV)}};
    TR_CHECK_GOTO(tr__tp_gather_linears(m, TR_TP_FWD_IN, &s->h, qkv, 3), rc,
                  fail);
  }
  TR_CHECK_GOTO(tr__mask_rope(m, mb, &s->q, d.H, 0), rc, fail);
  TR_CHECK_GOTO(tr__mask_rope(m, mb, &s->k, d.KVH, 0), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->atty, B, T, (int64_t)d.H * d.D), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->lse, (int64_t)B * d.H * T), rc, fail);
  TR_CHECK_GOTO(tr__attention_fwd(m, mb, &s->atty, &s->lse, &s->q, &s->k, &s->v,
                                  d.H, d.KVH),
                rc, fail);
  TR_CHECK_GOTO(tr__row_linear_fwd(m, &o, &s->atty, W(m, blk, L_WO), NULL), rc,
                fail);
  /* MLP branch: x2 = o + x (in place in o) and ffn_norm(x2) in one pass;
   * the bits of tr_kern_add then tr_kern_rmsnorm_fwd, which the
   * recomputations (layer_refill, recompute.c) run */
  TR_CHECK_GOTO(tr__act(m, &s->h2, B, Tl, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->rstd2, N), rc, fail);
  TR_CHECK_GOTO(
      tr_kern_residual_rmsnorm_fwd(&o, &s->h2, &s->rstd2, &o, &s->x,
                                   W(m, blk, L_FFN_NORM), c->norm_eps),
      rc, fail);
  tr_tensor_view(&s->x2, &o);
  TR_CHECK_GOTO(tr__act(m, &s->g, B, T, d.F), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->u, B, T, d.F), rc, fail);
  { /* h2 gathered under SP, then gate and up */
    tr__lin_t gu[2] = {
        {.kind = TR__LIN_FWD, .out = &s->g, .w = W(m, blk, L_W1)},
        {.kind = TR__LIN_FWD, .out = &s->u, .w = W(m, blk, L_W3)}};
    TR_CHECK_GOTO(tr__tp_gather_linears(m, TR_TP_FWD_IN, &s->h2, gu, 2), rc,
                  fail);
  }
  TR_CHECK_GOTO(tr__act(m, &s->sw, B, T, d.F), rc, fail);
  TR_CHECK_GOTO(tr_kern_swiglu_fwd(&s->sw, &s->g, &s->u), rc, fail);
  TR_CHECK_GOTO(tr__row_linear_fwd(m, &dn, &s->sw, W(m, blk, L_W2), NULL), rc,
                fail);
  TR_CHECK_GOTO(tr_kern_add(&dn, &dn, &s->x2), rc, fail);
  mb->hidden = dn;
  dn = (tr_tensor_t){0};
  rc = 0;
  if (mb->no_grad) {
    layer_free(s);
    s = NULL;
  }
  *saved = s;
  goto out;
fail:
  layer_free(s);
out:
  tr_tensor_release(&o);
  tr_tensor_release(&dn);
  return rc;
}

/* An RMSNorm's backward, dres += norm'(dout), its weight (slot) gradient
 * through tr__tp_grads_t (under SP summed over tp). */
static int rms_bwd(tr_model_t* m, int blk, int slot, tr_tensor_t* dres,
                   const tr_tensor_t* dout, const tr_tensor_t* x,
                   const tr_tensor_t* rstd) {
  tr__tp_grads_t ng;
  TR_CHECK(tr__tp_grads_begin(m, &ng, 1, G(m, blk, slot), NULL));
  int rc =
      tr_kern_rmsnorm_bwd(dres, &ng.part[0], dout, x, W(m, blk, slot), rstd);
  return tr__tp_grads_end(m, &ng, rc);
}

/* The backward. split 0: every gradient, the record freed (the combined
 * pass). split 1: the I pass — the input and norm gradients; the weight
 * gradients are left for layer_bwd_weight, whose operands the record keeps
 * (the rest of it is released). */
static int layer_backward(tr_model_t* m, tr_model_mb_t* mb, int blk,
                          llama_saved_t* s, int split) {
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  tr_tensor_t* dres = &mb->dhidden; /* [B, Tl, C] */
  tr_tensor_t dsw = {0}, dg = {0}, du = {0}, dh = {0}, datty = {0};
  tr_tensor_t dq = {0}, dk = {0}, dv = {0}, dout = {0};
  /* the weight gradients of the combined pass, NULL in the I pass */
#define GW(slot) (split ? NULL : G(m, blk, (slot)))
  dims_t d;
  int rc;
  TR_CHECK_GOTO(local_dims(m, blk, &d), rc, out);
  /* MLP branch: x3 = x2 + w2(silu(w1 h2) * w3 h2), h2 = ffn_norm(x2) */
  /* each input gradient is written whole by its first writer
   * (linear_bwd_write, swiglu_bwd_write): no zeroing pass */
  /* the row-parallel outputs' gradients: dres, under SP gathered */
  TR_CHECK_GOTO(tr__act(m, &dsw, B, T, d.F), rc, out);
  {
    tr__lin_t l = {.kind = TR__LIN_DINP,
                   .out = &dsw,
                   .inp = &s->sw,
                   .w = W(m, blk, L_W2),
                   .dw = GW(L_W2)};
    TR_CHECK_GOTO(tr__tp_out_grad_linears(m, dres, &dout, &l, 1), rc, out);
  }
  if (split) TR_CHECK_GOTO(tr__act_copy(m, &s->d_w2, &dout), rc, out);
  tr_tensor_release(&dout);
  TR_CHECK_GOTO(tr__act(m, &dg, B, T, d.F), rc, out);
  TR_CHECK_GOTO(tr__act(m, &du, B, T, d.F), rc, out);
  TR_CHECK_GOTO(tr_kern_swiglu_bwd_write(&dg, &du, &dsw, &s->g, &s->u), rc,
                out);
  tr_tensor_release(&dsw);
  { /* dh = dg w1 + du w3, reduced (under SP this rank's rows) */
    tr__lin_t l[2] = {{.kind = TR__LIN_DINP,
                       .x = &dg,
                       .inp = &s->h2,
                       .w = W(m, blk, L_W1),
                       .dw = GW(L_W1)},
                      {.kind = TR__LIN_DINP,
                       .x = &du,
                       .inp = &s->h2,
                       .w = W(m, blk, L_W3),
                       .dw = GW(L_W3)}};
    TR_CHECK_GOTO(tr__tp_linears_reduce(m, TR_TP_BWD_IN, &dh, C, l, 2), rc,
                  out);
  }
  if (split) {
    tr_tensor_view(&s->d_g, &dg);
    tr_tensor_view(&s->d_u, &du);
  }
  tr_tensor_release(&dg);
  tr_tensor_release(&du);
  TR_CHECK_GOTO(rms_bwd(m, blk, L_FFN_NORM, dres, &dh, &s->x2, &s->rstd2), rc,
                out);
  /* attention branch: x2 = x + wo(attn(rope(wq h), rope(wk h), wv h)) */
  TR_CHECK_GOTO(tr__act(m, &datty, B, T, (int64_t)d.H * d.D), rc, out);
  {
    tr__lin_t l = {.kind = TR__LIN_DINP,
                   .out = &datty,
                   .inp = &s->atty,
                   .w = W(m, blk, L_WO),
                   .dw = GW(L_WO)};
    TR_CHECK_GOTO(tr__tp_out_grad_linears(m, dres, &dout, &l, 1), rc, out);
  }
  if (split) TR_CHECK_GOTO(tr__act_copy(m, &s->d_wo, &dout), rc, out);
  tr_tensor_release(&dout);
  /* written whole by the attention backward */
  TR_CHECK_GOTO(tr__act(m, &dq, B, T, (int64_t)d.H * d.D), rc, out);
  TR_CHECK_GOTO(tr__act(m, &dk, B, T, (int64_t)d.KVH * d.D), rc, out);
  TR_CHECK_GOTO(tr__act(m, &dv, B, T, (int64_t)d.KVH * d.D), rc, out);
  TR_CHECK_GOTO(tr__attention_bwd(m, mb, &dq, &dk, &dv, &datty, &s->q, &s->k,
                                  &s->v, &s->atty, &s->lse, d.H, d.KVH),
                rc, out);
  tr_tensor_release(&datty);
  TR_CHECK_GOTO(tr__mask_rope(m, mb, &dq, d.H, 1), rc, out);
  TR_CHECK_GOTO(tr__mask_rope(m, mb, &dk, d.KVH, 1), rc, out);
  tr_tensor_release(&dh); /* dh = dq wq + dk wk + dv wv, reduced */
  {
    tr__lin_t l[3] = {{.kind = TR__LIN_DINP,
                       .x = &dq,
                       .inp = &s->h,
                       .w = W(m, blk, L_WQ),
                       .dw = GW(L_WQ)},
                      {.kind = TR__LIN_DINP,
                       .x = &dk,
                       .inp = &s->h,
                       .w = W(m, blk, L_WK),
                       .dw = GW(L_WK)},
                      {.kind = TR__LIN_DINP,
                       .x = &dv,
                       .inp = &s->h,
                       .w = W(m, blk, L_WV),
                       .dw = GW(L_WV)}};
    TR_CHECK_GOTO(tr__tp_linears_reduce(m, TR_TP_BWD_IN, &dh, C, l, 3), rc,
                  out);
  }
  if (split) {
    tr_tensor_view(&s->d_q, &dq);
    tr_tensor_view(&s->d_k, &dk);
    tr_tensor_view(&s->d_v, &dv);
  }
  TR_CHECK_GOTO(rms_bwd(m, blk, L_ATTN_NORM, dres, &dh, &s->x, &s->rstd1), rc,
                out);
  rc = 0;
#undef GW
out:;
  tr_tensor_t* ts[] = {&dsw, &dg, &du, &dh, &datty, &dq, &dk, &dv, &dout};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  if (!split) {
    layer_free(s);
  } else if (rc == 0) { /* W needs sw, h2, atty, h and the d_ */
    tr_tensor_t* drop[] = {&s->x,   &s->rstd1, &s->q,     &s->k, &s->v,
                           &s->lse, &s->x2,    &s->rstd2, &s->g, &s->u};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
      tr_tensor_release(drop[i]);
  }
  return rc;
}

static int layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved) {
  return layer_backward(m, mb, blk, saved, 0);
}

static int layer_bwd_input(tr_model_t* m, tr_model_mb_t* mb, int blk,
                           void* saved) {
  return layer_backward(m, mb, blk, saved, 1);
}

/* The weight gradients from what the I pass kept: the GEMMs of the
 * combined pass on the same operands, hence its bits. */
static int layer_bwd_weight(tr_model_t* m, int blk, void* saved) {
  llama_saved_t* s = saved;
  struct {
    int slot;
    tr_tensor_t *dout, *inp;
  } lin[] = {{L_W2, &s->d_w2, &s->sw}, {L_W1, &s->d_g, &s->h2},
             {L_W3, &s->d_u, &s->h2},  {L_WO, &s->d_wo, &s->atty},
             {L_WQ, &s->d_q, &s->h},   {L_WK, &s->d_k, &s->h},
             {L_WV, &s->d_v, &s->h}};
  int rc = 0;
  for (size_t i = 0; i < sizeof lin / sizeof lin[0] && rc == 0; i++)
    rc = tr_kern_linear_bwd(NULL, G(m, blk, lin[i].slot), NULL, lin[i].dout,
                            lin[i].inp, W(m, blk, lin[i].slot));
  layer_free(s);
  return rc;
}

/* ---- selective "op" checkpointing: drop the cheap activations ---- */

static void layer_slim(void* saved) {
  llama_saved_t* s = saved;
  tr_tensor_release(&s->h);
  tr_tensor_release(&s->h2);
  tr_tensor_release(&s->sw);
}

static int layer_refill(tr_model_t* m, tr_model_mb_t* mb, int blk,
                        void* saved) {
  llama_saved_t* s = saved;
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, Tl = tr__tp_rows(m, T), C = c->dim;
  /* the forward's kernels on the forward's inputs (rstd is rewritten with
   * the values it holds), and under SP its gathers */
  if (!s->h.storage) {
    TR_CHECK(tr__act(m, &s->h, B, Tl, C));
    TR_CHECK(tr_kern_rmsnorm_fwd(&s->h, &s->rstd1, &s->x,
                                 W(m, blk, L_ATTN_NORM), c->norm_eps));
    TR_CHECK(tr__tp_gather(m, TR_TP_FWD_IN, &s->h));
  }
  if (!s->h2.storage) {
    TR_CHECK(tr__act(m, &s->h2, B, Tl, C));
    TR_CHECK(tr_kern_rmsnorm_fwd(&s->h2, &s->rstd2, &s->x2,
                                 W(m, blk, L_FFN_NORM), c->norm_eps));
    TR_CHECK(tr__tp_gather(m, TR_TP_FWD_IN, &s->h2));
  }
  if (!s->sw.storage) {
    TR_CHECK(tr__act(m, &s->sw, B, T, s->g.shape[2]));
    TR_CHECK(tr_kern_swiglu_fwd(&s->sw, &s->g, &s->u));
  }
  return 0;
}

const tr__family_t tr__llama3_family = {
    .id = TR_MODEL_LLAMA3,
    .name = "llama3",
    .flavor_names = flavor_names,
    .ac_op_name = "SwiGLU",
    .fixed_context = 0,
    .flavor = flavor,
    .check = check,
    .num_params = num_params,
    .lookup_params = lookup_params,
    .layer_act_elems = layer_act_elems,
    .hf_config = hf_config,
    .build = build,
    .embed_fwd = embed_fwd,
    .embed_bwd = embed_bwd,
    .head_out_slot = HEAD_OUT,
    .norm_fwd = norm_fwd,
    .norm_bwd = norm_bwd,
    .head_norm_params = 1,
    .layer_fwd = layer_fwd,
    .layer_bwd = layer_bwd,
    .layer_bwd_input = layer_bwd_input,
    .layer_bwd_weight = layer_bwd_weight,
    .layer_free = layer_free,
    .layer_slim = layer_slim,
    .layer_refill = layer_refill,
};
