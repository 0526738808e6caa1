#!/bin/bash
# session 11 call 6: block_causal trained on cuDNN's ragged graph against the flash kernel (losses step by step), one GPU
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 200; cd "$OUT" && tar czf c6.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
S=/tmp/trainrun-tp; mkdir -p $S
[ -s $S/llama_docs.bin ] || python3 bench/gpu/make_shard.py --out $S/llama_docs.bin --tokens 20000000 --vocab 128256 --width 4 --eot 128001 --doc-len 1024 > "$R/shard.log" 2>&1
F=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama_docs.bin --training.steps 20 --training.local_batch_size 2 --training.seq_len 8192 --model.attn_mask_type block_causal --metrics.log_freq 1)
for a in auto; do
  rm -rf $S/$a
  TRAINRUN_ATTENTION=$a timeout 60 .gpu/trainrun --nproc-per-node 1 "${F[@]}" --job.dump_folder $S/$a --metrics.enable_jsonl=true > "$R/docs_$a.log" 2>&1
  echo "$a rc=$?" >> "$R/runs.txt"; cp $S/$a/metrics.jsonl "$R/docs_$a.metrics.jsonl"; rm -rf $S/$a
done
cd "$OUT" && tar czf c6.tgz r
