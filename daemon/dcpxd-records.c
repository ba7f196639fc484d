/* dcpxd-records.c - durable, bounded storage of wait records.
 *
 * File format. STATE_DIR/records.log is an append-only sequence of fixed
 * 128-byte entries, little-endian:
 *
 *     off  size  field
 *       0     4  magic 0x52504344 ("DCPR")
 *       4     2  format version (1)
 *       6     2  entry size (128)
 *       8    64  group name, NUL padded
 *      72  8x4   generation, rank, kind, region, index, expected, seen,
 *                block
 *     104     8  time_ns
 *     112     8  call_tag
 *     120     4  awaited rank + 1 (0: unknown)
 *     124     4  CRC-32 (zlib) of bytes 0..123
 *
 * The awaited rank (dcpxd_record.awaited_rank, worked out at the harvest
 * from the group's layout) is stored as rank + 1 in the word at 120, which
 * was "reserved (0)" until dcpxd stored it there: every older dcpxd wrote
 * 0 there, which reads as unknown. A value above DCPX_MAX_WORLD (no rank
 * of any group: a damaged or forged entry whose CRC still holds, or a
 * later format's use of the word) reads as unknown too, never as a rank.
 * The format version stays 1, on purpose (docs/PROTOCOL.md 6.3):
 *   - an older dcpxd (format version 1 without the field) checks the
 *     magic, version, size and CRC of an entry, never the reserved word
 *     (the CRC covers it as written: checked at 9b5b5f5 and every
 *     version of this file since 7dcff36), so it reads a newer dcpxd's
 *     entries whole and ignores the word: after a downgrade the records
 *     are all there, their awaited rank unknown, and no entry is skipped
 *     or counted as corrupted. (A format version 2 would have made an
 *     older dcpxd skip every newer entry as corrupted.) It never rewrites
 *     an entry (appends; rotation renames the file), so the awaited rank
 *     is still in the entries a newer dcpxd wrote when it is upgraded
 *     again.
 *   - a newer dcpxd reads an older one's entries (0 there) as records
 *     whose awaited rank is unknown, as they were before.
 *   Both files, records.log and records.log.1, may mix entries of both;
 *   each entry is read on its own.
 *
 * Invariants:
 *   1. Every record is written and fdatasync'd in append order: before
 *      dcpxd_records_append returns without a loop, else by a worker
 *      thread (dcpxd_records_use_loop), one batch at a time, so that the
 *      event loop never waits for the disk; a record is on disk once its
 *      batch ended without error, and dcpxd's exit waits for the batch
 *      in flight.
 *   2. Entries sit at multiples of 128 from the start of their file. A
 *      torn write can leave a partial entry only at the end; at startup
 *      such a tail is counted and cut off (ftruncate), so that later
 *      appends stay aligned.
 *   3. records.log never grows past max_bytes: before an append that would,
 *      it is renamed to records.log.1 (replacing the previous one) and a new
 *      records.log is started. The disk use is therefore at most
 *      2 * max_bytes.
 *   4. Reading never fails on content: an entry with a bad magic, version,
 *      size or CRC is skipped and counted; the count is logged and reported
 *      to queries (dcpxd_records_note).
 *   5. Memory is bounded: only the newest `ring` records are kept (a ring
 *      buffer), however many alarms arrive. At start only those are read,
 *      from the end of records.log and then of records.log.1 (load_tail):
 *      with valid newest entries the start takes no longer with
 *      records-max-bytes of a TiB (a file whose tail is damaged is read
 *      back until its valid entries, or whole, but never past 16 MiB of
 *      damaged entries: a file of garbage does not hold the start).
 *   6. A record that could not be written (disk full, an I/O error) waits
 *      in a bounded backlog (`ring` records; beyond that the oldest are
 *      counted as lost) and is written, in order and before any newer
 *      one, by the next append (without a loop) or retry
 *      (dcpxd_records_retry, which dcpxd calls every second while writes
 *      fail). Records that
 *      come while a write that works is in flight queue in the same
 *      backlog, which may then grow to BACKLOG_GROW rings (a mapping,
 *      given back when it drains) before the oldest are dropped: a slow
 *      disk delays them, and loses none short of that.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>
#include <zlib.h>

#include "dcpx.h"
#include "dcpxd-log.h"
#include "dcpxd-records.h"
#include "dcpxd-util.h"

#define REC_MAGIC 0x52504344u /* "DCPR" */
/* Records queued behind a write in flight (not failing) may fill this
 * many rings before the oldest are dropped: a node's groups aborting
 * together harvest up to 1024 records each while a slow disk holds one
 * batch. While writes fail, the backlog keeps one ring (its bound). */
