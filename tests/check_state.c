/* check_state.c - dcpxd's groups file (daemon/dcpxd-secrets.c) as a
 * restart reads it: damaged, hand-edited or hostile lines are skipped and
 * the good ones kept; a file dcpxd cannot read whole stops it instead of
 * being taken as shorter than it is. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_proc.h"
#include "dcpxd-secrets.h"

static char g_dir[64];

/* write(2), this program's own (dcpxd-secrets.c, linked in, calls it):
 * WRITE_SHORT writes 16 bytes of the next write, WRITE_SHORT_THEN_FAIL
 * fails the one after that too (ENOSPC); each goes back to WRITE_PLAIN
 * once done. */
enum { WRITE_PLAIN, WRITE_SHORT, WRITE_SHORT_THEN_FAIL, WRITE_FAIL };
static int g_write;
/* dcpxd's log lines (one write(2) each to stderr), kept here too */
static char g_log[8192];
static size_t g_log_len;
ssize_t write(int fd, const void *buf, size_t n) {
  if (fd == STDERR_FILENO && n < sizeof(g_log) - g_log_len) {
    memcpy(g_log + g_log_len, buf, n);
    g_log_len += n;
    g_log[g_log_len] = '\0';
  }
  if (g_write == WRITE_FAIL) {
    g_write = WRITE_PLAIN;
    errno = ENOSPC;
    return -1;
  }
  if (g_write != WRITE_PLAIN && n > 16) {
    g_write = g_write == WRITE_SHORT_THEN_FAIL ? WRITE_FAIL : WRITE_PLAIN;
    n = 16;
  }
  return syscall(SYS_write, fd, buf, n);
}

/* rename(2) and renameat2(2), this program's own too: counted, and
 * renameat2 made to fail with g_renameat2_errno when it is not 0 (a file
 * system without RENAME_EXCHANGE). */
static int g_renames, g_exchanges, g_renameat2_errno;
int rename(const char *from, const char *to) {
  g_renames++;
  return (int)syscall(SYS_rename, from, to);
}
#ifdef HAVE_RENAMEAT2
int renameat2(int fd1, const char *from, int fd2, const char *to,
              unsigned int flags) {
  if (g_renameat2_errno) {
    errno = g_renameat2_errno;
    return -1;
  }
  const int r = (int)syscall(SYS_renameat2, fd1, from, fd2, to, flags);
  g_exchanges += r == 0;
  return r;
}
#endif

static void remove_dir(void) { dp_rm_tree(g_dir); }

/* Whether the file system of dir takes renameat2(RENAME_EXCHANGE). */
static int exchange_works(const char *dir) {
#ifdef HAVE_RENAMEAT2
  char a[128], b[128];
  snprintf(a, sizeof(a), "%s/.xa", dir);
  snprintf(b, sizeof(b), "%s/.xb", dir);
  close(open(a, O_WRONLY | O_CREAT, 0600));
  close(open(b, O_WRONLY | O_CREAT, 0600));
  const int ok = (int)syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b,
                              RENAME_EXCHANGE) == 0;
  unlink(a);
  unlink(b);
  return ok;
#else
  (void)dir;
  return 0;
#endif
}

/* A fresh state dir (g_dir) whose groups file holds the n bytes of text
 * (NULs too), of `mode`. */
static void groups_file_n(const char *text, size_t n, mode_t mode) {
  char path[128];
  snprintf(g_dir, sizeof(g_dir), "%s", "/tmp/dcpx-state.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
  snprintf(path, sizeof(path), "%s/groups", g_dir);
  const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, n), (ssize_t)n);
  ck_assert_int_eq(fchmod(fd, mode), 0);
  close(fd);
}

static void groups_file(const char *text, mode_t mode) {
  groups_file_n(text, strlen(text), mode);
}

#define HEX62 "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define HEX0 "00" HEX62 /* the secret 0, 1, ..., 31 */

/* Lines that are no entry dcpxd wrote are skipped, each on its own: the
 * good lines around them are kept. Before, a name of any bytes was taken
 * (a Query reply listing it as an unattached group was then refused by
 * every client: dcpxctl groups and health failed, check said CRITICAL),
 * and so were uids that sscanf's %u wrapped (4294968296 became uid 1000,
 * "-1" 4294967295) and secrets that %2x read leniently ("-1" as 0xff);
 * a second entry of a name came back once the first was removed. */
