#!/usr/bin/env bash
# bench/gpu/protocol_loop.sh: one call's shares of issue 22's protocol for one
# mode (bench/gpu/protocol_call.sh), one after another, each planned from the
# runs before it, until the protocol is complete, nothing left fits the call,
# or fewer than 90 s of it are left. PyTorch's compile caches stay in CACHE
# on the machine, so a call that follows at once (the machine still warm)
# compiles warm; they do not come back (over 60 MiB compressed).
#
#   bench/gpu/protocol_loop.sh gpt2|llama1b|multigpu OUTDIR [CACHE]
#
# Run from the repository's root on the lent machine. Writes into $OUT (the
# call's folder, default ./out): share<i>.log (each share's plan and runs),
# runs.txt (one line a share), smi.csv (nvidia-smi each second) and
# results.tgz (OUTDIR, packed after each share and once more before END:
# `tar xzf results.tgz` in the repository's root, then commit). CACHE:
# .gpucache-MODE.
#
# Environment: G (the staged build, bench/gpu/stage.sh's folder: .gpu),
# END (seconds into the loop by which every run has ended: 560), GPUS (the
# GPUs: gpt2 and llama1b one index, bench/gpu_train.sh's BENCH_GPU, default
# 0; multigpu a list for CUDA_VISIBLE_DEVICES, default all), NPROC
# (multigpu: 2), SCRATCH (the runs' shards and dump folders; default
# bench/gpu_train.sh's and bench/multi_gpu.sh's), LLMC_BIN (a built
# train_gpt2cu; default peers/llmc-bin/train_gpt2cu). Exit 0, or 2 on a
# usage error.
set -u
mode=${1:-} out_dir=${2:-}
case $mode in
  gpt2 | llama1b | multigpu) ;;
  *)
    echo "usage: bench/gpu/protocol_loop.sh gpt2|llama1b|multigpu OUTDIR [CACHE]" >&2
    exit 2
    ;;
esac
[ -n "$out_dir" ] || {
  echo "protocol_loop: no OUTDIR" >&2
  exit 2
}
cache=${3:-.gpucache-$mode}
G=${G:-.gpu}
END=${END:-560}
OUT=${OUT:-./out}
[ -x "$G/trainrun" ] || {
  echo "protocol_loop: no staged build in G=$G (bench/gpu/stage.sh)" >&2
  exit 2
}
mkdir -p "$OUT" || exit 2
# shellcheck disable=SC1091
. "$G/env.sh" > /dev/null 2>&1
if [ "$mode" = multigpu ]; then
  [ -n "${GPUS:-}" ] && export CUDA_VISIBLE_DEVICES=$GPUS
  [ -n "${SCRATCH:-}" ] && export MG_SCRATCH=$SCRATCH
else
  export BENCH_GPU=${GPUS:-0}
  [ -n "${SCRATCH:-}" ] && export BENCH_SCRATCH=$SCRATCH
fi
root=$PWD
pack() { (cd "$OUT" && tar czf results.tgz -C "$root" "$out_dir" 2> /dev/null); }
(
  sleep $((END + 25))
  pack
) &
packer=$!
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu \
  --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 &
smi=$!
i=0
while :; do
  left=$((END - SECONDS))
  [ $left -ge 90 ] || break
  i=$((i + 1))
  BUDGET=$((left - 20)) BENCH_DEADLINE=$left MG_DEADLINE=$left \
    TRAINRUN=$G/trainrun LLMC_BIN=${LLMC_BIN:-$root/peers/llmc-bin/train_gpt2cu} \
    bench/gpu/protocol_call.sh "$mode" "$out_dir" "$cache" > "$OUT/share$i.log" 2>&1
  echo "share $i rc=$? $(date +%T) $(grep -m1 '^PROGRAMS=' "$OUT/share$i.log")" >> "$OUT/runs.txt"
  pack
  # no PROGRAMS line: complete, or nothing fits what is left
  grep -q '^PROGRAMS=' "$OUT/share$i.log" || break
done
kill "$smi" "$packer" 2> /dev/null
pack
cat "$OUT/runs.txt" 2> /dev/null
exit 0
