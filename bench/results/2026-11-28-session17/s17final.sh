#!/bin/bash
# Session 17's last call (one H200, ~330 s of budget left; carry [".gpu", ".gpu1",
# "peers/llmc-bin/train_gpt2cu", "peers/llm.c/COMMIT"]; .gpu = stage.sh of ed5e417, the
# cuDNN attention tuning; .gpu1 = 810d32b, the protocol's build), in order of need:
# 1. check_kernels_cuda with ed5e417 (the tuning's test and every cuDNN test with it on);
# 2. kernels_bench's cuDNN rows with the timed picks (against call 1's config-0 rows);
# 3. the GPT-2 protocol's last run (round 3 of torch_compile_tunable_v50304);
# 4. A/B GPT-2 of ed5e417 against itself with TRAINRUN_CUDNN_ATTN_TUNE=1 (A: no timing);
# 5. the same for Llama 3.2 1B, with what time is left.
END=${END:-300}
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv -lms 500 > "$R/smi.csv" 2>&1 & SMI=$!
left() { echo $((END - SECONDS)); }
timeout 100 .gpu/kern/check_kernels_cuda > "$R/check_kernels_cuda.log" 2>&1
echo "check_kernels_cuda rc=$? $(date +%T)" >> "$R/runs.txt"
TRAINRUN_LOG_LEVEL=info timeout 60 .gpu/kern/kernels_bench -w 200 -f cudnn > "$R/kb_tuned.log" 2>&1
echo "kernels_bench rc=$? $(date +%T)" >> "$R/runs.txt"
mkdir -p "$OUT/p"
G=.gpu1 MODE=gpt2 END=$(( $(left) - 150 )) OUT=$OUT/p bash bench/results/2026-11-28-session16/s17proto.sh > "$R/proto.log" 2>&1
echo "protocol rc=$? $(date +%T)" >> "$R/runs.txt"
AB_JOBS=gpt2 AB_ENV_A="TRAINRUN_CUDNN_ATTN_TUNE=1" timeout $(( $(left) - 5 )) bench/ab_train.sh .gpu .gpu "$OUT/ab_gpt2" 3 > "$R/ab_gpt2.log" 2>&1
echo "ab gpt2 rc=$? $(date +%T)" >> "$R/runs.txt"
if [ "$(left)" -gt 80 ]; then
  AB_JOBS=llama AB_ENV_A="TRAINRUN_CUDNN_ATTN_TUNE=1" timeout $(( $(left) - 5 )) bench/ab_train.sh .gpu .gpu "$OUT/ab_llama" 1 > "$R/ab_llama.log" 2>&1
  echo "ab llama rc=$? $(date +%T)" >> "$R/runs.txt"
fi
kill $SMI
cat "$R/runs.txt"
