/* model/llama3.c: the Llama-3 transformer layer (pre-RMSNorm, separate
 * q/k/v projections with RoPE, grouped-query causal attention, SwiGLU MLP,
 * no biases), forward and backward. Head counts and the MLP width come
 * from the local weight shapes, so tensor-parallel shards of the weights
 * run the same code; the TP reductions sit at the seam points of
 * tr_model_tp_t. */
#include "config.h"

#include <stdlib.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

typedef struct {
  tr_tensor_t x;        /* input [B,T,C] */
  tr_tensor_t h, rstd1; /* attention_norm(x) */
  tr_tensor_t q, k, v;  /* after RoPE: [B,T,H*D], [B,T,KVH*D] x2 */
  tr_tensor_t atty, lse;
  tr_tensor_t x2;        /* x + attention branch */
  tr_tensor_t h2, rstd2; /* ffn_norm(x2) */
  tr_tensor_t g, u, sw;  /* gate, up, silu(gate)*up: [B,T,F] */
} llama_saved_t;

#define NSAVED (sizeof(llama_saved_t) / sizeof(tr_tensor_t))

void tr__llama_layer_free(void* p) {
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

static int tp(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t) {
  return m->tp.reduce ? m->tp.reduce(m->tp.arg, pt, t) : 0;
}

int tr__llama_layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk,
                        void** saved) {
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  int64_t N = (int64_t)B * T;
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
  TR_CHECK_GOTO(tr__act(m, &s->h, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->rstd1, N), rc, fail);
  TR_CHECK_GOTO(tr_kern_rmsnorm_fwd(&s->h, &s->rstd1, &s->x,
                                    W(m, blk, L_ATTN_NORM), c->norm_eps),
                rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->q, B, T, (int64_t)d.H * d.D), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->k, B, T, (int64_t)d.KVH * d.D), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->v, B, T, (int64_t)d.KVH * d.D), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&s->q, &s->h, W(m, blk, L_WQ), NULL), rc,
                fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&s->k, &s->h, W(m, blk, L_WK), NULL), rc,
                fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&s->v, &s->h, W(m, blk, L_WV), NULL), rc,
                fail);
  TR_CHECK_GOTO(tr_kern_rope(&s->q, d.H, &m->rope_cos, &m->rope_sin, 0), rc,
                fail);
  TR_CHECK_GOTO(tr_kern_rope(&s->k, d.KVH, &m->rope_cos, &m->rope_sin, 0), rc,
                fail);
  TR_CHECK_GOTO(tr__act(m, &s->atty, B, T, (int64_t)d.H * d.D), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->lse, (int64_t)B * d.H * T), rc, fail);
  TR_CHECK_GOTO(
      tr_kern_attention_fwd(&s->atty, &s->lse, &s->q, &s->k, &s->v, d.H, d.KVH),
      rc, fail);
  TR_CHECK_GOTO(tr__act(m, &o, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&o, &s->atty, W(m, blk, L_WO), NULL), rc,
                fail);
  TR_CHECK_GOTO(tp(m, TR_TP_FWD_OUT, &o), rc, fail);
  /* MLP branch: x2 = o + x (in place in o) and ffn_norm(x2) in one pass;
   * the bits of tr_kern_add then tr_kern_rmsnorm_fwd, which the
   * recomputations (layer_refill, recompute.c) run */
  TR_CHECK_GOTO(tr__act(m, &s->h2, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->rstd2, N), rc, fail);
  TR_CHECK_GOTO(
      tr_kern_residual_rmsnorm_fwd(&o, &s->h2, &s->rstd2, &o, &s->x,
                                   W(m, blk, L_FFN_NORM), c->norm_eps),
      rc, fail);
  tr_tensor_view(&s->x2, &o);
  TR_CHECK_GOTO(tr__act(m, &s->g, B, T, d.F), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->u, B, T, d.F), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &s->sw, B, T, d.F), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&s->g, &s->h2, W(m, blk, L_W1), NULL), rc,
                fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&s->u, &s->h2, W(m, blk, L_W3), NULL), rc,
                fail);
  TR_CHECK_GOTO(tr_kern_swiglu_fwd(&s->sw, &s->g, &s->u), rc, fail);
  TR_CHECK_GOTO(tr__act(m, &dn, B, T, C), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&dn, &s->sw, W(m, blk, L_W2), NULL), rc,
                fail);
  TR_CHECK_GOTO(tp(m, TR_TP_FWD_OUT, &dn), rc, fail);
  TR_CHECK_GOTO(tr_kern_add(&dn, &dn, &s->x2), rc, fail);
  mb->hidden = dn;
  dn = (tr_tensor_t){0};
  rc = 0;
  if (mb->no_grad) {
    tr__llama_layer_free(s);
    s = NULL;
  }
  *saved = s;
  goto out;
fail:
  tr__llama_layer_free(s);
out:
  tr_tensor_release(&o);
  tr_tensor_release(&dn);
  return rc;
}

