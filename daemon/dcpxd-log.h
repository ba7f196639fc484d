/* dcpxd-log.h - the daemon's logging: one line per message on stderr.
 * When stderr is the journal (systemd sets $JOURNAL_STREAM to its
 * "DEV:INO"), each line starts with a syslog priority prefix ("<3>" error,
 * "<4>" warning, "<5>" notice, "<6>" info, "<7>" debug), which journald
 * turns into the message's priority; otherwise (a terminal, a file, a
 * pipe; also a child of a service whose stderr is no longer the stream
 * $JOURNAL_STREAM names) the line is plain text, errors and warnings led
 * by "error: " and "warning: ".
 *
 * Like systemd's log_*_errno(), the _errno variants take a negative error
 * code (negative errno or DCPX_E_*), expand "%m" in the format to its text
 * (dcpx_strerror), and return the code, so that a failure is logged and
 * returned in one step:
 *
 *     return log_error_errno(r, "Failed to map group %s: %m", name);
 */
#ifndef DCPXD_LOG_H
#define DCPXD_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <syslog.h>

/* Messages above this priority (numerically greater) are dropped. */
extern int dcpxd_log_max_level;

/* Logs and returns -abs(error) (0 stays 0). */
int dcpxd_log_internal(int level, int error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* True if fd is the stream journal_stream ($JOURNAL_STREAM, "DEV:INO")
 * names. */
bool dcpxd_log_stream_is_journal(int fd, const char *journal_stream);

/* Decides, from $JOURNAL_STREAM and stderr, whether lines get the priority
 * prefix; the first message calls it if main has not. */
void dcpxd_log_setup(void);

/* Parses "err", "warning", "notice", "info", "debug" or a number 0..7. */
int dcpxd_log_level_from_string(const char *s);

#define log_full_errno(level, error, ...)                                      \
  ({                                                                           \
    int _level = (level), _e = (error);                                        \
    _level <= dcpxd_log_max_level                                              \
        ? dcpxd_log_internal(_level, _e, __VA_ARGS__)                          \
        : -abs(_e);                                                            \
  })
#define log_full(level, ...) ((void)log_full_errno(level, 0, __VA_ARGS__))

#define log_debug(...) log_full(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_full(LOG_INFO, __VA_ARGS__)
#define log_notice(...) log_full(LOG_NOTICE, __VA_ARGS__)
#define log_warning(...) log_full(LOG_WARNING, __VA_ARGS__)
#define log_error(...) log_full(LOG_ERR, __VA_ARGS__)

#define log_debug_errno(e, ...) log_full_errno(LOG_DEBUG, e, __VA_ARGS__)
#define log_info_errno(e, ...) log_full_errno(LOG_INFO, e, __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, e, __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_ERR, e, __VA_ARGS__)

/* Rate limiting, for lines a client can cause at will (a refused
 * connection, a protocol error, a refused join): each call site of
 * log_ratelimited logs at most DCPXD_LOG_BURST lines a second; the next
 * line after a second in which some were dropped says how many. */
#define DCPXD_LOG_BURST 20
typedef struct dcpxd_ratelimit {
  uint64_t start_ns;
  unsigned n, dropped;
} dcpxd_ratelimit;

/* True if a line may be logged now (and logs the count dropped before). */
bool dcpxd_ratelimit_ok(dcpxd_ratelimit *rl, int level);

#define log_ratelimited(level, ...)                                            \
  do {                                                                         \
    static dcpxd_ratelimit _rl;                                                \
    int _lv = (level);                                                         \
    if (_lv <= dcpxd_log_max_level && dcpxd_ratelimit_ok(&_rl, _lv))           \
      (void)dcpxd_log_internal(_lv, 0, __VA_ARGS__);                           \
  } while (0)

#endif /* DCPXD_LOG_H */
