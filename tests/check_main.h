/* check_main.h - the suite runner that each Check program's main() wrote:
 * t_tcase adds a test case, with its tests' timeout, to a suite;
 * t_suite_run runs the suite and gives main() its exit status.
 *
 * Header-only (static functions). */
#ifndef DCPX_TESTS_CHECK_MAIN_H
#define DCPX_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

/* A new test case of suite s, named name, each test of which may run
 * timeout_s seconds. */
static inline TCase *t_tcase(Suite *s, const char *name, double timeout_s) {
  TCase *tc = tcase_create(name);
  tcase_set_timeout(tc, timeout_s);
  suite_add_tcase(s, tc);
  return tc;
}

/* Runs suite s (the runner frees it): EXIT_SUCCESS when no test failed,
 * else EXIT_FAILURE. */
static inline int t_suite_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
