#!/usr/bin/env python3
"""bench/gpu/summarize.py: the tables of bench/gpu_train.sh and
bench/multi_gpu.sh from the raw files in OUTDIR, over every run found there
(the rounds of bench/benchlib.sh's protocol, from one call or several
copied into one folder). Prints the markdown and writes OUTDIR/README.md.

  summarize.py --out OUTDIR [--mode gpt2|llama1b] [--skip N] [--gpu NAME]
               [-B B -T T]

bench/gpu_train.sh's table (mode, shape and warm-up steps from
OUTDIR/bench.conf, the GPU from versions-*.txt): the runs KEY_rROUND
(OUTDIR/*_rN.rc); a run's figure is the median tokens/s of its steps after
the first SKIP, from trainrun's NAME.metrics.jsonl (else NAME.log's step
lines), llm.c's "step i/n | ... | X ms | Y% bf16 MFU |" lines of NAME.log
(tokens/s = B*T / step time; its printed tok/s is a moving average), a
PyTorch peer's JSON step lines (NAME.jsonl, else NAME.log); a program's
figure the median over its runs [min-max]; MFU counted for every program
with trainrun's FLOPs per token over the GPU's dense bf16 peak
(bench/peers/benchlib.py); trainrun against the fastest PyTorch
configuration and the fastest llm.c one (failed runs have no figure);
each program's configuration, precision recipe and raw files. Also
OUTDIR/results.json.

  summarize.py --plan --out OUTDIR --programs "KEY ..." [--mode M]
               [--budget S] [--call-budget S] [--reps N] [--within PCT]

The next call's share of the protocol (docs/PERFORMANCE.md): PROGRAMS,
FIRST_REP and REPS for bench/gpu_train.sh, from the runs already in OUTDIR
(the screening round first, then rounds 2 .. N of trainrun and of each
peer's fastest configuration and those within PCT of it), packed into S
seconds (480) by each program's NAME.wall (else a typical figure); a
run that a call's deadline skipped is still to do, and one it cut after
NAME.cut seconds counts as needing 1.25 times that. What does not fit S
waits for a later call, except that a whole call's budget (--call-budget,
480) runs the cheapest program even when it needs more; when nothing
fits, the plan says so and prints no PROGRAMS.

  summarize.py --mode multigpu --out OUTDIR [--gpu NAME] [--nproc N]
               [--command CMD]

bench/multi_gpu.sh's table (OUTDIR/README.md, summary.md, summary.json):
every sub-run of the calls' OUTDIR/runs-*.tsv (name, kind, program, model,
ranks, replicate and shard degrees, B, T, steps, warm-up steps, then
key=value extras), grouped into programs (the name without _rROUND):
tokens/s per GPU (median over the runs [min-max] of each run's median
after the warm-up steps) and in all, MFU, peak memory, the scaling
efficiency of GPT-2 DDP against 1 GPU and of Llama 8B FSDP against the
fewest GPUs it ran on, HSDP against FSDP, trainrun FSDP against the fastest
PyTorch FSDP2 configuration of the same model, and for the checkpointed
run with a kill (its log's lines time-stamped as they arrived) the stall
of each save, the restart time and whether the job finished.
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


# A run that timed out (exit 124: a cold compile can outlast it) runs once
# more: protocol_call.sh moves the first attempt's files into this folder
# before the retry, and a run whose first attempt is there is done.
RETRIED = "timed-out"


def first_timeout(out, name):
    """True when run NAME timed out and has not been retried yet."""
    return (read_rc(out, name) == "124" and not os.path.exists(
        os.path.join(out, RETRIED, name + ".rc")))


def retried_note(out):
    """The README's line on first attempts that timed out, if any."""
    d = os.path.join(out, RETRIED)
    n = len([f for f in os.listdir(d) if f.endswith(".rc")]) \
        if os.path.isdir(d) else 0
    if not n:
        return []
    return [f"First attempts that timed out and ran once more (a cold "
            f"compile can outlast a run's timeout; the retry's files are "
            f"the ones above): [{RETRIED}/]({RETRIED}/), {n} run(s).", ""]


