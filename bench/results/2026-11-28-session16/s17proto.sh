#!/bin/bash
# NEXT SESSION protocol call (one H200 for MODE gpt2 / llama1b, two for multigpu; carry
# [".gpu", "peers/llmc-bin/train_gpt2cu", "peers/llm.c/COMMIT"]): shares of issue 22's
# protocol one after another until it is complete or fewer than 90 s of the call are left,
# each planned from the runs before it, each run cut to end by END (560 s into the call).
# PyTorch's compile caches stay in CACHE on the machine: run the next call at once, while
# the machine is warm (30 s), and its compiles are warm too; a cold machine compiles again
# (max-autotune: 135-341 s). The caches do not come back (over 60 MiB compressed).
# Afterwards, in the repository's root: tar xzf /work/.device/N/results.tgz, then commit.
# Before it, on a new checkout: a CUDA build (./bootstrap --enable-werror in a worktree,
# make bench/kernels_bench bench/coll_bench tests/check_kernels_cuda tests/check_pg_nccl),
# bench/gpu/stage.sh BUILD .gpu, bench/gpu_train.sh --build-llmc peers/llmc-bin (llm.c
# f1e2ace and cudnn-frontend cloned into peers/llm.c, peers/llm.c/COMMIT written by
# `git -C peers/llm.c log -1 --format='%H %cd' > peers/llm.c/COMMIT`).
# G: the staged build (default .gpu; another stage.sh folder keeps one build through a protocol)
G=${G:-.gpu}
. "$G/env.sh" >/dev/null 2>&1
MODE=${MODE:-gpt2}
case $MODE in
  gpt2) O=bench/results/2026-11-28-protocol-gpt2-h200 C=.gpucache-h200 ;;
  # O: the first call's folder on every later call of that mode
  llama1b) O=${O:-bench/results/$(date +%F)-protocol-llama1b-h200} C=.gpucache-h200-llama ;;
  multigpu) O=${O:-bench/results/$(date +%F)-protocol-multigpu-h200} C=.gpucache-h200-mg ;;
  *) echo "MODE gpt2, llama1b or multigpu" >&2; exit 2 ;;
esac
END=${END:-560}
(sleep $((END + 25)); cd "$OUT" && tar czf results.tgz -C "$OLDPWD" "$O") &
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 & SMI=$!
i=0
while :; do
  left=$((END - SECONDS))
  [ $left -ge 90 ] || break
  i=$((i + 1))
  BUDGET=$((left - 20)) BENCH_DEADLINE=$left MG_DEADLINE=$left TRAINRUN=$G/trainrun \
    LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu bench/gpu/protocol_call.sh "$MODE" "$O" "$C" > "$OUT/share$i.log" 2>&1
  echo "share $i rc=$? $(date +%T) $(grep -m1 '^PROGRAMS=' "$OUT/share$i.log")" >> "$OUT/runs.txt"
  (cd "$OUT" && tar czf results.tgz -C "$OLDPWD" "$O")
  grep -q '^PROGRAMS=' "$OUT/share$i.log" || break # complete
done
kill $SMI
cat "$OUT/runs.txt"
