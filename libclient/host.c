/* host.c - the host backend: the exchange and merge of docs/PROTOCOL.md
 * run on shared memory (memfds owned by dcpxd), synchronously on the
 * calling thread.
 *
 * It is the CUDA kernels' protocol, step for step, with CPU memory
 * ordering:
 *
 *   push   call_seq += 1; for each row t: e = tag(epoch[t]); the local
 *          top-N list in wire words; for every rank d (itself included)
 *          and pair i, the LL pair (w[2i], e, w[2i+1], e) as two 8-byte
 *          atomic stores at ws[d].ll_slots[e & 1][rank][t][i]. A reader
 *          accepts a half when its tag is e, so no flag or fence is needed
 *          on the send side.
 *   merge  for each row t: wait for all W lists' tags; round 1; if ranks
 *          are saturated, q = next(seq2[t]): each saturated rank s stores
 *          its rescue list (dcpx__rescue_list) as LL pairs tagged q into
 *          rescue slot popcount(mask & ((1 << s) - 1)) of every rank; every
 *          rank waits until every half of every saturated rank's slot
 *          carries q, copying the words out as it accepts them; round 2;
 *          seq2[t] = q; then the outputs, and last epoch[t] = e. Once
 *          every row is merged, the rows t >= rows that the call did not
 *          hold take the call half of e (dcpx_epoch_pass).
 *
 * Invariants:
 *  1. Synchronous calls give the ordering docs/PROTOCOL.md section 4 needs for
 *     free: a rank's push of call n+1 starts after its merge of call n
 *     returned, so a parity's slots are never rewritten while a peer reads
 *     them, and a rescue slot is rewritten only with the next q of its row.
 *  2. A word is used only from the load whose tag half was accepted; the
 *     shared slots are never re-read without that check.
 *  3. Every wait is bounded (section 6): it spins, then yields the CPU so
 *     that W ranks on fewer cores still progress, and gives up when the
 *     group is aborted, this rank is FAILED, or the row's wait phase (from
 *     the start of the row's first wait in the call) has lasted longer
 *     than the group's timeout: a peer that trickles pairs in cannot hold
 *     a row for many timeouts. On a timeout it writes its record slot (if
 *     empty), then the alarm word, then, after a full fence, FAILED.
 *  4. Records and the fault hook name a call by call_seq (the workspace
 *     word that the push counts up), as the kernels do: CUDA graphs freeze
 *     the by-value call tag, which is only kept as last_call_tag.
 *  5. The call path allocates nothing and makes no syscall except
 *     sched_yield in a wait that has already spun (clock_gettime is vDSO),
 *     and nanosleep in a fault stall (tests only).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
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

/* This rank's call_seq: calls pushed since the workspace was zeroed. */
static inline volatile uint64_t *call_seq(const struct dcpx_member *m) {
  return &((dcpx_rank_state *)(m->ws[m->rank] + m->L.off_call))->call_seq;
}

/* The group's wait timeout (the control page's; the join's if unset). */
static inline uint64_t wait_limit(const struct dcpx_member *m) {
  const uint64_t v = m->hdr->timeout_ns;
  return v ? v : m->timeout_ns;
}

