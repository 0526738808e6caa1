/* kernels/cpu/rope.c: rotary position embedding in Hugging Face's
 * rotate_half layout (dim i pairs with i + D/2), applied in place; the
 * backward is the inverse rotation. Also the cos/sin tables with Llama 3.1
 * frequency scaling. */
#include "config.h"

#include <math.h>

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"

#define ROWS 8

typedef struct {
  float* x;
  const float* cos_t;
  const float* sin_t;
  int64_t N;
  int T, H, D;
  int64_t stride;
  float sign;
} rope_t;

static void rope_task(void* ctx, int64_t task) {
  const rope_t* a = ctx;
  int half = a->D / 2;
  int64_t r1 = (task + 1) * ROWS < a->N ? (task + 1) * ROWS : a->N;
  for (int64_t r = task * ROWS; r < r1; r++) {
    int64_t t = r % a->T;
    const float* cs = a->cos_t + t * half;
    const float* sn = a->sin_t + t * half;
    for (int h = 0; h < a->H; h++) {
      float* x = a->x + r * a->stride + (int64_t)h * a->D;
      for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        float c = cs[i], s = a->sign * sn[i];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

int tr__cpu_rope(float* x, const float* cos_t, const float* sin_t, int B, int T,
                 int H, int D, int64_t stride, int inverse) {
  rope_t a = {x, cos_t, sin_t,  (int64_t)B * T,        T,
              H, D,     stride, inverse ? -1.0f : 1.0f};
  tr__cpu_parallel(tr__cpu_ntasks(a.N, ROWS), rope_task, &a);
  return 0;
}

int tr_kern_rope_table(float* cos_t, float* sin_t, int T, int D, double theta,
                       const tr_rope_scaling_t* sc) {
  if (D <= 0 || D % 2 || T < 0 || theta <= 0) return TR_EINVAL;
  int half = D / 2;
  int scaled = sc && sc->factor > 0 && sc->original_max_pos > 0 &&
               sc->high_freq_factor > sc->low_freq_factor;
  for (int i = 0; i < half; i++) {
    double f = 1.0 / pow(theta, (2.0 * i) / D);
    if (scaled) {
      /* Llama 3.1: keep high frequencies, divide low ones by factor, blend
       * linearly (in old_ctx / wavelen) in between */
      double old = sc->original_max_pos;
      double lo_wl = old / sc->low_freq_factor;
      double hi_wl = old / sc->high_freq_factor;
      double wl = 2.0 * M_PI / f;
      if (wl > lo_wl) {
        f = f / sc->factor;
      } else if (wl >= hi_wl) {
        double smooth = (old / wl - sc->low_freq_factor) /
                        (sc->high_freq_factor - sc->low_freq_factor);
        f = (1.0 - smooth) * f / sc->factor + smooth * f;
      }
    }
    for (int t = 0; t < T; t++) {
      double ang = (double)t * f;
      cos_t[(int64_t)t * half + i] = (float)cos(ang);
      sin_t[(int64_t)t * half + i] = (float)sin(ang);
    }
  }
  return 0;
}
