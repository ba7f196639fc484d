/* check_mem.c - dcpxd's host memory backend (daemon/dcpxd-mem.c): a
 * recovery's zero() makes every byte read 0 in every mapping (the daemon's
 * and a rank's), and commits no page that the calls never touched: with
 * memset over the whole buffer a recovery made every workspace resident
 * (4.4 GB each at the largest shape). Also dcpxd's closer thread
 * (daemon/dcpxd-closer.c), which closes the buffers' fds and those that
 * clients send: every fd given is closed, through the thread or at once. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "dcpxd-closer.h"
#include "dcpxd-mem.h"

#define MB (1024u * 1024u)

#ifdef HAVE_CUDA
/* dcpxd_mem_backend (dcpxd-mem.c) names the CUDA backend of a CUDA build;
 * this test uses the host backend only and links without the CUDA one. */
const dcpxd_mem_ops dcpxd_mem_cuda = {.name = "cuda (not in this test)"};
#endif

/* Bytes the memfd holds in pages (resident or swapped). */
static uint64_t held(int fd) {
  struct stat st;
  ck_assert_int_eq(fstat(fd, &st), 0);
  return (uint64_t)st.st_blocks * 512u;
}

static void check_zero(const char *p, size_t n, const char *what) {
  for (size_t i = 0; i < n; i += 4096)
    ck_assert_msg(p[i] == 0 && p[i + 4095] == 0, "%s: page %zu not zero",
                  what, i / 4096);
}

START_TEST(test_zero_touched_only) {
  const size_t n = 64u * MB;
  dcpxd_buf *b = NULL;
  void *dm;
  ck_assert_int_eq(dcpxd_buf_alloc(&dcpxd_mem_host, -1, n, "check", &b), 0);
  ck_assert_int_eq(dcpxd_mem_host.map(b, &dm), 0);
  /* a rank's own mapping of the fd it was passed */
  char *rank = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
  ck_assert_ptr_ne(rank, MAP_FAILED);
  ck_assert_uint_lt(held(b->fd), 1u * MB); /* nothing touched yet */
  /* the calls touched a few scattered pages, and one run of 4 MB */
  const size_t at[] = {0, 4096, 7u * MB + 123, 33u * MB, n - 1};
  for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
    rank[at[i]] = (char)(0x5A + i);
  memset(rank + 40u * MB, 0xA5, 4u * MB);
  const uint64_t before = held(b->fd);
  ck_assert_uint_ge(before, 4u * MB);
  ck_assert_int_eq(dcpxd_buf_zero(b), 0);
  /* nothing new committed (a whole-buffer memset would hold 64 MB); asked
   * before the checks below read every page, which commits them (a read
   * fault on a memfd's hole allocates a page) */
  ck_assert_msg(held(b->fd) <= before + 64u * 1024u,
                "zero() committed %llu bytes, %llu before",
                (unsigned long long)held(b->fd), (unsigned long long)before);
  check_zero(rank, n, "the rank's mapping");
  check_zero(dm, n, "the daemon's mapping");
  /* a fully written buffer, through a temporary mapping (no map()) */
  memset(rank, 0x33, n);
  munmap(b->map, n);
  b->map = NULL;
  ck_assert_int_eq(dcpxd_buf_zero(b), 0);
  check_zero(rank, n, "the rank's mapping, all written");
  munmap(rank, n);
  dcpxd_buf_free(b);
}
END_TEST

/* Whether every fd of fds[0..n) is closed (EBADF). */
static int all_closed(const int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (fcntl(fds[i], F_GETFD) != -1 || errno != EBADF)
      return 0;
  return 1;
}

/* The closer: fds given before its start, while it runs (more than its
 * first queue holds), through the buffers' free and after its stop are
 * all closed by the time the stop returns (or at once). */
START_TEST(test_closer_closes_all) {
  enum { N = 300 };
  int fds[2 * N];
  for (int i = 0; i < N; i++)
    ck_assert_int_eq(pipe(fds + 2 * i), 0);
  dcpxd_closer_close(fds[0]); /* not running: at once */
  ck_assert(all_closed(fds, 1));
  ck_assert_int_eq(dcpxd_closer_start(), 0);
  for (int i = 1; i < 2 * N; i++)
    dcpxd_closer_close(fds[i]);
  dcpxd_buf *b;
  ck_assert_int_eq(dcpxd_buf_alloc(&dcpxd_mem_host, -1, 1 << 20, "t", &b), 0);
  int bfd = b->fd;
  dcpxd_buf_free(b);
  dcpxd_closer_stop(5000);
  ck_assert_msg(all_closed(fds, 2 * N), "an fd the closer took is open");
  ck_assert(all_closed(&bfd, 1));
  int late[2];
  ck_assert_int_eq(pipe(late), 0);
  dcpxd_closer_close(late[0]); /* stopped: at once */
  dcpxd_closer_close(late[1]);
  ck_assert(all_closed(late, 2));
  dcpxd_closer_close(-1); /* ignored */
}
END_TEST

int main(void) {
  Suite *s = suite_create("mem");
  TCase *tc = t_tcase(s, "host", T_TIMEOUT_DEFAULT);
  tcase_add_test(tc, test_zero_touched_only);
  tcase_add_test(tc, test_closer_closes_all);
  return t_suite_run(s);
}
