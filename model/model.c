/* model/model.c: micro-batches, the embedding and head blocks, and the
 * forward/backward passes over ranges of blocks with their hooks — the
 * backward combined or split into input (I) and weight (W) gradients. What
 * differs between families (the embedding's tables, the final norm, the
 * transformer layers) is reached through the family's table, m->family
 * (gpt2.c, llama3.c); the layers pass through the checkpointing policy
 * (recompute.c). */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* ---- micro-batches ---- */

int tr_model_mb_init(tr_model_t* m, tr_model_mb_t* mb, int B, int T,
                     const int32_t* tokens, const int32_t* targets) {
  memset(mb, 0, sizeof *mb);
  int cp = m->cp.fwd ? m->cp.size : 1; /* T: the whole sequence's */
  if (B < 1 || T < 1 || T > m->cfg.max_seq_len || !tokens) {
    TR_LOG_ERROR(MODEL, "bad micro-batch %dx%d (max_seq_len %d)", B, T,
                 m->cfg.max_seq_len);
    return TR_EINVAL;
  }
  if (cp > 1 && T % (2 * cp)) {
    TR_LOG_ERROR(MODEL,
                 "context parallel: %d tokens do not split into 2 x %d "
                 "equal chunks",
                 T, cp);
    return TR_EINVAL;
  }
  mb->B = B;
  mb->T = T / cp;
  mb->n_blocks = m->n_blocks;
  mb->saved = calloc((size_t)m->n_blocks, sizeof *mb->saved);
  mb->wsaved = calloc((size_t)m->n_blocks, sizeof *mb->wsaved);
  int32_t* rows = NULL; /* this cp rank's tokens and targets */
  if (cp > 1) rows = malloc(sizeof *rows * (size_t)B * (size_t)mb->T * 2);
  if (!mb->saved || !mb->wsaved || (cp > 1 && !rows)) {
    free(mb->saved);
    free(mb->wsaved);
    free(rows);
    memset(mb, 0, sizeof *mb);
    return TR_ENOMEM;
  }
  const int32_t* tok = tokens;
  const int32_t* tgt = targets;
  if (cp > 1) {
    size_t n = (size_t)B * mb->T;
    tr__mask_cp_rows(m, rows, tokens, B, T);
    tok = rows;
    if (targets) tr__mask_cp_rows(m, rows + n, targets, B, T);
    tgt = targets ? rows + n : NULL;
  }
  if (tgt)
    for (int64_t i = 0; i < (int64_t)B * mb->T; i++)
      mb->n_valid += tgt[i] != TR_IGNORE_INDEX;
  int rc = tr__act_i32(m, &mb->tokens, tok, B, mb->T);
  if (rc == 0 && tgt) rc = tr__act_i32(m, &mb->targets, tgt, B, mb->T);
  if (rc == 0) rc = tr__mask_mb_init(m, mb, tokens, T); /* model/mask.c */
  free(rows);
  if (rc < 0) tr_model_mb_release(m, mb);
  return rc;
}

/* Saved records: the embedding keeps nothing in forward (a marker) and
 * its output gradient for W (embed_w_t); the head's is head_saved_t in
 * both cases; a layer's is recompute.c's in forward and the family's for
 * W. */
typedef struct {
  tr_tensor_t x, hn, mean, rstd, lse;
  tr_tensor_t dl; /* the I pass's dlogits, kept for W */
  int dlogits;    /* the forward already turned the logits into dlogits */
} head_saved_t;

typedef struct {
  tr_tensor_t d; /* the embedding's output gradient */
} embed_w_t;

static void head_free(void* p) {
  head_saved_t* s = p;
  if (!s) return;
  tr__release_all(&s->x, 6);
  free(s);
}

static void embed_w_free(void* p) {
  embed_w_t* e = p;
  if (!e) return;
  tr_tensor_release(&e->d);
  free(e);
}

static void free_saved(tr_model_t* m, int blk, void* saved) {
  if (!saved) return;
  switch (m->blocks[blk].kind) {
    case TR_BLOCK_EMBED:
      break;
    case TR_BLOCK_HEAD:
      head_free(saved);
      break;
    case TR_BLOCK_LAYER:
      tr__ac_layer_free(m, saved);
      break;
  }
}

static void free_wsaved(tr_model_t* m, int blk, void* w) {
  if (!w) return;
  switch (m->blocks[blk].kind) {
    case TR_BLOCK_EMBED:
      embed_w_free(w);
      break;
    case TR_BLOCK_HEAD:
      head_free(w);
      break;
    case TR_BLOCK_LAYER:
      m->family->layer_free(w);
      break;
  }
}

