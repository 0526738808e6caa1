/* dtensor/cp.c: context parallelism (trainrun/cp.h): head-tail chunk
 * assignment; the core -- each query chunk's attention against each
 * key/value chunk at or before it through the shifted-chunk attention
 * kernels, with the pair's mask (document starts relative to the key
 * chunk, the sliding window), the log-sum-exp merge, and the backward
 * pair by pair; the ring that moves the key/value chunks over the cp
 * group (all-gather + reduce-scatter, or rotation with send/recv); and
 * the model seam that runs it. The chunks are copied out of and back into
 * the [B, T, W] tensors (rows of several batches are not one strided
 * view; on a device, batch by batch).
 *
 * Every buffer lives on q's device in q's dtype (lse and the merge's
 * accumulator in float32). On the CPU the merge keeps the accumulator in
 * double on the host; on a device it is tr_kern_attn_merge's float32
 * accumulator, and the document starts of a pair are derived on the host
 * and copied up. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/cp.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/log.h"

int tr_cp_headtail(int n, int rank, int chunks[2]) {
  if (n < 1 || rank < 0 || rank >= n) return TR_EINVAL;
  chunks[0] = rank;
  chunks[1] = 2 * n - 1 - rank;
  return 0;
}

int tr_cp_rotate_parse(const char* name, tr_cp_rotate_t* out) {
  if (strcmp(name, "allgather") == 0)
    *out = TR_CP_ALLGATHER;
  else if (strcmp(name, "alltoall") == 0)
    *out = TR_CP_ALLTOALL;
  else
    return TR_EINVAL;
  return 0;
}

/* dst = src (same shape). Device copies take contiguous runs only: on a
 * device, views that are not both contiguous are split along their first
 * dim of more than one element until they are (a chunk of [B, T, W] is
 * copied batch by batch). */
static int copy_views(tr_tensor_t* dst, const tr_tensor_t* src) {
  if ((dst->device.type == TR_DEV_CPU && src->device.type == TR_DEV_CPU) ||
      (tr_tensor_is_contiguous(dst) && tr_tensor_is_contiguous(src)))
    return tr_tensor_copy(dst, src);
  if (!tr_tensor_same_shape(dst, src)) return TR_ESHAPE;
  int d = 0;
  while (d < dst->ndim && dst->shape[d] == 1) d++;
  if (d == dst->ndim) return tr_tensor_copy(dst, src);
  int rc = 0;
  for (int64_t j = 0; j < dst->shape[d] && rc == 0; j++) {
    tr_tensor_t a = {0}, b = {0};
    rc = tr_tensor_narrow(&a, dst, d, j, 1);
    if (rc == 0) rc = tr_tensor_narrow(&b, src, d, j, 1);
    if (rc == 0) rc = copy_views(&a, &b);
    tr_tensor_release(&a);
    tr_tensor_release(&b);
  }
  return rc;
}

/* chunk i (c elements of dim) of x, contiguous (a view when it is) */
static int take(tr_tensor_t* dst, const tr_tensor_t* x, int dim, int i,
                int64_t c) {
  tr_tensor_t view = {0};
  TR_CHECK(tr_tensor_narrow(&view, x, dim, i * c, c));
  int rc;
  if (x->device.type == TR_DEV_CPU || tr_tensor_is_contiguous(&view)) {
    rc = tr_tensor_contiguous(dst, &view);
  } else {
    rc = tr_tensor_empty(dst, x->dtype, x->device, view.ndim, view.shape);
    if (rc == 0) rc = copy_views(dst, &view);
  }
  tr_tensor_release(&view);
  return rc;
}

/* chunk i (c elements of dim) of x = src */
static int put(tr_tensor_t* x, int dim, int i, int64_t c,
               const tr_tensor_t* src) {
  tr_tensor_t view = {0};
  TR_CHECK(tr_tensor_narrow(&view, x, dim, i * c, c));
  int rc = copy_views(&view, src);
  tr_tensor_release(&view);
  return rc;
}

/* zeros [a, b, c] of dtype dt on dev */
static int zeros3(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev, int64_t a,
                  int64_t b, int64_t c) {
  int64_t shape[3] = {a, b, c};
  return tr_tensor_zeros(t, dt, dev, 3, shape);
}

/* [a, b, c] of dtype dt on dev, for a kernel that writes every element */
static int empty3(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev, int64_t a,
                  int64_t b, int64_t c) {
  int64_t shape[3] = {a, b, c};
  return tr_tensor_empty(t, dt, dev, 3, shape);
}

/* chunk j of x (dim 1) += add: in place when the chunk is contiguous (one
 * sequence), else through a contiguous copy */
static int add_to(tr_tensor_t* x, int j, int64_t c, const tr_tensor_t* add) {
  tr_tensor_t cur = {0};
  TR_CHECK(tr_tensor_narrow(&cur, x, 1, j * c, c));
  int rc;
  if (tr_tensor_is_contiguous(&cur)) {
    rc = tr_kern_accumulate(&cur, add);
  } else {
    tr_tensor_release(&cur);
    TR_CHECK(take(&cur, x, 1, j, c));
    rc = tr_kern_accumulate(&cur, add);
    if (rc == 0) rc = put(x, 1, j, c, &cur);
  }
  tr_tensor_release(&cur);
  return rc;
}

/* The gradient of chunk j of x (dim 1) for a pair to write: the chunk
 * itself when *fresh (nothing added to it yet) and it is contiguous, so
 * the kernel overwrites it (*direct = 1, *fresh = 0); else a scratch
 * tensor (*direct = 0) that add_to adds afterwards. */
