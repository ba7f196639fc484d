/* check_ctl.c - dcpxctl for operators and monitoring (issue 15): help on
 * every command, its bad options (a usage error like its others), stats
 * --output to a dangling symbolic link, standard output that cannot be
 * written (exit 5, check UNKNOWN), and `dcpxctl check`'s four Nagios
 * codes against a private dcpxd ($DCPXD) with rank processes
 * (tests/health_harness.h):
 *
 *   UNKNOWN (3)   a bad threshold, an unknown group
 *   OK (0)        no groups; ranks running under the rescue threshold
 *   WARNING (1)   ranks running over the rescue threshold (W*N < K: every
 *                 row rescues); recent timeout records (a rank stopped,
 *                 then the group reset)
 *   CRITICAL (2)  a rank killed (the group aborted, the rank DEAD); dcpxd
 *                 unreachable
 *
 * The OpenMetrics output is checked by a real parser in check_metrics.c.
 */
#define _GNU_SOURCE
#include <check.h>
#include <sys/resource.h>

#include "check_main.h"
#include "health_harness.h"

static hh_daemon g_d;
static hh_out g_o;

/* ck_assert_msg that first shows the daemon's log. */
#define CC_ASSERT(cond, ...)                                                 \
  T_EXPECT_OR(cond, t_dump_file(g_d.log), __VA_ARGS__)

/* dcpxctl ARGS; asserts the exit code. */
#define CTL(want, ...) HH_CTL(CC_ASSERT, &g_d, &g_o, want, __VA_ARGS__)

/* `check` prints exactly one line, beginning with "DCPX STATE - ". */
static void one_line(const char *state) {
  char want[32];
  snprintf(want, sizeof(want), "DCPX %s - ", state);
  CC_ASSERT(strncmp(g_o.out, want, strlen(want)) == 0 &&
                strchr(g_o.out, '\n') == g_o.out + strlen(g_o.out) - 1 &&
                g_o.err[0] == 0,
            "not one %s line: '%s', stderr '%s'", state, g_o.out, g_o.err);
}

START_TEST(test_help) {
  static const char *const cmds[] = {"groups", "health", "stats", "records",
                                     "reset",  "fault",  "check"};
  /* No daemon: help must not need one. */
  strcpy(g_d.sock, "/nonexistent/d.sock");
  for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
    char want[64];
    snprintf(want, sizeof(want), "Usage: dcpxctl %s", cmds[i]);
    CTL(0, cmds[i], "--help");
    CC_ASSERT(strstr(g_o.out, want) && strstr(g_o.out, "--socket"),
              "%s --help: %s", cmds[i], g_o.out);
    CTL(0, cmds[i], "-h");
    CC_ASSERT(strstr(g_o.out, want), "%s -h: %s", cmds[i], g_o.out);
    CTL(0, "help", cmds[i]);
    CC_ASSERT(strstr(g_o.out, want), "help %s: %s", cmds[i], g_o.out);
    /* -V / --version among a command's options too, as dcpxctl(1) says
     * (they were refused there: "unknown option", check UNKNOWN) */
    CTL(0, cmds[i], strcmp(cmds[i], "fault") ? "--version" : "-V");
    CC_ASSERT(strncmp(g_o.out, "dcpxctl ", 8) == 0 &&
                  strstr(g_o.out, "(protocol "),
              "%s --version: %s", cmds[i], g_o.out);
  }
  CTL(0, "fault", "stall", "-V");
  CC_ASSERT(strncmp(g_o.out, "dcpxctl ", 8) == 0, "%s", g_o.out);
  CTL(0, "fault", "stall", "--help");
  CC_ASSERT(strstr(g_o.out, "--ticks"), "%s", g_o.out);
  CTL(0, "--help");
  CC_ASSERT(strstr(g_o.out, "check [GROUP]") &&
                strstr(g_o.out, "--format=text|json|openmetrics"),
            "%s", g_o.out);
  CTL(2, "records", "--bogus");
  CTL(2, "help", "bogus");
  /* help is a command too: its --help is the overview, as help's is */
  CTL(0, "help", "--help");
  CC_ASSERT(strstr(g_o.out, "Commands:"), "%s", g_o.out);
  CTL(0, "help", "-h");
  CC_ASSERT(strstr(g_o.out, "Commands:"), "%s", g_o.out);
  memset(&g_d, 0, sizeof(g_d));
}
END_TEST

/* A command's bad option is a usage error like the command's others: exit
 * status 2 and one line, "dcpxctl: ... (see dcpxctl --help)", that names
 * the option; not getopt's own "stats: option '--format' requires an
 * argument". */
static void usage_line(const char *name) {
  const size_t n = strlen(g_o.err);
  static const char tail[] = " (see dcpxctl --help)\n";
  CC_ASSERT(strncmp(g_o.err, "dcpxctl: ", 9) == 0 && strstr(g_o.err, name) &&
                n > strlen(tail) &&
                strcmp(g_o.err + n - strlen(tail), tail) == 0 &&
                strchr(g_o.err, '\n') == g_o.err + n - 1 && g_o.out[0] == 0,
            "not one usage error line naming %s: '%s'", name, g_o.err);
}

#define USAGE_ERR(name, ...)                                                 \
  do {                                                                       \
    CTL(2, __VA_ARGS__);                                                     \
    usage_line(name);                                                        \
  } while (0)

