/* trainrun/tensor.h: dtypes, devices, allocators and strided tensors.
 *
 * A tr_tensor_t is a small value (caller-allocated, copied freely by
 * tr_tensor_view) that points into a reference-counted storage: a buffer on
 * the host, in pinned host memory or on a CUDA device. Views (narrow, chunk,
 * reshape, transpose) share the storage; the buffer is freed when the last
 * tensor referring to it is released. Every buffer comes from one of three
 * allocators that count current and peak bytes, so memory lines and tests
 * can report exact figures.
 *
 * Shapes and strides are in elements; offsets too. Up to TR_MAX_DIMS dims.
 * Thread-safety: distinct tensors may be used from distinct threads (the
 * reference count is atomic); one tensor is not to be mutated concurrently.
 */
#ifndef TRAINRUN_TENSOR_H
#define TRAINRUN_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ---- */

/* XX(enum suffix, torch name, short name, element size) */
#define TR_DTYPE_MAP(XX)          \
  XX(F32, "float32", "f32", 4)    \
  XX(BF16, "bfloat16", "bf16", 2) \
  XX(F16, "float16", "f16", 2)    \
  XX(I32, "int32", "i32", 4)      \
  XX(I64, "int64", "i64", 8)      \
  XX(U16, "uint16", "u16", 2)     \
  XX(U8, "uint8", "u8", 1)

typedef enum {
#define TR__DTYPE_ENUM(name, torch, short_name, size) TR_##name,
  TR_DTYPE_MAP(TR__DTYPE_ENUM)
#undef TR__DTYPE_ENUM
  TR_DTYPE__COUNT
} tr_dtype_t;

size_t tr_dtype_size(tr_dtype_t dt);
const char* tr_dtype_name(tr_dtype_t dt); /* torch's name: "bfloat16" */
/* Accepts torch names, short names and "fp32"/"fp16"/"float"/"half";
 * TR_EINVAL when unknown. */
int tr_dtype_parse(const char* s, tr_dtype_t* out);
int tr_dtype_is_float(tr_dtype_t dt);

/* bf16 and f16 conversions (round to nearest even; NaN stays NaN). */
static inline uint16_t tr_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float tr_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
uint16_t tr_f32_to_f16(float f);
float tr_f16_to_f32(uint16_t h);

/* ---- devices ---- */

typedef enum { TR_DEV_CPU = 0, TR_DEV_CUDA = 1 } tr_device_type_t;
typedef struct {
  tr_device_type_t type;
  int index; /* CUDA ordinal; 0 for cpu */
} tr_device_t;

#define TR_DEVICE_CPU ((tr_device_t){TR_DEV_CPU, 0})
#define TR_MAX_DEVICES 64

/* "cpu", "cuda" (= cuda:0), "cuda:3"; TR_EINVAL otherwise. */
int tr_device_parse(const char* s, tr_device_t* out);
/* Writes "cpu" or "cuda:N" into buf; returns buf. */
const char* tr_device_str(tr_device_t d, char* buf, size_t n);
int tr_device_eq(tr_device_t a, tr_device_t b);
/* Number of CUDA devices visible (0 in builds without CUDA or no GPU). */
int tr_cuda_device_count(void);
/* Make CUDA device `index` the calling thread's current device and, when
 * name != NULL, write its product name ("NVIDIA H100 80GB HBM3") into
 * name[cap]. TR_EDEVICE when it does not exist. */
int tr_cuda_set_device(int index, char* name, size_t cap);
/* Wait for everything enqueued on the current device (0 without CUDA). */
int tr_cuda_synchronize(void);

/* ---- allocators ---- */

typedef enum {
  TR_MEM_HOST = 0,   /* ordinary host memory, TRAINRUN_HOST_ALLOC_ALIGN-aligned */
  TR_MEM_PINNED = 1, /* page-locked host memory (cudaHostAlloc); plain
                        page-aligned host memory in builds without CUDA or
                        on machines without a CUDA device */
  TR_MEM_DEVICE = 2  /* CUDA device memory */
} tr_mem_kind_t;

typedef struct {
  int64_t current_bytes; /* live now */
  int64_t peak_bytes;    /* max of current since start or last reset */
  int64_t live_allocs;   /* buffers live now */
  int64_t total_allocs;  /* allocations ever made */
} tr_mem_stats_t;

/* Allocate nbytes (0 allowed: returns a unique non-NULL pointer) of a kind;
 * device is the CUDA ordinal for TR_MEM_DEVICE, else ignored. Returns
 * TR_ENOMEM, TR_ECUDA, or TR_EUNSUPPORTED (device memory without CUDA). */
