#!/bin/bash
# session 13 call 7 (2 GPUs): GPT-2 DDP with the backward's GEMMs leaving SMs to the all-reduces (cuBLASLt SM count target; .gpu3 = smreserve 9d849f7), alternating
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 225; cd "$OUT" && tar czf c7.tgz r) &
S=/tmp/s13; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 12000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --validation.enable=false --training.steps 36)
export LD_LIBRARY_PATH=$PWD/.gpu3/lib:$LD_LIBRARY_PATH
run() { n=$1; shift; rm -rf "$S/o"
  timeout 60 env "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
one() { run one_$1 CUDA_VISIBLE_DEVICES=0 .gpu3/trainrun --nproc-per-node 1 "${G[@]}"; }
ddp() { run ddp_r$1_$2 TRAINRUN_DDP_SM_RESERVE=$1 .gpu3/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}"; }
one 1
for v in 0 16 24 40; do ddp $v 1; done
one 2
for v in 40 24 16 0; do ddp $v 2; done
python3 - "$R" > "$R/table.txt" <<'PY'
import glob,json,os,statistics,sys,re
R=sys.argv[1]; groups={}
for f in sorted(glob.glob(R+"/*.metrics.jsonl")):
    n=os.path.basename(f)[:-len(".metrics.jsonl")]
    t=[json.loads(l).get("tps") for l in open(f)]; t=[x for x in t[10:] if x]
    if not t: continue
    g=re.sub(r"_[0-9]+$","",n); groups.setdefault(g,[]).append(statistics.median(t))
base=statistics.median(groups.get("one",[0])) or 1
for g,v in groups.items(): print(f"{g:14s} {statistics.median(v):10.0f} [{min(v):.0f}-{max(v):.0f}] n={len(v)}  {statistics.median(v)/base:.4f}")
PY
cd "$OUT" && tar czf c7.tgz r
