#!/usr/bin/env python3
"""bench/peers/llama_cp.py: the PyTorch context-parallel reference for
trainrun's context_parallel_degree (issue 23): llama_torch.py's Llama 3
(--flavor 1B: 3.2 1B, tied output; 8B: 3.1 8B, untied) with every sequence
split over the --cp ranks of torchrun, the way torchtitan applies context
parallelism with SDPA:

- the mesh (dp_shard, cp) of all ranks (dp_shard = WORLD / cp); FSDP2
  (llama_fsdp2.apply_fsdp: fully_shard per block and on the root, bf16
  parameters and compute, fp32 gradient reduce-scatter) over its flattened
  dp_shard_cp dim, as torchtitan's parallelize_llama does whenever cp > 1
  (its fsdp_enabled is dp_shard or cp): parameters, gradients and AdamW
  state sharded over dp_shard x cp, as trainrun shards them;
- every step runs forward and backward inside torchtitan's
  create_context_parallel_ctx: set_rotate_method(--rotate) and
  torch.distributed.tensor.experimental.context_parallel(cp_mesh,
  buffers=[inputs, labels, RoPE cos, RoPE sin], buffer_seq_dims=[1, 1, 0,
  0], no_restore_buffers={inputs, labels}), which shards them in place
  along the sequence with the head-tail load balancer (rank r keeps chunks
  r and 2cp-1-r) and patches F.scaled_dot_product_attention (causal,
  is_causal=True) into the ring attention; SDPA restricted to the flash,
  memory-efficient and cuDNN backends (the ring has no math backend), as
  torchtitan's get_train_context does;
- the loss is the mean over a rank's own tokens, FSDP averages the
  gradients over dp_shard x cp: the gradient of the global mean;
- --compile: every block torch.compile'd (fullgraph) before it is sharded.

The cp ranks of one replica read the same samples; tokens/s and MFU are per
GPU as torchtitan counts them (a step's B x T tokens over the cp GPUs that
share them); FLOPs per token use the whole sequence length.

  torchrun --nproc-per-node N llama_cp.py --data train.bin [-B 1]
           [-T 16384] [--steps 20] [--skip S] [--cp N]
           [--rotate allgather|alltoall] [--compile] [--flavor 8B]
           [--device cpu --tiny [--cp 1 | --cpu-ring]]

On the CPU (Gloo) PyTorch 2.11's context_parallel does not run: it
dispatches SDPA to its ring only for the CUDA flash, memory-efficient and
cuDNN kernels, and the CPU's aten._scaled_dot_product_flash_attention_for_cpu
"does not have a sharding strategy registered" (NotImplementedError). So
there --cp 1 runs (FSDP over the ranks, no context parallel) and --cp
above 1 is refused, unless --cpu-ring (a check of this script's wiring on
a machine without GPUs, never a benchmark) teaches the dispatcher the CPU
kernel the way PyTorch registers the CUDA ones: a sequence-sharded
strategy for the CPU flash forward and backward and a handler running
them through PyTorch's own _templated_ring_attention(_backward). With it,
--cp 2 --tiny on 2 ranks matches 1 rank step by step (losses within 1e-5
relative in bf16; with fp32 parameters and lr 0, loss and gradient norm
within 1e-7).
"""
import os
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import llama_fsdp2  # noqa: E402
import llama_torch  # noqa: E402

import argparse  # noqa: E402
import contextlib  # noqa: E402

import torch  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def cp_context(cp_mesh, model, sdpa_auto):
    """prepare for benchlib.train: the step's inputs and labels as separate
    tensors (Batches returns views of one buffer, which context_parallel's
    in-place resize would overlap) and the context the step runs in."""
    from torch.distributed.tensor.experimental import context_parallel

    def prepare(x, y):
        x = x.clone(memory_format=torch.contiguous_format)
        y = y.clone(memory_format=torch.contiguous_format)
        stack = contextlib.ExitStack()
        if sdpa_auto:
            stack.enter_context(sdpa_kernel([SDPBackend.FLASH_ATTENTION,
                                             SDPBackend.EFFICIENT_ATTENTION,
                                             SDPBackend.CUDNN_ATTENTION]))
        stack.enter_context(context_parallel(
            cp_mesh, buffers=[x, y, model.cos, model.sin],
            buffer_seq_dims=[1, 1, 0, 0], no_restore_buffers={x, y}))
        return (x, y), stack
    return prepare


