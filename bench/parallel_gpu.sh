#!/usr/bin/env bash
# bench/parallel_gpu.sh: tensor, pipeline and context parallelism on 2
# GPUs of one host and attention masks on one (issues 18, 19 and 23), in
# one call: correctness (fp32, no TF32: TP 2 and PP 2 against 1 GPU) and
# speed (Llama 3.2 1B, bf16, B8 x T2048: trainrun on 1 GPU, trainrun TP 2
# and PyTorch TP 2 (bench/peers/llama_tp.py, the same plan) with and
# without torch.compile; trainrun PP 2 and PyTorch's pipelining
# (bench/peers/llama_pp.py) with 1F1B and ZBVZeroBubble, 8 micro-batches
# of 1; context parallel 2 against PyTorch's (bench/peers/llama_cp.py) at a
# length both fit; a length one GPU cannot hold trained at CP 2;
# block_causal against FlexAttention on one GPU), the speed programs
# alternating order over REPS rounds; a markdown table in OUT/summary.md
# with medians.
#
#   . .gpu/env.sh && bench/parallel_gpu.sh [--reps N] [--runs LIST]
#
# LIST: comma-separated of check, pp_check, tp, pp, idle, tp8b, pp8b,
# idle8b, cp, cplong, flex (default check,pp_check,tp,pp,idle: the 8B ones
# want 2 H200s; cp, cplong and flex are asked for by name).
#
# Run from the repository root of a staged tree: .gpu/trainrun (or
# TRAINRUN), python3 with PyTorch for the peer (PYTHON). Each program's
# output is OUT/NAME.log (trainrun: OUT/NAME.metrics.jsonl too).
#
#   check_1gpu, check_tp2, check_pp2   examples/debug.toml's Llama on cuda in float32
#                (mixed_precision_param float32), 20 steps, the same seed
#                and global batch; the losses and gradient norms compared
#                step by step (max relative difference; the issue asks
#                1e-5)
#   tr_1gpu_rN, tr_tp2_rN   bench/gpu/llama3_1b.toml, 20 steps, 1 GPU and
#                TP 2 (tokens/s per GPU: a step's B x T over the GPUs that
#                share it, as torchtitan counts)
#   tr_tp2m_rN   TP 2 with [metrics] comm_overlap: the summary gives tensor
#                parallel's communication per step, its share of the step,
#                the time the compute waited for it and the hidden fraction
#   pt_tp2_rN, pt_tp2c_rN   the PyTorch peer over torchrun with torchtitan's
#                plan (sequence and loss parallel), without and with
#                per-block torch.compile; pt_tp2l_rN, pt_tp2lc_rN the
#                layers-only plan (linear layers split, embedding, output
#                and norms replicated), without and with compile
#   *_8b_rN      the same for Llama 3.1 8B (bench/gpu/llama3_8b.toml): TP 2
#                at B8B sequences a step (default 2), PP 2 with 8
#                micro-batches of 1
#   idle_S[_8b]  trainrun PP 2 (Llama 1B; _8b: Llama 3.1 8B, run idle8b),
#                schedule S (1F1B, ZBVZeroBubble), 8 micro-batches, step 10
#                traced (TRAINRUN_PP_TRACE: OUT/idle_S.trace.json): each
#                GPU's idle fraction measured (compute-stream events) next
#                to the simulator's with that step's F/B/I/W costs
#   tr_pp2_S_rN, pt_pp2_S_rN   PP 2, schedule S (1F1B, ZBVZeroBubble), 8
#                micro-batches of 1, trainrun and PyTorch's pipelining
#                (1F1B with and without per-block compile, pt_pp2_1F1Bc_rN;
#                ZBVZeroBubble without: PyTorch 2.11 refuses compiled stages
#                there)
#   cp: at B CP_B x T CP_T (default 1 x 16384: `trainrun plan` puts one GPU
#                at 18.42 GiB of state + 22.57 GiB of activations, CP 2 at
#                10.19 + 11.29 GiB per rank, so 1 GPU, CP 2 and PyTorch's
#                CP all fit an 80 GB H100):
#     tr_cp1gpu_rN   trainrun on 1 GPU at that length (reference)
#     tr_cp2_M_rN    trainrun context_parallel_degree 2, rotate method M
#                    (allgather, alltoall)
#     pt_cp2_M_rN, pt_cp2_Mc_rN   bench/peers/llama_cp.py (PyTorch's
#                    context_parallel with SDPA as torchtitan applies it,
#                    FSDP2 over dp_shard x cp) with rotate method M, without
#                    and with per-block torch.compile
#   cplong       a length one GPU cannot hold without activation
#                checkpointing: CPLONG_T, or the shortest of 32768 ..
#                131072 (steps of 16384) where `trainrun plan` puts one GPU
#                above 1.25 x this GPU's memory and CP 2 under 0.85 x
#                (65536 on an 80 GB H100: 18.42 + 90.29 GiB against 10.19 +
#                45.14 GiB per rank; 114688 on a 141 GB H200); both plans in
#                OUT/cplong_plan_{1gpu,cp2}.log, the choice in
#                OUT/cplong.txt; cplong_1gpu (trainrun on 1 GPU: expected
#                to fail out of memory, its exit status and error line in
#                the summary), cplong_cp2_M (CP 2, rotate method M),
#                CPLONG_STEPS (10) steps each
#   flex: one GPU, Llama 3.2 1B at B FLEX_B x T FLEX_T (2 x 8192) on
#                SCRATCH/llama_docs.bin (random tokens cut into documents of
#                mean length 1024 by end-of-text 128001: make_shard.py
#                --eot 128001 --doc-len 1024):
#     tr_flex_block_rN   trainrun attn_mask_type = "block_causal" (on GPUs
#                    cuDNN's ragged graph where it applies)
#     tr_flex_block_flash_rN   the same on trainrun's flash kernel
#                    (TRAINRUN_ATTENTION=flash)
#     tr_flex_causal_rN  trainrun causal (reference)
#     pt_flex_blockc_rN, pt_flex_block_rN   llama_torch.py --mask
#                    block_causal (FlexAttention, a block mask built per
#                    batch, flex_attention compiled with
#                    max-autotune-no-cudagraphs) with and without the whole
#                    model compiled
#
# PROGRAMS (a subset of the round's programs: tr1 tr2 pt pc ptl ptlc trp1
# ptp1 ptp1n trpz ptpz; cp: trc1 trc trca ptc ptcc ptca ptcac; flex: trf
# trff trfc ptf ptfe) splits the rounds over calls. A call is at most 10
# minutes on the lent machines: the first compile of FlexAttention with
# max-autotune can take minutes (its runs get PT_TIMEOUT, default 540 s for
# flex), cplong alone is about 5 minutes (it runs once, before any
# round), so give cp, cplong and flex their own calls, cp's rounds split
# with PROGRAMS and FIRST_REP.
#
# Environment: OUT (./out), SCRATCH (/tmp/trainrun-tp), TP_STEPS (20),
# FIRST_REP (1: the first round's number; even rounds run the programs in
# reverse order, so a second call with FIRST_REP=2 alternates),
# PYTHON (python3), TORCHRUN ("$PYTHON -m torch.distributed.run"), CP_B,
# CP_T, CPLONG_T, CPLONG_STEPS, FLEX_B, FLEX_T, PT_TIMEOUT, PP (2: the
# degree and GPU count of the Llama 1B pp and idle runs; 4 on 4 GPUs).
set -u
reps=3
runs=check,pp_check,tp,pp,idle
while [ $# -gt 0 ]; do
  case $1 in
    --reps) reps=$2; shift ;;
    --runs) runs=$2; shift ;;
    *) echo "usage: bench/parallel_gpu.sh [--reps N] [--runs LIST]" >&2; exit 2 ;;
  esac
  shift
