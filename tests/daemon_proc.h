/* daemon_proc.h - what the tests that run a private dcpxd each wrote: the
 * binary to run ($DCPXD, else the build tree's), waiting until it answers,
 * stopping it and asserting that it exited cleanly, and removing a test's
 * folder.
 *
 * Header-only (static functions), free of Check: the caller asserts (with
 * its own assert, which DP_ASSERT_CLEAN_EXIT takes).
 */
#ifndef DCPX_TESTS_DAEMON_PROC_H
#define DCPX_TESTS_DAEMON_PROC_H

#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dcpx.h"

#define DP_FN static __attribute__((unused))

/* The dcpxd to test: $DCPXD, else ./daemon/dcpxd. */
DP_FN const char *dp_dcpxd(void) {
  const char *bin = getenv("DCPXD");
  return bin ? bin : "./daemon/dcpxd";
}

DP_FN int dp_rm_entry(const char *p, const struct stat *st, int fl,
                      struct FTW *f) {
  (void)st, (void)fl, (void)f;
  return remove(p);
}

/* Removes folder dir and everything in it (links are not followed). */
DP_FN void dp_rm_tree(const char *dir) {
  nftw(dir, dp_rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Whether a client can say Hello to the daemon on sock now. */
DP_FN int dp_daemon_up(const char *sock) {
  dcpx_client *c;
  if (dcpx_connect(sock, &c) == 0) {
    dcpx_disconnect(c);
    return 1;
  }
  return 0;
}

/* Waits until the daemon on sock answers: 0, or -1 after 5 s. */
DP_FN int dp_wait_up(const char *sock) {
  for (int i = 0; i < 500; i++) {
    if (dp_daemon_up(sock))
      return 0;
    usleep(10000);
  }
  return -1;
}

/* Sends the daemon pid signal sig and reaps it: its wait status, or -1. */
DP_FN int dp_stop(pid_t pid, int sig) {
  int st = -1;
  kill(pid, sig);
  waitpid(pid, &st, 0);
  return st;
}

/* Asserts with the caller's ASSERT(cond, format, ...) that wait status st
 * (evaluated once) is dcpxd's clean exit (status 0). */
#define DP_ASSERT_CLEAN_EXIT(ASSERT, st)                                     \
  do {                                                                       \
    const int st_ = (st);                                                    \
    ASSERT(WIFEXITED(st_) && WEXITSTATUS(st_) == 0,                          \
           "dcpxd did not exit cleanly (status 0x%x)", st_);                 \
  } while (0)

#endif
