/* fuzz_records.c - libFuzzer target: dcpxd's records files as a start
 * reads them back (dcpxd_records_open: load_tail, load_file, decode, the
 * cut of a partial tail), then an append and a second start. The files
 * are the state dir's, and anything may be in them. Built by `make fuzz`;
 * corpus in tests/fuzz/corpus/records.
 *
 * Input:
 *   byte 0    bits 0-1: the ring (1, 8, 64 or 4096 records)
 *             bit 2:    max_bytes small (4 entries: the append rotates)
 *             bit 3:    make the CRC of every whole entry good (at 124,
 *                       over 0..123), so that the mutations of an entry's
 *                       fields reach the decoder, not just its CRC check
 *   byte 1-2  length of records.log.1, little endian (cut to what is left)
 *   then      records.log.1, and the rest is records.log
 * Checked: every record read back is whole (its group NUL-terminated) and
 * holds no awaited rank past DCPX_MAX_WORLD - 1 (unknown: 0); the record
 * appended after is the newest a second start reads back, field by field,
 * its awaited rank included.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "dcpxd-log.h"
#include "dcpxd-records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

static char g_dir[64], g_live[96], g_old[96];

static void files_remove(void) {
  unlink(g_live);
  unlink(g_old);
  rmdir(g_dir);
}

static void put_file(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f)
    abort();
  if (n && fwrite(p, 1, n, f) != n)
    abort();
  if (fclose(f) != 0)
    abort();
}

/* The entries of p[0..n) (whole ones, from p) with good CRCs. */
static void fix_crcs(uint8_t *p, size_t n) {
  for (size_t off = 0; off + 128 <= n; off += 128) {
    const uint32_t c = (uint32_t)crc32(crc32(0L, Z_NULL, 0), p + off, 124);
    for (int i = 0; i < 4; i++)
      p[off + 124 + i] = (uint8_t)(c >> (8 * i));
  }
}

static void check_record(const dcpxd_record *r) {
  if (r->group[DCPXD_GROUP_NAME_MAX] != '\0')
    abort();
  if (r->has_awaited_rank ? r->awaited_rank >= DCPX_MAX_WORLD
                          : r->awaited_rank != 0) {
    fprintf(stderr, "fuzz_records: awaited rank %u (has %d) read back\n",
            r->awaited_rank, r->has_awaited_rank);
    abort();
  }
}

static int same_record(const dcpxd_record *a, const dcpxd_record *b) {
  return !strcmp(a->group, b->group) && a->generation == b->generation &&
         a->rank == b->rank && a->kind == b->kind && a->region == b->region &&
         a->index == b->index && a->expected == b->expected &&
         a->seen == b->seen && a->block == b->block &&
         a->time_ns == b->time_ns && a->call_tag == b->call_tag &&
         a->has_awaited_rank == b->has_awaited_rank &&
         a->awaited_rank == b->awaited_rank;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  static const size_t rings[] = {1, 8, 64, 4096};
  dcpxd_records *s = NULL;
  dcpxd_record add;
  size_t ring, k_old;
  uint64_t max_bytes;
  unsigned flags;

  if (!g_dir[0]) {
    strcpy(g_dir, "/tmp/fuzz_records.XXXXXX");
    if (!mkdtemp(g_dir))
      abort();
    snprintf(g_live, sizeof(g_live), "%s/records.log", g_dir);
    snprintf(g_old, sizeof(g_old), "%s/records.log.1", g_dir);
    atexit(files_remove);
    dcpxd_log_max_level = -1; /* damaged entries are expected: keep quiet */
  }
  if (n < 3)
    return 0;
  flags = data[0];
  ring = rings[flags & 3];
  max_bytes = flags & 4 ? 4 * 128 : 1u << 20;
  k_old = (size_t)data[1] | (size_t)data[2] << 8;
  data += 3, n -= 3;
  if (k_old > n)
    k_old = n;
  if (flags & 8) {
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
      abort();
    memcpy(copy, data, n);
    fix_crcs(copy, k_old);
    fix_crcs(copy + k_old, n - k_old);
    put_file(g_old, copy, k_old);
    put_file(g_live, copy + k_old, n - k_old);
    free(copy);
  } else {
    put_file(g_old, data, k_old);
    put_file(g_live, data + k_old, n - k_old);
  }

  if (dcpxd_records_open(g_dir, max_bytes, ring, &s) < 0)
    abort(); /* content never fails a start */
  if (dcpxd_records_count(s) > ring)
    abort();
  for (size_t i = 0; i < dcpxd_records_count(s); i++)
    check_record(dcpxd_records_get(s, i));

  /* an append after it: the newest record, its own or one read back
   * (with its awaited rank) */
  if (dcpxd_records_count(s))
    add = *dcpxd_records_get(s, dcpxd_records_count(s) - 1);
  else {
    memset(&add, 0, sizeof(add));
    strcpy(add.group, "fuzz");
    add.has_awaited_rank = true;
    add.awaited_rank = DCPX_MAX_WORLD - 1;
  }
  add.time_ns++;
  if (dcpxd_records_append(s, &add, 1) < 0)
    abort();
  dcpxd_records_free(s);

  s = NULL;
  if (dcpxd_records_open(g_dir, max_bytes, ring, &s) < 0)
    abort();
  if (dcpxd_records_count(s) == 0 ||
      !same_record(dcpxd_records_get(s, dcpxd_records_count(s) - 1), &add)) {
    fprintf(stderr, "fuzz_records: the appended record did not read back\n");
    abort();
  }
  for (size_t i = 0; i < dcpxd_records_count(s); i++)
    check_record(dcpxd_records_get(s, i));
  dcpxd_records_free(s);
  return 0;
}
