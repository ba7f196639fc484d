/* check_log.c - dcpxd's log rate limiter (daemon/dcpxd-log.c): a flood of
 * one kind of line (one format string) is cut to the burst, then one
 * "suppressed N similar lines" summary with the exact count; kinds are
 * limited apart, so distinct lines are never suppressed; the window ends
 * after the interval, and a flush writes what is pending; burst 0 writes
 * everything. stderr is caught in a file per test (Check forks each).
 */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "dcpxd-log.h"

static char g_err[64];

static void capture(void) {
  int fd;
  strcpy(g_err, "/tmp/dcpx-log.XXXXXX");
  fd = mkstemp(g_err);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
  close(fd);
  unsetenv("JOURNAL_STREAM");
  dcpxd_log_setup();
  dcpxd_log_max_level = LOG_DEBUG;
}

/* Lines of the captured stderr that contain needle. */
static int count(const char *needle) {
  char line[1024];
  int n = 0;
  FILE *f = fopen(g_err, "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof(line), f))
    n += strstr(line, needle) != NULL;
  fclose(f);
  return n;
}

static void flood(unsigned n) {
  for (unsigned i = 0; i < n; i++)
    log_warning("flood line %u from a client", i);
}

START_TEST(test_flood_bounded) {
  capture();
  dcpxd_log_rate_burst = 5;
  dcpxd_log_rate_interval_ms = 60000; /* the whole test is one window */
  flood(1000);
  ck_assert_int_eq(count("warning: flood line"), 5);
  ck_assert_int_eq(count("flood line 4 from"), 1); /* the first five */
  ck_assert_int_eq(count("suppressed"), 0);        /* not before the end */
  ck_assert(dcpxd_log_suppressing());
  dcpxd_log_ratelimit_flush(false); /* the window is still open */
  ck_assert_int_eq(count("suppressed"), 0);
  dcpxd_log_ratelimit_flush(true);
  ck_assert_int_eq(count("suppressed 995 similar lines in 60000 ms"), 1);
  ck_assert_int_eq(count("flood line %u from a client"), 1); /* its kind */
  ck_assert_int_eq(count("warning: suppressed"), 1); /* its priority */
  ck_assert(!dcpxd_log_suppressing());
  unlink(g_err);
}
END_TEST

/* Three kinds interleaved: each gets its own burst, and its own count. */
START_TEST(test_distinct_kinds) {
  capture();
  dcpxd_log_rate_burst = 4;
  dcpxd_log_rate_interval_ms = 60000;
  for (int i = 0; i < 100; i++) {
    log_notice("kind A %d", i);
    log_info("kind B %d", i);
    if (i % 10 == 0)
      log_error("kind C %d", i);
  }
  for (int i = 0; i < 50; i++) /* 50 distinct formats: none suppressed */
    switch (i % 5) {
    case 0: log_info("other 0"); break;
    case 1: log_info("other 1"); break;
    case 2: log_info("other 2"); break;
    case 3: log_info("other 3"); break;
    default: log_info("other 4"); break;
    }
  ck_assert_int_eq(count("kind A"), 4);
  ck_assert_int_eq(count("kind B"), 4);
  ck_assert_int_eq(count("kind C"), 4);
  for (int k = 0; k < 5; k++) {
    char s[16];
    snprintf(s, sizeof(s), "other %d", k);
    ck_assert_int_eq(count(s), 4); /* 10 each, burst 4 */
  }
  dcpxd_log_ratelimit_flush(true);
  ck_assert_int_eq(count("suppressed 96 similar lines"), 2); /* A and B */
  ck_assert_int_eq(count("suppressed 6 similar lines"), 6); /* C, others */
  unlink(g_err);
}
END_TEST

/* After the interval, the next line writes the summary first and opens a
 * new window with a new burst. */
START_TEST(test_window_ends) {
  capture();
  dcpxd_log_rate_burst = 3;
  /* 500 ms: a flood of 50 lines must fit in one window even on a loaded
   * machine (100 ms was within a scheduler stall of failing) */
  dcpxd_log_rate_interval_ms = 500;
  flood(50);
  ck_assert_int_eq(count("warning: flood line"), 3);
  usleep(600000);
  flood(50);
  ck_assert_int_eq(count("suppressed 47 similar lines in 500 ms"), 1);
  ck_assert_int_eq(count("warning: flood line"), 6);
  usleep(600000);
  dcpxd_log_ratelimit_flush(false); /* as dcpxd's timer does */
  ck_assert_int_eq(count("suppressed 47 similar lines in 500 ms"), 2);
  ck_assert(!dcpxd_log_suppressing());
  unlink(g_err);
}
END_TEST

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The summaries' timer is due when the earliest dropping window ends
 * (its start + the interval), not a whole interval after a flush: kind B,
 * which began dropping about 300 ms after kind A, is due about 300 ms
 * after A's summary (it was an interval, so B's summary came up to an
 * interval late). Bounds from the test's own clock readings (the windows
 * start between them), so a stall cannot fail it. */
