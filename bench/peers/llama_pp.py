#!/usr/bin/env python3
"""bench/peers/llama_pp.py: the PyTorch pipeline-parallel reference for
trainrun's pipeline_parallel_degree (issue 19): llama_torch.py's Llama 3.2
1B cut into stages as torchtitan cuts it (the embedding and the output each
weigh one layer, the effective layers spread evenly over the stages, the
first ones one more) and run by torch.distributed.pipelining with the same
schedule class and micro-batches as trainrun: Schedule1F1B (one stage a
rank) or ScheduleZBVZeroBubble (two a rank, in a V: rank r holds stages r
and 2N-1-r). bf16 autocast over fp32 weights, fused AdamW on each rank's
stages, clipping at 1.0 over the global norm (the squares summed over the
ranks). The output projection is a copy of the token table on the last
stage (PyTorch's stages cannot share a tensor; trainrun sums the tied
gradient between the end stages instead). With --compile every block is
compiled (torchtitan's per-block compile). Every rank reads the same
samples; tokens/s and MFU are per GPU: a step's B*T over the N ranks.

  torchrun --nproc-per-node N llama_pp.py --data train.bin [-B 8]
           [-T 2048] [--steps 30] [--skip S] [--microbatch 1]
           [--schedule 1F1B|ZBVZeroBubble] [--compile]
           [--device cpu --tiny]   (CPU: Gloo instead of NCCL)
"""
import os
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import llama_torch  # noqa: E402

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def split(n_layers, n_stages, first_less=1, last_less=1):
    """torchtitan's generate_llm_fqn_per_model_part: each stage's layer
    range [lo, hi)."""
    eff = n_layers + first_less + last_less
    base, rem = divmod(eff, n_stages)
    sizes = [base + (1 if s < rem else 0) for s in range(n_stages)]
    sizes[0] -= first_less
    sizes[-1] -= last_less
    out, lo = [], 0
    for s in sizes:
        out.append((lo, lo + s))
        lo += s
    return out


class Stage(nn.Module):
    """Layers [lo, hi) of a Llama, with its embedding on the first stage and
    its final norm and output projection on the last."""

    def __init__(self, full, cfg, lo, hi, first, last, amp):
        super().__init__()
        self.first, self.last, self.amp = first, last, amp
        self.emb = full.tok_embeddings if first else None
        self.layers = nn.ModuleList(full.layers[lo:hi])
        self.eps = full.eps
        if last:
            self.norm = nn.Parameter(full.norm.detach().clone())
            self.out = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
            with torch.no_grad():  # the tied table's copy, or the output
                self.out.weight.copy_(full.tok_embeddings.weight
                                      if full.output is None else
                                      full.output.weight)
        self.register_buffer("cos", full.cos, persistent=False)
        self.register_buffer("sin", full.sin, persistent=False)

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16,
                            enabled=self.amp):
            if self.first:
                x = self.emb(x)
            T = x.shape[1]
            for b in self.layers:
                x = b(x, self.cos[:T], self.sin[:T])
            if self.last:
                x = F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)
                x = self.out(x)
        return x


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 8, 2048, 30)
    p.add_argument("--schedule", choices=("1F1B", "ZBVZeroBubble"),
                   default="1F1B")
    p.add_argument("--microbatch", type=int, default=1,
                   help="sequences a micro-batch (divides -B)")
    p.add_argument("--flavor", choices=sorted(benchlib.LLAMA3), default="1B")
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (
        Schedule1F1B, ScheduleZBVZeroBubble)
    ranks = benchlib.init_torchrun("llama_pp", args.device)
    if ranks is None:
        return 2
    rank, world, dev = ranks
    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)  # the same initial weights on every rank
    cfg = benchlib.llama_config(args.flavor, args.tiny)
    full = llama_torch.Llama(cfg, args.T).to(dev)
    v = 2 if args.schedule == "ZBVZeroBubble" else 1
    n_stages = world * v
    ranges = split(cfg["n_layers"], n_stages)
    mine = [rank] if v == 1 else [rank, 2 * world - 1 - rank]
    amp = dev.type == "cuda"
    mods, stages = [], []
    for s in mine:
        lo, hi = ranges[s]
        m = Stage(full, cfg, lo, hi, s == 0, s == n_stages - 1, amp).to(dev)
        if args.compile:
            for i, b in enumerate(m.layers):
                m.layers[i] = torch.compile(b, fullgraph=True)
        mods.append(m)
        stages.append(PipelineStage(m, s, n_stages, dev))
    del full
    n_micro = args.B // args.microbatch

    def loss_fn(logits, y):
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)),
                               y.reshape(-1))

    if v == 1:
        sched = Schedule1F1B(stages[0], n_micro, loss_fn=loss_fn)
    else:
        sched = ScheduleZBVZeroBubble(stages, n_micro, loss_fn=loss_fn)
    params = [q for m in mods for q in m.parameters()]
    decay = [q for q in params if q.dim() >= 2]
    rest = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    batches = benchlib.Batches(args.data, args.B, args.T, dev, 0, 1,
                               "sequential", args.seed)
    holds_first = 0 in mine
    holds_last = n_stages - 1 in mine
    out = benchlib.emit if rank == 0 else (lambda obj: None)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    fpt = benchlib.flops_per_token(cfg, args.T)
    peak = benchlib.peak_bf16(gpu)
    program = "torch pipelining " + args.schedule + (
        " + compile" if args.compile else "")
    out({"program": program, "torch": torch.__version__, "device": gpu,
         "B": args.B, "T": args.T, "microbatch": args.microbatch,
         "n_micro": n_micro, "pp": world, "stages": n_stages,
         "split": ranges, "compile": bool(args.compile),
         "model": "Llama 3 " + args.flavor,
         "tied_output": ("copied (one tensor per end stage)" if cfg["tie"]
                         else "untied")})
    skip = args.skip if args.skip is not None else max(3, args.steps // 5)
    ntok = args.B * args.T / world
    dts = []
    last = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = batches.next()
        losses = []
        kw = {}
        if holds_last:
            kw = {"target": y, "losses": losses}
        if holds_first:
            sched.step(x, **kw)
        else:
            sched.step(**kw)
        sq = torch.zeros((), device=dev, dtype=torch.float32)
        for q in params:
            if q.grad is not None:
                sq += q.grad.float().pow(2).sum()
        lsum = torch.stack(losses).float().sum() if losses else \
            torch.zeros((), device=dev)
        pair = torch.stack([sq, lsum])
        dist.all_reduce(pair)
        norm = float(pair[0].sqrt())
        coef = min(1.0, 1.0 / (norm + 1e-6))
        if coef < 1.0:
            torch._foreach_mul_([q.grad for q in params if q.grad is not None],
                                coef)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = float(pair[1]) / n_micro
        now = time.perf_counter()
        dt, last = now - last, now
        if step > skip:
            dts.append(dt)
        out({"step": step, "loss": lv, "grad_norm": norm, "dt_ms": dt * 1e3,
             "tps": ntok / dt})
        if not math.isfinite(lv):
            return 1
    mdt = benchlib.median(dts)
    tps = ntok / mdt if dts else float("nan")
    out({"summary": program, "steps_timed": len(dts), "skip": skip,
         "median_step_ms": mdt * 1e3, "median_tps": tps,
         "flops_per_token": fpt, "peak_flops": peak,
         "mfu": 100.0 * tps * fpt / peak if peak > 0 else None,
         "max_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30
         if dev.type == "cuda" else None, "world_size": world})
    return 0


if __name__ == "__main__":
    benchlib.run_main(main)
