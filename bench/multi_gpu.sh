#!/usr/bin/env bash
# bench/multi_gpu.sh: the multi-GPU runs of issues 11 and 22 on one host:
# data, fully sharded and hybrid sharded data parallel throughput, the same
# Llama jobs under PyTorch FSDP2 in every torch.compile configuration that
# can be its best, and a checkpointed run that loses a worker and must
# restart; by the protocol of bench/benchlib.sh (programs in alternating
# order over rounds, each REPS times, medians [min-max]), with a markdown
# table (OUT/README.md) of every figure pointing at its raw file.
#
#   bench/multi_gpu.sh [--nproc N] [--runs LIST] [--dry-run | --cpu-smoke]
#
# Run from the repository root of a staged tree on the GPU host: the
# binaries in .gpu/ (trainrun, trainrund) and `. .gpu/env.sh` sourced
# first (the script sources it too when it is there and TRAINRUN is
# .gpu/trainrun). N is the GPU count (default: every visible GPU); runs on
# fewer GPUs use the first ones.
#
# The programs (keys for PROGRAMS), by --runs group, in an odd round's
# order (each run's timeout is cut so that it ends by MG_DEADLINE; one
# left with less than 30 s is skipped):
#
#   gpt2      gpt2_ddp_nN: GPT-2 124M (bench/gpu/gpt2_124m.toml), DDP over N
#             GPUs, batch 64 x 1024 per GPU
#   fsdp1b    llama1b_fsdp_nN: Llama 3.2 1B (bench/gpu/llama3_1b.toml), FSDP
#             over N, batch 8 x 2048 per GPU (MG_L1B_B, MG_L1B_T), 30 steps
#   torch1b   torch_fsdp2_1b_nN_MODE[_nosync]: the same job under PyTorch
#             FSDP2 (bench/peers/llama_fsdp2.py --model 1B --ac none, under
#             torchrun, each block compiled before it is sharded), MODE
#             compile (default mode), compile_tunable (the same with
#             TunableOp: GEMM candidates timed), autotune (max-autotune),
#             autotune_nocg (max-autotune-no-cudagraphs), each with a host
#             sync per step
#             and without (_nosync: --no-sync, CUDA events); _eager (no
#             compile) only when PROGRAMS names it
#   fsdp      llama8b_fsdp_nN: Llama 3 8B (bench/gpu/llama3_8b.toml, the
#             model and batch of examples/llama3_8b.toml: 1 x 8192 per GPU,
#             selective op checkpointing), FSDP over N (N >= 2)
#   torch     torch_fsdp2_8b_nN_compile, torch_fsdp2_8b_nN_compile_nosync:
#             the same job under PyTorch FSDP2 (--model 8B --ac op); the
#             other modes of torch1b when PROGRAMS names them
#   hsdp      llama8b_hsdp_2xM: the 8B job, HSDP: 2 replicas of FSDP over
#             M = N/2 (N >= 4 and even)
#   ckpt      ckpt_kill_nN: Llama 3.2 1B, FSDP over N
#             (bench/gpu/ckpt_llama3_1b.toml), an async checkpoint every 40
#             steps in SCRATCH, rank N-1 killed (SIGKILL) as step 95 starts
#             (step 40's save has committed, step 80's is being written),
#             --max-restarts 1: it must resume from step 40 and finish step
#             110. Its output is time-stamped as it arrives: restart time =
#             first step line after the restore - the kill's line. Not a
#             speed program: it runs once, before the rounds, in the call
#             whose rounds start at 1
#   scaling   gpt2_ddp_nK (K = 1, 2, 4, ... < N: GPT-2 DDP's scaling is
#             against 1 GPU) and llama8b_fsdp_nK (K = N/2, ..., 4, 2: 8B
#             does not fit one GPU, its scaling is against FSDP over 2)
#
# Before them the shards (bench/gpu/make_shard.py: random Llama 3 tokens,
# uint32, vocab 128256; GPT-2 tokens, uint16, vocab 50257, in SCRATCH);
# after them the summary (bench/gpu/summarize.py --mode multigpu:
# OUT/README.md, the same as OUT/summary.md, and OUT/summary.json): per
# program the median tokens/s per GPU over its runs [min-max], MFU, peak
# memory, the scaling efficiency of GPT-2 DDP against 1 GPU and of Llama 8B
# FSDP against the fewest GPUs it ran on, trainrun FSDP against the fastest
# PyTorch FSDP2 configuration of the same model (failed configurations
# listed, not counted), HSDP against FSDP, and the checkpointed run's
# stalls and restart time.
#
# The rounds (bench/benchlib.sh): FIRST_REP (1) to FIRST_REP + REPS - 1
# (REPS: 3), odd rounds in the order above, even ones reversed. A call is
# at most 10 minutes: split the programs and rounds over calls with
# PROGRAMS (keys, space- or comma-separated; default: every key of --runs)
# and FIRST_REP, into the same OUT (or copy the earlier calls' files into
# it): every call writes its runs to OUT/runs-CALL_ID.tsv (a name run
# again keeps its last line) and the summary takes them all. Calls on
# machines that start with an empty OUT each: copy their folders into one
# (cp -n A/* B/* ALL/) and run `python3 bench/gpu/summarize.py --mode
# multigpu --out ALL` there. The issue's rows on 2 GPUs:
#
#   PROGRAMS="gpt2_ddp_n2 gpt2_ddp_n1 llama1b_fsdp_n2 torch_fsdp2_1b_n2_compile
#     torch_fsdp2_1b_n2_compile_nosync" bench/multi_gpu.sh --nproc 2
#   PROGRAMS="llama1b_fsdp_n2 torch_fsdp2_1b_n2_autotune_nocg
#     torch_fsdp2_1b_n2_autotune_nocg_nosync" REPS=2 bench/multi_gpu.sh --nproc 2
#   ... FIRST_REP=3 REPS=1 (the third round), the same for autotune
#
# Every run runs under `timeout`, its output in OUT/NAME.log (NAME =
# KEY_rROUND), its exit status in OUT/NAME.rc, a line in OUT/runs-*.tsv; a
# failure is recorded and the next one starts. trainrun's dump folders
# (its final weights, the checkpoints) live in SCRATCH on a local disk and
# are removed after each run; their metrics.jsonl is kept as
# OUT/NAME.metrics.jsonl, a peer's JSON lines as OUT/NAME.jsonl.
# OUT/versions-CALL_ID.txt: the call's GPUs, driver, CUDA, NCCL, PyTorch,
# trainrun's git commit; OUT/env-CALL_ID.txt its host.
#
# Options: --nproc N (GPUs), --runs LIST (comma-separated, of gpt2,
# fsdp1b, torch1b, fsdp, torch, hsdp, ckpt, scaling; default all), --dry-run
# (print the commands, run nothing), --list (print the keys of --runs for
# N GPUs, for bench/gpu/protocol_call.sh), --cpu-smoke (every run on 2 CPU ranks
# with the debug models and a few steps, HSDP 2x2 on 4 ranks, the PyTorch
# peer with --device cpu --tiny: a test of this script's logic and of the
# summary).
#
# Environment: PROGRAMS, FIRST_REP, REPS (above), OUT (./out), MG_SCRATCH
# (SCRATCH above, on a local disk: /tmp/trainrun-multigpu), TRAINRUN
# (.gpu/trainrun, else ./trainrun), PYTHON (python3), TORCHRUN ("$PYTHON
# -m torch.distributed.run"), TRAINRUN_FLAGS and TORCH_FLAGS (extra
# arguments for every trainrun job and for the PyTorch peer), MG_DEADLINE
# (s by which every run has ended, 530), MG_GPT2_STEPS (30),
# MG_LLAMA_STEPS (12), MG_LLAMA_T (8192), MG_TORCH_STEPS (12: the 8B
# peer), MG_L1B_B (8), MG_L1B_T (2048), MG_L1B_STEPS (30: the 1B jobs,
# trainrun and PyTorch), MG_CKPT_MODEL (llama1b, or gpt2 or llama8b),
# MG_CKPT_STEPS (110), MG_CKPT_INTERVAL (40), MG_CKPT_KILL_STEP (95),
# MG_TMO_GPT2 (90), MG_TMO_LLAMA (150), MG_TMO_TORCH (240),
# MG_TMO_AUTOTUNE (420: the max-autotune and TunableOp peers), MG_TMO_CKPT (200) (s per
# run), MG_GPT2_BASE and MG_LLAMA_BASE (the baselines' GPU
# counts, e.g. "1 2 4" and "4 2").

