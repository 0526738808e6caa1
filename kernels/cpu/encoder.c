/* kernels/cpu/encoder.c: token (+ learned position) embedding, forward and
 * backward. The forward is split by rows; the backward by channel slices,
 * so every gradient element is summed by one task over the rows in order
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
} emb_fwd_t;

static void emb_fwd_task(void* ctx, int64_t task) {
  const emb_fwd_t* a = ctx;
  int64_t r1 = (task + 1) * ROWS < a->N ? (task + 1) * ROWS : a->N;
  for (int64_t r = task * ROWS; r < r1; r++) {
    float* o = a->out + r * a->C;
    const float* e = a->wte + (int64_t)a->tok[r] * a->C;
    if (a->wpe) {
      const float* p = a->wpe + (r % a->T) * a->C;
      for (int c = 0; c < a->C; c++) o[c] = e[c] + p[c];
    } else {
      memcpy(o, e, (size_t)a->C * sizeof(float));
    }
  }
}

int tr__cpu_embedding_fwd(float* out, const int32_t* tok, const float* wte,
                          const float* wpe, int B, int T, int C) {
  emb_fwd_t a = {out, tok, wte, wpe, (int64_t)B * T, T, C};
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
} emb_bwd_t;

static void emb_bwd_task(void* ctx, int64_t task) {
  const emb_bwd_t* a = ctx;
  int c0 = (int)task * COLS, c1 = c0 + COLS < a->C ? c0 + COLS : a->C;
  for (int64_t r = 0; r < a->N; r++) {
    const float* d = a->dout + r * a->C;
    float* e = a->dwte + (int64_t)a->tok[r] * a->C;
    for (int c = c0; c < c1; c++) e[c] += d[c];
    if (a->dwpe) {
      float* p = a->dwpe + (r % a->T) * a->C;
      for (int c = c0; c < c1; c++) p[c] += d[c];
    }
  }
}

int tr__cpu_embedding_bwd(float* dwte, float* dwpe, const float* dout,
                          const int32_t* tok, int B, int T, int C) {
  emb_bwd_t a = {dwte, dwpe, dout, tok, (int64_t)B * T, T, C};
  tr__cpu_parallel(tr__cpu_ntasks(C, COLS), emb_bwd_task, &a);
  return 0;
}
