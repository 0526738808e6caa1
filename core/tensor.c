/* core/tensor.c: dtypes, devices, reference-counted storage, strided views,
 * copies and fills (see tensor.h). Device work goes through core/cuda.cu. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/cuda.h"
#include "trainrun/error.h"
#include "trainrun/tensor.h"

struct tr_storage {
  int refcount; /* atomic */
  void* data;
  size_t nbytes;
  tr_mem_kind_t kind;
  int device;
  int owned; /* 0 for tr_tensor_wrap: never freed here */
};

/* ---- dtypes ---- */

static const struct {
  const char* torch;
  const char* short_name;
  size_t size;
} dtypes[TR_DTYPE__COUNT] = {
#define TR__DTYPE_ROW(name, torch, short_name, size) {torch, short_name, size},
    TR_DTYPE_MAP(TR__DTYPE_ROW)
#undef TR__DTYPE_ROW
};

size_t tr_dtype_size(tr_dtype_t dt) {
  return (unsigned)dt < TR_DTYPE__COUNT ? dtypes[dt].size : 0;
}

const char* tr_dtype_name(tr_dtype_t dt) {
  return (unsigned)dt < TR_DTYPE__COUNT ? dtypes[dt].torch : "invalid";
}

int tr_dtype_parse(const char* s, tr_dtype_t* out) {
  static const struct {
    const char* alias;
    tr_dtype_t dt;
  } aliases[] = {{"fp32", TR_F32}, {"float", TR_F32},  {"fp16", TR_F16},
                 {"half", TR_F16}, {"bfloat", TR_BF16}, {"long", TR_I64},
                 {"int", TR_I32}};
  for (int i = 0; i < TR_DTYPE__COUNT; i++)
    if (strcasecmp(s, dtypes[i].torch) == 0 ||
        strcasecmp(s, dtypes[i].short_name) == 0)
      return *out = (tr_dtype_t)i, 0;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcasecmp(s, aliases[i].alias) == 0) return *out = aliases[i].dt, 0;
  return TR_EINVAL;
}

int tr_dtype_is_float(tr_dtype_t dt) {
  return dt == TR_F32 || dt == TR_BF16 || dt == TR_F16;
}

uint16_t tr_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow: inf */
  if (absu < 0x38800000u) {
    /* subnormal or zero in f16: scale into the subnormal grid, round even */
    float af;
    memcpy(&af, &absu, 4);
    float scaled = af * 16777216.0f; /* 2^24: one unit = smallest subnormal */
    uint32_t m = (uint32_t)scaled;
    float rem = scaled - (float)m;
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
    return (uint16_t)(sign | m);
  }
  /* normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits */
  uint32_t r = absu - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

float tr_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = ldexpf((float)man, -24);
    if (sign) f = -f;
    return f;
  }
  uint32_t u;
  if (exp == 31)
    u = sign | 0x7f800000u | (man << 13);
  else
    u = sign | ((exp + 112u) << 23) | (man << 13);
  memcpy(&f, &u, 4);
  return f;
}

/* ---- devices ---- */

int tr_device_parse(const char* s, tr_device_t* out) {
  if (strcmp(s, "cpu") == 0) return *out = TR_DEVICE_CPU, 0;
  if (strncmp(s, "cuda", 4) != 0) return TR_EINVAL;
  if (s[4] == '\0') return *out = (tr_device_t){TR_DEV_CUDA, 0}, 0;
  if (s[4] != ':' || s[5] < '0' || s[5] > '9') return TR_EINVAL;
  char* end;
  long idx = strtol(s + 5, &end, 10);
  if (*end || idx < 0 || idx >= TR_MAX_DEVICES) return TR_EINVAL;
  *out = (tr_device_t){TR_DEV_CUDA, (int)idx};
  return 0;
}

const char* tr_device_str(tr_device_t d, char* buf, size_t n) {
  if (d.type == TR_DEV_CPU)
    snprintf(buf, n, "cpu");
  else
    snprintf(buf, n, "cuda:%d", d.index);
  return buf;
}

int tr_device_eq(tr_device_t a, tr_device_t b) {
  return a.type == b.type && (a.type == TR_DEV_CPU || a.index == b.index);
}

