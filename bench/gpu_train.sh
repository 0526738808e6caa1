#!/usr/bin/env bash
# bench/gpu_train.sh: bf16 training throughput of trainrun next to llm.c and
# PyTorch on one GPU, on the same random-token data, in one run.
#
#   bench/gpu_train.sh [--dry-run] [gpt2|llama1b] OUTDIR [STEPS]
#   bench/gpu_train.sh --build-llmc DIR      (only build llm.c into DIR)
#
# Run from the repository root on the GPU machine after `. ./env.sh`, with
# a built ./trainrun and karpathy/llm.c (never committed; peers/ is
# ignored) in peers/llm.c with the cudnn-frontend headers in
# peers/llm.c/cudnn-frontend/include.
#
# gpt2 (one H100): GPT-2 124M (d12, vocab 50257, seq 1024, batch 64)
#   trainrun  bench/gpu/gpt2_124m.toml, bf16 compute, fp32 master weights
#   llm.c     train_gpt2cu -e d12 (random init), cuDNN attention, built
#             here from a copy of peers/llm.c patched for CUDA 13
#   PyTorch   bench/peers/gpt2_torch.py eager and torch.compile (fused
#             AdamW, SDPA, bf16 autocast, fp32 weights), and compile with
#             llm.c's padded vocab 50304 when time allows
# llama1b (one H200): Llama 3.2 1B (seq 2048, batch 8), trainrun
#   (bench/gpu/llama3_1b.toml) and bench/peers/llama_torch.py.
#
# Every program reads the same shard (llm.c format, uint16 tokens for GPT-2,
# uint32 for Llama 3) that bench/gpu/make_shard.py writes with a fixed seed,
# syncs once per step, and runs under `timeout` so that one hang does not
# eat the call; a failure prints "failed: see LOG" and the rest go on.
# tokens/s is the median over the steps after the first SKIP (warm-up,
# compilation); MFU counts every program with trainrun's FLOPs per token
# (tr_model_flops_per_token) over the GPU's dense bf16 peak (bench/gpu/
# summarize.py). Logs, shards' checksums and table.md go to OUTDIR.
#
# Environment: BENCH_B (batch), BENCH_T (sequence), BENCH_SKIP,
# BENCH_TIMEOUT (s per program; 150 for gpt2, 240 for llama1b), BENCH_TOKENS (shard size), BENCH_VOCAB
# (token range of the shards), BENCH_GPU (0), BENCH_BUDGET (s after which
# optional runs are skipped, 420), BENCH_DEADLINE (s by which every run has
# ended: timeouts are cut to fit, 540), LLMC_BUILD_TIMEOUT (300), TRAINRUN (./trainrun), TRAINRUN_FLAGS
# (extra overrides), PYTHON (python3), LLMC_SRC (peers/llm.c), LLMC_BIN (a
# built train_gpt2cu: no build), LLMC_FLAGS (extra train_gpt2cu flags),
# TORCH_FLAGS (extra flags for the PyTorch scripts). A CPU smoke test of
# the script itself: TRAINRUN_FLAGS="--training.device cpu --model.flavor
# debugmodel" TORCH_FLAGS="--device cpu --tiny" BENCH_B=2 BENCH_T=64
# BENCH_VOCAB=256 bench/gpu_train.sh gpt2 /tmp/x 6
set -u

usage() {
  echo "usage: bench/gpu_train.sh [--dry-run] [gpt2|llama1b] OUTDIR [STEPS]" >&2
  echo "       bench/gpu_train.sh --build-llmc DIR" >&2
  exit 2
}

PY=${PYTHON:-python3}
TRAINRUN=${TRAINRUN:-./trainrun}
LLMC_SRC=${LLMC_SRC:-peers/llm.c}
TMO=${BENCH_TIMEOUT:-}
BUDGET=${BENCH_BUDGET:-420}
DEADLINE=${BENCH_DEADLINE:-540}
LLMC_BUILD_TMO=${LLMC_BUILD_TIMEOUT:-300}
export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-0}

