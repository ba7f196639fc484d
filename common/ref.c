/* ref.c - the CPU reference: one whole call, every rank's lists computed
 * from every rank's logits (or given, as dcpx_push_list gives them:
 * docs/PROTOCOL.md 5.8), merged as docs/PROTOCOL.md section 5 says.
 * This is the oracle every backend and kernel is tested against, bit for
 * bit. It
 * allocates its workspace per call; backends keep theirs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcpx.h"
#include "log.h"
#include "merge.h"

static int check_list(const uint16_t *logits, uint32_t len, uint32_t cap,
                      const uint32_t *ret_words) {
  if ((!logits && len) || !ret_words || cap == 0 || cap > DCPX_MAX_TOPK ||
      !dcpx__aligned(logits, 2) || !dcpx__aligned(ret_words, 4))
    return DCPX_E_INVAL;
  if (len > DCPX_MAX_LOCAL)
    return DCPX_E_LIMIT;
  return 0;
}

int dcpx_ref_local_list(const uint16_t *logits, uint32_t len, uint32_t cap,
                        uint32_t *ret_words) {
  int r = check_list(logits, len, cap, ret_words);
  return r < 0 ? r : (int)dcpx__local_list(logits, len, cap, ret_words);
}

int dcpx_ref_rescue_list(const uint16_t *logits, uint32_t len, uint32_t cap,
                         uint32_t t1, uint32_t *ret_words) {
  int r = check_list(logits, len, cap, ret_words);
  if (r == 0 && t1 > 0xFFFFu)
    r = DCPX_E_INVAL;
  return r < 0 ? r : (int)dcpx__rescue_list(logits, len, cap, t1, ret_words);
}

static int check_call(const dcpx_shape *sh, const dcpx_ref_in *in,
                      const dcpx_merge_out *out) {
  int r = dcpx_shape_check(sh);
  if (r < 0)
    return r;
  if ((r = dcpx__struct_check("dcpx_ref_call", "dcpx_ref_in", in,
                              sizeof(dcpx_ref_in),
                              DCPX__RESERVED_OF(in))) < 0 ||
      (r = dcpx__struct_check("dcpx_ref_call", "dcpx_merge_out", out,
                              sizeof(dcpx_merge_out),
                              DCPX__RESERVED_OF(out))) < 0)
    return r;
  if (!in->logits || !in->row_ends || !in->req_id || !in->block_table ||
      !out->rows_out || !out->valid_out || in->rank >= sh->world)
    return DCPX_E_INVAL;
  /* every array aligned to its element (merge.h dcpx__aligned) */
  if (!dcpx__aligned(in->logits, sizeof(void *)) ||
      !dcpx__aligned(in->row_ends, sizeof(void *)) ||
      !dcpx__aligned(in->lists, sizeof(void *)) ||
      !dcpx__aligned(in->req_id, 4) || !dcpx__aligned(in->block_table, 4) ||
      !dcpx__aligned(out->rows_out, 4) || !dcpx__aligned(out->valid_out, 4) ||
      !dcpx__aligned(out->ids_out, 4) || !dcpx__aligned(out->sat_word, 4))
    return DCPX_E_INVAL;
  if (in->rows > sh->rows)
    return DCPX_E_RANGE;
  if (!dcpx__table_fits(in->block_table, in->bt_rows, in->bt_cols))
    return DCPX_E_INVAL;
  for (uint32_t s = 0; s < sh->world; s++) {
    if (!in->logits[s] || !in->row_ends[s] ||
        !dcpx__aligned(in->logits[s], 2) || !dcpx__aligned(in->row_ends[s], 4) ||
        !dcpx__logits_fit(in->logits[s], in->rows, in->stride))
      return DCPX_E_INVAL;
    for (uint32_t t = 0; t < in->rows; t++) {
      int32_t e = in->row_ends[s][t];
      if (e < 0 || (uint32_t)e > sh->max_local || (uint64_t)e > in->stride)
        return DCPX_E_RANGE;
    }
    if (in->lists && in->lists[s] &&
        (r = dcpx__lists_check("dcpx_ref_call", in->lists[s], in->rows,
                               sh->local_topk, NULL, 0)) < 0)
      return r;
  }
  return 0;
}

/* The outputs share no byte with one another or with anything the call
 * reads (merge.h dcpx__spans_overlap, as dcpx_merge checks its arrays):
 * the reference writes each output row while it reads the inputs and
 * writes the other outputs, so a shared buffer gives a silently wrong
 * result. Else DCPX_E_INVAL, both arrays named in a WARN line. After
 * check_call: every pointer set, rows within the shape, lists' rows the
 * call's. */
