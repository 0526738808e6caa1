#!/bin/bash
# NEXT SESSION call 1 (one H100; carry [".gpu", ".gpu6"]): .gpu = main fcae3ff, .gpu6 = gemmtune 06be53d (rebased on main) (GEMM algorithms timed at first use)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 570; cd "$OUT" && tar czf c1.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
L0=$LD_LIBRARY_PATH
( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_LOG_LEVEL=debug TRAINRUN_LOG_SUBSYS=kernels timeout 150 .gpu6/kern/check_kernels_cuda > "$R/check_gpu6.log" 2>&1; echo "check gpu6 rc=$? $(date +%T)" >> "$R/runs.txt" )
for t in 1 8 1 8; do ( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_GEMM_TUNE=$t timeout 90 .gpu6/kern/kernels_bench -f linear >> "$R/kb_linear_tune$t.log" 2>&1; echo "kb tune=$t rc=$? $(date +%T)" >> "$R/runs.txt" ); done
( export LD_LIBRARY_PATH=$PWD/.gpu6/lib:$L0; TRAINRUN_GEMM_TUNE=8 timeout 90 .gpu6/kern/kernels_bench -f ceiling >> "$R/kb_ceiling_tune8.log" 2>&1 )
timeout 120 .gpu/kern/kernels_bench -f attention > "$R/kb_attention.log" 2>&1
timeout 120 .gpu/kern/kernels_bench -f docs > "$R/kb_docs.log" 2>&1
echo "kb attention, docs $(date +%T)" >> "$R/runs.txt"
AB_JOBS="gpt2 llama docs" bench/ab_train.sh .gpu .gpu6 /tmp/ab15 2 > "$R/ab_gemmtune.txt" 2>&1
echo "ab $(date +%T)" >> "$R/runs.txt"
mkdir -p "$R/ab"; for m in /tmp/ab15/*/metrics.jsonl; do n=$(basename $(dirname $m)); cp "$m" "$R/ab/$n.metrics.jsonl"; done
cd "$OUT" && tar czf c1.tgz r