START_TEST(test_groups_bad_lines) {
  dcpxd_secrets *s = NULL;
  uid_t owner = 0;
  uint32_t n_pids = 0;
  uint8_t secret[32];

  groups_file("good 1000 " HEX0 " 0\n"
              "bad\xffname 1000 " HEX0 " 0\n"
              "a/b 1000 " HEX0 " 0\n"
              "wrapped 4294968296 " HEX0 " 0\n"
              "negative -1 " HEX0 " 0\n"
              "nouid 4294967295 " HEX0 " 0\n"
              "minus 1000 -1" HEX62 " 0\n"
              "prefix 1000 0x" HEX62 " 0\n"
              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
              "1000 1001 " HEX0 " 0\n" /* a 67-byte name, cut at 63 */
              "good 1001 " HEX0 " 0\n" /* a second "good" */
              "old 1002 " HEX0 "\n",   /* an older dcpxd's: no pids */
              0600);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 2);
  ck_assert_str_eq(dcpxd_secrets_entry(s, 0, &owner, &n_pids), "good");
  ck_assert_uint_eq(owner, 1000);
  ck_assert_uint_eq(n_pids, 1);
  ck_assert_str_eq(dcpxd_secrets_entry(s, 1, &owner, &n_pids), "old");
  ck_assert_uint_eq(owner, 1002);
  ck_assert_uint_eq(n_pids, 0);
  for (int i = 0; i < 32; i++)
    secret[i] = (uint8_t)i;
  ck_assert(dcpxd_secrets_match(s, "good", secret, &owner));
  ck_assert_uint_eq(owner, 1000);
  ck_assert(dcpxd_secrets_remove(s, "good"));
  ck_assert(!dcpxd_secrets_match(s, "good", secret, &owner));
  dcpxd_secrets_free(s);
  remove_dir();
}
END_TEST

/* A groups file with NUL bytes, torn by a machine crash (dcpxd does not
 * sync it, and writes no NUL): its entries are of an earlier boot, and
 * are all forgotten. Before, a first block of NULs swallowed the #boot
 * line, and the entries after it passed for this boot's: one whose rank
 * was held unseen (0@0) showed as an unattached group, its name blocked. */
START_TEST(test_groups_torn) {
  static const char tail[] = "g1 1000 " HEX0 " 0@0\n"
                             "g2 1000 " HEX0 " 0@0\n";
  char path[128], block[4096 + sizeof(tail)];
  dcpxd_secrets *s = NULL;

  memset(block, 0, 4096);
  memcpy(block + 4096, tail, sizeof(tail));
  groups_file_n(block, 4096 + strlen(tail), 0600);
  snprintf(path, sizeof(path), "%s/groups", g_dir);
  g_log_len = 0;
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 0);
  ck_assert_uint_eq(dcpxd_secrets_live(s, "g2"), 0);
  ck_assert_msg(strstr(g_log, "holds NUL bytes (torn by a machine crash)"),
                "%s", g_log);
  /* the file is written anew without them */
  ck_assert_int_eq(dcpxd_secrets_flush(s), 0);
  dcpxd_secrets_free(s);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  const size_t n = fread(block, 1, sizeof(block) - 1, f);
  fclose(f);
  block[n] = '\0';
  ck_assert_msg(strlen(block) == n && !strstr(block, "g2"), "%zu bytes: %s",
                n, block);
  remove_dir();
}
END_TEST

/* A groups file that cannot be read to its end stops dcpxd: before, a
 * read error counted as the end of the file, dcpxd started without the
 * entries after it and its next save dropped them from the file for good
 * (their groups could never reattach). The case was a directory, which
 * opens and fails every read with EISDIR; a groups file that is no
 * regular file is now refused before any read, which stops dcpxd too. */
START_TEST(test_groups_read_error) {
  dcpxd_secrets *s = NULL;
  char path[128];
  snprintf(g_dir, sizeof(g_dir), "%s", "/tmp/dcpx-state.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
  snprintf(path, sizeof(path), "%s/groups", g_dir);
  ck_assert_int_eq(mkdir(path, 0700), 0);
  g_log_len = 0;
  g_log[0] = '\0';
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), -EPERM);
  ck_assert_ptr_null(s);
  ck_assert_msg(strstr(g_log, "not a regular file"), "log: %s", g_log);
  remove_dir();
}
END_TEST

/* The groups file's secrets and owners decide who may adopt which group
 * after a restart: a file that others may write, or that another uid made
 * (renamed into a state dir whose mode was loosened), stops dcpxd instead
 * of being trusted. One that others may only read (an older dcpxd wrote it
 * under a looser umask) is rewritten for dcpxd's uid alone. */
