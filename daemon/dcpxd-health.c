/* dcpxd-health.c - the alarm scan and the harvest of wait records
 * (docs/PROTOCOL.md section 6).
 *
 * The scan. Every poll-ms (a uv_timer that runs only while some group is
 * ready), the daemon reads the W alarm words of every ready group's
 * control page. On the first non-zero one it aborts the group
 * (dcpxd_group_abort): a plain store of DCPX_ABORT_ALARM into the header's
 * abort word, which every waiting block of every rank polls, so the other
 * ranks stop at once instead of each at its own timeout. The cost is W
 * loads per group per tick; the records are read only after an alarm.
 *
 * The harvest. A waiter that timed out fills its record slot (d, t) and
 * writes `kind` last; the daemon loads `kind` with acquire semantics and
 * then the other fields. A bitmap remembers which slots were already
 * stored, so the same record is never stored twice, and the group is
 * harvested again before a recovery zeroes the records (late ones, written
 * after the abort by ranks still finishing their wait) and before the group
 * is destroyed.
 *
 * After a restart. An adopted group's control page may hold records the
 * previous daemon already stored; dcpxd_health_adopt marks those slots as
 * harvested by matching (rank, block, time, call) against the records the
 * store loaded, so a restart neither loses nor doubles a record (as far as
 * the in-memory ring reaches back).
 *
 * Bounds. One harvest stores at most HARVEST_KEEP records (the earliest by
 * time: the first timeout is the cause, the rest its echo) and logs at most
 * HARVEST_LOG lines; the rest are counted in one summary line. The store
 * itself keeps a bounded ring (dcpxd-records.c). So a W=16, R=4096 group in
 * which every row timed out costs one scan of its records, not 65536 log
 * lines and unbounded memory.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dcpxd-log.h"
#include "dcpxd-util.h"
#include "dcpxd.h"

#define HARVEST_KEEP 1024
#define HARVEST_LOG 32

static int cmp_time(const void *a, const void *b) {
  const dcpxd_record *x = a, *y = b;
  if (x->time_ns != y->time_ns)
    return x->time_ns < y->time_ns ? -1 : 1;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  return x->block < y->block ? -1 : x->block > y->block;
}

/* The rank a timed-out wait awaited, as far as g's layout tells
 * (docs/PROTOCOL.md 6.3): in round 1 (ll_slots) the source of the list
 * that never came, the rank that missed the call or pushed fewer rows
 * (docs/PROTOCOL.md 7); in a rescue only where the slot leaves one rank
 * (dcpx_rescue_index_source: the row's mask is in no record). Worked out
 * here, while g's layout is surely the record's: by query time the group
 * may be gone, or another of the same name and another shape. */
static void record_awaited(const dcpxd_group *g, dcpxd_record *r) {
  int32_t s = -1;
  if (r->kind == DCPX_REC_TIMEOUT && r->region == DCPX_REGION_LL_SLOTS)
    s = (int32_t)dcpx_ll_index_source(&g->L, r->index);
  else if (r->kind == DCPX_REC_TIMEOUT && r->region == DCPX_REGION_RESCUE)
    s = dcpx_rescue_index_source(&g->L, r->rank, r->index);
  r->has_awaited_rank = s >= 0;
  r->awaited_rank = s >= 0 ? (uint32_t)s : 0;
}

/* A round-1 wait that gave up on the awaited tag's row half under
 * another call half (dcpx_tag_other_call): the awaited rank stored that
 * row in another call, as when the ranks call with different rows. */
static bool other_call(const dcpxd_record *r) {
  return r->kind == DCPX_REC_TIMEOUT &&
         dcpx_tag_other_call(r->region, r->expected, r->seen);
}