static int grad_dst(tr_tensor_t* dst, tr_tensor_t* x, int j, int64_t c,
                    uint8_t* fresh, int* direct) {
  *direct = 0;
  if (*fresh) {
    TR_CHECK(tr_tensor_narrow(dst, x, 1, j * c, c));
    if (tr_tensor_is_contiguous(dst)) {
      *direct = 1;
      *fresh = 0;
      return 0;
    }
    tr_tensor_release(dst);
  }
  return empty3(dst, x->dtype, x->device, x->shape[0], c, x->shape[2]);
}

/* t is a 3-d tensor of dtype dt on dev */
static int check3(const tr_tensor_t* t, const char* what, tr_dtype_t dt,
                  tr_device_t dev) {
  char buf[32];
  if (t && t->ndim == 3 && t->dtype == dt && tr_device_eq(t->device, dev))
    return 0;
  TR_LOG_ERROR(DT, "cp attention: %s is not a 3-d %s tensor on %s", what,
               tr_dtype_name(dt), tr_device_str(dev, buf, sizeof buf));
  return TR_EUNSUPPORTED;
}

/* What every pair shares: the mask, the heads, the chunk length, where
 * the buffers live. */
typedef struct {
  const tr_tensor_t* ds; /* [B, n_chunks*c] int32, or NULL */
  int window;
  int H, KVH;
  int64_t c;
  tr_dtype_t dt;   /* q's: the pairs' out and gradients */
  tr_device_t dev; /* q's */
} pair_t;

static int check_mask(const pair_t* p, int64_t B, int n_chunks) {
  if (p->window < 0) {
    TR_LOG_ERROR(DT, "cp attention: sliding window %d is negative", p->window);
    return TR_EINVAL;
  }
  if (!p->ds) return 0;
  if (!tr_device_eq(p->ds->device, p->dev) || p->ds->dtype != TR_I32 ||
      !tr_tensor_is_contiguous(p->ds) ||
      tr_tensor_numel(p->ds) != B * n_chunks * p->c) {
    TR_LOG_ERROR(DT,
                 "cp attention: doc_start is not a [%lld, %lld] int32 "
                 "tensor of the whole sequence on q's device",
                 (long long)B, (long long)(n_chunks * p->c));
    return TR_ESHAPE;
  }
  return 0;
}

/* The pair kernels' common arguments (q's dtype and device), the mask
 * checked against B sequences of n_chunks chunks. */
static int pair_init(pair_t* p, const tr_tensor_t* q,
                     const tr_tensor_t* doc_start, int window, int n_heads,
                     int n_kv_heads, int64_t c, int64_t B, int n_chunks) {
  *p = (pair_t){.ds = doc_start,
                .window = window,
                .H = n_heads,
                .KVH = n_kv_heads,
                .c = c,
                .dt = q->dtype,
                .dev = q->device};
  return check_mask(p, B, n_chunks);
}

/* 1 when some row of query chunk qc may see a key of chunk kc */
static int visible(const pair_t* p, int qc, int kc) {
  if (kc > qc) return 0;
  return !(p->window > 0 && kc < qc && (qc - kc - 1) * p->c + 1 >= p->window);
}

/* The document starts of query chunk qc's rows relative to key chunk kc,
 * [B, c] int32 on the pair's device (a start before the key chunk is its
 * row 0); derived on the host. */
static int rel_starts(const pair_t* p, tr_tensor_t* dst, int qc, int kc) {
  int64_t B = p->ds->shape[0], T = tr_tensor_numel(p->ds) / B, c = p->c;
  int64_t shape[2] = {B, c};
  int on_cpu = p->dev.type == TR_DEV_CPU;
  tr_tensor_t hs = {0}, hd = {0};
  int rc = 0;
  if (on_cpu) {
    tr_tensor_view(&hs, p->ds);
  } else {
    TR_CHECK(
        tr_tensor_empty(&hs, TR_I32, TR_DEVICE_CPU, p->ds->ndim, p->ds->shape));
    TR_CHECK_GOTO(tr_tensor_copy(&hs, p->ds), rc, out);
  }
  TR_CHECK_GOTO(tr_tensor_empty(&hd, TR_I32, TR_DEVICE_CPU, 2, shape), rc, out);
  const int32_t* s = tr_tensor_data(&hs);
  int32_t* d = tr_tensor_data(&hd);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < c; i++) {
      int64_t v = s[b * T + qc * c + i] - kc * c;
      d[b * c + i] = v > 0 ? (int32_t)v : 0;
    }
  if (on_cpu) {
    *dst = hd;
    hd = (tr_tensor_t){0};
  } else {
    TR_CHECK_GOTO(tr_tensor_empty(dst, TR_I32, p->dev, 2, shape), rc, out);
    rc = tr_tensor_copy(dst, &hd);
  }
out:
  tr_tensor_release(&hs);
  tr_tensor_release(&hd);
  return rc;
}

static int pair_fwd(const pair_t* p, tr_tensor_t* po, tr_tensor_t* pl,
                    const tr_tensor_t* qt, const tr_tensor_t* kt,
                    const tr_tensor_t* vt, int qc, int kc) {
  tr_tensor_t rel = {0};
  if (p->ds) TR_CHECK(rel_starts(p, &rel, qc, kc));
  int rc = tr_kern_attention_masked_fwd(po, pl, qt, kt, vt, p->H, p->KVH,
                                        p->ds ? &rel : NULL, p->window,
                                        (int)((qc - kc) * p->c));
  tr_tensor_release(&rel);
  return rc;
}

