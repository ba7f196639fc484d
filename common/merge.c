/* merge.c - exact top-K selection and the two-round merge of docs/PROTOCOL.md
 * section 5, for one row at a time.
 *
 * Invariants the rest of dcpx relies on:
 *  1. Keys are visited in flat (r, l) order everywhere, so "first `take`
 *     keys equal to T" is the tie rule, and outputs come out in (r, l)
 *     order without sorting.
 *  2. Selection is by counting (two 256-bucket histograms over ord16), so
 *     it costs O(n) and needs no scratch beyond the keys themselves.
 *  3. Round 1 sees only the W capacity-N lists; round 2 sees, rank-major,
 *     the saturated ranks' capacity-K lists and the other ranks' S1
 *     entries. Both are top-K selections over keys in flat order, so the
 *     final set is the same whether or not the rescue ran.
 *  4. A saturated rank's round-2 keys are its rescue list: the entries of
 *     its local top-K list at or above S1's K-th ord16 (dcpx__rescue_list).
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "merge.h"

/* Walks a 256-bucket histogram from the top until `need` keys are covered.
 * Returns the bucket, with *above = keys in higher buckets. */
static inline uint32_t pick_bucket(const uint32_t *h, uint32_t need,
                                   uint32_t *above) {
  uint32_t cum = 0, b = 255;
  for (;; b--) {
    if (cum + h[b] >= need || b == 0)
      break;
    cum += h[b];
  }
  *above = cum;
  return b;
}

/* The selection itself; bf16 != 0 reads src as bf16 logits (NaN -> empty),
 * otherwise as ord16 keys. Inlined twice with a constant flag. */
static inline void select_keys(const uint16_t *src, uint32_t n, uint32_t k,
                               int bf16, dcpx__sel *ret) {
  uint32_t h[256], nz = 0, above, above2;
  memset(h, 0, sizeof(h));
  /* Branch-free count: empty keys (0) land in high-byte bucket 0 beside
   * the real keys 0x7F..0xFF, and are taken back out of it after. */
  for (uint32_t i = 0; i < n; i++) {
    uint32_t o = bf16 ? dcpx__key_of_bf16(src[i]) : src[i];
    h[o >> 8]++;
    nz += o == 0;
  }
  h[0] -= nz;
  nz = n - nz;
  if (nz < k) {
    ret->T = 0;
    ret->take = 0;
    ret->count = nz;
    return;
  }
  uint32_t hb = pick_bucket(h, k, &above);
  memset(h, 0, sizeof(h));
  for (uint32_t i = 0; i < n; i++) {
    uint32_t o = bf16 ? dcpx__key_of_bf16(src[i]) : src[i];
    if (o && (o >> 8) == hb)
      h[o & 0xFFu]++;
  }
  uint32_t lb = pick_bucket(h, k - above, &above2);
  ret->T = (hb << 8) | lb;
  ret->take = k - above - above2;
  ret->count = k;
}

void dcpx__select(const uint16_t *ord, uint32_t n, uint32_t k,
                  dcpx__sel *ret) {
  select_keys(ord, n, k, 0, ret);
}

/* Entry j of a capacity-cap list (section 3); the list was zeroed. */
static inline void put_entry(uint32_t *words, uint32_t cap, uint32_t j,
                             uint32_t o, uint32_t l) {
  words[j] = (o << 16) | (l & 0xFFFFu);
  words[cap + j / 32] |= (l >> 16) << (j % 32);
}

uint32_t dcpx__local_list(const uint16_t *logits, uint32_t len, uint32_t cap,
                          uint32_t *words) {
  dcpx__sel sel;
  dcpx__sel_iter it;
  uint32_t j = 0;

  memset(words, 0, sizeof(uint32_t) * dcpx_row_words(cap));
  select_keys(logits, len, cap, 1, &sel);
  dcpx__sel_iter_init(&it, &sel);
  for (uint32_t l = 0; l < len && j < sel.count; l++) {
    uint32_t o = dcpx__key_of_bf16(logits[l]);
    if (o && dcpx__sel_next(&it, o))
      put_entry(words, cap, j++, o, l);
  }
  return j;
}

