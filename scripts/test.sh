#!/usr/bin/env bash
# test.sh - the README's test command: dependencies, then
# ./autogen.sh && ./configure && make check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
./autogen.sh && ./configure && make -j"$(nproc)" check