static int pair_bwd(const pair_t* p, tr_tensor_t* tq, tr_tensor_t* tk,
                    tr_tensor_t* tv, const tr_tensor_t* gt,
                    const tr_tensor_t* qt, const tr_tensor_t* kt,
                    const tr_tensor_t* vt, const tr_tensor_t* ot,
                    const tr_tensor_t* lt, int qc, int kc) {
  tr_tensor_t rel = {0};
  if (p->ds) TR_CHECK(rel_starts(p, &rel, qc, kc));
  int rc = tr_kern_attention_masked_bwd(tq, tk, tv, gt, qt, kt, vt, ot, lt,
                                        p->H, p->KVH, p->ds ? &rel : NULL,
                                        p->window, (int)((qc - kc) * p->c));
  tr_tensor_release(&rel);
  return rc;
}

/* ---- the merge ---- */

/* One query chunk's merged result so far: out [B, c, H*D], lse [B, H, c]
 * (-inf: no key seen yet); in double on the host for CPU tensors (o, l),
 * else float32 tensors on the device (to, tl) that tr_kern_attn_merge
 * updates. */
typedef struct {
  double* o;
  double* l;
  tr_tensor_t to, tl;
  tr_dtype_t dt; /* the out it is put into */
  tr_device_t dev;
  int64_t B, c, D;
  int H;
} acc_t;

static int acc_init(acc_t* a, const pair_t* p, int64_t B, int64_t D) {
  int64_t c = p->c;
  a->B = B;
  a->c = c;
  a->H = p->H;
  a->D = D;
  a->dt = p->dt;
  a->dev = p->dev;
  if (p->dev.type != TR_DEV_CPU) {
    TR_CHECK(zeros3(&a->to, TR_F32, p->dev, B, c, p->H * D));
    TR_CHECK(zeros3(&a->tl, TR_F32, p->dev, B, p->H, c));
    return tr_tensor_fill(&a->tl, -INFINITY);
  }
  a->o = calloc((size_t)(B * c * p->H * D), sizeof *a->o);
  a->l = malloc(sizeof *a->l * (size_t)(B * p->H * c));
  if (!a->o || !a->l) return TR_ENOMEM;
  for (int64_t i = 0; i < B * p->H * c; i++) a->l[i] = -INFINITY;
  return 0;
}

static void acc_release(acc_t* a) {
  free(a->o);
  free(a->l);
  tr_tensor_release(&a->to);
  tr_tensor_release(&a->tl);
  memset(a, 0, sizeof *a);
}

/* a merged with a partial result po [B,c,H*D], pl [B,H,c] */
static int acc_add(acc_t* a, const tr_tensor_t* po, const tr_tensor_t* pl) {
  if (a->dev.type != TR_DEV_CPU)
    return tr_kern_attn_merge(&a->to, &a->tl, po, pl, a->H);
  const float* o = tr_tensor_data(po);
  const float* l = tr_tensor_data(pl);
  int64_t HD = a->H * a->D;
  for (int64_t b = 0; b < a->B; b++)
    for (int h = 0; h < a->H; h++)
      for (int64_t t = 0; t < a->c; t++) {
        int64_t li = (b * a->H + h) * a->c + t;
        double x = a->l[li], y = l[li], mx = x > y ? x : y;
        if (mx == -INFINITY) continue; /* neither has seen a key */
        double L = mx + log(exp(x - mx) + exp(y - mx));
        double wx = exp(x - L), wy = exp(y - L);
        a->l[li] = L;
        double* ao = a->o + (b * a->c + t) * HD + h * a->D;
        const float* po_ = o + (b * a->c + t) * HD + h * a->D;
        for (int64_t d = 0; d < a->D; d++) ao[d] = wx * ao[d] + wy * po_[d];
      }
  return 0;
}

/* chunk i of out (dim 1) and lse (dim 2) = a */
static int acc_put(const acc_t* a, tr_tensor_t* out, tr_tensor_t* lse, int i) {
  tr_tensor_t mo = {0}, ml = {0};
  int rc;
  if (a->dev.type != TR_DEV_CPU) { /* out in its dtype, lse as it is */
    TR_CHECK_GOTO(tr_tensor_narrow(&ml, out, 1, i * a->c, a->c), rc, out);
    if (tr_tensor_is_contiguous(&ml)) { /* converted straight into out */
      TR_CHECK_GOTO(tr_tensor_copy(&ml, &a->to), rc, out);
    } else {
      TR_CHECK_GOTO(empty3(&mo, a->dt, a->dev, a->B, a->c, a->H * a->D), rc,
                    out);
      TR_CHECK_GOTO(tr_tensor_copy(&mo, &a->to), rc, out);
      TR_CHECK_GOTO(put(out, 1, i, a->c, &mo), rc, out);
    }
    rc = put(lse, 2, i, a->c, &a->tl);
    goto out;
  }
  int64_t n_o = a->B * a->c * a->H * a->D, n_l = a->B * a->H * a->c;
  TR_CHECK_GOTO(zeros3(&mo, TR_F32, TR_DEVICE_CPU, a->B, a->c, a->H * a->D), rc,
                out);
  TR_CHECK_GOTO(zeros3(&ml, TR_F32, TR_DEVICE_CPU, a->B, a->H, a->c), rc, out);
  float* o = tr_tensor_data(&mo);
  float* l = tr_tensor_data(&ml);
  for (int64_t j = 0; j < n_o; j++) o[j] = (float)a->o[j];
  for (int64_t j = 0; j < n_l; j++) l[j] = (float)a->l[j];
  TR_CHECK_GOTO(put(out, 1, i, a->c, &mo), rc, out);
  rc = put(lse, 2, i, a->c, &ml);
out:
  tr_tensor_release(&mo);
  tr_tensor_release(&ml);
  return rc;
}

