#!/bin/bash
# NEXT SESSION call 1 (one GPU; carry .gpu .gpu2 .gpu4): .gpu = main c628362 (its norm_bwd_row refactor 0c4bc1b not yet run on a GPU),
# .gpu2 = overlap f69ffe1 (AdamW beside the next forward), .gpu4 = kernfuse (classifier row in shared memory + LayerNorm/RMSNorm fused backward with bank-free sums)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 575; cd "$OUT" && tar czf c1.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
L0=$LD_LIBRARY_PATH
S=/tmp/s14; mkdir -p $S
for b in .gpu .gpu2 .gpu4; do ( export LD_LIBRARY_PATH=$PWD/$b/lib:$L0; timeout 150 $b/kern/check_kernels_cuda > "$R/check_${b#.}.log" 2>&1; echo "check $b rc=$? $(date +%T)" >> "$R/runs.txt" ); done
for b in .gpu .gpu4 .gpu .gpu4; do ( export LD_LIBRARY_PATH=$PWD/$b/lib:$L0; timeout 60 $b/kern/kernels_bench -f classifier >> "$R/kb_cls_${b#.}.log" 2>&1; timeout 60 $b/kern/kernels_bench -f norm >> "$R/kb_norm_${b#.}.log" 2>&1 ); done
( export LD_LIBRARY_PATH=$PWD/.gpu2/lib:$L0; timeout 200 sh tests/gpu/train.sh .gpu2/trainrun $S/gtrain 40 > "$R/gpu_train_overlap.log" 2>&1; echo "gpu train overlap rc=$? $(date +%T)" >> "$R/runs.txt" )
rm -rf $S/gtrain
AB_JOBS="llama docs gpt2" bench/ab_train.sh .gpu .gpu2 /tmp/ab14 2 > "$R/ab_overlap.txt" 2>&1
echo "ab overlap $(date +%T)" >> "$R/runs.txt"
mkdir -p "$R/ab"; for d in /tmp/ab14; do for m in $d/*/metrics.jsonl; do n=$(basename $(dirname $m)); cp "$m" "$R/ab/${d##*/}-$n.metrics.jsonl"; done; done
kill $SMI
cd "$OUT" && tar czf c1.tgz r
