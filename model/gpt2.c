/* model/gpt2.c: the GPT-2 family — its flavors and config rules, its
 * parameter table (Hugging Face names, Conv1D layouts, init rules, tp
 * styles), its Hugging Face config.json, the embedding (token + position
 * tables), the final LayerNorm, and the transformer layer (pre-LayerNorm,
 * fused q|k|v projection, causal attention, GELU-tanh MLP, biases) forward
 * and backward, combined or split into input (I) and weight (W) gradients.
 *
 * The layer's input stays referenced by its record; every other activation
 * its backward needs is allocated here and freed by the backward. Head
 * counts and widths come from the local weight shapes (c_attn holds 3 x
 * H_local x head_dim rows, c_fc F_local), so tensor-parallel shards run the
 * same code; the row-parallel outputs (attn.c_proj, mlp.c_proj) and the
 * column-parallel input gradients (c_attn, c_fc) pass the tp seam. */
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
enum { HEAD_NORM_W = 0, HEAD_NORM_B = 1, HEAD_OUT = 2 };

/* ---- flavors and config ---- */

typedef struct {
  const char* flavor;
  const char* alias;
  int dim, n_layers, n_heads, vocab, max_seq_len;
} flavor_t;

static const flavor_t flavors[] = {
    {"debugmodel", NULL, 128, 4, 4, 256, 256},
    {"124M", "d12", 768, 12, 12, 50257, 1024},
    {"350M", "d24", 1024, 24, 16, 50257, 1024},
    {"774M", "d36", 1280, 36, 20, 50257, 1024},
    {"1558M", "d48", 1600, 48, 25, 50257, 1024},
};

static const char* const flavor_names[] = {"debugmodel", "124M",  "350M",
                                           "774M",       "1558M", NULL};

static int flavor(const char* name, tr_model_config_t* out) {
  const flavor_t* f = NULL;
  for (size_t i = 0; i < sizeof flavors / sizeof flavors[0]; i++)
    if (strcmp(flavors[i].flavor, name) == 0 ||
        (flavors[i].alias && strcmp(flavors[i].alias, name) == 0))
      f = &flavors[i];
  if (!f) return TR_ENOTFOUND;
  memset(out, 0, sizeof *out);
  out->family = TR_MODEL_GPT2;
  snprintf(out->flavor, sizeof out->flavor, "%s", f->flavor);
  out->vocab_size = f->vocab;
  out->max_seq_len = f->max_seq_len;
  out->dim = f->dim;
  out->n_layers = f->n_layers;
  out->n_heads = f->n_heads;
  out->n_kv_heads = f->n_heads;
  out->head_dim = f->dim / f->n_heads;
  out->norm_eps = 1e-5f;
  out->tie_embeddings = 1;
  out->ffn_dim = 4 * f->dim;
  out->bias = 1;
  /* <|endoftext|> of the GPT-2 BPE; the byte tokenizer's EOT for the
   * 256-token debug model */
  out->eos_id = f->vocab == 256 ? 0 : 50256;
  return 0;
}

static int check(const tr_model_config_t* c, char* buf, size_t cap) {
  if (c->n_kv_heads == c->n_heads) return 0;
  snprintf(buf, cap, "gpt2 needs n_kv_heads == n_heads");
  return 1;
}

static int64_t num_params(const tr_model_config_t* c) {
  int64_t C = c->dim, V = c->vocab_size, F = c->ffn_dim, L = c->n_layers;
  int64_t layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C +
                  (F * C + F) + (C * F + C);
  int64_t n = V * C + (int64_t)c->max_seq_len * C + L * layer + 2 * C;
  if (!c->tie_embeddings) n += V * C;
  return n;
}

static int64_t lookup_params(const tr_model_config_t* c) {
  return (int64_t)c->max_seq_len * c->dim; /* the position table */
}

