#!/bin/bash
# session 13 call 6: block_causal flex with the new build (.gpu2) against FlexAttention + compile, 2 rounds of 60 steps, GPU 0
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 540; cd "$OUT" && tar czf c6.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
CUDA_VISIBLE_DEVICES=0 TRAINRUN=.gpu2/trainrun OUT=$R/flex PROGRAMS="trf ptf" TP_STEPS=60 timeout 520 bench/parallel_gpu.sh --reps 2 --runs flex > "$R/bench_flex.log" 2>&1
echo "flex rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
cd "$OUT" && tar czf c6.tgz r
