#!/bin/sh
# bench/store_compare.sh: the TCPStore figures of docs/PERFORMANCE.md in one
# run -- trainrun's server (1 I/O thread, and 4: the default on 16 or more
# CPUs) next to
# PyTorch's libuv TCPStore and the null server (the load generator's
# ceiling) -- on a multi-core host with `python3 -c "import torch"`.
#
#   bench/store_compare.sh OUTDIR [BUILD_DIR]
#
# BUILD_DIR holds a built bench/store_bench; without it the store bench is
# built (configure --without-cuda) in OUTDIR/build. The tables go to stdout
# and OUTDIR/store_compare.txt. About 7 minutes on a 16-core host (1-2 of
# them building). Loads run inside `unshare -n` (a private loopback) when
# unshare and ip work, as PyTorch's server resolves every client's address
# in its event loop; elsewhere on the host's loopback.
#
# The rendezvous runs twice: with paced connects (store_bench's default
# connect window, 3/4 of somaxconn clients connecting at once: it measures
# the servers) and, for BURST_CLIENTS, as a burst (every client at once)
# against one accept queue and against the server's default of
# ceil(clients / somaxconn) SO_REUSEPORT queues (the null server gets as
# many): that pair shows what the extra queues save in dropped SYNs.
#
# Knobs (environment): GEN_PROCS x GEN_THREADS load-generator threads
# (default 4 x 2), SERVER_THREADS (default 1,4), REPEAT (median of 3),
# PYTHON (python3), CLIENTS (1024,4096,16384), BURST_CLIENTS (16384; none
# skips the burst runs), WINDOW (store_bench's default).
set -eu
out=${1:?usage: store_compare.sh OUTDIR [BUILD_DIR]}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${2:-}
GEN_PROCS=${GEN_PROCS:-4}
GEN_THREADS=${GEN_THREADS:-2}
SERVER_THREADS=${SERVER_THREADS:-1,4}
REPEAT=${REPEAT:-3}
PYTHON=${PYTHON:-python3}
CLIENTS=${CLIENTS:-1024,4096,16384}
BURST_CLIENTS=${BURST_CLIENTS:-16384}
WINDOW=${WINDOW:-}
ncpu=$(nproc)

if [ -z "$build" ] || [ ! -x "$build/bench/store_bench" ]; then
  build=$out/build
  mkdir -p "$build"
  if [ ! -x "$src/configure" ]; then
    (cd "$src" && autoreconf -fi) >"$out/autoreconf.log" 2>&1
  fi
  if [ ! -f "$build/Makefile" ]; then
    (cd "$build" && "$src/configure" --without-cuda) >"$out/configure.log" 2>&1 ||
      { echo "store_compare: configure failed, see $out/configure.log" >&2; exit 1; }
  fi
  (cd "$build" && make -j"$ncpu" bench/store_bench) >"$out/make.log" 2>&1 ||
    { echo "store_compare: build failed, see $out/make.log" >&2; exit 1; }
fi
bench=$build/bench/store_bench

ns=""
if command -v unshare >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 &&
   unshare -n sh -c 'ip link set lo up' 2>/dev/null; then
  ns="unshare -n"
fi

run() { # the store bench, in a private loopback when one can be had
  if [ -n "$ns" ]; then
    # shellcheck disable=SC2016
    $ns sh -c 'ip link set lo up && exec "$@"' sh "$bench" "$@"
  else
    "$bench" "$@"
  fi
}

{
  echo "store_compare: $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -srm), $ncpu CPUs"
  echo "  $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')"
  echo "  somaxconn $(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo ?)," \
       "open files $(ulimit -Hn), ${ns:-no unshare: host loopback}"
  echo "  $("$PYTHON" -c 'import torch; print("PyTorch", torch.__version__)' 2>&1 | tail -1)"
  echo
  echo "== rendezvous (paced connects) and 64-client operations: 1 and several I/O threads =="
  run --clients "$CLIENTS" --procs "$GEN_PROCS" --threads "$GEN_THREADS" \
      --server-threads "$SERVER_THREADS" --repeat "$REPEAT" \
      ${WINDOW:+--connect-window "$WINDOW"} \
      --ops-clients 64 --ops-seconds 2 --python "$PYTHON"
  echo
  if [ "$BURST_CLIENTS" != none ]; then
    echo "== rendezvous burst (no connect window): one accept queue =="
    run --clients "$BURST_CLIENTS" --procs "$GEN_PROCS" --threads "$GEN_THREADS" \
        --server-threads "$SERVER_THREADS" --repeat "$REPEAT" \
        --connect-window 0 --listeners 1 --ops-seconds 0 --python "$PYTHON"
    echo
    echo "== rendezvous burst (no connect window): the default accept queues =="
    run --clients "$BURST_CLIENTS" --procs "$GEN_PROCS" --threads "$GEN_THREADS" \
        --server-threads "$SERVER_THREADS" --repeat "$REPEAT" \
        --connect-window 0 --ops-seconds 0 --python "$PYTHON"
    echo
  fi
  echo "== operations/s with 256 clients: I/O-thread scaling =="
  run --clients none --procs "$GEN_PROCS" --threads "$GEN_THREADS" \
      --server-threads 1,2,4,8 --null-threads 8 --repeat "$REPEAT" \
      --ops-clients 256 --ops-seconds 2 --python "$PYTHON"
} 2>&1 | tee "$out/store_compare.txt"
