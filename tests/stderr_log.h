/* stderr_log.h - what libdcpx writes on stderr while a test runs some of
 * its calls: t_stderr_begin points stderr at a temporary file with
 * DCPX_DEBUG=level (NULL: unset; the level is read again, as by a new
 * process), t_stderr_end restores both and returns what was written (to
 * free). For Check tests (ck_assert; include <check.h> first). */
#ifndef DCPX_TESTS_STDERR_LOG_H
#define DCPX_TESTS_STDERR_LOG_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

typedef struct t_stderr {
  int fd, saved;
} t_stderr;

static inline t_stderr t_stderr_begin(const char *level) {
  char path[] = "/tmp/dcpx-stderr.XXXXXX";
  t_stderr s = {mkstemp(path), dup(2)};
  ck_assert_int_ge(s.fd, 0);
  ck_assert_int_ge(s.saved, 0);
  unlink(path);
  if (level)
    setenv("DCPX_DEBUG", level, 1);
  else
    unsetenv("DCPX_DEBUG");
  dcpx__log_level_v = -1;
  fflush(stderr);
  dup2(s.fd, 2);
  return s;
}

static inline char *t_stderr_end(t_stderr s) {
  fflush(stderr);
  dup2(s.saved, 2);
  close(s.saved);
  unsetenv("DCPX_DEBUG");
  dcpx__log_level_v = -1;
  off_t n = lseek(s.fd, 0, SEEK_END);
  char *text = calloc(1, (size_t)n + 1);
  ck_assert_int_eq(pread(s.fd, text, (size_t)n, 0), n);
  close(s.fd);
  return text;
}

#endif
