#!/usr/bin/env python3
"""tests/gpu/curve.py: the data and the verdict of tests/gpu/curve.sh
(trainrun's loss curve against PyTorch's from the same initial weights).

  curve.py shard --out FILE --tokens N --vocab V [--states S] [--seed S]
  curve.py compare --mode gpu|cpu --ours METRICS.jsonl --torch RUN.jsonl
                   [--alt RUN.jsonl] [--fp32 RUN.jsonl] [--csv F] [--png F]

shard writes an llm.c shard (uint16 tokens, magic 20240520) of a learnable
stream: S of the V tokens are in use, each followed by one of 4 fixed
successors picked uniformly (the best possible loss is ln 4 = 1.386), so
that a short run's loss falls far from ln V and two curves can drift apart.

compare reads trainrun's metrics.jsonl and bench/peers/gpt2_torch.py's JSON
lines and prints one row per step: trainrun's loss, PyTorch's, their
relative difference, and the reference runs that measure the noise floor:
  --alt   PyTorch again with another attention kernel (gpu) or another
          AdamW implementation (cpu): what implementation choices alone
          change;
  --fp32  PyTorch in fp32 (gpu, full fp32 matmuls: curve.sh says why not
          TF32): what bf16 rounding alone changes.
The distance between two curves is the mean over steps of |a - b| / b.
Checks (exit 1 when one fails, 0 when all pass):
  - the learning rate of every step is the same (trainrun's schedule and
    the peer's agree to 1e-9 relative);
  - step 1 (same weights, same batch, no update yet) agrees to 1e-6
    relative (cpu) or 1e-2 (gpu): the initial weights and the batch are
    the same;
  - cpu: every step agrees to 1e-5 relative (fp32 against fp32: rounding
    only);
  - gpu: distance(trainrun, PyTorch bf16) <= 2 x the noise floor, the
    larger of distance(PyTorch bf16, --alt) and distance(PyTorch bf16,
    --fp32): trainrun's bf16 curve is no further from PyTorch's than
    PyTorch's own curves are from each other;
  - both runs learned: the mean loss of the last tenth of the steps is at
    least 1.0 below the first step's.
The table also goes to --csv; --png draws the curves when matplotlib is
installed (skipped quietly when it is not).
"""
import argparse
import json
import math
import sys

CPU_STEP1, GPU_STEP1 = 1e-6, 1e-2
CPU_EVERY = 1e-5
GPU_FACTOR = 2.0
LR_TOL = 1e-9
LEARNED = 1.0


def shard(a):
    import numpy as np
    if a.states > a.vocab or a.states < 2:
        sys.exit("curve.py: --states must be in 2..--vocab")
    if a.vocab > 65536:
        sys.exit("curve.py: --vocab above 65536 needs uint32 tokens")
    fixed = np.random.default_rng(7)
    ids = fixed.choice(a.vocab, size=a.states, replace=False)
    succ = fixed.integers(0, a.states, size=(a.states, 4)).tolist()
    picks = np.random.default_rng(a.seed).integers(0, 4, size=a.tokens)
    state = np.empty(a.tokens, dtype=np.int64)
    s = 0
    for i, p in enumerate(picks.tolist()):
        state[i] = s
        s = succ[s][p]
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1], hdr[2] = 20240520, 1, a.tokens
    with open(a.out, "wb") as f:
        f.write(hdr.tobytes())
        f.write(ids[state].astype("<u2").tobytes())
    print(f"{a.out}: {a.tokens} tokens, {a.states} of {a.vocab} in use, "
          f"best loss ln 4 = {math.log(4):.3f}")
    return 0


