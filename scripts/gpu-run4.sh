#!/usr/bin/env bash
# gpu-run4.sh - the multi-GPU latency run (2, 4 or 8 GPUs, one rank per GPU,
# W = GPU count, NCCL_NVLS_ENABLE=0, no multicast):
#   1. test_nccl --bench: per call, end to end, both transports in the same
#      run, each rank's whole call captured into a CUDA graph; rows in
#      {1, 8, 64, 256}, N=512, K=2048, local length 16384; outputs checked
#      against the CPU reference. If it dies (setup error, hang, timeout),
#      once more with NCCL_GRAPH_REGISTER=0.
#   2. pingpong: the LL one-way latency GPU 0 <-> GPU j.
# Build first with scripts/gpu-build.sh (carry build-gpu/). Writes to $OUT:
# nvidia-smi.txt, bench_multi.md, pingpong.md, summary.txt (4 files).
# Under 3 minutes on a 2-GPU machine, worst case included.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
export NCCL_NVLS_ENABLE=0
export DCPX_TEST_LIMIT_S=${DCPX_TEST_LIMIT_S:-30}
S="$OUT/summary.txt"
: > "$S"
say() { echo "$*" | tee -a "$S"; }

{ nvidia-smi; echo; nvidia-smi topo -m; } > "$OUT/nvidia-smi.txt" 2>&1
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
say "gpu-run4: $ngpu GPU(s), NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
for b in test_nccl pingpong; do
  if [ ! -x "$B/tests/gpu/$b" ]; then
    say "gpu-run4: $B/tests/gpu/$b missing: run scripts/gpu-build.sh first"
    exit 1
  fi
done

# 1. per-call timing, both transports
t0=$(date +%s)
timeout -k 5 90 "$B/tests/gpu/test_nccl" --bench > "$OUT/bench_multi.md" 2>&1
brc=$?
if [ $brc -ne 0 ] && [ $brc -ne 1 ] && [ $brc -ne 77 ]; then
  say "gpu-run4: test_nccl --bench exit $brc after $(( $(date +%s) - t0 )) s; tail:"
  tail -n 8 "$OUT/bench_multi.md" | tee -a "$S"
  say "gpu-run4: again with NCCL_GRAPH_REGISTER=0"
  { echo; echo "---- retry: NCCL_GRAPH_REGISTER=0 (first try exited $brc)"; } \
    >> "$OUT/bench_multi.md"
  NCCL_GRAPH_REGISTER=0 timeout -k 5 50 "$B/tests/gpu/test_nccl" --bench \
    >> "$OUT/bench_multi.md" 2>&1
  brc=$?
fi
say "gpu-run4: test_nccl --bench exit $brc ($(( $(date +%s) - t0 )) s)"
[ $brc -eq 0 ] || rc=1
grep -E "^\| |^## |gbench:|MISMATCH|FATAL" "$OUT/bench_multi.md" | tee -a "$S"

# 2. LL one-way latency
t0=$(date +%s)
timeout -k 5 30 "$B/tests/gpu/pingpong" --iters 10000 --launches 7 \
  > "$OUT/pingpong.md" 2>&1
prc=$?
say "gpu-run4: pingpong exit $prc ($(( $(date +%s) - t0 )) s)"
[ $prc -eq 0 ] || [ $prc -eq 77 ] || rc=1
grep -E "^\| |ll-oneway|FAIL|skipped|FATAL" "$OUT/pingpong.md" | tee -a "$S"

# 3. kill -9 of one rank mid-call, one rank per GPU, through dcpxd: the
#    peers fail fast, a replacement process joins, the group is exact again.
ngpu=$(nvidia-smi -L | wc -l)
if [ "$ngpu" -ge 2 ]; then
  t0=$(date +%s)
  DCPXD="$B/daemon/dcpxd" timeout -k 5 60 "$B/tools/dcpx-demo" --backend cuda \
    --spread --world "$ngpu" --rows 8 --calls 40 --kill-at 15 \
    --fault-rank $((ngpu - 1)) > "$OUT/kill.txt" 2>&1
  krc=$?
  say "gpu-run4: kill -9 run exit $krc ($(( $(date +%s) - t0 )) s)"
  [ $krc -eq 0 ] || rc=1
  grep -E "W=|latency|fault:|exact:|rank .*:" "$OUT/kill.txt" | tail -n 12 | tee -a "$S"
fi

say "gpu-run4: rc=$rc"
exit $rc
