/* merge.cu - the merge of docs/PROTOCOL.md section 5, one block
 * per row (a block walks rows t = blockIdx.x, t += gridDim.x when the grid
 * is capped).
 *
 * Per row t of rank `me`, with e = tag(epoch[t]) (dcpx_epoch_tag) and
 * p = e & 1:
 *
 *   1. Poll: the W lists of row t from ll_slots[p][s][t], every 16-byte pair
 *      accepted only when both halves carry tag e (bounded wait), as one
 *      flat range over all threads but the last warp (poll_flat). Each word
 *      is copied once into the block's staging area: entries k1[s*N + j]
 *      (the flat (r, l) order), bit-16 planes p1[s][*]. Nothing later reads
 *      the slots again, so a peer's next push cannot change what this row
 *      sees. The staging area is shared memory when it fits the budget,
 *      else a private global area of this rank (kctx.stage, one per block).
 *   2. Round 1: exact top-K of k1 (flat_select: single-level when the keys
 *      span < 4096 values, else two-level; 4 keys per lane, 128 per warp
 *      step). Pass C writes each selected key's (r << 17 | l) at its output
 *      position in `list` and its word at the same position in s1k; the
 *      per-rank bounds of `list` give the saturated ranks (all N
 *      selected) and me's range.
 *   The fault hook (block 0, first row) fires right after this poll
 *   (docs/PROTOCOL.md 6.6).
 *   3. No saturated rank: `list` is the answer.
 *   4. Rescue, with q2 = next(seq2[t]) and T1 = sat_word & 0xFFFF: a
 *      saturated `me` builds its rescue list (its local top-K entries with
 *      ord16 >= T1: one counting and one placing pass over its row) and
 *      stores it as LL pairs tagged q2 into rescue slot
 *      popcount(mask & ((1 << me) - 1)) of row t of every other rank (its
 *      own copy goes straight into k2): only the pairs that are sent
 *      (the entries, the end mark, their plane words; docs/PROTOCOL.md
 *      5.4), half the block storing while the other half prepares round
 *      2. No fence, no flag. Every rank polls the slots of the other
 *      saturated ranks (tag q2; a pair past a list's end mark is zeros)
 *      into its staging area: round 2's keys k2, rank-major, each rank's
 *      segment padded to 4 keys: a saturated rank's rescue list (built
 *      in `list2`), any other rank's S1 keys compacted in order (their
 *      entries are `list`'s, so round 2 walks about K + the extras, not
 *      every rank's N).
 *   5. Round 2: flat_select over k2, pass C into `list2`. seq2[t] = q2.
 *   6. Outputs from `list` (or `list2` after a rescue); sat_word, stats;
 *      then, after a barrier (every
 *      thread is done with the row), epoch[t] = e.
 *   During its first row's poll, the last warp of every block gives its
 *   share of the rows u >= rows that the call does not hold the call's
 *   call half (merge_pass_rows).
 *
 * A row whose wait gave up (timeout, own rank FAILED, group aborted)
 * writes valid_out[t] = -1 and -1 everywhere in rows_out/ids_out, and
 * leaves epoch, seq2 and stats alone: the group is recovered by zeroing.
 *
 * Shared memory: the selection state (static, ~19 KB), then, dynamic,
 * list [row_words(K)] | list2 [row_words(K)] | s1k [row_words(K)] | the
 * staging
 * area (when it fits):
 * k1 [W*N, to 4] | p1 [W][rw_n - N] | k2 [round-2 keys] | p2 [S][rw_k - K],
 * (a saturated rank with more than K elements >= T1 selects its top K
 * from the row in registers: no candidate buffers).
 */
/* merge_half.cu includes this file for the half-size blocks (MT / 2
 * threads, two per SM), whose selection needs 16 buckets per lane in
 * dcpx_dev_hist_find (DCPX_HF_PER_MAX): compiled apart, so that the
 * full blocks' code keeps 8. */
#include "dcpx_device.cuh"

#define MT DCPX_K_MERGE_THREADS


/* Dynamic shared memory plan of a context (word counts of each region),
 * and reciprocals for dcpx_dev_div, computed once on the host. */
typedef struct merge_plan {
  uint32_t list_words; /* list, list2 and s1k: rw_k words each */
  uint32_t k1_words, p1_words, k2_words, p2_words, stage_words;
  uint32_t in_smem; /* 1: the staging area is shared memory */
  float rcp_n, rcp_b, rcp_i;
} merge_plan;

static __host__ merge_plan plan_of(const dcpx_kctx *c) {
  const dcpx_stage_plan sp = dcpx_stage_plan_of(&c->L);
  merge_plan p;
  p.list_words = c->L.rw_k; /* > K; a multiple of 4 */
  p.k1_words = sp.k1;
  p.p1_words = sp.p1;
  p.k2_words = sp.k2;
  p.p2_words = sp.p2;
  p.stage_words = sp.words;
  p.in_smem = sp.in_smem;
  p.rcp_n = 1.0f / (float)c->local_topk;
  p.rcp_b = 1.0f / (float)c->block_size;
  p.rcp_i = 1.0f / (float)c->interleave;
  return p;
}

/* Where the words of polled list x go: entries to ent[x][j] (j < C),
 * plane words to pl[x][j - C]; the pairs come from src[x]. */
typedef struct poll_map {
  const char *src[DCPX_MAX_WORLD];
  uint32_t *ent[DCPX_MAX_WORLD];
  uint32_t *pl[DCPX_MAX_WORLD];
  uint32_t cs[DCPX_MAX_WORLD]; /* rescue lists: entries, ~0 until known */
} poll_map;

DCPX_D void stage_word(const poll_map *m, uint32_t x, uint32_t j, uint32_t C,
                       uint32_t w, uint32_t *kmn, uint32_t *kmx) {
  if (j < C) {
    m->ent[x][j] = w;
    const uint32_t k = w >> 16;
    if (k) {
      *kmn = min(*kmn, k);
      *kmx = max(*kmx, k);
    }
  } else {
    m->pl[x][j - C] = w;
  }
}

/* Pair i of list x arrived as (wa, wb): both words staged. Of a rescue
 * list, a pair holding the list's end mark (its first empty entry) also
 * gives the list's entry count, into m->cs[x]. */
DCPX_D void pair_take(poll_map *m, uint32_t x, uint32_t i, uint32_t C,
                      int rescue, uint32_t wa, uint32_t wb, uint32_t *kmn,
                      uint32_t *kmx) {
  const uint32_t j = 2u * i;
  if (!rescue && !(C & 1u) && j + 1u < C) {
    /* Two entries (C even: 8-byte aligned in ent[x]), branch-free */
    *(uint2 *)(m->ent[x] + j) = make_uint2(wa, wb);
    const uint32_t ka = wa >> 16, kb = wb >> 16;
    *kmn = min(*kmn, min(ka ? ka : 0xFFFFu, kb ? kb : 0xFFFFu));
    *kmx = max(*kmx, max(ka, kb));
    return;
  }
  stage_word(m, x, j, C, wa, kmn, kmx);
  stage_word(m, x, j + 1u, C, wb, kmn, kmx);
  if (!rescue)
    return;
  if (j < C && wa == 0u)
    atomicMin(&m->cs[x], j);
  else if (j + 1u < C && wb == 0u)
    atomicMin(&m->cs[x], j + 1u);
}

