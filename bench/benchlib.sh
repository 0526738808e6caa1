# bench/benchlib.sh: what the GPU benchmark scripts (bench/gpu_train.sh,
# bench/multi_gpu.sh, bench/parallel_gpu.sh) share, sourced by each: the
# round protocol (programs alternate order, each runs REPS times, a call
# runs a subset of the programs from a first round on, so that the rounds
# of one table can be split over calls of at most 10 minutes), the
# configurations of the PyTorch peers, and the versions file.
#
# The protocol, in every script: a program is a key (e.g. torch_compile,
# trainrun); round r runs the selected programs in order when r is odd and
# in reverse order when r is even; run NAME is KEY_rR and its raw output
# goes to OUT/NAME.*; the summary takes every run it finds in OUT, so that
# calls with PROGRAMS (a subset) and FIRST_REP (the first round's number)
# add up to one table:
#
#   PROGRAMS="trainrun torch_compile" FIRST_REP=1 REPS=2 script ...  (call 1)
#   PROGRAMS="trainrun torch_compile" FIRST_REP=3 REPS=1 script ...  (call 2)
#
# gives rounds 1 (in order), 2 (reversed) and 3 (in order). A call's own
# files carry its id (CALL_ID: the UTC start time, versions-CALL_ID.txt),
# so that the OUT folders of calls on a machine that starts empty each time
# merge by copying them into one (cp CALL1/* CALL2/* ALL/) and running the
# summary there.
# shellcheck shell=bash

# this call's id, in the names of its own files (the scripts that source
# this file use it)
# shellcheck disable=SC2034
CALL_ID=$(date -u +%Y%m%dT%H%M%SZ)

# Print a command the way a shell would read it back.
show() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
}

# bench_select KNOWN DEFAULT: the programs of this call, one word each:
# PROGRAMS (space- or comma-separated, each one of KNOWN) when set, else
# DEFAULT. An unknown key is an error naming PROGRAMS (exit 2).
bench_select() {
  local known=" ${1//[$'\n\t']/ } " want p
  want=${PROGRAMS:-$2}
  want=${want//,/ }
  for p in $want; do
    case $known in
      *" $p "*) ;;
      *)
        # shellcheck disable=SC2086
        echo "PROGRAMS: unknown program '$p' (known:" $known")" >&2
        exit 2
        ;;
    esac
  done
  # shellcheck disable=SC2086
  echo $want # one space between the words
}

# bench_rounds: the round numbers of this call, FIRST_REP (1) to
# FIRST_REP + REPS - 1 (REPS: 3); both must be positive integers (exit 2).
bench_rounds() {
  local first=${FIRST_REP:-1} reps=${REPS:-3}
  case "$first$reps" in
    '' | *[!0-9]*)
      echo "FIRST_REP ($first) and REPS ($reps) must be positive integers" >&2
      exit 2
      ;;
  esac
  if [ "$first" -lt 1 ] || [ "$reps" -lt 1 ]; then
    echo "FIRST_REP ($first) and REPS ($reps) must be positive integers" >&2
    exit 2
  fi
  seq "$first" $((first + reps - 1))
}

# bench_round_order R PROGRAM...: the programs in round R's order (reversed
# when R is even).
bench_round_order() {
  local r=$1
  shift
  if [ $((r % 2)) = 0 ]; then
    printf '%s\n' "$@" | tac | tr '\n' ' '
  else
    echo "$*"
  fi
}

# bench_run_rounds ROUNDS FN PROGRAM...: for each round R of ROUNDS, a
# "-- round R: ORDER" line, then FN PROGRAM PROGRAM_rR for each program in
# that round's order (bench_round_order).
bench_run_rounds() {
  local rounds=$1 fn=$2 r p order
  shift 2
  for r in $rounds; do
    order=$(bench_round_order "$r" "$@")
    echo "-- round $r: $order"
    for p in $order; do
      "$fn" "$p" "${p}_r$r"
    done
  done
}

