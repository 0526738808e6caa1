#!/bin/bash
# protocol call (one H100; carry .gpu peers .gpucache): an autotune first (its wall is unknown), then the compile variants
. .gpu/env.sh >/dev/null 2>&1
O=bench/results/2026-11-29-protocol-gpt2; mkdir -p $O
(sleep 585; cd "$OUT" && tar czf part.tgz -C "$OLDPWD" $O) &
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$OUT/smi.csv" 2>&1 & SMI=$!
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton
PROGRAMS="${P:-torch_autotune torch_compile_nosync torch_compile_v50304 torch_compile_v50304_nosync}" FIRST_REP=${FR:-1} REPS=${RP:-1} BENCH_DEADLINE=${DL:-560} TRAINRUN=.gpu/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu bench/gpu_train.sh gpt2 $O > "$OUT/call.log" 2>&1
kill $SMI
tar czf "$OUT/results.tgz" $O
tar czf "$OUT/gpucache.tgz" .gpucache 2>/dev/null
