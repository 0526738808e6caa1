#!/bin/bash
# session 12 call 1: where a step's GPU time goes now (ncu) for GPT-2 124M, Llama 1B, Llama 1B block_causal; trainrun timings
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 575; cd "$OUT" && tar czf c1.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
S=/tmp/s12; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 8000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
python3 bench/gpu/make_shard.py --out $S/llama.bin --tokens 8000000 --vocab 128256 --width 4 >> "$R/shards.log" 2>&1
python3 bench/gpu/make_shard.py --out $S/docs.bin --tokens 8000000 --vocab 128256 --width 4 --eot 128001 --doc-len 1024 >> "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin)
L=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama.bin)
D=(bench/gpu/llama3_1b.toml --training.dataset_path $S/docs.bin --training.local_batch_size 2 --training.seq_len 8192 --model.attn_mask_type block_causal)
run() { n=$1 t=$2; shift 2; rm -rf "$S/o"
  timeout $t .gpu/trainrun "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
prof() { n=$1 t=$2; shift 2; rm -rf "$S/o"
  timeout $t ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
    .gpu/trainrun "$@" --job.dump_folder "$S/o" > "$R/$n.csv" 2> "$R/$n.err"
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  python3 tests/gpu/ncu_summary.py "$R/$n.csv" 60 > "$R/$n.txt" 2>&1; gzip -f "$R/$n.csv"; rm -rf "$S/o"; }
run gpt2 60 "${G[@]}" --training.steps 40
run llama 60 "${L[@]}" --training.steps 20
run docs 70 "${D[@]}" --training.steps 20
prof ncu_gpt2 120 "${G[@]}" --training.steps 2
prof ncu_llama 120 "${L[@]}" --training.steps 2
prof ncu_docs 120 "${D[@]}" --training.steps 2
cd "$OUT" && tar czf c1.tgz r
