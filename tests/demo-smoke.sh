#!/bin/sh
# demo-smoke.sh - the main job in miniature under make check: W rank
# processes through a private dcpxd, every call checked against the
# reference; then the same with a stalled rank (fault injection through
# dcpxctl), with a stall in the last call (the recovery is the last thing
# the counters see), with a rank killed mid-call and replaced, and with
# dcpxd restarted mid-run (then a kill that the new dcpxd must handle).
# Each
# run must end with every checked call exact and every rank's call
# counters (dcpx_health: calls, rows, rescue_rows, failed_calls) equal to
# its own tally of its calls: dcpx-demo's exit status, and its
# `exact:` and `counters: ok` lines (so a check that stopped running
# fails too); a run that stopped early reports figures of the calls made
# only. First, bad numeric options must be refused; other bad
# arguments too, and a dcpxd that cannot start is reported with its log,
# leaving no runtime folder behind (nor does a SIGTERM).
set -eu
demo=${DEMO:-tools/dcpx-demo}
out=$(mktemp "${TMPDIR:-/tmp}/demo-smoke.XXXXXX")
trap 'rm -f "$out"' EXIT

run() {
  if ! "$demo" "$@" --quiet >"$out" 2>&1; then
    cat "$out"
    echo "demo-smoke: FAIL: dcpx-demo $* exited non-zero" >&2
    exit 1
  fi
  cat "$out"
  for line in '^exact: ' '^counters: ok'; do
    if ! grep -q "$line" "$out"; then
      echo "demo-smoke: FAIL: dcpx-demo $* printed no '$line' line" >&2
      exit 1
    fi
  done
}

# Bad numbers are refused with exit 2 and the option named, before
# anything starts ("010" would have been octal once).
bad() {
  if "$demo" "$@" >"$out" 2>&1; then
    echo "demo-smoke: FAIL: dcpx-demo $* was accepted" >&2
    exit 1
  elif [ $? -ne 2 ] || ! grep -q -- "--${1#--}: '$2' is not a number" "$out"; then
    cat "$out"
    echo "demo-smoke: FAIL: dcpx-demo $* did not say which number is bad" >&2
    exit 1
  fi
}
bad --world abc
bad --rows 12x
bad --calls 4294967296
bad --fault-at -1
bad --stop-at 1e3
bad --local-len 0x
bad --restart-at x
bad --world " 3"
bad --rows "$(printf '\t4')" # strtoull skips a tab or a newline
# The shape's options are named with their own range (--world -1 said "a
# number from 0 to 4294967295" where 1..16 is meant).
for a in "--world 0 1 to 16" "--world 17 1 to 16" "--rows 4097 1 to 4096" \
         "--topk 1 2 to 4096" "--local-len 131073 1 to 131072" \
         "--calls 0 1 to 4294967295"; do
  set -- $a
  bad "$1" "$2"
  if ! grep -q -- "is not a number from $3 $4 $5" "$out"; then
    cat "$out"
    echo "demo-smoke: FAIL: dcpx-demo $1 $2 did not give the range $3 $4 $5" >&2
    exit 1
  fi
done
v=$("$demo" --version) || { echo "demo-smoke: FAIL: --version" >&2; exit 1; }
case $v in
  "dcpx-demo "[0-9]*) ;;
  *) echo "demo-smoke: FAIL: --version printed '$v'" >&2; exit 1 ;;
esac

# -h and --help, like dcpxd's and dcpxctl's: the help, exit 0, and it
# names them.
for h in -h --help; do
  if ! "$demo" $h >"$out" 2>&1 || ! grep -q -e '-h, --help' "$out"; then
    cat "$out"
    echo "demo-smoke: FAIL: dcpx-demo $h: no help naming -h, --help" >&2
    exit 1
  fi
done

run --world 4 --rows 4 --local-len 3000 --calls 8