static int hf_config(const tr_model_config_t* c, tr_hf_field_t* out, int cap) {
  const tr_hf_field_t f[] = {
      {"architectures", TR_HF_STRING_LIST, .s = "GPT2LMHeadModel"},
      {"model_type", TR_HF_STRING, .s = "gpt2"},
      {"vocab_size", TR_HF_INT, .i = c->vocab_size},
      {"n_positions", TR_HF_INT, .i = c->max_seq_len},
      {"n_ctx", TR_HF_INT, .i = c->max_seq_len},
      {"n_embd", TR_HF_INT, .i = c->dim},
      {"n_layer", TR_HF_INT, .i = c->n_layers},
      {"n_head", TR_HF_INT, .i = c->n_heads},
      /* null: HF's default 4 * n_embd */
      {"n_inner", c->ffn_dim == 4 * c->dim ? TR_HF_NULL : TR_HF_INT,
       .i = c->ffn_dim},
      {"activation_function", TR_HF_STRING, .s = "gelu_new"},
      {"layer_norm_epsilon", TR_HF_FLOAT, .f = c->norm_eps},
      {"tie_word_embeddings", TR_HF_BOOL, .i = c->tie_embeddings},
      {"resid_pdrop", TR_HF_FLOAT, .f = 0.0f},
      {"embd_pdrop", TR_HF_FLOAT, .f = 0.0f},
      {"attn_pdrop", TR_HF_FLOAT, .f = 0.0f},
      {"initializer_range", TR_HF_FLOAT, .f = 0.02f},
      {"torch_dtype", TR_HF_STRING, .s = "float32"},
  };
  int n = 0;
  TR_CHECK(tr__hf_append(out, cap, &n, f, (int)(sizeof f / sizeof f[0])));
  return n;
}

/* ---- the parameter table ---- */

static tr__pdecl_t decl(tr_init_rule_t init, int hf_t, tr_tp_style_t tp,
                        int parts) {
  tr__pdecl_t d = {init, hf_t, tp, parts};
  return d;
}

#define ADD(...)                           \
  do {                                     \
    int rc__ = tr__table_add(__VA_ARGS__); \
    if (rc__ < 0) return rc__;             \
  } while (0)

static int build(tr__table_t* t) {
  const tr_model_config_t* c = &t->m->cfg;
  int64_t C = c->dim, F = c->ffn_dim, L = c->n_layers;
  float proj_std = 0.02f / sqrtf(2.0f * (float)L);
  tr__pdecl_t norm = decl(TR__ONES, 0, TR_TP_REPLICATE, 1);
  tr__pdecl_t zero_rep = decl(TR__ZEROS, 0, TR_TP_REPLICATE, 1);
  /* c_attn: q, k and v each split by heads (three colwise parts) */
  tr__pdecl_t qkv_w = decl(TR__NORMAL(0.02f), 1, TR_TP_COLWISE, 3);
  tr__pdecl_t qkv_b = decl(TR__ZEROS, 0, TR_TP_COLWISE, 3);
  tr__pdecl_t col_w = decl(TR__NORMAL(0.02f), 1, TR_TP_COLWISE, 1);
  tr__pdecl_t col_b = decl(TR__ZEROS, 0, TR_TP_COLWISE, 1);
  tr__pdecl_t row_w = decl(TR__NORMAL(proj_std), 1, TR_TP_ROWWISE, 1);
  int wte = tr__table_add(t, 0, decl(TR__NORMAL(0.02f), 0, TR_TP_VOCAB, 1), 2,
                          c->vocab_size, C, "transformer.wte.weight");
  if (wte < 0) return wte;
  ADD(t, 0, decl(TR__NORMAL(0.02f), 0, TR_TP_REPLICATE, 1), 2, c->max_seq_len,
      C, "transformer.wpe.weight");
  for (int l = 0; l < L; l++) {
    int blk = l + 1;
    const char* h = "transformer.h";
    ADD(t, blk, norm, 1, C, 0, "%s.%d.ln_1.weight", h, l);
    ADD(t, blk, zero_rep, 1, C, 0, "%s.%d.ln_1.bias", h, l);
    ADD(t, blk, qkv_w, 2, 3 * C, C, "%s.%d.attn.c_attn.weight", h, l);
    ADD(t, blk, qkv_b, 1, 3 * C, 0, "%s.%d.attn.c_attn.bias", h, l);
    ADD(t, blk, row_w, 2, C, C, "%s.%d.attn.c_proj.weight", h, l);
    ADD(t, blk, zero_rep, 1, C, 0, "%s.%d.attn.c_proj.bias", h, l);
    ADD(t, blk, norm, 1, C, 0, "%s.%d.ln_2.weight", h, l);
    ADD(t, blk, zero_rep, 1, C, 0, "%s.%d.ln_2.bias", h, l);
    ADD(t, blk, col_w, 2, F, C, "%s.%d.mlp.c_fc.weight", h, l);
    ADD(t, blk, col_b, 1, F, 0, "%s.%d.mlp.c_fc.bias", h, l);
    ADD(t, blk, row_w, 2, C, F, "%s.%d.mlp.c_proj.weight", h, l);
    ADD(t, blk, zero_rep, 1, C, 0, "%s.%d.mlp.c_proj.bias", h, l);
  }
  int head = (int)L + 1;
  ADD(t, head, norm, 1, C, 0, "transformer.ln_f.weight");
  ADD(t, head, zero_rep, 1, C, 0, "transformer.ln_f.bias");
  tr__table_use(t, head, wte); /* lm_head.weight is tied to wte */
  return 0;
}

