#!/usr/bin/env bash
# Session 34, run 2 (one H200): the attribution case as rewritten after
# run 1 (rank 0 never merges, so its rescue list never comes; a fault-hook
# stall is capped at the timeout and its list came as the peers gave up),
# on the old kernels (build-gpu/oldk/test_kernels: this test with the
# kernels of 21984cd) and on this build, full and half-size blocks, 3
# times each; then this build's kernel matrix in all five variants.
#   export OUT; bash bench/results/2026-12-04-session34/run2.sh > $OUT/run.log 2>&1
set -u
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
for b in oldk/test_kernels tests/gpu/test_kernels; do
  for v in shipped DCPX_MERGE_THREADS=256; do
    [ "$v" = shipped ] && v=
    for rep in 1 2 3; do
      echo "== attribution: $b ${v:-(as shipped)} seed $rep"
      env $v DCPX_TEST_SEED=$rep DCPX_TEST_ONLY=rescue-record-attribution \
        timeout -k 5 120 "build-gpu/$b" 2>&1 | grep -E "attribution" | tail -20
    done
  done
done > "$OUT/attribution.txt" 2>&1
bash scripts/gpu-run.sh kernels
cat "$OUT/attribution.txt" >> "$OUT/summary.txt"