# A report (or help) that cannot be written (a full disk) fails the run
# and says why: it exited 0 with the report lost.
for args in "--world 2 --rows 2 --local-len 512 --calls 2" "--help"; do
  st=0
  "$demo" $args >/dev/full 2>"$out" || st=$?
  if [ "$st" -eq 0 ] || ! grep -q "cannot write standard output" "$out"; then
    cat "$out"
    echo "demo-smoke: FAIL: dcpx-demo $args >/dev/full: exit $st" >&2
    exit 1
  fi
done
run --world 3 --rows 4 --local-len 2048 --calls 8 --fault-at 3
run --world 2 --rows 3 --local-len 2048 --calls 4 --fault-at 3 --fault-rank 0
# One row, K close to the logits' length: the stalled rank must still
# hold row 0's top K, or its peers need nothing of it and the stall is
# not felt (the demo said the fault "did not take" and exited 1).
run --world 2 --rows 1 --local-len 256 --topk 64 --local-topk 0 --calls 6 --fault-at 4
run --world 5 --rows 3 --local-len 2048 --calls 8 --kill-at 4 --fault-rank 2
# A rank process stopped (SIGSTOP) before its push, continued 0.9 s later:
# its peers' waits give up, the group aborts and recovers.
run --world 3 --rows 4 --local-len 2048 --calls 6 --stop-at 2

# dcpxd restarted mid-run (SIGTERM, then SIGKILL) while the calls go on:
# every rank reattaches (the new dcpxd adopts the group); in the second
# run that dcpxd then sees a rank killed and replaced, and recovers the
# group. (A stall after a restart: tests/check_health.c's
# test_daemon_restart here, and gpu-run.sh restart on the GPU; a fault
# run's 300 ms wait limit makes every demo fault run sensitive to a
# loaded machine, so this script keeps to one such run of it.)
restarted() { # args...
  run "$@"
  if ! grep -q "^restart: dcpxd stopped .* 3/3 ranks reattached" "$out"; then
    echo "demo-smoke: FAIL: dcpx-demo $*: no '3/3 ranks reattached'" >&2
    exit 1
  fi
}
restarted --world 3 --rows 4 --local-len 2048 --calls 16 --restart-at 3 \
  --restart-signal term
restarted --world 3 --rows 3 --local-len 2048 --calls 12 --restart-at 2 \
  --kill-at 8 --fault-rank 2

# Rows shorter than N, where local lengths are shorter than N themselves.
run --world 2 --rows 4 --local-len 8 --local-topk 16 --topk 32 --calls 4
run --world 1 --rows 3 --local-len 2048 --calls 4 --kill-at 1
# --local-topk 0: the library's choice, as a dcpx_shape's 0
run --world 3 --rows 2 --local-len 2048 --calls 2 --local-topk 0

# Other bad arguments: exit 2 and a reason, before anything starts.
refused() { # pattern, args...
  pat=$1
  shift
  if "$demo" "$@" >"$out" 2>&1 || [ $? -ne 2 ] || ! grep -q -- "$pat" "$out"; then
    cat "$out"
    echo "demo-smoke: FAIL: dcpx-demo $* was not refused with '$pat'" >&2
    exit 1
  fi
}
refused "unexpected argument 'extra'" extra
refused "exceed int32" --world 2 --block-size 4294967295
refused "need --world >= 2" --world 1 --fault-at 1
refused "need --world >= 2" --world 1 --stop-at 1
refused "only one of them" --world 2 --stop-at 1 --kill-at 1
refused "needs --backend cuda" --transport nccl
refused "restart-at needs" --restart-at 5 --calls 5
refused "restart-at needs" --world 2 --restart-at 3 --fault-at 3
refused "restart-at needs" --restart-at 1 --socket /tmp/x.sock
refused "restart-signal needs --restart-at" --restart-signal term
refused "kill|term" --restart-at 1 --restart-signal hup
refused "auto|ll|nccl" --transport xy
refused "local_topk 64 must be less than topk 64" --topk 64 --local-topk 64
# A group name dcpxd refuses: said before dcpxd and the ranks start (every
# join was refused, and the run printed the latencies of no calls).
refused "--group 'a b'" --group 'a b'
# An empty --socket: it connected to $DCPX_SOCKET's or the default dcpxd.
refused "--socket needs a path" --socket ''
refused "1..63 bytes" --group x123456789x123456789x123456789x123456789x123456789x123456789x123
# A --fault-rank with no fault to inject, or past the world, did nothing;
# a --daemon-log that cannot be opened left dcpxd's child only an exit
# status of 126; a socket path too long for sockaddr_un read as "no such
# socket".
refused "fault-rank needs a rank < world" --fault-rank 1
refused "fault-rank needs a rank < world" --world 2 --fault-rank 2 \
  --fault-at 1