/* The bounded wait for pair i of list x at p, which was late at the first
 * look: 1 when it arrived (*pa, *pb), 0 when the wait gave up, and, for a
 * rescue list, 2 when the list's end mark shows the pair is not sent
 * (docs/PROTOCOL.md 5.4; its words are zeros). Until the end mark is in, a
 * wait cannot tell a pair not sent from one on its way. */
DCPX_D int pair_wait(const dcpx_wctx *w, const poll_map *m, uint32_t x,
                     uint32_t i, const char *p, uint32_t e, uint32_t region,
                     uint32_t index, uint32_t C, int rescue, uint64_t *pa,
                     uint64_t *pb) {
  if (!rescue)
    return dcpx_dev_wait_ll(w, p, e, region, index, pa, pb);
  uint64_t mine = dcpx_dev_now();
  for (;;) {
    dcpx_dev_ll_load(p, pa, pb);
    const uint32_t ta = (uint32_t)(*pa >> 32), tb = (uint32_t)(*pb >> 32);
    if (ta == e && tb == e)
      return 1;
    const uint32_t c = *(const volatile uint32_t *)&m->cs[x];
    if (c != ~0u && !dcpx_rescue_pair_sent(C, c, i))
      return 2;
    if (!dcpx_dev_wait_step(w, &mine, region, ta != e ? index : index + 1, e,
                            ta != e ? ta : tb))
      return 0;
  }
}

/* A poll of nsrc lists of `pairs` LL pairs (tag e) into the staging area,
 * tracking the range of the non-empty entry keys: the lists taken as one
 * flat range, pair k of it (list k / pairs, pair k % pairs) by thread
 * k % np, eight at a time (one round at W=8, N=512: 4.4 pairs a thread),
 * all loaded before any is looked at, so that a warp's lanes load
 * consecutive pairs of one list and every thread below np has work.
 * Threads from np on poll nothing (round 1: the block's last warp, whose
 * last thread reads the fault hook's host word meanwhile). region_base:
 * the start of the polled region in this rank's workspace (record
 * indices). The pairs that carry tag e at the first look are staged at
 * once; the late ones wait one by one (pair_wait).
 * rescue (a constant at each call): the lists are rescue lists of
 * capacity C, of which only the pairs that are sent are waited for
 * (m->cs[x] reset to ~0 by the caller); their padding pairs, never sent,
 * are zeros at once. A thread waits for its late pairs in ascending k
 * (its batches in order, a batch's late pairs in order), and a list's end
 * mark is a sent pair at a smaller k than any pair of it that is not
 * sent: so a wait that needs an end mark depends only on pairs of
 * smaller k, and by induction on k every wait ends (an outside review
 * checked the mapping and this over every K <= 4096, session 27).
 * A rescue poll's timeout record is deferred (the caller set bw->defer):
 * each waiter that gives up leaves the k of its pair in rec_k (the least
 * wins), and the caller records that pair after the poll
 * (rescue_give_up). The first waiter to time out may be one whose pair
 * is not sent at all, waiting for an end mark that another thread holds
 * but never staged, being stuck on a smaller k of a stalled rank: its
 * record named a rank that had sent everything (an outside review,
 * session 34). The least k given up on is a pair that was sent and
 * never came: an end mark that such a pair would wait for lies at a
 * smaller k, and its holder is waiting at a smaller k still. */
DCPX_D uint32_t poll_lp(uint32_t pairs, uint32_t C, int rescue) {
  return rescue ? min(pairs, (C + (C + 31u) / 32u + 1u) / 2u) : pairs;
}

DCPX_D void poll_flat(const dcpx_wctx *w, poll_map *m, uint32_t nsrc,
                      uint32_t pairs, uint32_t C, uint32_t e, uint32_t region,
                      const char *region_base, uint32_t np, int rescue,
                      uint32_t *kmn, uint32_t *kmx) {
  if (threadIdx.x >= np)
    return;
  /* the pairs looked at: a rescue list's sent ones */
  const uint32_t lp = poll_lp(pairs, C, rescue);
  if (rescue) {
#pragma unroll 1
    for (uint32_t k = threadIdx.x; k < nsrc * (pairs - lp); k += np) {
      const uint32_t x = k / (pairs - lp); /* padding: rare, never sent */
      pair_take(m, x, lp + k - x * (pairs - lp), C, 0, 0u, 0u, kmn, kmx);
    }
  }
  const uint32_t total = nsrc * lp;
  uint32_t x = threadIdx.x / lp, i = threadIdx.x - x * lp;
  /* k += np as (x, i) += (dx, di) and one carry: no loop per step, which
   * at small N (pairs down to 2) would run np / pairs times */
  const uint32_t dx = np / lp, di = np - dx * lp;
#pragma unroll 1
  for (uint32_t k0 = threadIdx.x; k0 < total && !w->bw->fail; k0 += 8u * np) {
    uint64_t a[8], b[8];
    uint32_t xs[8], is[8];
#pragma unroll
    for (uint32_t u = 0; u < 8; u++) {
      xs[u] = x;
      is[u] = i;
      if (k0 + u * np < total)
        dcpx_dev_ll_load(m->src[x] + (uint64_t)i * 16u, &a[u], &b[u]);
      i += di;
      x += dx;
      if (i >= lp) {
        i -= lp;
        x++;
      }
    }
    uint32_t late = 0;
#pragma unroll
    for (uint32_t u = 0; u < 8; u++) {
      if (k0 + u * np >= total)
        break;
      if ((uint32_t)(a[u] >> 32) != e || (uint32_t)(b[u] >> 32) != e) {
        late |= 1u << u;
        continue;
      }
      pair_take(m, xs[u], is[u], C, rescue, (uint32_t)a[u], (uint32_t)b[u],
                kmn, kmx);
    }
    while (late) { /* (list, pair) from k again: xs and is stay registers */
      const uint32_t k = k0 + (uint32_t)(__ffs(late) - 1) * np;
      late &= late - 1;
      const uint32_t lx = k / lp, li = k - lx * lp;
      const char *p = m->src[lx] + (uint64_t)li * 16u;
      uint64_t pa = 0, pb = 0;
      const int r = pair_wait(w, m, lx, li, p, e, region,
                              (uint32_t)((p - region_base) / 8u), C, rescue,
                              &pa, &pb);
      if (!r) {
        if (rescue && w->bw->fail == 2u) /* the record is deferred */
          atomicMin(&w->bw->rec_k, k);
        return;
      }
      if (r == 2) /* not sent: zeros */
        pa = pb = 0;
      pair_take(m, lx, li, C, rescue && r == 1, (uint32_t)pa, (uint32_t)pb,
                kmn, kmx);
    }
  }
}

/* Round 2's keys besides the rescue lists: each non-saturated rank's S1
 * keys in order, which are round 1's selected words s1k[bound[s] ..
 * bound[s + 1]) (flat_place wrote each beside its entry in `list`; their
 * entries are list[bound[s] + j]: the key map's s1), into k2 (segment s
 * at off2[s]), and every segment's padding. One pass over k2's groups of
 * 4 positions, which share a segment (segments start at multiples of 4):
 * no position waits for another. A saturated rank's segment is its rescue
 * list (merge_keep_own, or the poll): only its padding past K here. By
 * threads tx = 0 .. nt - 1. */
