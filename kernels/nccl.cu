/* nccl.cu - the kernels of the NCCL transport (docs/PROTOCOL.md section 7:
 * all-gathers of the candidate lists and of the saturated ranks' top-K
 * lists around the merge's two rounds), for ranks without P2P access to
 * each other. The buffers are common/layout.h's
 * dcpx_nccl_layout; libclient/nccl.c enqueues, on the caller's stream:
 *
 *   push:  lists kernel      row t's local top-N wire words (docs/PROTOCOL.md
 *                            section 3, no LL tags) -> send[t]
 *          ncclAllGather     send [rows][rw_n] -> recv [W][rows][rw_n]
 *   merge: round-1 kernel    per row: S1 = top-K of the W lists (flat (r, l)
 *                            order), the saturation mask; no saturated
 *                            rank: the outputs, sat_word, stats; else the
 *                            S1 bits and the row's sat_word (mask, T1) to
 *                            the buffer, and, if this rank is saturated,
 *                            its local top-K list -> rsend[t]
 *          ncclAllGather     rsend [rows][rw_k] -> rrecv [W][rows][rw_k],
 *                            unconditionally: the host cannot know whether
 *                            any row needs a rescue without a sync. It costs
 *                            W * rows * rw_k * 4 bytes per call even when no
 *                            row is saturated.
 *          round-2 kernel    rows with a mask: top-K of the rank-major keys
 *                            (a saturated rank's K-list from rrecv, S1
 *                            entries of the others from recv); outputs,
 *                            sat_word, stats. A row failed in either round
 *                            (voided: the communicator was aborted) keeps
 *                            its sat_word and stats, and its call counts
 *                            once in failed_calls (round 2's n_count_failed).
 *
 * The selection, the local lists and the outputs are dcpx_device.cuh's, as
 * in the LL merge (merge.cu), so both transports give the same outputs bit
 * for bit: the selection of a set of keys in flat order is a property of
 * the keys (T and take), not of the code path. No epochs, parities, tags or
 * waits: NCCL orders the exchange, and stream order orders the kernels
 * (each kernel stores a heartbeat for the host's stall watch, n_beat). A
 * failed exchange is NCCL's to report (ncclCommGetAsyncError).
 *
 * One block per row; push blocks of DCPX_K_PUSH_THREADS threads, round
 * blocks of DCPX_K_MERGE_THREADS (dcpx_dev_outputs needs that). Each
 * warp's keys are one contiguous segment of the flat order, 32 keys per
 * step, read from global memory (L2) by every pass; a lane finds its
 * (rank, index) once where it starts and then steps (n1_cur, n2_cur), so
 * no pass divides or searches per key.
 */
#include "dcpx_device.cuh"

#define NT DCPX_K_MERGE_THREADS
#define NW (NT / 32)
#define LT DCPX_K_PUSH_THREADS

/* The stall watch's heartbeat (dcpx_nkctx.beat, libclient/nccl.c): block
 * 0's thread 0 at a kernel's start, one 8-byte store to host memory, what
 * is next on the stream (code: DCPX_NCCL_BEAT_*) and when. */
DCPX_D void n_beat(const dcpx_nkctx *c, uint32_t code) {
  if (c->beat && blockIdx.x == 0 && threadIdx.x == 0)
    *(volatile unsigned long long *)c->beat =
        (dcpx_dev_now() << 2) | (unsigned long long)code;
}

/* The end of the push's all-gather (libclient/nccl.c, beat_idle). */
static __global__ void dcpx_nccl_idle_kernel(const dcpx_nkctx c) {
  n_beat(&c, DCPX_NCCL_BEAT_IDLE);
}

/* ---- the lists kernel ----------------------------------------------------- */

