#!/bin/bash
# NEXT SESSION protocol call (one H200; carry [".gpu", "peers/llmc-bin", "peers/llm.c/COMMIT", ".gpucache-h200-parts"]):
# the next share of issue 22's GPT-2 protocol on the H200 (bench/results/2026-11-28-protocol-gpt2-h200), PyTorch's caches
# unpacked from the parts the last call returned (protocol_call.sh CACHE_PARTS). Afterwards, in the repository's root:
#   tar xzf /work/.device/N/results.tgz; rm -rf .gpucache-h200; cat /work/.device/N/cache.tgz.* | tar xzf -
#   and, where the new parts total under ~45 MB: rm .gpucache-h200-parts/*; cp /work/.device/N/cache.tgz.* .gpucache-h200-parts/
# Then commit the results. Run it again until summarize.py --plan says the protocol is complete.
# trainrun's rounds 2-3 must be the merged build's: rounds of an older build go to superseded-build/ (NOTES.md).
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
O=bench/results/2026-11-28-protocol-gpt2-h200
(sleep 580; cd "$OUT" && tar czf part.tgz r -C "$OLDPWD" $O) &
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
BUDGET=${BUDGET:-500} CACHE_PARTS=.gpucache-h200-parts PACK=$OUT TRAINRUN=.gpu/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu \
  bench/gpu/protocol_call.sh gpt2 $O .gpucache-h200 > "$R/call.log" 2>&1
echo "protocol rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
cd "$OUT" && tar czf r.tgz r