START_TEST(test_option_errors) {
  /* No daemon: the options are refused before it is asked. */
  strcpy(g_d.sock, "/nonexistent/d.sock");
  /* A missing argument, of every command. */
  USAGE_ERR("'--format'", "stats", "--format");
  USAGE_ERR("'--output'", "stats", "--output");
  USAGE_ERR("'--socket'", "groups", "--socket");
  USAGE_ERR("'--timeout'", "health", "--timeout");
  USAGE_ERR("'--limit'", "records", "--limit");
  USAGE_ERR("'--group'", "reset", "--group");
  USAGE_ERR("'--ticks'", "fault", "stall", "--group", "g", "--ticks");
  /* An abbreviation is named in full. */
  USAGE_ERR("'--format'", "stats", "--form");
  /* Unknown, ambiguous, or given a value it does not take. */
  USAGE_ERR("'--bogus'", "groups", "--bogus");
  USAGE_ERR("'--bogus'", "stats", "--bogus=1");
  USAGE_ERR("'-x'", "health", "-x");
  USAGE_ERR("'-x'", "health", "--json", "-xh"); /* inside a cluster */
  USAGE_ERR("'--s'", "records", "--s");         /* --since or --socket */
  USAGE_ERR("'--json'", "records", "--json=1");
  USAGE_ERR("'--bogus'", "reset", "--bogus");
  USAGE_ERR("'--bogus'", "fault", "stall", "--bogus");
  USAGE_ERR("fault clear needs --group and --rank", "fault", "clear",
            "--group", "g");
  USAGE_ERR("options of fault stall, not of fault clear", "fault", "clear",
            "--group", "g", "--rank", "0", "--ticks", "1s");
  USAGE_ERR("or fault clear", "fault", "stal");
  CTL(3, "fault", "clear", "--group", "g", "--rank", "0"); /* no dcpxd */
  /* help takes one COMMAND: an extra argument is a usage error, as other
   * commands' are (help groups extra printed groups' help, exit 0). */
  USAGE_ERR("unexpected argument 'extra'", "help", "groups", "extra");
  USAGE_ERR("unexpected argument 'x'", "help", "fault", "stall", "x");
  USAGE_ERR("unexpected argument 'x'", "help", "fault", "x");
  CTL(0, "help", "fault", "stall"); /* as fault stall --help */
  CC_ASSERT(strstr(g_o.out, "Usage: dcpxctl fault stall"), "%s", g_o.out);
  CTL(0, "help", "fault", "clear");
  CC_ASSERT(strstr(g_o.out, "dcpxctl fault clear --group G --rank R"), "%s",
            g_o.out);
  /* The same before the command. */
  USAGE_ERR("'--timeout'", "--timeout");
  USAGE_ERR("'--bogus'", "--bogus", "groups");
  /* check says it on its UNKNOWN line, with its own help. */
  CTL(3, "check", "--records-window");
  one_line("UNKNOWN");
  CC_ASSERT(strstr(g_o.out, "'--records-window'") &&
                strstr(g_o.out, "(see dcpxctl check --help)"),
            "%s", g_o.out);
  CTL(3, "check", "-xh");
  one_line("UNKNOWN");
  CC_ASSERT(strstr(g_o.out, "'-x'"), "%s", g_o.out);
  /* --until 0 (the epoch) is an empty window, refused as --until before
   * --since is: 0 on the wire means no end, and every record came back. */
  USAGE_ERR("--until", "records", "--until", "0");
  USAGE_ERR("--until", "records", "--until", "@0");
  USAGE_ERR("--until", "records", "--until", "1970-01-01T00:00:00Z");
  /* A date past 2554-07-21 has no uint64 nanosecond count: it wrapped to
   * a time in the past (--until 2600-...: no records; --since: every
   * record since 2015), and nothing said so. */
  USAGE_ERR("--until", "records", "--until", "2600-01-01T00:00:00Z");
  USAGE_ERR("--since", "records", "--since", "9999-12-31T23:59:59Z");
  USAGE_ERR("--since", "records", "--since", "2554-07-21T23:34:34Z");
  CTL(3, "records", "--since", "2554-07-21T23:34:33Z"); /* the last: no dcpxd */
  /* A date and time without the Z was taken as UTC, silently, though an
   * operator copying it from journalctl or syslog means local time: it is
   * refused, and the message says what to write. With the Z, a space may
   * still stand for the T. */
  USAGE_ERR("--since: '2025-01-31T12:00:00' has no time zone", "records",
            "--since", "2025-01-31T12:00:00");
  USAGE_ERR("'2025-01-31 12:00:00Z' if that is UTC", "records", "--since",
            "2025-01-31 12:00:00");
  USAGE_ERR("--until: '2025-01-31 12:00:00' has no time zone", "records",
            "--until", "2025-01-31 12:00:00");
  CTL(3, "records", "--since", "2025-01-31 12:00:00Z"); /* no dcpxd */
  CTL(3, "records", "--since", "2025-01-31T12:00:00.5Z");
  CTL(3, "records", "--since", "2025-01-31T12:00:00.123456789Z");
  USAGE_ERR("--since", "records", "--since", "2025-01-31T12:00:00.Z");
  USAGE_ERR("--since", "records", "--since", "2025-01-31T12:00:00.1234567890Z");
  USAGE_ERR("--since", "records", "--since", "2025-01-31T12:00:00.12a4Z");
  USAGE_ERR("--since", "records", "--since", "2025-01-31T12:00:00.5");
  CTL(3, "records", "--until", "2025-01-31T12:00:00Z");
  /* --call 2^64-1 is "any call" on the wire: refused as reserved; it was
   * "must be a call number >= 1", which it is. */
  USAGE_ERR("--call 18446744073709551615 is reserved: it means any call",
            "fault", "stall", "--group", "g", "--rank", "0", "--ticks", "1s",
            "--call", "18446744073709551615");
  USAGE_ERR("--call must be a call number >= 1", "fault", "stall", "--group",
            "g", "--rank", "0", "--ticks", "1s", "--call", "0");
  CTL(3, "fault", "stall", "--group", "g", "--rank", "0", "--ticks", "1s",
      "--call", "18446744073709551614"); /* the last: no dcpxd */
  /* A group name dcpxd would refuse (PROTOCOL.md 7.2) is a usage error
   * here, before any dcpxd is asked (it was sent, and dcpxd's refusal
   * came back as exit 4). 63 bytes are a name; 64 are not. */
  USAGE_ERR("GROUP must be 1..63 bytes", "health", "a b");
  USAGE_ERR("GROUP must be 1..63 bytes", "stats", "a/b");
  USAGE_ERR("--group must be 1..63 bytes", "records", "--group", "x\ty");
  USAGE_ERR("--group must be 1..63 bytes", "reset", "--group", "caf\xc3\xa9");
  USAGE_ERR("--group must be 1..63 bytes", "fault", "stall", "--group",
            "g;h", "--rank", "0", "--ticks", "1s");
  USAGE_ERR("GROUP must be 1..63 bytes", "stats", "--json",
            "x123456789x123456789x123456789x123456789x123456789x123456789"
            "x123");
  CTL(3, "health",
      "x123456789x123456789x123456789x123456789x123456789x123456789"
      "x12"); /* 63 bytes: asked, and no dcpxd */
  CTL(3, "check", "a b");
  one_line("UNKNOWN");
  CC_ASSERT(strstr(g_o.out, "GROUP must be 1..63 bytes"), "%s", g_o.out);
  /* A rank no group can have (W <= 16) matched nothing: "no records",
   * exit 0, for a typo. */
  USAGE_ERR("--rank", "records", "--rank", "16");
  USAGE_ERR("--rank", "records", "--rank", "-2");
  /* An empty --socket (`--socket "$S"` with S unset) is a usage error: it
   * asked $DCPX_SOCKET's or the default dcpxd instead, silently. */
  USAGE_ERR("--socket needs a path", "groups", "--socket", "");
  USAGE_ERR("--socket needs a path", "--socket=", "health");
  USAGE_ERR("--socket needs a path", "stats", "--socket=");
  CTL(3, "check", "--socket", "");
  one_line("UNKNOWN");
  CC_ASSERT(strstr(g_o.out, "--socket needs a path"), "%s", g_o.out);
  CTL(3, "--socket", "", "check");
  one_line("UNKNOWN");
  CC_ASSERT(strstr(g_o.out, "--socket needs a path"), "%s", g_o.out);
  /* check's bad --timeout is its one line too (stderr had a second) */
  CTL(3, "check", "--timeout", "0");
  one_line("UNKNOWN");
  CC_ASSERT(strstr(g_o.out, "1..3600"), "%s", g_o.out);
  /* A socket path over a Unix socket's 107 bytes: check says so on its
   * one UNKNOWN line (it said "query failed", the reason on stderr). */
  memset(g_d.sock, 'x', sizeof(g_d.sock) - 1);
  g_d.sock[sizeof(g_d.sock) - 1] = '\0';
  CTL(3, "check");
  one_line("UNKNOWN");
  CC_ASSERT(strstr(g_o.out, "too long"), "%s", g_o.out);
  USAGE_ERR("too long", "groups");
  memset(&g_d, 0, sizeof(g_d));
}
END_TEST