def teach_cpu_ring():
    """--cpu-ring: register the CPU flash SDPA forward and backward with
    PyTorch's context-parallel dispatcher (private API of PyTorch 2.11,
    _context_parallel/_attention.py and _sharding_rules.py), as it
    registers the CUDA kernels: q, k, v, out, logsumexp and their gradients
    sharded on the sequence dim (2), computed by its ring."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import (
        expand_to_full_mesh_op_strategy, register_op_strategy)
    from torch.distributed.tensor.experimental._context_parallel import (
        _attention as cpa)
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def strategy(n, first_input):
        def f(op_schema):
            mesh = op_schema.get_mesh_from_args(validate=False)
            return expand_to_full_mesh_op_strategy(
                mesh, op_schema, [[Shard(2)] * n], input_index=first_input)
        return f
    register_op_strategy(fwd, schema_info=RuntimeSchemaInfo(3))(
        strategy(5, 2))  # out, lse; q, k, v
    register_op_strategy(bwd, schema_info=RuntimeSchemaInfo(6))(
        strategy(9, 3))  # dq, dk, dv; dout, q, k, v, out, lse

    def ring_fwd(mesh, query, key, value, dropout_p=0.0, is_causal=False, *,
                 attn_mask=None, scale=None):
        return cpa._templated_ring_attention(
            mesh.get_group(), 2, fwd, query, key, value, is_causal=is_causal,
            dropout_p=dropout_p, scale=scale)

    def ring_bwd(mesh, grad_out, query, key, value, out, logsumexp,
                 dropout_p, is_causal, *, attn_mask=None, scale=None):
        return cpa._templated_ring_attention_backward(
            mesh.get_group(), 2, bwd, grad_out=grad_out,
            grad_out_name="grad_out", query=query, key=key, value=value,
            out=out, logsumexp=logsumexp, is_causal=is_causal,
            dropout_p=dropout_p, scale=scale)

    def handler(op_call, args, kwargs):  # cpa._sdpa_handler's steps
        info = DTensor._op_dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        DTensor._op_dispatcher.sharding_propagator.propagate(info)
        ring = ring_fwd if op_call is fwd else ring_bwd
        out = ring(info.compute_mesh, *info.local_args, **info.local_kwargs)
        return DTensor._op_dispatcher.wrap(out,
                                           info.output_sharding.output_spec)
    cpa.custom_ops[fwd] = handler
    cpa.custom_ops[bwd] = handler


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 1, 16384, 20)
    p.add_argument("--flavor", choices=sorted(benchlib.LLAMA3), default="1B")
    p.add_argument("--cp", type=int, default=None,
                   help="context-parallel degree (default: every rank)")
    p.add_argument("--rotate", choices=["allgather", "alltoall"],
                   default="allgather",
                   help="how the ring moves key/value shards "
                        "(set_rotate_method)")
    p.add_argument("--cpu-ring", action="store_true",
                   help="CPU checks only: run PyTorch's ring on the CPU "
                        "flash kernel (see the description)")
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    ranks = benchlib.init_torchrun("llama_cp", args.device)
    if ranks is None:
        return 2
    rank, world, dev = ranks
    cp = args.cp or world
    if cp < 1 or world % cp:
        p.error(f"--cp {cp} does not divide the {world} ranks")
    if cp > 1 and args.T % (2 * cp):
        p.error(f"-T {args.T} is not a multiple of 2 x cp = {2 * cp} "
                f"(head-tail chunks)")
    if cp > 1 and dev.type != "cuda" and not args.cpu_ring:
        p.error("--cp above 1 needs CUDA: PyTorch's context_parallel rings "
                "only the CUDA SDPA kernels (the CPU's "
                "_scaled_dot_product_flash_attention_for_cpu has no "
                "sharding strategy; --cpu-ring teaches it, for checks)")
    if args.cpu_ring and dev.type != "cpu":
        p.error("--cpu-ring is for --device cpu")
    if args.cpu_ring:
        teach_cpu_ring()
    dp = world // cp
    mesh = init_device_mesh(dev.type, (dp, cp),
                            mesh_dim_names=("dp_shard", "cp"))
    fsdp_mesh = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")

    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)  # the same initial weights on every rank
    cfg = benchlib.llama_config(args.flavor, args.tiny)
    model = llama_torch.Llama(cfg, args.T).to(dev)
    n = sum(q.numel() for q in model.parameters())
    if n != benchlib.num_params(cfg):
        print(f"llama_cp: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1
    llama_fsdp2.apply_fsdp(model, fsdp_mesh, "none", args.compile,
                           args.compile_mode)
    prepare = None
    if cp > 1:
        from torch.distributed.tensor.experimental._attention import (
            set_rotate_method)
        set_rotate_method(args.rotate)
        prepare = cp_context(mesh["cp"], model, args.sdpa_backend == "auto")

    name = (f"torch CP {cp} {args.rotate}" if cp > 1 else "torch FSDP2") + (
        " + compile" if args.compile else "")
    return benchlib.train(
        model, cfg, cfg, args, name,
        dist={"rank": rank, "world": world, "device": dev, "sharded": True,
              "data_rank": mesh["dp_shard"].get_local_rank(),
              "data_world": dp, "token_share": cp, "cp": cp, "dp_shard": dp,
              "rotate_method": args.rotate if cp > 1 else None,
              "fsdp": "fully_shard over dp_shard_cp",
              "param_dtype": "bfloat16", "reduce_dtype": "float32",
              "model": "Llama 3 " + args.flavor},
        prepare=prepare)


if __name__ == "__main__":
    benchlib.run_main(main)
