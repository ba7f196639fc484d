#!/usr/bin/env bash
# gpu-run.sh - what the GPU machine proves and measures, in named steps
# (docs/GPU.md).
#
#   On the development machine:  bash scripts/gpu-build.sh   (-> build-gpu/)
#                                bash python/gpu-build.sh    (-> build-pygpu/,
#                                                             step python only)
#   On the GPU machine, from the repo root, with those folders carried:
#                                bash scripts/gpu-run.sh [STEP...]
#
# Steps (default: kernels nccl bench1 torch bench2 pingpong faults2 mps
# devapi python; the others only when named), each bounded, each logging
# to $OUT (default /tmp/dcpx-gpu-out):
#   kernels  test_kernels: every kernel case against the CPU reference and
#            the unsafe corners (staged copy under overwrite, push under
#            abort and FAILED, a stale CUDA error, call tags under graph
#            replay, a trickling peer), as shipped, with DCPX_PDL=1,
#            with DCPX_KLIST=1, with DCPX_RESC_EARLY=1 and with half-size
#            merge blocks in every call (DCPX_MERGE_THREADS=256)
#   nccl     test_nccl: both transports against the reference (W=1; W=2
#            with two GPUs), and the bounds of the NCCL setup (a peer that
#            never joins: timeout, abort), and misaligned arrays refused
#   bench1   bench_kernels: W=8 ranks on one GPU, N=512, local 16384: push,
#            merge, merge with rescue, whole calls (5 graph replays each)
#   floorsweep  bench_kernels' launch floor by block size (256, 512, 1024
#            threads) and dynamic shared memory (16 B to 196 KiB), back to
#            back, with the merge bench's memset, and after a push-shaped
#            launch (BENCH_FLOOR_SWEEP)
#   roofline tests/gpu/roofline (the kernels' registers, spills, shared
#            memory and blocks per SM; the copy bandwidth of one SM and
#            of the GPU; each kernel's bytes per row at that bandwidth),
#            then bench_kernels' push and merge figures beside it
#   ab       bench_kernels A/B: this build, this build with full push
#            blocks always (DCPX_PUSH_SPLIT_ROWS=0), and a baseline build's
#            bench_kernels if one is carried at $BASE (default
#            build-gpu/base/bench_kernels), and a previous build's at $PREV
#            (default build-gpu/prev/bench_kernels), all in one run
#   random   test_kernels over random shapes (DCPX_TEST_RANDOM): RANDOM_S
#            (120) seconds each as shipped, with DCPX_KLIST=1 and with
#            half-size merge blocks (RVARIANTS), then test_nccl's random
#            shapes (both transports) as long; RANDOM_SEED to repeat one
#   abm      bench_kernels push and merge only (BENCH_QUICK), this build
#            and the baseline at $BASE alternating, AB_ROUNDS (2) rounds,
#            at each W:N of ABM_SHAPES (default 8:512)
#   diagab   bench_kernels push and merge only, this build as shipped
#            against DCPX_BENCH_DIAG=$DIAG_B (default 16: no overlap of
#            the sender's rescue stores with its round-2 copy; 128: round
#            1's placement and the outputs over half the row, what two
#            blocks per row could save at most; 256: the block table read
#            through L1, not from its copy in shared memory; 512: the
#            rescue list's ord16 test for every T1, not the raw bf16
#            one), alternating, AB_ROUNDS
#            rounds, at each W:N of ABM_SHAPES
#            (DIAGAB_FULL=1: whole calls of all W ranks too)
#   sanitize test_kernels under compute-sanitizer with SAN_ENV and only
#            the cases SAN_ONLY names; then with DCPX_BENCH_DIAG=16
#   earlyt1  one GPU, PDL forced: whole calls of W=2 (N=1280) and W=8
#            (N=512) ranks with the early rescue list in every call, whose
#            rescues with T1 > 0 filter it, against never (DCPX_RESC_EARLY
#            1 / 0, alternating)
#   pushlong bench_kernels at local 65,536 (push, merge; no whole calls)
#            of this build, the baseline at $BASE and the previous build at
#            $PREV, in one run
#   pushthreads  bench_kernels with push blocks of 1024 and of 512
#            threads at every rows count (DCPX_PUSH_THREADS)
#   diag     bench_kernels at rows 64 without the call counters (what
#            block 0's counter duty costs)
#   diag2    bench_kernels with DCPX_BENCH_DIAG 1 (no fault hook), 2 (no
#            rescue stores), 3 (neither), rows 1 and 64
#   prof2    Nsight Compute source counters of one rescued merge, as CSV
#   profpush Nsight Compute source counters of one push, as CSV
#   profmerge  the same for one plain merge
#   torch    torch.topk on the same shapes (graph replays), an independent
#            set check
#   ab2      two GPUs: test_nccl --bench 2 (N=1280, N=512) of this build
#            and of a baseline build's test_nccl at $BASE2 (default
#            build-gpu/base/test_nccl), in one run
#   klist2   two GPUs: test_nccl --bench 2 at N=512 (every row rescues)
#            with the push's klist (DCPX_KLIST=1, the automatic choice
#            there) and without it (the rescue list selected from the row)
#   early1   one GPU, W=1 (every row rescues, T1 = 0, PDL): test_nccl
#            --bench 1 at N=512 as shipped (the early rescue list at rows
#            <= SMs / 2, the push's klist above), the early list at every
#            rows count (DCPX_RESC_EARLY=1), the klist always
#            (DCPX_RESC_EARLY=0), and neither (the list from the row
#            after round 1)
#   early2   the same at W=2 on two GPUs
#   idlemark one GPU, W=1: NCCL whole calls with each end-of-push mark of
#            the stall watch (DCPX_NCCL_IDLE_MARK) and a baseline's
#   ab1      one GPU, W=1: test_nccl --bench 1 at N=512 of this build and
#            of a baseline build's test_nccl at $BASE2, in one run
#   bench1w  one GPU, W=1: test_nccl --bench 1, LL and NCCL in one run,
#            N=1280 and N=512 (at W=1, W*N < K: every row rescues): the
#            LL-against-NCCL figures where no second GPU is lent
#   bench2   two GPUs: test_nccl --bench 2, LL and NCCL in one run, N=1280
#            (rescue rare) and N=512 (every row rescues), and N=1280
#            without PDL
#   pingpong two GPUs: LL one-way latency (tests/gpu/pingpong; every pair
#            of GPUs, and a matrix with more than two)
#   dcp      four or eight GPUs (issue 17): test_nccl (W up to the GPUs),
#            every pair's LL latency, and at W = 4 and 8 one rank per GPU
#            whole calls LL against NCCL (N=512, auto N), the main job
#            (rows 64 and 1), a stall and a kill -9 through dcpxd
#   faults2  two GPUs, through dcpxd: a stall, a kill -9 and a SIGSTOP (LL),
#            a kill -9 and a SIGSTOP (NCCL), dcpxd restarted then a SIGSTOP
#            (LL) and a kill -9 (NCCL)
#   mps      W=8 rank processes on one GPU under MPS, through dcpxd: the
#            main job, a stall, a kill -9, a SIGSTOP, and the restart cases
#   restart  dcpxd restarted (SIGKILL; SIGTERM) under a running CUDA group,
#            W=8 under MPS: every rank reattaches, the new dcpxd adopts the
#            group (its VMM workspaces) and then handles a stall and a
#            kill -9; two GPUs: the same at W=2 with a SIGSTOP
#   uuid     ranks name their GPU by UUID: a dcpxd that sees no GPU
#            refuses a CUDA join naming it; ranks that see their GPU only
#            as CUDA_VISIBLE_DEVICES=GPU-... run exact calls
#   sandbox  dcpxd with what of its unit's sandbox a systemd-free run can
#            reproduce (not root: uid/gid 65534 and no supplementary
#            groups, no capabilities, no new privileges, its own network
#            namespace), then the main job on two GPUs (or W=1) through it
#   devapi   the device API (issue 16): examples/indexer_push, an engine
#            kernel that pushes from its epilogue, every call against the
#            reference (fused, dcpx_push, dcpx_push_list, lists that are
#            not the top-N), W=8 under MPS on one GPU and W=2 on two GPUs;
#            then its benchmark: the fused kernel against the indexer +
#            dcpx_push (graph replays, min / median / max of 5)
#   python   python/gpu-run.sh (needs build-pygpu/)
#   pytest   its pytest suite only (needs build-pygpu/; PYTEST_K=EXPR runs
#            only the tests pytest -k EXPR selects)
#   ptrcheck the host cost of the call's array checks: pytest's
#            test_overhead_per_call with DCPX_PTR_CHECK=0 and 1,
#            alternating, three rounds (needs build-pygpu/)
#   prof     Nsight Compute: one plain and one rescued merge of
#            bench_kernels (warp states, source counters)
# At the end every log but summary.txt is packed into $OUT/logs.tar.gz.
# Exit status: 0 if every step passed. Before 2026-12, GPU runs used one
# script per session (scripts/gpu-run2.sh .. gpu-run8.sh, in git history);
# bench/RESULTS.md names the one each older figure came from.
set -u
B=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/dcpx-gpu-out}
mkdir -p "$OUT"
rc=0
export NCCL_NVLS_ENABLE=0
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || { echo "no GPU"; exit 77; }
nvidia-smi topo -m >> "$OUT/nvidia-smi.txt" 2>&1
# whether the GPUs read pageable host memory (the array checks let it pass)
python3 -c 'import ctypes; cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
n = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(n)); v = ctypes.c_int()
for d in range(n.value):
    cu.cuDeviceGetAttribute(ctypes.byref(v), 88, d)
    print("GPU", d, "pageable memory access:", v.value)' \
  >> "$OUT/nvidia-smi.txt" 2>&1 || true
