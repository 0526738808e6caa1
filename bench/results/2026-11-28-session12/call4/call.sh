#!/bin/bash
# session 12 call 4: block_causal with the host's document count: flex (trainrun vs FlexAttention+compile) 2 rounds of 60 steps, a CUPTI trace, check_kernels_cuda
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 570; cd "$OUT" && tar czf c4.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 500 > "$R/smi.csv" 2>&1 & SMI=$!
OUT=$R/flex PROGRAMS="trf ptf" TP_STEPS=60 timeout 400 bench/parallel_gpu.sh --reps 2 --runs flex > "$R/bench_flex.log" 2>&1
S=/tmp/trainrun-tp
python3 tests/gpu/trace_gaps.py --build /tmp/tr > "$R/build.log" 2>&1
D=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama_docs.bin --training.local_batch_size 2 --training.seq_len 8192 --model.attn_mask_type block_causal)
mkdir -p /tmp/t; rm -rf /tmp/o
CUDA_INJECTION64_PATH=/tmp/tr/libcupti_trace.so TRACE_DIR=/tmp/t timeout 60 .gpu/trainrun "${D[@]}" --training.steps 8 --job.dump_folder /tmp/o > "$R/tr_docs.log" 2>&1
for f in /tmp/t/trace-*.txt; do python3 tests/gpu/trace_gaps.py --top 12 "$f" >> "$R/tr_docs.gaps.txt" 2>&1; done
rm -rf /tmp/t /tmp/o
timeout 110 .gpu/kern/check_kernels_cuda > "$R/kern.log" 2>&1; echo "kern_rc=$?" >> "$R/kern.log"
kill $SMI
cd "$OUT" && tar czf c4.tgz r