done
want() { case ",$runs," in *",$1,"*) return 0 ;; *) return 1 ;; esac }
# shellcheck source=bench/benchlib.sh
. "$(dirname "$0")/benchlib.sh"
PY=${PYTHON:-python3}
known="tr1 tr2 tr2m pt pc ptl ptlc trp1 ptp1 ptp1n trpz ptpz tr2e pte pce trp1e ptp1e
  trpze ptpze trc1 trc trca ptc ptcc ptca ptcac trf trff trfc ptf ptfe"
bench_select "$known" "" > /dev/null # a bad PROGRAMS: exit 2 before any work
if [ -z "${TRAINRUN:-}" ]; then
  if [ -x .gpu/trainrun ]; then TRAINRUN=.gpu/trainrun; else TRAINRUN=./trainrun; fi
fi
read -r -a TORCHRUN_CMD <<< "${TORCHRUN:-$PY -m torch.distributed.run}"
OUT=${OUT:-./out}
SCRATCH=${SCRATCH:-/tmp/trainrun-tp}
STEPS=${TP_STEPS:-20}
mkdir -p "$OUT" "$SCRATCH"

PP=${PP:-2} # the pp runs' degree and GPUs (Llama 1B: pp, idle)
CP_B=${CP_B:-1}
CP_T=${CP_T:-16384}
CPLONG_STEPS=${CPLONG_STEPS:-10}
FLEX_B=${FLEX_B:-2}
FLEX_T=${FLEX_T:-8192}

