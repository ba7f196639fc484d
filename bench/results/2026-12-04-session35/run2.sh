#!/usr/bin/env bash
# Session 35, run 2 (one H200): does a CUDA query answering
# cudaErrorNotReady leave that as the thread's last error? libdcpx polls
# with cudaStreamQuery (dcpx_recover's drain) and cudaEventQuery (an NCCL
# abort's set_voided) on the engine's thread. notready.cu, built here:
#   /usr/local/cuda/bin/nvcc -arch=sm_90 -o build-gpu/notready \
#     bench/results/2026-12-04-session35/notready.cu
#   export OUT; bash bench/results/2026-12-04-session35/run2.sh
set -u
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
./build-gpu/notready | tee "$OUT/notready.txt"
