/* dcpxd-secrets.c - the groups this daemon created and their secrets
 * (dcpxd-secrets.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dcpxd-log.h"
#include "dcpxd-records.h"
#include "dcpxd-secrets.h"
#include "dcpxd-util.h"
#include "frame.h"

typedef struct entry {
  char name[DCPXD_GROUP_NAME_MAX + 1];
  uid_t owner;
  uint8_t secret[DCPX_CTL_SECRET_BYTES];
  uint32_t n_pids; /* 0: none known (an entry of an older dcpxd) */
  pid_t pid[DCPX_MAX_WORLD];
  /* when each pid's process started (/proc/PID/stat's starttime, clock
   * ticks since boot; 0: not known): a pid that another process took
   * since is not the rank's */
  uint64_t start[DCPX_MAX_WORLD];
  /* held by a process whose pid dcpxd cannot see (pid 0: SO_PEERCRED's
   * for another pid namespace), which may live; a pid 0 without it is a
   * rank held by none */
  bool unseen[DCPX_MAX_WORLD];
} entry;

#define BOOT_ID_LEN 36 /* /proc/sys/kernel/random/boot_id, a UUID */

struct dcpxd_secrets {
  char *path, *tmp;
  char boot[BOOT_ID_LEN + 1]; /* this boot's id, or "" (no procfs) */
  entry *e;
  size_t n;
  bool dirty; /* changes not saved yet (dcpxd_secrets_flush) */
  uint64_t retry_ns; /* after a failed flush: not before this (monotonic) */
  int save_error;    /* the last save's error (-errno), 0 once one works */
  uint64_t unseen_until_ns; /* an unseen holder counts as live until then
                               (monotonic; dcpxd_secrets_unseen_until) */
};

static int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* One line "NAME UID HEX [PID[@START],...]" into e; -EINVAL for anything
 * else: a name that is no group name (a Query reply listing it as an
 * unattached group would be refused by every client as not text), a uid
 * that is no uint32 (sscanf's %u took "-1" and wrapped 4294968296 to 1000)
 * or (uid_t)-1, a secret that is not 64 hex digits (%2x took "-1" and
 * "0x"). */
static int parse_line(const char *line, entry *e) {
  char name[DCPXD_GROUP_NAME_MAX + 2], uid_s[12];
  char hex[2 * DCPX_CTL_SECRET_BYTES + 2];
  uint32_t uid;
  int end = 0;

  /* each field one wider than it may be: a longer one is refused, never
   * cut (its rest would be read as the next field) */
  if (sscanf(line, "%64s %11s %65s %n", name, uid_s, hex, &end) != 3 ||
      !dcpx__group_name_ok(name) || dcpxd_parse_u32(uid_s, 10, &uid) < 0 ||
      (uid_t)uid == (uid_t)-1 || strlen(hex) != 2 * DCPX_CTL_SECRET_BYTES)
    return -EINVAL;
  for (size_t i = 0; i < DCPX_CTL_SECRET_BYTES; i++) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -EINVAL;
    e->secret[i] = (uint8_t)(hi << 4 | lo);
  }
  /* PID[@START],... of ranks 0..W-1 (0: not held; 0@0: held by a pid
   * not seen), absent in older files; @START (the process's start time)
   * too. */
  for (const char *p = line + end; *p && *p != '\n';) {
    char *q;
    long pid = strtol(p, &q, 10);
    unsigned long long start = 0;
    if (q == p || pid < 0 || pid > INT32_MAX || e->n_pids == DCPX_MAX_WORLD)
      return -EINVAL;
    e->unseen[e->n_pids] = pid == 0 && *q == '@';
    if (*q == '@') {
      const char *t = q + 1;
      if (*t < '0' || *t > '9')
        return -EINVAL;
      start = strtoull(t, &q, 10);
    }
    if (*q != ',' && *q != '\n' && *q != '\0')
      return -EINVAL;
    e->start[e->n_pids] = start;
    e->pid[e->n_pids++] = (pid_t)pid;
    p = *q == ',' ? q + 1 : q;
  }
  memcpy(e->name, name, strlen(name) + 1);
  e->owner = (uid_t)uid;
  return 0;
}

/* The file's first line, "#boot ID", names the boot its pids belong to
 * (absent in older files; '#' is no group name's). Returns 1 for that
 * line, after noting in *other_boot whether it is another boot than this
 * one. */
