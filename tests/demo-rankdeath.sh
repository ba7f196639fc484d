#!/bin/sh
# demo-rankdeath.sh - a dcpx-demo rank killed by a signal (not dcpx-demo's
# own --kill-at, which replaces it) while its peer waits at the ranks'
# barrier: the run must still end (the parent breaks the barrier), not
# leave the peer waiting forever. Rank 1 is stopped, and continued again,
# until rank 0 is seen asleep in futex(2) (the barrier) twice 0.1 s apart;
# then rank 1 is killed. SKIP (77) without pgrep or /proc/PID/wchan, or
# when rank 0 was never seen at the barrier.
#
# Every wait here is bounded: a dcpx-demo that does not end is a FAIL with
# what its processes were waiting in, never a hung test.
set -u
demo=${DEMO:-tools/dcpx-demo}
out=$(mktemp "${TMPDIR:-/tmp}/demo-rankdeath.XXXXXX")
trap 'rm -f "$out"' EXIT
command -v pgrep >/dev/null 2>&1 || {
  echo "demo-rankdeath: SKIP: no pgrep"
  exit 77
}

wchan() { cat "/proc/$1/wchan" 2>/dev/null; }

# Ends run $pid within $1 tenths of a second: 0 when it ended by itself,
# 1 when it had to be killed (its wait channels are shown first).
reap() {
  i=0
  while kill -0 "$pid" 2>/dev/null && [ "$i" -lt "$1" ]; do
    sleep 0.1
    i=$((i + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    for p in $pid $(pgrep -P "$pid") $(pgrep -P "$top"); do
      echo "demo-rankdeath: pid $p ($(cat "/proc/$p/comm" 2>/dev/null))" \
        "waits in $(wchan "$p")" >&2
    done
    for p in $(pgrep -P "$top") $(pgrep -P "$pid") $top $pid; do
      kill -KILL "$p" 2>/dev/null
    done
    wait "$pid"
    return 1
  fi
  wait "$pid"
  return 0
}

seen=0
try=0
while [ "$try" -lt 6 ] && [ "$seen" -lt 2 ]; do
  try=$((try + 1))
  "$demo" --world 2 --rows 4 --calls 1000000 --topk 64 --local-topk 16 \
    --local-len 256 --quiet >"$out" 2>&1 &
  pid=$!
  sleep 1
  # (a libtool wrapper may run the program as its child)
  top=$pid
  ranks=$(pgrep -P "$top" -x dcpx-demo | sort -n)
  while [ -n "$ranks" ] && [ "$(echo "$ranks" | wc -l)" -eq 1 ]; do
    top=$ranks
    ranks=$(pgrep -P "$top" -x dcpx-demo | sort -n)
  done
  r0=$(echo "$ranks" | sed -n 1p)
  r1=$(echo "$ranks" | sed -n 2p)
  if [ -z "$r0" ] || [ -z "$r1" ] || [ ! -r "/proc/$r0/wchan" ]; then
    kill -TERM "$top" 2>/dev/null
    reap 300 || { cat "$out"; exit 1; }
    [ "$try" -lt 3 ] && continue
    echo "demo-rankdeath: SKIP: no ranks, or no /proc/PID/wchan"
    exit 77
  fi
  # Rank 1 stopped mid-call leaves rank 0 spinning in its merge (and a
  # stop of over 5 s would fail that call): continue it and stop it again
  # at another point of its call, up to 40 times.
  at_barrier=0
  probe=0
  while [ "$probe" -lt 40 ] && [ "$at_barrier" = 0 ]; do
    probe=$((probe + 1))
    kill -STOP "$r1"
    sleep 0.1
    case $(wchan "$r0") in
    *futex*)
      sleep 0.1
      case $(wchan "$r0") in *futex*) at_barrier=1 ;; esac
      ;;
    esac
    [ "$at_barrier" = 0 ] && kill -CONT "$r1"
    sleep "0.0$((probe % 10))"
  done
  kill -KILL "$r1"
  if [ "$at_barrier" = 1 ]; then
    seen=$((seen + 1))
    if ! reap 150; then
      cat "$out"
      echo "demo-rankdeath: FAIL: rank 1 was killed while rank 0 waited at" \
        "the barrier, and dcpx-demo had not ended 15 s later" >&2
      exit 1
    fi
  else
    kill -TERM "$top" 2>/dev/null
    if ! reap 300; then
      cat "$out"
      echo "demo-rankdeath: FAIL: dcpx-demo did not end 30 s after" \
        "SIGTERM" >&2
      exit 1
    fi
  fi
done
if [ "$seen" = 0 ]; then
  echo "demo-rankdeath: SKIP: rank 0 never waited at the barrier"
  exit 77
fi
echo "demo-rankdeath: ok ($seen runs ended after a rank's death at the" \
  "barrier, in $try tries)"
