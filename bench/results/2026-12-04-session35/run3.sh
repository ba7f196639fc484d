#!/usr/bin/env bash
# Session 35, run 3 (one H200): the session's tree (the kernels are the
# session's start's; dcpxd refuses frames of the other direction before
# unpacking them; the Python package's fixes): the kernel matrix as
# shipped, W=8 rank processes under MPS through dcpxd (the main job,
# stall, kill -9, SIGSTOP, dcpxd restarts), and pytest on the GPU.
#   bash scripts/gpu-build.sh; rm -f build-gpu/tests/gpu/roofline
#   bash python/gpu-build.sh
#   export OUT; bash bench/results/2026-12-04-session35/run3.sh
set -u
PYTEST_K="not fullgraph_cpu" KVARIANTS=shipped \
  bash scripts/gpu-run.sh kernels mps pytest