# program and the jobs only it starts run through bench_run_rounds (an
# indirect call shellcheck cannot follow)
# shellcheck disable=SC2317
set -u

usage() {
  echo "usage: bench/multi_gpu.sh [--nproc N] [--runs LIST] [--dry-run | --cpu-smoke | --list]" >&2
  exit 2
}

mode=gpu
list=0
N=
runs=gpt2,fsdp1b,torch1b,fsdp,torch,hsdp,ckpt,scaling
cmdline="bench/multi_gpu.sh $*"
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) mode=dry ;;
    --cpu-smoke) mode=smoke ;;
    --list) mode=dry list=1 ;;
    --nproc)
      [ $# -ge 2 ] || usage
      N=$2
      shift
      ;;
    --nproc=*) N=${1#--nproc=} ;;
    --runs)
      [ $# -ge 2 ] || usage
      runs=$2
      shift
      ;;
    --runs=*) runs=${1#--runs=} ;;
    -h | --help) usage ;;
    *) usage ;;
  esac
  shift
done
for r in ${runs//,/ }; do
  case $r in
    gpt2 | fsdp1b | torch1b | fsdp | torch | hsdp | ckpt | scaling) ;;
    *)
      echo "multi_gpu: unknown run '$r' in --runs (gpt2, fsdp1b, torch1b, fsdp, torch, hsdp, ckpt, scaling)" >&2
      exit 2
      ;;
  esac
