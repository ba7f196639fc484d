#!/bin/sh
# demo-smoke.sh - the main job in miniature under make check: W rank
# processes through a private dcpxd, every call checked against the
# reference; then the same with a stalled rank (fault injection through
# dcpxctl), with a stall in the last call (the recovery is the last thing
# the counters see), and with a rank killed mid-call and replaced. Each
# run must end with every checked call exact and every rank's call
# counters (dcpx_health: calls, rows, rescue_rows, failed_calls) equal to
# its own tally of its calls: dcpx-demo's exit status, and its
# `exact:` and `counters: ok` lines (so a check that stopped running
# fails too). First, bad numeric options must be refused.
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
bad --local-len 0x

run --world 4 --rows 4 --local-len 3000 --calls 8
run --world 3 --rows 4 --local-len 2048 --calls 8 --fault-at 3
run --world 2 --rows 3 --local-len 2048 --calls 4 --fault-at 3 --fault-rank 0
run --world 5 --rows 3 --local-len 2048 --calls 8 --kill-at 4 --fault-rank 2
