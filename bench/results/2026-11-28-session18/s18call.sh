#!/bin/bash
# Session 18's third call (nvidia-h200-x4; carry [".gpu", ".gpu1"]; .gpu = bench/gpu/
# stage.sh of bd7b5a7, .gpu1 = 810d32b, the protocols' build). Everything returns in
# ONE archive, $OUT/all.tgz: a call returns at most 8 files, and the first call of this
# session lost the Llama and multi-GPU streams' files to that limit.
#   GPU 0 (cores 0-15):   Llama 3.2 1B's protocol, the next share;
#   GPUs 2,3 (32-63):     multi_gpu.sh's protocol, round 2;
#   GPU 1 (cores 16-31):  gpu1.sh: check_kernels_cuda with bd7b5a7 (the shared tuning
#                         helper, kernels/cuda/tune.cu, never yet run on a GPU),
#                         kernels_bench's Llama rows (fused qkv, w1|w3), block_causal
#                         against FlexAttention (issue 23), then the A/B of the cuDNN
#                         attention tuning on Llama and documents.
D=bench/results/2026-11-28-session18
mkdir -p "$OUT/gpu1"
OUT=$OUT/gpu1 CUDA_VISIBLE_DEVICES=1 setsid -w taskset -c 16-31 bash $D/gpu1.sh > "$OUT/gpu1/gpu1.log" 2>&1 &
G1=$!
END=${END:-530} G=.gpu1 bench/gpu/protocol_streams.sh \
  llama1b:0:0-15:bench/results/2026-11-28-protocol-llama1b-h200 \
  multigpu:2,3:32-63:bench/results/2026-11-28-protocol-multigpu-h200 > "$OUT/streams.log" 2>&1
wait $G1
cd "$OUT" && tar czf /tmp/all.tgz --exclude='*.bin' --exclude='*.safetensors' . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/"
ls -la "$OUT"
