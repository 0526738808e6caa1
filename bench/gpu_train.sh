#!/usr/bin/env bash
# bench/gpu_train.sh: bf16 training throughput of trainrun against every
# configuration of llm.c and PyTorch that can be their best, on one GPU, on
# the same random-token data, by the protocol of issue 22 (bench/benchlib.sh):
# the programs alternate order over rounds, each runs REPS times, a table of
# medians [min-max] with every figure pointing at its raw file.
#
#   bench/gpu_train.sh [--dry-run] [gpt2|llama1b] OUTDIR [STEPS]
#   bench/gpu_train.sh --build-llmc DIR      (only build llm.c into DIR)
#   bench/gpu_train.sh --list gpt2|llama1b   (the program keys)
#
# Run from the repository root on the GPU machine after `. ./env.sh` (or
# with TRAINRUN=.gpu/trainrun), with karpathy/llm.c (never committed;
# peers/ is ignored) in peers/llm.c with the cudnn-frontend headers in
# peers/llm.c/cudnn-frontend/include.
#
# The programs (keys for PROGRAMS), in the order of an odd round:
#
# gpt2 (one H100): GPT-2 124M (d12, vocab 50257, seq 1024, batch 64)
#   trainrun      bench/gpu/gpt2_124m.toml: bf16 compute, residual stream
#                 in bf16, fp32 master weights and AdamW state, clipping 1.0
#   llmc          llm.c train_gpt2cu -e d12 (random init) with its defaults
#                 (-r 1: GELU recomputed, -ge 0: no GELU fusion), cuDNN
#                 attention, built here from a copy of peers/llm.c patched
#                 for CUDA 13; llmc_r0_ge1 adds -r 0 -ge 1 (no recompute,
#                 GELU fused into the forward GEMM), llmc_r0_ge2 -r 0 -ge 2
#                 (forward and backward); all with -c 0.1 (weight decay)
#   torch_MODE[_v50304][_nosync]   bench/peers/gpt2_torch.py (fp32 weights,
#                 bf16 autocast: the residual stream in fp32, fused AdamW,
#                 SDPA, clipping 1.0 as trainrun) with MODE eager (once, no
#                 variants: never the fastest), compile (torch.compile's
#                 default mode), compile_tunable (the same with PyTorch's
#                 TunableOp: cuBLAS's GEMM candidates timed at each shape's
#                 first call, as trainrun's TRAINRUN_GEMM_TUNE does),
#                 autotune (max-autotune: CUDA graphs, Triton GEMMs, its
#                 GEMM choices benchmarked), autotune_nocg
#                 (max-autotune-no-cudagraphs); _v50304:
#                 llm.c's padded vocabulary 50304 (FLOPs still counted for
#                 50257); _nosync: no host sync per step (--no-sync: CUDA
#                 events time the steps, the losses are read at the end)
# llama1b (one H200 or H100): Llama 3.2 1B (seq 2048, batch 8): trainrun
#   (bench/gpu/llama3_1b.toml) and bench/peers/llama_torch.py in the same
#   torch_MODE[_nosync] configurations (its vocabulary, 128256, needs no
#   padding).
#
# The rounds: FIRST_REP (1) to FIRST_REP + REPS - 1 (REPS: 3); odd rounds
# run the programs in the order above, even rounds in reverse. A call is at
# most 10 minutes on the lent machines, and a max-autotune compile takes
# minutes, so split the rounds over calls with PROGRAMS (a subset of the
# keys, space- or comma-separated) and FIRST_REP; each call adds its runs
# to OUTDIR (keep it, or copy the earlier calls' files into it) and the
# summary takes every run it finds there:
#
#   PROGRAMS="trainrun llmc llmc_r0_ge1 llmc_r0_ge2 torch_eager" \
#     bench/gpu_train.sh gpt2 OUT                      (3 rounds, one call)
#   PROGRAMS="trainrun torch_compile torch_compile_nosync" REPS=2 \
#     bench/gpu_train.sh gpt2 OUT                      (rounds 1, 2)
#   PROGRAMS="trainrun torch_compile torch_compile_nosync" FIRST_REP=3 \
#     REPS=1 bench/gpu_train.sh gpt2 OUT               (round 3)
#
# Every program reads the same shard (llm.c format, uint16 tokens for GPT-2,
# uint32 for Llama 3) that bench/gpu/make_shard.py writes with a fixed seed
# in SCRATCH (its sha256 in OUTDIR/shards.txt), and runs under `timeout`
# so that one hang does not eat the call; a failure (a crash of a
# max-autotune compile, a timeout) is recorded as "failed" in the table and
# the rest go on. Run NAME = KEY_rR writes OUTDIR/NAME.log, NAME.rc,
# NAME.cmd (the command), NAME.wall (its seconds), and the per-step JSON
# lines: trainrun's
# metrics.jsonl as NAME.metrics.jsonl, a peer's lines as NAME.jsonl
# (llm.c's step lines are in NAME.log). OUTDIR/versions-CALL_ID.txt: the
# call's GPU, driver, CUDA, NCCL, PyTorch, llm.c's commit, trainrun's git
# commit; OUTDIR/bench.conf the shape (a later call must use the same).
# Calls on machines that start with an empty OUTDIR each: copy their
# folders into one (cp -n A/* B/* ALL/) and run
# `python3 bench/gpu/summarize.py --out ALL` there. Then bench/gpu/summarize.py writes OUTDIR/README.md: per program
# the median over its runs [min-max] of each run's median tokens/s after
# the first SKIP steps (warm-up, compilation), MFU with trainrun's FLOPs
# per token over the GPU's dense bf16 peak, trainrun against the fastest
# PyTorch configuration and the fastest llm.c one.
#
# Environment: PROGRAMS, FIRST_REP, REPS (above), BENCH_B (batch), BENCH_T
# (sequence), BENCH_SKIP, BENCH_TIMEOUT (s per program; 150 for gpt2, 240
# for llama1b), BENCH_TIMEOUT_AUTOTUNE (s for the max-autotune and TunableOp
# programs: 420 for gpt2, 540 for llama1b, whose cold max-autotune compile took
# 388 s before step 1 on an H200), BENCH_TOKENS (shard size), BENCH_VOCAB
# (token range of the shards),
# BENCH_GPU (0), BENCH_DEADLINE (s by which every run has ended: timeouts
# are cut to fit, 540), BENCH_SCRATCH (shards, llm.c's build and trainrun's
# dump folders: /tmp/trainrun-gpu-train), LLMC_BUILD_TIMEOUT (300),
# TRAINRUN (./trainrun), TRAINRUN_FLAGS (extra overrides), PYTHON
# (python3), LLMC_SRC (peers/llm.c), LLMC_BIN (a built train_gpt2cu: no
# build; one that is not there exits 2 before any run), LLMC_FLAGS (extra train_gpt2cu flags), TORCH_FLAGS (extra flags
# for the PyTorch scripts). A CPU smoke test of the script itself (llm.c
# needs CUDA: leave it out of PROGRAMS, --dry-run prints its commands):
#   TRAINRUN_FLAGS="--training.device cpu --model.flavor debugmodel" \
#   TORCH_FLAGS="--device cpu --tiny" BENCH_B=2 BENCH_T=64 BENCH_VOCAB=256 \
#   PROGRAMS="trainrun torch_eager torch_compile torch_compile_nosync" \
#   REPS=1 bench/gpu_train.sh gpt2 /tmp/x 6
set -u