int tr_cuda_device_count(void) {
#ifdef HAVE_CUDA
  return tr__cuda_device_count();
#else
  return 0;
#endif
}

int tr_cuda_set_device(int index, char* name, size_t cap) {
  if (name && cap) name[0] = '\0';
  if (index < 0 || index >= tr_cuda_device_count()) return TR_EDEVICE;
#ifdef HAVE_CUDA
  return tr__cuda_set_device(index, name, cap);
#else
  return TR_EDEVICE;
#endif
}

int tr_cuda_synchronize(void) {
#ifdef HAVE_CUDA
  return tr_cuda_device_count() > 0 ? tr__cuda_synchronize() : 0;
#else
  return 0;
#endif
}

/* ---- storage ---- */

static int storage_new(tr_mem_kind_t kind, int device, size_t nbytes,
                       tr_storage_t** out) {
  tr_storage_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  int rc = tr_mem_alloc(kind, device, nbytes, &s->data);
  if (rc < 0) {
    free(s);
    return rc;
  }
  s->refcount = 1;
  s->nbytes = nbytes;
  s->kind = kind;
  s->device = device;
  s->owned = 1;
  *out = s;
  return 0;
}

static void storage_unref(tr_storage_t* s) {
  if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (s->owned) tr_mem_free(s->kind, s->device, s->data, s->nbytes);
  free(s);
}

/* ---- construction ---- */

static int set_shape(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev, int ndim,
                     const int64_t* shape) {
  if (ndim < 0 || ndim > TR_MAX_DIMS || (unsigned)dt >= TR_DTYPE__COUNT)
    return TR_EINVAL;
  memset(t, 0, sizeof *t);
  t->ndim = ndim;
  t->dtype = dt;
  t->device = dev;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    if (shape[d] < 0) return TR_EINVAL;
    t->shape[d] = shape[d];
    t->stride[d] = stride;
    /* overflow guard: no tensor beyond 2^62 elements */
    if (shape[d] > 0 && stride > (INT64_C(1) << 62) / shape[d]) return TR_ELIMIT;
    stride *= shape[d] > 0 ? shape[d] : 1;
  }
  return 0;
}

static int tensor_alloc(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev,
                        int ndim, const int64_t* shape, tr_mem_kind_t kind) {
  TR_CHECK(set_shape(t, dt, dev, ndim, shape));
  return storage_new(kind, dev.index, tr_tensor_nbytes(t), &t->storage);
}

int tr_tensor_empty(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev, int ndim,
                    const int64_t* shape) {
  tr_mem_kind_t kind = dev.type == TR_DEV_CUDA ? TR_MEM_DEVICE : TR_MEM_HOST;
  return tensor_alloc(t, dt, dev, ndim, shape, kind);
}

int tr_tensor_empty_pinned(tr_tensor_t* t, tr_dtype_t dt, int ndim,
                           const int64_t* shape) {
  return tensor_alloc(t, dt, TR_DEVICE_CPU, ndim, shape, TR_MEM_PINNED);
}

int tr_tensor_zeros(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev, int ndim,
                    const int64_t* shape) {
  TR_CHECK(tr_tensor_empty(t, dt, dev, ndim, shape));
  int rc = tr_tensor_fill(t, 0.0);
  if (rc < 0) tr_tensor_release(t);
  return rc;
}

int tr_tensor_wrap(tr_tensor_t* t, void* data, tr_dtype_t dt, tr_device_t dev,
                   int ndim, const int64_t* shape) {
  TR_CHECK(set_shape(t, dt, dev, ndim, shape));
  tr_storage_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  s->refcount = 1;
  s->data = data;
  s->nbytes = tr_tensor_nbytes(t);
  s->kind = dev.type == TR_DEV_CUDA ? TR_MEM_DEVICE : TR_MEM_HOST;
  s->device = dev.index;
  s->owned = 0;
  t->storage = s;
  return 0;
}

void tr_tensor_release(tr_tensor_t* t) {
  storage_unref(t->storage);
  t->storage = NULL;
}

void tr_tensor_view(tr_tensor_t* dst, const tr_tensor_t* src) {
  if (src->storage) __atomic_add_fetch(&src->storage->refcount, 1, __ATOMIC_RELAXED);
  if (dst != src) *dst = *src;
}

