#!/usr/bin/env bash
# gpu-run6.sh - after the output-argument and round-2-offset helpers moved
# into kernels/dcpx_device.cuh (a refactor of merge.cu and nccl.cu): the
# kernels against the reference again, both transports, no benchmarks.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
timeout -k 5 120 "$B/tests/gpu/test_kernels" > "$OUT/test_kernels.log" 2>&1 || rc=1
NCCL_NVLS_ENABLE=0 timeout -k 5 120 "$B/tests/gpu/test_nccl" \
    > "$OUT/test_nccl.log" 2>&1 || rc=1
grep -E "gpu-exact|nccl-exact|MISMATCH|FAIL" "$OUT"/test_*.log
echo "gpu-run6: rc=$rc"
exit $rc