static int boot_line(const dcpxd_secrets *s, const char *line,
                     bool *other_boot) {
  char id[BOOT_ID_LEN + 2];
  if (strncmp(line, "#boot ", 6) != 0)
    return 0;
  if (sscanf(line + 6, "%37s", id) == 1 && s->boot[0] &&
      strcmp(id, s->boot) != 0)
    *other_boot = true;
  return 1;
}

/* Reads the entries. Those of another boot are dropped: every process
 * that held their ranks is gone, whatever pid it had. Returns 0, a
 * negative errno (the file could not be read), or 1: a file it may not
 * trust (logged here). */
static int load(dcpxd_secrets *s) {
  _cleanup_fclose_ FILE *f = NULL;
  _cleanup_free_ char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  unsigned lineno = 0;
  bool other_boot = false, torn = false;
  struct stat st;

  /* not through a link, and without waiting for a FIFO's writer */
  const int fd = open(s->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK |
                                   O_NOFOLLOW);
  if (fd < 0 && errno == ELOOP) {
    log_error("%s is not trusted: a symbolic link (the groups file must be "
              "a regular file of dcpxd's); check the file it names, then "
              "put it in place of the link, or remove the link",
              s->path);
    return 1;
  }
  if (fd < 0)
    return errno == ENOENT ? 0 : -errno;
  if (!(f = fdopen(fd, "r"))) {
    const int r = -errno;
    close(fd);
    return r;
  }
  /* Its secrets and owners decide who may adopt which group: a file that
   * another uid made (renamed into a state dir others may write), or that
   * others may write, may be forged. One that others may read (written by
   * an older dcpxd under a looser umask) is rewritten 0600 (prune_dead). */
  if (fstat(fileno(f), &st) < 0)
    return -errno;
  if (!S_ISREG(st.st_mode)) {
    log_error("%s is not trusted: not a regular file; remove it", s->path);
    return 1;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 022)) {
    log_error("%s is not trusted: owner uid %u, mode %04o (it must be "
              "dcpxd's, uid %u, and writable by it alone); check its lines, "
              "then chown and chmod 600 it, or remove it",
              s->path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
              (unsigned)geteuid());
    return 1; /* said: dcpxd_secrets_open adds no "Cannot read" */
  }
  if (st.st_mode & 044) {
    log_notice("%s is readable by others (mode %04o): rewritten for "
               "dcpxd's uid alone",
               s->path, (unsigned)(st.st_mode & 07777));
    s->dirty = true;
  }
  while ((len = getline(&line, &cap, f)) >= 0) {
    entry e = {0}, *ne;
    lineno++;
    /* dcpxd writes no NUL: a file with one is torn (below) */
    torn = torn || memchr(line, '\0', (size_t)len) != NULL;
    if (lineno == 1 && boot_line(s, line, &other_boot))
      continue;
    if (other_boot) {
      if (parse_line(line, &e) == 0)
        log_info("group=%s: forgotten, created before this machine "
                 "restarted (no process of its ranks is left)",
                 e.name);
      s->dirty = true;
      continue;
    }
    if (parse_line(line, &e) < 0) {
      log_warning("%s:%u: not a group entry, skipped", s->path, lineno);
      continue;
    }
    bool dup = false; /* the first holds: a second would come back when
                         the first is removed */
    for (size_t i = 0; i < s->n && !dup; i++)
      dup = strcmp(s->e[i].name, e.name) == 0;
    if (dup) {
      log_warning("%s:%u: group=%s: a second entry of the name, skipped",
                  s->path, lineno, e.name);
      continue;
    }
    ne = realloc(s->e, (s->n + 1) * sizeof(*ne));
    if (!ne)
      return -ENOMEM;
    s->e = ne;
    s->e[s->n++] = e;
  }
  /* A read error (EIO) is no end of file: the entries after it would be
   * forgotten, and the next save would drop them from the file for good. */
  if (ferror(f))
    return errno > 0 ? -errno : -EIO;
  /* NUL bytes are blocks a machine crash left unwritten: the save is not
   * synced (save_once), so the file is of an earlier boot, and a torn
   * one may have lost its #boot line to them, which would let its other
   * lines pass for this boot's entries. Every process of that boot is
   * gone: no entry is kept. */
  if (torn && s->n) {
    log_warning("%s holds NUL bytes (torn by a machine crash): its %zu "
                "entries are of an earlier boot, forgotten",
                s->path, s->n);
    s->n = 0;
    s->dirty = true;
  }
  return 0;
}