/* *r: the record in g's slot of rank d, w, whose kind was loaded first. */
static void record_read(const dcpxd_group *g, uint32_t d,
                        const dcpx_wait_record *w, uint32_t kind,
                        dcpxd_record *r) {
  memset(r, 0, sizeof(*r));
  memcpy(r->group, g->name, sizeof(r->group));
  r->generation = g->generation;
  r->rank = d; /* the slot says whose record it is */
  r->kind = kind;
  r->region = w->region;
  r->index = w->index;
  r->expected = w->expected;
  r->seen = w->seen;
  r->block = w->block;
  r->time_ns = w->time_ns;
  r->call_tag = w->call_tag;
  record_awaited(g, r);
}

/* A record that names the rank its wait awaited counts against that rank
 * (RankInfo.awaited_timeouts), so that an alert can name the straggler or
 * the dead peer, not only the ranks that waited for it. A rank past the
 * group's world is no rank of it: not counted (record_awaited gives none,
 * but a layout bug must not write past member[]). */
static void count_awaited(dcpxd_group *g, const dcpxd_record *r) {
  if (r->has_awaited_rank && r->awaited_rank < g->shape.world &&
      r->awaited_rank < DCPX_MAX_WORLD)
    g->member[r->awaited_rank].awaited_timeouts++;
}

size_t dcpxd_health_harvest(dcpxd_group *g) {
  const uint32_t W = g->shape.world, R = g->shape.rows;
  dcpxd_record *recs = NULL;
  size_t n = 0, cap = 0, keep;

  if (!g->hdr || !g->harvested)
    return 0;
  for (uint32_t d = 0; d < W; d++)
    for (uint32_t t = 0; t < R; t++) {
      size_t bit = (size_t)d * R + t;
      dcpx_wait_record *w;
      dcpxd_record rec;
      uint32_t kind;

      if (g->harvested[bit / 8] & (1u << (bit % 8)))
        continue;
      w = dcpxd_group_record(g, d, t);
      kind = __atomic_load_n(&w->kind, __ATOMIC_ACQUIRE);
      if (kind == DCPX_REC_EMPTY)
        continue;
      g->harvested[bit / 8] |= (uint8_t)(1u << (bit % 8));
      record_read(g, d, w, kind, &rec);
      /* counted even if not stored below */
      g->member[d].timeouts++;
      count_awaited(g, &rec);
      if (n == cap) {
        size_t ncap = cap ? 2 * cap : 64;
        dcpxd_record *nr = realloc(recs, ncap * sizeof(*recs));
        if (!nr) {
          log_error("group=%s: out of memory reading wait records; "
                    "%zu kept",
                    g->name, n);
          goto done_scan;
        }
        recs = nr;
        cap = ncap;
      }
      recs[n++] = rec;
    }
done_scan:
  if (n == 0) {
    free(recs);
    return 0;
  }
  qsort(recs, n, sizeof(*recs), cmp_time);
  keep = n < HARVEST_KEEP ? n : HARVEST_KEEP;
  for (size_t i = 0; i < keep && i < HARVEST_LOG; i++) {
    const dcpxd_record *r = &recs[i];
    char awaited[32] = "";
    if (r->has_awaited_rank)
      dcpxd_bprintf(awaited, " awaited_rank=%u", r->awaited_rank);
    log_warning("wait record group=%s gen=%u rank=%u kind=%s region=%s "
                "index=%u expected=0x%08x seen=0x%08x block=%u%s call=%" PRIu64
                " time=%" PRIu64 "%s",
                r->group, r->generation, r->rank, dcpx_rec_kind_name(r->kind),
                dcpxd_region_name(r->region), r->index, r->expected, r->seen,
                r->block, awaited, r->call_tag, r->time_ns,
                other_call(r) ? ": the slot holds that rank's list of another "
                                "call (the ranks' calls disagree, e.g. in "
                                "rows)"
                              : "");
  }
  if (keep > HARVEST_LOG)
    log_warning("group=%s gen=%u: %zu more wait records stored, not logged",
                g->name, g->generation, keep - HARVEST_LOG);
  if (n > keep)
    log_warning("group=%s gen=%u: %zu later wait records dropped (at most %d "
                "are stored per scan)",
                g->name, g->generation, n - keep, HARVEST_KEEP);
  if (dcpxd_records_append(g->m->records, recs, keep) < 0)
    dcpxd_records_retry_arm(g->m);
  /* The newest stored one is the group's last record. */
  g->last_record = recs[keep - 1];
  g->has_last_record = true;
  free(recs);
  return n;
}

