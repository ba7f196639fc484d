/* check_main.h - what each Check test program wrote for itself:
 * t_tcase adds a test case, with its tests' timeout, to a suite;
 * t_suite_run runs the suite and gives main() its exit status;
 * T_EXPECT and T_EXPECT_OR assert without a checkpoint per passing
 * assertion (T_EXPECT_OR first shows more, e.g. t_dump_file of a daemon's
 * log, when one fails).
 *
 * Header-only (static functions). */
#ifndef DCPX_TESTS_CHECK_MAIN_H
#define DCPX_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

/* t_tcase's timeout_s for Check's own default (4 s, or
 * $CK_DEFAULT_TIMEOUT). */
#define T_TIMEOUT_DEFAULT (-1.0)

/* A new test case of suite s, named name, each test of which may run
 * timeout_s seconds (T_TIMEOUT_DEFAULT: Check's default). */
static inline TCase *t_tcase(Suite *s, const char *name, double timeout_s) {
  TCase *tc = tcase_create(name);
  if (timeout_s >= 0)
    tcase_set_timeout(tc, timeout_s);
  suite_add_tcase(s, tc);
  return tc;
}

/* Runs suite s (the runner frees it) with Check's output mode (CK_NORMAL,
 * or CK_ENV: $CK_VERBOSITY decides): EXIT_SUCCESS when no test failed,
 * else EXIT_FAILURE. */
static inline int t_suite_run_mode(Suite *s, enum print_output mode) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, mode);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* t_suite_run_mode with CK_NORMAL. */
static inline int t_suite_run(Suite *s) {
  return t_suite_run_mode(s, CK_NORMAL);
}

/* ck_assert_msg records a checkpoint (a write to Check's pipe) on every
 * passing assertion; these call into Check only on a failure, which they
 * report with ck_abort_msg(__VA_ARGS__) (a printf format and its
 * arguments). T_EXPECT_OR runs the statement `show` first. */
#define T_EXPECT_OR(cond, show, ...)                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      show;                                                                    \
      ck_abort_msg(__VA_ARGS__);                                               \
    }                                                                          \
  } while (0)
#define T_EXPECT(cond, ...) T_EXPECT_OR(cond, (void)0, __VA_ARGS__)

/* Copies the text file at path (a daemon's log, say) to stderr under a
 * "---- path ----" line; nothing when path is empty or cannot be read. */
static inline void t_dump_file(const char *path) {
  char line[512];
  FILE *f = path[0] ? fopen(path, "r") : NULL;
  if (!f)
    return;
  fprintf(stderr, "---- %s ----\n", path);
  while (fgets(line, sizeof(line), f))
    fputs(line, stderr);
  fclose(f);
}

#endif
