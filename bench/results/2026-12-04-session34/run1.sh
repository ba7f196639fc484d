#!/usr/bin/env bash
# Session 34, run 1 (one H200): the rescue poll's record attribution on
# the old kernels (build-gpu/oldk/test_kernels: be421ac's test with the
# kernels of 21984cd) and on this build, both half-size and full blocks;
# then the kernel matrix in all five variants, the MPS job through dcpxd
# (faults and restarts: the records now written off dcpxd's loop) and the
# device API example. From the repo root, build-gpu carried:
#   export OUT; bash bench/results/2026-12-04-session34/run1.sh > $OUT/run.log 2>&1
set -u
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
for b in oldk/test_kernels tests/gpu/test_kernels; do
  for v in shipped DCPX_MERGE_THREADS=256; do
    [ "$v" = shipped ] && v=
    echo "== attribution: $b ${v:-(as shipped)}"
    env $v DCPX_TEST_ONLY=rescue-record-attribution timeout -k 5 120 \
      "build-gpu/$b" 2>&1 | grep -E "attribution|gpu-exact" | tail -20
  done
done | tee "$OUT/attribution.txt"
bash scripts/gpu-run.sh kernels mps devapi
