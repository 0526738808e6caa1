/* tests/lin_kinds.h: the tensor entry of each linear kind of
 * tr_kern_lin_kind_t (trainrun/kernels.h), for the kernel suites that run
 * the batch-strided linears against the same entries once a sequence
 * (check_kernels on the CPU, check_kernels_cuda on a GPU). */
#ifndef TRAINRUN_TESTS_LIN_KINDS_H
#define TRAINRUN_TESTS_LIN_KINDS_H

#include "trainrun/error.h"
#include "trainrun/kernels.h"

/* kind's entry: out (and pre, FWD_GELU's second output) from x (the
 * forward input; the backward's inp), dy (the DINP kinds' dout) and q
 * (DINP_DGELU's pre). */
static inline int lk_call(tr_kern_lin_kind_t kind, tr_tensor_t* out,
                          tr_tensor_t* pre, const tr_tensor_t* x,
                          const tr_tensor_t* dy, const tr_tensor_t* q,
                          const tr_tensor_t* w, const tr_tensor_t* bias) {
  switch (kind) {
    case TR_KERN_LIN_FWD:
      return tr_kern_linear_fwd(out, x, w, bias);
    case TR_KERN_LIN_FWD_GELU:
      return tr_kern_linear_gelu_fwd(out, pre, x, w, bias);
    case TR_KERN_LIN_DINP:
      return tr_kern_linear_bwd(out, NULL, NULL, dy, x, w);
    case TR_KERN_LIN_DINP_WRITE:
      return tr_kern_linear_bwd_write(out, NULL, NULL, dy, x, w);
    case TR_KERN_LIN_DINP_DGELU:
      return tr_kern_linear_dgelu_bwd(out, NULL, NULL, dy, x, w, q);
  }
  return TR_EINVAL;
}

#endif
