/* kernels/cpu/ops.c: the CPU table of raw entry points (tr_kern_ops_t). */
#include "config.h"

#include "kernels/cpu/cpu.h"

const tr_kern_ops_t tr__cpu_ops = {
    .name = "cpu",
    .embedding_fwd = tr__cpu_embedding_fwd,
    .embedding_bwd = tr__cpu_embedding_bwd,
    .layernorm_fwd = tr__cpu_layernorm_fwd,
    .residual_layernorm_fwd = tr__cpu_residual_layernorm_fwd,
    .layernorm_bwd = tr__cpu_layernorm_bwd,
    .rmsnorm_fwd = tr__cpu_rmsnorm_fwd,
    .residual_rmsnorm_fwd = tr__cpu_residual_rmsnorm_fwd,
    .rmsnorm_bwd = tr__cpu_rmsnorm_bwd,
    .gemm = tr__cpu_gemm,
    .linear_fwd = tr__cpu_linear_fwd,
    .linear_bwd = tr__cpu_linear_bwd,
    .linear_bwd_write = tr__cpu_linear_bwd_write,
    .linear_gelu_fwd = tr__cpu_linear_gelu_fwd,
    .linear_dgelu_bwd = tr__cpu_linear_dgelu_bwd,
    .rope = tr__cpu_rope,
    .attention_fwd = tr__cpu_attention_fwd,
    .attention_bwd = tr__cpu_attention_bwd,
    .gelu_fwd = tr__cpu_gelu_fwd,
    .gelu_bwd = tr__cpu_gelu_bwd,
    .swiglu_fwd = tr__cpu_swiglu_fwd,
    .swiglu_bwd = tr__cpu_swiglu_bwd,
    .swiglu_bwd_write = tr__cpu_swiglu_bwd_write,
    .xent_fwd = tr__cpu_xent_fwd,
    .xent_bwd = tr__cpu_xent_bwd,
    .xent_fused = tr__cpu_xent_fused,
    .adamw = tr__cpu_adamw,
    .sum_squares = tr__cpu_sum_squares,
    .scale = tr__cpu_scale,
    .add = tr__cpu_add,
    .accumulate = tr__cpu_accumulate,
    .zero = tr__cpu_zero,
};
