#!/usr/bin/env bash
# gpu-run7.sh - the GPU run of the rescue-and-waits work (issue 10):
#   1. test_kernels: every kernel case against the CPU reference, and the
#      unsafe corners (staged copy under overwrite, push under abort and
#      FAILED, a stale CUDA error, call tags under graph replay, a
#      trickling peer);
#   2. test_nccl: both transports against the reference (W=1; W=2 with two
#      GPUs);
#   3. bench_kernels: W=8 ranks on one GPU, N=512, local 16384: push,
#      merge, merge with rescue, whole calls with rescue rare and with every
#      row rescuing (5 graph replays each: median, min, max);
#   4. with two GPUs: test_nccl --bench 2, LL and NCCL in one run, N=512
#      (every row rescues) and N=1280 (rescue rare), and N=512 again with
#      the old every-waiter control-page polling (DCPX_POLL_STORM=1), to
#      confirm or refute the polling storm;
#   5. through dcpxd: the main job, a stall and a kill -9 (two GPUs when
#      there are).
# Run from the tree root on the GPU machine with build-gpu/ beside it
# (scripts/gpu-build.sh here). Logs and tables go to $OUT.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
export NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
step() { echo "== $*"; }

step test_kernels
timeout -k 5 240 "$B/tests/gpu/test_kernels" > "$OUT/test_kernels.log" 2>&1 || rc=1
grep -E "gpu-exact|MISMATCH|FAIL|corner|push-after|stale|trickl|staged|graph-replay" \
  "$OUT/test_kernels.log" | tail -20
step "test_kernels, DCPX_PDL=1 (programmatic dependent launch)"
DCPX_PDL=1 timeout -k 5 240 "$B/tests/gpu/test_kernels" > "$OUT/test_kernels_pdl.log" 2>&1 || rc=1
grep -E "gpu-exact|MISMATCH|FAIL" "$OUT/test_kernels_pdl.log" | tail -5
step "test_kernels, DCPX_KLIST=1 (every push keeps its top K)"
DCPX_KLIST=1 timeout -k 5 240 "$B/tests/gpu/test_kernels" > "$OUT/test_kernels_klist.log" 2>&1 || rc=1
grep -E "gpu-exact|MISMATCH|FAIL" "$OUT/test_kernels_klist.log" | tail -5

step test_nccl
timeout -k 5 120 "$B/tests/gpu/test_nccl" > "$OUT/test_nccl.log" 2>&1 || rc=1
grep -E "nccl-exact|MISMATCH|FAIL" "$OUT/test_nccl.log"

step bench_kernels
BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 200 "$B/tests/gpu/bench_kernels" \
  > "$OUT/bench_kernels.md" 2>&1 || rc=1
cat "$OUT/bench_kernels.md"

step "torch.topk baselines (same shapes, graph replays)"
gcc -shared -fPIC -O2 -std=gnu11 -Iinclude -Icommon -I"$B/include" \
    common/wire.c common/merge.c common/ref.c -o /tmp/libdcpxref.so 2>&1 | tail -3
timeout -k 5 300 python3 bench/torch_baseline.py --lib /tmp/libdcpxref.so \
    > "$OUT/torch_baseline.md" 2>&1 || rc=1
tail -12 "$OUT/torch_baseline.md"

if [ "$ngpu" -ge 2 ]; then
  for n in 512 1280; do
    step "test_nccl --bench 2, N=$n"
    DCPX_BENCH_N=$n timeout -k 5 150 "$B/tests/gpu/test_nccl" --bench 2 \
      > "$OUT/gbench_n$n.md" 2>&1 || rc=1
    grep -E "^\||^## |gbench" "$OUT/gbench_n$n.md"
  done
  step "test_nccl --bench 2, N=512, DCPX_KLIST=0 (rescue lists from the row)"
  DCPX_KLIST=0 DCPX_BENCH_N=512 timeout -k 5 150 "$B/tests/gpu/test_nccl" \
    --bench 2 > "$OUT/gbench_n512_klist0.md" 2>&1 || rc=1
  grep -E "^\||^## |gbench" "$OUT/gbench_n512_klist0.md"
  step "test_nccl --bench 2, N=512, DCPX_POLL_STORM=1"
  DCPX_POLL_STORM=1 DCPX_BENCH_N=512 timeout -k 5 150 \
    "$B/tests/gpu/test_nccl" --bench 2 > "$OUT/gbench_storm.md" 2>&1 || rc=1
  grep -E "^\||^## |gbench" "$OUT/gbench_storm.md"
fi

export DCPXD="$B/daemon/dcpxd"
demo() { # name, args...
  local name=$1; shift
  timeout -k 5 90 "$B/tools/dcpx-demo" --backend cuda "$@" > "$OUT/$name.txt" 2>&1 || rc=1
  step "$name: $*"; grep -E "latency|fault:|exact:" "$OUT/$name.txt"
}
if [ "$ngpu" -ge 2 ]; then
  demo stall2gpu --spread --world 2 --rows 64 --calls 30 --fault-at 10 --fault-rank 1
  demo kill2gpu --spread --world 2 --rows 64 --calls 30 --kill-at 7 --fault-rank 0
fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d
demo main --world 8 --rows 64 --calls 30
demo stall --world 8 --rows 8 --calls 30 --fault-at 10 --fault-rank 5
demo kill --world 8 --rows 8 --calls 30 --kill-at 12 --fault-rank 2
echo quit | nvidia-cuda-mps-control
echo "gpu-run7: rc=$rc"
exit $rc
