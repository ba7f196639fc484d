#!/bin/sh
# soak.sh - 60 s of bench/soak in make check (issue 12): 4 gangs of 4
# client processes join a private dcpxd, run exact calls (each checked
# against dcpx_ref_call), query and leave, over and over; a rank is killed
# with SIGKILL mid-call every 10 s (5 kills) and replaced, and dcpxd is
# stopped and started again every 20 s (SIGTERM at 20 s, SIGKILL at 40 s)
# while the groups run and reattach. It fails if a completed call
# is not exact, a call fails without a kill in its gang, a group does not
# recover or a rank does not reattach within 30 s, dcpxd's RSS grows by
# more than 2 MiB after the warm-up (plus ASan's capped quarantine in a
# sanitizer build), dcpxd's fds pass their bound or are more at the end
# than at the start, or no kill or no restart happened. bench/RESULTS.md
# has the 10-minute run of 64 processes.
exec "${DCPX_BUILDDIR:-.}/bench/soak" --seconds=60 --gangs=4 --world=4 \
  --calls=8 --kill-every=10 --restart-every=20 --report=10 \
  --rss-growth-kib=2048
