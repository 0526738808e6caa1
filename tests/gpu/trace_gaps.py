#!/usr/bin/env python3
"""tests/gpu/trace_gaps.py: where a GPU sits idle during training, from the
timeline tests/gpu/cupti_trace.c writes (the GPU machines have CUPTI but not
Nsight Systems).

  trace_gaps.py --build DIR          build DIR/libcupti_trace.so there
  CUDA_INJECTION64_PATH=DIR/libcupti_trace.so TRACE_DIR=T ./trainrun JOB ...
  trace_gaps.py [--marker RE] [--skip N] [--top N] T/trace-PID.txt

The steps are cut at the last kernel matching --marker (default the AdamW
kernel) of each optimizer update; the first --skip steps (default 2) are left
out. Prints per step: wall time, GPU busy (the union of kernels, copies and
memsets), idle, and the idle split by what the host was doing when the GPU
ran dry: the last synchronous CUDA call that returned inside the gap
(cudaStreamSynchronize, cudaMemcpy, ...), or "host issue" when the host
launched the next operation late without having waited (launch overhead,
host work between launches). Then the largest gaps with the operations
around them.
"""
import argparse
import bisect
import collections
import glob
import os
import re
import subprocess
import sys

SYNC_CALLS = re.compile(r"Synchronize|^cudaMemcpy(_|2D_|ToSymbol_|FromSymbol_)?v|"
                        r"^cudaMemcpy$|^cudaFree|^cudaMalloc_|^cudaMemset_v|"
                        r"^cudaMemset$|^cudaHostAlloc|^cudaEventQuery|"
                        r"^cudaStreamQuery|^cuMemcpy(DtoH|HtoD|DtoD)?(_v2)?$|"
                        r"^cuMemFree|^cuMemAlloc(_v2)?$|^cuEventQuery|"
                        r"^cuStreamQuery")


def build(d):
    """Compile cupti_trace.c against the installed CUPTI, choosing the newest
    record structs its header declares."""
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    incs = [p for p in (cuda + "/extras/CUPTI/include", cuda + "/include",
                        cuda + "/targets/x86_64-linux/include")
            if os.path.exists(p + "/cupti_activity.h")]
    if not incs:
        hits = glob.glob("/usr/**/cupti_activity.h", recursive=True)
        incs = [os.path.dirname(h) for h in hits[:1]]
    if not incs:
        sys.exit("trace_gaps: no cupti_activity.h under %s or /usr" % cuda)
    text = open(incs[0] + "/cupti_activity.h").read()
    for f in glob.glob(incs[0] + "/cupti_activity*.h"):
        text += open(f).read()

    def newest(base):
        ns = [int(n) for n in re.findall(r"\b%s(\d+)\b" % base, text)]
        if not ns:
            sys.exit("trace_gaps: no %sN in the CUPTI headers" % base)
        return "%s%d" % (base, max(ns))

    libs = [p for p in (cuda + "/extras/CUPTI/lib64", cuda + "/lib64",
                        cuda + "/targets/x86_64-linux/lib")
            if glob.glob(p + "/libcupti.so*")]
    if not libs:
        hits = glob.glob("/usr/**/libcupti.so*", recursive=True)
        libs = [os.path.dirname(h) for h in hits[:1]]
    if not libs:
        sys.exit("trace_gaps: no libcupti.so")
    os.makedirs(d, exist_ok=True)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "cupti_trace.c")
    cmd = ["cc", "-O2", "-shared", "-fPIC", "-o", d + "/libcupti_trace.so",
           src, "-I" + incs[0], "-I" + cuda + "/include",
           "-DKREC=" + newest("CUpti_ActivityKernel"),
           "-DMREC=" + newest("CUpti_ActivityMemcpy"),
           "-DSREC=" + newest("CUpti_ActivityMemset"),
           "-L" + libs[0], "-Wl,-rpath," + libs[0], "-lcupti", "-lpthread"]
    print(" ".join(cmd))
    subprocess.check_call(cmd)


def load(path):
    ops, api = [], {}
    calls = []
    with open(path, errors="replace") as f:
        for line in f:
            p = line.rstrip("\n").split(" ", 5)
            if len(p) < 6:
                continue
            t, s, e = p[0], int(p[1]), int(p[2])
            if t in ("K", "M"):
                ops.append((s, e, int(p[4]), p[5]))
            elif t == "A":
                a = (s, e, int(p[4]), p[5].split(" ")[-1])
                api[a[2]] = a
                calls.append(a)
    ops.sort()
    return ops, api, calls


