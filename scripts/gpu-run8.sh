#!/usr/bin/env bash
# gpu-run8.sh - after programmatic dependent launch (kctx.pdl, on with one
# rank per GPU): the kernels against the reference with and without PDL,
# both transports, the W=2 whole-call bench in both regimes, and a kill -9
# across two GPUs through dcpxd. Same layout as gpu-run7.sh.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
export NCCL_NVLS_ENABLE=0
for pdl in 0 1; do
  if [ $pdl = 1 ]; then export DCPX_PDL=1; else unset DCPX_PDL; fi
  timeout -k 5 240 "$B/tests/gpu/test_kernels" > "$OUT/test_kernels_pdl$pdl.log" 2>&1 || rc=1
  echo "== test_kernels DCPX_PDL=$pdl"; grep -E "gpu-exact|MISMATCH|FAIL" "$OUT/test_kernels_pdl$pdl.log" | tail -5
done
unset DCPX_PDL
timeout -k 5 150 "$B/tests/gpu/test_nccl" > "$OUT/test_nccl.log" 2>&1 || rc=1
echo "== test_nccl"; grep -E "nccl-exact|MISMATCH|FATAL" "$OUT/test_nccl.log"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  for n in 1280 512; do
    DCPX_BENCH_N=$n timeout -k 5 120 "$B/tests/gpu/test_nccl" --bench 2 > "$OUT/gbench_n$n.md" 2>&1 || rc=1
    echo "== gbench N=$n (PDL)"; grep -E "^\||gbench" "$OUT/gbench_n$n.md"
  done
  DCPX_NO_PDL=1 DCPX_BENCH_N=1280 timeout -k 5 120 "$B/tests/gpu/test_nccl" --bench 2 > "$OUT/gbench_n1280_nopdl.md" 2>&1 || rc=1
  echo "== gbench N=1280 (no PDL)"; grep -E "^\||gbench" "$OUT/gbench_n1280_nopdl.md"
  DCPXD="$B/daemon/dcpxd" timeout -k 5 90 "$B/tools/dcpx-demo" --backend cuda --spread \
    --world 2 --rows 64 --calls 30 --kill-at 7 --fault-rank 0 > "$OUT/kill2gpu.txt" 2>&1 || rc=1
  echo "== kill2gpu"; grep -E "latency|fault:|exact:" "$OUT/kill2gpu.txt"
  DCPXD="$B/daemon/dcpxd" timeout -k 5 90 "$B/tools/dcpx-demo" --backend cuda --spread \
    --world 2 --rows 64 --calls 30 --fault-at 10 --fault-rank 1 > "$OUT/stall2gpu.txt" 2>&1 || rc=1
  echo "== stall2gpu"; grep -E "latency|fault:|exact:" "$OUT/stall2gpu.txt"
fi
echo "gpu-run8: rc=$rc"
exit $rc