static __global__ void __launch_bounds__(LT)
    dcpx_nccl_lists_kernel(const dcpx_nkctx c, uint32_t rows,
                           const uint16_t *logits, uint64_t stride,
                           const int32_t *row_ends) {
  __shared__ dcpx_sel_smem S;
  extern __shared__ uint4 dyn[];
  const uint32_t N = c.local_topk, rw_n = c.L.rw_n;
  uint32_t *words = (uint32_t *)dyn;
  uint32_t *cl = words + rw_n; /* rw_n: a multiple of 4 */
  uint16_t *ckey = (uint16_t *)(cl + DCPX_K_CAND);
  uint32_t *send = (uint32_t *)(c.buf + c.NL.off_send);
  const uint32_t max_len =
      (uint64_t)c.max_local < stride ? c.max_local : (uint32_t)stride;

  n_beat(&c, DCPX_NCCL_BEAT_LISTS);
  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const uint32_t len = dcpx_dev_row_len(row_ends[t], max_len);
    dcpx_dev_local_list(&S, logits + (uint64_t)t * stride, len, N, words,
                        ckey, cl, DCPX_K_CAND);
    uint4 *dst = (uint4 *)(send + (uint64_t)t * rw_n);
    for (uint32_t v = threadIdx.x; v < rw_n / 4; v += LT)
      dst[v] = ((const uint4 *)words)[v];
    __syncthreads(); /* words are rewritten by the next row */
  }
}

/* ---- round 1 -------------------------------------------------------------- */

/* A lane's place in the flat order of round 1 (key f = s * N + j): one
 * division where the lane starts, then steps of 32 keys without any. */
typedef struct n1_cur {
  uint32_t s, j;
} n1_cur;

DCPX_D n1_cur n1_at(uint32_t f, uint32_t N, float rcp_n) {
  n1_cur c;
  c.s = dcpx_dev_div(f, N, rcp_n);
  c.j = f - c.s * N;
  return c;
}

DCPX_D void n1_step(n1_cur *c, uint32_t N) {
  c->j += 32u;
  while (c->j >= N) {
    c->j -= N;
    c->s++;
  }
}

/* Rank s's word j of row t (row0: rank 0's row t in recv). */
DCPX_D uint32_t n1_word(const uint32_t *row0, uint64_t sstride, n1_cur c) {
  return row0[c.s * sstride + c.j];
}

/* Bit 16 of l of entry j of the capacity-cap list at p. */
DCPX_D uint32_t n_hi(const uint32_t *p, uint32_t cap, uint32_t j) {
  return (p[cap + (j >> 5)] >> (j & 31u)) & 1u;
}

/* Whether the communicator was aborted (dcpx_nkctx.voided): read by one
 * thread at a row's start, before the barrier that follows. */
DCPX_D uint32_t n_voided(const dcpx_nkctx *c) {
  return c->voided ? *(const volatile uint32_t *)c->voided : 0u;
}

/* gmask[t] (round 1 to round 2): 0 when round 1 finished the row, the
 * row's sat_word (mask << 16 | T1, never ~0: T1 <= 0xFF80) when it
 * needs round 2, N_VOID when round 1 failed it. */
#define N_VOID 0xFFFFFFFFu

/* A call with a failed row counted once in failed_calls (round 2, thread
 * 0 of a block): keyed by the launches counted so far, which round 1 of
 * this call has advanced (stream order) and no later call has yet. */
DCPX_D void n_count_failed(const dcpx_nkctx *c) {
  if (!c->ctr)
    return;
  const unsigned long long key =
      *(const volatile unsigned long long *)&c->ctr->launched;
  if (atomicMax(&c->ctr->last_failed, key) < key)
    atomicAdd(&c->ctr->failed_calls, 1ull);
}

/* A row failed because its lists may be stale (n_voided): -1 outputs and
 * valid_out, and nothing else of the row's state (docs/PROTOCOL.md 5.7,
 * as a row whose wait gave up). Every thread. */
DCPX_D void n_row_void(const dcpx_out_args *o, uint32_t t) {
  for (uint32_t p = threadIdx.x; p < o->K; p += blockDim.x) {
    o->rows_out[(uint64_t)t * o->K + p] = -1;
    if (o->ids_out)
      o->ids_out[(uint64_t)t * o->K + p] = -1;
  }
  if (threadIdx.x == 0)
    o->valid_out[t] = -1;
}

