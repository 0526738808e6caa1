#!/bin/bash
# session 13 call 3 (2 GPUs): GPT-2 DDP scaling against NCCL's CTA count (NCCL_MAX_CTAS), one GPU baseline, alternating
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 560; cd "$OUT" && tar czf c3.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
S=/tmp/s13; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 16000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --validation.enable=false --training.steps 40)
run() { n=$1; shift; rm -rf "$S/o"
  timeout 90 env "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
one() { run one_$1 CUDA_VISIBLE_DEVICES=0 .gpu/trainrun --nproc-per-node 1 "${G[@]}"; }
ddp() { v=$1 r=$2; if [ "$v" = base ]; then e=(X=1); else e=(NCCL_MAX_CTAS=$v); fi
  run ddp_${v}_$r "${e[@]}" .gpu/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}"; }
one 1
for v in base 2 4 8 16; do ddp $v 1; done
one 2
for v in 16 8 4 2 base; do ddp $v 2; done
one 3
for v in base 2 4 8 16; do ddp $v 3; done
run ddp_base_ov X=1 .gpu/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}" --metrics.comm_overlap=true
run ddp_4_ov NCCL_MAX_CTAS=4 .gpu/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}" --metrics.comm_overlap=true
kill $SMI
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
cd "$OUT" && tar czf c3.tgz r
