#!/usr/bin/env python3
"""bench/gpu/ckpt_stall.py: the true cost of each checkpoint save of a
trainrun run, from its console log and metrics.jsonl (bench/async_ckpt.sh).

  ckpt_stall.py --label NAME --log RUN.log --metrics RUN.metrics.jsonl
                [--json OUT.json]

Wall-clock stall of the save at step S, read off the step records'
elapsed_s alone (the same for any build, so two builds compare fairly):
the wall time from step S's record to step S+3's (the save itself, which
runs after step S's record, and the three steps after it: on a GPU the
update of step S+1, which may wait for the copies, ends inside step S+2's
time) less three times the median step of steps 5 to the first save (no
save in flight). Also: the step after the save alone (what issue 22
quoted), the median step while the save was being written (its commit
line tells when it ended), and, for builds that print it, the stall the
trainer itself reports ("training stalled X s (steps ..."), the time the
save call held the trainer, the device-to-host copy rate and the write.

Per GB: per GB that rank 0 wrote (a rank's share of the checkpoint).
Prints one markdown row per save; --json writes the figures.
"""
import argparse
import json
import re
import statistics
import sys


def load_steps(path):
    steps = {}
    saves = {}
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "checkpoint_stall_s" in r:
                saves[r["step"]] = r
            elif "elapsed_s" in r:
                steps[r["step"]] = r["elapsed_s"]
    return steps, saves


RX = {
    "started": re.compile(r"checkpoint step (\d+)(?: \(model only\))?: "
                          r"(?:save started in|saved in|training stalled) "
                          r"([0-9.]+) s(, writing in the background)?$"),
    "stalled": re.compile(r"checkpoint step (\d+): training stalled ([0-9.]+) s"
                          r" \((?:steps?) [0-9-]+ took"),
    "complete": re.compile(r"checkpoint step (\d+) complete: ([0-9.]+) MB "
                           r"written by rank 0 in ([0-9.]+) s"
                           r"(?: \(([0-9.]+) MB copied from the device in "
                           r"([0-9.]+) s, ([0-9.]+) GB/s\))?"),
    "step": re.compile(r"^step (\d+)/"),
    "ready": re.compile(r"checkpoint: ([0-9.]+) GB of staging buffers "
                        r"\((\S+)\) ready in ([0-9.]+) s"),
}


def parse_log(path):
    """Per save step: held (the save call), stall (trainer's), complete
    (MB, write s, copy GB/s) and the last step logged before the commit."""
    out = {}
    ready = None
    last_step = 0
    with open(path, errors="replace") as f:
        for raw in f:
            line = re.sub(r"^(\S+ )?\[rank\d+\]:", "", raw.rstrip("\n"))
            m = RX["step"].match(line)
            if m:
                last_step = int(m.group(1))
                continue
            m = RX["ready"].search(line)
            if m:
                ready = {"gb": float(m.group(1)), "mode": m.group(2),
                         "s": float(m.group(3))}
                continue
            m = RX["stalled"].search(line)
            if m:
                out.setdefault(int(m.group(1)), {})["stall"] = float(m.group(2))
                continue
            m = RX["started"].search(line)
            if m:
                out.setdefault(int(m.group(1)), {})["held"] = float(m.group(2))
                continue
            m = RX["complete"].search(line)
            if m:
                s = out.setdefault(int(m.group(1)), {})
                s["mb"] = float(m.group(2))
                s["write_s"] = float(m.group(3))
                s["done_after_step"] = last_step
                if m.group(6):
                    s["copy_gbs"] = float(m.group(6))
    return out, ready


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--metrics", required=True)
    p.add_argument("--json")
    a = p.parse_args()
    steps, recs = load_steps(a.metrics)
    info, ready = parse_log(a.log)
    saves = sorted(s for s in info if s in steps and s + 3 in steps)
    if not saves:
        print(f"| {a.label} | no save with 3 steps after it |")
        return 1
    dt = {k: steps[k] - steps[k - 1] for k in steps if k - 1 in steps}
    base = [dt[k] for k in range(5, saves[0] + 1) if k in dt]
    med = statistics.median(base)
    rows = []
    for n, s in enumerate(saves, 1):
        i = info[s]
        wall = steps[s + 3] - steps[s] - 3 * med
        gb = i.get("mb", 0) / 1e3  # what rank 0 wrote: a rank's share
        end = i.get("done_after_step", s + 3)
        during = [dt[k] for k in range(s + 4, end + 1) if k in dt]
        r = {"save": n, "step": s, "base_step_s": med,
             "wall_stall_s": wall,
             "gb_rank0": gb,
             "wall_stall_s_per_gb": wall / gb if gb else None,
             "step_after_s": dt.get(s + 1),
             "steps_during_write_median_s":
                 statistics.median(during) if during else None,
             "reported_stall_s": i.get("stall"),
             "held_s": i.get("held"), "write_s": i.get("write_s"),
             "mb_rank0": i.get("mb"), "copy_gbs": i.get("copy_gbs"),
             "jsonl_stall_s": recs.get(s, {}).get("checkpoint_stall_s")}
        rows.append(r)

    def f(v, fmt=".3f"):
        return "—" if v is None else format(v, fmt)

    for r in rows:
        print(f"| {a.label} | {r['save']} (step {r['step']}) | "
              f"{f(r['wall_stall_s'])} | {f(r['wall_stall_s_per_gb'], '.4f')} | "
              f"{f(r['reported_stall_s'])} | {f(r['step_after_s'])} | "
              f"{f(r['steps_during_write_median_s'])} | {f(r['base_step_s'])} | "
              f"{f(r['held_s'])} | {f(r['copy_gbs'], '.1f')} | "
              f"{f(r['write_s'], '.1f')} |")
    if a.json:
        with open(a.json, "w") as fo:
            json.dump({"label": a.label, "staging": ready, "saves": rows},
                      fo, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
