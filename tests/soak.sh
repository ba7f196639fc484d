#!/bin/sh
# soak.sh - 15 s of bench/soak in make check (issue 12): 4 gangs of 2
# clients join, run exact calls, query and leave a private dcpxd over and
# over; it fails if any operation fails or is not exact, if dcpxd's RSS
# grows by more than 2 MiB after the warm-up (plus ASan's capped
# quarantine in a sanitizer build), or if dcpxd holds more descriptors at
# the end than at the start. bench/RESULTS.md has a 60 s run.
exec "${DCPX_BUILDDIR:-.}/bench/soak" --seconds=15 --gangs=4 --world=2 \
  --rss-growth-kib=2048
