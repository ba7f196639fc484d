#!/usr/bin/env bash
# gpu-prof.sh - where a merge's time goes: Nsight Compute's warp-state and
# source-counter sections for one plain and one rescued (skewed rows) merge
# of bench_kernels (W=8 on one GPU, N=512, K=2048, local 16384, rows 1):
# the reports (open them in Nsight Compute for the per-line view; kernels
# carry -lineinfo) and their details pages in $OUT. The source page as CSV
# is written too; on the 2026-11-30 machine it held the source lines but
# no per-line counters.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
# The build compiled a clean export in /tmp/dcpx-gpu-src (gpu-build.sh):
# the source page needs the files at that path.
mkdir -p /tmp/dcpx-gpu-src && cp -r kernels common include /tmp/dcpx-gpu-src/
export BENCH_QUICK=1 BENCH_ROWS=1 BENCH_REPS=5 BENCH_LEN=16384
# bench_merge launches 141 merges per fill mode: plain first, then skewed
for spec in plain:0 skew:141; do
  name=${spec%%:*} skip=${spec##*:}
  timeout -k 5 200 ncu --section SourceCounters --section WarpStateStats \
    --import-source yes -k regex:dcpx_merge_kernel -s "$skip" -c 1 \
    -o "$OUT/merge_$name" -f "$B/tests/gpu/bench_kernels" > "$OUT/ncu_$name.log" 2>&1
  ncu -i "$OUT/merge_$name.ncu-rep" --page source --csv --print-source cuda \
    > "$OUT/merge_${name}_src.csv" 2> "$OUT/merge_${name}_src.err"
  ncu -i "$OUT/merge_$name.ncu-rep" --page details > "$OUT/merge_${name}_details.txt" 2>&1
  echo "== $name"; head -c 300 "$OUT/merge_${name}_src.csv"; echo
  grep -iE "duration|stall|warp cycles" "$OUT/merge_${name}_details.txt" | head -20
done
