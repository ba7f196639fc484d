#!/usr/bin/env bash
# deps.sh - install dcpx's build dependencies (Debian 12 package names).
# Does nothing when they are all present; needs root (or sudo) otherwise.
set -euo pipefail

pkgs=(build-essential autoconf automake libtool pkg-config libuv1-dev
      libprotobuf-c-dev protobuf-c-compiler check libsystemd-dev zlib1g-dev
      libinih-dev  # dcpxd's config file parser
      libjson-c-dev  # dcpxctl --json
      python3 python3-pytest python3-numpy  # python3-*: python/ tests
      python3-prometheus-client  # tests/check_metrics (OpenMetrics parser)
      mandoc  # tests/man-lint.sh (mandoc -T lint of man/*)
      clang libclang-rt-14-dev)  # make fuzz (libFuzzer)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
    missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update
$sudo apt-get install -y --no-install-recommends "${missing[@]}"
