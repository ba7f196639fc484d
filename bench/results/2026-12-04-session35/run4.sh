#!/usr/bin/env bash
# Session 35, run 4 (one H200): the last tree (ee3aca2) through dcpxd and
# pytest again after run 3 (a numpy-2 skip, frame.c's clean-up, the join's
# one Shape snapshot): the MPS job and pytest.
#   bash scripts/gpu-build.sh; rm -f build-gpu/tests/gpu/roofline
#   bash python/gpu-build.sh
#   export OUT; bash bench/results/2026-12-04-session35/run4.sh
set -u
PYTEST_K="not fullgraph_cpu" bash scripts/gpu-run.sh mps pytest
