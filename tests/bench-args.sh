#!/bin/sh
# bench-args.sh - the CPU benches' positional numbers (bench/bench_args.h):
# --help exits 0 with a usage line; a value that is not a whole number in
# range, or too many arguments, exits 2 naming the argument and runs
# nothing; a small valid run exits 0.
set -u
fail=0
bad() { echo "bench-args: $*"; fail=1; }

# expect STATUS PATTERN PROGRAM ARGS...: the exit status, and a line of the
# output (stdout and stderr) matching PATTERN
expect() {
  want=$1 pat=$2
  shift 2
  out=$("$@" 2>&1)
  got=$?
  [ "$got" -eq "$want" ] || bad "$*: exit $got, want $want: $out"
  printf '%s\n' "$out" | grep -q -- "$pat" || bad "$*: no '$pat' in: $out"
}

for p in bench/bench_ref bench/bench_rescue; do
  expect 0 "^usage: " $p --help
  expect 0 "^usage: " $p -h
  expect 2 "is not a number" $p abc
  expect 2 "is not a number" $p 12x
  expect 2 "is not a number" $p -1
  expect 2 "is not a number" $p 99999999999999999999
  expect 2 "^usage: " $p 1 2 3 4 5 6 7
done
expect 2 "ROWS: '0' is not a number" bench/bench_rescue 0
expect 2 "LOCAL: '0' is not a number" bench/bench_rescue 1 0
expect 2 "REPS: '0' is not a number" bench/bench_ref 8 512 2048 16384 4 0
expect 2 "bad shape: local_topk 8 must be less than topk 8" bench/bench_ref 2 8 8
# bench_health: atoi took "2x" for 2, strtoull "-1" for 2^64 - 1 (a run
# that hung), and an unknown --what ran nothing and exited 0
expect 0 "^usage: " bench/bench_health --help
expect 2 "bad arguments" bench/bench_health --world 2x
expect 2 "bad arguments" bench/bench_health --timeout-ms -1
expect 2 "bad arguments" bench/bench_health --what detectoin
expect 2 "bad arguments" bench/bench_health extra
# --reps past the failure records of the modes with ranks; join takes more
expect 2 "bad arguments" bench/bench_health --what kill --reps 64
expect 2 "bad arguments" bench/bench_health --what join --reps 100001
# soak: checks that could not run passed ("soak: ok")
expect 2 "must be shorter than --seconds" bench/soak --seconds 3 --warmup 10
expect 2 "must be shorter than --seconds" bench/soak --seconds 3 \
  --kill-every 100
expect 2 "bad shape" bench/bench_ref 3 4096 64
expect 0 "rows/s" bench/bench_ref 2 64 128 1024 2 1
exit $fail