def run_wall(out, name):
    """A run's wall seconds (NAME.wall), or None."""
    try:
        with open(os.path.join(out, name + ".wall")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def read_text(out, name):
    try:
        with open(os.path.join(out, name), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def jsonl_rows(path):
    """The JSON objects of a file of JSON lines (other lines ignored)."""
    rows = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return rows


def trainrun_steps(out, name):
    """([(step, tps, own mfu or None)], raw file) of a trainrun run: its
    NAME.metrics.jsonl, else the step lines of NAME.log."""
    path = name + ".metrics.jsonl"
    rows = [(int(o["step"]), float(o["tps"]), o.get("mfu"))
            for o in jsonl_rows(os.path.join(out, path))
            if "step" in o and o.get("tps") is not None]
    if rows:
        return rows, path
    pat = re.compile(r"step (\d+)/\d+ .*?\| ([0-9.]+) tok/s .*?\| mfu "
                     r"(?:([0-9.]+)%|n/a)")
    for line in read_text(out, name + ".log").splitlines():
        m = pat.search(ANSI.sub("", line))
        if m:
            rows.append((int(m.group(1)), float(m.group(2)),
                         float(m.group(3)) if m.group(3) else None))
    return rows, name + ".log"


def llmc_steps(out, name, ntok):
    """([(step, tps, own mfu)], raw file) from llm.c's step lines."""
    # llm.c prints -100% MFU for a GPU it has no peak for (the H200)
    pat = re.compile(r"^step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \| "
                     r"(-?[0-9.]+)% bf16 MFU \|")
    rows = []
    for line in read_text(out, name + ".log").splitlines():
        m = pat.search(line)
        if m and float(m.group(2)) > 0:
            rows.append((int(m.group(1)), ntok / (float(m.group(2)) / 1e3),
                         float(m.group(3)) if float(m.group(3)) >= 0
                         else None))
    return rows, name + ".log"


def torch_steps(out, name):
    """([(step, tps, None)], summary or {}, head or {}, raw file) of a
    PyTorch peer's run: its JSON lines (NAME.jsonl, else NAME.log)."""
    path = name + ".jsonl"
    objs = jsonl_rows(os.path.join(out, path))
    if not objs:
        path = name + ".log"
        objs = jsonl_rows(os.path.join(out, path))
    rows, summary, head = [], {}, {}
    for o in objs:
        if "summary" in o:
            summary = o
        elif "program" in o and not head:
            head = o
        elif "step" in o and "tps" in o:
            rows.append((int(o["step"]), float(o["tps"]), None))
    return rows, summary, head, path


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def pct(x):
    return "n/a" if x is None else f"{x:.1f}%"


def spread(vals, spec=",.0f"):
    """median [min-max] of vals (one value: just it)."""
    if not vals:
        return "n/a"
    m = format(benchlib.median(vals), spec)
    if len(vals) == 1:
        return m
    return f"{m} [{format(min(vals), spec)}-{format(max(vals), spec)}]"


# what each program keeps in which precision (issue 22: stated per program)
PRECISION = {
    "trainrun": "bf16 matmuls and activations, residual stream in bf16; fp32 "
                "master weights, gradients and AdamW state "
                "(mixed_precision_param bfloat16)",
    "llmc": "bf16 weights and activations, residual stream in bf16; fp32 "
            "master weights (-w 1, its default) and AdamW state",
    "torch": "fp32 weights and AdamW state (fused), bf16 autocast: matmuls "
             "and SDPA in bf16, residual stream, norms, softmax and loss in "
             "fp32",
    "fsdp2": "FSDP2 MixedPrecisionPolicy: bf16 parameters and compute (no "
             "autocast: residual stream in bf16), fp32 gradient "
             "reduce-scatter, fp32 sharded master weights and AdamW state",
}


def torch_config(key):
    """Words for a torch_MODE[_v50304][_nosync] key (bench/benchlib.sh)."""
    k, words = key, []
    sync = "a host sync per step"
    if k.endswith("_nosync"):
        k, sync = (k[:-len("_nosync")],
                   "no host sync per step (--no-sync: CUDA events)")
    vocab = ""
    if k.endswith("_v50304"):
        k, vocab = k[:-len("_v50304")], ", vocab 50304"
    for suffix, text in (("_autotune_nocg", "compile max-autotune-no-cudagraphs"),
                         ("_autotune", "compile max-autotune"),
                         ("_compile_tunable", "compile (default mode) with "
                          "TunableOp (GEMM candidates timed)"),
                         ("_compile", "compile (default mode)"),
                         ("_eager", "eager")):
        if k.endswith(suffix):
            words.append(text)
            break
    else:
        words.append(k)
    return words[0] + vocab + ", " + sync


LLMC_CONFIG = {"llmc": "defaults (-r 1: GELU recomputed, -ge 0)",
               "llmc_r0_ge1": "-r 0 -ge 1 (no recompute, GELU fused "
                              "forward)",
               "llmc_r0_ge2": "-r 0 -ge 2 (no recompute, GELU fused "
                              "forward and backward)"}

RUN_RC = re.compile(r"^(.+)_r(\d+)\.rc$")


def find_runs(out):
    """{key: [(round, name)]} of every KEY_rR.rc in out."""
    runs = {}
    for f in sorted(os.listdir(out)):
        m = RUN_RC.match(f)
        if m and not f.startswith("make_shard"):
            runs.setdefault(m.group(1), []).append((int(m.group(2)),
                                                   f[:-len(".rc")]))
    for k in runs:
        runs[k].sort()
    return runs


def read_conf(out):
    conf = {}
    for word in read_text(out, "bench.conf").split():
        k, _, v = word.partition("=")
        conf[k] = v
    return conf


def read_calls(out, prefix, suffix):
    """The text of every call's PREFIX*SUFFIX file (PREFIX-CALL_ID.SUFFIX,
    and PREFIX.SUFFIX of older folders), in call order."""
    names = sorted(f for f in os.listdir(out)
                   if f.startswith(prefix) and f.endswith(suffix))
    return names, "".join(read_text(out, f) for f in names)


def call_lines(versions):
    """Each call of versions-*.txt as `VARS command` (its PROGRAMS,
    FIRST_REP and REPS, then its command line)."""
    calls, head = [], None
    for line in versions.splitlines():
        m = re.match(r"== call (\S+) (.*)$", line)
        if m:
            head = m.group(2)
        elif line.startswith("command: ") and head is not None:
            calls.append(f"`{head} {line[len('command: '):]}`")
            head = None
    return calls


def gpu_names(versions):
    """The distinct GPU names of versions.txt's blocks."""
    names = []
    for line in versions.splitlines():
        if line.startswith("gpu: ") and "," in line:
            n = line.split(",")[1].strip()
            if n not in names:
                names.append(n)
    return names


def one_gpu_programs(out, runs, toml, B, T, skip, fpt, peak):
    """{key: program} of bench/gpu_train.sh's runs (find_runs): each run's
    status and figure (the median tokens/s of its steps after skip), the
    program's median over its runs [min-max], step time and MFU (fpt
    FLOPs a token over peak; None without a peak)."""
    progs = {}
    for key, rs in runs.items():
        family = family_of(key)
        p = {"key": key, "family": family, "runs": []}
        if family == "trainrun":
            p["config"] = f"bench/gpu/{toml}.toml"
        elif family == "llmc":
            p["config"] = LLMC_CONFIG.get(key, key)
        else:
            p["config"] = torch_config(key)
        for rnd, name in rs:
            rc = read_rc(out, name)
            if family == "trainrun":
                rows, raw = trainrun_steps(out, name)
            elif family == "llmc":
                rows, raw = llmc_steps(out, name, B * T)
            else:
                rows, _, _, raw = torch_steps(out, name)
            timed = [r for r in rows if r[0] > skip]
            r = {"name": name, "round": rnd, "rc": rc, "raw": raw,
                 "log": name + ".log", "steps_timed": len(timed)}
            if timed and rc == "0":
                r["tps"] = benchlib.median([t for _, t, _ in timed])
                own = [m for _, _, m in timed if m is not None]
                r["own_mfu"] = benchlib.median(own) if own else None
                r["status"] = "ok"
            else:
                r["status"] = ("skipped" if rc == "skipped" else
                               "timed out" if rc == "124" else
                               "llm.c build failed" if rc == "build" else
                               f"failed (exit {rc})")
            p["runs"].append(r)
        ok = [r["tps"] for r in p["runs"] if "tps" in r]
        if ok:
            p["tps"] = benchlib.median(ok)
            p["tps_min"], p["tps_max"] = min(ok), max(ok)
            p["step_ms"] = B * T / p["tps"] * 1e3
            p["mfu"] = 100.0 * p["tps"] * fpt / peak if peak > 0 else None
            own = [r["own_mfu"] for r in p["runs"]
                   if r.get("own_mfu") is not None]
            p["own_mfu"] = benchlib.median(own) if own else None
        p["ok"], p["failed"] = len(ok), len(p["runs"]) - len(ok)
        progs[key] = p

    return progs


def one_gpu_main(a):
    out = a.out
    conf = read_conf(out)
    mode = a.mode or conf.get("mode")
    if mode not in ("gpt2", "llama1b"):
        sys.exit(f"summarize: no --mode and no mode in {out}/bench.conf")
    skip = a.skip if a.skip is not None else int(conf.get("skip", 3))
    if mode == "gpt2":
        cfg, title, toml = benchlib.GPT2_124M, "GPT-2 124M", "gpt2_124m"
        B, T = a.B or int(conf.get("B", 64)), a.T or int(conf.get("T", 1024))
        targets = [("PyTorch", 1.25), ("llm.c", None)]
        mfu_target = 50
    else:
        cfg, title, toml = benchlib.LLAMA3_1B, "Llama 3.2 1B", "llama3_1b"
        B, T = a.B or int(conf.get("B", 8)), a.T or int(conf.get("T", 2048))
        targets = [("PyTorch", 1.15)]
        mfu_target = 60
    vfiles, versions = read_calls(out, "versions", ".txt")
    vlinks = ", ".join(f"[{f}]({f})" for f in vfiles) or "none"
    gpus = gpu_names(versions)
    gpu = a.gpu if a.gpu not in ("", "unknown") else (gpus[0] if gpus else
                                                      "unknown")
    runs = find_runs(out)
    if gpu == "unknown":  # no nvidia-smi: the name torch saw
        for k, rs in runs.items():
            if k.startswith("torch_"):
                for _, name in rs:
                    d = torch_steps(out, name)[2].get("device")
                    if d:
                        gpu = d
    fpt = benchlib.flops_per_token(cfg, T)
    peak = benchlib.peak_bf16(gpu)
    progs = one_gpu_programs(out, runs, toml, B, T, skip, fpt, peak)

    def best(family):
        c = [p for p in progs.values() if p["family"] == family
             and p.get("tps")]
        return max(c, key=lambda p: p["tps"]) if c else None

    tr = progs.get("trainrun")
    bests = {"PyTorch": best("torch"), "llm.c": best("llmc")}
    date = next((ln.split()[2][:10] for ln in versions.splitlines()
                 if ln.startswith("== call")), "undated")
    L = [f"# {title} on one {gpu}: trainrun against PyTorch"
         + (" and llm.c" if mode == "gpt2" else "") + f" ({date})", "",
         f"`bench/gpu_train.sh {mode}` (every call's command line and "
         f"versions: {vlinks}), B={B}, T={T}, "
         f"{conf.get('steps', '?')} steps a run. Each program runs in "
         "rounds, odd rounds in the listed order and even ones reversed; a "
         "run's figure is the median tokens/s of its steps after the first "
         f"{skip} (warm-up, compilation), a program's the median over its "
         "runs [min-max]. MFU: "
         f"{fpt / 1e6:.1f} MFLOP/token ({benchlib.FLOPS_FORMULA}) over "
         + (f"{peak / 1e12:.0f} TFLOP/s dense bf16" if peak > 0
            else "an unknown peak (n/a)")
         + "; own: what the program prints (llm.c counts its own FLOPs). "
         "Every program reads the same shard (shards.txt), clips gradients "
         "at 1.0 and uses AdamW with weight decay 0.1. Calls: "
         + ("; ".join(call_lines(versions)) or "unknown") + "."
         + (" The vocab 50304 configurations (llm.c pads to it too) are "
            "counted as the 50257-token model." if mode == "gpt2" else ""),
         ""]
    if len(gpus) > 1:
        L += [f"**The calls ran on different GPUs ({', '.join(gpus)}): "
              "compare only figures of the same GPU.**", ""]
    if gpu.lower() == "cpu":
        L += ["CPU smoke test: the figures test the script and this table, "
              "not the programs' speed.", ""]
    L += ["| program | configuration | tokens/s, median [min-max] | step ms "
          "| MFU | own MFU | runs ok | raw files |",
          "|---|---|---:|---:|---:|---:|---:|---|"]
    fam_order = {"trainrun": 0, "llmc": 1, "torch": 2}
    order = sorted(progs.values(), key=lambda p: (fam_order[p["family"]],
                                                  p["key"]))
    for p in order:
        label = {"trainrun": "trainrun", "llmc": "llm.c",
                 "torch": "PyTorch"}[p["family"]]
        mark = ""
        if p is bests.get("PyTorch") or p is bests.get("llm.c"):
            mark = " (fastest)"
        # no figure: failed, or only cut by a call's deadline (still to run)
        cut = all(r["status"] == "skipped" for r in p["runs"])
        figure = (spread([r["tps"] for r in p["runs"] if "tps" in r])
                  if p.get("tps") else
                  "still to run (cut by a call's deadline)" if cut else
                  "failed")
        files = ", ".join(f"[{r['round']}]({r['raw']})" for r in p["runs"])
        fails = [f"r{r['round']}: {r['status']} ([log]({r['log']}))"
                 for r in p["runs"] if "tps" not in r]
        L.append(f"| {label}{mark} | `{p['key']}`: {p['config']} | "
                 f"{figure} | {fmt(p.get('step_ms'), '.1f')} | "
                 f"{fmt(p.get('mfu'), '.1f')}"
                 f"{'%' if p.get('mfu') is not None else ''} | "
                 f"{fmt(p.get('own_mfu'), '.1f')}"
                 f"{'%' if p.get('own_mfu') is not None else ''} | "
                 f"{p['ok']}/{len(p['runs'])} | {files}"
                 + ("; " + "; ".join(fails) if fails else "") + " |")
    L.append("")
    ratios = {}
    # the issue's row: trainrun, the fastest peers, the ratios
    head = ["run", "trainrun"] + [f"fastest {w}" for w, _ in targets] + \
        [f"trainrun / {w}" for w, _ in targets]
    row = [f"{title}, one {gpu}, B{B} T{T}",
           (f"{spread([r['tps'] for r in tr['runs'] if 'tps' in r])}, MFU "
            f"{pct(tr.get('mfu'))}") if tr and tr.get("tps")
           else "failed"]
    for w, _ in targets:
        b = bests.get(w)
        fam = "torch" if w == "PyTorch" else "llmc"
        ran = any(p["family"] == fam for p in progs.values())
        row.append(f"{spread([r['tps'] for r in b['runs'] if 'tps' in r])} "
                   f"(`{b['key']}`), MFU {pct(b.get('mfu'))}"
                   if b else "none worked" if ran else "not run")
    for w, _ in targets:
        b = bests.get(w)
        row.append(f"{tr['tps'] / b['tps']:.2f}x" if b and tr
                   and tr.get("tps") else "n/a")
    L += ["| " + " | ".join(head) + " |",
          "|" + "---|" * len(head), "| " + " | ".join(row) + " |", ""]
    if tr and tr.get("mfu") is not None:
        L += [f"trainrun's MFU {tr['mfu']:.1f}%: target {mfu_target}% "
              + ("met" if tr["mfu"] >= mfu_target else "NOT met"), ""]
    for who, target in targets:
        b = bests.get(who)
        if not (tr and tr.get("tps") and b):
            L.append(f"- trainrun / fastest {who}: n/a (no run with figures)")
            continue
        v = tr["tps"] / b["tps"]
        ratios[who] = {"ratio": v, "against": b["key"]}
        lo, hi = tr["tps_min"] / b["tps_max"], tr["tps_max"] / b["tps_min"]
        L.append(f"- **trainrun / fastest {who} ({b['key']}: {b['config']}): "
                 f"{v:.2f}x** (least and most favourable run pairs "
                 f"{lo:.2f}x-{hi:.2f}x)"
                 + (f"; target {target}x: " + ("met" if v >= target
                                                 else "NOT met")
                    if target else ""))
    L += ["", "Failed or timed-out runs count as runs without a figure; the "
          "fastest configuration is taken among those that worked.", "",
          "## Precision recipes", ""]
    fams = sorted({p["family"] for p in progs.values()},
                  key=lambda f: fam_order[f])
    for f in fams:
        L.append(f"- {dict(trainrun='trainrun', llmc='llm.c', torch='PyTorch')[f]}: "
                 f"{PRECISION[f]}")
    L += ["", "## Raw files", "",
          "NAME = KEY_rROUND: NAME.cmd (the command), NAME.log (its output), "
          "NAME.rc (its exit status), NAME.metrics.jsonl (trainrun's "
          "per-step metrics), NAME.jsonl (a PyTorch peer's per-step JSON "
          "lines and summary); llm.c's step lines are in NAME.log. "
          "versions-CALL_ID.txt: GPU, driver, CUDA, NCCL, PyTorch, llm.c's "
          "and trainrun's commits, one per call; shards.txt: the data's "
          "sha256.", ""]
    L += retried_note(out)
    if os.path.exists(os.path.join(out, "NOTES.md")):
        L += ["What happened to this folder (runs moved aside, corrections "
              "to the versions files): [NOTES.md](NOTES.md).", ""]
    text = "\n".join(L)
    sys.stdout.write(text)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"mode": mode, "gpu": gpu, "B": B, "T": T, "skip": skip,
                   "flops_per_token": fpt, "peak": peak,
                   "formula": benchlib.FLOPS_FORMULA, "programs": progs,
                   "ratios": ratios}, f, indent=1)
    return 0