def short(name, n=70):
    name = re.sub(r"\(.*", "", name)
    return name[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--marker", default="adamw_kernel")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--min-gap-us", type=float, default=2.0)
    ap.add_argument("trace", nargs="?")
    a = ap.parse_args()
    if a.build:
        build(a.build)
        return
    if not a.trace:
        ap.error("a trace file")
    ops, api, calls = load(a.trace)
    if not ops:
        sys.exit("%s: no GPU operations" % a.trace)
    marks = [o for o in ops if re.search(a.marker, o[3])]
    ends = []
    for o in marks:  # one boundary per optimizer update (a run of markers)
        if ends and o[0] - ends[-1] < 20e6:
            ends[-1] = o[1]
        else:
            ends.append(o[1])
    if len(ends) < a.skip + 2:
        sys.exit("%s: %d steps found by %r, need %d" %
                 (a.trace, len(ends), a.marker, a.skip + 2))
    t0, t1 = ends[a.skip], ends[-1]
    nsteps = len(ends) - 1 - a.skip
    win = [o for o in ops if o[1] > t0 and o[0] < t1]
    busy = 0
    cur_s, cur_e = None, None
    gaps = []  # (len, start, end, prev op, next op)
    prev = None
    for o in win:
        s, e = max(o[0], t0), min(o[1], t1)
        if cur_e is None:
            cur_s, cur_e, prev = s, e, o
            continue
        if s > cur_e:
            busy += cur_e - cur_s
            if s - cur_e >= a.min_gap_us * 1e3:
                gaps.append((s - cur_e, cur_e, s, prev, o))
            cur_s, cur_e = s, e
        if e >= cur_e:
            cur_e, prev = e, o
    busy += cur_e - cur_s
    wall = t1 - t0
    by_end = sorted(calls, key=lambda c: c[1])
    call_ends = [c[1] for c in by_end]
    cause = collections.Counter()
    cause_n = collections.Counter()
    rows = []
    for g in gaps:
        glen, gs, ge, p, n = g
        launch = api.get(n[2])
        why = "GPU (launched before the gap)"
        if launch and launch[1] > gs:
            why = "host issue"
            # the host's last synchronous call returning inside the gap
            i = bisect.bisect_right(call_ends, launch[0]) - 1
            while i >= 0 and by_end[i][1] > gs:
                if SYNC_CALLS.search(by_end[i][3]):
                    why = "after " + by_end[i][3]
                    break
                i -= 1
        elif not launch:
            why = "unknown (no launch record)"
        cause[why] += glen
        cause_n[why] += 1
        rows.append((glen, why, short(p[3]), short(n[3])))
    ms = 1e6
    print("%s: %d steps (after %d skipped), %.2f ms a step" %
          (a.trace, nsteps, a.skip, wall / nsteps / ms))
    print("  GPU busy %.2f ms a step (%.1f%%), idle %.2f ms a step in %d gaps "
          "of >= %.0f us (%.1f%%; %.2f ms in shorter ones)" %
          (busy / nsteps / ms, 100 * busy / wall,
           sum(g[0] for g in gaps) / nsteps / ms, len(gaps), a.min_gap_us,
           100 * sum(g[0] for g in gaps) / wall,
           (wall - busy - sum(g[0] for g in gaps)) / nsteps / ms))
    print("  idle by cause (ms a step, gaps a step):")
    for why, v in cause.most_common():
        print("    %8.3f  %6.1f  %s" % (v / nsteps / ms,
                                          cause_n[why] / nsteps, why))
    print("  largest gaps (us, cause, after -> before):")
    for glen, why, p, n in sorted(rows, reverse=True)[:a.top]:
        print("    %8.1f  %-32s %s -> %s" % (glen / 1e3, why[:32], p, n))
    by_next = collections.Counter()
    for glen, why, p, n in rows:
        by_next[n] += glen
    print("  idle before each kind of operation (ms a step):")
    for n, v in by_next.most_common(15):
        print("    %8.3f  %s" % (v / nsteps / ms, n))


if __name__ == "__main__":
    main()
