#!/usr/bin/env bash
# gpu-run2.sh - the second GPU run of the session: the torch baselines
# (the first run's table did not come back) and the fault run, fixed so
# the stalled rank is saturated on every row. Same setup as gpu-run.sh.
# --fault-only: skip the baselines (the third run of the session).
set -u
only_fault=0
[ "${1:-}" = --fault-only ] && only_fault=1
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
if [ $only_fault = 0 ]; then
  gcc -shared -fPIC -O2 -std=gnu11 -Iinclude -Icommon -I"$B/include" \
      common/wire.c common/merge.c common/ref.c -o /tmp/libdcpxref.so
  timeout 200 python3 bench/torch_baseline.py --lib /tmp/libdcpxref.so \
      > "$OUT/torch_baseline.md" 2>&1 || rc=1
  cat "$OUT/torch_baseline.md"
fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d
export DCPXD="$B/daemon/dcpxd"
timeout 120 "$B/tools/dcpx-demo" --backend cuda --world 8 --rows 8 \
    --calls 40 --fault-at 10 --fault-rank 3 > "$OUT/demo_cuda_fault.txt" 2>&1 || rc=1
tail -12 "$OUT/demo_cuda_fault.txt"
# The same with rows 64 (a 64-block merge grid per rank under MPS).
timeout 120 "$B/tools/dcpx-demo" --backend cuda --world 8 --rows 64 \
    --calls 20 --fault-at 5 --fault-rank 6 > "$OUT/demo_cuda_fault64.txt" 2>&1 || rc=1
tail -4 "$OUT/demo_cuda_fault64.txt"
echo quit | nvidia-cuda-mps-control
echo "gpu-run2: rc=$rc"
exit $rc
