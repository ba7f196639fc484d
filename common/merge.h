/* merge.h - the selection core shared by the CPU reference and the host
 * backend (internal to libdcpx; the CUDA kernels mirror it in
 * kernels/dcpx_device.cuh).
 *
 * A key is an (ord16, l) pair plus the rank it came from; keys are always
 * laid out in ascending (r, l) order ("flat order"), so the tie rule of
 * docs/PROTOCOL.md section 2 is simply "earlier flat position wins". The
 * top-k of n keys is then described by a threshold T and a tie count `take`:
 *
 *   key i is selected  <=>  ord[i] > T, or ord[i] == T and it is one of the
 *                           first `take` keys (in flat order) with ord == T.
 *
 * When at most k keys are non-empty, T = 0 and take = 0: every non-empty
 * key (ord > 0) is selected. Otherwise T is the ord16 of the k-th best key
 * (>= 0x7F, never 0) and exactly k keys are selected.
 */
#ifndef DCPX_COMMON_MERGE_H
#define DCPX_COMMON_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "dcpx.h"

#define DCPX__HIDDEN __attribute__((visibility("hidden")))

/* dcpx_shape_check with one line of why in why[0..n) (the field and its
 * limit) when it refuses; why may be NULL. The rules live here only. */
DCPX__HIDDEN int dcpx__shape_why(const dcpx_shape *s, char *why, size_t n);
/* in, or in with local_topk = 0 resolved (dcpx_shape_auto_local_topk)
 * into *buf: the shape dcpx_join uses and dcpx_shape_check checks. */
DCPX__HIDDEN const dcpx_shape *dcpx__shape_resolved(const dcpx_shape *in,
                                                   dcpx_shape *buf);

/* Whether rows rows of bf16 logits `stride` elements apart, starting at
 * p, lie within the address space: the last row's start, p + (rows - 1) *
 * stride, and its `stride` elements do not run past its end (the host
 * backend and the reference read row t at p + t * stride, which for a
 * stride such as 2^62 would wrap around). */
static inline int dcpx__logits_fit(const uint16_t *p, uint32_t rows,
                                   uint64_t stride) {
  const uint64_t room = (UINTPTR_MAX - (uintptr_t)p) / sizeof(uint16_t);
  return rows < 2 || stride <= room / rows;
}

/* Whether a block table of rows x cols int32 at p lies within the address
 * space (4 rows cols bytes from p). One that does not (bt_rows = bt_cols
 * = 2^32 - 1 claims 2^66 bytes) was taken to run to the end of memory: a
 * lookup past the real table crashed the host backend and the reference,
 * or an overlap with an output refused it, as the memory lay. */
static inline int dcpx__table_fits(const int32_t *p, uint32_t rows,
                                   uint32_t cols) {
  const uint64_t words = (uint64_t)rows * cols; /* < 2^64 */
  return words <= (UINTPTR_MAX - (uintptr_t)p) / sizeof(int32_t);
}

/* Whether p is aligned to its element of `bytes` (a power of two) bytes,
 * as dcpx.h asks of every array (bf16 logits and values 2, the int32 and
 * uint32 arrays 4). The host backend and the reference read them as
 * such: a misaligned array is undefined behaviour in C, which a
 * vectorized loop may turn into a crash. NULL counts as aligned (the
 * callers check it on its own). */
static inline int dcpx__aligned(const void *p, uintptr_t bytes) {
  return ((uintptr_t)p & (bytes - 1u)) == 0;
}

/* Global id of local index l on rank r (dcpx_gid, arguments checked by
 * the caller: world, interleave >= 1, r < world). */
static inline int64_t dcpx__gid(uint32_t l, uint32_t r, uint32_t world,
                                uint32_t interleave) {
  return (int64_t)(l / interleave) * interleave * world +
         (int64_t)r * interleave + l % interleave;
}

typedef struct dcpx__sel {
  uint32_t T;     /* threshold ord16 (0: all non-empty keys selected) */
  uint32_t take;  /* keys with ord == T selected, first in flat order */
  uint32_t count; /* selected keys: min(k, non-empty keys) */
} dcpx__sel;

