#!/bin/bash
# NEXT SESSION protocol call (one H200; carry [".gpu", "peers/llmc-bin", "peers/llm.c/COMMIT", ".gpucache-h200-parts"]; MODE=llama1b: see below):
# the next share of issue 22's GPT-2 protocol on the H200 (bench/results/2026-11-28-protocol-gpt2-h200), PyTorch's caches
# unpacked from the parts the last call returned (protocol_call.sh CACHE_PARTS). Afterwards, in the repository's root:
#   tar xzf /work/.device/N/results.tgz; rm -rf .gpucache-h200; cat /work/.device/N/cache.tgz.* | tar xzf -
#   and, where the new parts total under ~45 MB: rm .gpucache-h200-parts/*; cp /work/.device/N/cache.tgz.* .gpucache-h200-parts/
# Then commit the results. Run it again until summarize.py --plan says the protocol is complete.
# trainrun's rounds 2-3 must be the merged build's: rounds of an older build go to superseded-build/ (NOTES.md).
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
# MODE=llama1b runs the Llama 3.2 1B protocol instead (its own folder and
# cache: carry .gpucache-h200-llama-parts once a call has returned some)
MODE=${MODE:-gpt2}
case $MODE in
  gpt2) O=bench/results/2026-11-28-protocol-gpt2-h200 C=.gpucache-h200 ;;
  # O: the first Llama call's folder on every later call
  llama1b) O=${O:-bench/results/$(date +%F)-protocol-llama1b-h200} C=.gpucache-h200-llama ;;
  *) echo "MODE gpt2 or llama1b" >&2; exit 2 ;;
esac
P=; [ -d "$C-parts" ] && P=$C-parts
(sleep 580; cd "$OUT" && tar czf part.tgz r -C "$OLDPWD" $O) &
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
BUDGET=${BUDGET:-500} CACHE_PARTS=$P PACK=$OUT TRAINRUN=.gpu/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu \
  bench/gpu/protocol_call.sh $MODE $O $C > "$R/call.log" 2>&1
echo "protocol rc=$? $(date +%T)" >> "$R/runs.txt"
kill $SMI
cd "$OUT" && tar czf r.tgz r