/* ---- the pairs of the chunks at hand ---- */

/* The query chunks qcs[0..nq) (rows of q) against the key chunks
 * kcs[0..nk) held in k, v (their rows in that order), merged into
 * acc[0..nq). */
static int fwd_held(const pair_t* p, acc_t* acc, const tr_tensor_t* q,
                    const int* qcs, int nq, const tr_tensor_t* k,
                    const tr_tensor_t* v, const int* kcs, int nk) {
  int64_t B = q->shape[0], HD = q->shape[2], c = p->c;
  int rc = 0;
  for (int i = 0; i < nq && rc == 0; i++) {
    tr_tensor_t qt = {0};
    TR_CHECK(take(&qt, q, 1, i, c));
    for (int j = 0; j < nk && rc == 0; j++) {
      if (!visible(p, qcs[i], kcs[j])) continue;
      tr_tensor_t kt = {0}, vt = {0}, po = {0}, pl = {0};
      rc = take(&kt, k, 1, j, c);
      if (rc == 0) rc = take(&vt, v, 1, j, c);
      if (rc == 0) rc = empty3(&po, p->dt, p->dev, B, c, HD);
      if (rc == 0) rc = empty3(&pl, TR_F32, p->dev, B, p->H, c);
      if (rc == 0) rc = pair_fwd(p, &po, &pl, &qt, &kt, &vt, qcs[i], kcs[j]);
      if (rc == 0) rc = acc_add(&acc[i], &po, &pl);
      tr_tensor_t* ts[] = {&kt, &vt, &po, &pl};
      for (int t = 0; t < 4; t++) tr_tensor_release(ts[t]);
    }
    tr_tensor_release(&qt);
  }
  return rc;
}

/* The backward of fwd_held's pairs: dq (like q) += each query chunk's
 * gradient, dk, dv (like k, v) += each held key chunk's. qf[i] (kf[j]):
 * query chunk i's rows of dq (key chunk j's of dk and dv) are still zero,
 * so the first pair may write them (grad_dst); cleared as they are. */
static int bwd_held(const pair_t* p, tr_tensor_t* dq, tr_tensor_t* dk,
                    tr_tensor_t* dv, const tr_tensor_t* dout,
                    const tr_tensor_t* q, const tr_tensor_t* out,
                    const tr_tensor_t* lse, const int* qcs, int nq,
                    const tr_tensor_t* k, const tr_tensor_t* v, const int* kcs,
                    int nk, uint8_t* qf, uint8_t* kf) {
  int64_t c = p->c;
  int rc = 0;
  for (int i = 0; i < nq && rc == 0; i++) {
    tr_tensor_t qt = {0}, ot = {0}, gt = {0}, lt = {0};
    rc = take(&qt, q, 1, i, c);
    if (rc == 0) rc = take(&ot, out, 1, i, c);
    if (rc == 0) rc = take(&gt, dout, 1, i, c);
    if (rc == 0) rc = take(&lt, lse, 2, i, c);
    for (int j = 0; j < nk && rc == 0; j++) {
      if (!visible(p, qcs[i], kcs[j])) continue;
      tr_tensor_t kt = {0}, vt = {0}, tq = {0}, tk = {0}, tv = {0};
      int q_direct = 0, kv_direct = 0;
      uint8_t kf_v = kf[j]; /* dv's chunk is as fresh as dk's */
      rc = take(&kt, k, 1, j, c);
      if (rc == 0) rc = take(&vt, v, 1, j, c);
      if (rc == 0) rc = grad_dst(&tq, dq, i, c, &qf[i], &q_direct);
      if (rc == 0) rc = grad_dst(&tk, dk, j, c, &kf[j], &kv_direct);
      if (rc == 0) rc = grad_dst(&tv, dv, j, c, &kf_v, &kv_direct);
      if (rc == 0)
        rc = pair_bwd(p, &tq, &tk, &tv, &gt, &qt, &kt, &vt, &ot, &lt, qcs[i],
                      kcs[j]);
      if (rc == 0 && !q_direct) rc = add_to(dq, i, c, &tq);
      if (rc == 0 && !kv_direct) rc = add_to(dk, j, c, &tk);
      if (rc == 0 && !kv_direct) rc = add_to(dv, j, c, &tv);
      tr_tensor_t* ts[] = {&kt, &vt, &tq, &tk, &tv};
      for (int t = 0; t < 5; t++) tr_tensor_release(ts[t]);
    }
    tr_tensor_t* ts[] = {&qt, &ot, &gt, &lt};
    for (int t = 0; t < 4; t++) tr_tensor_release(ts[t]);
  }
  return rc;
}

/* ---- the core ---- */