ngpu=$(nvidia-smi -L | wc -l)
say() { echo "== $*" | tee -a "$OUT/summary.txt"; }
show() { grep -E "$1" "$2" | tail -"${3:-8}" | tee -a "$OUT/summary.txt"; }

step_kernels() { # KVARIANTS: a subset of the variants ("shipped" = none)
  local v
  for v in ${KVARIANTS:-shipped DCPX_PDL=1 DCPX_KLIST=1 DCPX_RESC_EARLY=1 \
    DCPX_MERGE_THREADS=256}; do
    [ "$v" = shipped ] && v=
    local log="$OUT/test_kernels${v:+_${v%%=*}}.log"
    say "test_kernels ${v:-(as shipped)}"
    env $v timeout -k 5 240 "$B/tests/gpu/test_kernels" > "$log" 2>&1 || rc=1
    show "gpu-exact|MISMATCH|FAIL" "$log" 5
  done
}

step_random() { # random shapes against the reference (RANDOM_N, RANDOM_S)
  local v
  for v in ${RVARIANTS:-shipped DCPX_KLIST=1 DCPX_MERGE_THREADS=256}; do
    [ "$v" = shipped ] && v=
    local log="$OUT/test_kernels_random${v:+_${v%%=*}}.log"
    say "test_kernels, random shapes ${v:-(as shipped)}"
    env $v DCPX_TEST_RANDOM="${RANDOM_N:-100000}" \
      DCPX_TEST_RANDOM_S="${RANDOM_S:-120}" ${RANDOM_SEED:+DCPX_TEST_SEED=$RANDOM_SEED} \
      timeout -k 5 $(( ${RANDOM_S:-120} + 120 )) "$B/tests/gpu/test_kernels" \
      > "$log" 2>&1 || rc=1
    show "gpu-random|MISMATCH|FAIL|HUNG|invalid" "$log" 8
  done
  say "test_nccl, random shapes"
  env DCPX_TEST_RANDOM="${RANDOM_N:-100000}" DCPX_TEST_RANDOM_S="${RANDOM_S:-120}" \
    ${RANDOM_SEED:+DCPX_TEST_SEED=$RANDOM_SEED} NCCL_NVLS_ENABLE=0 \
    timeout -k 5 $(( ${RANDOM_S:-120} + 120 )) "$B/tests/gpu/test_nccl" \
    > "$OUT/test_nccl_random.log" 2>&1 || rc=1
  show "nccl-random|MISMATCH|FAIL" "$OUT/test_nccl_random.log" 8
}