#define BACKLOG_GROW 16u
#define REC_VERSION 1u
#define REC_SIZE 128u
#define REC_AWAITED_OFF 120u
#define REC_CRC_OFF 124u

struct dcpxd_records {
  char *dir, *path, *path_old;
  int fd;
  uint64_t size, max_bytes;
  dcpxd_record *ring;
  size_t cap, head, count; /* head: index of the oldest */
  dcpxd_record *backlog;   /* not yet written, oldest first (bcap) */
  size_t n_backlog, bcap;  /* bcap: cap, or up to BACKLOG_GROW * cap while
                              a write that works is in flight */
  uint64_t lost; /* records the backlog had no room for while writes failed */
  uint64_t dropped; /* records past BACKLOG_GROW rings behind a write that
                       worked (a burst faster than the disk) */
  uint64_t dropped_said; /* of them, logged */
  int write_error; /* the last write's error, while the backlog holds any */
  uint64_t corrupt, truncated, loaded;
  uint64_t skipped; /* older entries not read at start (load_tail) */
  unsigned cut;     /* files whose damage stopped load_tail */
  char note[512];
  /* The writer. A batch (wbuf) leaves the backlog and is written by
   * write_batch: on a libuv worker thread once dcpxd_records_use_loop
   * gave a loop (so that a disk busy with other writes never holds the
   * event loop for the fdatasync), else in the caller. While a batch is
   * busy, the worker alone touches fd, size and the w_ fields, and the
   * loop thread everything else; batch_done, on the loop thread, takes
   * the outcome and logs what the worker must not (the log is the loop
   * thread's). */
  uv_loop_t *loop;
  void (*on_unstored)(void *); /* a write failed: a retry is wanted */
  void *on_unstored_arg;
  uv_work_t work;
  bool busy;
  dcpxd_record *wbuf; /* cap of them */
  size_t n_wbuf, w_done;
  int w_r;               /* write_entries' outcome */
  unsigned w_rotations;  /* files rotated */
  int w_sync_err;        /* a rotated file's fdatasync failed */
  int w_rot_err;         /* rotating failed: rename (w_rot_create 0), */
  bool w_rot_create;     /* or creating the new file */
};

static void put32(uint8_t *p, uint32_t v) {
  v = htole32(v);
  memcpy(p, &v, 4);
}
static void put64(uint8_t *p, uint64_t v) {
  v = htole64(v);
  memcpy(p, &v, 8);
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return le32toh(v);
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return le64toh(v);
}

static uint32_t crc_of(const uint8_t *e) {
  return (uint32_t)crc32(crc32(0L, Z_NULL, 0), e, REC_CRC_OFF);
}

/* The word at REC_AWAITED_OFF: the awaited rank + 1, 0 for unknown (and
 * for a rank no group can have, which would not read back as written). */
static uint32_t awaited_encode(const dcpxd_record *r) {
  return r->has_awaited_rank && r->awaited_rank < DCPX_MAX_WORLD
             ? r->awaited_rank + 1
             : 0;
}

/* ... and back: 1..DCPX_MAX_WORLD is rank 0..DCPX_MAX_WORLD-1, anything
 * else unknown (0 from an older dcpxd; a larger value from damage that
 * the CRC does not catch, a forged file or a later format), so that a
 * record read back never holds a rank no group can have. (The record
 * does not hold its group's world, so a rank at or above it is not
 * caught; nothing indexes by it: it goes out in Record.awaited_rank.) */
static void awaited_decode(uint32_t v, dcpxd_record *r) {
  r->has_awaited_rank = v >= 1 && v <= DCPX_MAX_WORLD;
  r->awaited_rank = r->has_awaited_rank ? v - 1 : 0;
}

static void encode(uint8_t e[REC_SIZE], const dcpxd_record *r) {
  memset(e, 0, REC_SIZE);
  put32(e + 0, REC_MAGIC);
  e[4] = REC_VERSION & 0xff;
  e[5] = REC_VERSION >> 8;
  e[6] = REC_SIZE & 0xff;
  e[7] = REC_SIZE >> 8;
  memcpy(e + 8, r->group, strnlen(r->group, DCPXD_GROUP_NAME_MAX));
  put32(e + 72, r->generation);
  put32(e + 76, r->rank);
  put32(e + 80, r->kind);
  put32(e + 84, r->region);
  put32(e + 88, r->index);
  put32(e + 92, r->expected);
  put32(e + 96, r->seen);
  put32(e + 100, r->block);
  put64(e + 104, r->time_ns);
  put64(e + 112, r->call_tag);
  put32(e + REC_AWAITED_OFF, awaited_encode(r));
  put32(e + REC_CRC_OFF, crc_of(e));
}

