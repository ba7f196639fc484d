#!/usr/bin/env bash
# Session 35, run 1 (one H200): round 1's pass A built by the poll (the
# histogram of ord >> 4 as the entries are staged; round 1 then two-level
# without its pass A) against the session's start (59440a7's
# bench_kernels at build-gpu/base/), exactness in all five variants first.
#   export OUT; bash bench/results/2026-12-04-session35/run1.sh
set -u
BASE=build-gpu/base/bench_kernels ABM_SHAPES="8:512 2:1280" AB_ROUNDS=2 \
  bash scripts/gpu-run.sh kernels abm