usage() {
  echo "usage: bench/gpu_train.sh [--dry-run] [gpt2|llama1b] OUTDIR [STEPS]" >&2
  echo "       bench/gpu_train.sh --list gpt2|llama1b" >&2
  echo "       bench/gpu_train.sh --build-llmc DIR" >&2
  exit 2
}

# shellcheck source=bench/benchlib.sh
. "$(dirname "$0")/benchlib.sh"
PY=${PYTHON:-python3}
TRAINRUN=${TRAINRUN:-./trainrun}
LLMC_SRC=${LLMC_SRC:-peers/llm.c}
TMO=${BENCH_TIMEOUT:-}
TMO_AUTOTUNE=${BENCH_TIMEOUT_AUTOTUNE:-}
DEADLINE=${BENCH_DEADLINE:-540}
SCRATCH=${BENCH_SCRATCH:-/tmp/trainrun-gpu-train}
LLMC_BUILD_TMO=${LLMC_BUILD_TIMEOUT:-300}
export CUDA_VISIBLE_DEVICES=${BENCH_GPU:-0}
cmdline="bench/gpu_train.sh $*"

# llm.c's CUDA 13 fixes, applied to a copy: cudaMemAdvise takes a
# cudaMemLocation (the host) instead of the device id cudaCpuDeviceId (-1).
LLMC_SED='s/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, (cudaMemLocation{cudaMemLocationTypeHost, 0}))/'

