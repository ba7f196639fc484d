/* host.c - the host backend: DESIGN.md's exchange and merge run on shared
 * memory (memfds owned by dcpxd), synchronously on the calling thread.
 *
 * It is the CUDA kernels' protocol, step for step, with CPU memory
 * ordering:
 *
 *   push   for each row t: e = next(epoch[t]); the local top-N list in wire
 *          words; for every rank d (itself included) and pair i, the tagged
 *          pair (w[2i], e, w[2i+1], e) as two 8-byte atomic stores at
 *          ws[d].ll_slots[e & 1][rank][t][4i]. A reader accepts a half when
 *          its tag is e, so no flag or fence is needed on the send side.
 *   merge  for each row t: wait for all W lists' tags; round 1; if ranks
 *          are saturated, each saturated rank s stores its capacity-K list
 *          into rescue slot popcount(mask & ((1 << s) - 1)) of every rank,
 *          fences, and release-stores next(seq2[t]) into every rank's
 *          flags[s][t]; every rank acquires those flags, runs round 2, and
 *          sets seq2[t]; then the outputs, and last epoch[t] = e.
 *
 * Invariants:
 *  1. Synchronous calls give the ordering DESIGN.md section 4 needs for
 *     free: a rank's push of call n+1 starts after its merge of call n
 *     returned, so a parity's slots are never rewritten while a peer reads
 *     them, and the rescue area is never rewritten while a peer reads it.
 *  2. Every wait is bounded (section 6): it spins, then yields the CPU so
 *     that W ranks on fewer cores still progress, and gives up when the
 *     group is aborted, this rank is FAILED, or timeout_ns passed. On a
 *     timeout it writes its record slot (if empty), then the alarm word,
 *     then, after a full fence, FAILED.
 *  3. The call path allocates nothing and makes no syscall except
 *     sched_yield in a wait that has already spun (clock_gettime is vDSO).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "member.h"

#define SPIN_ITERS 4096u

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint32_t *ws_u32(const struct dcpx_member *m, uint32_t d,
                               uint64_t off) {
  return (uint32_t *)(m->ws[d] + off);
}

int dcpx__host_init(struct dcpx_member *m) {
  const uint32_t W = m->shape.world;
  int r = dcpx__merge_ws_init(&m->mws, &m->shape);
  if (r < 0)
    return r;
  m->lists_buf = calloc((size_t)W * m->L.rw_n, sizeof(uint32_t));
  m->klist = calloc(m->L.rw_k, sizeof(uint32_t));
  if (!m->lists_buf || !m->klist) {
    dcpx__host_fini(m);
    return DCPX_E_NOMEM;
  }
  for (uint32_t s = 0; s < W; s++)
    m->lists[s] = m->lists_buf + (size_t)s * m->L.rw_n;
  return 0;
}

void dcpx__host_fini(struct dcpx_member *m) {
  dcpx__merge_ws_free(&m->mws);
  free(m->lists_buf);
  free(m->klist);
  m->lists_buf = m->klist = NULL;
}

/* Records a timeout, raises the alarm, then sets FAILED (section 6). */
static void give_up(struct dcpx_member *m, uint32_t region, uint32_t index,
                    uint32_t expected, uint32_t seen, uint32_t t,
                    uint64_t call_tag) {
  dcpx_rank_health *h = &m->health[m->rank];
  dcpx_wait_record *rec = &m->records[(size_t)m->rank * m->L.rows + t];

  if (__atomic_load_n(&rec->kind, __ATOMIC_ACQUIRE) == DCPX_REC_EMPTY) {
    rec->region = region;
    rec->index = index;
    rec->expected = expected;
    rec->seen = seen;
    rec->block = t;
    rec->time_ns = clock_ns(CLOCK_REALTIME);
    rec->call_tag = call_tag;
    rec->generation = m->hdr->generation;
    rec->rank = m->rank;
    __atomic_store_n(&rec->kind, DCPX_REC_TIMEOUT, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&h->alarm, 1u, __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&h->failed, 1u, __ATOMIC_RELEASE);
}

/* A call that this rank abandons before doing its part (bad arguments, a
 * launch that failed) would leave its epochs one call behind its peers',
 * and the next call would silently pair different calls. So the rank
 * raises its alarm and sets FAILED, as a timed-out wait does: dcpxd aborts
 * the group and every rank recovers (DESIGN.md section 6). */
void dcpx__member_fail(struct dcpx_member *m) {
  dcpx_rank_health *h = &m->health[m->rank];
  __atomic_store_n(&h->alarm, 1u, __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&h->failed, 1u, __ATOMIC_RELEASE);
}

/* Why a wait must stop early, or 0. */
static inline int stop_reason(const struct dcpx_member *m) {
  if (__atomic_load_n(&m->hdr->abort, __ATOMIC_ACQUIRE))
    return DCPX_E_ABORTED;
  if (__atomic_load_n(&m->health[m->rank].failed, __ATOMIC_ACQUIRE))
    return DCPX_E_FAILED;
  return 0;
}

/* The fault hook: row 0 stalls fault_ticks ns once, in the call whose
 * epoch and call tag match, before its first wait (where the GPU's block 0
 * stalls). */
static void fault_hook(struct dcpx_member *m, uint32_t e, uint64_t call_tag) {
  dcpx_rank_health *h = &m->health[m->rank];
  if (!__atomic_load_n(&h->fault_armed, __ATOMIC_ACQUIRE) || h->fault_fired)
    return;
  if ((h->fault_epoch && h->fault_epoch != e) ||
      (h->fault_call != ~0ull && h->fault_call != call_tag))
    return;
  h->fault_fired = 1;
  uint64_t until = clock_ns(CLOCK_MONOTONIC) + h->fault_ticks;
  while (clock_ns(CLOCK_MONOTONIC) < until)
    sched_yield();
}

/* Waits until the tag at p equals `expected`: for an LL pair half (an
 * 8-byte (word, tag) element, region ll_slots) the tag is its high half and
 * *ret_word gets its word; for a rescue flag (region rescue_flags) the tag
 * is the 4-byte flag itself, loaded with acquire. */
static int wait_tag(struct dcpx_member *m, uint32_t region, const void *p,
                    uint32_t expected, uint32_t index, uint32_t t,
                    uint64_t call_tag, uint32_t *ret_word) {
  const int half = region == DCPX_REGION_LL_SLOTS;
  uint64_t t0 = 0;
  uint32_t seen;
  for (uint32_t it = 0;; it++) {
    if (half) {
      uint64_t v = __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
      seen = (uint32_t)(v >> 32);
      *ret_word = (uint32_t)v;
    } else {
      seen = __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
    }
    if (seen == expected)
      return 0;
    int r = stop_reason(m);
    if (r)
      return r;
    if (it < SPIN_ITERS) {
      cpu_relax();
      continue;
    }
    uint64_t now = clock_ns(CLOCK_MONOTONIC);
    if (!t0)
      t0 = now;
    else if (now - t0 > m->timeout_ns) {
      give_up(m, region, index, expected, seen, t, call_tag);
      return DCPX_E_FAILED;
    }
    sched_yield();
  }
}

static int check_rows(const struct dcpx_member *m, uint32_t rows,
                      const uint16_t *logits, uint64_t stride,
                      const int32_t *row_ends) {
  if (!logits || !row_ends)
    return DCPX_E_INVAL;
  if (rows > m->shape.rows)
    return DCPX_E_RANGE;
  for (uint32_t t = 0; t < rows; t++)
    if (row_ends[t] < 0 || (uint32_t)row_ends[t] > m->shape.max_local ||
        (uint64_t)row_ends[t] > stride)
      return DCPX_E_RANGE;
  return 0;
}

int dcpx__host_push(struct dcpx_member *m, uint32_t rows,
                    const uint16_t *logits, uint64_t stride,
                    const int32_t *row_ends, uint64_t call_tag) {
  const dcpx_layout *L = &m->L;
  const uint32_t *epoch = ws_u32(m, m->rank, L->off_epoch);
  uint32_t *w = m->lists_buf; /* scratch: the list being pushed */
  int r = check_rows(m, rows, logits, stride, row_ends);
  (void)call_tag;
  if (r < 0) {
    dcpx__member_fail(m);
    return r;
  }
  r = stop_reason(m);
  if (r < 0)
    return r;

  for (uint32_t t = 0; t < rows; t++) {
    uint32_t e = dcpx_epoch_next(epoch[t]);
    dcpx__local_list(logits + t * stride, (uint32_t)row_ends[t],
                     L->local_topk, w);
    for (uint32_t d = 0; d < L->world; d++) {
      uint64_t *dst = (uint64_t *)(m->ws[d] + L->off_ll +
                                   dcpx_ll_offset(L, e & 1, m->rank, t, 0));
      /* rw_n is a multiple of 4, so the list is exactly `pairs` pairs. */
      for (uint32_t i = 0; i < L->pairs; i++) {
        __atomic_store_n(&dst[2 * i], ((uint64_t)e << 32) | w[2 * i],
                         __ATOMIC_RELAXED);
        __atomic_store_n(&dst[2 * i + 1], ((uint64_t)e << 32) | w[2 * i + 1],
                         __ATOMIC_RELAXED);
      }
    }
  }
  return 0;
}

/* Rescue of row t by this (saturated) rank: its capacity-K list into slot
 * `slot` of every rank's rescue area, then flags[rank][t] = q. */
static void rescue_push(struct dcpx_member *m, uint32_t t, uint32_t slot,
                        uint32_t q, const uint16_t *row, uint32_t len) {
  const dcpx_layout *L = &m->L;
  dcpx__local_list(row, len, L->topk, m->klist);
  for (uint32_t d = 0; d < L->world; d++) {
    uint32_t *dst = ws_u32(m, d, L->off_rescue) +
                    ((size_t)t * L->rescue_slots + slot) * L->rw_k;
    memcpy(dst, m->klist, sizeof(uint32_t) * L->rw_k);
  }
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  for (uint32_t d = 0; d < L->world; d++) {
    uint32_t *flag = ws_u32(m, d, L->off_flags) + (size_t)m->rank * L->rows + t;
    __atomic_store_n(flag, q, __ATOMIC_RELEASE);
  }
}

static int merge_row(struct dcpx_member *m, uint32_t t, const uint16_t *row,
                     uint32_t len, const int32_t *req_id,
                     const int32_t *block_table, uint32_t bt_rows,
                     uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                     int32_t *ids_out, uint32_t *sat_word, uint64_t call_tag,
                     int *ret_rescued) {
  const dcpx_layout *L = &m->L;
  const uint32_t W = L->world, me = m->rank;
  uint32_t *epoch = ws_u32(m, me, L->off_epoch);
  uint32_t *seq2 = ws_u32(m, me, L->off_seq2);
  uint32_t e = dcpx_epoch_next(epoch[t]), sw, mask, q = 0;
  const uint32_t *klists[DCPX_MAX_WORLD];
  dcpx__sel s1;
  int r;

  if (t == 0)
    fault_hook(m, e, call_tag);

  /* LL polls: rank s's list of row t, pair by pair, half by half. */
  for (uint32_t s = 0; s < W; s++) {
    const uint64_t *src = (const uint64_t *)(
        m->ws[me] + L->off_ll + dcpx_ll_offset(L, e & 1, s, t, 0));
    uint32_t *w = (uint32_t *)m->lists[s];
    for (uint32_t h = 0; h < 2 * L->pairs; h++) {
      /* Record index: the 8-byte half within the ll_slots region. */
      uint32_t index =
          (uint32_t)(dcpx_ll_offset(L, e & 1, s, t, 0) / 8u) + h;
      r = wait_tag(m, DCPX_REGION_LL_SLOTS, &src[h], e, index, t, call_tag,
                   &w[h]);
      if (r < 0)
        return r;
    }
  }

  mask = dcpx__round1(&m->mws, m->lists, &s1, &sw);
  if (mask) {
    q = dcpx_epoch_next(seq2[t]);
    if ((mask >> me) & 1u)
      rescue_push(m, t, (uint32_t)__builtin_popcount(mask & ((1u << me) - 1)),
                  q, row, len);
    for (uint32_t s = 0; s < W; s++) {
      if (!((mask >> s) & 1u))
        continue;
      const uint32_t *flag = ws_u32(m, me, L->off_flags) + (size_t)s * L->rows + t;
      r = wait_tag(m, DCPX_REGION_RESCUE_FLAGS, flag, q, s * L->rows + t, t,
                   call_tag, NULL);
      if (r < 0)
        return r;
      klists[s] = ws_u32(m, me, L->off_rescue) +
                  ((size_t)t * L->rescue_slots +
                   (uint32_t)__builtin_popcount(mask & ((1u << s) - 1))) *
                      L->rw_k;
    }
  }
  dcpx__finish(&m->mws, &s1, mask, klists);
  /* A bad block table costs this row its rows_out (-1, valid_out -1), not
   * the group its protocol: the epochs below still advance. ids_out does
   * not depend on the table and is written as the kernels write it. */
  r = dcpx__outputs(&m->mws, &m->shape, me, req_id[t], block_table, bt_rows,
                    bt_cols, rows_out, valid_out, ids_out);
  if (r < 0) {
    for (uint32_t i = 0; i < L->topk; i++) {
      rows_out[i] = -1;
      if (ids_out)
        ids_out[i] = i < m->mws.nsel
                         ? (int32_t)dcpx_gid(m->mws.sel_l[i], m->mws.sel_r[i],
                                             L->world, m->shape.interleave)
                         : -1;
    }
    *valid_out = -1;
  }
  if (mask)
    seq2[t] = q;
  ws_u32(m, me, L->off_sat)[t] = sw;
  if (sat_word)
    *sat_word = sw;
  uint64_t *st = (uint64_t *)(m->ws[me] + L->off_stats) + 2 * (size_t)t;
  st[0]++;
  st[1] += mask != 0;
  *ret_rescued = mask != 0;
  /* Last: every word of the row has been read. */
  __atomic_store_n(&epoch[t], e, __ATOMIC_RELEASE);
  return r;
}

int dcpx__host_merge(struct dcpx_member *m, uint32_t rows,
                     const uint16_t *logits, uint64_t stride,
                     const int32_t *row_ends, const int32_t *req_id,
                     const int32_t *block_table, uint32_t bt_rows,
                     uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                     int32_t *ids_out, uint32_t *sat_word, uint64_t call_tag) {
  const uint32_t K = m->shape.topk;
  dcpx_rank_health *h = &m->health[m->rank];
  uint64_t rescued = 0;
  int r, range = 0;

  if (!req_id || !block_table || !rows_out || !valid_out) {
    dcpx__member_fail(m);
    return DCPX_E_INVAL;
  }
  r = check_rows(m, rows, logits, stride, row_ends);
  if (r < 0) {
    dcpx__member_fail(m);
    return r;
  }
  r = stop_reason(m);
  for (uint32_t t = 0; t < rows && r == 0; t++) {
    int resc = 0;
    int rr = merge_row(m, t, logits + t * stride, (uint32_t)row_ends[t], req_id,
                  block_table, bt_rows, bt_cols, rows_out + (size_t)t * K,
                  valid_out + t, ids_out ? ids_out + (size_t)t * K : NULL,
                  sat_word ? sat_word + t : NULL, call_tag, &resc);
    rescued += (uint64_t)resc;
    if (rr == DCPX_E_RANGE)
      range = rr;
    else
      r = rr;
  }
  h->last_call_tag = call_tag;
  if (r < 0) {
    for (uint32_t t = 0; t < rows; t++)
      valid_out[t] = -1;
    h->failed_calls++;
    return r;
  }
  h->calls++;
  h->rows += rows;
  h->rescue_rows += rescued;
  return range;
}