static __global__ void __launch_bounds__(NT)
    dcpx_nccl_round1_kernel(const dcpx_nkctx c, uint32_t rows,
                            const uint16_t *logits, uint64_t stride,
                            const int32_t *row_ends, const int32_t *req_id,
                            const int32_t *block_table, uint32_t bt_rows,
                            uint32_t bt_cols, int32_t *rows_out,
                            int32_t *valid_out, int32_t *ids_out,
                            uint32_t *sat_out, float rcp_n, float rcp_b,
                            float rcp_i) {
  __shared__ dcpx_sel_smem S;
  __shared__ uint32_t rcnt[DCPX_MAX_WORLD];
  __shared__ uint32_t vd; /* n_voided, at the row's start */
  __shared__ __align__(16) unsigned long long snap[4]; /* counters, block 0 */
  extern __shared__ uint4 dyn[];
  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t W = c.world, N = c.local_topk, K = c.topk, me = c.rank;
  const uint32_t rw_n = c.L.rw_n, rw_k = c.L.rw_k, bw = c.NL.bits_words;
  uint32_t *list = (uint32_t *)dyn; /* [rw_k] */
  uint32_t *bits = list + rw_k;     /* [bw] */
  uint32_t *cl = bits + bw;
  uint16_t *ckey = (uint16_t *)(cl + DCPX_K_CAND);
  const uint32_t *recv = (const uint32_t *)(c.buf + c.NL.off_recv);
  uint32_t *rsend = (uint32_t *)(c.buf + c.NL.off_rsend);
  uint32_t *gmask = (uint32_t *)(c.buf + c.NL.off_mask);
  uint32_t *gbits = (uint32_t *)(c.buf + c.NL.off_bits);
  uint32_t *satw = (uint32_t *)(c.ws + c.L.off_sat);
  uint64_t *stats = (uint64_t *)(c.ws + c.L.off_stats);
  const uint64_t sstride = (uint64_t)rows * rw_n;
  const uint32_t max_len =
      (uint64_t)c.max_local < stride ? c.max_local : (uint32_t)stride;

  dcpx_out_args oa;
  dcpx_dev_out_args_init(&oa, block_table, bt_rows, bt_cols, rows_out,
                         valid_out, ids_out, K, W, me, c.block_size,
                         c.interleave, rcp_b, rcp_i);
  const int publish = c.ctr && blockIdx.x == 0 && tid == 0;
  if (publish) /* the previous calls' totals (merge.cu does the same) */
    dcpx_dev_count_fetch(c.ctr, snap);
  n_beat(&c, DCPX_NCCL_BEAT_RESCUE);

  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const uint32_t *row0 = recv + (uint64_t)t * rw_n; /* rank s: + s*sstride */
    if (tid < DCPX_MAX_WORLD)
      rcnt[tid] = 0;
    for (uint32_t i = tid; i < bw; i += NT)
      bits[i] = 0;
    dcpx_dev_sel_zero(&S);
    if (tid == 0)
      vd = n_voided(&c);
    __syncthreads();
    if (vd) { /* block-uniform */
      if (publish && t == 0)
        dcpx_dev_count_publish(c.ctr, snap, c.health);
      n_row_void(&oa, t);
      if (tid == 0)
        gmask[t] = N_VOID; /* round 2 counts the failed call */
      __syncthreads();
      continue;
    }

    const uint32_t n1 = W * N;
    const uint32_t kpw = (((n1 + NW - 1) / NW) + 31u) & ~31u;
    const uint32_t fbeg = min(n1, warp * kpw), fend = min(n1, fbeg + kpw);
    const n1_cur c0 = n1_at(fbeg + lane, N, rcp_n);
    uint32_t nz;

    /* pass A */
    n1_cur q = c0;
    for (uint32_t f0 = fbeg; f0 < fend; f0 += 32, n1_step(&q, N))
      dcpx_dev_hist_add(S.hist,
                        f0 + lane < fend ? n1_word(row0, sstride, q) >> 16 : 0u);
    const int all = dcpx_dev_sel_after_a(&S, K, &nz);
    if (publish && t == 0)
      dcpx_dev_count_publish(c.ctr, snap, c.health);
    /* pass B */
    {
      const uint32_t lim = all ? 0u : S.hb << 4;
      uint32_t gtb = 0;
      q = c0;
      for (uint32_t f0 = fbeg; f0 < fend; f0 += 32, n1_step(&q, N))
        gtb += dcpx_dev_passb(
            S.h16 + 16u * warp,
            f0 + lane < fend ? n1_word(row0, sstride, q) >> 16 : 0u, lim);
      gtb = __reduce_add_sync(DCPX_FULL, gtb);
      if (lane == 0)
        S.wgtb[warp] = gtb;
    }
    dcpx_dev_sel_finish(&S, K, all);
    /* pass C: S1 in (r, l) order into list, its bits, per-rank counts */
    {
      const uint32_t T = S.T, take = S.take, teq = T ? T : 0xFFFFFFFFu;
      uint32_t rg = S.wgt[warp], rq = S.weq[warp];
      q = c0;
      for (uint32_t f0 = fbeg; f0 < fend; f0 += 32, n1_step(&q, N)) {
        const uint32_t f = f0 + lane, s = q.s, j = q.j;
        const uint32_t w = f < fend ? n1_word(row0, sstride, q) : 0u;
        const uint32_t o = w >> 16;
        const uint32_t packed = dcpx_dev_passc(o, T, teq);
        const uint32_t incl = dcpx_dev_warp_incl(packed);
        const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
        const uint32_t ex = incl - packed;
        uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu), pos = 0;
        if (dcpx_dev_sel_place(o, T, take, &gb, &qb, &pos)) {
          list[pos] = (s << 17) | (n_hi(row0 + s * sstride, N, j) << 16) |
                      (w & 0xFFFFu);
          atomicOr(bits + (f >> 5), 1u << (f & 31u));
          atomicAdd(rcnt + s, 1u);
        }
        rg += tot >> 16;
        rq += tot & 0xFFFFu;
      }
    }
    __syncthreads();
    const uint32_t rc = lane < W ? rcnt[lane] : 0u;
    const uint32_t mask = __ballot_sync(DCPX_FULL, lane < W && rc == N);
    const uint32_t base = __reduce_add_sync(DCPX_FULL, lane < me ? rc : 0u);
    const uint32_t own = __shfl_sync(DCPX_FULL, rc, me);
    const uint32_t sw = (mask << 16) | (all ? 0u : S.T);
    if (tid == 0) {
      /* A row that needs round 2 has its state written there, once its
       * rescue lists are in (a voided round 2 leaves it alone, 5.7). */
      gmask[t] = mask ? sw : 0u;
      if (sat_out)
        sat_out[t] = sw;
      if (!mask) {
        if (c.ctr)
          dcpx_dev_count_row(c.ctr, 0u);
        satw[t] = sw;
        stats[2u * t] += 1;
      }
    }
    if (!mask) {
      dcpx_dev_outputs(&oa, t, req_id[t], list, base, own, all ? nz : K);
    } else {
      for (uint32_t i = tid; i < bw; i += NT)
        gbits[(uint64_t)t * bw + i] = bits[i];
      if ((mask >> me) & 1u) {
        /* S (and list) are free again: the rescue list, capacity K */
        const uint32_t len = dcpx_dev_row_len(row_ends[t], max_len);
        __syncthreads();
        dcpx_dev_local_list(&S, logits + (uint64_t)t * stride, len, K, list,
                            ckey, cl, DCPX_K_CAND);
        uint4 *dst = (uint4 *)(rsend + (uint64_t)t * rw_k);
        for (uint32_t v = tid; v < rw_k / 4; v += NT)
          dst[v] = ((const uint4 *)list)[v];
      }
    }
    __syncthreads(); /* shared state is reused by the next row */
  }
}

