/* dcpx_device.cuh - device primitives of the dcpx kernels (push.cu,
 * merge.cu): the order, the LL stores and loads, the bounded waits, and the
 * block-wide exact top-k selection. Included only by the .cu files of kernels/.
 *
 * The selection (mirrors common/merge.c, which is the oracle):
 *
 *   Keys are 16-bit ord16 values (0 = empty) visited in a fixed order (flat
 *   (r, l) order in the merge, ascending l in a local list). The top `need`
 *   keys are described by a threshold T and a tie count `take`: a key is
 *   selected iff ord > T, or ord == T != 0 and it is among the first `take`
 *   keys equal to T. With fewer than `need` non-empty keys, T = take = 0
 *   and every non-empty key is selected. T is found with two histograms,
 *   4096 buckets over ord >> 4 and 16 over ord & 15 (any split finds the
 *   same T; this one spreads real logits over many buckets).
 *
 *   Work is split into one contiguous segment of the order per warp, so
 *   the placement pass needs no block barrier: each warp knows, from the
 *   per-warp counts of the histogram passes, how many keys > T and == T lie
 *   before its segment, and walks its segment in order with warp scans.
 *   A selected key's output position is then
 *       (keys > T before it) + min(keys == T before it, take),
 *   which is also its position in the flat order of the selection, so the
 *   outputs come out in (r, l) order with no sort.
 *
 * Pass protocol (every thread of the block calls each step):
 *   dcpx_dev_sel_zero            zero the histograms      (then barrier)
 *   pass A over all keys         dcpx_dev_hist_add*(S->hist, ord >> 4)
 *                                per-warp non-empty count -> S->wnz[warp]
 *   dcpx_dev_sel_after_a         -> all (1: fewer than need non-empty)
 *   pass B (if !all)             keys in bucket S->hb: dcpx_dev_hist_add*
 *                                (S->h16 + 16*warp, ord & 15); per-warp count
 *                                of keys in buckets above hb -> S->wgtb[warp]
 *   dcpx_dev_sel_finish          -> S->T, S->take, per-warp bases
 *                                S->wgt[w], S->weq[w] (index nwarps: totals)
 *   pass C                       placement, warp by warp
 *
 * Memory ordering (DESIGN.md sections 4-6):
 *   - LL pairs are one 16-byte store of two 8-byte (word, tag) halves,
 *     written as st.volatile.v2.u64, so each half is a single-copy-atomic
 *     64-bit element; readers load the same 16 bytes as ld.volatile.v2.u64
 *     and accept each half whose tag is the epoch.
 *   - Data a peer wrote (LL words, rescue lists) is re-read with volatile
 *     loads, which bypass the non-coherent L1.
 *   - Rescue: plain stores of the list, block barrier, then per destination
 *     a system fence and st.release.sys of the flag; the reader polls with
 *     ld.acquire.sys, then a block barrier, then volatile loads.
 *   - Waits never trap: see dcpx_dev_wait_* below.
 */
#ifndef DCPX_DEVICE_CUH
#define DCPX_DEVICE_CUH

#include <stdint.h>

#include "dcpx_kernels.h"
#include "layout.h"

#define DCPX_D static __device__ __forceinline__
#define DCPX_FULL 0xFFFFFFFFu

#define DCPX_HI_BINS 4096u /* buckets of ord >> 4 */
#define DCPX_MAX_WARPS 32u

/* ---- the order and the wire --------------------------------------------- */

/* ord16 of a bf16, or 0 for NaN (never a candidate). */
DCPX_D uint32_t dcpx_dev_key(uint32_t b) {
  b &= 0xFFFFu;
  if ((b & 0x7FFFu) > 0x7F80u)
    return 0;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}

DCPX_D uint32_t dcpx_dev_epoch_next(uint32_t e) {
  return e == 0xFFFFFFFEu ? 1u : e + 1u;
}

DCPX_D uint32_t dcpx_dev_row_words(uint32_t c) {
  return (c + (c + 31u) / 32u + 3u) & ~3u;
}

