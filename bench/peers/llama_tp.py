#!/usr/bin/env python3
"""bench/peers/llama_tp.py: the PyTorch tensor-parallel reference for
trainrun's tensor_parallel_degree (issue 18): Llama 3 (--flavor 1B: 3.2 1B,
tied output; 8B: 3.1 8B, untied) split over the ranks of torchrun by
parallelize_module.

--plan full (the default) is torchtitan's (its parallelize_llama's apply_tp,
written for this model): the token embedding RowwiseParallel over the
vocabulary with its output sequence-sharded, every norm SequenceParallel,
PrepareModuleInput gathering the sequence before attention and the MLP, wq,
wk, wv, w1, w3 ColwiseParallel and wo, w2 RowwiseParallel reduce-scattering
to sequence shards, the output projection column-parallel over the
vocabulary (a tied table: its Shard(0) weight read by F.linear) and the
loss under loss_parallel -- what trainrun's TP runs (sequence and loss
parallel). --plan layers is the plan trainrun applied before sequence and
loss parallel: only the blocks' linear layers split (an all-reduce after
wo and w2), embedding, output and norms replicated.

bf16 autocast over fp32 weights, fused AdamW, clipping at 1.0 over the
global norm (DTensor gradients reduced as torchtitan does). With --compile
every block is compiled after it is parallelized (torchtitan's order).
Every rank reads the same samples (one replica); tokens/s and MFU are per
GPU, a step's B*T tokens shared by the N ranks.

  torchrun --nproc-per-node N llama_tp.py --data train.bin [-B 8]
           [-T 2048] [--steps 30] [--skip S] [--compile] [--flavor 8B]
           [--plan layers] [--device cpu --tiny]   (CPU: Gloo, not NCCL)
"""
import os
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import llama_torch  # noqa: E402

import argparse  # noqa: E402


import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    loss_parallel, parallelize_module)


# ---- torchtitan's module structure (norm modules, attention and
# feed-forward submodules), which its TP plan addresses ----

class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, D = c["dim"], c["dim"] // c["n_heads"]
        self.hd = D
        self.rep = c["n_heads"] // c["n_kv_heads"]
        self.wq = nn.Linear(C, c["n_heads"] * D, bias=False)
        self.wk = nn.Linear(C, c["n_kv_heads"] * D, bias=False)
        self.wv = nn.Linear(C, c["n_kv_heads"] * D, bias=False)
        self.wo = nn.Linear(c["n_heads"] * D, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape  # the whole sequence (gathered under SP)
        q = self.wq(x).view(B, T, -1, self.hd)  # this rank's heads
        k = self.wk(x).view(B, T, -1, self.hd)
        v = self.wv(x).view(B, T, -1, self.hd)
        q = llama_torch.apply_rope(q, cos, sin)
        k = llama_torch.apply_rope(k, cos, sin)
        k = k.repeat_interleave(self.rep, dim=2)
        v = v.repeat_interleave(self.rep, dim=2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = nn.Linear(c["dim"], c["ffn_dim"], bias=False)
        self.w2 = nn.Linear(c["ffn_dim"], c["dim"], bias=False)
        self.w3 = nn.Linear(c["dim"], c["ffn_dim"], bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention_norm = nn.RMSNorm(c["dim"], eps=c["norm_eps"])
        self.attention = Attention(c)
        self.ffn_norm = nn.RMSNorm(c["dim"], eps=c["norm_eps"])
        self.feed_forward = FeedForward(c)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """llama_torch.Llama's model in torchtitan's modules; the loss taken
    under loss_parallel when the logits are vocabulary-sharded."""

    def __init__(self, c, T):
        super().__init__()
        self.tie = c["tie"]
        self.tok_embeddings = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = nn.RMSNorm(c["dim"], eps=c["norm_eps"])
        if not self.tie:
            self.output = nn.Linear(c["dim"], c["vocab"], bias=False)
        cos, sin = llama_torch.rope_tables(c, T)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        llama_torch.init_weights(self, c["n_layers"])

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.layers:
            x = b(x, cos, sin)
        h = self.norm(x)
        if self.tie:  # the table's Shard(0) rows are the logits' columns
            w = self.tok_embeddings.weight
            if hasattr(h, "redistribute"):
                h = h.redistribute(placements=[Replicate()])
            logits = F.linear(h, w)
        else:
            logits = self.output(h)
        return F.cross_entropy(logits.flatten(0, 1).float(),
                               targets.flatten(0, 1))


def apply_full_plan(model, mesh, compile_blocks, compile_mode):
    """torchtitan's apply_tp (sequence parallel, loss parallel) on model."""
    top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(),
                                             output_layouts=Shard(1)),
           "norm": SequenceParallel()}
    if not model.tie:
        top["output"] = ColwiseParallel(input_layouts=Shard(1),
                                        output_layouts=Shard(-1),
                                        use_local_output=False)
    parallelize_module(model, mesh, top)
    for i, block in enumerate(model.layers):
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None, None),
                desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })
        if compile_blocks:
            ckw = benchlib.compile_kwargs(torch, compile_mode)
            model.layers[i] = torch.compile(block, fullgraph=True, **ckw)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 8, 2048, 30)
    p.add_argument("--flavor", choices=sorted(benchlib.LLAMA3), default="1B")
    p.add_argument("--plan", choices=["full", "layers"], default="full",
                   help="torchtitan's plan (sequence and loss parallel), or "
                        "the blocks' linear layers only")
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    ranks = benchlib.init_torchrun("llama_tp", args.device)
    if ranks is None:
        return 2
    rank, world, dev = ranks
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("tp",))

    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)  # the same initial weights on every rank
    cfg = benchlib.llama_config(args.flavor, args.tiny)
    if args.plan == "layers" and not cfg["tie"]:
        print("llama_tp: --plan layers takes the tied 1B", file=sys.stderr)
        return 2
    model = (Llama(cfg, args.T) if args.plan == "full" else
             llama_torch.Llama(cfg, args.T)).to(dev)
    n = sum(q.numel() for q in model.parameters())
    if n != benchlib.num_params(cfg):
        print(f"llama_tp: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1
    if args.plan == "full":
        apply_full_plan(model, mesh, args.compile, args.compile_mode)
        name = "torch TP (torchtitan's plan)" + (
            " + compile" if args.compile else "")
        return benchlib.train(
            model, cfg, cfg, args, name,
            dist={"rank": rank, "world": world, "device": dev,
                  "data_rank": 0, "data_world": 1, "token_share": world,
                  "dtensor_grads": True, "autocast": True, "compiled": True,
                  "loss_context": loss_parallel, "tp": world,
                  "plan": "torchtitan: sequence parallel, loss parallel, "
                  "vocabulary-parallel embedding and output",
                  "model": "Llama 3 " + args.flavor})
    plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(),
            "wv": ColwiseParallel(), "wo": RowwiseParallel(),
            "w1": ColwiseParallel(), "w3": ColwiseParallel(),
            "w2": RowwiseParallel()}
    for i, block in enumerate(model.layers):
        parallelize_module(block, mesh, plan)
        block.nh //= world  # the local heads
        block.nkv //= world
        if args.compile:
            ckw = benchlib.compile_kwargs(torch, args.compile_mode)
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
    benchlib.run_main(main)