/* the shapes of trainrun/cp.h; *c = chunk length */
static int shapes(const tr_tensor_t* q, const tr_tensor_t* k,
                  const tr_tensor_t* v, const tr_tensor_t* out,
                  const tr_tensor_t* lse, int H, const int* q_chunks, int nq,
                  int n_chunks, int64_t* c) {
  if (!q || (q->dtype != TR_F32 && q->dtype != TR_BF16)) {
    TR_LOG_ERROR(DT, "cp attention: q is not float32 or bfloat16");
    return TR_EUNSUPPORTED;
  }
  TR_CHECK(check3(q, "q", q->dtype, q->device));
  TR_CHECK(check3(k, "k", q->dtype, q->device));
  TR_CHECK(check3(v, "v", q->dtype, q->device));
  TR_CHECK(check3(out, "out", q->dtype, q->device));
  TR_CHECK(check3(lse, "lse", TR_F32, q->device));
  if (n_chunks < 1 || nq < 1 || k->shape[1] % n_chunks) {
    TR_LOG_ERROR(DT, "cp attention: %lld keys do not split into %d chunks",
                 (long long)k->shape[1], n_chunks);
    return TR_ESHAPE;
  }
  *c = k->shape[1] / n_chunks;
  int64_t B = q->shape[0];
  if (q->shape[1] != nq * *c || k->shape[0] != B ||
      !tr_tensor_same_shape(k, v) || !tr_tensor_same_shape(out, q) ||
      lse->shape[0] != B || lse->shape[1] != H || lse->shape[2] != nq * *c) {
    TR_LOG_ERROR(DT,
                 "cp attention: q, out [B, %d*%lld, H*D], k, v "
                 "[B, %d*%lld, KVH*D] and lse [B, H, %d*%lld] expected",
                 nq, (long long)*c, n_chunks, (long long)*c, nq, (long long)*c);
    return TR_ESHAPE;
  }
  for (int i = 0; i < nq; i++)
    if (q_chunks[i] < 0 || q_chunks[i] >= n_chunks) {
      TR_LOG_ERROR(DT, "cp attention: query chunk %d is not one of %d",
                   q_chunks[i], n_chunks);
      return TR_EINVAL;
    }
  return 0;
}

static int* seq_chunks(int n) {
  int* kcs = malloc(sizeof *kcs * (size_t)n);
  for (int j = 0; kcs && j < n; j++) kcs[j] = j;
  return kcs;
}

int tr_cp_attention_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                        const tr_tensor_t* q, const tr_tensor_t* k,
                        const tr_tensor_t* v, int n_heads, int n_kv_heads,
                        const int* q_chunks, int nq, int n_chunks,
                        const tr_tensor_t* doc_start, int window) {
  int64_t c;
  TR_CHECK(shapes(q, k, v, out, lse, n_heads, q_chunks, nq, n_chunks, &c));
  pair_t p;
  int64_t B = q->shape[0], D = q->shape[2] / n_heads;
  TR_CHECK(
      pair_init(&p, q, doc_start, window, n_heads, n_kv_heads, c, B, n_chunks));
  acc_t* acc = calloc((size_t)nq, sizeof *acc);
  int* kcs = seq_chunks(n_chunks);
  int rc = acc && kcs ? 0 : TR_ENOMEM;
  for (int i = 0; i < nq && rc == 0; i++) rc = acc_init(&acc[i], &p, B, D);
  if (rc == 0) rc = fwd_held(&p, acc, q, q_chunks, nq, k, v, kcs, n_chunks);
  for (int i = 0; i < nq && rc == 0; i++) rc = acc_put(&acc[i], out, lse, i);
  for (int i = 0; acc && i < nq; i++) acc_release(&acc[i]);
  free(acc);
  free(kcs);
  return rc;
}

static int bwd_args(const tr_tensor_t* dq, const tr_tensor_t* dk,
                    const tr_tensor_t* dv, const tr_tensor_t* dout,
                    const tr_tensor_t* q, const tr_tensor_t* k,
                    const tr_tensor_t* v) {
  TR_CHECK(check3(dq, "dq", q->dtype, q->device));
  TR_CHECK(check3(dk, "dk", q->dtype, q->device));
  TR_CHECK(check3(dv, "dv", q->dtype, q->device));
  TR_CHECK(check3(dout, "dout", q->dtype, q->device));
  if (!tr_tensor_same_shape(dq, q) || !tr_tensor_same_shape(dout, q) ||
      !tr_tensor_same_shape(dk, k) || !tr_tensor_same_shape(dv, v)) {
    TR_LOG_ERROR(DT,
                 "cp attention: gradients of other shapes than "
                 "their tensors");
    return TR_ESHAPE;
  }
  return 0;
}

int tr_cp_attention_bwd(tr_tensor_t* dq, tr_tensor_t* dk, tr_tensor_t* dv,
                        const tr_tensor_t* dout, const tr_tensor_t* q,
                        const tr_tensor_t* k, const tr_tensor_t* v,
                        const tr_tensor_t* out, const tr_tensor_t* lse,
                        int n_heads, int n_kv_heads, const int* q_chunks,
                        int nq, int n_chunks, const tr_tensor_t* doc_start,
                        int window) {
  int64_t c;
  TR_CHECK(shapes(q, k, v, out, lse, n_heads, q_chunks, nq, n_chunks, &c));
  TR_CHECK(bwd_args(dq, dk, dv, dout, q, k, v));
  pair_t p;
  TR_CHECK(pair_init(&p, q, doc_start, window, n_heads, n_kv_heads, c,
                     q->shape[0], n_chunks));
  TR_CHECK(tr_tensor_fill(dq, 0.0));
  TR_CHECK(tr_tensor_fill(dk, 0.0));
  TR_CHECK(tr_tensor_fill(dv, 0.0));
  int* kcs = seq_chunks(n_chunks);
  uint8_t* fresh = malloc((size_t)(nq + n_chunks));
  int rc = kcs && fresh ? 0 : TR_ENOMEM;
  if (rc == 0) {
    memset(fresh, 1, (size_t)(nq + n_chunks));
    rc = bwd_held(&p, dq, dk, dv, dout, q, out, lse, q_chunks, nq, k, v, kcs,
                  n_chunks, fresh, fresh + nq);
  }
  free(kcs);
  free(fresh);
  return rc;
}

/* ---- the ring ---- */

/* The run of rank rr's local [B, 2c, W] in a flat [n][B][2c][W] buffer,
 * as a [B, 2c, W] view, narrowed to its chunk i ([B, c, W]). */