done
want() { case ",$runs," in *",$1,"*) return 0 ;; *) return 1 ;; esac }

# shellcheck source=bench/benchlib.sh
. "$(dirname "$0")/benchlib.sh"
PY=${PYTHON:-python3}
if [ -z "${TRAINRUN:-}" ]; then
  if [ -x .gpu/trainrun ]; then TRAINRUN=.gpu/trainrun; else TRAINRUN=./trainrun; fi
fi
if [ "$mode" = gpu ] && [ "$TRAINRUN" = .gpu/trainrun ] && [ -r .gpu/env.sh ]; then
  # shellcheck disable=SC1091
  . .gpu/env.sh
fi
read -r -a TORCHRUN_CMD <<< "${TORCHRUN:-$PY -m torch.distributed.run}"
OUT=${OUT:-./out}
SCRATCH=${MG_SCRATCH:-/tmp/trainrun-multigpu}
DEADLINE=${MG_DEADLINE:-530}

# the GPUs: CUDA_VISIBLE_DEVICES's list or 0..count-1
gpus=()
if [ "$mode" != smoke ]; then
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
  else
    ng=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    for ((i = 0; i < ng; i++)); do gpus+=("$i"); done
  fi
fi
if [ "$mode" = smoke ]; then
  N=${N:-2}
elif [ -z "$N" ]; then
  N=${#gpus[@]}
  [ "$mode" = dry ] && [ "$N" -eq 0 ] && N=4
fi
case $N in
  '' | *[!0-9]* | 0)
    echo "multi_gpu: no GPU count (nvidia-smi sees none): pass --nproc N" >&2
    exit 2
    ;;
esac
if [ "$mode" = gpu ] && [ "${#gpus[@]}" -lt "$N" ]; then
  echo "multi_gpu: --nproc $N but only ${#gpus[@]} GPUs are visible" >&2
  exit 2
fi
if [ "$mode" = dry ] && [ "${#gpus[@]}" -lt "$N" ]; then
  gpus=()
  for ((i = 0; i < N; i++)); do gpus+=("$i"); done
fi

# the jobs' shapes; --cpu-smoke shrinks every one of them
if [ "$mode" = smoke ]; then
  GPT2_STEPS=${MG_GPT2_STEPS:-6}
  LLAMA_STEPS=${MG_LLAMA_STEPS:-6}
  TORCH_STEPS=${MG_TORCH_STEPS:-6}
  CKPT_STEPS=${MG_CKPT_STEPS:-10}
  CKPT_INTERVAL=${MG_CKPT_INTERVAL:-4}
  CKPT_KILL=${MG_CKPT_KILL_STEP:-6}
  GPT2_B=2 GPT2_T=64 LLAMA_B=1 LLAMA_T=${MG_LLAMA_T:-64} CKPT_B=2 CKPT_T=64
  L1B_B=${MG_L1B_B:-2} L1B_T=${MG_L1B_T:-64} L1B_STEPS=${MG_L1B_STEPS:-6}
  GPT2_VOCAB=256 LLAMA_VOCAB=256 GPT2_TOKENS=200000 LLAMA_TOKENS=200000
  TMO_GPT2=${MG_TMO_GPT2:-120} TMO_LLAMA=${MG_TMO_LLAMA:-120}
  TMO_TORCH=${MG_TMO_TORCH:-420} TMO_CKPT=${MG_TMO_CKPT:-180}
  TMO_AUTOTUNE=${MG_TMO_AUTOTUNE:-600}
  DEADLINE=${MG_DEADLINE:-1500}
  TR_DEV=(--training.device cpu --model.flavor debugmodel)
  TORCH_DEV=(--device cpu --tiny)
  MIN_TMO=10