/* Identity of a stored record, for matching it with a record slot. */
typedef struct rkey {
  uint32_t rank, block;
  uint64_t time_ns, call_tag;
} rkey;

static int cmp_rkey(const void *a, const void *b) {
  const rkey *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  if (x->block != y->block)
    return x->block < y->block ? -1 : 1;
  if (x->time_ns != y->time_ns)
    return x->time_ns < y->time_ns ? -1 : 1;
  return x->call_tag < y->call_tag ? -1 : x->call_tag > y->call_tag;
}

void dcpxd_health_adopt(dcpxd_group *g) {
  const dcpxd_records *s = g->m->records;
  const size_t count = dcpxd_records_count(s);
  const uint32_t W = g->shape.world, R = g->shape.rows;
  rkey *keys;
  size_t n = 0, marked = 0;

  if (!g->hdr || !g->harvested || count == 0)
    return;
  keys = malloc(count * sizeof(*keys));
  if (!keys)
    return; /* at worst some records are stored twice */
  for (size_t i = 0; i < count; i++) {
    const dcpxd_record *r = dcpxd_records_get(s, i);
    if (strcmp(r->group, g->name) != 0)
      continue;
    keys[n++] = (rkey){r->rank, r->block, r->time_ns, r->call_tag};
  }
  qsort(keys, n, sizeof(*keys), cmp_rkey);
  for (uint32_t d = 0; d < W && n; d++)
    for (uint32_t t = 0; t < R; t++) {
      const dcpx_wait_record *w = dcpxd_group_record(g, d, t);
      size_t bit = (size_t)d * R + t;
      rkey k;
      if (__atomic_load_n(&w->kind, __ATOMIC_ACQUIRE) == DCPX_REC_EMPTY)
        continue;
      k = (rkey){d, w->block, w->time_ns, w->call_tag};
      if (bsearch(&k, keys, n, sizeof(*keys), cmp_rkey)) {
        g->harvested[bit / 8] |= (uint8_t)(1u << (bit % 8));
        marked++;
      }
    }
  free(keys);
  if (marked)
    log_info("group=%s: %zu wait record%s in its control page already "
             "stored before the restart",
             g->name, marked, marked == 1 ? "" : "s");
}

void dcpxd_health_scan(dcpxd_manager *m) {
  dcpxd_group *g, *next;
  uint64_t now = 0;

  /* Awaited ranks (adopted groups): a dead pid aborts its group; a group
   * no rank is left to, live or awaited, goes (the walk keeps `next`). */
  for (g = TAILQ_FIRST(&m->groups); g; g = next) {
    next = TAILQ_NEXT(g, link);
    if (!g->awaiting)
      continue;
    if (!now)
      now = dcpxd_now_ns(CLOCK_MONOTONIC);
    if (now < g->next_pid_check_ns)
      continue;
    g->next_pid_check_ns = now + DCPXD_PID_CHECK_MS * 1000000ull;
    dcpxd_group_check_awaiting(g);
    (void)dcpxd_group_reap_empty(g); /* the walk kept `next` */
  }

  TAILQ_FOREACH(g, &m->groups, link) {
    if (g->state == DCPXD_GROUP_READY && g->hdr && !g->hdr->abort)
      (void)dcpxd_health_alarm_abort(g, "");
  }
}

bool dcpxd_health_alarm_abort(dcpxd_group *g, const char *also) {
  for (uint32_t r = 0; r < g->shape.world; r++) {
    if (dcpxd_group_health(g, r)->alarm) {
      char detail[320];
      dcpxd_bprintf(detail, "rank %u raised its alarm (a wait timed out, or "
                            "a call was refused)%s",
                    r, also);
      dcpxd_group_abort(g, DCPX_ABORT_ALARM, (int32_t)r, detail);
      return true;
    }
  }
  return false;
}
