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

  summarize.py --mode multigpu --out OUTDIR --gpu NAME --nproc N
               [--command CMD]

bench/multi_gpu.sh's table (OUTDIR/summary.md and OUTDIR/summary.json):
every sub-run of OUTDIR/runs.tsv (name, kind, program, model, ranks,
replicate and shard degrees, B, T, steps, warm-up steps, then key=value
extras): tokens/s per GPU (median after the warm-up steps) and in all,
MFU, peak memory, the scaling efficiency of GPT-2 DDP against 1 GPU and of
Llama 8B FSDP against the fewest GPUs it ran on, HSDP against FSDP,
trainrun against PyTorch FSDP2, and for the checkpointed run with a kill
(its log's lines time-stamped as they arrived) the stall of each save, the
restart time and whether the job finished.
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
    p.add_argument("--mode", choices=("gpt2", "llama1b", "multigpu"),
                   required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--skip", type=int, default=None,
                   help="warm-up steps (required but for multigpu)")
    p.add_argument("--gpu", default="unknown")
    p.add_argument("-B", type=int, default=None)
    p.add_argument("-T", type=int, default=None)
    p.add_argument("--nproc", type=int, default=None, help="multigpu: N")
    p.add_argument("--command", default="", help="multigpu: the command")
    a = p.parse_args()
    if a.mode == "multigpu":
        return multigpu_main(a)
    if a.skip is None:
        p.error("the following arguments are required: --skip")
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


# ---- bench/multi_gpu.sh: --mode multigpu ----

# trainrun's flavor 8B (model/config.c), as bench/peers/llama_fsdp2.py has it
LLAMA3_8B = dict(family="llama3", dim=4096, n_layers=32, n_heads=32,
                 n_kv_heads=8, ffn_dim=14336, vocab=128256,
                 max_seq_len=131072, tie=False, norm_eps=1e-5,
                 rope_theta=500000.0, rope_factor=8.0, rope_low=1.0,
                 rope_high=4.0, rope_orig=8192)
MODELS = {"gpt2_124m": ("GPT-2 124M", benchlib.GPT2_124M),
          "llama3_1b": ("Llama 3.2 1B", benchlib.LLAMA3_1B),
          "llama3_8b": ("Llama 3 8B", LLAMA3_8B)}
STAMPED = re.compile(r"^(\d+\.\d+) (.*)$")


def mg_runs(out):
    """The sub-runs of OUTDIR/runs.tsv, in the order they ran."""
    keys = ("name", "kind", "program", "model", "n", "rep", "shard", "B",
            "T", "steps", "skip")
    runs = []
    try:
        with open(os.path.join(out, "runs.tsv")) as f:
            for line in f:
                cols = line.rstrip("\n").split("\t")
                if len(cols) < len(keys):
                    continue
                r = dict(zip(keys, cols))
                for k in ("n", "rep", "shard", "B", "T", "steps", "skip"):
                    r[k] = int(r[k])
                for kv in cols[len(keys):]:
                    k, _, v = kv.partition("=")
                    r[k] = v
                runs.append(r)
    except OSError:
        pass
    return runs


def mg_jsonl_steps(path):
    """[(step, tps, own mfu, peak bytes)] of a trainrun metrics.jsonl."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if "step" in o and o.get("tps") is not None:
                    rows.append((int(o["step"]), float(o["tps"]),
                                 o.get("mfu"), o.get("mem_peak_bytes")))
    except OSError:
        pass
    return rows


def mg_console_steps(path):
    """The same from trainrun's console lines (no metrics.jsonl)."""
    pat = re.compile(r"step (\d+)/\d+ .*?\| ([0-9.]+) tok/s .*?\| mfu "
                     r"(?:([0-9.]+)%|n/a)")
    rows = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = pat.search(ANSI.sub("", line))
                if m:
                    rows.append((int(m.group(1)), float(m.group(2)),
                                 float(m.group(3)) if m.group(3) else None,
                                 None))
    except OSError:
        pass
    return rows


def mg_wall(out, name):
    try:
        with open(os.path.join(out, name + ".wall")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def mg_figures(out, r, peak):
    """Fill r with the sub-run's figures and status."""
    name = r["name"]
    r["rc"] = read_rc(out, name)
    r["wall_s"] = mg_wall(out, name)
    r["log"] = name + ".log"
    summary = {}
    if r["kind"] == "torch":
        rows, summary = torch_steps(out, name)
        rows = [(s_, t, None, None) for s_, t, _ in rows]
    else:
        rows = mg_jsonl_steps(os.path.join(out, name + ".metrics.jsonl"))
        if not rows:
            rows = mg_console_steps(os.path.join(out, name + ".log"))
    if r["kind"] == "ckpt":  # both attempts: the steps of the last one
        last = {}
        for row in rows:
            last[row[0]] = row
        rows = [last[k] for k in sorted(last)]
    timed = [x for x in rows if x[0] > r["skip"]]
    r["steps_timed"] = len(timed)
    rc = r["rc"]
    if rc in (None, "skipped") and not timed:
        r["status"] = "skipped" if rc == "skipped" else "not run"
        return
    if not timed:
        r["status"] = "timed out" if rc == "124" else "failed"
        return
    r["status"] = "ok" if rc == "0" else f"exit {rc}"
    tps = benchlib.median([x[1] for x in timed])
    r["tps_gpu"] = tps
    r["tps_all"] = tps * r["n"]
    r["step_ms"] = r["B"] * r["T"] / tps * 1e3
    model = MODELS.get(r["model"])
    if model and peak > 0:
        r["flops_per_token"] = benchlib.flops_per_token(model[1], r["T"])
        r["mfu"] = 100.0 * tps * r["flops_per_token"] / peak
    own = [x[2] for x in timed if x[2] is not None]
    if own:
        r["own_mfu"] = benchlib.median(own)
    elif summary.get("mfu") is not None:
        r["own_mfu"] = summary["mfu"]
    try:  # trainrun plan's per-rank bytes before activations
        with open(os.path.join(out, name + ".plan.txt")) as f:
            m = re.search(r"total \(before activations\)\s+(\d+)",
                          f.read())
            if m:
                r["plan_gib"] = int(m.group(1)) / 2**30
    except OSError:
        pass
    mem = [x[3] for x in rows if x[3] is not None]
    if mem:
        r["peak_mem_gib"] = max(mem) / 2**30
    elif summary.get("max_mem_gib") is not None:
        r["peak_mem_gib"] = summary["max_mem_gib"]


def mg_ckpt(out, r):
    """The checkpoint and restart figures of the run with the kill, from
    its time-stamped log: {saves, kill, restore, restart_s, ...}."""
    kill_re = re.compile(r"debug\.fault '[^']*': SIGKILL at step (\d+)")
    restart_re = re.compile(r"restarting the workers \(restart (\d+) of")
    resume_re = re.compile(r"resumed from '([^']*)' at step (\d+)")
    step_re = re.compile(r"\bstep (\d+)/(\d+) \| loss (\S+)")
    save_re = re.compile(r"checkpoint step (\d+)( \(model only\))?: "
                         r"(?:save started|saved) in ([0-9.]+) s"
                         r"(, writing in the background)?")
    stall_re = re.compile(r"checkpoint step (\d+): training stalled "
                          r"([0-9.]+) s")
    done_re = re.compile(r"checkpoint step (\d+) complete: ([0-9.]+) MB "
                         r"written by rank 0 in ([0-9.]+) s")
    c = {"saves": [], "attempts": 1, "losses": [{}, {}], "finished": False}
    t_kill = t_restart = t_resume = t_first = None
    attempt = 0
    try:
        f = open(os.path.join(out, r["name"] + ".log"), errors="replace")
    except OSError:
        del c["losses"]
        return c
    with f:
        for line in f:
            m = STAMPED.match(line.rstrip("\n"))
            if not m:
                continue
            t, text = float(m.group(1)), ANSI.sub("", m.group(2))
            if (mm := kill_re.search(text)) and t_kill is None:
                t_kill, c["kill_step"] = t, int(mm.group(1))
            elif (mm := restart_re.search(text)):
                if t_restart is None:
                    t_restart = t
                attempt = 1
                c["attempts"] = 1 + int(mm.group(1))
            elif (mm := resume_re.search(text)):
                if attempt == 1 and t_resume is None:
                    t_resume, c["resumed_step"] = t, int(mm.group(2))
                    c["resumed_from"] = mm.group(1)
            elif (mm := save_re.search(text)):
                c["saves"].append({"step": int(mm.group(1)),
                                   "attempt": attempt,
                                   "model_only": bool(mm.group(2)),
                                   "held_s": float(mm.group(3)),
                                   "background": bool(mm.group(4))})
            elif (mm := stall_re.search(text)):
                # the save's true stall: its step and the two after it
                for sv in reversed(c["saves"]):
                    if sv["step"] == int(mm.group(1)) and "stall_s" not in sv:
                        sv["stall_s"] = float(mm.group(2))
                        break
            elif (mm := done_re.search(text)):
                for sv in reversed(c["saves"]):
                    if sv["step"] == int(mm.group(1)) and "write_s" not in sv:
                        sv["mb"] = float(mm.group(2))
                        sv["write_s"] = float(mm.group(3))
                        break
            elif (mm := step_re.search(text)):
                step = int(mm.group(1))
                c["total_steps"] = int(mm.group(2))
                c["last_step"] = step
                try:
                    c["losses"][attempt][step] = float(mm.group(3))
                except ValueError:
                    pass
                if (attempt == 1 and t_first is None and t_kill is not None
                        and step > c.get("resumed_step", 0)):
                    t_first, c["first_step_after"] = t, step
    if t_kill is not None:
        if t_restart is not None:
            c["detect_s"] = t_restart - t_kill
        if t_resume is not None:
            c["restore_s"] = t_resume - t_kill
        if t_first is not None:
            c["restart_s"] = t_first - t_kill
    if "first_step_after" in c:
        s_ = c["first_step_after"]
        before, after = c["losses"][0].get(s_), c["losses"][1].get(s_)
        if before is not None and after is not None:
            c["loss_before"], c["loss_after"] = before, after
    if c["losses"][0]:
        c["last_step_before_kill"] = max(c["losses"][0])
    c["finished"] = (r.get("rc") == "0" and c.get("last_step") is not None
                     and c.get("last_step") == c.get("total_steps"))
    del c["losses"]
    return c


def mg_pct(x):
    return "n/a" if x is None else f"{x:.1f}%"


def multigpu_main(a):
    out = a.out
    runs = mg_runs(out)
    peak = benchlib.peak_bf16(a.gpu)
    for r in runs:
        try:
            mg_figures(out, r, peak)
        except Exception as e:  # one odd log must not lose the table
            r["status"] = f"summary error: {e!r}"
    by = {r["name"]: r for r in runs}
    N = a.nproc or max([r["n"] for r in runs] or [0])
    env = ""
    try:
        with open(os.path.join(out, "env.txt"), errors="replace") as f:
            env = f.read().strip()
    except OSError:
        pass
    date = env.splitlines()[0] if env else "unknown"
    L = [f"# trainrun multi-GPU runs: {N} x {a.gpu}", "",
         f"- date: {date}",
         f"- command: `{a.command}`" if a.command else "- command: unknown",
         f"- GPU: {a.gpu}, {N} used; peak "
         + (f"{peak / 1e12:.0f} TFLOP/s dense bf16 each" if peak > 0
            else "unknown (MFU n/a)"),
         "- tokens/s: per GPU, the median of the steps after the warm-up "
         "steps; MFU: FLOPs per token (" + benchlib.FLOPS_FORMULA + ") x "
         "tokens/s per GPU / peak; own MFU: what the program prints",
         "- peak mem: the allocator's peak (trainrun) or "
         "max_memory_allocated (PyTorch) on rank 0; plan: `trainrun plan`'s "
         "per-rank parameters + gradients + AdamW state + largest "
         "unsharded group, before activations",
         "- logs: NAME.log, NAME.rc, NAME.metrics.jsonl, NAME.plan.txt in "
         "this folder"]
    if a.gpu.lower() == "cpu":
        L.append("- CPU smoke test (bench/multi_gpu.sh --cpu-smoke): debug "
                 "models of different sizes on CPU ranks; the figures test "
                 "the script and this table, not the programs' speed")
    L += ["",
          "## Throughput", "",
          "| run | program | model | GPUs | layout | B x T | tok/s/GPU | "
         "tok/s all | step ms | MFU | own MFU | peak mem GiB | plan GiB | "
         "timed steps | wall s | status |",
         "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
         "---:|---|"]
    for r in runs:
        if r["kind"] == "ckpt":
            continue
        if r["kind"] == "torch":
            layout = f"FSDP2 {r['n']}"
        elif r["shard"] == 1:
            layout = f"DDP {r['rep']}"
        elif r["rep"] == 1:
            layout = f"FSDP {r['shard']}"
        else:
            layout = f"HSDP {r['rep']}x{r['shard']}"
        mem = r.get("peak_mem_gib")
        L.append(f"| {r['name']} | {r['program']} | "
                 f"{MODELS.get(r['model'], (r['model'],))[0]} | {r['n']} | "
                 f"{layout} | {r['B']} x {r['T']} | "
                 f"{fmt(r.get('tps_gpu'), ',.0f')} | "
                 f"{fmt(r.get('tps_all'), ',.0f')} | "
                 f"{fmt(r.get('step_ms'), '.1f')} | {mg_pct(r.get('mfu'))} | "
                 f"{mg_pct(r.get('own_mfu'))} | "
                 f"{fmt(mem, '.1f')} | {fmt(r.get('plan_gib'), '.1f')} | "
                 f"{r.get('steps_timed', 0)} | "
                 f"{fmt(r.get('wall_s'), 'd')} | {r['status']} |")
    L.append("")

    # scaling
    L += ["## Scaling", "",
          "Efficiency: tokens/s per GPU on n GPUs over tokens/s per GPU on "
          "the baseline (1 GPU for GPT-2 DDP; Llama 3 8B does not fit one "
          "GPU, so its baseline is FSDP over the fewest GPUs it ran on, 2).",
          "", "| job | GPUs | tok/s/GPU | efficiency | baseline |",
          "|---|---:|---:|---:|---|"]
    scaling = {}
    for job, pick in (("GPT-2 124M DDP",
                       lambda r: r["kind"] == "trainrun"
                       and r["model"].endswith("gpt2_124m")),
                      ("Llama 3 8B FSDP",
                       lambda r: r["kind"] == "trainrun"
                       and r["model"].endswith("llama3_8b") and r["rep"] == 1)):
        rs = sorted([r for r in runs if pick(r) and r.get("tps_gpu")],
                    key=lambda r: r["n"])
        if not rs:
            L.append(f"| {job} | - | - | - | no run with figures |")
            continue
        base = rs[0]
        for r in rs:
            eff = r["tps_gpu"] / base["tps_gpu"]
            scaling.setdefault(job, {})[r["n"]] = eff
            L.append(f"| {job} | {r['n']} | {r['tps_gpu']:,.0f} | "
                     f"{100 * eff:.1f}% | {base['name']} |")
    L.append("")

    # ratios
    L += ["## Ratios", ""]
    ratios = {}
    fs, tc = by.get(f"llama8b_fsdp_n{N}"), by.get(f"torch_fsdp2_n{N}")
    hs = next((r for r in runs if r["name"].startswith("llama8b_hsdp_")),
              None)
    if fs and tc and fs.get("tps_gpu") and tc.get("tps_gpu"):
        ratios["trainrun_fsdp_over_torch_fsdp2"] = fs["tps_gpu"] / tc["tps_gpu"]
        v = ratios["trainrun_fsdp_over_torch_fsdp2"]
        L.append(f"- trainrun FSDP / PyTorch FSDP2 + compile, "
                 f"{MODELS.get(fs['model'], (fs['model'],))[0]} on {N} "
                 f"GPUs, tokens/s per GPU: {v:.2f}x (target >= 1.0x, goal "
                 "1.1x: " + ("met" if v >= 1.0 else "NOT met") + ")")
    else:
        L.append("- trainrun FSDP / PyTorch FSDP2 + compile: n/a (a run has "
                 "no figures)")
    hf = by.get(f"llama8b_fsdp_n{hs['n']}") if hs else None
    if hs and hf and hs.get("tps_gpu") and hf.get("tps_gpu"):
        ratios["hsdp_over_fsdp"] = hs["tps_gpu"] / hf["tps_gpu"]
        L.append(f"- HSDP {hs['rep']}x{hs['shard']} / FSDP {hf['n']}, "
                 f"tokens/s per GPU: {ratios['hsdp_over_fsdp']:.2f}x")
    elif hs:
        L.append(f"- HSDP {hs['rep']}x{hs['shard']} / FSDP {hs['n']}: n/a "
                 f"(no FSDP run on {hs['n']} ranks with figures)")
    else:
        L.append("- HSDP / FSDP: n/a (no HSDP run)")
    L.append("")

    # checkpoint + kill
    ck = next((r for r in runs if r["kind"] == "ckpt"), None)
    ckres = None
    if ck:
        try:
            ckres = mg_ckpt(out, ck)
        except Exception as e:  # the table above still comes out
            ckres = {"saves": [], "attempts": 1, "finished": False,
                     "error": repr(e)}
            L.append(f"(summary error in the checkpoint log: {e!r})")
        L += ["## Checkpoints and a killed worker", "",
              f"{MODELS.get(ck['model'], (ck['model'],))[0]}, "
              f"{'DDP' if ck['shard'] == 1 else 'FSDP'} over {ck['n']} ranks, "
              f"B {ck['B']} x T {ck['T']}, {ck['steps']} steps, an async "
              f"checkpoint every {ck.get('interval', '?')} steps, rank "
              f"{ck.get('kill_rank', '?')} killed (SIGKILL) as step "
              f"{ck.get('kill_step', '?')} starts, --max-restarts 1 "
              f"(log {ck['log']}, exit {ck.get('rc')}, {ck.get('wall_s')} s). "
              "Times are the arrival times of the log lines.", "",
              "| save step | attempt | model only | stall s | written MB | "
              "write s |", "|---:|---:|---|---:|---:|---:|"]
        for sv in ckres["saves"]:
            L.append(f"| {sv['step']} | {sv['attempt']} | "
                     f"{'yes' if sv['model_only'] else 'no'} | "
                     f"{fmt(sv.get('stall_s'), '.3f')} | "
                     f"{fmt(sv.get('mb'), '.1f')} | "
                     f"{fmt(sv.get('write_s'), '.3f')} |")
        full = [sv["stall_s"] for sv in ckres["saves"]
                if not sv["model_only"] and sv.get("stall_s") is not None]
        if full:
            ckres["stall_median_s"] = benchlib.median(full)
        L += ["",
              f"- stall per async save (full saves): median "
              f"{fmt(ckres.get('stall_median_s'), '.3f')} s, max "
              f"{fmt(max(full) if full else None, '.3f')} s",
              f"- killed at step {ckres.get('kill_step', 'n/a')} (last step "
              f"logged before: {ckres.get('last_step_before_kill', 'n/a')}); "
              f"resumed at step {ckres.get('resumed_step', 'n/a')} from "
              f"{ckres.get('resumed_from', 'n/a')}",
              f"- kill -> launcher restarts the workers: "
              f"{fmt(ckres.get('detect_s'), '.2f')} s; kill -> checkpoint "
              f"restored: {fmt(ckres.get('restore_s'), '.2f')} s; "
              f"**restart time, kill -> first step after the restore (step "
              f"{ckres.get('first_step_after', 'n/a')}): "
              f"{fmt(ckres.get('restart_s'), '.2f')} s**",
              f"- loss of step {ckres.get('first_step_after', 'n/a')} "
              f"before the kill / after the restore: "
              f"{fmt(ckres.get('loss_before'), '.4f')} / "
              f"{fmt(ckres.get('loss_after'), '.4f')}",
              f"- the job {'finished' if ckres['finished'] else 'did NOT finish'}"
              f" (last step {ckres.get('last_step', 'n/a')} of "
              f"{ckres.get('total_steps', 'n/a')}, "
              f"{ckres['attempts']} attempts)"]
        if ck.get("tps_gpu"):
            L.append(f"- tokens/s per GPU over the run's steps (both "
                     f"attempts, saves included): {ck['tps_gpu']:,.0f}")
        L.append("")

    # wall time of every sub-run, the shards too
    L += ["## Wall time per sub-run", "", "| sub-run | s | exit |",
          "|---|---:|---|"]
    names = ["make_shard_llama", "make_shard_gpt2"] + [r["name"] for r in runs]
    for nm in names:
        w, rc = mg_wall(out, nm), read_rc(out, nm)
        if w is not None or rc is not None:
            L.append(f"| {nm} | {fmt(w, 'd')} | {rc} |")
    L += ["", "## Environment", "", "```", env, "```", ""]
    text = "\n".join(L)
    sys.stdout.write(text)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"gpu": a.gpu, "nproc": N, "command": a.command,
                   "date": date, "peak": peak, "runs": runs,
                   "scaling": scaling, "ratios": ratios, "ckpt": ckres},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
