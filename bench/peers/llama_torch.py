#!/usr/bin/env python3
"""bench/peers/llama_torch.py: the PyTorch reference for bench/gpu_train.sh
llama1b: Llama 3.2 1B as trainrun builds it (model/config.c flavor 1B: dim
2048, 16 layers, 32 heads, 8 key/value heads, SwiGLU hidden 8192, vocab
128256, RMSNorm eps 1e-5, RoPE theta 500000 with Llama 3 frequency scaling
(factor 32, low 1, high 4, original context 8192), no biases, tied token
embedding and output), written the way torchtitan writes it (key/value
heads repeated for F.scaled_dot_product_attention, causal). Random init
(normal 0.02, output projections 0.02/sqrt(2*layers)), fp32 weights, bf16
autocast, gradient clipping at 1.0, fused AdamW. Reads uint32 llm.c shards
(magic 20240801). Default shape: batch 8 of 2048 tokens (16,384 tokens a
step; fits one H200 with no activation checkpointing).

  llama_torch.py --data train.bin [-B 8] [-T 2048] [--steps 30] [--compile]
                 [--device cpu --tiny]
"""
import argparse
import math
import os
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import numpy as np  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def rope_tables(c, T):
    """cos and sin (T, head_dim/2) with Llama 3's frequency scaling (computed
    in float64 on the host)."""
    D = c["dim"] // c["n_heads"]
    freqs = 1.0 / (c["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D))
    low_wavelen = c["rope_orig"] / c["rope_low"]
    high_wavelen = c["rope_orig"] / c["rope_high"]
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / c["rope_factor"])
        else:
            s = ((c["rope_orig"] / wavelen - c["rope_low"])
                 / (c["rope_high"] - c["rope_low"]))
            out.append((1 - s) * f / c["rope_factor"] + s * f)
    ang = np.outer(np.arange(T, dtype=np.float64), np.array(out))
    cpu = torch.device("cpu")
    return (torch.tensor(np.cos(ang), dtype=torch.float32, device=cpu),
            torch.tensor(np.sin(ang), dtype=torch.float32, device=cpu))


def apply_rope(x, cos, sin):
    """Rotate the interleaved pairs (x[2i], x[2i+1]) of x (B, T, H, D)."""
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    y = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return y.flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, D = c["dim"], c["dim"] // c["n_heads"]
        self.nh, self.nkv, self.hd = c["n_heads"], c["n_kv_heads"], D
        self.eps = c["norm_eps"]
        self.attention_norm = nn.Parameter(torch.ones(C))
        self.wq = nn.Linear(C, self.nh * D, bias=False)
        self.wk = nn.Linear(C, self.nkv * D, bias=False)
        self.wv = nn.Linear(C, self.nkv * D, bias=False)
        self.wo = nn.Linear(self.nh * D, C, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(C))
        self.w1 = nn.Linear(C, c["ffn_dim"], bias=False)
        self.w2 = nn.Linear(c["ffn_dim"], C, bias=False)
        self.w3 = nn.Linear(C, c["ffn_dim"], bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = F.rms_norm(x, (C,), self.attention_norm, self.eps)
        q = self.wq(h).view(B, T, self.nh, self.hd)
        k = self.wk(h).view(B, T, self.nkv, self.hd)
        v = self.wv(h).view(B, T, self.nkv, self.hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        h = F.rms_norm(x, (C,), self.ffn_norm, self.eps)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def init_weights(model, n_layers):
    """Normal(0, 0.02) matrices, the output projections wo and w2 at
    0.02/sqrt(2 layers); vectors (norms) left at their init."""
    std = 0.02
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue
        if name.endswith("wo.weight") or name.endswith("w2.weight"):
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layers))
        else:
            nn.init.normal_(p, 0.0, std)


class Llama(nn.Module):
    def __init__(self, c, T):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = nn.Parameter(torch.ones(c["dim"]))
        self.eps = c["norm_eps"]
        self.output = (None if c["tie"] else
                       nn.Linear(c["dim"], c["vocab"], bias=False))
        cos, sin = rope_tables(c, T)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        init_weights(self, c["n_layers"])

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.layers:
            x = b(x, cos, sin)
        x = F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)
        logits = (F.linear(x, self.tok_embeddings.weight)  # tied output
                  if self.output is None else self.output(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(),
                               targets.reshape(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 8, 2048, 30)
    p.add_argument("--flavor", choices=sorted(benchlib.LLAMA3), default="1B")
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)
    cfg = dict(benchlib.LLAMA3[args.flavor])
    if args.tiny:
        cfg.update(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192)
    model = Llama(cfg, args.T).to(args.device)
    n = sum(q.numel() for q in model.parameters())
    if n != benchlib.num_params(cfg):
        print(f"llama_torch: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1
    name = "torch.compile" if args.compile else "torch eager"
    return benchlib.train(model, cfg, cfg, args, name)


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # skip interpreter teardown (torch.compile's worker pools)
