/* dcpxd-util.h - small helpers shared by the daemon's files: cleanup
 * attributes (systemd's _cleanup_ idiom), clocks, and strict number parsing.
 * Header-only; nothing here logs. */
#ifndef DCPXD_UTIL_H
#define DCPXD_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define _cleanup_(f) __attribute__((cleanup(f)))

static inline void freep(void *p) { free(*(void **)p); }
static inline void closep(int *fd) {
  if (*fd >= 0)
    close(*fd);
}
static inline void fclosep(FILE **f) {
  if (*f)
    fclose(*f);
}
#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_fclose_ _cleanup_(fclosep)

/* Hands ownership out of a _cleanup_ variable. */
#define TAKE_PTR(p)                                                            \
  ({                                                                           \
    __typeof__(p) _p = (p);                                                    \
    (p) = NULL;                                                                \
    _p;                                                                        \
  })
#define TAKE_FD(fd)                                                            \
  ({                                                                           \
    int _fd = (fd);                                                            \
    (fd) = -1;                                                                 \
    _fd;                                                                       \
  })

#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))

/* Writes the len bytes at buf to fd, carrying on after short writes and
 * EINTR: 0, or -errno of the write that failed. *ret_done (or NULL): the
 * bytes written, either way. */
static inline int dcpxd_write_all(int fd, const void *buf, size_t len,
                                  size_t *ret_done) {
  size_t off = 0;
  int r = 0;
  while (off < len) {
    const ssize_t w = write(fd, (const char *)buf + off, len - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      r = -errno;
      break;
    }
    off += (size_t)w;
  }
  if (ret_done)
    *ret_done = off;
  return r;
}

static inline uint64_t dcpxd_now_ns(clockid_t clk) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Parses a whole string as an unsigned integer in `base` (0: C rules).
 * No sign, no trailing garbage, no overflow. */
static inline int dcpxd_parse_u64(const char *s, int base, uint64_t *ret) {
  char *end;
  unsigned long long v;
  /* a digit first: strtoull skips any white space (a tab, a newline) and
   * takes a sign */
  const char c = s ? *s : 0;
  if (!((c >= '0' && c <= '9') ||
        (base == 16 && ((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))))
    return -EINVAL;
  errno = 0;
  v = strtoull(s, &end, base);
  if (errno) /* constants, so the compiler sees every error is < 0 */
    return errno == ERANGE ? -ERANGE : -EINVAL;
  if (*end)
    return -EINVAL;
  *ret = v;
  return 0;
}

/* A number as a person types it (the tools' options): decimal, or
 * hexadecimal after "0x"; never octal, so "010" is ten. */
static inline int dcpxd_parse_num(const char *s, uint64_t *ret) {
  if (s && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    /* strtoull would take a second "0x", or a sign, after the first */
    if (s[2] == '+' || s[2] == '-' || (s[2] == '0' && (s[3] | 0x20) == 'x'))
      return -EINVAL;
    return dcpxd_parse_u64(s + 2, 16, ret);
  }
  return dcpxd_parse_u64(s, 10, ret);
}

static inline int dcpxd_parse_u32(const char *s, int base, uint32_t *ret) {
  uint64_t v;
  int r = dcpxd_parse_u64(s, base, &v);
  if (r < 0)
    return r;
  if (v > UINT32_MAX)
    return -ERANGE;
  *ret = (uint32_t)v;
  return 0;
}

/* snprintf into an array that always terminates and never reports
 * truncation as an error (the callers format log and error texts); a cut
 * text ends with "..." at a whole UTF-8 character (dcpx__textf). */
#define dcpxd_bprintf(buf, ...) dcpx__textf(buf, sizeof(buf), __VA_ARGS__)

#endif /* DCPXD_UTIL_H */
