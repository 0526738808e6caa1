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
                 [--mask causal|block_causal] [--eos-id 128001]
                 [--device cpu --tiny] [--check-mask]

--mask block_causal (trainrun's [model] attn_mask_type = "block_causal",
bench/parallel_gpu.sh's flex run) attends with FlexAttention instead of
SDPA, as torchtitan does: every step builds a BlockMask from the batch's
tokens (torchtitan's get_document_mask_mod and-ed with causal: a document
ends with, and includes, each --eos-id token, 128001 <|end_of_text|> for
Llama 3; a token sees only the earlier tokens of its own document) with
create_block_mask compiled, inside the timed step; attention is
flex_attention compiled (mode max-autotune-no-cudagraphs on cuda, as
torchtitan's FlexAttentionWrapper; the default mode on the CPU) with the
key/value heads grouped (enable_gqa); with --compile the whole model is
compiled and flex_attention is traced into its graph, in the model's
compile mode. A new mask each step recompiles nothing. --check-mask (no data needed) checks
on a tiny fp32 model that the block_causal loss and gradients equal those
of SDPA with the same mask written out as a dense boolean matrix.
"""
import argparse
import contextlib
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
from torch.nn.attention.flex_attention import (  # noqa: E402
    BlockMask, create_block_mask, flex_attention)


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

    def forward(self, x, cos, sin, mask=None):
        """mask: None (causal SDPA), a BlockMask (FlexAttention) or a
        boolean (B, 1, T, T) tensor, True where a query sees a key (SDPA
        with attn_mask: --check-mask's reference)."""
        B, T, C = x.shape
        h = F.rms_norm(x, (C,), self.attention_norm, self.eps)
        q = self.wq(h).view(B, T, self.nh, self.hd)
        k = self.wk(h).view(B, T, self.nkv, self.hd)
        v = self.wv(h).view(B, T, self.nkv, self.hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(mask, BlockMask):
            y = _FLEX["cuda" if q.is_cuda else "cpu"](
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                block_mask=mask, enable_gqa=True)
        else:
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                attn_mask=mask, is_causal=mask is None)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        h = F.rms_norm(x, (C,), self.ffn_norm, self.eps)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


# flex_attention and create_block_mask compiled once per process, as
# torchtitan's FlexAttentionWrapper and create_attention_mask compile them
# (max-autotune-no-cudagraphs on GPUs; the CPU takes the default mode)
_FLEX = {"cuda": torch.compile(flex_attention,
                               mode="max-autotune-no-cudagraphs"),
         "cpu": torch.compile(flex_attention)}
_CREATE_BLOCK_MASK = torch.compile(create_block_mask)


def document_ids(idx, eos_id):
    """(B, T) int32: the document of every token, a document ending with
    (and including) each eos_id token (torchtitan's get_document_mask_mod:
    the count of end-of-text tokens before a token)."""
    eos = (idx == eos_id).to(torch.int32)
    return torch.cumsum(eos, dim=1, dtype=torch.int32) - eos


def block_causal_mask(idx, eos_id):
    """The BlockMask of trainrun's block_causal for a batch of tokens:
    causal and within one document (torchtitan's
    and_masks(get_causal_mask_mod(), get_document_mask_mod(...)) built by
    its compiled create_block_mask)."""
    doc = document_ids(idx, eos_id)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc[b, q_idx] == doc[b, kv_idx])

    B, T = idx.shape
    return _CREATE_BLOCK_MASK(mask_mod, B, None, T, T, device=idx.device)


def dense_block_causal_mask(idx, eos_id):
    """block_causal_mask as a boolean (B, 1, T, T) tensor for SDPA."""
    doc = document_ids(idx, eos_id)
    T = idx.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    return (causal[None] & (doc[:, :, None] == doc[:, None, :]))[:, None]


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

    def forward(self, idx, targets, mask=None):
        T = idx.shape[1]
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.layers:
            x = b(x, cos, sin) if mask is None else b(x, cos, sin, mask)
        x = F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)
        logits = (F.linear(x, self.tok_embeddings.weight)  # tied output
                  if self.output is None else self.output(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(),
                               targets.reshape(-1))


def check_mask(cfg, device, eos_id):
    """--check-mask: a tiny fp32 model's loss and gradients under the
    FlexAttention block mask against SDPA with the dense mask (a batch of 2
    rows of 256 tokens, documents of 1 to 200 tokens, one row without an
    end-of-text token). Prints one JSON line; 0 when they agree to 1e-5.
    The CPU compares the losses only: PyTorch 2.11's FlexAttention has no
    backward on the CPU ("FlexAttention does not support backward on
    CPU")."""
    grads = device.type != "cpu"
    torch.manual_seed(0)
    B, T = 2, 256
    model = Llama(cfg, T).to(device)
    idx = torch.randint(0, cfg["vocab"], (B, T + 1), device=device)
    idx[idx == eos_id] = 0
    for t in (0, 1, 37, 38, 128, 129, 130, 201):  # docs across mask blocks
        idx[0, t] = eos_id
    x, y = idx[:, :-1], idx[:, 1:]
    out = {}
    for name, mask in (("flex", block_causal_mask(x, eos_id)),
                       ("sdpa_dense", dense_block_causal_mask(x, eos_id))):
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grads):
            loss = model(x, y, mask)
        if grads:
            loss.backward()
        out[name] = (loss.item(), [p.grad.clone() for p in model.parameters()
                                   if grads])
    with torch.no_grad():
        causal = model(x, y).item()
    (lf, gf), (ld, gd) = out["flex"], out["sdpa_dense"]
    gdiff = max([((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                 for a, b in zip(gf, gd)] or [float("nan")])
    ok = abs(lf - ld) <= 1e-5 * abs(ld) and (not grads or gdiff <= 1e-5)
    benchlib.emit({"check_mask": "ok" if ok else "FAIL", "device": str(device),
                   "loss_flex": lf, "loss_sdpa_dense": ld,
                   "loss_causal_for_contrast": causal,
                   "max_rel_grad_diff": gdiff if grads else
                   "not on the CPU (no FlexAttention backward there)",
                   "documents_row0": int(document_ids(x, eos_id)[0, -1]) + 1})
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 8, 2048, 30, data_required=False)
    p.add_argument("--flavor", choices=sorted(benchlib.LLAMA3), default="1B")
    p.add_argument("--mask", choices=["causal", "block_causal"],
                   default="causal",
                   help="causal SDPA, or FlexAttention with a per-batch "
                        "document block mask")
    p.add_argument("--eos-id", type=int, default=128001,
                   help="end-of-text token ending a document under "
                        "block_causal (Llama 3's <|end_of_text|>)")
    p.add_argument("--check-mask", action="store_true",
                   help="check FlexAttention block_causal against dense "
                        "masked SDPA on a tiny fp32 model and exit")
    p.set_defaults(lr=3e-4)
    args = p.parse_args()
    torch.set_float32_matmul_precision("high")
    benchlib.seed_all(args.seed)
    cfg = benchlib.llama_config(args.flavor, args.tiny or args.check_mask)
    if not 0 <= args.eos_id < cfg["vocab"]:
        p.error(f"--eos-id {args.eos_id} is not below the vocabulary "
                f"({cfg['vocab']})")
    if args.check_mask:
        torch.set_float32_matmul_precision("highest")
        return check_mask(cfg, torch.device(args.device), args.eos_id)
    if args.data is None:
        p.error("--data is required")
    if args.mask == "block_causal" and args.device == "cpu":
        p.error("--mask block_causal trains on GPUs only: PyTorch's "
                "FlexAttention has no backward on the CPU (--check-mask "
                "compares the loss there)")
    model = Llama(cfg, args.T).to(args.device)
    n = sum(q.numel() for q in model.parameters())
    if n != benchlib.num_params(cfg):
        print(f"llama_torch: {n} parameters, trainrun's formula says "
              f"{benchlib.num_params(cfg)}", file=sys.stderr)
        return 1
    name = "torch.compile" if args.compile else "torch eager"
    if args.mask == "causal":
        return benchlib.train(model, cfg, cfg, args, name)

    def prepare(x, y):  # the block mask of this batch, built in the step
        return (x, y, block_causal_mask(x, args.eos_id)), \
            contextlib.nullcontext()
    return benchlib.train(model, cfg, cfg, args,
                          name + ", FlexAttention block_causal",
                          prepare=prepare,
                          head_extra={"mask": "block_causal",
                                      "eos_id": args.eos_id,
                                      "attention": "flex_attention"})


if __name__ == "__main__":
    benchlib.run_main(main)