/* ---- embedding and final norm ---- */

/* out = wte[tok] + wpe[t], or wpe[pos] with document positions or a cp
 * rank's chunks (the position rows looked up like tokens in a table of
 * max_seq_len rows); under tensor parallelism the tp seam's
 * vocabulary-parallel lookup */
static int embed_fwd(tr_model_t* m, tr_tensor_t* out, const tr_tensor_t* tokens,
                     const tr_tensor_t* pos) {
  if (m->tp.fn)
    return tr__tp_embed(m, out, tokens, pos, W(m, 0, EMB_WTE),
                        W(m, 0, EMB_WPE));
  if (!pos)
    return tr_kern_embedding_fwd(out, tokens, W(m, 0, EMB_WTE),
                                 W(m, 0, EMB_WPE));
  tr_tensor_t pe = {0};
  int rc;
  TR_CHECK_GOTO(tr_kern_embedding_fwd(out, tokens, W(m, 0, EMB_WTE), NULL), rc,
                out);
  TR_CHECK_GOTO(tr__act(m, &pe, (int)out->shape[0], (int)out->shape[1],
                        out->shape[2]),
                rc, out);
  TR_CHECK_GOTO(tr_kern_embedding_fwd(&pe, pos, W(m, 0, EMB_WPE), NULL), rc,
                out);
  rc = tr_kern_add(out, out, &pe);
out:
  tr_tensor_release(&pe);
  return rc;
}

static int embed_bwd(tr_model_t* m, const tr_tensor_t* dout,
                     const tr_tensor_t* tokens, const tr_tensor_t* pos) {
  if (m->tp.fn)
    return tr__tp_embed_bwd(m, G(m, 0, EMB_WTE), G(m, 0, EMB_WPE), dout, tokens,
                            pos);
  if (!pos)
    return tr_kern_embedding_bwd(G(m, 0, EMB_WTE), G(m, 0, EMB_WPE), dout,
                                 tokens);
  TR_CHECK(tr_kern_embedding_bwd(G(m, 0, EMB_WTE), NULL, dout, tokens));
  return tr_kern_embedding_bwd(G(m, 0, EMB_WPE), NULL, dout, pos);
}