dry=0
out=

# Build llm.c's train_gpt2cu in DST from a patched copy of LLMC_SRC.
llmc_build() {
  # absolute: make runs in DST, where a relative -L path would not resolve
  case $1 in /*) dst=$1 ;; *) dst=$PWD/$1 ;; esac
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
list=0
if [ "${1:-}" = "--dry-run" ]; then
  dry=1
  shift
elif [ "${1:-}" = "--list" ]; then
  list=1 dry=1
  shift
fi
mode=${1:-gpt2}
case $mode in
  gpt2 | llama1b) ;;
  *) usage ;;
esac
out=${2:-}
if [ -z "$out" ]; then
  [ "$dry" = 1 ] || [ "$list" = 1 ] || usage
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
  TMO_AUTOTUNE=${TMO_AUTOTUNE:-420}
  torch_script=bench/peers/gpt2_torch.py
  known="trainrun llmc llmc_r0_ge1 llmc_r0_ge2 $(bench_torch_keys torch v50304)"
else
  steps=${3:-30}
  B=${BENCH_B:-8}
  T=${BENCH_T:-2048}
  vocab=${BENCH_VOCAB:-128256}
  width=4
  ntok=${BENCH_TOKENS:-16777216}
  toml=bench/gpu/llama3_1b.toml
  TMO=${TMO:-240} # torch.compile of 16 Llama blocks takes a while
  TMO_AUTOTUNE=${TMO_AUTOTUNE:-540}
  torch_script=bench/peers/llama_torch.py
  known="trainrun $(bench_torch_keys torch)"
fi
case $steps in
  '' | *[!0-9]*) usage ;;
esac
if [ "$list" = 1 ]; then # every program key of the mode, for summarize --plan
  # shellcheck disable=SC2086
  echo $known
  exit 0
fi
skip=${BENCH_SKIP:-$((steps / 5 > 3 ? steps / 5 : 3))}
if [ "$skip" -ge "$steps" ]; then
  echo "gpu_train: STEPS ($steps) must exceed the warm-up steps ($skip)" >&2
  exit 2
fi
sel=$(bench_select "$known" "$known") || exit 2
read -r -a progs <<< "$sel"
rounds=$(bench_rounds) || exit 2
data=$SCRATCH/data
llmc_dir=$SCRATCH/llmc-build
llmc_bin=${LLMC_BIN:-$llmc_dir/train_gpt2cu}
want_llmc=0
case " ${progs[*]} " in *" llmc"*) [ "$mode" = gpt2 ] && want_llmc=1 ;; esac

# run NAME TMO CMD...: CMD under timeout, its output in OUTDIR/NAME.log,
# the command in NAME.cmd, its exit status in NAME.rc and its wall seconds
# (compilation and start-up included: what a call's plan needs) in
# NAME.wall; a failure is
# reported and the caller goes on. TMO is cut so that the whole call
# ends by DEADLINE; a run that the cut timed out is recorded as skipped
# (NAME.rc "skipped"), still to do for summarize.py --plan, and the
# seconds it ran before the cut in NAME.cut (the plan gives it more).
run() {
  name=$1 tmo=$2 cut=0
  shift 2
  show timeout -k 10 "$tmo" "$@"
  [ "$dry" = 1 ] && return 0
  show "$@" > "$out/$name.cmd"
  left=$((DEADLINE - SECONDS - 15))
  [ "$tmo" -gt "$left" ] && tmo=$left cut=1
  if [ "$tmo" -lt 20 ]; then
    echo "  $name: skipped ($SECONDS s used, deadline $DEADLINE s)"
    echo skipped > "$out/$name.rc"
    return 0
  fi
  t0=$SECONDS
  timeout -k 10 "$tmo" "$@" > "$out/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ] && [ "$cut" = 1 ]; then
    echo "  $name: skipped (cut to $tmo s by the deadline, $DEADLINE s)"
    echo skipped > "$out/$name.rc"
    echo $((SECONDS - t0)) > "$out/$name.cut"
    return 0
  fi
  echo "$rc" > "$out/$name.rc"
  echo $((SECONDS - t0)) > "$out/$name.wall"
  if [ "$rc" -eq 0 ]; then
    echo "  $name: done in $((SECONDS - t0)) s"
  else
    [ "$rc" -eq 124 ] && echo "  $name: timed out after $tmo s"
    echo "  $name failed (exit $rc): see $out/$name.log"
    tail -n 5 "$out/$name.log" | sed 's/^/    | /'
  fi
  return 0
}

echo "== gpu_train $mode: B=$B T=$T steps=$steps (median of steps > $skip)" \
  "rounds ${rounds//$'\n'/ } out=$out"
echo "   programs: ${progs[*]}"
conf="mode=$mode B=$B T=$T steps=$steps skip=$skip"
# a prebuilt llm.c that is not there is the caller's error, not a failed
# run of llm.c: refused before anything is written to OUTDIR
if [ "$dry" = 0 ] && [ "$want_llmc" = 1 ] && [ -n "${LLMC_BIN:-}" ] &&
  [ ! -x "$LLMC_BIN" ]; then
  echo "gpu_train: LLMC_BIN=$LLMC_BIN is not an executable (build it with" \
    "bench/gpu_train.sh --build-llmc DIR, or leave LLMC_BIN unset)" >&2
  exit 2
fi
if [ "$dry" = 0 ]; then
  mkdir -p "$out" "$data" || exit 1
  if [ -s "$out/bench.conf" ] && [ "$(cat "$out/bench.conf")" != "$conf" ]; then
    echo "gpu_train: $out holds runs of another shape ($(cat "$out/bench.conf")," \
      "this call: $conf): use another OUTDIR" >&2
    exit 2
  fi
  echo "$conf" > "$out/bench.conf"
  bench_versions "$out/versions-$CALL_ID.txt" "$cmdline" \
    "$([ "$want_llmc" = 1 ] && echo "$LLMC_SRC")"
  cat "$out/versions-$CALL_ID.txt"
fi

# 1. llm.c builds in the background while the shards are written
llmc_pid=
if [ "$want_llmc" = 1 ] && [ -n "${LLMC_BIN:-}" ]; then
  echo "-- llm.c: prebuilt $LLMC_BIN"
elif [ "$want_llmc" = 1 ] && [ "$dry" = 0 ] && [ -x "$llmc_bin" ]; then
  echo "-- llm.c: built earlier in $llmc_dir"
elif [ "$want_llmc" = 1 ]; then
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

# shard NAME TOKENS SEED: SCRATCH/data/NAME.bin unless it is there, its
# sha256 in OUTDIR/shards.txt
shard() {
  local sf=$data/$1.bin
  if [ "$dry" = 0 ] && [ -s "$sf" ] && [ -s "$sf.sha256" ]; then
    echo "  $1: $sf (written earlier)"
  else
    run "make_shard_$1" 120 "$PY" bench/gpu/make_shard.py --out "$sf" \
      --tokens "$2" --vocab "$vocab" --width "$width" --seed "$3"
    [ "$dry" = 1 ] && return 0
    sha256sum "$sf" > "$sf.sha256" || return 1
  fi
  grep -qxF "$(cat "$sf.sha256")" "$out/shards.txt" 2>/dev/null ||
    cat "$sf.sha256" >> "$out/shards.txt"
}
echo "-- shards"
shard train "$ntok" 1234
[ "$want_llmc" = 1 ] && shard val 1048576 4321 # llm.c's -j
if [ "$dry" = 0 ] && [ ! -s "$data/train.bin" ]; then
  echo "gpu_train: no training shard; see $out/make_shard_train.log" >&2
  exit 1
fi

if [ -n "$llmc_pid" ]; then
  wait "$llmc_pid"
  rc=$?
  echo "$rc" > "$out/llmc_build.rc"
  tail -n 1 "$out/llmc_build.log"
  [ "$rc" -ne 0 ] && echo "  llm.c build failed: see $out/llmc_build.log"
fi

# program KEY NAME: one run of a program
targs=(--data "$data/train.bin" -B "$B" -T "$T" --steps "$steps" --skip "$skip")
program() {
  local key=$1 name=$2 f tmo=$TMO
  case $key in
    trainrun)
      [ "$dry" = 1 ] || rm -rf "${SCRATCH:?}/$name"
      # shellcheck disable=SC2086
      run "$name" "$TMO" "$TRAINRUN" "$toml" --training.dataset_path "$data/train.bin" \
        --training.local_batch_size "$B" --training.seq_len "$T" \
        --training.steps "$steps" --job.dump_folder "$SCRATCH/$name" \
        ${TRAINRUN_FLAGS:-}
      if [ "$dry" = 0 ]; then
        cp "$SCRATCH/$name/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
        rm -rf "${SCRATCH:?}/$name"
      fi
      ;;
    llmc*)
      # -v, -s: no evaluation or sampling inside the run (they divide by
      # both, so never 0); -c 0.1: trainrun's and the peers' weight decay
      f=()
      case $key in
        llmc_r0_ge1) f=(-r 0 -ge 1) ;;
        llmc_r0_ge2) f=(-r 0 -ge 2) ;;
      esac
      if [ "$dry" = 1 ] || [ -x "$llmc_bin" ]; then
        # shellcheck disable=SC2086
        run "$name" "$TMO" "$llmc_bin" -i "$data/train.bin" -j "$data/val.bin" \
          -e d12 -b "$B" -t "$T" -x "$steps" -v 1000000 -s 1000000 -m 1 -g 2 \
          -c 0.1 "${f[@]}" ${LLMC_FLAGS:-}
      else
        echo "  $name failed: no $llmc_bin, see $out/llmc_build.log"
        echo build > "$out/$name.rc"
      fi
      ;;
    torch_*)
      read -r -a f <<< "$(bench_torch_flags "$key")"
      case $key in *autotune* | *tunable*) tmo=$TMO_AUTOTUNE ;; esac
      # shellcheck disable=SC2086
      run "$name" "$tmo" "$PY" "$torch_script" "${targs[@]}" "${f[@]}" ${TORCH_FLAGS:-}
      [ "$dry" = 1 ] || grep '^{' "$out/$name.log" > "$out/$name.jsonl"
      ;;
  esac
}

# 2. the rounds
bench_run_rounds "$rounds" program "${progs[@]}"

# 3. the table, over every run in OUTDIR
echo "-- table"
sargs=(--out "$out")
show "$PY" bench/gpu/summarize.py "${sargs[@]}"
[ "$dry" = 1 ] && exit 0
"$PY" bench/gpu/summarize.py "${sargs[@]}"
