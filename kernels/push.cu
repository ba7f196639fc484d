/* push.cu - the push of docs/PROTOCOL.md sections 3-4, one block per row.
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
 * them (docs/PROTOCOL.md section 4).
 *
 * Shared memory: the selection state (static) plus, dynamic, the list
 * [row_words(N)] and the fast path's candidate buffers (DCPX_K_CAND entries
 * of a 16-bit key and a 32-bit index, 48 KiB).
 */
#include "dcpx_device.cuh"

#define PT DCPX_K_PUSH_THREADS

/* The push reads the stop word as word 2 of the state's bytes 16..31. */
static_assert(offsetof(dcpx_rank_state, stop) == 24,
              "dcpx_rank_state: stop at byte 24");

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

/* ---- a row split among a cluster of blocks (sm_90) ----------------------- */

/* With kctx.push_cluster, a call of few rows pushes each row with a
 * cluster of C blocks (dcpx_k_push_cluster): block q of the cluster scans
 * groups [q G / C, (q + 1) G / C) of the row, so the row pass, the phase
 * that grows with the row, takes 1 / C of the time. Each block samples the
 * same nt elements of the whole row, so every block finds the same tau
 * without exchanging anything; the candidates stay in each block's own
 * buffers; the blocks exchange through distributed shared memory only
 * their counts, their candidate histograms (every block sums all C to
 * find the same T and take) and their totals of keys > T and == T (the
 * bases of the blocks after them); each block then places its selected
 * keys straight into block 0's list, and every block stores 1 / C of the
 * list's LL pairs. The words are dcpx_dev_local_list's, bit for bit: the
 * same candidates, the same T and take, the same positions. */

DCPX_D void push_cl_sync(void) {
  __cluster_barrier_arrive(); /* release: this thread's writes */
  __cluster_barrier_wait();   /* acquire: every block's */
}

DCPX_D uint32_t *push_cl_map(uint32_t *p, uint32_t q) {
  return (uint32_t *)__cluster_map_shared_rank(p, q);
}

/* The row geometry of dcpx_dev_rowgeo for block q of C: the groups of its
 * part, split among its warps. */
DCPX_D dcpx_rowgeo push_cl_rowgeo(const uint16_t *row, uint32_t len,
                                  uint32_t q, uint32_t C) {
  dcpx_rowgeo r = dcpx_dev_rowgeo(row, len);
  const uint32_t nw = blockDim.x >> 5, warp = threadIdx.x >> 5;
  const uint32_t pb = (uint32_t)(((uint64_t)r.G * q) / C);
  const uint32_t pe = (uint32_t)(((uint64_t)r.G * (q + 1u)) / C);
  const uint32_t gpw = (pe - pb + nw - 1u) / nw;
  r.gbeg = min(pe, pb + warp * gpw);
  r.gend = min(pe, r.gbeg + gpw);
  return r;
}

/* dcpx_dev_hist_find over the sum of the C blocks' histograms (after a
 * cluster barrier that followed every block's last histogram write; no
 * block writes its histogram again in the row). */
DCPX_D uint32_t push_cl_hist_find(dcpx_sel_smem *S, uint32_t need,
                                  uint32_t kbase, uint32_t C) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t per = DCPX_HI_BINS / blockDim.x;
  uint32_t *hw = S->hist + warp * 32u * per + lane;
  uint32_t h[DCPX_HF_PER_MAX], sum = 0;
#pragma unroll
  for (uint32_t i = 0; i < DCPX_HF_PER_MAX; i++)
    h[i] = 0;
#pragma unroll 1
  for (uint32_t q = 0; q < C; q++) {
    const uint32_t *hq = push_cl_map(hw, q);
#pragma unroll
    for (uint32_t i = 0; i < DCPX_HF_PER_MAX; i++)
      if (i < per)
        h[i] += hq[32u * i];
  }
#pragma unroll
  for (uint32_t i = 0; i < DCPX_HF_PER_MAX; i++)
    sum += h[i];
  return dcpx_dev_hist_pick(S, h, sum, need, kbase);
}

/* Sum over blocks q < qe of the cluster of word x[i] (lanes < C of the
 * calling warp read one block each). */
DCPX_D uint32_t push_cl_sum(uint32_t *x, uint32_t qe) {
  const uint32_t lane = threadIdx.x & 31u;
  return __reduce_add_sync(DCPX_FULL, lane < qe ? *push_cl_map(x, lane) : 0u);
}

/* Cluster words of a block (shared): [0] candidates, [1] 1 when it cannot
 * take the fast path, [2] keys > T, [3] keys == T. */
enum { CLW_CAND, CLW_FAIL, CLW_GT, CLW_EQ, CLW_N };