static int norm_fwd(tr_model_t* m, int blk, tr_tensor_t* out, tr_tensor_t* mean,
                    tr_tensor_t* rstd, const tr_tensor_t* x) {
  TR_CHECK(tr__vec(m, mean, tr_tensor_numel(rstd)));
  return tr_kern_layernorm_fwd(out, mean, rstd, x, W(m, blk, HEAD_NORM_W),
                               W(m, blk, HEAD_NORM_B), m->cfg.norm_eps);
}

static int norm_bwd(tr_model_t* m, int blk, tr_tensor_t* dx, tr_tensor_t* dw,
                    tr_tensor_t* db, const tr_tensor_t* dout,
                    const tr_tensor_t* x, const tr_tensor_t* mean,
                    const tr_tensor_t* rstd) {
  return tr_kern_layernorm_bwd(dx, dw, db, dout, x, W(m, blk, HEAD_NORM_W),
                               mean, rstd);
}

/* ---- the layer ---- */

typedef struct {
  tr_tensor_t x; /* input [B,T,C] */
  tr_tensor_t ln1, ln1_mean, ln1_rstd;
  tr_tensor_t qkv;       /* [B,T,3Cl], Cl = local heads x head_dim */
  tr_tensor_t atty, lse; /* [B,T,Cl], [B,H,T] */
  tr_tensor_t x2;        /* x + attention branch */
  tr_tensor_t ln2, ln2_mean, ln2_rstd;
  tr_tensor_t fc, gelu; /* [B,T,F] */
  /* kept by the I pass for the W pass: the output gradients of mlp.c_proj,
   * c_fc, attn.c_proj and c_attn (their inputs are gelu, ln2, atty, ln1) */
  tr_tensor_t d_fcp, d_fc, d_proj, d_qkv;
} gpt2_saved_t;

#define NSAVED (sizeof(gpt2_saved_t) / sizeof(tr_tensor_t))

static void layer_free(void* p) {
  gpt2_saved_t* s = p;
  if (!s) return;
  tr__release_all(&s->x, (int)NSAVED);
  free(s);
}

typedef struct {
  int H;      /* local heads */
  int64_t Cl; /* local q (k, v) width: H x head_dim */
  int64_t F;  /* local MLP width */
} dims_t;

static int local_dims(tr_model_t* m, int blk, dims_t* d) {
  int64_t D = m->cfg.head_dim, rows = W(m, blk, G_QKV_W)->shape[0];
  d->H = (int)(rows / (3 * D));
  d->Cl = (int64_t)d->H * D;
  d->F = W(m, blk, G_FC_W)->shape[0];
  if (d->H < 1 || rows != 3 * d->Cl) {
    TR_LOG_ERROR(MODEL, "layer %d: c_attn has %lld rows, not 3 x heads x %lld",
                 blk - 1, (long long)rows, (long long)D);
    return TR_ESHAPE;
  }
  return 0;
}

/* q, k, v as column slices of the fused [B,T,3Cl] buffer */
static int qkv_views(tr_tensor_t* qkv, int64_t Cl, tr_tensor_t* q,
                     tr_tensor_t* k, tr_tensor_t* v) {
  TR_CHECK(tr_tensor_narrow(q, qkv, 2, 0, Cl));
  TR_CHECK(tr_tensor_narrow(k, qkv, 2, Cl, Cl));
  return tr_tensor_narrow(v, qkv, 2, 2 * Cl, Cl);
}

/* gpt2_saved_t over `tokens` tokens: ln1 and ln2 (gathered whole under
 * SP), qkv (3 C / tp), atty (C / tp), x2 and the output (the residual
 * stream's rows), fc and gelu (F / tp each); in float32 lse (H / tp) and
 * the norms' means and rstds (rows). x is the block before's output. */
