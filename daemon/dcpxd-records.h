/* dcpxd-records.h - the timeout records the daemon keeps: durably in
 * STATE_DIR/records.log (+ records.log.1), and the newest few thousand in
 * memory for queries. See dcpxd-records.c for the file format. */
#ifndef DCPXD_RECORDS_H
#define DCPXD_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dcpx.h"

struct uv_loop_s; /* libuv's uv_loop_t */

/* Group names are at most this long (bytes, without the NUL); the file
 * format's group field holds exactly this many. */
#define DCPXD_GROUP_NAME_MAX DCPX_GROUP_NAME_MAX

/* Records kept in memory for queries. */
#define DCPXD_RECORDS_RING 4096

typedef struct dcpxd_record {
  char group[DCPXD_GROUP_NAME_MAX + 1];
  uint32_t generation, rank, kind, region, index, expected, seen, block;
  uint64_t time_ns, call_tag;
  /* The rank the wait awaited, when has_awaited_rank: set at the harvest,
   * from the group's layout (dcpxd-health.c), and stored in the records
   * file (the word at 120 of an entry, rank + 1; dcpxd-records.c), so a
   * record read back after a restart has it too. Unknown for an entry an
   * older dcpxd wrote, and for a stored value that is no rank (above
   * DCPX_MAX_WORLD). */
  uint32_t awaited_rank;
  bool has_awaited_rank;
} dcpxd_record;

typedef struct dcpxd_records dcpxd_records;

/* Opens (creating) STATE_DIR and its records files, and loads the newest
 * `ring` records into memory. Corrupted or truncated entries are skipped,
 * counted and logged, never fatal; only an unusable state dir fails. */
int dcpxd_records_open(const char *state_dir, uint64_t max_bytes, size_t ring,
                       dcpxd_records **ret);

/* From now on the file is written on a worker thread of loop (libuv's
 * pool), so that an fdatasync behind a busy disk never holds the loop
 * (an alarm's records are stored as its group aborts: bench/RESULTS.md,
 * session 34). on_unstored(arg), on the loop thread, when a write failed
 * (arm the retry's timer). Before it (tools, tests), appends write at
 * once. dcpxd_records_free waits for a write in flight. */
void dcpxd_records_use_loop(dcpxd_records *s, struct uv_loop_s *loop,
                            void (*on_unstored)(void *), void *arg);

/* Appends n records: to the ring at once (queries see them), and to the
 * file (write + fdatasync, rotating first if it would grow past
 * max_bytes), behind any not written yet: at once without a loop, else
 * on the worker (0 is returned; a failure comes to on_unstored). On a file
 * error the records are still kept in memory, and the ones not written
 * wait in a bounded backlog that the next append or dcpxd_records_retry
 * writes first; the error is returned (and noted for queries). While
 * writes fail with a loop, appends only queue (the retry writes). */
int dcpxd_records_append(dcpxd_records *s, const dcpxd_record *r, size_t n);

/* Writes the backlog: 0 when nothing is left to store; with a loop
 * -EINPROGRESS while a write runs or is started, else the error. */
int dcpxd_records_retry(dcpxd_records *s);

/* Records whose write failed and that wait for a retry: not on disk yet
 * (records queued behind a write that works do not count). */
size_t dcpxd_records_unstored(const dcpxd_records *s);

/* Records in memory, oldest first: i in 0..count-1. */
size_t dcpxd_records_count(const dcpxd_records *s);
const dcpxd_record *dcpxd_records_get(const dcpxd_records *s, size_t i);

/* A note for QueryReply.records_note ("" when all is well). */
const char *dcpxd_records_note(const dcpxd_records *s);

dcpxd_records *dcpxd_records_free(dcpxd_records *s);

#endif /* DCPXD_RECORDS_H */
