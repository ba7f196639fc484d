/* nccl.c - libdcpx's NCCL transport (HAVE_NCCL only): the fallback
 * exchange for groups whose ranks lack P2P access (docs/PROTOCOL.md section 7).
 *
 * At join (cuda.c calls in here once the transport resolved to nccl):
 *   - rank 0 made an NCCL unique id before its Join (dcpx__nccl_unique_id)
 *     and sent it in Join.nccl_id; dcpxd, which needs no NCCL, keeps rank
 *     0's id and hands it to every rank in JoinReply.nccl_id;
 *   - every rank calls ncclCommInitRank(W, id, rank) on its device (it
 *     blocks until all W ranks did) and cudaMallocs its NCCL buffer
 *     (common/layout.h, dcpx_nccl_layout), zeroed.
 * Per call, on the caller's stream, nothing else (kernels/dcpx_kernels.h,
 * "the NCCL transport"): push = lists kernel + ncclAllGather; merge =
 * round-1 kernel + ncclAllGather of the rescue lists + round-2 kernel. No
 * sync, no allocation; ncclAllGather is graph-capturable, so the whole
 * call is.
 * At leave: ncclCommDestroy, or ncclCommAbort when the group was aborted
 * (a collective may then never complete).
 *
 * Health: the NCCL path has no bounded waits of its own. A peer that dies
 * mid-call leaves the all-gather to NCCL's own error handling; dcpxd still
 * sees the death and aborts the group, and dcpx_leave aborts the comm.
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <cuda_runtime_api.h>
/* nccl.h declares some functions without prototypes */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdlib.h>
#include <string.h>

#include "cuda_log.h"
#include "dcpx_kernels.h"
#include "member.h"

/* An NCCL call that failed: logged (WARN) with NCCL's error string and,
 * for a communicator, its last error text (ncclGetLastError). */
static int nccl_ok(ncclResult_t e, ncclComm_t comm, const char *what,
                   int line) {
  if (__builtin_expect(e == ncclSuccess, 1))
    return 1;
  if (dcpx__log_on(DCPX__LOG_WARN)) {
    const char *last = ncclGetLastError(comm);
    dcpx__log(DCPX__LOG_WARN, __FILE__, line, "%s failed: %s%s%s", what,
              ncclGetErrorString(e), last && *last ? ": " : "",
              last ? last : "");
  }
  return 0;
}
#define NCCL_OK(call, comm) nccl_ok((call), (comm), #call, __LINE__)

struct dcpx__nccl {
  ncclComm_t comm;
  dcpx_nkctx k;
};

void dcpx__nccl_counters(struct dcpx__nccl *n, void *ctr, void *health) {
  n->k.ctr = (dcpx_k_counters *)ctr;
  n->k.health = (dcpx_rank_health *)health;
}

int dcpx__nccl_unique_id(uint8_t *out, size_t cap, size_t *ret_len) {
  ncclUniqueId id;
  if (cap < sizeof(id))
    return DCPX_E_RANGE;
  if (!NCCL_OK(ncclGetUniqueId(&id), NULL))
    return DCPX_E_NCCL;
  memcpy(out, &id, sizeof(id));
  *ret_len = sizeof(id);
  return 0;
}

int dcpx__nccl_init(const dcpx_shape *sh, uint32_t rank, int device,
                    char *ws, const uint8_t *id, size_t id_len,
                    struct dcpx__nccl **ret) {
  struct dcpx__nccl *n;
  ncclUniqueId uid;
  int prev = -1, r = 0;

  if (!id || id_len != sizeof(uid)) {
    /* rank 0 sent no (or a foreign) nccl id */
    DCPX_WARN("no NCCL unique id from rank 0 (%zu bytes, want %zu)", id_len,
              sizeof(uid));
    return DCPX_E_TRANSPORT;
  }
  memcpy(&uid, id, sizeof(uid));
  n = calloc(1, sizeof(*n));
  if (!n)
    return DCPX_E_NOMEM;
  dcpx_kn_ctx_init(&n->k, sh, rank);
  n->k.ws = ws;
  cudaGetDevice(&prev);
  if (!CUDA_OK(cudaSetDevice(device))) {
    r = DCPX_E_CUDA;
    goto out;
  }
  if (!CUDA_OK(cudaMalloc((void **)&n->k.buf, n->k.NL.bytes))) {
    n->k.buf = NULL;
    r = DCPX_E_NOMEM;
    goto out;
  }
  if (!CUDA_OK(cudaMemset(n->k.buf, 0, n->k.NL.bytes)) ||
      !CUDA_OK(cudaDeviceSynchronize()) ||
      DCPX_KLOG(dcpx_kn_prepare(), "dcpx_kn_prepare") < 0) {
    r = DCPX_E_CUDA;
    goto out;
  }
  if (!NCCL_OK(ncclCommInitRank(&n->comm, (int)sh->world, uid, (int)rank),
               NULL)) {
    n->comm = NULL;
    r = DCPX_E_NCCL;
    goto out;
  }
  r = dcpx_kn_ctx_check(&n->k);
out:
  if (prev >= 0)
    cudaSetDevice(prev);
  if (r < 0) {
    dcpx__nccl_fini(n, 1);
    return r;
  }
  *ret = n;
  return 0;
}