else
  GPT2_STEPS=${MG_GPT2_STEPS:-30}
  LLAMA_STEPS=${MG_LLAMA_STEPS:-12}
  TORCH_STEPS=${MG_TORCH_STEPS:-12}
  # a save of the 1B job (3.7 GB) took 7.7 s on a 4xH200 host, ~50 steps:
  # the kill comes once step 40's save has committed, during step 80's
  CKPT_STEPS=${MG_CKPT_STEPS:-110}
  CKPT_INTERVAL=${MG_CKPT_INTERVAL:-40}
  CKPT_KILL=${MG_CKPT_KILL_STEP:-95}
  GPT2_B=64 GPT2_T=1024 LLAMA_B=1 LLAMA_T=${MG_LLAMA_T:-8192} CKPT_B=4 CKPT_T=2048
  L1B_B=${MG_L1B_B:-8} L1B_T=${MG_L1B_T:-2048} L1B_STEPS=${MG_L1B_STEPS:-30}
  GPT2_VOCAB=50257 LLAMA_VOCAB=128256 GPT2_TOKENS=33554432 LLAMA_TOKENS=16777216
  TMO_GPT2=${MG_TMO_GPT2:-90} TMO_LLAMA=${MG_TMO_LLAMA:-150}
  TMO_TORCH=${MG_TMO_TORCH:-240} TMO_CKPT=${MG_TMO_CKPT:-200}
  TMO_AUTOTUNE=${MG_TMO_AUTOTUNE:-420}
  TR_DEV=()
  TORCH_DEV=()
  MIN_TMO=30
fi
skip_of() { local s=$(($1 / 4)); [ "$s" -lt 3 ] && s=3; [ "$s" -ge "$1" ] && s=$(($1 - 1)); echo "$s"; }
GPT2_SKIP=$(skip_of "$GPT2_STEPS")
LLAMA_SKIP=$(skip_of "$LLAMA_STEPS")
TORCH_SKIP=$(skip_of "$TORCH_STEPS")
L1B_SKIP=$(skip_of "$L1B_STEPS")
CKPT_MODEL=${MG_CKPT_MODEL:-llama1b}
case $CKPT_MODEL in
  llama1b) CKPT_TOML=bench/gpu/ckpt_llama3_1b.toml CKPT_DATA=llama ;;
  gpt2) CKPT_TOML=bench/gpu/gpt2_124m.toml CKPT_DATA=gpt2 CKPT_B=$GPT2_B CKPT_T=$GPT2_T ;;
  llama8b) CKPT_TOML=bench/gpu/llama3_8b.toml CKPT_DATA=llama CKPT_B=$LLAMA_B CKPT_T=$LLAMA_T ;;
  *)
    echo "multi_gpu: MG_CKPT_MODEL must be llama1b, gpt2 or llama8b" >&2
    exit 2
    ;;
esac
if [ "$CKPT_KILL" -le "$CKPT_INTERVAL" ] || [ "$CKPT_KILL" -gt "$CKPT_STEPS" ]; then
  echo "multi_gpu: the kill step ($CKPT_KILL) must come after the first checkpoint ($CKPT_INTERVAL) and by the last step ($CKPT_STEPS)" >&2
  exit 2
fi
data=$SCRATCH/data

# Time-stamp each line of stdin with the wall clock (s since the epoch).
stamp() {
  local line now
  while IFS= read -r line || [ -n "$line" ]; do
    now=${EPOCHREALTIME:-}
    [ -n "$now" ] || now=$(date +%s.%N)
    printf '%s %s\n' "${now/,/.}" "$line"
  done
}

