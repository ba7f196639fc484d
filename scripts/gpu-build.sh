#!/usr/bin/env bash
# gpu-build.sh - the build the GPU machine runs (docs/GPU.md's recipe):
# static libdcpx, libuv and protobuf-c linked statically, kernels for sm_90,
# out of tree in build-gpu/ (ignored by git; carry it to the GPU machine).
# The source is a clean export of the working tree, so an in-tree build
# here does not stop the VPATH build.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
src=/tmp/dcpx-gpu-src
rm -rf "$src" && mkdir -p "$src"
git ls-files -z --cached --others --exclude-standard |
  xargs -0 -I{} cp --parents {} "$src"
(cd "$src" && ./autogen.sh >/dev/null 2>&1)
rm -rf "$top/build-gpu" && mkdir -p "$top/build-gpu"
cd "$top/build-gpu"
"$src/configure" -q --disable-shared --enable-static-deps --with-cuda \
  --disable-maintainer-mode
make -j"$(nproc)" >/dev/null
# Objects and static libraries are linked in already: the GPU machine
# needs none of them, and the carried folder must stay under 64 MiB.
find . \( -name '*.o' -o -name '*.a' -o -name '*.lo' \) -delete
rm -rf bench # host benches: gpu-run.sh runs none of them
ls -la daemon/dcpxd tools/dcpx-demo tools/dcpxctl tests/gpu/test_kernels \
  tests/gpu/bench_kernels tests/gpu/test_nccl tests/gpu/pingpong \
  tests/gpu/roofline \
  examples/indexer_push
