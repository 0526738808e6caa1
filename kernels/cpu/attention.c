/* kernels/cpu/attention.c: causal scaled-dot-product attention with grouped
 * query heads, forward and backward, without keeping the T x T matrices,
 * with the document and sliding-window masks of tr_kern_attn_mask_t.
 *
 * Forward: for each (batch, head, tile of TILE query rows) the scores of
 * the tile against the keys it may see (S = q k^T / sqrt(D), a GEMM), a
 * masked softmax per row, then out = P v (a GEMM). Only out and the
 * log-sum-exp of each row are kept. Backward: one task per (batch, kv
 * head) walks the query heads of its group and the tiles in order,
 * recomputes P from lse, and accumulates dq, dk, dv with GEMMs, so each
 * gradient element is summed in one fixed order whatever the threads.
 * The GEMMs run serially inside the task (nested regions are serial).
 *
 * Masks: row i sees the keys lo(i)..i (tr_kern_attn_mask_t), so a tile of
 * rows needs only the keys from the smallest lo of its rows up to its last
 * row; the GEMMs start there and the keys before it (earlier documents,
 * keys out of the window) cost nothing. Without a mask lo is 0 and the
 * arithmetic is the unmasked kernel's, bit for bit. With a query shift
 * (context-parallel chunks) row i's last key is i + shift, and a row
 * that sees no key gets out 0 and lse -inf. */
#include "config.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#define TILE 64

typedef struct {
  float* out;
  float* lse;
  float* dq;
  float* dk;
  float* dv;
  const float* dout;
  const float* q;
  const float* k;
  const float* v;
  const float* cout;
  const float* clse;
  int B, T, H, KVH, D;
  int64_t qs, kvs;
  int ntiles;
  float scale;
  const int32_t* doc_start; /* [B*T] or NULL */
  int window;               /* 0: none */
  int shift;                /* query row i is at key position i + shift */
} attn_t;

/* first key row i of batch b sees */
static int row_lo(const attn_t* a, int b, int i) {
  int lo = a->doc_start ? a->doc_start[(int64_t)b * a->T + i] : 0;
  int w = i + a->shift - a->window + 1;
  if (a->window > 0 && w > lo) lo = w;
  return lo;
}

/* last key row i sees (lo > last: none) */
static int row_last(const attn_t* a, int i) {
  return i + a->shift < a->T - 1 ? i + a->shift : a->T - 1;
}

/* first key any row of i0..i1-1 sees */
static int tile_lo(const attn_t* a, int b, int i0, int i1) {
  int lo = a->T;
  for (int i = i0; i < i1; i++) {
    int l = row_lo(a, b, i);
    lo = l < lo ? l : lo;
  }
  return lo;
}

static void attn_fwd_task(void* ctx, int64_t task) {
  const attn_t* a = ctx;
  int tile = (int)(task % a->ntiles);
  int h = (int)(task / a->ntiles % a->H);
  int b = (int)(task / a->ntiles / a->H);
  int kvh = h / (a->H / a->KVH);
  int i0 = tile * TILE, i1 = i0 + TILE < a->T ? i0 + TILE : a->T;
  int klo = tile_lo(a, b, i0, i1);
  int khi = row_last(a, i1 - 1) + 1; /* keys klo..khi-1 */
  int rows = i1 - i0, nk = khi - klo;
  const float* q = a->q + ((int64_t)b * a->T + i0) * a->qs + (int64_t)h * a->D;
  int64_t HD = (int64_t)a->H * a->D;
  float* out = a->out + ((int64_t)b * a->T + i0) * HD + (int64_t)h * a->D;
  float* lse = a->lse + ((int64_t)b * a->H + h) * a->T + i0;
  if (nk <= 0) { /* no row sees a key (a shifted chunk) */
    for (int r = 0; r < rows; r++) {
      memset(out + (int64_t)r * HD, 0, sizeof(float) * (size_t)a->D);
      lse[r] = -INFINITY;
    }
    return;
  }
  int64_t kvoff = ((int64_t)b * a->T + klo) * a->kvs + (int64_t)kvh * a->D;
  const float* k = a->k + kvoff;
  const float* v = a->v + kvoff;
  float* S = tr__cpu_scratch(2, sizeof(float) * (size_t)rows * nk);

  tr__cpu_gemm(0, 1, rows, nk, a->D, a->scale, q, a->qs, k, a->kvs, 0.0f, S,
               nk);
  for (int r = 0; r < rows; r++) {
    float* s = S + (int64_t)r * nk;
    /* keys first..last (relative to klo) are visible */
    int first = row_lo(a, b, i0 + r) - klo, last = row_last(a, i0 + r) - klo;
    if (last < first) { /* none: out 0 (the zero row of P), lse -inf */
      memset(s, 0, sizeof(float) * (size_t)nk);
      lse[r] = -INFINITY;
      continue;
    }
    float m = -INFINITY;
    for (int j = first; j <= last; j++) m = s[j] > m ? s[j] : m;
    float l = 0.0f;
    for (int j = first; j <= last; j++) {
      s[j] = expf(s[j] - m);
      l += s[j];
    }
    float inv = 1.0f / l;
    for (int j = 0; j < first; j++) s[j] = 0.0f;
    for (int j = first; j <= last; j++) s[j] *= inv;
    for (int j = last + 1; j < nk; j++) s[j] = 0.0f;
    lse[r] = m + logf(l);
  }
  tr__cpu_gemm(0, 0, rows, a->D, nk, 1.0f, S, nk, v, a->kvs, 0.0f, out, HD);
}

