#!/usr/bin/env python3
"""tests/fr/make_dumps.py: write flight-recorder dumps in PyTorch's layout
for the analyzer's tests (tests/check_fr_analyze.c).

    make_dumps.py OUTDIR SCENARIO [--format pickle|json|both]
                  [--version 2.10] [--protocol 2] [--prefix nccl_trace_rank_]
                  [--ranks 4] [--steps 6]

Each rank runs a small program of collectives; a simulator decides what
completes (a collective completes when every member entered it with the same
op, sizes and dtypes; a rank blocks in the first one that does not), and the
dumps hold what PyTorch's FlightRecorder would have recorded: the dict of
FlightRecorderDetail.hpp's getCollectiveTrace/dump_dict (pickle) or
dump_json (JSON: time_discovered_* 0 for none, pg_status values as strings,
process_group as a list). Version "2.3" drops pg_status, timeout_ms, is_p2p
and the thread fields (the oldest field set the analyzer must cope with;
torchfrtrace 2.15 itself needs is_p2p); "2.4" drops the thread fields and
comm_lib_version (FlightRecorder.hpp at "2.4" has pg_status, timeout_ms and
is_p2p); "2.7" names comm_lib_version nccl_version.

Scenarios (ranks 0..N-1, default_pg "0" plus "1" = "tp" on ranks 0,1):
  ok              every collective completes
  skip_collective rank 2 skips the last all_reduce: the others wait in it
  mismatch_size   rank 1 calls all_reduce #4 with twice the elements
  mismatch_dtype  rank 3 calls all_reduce #4 with BFloat16
  mismatch_type   rank 1 calls all_gather where the others all_reduce (#4)
  hang            rank 3 is stuck in all_reduce #4 (started) after the others
                  completed it; they wait in #5
  kill            rank 1 leaves no dump; the others wait in all_reduce #5
  stops_early     rank 1's dump ends after #4 (it died); others wait in #5
  send_no_recv    rank 0 sends to rank 1, which never posts the recv
  c10_lists       like ok, with sizes written as torch.jit._pickle
                  build_intlist (as c10's pickler writes typed lists)
  frames          like hang, with stack frames shared between entries
  shift           all_reduces alternate 1024 and 512 elements; rank 2 skips
                  the first, so every later one mismatches (NCCL ran them
                  anyway): for --mismatch-cap
  coalesced       all_reduce #3 is a coalesced group of two all_reduces;
                  rank 1's group has three
"""
import argparse
import json
import os
import pickle
import sys
import types

BASE_NS = 1795262400 * 10**9  # 2026-11-21 12:00:00 UTC
STEP_NS = 10**9


def install_fake_torch_pickle():
    """A module named torch.jit._pickle so that pickle writes GLOBAL
    'torch.jit._pickle build_intlist' + REDUCE, like c10's pickler."""
    torch = types.ModuleType("torch")
    jit = types.ModuleType("torch.jit")
    p = types.ModuleType("torch.jit._pickle")

    def build_intlist(x):
        return list(x)

    build_intlist.__module__ = "torch.jit._pickle"
    build_intlist.__qualname__ = "build_intlist"
    p.build_intlist = build_intlist
    torch.jit = jit
    jit._pickle = p
    sys.modules.setdefault("torch", torch)
    sys.modules.setdefault("torch.jit", jit)
    sys.modules.setdefault("torch.jit._pickle", p)
    return build_intlist


class IntList(list):
    """Pickles as build_intlist([...])."""

    def __reduce__(self):
        return (sys.modules["torch.jit._pickle"].build_intlist, (list(self),))


def op(pg, typ, numel=1024, dtype="Float", peer=None):
    return {"pg": pg, "type": typ, "numel": numel, "dtype": dtype,
            "peer": peer}


def programs(scenario, n, steps):
    """The ops each rank runs: {rank: [op, ...]} and per-rank tweaks."""
    progs = {}
    for r in range(n):
        p = []
        for s in range(steps):
            p.append(op("0", "all_reduce"))
            if r in (0, 1) and s == 1:
                p.append(op("1", "all_gather", numel=256))
        progs[r] = p
    stuck = {}  # rank -> index of the op it never completes
    if scenario == "skip_collective":
        progs[2] = progs[2][:-1]
    elif scenario == "mismatch_size":
        idx = [i for i, o in enumerate(progs[1]) if o["pg"] == "0"][3]
        progs[1][idx] = op("0", "all_reduce", numel=2048)
    elif scenario == "mismatch_dtype":
        idx = [i for i, o in enumerate(progs[3]) if o["pg"] == "0"][3]
        progs[3][idx] = op("0", "all_reduce", dtype="BFloat16")
    elif scenario == "mismatch_type":
        idx = [i for i, o in enumerate(progs[1]) if o["pg"] == "0"][3]
        progs[1][idx] = op("0", "all_gather", numel=1024)
    elif scenario in ("hang", "frames"):
        stuck[3] = [i for i, o in enumerate(progs[3]) if o["pg"] == "0"][3]
    elif scenario == "shift":
        for r in progs:
            progs[r] = [op("0", "all_reduce", numel=1024 if i % 2 == 0 else 512)
                        for i in range(steps)]
        progs[2] = progs[2][1:]
    elif scenario == "send_no_recv":
        progs[0].append(op("0", "send", numel=16, peer=1))
        progs[0].append(op("0", "all_reduce"))
        # rank 1 never posts the recv: it went on to a barrier-like op
    return progs, stuck