/* Order key of a bf16 for selection: ord16, or 0 for NaN (never a
 * candidate). */
static inline uint32_t dcpx__key_of_bf16(uint32_t b) {
  /* Branch-free: negative values flip all 16 bits, others only the sign;
   * NaN (magnitude above the infinity's) maps to 0. */
  b &= 0xFFFFu;
  uint32_t flip = 0x8000u | ((0u - (b >> 15)) & 0x7FFFu);
  uint32_t keep = 0u - (uint32_t)((b & 0x7FFFu) <= 0x7F80u);
  return (b ^ flip) & keep;
}

/* Top-k threshold of n keys ord[0..n) (0 = empty). */
DCPX__HIDDEN void dcpx__select(const uint16_t *ord, uint32_t n, uint32_t k,
                               dcpx__sel *ret);

/* Walks keys in flat order deciding membership: call once per key, in
 * order. */
typedef struct dcpx__sel_iter {
  dcpx__sel sel;
  uint32_t ties; /* keys with ord == T seen so far */
} dcpx__sel_iter;

static inline void dcpx__sel_iter_init(dcpx__sel_iter *it,
                                       const dcpx__sel *sel) {
  it->sel = *sel;
  it->ties = 0;
}

static inline int dcpx__sel_next(dcpx__sel_iter *it, uint32_t ord) {
  if (ord > it->sel.T)
    return 1;
  if (ord == it->sel.T && ord != 0)
    return it->ties++ < it->sel.take;
  return 0;
}

/* Per-row merge workspace, sized once for a shape (the host backend keeps
 * one per membership so its call path never allocates). */
typedef struct dcpx__merge_ws {
  uint32_t world, topk, local_topk, rescue_slots;
  uint32_t cap;  /* key capacity: max(W*N, S*K + K) */
  uint16_t *ord; /* [cap] */
  uint32_t *l;   /* [cap] */
  uint8_t *r;    /* [cap] */
  /* Final selection of the row, (r, l) order. */
  uint32_t nsel;
  uint8_t *sel_r; /* [K] */
  uint32_t *sel_l; /* [K] */
} dcpx__merge_ws;

/* Rescue slots per row: min(W, floor(K/N)) (docs/PROTOCOL.md 4.1 and 9:
 * the original design note said floor(K/N), but no more than W ranks can
 * ever be saturated, so the tail would be unused). */
static inline uint32_t dcpx__rescue_slots(uint32_t world, uint32_t topk,
                                          uint32_t local_topk) {
  uint32_t s = topk / local_topk;
  return s < world ? s : world;
}

DCPX__HIDDEN int dcpx__merge_ws_init(dcpx__merge_ws *ws,
                                     const dcpx_shape *shape);
DCPX__HIDDEN void dcpx__merge_ws_free(dcpx__merge_ws *ws);

/* Round 1 (docs/PROTOCOL.md section 5.1-5.2): lists[r] is rank r's capacity-N
 * list of the row (dcpx_row_words(N) words). Returns the saturation mask;
 * *ret_sat_word gets (mask << 16) | ord16 of S1's K-th key (0 if
 * count < K). Keys and S1 stay in ws for round 2. */
DCPX__HIDDEN uint32_t dcpx__round1(dcpx__merge_ws *ws,
                                   const uint32_t *const *lists,
                                   dcpx__sel *ret_s1, uint32_t *ret_sat_word);

/* Final selection into ws->sel_r/sel_l/nsel. With mask == 0 it is S1;
 * otherwise round 2 over rank-major keys: klists[s] (capacity K: the rescue
 * list of dcpx__rescue_list, or any superset of it within the local top-K)
 * for each saturated s, S1 entries of the others. klists[r] is read only
 * for r in mask. */
DCPX__HIDDEN void dcpx__finish(dcpx__merge_ws *ws, const dcpx__sel *s1,
                               uint32_t mask, const uint32_t *const *klists);

/* Outputs of rank d for one row from ws's final selection (section 5.6).
 * rows_out and ids_out (may be NULL) hold K entries. Returns 0 or
 * DCPX_E_RANGE (a block outside the table, or a KV row beyond int32). */
