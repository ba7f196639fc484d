#!/bin/sh
# autogen.sh - generate configure and Makefile.in from a git checkout.
# Needs autoconf, automake, libtool and pkg-config (for pkg.m4).
set -e
cd "$(dirname "$0")"
mkdir -p m4
exec autoreconf --force --install --warnings=all "$@"
