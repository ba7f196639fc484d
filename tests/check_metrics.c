/* check_metrics.c - `dcpxctl stats --format=openmetrics` (and
 * --format=prometheus) from a private dcpxd with ranks at work, parsed by
 * a real parser: prometheus_client's (python3-prometheus-client), through
 * tests/parse-metrics.py. SKIP (77) when python3 or the module is missing.
 */
#define _GNU_SOURCE
#include <check.h>

#include "check_main.h"
#include "health_harness.h"

static hh_daemon g_d;
static hh_out g_o;
static char g_script[512], g_python[256];

/* ck_assert_msg that first shows the daemon's log. */
#define CM_ASSERT(cond, ...)                                                 \
  T_EXPECT_OR(cond, t_dump_file(g_d.log), __VA_ARGS__)

/* Writes dcpxctl stats --format=FMT to a file (through the shell, or with
 * --output) and runs the parser on it. */
static void parse(const char *fmt, const char *group, uint32_t W,
                  int use_output) {
  char arg[64], path[256], outarg[300], cmd[2048];
  int rc;
  snprintf(arg, sizeof(arg), "--format=%s", fmt);
  snprintf(path, sizeof(path), "%s/metrics.%s", g_d.dir, fmt);
  if (use_output) {
    snprintf(outarg, sizeof(outarg), "--output=%s", path);
    rc = hh_ctl(&g_d, &g_o, "stats", arg, outarg, (char *)NULL);
    CM_ASSERT(rc == 0 && g_o.n_out == 0, "stats %s %s: exit %d\n%s%s", arg,
              outarg, rc, g_o.out, g_o.err);
  } else {
    rc = hh_ctl(&g_d, &g_o, "stats", arg, (char *)NULL);
    CM_ASSERT(rc == 0, "stats %s: exit %d\n%s%s", arg, rc, g_o.out, g_o.err);
    FILE *f = fopen(path, "w");
    CM_ASSERT(f && fwrite(g_o.out, 1, g_o.n_out, f) == g_o.n_out &&
                  fclose(f) == 0,
              "writing %s", path);
  }
  snprintf(cmd, sizeof(cmd), "'%s' '%s' %s '%s' '%s' %u", g_python, g_script, fmt,
           path, group, W);
  rc = system(cmd);
  CM_ASSERT(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s: status 0x%x", cmd,
            rc);
}