/* The fast path of dcpx_dev_local_fast, one row across the cluster (see
 * above). words: this block's list buffer (block 0's receives the list;
 * every block's is zeroed by the caller). Returns 1 when block 0's words
 * hold the list (after a cluster barrier), 0 (cluster-uniformly) when the
 * row must take the exact path. */
static __device__ int push_cl_fast(dcpx_sel_smem *S, const uint16_t *row,
                                   uint32_t len, uint32_t cap,
                                   uint32_t *words, uint16_t *ckey,
                                   uint32_t *cl, uint32_t cand_max,
                                   uint32_t *clw, unsigned long long *pf) {
  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t nt = blockDim.x, nw = nt >> 5;
  const uint32_t q = __clusterRelativeBlockRank(), C = __clusterSizeInBlocks();
  const uint32_t cw = cand_max / nw;
  uint16_t *wk = ckey + warp * cw;
  uint32_t *wl = cl + warp * cw;

  /* The conditions of dcpx_dev_local_list_p: the same in every block. */
  if (len < 2048u)
    return 0;
  const uint32_t r = (2u * cap * nt + len - 1u) / len + 8u;
  if (r > nt / 2u || (uint64_t)r * len > (uint64_t)nt * (cand_max / 4u * 3u))
    return 0;

  /* 1. tau, from the same samples in every block. */
  dcpx_dev_hist_add(S->hist,
                    dcpx_dev_key(__ldg(row + (((2u * tid + 1u) * len) >>
                                              __ffs(nt)))));
  __syncthreads();
  dcpx_dev_stamp(pf, 1);
  if (dcpx_dev_hist_find(S, r, 0u, 1) < r)
    return 0; /* every block alike */
  dcpx_dev_stamp(pf, 2);
  const uint32_t tau = max(S->hb << 4, 0x7Fu);

  /* 2. This block's part of the row. */
  const dcpx_rowgeo R = push_cl_rowgeo(row, len, q, C);
  uint32_t kmax = 0;
  uint32_t wc = dcpx_dev_fast_pass(&R, tau, wk, wl, cw, &kmax);
  dcpx_dev_stamp(pf, 3);
  kmax = __reduce_max_sync(DCPX_FULL, kmax);
  if (lane == 0) {
    atomicMax(&S->kmax, kmax);
    S->wcnt[warp] = wc;
  }
  __syncthreads();
  const uint32_t wcl = lane < nw ? S->wcnt[lane] : 0u;
  const uint32_t total = __reduce_add_sync(DCPX_FULL, wcl);
  const uint32_t over = __any_sync(DCPX_FULL, wcl > cw);
  uint32_t fail = total > cw * nw || S->kmax - tau >= DCPX_HI_BINS;
  if (!fail && over) { /* block-uniform: its warps into exact shares */
    const uint32_t off = __reduce_add_sync(DCPX_FULL, lane < warp ? wcl : 0u);
    uint32_t km = 0;
    wk -= warp * cw;
    wl -= warp * cw;
    (void)dcpx_dev_fast_pass(&R, tau, wk + off, wl + off, wc, &km);
    __syncthreads();
    const uint32_t b0 = (uint32_t)(((uint64_t)total * warp) / nw);
    const uint32_t b1 = (uint32_t)(((uint64_t)total * (warp + 1u)) / nw);
    wk += b0;
    wl += b0;
    wc = b1 - b0;
  }
  /* 3. The candidates' histogram (single level: key - tau), and what the
   * other blocks need to know. */
  if (!fail)
#pragma unroll 1
    for (uint32_t i = lane; i < wc; i += 32)
      atomicAdd(S->hist + (wk[i] - tau), 1u);
  if (tid == 0) {
    clw[CLW_CAND] = total;
    clw[CLW_FAIL] = fail;
  }
  push_cl_sync();
  dcpx_dev_stamp(pf, 4);
  const uint32_t all = push_cl_sum(clw + CLW_CAND, C);
  if (push_cl_sum(clw + CLW_FAIL, C) || all < cap)
    return 0;
  push_cl_hist_find(S, cap, tau, C); /* all >= cap: never select-all */
  dcpx_dev_stamp(pf, 5);

  /* 4. Keys > T and == T per warp, and the blocks' bases. */
  const uint32_t T = S->T, take = S->take;
  uint32_t gt = 0, eq = 0;
#pragma unroll 1
  for (uint32_t i = lane; i < wc; i += 32) {
    gt += wk[i] > T;
    eq += wk[i] == T;
  }
  gt = __reduce_add_sync(DCPX_FULL, gt);
  eq = __reduce_add_sync(DCPX_FULL, eq);
  if (lane == 0) {
    S->wgtb[warp] = gt;
    S->weqc[warp] = eq;
  }
  dcpx_dev_sel1_bases(S);
  __syncthreads();
  if (tid == 0) {
    clw[CLW_GT] = S->wgt[nw];
    clw[CLW_EQ] = S->weq[nw];
  }
  push_cl_sync();
  uint32_t rg = S->wgt[warp] + push_cl_sum(clw + CLW_GT, q);
  uint32_t rq = S->weq[warp] + push_cl_sum(clw + CLW_EQ, q);
  dcpx_dev_stamp(pf, 6);

  /* 5. Placing, into block 0's list. */
  uint32_t *w0 = push_cl_map(words, 0);
#pragma unroll 1
  for (uint32_t i0 = 0; i0 < wc; i0 += 32) {
    const uint32_t i = i0 + lane;
    const uint32_t o = i < wc ? wk[i] : 0u;
    const uint32_t packed = dcpx_dev_passc(o, T, T);
    const uint32_t incl = dcpx_dev_warp_incl(packed);
    const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
    const uint32_t ex = incl - packed;
    uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu);
    if (packed)
      dcpx_dev_place(w0, cap, o, wl[i], T, take, &gb, &qb);
    rg += tot >> 16;
    rq += tot & 0xFFFFu;
  }
  push_cl_sync();
  dcpx_dev_stamp(pf, 7);
  return 1;
}

