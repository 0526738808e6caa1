#!/bin/sh
# bench/llmc_compare.sh: GPT-2 124M fp32 training throughput of trainrun's CPU
# kernels (bench/cpu_train) next to llm.c's CPU trainer (train_gpt2.c) on the
# same weights, tokens, batch shape and thread count, in one run.
#
#   bench/llmc_compare.sh BUILD_DIR LLMC_DIR [B T STEPS THREADS ROUNDS]
#
# BUILD_DIR holds a built bench/cpu_train; LLMC_DIR a checkout of
# karpathy/llm.c (never committed here: see peers/ in .gitignore). llm.c's
# main() fixes B=4, T=64, 40 steps and evaluates every 10 steps, so a copy
# of train_gpt2.c gets B, T, the step count and one validation batch from
# -D flags, then builds with its Makefile's CPU flags (-Ofast -march=native
# -fopenmp). cpu_train --llmc writes llm.c's checkpoint (our random init)
# and token files, so both run the identical workload. Step 0 is warm-up in
# both; the table gives the mean of the other steps. ROUNDS (default 2)
# alternates the two programs to even out a busy machine.
set -eu
build=${1:?usage: llmc_compare.sh BUILD_DIR LLMC_DIR [B T STEPS THREADS ROUNDS]}
llmc=${2:?usage: llmc_compare.sh BUILD_DIR LLMC_DIR [B T STEPS THREADS ROUNDS]}
B=${3:-4}
T=${4:-64}
STEPS=${5:-10}
THREADS=${6:-$(nproc)}
ROUNDS=${7:-2}
CC=${CC:-cc}

work=$(mktemp -d "${TMPDIR:-/tmp}/llmc_compare.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

# llm.c with B, T, steps and one validation batch from the command line
sed -e 's/int B = 4;/int B = BENCH_B;/' \
    -e 's/int T = 64;/int T = BENCH_T;/' \
    -e 's/step <= 40;/step <= BENCH_STEPS;/' \
    -e 's/int val_num_batches = 5;/int val_num_batches = 1;/' \
    "$llmc/train_gpt2.c" > "$work/train_gpt2.c"
for f in B T STEPS; do
  grep -q "BENCH_$f" "$work/train_gpt2.c" ||
    { echo "llmc_compare: cannot patch $f in $llmc/train_gpt2.c" >&2; exit 1; }
done
$CC -Ofast -Wno-unused-result -march=native -fopenmp -DOMP \
    -DBENCH_B="$B" -DBENCH_T="$T" -DBENCH_STEPS="$STEPS" -I"$llmc" \
    "$work/train_gpt2.c" -lm -lgomp -o "$work/train_gpt2"

"$build/bench/cpu_train" -B "$B" -T "$T" -n 0 --llmc "$work" \
    > /dev/null

llmc_row() {
  (cd "$work" && OMP_NUM_THREADS=$THREADS ./train_gpt2) > "$work/llmc.out"
  awk -v B="$B" -v T="$T" -v thr="$THREADS" '
    /^step [0-9]+: train loss/ {
      s = $2 + 0; ms = $(NF - 1); sub(/\(/, "", ms)
      if (s == 0) loss0 = $5; else { tot += ms; n++ }
      lossN = $5
    }
    END {
      if (n == 0) { print "llmc_compare: no steps from llm.c" > "/dev/stderr"; exit 1 }
      printf "%-8s %-10s %3d %5d %3d %-7s %10.1f %10.1f %8s %9s %9.4f %9.4f\n",
        "llm.c", "124M", B, T, thr, "own", tot / n, B * T * n * 1000 / tot,
        "-", "-", loss0, lossN
    }' "$work/llmc.out"
}

"$build/bench/cpu_train" --header -B "$B" -T "$T" -n "$STEPS" -t "$THREADS" \
    | head -1
r=0
while [ "$r" -lt "$ROUNDS" ]; do
  "$build/bench/cpu_train" -B "$B" -T "$T" -n "$STEPS" -t "$THREADS"
  llmc_row
  r=$((r + 1))
done