# bench_torch_flags KEY: the flags of a PyTorch peer's configuration key,
# torch_MODE[_v50304][_nosync] with MODE eager (no torch.compile), compile
# (torch.compile, default mode), compile_tunable (the same with TunableOp:
# cuBLAS's GEMM candidates timed at each shape's first use, as trainrun's
# TRAINRUN_GEMM_TUNE does), autotune (mode max-autotune: Triton GEMMs and
# CUDA graphs, its GEMM choices benchmarked), autotune_nocg
# (max-autotune-no-cudagraphs); v50304:
# --vocab 50304 (llm.c's padded vocabulary, GPT-2 only); nosync: --no-sync
# (no host sync per step, timed with CUDA events). Any prefix before
# "torch_" (torch_fsdp2_1b_n2_compile) is ignored up to the mode. Unknown
# keys: exit 2.
bench_torch_flags() {
  local k=$1 f=()
  case $k in
    *_nosync) f+=(--no-sync) k=${k%_nosync} ;;
  esac
  case $k in
    *_v50304) f=(--vocab 50304 "${f[@]}") k=${k%_v50304} ;;
  esac
  case $k in
    *_eager) ;;
    *_compile) f=(--compile "${f[@]}") ;;
    *_compile_tunable) f=(--compile --tunableop "${f[@]}") ;;
    *_autotune) f=(--compile --compile-mode max-autotune "${f[@]}") ;;
    *_autotune_nocg) f=(--compile --compile-mode max-autotune-no-cudagraphs "${f[@]}") ;;
    *)
      echo "bench_torch_flags: '$1' is not torch_MODE[_v50304][_nosync]" >&2
      exit 2
      ;;
  esac
  echo "${f[*]}"
}

# bench_torch_keys PREFIX [v50304]: every configuration key of a PyTorch
# peer (PREFIX_MODE[_v50304][_nosync]), in the order the scripts run them.
bench_torch_keys() {
  local p=$1 m v s keys=()
  keys+=("${p}_eager")
  for m in compile compile_tunable autotune autotune_nocg; do
    for v in "" ${2:+_$2}; do
      for s in "" _nosync; do
        keys+=("${p}_$m$v$s")
      done
    done
  done
  echo "${keys[*]}"
}

# bench_versions FILE CMDLINE [LLMC_SRC]: append this call's versions to
# FILE: the date, the command line, PROGRAMS / FIRST_REP / REPS, the GPUs (name, driver,
# memory), CUDA (nvcc and the driver's), PyTorch with its CUDA and NCCL,
# llm.c's commit (LLMC_SRC's git HEAD when it is a repository of its own,
# else its LLMC_COMMIT or COMMIT file's first line) and
# trainrun's (git HEAD, "+dirty" when the tree has changes, and `TRAINRUN
# --version`). Calls on other machines each add a block; the summary
# flags GPUs that differ.
bench_versions() {
  local file=$1 cmd=$2 llmc=${3:-}
  {
    echo "== call $(date -u +%FT%TZ) PROGRAMS='${PROGRAMS:-}' FIRST_REP=${FIRST_REP:-1} REPS=${REPS:-3}"
    echo "command: $cmd"
    if command -v nvidia-smi > /dev/null 2>&1; then
      nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm \
        --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
      nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/driver cuda: \1/p' | head -n 1
    else
      echo "gpu: none (nvidia-smi not found)"
    fi
    echo "nvcc: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    "${PY:-python3}" -c 'import torch
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
print("torch:", torch.__version__, "cuda", torch.version.cuda, "nccl",
      ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl)' 2>&1 | tail -n 1
    if [ -n "$llmc" ]; then
      # its own repository only: a copy without .git inside trainrun's
      # tree (peers/llm.c) would report trainrun's HEAD
      local top f
      top=$(git -C "$llmc" rev-parse --show-toplevel 2>/dev/null)
      if [ -n "$top" ] && [ "$top" -ef "$llmc" ]; then
        echo "llm.c: $(git -C "$llmc" rev-parse HEAD) ($llmc)"
      else
        for f in LLMC_COMMIT COMMIT ""; do
          [ -n "$f" ] && [ -r "$llmc/$f" ] && break
        done
        if [ -n "$f" ]; then
          echo "llm.c: $(head -n 1 "$llmc/$f") ($llmc/$f)"
        else
          echo "llm.c: unknown commit ($llmc is no git repository and has no LLMC_COMMIT or COMMIT file)"
        fi
      fi
    fi
    local head dirty=
    head=$(git rev-parse HEAD 2>/dev/null || echo unknown)
    [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && dirty=+dirty
    echo "trainrun git: $head$dirty"
    echo "trainrun: $("${TRAINRUN:-./trainrun}" --version 2>&1 | head -n 1)"
  } >> "$file"
}
