#!/usr/bin/env bash
# demo.sh - the README's main job: dependencies, build, then dcpx-demo
# (a private dcpxd and W=8 rank processes, every call verified exact).
# Arguments go to tools/dcpx-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if [ ! -x tools/dcpx-demo ] || [ ! -x daemon/dcpxd ]; then
  [ -x configure ] || ./autogen.sh
  [ -f Makefile ] || ./configure
fi
make -j"$(nproc)" >/dev/null
exec tools/dcpx-demo "$@"