DCPX_D int32_t dcpx_dev_gid(uint32_t l, uint32_t r, uint32_t W, uint32_t I) {
  return (int32_t)((l / I) * I * W + r * I + l % I);
}

/* ---- memory operations --------------------------------------------------- */

DCPX_D uint64_t dcpx_dev_now(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* One LL store: words w0, w1 tagged with e, as (w0, e, w1, e). */
DCPX_D void dcpx_dev_ll_store(void *p, uint32_t w0, uint32_t w1, uint32_t e) {
  uint64_t a = ((uint64_t)e << 32) | w0, b = ((uint64_t)e << 32) | w1;
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a),
               "l"(b)
               : "memory");
}

/* The two tagged halves of an LL pair. */
DCPX_D void dcpx_dev_ll_load(const void *p, uint64_t *a, uint64_t *b) {
  uint64_t x, y;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(x), "=l"(y)
               : "l"(p)
               : "memory");
  *a = x;
  *b = y;
}

DCPX_D uint32_t dcpx_dev_ld_volatile(const void *p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

DCPX_D uint32_t dcpx_dev_ld_acquire_sys(const void *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];"
               : "=r"(v)
               : "l"(p)
               : "memory");
  return v;
}

DCPX_D void dcpx_dev_st_release_sys(void *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v)
               : "memory");
}

/* ---- scans ---------------------------------------------------------------- */

DCPX_D uint32_t dcpx_dev_warp_incl(uint32_t v) {
  const uint32_t lane = threadIdx.x & 31u;
#pragma unroll
  for (uint32_t d = 1; d < 32; d <<= 1) {
    uint32_t y = __shfl_up_sync(DCPX_FULL, v, d);
    if (lane >= d)
      v += y;
  }
  return v;
}

/* Exclusive block scan of v in thread order; *ret_total = sum over the
 * block. scratch: DCPX_MAX_WARPS words of shared memory. Contains two
 * barriers; every thread must call it. */
DCPX_D uint32_t dcpx_dev_block_excl(uint32_t v, uint32_t *scratch,
                                    uint32_t *ret_total) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t nw = blockDim.x >> 5;
  uint32_t incl = dcpx_dev_warp_incl(v), base = 0, total = 0;
  __syncthreads(); /* scratch may still be read by a previous scan */
  if (lane == 31)
    scratch[warp] = incl;
  __syncthreads();
  for (uint32_t w = 0; w < nw; w++) {
    uint32_t x = scratch[w];
    base += w < warp ? x : 0;
    total += x;
  }
  *ret_total = total;
  return base + incl - v;
}

/* ---- selection ------------------------------------------------------------ */

typedef struct dcpx_sel_smem {
  uint32_t hist[DCPX_HI_BINS];        /* pass A: keys per ord >> 4 */
  uint32_t h16[DCPX_MAX_WARPS * 16];  /* pass B: per warp, keys of bucket hb */
  uint32_t scan[DCPX_MAX_WARPS];
  uint32_t wnz[DCPX_MAX_WARPS];       /* per warp: non-empty keys */
  uint32_t wgtb[DCPX_MAX_WARPS];      /* per warp: keys above bucket hb */
  uint32_t wgt[DCPX_MAX_WARPS + 1];   /* per warp: keys > T before it */
  uint32_t weq[DCPX_MAX_WARPS + 1];   /* per warp: keys == T before it */
  uint32_t hb, above, T, take;
} dcpx_sel_smem;

DCPX_D void dcpx_dev_sel_zero(dcpx_sel_smem *S) {
  for (uint32_t i = threadIdx.x; i < DCPX_HI_BINS; i += blockDim.x)
    S->hist[i] = 0;
  for (uint32_t i = threadIdx.x; i < DCPX_MAX_WARPS * 16; i += blockDim.x)
    S->h16[i] = 0;
}