# llm.c's CUDA 13 fixes, applied to a copy: cudaMemAdvise takes a
# cudaMemLocation (the host) instead of the device id cudaCpuDeviceId (-1).
LLMC_SED='s/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, (cudaMemLocation{cudaMemLocationTypeHost, 0}))/'

dry=0
out=

# Print a command the way a shell would read it back.
show() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
}

# Build llm.c's train_gpt2cu in DST from a patched copy of LLMC_SRC.
llmc_build() {
  dst=$1
  nvcc_bin=$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
  cuda_home=$(dirname "$(dirname "$nvcc_bin")")
  cuda_major=$("$nvcc_bin" --version 2>/dev/null |
    sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')
  # -lcuda and llm.c's -lnvidia-ml: the toolkit's stubs where it has them
  # (the build host need not have a driver), else the driver's .so.1 through
  # a link in DST/linkstubs; without nvml.h llm.c uses no NVML, and an empty
  # libnvidia-ml.so (soname libnvidia-ml.so.1) satisfies its Makefile.
  linkdir=$dst/linkstubs
  ldlibs="-L$linkdir -lnvrtc -lcuda"
  [ -d "$cuda_home/lib64/stubs" ] && ldlibs="-L$cuda_home/lib64/stubs $ldlibs"
  show mkdir -p "$dst"
  show tar -C "$LLMC_SRC" --exclude=./.git --exclude=./build -cf - . '|' \
    tar -C "$dst" -xf -
  echo "# when nvcc is CUDA 13 or newer:"
  show sed -i "$LLMC_SED" "$dst/llmc/cuda_utils.cuh"
  show timeout "$LLMC_BUILD_TMO" make -C "$dst" -j2 train_gpt2cu USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=90 \
    NO_MULTI_GPU=1 NO_USE_MPI=1 "NVCC_LDLIBS=$ldlibs"
  [ "$dry" = 1 ] && return 0
  if [ ! -d "$LLMC_SRC/cudnn-frontend/include" ]; then
    echo "llmc_build: $LLMC_SRC/cudnn-frontend/include is missing" >&2
    return 1
  fi
  mkdir -p "$dst" &&
    (tar -C "$LLMC_SRC" --exclude=./.git --exclude=./build -cf - . |
      tar -C "$dst" -xf -) || return 1
  echo "nvcc: $nvcc_bin (CUDA ${cuda_major:-?})"
  mkdir -p "$linkdir" || return 1
  for lib in cuda nvidia-ml; do
    found=
    for d in "$cuda_home/lib64/stubs" "$cuda_home/lib64" \
      /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
      if [ -e "$d/lib$lib.so" ]; then
        found=$d/lib$lib.so
        break
      elif [ -e "$d/lib$lib.so.1" ]; then
        ln -sf "$d/lib$lib.so.1" "$linkdir/lib$lib.so" || return 1
        found=$d/lib$lib.so.1
        break
      fi
    done
    if [ -z "$found" ] && [ "$lib" = nvidia-ml ]; then
      ${CC:-cc} -shared -Wl,-soname,libnvidia-ml.so.1 -o "$linkdir/libnvidia-ml.so" \
        -x c /dev/null || return 1
      found="an empty stub"
    fi
    echo "lib$lib: ${found:-not found}"
  done
  if [ "${cuda_major:-0}" -ge 13 ]; then
    sed -i "$LLMC_SED" "$dst/llmc/cuda_utils.cuh" || return 1
    if ! grep -q 'cudaMemLocationTypeHost' "$dst/llmc/cuda_utils.cuh"; then
      echo "llmc_build: cannot patch cudaMemAdvise in llmc/cuda_utils.cuh" >&2
      return 1
    fi
  fi
  timeout "$LLMC_BUILD_TMO" make -C "$dst" -j2 train_gpt2cu USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=90 \
    NO_MULTI_GPU=1 NO_USE_MPI=1 "NVCC_LDLIBS=$ldlibs" &&
    test -x "$dst/train_gpt2cu"
}

if [ "${1:-}" = "--build-llmc" ]; then
  [ $# -eq 2 ] || usage
  llmc_build "$2"
  exit $?
fi
if [ "${1:-}" = "--dry-run" ]; then
  dry=1
  shift
fi
mode=${1:-gpt2}
case $mode in
  gpt2 | llama1b) ;;
  *) usage ;;
