/* tests/check_tensor.c: dtypes, devices, views, copies and allocators. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/tensor.h"

static tr_tensor_t arange(int ndim, const int64_t* shape) {
  tr_tensor_t t;
  ck_assert_int_eq(tr_tensor_empty(&t, TR_F32, TR_DEVICE_CPU, ndim, shape), 0);
  float* p = tr_tensor_data(&t);
  for (int64_t i = 0; i < tr_tensor_numel(&t); i++) p[i] = (float)i;
  return t;
}

START_TEST(test_dtype_names_and_sizes) {
  ck_assert_uint_eq(tr_dtype_size(TR_BF16), 2);
  ck_assert_uint_eq(tr_dtype_size(TR_I64), 8);
  ck_assert_str_eq(tr_dtype_name(TR_BF16), "bfloat16");
  tr_dtype_t dt;
  ck_assert_int_eq(tr_dtype_parse("bf16", &dt), 0);
  ck_assert_int_eq(dt, TR_BF16);
  ck_assert_int_eq(tr_dtype_parse("float32", &dt), 0);
  ck_assert_int_eq(dt, TR_F32);
  ck_assert_int_eq(tr_dtype_parse("fp16", &dt), 0);
  ck_assert_int_eq(dt, TR_F16);
  ck_assert_int_eq(tr_dtype_parse("float128", &dt), TR_EINVAL);
}
END_TEST

START_TEST(test_half_conversions) {
  /* exact values survive */
  const float exact[] = {0.0f, 1.0f, -2.0f, 0.5f, 1.0f / 1024, 3.0f};
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
    ck_assert_float_eq(tr_f16_to_f32(tr_f32_to_f16(exact[i])), exact[i]);
    ck_assert_float_eq(tr_bf16_to_f32(tr_f32_to_bf16(exact[i])), exact[i]);
  }
  ck_assert_float_eq(tr_f16_to_f32(tr_f32_to_f16(65504.0f)), 65504.0f);
  /* known bit patterns */
  ck_assert_uint_eq(tr_f32_to_bf16(1.0f), 0x3f80);
  ck_assert_uint_eq(tr_f32_to_f16(1.0f), 0x3c00);
  ck_assert_uint_eq(tr_f32_to_f16(-2.0f), 0xc000);
  ck_assert_uint_eq(tr_f32_to_f16(1e6f), 0x7c00);          /* overflow -> inf */
  ck_assert_uint_eq(tr_f32_to_f16(5.9604645e-8f), 0x0001); /* min subnormal */
  ck_assert_float_eq(tr_f16_to_f32(0x0001), 5.9604645e-8f);
  ck_assert(isnan(tr_bf16_to_f32(tr_f32_to_bf16(NAN))));
  ck_assert(isnan(tr_f16_to_f32(tr_f32_to_f16(NAN))));
  /* round to nearest even: 1 + 2^-8 is halfway between bf16 1.0 and the next
   * value 1 + 2^-7; even mantissa wins (1.0) */
  ck_assert_uint_eq(tr_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  ck_assert_uint_eq(tr_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  /* relative error bound over a sweep */
  for (float x = -1000.0f; x < 1000.0f; x += 0.37f) {
    ck_assert_float_le(fabsf(tr_bf16_to_f32(tr_f32_to_bf16(x)) - x),
                       fabsf(x) / 256 + 1e-30f);
    ck_assert_float_le(fabsf(tr_f16_to_f32(tr_f32_to_f16(x)) - x),
                       fabsf(x) / 2048 + 6e-8f);
  }
}
END_TEST

START_TEST(test_device_parse) {
  tr_device_t d;
  char buf[16];
  ck_assert_int_eq(tr_device_parse("cpu", &d), 0);
  ck_assert_int_eq(d.type, TR_DEV_CPU);
  ck_assert_int_eq(tr_device_parse("cuda:3", &d), 0);
  ck_assert_int_eq(d.type, TR_DEV_CUDA);
  ck_assert_int_eq(d.index, 3);
  ck_assert_str_eq(tr_device_str(d, buf, sizeof buf), "cuda:3");
  ck_assert_int_eq(tr_device_parse("cuda", &d), 0);
  ck_assert_int_eq(d.index, 0);
  ck_assert_int_eq(tr_device_parse("cuda:", &d), TR_EINVAL);
  ck_assert_int_eq(tr_device_parse("cuda:x", &d), TR_EINVAL);
  ck_assert_int_eq(tr_device_parse("tpu", &d), TR_EINVAL);
  ck_assert_int_eq(tr_device_parse("cuda:999", &d), TR_EINVAL);
}
END_TEST

START_TEST(test_contiguous_strides) {
  int64_t shape[3] = {2, 3, 4};
  tr_tensor_t t = arange(3, shape);
  ck_assert_int_eq(t.stride[0], 12);
  ck_assert_int_eq(t.stride[1], 4);
  ck_assert_int_eq(t.stride[2], 1);
  ck_assert_int_eq(tr_tensor_numel(&t), 24);
  ck_assert_uint_eq(tr_tensor_nbytes(&t), 96);
  ck_assert(tr_tensor_is_contiguous(&t));
  char buf[32];
  ck_assert_str_eq(tr_tensor_shape_str(&t, buf, sizeof buf), "[2, 3, 4]");
  tr_tensor_release(&t);
}
END_TEST

START_TEST(test_narrow_and_transpose_views) {
  int64_t shape[2] = {4, 5};
  tr_tensor_t t = arange(2, shape), n, tt;
  ck_assert_int_eq(tr_tensor_narrow(&n, &t, 1, 1, 3), 0);
  ck_assert(!tr_tensor_is_contiguous(&n));
  ck_assert_int_eq(n.shape[1], 3);
  /* row 2, cols 1..3 -> 11, 12, 13 */
  ck_assert_double_eq(tr_tensor_get(&n, 2 * 3 + 0), 11);
  ck_assert_double_eq(tr_tensor_get(&n, 2 * 3 + 2), 13);
  /* narrowing rows stays contiguous and shares the buffer */
  tr_tensor_t rows;
  ck_assert_int_eq(tr_tensor_narrow(&rows, &t, 0, 1, 2), 0);
  ck_assert(tr_tensor_is_contiguous(&rows));
  ck_assert_ptr_eq(tr_tensor_data(&rows), (float*)tr_tensor_data(&t) + 5);
  ck_assert_int_eq(tr_tensor_narrow(&rows, &t, 0, 3, 2), TR_EINVAL);
  ck_assert_int_eq(tr_tensor_transpose(&tt, &t, 0, 1), 0);
  ck_assert_int_eq(tt.shape[0], 5);
  ck_assert_double_eq(tr_tensor_get(&tt, 1 * 4 + 2), 11); /* tt[1][2] = t[2][1] */
  /* writes through a view are seen by the base */
  ((float*)tr_tensor_data(&n))[0] = -1;
  ck_assert_double_eq(tr_tensor_get(&t, 1), -1);
  tr_tensor_release(&n);
  tr_tensor_release(&rows);
  tr_tensor_release(&tt);
  tr_tensor_release(&t);
}
END_TEST

START_TEST(test_chunk_matches_torch) {
  /* torch.chunk(arange(10), 4) -> sizes 3,3,3,1;  chunk(arange(5), 4) -> 2,2,1
   * and a 4th empty shard for DTensor */
  int64_t s, l;
  const int64_t want10[4][2] = {{0, 3}, {3, 3}, {6, 3}, {9, 1}};
  for (int i = 0; i < 4; i++) {
    tr_chunk_range(10, 4, i, &s, &l);
    ck_assert_int_eq(s, want10[i][0]);
    ck_assert_int_eq(l, want10[i][1]);
  }
  const int64_t want5[4][2] = {{0, 2}, {2, 2}, {4, 1}, {5, 0}};
  for (int i = 0; i < 4; i++) {
    tr_chunk_range(5, 4, i, &s, &l);
    ck_assert_int_eq(s, want5[i][0]);
    ck_assert_int_eq(l, want5[i][1]);
  }
  int64_t shape[2] = {5, 2};
  tr_tensor_t t = arange(2, shape), c;
  ck_assert_int_eq(tr_tensor_chunk(&c, &t, 0, 4, 2), 0);
  ck_assert_int_eq(c.shape[0], 1);
  ck_assert_double_eq(tr_tensor_get(&c, 1), 9);
  tr_tensor_release(&c);
  ck_assert_int_eq(tr_tensor_chunk(&c, &t, 0, 4, 3), 0);
  ck_assert_int_eq(tr_tensor_numel(&c), 0);
  tr_tensor_release(&c);
  ck_assert_int_eq(tr_tensor_chunk(&c, &t, 0, 4, 4), TR_EINVAL);
  tr_tensor_release(&t);
}
END_TEST

START_TEST(test_in_place_views_keep_one_reference) {
  tr_mem_stats_t s0, s1;
  tr_mem_stats(TR_MEM_HOST, 0, &s0);
  int64_t shape[2] = {4, 6}, flat[1] = {24};
  tr_tensor_t t = arange(2, shape);
  ck_assert_int_eq(tr_tensor_transpose(&t, &t, 0, 1), 0);
  ck_assert_int_eq(tr_tensor_narrow(&t, &t, 0, 1, 2), 0);
  ck_assert_double_eq(tr_tensor_get(&t, 0), 1); /* t^T[1][0] = t[0][1] */
  tr_tensor_t u = arange(2, shape);
  ck_assert_int_eq(tr_tensor_reshape(&u, &u, 1, flat), 0);
  ck_assert_int_eq(tr_tensor_chunk(&u, &u, 0, 4, 3), 0);
  ck_assert_double_eq(tr_tensor_get(&u, 0), 18);
  tr_tensor_release(&t);
  tr_tensor_release(&u);
  /* one release each frees both buffers: no reference leaked */
  tr_mem_stats(TR_MEM_HOST, 0, &s1);
  ck_assert_int_eq(s1.current_bytes, s0.current_bytes);
  ck_assert_int_eq(s1.live_allocs, s0.live_allocs);
}
END_TEST

START_TEST(test_reshape) {
  int64_t shape[2] = {4, 6}, ns[3] = {2, -1, 3}, bad[2] = {5, 5};
  tr_tensor_t t = arange(2, shape), r, tt;
  ck_assert_int_eq(tr_tensor_reshape(&r, &t, 3, ns), 0);
  ck_assert_int_eq(r.shape[1], 4);
  ck_assert_double_eq(tr_tensor_get(&r, 23), 23);
  tr_tensor_release(&r);
  ck_assert_int_eq(tr_tensor_reshape(&r, &t, 2, bad), TR_ESHAPE);
  ck_assert_int_eq(tr_tensor_transpose(&tt, &t, 0, 1), 0);
  ck_assert_int_eq(tr_tensor_reshape(&r, &tt, 3, ns), TR_EINVAL); /* strided */
  tr_tensor_release(&tt);
  tr_tensor_release(&t);
}
END_TEST

START_TEST(test_copy_converts_and_gathers) {
  int64_t shape[2] = {3, 4};
  tr_tensor_t t = arange(2, shape), tt, c, b;
  ck_assert_int_eq(tr_tensor_transpose(&tt, &t, 0, 1), 0);
  ck_assert_int_eq(tr_tensor_contiguous(&c, &tt), 0);
  ck_assert(tr_tensor_is_contiguous(&c));
  ck_assert_ptr_ne(tr_tensor_data(&c), tr_tensor_data(&t));
  const float* p = tr_tensor_data(&c);
  ck_assert_float_eq(p[1], 4); /* c[0][1] = t[1][0] */
  ck_assert_float_eq(p[4], 5); /* c[1][1] = t[1][1] */
  ck_assert_float_eq(p[5], 9); /* c[1][2] = t[2][1] */
  ck_assert_int_eq(tr_tensor_empty(&b, TR_BF16, TR_DEVICE_CPU, 2, c.shape), 0);
  ck_assert_int_eq(tr_tensor_copy(&b, &c), 0);
  ck_assert_uint_eq(((uint16_t*)tr_tensor_data(&b))[1], tr_f32_to_bf16(4.0f));
  ck_assert_double_eq(tr_tensor_get(&b, 11), 11);
  int64_t other[2] = {3, 3};
  tr_tensor_t wrong;
  ck_assert_int_eq(tr_tensor_zeros(&wrong, TR_F32, TR_DEVICE_CPU, 2, other), 0);
  ck_assert_int_eq(tr_tensor_copy(&wrong, &c), TR_ESHAPE);
  ck_assert_int_eq(tr_tensor_fill(&wrong, 2.5), 0);
  ck_assert_double_eq(tr_tensor_get(&wrong, 8), 2.5);
  tr_tensor_release(&wrong);
  tr_tensor_release(&b);
  tr_tensor_release(&c);
  tr_tensor_release(&tt);
  tr_tensor_release(&t);
}
END_TEST

/* Strided host copies move runs: a narrowed source (a CP chunk of
 * [B, T, W] is B runs) into a transposed, narrowed destination, in one
 * dtype and converting, leave every element where the logical index puts
 * it and the destination's other elements as they were. */
START_TEST(test_copy_strided_views) {
  int64_t shape[4] = {2, 5, 6, 3};
  tr_tensor_t src = arange(4, shape), a, b;
  ck_assert_int_eq(tr_tensor_narrow(&a, &src, 1, 1, 3), 0);
  ck_assert_int_eq(tr_tensor_narrow(&b, &a, 2, 2, 1), 0); /* [2,3,1,3] */
  tr_tensor_release(&a);
  ck_assert_int_eq(tr_tensor_narrow(&a, &src, 1, 1, 3), 0); /* [2,3,6,3] */
  for (int dt = 0; dt < 2; dt++) {
    tr_dtype_t type = dt ? TR_BF16 : TR_F32;
    /* the destination: [2,3,3,7] zeros, narrowed to [2,3,3,6] and
     * transposed to [2,3,6,3] */
    int64_t big[4] = {2, 3, 3, 7};
    tr_tensor_t z, zn, zt, zb, zbn;
    ck_assert_int_eq(tr_tensor_zeros(&z, type, TR_DEVICE_CPU, 4, big), 0);
    ck_assert_int_eq(tr_tensor_narrow(&zn, &z, 3, 1, 6), 0);
    ck_assert_int_eq(tr_tensor_transpose(&zt, &zn, 2, 3), 0);
    ck_assert_int_eq(tr_tensor_copy(&zt, &a), 0);
    for (int64_t i = 0; i < tr_tensor_numel(&a); i++)
      ck_assert_double_eq(tr_tensor_get(&zt, i), tr_tensor_get(&a, i));
    double sum = 0, want = 0;
    for (int64_t i = 0; i < tr_tensor_numel(&z); i++)
      sum += tr_tensor_get(&z, i);
    for (int64_t i = 0; i < tr_tensor_numel(&a); i++)
      want += tr_tensor_get(&a, i);
    ck_assert_double_eq(sum, want); /* nothing outside the view written */
    /* a size-1 dim in the middle, into a contiguous destination */
    ck_assert_int_eq(tr_tensor_empty(&zb, type, TR_DEVICE_CPU, 4, b.shape), 0);
    ck_assert_int_eq(tr_tensor_copy(&zb, &b), 0);
    for (int64_t i = 0; i < tr_tensor_numel(&b); i++)
      ck_assert_double_eq(tr_tensor_get(&zb, i), tr_tensor_get(&b, i));
    /* and back into a strided view of the source's layout */
    ck_assert_int_eq(tr_tensor_narrow(&zbn, &zt, 2, 4, 1), 0);
    ck_assert_int_eq(tr_tensor_copy(&zbn, &zb), 0);
    for (int64_t i = 0; i < tr_tensor_numel(&b); i++)
      ck_assert_double_eq(tr_tensor_get(&zbn, i), tr_tensor_get(&b, i));
    tr_tensor_release(&zbn);
    tr_tensor_release(&zb);
    tr_tensor_release(&zt);
    tr_tensor_release(&zn);
    tr_tensor_release(&z);
  }
  tr_tensor_release(&b);
  tr_tensor_release(&a);
  tr_tensor_release(&src);
}
END_TEST

START_TEST(test_allocator_accounting) {
  tr_mem_stats_t s0, s1, s2;
  tr_mem_stats(TR_MEM_HOST, 0, &s0);
  int64_t shape[1] = {1000};
  tr_tensor_t a, b, v;
  ck_assert_int_eq(tr_tensor_empty(&a, TR_F32, TR_DEVICE_CPU, 1, shape), 0);
  ck_assert_int_eq(tr_tensor_empty(&b, TR_I64, TR_DEVICE_CPU, 1, shape), 0);
  ck_assert_uint_eq((uintptr_t)tr_tensor_data(&a) % 64, 0);
  tr_mem_stats(TR_MEM_HOST, 0, &s1);
  ck_assert_int_eq(s1.current_bytes - s0.current_bytes, 12000);
  ck_assert_int_eq(s1.live_allocs - s0.live_allocs, 2);
  /* a view keeps the buffer alive after the base is released */
  tr_tensor_view(&v, &a);
  tr_tensor_release(&a);
  tr_tensor_release(&b);
  tr_mem_stats(TR_MEM_HOST, 0, &s2);
  ck_assert_int_eq(s2.current_bytes - s0.current_bytes, 4000);
  ck_assert_int_ge(s2.peak_bytes, s0.current_bytes + 12000);
  tr_tensor_release(&v);
  tr_tensor_release(&v); /* releasing twice is safe */
  tr_mem_stats(TR_MEM_HOST, 0, &s2);
  ck_assert_int_eq(s2.current_bytes, s0.current_bytes);
  ck_assert_int_eq(s2.total_allocs - s0.total_allocs, 2);
  tr_mem_reset_peak(TR_MEM_HOST, 0);
  tr_mem_stats(TR_MEM_HOST, 0, &s2);
  ck_assert_int_eq(s2.peak_bytes, s2.current_bytes);
}
END_TEST

/* A freed host block of 128 KiB or more is kept and serves the next
 * allocation of its size (no new mapping), counted as freed meanwhile. */
START_TEST(test_host_blocks_reused) {
  int64_t shape[1] = {65536}; /* 256 KiB of fp32 */
  tr_tensor_t a, b;
  tr_mem_stats_t s0, s1;
  tr_mem_stats(TR_MEM_HOST, 0, &s0);
  ck_assert_int_eq(tr_tensor_empty(&a, TR_F32, TR_DEVICE_CPU, 1, shape), 0);
  void* pa = tr_tensor_data(&a);
  memset(pa, 7, tr_tensor_nbytes(&a));
  tr_tensor_release(&a);
  tr_mem_stats(TR_MEM_HOST, 0, &s1);
  ck_assert_int_eq(s1.current_bytes, s0.current_bytes);
  ck_assert_int_eq(s1.live_allocs, s0.live_allocs);
  ck_assert_int_eq(tr_tensor_empty(&b, TR_F32, TR_DEVICE_CPU, 1, shape), 0);
  ck_assert_ptr_eq(tr_tensor_data(&b), pa);
  ck_assert_uint_eq((uintptr_t)tr_tensor_data(&b) % 64, 0);
  memset(tr_tensor_data(&b), 0, tr_tensor_nbytes(&b)); /* usable again */
  tr_tensor_release(&b);
  tr_mem_stats(TR_MEM_HOST, 0, &s1);
  ck_assert_int_eq(s1.total_allocs - s0.total_allocs, 2);
  ck_assert_int_eq(s1.current_bytes, s0.current_bytes);
}
END_TEST

#ifdef __SANITIZE_ADDRESS__
/* Under ASan a kept block is poisoned: a write after its free aborts
 * (ASAN_OPTIONS abort_on_error=1, as CI runs). */
START_TEST(test_host_block_use_after_free_caught) {
  int64_t shape[1] = {65536};
  tr_tensor_t a;
  ck_assert_int_eq(tr_tensor_empty(&a, TR_F32, TR_DEVICE_CPU, 1, shape), 0);
  volatile float* p = tr_tensor_data(&a);
  tr_tensor_release(&a);
  p[100] = 1.0f;
}
END_TEST
#endif

START_TEST(test_pinned_and_wrap) {
  int64_t shape[1] = {256};
  tr_mem_stats_t s0, s1;
  tr_mem_stats(TR_MEM_PINNED, 0, &s0);
  tr_tensor_t p;
  int rc = tr_tensor_empty_pinned(&p, TR_U8, 1, shape);
  if (rc == TR_ECUDA) return; /* CUDA build on a machine without a GPU */
  ck_assert_int_eq(rc, 0);
  tr_mem_stats(TR_MEM_PINNED, 0, &s1);
  ck_assert_int_eq(s1.current_bytes - s0.current_bytes, 256);
  tr_tensor_release(&p);
  float buf[4] = {1, 2, 3, 4};
  int64_t s4[1] = {4};
  tr_tensor_t w;
  tr_mem_stats(TR_MEM_HOST, 0, &s0);
  ck_assert_int_eq(tr_tensor_wrap(&w, buf, TR_F32, TR_DEVICE_CPU, 1, s4), 0);
  ck_assert_double_eq(tr_tensor_get(&w, 3), 4);
  tr_tensor_release(&w); /* must not free the stack buffer */
  tr_mem_stats(TR_MEM_HOST, 0, &s1);
  ck_assert_int_eq(s1.current_bytes, s0.current_bytes);
}
END_TEST

START_TEST(test_device_tensor_without_gpu) {
  int64_t shape[1] = {16};
  tr_tensor_t t;
  tr_device_t cuda = {TR_DEV_CUDA, 0};
  if (tr_cuda_device_count() > 0) {
    /* on a GPU machine: a real round trip through the device */
    ck_assert_int_eq(tr_tensor_empty(&t, TR_BF16, cuda, 1, shape), 0);
    tr_tensor_t h, back;
    ck_assert_int_eq(tr_tensor_empty(&h, TR_BF16, TR_DEVICE_CPU, 1, shape), 0);
    ck_assert_int_eq(tr_tensor_fill(&t, 3.0), 0);
    ck_assert_int_eq(tr_tensor_copy(&h, &t), 0);
    ck_assert_double_eq(tr_tensor_get(&h, 15), 3.0);
    ck_assert_int_eq(tr_tensor_empty(&back, TR_F32, cuda, 1, shape), 0);
    ck_assert_int_eq(tr_tensor_copy(&back, &t), 0);
    tr_tensor_release(&back);
    tr_tensor_release(&h);
    tr_tensor_release(&t);
    return;
  }
  int rc = tr_tensor_empty(&t, TR_F32, cuda, 1, shape);
  ck_assert(rc == TR_EUNSUPPORTED || rc == TR_ECUDA);
}
END_TEST

START_TEST(test_bad_shapes) {
  tr_tensor_t t;
  int64_t neg[1] = {-1}, zero[2] = {0, 5}, huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 4};
  ck_assert_int_eq(tr_tensor_empty(&t, TR_F32, TR_DEVICE_CPU, 1, neg), TR_EINVAL);
  ck_assert_int_eq(tr_tensor_empty(&t, TR_F32, TR_DEVICE_CPU, 9, zero), TR_EINVAL);
  ck_assert_int_eq(tr_tensor_empty(&t, TR_F32, TR_DEVICE_CPU, 3, huge), TR_ELIMIT);
  ck_assert_int_eq(tr_tensor_empty(&t, TR_F32, TR_DEVICE_CPU, 2, zero), 0);
  ck_assert_int_eq(tr_tensor_numel(&t), 0);
  ck_assert_ptr_nonnull(tr_tensor_data(&t));
  tr_tensor_release(&t);
  /* a scalar */
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 0, NULL), 0);
  ck_assert_int_eq(tr_tensor_numel(&t), 1);
  tr_tensor_release(&t);
}
END_TEST

