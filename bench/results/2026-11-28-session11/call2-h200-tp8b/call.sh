#!/bin/bash
# session 11 call 2: Llama 3.1 8B TP 2: trainrun blocking / async against PyTorch (eager, compile)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 570; cd "$OUT" && tar czf c2.tgz --exclude='*.safetensors' --exclude='*.trace.json' r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
S=/tmp/trainrun-tp
OUT=$R/tp8b PROGRAMS="tr2e pce" PT_TIMEOUT=230 TJ_TIMEOUT=110 timeout 400 bench/parallel_gpu.sh --reps 1 --runs tp8b > "$R/bench_tp8b.log" 2>&1
run() { n=$1 np=$2; shift 2; rm -rf "$S/$n"
  timeout 100 .gpu/trainrun --nproc-per-node "$np" "$@" --job.dump_folder "$S/$n" \
    --metrics.enable_jsonl=true > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/$n/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/$n"; }
E=(bench/gpu/llama3_8b.toml --training.dataset_path $S/llama.bin --training.steps 20 --training.local_batch_size 2 --parallelism.tensor_parallel_degree 2)
run tr_tp2_8b_async 2 "${E[@]}" --parallelism.enable_async_tensor_parallel=true
run tr_tp2m_8b_async 2 "${E[@]}" --parallelism.enable_async_tensor_parallel=true --metrics.comm_overlap=true
cd "$OUT" && tar czf c2.tgz --exclude='*.safetensors' --exclude='*.trace.json' r
