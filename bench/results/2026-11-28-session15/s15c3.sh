#!/bin/bash
# session 15 call 3 (one H200; carry [".gpu", ".gpu6", "peers"] (the H100 cache stays home: a fresh .gpucache-h200)):
# 1. kernels_bench -a 8 (gemmtune 5bdea4d in .gpu6): each cuBLASLt candidate's steady time per GEMM shape, and what the first-use tuning measured (debug log)
# 2. the first share of issue 22's GPT-2 protocol on an H200 (bench/results/2026-11-28-protocol-gpt2-h200), trainrun = .gpu (main 93483cc)
# Afterwards, in the repository's root: tar xzf /work/.device/N/results.tgz && cat /work/.device/N/cache.tgz.* | tar xzf -
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
O=bench/results/2026-11-28-protocol-gpt2-h200
(sleep 575; cd "$OUT" && tar czf part.tgz r -C "$OLDPWD" $O) &
L0=$LD_LIBRARY_PATH
( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_LOG_LEVEL=debug TRAINRUN_LOG_SUBSYS=kernels timeout 150 .gpu6/kern/kernels_bench -a 8 -f linear > "$R/kb_algos_linear.log" 2>&1; echo "kb -a linear rc=$? $(date +%T)" >> "$R/runs.txt" )
( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_LOG_LEVEL=debug TRAINRUN_LOG_SUBSYS=kernels timeout 60 .gpu6/kern/kernels_bench -a 8 -f ceiling > "$R/kb_algos_ceiling.log" 2>&1; echo "kb -a ceiling rc=$? $(date +%T)" >> "$R/runs.txt" )
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
BUDGET=400 PACK=$OUT TRAINRUN=.gpu/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu bench/gpu/protocol_call.sh gpt2 $O .gpucache-h200 > "$R/call.log" 2>&1
echo "protocol rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
cd "$OUT" && tar czf r.tgz r
