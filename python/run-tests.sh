#!/bin/sh
# python/run-tests.sh - the Python package's pytest suite, run by make check
# from the build tree (TESTS in Makefile.am). It uses this build's shared
# libdcpx and dcpxd through a private daemon (tests/conftest.py). Exit 77
# (SKIP) when shared libraries are disabled or no python3 has pytest and
# numpy: apt-get install python3-pytest python3-numpy (scripts/deps.sh).
srcdir=${srcdir:-.}
build=$(pwd)
lib=${DCPX_LIBRARY:-$build/libclient/.libs/libdcpx.so.0}
if [ ! -f "$lib" ]; then
  echo "SKIP: no shared libdcpx at $lib (configured --disable-shared?)"
  exit 77
fi
# A sanitizer build's libdcpx cannot be loaded into an uninstrumented
# python3 (ASan must come first in the process); its C tests cover it.
if ldd "$lib" 2>/dev/null | grep -q 'lib[at]san\|libubsan'; then
  echo "SKIP: $lib is built with a sanitizer (ASan/UBSan/TSan):" \
    "not loadable from python3"
  exit 77
fi
py=
for c in ${PYTHON:-} python3 /usr/bin/python3; do
  command -v "$c" >/dev/null 2>&1 || continue
  if "$c" -c 'import pytest, numpy' >/dev/null 2>&1; then
    py=$c
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIP: no python3 with pytest and numpy" \
    "(apt-get install python3-pytest python3-numpy, or bash scripts/deps.sh)"
  exit 77
fi
DCPX_LIBRARY=$lib
DCPXD=${DCPXD:-$build/daemon/dcpxd}
PYTHONPATH=$srcdir/python${PYTHONPATH:+:$PYTHONPATH}
PYTHONDONTWRITEBYTECODE=1
export DCPX_LIBRARY DCPXD PYTHONPATH PYTHONDONTWRITEBYTECODE
# -p no:cacheprovider: distcheck's source tree is read-only. nice: make
# check -j runs this beside the timing-sensitive health tests; let those
# have the CPU first (these tests' waits are long).
exec nice -n 10 "$py" -m pytest -p no:cacheprovider -q -rs \
  "$srcdir/python/tests" "$@"