int dcpx__host_init(struct dcpx_member *m) {
  const uint32_t W = m->shape.world;
  int r = dcpx__merge_ws_init(&m->mws, &m->shape);
  if (r < 0)
    return r;
  m->lists_buf = calloc((size_t)W * m->L.rw_n, sizeof(uint32_t));
  m->klist = calloc(m->L.rw_k, sizeof(uint32_t));
  m->rlists = calloc((size_t)m->L.rescue_slots * m->L.rw_k, sizeof(uint32_t));
  if (!m->lists_buf || !m->klist || !m->rlists) {
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
  free(m->rlists);
  m->lists_buf = m->klist = m->rlists = NULL;
}

/* A call that this rank abandons before doing its part (bad arguments, a
 * launch that failed) would leave its epochs one call behind its peers',
 * and the next call would silently pair different calls. So the rank
 * raises its alarm and sets FAILED, as a timed-out wait does: dcpxd aborts
 * the group and every rank recovers (docs/PROTOCOL.md section 6). */
void dcpx__member_fail(struct dcpx_member *m) {
  dcpx_rank_health *h = &m->health[m->rank];
  __atomic_store_n(&h->alarm, 1u, __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&h->failed, 1u, __ATOMIC_RELEASE);
}

void dcpx__member_give_up(struct dcpx_member *m, uint32_t kind,
                          const dcpx_wait_record *x) {
  dcpx_wait_record *rec =
      &m->records[(size_t)m->rank * m->L.rows + x->block];
  if (__atomic_load_n(&rec->kind, __ATOMIC_ACQUIRE) == DCPX_REC_EMPTY) {
    rec->region = x->region;
    rec->index = x->index;
    rec->expected = x->expected;
    rec->seen = x->seen;
    rec->block = x->block;
    rec->time_ns = clock_ns(CLOCK_REALTIME);
    rec->call_tag = x->call_tag;
    rec->generation = m->hdr->generation;
    rec->rank = m->rank;
    __atomic_store_n(&rec->kind, kind, __ATOMIC_RELEASE);
  }
  dcpx__member_fail(m);
}

void dcpx__member_refuse(struct dcpx_member *m) {
  m->refused_gen = m->hdr->generation + 1u;
  dcpx__member_fail(m);
}

/* A new call (push or merge) of `rows` rows: its failed rows start empty
 * (dcpx_member_async_error). */
void dcpx__member_rows_begin(struct dcpx_member *m, uint32_t rows) {
  if (m->row_err_set) {
    memset(m->row_err, 0, sizeof(m->row_err));
    m->row_err_set = 0;
  }
  m->last_rows = rows;
  m->bt_rows_bad = 0;
}

/* Rows [0, rows) of the last call failed (dcpx_member_async_error). */
static void rows_failed(struct dcpx_member *m, uint32_t rows) {
  if (rows > m->shape.rows)
    rows = m->shape.rows;
  for (uint32_t w = 0; w < rows / 64; w++)
    m->row_err[w] = ~0ull;
  if (rows % 64)
    m->row_err[rows / 64] |= (1ull << (rows % 64)) - 1;
  m->row_err_set = rows != 0;
}

/* Why a wait must stop early, or 0. */
static inline int stop_reason(const struct dcpx_member *m) {
  if (__atomic_load_n(&m->hdr->abort, __ATOMIC_ACQUIRE))
    return DCPX_E_ABORTED;
  if (__atomic_load_n(&m->health[m->rank].failed, __ATOMIC_ACQUIRE))
    return DCPX_E_FAILED;
  return 0;
}

/* The waits of one row in one call. */
typedef struct row_wait {
  uint32_t t, e; /* the row and its epoch */
  uint64_t call; /* call_seq: the records' and the fault hook's call */
  uint64_t t0;   /* start of the row's first wait (0: none yet) */
  int hook;      /* 1: the fault hook is still to be checked (row 0) */
} row_wait;

/* Records a timeout, then alarm and FAILED (section 6). */
static void give_up(struct dcpx_member *m, const row_wait *w, uint32_t region,
                    uint32_t index, uint32_t expected, uint32_t seen) {
  dcpx_wait_record x = {0};
  x.region = region;
  x.index = index;
  x.expected = expected;
  x.seen = seen;
  x.block = w->t;
  x.call_tag = w->call;
  DCPX_WARN("group %s rank %u: a wait timed out (row %u, call %llu, region "
            "%u index %u: tag %u expected, %u seen); this rank is FAILED",
            m->group, m->rank, w->t, (unsigned long long)w->call, region,
            index, expected, seen);
  dcpx__member_give_up(m, DCPX_REC_TIMEOUT, &x);
}

/* Sleeps ns, in steps of at most 1 ms, or until a wait would stop. */
static void stall(const struct dcpx_member *m, uint64_t ns) {
  const uint64_t until = clock_ns(CLOCK_MONOTONIC) + ns;
  for (uint64_t now = clock_ns(CLOCK_MONOTONIC); now < until && !stop_reason(m);
       now = clock_ns(CLOCK_MONOTONIC)) {
    const uint64_t step = until - now < 1000000u ? until - now : 1000000u;
    struct timespec ts = {0, (long)step};
    nanosleep(&ts, NULL);
  }
}

/* The fault hook: row 0 stalls once, in the call whose epoch (the row
 * half of row 0's tag) and call_seq match, for fault_ticks but at most
 * the group's timeout. It is checked
 * where the GPU's block 0 checks it: at the row's first unsatisfied wait,
 * or after round 1's reads if none was unsatisfied. */
static void fault_hook(struct dcpx_member *m, row_wait *w) {
  dcpx_rank_health *h = &m->health[m->rank];
  w->hook = 0;
  if (!__atomic_load_n(&h->fault_armed, __ATOMIC_ACQUIRE) || h->fault_fired)
    return;
  if ((h->fault_epoch && h->fault_epoch != (w->e & 0xFFFFu)) ||
      (h->fault_call != ~0ull && h->fault_call != w->call))
    return;
  h->fault_fired = 1;
  const uint64_t limit = wait_limit(m);
  stall(m, h->fault_ticks < limit ? h->fault_ticks : limit);
}

/* Waits until the LL half at p, an 8-byte (word, tag) element with index
 * `index` in `region`, carries tag `expected`; *ret_word gets the word of
 * that very load. */
static int wait_half(struct dcpx_member *m, row_wait *w, uint32_t region,
                     const uint64_t *p, uint32_t expected, uint32_t index,
                     uint32_t *ret_word) {
  if (!w->t0)
    w->t0 = clock_ns(CLOCK_MONOTONIC);
  for (uint32_t it = 0;; it++) {
    const uint64_t v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    const uint32_t seen = (uint32_t)(v >> 32);
    if (seen == expected) {
      *ret_word = (uint32_t)v;
      return 0;
    }
    if (w->hook)
      fault_hook(m, w);
    int r = stop_reason(m);
    if (r)
      return r;
    if (dcpx_tag_other_call(region, expected, seen)) { /* never comes */
      give_up(m, w, region, index, expected, seen);
      return DCPX_E_FAILED;
    }
    if (it < SPIN_ITERS) {
      cpu_relax();
      continue;
    }
    if (clock_ns(CLOCK_MONOTONIC) - w->t0 > wait_limit(m)) {
      give_up(m, w, region, index, expected, seen);
      return DCPX_E_FAILED;
    }
    sched_yield();
  }
}

/* Waits for the n words of a list stored as LL pairs tagged `tag` at byte
 * offset `off` of region `region` in this rank's workspace, into words. */
static int wait_list(struct dcpx_member *m, row_wait *w, uint32_t region,
                     uint64_t off, uint32_t n, uint32_t tag, uint32_t *words) {
  const uint64_t *src =
      (const uint64_t *)(m->ws[m->rank] + m->L.reg[region].off + off);
  for (uint32_t h = 0; h < n; h++) {
    int r = wait_half(m, w, region, &src[h], tag, (uint32_t)(off / 8u) + h,
                      &words[h]);
    if (r < 0)
      return r;
  }
  return 0;
}

/* Waits for a rescue list (capacity K, row_words(K) words) stored as LL
 * pairs tagged `tag` at byte offset `off` of this rank's rescue region,
 * into words: only the words that are sent (docs/PROTOCOL.md 5.4). The
 * entries come first, so the end mark (the first empty entry) is seen
 * before any word whose being sent depends on the count; the others are
 * 0 by definition. */
static int wait_rescue(struct dcpx_member *m, row_wait *w, uint64_t off,
                       uint32_t tag, uint32_t *words) {
  const uint32_t K = m->L.topk, n = m->L.rw_k;
  const uint64_t *src = (const uint64_t *)(m->ws[m->rank] +
                                           m->L.reg[DCPX_REGION_RESCUE].off + off);
  uint32_t c = K; /* known once h passes it */
  for (uint32_t h = 0; h < n; h++) {
    if (h < K ? h > c : !dcpx_rescue_word_sent(K, c, h)) {
      words[h] = 0;
      continue;
    }
    int r = wait_half(m, w, DCPX_REGION_RESCUE, &src[h], tag,
                      (uint32_t)(off / 8u) + h, &words[h]);
    if (r < 0)
      return r;
    if (h < c && words[h] == 0)
      c = h;
  }
  return 0;
}

/* Stores this rank's rescue list (capacity K, c entries) as LL pairs
 * tagged `tag` at byte offset `off` of every rank's rescue region (itself
 * included): the pairs that are sent (docs/PROTOCOL.md 5.4), both halves
 * of each; every pair when the tag is a refresh (dcpx_rescue_refresh). */
static void ll_store_rescue(struct dcpx_member *m, uint64_t off,
                            const uint32_t *words, uint32_t c, uint32_t tag) {
  const uint32_t K = m->L.topk;
  const int all = dcpx_rescue_refresh(tag);
  for (uint32_t d = 0; d < m->L.world; d++) {
    uint64_t *dst = (uint64_t *)(m->ws[d] +
                                 m->L.reg[DCPX_REGION_RESCUE].off + off);
    for (uint32_t i = 0; i < m->L.rpairs; i++)
      if (all || dcpx_rescue_pair_sent(K, c, i))
        for (uint32_t h = 2 * i; h < 2 * i + 2; h++)
          __atomic_store_n(&dst[h], ((uint64_t)tag << 32) | words[h],
                           __ATOMIC_RELAXED);
  }
}

/* A refresh (dcpx_rescue_refresh(tag), docs/PROTOCOL.md 5.4): the slots
 * of row t that no rank holds in this rescue (slot nsat and up), every
 * pair of them in this rank's own rescue region, zeros tagged `tag`, so
 * that every copy of every slot is rewritten at least once per 131,070
 * rescues of the row. Nobody reads or writes them in this rescue. */
static void ll_refresh_unused(struct dcpx_member *m, uint32_t t,
                              uint32_t nsat, uint32_t tag) {
  const dcpx_layout *L = &m->L;
  uint64_t *dst = (uint64_t *)(m->ws[m->rank] + L->reg[DCPX_REGION_RESCUE].off +
                               dcpx_rescue_offset(L, t, nsat, 0));
  const uint64_t n = 2ull * (L->rescue_slots - nsat) * L->rpairs;
  for (uint64_t h = 0; h < n; h++) /* the slots are contiguous */
    __atomic_store_n(&dst[h], (uint64_t)tag << 32, __ATOMIC_RELAXED);
}

/* Stores the n (even) words as n/2 LL pairs tagged `tag` at byte offset
 * `off` of region `region` in every rank's workspace (itself included). */
static void ll_store_all(struct dcpx_member *m, uint32_t region, uint64_t off,
                         const uint32_t *words, uint32_t n, uint32_t tag) {
  for (uint32_t d = 0; d < m->L.world; d++) {
    uint64_t *dst = (uint64_t *)(m->ws[d] + m->L.reg[region].off + off);
    for (uint32_t h = 0; h < n; h++)
      __atomic_store_n(&dst[h], ((uint64_t)tag << 32) | words[h],
                       __ATOMIC_RELAXED);
  }
}

/* 1, the refusal said, when the array `what` (an empty call's arrays are
 * never read) is not aligned to its element of `bytes` bytes, as the CUDA
 * backend refuses it; else 0. */
static int misaligned(struct dcpx_member *m, const char *fn, uint32_t rows,
                      const char *what, const void *p, uintptr_t bytes) {
  if (!rows || dcpx__aligned(p, bytes))
    return 0;
  DCPX_REFUSE(m, "%s: group %s rank %u: %s (%p) is not aligned to its "
              "%u-byte element (bf16 logits 2 bytes, int32 arrays 4)",
              fn, m->group, m->rank, what, p, (unsigned)bytes);
  return 1;
}

/* need_logits: 0 for dcpx_push_list, which reads neither the logits nor
 * their stride. */
static int check_rows(struct dcpx_member *m, const char *fn, uint32_t rows,
                      const uint16_t *logits, uint64_t stride,
                      const int32_t *row_ends, int need_logits) {
  if (rows && ((!logits && need_logits) || !row_ends)) { /* an empty call
                                                            * may pass NULL */
    DCPX_REFUSE(m, "%s: group %s rank %u: %s is NULL", fn, m->group, m->rank,
                row_ends ? "logits" : "row_ends");
    return DCPX_E_INVAL;
  }
  if ((need_logits && misaligned(m, fn, rows, "logits", logits, 2)) ||
      misaligned(m, fn, rows, "row_ends", row_ends, 4))
    return DCPX_E_INVAL;
  if (rows > m->shape.rows) {
    DCPX_REFUSE(m, "%s: group %s rank %u: rows %u > the shape's %u", fn,
                m->group, m->rank, rows, m->shape.rows);
    return DCPX_E_RANGE;
  }
  if (need_logits && !dcpx__logits_fit(logits, rows, stride)) {
    DCPX_REFUSE(m, "%s: group %s rank %u: stride %llu: %u rows of logits "
                "that far apart run past the end of the address space",
                fn, m->group, m->rank, (unsigned long long)stride, rows);
    return DCPX_E_INVAL;
  }
  const uint64_t lim = need_logits && stride < m->shape.max_local
                           ? stride
                           : m->shape.max_local;
  for (uint32_t t = 0; t < rows; t++)
    if (row_ends[t] < 0 || (uint64_t)row_ends[t] > lim) {
      if (need_logits)
        DCPX_REFUSE(m, "%s: group %s rank %u: row_ends[%u] = %d is outside "
                    "0..%llu (max_local %u, stride %llu)",
                    fn, m->group, m->rank, t, row_ends[t],
                    (unsigned long long)lim, m->shape.max_local,
                    (unsigned long long)stride);
      else /* dcpx_push_list: no logits, no stride */
        DCPX_REFUSE(m, "%s: group %s rank %u: row_ends[%u] = %d is outside "
                    "0..%llu (max_local %u)",
                    fn, m->group, m->rank, t, row_ends[t],
                    (unsigned long long)lim, m->shape.max_local);
      return DCPX_E_RANGE;
    }
  return 0;
}

int dcpx__host_push(struct dcpx_member *m, const dcpx_call *in) {
  const uint32_t rows = in->rows;
  const uint16_t *logits = in->logits;
  const uint64_t stride = in->stride;
  const int32_t *row_ends = in->row_ends;
  const dcpx_layout *L = &m->L;
  const uint32_t *epoch = ws_u32(m, m->rank, L->off_epoch);
  uint32_t *w = m->lists_buf; /* scratch: the list being pushed */
  int r = check_rows(m, "dcpx_push", rows, logits, stride, row_ends, 1);
  dcpx__member_rows_begin(m, rows);
  if (r < 0) {
    dcpx__member_refuse(m);
    rows_failed(m, rows);
    return r;
  }
  *call_seq(m) += 1;
  r = stop_reason(m);
  if (r < 0) {
    rows_failed(m, rows);
    return r;
  }

  for (uint32_t t = 0; t < rows; t++) {
    uint32_t e = dcpx_epoch_tag(epoch[t]);
    dcpx__local_list(logits + t * stride, (uint32_t)row_ends[t],
                     L->local_topk, w);
    /* rw_n is a multiple of 4, so the list is exactly `pairs` pairs. */
    ll_store_all(m, DCPX_REGION_LL_SLOTS,
                 dcpx_ll_offset(L, e & 1, m->rank, t, 0), w, L->rw_n, e);
  }
  return 0;
}

/* dcpx_push_list's arguments, every row's list included: all are checked
 * before anything is stored, so a refused call stores nothing. */
static int check_lists(struct dcpx_member *m, const dcpx_call *in,
                       const dcpx_lists *li) {
  const uint32_t N = m->L.local_topk;
  const char *why = "";
  int r = check_rows(m, "dcpx_push_list", in->rows, in->logits, in->stride,
                     in->row_ends, 0);
  if (r == 0)
    r = dcpx__lists_check("dcpx_push_list", li, in->rows, N, m->why,
                          sizeof(m->why));
  for (uint32_t t = 0; r >= 0 && t < in->rows; t++) {
    r = dcpx__given_list(li->values + (uint64_t)t * N,
                         li->indices + (uint64_t)t * N, N,
                         (uint32_t)in->row_ends[t], m->lists_buf, &why);
    if (r < 0)
      DCPX_REFUSE(m, "dcpx_push_list: group %s rank %u: row %u's list has %s",
                  m->group, m->rank, t, why);
  }
  return r < 0 ? r : 0;
}

int dcpx__host_push_list(struct dcpx_member *m, const dcpx_call *in,
                         const dcpx_lists *li) {
  const dcpx_layout *L = &m->L;
  const uint32_t *epoch = ws_u32(m, m->rank, L->off_epoch);
  const uint32_t N = L->local_topk;
  uint32_t *w = m->lists_buf; /* scratch: the list being pushed */
  int r = check_lists(m, in, li);
  dcpx__member_rows_begin(m, in->rows);
  if (r < 0) {
    dcpx__member_refuse(m);
    rows_failed(m, in->rows);
    return r;
  }
  *call_seq(m) += 1;
  r = stop_reason(m);
  if (r < 0) {
    rows_failed(m, in->rows);
    return r;
  }

  for (uint32_t t = 0; t < in->rows; t++) {
    uint32_t e = dcpx_epoch_tag(epoch[t]);
    dcpx__given_list(li->values + (uint64_t)t * N,
                     li->indices + (uint64_t)t * N, N,
                     (uint32_t)in->row_ends[t], w, NULL);
    ll_store_all(m, DCPX_REGION_LL_SLOTS,
                 dcpx_ll_offset(L, e & 1, m->rank, t, 0), w, L->rw_n, e);
  }
  return 0;
}

/* What a merge call gives every row. */
typedef struct merge_args {
  const uint16_t *logits;
  uint64_t stride;
  const int32_t *row_ends, *req_id, *block_table;
  uint32_t bt_rows, bt_cols;
  int32_t *rows_out, *valid_out, *ids_out;
  uint32_t *sat_word;
} merge_args;

/* Round 1's inputs: the W lists of row t, from this rank's LL slots. */
static int read_lists(struct dcpx_member *m, row_wait *w) {
  const dcpx_layout *L = &m->L;
  for (uint32_t s = 0; s < L->world; s++) {
    int r = wait_list(m, w, DCPX_REGION_LL_SLOTS,
                      dcpx_ll_offset(L, w->e & 1, s, w->t, 0), L->rw_n, w->e,
                      (uint32_t *)m->lists[s]);
    if (r < 0)
      return r;
  }
  if (w->hook)
    fault_hook(m, w);
  return 0;
}

/* Round 2's inputs of row t: this rank's rescue list, if it is saturated,
 * into its slot of every rank, then every saturated rank's list out of
 * this rank's slots into m->rlists; klists[s] points at rank s's. */
static int rescue(struct dcpx_member *m, row_wait *w, const merge_args *a,
                  uint32_t mask, uint32_t sw, uint32_t q,
                  const uint32_t **klists) {
  const dcpx_layout *L = &m->L;
  const uint32_t me = m->rank, t = w->t;
  if ((mask >> me) & 1u) {
    const uint32_t c =
        dcpx__rescue_list(a->logits + t * a->stride, (uint32_t)a->row_ends[t],
                          L->topk, sw & 0xFFFFu, m->klist);
    ll_store_rescue(m, dcpx_rescue_offset(L, t, dcpx_rescue_slot(mask, me), 0),
                    m->klist, c, q);
  }
  if (dcpx_rescue_refresh(q))
    ll_refresh_unused(m, t, (uint32_t)__builtin_popcount(mask), q);
  for (uint32_t s = 0; s < L->world; s++) {
    if (!((mask >> s) & 1u))
      continue;
    const uint32_t slot = dcpx_rescue_slot(mask, s);
    uint32_t *words = m->rlists + (size_t)slot * L->rw_k;
    int r = wait_rescue(m, w, dcpx_rescue_offset(L, t, slot, 0), q, words);
    if (r < 0)
      return r;
    klists[s] = words;
  }
  return 0;
}

/* Outputs of row t (section 5.6). A bad block table costs the row its
 * rows_out (-1, valid_out -1), not the group its protocol: the caller
 * still advances the epochs. ids_out does not depend on the table and is
 * written as the kernels write it. */
static int row_outputs(struct dcpx_member *m, uint32_t t, const merge_args *a) {
  const uint32_t K = m->L.topk;
  const dcpx__merge_ws *ws = &m->mws;
  int32_t *rows_out = a->rows_out + (size_t)t * K;
  int32_t *ids_out = a->ids_out ? a->ids_out + (size_t)t * K : NULL;
  int r = dcpx__outputs(ws, &m->shape, m->rank, a->req_id[t], a->block_table,
                        a->bt_rows, a->bt_cols, rows_out, a->valid_out + t,
                        ids_out);
  if (r == 0)
    return 0;
  for (uint32_t i = 0; i < K; i++) {
    rows_out[i] = -1;
    if (ids_out)
      ids_out[i] = i < ws->nsel
                       ? (int32_t)dcpx__gid(ws->sel_l[i], ws->sel_r[i],
                                           m->L.world, m->shape.interleave)
                       : -1;
  }
  a->valid_out[t] = -1;
  m->row_err[t / 64] |= 1ull << (t % 64);
  m->row_err_set = 1;
  return r;
}

static int merge_row(struct dcpx_member *m, uint32_t t, const merge_args *a,
                     uint64_t call, int *ret_rescued) {
  const dcpx_layout *L = &m->L;
  uint32_t *epoch = ws_u32(m, m->rank, L->off_epoch);
  uint32_t *seq2 = ws_u32(m, m->rank, L->off_seq2);
  row_wait w = {t, dcpx_epoch_tag(epoch[t]), call, 0, t == 0};
  const uint32_t *klists[DCPX_MAX_WORLD];
  uint32_t sw, q = dcpx_epoch_next(seq2[t]);
  dcpx__sel s1;

  int r = read_lists(m, &w);
  if (r < 0)
    return r;
  const uint32_t mask = dcpx__round1(&m->mws, m->lists, &s1, &sw);
  if (mask && (r = rescue(m, &w, a, mask, sw, q, klists)) < 0)
    return r;
  dcpx__finish(&m->mws, &s1, mask, klists);
  r = row_outputs(m, t, a);
  if (mask)
    seq2[t] = q;
  ws_u32(m, m->rank, L->off_sat)[t] = sw;
  if (a->sat_word)
    a->sat_word[t] = sw;
  uint64_t *st = (uint64_t *)(m->ws[m->rank] + L->off_stats) + 2 * (size_t)t;
  st[0]++;
  st[1] += mask != 0;
  *ret_rescued = mask != 0;
  /* Last: every word of the row has been read. */
  __atomic_store_n(&epoch[t], w.e, __ATOMIC_RELEASE);
  return r;
}

/* After a merge of rows 0..rows-1: the rows the call did not hold take
 * its call half, so that every epoch word counts the same calls and a
 * peer that called with other rows, pushing row t in a later call with
 * the row half awaited here, carries another tag (docs/PROTOCOL.md 4.3).
 * A merge of 0 rows is a call too: every row takes the call half of
 * tag(epoch[0]), so that a rank that calls with 0 rows while its peers
 * call with rows is seen as any other rows mismatch. */
static void pass_rows(struct dcpx_member *m, uint32_t rows) {
  uint32_t *epoch = ws_u32(m, m->rank, m->L.off_epoch);
  /* row 0's tag, which a call of rows >= 1 holds and has just written */
  const uint32_t e = rows ? epoch[0] : dcpx_epoch_tag(epoch[0]);
  for (uint32_t t = rows; t < m->L.rows; t++)
    epoch[t] = dcpx_epoch_pass(epoch[t], e);
}

int dcpx__host_merge(struct dcpx_member *m, const dcpx_call *in,
                     const dcpx_merge_out *out) {
  const merge_args a = {in->logits,      in->stride,      in->row_ends,
                        in->req_id,      in->block_table, in->bt_rows,
                        in->bt_cols,     out->rows_out,   out->valid_out,
                        out->ids_out,    out->sat_word};
  const uint32_t rows = in->rows;
  int32_t *valid_out = out->valid_out;
  dcpx_rank_health *h = &m->health[m->rank];
  const uint64_t call = *call_seq(m);
  uint64_t rescued = 0;
  int r, range = 0;

  dcpx__member_rows_begin(m, rows);
  const int no_args = rows && (!in->req_id || !in->block_table ||
                                !out->rows_out || !valid_out);
  if (no_args)
    DCPX_REFUSE(m, "dcpx_merge: group %s rank %u: req_id, block_table, "
                "rows_out and valid_out must not be NULL", m->group, m->rank);
  r = no_args ? DCPX_E_INVAL
              : check_rows(m, "dcpx_merge", rows, in->logits, in->stride,
                           in->row_ends, 1);
  if (r == 0 &&
      (misaligned(m, "dcpx_merge", rows, "req_id", in->req_id, 4) ||
       misaligned(m, "dcpx_merge", rows, "block_table", in->block_table, 4) ||
       misaligned(m, "dcpx_merge", rows, "rows_out", out->rows_out, 4) ||
       misaligned(m, "dcpx_merge", rows, "valid_out", valid_out, 4) ||
       misaligned(m, "dcpx_merge", rows, "ids_out", out->ids_out, 4) ||
       misaligned(m, "dcpx_merge", rows, "sat_word", out->sat_word, 4)))
    r = DCPX_E_INVAL;
  int shared = 0; /* outputs that overlap: no -1 either, it could land on
                    another array (a block table past the address space's
                    end is refused with -1 written, as any bad argument) */
  if (r == 0)
    r = dcpx__merge_disjoint(m, "dcpx_merge", in, out, &shared);
  if (r < 0) { /* refused: valid_out -1 on the rows it can hold (not a
                  misaligned one: that store is undefined behaviour) */
    for (uint32_t t = 0; valid_out && dcpx__aligned(valid_out, 4) &&
                         !shared && t < rows && t < m->shape.rows;
         t++)
      valid_out[t] = -1;
    dcpx__member_refuse(m);
    rows_failed(m, rows);
    return r;
  }
  r = stop_reason(m); /* looked at at the start (docs/PROTOCOL.md 6.4) */
  if (!rows) { /* nothing to wait for, no output, not counted; a failed */
    if (r == 0) /* rank or an aborted group still says so (the push too) */
      pass_rows(m, 0);
    return r;
  }
  uint32_t range_row = 0;
  for (uint32_t t = 0; t < rows && r == 0; t++) {
    int resc = 0;
    int rr = merge_row(m, t, &a, call, &resc);
    rescued += (uint64_t)resc;
    if (rr == DCPX_E_RANGE && !range)
      range_row = t;
    if (rr == DCPX_E_RANGE)
      range = rr;
    else
      r = rr;
  }
  h->last_call_tag = in->call_tag;
  /* Only a call that completed says so: one that failed after a row out
   * of the table (a later row's wait timed out, the group aborted) is
   * not refused, and its reason stays "" (dcpx_member_last_error). */
  if (r == 0 && range)
    DCPX_REFUSE(m, "dcpx_merge: group %s rank %u: row %u's request "
                "(req_id %d) or one of its selected KV positions lies "
                "outside the block table (%u x %u) or maps to a negative "
                "block: its valid_out is -1 (the first such row; the "
                "call completed)",
                m->group, m->rank, range_row, in->req_id[range_row],
                in->bt_rows, in->bt_cols);
  if (r < 0) {
    for (uint32_t t = 0; t < rows; t++)
      valid_out[t] = -1;
    rows_failed(m, rows);
    h->failed_calls++;
    return r;
  }
  pass_rows(m, rows);
  m->bt_rows_bad = range != 0;
  h->calls++;
  h->rows += rows;
  h->rescue_rows += rescued;
  return range;
}