DCPX_D void round2_copy(const uint32_t *s1k, const uint32_t *bound,
                        const uint32_t *off2, uint32_t *k2, uint32_t mask,
                        uint32_t W, uint32_t K, uint32_t tx, uint32_t nt,
                        uint32_t *kmn, uint32_t *kmx) {
  const uint32_t n2 = off2[W];
  uint32_t mn = *kmn, mx = *kmx;
#pragma unroll 1
  for (uint32_t x = 4u * tx; x < n2; x += 4u * nt) {
    uint32_t s = 0;
#pragma unroll
    for (uint32_t step = DCPX_MAX_WORLD / 2; step; step >>= 1)
      if (s + step < W && off2[s + step] <= x)
        s += step;
    const uint32_t j = x - off2[s];
    if ((mask >> s) & 1u) {
#pragma unroll
      for (uint32_t u = 0; u < 4; u++)
        if (j + u >= K)
          k2[x + u] = 0;
      continue;
    }
    const uint32_t b = bound[s], cnt = bound[s + 1] - b;
    uint32_t v[4];
#pragma unroll
    for (uint32_t u = 0; u < 4; u++) {
      v[u] = j + u < cnt ? s1k[b + j + u] : 0u;
      const uint32_t k = v[u] >> 16;
      if (k) {
        mn = min(mn, k);
        mx = max(mx, k);
      }
    }
    *(uint4 *)(k2 + x) = make_uint4(v[0], v[1], v[2], v[3]);
  }
  *kmn = mn;
  *kmx = mx;
}

/* A block's view of its merge: the context, the plan, and its shared and
 * staging regions (set once per kernel by merge_block_init). */
typedef struct mblk {
  const dcpx_kctx *c;
  uint32_t nt; /* threads of the block: MT, or MT / 2 (two per SM) */
  merge_plan plan;
  dcpx_sel_smem *S;
  dcpx_blkwait *bw;
  poll_map *pm;
  uint32_t *bound, *off2, *kmin_s;
  char **peer;
  uint32_t *list, *list2, *s1k, *k1, *p1, *k2, *p2;
  dcpx_key_map km;
  unsigned long long *prof;
} mblk;

DCPX_D void merge_block_init(mblk *b, const dcpx_kctx *c,
                             const merge_plan *plan, uint4 *dyn, uint32_t nt) {
  b->c = c;
  b->nt = nt;
  b->plan = *plan;
  b->prof = c->prof;
  b->list = (uint32_t *)dyn;
  b->list2 = b->list + plan->list_words;
  b->s1k = b->list2 + plan->list_words;
  b->k1 = plan->in_smem
              ? b->s1k + plan->list_words
              : c->stage + (uint64_t)blockIdx.x * plan->stage_words;
  b->p1 = b->k1 + plan->k1_words;
  b->k2 = b->p1 + plan->p1_words;
  b->p2 = b->k2 + plan->k2_words;
  b->km.p1 = b->p1;
  b->km.p2 = b->p2;
  b->km.off2 = b->off2;
  b->km.s1 = b->list;
  b->km.bound1 = b->bound;
  b->km.W = c->world;
  b->km.N = c->local_topk;
  b->km.K = c->topk;
  b->km.pwn = c->L.rw_n - c->local_topk;
  b->km.pk2 = c->L.rw_k - c->topk;
  b->km.rcp_n = plan->rcp_n;
}

/* Phase timestamp i of row t (kctx.prof, diagnostics), by thread tx. */
DCPX_D void merge_prof_by(const mblk *b, uint32_t t, uint32_t i, uint32_t tx) {
  if (b->prof && threadIdx.x == tx)
    b->prof[(uint64_t)t * DCPX_K_PROF_POINTS + i] = clock64();
}

DCPX_D void merge_prof(const mblk *b, uint32_t t, uint32_t i) {
  merge_prof_by(b, t, i, 0);
}

/* Round 1 of row t over the staged W lists: S1 into list (r << 17 | l) and
 * s1k (its words), the per-rank bounds; returns the saturation mask, with
 * *ret_total the selected keys and *ret_t1 = T1 (0 when fewer than K). */
DCPX_D uint32_t merge_round1(mblk *b, uint32_t t, uint32_t *ret_total,
                             uint32_t *ret_t1) {
  const uint32_t W = b->c->world, N = b->c->local_topk, K = b->c->topk;
  const uint32_t lane = threadIdx.x & 31u;
  dcpx_sel_smem *S = b->S;
  uint32_t fbeg, fend, nz;
  dcpx_dev_warp_segment(b->plan.k1_words, &fbeg, &fend);
  const int all = dcpx_dev_flat_select(S, b->k1, b->plan.k1_words, K,
                                       *b->kmin_s, S->kmax, fbeg, fend, &nz);
  merge_prof(b, t, 10);
  b->km.round = 1;
  *ret_total = all ? nz : K;
  *ret_t1 = all ? 0u : S->T;
  const int fb = N >= 4u; /* flat_place finds the bounds */
  if (fb && threadIdx.x == 0) { /* the others: flat_place, before its barrier */
    b->bound[0] = 0;
    b->bound[W] = *ret_total;
  }
  const int half = b->c->diag & DCPX_K_DIAG_HALF_TAIL;
  if (half) /* each warp places the first half of its keys (a bench) */
    fend = fbeg + (((fend - fbeg) / 2u + 127u) & ~127u);
  dcpx_dev_flat_place(S, b->k1, b->plan.k1_words, &b->km, fbeg, fend, b->list,
                      b->s1k, fb ? b->bound : NULL);
  if (half) { /* bounds some warps did not record: made up */
    if (threadIdx.x <= W)
      b->bound[threadIdx.x] = (uint32_t)((uint64_t)threadIdx.x * *ret_total / W);
    __syncthreads();
  }
  merge_prof(b, t, 11);
  if (!fb)
    dcpx_dev_list_bounds(b->list, *ret_total, W, b->bound);
  const uint32_t rc = lane < W ? b->bound[lane + 1] - b->bound[lane] : 0u;
  return __ballot_sync(DCPX_FULL, lane < W && rc == N);
}

/* A saturated `me`'s rescue list of row t (its top-K entries >= T1) into
 * list2 (every thread); returns its entries. ecount: the entries of the
 * early list (a call with it). */
DCPX_D uint32_t merge_rescue_list(mblk *b, uint32_t t, uint32_t T1,
                                  const uint16_t *row, uint32_t len, int early,
                                  uint32_t ecount) {
  const dcpx_kctx *c = b->c;
  const uint32_t K = c->topk;
  if (c->klist && !early) {
    dcpx_dev_pdl_wait(); /* the push wrote klist[t] */
    return dcpx_dev_rescue_filter(b->S, c->klist + (uint64_t)t * c->L.rw_k,
                                  K, T1, b->list2);
  }
  if (early)
    /* list2 holds the local top-K list since the row's start
     * (merge_rescue_early): the rescue list itself for T1 = 0, its
     * entries >= T1 otherwise */
    return T1 ? dcpx_dev_rescue_filter(b->S, b->list2, K, T1, b->list2)
              : ecount;
  return dcpx_dev_rescue_list(
      b->S, row, len, K, T1, b->list2,
      b->prof ? b->prof + (uint64_t)t * DCPX_K_PROF_POINTS + 12 : NULL,
      !(c->diag & DCPX_K_DIAG_RESC_ORD));
}