int dcpx__given_list(const uint16_t *values, const int32_t *indices,
                     uint32_t n, uint32_t len, uint32_t *words,
                     const char **ret_why) {
  const char *why = NULL;
  uint32_t j = 0;
  int64_t prev = -1;

  memset(words, 0, sizeof(uint32_t) * dcpx_row_words(n));
  for (; j < n && indices[j] >= 0 && !why; j++) {
    const uint32_t l = (uint32_t)indices[j];
    const uint32_t o = dcpx__key_of_bf16(values[j]);
    if (l >= len)
      why = "an index at or above the row's row_end";
    else if (!o)
      why = "a NaN value";
    else if ((int64_t)l <= prev)
      why = "indices not strictly ascending (unsorted or repeated)";
    else
      put_entry(words, n, j, o, l);
    prev = l;
  }
  for (uint32_t k = j; k < n && !why; k++)
    if (indices[k] >= 0)
      why = "a full entry after an empty one";
  if (why) {
    if (ret_why)
      *ret_why = why;
    return DCPX_E_RANGE;
  }
  return (int)j;
}

int dcpx__lists_check(const char *fn, const dcpx_lists *li, uint32_t rows,
                      uint32_t n, char *why, size_t wn) {
  if (!rows && !li)
    return 0; /* an empty call may pass NULL for every array (dcpx.h) */
  int r = dcpx__struct_check_at(__FILE__, __LINE__, fn, "dcpx_lists", li,
                                sizeof(dcpx_lists), 0, why, wn);
  if (r < 0)
    return r;
  if (li->flags & ~DCPX_LISTS_CHECK_ORDER) {
    dcpx__why_at(why, wn, __FILE__, __LINE__,
                 "%s: dcpx_lists.flags 0x%x has bits dcpx does not know "
                 "(0x%x; the one flag is DCPX_LISTS_CHECK_ORDER, 0x%x)",
                 fn, li->flags, li->flags & ~DCPX_LISTS_CHECK_ORDER,
                 DCPX_LISTS_CHECK_ORDER);
    return DCPX_E_INVAL;
  }
  if ((rows && (!li->values || !li->indices)) || li->rows != rows ||
      li->n != n) {
    dcpx__why_at(why, wn, __FILE__, __LINE__,
                 "%s: dcpx_lists of %u rows of %u entries (values %s, "
                 "indices %s); the call has %u rows of N = %u",
                 fn, li->rows, li->n, li->values ? "set" : "NULL",
                 li->indices ? "set" : "NULL", rows, n);
    return DCPX_E_INVAL;
  }
  if (rows && (!dcpx__aligned(li->values, 2) ||
               !dcpx__aligned(li->indices, 4))) {
    dcpx__why_at(why, wn, __FILE__, __LINE__,
                 "%s: dcpx_lists.%s is not aligned to its element (values "
                 "2-byte, indices 4-byte)",
                 fn, !dcpx__aligned(li->values, 2) ? "values" : "indices");
    return DCPX_E_INVAL;
  }
  return 0;
}

/* Elements with ord16 >= t1 (NaN never counts), counted up to cap + 1. */
static uint32_t count_at_least(const uint16_t *logits, uint32_t len,
                               uint32_t cap, uint32_t t1) {
  uint32_t c = 0;
  for (uint32_t l = 0; l < len && c <= cap; l++) {
    uint32_t o = dcpx__key_of_bf16(logits[l]);
    c += o && o >= t1;
  }
  return c;
}

/* Round 2's K-th key is at least S1's K-th (its keys contain S1), so an
 * element below t1 is never selected: dropping it leaves round 2 as is. */
uint32_t dcpx__rescue_list(const uint16_t *logits, uint32_t len, uint32_t cap,
                           uint32_t t1, uint32_t *words) {
  uint32_t j = 0;

  if (count_at_least(logits, len, cap, t1) > cap)
    return dcpx__local_list(logits, len, cap, words);
  memset(words, 0, sizeof(uint32_t) * dcpx_row_words(cap));
  for (uint32_t l = 0; l < len; l++) {
    uint32_t o = dcpx__key_of_bf16(logits[l]);
    if (o && o >= t1)
      put_entry(words, cap, j++, o, l);
  }
  return j;
}