step_nccl() {
  say test_nccl
  timeout -k 5 150 "$B/tests/gpu/test_nccl" > "$OUT/test_nccl.log" 2>&1 || rc=1
  show "nccl-exact|nccl-bounded|nccl-misaligned|MISMATCH|FAIL|FATAL" "$OUT/test_nccl.log"
}

step_bench1() {
  say "bench_kernels, W=8 on one GPU"
  BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 "$B/tests/gpu/bench_kernels" \
    > "$OUT/bench_kernels.md" 2>&1 || rc=1
  tee -a "$OUT/summary.txt" < "$OUT/bench_kernels.md" | tail -40
}

step_floorsweep() {
  say "floorsweep: the launch floor by block shape"
  BENCH_FLOOR_SWEEP=1 BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 \
    "$B/tests/gpu/bench_kernels" > "$OUT/floorsweep.md" 2>&1 || rc=1
  tee -a "$OUT/summary.txt" < "$OUT/floorsweep.md"
}

step_roofline() { # what bounds the kernels (issue 11), beside their figures
  say "roofline: resources, copy bandwidth, the poll's loads, bytes per row"
  timeout -k 5 120 "$B/tests/gpu/roofline" > "$OUT/roofline.md" 2>&1 || rc=1
  tee -a "$OUT/summary.txt" < "$OUT/roofline.md"
  say "bench_kernels, push and merge (the figures the bounds are set against)"
  BENCH_QUICK=1 BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 \
    "$B/tests/gpu/bench_kernels" > "$OUT/roofline_bench.md" 2>&1 || rc=1
  show '^\| 16384' "$OUT/roofline_bench.md" 4
}

step_ab() {
  local base=${BASE:-$B/base/bench_kernels} i
  local prev=${PREV:-$B/prev/bench_kernels}
  for i in $(seq "${AB_ROUNDS:-1}"); do
    say "ab round $i: bench_kernels (this build)"
    BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 "$B/tests/gpu/bench_kernels" \
      > "$OUT/ab${i}_new.md" 2>&1 || rc=1
    show "^\| 16384|entry|rows 1\.\.|one block" "$OUT/ab${i}_new.md" 60
    say "ab round $i: DCPX_PUSH_SPLIT_ROWS=0"
    DCPX_PUSH_SPLIT_ROWS=0 BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 \
      "$B/tests/gpu/bench_kernels" > "$OUT/ab${i}_nosplit.md" 2>&1 || rc=1
    show "^\| 16384" "$OUT/ab${i}_nosplit.md" 8
    if [ -x "$base" ]; then
      say "ab round $i: baseline $base"
      BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 "$base" \
        > "$OUT/ab${i}_base.md" 2>&1 || rc=1
      show "^\| 16384|entry" "$OUT/ab${i}_base.md" 30
    fi
    if [ -x "$prev" ]; then
      say "ab round $i: previous build $prev"
      BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 "$prev" \
        > "$OUT/ab${i}_prev.md" 2>&1 || rc=1
      show "^\| 16384" "$OUT/ab${i}_prev.md" 8
    fi
  done
}

