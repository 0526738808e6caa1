#!/bin/bash
# a later call (2 GPUs, kind nvidia-h200-x2; carry [".gpu"]): issue 22 item 4 (DDP scaling) experiments, GPT-2 124M B64 per GPU,
# alternating, 2 rounds: one GPU (baseline), DDP with TRAINRUN_DDP_BUCKET_MB 25 (default) / 100 / 10 (.gpu = main). (Session 14's NCCL priority branch was lost with its checkout.)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 570; cd "$OUT" && tar czf ddp.tgz r) &
S=/tmp/s17; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 12000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --validation.enable=false --training.steps 36)
D=(--nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2)
run() { n=$1; shift; rm -rf "$S/o"
  timeout 80 env "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
for r in 1 2; do
  if [ $r = 1 ]; then o="one b25 b100 b10"; else o="b10 b100 b25 one"; fi
  for p in $o; do
    case $p in
      one) run one_$r CUDA_VISIBLE_DEVICES=0 .gpu/trainrun --nproc-per-node 1 "${G[@]}" ;;
      b*) run ddp_${p}_$r TRAINRUN_DDP_BUCKET_MB=${p#b} .gpu/trainrun "${D[@]}" "${G[@]}" ;;
    esac
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
one=statistics.median(groups.get("one",[0])) or None
for g,v in sorted(groups.items()):
    m=statistics.median(v); per=m  # tps is per GPU
    print(f"{g:14s} {m:10.0f} [{min(v):.0f}-{max(v):.0f}] n={len(v)}" + (f"  scaling {100*per/one:.1f}%" if one and g!="one" else ""))
PY
cd "$OUT" && tar czf ddp.tgz r