# trj NAME NPROC ARGS...: a trainrun job, its metrics kept, its dump removed
# (TJ_TIMEOUT seconds at most, default 240)
trj() {
  name=$1 np=$2
  shift 2
  rm -rf "${SCRATCH:?}/$name"
  timeout "${TJ_TIMEOUT:-240}" "$TRAINRUN" --nproc-per-node "$np" "$@" \
    --job.dump_folder "$SCRATCH/$name" --metrics.enable_jsonl=true \
    >"$OUT/$name.log" 2>&1
  echo "$name rc=$? at $(date +%T)" >>"$OUT/runs.txt"
  cp "$SCRATCH/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  rm -rf "${SCRATCH:?}/$name"
}

# pt NAME PEER ARGS...: a PyTorch peer on 2 GPUs (B PT_B, T PT_T: 8, 2048)
pt() {
  name=$1 peer=$2
  shift 2
  timeout "${PT_TIMEOUT:-300}" "${TORCHRUN_CMD[@]}" --nproc-per-node "${PT_NPROC:-2}" \
    "bench/peers/$peer" --data "$SCRATCH/llama.bin" -B "${PT_B:-8}" \
    -T "${PT_T:-2048}" --steps "$STEPS" "$@" >"$OUT/$name.log" 2>&1
  echo "$name rc=$? at $(date +%T)" >>"$OUT/runs.txt"
}

# ptflex NAME ARGS...: llama_torch.py on one GPU on the documents shard
ptflex() {
  name=$1
  shift
  timeout "${PT_TIMEOUT:-540}" "$PY" bench/peers/llama_torch.py \
    --data "$SCRATCH/llama_docs.bin" -B "$FLEX_B" -T "$FLEX_T" \
    --steps "$STEPS" "$@" >"$OUT/$name.log" 2>&1
  echo "$name rc=$? at $(date +%T)" >>"$OUT/runs.txt"
}

REPS=$reps bench_versions "$OUT/versions.txt" "bench/parallel_gpu.sh --reps $reps --runs $runs"

# check NAME NPROC ARGS...: examples/debug.toml on cuda in float32
check() {
  name=$1 np=$2
  shift 2
  trj "$name" "$np" examples/debug.toml --training.device cuda \
    --training.mixed_precision_param float32 --training.steps 20 \
    --metrics.log_freq 1 --validation.no_enable --debug.seed 7 \
    --training.local_batch_size 8 \
    --training.dataset_path examples/data/tinytales.txt "$@"
}
if want check || want pp_check; then check check_1gpu 1; fi
if want check; then check check_tp2 2 --parallelism.tensor_parallel_degree 2; fi
if want pp_check; then
  check check_pp2 2 --parallelism.pipeline_parallel_degree 2
  check check_pp2_zbv 2 --parallelism.pipeline_parallel_degree 2 \
    --parallelism.pipeline_parallel_schedule ZBVZeroBubble
fi

