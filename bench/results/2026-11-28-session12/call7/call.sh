#!/bin/bash
# session 12 call 7 (same 2-GPU machine, warm): GPT-2 bias A/B round 3, DDP over 2 with the colsum bias, check_kernels_cuda under colsum
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 150; cd "$OUT" && tar czf c7.tgz r) &
S=/tmp/s12; mkdir -p $S
[ -s $S/gpt2.bin ] || python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 8000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --training.steps 40)
ab() { n=$1 v=$2 np=$3; rm -rf "$S/o"
  TRAINRUN_BIAS_GRAD=$v timeout 60 .gpu/trainrun --nproc-per-node $np "${G[@]}" --parallelism.data_parallel_replicate_degree $np --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"; cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
ab ddp2_col_r1 colsum 2; ab one_col_r4 colsum 1; ab ddp2_col_r2 colsum 2
cd "$OUT" && tar czf c7.tgz r
