#!/usr/bin/env bash
# demo.sh - the README's main job: dependencies, build, then dcpx-demo
# (a private dcpxd and W=8 rank processes, every call verified exact).
# Arguments go to tools/dcpx-demo.
#
# On a machine with an NVIDIA GPU and a CUDA build, the ranks use the CUDA
# backend; they share GPU 0 (pass --spread to put rank r on GPU r % count),
# so MPS is started for the run and stopped after (docs/GPU.md: without
# it, processes on one GPU time-slice). Elsewhere: the host backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if [ ! -x tools/dcpx-demo ] || [ ! -x daemon/dcpxd ]; then
  [ -x configure ] || ./autogen.sh
  [ -f Makefile ] || ./configure
fi
make -j"$(nproc)" >/dev/null

backend=host
if grep -q '^#define HAVE_CUDA 1' config.h 2>/dev/null &&
   nvidia-smi -L >/dev/null 2>&1; then
  backend=cuda
fi
if [ $backend = cuda ]; then
  mps=$(mktemp -d /tmp/dcpx-mps.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  trap 'echo quit | nvidia-cuda-mps-control; rm -rf "$mps"' EXIT
  tools/dcpx-demo --backend cuda "$@"
else
  exec tools/dcpx-demo "$@"
fi
