/* dcpxd-log.c - stderr logging, with syslog priority prefixes when stderr
 * is the journal (dcpxd-log.h), and rate limiting of repeated lines.
 *
 * Each message is formatted into one buffer and written with one write(2),
 * so that lines from the daemon never interleave mid-line, and a message
 * longer than the buffer is cut (with "...") rather than split.
 *
 * Rate limiting (like journald's RateLimitIntervalSec/RateLimitBurst, but
 * per call site): the key of a line is its format string (the pointer: one
 * call site, or the few that share a literal). Each key has a window that
 * opens at its first line; in it, the first dcpxd_log_rate_burst lines are
 * written and the rest counted. When the window has ended, the next log
 * call or dcpxd_log_ratelimit_flush() (dcpxd's timer, armed through
 * dcpxd_log_on_suppress, and its exit) writes one summary line for the key,
 * "suppressed N similar lines ...", and frees it. Keys live in a small
 * table, probed from a hash of the pointer; when every probed slot holds a
 * live window of another key, the line is written unlimited (fail open:
 * distinct lines are never dropped for lack of room). The daemon is one
 * thread, so nothing here locks. */
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
unsigned dcpxd_log_rate_burst = DCPXD_LOG_DEFAULT_BURST;
uint32_t dcpxd_log_rate_interval_ms = DCPXD_LOG_DEFAULT_INTERVAL_MS;
void (*dcpxd_log_on_suppress)(void);

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

/* Formats and writes one line. */
static void log_write(int level, int error, const char *fmt, va_list ap) {
  char f[1024], line[4096];
  size_t n;

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
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  int k = vsnprintf(line + n, sizeof(line) - n - 1, f, ap);
#pragma GCC diagnostic pop
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
}

static void log_line(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void log_line(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_write(level, 0, fmt, ap);
  va_end(ap);
}

/* ---- rate limiting ------------------------------------------------------ */

#define RL_SLOTS 256 /* keys with a live window at once */
#define RL_PROBES 8

typedef struct rl_slot {
  const char *key; /* the format string; NULL: free */
  uint64_t start_ns;
  unsigned n, dropped;
  int level; /* of the last dropped line, for the summary */
} rl_slot;

static rl_slot rl_slots[RL_SLOTS];
static unsigned rl_live; /* slots in use */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t interval_ns(void) {
  return (uint64_t)dcpxd_log_rate_interval_ms * 1000000ull;
}

/* Ends the window of a slot: its summary if it dropped lines, then free. */
static void rl_end(rl_slot *s) {
  if (s->dropped)
    log_line(s->level,
             "suppressed %u similar lines in %u ms (rate limit %u; "
             "\"%.80s\")",
             s->dropped, dcpxd_log_rate_interval_ms, dcpxd_log_rate_burst,
             s->key);
  s->key = NULL;
  rl_live--;
}

void dcpxd_log_ratelimit_flush(bool all) {
  uint64_t now;

  if (!rl_live)
    return;
  now = now_ns();
  for (size_t i = 0; i < RL_SLOTS && rl_live; i++)
    if (rl_slots[i].key &&
        (all || now - rl_slots[i].start_ns >= interval_ns()))
      rl_end(&rl_slots[i]);
}

int64_t dcpxd_log_ratelimit_due_ms(void) {
  uint64_t end = UINT64_MAX, now;

  for (size_t i = 0; i < RL_SLOTS && rl_live; i++)
    if (rl_slots[i].key && rl_slots[i].dropped &&
        rl_slots[i].start_ns + interval_ns() < end)
      end = rl_slots[i].start_ns + interval_ns();
  if (end == UINT64_MAX)
    return -1;
  now = now_ns();
  return end <= now ? 0 : (int64_t)((end - now + 999999u) / 1000000u);
}

bool dcpxd_log_suppressing(void) {
  for (size_t i = 0; i < RL_SLOTS && rl_live; i++)
    if (rl_slots[i].key && rl_slots[i].dropped)
      return true;
  return false;
}

/* True if the line with this format may be written now. */
static bool rl_admit(const char *key, int level) {
  uintptr_t h = (uintptr_t)key;
  rl_slot *free_slot = NULL;

  if (dcpxd_log_rate_burst == 0)
    return true;
  dcpxd_log_ratelimit_flush(false);
  h ^= h >> 17;
  h *= 0x9e3779b97f4a7c15ull;
  for (unsigned p = 0; p < RL_PROBES; p++) {
    rl_slot *s = &rl_slots[(h + p) % RL_SLOTS];
    if (s->key == key) {
      if (s->n < dcpxd_log_rate_burst) {
        s->n++;
        return true;
      }
      if (s->dropped++ == 0 && dcpxd_log_on_suppress)
        dcpxd_log_on_suppress();
      s->level = level;
      return false;
    }
    if (!s->key && !free_slot)
      free_slot = s;
  }
  if (free_slot) {
    *free_slot = (rl_slot){.key = key, .start_ns = now_ns(), .n = 1};
    rl_live++;
  }
  return true; /* a new window, or no room: written */
}

int dcpxd_log_internal(int level, int error, const char *fmt, ...) {
  int saved_errno = errno;
  va_list ap;

  if (rl_admit(fmt, level)) {
    va_start(ap, fmt);
    log_write(level, error, fmt, ap);
    va_end(ap);
  }
  errno = saved_errno;
  return -abs(error);
}

