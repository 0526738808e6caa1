# tests/parallel.sh: what the end-to-end tests of the parallel layouts
# share (tests/cli_tp.test, tests/cli_pp.test), sourced with $suite set to
# the test's name: run trainrun and check its exit code, train
# examples/debug.toml for 8 steps on a given number of ranks, compare two
# runs' losses and gradient norms (within $tol relative, default 1e-5) and
# final weights (1e-4 max-abs), and match a run's output. Skips (77)
# without python3.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
TRAINRUN="$top_builddir/trainrun"
PY=$(command -v python3 || true)
if [ -z "$PY" ]; then
  echo "$suite: skipped, python3 not found"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/$suite.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
failed=0
passed=0

# run NAME WANT_RC ARGS...: run trainrun, keep stdout/stderr in $tmp/NAME.*
run() {
  name=$1 want=$2
  shift 2
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    "$TRAINRUN" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL $name: exit $rc, expected $want (trainrun $*)"
    sed 's/^/  stdout: /' "$tmp/$name.out" | tail -5
    sed 's/^/  stderr: /' "$tmp/$name.err" | tail -10
    failed=$((failed + 1))
  else
    passed=$((passed + 1))
  fi
}

# train NAME NPROC ARGS...: examples/debug.toml, global batch 4 x 32 tokens
train() {
  name=$1 np=$2
  shift 2
  run "$name" 0 --nproc-per-node "$np" "$top_srcdir/examples/debug.toml" \
    --training.steps 8 --metrics.log_freq 1 --training.global_batch_size 4 \
    --training.seq_len 32 --validation.no_enable --debug.seed 7 \
    --metrics.enable_jsonl=true \
    --training.dataset_path "$top_srcdir/examples/data/tinytales.txt" \
    --job.dump_folder "$tmp/$name" "$@"
}

# compare NAME REF [FIRST]: NAME's metrics.jsonl steps >= FIRST (default 1)
# have REF's loss and grad_norm within $tol relative (the grad_norm within
# $gtol when set); without FIRST, the final weights too (within $wtol
# max-abs, default 1e-4)
tol=1e-5
gtol=
wtol=1e-4
compare() {
  if ! "$PY" - "$tmp/$1" "$tmp/$2" "${3:-}" "$tol" "$wtol" "${gtol:-$tol}" \
    <<'EOF'; then
import json, struct, sys, array
run, ref, first, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
wtol, gtol = float(sys.argv[5]), float(sys.argv[6])
def steps(d):
    out = {}
    for line in open(d + "/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r and "grad_norm" in r:
            out[r["step"]] = (r["loss"], r["grad_norm"])
    return out
a, b = steps(run), steps(ref)
lo = int(first) if first else 1
want = [s for s in b if s >= lo]
bad = []
if not want or any(s not in a for s in want):
    bad.append("steps %s, reference %s" % (sorted(a), sorted(b)))
for s in want:
    if s not in a:
        continue
    for i, what in enumerate(("loss", "grad_norm")):
        x, y = a[s][i], b[s][i]
        if abs(x - y) > (gtol if i else tol) * abs(y):
            bad.append("step %d %s %.9g vs %.9g" % (s, what, x, y))
def tensors(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["shape"], array.array("f", raw[8 + n + v["data_offsets"][0]:
                                                8 + n + v["data_offsets"][1]]))
            for k, v in h.items()}
if not first:
    wa, wb = tensors(run + "/model.safetensors"), tensors(ref + "/model.safetensors")
    if sorted(wa) != sorted(wb):
        bad.append("tensors differ: %s" % sorted(set(wa) ^ set(wb)))
    worst = 0.0
    for k in wb:
        if k in wa and wa[k][0] == wb[k][0]:
            worst = max([worst] + [abs(x - y) for x, y in zip(wa[k][1], wb[k][1])])
        elif k in wa:
            bad.append("%s: shape %s vs %s" % (k, wa[k][0], wb[k][0]))
    if worst > wtol:
        bad.append("final weights differ by %.3g" % worst)
for b_ in bad:
    print("  " + b_)
sys.exit(1 if bad else 0)
EOF
    echo "FAIL $1: differs from $2"
    failed=$((failed + 1))
  fi
}

expect_grep() {
  if ! grep -q -- "$3" "$tmp/$1.$2"; then
    echo "FAIL $1: $2 lacks '$3'"
    sed 's/^/  /' "$tmp/$1.$2" | tail -5
    failed=$((failed + 1))
  fi
}

# expect_err NAME TEXT: stderr is exactly TEXT (one line)
expect_err() {
  printf '%s\n' "$2" >"$tmp/$1.want"
  if ! cmp -s "$tmp/$1.want" "$tmp/$1.err"; then
    echo "FAIL $1: stderr differs"
    diff -u "$tmp/$1.want" "$tmp/$1.err" | sed 's/^/  /'
    failed=$((failed + 1))
  fi
}

