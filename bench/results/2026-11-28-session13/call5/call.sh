#!/bin/bash
# session 13 call 5 (2 GPUs): GPT-2 DDP (new build .gpu2) against NCCL's protocol/algorithm choice; one GPU baseline; alternating
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 400; cd "$OUT" && tar czf c5.tgz r) &
S=/tmp/s13; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 16000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --validation.enable=false --training.steps 40)
run() { n=$1; shift; rm -rf "$S/o"
  timeout 90 env "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
one() { run one_$1 CUDA_VISIBLE_DEVICES=0 .gpu2/trainrun --nproc-per-node 1 "${G[@]}"; }
ddp() { v=$1 r=$2; case $v in base) e=(X=1);; simple) e=(NCCL_PROTO=Simple);; ll128) e=(NCCL_PROTO=LL128);; dbg) e=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING);; esac
  run ddp_${v}_$r "${e[@]}" .gpu2/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}"; }
ddp dbg 0
one 1
for v in base simple ll128; do ddp $v 1; done
one 2
for v in ll128 simple base; do ddp $v 2; done
one 3
for v in base simple ll128; do ddp $v 3; done
grep -ih "proto\|algo\|tuning\|NCCL version" $R/ddp_dbg_0.log | head -40 > "$R/nccl_tuning.txt"
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
cd "$OUT" && tar czf c5.tgz r
