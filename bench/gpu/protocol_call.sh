#!/usr/bin/env bash
# bench/gpu/protocol_call.sh: one call's share of issue 22's protocol for
# bench/gpu_train.sh or bench/multi_gpu.sh (docs/PERFORMANCE.md): the next
# PROGRAMS, FIRST_REP and REPS that bench/gpu/summarize.py --plan picks
# from the runs already in OUTDIR, then the script with them into OUTDIR.
#
#   bench/gpu/protocol_call.sh [--dry-run] gpt2|llama1b|multigpu OUTDIR [CACHE]
#
# multigpu: bench/multi_gpu.sh --nproc NPROC (2) into OUTDIR (its OUT).
# OUTDIR carries the earlier calls' runs (a folder under bench/results/
# that the calls' raw files are committed to travels with the working tree
# to the lent machine, so each call plans from all of them). CACHE (default
# .gpucache, ignored by git) holds PyTorch's compile caches
# (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR): a max-autotune compile that
# took minutes takes seconds the next call when the caller brings CACHE
# back (a call's $OUT) and carries it again. Compilation is outside the
# timed steps either way. BUDGET (480): seconds of runs the call may hold;
# LLMC_BIN (a built train_gpt2cu) saves gpu_train.sh's llm.c build.
# A CACHE that holds files counts as the earlier calls' (summarize.py
# --plan --warm-cache). PACK (a folder, the lent machine's $OUT): OUTDIR
# then goes to PACK/results.tgz and CACHE to PACK/cache.tgz.NN, parts of
# 15 MiB (the machine returns files of 16 MiB at most); bring them back
# with `tar xzf results.tgz` and `cat cache.tgz.* | tar xzf -` in the
# repository's root. A cache too large to carry (a call carries 64 MiB;
# max-autotune's grew to 355 MB) travels as those parts: CACHE_PARTS (a
# folder of an earlier call's cache.tgz.NN) is unpacked into CACHE first,
# where CACHE holds no files.
# A planned run that timed out before runs once more, its first attempt's
# files moved into OUTDIR/timed-out/ (summarize.py counts a second timeout
# as a failed run).
# Prints the plan; exits 0 with nothing run when the protocol is complete
# or nothing left fits BUDGET (a whole call, 480 s or more, runs one).
set -u
dry=()
if [ "${1:-}" = --dry-run ]; then
  dry=(--dry-run)
  shift
fi
mode=${1:-}
out=${2:-}
cache=${3:-.gpucache}
case $mode in
  gpt2 | llama1b | multigpu) ;;
  *)
    echo "usage: bench/gpu/protocol_call.sh [--dry-run] gpt2|llama1b|multigpu OUTDIR [CACHE]" >&2
    exit 2
    ;;