START_TEST(test_openmetrics) {
  const uint32_t W = 3;
  const hh_spec sp = hh_spec_small("prom", W, 2000000000ull);
  hh_shared *sh = hh_shared_new();
  pid_t pids[3];

  CM_ASSERT(sh && hh_daemon_start(&g_d, NULL) == 0, "dcpxd did not come up");

  /* No groups: headers only, still valid. */
  int rc = hh_ctl(&g_d, &g_o, "stats", "--format=openmetrics", (char *)NULL);
  CM_ASSERT(rc == 0 && strstr(g_o.out, "# TYPE dcpx_calls counter") &&
                strstr(g_o.out, "# EOF\n"),
            "%d %s", rc, g_o.out);
  rc = hh_ctl(&g_d, &g_o, "stats", "--format=xml", (char *)NULL);
  CM_ASSERT(rc == 2, "--format=xml: %d", rc);
  rc = hh_ctl(&g_d, &g_o, "health", "--format=openmetrics", (char *)NULL);
  CM_ASSERT(rc == 2, "health --format: %d", rc);

  CM_ASSERT(hh_ranks_run(g_d.sock, &sp, sh, pids, W, 20, 20000) == 0,
            "ranks did not run: %s", hh_rank_errors(sh, W));
  parse("openmetrics", "prom", W, 0);
  fputs(g_o.out, stderr); /* one sample in the log */
  parse("prometheus", "prom", W, 1);

  /* --output: a file that cannot be written is exit status 5; a failed
   * query (an unknown group) leaves the file as it was. */
  char path[320], outarg[340];
  struct stat st0, st1;
  snprintf(path, sizeof(path), "%s/metrics.prometheus", g_d.dir);
  snprintf(outarg, sizeof(outarg), "--output=%s", path);
  CM_ASSERT(stat(path, &st0) == 0 && st0.st_size > 0, "%s", path);
  rc = hh_ctl(&g_d, &g_o, "stats", "nosuchgroup", "--format=prometheus",
              outarg, (char *)NULL);
  CM_ASSERT(rc == 4, "unknown group: %d %s", rc, g_o.err);
  CM_ASSERT(stat(path, &st1) == 0 && st1.st_ino == st0.st_ino &&
                st1.st_size == st0.st_size,
            "%s changed", path);
  rc = hh_ctl(&g_d, &g_o, "stats", "--format=prometheus",
              "--output=/nonexistent/dir/x.prom", (char *)NULL);
  CM_ASSERT(rc == 5, "unwritable --output: %d %s", rc, g_o.err);
  rc = hh_ctl(&g_d, &g_o, "health", "--output=/tmp/x", (char *)NULL);
  CM_ASSERT(rc == 2, "health --output: %d", rc);

  /* --output to an existing path that is not a regular file is written
   * in place (renamed over, /dev/full had become a text file): a FIFO
   * gets the metrics, /dev/null takes them. A symbolic link to a regular
   * file is refused (writing through it lets whoever made the link pick
   * the file) and both stay as they were. */
  char link[200], fifo[200], target[200], cmd[700];
  struct stat lst;
  snprintf(target, sizeof(target), "%s/target.prom", g_d.dir);
  snprintf(link, sizeof(link), "%s/link.prom", g_d.dir);
  FILE *tf = fopen(target, "w");
  CM_ASSERT(tf && fclose(tf) == 0 && symlink(target, link) == 0, "%s",
            link);
  snprintf(outarg, sizeof(outarg), "--output=%s", link);
  rc = hh_ctl(&g_d, &g_o, "stats", "--format=prometheus", outarg,
              (char *)NULL);
  CM_ASSERT(rc == 5 && strstr(g_o.err, "symbolic link"),
            "--output to a link to a file: %d %s", rc, g_o.err);
  CM_ASSERT(lstat(link, &lst) == 0 && S_ISLNK(lst.st_mode) &&
                stat(target, &st1) == 0 && st1.st_size == 0,
            "the link or its target changed");
  rc = hh_ctl(&g_d, &g_o, "stats", "--format=prometheus", "--output=/dev/null",
              (char *)NULL);
  CM_ASSERT(rc == 0 && lstat("/dev/null", &lst) == 0 &&
                S_ISCHR(lst.st_mode),
            "--output=/dev/null: %d %s", rc, g_o.err);
  snprintf(fifo, sizeof(fifo), "%s/metrics.fifo", g_d.dir);
  CM_ASSERT(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
  snprintf(cmd, sizeof(cmd), "timeout 30 cat '%s' > '%s.out' &", fifo, fifo);
  CM_ASSERT(system(cmd) == 0, "%s", cmd);
  snprintf(outarg, sizeof(outarg), "--output=%s", fifo);
  rc = hh_ctl(&g_d, &g_o, "stats", "--format=prometheus", outarg,
              (char *)NULL);
  CM_ASSERT(rc == 0, "--output to a FIFO: %d %s", rc, g_o.err);
  CM_ASSERT(lstat(fifo, &lst) == 0 && S_ISFIFO(lst.st_mode),
            "%s is no longer a FIFO", fifo);
  snprintf(path, sizeof(path), "%s.out", fifo);
  for (int i = 0; i < 200; i++) { /* cat ends at the writer's close */
    if (stat(path, &st1) == 0 && st1.st_size > 0)
      break;
    hh_sleep_ms(10);
  }
  CM_ASSERT(stat(path, &st1) == 0 && st1.st_size > 0,
            "nothing came through the FIFO");
  /* A regular file is replaced whole, readable as before (0666 & ~umask),
   * and no temporary file is left. */
  snprintf(path, sizeof(path), "%s/metrics.prometheus", g_d.dir);
  snprintf(outarg, sizeof(outarg), "--output=%s", path);
  rc = hh_ctl(&g_d, &g_o, "stats", "--format=prometheus", outarg,
              (char *)NULL);
  const mode_t um = umask(0);
  umask(um);
  CM_ASSERT(rc == 0 && stat(path, &st1) == 0 && st1.st_size > 0 &&
                (st1.st_mode & 0777) == (0666 & ~um),
            "--output to a file: %d, mode %o", rc, st1.st_mode & 0777);
  snprintf(cmd, sizeof(cmd), "ls '%s' | grep -q '\\.tmp\\.'", g_d.dir);
  CM_ASSERT(system(cmd) != 0, "a temporary file was left in %s", g_d.dir);
  CM_ASSERT(hh_stop_ranks(sh, pids, W) == 0, "%s", hh_rank_errors(sh, W));
  hh_daemon_stop(&g_d, SIGTERM);
  hh_daemon_cleanup(&g_d);
}
END_TEST

int main(void) {
  const char *srcdir = getenv("srcdir");
  snprintf(g_script, sizeof(g_script), "%s/tests/parse-metrics.py",
           srcdir ? srcdir : ".");
  /* The first python3 with the module: $PYTHON, python3, /usr/bin/python3
   * (a pyenv python3 on PATH lacks Debian's modules). */
  const char *cands[] = {getenv("PYTHON"), "python3", "/usr/bin/python3"};
  for (size_t i = 0; i < 3 && !g_python[0]; i++) {
    char cmd[512];
    if (!cands[i] || !*cands[i] || strchr(cands[i], '\''))
      continue;
    snprintf(cmd, sizeof(cmd),
             "'%s' -c 'import prometheus_client' >/dev/null 2>&1", cands[i]);
    if (system(cmd) == 0)
      snprintf(g_python, sizeof(g_python), "%s", cands[i]);
  }
  if (!g_python[0]) {
    fprintf(stderr, "check_metrics: SKIP: no python3 with prometheus_client "
                    "(apt-get install python3-prometheus-client, or bash "
                    "scripts/deps.sh)\n");
    return 77;
  }
  Suite *s = suite_create("metrics");
  TCase *tc = t_tcase(s, "openmetrics", 120);
  tcase_add_test(tc, test_openmetrics);
  return t_suite_run(s);
}