START_TEST(test_groups_not_trusted) {
  dcpxd_secrets *s = NULL;
  char path[128];
  struct stat st;

  g_log_len = 0;
  g_log[0] = '\0';
  groups_file("forged 1000 " HEX0 " 0\n", 0666);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), -EPERM);
  ck_assert_ptr_null(s);
  /* said once, as what it is: it was read, not unreadable */
  ck_assert_msg(strstr(g_log, "is not trusted") &&
                    !strstr(g_log, "Cannot read"),
                "log: %s", g_log);
  remove_dir();
  groups_file("forged 1000 " HEX0 " 0\n", 0620);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), -EPERM);
  remove_dir();
  if (geteuid() == 0) { /* a file of another uid */
    groups_file("forged 1000 " HEX0 " 0\n", 0600);
    snprintf(path, sizeof(path), "%s/groups", g_dir);
    ck_assert_int_eq(chown(path, 65534, 65534), 0);
    ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), -EPERM);
    remove_dir();
  }
  /* a link to a file that would pass (dcpxd's, 0600), and a FIFO, whose
   * open waited for a writer */
  groups_file("linked 1000 " HEX0 " 0\n", 0600);
  {
    char target[128];
    snprintf(path, sizeof(path), "%s/groups", g_dir);
    snprintf(target, sizeof(target), "%s/elsewhere", g_dir);
    ck_assert_int_eq(rename(path, target), 0);
    ck_assert_int_eq(symlink(target, path), 0);
    g_log_len = 0;
    ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), -EPERM);
    ck_assert_msg(strstr(g_log, "a symbolic link"), "log: %s", g_log);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), -EPERM);
    remove_dir();
  }
  groups_file("kept 1000 " HEX0 " 0\n", 0644);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 1);
  snprintf(path, sizeof(path), "%s/groups", g_dir);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_msg((st.st_mode & 077) == 0, "groups file mode %o",
                (unsigned)(st.st_mode & 0777));
  dcpxd_secrets_free(s);
  remove_dir();
}
END_TEST

/* The groups file as it is on disk. */
static void groups_text(char *buf, size_t n) {
  char path[128];
  snprintf(path, sizeof(path), "%s/groups", g_dir);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  const size_t k = fread(buf, 1, n - 1, f);
  buf[k] = '\0';
  fclose(f);
}

/* A save whose write fails (a disk full for a moment: a short write, then
 * ENOSPC) fails, leaves the file it would have replaced as it was and no
 * groups.tmp; a short write alone is carried on. Before, the file went
 * through stdio, which drops a buffer whose write failed and goes on: a
 * failure that the next write did not repeat left a file with a hole in
 * its middle, and the rename put it in place of the good one. */
START_TEST(test_groups_failed_write) {
  dcpxd_secrets *s = NULL;
  uint8_t secret[32];
  const pid_t pids[16] = {0};
  char before[4096], after[4096], tmp[128];
  dcpxd_secrets *t = NULL;

  groups_file("kept 1000 " HEX0 " 0\n", 0600);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  groups_text(before, sizeof(before));
  g_write = WRITE_SHORT_THEN_FAIL;
  const int r = dcpxd_secrets_add(s, "new", 1000, 16, pids, secret);
  const int left = g_write;
  g_write = WRITE_PLAIN;
  ck_assert_int_eq(left, WRITE_PLAIN); /* the save wrote through write(2) */
  ck_assert_int_eq(r, -ENOSPC);
  groups_text(after, sizeof(after));
  ck_assert_str_eq(after, before);
  snprintf(tmp, sizeof(tmp), "%s/groups.tmp", g_dir);
  ck_assert_int_ne(access(tmp, F_OK), 0);
  /* a short write alone is no error: the rest follows */
  g_write = WRITE_SHORT;
  ck_assert_int_eq(dcpxd_secrets_add(s, "new", 1000, 16, pids, secret), 0);
  g_write = WRITE_PLAIN;
  dcpxd_secrets_free(s);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &t), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(t), 2);
  dcpxd_secrets_free(t);
  remove_dir();
}
END_TEST

/* A save replaces the file without a rename over it: ext4 and btrfs start
 * writing a file renamed over another before the rename returns, which
 * held dcpxd's event loop up to 114 ms beside a write load (session 33;
 * 0.2-0.3 ms with the exchange, bench/RESULTS.md, session 34). The names
 * are exchanged and the old file unlinked: no groups.tmp is left, and
 * the file holds the new entries. The first save (no file to exchange
 * with), and a file system without the exchange, rename. */