if want flex; then
  [ -s "$SCRATCH/llama_docs.bin" ] ||
    "$PY" bench/gpu/make_shard.py --out "$SCRATCH/llama_docs.bin" \
      --tokens 20000000 --vocab 128256 --width 4 --eot 128001 \
      --doc-len 1024 >"$OUT/shard_docs.log" 2>&1
fi
if want tp || want pp || want idle || want idle8b || want tp8b || want pp8b ||
  want cp || want cplong || want flex; then
  [ -s "$SCRATCH/llama.bin" ] ||
    "$PY" bench/gpu/make_shard.py --out "$SCRATCH/llama.bin" \
      --tokens 20000000 --vocab 128256 --width 4 >"$OUT/shard.log" 2>&1
  if want cplong; then
    # plan_bytes NPROC T: state + activations per rank, trainrun plan's
    # bytes, at CP NPROC (1: one GPU)
    plan_bytes() {
      "$TRAINRUN" plan bench/gpu/llama3_1b.toml \
        --training.local_batch_size 1 --training.seq_len "$2" \
        --world-size "$1" --parallelism.context_parallel_degree "$1" |
        awk '/total \(before activations\)|activations, a micro-batch/ {
          s += $(NF - 2) } END { printf "%.0f\n", s }'
    }
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits |
      head -1 | tr -d ' ')
    T=${CPLONG_T:-}
    if [ -z "$T" ]; then
      for t in 32768 49152 65536 81920 98304 114688 131072; do
        if awk -v a="$(plan_bytes 1 "$t")" -v b="$(plan_bytes 2 "$t")" \
          -v m="$mib" 'BEGIN { m *= 1048576; exit !(a > 1.25 * m && b < 0.85 * m) }'; then
          T=$t
          break
        fi
      done
    fi
    "$TRAINRUN" plan bench/gpu/llama3_1b.toml --training.local_batch_size 1 \
      --training.seq_len "${T:-131072}" >"$OUT/cplong_plan_1gpu.log" 2>&1
    "$TRAINRUN" plan bench/gpu/llama3_1b.toml --training.local_batch_size 1 \
      --training.seq_len "${T:-131072}" --world-size 2 \
      --parallelism.context_parallel_degree 2 >"$OUT/cplong_plan_cp2.log" 2>&1
    if [ -z "$T" ]; then
      echo "cplong: no T in 32768..131072 is above 1.25 x ${mib} MiB on one GPU and under 0.85 x at CP 2 (set CPLONG_T)" >"$OUT/cplong.txt"
    else
      {
        echo "gpu memory: $mib MiB"
        echo "T: $T (B 1)"
        echo "plan bytes per rank, 1 GPU: $(plan_bytes 1 "$T")"
        echo "plan bytes per rank, CP 2: $(plan_bytes 2 "$T")"
      } >"$OUT/cplong.txt"
      LT=(bench/gpu/llama3_1b.toml --training.dataset_path "$SCRATCH/llama.bin"
        --training.steps "$CPLONG_STEPS" --training.local_batch_size 1
        --training.seq_len "$T")
      TJ_TIMEOUT=480 trj cplong_1gpu 1 "${LT[@]}"
      for m in allgather alltoall; do
        TJ_TIMEOUT=480 trj "cplong_cp2_$m" 2 "${LT[@]}" \
          --parallelism.context_parallel_degree 2 \
          --parallelism.context_parallel_rotate_method "$m"
      done
    fi
  fi
  for m in 1b 8b; do
    if [ $m = 1b ]; then want idle || continue; sfx=""
    else want idle8b || continue; sfx="_8b"; fi
    for sch in 1F1B ZBVZeroBubble; do
      np=2
      [ $m = 1b ] && np=$PP && [ "$PP" != 2 ] && sfx="_pp$PP"
      TRAINRUN_PP_TRACE="$OUT/idle_$sch$sfx.trace.json" TRAINRUN_PP_TRACE_STEP=10 \
        trj "idle_$sch$sfx" "$np" "bench/gpu/llama3_$m.toml" \
        --training.dataset_path "$SCRATCH/llama.bin" --training.steps 12 \
        --training.local_batch_size 8 \
        --parallelism.pipeline_parallel_degree "$np" \
        --parallelism.pipeline_parallel_schedule "$sch"
    done
  done
  order=""
  { want tp || want pp; } && order=tr1
  want tp && order="$order tr2 tr2m pt pc ptl ptlc"
  want pp && order="$order trp1 ptp1 ptp1n trpz ptpz"
  want tp8b && order="$order tr2e pte pce"
  want pp8b && order="$order trp1e ptp1e trpze ptpze"
  want cp && order="$order trc1 trc trca ptc ptcc ptca ptcac"
  want flex && order="$order trf trff trfc ptf ptfe"
  # PROGRAMS: a subset, e.g. "pt pc" (one call's share); FIRST_REP: a
  # later call goes on with that round (bench/benchlib.sh)
  order=$(bench_select "$known" "$order") || exit 2
  read -r -a order <<< "$order"
  rounds=$(REPS=$reps bench_rounds) || exit 2
  for r in $rounds; do
    for p in $(bench_round_order "$r" "${order[@]}"); do
      L=(bench/gpu/llama3_1b.toml --training.dataset_path "$SCRATCH/llama.bin"
        --training.steps "$STEPS")
      E=(bench/gpu/llama3_8b.toml --training.dataset_path "$SCRATCH/llama.bin"
        --training.steps "$STEPS")
      B8=${B8B:-2}
      C=(bench/gpu/llama3_1b.toml --training.dataset_path "$SCRATCH/llama.bin"
        --training.steps "$STEPS" --training.local_batch_size "$CP_B"
        --training.seq_len "$CP_T")
      F=(bench/gpu/llama3_1b.toml --training.dataset_path "$SCRATCH/llama_docs.bin"
        --training.steps "$STEPS" --training.local_batch_size "$FLEX_B"
        --training.seq_len "$FLEX_T")
      case $p in
        tr1) trj "tr_1gpu_r$r" 1 "${L[@]}" ;;
        tr2) trj "tr_tp2_r$r" 2 "${L[@]}" --parallelism.tensor_parallel_degree 2 ;;
        # the same with the tp collectives timed ([metrics] comm_overlap):
        # its own program, as the timing's events may cost a little
        tr2m) trj "tr_tp2m_r$r" 2 "${L[@]}" --parallelism.tensor_parallel_degree 2 \
                --metrics.comm_overlap ;;
        pt) pt "pt_tp2_r$r" llama_tp.py ;;
        pc) pt "pt_tp2c_r$r" llama_tp.py --compile ;;
        ptl) pt "pt_tp2l_r$r" llama_tp.py --plan layers ;;
        ptlc) pt "pt_tp2lc_r$r" llama_tp.py --plan layers --compile ;;
        tr2e) trj "tr_tp2_8b_r$r" 2 "${E[@]}" --training.local_batch_size "$B8" \
                --parallelism.tensor_parallel_degree 2 ;;
        pte) pt "pt_tp2_8b_r$r" llama_tp.py --flavor 8B -B "$B8" ;;
        pce) pt "pt_tp2c_8b_r$r" llama_tp.py --flavor 8B -B "$B8" --compile ;;
        trp1e) trj "tr_pp2_1F1B_8b_r$r" 2 "${E[@]}" --training.local_batch_size 8 \
                 --parallelism.pipeline_parallel_degree 2 ;;
        ptp1e) pt "pt_pp2_1F1Bc_8b_r$r" llama_pp.py --flavor 8B --schedule 1F1B --compile ;;
        trpze) trj "tr_pp2_ZBVZeroBubble_8b_r$r" 2 "${E[@]}" \
                 --training.local_batch_size 8 --parallelism.pipeline_parallel_degree 2 \
                 --parallelism.pipeline_parallel_schedule ZBVZeroBubble ;;
        ptpze) pt "pt_pp2_ZBVZeroBubble_8b_r$r" llama_pp.py --flavor 8B \
                 --schedule ZBVZeroBubble ;;
        trp1) trj "tr_pp${PP}_1F1B_r$r" "$PP" "${L[@]}" \
                --parallelism.pipeline_parallel_degree "$PP" ;;
        trpz) trj "tr_pp${PP}_ZBVZeroBubble_r$r" "$PP" "${L[@]}" \
                --parallelism.pipeline_parallel_degree "$PP" \
                --parallelism.pipeline_parallel_schedule ZBVZeroBubble ;;
        ptp1) PT_NPROC=$PP pt "pt_pp${PP}_1F1Bc_r$r" llama_pp.py --schedule 1F1B --compile ;;
        ptp1n) PT_NPROC=$PP pt "pt_pp${PP}_1F1B_r$r" llama_pp.py --schedule 1F1B ;;
        # PyTorch 2.11 refuses compiled stage modules under ZBVZeroBubble
        ptpz) PT_NPROC=$PP pt "pt_pp${PP}_ZBVZeroBubble_r$r" llama_pp.py --schedule ZBVZeroBubble ;;
        trc1) trj "tr_cp1gpu_r$r" 1 "${C[@]}" ;;
        trc) trj "tr_cp2_allgather_r$r" 2 "${C[@]}" \
               --parallelism.context_parallel_degree 2 \
               --parallelism.context_parallel_rotate_method allgather ;;
        trca) trj "tr_cp2_alltoall_r$r" 2 "${C[@]}" \
                --parallelism.context_parallel_degree 2 \
                --parallelism.context_parallel_rotate_method alltoall ;;
        ptc) PT_B=$CP_B PT_T=$CP_T pt "pt_cp2_allgather_r$r" llama_cp.py --rotate allgather ;;
        ptcc) PT_B=$CP_B PT_T=$CP_T pt "pt_cp2_allgatherc_r$r" llama_cp.py --rotate allgather --compile ;;
        ptca) PT_B=$CP_B PT_T=$CP_T pt "pt_cp2_alltoall_r$r" llama_cp.py --rotate alltoall ;;
        ptcac) PT_B=$CP_B PT_T=$CP_T pt "pt_cp2_alltoallc_r$r" llama_cp.py --rotate alltoall --compile ;;
        trf) trj "tr_flex_block_r$r" 1 "${F[@]}" --model.attn_mask_type block_causal ;;
        trff) TRAINRUN_ATTENTION=flash trj "tr_flex_block_flash_r$r" 1 "${F[@]}" \
                --model.attn_mask_type block_causal ;;
        trfc) trj "tr_flex_causal_r$r" 1 "${F[@]}" ;;
        ptf) ptflex "pt_flex_blockc_r$r" --mask block_causal --compile ;;
        ptfe) ptflex "pt_flex_block_r$r" --mask block_causal ;;
      esac
    done
  done