/* That list (list2, cnt entries) stored as LL pairs tagged q2 into me's
 * slot of row t of every other rank, by threads tx = 0 .. n - 1 of the
 * block: the pairs that are sent (docs/PROTOCOL.md 5.4). When q2 is a
 * refresh (dcpx_rescue_refresh), every pair, and into me's own copy of
 * the slot too (which nothing else rewrites, and nobody reads in a
 * rescue that me holds). */
DCPX_D void merge_store_rescue(const mblk *b, uint32_t t, uint32_t mask,
                               uint32_t q2, uint32_t cnt, uint32_t tx,
                               uint32_t n) {
  const dcpx_kctx *c = b->c;
  const uint32_t W = c->world, me = c->rank, PK = c->L.rpairs;
  const uint32_t slot = __popc(mask & ((1u << me) - 1u));
  const uint64_t dst = c->L.off_rescue + dcpx_rescue_offset(&c->L, t, slot, 0);
  const int all =
      dcpx_rescue_refresh(q2) || (c->diag & DCPX_K_DIAG_FULL_RESCUE);
  if (c->diag & DCPX_K_DIAG_NO_RESCUE_STORES)
    return;
#pragma unroll 1
  for (uint32_t i = tx; i < PK; i += n) {
    if (!all && !dcpx_rescue_pair_sent(c->topk, cnt, i))
      continue;
    const uint2 w = ((const uint2 *)b->list2)[i];
#pragma unroll 1
    for (uint32_t d = 0; d < W; d++)
      if (d != me || all)
        dcpx_dev_ll_store(b->peer[d] + dst + (uint64_t)i * 16u, w.x, w.y, q2);
  }
}

/* A refresh (dcpx_rescue_refresh(q2), docs/PROTOCOL.md 5.4): the slots
 * of row t that no rank holds in this rescue (slot popcount(mask) and
 * up), every pair of them in this rank's own rescue region, zeros tagged
 * q2, so that every copy of every slot is rewritten once per 65,536
 * rescues of the row. Nobody reads or writes them in this rescue. By
 * threads tx = 0 .. n - 1. */
DCPX_D void merge_refresh_unused(const mblk *b, uint32_t t, uint32_t mask,
                                 uint32_t q2, uint32_t tx, uint32_t n) {
  const dcpx_kctx *c = b->c;
  const uint32_t PK = c->L.rpairs, x0 = __popc(mask);
  const uint32_t np = (c->L.rescue_slots - x0) * PK;
  char *own = c->ws + c->L.off_rescue + dcpx_rescue_offset(&c->L, t, x0, 0);
#pragma unroll 1
  for (uint32_t i = tx; i < np; i += n) /* the slots are contiguous */
    dcpx_dev_ll_store(own + (uint64_t)i * 16u, 0u, 0u, q2);
}

/* The early rescue list (kctx.resc_early): me's local top-K list of row
 * t, into list2 at the row's start, before the poll: with PDL the merge
 * starts while its push runs and would spend that time waiting for the
 * lists. When the row rescues it is the rescue list for T1 = 0 (always
 * when W*N < K), and holds the one for any T1 (its entries >= T1,
 * dcpx_dev_rescue_filter); else list2 is overwritten. Ends with a
 * barrier. */
DCPX_D uint32_t merge_rescue_early(mblk *b, uint32_t t,
                                   const uint16_t *logits, uint64_t stride,
                                   const int32_t *row_ends, uint32_t max_len) {
  const uint32_t len = dcpx_dev_row_len(row_ends[t], max_len);
  return dcpx_dev_rescue_list(b->S, logits + (uint64_t)t * stride, len,
                       b->c->topk, 0u, b->list2,
                       b->prof ? b->prof + (uint64_t)t * DCPX_K_PROF_POINTS + 12
                               : NULL,
                       1);
}

/* A saturated me's own rescue list, from list2 (shared) straight into its
 * round-2 segment and planes: nothing reads a rank's own rescue slot, so
 * it is neither stored nor polled (docs/PROTOCOL.md 5.4). Entries four at
 * a time (list2, k2 and every segment start are 16-byte aligned; at K =
 * 2048 one vector per thread); the segment's padding is round2_copy's. */
DCPX_D void merge_keep_own(const mblk *b, uint32_t mask, uint32_t tx,
                           uint32_t nt, uint32_t *kmn, uint32_t *kmx) {
  const dcpx_kctx *c = b->c;
  const uint32_t K = c->topk, me = c->rank, K4 = K & ~3u;
  const uint32_t *src = b->list2;
  uint32_t *ent = b->k2 + b->off2[me];
  uint32_t *pl = b->p2 + __popc(mask & ((1u << me) - 1u)) * b->km.pk2;
  uint32_t mn = *kmn, mx = *kmx;
#pragma unroll 1
  for (uint32_t j = 4u * tx; j < K4; j += 4u * nt) {
    const uint4 v = *(const uint4 *)(src + j);
    *(uint4 *)(ent + j) = v;
    const uint32_t k4[4] = {v.x >> 16, v.y >> 16, v.z >> 16, v.w >> 16};
#pragma unroll
    for (uint32_t u = 0; u < 4; u++)
      if (k4[u]) {
        mn = min(mn, k4[u]);
        mx = max(mx, k4[u]);
      }
  }
#pragma unroll 1
  for (uint32_t j = K4 + tx; j < K; j += nt) {
    const uint32_t w = src[j], k = w >> 16;
    ent[j] = w;
    if (k) {
      mn = min(mn, k);
      mx = max(mx, k);
    }
  }
#pragma unroll 1
  for (uint32_t j = tx; j < b->km.pk2; j += nt)
    pl[j] = src[K + j];
  *kmn = mn;
  *kmx = mx;
}

/* The record of a rescue poll that timed out (bw->fail 2), deferred to
 * after it (poll_flat): the pair of least flat index that a waiter gave
 * up on, its tag as it is now; then the alarm and FAILED. One thread. */
DCPX_D void rescue_give_up(const mblk *b, const dcpx_wctx *wc, uint32_t q2) {
  const dcpx_kctx *c = b->c;
  const char *base = c->ws + c->L.off_rescue;
  const uint32_t k = b->bw->rec_k;
  uint32_t index = 0, seen = 0;
  if (k != ~0u) {
    const uint32_t lp = poll_lp(c->L.rpairs, c->topk, 1);
    const uint32_t lx = k / lp, li = k - lx * lp;
    const char *p = b->pm->src[lx] + (uint64_t)li * 16u;
    uint64_t pa, pb;
    dcpx_dev_ll_load(p, &pa, &pb);
    const uint32_t ta = (uint32_t)(pa >> 32), tb = (uint32_t)(pb >> 32);
    index = (uint32_t)((p - base) / 8u) + (ta != q2 ? 0u : 1u);
    seen = ta != q2 ? ta : tb;
  }
  b->bw->defer = 0;
  dcpx_dev_give_up(wc, DCPX_REGION_RESCUE, index, q2, seen);
}

/* Rescue and round 2 of row t (mask != 0, q2 = next(seq2[t])): a
 * saturated me sends its rescue list (from its row of len elements);
 * every rank polls the other saturated ranks' lists into k2 beside the
 * others' S1 entries and selects again. 0 when a wait gave up, else 1
 * with the result in list2 and bound, *ret_total its keys. */
