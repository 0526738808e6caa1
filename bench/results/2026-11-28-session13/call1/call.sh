#!/bin/bash
# session 13 call 1: combo (normfuse + docbuckets) kernel checks, norm kernels, A/B against main (docs, gpt2, llama)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 565; cd "$OUT" && tar czf c1.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
L0=$LD_LIBRARY_PATH
( export LD_LIBRARY_PATH=$PWD/.gpu2/lib:$L0; timeout 150 .gpu2/kern/check_kernels_cuda > "$R/check_combo.log" 2>&1; echo "check_combo rc=$? $(date +%T)" >> "$R/runs.txt" )
for b in .gpu .gpu2; do ( export LD_LIBRARY_PATH=$PWD/$b/lib:$L0; timeout 60 $b/kern/kernels_bench -f norm > "$R/kb_norm_${b#.}.log" 2>&1; echo "kb $b rc=$? $(date +%T)" >> "$R/runs.txt" ); done
AB_JOBS=docs AB_FSDP_STEPS=40 AB_SKIP=10 bench/ab_train.sh .gpu .gpu2 /tmp/ab1 3 > "$R/ab_docs.txt" 2>&1
echo "ab docs $(date +%T)" >> "$R/runs.txt"
AB_JOBS="gpt2 llama" bench/ab_train.sh .gpu .gpu2 /tmp/ab2 2 > "$R/ab_gl.txt" 2>&1
echo "ab gl $(date +%T)" >> "$R/runs.txt"
mkdir -p "$R/ab"; for d in /tmp/ab1 /tmp/ab2; do for m in $d/*/metrics.jsonl; do n=$(basename $(dirname $m)); cp "$m" "$R/ab/$n.metrics.jsonl"; done; cp $d/*.log "$R/ab/" 2>/dev/null; done
kill $SMI
cd "$OUT" && tar czf c1.tgz r
