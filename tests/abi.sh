#!/bin/sh
# abi.sh - the ABI of the shared libdcpx (make check): the dynamic symbols
# it defines are exactly the DCPX_API functions of include/dcpx.h, each at
# symbol version DCPX_1 (libclient/libdcpx.sym), and nothing else: no
# dcpx__ internal, no symbol of the static CUDA runtime, no unversioned
# symbol. SKIP (77) without a shared libdcpx (configure --disable-shared)
# or without an nm that prints symbol versions (binutils >= 2.35).
set -u
srcdir=${DCPX_SRCDIR:-${srcdir:-.}}
builddir=${DCPX_BUILDDIR:-.}
so=$builddir/libclient/.libs/libdcpx.so
hdr=$srcdir/include/dcpx.h
[ -e "$so" ] || { echo "SKIP: no $so (shared library disabled)"; exit 77; }
nm -D --defined-only --with-symbol-versions "$so" >/dev/null 2>&1 ||
  { echo "SKIP: nm cannot print symbol versions"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

sed -n 's/^DCPX_API.*[ *]\(dcpx_[a-z0-9_]*\)(.*/\1@@DCPX_1/p' "$hdr" |
  sort > "$tmp/want"
[ -s "$tmp/want" ] || { echo "abi: no DCPX_API functions in $hdr"; exit 1; }
# Defined dynamic symbols, but the version node itself (an absolute
# symbol named DCPX_1).
nm -D --defined-only --with-symbol-versions "$so" |
  awk '$2 != "A" { print $3 }' | sort > "$tmp/have"
if ! cmp -s "$tmp/want" "$tmp/have"; then
  echo "abi: $so exports other symbols than the API v1 of $hdr"
  echo "(< documented only, > exported only)"
  diff "$tmp/want" "$tmp/have" | grep '^[<>]'
  exit 1
fi
nm -D --defined-only "$so" | awk '$2 == "A" { print $3 }' | grep -qx DCPX_1 ||
  { echo "abi: no version node DCPX_1 in $so"; exit 1; }
# Test-only kernels (tests/gpu/gpu_tools.cu) are not in the library at
# all, static archive included.
a=$builddir/libclient/.libs/libdcpx.a
for lib in "$so" "$a"; do
  [ -e "$lib" ] || continue
  if nm "$lib" 2>/dev/null | grep -q 'dcpx_k_pingpong\|dcpx_k_gate'; then
    echo "abi: $lib carries the GPU tests' kernels"
    exit 1
  fi
done
echo "abi: $(wc -l < "$tmp/want") functions, all at DCPX_1, nothing else"