fi

"$PY" - "$OUT" <<'EOF' >"$OUT/summary.md"
import glob, json, math, os, statistics, sys
out = sys.argv[1]
def jl(p):
    rows = []
    for line in open(p):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows
print("# tensor, pipeline and context parallel on 2 GPUs, masks on 1\n")
print("```\n" + open(os.path.join(out, "versions.txt")).read() + "```\n")
a = os.path.join(out, "check_1gpu.metrics.jsonl")
for n in ("check_tp2", "check_pp2", "check_pp2_zbv"):
    b = os.path.join(out, n + ".metrics.jsonl")
    if not (os.path.exists(a) and os.path.exists(b)):
        continue
    x = {r["step"]: r for r in jl(a) if "loss" in r}
    y = {r["step"]: r for r in jl(b) if "loss" in r}
    worst = {"loss": 0.0, "grad_norm": 0.0}
    for s in x:
        if s in y:
            for k in worst:
                worst[k] = max(worst[k], abs(y[s][k] - x[s][k]) / abs(x[s][k]))
    print("correctness %s against 1 GPU, fp32 (no TF32): %d steps compared, "
          "max relative difference loss %.3g, grad_norm %.3g (want <= 1e-5)\n"
          % (n, len(set(x) & set(y)), worst["loss"], worst["grad_norm"]))