void tr_model_mb_release(tr_model_t* m, tr_model_mb_t* mb) {
  if (mb->saved) {
    for (int i = 0; i < mb->n_blocks && m && i < m->n_blocks; i++)
      free_saved(m, i, mb->saved[i]);
    free(mb->saved);
  }
  if (mb->wsaved) {
    for (int i = 0; i < mb->n_blocks && m && i < m->n_blocks; i++)
      free_wsaved(m, i, mb->wsaved[i]);
    free(mb->wsaved);
  }
  tr_tensor_release(&mb->tokens);
  tr_tensor_release(&mb->targets);
  tr_tensor_release(&mb->hidden);
  tr_tensor_release(&mb->dhidden);
  tr_tensor_release(&mb->logits);
  tr_tensor_release(&mb->losses);
  tr__mask_mb_release(mb);
  memset(mb, 0, sizeof *mb);
}

double tr_model_mb_loss(const tr_model_mb_t* mb) {
  return mb->n_valid ? mb->loss_sum / (double)mb->n_valid : NAN;
}

/* ---- embedding block: the family's tables ---- */

static int embed_fwd(tr_model_t* m, tr_model_mb_t* mb) {
  tr_tensor_release(&mb->hidden);
  TR_CHECK(tr__act(m, &mb->hidden, mb->B, mb->T, m->cfg.dim));
  return m->family->embed_fwd(m, &mb->hidden, &mb->tokens, tr__mask_pos(mb));
}

static int embed_bwd(tr_model_t* m, tr_model_mb_t* mb) {
  tr_tensor_t d = {0}; /* under SP gathered over the sequence */
  int rc = tr__tp_out_grad(m, &mb->dhidden, &d);
  if (rc == 0)
    rc = m->family->embed_bwd(m, &d, &mb->tokens, tr__mask_pos(mb));
  tr_tensor_release(&d);
  tr_tensor_release(&mb->dhidden);
  return rc;
}

/* I: no input gradient (tokens); the output gradient (under SP gathered)
 * moves to W's record */
static int embed_bwd_input(tr_model_t* m, tr_model_mb_t* mb, void** w) {
  embed_w_t* e = calloc(1, sizeof *e);
  if (!e) return TR_ENOMEM;
  int rc = tr__tp_out_grad(m, &mb->dhidden, &e->d);
  tr_tensor_release(&mb->dhidden);
  if (rc < 0) {
    free(e);
    return rc;
  }
  *w = e;
  return 0;
}

/* ---- head block: final norm, output projection, cross-entropy ---- */

/* mb->logits [B,T,V] (V: the output projection's local rows, V/tp when
 * tp splits the vocabulary): on a device, rows padded to a multiple of 64
 * elements (a column slice of [B,T,Vp]) so the output projection's GEMMs
 * and the classifier work on aligned rows (GPT-2's 50257 is odd). */
static int logits_buffer(tr_model_t* m, tr_model_mb_t* mb, int64_t V) {
  if (m->device.type == TR_DEV_CPU || V % 64 == 0)
    return tr__act(m, &mb->logits, mb->B, mb->T, V);
  tr_tensor_t wide = {0};
  TR_CHECK(tr__act(m, &wide, mb->B, mb->T, (V + 63) / 64 * 64));
  int rc = tr_tensor_narrow(&mb->logits, &wide, 2, 0, V);
  tr_tensor_release(&wide);
  return rc;
}

/* loss_sum = the per-token losses (0 at ignored targets) added in a fixed
 * order in double, through a host copy for device tensors. */
static int sum_losses(tr_model_mb_t* mb, int64_t N) {
  tr_tensor_t h = {0};
  if (mb->losses.device.type == TR_DEV_CPU) {
    tr_tensor_view(&h, &mb->losses);
  } else {
    TR_CHECK(tr_tensor_empty(&h, TR_F32, TR_DEVICE_CPU, mb->losses.ndim,
                             mb->losses.shape));
    int rc = tr_tensor_copy(&h, &mb->losses);
    if (rc < 0) {
      tr_tensor_release(&h);
      return rc;
    }
  }
  const float* l = tr_tensor_data(&h);
  double sum = 0.0;
  for (int64_t i = 0; i < N; i++) sum += l[i];
  mb->loss_sum = sum;
  tr_tensor_release(&h);
  return 0;
}

