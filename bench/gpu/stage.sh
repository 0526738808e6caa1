#!/usr/bin/env bash
# bench/gpu/stage.sh: stage a CUDA build for the GPU machine in an ignored
# folder of this repository (.gpu, .gpu2, ...), to travel with `carry`.
#
#   bench/gpu/stage.sh BUILD DEST
#
# BUILD is a configured and built tree (`./bootstrap --enable-werror` with
# CUDA found, then `make bench/kernels_bench bench/coll_bench
# tests/check_kernels_cuda tests/check_pg_nccl` for the kernel programs,
# which are staged when they are built). DEST gets:
#   bin/     trainrun, trainrund (the real binaries, not libtool's wrappers)
#   lib/     libtrainrun.so.0 and the shared libraries the GPU machine lacks
#            (libuv, jansson, Gloo and its dependencies, Check's subunit: all
#            but glibc, the C++ runtime, the CUDA family, Open MPI, OpenBLAS)
#   kern/    kernels_bench, coll_bench, check_kernels_cuda, check_pg_nccl
#   trainrun, trainrund   wrappers that put DEST/lib first and run bin/
#   env.sh   sourced on the GPU machine from the repository root: the
#            machine's CUDA, cuDNN, NCCL and Open MPI settings with DEST/lib
#            first (NVLink multicast off)
#   COMMIT   the build's commit
# A benchmark then runs with TRAINRUN=DEST/trainrun; another build's library
# is tried under the same binaries with LD_LIBRARY_PATH=$PWD/DEST2/lib.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bench/gpu/stage.sh BUILD DEST" >&2; exit 2; }
build=$(cd "$1" && pwd)
dest=$2
[ -x "$build/.libs/trainrun" ] || { echo "stage.sh: $build/.libs/trainrun is not built" >&2; exit 1; }
# DEST is replaced whole: never a tree of sources or a build
if [ -e "$dest/.git" ] || [ -e "$dest/configure.ac" ] || [ "$(basename "$dest")" = . ]; then
  echo "stage.sh: $dest holds sources: give a folder of its own (.gpu)" >&2
  exit 2
fi
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/kern"
cp "$build/.libs/trainrun" "$build/.libs/trainrund" "$dest/bin/"
cp -L "$build/.libs/libtrainrun.so.0" "$dest/lib/"
for p in bench/kernels_bench bench/coll_bench tests/check_kernels_cuda tests/check_pg_nccl; do
  b=$build/$(dirname "$p")/.libs/$(basename "$p")
  if [ -x "$b" ]; then cp "$b" "$dest/kern/"; fi
done
# what the GPU machine lacks: all but glibc, the C++ runtime, the CUDA family,
# Open MPI and OpenBLAS (it has its own)
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvidia|libnvrtc|libnvJitLink|libmpi|libopen-rte|libopen-pal|libz\.|libudev|libevent|libgomp|libopenblas|libblas|liblapack|libgfortran|libquadmath)'
for f in "$dest/bin/trainrun" "$dest/bin/trainrund" "$dest/lib/libtrainrun.so.0" \
  "$dest"/kern/*; do
  [ -e "$f" ] || continue # no kernel programs built
  LD_LIBRARY_PATH=$build/.libs ldd "$f" | awk '$3 ~ /^\// {print $1, $3}' |
    while read -r name path; do
      if ! echo "$name" | grep -Eq "$skip" && [ ! -e "$dest/lib/$name" ]; then
        cp -L "$path" "$dest/lib/$name"
      fi
    done
done
for b in trainrun trainrund; do
  cat >"$dest/$b" <<EOF
#!/bin/sh
d=\$(cd "\$(dirname "\$0")" && pwd)
LD_LIBRARY_PATH="\$d/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$d/bin/$b" "\$@"
EOF
  chmod +x "$dest/$b"
done
name=$(basename "$dest")
cat >"$dest/env.sh" <<EOF
# Source from the repository root on the GPU machine: . $name/env.sh
here=\$(pwd)
cudnn=\$(dirname "\$(find / -name 'libcudnn.so.9' -not -path '*/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="\$here/$name/lib:/usr/local/cuda/lib64:\${cudnn:+\$cudnn:}\${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "LD_LIBRARY_PATH=\$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
EOF
git -C "$build" rev-parse --short HEAD >"$dest/COMMIT"
du -sh "$dest" | awk -v c="$(cat "$dest/COMMIT")" '{print "staged", c, "in", $2, "(" $1 ")"}'
