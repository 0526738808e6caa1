#!/usr/bin/env python3
"""tests/gpu/hf_parity.py: end-to-end numerics of GPU training against
Hugging Face transformers, on a GPU machine (torch + transformers, no
network).

  tests/gpu/hf_parity.py TRAINRUN OUTDIR [STEPS]

1. Writes llm.c token shards of a learnable stream (512 of the 50257 tokens;
   each next token is one of 4 successors of the previous one: the best
   possible loss is ln 4 = 1.386), a training and a validation shard.
2. Trains GPT-2 124M with trainrun on cuda (bf16 compute, fp32 master
   weights) for STEPS (200) steps; trainrun validates at the end and writes
   OUTDIR/run/model.safetensors + config.json (Hugging Face names).
3. Loads that folder into transformers' GPT2LMHeadModel and computes the
   validation loss on the same sequences trainrun validated on (samples
   0..n-1 of the validation shard, T+1 tokens each, fp32), and again under
   bf16 autocast.
Passes when |trainrun val_loss - HF fp32 loss| / HF loss <= 1e-2 and the
training loss fell below 5.0 from ln 50257 = 10.8 (it learned). Exit 0 / 1; a table on stdout.
"""
import json
import os
import subprocess
import sys

import numpy as np

V, T, B, VAL_STEPS = 50257, 1024, 16, 4
STATES = 512  # distinct tokens of the stream


def shard(path, n, seed):
    rng = np.random.default_rng(seed)
    fixed = np.random.default_rng(7)
    ids = fixed.choice(V, size=STATES, replace=False)  # tokens in use
    succ = fixed.integers(0, STATES, size=(STATES, 4))
    state = np.empty(n, dtype=np.int64)
    s = 0
    picks = rng.integers(0, 4, size=n)
    for i in range(n):
        state[i] = s
        s = succ[s, picks[i]]
    tok = ids[state].astype(np.uint16)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(tok.tobytes())
    return tok


def main():
    tr, out = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    os.makedirs(out, exist_ok=True)
    train = shard(os.path.join(out, "train.bin"), 2_000_000, 1)
    del train
    val = shard(os.path.join(out, "val.bin"), 200_000, 2)
    run = os.path.join(out, "run")
    cmd = [tr, "bench/gpu/gpt2_124m.toml",
           "--training.dataset_path", os.path.join(out, "train.bin"),
           "--training.local_batch_size", str(B),
           "--training.global_batch_size", str(B),
           "--training.steps", str(steps), "--metrics.log_freq", "20",
           "--optimizer.lr", "6e-4", "--lr_scheduler.warmup_steps", "20",
           "--validation.enable=true",
           "--validation.dataset_path", os.path.join(out, "val.bin"),
           "--validation.local_batch_size", str(B),
           "--validation.seq_len", str(T),
           "--validation.steps", str(VAL_STEPS),
           "--validation.freq", str(steps),
           "--checkpoint.export_dtype", "float32",
           "--job.dump_folder", run]
    with open(os.path.join(out, "trainrun.log"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        print("FAIL: trainrun exited %d (see %s/trainrun.log)" % (rc, out))
        return 1
    ours_val, last_loss = None, None
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                ours_val = r["val_loss"]
            elif "loss" in r:
                last_loss = r["loss"]

    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(run, torch_dtype=torch.float32)
    model = model.cuda().eval()
    n = VAL_STEPS * B
    x = np.stack([val[i * T:i * T + T + 1] for i in range(n)]).astype(np.int64)
    x = torch.from_numpy(x).cuda()
    losses = {}
    for name, ctx in (("fp32", torch.autocast("cuda", enabled=False)),
                      ("bf16", torch.autocast("cuda", dtype=torch.bfloat16))):
        tot = 0.0
        with torch.no_grad(), ctx:
            for i in range(0, n, B):
                logits = model(x[i:i + B, :T]).logits.float()
                tot += torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.size(-1)),
                    x[i:i + B, 1:].reshape(-1), reduction="sum").item()
        losses[name] = tot / (n * T)
    rel = abs(ours_val - losses["fp32"]) / losses["fp32"]
    ok = rel <= 1e-2 and last_loss is not None and last_loss < 5.0
    print("| after %d steps | loss |" % steps)
    print("|---|---:|")
    print("| trainrun last training loss | %.4f |" % last_loss)
    print("| trainrun val_loss (bf16 compute) | %.4f |" % ours_val)
    print("| transformers GPT2LMHeadModel, fp32 | %.4f |" % losses["fp32"])
    print("| transformers GPT2LMHeadModel, bf16 autocast | %.4f |"
          % losses["bf16"])
    print("relative difference to fp32: %.2e (limit 1e-2): %s"
          % (rel, "ok" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