/* Store view v of src into dst: a new reference, unless dst is src itself,
 * whose reference the view takes over. */
static void view_assign(tr_tensor_t* dst, const tr_tensor_t* src,
                        const tr_tensor_t* v) {
  if (dst != src && v->storage)
    __atomic_add_fetch(&v->storage->refcount, 1, __ATOMIC_RELAXED);
  *dst = *v;
}

/* ---- views ---- */

void tr_chunk_range(int64_t n, int chunks, int index, int64_t* start,
                    int64_t* len) {
  if (chunks <= 0 || index < 0) {
    *start = 0;
    *len = 0;
    return;
  }
  int64_t size = (n + chunks - 1) / chunks;
  int64_t s = size * index;
  if (s > n) s = n;
  int64_t e = s + size;
  if (e > n) e = n;
  *start = s;
  *len = e - s;
}

int tr_tensor_narrow(tr_tensor_t* dst, const tr_tensor_t* src, int dim,
                     int64_t start, int64_t length) {
  if (dim < 0 || dim >= src->ndim || start < 0 || length < 0 ||
      start + length > src->shape[dim])
    return TR_EINVAL;
  tr_tensor_t v = *src;
  v.offset += start * src->stride[dim];
  v.shape[dim] = length;
  view_assign(dst, src, &v);
  return 0;
}

int tr_tensor_chunk(tr_tensor_t* dst, const tr_tensor_t* src, int dim,
                    int chunks, int index) {
  if (dim < 0 || dim >= src->ndim || chunks <= 0 || index < 0 ||
      index >= chunks)
    return TR_EINVAL;
  int64_t start, len;
  tr_chunk_range(src->shape[dim], chunks, index, &start, &len);
  return tr_tensor_narrow(dst, src, dim, start, len);
}

int tr_tensor_reshape(tr_tensor_t* dst, const tr_tensor_t* src, int ndim,
                      const int64_t* shape) {
  if (!tr_tensor_is_contiguous(src) || ndim < 0 || ndim > TR_MAX_DIMS)
    return TR_EINVAL;
  int64_t shp[TR_MAX_DIMS], known = 1, numel = tr_tensor_numel(src);
  int infer = -1;
  for (int d = 0; d < ndim; d++) {
    shp[d] = shape[d];
    if (shape[d] == -1) {
      if (infer >= 0) return TR_EINVAL;
      infer = d;
    } else if (shape[d] < 0) {
      return TR_EINVAL;
    } else {
      known *= shape[d];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known) return TR_ESHAPE;
    shp[infer] = numel / known;
  } else if (known != numel) {
    return TR_ESHAPE;
  }
  tr_tensor_t v;
  TR_CHECK(set_shape(&v, src->dtype, src->device, ndim, shp));
  v.storage = src->storage;
  v.offset = src->offset;
  view_assign(dst, src, &v);
  return 0;
}

int tr_tensor_transpose(tr_tensor_t* dst, const tr_tensor_t* src, int d0,
                        int d1) {
  if (d0 < 0 || d1 < 0 || d0 >= src->ndim || d1 >= src->ndim) return TR_EINVAL;
  tr_tensor_t v = *src;
  v.shape[d0] = src->shape[d1];
  v.shape[d1] = src->shape[d0];
  v.stride[d0] = src->stride[d1];
  v.stride[d1] = src->stride[d0];
  view_assign(dst, src, &v);
  return 0;
}

/* ---- queries ---- */

int64_t tr_tensor_numel(const tr_tensor_t* t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

size_t tr_tensor_nbytes(const tr_tensor_t* t) {
  return (size_t)tr_tensor_numel(t) * tr_dtype_size(t->dtype);
}

int tr_tensor_is_contiguous(const tr_tensor_t* t) {
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] == 1) continue; /* any stride is fine for size-1 dims */
    if (t->shape[d] == 0) return 1;
    if (t->stride[d] != expect) return 0;
    expect *= t->shape[d];
  }
  return 1;
}

void* tr_tensor_data(const tr_tensor_t* t) {
  if (!t->storage) return NULL;
  return (char*)t->storage->data + t->offset * (int64_t)tr_dtype_size(t->dtype);
}