# run NAME TMO STAMP CMD...: CMD under timeout (TMO, cut so that every run
# has ended by DEADLINE), its output in OUT/NAME.log (each line time-stamped
# when STAMP is 1), its exit status in OUT/NAME.rc ("skipped" when the
# deadline left no time, or when the cut timeout ended it: still to do, with
# the seconds it ran before the cut in OUT/NAME.cut), its wall time in
# OUT/NAME.wall. Never fails.
run() {
  local name=$1 tmo=$2 st=$3 rc t0 cut=0
  shift 3
  show timeout -k 10 "$tmo" "$@"
  [ "$mode" = dry ] && return 0
  local left=$((DEADLINE - SECONDS))
  [ "$left" -lt "$tmo" ] && tmo=$left cut=1
  if [ "$tmo" -lt "$MIN_TMO" ]; then
    echo "  $name: skipped ($SECONDS s used, deadline $DEADLINE s)"
    echo skipped > "$OUT/$name.rc"
    echo 0 > "$OUT/$name.wall"
    return 0
  fi
  t0=$SECONDS
  date -u +%FT%TZ > "$OUT/$name.start"
  if [ "$st" = 1 ]; then
    timeout -k 10 "$tmo" "$@" 2>&1 | stamp > "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
  else
    timeout -k 10 "$tmo" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
  fi
  gpu_drain "$name"
  if [ "$rc" -eq 124 ] && [ "$cut" = 1 ]; then
    echo "  $name: skipped (cut to $tmo s by the deadline, $DEADLINE s)"
    echo skipped > "$OUT/$name.rc"
    echo 0 > "$OUT/$name.wall"
    echo $((SECONDS - t0)) > "$OUT/$name.cut"
    return 0
  fi
  echo "$rc" > "$OUT/$name.rc"
  echo $((SECONDS - t0)) > "$OUT/$name.wall"
  if [ "$rc" -eq 0 ]; then
    echo "  $name: done in $((SECONDS - t0)) s"
  else
    [ "$rc" -eq 124 ] && echo "  $name: timed out after $tmo s"
    echo "  $name failed (exit $rc) after $((SECONDS - t0)) s: see $OUT/$name.log"
    tail -n 5 "$OUT/$name.log" | sed 's/^/    | /'
  fi
  return 0
}

# gpu_uuids: the UUIDs of this script's GPUs (gpus: CUDA_VISIBLE_DEVICES's
# UUIDs or indices, nvidia-smi's order, which is CUDA's for GPUs of one
# kind), one a line
gpu_uuids() {
  local g
  for g in "${gpus[@]}"; do
    case $g in
      GPU-*) echo "$g" ;;
      *) nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null |
        tr -d ' ' | awk -F, -v i="$g" '$1 == i { print $2 }' ;;
    esac
  done
}

# gpu_drain NAME: after a sub-run, wait up to 20 s for the processes it
# left on this script's GPUs (a worker that outlived a timeout) to end,
# then SIGKILL them by pid, so that the next sub-run finds the GPUs free;
# noted in OUT/NAME.log. Processes on other GPUs (another protocol stream
# of bench/gpu/protocol_streams.sh) are not this script's.
gpu_drain() {
  [ "$mode" = gpu ] || return 0
  local i pids mine
  mine=$(gpu_uuids)
  for ((i = 0; i < 20; i++)); do
    pids=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null |
      tr -d ' ' | awk -F, -v mine="$mine" 'BEGIN { n = split(mine, u, "\n")
        for (j = 1; j <= n; j++) ours[u[j]] = 1 }
        ($2 in ours) { print $1 }')
    [ -z "$pids" ] && return 0
    sleep 1
  done
  echo "multi_gpu: processes left on the GPUs after $1: ${pids//$'\n'/ }: SIGKILL" |
    tee -a "$OUT/$1.log"
  for p in $pids; do kill -KILL "$p" 2>/dev/null; done
  sleep 2
}

# gpus_for N: CUDA_VISIBLE_DEVICES for a run on the first N GPUs
gpus_for() {
  local IFS=,
  echo "${gpus[*]:0:$1}"
}

# record NAME KIND PROGRAM MODEL N REPLICATE SHARD B T STEPS SKIP: the
# sub-run's line in OUT/runs.tsv, what summarize.py reads
record() {
  [ "$mode" = dry ] && return 0
  local IFS=$'\t'
  echo "$*" >> "$OUT/runs-$CALL_ID.tsv"
}

# keep_dump NAME DIR: the metrics of trainrun's dump folder DIR into OUT,
# the flight-recorder dumps when the run failed, then DIR removed
keep_dump() {
  [ "$mode" = dry ] && return 0
  local name=$1 dir=$2
  [ -f "$dir/metrics.jsonl" ] && cp "$dir/metrics.jsonl" "$OUT/$name.metrics.jsonl"
  if [ "$(cat "$OUT/$name.rc" 2>/dev/null)" != 0 ] && [ -d "$dir/comm_traces_json" ]; then
    cp -r "$dir/comm_traces_json" "$OUT/$name.comm_traces_json" 2>/dev/null
  fi
  if [ -d "$dir/checkpoint" ]; then
    du -sb "$dir/checkpoint"/step-* > "$OUT/$name.ckpt_sizes" 2>/dev/null
  fi
  rm -rf "$dir"
}

model_of() { # the model key summarize.py knows for a trainrun job
  if [ "$mode" = smoke ]; then echo "debug-$1"; else echo "$1"; fi
}

