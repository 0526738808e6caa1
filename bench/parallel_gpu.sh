#!/usr/bin/env bash
# bench/parallel_gpu.sh: tensor and pipeline parallelism on 2 GPUs of one
# host (issues 18 and 19), in one call: correctness (fp32, no TF32: TP 2
# and PP 2 against 1 GPU) and speed (Llama 3.2 1B, bf16, B8 x T2048:
# trainrun on 1 GPU, trainrun TP 2 and PyTorch TP 2 (bench/peers/
# llama_tp.py, the same plan) with and without torch.compile; trainrun PP
# 2 and PyTorch's pipelining (bench/peers/llama_pp.py) with 1F1B and
# ZBVZeroBubble, 8 micro-batches of 1), the speed programs alternating
# order over REPS rounds; a markdown table in OUT/summary.md with medians.
#
#   . .gpu/env.sh && bench/parallel_gpu.sh [--reps N] [--runs LIST]
#
# LIST: comma-separated of check, pp_check, tp, pp, idle, tp8b, pp8b,
# idle8b (default all but the 8B ones, which want 2 H200s).
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
#
# PROGRAMS (a subset of the round's programs: tr1 tr2 pt pc trp1 ptp1
# ptp1n trpz ptpz) splits the rounds over calls.
#
# Environment: OUT (./out), SCRATCH (/tmp/trainrun-tp), TP_STEPS (20),
# FIRST_REP (1: the first round's number; even rounds run the programs in
# reverse order, so a second call with FIRST_REP=2 alternates),
# PYTHON (python3), TORCHRUN ("$PYTHON -m torch.distributed.run").
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
PY=${PYTHON:-python3}
if [ -z "${TRAINRUN:-}" ]; then
  if [ -x .gpu/trainrun ]; then TRAINRUN=.gpu/trainrun; else TRAINRUN=./trainrun; fi
fi
read -r -a TORCHRUN_CMD <<< "${TORCHRUN:-$PY -m torch.distributed.run}"
OUT=${OUT:-./out}
SCRATCH=${SCRATCH:-/tmp/trainrun-tp}
STEPS=${TP_STEPS:-20}
mkdir -p "$OUT" "$SCRATCH"

# trj NAME NPROC ARGS...: a trainrun job, its metrics kept, its dump removed
trj() {
  name=$1 np=$2
  shift 2
  rm -rf "${SCRATCH:?}/$name"
  timeout 240 "$TRAINRUN" --nproc-per-node "$np" "$@" \
    --job.dump_folder "$SCRATCH/$name" --metrics.enable_jsonl=true \
    >"$OUT/$name.log" 2>&1
  echo "$name rc=$? at $(date +%T)" >>"$OUT/runs.txt"
  cp "$SCRATCH/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  rm -rf "${SCRATCH:?}/$name"
}

# pt NAME PEER ARGS...: a PyTorch peer on 2 GPUs
pt() {
  name=$1 peer=$2
  shift 2
  timeout 300 "${TORCHRUN_CMD[@]}" --nproc-per-node 2 \
    "bench/peers/$peer" --data "$SCRATCH/llama.bin" -B 8 -T 2048 \
    --steps "$STEPS" "$@" >"$OUT/$name.log" 2>&1
  echo "$name rc=$? at $(date +%T)" >>"$OUT/runs.txt"
}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  nvcc --version 2>/dev/null | tail -1
  "$PY" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' 2>&1
  git rev-parse HEAD 2>/dev/null
} >"$OUT/versions.txt"

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

