#!/bin/bash
# NEXT SESSION call 2 (one H200; carry [".gpu"], .gpu restaged from main after s16c1's verdict): issue 23's figure,
# trainrun block_causal (cuDNN ragged graph) against PyTorch FlexAttention + compile, Llama 3.2 1B B2 T8192, 60 steps, 2 rounds alternating.
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 575; cd "$OUT" && tar czf c2.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; .gpu/trainrun --version > "$R/version.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
TRAINRUN=.gpu/trainrun OUT=$R/flex PROGRAMS="trf ptf" TP_STEPS=60 timeout 540 bench/parallel_gpu.sh --reps 2 --runs flex > "$R/bench_flex.log" 2>&1
echo "flex rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
cd "$OUT" && tar czf c2.tgz r
