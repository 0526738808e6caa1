#!/usr/bin/env python3
"""bench/peers/llama_tp.py: the PyTorch tensor-parallel reference for
trainrun's tensor_parallel_degree (issue 18): llama_torch.py's Llama 3.2 1B
with its transformer blocks split over the ranks of torchrun by
parallelize_module, the plan trainrun applies today (dtensor/tp.c): wq, wk,
wv, w1, w3 ColwiseParallel, wo and w2 RowwiseParallel (an all-reduce after
each), heads and KV heads split across the ranks; the token embedding, the
tied output projection and the norms replicated (no sequence or loss
parallel: trainrun does not build them yet). bf16 autocast over fp32
weights, fused AdamW, clipping at 1.0 over the global norm (DTensor
gradients reduced as torchtitan does). With --compile every block is
compiled after it is parallelized (torchtitan's order). Every rank reads
the same samples (one replica); tokens/s and MFU are per GPU, a step's
B*T tokens shared by the N ranks.

  torchrun --nproc-per-node N llama_tp.py --data train.bin [-B 8]
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
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel, RowwiseParallel, parallelize_module)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 8, 2048, 30)
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    ranks = benchlib.init_torchrun("llama_tp", args.device)
    if ranks is None:
        return 2
    rank, world, dev = ranks
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("tp",))

    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)  # the same initial weights on every rank
    cfg = dict(benchlib.LLAMA3_1B)
    if args.tiny:
        cfg.update(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192)
    model = llama_torch.Llama(cfg, args.T).to(dev)
    n = sum(q.numel() for q in model.parameters())
    if n != benchlib.num_params(cfg):
        print(f"llama_tp: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1
    plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(),
            "wv": ColwiseParallel(), "wo": RowwiseParallel(),
            "w1": ColwiseParallel(), "w3": ColwiseParallel(),
            "w2": RowwiseParallel()}
    for i, block in enumerate(model.layers):
        parallelize_module(block, mesh, plan)
        block.nh //= world  # the local heads
        block.nkv //= world
        if args.compile:
            ckw = {"mode": args.compile_mode} if args.compile_mode else {}
            model.layers[i] = torch.compile(block, fullgraph=True, **ckw)

    name = "torch TP" + (" + compile" if args.compile else "")
    return benchlib.train(model, cfg, cfg, args, name,
                          dist={"rank": rank, "world": world, "device": dev,
                                "data_rank": 0, "data_world": 1,
                                "token_share": world, "dtensor_grads": True,
                                "autocast": True, "compiled": True,
                                "tp": world, "plan": "layers colwise/rowwise, "
                                "embedding and output replicated",
                                "model": "Llama 3.2 1B"})


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(rc)  # skip interpreter teardown (torch.compile's worker pools)