# ---- the next call's share of the protocol: --plan ----

# A run's wall seconds (compilation and start-up included) until the
# folder has its own (NAME.wall): H100/H200 figures of sessions 3-13
DEFAULT_WALL = {"gpt2": {"trainrun": 40, "llmc": 60, "eager": 60,
                         "compile": 120, "compile_tunable": 180,
                         "autotune": 420, "autotune_nocg": 420},
                "llama1b": {"trainrun": 60, "eager": 90, "compile": 180,
                            "compile_tunable": 240, "autotune": 480,
                            "autotune_nocg": 480},
                # bench/multi_gpu.sh's programs (2 GPUs)
                "multigpu": {"gpt2": 45, "l1b": 70, "l8b": 150, "ckpt": 220,
                             "t1b_eager": 90, "t1b_compile": 150,
                             "t1b_compile_tunable": 210,
                             "t8b_compile_tunable": 300,
                             "t1b_autotune": 420, "t1b_autotune_nocg": 420,
                             "t8b_eager": 150, "t8b_compile": 240,
                             "t8b_autotune": 480, "t8b_autotune_nocg": 480}}


MODES = r"(eager|compile_tunable|compile|autotune_nocg|autotune)"


def wall_class(key):
    """The keys whose runs cost about the same: trainrun, llm.c, and
    PyTorch's eager, compile, compile_tunable, autotune and autotune_nocg
    modes; for
    bench/multi_gpu.sh each job (gpt2, l1b, l8b, ckpt) and t1b_MODE,
    t8b_MODE (PyTorch FSDP2)."""
    if key == "trainrun" or key.startswith("llmc"):
        return "trainrun" if key == "trainrun" else "llmc"
    for prefix, c in (("gpt2_ddp", "gpt2"), ("llama1b_", "l1b"),
                      ("llama8b_", "l8b"), ("ckpt_kill", "ckpt")):
        if key.startswith(prefix):
            return c
    m = re.match(r"torch_fsdp2_(1b|8b)_n\d+_" + MODES, key)
    if m:
        return f"t{m.group(1)}_{m.group(2)}"
    m = re.match(r"torch_" + MODES, key)
    return m.group(1) if m else "compile"