/* stats --output to a symbolic link that leads nowhere is refused as one
 * to a regular file is (check_metrics.c), saying so, not "No such file or
 * directory"; exit status 5, and no file is made at its target. */
START_TEST(test_output_link) {
  char target[200], link[200], loop[200], outarg[240];
  struct stat st;

  CC_ASSERT(hh_daemon_start(&g_d, NULL) == 0, "dcpxd did not come up");
  snprintf(target, sizeof(target), "%s/nowhere.prom", g_d.dir);
  snprintf(link, sizeof(link), "%s/dangling.prom", g_d.dir);
  snprintf(loop, sizeof(loop), "%s/loop.prom", g_d.dir);
  CC_ASSERT(symlink(target, link) == 0 && symlink(loop, loop) == 0, "%s",
            strerror(errno));
  snprintf(outarg, sizeof(outarg), "--output=%s", link);
  CTL(5, "stats", outarg);
  CC_ASSERT(strstr(g_o.err, "symbolic link") && strstr(g_o.err, link) &&
                !strstr(g_o.err, "No such file"),
            "no reason: %s", g_o.err);
  CTL(5, "stats", "--format=prometheus", outarg);
  CC_ASSERT(strstr(g_o.err, "symbolic link"), "no reason: %s", g_o.err);
  CC_ASSERT(lstat(link, &st) == 0 && S_ISLNK(st.st_mode) &&
                lstat(target, &st) != 0,
            "the link or its target changed");
  /* A link to itself leads nowhere either. */
  snprintf(outarg, sizeof(outarg), "--output=%s", loop);
  CTL(5, "stats", outarg);
  CC_ASSERT(strstr(g_o.err, "symbolic link"), "no reason: %s", g_o.err);
  hh_daemon_stop(&g_d, SIGTERM);
  hh_daemon_cleanup(&g_d);
  memset(&g_d, 0, sizeof(g_d));
}
END_TEST

