/* model/mask.c: the attention mask of a micro-batch — per-row document
 * starts from the tokens ([model] attn_mask_type = "block_causal"), the
 * positions inside each document and their RoPE tables
 * ([model] document_positions), under context parallelism this rank's
 * rows and their positions in the whole sequence — and the layers' RoPE
 * and attention that read them. The sliding window is a number in the
 * config and needs nothing here. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"

/* cos/sin [B*mb->T, D/2] of each token's position pos[i] < T (RoPE) */
static int doc_rope_tables(tr_model_t* m, tr_model_mb_t* mb, const int32_t* pos,
                           int T) {
  int B = mb->B, half = m->cfg.head_dim / 2;
  int64_t N = (int64_t)B * mb->T, shape[2] = {N, half};
  float* tab = malloc(sizeof(float) * (size_t)T * half * 2);
  tr_tensor_t hc = {0}, hs = {0};
  int rc = TR_ENOMEM;
  if (!tab) return rc;
  float *tc = tab, *ts = tab + (size_t)T * half;
  TR_CHECK_GOTO(tr_kern_rope_table(tc, ts, T, m->cfg.head_dim,
                                   m->cfg.rope_theta, &m->cfg.rope_scaling),
                rc, out);
  TR_CHECK_GOTO(tr_tensor_empty(&hc, TR_F32, TR_DEVICE_CPU, 2, shape), rc, out);
  TR_CHECK_GOTO(tr_tensor_empty(&hs, TR_F32, TR_DEVICE_CPU, 2, shape), rc, out);
  float *c = tr_tensor_data(&hc), *s = tr_tensor_data(&hs);
  for (int64_t i = 0; i < N; i++)
    for (int j = 0; j < half; j++) {
      c[i * half + j] = tc[(int64_t)pos[i] * half + j];
      s[i * half + j] = ts[(int64_t)pos[i] * half + j];
    }
  TR_CHECK_GOTO(tr_tensor_empty(&mb->rope_cos, TR_F32, m->device, 2, shape), rc,
                out);
  TR_CHECK_GOTO(tr_tensor_empty(&mb->rope_sin, TR_F32, m->device, 2, shape), rc,
                out);
  TR_CHECK_GOTO(tr_tensor_copy(&mb->rope_cos, &hc), rc, out);
  TR_CHECK_GOTO(tr_tensor_copy(&mb->rope_sin, &hs), rc, out);
  rc = 0;
out:
  tr_tensor_release(&hc);
  tr_tensor_release(&hs);
  free(tab);
  return rc;
}

void tr__mask_cp_rows(const tr_model_t* m, int32_t* dst, const int32_t* src,
                      int B, int T) {
  int n = m->cp.size, c = T / (2 * n);
  int ch[2] = {m->cp.rank, 2 * n - 1 - m->cp.rank}; /* head-tail */
  for (int b = 0; b < B; b++)
    for (int i = 0; i < 2; i++)
      memcpy(dst + ((size_t)b * 2 + i) * c, src + (size_t)b * T + ch[i] * c,
             sizeof *dst * (size_t)c);
}

