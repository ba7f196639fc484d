#!/bin/sh
# hidepid.sh - dcpxd says at start when /proc hides other processes from
# it (procfs mounted with hidepid=, as the unit's ProtectProc= does): it
# then cannot tell a dead rank of another uid (a zombie, a reused pid)
# from a live one after a restart (dcpxd_pid_live). Run as root only: dcpxd
# runs as nobody (setpriv) in a private mount namespace (unshare -m) with
# its own /proc mount (hidepid=invisible; its own superblock since Linux
# 5.8, so the machine's /proc is left alone). Skipped (77) without root,
# unshare, setpriv or a kernel that takes the mount. Also: no warning with
# /proc as it is.
set -u
dcpxd=${DCPXD:-daemon/dcpxd}
case $dcpxd in /*) ;; *) dcpxd=$PWD/$dcpxd ;; esac
if test "$(id -u)" != 0 || ! command -v unshare >/dev/null 2>&1 ||
    ! command -v setpriv >/dev/null 2>&1; then
  echo "SKIP: needs root, unshare and setpriv"; exit 77
fi
if ! unshare -m --propagation private sh -c \
    'mount -t proc -o hidepid=invisible proc /proc &&
     mount -t proc -o hidepid=0 proc /proc' 2>/dev/null; then
  echo "SKIP: cannot mount a private /proc with hidepid="; exit 77
fi
if ! setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$dcpxd"; then
  echo "SKIP: nobody cannot run $dcpxd (a folder above it is closed)"
  exit 77
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/dcpx-hidepid.XXXXXX")
chmod 755 "$d"
trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; cat "$d"/*.log 2>/dev/null; exit 1; }
mkdir -m 777 "$d/probe"
if ! setpriv --reuid=65534 --regid=65534 --clear-groups test -w "$d/probe"; then
  echo "SKIP: nobody cannot write in $d (a folder above it is closed)"
  exit 77
fi

# $1: "hide" or "plain". dcpxd runs until it says Ready (at most 10 s).
run() {
  mkdir -m 777 "$d/$1"
  # a /proc of its own either way (the machine's may hide pids already);
  # hidepid=0 is "off" on every kernel that has the option
  mount_cmd='mount -t proc -o hidepid=0 proc /proc'
  test "$1" = hide && mount_cmd='mount -t proc -o hidepid=invisible proc /proc'
  unshare -m --propagation private sh -c "$mount_cmd && exec setpriv --reuid=65534 \
    --regid=65534 --clear-groups $dcpxd --config= --socket $d/$1/s \
    --state-dir $d/$1/st" > "$d/$1.log" 2>&1 &
  pid=$!
  i=0
  # a log of each run's own: the second run's shell truncates a shared
  # one only once it runs, and the first run's Ready could be read first
  while ! grep -q Ready "$d/$1.log" && test $i -lt 100; do
    sleep 0.1; i=$((i + 1))
  done
  kill "$pid" 2>/dev/null
  wait "$pid"
  grep -q Ready "$d/$1.log" || fail "$1: dcpxd did not start"
}
run hide
grep -q "procfs hides other processes from dcpxd" "$d/hide.log" ||
  fail "no warning with /proc mounted hidepid=invisible"
run plain
grep -q "procfs hides" "$d/plain.log" && fail "a warning with /proc as it is"
echo "PASS: hidepid warned, plain /proc did not"