int tr_tensor_same_shape(const tr_tensor_t* a, const tr_tensor_t* b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

const char* tr_tensor_shape_str(const tr_tensor_t* t, char* buf, size_t n) {
  size_t off = 0;
  off += (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->ndim && off < n; d++)
    off += (size_t)snprintf(buf + off, n - off, d ? ", %lld" : "%lld",
                            (long long)t->shape[d]);
  if (off < n) snprintf(buf + off, n - off, "]");
  return buf;
}

/* ---- element access (host) ---- */

static double load_elem(const void* base, tr_dtype_t dt, int64_t i) {
  switch (dt) {
    case TR_F32: return ((const float*)base)[i];
    case TR_BF16: return tr_bf16_to_f32(((const uint16_t*)base)[i]);
    case TR_F16: return tr_f16_to_f32(((const uint16_t*)base)[i]);
    case TR_I32: return ((const int32_t*)base)[i];
    case TR_I64: return (double)((const int64_t*)base)[i];
    case TR_U16: return ((const uint16_t*)base)[i];
    case TR_U8: return ((const uint8_t*)base)[i];
    default: return 0;
  }
}

static void store_elem(void* base, tr_dtype_t dt, int64_t i, double v) {
  switch (dt) {
    case TR_F32: ((float*)base)[i] = (float)v; break;
    case TR_BF16: ((uint16_t*)base)[i] = tr_f32_to_bf16((float)v); break;
    case TR_F16: ((uint16_t*)base)[i] = tr_f32_to_f16((float)v); break;
    case TR_I32: ((int32_t*)base)[i] = (int32_t)v; break;
    case TR_I64: ((int64_t*)base)[i] = (int64_t)v; break;
    case TR_U16: ((uint16_t*)base)[i] = (uint16_t)v; break;
    case TR_U8: ((uint8_t*)base)[i] = (uint8_t)v; break;
    default: break;
  }
}

/* Element offset (from the storage base) of logical row-major index i. */
static int64_t elem_offset(const tr_tensor_t* t, int64_t i) {
  int64_t off = t->offset;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t n = t->shape[d];
    off += (i % n) * t->stride[d];
    i /= n;
  }
  return off;
}

double tr_tensor_get(const tr_tensor_t* t, int64_t i) {
  if (!t->storage || t->device.type != TR_DEV_CPU) return NAN;
  return load_elem(t->storage->data, t->dtype, elem_offset(t, i));
}

/* ---- copy and fill ---- */

/* dst = src on the host, of one shape, either strided. Dims of size 1
 * drop out and neighbours that both sides lay out as one run merge, so
 * a narrowed [B, T, W] chunk is B runs of T x W elements. The outer dims
 * are walked with a counter (no division per element) and the innermost
 * is moved as a run: memcpy where both sides have unit stride and one
 * dtype (memmove where they share a storage: ASan's memmove is a plain
 * byte loop, its memcpy libc's), else element by element (a dtype
 * conversion). Two contiguous tensors of one dtype are one run. */