/* dcpxctl --socket g_d.sock ARGS with standard output on /dev/full (fd:
 * "full") or closed ("closed"); its stderr into g_o.err. Returns its exit
 * status, or -1. */
static int ctl_bad_stdout(const char *how, ...) {
  const char *bin = getenv("DCPXCTL");
  const char *argv[16];
  int pe[2], n = 0, st;
  va_list ap;
  pid_t pid;

  argv[n++] = bin ? bin : "./tools/dcpxctl";
  argv[n++] = "--socket";
  argv[n++] = g_d.sock;
  va_start(ap, how);
  for (const char *a; (a = va_arg(ap, const char *)) && n < 15;)
    argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  if (pipe2(pe, O_CLOEXEC) < 0)
    return -1;
  pid = fork();
  if (pid == 0) {
    int fd = open("/dev/full", O_WRONLY | O_CLOEXEC);
    if (strcmp(how, "full") == 0) {
      if (fd < 0 || dup2(fd, 1) < 0)
        _exit(126);
    } else {
      close(1);
    }
    dup2(pe[1], 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(pe[1]);
  g_o.n_err = 0;
  for (ssize_t k; (k = read(pe[0], g_o.err + g_o.n_err,
                            sizeof(g_o.err) - 1 - g_o.n_err)) > 0;)
    g_o.n_err += (size_t)k;
  g_o.err[g_o.n_err] = 0;
  close(pe[0]);
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
    return -1;
  return WEXITSTATUS(st);
}

#define CTL_BAD_STDOUT(want, how, ...)                                       \
  do {                                                                       \
    int rc_ = ctl_bad_stdout(how, __VA_ARGS__, (char *)NULL);                \
    CC_ASSERT(rc_ == (want) &&                                               \
                  strstr(g_o.err, "cannot write standard output"),           \
              "dcpxctl %s > %s: exit %d, expected %d, stderr '%s'",         \
              #__VA_ARGS__, how, rc_, (want), g_o.err);                      \
  } while (0)

/* An answer that cannot reach standard output (a full disk, a closed
 * descriptor) is an error: exit status 5 (check: 3, UNKNOWN) and a line
 * on stderr. It exited 0, and `dcpxctl stats > FILE` on a full disk left
 * a cut or empty FILE behind a success. An error the command had (a
 * usage error, no dcpxd) keeps its status. */
START_TEST(test_stdout_error) {
  CC_ASSERT(hh_daemon_start(&g_d, NULL) == 0, "dcpxd did not come up");
  CTL_BAD_STDOUT(5, "full", "groups");
  CTL_BAD_STDOUT(5, "full", "health");
  CTL_BAD_STDOUT(5, "full", "stats", "--format=prometheus");
  CTL_BAD_STDOUT(5, "full", "--json", "records");
  CTL_BAD_STDOUT(5, "full", "--help");
  CTL_BAD_STDOUT(5, "full", "--version");
  CTL_BAD_STDOUT(5, "full", "stats", "--help");
  CTL_BAD_STDOUT(3, "full", "check");
  CTL_BAD_STDOUT(5, "closed", "groups");
  CTL_BAD_STDOUT(3, "closed", "check");
  /* stats --output FILE writes no standard output: not an error */
  char outarg[240];
  snprintf(outarg, sizeof(outarg), "--output=%s/m.prom", g_d.dir);
  CC_ASSERT(ctl_bad_stdout("full", "stats", "--format=prometheus", outarg,
                           (char *)NULL) == 0 &&
                g_o.err[0] == 0,
            "stats --output with stdout on /dev/full: '%s'", g_o.err);
  /* the command's own error first */
  CC_ASSERT(ctl_bad_stdout("full", "bogus", (char *)NULL) == 2, "usage");
  hh_daemon_stop(&g_d, SIGTERM);
  strcpy(g_d.sock, "/nonexistent/d.sock");
  CC_ASSERT(ctl_bad_stdout("full", "--json", "groups", (char *)NULL) == 3,
            "unreachable: %s", g_o.err);
  hh_daemon_cleanup(&g_d);
  memset(&g_d, 0, sizeof(g_d));
}
END_TEST

/* W*N < K: every row rescues */
static hh_spec spec(const char *group, uint32_t W) {
  return hh_spec_small(group, W, 2000000000ull);
}

START_TEST(test_check_codes) {
  const uint32_t W = 3;
  hh_spec sp = spec("mon", W);
  hh_shared *sh = hh_shared_new();
  pid_t pids[3];

  CC_ASSERT(sh && hh_daemon_start(&g_d, NULL) == 0, "dcpxd did not come up");

  /* UNKNOWN: bad thresholds, bad arguments, an unknown group. */
  CTL(3, "check", "--rescue-warning", "101");
  one_line("UNKNOWN");
  /* no sign: "-0" was taken, and the performance data said -0 */
  CTL(3, "check", "--rescue-warning", "-0");
  one_line("UNKNOWN");
  CTL(3, "check", "--rescue-critical", "-0%");
  one_line("UNKNOWN");
  CTL(3, "check", "--rescue-warning", " -0"); /* strtod skips the blank */
  one_line("UNKNOWN");
  CTL(3, "check", "--records-window", "soon");
  one_line("UNKNOWN");
  CTL(3, "check", "--records-window", "900"); /* no unit: was 900 ns */
  one_line("UNKNOWN");
  CTL(3, "check", ""); /* an empty GROUP is no name, not "every group" */
  one_line("UNKNOWN");
  CTL(2, "health", "");
  CC_ASSERT(strstr(g_o.err, "GROUP"), "no reason: %s", g_o.err);
  CTL(2, "stats", "");
  CTL(2, "records", "--group", "");
  CTL(2, "records", "--limit", "0"); /* was: every record */
  CC_ASSERT(strstr(g_o.err, "--limit"), "no reason: %s", g_o.err);
  /* Two output formats at once, an empty time window: refused, not one
   * silently taken (they printed JSON, metrics, "no records"). */
  CTL(2, "--json", "stats", "--format=openmetrics");
  CC_ASSERT(strstr(g_o.err, "two formats"), "no reason: %s", g_o.err);
  CTL(2, "--json", "stats", "--format=text");
  CTL(0, "--json", "stats", "--format=json");
  CTL(2, "records", "--since", "2h", "--until", "3h");
  CC_ASSERT(strstr(g_o.err, "--until"), "no reason: %s", g_o.err);
  /* dcpxd's error names its code */
  CTL(4, "health", "nosuchgroup");
  CC_ASSERT(strstr(g_o.err, "no group 'nosuchgroup' (DCPX_E_NOENT)"), "%s",
            g_o.err);
  CTL(3, "check", "--bogus");
  one_line("UNKNOWN");
  /* ... also given before the command (dcpxctl(1)); other commands
   * exit 2 for the same. */
  CTL(3, "--timeout", "0", "check");
  one_line("UNKNOWN");
  CTL(3, "--bogus", "check");
  one_line("UNKNOWN");
  CTL(2, "--timeout", "0", "groups");
  CTL(2, "--bogus", "groups");
  CC_ASSERT(strstr(g_o.err, "--bogus"), "no reason: %s", g_o.err);
  CTL(2, "groups", "--bogus"); /* a command's own (test_option_errors) */
  CC_ASSERT(strstr(g_o.err, "--bogus"), "no reason: %s", g_o.err);
  CTL(2, "records", "--limit");
  CC_ASSERT(g_o.err[0], "no reason for a missing argument");
  CTL(3, "check", "a", "b");
  one_line("UNKNOWN");
  CTL(3, "check", "nosuchgroup");
  one_line("UNKNOWN");
  /* check has no --json, wherever it is given; thresholds must be in
   * order. */
  CTL(3, "check", "--json");
  one_line("UNKNOWN");
  CTL(3, "--json", "check");
  one_line("UNKNOWN");
  CTL(3, "check", "--rescue-warning", "50", "--rescue-critical", "10");
  one_line("UNKNOWN");
  CTL(3, "check", "--records-warning", "5", "--records-critical", "2");
  one_line("UNKNOWN");
  ck_assert_msg(strstr(g_o.out, "--records-critical is below"), "%s", g_o.out);
  /* A date that does not exist is refused, not moved to March. */
  CTL(2, "records", "--since", "2025-02-30T00:00:00Z");
  CTL(0, "records", "--since", "2025-02-28T00:00:00Z");
  CTL(0, "help", "help");

  /* OK: no groups. */
  CTL(0, "check");
  one_line("OK");
  CC_ASSERT(strstr(g_o.out, "0 groups") && strstr(g_o.out, " | groups=0"),
            "%s", g_o.out);

  /* Ranks at work; they hold after a failure, attached. */
  sh->recover = 1;
  sh->hold = 0x7;
  sh->resume_at = 1000000;
  CC_ASSERT(hh_ranks_run(g_d.sock, &sp, sh, pids, W, 20, 20000) == 0,
            "ranks did not run: %s", hh_rank_errors(sh, W));

  /* WARNING: every row rescues, over the default 50%. */
  CTL(1, "check");
  one_line("WARNING");
  CC_ASSERT(strstr(g_o.out, "group mon rescue rate 100.0% > 50.0%"), "%s",
            g_o.out);
  CTL(1, "check", "mon", "--rescue-warning", "99.5");
  one_line("WARNING");
  /* OK under a threshold that allows it; the group named or not. */
  CTL(0, "check", "--rescue-warning", "100");
  one_line("OK");
  CC_ASSERT(strstr(g_o.out, "1 group, 3/3 ranks live"), "%s", g_o.out);
  CTL(0, "check", "mon", "--rescue-warning=100", "--records-window", "1h",
      "--records-warning", "1");
  one_line("OK");
  /* CRITICAL by the rescue threshold. */
  CTL(2, "check", "--rescue-warning", "10", "--rescue-critical", "90");
  one_line("CRITICAL");
  CC_ASSERT(strstr(g_o.out, "> 90.0%"), "%s", g_o.out);

  /* CRITICAL: rank 1 killed; the group aborts, rank 1 is DEAD. */
  kill(pids[1], SIGKILL);
  waitpid(pids[1], NULL, 0);
  pids[1] = 0;
  int rc = -1;
  for (int i = 0; i < 500; i++) {
    rc = hh_ctl(&g_d, &g_o, "check", "--rescue-warning", "100", (char *)NULL);
    if (rc == 2 && strstr(g_o.out, "aborted") && strstr(g_o.out, "DEAD"))
      break;
    hh_sleep_ms(10);
  }
  CC_ASSERT(rc == 2, "check after kill -9: %d %s%s", rc, g_o.out, g_o.err);
  one_line("CRITICAL");
  CC_ASSERT(strstr(g_o.out, "group mon aborted (dead)") &&
                strstr(g_o.out, "group mon rank 1 DEAD"),
            "%s", g_o.out);
  /* --json: the totals have failed_calls as the text has; an unreachable
   * dcpxd answers in JSON too (dcpxctl(1), JSON OUTPUT). */
  CTL(0, "stats", "--json");
  CC_ASSERT(strstr(g_o.out, "\"totals\":{") &&
                strstr(strstr(g_o.out, "\"totals\":{"), "\"failed_calls\":"),
            "%s", g_o.out);
  CTL(3, "--socket", "/nonexistent/dcpx.sock", "--json", "groups");
  CC_ASSERT(strstr(g_o.out, "\"unreachable\":true") &&
                strstr(g_o.out, "\"status\":-111"),
            "%s", g_o.out);

  for (uint32_t r = 0; r < W; r++)
    if (pids[r] > 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], NULL, 0);
    }
  hh_daemon_stop(&g_d, SIGTERM);

  /* CRITICAL: dcpxd unreachable. */
  CTL(2, "check");
  one_line("CRITICAL");
  CC_ASSERT(strstr(g_o.out, "dcpxd unreachable"), "%s", g_o.out);
  hh_daemon_cleanup(&g_d);
  memset(&g_d, 0, sizeof(g_d));
}
END_TEST


/* WARNING by recent timeout records: rank 1 is stopped (SIGSTOP), its
 * peers' waits time out, leave records and abort the group (CRITICAL);
 * rank 1 continues, the group is reset and runs again; the records are
 * recent (WARNING), or old for a short window (OK), or over a critical
 * count (CRITICAL). */
START_TEST(test_check_records) {
  const uint32_t W = 3;
  hh_spec sp = spec("rec", W);
  hh_shared *sh = hh_shared_new();
  pid_t pids[3];
  int rc = -1;

  sp.timeout_ns = 300000000ull;
  CC_ASSERT(sh && hh_daemon_start(&g_d, NULL) == 0, "dcpxd did not come up");
  sh->recover = 1;
  sh->hold = 0x7; /* after a failure, wait for the reset (as check_health) */
  sh->resume_at = 1000000;
  CC_ASSERT(hh_ranks_run(g_d.sock, &sp, sh, pids, W, 20, 20000) == 0,
            "ranks did not run: %s", hh_rank_errors(sh, W));
  CTL(0, "check", "--rescue-warning", "100");
  one_line("OK");

  /* The ranks' FAILED words may show before dcpxd's abort: wait for
   * both. */
  kill(pids[1], SIGSTOP);
  for (int i = 0; i < 500; i++) {
    rc = hh_ctl(&g_d, &g_o, "check", "--rescue-warning", "100", (char *)NULL);
    if (rc == 2 && strstr(g_o.out, "aborted"))
      break;
    hh_sleep_ms(10);
  }
  kill(pids[1], SIGCONT);
  CC_ASSERT(rc == 2, "check with rank 1 stopped: %d %s%s", rc, g_o.out,
            g_o.err);
  one_line("CRITICAL");
  CC_ASSERT(strstr(g_o.out, "group rec aborted") &&
                strstr(g_o.out, "timeout record"),
            "%s", g_o.out);

  /* Reset; the ranks (once every one has failed) acknowledge and run on
   * from call resume_at, all of them. */
  for (int i = 0; i < 2000; i++) {
    uint32_t n = 0;
    for (uint32_t r = 0; r < W; r++)
      n += __atomic_load_n(&sh->r[r].nfails, __ATOMIC_ACQUIRE) > 0;
    if (n == W)
      break;
    hh_sleep_ms(5);
  }
  CTL(0, "reset", "--group", "rec");
  /* Reset, the ranks held before their dcpx_recover: the group is
   * recovering, not aborted (its abort word stays set until the recovery
   * ends): WARNING, or CRITICAL while a rank still shows FAILED. */
  rc = hh_ctl(&g_d, &g_o, "check", "rec", "--rescue-warning", "100",
              "--records-warning", "0", (char *)NULL);
  CC_ASSERT((rc == 1 && strncmp(g_o.out, "DCPX WARNING - ", 15) == 0) ||
                (rc == 2 && strncmp(g_o.out, "DCPX CRITICAL - ", 16) == 0 &&
                 strstr(g_o.out, " FAILED")),
            "check while recovering: %d %s%s", rc, g_o.out, g_o.err);
  CC_ASSERT(strstr(g_o.out, "group rec recovering") &&
                !strstr(g_o.out, "aborted"),
            "%s", g_o.out);
  /* Numbers are decimal (or 0x hex), never octal: "09" is nine. */
  CTL(0, "records", "--limit", "09");
  CTL(0, "records", "--limit", "0x10");
  CTL(2, "records", "--limit", "0x");
  CTL(2, "records", "--limit", "12abc");
  CTL(0, "records", "--rank", "0x1"); /* a rank too (it was decimal only) */
  CTL(0, "records", "--rank", "01");
  CTL(2, "records", "--rank", "0x");
  CTL(2, "records", "--rank", "0x-1");
  /* Each record names rank 1, the stopped one, as the rank its wait
   * awaited, or none where dcpxd cannot tell (rank 0's wait on rank 1's
   * rescue slot, slot 1, which under another mask is rank 2's): never a
   * rank that ran on (a peer waits for rank 1's list or slot before any
   * later rank's, and rank 1 stores to rank 0 first). */
  {
    hh_rec recs[16];
    CTL(0, "records", "--group", "rec", "--json");
    const int n = hh_parse_records(g_o.out, recs, 16);
    CC_ASSERT(n >= 1, "records --json: %d: %s", n, g_o.out);
    for (int i = 0; i < n; i++)
      CC_ASSERT((recs[i].awaited_rank == 1 || recs[i].awaited_rank == -1) &&
                    !recs[i].other_call,
                "record %d of rank %llu awaited rank %lld%s: %s", i,
                (unsigned long long)recs[i].rank,
                (long long)recs[i].awaited_rank,
                recs[i].other_call ? " (another call)" : "", g_o.out);
    CTL(0, "records", "--group", "rec");
    CC_ASSERT(strstr(g_o.out, " CALL   AWAITED_RANK\n"), "records: %s",
              g_o.out);
    /* A TIME as the table prints it is a time --since and --until take,
     * to the nanosecond (it was "cannot parse time"): the newest record
     * lies at or after its own TIME, not before it, and before its TIME
     * plus 1 ns (a fraction dropped would put that a second early). */
    CTL(0, "records", "--group", "rec", "--limit", "1");
    const char *z = strstr(g_o.out, "Z ");
    CC_ASSERT(z && z - g_o.out >= 29, "records: %s", g_o.out);
    char t[40], t1[40];
    memcpy(t, z - 29, 30);
    t[30] = 0;
    CC_ASSERT(t[4] == '-' && t[10] == 'T' && t[19] == '.', "TIME %s", t);
    const unsigned long frac = strtoul(t + 20, NULL, 10);
    if (frac < 999999999ul) { /* else the second's last ns: no +1 here */
      snprintf(t1, sizeof(t1), "%.20s%09luZ", t, frac + 1);
      CTL(0, "records", "--group", "rec", "--since", t);
      CC_ASSERT(strstr(g_o.out, t), "--since %s: %s", t, g_o.out);
      CTL(0, "records", "--group", "rec", "--until", t);
      CC_ASSERT(!strstr(g_o.out, t), "--until %s: %s", t, g_o.out);
      CTL(0, "records", "--group", "rec", "--until", t1);
      CC_ASSERT(strstr(g_o.out, t), "--until %s: %s", t1, g_o.out);
      CTL(0, "records", "--group", "rec", "--since", t1);
      CC_ASSERT(!strstr(g_o.out, t), "--since %s: %s", t1, g_o.out);
    }
  }
  sh->release = 0x7;
  CC_ASSERT(hh_wait_progress(sh, W, sh->resume_at + 20, 20000) == 0,
            "no calls after the reset: %s", hh_rank_errors(sh, W));
  CTL(1, "check", "--rescue-warning", "100");
  one_line("WARNING");
  CC_ASSERT(strstr(g_o.out, "timeout record") &&
                strstr(g_o.out, " in 900 s") && !strstr(g_o.out, "aborted"),
            "%s", g_o.out);
  CTL(1, "check", "rec", "--rescue-warning", "100", "--records-window", "1h");
  one_line("WARNING");
  CTL(0, "check", "--rescue-warning", "100", "--records-warning", "0");
  one_line("OK");
  /* The thresholds off, the count is still the real one in the
   * performance data (it read 0 when the records were not queried). */
  CC_ASSERT(strstr(g_o.out, " timeout_records=") &&
                !strstr(g_o.out, " timeout_records=0;"),
            "%s", g_o.out);
  CTL(2, "check", "--rescue-warning", "100", "--records-critical", "1");
  one_line("CRITICAL");
  hh_sleep_ms(1100);
  CTL(0, "check", "--rescue-warning", "100", "--records-window", "1s");
  one_line("OK");

  CC_ASSERT(hh_stop_ranks(sh, pids, W) == 0, "%s", hh_rank_errors(sh, W));
  hh_daemon_stop(&g_d, SIGTERM);
  hh_daemon_cleanup(&g_d);
  memset(&g_d, 0, sizeof(g_d));
}
END_TEST


/* A node with more groups than one reply holds (dcpxd's 128 KiB budget:
 * about 115 bytes per one-rank group with a name of 63 bytes). The one broken
 * group (a rank killed) is created last, so a reply cut in list order
 * left it out: health exited 0 and check said OK on a node with a dead
 * rank. dcpxd now puts the unhealthy groups first and says how many it
 * left out (health's note, check's WARNING, the metrics' left-out gauge). */
static pid_t join_and_wait(const char *sock, const hh_spec *sp, uint32_t rank) {
  pid_t pid = fork();
  if (pid == 0) {
    dcpx_shape shape;
    dcpx_join_opts jo = DCPX_JOIN_OPTS_INIT;
    dcpx_client *c;
    dcpx_member *m;
    hh_shape(sp, &shape);
    jo.group = sp->group;
    jo.rank = rank;
    jo.timeout_ns = sp->timeout_ns;
    if (dcpx_connect(sock, &c) < 0 || dcpx_join(c, &shape, &jo, &m) < 0)
      _exit(1);
    for (;;)
      pause();
  }
  return pid;
}

START_TEST(test_trimmed_reply) {
  enum { G = 1400 };
  static const char *const extra[] = {"--max-conns-per-uid=4096",
                                      "--max-groups-per-uid=4096", NULL};
  char name[64], want[96];
  struct rlimit rl;
  dcpx_client *c[G];
  dcpx_member *m[G];
  int rc;

  CC_ASSERT(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit");
  rl.rlim_cur = rl.rlim_max;
  (void)setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 3 * G + 64) { /* a machine that cannot hold them */
    fprintf(stderr, "test_trimmed_reply: not run: it needs %d descriptors "
                    "(RLIMIT_NOFILE hard limit %lu)\n",
            3 * G + 64, (unsigned long)rl.rlim_cur);
    return;
  }
  CC_ASSERT(hh_daemon_start(&g_d, extra) == 0, "dcpxd did not come up");
  for (int i = 0; i < G; i++) {
    hh_spec sp = spec("unused", 1);
    dcpx_shape shape;
    dcpx_join_opts jo = DCPX_JOIN_OPTS_INIT;
    /* DCPX_GROUP_NAME_MAX (63) bytes: the most bytes per group, the
     * fewest groups to fill the reply */
    snprintf(name, sizeof(name), "g%04d-%.57s", i,
             "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefgh");
    hh_shape(&sp, &shape);
    jo.group = name;
    jo.timeout_ns = sp.timeout_ns;
    rc = dcpx_connect(g_d.sock, &c[i]);
    if (rc == 0)
      rc = dcpx_join(c[i], &shape, &jo, &m[i]);
    CC_ASSERT(rc == 0, "join %d: %s", i, dcpx_strerror(rc));
  }
  /* The broken group, last: two ranks, then rank 1 killed. */
  hh_spec sp = spec("zz-broken", 2);
  pid_t r0 = join_and_wait(g_d.sock, &sp, 0);
  pid_t r1 = join_and_wait(g_d.sock, &sp, 1);
  /* formed (ready) before rank 1 dies: a forming group whose rank 1 never
   * joined is healthy, and stays so (a join that arrived late, on a loaded
   * machine, let the kill below hit a forming group) */
  for (int i = 0; i < 500 && (hh_ctl(&g_d, &g_o, "health", "zz-broken",
                                      (char *)NULL) != 0 ||
                               !strstr(g_o.out, "ready"));
       i++)
    hh_sleep_ms(20);
  CTL(0, "health", "zz-broken");
  CC_ASSERT(strstr(g_o.out, "ready"), "zz-broken did not form: %s", g_o.out);
  kill(r1, SIGKILL);
  waitpid(r1, NULL, 0);
  for (int i = 0; i < 500 && hh_ctl(&g_d, &g_o, "health", "zz-broken",
                                     (char *)NULL) != 1;
       i++)
    hh_sleep_ms(20);
  CTL(1, "health", "zz-broken");

  CTL(0, "groups"); /* the listing says it is cut short too */
  CC_ASSERT(strstr(g_o.out, "zz-broken") && strstr(g_o.err, "showing"),
            "groups of every group: not the broken one, or no note:\n%.400s"
            "\n%s",
            g_o.out, g_o.err);
  CTL(1, "health"); /* every group: the broken one is in the reply */
  CC_ASSERT(strstr(g_o.out, "zz-broken") && strstr(g_o.err, "showing"),
            "health of every group: not the broken one, or no note:\n%.400s"
            "\n%s",
            g_o.out, g_o.err);
  CTL(1, "--json", "health");
  CC_ASSERT(strstr(g_o.out, "\"groups_left_out\":") &&
                !strstr(g_o.out, "\"groups_left_out\":0") &&
                strstr(g_o.out, "\"name\":\"zz-broken\""),
            "health --json: %.300s", g_o.out);
  CTL(2, "check");
  CC_ASSERT(strstr(g_o.out, "zz-broken") && strstr(g_o.out, "not checked"),
            "check: %s", g_o.out);
  snprintf(want, sizeof(want), "groups=%d ", G + 1);
  CC_ASSERT(strstr(g_o.out, want), "check counts no %s: %s", want, g_o.out);
  CTL(0, "stats", "--format", "prometheus");
  CC_ASSERT(strstr(g_o.out, "group=\"zz-broken\"") &&
                strstr(g_o.out, "\ndcpx_groups_left_out ") &&
                !strstr(g_o.out, "\ndcpx_groups_left_out 0\n"),
            "metrics: no broken group or no left-out count");

  kill(r0, SIGKILL);
  waitpid(r0, NULL, 0);
  for (int i = 0; i < G; i++) {
    dcpx_leave(m[i]);
    dcpx_disconnect(c[i]);
  }
  hh_daemon_stop(&g_d, SIGTERM);
  hh_daemon_cleanup(&g_d);
  memset(&g_d, 0, sizeof(g_d));
}
END_TEST

int main(void) {
  Suite *s = suite_create("ctl");
  /* 1,400 serial joins: 50 s under ASan on a loaded core */
  TCase *tc = t_tcase(s, "ctl", 360);
  tcase_add_test(tc, test_help);
  tcase_add_test(tc, test_option_errors);
  tcase_add_test(tc, test_output_link);
  tcase_add_test(tc, test_stdout_error);
  tcase_add_test(tc, test_check_codes);
  tcase_add_test(tc, test_check_records);
  tcase_add_test(tc, test_trimmed_reply);
  return t_suite_run(s);
}
