/* merge.cu - the merge of DESIGN.md section 5, one block per row (a block
 * walks rows t = blockIdx.x, t += gridDim.x when the grid is capped).
 *
 * Per row t of rank `me`, with e = next(epoch[t]) and p = e & 1:
 *
 *   1. Poll: every thread loads LL pairs of the W lists of row t from its
 *      own ll_slots[p][s][t] and waits (bounded) until both halves carry
 *      tag e. The words go to shared memory when the W lists fit
 *      (W * row_words(N) * 4 <= DCPX_MERGE_WORDS_SMEM), else the later
 *      passes re-read them from the slots (they cannot change before this
 *      merge has set epoch[t]: section 4).
 *   2. Round 1: exact top-K of the W*N keys in flat (r, l) order
 *      (dcpx_device.cuh's selection). The placement pass writes, per
 *      selected key, (r << 17 | l) at its output position in `list`, the
 *      S1 membership bits, and the number of selected keys before each
 *      rank's first key (`bound`), so rank s holds bound[s+1] - bound[s]
 *      selected keys, and it is saturated iff that is N.
 *   3. No saturated rank: `list` is the answer.
 *   4. Rescue: a saturated `me` computes its local top-K list (capacity K)
 *      from its own logits, stores it into rescue slot
 *      popcount(mask & ((1 << me) - 1)) of every rank's row t, and, after a
 *      barrier and a system fence, stores next(seq2[t]) with release
 *      semantics into every rank's flags[me][t]. Every rank waits (bounded,
 *      acquire) for flags[s][t] of every saturated s.
 *   5. Round 2: exact top-K of rank-major keys: a saturated rank's K-list
 *      from its rescue slot, any other rank's N list with the keys outside
 *      S1 read as empty. seq2[t] = next(seq2[t]).
 *   6. Outputs from `list`; sat_word, stats; then, after a barrier (every
 *      thread has read the row's words), epoch[t] = e.
 *
 * A row whose wait gave up (timeout, own rank FAILED, group aborted)
 * writes valid_out[t] = -1 and -1 everywhere in rows_out/ids_out, and
 * leaves epoch, seq2 and stats alone: the group is recovered by zeroing.
 *
 * Shared memory: the selection state (static, ~19 KB) plus, dynamic,
 * list [row_words(K)] | S1 bits [ceil(W*N/32), to 4] | W lists [W][rw_n]
 * (the last only when it fits).
 */
#include "dcpx_device.cuh"

#define MT DCPX_K_MERGE_THREADS
#define MW (MT / 32)
#define DCPX_MERGE_WORDS_SMEM (96u * 1024u)

/* Dynamic shared memory plan of a context: word counts of each region. */
typedef struct merge_plan {
  uint32_t list_words, bits_words, lists_words;
} merge_plan;

static __host__ merge_plan plan_of(uint32_t W, uint32_t N, uint32_t rw_n,
                                   uint32_t rw_k) {
  merge_plan p;
  p.list_words = rw_k; /* > K; a multiple of 4 */
  p.bits_words = ((W * N + 31) / 32 + 3) & ~3u;
  p.lists_words =
      (uint64_t)W * rw_n * 4 <= DCPX_MERGE_WORDS_SMEM ? W * rw_n : 0;
  return p;
}

/* Word j of round-1 list s (shared copy, or the LL slot's half). */
DCPX_D uint32_t r1_word(const uint32_t *lists, uint32_t rw_n, const char *ll,
                        uint64_t src_stride, uint32_t s, uint32_t j) {
  if (lists)
    return lists[s * rw_n + j];
  return dcpx_dev_ld_volatile(ll + s * src_stride + (uint64_t)(j >> 1) * 16u +
                              (j & 1u) * 8u);
}

/* Everything round 2 needs to fetch key f. */
typedef struct r2_src {
  const uint32_t *off2;  /* shared [W+1]: first key of each rank */
  const uint32_t *bits1; /* shared S1 bits */
  const uint32_t *lists;
  const char *ll, *resc; /* row t's slots (parity p, source 0) / rescue row */
  uint64_t src_stride;
  uint32_t W, N, K, rw_n, rw_k, mask;
} r2_src;

