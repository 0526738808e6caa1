#!/bin/bash
# call 5 (one H200, carry [".gpu"], warm machine): two protocol shares in one call, the second planned after the first
BUDGET=100 bash bench/results/2026-11-28-session15/s16c3.sh; mv $OUT/r $OUT/r1; cp $OUT/results.tgz $OUT/results1.tgz
BUDGET=250 bash bench/results/2026-11-28-session15/s16c3.sh
rm -f $OUT/cache.tgz.*
