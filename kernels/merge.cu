/* merge.cu - the merge of DESIGN.md section 5, one block per row (a block
 * walks rows t = blockIdx.x, t += gridDim.x when the grid is capped).
 *
 * Per row t of rank `me`, with e = next(epoch[t]) and p = e & 1:
 *
 *   1. Poll: every thread loads LL pairs of the W lists of row t from its
 *      own ll_slots[p][s][t] and waits (bounded) until both halves carry
 *      tag e. When the W lists fit (W * row_words(N) * 4 <=
 *      DCPX_MERGE_WORDS_SMEM) the entry words go to a flat shared array
 *      keys1[s * N + j] (key f = s * N + j, the flat (r, l) order) and the
 *      bit-16 planes beside it; else the later passes re-read them from the
 *      slots (they cannot change before this merge has set epoch[t]:
 *      section 4).
 *   2. Round 1: exact top-K of the W*N keys in flat (r, l) order
 *      (dcpx_device.cuh's selection: single-level when the keys, whose
 *      range the poll tracks, span fewer than 4096 values, else
 *      two-level; 4 keys per lane, 128 per warp step). The placement pass
 *      writes, per selected key, (r << 17 | l) at its output position in
 *      `list` and the S1 membership bits; rank s is saturated iff all N of
 *      its bits are set, and the selected keys of ranks before `me` give
 *      me's offset.
 *   The fault hook (block 0, first row) is checked at the row's first
 *   unsatisfied poll, before its rescue, or at its end, whichever comes
 *   first: always before any wait, and its control-page read (a PCIe round
 *   trip) overlaps the row's work.
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
 * list [row_words(K)] | S1 bits [ceil(W*N/32), to 4] | keys1 [W*N] and
 * planes [W][rw_n - N] (only when they fit) | the rescue's candidate
 * buffers (DCPX_K_CAND entries, see dcpx_dev_local_list).
 */
#include "dcpx_device.cuh"

#define MT DCPX_K_MERGE_THREADS
#define MW (MT / 32)
#if DCPX_MAX_TOPK > 8 * MT
#error "merge_outputs assumes K <= 8 * DCPX_K_MERGE_THREADS"
#endif
#define DCPX_MERGE_WORDS_SMEM (96u * 1024u)

/* Dynamic shared memory plan of a context (word counts of each region),
 * and reciprocals for dcpx_dev_div, computed once on the host. */
typedef struct merge_plan {
  uint32_t list_words, bits_words, keys_words, lists_words;
  float rcp_n, rcp_p, rcp_b, rcp_i;
} merge_plan;

static __host__ merge_plan plan_of(uint32_t W, uint32_t N, uint32_t rw_n,
                                   uint32_t rw_k, uint32_t P, uint32_t B,
                                   uint32_t I) {
  merge_plan p;
  p.list_words = rw_k; /* > K; a multiple of 4 */
  p.bits_words = ((W * N + 31) / 32 + 3) & ~3u;
  p.keys_words = (W * N + 3) & ~3u; /* padded with zero keys */
  p.lists_words = p.keys_words + W * (rw_n - N);
  if ((uint64_t)p.lists_words * 4 > DCPX_MERGE_WORDS_SMEM)
    p.keys_words = p.lists_words = 0;
  p.rcp_n = 1.0f / (float)N;
  p.rcp_p = 1.0f / (float)P;
  p.rcp_b = 1.0f / (float)B;
  p.rcp_i = 1.0f / (float)I;
  return p;
}

/* Where round 1's words are: the flat shared copy (keys != NULL) or the
 * LL slots of row t (source s at ll + s * src_stride). */
typedef struct r1_src {
  const uint32_t *keys;   /* [W*N] */
  const uint32_t *planes; /* [W][pwn] */
  const char *ll;
  uint64_t src_stride;
  uint32_t N, pwn;
  float rcp_n;
} r1_src;

DCPX_D uint32_t ll_word(const r1_src *q, uint32_t s, uint32_t j) {
  return dcpx_dev_ld_volatile(q->ll + s * q->src_stride +
                              (uint64_t)(j >> 1) * 16u + (j & 1u) * 8u);
}