/* Adds up to 8 keys of this lane to histogram h: key e counts when bit e of
 * vmask is set, in bin[e]. Called by all 32 lanes. A warp whose counted keys
 * all share one bin adds once (all-equal rows would otherwise serialise on
 * one shared-memory address); otherwise each lane adds its runs. */
DCPX_D void dcpx_dev_hist_add8(uint32_t *h, const uint32_t bin[8],
                               uint32_t vmask) {
  const uint32_t lane = threadIdx.x & 31u;
  uint32_t first = 0xFFFFFFFFu, same = 1;
#pragma unroll
  for (uint32_t e = 0; e < 8; e++) {
    if ((vmask >> e) & 1u) {
      if (first == 0xFFFFFFFFu)
        first = bin[e];
      else
        same &= bin[e] == first;
    }
  }
  const uint32_t any = __ballot_sync(DCPX_FULL, vmask != 0);
  if (!any)
    return;
  const uint32_t leader = __ffs(any) - 1;
  const uint32_t ref = __shfl_sync(DCPX_FULL, first, leader);
  if (__all_sync(DCPX_FULL, vmask == 0 || (same && first == ref))) {
    uint32_t tot = __reduce_add_sync(DCPX_FULL, (uint32_t)__popc(vmask));
    if (lane == leader)
      atomicAdd(h + ref, tot);
    return;
  }
  uint32_t cb = 0xFFFFFFFFu, cc = 0;
#pragma unroll
  for (uint32_t e = 0; e < 8; e++) {
    if ((vmask >> e) & 1u) {
      if (bin[e] == cb) {
        cc++;
      } else {
        if (cc)
          atomicAdd(h + cb, cc);
        cb = bin[e];
        cc = 1;
      }
    }
  }
  if (cc)
    atomicAdd(h + cb, cc);
}

/* One key per lane: lanes with equal bins add once (match.any). */
DCPX_D void dcpx_dev_hist_add1(uint32_t *h, uint32_t bin, int valid) {
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t act = __ballot_sync(DCPX_FULL, valid);
  if (valid) {
    uint32_t m = __match_any_sync(act, bin);
    if (lane == (uint32_t)(__ffs(m) - 1))
      atomicAdd(h + bin, (uint32_t)__popc(m));
  }
}

/* After pass A: 1 if fewer than `need` keys are non-empty (select all),
 * else finds the bucket hb holding the need-th best key (S->hb, and
 * S->above = keys in higher buckets). *ret_nz: non-empty keys. */
DCPX_D int dcpx_dev_sel_after_a(dcpx_sel_smem *S, uint32_t need,
                                uint32_t *ret_nz) {
  const uint32_t nw = blockDim.x >> 5;
  uint32_t nz = 0, total;
  __syncthreads();
  for (uint32_t w = 0; w < nw; w++)
    nz += S->wnz[w];
  *ret_nz = nz;
  if (nz < need)
    return 1;
  /* Thread i owns buckets [top - per, top), thread 0 the highest. */
  const uint32_t per = DCPX_HI_BINS / blockDim.x;
  const uint32_t top = DCPX_HI_BINS - threadIdx.x * per;
  uint32_t sum = 0;
  for (uint32_t b = top - per; b < top; b++)
    sum += S->hist[b];
  uint32_t above = dcpx_dev_block_excl(sum, S->scan, &total);
  if (above < need && above + sum >= need) {
    for (uint32_t b = top; b-- > top - per;) {
      if (above + S->hist[b] >= need) {
        S->hb = b;
        S->above = above;
        break;
      }
      above += S->hist[b];
    }
  }
  __syncthreads();
  return 0;
}

/* After pass B: the threshold T and tie count take, and each warp's counts
 * of keys > T and == T before its segment (S->wgt/weq[w]; [nw]: totals). */
