#!/usr/bin/env bash
# Session 34, run 3 (one H200): the session's last code. The kernel
# matrix in all five variants, the MPS job through dcpxd (faults and
# restarts; this dcpxd writes its records on a worker thread), and the
# Python package's GPU tests (push_list's order now always checked).
#   bash scripts/gpu-build.sh && rm -f build-gpu/tests/gpu/roofline
#   bash python/gpu-build.sh
#   export OUT; bash bench/results/2026-12-04-session34/run3.sh
PYTEST_K="not fullgraph_cpu" bash scripts/gpu-run.sh kernels mps pytest