DCPX_D int merge_rescue(mblk *b, const dcpx_wctx *wc, uint32_t t,
                        uint32_t mask, uint32_t T1, uint32_t q2,
                        const uint16_t *row, uint32_t len, int early,
                        uint32_t ecount, uint32_t *ret_total) {
  const dcpx_kctx *c = b->c;
  const uint32_t W = c->world, K = c->topk, me = c->rank;
  const uint32_t PK = c->L.rpairs, tid = threadIdx.x;
  uint32_t *seq2 = (uint32_t *)(c->ws + c->L.off_seq2);
  const char *resc = c->ws + c->L.off_rescue;
  uint32_t kmn = 0xFFFFu, kmx = 0, fbeg, fend, nz;
  if (tid < 32) { /* warp 0: the segment offsets by one scan */
    const uint32_t sz =
        tid < W ? dcpx__pad4(((mask >> tid) & 1u) ? K
                                                  : b->bound[tid + 1] - b->bound[tid])
                : 0u;
    const uint32_t inc = dcpx_dev_warp_incl(sz);
    if (tid < W)
      b->off2[tid] = inc - sz;
    if (tid == W - 1)
      b->off2[W] = inc;
    if (tid == 0) {
      *b->kmin_s = 0xFFFFu;
      b->bw->rec_k = ~0u; /* the rescue poll's record is deferred */
      b->bw->defer = 1;
    }
  }
  /* The polled lists: the saturated ranks but me, y-th of them at slot
   * x. */
  const uint32_t others = mask & ~(1u << me);
  if (tid < W && ((others >> tid) & 1u)) {
    const uint32_t x = __popc(mask & ((1u << tid) - 1u));
    const uint32_t y = __popc(others & ((1u << tid) - 1u));
    b->pm->src[y] = resc + dcpx_rescue_offset(&c->L, t, x, 0);
    b->pm->pl[y] = b->p2 + x * b->km.pk2;
    b->pm->cs[y] = ~0u;
  }
  /* A saturated me: its rescue list (a barrier at its end), then the
   * first half of the block stores it to the peers while the second half
   * prepares round 2 (the histograms zeroed, its own list and the others'
   * S1 keys into k2): the stores are the peers' critical path, and the
   * copy need not wait for them (DCPX_K_DIAG_NO_OVERLAP: every thread
   * stores, then every thread copies). */
  const int sat = (mask >> me) & 1u;
  const int split = sat && !(c->diag & DCPX_K_DIAG_NO_OVERLAP);
  const uint32_t h = split ? b->nt / 2u : 0u; /* the copy's first thread */
  const uint32_t ns = split ? h : b->nt;      /* the storing threads */
  uint32_t cnt = 0;
  if (sat) {
    cnt = merge_rescue_list(b, t, T1, row, len, early, ecount);
    merge_prof(b, t, 3);
  }
  /* off2 and kmin_s (warp 0) and pm's slots: a rescue list's own barrier
   * covers them, but the early list for T1 = 0 (built at the row's start)
   * is taken as it is, with none */
  if (!sat || (early && !T1))
    __syncthreads();
  if (tid < W && ((others >> tid) & 1u))
    b->pm->ent[__popc(others & ((1u << tid) - 1u))] = b->k2 + b->off2[tid];
  if (sat && tid < ns)
    merge_store_rescue(b, t, mask, q2, cnt, tid, ns);
  if (dcpx_rescue_refresh(q2) && tid < ns)
    merge_refresh_unused(b, t, mask, q2, tid, ns);
  merge_prof(b, t, 4);
  if (tid >= h) {
    const uint32_t tx = tid - h, n = b->nt - h;
    merge_prof_by(b, t, 36, h);
    dcpx_dev_sel_zero_part(b->S, tx, n);
    if (sat)
      merge_keep_own(b, mask, tx, n, &kmn, &kmx);
    merge_prof_by(b, t, 37, h);
    round2_copy(b->s1k, b->bound, b->off2, b->k2, mask, W, K, tx, n, &kmn,
                &kmx);
    merge_prof_by(b, t, 38, h);
  }
  merge_prof_by(b, t, 39, b->nt - 32u); /* the last warp */
  __syncthreads();
  if (c->diag & DCPX_K_DIAG_SLEEP) { /* let the memory system drain */
    __nanosleep(3000);
    __syncthreads();
  }
  merge_prof(b, t, 5);
  merge_prof_by(b, t, 18, b->nt - 32);
  poll_flat(wc, b->pm, __popc(others), PK, K, q2, DCPX_REGION_RESCUE,
            c->ws + c->L.off_rescue, b->nt, 1, &kmn, &kmx);
  merge_prof(b, t, 16);
  dcpx_dev_range_publish(kmn, kmx, b->kmin_s, b->S);
  merge_prof(b, t, 17);
  merge_prof_by(b, t, 19, b->nt - 32);
  __syncthreads();
  if (c->diag & DCPX_K_DIAG_POLL_TWICE) { /* the same code again, at once */
    poll_flat(wc, b->pm, __popc(others), PK, K, q2, DCPX_REGION_RESCUE,
              c->ws + c->L.off_rescue, b->nt, 1, &kmn, &kmx);
    dcpx_dev_range_publish(kmn, kmx, b->kmin_s, b->S);
    __syncthreads();
  }
  merge_prof(b, t, 6);
  if (b->bw->fail) {
    if (tid == 0 && b->bw->fail == 2u)
      rescue_give_up(b, wc, q2);
    return 0;
  }
  const uint32_t n2 = b->off2[W];
  dcpx_dev_warp_segment(n2, &fbeg, &fend);
  const int all = dcpx_dev_flat_select(b->S, b->k2, n2, K, *b->kmin_s,
                                       b->S->kmax, fbeg, fend, &nz);
  b->km.round = 2;
  b->km.mask = mask;
  dcpx_dev_flat_place(b->S, b->k2, n2, &b->km, fbeg, fend, b->list2, NULL,
                      NULL);
  *ret_total = all ? nz : K;
  dcpx_dev_list_bounds(b->list2, *ret_total, W, b->bound);
  if (tid == 0)
    seq2[t] = q2;
  merge_prof(b, t, 7);
  return 1;
}

/* A row whose wait gave up: -1 outputs, sat_word as far as known, and
 * the call counted as failed. */
DCPX_D void merge_row_failed(const dcpx_kctx *c, const dcpx_wctx *wc, uint32_t t,
                             uint32_t K, uint32_t sw, int32_t *rows_out,
                             int32_t *valid_out, int32_t *ids_out,
                             uint32_t *sat_out) {
  dcpx_dev_pdl_wait(); /* the caller's outputs: as for a row that ends well */
#pragma unroll 1
  for (uint32_t p = threadIdx.x; p < K; p += blockDim.x) {
    rows_out[(uint64_t)t * K + p] = -1;
    if (ids_out)
      ids_out[(uint64_t)t * K + p] = -1;
  }
  if (threadIdx.x == 0) {
    if (c->ctr)
      dcpx_dev_count_failed(c->ctr, c->ctl, dcpx_dev_call_tag(wc));
    valid_out[t] = -1;
    if (sat_out)
      sat_out[t] = sw;
  }
}