esac
out=${2:-}
if [ -z "$out" ]; then
  [ "$dry" = 1 ] || usage
  out=${TMPDIR:-/tmp}/gpu_train_dry_run
fi
if [ "$mode" = gpt2 ]; then
  steps=${3:-60}
  B=${BENCH_B:-64}
  T=${BENCH_T:-1024}
  vocab=${BENCH_VOCAB:-50257}
  width=2
  ntok=${BENCH_TOKENS:-33554432}
  toml=bench/gpu/gpt2_124m.toml
  TMO=${TMO:-150}
  torch_script=bench/peers/gpt2_torch.py
else
  steps=${3:-30}
  B=${BENCH_B:-8}
  T=${BENCH_T:-2048}
  vocab=${BENCH_VOCAB:-128256}
  width=4
  ntok=${BENCH_TOKENS:-16777216}
  toml=bench/gpu/llama3_1b.toml
  TMO=${TMO:-240} # torch.compile of 16 Llama blocks takes a while
  torch_script=bench/peers/llama_torch.py
fi
case $steps in
  '' | *[!0-9]*) usage ;;
esac
skip=${BENCH_SKIP:-$((steps / 5 > 3 ? steps / 5 : 3))}
if [ "$skip" -ge "$steps" ]; then
  echo "gpu_train: STEPS ($steps) must exceed the warm-up steps ($skip)" >&2
  exit 2
fi
data=$out/data
llmc_dir=$out/llmc-build
llmc_bin=${LLMC_BIN:-$llmc_dir/train_gpt2cu}

# run NAME CMD...: CMD under timeout, its output in OUTDIR/NAME.log and its
# exit status in OUTDIR/NAME.rc; a failure is reported and the caller goes on.
# The timeout is TMO, cut so that the whole script ends by DEADLINE.
run() {
  name=$1
  shift
  show timeout -k 10 "$TMO" "$@"
  [ "$dry" = 1 ] && return 0
  tmo=$((DEADLINE - SECONDS - 15))
  [ "$tmo" -gt "$TMO" ] && tmo=$TMO
  if [ "$tmo" -lt 20 ]; then
    echo "  $name: skipped ($SECONDS s used, deadline $DEADLINE s)"
    echo skipped > "$out/$name.rc"
    return 0
  fi
  t0=$SECONDS
  timeout -k 10 "$tmo" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "$rc" > "$out/$name.rc"
  if [ "$rc" -eq 0 ]; then
    echo "  $name: done in $((SECONDS - t0)) s"
  else
    [ "$rc" -eq 124 ] && echo "  $name: timed out after $tmo s"
    echo "  $name failed (exit $rc): see $out/$name.log"
    tail -n 5 "$out/$name.log" | sed 's/^/    | /'
  fi
  return 0
}

# Optional runs start only while the time budget allows.
in_budget() {
  [ "$dry" = 1 ] && return 0
  if [ "$SECONDS" -gt "$BUDGET" ]; then
    echo "  $1: skipped ($SECONDS s used, budget $BUDGET s)"
    echo skipped > "$out/$1.rc"
    return 1
  fi
  return 0
}

echo "== gpu_train $mode: B=$B T=$T steps=$steps (median of steps > $skip)" \
  "out=$out"
if [ "$dry" = 0 ]; then
  mkdir -p "$out" "$data" || exit 1
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
      --format=csv 2>&1
    nvcc --version 2>&1 | tail -n 2
    "$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
    "$TRAINRUN" --version
  } > "$out/env.txt" 2>&1
  cat "$out/env.txt"
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null |
  head -n 1)