/* Word j (an entry when j < N, a plane word after) of list s. */
DCPX_D uint32_t r1_word(const r1_src *q, uint32_t s, uint32_t j) {
  if (q->keys)
    return j < q->N ? q->keys[s * q->N + j] : q->planes[s * q->pwn + j - q->N];
  return ll_word(q, s, j);
}

/* Key f's word (flat order). */
DCPX_D uint32_t r1_key(const r1_src *q, uint32_t f) {
  if (q->keys)
    return q->keys[f];
  const uint32_t s = dcpx_dev_div(f, q->N, q->rcp_n);
  return ll_word(q, s, f - s * q->N);
}

/* Keys f .. f+3 (f a multiple of 4, f < fend); keys at or past fend read
 * as empty. In shared memory they are the padding or the next segment's,
 * which a segment end that is not the list's end never cuts (segments are
 * multiples of 128 keys). */
DCPX_D uint4 r1_key4(const r1_src *q, uint32_t f, uint32_t fend) {
  if (q->keys)
    return *(const uint4 *)(q->keys + f);
  uint4 k;
  k.x = r1_key(q, f);
  k.y = f + 1 < fend ? r1_key(q, f + 1) : 0u;
  k.z = f + 2 < fend ? r1_key(q, f + 2) : 0u;
  k.w = f + 3 < fend ? r1_key(q, f + 3) : 0u;
  return k;
}

DCPX_D uint32_t r1_hi(const r1_src *q, uint32_t s, uint32_t j) {
  return (r1_word(q, s, q->N + (j >> 5)) >> (j & 31u)) & 1u;
}

/* Everything round 2 needs to fetch key f. */
typedef struct r2_src {
  const r1_src *r1;
  const uint32_t *off2;  /* shared [W+1]: first key of each rank */
  const uint32_t *bits1; /* shared S1 bits */
  const char *resc;      /* rescue row t */
  uint32_t W, N, K, rw_k, mask;
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
  return r1_word(q->r1, s, j);
}

/* Bit 16 of round-2 key (s, j)'s local index. */
DCPX_D uint32_t r2_hi(const r2_src *q, uint32_t s, uint32_t j) {
  if ((q->mask >> s) & 1u) {
    const uint32_t slot = __popc(q->mask & ((1u << s) - 1u));
    const uint32_t w = dcpx_dev_ld_volatile(
        q->resc + ((uint64_t)slot * q->rw_k + q->K + (j >> 5)) * 4u);
    return (w >> (j & 31u)) & 1u;
  }
  return r1_hi(q->r1, s, j);
}

DCPX_D uint32_t u4get(uint4 k, uint32_t e) {
  return e == 0 ? k.x : e == 1 ? k.y : e == 2 ? k.z : k.w;
}

/* Passes A and B of a selection over the keys of this warp's segment
 * [fbeg, fend): KEY evaluates to key f's word (ord16 in the high half).
 * Macros, so that both rounds share them without templates. */
#define MERGE_PASS_A(KEY)                                                     \
  do {                                                                        \
    for (uint32_t f0 = fbeg; f0 < fend; f0 += 32) {                           \
      const uint32_t f = f0 + lane;                                           \
      dcpx_dev_hist_add(S.hist, f < fend ? (KEY) >> 16 : 0u);               \
    }                                                                         \
  } while (0)