int tr__cpu_attention_fwd(float* out, float* lse, const float* q,
                          const float* k, const float* v, int B, int T, int H,
                          int KVH, int D, int64_t q_stride, int64_t kv_stride,
                          const tr_kern_attn_mask_t* mask) {
  attn_t a = {.out = out,
              .lse = lse,
              .q = q,
              .k = k,
              .v = v,
              .B = B,
              .T = T,
              .H = H,
              .KVH = KVH,
              .D = D,
              .qs = q_stride,
              .kvs = kv_stride,
              .ntiles = (T + TILE - 1) / TILE,
              .scale = 1.0f / sqrtf((float)D),
              .doc_start = mask ? mask->doc_start : NULL,
              .window = mask ? mask->window : 0,
              .shift = mask ? mask->q_shift : 0};
  tr__cpu_parallel((int64_t)B * H * a.ntiles, attn_fwd_task, &a);
  return 0;
}

static void attn_bwd_task(void* ctx, int64_t task) {
  const attn_t* a = ctx;
  int kvh = (int)(task % a->KVH), b = (int)(task / a->KVH);
  int group = a->H / a->KVH;
  int64_t HD = (int64_t)a->H * a->D;
  int64_t kvoff = (int64_t)b * a->T * a->kvs + (int64_t)kvh * a->D;
  const float* k = a->k + kvoff;
  const float* v = a->v + kvoff;
  float* dk = a->dk + kvoff;
  float* dv = a->dv + kvoff;
  float* P = tr__cpu_scratch(2, sizeof(float) * (size_t)TILE * a->T);
  float* dP = tr__cpu_scratch(3, sizeof(float) * (size_t)TILE * a->T);
  /* the gradients are overwritten: this task owns k/v head kvh and its
   * query heads in batch b */
  for (int t = 0; t < a->T; t++) {
    memset(dk + (int64_t)t * a->kvs, 0, sizeof(float) * (size_t)a->D);
    memset(dv + (int64_t)t * a->kvs, 0, sizeof(float) * (size_t)a->D);
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
      memset(a->dq + ((int64_t)b * a->T + t) * a->qs + (int64_t)h * a->D, 0,
             sizeof(float) * (size_t)a->D);
  }
  for (int h = kvh * group; h < (kvh + 1) * group; h++) {
    for (int i0 = 0; i0 < a->T; i0 += TILE) {
      int i1 = i0 + TILE < a->T ? i0 + TILE : a->T;
      int klo = tile_lo(a, b, i0, i1);
      int khi = row_last(a, i1 - 1) + 1; /* keys klo..khi-1 */
      int rows = i1 - i0, nk = khi - klo;
      if (nk <= 0) continue; /* no row sees a key (a shifted chunk) */
      int64_t qoff = ((int64_t)b * a->T + i0) * a->qs + (int64_t)h * a->D;
      int64_t ooff = ((int64_t)b * a->T + i0) * HD + (int64_t)h * a->D;
      int64_t koff = (int64_t)klo * a->kvs;
      const float* q = a->q + qoff;
      float* dq = a->dq + qoff;
      const float* o = a->cout + ooff;
      const float* dout = a->dout + ooff;
      const float* lse = a->clse + ((int64_t)b * a->H + h) * a->T + i0;
      /* P = exp(S - lse) on the visible keys, 0 elsewhere */
      tr__cpu_gemm(0, 1, rows, nk, a->D, a->scale, q, a->qs, k + koff, a->kvs,
                   0.0f, P, nk);
      /* dP = dout v^T */
      tr__cpu_gemm(0, 1, rows, nk, a->D, 1.0f, dout, HD, v + koff, a->kvs, 0.0f,
                   dP, nk);
      for (int r = 0; r < rows; r++) {
        float* p = P + (int64_t)r * nk;
        float* dp = dP + (int64_t)r * nk;
        int first = row_lo(a, b, i0 + r) - klo;
        int last = row_last(a, i0 + r) - klo;
        if (last < first) { /* sees no key */
          memset(p, 0, sizeof(float) * (size_t)nk);
          memset(dp, 0, sizeof(float) * (size_t)nk);
          continue;
        }
        const float* orow = o + (int64_t)r * HD;
        const float* drow = dout + (int64_t)r * HD;
        float Dr = 0.0f;
        for (int d = 0; d < a->D; d++) Dr += orow[d] * drow[d];
        for (int j = 0; j < first; j++) p[j] = dp[j] = 0.0f;
        for (int j = first; j <= last; j++) {
          p[j] = expf(p[j] - lse[r]);
          dp[j] = p[j] * (dp[j] - Dr); /* dS */
        }
        for (int j = last + 1; j < nk; j++) p[j] = dp[j] = 0.0f;
      }
      /* dv += P^T dout ; dq += scale dS k ; dk += scale dS^T q */
      tr__cpu_gemm(1, 0, nk, a->D, rows, 1.0f, P, nk, dout, HD, 1.0f, dv + koff,
                   a->kvs);
      tr__cpu_gemm(0, 0, rows, a->D, nk, a->scale, dP, nk, k + koff, a->kvs,
                   1.0f, dq, a->qs);
      tr__cpu_gemm(1, 0, nk, a->D, rows, a->scale, dP, nk, q, a->qs, 1.0f,
                   dk + koff, a->kvs);
    }
  }
}

