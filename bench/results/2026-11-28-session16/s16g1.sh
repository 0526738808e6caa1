#!/bin/bash
# tests/gpu on one H200 with the session's build (carry [".gpu"] = bench/gpu/stage.sh of main): issue 22's "no correctness lost"
# (kernels, CPU-vs-GPU training, Hugging Face parity, the loss curve against PyTorch), each log under $OUT/r
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"; S=/tmp/s16g; mkdir -p $S
(sleep 580; cd "$OUT" && tar czf g.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; .gpu/trainrun --version > "$R/version.txt" 2>&1
timeout 150 .gpu/kern/check_kernels_cuda > "$R/check_kernels_cuda.log" 2>&1; echo "check_kernels_cuda rc=$? $(date +%T)" >> "$R/runs.txt"
timeout 200 sh tests/gpu/train.sh .gpu/trainrun $S/train 40 > "$R/train.log" 2>&1; echo "train.sh rc=$? $(date +%T)" >> "$R/runs.txt"; rm -rf $S/train
timeout 200 python3 tests/gpu/hf_parity.py .gpu/trainrun $S/hf 200 > "$R/hf_parity.log" 2>&1; echo "hf_parity rc=$? $(date +%T)" >> "$R/runs.txt"; rm -rf $S/hf
TRAINRUN=.gpu/trainrun timeout $((570 - SECONDS)) sh tests/gpu/curve.sh $S/curve > "$R/curve.log" 2>&1; echo "curve rc=$? $(date +%T)" >> "$R/runs.txt"
cp $S/curve/curve.csv $S/curve/curve.png "$R/" 2>/dev/null
cd "$OUT" && tar czf g.tgz r
