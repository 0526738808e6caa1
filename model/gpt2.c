/* model/gpt2.c: the GPT-2 transformer layer (pre-LayerNorm, fused qkv
 * projection, causal attention, GELU-tanh MLP, biases), forward and
 * backward. The layer's input stays referenced by its record; every other
 * activation it needs for the backward is allocated here and freed by the
 * backward. */
#include "config.h"

#include <stdlib.h>

#include "model/internal.h"
#include "trainrun/error.h"

typedef struct {
  tr_tensor_t x; /* input [B,T,C] */
  tr_tensor_t ln1, ln1_mean, ln1_rstd;
  tr_tensor_t qkv;       /* [B,T,3C] */
  tr_tensor_t atty, lse; /* [B,T,C], [B,H,T] */
  tr_tensor_t x2;        /* x + attention branch */
  tr_tensor_t ln2, ln2_mean, ln2_rstd;
  tr_tensor_t fc, gelu; /* [B,T,4C] */
} gpt2_saved_t;

#define NSAVED (sizeof(gpt2_saved_t) / sizeof(tr_tensor_t))

void tr__gpt2_layer_free(void* p) {
  gpt2_saved_t* s = p;
  if (!s) return;
  tr__release_all(&s->x, (int)NSAVED);
  free(s);
}

/* q, k, v as column slices of the fused [B,T,3C] buffer */
static int qkv_views(tr_tensor_t* qkv, int C, tr_tensor_t* q, tr_tensor_t* k,
                     tr_tensor_t* v) {
  TR_CHECK(tr_tensor_narrow(q, qkv, 2, 0, C));
  TR_CHECK(tr_tensor_narrow(k, qkv, 2, C, C));
  return tr_tensor_narrow(v, qkv, 2, 2 * C, C);
}

int tr__gpt2_layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk,
                       void** saved) {
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim, H = c->n_heads;
  int64_t N = (int64_t)B * T;
  gpt2_saved_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  tr_tensor_t q = {0}, k = {0}, v = {0}, proj = {0}, fcp = {0};
  int rc;
  tr_tensor_view(&s->x, &mb->hidden);
  tr_tensor_release(&mb->hidden);
  /* attention branch */
  TR_CHECK_GOTO(tr__act(m, &s->ln1, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln1_mean, N), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln1_rstd, N), rc, fail);
  TR_CHECK_GOTO(tr_kern_layernorm_fwd(&s->ln1, &s->ln1_mean, &s->ln1_rstd,
                                      &s->x, W(m, blk, G_LN1_W),
                                      W(m, blk, G_LN1_B), c->norm_eps),
                rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->qkv, B, T, 3 * (int64_t)C), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&s->qkv, &s->ln1, W(m, blk, G_QKV_W),
                                   W(m, blk, G_QKV_B)),
                rc, fail);
  TR_CHECK_GOTO(qkv_views(&s->qkv, C, &q, &k, &v), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->atty, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->lse, (int64_t)B * H * T), rc, fail);
  TR_CHECK_GOTO(tr_kern_attention_fwd(&s->atty, &s->lse, &q, &k, &v, H, H), rc,
                fail);
  TR_CHECK_GOTO(tr__act(m, &proj, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&proj, &s->atty, W(m, blk, G_PROJ_W),
                                   W(m, blk, G_PROJ_B)),
                rc, fail);
  /* MLP branch: x2 = proj + x (in place in proj) and ln2(x2) in one pass;
   * the bits of tr_kern_add then tr_kern_layernorm_fwd, which the
   * recomputations (layer_refill, recompute.c) run */
  TR_CHECK_GOTO(tr__act(m, &s->ln2, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln2_mean, N), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->ln2_rstd, N), rc, fail);
  TR_CHECK_GOTO(tr_kern_residual_layernorm_fwd(
                    &proj, &s->ln2, &s->ln2_mean, &s->ln2_rstd, &proj, &s->x,
                    W(m, blk, G_LN2_W), W(m, blk, G_LN2_B), c->norm_eps),
                rc, fail);
  tr_tensor_view(&s->x2, &proj);
  TR_CHECK_GOTO(tr__act(m, &s->fc, B, T, c->ffn_dim), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->gelu, B, T, c->ffn_dim), rc, fail);
  if (m->ac_mode == TR_AC_OPS) {
    /* the backward rebuilds gelu from fc with gelu_fwd (layer_refill):
     * compute it the same way here, so the rebuilt bits equal these (the
     * fused epilogue rounds gelu from fp32 on CUDA, not from bf16 fc) */
    TR_CHECK_GOTO(tr_kern_linear_fwd(&s->fc, &s->ln2, W(m, blk, G_FC_W),
                                     W(m, blk, G_FC_B)),
                  rc, fail);
    TR_CHECK_GOTO(tr_kern_gelu_fwd(&s->gelu, &s->fc), rc, fail);
  } else {
    /* fc keeps the pre-activation, gelu the output */
    TR_CHECK_GOTO(tr_kern_linear_gelu_fwd(&s->gelu, &s->fc, &s->ln2,
                                          W(m, blk, G_FC_W), W(m, blk, G_FC_B)),
                  rc, fail);
  }
  TR_CHECK_GOTO(tr__act(m, &fcp, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&fcp, &s->gelu, W(m, blk, G_FCP_W),
                                   W(m, blk, G_FCP_B)),
                rc, fail);
  TR_CHECK_GOTO(tr_kern_add(&fcp, &fcp, &s->x2), rc, fail);
  mb->hidden = fcp; /* the layer's output */
  fcp = (tr_tensor_t){0};
  rc = 0;
  if (mb->no_grad) {
    tr__gpt2_layer_free(s);
    s = NULL;
  }
  *saved = s;
  goto out;