#define MERGE_PASS_B(KEY, LIM)                                                \
  do {                                                                        \
    uint32_t gtb_ = 0;                                                        \
    for (uint32_t f0 = fbeg; f0 < fend; f0 += 32) {                           \
      const uint32_t f = f0 + lane;                                           \
      gtb_ += dcpx_dev_passb(S.h16 + 16u * warp,                            \
                               f < fend ? (KEY) >> 16 : 0u, (LIM));           \
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
  __shared__ uint32_t rcnt[DCPX_MAX_WORLD];
  __shared__ uint32_t kmin_s;
  __shared__ volatile uint32_t fail;
  extern __shared__ uint4 dyn[];

  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t W = c.world, N = c.local_topk, K = c.topk, me = c.rank;
  const uint32_t R = c.rows_max, P = c.L.pairs, rw_n = c.L.rw_n;
  const uint32_t rw_k = c.L.rw_k, nslots = c.L.rescue_slots;
  const uint32_t pwn = rw_n - N;
  uint32_t *list = (uint32_t *)dyn;
  uint32_t *bits1 = list + plan.list_words;
  uint32_t *keys_w = plan.lists_words ? bits1 + plan.bits_words : NULL;
  uint32_t *planes_w = keys_w ? keys_w + plan.keys_words : NULL;
  uint32_t *cl = bits1 + plan.bits_words + plan.lists_words;
  uint16_t *ckey = (uint16_t *)(cl + DCPX_K_CAND);
  char *ws = c.ws;
  uint32_t *epoch = (uint32_t *)(ws + c.L.off_epoch);
  uint32_t *seq2 = (uint32_t *)(ws + c.L.off_seq2);
  uint32_t *satw = (uint32_t *)(ws + c.L.off_sat);
  uint64_t *stats = (uint64_t *)(ws + c.L.off_stats);
  const uint64_t src_stride = (uint64_t)R * P * 16u;
  const uint32_t max_len =
      (uint64_t)c.max_local < stride ? c.max_local : (uint32_t)stride;

  dcpx_out_args oa;
  dcpx_dev_out_args_init(&oa, block_table, bt_rows, bt_cols, rows_out,
                         valid_out, ids_out, K, W, me, c.block_size,
                         c.interleave, plan.rcp_b, plan.rcp_i);

  r1_src q1;
  q1.keys = keys_w;
  q1.planes = planes_w;
  q1.src_stride = src_stride;
  q1.N = N;
  q1.pwn = pwn;
  q1.rcp_n = plan.rcp_n;

  /* The fault hook (block 0, thread 0, its first row): its word lives in
   * host memory, a PCIe round trip, so it is asked for now and looked at
   * only at the row's first wait, before its rescue push, or at the row's
   * end, whichever comes first: the stall always precedes any wait and
   * anything this rank publishes after its push. */
  uint32_t armed = 0, hook = 0;
  if (blockIdx.x == 0 && tid == 0) {
    armed = c.health[me].fault_armed;
    hook = 1;
  }

  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const uint32_t e = dcpx_dev_epoch_next(epoch[t]);
    const int32_t req = req_id[t];
    const uint32_t par = e & 1u;
    /* The request's block-table row, read at the end: into L1 now. */
    if (req >= 0 && (uint32_t)req < bt_rows)
      for (uint32_t x = tid * 32u; x < bt_cols; x += MT * 32u)
        asm volatile("prefetch.global.L1 [%0];" ::"l"(
            block_table + (uint64_t)req * bt_cols + x));
    const uint64_t ll_row = c.L.off_ll + ((uint64_t)par * W * R + t) * P * 16u;
    const char *ll = ws + ll_row; /* source 0; source s at + s * src_stride */
    q1.ll = ll;
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

    if (tid == 0) {
      fail = 0;
      kmin_s = 0xFFFFu;
    }
    if (keys_w && tid < plan.keys_words - W * N)
      keys_w[W * N + tid] = 0; /* the padding keys */
    dcpx_dev_sel_zero(&S);
    __syncthreads();

    do {
      /* ---- 1. poll the W lists: pair i of every source s ---- */
      uint32_t kmn = 0xFFFFu, kmx = 0; /* range of the non-empty keys */
      for (uint32_t i = tid; i < P && !fail; i += MT) {
        for (uint32_t s0 = 0; s0 < W; s0 += 8) {
          uint64_t a[8], b[8];
#pragma unroll
          for (uint32_t u = 0; u < 8; u++)
            if (s0 + u < W)
              dcpx_dev_ll_load(ll + (s0 + u) * src_stride + (uint64_t)i * 16u,
                               &a[u], &b[u]);
#pragma unroll
          for (uint32_t u = 0; u < 8; u++) {
            const uint32_t s = s0 + u;
            if (s >= W)
              break;
            if ((uint32_t)(a[u] >> 32) != e || (uint32_t)(b[u] >> 32) != e) {
              if (hook) { /* block 0, thread 0, first row: before a wait */
                hook = 0;
                if (armed)
                  dcpx_dev_fault_hook(c.health + me, e, call_tag);
              }
              const uint64_t off = s * src_stride + (uint64_t)i * 16u;
              const uint32_t index =
                  (uint32_t)((ll_row - c.L.off_ll + off) / 8u);
              if (!dcpx_dev_wait_ll(&wc, ll + off, e, index, &a[u], &b[u]))
                break;
            }
            const uint32_t j = 2 * i, k0 = (uint32_t)a[u] >> 16;
            const uint32_t k1 = (uint32_t)b[u] >> 16;
            if (j < N && k0) {
              kmn = min(kmn, k0);
              kmx = max(kmx, k0);
            }
            if (j + 1 < N && k1) {
              kmn = min(kmn, k1);
              kmx = max(kmx, k1);
            }
            if (keys_w) {
              if (j < N)
                keys_w[s * N + j] = (uint32_t)a[u];
              else
                planes_w[s * pwn + j - N] = (uint32_t)a[u];
              if (j + 1 < N)
                keys_w[s * N + j + 1] = (uint32_t)b[u];
              else
                planes_w[s * pwn + j + 1 - N] = (uint32_t)b[u];
            }
          }
        }
      }
      kmn = __reduce_min_sync(DCPX_FULL, kmn);
      kmx = __reduce_max_sync(DCPX_FULL, kmx);
      if (lane == 0) {
        atomicMin(&kmin_s, kmn);
        atomicMax(&S.kmax, kmx);
      }
      __syncthreads();
      if (fail)
        break;

      /* ---- 2. round 1 (4 keys per lane, 128 per warp step) ---- */
      const uint32_t n1 = W * N;
      uint32_t kpw = (((n1 + MW - 1) / MW) + 127u) & ~127u;
      uint32_t fbeg = min(n1, warp * kpw), fend = min(n1, fbeg + kpw);
      /* Single-level selection when the keys span < 4096 values (the usual
       * case: they are every rank's best), else the two-level one. */
      const uint32_t kmax = S.kmax;
      const uint32_t kmin = kmax < kmin_s ? 0u : kmin_s;
      uint32_t nz, T, take;
      int all;
      if (kmax - kmin < DCPX_HI_BINS) {
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
          const uint32_t f = f0 + 4u * lane;
          if (f < fend) {
            const uint4 k = r1_key4(&q1, f, fend);
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
              const uint32_t o = u4get(k, e) >> 16;
              if (o)
                atomicAdd(S.hist + (o - kmin), 1u);
            }
          }
        }
        all = dcpx_dev_sel1_pick(&S, K, kmin, &nz);
        T = all ? 0u : S.T;
        take = all ? 0u : S.take;
        const uint32_t teq = T ? T : 0xFFFFFFFFu;
        uint32_t gt = 0, eq = 0;
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
          const uint32_t f = f0 + 4u * lane;
          if (f < fend) {
            const uint4 k = r1_key4(&q1, f, fend);
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
              const uint32_t o = u4get(k, e) >> 16;
              gt += o > T;
              eq += o == teq;
            }
          }
        }
        gt = __reduce_add_sync(DCPX_FULL, gt);
        eq = __reduce_add_sync(DCPX_FULL, eq);
        if (lane == 0) {
          S.wgtb[warp] = gt;
          S.weqc[warp] = eq;
        }
        dcpx_dev_sel1_bases(&S);
      } else {
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
          const uint32_t f = f0 + 4u * lane;
          const uint4 k =
              f < fend ? r1_key4(&q1, f, fend) : make_uint4(0, 0, 0, 0);
          dcpx_dev_hist_add(S.hist, k.x >> 16);
          dcpx_dev_hist_add(S.hist, k.y >> 16);
          dcpx_dev_hist_add(S.hist, k.z >> 16);
          dcpx_dev_hist_add(S.hist, k.w >> 16);
        }
        all = dcpx_dev_sel_after_a(&S, K, &nz);
        const uint32_t lim = all ? 0u : S.hb << 4;
        uint32_t *h16w = S.h16 + 16u * warp, gtb = 0;
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
          const uint32_t f = f0 + 4u * lane;
          const uint4 k =
              f < fend ? r1_key4(&q1, f, fend) : make_uint4(0, 0, 0, 0);
          gtb += dcpx_dev_passb(h16w, k.x >> 16, lim);
          gtb += dcpx_dev_passb(h16w, k.y >> 16, lim);
          gtb += dcpx_dev_passb(h16w, k.z >> 16, lim);
          gtb += dcpx_dev_passb(h16w, k.w >> 16, lim);
        }
        gtb = __reduce_add_sync(DCPX_FULL, gtb);
        if (lane == 0)
          S.wgtb[warp] = gtb;
        dcpx_dev_sel_finish(&S, K, all);
        T = S.T;
        take = S.take;
      }
      {
        const uint32_t teq = T ? T : 0xFFFFFFFFu;
        uint32_t rg = S.wgt[warp], rq = S.weq[warp];
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
          const uint32_t f = f0 + 4u * lane;
          const uint4 k = f < fend ? r1_key4(&q1, f, fend) : make_uint4(0, 0, 0, 0);
          const uint32_t packed = dcpx_dev_passc(k.x >> 16, T, teq) +
                                  dcpx_dev_passc(k.y >> 16, T, teq) +
                                  dcpx_dev_passc(k.z >> 16, T, teq) +
                                  dcpx_dev_passc(k.w >> 16, T, teq);
          const uint32_t incl = dcpx_dev_warp_incl(packed);
          const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
          uint32_t nib = 0;
          if (packed) {
            /* The entries' (rank, l), independent of each other, first. */
            uint32_t ent[4];
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
              const uint32_t fe = min(f + e, fend - 1); /* past fend: unused */
              const uint32_t s = dcpx_dev_div(fe, N, q1.rcp_n);
              const uint32_t j = fe - s * N;
              ent[e] = (s << 17) | (r1_hi(&q1, s, j) << 16) |
                       (u4get(k, e) & 0xFFFFu);
            }
            const uint32_t ex = incl - packed;
            uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu), pos = 0;
