#!/usr/bin/env bash
# gpu-run5.sh - the last GPU run of the session, after a refused call began
# to mark its rank FAILED and dcpx_recover's drain became bounded
# (libclient/cuda.c): the main job under MPS, the stall and the kill -9
# runs through dcpxd, and (with two GPUs) the kill across GPUs.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
export DCPXD="$B/daemon/dcpxd" NCCL_NVLS_ENABLE=0
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d
run() { # name, args...
  local name=$1; shift
  timeout -k 5 90 "$B/tools/dcpx-demo" --backend cuda "$@" > "$OUT/$name.txt" 2>&1 || rc=1
  echo "== $name: $*"; grep -E "latency|fault:|exact:" "$OUT/$name.txt"
}
run main --world 8 --rows 64 --calls 30
run stall --world 8 --rows 8 --calls 30 --fault-at 10 --fault-rank 5
run kill --world 8 --rows 8 --calls 30 --kill-at 12 --fault-rank 2
echo quit | nvidia-cuda-mps-control
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  run kill2gpu --spread --world 2 --rows 64 --calls 30 --kill-at 7 --fault-rank 0
fi
echo "gpu-run5: rc=$rc"
exit $rc
