#!/bin/bash
# call (one H100; carry .gpu .gpu4 peers): normfuse2 (.gpu4: LayerNorm/RMSNorm fused backward, bank-free sums) checks + A/B GPT-2; then max-autotune with autotuning in a subprocess
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
O=bench/results/2026-11-29-protocol-gpt2
(sleep 580; cd "$OUT" && tar czf c6.tgz r -C "$OLDPWD" $O) &
L0=$LD_LIBRARY_PATH
( export LD_LIBRARY_PATH=$PWD/.gpu4/lib:$L0; timeout 100 .gpu4/kern/check_kernels_cuda > "$R/check_gpu4.log" 2>&1; echo "check rc=$? $(date +%T)" >> "$R/runs.txt"
  timeout 60 .gpu4/kern/kernels_bench -f norm > "$R/kb_norm_gpu4.log" 2>&1 )
AB_JOBS="gpt2" bench/ab_train.sh .gpu .gpu4 /tmp/ab14n 3 > "$R/ab_normfuse.txt" 2>&1
echo "ab $(date +%T)" >> "$R/runs.txt"
mkdir -p "$R/ab"; for m in /tmp/ab14n/*/metrics.jsonl; do n=$(basename $(dirname $m)); cp "$m" "$R/ab/$n.metrics.jsonl"; done
export TORCHINDUCTOR_CACHE_DIR=/tmp/gc/inductor TRITON_CACHE_DIR=/tmp/gc/triton
PROGRAMS="torch_autotune" FIRST_REP=1 REPS=1 BENCH_DEADLINE=$((575 - SECONDS)) TRAINRUN=.gpu/trainrun bench/gpu_train.sh gpt2 $O > "$R/call.log" 2>&1
cd "$OUT" && tar czf c6.tgz r -C "$OLDPWD" $O
