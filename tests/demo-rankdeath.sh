#!/bin/sh
# demo-rankdeath.sh - a dcpx-demo rank killed by a signal (not dcpx-demo's
# own --kill-at, which replaces it) while its peer waits at the ranks'
# barrier: the run must still end (the parent breaks the barrier), not
# leave the peer waiting forever. Rank 1 is stopped until rank 0 sits in
# a futex wait (the barrier), then killed. SKIP (77) without
# /proc/PID/wchan, or when rank 0 never waited at the barrier.
set -u
demo=${DEMO:-tools/dcpx-demo}
out=$(mktemp "${TMPDIR:-/tmp}/demo-rankdeath.XXXXXX")
trap 'rm -f "$out"' EXIT
seen=0
for try in 1 2 3 4 5 6 7 8 9 10 11 12; do
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
    wait "$pid"
    [ "$try" -lt 3 ] && continue
    echo "demo-rankdeath: SKIP: no ranks, or no /proc/PID/wchan"
    exit 77
  fi
  kill -STOP "$r1"
  sleep 0.3
  case $(cat "/proc/$r0/wchan" 2>/dev/null) in
  *futex*) at_barrier=1 ;;
  *) at_barrier=0 ;;
  esac
  kill -KILL "$r1"
  if [ "$at_barrier" = 1 ]; then
    seen=$((seen + 1))
    i=0
    while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 150 ]; do
      sleep 0.1
      i=$((i + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$top"
      wait "$pid"
      cat "$out"
      echo "demo-rankdeath: FAIL: rank 1 was killed while rank 0 waited at" \
        "the barrier, and dcpx-demo had not ended 15 s later" >&2
      exit 1
    fi
  else
    kill -TERM "$top" 2>/dev/null
  fi
  wait "$pid"
  [ "$seen" -ge 2 ] && break
done
if [ "$seen" = 0 ]; then
  echo "demo-rankdeath: SKIP: rank 0 never waited at the barrier"
  exit 77
fi
echo "demo-rankdeath: ok ($seen runs ended after a rank's death at the barrier)"
