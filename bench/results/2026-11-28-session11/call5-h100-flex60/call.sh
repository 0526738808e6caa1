#!/bin/bash
# session 11 call 5: block_causal over 60 steps (cuDNN plans for new document buckets built in the first steps), trainrun cudnn-docs vs FlexAttention + compile
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 300; cd "$OUT" && tar czf c5.tgz --exclude='*.safetensors' --exclude='*.trace.json' r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
OUT=$R/flex PROGRAMS="ptf trf" TP_STEPS=60 timeout 280 bench/parallel_gpu.sh --reps 1 --runs flex > "$R/bench_flex.log" 2>&1
cd "$OUT" && tar czf c5.tgz --exclude='*.safetensors' --exclude='*.trace.json' r
