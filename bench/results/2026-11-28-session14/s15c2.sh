#!/bin/bash
# NEXT SESSION protocol call (one H100; carry [".gpu", "peers", ".gpucache"] while .gpucache stays under ~40 MB, else leave .gpucache/triton out):
# the next share of issue 22's GPT-2 protocol (bench/results/2026-11-29-protocol-gpt2). Afterwards, in the repository's root:
#   tar xzf /work/.device/N/results.tgz && rm -rf .gpucache && cat /work/.device/N/cache.tgz.* | tar xzf -   (then commit the results)
. .gpu/env.sh >/dev/null 2>&1
O=bench/results/2026-11-29-protocol-gpt2
(sleep 585; cd "$OUT" && tar czf part.tgz -C "$OLDPWD" $O) &
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 & SMI=$!
PACK=$OUT TRAINRUN=.gpu/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu bench/gpu/protocol_call.sh gpt2 $O .gpucache > "$OUT/call.log" 2>&1
kill $SMI
