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

/* Rate limiting of repeated lines (dcpxd(8), "Logging"): per format
 * string, at most dcpxd_log_rate_burst lines in dcpxd_log_rate_interval_ms,
 * then one "suppressed N similar lines" summary when the interval has
 * ended. Burst 0: no limit. Set from log-rate-burst and
 * log-rate-interval-ms. */
#define DCPXD_LOG_DEFAULT_BURST 20u
#define DCPXD_LOG_DEFAULT_INTERVAL_MS 1000u
extern unsigned dcpxd_log_rate_burst;
extern uint32_t dcpxd_log_rate_interval_ms;

/* Called when a key starts dropping lines, so that the daemon can arm a
 * timer that calls dcpxd_log_ratelimit_flush(false) when its window ends
 * (dcpxd_log_ratelimit_due_ms; otherwise the summary waits for the next
 * log line). */
extern void (*dcpxd_log_on_suppress)(void);

/* Writes the summaries of windows that have ended (all of them, ended or
 * not, if all), and frees their keys. */
void dcpxd_log_ratelimit_flush(bool all);

/* True while some key is dropping lines (its summary not yet written). */
bool dcpxd_log_suppressing(void);

/* Milliseconds (rounded up) until the earliest window that is dropping
 * lines ends, 0 if one has ended, -1 if none drops: when dcpxd's timer
 * calls dcpxd_log_ratelimit_flush next. */
int64_t dcpxd_log_ratelimit_due_ms(void);

#endif /* DCPXD_LOG_H */
