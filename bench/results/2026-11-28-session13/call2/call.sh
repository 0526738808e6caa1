#!/bin/bash
# session 13 call 2 (2 GPUs): collfast (check_pg_nccl, coll_bench vs main); DDP GPT-2 where the scaling goes (comm_overlap, CUPTI trace)
. .gpu/env.sh >/dev/null 2>&1
R=$OUT/r; mkdir -p "$R"
(sleep 570; cd "$OUT" && tar czf c2.tgz r) &
nvidia-smi > "$R/nvidia-smi.txt" 2>&1; nvidia-smi topo -m >> "$R/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 1000 > "$R/smi.csv" 2>&1 & SMI=$!
L0=$LD_LIBRARY_PATH
S=/tmp/s13; mkdir -p $S
python3 bench/gpu/make_shard.py --out $S/gpt2.bin --tokens 16000000 --vocab 50257 --width 2 > "$R/shards.log" 2>&1 & P1=$!
python3 tests/gpu/trace_gaps.py --build $S/tr > "$R/build.log" 2>&1 & P2=$!
( export LD_LIBRARY_PATH=$PWD/.gpu3/lib:$L0; timeout 200 .gpu3/kern/check_pg_nccl > "$R/check_pg_nccl_collfast.log" 2>&1; echo "check collfast rc=$? $(date +%T)" >> "$R/runs.txt" )
for b in .gpu .gpu3 .gpu .gpu3; do ( export LD_LIBRARY_PATH=$PWD/$b/lib:$L0; timeout 100 $b/kern/coll_bench -b nccl --issue-costs --raw-events --min 64K --max 64M --reps 3 >> "$R/coll_${b#.}.log" 2>&1; echo "coll $b rc=$? $(date +%T)" >> "$R/runs.txt" ); done
wait $P1 $P2
G=(bench/gpu/gpt2_124m.toml --training.dataset_path $S/gpt2.bin --validation.enable=false)
run() { n=$1 t=$2; shift 2; rm -rf "$S/o"
  timeout $t .gpu/trainrun "$@" --job.dump_folder "$S/o" > "$R/$n.log" 2>&1
  echo "$n rc=$? $(date +%T)" >> "$R/runs.txt"
  cp "$S/o/metrics.jsonl" "$R/$n.metrics.jsonl" 2>/dev/null; rm -rf "$S/o"; }
run ddp_ov 90 --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}" --training.steps 40 --metrics.comm_overlap=true
run one_a 60 "${G[@]}" --training.steps 40
run ddp_a 90 --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}" --training.steps 40
rm -rf "$S/o" "$S/t"; mkdir -p "$S/t"
CUDA_INJECTION64_PATH=$S/tr/libcupti_trace.so TRACE_DIR=$S/t timeout 120 .gpu/trainrun --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}" --training.steps 12 --job.dump_folder $S/o > "$R/tr_ddp.log" 2>&1
echo "trace ddp rc=$? $(date +%T)" >> "$R/runs.txt"
ls -la $S/t > "$R/tr_ddp.gaps.txt"
for f in $(ls -S $S/t/trace-*.txt | head -2); do python3 tests/gpu/trace_gaps.py "$f" >> "$R/tr_ddp.gaps.txt" 2>&1; gzip -c "$f" > "$R/tr_ddp.$(basename $f).gz"; done
run one_b 60 "${G[@]}" --training.steps 40
run ddp_b 90 --nproc-per-node 2 --parallelism.data_parallel_replicate_degree 2 "${G[@]}" --training.steps 40
kill $SMI
cd "$OUT" && tar czf c2.tgz r
