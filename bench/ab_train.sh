#!/usr/bin/env bash
# bench/ab_train.sh: two builds of trainrun, A and B, on the same GPU jobs in
# one call, alternating order, to tell whether a change costs speed:
#
#   bench/ab_train.sh A_DIR B_DIR OUTDIR [RUNS]
#
# A_DIR and B_DIR each hold a `trainrun` (a wrapper script or the binary)
# that runs on this machine. Jobs, each RUNS times per build (default 3),
# A then B on odd rounds and B then A on even ones:
#   gpt2   GPT-2 124M on one GPU (bench/gpu/gpt2_124m.toml, B64 T1024)
#   fsdp   Llama 3.2 1B, FSDP over 2 GPUs (bench/gpu/llama3_1b.toml,
#          B8 T2048 per GPU), when 2 GPUs are visible
#   ddp    GPT-2 124M, DDP over 2 GPUs (B64 T1024 per GPU, the default
#          configuration: data_parallel_replicate_degree 2), when 2 GPUs
#          are visible
#   llama  Llama 3.2 1B on one GPU (B8 T2048)
#   docs   Llama 3.2 1B on one GPU, attn_mask_type = "block_causal", B2
#          T8192 on documents of mean length 1024 (make_shard.py --eot
#          128001 --doc-len 1024), parallel_gpu.sh's flex job
# on the same random-token shards (bench/gpu/make_shard.py, fixed seeds).
# A run's figure is the median tokens/s per GPU over its steps after
# AB_SKIP (metrics.jsonl); the table gives each build's median over runs
# with the spread (min-max) and B / A. Raw logs and JSONL stay in OUTDIR.
#
# Environment: AB_GPT2_STEPS (40), AB_FSDP_STEPS (24, also llama and
# docs), AB_SKIP (8),
# AB_JOBS ("gpt2 fsdp"), PYTHON (python3), AB_TIMEOUT (s per run, 240),
# AB_GPUS (the GPUs the jobs run on, "0,1": one-GPU jobs take the first, so
# that a call can run this beside other work on a machine's other GPUs; one
# index runs only the one-GPU jobs),
# AB_ENV_A and AB_ENV_B (VAR=value words that side's runs get in their
# environment: one build against itself with another setting, e.g.
# `AB_ENV_B="TRAINRUN_CUDNN_ATTN_CONFIG=2" bench/ab_train.sh .gpu .gpu OUT`).
set -u

[ $# -ge 3 ] || {
  echo "usage: bench/ab_train.sh A_DIR B_DIR OUTDIR [RUNS]" >&2
  exit 2
}
A=$1 B=$2 OUT=$3 RUNS=${4:-3}
read -r -a ENV_A <<<"${AB_ENV_A:-}"
read -r -a ENV_B <<<"${AB_ENV_B:-}"
for e in "${ENV_A[@]}" "${ENV_B[@]}"; do
  case $e in
    [A-Za-z_]*=*) ;;
    *)
      echo "ab_train: AB_ENV_A/AB_ENV_B: '$e' is not VAR=value" >&2
      exit 2
      ;;
  esac
done
PY=${PYTHON:-python3}
GPT2_STEPS=${AB_GPT2_STEPS:-40}
FSDP_STEPS=${AB_FSDP_STEPS:-24}
SKIP=${AB_SKIP:-8}
JOBS=${AB_JOBS:-gpt2 fsdp}
TMO=${AB_TIMEOUT:-240}
GPUS=${AB_GPUS:-0,1}
[[ $GPUS =~ ^[0-9]+(,[0-9]+)?$ ]] || {
  echo "ab_train: AB_GPUS '$GPUS' is not one or two GPU indexes, e.g. 1 or 2,3" >&2
  exit 2
}
GPU1=${GPUS%%,*}
for d in "$A" "$B"; do
  [ -x "$d/trainrun" ] || {
    echo "ab_train: no executable $d/trainrun" >&2
    exit 2
  }
done
mkdir -p "$OUT/data" || exit 1
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)

# shards: GPT-2 uint16 over 50257, Llama 3 uint32 over 128256
"$PY" bench/gpu/make_shard.py --out "$OUT/data/gpt2.bin" --tokens 33554432 \
  --vocab 50257 --width 2 --seed 1234 >"$OUT/make_shard.log" 2>&1 || exit 1