/* d(objective)/d(each token's loss): mb->loss_scale, else the mean over
 * this micro-batch's valid targets. */
static float loss_scale(const tr_model_mb_t* mb) {
  if (mb->loss_scale != 0.0f) return mb->loss_scale;
  return mb->n_valid ? 1.0f / (float)mb->n_valid : 0.0f;
}

/* The first vocabulary row of this rank's output projection, or -1 when
 * it holds the whole vocabulary. */
static int64_t vocab_offset(tr_model_t* m, int blk) {
  int64_t Vl = W(m, blk, m->family->head_out_slot)->shape[0];
  return m->tp.fn && Vl < m->cfg.vocab_size ? m->tp.rank * Vl : -1;
}

/* Loss parallel: losses and lse [N] of the whole vocabulary from this
 * rank's logit columns [voff, voff + Vl), through the seam (TR_TP_LOSS: the
 * rows' max, then their sums of exponentials and target logits in one
 * sum); with grad, the columns become their part of the dlogits. */
static int shard_xent(tr_model_t* m, tr_model_mb_t* mb, head_saved_t* s,
                      int64_t voff, int grad) {
  int64_t N = (int64_t)mb->B * mb->T;
  tr_tensor_t max = {0}, st = {0}, sum = {0}, tgt = {0};
  int rc;
  TR_CHECK_GOTO(tr__vec(m, &max, N), rc, out);
  TR_CHECK_GOTO(tr__vec(m, &st, 2 * N), rc, out); /* sum | tgt */
  TR_CHECK_GOTO(tr_tensor_narrow(&sum, &st, 0, 0, N), rc, out);
  TR_CHECK_GOTO(tr_tensor_narrow(&tgt, &st, 0, N, N), rc, out);
  TR_CHECK_GOTO(tr_kern_xent_shard_stats(&max, &tgt, &mb->logits, &mb->targets,
                                         voff, m->cfg.vocab_size),
                rc, out);
  TR_CHECK_GOTO(tr__tp(m, TR_TP_LOSS, TR_TP_MAX, &max), rc, out);
  TR_CHECK_GOTO(tr_kern_xent_shard_sumexp(&sum, &mb->logits, &max), rc, out);
  TR_CHECK_GOTO(tr__tp(m, TR_TP_LOSS, TR_TP_SUM, &st), rc, out);
  TR_CHECK_GOTO(tr_kern_xent_shard_loss(&mb->losses, &s->lse, &max, &sum, &tgt,
                                        &mb->targets),
                rc, out);
  if (grad)
    rc = tr_kern_xent_shard_bwd(&mb->logits, &s->lse, &mb->targets, voff,
                                loss_scale(mb));
out:
  tr_tensor_release(&max);
  tr_tensor_release(&st);
  tr_tensor_release(&sum);
  tr_tensor_release(&tgt);
  return rc;
}

/* disable_loss_parallel: the logits gathered over tp (TR_TP_LOSS), the
 * ordinary cross-entropy on them; with grad this rank keeps its columns
 * [voff, voff + Vl) of the dlogits in mb->logits. */
static int gathered_xent(tr_model_t* m, tr_model_mb_t* mb, head_saved_t* s,
                         int64_t voff, int grad) {
  tr_tensor_t all = {0}, mine = {0};
  int rc;
  tr_tensor_view(&all, &mb->logits);
  TR_CHECK_GOTO(tr__tp(m, TR_TP_LOSS, TR_TP_GATHER_LAST, &all), rc, out);
  if (!grad) {
    rc = tr_kern_xent_fwd(&mb->losses, &s->lse, &all, &mb->targets);
    goto out;
  }
  TR_CHECK_GOTO(tr_kern_xent_fused(&mb->losses, &s->lse, &all, &mb->targets,
                                   loss_scale(mb)),
                rc, out);
  TR_CHECK_GOTO(tr_tensor_narrow(&mine, &all, 2, voff, mb->logits.shape[2]), rc,
                out);
  rc = tr_tensor_copy(&mb->logits, &mine);
out:
  tr_tensor_release(&all);
  tr_tensor_release(&mine);
  return rc;
}

