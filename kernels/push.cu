/* push.cu - the push of DESIGN.md sections 3-4, one block per row.
 *
 * Per row t of rank `me`: e = next(epoch[t]) from the own workspace (the
 * merge of the previous call wrote it; stream order makes it visible);
 * the local top-N list of logits[t][0 .. row_end) in wire words (ascending
 * l, zeros, bit-16 plane), built in shared memory by dcpx_dev_local_list
 * (one sampled pass over the row in the common case, see dcpx_device.cuh);
 * then, for every rank d (itself included) and pair i, one 16-byte LL store
 * (w[2i], e, w[2i+1], e) at peers[d] + off_ll + ll_offset(e & 1, me, t, i).
 * No flag and no fence: a reader accepts each 8-byte half by its tag.
 *
 * The push never waits, so it never records, alarms or fails. It must not
 * start before this rank's merge of the previous call has completed (stream
 * order): that is what keeps parity e & 1's slots stable while peers read
 * them (DESIGN.md section 4).
 *
 * Shared memory: the selection state (static) plus, dynamic, the list
 * [row_words(N)] and the fast path's candidate buffers (DCPX_K_CAND entries
 * of a 16-bit key and a 32-bit index, 48 KiB).
 */
#include "dcpx_device.cuh"

#define PT DCPX_K_PUSH_THREADS

static __global__ void __launch_bounds__(PT)
    dcpx_push_kernel(const dcpx_kctx c, uint32_t rows,
                     const uint16_t *logits, uint64_t stride,
                     const int32_t *row_ends) {
  __shared__ dcpx_sel_smem S;
  __shared__ char *peer[DCPX_MAX_WORLD];
  extern __shared__ uint4 dyn[];

  const uint32_t tid = threadIdx.x;
  const uint32_t W = c.world, N = c.local_topk, me = c.rank;
  const uint32_t R = c.rows_max, P = c.L.pairs, rw_n = c.L.rw_n;
  uint32_t *words = (uint32_t *)dyn;
  uint32_t *cl = words + rw_n; /* rw_n: a multiple of 4 */
  uint16_t *ckey = (uint16_t *)(cl + DCPX_K_CAND);
  const uint32_t *epoch = (const uint32_t *)(c.ws + c.L.off_epoch);
  const uint32_t max_len =
      (uint64_t)c.max_local < stride ? c.max_local : (uint32_t)stride;

  if (tid < W)
    peer[tid] = c.peers[tid]; /* read after local_list's barriers */

  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const int32_t re = row_ends[t];
    const uint32_t len =
        re < 0 ? 0u : ((uint32_t)re > max_len ? max_len : (uint32_t)re);
    const uint32_t e = dcpx_dev_epoch_next(epoch[t]);
    const uint64_t slot =
        c.L.off_ll + ((((uint64_t)(e & 1u) * W + me) * R + t) * P) * 16u;

    dcpx_dev_local_list(&S, logits + (uint64_t)t * stride, len, N, words,
                        ckey, cl, DCPX_K_CAND);

    /* rw_n is a multiple of 4, so the list is exactly P pairs. */
    for (uint32_t i = tid; i < P; i += PT) {
      const uint2 w = ((const uint2 *)words)[i];
      for (uint32_t d = 0; d < W; d++)
        dcpx_dev_ll_store(peer[d] + slot + (uint64_t)i * 16u, w.x, w.y, e);
    }
    __syncthreads(); /* words are rewritten by the next row */
  }
}

/* ---- host side ------------------------------------------------------------ */

size_t dcpx_k_push_smem(const dcpx_kctx *c) {
  return 4u * (size_t)c->L.rw_n + 6u * (size_t)DCPX_K_CAND;
}

int dcpx_k_push_prepare(void) {
  const int max_dyn = 4 * 4224 + 6 * (int)DCPX_K_CAND;
  if (cudaFuncSetAttribute(dcpx_push_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           max_dyn) != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

int dcpx_k_push(const dcpx_kctx *c, uint32_t rows, const uint16_t *logits,
                uint64_t stride, const int32_t *row_ends, uint64_t call_tag,
                cudaStream_t s) {
  int r = dcpx_k_ctx_check(c);
  (void)call_tag;
  if (r < 0)
    return r;
  if (rows > c->rows_max || !logits || !stride || !row_ends)
    return DCPX_E_INVAL;
  if (rows == 0)
    return 0;
  dcpx_push_kernel<<<rows, PT, dcpx_k_push_smem(c), s>>>(*c, rows, logits,
                                                         stride, row_ends);
  if (cudaGetLastError() != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}
