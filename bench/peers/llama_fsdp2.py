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
           [--device cpu --tiny]   (CPU: Gloo instead of NCCL)
"""
import os
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import llama_torch  # noqa: E402

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import (  # noqa: E402
    MixedPrecisionPolicy, fully_shard)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 8, 2048, 30)
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    try:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_RANK"])
    except KeyError as e:
        print(f"llama_fsdp2: {e.args[0]} is not set: run under torchrun "
              f"(or trainrun --exec)", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp_shard",))

    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)  # the same initial weights on every rank
    cfg = dict(benchlib.LLAMA3_1B)
    if args.tiny:
        cfg.update(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192)
    model = llama_torch.Llama(cfg, args.T).to(dev)
    n = sum(q.numel() for q in model.parameters())
    if n != benchlib.num_params(cfg):
        print(f"llama_fsdp2: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1

    # cast_forward_inputs off: the blocks' input x is bf16 already (the
    # embedding's gathered weight is), the root's inputs are token ids, and
    # the RoPE tables stay fp32 as under autocast (torchtitan's complex
    # freqs_cis is not cast either)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                              reduce_dtype=torch.float32,
                              cast_forward_inputs=False)
    kw = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": True}
    for i, block in enumerate(model.layers):
        if args.compile:
            ckw = {"mode": args.compile_mode} if args.compile_mode else {}
            block = torch.compile(block, fullgraph=True, **ckw)
            model.layers[i] = block
        fully_shard(block, **kw)
    fully_shard(model, **kw)

    name = "torch FSDP2" + (" + compile" if args.compile else "")
    return benchlib.train(model, cfg, cfg, args, name,
                          dist={"rank": rank, "world": world, "device": dev,
                                "sharded": True, "fsdp": "fully_shard",
                                "reshard_after_forward": True,
                                "param_dtype": "bfloat16",
                                "reduce_dtype": "float32"})


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(rc)  # skip interpreter teardown (torch.compile's worker pools)