def run_cut(out, name):
    """The seconds a run ran before a call's deadline cut it (NAME.cut),
    or None."""
    try:
        with open(os.path.join(out, name + ".cut")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def wall_of(out, mode, key, runs):
    """The median wall seconds of key's runs in out, else of the runs of
    its class (wall_class) in out, else the default; at least 1.25 times
    the longest that a deadline cut one of key's runs after (it needed
    more than it had)."""
    def walls(keys):
        w = []
        for k in keys:
            for _, name in runs.get(k, []):
                t = run_wall(out, name)
                # a skipped run did not run at all, or was cut
                if t is not None and read_rc(out, name) != "skipped":
                    w.append(t)
        return w
    w = walls([key]) or walls([k for k in runs
                               if wall_class(k) == wall_class(key)])
    est = benchlib.median(w) if w else DEFAULT_WALL[mode][wall_class(key)]
    cuts = [c for c in (run_cut(out, name) for _, name in runs.get(key, []))
            if c is not None]
    return max([est] + [1.25 * c for c in cuts])


def family_of(key):
    """Whose program key is: trainrun's (every job of bench/multi_gpu.sh
    but the PyTorch peers and the checkpoint run), llmc, torch (one GPU),
    torch1b and torch8b (PyTorch FSDP2), ckpt."""
    if key.startswith("llmc"):
        return "llmc"
    m = re.match(r"torch_fsdp2_(1b|8b)_", key)
    if m:
        return "torch" + m.group(1)
    if key.startswith("torch_"):
        return "torch"
    return "ckpt" if key.startswith("ckpt_kill") else "trainrun"


def program_tps(out, mode, runs, a, conf):
    """{key: the median tokens/s (per GPU for multigpu) over its runs}."""
    if mode == "multigpu":
        rs = mg_runs(out)
        for r in rs:
            try:
                mg_figures(out, r, 0)
            except Exception:  # a run without figures is left out
                pass
        return {p["key"]: p.get("tps_gpu") for p in mg_programs(rs)}
    skip = a.skip if a.skip is not None else int(conf.get("skip", 3))
    toml, B0, T0 = (("gpt2_124m", 64, 1024) if mode == "gpt2" else
                    ("llama3_1b", 8, 2048))
    B, T = a.B or int(conf.get("B", B0)), a.T or int(conf.get("T", T0))
    progs = one_gpu_programs(out, runs, toml, B, T, skip, 0, 0)
    return {k: p.get("tps") for k, p in progs.items()}


def plan_main(a):
    """Print the next call's PROGRAMS, FIRST_REP and REPS for
    bench/gpu_train.sh or bench/multi_gpu.sh: docs/PERFORMANCE.md's order
    (a screening round of every program once; then rounds 2 .. REPS of
    trainrun's programs, the fastest configuration of each peer and every
    configuration within --within percent of it; multi_gpu.sh's checkpoint
    run once, in round 1), as many programs of the next round as fit
    --budget seconds by their measured (else typical) wall time; a _nosync
    configuration after its twin (in this call, or with --warm-cache in an
    earlier one) counts as a warm compile."""
    out = a.out
    conf = read_conf(out) if os.path.isdir(out) else {}
    mode = a.mode or conf.get("mode")
    if mode not in ("gpt2", "llama1b", "multigpu"):
        sys.exit("summarize --plan: --mode gpt2|llama1b|multigpu (or "
                 "OUTDIR/bench.conf)")
    keys = a.programs.replace(",", " ").split()
    if not keys:
        sys.exit("summarize --plan: --programs KEYS (bench/gpu_train.sh "
                 "--list MODE or bench/multi_gpu.sh --list --nproc N prints "
                 "them)")
    runs = find_runs(out) if os.path.isdir(out) else {}
    for k in keys:  # multi_gpu.sh's checkpoint run has no round in its name
        if family_of(k) == "ckpt" and read_rc(out, k) is not None:
            runs[k] = [(1, k)]
    tps = program_tps(out, mode, runs, a, conf) if runs else {}
    # a run the call's deadline skipped is still to do, and one that timed
    # out, once (RETRIED); failed ones count
    done = {k: {r for r, name in runs.get(k, [])
                if read_rc(out, name) not in (None, "skipped")
                and not first_timeout(out, name)}
            for k in keys}
    todo = [k for k in keys if 1 not in done[k]]
    first = 1
    if not todo:  # screening done: the programs of rounds 2 .. reps
        sel = {k for k in keys if family_of(k) == "trainrun"}
        for fam in ("llmc", "torch", "torch1b", "torch8b"):
            c = [(tps[k], k) for k in keys if family_of(k) == fam
                 and tps.get(k)]
            if c:
                top = max(c)[0]
                sel |= {k for t, k in c if t >= top * (1 - a.within / 100)}
        for r in range(2, a.reps + 1):
            todo = [k for k in keys if k in sel and r not in done[k]]
            if todo:
                first = r
                break
    if not todo:
        print(f"# {out}: the protocol is complete ({a.reps} rounds)")
        return 0
    # a configuration and its _nosync twin go together: the twin compiles
    # the same graph, warm from the caches of the first (or, with
    # --warm-cache, of an earlier call), so it costs a warm compile
    warm_w = min([wall_of(out, mode, j, runs) for j in runs
                  if family_of(j).startswith("torch")] or [0])
    groups = []
    for k in todo:
        twin = k[:-len("_nosync")] if k.endswith("_nosync") else None
        if twin in todo:
            continue  # in its twin's group
        ws = [wall_of(out, mode, k, runs)]
        if twin and a.warm_cache and runs.get(twin) and not runs.get(k):
            ws = [min(ws[0], warm_w)]
        g = [k]
        if k + "_nosync" in todo:
            g.append(k + "_nosync")
            w = wall_of(out, mode, g[1], runs)
            ws.append(w if runs.get(g[1]) else min(w, warm_w))
        groups.append((g, ws))
    # the cheapest groups a program first, so that a call runs the most
    # programs; then the listed order within the call. A group that does
    # not fit is passed over (its first program alone where that fits),
    # except that a whole call's budget (--call-budget) always runs one:
    # a call cannot give a run more
    share, used = [], 0.0
    for g, ws in sorted(groups, key=lambda x: sum(x[1]) / len(x[0])):
        if used + sum(ws) > a.budget:
            if used + ws[0] <= a.budget:
                g, ws = g[:1], ws[:1]
            else:
                continue
        share += g
        used += sum(ws)
    if not share and a.budget >= a.call_budget:
        g, ws = min(groups, key=lambda x: x[1][0])
        share, used = g[:1], ws[0]
    if not share:
        least = min(ws[0] for _, ws in groups)
        print(f"# round {first}: {len(todo)} program(s) left; none fits "
              f"the budget ({a.budget:.0f} s): the cheapest needs ~"
              f"{least:.0f} s")
        return 0
    share = [k for k in todo if k in share]
    # the next rounds too when the whole round's share fits again
    reps = 1
    while (first >= 2 and share == todo and first + reps <= a.reps
           and used * (reps + 1) <= a.budget
           and all(first + reps not in done[k] for k in share)):
        reps += 1
    print(f"# round {first}: {len(todo)} program(s) left, this call "
          f"{len(share)} x {reps} round(s) (~{used * reps:.0f} s of "
          f"{a.budget:.0f})")
    print(f"PROGRAMS=\"{' '.join(share)}\" FIRST_REP={first} REPS={reps}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("gpt2", "llama1b", "multigpu"),
                   default=None, help="default: OUTDIR/bench.conf's")
    p.add_argument("--out", required=True)
    p.add_argument("--skip", type=int, default=None,
                   help="warm-up steps (default: bench.conf's)")
    p.add_argument("--gpu", default="unknown",
                   help="default: versions.txt's first GPU")
    p.add_argument("-B", type=int, default=None)
    p.add_argument("-T", type=int, default=None)
    p.add_argument("--nproc", type=int, default=None, help="multigpu: N")
    p.add_argument("--command", default="", help="multigpu: the command")
    p.add_argument("--plan", action="store_true",
                   help="print the next call's PROGRAMS, FIRST_REP, REPS")
    p.add_argument("--programs", default="", help="plan: every program key")
    p.add_argument("--call-budget", type=float, default=480,
                   help="plan: a whole call's budget; one this large runs "
                   "a program that needs more (a call gives no more)")
    p.add_argument("--budget", type=float, default=480,
                   help="plan: seconds of runs a call may hold (the shards"
                   " and start-up take the rest of gpu_train.sh's 540)")
    p.add_argument("--reps", type=int, default=3, help="plan: rounds")
    p.add_argument("--warm-cache", action="store_true",
                   help="plan: the compile caches of the earlier calls "
                        "come along (a _nosync twin of a run configuration "
                        "counts as a warm compile)")
    p.add_argument("--within", type=float, default=3,
                   help="plan: percent of a peer's fastest kept for rounds"
                   " 2 ..")
    a = p.parse_args()
    if a.plan:
        return plan_main(a)
    if a.mode == "multigpu":
        return multigpu_main(a)
    return one_gpu_main(a)


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
    """The sub-runs of every call's OUTDIR/runs-CALL_ID.tsv, in the order
    they ran."""
    keys = ("name", "kind", "program", "model", "n", "rep", "shard", "B",
            "T", "steps", "skip")
    runs = []
    for line in read_calls(out, "runs", ".tsv")[1].splitlines():
        cols = line.split("\t")
        if len(cols) < len(keys):
            continue
        r = dict(zip(keys, cols))
        for k in ("n", "rep", "shard", "B", "T", "steps", "skip"):
            r[k] = int(r[k])
        for kv in cols[len(keys):]:
            k, _, v = kv.partition("=")
            r[k] = v
        r["key"] = re.sub(r"_r\d+$", "", r["name"])
        m = re.search(r"_r(\d+)$", r["name"])
        r["round"] = int(m.group(1)) if m else None
        runs.append(r)
    last = {}  # a name run again (a later call): its last line
    for r in runs:
        last[r["name"]] = r
    return [r for r in runs if last[r["name"]] is r]


def mg_programs(runs):
    """The speed programs (every kind but ckpt), in the order they first
    ran: {key, the first run's shape, runs, tps_gpu (median over the runs
    with figures), tps_min, tps_max, mfu, own_mfu, peak_mem_gib}."""
    progs = {}
    for r in runs:
        if r["kind"] == "ckpt":
            continue
        p = progs.setdefault(r["key"], dict(
            {k: r[k] for k in ("kind", "program", "model", "n", "rep",
                               "shard", "B", "T")}, key=r["key"], runs=[]))
        p["runs"].append(r)
    for p in progs.values():
        ok = [r for r in p["runs"] if r.get("tps_gpu")]
        p["ok"] = len(ok)
        if not ok:
            continue
        vals = [r["tps_gpu"] for r in ok]
        p["tps_gpu"] = benchlib.median(vals)
        p["tps_min"], p["tps_max"] = min(vals), max(vals)
        p["tps_all"] = p["tps_gpu"] * p["n"]
        p["step_ms"] = p["B"] * p["T"] / p["tps_gpu"] * 1e3
        f = [r["mfu"] for r in ok if r.get("mfu") is not None]
        if f:
            p["mfu"] = p["tps_gpu"] * f[0] / ok[0]["tps_gpu"]
        own = [r["own_mfu"] for r in ok if r.get("own_mfu") is not None]
        p["own_mfu"] = benchlib.median(own) if own else None
        mem = [r["peak_mem_gib"] for r in ok if r.get("peak_mem_gib")]
        p["peak_mem_gib"] = max(mem) if mem else None
        plan = [r["plan_gib"] for r in ok if r.get("plan_gib")]
        p["plan_gib"] = plan[0] if plan else None
    return list(progs.values())


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


def mg_figures(out, r, peak):
    """Fill r with the sub-run's figures and status."""
    name = r["name"]
    r["rc"] = read_rc(out, name)
    r["wall_s"] = run_wall(out, name)
    r["log"] = name + ".log"
    summary = {}
    if r["kind"] == "torch":
        rows, summary, _, _ = torch_steps(out, name)
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
    vfiles, versions = read_calls(out, "versions", ".txt")
    gpus = gpu_names(versions)
    if a.gpu in ("", "unknown"):
        a.gpu = gpus[0] if gpus else "unknown"
    peak = benchlib.peak_bf16(a.gpu)
    for r in runs:
        try:
            mg_figures(out, r, peak)
        except Exception as e:  # one odd log must not lose the table
            r["status"] = f"summary error: {e!r}"
    N = a.nproc or max([r["n"] for r in runs] or [0])
    efiles = read_calls(out, "env", ".txt")[0]
    env = read_text(out, efiles[-1]).strip() if efiles else ""
    date = next((ln.split()[2] for ln in versions.splitlines()
                 if ln.startswith("== call")),
                env.splitlines()[0] if env else "unknown")
    L = [f"# trainrun multi-GPU runs: {N} x {a.gpu} ({date[:10]})", "",
         f"- date: {date}",
         f"- command: `{a.command}`" if a.command else
         "- calls: " + ("; ".join(call_lines(versions)) or "unknown"),
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
         "- raw files (NAME = KEY_rROUND): NAME.log, NAME.rc, "
         "NAME.metrics.jsonl (trainrun's per-step metrics, rank 0), "
         "NAME.jsonl (a PyTorch peer's per-step JSON lines), NAME.plan.txt "
         "in this folder"]
    if len(gpus) > 1:
        L.append(f"- **the calls ran on different GPUs ({', '.join(gpus)}): "
                 "compare only figures of the same GPU**")
    if a.gpu.lower() == "cpu":
        L.append("- CPU smoke test (bench/multi_gpu.sh --cpu-smoke): debug "
                 "models of different sizes on CPU ranks; the figures test "
                 "the script and this table, not the programs' speed")
    progs = mg_programs(runs)
    L += ["- protocol: each program runs in rounds (odd rounds in the "
          "listed order, even ones reversed, bench/benchlib.sh); a run's "
          "figure is its median, a program's the median over its runs "
          "[min-max]; failed runs have no figure and the fastest PyTorch "
          "configuration is taken among those that worked",
          "- precision: trainrun " + PRECISION["trainrun"] + "; PyTorch "
          + PRECISION["fsdp2"],
          "- versions of every call: "
          + (", ".join(f"[{f}]({f})" for f in vfiles) or "none")]
    L += ["",
          "## Throughput", "",
          "| program | what | model | GPUs | layout | B x T | tok/s/GPU, "
          "median [min-max] | tok/s all | step ms | MFU | own MFU | peak mem "
          "GiB | plan GiB | runs ok | raw files |",
          "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
          "---|"]
    for p in progs:
        if p["kind"] == "torch":
            layout = f"FSDP2 {p['n']}"
        elif p["shard"] == 1:
            layout = f"DDP {p['rep']}"
        elif p["rep"] == 1:
            layout = f"FSDP {p['shard']}"
        else:
            layout = f"HSDP {p['rep']}x{p['shard']}"
        vals = [r["tps_gpu"] for r in p["runs"] if r.get("tps_gpu")]
        files = []
        for r in p["runs"]:
            raw = (r["name"] + ".jsonl" if r["kind"] == "torch"
                   else r["name"] + ".metrics.jsonl")
            if not os.path.exists(os.path.join(out, raw)):
                raw = r["log"]
            st = "" if r.get("tps_gpu") else f" {r['status']}"
            files.append(f"[{r.get('round') or r['name']}]({raw}){st}")
        L.append(f"| `{p['key']}` | {p['program']} | "
                 f"{MODELS.get(p['model'], (p['model'],))[0]} | {p['n']} | "
                 f"{layout} | {p['B']} x {p['T']} | "
                 f"{spread(vals) if vals else 'failed'} | "
                 f"{fmt(p.get('tps_all'), ',.0f')} | "
                 f"{fmt(p.get('step_ms'), '.1f')} | {mg_pct(p.get('mfu'))} | "
                 f"{mg_pct(p.get('own_mfu'))} | "
                 f"{fmt(p.get('peak_mem_gib'), '.1f')} | "
                 f"{fmt(p.get('plan_gib'), '.1f')} | "
                 f"{p['ok']}/{len(p['runs'])} | {', '.join(files)} |")
    L.append("")

    # scaling
    L += ["## Scaling", "",
          "Efficiency: tokens/s per GPU on n GPUs over tokens/s per GPU on "
          "the baseline (1 GPU for GPT-2 DDP; Llama 3 8B does not fit one "
          "GPU, so its baseline is FSDP over the fewest GPUs it ran on, 2); "
          "program medians.",
          "", "| job | GPUs | tok/s/GPU | efficiency | baseline |",
          "|---|---:|---:|---:|---|"]
    scaling = {}
    for job, pick in (("GPT-2 124M DDP",
                       lambda p: p["kind"] == "trainrun"
                       and p["model"].endswith("gpt2_124m")),
                      ("Llama 3 8B FSDP",
                       lambda p: p["kind"] == "trainrun"
                       and p["model"].endswith("llama3_8b") and p["rep"] == 1)):
        ps = sorted([p for p in progs if pick(p) and p.get("tps_gpu")],
                    key=lambda p: p["n"])
        if not ps:
            L.append(f"| {job} | - | - | - | no run with figures |")
            continue
        base = ps[0]
        for p in ps:
            eff = p["tps_gpu"] / base["tps_gpu"]
            scaling.setdefault(job, {})[p["n"]] = eff
            L.append(f"| {job} | {p['n']} | {spread([r['tps_gpu'] for r in p['runs'] if r.get('tps_gpu')])} | "
                     f"{100 * eff:.1f}% | `{base['key']}` |")
    L.append("")

    # ratios: trainrun FSDP against the fastest PyTorch FSDP2 configuration
    L += ["## Ratios", ""]
    ratios = {}
    g = scaling.get("GPT-2 124M DDP", {})
    gn = next((p for p in progs if p["kind"] == "trainrun"
               and p["model"].endswith("gpt2_124m") and p["n"] == N
               and p.get("tps_gpu")), None)
    if gn and 1 in g and N in g:
        ratios["gpt2_ddp_scaling"] = g[N]
        L.append(f"- **GPT-2 124M DDP over {N}: {gn['tps_gpu']:,.0f} "
                 f"tokens/s per GPU, MFU {mg_pct(gn.get('mfu'))}, "
                 f"{100 * g[N]:.1f}% of 1 GPU per GPU** (target 97%: "
                 + ("met" if g[N] >= 0.97 else "NOT met") + ")")
    for model, target in (("llama3_1b", 1.15), ("llama3_8b", None)):
        fs = next((p for p in progs if p["kind"] == "trainrun"
                   and p["model"].endswith(model) and p["rep"] == 1
                   and p["n"] == N and p.get("tps_gpu")), None)
        tcs = [p for p in progs if p["kind"] == "torch"
               and p["model"].endswith(model) and p["n"] == N]
        name = MODELS[model][0]
        if not tcs and not fs:
            continue
        tc = max([p for p in tcs if p.get("tps_gpu")],
                 key=lambda p: p["tps_gpu"], default=None)
        if fs and tc:
            v = fs["tps_gpu"] / tc["tps_gpu"]
            ratios[f"{model}_fsdp_over_torch_fsdp2"] = {"ratio": v,
                                                         "against": tc["key"]}
            L.append(f"- **trainrun FSDP / fastest PyTorch FSDP2 "
                     f"(`{tc['key']}`: {tc['program']}), {name} on {N} "
                     f"GPUs, tokens/s per GPU: {v:.2f}x** (run pairs "
                     f"{fs['tps_min'] / tc['tps_max']:.2f}x-"
                     f"{fs['tps_max'] / tc['tps_min']:.2f}x)"
                     + (f"; target {target}x: "
                        + ("met" if v >= target else "NOT met")
                        if target else ""))
        else:
            L.append(f"- trainrun FSDP / PyTorch FSDP2, {name}: n/a (no "
                     "run with figures on one side)")
    hs = next((p for p in progs if p["model"].endswith("llama3_8b")
               and p["kind"] == "trainrun" and p["rep"] > 1
               and p["shard"] > 1), None)
    hf = next((p for p in progs if hs and p["kind"] == "trainrun"
               and p["model"] == hs["model"] and p["rep"] == 1
               and p["n"] == hs["n"]), None)
    if hs and hf and hs.get("tps_gpu") and hf.get("tps_gpu"):
        ratios["hsdp_over_fsdp"] = hs["tps_gpu"] / hf["tps_gpu"]
        L.append(f"- HSDP {hs['rep']}x{hs['shard']} / FSDP {hf['n']}, "
                 f"tokens/s per GPU: {ratios['hsdp_over_fsdp']:.2f}x")
    elif hs:
        L.append(f"- HSDP {hs['rep']}x{hs['shard']} / FSDP {hs['n']}: n/a "
                 f"(no FSDP run on {hs['n']} ranks with figures)")
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
        w, rc = run_wall(out, nm), read_rc(out, nm)
        if w is not None or rc is not None:
            L.append(f"| {nm} | {fmt(w, 'd')} | {rc} |")
    L += [""] + retried_note(out)
    L += ["## Environment", "", "```", env, "```", ""]
    text = "\n".join(L)
    sys.stdout.write(text)
    for fn in ("summary.md", "README.md"):
        with open(os.path.join(out, fn), "w") as f:
            f.write(text)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"gpu": a.gpu, "nproc": N, "command": a.command,
                   "date": date, "peak": peak, "runs": runs,
                   "programs": [{k: v for k, v in p.items() if k != "runs"}
                                for p in progs],
                   "scaling": scaling, "ratios": ratios, "ckpt": ckres},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
