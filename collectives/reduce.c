/* collectives/reduce.c: element-wise reductions of every dtype and reduce op
 * on the host, for the CPU backends (Gloo's reduce function, the ring
 * reduce-scatter, MPI's post-processing) -- plus the float32 staging that
 * makes bf16/f16 sums accumulate in float. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "collectives/internal.h"

/* The loops are written for the vectoriser: when dst is one of the inputs
 * (how Gloo calls it) and does not overlap the other, the in-place form has
 * no aliasing left for it to check. */
static int apart(const void* p, const void* q, size_t bytes) {
  const char* x = p;
  const char* y = q;
  return x + bytes <= y || y + bytes <= x;
}

#define TR__BIN_LOOP(T, EXPR)                              \
  do {                                                     \
    size_t nb_ = n * sizeof(T);                            \
    if ((dst == a || dst == b) && apart(a, b, nb_)) {      \
      T* restrict d_ = (T*)dst;                            \
      const T* restrict o_ = (const T*)(dst == a ? b : a); \
      int first_ = dst == a;                               \
      if (first_) {                                        \
        for (size_t i = 0; i < n; i++) {                   \
          T x = d_[i], y = o_[i];                          \
          d_[i] = (T)(EXPR);                               \
        }                                                  \
      } else {                                             \
        for (size_t i = 0; i < n; i++) {                   \
          T x = o_[i], y = d_[i];                          \
          d_[i] = (T)(EXPR);                               \
        }                                                  \
      }                                                    \
    } else if (apart(dst, a, nb_) && apart(dst, b, nb_)) { \
      T* restrict d_ = (T*)dst;                            \
      const T* restrict a_ = (const T*)a;                  \
      const T* restrict b_ = (const T*)b;                  \
      for (size_t i = 0; i < n; i++) {                     \
        T x = a_[i], y = b_[i];                            \
        d_[i] = (T)(EXPR);                                 \
      }                                                    \
    } else {                                               \
      T* d_ = (T*)dst;                                     \
      const T* a_ = (const T*)a;                           \
      const T* b_ = (const T*)b;                           \
      for (size_t i = 0; i < n; i++) {                     \
        T x = a_[i], y = b_[i];                            \
        d_[i] = (T)(EXPR);                                 \
      }                                                    \
    }                                                      \
  } while (0)

#define TR__ALL_OPS(T)                \
  switch (op) {                       \
    case TR_PG_SUM:                   \
    case TR_PG_AVG:                   \
      TR__BIN_LOOP(T, x + y);         \
      break;                          \
    case TR_PG_PRODUCT:               \
      TR__BIN_LOOP(T, (x) * (y));     \
      break;                          \
    case TR_PG_MAX:                   \
      TR__BIN_LOOP(T, x > y ? x : y); \
      break;                          \
    case TR_PG_MIN:                   \
      TR__BIN_LOOP(T, x < y ? x : y); \
      break;                          \
    default:                          \
      break;                          \
  }

/* Unsigned arithmetic for sums and products of small and signed integer
 * types: wraps without undefined behaviour. */
#define TR__WRAP_OPS(T, U)                                   \
  switch (op) {                                              \
    case TR_PG_SUM:                                          \
    case TR_PG_AVG:                                          \
      TR__BIN_LOOP(T, (U)((U)x + (U)y));                     \
      break;                                                 \
    case TR_PG_PRODUCT:                                      \
      TR__BIN_LOOP(T, (U)((uint64_t)(U)x * (uint64_t)(U)y)); \
      break;                                                 \
    case TR_PG_MAX:                                          \
      TR__BIN_LOOP(T, x > y ? x : y);                        \
      break;                                                 \
    case TR_PG_MIN:                                          \
      TR__BIN_LOOP(T, x < y ? x : y);                        \
      break;                                                 \
    default:                                                 \
      break;                                                 \
  }

static float half_get(tr_dtype_t dt, uint16_t h) {
  return dt == TR_BF16 ? tr_bf16_to_f32(h) : tr_f16_to_f32(h);
}

static uint16_t half_put(tr_dtype_t dt, float f) {
  return dt == TR_BF16 ? tr_f32_to_bf16(f) : tr_f32_to_f16(f);
}

