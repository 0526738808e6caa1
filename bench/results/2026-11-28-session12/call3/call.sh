#!/bin/bash
# session 12 call 3: GPU idle gaps (CUPTI timeline) for GPT-2, Llama 1B, block_causal; clocks during training
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 400; cd "$OUT" && tar czf c3.tgz r) &
S=/tmp/s12; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 8000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1 & p1=$!
python3 bench/gpu/make_shard.py --out $S/llama.bin --tokens 8000000 --vocab 128256 --width 4 >> "$R/shards.log" 2>&1 & p2=$!
python3 bench/gpu/make_shard.py --out $S/docs.bin --tokens 8000000 --vocab 128256 --width 4 --eot 128001 --doc-len 1024 >> "$R/shards.log" 2>&1 & p3=$!
python3 tests/gpu/trace_gaps.py --build $S/tr > "$R/build.log" 2>&1
wait $p1 $p2 $p3
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin)
L=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama.bin)
D=(bench/gpu/llama3_1b.toml --training.dataset_path $S/docs.bin --training.local_batch_size 2 --training.seq_len 8192 --model.attn_mask_type block_causal)
trace() { n=$1 t=$2; shift 2; rm -rf "$S/o" "$S/t"; mkdir -p "$S/t"
  CUDA_INJECTION64_PATH=$S/tr/libcupti_trace.so TRACE_DIR=$S/t timeout $t .gpu/trainrun "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  for f in $S/t/trace-*.txt; do python3 tests/gpu/trace_gaps.py "$f" >> "$R/$n.gaps.txt" 2>&1; done
  ls -la $S/t >> "$R/$n.gaps.txt"; big=$(ls -S $S/t/trace-*.txt | head -1); gzip -c "$big" > "$R/$n.trace.gz"; rm -rf "$S/o" "$S/t"; }
clk() { n=$1 t=$2; shift 2; rm -rf "$S/o"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu --format=csv -lms 200 > "$R/$n.smi.csv" 2>&1 & p=$!
  timeout $t .gpu/trainrun "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"; kill $p; rm -rf "$S/o"; }
trace tr_llama 90 "${L[@]}" --training.steps 10
trace tr_docs 90 "${D[@]}" --training.steps 10
clk clk_llama 60 "${L[@]}" --training.steps 25
cd "$OUT" && tar czf c3.tgz r