/* The row's state after its outputs (thread 0). */
DCPX_D void merge_row_state(const dcpx_kctx *c, uint32_t t, uint32_t sw,
                            uint32_t mask, uint32_t *sat_out) {
  if (c->ctr)
    dcpx_dev_count_row(c->ctr, mask != 0);
  uint32_t *satw = (uint32_t *)(c->ws + c->L.off_sat);
  unsigned long long *stats =
      (unsigned long long *)(c->ws + c->L.off_stats);
  satw[t] = sw;
  if (sat_out)
    sat_out[t] = sw;
  atomicAdd(stats + 2u * t, 1ull);
  if (mask)
    atomicAdd(stats + 2u * t + 1, 1ull);
}

/* The rows u >= rows that the call does not hold take the call half `hi`
 * of its tags (dcpx_epoch_pass; docs/PROTOCOL.md 4.3): a 16-bit store
 * into each word's upper half, no load, by the last warp of every block
 * while the others poll its first row (lane, u spread over the grid). No
 * push of this call reads these words, so they need not wait for it, and
 * the next kernel waits for this grid before it reads any (PDL). Done at
 * the kernel's end, with a load, the same work cost a launch 0.2-0.3 us
 * (bench/RESULTS.md, session 30). */
DCPX_D void merge_pass_rows(const dcpx_kctx *c, uint32_t rows,
                            uint32_t *epoch, uint32_t hi, uint32_t lane) {
  if (c->diag & DCPX_K_DIAG_KEEP_EPOCH)
    return;
  const uint32_t step = gridDim.x * 32u;
#pragma unroll 1
  for (uint32_t u = rows + blockIdx.x * 32u + lane; u < c->L.rows; u += step)
    ((uint16_t *)(epoch + u))[1] = (uint16_t)hi;
}

/* The waits' view of row t (its record slot, the rank's words). */
DCPX_D dcpx_wctx merge_wctx(const dcpx_kctx *c, uint32_t t,
                            const uint32_t *hook_s, dcpx_blkwait *bw) {
  dcpx_wctx wc;
  wc.ctl = c->ctl;
  wc.health = c->health + c->rank;
  wc.rec = c->records + (uint64_t)c->rank * c->rows_max + t;
  wc.rank = c->rank;
  wc.t = t;
  wc.st = (dcpx_rank_state *)(c->ws + c->L.off_call);
  wc.storm = c->poll_storm;
  wc.hook_s = hook_s;
  wc.bw = bw;
  return wc;
}

/* EARLY: a call with the early rescue list (dcpx_k_early); the kernel
 * without it has none of its code. NT: MT threads, or MT / 2 with two
 * blocks per SM (calls of more rows than one wave of full blocks holds:
 * dcpx_k_merge_threads). */
