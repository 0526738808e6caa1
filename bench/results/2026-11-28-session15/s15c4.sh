#!/bin/bash
# session 15 call 4 (one H200; carry [".gpu", "peers", ".gpucache-h200"]): the next share of issue 22's GPT-2 protocol on an H200
# Afterwards, in the repository's root: tar xzf /work/.device/N/results.tgz && rm -rf .gpucache-h200 && cat /work/.device/N/cache.tgz.* | tar xzf -
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
O=bench/results/2026-11-28-protocol-gpt2-h200
(sleep 580; cd "$OUT" && tar czf part.tgz r -C "$OLDPWD" $O) &
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
BUDGET=${BUDGET:-500} PACK=$OUT TRAINRUN=.gpu/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu bench/gpu/protocol_call.sh gpt2 $O .gpucache-h200 > "$R/call.log" 2>&1
echo "protocol rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
cd "$OUT" && tar czf r.tgz r
