#!/bin/bash
# session 13 call 4 (2 GPUs): new build (.gpu2: RMS fused bwd, DDP bucket views, step tail) — kernel checks, tests/gpu/train.sh, A/B vs session start (.gpu) on gpt2/ddp/llama, DDP trace
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 575; cd "$OUT" && tar czf c4.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
L0=$LD_LIBRARY_PATH
S=/tmp/s13; mkdir -p $S
python3 tests/gpu/trace_gaps.py --build $S/tr > "$R/build.log" 2>&1 & P2=$!
( export LD_LIBRARY_PATH=$PWD/.gpu2/lib:$L0; timeout 150 .gpu2/kern/check_kernels_cuda > "$R/check_kernels_cuda.log" 2>&1; echo "check rc=$? $(date +%T)" >> "$R/runs.txt" )
( export LD_LIBRARY_PATH=$PWD/.gpu2/lib:$L0; timeout 200 sh tests/gpu/train.sh .gpu2/trainrun $S/gtrain 40 > "$R/gpu_train.log" 2>&1; echo "gpu train rc=$? $(date +%T)" >> "$R/runs.txt" )
rm -rf $S/gtrain
AB_JOBS="gpt2 ddp llama" bench/ab_train.sh .gpu .gpu2 /tmp/ab4 3 > "$R/ab.txt" 2>&1
echo "ab $(date +%T)" >> "$R/runs.txt"
mkdir -p "$R/ab"; for m in /tmp/ab4/*/metrics.jsonl; do n=$(basename $(dirname $m)); cp "$m" "$R/ab/$n.metrics.jsonl"; done; cp /tmp/ab4/*.log "$R/ab/" 2>/dev/null
wait $P2
rm -rf "$S/o" "$S/t"; mkdir -p "$S/t"
CUDA_INJECTION64_PATH=$S/tr/libcupti_trace.so TRACE_DIR=$S/t timeout 100 .gpu2/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 bench/gpu/gpt2_124m.toml --training.dataset_path /tmp/ab4/data/gpt2.bin --validation.enable=false --training.steps 12 --job.dump_folder $S/o > "$R/tr_ddp.log" 2>&1
echo "trace ddp rc=$? $(date +%T)" >> "$R/runs.txt"
for f in $(ls -S $S/t/trace-*.txt | head -1); do python3 tests/gpu/trace_gaps.py "$f" > "$R/tr_ddp.gaps.txt" 2>&1; gzip -c "$f" > "$R/tr_ddp.trace.gz"; done
rm -rf "$S/o" "$S/t"; mkdir -p "$S/t"
CUDA_INJECTION64_PATH=$S/tr/libcupti_trace.so TRACE_DIR=$S/t CUDA_VISIBLE_DEVICES=0 timeout 100 .gpu2/trainrun bench/gpu/gpt2_124m.toml --training.dataset_path /tmp/ab4/data/gpt2.bin --validation.enable=false --training.steps 12 --job.dump_folder $S/o > "$R/tr_one.log" 2>&1
echo "trace one rc=$? $(date +%T)" >> "$R/runs.txt"
for f in $(ls -S $S/t/trace-*.txt | head -1); do python3 tests/gpu/trace_gaps.py "$f" > "$R/tr_one.gaps.txt" 2>&1; gzip -c "$f" > "$R/tr_one.trace.gz"; done
kill $SMI
cd "$OUT" && tar czf c4.tgz r
