#!/bin/bash
# s18call.sh's GPU 1 share (CUDA_VISIBLE_DEVICES=1 from the caller); ends by END1 s.
END1=${END1:-540}
. .gpu/env.sh > /dev/null 2>&1
R=$OUT; left() { echo $((END1 - SECONDS)); }
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; .gpu/trainrun --version > "$R/version.txt" 2>&1
nvidia-smi -i 1 --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
timeout 100 .gpu/kern/check_kernels_cuda > "$R/check_kernels_cuda.log" 2>&1
echo "check_kernels_cuda rc=$? $(date +%T)" >> "$R/runs.txt"
TRAINRUN_LOG_LEVEL=info timeout 60 .gpu/kern/kernels_bench -w 200 -f llama > "$R/kb_llama.log" 2>&1
echo "kernels_bench rc=$? $(date +%T)" >> "$R/runs.txt"
TRAINRUN=.gpu/trainrun OUT=$R/flex PROGRAMS="trf ptf" TP_STEPS=60 \
  timeout $(( $(left) - 150 )) bench/parallel_gpu.sh --reps 1 --runs flex > "$R/bench_flex.log" 2>&1
echo "flex rc=$? $(date +%T)" >> "$R/runs.txt"
[ "$(left)" -gt 90 ] && AB_GPUS=1 AB_JOBS="docs llama" AB_ENV_A="TRAINRUN_CUDNN_ATTN_TUNE=1" \
  timeout $(( $(left) - 5 )) bench/ab_train.sh .gpu .gpu "$R/ab" 3 > "$R/ab.log" 2>&1
echo "ab rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
