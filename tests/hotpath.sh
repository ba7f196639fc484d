#!/bin/sh
# hotpath.sh - dcpx_push and dcpx_merge make no system call with the log
# off (tests/hotpath.c, which also checks that they allocate nothing):
# strace counts the system calls between the program's two markers. With
# DCPX_DEBUG=TRACE each call writes a line, so the same count must then
# be above zero: the check can tell. SKIP (77) without strace or ptrace.
set -u
builddir=${DCPX_BUILDDIR:-.}
prog=$builddir/tests/hotpath
command -v strace >/dev/null 2>&1 || { echo "SKIP: no strace"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
strace -f -o "$tmp/probe" true >/dev/null 2>&1 ||
  { echo "SKIP: strace cannot trace here"; exit 77; }

# LeakSanitizer cannot run under ptrace (an ASan build); the leak check
# is the other tests' job.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS

# System calls strictly between the markers.
between() {
  awk '/dcpx-hotpath-begin/ { on = 1; next }
       /dcpx-hotpath-end/ { on = 0 }
       on && !/^[0-9]* *\+\+\+|^[0-9]* *---/ { n++ }
       END { print n + 0 }' "$1"
}

env -u DCPX_DEBUG strace -f -o "$tmp/off" "$prog" || exit 1
n=$(between "$tmp/off")
grep -q dcpx-hotpath-end "$tmp/off" || { echo "hotpath: no markers"; exit 1; }
if [ "$n" -ne 0 ]; then
  echo "hotpath: $n system calls in 200 push+merge with the log off:"
  awk '/dcpx-hotpath-begin/,/dcpx-hotpath-end/' "$tmp/off" | head -20
  exit 1
fi
DCPX_DEBUG=TRACE strace -f -o "$tmp/trace" "$prog" 2>/dev/null || exit 1
t=$(between "$tmp/trace")
[ "$t" -gt 0 ] || { echo "hotpath: TRACE made no system call?"; exit 1; }
echo "hotpath: 0 system calls with the log off ($t with DCPX_DEBUG=TRACE)"
