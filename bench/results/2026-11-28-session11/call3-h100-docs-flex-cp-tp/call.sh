#!/bin/bash
# session 11 call 3: docs fix check, flex round 2 (reversed), CP peer alltoall+compile, TP 1B round 2
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 560; cd "$OUT" && tar czf c3.tgz --exclude='*.safetensors' --exclude='*.trace.json' r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
timeout 110 .gpu/kern/check_kernels_cuda > "$R/kern.log" 2>&1; echo "kern_rc=$?" >> "$R/kern.log"
OUT=$R/flex PROGRAMS="trf ptf" FIRST_REP=2 timeout 230 bench/parallel_gpu.sh --reps 1 --runs flex > "$R/bench_flex.log" 2>&1
OUT=$R/cp PROGRAMS="trc ptcac" timeout 150 bench/parallel_gpu.sh --reps 1 --runs cp > "$R/bench_cp.log" 2>&1
S=/tmp/trainrun-tp
run() { n=$1 np=$2; shift 2; rm -rf "$S/$n"
  timeout 60 .gpu/trainrun --nproc-per-node "$np" "$@" --job.dump_folder "$S/$n" \
    --metrics.enable_jsonl=true > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/$n/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/$n"; }
L=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama.bin --training.steps 20)
run tr_tp2 2 "${L[@]}" --parallelism.tensor_parallel_degree 2
run tr_tp2_async 2 "${L[@]}" --parallelism.tensor_parallel_degree 2 --parallelism.enable_async_tensor_parallel=true
cd "$OUT" && tar czf c3.tgz --exclude='*.safetensors' --exclude='*.trace.json' r