def med(vals):
    return statistics.median(vals) if vals else float("nan")
def finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)
rows = []
for label, pat, kind in (("trainrun, 1 GPU", "tr_1gpu_r*", "tr"),
                         ("trainrun TP 2", "tr_tp2_r*", "tr"),
                         ("PyTorch TP 2, torchtitan's plan", "pt_tp2_r*", "pt"),
                         ("PyTorch TP 2, torchtitan's plan + compile", "pt_tp2c_r*", "pt"),
                         ("PyTorch TP 2, layers only", "pt_tp2l_r*", "pt"),
                         ("PyTorch TP 2, layers only + compile", "pt_tp2lc_r*", "pt"),
                         ("8B: trainrun TP 2", "tr_tp2_8b_r*", "tr"),
                         ("8B: PyTorch TP 2, torchtitan's plan", "pt_tp2_8b_r*", "pt"),
                         ("8B: PyTorch TP 2, torchtitan's plan + compile", "pt_tp2c_8b_r*", "pt"),
                         ("8B: trainrun PP 2 1F1B", "tr_pp2_1F1B_8b_r*", "tr"),
                         ("8B: PyTorch pipelining 1F1B + compile", "pt_pp2_1F1Bc_8b_r*", "pt"),
                         ("8B: trainrun PP 2 ZBVZeroBubble", "tr_pp2_ZBVZeroBubble_8b_r*", "tr"),
                         ("8B: PyTorch pipelining ZBVZeroBubble", "pt_pp2_ZBVZeroBubble_8b_r*", "pt"),
                         *[row for n in (2, 4) for row in (
                         ("trainrun PP %d 1F1B" % n, "tr_pp%d_1F1B_r*" % n, "tr"),
                         ("PyTorch pipelining PP %d 1F1B" % n, "pt_pp%d_1F1B_r*" % n, "pt"),
                         ("PyTorch pipelining PP %d 1F1B + compile" % n, "pt_pp%d_1F1Bc_r*" % n, "pt"),
                         ("trainrun PP %d ZBVZeroBubble" % n, "tr_pp%d_ZBVZeroBubble_r*" % n, "tr"),
                         ("PyTorch pipelining PP %d ZBVZeroBubble (compile refused)" % n, "pt_pp%d_ZBVZeroBubble_r*" % n, "pt"))],
                         ("CP length: trainrun, 1 GPU", "tr_cp1gpu_r*", "tr"),
                         ("CP length: trainrun CP 2 allgather", "tr_cp2_allgather_r*", "tr"),
                         ("CP length: trainrun CP 2 alltoall", "tr_cp2_alltoall_r*", "tr"),
                         ("CP length: PyTorch CP 2 allgather", "pt_cp2_allgather_r*", "pt"),
                         ("CP length: PyTorch CP 2 allgather + compile", "pt_cp2_allgatherc_r*", "pt"),
                         ("CP length: PyTorch CP 2 alltoall", "pt_cp2_alltoall_r*", "pt"),
                         ("CP length: PyTorch CP 2 alltoall + compile", "pt_cp2_alltoallc_r*", "pt"),
                         ("documents, 1 GPU: trainrun block_causal", "tr_flex_block_r[0-9]*", "tr"),
                         ("documents, 1 GPU: trainrun block_causal, flash kernel", "tr_flex_block_flash_r*", "tr"),
                         ("documents, 1 GPU: trainrun causal (reference)", "tr_flex_causal_r*", "tr"),
                         ("documents, 1 GPU: PyTorch FlexAttention block_causal + compile", "pt_flex_blockc_r*", "pt"),
                         ("documents, 1 GPU: PyTorch FlexAttention block_causal (model eager)", "pt_flex_block_r*", "pt")):
    runs, mems = [], []
    logs = sorted(glob.glob(os.path.join(out, pat + ".log")))
    if not logs:  # not asked for in this call
        continue
    for p in logs:
        if kind == "tr":  # its metrics, where it wrote them
            p = p[:-len(".log")] + ".metrics.jsonl"
        r = jl(p) if os.path.exists(p) else []
        if kind == "tr":
            tps = [e["tps"] for e in r if "tps" in e and e.get("step", 0) > 5]
            if tps:
                runs.append(med(tps))
            mems += [e["mem_peak_bytes"] / 2**30 for e in r
                     if finite(e.get("mem_peak_bytes"))]
        else:
            s = [e for e in r if "summary" in e]
            if s and s[0].get("median_tps"):
                runs.append(s[0]["median_tps"])
            if s and s[0].get("max_mem_gib"):
                mems.append(s[0]["max_mem_gib"])
    rows.append((label, runs, max(mems) if mems else None))