int tr__cpu_attention_bwd(float* dq, float* dk, float* dv, const float* dout,
                          const float* q, const float* k, const float* v,
                          const float* out, const float* lse, int B, int T,
                          int H, int KVH, int D, int64_t q_stride,
                          int64_t kv_stride, const tr_kern_attn_mask_t* mask) {
  attn_t a = {.dq = dq,
              .dk = dk,
              .dv = dv,
              .dout = dout,
              .q = q,
              .k = k,
              .v = v,
              .cout = out,
              .clse = lse,
              .B = B,
              .T = T,
              .H = H,
              .KVH = KVH,
              .D = D,
              .qs = q_stride,
              .kvs = kv_stride,
              .ntiles = (T + TILE - 1) / TILE,
              .scale = 1.0f / sqrtf((float)D),
              .doc_start = mask ? mask->doc_start : NULL,
              .window = mask ? mask->window : 0,
              .shift = mask ? mask->q_shift : 0};
  tr__cpu_parallel((int64_t)B * KVH, attn_bwd_task, &a);
  return 0;
}

int tr__cpu_attn_merge(float* acc, float* lse, const float* pout,
                       const float* plse, int B, int T, int H, int D) {
  int64_t HD = (int64_t)H * D;
  for (int64_t b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        int64_t li = (b * H + h) * T + t;
        double x = lse[li], y = plse[li], mx = x > y ? x : y;
        if (mx == -INFINITY) continue; /* neither has seen a key */
        double L = mx + log(exp(x - mx) + exp(y - mx));
        double wx = exp(x - L), wy = exp(y - L);
        lse[li] = (float)L;
        float* a = acc + (b * T + t) * HD + (int64_t)h * D;
        const float* p = pout + (b * T + t) * HD + (int64_t)h * D;
        for (int d = 0; d < D; d++) a[d] = (float)(wx * a[d] + wy * p[d]);
      }
  return 0;
}

void tr_kern_attn_doc_start(int32_t* doc_start, int32_t* pos,
                            const int32_t* tokens, int B, int T,
                            int32_t eos_id) {
  for (int b = 0; b < B; b++) {
    int32_t start = 0;
    for (int i = 0; i < T; i++) {
      int64_t at = (int64_t)b * T + i;
      doc_start[at] = start;
      if (pos) pos[at] = i - start;
      if (tokens[at] == eos_id) start = i + 1; /* the EOS ends its document */
    }
  }
}

void tr_kern_attn_doc_count(const int32_t* doc_start, int B, int T, int* n_docs,
                            int* longest_doc) {
  int n = 0, longest = 0;
  for (int b = 0; b < B; b++) {
    const int32_t* ds = doc_start + (int64_t)b * T;
    int first = 0; /* the current document's first row */
    for (int i = 1; i <= T; i++)
      if (i == T || ds[i] != ds[i - 1]) {
        n++;
        if (i - first > longest) longest = i - first;
        first = i;
      }
  }
  *n_docs = n;
  *longest_doc = longest;
}