/* ---- round 2 -------------------------------------------------------------- */

typedef struct n2_src {
  const uint32_t *row0;  /* recv, row t of rank 0 */
  const uint32_t *krow0; /* rrecv, row t of rank 0 */
  uint64_t sstride, kstride;
  const uint32_t *off2; /* shared [W+1] */
  const uint32_t *bits; /* shared S1 bits */
  uint32_t W, N, K, mask;
} n2_src;

/* A lane's place in round 2's flat order (key f = off2[s] + j): found by
 * a scan where the lane starts, then advanced 32 keys a step. */
typedef struct n2_cur {
  uint32_t s, j;
} n2_cur;

DCPX_D n2_cur n2_at(const n2_src *q, uint32_t f) {
  n2_cur c;
  c.s = 0;
  while (c.s + 1 < q->W && q->off2[c.s + 1] <= f)
    c.s++;
  c.j = f - q->off2[c.s];
  return c;
}

DCPX_D void n2_step(const n2_src *q, n2_cur *c) {
  c->j += 32u;
  while (c->s + 1 < q->W && q->off2[c->s] + c->j >= q->off2[c->s + 1]) {
    c->j -= q->off2[c->s + 1] - q->off2[c->s];
    c->s++;
  }
}

/* Round-2 key at c (rank-major: a saturated rank's K-list, the others' N
 * lists with the keys outside S1 read as empty): its word, and bit 16 of
 * its l. */