/* Puts the written file tmp in place of path, atomically to any reader.
 * A rename over an existing file makes ext4 (auto_da_alloc) and btrfs
 * start writing the new file's data before the rename returns, so that a
 * crash finds it whole: beside a write load the rename took up to 114 ms
 * of dcpxd's event loop (bench/RESULTS.md, session 33), which is the
 * fsync it was meant to spare. Exchanging the two names (renameat2
 * RENAME_EXCHANGE) is atomic too and starts no writeback; tmp then names
 * the old file, which is unlinked (one left by a crash is removed at
 * start, as any groups.tmp). Without the old file (the first save) or
 * where the exchange is not supported (an older kernel, some network file
 * systems, a seccomp filter that refuses renameat2), a plain rename
 * (whose real error, if any, is the one returned). 0 or a negative
 * errno. */
static int put_in_place(const char *tmp, const char *path) {
#if defined(HAVE_RENAMEAT2) && defined(RENAME_EXCHANGE)
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
    if (unlink(tmp) < 0 && errno != ENOENT)
      log_warning_errno(-errno, "Cannot remove the previous groups file, "
                                "now %s: %m", tmp);
    return 0;
  }
  if (errno != ENOENT && errno != EINVAL && errno != ENOSYS &&
      errno != EOPNOTSUPP && errno != EPERM && errno != EACCES)
    return -errno; /* EPERM, EACCES: a seccomp filter that refuses it */
#endif
  return rename(tmp, path) < 0 ? -errno : 0;
}

/* Writes every entry to the temporary file, then puts it in place. The
 * text is made in memory and written with write(2), every return checked:
 * a stdio stream drops a buffer whose write failed and goes on, so a
 * write error that a later one did not repeat (a disk full for a moment)
 * left a file with a hole in its middle, which the rename then put in
 * place of the good one.
 *
 * No fsync: the file serves only within one boot (its #boot line; a
 * group's memory lives in its ranks' processes, which a machine crash
 * ends), and what a dcpxd crash must find, the page cache keeps: the
 * rename is atomic to every later reader. The two fsyncs bought nothing
 * but a stall of the event loop behind the disk at every group formed
 * or left, every client's answer with it (bench/RESULTS.md, session 33:
 * a formation's worst case beside a write load 169-190 ms with them,
 * 0.6-114 ms without, the rest the rename's: put_in_place). A machine
 * crash may leave the file torn: load() drops a file with NUL bytes
 * whole. */
static int save_once(dcpxd_secrets *s) {
  _cleanup_free_ char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  int r = 0;

  if (!m)
    return log_warning_errno(-ENOMEM, "Cannot save %s: %m", s->path);
  if (s->boot[0])
    fprintf(m, "#boot %s\n", s->boot);
  for (size_t i = 0; i < s->n; i++) {
    fprintf(m, "%s %u ", s->e[i].name, (unsigned)s->e[i].owner);
    for (size_t k = 0; k < DCPX_CTL_SECRET_BYTES; k++)
      fprintf(m, "%02x", s->e[i].secret[k]);
    for (uint32_t k = 0; k < s->e[i].n_pids; k++) {
      fprintf(m, "%c%d", k ? ',' : ' ', (int)s->e[i].pid[k]);
      if (s->e[i].start[k] || s->e[i].unseen[k])
        fprintf(m, "@%llu", (unsigned long long)s->e[i].start[k]);
    }
    fputc('\n', m);
  }
  const bool failed = ferror(m);
  if (fclose(m) != 0 || failed)
    return log_warning_errno(-ENOMEM, "Cannot save %s: %m", s->path);
  /* 0600 whatever the umask: the reattach secrets are the groups' keys */
  const int fd = open(s->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC |
                                  O_NOFOLLOW, 0600);
  if (fd < 0) {
    r = -errno;
    return log_warning_errno(r, "Cannot write %s: %m", s->tmp);
  }
  r = dcpxd_write_all(fd, text, len, NULL);
  if (close(fd) < 0 && r == 0) /* a delayed write error (NFS, quota) */
    r = -errno;
  if (r < 0)
    (void)unlink(s->tmp); /* its room back; the file it would replace holds */
  if (r == 0)
    r = put_in_place(s->tmp, s->path);
  if (r < 0)
    log_warning_errno(r, "Cannot save %s: %m", s->path);
  else
    s->dirty = false;
  return r;
}

