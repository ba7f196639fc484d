#!/usr/bin/env bash
# gpu-run.sh - everything the GPU machine proves, in one run (docs/GPU.md).
#
#   On the development machine:  bash scripts/gpu-build.sh   (-> build-gpu/)
#   On the GPU machine, from the repo root, with build-gpu/ carried:
#                                bash scripts/gpu-run.sh
#
# Steps, each bounded, each logging to $OUT (default /tmp/dcpx-gpu-out):
#   1. kernels vs the CPU reference, W ranks as streams of one GPU, and the
#      kernel benchmark (tests/gpu/run-gpu-tests.sh);
#   2. torch.topk baselines and an independent set check (bench/);
#   3. under MPS: the main job with the CUDA backend, W=8 rank processes
#      through dcpxd (VMM workspaces exported as fds), rows 1 and 64, and a
#      fault run (a stalled rank, recovery, exact again);
#   4. with two or more GPUs: W = GPU count, one rank per GPU (LL over
#      NVLink), through dcpxd.
# Exit status: 0 if every correctness step passed.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
step() { echo "=== $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1 || { echo "no GPU"; exit 77; }
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi topo -m >> "$OUT/nvidia-smi.txt" 2>&1

step "1. kernels vs reference, kernel bench"
OUT="$OUT" bash tests/gpu/run-gpu-tests.sh "$B/tests/gpu" > "$OUT/kernels.txt" 2>&1 || rc=1
grep -E "gpu-exact|FAIL|mismatch" "$OUT/kernels.txt" | tail -5 | tee -a "$OUT/summary.txt"

step "2. torch baselines"
gcc -shared -fPIC -O2 -std=gnu11 -Iinclude -Icommon -I"$B/include" \
    common/wire.c common/merge.c common/ref.c -o /tmp/libdcpxref.so 2>&1 | tail -3
timeout 300 python3 bench/torch_baseline.py --lib /tmp/libdcpxref.so \
    > "$OUT/torch_baseline.md" 2>&1 || rc=1
tail -3 "$OUT/torch_baseline.md" | tee -a "$OUT/summary.txt"

step "3. main job, CUDA backend, W=8 processes on one GPU under MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS started" >> "$OUT/summary.txt"
export DCPXD="$B/daemon/dcpxd"
for rows in 1 64; do
  timeout 240 "$B/tools/dcpx-demo" --backend cuda --world 8 --rows $rows \
      --calls $((rows == 1 ? 200 : 100)) > "$OUT/demo_cuda_r$rows.txt" 2>&1 || rc=1
  tail -6 "$OUT/demo_cuda_r$rows.txt" | tee -a "$OUT/summary.txt"
done
timeout 120 "$B/tools/dcpx-demo" --backend cuda --world 8 --rows 8 \
    --calls 40 --fault-at 10 --fault-rank 3 > "$OUT/demo_cuda_fault.txt" 2>&1 || rc=1
tail -8 "$OUT/demo_cuda_fault.txt" | tee -a "$OUT/summary.txt"
echo quit | nvidia-cuda-mps-control

if [ "$ngpu" -ge 2 ]; then
  step "4. W=$ngpu, one rank per GPU"
  export NCCL_NVLS_ENABLE=0
  for rows in 1 64; do
    timeout 180 "$B/tools/dcpx-demo" --backend cuda --spread --world "$ngpu" \
        --rows $rows --calls $((rows == 1 ? 300 : 100)) > "$OUT/demo_multi_r$rows.txt" 2>&1 || rc=1
    tail -6 "$OUT/demo_multi_r$rows.txt" | tee -a "$OUT/summary.txt"
  done
fi
echo "gpu-run: rc=$rc" | tee -a "$OUT/summary.txt"
exit $rc
