/* model/act.c: the helpers below the families — activation and statistics
 * buffers, the RoPE tables, and the tensor-parallel seam (the hook call and
 * the row-parallel linear forward that both families run). */
#include "config.h"

#include "model/internal.h"
#include "trainrun/error.h"

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

int tr__tp(tr_model_t* m, tr_tp_point_t pt, tr_tensor_t* t) {
  return m->tp.reduce ? m->tp.reduce(m->tp.arg, pt, t) : 0;
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

int tr__row_linear_fwd(tr_model_t* m, tr_tensor_t* out, const tr_tensor_t* inp,
                       const tr_tensor_t* w, const tr_tensor_t* bias) {
  if (!m->tp.reduce) return tr_kern_linear_fwd(out, inp, w, bias);
  TR_CHECK(tr_kern_linear_fwd(out, inp, w, NULL));
  TR_CHECK(tr__tp(m, TR_TP_FWD_OUT, out));
  return bias ? add_bias_rows(out, bias) : 0;
}