START_TEST(test_groups_exchanged) {
  dcpxd_secrets *s = NULL, *t = NULL;
  uint8_t secret[32];
  const pid_t pids[16] = {0};
  char text[4096], tmp[128], path[128];

  snprintf(g_dir, sizeof(g_dir), "%s", "/tmp/dcpx-state.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
  snprintf(tmp, sizeof(tmp), "%s/groups.tmp", g_dir);
  snprintf(path, sizeof(path), "%s/groups", g_dir);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  g_renames = g_exchanges = 0;
  ck_assert_int_eq(dcpxd_secrets_add(s, "first", 1000, 2, pids, secret), 0);
  ck_assert_int_eq(g_renames, 1); /* nothing to exchange with */
  ck_assert_int_eq(access(path, F_OK), 0);
  ck_assert_int_ne(access(tmp, F_OK), 0);
  g_renames = 0;
  ck_assert_int_eq(dcpxd_secrets_add(s, "second", 1000, 2, pids, secret), 0);
#ifdef HAVE_RENAMEAT2
  /* where /tmp's file system has the exchange (not NFS, some FUSE) */
  ck_assert_int_eq(g_renames, !exchange_works(g_dir));
  ck_assert_int_eq(g_exchanges, exchange_works(g_dir));
  /* no exchange on this file system: a rename, the same file */
  g_renameat2_errno = EINVAL;
  ck_assert_int_eq(dcpxd_secrets_add(s, "third", 1000, 2, pids, secret), 0);
  g_renameat2_errno = 0;
  ck_assert_int_eq(g_renames, 1);
#else
  ck_assert_int_eq(dcpxd_secrets_add(s, "third", 1000, 2, pids, secret), 0);
#endif
  ck_assert_int_ne(access(tmp, F_OK), 0);
  text[0] = '\n'; /* each entry after a newline, the first one too */
  groups_text(text + 1, sizeof(text) - 1);
  ck_assert_msg(strstr(text, "\nfirst ") && strstr(text, "\nsecond ") &&
                    strstr(text, "\nthird "),
                "groups file: %s", text);
  dcpxd_secrets_free(s);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &t), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(t), 3);
  dcpxd_secrets_free(t);
  remove_dir();
}
END_TEST

/* A change whose save failed (a full disk) is tried again at exit however
 * recent the failed save: before, the retry waited a second after it, and
 * the last flush at shutdown, inside that second, saved nothing and said
 * nothing (the change was lost). When that last try fails too it is
 * logged as an error. */
START_TEST(test_groups_saved_at_exit) {
  dcpxd_secrets *s = NULL, *t = NULL;
  char text[4096];
  uid_t owner = 0;
  uint32_t n_pids = 0;

  groups_file("gone 1000 " HEX0 " 0\n"
              "kept 1000 " HEX0 " 0\n",
              0600);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert(dcpxd_secrets_remove(s, "gone"));
  g_write = WRITE_FAIL;
  ck_assert_int_eq(dcpxd_secrets_flush(s), -ENOSPC);
  g_write = WRITE_PLAIN;
  ck_assert_int_eq(dcpxd_secrets_flush(s), 0); /* within the second: waits */
  groups_text(text, sizeof(text));
  ck_assert_ptr_nonnull(strstr(text, "gone "));
  /* the last try fails too: said as an error */
  g_log_len = 0;
  g_log[0] = '\0';
  g_write = WRITE_FAIL;
  ck_assert_int_eq(dcpxd_secrets_flush_last(s), -ENOSPC);
  g_write = WRITE_PLAIN;
  ck_assert_msg(strstr(g_log, "at shutdown") && strstr(g_log, "lost"),
                "log: %s", g_log);
  /* and one that succeeds, at once */
  ck_assert_int_eq(dcpxd_secrets_flush_last(s), 0);
  dcpxd_secrets_free(s);
  groups_text(text, sizeof(text));
  ck_assert_msg(!strstr(text, "gone "), "groups file: %s", text);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &t), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(t), 1);
  ck_assert_str_eq(dcpxd_secrets_entry(t, 0, &owner, &n_pids), "kept");
  dcpxd_secrets_free(t);
  remove_dir();
}
END_TEST

/* A pid that no process has: a child's, reaped. */
static pid_t dead_pid(void) {
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0)
    _exit(0);
  ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
  return pid;
}