template <int EARLY, int NT>
static __global__ void __launch_bounds__(NT, MT / NT)
    dcpx_merge_kernel(const __grid_constant__ dcpx_kctx c, uint32_t rows,
                      const uint16_t *logits, uint64_t stride,
                      const int32_t *row_ends, const int32_t *req_id,
                      const int32_t *block_table, uint32_t bt_rows,
                      uint32_t bt_cols, int32_t *rows_out,
                      int32_t *valid_out, int32_t *ids_out,
                      uint32_t *sat_out, merge_plan plan) {
  __shared__ dcpx_sel_smem S;
  __shared__ dcpx_blkwait bw;
  __shared__ poll_map pm;
  __shared__ uint32_t bound[DCPX_MAX_WORLD + 1];
  __shared__ uint32_t off2[DCPX_MAX_WORLD + 1];
  __shared__ uint32_t kmin_s;
  __shared__ char *peer[DCPX_MAX_WORLD];
  __shared__ __align__(16) unsigned long long snap[4]; /* counters, block 0 */
  __shared__ uint32_t hook_armed; /* fault_armed as read, block 0 */
  /* The row's seq2 word (in a 16-byte chunk), copied in by thread 0 at
   * the row's start with cp.async: a rescue does not wait for a dependent
   * global load after round 1 (row_ends[t], the caller's, is loaded into
   * a register after the poll's PDL wait, long before round 1 ends). */
  __shared__ __align__(16) uint32_t rowq[4];
  /* Bytes 16..31 of the rank state (stop is word 2), read once at the
   * kernel's start (cp.async, waited for with rowq's): a merge that
   * follows one that ended early fails every row, even where its slots
   * hold complete lists of an earlier call (docs/PROTOCOL.md 6.4). */
  __shared__ __align__(16) uint32_t st4[4];
  /* The request's first block-table entries (DCPX_K_BT_STAGE; half as
   * many in half-size blocks, two of which share an SM), copied
   * asynchronously once req is known: the outputs' lookups then wait
   * for shared memory, not for L1 or L2. */
  __shared__ int32_t bts[NT == MT ? DCPX_K_BT_STAGE : DCPX_K_BT_STAGE / 2u];
  extern __shared__ uint4 dyn[];

  const uint32_t tid = threadIdx.x;
  const uint32_t W = c.world, N = c.local_topk, K = c.topk, me = c.rank;
  const uint32_t P = c.L.pairs;
  if (c.prof && tid == 0 && blockIdx.x < rows) /* kernel entry */
    c.prof[(uint64_t)blockIdx.x * DCPX_K_PROF_POINTS + 14] = clock64();
  char *ws = c.ws;
  uint32_t *epoch = (uint32_t *)(ws + c.L.off_epoch);
  const uint32_t max_len =
      (uint64_t)c.max_local < stride ? c.max_local : (uint32_t)stride;
  mblk b;
  b.S = &S;
  b.bw = &bw;
  b.pm = &pm;
  b.bound = bound;
  b.off2 = off2;
  b.kmin_s = &kmin_s;
  b.peer = peer;
  merge_block_init(&b, &c, &plan, dyn, NT);

  dcpx_out_args oa;
  dcpx_dev_out_args_init(&oa, block_table, bt_rows, bt_cols, rows_out,
                         valid_out, ids_out, K, W, me, c.block_size,
                         c.interleave, plan.rcp_b, plan.rcp_i);
  if (tid < W)
    peer[tid] = c.peers[tid]; /* read after the row's first barrier */
  if (tid == 0)
    dcpx_dev_async16(st4, ws + c.L.off_call + 16u);
  int publish = c.ctr && blockIdx.x == 0 && tid == 0;
  if (publish)
    dcpx_dev_count_fetch(c.ctr, snap);
  /* PDL: this merge may have started while its push still runs (it was
   * launched when every push block had advanced the call sequence); it
   * waits for the push's completion before it reads the push's klist and
   * before it writes epoch[t]. The next kernel may launch now: it waits
   * itself before it reads anything this merge writes. */
  dcpx_dev_pdl_trigger();
  /* The fault hook (block 0, its first row, after the round-1 poll): its
   * armed word lives in host memory, so the block's last thread reads it
   * while the poll runs (the last warp polls nothing: poll_flat), and
   * thread 0 looks at it after the poll's barrier: no thread on the path
   * waits for the PCIe read. */
  const int hook_on = blockIdx.x == 0 && !(c.diag & DCPX_K_DIAG_NO_HOOK);
  int hook = hook_on && tid == 0;
  const uint32_t *hook_s = hook ? &hook_armed : NULL;

#pragma unroll 1
  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const uint32_t e = dcpx_dev_epoch_tag(epoch[t]);
    const dcpx_wctx wc = merge_wctx(&c, t, hook_s, &bw);
    uint32_t sw = 0, mask = 0, kmn = 0xFFFFu, kmx = 0, total = 0, T1 = 0;
    int ok = 0;

    if (tid == 0) {
      dcpx_dev_wait_begin(&bw);
      kmin_s = 0xFFFFu;
      dcpx_dev_async16(rowq, ws + c.L.off_seq2 + 4u * (t & ~3u));
    }
    if (tid < W) {
      pm.src[tid] = ws + c.L.off_ll + dcpx_ll_offset(&c.L, e & 1u, tid, t, 0);
      pm.ent[tid] = b.k1 + tid * N;
      pm.pl[tid] = b.p1 + tid * b.km.pwn;
    }
#pragma unroll 1
    for (uint32_t f = W * N + tid; f < plan.k1_words; f += NT)
      b.k1[f] = 0; /* the padding keys */
    uint32_t ecount = 0; /* the early list's entries */
    if (EARLY)
      ecount = merge_rescue_early(&b, t, logits, stride, row_ends, max_len);
    dcpx_dev_sel_zero(&S);
    __syncthreads();

    merge_prof(&b, t, 0);
    do {
      /* ---- 1. poll the W lists ---- */
      static_assert(NT >= 64, "the last warp polls nothing: poll_flat");
      poll_flat(&wc, &pm, W, P, N, e, DCPX_REGION_LL_SLOTS, ws + c.L.off_ll,
                NT - 32u, 0, &kmn, &kmx);
      /* The hook's host word is loaded first: the passes' stores go out
       * while it is in flight (it was on the path at W=2). */
      uint32_t armed = 0;
      if (hook_on && t == 0 && tid == NT - 1)
        armed = c.health[me].fault_armed;
      if (t == blockIdx.x && tid >= NT - 32u) /* the call half: every row's */
        merge_pass_rows(&c, rows, epoch, e >> 16, tid - (NT - 32u));
      if (hook_on && t == 0 && tid == NT - 1)
        hook_armed = armed;
      dcpx_dev_range_publish(kmn, kmx, &kmin_s, &S);
      if (tid == 0)
        dcpx_dev_async_wait(); /* rowq */
      __syncthreads();
      if (c.diag & DCPX_K_DIAG_POLL_TWICE) {
        poll_flat(&wc, &pm, W, P, N, e, DCPX_REGION_LL_SLOTS,
                  ws + c.L.off_ll, NT - 32u, 0, &kmn, &kmx);
        dcpx_dev_range_publish(kmn, kmx, &kmin_s, &S);
        __syncthreads();
      }
      /* A merge of this rank ended early (stop, as this kernel found it):
       * the row's epoch stayed behind, so its slots may hold an earlier
       * call's complete lists, which the poll took without waiting. */
      const uint32_t stopped = st4[2];
      if (hook && !stopped) {
        hook = 0;
        dcpx_dev_fault_hook(&wc, e);
      }
      merge_prof(&b, t, 1);
      if (bw.fail || stopped)
        break;
      /* The caller's memory (req_id, row_ends, the block table, the
       * outputs) is read and written only from here, once the grid before
       * this merge on the stream has completed (PDL): a kernel of the
       * engine's between the push and the merge that lets its dependents
       * launch early may still write the inputs or read the last call's
       * outputs (with the push before it, the wait is over by now: the
       * poll saw its lists). The early rescue list reads the row before:
       * the push's logits and row_ends, which the push itself read. */
      dcpx_dev_pdl_wait();
      const int32_t req = req_id[t];
      const int32_t row_end = row_ends[t]; /* for a rescue, after round 1 */
      /* The request's block-table row, read at the end: its first
       * DCPX_K_BT_STAGE entries into shared memory (bts), the rest into
       * L1, now. */
      uint32_t nbs = 0;
      if (req >= 0 && (uint32_t)req < bt_rows) {
        const int32_t *btr = block_table + (uint64_t)req * bt_cols;
        if (!(c.diag & DCPX_K_DIAG_NO_BT_STAGE))
          nbs = min(bt_cols, (uint32_t)(sizeof bts / sizeof bts[0]));
#pragma unroll 1
        for (uint32_t x = tid; x < nbs; x += NT)
          dcpx_dev_async4(bts + x, btr + x); /* cp.async.wait_all: no group */
#pragma unroll 1
        for (uint32_t x = nbs + tid * 32u; x < bt_cols; x += NT * 32u)
          asm volatile("prefetch.global.L1 [%0];" ::"l"(btr + x));
      }

      /* ---- 2. round 1; 3.-5. rescue and round 2 when a rank saturated ---- */
      mask = merge_round1(&b, t, &total, &T1);
      sw = (mask << 16) | T1;
      /* Long after its copies landed, long before the kernel ends. */
      if (publish) {
        publish = 0;
        dcpx_dev_count_publish(c.ctr, snap, c.health + me);
      }
      merge_prof(&b, t, 2);
      if (mask) {
        const uint32_t len = dcpx_dev_row_len(row_end, max_len);
        if (!merge_rescue(&b, &wc, t, mask, T1,
                          dcpx_dev_epoch_next(rowq[t & 3u]),
                          logits + (uint64_t)t * stride, len, EARLY,
                          ecount, &total))
          break;
      }

      /* ---- 6. outputs and the row's state ---- */
      dcpx_out_args oh = oa;
      if (c.diag & DCPX_K_DIAG_HALF_TAIL) /* half the outputs (a bench) */
        oh.K = K / 2u;
      if (nbs) { /* every thread's copies of bts, long landed */
        dcpx_dev_async_wait();
        __syncthreads();
        oh.bts = bts;
        oh.nbs = nbs;
      }
      dcpx_dev_outputs(&oh, t, req, mask ? b.list2 : b.list, bound[me],
                       min(bound[me + 1] - bound[me], oh.K), min(total, oh.K));
      merge_prof(&b, t, 8);
      if (tid == 0)
        merge_row_state(&c, t, sw, mask, sat_out);
      ok = 1;
    } while (0);

    if (!ok)
      merge_row_failed(&c, &wc, t, K, sw, rows_out, valid_out, ids_out,
                       sat_out);
    if (publish) { /* the row failed before round 1 ended */
      publish = 0;
      dcpx_dev_count_publish(c.ctr, snap, c.health + me);
    }
    dcpx_dev_async_wait(); /* bts of a row that failed after its copy */
    /* Every thread is done with row t, and the own push grid has completed
     * (PDL wait): the next call's epoch. */
    __syncthreads();
    if (ok && tid == 0) {
      dcpx_dev_pdl_wait();
      if (!(c.diag & DCPX_K_DIAG_KEEP_EPOCH))
        epoch[t] = e;
    }
    merge_prof(&b, t, 9);
  }
  if (c.prof && tid == 0 && blockIdx.x < rows) /* kernel exit */
    c.prof[(uint64_t)blockIdx.x * DCPX_K_PROF_POINTS + 15] = clock64();
}

/* ---- host side ------------------------------------------------------------ */

typedef void (*merge_fn)(const dcpx_kctx, uint32_t, const uint16_t *,
                         uint64_t, const int32_t *, const int32_t *,
                         const int32_t *, uint32_t, uint32_t, int32_t *,
                         int32_t *, int32_t *, uint32_t *, merge_plan);

/* The half-size instances (merge_half.cu). */
merge_fn dcpx_k__merge_half(int early);