static void reduce_half(tr_dtype_t dt, tr_pg_reduce_op_t op, void* dst,
                        const void* a, const void* b, size_t n) {
  uint16_t* d = dst;
  const uint16_t* x = a;
  const uint16_t* y = b;
  for (size_t i = 0; i < n; i++) {
    float u = half_get(dt, x[i]), v = half_get(dt, y[i]), r;
    switch (op) {
      case TR_PG_PRODUCT:
        r = u * v;
        break;
      case TR_PG_MAX:
        r = u > v ? u : v;
        break;
      case TR_PG_MIN:
        r = u < v ? u : v;
        break;
      default:
        r = u + v;
        break;
    }
    d[i] = half_put(dt, r);
  }
}

/* float32 sums, the hot path (gradients): eight lanes at a time with GCC's
 * vector extension (two SSE adds on baseline x86-64; -O2 does not
 * vectorise loops that need an epilogue). */
typedef float tr__v8f __attribute__((vector_size(32)));

static void f32_add(float* d, const float* a, const float* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    tr__v8f x, y;
    memcpy(&x, a + i, sizeof x);
    memcpy(&y, b + i, sizeof y);
    x += y;
    memcpy(d + i, &x, sizeof x);
  }
  for (; i < n; i++) d[i] = a[i] + b[i];
}

void tr__reduce(tr_dtype_t dt, tr_pg_reduce_op_t op, void* dst, const void* a,
                const void* b, size_t n) {
  switch (dt) {
    case TR_F32:
      if (op == TR_PG_SUM || op == TR_PG_AVG)
        f32_add(dst, a, b, n); /* lane-wise: any aliasing of whole arrays */
      else
        TR__ALL_OPS(float);
      break;
    case TR_BF16:
    case TR_F16:
      reduce_half(dt, op, dst, a, b, n);
      break;
    case TR_I32:
      TR__WRAP_OPS(int32_t, uint32_t);
      break;
    case TR_I64:
      TR__WRAP_OPS(int64_t, uint64_t);
      break;
    case TR_U16:
      TR__WRAP_OPS(uint16_t, uint16_t);
      break;
    case TR_U8:
      TR__WRAP_OPS(uint8_t, uint8_t);
      break;
    default:
      break;
  }
}

void tr__divide(tr_dtype_t dt, void* x, size_t n, int divisor) {
  if (divisor <= 1) return;
  switch (dt) {
    case TR_F32: {
      float* p = x;
      for (size_t i = 0; i < n; i++) p[i] /= (float)divisor;
      break;
    }
    case TR_BF16:
    case TR_F16: {
      uint16_t* p = x;
      for (size_t i = 0; i < n; i++)
        p[i] = half_put(dt, half_get(dt, p[i]) / (float)divisor);
      break;
    }
    case TR_I32: {
      int32_t* p = x;
      for (size_t i = 0; i < n; i++) p[i] /= divisor;
      break;
    }
    case TR_I64: {
      int64_t* p = x;
      for (size_t i = 0; i < n; i++) p[i] /= divisor;
      break;
    }
    case TR_U16: {
      uint16_t* p = x;
      for (size_t i = 0; i < n; i++) p[i] = (uint16_t)(p[i] / divisor);
      break;
    }
    case TR_U8: {
      uint8_t* p = x;
      for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(p[i] / divisor);
      break;
    }
    default:
      break;
  }
}

int tr__reduce_in_f32(tr_dtype_t dt, tr_pg_reduce_op_t op) {
  return (dt == TR_BF16 || dt == TR_F16) &&
         (op == TR_PG_SUM || op == TR_PG_AVG || op == TR_PG_PRODUCT);
}

void tr__to_f32(tr_dtype_t dt, const void* src, float* dst, size_t n) {
  const uint16_t* s = src;
  for (size_t i = 0; i < n; i++) dst[i] = half_get(dt, s[i]);
}

void tr__from_f32(tr_dtype_t dt, const float* src, void* dst, size_t n) {
  uint16_t* d = dst;
  for (size_t i = 0; i < n; i++) d[i] = half_put(dt, src[i]);
}