START_TEST(test_summary_due) {
  capture();
  dcpxd_log_rate_burst = 2;
  dcpxd_log_rate_interval_ms = 1000;
  ck_assert_int_eq(dcpxd_log_ratelimit_due_ms(), -1); /* nothing drops */
  log_info("kind A %d", 0);
  const int64_t a = mono_ms(); /* A's window started by now */
  for (int i = 1; i < 5; i++)
    log_info("kind A %d", i);
  usleep(300000);
  log_info("kind B %d", 0);
  const int64_t b = mono_ms();
  for (int i = 1; i < 5; i++)
    log_info("kind B %d", i);
  int64_t now = mono_ms(), due = dcpxd_log_ratelimit_due_ms();
  ck_assert_msg(due >= 0 && due <= a + 1000 - now + 1, "A due in %lld ms",
                (long long)due);
  usleep((useconds_t)due * 1000u + 20000u);
  dcpxd_log_ratelimit_flush(false); /* as the timer does */
  ck_assert_int_eq(count("suppressed 3 similar lines"), 1); /* A's */
  now = mono_ms();
  due = dcpxd_log_ratelimit_due_ms(); /* B's end, not an interval away */
  ck_assert_msg(due >= 0 && due <= b + 1000 - now + 1, "B due in %lld ms",
                (long long)due);
  usleep((useconds_t)due * 1000u + 20000u);
  dcpxd_log_ratelimit_flush(false);
  ck_assert_int_eq(count("suppressed 3 similar lines"), 2);
  ck_assert_int_eq(dcpxd_log_ratelimit_due_ms(), -1);
  unlink(g_err);
}
END_TEST

START_TEST(test_no_limit) {
  capture();
  dcpxd_log_rate_burst = 0;
  flood(500);
  dcpxd_log_ratelimit_flush(true);
  ck_assert_int_eq(count("warning: flood line"), 500);
  ck_assert_int_eq(count("suppressed"), 0);
  unlink(g_err);
}
END_TEST

/* The hook that arms dcpxd's timer runs once per kind that starts
 * dropping, not per dropped line. */
static int hook_calls;
static void hook(void) { hook_calls++; }

START_TEST(test_suppress_hook) {
  capture();
  dcpxd_log_rate_burst = 2;
  dcpxd_log_rate_interval_ms = 60000;
  dcpxd_log_on_suppress = hook;
  flood(10);
  flood(10);
  for (int i = 0; i < 5; i++)
    log_info("another kind %d", i);
  ck_assert_int_eq(hook_calls, 2);
  dcpxd_log_on_suppress = NULL;
  unlink(g_err);
}
END_TEST

int main(void) {
  Suite *s = suite_create("log");
  TCase *tc = t_tcase(s, "ratelimit", 30);
  tcase_add_test(tc, test_flood_bounded);
  tcase_add_test(tc, test_distinct_kinds);
  tcase_add_test(tc, test_window_ends);
  tcase_add_test(tc, test_summary_due);
  tcase_add_test(tc, test_no_limit);
  tcase_add_test(tc, test_suppress_hook);
  return t_suite_run(s);
}