int main(void) {
  Suite* s = suite_create("tensor");
  TCase* tc = tcase_create("dtype");
  tcase_add_test(tc, test_dtype_names_and_sizes);
  tcase_add_test(tc, test_half_conversions);
  tcase_add_test(tc, test_device_parse);
  suite_add_tcase(s, tc);
  tc = tcase_create("views");
  tcase_add_test(tc, test_contiguous_strides);
  tcase_add_test(tc, test_narrow_and_transpose_views);
  tcase_add_test(tc, test_chunk_matches_torch);
  tcase_add_test(tc, test_reshape);
  tcase_add_test(tc, test_in_place_views_keep_one_reference);
  tcase_add_test(tc, test_copy_converts_and_gathers);
  tcase_add_test(tc, test_copy_strided_views);
  tcase_add_test(tc, test_bad_shapes);
  suite_add_tcase(s, tc);
  tc = tcase_create("alloc");
  tcase_add_test(tc, test_allocator_accounting);
  tcase_add_test(tc, test_host_blocks_reused);
#ifdef __SANITIZE_ADDRESS__
  if (strstr(getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "",
             "abort_on_error=1"))
    tcase_add_test_raise_signal(tc, test_host_block_use_after_free_caught,
                                SIGABRT);
#endif
  tcase_add_test(tc, test_pinned_and_wrap);
  tcase_add_test(tc, test_device_tensor_without_gpu);
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
