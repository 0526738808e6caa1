#!/bin/bash
# a later call (2 GPUs, kind nvidia-h100-x2; carry [".gpu", ".gpu3", ".gpu5"]): collfast (.gpu5) check_pg_nccl + coll_bench against main (.gpu), then NCCL's stream priority (.gpu3 = ncclprio: TRAINRUN_NCCL_PRIORITY=low) on GPT-2 DDP and Llama 1B FSDP, alternating, one-GPU baseline
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 400; cd "$OUT" && tar czf c5.tgz r) &
S=/tmp/s15; mkdir -p $S
L0=$LD_LIBRARY_PATH
( export LD_LIBRARY_PATH=$PWD/.gpu5/lib:$L0; timeout 200 .gpu5/kern/check_pg_nccl > "$R/check_pg_nccl_collfast.log" 2>&1; echo "check collfast rc=$? $(date +%T)" >> "$R/runs.txt" )
for b in .gpu .gpu5 .gpu5 .gpu .gpu .gpu5; do ( export LD_LIBRARY_PATH=$PWD/$b/lib:$L0; timeout 100 $b/kern/coll_bench -b nccl --raw --raw-events --min 64K --max 4M --reps 5 >> "$R/coll_${b#.}.log" 2>&1; echo "coll $b rc=$? $(date +%T)" >> "$R/runs.txt" ); done
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 12000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
python3 bench/gpu/make_shard.py --out $S/llama.bin --tokens 8000000 --vocab 128256 --width 4 >> "$R/shards.log" 2>&1
export LD_LIBRARY_PATH=$PWD/.gpu3/lib:$LD_LIBRARY_PATH
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --validation.enable=false --training.steps 36)
L=(bench/gpu/llama3_1b.toml --training.dataset_path $S/llama.bin --validation.enable=false --training.steps 20 --nproc-per-node 2 --parallelism.data_parallel_shard_degree 2)
run() { n=$1; shift; rm -rf "$S/o"
  timeout 80 env "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
for r in 1 2; do
  run one_$r CUDA_VISIBLE_DEVICES=0 .gpu3/trainrun --nproc-per-node 1 "${G[@]}"
  if [ $r = 1 ]; then o="hi low"; else o="low hi"; fi
  for p in $o; do
    run ddp_${p}_$r TRAINRUN_NCCL_PRIORITY=$p .gpu3/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}"
    run fsdp_${p}_$r TRAINRUN_NCCL_PRIORITY=$p .gpu3/trainrun "${L[@]}"
  done
done
python3 - "$R" > "$R/table.txt" <<'PY'
import glob,json,os,statistics,sys,re
R=sys.argv[1]; groups={}
for f in sorted(glob.glob(R+"/*.metrics.jsonl")):
    n=os.path.basename(f)[:-len(".metrics.jsonl")]
    t=[json.loads(l).get("tps") for l in open(f)]; t=[x for x in t[8:] if x]
    if not t: continue
    g=re.sub(r"_[0-9]+$","",n); groups.setdefault(g,[]).append(statistics.median(t))
for g,v in sorted(groups.items()): print(f"{g:14s} {statistics.median(v):10.0f} [{min(v):.0f}-{max(v):.0f}] n={len(v)}")
PY
cd "$OUT" && tar czf c5.tgz r