print("| program (Llama 3.2 1B, bf16; B8 x T2048, CP length B%s x T%s, documents B%s x T%s) "
      "| tokens/s per GPU, median | runs | peak GiB (rank 0) |"
      % tuple(os.environ.get(k, d) for k, d in (("CP_B", "1"), ("CP_T", "16384"),
                                                 ("FLEX_B", "2"), ("FLEX_T", "8192"))))
print("|---|---|---|---|")
for label, runs, mem in rows:
    print("| %s | %s | %s | %s |" % (label, "%.0f" % med(runs) if runs else "failed",
                                   ", ".join("%.0f" % v for v in runs),
                                   "%.1f" % mem if mem else ""))
# cplong: one GPU out of memory where CP 2 trains
txt = os.path.join(out, "cplong.txt")
if os.path.exists(txt):
    print("\n## long sequence: one GPU against CP 2\n")
    print("```\n" + open(txt).read() + "```\n")
    rcs = {}
    if os.path.exists(os.path.join(out, "runs.txt")):
        for line in open(os.path.join(out, "runs.txt")):
            name, _, rc = line.strip().partition(" rc=")
            rcs[name] = rc
    for name in ("cplong_1gpu", "cplong_cp2_allgather", "cplong_cp2_alltoall"):
        log = os.path.join(out, name + ".log")
        if not os.path.exists(log):
            continue
        m = os.path.join(out, name + ".metrics.jsonl")
        r = jl(m) if os.path.exists(m) else []
        steps = [e for e in r if "loss" in e]
        oom = [l.strip() for l in open(log, errors="replace")
               if "out of memory" in l.lower() or "enomem" in l.lower()]
        tps = [e["tps"] for e in steps if e.get("step", 0) > 3]
        peak = [e["mem_peak_bytes"] / 2**30 for e in steps
                if finite(e.get("mem_peak_bytes"))]
        print("- %s: exit status %s, %d steps logged%s%s%s" % (
            name, rcs.get(name, "?"), len(steps),
            ", last loss %.4f" % steps[-1]["loss"] if steps else "",
            ", tokens/s per GPU %.0f, peak %.1f GiB" % (med(tps), max(peak))
            if tps and peak else "",
            "; out of memory: `%s`" % oom[0][:300] if oom else ""))
