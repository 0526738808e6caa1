#!/usr/bin/env python3
"""bench/gpu/summarize.py: the table of bench/gpu_train.sh from the logs in
OUTDIR: tokens/s (median over the steps after the first SKIP), step time,
MFU counted for every program with trainrun's FLOPs per token over the GPU's
dense bf16 peak (bench/peers/benchlib.py), the MFU each program reports
itself, and the ratios trainrun / peer. Prints the markdown table and writes
OUTDIR/table.md and OUTDIR/results.json.

  summarize.py --mode gpt2|llama1b --out OUTDIR --skip N --gpu NAME
               [-B B -T T]

Sources: trainrun: OUTDIR/trainrun/metrics.jsonl (else the step lines of
OUTDIR/trainrun.log); llm.c: the "step i/n | ... | X ms | Y% bf16 MFU |"
lines of OUTDIR/llmc.log (tokens/s = B*T / step time; its printed tok/s is
a moving average); PyTorch: the JSON step lines of OUTDIR/torch_*.log.
"""
import argparse
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # keep the tree clean
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "peers"))
import benchlib  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def read_rc(out, name):
    try:
        with open(os.path.join(out, name + ".rc")) as f:
            return f.read().strip()
    except OSError:
        return None


def trainrun_steps(out):
    """[(step, tps, own mfu or None)] from trainrun's JSONL or console."""
    rows = []
    path = os.path.join(out, "trainrun", "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if "step" in o and o.get("tps") is not None:
                    rows.append((int(o["step"]), float(o["tps"]), o.get("mfu")))
        if rows:
            return rows
    pat = re.compile(r"step (\d+)/\d+ .*?\| ([0-9.]+) tok/s .*?\| mfu "
                     r"(?:([0-9.]+)%|n/a)")
    try:
        with open(os.path.join(out, "trainrun.log"), errors="replace") as f:
            for line in f:
                m = pat.search(ANSI.sub("", line))
                if m:
                    rows.append((int(m.group(1)), float(m.group(2)),
                                 float(m.group(3)) if m.group(3) else None))
    except OSError:
        pass
    return rows


def llmc_steps(out, ntok):
    """[(step, tps, own mfu)] from llm.c's step lines."""
    # llm.c prints -100% MFU for a GPU it has no peak for (the H200)
    pat = re.compile(r"^step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \| "
                     r"(-?[0-9.]+)% bf16 MFU \|")
    rows = []
    try:
        with open(os.path.join(out, "llmc.log"), errors="replace") as f:
            for line in f:
                m = pat.search(line)
                if m and float(m.group(2)) > 0:
                    rows.append((int(m.group(1)),
                                 ntok / (float(m.group(2)) / 1e3),
                                 float(m.group(3))
                                 if float(m.group(3)) >= 0 else None))
    except OSError:
        pass
    return rows


def torch_steps(out, name):
    """([(step, tps, None)], summary or {}) from a PyTorch peer's log."""
    rows, summary = [], {}
    try:
        with open(os.path.join(out, name + ".log"), errors="replace") as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if "summary" in o:
                    summary = o
                elif "step" in o and "tps" in o:
                    rows.append((int(o["step"]), float(o["tps"]), None))
    except OSError:
        pass
    return rows, summary


def torch_device(out, name):
    """The device name in a PyTorch peer's first JSON line, or None."""
    try:
        with open(os.path.join(out, name + ".log"), errors="replace") as f:
            for line in f:
                if line.startswith("{") and '"device"' in line:
                    return json.loads(line).get("device")
    except (OSError, ValueError):
        pass
    return None


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("gpt2", "llama1b"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--skip", type=int, required=True)
    p.add_argument("--gpu", default="unknown")
    p.add_argument("-B", type=int, default=None)
    p.add_argument("-T", type=int, default=None)
    a = p.parse_args()
    if a.mode == "gpt2":
        cfg, B, T = benchlib.GPT2_124M, a.B or 64, a.T or 1024
        title = "GPT-2 124M"
        programs = [("trainrun", "trainrun"),
                    ("torch.compile", "torch_compile"), ("llm.c", "llmc"),
                    ("torch eager", "torch_eager"),
                    ("torch.compile, vocab 50304", "torch_compile_v50304")]
        target = ("torch.compile", 1.2)
    else:
        cfg, B, T = benchlib.LLAMA3_1B, a.B or 8, a.T or 2048
        title = "Llama 3.2 1B"
        programs = [("trainrun", "trainrun"),
                    ("torch.compile", "torch_compile"),
                    ("torch eager", "torch_eager")]
        target = ("torch.compile", 1.1)
    if a.gpu in ("", "unknown"):  # no nvidia-smi: the name torch saw
        for _, name in programs:
            if name.startswith("torch_"):
                a.gpu = torch_device(a.out, name) or a.gpu
    fpt = benchlib.flops_per_token(cfg, T)
    peak = benchlib.peak_bf16(a.gpu)
    res = {}
    for label, name in programs:
        rc = read_rc(a.out, name)
        summary = {}
        if name == "trainrun":
            rows = trainrun_steps(a.out)
        elif name == "llmc":
            rows = llmc_steps(a.out, B * T)
            if rc is None and read_rc(a.out, "llmc_build") not in (None, "0"):
                rc = "build"
        else:
            rows, summary = torch_steps(a.out, name)
        timed = [r for r in rows if r[0] > a.skip]
        log = "llmc_build.log" if rc == "build" else name + ".log"
        r = {"label": label, "log": log, "rc": rc,
             "steps_timed": len(timed)}
        if rc in (None, "skipped") and not timed:
            r["status"] = "skipped" if rc == "skipped" else "not run"
        elif not timed:
            r["status"] = ("timed out: see log" if rc == "124"
                           else "failed: see log")
        else:
            r["status"] = "ok" if rc == "0" else f"exit {rc}: see log"
            tps = benchlib.median([t for _, t, _ in timed])
            r["tps"] = tps
            r["step_ms"] = B * T / tps * 1e3
            r["mfu"] = 100.0 * tps * fpt / peak if peak > 0 else None
            own = [m for _, _, m in timed if m is not None]
            r["own_mfu"] = benchlib.median(own) if own else None
            r["max_mem_gib"] = summary.get("max_mem_gib")
        res[name] = r

    lines = [f"### {title}, B={B}, T={T}, {a.gpu}",
             "",
             f"tokens/s: median of the steps after the first {a.skip}. MFU: "
             f"{fpt / 1e6:.1f} MFLOP/token ({benchlib.FLOPS_FORMULA}) over "
             + (f"{peak / 1e12:.0f} TFLOP/s dense bf16" if peak > 0
                else "an unknown peak (n/a)") + "; own: what the program "
             "prints (llm.c counts its own FLOPs)."
             + (" The vocab 50304 row (llm.c's padding) is counted as the "
                "50257-token model." if a.mode == "gpt2" else ""),
             "",
             "| program | tokens/s | step ms | MFU | own MFU | steps | status |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for label, name in programs:
        r = res[name]
        lines.append(f"| {label} | {fmt(r.get('tps'), ',.0f')} | "
                     f"{fmt(r.get('step_ms'), '.1f')} | "
                     f"{fmt(r.get('mfu'), '.1f')}{'%' if r.get('mfu') is not None else ''} | "
                     f"{fmt(r.get('own_mfu'), '.1f')}{'%' if r.get('own_mfu') is not None else ''} | "
                     f"{r['steps_timed']} | {r['status']} ({r['log']}) |")
    lines.append("")
    tr = res["trainrun"].get("tps")
    ratios = {}
    for label, name in programs[1:]:
        peer = res[name].get("tps")
        if tr and peer:
            ratios[label] = tr / peer
            lines.append(f"- trainrun / {label}: {tr / peer:.2f}x")
        else:
            lines.append(f"- trainrun / {label}: n/a")
    tlabel, tval = target
    if tlabel in ratios:
        ok = ratios[tlabel] >= tval
        lines.append(f"- target trainrun >= {tval}x {tlabel}: "
                     + ("met" if ok else "NOT met"))
    if a.mode == "gpt2" and res["trainrun"].get("mfu") is not None:
        lines.append("- target MFU >= 50%: "
                     + ("met" if res["trainrun"]["mfu"] >= 50 else "NOT met"))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"mode": a.mode, "gpu": a.gpu, "B": B, "T": T,
                   "skip": a.skip, "flops_per_token": fpt, "peak": peak,
                   "formula": benchlib.FLOPS_FORMULA, "programs": res,
                   "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