/* A save, whose outcome dcpxd_secrets_save_error keeps until the next:
 * while saves fail, no group can form (dcpxd_secrets_add fails), and the
 * operator's queries say so. */
static int save(dcpxd_secrets *s) {
  s->save_error = save_once(s);
  return s->save_error;
}

int dcpxd_secrets_save_error(const dcpxd_secrets *s) {
  return s ? s->save_error : 0;
}

const char *dcpxd_secrets_path(const dcpxd_secrets *s) {
  return s ? s->path : "";
}

/* /proc/PID/stat of pid, from the field after the command's closing
 * parenthesis (the state), into buf; NULL without it. */
static const char *proc_stat(pid_t pid, char *buf, size_t n) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  _cleanup_fclose_ FILE *f = fopen(path, "re");
  if (!f)
    return NULL;
  const size_t k = fread(buf, 1, n - 1, f);
  buf[k] = '\0';
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && p[2] ? p + 2 : NULL;
}

/* The start time of the state's process (the 20th field from the state,
 * starttime), or 0. */
static uint64_t stat_start(const char *state) {
  const char *p = state;
  for (int k = 0; k < 19 && p; k++)
    if ((p = strchr(p, ' ')))
      p++;
  return p ? strtoull(p, NULL, 10) : 0;
}

/* When process pid started (clock ticks since boot), or 0 (not known). */
static uint64_t proc_start(pid_t pid) {
  char buf[1024];
  const char *st = pid > 0 ? proc_stat(pid, buf, sizeof(buf)) : NULL;
  return st ? stat_start(st) : 0;
}

/* Whether the process of a rank lives: pid exists (kill 0; EPERM: another
 * uid's), is the process that took the rank (its start time, where both
 * are known: a pid can be reused), and is not a zombie (dead, its parent
 * has not reaped it yet). The state in /proc/PID/stat is that of the
 * thread-group leader, which reads Z also when only the main thread has
 * exited while other threads run on: then /proc/PID/status counts more
 * than one thread. */
bool dcpxd_pid_live(pid_t pid, uint64_t start) {
  char path[64], buf[1024];
  if (pid <= 0 || (kill(pid, 0) < 0 && errno != EPERM))
    return false;
  const char *st = proc_stat(pid, buf, sizeof(buf));
  if (!st)
    return true; /* no procfs: taken as alive */
  const uint64_t started = stat_start(st);
  if (start && started && started != start)
    return false; /* another process has the pid now */
  if (st[0] != 'Z')
    return true;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  _cleanup_fclose_ FILE *f = fopen(path, "re");
  if (!f)
    return false;
  const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = '\0';
  const char *p = strstr(buf, "\nThreads:");
  return p && strtol(p + 9, NULL, 10) > 1;
}

/* The ranks of e whose process lives (bit r). One whose pid dcpxd does
 * not see cannot be asked: it is taken as live until s->unseen_until_ns,
 * the time its process has to reattach (as an awaited rank of an adopted
 * group, dcpxd-group.c awaited_gone). */
static uint32_t live_mask(const dcpxd_secrets *s, const entry *e) {
  const bool unseen_live =
      e && dcpxd_now_ns(CLOCK_MONOTONIC) < s->unseen_until_ns;
  uint32_t mask = 0;
  for (uint32_t r = 0; e && r < e->n_pids && r < 32; r++)
    if (e->unseen[r] ? unseen_live : dcpxd_pid_live(e->pid[r], e->start[r]))
      mask |= 1u << r;
  return mask;
}

/* True if no process of the entry's ranks lives (dcpxd_pid_live): nobody can
 * reattach to the group (its memory went with its last process), so its
 * entry is dead. A pid reused by a process whose start time was not known
 * when the rank's was recorded (an older file) keeps an entry: then only
 * dcpxctl reset lets a Join of its name form a new group. An entry
 * without pids, or whose ranks are all held by none, is kept; one with a
 * rank held by a pid dcpxd does not see is kept too (live_mask). */
