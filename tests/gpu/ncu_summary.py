#!/usr/bin/env python3
"""tests/gpu/ncu_summary.py: per-kernel GPU time from an Nsight Compute CSV.

  ncu --metrics gpu__time_duration.sum --csv --cache-control none \\
      --clock-control none ./trainrun JOB.toml --training.steps 3 > k.csv
  tests/gpu/ncu_summary.py k.csv [TOP]

Prints the total kernel time and the TOP (default 40) kernels by time, with
their share and launch count: where a training step's GPU time goes (the GPU
machines have ncu but not nsys).
"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    tot, cnt = collections.Counter(), collections.Counter()
    scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
    hdr = None
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if "Kernel Name" in r and "Metric Value" in r:
                hdr = r
                continue
            if hdr is None or len(r) != len(hdr):
                continue
            d = dict(zip(hdr, r))
            if d.get("Metric Name") != "gpu__time_duration.sum":
                continue
            v = float(d["Metric Value"].replace(",", ""))
            v *= scale.get(d.get("Metric Unit", "nsecond"), 1)
            name = d["Kernel Name"][:90]
            tot[name] += v
            cnt[name] += 1
    s = sum(tot.values())
    if not s:
        sys.exit("%s: no gpu__time_duration.sum rows" % path)
    print("total kernel time %.3f ms over %d kernels" % (s / 1e6, sum(cnt.values())))
    for k, v in tot.most_common(top):
        print("%9.3f ms %5.1f%% %5d  %s" % (v / 1e6, 100 * v / s, cnt[k], k))


if __name__ == "__main__":
    main()
