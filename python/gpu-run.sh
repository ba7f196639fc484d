#!/usr/bin/env bash
# python/gpu-run.sh - the Python package on the GPU machine, from the
# repository root with build-pygpu/ (python/gpu-build.sh) beside the tree:
# the whole pytest suite (host tests, and python/tests/test_gpu.py: torch
# CUDA tensors, CUDA graph capture, torch.compile, the per-call overhead,
# the example one rank per GPU), then examples/decode_step.py at W=8 on
# one GPU under MPS and at W=2 on two GPUs. Logs in $OUT (default
# /tmp/dcpx-pygpu-out); exit 0 when everything passed. --pytest-only:
# the pytest suite alone (PYTEST_K: only the tests pytest -k selects);
# --profile: python/bench/profile_eager.py alone
# (where the eager calls' host time goes).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dcpx-pygpu-out}
mkdir -p "$OUT"
b=$PWD/build-pygpu
export LD_LIBRARY_PATH=$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DCPX_LIBRARY=$b/lib/libdcpx.so.0 DCPXD=$b/dcpxd
export PYTHONPATH=$PWD/python PYTHONDONTWRITEBYTECODE=1
rc=0
ex=python/examples/decode_step.py

if [ "${1:-}" = --profile ]; then
  python3 python/bench/profile_eager.py 2>&1 | tee "$OUT/profile_eager.txt"
  exit "${PIPESTATUS[0]}"
fi

echo "== pytest" | tee "$OUT/summary.txt"
python3 -m pytest -p no:cacheprovider -v -s -rfs --durations=10 \
  ${PYTEST_K:+-k "$PYTEST_K"} python/tests > "$OUT/pytest.log" 2>&1 || rc=1
grep -E 'passed|failed|push\+merge|graph replay' "$OUT/pytest.log" |
  tee -a "$OUT/summary.txt"
[ "${1:-}" = --pytest-only ] && exit $rc

echo "== example, W=8 on GPU 0 under MPS" | tee -a "$OUT/summary.txt"
mps=$(mktemp -d /tmp/dcpx-mps.XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
CUDA_VISIBLE_DEVICES=0 timeout 600 python3 "$ex" --world 8 --backend cuda \
  --layers 8 --steps 5 --rows 16 --local-len 16384 --topk 2048 \
  > "$OUT/example-w8-mps.log" 2>&1 || rc=1
echo quit | nvidia-cuda-mps-control
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
rm -rf "$mps"
tail -n 9 "$OUT/example-w8-mps.log" | tee -a "$OUT/summary.txt"

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  echo "== example, W=2 on two GPUs" | tee -a "$OUT/summary.txt"
  timeout 600 python3 "$ex" --world 2 --backend cuda --layers 8 --steps 5 \
    --rows 16 --local-len 16384 --topk 2048 \
    > "$OUT/example-w2.log" 2>&1 || rc=1
  tail -n 3 "$OUT/example-w2.log" | tee -a "$OUT/summary.txt"
fi
echo "rc=$rc" | tee -a "$OUT/summary.txt"
exit $rc
