#!/usr/bin/env bash
# bench/gpu/protocol_streams.sh: several protocol loops (bench/gpu/
# protocol_loop.sh) at once on one host, each on GPUs and CPU cores of its
# own, so that a call on a machine of 4 GPUs runs the one-GPU protocols and
# the two-GPU one side by side:
#
#   bench/gpu/protocol_streams.sh MODE:GPUS:CORES:OUTDIR ...
#
# e.g. llama1b:0:0-15:bench/results/X gpt2:1:16-31:bench/results/Y
# multigpu:2,3:32-63:bench/results/Z. GPUS: one index (gpt2, llama1b) or a
# list (multigpu); CORES: taskset's list. Each stream runs in a session of
# its own (setsid) under `taskset -c CORES`, with its own scratch folder
# (/tmp/trainrun-stream-N) and compile cache (.gpucache-MODE), its files in
# $OUT/MODE-N (protocol_loop.sh's: results.tgz, share logs, runs.txt,
# smi.csv), packed at the end with streams.txt into $OUT/streams.tgz.
# Within a stream the programs alternate as always; two streams
# share the host's memory and PCIe but no GPU and no core, so a compile in
# one does not take the cores of another's runs. The GPUs, streams and
# cores are written to $OUT/streams.txt, to be kept with the results.
# Environment: as protocol_loop.sh (G, END, NPROC, LLMC_BIN). Exits 2 on a
# usage error, else 0 once every stream has ended.
set -u
[ $# -ge 1 ] || {
  echo "usage: bench/gpu/protocol_streams.sh MODE:GPUS:CORES:OUTDIR ..." >&2
  exit 2
}
OUT=${OUT:-./out}
mkdir -p "$OUT" || exit 2
specs=()
for s in "$@"; do
  IFS=: read -r mode gpus cores dir extra <<< "$s"
  case $mode in gpt2 | llama1b | multigpu) ;; *) mode= ;; esac
  if [ -z "$mode" ] || [ -z "$gpus" ] || [ -z "$cores" ] || [ -z "$dir" ] || [ -n "$extra" ]; then
    echo "protocol_streams: '$s' is not MODE:GPUS:CORES:OUTDIR (MODE gpt2, llama1b or multigpu)" >&2
    exit 2
  fi
  specs+=("$mode:$gpus:$cores:$dir")
done
command -v taskset > /dev/null || {
  echo "protocol_streams: taskset not found (util-linux)" >&2
  exit 2
}
{
  echo "== $(date -u +%FT%TZ) $(nproc) cores"
  nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader 2>&1
} >> "$OUT/streams.txt"
pids=()
n=0
for s in "${specs[@]}"; do
  IFS=: read -r mode gpus cores dir <<< "$s"
  n=$((n + 1))
  echo "stream $n: $mode on GPUs $gpus, cores $cores, into $dir" >> "$OUT/streams.txt"
  mkdir -p "$OUT/$mode-$n"
  OUT=$OUT/$mode-$n GPUS=$gpus SCRATCH=/tmp/trainrun-stream-$n \
    setsid -w taskset -c "$cores" bench/gpu/protocol_loop.sh "$mode" "$dir" \
    > "$OUT/$mode-$n/loop.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$OUT"/*/runs.txt 2> /dev/null
# One archive: a device call returns a limited number of files, and three
# streams' logs (session 18's first call) are more than that.
dirs=()
for ((i = 1; i <= n; i++)); do
  IFS=: read -r mode _ <<< "${specs[i - 1]}"
  dirs+=("$mode-$i")
done
(cd "$OUT" && tar czf streams.tgz streams.txt "${dirs[@]}" && rm -rf "${dirs[@]}") ||
  echo "protocol_streams: packing $OUT/streams.tgz failed; the files stay in $OUT" >&2
exit 0
