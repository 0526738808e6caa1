#!/bin/sh
# tests/gpu/cp.sh: the GPU check of context parallelism on CUDA (the
# shifted-chunk attention kernels and the device log-sum-exp merge of
# dtensor/cp.c), on a machine with 2 GPUs.
#
#   1. the kernels: check_kernels_cuda (its test_attention_shifted compares
#      the CUDA SIMT and flash kernels with q_shift, composed with
#      documents and windows, against the CPU kernel), when KERNELS_DIR
#      (a folder staged by bench/gpu/stage.sh) is given;
#   2. training: examples/debug.toml's Llama (debugmodel) in float32
#      (mixed_precision_param float32; the fp32 GEMMs are full fp32, TF32
#      is off by default) at seq_len 256, 20 steps, one GPU against two
#      GPUs at context_parallel_degree 2, with each rotate method
#      (allgather, alltoall); then the same in bf16 compute (the flash
#      kernel) against one GPU in bf16. For each pair it prints the
#      largest relative difference of the loss and of the grad norm over
#      the 20 steps (metrics.jsonl) and checks it against CP_TOL (1e-4)
#      in fp32 and CP_TOL_BF16 (2e-2) in bf16; then fp32 again at one
#      sequence a step (each gradient chunk contiguous: written in place).
#
#   tests/gpu/cp.sh TRAINRUN OUTDIR [KERNELS_DIR]
#
# TRAINRUN: the trainrun executable (its libraries on LD_LIBRARY_PATH, as
# for tests/gpu/train.sh); run from the repository root. Exits 1 when a
# run fails or a difference is above its tolerance, 77 without 2 GPUs.
set -eu
tr=${1:?usage: cp.sh TRAINRUN OUTDIR [KERNELS_DIR]}
out=${2:?usage: cp.sh TRAINRUN OUTDIR [KERNELS_DIR]}
kdir=${3:-}
tol=${CP_TOL:-1e-4}
tol16=${CP_TOL_BF16:-2e-2}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null |
  wc -l || echo 0)
if [ "$ngpu" -lt 2 ]; then
  echo "cp.sh: skipped: $ngpu GPUs, 2 needed"
  exit 77
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version \
  --format=csv,noheader || true
fail=0

if [ -n "$kdir" ]; then
  echo "== check_kernels_cuda"
  krc=0
  "$kdir/kern/check_kernels_cuda" >"$out/check_kernels_cuda.log" 2>&1 || krc=$?
  grep -E "shift=|see no key|FAIL|Checks" "$out/check_kernels_cuda.log" || true
  echo "== check_kernels_cuda exit status $krc"
  [ "$krc" = 0 ] || fail=1
fi

run() { # name nproc precision [flags]
  name=$1 np=$2 prec=$3
  shift 3
  "$tr" --nproc-per-node "$np" \
    examples/debug.toml --training.device cuda \
    --training.mixed_precision_param "$prec" --training.steps 20 \
    --training.seq_len 256 --training.global_batch_size 2 \
    --training.local_batch_size 2 --metrics.log_freq 1 \
    --metrics.enable_jsonl=true --validation.no_enable --debug.seed 7 \
    --job.dump_folder "$out/$name" "$@" >"$out/$name.log" 2>&1 || {
    echo "FAIL: $name exited non-zero (see $out/$name.log)"
    tail -5 "$out/$name.log"
    return 1
  }
}

# compare RUN REF TOL: the largest relative differences over the steps
compare() {
  python3 - "$out/$1" "$out/$2" "$3" "$1" "$2" <<'EOF'
import json, sys
run, ref, tol, a_name, b_name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
def steps(d):
    out = {}
    for line in open(d + "/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r and "grad_norm" in r:
            out[r["step"]] = (r["loss"], r["grad_norm"])
    return out
a, b = steps(run), steps(ref)
if not b or sorted(a) != sorted(b):
    print("FAIL %s vs %s: steps %s, reference %s" % (a_name, b_name, sorted(a), sorted(b)))
    sys.exit(1)
worst = [0.0, 0.0]
for s in b:
    for i in range(2):
        x, y = a[s][i], b[s][i]
        worst[i] = max(worst[i], abs(x - y) / abs(y) if y else abs(x))
ok = max(worst) <= tol
print("%s vs %s over %d steps: max rel diff loss %.3e, grad_norm %.3e (tol %.0e) %s"
      % (a_name, b_name, len(b), worst[0], worst[1], tol, "ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
EOF
}

CP2="--parallelism.context_parallel_degree 2"
echo "== training: Llama debugmodel, seq_len 256, 20 steps"
if run one 1 float32; then
  run cp2 2 float32 $CP2 && compare cp2 one "$tol" || fail=1
  run cp2_a2a 2 float32 $CP2 \
    --parallelism.context_parallel_rotate_method alltoall &&
    compare cp2_a2a one "$tol" || fail=1
else
  fail=1
fi
if run one16 1 bfloat16; then
  run cp2_16 2 bfloat16 $CP2 && compare cp2_16 one16 "$tol16" || fail=1
else
  fail=1
fi
# One sequence a step: a chunk of a gradient is then contiguous and the
# ring's pairs write it in place (B 2 above goes through scratch copies).
B1="--training.global_batch_size 1 --training.local_batch_size 1"
echo "== training: the same at one sequence a step"
if run one_b1 1 float32 $B1; then
  run cp2_b1 2 float32 $CP2 $B1 && compare cp2_b1 one_b1 "$tol" || fail=1
  run cp2_a2a_b1 2 float32 $CP2 $B1 \
    --parallelism.context_parallel_rotate_method alltoall &&
    compare cp2_a2a_b1 one_b1 "$tol" || fail=1
else
  fail=1
fi
[ "$fail" = 0 ] && echo "cp.sh: pass" || echo "cp.sh: FAIL"
exit "$fail"