fail:
  tr__gpt2_layer_free(s);
out:
  tr_tensor_release(&q);
  tr_tensor_release(&k);
  tr_tensor_release(&v);
  tr_tensor_release(&proj);
  tr_tensor_release(&fcp);
  return rc;
}

int tr__gpt2_layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved) {
  gpt2_saved_t* s = saved;
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim, H = c->n_heads;
  tr_tensor_t* dres = &mb->dhidden; /* d(output), becomes d(input) */
  tr_tensor_t dfc = {0}, dsmall = {0}, dqkv = {0};
  tr_tensor_t q = {0}, k = {0}, v = {0}, dq = {0}, dk = {0}, dv = {0};
  int rc;
  /* MLP branch: x3 = x2 + fcproj(gelu(fc(ln2(x2)))) */
  /* d(fc) = (dres fcproj_w) * gelu'(fc), written whole by one call */
  TR_CHECK_GOTO(tr__act(m, &dfc, B, T, c->ffn_dim), rc, out);
  TR_CHECK_GOTO(
      tr_kern_linear_dgelu_bwd(&dfc, G(m, blk, G_FCP_W), G(m, blk, G_FCP_B),
                               dres, &s->gelu, W(m, blk, G_FCP_W), &s->fc),
      rc, out);
  /* d(ln2), d(atty), d(ln1) in turn: each written whole by the first
   * GEMM into it (linear_bwd_write), no zeroing pass */
  TR_CHECK_GOTO(tr__act(m, &dsmall, B, T, C), rc, out);
  TR_CHECK_GOTO(
      tr_kern_linear_bwd_write(&dsmall, G(m, blk, G_FC_W), G(m, blk, G_FC_B),
                               &dfc, &s->ln2, W(m, blk, G_FC_W)),
      rc, out);
  tr_tensor_release(&dfc);
  TR_CHECK_GOTO(tr_kern_layernorm_bwd(
                    dres, G(m, blk, G_LN2_W), G(m, blk, G_LN2_B), &dsmall,
                    &s->x2, W(m, blk, G_LN2_W), &s->ln2_mean, &s->ln2_rstd),
                rc, out);
  /* attention branch: x2 = x + proj(attn(qkv(ln1(x)))) */
  TR_CHECK_GOTO(/* dsmall is now d(atty) */
                tr_kern_linear_bwd_write(&dsmall, G(m, blk, G_PROJ_W),
                                         G(m, blk, G_PROJ_B), dres, &s->atty,
                                         W(m, blk, G_PROJ_W)),
                rc, out);
  TR_CHECK_GOTO(tr__act(m, &dqkv, B, T, 3 * (int64_t)C), rc, out); /* set */
  TR_CHECK_GOTO(qkv_views(&s->qkv, C, &q, &k, &v), rc, out);
  TR_CHECK_GOTO(qkv_views(&dqkv, C, &dq, &dk, &dv), rc, out);
  TR_CHECK_GOTO(tr_kern_attention_bwd(&dq, &dk, &dv, &dsmall, &q, &k, &v,
                                      &s->atty, &s->lse, H, H),
                rc, out);
  TR_CHECK_GOTO(/* dsmall is now d(ln1) */
                tr_kern_linear_bwd_write(&dsmall, G(m, blk, G_QKV_W),
                                         G(m, blk, G_QKV_B), &dqkv, &s->ln1,
                                         W(m, blk, G_QKV_W)),
                rc, out);
  TR_CHECK_GOTO(tr_kern_layernorm_bwd(
                    dres, G(m, blk, G_LN1_W), G(m, blk, G_LN1_B), &dsmall,
                    &s->x, W(m, blk, G_LN1_W), &s->ln1_mean, &s->ln1_rstd),
                rc, out);
  rc = 0;
out:;
  tr_tensor_t* ts[] = {&dfc, &dsmall, &dqkv, &q, &k, &v, &dq, &dk, &dv};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  tr__gpt2_layer_free(s);
  return rc;
}

/* ---- selective "op" checkpointing: drop the cheap activations ---- */

void tr__gpt2_layer_slim(void* saved) {
  gpt2_saved_t* s = saved;
  tr_tensor_release(&s->ln1);
  tr_tensor_release(&s->ln2);
  tr_tensor_release(&s->gelu);
}

int tr__gpt2_layer_refill(tr_model_t* m, tr_model_mb_t* mb, int blk,
                          void* saved) {
  gpt2_saved_t* s = saved;
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  /* the same kernels on the same inputs as the forward: the statistics
   * are rewritten with the values they hold */
  if (!s->ln1.storage) {
    TR_CHECK(tr__act(m, &s->ln1, B, T, C));
    TR_CHECK(tr_kern_layernorm_fwd(&s->ln1, &s->ln1_mean, &s->ln1_rstd, &s->x,
                                   W(m, blk, G_LN1_W), W(m, blk, G_LN1_B),
                                   c->norm_eps));
  }
  if (!s->ln2.storage) {
    TR_CHECK(tr__act(m, &s->ln2, B, T, C));
    TR_CHECK(tr_kern_layernorm_fwd(&s->ln2, &s->ln2_mean, &s->ln2_rstd, &s->x2,
                                   W(m, blk, G_LN2_W), W(m, blk, G_LN2_B),
                                   c->norm_eps));
  }
  if (!s->gelu.storage) {
    /* in this mode the forward ran gelu_fwd on fc too (not the fused
     * linear_gelu_fwd), so these are its bits */
    TR_CHECK(tr__act(m, &s->gelu, B, T, s->fc.shape[2]));
    TR_CHECK(tr_kern_gelu_fwd(&s->gelu, &s->fc));
  }
  return 0;
}
