#!/usr/bin/env bash
# gpu-run3.sh - the third GPU run of the session, after the NCCL transport
# landed (and moved the merge's output code): everything of
# tests/gpu/run-gpu-tests.sh again (LL kernels, kernel bench, the NCCL path
# at W=1 and, with two GPUs, W=2 on both transports with timings), then the
# main job through dcpxd with the CUDA backend: W=8 under MPS, and W = GPU
# count with one rank per GPU.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
export NCCL_NVLS_ENABLE=0
OUT="$OUT" DCPX_GPU_BENCH_LIMIT=120 bash tests/gpu/run-gpu-tests.sh \
    "$B/tests/gpu" > "$OUT/run-gpu-tests.txt" 2>&1 || rc=1
grep -E "gpu-exact|exact|FAIL|mismatch|skip|nccl" "$OUT/run-gpu-tests.txt" | tail -12
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d
export DCPXD="$B/daemon/dcpxd"
timeout 120 "$B/tools/dcpx-demo" --backend cuda --world 8 --rows 8 \
    --calls 60 > "$OUT/demo.txt" 2>&1 || rc=1
echo quit | nvidia-cuda-mps-control
ngpu=$(nvidia-smi -L | wc -l)
if [ "$ngpu" -ge 2 ]; then
  timeout 120 "$B/tools/dcpx-demo" --backend cuda --spread --world "$ngpu" \
      --rows 8 --calls 100 >> "$OUT/demo.txt" 2>&1 || rc=1
fi
grep -E "W=|latency|exact" "$OUT/demo.txt"
echo "gpu-run3: rc=$rc"
exit $rc