# trainrun_dp NAME MODEL TOML N REPLICATE SHARD B T STEPS SKIP TMO: one
# data-parallel trainrun job (DDP: REPLICATE=N SHARD=1; FSDP: 1, N; HSDP)
trainrun_dp() {
  local name=$1 model=$2 toml=$3 n=$4 rep=$5 shard=$6 B=$7 T=$8 steps=$9 skip=${10} tmo=${11}
  local ds=$data/llama.bin dir=$SCRATCH/dump/$name
  [ "$model" = gpt2_124m ] && ds=$data/gpt2.bin
  local env=()
  [ "$mode" != smoke ] && env=(env "CUDA_VISIBLE_DEVICES=$(gpus_for "$n")")
  echo "-- $name: $model on $n ranks (replicate $rep x shard $shard), B=$B T=$T, $steps steps"
  if [ "$mode" != dry ]; then
    rm -rf "$dir"
    # the per-rank memory trainrun plans for this layout (no GPU needed)
    timeout 60 "$TRAINRUN" plan "$toml" --world-size "$n" \
      --training.local_batch_size "$B" --training.seq_len "$T" \
      --parallelism.data_parallel_replicate_degree "$rep" \
      --parallelism.data_parallel_shard_degree "$shard" \
      "${TR_DEV[@]}" > "$OUT/$name.plan.txt" 2>&1
  fi
  # shellcheck disable=SC2086
  run "$name" "$tmo" 0 "${env[@]}" "$TRAINRUN" --nproc-per-node "$n" "$toml" \
    --training.dataset_path "$ds" --training.local_batch_size "$B" \
    --training.seq_len "$T" --training.steps "$steps" --job.dump_folder "$dir" \
    --parallelism.data_parallel_replicate_degree "$rep" \
    --parallelism.data_parallel_shard_degree "$shard" \
    "${TR_DEV[@]}" ${TRAINRUN_FLAGS:-}
  keep_dump "$name" "$dir"
  record "$name" trainrun "trainrun" "$(model_of "$model")" "$n" "$rep" "$shard" "$B" "$T" "$steps" "$skip"
}

# the baselines: powers of two below N for GPT-2, N/2 .. 2 for Llama 8B
# (MG_GPT2_BASE, MG_LLAMA_BASE: space-separated GPU counts instead)
gpt2_base=()
for ((k = 1; k < N; k *= 2)); do gpt2_base+=("$k"); done
llama_base=()
for ((k = N / 2; k >= 2; k /= 2)); do llama_base+=("$k"); done
[ -n "${MG_GPT2_BASE:-}" ] && read -r -a gpt2_base <<< "$MG_GPT2_BASE"
[ -n "${MG_LLAMA_BASE:-}" ] && read -r -a llama_base <<< "$MG_LLAMA_BASE"
hn=$N
[ "$mode" = smoke ] && [ "$hn" -lt 4 ] && hn=4

# the programs: every key a run group (--runs) has, in an odd round's order
# (known: every key, what PROGRAMS may name; default: those of --runs)
known=() default=()
group() { # group RUN KEY...: the keys of one --runs group
  local g=$1
  shift
  known+=("$@")
  want "$g" && default+=("$@")
}
group gpt2 "gpt2_ddp_n$N"
group fsdp1b "llama1b_fsdp_n$N"
# PyTorch FSDP2 1B: every compile mode, with and without a host sync;
# eager only when named in PROGRAMS
read -r -a t1b <<< "$(bench_torch_keys "torch_fsdp2_1b_n$N")"
known+=("${t1b[0]}")
group torch1b "${t1b[@]:1}"
if [ "$N" -ge 2 ]; then
  group fsdp "llama8b_fsdp_n$N"
  # 8B: the default mode with and without a sync; the others when named
  read -r -a t8b <<< "$(bench_torch_keys "torch_fsdp2_8b_n$N")"
  known+=("${t8b[@]}")
  group torch "torch_fsdp2_8b_n${N}_compile" "torch_fsdp2_8b_n${N}_compile_nosync"
fi
if [ "$hn" -ge 4 ] && [ $((hn % 2)) -eq 0 ]; then
  group hsdp "llama8b_hsdp_2x$((hn / 2))"
fi
group ckpt "ckpt_kill_n$N"
for k in "${gpt2_base[@]}"; do group scaling "gpt2_ddp_n$k"; done
for k in "${llama_base[@]}"; do group scaling "llama8b_fsdp_n$k"; done
if [ "$list" = 1 ]; then # the keys of --runs, in an odd round's order
  echo "${default[*]}"
  exit 0
fi
sel=$(bench_select "${known[*]}" "${default[*]}") || exit 2
read -r -a progs <<< "$sel"
rounds=$(bench_rounds) || exit 2