DCPX_D void dcpx_dev_sel_finish(dcpx_sel_smem *S, uint32_t need, int all) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t nw = blockDim.x >> 5;
  __syncthreads();
  if (warp == 0) {
    uint32_t lo = 0, T = 0, take = 0, gt = 0, eq = 0;
    if (!all) {
      const uint32_t need2 = need - S->above;
      uint32_t h = 0;
      if (lane < 16)
        for (uint32_t w = 0; w < nw; w++)
          h += S->h16[w * 16 + lane];
      /* suffix sums from the top bucket down */
      uint32_t suf = h;
#pragma unroll
      for (uint32_t d = 1; d < 32; d <<= 1) {
        uint32_t y = __shfl_down_sync(DCPX_FULL, suf, d);
        if (lane + d < 32)
          suf += y;
      }
      const uint32_t sex = suf - h;
      const uint32_t hit =
          __ballot_sync(DCPX_FULL, lane < 16 && sex < need2 && suf >= need2);
      lo = __ffs(hit) - 1;
      take = __shfl_sync(DCPX_FULL, need2 - sex, lo);
      T = (S->hb << 4) | lo;
    }
    if (lane < nw) {
      if (all) {
        gt = S->wnz[lane];
      } else {
        gt = S->wgtb[lane];
        for (uint32_t x = lo + 1; x < 16; x++)
          gt += S->h16[lane * 16 + x];
        eq = S->h16[lane * 16 + lo];
      }
    }
    const uint32_t ig = dcpx_dev_warp_incl(gt), iq = dcpx_dev_warp_incl(eq);
    if (lane < nw) {
      S->wgt[lane] = ig - gt;
      S->weq[lane] = iq - eq;
    }
    if (lane == 31) {
      S->wgt[nw] = ig;
      S->weq[nw] = iq;
      S->T = T;
      S->take = take;
    }
  }
  __syncthreads();
}

/* Output position bookkeeping of one key in pass C. *gb / *qb: keys > T
 * and == T before it (in order); returns 1 and *pos if it is selected. */
DCPX_D int dcpx_dev_sel_place(uint32_t o, uint32_t T, uint32_t take,
                              uint32_t *gb, uint32_t *qb, uint32_t *pos) {
  if (o > T) {
    *pos = *gb + min(*qb, take);
    (*gb)++;
    return 1;
  }
  if (o == T && T != 0) {
    int sel = *qb < take;
    *pos = *gb + *qb;
    (*qb)++;
    return sel;
  }
  return 0;
}

/* ---- the local list (DESIGN.md section 3) -------------------------------- */

/* 8 ord16 keys of group g: elements v = 8g .. 8g+7 of the 16-byte-aligned
 * view base[] of a row that starts at element a; l = v - a; out-of-row and
 * NaN elements give 0. */
DCPX_D void dcpx_dev_group_load(const uint16_t *base, uint32_t a, uint32_t len,
                                uint32_t g, uint32_t o[8]) {
  const uint32_t v0 = g * 8u;
  if (v0 >= a && v0 + 8u <= a + len) {
    uint4 r = __ldg((const uint4 *)base + g);
    o[0] = dcpx_dev_key(r.x);
    o[1] = dcpx_dev_key(r.x >> 16);
    o[2] = dcpx_dev_key(r.y);
    o[3] = dcpx_dev_key(r.y >> 16);
    o[4] = dcpx_dev_key(r.z);
    o[5] = dcpx_dev_key(r.z >> 16);
    o[6] = dcpx_dev_key(r.w);
    o[7] = dcpx_dev_key(r.w >> 16);
    return;
  }
#pragma unroll
  for (uint32_t e = 0; e < 8; e++) {
    uint32_t v = v0 + e;
    o[e] = (v >= a && v < a + len) ? dcpx_dev_key(base[v]) : 0u;
  }
}

DCPX_D uint4 dcpx_dev_pack8(const uint32_t o[8]) {
  return make_uint4(o[0] | (o[1] << 16), o[2] | (o[3] << 16),
                    o[4] | (o[5] << 16), o[6] | (o[7] << 16));
}

