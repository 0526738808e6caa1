#!/bin/bash
# protocol call for bench/multi_gpu.sh (2 GPUs, kind nvidia-h200-x2; carry [".gpu", ".gpucache-mg"] where one has come back):
# the next share into bench/results/2026-11-30-protocol-multigpu. Afterwards, in the repository's root:
#   tar xzf /work/.device/N/results.tgz && rm -rf .gpucache-mg && cat /work/.device/N/cache.tgz.* | tar xzf -   (then commit the results)
. .gpu/env.sh >/dev/null 2>&1
O=bench/results/2026-11-30-protocol-multigpu
(sleep 585; cd "$OUT" && tar czf part.tgz -C "$OLDPWD" $O) &
NPROC=2 PACK=$OUT TRAINRUN=.gpu/trainrun bench/gpu/protocol_call.sh multigpu $O .gpucache-mg > "$OUT/call.log" 2>&1