static int head_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** out) {
  const tr_model_config_t* c = &m->cfg;
  int64_t N = (int64_t)mb->B * mb->T;
  int Tl = tr__tp_rows(m, mb->T); /* the residual stream's rows */
  head_saved_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  int rc;
  tr_tensor_view(&s->x, &mb->hidden);
  tr_tensor_release(&mb->hidden);
  TR_CHECK_GOTO(tr__act(m, &s->hn, mb->B, Tl, c->dim), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->rstd, (int64_t)mb->B * Tl), rc, fail);
  TR_CHECK_GOTO(m->family->norm_fwd(m, blk, &s->hn, &s->mean, &s->rstd, &s->x),
                rc, fail);
  /* the output projection is column-parallel: under SP its input gathered */
  TR_CHECK_GOTO(tr__tp_gather(m, TR_TP_FWD_IN, &s->hn), rc, fail);
  tr_tensor_t* wout = W(m, blk, m->family->head_out_slot);
  int64_t voff = vocab_offset(m, blk);
  tr_tensor_release(&mb->logits);
  TR_CHECK_GOTO(logits_buffer(m, mb, wout->shape[0]), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&mb->logits, &s->hn, wout, NULL), rc, fail);
  mb->loss_sum = 0.0;
  if (!mb->targets.storage && voff >= 0) /* the caller's logits: whole */
    TR_CHECK_GOTO(tr__tp(m, TR_TP_LOSS, TR_TP_GATHER_LAST, &mb->logits), rc,
                  fail);
  if (mb->targets.storage) {
    int64_t shape[2] = {mb->B, mb->T};
    tr_tensor_release(&mb->losses);
    TR_CHECK_GOTO(tr_tensor_empty(&mb->losses, TR_F32, m->device, 2, shape), rc,
                  fail);
    TR_CHECK_GOTO(tr__vec(m, &s->lse, N), rc, fail);
    if (voff >= 0) { /* the vocabulary split over tp */
      TR_CHECK_GOTO(m->tp.loss_parallel
                        ? shard_xent(m, mb, s, voff, !mb->no_grad)
                        : gathered_xent(m, mb, s, voff, !mb->no_grad),
                    rc, fail);
      s->dlogits = !mb->no_grad;
    } else if (mb->no_grad) {
      TR_CHECK_GOTO(
          tr_kern_xent_fwd(&mb->losses, &s->lse, &mb->logits, &mb->targets), rc,
          fail);
    } else { /* training: losses and dlogits in one pass */
      TR_CHECK_GOTO(tr_kern_xent_fused(&mb->losses, &s->lse, &mb->logits,
                                       &mb->targets, loss_scale(mb)),
                    rc, fail);
      s->dlogits = 1;
    }
    if (!mb->defer_loss) TR_CHECK_GOTO(sum_losses(mb, N), rc, fail);
  }
  if (mb->no_grad || !mb->targets.storage) {
    head_free(s);
    s = NULL;
  }
  *out = s;
  return 0;
fail:
  head_free(s);
  return rc;
}

/* The head's backward. split 0: every gradient (the combined pass).
 * split 1: the I pass — the output projection's weight gradient is left
 * for head_bwd_weight, for which the record keeps hn and the dlogits. */
static int head_backward(tr_model_t* m, tr_model_mb_t* mb, int blk,
                         head_saved_t* s, int split) {
  const tr_model_config_t* c = &m->cfg;
  int slot = m->family->head_out_slot;
  int rc;
  tr_tensor_t dhn = {0};
  tr__tp_grads_t ng = {0};
  int nn = m->family->head_norm_params;
  if (!s->dlogits)
    TR_CHECK_GOTO(
        tr_kern_xent_bwd(&mb->logits, &s->lse, &mb->targets, loss_scale(mb)),
        rc, out);
  TR_CHECK_GOTO(tr__act(m, &dhn, mb->B, mb->T, c->dim), rc, out);
  TR_CHECK_GOTO(/* dhn written whole: no zeroing */
                tr_kern_linear_bwd_write(&dhn, split ? NULL : G(m, blk, slot),
                                         NULL, &mb->logits, &s->hn,
                                         W(m, blk, slot)),
                rc, out);
  /* a vocabulary-split projection's input gradient is a partial sum; a
   * whole one's is the same on every rank, which under SP keeps its rows */
  if (vocab_offset(m, blk) >= 0)
    TR_CHECK_GOTO(tr__tp_reduce(m, TR_TP_BWD_IN, &dhn), rc, out);
  else
    TR_CHECK_GOTO(tr__tp_keep_rows(m, &dhn), rc, out);
  if (split) { /* the dlogits go to W */
    s->dl = mb->logits;
    memset(&mb->logits, 0, sizeof mb->logits);
  }
  tr_tensor_release(&mb->logits); /* dlogits are spent */
  tr_tensor_release(&mb->dhidden);
  TR_CHECK_GOTO(
      tr__act_zeros(m, &mb->dhidden, mb->B, tr__tp_rows(m, mb->T), c->dim), rc,
      out);
  TR_CHECK_GOTO(tr__tp_grads_begin(m, &ng, nn, G(m, blk, 0),
                                   nn > 1 ? G(m, blk, 1) : NULL),
                rc, out);
  rc = m->family->norm_bwd(m, blk, &mb->dhidden, &ng.part[0],
                           nn > 1 ? &ng.part[1] : NULL, &dhn, &s->x, &s->mean,
                           &s->rstd);
  rc = tr__tp_grads_end(m, &ng, rc);
  if (split && rc == 0) { /* W needs hn and dl */
    tr_tensor_release(&s->x);
    tr_tensor_release(&s->mean);
    tr_tensor_release(&s->rstd);
    tr_tensor_release(&s->lse);
  }
out:
  tr_tensor_release(&dhn);
  return rc;
}

