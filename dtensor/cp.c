/* dtensor/cp.c: context parallelism's attention core (trainrun/cp.h):
 * head-tail chunk assignment, each query chunk's attention against every
 * key/value chunk at or before it through the shifted-chunk attention
 * kernels, the log-sum-exp merge, and the backward of the merged result
 * chunk pair by chunk pair. The chunks are copied out of and back into the
 * [B, T, W] tensors (rows of several batches are not one strided view). */
#include "config.h"

#include <math.h>
#include <stdlib.h>

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

/* chunk i (c elements of dim) of x as a contiguous copy */
static int take(tr_tensor_t* dst, const tr_tensor_t* x, int dim, int i,
                int64_t c) {
  tr_tensor_t view = {0};
  TR_CHECK(tr_tensor_narrow(&view, x, dim, i * c, c));
  int rc = tr_tensor_contiguous(dst, &view);
  tr_tensor_release(&view);
  return rc;
}

/* chunk i (c elements of dim) of x = src */
static int put(tr_tensor_t* x, int dim, int i, int64_t c,
               const tr_tensor_t* src) {
  tr_tensor_t view = {0};
  TR_CHECK(tr_tensor_narrow(&view, x, dim, i * c, c));
  int rc = tr_tensor_copy(&view, src);
  tr_tensor_release(&view);
  return rc;
}

static int cpu_f32(const tr_tensor_t* t, const char* what) {
  if (t && t->device.type == TR_DEV_CPU && t->dtype == TR_F32 && t->ndim == 3 &&
      tr_tensor_is_contiguous(t))
    return 0;
  TR_LOG_ERROR(DT,
               "cp attention: %s is not a contiguous 3-d float32 "
               "CPU tensor",
               what);
  return TR_EUNSUPPORTED;
}

/* the shapes of trainrun/cp.h; *c = chunk length */
static int shapes(const tr_tensor_t* q, const tr_tensor_t* k,
                  const tr_tensor_t* v, const tr_tensor_t* out,
                  const tr_tensor_t* lse, int H, const int* q_chunks, int nq,
                  int n_chunks, int64_t* c) {
  TR_CHECK(cpu_f32(q, "q"));
  TR_CHECK(cpu_f32(k, "k"));
  TR_CHECK(cpu_f32(v, "v"));
  TR_CHECK(cpu_f32(out, "out"));
  TR_CHECK(cpu_f32(lse, "lse"));
  if (n_chunks < 1 || nq < 1 || k->shape[1] % n_chunks) {
    TR_LOG_ERROR(DT,
                 "cp attention: %lld keys do not split into %d "
                 "chunks",
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

static int empty3(tr_tensor_t* t, int64_t a, int64_t b, int64_t c) {
  int64_t shape[3] = {a, b, c};
  return tr_tensor_zeros(t, TR_F32, TR_DEVICE_CPU, 3, shape);
}

/* out, lse of one query chunk from the partial results of key chunks
 * 0..np-1 (po[j] [B,c,H*D], pl[j] [B,H,c]) */
static void merge(tr_tensor_t* out, tr_tensor_t* lse, const tr_tensor_t* po,
                  const tr_tensor_t* pl, int np, int64_t B, int H, int64_t c,
                  int64_t D) {
  float* o = tr_tensor_data(out);
  float* l = tr_tensor_data(lse);
  for (int64_t b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int64_t t = 0; t < c; t++) {
        int64_t li = (b * H + h) * c + t;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < np; j++) {
          double x = ((const float*)tr_tensor_data(&pl[j]))[li];
          mx = x > mx ? x : mx;
        }
        for (int j = 0; j < np; j++)
          s += exp(((const float*)tr_tensor_data(&pl[j]))[li] - mx);
        double L = mx + log(s);
        l[li] = (float)L;
        int64_t oi = (b * c + t) * H * D + h * D;
        for (int64_t d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; j < np; j++)
            acc += exp(((const float*)tr_tensor_data(&pl[j]))[li] - L) *
                   ((const float*)tr_tensor_data(&po[j]))[oi + d];
          o[oi + d] = (float)acc;
        }
      }
}

int tr_cp_attention_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                        const tr_tensor_t* q, const tr_tensor_t* k,
                        const tr_tensor_t* v, int n_heads, int n_kv_heads,
                        const int* q_chunks, int nq, int n_chunks) {
  int64_t c;
  TR_CHECK(shapes(q, k, v, out, lse, n_heads, q_chunks, nq, n_chunks, &c));
  int64_t B = q->shape[0], HD = q->shape[2], D = HD / n_heads;
  tr_tensor_t* po = calloc((size_t)n_chunks * 2, sizeof *po);
  if (!po) return TR_ENOMEM;
  tr_tensor_t* pl = po + n_chunks;
  tr_tensor_t qt = {0}, kt = {0}, vt = {0}, mo = {0}, ml = {0};
  int rc = 0;
  for (int i = 0; i < nq && rc == 0; i++) {
    int qc = q_chunks[i];
    TR_CHECK_GOTO(take(&qt, q, 1, i, c), rc, release);
    for (int j = 0; j <= qc; j++) { /* the key chunks at or before it */
      TR_CHECK_GOTO(take(&kt, k, 1, j, c), rc, release);
      TR_CHECK_GOTO(take(&vt, v, 1, j, c), rc, release);
      TR_CHECK_GOTO(empty3(&po[j], B, c, HD), rc, release);
      TR_CHECK_GOTO(empty3(&pl[j], B, n_heads, c), rc, release);
      TR_CHECK_GOTO(tr_kern_attention_masked_fwd(&po[j], &pl[j], &qt, &kt, &vt,
                                                 n_heads, n_kv_heads, NULL, 0,
                                                 (int)((qc - j) * c)),
                    rc, release);
      tr_tensor_release(&kt);
      tr_tensor_release(&vt);
    }
    TR_CHECK_GOTO(empty3(&mo, B, c, HD), rc, release);
    TR_CHECK_GOTO(empty3(&ml, B, n_heads, c), rc, release);
    merge(&mo, &ml, po, pl, qc + 1, B, n_heads, c, D);
    TR_CHECK_GOTO(put(out, 1, i, c, &mo), rc, release);
    TR_CHECK_GOTO(put(lse, 2, i, c, &ml), rc, release);
  release:
    tr_tensor_release(&qt);
    tr_tensor_release(&kt);
    tr_tensor_release(&vt);
    tr_tensor_release(&mo);
    tr_tensor_release(&ml);
    for (int j = 0; j < 2 * n_chunks; j++) tr_tensor_release(&po[j]);
  }
  free(po);
  return rc;
}