#pragma unroll
            for (uint32_t e = 0; e < 4; e++) {
              if (dcpx_dev_sel_place(u4get(k, e) >> 16, T, take, &gb, &qb,
                                     &pos)) {
                list[pos] = ent[e];
                nib |= 1u << e;
              }
            }
          }
          /* S1 bits: lanes 8m .. 8m+7 make word f0 / 32 + m. */
          uint32_t v = nib << (4u * (lane & 7u));
          v |= __shfl_xor_sync(DCPX_FULL, v, 1);
          v |= __shfl_xor_sync(DCPX_FULL, v, 2);
          v |= __shfl_xor_sync(DCPX_FULL, v, 4);
          if ((lane & 7u) == 0)
            bits1[(f0 >> 5) + (lane >> 3)] = v;
          rg += tot >> 16;
          rq += tot & 0xFFFFu;
        }
        __syncthreads();
        /* Selected keys per rank: warp s counts rank s's S1 bits. */
        if (warp < W) {
          const uint32_t lo = warp * N, hi = lo + N;
          uint32_t cnt = 0;
          for (uint32_t wi = (lo >> 5) + lane; wi <= ((hi - 1) >> 5); wi += 32) {
            uint32_t m = bits1[wi];
            const uint32_t b0 = wi * 32u;
            if (b0 < lo)
              m &= ~0u << (lo - b0);
            if (hi - b0 < 32u)
              m &= (1u << (hi - b0)) - 1u;
            cnt += __popc(m);
          }
          cnt = __reduce_add_sync(DCPX_FULL, cnt);
          if (lane == 0)
            rcnt[warp] = cnt;
        }
        __syncthreads();
        const uint32_t rc = lane < W ? rcnt[lane] : 0u;
        mask = __ballot_sync(DCPX_FULL, lane < W && rc == N);
        const uint32_t base = __reduce_add_sync(DCPX_FULL, lane < me ? rc : 0u);
        const uint32_t own = __shfl_sync(DCPX_FULL, rc, me);
        sw = (mask << 16) | (all ? 0u : T);
        if (!mask)
          dcpx_dev_outputs(&oa, t, req, list, base, own, all ? nz : K);
      }

      /* ---- 3.-5. rescue and round 2 ---- */
      if (mask) {
        if (hook) {
          hook = 0;
          if (armed)
            dcpx_dev_fault_hook(c.health + me, e, call_tag);
        }
        const uint32_t q2 = dcpx_dev_epoch_next(seq2[t]);
        const uint64_t resc_row =
            c.L.off_rescue + (uint64_t)t * nslots * rw_k * 4u;
        if ((mask >> me) & 1u) {
          const int32_t re = row_ends[t];
          const uint32_t len =
              re < 0 ? 0u : ((uint32_t)re > max_len ? max_len : (uint32_t)re);
          dcpx_dev_local_list(&S, logits + (uint64_t)t * stride, len, K, list,
                              ckey, cl, DCPX_K_CAND);
          const uint32_t slot = __popc(mask & ((1u << me) - 1u));
          const uint64_t dst = resc_row + (uint64_t)slot * rw_k * 4u;
          const uint32_t n4 = rw_k / 4;
          for (uint32_t d = 0; d < W; d++) {
            char *pd = c.peers[d] + dst;
            for (uint32_t v = tid; v < n4; v += MT)
              *(uint4 *)(pd + (uint64_t)v * 16u) = ((const uint4 *)list)[v];
          }
          __syncthreads();
          if (tid < W) {
            char *pf = c.peers[tid] + c.L.off_flags + ((uint64_t)me * R + t) * 4u;
            __threadfence_system();
            dcpx_dev_st_release_sys(pf, q2);
          }
        }
        if (tid < W && ((mask >> tid) & 1u))
          dcpx_dev_wait_flag(
              &wc, ws + c.L.off_flags + ((uint64_t)tid * R + t) * 4u, q2,
              tid * R + t);
        if (tid == 0)
          dcpx_dev_round2_offsets(off2, mask, W, K, N);
        dcpx_dev_sel_zero(&S);
        __syncthreads();
        if (fail)
          break;

        r2_src q;
        q.r1 = &q1;
        q.off2 = off2;
        q.bits1 = bits1;
        q.resc = ws + resc_row;
        q.W = W;
        q.N = N;
        q.K = K;
        q.rw_k = rw_k;
        q.mask = mask;
        const uint32_t n2 = off2[W];
        kpw = (((n2 + MW - 1) / MW) + 31u) & ~31u;
        fbeg = min(n2, warp * kpw);
        fend = min(n2, fbeg + kpw);
        uint32_t ks, kj;
        MERGE_PASS_A(r2_word(&q, f, &ks, &kj));
        all = dcpx_dev_sel_after_a(&S, K, &nz);
        MERGE_PASS_B(r2_word(&q, f, &ks, &kj), all ? 0u : S.hb << 4);
        dcpx_dev_sel_finish(&S, K, all);
        const uint32_t T = S.T, take = S.take, teq = T ? T : 0xFFFFFFFFu;
        uint32_t rg = S.wgt[warp], rq = S.weq[warp];
        if (tid == 0)
          bound[W] = all ? nz : K;
        for (uint32_t f0 = fbeg; f0 < fend; f0 += 32) {
          const uint32_t f = f0 + lane;
          const int v = f < fend;
          uint32_t s = 0, j = 1;
          const uint32_t w = v ? r2_word(&q, f, &s, &j) : 0;
          const uint32_t o = w >> 16;
          const uint32_t packed = dcpx_dev_passc(o, T, teq);
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
        dcpx_dev_outputs(&oa, t, req, list, bound[me], bound[me + 1] - bound[me],
                      bound[W]);
        if (tid == 0)
          seq2[t] = q2;
      }

      /* ---- 6. the row's state ---- */
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
    if (hook) {
      hook = 0;
      if (armed)
        dcpx_dev_fault_hook(c.health + me, e, call_tag);
    }
    /* Every thread has read row t's words: the next call's epoch. */
    __syncthreads();
    if (ok && tid == 0)
      epoch[t] = e;
  }
}



/* ---- host side ------------------------------------------------------------ */

static merge_plan plan_ctx(const dcpx_kctx *c) {
  return plan_of(c->world, c->local_topk, c->L.rw_n, c->L.rw_k, c->L.pairs,
                 c->block_size, c->interleave);
}

size_t dcpx_k_merge_smem(const dcpx_kctx *c) {
  merge_plan p = plan_ctx(c);
  return 4u * ((size_t)p.list_words + p.bits_words + p.lists_words) +
         6u * (size_t)DCPX_K_CAND;
}

int dcpx_k_merge_prepare(void) {
  /* The largest plan: list 4224 words, bits 2048, keys and planes up to
   * the budget. */
  const int max_dyn = 4 * (4224 + 2048) + (int)DCPX_MERGE_WORDS_SMEM +
                      6 * (int)DCPX_K_CAND;
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