if want tp || want pp || want idle || want idle8b || want tp8b || want pp8b; then
  [ -s "$SCRATCH/llama.bin" ] ||
    "$PY" bench/gpu/make_shard.py --out "$SCRATCH/llama.bin" \
      --tokens 20000000 --vocab 128256 --width 4 >"$OUT/shard.log" 2>&1
  for m in 1b 8b; do
    if [ $m = 1b ]; then want idle || continue; sfx=""
    else want idle8b || continue; sfx="_8b"; fi
    for sch in 1F1B ZBVZeroBubble; do
      TRAINRUN_PP_TRACE="$OUT/idle_$sch$sfx.trace.json" TRAINRUN_PP_TRACE_STEP=10 \
        trj "idle_$sch$sfx" 2 "bench/gpu/llama3_$m.toml" \
        --training.dataset_path "$SCRATCH/llama.bin" --training.steps 12 \
        --training.local_batch_size 8 \
        --parallelism.pipeline_parallel_degree 2 \
        --parallelism.pipeline_parallel_schedule "$sch"
    done
  done
  order=""
  { want tp || want pp; } && order=tr1
  want tp && order="$order tr2 pt pc ptl ptlc"
  want pp && order="$order trp1 ptp1 ptp1n trpz ptpz"
  want tp8b && order="$order tr2e pte pce"
  want pp8b && order="$order trp1e ptp1e trpze ptpze"
  order=${PROGRAMS:-$order} # a subset, e.g. "pt pc" (one call's share)
  first=${FIRST_REP:-1} # a later call goes on with round FIRST_REP
  for r in $(seq "$first" $((first + reps - 1))); do
    list=$order
    [ $((r % 2)) = 0 ] && list=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
    for p in $list; do
      L=(bench/gpu/llama3_1b.toml --training.dataset_path "$SCRATCH/llama.bin"
        --training.steps "$STEPS")
      E=(bench/gpu/llama3_8b.toml --training.dataset_path "$SCRATCH/llama.bin"
        --training.steps "$STEPS")
      B8=${B8B:-2}
      case $p in
        tr1) trj "tr_1gpu_r$r" 1 "${L[@]}" ;;
        tr2) trj "tr_tp2_r$r" 2 "${L[@]}" --parallelism.tensor_parallel_degree 2 ;;
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
        trp1) trj "tr_pp2_1F1B_r$r" 2 "${L[@]}" --parallelism.pipeline_parallel_degree 2 ;;
        trpz) trj "tr_pp2_ZBVZeroBubble_r$r" 2 "${L[@]}" \
                --parallelism.pipeline_parallel_degree 2 \
                --parallelism.pipeline_parallel_schedule ZBVZeroBubble ;;
        ptp1) pt "pt_pp2_1F1Bc_r$r" llama_pp.py --schedule 1F1B --compile ;;
        ptp1n) pt "pt_pp2_1F1B_r$r" llama_pp.py --schedule 1F1B ;;
        # PyTorch 2.11 refuses compiled stage modules under ZBVZeroBubble
        ptpz) pt "pt_pp2_ZBVZeroBubble_r$r" llama_pp.py --schedule ZBVZeroBubble ;;
      esac
    done
  done
fi

"$PY" - "$OUT" <<'EOF' >"$OUT/summary.md"
import glob, json, os, statistics, sys
out = sys.argv[1]
def jl(p):
    rows = []
    for line in open(p):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows
print("# tensor and pipeline parallel on 2 GPUs\n")
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
                         ("trainrun PP 2 1F1B", "tr_pp2_1F1B_r*", "tr"),
                         ("PyTorch pipelining 1F1B", "pt_pp2_1F1B_r*", "pt"),
                         ("PyTorch pipelining 1F1B + compile", "pt_pp2_1F1Bc_r*", "pt"),
                         ("trainrun PP 2 ZBVZeroBubble", "tr_pp2_ZBVZeroBubble_r*", "tr"),
                         ("PyTorch pipelining ZBVZeroBubble (compile refused)", "pt_pp2_ZBVZeroBubble_r*", "pt")):
    runs = []
    for p in sorted(glob.glob(os.path.join(out, pat + (".metrics.jsonl" if kind == "tr" else ".log")))):
        r = jl(p)
        if kind == "tr":
            tps = [e["tps"] for e in r if "tps" in e and e.get("step", 0) > 5]
            if tps:
                runs.append(med(tps))
        else:
            s = [e for e in r if "summary" in e]
            if s and s[0].get("median_tps"):
                runs.append(s[0]["median_tps"])
    rows.append((label, runs))
print("| program (Llama 3.2 1B, bf16, B8 x T2048) | tokens/s per GPU, median | runs |")
print("|---|---|---|")
for label, runs in rows:
    if not runs and not glob.glob(os.path.join(out, "*")):
        continue
    print("| %s | %s | %s |" % (label, "%.0f" % med(runs) if runs else "failed",
                              ", ".join("%.0f" % v for v in runs)))
EOF
for f in "$OUT"/idle_*.log; do
  [ -e "$f" ] || continue
  { echo; echo "$(basename "$f" .log): $(grep -o 'pipeline step 10: .*' "$f")"; } >>"$OUT/summary.md"
done
cat "$OUT/summary.md"