/* chunk j of x (dim 1) += add */
static int add_to(tr_tensor_t* x, int j, int64_t c, const tr_tensor_t* add) {
  tr_tensor_t cur = {0};
  TR_CHECK(take(&cur, x, 1, j, c));
  int rc = tr_kern_add(&cur, &cur, add);
  if (rc == 0) rc = put(x, 1, j, c, &cur);
  tr_tensor_release(&cur);
  return rc;
}

int tr_cp_attention_bwd(tr_tensor_t* dq, tr_tensor_t* dk, tr_tensor_t* dv,
                        const tr_tensor_t* dout, const tr_tensor_t* q,
                        const tr_tensor_t* k, const tr_tensor_t* v,
                        const tr_tensor_t* out, const tr_tensor_t* lse,
                        int n_heads, int n_kv_heads, const int* q_chunks,
                        int nq, int n_chunks) {
  int64_t c;
  TR_CHECK(shapes(q, k, v, out, lse, n_heads, q_chunks, nq, n_chunks, &c));
  TR_CHECK(cpu_f32(dq, "dq"));
  TR_CHECK(cpu_f32(dk, "dk"));
  TR_CHECK(cpu_f32(dv, "dv"));
  TR_CHECK(cpu_f32(dout, "dout"));
  if (!tr_tensor_same_shape(dq, q) || !tr_tensor_same_shape(dout, q) ||
      !tr_tensor_same_shape(dk, k) || !tr_tensor_same_shape(dv, v)) {
    TR_LOG_ERROR(DT,
                 "cp attention: gradients of other shapes than "
                 "their tensors");
    return TR_ESHAPE;
  }
  int64_t B = q->shape[0], HD = q->shape[2], KD = k->shape[2];
  TR_CHECK(tr_tensor_fill(dk, 0.0));
  TR_CHECK(tr_tensor_fill(dv, 0.0));
  tr_tensor_t qt = {0}, ot = {0}, gt = {0}, lt = {0}, kt = {0}, vt = {0};
  tr_tensor_t acc = {0}, tq = {0}, tk = {0}, tv = {0};
  int rc = 0;
  for (int i = 0; i < nq && rc == 0; i++) {
    int qc = q_chunks[i];
    TR_CHECK_GOTO(take(&qt, q, 1, i, c), rc, release);
    TR_CHECK_GOTO(take(&ot, out, 1, i, c), rc, release);
    TR_CHECK_GOTO(take(&gt, dout, 1, i, c), rc, release);
    TR_CHECK_GOTO(take(&lt, lse, 2, i, c), rc, release);
    TR_CHECK_GOTO(empty3(&acc, B, c, HD), rc, release);
    TR_CHECK_GOTO(empty3(&tq, B, c, HD), rc, release);
    TR_CHECK_GOTO(empty3(&tk, B, c, KD), rc, release);
    TR_CHECK_GOTO(empty3(&tv, B, c, KD), rc, release);
    for (int j = 0; j <= qc; j++) {
      TR_CHECK_GOTO(take(&kt, k, 1, j, c), rc, release);
      TR_CHECK_GOTO(take(&vt, v, 1, j, c), rc, release);
      TR_CHECK_GOTO(tr_kern_attention_masked_bwd(
                        &tq, &tk, &tv, &gt, &qt, &kt, &vt, &ot, &lt, n_heads,
                        n_kv_heads, NULL, 0, (int)((qc - j) * c)),
                    rc, release);
      TR_CHECK_GOTO(tr_kern_add(&acc, &acc, &tq), rc, release);
      TR_CHECK_GOTO(add_to(dk, j, c, &tk), rc, release);
      TR_CHECK_GOTO(add_to(dv, j, c, &tv), rc, release);
      tr_tensor_release(&kt);
      tr_tensor_release(&vt);
    }
    TR_CHECK_GOTO(put(dq, 1, i, c, &acc), rc, release);
  release:;
    tr_tensor_t* ts[] = {&qt, &ot, &gt, &lt, &kt, &vt, &acc, &tq, &tk, &tv};
    for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++)
      tr_tensor_release(ts[t]);
  }
  return rc;
}
