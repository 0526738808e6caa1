#!/bin/sh
# tests/gpu/kernels.sh: the CUDA kernels' test and benchmark on a GPU machine
# (which has CUDA, cuDNN and NCCL but not libuv, jansson or Check).
#
# On the CPU machine, in a build configured with CUDA:
#   make libtrainrun.la tests/check_kernels_cuda bench/kernels_bench
#   ../tests/gpu/kernels.sh stage . gpu     # binaries + missing libs -> ./gpu
# then send that folder along (device `carry`), and on the GPU machine, from
# the repository root:
#   tests/gpu/kernels.sh run BUILD/gpu [kernels_bench flags, e.g. -q]
# `run` prints the test's per-kernel error table, then the benchmark's
# timing table, on stdout; it exits non-zero when the test fails.
set -eu

usage() {
  echo "usage: $0 stage BUILD_DIR OUT_DIR | run DIR [bench flags]" >&2
  exit 2
}

# the real executable behind a libtool wrapper script
real_bin() {
  f=$1
  if head -c 2 "$f" | grep -q '#!'; then
    d=$(dirname "$f")
    b=$(basename "$f")
    if [ -e "$d/.libs/lt-$b" ]; then f=$d/.libs/lt-$b
    elif [ -e "$d/.libs/$b" ]; then f=$d/.libs/$b
    fi
  fi
  echo "$f"
}

case ${1:-} in
  stage)
    [ $# -eq 3 ] || usage
    build=$2
    out=$3
    mkdir -p "$out/lib"
    cp -L "$build/.libs/libtrainrun.so.0" "$out/lib/"
    cp "$(real_bin "$build/tests/check_kernels_cuda")" "$out/check_kernels_cuda"
    cp "$(real_bin "$build/bench/kernels_bench")" "$out/kernels_bench"
    # what the GPU machine lacks: all but glibc, the C++ runtime, the CUDA
    # family (its own) and Open MPI (its own)
    skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvidia|libnvrtc|libnvJitLink|libmpi|libopen-rte|libopen-pal|libz\.|libudev|libevent)'
    for f in "$out/lib/libtrainrun.so.0" "$out/check_kernels_cuda" \
             "$out/kernels_bench"; do
      ldd "$f" | awk '$3 ~ /^\// {print $1, $3}' |
        while read -r name path; do
          if ! echo "$name" | grep -Eq "$skip" && [ ! -e "$out/lib/$name" ]
          then cp -L "$path" "$out/lib/$name"; fi
        done
    done
    du -sh "$out"
    ls "$out" "$out/lib"
    ;;
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
    "$dir/check_kernels_cuda" || rc=$?
    echo "== check_kernels_cuda exit status $rc"
    echo "== bench: kernels_bench $*"
    brc=0
    "$dir/kernels_bench" "$@" || brc=$?
    echo "== kernels_bench exit status $brc"
    [ "$rc" = 0 ] && [ "$brc" = 0 ]
    ;;
  *)
    usage
    ;;
esac