echo "== multi_gpu ($mode): N=$N runs=$runs out=$OUT scratch=$SCRATCH deadline=${DEADLINE}s rounds ${rounds//$'\n'/ }"
echo "   programs: ${progs[*]}"
if [ "$mode" != dry ]; then
  # runs-CALL_ID.tsv, versions-CALL_ID.txt, env-CALL_ID.txt: this
  # call's; the summary reads every call's
  mkdir -p "$OUT" "$data" "$SCRATCH/dump" || exit 1
  {
    date -u
    echo "command: $cmdline"
    echo "mode: $mode  N=$N  TRAINRUN=$TRAINRUN"
    env | grep -E '^(MG_|TRAINRUN_FLAGS=|TORCH_FLAGS=|TORCHRUN=|CUDA_VISIBLE_DEVICES=|PROGRAMS=|FIRST_REP=|REPS=)' | sort
    if [ "$mode" = gpu ]; then
      nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm \
        --format=csv 2>&1
      nvidia-smi topo -m 2>&1
    fi
    nproc
    free -g | head -n 2
    df -h "$SCRATCH" | tail -n 1
  } > "$OUT/env-$CALL_ID.txt" 2>&1
  bench_versions "$OUT/versions-$CALL_ID.txt" "$cmdline"
  cat "$OUT/env-$CALL_ID.txt" "$OUT/versions-$CALL_ID.txt"
fi
if [ "$mode" = smoke ]; then
  gpu_name=cpu
else
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
fi

# 1. shards
echo "-- shards"
run make_shard_llama 120 0 "$PY" bench/gpu/make_shard.py --out "$data/llama.bin" \
  --tokens "$LLAMA_TOKENS" --vocab "$LLAMA_VOCAB" --width 4 --seed 1234
run make_shard_gpt2 120 0 "$PY" bench/gpu/make_shard.py --out "$data/gpt2.bin" \
  --tokens "$GPT2_TOKENS" --vocab "$GPT2_VOCAB" --width 2 --seed 1234