int dcpx__merge_ws_init(dcpx__merge_ws *ws, const dcpx_shape *sh) {
  memset(ws, 0, sizeof(*ws));
  ws->world = sh->world;
  ws->topk = sh->topk;
  ws->local_topk = sh->local_topk;
  ws->rescue_slots = dcpx__rescue_slots(sh->world, sh->topk, sh->local_topk);
  ws->cap = sh->world * sh->local_topk + ws->rescue_slots * sh->topk +
            sh->topk;
  ws->ord = malloc(sizeof(*ws->ord) * ws->cap);
  ws->l = malloc(sizeof(*ws->l) * ws->cap);
  ws->r = malloc(sizeof(*ws->r) * ws->cap);
  ws->sel_r = malloc(sizeof(*ws->sel_r) * sh->topk);
  ws->sel_l = malloc(sizeof(*ws->sel_l) * sh->topk);
  if (!ws->ord || !ws->l || !ws->r || !ws->sel_r || !ws->sel_l) {
    dcpx__merge_ws_free(ws);
    return DCPX_E_NOMEM;
  }
  return 0;
}

void dcpx__merge_ws_free(dcpx__merge_ws *ws) {
  if (!ws)
    return;
  free(ws->ord);
  free(ws->l);
  free(ws->r);
  free(ws->sel_r);
  free(ws->sel_l);
  memset(ws, 0, sizeof(*ws));
}

/* Appends the entries of a capacity-c list of rank r as keys at *n. */
static void decode_list(dcpx__merge_ws *ws, uint32_t *n, const uint32_t *w,
                        uint32_t c, uint32_t r, int keep_empty) {
  for (uint32_t j = 0; j < c; j++) {
    uint32_t o = w[j] >> 16;
    if (!o && !keep_empty)
      continue;
    ws->ord[*n] = (uint16_t)o;
    ws->l[*n] = (w[j] & 0xFFFFu) | (((w[c + j / 32] >> (j % 32)) & 1u) << 16);
    ws->r[*n] = (uint8_t)r;
    (*n)++;
  }
}

uint32_t dcpx__round1(dcpx__merge_ws *ws, const uint32_t *const *lists,
                      dcpx__sel *ret_s1, uint32_t *ret_sat_word) {
  const uint32_t W = ws->world, N = ws->local_topk, K = ws->topk;
  uint32_t n = 0, mask = 0;
  dcpx__sel_iter it;

  /* Round-1 keys keep empty entries so that rank r's list is keys
   * [r*N, (r+1)*N): empty keys (ord 0) are never selected. */
  for (uint32_t r = 0; r < W; r++)
    decode_list(ws, &n, lists[r], N, r, 1);
  dcpx__select(ws->ord, n, K, ret_s1);

  dcpx__sel_iter_init(&it, ret_s1);
  for (uint32_t r = 0; r < W; r++) {
    uint32_t in = 0;
    for (uint32_t j = 0; j < N; j++)
      in += (uint32_t)dcpx__sel_next(&it, ws->ord[r * N + j]);
    /* Saturated: full (N non-empty) and all N selected; selected keys are
     * never empty, so in == N says both. */
    if (in == N)
      mask |= 1u << r;
  }
  *ret_sat_word = (mask << 16) | (ret_s1->count == K ? ret_s1->T : 0);
  return mask;
}

