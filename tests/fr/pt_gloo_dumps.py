#!/usr/bin/env python3
"""tests/fr/pt_gloo_dumps.py: how tests/fr/pt215_gloo_* were made — PyTorch
itself writing flight-recorder dumps (needs torch; never run in CI).

    TORCH_FR_BUFFER_SIZE=2000 python pt_gloo_dumps.py OUTDIR PORT skip|type

Two Gloo ranks on 127.0.0.1 run six all_reduces of 1024 floats (the last
three async); with "skip" rank 1 leaves out the 4th, with "type" it calls
broadcast there instead. After a second each rank writes its recorder with
torch._C._distributed_c10d._dump_fr_trace (pickle, OUTDIR/fr_rank_N) and
_dump_fr_trace_json (OUTDIR/json/fr_rank_N.json). Made with torch
2.15.0+cu132: its Gloo recorder writes pg_config under the empty name,
leaves every state "scheduled" and reports progress only in pg_status.
"""
import os, sys, datetime
import torch, torch.distributed as dist
import torch._C._distributed_c10d as c

def main(rank, world, out):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method="tcp://127.0.0.1:%s" % sys.argv[2],
                            timeout=datetime.timedelta(seconds=5))
    works = []
    for i in range(6):
        t = torch.ones(1024)
        mode = sys.argv[3]
        if rank == 1 and i == 3 and mode == "skip":
            continue
        if rank == 1 and i == 3 and mode == "type":
            works.append(dist.broadcast(t, src=1, async_op=True))
            continue
        if i < 3:
            dist.all_reduce(t)
        else:
            works.append(dist.all_reduce(t, async_op=True))
    import time; time.sleep(1.0)
    pk = c._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    open(os.path.join(out, "fr_rank_%d" % rank), "wb").write(pk)
    js = c._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    open(os.path.join(out, "json", "fr_rank_%d.json" % rank), "wb").write(js if isinstance(js, bytes) else js.encode())
    os._exit(0)

if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "json"), exist_ok=True)
    world = 2
    pids = []
    for r in range(world):
        pid = os.fork()
        if pid == 0:
            os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
            main(r, world, out)
        pids.append(pid)
    for p in pids:
        os.waitpid(p, 0)