static bool entry_dead(const dcpxd_secrets *s, const entry *e) {
  bool held = false;

  for (uint32_t k = 0; k < e->n_pids; k++)
    held |= e->pid[k] > 0 || e->unseen[k];
  return held && live_mask(s, e) == 0;
}

/* At start: forgets the groups whose ranks are all gone, and saves the
 * file if any was. */
static void prune_dead(dcpxd_secrets *s) {
  size_t pruned = 0;

  for (size_t i = 0; i < s->n;) {
    if (entry_dead(s, &s->e[i])) {
      log_info("group=%s: forgotten, no process of its ranks is left to "
               "reattach",
               s->e[i].name);
      s->e[i] = s->e[--s->n];
      pruned++;
    } else {
      i++;
    }
  }
  if (pruned || s->dirty)
    (void)save(s);
}

/* This boot's id into out, or "" without one (no procfs: pids are then
 * taken as they are, as in files of older versions). */
static void read_boot_id(char out[BOOT_ID_LEN + 1]) {
  _cleanup_fclose_ FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  char id[BOOT_ID_LEN + 2] = "";
  out[0] = '\0';
  if (f && fgets(id, sizeof(id), f) && strlen(id) >= BOOT_ID_LEN) {
    id[BOOT_ID_LEN] = '\0';
    memcpy(out, id, BOOT_ID_LEN + 1);
  }
}

int dcpxd_secrets_open(const char *state_dir, dcpxd_secrets **ret) {
  dcpxd_secrets *s = calloc(1, sizeof(*s));
  int r;

  if (!s || asprintf(&s->path, "%s/groups", state_dir) < 0 ||
      asprintf(&s->tmp, "%s/groups.tmp", state_dir) < 0) {
    dcpxd_secrets_free(s);
    return -ENOMEM;
  }
  read_boot_id(s->boot);
  s->unseen_until_ns = UINT64_MAX;
  r = load(s);
  if (r != 0) {
    if (r < 0)
      log_error_errno(r, "Cannot read %s: %m; stopping rather than forget "
                         "the groups it holds",
                      s->path);
    else
      r = -EPERM; /* not trusted, said by load */
    dcpxd_secrets_free(s);
    return r;
  }
  /* A save cut short by a crash; the file it would have replaced holds. */
  if (unlink(s->tmp) == 0)
    log_notice("Removed %s, left by an unfinished save", s->tmp);
  log_info("Groups: %s, %zu created before", s->path, s->n);
  prune_dead(s);
  *ret = s;
  return 0;
}

dcpxd_secrets *dcpxd_secrets_free(dcpxd_secrets *s) {
  if (s) {
    free(s->path);
    free(s->tmp);
    free(s->e);
    free(s);
  }
  return NULL;
}

static entry *find(const dcpxd_secrets *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->e[i].name, name) == 0)
      return &s->e[i];
  return NULL;
}

/* No rank of e held by any process. */
static void entry_clear_ranks(entry *e) {
  memset(e->pid, 0, sizeof(e->pid));
  memset(e->start, 0, sizeof(e->start));
  memset(e->unseen, 0, sizeof(e->unseen));
}

/* Rank r of e held by pid (0: by a process whose pid dcpxd does not see)
 * or by none (DCPXD_PID_NONE). */
static void rank_set(entry *e, uint32_t r, pid_t pid) {
  e->pid[r] = pid > 0 ? pid : 0;
  e->start[r] = proc_start(pid);
  e->unseen[r] = pid == 0;
}

int dcpxd_secrets_add(dcpxd_secrets *s, const char *name, uid_t owner,
                      uint32_t world, const pid_t *pids,
                      uint8_t secret[DCPX_CTL_SECRET_BYTES]) {
  entry *e = find(s, name);

  if (world > DCPX_MAX_WORLD)
    return -EINVAL;
  if (getrandom(secret, DCPX_CTL_SECRET_BYTES, 0) != DCPX_CTL_SECRET_BYTES)
    return -EIO;
  if (!e) {
    entry *ne = realloc(s->e, (s->n + 1) * sizeof(*ne));
    if (!ne)
      return -ENOMEM;
    s->e = ne;
    e = &s->e[s->n++];
    memset(e, 0, sizeof(*e));
    dcpxd_bprintf(e->name, "%s", name);
  }
  e->owner = owner;
  memcpy(e->secret, secret, DCPX_CTL_SECRET_BYTES);
  entry_clear_ranks(e);
  for (uint32_t r = 0; r < world; r++)
    rank_set(e, r, pids[r]);
  e->n_pids = world;
  return save(s);
}