"$PY" bench/gpu/make_shard.py --out "$OUT/data/llama.bin" --tokens 16777216 \
  --vocab 128256 --width 4 --seed 1234 >>"$OUT/make_shard.log" 2>&1 || exit 1
case " $JOBS " in *" docs "*)
  "$PY" bench/gpu/make_shard.py --out "$OUT/data/docs.bin" --tokens 16777216 \
    --vocab 128256 --width 4 --seed 1234 --eot 128001 --doc-len 1024 \
    >>"$OUT/make_shard.log" 2>&1 || exit 1 ;;
esac

# run JOB LABEL DIR ROUND: one run into $OUT/JOB-LABEL-ROUND
run() {
  local job=$1 label=$2 dir=$3 r=$4 d="$OUT/$1-$2-$4"
  local gpus=$GPU1 steps=$FSDP_STEPS args
  rm -rf "$d"
  case $job in
    gpt2) steps=$GPT2_STEPS args=(bench/gpu/gpt2_124m.toml gpt2) ;;
    ddp)
      gpus=$GPUS steps=$GPT2_STEPS args=(bench/gpu/gpt2_124m.toml gpt2
        --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2)
      ;;
    fsdp)
      gpus=$GPUS args=(bench/gpu/llama3_1b.toml llama --nproc-per-node 2
        --parallelism.data_parallel_shard_degree 2)
      ;;
    llama) args=(bench/gpu/llama3_1b.toml llama) ;;
    docs)
      args=(bench/gpu/llama3_1b.toml docs --training.local_batch_size 2
        --training.seq_len 8192 --model.attn_mask_type block_causal)
      ;;
    *)
      echo "ab_train: unknown job $job (gpt2 ddp fsdp llama docs)" >&2
      exit 2
      ;;
  esac
  local envs=("${ENV_A[@]}")
  [ "$label" = B ] && envs=("${ENV_B[@]}")
  # args: the job file, the shard's name, then the job's own flags
  env CUDA_VISIBLE_DEVICES=$gpus "${envs[@]}" timeout "$TMO" "$dir/trainrun" "${args[0]}" \
    --training.dataset_path "$OUT/data/${args[1]}.bin" "${args[@]:2}" \
    --training.steps "$steps" --job.dump_folder "$d" \
    --validation.enable=false >"$d.log" 2>&1
  echo "$job $label round $r: exit $?"
  rm -f "$d"/*.safetensors # the weights: GBs nobody reads here
}

for job in $JOBS; do
  case $job in fsdp | ddp) [ "$ngpu" -lt 2 ] || [ "$GPUS" = "$GPU1" ] ;; *) false ;; esac && {
    echo "ab_train: $job needs 2 GPUs ($ngpu visible, AB_GPUS $GPUS): skipped"
    continue
  }
  for r in $(seq 1 "$RUNS"); do
    if [ $((r % 2)) = 1 ]; then
      run "$job" A "$A" "$r"
      run "$job" B "$B" "$r"
    else
      run "$job" B "$B" "$r"
      run "$job" A "$A" "$r"
    fi
  done
done

"$PY" - "$OUT" "$SKIP" "$JOBS" <<'EOF' | tee "$OUT/table.md"
import glob, json, os, statistics, sys
out, skip, jobs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def run_tps(d):
    p = os.path.join(d, "metrics.jsonl")
    if not os.path.exists(p):
        return None
    tps = [json.loads(l)["tps"] for l in open(p) if '"tps"' in l]
    tps = [t for t in tps[skip:] if t]
    return statistics.median(tps) if tps else None
print("| job | A tokens/s per GPU (median [min-max]) | B | B / A |")
print("|---|---|---|---|")
for job in jobs:
    figs = {}
    for lab in "AB":
        v = [run_tps(d) for d in sorted(glob.glob(f"{out}/{job}-{lab}-*"))
             if os.path.isdir(d)]
        figs[lab] = [x for x in v if x]
    if not figs["A"] or not figs["B"]:
        print(f"| {job} | {figs['A']} | {figs['B']} | n/a |")
        continue
    cell = lambda v: f"{statistics.median(v):,.0f} [{min(v):,.0f}-{max(v):,.0f}] (n={len(v)})"
    ratio = statistics.median(figs["B"]) / statistics.median(figs["A"])
    print(f"| {job} | {cell(figs['A'])} | {cell(figs['B'])} | {ratio:.4f} |")
EOF
