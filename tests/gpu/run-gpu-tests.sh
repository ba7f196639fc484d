#!/bin/sh
# run-gpu-tests.sh - the CUDA kernels against the CPU reference, then the
# kernel benchmark, on a machine with a GPU.
#
#   tests/gpu/run-gpu-tests.sh [BUILD_DIR]     (default ./build-gpu)
#
# BUILD_DIR holds test_kernels and bench_kernels (see kernels/ and
# tests/gpu/ in the build). Logs go to ${OUT:-/tmp/dcpx-gpu-out}:
# test_kernels.log, bench_kernels.md, nvidia-smi.txt. Exit status: 0 when
# every case is exact (the bench only reports), 1 on a mismatch or a failed
# step, 77 when there is no GPU (automake's "skipped").
set -u

BUILD=${1:-./build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
TEST_LIMIT=${DCPX_GPU_TEST_LIMIT:-420}
BENCH_LIMIT=${DCPX_GPU_BENCH_LIMIT:-150}

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run-gpu-tests: no GPU (nvidia-smi -L failed): skipped"
  exit 77
fi
for b in test_kernels bench_kernels; do
  if [ ! -x "$BUILD/$b" ]; then
    echo "run-gpu-tests: $BUILD/$b missing: build with CUDA first" >&2
    exit 1
  fi
done
mkdir -p "$OUT" || exit 1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

echo "run-gpu-tests: test_kernels (limit ${TEST_LIMIT}s) -> $OUT/test_kernels.log"
timeout -k 10 "$TEST_LIMIT" "$BUILD/test_kernels" > "$OUT/test_kernels.log" 2>&1
rc=$?
tail -n 40 "$OUT/test_kernels.log"
case $rc in
  0) ;;
  124|137) echo "run-gpu-tests: test_kernels timed out" >&2; rc=1 ;;
  77) echo "run-gpu-tests: test_kernels found no GPU: skipped"; exit 77 ;;
  *) echo "run-gpu-tests: test_kernels failed (exit $rc)" >&2; rc=1 ;;
esac

# The NCCL transport (built only with NCCL): W=1 on one GPU, W >= 2 when
# the machine has several; then both transports timed (benchmark hook).
if [ -x "$BUILD/test_nccl" ]; then
  echo "run-gpu-tests: test_nccl (limit ${TEST_LIMIT}s) -> $OUT/test_nccl.log"
  NCCL_NVLS_ENABLE=0 timeout -k 10 "$TEST_LIMIT" "$BUILD/test_nccl" \
    > "$OUT/test_nccl.log" 2>&1
  nrc=$?
  tail -n 40 "$OUT/test_nccl.log"
  case $nrc in
    0) ;;
    77) echo "run-gpu-tests: test_nccl found no GPU: skipped" ;;
    124|137) echo "run-gpu-tests: test_nccl timed out" >&2; rc=1 ;;
    *) echo "run-gpu-tests: test_nccl failed (exit $nrc)" >&2; rc=1 ;;
  esac
  echo "run-gpu-tests: test_nccl --bench (limit ${BENCH_LIMIT}s) -> $OUT/bench_nccl.md"
  NCCL_NVLS_ENABLE=0 timeout -k 10 "$BENCH_LIMIT" "$BUILD/test_nccl" --bench \
    > "$OUT/bench_nccl.md" 2>&1 || echo "run-gpu-tests: test_nccl --bench failed" >&2
  cat "$OUT/bench_nccl.md"
else
  echo "run-gpu-tests: $BUILD/test_nccl not built (no NCCL): skipped"
fi

echo "run-gpu-tests: bench_kernels (limit ${BENCH_LIMIT}s) -> $OUT/bench_kernels.md"
timeout -k 10 "$BENCH_LIMIT" "$BUILD/bench_kernels" > "$OUT/bench_kernels.md" 2>&1
brc=$?
cat "$OUT/bench_kernels.md"
[ $brc -eq 0 ] || echo "run-gpu-tests: bench_kernels failed (exit $brc)" >&2

exit $rc