/* 0 and *r filled for a valid entry, -EBADMSG otherwise. */
static int decode(const uint8_t e[REC_SIZE], dcpxd_record *r) {
  if (get32(e) != REC_MAGIC || (e[4] | e[5] << 8) != REC_VERSION ||
      (e[6] | e[7] << 8) != REC_SIZE || get32(e + REC_CRC_OFF) != crc_of(e))
    return -EBADMSG;
  memset(r, 0, sizeof(*r));
  memcpy(r->group, e + 8, DCPXD_GROUP_NAME_MAX);
  r->group[DCPXD_GROUP_NAME_MAX] = '\0';
  r->generation = get32(e + 72);
  r->rank = get32(e + 76);
  r->kind = get32(e + 80);
  r->region = get32(e + 84);
  r->index = get32(e + 88);
  r->expected = get32(e + 92);
  r->seen = get32(e + 96);
  r->block = get32(e + 100);
  r->time_ns = get64(e + 104);
  r->call_tag = get64(e + 112);
  awaited_decode(get32(e + REC_AWAITED_OFF), r);
  return 0;
}

static void ring_push(dcpxd_records *s, const dcpxd_record *r) {
  if (s->count < s->cap) {
    s->ring[(s->head + s->count) % s->cap] = *r;
    s->count++;
  } else {
    s->ring[s->head] = *r;
    s->head = (s->head + 1) % s->cap;
  }
}

/* One records file at start: open (O_NONBLOCK: a FIFO there must not
 * hang the start, nor a link to one), its whole entries and where the
 * reading starts. */
typedef struct rec_file {
  const char *path;
  int fd;
  uint64_t whole;   /* bytes of whole entries */
  uint64_t partial; /* bytes of a partial entry at the end */
  uint64_t start;   /* the first entry read (load_tail) */
  bool cut;         /* start is where too much damage stopped the search */
} rec_file;

static void file_open(rec_file *f, const char *path) {
  struct stat st;

  f->path = path;
  f->whole = f->partial = f->start = 0;
  f->cut = false;
  /* Never through a link: a damaged live file is cut (load_file), and a
   * link would have dcpxd cut and append to whatever file it names. */
  f->fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
  if (f->fd < 0) {
    if (errno == ELOOP)
      log_warning("Records file %s is a symbolic link: not read", path);
    else if (errno != ENOENT)
      log_warning_errno(-errno, "Cannot read records file %s: %m", path);
    return;
  }
  /* a FIFO would block the reads, a device never end them; a file with
   * another hard link (one to a file dcpxd must not cut) is not read */
  if (fstat(f->fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    log_warning("Records file %s is not a regular file of one link: not "
                "read",
                path);
    close(f->fd);
    f->fd = -1;
    return;
  }
  f->whole = (uint64_t)st.st_size / REC_SIZE * REC_SIZE;
  f->partial = (uint64_t)st.st_size - f->whole;
  f->start = f->whole;
}

/* pread of n bytes at off, all of them; false (logged) on an error. */
static bool file_read(const rec_file *f, uint8_t *buf, size_t n,
                      uint64_t off) {
  size_t have = 0;
  while (have < n) {
    const ssize_t k = pread(f->fd, buf + have, n - have, (off_t)(off + have));
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      if (k < 0)
        log_warning_errno(-errno, "Error reading records file %s: %m",
                          f->path);
      else
        log_warning("Error reading records file %s: it shrank", f->path);
      return false;
    }
    have += (size_t)k;
  }
  return true;
}

#define LOAD_CHUNK (REC_SIZE * 256)
/* Damaged bytes read back per file at start before it is given up on:
 * 16 MiB, about 0.2 s, and 131072 entries to find the ring's 4096 among. */
#define LOAD_BAD_MAX_MIB 16
#define LOAD_BAD_MAX ((uint64_t)LOAD_BAD_MAX_MIB << 20)

