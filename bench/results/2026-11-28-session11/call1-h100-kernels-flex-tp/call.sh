#!/bin/bash
# session 11 call 1: kernels (cudnn-docs + atp merged build), flex, TP 1B blocking vs async
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 560; cd "$OUT" && tar czf c1.tgz --exclude='*.safetensors' --exclude='*.trace.json' r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
timeout 110 .gpu/kern/check_kernels_cuda > "$R/kern.log" 2>&1; echo "kern_rc=$?" >> "$R/kern.log"
OUT=$R/flex PROGRAMS="trf trfc ptf" timeout 260 bench/parallel_gpu.sh --reps 1 --runs flex > "$R/bench_flex.log" 2>&1
S=/tmp/trainrun-tp
run() { n=$1 np=$2; shift 2; rm -rf "$S/$n"
  timeout 75 "${PRE[@]}" .gpu/trainrun --nproc-per-node "$np" "$@" --job.dump_folder "$S/$n" \
    --metrics.enable_jsonl=true > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/$n/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/$n"; }
F=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama_docs.bin --training.steps 20
   --training.local_batch_size 2 --training.seq_len 8192 --model.attn_mask_type block_causal)
PRE=(env TRAINRUN_ATTENTION=flash) run tr_flex_block_flash 1 "${F[@]}"
PRE=()
L=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama.bin --training.steps 20)
run tr_tp2m_async 2 "${L[@]}" --parallelism.tensor_parallel_degree 2 --metrics.comm_overlap=true --parallelism.enable_async_tensor_parallel=true
run tr_tp2m 2 "${L[@]}" --parallelism.tensor_parallel_degree 2 --metrics.comm_overlap=true
run tr_tp2_async 2 "${L[@]}" --parallelism.tensor_parallel_degree 2 --parallelism.enable_async_tensor_parallel=true
run tr_tp2 2 "${L[@]}" --parallelism.tensor_parallel_degree 2
cd "$OUT" && tar czf c1.tgz --exclude='*.safetensors' --exclude='*.trace.json' r