int tr_mem_alloc(tr_mem_kind_t kind, int device, size_t nbytes, void** out);
/* Free a buffer from tr_mem_alloc; nbytes must be the allocated size. */
void tr_mem_free(tr_mem_kind_t kind, int device, void* p, size_t nbytes);
void tr_mem_stats(tr_mem_kind_t kind, int device, tr_mem_stats_t* out);
void tr_mem_reset_peak(tr_mem_kind_t kind, int device);

/* ---- tensors ---- */

#define TR_MAX_DIMS 8

typedef struct tr_storage tr_storage_t;

typedef struct {
  tr_storage_t* storage; /* NULL for a tensor that holds nothing */
  int64_t offset;        /* first element, in elements from the base */
  int ndim;
  int64_t shape[TR_MAX_DIMS];
  int64_t stride[TR_MAX_DIMS];
  tr_dtype_t dtype;
  tr_device_t device;
} tr_tensor_t;

/* Allocate a contiguous tensor. Host tensors on TR_DEV_CPU use TR_MEM_HOST;
 * tr_tensor_empty_pinned uses TR_MEM_PINNED. Contents are uninitialised
 * (tr_tensor_zeros: zero). shape may contain 0s; ndim 0 is a scalar.
 * Errors: TR_EINVAL (bad ndim or negative size), allocator errors. */
int tr_tensor_empty(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev, int ndim,
                    const int64_t* shape);
int tr_tensor_zeros(tr_tensor_t* t, tr_dtype_t dt, tr_device_t dev, int ndim,
                    const int64_t* shape);
int tr_tensor_empty_pinned(tr_tensor_t* t, tr_dtype_t dt, int ndim,
                           const int64_t* shape);

/* Wrap memory the caller owns (contiguous); released tensors never free it.
 * The caller keeps data alive while any view of t lives. */
int tr_tensor_wrap(tr_tensor_t* t, void* data, tr_dtype_t dt, tr_device_t dev,
                   int ndim, const int64_t* shape);

/* Drop this tensor's reference; frees the buffer with the last one. Leaves
 * *t holding nothing; safe on a zeroed or already released tensor. */
void tr_tensor_release(tr_tensor_t* t);

/* dst becomes another reference to src's storage, same view. */
void tr_tensor_view(tr_tensor_t* dst, const tr_tensor_t* src);

/* Views. dst must not hold a storage (it is overwritten); src is unchanged,
 * and dst == src is allowed (the view replaces src in place). */
/* Elements [start, start+length) of dim. TR_EINVAL when out of range. */
int tr_tensor_narrow(tr_tensor_t* dst, const tr_tensor_t* src, int dim,
                     int64_t start, int64_t length);
/* torch.chunk(src, chunks, dim)[index]: chunk size ceil(n/chunks); trailing
 * chunks may be short or empty (an index past the data gives length 0). */
int tr_tensor_chunk(tr_tensor_t* dst, const tr_tensor_t* src, int dim,
                    int chunks, int index);
/* Same elements, new shape (one dim may be -1); src must be contiguous. */
int tr_tensor_reshape(tr_tensor_t* dst, const tr_tensor_t* src, int ndim,
                      const int64_t* shape);
/* Swap two dims (no copy). */
int tr_tensor_transpose(tr_tensor_t* dst, const tr_tensor_t* src, int d0,
                        int d1);

/* torch.chunk's arithmetic for n elements: [*start, *start + *len) of chunk
 * index. Used by DTensor sharding; len may be 0. */
void tr_chunk_range(int64_t n, int chunks, int index, int64_t* start,
                    int64_t* len);

/* Copy src into dst (same shape; any strides; any dtypes converting through
 * float on the host; host<->device and device<->device when contiguous with
 * the same dtype, or any dtype between contiguous device tensors). */
int tr_tensor_copy(tr_tensor_t* dst, const tr_tensor_t* src);
/* A contiguous copy of src on the same device (a new reference when src is
 * already contiguous). */
int tr_tensor_contiguous(tr_tensor_t* dst, const tr_tensor_t* src);
/* Set every element to value (converted to the dtype). */
int tr_tensor_fill(tr_tensor_t* t, double value);

int64_t tr_tensor_numel(const tr_tensor_t* t);
size_t tr_tensor_nbytes(const tr_tensor_t* t); /* numel * element size */
int tr_tensor_is_contiguous(const tr_tensor_t* t);
/* Address of the first element (NULL for a tensor holding nothing). */
void* tr_tensor_data(const tr_tensor_t* t);
/* Element i (row-major logical index over the view) as double; host only. */
double tr_tensor_get(const tr_tensor_t* t, int64_t i);
int tr_tensor_same_shape(const tr_tensor_t* a, const tr_tensor_t* b);
/* "[4, 8]" into buf; returns buf. */
const char* tr_tensor_shape_str(const tr_tensor_t* t, char* buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_TENSOR_H */