/* Finds, from the end of f backwards, where its newest *need valid
 * entries begin (f->start), and takes them off *need. Only those are
 * read: the ring keeps the newest records only, and reading a whole file
 * of records-max-bytes (up to 1T) held dcpxd at start for as long as that
 * takes (about 10 s a GiB), past a service manager's start timeout. So
 * does a file of garbage, which has no valid entry to stop at: the search
 * ends after LOAD_BAD_MAX damaged bytes (f->cut; older entries are not
 * read). */
static void load_tail(rec_file *f, size_t *need) {
  uint8_t buf[LOAD_CHUNK];
  uint64_t off = f->whole, bad = 0;

  if (f->fd < 0)
    return;
  while (off > 0 && *need > 0 && bad < LOAD_BAD_MAX) {
    const size_t n = off < LOAD_CHUNK ? (size_t)off : LOAD_CHUNK;
    if (!file_read(f, buf, n, off - n)) {
      f->start = f->whole; /* nothing of it: as an unreadable file */
      return;
    }
    for (size_t i = n; i > 0 && *need > 0 && bad < LOAD_BAD_MAX;
         i -= REC_SIZE) {
      dcpxd_record r;
      if (decode(buf + i - REC_SIZE, &r) == 0)
        (*need)--;
      else
        bad += REC_SIZE;
      f->start = off - n + i - REC_SIZE;
    }
    off -= n;
  }
  f->cut = bad >= LOAD_BAD_MAX && f->start > 0;
  if (f->cut)
    log_warning("Records file %s: stopped reading it back at offset %" PRIu64
                " after %" PRIu64 " MiB of damaged entries; the entries "
                "before it are not read",
                f->path, f->start, bad >> 20);
}

/* Loads the valid entries of f from f->start into the ring, counting the
 * bad ones among them; a partial entry at the end is counted, and for the
 * live file (`fix_tail`) cut off. Closes f. */
static void load_file(dcpxd_records *s, rec_file *f, bool fix_tail) {
  uint8_t buf[LOAD_CHUNK];
  uint64_t bad = 0, good = 0;

  if (f->fd < 0)
    return;
  for (uint64_t off = f->start; off < f->whole;) {
    const size_t n =
        f->whole - off < LOAD_CHUNK ? (size_t)(f->whole - off) : LOAD_CHUNK;
    if (!file_read(f, buf, n, off))
      break;
    for (size_t i = 0; i < n; i += REC_SIZE) {
      dcpxd_record r;
      if (decode(buf + i, &r) < 0) {
        bad++;
        continue;
      }
      ring_push(s, &r);
      good++;
    }
    off += n;
  }
  if (bad)
    log_warning("Records file %s: skipped %" PRIu64
                " corrupted entr%s (bad magic or CRC)",
                f->path, bad, bad == 1 ? "y" : "ies");
  if (f->partial) {
    s->truncated++;
    log_warning("Records file %s: skipped a truncated entry of %" PRIu64
                " bytes at offset %" PRIu64 "%s",
                f->path, f->partial, f->whole,
                fix_tail ? "; cutting it off" : "");
    if (fix_tail && ftruncate(f->fd, (off_t)f->whole) < 0)
      log_warning_errno(-errno, "Cannot truncate %s: %m", f->path);
  }
  s->corrupt += bad;
  s->loaded += good;
  s->skipped += f->start / REC_SIZE;
  s->cut += f->cut;
  close(f->fd);
  f->fd = -1;
}

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p)
    snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int fsync_dir(const char *dir) {
  _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  return fsync(fd) < 0 ? -errno : 0;
}

static int open_live(dcpxd_records *s) {
  struct stat st;
  int fd = open(s->path,
                O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW,
                0640);
  if (fd < 0)
    return -errno;
  if (fstat(fd, &st) < 0) {
    int r = -errno;
    close(fd);
    return r;
  }
  s->fd = fd;
  s->size = (uint64_t)st.st_size;
  return 0;
}

/* The writer's (it logs nothing: batch_done says what happened). */
static int rotate(dcpxd_records *s) {
  int r;

  if (s->fd >= 0) {
    if (fdatasync(s->fd) < 0)
      s->w_sync_err = -errno;
    close(s->fd);
    s->fd = -1;
  }
  if (rename(s->path, s->path_old) < 0 && errno != ENOENT) {
    s->w_rot_err = -errno;
    s->w_rot_create = false;
    return s->w_rot_err;
  }
  r = open_live(s);
  if (r < 0) {
    s->w_rot_err = r;
    s->w_rot_create = true;
    return r;
  }
  (void)fsync_dir(s->dir);
  s->w_rotations++;
  return 0;
}

