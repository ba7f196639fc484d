#!/bin/sh
# units.sh - the installable service (issue 15): the units that make
# generates from systemd/*.in start this build's programs ($(sbindir),
# $(bindir)) with nothing left unsubstituted; dcpxd runs as dcpx with the
# NVIDIA device nodes allowed, its socket is root:dcpx 0660; the sysusers.d
# file creates the user and group dcpx (systemd-sysusers --root, into a
# scratch directory); and systemd-analyze security --offline=true scores
# dcpxd.service and dcpx-metrics.service <= 2.0 (--threshold=20). The
# systemd tools are optional: without them those parts are skipped (said).
set -u
b=${DCPX_BUILDDIR:-.}
s=${DCPX_SRCDIR:-.}
fail() { echo "FAIL: $*"; exit 1; }
svc=$b/systemd/dcpxd.service
met=$b/systemd/dcpx-metrics.service
sock=$s/systemd/dcpxd.socket
users=$s/systemd/sysusers.d/dcpx.conf
for f in "$svc" "$met" "$sock" "$users"; do
  test -f "$f" || fail "$f missing"
done

grep -n '@[a-zA-Z_]*@' "$svc" "$met" && fail "unsubstituted @...@"
if test -n "${DCPX_SBINDIR:-}"; then
  grep -qx "ExecStart=$DCPX_SBINDIR/dcpxd" "$svc" ||
    fail "dcpxd.service: ExecStart is not $DCPX_SBINDIR/dcpxd"
  grep -q "^ExecStart=$DCPX_BINDIR/dcpxctl " "$met" ||
    fail "dcpx-metrics.service: ExecStart is not $DCPX_BINDIR/dcpxctl"
fi
for l in User=dcpx Group=dcpx 'SupplementaryGroups=video render' \
    DevicePolicy=closed 'DeviceAllow=/dev/nvidiactl rw' \
    'DeviceAllow=char-nvidia-frontend rw' 'DeviceAllow=char-nvidia-uvm rw' \
    StateDirectory=dcpx RuntimeDirectory=dcpx; do
  grep -qx "$l" "$svc" || fail "dcpxd.service lacks $l"
done
grep -qx 'MemoryDenyWriteExecute=yes' "$svc" &&
  fail "MemoryDenyWriteExecute=yes would break the CUDA driver"
grep -q '^ProtectProc=' "$svc" &&
  fail "ProtectProc= hides the ranks' /proc/PID/stat (dcpxd_pid_live)"
for l in SocketGroup=dcpx SocketMode=0660; do
  grep -qx "$l" "$sock" || fail "dcpxd.socket lacks $l"
done
# Every unit names its man page (systemctl help UNIT), one make install
# puts in place.
for u in "$svc" "$sock" "$met" "$s/systemd/dcpx-metrics.timer"; do
  doc=$(sed -n 's/^Documentation=//p' "$u")
  test -n "$doc" || fail "$(basename "$u") has no Documentation="
  for m in $doc; do
    p=$(echo "$m" | sed -n 's/^man:\([a-z.]*\)(\([1-8]\))$/\1.\2/p')
    test -n "$p" && test -f "$s/man/$p" ||
      fail "$(basename "$u"): Documentation=$m is no man page of man/"
  done
done

d=$(mktemp -d "${TMPDIR:-/tmp}/dcpx-units.XXXXXX")
trap 'rm -rf "$d"' EXIT
if command -v systemd-sysusers >/dev/null 2>&1; then
  mkdir -p "$d/root/etc"
  systemd-sysusers --root="$d/root" - < "$users" || fail "systemd-sysusers"
  grep -q '^dcpx:x:[0-9]*:[0-9]*:' "$d/root/etc/passwd" || fail "no user dcpx"
  grep -q '^dcpx:x:[0-9]*:' "$d/root/etc/group" || fail "no group dcpx"
  uid=$(awk -F: '$1 == "dcpx" { print $3 }' "$d/root/etc/passwd")
  gid=$(awk -F: '$1 == "dcpx" { print $3 }' "$d/root/etc/group")
  echo "sysusers.d: user dcpx ($uid), group dcpx ($gid)"
  test "$uid" -lt 1000 || fail "dcpx is not a system user (uid $uid)"
else
  echo "sysusers.d: skipped (no systemd-sysusers)"
fi

if command -v systemd-analyze >/dev/null 2>&1 &&
    systemd-analyze security --help 2>&1 | grep -q -- '--offline'; then
  for u in "$svc" "$met"; do
    systemd-analyze security --offline=true --threshold=20 "$u" > "$d/sec" 2>&1
    rc=$?
    grep 'Overall exposure' "$d/sec"
    test $rc -eq 0 || { cat "$d/sec"; fail "$(basename "$u") scores over 2.0"; }
  done
else
  echo "systemd-analyze security --offline: skipped (not supported here)"
fi
echo "units: ok"