DCPX_D void dcpx_dev_unpack8(uint4 r, uint32_t o[8]) {
  o[0] = r.x & 0xFFFFu;
  o[1] = r.x >> 16;
  o[2] = r.y & 0xFFFFu;
  o[3] = r.y >> 16;
  o[4] = r.z & 0xFFFFu;
  o[5] = r.z >> 16;
  o[6] = r.w & 0xFFFFu;
  o[7] = r.w >> 16;
}

/* Group g's keys from the shared-memory cache (g < ncache) or the row. */
DCPX_D void dcpx_dev_group_get(const uint16_t *base, uint32_t a, uint32_t len,
                               const uint4 *cache, uint32_t ncache, uint32_t g,
                               uint32_t o[8]) {
  if (g < ncache)
    dcpx_dev_unpack8(cache[g], o);
  else
    dcpx_dev_group_load(base, a, len, g, o);
}

/* The local top-`cap` list of row[0..len) into words[0..row_words(cap))
 * (shared memory): the cap best non-NaN elements in ascending l, then
 * zeros, then the bit-16 plane. cache: up to cache_groups groups of 8 keys
 * kept in shared memory between the passes (may be 0). Every thread must
 * call it; it ends with a barrier. */
DCPX_D void dcpx_dev_local_list(dcpx_sel_smem *S, const uint16_t *row,
                                uint32_t len, uint32_t cap, uint32_t *words,
                                uint4 *cache, uint32_t cache_groups) {
  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t nw = blockDim.x >> 5;
  const uint32_t a = len ? (uint32_t)(((uintptr_t)row & 15u) >> 1) : 0u;
  const uint16_t *base = row - a;
  const uint32_t G = len ? (len + a + 7u) >> 3 : 0u;
  const uint32_t ncache = min(G, cache_groups);
  const uint32_t gpw = (G + nw - 1) / nw;
  const uint32_t gbeg = min(G, warp * gpw), gend = min(G, gbeg + gpw);
  const uint32_t rw = dcpx_dev_row_words(cap);
  uint32_t o[8], bin[8], nz = 0, total;

  for (uint32_t i = tid; i < rw; i += blockDim.x)
    words[i] = 0;
  dcpx_dev_sel_zero(S);
  __syncthreads();

  /* Pass A: read the row once (4 groups in flight per lane), cache it,
   * histogram ord >> 4. */
  for (uint32_t g0 = gbeg; g0 < gend; g0 += 128) {
    uint4 raw[4];
#pragma unroll
    for (uint32_t u = 0; u < 4; u++) {
      uint32_t g = g0 + 32u * u + lane;
      if (g < gend && g * 8u >= a && g * 8u + 8u <= a + len)
        raw[u] = __ldg((const uint4 *)base + g);
    }
#pragma unroll
    for (uint32_t u = 0; u < 4; u++) {
      uint32_t g = g0 + 32u * u + lane, vmask = 0;
      if (g < gend) {
        if (g * 8u >= a && g * 8u + 8u <= a + len) {
          o[0] = dcpx_dev_key(raw[u].x);
          o[1] = dcpx_dev_key(raw[u].x >> 16);
          o[2] = dcpx_dev_key(raw[u].y);
          o[3] = dcpx_dev_key(raw[u].y >> 16);
          o[4] = dcpx_dev_key(raw[u].z);
          o[5] = dcpx_dev_key(raw[u].z >> 16);
          o[6] = dcpx_dev_key(raw[u].w);
          o[7] = dcpx_dev_key(raw[u].w >> 16);
        } else {
          dcpx_dev_group_load(base, a, len, g, o);
        }
        if (g < ncache)
          cache[g] = dcpx_dev_pack8(o);
#pragma unroll
        for (uint32_t e = 0; e < 8; e++) {
          bin[e] = o[e] >> 4;
          vmask |= (o[e] != 0) << e;
        }
      }
      dcpx_dev_hist_add8(S->hist, bin, vmask);
      nz += __popc(vmask);
    }
  }
  nz = __reduce_add_sync(DCPX_FULL, nz);
  if (lane == 0)
    S->wnz[warp] = nz;
  const int all = dcpx_dev_sel_after_a(S, cap, &total);

  /* Pass B: the low 4 bits inside bucket hb. */
  if (!all) {
    const uint32_t hb = S->hb;
    uint32_t gtb = 0;
    for (uint32_t g0 = gbeg; g0 < gend; g0 += 32) {
      uint32_t g = g0 + lane, vmask = 0;
      if (g < gend) {
        dcpx_dev_group_get(base, a, len, cache, ncache, g, o);
#pragma unroll
        for (uint32_t e = 0; e < 8; e++) {
          bin[e] = o[e] & 15u;
          vmask |= (o[e] != 0 && (o[e] >> 4) == hb) << e;
          gtb += (o[e] >> 4) > hb;
        }
      }
      dcpx_dev_hist_add8(S->h16 + 16u * warp, bin, vmask);
    }
    gtb = __reduce_add_sync(DCPX_FULL, gtb);
    if (lane == 0)
      S->wgtb[warp] = gtb;
  }
  dcpx_dev_sel_finish(S, cap, all);

  /* Pass C: place the selected elements, in ascending l, warp by warp. */
  const uint32_t T = S->T, take = S->take;
  uint32_t rg = S->wgt[warp], rq = S->weq[warp];
  const uint32_t quota = (S->wgt[warp + 1] - rg) +
                         (min(S->weq[warp + 1], take) - min(rq, take));
  uint32_t placed = 0;
  for (uint32_t g0 = gbeg; g0 < gend && placed < quota; g0 += 32) {
    uint32_t g = g0 + lane, cg = 0, ce = 0;
    if (g < gend) {
      dcpx_dev_group_get(base, a, len, cache, ncache, g, o);
    } else {
#pragma unroll
      for (uint32_t e = 0; e < 8; e++)
        o[e] = 0;
    }
#pragma unroll
    for (uint32_t e = 0; e < 8; e++) {
      cg += o[e] > T;
      ce += o[e] == T && T != 0;
    }
    const uint32_t packed = (cg << 16) | ce;
    const uint32_t incl = dcpx_dev_warp_incl(packed);
    const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
    const uint32_t ex = incl - packed;
    uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu), pos;
#pragma unroll
    for (uint32_t e = 0; e < 8; e++) {
      if (dcpx_dev_sel_place(o[e], T, take, &gb, &qb, &pos)) {
        uint32_t l = g * 8u + e - a;
        words[pos] = (o[e] << 16) | (l & 0xFFFFu);
        if (l >> 16)
          atomicOr(words + cap + (pos >> 5), 1u << (pos & 31u));
      }
    }
    const uint32_t nrq = rq + (tot & 0xFFFFu);
    placed += (tot >> 16) + (min(nrq, take) - min(rq, take));
    rg += tot >> 16;
    rq = nrq;
  }
  __syncthreads();
}

