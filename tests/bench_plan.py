#!/usr/bin/env python3
"""tests/bench_plan.py: bench/gpu/summarize.py --plan, the order in which
issue 22's protocol runs its programs over calls (docs/PERFORMANCE.md), on
output folders made here: run files as bench/gpu_train.sh and
bench/multi_gpu.sh write them (NAME.rc, NAME.wall, trainrun's
NAME.metrics.jsonl, a PyTorch peer's NAME.jsonl, llm.c's NAME.log).

  tests/bench_plan.py TOP_SRCDIR

Checks: a screening round first, packed into the budget; a configuration
and its _nosync twin in one call; a run the deadline cut (rc "skipped") is
still to do (needing 1.25 times what it ran when the deadline cut it), a
failed one is not, a timed-out one once more; nothing when nothing fits a
call's last seconds, the cheapest in a whole call; rounds 2-3 take trainrun, each peer's
fastest configuration and those within 3% of it, nothing else; "complete"
after 3 rounds; bench/multi_gpu.sh's keys: the checkpoint run once, in
round 1, and PyTorch FSDP2's fastest per model. Exit 0 / 1.
"""
import os
import re
import subprocess
import sys
import tempfile

TOP = sys.argv[1] if len(sys.argv) > 1 else "."
SUMMARIZE = os.path.join(TOP, "bench", "gpu", "summarize.py")
GPT2_KEYS = ("trainrun llmc llmc_r0_ge1 llmc_r0_ge2 torch_eager torch_compile "
             "torch_compile_nosync torch_autotune torch_autotune_nosync")
failures = []
LAST = [""]  # the last plan's output


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def one_gpu_run(out, key, rnd, tps=None, rc="0", wall=30):
    """A run of bench/gpu_train.sh's KEY in round RND: 20 steps at tps."""
    name = f"{key}_r{rnd}"
    write(os.path.join(out, name + ".rc"), rc + "\n")
    write(os.path.join(out, name + ".wall"), f"{wall}\n")
    if tps is None:
        return
    if key == "trainrun":
        write(os.path.join(out, name + ".metrics.jsonl"), "".join(
            f'{{"step":{s},"tps":{tps}}}\n' for s in range(1, 21)))
    elif key.startswith("llmc"):
        ms = 64 * 1024 / tps * 1e3
        write(os.path.join(out, name + ".log"), "".join(
            f"step {s:4d}/20 | loss 5.0 | norm 1.0 | lr 6e-4 | {ms:.2f} ms | "
            f"40.0% bf16 MFU | {tps:.0f} tok/s\n" for s in range(1, 21)))
    else:
        write(os.path.join(out, name + ".jsonl"), '{"program": "x"}\n' + "".join(
            f'{{"step":{s},"tps":{tps}}}\n' for s in range(1, 21)))


def plan(out, mode, keys, *extra):
    """The plan's (FIRST_REP, REPS, [programs], its estimate in s), or None
    when complete."""
    r = subprocess.run([sys.executable, SUMMARIZE, "--plan", "--mode", mode,
                        "--out", out, "--programs", keys, "--skip", "3",
                        *extra], capture_output=True, text=True)
    LAST[0] = r.stdout + r.stderr
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        return "error"
    if "the protocol is complete" in r.stdout:
        return None
    m = re.search(r'^PROGRAMS="([^"]*)" FIRST_REP=(\d+) REPS=(\d+)$',
                  r.stdout, re.M)
    est = re.search(r"\(~(\d+) s of", r.stdout)
    if not m or not est:
        print(r.stdout + r.stderr)
        return "error"
    return (int(m.group(2)), int(m.group(3)), m.group(1).split(),
            int(est.group(1)))