# torch_fsdp2 NAME KEY: PyTorch FSDP2 (bench/peers/llama_fsdp2.py under
# torchrun) in KEY's configuration: torch_fsdp2_{1b,8b}_nN_MODE[_nosync]
torch_fsdp2() {
  local name=$1 key=$2 size n flags env=() model ac B T steps skip tmo=$TMO_TORCH
  size=${key#torch_fsdp2_}
  n=${size#*_n}
  n=${n%%_*}
  size=${size%%_*}
  read -r -a flags <<< "$(bench_torch_flags "$key")"
  if [ "$size" = 1b ]; then
    model=1B ac=none B=$L1B_B T=$L1B_T steps=$L1B_STEPS skip=$L1B_SKIP
  else
    model=8B ac=op B=$LLAMA_B T=$LLAMA_T steps=$TORCH_STEPS skip=$TORCH_SKIP
  fi
  case $key in *autotune* | *tunable*) tmo=$TMO_AUTOTUNE ;; esac
  [ "$mode" != smoke ] && env=(env "CUDA_VISIBLE_DEVICES=$(gpus_for "$n")")
  echo "-- $name: torch FSDP2 ${flags[*]}, Llama $model on $n ranks, B=$B T=$T"
  # shellcheck disable=SC2086
  run "$name" "$tmo" 0 "${env[@]}" "${TORCHRUN_CMD[@]}" --standalone \
    --nproc-per-node "$n" bench/peers/llama_fsdp2.py --model "$model" --ac "$ac" \
    "${flags[@]}" --data "$data/llama.bin" -B "$B" -T "$T" \
    --steps "$steps" --skip "$skip" "${TORCH_DEV[@]}" ${TORCH_FLAGS:-}
  [ "$mode" = dry ] || grep '^{' "$OUT/$name.log" > "$OUT/$name.jsonl"
  record "$name" torch "torch FSDP2 ${flags[*]}" \
    "$(model_of "llama3_${size%b}b")" "$n" 1 "$n" "$B" "$T" "$steps" "$skip"
}

# ckpt_kill NAME: checkpoints every CKPT_INTERVAL steps, a rank killed at
# CKPT_KILL (once a call, before the rounds)
ckpt_kill() {
  local name=$1 dir kr ds rep shard env=() ckm
  dir=$SCRATCH/dump/$name
  kr=$((N - 1))
  ds=$data/llama.bin
  [ "$CKPT_DATA" = gpt2 ] && ds=$data/gpt2.bin
  rep=1 shard=$N
  [ "$CKPT_MODEL" = gpt2 ] && rep=$N shard=1
  [ "$mode" != smoke ] && env=(env "CUDA_VISIBLE_DEVICES=$(gpus_for "$N")")
  echo "-- $name: $CKPT_MODEL on $N ranks, checkpoint every $CKPT_INTERVAL steps, rank $kr killed at step $CKPT_KILL"
  [ "$mode" = dry ] || rm -rf "$dir"
  # shellcheck disable=SC2086
  run "$name" "$TMO_CKPT" 1 "${env[@]}" "$TRAINRUN" --nproc-per-node "$N" \
    --max-restarts 1 "$CKPT_TOML" --training.dataset_path "$ds" \
    --training.local_batch_size "$CKPT_B" --training.seq_len "$CKPT_T" \
    --training.steps "$CKPT_STEPS" --job.dump_folder "$dir" \
    --parallelism.data_parallel_replicate_degree "$rep" \
    --parallelism.data_parallel_shard_degree "$shard" \
    --checkpoint.enable=true --checkpoint.folder checkpoint \
    --checkpoint.interval "$CKPT_INTERVAL" \
    --checkpoint.async_mode async_with_pinned_mem \
    --checkpoint.keep_latest_k 2 --checkpoint.last_save_model_only=true \
    --debug.fault "kill:rank=$kr:step=$CKPT_KILL" "${TR_DEV[@]}" ${TRAINRUN_FLAGS:-}
  keep_dump "$name" "$dir"
  ckm=llama3_1b
  [ "$CKPT_MODEL" = gpt2 ] && ckm=gpt2_124m
  [ "$CKPT_MODEL" = llama8b ] && ckm=llama3_8b
  record "$name" ckpt trainrun "$(model_of $ckm)" "$N" "$rep" "$shard" "$CKPT_B" "$CKPT_T" \
    "$CKPT_STEPS" 3 "interval=$CKPT_INTERVAL" "kill_rank=$kr" "kill_step=$CKPT_KILL"
}

# program KEY NAME: one run of a program
program() {
  local key=$1 name=$2 k
  case $key in
    gpt2_ddp_n*)
      k=${key#gpt2_ddp_n}
      trainrun_dp "$name" gpt2_124m bench/gpu/gpt2_124m.toml "$k" "$k" 1 \
        "$GPT2_B" "$GPT2_T" "$GPT2_STEPS" "$GPT2_SKIP" "$TMO_GPT2"
      ;;
    llama1b_fsdp_n*)
      k=${key#llama1b_fsdp_n}
      trainrun_dp "$name" llama3_1b bench/gpu/llama3_1b.toml "$k" 1 "$k" \
        "$L1B_B" "$L1B_T" "$L1B_STEPS" "$L1B_SKIP" "$TMO_LLAMA"
      ;;
    llama8b_fsdp_n*)
      k=${key#llama8b_fsdp_n}
      trainrun_dp "$name" llama3_8b bench/gpu/llama3_8b.toml "$k" 1 "$k" \
        "$LLAMA_B" "$LLAMA_T" "$LLAMA_STEPS" "$LLAMA_SKIP" "$TMO_LLAMA"
      ;;
    llama8b_hsdp_2x*)
      k=${key#llama8b_hsdp_2x}
      trainrun_dp "$name" llama3_8b bench/gpu/llama3_8b.toml $((2 * k)) 2 "$k" \
        "$LLAMA_B" "$LLAMA_T" "$LLAMA_STEPS" "$LLAMA_SKIP" "$TMO_LLAMA"
      ;;
    torch_fsdp2_*) torch_fsdp2 "$name" "$key" ;;
  esac
}

# 2. the checkpointed run with a kill, once (the call with round 1)
rounds_progs=()
for p in "${progs[@]}"; do
  if [ "$p" = "ckpt_kill_n$N" ]; then
    if [ "${rounds%%$'\n'*}" = 1 ]; then
      ckpt_kill "$p"
    else
      echo "-- $p: runs in the call with round 1 only"
    fi
  else
    rounds_progs+=("$p")
  fi
done

# 3. the rounds
if [ "${#rounds_progs[@]}" -gt 0 ]; then
  bench_run_rounds "$rounds" program "${rounds_progs[@]}"
fi

# 4. the table
echo "-- summary"
sargs=(--mode multigpu --out "$OUT" --gpu "${gpu_name:-unknown}" --nproc "$N"
  --command "$cmdline")
show "$PY" bench/gpu/summarize.py "${sargs[@]}"
[ "$mode" = dry ] && exit 0
rm -rf "$SCRATCH/dump"
[ "$mode" = smoke ] || rm -rf "$data"
"$PY" bench/gpu/summarize.py "${sargs[@]}"
rc=$?
echo "total: $SECONDS s"
exit $rc
