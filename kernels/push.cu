/* push.cu - the push of docs/PROTOCOL.md sections 3-4, one block per row.
 *
 * Per row t of rank `me`: e = tag(epoch[t]) from the own workspace (the
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
 * them (docs/PROTOCOL.md section 4).
 *
 * Shared memory: the selection state (static) plus, dynamic, the list
 * [row_words(N)] and the fast path's candidate buffers (DCPX_K_CAND entries
 * of a 16-bit key and a 32-bit index, 48 KiB).
 */
#include "dcpx_device.cuh"

#define PT DCPX_K_PUSH_THREADS

/* With kctx.klist: the local top-K list of the row into kw (shared) and
 * into klist[t] (this rank's device memory, for a rescue of this call:
 * the merge then only filters it, merge.cu), and the local top-N list, the
 * top N of kw, into words. The same words as dcpx_dev_local_list(N): the
 * N best of the row are the N best of its K best, ties included. */
static __device__ void push_lists(const dcpx_kctx *c, dcpx_sel_smem *S,
                                  const uint16_t *row, uint32_t len,
                                  uint32_t t, uint32_t *words, uint32_t *kw,
                                  uint16_t *ckey, uint32_t *cl,
                                  uint32_t *kmin_s) {
  const uint32_t N = c->local_topk, K = c->topk, rw_k = c->L.rw_k;
  dcpx_dev_local_list(S, row, len, K, kw, ckey, cl, DCPX_K_CAND);
  uint4 *dst = (uint4 *)(c->klist + (uint64_t)t * rw_k);
  uint32_t kmn = 0xFFFFu, kmx = 0;
#pragma unroll 1
  for (uint32_t v = threadIdx.x; v < rw_k / 4; v += blockDim.x)
    dst[v] = ((const uint4 *)kw)[v];
#pragma unroll 1
  for (uint32_t i = threadIdx.x; i < c->L.rw_n; i += blockDim.x)
    words[i] = 0;
#pragma unroll 1
  for (uint32_t f = threadIdx.x; f < K; f += blockDim.x) {
    const uint32_t o = kw[f] >> 16;
    if (o) {
      kmn = min(kmn, o);
      kmx = max(kmx, o);
    }
  }
  dcpx_dev_sel_zero(S);
  if (threadIdx.x == 0)
    *kmin_s = 0xFFFFu;
  __syncthreads();
  kmn = __reduce_min_sync(DCPX_FULL, kmn);
  kmx = __reduce_max_sync(DCPX_FULL, kmx);
  if ((threadIdx.x & 31u) == 0) {
    atomicMin(kmin_s, kmn);
    atomicMax(&S->kmax, kmx);
  }
  __syncthreads();
  uint32_t fbeg, fend, nz;
  dcpx_dev_warp_segment(K, &fbeg, &fend);
  dcpx_dev_flat_select(S, kw, K, N, *kmin_s, S->kmax, fbeg, fend, &nz);
  dcpx_key_map km;
  km.round = 0;
  km.p1 = kw;
  km.K = K;
  km.N = N;
  dcpx_dev_flat_place(S, kw, K, &km, fbeg, fend, words, NULL, NULL);
}

/* PROF: the variant with the phase timestamps (kctx.prof set, benches);
 * the other has none of their code. */
