#!/bin/bash
# NEXT SESSION (18) call, one H200; carry [".gpu"] (bench/gpu/stage.sh of main at ed5e417
# or later: the cuDNN attention tuning). Everything goes into ONE archive, $OUT/ab.tgz:
# a call returns a limited number of files, and session 17's last call lost its check
# logs to ab_train.sh's many files.
# 1. A/B of the cuDNN attention tuning on Llama 3.2 1B and on block_causal documents
#    (TRAINRUN_CUDNN_ATTN_TUNE=1 on side A: config 0, no timing), 3 runs each;
# 2. block_causal against FlexAttention + compile (parallel_gpu.sh flex: trf ptf), the
#    issue 23 figure (1.066x in session 13, 1.1x asked), with what time is left.
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
pack() { (cd "$OUT" && tar czf ab.tgz --exclude='*.bin' r); }
(sleep 570; pack) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; .gpu/trainrun --version > "$R/version.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
AB_JOBS="llama docs" AB_ENV_A="TRAINRUN_CUDNN_ATTN_TUNE=1" timeout 330 bench/ab_train.sh .gpu .gpu "$R/ab" 3 > "$R/ab.log" 2>&1
echo "ab rc=$? $(date +%T)" >> "$R/runs.txt"; pack
left=$((550 - SECONDS))
[ $left -gt 120 ] && CUDA_VISIBLE_DEVICES=0 TRAINRUN=.gpu/trainrun OUT=$R/flex PROGRAMS="trf ptf" TP_STEPS=60 \
  timeout $left bench/parallel_gpu.sh --reps 1 --runs flex > "$R/bench_flex.log" 2>&1
echo "flex rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
pack