/* ---- bounded waits (DESIGN.md section 6) --------------------------------- */

/* What a waiting block needs to give up properly. */
typedef struct dcpx_wctx {
  dcpx_ctl_header *ctl;
  dcpx_rank_health *health; /* own rank's block */
  dcpx_wait_record *rec;    /* own record slot of this row */
  uint64_t call_tag;
  uint32_t rank, t;
  volatile uint32_t *fail; /* shared: 0, or the block gave up this row */
} dcpx_wctx;

/* Gives up after a timeout: the first thread of the block to do so writes
 * the record (if its slot is empty: fields, fence, kind), then the alarm,
 * then, once that drained, FAILED. */
DCPX_D void dcpx_dev_timeout(const dcpx_wctx *w, uint32_t region,
                             uint32_t index, uint32_t expected,
                             uint32_t seen) {
  if (atomicCAS((uint32_t *)w->fail, 0u, 2u) != 0u)
    return;
  dcpx_wait_record *r = w->rec;
  if (r->kind == DCPX_REC_EMPTY) {
    r->region = region;
    r->index = index;
    r->expected = expected;
    r->seen = seen;
    r->block = w->t;
    r->time_ns = dcpx_dev_now();
    r->call_tag = w->call_tag;
    r->generation = w->ctl->generation;
    r->rank = w->rank;
    __threadfence_system();
    r->kind = DCPX_REC_TIMEOUT;
  }
  __threadfence_system();
  w->health->alarm = 1;
  __threadfence_system();
  w->health->failed = 1;
  __threadfence_system();
}