EOF
"$PY" - "$OUT" <<'EOF' >>"$OUT/summary.md"
import glob, json, os, statistics, sys
# tr2m: tensor parallel's communication per step ([metrics] comm_overlap)
for p in sorted(glob.glob(os.path.join(sys.argv[1], "tr_tp2m_r*.metrics.jsonl"))):
    rows = [json.loads(l) for l in open(p) if l.startswith("{")]
    rows = [r for r in rows if r.get("step", 0) > 5 and "tp_comm_ms" in r]
    el = [r["elapsed_s"] for r in rows if "elapsed_s" in r]
    if len(el) < 2:
        continue
    step = statistics.median(b - a for a, b in zip(el, el[1:])) * 1e3
    med = lambda k: statistics.median(r[k] for r in rows)
    print("\n%s: tp comm %.1f ms a step (%.1f%% of a %.1f ms step), "
          "exposed %.1f ms, hidden %.0f%%"
          % (os.path.basename(p).split(".")[0], med("tp_comm_ms"),
             100 * med("tp_comm_ms") / step, step, med("tp_comm_exposed_ms"),
             100 * med("tp_comm_hidden")))
EOF
for f in "$OUT"/idle_*.log; do
  [ -e "$f" ] || continue
  { echo; echo "$(basename "$f" .log): $(grep -o 'pipeline step 10: .*' "$f")"; } >>"$OUT/summary.md"
done
cat "$OUT/summary.md"
