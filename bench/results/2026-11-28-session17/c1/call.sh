#!/bin/bash
# NEXT SESSION call 1 (one H200; carry [".gpu"] = bench/gpu/stage.sh of main at 450f7b1 or later):
# 1. check_kernels_cuda, with test_attention_cudnn_configs (cuDNN attention engine configs 1-6 against the CPU);
# 2. kernels_bench -c 12 on every cuDNN attention row (GPT-2 B64 T1024 H12 D64, Llama 1B B8 T2048 H32/8 D64, the
#    documents' ragged graphs at B2 T8192 and B8 T2048), each row after 200 ms of GEMMs (-w), the debug log
#    naming each config's engine and knobs (kb_cfg.log). A config faster than config 0 in both directions is
#    worth timing at first use, as the GEMMs are (TRAINRUN_GEMM_TUNE), and an A/B of the training steps.
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 575; cd "$OUT" && tar czf c1.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; .gpu/trainrun --version > "$R/version.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 500 > "$R/smi.csv" 2>&1 & SMI=$!
timeout 200 .gpu/kern/check_kernels_cuda > "$R/check_kernels_cuda.log" 2>&1; echo "check_kernels_cuda rc=$? $(date +%T)" >> "$R/runs.txt"
TRAINRUN_LOG_LEVEL=debug TRAINRUN_LOG_SUBSYS=kernels timeout $((560 - SECONDS)) .gpu/kern/kernels_bench -c 12 -w 200 -f cudnn > "$R/kb_cfg.log" 2>&1
echo "kernels_bench -c rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
cd "$OUT" && tar czf c1.tgz r