/* W: the output projection's weight gradient from what I kept; the GEMM
 * of the combined pass on the same operands. Frees the record. */
static int head_bwd_weight(tr_model_t* m, int blk, head_saved_t* s) {
  int slot = m->family->head_out_slot;
  int rc = tr_kern_linear_bwd(NULL, G(m, blk, slot), NULL, &s->dl, &s->hn,
                              W(m, blk, slot));
  head_free(s);
  return rc;
}

/* ---- passes ---- */

static int run_hooks(tr_model_t* m, tr_hook_point_t pt, int blk,
                     tr_model_mb_t* mb) {
  for (int i = 0; i < m->n_hooks[pt]; i++)
    TR_CHECK(m->hooks[pt][i].fn(m->hooks[pt][i].arg, m, blk, mb));
  return 0;
}

int tr_model_block_forward(tr_model_t* m, tr_model_mb_t* mb, int blk) {
  if (blk < 0 || blk >= m->n_blocks || !mb->saved) return TR_EINVAL;
  const tr_model_block_t* bl = &m->blocks[blk];
  if (bl->kind != TR_BLOCK_EMBED && !mb->hidden.storage) {
    TR_LOG_ERROR(MODEL, "block %s: forward without an input", bl->name);
    return TR_EINVAL;
  }
  TR_CHECK(run_hooks(m, TR_HOOK_PRE_FORWARD, blk, mb));
  free_saved(m, blk, mb->saved[blk]);
  mb->saved[blk] = NULL;
  void* saved = NULL;
  int rc = 0;
  switch (bl->kind) {
    case TR_BLOCK_EMBED:
      rc = embed_fwd(m, mb);
      saved = mb->no_grad ? NULL : (void*)mb; /* marker: forward ran */
      break;
    case TR_BLOCK_LAYER: /* checkpointing policy: model/recompute.c */
      rc = tr__ac_layer_fwd(m, mb, blk, &saved);
      break;
    case TR_BLOCK_HEAD:
      rc = head_fwd(m, mb, blk, &saved);
      break;
  }
  if (rc < 0) return rc;
  mb->saved[blk] = saved;
  return run_hooks(m, TR_HOOK_POST_FORWARD, blk, mb);
}

/* What a backward (combined or I) needs: the forward's record and, below
 * the head, the output gradient; no W of this block still pending. */
static int backward_ready(tr_model_t* m, tr_model_mb_t* mb, int blk) {
  if (blk < 0 || blk >= m->n_blocks || !mb->saved) return TR_EINVAL;
  const tr_model_block_t* bl = &m->blocks[blk];
  if (!mb->saved[blk]) {
    TR_LOG_ERROR(MODEL,
                 "block %s: backward without a forward that kept activations"
                 " (no_grad, no targets, or already consumed)",
                 bl->name);
    return TR_EINVAL;
  }
  if (bl->kind != TR_BLOCK_HEAD && !mb->dhidden.storage) {
    TR_LOG_ERROR(MODEL, "block %s: backward without an output gradient",
                 bl->name);
    return TR_EINVAL;
  }
  if (mb->wsaved[blk]) {
    TR_LOG_ERROR(MODEL,
                 "block %s: backward while its weight gradient is "
                 "pending",
                 bl->name);
    return TR_EINVAL;
  }
  return 0;
}