void dcpxd_secrets_set_pid(dcpxd_secrets *s, const char *name, uint32_t world,
                           uint32_t rank, pid_t pid) {
  entry *e = find(s, name);

  if (!e || world > DCPX_MAX_WORLD || rank >= world)
    return;
  if (e->n_pids != world) {
    entry_clear_ranks(e);
    e->n_pids = world;
  } else if (pid > 0 ? e->pid[rank] == pid && e->start[rank]
                     : e->pid[rank] == 0 && e->unseen[rank] == (pid == 0)) {
    return;
  }
  rank_set(e, rank, pid);
  s->dirty = true;
}

bool dcpxd_secrets_remove(dcpxd_secrets *s, const char *name) {
  entry *e = find(s, name);

  if (!e)
    return false;
  *e = s->e[--s->n];
  s->dirty = true;
  return true;
}

/* A flush that failed (a full disk, a read-only state dir) is tried
 * again a second later, not on every turn of the loop. */
#define FLUSH_RETRY_NS 1000000000ull

int dcpxd_secrets_flush(dcpxd_secrets *s) {
  if (!s || !s->dirty)
    return 0;
  const uint64_t now = dcpxd_now_ns(CLOCK_MONOTONIC);
  if (now < s->retry_ns)
    return 0;
  const int r = save(s);
  s->retry_ns = r < 0 ? now + FLUSH_RETRY_NS : 0;
  return r;
}

int dcpxd_secrets_flush_last(dcpxd_secrets *s) {
  if (!s || !s->dirty)
    return 0;
  s->retry_ns = 0; /* however recent the last failed try */
  const int r = dcpxd_secrets_flush(s);
  if (r < 0)
    log_error_errno(r,
                    "Cannot save %s at shutdown (%m): its latest changes "
                    "are lost, the next dcpxd reads it as last saved",
                    s->path);
  return r;
}

size_t dcpxd_secrets_count(const dcpxd_secrets *s) { return s ? s->n : 0; }

const char *dcpxd_secrets_entry(const dcpxd_secrets *s, size_t i,
                                uid_t *owner, uint32_t *n_pids) {
  if (!s || i >= s->n)
    return NULL;
  *owner = s->e[i].owner;
  *n_pids = s->e[i].n_pids;
  return s->e[i].name;
}

uint32_t dcpxd_secrets_live(const dcpxd_secrets *s, const char *name) {
  return s ? live_mask(s, find(s, name)) : 0;
}

uint32_t dcpxd_secrets_live_at(const dcpxd_secrets *s, size_t i) {
  return s && i < s->n ? live_mask(s, &s->e[i]) : 0;
}

void dcpxd_secrets_unseen_until(dcpxd_secrets *s, uint64_t until_ns) {
  if (s)
    s->unseen_until_ns = until_ns;
}

bool dcpxd_secrets_rank_live(const dcpxd_secrets *s, const char *name,
                             uint32_t rank, pid_t pid) {
  const entry *e = s ? find(s, name) : NULL;
  const bool known = e && rank < e->n_pids && e->pid[rank] == pid;
  return dcpxd_pid_live(pid, known ? e->start[rank] : 0);
}

bool dcpxd_secrets_forget_rank(dcpxd_secrets *s, const char *name,
                               uint32_t rank, pid_t pid) {
  entry *e = s ? find(s, name) : NULL;
  if (!e || pid <= 0 || rank >= e->n_pids || e->pid[rank] != pid)
    return false;
  rank_set(e, rank, DCPXD_PID_NONE);
  s->dirty = true;
  return true;
}

bool dcpxd_secrets_match(const dcpxd_secrets *s, const char *name,
                         const uint8_t secret[DCPX_CTL_SECRET_BYTES],
                         uid_t *owner) {
  const entry *e = find(s, name);
  uint8_t diff = 0;

  if (!e)
    return false;
  for (size_t i = 0; i < DCPX_CTL_SECRET_BYTES; i++)
    diff |= e->secret[i] ^ secret[i];
  if (diff)
    return false;
  *owner = e->owner;
  return true;
}