def gpt2_cases(tmp):
    out = os.path.join(tmp, "gpt2")
    os.makedirs(out)
    p = plan(out, "gpt2", GPT2_KEYS)
    check(p != "error" and p[0] == 1 and p[2][0] == "trainrun",
          f"screening first, trainrun first: {p}")
    # the screening round but the autotune pair; eager failed, compile
    # nosync cut by the deadline
    figs = {"trainrun": 550, "llmc": 450, "llmc_r0_ge1": 445,
            "llmc_r0_ge2": 465, "torch_compile": 443}
    for k, t in figs.items():
        one_gpu_run(out, k, 1, t * 1000)
    one_gpu_run(out, "torch_eager", 1, rc="1")
    one_gpu_run(out, "torch_compile_nosync", 1, rc="skipped", wall=0)
    p = plan(out, "gpt2", GPT2_KEYS, "--budget", "480")
    check(p != "error" and p[0] == 1 and "torch_compile_nosync" in p[2]
          and "torch_eager" not in p[2],
          f"a skipped run is still to do, a failed one is not: {p}")
    # the table says so too: a run the deadline cut is no failure
    r = subprocess.run([sys.executable, SUMMARIZE, "--mode", "gpt2", "--out",
                        out, "--skip", "3"], capture_output=True, text=True)
    rows = {}
    try:
        with open(os.path.join(out, "README.md")) as f:
            for line in f:
                m = re.match(r"\| [^|]+ \| `(\w+)`: [^|]+ \| ([^|]+) \|", line)
                if m:
                    rows[m.group(1)] = m.group(2).strip()
    except OSError:
        pass
    check(r.returncode == 0
          and rows.get("torch_compile_nosync", "").startswith("still to run")
          and rows.get("torch_eager") == "failed",
          f"the table: a cut run still to run, a failed one failed: "
          f"{rows.get('torch_compile_nosync')} / {rows.get('torch_eager')} "
          f"{r.stderr[-300:]}")
    check(p != "error" and "torch_autotune" in p[2]
          and "torch_autotune_nosync" in p[2],
          f"a configuration with its _nosync twin: {p}")
    # a run that timed out is to do once more; after its retry (the first
    # attempt in timed-out/) a second timeout counts as done
    one_gpu_run(out, "llmc", 1, rc="124", wall=150)
    p = plan(out, "gpt2", GPT2_KEYS, "--budget", "480")
    check(p != "error" and p[0] == 1 and "llmc" in p[2],
          f"a timed-out run runs once more: {p}")
    os.makedirs(os.path.join(out, "timed-out"))
    write(os.path.join(out, "timed-out", "llmc_r1.rc"), "124\n")
    p = plan(out, "gpt2", GPT2_KEYS, "--budget", "480")
    check(p != "error" and "llmc" not in p[2],
          f"a run that timed out twice is done (failed): {p}")
    one_gpu_run(out, "llmc", 1, 450000)
    p = plan(out, "gpt2", GPT2_KEYS, "--budget", "200")
    check(p != "error" and p[2] == ["torch_compile_nosync"],
          f"within a 200 s budget only what fits (autotune: 420 s): {p}")
    check(p != "error" and p[3] == 30,
          f"a skipped run's wall (0) is not its cost: its class's (30 s): {p}")
    # what is left does not fit a call's last 100 s: nothing runs (the
    # autotune pair needs 420 s); a whole call's budget runs the cheapest
    one_gpu_run(out, "torch_compile_nosync", 1, rc="skipped", wall=0)
    write(os.path.join(out, "torch_compile_nosync_r1.cut"), "200\n")
    p = plan(out, "gpt2", GPT2_KEYS, "--budget", "200")
    check(p == "error" and "none fits the budget (200 s)" in LAST[0]
          and "~250 s" in LAST[0],
          f"a run cut after 200 s needs 250; nothing fits 200 s: {LAST[0]}")
    p = plan(out, "gpt2", GPT2_KEYS, "--budget", "200", "--call-budget",
             "200")
    check(p != "error" and p[2] == ["torch_compile_nosync"] and p[3] == 250,
          f"a whole call runs the cheapest (the cut run, 250 s), alone: {p}")
    os.remove(os.path.join(out, "torch_compile_nosync_r1.cut"))
    # screening done: rounds 2-3 of trainrun, llm.c's fastest and those
    # within 3% (llmc at 450 is 3.2% below 465: out), PyTorch's fastest
    # (compile_nosync 470) and within 3% (autotune 460; compile 443 out)
    one_gpu_run(out, "torch_compile_nosync", 1, 470000)
    one_gpu_run(out, "torch_autotune", 1, 460000, wall=300)
    one_gpu_run(out, "torch_autotune_nosync", 1, 420000, wall=60)
    want = ["trainrun", "llmc_r0_ge2", "torch_compile_nosync",
            "torch_autotune"]
    p = plan(out, "gpt2", GPT2_KEYS, "--budget", "2000")
    check(p != "error" and p[0] == 2 and sorted(p[2]) == sorted(want)
          and p[1] == 2,
          f"rounds 2-3: trainrun, the fastest and within 3% ({want}): {p}")
    for r in (2, 3):
        for k in want:
            one_gpu_run(out, k, r, 500000)
    p = plan(out, "gpt2", GPT2_KEYS)
    check(p is None, f"complete after 3 rounds: {p}")


def multigpu_cases(tmp):
    out = os.path.join(tmp, "mg")
    os.makedirs(out)
    keys = ("gpt2_ddp_n2 llama1b_fsdp_n2 torch_fsdp2_1b_n2_compile "
            "torch_fsdp2_1b_n2_compile_nosync ckpt_kill_n2 gpt2_ddp_n1")
    p = plan(out, "multigpu", keys, "--budget", "2000")
    check(p != "error" and p[0] == 1 and "ckpt_kill_n2" in p[2],
          f"multigpu: the checkpoint run in round 1: {p}")
    for k in keys.split():
        name = k if k.startswith("ckpt") else k + "_r1"
        write(os.path.join(out, name + ".rc"), "0\n")
        write(os.path.join(out, name + ".wall"), "40\n")
    p = plan(out, "multigpu", keys, "--budget", "2000")
    # no figures for the PyTorch runs here: none is the fastest
    check(p != "error" and p[0] == 2 and "ckpt_kill_n2" not in p[2]
          and sorted(p[2]) == ["gpt2_ddp_n1", "gpt2_ddp_n2",
                               "llama1b_fsdp_n2"],
          f"multigpu rounds 2-3: trainrun's jobs, no checkpoint run: {p}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        gpt2_cases(tmp)
        multigpu_cases(tmp)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