static int64_t layer_act_elems(const tr_model_config_t* c, int64_t tokens,
                               int tp, int64_t* f32) {
  int64_t C = c->dim, rows = tokens / tp, H = c->n_heads / tp;
  *f32 = tokens * H + 4 * rows;
  return 2 * tokens * C + 2 * rows * C + tokens * 4 * H * c->head_dim +
         tokens * (2 * (int64_t)c->ffn_dim / tp);
}

static int layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** saved) {
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  int Tl = tr__tp_rows(m, T); /* the residual stream's rows */
  int64_t N = (int64_t)B * Tl;
  dims_t d;
  TR_CHECK(local_dims(m, blk, &d));
  gpt2_saved_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  tr_tensor_t q = {0}, k = {0}, v = {0}, proj = {0}, fcp = {0};
  int rc;
  tr_tensor_view(&s->x, &mb->hidden);
  tr_tensor_release(&mb->hidden);
  /* attention branch */
  TR_CHECK_GOTO(tr__act(m, &s->ln1, B, Tl, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln1_mean, N), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln1_rstd, N), rc, fail);
  TR_CHECK_GOTO(tr_kern_layernorm_fwd(&s->ln1, &s->ln1_mean, &s->ln1_rstd,
                                      &s->x, W(m, blk, G_LN1_W),
                                      W(m, blk, G_LN1_B), c->norm_eps),
                rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->qkv, B, T, 3 * d.Cl), rc, fail);
  { /* ln1 gathered under SP, then c_attn */
    tr__lin_t l = {.kind = TR__LIN_FWD,
                   .out = &s->qkv,
                   .w = W(m, blk, G_QKV_W),
                   .bias = W(m, blk, G_QKV_B)};
    TR_CHECK_GOTO(tr__tp_gather_linears(m, TR_TP_FWD_IN, &s->ln1, &l, 1), rc,
                  fail);
  }
  TR_CHECK_GOTO(qkv_views(&s->qkv, d.Cl, &q, &k, &v), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->atty, B, T, d.Cl), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->lse, (int64_t)B * d.H * T), rc, fail);
  TR_CHECK_GOTO(
      tr__attention_fwd(m, mb, &s->atty, &s->lse, &q, &k, &v, d.H, d.H), rc,
      fail);
  TR_CHECK_GOTO(tr__row_linear_fwd(m, &proj, &s->atty, W(m, blk, G_PROJ_W),
                                   W(m, blk, G_PROJ_B)),
                rc, fail);
  /* MLP branch: x2 = proj + x (in place in proj) and ln2(x2) in one pass;
   * the bits of tr_kern_add then tr_kern_layernorm_fwd, which the
   * recomputations (layer_refill, recompute.c) run */
  TR_CHECK_GOTO(tr__act(m, &s->ln2, B, Tl, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln2_mean, N), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln2_rstd, N), rc, fail);
  TR_CHECK_GOTO(tr_kern_residual_layernorm_fwd(
                    &proj, &s->ln2, &s->ln2_mean, &s->ln2_rstd, &proj, &s->x,
                    W(m, blk, G_LN2_W), W(m, blk, G_LN2_B), c->norm_eps),
                rc, fail);
  tr_tensor_view(&s->x2, &proj);
  TR_CHECK_GOTO(tr__act(m, &s->fc, B, T, d.F), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->gelu, B, T, d.F), rc, fail);
  { /* ln2 gathered under SP, then c_fc */
    tr__lin_t l = {.kind = TR__LIN_FWD_GELU,
                   .out = &s->gelu,
                   .pre = &s->fc,
                   .w = W(m, blk, G_FC_W),
                   .bias = W(m, blk, G_FC_B)};
    /* fc keeps the pre-activation, gelu the output; with AC "op" the
     * backward rebuilds gelu from fc with gelu_fwd (layer_refill):
     * compute it the same way here, so the rebuilt bits equal these (the
     * fused epilogue rounds gelu from fp32 on CUDA, not from bf16 fc) */
    if (m->ac_mode == TR_AC_OPS)
      l = (tr__lin_t){
          .kind = TR__LIN_FWD, .out = &s->fc, .w = l.w, .bias = l.bias};
    TR_CHECK_GOTO(tr__tp_gather_linears(m, TR_TP_FWD_IN, &s->ln2, &l, 1), rc,
                  fail);
    if (m->ac_mode == TR_AC_OPS)
      TR_CHECK_GOTO(tr_kern_gelu_fwd(&s->gelu, &s->fc), rc, fail);
  }
  TR_CHECK_GOTO(tr__row_linear_fwd(m, &fcp, &s->gelu, W(m, blk, G_FCP_W),
                                   W(m, blk, G_FCP_B)),
                rc, fail);
  TR_CHECK_GOTO(tr_kern_add(&fcp, &fcp, &s->x2), rc, fail);
  mb->hidden = fcp; /* the layer's output */
  fcp = (tr_tensor_t){0};
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
  tr_tensor_release(&q);
  tr_tensor_release(&k);
  tr_tensor_release(&v);
  tr_tensor_release(&proj);
  tr_tensor_release(&fcp);
  return rc;
}