def simulate(progs, pg_ranks, stuck):
    """Entries per rank: list of dicts with state decided by matching."""
    n = len(progs)
    seq = {r: {} for r in progs}
    p2p = {r: {} for r in progs}
    # per rank: list of (op, coll_seq, p2p_seq)
    planned = {r: [] for r in progs}
    for r, prog in progs.items():
        for o in prog:
            if o["type"] in ("send", "recv"):
                p2p[r][o["pg"]] = p2p[r].get(o["pg"], 0) + 1
                planned[r].append((o, seq[r].get(o["pg"], 0), p2p[r][o["pg"]]))
            else:
                seq[r][o["pg"]] = seq[r].get(o["pg"], 0) + 1
                planned[r].append((o, seq[r][o["pg"]], p2p[r].get(o["pg"], 0)))
    # what each rank did at (pg, seq)
    at = {}
    for r in planned:
        for i, (o, s, _) in enumerate(planned[r]):
            if o["type"] not in ("send", "recv"):
                at[(r, o["pg"], s)] = (i, o)
    entries = {r: [] for r in progs}
    blocked = {}
    for r in planned:
        for i, (o, s, ps) in enumerate(planned[r]):
            state = "completed"
            if o["type"] in ("send", "recv"):
                state = "started"  # no partner in these scenarios
            else:
                members = pg_ranks[o["pg"]]
                for m in members:
                    other = at.get((m, o["pg"], s))
                    if other is None:
                        state = "started"
                        continue
                    oi, oo = other
                    if (oo["type"], oo["numel"], oo["dtype"]) != (
                            o["type"], o["numel"], o["dtype"]):
                        state = "started"
                    if m in stuck and oi > stuck[m]:
                        state = "started"
                    # a partner blocked earlier never gets here
                    if m in blocked and blocked[m] < oi:
                        state = "started"
                if r in stuck and i == stuck[r]:
                    state = "started"
            entries[r].append((o, s, ps, state, i))
            if state != "completed":
                blocked[r] = i
                break
    # the ranks that blocked earlier make later collectives of the others
    # wait too: recompute until stable
    changed = True
    while changed:
        changed = False
        for r in entries:
            out = []
            for (o, s, ps, state, i) in entries[r]:
                if state == "completed" and o["type"] not in ("send", "recv"):
                    for m in pg_ranks[o["pg"]]:
                        other = at.get((m, o["pg"], s))
                        if other is None or (m in blocked and
                                             other[0] > blocked[m]):
                            state = "started"
                            changed = True
                out.append((o, s, ps, state, i))
                if state != "completed":
                    blocked[r] = min(blocked.get(r, i), i)
                    break
            entries[r] = out
    return entries


def sizes_of(o, pg_size, make_list):
    if o["type"] == "all_gather":
        return ([make_list([o["numel"]])],
                [make_list([o["numel"] * pg_size])])
    return [make_list([o["numel"]])], [make_list([o["numel"]])]


