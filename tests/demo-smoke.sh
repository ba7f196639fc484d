#!/bin/sh
# demo-smoke.sh - the main job in miniature under make check: W rank
# processes through a private dcpxd, every call checked against the
# reference; then the same with a stalled rank (fault injection through
# dcpxctl) and with a rank killed mid-call and replaced. Each run must end
# with every checked call exact (dcpx-demo's exit status).
set -eu
demo=${DEMO:-tools/dcpx-demo}
"$demo" --world 4 --rows 4 --local-len 3000 --calls 8 --quiet
"$demo" --world 3 --rows 4 --local-len 2048 --calls 8 --fault-at 3 --quiet
"$demo" --world 5 --rows 3 --local-len 2048 --calls 8 --kill-at 4 \
  --fault-rank 2 --quiet
