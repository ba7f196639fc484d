#!/bin/sh
# man-lint.sh - the man pages (man/*) under make check: each one renders
# without a warning (mandoc -T lint when mandoc is installed, else groff
# -ww), and every option of dcpxd --help, every option of every dcpxctl
# COMMAND --help, every config key, every public function and every error
# code of include/dcpx.h is documented. SKIP (77) with neither mandoc nor
# groff (apt-get install mandoc, or bash scripts/deps.sh).
set -u
srcdir=${srcdir:-.}
man=$srcdir/man
dcpxd=${DCPXD:-daemon/dcpxd}
dcpxctl=${DCPXCTL:-tools/dcpxctl}
pages="dcpxd.8 dcpxctl.1 dcpxd.conf.5 dcpx.3"
fail=0
bad() { echo "man-lint: $*"; fail=1; }

if command -v mandoc >/dev/null 2>&1; then
  for p in $pages; do
    out=$(mandoc -T lint -W warning "$man/$p" 2>&1) || bad "$p: mandoc exit $?"
    [ -z "$out" ] || bad "$p: $out"
  done
elif command -v groff >/dev/null 2>&1; then
  for p in $pages; do
    out=$(groff -man -ww -z "$man/$p" 2>&1)
    [ -z "$out" ] || bad "$p: $out"
  done
else
  echo "SKIP: neither mandoc nor groff (apt-get install mandoc)"
  exit 77
fi

# The page's text with roff's \- as -, for the coverage checks.
text() { sed 's/\\-/-/g; s/\\f[BIRP]//g' "$man/$1"; }
has() { text "$1" | grep -q -e "$2" || bad "$1 does not document $2"; }

# dcpxd: every --option of its --help, in dcpxd.8; every setting (not
# config/help/version) as a key in dcpxd.conf.5.
opts=$("$dcpxd" --help | grep -o -e '--[a-z][a-z-]*' | sort -u)
[ -n "$opts" ] || bad "no options in $dcpxd --help"
for o in $opts; do
  has dcpxd.8 "$o"
  case $o in --config|--help|--version) continue ;; esac
  has dcpxd.conf.5 "^\.BI ${o#--} "
done
for k in 0 1 2; do has dcpxd.8 "^\.B $k$"; done

# dcpxctl: every command's options, and the check exit codes.
for c in groups health stats records reset fault check; do
  "$dcpxctl" "$c" --help >/dev/null || bad "dcpxctl $c --help failed"
  has dcpxctl.1 "^\.B[IR]* \"\{0,1\}$c"
  for o in $("$dcpxctl" "$c" --help | grep -o -e '--[a-z][a-z-]*' | sort -u); do
    has dcpxctl.1 "$o"
  done
done
for o in $("$dcpxctl" --help | grep -o -e '--[a-z][a-z-]*' | sort -u); do
  has dcpxctl.1 "$o"
done
for k in 0 1 2 3 4 5; do has dcpxctl.1 "^\.B $k$"; done
has dcpxctl.1 'WARNING'
has dcpxctl.1 'UNKNOWN'

# dcpx.3: every DCPX_API function and every error code of dcpx.h.
hdr=$srcdir/include/dcpx.h
for f in $(sed -n 's/^DCPX_API.*[ *]\(dcpx_[a-z0-9_]*\)(.*/\1/p' "$hdr"); do
  has dcpx.3 "$f"
done
for e in $(sed -n 's/^ *X(\(DCPX_E_[A-Z]*\),.*/\1/p' "$hdr"); do
  has dcpx.3 "$e"
done
# ... every struct kind of dcpx_struct_size, and no section twice in a
# row (mandoc does not warn about it).
for k in $(sed -n 's/^#define \(DCPX_STRUCT_[A-Z_]*\) .*/\1/p' "$hdr"); do
  has dcpx.3 "$k"
done
for p in $pages; do
  d=$(grep -n '^\.S[SH] ' "$man/$p" | awk -F: 'prev == $2 { print $1 } { prev = $2 }')
  [ -z "$d" ] || bad "$p: a heading repeated at line $d"
done
[ $fail -eq 0 ] && echo "man-lint: $pages: clean and complete"
exit $fail