DCPX__HIDDEN int dcpx__outputs(const dcpx__merge_ws *ws, const dcpx_shape *sh,
                               uint32_t d, int32_t req_id,
                               const int32_t *block_table, uint32_t bt_rows,
                               uint32_t bt_cols, int32_t *rows_out,
                               int32_t *valid_out, int32_t *ids_out);

/* Local list of capacity cap into words (row_words(cap) words), no checks.
 * Returns the entry count. */
DCPX__HIDDEN uint32_t dcpx__local_list(const uint16_t *logits, uint32_t len,
                                       uint32_t cap, uint32_t *words);

/* Row j's list of a dcpx_lists (values, indices: its n entries) into
 * capacity-n wire words, the way dcpx_push_list sends it. Returns the
 * entry count, or DCPX_E_RANGE (*ret_why, if not NULL, says which rule of
 * dcpx_lists broke: an index >= len, a NaN, an index not above the
 * previous one (unsorted or repeated), a full entry after an empty one). */
DCPX__HIDDEN int dcpx__given_list(const uint16_t *values,
                                  const int32_t *indices, uint32_t n,
                                  uint32_t len, uint32_t *words,
                                  const char **ret_why);

/* A dcpx_lists for a call of `rows` rows of a shape with N = n: its size,
 * pointers (set and aligned), rows, n and flags. 0 or DCPX_E_INVAL, the reason (naming fn)
 * into why[wn] when why is not NULL, and logged under DCPX_DEBUG=WARN. */
DCPX__HIDDEN int dcpx__lists_check(const char *fn, const dcpx_lists *li,
                                   uint32_t rows, uint32_t n, char *why,
                                   size_t wn);

/* Rescue list (what a saturated rank sends for round 2): the entries of
 * the local top-cap list whose ord16 >= t1, packed in ascending l, in the
 * same capacity-cap words. With c elements at or above t1, c <= cap means
 * exactly those c (one filter pass), c > cap the whole top-cap list.
 * Returns the entry count. */
DCPX__HIDDEN uint32_t dcpx__rescue_list(const uint16_t *logits, uint32_t len,
                                        uint32_t cap, uint32_t t1,
                                        uint32_t *words);

/* ---- arrays that must not overlap (dcpx_merge, dcpx_ref_call) ----------
 *
 * An array of a call as bytes [p, p + n) (n = 0: none, or of unknown
 * size; p = 0: absent, never compared); of logits, rows of `len` bytes
 * every `step` bytes (step 0: one plain span). */
typedef struct dcpx__span {
  const char *what;
  uintptr_t p;
  uint64_t n, step, len;
} dcpx__span;

/* 4 * a * b bytes (a * b int32 words), saturated (a block table larger
 * than memory is refused elsewhere). */
static inline uint64_t dcpx__words4(uint64_t a, uint64_t b) {
  return b && a > UINT64_MAX / 4u / b ? UINT64_MAX : 4u * a * b;
}

/* The bytes a call reads of `rows` rows of bf16 logits at p, `stride`
 * elements apart, each read up to min(stride, max_local) elements (its
 * row_end at most); a rows' extent that would not fit is saturated (such
 * a stride is refused by dcpx__logits_fit). */
static inline dcpx__span dcpx__logits_span(const char *what, const void *p,
                                           uint64_t rows, uint64_t stride,
                                           uint64_t max_local) {
  const uint64_t len = stride < max_local ? stride : max_local;
  uint64_t n = 0;
  if (rows && stride && rows - 1u <= (UINT64_MAX / 2u - len) / stride)
    n = 2u * ((rows - 1u) * stride + len);
  dcpx__span s = {what, (uintptr_t)p, n, 2u * stride, 2u * len};
  return s;
}

/* Whether the first nout spans of s[0..n) (the outputs, plain spans)
 * share a byte with one another or with a later span; if so, *ret_i and
 * *ret_j (i < j) name the first such pair. Compares only: no syscall. */
DCPX__HIDDEN int dcpx__spans_overlap(const dcpx__span *s, size_t n,
                                     size_t nout, size_t *ret_i,
                                     size_t *ret_j);

#endif /* DCPX_COMMON_MERGE_H */
