/* check_conf.c - dcpxd's config file, parsed by inih (daemon/dcpxd-conf.c):
 * good files give the settings they say (comments, quotes, '_' keys,
 * indented keys, CRLF, flags over the file); each bad file - a line
 * without '=', an unknown key, a bad value, a [section], a line longer
 * than inih's buffer, a too long value, a NUL byte, an unterminated quote,
 * 'config' in a file - is refused with one error that names the file and
 * its line.
 *
 * The parser is linked in (dcpxd_conf_load), and its stderr is caught in
 * a file per test (Check forks each test).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "dcpxd-conf.h"
#include "dcpxd-log.h"

static char g_path[64], g_err[64];

/* Writes the file (len bytes: it may hold a NUL), loads it with extra
 * flags, and returns dcpxd_conf_load's result; stderr goes to g_err. */
static int load(dcpxd_conf *c, const char *text, size_t len,
                const char *flag) {
  char arg[96];
  char *argv[] = {"dcpxd", arg, (char *)flag, NULL};
  FILE *f;
  int fd, r;

  strcpy(g_path, "/tmp/dcpx-conf.XXXXXX");
  fd = mkstemp(g_path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
  close(fd);
  strcpy(g_err, "/tmp/dcpx-conf-err.XXXXXX");
  fd = mkstemp(g_err);
  ck_assert_int_ge(fd, 0);
  fflush(stderr);
  ck_assert_int_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
  close(fd);
  snprintf(arg, sizeof(arg), "--config=%s", g_path);
  memset(c, 0, sizeof(*c));
  r = dcpxd_conf_load(c, flag ? 3 : 2, argv);
  f = fopen(g_err, "r");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  return r;
}

static int load_str(dcpxd_conf *c, const char *text) {
  return load(c, text, strlen(text), NULL);
}

/* What the daemon wrote to stderr. */
static char *errors(void) {
  static char buf[4096];
  FILE *f = fopen(g_err, "r");
  size_t n;
  ck_assert_ptr_nonnull(f);
  n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void cleanup(dcpxd_conf *c) {
  dcpxd_conf_done(c);
  unlink(g_path);
  unlink(g_err);
}

/* The file is refused, with exactly one error line, which holds
 * "FILE:LINE: " followed by `what`. */
static void expect_error(const char *text, size_t len, unsigned line,
                         const char *what) {
  dcpxd_conf c;
  char want[256];
  int r = load(&c, text, len, NULL);
  const char *e = errors();

  ck_assert_int_eq(r, -EINVAL);
  snprintf(want, sizeof(want), "%s:%u: %s", g_path, line, what);
  ck_assert_msg(strstr(e, want), "wanted '%s' in '%s'", want, e);
  ck_assert_msg(strchr(e, '\n') == e + strlen(e) - 1, "one line: '%s'", e);
  cleanup(&c);
}
#define expect_error_str(text, line, what)                                     \
  expect_error(text, strlen(text), line, what)

START_TEST(test_good_file) {
  dcpxd_conf c;
  int r = load_str(&c, "# dcpxd.conf\n"
                       "\n"
                       "socket = /tmp/x.sock   # trailing comment\n"
                       "   state-dir=/tmp/state\n"
                       "\tpoll_ms = 3\n"
                       "; an ini comment\n"
                       "join-timeout-ms = 1234 ; an inline ini comment\n"
                       "socket-mode = 0600\r\n"
                       "records-max-bytes = \"8M\"  # quoted\n"
                       "allow-uid = 1000, 1001\n"
                       "allow-uid = 1002\n"
                       "log-level = debug\n"
                       "enable-fault-injection = yes\n"
                       "max-workspace-bytes = 1G\n"
                       "group-owner = team-a-*:uid:1000\n");
  ck_assert_int_eq(r, DCPXD_CONF_RUN);
  ck_assert_str_eq(errors(), "");
  ck_assert_str_eq(c.socket_path, "/tmp/x.sock");
  ck_assert_str_eq(c.state_dir, "/tmp/state");
  ck_assert_uint_eq(c.poll_ms, 3);
  ck_assert_uint_eq(c.join_timeout_ms, 1234);
  ck_assert_uint_eq(c.socket_mode, 0600);
  ck_assert_uint_eq(c.records_max_bytes, 8u << 20);
  ck_assert_uint_eq(c.n_allow_uids, 3); /* repeated lines add */
  ck_assert_uint_eq(c.allow_uids[0], 1000);
  ck_assert_uint_eq(c.allow_uids[2], 1002);
  ck_assert_int_eq(c.log_level, LOG_DEBUG);
  ck_assert(c.fault_injection);
  ck_assert_uint_eq(c.max_ws_bytes, 1ull << 30);
  ck_assert_uint_eq(c.n_owner_rules, 1);
  ck_assert_str_eq(c.owner_rules[0].pattern, "team-a-*");
  ck_assert_str_eq(c.config_path, g_path);
  cleanup(&c);
}
END_TEST

/* A quoted value keeps its '#' and blanks; a '#' without a blank before
 * it is part of the value. */
START_TEST(test_quotes_and_hash) {
  dcpxd_conf c;
  int r = load_str(&c, "socket = \"/tmp/a # b.sock\"  # comment\n"
                       "state-dir = /tmp/s#1\n");
  ck_assert_int_eq(r, DCPXD_CONF_RUN);
  ck_assert_str_eq(c.socket_path, "/tmp/a # b.sock");
  ck_assert_str_eq(c.state_dir, "/tmp/s#1");
  cleanup(&c);
}
END_TEST

/* Flags override the file; the installed example (all comments) loads
 * and leaves the defaults. */
START_TEST(test_flags_override_and_example) {
  dcpxd_conf c;
  const char *src = getenv("DCPX_SRCDIR");
  char path[512], *text;
  size_t n;
  FILE *f;
  int r = load_str(&c, "poll-ms = 3\njoin-timeout-ms = 99\n");
  ck_assert_int_eq(r, DCPXD_CONF_RUN);
  cleanup(&c);
  r = load(&c, "poll-ms = 3\njoin-timeout-ms = 99\n", 33, "--poll-ms=4");
  ck_assert_int_eq(r, DCPXD_CONF_RUN);
  ck_assert_uint_eq(c.poll_ms, 4);
  ck_assert_uint_eq(c.join_timeout_ms, 99);
  cleanup(&c);

  snprintf(path, sizeof(path), "%s/daemon/dcpxd.conf.example",
           src ? src : ".");
  f = fopen(path, "r");
  ck_assert_msg(f, "cannot open %s", path);
  text = malloc(1 << 16);
  n = fread(text, 1, (1 << 16) - 1, f);
  fclose(f);
  r = load(&c, text, n, NULL);
  free(text);
  ck_assert_int_eq(r, DCPXD_CONF_RUN);
  ck_assert_str_eq(errors(), "");
  ck_assert_uint_eq(c.poll_ms, DCPXD_DEFAULT_POLL_MS);
  ck_assert_str_eq(c.state_dir, DCPXD_DEFAULT_STATE_DIR);
  cleanup(&c);
}
END_TEST

START_TEST(test_bad_lines) {
  expect_error_str("poll-ms = 3\n\npoll-ms 4\n", 3,
                   "expected 'key = value'");
  /* The last line, without a newline. */
  expect_error_str("poll-ms = 3\nbogus", 2, "expected 'key = value'");
  expect_error_str("# x\n= 3\n", 2, "missing key");
  expect_error_str("poll-ms = 3\n[dcpxd]\npoll-ms = 4\n", 2,
                   "sections are not used");
  expect_error_str("socket = \"/tmp/x\n", 1, "unterminated quote");
  expect_error_str("socket = \"/tmp/x\" y\n", 1, "text after closing quote");
  expect_error_str("\n\nconfig = /etc/other.conf\n", 3,
                   "'config' cannot be set in a file");
  static const char nul[] = "poll-ms = 3\npoll-ms\0 = 4\n";
  expect_error(nul, sizeof(nul) - 1, 2, "NUL byte in line");
}
END_TEST

START_TEST(test_unknown_keys) {
  expect_error_str("poll-ms = 3\n# c\nno-such-key = 1\n", 3,
                   "unknown setting 'no-such-key'");
  expect_error_str("help = yes\n", 1, "unknown setting 'help'");
  /* The first error is the one reported (inih goes on after a bad line;
   * the parse here stops at it). */
  expect_error_str("a-bad-line\nanother-bad = 1\n", 1,
                   "expected 'key = value'");
}
END_TEST

START_TEST(test_bad_values) {
  expect_error_str("poll-ms = 9\n", 1, "poll-ms '9' must be 1..5");
  expect_error_str("\nsocket-mode = 0999\n", 2,
                   "socket-mode '0999' is not an octal mode");
  /* setuid, setgid and sticky bits mean nothing on a socket: refused (a
   * mode of 07777 was accepted) */
  expect_error_str("\nsocket-mode = 07777\n", 2,
                   "socket-mode '07777' is not an octal mode of permission");
  expect_error_str("enable-fault-injection = maybe\n", 1,
                   "'maybe' is not a boolean");
  expect_error_str("log-level = loud\n", 1, "unknown log-level 'loud'");
  expect_error_str("records-max-bytes = 1K\n", 1,
                   "records-max-bytes '1K' must be a size from 4K to 1T");
  expect_error_str("records-max-bytes = 2T\n", 1,
                   "records-max-bytes '2T' must be a size from 4K to 1T");
  /* A value that is no size says so, not the key's range (no SIZE key
   * takes a blank inside: "4 K" got "must be a size from 4K to 1T"). */
  expect_error_str("records-max-bytes = 4 K\n", 1,
                   "records-max-bytes '4 K' is not a size: a size has no "
                   "blank inside (write '4K')");
  expect_error_str("max-queued-bytes = 64 MiB\n", 1,
                   "max-queued-bytes '64 MiB' is not a size: a size has no "
                   "blank inside (write '64MiB')");
  expect_error_str("max-workspace-bytes = 1 G\n", 1,
                   "max-workspace-bytes '1 G' is not a size: a size has no "
                   "blank inside (write '1G')");
  expect_error_str("records-max-bytes = 4Q\n", 1,
                   "records-max-bytes '4Q' is not a size (bytes, or a number "
                   "with K, M, G or T");
  expect_error_str("max-queued-bytes = lots\n", 1,
                   "max-queued-bytes 'lots' is not a size (bytes");
  { /* accepted, with a warning: nobody but root could connect; a
     * relative socket path depends on dcpxd's working directory */
    dcpxd_conf c;
    ck_assert_int_eq(load_str(&c, "socket-mode = 0\nsocket = d.sock\n"),
                     DCPXD_CONF_RUN);
    ck_assert_msg(strstr(errors(), "lets nobody but root connect") &&
                      strstr(errors(), "'d.sock' is relative"),
                  "%s", errors());
    cleanup(&c);
  }
  { /* the bound the message names is one the parser reads */
    dcpxd_conf c;
    ck_assert_int_eq(load_str(&c, "records-max-bytes = 1T\n"), DCPXD_CONF_RUN);
    ck_assert_uint_eq(c.records_max_bytes, 1ull << 40);
    cleanup(&c);
  }
  expect_error_str("max-workspace-bytes = 18446744073709551615G\n", 1,
                   "max-workspace-bytes '18446744073709551615G' is not a "
                   "size");
  expect_error_str("allow-uid = no-such-user-dcpx\n", 1,
                   "unknown user 'no-such-user-dcpx'");
  expect_error_str("group-owner = x\n", 1, "group-owner 'x' must be");
}
END_TEST

/* Oversized: a line longer than inih's buffer is refused (inih would cut
 * it in two); a value that fits the line but not the setting is refused
 * by the setting. */
START_TEST(test_oversized) {
  char text[1200];
  size_t n;

  n = (size_t)snprintf(text, sizeof(text), "poll-ms = 3\nstate-dir = /");
  memset(text + n, 'a', 1000);
  strcpy(text + n + 1000, "\n");
  expect_error_str(text, 2, "line longer than");

  n = (size_t)snprintf(text, sizeof(text), "socket = /");
  memset(text + n, 's', 150);
  strcpy(text + n + 150, "\n");
  expect_error_str(text, 1, "socket path must be 1..107 bytes long");

  n = (size_t)snprintf(text, sizeof(text), "\n\n");
  memset(text + n, 'k', 150);
  strcpy(text + n + 150, " = 1\n");
  expect_error_str(text, 3, "unknown setting 'kkkk");

  /* dcpxd.conf(5): a line is at most 199 bytes long, newline or not;
   * one of 200 is refused. */
  for (int nl = 0; nl < 2; nl++) {
    dcpxd_conf c;
    n = (size_t)snprintf(text, sizeof(text), "poll-ms = ");
    memset(text + n, '0', 199 - n - 1);
    strcpy(text + 198, nl ? "3\n" : "3");
    ck_assert_uint_eq(strcspn(text, "\n"), 199);
    ck_assert_int_eq(load_str(&c, text), DCPXD_CONF_RUN);
    ck_assert_uint_eq(c.poll_ms, 3);
    cleanup(&c);
  }
  n = (size_t)snprintf(text, sizeof(text), "poll-ms = ");
  memset(text + n, '0', 200 - n - 1);
  strcpy(text + 199, "3\n");
  expect_error_str(text, 1, "line longer than 199 bytes");
}
END_TEST

/* dcpxd_conf_load(c, argv: 2 arguments), its stderr meanwhile into
 * said[n] (NUL-terminated; at least one byte of it). */
static int load_said(dcpxd_conf *c, char **argv, char *said, size_t n) {
  char tmpl[] = "/tmp/dcpx-conf-err.XXXXXX";
  int fd = mkstemp(tmpl), saved = dup(STDERR_FILENO), r;
  ck_assert_int_ge(fd, 0);
  fflush(stderr);
  dup2(fd, STDERR_FILENO);
  memset(c, 0, sizeof(*c));
  r = dcpxd_conf_load(c, 2, argv);
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  memset(said, 0, n);
  ck_assert_int_ge(pread(fd, said, n - 1, 0), 1);
  close(fd);
  unlink(tmpl);
  return r;
}

/* A missing --config file is an error; the default file may be absent. */
START_TEST(test_missing_file) {
  dcpxd_conf c;
  char *argv[] = {"dcpxd", "--config=/nonexistent/dcpxd.conf", NULL};
  memset(&c, 0, sizeof(c));
  ck_assert_int_eq(dcpxd_conf_load(&c, 2, argv), -EINVAL);
  dcpxd_conf_done(&c);
  /* A directory says so (fopen opens it; the read would fail without a
   * reason); /dev/null stays a way to say "no settings". */
  char *dir[] = {"dcpxd", "--config=/tmp", NULL};
  char said[512];
  ck_assert_int_eq(load_said(&c, dir, said, sizeof(said)), -EINVAL);
  ck_assert_msg(strstr(said, "/tmp: Is a directory"), "%s", said);
  dcpxd_conf_done(&c);
  /* A FIFO (nothing writes it) is refused at once: its open waited for a
   * writer, and dcpxd hung at start without a line. */
  char fifo[] = "/tmp/dcpx-conf-fifo.XXXXXX", farg[64], fpath[64];
  ck_assert_ptr_nonnull(mkdtemp(fifo));
  snprintf(farg, sizeof(farg), "--config=%s/f", fifo);
  snprintf(fpath, sizeof(fpath), "%s/f", fifo);
  ck_assert_int_eq(mkfifo(fpath, 0600), 0);
  char *fa[] = {"dcpxd", farg, NULL};
  alarm(10); /* a hang fails here, not at the test's timeout */
  ck_assert_int_eq(load_said(&c, fa, said, sizeof(said)), -EINVAL);
  alarm(0);
  unlink(fpath);
  rmdir(fifo);
  ck_assert_msg(strstr(said, "not a regular file"), "%s", said);
  dcpxd_conf_done(&c);
  char *null[] = {"dcpxd", "--config=/dev/null", NULL};
  memset(&c, 0, sizeof(c));
  ck_assert_int_eq(dcpxd_conf_load(&c, 2, null), DCPXD_CONF_RUN);
  dcpxd_conf_done(&c);
}
END_TEST

static Suite *conf_suite(void) {
  Suite *s = suite_create("conf");
  TCase *tc = t_tcase(s, "file", 30);
  tcase_add_test(tc, test_good_file);
  tcase_add_test(tc, test_quotes_and_hash);
  tcase_add_test(tc, test_flags_override_and_example);
  tcase_add_test(tc, test_bad_lines);
  tcase_add_test(tc, test_unknown_keys);
  tcase_add_test(tc, test_bad_values);
  tcase_add_test(tc, test_oversized);
  tcase_add_test(tc, test_missing_file);
  return s;
}

int main(void) {
  dcpxd_log_max_level = LOG_INFO;
  return t_suite_run(conf_suite());
}
