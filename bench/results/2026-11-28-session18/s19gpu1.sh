#!/bin/bash
# s19call.sh's GPU 1 share (CUDA_VISIBLE_DEVICES=1 from the caller): tests/gpu with .gpu
# (the session 16 set, s16g1.sh): kernels, CPU against GPU training, Hugging Face
# parity, the loss curve against PyTorch. Ends by END1 s.
END1=${END1:-540}
. .gpu/env.sh > /dev/null 2>&1
R=$OUT; S=/tmp/s19g; mkdir -p $S
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; .gpu/trainrun --version > "$R/version.txt" 2>&1
timeout 150 .gpu/kern/check_kernels_cuda > "$R/check_kernels_cuda.log" 2>&1
echo "check_kernels_cuda rc=$? $(date +%T)" >> "$R/runs.txt"
timeout 200 sh tests/gpu/train.sh .gpu/trainrun $S/train 40 > "$R/train.log" 2>&1
echo "train.sh rc=$? $(date +%T)" >> "$R/runs.txt"; rm -rf $S/train
timeout 200 python3 tests/gpu/hf_parity.py .gpu/trainrun $S/hf 200 > "$R/hf_parity.log" 2>&1
echo "hf_parity rc=$? $(date +%T)" >> "$R/runs.txt"; rm -rf $S/hf
TRAINRUN=.gpu/trainrun timeout $((END1 - SECONDS)) sh tests/gpu/curve.sh $S/curve > "$R/curve.log" 2>&1
echo "curve rc=$? $(date +%T)" >> "$R/runs.txt"
cp $S/curve/curve.csv $S/curve/curve.png "$R/" 2>/dev/null
rm -rf $S
