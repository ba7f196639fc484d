/* log.c - libdcpx's log and the versioned-struct check (common/log.h). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dcpx.h"
#include "log.h"

int dcpx__log_level_v = -1;

int dcpx__log_level_init(void) {
  const char *e = getenv("DCPX_DEBUG");
  int v = DCPX__LOG_NONE;
  if (e && !strcasecmp(e, "WARN"))
    v = DCPX__LOG_WARN;
  else if (e && !strcasecmp(e, "INFO"))
    v = DCPX__LOG_INFO;
  else if (e && !strcasecmp(e, "TRACE"))
    v = DCPX__LOG_TRACE;
  /* Racing first calls compute the same value. */
  __atomic_store_n(&dcpx__log_level_v, v, __ATOMIC_RELAXED);
  return v;
}

void dcpx__log(int level, const char *file, int line, const char *fmt, ...) {
  static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
  char msg[768];
  const char *base = strrchr(file, '/');
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* One write per line, so that ranks in one terminal do not interleave
   * within a line. */
  fprintf(stderr, "dcpx %ld %s %s:%d %s\n", (long)getpid(),
          names[level & 3], base ? base + 1 : file, line, msg);
}

#define CUT_MARK "..."

void dcpx__vtextf(char *buf, size_t n, const char *fmt, va_list ap) {
  const int len = vsnprintf(buf, n, fmt, ap);
  if (len < 0 || (size_t)len < n)
    return;
  /* buf[end] is the first byte dropped; a UTF-8 continuation byte there
   * (10xxxxxx) means the character it ends began before: drop it whole */
  const bool mark = n >= sizeof(CUT_MARK);
  size_t end = mark ? n - sizeof(CUT_MARK) : n - 1;
  for (int k = 0; k < 3 && end > 0 && ((unsigned char)buf[end] & 0xC0) == 0x80;
       k++)
    end--;
  if (mark)
    memcpy(buf + end, CUT_MARK, sizeof(CUT_MARK));
  else
    buf[end] = '\0';
}

void dcpx__textf(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  dcpx__vtextf(buf, n, fmt, ap);
  va_end(ap);
}

void dcpx__why_at(char *why, size_t n, const char *file, int line,
                  const char *fmt, ...) {
  char own[320];
  va_list ap;
  if (!why || !n) {
    if (!dcpx__log_on(DCPX__LOG_WARN))
      return;
    why = own;
    n = sizeof(own);
  }
  va_start(ap, fmt);
  dcpx__vtextf(why, n, fmt, ap);
  va_end(ap);
  if (dcpx__log_on(DCPX__LOG_WARN))
    dcpx__log(DCPX__LOG_WARN, file, line, "%s", why);
}

int dcpx__struct_check_at(const char *file, int line, const char *fn,
                          const char *type, const void *p, uint32_t want,
                          uint32_t reserved, char *why, size_t n) {
  if (!p) {
    dcpx__why_at(why, n, file, line, "%s: %s is NULL", fn, type);
    return DCPX_E_INVAL;
  }
  const uint32_t size = *(const uint32_t *)p;
  if (size != want) {
    dcpx__why_at(why, n, file, line,
                 "%s: %s.size is %u, this libdcpx %s knows %u only "
                 "(initialise the struct with its _INIT macro; a different "
                 "size means a dcpx.h that does not match the library)",
                 fn, type, size, DCPX_VERSION_STRING, want);
    return DCPX_E_INVAL;
  }
  if (reserved) {
    dcpx__why_at(why, n, file, line, "%s: %s.reserved is %u, not 0", fn,
                 type, reserved);
    return DCPX_E_INVAL;
  }
  return 0;
}
