/* bench_args.h - the positional numbers of the small CPU benches
 * (bench_ref, bench_rescue): --help, and a clear error for a value that
 * is not a whole number in range, never a run on garbage. */
#ifndef DCPX_BENCH_ARGS_H
#define DCPX_BENCH_ARGS_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dcpxd-util.h"

/* 1 when argv asks for help (-h, --help): the caller prints its usage to
 * stdout and exits 0. */
static inline int bench_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
      return 1;
  return 0;
}

/* Positional argument i (1-based; def when absent) into *ret: a number
 * as the tools take it (dcpxd_parse_num: decimal, or hexadecimal after
 * "0x") in [lo, hi]. Else a message naming it and -1 (the caller prints
 * its usage to stderr and exits 2). */
static inline int bench_arg_u32(int argc, char **argv, int i, uint32_t def,
                                uint32_t lo, uint32_t hi, const char *name,
                                uint32_t *ret) {
  uint64_t v;
  if (i >= argc) {
    *ret = def;
    return 0;
  }
  if (dcpxd_parse_num(argv[i], &v) < 0 || v < lo || v > hi) {
    fprintf(stderr, "%s: %s: '%s' is not a number from %" PRIu32 " to %" PRIu32
            "\n", argv[0], name, argv[i], lo, hi);
    return -1;
  }
  *ret = (uint32_t)v;
  return 0;
}

#endif