/* Round-2 key f: its word (0 = empty), rank *ret_s, index *ret_j. */
DCPX_D uint32_t r2_word(const r2_src *q, uint32_t f, uint32_t *ret_s,
                        uint32_t *ret_j) {
  uint32_t s = 0;
  while (s + 1 < q->W && q->off2[s + 1] <= f)
    s++;
  const uint32_t j = f - q->off2[s];
  *ret_s = s;
  *ret_j = j;
  if ((q->mask >> s) & 1u) {
    const uint32_t slot = __popc(q->mask & ((1u << s) - 1u));
    return dcpx_dev_ld_volatile(q->resc +
                                ((uint64_t)slot * q->rw_k + j) * 4u);
  }
  const uint32_t fl = s * q->N + j;
  if (!((q->bits1[fl >> 5] >> (fl & 31u)) & 1u))
    return 0;
  return r1_word(q->lists, q->rw_n, q->ll, q->src_stride, s, j);
}

/* Bit 16 of round-2 key (s, j)'s local index. */
DCPX_D uint32_t r2_hi(const r2_src *q, uint32_t s, uint32_t j) {
  uint32_t w;
  if ((q->mask >> s) & 1u) {
    const uint32_t slot = __popc(q->mask & ((1u << s) - 1u));
    w = dcpx_dev_ld_volatile(q->resc +
                             ((uint64_t)slot * q->rw_k + q->K + (j >> 5)) * 4u);
  } else {
    w = r1_word(q->lists, q->rw_n, q->ll, q->src_stride, s, q->N + (j >> 5));
  }
  return (w >> (j & 31u)) & 1u;
}

/* Outputs of row t from list[0..bound[W]) (entries r << 17 | l, in (r, l)
 * order); rank me's entries are list[bound[me] .. bound[me+1]). */
DCPX_D void merge_outputs(uint32_t K, uint32_t W, uint32_t me, uint32_t B,
                          uint32_t I, uint32_t t, const uint32_t *list,
                          const uint32_t *bound, const int32_t *req_id,
                          const int32_t *block_table, uint32_t bt_rows,
                          uint32_t bt_cols, int32_t *rows_out,
                          int32_t *valid_out, int32_t *ids_out) {
  const uint32_t base = bound[me], cnt = bound[me + 1] - base;
  const uint32_t total = bound[W];
  const int32_t req = req_id[t];
  const int req_ok = req >= 0 && (uint32_t)req < bt_rows;
  int32_t *ro = rows_out + (uint64_t)t * K;
  int bad = 0;

  for (uint32_t p = threadIdx.x; p < K; p += MT) {
    if (ids_out) {
      int32_t g = -1;
      if (p < total) {
        const uint32_t x = list[p];
        g = dcpx_dev_gid(x & 0x1FFFFu, x >> 17, W, I);
      }
      ids_out[(uint64_t)t * K + p] = g;
    }
    int32_t v = -1;
    if (p < cnt) {
      const uint32_t l = list[base + p] & 0x1FFFFu, col = l / B;
      if (!req_ok || col >= bt_cols) {
        bad = 1;
      } else {
        const int64_t blk = block_table[(uint64_t)req * bt_cols + col];
        const int64_t kv = blk * B + l % B;
        if (blk < 0 || kv > INT32_MAX)
          bad = 1;
        v = (int32_t)kv;
      }
    }
    ro[p] = v;
  }
  /* An own element outside the table costs the row its rows_out (as the
   * host backend does), never a wild read. */
  if (__syncthreads_or(bad)) {
    for (uint32_t p = threadIdx.x; p < K; p += MT)
      ro[p] = -1;
  }
  if (threadIdx.x == 0)
    valid_out[t] = bad ? -1 : (int32_t)cnt;
}

/* Pass A of a selection over keys of this warp's segment [fbeg, fend):
 * KEY(f) evaluates to key f's word. Written as a macro so that both rounds
 * share it without templates. */