template <int PROF>
static __global__ void __launch_bounds__(PT)
    dcpx_push_kernel(const dcpx_kctx c, uint32_t rows,
                     const uint16_t *logits, uint64_t stride,
                     const int32_t *row_ends) {
  __shared__ dcpx_sel_smem S;
  __shared__ char *peer[DCPX_MAX_WORLD];
  __shared__ uint32_t kmin_s;
  /* Read asynchronously (dcpx_dev_async16), so that no thread waits at
   * the row's start for loads used only at its end: bytes 16..31 of the
   * rank state (stop is word 2) and the aligned 4 epochs holding row t's. */
  __shared__ __align__(16) uint32_t st4[4];
  __shared__ __align__(16) uint32_t ep4[4];
  extern __shared__ uint4 dyn[];

  const uint32_t tid = threadIdx.x;
  const uint32_t W = c.world, N = c.local_topk, me = c.rank;
  const uint32_t P = c.L.pairs, rw_n = c.L.rw_n, rw_k = c.L.rw_k;
  uint32_t *words = (uint32_t *)dyn;
  uint32_t *kw = words + rw_n; /* rw_n, rw_k: multiples of 4 */
  uint32_t *cl = kw + (c.klist ? rw_k : 0u);
  uint16_t *ckey = (uint16_t *)(cl + DCPX_K_CAND);
  const uint32_t *epoch = (const uint32_t *)(c.ws + c.L.off_epoch);
  const uint32_t max_len =
      (uint64_t)c.max_local < stride ? c.max_local : (uint32_t)stride;

  /* Abort and own FAILED, as this rank's kernels last saw them (the
   * device mirror, layout.h dcpx_rank_state: no PCIe read per block). A
   * merge that ended early set it, and only such a merge breaks the
   * stream-order chain that keeps parity reuse safe (docs/PROTOCOL.md 4). */
  dcpx_rank_state *st = (dcpx_rank_state *)(c.ws + c.L.off_call);
  /* PDL: everything earlier in the stream (the engine's logits, this
   * rank's previous merge) is complete before the push reads anything;
   * then the merge may launch and start polling while this push works.
   * Block 0 advances the call sequence with a reduction: no fence and no
   * wait here, since the merge reads it only on its rare paths, after its
   * own PDL wait (dcpx_dev_call_tag). */
  unsigned long long *pf = NULL; /* diagnostics (kctx.prof) */
  if (PROF && blockIdx.x < rows) {
    pf = c.prof + (uint64_t)blockIdx.x * DCPX_K_PROF_POINTS + DCPX_K_PROF_PUSH;
    dcpx_dev_stamp(pf, 0);
  }
  dcpx_dev_pdl_wait();
  dcpx_dev_pdl_trigger();
  if (tid == 0) {
    dcpx_dev_async16(st4, (const char *)st + 16);
    if (blockIdx.x == 0)
      atomicAdd((unsigned long long *)&st->call_seq, 1ull);
  }
  if (tid < W)
    peer[tid] = c.peers[tid]; /* read after local_list's barriers */

#pragma unroll 1
  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const uint32_t len = dcpx_dev_row_len(row_ends[t], max_len);
    if (tid == 0)
      dcpx_dev_async16(ep4, epoch + (t & ~3u)); /* 256-aligned region */

    if (PROF && t != blockIdx.x)
      pf = c.prof + (uint64_t)t * DCPX_K_PROF_POINTS + DCPX_K_PROF_PUSH;
    dcpx_dev_stamp(pf, 1);
    if (c.klist && !dcpx_k_early(c.resc_early, rows))
      push_lists(&c, &S, logits + (uint64_t)t * stride, len, t, words, kw,
                 ckey, cl, &kmin_s);
    else
      dcpx_dev_local_list_p(&S, logits + (uint64_t)t * stride, len, N, words,
                            ckey, cl, DCPX_K_CAND, pf ? pf + 2 : NULL);
    dcpx_dev_stamp(pf, 10);
    if (tid == 0)
      dcpx_dev_async_wait();
    __syncthreads();
    /* Aborted or FAILED (as read at the kernel's start): store nothing;
     * the merge fails the call. */
    if (st4[2])
      break;
    const uint32_t e = dcpx_dev_epoch_tag(ep4[t & 3u]);
    const uint64_t slot =
        c.L.off_ll + dcpx_ll_offset(&c.L, e & 1u, me, t, 0);

    /* rw_n is a multiple of 4, so the list is exactly P pairs. */
#pragma unroll 1
    for (uint32_t i = tid; i < P; i += blockDim.x) {
      const uint2 w = ((const uint2 *)words)[i];
#pragma unroll 1
      for (uint32_t d = 0; d < W; d++)
        dcpx_dev_ll_store(peer[d] + slot + (uint64_t)i * 16u, w.x, w.y, e);
    }
    dcpx_dev_stamp(pf, 11);
    __syncthreads(); /* words and ep4 are rewritten by the next row */
  }
}

