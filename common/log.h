/* log.h - libdcpx's log (internal): lines on stderr under DCPX_DEBUG, as
 * NCCL's under NCCL_DEBUG.
 *
 * DCPX_DEBUG is read once, at the first check (dcpx__log_on): unset, empty
 * or unknown means no log at all; WARN logs every error libdcpx returns
 * where it has something to add (the call that failed, the CUDA or NCCL
 * error string, the daemon's reason), and every refused argument of a
 * client or member call, a NULL handle or ret_* too (except in
 * dcpx_client_interrupt and dcpx_member_interrupt, which may run in a
 * signal handler); INFO adds the membership's life
 * (join, leave, recover, reattach); TRACE adds every push and merge.
 * A line: "dcpx <pid> WARN cuda.c:123 cudaHostRegister: <error string>".
 *
 * Cost when off: one load and compare per check; no syscall, no
 * allocation, so the call path may check freely. */
#ifndef DCPX_COMMON_LOG_H
#define DCPX_COMMON_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define DCPX__LOG_NONE 0
#define DCPX__LOG_WARN 1
#define DCPX__LOG_INFO 2
#define DCPX__LOG_TRACE 3

__attribute__((visibility("hidden"))) extern int dcpx__log_level_v;
/* Reads DCPX_DEBUG (once) and returns the level. */
__attribute__((visibility("hidden"))) int dcpx__log_level_init(void);
__attribute__((visibility("hidden"), format(printf, 4, 5))) void
dcpx__log(int level, const char *file, int line, const char *fmt, ...);

static inline int dcpx__log_on(int level) {
  int v = __atomic_load_n(&dcpx__log_level_v, __ATOMIC_RELAXED);
  if (__builtin_expect(v < 0, 0))
    v = dcpx__log_level_init();
  return __builtin_expect(level <= v, 0);
}

#define DCPX__LOG(level, ...)                                                 \
  do {                                                                        \
    if (dcpx__log_on(level))                                                  \
      dcpx__log((level), __FILE__, __LINE__, __VA_ARGS__);                    \
  } while (0)
#define DCPX_WARN(...) DCPX__LOG(DCPX__LOG_WARN, __VA_ARGS__)
#define DCPX_INFO(...) DCPX__LOG(DCPX__LOG_INFO, __VA_ARGS__)
#define DCPX_TRACE(...) DCPX__LOG(DCPX__LOG_TRACE, __VA_ARGS__)

/* Text formatted into buf[n] (n > 0), as vsnprintf does; but a text that
 * does not fit is cut at a whole UTF-8 character, not inside one, and
 * ends with "..." (within the n bytes, from n = 4), so that a reader sees
 * the cut and
 * a decoder gets valid UTF-8 from valid UTF-8. The texts handed to
 * callers and sent by dcpxd go through it (dcpx_member_last_error,
 * dcpx_client_last_error, Reply.error). */
__attribute__((visibility("hidden"), format(printf, 3, 0))) void
dcpx__vtextf(char *buf, size_t n, const char *fmt, va_list ap);
__attribute__((visibility("hidden"), format(printf, 3, 4))) void
dcpx__textf(char *buf, size_t n, const char *fmt, ...);

/* A refusal's reason, formatted into why[n] (when why is not NULL: e.g. a
 * member's, dcpx_member_last_error) and logged as a WARN line with the
 * caller's file and line. On refusal paths only: dcpx__vtextf into the
 * buffer, no allocation, no syscall but the log's. */
__attribute__((visibility("hidden"), format(printf, 5, 6))) void
dcpx__why_at(char *why, size_t n, const char *file, int line,
             const char *fmt, ...);

/* A versioned struct's size and reserved word (include/dcpx.h, "a call's
 * arguments"): 0 if `size` is `want` and `reserved` 0, else DCPX_E_INVAL
 * with the reason (the function, the struct and what was wrong) in why[n]
 * (when not NULL) and a WARN line. NULL p: DCPX_E_INVAL. */
__attribute__((visibility("hidden"))) int
dcpx__struct_check_at(const char *file, int line, const char *fn,
                      const char *type, const void *p, uint32_t want,
                      uint32_t reserved, char *why, size_t n);
/* A public struct's `reserved` word, read only when its `size` is this
 * library's (a caller's smaller struct has none there). */
#define DCPX__RESERVED_OF(p)                                                  \
  ((p) && (p)->size == sizeof(*(p)) ? (p)->reserved : 0u)
/* The WARN line names the caller's file and line. */
#define dcpx__struct_check(fn, type, p, want, reserved)                       \
  dcpx__struct_check_at(__FILE__, __LINE__, (fn), (type), (p), (want),        \
                        (reserved), NULL, 0)

#endif /* DCPX_COMMON_LOG_H */