def read_run(path, trainrun):
    """{step: (loss, lr, grad_norm)} of a metrics.jsonl or a peer log."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "step" not in r or "loss" not in r or "val_loss" in r:
                continue
            if trainrun and "summary" in r:
                continue
            out[int(r["step"])] = (r["loss"], r.get("lr"), r.get("grad_norm"))
    if not out:
        raise ValueError(f"{path}: no per-step losses")
    return out


def rel(a, b):
    return abs(a - b) / abs(b) if b else float("inf")


def distance(a, b, steps):
    return sum(rel(a[s][0], b[s][0]) for s in steps) / len(steps)


def compare(a):
    ours = read_run(a.ours, True)
    ref = read_run(a.torch, False)
    alt = read_run(a.alt, False) if a.alt else None
    f32 = read_run(a.fp32, False) if a.fp32 else None
    steps = sorted(set(ours) & set(ref))
    for extra in (alt, f32):
        if extra is not None:
            steps = [s for s in steps if s in extra]
    if not steps or steps[0] != 1:
        print("FAIL: the runs share no steps starting at step 1 "
              f"(trainrun {len(ours)}, torch {len(ref)} steps)")
        return 1
    gpu = a.mode == "gpu"
    cols = ["step", "trainrun", "torch", "rel_diff"]
    if alt:
        cols += ["torch_alt", "rel_alt"]
    if f32:
        cols += ["torch_fp32", "rel_fp32"]
    cols += ["lr_trainrun", "lr_torch", "gnorm_trainrun", "gnorm_torch"]
    rows, bad = [], []
    every = CPU_EVERY if not gpu else None
    for s in steps:
        o, t = ours[s], ref[s]
        row = {"step": s, "trainrun": o[0], "torch": t[0],
               "rel_diff": rel(o[0], t[0])}
        if alt:
            row.update(torch_alt=alt[s][0], rel_alt=rel(alt[s][0], t[0]))
        if f32:
            row.update(torch_fp32=f32[s][0], rel_fp32=rel(f32[s][0], t[0]))
        row.update(lr_trainrun=o[1], lr_torch=t[1], gnorm_trainrun=o[2],
                   gnorm_torch=t[2])
        rows.append(row)
        if o[1] is None or t[1] is None or rel(o[1], t[1]) > LR_TOL:
            bad.append(f"step {s}: learning rate {o[1]} (trainrun) vs "
                       f"{t[1]} (torch)")
        if every is not None and row["rel_diff"] > every:
            bad.append(f"step {s}: loss differs by {row['rel_diff']:.2e} "
                       f"relative (limit {every:.0e})")

    hdr = "| step | trainrun | torch | rel diff |"
    sep = "|---:|---:|---:|---:|"
    if alt:
        hdr += " torch alt | rel |"
        sep += "---:|---:|"
    if f32:
        hdr += " torch fp32 | rel |"
        sep += "---:|---:|"
    print(hdr)
    print(sep)
    show = steps if len(steps) <= 40 else sorted(
        set(steps[:5] + steps[-5:] + steps[::max(1, len(steps) // 30)]))
    for r in rows:
        if r["step"] not in show:
            continue
        line = (f"| {r['step']} | {r['trainrun']:.6f} | {r['torch']:.6f} | "
                f"{r['rel_diff']:.2e} |")
        if alt:
            line += f" {r['torch_alt']:.6f} | {r['rel_alt']:.2e} |"
        if f32:
            line += f" {r['torch_fp32']:.6f} | {r['rel_fp32']:.2e} |"
        print(line)

    step1 = rows[0]["rel_diff"]
    lim1 = GPU_STEP1 if gpu else CPU_STEP1
    if step1 > lim1:
        bad.append(f"step 1: loss differs by {step1:.2e} relative (limit "
                   f"{lim1:.0e}): not the same weights or not the same batch")
    d_ours = distance(ours, ref, steps)
    print(f"distance(trainrun, torch) = {d_ours:.3e}  "
          f"(mean over {len(steps)} steps of |a-b|/b; max "
          f"{max(r['rel_diff'] for r in rows):.3e})")
    noise = []
    if alt:
        d = distance(alt, ref, steps)
        noise.append(d)
        print(f"distance(torch alt, torch)  = {d:.3e}  (noise: "
              f"{a.alt_label})")
    if f32:
        d = distance(f32, ref, steps)
        noise.append(d)
        print(f"distance(torch fp32, torch) = {d:.3e}  (noise: bf16 "
              f"rounding)")
        print(f"distance(trainrun, torch fp32) = "
              f"{distance(ours, f32, steps):.3e}")
        if a.ours_fp32:
            o32 = read_run(a.ours_fp32, True)
            s32 = [s for s in steps if s in o32]
            if s32:
                print(f"distance(trainrun fp32, torch fp32) = "
                      f"{distance(o32, f32, s32):.3e}  (both in fp32: the "
                      f"implementations)")
                print(f"distance(trainrun fp32, trainrun) = "
                      f"{distance(ours, o32, s32):.3e}  (trainrun's bf16 "
                      f"rounding)")
    if gpu:
        if not noise:
            bad.append("gpu mode needs --alt or --fp32 to measure the noise")
        else:
            floor = max(noise)
            lim = GPU_FACTOR * floor
            verdict = "ok" if d_ours <= lim else "FAIL"
            print(f"noise floor {floor:.3e}; limit {GPU_FACTOR:g} x floor = "
                  f"{lim:.3e}: {verdict}")
            if d_ours > lim:
                bad.append(f"distance(trainrun, torch) {d_ours:.3e} exceeds "
                           f"{GPU_FACTOR:g} x the noise floor {floor:.3e}")
    tail = steps[-max(1, len(steps) // 10):]
    for name, run in (("trainrun", ours), ("torch", ref)):
        first = run[1][0]
        last = sum(run[s][0] for s in tail) / len(tail)
        print(f"{name}: loss {first:.4f} at step 1, {last:.4f} over the last "
              f"{len(tail)} steps")
        if len(steps) >= 10 and not last <= first - LEARNED:
            bad.append(f"{name} did not learn: {first:.4f} -> {last:.4f}")

    if a.csv:
        with open(a.csv, "w") as f:
            f.write(",".join(cols) + "\n")
            for r in rows:
                f.write(",".join("" if r.get(c) is None else repr(r[c])
                                 for c in cols) + "\n")
    if a.png:
        plot(a.png, rows, alt is not None, f32 is not None)
    for b in bad:
        print("FAIL:", b)
    print("curve: " + ("FAIL" if bad else "ok"))
    return 1 if bad else 0


def plot(path, rows, alt, f32):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    s = [r["step"] for r in rows]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1]})
    ax.plot(s, [r["trainrun"] for r in rows], label="trainrun", lw=1.2)
    ax.plot(s, [r["torch"] for r in rows], label="PyTorch", lw=1.0, ls="--")
    if f32:
        ax.plot(s, [r["torch_fp32"] for r in rows], label="PyTorch fp32",
                lw=0.8, alpha=0.7)
    ax.set_ylabel("training loss")
    ax.legend()
    ax2.semilogy(s, [max(r["rel_diff"], 1e-12) for r in rows],
                 label="|trainrun - torch| / torch")
    if alt:
        ax2.semilogy(s, [max(r["rel_alt"], 1e-12) for r in rows],
                     label="|torch alt - torch| / torch", alpha=0.7)
    if f32:
        ax2.semilogy(s, [max(r["rel_fp32"], 1e-12) for r in rows],
                     label="|torch fp32 - torch| / torch", alpha=0.7)
    ax2.set_xlabel("step")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shard")
    s.add_argument("--out", required=True)
    s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--vocab", type=int, required=True)
    s.add_argument("--states", type=int, default=512)
    s.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("--mode", choices=["cpu", "gpu"], required=True)
    c.add_argument("--ours", required=True, help="trainrun's metrics.jsonl")
    c.add_argument("--torch", required=True, help="gpt2_torch.py's log")
    c.add_argument("--alt", help="gpt2_torch.py's log, another kernel")
    c.add_argument("--alt-label", default="another implementation")
    c.add_argument("--fp32", help="gpt2_torch.py's log in fp32")
    c.add_argument("--ours-fp32", help="trainrun's metrics.jsonl, fp32 "
                   "compute (information)")
    c.add_argument("--csv")
    c.add_argument("--png")
    a = p.parse_args()
    try:
        return shard(a) if a.cmd == "shard" else compare(a)
    except (OSError, ValueError, KeyError) as e:
        print(f"curve.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