#define MERGE_PASS_A(KEY)                                                     \
  do {                                                                        \
    uint32_t nz_ = 0;                                                         \
    for (uint32_t f0 = fbeg; f0 < fend; f0 += 32) {                           \
      const uint32_t f = f0 + lane;                                           \
      const uint32_t o = f < fend ? (KEY) >> 16 : 0u;                         \
      dcpx_dev_hist_add1(S.hist, o >> 4, o != 0);                             \
      nz_ += o != 0;                                                          \
    }                                                                         \
    nz_ = __reduce_add_sync(DCPX_FULL, nz_);                                  \
    if (lane == 0)                                                            \
      S.wnz[warp] = nz_;                                                      \
  } while (0)

#define MERGE_PASS_B(KEY)                                                     \
  do {                                                                        \
    const uint32_t hb_ = S.hb;                                                \
    uint32_t gtb_ = 0;                                                        \
    for (uint32_t f0 = fbeg; f0 < fend; f0 += 32) {                           \
      const uint32_t f = f0 + lane;                                           \
      const uint32_t o = f < fend ? (KEY) >> 16 : 0u;                         \
      dcpx_dev_hist_add1(S.h16 + 16u * warp, o & 15u,                         \
                         o != 0 && (o >> 4) == hb_);                          \
      gtb_ += (o >> 4) > hb_;                                                 \
    }                                                                         \
    gtb_ = __reduce_add_sync(DCPX_FULL, gtb_);                                \
    if (lane == 0)                                                            \
      S.wgtb[warp] = gtb_;                                                    \
  } while (0)