/* A rank held by a process whose pid dcpxd cannot see (SO_PEERCRED's 0:
 * another pid namespace) may live: its group is kept at start, and counts
 * the rank as live, even when its other ranks' processes are gone.
 * Before, such a rank was written as 0, as a rank held by no process: a
 * group with one dead rank of a pid dcpxd saw and one live rank of a pid
 * it did not see was forgotten at start, and the live rank's reattach was
 * then refused ("its control page's secret is not that of a group NAME
 * this dcpxd created"). A rank that is left is held by none, and an entry
 * whose ranks are gone or left goes. */
START_TEST(test_groups_unseen_rank) {
  dcpxd_secrets *s = NULL;
  uint8_t secret[32];
  char text[4096], want[64];
  const pid_t pids[2] = {dead_pid(), 0};

  groups_file("", 0600);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_int_eq(dcpxd_secrets_add(s, "mixed", 1000, 2, pids, secret), 0);
  dcpxd_secrets_free(s);
  groups_text(text, sizeof(text));
  snprintf(want, sizeof(want), " %d,0@0\n", (int)pids[0]);
  ck_assert_msg(strstr(text, want), "groups file: %s", text);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 1);
  ck_assert_uint_eq(dcpxd_secrets_live(s, "mixed"), 0x2);
  /* past the time it had to reattach (dcpxd's join timeout from its
   * start), an unseen rank no longer counts as live; its entry stays */
  dcpxd_secrets_unseen_until(s, 0);
  ck_assert_uint_eq(dcpxd_secrets_live(s, "mixed"), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 1);
  dcpxd_secrets_unseen_until(s, UINT64_MAX);
  /* its rank left: held by none, the entry goes at the next start */
  dcpxd_secrets_set_pid(s, "mixed", 2, 1, DCPXD_PID_NONE);
  ck_assert_uint_eq(dcpxd_secrets_live(s, "mixed"), 0);
  ck_assert_int_eq(dcpxd_secrets_flush(s), 0);
  dcpxd_secrets_free(s);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 0);
  dcpxd_secrets_free(s);
  remove_dir();
}
END_TEST

/* A rank that a process dcpxd cannot see takes over (a reattach, a
 * replacement) is recorded as held too; "0", as older dcpxd versions
 * wrote every such rank, still reads as a rank held by none, and "0@0"
 * as one held unseen (older versions read that as 0). */
START_TEST(test_groups_unseen_set_pid) {
  dcpxd_secrets *s = NULL;
  char text[1024];
  const int dead = (int)dead_pid(), self = (int)getpid();

  snprintf(text, sizeof(text),
           "old 1000 " HEX0 " %d,0\n"
           "new 1000 " HEX0 " %d,0@0\n"
           "later 1000 " HEX0 " %d,%d,%d\n",
           dead, dead, dead, self, dead);
  groups_file(text, 0600);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 2);
  ck_assert_uint_eq(dcpxd_secrets_live(s, "new"), 0x2);
  ck_assert_uint_eq(dcpxd_secrets_live(s, "later"), 0x2);
  dcpxd_secrets_set_pid(s, "later", 3, 1, 0); /* an unseen replacement */
  ck_assert_uint_eq(dcpxd_secrets_live(s, "later"), 0x2);
  ck_assert_int_eq(dcpxd_secrets_flush(s), 0);
  dcpxd_secrets_free(s);
  groups_text(text, sizeof(text));
  ck_assert_msg(strstr(text, ",0@0,"), "groups file: %s", text);
  ck_assert_int_eq(dcpxd_secrets_open(g_dir, &s), 0);
  ck_assert_uint_eq(dcpxd_secrets_count(s), 2);
  ck_assert_uint_eq(dcpxd_secrets_live(s, "later"), 0x2);
  dcpxd_secrets_free(s);
  remove_dir();
}
END_TEST

int main(void) {
  Suite *su = suite_create("state");
  TCase *tc = t_tcase(su, "groups", T_TIMEOUT_DEFAULT);
  tcase_add_test(tc, test_groups_bad_lines);
  tcase_add_test(tc, test_groups_torn);
  tcase_add_test(tc, test_groups_read_error);
  tcase_add_test(tc, test_groups_not_trusted);
  tcase_add_test(tc, test_groups_failed_write);
  tcase_add_test(tc, test_groups_saved_at_exit);
  tcase_add_test(tc, test_groups_exchanged);
  tcase_add_test(tc, test_groups_unseen_rank);
  tcase_add_test(tc, test_groups_unseen_set_pid);
  return t_suite_run(su);
}