refused "daemon-log /: Is a directory" --daemon-log /
# --device and --spread were ignored without a word on the host backend,
# and --device beside --spread.
refused "options of --backend cuda" --device 1
refused "options of --backend cuda" --spread
refused "give one of them" --backend cuda --device 0 --spread
refused "a socket path is at most" --socket "/tmp/$(printf '%0120d' 0)"
# A shape within dcpx's limits whose run needs more host memory than the
# machine has (about 260-271 GiB): refused before anything starts,
# instead of ranks that the OOM killer takes. Skipped on a machine with
# that much available.
avail=$(awk '/^MemAvailable:/ { print int($2 / 1048576) }' /proc/meminfo)
if [ -n "$avail" ] && [ "$avail" -lt 270 ]; then
  refused "GiB of host memory" --world 16 --rows 4096 \
    --local-len 131072
fi
# --calls within its limit whose latency table (8 bytes per rank and call,
# made before the first call) the machine cannot hold: about 524 GiB here.
if [ -n "$avail" ] && [ "$avail" -lt 500 ]; then
  refused "GiB of host memory" --world 16 --rows 1 --topk 8 --local-topk 4 \
    --local-len 64 --calls 4294967295
fi

# No dcpxd: its reason is shown, and no /tmp/dcpx-demo.* folder stays.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/demo-smoke-t.XXXXXX")
trap 'rm -f "$out"; rm -rf "$tmp"' EXIT
if TMPDIR=$tmp "$demo" --dcpxd /nonexistent/dcpxd >"$out" 2>&1 ||
    ! grep -q "cannot run /nonexistent/dcpxd" "$out" ||
    [ -n "$(ls -A "$tmp")" ]; then
  cat "$out"; ls -A "$tmp"
  echo "demo-smoke: FAIL: a dcpxd that cannot start" >&2
  exit 1
fi
# SIGTERM mid-run: the demo stops its ranks and dcpxd, removes its folder
# and dies of the signal.
TMPDIR=$tmp "$demo" --world 2 --rows 8 --local-len 4096 --calls 100000 \
  --quiet >"$out" 2>&1 &
pid=$!
sleep 1
kill -TERM "$pid"
st=0
wait "$pid" || st=$?
if [ "$st" -ne 143 ] || [ -n "$(ls -A "$tmp")" ]; then
  cat "$out"; ls -A "$tmp"
  echo "demo-smoke: FAIL: SIGTERM: exit $st" >&2
  exit 1
fi
# Its dcpxd killed mid-run (the host backend's calls do not need it): the
# ranks finish, every call is checked and exact, the death is reported
# and the exit status is 1. The demo used to reap dcpxd as if it were a
# rank: "exact: 0/N" and a report written while a rank still ran.
# dcpxd is killed once the group is ready (dcpxctl groups), while the
# 4,000 calls run.
ctl=${DCPXCTL:-tools/dcpxctl}
TMPDIR=$tmp "$demo" --world 2 --rows 4 --local-len 1024 --topk 64 \
  --local-topk 32 --calls 4000 --group smoke-kill >"$out" 2>&1 &