static __global__ void __launch_bounds__(MT)
    dcpx_merge_kernel(const dcpx_kctx c, uint32_t rows,
                      const uint16_t *logits, uint64_t stride,
                      const int32_t *row_ends, const int32_t *req_id,
                      const int32_t *block_table, uint32_t bt_rows,
                      uint32_t bt_cols, int32_t *rows_out,
                      int32_t *valid_out, int32_t *ids_out,
                      uint32_t *sat_out, uint64_t call_tag,
                      merge_plan plan) {
  __shared__ dcpx_sel_smem S;
  __shared__ uint32_t bound[DCPX_MAX_WORLD + 1];
  __shared__ uint32_t off2[DCPX_MAX_WORLD + 1];
  __shared__ char *peer[DCPX_MAX_WORLD];
  __shared__ volatile uint32_t fail;
  extern __shared__ uint4 dyn[];

  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t W = c.world, N = c.local_topk, K = c.topk, me = c.rank;
  const uint32_t R = c.rows_max, P = c.L.pairs, rw_n = c.L.rw_n;
  const uint32_t rw_k = c.L.rw_k, nslots = c.L.rescue_slots;
  uint32_t *list = (uint32_t *)dyn;
  uint32_t *bits1 = list + plan.list_words;
  uint32_t *lists_w = plan.lists_words ? bits1 + plan.bits_words : NULL;
  const uint32_t *lists = lists_w;
  char *ws = c.ws;
  uint32_t *epoch = (uint32_t *)(ws + c.L.off_epoch);
  uint32_t *seq2 = (uint32_t *)(ws + c.L.off_seq2);
  uint32_t *satw = (uint32_t *)(ws + c.L.off_sat);
  uint64_t *stats = (uint64_t *)(ws + c.L.off_stats);
  const uint64_t src_stride = (uint64_t)R * P * 16u;
  const uint32_t max_len =
      (uint64_t)c.max_local < stride ? c.max_local : (uint32_t)stride;

  if (tid < W)
    peer[tid] = c.peers[tid];

  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const uint32_t e = dcpx_dev_epoch_next(epoch[t]);
    const uint32_t par = e & 1u;
    const uint64_t ll_row = c.L.off_ll + ((uint64_t)par * W * R + t) * P * 16u;
    const char *ll = ws + ll_row; /* source 0; source s at + s * src_stride */
    dcpx_wctx wc;
    wc.ctl = c.ctl;
    wc.health = c.health + me;
    wc.rec = c.records + (uint64_t)me * R + t;
    wc.call_tag = call_tag;
    wc.rank = me;
    wc.t = t;
    wc.fail = &fail;
    uint32_t sw = 0, mask = 0;
    int ok = 0;

    if (tid == 0)
      fail = 0;
    dcpx_dev_sel_zero(&S);
    __syncthreads();

    do {
      /* ---- 1. poll the W lists ---- */
#ifndef DCPX_K_NO_FAULT_HOOK /* TEMP bench */
      if (t == 0 && tid == 0)
        dcpx_dev_fault_hook(c.health + me, e, call_tag);
#endif
      const uint32_t npairs = W * P;
      for (uint32_t x0 = 0; x0 < npairs && !fail; x0 += 4 * MT) {
        uint64_t a[4], b[4];
#pragma unroll
        for (uint32_t u = 0; u < 4; u++) {
          const uint32_t x = x0 + u * MT + tid;
          if (x < npairs) {
            const uint32_t s = x / P, i = x - s * P;
            dcpx_dev_ll_load(ll + s * src_stride + (uint64_t)i * 16u, &a[u],
                             &b[u]);
          }
        }
#pragma unroll
        for (uint32_t u = 0; u < 4; u++) {
          const uint32_t x = x0 + u * MT + tid;
          if (x >= npairs)
            break;
          const uint32_t s = x / P, i = x - s * P;
          if ((uint32_t)(a[u] >> 32) != e || (uint32_t)(b[u] >> 32) != e) {
            const uint64_t off = s * src_stride + (uint64_t)i * 16u;
            const uint32_t index = (uint32_t)((ll_row - c.L.off_ll + off) / 8u);
            if (!dcpx_dev_wait_ll(&wc, ll + off, e, index, &a[u], &b[u]))
              break;
          }
          if (lists_w) {
            lists_w[s * rw_n + 2 * i] = (uint32_t)a[u];
            lists_w[s * rw_n + 2 * i + 1] = (uint32_t)b[u];
          }
        }
      }
      __syncthreads();
      if (fail)
        break;

      /* ---- 2. round 1 ---- */
      const uint32_t n1 = W * N;
      uint32_t kpw = (((n1 + MW - 1) / MW) + 31u) & ~31u;
      uint32_t fbeg = min(n1, warp * kpw), fend = min(n1, fbeg + kpw);
#define R1_KEY r1_word(lists, rw_n, ll, src_stride, f / N, f - (f / N) * N)
      MERGE_PASS_A(R1_KEY);
      uint32_t nz;
      int all = dcpx_dev_sel_after_a(&S, K, &nz);
      if (!all)
        MERGE_PASS_B(R1_KEY);
#undef R1_KEY
      dcpx_dev_sel_finish(&S, K, all);
      {
        const uint32_t T = S.T, take = S.take;
        uint32_t rg = S.wgt[warp], rq = S.weq[warp];
        if (tid == 0)
          bound[W] = all ? nz : K;
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 32) {
          const uint32_t f = f0 + lane;
          const int v = f < fend;
          const uint32_t s = f / N, j = f - s * N;
          const uint32_t w = v ? r1_word(lists, rw_n, ll, src_stride, s, j) : 0;
          const uint32_t o = w >> 16;
          const uint32_t packed = ((uint32_t)(o > T) << 16) | (o == T && T);
          const uint32_t incl = dcpx_dev_warp_incl(packed);
          const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
          const uint32_t ex = incl - packed;
          uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu), pos = 0;
          if (v && j == 0)
            bound[s] = gb + min(qb, take);
          const int sel = dcpx_dev_sel_place(o, T, take, &gb, &qb, &pos);
          if (sel) {
            const uint32_t hi =
                (r1_word(lists, rw_n, ll, src_stride, s, N + (j >> 5)) >>
                 (j & 31u)) & 1u;
            list[pos] = (s << 17) | (hi << 16) | (w & 0xFFFFu);
          }
          const uint32_t bal = __ballot_sync(DCPX_FULL, sel);
          if (lane == 0)
            bits1[f0 >> 5] = bal;
          rg += tot >> 16;
          rq += tot & 0xFFFFu;
        }
        __syncthreads();
        for (uint32_t s = 0; s < W; s++)
          if (bound[s + 1] - bound[s] == N)
            mask |= 1u << s;
        sw = (mask << 16) | (all ? 0u : T);
      }

      /* ---- 3.-5. rescue and round 2 ---- */
      if (mask) {
        const uint32_t q2 = dcpx_dev_epoch_next(seq2[t]);
        const uint64_t resc_row =
            c.L.off_rescue + (uint64_t)t * nslots * rw_k * 4u;
        if ((mask >> me) & 1u) {
          int32_t re = row_ends[t];
          const uint32_t len =
              re < 0 ? 0u : ((uint32_t)re > max_len ? max_len : (uint32_t)re);
          dcpx_dev_local_list(&S, logits + (uint64_t)t * stride, len, K, list,
                              NULL, 0);
          const uint32_t slot = __popc(mask & ((1u << me) - 1u));
          const uint64_t dst = resc_row + (uint64_t)slot * rw_k * 4u;
          const uint32_t n4 = rw_k / 4, total = W * n4;
          for (uint32_t x = tid; x < total; x += MT) {
            const uint32_t d = x / n4, v = x - d * n4;
            *(uint4 *)(peer[d] + dst + (uint64_t)v * 16u) =
                ((const uint4 *)list)[v];
          }
          __syncthreads();
          if (tid < W) {
            __threadfence_system();
            dcpx_dev_st_release_sys(
                peer[tid] + c.L.off_flags + ((uint64_t)me * R + t) * 4u, q2);
          }
        }
        if (tid < W && ((mask >> tid) & 1u))
          dcpx_dev_wait_flag(
              &wc, ws + c.L.off_flags + ((uint64_t)tid * R + t) * 4u, q2,
              tid * R + t);
        if (tid == 0) {
          uint32_t o = 0;
          for (uint32_t s = 0; s < W; s++) {
            off2[s] = o;
            o += ((mask >> s) & 1u) ? K : N;
          }
          off2[W] = o;
        }
        dcpx_dev_sel_zero(&S);
        __syncthreads();
        if (fail)
          break;

        r2_src q;
        q.off2 = off2;
        q.bits1 = bits1;
        q.lists = lists;
        q.ll = ll;
        q.resc = ws + resc_row;
        q.src_stride = src_stride;
        q.W = W;
        q.N = N;
        q.K = K;
        q.rw_n = rw_n;
        q.rw_k = rw_k;
        q.mask = mask;
        const uint32_t n2 = off2[W];
        kpw = (((n2 + MW - 1) / MW) + 31u) & ~31u;
        fbeg = min(n2, warp * kpw);
        fend = min(n2, fbeg + kpw);
        uint32_t ks, kj;
#define R2_KEY r2_word(&q, f, &ks, &kj)
        MERGE_PASS_A(R2_KEY);
        all = dcpx_dev_sel_after_a(&S, K, &nz);
        if (!all)
          MERGE_PASS_B(R2_KEY);
#undef R2_KEY
        dcpx_dev_sel_finish(&S, K, all);
        const uint32_t T = S.T, take = S.take;
        uint32_t rg = S.wgt[warp], rq = S.weq[warp];
        if (tid == 0)
          bound[W] = all ? nz : K;
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 32) {
          const uint32_t f = f0 + lane;
          const int v = f < fend;
          uint32_t s = 0, j = 1;
          const uint32_t w = v ? r2_word(&q, f, &s, &j) : 0;
          const uint32_t o = w >> 16;
          const uint32_t packed = ((uint32_t)(o > T) << 16) | (o == T && T);
          const uint32_t incl = dcpx_dev_warp_incl(packed);
          const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
          const uint32_t ex = incl - packed;
          uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu), pos = 0;
          if (v && j == 0)
            bound[s] = gb + min(qb, take);
          if (dcpx_dev_sel_place(o, T, take, &gb, &qb, &pos))
            list[pos] = (s << 17) | (r2_hi(&q, s, j) << 16) | (w & 0xFFFFu);
          rg += tot >> 16;
          rq += tot & 0xFFFFu;
        }
        __syncthreads();
        if (tid == 0)
          seq2[t] = q2;
      }

      /* ---- 6. outputs ---- */
      merge_outputs(K, W, me, c.block_size, c.interleave, t, list, bound,
                    req_id, block_table, bt_rows, bt_cols, rows_out,
                    valid_out, ids_out);
      if (tid == 0) {
        satw[t] = sw;
        if (sat_out)
          sat_out[t] = sw;
        stats[2u * t] += 1;
        stats[2u * t + 1] += mask != 0;
      }
      ok = 1;
    } while (0);

    if (!ok) {
      for (uint32_t p = tid; p < K; p += MT) {
        rows_out[(uint64_t)t * K + p] = -1;
        if (ids_out)
          ids_out[(uint64_t)t * K + p] = -1;
      }
      if (tid == 0) {
        valid_out[t] = -1;
        if (sat_out)
          sat_out[t] = sw;
      }
    }
    /* Every thread has read row t's words: the next call's epoch. */
    __syncthreads();
    if (ok && tid == 0)
      epoch[t] = e;
  }
}