int tr_model_block_backward(tr_model_t* m, tr_model_mb_t* mb, int blk) {
  TR_CHECK(backward_ready(m, mb, blk));
  const tr_model_block_t* bl = &m->blocks[blk];
  TR_CHECK(run_hooks(m, TR_HOOK_PRE_BACKWARD, blk, mb));
  void* saved = mb->saved[blk];
  mb->saved[blk] = NULL;
  int rc = 0;
  switch (bl->kind) {
    case TR_BLOCK_EMBED:
      rc = embed_bwd(m, mb);
      break;
    case TR_BLOCK_LAYER: /* recomputes first where checkpointed */
      rc = tr__ac_layer_bwd(m, mb, blk, saved);
      break;
    case TR_BLOCK_HEAD:
      rc = head_backward(m, mb, blk, saved, 0);
      head_free(saved);
      break;
  }
  if (rc < 0) return rc;
  return run_hooks(m, TR_HOOK_POST_BACKWARD, blk, mb);
}

int tr_model_block_backward_input(tr_model_t* m, tr_model_mb_t* mb, int blk) {
  TR_CHECK(backward_ready(m, mb, blk));
  TR_CHECK(run_hooks(m, TR_HOOK_PRE_BACKWARD, blk, mb));
  void* saved = mb->saved[blk];
  mb->saved[blk] = NULL;
  void* w = NULL;
  int rc = 0;
  switch (m->blocks[blk].kind) {
    case TR_BLOCK_EMBED:
      rc = embed_bwd_input(m, mb, &w);
      break;
    case TR_BLOCK_LAYER: /* recomputes first where checkpointed */
      rc = tr__ac_layer_bwd_input(m, mb, blk, saved, &w);
      break;
    case TR_BLOCK_HEAD:
      rc = head_backward(m, mb, blk, saved, 1);
      if (rc < 0)
        head_free(saved);
      else
        w = saved;
      break;
  }
  if (rc < 0) return rc;
  mb->wsaved[blk] = w;
  return 0;
}

int tr_model_block_backward_weight(tr_model_t* m, tr_model_mb_t* mb, int blk) {
  if (blk < 0 || blk >= m->n_blocks || !mb->wsaved) return TR_EINVAL;
  void* w = mb->wsaved[blk];
  if (!w) {
    TR_LOG_ERROR(MODEL, "block %s: weight gradient without an input gradient",
                 m->blocks[blk].name);
    return TR_EINVAL;
  }
  mb->wsaved[blk] = NULL;
  int rc = 0;
  switch (m->blocks[blk].kind) {
    case TR_BLOCK_EMBED: {
      embed_w_t* e = w;
      rc = m->family->embed_bwd(m, &e->d, &mb->tokens, tr__mask_pos(mb));
      embed_w_free(e);
      break;
    }
    case TR_BLOCK_LAYER:
      rc = m->family->layer_bwd_weight(m, blk, w);
      break;
    case TR_BLOCK_HEAD:
      rc = head_bwd_weight(m, blk, w);
      break;
  }
  if (rc < 0) return rc;
  return run_hooks(m, TR_HOOK_POST_BACKWARD, blk, mb);
}

int tr_model_forward(tr_model_t* m, tr_model_mb_t* mb, int first, int last) {
  if (first < 0 || last > m->n_blocks || first > last) return TR_EINVAL;
  for (int b = first; b < last; b++) TR_CHECK(tr_model_block_forward(m, mb, b));
  return 0;
}

int tr_model_backward(tr_model_t* m, tr_model_mb_t* mb, int first, int last) {
  if (first < 0 || last > m->n_blocks || first > last) return TR_EINVAL;
  for (int b = last - 1; b >= first; b--)
    TR_CHECK(tr_model_block_backward(m, mb, b));
  return 0;
}

int tr_model_backward_input(tr_model_t* m, tr_model_mb_t* mb, int first,
                            int last) {
  if (first < 0 || last > m->n_blocks || first > last) return TR_EINVAL;
  for (int b = last - 1; b >= first; b--)
    TR_CHECK(tr_model_block_backward_input(m, mb, b));
  return 0;
}

int tr_model_backward_weight(tr_model_t* m, tr_model_mb_t* mb, int first,
                             int last) {
  if (first < 0 || last > m->n_blocks || first > last) return TR_EINVAL;
  for (int b = last - 1; b >= first; b--)
    TR_CHECK(tr_model_block_backward_weight(m, mb, b));
  return 0;
}
