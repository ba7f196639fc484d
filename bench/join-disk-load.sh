#!/bin/sh
# join-disk-load.sh - a group's formation (bench_health --what join) alone,
# then beside a disk load: dd writing 400 MB files with conv=fsync, over
# and over, in the folder dcpxd's state dir lies in (TMPDIR, as
# tests/health_harness.h makes it). dcpxd saves its groups file in its
# event loop at every formation, so a slow disk there is every client's
# wait. Run from the build folder:
#   sh ../bench/join-disk-load.sh [REPS]   (default 300)
# WHAT=detection (or kill, reset) times that bench_health mode instead:
# dcpxd stores a timeout's wait records (fdatasync) as it aborts.
set -eu
reps=${1:-300}
what=${WHAT:-join}
dir=${TMPDIR:-/tmp}
load="$dir/join-disk-load.$$"
bench=${DCPX_BUILDDIR:-.}/bench/bench_health
export DCPXD="${DCPXD:-${DCPX_BUILDDIR:-.}/daemon/dcpxd}"
sync # an earlier run's writeback is a disk load too
sleep 2
echo "## alone"
"$bench" --what "$what" --reps "$reps"
# the load in a process group of its own (setsid), so that the end kills
# the dd in flight too, not only its loop: an orphaned dd went on writing
# into the next run's "alone" half
setsid sh -c 'while :; do dd if=/dev/zero of="$1" bs=1M count=400 \
  conv=fsync 2>/dev/null || exit 0; done' sh "$load" &
pid=$!
trap 'kill -- -$pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$load"' EXIT
sleep 1
echo "## beside dd conv=fsync in $dir"
"$bench" --what "$what" --reps "$reps"