esac
[ -n "$out" ] || {
  echo "protocol_call: no OUTDIR" >&2
  exit 2
}
PY=${PYTHON:-python3}
case $cache in /*) ;; *) cache=$PWD/$cache ;; esac
if [ -n "${CACHE_PARTS:-}" ]; then
  parts=("$CACHE_PARTS"/cache.tgz.*)
  [ -e "${parts[0]}" ] || {
    echo "protocol_call: no cache.tgz.NN in CACHE_PARTS=$CACHE_PARTS" >&2
    exit 2
  }
  if [ -n "$(find "$cache" -type f 2>/dev/null | head -1)" ]; then
    echo "protocol_call: $cache holds files: CACHE_PARTS not unpacked" >&2
  elif [ ${#dry[@]} = 0 ]; then
    # the parts hold CACHE's folder by its base name: unpack them aside,
    # then move that folder into place whole (a failed unpack leaves CACHE
    # as it was, so a later call does not take a partial cache for warm)
    tmp=$(mktemp -d "$(dirname "$cache")/.cache_parts.XXXXXX") || exit 2
    name=$(basename "$cache")
    if ! (set -o pipefail && cat "${parts[@]}" | tar xzf - -C "$tmp") ||
      [ -z "$(find "$tmp/$name" -type f 2>/dev/null | head -1)" ]; then
      echo "protocol_call: $CACHE_PARTS does not unpack into a $name/ with files" >&2
      rm -rf "$tmp"
      exit 2
    fi
    rm -rf "$cache" && mv "$tmp/$name" "$cache" && rm -rf "$tmp" || {
      echo "protocol_call: cannot move the unpacked cache to $cache" >&2
      exit 2
    }
  fi
fi
warm=()
[ -n "$(find "$cache" -type f 2>/dev/null | head -1)" ] && warm=(--warm-cache)
# a dry run plans as the real call will, with the parts unpacked
[ -n "${CACHE_PARTS:-}" ] && [ ${#dry[@]} != 0 ] && warm=(--warm-cache)
nproc=${NPROC:-2}
if [ "$mode" = multigpu ]; then
  keys=$(bench/multi_gpu.sh --list --nproc "$nproc") || exit 2
else
  keys=$(bench/gpu_train.sh --list "$mode") || exit 2
fi
plan=$("$PY" bench/gpu/summarize.py --plan --mode "$mode" --out "$out" \
  --programs "$keys" --budget "${BUDGET:-480}" "${warm[@]}") || exit 2
echo "$plan"
line=$(printf '%s\n' "$plan" | grep '^PROGRAMS=') || exit 0 # complete, or nothing fits BUDGET
# PROGRAMS="a b" FIRST_REP=n REPS=m: the words summarize.py prints
PROGRAMS=$(printf '%s\n' "$line" | sed -n 's/^PROGRAMS="\([^"]*\)".*/\1/p')
FIRST_REP=$(printf '%s\n' "$line" | sed -n 's/.* FIRST_REP=\([0-9]*\).*/\1/p')
REPS=$(printf '%s\n' "$line" | sed -n 's/.* REPS=\([0-9]*\).*/\1/p')
[ -n "$PROGRAMS" ] && [ -n "$FIRST_REP" ] && [ -n "$REPS" ] || {
  echo "protocol_call: cannot read the plan's line: $line" >&2
  exit 2
}
# a planned run that timed out the first time (summarize.py's RETRIED):
# its files move into OUTDIR/timed-out/ and it runs once more (the
# multigpu checkpoint run has no round in its name and is not retried)
if [ ${#dry[@]} = 0 ]; then
  for k in $PROGRAMS; do
    for ((r = FIRST_REP; r < FIRST_REP + REPS; r++)); do
      n=${k}_r$r
      if [ "$(cat "$out/$n.rc" 2>/dev/null)" != 124 ] ||
        [ -e "$out/timed-out/$n.rc" ]; then
        continue
      fi
      mkdir -p "$out/timed-out" && mv "$out/$n".* "$out/timed-out/" || exit 1
      echo "protocol_call: $n timed out before: its files are in $out/timed-out/, it runs again"
    done
  done
fi
mkdir -p "$cache/inductor" "$cache/triton" || exit 1
export TORCHINDUCTOR_CACHE_DIR="$cache/inductor"
export TRITON_CACHE_DIR="$cache/triton"
export PROGRAMS FIRST_REP REPS
if [ "$mode" = multigpu ]; then
  OUT=$out bench/multi_gpu.sh --nproc "$nproc" "${dry[@]}"
else
  bench/gpu_train.sh "${dry[@]}" "$mode" "$out"
fi
rc=$?
if [ -n "${PACK:-}" ] && [ ${#dry[@]} = 0 ]; then
  mkdir -p "$PACK" || exit 1
  tar czf "$PACK/results.tgz" "$out" || exit 1
  rm -f "$PACK"/cache.tgz.*
  root=$(dirname "$cache")
  (cd "$root" && tar czf - "$(basename "$cache")") |
    split -b 15M -d - "$PACK/cache.tgz." || exit 1
  echo "protocol_call: $PACK/results.tgz, cache in" \
    "$(ls "$PACK"/cache.tgz.* | wc -l) part(s), $(du -sh "$cache" | cut -f1)"
fi
exit $rc
