#!/bin/bash
# NEXT SESSION (if budget is left; else the one after) (2 GPUs, kind nvidia-h200-x2; carry [".gpu", ".gpu5"]): issue 22 item 5, collfast (.gpu5: a blocking op on the user stream itself)
# check_pg_nccl, then coll_bench against main (.gpu), 3 alternating runs each with --reps 5
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 400; cd "$OUT" && tar czf c6.tgz r) &
L0=$LD_LIBRARY_PATH
( export LD_LIBRARY_PATH=$PWD/.gpu5/lib:$L0; timeout 200 .gpu5/kern/check_pg_nccl > "$R/check_pg_nccl_collfast.log" 2>&1; echo "check collfast rc=$? $(date +%T)" >> "$R/runs.txt" )
for b in .gpu .gpu5 .gpu5 .gpu .gpu .gpu5; do ( export LD_LIBRARY_PATH=$PWD/$b/lib:$L0; timeout 100 $b/kern/coll_bench -b nccl --raw --raw-events --min 64K --max 4M --reps 5 >> "$R/coll_${b#.}.log" 2>&1; echo "coll $b rc=$? $(date +%T)" >> "$R/runs.txt" ); done
cd "$OUT" && tar czf c6.tgz r
