/* core/cuda.h: the CUDA runtime calls core/ needs, implemented in
 * core/cuda.cu (compiled by nvcc) so that C files never include CUDA
 * headers. Only declared in builds with HAVE_CUDA. Errors are converted to
 * TR_ECUDA here, at the boundary, and logged with CUDA's own message. */
#ifndef TRAINRUN_CORE_CUDA_H
#define TRAINRUN_CORE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef HAVE_CUDA
#ifdef __cplusplus
extern "C" {
#endif

int tr__cuda_malloc(int device, size_t n, void** out);
void tr__cuda_free(int device, void* p);
int tr__cuda_host_alloc(size_t n, void** out);
void tr__cuda_host_free(void* p);
int tr__cuda_device_count(void);
int tr__cuda_set_device(int device, char* name, size_t cap);
int tr__cuda_synchronize(void);
/* Synchronous copy of n bytes between any host/device pointers. */
int tr__cuda_memcpy(void* dst, const void* src, size_t n);
/* Convert n contiguous elements between dtypes on device `device`
 * (tr_dtype_t values as ints), enqueued on the legacy default stream (ordered
 * before any later cudaMemcpy or default-stream kernel). */
int tr__cuda_convert(int device, void* dst, int dst_dtype, const void* src,
                     int src_dtype, int64_t n);
/* Set n contiguous elements of dtype to value on device, enqueued on the
 * legacy default stream like tr__cuda_convert. */
int tr__cuda_fill(int device, void* dst, int dtype, double value, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* HAVE_CUDA */
#endif /* TRAINRUN_CORE_CUDA_H */