int tr__llama_layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk,
                        void* saved) {
  llama_saved_t* s = saved;
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  tr_tensor_t* dres = &mb->dhidden;
  tr_tensor_t dsw = {0}, dg = {0}, du = {0}, dh = {0}, datty = {0};
  tr_tensor_t dq = {0}, dk = {0}, dv = {0};
  dims_t d;
  int rc;
  TR_CHECK_GOTO(local_dims(m, blk, &d), rc, out);
  /* MLP branch: x3 = x2 + w2(silu(w1 h2) * w3 h2), h2 = ffn_norm(x2) */
  /* each input gradient is written whole by its first writer
   * (linear_bwd_write, swiglu_bwd_write): no zeroing pass */
  TR_CHECK_GOTO(tr__act(m, &dsw, B, T, d.F), rc, out);
  TR_CHECK_GOTO(tr_kern_linear_bwd_write(&dsw, G(m, blk, L_W2), NULL, dres,
                                         &s->sw, W(m, blk, L_W2)),
                rc, out);
  TR_CHECK_GOTO(tr__act(m, &dg, B, T, d.F), rc, out);
  TR_CHECK_GOTO(tr__act(m, &du, B, T, d.F), rc, out);
  TR_CHECK_GOTO(tr_kern_swiglu_bwd_write(&dg, &du, &dsw, &s->g, &s->u), rc,
                out);
  tr_tensor_release(&dsw);
  TR_CHECK_GOTO(tr__act(m, &dh, B, T, C), rc, out);
  TR_CHECK_GOTO(tr_kern_linear_bwd_write(&dh, G(m, blk, L_W1), NULL, &dg,
                                         &s->h2, W(m, blk, L_W1)),
                rc, out);
  TR_CHECK_GOTO(tr_kern_linear_bwd(&dh, G(m, blk, L_W3), NULL, &du, &s->h2,
                                   W(m, blk, L_W3)),
                rc, out);
  tr_tensor_release(&dg);
  tr_tensor_release(&du);
  TR_CHECK_GOTO(tp(m, TR_TP_BWD_IN, &dh), rc, out);
  TR_CHECK_GOTO(tr_kern_rmsnorm_bwd(dres, G(m, blk, L_FFN_NORM), &dh, &s->x2,
                                    W(m, blk, L_FFN_NORM), &s->rstd2),
                rc, out);
  /* attention branch: x2 = x + wo(attn(rope(wq h), rope(wk h), wv h)) */
  TR_CHECK_GOTO(tr__act(m, &datty, B, T, (int64_t)d.H * d.D), rc, out);
  TR_CHECK_GOTO(tr_kern_linear_bwd_write(&datty, G(m, blk, L_WO), NULL, dres,
                                         &s->atty, W(m, blk, L_WO)),
                rc, out);
  /* written whole by the attention backward */
  TR_CHECK_GOTO(tr__act(m, &dq, B, T, (int64_t)d.H * d.D), rc, out);
  TR_CHECK_GOTO(tr__act(m, &dk, B, T, (int64_t)d.KVH * d.D), rc, out);
  TR_CHECK_GOTO(tr__act(m, &dv, B, T, (int64_t)d.KVH * d.D), rc, out);
  TR_CHECK_GOTO(tr_kern_attention_bwd(&dq, &dk, &dv, &datty, &s->q, &s->k,
                                      &s->v, &s->atty, &s->lse, d.H, d.KVH),
                rc, out);
  tr_tensor_release(&datty);
  TR_CHECK_GOTO(tr_kern_rope(&dq, d.H, &m->rope_cos, &m->rope_sin, 1), rc, out);
  TR_CHECK_GOTO(tr_kern_rope(&dk, d.KVH, &m->rope_cos, &m->rope_sin, 1), rc,
                out);
  TR_CHECK_GOTO(tr_kern_linear_bwd_write(&dh, G(m, blk, L_WQ), NULL, &dq,
                                         &s->h, W(m, blk, L_WQ)),
                rc, out);
  TR_CHECK_GOTO(tr_kern_linear_bwd(&dh, G(m, blk, L_WK), NULL, &dk, &s->h,
                                   W(m, blk, L_WK)),
                rc, out);
  TR_CHECK_GOTO(tr_kern_linear_bwd(&dh, G(m, blk, L_WV), NULL, &dv, &s->h,
                                   W(m, blk, L_WV)),
                rc, out);
  TR_CHECK_GOTO(tp(m, TR_TP_BWD_IN, &dh), rc, out);
  TR_CHECK_GOTO(tr_kern_rmsnorm_bwd(dres, G(m, blk, L_ATTN_NORM), &dh, &s->x,
                                    W(m, blk, L_ATTN_NORM), &s->rstd1),
                rc, out);
  rc = 0;
out:;
  tr_tensor_t* ts[] = {&dsw, &dg, &du, &dh, &datty, &dq, &dk, &dv};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
  tr__llama_layer_free(s);
  return rc;
}

/* ---- selective "op" checkpointing: drop the cheap activations ---- */

void tr__llama_layer_slim(void* saved) {
  llama_saved_t* s = saved;
  tr_tensor_release(&s->h);
  tr_tensor_release(&s->h2);
  tr_tensor_release(&s->sw);
}

int tr__llama_layer_refill(tr_model_t* m, tr_model_mb_t* mb, int blk,
                           void* saved) {
  llama_saved_t* s = saved;
  const tr_model_config_t* c = &m->cfg;
  int B = mb->B, T = mb->T, C = c->dim;
  /* the forward's kernels on the forward's inputs (rstd is rewritten with
   * the values it holds) */
  if (!s->h.storage) {
    TR_CHECK(tr__act(m, &s->h, B, T, C));
    TR_CHECK(tr_kern_rmsnorm_fwd(&s->h, &s->rstd1, &s->x,
                                 W(m, blk, L_ATTN_NORM), c->norm_eps));
  }
  if (!s->h2.storage) {
    TR_CHECK(tr__act(m, &s->h2, B, T, C));
    TR_CHECK(tr_kern_rmsnorm_fwd(&s->h2, &s->rstd2, &s->x2,
                                 W(m, blk, L_FFN_NORM), c->norm_eps));
  }
  if (!s->sw.storage) {
    TR_CHECK(tr__act(m, &s->sw, B, T, s->g.shape[2]));
    TR_CHECK(tr_kern_swiglu_fwd(&s->sw, &s->g, &s->u));
  }
  return 0;
}