void dcpx__nccl_fini(struct dcpx__nccl *n, int abort) {
  if (!n)
    return;
  if (n->comm) {
    if (abort)
      ncclCommAbort(n->comm);
    else
      ncclCommDestroy(n->comm);
  }
  if (n->k.buf)
    cudaFree(n->k.buf);
  free(n);
}

int dcpx__nccl_push_k(const struct dcpx_nkctx *k, void *comm, uint32_t rows,
                      const uint16_t *logits, uint64_t stride,
                      const int32_t *row_ends, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  int r;
  if (rows > k->rows_max)
    return DCPX_E_RANGE;
  if (rows == 0)
    return 0;
  r = DCPX_KLOG(dcpx_kn_lists(k, rows, logits, stride, row_ends, s),
                "dcpx_kn_lists");
  if (r < 0)
    return r;
  if (!NCCL_OK(ncclAllGather(dcpx_kn_send(k), dcpx_kn_recv(k),
                             (size_t)rows * k->L.rw_n, ncclUint32,
                             (ncclComm_t)comm, s),
               (ncclComm_t)comm))
    return DCPX_E_NCCL;
  return 0;
}

int dcpx__nccl_merge_k(const struct dcpx_nkctx *k, void *comm, uint32_t rows,
                       const uint16_t *logits, uint64_t stride,
                       const int32_t *row_ends, const int32_t *req_id,
                       const int32_t *block_table, uint32_t bt_rows,
                       uint32_t bt_cols, int32_t *rows_out,
                       int32_t *valid_out, int32_t *ids_out,
                       uint32_t *sat_word, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  int r;
  if (rows > k->rows_max)
    return DCPX_E_RANGE;
  if (rows == 0)
    return 0;
  r = DCPX_KLOG(dcpx_kn_round1(k, rows, logits, stride, row_ends, req_id,
                               block_table, bt_rows, bt_cols, rows_out,
                               valid_out, ids_out, sat_word, s),
                "dcpx_kn_round1");
  if (r < 0)
    return r;
  /* Unconditional: whether any row needs its rescue is known on the
   * device only (see kernels/nccl.cu). */
  if (!NCCL_OK(ncclAllGather(dcpx_kn_rsend(k), dcpx_kn_rrecv(k),
                             (size_t)rows * k->L.rw_k, ncclUint32,
                             (ncclComm_t)comm, s),
               (ncclComm_t)comm))
    return DCPX_E_NCCL;
  return DCPX_KLOG(dcpx_kn_round2(k, rows, req_id, block_table, bt_rows,
                                  bt_cols, rows_out, valid_out, ids_out, s),
                   "dcpx_kn_round2");
}

int dcpx__nccl_push(struct dcpx__nccl *n, uint32_t rows,
                    const uint16_t *logits, uint64_t stride,
                    const int32_t *row_ends, void *stream) {
  return dcpx__nccl_push_k(&n->k, n->comm, rows, logits, stride, row_ends,
                           stream);
}

int dcpx__nccl_merge(struct dcpx__nccl *n, uint32_t rows,
                     const uint16_t *logits, uint64_t stride,
                     const int32_t *row_ends, const int32_t *req_id,
                     const int32_t *block_table, uint32_t bt_rows,
                     uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                     int32_t *ids_out, uint32_t *sat_word, void *stream) {
  return dcpx__nccl_merge_k(&n->k, n->comm, rows, logits, stride, row_ends,
                            req_id, block_table, bt_rows, bt_cols, rows_out,
                            valid_out, ids_out, sat_word, stream);
}
