#!/usr/bin/env bash
# Session 34, run 4 (one H200): the merge with and without ids_out, as
# a DCP engine calls it (each rank attends over its own KV rows: rows_out
# is what it needs), this build, alternating, two rounds, W=8 N=512 and
# W=2 N=1280 ranks on one GPU; push and merge only (BENCH_QUICK), local
# 16,384, median of 5 graph replays.
#   export OUT; bash bench/results/2026-12-04-session34/run4.sh
set -u
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
for round in 1 2; do
  for sh in 8:512 2:1280; do
    for ids in on off; do
      f="$OUT/ids_${ids}_r${round}_w${sh%%:*}.md"
      extra=
      [ "$ids" = off ] && extra=BENCH_NO_IDS=1
      env $extra BENCH_W=${sh%%:*} BENCH_N=${sh##*:} BENCH_QUICK=1 \
        BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 120 build-gpu/tests/gpu/bench_kernels > "$f" 2>&1
      echo "== round $round W:N $sh ids_out $ids"
      grep -E "^\| 16384|ids_out" "$f"
    done
  done
done | tee "$OUT/summary.txt"
