#!/usr/bin/env bash
# bench/async_ckpt.sh: the true cost of asynchronous checkpoints on GPUs
# (issue 22 item 1), in one call: Llama 3.2 1B with FSDP over N GPUs
# (bench/gpu/ckpt_llama3_1b.toml: model + AdamW state, 12 bytes a
# parameter, 14.8 GB a save) saving every INTERVAL steps with
# async_with_pinned_mem, and per save the stall training really paid
# (bench/gpu/ckpt_stall.py: the wall time of the save and the three steps
# after it against steps without a save), a markdown table of every save.
#
#   bench/async_ckpt.sh [--nproc N] [--saves K] [--interval I] [--cpu-smoke]
#
# Run from the repository root on the GPU host. The sub-runs, in order:
#
#   device_bench  bench/ckpt_bench --device cuda --gb CK_BENCH_GB (when
#                 CKPT_BENCH names the program): device tensors saved
#                 with async_with_pinned_mem, each followed at once by an
#                 "update" of every tensor on the device; the checkpoint
#                 must load bit for bit as it was before the update; the
#                 device-to-host copy rate
#   data          bench/gpu/make_shard.py: random Llama 3 tokens in SCRATCH
#   new           TRAINRUN: K saves (steps I, 2I, ... KI), then 5 more steps
#                 (the last one's save: model only, bf16, synchronous)
#   base          the same with TRAINRUN_BASE, when set (e.g. a build of
#                 the commit before, in the same call on the same machine)
#   summary       OUT/summary.md: ckpt_stall.py's rows for each run
#
# Each sub-run's output is in OUT/NAME.log, its exit status in OUT/NAME.rc,
# its metrics in OUT/NAME.metrics.jsonl; the checkpoints (SCRATCH, a local
# disk) are removed after each run. OUT/env.txt: the GPUs, driver, CUDA,
# NCCL, disk and memory.
#
# Environment: TRAINRUN (./trainrun), TRAINRUN_BASE (unset: no base run),
# CKPT_BENCH (unset: no device_bench), CK_BENCH_GB (4), AC_DATA (a Llama
# token shard to use instead of making one), OUT (./out),
# SCRATCH (/tmp/trainrun-async-ckpt), PYTHON (python3), AC_TMO (s per
# training run, 240), AC_MODE (async_with_pinned_mem).
set -u

usage() {
  echo "usage: bench/async_ckpt.sh [--nproc N] [--saves K] [--interval I] [--cpu-smoke]" >&2
  exit 2
}

N=2 K=3 I=80 smoke=0
while [ $# -gt 0 ]; do
  case $1 in
    --nproc) [ $# -ge 2 ] || usage; N=$2; shift ;;
    --saves) [ $# -ge 2 ] || usage; K=$2; shift ;;
    --interval) [ $# -ge 2 ] || usage; I=$2; shift ;;
    --cpu-smoke) smoke=1 ;;
    *) usage ;;
  esac
  shift
done
for v in "$N" "$K" "$I"; do
  case $v in '' | *[!0-9]* | 0) usage ;; esac
done

PY=${PYTHON:-python3}
TRAINRUN=${TRAINRUN:-./trainrun}
OUT=${OUT:-./out}
SCRATCH=${SCRATCH:-/tmp/trainrun-async-ckpt}
TMO=${AC_TMO:-240}
MODE=${AC_MODE:-async_with_pinned_mem}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" "$SCRATCH"
STEPS=$((K * I + 5))

if [ "$smoke" = 1 ]; then
  DEV=(--training.device cpu --model.name llama3 --model.flavor debugmodel)
  B=2 T=64 VOCAB=256 TOKENS=200000
else
  DEV=()
  B=4 T=2048 VOCAB=128256 TOKENS=16777216
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "command: bench/async_ckpt.sh --nproc $N --saves $K --interval $I"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -5
  nvcc --version 2>&1 | tail -2
  ls /usr/lib/x86_64-linux-gnu/libnccl.so.* 2>/dev/null
  echo "cpus: $(nproc)"
  free -g | head -2
  df -h "$SCRATCH" | tail -1
  uname -r
} > "$OUT/env.txt" 2>&1

# 1. the device path alone: bit-exact and the copy rate
if [ -n "${CKPT_BENCH:-}" ]; then
  echo "-- device_bench: $CKPT_BENCH --device cuda --gb ${CK_BENCH_GB:-4}"
  timeout -k 10 120 "$CKPT_BENCH" --device cuda --gb "${CK_BENCH_GB:-4}" \
    --saves 3 --dir "$SCRATCH" > "$OUT/device_bench.log" 2>&1
  echo $? > "$OUT/device_bench.rc"
  cat "$OUT/device_bench.log"
fi

# 2. data
data=${AC_DATA:-$SCRATCH/llama.bin}
if [ ! -s "$data" ]; then
  "$PY" "$here/gpu/make_shard.py" --out "$data" --tokens "$TOKENS" \
    --vocab "$VOCAB" --width 4 > "$OUT/data.log" 2>&1 ||
    { echo "async_ckpt: no data (see $OUT/data.log)" >&2; exit 1; }
fi

# 3. the runs
gpus=$(seq -s, 0 $((N - 1)))
train() {
  local name=$1 bin=$2 dir=$SCRATCH/dump-$1
  rm -rf "$dir"
  echo "-- $name: $bin, Llama 3.2 1B FSDP over $N, $MODE, saves at every $I steps, $STEPS steps"
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "$TMO" "$bin" --nproc-per-node "$N" \
    "$here/gpu/ckpt_llama3_1b.toml" --training.dataset_path "$data" \
    --training.local_batch_size "$B" --training.seq_len "$T" \
    --training.steps "$STEPS" --job.dump_folder "$dir" \
    --parallelism.data_parallel_shard_degree "$N" \
    --checkpoint.interval "$I" --checkpoint.async_mode "$MODE" \
    --checkpoint.keep_latest_k 2 --metrics.log_freq 1 "${DEV[@]}" \
    > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$OUT/$name.rc"
  echo "   exit $rc after $((SECONDS - t0)) s"
  [ -f "$dir/metrics.jsonl" ] && cp "$dir/metrics.jsonl" "$OUT/$name.metrics.jsonl"
  du -sb "$dir"/checkpoint/step-* > "$OUT/$name.ckpt_sizes" 2>/dev/null
  rm -rf "$dir"
}
train new "$TRAINRUN"
[ -n "${TRAINRUN_BASE:-}" ] && train base "$TRAINRUN_BASE"

# 4. the table
{
  echo "Llama 3.2 1B, FSDP over $N GPUs, batch $B x $T per GPU, $MODE, a save every $I steps"
  echo
  echo "| build | save | wall stall s | s per GB a rank | trainer's stall s | step after s | steps while writing s | step without save s | save call held s | copy GB/s | write s |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for name in new base; do
    [ -f "$OUT/$name.metrics.jsonl" ] || continue
    "$PY" "$here/gpu/ckpt_stall.py" --label "$name" --log "$OUT/$name.log" \
      --metrics "$OUT/$name.metrics.jsonl" --json "$OUT/$name.stall.json"
  done
} > "$OUT/summary.md" 2>&1
cat "$OUT/summary.md"
