#!/bin/bash
# session 11 call 4: cudnn-docs with dense Dsum / dQ accumulator / virtual GQA per-head dK dV; flex
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 420; cd "$OUT" && tar czf c4.tgz --exclude='*.safetensors' --exclude='*.trace.json' r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
CK_RUN_CASE=ops timeout 110 .gpu/kern/check_kernels_cuda > "$R/kern.log" 2>&1; echo "kern_rc=$?" >> "$R/kern.log"
P="trf ptf"
OUT=$R/flex PROGRAMS="$P" timeout 250 bench/parallel_gpu.sh --reps 1 --runs flex > "$R/bench_flex.log" 2>&1
cd "$OUT" && tar czf c4.tgz --exclude='*.safetensors' --exclude='*.trace.json' r