/* ---- host side ------------------------------------------------------------ */

/* A push block has PT threads (one block per SM: 64 registers each), or
 * PT / 2 when the call has more rows than one wave of those holds
 * (c->push_split_rows): two half blocks per SM then run every row at
 * once, where full blocks would take two waves. The kernel's loops step
 * by blockDim.x, and the list selection works at either size. */
uint32_t dcpx_k_push_threads(const dcpx_kctx *c, uint32_t rows) {
  if (c->push_threads == PT || c->push_threads == PT / 2u)
    return c->push_threads;
  return c->push_split_rows && rows > c->push_split_rows ? PT / 2u : PT;
}

size_t dcpx_k_push_smem(const dcpx_kctx *c) {
  return 4u * ((size_t)c->L.rw_n + (c->klist ? c->L.rw_k : 0u)) +
         6u * (size_t)DCPX_K_CAND;
}

size_t dcpx_k_klist_bytes(const dcpx_kctx *c) {
  return 4u * (size_t)c->L.rw_k * c->rows_max;
}

int dcpx_k_push_res(const dcpx_kctx *c, uint32_t nt, dcpx_k_res *ret) {
  struct cudaFuncAttributes a;
  int n = 0;
  if (dcpx_k_ctx_check(c) < 0 || !ret || (nt != PT && nt != PT / 2u))
    return DCPX_E_INVAL;
  const size_t dyn = dcpx_k_push_smem(c);
  if (cudaFuncGetAttributes(&a, dcpx_push_kernel<0>) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &n, dcpx_push_kernel<0>, (int)nt, dyn) != cudaSuccess)
    return DCPX_E_CUDA;
  dcpx_k_res_of(&a, dyn, nt, n, ret);
  return 0;
}

int dcpx_k_push_prepare(void) {
  const int max_dyn = 4 * (4224 + 4224) + 6 * (int)DCPX_K_CAND;
  if (cudaFuncSetAttribute(dcpx_push_kernel<0>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           max_dyn) != cudaSuccess ||
      cudaFuncSetAttribute(dcpx_push_kernel<1>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           max_dyn) != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

int dcpx_k_push(const dcpx_kctx *c, uint32_t rows, const uint16_t *logits,
                uint64_t stride, const int32_t *row_ends, cudaStream_t s) {
  int r = dcpx_k_ctx_check(c);
  if (r < 0)
    return r;
  /* An empty call reads no row: its pointers may be NULL (an empty
   * tensor's), as with the host backend and the NCCL transport. */
  if (rows > c->rows_max || (rows && (!logits || !stride || !row_ends)))
    return DCPX_E_INVAL;
  /* bf16 and int32 arrays: an odd or unaligned address would fault in the
   * kernel (a misaligned access kills the engine's context). */
  if (((uintptr_t)logits & 1u) || ((uintptr_t)row_ends & 3u))
    return DCPX_E_INVAL;
  /* rows == 0 still launches one block: an empty call is a call, and
   * block 0 advances the call sequence (as the host backend does). */
  cudaLaunchAttribute pdl;
  const uint32_t grid = rows ? rows : 1u;
  const uint32_t nt = dcpx_k_push_threads(c, rows);
  const cudaLaunchConfig_t cfg =
      c->pdl ? dcpx_launch_cfg_pdl(grid, nt, dcpx_k_push_smem(c), s, &pdl)
             : dcpx_launch_cfg(grid, nt, dcpx_k_push_smem(c), s);
  /* The launch's own status, not cudaGetLastError's (merge.cu). */
  void (*const k)(const dcpx_kctx, uint32_t, const uint16_t *, uint64_t,
                  const int32_t *) =
      c->prof ? dcpx_push_kernel<1> : dcpx_push_kernel<0>;
  if (cudaLaunchKernelEx(&cfg, k, *c, rows, logits, stride, row_ends) !=
      cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}