def build_dump(r, ents, pg_ranks, pg_desc, version, as_json, c10_lists,
               frames_on):
    major, minor = (int(x) for x in version.split("."))
    v = (major, minor)
    make_list = IntList if c10_lists else list
    frame_pool = [
        {"name": "all_reduce", "filename": "torch/distributed/c10d.py",
         "line": 2696},
        {"name": "train_step", "filename": "/job/train.py", "line": 42 + r},
    ]
    out = []
    last = {}
    for rec, (o, s, ps, state, i) in enumerate(ents):
        t = BASE_NS + i * STEP_NS + r * 1000
        ins, outs = sizes_of(o, len(pg_ranks[o["pg"]]), make_list)
        is_p2p = o["type"] in ("send", "recv")
        if o["type"] == "send":
            local = sorted(pg_ranks[o["pg"]])
            name = "nccl:send %d->%d" % (local.index(r), local.index(o["peer"]))
        elif o["type"] == "recv":
            local = sorted(pg_ranks[o["pg"]])
            name = "nccl:recv %d<-%d" % (local.index(r), local.index(o["peer"]))
        else:
            name = "nccl:" + o["type"]
        started = t + 1000000 if state in ("started", "completed") else None
        completed = t + 5000000 if state == "completed" else None
        e = {
            "record_id": rec,
            "pg_id": int(o["pg"]),
            "process_group": (o["pg"], pg_desc[o["pg"]]),
            "collective_seq_id": s,
            "p2p_seq_id": ps,
            "op_id": rec + 1,
            "profiling_name": name,
            "time_created_ns": t,
            "input_sizes": ins,
            "input_dtypes": [o["dtype"]],
            "output_sizes": outs,
            "output_dtypes": [o["dtype"]],
            "state": state,
            "time_discovered_started_ns": started,
            "time_discovered_completed_ns": completed,
            "retired": state == "completed",
        }
        if state == "completed":
            e["duration_ms"] = 4.5
        if v >= (2, 4):
            e["timeout_ms"] = 600000
            e["is_p2p"] = is_p2p
        if v >= (2, 10):
            e["thread_id"] = "140000000000%d" % r
            e["thread_name"] = "pt_main_thread"
        if frames_on and not as_json:
            e["frames"] = [frame_pool[0], frame_pool[1]]  # shared objects
        if as_json:
            e["process_group"] = list(e["process_group"])
            e["time_discovered_started_ns"] = started or 0
            e["time_discovered_completed_ns"] = completed or 0
            e["input_sizes"] = [list(x) for x in ins]
            e["output_sizes"] = [list(x) for x in outs]
        out.append(e)
        if not is_p2p:
            st = last.setdefault(o["pg"], [-1, -1, -1])
            st[0] = s
            if started:
                st[1] = s
            if completed:
                st[2] = s
    d = {"version": version}
    if v >= (2, 10):
        d["comm_lib_version"] = "2.21.5"
    elif v >= (2, 7):
        d["nccl_version"] = "2.21.5"
    d["pg_config"] = {
        pg: {"name": pg, "desc": pg_desc[pg],
             "ranks": str(sorted(pg_ranks[pg]))}
        for pg in sorted(pg_ranks) if r in pg_ranks[pg]
    }
    if v >= (2, 4):
        d["pg_status"] = {
            pg: {"last_enqueued_collective": st[0],
                 "last_started_collective": st[1],
                 "last_completed_collective": st[2]}
            for pg, st in last.items()
        }
        if as_json:
            for st in d["pg_status"].values():
                for k in st:
                    st[k] = str(st[k])
    if out or not as_json:
        d["entries"] = out
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("scenario")
    ap.add_argument("--format", default="pickle",
                    choices=["pickle", "json", "both"])
    ap.add_argument("--version", default="2.10")
    ap.add_argument("--protocol", type=int, default=2)
    ap.add_argument("--prefix", default="nccl_trace_rank_")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    n = a.ranks
    pg_ranks = {"0": list(range(n)), "1": [0, 1]}
    pg_desc = {"0": "default_pg", "1": "tp"}
    progs, stuck = programs(a.scenario, n, a.steps)
    entries = simulate(progs, pg_ranks, stuck)
    if a.scenario in ("stops_early", "kill"):
        # rank 1 died after all_reduce #4: its ring ends there
        ents = entries[1]
        keep = [e for e in ents
                if not (e[0]["pg"] == "0" and e[1] > 4)]
        entries[1] = keep
        for r in entries:
            if r == 1:
                continue
            entries[r] = [(o, s, ps, "started" if (o["pg"] == "0" and s >= 5)
                           else st, i)
                          for (o, s, ps, st, i) in entries[r]
                          if not (o["pg"] == "0" and s > 5)]
    if a.scenario == "shift":
        # NCCL ran the mismatched calls anyway: no simulation
        for r in entries:
            entries[r] = [(o, i + 1, 0, "completed", i)
                          for i, o in enumerate(progs[r])]
            if r != 2:
                o, s, ps, st, i = entries[r][-1]
                entries[r][-1] = (o, s, ps, "started", i)
    if a.scenario == "coalesced":
        for r in entries:
            ar = op("0", "all_reduce")
            e = [(ar, 1, 0, "completed", 0), (ar, 2, 0, "completed", 1)]
            group = [ar, ar, ar] if r == 1 else [ar, ar]
            for k, o in enumerate(group + [op("0", "coalesced")]):
                e.append((o, 3, 0, "started", 2 + k))
            entries[r] = e
    c10 = a.scenario == "c10_lists"
    if c10:
        install_fake_torch_pickle()
    os.makedirs(a.outdir, exist_ok=True)
    for r in range(n):
        if a.scenario == "kill" and r == 1:
            continue
        base = os.path.join(a.outdir, "%s%d" % (a.prefix, r))
        if a.format in ("pickle", "both"):
            d = build_dump(r, entries[r], pg_ranks, pg_desc, a.version, False,
                           c10, a.scenario == "frames")
            with open(base, "wb") as f:
                pickle.dump(d, f, protocol=a.protocol)
        if a.format in ("json", "both"):
            d = build_dump(r, entries[r], pg_ranks, pg_desc, a.version, True,
                           False, False)
            with open(base + ".json", "w") as f:
                json.dump(d, f)


if __name__ == "__main__":
    main()
