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
                [--vocab 50304] [--device cpu --tiny] [--flavor debugmodel]
                [--init-hf FILE] [training semantics, see --help]
  gpt2_torch.py --save-init FILE [--flavor F] [--seed S]

--vocab 50304 pads the vocabulary as llm.c does (the extra rows are never
targets); MFU still counts the 50257-token model. --flavor picks one of
trainrun's GPT-2 shapes (model/config.c: 124M, debugmodel).

For loss-curve comparisons with trainrun (tests/gpu/curve.sh):
--save-init FILE writes this model's random initial weights as Hugging Face
GPT2LMHeadModel safetensors (transformer.* names, Conv1D weights stored
in x out, no lm_head.weight: it is tied, and trainrun's model config as
metadata) and exits; trainrun loads such a file with [checkpoint]
initial_load_path + initial_load_in_hf, or `trainrun ckpt import` turns
it into a step folder for initial_load_path. --init-hf
FILE starts from such a file (trainrun's exports too). --data-order
trainrun, --lr-schedule trainrun (--warmup-steps ...), the AdamW and
clipping flags and --precision fp32 make the run consume the same batches
with the same optimizer as a trainrun job; each step's JSON line carries
the loss, the gradient norm before clipping and the learning rate used.
"""
import argparse
import json
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


FLAVORS = {  # trainrun's GPT-2 shapes (model/config.c), ffn 4*dim
    "124M": dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=12,
                 ffn_dim=3072, vocab=50257, max_seq_len=1024),
    "debugmodel": dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=4,
                       ffn_dim=512, vocab=256, max_seq_len=256),
}

# this module's parameter name -> (Hugging Face name, stored transposed:
# GPT-2's Conv1D keeps its weight as in x out)
_HF_BLOCK = {"ln_1.weight": ("ln_1.weight", False),
             "ln_1.bias": ("ln_1.bias", False),
             "c_attn.weight": ("attn.c_attn.weight", True),
             "c_attn.bias": ("attn.c_attn.bias", False),
             "c_proj.weight": ("attn.c_proj.weight", True),
             "c_proj.bias": ("attn.c_proj.bias", False),
             "ln_2.weight": ("ln_2.weight", False),
             "ln_2.bias": ("ln_2.bias", False),
             "c_fc.weight": ("mlp.c_fc.weight", True),
             "c_fc.bias": ("mlp.c_fc.bias", False),
             "mlp_proj.weight": ("mlp.c_proj.weight", True),
             "mlp_proj.bias": ("mlp.c_proj.bias", False)}


def hf_name(name):
    """(Hugging Face name, transposed) of one of GPT2's parameter names."""
    if name.startswith("h."):
        _, layer, rest = name.split(".", 2)
        hf, tr = _HF_BLOCK[rest]
        return f"transformer.h.{layer}.{hf}", tr
    return "transformer." + name, False


def trainrun_config_json(c, flavor):
    """The model config trainrun records in its safetensors metadata
    (tr_model_config_to_json), so that `trainrun ckpt import` takes the
    file."""
    return json.dumps({
        "family": "gpt2", "flavor": flavor, "vocab_size": c["vocab"],
        "max_seq_len": c["max_seq_len"], "dim": c["dim"],
        "n_layers": c["n_layers"], "n_heads": c["n_heads"],
        "n_kv_heads": c["n_heads"], "head_dim": c["dim"] // c["n_heads"],
        "ffn_dim": c["ffn_dim"], "ffn_dim_multiplier": 0.0,
        "multiple_of": 0, "norm_eps": c["norm_eps"], "rope_theta": 0.0,
        "rope_scaling": {"factor": 0.0, "low_freq_factor": 0.0,
                         "high_freq_factor": 0.0, "original_max_pos": 0},
        "tie_embeddings": True, "bias": True}, separators=(",", ":"))


def save_init(model, path, flavor=None):
    """The model's weights as a Hugging Face GPT-2 safetensors file; with
    flavor (one of trainrun's), its trainrun model config as metadata."""
    out = {}
    for name, p in model.named_parameters():  # the tied lm_head comes once
        hf, tr = hf_name(name)
        a = p.detach().float().cpu()
        out[hf] = (a.t() if tr else a).contiguous().numpy()
    meta = {"format": "pt", "writer": "bench/peers/gpt2_torch.py"}
    if flavor:
        meta["trainrun_model_config"] = trainrun_config_json(model.c, flavor)
    benchlib.st_write(path, out, meta)
    return len(out)


def load_hf(model, path):
    """Copy a Hugging Face GPT-2 safetensors file into model: every
    parameter must be there with its shape (names with or without the
    "transformer." prefix); attention-mask buffers and the tied
    lm_head.weight are ignored, anything else is an error."""
    st = benchlib.st_read(path)
    used = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            hf, tr = hf_name(name)
            key = hf if hf in st else hf[len("transformer."):]
            if key not in st:
                raise ValueError(f"{path}: tensor {hf!r} is missing")
            a = torch.from_numpy(st[key].astype("float32"))
            if tr:
                a = a.t()
            if tuple(a.shape) != tuple(p.shape):
                want = list(p.shape)[::-1] if tr else list(p.shape)
                raise ValueError(f"{path}: tensor {hf!r} has shape "
                                 f"{list(st[key].shape)}, the model expects "
                                 f"{want}")
            p.copy_(a)
            used.add(key)
    for key in st:
        if key in used or key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if key == "lm_head.weight":
            continue
        raise ValueError(f"{path}: tensor {key!r} is not a parameter of "
                         f"the model")
    return len(used)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchlib.common_args(p, 64, 1024, 60, data_required=False)
    p.add_argument("--vocab", type=int, default=None,
                   help="embedding rows (default: the flavor's; 50304: "
                        "llm.c's padding)")
    p.add_argument("--flavor", choices=sorted(FLAVORS), default="124M",
                   help="trainrun's GPT-2 shape (--tiny overrides it)")
    p.add_argument("--init-hf", metavar="FILE",
                   help="start from these Hugging Face GPT-2 safetensors")
    p.add_argument("--save-init", metavar="FILE",
                   help="write the random initial weights as Hugging Face "
                        "GPT-2 safetensors and exit")
    p.add_argument("--matmul-precision", default="high",
                   choices=["highest", "high", "medium"],
                   help="torch.set_float32_matmul_precision (high: TF32 "
                        "matmuls on NVIDIA GPUs)")
    args = p.parse_args()
    if not args.save_init and not args.data:
        p.error("--data is required (unless --save-init)")
    torch.set_float32_matmul_precision(args.matmul_precision)
    benchlib.seed_all(args.seed)
    flops_cfg = dict(benchlib.GPT2_124M, **FLAVORS[args.flavor])
    if args.vocab is None:
        args.vocab = flops_cfg["vocab"]
    if args.tiny:
        flops_cfg.update(dim=64, n_layers=2, n_heads=4, ffn_dim=256,
                         max_seq_len=max(args.T, 64))
    if args.T > flops_cfg["max_seq_len"] and not args.save_init:
        p.error(f"-T {args.T} exceeds the model's {flops_cfg['max_seq_len']}")
    if args.vocab < flops_cfg["vocab"]:
        p.error(f"--vocab must be at least {flops_cfg['vocab']}")
    cfg = dict(flops_cfg, vocab=args.vocab)
    model = GPT2(cfg)
    if args.save_init:
        same = not args.tiny and args.vocab == flops_cfg["vocab"]
        n = save_init(model, args.save_init, args.flavor if same else None)
        benchlib.emit({"saved_init": args.save_init, "tensors": n,
                       "flavor": "tiny" if args.tiny else args.flavor,
                       "seed": args.seed})
        return 0
    if args.init_hf:
        try:
            load_hf(model, args.init_hf)
        except (OSError, ValueError) as e:
            print(f"gpt2_torch: {e}", file=sys.stderr)
            return 1
    model = model.to(args.device)
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
    benchlib.run_main(main)