/* ---- host side ------------------------------------------------------------ */

static merge_plan plan_ctx(const dcpx_kctx *c) {
  return plan_of(c->world, c->local_topk, c->L.rw_n, c->L.rw_k);
}

size_t dcpx_k_merge_smem(const dcpx_kctx *c) {
  merge_plan p = plan_ctx(c);
  return 4u * ((size_t)p.list_words + p.bits_words + p.lists_words);
}

int dcpx_k_merge_prepare(void) {
  /* The largest plan: list 4224 words, bits 2048, lists up to the budget. */
  const int max_dyn = 4 * (4224 + 2048) + (int)DCPX_MERGE_WORDS_SMEM;
  if (cudaFuncSetAttribute(dcpx_merge_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           max_dyn) != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

int dcpx_k_merge_occupancy(const dcpx_kctx *c, int *ret_blocks_per_sm) {
  int n = 0;
  if (dcpx_k_ctx_check(c) < 0 || !ret_blocks_per_sm)
    return DCPX_E_INVAL;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &n, dcpx_merge_kernel, MT, dcpx_k_merge_smem(c)) != cudaSuccess)
    return DCPX_E_CUDA;
  *ret_blocks_per_sm = n;
  return 0;
}

int dcpx_k_merge(const dcpx_kctx *c, uint32_t rows, const uint16_t *logits,
                 uint64_t stride, const int32_t *row_ends,
                 const int32_t *req_id, const int32_t *block_table,
                 uint32_t bt_rows, uint32_t bt_cols, int32_t *rows_out,
                 int32_t *valid_out, int32_t *ids_out, uint32_t *sat_out,
                 uint64_t call_tag, cudaStream_t s) {
  int r = dcpx_k_ctx_check(c);
  if (r < 0)
    return r;
  if (rows > c->rows_max || !logits || !stride || !row_ends || !req_id ||
      !block_table || !bt_rows || !bt_cols || !rows_out || !valid_out)
    return DCPX_E_INVAL;
  if (rows == 0)
    return 0;
  uint32_t grid = rows;
  if (c->max_blocks && c->max_blocks < grid)
    grid = c->max_blocks;
  merge_plan p = plan_ctx(c);
  dcpx_merge_kernel<<<grid, MT, dcpx_k_merge_smem(c), s>>>(
      *c, rows, logits, stride, row_ends, req_id, block_table, bt_rows,
      bt_cols, rows_out, valid_out, ids_out, sat_out, call_tag, p);
  if (cudaGetLastError() != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}
