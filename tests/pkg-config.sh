#!/bin/sh
# pkg-config.sh - the dcpx.pc of this build (issue 15): it is valid, its
# Requires.private names libprotobuf-c (what libdcpx links; libuv is
# dcpxd's alone), so that pkg-config --static --libs dcpx gives a static
# link all it needs, and a program linked that way against this build's
# libdcpx.a (where the build makes one) links and runs. The last step also
# checks that the same link without the private flags fails, so that the
# test would see them missing.
set -u
: "${PKG_CONFIG:=pkg-config}" "${CC:=cc}"
b=${DCPX_BUILDDIR:-.}
s=${DCPX_SRCDIR:-.}
command -v "$PKG_CONFIG" >/dev/null 2>&1 || { echo "SKIP: no pkg-config"; exit 77; }
PKG_CONFIG_PATH=$b${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export PKG_CONFIG_PATH
fail() { echo "FAIL: $*"; exit 1; }

"$PKG_CONFIG" --validate dcpx || fail "dcpx.pc does not validate"
req=$("$PKG_CONFIG" --print-requires-private dcpx) ||
  fail "pkg-config --print-requires-private dcpx"
echo "Requires.private: $req"
echo "$req" | grep -q '^libprotobuf-c' || fail "no libprotobuf-c in Requires.private"
echo "$req" | grep -q 'libuv' && fail "libuv in Requires.private: libdcpx does not link it"

shared=$("$PKG_CONFIG" --libs dcpx) || fail "pkg-config --libs dcpx"
static=$("$PKG_CONFIG" --static --libs dcpx) || fail "pkg-config --static --libs dcpx"
echo "--libs:          $shared"
echo "--static --libs: $static"
case " $shared " in *" -ldcpx "*) ;; *) fail "no -ldcpx in --libs" ;; esac
case " $shared " in *" -lprotobuf-c "*) fail "-lprotobuf-c in the shared --libs" ;; esac
for f in $("$PKG_CONFIG" --static --libs libprotobuf-c); do
  case " $static " in *" $f "*) ;; *) fail "--static --libs lacks $f" ;; esac
done

# A static link: libdcpx.a of this build, then the --static flags less
# dcpx.pc's own -L and -ldcpx (its libdir is the install's, not this tree).
a=$b/libclient/.libs/libdcpx.a
if ! test -f "$a"; then
  echo "pkg-config: flags right; no libdcpx.a (--disable-static), link not tried"
  exit 0
fi
libdir=$("$PKG_CONFIG" --variable=libdir dcpx)
extra=
for f in $static; do
  case $f in -ldcpx | "-L$libdir") ;; *) extra="$extra $f" ;; esac
done
d=$(mktemp -d "${TMPDIR:-/tmp}/dcpx-pc.XXXXXX")
trap 'rm -rf "$d"' EXIT
cat > "$d/t.c" <<'EOC'
#include <stdio.h>
#include <dcpx.h>
int main(void) {
  dcpx_client *c = NULL;
  /* dcpx_connect pulls in the protobuf-c messages. */
  int r = dcpx_connect("/nonexistent/dcpx.sock", &c);
  printf("dcpx %s: connect to nowhere: %s\n", dcpx_version(), dcpx_strerror(r));
  return r < 0 && c == NULL ? 0 : 1;
}
EOC
inc="-I$b/include -I$s/include"
# shellcheck disable=SC2086
if $CC $DCPX_CFLAGS $inc -o "$d/t-bare" "$d/t.c" "$a" $DCPX_LDFLAGS > "$d/bare.log" 2>&1; then
  fail "linked without the private flags: the test cannot tell"
fi
# shellcheck disable=SC2086
$CC $DCPX_CFLAGS $inc -o "$d/t" "$d/t.c" "$a" $extra $DCPX_LDFLAGS ||
  fail "static link with: $extra"
"$d/t" || fail "the statically linked program failed"
echo "pkg-config: static link of libdcpx.a with$extra: ok"