static int flat_chunk(tr_tensor_t* f, const tr_tensor_t* flat, int rr, int i,
                      int64_t B, int64_t c, int64_t W) {
  int64_t run = B * 2 * c * W, shape[3] = {B, 2 * c, W};
  TR_CHECK(tr_tensor_narrow(f, flat, 0, rr * run, run));
  TR_CHECK(tr_tensor_reshape(f, f, 3, shape));
  return tr_tensor_narrow(f, f, 1, i * c, c);
}

/* Every rank's [B, 2c, W] chunk pair in *full [B, 2nc, W], in sequence
 * order. */
static int seq_gather(tr_pg_t* pg, const tr_tensor_t* local,
                      tr_tensor_t* full) {
  int n = tr_pg_size(pg);
  int64_t B = local->shape[0], c = local->shape[1] / 2, W = local->shape[2];
  int64_t flat_shape[1] = {n * B * 2 * c * W};
  tr_tensor_t src = {0}, flat = {0};
  int rc;
  TR_CHECK(tr_tensor_contiguous(&src, local));
  TR_CHECK_GOTO(
      tr_tensor_empty(&flat, local->dtype, local->device, 1, flat_shape), rc,
      out);
  TR_CHECK_GOTO(zeros3(full, local->dtype, local->device, B, 2 * n * c, W), rc,
                out);
  TR_CHECK_GOTO(tr_pg_all_gather(pg, &flat, &src, NULL), rc, out);
  for (int rr = 0; rr < n; rr++) {
    int ch[2];
    tr_cp_headtail(n, rr, ch);
    for (int i = 0; i < 2; i++) {
      tr_tensor_t f = {0};
      rc = flat_chunk(&f, &flat, rr, i, B, c, W);
      if (rc == 0) rc = put(full, 1, ch[i], c, &f);
      tr_tensor_release(&f);
      if (rc < 0) goto out;
    }
  }
  rc = 0;
out:
  tr_tensor_release(&src);
  tr_tensor_release(&flat);
  return rc;
}

/* local [B, 2c, W] = this rank's chunk pair of the sum over ranks of full
 * [B, 2nc, W] (a reduce-scatter) */
static int seq_scatter(tr_pg_t* pg, const tr_tensor_t* full,
                       tr_tensor_t* local) {
  int n = tr_pg_size(pg);
  int64_t B = local->shape[0], c = local->shape[1] / 2, W = local->shape[2];
  int64_t run = B * 2 * c * W, flat_shape[1] = {n * run}, one[1] = {run};
  int64_t shape[3] = {B, 2 * c, W};
  tr_tensor_t flat = {0}, mine = {0}, view = {0};
  int rc;
  TR_CHECK(tr_tensor_empty(&flat, local->dtype, local->device, 1, flat_shape));
  TR_CHECK_GOTO(tr_tensor_empty(&mine, local->dtype, local->device, 1, one), rc,
                out);
  for (int rr = 0; rr < n; rr++) {
    int ch[2];
    tr_cp_headtail(n, rr, ch);
    for (int i = 0; i < 2; i++) {
      tr_tensor_t f = {0}, src = {0};
      rc = flat_chunk(&f, &flat, rr, i, B, c, W);
      if (rc == 0) rc = tr_tensor_narrow(&src, full, 1, ch[i] * c, c);
      if (rc == 0) rc = copy_views(&f, &src);
      tr_tensor_release(&f);
      tr_tensor_release(&src);
      if (rc < 0) goto out;
    }
  }
  TR_CHECK_GOTO(tr_pg_reduce_scatter(pg, &mine, &flat, TR_PG_SUM, NULL), rc,
                out);
  TR_CHECK_GOTO(tr_tensor_reshape(&view, &mine, 3, shape), rc, out);
  rc = copy_views(local, &view);
out:
  tr_tensor_release(&flat);
  tr_tensor_release(&mine);
  tr_tensor_release(&view);
  return rc;
}

/* The ring's shapes: q, out [B, 2c, H*D], k, v [B, 2c, KVH*D], lse [B, H,
 * 2c]; this rank's chunks in qcs, the chunk length in *c. */
static int ring_args(const tr_cp_t* cp, const tr_tensor_t* out,
                     const tr_tensor_t* lse, const tr_tensor_t* q,
                     const tr_tensor_t* k, const tr_tensor_t* v, int H,
                     int qcs[2], int64_t* c) {
  if (!cp || !cp->pg) return TR_EINVAL;
  int n = tr_pg_size(cp->pg);
  TR_CHECK(tr_cp_headtail(n, tr_pg_rank(cp->pg), qcs));
  static const int local[2] = {0, 1}; /* the rows of the two chunks */
  return shapes(q, k, v, out, lse, H, local, 2, 2, c);
}

/* The pairs of the ring's next move: what a rank sends to rank + 1 and
 * receives from rank - 1 (n tensors each), one coalesced group. */
static int rotate_start(tr_pg_t* pg, tr_tensor_t* const* send,
                        tr_tensor_t* const* recv, int n, tr_pg_work_t** w) {
  int size = tr_pg_size(pg), r = tr_pg_rank(pg);
  int next = (r + 1) % size, prev = (r + size - 1) % size;
  TR_CHECK(tr_pg_coalesce_begin(pg));
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++)
    rc = tr_pg_send(pg, send[i], next, i, NULL);
  for (int i = 0; i < n && rc == 0; i++)
    rc = tr_pg_recv(pg, recv[i], prev, i, NULL);
  int rc2 = tr_pg_coalesce_end(pg, w);
  return rc < 0 ? rc : rc2;
}