int tr__mask_mb_init(tr_model_t* m, tr_model_mb_t* mb, const int32_t* tokens,
                     int T) {
  const tr_model_config_t* c = &m->cfg;
  int block = c->attn_mask == TR_ATTN_BLOCK_CAUSAL;
  int cp = m->cp.fwd ? m->cp.size : 1;
  if (!block && cp == 1) return 0;
  int B = mb->B;
  size_t n = (size_t)B * T;
  int32_t* ds = malloc(sizeof(int32_t) * n * 3);
  if (!ds) return TR_ENOMEM;
  int32_t *pos = ds + n, *mine = pos + n;
  int rc;
  if (block) {
    tr_kern_attn_doc_start(ds, pos, tokens, B, T, c->eos_id);
    tr_kern_attn_doc_count(ds, B, T, &mb->n_docs, &mb->longest_doc);
    TR_CHECK_GOTO(tr__act_i32(m, &mb->doc_start, ds, B, T), rc, out);
  }
  rc = 0;
  int doc_pos = block && c->document_positions;
  if (!doc_pos && cp == 1) goto out; /* positions 0..T-1: the model's */
  if (!doc_pos) /* each token's place in the whole sequence */
    for (size_t i = 0; i < n; i++) pos[i] = (int32_t)(i % (size_t)T);
  if (cp > 1) tr__mask_cp_rows(m, mine, pos, B, T);
  const int32_t* p = cp > 1 ? mine : pos;
  if (c->rope_theta > 0) /* RoPE (Llama) */
    TR_CHECK_GOTO(doc_rope_tables(m, mb, p, T), rc, out);
  else /* a position table (GPT-2) */
    TR_CHECK_GOTO(tr__act_i32(m, &mb->pos, p, B, mb->T), rc, out);
out:
  free(ds);
  return rc;
}

void tr__mask_mb_release(tr_model_mb_t* mb) {
  tr_tensor_release(&mb->doc_start);
  tr_tensor_release(&mb->pos);
  tr_tensor_release(&mb->rope_cos);
  tr_tensor_release(&mb->rope_sin);
  mb->n_docs = mb->longest_doc = 0;
}

const tr_tensor_t* tr__mask_doc_start(const tr_model_mb_t* mb) {
  return mb->doc_start.storage ? &mb->doc_start : NULL;
}

const tr_tensor_t* tr__mask_pos(const tr_model_mb_t* mb) {
  return mb->pos.storage ? &mb->pos : NULL;
}

int tr__mask_rope(tr_model_t* m, const tr_model_mb_t* mb, tr_tensor_t* x,
                  int heads, int inverse) {
  if (!mb->rope_cos.storage)
    return tr_kern_rope(x, heads, &m->rope_cos, &m->rope_sin, inverse);
  /* one row of B*T tokens, each with its own angle table row */
  int64_t shape[3] = {1, (int64_t)mb->B * mb->T, x->shape[2]};
  tr_tensor_t flat = {0};
  TR_CHECK(tr_tensor_reshape(&flat, x, 3, shape));
  int rc = tr_kern_rope(&flat, heads, &mb->rope_cos, &mb->rope_sin, inverse);
  tr_tensor_release(&flat);
  return rc;
}

int tr__attention_fwd(tr_model_t* m, const tr_model_mb_t* mb, tr_tensor_t* out,
                      tr_tensor_t* lse, const tr_tensor_t* q,
                      const tr_tensor_t* k, const tr_tensor_t* v, int H,
                      int KVH) {
  if (m->cp.fwd)
    return m->cp.fwd(m->cp.arg, out, lse, q, k, v, H, KVH,
                     tr__mask_doc_start(mb), m->cfg.sliding_window);
  return tr_kern_attention_docs_fwd(out, lse, q, k, v, H, KVH,
                                    tr__mask_doc_start(mb), mb->n_docs,
                                    mb->longest_doc, m->cfg.sliding_window, 0);
}

int tr__attention_bwd(tr_model_t* m, const tr_model_mb_t* mb, tr_tensor_t* dq,
                      tr_tensor_t* dk, tr_tensor_t* dv, const tr_tensor_t* dout,
                      const tr_tensor_t* q, const tr_tensor_t* k,
                      const tr_tensor_t* v, const tr_tensor_t* out,
                      const tr_tensor_t* lse, int H, int KVH) {
  if (m->cp.bwd)
    return m->cp.bwd(m->cp.arg, dq, dk, dv, dout, q, k, v, out, lse, H, KVH,
                     tr__mask_doc_start(mb), m->cfg.sliding_window);
  return tr_kern_attention_docs_bwd(dq, dk, dv, dout, q, k, v, out, lse, H, KVH,
                                    tr__mask_doc_start(mb), mb->n_docs,
                                    mb->longest_doc, m->cfg.sliding_window, 0);
}