/* The slow path shared by both waits: 1 to keep waiting, 0 to give up.
 * The control page (host memory, a PCIe round trip) is read at most every
 * 2 us; the block's shared give-up word every poll. */
DCPX_D int dcpx_dev_wait_step(const dcpx_wctx *w, uint64_t start,
                              uint64_t *limit, uint64_t *checked,
                              uint32_t region, uint32_t index,
                              uint32_t expected, uint32_t seen) {
  if (*w->fail)
    return 0;
  uint64_t now = dcpx_dev_now();
  if (now - *checked < 2000)
    return 1;
  *checked = now;
  if (*limit == 0) {
    *limit = w->ctl->timeout_ns;
    if (*limit == 0)
      *limit = DCPX_K_DEFAULT_TIMEOUT_NS;
  }
  if (w->health->failed || w->ctl->abort) {
    atomicCAS((uint32_t *)w->fail, 0u, 1u);
    return 0;
  }
  if (now - start > *limit) {
    dcpx_dev_timeout(w, region, index, expected, seen);
    return 0;
  }
  return 1;
}

/* Waits until both halves of the LL pair at p carry tag e. index: the
 * 8-byte half index of p within ll_slots. 1 when satisfied (*a, *b hold the
 * halves), 0 when the block gave up. */
DCPX_D int dcpx_dev_wait_ll(const dcpx_wctx *w, const void *p, uint32_t e,
                            uint32_t index, uint64_t *a, uint64_t *b) {
  const uint64_t start = dcpx_dev_now();
  uint64_t limit = 0, checked = start;
  for (;;) {
    dcpx_dev_ll_load(p, a, b);
    const uint32_t ta = (uint32_t)(*a >> 32), tb = (uint32_t)(*b >> 32);
    if (ta == e && tb == e)
      return 1;
    if (!dcpx_dev_wait_step(w, start, &limit, &checked, DCPX_REGION_LL_SLOTS,
                            ta != e ? index : index + 1, e,
                            ta != e ? ta : tb))
      return 0;
  }
}

/* Waits until the flag at p (acquire) holds q. index: s * R + t. */
DCPX_D int dcpx_dev_wait_flag(const dcpx_wctx *w, const void *p, uint32_t q,
                              uint32_t index) {
  const uint64_t start = dcpx_dev_now();
  uint64_t limit = 0, checked = start;
  for (;;) {
    const uint32_t v = dcpx_dev_ld_acquire_sys(p);
    if (v == q)
      return 1;
    if (!dcpx_dev_wait_step(w, start, &limit, &checked,
                            DCPX_REGION_RESCUE_FLAGS, index, q, v))
      return 0;
    __nanosleep(32);
  }
}

/* The fault hook (tests; armed by dcpxd): stalls fault_ticks ns once, in
 * the call whose epoch (0 = any) and call tag (~0 = any) match. Called by
 * one thread of block 0 before its first wait. */
DCPX_D void dcpx_dev_fault_hook(dcpx_rank_health *h, uint32_t e,
                                uint64_t call_tag) {
  if (!h->fault_armed || h->fault_fired)
    return;
  const uint32_t fe = h->fault_epoch;
  const uint64_t fc = h->fault_call;
  if ((fe != 0 && fe != e) || (fc != ~0ull && fc != call_tag))
    return;
  h->fault_fired = 1;
  __threadfence_system();
  const uint64_t ticks = h->fault_ticks, start = dcpx_dev_now();
  while (dcpx_dev_now() - start < ticks)
    __nanosleep(1000);
}

#endif /* DCPX_DEVICE_CUH */
