#!/bin/sh
# tests/gpu/kernels.sh: the CUDA kernels' test and benchmark on a GPU machine
# (which has CUDA, cuDNN and NCCL but not libuv, jansson or Check).
#
# On the CPU machine, in a build configured with CUDA:
#   make tests/check_kernels_cuda bench/kernels_bench
#   bench/gpu/stage.sh BUILD .gpu     # binaries + missing libs -> ./.gpu
# then send that folder along (device `carry`), and on the GPU machine, from
# the repository root:
#   tests/gpu/kernels.sh run .gpu [kernels_bench flags, e.g. -q]
# `run` prints the test's per-kernel error table, then the benchmark's
# timing table, on stdout; it exits non-zero when the test fails.
set -eu

usage() {
  echo "usage: $0 run DIR [bench flags]   (DIR: a bench/gpu/stage.sh folder)" >&2
  exit 2
}

case ${1:-} in
  run)
    [ $# -ge 2 ] || usage
    dir=$2
    shift 2
    cudnn=$(dirname "$(find / -name 'libcudnn.so.9' -not -path '/proc/*' \
      2>/dev/null | head -1)" 2>/dev/null || true)
    LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64:${cudnn:+$cudnn:}${LD_LIBRARY_PATH:-}"
    export LD_LIBRARY_PATH
    export NCCL_NVLS_ENABLE=0
    nvidia-smi --query-gpu=index,name,memory.total,driver_version \
      --format=csv,noheader || true
    echo "== tests: check_kernels_cuda"
    rc=0
    "$dir/kern/check_kernels_cuda" || rc=$?
    echo "== check_kernels_cuda exit status $rc"
    echo "== bench: kernels_bench $*"
    brc=0
    "$dir/kern/kernels_bench" "$@" || brc=$?
    echo "== kernels_bench exit status $brc"
    [ "$rc" = 0 ] && [ "$brc" = 0 ]
    ;;
  *)
    usage
    ;;
esac