static void copy_strided_cpu(tr_tensor_t* dst, const tr_tensor_t* src) {
  int64_t shp[TR_MAX_DIMS], ds[TR_MAX_DIMS], ss[TR_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < src->ndim; d++) {
    if (src->shape[d] == 1) continue;
    if (nd > 0 && ds[nd - 1] == dst->stride[d] * src->shape[d] &&
        ss[nd - 1] == src->stride[d] * src->shape[d]) {
      shp[nd - 1] *= src->shape[d]; /* the previous dim continues here */
      ds[nd - 1] = dst->stride[d];
      ss[nd - 1] = src->stride[d];
      continue;
    }
    shp[nd] = src->shape[d];
    ds[nd] = dst->stride[d];
    ss[nd] = src->stride[d];
    nd++;
  }
  if (nd == 0) { /* one element */
    shp[0] = 1;
    ds[0] = ss[0] = 1;
    nd = 1;
  }
  int64_t run = shp[nd - 1], rds = ds[nd - 1], rss = ss[nd - 1];
  size_t es = tr_dtype_size(src->dtype);
  int same = dst->dtype == src->dtype;
  int memcpy_run = same && rds == 1 && rss == 1;
  int overlap = dst->storage == src->storage; /* then memmove */
  char* dbase = dst->storage->data;
  const char* sbase = src->storage->data;
  int64_t idx[TR_MAX_DIMS] = {0};
  int64_t doff = dst->offset, soff = src->offset;
  for (;;) {
    if (memcpy_run && overlap) {
      memmove(dbase + doff * (int64_t)es, sbase + soff * (int64_t)es,
              (size_t)run * es);
    } else if (memcpy_run) {
      memcpy(dbase + doff * (int64_t)es, sbase + soff * (int64_t)es,
             (size_t)run * es);
    } else if (same && src->dtype == TR_F32) {
      float* d = (float*)dbase + doff;
      const float* sp = (const float*)sbase + soff;
      for (int64_t i = 0; i < run; i++) d[i * rds] = sp[i * rss];
    } else {
      for (int64_t i = 0; i < run; i++)
        store_elem(dbase, dst->dtype, doff + i * rds,
                   load_elem(sbase, src->dtype, soff + i * rss));
    }
    int d = nd - 2; /* the next run: a counter over the outer dims */
    for (; d >= 0; d--) {
      doff += ds[d];
      soff += ss[d];
      if (++idx[d] < shp[d]) break;
      doff -= ds[d] * shp[d];
      soff -= ss[d] * shp[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

int tr_tensor_copy(tr_tensor_t* dst, const tr_tensor_t* src) {
  if (!tr_tensor_same_shape(dst, src)) return TR_ESHAPE;
  if (!dst->storage || !src->storage) return tr_tensor_numel(dst) ? TR_EINVAL : 0;
  int64_t n = tr_tensor_numel(src);
  if (n == 0) return 0;
  if (dst->device.type == TR_DEV_CPU && src->device.type == TR_DEV_CPU) {
    copy_strided_cpu(dst, src); /* contiguous ones: one memcpy */
    return 0;
  }
#ifdef HAVE_CUDA
  if (!tr_tensor_is_contiguous(dst) || !tr_tensor_is_contiguous(src))
    return TR_EUNSUPPORTED; /* strided device copies: not here */
  if (dst->dtype == src->dtype)
    return tr__cuda_memcpy(tr_tensor_data(dst), tr_tensor_data(src),
                           tr_tensor_nbytes(src));
  if (dst->device.type == TR_DEV_CUDA && src->device.type == TR_DEV_CUDA &&
      dst->device.index == src->device.index)
    return tr__cuda_convert(dst->device.index, tr_tensor_data(dst), dst->dtype,
                            tr_tensor_data(src), src->dtype, n);
  return TR_EUNSUPPORTED; /* convert on one side first */
#else
  return TR_EUNSUPPORTED;
#endif
}

int tr_tensor_contiguous(tr_tensor_t* dst, const tr_tensor_t* src) {
  if (tr_tensor_is_contiguous(src)) {
    tr_tensor_view(dst, src);
    return 0;
  }
  tr_tensor_t out;
  TR_CHECK(tr_tensor_empty(&out, src->dtype, src->device, src->ndim, src->shape));
  int rc = tr_tensor_copy(&out, src);
  if (rc < 0) {
    tr_tensor_release(&out);
    return rc;
  }
  *dst = out;
  return 0;
}

int tr_tensor_fill(tr_tensor_t* t, double value) {
  int64_t n = tr_tensor_numel(t);
  if (!t->storage) return n ? TR_EINVAL : 0;
  if (t->device.type == TR_DEV_CUDA) {
#ifdef HAVE_CUDA
    if (!tr_tensor_is_contiguous(t)) return TR_EUNSUPPORTED;
    return tr__cuda_fill(t->device.index, tr_tensor_data(t), t->dtype, value, n);
#else
    return TR_EUNSUPPORTED;
#endif
  }
  if (value == 0.0 && tr_tensor_is_contiguous(t)) {
    memset(tr_tensor_data(t), 0, tr_tensor_nbytes(t));
    return 0;
  }
  for (int64_t i = 0; i < n; i++)
    store_elem(t->storage->data, t->dtype, elem_offset(t, i), value);
  return 0;
}