pid=$!
d=
for i in $(seq 300); do
  s=$(ls -d "$tmp"/dcpx-demo.*/dcpxd.sock 2>/dev/null || true)
  if [ -n "$s" ] && "$ctl" --socket "$s" groups 2>/dev/null |
      grep -q '^smoke-kill  *ready  *[0-9]*  *2/2'; then
    # the demo's child named dcpxd, from /proc (no procps needed)
    for f in /proc/[0-9]*/stat; do
      read -r p c x pp rest 2>/dev/null <"$f" || continue
      case "$c" in *dcpxd*) [ "$pp" = "$pid" ] && d=$p ;; esac
    done
    break
  fi
  sleep 0.05
done
[ -n "$d" ] && kill -KILL $d
st=0
wait "$pid" || st=$?
if [ -z "$d" ] || [ "$st" -ne 1 ] || ! grep -q "dcpxd was killed" "$out" ||
    ! grep -q "^exact: 4000/4000 calls" "$out" || [ -n "$(ls -A "$tmp")" ]; then
  cat "$out"; ls -A "$tmp"
  echo "demo-smoke: FAIL: dcpxd killed mid-run: exit $st" >&2
  exit 1
fi

# No dcpxd at the socket given: said, with the path, and exit 1.
st=0
"$demo" --socket "$tmp/none.sock" --world 2 --calls 2 >"$out" 2>&1 || st=$?
if [ "$st" -ne 1 ] ||
    ! grep -q "cannot connect to dcpxd at $tmp/none.sock (no such socket" \
      "$out"; then
  cat "$out"
  echo "demo-smoke: FAIL: a missing socket: exit $st" >&2
  exit 1
fi
# ... and no figures of calls and joins that never were: it printed
# "p50 0.0 ... max 0.0" and "join-to-ready: 0 us".
if ! grep -q "^call latency (push+merge, per rank, us): no call was made$" \
      "$out" || ! grep -q "^join-to-ready: none (0 of 2 ranks joined)$" "$out"
then
  cat "$out"
  echo "demo-smoke: FAIL: a missing socket: latency or join figures" >&2
  exit 1
fi

# An operator reset mid-run ends the demo's ranks (they do not recover
# from what they did not inject): the exact line counts the calls every
# rank completed before, not 0.
TMPDIR=$tmp "$demo" --world 2 --rows 4 --local-len 1024 --topk 64 \
  --local-topk 32 --calls 400000 --group smoke-reset >"$out" 2>&1 &
pid=$!
reset=
for i in $(seq 300); do
  s=$(ls -d "$tmp"/dcpx-demo.*/dcpxd.sock 2>/dev/null || true)
  if [ -n "$s" ] && "$ctl" --socket "$s" groups 2>/dev/null |
      grep -q '^smoke-reset  *ready'; then
    sleep 0.5
    "$ctl" --socket "$s" reset --group smoke-reset >/dev/null && reset=1
    break
  fi
  sleep 0.05
done
st=0
wait "$pid" || st=$?
n=$(sed -n 's/^exact: \([0-9]*\)\/\([0-9]*\) calls (the calls every rank completed.*/\1 \2/p' "$out")
if [ -z "$reset" ] || [ "$st" -ne 1 ] || [ -z "$n" ] ||
    [ "${n% *}" != "${n#* }" ] || [ "${n% *}" -lt 1 ]; then
  cat "$out"
  echo "demo-smoke: FAIL: an operator reset mid-run: exit $st, '$n'" >&2
  exit 1
fi
# The latencies are those of the calls made, not of the 400,000 asked
# for (most never made: p50 and p90 were 0.0).
if ! grep -q "^call latency .*: p50 [0-9.]* .* (of the calls made)$" "$out" ||
    grep -q "^call latency .*: p50 0\.0 " "$out"; then
  cat "$out"
  echo "demo-smoke: FAIL: an operator reset mid-run: latency figures" >&2
  exit 1
fi
echo "demo-smoke: ok"