void dcpx__finish(dcpx__merge_ws *ws, const dcpx__sel *s1, uint32_t mask,
                  const uint32_t *const *klists) {
  const uint32_t W = ws->world, N = ws->local_topk, K = ws->topk;
  const uint32_t base = W * N; /* round-2 keys live after round 1's */
  uint32_t n = base;
  dcpx__sel_iter it;
  dcpx__sel s2;

  ws->nsel = 0;
  dcpx__sel_iter_init(&it, s1);
  if (!mask) {
    for (uint32_t i = 0; i < base; i++) {
      if (dcpx__sel_next(&it, ws->ord[i])) {
        ws->sel_r[ws->nsel] = ws->r[i];
        ws->sel_l[ws->nsel++] = ws->l[i];
      }
    }
    return;
  }
  for (uint32_t r = 0; r < W; r++) {
    int sat = (mask >> r) & 1u;
    for (uint32_t j = 0; j < N; j++) {
      uint32_t i = r * N + j;
      if (dcpx__sel_next(&it, ws->ord[i]) && !sat) {
        ws->ord[n] = ws->ord[i];
        ws->l[n] = ws->l[i];
        ws->r[n++] = (uint8_t)r;
      }
    }
    if (sat)
      decode_list(ws, &n, klists[r], K, r, 0);
  }
  dcpx__select(ws->ord + base, n - base, K, &s2);
  dcpx__sel_iter_init(&it, &s2);
  for (uint32_t i = base; i < n; i++) {
    if (dcpx__sel_next(&it, ws->ord[i])) {
      ws->sel_r[ws->nsel] = ws->r[i];
      ws->sel_l[ws->nsel++] = ws->l[i];
    }
  }
}

int dcpx__outputs(const dcpx__merge_ws *ws, const dcpx_shape *sh, uint32_t d,
                  int32_t req_id, const int32_t *block_table, uint32_t bt_rows,
                  uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                  int32_t *ids_out) {
  const uint32_t K = sh->topk, B = sh->block_size;
  uint32_t valid = 0;

  /* Check the request and every own element first, so that a bad table
   * writes nothing. */
  if (req_id < 0 || (uint32_t)req_id >= bt_rows)
    return DCPX_E_RANGE;
  for (uint32_t i = 0; i < ws->nsel; i++) {
    if (ws->sel_r[i] != d)
      continue;
    uint32_t l = ws->sel_l[i];
    if (l / B >= bt_cols)
      return DCPX_E_RANGE;
    int64_t blk = block_table[(uint64_t)req_id * bt_cols + l / B];
    int64_t row = blk * B + l % B;
    if (blk < 0 || row > INT32_MAX)
      return DCPX_E_RANGE;
  }
  for (uint32_t i = 0; i < ws->nsel; i++) {
    uint32_t r = ws->sel_r[i], l = ws->sel_l[i];
    if (ids_out)
      ids_out[i] = (int32_t)dcpx__gid(l, r, sh->world, sh->interleave);
    if (r == d) {
      int32_t blk = block_table[(uint64_t)req_id * bt_cols + l / B];
      rows_out[valid++] = blk * (int32_t)B + (int32_t)(l % B);
    }
  }
  for (uint32_t i = valid; i < K; i++)
    rows_out[i] = -1;
  if (ids_out)
    for (uint32_t i = ws->nsel; i < K; i++)
      ids_out[i] = -1;
  *valid_out = (int32_t)valid;
  return 0;
}

/* The span's end, saturated. */
static uint64_t span_end(const dcpx__span *x) {
  return x->n > UINT64_MAX - x->p ? UINT64_MAX : x->p + x->n;
}

/* Whether the plain span x shares a byte with span y. */
static int span_meets(const dcpx__span *x, const dcpx__span *y) {
  if (!x->n || !y->n || x->p >= span_end(y) || y->p >= span_end(x))
    return 0;
  if (!y->step || x->p < y->p) /* x starts before y's first row */
    return 1;
  const uint64_t off = x->p - y->p, t = off / y->step;
  if (off - t * y->step < y->len)
    return 1; /* x starts inside row t */
  return (t + 1u) * y->step < span_end(x) - y->p &&
         (t + 1u) * y->step < y->n; /* row t + 1 starts before x ends */
}

int dcpx__spans_overlap(const dcpx__span *s, size_t n, size_t nout,
                        size_t *ret_i, size_t *ret_j) {
  for (size_t i = 0; i < nout && i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (s[i].p && s[j].p && span_meets(&s[i], &s[j])) {
        *ret_i = i;
        *ret_j = j;
        return 1;
      }
  return 0;
}
