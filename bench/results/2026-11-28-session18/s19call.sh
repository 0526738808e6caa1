#!/bin/bash
# NEXT SESSION (19), nvidia-h200-x4; carry [".gpu", ".gpu1"] (.gpu = bench/gpu/stage.sh
# of main's HEAD, .gpu1 = 810d32b, the protocols' build). Returns ONE archive,
# $OUT/all.tgz (a call returns at most 8 files):
#   GPU 0 (cores 0-15):  Llama 3.2 1B's protocol, the next share;
#   GPUs 2,3 (32-63):    multi_gpu.sh's protocol, the next share;
#   GPU 1 (cores 16-31): $GPU1 (default s19gpu1.sh: tests/gpu with .gpu, issue 22's
#                        "no correctness lost" on the machine the figures come from).
# After the call: tar xzf all.tgz; tar xzf streams.tgz; tar xzf each
# MODE-N/results.tgz in the repository's root; commit.
D=bench/results/2026-11-28-session18
GPU1=${GPU1:-$D/s19gpu1.sh}
mkdir -p "$OUT/gpu1"
OUT=$OUT/gpu1 CUDA_VISIBLE_DEVICES=1 setsid -w taskset -c 16-31 bash "$GPU1" > "$OUT/gpu1/gpu1.log" 2>&1 &
G1=$!
END=${END:-530} G=.gpu1 bench/gpu/protocol_streams.sh \
  llama1b:0:0-15:bench/results/2026-11-28-protocol-llama1b-h200 \
  multigpu:2,3:32-63:bench/results/2026-11-28-protocol-multigpu-h200 > "$OUT/streams.log" 2>&1
wait $G1
cd "$OUT" && tar czf /tmp/all.tgz --exclude='*.bin' --exclude='*.safetensors' . &&
  rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/"
ls -la "$OUT"
