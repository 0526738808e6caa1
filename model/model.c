/* model/model.c: micro-batches, the embedding and head blocks, and the
 * forward/backward passes over ranges of blocks with their hooks. The
 * transformer layers live in gpt2.c and llama3.c. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* ---- helpers ---- */

int tr__act(tr_model_t* m, tr_tensor_t* t, int B, int T, int64_t w) {
  int64_t shape[3] = {B, T, w};
  return tr_tensor_empty(t, m->compute_dtype, m->device, 3, shape);
}

int tr__act_zeros(tr_model_t* m, tr_tensor_t* t, int B, int T, int64_t w) {
  TR_CHECK(tr__act(m, t, B, T, w));
  int rc = tr_kern_zero(t);
  if (rc < 0) tr_tensor_release(t);
  return rc;
}

int tr__vec(tr_model_t* m, tr_tensor_t* t, int64_t n) {
  return tr_tensor_empty(t, TR_F32, m->device, 1, &n);
}

void tr__release_all(tr_tensor_t* ts, int n) {
  for (int i = 0; i < n; i++) tr_tensor_release(&ts[i]);
}

int tr__rope_ensure(tr_model_t* m, int T) {
  if (m->rope_T >= T) return 0;
  int half = m->cfg.head_dim / 2;
  int64_t shape[2] = {T, half};
  tr_tensor_t hc = {0}, hs = {0}, dc = {0}, ds = {0};
  int rc;
  TR_CHECK_GOTO(tr_tensor_empty(&hc, TR_F32, TR_DEVICE_CPU, 2, shape), rc, out);
  TR_CHECK_GOTO(tr_tensor_empty(&hs, TR_F32, TR_DEVICE_CPU, 2, shape), rc, out);
  TR_CHECK_GOTO(tr_kern_rope_table(tr_tensor_data(&hc), tr_tensor_data(&hs), T,
                                   m->cfg.head_dim, m->cfg.rope_theta,
                                   &m->cfg.rope_scaling),
                rc, out);
  if (m->device.type == TR_DEV_CPU) {
    tr_tensor_view(&dc, &hc);
    tr_tensor_view(&ds, &hs);
  } else {
    TR_CHECK_GOTO(tr_tensor_empty(&dc, TR_F32, m->device, 2, shape), rc, out);
    TR_CHECK_GOTO(tr_tensor_empty(&ds, TR_F32, m->device, 2, shape), rc, out);
    TR_CHECK_GOTO(tr_tensor_copy(&dc, &hc), rc, out);
    TR_CHECK_GOTO(tr_tensor_copy(&ds, &hs), rc, out);
  }
  tr_tensor_release(&m->rope_cos);
  tr_tensor_release(&m->rope_sin);
  m->rope_cos = dc;
  m->rope_sin = ds;
  dc = (tr_tensor_t){0};
  ds = (tr_tensor_t){0};
  m->rope_T = T;
  rc = 0;
out:
  tr_tensor_release(&hc);
  tr_tensor_release(&hs);
  tr_tensor_release(&dc);
  tr_tensor_release(&ds);
  return rc;
}

/* ---- micro-batches ---- */

static int to_device(tr_model_t* m, tr_tensor_t* dst, const int32_t* src, int B,
                     int T) {
  int64_t shape[2] = {B, T};
  tr_tensor_t host = {0};
  TR_CHECK(tr_tensor_empty(dst, TR_I32, m->device, 2, shape));
  int rc = tr_tensor_wrap(&host, (void*)src, TR_I32, TR_DEVICE_CPU, 2, shape);
  if (rc == 0) rc = tr_tensor_copy(dst, &host);
  tr_tensor_release(&host);
  if (rc < 0) tr_tensor_release(dst);
  return rc;
}