step_abm() { # push and merge only (no whole calls): this build against
  # the baseline at $BASE, alternating, AB_ROUNDS (default 2) rounds, at
  # each W:N of ABM_SHAPES (default 8:512; W ranks on one GPU)
  local base=${BASE:-$B/base/bench_kernels} i sh
  for i in $(seq "${AB_ROUNDS:-2}"); do
    for sh in ${ABM_SHAPES:-8:512}; do
      local w=${sh%%:*} n=${sh##*:} f="$OUT/abm${i}_w${sh%%:*}"
      say "abm round $i, W=$w N=$n: this build"
      BENCH_W=$w BENCH_N=$n BENCH_QUICK=1 BENCH_REPS=5 BENCH_LEN=16384 \
        timeout -k 5 120 "$B/tests/gpu/bench_kernels" > "${f}_new.md" 2>&1 ||
        rc=1
      show "^\| 16384|rows 1, |rows 64, " "${f}_new.md" 40
      [ -x "$base" ] || continue
      say "abm round $i, W=$w N=$n: baseline $base"
      BENCH_W=$w BENCH_N=$n BENCH_QUICK=1 BENCH_REPS=5 BENCH_LEN=16384 \
        timeout -k 5 120 "$base" > "${f}_base.md" 2>&1 || rc=1
      show "^\| 16384" "${f}_base.md" 8
    done
  done
}

step_diagab() { # this build as shipped against itself with DCPX_BENCH_DIAG
  # = $DIAG_B (default 16: the sender's rescue stores not beside its
  # round-2 copy), push and merge only, alternating, AB_ROUNDS rounds, at
  # each W:N of ABM_SHAPES
  local i sh v
  for i in $(seq "${AB_ROUNDS:-2}"); do
    for sh in ${ABM_SHAPES:-8:512}; do
      local w=${sh%%:*} n=${sh##*:}
      for v in 0 "${DIAG_B:-16}"; do
        local f="$OUT/diagab${i}_w${w}_d$v.md" q=BENCH_QUICK=1
        [ -n "${DIAGAB_FULL:-}" ] && q= # whole calls too
        say "diagab round $i, W=$w N=$n: DCPX_BENCH_DIAG=$v"
        env $q DCPX_BENCH_DIAG=$v BENCH_W=$w BENCH_N=$n BENCH_REPS=5 \
          BENCH_LEN=16384 timeout -k 5 150 "$B/tests/gpu/bench_kernels" \
          > "$f" 2>&1 || rc=1
        show "^\| 16384|rows 1, |rows 64, |stores beside" "$f" 40
      done
    done
  done
}

step_sanitize() { # test_kernels under compute-sanitizer (when the machine
  # has it; else plainly), with the variables in SAN_ENV (e.g.
  # "DCPX_RESC_EARLY=1") and only the cases DCPX_TEST_ONLY=$SAN_ONLY names;
  # then the same without the sanitizer and with DCPX_BENCH_DIAG=16
  local san
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  say "sanitize: ${san:-no compute-sanitizer} ${SAN_ENV:-} only=${SAN_ONLY:-all}"
  env ${SAN_ENV:-} DCPX_TEST_ONLY=${SAN_ONLY:-} timeout -k 5 200 ${san:+$san --print-limit 20} \
    "$B/tests/gpu/test_kernels" > "$OUT/sanitize.log" 2>&1 || rc=1
  tail -40 "$OUT/sanitize.log" | tee -a "$OUT/summary.txt"
  say "sanitize: DCPX_BENCH_DIAG=16 ${SAN_ENV:-} only=${SAN_ONLY:-all}"
  env ${SAN_ENV:-} DCPX_BENCH_DIAG=16 DCPX_TEST_ONLY=${SAN_ONLY:-} timeout -k 5 100 \
    "$B/tests/gpu/test_kernels" > "$OUT/sanitize16.log" 2>&1 || rc=1
  tail -5 "$OUT/sanitize16.log" | tee -a "$OUT/summary.txt"
}

step_earlyt1() { # the early rescue list where rescues have T1 > 0: PDL
  # forced (DCPX_PDL=1, as with one rank per GPU), whole calls of W=2
  # (N=1280) and W=8 (N=512) ranks on one GPU, the early list in every
  # call (DCPX_RESC_EARLY=1) against never (=0), alternating
  local i v w
  for i in $(seq "${AB_ROUNDS:-2}"); do
    for w in 2:1280 8:512; do
      [ "$i" -gt 1 ] && [ "$w" = 8:512 ] && continue
      for v in 0 1; do
        local log="$OUT/earlyt1_${i}_w${w%%:*}_e$v.md"
        say "earlyt1 round $i: W=${w%%:*} N=${w##*:} DCPX_RESC_EARLY=$v"
        DCPX_PDL=1 DCPX_RESC_EARLY=$v BENCH_W=${w%%:*} BENCH_N=${w##*:} \
          BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 200 \
          "$B/tests/gpu/bench_kernels" > "$log" 2>&1 || rc=1
        show "^\| 16384" "$log" 8
      done
    done
  done
}

step_pushlong() { # long rows: this build's push against a baseline's
  local base=${BASE:-$B/base/bench_kernels}
  local prev=${PREV:-$B/prev/bench_kernels}
  say "pushlong: bench_kernels at local 65536 (this build)"
  BENCH_QUICK=1 BENCH_REPS=5 BENCH_LEN=65536 timeout -k 5 240 \
    "$B/tests/gpu/bench_kernels" > "$OUT/pushlong_new.md" 2>&1 || rc=1
  show "^\| 65536|push, rows" "$OUT/pushlong_new.md" 12
  if [ -x "$base" ]; then
    say "pushlong: baseline $base"
    BENCH_QUICK=1 BENCH_REPS=5 BENCH_LEN=65536 timeout -k 5 240 "$base" \
      > "$OUT/pushlong_base.md" 2>&1 || rc=1
    show "^\| 65536|push, rows" "$OUT/pushlong_base.md" 12
  fi
  if [ -x "$prev" ]; then
    say "pushlong: previous build $prev"
    BENCH_QUICK=1 BENCH_REPS=5 BENCH_LEN=65536 timeout -k 5 240 "$prev" \
      > "$OUT/pushlong_prev.md" 2>&1 || rc=1
    show "^\| 65536|push, rows" "$OUT/pushlong_prev.md" 12
  fi
}

step_pushthreads() { # the push's block size against the automatic choice
  local nt
  for nt in 1024 512; do
    say "pushthreads: DCPX_PUSH_THREADS=$nt"
    DCPX_PUSH_THREADS=$nt BENCH_REPS=5 BENCH_LEN=16384 timeout -k 5 240 \
      "$B/tests/gpu/bench_kernels" > "$OUT/pushthreads_$nt.md" 2>&1 || rc=1
    show "^\| 16384" "$OUT/pushthreads_$nt.md" 8
    DCPX_PUSH_THREADS=$nt BENCH_REPS=5 BENCH_LEN=65536 timeout -k 5 240 \
      "$B/tests/gpu/bench_kernels" > "$OUT/pushthreads_${nt}_65536.md" 2>&1 || rc=1
    show "^\| 65536" "$OUT/pushthreads_${nt}_65536.md" 8
  done
}

step_diag() {
  say "diag: bench_kernels rows 64 without the call counters"
  DCPX_BENCH_NOCTR=1 BENCH_ROWS=64 BENCH_REPS=5 BENCH_LEN=16384 \
    timeout -k 5 120 "$B/tests/gpu/bench_kernels" > "$OUT/diag_noctr.md" 2>&1 || rc=1
  show "^\| 16384|entry|rows 1\.\.|one block" "$OUT/diag_noctr.md" 30
}

step_prof2() {
  # Where a rescued merge's time goes, by source line: Nsight Compute's
  # warp-state samples of one skewed merge (rows 1), as CSV.
  mkdir -p /tmp/dcpx-gpu-src && cp -r kernels common include /tmp/dcpx-gpu-src/
  BENCH_QUICK=1 BENCH_ROWS=1 BENCH_REPS=5 BENCH_LEN=16384 \
    timeout -k 5 200 ncu --section SourceCounters --section WarpStateStats \
    --import-source yes --warp-sampling-interval 0 \
    -k regex:dcpx_merge_kernel -s 141 -c 1 \
    -o "$OUT/merge_skew2" -f "$B/tests/gpu/bench_kernels" \
    > "$OUT/ncu_skew2.log" 2>&1 || rc=1
  ncu -i "$OUT/merge_skew2.ncu-rep" --page source --csv --print-source cuda,sass \
    > "$OUT/merge_skew2_cuda_sass.csv" 2>&1
  say "prof2: $(wc -l < "$OUT/merge_skew2_cuda_sass.csv") lines"
}

step_profpush() {
  # Where a push's time goes, by source line: Nsight Compute's warp-state
  # samples of one push (rows 1, local 16,384), as CSV.
  mkdir -p /tmp/dcpx-gpu-src && cp -r kernels common include /tmp/dcpx-gpu-src/
  BENCH_QUICK=1 BENCH_ROWS=1 BENCH_REPS=5 BENCH_LEN=16384 \
    timeout -k 5 200 ncu --section SourceCounters --section WarpStateStats \
    --section LaunchStats --section Occupancy --import-source yes \
    --warp-sampling-interval 0 -k regex:dcpx_push_kernel -s 40 -c 1 \
    -o "$OUT/push" -f "$B/tests/gpu/bench_kernels" \
    > "$OUT/ncu_push.log" 2>&1 || rc=1
  ncu -i "$OUT/push.ncu-rep" --page source --csv --print-source cuda \
    > "$OUT/push_cuda.csv" 2>&1
  ncu -i "$OUT/push.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/push_sass.csv" 2>&1
  ncu -i "$OUT/push.ncu-rep" --page source --csv --print-source cuda,sass \
    > "$OUT/push_cuda_sass.csv" 2>&1
  ncu -i "$OUT/push.ncu-rep" --page details --csv > "$OUT/push_details.csv" 2>&1
  say "profpush: $(wc -l < "$OUT/push_cuda.csv") cuda lines, $(wc -l < "$OUT/push_sass.csv") sass lines"
}

step_profmerge() {
  # Where a plain merge's time goes, by source line: Nsight Compute's
  # warp-state samples at the finest interval, one merge (rows 1), CSV.
  mkdir -p /tmp/dcpx-gpu-src && cp -r kernels common include /tmp/dcpx-gpu-src/
  BENCH_QUICK=1 BENCH_ROWS=1 BENCH_REPS=5 BENCH_LEN=16384 \
    timeout -k 5 200 ncu --section SourceCounters --section WarpStateStats \
    --import-source yes --warp-sampling-interval 0 \
    -k regex:dcpx_merge_kernel -s 40 -c 1 \
    -o "$OUT/merge_plain" -f "$B/tests/gpu/bench_kernels" \
    > "$OUT/ncu_merge_plain.log" 2>&1 || rc=1
  ncu -i "$OUT/merge_plain.ncu-rep" --page source --csv --print-source cuda,sass \
    > "$OUT/merge_plain_cuda_sass.csv" 2>&1
  say "profmerge: $(wc -l < "$OUT/merge_plain_cuda_sass.csv") lines"
}

step_diag2() {
  local d
  for d in 1 2 3; do
    say "diag2: DCPX_BENCH_DIAG=$d rows 1 and 64"
    for r in 1 64; do
      DCPX_BENCH_DIAG=$d BENCH_ROWS=$r BENCH_REPS=5 BENCH_LEN=16384 \
        timeout -k 5 120 "$B/tests/gpu/bench_kernels" > "$OUT/diag2_${d}_$r.md" 2>&1 || rc=1
      show "^\| 16384|entry|rows 1\.\.|us at" "$OUT/diag2_${d}_$r.md" 30
    done
  done
}

step_torch() {
  say "torch.topk baselines"
  gcc -shared -fPIC -O2 -std=gnu11 -Iinclude -Icommon -I"$B/include" \
    common/wire.c common/merge.c common/ref.c common/log.c \
    -o /tmp/libdcpxref.so 2>&1 | tail -3
  PYTHONPATH=$PWD/python timeout -k 5 300 python3 bench/torch_baseline.py \
    --lib /tmp/libdcpxref.so \
    > "$OUT/torch_baseline.md" 2>&1 || rc=1
  tail -12 "$OUT/torch_baseline.md" | tee -a "$OUT/summary.txt"
}

gbench() { # name, env...
  local name=$1; shift
  say "test_nccl --bench ${GB_W:-2}: $*"
  env "$@" timeout -k 5 150 "$B/tests/gpu/test_nccl" --bench "${GB_W:-2}" \
    > "$OUT/$name.md" 2>&1 || rc=1
  show "^\||gbench|MISMATCH" "$OUT/$name.md" 20
}

step_bench2() {
  [ "$ngpu" -ge 2 ] || { say "bench2: needs two GPUs, skipped"; return; }
  gbench gbench_n1280 DCPX_BENCH_N=1280
  gbench gbench_n512 DCPX_BENCH_N=512
  gbench gbench_n1280_nopdl DCPX_BENCH_N=1280 DCPX_NO_PDL=1
}

step_klist2() { # W=2, every row rescuing: the push's klist against none
  [ "$ngpu" -ge 2 ] || { say "klist2: needs two GPUs, skipped"; return; }
  gbench klist2_on DCPX_BENCH_N=512 DCPX_KLIST=1
  gbench klist2_off DCPX_BENCH_N=512 DCPX_KLIST=0
}

early() { # W, name prefix: every row rescuing (N=512), four ways
  GB_W=$1 gbench ${2}_auto DCPX_BENCH_N=512
  GB_W=$1 gbench ${2}_all DCPX_BENCH_N=512 DCPX_RESC_EARLY=1
  GB_W=$1 gbench ${2}_klist DCPX_BENCH_N=512 DCPX_RESC_EARLY=0
  GB_W=$1 gbench ${2}_row DCPX_BENCH_N=512 DCPX_RESC_EARLY=0 DCPX_KLIST=0
}

step_early1() { early 1 early1; }

step_early2() {
  [ "$ngpu" -ge 2 ] || { say "early2: needs two GPUs, skipped"; return; }
  early 2 early2
}

abw() { # W, N...: this build's whole calls against a baseline's, one job
  local w=$1 base=${BASE2:-$B/base/test_nccl} n
  shift
  for n in "$@"; do
    GB_W=$w gbench ab${w}w_new_n$n DCPX_BENCH_N=$n
    if [ -x "$base" ]; then
      say "ab${w}w: baseline $base"
      DCPX_BENCH_N=$n timeout -k 5 150 "$base" --bench "$w" \
        > "$OUT/ab${w}w_base_n$n.md" 2>&1 || rc=1
      show "^\||gbench|MISMATCH" "$OUT/ab${w}w_base_n$n.md" 20
    fi
  done
}

step_ab2() { # this build's W=2 whole calls against a baseline's, one job
  [ "$ngpu" -ge 2 ] || { say "ab2: needs two GPUs, skipped"; return; }
  abw 2 1280 512
}

step_ab1() { abw 1 512; } # the same at W=1 on one GPU (every row rescues)

step_bench1w() { # W=1 whole calls, LL and NCCL in one job, no baseline
  GB_W=1 gbench gbench1_n1280 DCPX_BENCH_N=1280
  GB_W=1 gbench gbench1_n512 DCPX_BENCH_N=512
}

step_idlemark() { # the NCCL push's end-of-all-gather mark (the stall watch):
  # W=1 whole calls with the mark (a one-thread kernel), without it, and
  # the baseline build ($BASE2), alternating, two rounds. (Session 17 also
  # measured a cuStreamWriteValue64 mark, since removed: 2.8 us a call.)
  local base=${BASE2:-$B/base/test_nccl} round m
  for round in 1 2; do
    for m in kernel none; do
      GB_W=1 gbench idle_${m}_$round DCPX_BENCH_N=512 DCPX_NCCL_IDLE_MARK=$m
    done
    if [ -x "$base" ]; then
      say "idlemark: baseline $base"
      DCPX_BENCH_N=512 timeout -k 5 150 "$base" --bench 1 \
        > "$OUT/idle_base_$round.md" 2>&1 || rc=1
      show "^\||gbench|MISMATCH" "$OUT/idle_base_$round.md" 20
    fi
  done
}


demo() { # name, args...
  local name=$1; shift
  DCPXD="$B/daemon/dcpxd" timeout -k 5 120 "$B/tools/dcpx-demo" --backend cuda \
    "$@" > "$OUT/$name.txt" 2>&1 || rc=1
  say "$name: $*"; show "latency|fault:|exact:|restart:" "$OUT/$name.txt"
}

step_pingpong() {
  [ "$ngpu" -ge 2 ] || { say "pingpong: needs two GPUs, skipped"; return; }
  say "LL ping-pong"
  timeout -k 5 60 "$B/tests/gpu/pingpong" --iters 10000 --launches 7 \
    > "$OUT/pingpong.md" 2>&1 || rc=1
  show "^\| |ll-oneway|FAIL|FATAL" "$OUT/pingpong.md" 12
}

step_faults2() {
  [ "$ngpu" -ge 2 ] || { say "faults2: needs two GPUs, skipped"; return; }
  demo stall2gpu --spread --world 2 --rows 64 --calls 30 --fault-at 10 --fault-rank 1
  demo kill2gpu --spread --world 2 --rows 64 --calls 30 --kill-at 7 --fault-rank 0
  demo stop2gpu --spread --world 2 --rows 64 --calls 30 --stop-at 12 --fault-rank 1
  # the NCCL transport: a killed peer (dcpxd aborts, the watchdogs end the
  # collectives) and a stopped one (the stall watch)
  demo kill2nccl --spread --world 2 --transport nccl --rows 64 --calls 30 \
    --kill-at 7 --fault-rank 0
  demo stop2nccl --spread --world 2 --transport nccl --rows 64 --calls 30 \
    --stop-at 12 --fault-rank 1
  # dcpxd restarted under the running group, then a stall it must see;
  # and under an NCCL-transport group, then a kill -9
  demo restart2gpu --spread --world 2 --rows 64 --calls 30 --restart-at 5 \
    --stop-at 15 --fault-rank 1
  demo restart2nccl --spread --world 2 --transport nccl --rows 64 \
    --calls 30 --restart-at 5 --kill-at 15 --fault-rank 0
}

step_dcp() { # issue 17: W = 4 and 8 one rank per GPU, when the machine has
  # them: the exactness matrix of both transports (test_nccl's W = 1, 2, 4,
  # 8 up to the GPUs), whole calls LL against NCCL (N=512 and the auto N),
  # the main job, a stall and a kill -9 through dcpxd, the LL latency of
  # every GPU pair beside nvidia-smi topo -m (nvidia-smi.txt)
  [ "$ngpu" -ge 4 ] || { say "dcp: needs four GPUs or more, skipped"; return; }
  local w
  step_nccl
  say "LL ping-pong, every pair"
  timeout -k 5 300 "$B/tests/gpu/pingpong" --iters 10000 --launches 7 \
    > "$OUT/pingpong_all.md" 2>&1 || rc=1
  show "^\| |ll-oneway|FAIL|FATAL" "$OUT/pingpong_all.md" 60
  for w in 4 8; do
    [ "$ngpu" -ge "$w" ] || continue
    GB_W=$w gbench dcp${w}_n512 DCPX_BENCH_N=512
    GB_W=$w gbench dcp${w}_auto DCPX_BENCH_N=auto
    demo dcp${w}_main --spread --world $w --rows 64 --calls 30
    demo dcp${w}_rows1 --spread --world $w --rows 1 --calls 30
    demo dcp${w}_stall --spread --world $w --rows 64 --calls 30 \
      --fault-at 10 --fault-rank 1
    demo dcp${w}_kill --spread --world $w --rows 64 --calls 30 --kill-at 7 \
      --fault-rank $((w - 1))
  done
}

mps_on() { # W rank processes share one GPU through MPS
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
  mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d
}

mps_off() {
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# dcpxd restarted (SIGKILL, SIGTERM) under a running CUDA group: the
# calls go on without it, every rank reattaches and the new dcpxd adopts
# the group from the VMM workspace fds the ranks hand back; it must then
# see a stall (the recovery zeroes the adopted workspaces) and a rank
# killed and replaced. Inside MPS (step_mps, step_restart).
restart_cases() {
  demo restart_stall --world 8 --rows 8 --calls 30 --restart-at 6 \
    --fault-at 18 --fault-rank 5 --daemon-log "$OUT/restart_stall_dcpxd.log"
  demo restart_kill --world 8 --rows 64 --calls 30 --restart-at 6 \
    --restart-signal term --kill-at 18 --fault-rank 2 \
    --daemon-log "$OUT/restart_kill_dcpxd.log"
  grep -h "adopted after\|zeroed in" "$OUT"/restart_*_dcpxd.log |
    tee -a "$OUT/summary.txt"
}

step_mps() {
  mps_on
  demo main --world 8 --rows 64 --calls 30
  demo stall --world 8 --rows 8 --calls 30 --fault-at 10 --fault-rank 5
  demo kill --world 8 --rows 8 --calls 30 --kill-at 12 --fault-rank 2
  demo stop --world 8 --rows 8 --calls 30 --stop-at 14 --fault-rank 3
  restart_cases
  mps_off
}

step_restart() { # the restart cases alone (one GPU under MPS; two: spread)
  mps_on
  restart_cases
  mps_off
  [ "$ngpu" -ge 2 ] || return
  demo restart2gpu --spread --world 2 --rows 64 --calls 30 --restart-at 5 \
    --stop-at 15 --fault-rank 1
}

step_uuid() { # ranks name their GPU by UUID (Join.device_uuid)
  local u
  # A dcpxd that sees no GPU: the rank's join is refused, naming its GPU.
  dcpxd_up uuid-blind
  kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
  CUDA_VISIBLE_DEVICES= "$B/daemon/dcpxd" --config= --socket "$dsock" \
    --state-dir "$(dirname "$dsock")" > "$OUT/uuid-blind-dcpxd.log" 2>&1 &
  dpid=$!
  for _ in $(seq 100); do [ -S "$dsock" ] && break; sleep 0.1; done
  if timeout -k 5 60 "$B/tools/dcpx-demo" --backend cuda --socket "$dsock" \
    --world 1 --rows 8 --calls 3 > "$OUT/uuid-blind.txt" 2>&1; then
    say "uuid: FAIL: a dcpxd that sees no GPU formed a CUDA group"; rc=1
  elif grep -q "is not one this dcpxd sees" "$OUT/uuid-blind.txt" \
    "$OUT/uuid-blind-dcpxd.log"; then
    say "uuid: a dcpxd that sees no GPU refuses the join, naming the GPU"
    grep -h "is not one this dcpxd sees" "$OUT/uuid-blind-dcpxd.log" | head -1 \
      | tee -a "$OUT/summary.txt"
  else
    say "uuid: FAIL: refused without naming the GPU"; rc=1
  fi
  dcpxd_down
  # The ranks see their GPU by UUID only (CUDA_VISIBLE_DEVICES=GPU-...),
  # dcpxd by ordinal: the same GPU, found by UUID.
  u=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
  dcpxd_up uuid-named
  CUDA_VISIBLE_DEVICES=$u demo uuid-named --socket "$dsock" --world 1 \
    --rows 64 --calls 20
  # dcpxctl health names the rank's GPU by UUID (a group that lives on)
  CUDA_VISIBLE_DEVICES=$u timeout -k 5 60 "$B/tools/dcpx-demo" --backend cuda \
    --socket "$dsock" --world 1 --rows 8 --calls 20000 --quiet \
    --group uuid-health > /dev/null 2>&1 &
  local p=$!
  sleep 4
  "$B/tools/dcpxctl" --socket "$dsock" health uuid-health \
    > "$OUT/uuid-health.txt" 2>&1
  "$B/tools/dcpxctl" --socket "$dsock" --json health uuid-health \
    > "$OUT/uuid-health.json" 2>&1
  if grep -q "\"device_uuid\": *\"$u\"" "$OUT/uuid-health.json"; then
    say "uuid: dcpxctl health shows the rank's GPU $u"
    grep "rank 0" "$OUT/uuid-health.txt" | tee -a "$OUT/summary.txt"
  else
    say "uuid: FAIL: dcpxctl health does not show $u"; rc=1
  fi
  kill "$p" 2>/dev/null; wait "$p" 2>/dev/null
  dcpxd_down
}

step_sandbox() {
  local d pid w=1 spread=
  [ "$ngpu" -ge 2 ] && { w=2; spread=--spread; }
  d=$(mktemp -d /tmp/dcpx-sb.XXXXXX)
  mkdir -p "$d/run" "$d/state" && chown -R 65534:65534 "$d" && chmod 755 "$d"
  unshare --net setpriv --reuid=65534 --regid=65534 --clear-groups \
    --no-new-privs --bounding-set=-all --inh-caps=-all \
    "$B/daemon/dcpxd" --config= --socket "$d/run/dcpxd.sock" \
    --state-dir "$d/state" > "$OUT/sandbox-dcpxd.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -S "$d/run/dcpxd.sock" ] && break; sleep 0.1; done
  say "sandbox: dcpxd pid $pid as $(ps -o user= -p $pid 2>/dev/null), \
caps $(grep CapEff /proc/$pid/status 2>/dev/null | awk '{print $2}'), \
netns $(readlink /proc/$pid/ns/net 2>/dev/null) (ours $(readlink /proc/self/ns/net))"
  demo sandbox --socket "$d/run/dcpxd.sock" $spread --world $w --rows 64 --calls 30
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  tail -5 "$OUT/sandbox-dcpxd.log" >> "$OUT/summary.txt"
  rm -rf "$d"
}

# A private dcpxd on a socket of a fresh folder: dcpxd_up sets $dsock and
# $dpid, dcpxd_down stops it.
dcpxd_up() { # log name
  local d
  d=$(mktemp -d /tmp/dcpx-devapi.XXXXXX)
  dsock=$d/dcpxd.sock
  "$B/daemon/dcpxd" --config= --socket "$dsock" --state-dir "$d" \
    > "$OUT/$1-dcpxd.log" 2>&1 &
  dpid=$!
  for _ in $(seq 100); do [ -S "$dsock" ] && break; sleep 0.1; done
}
dcpxd_down() {
  kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
  rm -rf "$(dirname "$dsock")"
}

devapi() { # name, args...
  local name=$1; shift
  dcpxd_up "$name"
  timeout -k 5 "${DEVAPI_TIMEOUT:-400}" "$B/examples/indexer_push" --socket "$dsock" "$@" \
    > "$OUT/$name.txt" 2>&1 || rc=1
  dcpxd_down
  say "$name: $*"
  show "indexer_push:|devapi|MISMATCH|^\| [0-9]|failed" "$OUT/$name.txt" 24
}

step_devapi() {
  mps_on
  devapi devapi_w8 --world 8 --rows 64 --calls ${DEVAPI_CALLS:-16} ${DEVAPI_BENCH---bench}
  mps_off
  [ "$ngpu" -ge 2 ] || { say "devapi W=2: needs two GPUs, skipped"; return; }
  devapi devapi_w2 --world 2 --rows 64 --calls 16 --spread --bench
}

step_python() {
  [ -d build-pygpu ] || { say "python: build-pygpu/ missing"; rc=1; return; }
  say "python package"
  OUT="$OUT/python" bash python/gpu-run.sh > "$OUT/python.txt" 2>&1 || rc=1
  tail -20 "$OUT/python.txt" | tee -a "$OUT/summary.txt"
}

step_pytest() {
  [ -d build-pygpu ] || { say "pytest: build-pygpu/ missing"; rc=1; return; }
  say "python package: pytest"
  OUT="$OUT/python" timeout -k 5 540 bash python/gpu-run.sh --pytest-only \
    > "$OUT/pytest.txt" 2>&1 || rc=1
  tail -5 "$OUT/pytest.txt" | tee -a "$OUT/summary.txt"
}

step_ptrcheck() { # the host cost of the call's array checks (devptr.h):
  # test_overhead_per_call with DCPX_PTR_CHECK=0 and =1, alternating
  [ -d build-pygpu ] || { say "ptrcheck: build-pygpu/ missing"; rc=1; return; }
  local b=$PWD/build-pygpu i v log
  for i in 1 2 3; do
    for v in 0 1; do
      log="$OUT/ptrcheck_${v}_$i.log"
      say "overhead per call, DCPX_PTR_CHECK=$v (round $i)"
      env LD_LIBRARY_PATH="$b/lib" DCPX_LIBRARY="$b/lib/libdcpx.so.0" \
        DCPXD="$b/dcpxd" PYTHONPATH="$PWD/python" PYTHONDONTWRITEBYTECODE=1 \
        DCPX_PTR_CHECK=$v timeout -k 5 120 python3 -m pytest \
        -p no:cacheprovider -q -s python/tests/test_gpu.py \
        -k test_overhead_per_call > "$log" 2>&1 || rc=1
      show 'push\+merge per call|failed' "$log" 2
    done
  done
}

step_prof() {
  # The build compiled a clean export in /tmp/dcpx-gpu-src (gpu-build.sh):
  # the source page needs the files at that path.
  mkdir -p /tmp/dcpx-gpu-src && cp -r kernels common include /tmp/dcpx-gpu-src/
  local spec name skip
  # bench_merge launches 141 merges per fill mode: plain first, then skewed
  for spec in plain:0 skew:141; do
    name=${spec%%:*} skip=${spec##*:}
    BENCH_QUICK=1 BENCH_ROWS=1 BENCH_REPS=5 BENCH_LEN=16384 \
      timeout -k 5 200 ncu --section SourceCounters --section WarpStateStats \
      --section InstructionStats \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      --import-source yes -k regex:dcpx_merge_kernel -s "$skip" -c 1 \
      -o "$OUT/merge_$name" -f "$B/tests/gpu/bench_kernels" \
      > "$OUT/ncu_$name.log" 2>&1 || rc=1
    ncu -i "$OUT/merge_$name.ncu-rep" --page details \
      > "$OUT/merge_${name}_details.txt" 2>&1
    say "ncu $name"
    show "Duration|Warp Cycles|Executed Instructions" "$OUT/merge_${name}_details.txt" 20
    # the stall reasons, largest first
    ncu -i "$OUT/merge_$name.ncu-rep" --page raw --csv 2>/dev/null |
      python3 -c 'import csv,sys
r=list(csv.reader(sys.stdin))
if len(r)>2:
  v=[(float(x.replace(",","")),h) for h,x in zip(r[0],r[2]) if "issue_stalled" in h and x.replace(",","").replace(".","",1).isdigit()]
  for x,h in sorted(v,reverse=True)[:12]: print("%8.2f %s"%(x,h))' | tee -a "$OUT/summary.txt"
  done
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(kernels nccl bench1 torch bench2 pingpong faults2 mps devapi python)
for s in "${steps[@]}"; do
  if ! declare -F "step_$s" > /dev/null; then
    echo "gpu-run: unknown step '$s'" >&2
    exit 2
  fi
  "step_$s"
done
echo "gpu-run: rc=$rc" | tee -a "$OUT/summary.txt"
# The device tool brings back a few files only: everything but the summary
# goes into one archive.
(cd "$OUT" && find . -type f ! -name summary.txt ! -name logs.tar.gz -print0 |
  tar czf logs.tar.gz --null -T - --remove-files)
exit $rc
