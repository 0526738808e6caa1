#!/bin/bash
# session 12 call 5 (2 GPUs): GPT-2 bias gradient A/B (cuBLASLt BGRADB epilogue vs colsum kernel, GPU 0), then async_with_pinned_mem's true stall (issue 22 item 1)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 430; cd "$OUT" && tar czf c5.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu,clocks_throttle_reasons.active --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
S=/tmp/s12; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 8000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --training.steps 40)
ab() { n=$1 v=$2; rm -rf "$S/o"
  CUDA_VISIBLE_DEVICES=0 TRAINRUN_BIAS_GRAD=$v timeout 60 .gpu/trainrun "${G[@]}" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"; cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
ab gpt2_epi_r1 epilogue; ab gpt2_col_r1 colsum; ab gpt2_col_r2 colsum; ab gpt2_epi_r2 epilogue
TRAINRUN=.gpu/trainrun OUT=$R/ckpt AC_TMO=200 timeout 330 bench/async_ckpt.sh --nproc 2 --saves 3 --interval 80 > "$R/async_ckpt.log" 2>&1
echo "rc=$?" >> "$R/async_ckpt.log"
kill $SMI
rm -rf /tmp/trainrun-async-ckpt
cd "$OUT" && tar czf c5.tgz r
