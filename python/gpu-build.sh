#!/usr/bin/env bash
# python/gpu-build.sh - what the Python GPU tests load: a shared libdcpx
# with the CUDA backend and NCCL (linked to libnccl.so.2, which the GPU
# machine has in /usr/lib/x86_64-linux-gnu: 218 MB, too big to carry) and
# its dcpxd and dcpxctl, built here (CUDA at
# /usr/local/cuda) into build-pygpu/ (ignored by git; carry it to the GPU
# machine), with the shared libraries that machine lacks (protobuf-c,
# libuv, inih, json-c). scripts/gpu-build.sh's build is static only, which
# ctypes cannot load. Then, on the GPU machine: bash python/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
src=/tmp/dcpx-pygpu-src
bld=/tmp/dcpx-pygpu-build
rm -rf "$src" "$bld" && mkdir -p "$src" "$bld"
git ls-files -z --cached --others --exclude-standard |
  xargs -0 -I{} cp --parents {} "$src"
(cd "$src" && ./autogen.sh >/dev/null 2>&1)
cd "$bld"
"$src/configure" -q --with-cuda --with-nccl --disable-maintainer-mode
make -j"$(nproc)" libclient/libdcpx.la daemon/dcpxd tools/dcpxctl >/dev/null
out=$top/build-pygpu
rm -rf "$out" && mkdir -p "$out/lib"
cp -L libclient/.libs/libdcpx.so.0 "$out/lib/"
cp daemon/dcpxd tools/dcpxctl "$out/" # dcpxctl: test_cuda_nccl_refused
for l in libprotobuf-c.so.1 libuv.so.1 libinih.so.1 libjson-c.so.5; do
  cp -L "$(ldconfig -p | awk -v l="$l" '$1 == l { print $NF; exit }')" \
    "$out/lib/"
done
ls -la "$out" "$out/lib"