/* The compute waits for the move: on CUDA its streams wait on the device
 * (no host wait, which would drain the queue of kernels every move); on
 * the CPU the host waits. */
static int rotate_finish(tr_pg_work_t* w) {
  if (!w) return 0;
  int rc = tr_pg_work_wait_stream(w, NULL);
  void* ks = tr_kern_get_stream();
  if (rc == 0 && ks) rc = tr_pg_work_wait_stream(w, ks);
  tr_pg_work_free(w);
  return rc;
}

/* *a = a fresh zeroed tensor of x's shape, dtype and device */
static int like(tr_tensor_t* a, const tr_tensor_t* x) {
  return zeros3(a, x->dtype, x->device, x->shape[0], x->shape[1], x->shape[2]);
}

/* contiguous copies of x in a (so that the ring may overwrite them) */
static int copy_of(tr_tensor_t* a, const tr_tensor_t* x) {
  TR_CHECK(like(a, x));
  return copy_views(a, x);
}

static void swap(tr_tensor_t* a, tr_tensor_t* b) {
  tr_tensor_t t = *a;
  *a = *b;
  *b = t;
}

int tr_cp_ring_fwd(const tr_cp_t* cp, tr_tensor_t* out, tr_tensor_t* lse,
                   const tr_tensor_t* q, const tr_tensor_t* k,
                   const tr_tensor_t* v, int n_heads, int n_kv_heads,
                   const tr_tensor_t* doc_start, int window) {
  int qcs[2];
  int64_t c;
  TR_CHECK(ring_args(cp, out, lse, q, k, v, n_heads, qcs, &c));
  int n = tr_pg_size(cp->pg), r = tr_pg_rank(cp->pg);
  pair_t p;
  int64_t B = q->shape[0], D = q->shape[2] / n_heads;
  TR_CHECK(
      pair_init(&p, q, doc_start, window, n_heads, n_kv_heads, c, B, 2 * n));
  acc_t acc[2] = {{0}};
  tr_tensor_t kk = {0}, vv = {0}, nk = {0}, nv = {0};
  tr_pg_work_t* w = NULL;
  int* kcs = NULL;
  int rc;
  TR_CHECK_GOTO(acc_init(&acc[0], &p, B, D), rc, out);
  TR_CHECK_GOTO(acc_init(&acc[1], &p, B, D), rc, out);
  if (cp->rotate == TR_CP_ALLGATHER) {
    TR_CHECK_GOTO(seq_gather(cp->pg, k, &kk), rc, out);
    TR_CHECK_GOTO(seq_gather(cp->pg, v, &vv), rc, out);
    kcs = seq_chunks(2 * n);
    if (!kcs) {
      rc = TR_ENOMEM;
      goto out;
    }
    TR_CHECK_GOTO(fwd_held(&p, acc, q, qcs, 2, &kk, &vv, kcs, 2 * n), rc, out);
  } else { /* the pairs rotate: step s holds rank r - s's */
    TR_CHECK_GOTO(copy_of(&kk, k), rc, out);
    TR_CHECK_GOTO(copy_of(&vv, v), rc, out);
    TR_CHECK_GOTO(like(&nk, k), rc, out);
    TR_CHECK_GOTO(like(&nv, v), rc, out);
    for (int s = 0; s < n; s++) {
      int held[2];
      tr_cp_headtail(n, (r - s + n) % n, held);
      if (s < n - 1) { /* the next pair travels while this one computes */
        tr_tensor_t* send[2] = {&kk, &vv};
        tr_tensor_t* recv[2] = {&nk, &nv};
        TR_CHECK_GOTO(rotate_start(cp->pg, send, recv, 2, &w), rc, out);
      }
      rc = fwd_held(&p, acc, q, qcs, 2, &kk, &vv, held, 2);
      int wrc = rotate_finish(w);
      w = NULL;
      if (rc < 0 || (rc = wrc) < 0) goto out;
      swap(&kk, &nk);
      swap(&vv, &nv);
    }
  }
  TR_CHECK_GOTO(acc_put(&acc[0], out, lse, 0), rc, out);
  rc = acc_put(&acc[1], out, lse, 1);
out:
  acc_release(&acc[0]);
  acc_release(&acc[1]);
  free(kcs);
  tr_tensor_t* ts[] = {&kk, &vv, &nk, &nv};
  for (int t = 0; t < 4; t++) tr_tensor_release(ts[t]);
  return rc;
}