#ifdef DCPX_MERGE_HALF
merge_fn dcpx_k__merge_half(int early) {
  return early ? dcpx_merge_kernel<1, MT / 2> : dcpx_merge_kernel<0, MT / 2>;
}
#else

/* A merge of 0 rows (docs/PROTOCOL.md 4.3): a call all the same, so every
 * row takes the call's call half, that of tag(epoch[0]), as the rows a
 * merge does not hold do (merge_pass_rows). A rank that calls with 0 rows
 * while its peers call with rows then pushes its next call under another
 * call half than theirs, and their waits give up on it (6.2 rule 4),
 * instead of its next call taking their lists of this one. One block,
 * launched without PDL: it starts once the kernels before it on the
 * stream have completed (the last merge wrote these words). */
static __global__ void dcpx_merge_pass_kernel(const __grid_constant__
                                              dcpx_kctx c) {
  uint32_t *epoch = (uint32_t *)(c.ws + c.L.off_epoch);
  const uint32_t hi = dcpx_dev_epoch_tag(epoch[0]) >> 16;
  __syncthreads(); /* every thread has read epoch[0] */
  if (c.diag & DCPX_K_DIAG_KEEP_EPOCH)
    return;
#pragma unroll 1
  for (uint32_t t = threadIdx.x; t < c.L.rows; t += blockDim.x)
    ((uint16_t *)(epoch + t))[1] = (uint16_t)hi;
}

size_t dcpx_k_merge_smem(const dcpx_kctx *c) {
  const merge_plan p = plan_of(c);
  return 4u * (3u * (size_t)p.list_words +
               (p.in_smem ? p.stage_words : 0u));
}

size_t dcpx_k_merge_stage_bytes(const dcpx_kctx *c) {
  const merge_plan p = plan_of(c);
  return p.in_smem ? 0 : 4u * (size_t)p.stage_words * c->rows_max;
}

/* The four instances: early rescue list or not, full blocks here, half
 * blocks from merge_half.cu. */
static merge_fn merge_kernel_of(int early, uint32_t nt) {
  if (nt == MT)
    return early ? dcpx_merge_kernel<1, MT> : dcpx_merge_kernel<0, MT>;
  return dcpx_k__merge_half(early);
}

int dcpx_k_merge_prepare(void) {
  /* The largest plan: list, list2 and s1k 4224 words each, the
   * staging budget. */
  const int max_dyn = 4 * 3 * 4224 + (int)DCPX_STAGE_SMEM_BYTES;
  for (int i = 0; i < 4; i++)
    if (cudaFuncSetAttribute(merge_kernel_of(i & 1, i & 2 ? MT / 2 : MT),
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             max_dyn) != cudaSuccess)
      return DCPX_E_CUDA;
  return 0;
}

/* Blocks of nt threads of this context that fit on one multiprocessor. */
static int merge_occupancy(const dcpx_kctx *c, uint32_t nt, int *ret) {
  int n = 0;
  if (dcpx_k_ctx_check(c) < 0 || !ret)
    return DCPX_E_INVAL;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &n, merge_kernel_of(0, nt), (int)nt, dcpx_k_merge_smem(c)) !=
      cudaSuccess)
    return DCPX_E_CUDA;
  *ret = n;
  return 0;
}

/* Whether the shape allows half-size blocks: dcpx_dev_rescue_filter
 * takes at most 8 entries per thread. */
static int merge_half_shape(const dcpx_kctx *c) {
  return c->topk <= 8u * (MT / 2);
}

int dcpx_k_merge_split_ok(const dcpx_kctx *c, int *ret_ok) {
  int n = 0, r;
  if (!ret_ok)
    return DCPX_E_INVAL;
  *ret_ok = 0;
  if ((r = merge_occupancy(c, MT / 2, &n)) < 0)
    return r;
  *ret_ok = merge_half_shape(c) && n >= 2;
  return 0;
}

uint32_t dcpx_k_merge_threads(const dcpx_kctx *c, uint32_t rows) {
  if (c->merge_threads == MT ||
      (c->merge_threads == MT / 2 && merge_half_shape(c)))
    return c->merge_threads;
  /* not with a capped grid (ranks sharing a GPU): its blocks walk rows */
  return c->merge_split_rows && rows > c->merge_split_rows && !c->max_blocks
             ? MT / 2
             : MT;
}

int dcpx_k_merge_occupancy(const dcpx_kctx *c, int *ret_blocks_per_sm) {
  return merge_occupancy(c, MT, ret_blocks_per_sm);
}

int dcpx_k_merge_res(const dcpx_kctx *c, uint32_t nt, dcpx_k_res *ret) {
  struct cudaFuncAttributes a;
  int n = 0, r;
  if (!ret || (nt != MT && nt != MT / 2u))
    return DCPX_E_INVAL;
  if ((r = merge_occupancy(c, nt, &n)) < 0)
    return r;
  if (cudaFuncGetAttributes(&a, merge_kernel_of(0, nt)) != cudaSuccess)
    return DCPX_E_CUDA;
  dcpx_k_res_of(&a, dcpx_k_merge_smem(c), nt, n, ret);
  return 0;
}

int dcpx_k_merge(const dcpx_kctx *c, uint32_t rows, const uint16_t *logits,
                 uint64_t stride, const int32_t *row_ends,
                 const int32_t *req_id, const int32_t *block_table,
                 uint32_t bt_rows, uint32_t bt_cols, int32_t *rows_out,
                 int32_t *valid_out, int32_t *ids_out, uint32_t *sat_out,
                 cudaStream_t s) {
  int r = dcpx_k_ctx_check(c);
  if (r < 0)
    return r;
  if (rows > c->rows_max)
    return DCPX_E_INVAL;
  if (rows == 0) { /* no row to read or write: NULL pointers are fine */
    const cudaLaunchConfig_t cfg = dcpx_launch_cfg(1, 256, 0, s);
    return cudaLaunchKernelEx(&cfg, dcpx_merge_pass_kernel, *c) == cudaSuccess
               ? 0
               : DCPX_E_CUDA;
  }
  if ((r = dcpx_k_merge_args(logits, stride, row_ends, req_id, block_table,
                              bt_rows, bt_cols, rows_out, valid_out, ids_out,
                              sat_out)) < 0)
    return r;
  const merge_plan p = plan_of(c);
  if (!p.in_smem && !c->stage)
    return DCPX_E_INVAL;
  uint32_t grid = rows;
  if (c->max_blocks && c->max_blocks < grid)
    grid = c->max_blocks;
  cudaLaunchAttribute pdl;
  const uint32_t nt = dcpx_k_merge_threads(c, rows);
  const cudaLaunchConfig_t cfg =
      c->pdl ? dcpx_launch_cfg_pdl(grid, nt, dcpx_k_merge_smem(c), s, &pdl)
             : dcpx_launch_cfg(grid, nt, dcpx_k_merge_smem(c), s);
  /* The launch's own status: an earlier, unrelated error of the caller's
   * thread stays where it was (cudaGetLastError would take it). */
  if (cudaLaunchKernelEx(&cfg,
                         merge_kernel_of(dcpx_k_early(c->resc_early, rows), nt),
                         *c, rows, logits, stride,
                         row_ends, req_id, block_table, bt_rows, bt_cols,
                         rows_out, valid_out, ids_out, sat_out, p) !=
      cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}
#endif /* DCPX_MERGE_HALF */
