/* checkpoint/dma.h: device-to-host copies of a save (checkpoint/stage_cuda.cu;
 * only in builds with HAVE_CUDA; C files never include CUDA headers). Each
 * device gets a non-blocking copy stream of its own; copies are ordered after
 * the caller's kernels (tr__ckpt_dma_after) and each records an event, named
 * by an index and reused across saves, which the writer thread waits for
 * before writing that chunk (tr__ckpt_dma_wait) and the caller's stream
 * waits for on the device before changing the tensors
 * (tr__ckpt_dma_order). Errors are TR_ECUDA (CUDA's text logged),
 * TR_ENOMEM or TR_EDEVICE.
 *
 * tr__ckpt_dma_copy and tr__ckpt_dma_end leave `device` the calling
 * thread's device: they run in the writer's own thread, where giving back
 * the thread's earlier device (CUDA's default, 0) would create a context on
 * device 0 in a process whose GPU is another: 0.4 s and GPU memory (seen
 * on two H200s, rank 1's first save). */
#ifndef CHECKPOINT_DMA_H
#define CHECKPOINT_DMA_H

#include <stddef.h>

#ifdef HAVE_CUDA
#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr__ckpt_dma tr__ckpt_dma_t;

int tr__ckpt_dma_new(tr__ckpt_dma_t** out);
void tr__ckpt_dma_free(tr__ckpt_dma_t* d); /* NULL: no-op */
/* The copy stream of `device` waits for what is enqueued so far on
 * `stream` (a cudaStream_t; NULL: the legacy default stream) and on the
 * legacy default stream. */
int tr__ckpt_dma_after(tr__ckpt_dma_t* d, int device, void* stream);
/* Mark the end of a save's copies on device's copy stream: the span from
 * tr__ckpt_dma_after's point to this one times them (tr__ckpt_dma_span,
 * once they are done: it waits). */
int tr__ckpt_dma_end(tr__ckpt_dma_t* d, int device);
int tr__ckpt_dma_span(tr__ckpt_dma_t* d, int device, double* seconds);
/* Enqueue the copy of n bytes from device memory src to host memory dst on
 * device's copy stream, then record event `ev` there. With pageable dst
 * CUDA returns once the copy is done; with page-locked dst at once. */
int tr__ckpt_dma_copy(tr__ckpt_dma_t* d, int device, void* dst, const void* src,
                      size_t n, size_t ev);
/* Block the calling thread until the copy before event ev is done (0 at
 * once for an event never recorded). */
int tr__ckpt_dma_wait(tr__ckpt_dma_t* d, size_t ev);
/* Make `stream` (NULL: legacy default) wait on the device for event ev;
 * the calling thread does not wait. */
int tr__ckpt_dma_order(tr__ckpt_dma_t* d, size_t ev, void* stream);

#ifdef __cplusplus
}
#endif
#endif /* HAVE_CUDA */
#endif /* CHECKPOINT_DMA_H */