int tr_model_mb_init(tr_model_t* m, tr_model_mb_t* mb, int B, int T,
                     const int32_t* tokens, const int32_t* targets) {
  memset(mb, 0, sizeof *mb);
  if (B < 1 || T < 1 || T > m->cfg.max_seq_len || !tokens) {
    TR_LOG_ERROR(MODEL, "bad micro-batch %dx%d (max_seq_len %d)", B, T,
                 m->cfg.max_seq_len);
    return TR_EINVAL;
  }
  mb->B = B;
  mb->T = T;
  mb->n_blocks = m->n_blocks;
  mb->saved = calloc((size_t)m->n_blocks, sizeof *mb->saved);
  if (!mb->saved) return TR_ENOMEM;
  if (targets)
    for (int64_t i = 0; i < (int64_t)B * T; i++)
      mb->n_valid += targets[i] != TR_IGNORE_INDEX;
  int rc = to_device(m, &mb->tokens, tokens, B, T);
  if (rc == 0 && targets) rc = to_device(m, &mb->targets, targets, B, T);
  if (rc < 0) tr_model_mb_release(m, mb);
  return rc;
}

/* Saved records: the embedding keeps nothing; the head's is head_saved_t. */
typedef struct {
  tr_tensor_t x, hn, mean, rstd, lse;
  int dlogits; /* the forward already turned the logits into dlogits */
} head_saved_t;

