/* call.h - the tests' positional forms of dcpx_push, dcpx_merge and
 * dcpx_ref_call: they fill the v1 structs (dcpx_call, dcpx_merge_out,
 * dcpx_ref_in) from their arguments, so that the many calls of the tests
 * stay one line each. The structs' own checks are tested directly
 * (check_host.c, check_ref.c). */
#ifndef DCPX_TESTS_CALL_H
#define DCPX_TESTS_CALL_H

#include "dcpx.h"

/* lists: dcpx_ref_in.lists ([W] or NULL). */
static inline int t_ref_call_lists(
    const dcpx_shape *sh, uint32_t rows, const uint16_t *const *logits,
    uint64_t stride, const int32_t *const *row_ends, uint32_t rank,
    const int32_t *req_id, const int32_t *bt, uint32_t bt_rows,
    uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
    int32_t *ids_out, uint32_t *sat_word, dcpx_ref_stats *ret_stats,
    const dcpx_lists *const *lists) {
  dcpx_ref_in in = DCPX_REF_IN_INIT;
  in.lists = lists;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  in.rows = rows;
  in.rank = rank;
  in.stride = stride;
  in.logits = logits;
  in.row_ends = row_ends;
  in.req_id = req_id;
  in.block_table = bt;
  in.bt_rows = bt_rows;
  in.bt_cols = bt_cols;
  out.rows_out = rows_out;
  out.valid_out = valid_out;
  out.ids_out = ids_out;
  out.sat_word = sat_word;
  return dcpx_ref_call(sh, &in, &out, ret_stats);
}

static inline int t_ref_call(const dcpx_shape *sh, uint32_t rows,
                             const uint16_t *const *logits, uint64_t stride,
                             const int32_t *const *row_ends, uint32_t rank,
                             const int32_t *req_id, const int32_t *bt,
                             uint32_t bt_rows, uint32_t bt_cols,
                             int32_t *rows_out, int32_t *valid_out,
                             int32_t *ids_out, uint32_t *sat_word,
                             dcpx_ref_stats *ret_stats) {
  return t_ref_call_lists(sh, rows, logits, stride, row_ends, rank, req_id,
                          bt, bt_rows, bt_cols, rows_out, valid_out, ids_out,
                          sat_word, ret_stats, NULL);
}

static inline int t_push(dcpx_member *m, uint32_t rows,
                         const uint16_t *logits, uint64_t stride,
                         const int32_t *row_ends, uint64_t call_tag,
                         void *stream) {
  dcpx_call in = DCPX_CALL_INIT;
  in.rows = rows;
  in.logits = logits;
  in.stride = stride;
  in.row_ends = row_ends;
  in.call_tag = call_tag;
  return dcpx_push(m, &in, stream);
}

static inline int t_merge(dcpx_member *m, uint32_t rows,
                          const uint16_t *logits, uint64_t stride,
                          const int32_t *row_ends, const int32_t *req_id,
                          const int32_t *bt, uint32_t bt_rows,
                          uint32_t bt_cols, int32_t *rows_out,
                          int32_t *valid_out, int32_t *ids_out,
                          uint32_t *sat_word, uint64_t call_tag,
                          void *stream) {
  dcpx_call in = DCPX_CALL_INIT;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  in.rows = rows;
  in.logits = logits;
  in.stride = stride;
  in.row_ends = row_ends;
  in.req_id = req_id;
  in.block_table = bt;
  in.bt_rows = bt_rows;
  in.bt_cols = bt_cols;
  in.call_tag = call_tag;
  out.rows_out = rows_out;
  out.valid_out = valid_out;
  out.ids_out = ids_out;
  out.sat_word = sat_word;
  return dcpx_merge(m, &in, &out, stream);
}

#endif /* DCPX_TESTS_CALL_H */
