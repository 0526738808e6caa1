#!/bin/bash
# session 12 call 6 (same 2-GPU machine, warm): GPT-2 bias A/B round 3, DDP over 2 with the colsum bias, check_kernels_cuda under colsum
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 215; cd "$OUT" && tar czf c6.tgz r) &
S=/tmp/s12; mkdir -p $S
[ -s $S/gpt2.bin ] || python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 8000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --training.steps 40)
ab() { n=$1 v=$2 np=$3; rm -rf "$S/o"
  TRAINRUN_BIAS_GRAD=$v timeout 60 .gpu/trainrun --nproc-per-node $np "${G[@]}" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"; cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
ab gpt2_col_r3 colsum 1; ab gpt2_epi_r3 epilogue 1
ab ddp2_col colsum 2; ab ddp2_epi epilogue 2
TRAINRUN_BIAS_GRAD=colsum CUDA_VISIBLE_DEVICES=0 timeout 110 .gpu/kern/check_kernels_cuda > "$R/kern_colsum.log" 2>&1; echo "kern_rc=$?" >> "$R/kern_colsum.log"
cd "$OUT" && tar czf c6.tgz r