static int check_disjoint(const dcpx_shape *sh, const dcpx_ref_in *in,
                          const dcpx_merge_out *out) {
  enum { MAXS = 4 + 5 * DCPX_MAX_WORLD + 8 };
  dcpx__span s[MAXS];
  uint32_t who[MAXS]; /* the rank of a per-rank array, else W */
  size_t n = 0, i, j;
  const uint64_t rows = in->rows, K = sh->topk, N = sh->local_topk;
  const uint32_t W = sh->world;
#define SPAN(name, rank, ptr, bytes)                                          \
  do {                                                                        \
    s[n] = (dcpx__span){(name), (uintptr_t)(ptr), (bytes), 0, 0};             \
    who[n++] = (rank);                                                        \
  } while (0)
  /* the outputs first */
  SPAN("rows_out", W, out->rows_out, dcpx__words4(rows, K));
  SPAN("valid_out", W, out->valid_out, 4u * rows);
  SPAN("ids_out", W, out->ids_out, dcpx__words4(rows, K));
  SPAN("sat_word", W, out->sat_word, 4u * rows);
  for (uint32_t r = 0; r < W; r++) {
    s[n] = dcpx__logits_span("logits", in->logits[r], rows, in->stride,
                             sh->max_local);
    who[n++] = r;
    SPAN("row_ends", r, in->row_ends[r], 4u * rows);
    const dcpx_lists *li = in->lists ? in->lists[r] : NULL;
    if (li) {
      SPAN("lists", r, li, sizeof(*li));
      SPAN("lists values", r, li->values, 2u * rows * N);
      SPAN("lists indices", r, li->indices, 4u * rows * N);
    }
  }
  SPAN("req_id", W, in->req_id, 4u * rows);
  SPAN("block_table", W, in->block_table,
       dcpx__words4(in->bt_rows, in->bt_cols));
  /* what holds the pointers, read at every row */
  SPAN("logits[]", W, in->logits, (uint64_t)W * sizeof(*in->logits));
  SPAN("row_ends[]", W, in->row_ends, (uint64_t)W * sizeof(*in->row_ends));
  SPAN("lists[]", W, in->lists, (uint64_t)W * sizeof(*in->lists));
  SPAN("the dcpx_ref_in", W, in, sizeof(*in));
  SPAN("the dcpx_merge_out", W, out, sizeof(*out));
  SPAN("the dcpx_shape", W, sh, sizeof(*sh));
#undef SPAN
  if (!dcpx__spans_overlap(s, n, 4, &i, &j))
    return 0;
  char rj[24] = "";
  if (who[j] < W)
    snprintf(rj, sizeof(rj), " of rank %u", who[j]);
  DCPX_WARN("dcpx_ref_call: %s overlaps %s%s (each output needs memory of "
            "its own, apart from the inputs)", s[i].what, s[j].what, rj);
  return DCPX_E_INVAL;
}

/* Rank s's round-1 list of row t: given, else from its logits. */
static int round1_list(const dcpx_shape *sh, const dcpx_ref_in *in,
                       uint32_t s, uint32_t t, uint32_t *words) {
  const uint32_t N = sh->local_topk, len = (uint32_t)in->row_ends[s][t];
  const dcpx_lists *li = in->lists ? in->lists[s] : NULL;
  const char *why = "";
  if (!li)
    return (int)dcpx__local_list(in->logits[s] + t * in->stride, len, N,
                                 words);
  int r = dcpx__given_list(li->values + (uint64_t)t * N,
                           li->indices + (uint64_t)t * N, N, len, words,
                           &why);
  if (r < 0)
    DCPX_WARN("dcpx_ref_call: rank %u's list of row %u has %s", s, t, why);
  return r;
}

int dcpx_ref_call(const dcpx_shape *sh, const dcpx_ref_in *in,
                  const dcpx_merge_out *out, dcpx_ref_stats *ret_stats) {
  dcpx__merge_ws ws;
  const uint32_t *lists[DCPX_MAX_WORLD], *klists[DCPX_MAX_WORLD];
  uint32_t *buf = NULL;
  dcpx_ref_stats st = {0, 0, 0};
  dcpx_shape resolved;
  int r;

  /* local_topk = 0: the library's N, as dcpx_shape_check and dcpx_join
   * take it */
  sh = dcpx__shape_resolved(sh, &resolved);
  r = check_call(sh, in, out);
  if (r == 0)
    r = check_disjoint(sh, in, out);
  if (r < 0)
    return r;
  const uint32_t rows = in->rows, rank = in->rank;
  const uint64_t stride = in->stride;
  const uint16_t *const *logits = in->logits;
  const int32_t *const *row_ends = in->row_ends;
  r = dcpx__merge_ws_init(&ws, sh);
  if (r < 0)
    return r;

  const uint32_t W = sh->world, N = sh->local_topk, K = sh->topk;
  const uint32_t rwn = dcpx_row_words(N), rwk = dcpx_row_words(K);
  buf = malloc(sizeof(uint32_t) * W * (rwn + rwk));
  if (!buf) {
    r = DCPX_E_NOMEM;
    goto done;
  }
  for (uint32_t s = 0; s < W; s++) {
    lists[s] = buf + s * rwn;
    klists[s] = buf + W * rwn + s * rwk;
  }

  for (uint32_t t = 0; t < rows; t++) {
    dcpx__sel s1;
    uint32_t sw;

    for (uint32_t s = 0; s < W; s++)
      if ((r = round1_list(sh, in, s, t, (uint32_t *)lists[s])) < 0)
        goto done;
    r = 0;
    uint32_t mask = dcpx__round1(&ws, lists, &s1, &sw);
    for (uint32_t s = 0; s < W; s++)
      if ((mask >> s) & 1u)
        dcpx__rescue_list(logits[s] + t * stride, (uint32_t)row_ends[s][t], K,
                          sw & 0xFFFFu, (uint32_t *)klists[s]);
    dcpx__finish(&ws, &s1, mask, klists);
    r = dcpx__outputs(&ws, sh, rank, in->req_id[t], in->block_table,
                      in->bt_rows, in->bt_cols,
                      out->rows_out + (uint64_t)t * K, out->valid_out + t,
                      out->ids_out ? out->ids_out + (uint64_t)t * K : NULL);
    if (r < 0)
      goto done;
    if (out->sat_word)
      out->sat_word[t] = sw;
    st.rows++;
    st.rescue_rows += mask != 0;
    st.saturated += (uint64_t)__builtin_popcount(mask);
  }
  if (ret_stats) {
    ret_stats->rows += st.rows;
    ret_stats->rescue_rows += st.rescue_rows;
    ret_stats->saturated += st.saturated;
  }
done:
  free(buf);
  dcpx__merge_ws_free(&ws);
  return r;
}
