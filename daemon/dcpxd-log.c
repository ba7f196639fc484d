/* dcpxd-log.c - stderr logging, with syslog priority prefixes when stderr
 * is the journal (dcpxd-log.h).
 *
 * Each message is formatted into one buffer and written with one write(2),
 * so that lines from the daemon never interleave mid-line, and a message
 * longer than the buffer is cut (with "...") rather than split. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dcpx.h"
#include "dcpxd-log.h"

int dcpxd_log_max_level = LOG_INFO;

static const char *const level_names[] = {
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
};

int dcpxd_log_level_from_string(const char *s) {
  if (!s)
    return -EINVAL;
  for (int i = 0; i < 8; i++)
    if (strcasecmp(s, level_names[i]) == 0)
      return i;
  if (strcasecmp(s, "error") == 0)
    return LOG_ERR;
  if (strcasecmp(s, "warn") == 0)
    return LOG_WARNING;
  if (s[0] >= '0' && s[0] <= '7' && s[1] == '\0')
    return s[0] - '0';
  return -EINVAL;
}

bool dcpxd_log_stream_is_journal(int fd, const char *journal_stream) {
  unsigned long long dev, ino;
  struct stat st;
  int end = 0;

  /* "DEV:INO", both decimal (systemd.exec(5), $JOURNAL_STREAM). */
  if (!journal_stream ||
      sscanf(journal_stream, "%llu:%llu%n", &dev, &ino, &end) != 2 ||
      journal_stream[end] != '\0' || journal_stream[0] < '0' ||
      journal_stream[0] > '9')
    return false;
  if (fstat(fd, &st) < 0)
    return false;
  return (unsigned long long)st.st_dev == dev &&
         (unsigned long long)st.st_ino == ino;
}

/* -1: not decided yet (the first message decides, from the environment
 * and stderr at that time). */
static int log_journal = -1;

void dcpxd_log_setup(void) {
  log_journal =
      dcpxd_log_stream_is_journal(STDERR_FILENO, getenv("JOURNAL_STREAM"));
}

/* Copies fmt into out with every "%m" replaced by the error's text (its
 * '%' doubled, so that vsnprintf prints it as is). */
static void expand_m(char *out, size_t size, const char *fmt, int error) {
  /* Plain errno values read best as strerror() has them; dcpx's own codes
   * (<= -1000) have their text in the dcpx table. */
  int e = abs(error);
  const char *text = e > 0 && e < 1000 ? strerror(e) : dcpx_strerror(-e);
  size_t o = 0;

  for (const char *p = fmt; *p && o + 1 < size; p++) {
    if (p[0] == '%' && p[1] == '%') {
      if (o + 2 >= size)
        break;
      out[o++] = '%';
      out[o++] = '%';
      p++;
    } else if (p[0] == '%' && p[1] == 'm') {
      for (const char *t = text; *t && o + 2 < size; t++) {
        if (*t == '%')
          out[o++] = '%';
        out[o++] = *t;
      }
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = '\0';
}

int dcpxd_log_internal(int level, int error, const char *fmt, ...) {
  char f[1024], line[4096];
  int saved_errno = errno;
  size_t n;
  va_list ap;

  expand_m(f, sizeof(f), fmt, error);
  if (log_journal < 0)
    dcpxd_log_setup();
  if (log_journal)
    n = (size_t)snprintf(line, sizeof(line), "<%d>", level & 7);
  else if ((level & 7) <= LOG_ERR)
    n = (size_t)snprintf(line, sizeof(line), "error: ");
  else if ((level & 7) == LOG_WARNING)
    n = (size_t)snprintf(line, sizeof(line), "warning: ");
  else
    n = 0;
  size_t prefix = n;
  va_start(ap, fmt);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  int k = vsnprintf(line + n, sizeof(line) - n - 1, f, ap);
#pragma GCC diagnostic pop
  va_end(ap);
  if (k < 0)
    k = 0;
  if ((size_t)k >= sizeof(line) - n - 1) {
    n = sizeof(line) - 5;
    memcpy(line + n, "...", 3);
    n += 3;
  } else {
    n += (size_t)k;
  }
  /* Control characters (a client's strings end up in logs) become '?',
   * so that one message is always one line. */
  for (size_t i = prefix; i < n; i++)
    if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
      line[i] = '?';
  line[n++] = '\n';
  for (size_t off = 0; off < n;) {
    ssize_t w = write(STDERR_FILENO, line + off, n - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  errno = saved_errno;
  return -abs(error);
}

bool dcpxd_ratelimit_ok(dcpxd_ratelimit *rl, int level) {
  struct timespec ts;
  uint64_t now;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  if (now - rl->start_ns >= 1000000000ull) {
    if (rl->dropped)
      dcpxd_log_internal(level, 0, "(%u similar messages suppressed)",
                         rl->dropped);
    rl->start_ns = now;
    rl->n = 0;
    rl->dropped = 0;
  }
  if (rl->n < DCPXD_LOG_BURST) {
    rl->n++;
    return true;
  }
  rl->dropped++;
  return false;
}
