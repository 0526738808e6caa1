#!/usr/bin/env python3
"""tests/pipelining/gen_fixtures.py: writes PyTorch's own pipeline_order for
every schedule class as text fixtures, which tests/check_pipelining.c
compares trainrun's generators (pipelining/generators.c) against.

Usage: python3 tests/pipelining/gen_fixtures.py OUTDIR   (needs torch)

For p in {2, 4} pipeline ranks, m in {p, 2p, 8} micro-batches (and v = 2
stages per rank for the multi-stage classes), it builds the schedule class
on fake stages (no process group, no module: the way PyTorch's own
test/distributed/pipelining/test_schedule.py builds schedules to look at
their plans) and writes OUTDIR/<name>_p<p>_m<m>.csv:

    # torch <version> <Class> pp=<p> n_microbatches=<m> stages_per_rank=<v>
    <rank 0's actions>
    <rank 1's actions>
    ...

The rows after the comment line are PyTorch's compute_only CSV (_dump_csv):
one row per rank, its actions comma-separated in their text form (`0F1`),
an empty cell for an idle slot (None). A class that refuses the
combination (DualPipeV needs m >= 2p) gets no file; OUTDIR/MANIFEST lists
what was written and what was refused, with the reason.
"""
import csv
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining.stage import _PipelineStageBase


class FakeStage(_PipelineStageBase):
    """A stage with only what the schedule classes read to build a plan."""

    def __init__(self, stage_index, num_stages, group_size, group_rank=0):
        self.submod = None
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.group = None
        self.stage_index_to_group_rank = None
        self.p2p_per_edge = False

    def _create_grad_recv_info(self, *args, **kwargs):
        return None

    def _prepare_forward_infra(self, *args, **kwargs):
        pass

    def _prepare_backward_infra(self, *args, **kwargs):
        pass


# (file name, class name, stages per rank, placement of rank 0's stages)
SCHEDULES = [
    ("gpipe", "ScheduleGPipe", 1, "single"),
    ("1f1b", "Schedule1F1B", 1, "single"),
    ("interleaved1f1b", "ScheduleInterleaved1F1B", 2, "loop"),
    ("loopedbfs", "ScheduleLoopedBFS", 2, "loop"),
    ("interleavedzb", "ScheduleInterleavedZeroBubble", 2, "loop"),
    ("zbvzerobubble", "ScheduleZBVZeroBubble", 2, "v"),
    ("dualpipev", "ScheduleDualPipeV", 2, "v"),
]


def build(cls, p, m, v, placement):
    n = p * v
    if placement == "single":
        return cls(FakeStage(0, p, p), m)
    if placement == "loop":
        idx = [r * p for r in range(v)]
    else:
        idx = [0, n - 1]
    return cls([FakeStage(i, n, p) for i in idx], m)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    manifest = [f"# torch {torch.__version__}"]
    for name, clsname, v, placement in SCHEDULES:
        cls = getattr(S, clsname, None)
        if cls is None:
            manifest.append(f"{name}: class {clsname} absent")
            continue
        for p in (2, 4):
            for m in sorted({p, 2 * p, 8}):
                fn = f"{name}_p{p}_m{m}.csv"
                try:
                    order = build(cls, p, m, v, placement).pipeline_order
                    if order is None:
                        raise RuntimeError("pipeline_order is None")
                except Exception as e:  # a combination the class refuses
                    manifest.append(f"{fn}: refused: {type(e).__name__}: {e}")
                    continue
                with open(os.path.join(out, fn), "w", newline="") as f:
                    f.write(f"# torch {torch.__version__} {clsname} pp={p} "
                            f"n_microbatches={m} stages_per_rank={v}\n")
                    w = csv.writer(f, lineterminator="\n")
                    for rank in sorted(order):
                        w.writerow(["" if a is None else str(a)
                                    for a in order[rank]])
                manifest.append(f"{fn}: written")
    with open(os.path.join(out, "MANIFEST"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    print("\n".join(manifest))


if __name__ == "__main__":
    main()