static void head_free(void* p) {
  head_saved_t* s = p;
  if (!s) return;
  tr__release_all(&s->x, 5);
  free(s);
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

void tr_model_mb_release(tr_model_t* m, tr_model_mb_t* mb) {
  if (mb->saved) {
    for (int i = 0; i < mb->n_blocks && m && i < m->n_blocks; i++)
      free_saved(m, i, mb->saved[i]);
    free(mb->saved);
  }
  tr_tensor_release(&mb->tokens);
  tr_tensor_release(&mb->targets);
  tr_tensor_release(&mb->hidden);
  tr_tensor_release(&mb->dhidden);
  tr_tensor_release(&mb->logits);
  tr_tensor_release(&mb->losses);
  memset(mb, 0, sizeof *mb);
}

double tr_model_mb_loss(const tr_model_mb_t* mb) {
  return mb->n_valid ? mb->loss_sum / (double)mb->n_valid : NAN;
}

/* ---- embedding block ---- */

static int embed_fwd(tr_model_t* m, tr_model_mb_t* mb) {
  tr_tensor_release(&mb->hidden);
  TR_CHECK(tr__act(m, &mb->hidden, mb->B, mb->T, m->cfg.dim));
  const tr_tensor_t* wpe =
      m->cfg.family == TR_MODEL_GPT2 ? W(m, 0, EMB_WPE) : NULL;
  return tr_kern_embedding_fwd(&mb->hidden, &mb->tokens, W(m, 0, EMB_WTE), wpe);
}

static int embed_bwd(tr_model_t* m, tr_model_mb_t* mb) {
  tr_tensor_t* dwpe = m->cfg.family == TR_MODEL_GPT2 ? G(m, 0, EMB_WPE) : NULL;
  int rc =
      tr_kern_embedding_bwd(G(m, 0, EMB_WTE), dwpe, &mb->dhidden, &mb->tokens);
  tr_tensor_release(&mb->dhidden);
  return rc;
}

/* ---- head block: final norm, output projection, cross-entropy ---- */

/* mb->logits [B,T,V]: on a device, rows padded to a multiple of 64
 * elements (a column slice of [B,T,Vp]) so the output projection's GEMMs
 * and the classifier work on aligned rows (GPT-2's 50257 is odd). */
static int logits_buffer(tr_model_t* m, tr_model_mb_t* mb) {
  int64_t V = m->cfg.vocab_size;
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

static int head_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** out) {
  const tr_model_config_t* c = &m->cfg;
  int gpt2 = c->family == TR_MODEL_GPT2;
  int64_t N = (int64_t)mb->B * mb->T;
  head_saved_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  int rc;
  tr_tensor_view(&s->x, &mb->hidden);
  tr_tensor_release(&mb->hidden);
  TR_CHECK_GOTO(tr__act(m, &s->hn, mb->B, mb->T, c->dim), rc, fail);
  TR_CHECK_GOTO(tr__vec(m, &s->rstd, N), rc, fail);
  if (gpt2) {
    TR_CHECK_GOTO(tr__vec(m, &s->mean, N), rc, fail);
    TR_CHECK_GOTO(tr_kern_layernorm_fwd(&s->hn, &s->mean, &s->rstd, &s->x,
                                        W(m, blk, HEAD_NORM_W),
                                        W(m, blk, HEAD_NORM_B), c->norm_eps),
                  rc, fail);
  } else {
    TR_CHECK_GOTO(tr_kern_rmsnorm_fwd(&s->hn, &s->rstd, &s->x,
                                      W(m, blk, HEAD_NORM_W), c->norm_eps),
                  rc, fail);
  }
  tr_tensor_t* wout = W(m, blk, gpt2 ? HEAD_OUT_GPT2 : HEAD_OUT_LLAMA);
  tr_tensor_release(&mb->logits);
  TR_CHECK_GOTO(logits_buffer(m, mb), rc, fail);
  TR_CHECK_GOTO(tr_kern_linear_fwd(&mb->logits, &s->hn, wout, NULL), rc, fail);
  mb->loss_sum = 0.0;
  if (mb->targets.storage) {
    int64_t shape[2] = {mb->B, mb->T};
    tr_tensor_release(&mb->losses);
    TR_CHECK_GOTO(tr_tensor_empty(&mb->losses, TR_F32, m->device, 2, shape), rc,
                  fail);
    TR_CHECK_GOTO(tr__vec(m, &s->lse, N), rc, fail);
    if (mb->no_grad) {
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

static int head_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved) {
  head_saved_t* s = saved;
  const tr_model_config_t* c = &m->cfg;
  int gpt2 = c->family == TR_MODEL_GPT2;
  int rc;
  tr_tensor_t dhn = {0};
  if (!s->dlogits)
    TR_CHECK_GOTO(
        tr_kern_xent_bwd(&mb->logits, &s->lse, &mb->targets, loss_scale(mb)),
        rc, out);
  tr_tensor_t* wout = W(m, blk, gpt2 ? HEAD_OUT_GPT2 : HEAD_OUT_LLAMA);
  tr_tensor_t* dwout = G(m, blk, gpt2 ? HEAD_OUT_GPT2 : HEAD_OUT_LLAMA);
  TR_CHECK_GOTO(tr__act(m, &dhn, mb->B, mb->T, c->dim), rc, out);
  TR_CHECK_GOTO(/* dhn written whole: no zeroing */
                tr_kern_linear_bwd_write(&dhn, dwout, NULL, &mb->logits, &s->hn,
                                         wout),
                rc, out);
  tr_tensor_release(&mb->logits); /* dlogits are spent */
  tr_tensor_release(&mb->dhidden);
  TR_CHECK_GOTO(tr__act_zeros(m, &mb->dhidden, mb->B, mb->T, c->dim), rc, out);
  if (gpt2)
    rc = tr_kern_layernorm_bwd(&mb->dhidden, G(m, blk, HEAD_NORM_W),
                               G(m, blk, HEAD_NORM_B), &dhn, &s->x,
                               W(m, blk, HEAD_NORM_W), &s->mean, &s->rstd);
  else
    rc = tr_kern_rmsnorm_bwd(&mb->dhidden, G(m, blk, HEAD_NORM_W), &dhn, &s->x,
                             W(m, blk, HEAD_NORM_W), &s->rstd);
out:
  tr_tensor_release(&dhn);
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

int tr_model_block_backward(tr_model_t* m, tr_model_mb_t* mb, int blk) {
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
      rc = head_bwd(m, mb, blk, saved);
      head_free(saved);
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
