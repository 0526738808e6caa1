/* model/act.c: the helpers below the families — activation and statistics
 * buffers, the RoPE tables, and the tensor-parallel seam (the hook call,
 * and the linears around it that both families run: whole around the
 * blocking collectives, or chunk by chunk inside async tensor parallel's
 * rings). */
#include "config.h"

#include <string.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

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

int tr__act_copy(tr_model_t* m, tr_tensor_t* dst, const tr_tensor_t* src) {
  (void)m;
  TR_CHECK(
      tr_tensor_empty(dst, src->dtype, src->device, src->ndim, src->shape));
  int rc = tr_tensor_copy(dst, src);
  if (rc < 0) tr_tensor_release(dst);
  return rc;
}

int tr__vec(tr_model_t* m, tr_tensor_t* t, int64_t n) {
  return tr_tensor_empty(t, TR_F32, m->device, 1, &n);
}

void tr__release_all(tr_tensor_t* ts, int n) {
  for (int i = 0; i < n; i++) tr_tensor_release(&ts[i]);
}

int tr__act_i32(tr_model_t* m, tr_tensor_t* dst, const int32_t* src, int B,
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

/* ---- the tensor-parallel seam ---- */

int tr__tp(tr_model_t* m, tr_tp_point_t pt, tr_tp_op_t op, tr_tensor_t* t) {
  return m->tp.fn ? m->tp.fn(m->tp.arg, pt, op, t) : 0;
}

int tr__tp_sp(const tr_model_t* m) {
  return m->tp.fn && m->tp.sequence_parallel && m->tp.size > 1;
}

int tr__tp_rows(const tr_model_t* m, int T) {
  return tr__tp_sp(m) ? T / m->tp.size : T;
}

int tr__tp_reduce(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t) {
  return tr__tp(m, pt, tr__tp_sp(m) ? TR_TP_SCATTER : TR_TP_SUM, t);
}

int tr__tp_gather(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t) {
  return tr__tp_sp(m) ? tr__tp(m, pt, TR_TP_GATHER, t) : 0;
}

int tr__tp_out_grad(tr_model_t* m, const tr_tensor_t* d, tr_tensor_t* out) {
  tr_tensor_view(out, d);
  int rc = tr__tp_gather(m, TR_TP_BWD_OUT, out);
  if (rc < 0) tr_tensor_release(out);
  return rc;
}

int tr__tp_grads_begin(tr_model_t* m, tr__tp_grads_t* g, int n, tr_tensor_t* g0,
                       tr_tensor_t* g1) {
  memset(g, 0, sizeof *g);
  g->n = n;
  g->dst[0] = g0;
  g->dst[1] = g1;
  if (!tr__tp_sp(m)) {
    for (int i = 0; i < n; i++) tr_tensor_view(&g->part[i], g->dst[i]);
    return 0;
  }
  int64_t C = g0->shape[0], shape[1] = {n * C};
  int rc = tr_tensor_zeros(&g->buf, TR_F32, m->device, 1, shape);
  for (int i = 0; rc == 0 && i < n; i++)
    rc = tr_tensor_narrow(&g->part[i], &g->buf, 0, i * C, C);
  return rc < 0 ? tr__tp_grads_end(m, g, rc) : 0;
}

int tr__tp_grads_end(tr_model_t* m, tr__tp_grads_t* g, int rc) {
  if (rc == 0 && g->buf.storage) {
    rc = tr__tp(m, TR_TP_GRAD, TR_TP_SUM, &g->buf);
    for (int i = 0; rc == 0 && i < g->n; i++)
      rc = tr_kern_accumulate(g->dst[i], &g->part[i]);
  }
  tr__release_all(g->part, 2);
  tr_tensor_release(&g->buf);
  g->n = 0;
  return rc;
}

int tr__tp_keep_rows(tr_model_t* m, tr_tensor_t* t) {
  if (!tr__tp_sp(m)) return 0;
  int B = (int)t->shape[0], T = (int)t->shape[1], Tl = tr__tp_rows(m, T);
  int64_t t0 = (int64_t)m->tp.rank * Tl;
  tr_tensor_t out = {0};
  int rc;
  TR_CHECK(tr__act(m, &out, B, Tl, t->shape[2]));
  for (int b = 0; b < B; b++) { /* one contiguous run per batch row */
    tr_tensor_t src = {0}, dst = {0};
    rc = tr_tensor_narrow(&src, t, 0, b, 1);
    if (rc == 0) rc = tr_tensor_narrow(&src, &src, 1, t0, Tl);
    if (rc == 0) rc = tr_tensor_narrow(&dst, &out, 0, b, 1);
    if (rc == 0) rc = tr_tensor_copy(&dst, &src);
    tr_tensor_release(&src);
    tr_tensor_release(&dst);
    if (rc < 0) {
      tr_tensor_release(&out);
      return rc;
    }
  }
  tr_tensor_release(t);
  *t = out;
  return 0;
}

/* out [B, Tl, C] += the position rows [t0, t0 + Tl) of wpe, per batch row */
static int add_positions(tr_tensor_t* out, const tr_tensor_t* wpe, int64_t t0) {
  int64_t B = out->shape[0], Tl = out->shape[1], C = out->shape[2];
  int64_t rows[2] = {Tl, C};
  tr_tensor_t pos = {0};
  int rc = tr_tensor_narrow(&pos, wpe, 0, t0, Tl);
  for (int64_t b = 0; rc == 0 && b < B; b++) {
    tr_tensor_t o = {0};
    rc = tr_tensor_narrow(&o, out, 0, b, 1);
    if (rc == 0) rc = tr_tensor_reshape(&o, &o, 2, rows);
    if (rc == 0) rc = tr_kern_add(&o, &o, &pos);
    tr_tensor_release(&o);
  }
  tr_tensor_release(&pos);
  return rc;
}

/* out += wpe[pos[:, t0 : t0 + T']] for out's T' rows of each sequence */
static int add_positions_at(tr_model_t* m, tr_tensor_t* out,
                            const tr_tensor_t* wpe, const tr_tensor_t* pos,
                            int64_t t0) {
  tr_tensor_t rows = {0}, p = {0}, pe = {0};
  int rc = tr_tensor_narrow(&rows, pos, 1, t0, out->shape[1]);
  if (rc == 0) rc = tr_tensor_contiguous(&p, &rows);
  if (rc == 0)
    rc = tr__act(m, &pe, (int)out->shape[0], (int)out->shape[1], out->shape[2]);
  if (rc == 0) rc = tr_kern_embedding_fwd(&pe, &p, wpe, NULL);
  if (rc == 0) rc = tr_kern_add(out, out, &pe);
  tr_tensor_release(&rows);
  tr_tensor_release(&p);
  tr_tensor_release(&pe);
  return rc;
}

int tr__tp_embed(tr_model_t* m, tr_tensor_t* out, const tr_tensor_t* tokens,
                 const tr_tensor_t* pos, const tr_tensor_t* wte,
                 const tr_tensor_t* wpe) {
  int64_t V = m->cfg.vocab_size, Vl = wte->shape[0];
  if (tr__tp_sp(m) && out->shape[1] % m->tp.size) {
    TR_LOG_ERROR(MODEL,
                 "sequence parallel: tensor_parallel_degree %d does not "
                 "divide the sequence length %lld",
                 m->tp.size, (long long)out->shape[1]);
    return TR_ECONFIG;
  }
  if (Vl == V) { /* whole: the one-rank lookup, then this rank's rows */
    TR_CHECK(tr_kern_embedding_fwd(out, tokens, wte, pos ? NULL : wpe));
    if (pos && wpe) TR_CHECK(add_positions_at(m, out, wpe, pos, 0));
    return tr__tp_keep_rows(m, out);
  }
  TR_CHECK(tr_kern_embedding_rows_fwd(out, tokens, wte, m->tp.rank * Vl, V));
  TR_CHECK(tr__tp_reduce(m, TR_TP_EMBED_OUT, out));
  /* x + 0 is x: the sum is the one-rank lookup's bits, then the positions
   * are added once as the one-rank kernel adds them */
  if (!wpe) return 0;
  int64_t t0 = tr__tp_sp(m) ? m->tp.rank * out->shape[1] : 0;
  return pos ? add_positions_at(m, out, wpe, pos, t0)
             : add_positions(out, wpe, t0);
}

int tr__tp_embed_bwd(tr_model_t* m, tr_tensor_t* dwte, tr_tensor_t* dwpe,
                     const tr_tensor_t* dout, const tr_tensor_t* tokens,
                     const tr_tensor_t* pos) {
  int64_t Vl = dwte->shape[0];
  tr_tensor_t* dp = pos ? NULL : dwpe; /* with pos: its rows below */
  if (Vl == m->cfg.vocab_size)
    TR_CHECK(tr_kern_embedding_bwd(dwte, dp, dout, tokens));
  else
    TR_CHECK(
        tr_kern_embedding_rows_bwd(dwte, dp, dout, tokens, m->tp.rank * Vl));
  return pos && dwpe ? tr_kern_embedding_bwd(dwpe, NULL, dout, pos) : 0;
}

/* out [N, C] += bias broadcast over the rows: a rank-1 GEMM, ones [N, 1]
 * times bias [1, C] */
static int add_bias_rows(tr_tensor_t* out, const tr_tensor_t* bias) {
  int64_t C = bias->shape[0], N = tr_tensor_numel(out) / C;
  int64_t os[2] = {N, C}, bs[2] = {1, C}, ones_shape[2] = {N, 1};
  tr_tensor_t o2 = {0}, b2 = {0}, ones = {0};
  int rc;
  TR_CHECK_GOTO(tr_tensor_reshape(&o2, out, 2, os), rc, out);
  TR_CHECK_GOTO(tr_tensor_reshape(&b2, bias, 2, bs), rc, out);
  TR_CHECK_GOTO(
      tr_tensor_empty(&ones, bias->dtype, bias->device, 2, ones_shape), rc,
      out);
  TR_CHECK_GOTO(tr_tensor_fill(&ones, 1.0), rc, out);
  rc = tr_kern_gemm(&o2, &ones, 0, &b2, 0, 1.0f, 1.0f);
out:
  tr_tensor_release(&o2);
  tr_tensor_release(&b2);
  tr_tensor_release(&ones);
  return rc;
}

/* ---- linears around the seam, async tensor parallel ---- */

static int async_tp(const tr_model_t* m) {
  return m->tp.overlap && tr__tp_sp(m);
}

/* Rows [t0, t0 + n) of every sequence of t [B, T, W]: a batch-strided
 * [B, n, W] view, one operand of a single linear over the chunk (t NULL:
 * nothing) */
static int rows_of(tr_tensor_t* v, const tr_tensor_t* t, int64_t t0,
                   int64_t n) {
  return t ? tr_tensor_narrow(v, t, 1, t0, n) : 0;
}

/* One lin on whole tensors or on row views: out (or *o), x (or *x_in);
 * accumulate: DINP adds to out; grads: its dw and dbias (else none). */
static int lin_run(const tr__lin_t* l, tr_tensor_t* out, const tr_tensor_t* x,
                   tr_tensor_t* pre, const tr_tensor_t* inp, int accumulate,
                   int grads) {
  tr_tensor_t* dw = grads ? l->dw : NULL;
  tr_tensor_t* db = grads ? l->dbias : NULL;
  switch (l->kind) {
    case TR__LIN_FWD:
      return tr_kern_linear_fwd(out, x, l->w, l->bias);
    case TR__LIN_FWD_GELU:
      return tr_kern_linear_gelu_fwd(out, pre, x, l->w, l->bias);
    case TR__LIN_DINP:
      return accumulate ? tr_kern_linear_bwd(out, dw, db, x, inp, l->w)
                        : tr_kern_linear_bwd_write(out, dw, db, x, inp, l->w);
    case TR__LIN_DINP_DGELU:
      return tr_kern_linear_dgelu_bwd(out, dw, db, x, inp, l->w, pre);
  }
  return TR_EINVAL;
}

/* One lin on rows [t0, t0 + n) of every sequence, one kernel call (on
 * CUDA one strided-batched GEMM): part, contiguous [B, n, W], is its x
 * (out NULL: the column side) or its out (the row side); the other
 * operands are batch-strided views of the lin's [B, T, *] tensors. */
static int lin_rows(const tr__lin_t* l, tr_tensor_t* part, int64_t t0,
                    int64_t n, int accumulate) {
  tr_tensor_t o = {0}, x = {0}, pre = {0}, inp = {0};
  int col = l->x == NULL;
  int rc = rows_of(&o, col ? l->out : NULL, t0, n);
  if (rc == 0) rc = rows_of(&x, col ? NULL : l->x, t0, n);
  if (rc == 0) rc = rows_of(&pre, l->pre, t0, n);
  if (rc == 0) rc = rows_of(&inp, l->inp, t0, n);
  if (rc == 0)
    rc = lin_run(l, col ? &o : part, col ? part : &x, l->pre ? &pre : NULL,
                 l->inp ? &inp : NULL, accumulate, 0);
  tr_tensor_release(&o);
  tr_tensor_release(&x);
  tr_tensor_release(&pre);
  tr_tensor_release(&inp);
  return rc;
}

/* The weight and bias gradients of the DINP lins, whole, x NULL: x_all */
static int lin_grads(const tr__lin_t* lins, int n, const tr_tensor_t* x_all) {
  for (int i = 0; i < n; i++) {
    const tr__lin_t* l = &lins[i];
    if ((l->kind != TR__LIN_DINP && l->kind != TR__LIN_DINP_DGELU) ||
        (!l->dw && !l->dbias))
      continue;
    TR_CHECK(tr_kern_linear_bwd(NULL, l->dw, l->dbias, l->x ? l->x : x_all,
                                l->inp, l->w));
  }
  return 0;
}

typedef struct {
  const tr__lin_t* lins;
  int n;
} lin_chunk_t;

/* The column side's chunk: every lin on the gathered rows part. */
static int col_chunk(void* ctx, int64_t t0, int64_t n, tr_tensor_t* part) {
  const lin_chunk_t* c = ctx;
  for (int i = 0; i < c->n; i++)
    TR_CHECK(lin_rows(&c->lins[i], part, t0, n, 0));
  return 0;
}

/* The row side's chunk: the lins' sum into part. */
static int row_chunk(void* ctx, int64_t t0, int64_t n, tr_tensor_t* part) {
  const lin_chunk_t* c = ctx;
  for (int i = 0; i < c->n; i++)
    TR_CHECK(lin_rows(&c->lins[i], part, t0, n, i > 0));
  return 0;
}

int tr__tp_gather_linears(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t,
                          const tr__lin_t* lins, int n) {
  if (!async_tp(m)) { /* the gather, then the GEMMs whole */
    TR_CHECK(tr__tp_gather(m, pt, t));
    for (int i = 0; i < n; i++)
      TR_CHECK(
          lin_run(&lins[i], lins[i].out, t, lins[i].pre, lins[i].inp, 0, 1));
    return 0;
  }
  lin_chunk_t c = {lins, n};
  TR_CHECK(m->tp.overlap(m->tp.arg, pt, TR_TP_GATHER, t, col_chunk, &c));
  return lin_grads(lins, n, t);
}

int tr__tp_out_grad_linears(tr_model_t* m, const tr_tensor_t* d,
                            tr_tensor_t* out, const tr__lin_t* lins, int n) {
  tr_tensor_view(out, d);
  int rc = tr__tp_gather_linears(m, TR_TP_BWD_OUT, out, lins, n);
  if (rc < 0) tr_tensor_release(out);
  return rc;
}

int tr__tp_linears_reduce(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* out,
                          int64_t width, const tr__lin_t* lins, int n) {
  int B = (int)lins[0].x->shape[0], T = (int)lins[0].x->shape[1];
  int rc;
  if (!async_tp(m)) { /* the GEMMs whole, then the reduction */
    TR_CHECK(tr__act(m, out, B, T, width));
    for (int i = 0; i < n; i++)
      TR_CHECK_GOTO(
          lin_run(&lins[i], out, lins[i].x, lins[i].pre, lins[i].inp, i > 0, 1),
          rc, fail);
    TR_CHECK_GOTO(tr__tp_reduce(m, pt, out), rc, fail);
    return 0;
  }
  lin_chunk_t c = {lins, n};
  TR_CHECK(tr__act(m, out, B, tr__tp_rows(m, T), width));
  TR_CHECK_GOTO(m->tp.overlap(m->tp.arg, pt, TR_TP_SCATTER, out, row_chunk, &c),
                rc, fail);
  TR_CHECK_GOTO(lin_grads(lins, n, NULL), rc, fail);
  return 0;
fail:
  tr_tensor_release(out);
  return rc;
}

int tr__row_linear_fwd(tr_model_t* m, tr_tensor_t* out, const tr_tensor_t* inp,
                       const tr_tensor_t* w, const tr_tensor_t* bias) {
  if (!m->tp.fn) {
    TR_CHECK(
        tr__act(m, out, (int)inp->shape[0], (int)inp->shape[1], w->shape[0]));
    return tr_kern_linear_fwd(out, inp, w, bias);
  }
  tr__lin_t l = {.kind = TR__LIN_FWD, .x = inp, .w = w};
  TR_CHECK(tr__tp_linears_reduce(m, TR_TP_FWD_OUT, out, w->shape[0], &l, 1));
  return bias ? add_bias_rows(out, bias) : 0;
}
