#!/bin/bash
# NEXT SESSION call 1 (one H200; carry [".gpu", ".gpu7"]): .gpu = main (GEMM tuning, its review fixes not yet run on a GPU; kernels_bench -w), .gpu7 = docbuckets e2ca33c (with check_kernels_cuda cases for S 192, D' 3 and 6)
# (cuDNN's ragged graph pads D' and S to 1, 2, 3, 4, 6, 8, 12, ... instead of powers of two), rebased on main.
# check_kernels_cuda (its document cases), kernels_bench docs alternating (main's binary, -w, on each build's library), then A/B docs and llama, 3 rounds.
# Merge docbuckets only if the check passes and docs gains without llama losing.
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 560; cd "$OUT" && tar czf c1.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > "$R/smi.csv" 2>&1 & SMI=$!
L0=$LD_LIBRARY_PATH
timeout 150 .gpu/kern/check_kernels_cuda > "$R/check_gpu.log" 2>&1; echo "check gpu rc=$? $(date +%T)" >> "$R/runs.txt"
( export LD_LIBRARY_PATH=$PWD/.gpu7/lib:$L0; timeout 150 .gpu7/kern/check_kernels_cuda > "$R/check_gpu7.log" 2>&1; echo "check gpu7 rc=$? $(date +%T)" >> "$R/runs.txt" )
for b in .gpu .gpu7 .gpu7 .gpu; do ( export LD_LIBRARY_PATH=$PWD/$b/lib:$L0; TRAINRUN_LOG_LEVEL=debug TRAINRUN_LOG_SUBSYS=kernels timeout 90 .gpu/kern/kernels_bench -w 200 -f docs >> "$R/kb_docs_${b#.}.log" 2>&1; echo "kb docs $b rc=$? $(date +%T)" >> "$R/runs.txt" ); done
AB_JOBS="docs llama" bench/ab_train.sh .gpu .gpu7 /tmp/ab16 3 > "$R/ab_docbuckets.txt" 2>&1
echo "ab $(date +%T)" >> "$R/runs.txt"
mkdir -p "$R/ab"; for m in /tmp/ab16/*/metrics.jsonl; do n=$(basename $(dirname $m)); cp "$m" "$R/ab/$n.metrics.jsonl"; done
kill $SMI
cd "$OUT" && tar czf c1.tgz r
