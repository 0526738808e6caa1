#!/usr/bin/env python3
"""bench/peers/llama_fsdp2.py: the PyTorch FSDP2 reference for trainrun's
fsdp2/ (issue 9): llama_torch.py's Llama 3.2 1B trained data-parallel over
the ranks of torchrun, sharded the way torchtitan shards it: fully_shard
(FSDP2) on every transformer block and then on the root (token embedding,
tied output, final norm), one flat mesh of all ranks, MixedPrecisionPolicy
with bf16 parameters and compute and fp32 gradient reduce-scatter (fp32
sharded master weights and AdamW state), reshard_after_forward on (the
parameters are gathered again for backward; trainrun's "default" without
pipeline parallelism), fused AdamW on the DTensor shards, gradient clipping
at 1.0 over the global norm. With --compile every block is compiled before
it is sharded (torchtitan's order). Each step reads a global batch of
WORLD*B sequences and rank r takes sequences r*B .. r*B+B-1. Rank 0 prints
benchlib's JSON lines: the loss (mean over the ranks) and tokens/s and MFU
PER GPU (B*T over the step time).

  torchrun --nproc-per-node N llama_fsdp2.py --data train.bin [-B 8]
           [-T 2048] [--steps 30] [--skip S] [--compile]
           [--model 1B|8B] [--ac none|op|full]
           [--device cpu --tiny]   (CPU: Gloo instead of NCCL)

--model 8B (bench/multi_gpu.sh, issue 11) is Llama 3.1 8B as trainrun's
flavor 8B builds it (model/config.c: dim 4096, 32 layers, 32 heads, 8
key/value heads, SwiGLU hidden 14336, vocab 128256, RoPE theta 500000 with
Llama 3.1 scaling (factor 8, low 1, high 4, original context 8192), an
untied output projection). It is built on the meta device, sharded, and
only then materialised on the GPU and initialised (torchtitan's order), so
no rank ever holds the 32 GB of fp32 weights. --ac (default none for 1B, op
for 8B) wraps every block in activation checkpointing before it is
compiled and sharded, as torchtitan applies it: op keeps the outputs of the
matmuls and of attention and recomputes the rest (the norms, RoPE, SwiGLU's
product), which is what trainrun's selective "op" mode keeps
(model/recompute.c); full keeps only each block's input.
"""
import os
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import llama_torch  # noqa: E402

import argparse  # noqa: E402
import functools  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import (  # noqa: E402
    MixedPrecisionPolicy, fully_shard)



def init_weights(model, cfg, T, dev):
    """Llama.__init__'s initialisation, for a model materialised with
    to_empty (sharded DTensor parameters): norms 1, output projections
    normal(0, 0.02/sqrt(2*layers)), the other matrices normal(0, 0.02); the
    RoPE tables computed again (to_empty left them uninitialised)."""
    cos, sin = llama_torch.rope_tables(cfg, T)
    model.cos = cos.to(dev)
    model.sin = sin.to(dev)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
        llama_torch.init_weights(model, cfg["n_layers"])


# torchtitan's selective op checkpointing keeps these ops' outputs; here
# every matmul's (trainrun's "op" mode keeps them all) and attention's
def _ac_save_ops():
    ops = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
           torch.ops.aten.bmm.default]
    for n in ("_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu"):
        op = getattr(torch.ops.aten, n, None)
        if op is not None:
            ops.append(op.default)
    return set(ops)


class CheckpointedBlock(nn.Module):
    """A block under torch.utils.checkpoint: mode full recomputes the whole
    block in backward; op saves the outputs of _ac_save_ops() and
    recomputes the rest (selective activation checkpointing)."""

    def __init__(self, block, mode):
        super().__init__()
        self.block, self.mode = block, mode
        if mode == "op":
            from torch.utils.checkpoint import (
                CheckpointPolicy, create_selective_checkpoint_contexts)
            save = _ac_save_ops()

            def policy(ctx, op, *args, **kwargs):
                return (CheckpointPolicy.MUST_SAVE if op in save
                        else CheckpointPolicy.PREFER_RECOMPUTE)
            self.context_fn = functools.partial(
                create_selective_checkpoint_contexts, policy)

    def forward(self, x, cos, sin):
        from torch.utils.checkpoint import checkpoint
        if self.mode == "full":
            return checkpoint(self.block, x, cos, sin, use_reentrant=False)
        return checkpoint(self.block, x, cos, sin, use_reentrant=False,
                          context_fn=self.context_fn)


def apply_fsdp(model, mesh, ac, compile_blocks, compile_mode):
    """torchtitan's order on model's blocks: activation checkpointing (ac:
    none, op, full), torch.compile per block (fullgraph), fully_shard per
    block, then fully_shard on the root, over mesh, with bf16 parameters
    and compute, fp32 gradient reduce-scatter and reshard_after_forward."""
    # cast_forward_inputs off: the blocks' input x is bf16 already (the
    # embedding's gathered weight is), the root's inputs are token ids, and
    # the RoPE tables stay fp32 as under autocast (torchtitan's complex
    # freqs_cis is not cast either)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                              reduce_dtype=torch.float32,
                              cast_forward_inputs=False)
    kw = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": True}
    for i, block in enumerate(model.layers):
        if ac != "none":
            block = CheckpointedBlock(block, ac)
            model.layers[i] = block
        if compile_blocks:
            ckw = benchlib.compile_kwargs(torch, compile_mode)
            block = torch.compile(block, fullgraph=True, **ckw)
            model.layers[i] = block
        fully_shard(block, **kw)
    fully_shard(model, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 8, 2048, 30)
    p.add_argument("--model", choices=("1B", "8B"), default="1B",
                   help="Llama 3.2 1B (default) or Llama 3.1 8B")
    p.add_argument("--ac", choices=("none", "op", "full"), default=None,
                   help="activation checkpointing per block (default: none "
                        "for 1B, op for 8B)")
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    if args.ac is None:
        args.ac = "op" if args.model == "8B" else "none"
    ranks = benchlib.init_torchrun("llama_fsdp2", args.device)
    if ranks is None:
        return 2
    rank, world, dev = ranks
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp_shard",))

    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)  # the same initial weights on every rank
    big = args.model == "8B"
    cfg = benchlib.llama_config(args.model, args.tiny)
    if big:  # on the meta device: materialised after sharding
        with torch.device("meta"):
            model = llama_torch.Llama(cfg, args.T)
    else:
        model = llama_torch.Llama(cfg, args.T).to(dev)
    n = sum(q.numel() for q in model.parameters())
    if n != benchlib.num_params(cfg):
        print(f"llama_fsdp2: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1

    apply_fsdp(model, mesh, args.ac, args.compile, args.compile_mode)
    if big:
        model.to_empty(device=dev)
        init_weights(model, cfg, args.T, dev)

    name = "torch FSDP2" + (" + compile" if args.compile else "")
    return benchlib.train(model, cfg, cfg, args, name,
                          dist={"rank": rank, "world": world, "device": dev,
                                "sharded": True, "fsdp": "fully_shard",
                                "reshard_after_forward": True,
                                "param_dtype": "bfloat16",
                                "reduce_dtype": "float32",
                                "model": "Llama 3.1 8B" if big
                                else "Llama 3.2 1B",
                                "ac": args.ac, "meta_init": big})


if __name__ == "__main__":
    benchlib.run_main(main)