static void update_note(dcpxd_records *s, const char *extra) {
  size_t n = 0;
  s->note[0] = '\0';
  if (s->corrupt || s->truncated)
    n = (size_t)snprintf(s->note, sizeof(s->note),
                         "at startup skipped %" PRIu64 " corrupted and %" PRIu64
                         " truncated record entries in %s",
                         s->corrupt, s->truncated, s->dir);
  if (s->cut && n < sizeof(s->note))
    n += (size_t)snprintf(s->note + n, sizeof(s->note) - n,
                          "; stopped reading back %u file(s) after %d MiB of "
                          "damaged entries (older entries there not read)",
                          s->cut, LOAD_BAD_MAX_MIB);
  if (extra && n < sizeof(s->note))
    snprintf(s->note + n, sizeof(s->note) - n, "%s%s", n ? "; " : "", extra);
}

/* A backlog of n records: mapped, so that the room a burst took
 * (backlog_room) goes back to the system when it drains (mremap; freed
 * heap memory often stays with the process), and touched at once, so that
 * its first ring counts in dcpxd's memory from the start. NULL if none. */
static dcpxd_record *backlog_map(size_t n) {
  void *p = mmap(NULL, n * sizeof(dcpxd_record), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  memset(p, 0, n * sizeof(dcpxd_record));
  return p;
}

int dcpxd_records_open(const char *state_dir, uint64_t max_bytes, size_t ring,
                       dcpxd_records **ret) {
  dcpxd_records *s;
  struct stat st;
  int r;

  if (mkdir(state_dir, 0750) < 0 && errno != EEXIST)
    return log_error_errno(-errno, "Cannot create state dir %s: %m", state_dir);
  if (stat(state_dir, &st) < 0)
    return log_error_errno(-errno, "Cannot use state dir %s: %m", state_dir);
  if (!S_ISDIR(st.st_mode))
    return log_error_errno(-ENOTDIR, "State dir %s: %m", state_dir);

  s = calloc(1, sizeof(*s));
  if (!s)
    return log_error_errno(-ENOMEM, "Cannot open records: %m");
  s->fd = -1;
  s->max_bytes = max_bytes < REC_SIZE ? REC_SIZE : max_bytes;
  s->cap = ring ? ring : 1;
  s->dir = strdup(state_dir);
  s->ring = calloc(s->cap, sizeof(*s->ring));
  s->backlog = backlog_map(s->cap);
  s->bcap = s->cap;
  s->wbuf = calloc(s->cap, sizeof(*s->wbuf));
  if (s->wbuf) /* a batch's copy: in dcpxd's memory from the start too */
    memset(s->wbuf, 0xFF, s->cap * sizeof(*s->wbuf));
  s->path = path_join(state_dir, "records.log");
  s->path_old = path_join(state_dir, "records.log.1");
  if (!s->dir || !s->ring || !s->backlog || !s->wbuf || !s->path ||
      !s->path_old) {
    if (!s->backlog)
      s->bcap = 0;
    dcpxd_records_free(s);
    return log_error_errno(-ENOMEM, "Cannot open records: %m");
  }

  {
    /* the newest `cap` records: the live file's, then the rotated one's */
    rec_file live, old;
    size_t need = s->cap;
    file_open(&live, s->path);
    file_open(&old, s->path_old);
    load_tail(&live, &need);
    load_tail(&old, &need);
    load_file(s, &old, false);
    load_file(s, &live, true);
  }
  /* the live file is appended to: one that is not a file (a FIFO, whose
   * open would wait for a reader, a device), a symbolic link (dcpxd would
   * append to the file it names) or a file with another hard link stops
   * dcpxd (a file an older dcpxd of another uid wrote is taken) */
  if (lstat(s->path, &st) == 0 &&
      (!S_ISREG(st.st_mode) || st.st_nlink != 1)) {
    log_error("Records file %s is in the way (%s)", s->path,
              S_ISLNK(st.st_mode)   ? "a symbolic link"
              : !S_ISREG(st.st_mode) ? "not a regular file"
                                     : "a file with other hard links");
    dcpxd_records_free(s);
    return -EINVAL;
  }
  r = open_live(s);
  if (r < 0) {
    log_error_errno(r, "Cannot open records file %s: %m", s->path);
    dcpxd_records_free(s);
    return r;
  }
  (void)fsync_dir(s->dir);
  update_note(s, NULL);
  log_info("Records: %s, %" PRIu64 " loaded, %zu kept in memory%s%s%s",
           s->path, s->loaded, s->count,
           s->skipped ? " (older entries not read: only the newest are kept)"
                      : "",
           s->note[0] ? "; " : "", s->note);
  *ret = s;
  return 0;
}

/* Writes recs[0..n) to the live file (rotating as needed) and syncs it;
 * *ret_done: how many are on disk. 0, or the error that stopped it. A
 * sync that fails takes back what this call wrote into the live file
 * (truncated to where it started): those records were not stored, and a
 * retry writes them once. */
static int write_entries(dcpxd_records *s, const dcpxd_record *recs,
                         size_t n, size_t *ret_done) {
  uint8_t buf[REC_SIZE * 64];
  size_t i = 0, i_live = 0; /* i_live: the first record in the live file */
  uint64_t size_live = s->size;
  int r = 0;

  while (i < n) {
    uint64_t room;
    size_t chunk;

    if (s->fd < 0 || s->size + REC_SIZE > s->max_bytes) {
      r = rotate(s); /* syncs the file it closes */
      if (r < 0)
        break;
      i_live = i;
      size_live = s->size;
    }
    room = (s->max_bytes - s->size) / REC_SIZE;
    chunk = n - i;
    if (chunk > room)
      chunk = (size_t)room;
    if (chunk > sizeof(buf) / REC_SIZE)
      chunk = sizeof(buf) / REC_SIZE;
    for (size_t k = 0; k < chunk; k++)
      encode(buf + k * REC_SIZE, &recs[i + k]);
    size_t off = 0;
    r = dcpxd_write_all(s->fd, buf, chunk * REC_SIZE, &off);
    if (r < 0 && off % REC_SIZE) {
      /* A torn record (ENOSPC mid-write): cut it off, so that the records
       * a later write appends stay on the 128-byte grid the loader reads
       * (else every one after it would count as damaged). */
      const uint64_t whole = s->size + off - off % REC_SIZE;
      if (ftruncate(s->fd, (off_t)whole) == 0)
        off -= off % REC_SIZE;
    }
    s->size += off;
    i += off / REC_SIZE;
    if (r < 0)
      break;
  }
  if (r == 0 && s->fd >= 0 && fdatasync(s->fd) < 0) {
    r = -errno;
    if (ftruncate(s->fd, (off_t)size_live) == 0)
      s->size = size_live;
    i = i_live;
  }
  *ret_done = r == 0 ? n : i;
  return r;
}

/* The most records the backlog may hold now: up to BACKLOG_GROW rings
 * behind a write in flight that has not failed, else one ring. */
static size_t backlog_limit(const dcpxd_records *s) {
  return s->busy && !s->write_error ? BACKLOG_GROW * s->cap : s->cap;
}

/* The backlog's room for `want` more records: its mapping grown (doubled)
 * up to backlog_limit. Returns how many of want fit; *ret_top: the most it
 * may hold now. */
static size_t backlog_room(dcpxd_records *s, size_t want, size_t *ret_top) {
  const size_t lim = backlog_limit(s);
  while (s->n_backlog + want > s->bcap && s->bcap < lim) {
    dcpxd_record *b = mremap(s->backlog, s->bcap * sizeof(*b),
                             2 * s->bcap * sizeof(*b), MREMAP_MAYMOVE);
    if (b == MAP_FAILED)
      break;
    s->backlog = b;
    s->bcap *= 2;
  }
  const size_t top = s->bcap < lim ? s->bcap : lim;
  const size_t room = top > s->n_backlog ? top - s->n_backlog : 0;
  *ret_top = top;
  return want < room ? want : room;
}

/* The room a burst took given back (mremap: the pages go back to the
 * system), once the backlog fits one ring again. */
static void backlog_shrink(dcpxd_records *s) {
  if (s->bcap <= s->cap || s->n_backlog > s->cap)
    return;
  dcpxd_record *b = mremap(s->backlog, s->bcap * sizeof(*b),
                           s->cap * sizeof(*b), 0);
  if (b != MAP_FAILED) {
    s->backlog = b;
    s->bcap = s->cap;
  }
}

/* Records dropped for want of room: behind a write in flight that has
 * not failed, a burst faster than the disk (dropped); else lost. */
static void count_drop(dcpxd_records *s, uint64_t n) {
  if (s->busy && !s->write_error)
    s->dropped += n;
  else
    s->lost += n;
}

/* The oldest records dropped until at most `keep` are left. */
static void backlog_trim(dcpxd_records *s, size_t keep) {
  if (s->n_backlog <= keep)
    return;
  const size_t drop = s->n_backlog - keep;
  memmove(s->backlog, s->backlog + drop, keep * sizeof(*s->backlog));
  s->n_backlog = keep;
  count_drop(s, drop);
}

/* recs[0..n) joins the backlog's end; the oldest go past its room. */
static void backlog_add(dcpxd_records *s, const dcpxd_record *recs,
                        size_t n) {
  size_t top;
  if (n > backlog_room(s, n, &top)) { /* no more room: the oldest go */
    const size_t fit = n < top ? n : top;
    backlog_trim(s, top - fit);
    count_drop(s, n - fit); /* the oldest of recs themselves */
    recs += n - fit;
    n = fit;
  }
  memcpy(s->backlog + s->n_backlog, recs, n * sizeof(*recs));
  s->n_backlog += n;
}

/* The note (QueryReply.records_note) for failing writes and for
 * records dropped, or none. */
static void backlog_note(dcpxd_records *s) {
  char why[400] = "";
  size_t n = 0;
  if (s->write_error && s->n_backlog)
    n = (size_t)snprintf(why, sizeof(why),
                         "writing %s failed (%s): %zu record(s) not stored "
                         "yet, in memory and retried every second; %" PRIu64
                         " lost for want of room",
                         s->path, dcpx_strerror(s->write_error),
                         s->n_backlog, s->lost);
  else if (s->lost)
    n = (size_t)snprintf(why, sizeof(why),
                         "%" PRIu64 " record(s) lost while %s could not be "
                         "written (the memory for unstored ones was full)",
                         s->lost, s->path);
  if (s->dropped && n < sizeof(why))
    snprintf(why + n, sizeof(why) - n,
             "%s%" PRIu64 " record(s) dropped: more came while a write of "
             "%s was in flight than dcpxd queues (%u x %zu)",
             n ? "; " : "", s->dropped, s->path, BACKLOG_GROW, s->cap);
  update_note(s, why[0] ? why : NULL);
}

/* The batch, to the file (the writer: a worker thread, or the caller). */
static void write_batch(dcpxd_records *s) {
  s->w_rotations = 0;
  s->w_sync_err = s->w_rot_err = 0;
  s->w_r = write_entries(s, s->wbuf, s->n_wbuf, &s->w_done);
}

static void work_cb(uv_work_t *req) { write_batch(req->data); }

/* The batch's outcome, on the loop thread: what the writer did, logged;
 * the records it did not store back at the backlog's front (they are
 * older than the ones queued meanwhile), the oldest dropped past its
 * room. Returns the outcome. */
static int batch_done(dcpxd_records *s) {
  const int r = s->w_r;
  const size_t left = s->n_wbuf - s->w_done;
  const bool was_failing = s->write_error != 0;

  if (s->w_sync_err)
    log_warning_errno(s->w_sync_err, "fdatasync(%s) failed: %m", s->path_old);
  if (s->w_rot_err && s->w_rot_create)
    log_error_errno(s->w_rot_err, "Cannot create %s: %m", s->path);
  else if (s->w_rot_err)
    log_error_errno(s->w_rot_err, "Cannot rotate %s to %s: %m", s->path,
                    s->path_old);
  for (unsigned k = 0; k < s->w_rotations; k++)
    log_info("Rotated %s to %s", s->path, s->path_old);
  if (r < 0) {
    /* failing: one ring of the newest unstored records is kept, the
     * batch's put back before the ones queued behind it */
    s->write_error = r;
    s->busy = false;
    backlog_trim(s, s->cap);
    const size_t room = s->cap - s->n_backlog;
    const size_t back = left < room ? left : room;
    memmove(s->backlog + back, s->backlog, s->n_backlog * sizeof(*s->backlog));
    memcpy(s->backlog, s->wbuf + s->w_done + (left - back),
           back * sizeof(*s->wbuf));
    s->n_backlog += back;
    s->lost += left - back;
    s->n_wbuf = 0;
    backlog_shrink(s);
    backlog_note(s);
    log_error_errno(r, "Cannot store %zu record(s) in %s (kept in memory, "
                       "retried): %m",
                    s->n_backlog, s->path);
    if (s->on_unstored)
      s->on_unstored(s->on_unstored_arg);
    return r;
  }
  s->busy = false;
  backlog_shrink(s);
  if (was_failing)
    log_notice("Stored %zu record(s) in %s that could not be written before",
               s->n_wbuf, s->path);
  s->n_wbuf = 0;
  if (s->dropped > s->dropped_said) {
    log_warning("Dropped %" PRIu64 " timeout record(s): more came while a "
                "write of %s was in flight than dcpxd queues (%u x %zu); "
                "queries still show the newest %zu",
                s->dropped - s->dropped_said, s->path, BACKLOG_GROW, s->cap,
                s->cap);
    s->dropped_said = s->dropped;
  }
  if (s->lost || s->write_error || s->dropped) {
    s->write_error = 0;
    backlog_note(s);
  }
  return 0;
}

static int batch_start(dcpxd_records *s);

static void after_cb(uv_work_t *req, int status) {
  dcpxd_records *s = req->data;
  (void)status; /* never cancelled: a queued work is not */
  if (batch_done(s) == 0)
    (void)batch_start(s); /* what came meanwhile */
}

/* The backlog, as the next batch, unless one is busy: written at once
 * without a loop (its outcome returned), else on a worker (0; the outcome
 * comes to batch_done). */
static int batch_start(dcpxd_records *s) {
  if (s->busy || !s->n_backlog)
    return 0;
  /* at most a ring (wbuf's size); the rest is the next batch's */
  const size_t n = s->n_backlog < s->cap ? s->n_backlog : s->cap;
  memcpy(s->wbuf, s->backlog, n * sizeof(*s->backlog));
  memmove(s->backlog, s->backlog + n,
          (s->n_backlog - n) * sizeof(*s->backlog));
  s->n_wbuf = n;
  s->n_backlog -= n;
  s->busy = true;
  if (s->loop) {
    s->work.data = s;
    if (uv_queue_work(s->loop, &s->work, work_cb, after_cb) == 0)
      return 0;
  }
  write_batch(s); /* no loop, or it cannot queue: here */
  return batch_done(s);
}

void dcpxd_records_use_loop(dcpxd_records *s, struct uv_loop_s *loop,
                            void (*on_unstored)(void *), void *arg) {
  s->loop = loop;
  s->on_unstored = on_unstored;
  s->on_unstored_arg = arg;
}

int dcpxd_records_append(dcpxd_records *s, const dcpxd_record *recs, size_t n) {
  for (size_t k = 0; k < n; k++)
    ring_push(s, &recs[k]);
  backlog_add(s, recs, n); /* after the older ones: the file in time order */
  if (s->write_error && s->loop) /* failing: the retry's timer writes */
    return s->write_error;
  return batch_start(s);
}

int dcpxd_records_retry(dcpxd_records *s) {
  if (s->busy)
    return -EINPROGRESS;
  int r = 0;
  do /* without a loop, batch after batch: the backlog may hold several */
    r = batch_start(s);
  while (r == 0 && !s->loop && s->n_backlog);
  return r < 0 ? r : s->busy || s->n_backlog ? -EINPROGRESS : 0;
}

size_t dcpxd_records_unstored(const dcpxd_records *s) {
  if (!s->write_error) /* queued behind a write that works: not failing */
    return 0;
  return s->n_backlog + (s->busy ? s->n_wbuf : 0);
}

size_t dcpxd_records_count(const dcpxd_records *s) { return s->count; }

const dcpxd_record *dcpxd_records_get(const dcpxd_records *s, size_t i) {
  if (i >= s->count)
    return NULL;
  return &s->ring[(s->head + i) % s->cap];
}

const char *dcpxd_records_note(const dcpxd_records *s) { return s->note; }

dcpxd_records *dcpxd_records_free(dcpxd_records *s) {
  if (!s)
    return NULL;
  while (s->busy && s->loop) /* a batch on a worker: its end */
    uv_run(s->loop, UV_RUN_ONCE);
  s->loop = NULL; /* the last try, here */
  if (s->n_backlog && dcpxd_records_retry(s) < 0)
    log_error("%zu timeout record(s) were never stored in %s and are lost",
              s->n_backlog, s->path);
  if (s->fd >= 0)
    close(s->fd);
  free(s->dir);
  free(s->path);
  free(s->path_old);
  free(s->ring);
  if (s->backlog)
    munmap(s->backlog, s->bcap * sizeof(*s->backlog));
  free(s->wbuf);
  free(s);
  return NULL;
}