int tr_cp_ring_bwd(const tr_cp_t* cp, tr_tensor_t* dq, tr_tensor_t* dk,
                   tr_tensor_t* dv, const tr_tensor_t* dout,
                   const tr_tensor_t* q, const tr_tensor_t* k,
                   const tr_tensor_t* v, const tr_tensor_t* out,
                   const tr_tensor_t* lse, int n_heads, int n_kv_heads,
                   const tr_tensor_t* doc_start, int window) {
  int qcs[2];
  int64_t c;
  TR_CHECK(ring_args(cp, out, lse, q, k, v, n_heads, qcs, &c));
  TR_CHECK(bwd_args(dq, dk, dv, dout, q, k, v));
  int n = tr_pg_size(cp->pg), r = tr_pg_rank(cp->pg);
  pair_t p;
  TR_CHECK(pair_init(&p, q, doc_start, window, n_heads, n_kv_heads, c,
                     q->shape[0], 2 * n));
  /* [0..3]: the held k, v and their gradients; [4..7]: the next ones */
  tr_tensor_t b[8] = {{0}}, dqa = {0};
  int* kcs = NULL;
  int rc;
  TR_CHECK_GOTO(like(&dqa, q), rc, out);
  if (cp->rotate == TR_CP_ALLGATHER) {
    TR_CHECK_GOTO(seq_gather(cp->pg, k, &b[0]), rc, out);
    TR_CHECK_GOTO(seq_gather(cp->pg, v, &b[1]), rc, out);
    TR_CHECK_GOTO(like(&b[2], &b[0]), rc, out);
    TR_CHECK_GOTO(like(&b[3], &b[1]), rc, out);
    kcs = seq_chunks(2 * n);
    if (!kcs) {
      rc = TR_ENOMEM;
      goto out;
    }
    uint8_t* fresh = malloc((size_t)(2 + 2 * n));
    if (!fresh) {
      rc = TR_ENOMEM;
      goto out;
    }
    memset(fresh, 1, (size_t)(2 + 2 * n));
    rc = bwd_held(&p, &dqa, &b[2], &b[3], dout, q, out, lse, qcs, 2, &b[0],
                  &b[1], kcs, 2 * n, fresh, fresh + 2);
    free(fresh);
    if (rc < 0) goto out;
    TR_CHECK_GOTO(seq_scatter(cp->pg, &b[2], dk), rc, out);
    TR_CHECK_GOTO(seq_scatter(cp->pg, &b[3], dv), rc, out);
  } else { /* the pairs rotate with their gradients; n moves bring them
              home */
    TR_CHECK_GOTO(copy_of(&b[0], k), rc, out);
    TR_CHECK_GOTO(copy_of(&b[1], v), rc, out);
    TR_CHECK_GOTO(like(&b[2], k), rc, out);
    TR_CHECK_GOTO(like(&b[3], v), rc, out);
    for (int i = 4; i < 8; i++) TR_CHECK_GOTO(like(&b[i], &b[i - 4]), rc, out);
    uint8_t qf[2] = {1, 1}; /* dqa's chunks: zero until written */
    for (int s = 0; s < n; s++) {
      int held[2];
      tr_cp_headtail(n, (r - s + n) % n, held);
      uint8_t kf[2] = {s == 0, s == 0}; /* received ones hold sums */
      TR_CHECK_GOTO(bwd_held(&p, &dqa, &b[2], &b[3], dout, q, out, lse, qcs, 2,
                             &b[0], &b[1], held, 2, qf, kf),
                    rc, out);
      /* the gradients move on; so do the pairs, but for the last move */
      int last = s == n - 1;
      tr_tensor_t* send[4] = {&b[2], &b[3], &b[0], &b[1]};
      tr_tensor_t* recv[4] = {&b[6], &b[7], &b[4], &b[5]};
      tr_pg_work_t* w = NULL;
      TR_CHECK_GOTO(rotate_start(cp->pg, send, recv, last ? 2 : 4, &w), rc,
                    out);
      TR_CHECK_GOTO(rotate_finish(w), rc, out);
      for (int i = 0; i < 4; i++) swap(&b[i], &b[i + 4]);
    }
    TR_CHECK_GOTO(copy_views(dk, &b[2]), rc, out);
    TR_CHECK_GOTO(copy_views(dv, &b[3]), rc, out);
  }
  rc = copy_views(dq, &dqa);
out:
  free(kcs);
  for (int i = 0; i < 8; i++) tr_tensor_release(&b[i]);
  tr_tensor_release(&dqa);
  return rc;
}

/* ---- the model seam ---- */

/* lse as the [B, H, T] view the ring takes (the model keeps it flat) */
static int lse_view(tr_tensor_t* view, const tr_tensor_t* lse,
                    const tr_tensor_t* q, int n_heads) {
  int64_t shape[3] = {q->shape[0], n_heads, q->shape[1]};
  return tr_tensor_reshape(view, lse, 3, shape);
}

static int seam_fwd(void* arg, tr_tensor_t* out, tr_tensor_t* lse,
                    const tr_tensor_t* q, const tr_tensor_t* k,
                    const tr_tensor_t* v, int n_heads, int n_kv_heads,
                    const tr_tensor_t* doc_start, int window) {
  tr_tensor_t l = {0};
  TR_CHECK(lse_view(&l, lse, q, n_heads));
  int rc = tr_cp_ring_fwd(arg, out, &l, q, k, v, n_heads, n_kv_heads, doc_start,
                          window);
  tr_tensor_release(&l);
  return rc;
}

static int seam_bwd(void* arg, tr_tensor_t* dq, tr_tensor_t* dk,
                    tr_tensor_t* dv, const tr_tensor_t* dout,
                    const tr_tensor_t* q, const tr_tensor_t* k,
                    const tr_tensor_t* v, const tr_tensor_t* out,
                    const tr_tensor_t* lse, int n_heads, int n_kv_heads,
                    const tr_tensor_t* doc_start, int window) {
  tr_tensor_t l = {0};
  TR_CHECK(lse_view(&l, lse, q, n_heads));
  int rc = tr_cp_ring_bwd(arg, dq, dk, dv, dout, q, k, v, out, &l, n_heads,
                          n_kv_heads, doc_start, window);
  tr_tensor_release(&l);
  return rc;
}

void tr_cp_install(tr_model_t* m, const tr_cp_t* cp) {
  memset(&m->cp, 0, sizeof m->cp);
  if (!cp || !cp->pg || tr_pg_size(cp->pg) < 2) return;
  m->cp.fwd = seam_fwd;
  m->cp.bwd = seam_bwd;
  m->cp.arg = (void*)cp;
  m->cp.size = tr_pg_size(cp->pg);
  m->cp.rank = tr_pg_rank(cp->pg);
}
