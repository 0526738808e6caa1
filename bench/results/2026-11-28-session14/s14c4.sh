#!/bin/bash
# NEXT SESSION protocol call (one H100; carry [".gpu", "peers", ".gpucache"] -- .gpucache only once a call has brought one back):
# the next share of issue 22's GPT-2 protocol into bench/results/2026-11-29-protocol-gpt2 (commit its files after each call)
. .gpu/env.sh >/dev/null 2>&1
O=bench/results/2026-11-29-protocol-gpt2; mkdir -p $O
(sleep 580; cd "$OUT" && tar czf part.tgz -C "$OLDPWD" $O) &
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 & SMI=$!
TRAINRUN=.gpu/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu bench/gpu/protocol_call.sh gpt2 $O .gpucache > "$OUT/call.log" 2>&1
kill $SMI
tar czf "$OUT/results.tgz" $O
tar czf "$OUT/gpucache.tgz" .gpucache 2>/dev/null
ls -la "$OUT"
