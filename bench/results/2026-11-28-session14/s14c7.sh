#!/bin/bash
# protocol call (one H100; carry .gpu .gpu4 peers): trainrun round 1 again with main's build (.gpu4 = main ca3b513's code), then rounds 2-3 of trainrun and the peers' fastest configurations so far and those within 3%
. .gpu/env.sh >/dev/null 2>&1
O=bench/results/2026-11-29-protocol-gpt2
(sleep 325; cd "$OUT" && tar czf part.tgz -C "$OLDPWD" $O) &
export TORCHINDUCTOR_CACHE_DIR=/tmp/gc/inductor TRITON_CACHE_DIR=/tmp/gc/triton
export TRAINRUN=.gpu4/trainrun LLMC_BIN=$PWD/peers/llmc-bin/train_gpt2cu
PROGRAMS="trainrun" FIRST_REP=1 REPS=1 BENCH_DEADLINE=60 bench/gpu_train.sh gpt2 $O > "$OUT/call1.log" 2>&1
PROGRAMS="trainrun llmc_r0_ge2 torch_compile_nosync torch_compile_v50304 torch_compile_v50304_nosync" FIRST_REP=2 REPS=2 BENCH_DEADLINE=$((318 - SECONDS)) bench/gpu_train.sh gpt2 $O > "$OUT/call2.log" 2>&1
cd "$OUT" && tar czf results.tgz -C "$OLDPWD" $O