/* A layer norm's backward, dres += LN'(dout), its weight (slot) and bias
 * (slot + 1) gradients through tr__tp_grads_t (under SP summed over tp). */
static int ln_bwd(tr_model_t* m, int blk, int slot, tr_tensor_t* dres,
                  const tr_tensor_t* dout, const tr_tensor_t* x,
                  const tr_tensor_t* mean, const tr_tensor_t* rstd) {
  tr__tp_grads_t ng;
  TR_CHECK(tr__tp_grads_begin(m, &ng, 2, G(m, blk, slot), G(m, blk, slot + 1)));
  int rc = tr_kern_layernorm_bwd(dres, &ng.part[0], &ng.part[1], dout, x,
                                 W(m, blk, slot), mean, rstd);
  return tr__tp_grads_end(m, &ng, rc);
}

/* The backward. split 0: every gradient, the record freed (the combined
 * pass). split 1: the I pass — the input and norm gradients; the linear
 * layers' weight and bias gradients are left for layer_bwd_weight, whose
 * operands the record keeps (the rest of it is released). */
static int layer_backward(tr_model_t* m, tr_model_mb_t* mb, int blk,
                          gpt2_saved_t* s, int split) {
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  tr_tensor_t* dres = &mb->dhidden; /* d(output), becomes d(input) */
  tr_tensor_t dfc = {0}, dsmall = {0}, datty = {0}, dqkv = {0}, dout = {0};
  tr_tensor_t q = {0}, k = {0}, v = {0}, dq = {0}, dk = {0}, dv = {0};
  /* the weight and bias gradients of the combined pass, NULL in the I pass */
#define GW(slot) (split ? NULL : G(m, blk, (slot)))
  dims_t d;
  int rc;
  TR_CHECK_GOTO(local_dims(m, blk, &d), rc, out);
  /* MLP branch: x3 = x2 + fcproj(gelu(fc(ln2(x2)))) */
  /* the row-parallel outputs' gradients: dres, under SP gathered (so the
   * row-parallel biases' gradients are whole on every rank) */
  /* d(fc) = (dres fcproj_w) * gelu'(fc), written whole by one call */
  TR_CHECK_GOTO(tr__act(m, &dfc, B, T, d.F), rc, out);
  {
    tr__lin_t l = {.kind = TR__LIN_DINP_DGELU,
                   .out = &dfc,
                   .pre = &s->fc,
                   .inp = &s->gelu,
                   .w = W(m, blk, G_FCP_W),
                   .dw = GW(G_FCP_W),
                   .dbias = GW(G_FCP_B)};
    TR_CHECK_GOTO(tr__tp_out_grad_linears(m, dres, &dout, &l, 1), rc, out);
  }
  if (split) TR_CHECK_GOTO(tr__act_copy(m, &s->d_fcp, &dout), rc, out);
  tr_tensor_release(&dout);
  /* d(ln2), d(atty), d(ln1) in turn: each written whole by the first
   * GEMM into it (linear_bwd_write), no zeroing pass; d(ln2) and d(ln1)
   * reduced (under SP this rank's rows) */
  {
    tr__lin_t l = {.kind = TR__LIN_DINP,
                   .x = &dfc,
                   .inp = &s->ln2,
                   .w = W(m, blk, G_FC_W),
                   .dw = GW(G_FC_W),
                   .dbias = GW(G_FC_B)};
    TR_CHECK_GOTO(tr__tp_linears_reduce(m, TR_TP_BWD_IN, &dsmall, C, &l, 1), rc,
                  out);
  }
  if (split) tr_tensor_view(&s->d_fc, &dfc);
  tr_tensor_release(&dfc);
  TR_CHECK_GOTO(ln_bwd(m, blk, G_LN2_W, dres, &dsmall, &s->x2, &s->ln2_mean,
                       &s->ln2_rstd),
                rc, out);
  /* attention branch: x2 = x + proj(attn(qkv(ln1(x)))) */
  tr_tensor_release(&dsmall);
  TR_CHECK_GOTO(tr__act(m, &datty, B, T, d.Cl), rc, out);
  {
    tr__lin_t l = {.kind = TR__LIN_DINP,
                   .out = &datty,
                   .inp = &s->atty,
                   .w = W(m, blk, G_PROJ_W),
                   .dw = GW(G_PROJ_W),
                   .dbias = GW(G_PROJ_B)};
    TR_CHECK_GOTO(tr__tp_out_grad_linears(m, dres, &dout, &l, 1), rc, out);
  }
  if (split) TR_CHECK_GOTO(tr__act_copy(m, &s->d_proj, &dout), rc, out);
  tr_tensor_release(&dout);
  TR_CHECK_GOTO(tr__act(m, &dqkv, B, T, 3 * d.Cl), rc, out); /* set */
  TR_CHECK_GOTO(qkv_views(&s->qkv, d.Cl, &q, &k, &v), rc, out);
  TR_CHECK_GOTO(qkv_views(&dqkv, d.Cl, &dq, &dk, &dv), rc, out);
  TR_CHECK_GOTO(tr__attention_bwd(m, mb, &dq, &dk, &dv, &datty, &q, &k, &v,
                                  &s->atty, &s->lse, d.H, d.H),
                rc, out);
  tr_tensor_release(&datty);
  { /* dsmall is now d(ln1) */
    tr__lin_t l = {.kind = TR__LIN_DINP,
                   .x = &dqkv,
                   .inp = &s->ln1,
                   .w = W(m, blk, G_QKV_W),
                   .dw = GW(G_QKV_W),
                   .dbias = GW(G_QKV_B)};
    TR_CHECK_GOTO(tr__tp_linears_reduce(m, TR_TP_BWD_IN, &dsmall, C, &l, 1), rc,
                  out);
  }
  if (split) tr_tensor_view(&s->d_qkv, &dqkv);
  TR_CHECK_GOTO(
      ln_bwd(m, blk, G_LN1_W, dres, &dsmall, &s->x, &s->ln1_mean, &s->ln1_rstd),
      rc, out);
  rc = 0;
#undef GW
out:;
  tr_tensor_t* ts[] = {&dfc, &dsmall, &datty, &dqkv, &q,   &k,
                       &v,   &dq,     &dk,    &dv,   &dout};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  if (!split) {
    layer_free(s);
  } else if (rc == 0) { /* W needs gelu, ln2, atty, ln1 and the d_ */
    tr_tensor_t* drop[] = {&s->x,  &s->ln1_mean, &s->ln1_rstd, &s->qkv, &s->lse,
                           &s->x2, &s->ln2_mean, &s->ln2_rstd, &s->fc};
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

/* The linear layers' weight and bias gradients from what the I pass kept:
 * the GEMMs of the combined pass on the same operands, hence its bits. */
static int layer_bwd_weight(tr_model_t* m, int blk, void* saved) {
  gpt2_saved_t* s = saved;
  int rc;
  TR_CHECK_GOTO(tr_kern_linear_bwd(NULL, G(m, blk, G_FCP_W), G(m, blk, G_FCP_B),
                                   &s->d_fcp, &s->gelu, W(m, blk, G_FCP_W)),
                rc, out);
  TR_CHECK_GOTO(tr_kern_linear_bwd(NULL, G(m, blk, G_FC_W), G(m, blk, G_FC_B),
                                   &s->d_fc, &s->ln2, W(m, blk, G_FC_W)),
                rc, out);
  TR_CHECK_GOTO(
      tr_kern_linear_bwd(NULL, G(m, blk, G_PROJ_W), G(m, blk, G_PROJ_B),
                         &s->d_proj, &s->atty, W(m, blk, G_PROJ_W)),
      rc, out);
  rc = tr_kern_linear_bwd(NULL, G(m, blk, G_QKV_W), G(m, blk, G_QKV_B),
                          &s->d_qkv, &s->ln1, W(m, blk, G_QKV_W));
out:
  layer_free(s);
  return rc;
}

/* ---- selective "op" checkpointing: drop the cheap activations ---- */

static void layer_slim(void* saved) {
  gpt2_saved_t* s = saved;
  tr_tensor_release(&s->ln1);
  tr_tensor_release(&s->ln2);
  tr_tensor_release(&s->gelu);
}

static int layer_refill(tr_model_t* m, tr_model_mb_t* mb, int blk,
                        void* saved) {
  gpt2_saved_t* s = saved;
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, Tl = tr__tp_rows(m, T), C = c->dim;
  /* the same kernels on the same inputs as the forward: the statistics
   * are rewritten with the values they hold; under SP its gathers */
  if (!s->ln1.storage) {
    TR_CHECK(tr__act(m, &s->ln1, B, Tl, C));
    TR_CHECK(tr_kern_layernorm_fwd(&s->ln1, &s->ln1_mean, &s->ln1_rstd, &s->x,
                                   W(m, blk, G_LN1_W), W(m, blk, G_LN1_B),
                                   c->norm_eps));
    TR_CHECK(tr__tp_gather(m, TR_TP_FWD_IN, &s->ln1));
  }
  if (!s->ln2.storage) {
    TR_CHECK(tr__act(m, &s->ln2, B, Tl, C));
    TR_CHECK(tr_kern_layernorm_fwd(&s->ln2, &s->ln2_mean, &s->ln2_rstd, &s->x2,
                                   W(m, blk, G_LN2_W), W(m, blk, G_LN2_B),
                                   c->norm_eps));
    TR_CHECK(tr__tp_gather(m, TR_TP_FWD_IN, &s->ln2));
  }
  if (!s->gelu.storage) {
    /* in this mode the forward ran gelu_fwd on fc too (not the fused
     * linear_gelu_fwd), so these are its bits */
    TR_CHECK(tr__act(m, &s->gelu, B, T, s->fc.shape[2]));
    TR_CHECK(tr_kern_gelu_fwd(&s->gelu, &s->fc));
  }
  return 0;
}

const tr__family_t tr__gpt2_family = {
    .id = TR_MODEL_GPT2,
    .name = "gpt2",
    .flavor_names = flavor_names,
    .ac_op_name = "GELU",
    .fixed_context = 1,
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
    .head_norm_params = 2,
    .layer_fwd = layer_fwd,
    .layer_bwd = layer_bwd,
    .layer_bwd_input = layer_bwd_input,
    .layer_bwd_weight = layer_bwd_weight,
    .layer_free = layer_free,
    .layer_slim = layer_slim,
    .layer_refill = layer_refill,
};