DCPX_D uint32_t n2_word(const n2_src *q, n2_cur c, uint32_t *ret_hi) {
  const uint32_t s = c.s, j = c.j;
  if ((q->mask >> s) & 1u) {
    const uint32_t *p = q->krow0 + s * q->kstride;
    *ret_hi = n_hi(p, q->K, j);
    return p[j];
  }
  const uint32_t fl = s * q->N + j;
  const uint32_t *p = q->row0 + s * q->sstride;
  *ret_hi = n_hi(p, q->N, j);
  if (!((q->bits[fl >> 5] >> (fl & 31u)) & 1u))
    return 0;
  return p[j];
}

static __global__ void __launch_bounds__(NT)
    dcpx_nccl_round2_kernel(const dcpx_nkctx c, uint32_t rows,
                            const int32_t *req_id, const int32_t *block_table,
                            uint32_t bt_rows, uint32_t bt_cols,
                            int32_t *rows_out, int32_t *valid_out,
                            int32_t *ids_out, float rcp_b, float rcp_i) {
  __shared__ dcpx_sel_smem S;
  __shared__ uint32_t off2[DCPX_MAX_WORLD + 1];
  __shared__ uint32_t bound[DCPX_MAX_WORLD + 1];
  __shared__ uint32_t vd; /* n_voided, at the row's start */
  extern __shared__ uint4 dyn[];
  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t W = c.world, N = c.local_topk, K = c.topk, me = c.rank;
  const uint32_t rw_n = c.L.rw_n, rw_k = c.L.rw_k, bw = c.NL.bits_words;
  uint32_t *list = (uint32_t *)dyn; /* [rw_k] */
  uint32_t *bits = list + rw_k;     /* [bw] */
  const uint32_t *recv = (const uint32_t *)(c.buf + c.NL.off_recv);
  const uint32_t *rrecv = (const uint32_t *)(c.buf + c.NL.off_rrecv);
  const uint32_t *gmask = (const uint32_t *)(c.buf + c.NL.off_mask);
  const uint32_t *gbits = (const uint32_t *)(c.buf + c.NL.off_bits);

  dcpx_out_args oa;
  dcpx_dev_out_args_init(&oa, block_table, bt_rows, bt_cols, rows_out,
                         valid_out, ids_out, K, W, me, c.block_size,
                         c.interleave, rcp_b, rcp_i);

  n_beat(&c, DCPX_NCCL_BEAT_IDLE);
  uint32_t *satw = (uint32_t *)(c.ws + c.L.off_sat);
  uint64_t *stats = (uint64_t *)(c.ws + c.L.off_stats);
  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const uint32_t sw = gmask[t];
    if (!sw)
      continue; /* block-uniform: round 1 wrote this row's outputs */
    if (sw == N_VOID) { /* round 1 failed the row */
      if (tid == 0)
        n_count_failed(&c);
      continue;
    }
    const uint32_t mask = sw >> 16;
    n2_src q;
    q.row0 = recv + (uint64_t)t * rw_n;
    q.krow0 = rrecv + (uint64_t)t * rw_k;
    q.sstride = (uint64_t)rows * rw_n;
    q.kstride = (uint64_t)rows * rw_k;
    q.off2 = off2;
    q.bits = bits;
    q.W = W;
    q.N = N;
    q.K = K;
    q.mask = mask;
    for (uint32_t i = tid; i < bw; i += NT)
      bits[i] = gbits[(uint64_t)t * bw + i];
    if (tid == 0) {
      dcpx_dev_round2_offsets(off2, mask, W, K, N);
      vd = n_voided(&c);
    }
    dcpx_dev_sel_zero(&S);
    __syncthreads();
    if (vd) { /* the rescue all-gather may have ended without its data */
      n_row_void(&oa, t);
      if (tid == 0)
        n_count_failed(&c);
      __syncthreads();
      continue;
    }

    const uint32_t n2 = off2[W];
    const uint32_t kpw = (((n2 + NW - 1) / NW) + 31u) & ~31u;
    const uint32_t fbeg = min(n2, warp * kpw), fend = min(n2, fbeg + kpw);
    const n2_cur c0 = n2_at(&q, fbeg + lane);
    n2_cur at = c0;
    uint32_t hi, nz;

    for (uint32_t f0 = fbeg; f0 < fend; f0 += 32, n2_step(&q, &at))
      dcpx_dev_hist_add(S.hist,
                        f0 + lane < fend ? n2_word(&q, at, &hi) >> 16 : 0u);
    const int all = dcpx_dev_sel_after_a(&S, K, &nz);
    {
      const uint32_t lim = all ? 0u : S.hb << 4;
      uint32_t gtb = 0;
      at = c0;
      for (uint32_t f0 = fbeg; f0 < fend; f0 += 32, n2_step(&q, &at))
        gtb += dcpx_dev_passb(
            S.h16 + 16u * warp,
            f0 + lane < fend ? n2_word(&q, at, &hi) >> 16 : 0u, lim);
      gtb = __reduce_add_sync(DCPX_FULL, gtb);
      if (lane == 0)
        S.wgtb[warp] = gtb;
    }
    dcpx_dev_sel_finish(&S, K, all);
    {
      const uint32_t T = S.T, take = S.take, teq = T ? T : 0xFFFFFFFFu;
      uint32_t rg = S.wgt[warp], rq = S.weq[warp];
      if (tid == 0)
        bound[W] = all ? nz : K;
      at = c0;
      for (uint32_t f0 = fbeg; f0 < fend; f0 += 32, n2_step(&q, &at)) {
        const int v = f0 + lane < fend;
        const uint32_t s = at.s, j = at.j;
        hi = 0;
        const uint32_t w = v ? n2_word(&q, at, &hi) : 0u;
        const uint32_t o = w >> 16;
        const uint32_t packed = dcpx_dev_passc(o, T, teq);
        const uint32_t incl = dcpx_dev_warp_incl(packed);
        const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
        const uint32_t ex = incl - packed;
        uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu), pos = 0;
        if (v && j == 0)
          bound[s] = gb + min(qb, take); /* selected keys before rank s */
        if (dcpx_dev_sel_place(o, T, take, &gb, &qb, &pos))
          list[pos] = (s << 17) | (hi << 16) | (w & 0xFFFFu);
        rg += tot >> 16;
        rq += tot & 0xFFFFu;
      }
    }
    __syncthreads();
    dcpx_dev_outputs(&oa, t, req_id[t], list, bound[me],
                     bound[me + 1] - bound[me], bound[W]);
    if (tid == 0) { /* the row's state, as round 1 does for the others */
      if (c.ctr)
        dcpx_dev_count_row(c.ctr, 1u);
      satw[t] = sw;
      stats[2u * t] += 1;
      stats[2u * t + 1] += 1;
    }
    __syncthreads(); /* shared state is reused by the next row */
  }
}

