/* collectives/nccl_cuda.h: the kernels the NCCL backend launches on its
 * comm stream (collectives/nccl_cuda.cu): staging of uint16 reductions
 * through uint32 (NCCL has no 16-bit unsigned type) and the division that
 * turns an integer SUM into AVG. Only in builds with HAVE_NCCL. Each returns
 * 0 or TR_ECUDA (the launch failed; logged). */
#ifndef TRAINRUN_COLLECTIVES_NCCL_CUDA_H
#define TRAINRUN_COLLECTIVES_NCCL_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = src[i] widened, n elements, on stream (a cudaStream_t). */
int tr__nccl_u16_to_u32(const void* src, void* dst, int64_t n, void* stream);
/* dst[i] = (uint16_t)src[i] / divisor (divisor 1: a plain narrowing). */
int tr__nccl_u32_to_u16(const void* src, void* dst, int64_t n, int divisor,
                        void* stream);
/* x[i] /= divisor for integer dtypes (tr_dtype_t as int), truncating. */
int tr__nccl_div_int(void* x, int dtype, int64_t n, int divisor, void* stream);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_COLLECTIVES_NCCL_CUDA_H */