/* The local top-N list of the cluster's row into block 0's words: the
 * cluster's fast path, else block 0 alone takes dcpx_dev_local_list_p's
 * path. Every thread of every block calls it; it ends with a cluster
 * barrier. */
static __device__ void push_cl_list(dcpx_sel_smem *S, const uint16_t *row,
                                    uint32_t len, uint32_t cap,
                                    uint32_t *words, uint16_t *ckey,
                                    uint32_t *cl, uint32_t *clw,
                                    unsigned long long *pf) {
  const uint32_t rw = dcpx_dev_row_words(cap);
#pragma unroll 1
  for (uint32_t i = threadIdx.x; i < rw; i += blockDim.x)
    words[i] = 0;
  dcpx_dev_sel_zero(S);
  __syncthreads();
  dcpx_dev_stamp(pf, 0);
  if (push_cl_fast(S, row, len, cap, words, ckey, cl, DCPX_K_CAND, clw, pf))
    return;
  if (__clusterRelativeBlockRank() == 0)
    dcpx_dev_local_list_p(S, row, len, cap, words, ckey, cl, DCPX_K_CAND,
                          NULL);
  push_cl_sync();
}

/* PROF: the variant with the phase timestamps (kctx.prof set, benches);
 * the other has none of their code. CL: launched in clusters, one cluster
 * per row (push_cl_list). */
