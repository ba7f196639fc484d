#!/bin/sh
# log-stream.sh - dcpxd's priority prefixes ("<3>" and so on) only when
# stderr is the journal: $JOURNAL_STREAM names stderr's DEV:INO, as systemd
# sets it (systemd.exec(5)); plain text on anything else, including a
# stderr that is not the stream $JOURNAL_STREAM names (a child of a
# service, a redirect). journald cannot be asked here, so "the journal" is
# a file whose DEV:INO goes in $JOURNAL_STREAM: dcpxd sees the same thing.
#
# dcpxd is run with a bad option (--poll-ms=99), which it reports as an
# error and exits 2, and once started for real (an info line, "Ready").
set -u
dcpxd=${DCPXD:-daemon/dcpxd}
d=$(mktemp -d "${TMPDIR:-/tmp}/dcpx-log.XXXXXX")
pid=
trap 'test -n "$pid" && kill "$pid" 2>/dev/null; rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; for f in "$d"/*.err; do echo "--- $f"; cat "$f"; done; exit 1; }

# $1: the stderr file; $2: JOURNAL_STREAM ("-": unset).
bad_option() {
  : > "$1"
  if test "x$2" = x-; then
    env -u JOURNAL_STREAM "$dcpxd" --config= --poll-ms=99 2>> "$1"
  else
    JOURNAL_STREAM=$2 "$dcpxd" --config= --poll-ms=99 2>> "$1"
  fi
  rc=$?
  test $rc -eq 2 || fail "dcpxd --poll-ms=99 exited $rc, not 2"
}
devino() { stat -c '%d:%i' "$1"; }

# 1. No $JOURNAL_STREAM: plain text.
bad_option "$d/plain.err" -
grep -q 'poll' "$d/plain.err" || fail "no message"
grep -q '^<[0-7]>' "$d/plain.err" && fail "a priority prefix without the journal"
grep -q '^error: ' "$d/plain.err" || fail "the error is not marked 'error: '"

# 2. $JOURNAL_STREAM names stderr: every line has its prefix.
: > "$d/journal.err"
bad_option "$d/journal.err" "$(devino "$d/journal.err")"
grep -q '^<3>.*poll' "$d/journal.err" || fail "no <3> with stderr the journal"
grep -v -q '^<[0-7]>' "$d/journal.err" && fail "a line without a prefix"

# 3. $JOURNAL_STREAM names another file (stderr was redirected): plain.
: > "$d/other"
bad_option "$d/redirected.err" "$(devino "$d/other")"
grep -q '^<[0-7]>' "$d/redirected.err" && fail "a prefix on a redirected stderr"

# 4. Garbage in $JOURNAL_STREAM: plain.
bad_option "$d/garbage.err" "x:y"
grep -q '^<[0-7]>' "$d/garbage.err" && fail "a prefix with JOURNAL_STREAM=x:y"
bad_option "$d/empty.err" ""
grep -q '^<[0-7]>' "$d/empty.err" && fail "a prefix with JOURNAL_STREAM empty"

# 5. A running daemon: info lines, "<6>" in the journal, plain otherwise.
for mode in journal plain; do
  f="$d/run-$mode.err"
  : > "$f"
  if test $mode = journal; then js=$(devino "$f"); else js=; fi
  JOURNAL_STREAM=$js "$dcpxd" --config= --socket="$d/s-$mode.sock" \
    --state-dir="$d/state-$mode" 2>> "$f" &
  pid=$!
  i=0
  until grep -q 'Ready' "$f"; do
    i=$((i + 1))
    test $i -le 200 || fail "dcpxd ($mode) not ready in 10 s"
    kill -0 $pid 2>/dev/null || fail "dcpxd ($mode) exited"
    sleep 0.05
  done
  kill -TERM $pid
  wait $pid || fail "dcpxd ($mode) exited $? on SIGTERM"
  pid=
  if test $mode = journal; then
    grep -q '^<6>Ready$' "$f" || fail "no '<6>Ready' in the journal"
    grep -v -q '^<[0-7]>' "$f" && fail "a journal line without a prefix"
  else
    grep -q '^Ready$' "$f" || fail "no plain 'Ready'"
    grep -q '^<[0-7]>' "$f" && fail "a prefix on a plain stderr"
  fi
done
# --help and --version whose text cannot be written (standard output on
# a full disk) fail with an error line: they exited 0 with no text.
for opt in --help --version; do
  "$dcpxd" $opt > /dev/full 2> "$d/full.err"
  rc=$?
  test $rc -eq 1 || fail "dcpxd $opt > /dev/full exited $rc, not 1"
  grep -q '^error: Cannot write standard output' "$d/full.err" ||
    fail "dcpxd $opt > /dev/full: no error line"
done
# A socket path under a file (ENOTDIR; EACCES for a folder dcpxd may not
# search) stops dcpxd with the reason: it said only "startup failed".
: > "$d/afile"
"$dcpxd" --config= --socket="$d/afile/s.sock" --state-dir="$d/st-nd" \
  2> "$d/nd.err"
rc=$?
test $rc -eq 1 || fail "dcpxd --socket=FILE/s.sock exited $rc, not 1"
grep -q "Cannot use socket path $d/afile/s.sock: Not a directory" \
  "$d/nd.err" || fail "dcpxd --socket=FILE/s.sock: no reason"
echo "log-stream: prefixes only on the journal stream"
