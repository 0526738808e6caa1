/* kernels/cpu/encoder.c: token (+ learned position) embedding, forward and
 * backward, of the whole table or of a vocabulary-parallel slice of its
 * rows. The forward is split by rows; the backward by channel slices, so
 * every gradient element is summed by one task over the rows in order
 * (tokens repeat, so a split by rows would race or depend on threads). */
#include "config.h"

#include <string.h>

#include "kernels/cpu/cpu.h"

#define ROWS 16
#define COLS 64

typedef struct {
  float* out;
  const int32_t* tok;
  const float* wte;
  const float* wpe;
  int64_t N;
  int T, C;
  int64_t row0, rows; /* a slice: rows [row0, row0 + rows); rows 0: whole */
} emb_fwd_t;

/* The row of token t in the table, or NULL when a slice does not hold it. */
static const float* table_row(const float* w, int32_t t, int64_t row0,
                              int64_t rows, int C) {
  int64_t r = (int64_t)t - row0;
  if (rows && (r < 0 || r >= rows)) return NULL;
  return w + r * C;
}

static void emb_fwd_task(void* ctx, int64_t task) {
  const emb_fwd_t* a = ctx;
  int64_t r1 = (task + 1) * ROWS < a->N ? (task + 1) * ROWS : a->N;
  for (int64_t r = task * ROWS; r < r1; r++) {
    float* o = a->out + r * a->C;
    const float* e = table_row(a->wte, a->tok[r], a->row0, a->rows, a->C);
    if (!e) {
      memset(o, 0, (size_t)a->C * sizeof(float));
    } else if (a->wpe) {
      const float* p = a->wpe + (r % a->T) * a->C;
      for (int c = 0; c < a->C; c++) o[c] = e[c] + p[c];
    } else {
      memcpy(o, e, (size_t)a->C * sizeof(float));
    }
  }
}

int tr__cpu_embedding_fwd(float* out, const int32_t* tok, const float* wte,
                          const float* wpe, int B, int T, int C) {
  emb_fwd_t a = {out, tok, wte, wpe, (int64_t)B * T, T, C, 0, 0};
  tr__cpu_parallel(tr__cpu_ntasks(a.N, ROWS), emb_fwd_task, &a);
  return 0;
}

int tr__cpu_embedding_rows_fwd(float* out, const int32_t* tok, const float* wte,
                               int64_t row0, int64_t rows, int B, int T,
                               int C) {
  emb_fwd_t a = {out, tok, wte, NULL, (int64_t)B * T, T, C, row0, rows};
  tr__cpu_parallel(tr__cpu_ntasks(a.N, ROWS), emb_fwd_task, &a);
  return 0;
}

typedef struct {
  float* dwte;
  float* dwpe;
  const float* dout;
  const int32_t* tok;
  int64_t N;
  int T, C;
  int64_t row0, rows; /* as emb_fwd_t */
} emb_bwd_t;

static void emb_bwd_task(void* ctx, int64_t task) {
  const emb_bwd_t* a = ctx;
  int c0 = (int)task * COLS, c1 = c0 + COLS < a->C ? c0 + COLS : a->C;
  for (int64_t r = 0; r < a->N; r++) {
    const float* d = a->dout + r * a->C;
    float* e =
        a->dwte ? (float*)table_row(a->dwte, a->tok[r], a->row0, a->rows, a->C)
                : NULL;
    if (e)
      for (int c = c0; c < c1; c++) e[c] += d[c];
    if (a->dwpe) {
      float* p = a->dwpe + (r % a->T) * a->C;
      for (int c = c0; c < c1; c++) p[c] += d[c];
    }
  }
}

int tr__cpu_embedding_bwd(float* dwte, float* dwpe, const float* dout,
                          const int32_t* tok, int B, int T, int C) {
  emb_bwd_t a = {dwte, dwpe, dout, tok, (int64_t)B * T, T, C, 0, 0};
  tr__cpu_parallel(tr__cpu_ntasks(C, COLS), emb_bwd_task, &a);
  return 0;
}

int tr__cpu_embedding_rows_bwd(float* dwte, float* dwpe, const float* dout,
                               const int32_t* tok, int64_t row0, int64_t rows,
                               int B, int T, int C) {
  emb_bwd_t a = {dwte, dwpe, dout, tok, (int64_t)B * T, T, C, row0, rows};
  tr__cpu_parallel(tr__cpu_ntasks(C, COLS), emb_bwd_task, &a);
  return 0;
}