template <int PROF, int CL>
static __global__ void __launch_bounds__(PT)
    dcpx_push_kernel(const dcpx_kctx c, uint32_t rows,
                     const uint16_t *logits, uint64_t stride,
                     const int32_t *row_ends) {
  __shared__ dcpx_sel_smem S;
  __shared__ char *peer[DCPX_MAX_WORLD];
  __shared__ uint32_t kmin_s;
  __shared__ uint32_t clw[CLW_N];
  /* Read asynchronously (dcpx_dev_async16), so that no thread waits at
   * the row's start for loads used only at its end: bytes 16..31 of the
   * rank state (stop is word 2) and the aligned 4 epochs holding row t's. */
  __shared__ __align__(16) uint32_t st4[4];
  __shared__ __align__(16) uint32_t ep4[4];
  extern __shared__ uint4 dyn[];

  const uint32_t tid = threadIdx.x;
  const uint32_t W = c.world, N = c.local_topk, me = c.rank;
  const uint32_t P = c.L.pairs, rw_n = c.L.rw_n, rw_k = c.L.rw_k;
  /* Blocks per row and this block's place among them. */
  const uint32_t C = CL ? __clusterSizeInBlocks() : 1u;
  const uint32_t q = CL ? __clusterRelativeBlockRank() : 0u;
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
  unsigned long long *pf = NULL; /* diagnostics (kctx.prof; block 0 of a cluster) */
  if (PROF && blockIdx.x / C < rows && q == 0) {
    pf = c.prof + (uint64_t)(blockIdx.x / C) * DCPX_K_PROF_POINTS +
         DCPX_K_PROF_PUSH;
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
  for (uint32_t t = blockIdx.x / C; t < rows; t += gridDim.x / C) {
    const uint32_t len = dcpx_dev_row_len(row_ends[t], max_len);
    const uint16_t *row = logits + (uint64_t)t * stride;
    if (tid == 0)
      dcpx_dev_async16(ep4, epoch + (t & ~3u)); /* 256-aligned region */

    if (PROF && pf && t != blockIdx.x / C)
      pf = c.prof + (uint64_t)t * DCPX_K_PROF_POINTS + DCPX_K_PROF_PUSH;
    dcpx_dev_stamp(pf, 1);
    if (CL)
      push_cl_list(&S, row, len, N, words, ckey, cl, clw, pf ? pf + 2 : NULL);
    else if (c.klist && !dcpx_k_early(c.resc_early, rows))
      push_lists(&c, &S, row, len, t, words, kw, ckey, cl, &kmin_s);
    else
      dcpx_dev_local_list_p(&S, row, len, N, words, ckey, cl, DCPX_K_CAND,
                            pf ? pf + 2 : NULL);
    dcpx_dev_stamp(pf, 10);
    if (tid == 0)
      dcpx_dev_async_wait();
    __syncthreads();
    /* Aborted or FAILED (as read at the kernel's start): store nothing;
     * the merge fails the call. (A cluster's blocks each decide for their
     * own pairs, and all of them meet at the barrier below.) */
    const int stop = st4[2] != 0;
    const uint32_t e = dcpx_dev_epoch_next(ep4[t & 3u]);
    const uint64_t slot =
        c.L.off_ll + dcpx_ll_offset(&c.L, e & 1u, me, t, 0);
    const uint32_t *src = CL ? push_cl_map(words, 0) : words;

    /* rw_n is a multiple of 4, so the list is exactly P pairs; a cluster's
     * block q stores pairs q nt, q nt + 1, ... (step C nt). */
#pragma unroll 1
    for (uint32_t i = q * blockDim.x + tid; i < P && !stop;
         i += C * blockDim.x) {
      const uint2 w = ((const uint2 *)src)[i];
#pragma unroll 1
      for (uint32_t d = 0; d < W; d++)
        dcpx_dev_ll_store(peer[d] + slot + (uint64_t)i * 16u, w.x, w.y, e);
    }
    dcpx_dev_stamp(pf, 11);
    if (CL)
      push_cl_sync(); /* block 0's words stay until every block read them */
    else
      __syncthreads(); /* words and ep4 are rewritten by the next row */
    if (stop)
      break;
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

/* Blocks per row of a call of `rows` rows: a cluster of push_cluster (2
 * or 4) blocks when the call's clusters fit the GPU in one wave (rows * C
 * <= sms), its rows may be long enough to gain (max_local >= 8192), it
 * pushes full blocks and it builds no klist (push_lists is not split);
 * else 1. */
uint32_t dcpx_k_push_cluster(const dcpx_kctx *c, uint32_t rows) {
  uint32_t C = c->push_cluster >= 4u ? 4u : c->push_cluster >= 2u ? 2u : 1u;
  if (!rows || c->max_local < 8192u || dcpx_k_push_threads(c, rows) != PT ||
      (c->klist && !dcpx_k_early(c->resc_early, rows)))
    return 1;
  while (C > 1u && (uint64_t)rows * C > c->sms)
    C >>= 1;
  return C;
}

/* The four instances: phase timestamps or not, clusters or not. */
typedef void (*push_fn)(const dcpx_kctx, uint32_t, const uint16_t *,
                        uint64_t, const int32_t *);

static push_fn push_kernel_of(int prof, int cl) {
  if (cl)
    return prof ? dcpx_push_kernel<1, 1> : dcpx_push_kernel<0, 1>;
  return prof ? dcpx_push_kernel<1, 0> : dcpx_push_kernel<0, 0>;
}

int dcpx_k_push_prepare(void) {
  const int max_dyn = 4 * (4224 + 4224) + 6 * (int)DCPX_K_CAND;
  for (int i = 0; i < 4; i++)
    if (cudaFuncSetAttribute(push_kernel_of(i & 1, i >> 1),
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
  if (rows > c->rows_max || !logits || !stride || !row_ends)
    return DCPX_E_INVAL;
  /* rows == 0 still launches one block: an empty call is a call, and
   * block 0 advances the call sequence (as the host backend does). */
  cudaLaunchAttribute attr[2];
  const uint32_t C = dcpx_k_push_cluster(c, rows);
  const uint32_t grid = rows ? rows * C : 1u;
  const uint32_t nt = dcpx_k_push_threads(c, rows);
  cudaLaunchConfig_t cfg =
      c->pdl ? dcpx_launch_cfg_pdl(grid, nt, dcpx_k_push_smem(c), s, attr)
             : dcpx_launch_cfg(grid, nt, dcpx_k_push_smem(c), s);
  if (C > 1u) {
    cudaLaunchAttribute *a = attr + cfg.numAttrs;
    memset(a, 0, sizeof(*a));
    a->id = cudaLaunchAttributeClusterDimension;
    a->val.clusterDim.x = C;
    a->val.clusterDim.y = 1;
    a->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs++;
  }
  /* The launch's own status, not cudaGetLastError's (merge.cu). */
  if (cudaLaunchKernelEx(&cfg, push_kernel_of(c->prof != NULL, C > 1u), *c,
                         rows, logits, stride, row_ends) != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}
