#!/usr/bin/env python3
"""bench/peers/gpt2_torch.py: the PyTorch reference for bench/gpu_train.sh:
GPT-2 124M as trainrun and Hugging Face's GPT2LMHeadModel build it (vocab
50257, tied token embedding and output, learned positions, pre-LayerNorm,
fused qkv projection with biases, GELU tanh), random init (normal 0.02,
residual projections 0.02/sqrt(2*layers)), trained on an llm.c shard with
fp32 weights, bf16 autocast, F.scaled_dot_product_attention (causal),
gradient clipping at 1.0 and fused AdamW (betas 0.9/0.95, weight decay 0.1
on matrices). One JSON line per step, then a summary with the median
tokens/s after the warm-up steps and MFU counted as trainrun counts it.

  gpt2_torch.py --data train.bin [-B 64] [-T 1024] [--steps 60] [--compile]
                [--vocab 50304] [--device cpu --tiny]

--vocab 50304 pads the vocabulary as llm.c does (the extra rows are never
targets); MFU still counts the 50257-token model.
"""
import argparse
import math
import os
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["dim"]
        self.nh = c["n_heads"]
        self.ln_1 = nn.LayerNorm(C, eps=c["norm_eps"])
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=c["norm_eps"])
        self.c_fc = nn.Linear(C, c["ffn_dim"])
        self.mlp_proj = nn.Linear(c["ffn_dim"], C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        k = k.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        v = v.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp_proj(h)


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab"], c["dim"])
        self.wpe = nn.Embedding(c["max_seq_len"], c["dim"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.ln_f = nn.LayerNorm(c["dim"], eps=c["norm_eps"])
        self.lm_head = nn.Linear(c["dim"], c["vocab"], bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight") or name.endswith(
                    "mlp_proj.weight"):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * c["n_layers"]))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(),
                               targets.reshape(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 64, 1024, 60)
    p.add_argument("--vocab", type=int, default=50257,
                   help="embedding rows (50304: llm.c's padding)")
    args = p.parse_args()
    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)
    flops_cfg = dict(benchlib.GPT2_124M)
    if args.tiny:
        flops_cfg.update(dim=64, n_layers=2, n_heads=4, ffn_dim=256,
                         max_seq_len=max(args.T, 64))
    if args.T > flops_cfg["max_seq_len"]:
        p.error(f"-T {args.T} exceeds the model's {flops_cfg['max_seq_len']}")
    if args.vocab < flops_cfg["vocab"]:
        p.error(f"--vocab must be at least {flops_cfg['vocab']}")
    cfg = dict(flops_cfg, vocab=args.vocab)
    model = GPT2(cfg).to(args.device)
    n = sum(q.numel() for q in model.parameters())
    if args.vocab == flops_cfg["vocab"] and n != benchlib.num_params(cfg):
        print(f"gpt2_torch: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1
    name = "torch.compile" if args.compile else "torch eager"
    if args.vocab != flops_cfg["vocab"]:
        name += f" (vocab {args.vocab})"
    return benchlib.train(model, cfg, flops_cfg, args, name)


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # skip interpreter teardown (torch.compile's worker pools)
