#!/bin/bash
# session 15 call 2 (one H200; carry [".gpu", ".gpu6"]): .gpu = main 93483cc, .gpu6 = gemmtune v2 (interleaved candidate rounds, 3% margin)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 560; cd "$OUT" && tar czf c2.tgz r) &
L0=$LD_LIBRARY_PATH
( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_LOG_LEVEL=debug TRAINRUN_LOG_SUBSYS=kernels timeout 150 .gpu6/kern/check_kernels_cuda > "$R/check_gpu6.log" 2>&1; echo "check gpu6 rc=$? $(date +%T)" >> "$R/runs.txt" )
for t in 1 8 1 8; do ( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_GEMM_TUNE=$t TRAINRUN_LOG_LEVEL=debug TRAINRUN_LOG_SUBSYS=kernels timeout 90 .gpu6/kern/kernels_bench -f linear >> "$R/kb_linear_tune$t.log" 2>&1; echo "kb tune=$t rc=$? $(date +%T)" >> "$R/runs.txt" ); done
for t in 1 8; do ( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_GEMM_TUNE=$t timeout 90 .gpu6/kern/kernels_bench -f ceiling >> "$R/kb_ceiling.log" 2>&1 ); done
timeout 120 python3 bench/results/2026-11-28-session15/torch_gemm.py > "$R/torch_gemm.log" 2>&1
( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_GEMM_TUNE=1 timeout 90 .gpu6/kern/kernels_bench -f ceiling >> "$R/kb_ceiling.log" 2>&1 )
echo "kb ceiling, torch $(date +%T)" >> "$R/runs.txt"
AB_JOBS="gpt2 llama docs" bench/ab_train.sh .gpu .gpu6 /tmp/ab15 3 > "$R/ab_gemmtune.txt" 2>&1
echo "ab $(date +%T)" >> "$R/runs.txt"
mkdir -p "$R/ab"; for m in /tmp/ab15/*/metrics.jsonl; do n=$(basename $(dirname $m)); cp "$m" "$R/ab/$n.metrics.jsonl"; done
for l in /tmp/ab15/*-[AB]-*.log; do n=$(basename $l .log); grep -m3 "GEMM tuning" "$l" > "$R/ab/$n.tune.txt" 2>/dev/null; done
cd "$OUT" && tar czf c2.tgz r