/* ---- host side ------------------------------------------------------------ */

size_t dcpx_kn_lists_smem(const dcpx_nkctx *c) {
  return 4u * (size_t)c->L.rw_n + 6u * (size_t)DCPX_K_CAND;
}

size_t dcpx_kn_round1_smem(const dcpx_nkctx *c) {
  return 4u * ((size_t)c->L.rw_k + c->NL.bits_words) +
         6u * (size_t)DCPX_K_CAND;
}

size_t dcpx_kn_round2_smem(const dcpx_nkctx *c) {
  return 4u * ((size_t)c->L.rw_k + c->NL.bits_words);
}

int dcpx_kn_prepare(void) {
  /* The largest plans: rw_k <= 4224, bits <= 2048 words (W*N < 16*4096). */
  const int lists = 4 * 4224 + 6 * (int)DCPX_K_CAND;
  const int r1 = 4 * (4224 + 2048) + 6 * (int)DCPX_K_CAND;
  const int r2 = 4 * (4224 + 2048);
  if (cudaFuncSetAttribute(dcpx_nccl_lists_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           lists) != cudaSuccess ||
      cudaFuncSetAttribute(dcpx_nccl_round1_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           r1) != cudaSuccess ||
      cudaFuncSetAttribute(dcpx_nccl_round2_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           r2) != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

int dcpx_kn_lists(const dcpx_nkctx *c, uint32_t rows, const uint16_t *logits,
                  uint64_t stride, const int32_t *row_ends, cudaStream_t s) {
  int r = dcpx_kn_ctx_check(c);
  if (r < 0)
    return r;
  if (rows > c->rows_max || !logits || !stride || !row_ends)
    return DCPX_E_INVAL;
  /* Misaligned arrays would fault in the kernel (push.cu, merge.cu). */
  if (((uintptr_t)logits & 1u) || ((uintptr_t)row_ends & 3u))
    return DCPX_E_INVAL;
  if (rows == 0)
    return 0;
  const cudaLaunchConfig_t cfg =
      dcpx_launch_cfg(rows, LT, dcpx_kn_lists_smem(c), s);
  return cudaLaunchKernelEx(&cfg, dcpx_nccl_lists_kernel, *c, rows, logits,
                            stride, row_ends) == cudaSuccess
             ? 0
             : DCPX_E_CUDA;
}

int dcpx_kn_beat_idle(const dcpx_nkctx *c, cudaStream_t s) {
  if (!c->beat)
    return 0;
  const cudaLaunchConfig_t cfg = dcpx_launch_cfg(1, 32, 0, s);
  return cudaLaunchKernelEx(&cfg, dcpx_nccl_idle_kernel, *c) == cudaSuccess
             ? 0
             : DCPX_E_CUDA;
}

int dcpx_kn_round1(const dcpx_nkctx *c, uint32_t rows, const uint16_t *logits,
                   uint64_t stride, const int32_t *row_ends,
                   const int32_t *req_id, const int32_t *block_table,
                   uint32_t bt_rows, uint32_t bt_cols, int32_t *rows_out,
                   int32_t *valid_out, int32_t *ids_out, uint32_t *sat_out,
                   cudaStream_t s) {
  int r = dcpx_kn_ctx_check(c);
  if (r < 0)
    return r;
  if (rows > c->rows_max)
    return DCPX_E_INVAL;
  if ((r = dcpx_k_merge_args(logits, stride, row_ends, req_id, block_table,
                              bt_rows, bt_cols, rows_out, valid_out, ids_out,
                              sat_out)) < 0)
    return r;
  if (rows == 0)
    return 0;
  const cudaLaunchConfig_t cfg =
      dcpx_launch_cfg(rows, NT, dcpx_kn_round1_smem(c), s);
  return cudaLaunchKernelEx(&cfg, dcpx_nccl_round1_kernel, *c, rows, logits,
                            stride, row_ends, req_id, block_table, bt_rows,
                            bt_cols, rows_out, valid_out, ids_out, sat_out,
                            1.0f / (float)c->local_topk,
                            1.0f / (float)c->block_size,
                            1.0f / (float)c->interleave) == cudaSuccess
             ? 0
             : DCPX_E_CUDA;
}

int dcpx_kn_round2(const dcpx_nkctx *c, uint32_t rows, const int32_t *req_id,
                   const int32_t *block_table, uint32_t bt_rows,
                   uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                   int32_t *ids_out, cudaStream_t s) {
  int r = dcpx_kn_ctx_check(c);
  if (r < 0)
    return r;
  if (rows > c->rows_max || !req_id || !block_table || !bt_rows ||
      !bt_cols || !rows_out || !valid_out)
    return DCPX_E_INVAL;
  if ((((uintptr_t)req_id | (uintptr_t)block_table | (uintptr_t)rows_out |
        (uintptr_t)valid_out | (uintptr_t)ids_out) &
       3u))
    return DCPX_E_INVAL;
  if (rows == 0)
    return 0;
  const cudaLaunchConfig_t cfg =
      dcpx_launch_cfg(rows, NT, dcpx_kn_round2_smem(c), s);
  return cudaLaunchKernelEx(&cfg, dcpx_nccl_round2_kernel, *c, rows, req_id,
                            block_table, bt_rows, bt_cols, rows_out,
                            valid_out, ids_out, 1.0f / (float)c->block_size,
                            1.0f / (float)c->interleave) == cudaSuccess
             ? 0
             : DCPX_E_CUDA;
}