# 1. llm.c builds in the background while the shards are written
llmc_pid=
if [ "$mode" = gpt2 ] && [ -n "${LLMC_BIN:-}" ]; then
  echo "-- llm.c: prebuilt $LLMC_BIN"
elif [ "$mode" = gpt2 ]; then
  echo "-- llm.c build (log: $out/llmc_build.log)"
  if [ "$dry" = 1 ]; then
    llmc_build "$llmc_dir"
  else
    (
      t0=$SECONDS
      llmc_build "$llmc_dir"
      rc=$?
      echo "build exit $rc after $((SECONDS - t0)) s"
      exit $rc
    ) > "$out/llmc_build.log" 2>&1 &
    llmc_pid=$!
  fi
fi

echo "-- shards"
run make_shard "$PY" bench/gpu/make_shard.py --out "$data/train.bin" \
  --tokens "$ntok" --vocab "$vocab" --width "$width" --seed 1234
if [ "$mode" = gpt2 ]; then # llm.c's -j
  run make_val_shard "$PY" bench/gpu/make_shard.py --out "$data/val.bin" \
    --tokens 1048576 --vocab "$vocab" --width "$width" --seed 4321
fi
if [ "$dry" = 0 ] && [ ! -s "$data/train.bin" ]; then
  echo "gpu_train: no training shard; see $out/make_shard.log" >&2
  exit 1
fi

if [ -n "$llmc_pid" ]; then
  wait "$llmc_pid"
  rc=$?
  echo "$rc" > "$out/llmc_build.rc"
  tail -n 1 "$out/llmc_build.log"
  [ "$rc" -ne 0 ] && echo "  llm.c build failed: see $out/llmc_build.log"
fi

# 2. trainrun
echo "-- trainrun"
[ "$dry" = 1 ] || rm -rf "$out/trainrun"
# shellcheck disable=SC2086
run trainrun "$TRAINRUN" "$toml" --training.dataset_path "$data/train.bin" \
  --training.local_batch_size "$B" --training.seq_len "$T" \
  --training.steps "$steps" --job.dump_folder "$out/trainrun" \
  ${TRAINRUN_FLAGS:-}

# 3. llm.c (-v, -s: no evaluation or sampling inside the run; they divide by
# both, so never 0)
if [ "$mode" = gpt2 ]; then
  echo "-- llm.c"
  if [ "$dry" = 1 ] || [ -x "$llmc_bin" ]; then
    # shellcheck disable=SC2086
    run llmc "$llmc_bin" -i "$data/train.bin" -j "$data/val.bin" \
      -e d12 -b "$B" -t "$T" -x "$steps" -v 1000000 -s 1000000 -m 1 -g 2 \
      ${LLMC_FLAGS:-}
  else
    echo "  llmc failed: no $llmc_bin, see $out/llmc_build.log"
    echo build > "$out/llmc.rc"
  fi
fi

# 4. PyTorch
echo "-- PyTorch"
targs=(--data "$data/train.bin" -B "$B" -T "$T" --steps "$steps" --skip "$skip")
# shellcheck disable=SC2086
run torch_eager "$PY" "$torch_script" "${targs[@]}" ${TORCH_FLAGS:-}
# shellcheck disable=SC2086
run torch_compile "$PY" "$torch_script" "${targs[@]}" --compile ${TORCH_FLAGS:-}
if [ "$mode" = gpt2 ] && in_budget torch_compile_v50304; then
  # shellcheck disable=SC2086
  run torch_compile_v50304 "$PY" "$torch_script" "${targs[@]}" --compile \
    --vocab 50304 ${TORCH_FLAGS:-}
fi

# 5. the table
echo "-- table"
sargs=(--mode "$mode" --out "$out" --skip "$skip" -B "$B" -T "$T"
  --gpu "${gpu_name:-unknown}")
show "$PY" bench/gpu/summarize.py "${sargs[@]}"
[ "$dry" = 1 ] && exit 0
"$PY" bench/gpu/summarize.py "${sargs[@]}"
