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
 *   and every non-empty key is selected. (T and take are a property of the
 *   keys, not of the algorithm, so any histogram split finds the same.)
 *   T is found by one of:
 *     - two-level: 4096 buckets over ord >> 4, then 16 over ord & 15 inside
 *       the bucket that holds the need-th key (any keys);
 *     - single-level: 4096 buckets over ord - kmin when every key lies in
 *       [kmin, kmin + 4096) (the usual case for candidates and merged
 *       lists, which are all near the top): the scan gives T directly and
 *       the second pass only counts.
 *
 *   Work is split into one contiguous segment of the order per warp, so
 *   the placement pass needs no block barrier: each warp knows, from the
 *   per-warp counts of the second pass, how many keys > T and == T lie
 *   before its segment, and walks its segment in order with warp scans.
 *   A selected key's output position is then
 *       (keys > T before it) + min(keys == T before it, take),
 *   which is also its position in the flat order of the selection, so the
 *   outputs come out in (r, l) order with no sort.
 *
 * Two-level pass protocol (every thread of the block calls each step):
 *   dcpx_dev_sel_zero            zero the histograms      (then barrier)
 *   pass A over all keys         dcpx_dev_hist_add*(S->hist, key)
 *   dcpx_dev_sel_after_a         -> all (1: fewer than need non-empty), nz
 *   pass B over all keys         lim = all ? 0 : S->hb << 4;
 *                                dcpx_dev_passb*(S->h16 + 16*warp, key, lim)
 *                                summed per warp -> S->wgtb[warp]
 *   dcpx_dev_sel_finish          -> S->T, S->take, per-warp bases
 *                                S->wgt[w], S->weq[w] (index nwarps: totals)
 *   pass C                       placement, warp by warp
 * Single-level: pass A adds hist[key - kmin]; dcpx_dev_sel1_pick -> T,
 * take; the counting pass writes S->wgtb (> T) and S->weqc (== T);
 * dcpx_dev_sel1_bases -> S->wgt, S->weq; pass C as above.
 *
 * The local list (push, rescue): a sampled fast path (dcpx_dev_local_fast)
 * reads the row once and runs the selection on ~2N candidates only, and an
 * exact path (three passes over the row) takes over whenever the sample
 * was not good enough. Both give the same words.
 *
 * Memory ordering (docs/PROTOCOL.md sections 4-6):
 *   - LL pairs are one 16-byte store of two 8-byte (word, tag) halves,
 *     written as st.volatile.v2.u64, so each half is a single-copy-atomic
 *     64-bit element; readers load the same 16 bytes as ld.volatile.v2.u64
 *     and accept each half whose tag is the epoch (round 1) or the row's
 *     round-2 epoch q2 (the rescue lists). No fence, no flag anywhere.
 *   - A reader copies every accepted word once into its staging area and
 *     never reads a peer-written slot again (merge.cu).
 *   - Waits never trap, and read the host control page only through the
 *     rank's device mirror: see dcpx_dev_wait_* below.
 */
#ifndef DCPX_DEVICE_CUH
#define DCPX_DEVICE_CUH

#include <stdint.h>
#include <string.h>

#include <dcpx/device.cuh>

#include "dcpx_kernels.h"
#include "layout.h"

/* The push and the merge read the stop word as word 2 of the rank state's
 * bytes 16..31 (one 16-byte cp.async). */
static_assert(offsetof(dcpx_rank_state, stop) == 24,
              "dcpx_rank_state: stop at byte 24");

#define DCPX_D static __device__ __forceinline__
/* Slow paths (waits that must spin, faults, timeouts): kept out of line so
 * that the hot code stays small (instruction fetch is the merge's largest
 * stall: Nsight Compute, bench/RESULTS.md). */
#define DCPX_COLD static __device__ __noinline__
#define DCPX_FULL 0xFFFFFFFFu

#define DCPX_HI_BINS 4096u /* buckets of ord >> 4 */
#define DCPX_K_CAND 8192u  /* fast-path candidate buffer entries (48 KiB) */
#define DCPX_MAX_WARPS 32u

/* ---- launches (host side) ------------------------------------------------ */

/* The configuration of a plain launch. Every kernel of dcpx is launched
 * with cudaLaunchKernelEx and judged by its return value alone: an
 * earlier, unrelated error of the caller's thread (cudaGetLastError's
 * state) is neither taken as ours nor cleared. */
static inline __host__ cudaLaunchConfig_t dcpx_launch_cfg(uint32_t grid,
                                                          uint32_t block,
                                                          size_t smem,
                                                          cudaStream_t s) {
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  return cfg;
}

/* The same with programmatic dependent launch allowed (attr: storage the
 * caller keeps until the launch): the kernel may start while the previous
 * kernel of the stream still runs, and must call dcpx_dev_pdl_wait()
 * before it reads anything that kernel, or any earlier one, wrote. */
static inline __host__ cudaLaunchConfig_t
dcpx_launch_cfg_pdl(uint32_t grid, uint32_t block, size_t smem,
                    cudaStream_t s, cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t cfg = dcpx_launch_cfg(grid, block, smem, s);
  memset(attr, 0, sizeof(*attr));
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/* A kernel instance's resources (dcpx_k_push_res, dcpx_k_merge_res) from
 * its attributes, blocks of nt threads per SM and dynamic smem. */
static inline __host__ void dcpx_k_res_of(const struct cudaFuncAttributes *a,
                                          size_t dyn, uint32_t nt,
                                          int blocks_per_sm,
                                          dcpx_k_res *ret) {
  ret->regs = a->numRegs;
  ret->local_bytes = (int)a->localSizeBytes;
  ret->static_smem = (int)a->sharedSizeBytes;
  ret->dyn_smem = dyn;
  ret->threads = nt;
  ret->blocks_per_sm = blocks_per_sm;
}

/* ---- the order and the wire --------------------------------------------- */

/* ord16 (0 for NaN), the epoch step, the LL store and PDL: the public
 * device header's (include/dcpx/device.cuh), which engine kernels use. */
DCPX_D uint32_t dcpx_dev_key(uint32_t b) { return dcpx_device_ord16(b); }

DCPX_D uint32_t dcpx_dev_epoch_next(uint32_t e) {
  return dcpx_device_epoch_next(e);
}

DCPX_D uint32_t dcpx_dev_epoch_tag(uint32_t w) {
  return dcpx_device_epoch_tag(w);
}

DCPX_D uint32_t dcpx_dev_row_words(uint32_t c) { return DCPX_ROW_WORDS(c); }

/* x / d for x < 2^22 with rcp = 1.0f / d: the float quotient is off by at
 * most one, and one correction step fixes it (a runtime integer division
 * costs ~30 dependent instructions). */
DCPX_D uint32_t dcpx_dev_div(uint32_t x, uint32_t d, float rcp) {
  uint32_t q = __float2uint_rz(__uint2float_rz(x) * rcp);
  const int32_t r = (int32_t)(x - q * d);
  if (r < 0)
    q--;
  else if ((uint32_t)r >= d) /* unsigned: d may be 2^31 or more */
    q++;
  return q;
}

/* ---- memory operations --------------------------------------------------- */

DCPX_D uint64_t dcpx_dev_now(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* 16 bytes from global (through L2) into shared memory, asynchronously:
 * no register receives them, so nothing waits for the load until the
 * issuing thread calls dcpx_dev_async_wait (then a barrier, for the
 * block). Both addresses 16-byte aligned. */
DCPX_D void dcpx_dev_async16(void *smem, const void *gmem) {
  const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa),
               "l"(gmem)
               : "memory");
}

/* The same for 4 bytes (both addresses 4-byte aligned). */
DCPX_D void dcpx_dev_async4(void *smem, const void *gmem) {
  const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa),
               "l"(gmem)
               : "memory");
}

DCPX_D void dcpx_dev_async_wait(void) {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

/* Diagnostic timestamp i (kctx.prof, benches only): thread 0's clock64
 * into pf[i] when pf is set. */
DCPX_D void dcpx_dev_stamp(unsigned long long *pf, uint32_t i) {
  if (pf && threadIdx.x == 0)
    pf[i] = clock64();
}

/* One LL store: words w0, w1 tagged with e, as (w0, e, w1, e). */
DCPX_D void dcpx_dev_ll_store(void *p, uint32_t w0, uint32_t w1, uint32_t e) {
  dcpx_device_ll_store(p, w0, w1, e);
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

/* Programmatic dependent launch (sm_90): wait until every earlier kernel
 * of the stream has completed and its memory is visible (a no-op when the
 * kernel was launched without PDL); let the next kernel of the stream
 * launch (it waits itself before it reads what this one writes). */
DCPX_D void dcpx_dev_pdl_wait(void) { dcpx_device_pdl_wait(); }

DCPX_D void dcpx_dev_pdl_trigger(void) { dcpx_device_pdl_trigger(); }

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
 * block. scratch: DCPX_MAX_WARPS words of shared memory. For a caller
 * that has passed a barrier since any earlier scan's last read of
 * scratch (every use in these kernels: the histogram a scan runs over
 * is complete only after one): one barrier; every thread must call it.
 * The warp totals are scanned with shuffles (one shared load per lane),
 * not a loop of dependent loads. */
DCPX_D uint32_t dcpx_dev_block_excl(uint32_t v, uint32_t *scratch,
                                    uint32_t *ret_total) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t nw = blockDim.x >> 5;
  const uint32_t incl = dcpx_dev_warp_incl(v);
  if (lane == 31)
    scratch[warp] = incl;
  __syncthreads();
  const uint32_t x = lane < nw ? scratch[lane] : 0u;
  const uint32_t xi = dcpx_dev_warp_incl(x);
  *ret_total = __shfl_sync(DCPX_FULL, xi, 31);
  return __shfl_sync(DCPX_FULL, xi - x, warp) + incl - v;
}

/* ---- selection ------------------------------------------------------------ */

typedef struct dcpx_sel_smem {
  __align__(16) uint32_t hist[DCPX_HI_BINS]; /* pass A: keys per ord >> 4 */
  uint32_t h16[DCPX_MAX_WARPS * 16];  /* pass B: per warp, keys of bucket hb */
  uint32_t scan[DCPX_MAX_WARPS];
  uint32_t wgtb[DCPX_MAX_WARPS];      /* per warp: keys above bucket hb */
  uint32_t wgt[DCPX_MAX_WARPS + 1];   /* per warp: keys > T before it */
  uint32_t weq[DCPX_MAX_WARPS + 1];   /* per warp: keys == T before it */
  uint32_t wcnt[DCPX_MAX_WARPS];      /* per warp: candidates (fast path) */
  uint32_t weqc[DCPX_MAX_WARPS];      /* per warp: keys == T (single level) */
  uint32_t hb, above, T, take, kmax;
  uint32_t kmin; /* dcpx_dev_resc_top's key range */
} dcpx_sel_smem;

/* By threads tx = 0 .. n - 1 of the block (a part of it). */
DCPX_D void dcpx_dev_sel_zero_part(dcpx_sel_smem *S, uint32_t tx, uint32_t n) {
  const uint4 z = make_uint4(0, 0, 0, 0);
  if (tx == 0)
    S->kmax = 0;
#pragma unroll 1
  for (uint32_t i = tx; i < DCPX_HI_BINS / 4u; i += n)
    ((uint4 *)S->hist)[i] = z;
#pragma unroll 1
  for (uint32_t i = tx; i < DCPX_MAX_WARPS * 4u; i += n)
    ((uint4 *)S->h16)[i] = z;
}

DCPX_D void dcpx_dev_sel_zero(dcpx_sel_smem *S) {
  dcpx_dev_sel_zero_part(S, threadIdx.x, blockDim.x);
}

/* Pass A, one key. */
DCPX_D void dcpx_dev_hist_add(uint32_t *hist, uint32_t key) {
  if (key)
    atomicAdd(hist + (key >> 4), 1u);
}

/* Pass A, 8 keys packed two per word. A lane whose eight keys are equal
 * (all-equal rows) adds once. */
DCPX_D void dcpx_dev_hist_add8(uint32_t *hist, uint4 k) {
  if (k.x == k.y && k.x == k.z && k.x == k.w && (k.x >> 16) == (k.x & 0xFFFFu)) {
    if (k.x)
      atomicAdd(hist + ((k.x & 0xFFFFu) >> 4), 8u);
    return;
  }
  dcpx_dev_hist_add(hist, k.x & 0xFFFFu);
  dcpx_dev_hist_add(hist, k.x >> 16);
  dcpx_dev_hist_add(hist, k.y & 0xFFFFu);
  dcpx_dev_hist_add(hist, k.y >> 16);
  dcpx_dev_hist_add(hist, k.z & 0xFFFFu);
  dcpx_dev_hist_add(hist, k.z >> 16);
  dcpx_dev_hist_add(hist, k.w & 0xFFFFu);
  dcpx_dev_hist_add(hist, k.w >> 16);
}

/* Pass B, one key: lim = hb << 4. Returns 1 if the key lies above bucket
 * hb; a key inside it goes to this warp's 16 bins h16w. (In the
 * select-all case hb = 0: every non-empty key lies above it.) */
DCPX_D uint32_t dcpx_dev_passb(uint32_t *h16w, uint32_t key, uint32_t lim) {
  if (key - lim < 16u)
    atomicAdd(h16w + (key & 15u), 1u);
  return key >= lim + 16u;
}

DCPX_D uint32_t dcpx_dev_passb8(uint32_t *h16w, uint4 k, uint32_t lim) {
  return dcpx_dev_passb(h16w, k.x & 0xFFFFu, lim) +
         dcpx_dev_passb(h16w, k.x >> 16, lim) +
         dcpx_dev_passb(h16w, k.y & 0xFFFFu, lim) +
         dcpx_dev_passb(h16w, k.y >> 16, lim) +
         dcpx_dev_passb(h16w, k.z & 0xFFFFu, lim) +
         dcpx_dev_passb(h16w, k.z >> 16, lim) +
         dcpx_dev_passb(h16w, k.w & 0xFFFFu, lim) +
         dcpx_dev_passb(h16w, k.w >> 16, lim);
}

/* The bucket of S->hist (higher buckets hold better keys) that holds the
 * need-th best key: S->hb = that bucket, S->above = the keys in higher
 * buckets, S->T = kbase + hb and S->take = need - above (the single-level
 * selection's threshold and ties, kbase its key offset); returns the
 * keys in all buckets (nothing is written when that is below need). With
 * `zero` the buckets are zeroed as they are read. Warp w reads the
 * buckets [w * 32 * per, (w + 1) * 32 * per), per = DCPX_HI_BINS /
 * blockDim.x (4 or 8; 16 where DCPX_HF_PER_MAX allows), lane j the
 * buckets 32 i + j of them: no bank conflicts (a thread owning per
 * consecutive buckets made every access per-way conflicted); the warp
 * whose range holds the bucket finds it with warp reductions. Two barriers; every thread calls it, after the
 * histogram is complete (a barrier). */
#ifndef DCPX_HF_PER_MAX
#define DCPX_HF_PER_MAX 8 /* blocks of >= 512 threads; 16 allows 256 */
#endif
DCPX_D uint32_t dcpx_dev_hist_find(dcpx_sel_smem *S, uint32_t need,
                                   uint32_t kbase, int zero) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t nw = blockDim.x >> 5, per = DCPX_HI_BINS / blockDim.x;
  uint32_t *hw = S->hist + warp * 32u * per + lane;
  uint32_t h[DCPX_HF_PER_MAX], sum = 0;
#pragma unroll
  for (uint32_t i = 0; i < DCPX_HF_PER_MAX; i++) {
    h[i] = i < per ? hw[32u * i] : 0u;
    sum += h[i];
  }
  if (zero)
#pragma unroll
    for (uint32_t i = 0; i < DCPX_HF_PER_MAX; i++)
      if (i < per)
        hw[32u * i] = 0;
  sum = __reduce_add_sync(DCPX_FULL, sum);
  if (lane == 0)
    S->scan[warp] = sum;
  __syncthreads();
  const uint32_t x = lane < nw ? S->scan[lane] : 0u;
  const uint32_t total = __reduce_add_sync(DCPX_FULL, x);
  uint32_t above = __reduce_add_sync(DCPX_FULL, lane > warp ? x : 0u);
  if (total >= need && above < need && above + sum >= need) { /* one warp */
#pragma unroll
    for (int i = DCPX_HF_PER_MAX - 1; i >= 0; i--) {
      if ((uint32_t)i >= per)
        continue;
      const uint32_t rt = __reduce_add_sync(DCPX_FULL, h[i]);
      if (above + rt >= need) {
        uint32_t suf = h[i]; /* this lane's bucket and the higher lanes' */
#pragma unroll
        for (uint32_t d = 1; d < 32; d <<= 1) {
          const uint32_t y = __shfl_down_sync(DCPX_FULL, suf, d);
          if (lane + d < 32)
            suf += y;
        }
        const uint32_t ex = suf - h[i];
        if (above + ex < need && above + suf >= need) { /* one lane */
          const uint32_t b = warp * 32u * per + 32u * (uint32_t)i + lane;
          S->hb = b;
          S->above = above + ex;
          S->T = kbase + b;
          S->take = need - above - ex;
        }
        break;
      }
      above += rt;
    }
  }
  __syncthreads();
  return total;
}

/* After pass A: returns 1 if fewer than `need` keys are non-empty (select
 * all; pass B then runs with hb = 0), else 0 with S->hb the bucket holding
 * the need-th best key and S->above the keys in higher buckets.
 * *ret_nz: non-empty keys. Every thread must call it. */
DCPX_D int dcpx_dev_sel_after_a(dcpx_sel_smem *S, uint32_t need,
                                uint32_t *ret_nz) {
  __syncthreads();
  *ret_nz = dcpx_dev_hist_find(S, need, 0u, 0);
  return *ret_nz < need;
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
#pragma unroll 1
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
      gt = S->wgtb[lane];
      if (!all) {
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

/* Single-level selection, for keys known to lie in [kmin, kmin + 4096):
 * pass A histograms key - kmin, so the scan finds T itself; pass B only
 * counts, per warp, the keys > T and == T (no atomics).
 *
 * After pass A: returns 1 if fewer than `need` keys are non-empty (select
 * all: T = take = 0), else 0 with S->T, S->take. Every thread calls it. */
DCPX_D int dcpx_dev_sel1_pick(dcpx_sel_smem *S, uint32_t need, uint32_t kmin,
                              uint32_t *ret_nz) {
  __syncthreads();
  *ret_nz = dcpx_dev_hist_find(S, need, kmin, 0);
  return *ret_nz < need;
}

/* After the counting pass (per-warp keys > T in S->wgtb, == T in S->weqc):
 * each warp's bases S->wgt/weq, computed by the warp itself from the
 * counts before it (one barrier, no serial step of warp 0); a warp may
 * read its own entry right after, another's (and the totals at index
 * nwarps) only after a barrier. */
DCPX_D void dcpx_dev_sel1_bases(dcpx_sel_smem *S) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t nw = blockDim.x >> 5;
  __syncthreads();
  const uint32_t gt = lane < nw ? S->wgtb[lane] : 0u;
  const uint32_t eq = lane < nw ? S->weqc[lane] : 0u;
  const uint32_t bg = __reduce_add_sync(DCPX_FULL, lane < warp ? gt : 0u);
  const uint32_t bq = __reduce_add_sync(DCPX_FULL, lane < warp ? eq : 0u);
  if (lane == 0) {
    S->wgt[warp] = bg;
    S->weq[warp] = bq;
  }
  if (warp == nw - 1u && lane == nw - 1u) {
    S->wgt[nw] = bg + gt;
    S->weq[nw] = bq + eq;
  }
  __syncwarp();
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

/* Pass C counts of one key: (key > T) << 16 | (key == T, T != 0). teq is T,
 * or a value no key has when T == 0. */
DCPX_D uint32_t dcpx_dev_passc(uint32_t key, uint32_t T, uint32_t teq) {
  return ((uint32_t)(key > T) << 16) | (uint32_t)(key == teq);
}

DCPX_D uint32_t dcpx_dev_u4word(uint4 k, uint32_t i) {
  return i == 0 ? k.x : i == 1 ? k.y : i == 2 ? k.z : k.w;
}

/* ---- selection over a flat key array (merge rounds, the push's N list) -- */

/* Keys f .. f+3 of keys[] (f a multiple of 4, keys 16-byte aligned); keys
 * at or past n read as empty. */
DCPX_D uint4 dcpx_dev_key4(const uint32_t *keys, uint32_t f, uint32_t n) {
  uint4 k = *(const uint4 *)(keys + f);
  if (f + 4u > n) {
    k.x = f < n ? k.x : 0u;
    k.y = f + 1 < n ? k.y : 0u;
    k.z = f + 2 < n ? k.z : 0u;
    k.w = 0u;
  }
  return k;
}

/* Exact top-K threshold of the flat keys[0..n) (words: ord16 << 16 | low
 * bits; 0 = empty; words past n are read as empty), whose non-empty keys
 * lie in [kmin, kmax]:
 * S->T, S->take and the per-warp bases S->wgt/weq of the segments
 * [fbeg, fend) (kpw keys per warp, a multiple of 128). Returns 1 when
 * fewer than K keys are non-empty (all selected; T = take = 0), *ret_nz the
 * non-empty keys. Every thread calls it; the histograms must be zero. */
DCPX_D int dcpx_dev_flat_select(dcpx_sel_smem *S, const uint32_t *keys,
                                uint32_t n, uint32_t K, uint32_t kmin,
                                uint32_t kmax, uint32_t fbeg, uint32_t fend,
                                uint32_t *ret_nz) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  int all;
  if (kmax < kmin)
    kmin = 0; /* no key at all */
  if (kmax - kmin < DCPX_HI_BINS) {
#pragma unroll 1
    for (uint32_t f = fbeg + 4u * lane; f < fend; f += 128) {
      const uint4 k = dcpx_dev_key4(keys, f, n);
#pragma unroll
      for (uint32_t e = 0; e < 4; e++) {
        const uint32_t o = dcpx_dev_u4word(k, e) >> 16;
        if (o)
          atomicAdd(S->hist + (o - kmin), 1u);
      }
    }
    all = dcpx_dev_sel1_pick(S, K, kmin, ret_nz);
    const uint32_t T = all ? 0u : S->T;
    const uint32_t teq = all ? 0xFFFFFFFFu : T;
    uint32_t gt = 0, eq = 0;
#pragma unroll 1
    for (uint32_t f = fbeg + 4u * lane; f < fend; f += 128) {
      const uint4 k = dcpx_dev_key4(keys, f, n);
#pragma unroll
      for (uint32_t e = 0; e < 4; e++) {
        const uint32_t o = dcpx_dev_u4word(k, e) >> 16;
        gt += o > T;
        eq += o == teq;
      }
    }
    gt = __reduce_add_sync(DCPX_FULL, gt);
    eq = __reduce_add_sync(DCPX_FULL, eq);
    if (lane == 0) {
      S->wgtb[warp] = gt;
      S->weqc[warp] = eq;
    }
    if (all && threadIdx.x == 0)
      S->T = S->take = 0;
    dcpx_dev_sel1_bases(S);
    return all;
  }
#pragma unroll 1
  for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
    const uint32_t f = f0 + 4u * lane;
    const uint4 k = f < fend ? dcpx_dev_key4(keys, f, n) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (uint32_t e = 0; e < 4; e++) {
      const uint32_t o = dcpx_dev_u4word(k, e) >> 16;
      if (o)
        atomicAdd(S->hist + (o >> 4), 1u);
    }
  }
  all = dcpx_dev_sel_after_a(S, K, ret_nz);
  const uint32_t lim = all ? 0u : S->hb << 4;
  uint32_t *h16w = S->h16 + 16u * warp, gtb = 0;
#pragma unroll 1
  for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
    const uint32_t f = f0 + 4u * lane;
    const uint4 k = f < fend ? dcpx_dev_key4(keys, f, n) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (uint32_t e = 0; e < 4; e++) {
      const uint32_t o = dcpx_dev_u4word(k, e) >> 16;
      gtb += dcpx_dev_passb(h16w, o, lim);
    }
  }
  gtb = __reduce_add_sync(DCPX_FULL, gtb);
  if (lane == 0)
    S->wgtb[warp] = gtb;
  dcpx_dev_sel_finish(S, K, all);
  return all;
}

/* How a flat key index maps back to (rank, l). Round 1: key f is entry
 * f % N of rank f / N, planes p1. Round 2: rank s's segment starts at
 * off2[s]; a saturated rank's segment is its rescue list (planes: its
 * rescue slot's in p2), any other rank's its S1 keys in order, whose
 * entries are s1[bound1[s] + j] (round 1's list and bounds). Round 0 (a
 * list's sub-list): key f is entry f of a list of capacity K whose planes
 * start at p1. */
typedef struct dcpx_key_map {
  const uint32_t *p1, *p2, *off2, *s1, *bound1;
  uint32_t round, W, N, K, pwn, pk2, mask;
  float rcp_n;
} dcpx_key_map;

/* Round 2: the rank whose segment holds key f. Segments start at
 * multiples of 4 (each is padded to 4 keys), so the 4 keys of a group
 * f .. f+3 (f a multiple of 4) share it: pass C looks it up once per
 * group. */
DCPX_D uint32_t dcpx_dev_seg2(const dcpx_key_map *m, uint32_t f) {
  uint32_t s = 0;
  for (uint32_t step = 8; step; step >>= 1)
    if (s + step < m->W && m->off2[s + step] <= f)
      s += step;
  return s;
}

/* (s << 17) | l of key f whose word is w; in round 2 s is the rank whose
 * segment holds f (dcpx_dev_seg2); in round 1 it is s when the caller
 * knows it (s < W), else found here. */
DCPX_D uint32_t dcpx_dev_entry_of(const dcpx_key_map *m, uint32_t s,
                                  uint32_t f, uint32_t w) {
  uint32_t j;
  const uint32_t *pl;
  if (m->round == 1) {
    if (s >= m->W)
      s = dcpx_dev_div(f, m->N, m->rcp_n);
    j = f - s * m->N;
    pl = m->p1 + s * m->pwn;
  } else {
    j = f - m->off2[s];
    if (!((m->mask >> s) & 1u))
      return m->s1[m->bound1[s] + j];
    pl = m->p2 + __popc(m->mask & ((1u << s) - 1u)) * m->pk2;
  }
  return (s << 17) | (((pl[j >> 5] >> (j & 31u)) & 1u) << 16) | (w & 0xFFFFu);
}

/* Round 0: key f (word w) of the capacity-K list at m->p1 becomes entry
 * pos of the capacity-N list `list`. */
DCPX_D void dcpx_dev_place_word(const dcpx_key_map *m, uint32_t *list,
                                uint32_t pos, uint32_t f, uint32_t w) {
  list[pos] = w;
  if ((m->p1[m->K + (f >> 5)] >> (f & 31u)) & 1u)
    atomicOr(list + m->N + (pos >> 5), 1u << (pos & 31u));
}

/* Pass C: the selected keys of this warp's segment, in order, into
 * list[pos]: as (s << 17 | l) in the merge's rounds (m->round 1, 2), as a
 * capacity-m->N list's words with their bit-16 plane (m->round 0: the top
 * N of a capacity-K list m->p1). words (or NULL): each selected key's
 * word at its position (round 1: round 2's copy takes a rank's S1 keys
 * from there).
 * bound (or NULL; round 1 with N >= 4 only): bound[s] for 0 < s < W, the
 * first position of rank s's entries (the caller writes bound[0] = 0 and
 * bound[W] = the keys selected). Ends with a barrier. */
DCPX_D void dcpx_dev_flat_place(const dcpx_sel_smem *S, const uint32_t *keys,
                                uint32_t n, const dcpx_key_map *m,
                                uint32_t fbeg, uint32_t fend, uint32_t *list,
                                uint32_t *words, uint32_t *bound) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t T = S->T, take = S->take, teq = T ? T : 0xFFFFFFFFu;
  uint32_t rg = S->wgt[warp], rq = S->weq[warp];
  /* Round 1 with bound (N >= 4): the next rank segment start s N of this
   * warp's keys (0 < s < W); the lane whose group holds it records
   * bound[s], the count of keys selected before it (dcpx_dev_list_bounds's
   * result, without a pass over the list). */
  uint32_t s_next = 0, next = 0xFFFFFFFFu;
  if (bound) {
    s_next = max(1u, dcpx_dev_div(fbeg + m->N - 1u, m->N, m->rcp_n));
    next = s_next * m->N;
  }
#pragma unroll 1
  for (uint32_t f0 = fbeg; f0 < fend; f0 += 128) {
    const uint32_t f = f0 + 4u * lane;
    const uint4 k = f < fend ? dcpx_dev_key4(keys, f, n) : make_uint4(0, 0, 0, 0);
    /* this lane's keys > T and == T, bit e for key f + e */
    uint32_t gtm = 0, eqm = 0;
#pragma unroll
    for (uint32_t e = 0; e < 4; e++) {
      const uint32_t o = dcpx_dev_u4word(k, e) >> 16;
      gtm |= (uint32_t)(o > T) << e;
      eqm |= (uint32_t)(o == teq) << e;
    }
    const uint32_t packed = ((uint32_t)__popc(gtm) << 16) | (uint32_t)__popc(eqm);
    const uint32_t incl = dcpx_dev_warp_incl(packed);
    const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
    /* Round 1 with N >= 128: at most one rank starts in this chunk, at
     * `next` as it is now, so key x's rank is s_next - 1, or s_next from
     * next on (no division per key). */
    const int r1on = bound && m->N >= 128u;
    const uint32_t r1 = r1on ? s_next - 1u : 0xFFFFFFFFu; /* else: divide */
    const uint32_t r1next = r1on ? next : 0xFFFFFFFFu;
    uint32_t starts = 0, sidx = 0;
    while (next < f0 + 128u && next < fend && s_next < m->W) { /* uniform */
      if (next - f < 4u) { /* N >= 4: one start per group at most */
        starts = 1u << (next - f);
        sidx = s_next;
      }
      s_next++;
      next += m->N;
    }
    if (packed && m->round == 0) {
      /* The push's top N of its klist (64 registers there): positions by
       * the running counts, key after key. */
      const uint32_t ex = incl - packed;
      uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu), pos = 0;
#pragma unroll
      for (uint32_t e = 0; e < 4; e++) {
        const uint32_t w = dcpx_dev_u4word(k, e);
        if (dcpx_dev_sel_place(w >> 16, T, take, &gb, &qb, &pos))
          dcpx_dev_place_word(m, list, pos, f + e, w);
      }
    } else if (packed || starts) {
      /* Selected: the keys > T, and the ties while the tie count lasts.
       * A selected key's position is the count of selected keys before
       * it, so every position comes from popcounts (no chain from key to
       * key): base = selected keys before this lane. */
      const uint32_t ex = incl - packed;
      const uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu);
      const uint32_t ntie = qb < take ? take - qb : 0u;
      uint32_t eqs = 0, ne = 0;
#pragma unroll
      for (uint32_t e = 0; e < 4; e++) /* the first ntie ties */
        if ((eqm >> e) & 1u) {
          eqs |= (uint32_t)(ne < ntie) << e;
          ne++;
        }
      const uint32_t nib = gtm | eqs;
      const uint32_t base = gb + min(qb, take);
      const uint32_t s2 = m->round == 2 && nib ? dcpx_dev_seg2(m, f) : 0u;
#pragma unroll
      for (uint32_t e = 0; e < 4; e++) {
        const uint32_t pos = base + __popc(nib & ((1u << e) - 1u));
        if ((starts >> e) & 1u)
          bound[sidx] = pos;
        if ((nib >> e) & 1u) {
          const uint32_t w = dcpx_dev_u4word(k, e);
          const uint32_t s = m->round == 2 ? s2 : r1 + (f + e >= r1next);
          list[pos] = dcpx_dev_entry_of(m, s, f + e, w);
          if (words)
            words[pos] = w;
        }
      }
    }
    rg += tot >> 16;
    rq += tot & 0xFFFFu;
  }
  __syncthreads();
}

/* One warp segment per warp over n keys: multiples of 128 keys. */
DCPX_D void dcpx_dev_warp_segment(uint32_t n, uint32_t *fbeg, uint32_t *fend) {
  const uint32_t nw = blockDim.x >> 5;
  const uint32_t kpw = (((n + nw - 1) / nw) + 127u) & ~127u;
  const uint32_t warp = threadIdx.x >> 5;
  *fbeg = min(n, warp * kpw);
  *fend = min(n, *fbeg + kpw);
}


/* The range of the keys just polled, block-wide, into *kmin_s / S->kmax
 * (both reset by the caller). */
DCPX_D void dcpx_dev_range_publish(uint32_t kmn, uint32_t kmx, uint32_t *kmin_s,
                          dcpx_sel_smem *S) {
  kmn = __reduce_min_sync(DCPX_FULL, kmn);
  kmx = __reduce_max_sync(DCPX_FULL, kmx);
  if ((threadIdx.x & 31u) == 0) {
    atomicMin(kmin_s, kmn);
    atomicMax(&S->kmax, kmx);
  }
}

/* bound[s] = first position of list[0..total) (entries s << 17 | l, in
 * (r, l) order) whose rank is >= s, for s <= W. Ends with a barrier. */
DCPX_D void dcpx_dev_list_bounds(const uint32_t *list, uint32_t total, uint32_t W,
                        uint32_t *bound) {
#pragma unroll 1
  for (uint32_t p = threadIdx.x; p <= total; p += blockDim.x) {
    const uint32_t lo = p ? (list[p - 1] >> 17) + 1u : 0u;
    const uint32_t hi = p < total ? list[p] >> 17 : W;
#pragma unroll 1
    for (uint32_t s = lo; s <= hi; s++)
      bound[s] = p;
  }
  __syncthreads();
}

/* ---- the local list (docs/PROTOCOL.md section 3) -------------------------------- */

/* Two bf16 (one per half word) -> two ord16 keys, NaN -> 0:
 * ord16 = b ^ (negative ? 0xFFFF : 0x8000), and a half is NaN iff
 * (b & 0x7FFF) + 0x7F carries into bit 15. */
DCPX_D uint32_t dcpx_dev_key2(uint32_t x) {
  const uint32_t neg = (x >> 15) & 0x00010001u;
  const uint32_t nan = (((x & 0x7FFF7FFFu) + 0x007F007Fu) >> 15) & 0x00010001u;
  return (x ^ (0x80008000u | (neg * 0x7FFFu))) & ~(nan * 0xFFFFu);
}

/* The same without the NaN test: NaN halves map outside [0x7F, 0xFF80]. */
DCPX_D uint32_t dcpx_dev_ord2(uint32_t x) {
  return x ^ (0x80008000u | (((x >> 15) & 0x00010001u) * 0x7FFFu));
}

DCPX_D uint4 dcpx_dev_key8(uint4 r) {
  return make_uint4(dcpx_dev_key2(r.x), dcpx_dev_key2(r.y),
                    dcpx_dev_key2(r.z), dcpx_dev_key2(r.w));
}

DCPX_D int dcpx_dev_group_full(uint32_t a, uint32_t len, uint32_t g) {
  return g * 8u >= a && g * 8u + 8u <= a + len;
}

/* The 8 keys (two per word) of group g: elements v = 8g .. 8g+7 of the
 * 16-byte-aligned view base[] of a row that starts at element a (l = v - a);
 * out-of-row and NaN elements give 0. */
DCPX_COLD uint4 dcpx_dev_group_load(const uint16_t *base, uint32_t a,
                                 uint32_t len, uint32_t g) {
  if (dcpx_dev_group_full(a, len, g))
    return dcpx_dev_key8(__ldg((const uint4 *)base + g));
  uint32_t k[8];
#pragma unroll
  for (uint32_t e = 0; e < 8; e++) {
    uint32_t v = g * 8u + e;
    k[e] = (v >= a && v < a + len) ? dcpx_dev_key(base[v]) : 0u;
  }
  return make_uint4(k[0] | (k[1] << 16), k[2] | (k[3] << 16),
                    k[4] | (k[5] << 16), k[6] | (k[7] << 16));
}

DCPX_D uint32_t dcpx_dev_u4get(uint4 k, uint32_t e) {
  const uint32_t w = e < 2 ? k.x : e < 4 ? k.y : e < 6 ? k.z : k.w;
  return (e & 1u) ? w >> 16 : w & 0xFFFFu;
}

/* Candidates found in pass C of one warp step: key e of this lane is
 * placed when selected. Shared by the exact and the fast path. */
DCPX_D void dcpx_dev_place(uint32_t *words, uint32_t cap, uint32_t o,
                           uint32_t l, uint32_t T, uint32_t take,
                           uint32_t *gb, uint32_t *qb) {
  uint32_t pos;
  if (dcpx_dev_sel_place(o, T, take, gb, qb, &pos)) {
    words[pos] = (o << 16) | (l & 0xFFFFu);
    if (l >> 16)
      atomicOr(words + cap + (pos >> 5), 1u << (pos & 31u));
  }
}

/* A row_ends[t] value clamped into [0, max_len] (docs/PROTOCOL.md 1:
 * the kernels cannot refuse device-resident arguments). */
DCPX_D uint32_t dcpx_dev_row_len(int32_t re, uint32_t max_len) {
  return re < 0 ? 0u : ((uint32_t)re > max_len ? max_len : (uint32_t)re);
}

/* Geometry of a row split into groups of 8 elements, one contiguous range
 * of groups per warp. */
typedef struct dcpx_rowgeo {
  const uint16_t *base; /* 16-byte aligned, = row - a */
  uint32_t a, len, G, gbeg, gend;
  uint32_t raw_ok; /* the rescue list may test raw bf16 (dcpx_dev_resc_load) */
} dcpx_rowgeo;

DCPX_D dcpx_rowgeo dcpx_dev_rowgeo(const uint16_t *row, uint32_t len) {
  dcpx_rowgeo r;
  const uint32_t nw = blockDim.x >> 5, warp = threadIdx.x >> 5;
  r.a = len ? (uint32_t)(((uintptr_t)row & 15u) >> 1) : 0u;
  r.base = row - r.a;
  r.len = len;
  r.G = len ? (len + r.a + 7u) >> 3 : 0u;
  const uint32_t gpw = (r.G + nw - 1) >> (__ffs(nw) - 1); /* nw: 2^k */
  r.gbeg = min(r.G, warp * gpw);
  r.gend = min(r.G, r.gbeg + gpw);
  r.raw_ok = 1;
  return r;
}

/* Raw bf16 of a group wholly inside the row. */
DCPX_D uint4 dcpx_dev_group_raw(const dcpx_rowgeo *R, uint32_t g) {
  return __ldg((const uint4 *)R->base + g);
}

/* The 8 keys of any group g. */
DCPX_D uint4 dcpx_dev_group_get(const dcpx_rowgeo *R, uint32_t g) {
  if (dcpx_dev_group_full(R->a, R->len, g))
    return dcpx_dev_key8(dcpx_dev_group_raw(R, g));
  return dcpx_dev_group_load(R->base, R->a, R->len, g);
}

/* This lane's groups g0 + 32u + lane (u < 4) of its warp's range, those
 * wholly inside the row, raw into raw[u] (the others are left as they
 * are: their keys come from dcpx_dev_group_load). */
DCPX_D void dcpx_dev_chunk_load(const dcpx_rowgeo *R, uint32_t g0,
                                uint4 *raw) {
  const uint32_t lane = threadIdx.x & 31u;
#pragma unroll
  for (uint32_t u = 0; u < 4; u++) {
    const uint32_t g = g0 + 32u * u + lane;
    if (g < R->gend && dcpx_dev_group_full(R->a, R->len, g))
      raw[u] = dcpx_dev_group_raw(R, g);
  }
}

/* The exact path: pass A, pass B and pass C over every group of the row
 * (the later passes re-read it from L2). Expects the histograms and words
 * zeroed. */
DCPX_COLD void dcpx_dev_local_exact(dcpx_sel_smem *S, const dcpx_rowgeo Rv,
                                 uint32_t cap, uint32_t *words) {
  /* By value: a pointer to the caller's copy would keep that copy in
   * local memory, and every access of the fast path to it a load. */
  const dcpx_rowgeo *R = &Rv;
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t a = R->a, len = R->len, gbeg = R->gbeg, gend = R->gend;
  uint32_t nz;

  /* Pass A: histogram ord >> 4 (4 groups in flight per lane). */
#pragma unroll 1
  for (uint32_t g0 = gbeg; g0 < gend; g0 += 128) {
    uint4 raw[4];
    dcpx_dev_chunk_load(R, g0, raw);
#pragma unroll
    for (uint32_t u = 0; u < 4; u++) {
      const uint32_t g = g0 + 32u * u + lane;
      if (g < gend)
        dcpx_dev_hist_add8(S->hist,
                           dcpx_dev_group_full(a, len, g)
                               ? dcpx_dev_key8(raw[u])
                               : dcpx_dev_group_load(R->base, a, len, g));
    }
  }
  const int all = dcpx_dev_sel_after_a(S, cap, &nz);

  /* Pass B: keys above bucket hb per warp, and the low 4 bits inside it. */
  {
    const uint32_t lim = all ? 0u : S->hb << 4;
    uint32_t *h16w = S->h16 + 16u * warp;
    uint32_t gtb = 0;
#pragma unroll 1
    for (uint32_t g = gbeg + lane; g < gend; g += 32)
      gtb += dcpx_dev_passb8(h16w, dcpx_dev_group_get(R, g), lim);
    gtb = __reduce_add_sync(DCPX_FULL, gtb);
    if (lane == 0)
      S->wgtb[warp] = gtb;
  }
  dcpx_dev_sel_finish(S, cap, all);

  /* Pass C: place the selected elements, in ascending l, warp by warp. */
  const uint32_t T = S->T, take = S->take, teq = T ? T : 0xFFFFFFFFu;
  uint32_t rg = S->wgt[warp], rq = S->weq[warp];
  const uint32_t quota = (S->wgt[warp + 1] - rg) +
                         (min(S->weq[warp + 1], take) - min(rq, take));
  uint32_t placed = 0;
#pragma unroll 1
  for (uint32_t g0 = gbeg; g0 < gend && placed < quota; g0 += 32) {
    const uint32_t g = g0 + lane;
    uint4 k = make_uint4(0, 0, 0, 0);
    uint32_t packed = 0;
    if (g < gend) {
      k = dcpx_dev_group_get(R, g);
      packed = dcpx_dev_passc(k.x & 0xFFFFu, T, teq) +
               dcpx_dev_passc(k.x >> 16, T, teq) +
               dcpx_dev_passc(k.y & 0xFFFFu, T, teq) +
               dcpx_dev_passc(k.y >> 16, T, teq) +
               dcpx_dev_passc(k.z & 0xFFFFu, T, teq) +
               dcpx_dev_passc(k.z >> 16, T, teq) +
               dcpx_dev_passc(k.w & 0xFFFFu, T, teq) +
               dcpx_dev_passc(k.w >> 16, T, teq);
    }
    if (!__any_sync(DCPX_FULL, packed))
      continue;
    const uint32_t incl = dcpx_dev_warp_incl(packed);
    const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
    if (packed) {
      const uint32_t ex = incl - packed;
      uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu);
#pragma unroll
      for (uint32_t e = 0; e < 8; e++)
        dcpx_dev_place(words, cap, dcpx_dev_u4get(k, e), g * 8u + e - a, T,
                       take, &gb, &qb);
    }
    const uint32_t nrq = rq + (tot & 0xFFFFu);
    placed += (tot >> 16) + (min(nrq, take) - min(rq, take));
    rg += tot >> 16;
    rq = nrq;
  }
  __syncthreads();
}

/* A positive threshold (tau in [0x8000, 0xFF80]) tested on raw bf16: a
 * half b has ord16 >= tau and is not NaN <=> b in [tau - 0x8000, 0x7F80],
 * one subtract and compare per half (th, tw: that range, in the high half;
 * dcpx_dev_raw_range). The group's mask, bit e for element e, and its
 * candidates' keys are b | 0x8000 (the other halves' are garbage). */
typedef struct dcpx_raw_range {
  uint32_t th, tw;
} dcpx_raw_range;

DCPX_D dcpx_raw_range dcpx_dev_raw_range(uint32_t tau) {
  dcpx_raw_range r;
  r.th = (tau - 0x8000u) << 16;
  r.tw = (0x7F81u - (tau - 0x8000u)) << 16;
  return r;
}

DCPX_D uint32_t dcpx_dev_raw_mask(uint4 k, dcpx_raw_range r) {
  return (uint32_t)((k.x << 16) - r.th < r.tw) |
         ((uint32_t)(k.x - r.th < r.tw) << 1) |
         ((uint32_t)((k.y << 16) - r.th < r.tw) << 2) |
         ((uint32_t)(k.y - r.th < r.tw) << 3) |
         ((uint32_t)((k.z << 16) - r.th < r.tw) << 4) |
         ((uint32_t)(k.z - r.th < r.tw) << 5) |
         ((uint32_t)((k.w << 16) - r.th < r.tw) << 6) |
         ((uint32_t)(k.w - r.th < r.tw) << 7);
}

DCPX_D uint4 dcpx_dev_raw_keys(uint4 k) {
  return make_uint4(k.x | 0x80008000u, k.y | 0x80008000u, k.z | 0x80008000u,
                    k.w | 0x80008000u);
}

/* The fast path's row pass: every key of the warp's range >= tau (raw
 * ord16 in [tau, 0xFF80], which also rejects NaN), in order, appended to
 * wk/wl, at most cw of them. Returns how many there were, those past cw
 * included; *kmax: the largest. */
DCPX_D uint32_t dcpx_dev_fast_pass(const dcpx_rowgeo *R, uint32_t tau,
                                   uint16_t *wk, uint32_t *wl, uint32_t cw,
                                   uint32_t *kmax) {
  const uint32_t lane = threadIdx.x & 31u;
  const uint32_t a = R->a, len = R->len, gend = R->gend;
  const uint32_t span = 0xFF80u - tau;
  /* With tau >= 0x8000 (a positive threshold) the test runs on raw bf16
   * halves (dcpx_dev_raw_mask). */
  const int quick = tau >= 0x8000u;
  const dcpx_raw_range rr = dcpx_dev_raw_range(tau);
  uint32_t wc = 0, km = *kmax;
#pragma unroll 1
  for (uint32_t g0 = R->gbeg; g0 < gend; g0 += 128) {
    uint4 raw[4];
    dcpx_dev_chunk_load(R, g0, raw);
#pragma unroll
    for (uint32_t u = 0; u < 4; u++) {
      const uint32_t g = g0 + 32u * u + lane;
      uint4 k = raw[u];
      uint32_t m = 0;
      if (g < gend) {
        if (quick && dcpx_dev_group_full(a, len, g)) {
          m = dcpx_dev_raw_mask(k, rr);
          k = dcpx_dev_raw_keys(k); /* ord16 of the candidates */
        } else {
          if (dcpx_dev_group_full(a, len, g))
            k = make_uint4(dcpx_dev_ord2(k.x), dcpx_dev_ord2(k.y),
                           dcpx_dev_ord2(k.z), dcpx_dev_ord2(k.w));
          else
            k = dcpx_dev_group_load(R->base, a, len, g);
#pragma unroll
          for (uint32_t e = 0; e < 8; e++)
            m |= (uint32_t)(dcpx_dev_u4get(k, e) - tau <= span) << e;
        }
      }
      const uint32_t c = __popc(m);
      if (!__any_sync(DCPX_FULL, c))
        continue;
      const uint32_t incl = dcpx_dev_warp_incl(c);
      uint32_t pos = wc + incl - c;
      while (m) {
        const uint32_t e = __ffs(m) - 1;
        m &= m - 1;
        const uint32_t w = dcpx_dev_u4word(k, e >> 1);
        const uint32_t key = (e & 1u) ? w >> 16 : w & 0xFFFFu;
        km = max(km, key);
        if (pos < cw) {
          wk[pos] = (uint16_t)key;
          wl[pos] = g * 8u + e - a;
        }
        pos++;
      }
      wc += __shfl_sync(DCPX_FULL, incl, 31);
    }
  }
  *kmax = km;
  return wc;
}

/* The fast path. One sampled key per thread gives a lower bound tau on the
 * cap-th best key (the bucket of the r-th best sample, r about twice the
 * expected count plus a margin); one pass over the row then appends every
 * key >= tau, in order, to its warp's candidate buffer (dcpx_dev_fast_pass);
 * the exact selection runs on the candidates only. The top `cap` of the
 * row are the top `cap` of the candidates whenever there are at least cap
 * of them, so the result is exact by construction. Each warp's buffer is
 * cand_max / warps entries; when a warp's range holds more (the row's best
 * keys lie close together, e.g. a recent-token window) but all the
 * candidates fit cand_max, the pass runs again, each warp into its exact
 * share of the buffers (its count's place among the warps'), instead of
 * the exact path's three passes, and the selection then splits the
 * candidates evenly among the warps. Returns 1 when done, else 0
 * (block-uniformly: too few non-empty samples, too few or too many
 * candidates) with the histograms zero, and the caller runs the exact
 * path. */
DCPX_D int dcpx_dev_local_fast(dcpx_sel_smem *S, const dcpx_rowgeo *R,
                               const uint16_t *row, uint32_t cap,
                               uint32_t r_samp, uint32_t *words,
                               uint16_t *ckey, uint32_t *cl,
                               uint32_t cand_max, unsigned long long *pf) {
  const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t nt = blockDim.x, nw = nt >> 5;
  const uint32_t len = R->len;
  const uint32_t cw = cand_max / nw;
  uint16_t *wk = ckey + warp * cw;
  uint32_t *wl = cl + warp * cw;

  /* 1. tau: bucket of the r_samp-th best of nt evenly spaced samples
   * ((2 tid + 1) len / 2nt < 2^32 for len <= 2^17, nt <= 1024). */
  dcpx_dev_hist_add(S->hist,
                      dcpx_dev_key(__ldg(row + (((2u * tid + 1u) * len) >>
                                                __ffs(nt)))));
  __syncthreads();
  dcpx_dev_stamp(pf, 1);
  if (dcpx_dev_hist_find(S, r_samp, 0u, 1) < r_samp)
    return 0; /* uniform: too few non-empty samples (buckets zeroed) */
  dcpx_dev_stamp(pf, 2);
  const uint32_t tau = max(S->hb << 4, 0x7Fu);
  uint32_t kmax = 0;

  /* 2. One pass over the row, appending candidates in order. */
  uint32_t wc = dcpx_dev_fast_pass(R, tau, wk, wl, cw, &kmax);
  dcpx_dev_stamp(pf, 3);
  kmax = __reduce_max_sync(DCPX_FULL, kmax);
  if (lane == 0)
    atomicMax(&S->kmax, kmax);
  if (lane == 0)
    S->wcnt[warp] = wc;
  __syncthreads();
  dcpx_dev_stamp(pf, 4);
  const uint32_t wcl = lane < nw ? S->wcnt[lane] : 0u;
  const uint32_t total = __reduce_add_sync(DCPX_FULL, wcl);
  const uint32_t over = __any_sync(DCPX_FULL, wcl > cw);
  if (total < cap || total > cw * nw) /* cw * nw: cand_max, live already */
    return 0; /* uniform */
  if (over) { /* uniform; the barrier above ended every warp's pass */
    const uint32_t off = __reduce_add_sync(DCPX_FULL, lane < warp ? wcl : 0u);
    uint32_t km = 0;
    wk -= warp * cw; /* ckey and cl, from what is live already */
    wl -= warp * cw;
    (void)dcpx_dev_fast_pass(R, tau, wk + off, wl + off, wc, &km);
    __syncthreads();
    /* The buffers hold every candidate in row order now: the selection
     * below takes them in equal shares, warp w the w-th (a few warps'
     * ranges held most of them). */
    const uint32_t b0 = (uint32_t)(((uint64_t)total * warp) / nw);
    const uint32_t b1 = (uint32_t)(((uint64_t)total * (warp + 1u)) / nw);
    wk += b0;
    wl += b0;
    wc = b1 - b0;
  }

  /* 3. The exact selection over the candidates (warp w's buffer is its
   * segment of the order): single-level when they span < 4096 values. */
  uint32_t nz;
  if (S->kmax - tau < DCPX_HI_BINS) {
#pragma unroll 1
    for (uint32_t i = lane; i < wc; i += 32)
      atomicAdd(S->hist + (wk[i] - tau), 1u);
    dcpx_dev_sel1_pick(S, cap, tau, &nz); /* nz = total >= cap: never all */
    dcpx_dev_stamp(pf, 5);
    const uint32_t T = S->T;
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
    dcpx_dev_stamp(pf, 6);
  } else {
#pragma unroll 1
    for (uint32_t i0 = 0; i0 < wc; i0 += 32)
      dcpx_dev_hist_add(S->hist, i0 + lane < wc ? wk[i0 + lane] : 0u);
    dcpx_dev_sel_after_a(S, cap, &nz); /* nz = total >= cap: never all */
    const uint32_t lim = S->hb << 4;
    uint32_t *h16w = S->h16 + 16u * warp;
    uint32_t gtb = 0;
#pragma unroll 1
    for (uint32_t i0 = 0; i0 < wc; i0 += 32)
      gtb += dcpx_dev_passb(h16w, i0 + lane < wc ? wk[i0 + lane] : 0u, lim);
    gtb = __reduce_add_sync(DCPX_FULL, gtb);
    if (lane == 0)
      S->wgtb[warp] = gtb;
    dcpx_dev_sel_finish(S, cap, 0);
  }
  const uint32_t T = S->T, take = S->take;
  uint32_t rg = S->wgt[warp], rq = S->weq[warp];
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
      dcpx_dev_place(words, cap, o, wl[i], T, take, &gb, &qb);
    rg += tot >> 16;
    rq += tot & 0xFFFFu;
  }
  __syncthreads();
  dcpx_dev_stamp(pf, 7);
  return 1;
}

/* The local top-`cap` list of row[0..len) into words[0..row_words(cap))
 * (shared memory): the cap best non-NaN elements in ascending l, then
 * zeros, then the bit-16 plane. ckey/cl: candidate buffers of cand_max
 * entries for the fast path (NULL: exact path only). Every thread must
 * call it; it ends with a barrier. pf (benches; NULL): thread 0's
 * clock64 at the end of its steps, pf[0..7]. */
DCPX_COLD void dcpx_dev_local_list_p(dcpx_sel_smem *S, const uint16_t *row,
                                  uint32_t len, uint32_t cap,
                                  uint32_t *words, uint16_t *ckey,
                                  uint32_t *cl, uint32_t cand_max,
                                  unsigned long long *pf) {
  const uint32_t nt = blockDim.x;
  const dcpx_rowgeo R = dcpx_dev_rowgeo(row, len);
  const uint32_t rw = dcpx_dev_row_words(cap);

#pragma unroll 1
  for (uint32_t i = threadIdx.x; i < rw; i += nt)
    words[i] = 0;
  dcpx_dev_sel_zero(S);
  __syncthreads();
  dcpx_dev_stamp(pf, 0);

  /* The sample must be small against the row, and the expected candidates
   * (r / nt of the row) well inside the buffers. */
  if (ckey && len >= 2048u) {
    const uint32_t r = (2u * cap * nt + len - 1u) / len + 8u;
    if (r <= nt / 2u &&
        (uint64_t)r * len <= (uint64_t)nt * (cand_max / 4u * 3u) &&
        dcpx_dev_local_fast(S, &R, row, cap, r, words, ckey, cl, cand_max,
                            pf))
      return;
  }
  dcpx_dev_local_exact(S, R, cap, words);
}

DCPX_D void dcpx_dev_local_list(dcpx_sel_smem *S, const uint16_t *row,
                                uint32_t len, uint32_t cap, uint32_t *words,
                                uint16_t *ckey, uint32_t *cl,
                                uint32_t cand_max) {
  dcpx_dev_local_list_p(S, row, len, cap, words, ckey, cl, cand_max, NULL);
}

/* ---- bounded waits (docs/PROTOCOL.md section 6) --------------------------------- */

/* How the waits learn of an abort, their own rank's FAILED word and the
 * timeout without a storm of PCIe reads (the control page is host
 * memory, and concurrent reads of one host line serialise: about 1 us
 * each, measured). Every DCPX_BLK_CHECK_NS of waiting, one thread of the
 * block (elected in shared memory) reads the rank's device-memory mirror
 * (layout.h dcpx_rank_state); at most every DCPX_CTL_EVERY_NS one thread
 * of the whole rank (elected by an L2 atomic on ctl_next) reads the
 * control page itself and updates the mirror. The waiters spin on their
 * LL pair and look at shared memory only. */
#define DCPX_BLK_CHECK_NS 2000ull
#define DCPX_CTL_EVERY_NS 20000ull
#define DCPX_CTL_STORM_NS 2000ull /* poll_storm: every waiter, every 2 us */

/* A block's shared wait state (one per block, reset at each row). */
typedef struct dcpx_blkwait {
  volatile uint32_t fail; /* 0, 1 (FAILED or abort seen), 2 (timed out) */
  /* defer 0: a timeout's record is written at once, by the first waiter
   * that gives up, for its own pair. 1 (the rescue poll: merge.cu,
   * poll_flat): the record is deferred; rec_k is the least flat index
   * of the pairs the waiters gave up on (~0 while none), recorded after
   * the poll (dcpx_dev_give_up). */
  uint32_t rec_k;
  volatile uint32_t defer;
  unsigned long long next;           /* globaltimer of the next check */
  volatile unsigned long long limit; /* the group's timeout once known */
  volatile unsigned long long t0;    /* the row's wait phase began */
} dcpx_blkwait;

/* What a waiting block needs to give up properly. */
typedef struct dcpx_wctx {
  dcpx_ctl_header *ctl;
  dcpx_rank_health *health; /* own rank's block */
  dcpx_wait_record *rec;    /* own record slot of this row */
  dcpx_rank_state *st;      /* own rank's state (device memory) */
  uint32_t rank, t;
  uint32_t storm;           /* 1: the old every-waiter poll (measurement) */
  /* Block 0, thread 0: fault_armed as read during the row's poll
   * (shared memory, merge.cu); NULL elsewhere. */
  const uint32_t *hook_s;
  dcpx_blkwait *bw;         /* shared */
} dcpx_wctx;

/* The call's tag (layout.h call_seq), on the rare paths that need it
 * (records, the fault hook, failed calls): this rank's push of the call
 * advanced it, so it is read after the push grid is complete and
 * visible (PDL; without PDL stream order already guarantees it). The
 * hot path reads nothing for it, and the push advances it without a
 * fence (push.cu). */
DCPX_D uint64_t dcpx_dev_call_tag(const dcpx_wctx *w) {
  dcpx_dev_pdl_wait();
  return w->st->call_seq;
}

/* Starts row t's wait phase (thread 0; the caller synchronises). */
DCPX_D void dcpx_dev_wait_begin(dcpx_blkwait *bw) {
  const uint64_t now = dcpx_dev_now();
  bw->fail = 0;
  bw->defer = 0;
  bw->limit = 0; /* unknown until the first check reads the mirror */
  bw->t0 = now;
  bw->next = now + DCPX_BLK_CHECK_NS;
}

/* The block's timeout: the record (if its slot is empty: fields, fence,
 * kind), then the alarm, then, once that drained, FAILED (and the device
 * mirror's stop). One thread, once (dcpx_dev_timeout's CAS winner, or
 * after a deferred poll). */
DCPX_D void dcpx_dev_give_up(const dcpx_wctx *w, uint32_t region,
                             uint32_t index, uint32_t expected,
                             uint32_t seen) {
  dcpx_wait_record *r = w->rec;
  if (r->kind == DCPX_REC_EMPTY) {
    r->region = region;
    r->index = index;
    r->expected = expected;
    r->seen = seen;
    r->block = w->t;
    r->time_ns = dcpx_dev_now();
    r->call_tag = dcpx_dev_call_tag(w);
    r->generation = w->ctl->generation;
    r->rank = w->rank;
    __threadfence_system();
    r->kind = DCPX_REC_TIMEOUT;
  }
  __threadfence_system();
  w->health->alarm = 1;
  __threadfence_system();
  w->health->failed = 1;
  w->st->stop = 1;
  __threadfence_system();
}

/* Gives up after a timeout: the first thread of the block to do so sets
 * fail = 2 and, unless the record is deferred (bw->defer), gives up for
 * its pair (dcpx_dev_give_up). */
DCPX_D void dcpx_dev_timeout(const dcpx_wctx *w, uint32_t region,
                             uint32_t index, uint32_t expected,
                             uint32_t seen) {
  if (atomicCAS((uint32_t *)&w->bw->fail, 0u, 2u) != 0u || w->bw->defer)
    return;
  dcpx_dev_give_up(w, region, index, expected, seen);
}

/* Reads the control page (PCIe) into the mirror and the block: 0 when the
 * rank must stop. */
DCPX_D int dcpx_dev_ctl_read(const dcpx_wctx *w) {
  const uint64_t lim = w->ctl->timeout_ns;
  const uint32_t stop = w->health->failed || w->ctl->abort;
  w->st->timeout_ns = lim ? lim : DCPX_K_DEFAULT_TIMEOUT_NS;
  w->bw->limit = lim ? lim : DCPX_K_DEFAULT_TIMEOUT_NS;
  if (stop) {
    w->st->stop = 1;
    atomicCAS((uint32_t *)&w->bw->fail, 0u, 1u);
    return 0;
  }
  return 1;
}

/* The block's periodic check (one elected thread): the mirror, and the
 * control page when this thread wins the rank-wide election. */
DCPX_D int dcpx_dev_block_check(const dcpx_wctx *w, uint64_t now) {
  dcpx_rank_state *st = w->st;
  if (st->stop) {
    atomicCAS((uint32_t *)&w->bw->fail, 0u, 1u);
    return 0;
  }
  w->bw->limit = st->timeout_ns;
  const unsigned long long gn =
      *(volatile unsigned long long *)&st->ctl_next;
  if (now >= gn && atomicCAS(&st->ctl_next, gn, now + DCPX_CTL_EVERY_NS) == gn)
    return dcpx_dev_ctl_read(w);
  return 1;
}

/* The slow path shared by the waits: 1 to keep waiting, 0 to give up.
 * *mine: this thread's last poll (poll_storm only). The time bound counts
 * from the row's wait phase (t0), so a peer that trickles cannot hold a
 * row for more than one timeout. */
DCPX_D int dcpx_dev_wait_step(const dcpx_wctx *w, uint64_t *mine,
                              uint32_t region, uint32_t index,
                              uint32_t expected, uint32_t seen) {
  dcpx_blkwait *bw = w->bw;
  if (bw->fail)
    return 0;
  const uint64_t now = dcpx_dev_now();
  if (w->storm) {
    if (now - *mine >= DCPX_CTL_STORM_NS) {
      *mine = now;
      if (!dcpx_dev_ctl_read(w))
        return 0;
    }
  } else {
    const unsigned long long nx = bw->next;
    if (now >= nx && atomicCAS(&bw->next, nx, now + DCPX_BLK_CHECK_NS) == nx &&
        !dcpx_dev_block_check(w, now))
      return 0;
  }
  const uint64_t lim = bw->limit;
  if ((lim && now - bw->t0 > lim) ||
      dcpx_tag_other_call(region, expected, seen)) { /* never comes */
    dcpx_dev_timeout(w, region, index, expected, seen);
    return 0;
  }
  return 1;
}

/* Waits until both halves of the LL pair at p carry tag e. region/index:
 * the pair's region and the 8-byte half index of p within it. 1 when
 * satisfied (*a, *b hold the halves), 0 when the block gave up. */
DCPX_D int dcpx_dev_wait_ll(const dcpx_wctx *w, const void *p, uint32_t e,
                            uint32_t region, uint32_t index, uint64_t *a,
                            uint64_t *b) {
  uint64_t mine = dcpx_dev_now();
  for (;;) {
    dcpx_dev_ll_load(p, a, b);
    const uint32_t ta = (uint32_t)(*a >> 32), tb = (uint32_t)(*b >> 32);
    if (ta == e && tb == e)
      return 1;
    if (!dcpx_dev_wait_step(w, &mine, region, ta != e ? index : index + 1, e,
                            ta != e ? ta : tb))
      return 0;
  }
}

/* The fault hook (tests; armed by dcpxd): stalls fault_ticks ns once, in
 * the call whose epoch (the row half of row 0's tag; 0 = any) and call
 * sequence (~0 = any) match, by
 * thread 0 of block 0 right after its first row's round-1 poll. The stall
 * is capped at the group's timeout and ends early when the group is
 * aborted or the rank FAILED (read every 20 us). */
DCPX_D void dcpx_dev_fault_hook(const dcpx_wctx *w, uint32_t e) {
  dcpx_rank_health *h = w->health;
  if (!w->hook_s || !w->hook_s[0] || !h->fault_armed || h->fault_fired)
    return;
  const uint32_t fe = h->fault_epoch;
  const uint64_t fc = h->fault_call;
  if ((fe != 0 && fe != (e & 0xFFFFu)) ||
      (fc != ~0ull && fc != dcpx_dev_call_tag(w)))
    return;
  h->fault_fired = 1;
  __threadfence_system();
  uint64_t ticks = h->fault_ticks, lim = w->ctl->timeout_ns;
  if (!lim)
    lim = DCPX_K_DEFAULT_TIMEOUT_NS;
  if (ticks > lim)
    ticks = lim;
  const uint64_t start = dcpx_dev_now();
  uint64_t now = start, polled = start;
  while (now - start < ticks) {
    if (now - polled >= DCPX_CTL_EVERY_NS) {
      polled = now;
      if (w->ctl->abort || h->failed)
        break;
    }
    __nanosleep(1000);
    now = dcpx_dev_now();
  }
}

/* ---- the rescue list (docs/PROTOCOL.md section 5.4, docs/PROTOCOL.md) ----------- */

/* The rescue list from a local top-K list src (capacity cap, wire form):
 * its entries with ord16 >= t1, in order, into words[0..row_words(cap))
 * (shared). src is the push's klist (device memory) or words itself (the
 * early rescue list, filtered in place for a T1 > 0: the rescue list by
 * its definition, docs/PROTOCOL.md 5.4, without the two passes over the
 * row of dcpx_dev_rescue_list). Each thread holds its `per` (<= 8)
 * consecutive entries and their plane bits in registers before the first
 * barrier, so nothing is written before every read; three barriers. Every
 * thread must call it; returns the list's entries (block-uniform). */
DCPX_D uint32_t dcpx_dev_rescue_filter(dcpx_sel_smem *S, const uint32_t *src,
                                   uint32_t cap, uint32_t t1,
                                   uint32_t *words) {
  const uint32_t nt = blockDim.x, rw = dcpx_dev_row_words(cap);
  const uint32_t per = (cap + nt - 1) / nt, j0 = threadIdx.x * per;
  uint32_t w[8], pb = 0, c = 0, total;
#pragma unroll
  for (uint32_t u = 0; u < 8; u++) {
    const uint32_t j = j0 + u;
    w[u] = u < per && j < cap ? src[j] : 0u;
    if (u < per && j < cap)
      pb |= ((src[cap + (j >> 5)] >> (j & 31u)) & 1u) << u;
    c += (w[u] >> 16) != 0 && (w[u] >> 16) >= t1;
  }
  uint32_t pos = dcpx_dev_block_excl(c, S->scan, &total); /* a barrier */
  /* every read is done: the tail entries and the planes are rewritten */
#pragma unroll 1
  for (uint32_t i = total + threadIdx.x; i < cap; i += nt)
    words[i] = 0;
#pragma unroll 1
  for (uint32_t i = cap + threadIdx.x; i < rw; i += nt)
    words[i] = 0;
  __syncthreads();
#pragma unroll
  for (uint32_t u = 0; u < 8; u++) {
    if ((w[u] >> 16) == 0 || (w[u] >> 16) < t1)
      continue;
    words[pos] = w[u];
    if ((pb >> u) & 1u)
      atomicOr(words + cap + (pos >> 5), 1u << (pos & 31u));
    pos++;
  }
  __syncthreads();
  return total;
}

/* Qualifying mask of the 8 keys of a group: key != 0 and key >= t1. */
DCPX_D uint32_t dcpx_dev_ge_mask(uint4 k, uint32_t t1) {
  uint32_t m = 0;
#pragma unroll
  for (uint32_t e = 0; e < 8; e++) {
    const uint32_t o = dcpx_dev_u4get(k, e);
    m |= (uint32_t)(o != 0 && o >= t1) << e;
  }
  return m;
}

/* Groups per lane of one rescue-list step: lane i of a warp takes the
 * DCPX_RESC_U consecutive groups g0 + i * DCPX_RESC_U + u, so the lanes'
 * groups are in ascending l in lane order and one warp scan per step
 * places them. A warp whose range is one step (local <= 16,384 at 512
 * threads) loads its row once and keeps it in registers. */
#define DCPX_RESC_U 4u

/* The keys and the qualifying masks (key != 0, key >= t1) of lane `lane`'s
 * DCPX_RESC_U groups of the step at g0; every load is issued before any
 * is used. With a positive t1 (the usual rescue) a whole group is tested
 * on its raw bf16 (dcpx_dev_raw_mask), and only its qualifying keys are
 * keys (the callers read no other). */
DCPX_D void dcpx_dev_resc_load(const dcpx_rowgeo *R, uint32_t g0, uint32_t t1,
                               uint4 *k, uint32_t *m) {
  const uint32_t gl = g0 + (threadIdx.x & 31u) * DCPX_RESC_U;
  const int quick = t1 >= 0x8000u && t1 <= 0xFF80u && R->raw_ok;
  const dcpx_raw_range rr = dcpx_dev_raw_range(t1);
#pragma unroll
  for (uint32_t u = 0; u < DCPX_RESC_U; u++) { /* raw, then keys in place */
    const uint32_t g = gl + u;
    k[u] = g < R->gend && dcpx_dev_group_full(R->a, R->len, g)
               ? dcpx_dev_group_raw(R, g)
               : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (uint32_t u = 0; u < DCPX_RESC_U; u++) {
    const uint32_t g = gl + u;
    if (g >= R->gend) {
      m[u] = 0;
    } else if (quick && dcpx_dev_group_full(R->a, R->len, g)) {
      m[u] = dcpx_dev_raw_mask(k[u], rr);
      k[u] = dcpx_dev_raw_keys(k[u]);
    } else {
      k[u] = dcpx_dev_group_full(R->a, R->len, g)
                 ? dcpx_dev_key8(k[u])
                 : dcpx_dev_group_load(R->base, R->a, R->len, g);
      m[u] = dcpx_dev_ge_mask(k[u], t1);
    }
  }
}

/* The 32 bits of a lane's DCPX_RESC_U masks, group u at bits 8u.. */
DCPX_D uint32_t dcpx_dev_resc_bits(const uint32_t *m) {
  uint32_t all = 0;
#pragma unroll
  for (uint32_t u = 0; u < DCPX_RESC_U; u++)
    all |= m[u] << (8u * u);
  return all;
}

/* Places the keys of this lane whose bits are set in `all` (bit 8u + e:
 * key e of its group gl + u, keys k) at words[p ..], in ascending l: each
 * position from the prefix popcount of `all`, so the stores do not wait
 * for each other. The bit-16 plane only when a lane's elements reach
 * l = 65536 (rows that long), in a rolled loop of its own. */
DCPX_D void dcpx_dev_resc_place(const dcpx_rowgeo *R, uint32_t gl,
                                const uint4 *k, uint32_t all, uint32_t p,
                                uint32_t cap, uint32_t *words) {
#pragma unroll
  for (uint32_t u = 0; u < DCPX_RESC_U; u++)
#pragma unroll
    for (uint32_t e = 0; e < 8; e++) {
      const uint32_t bit = 8u * u + e;
      if ((all >> bit) & 1u) {
        const uint32_t q = p + __popc(all & ((1u << bit) - 1u));
        const uint32_t l = (gl + u) * 8u + e - R->a;
        words[q] = (dcpx_dev_u4get(k[u], e) << 16) | (l & 0xFFFFu);
      }
    }
  if ((gl + DCPX_RESC_U) * 8u > R->a + 65536u) {
    uint32_t x = all;
#pragma unroll 1
    while (x) {
      const uint32_t bit = __ffs(x) - 1;
      x &= x - 1;
      const uint32_t q = p + __popc(all & ((1u << bit) - 1u));
      if (((gl + (bit >> 3)) * 8u + (bit & 7u) - R->a) >> 16)
        atomicOr(words + cap + (q >> 5), 1u << (q & 31u));
    }
  }
}

/* stmt for each of this lane's qualifying keys in k, m (one step of
 * dcpx_dev_resc_load): o is the key, bit its bit 8u + e (group u, place
 * e). Unrolled: the keys stay in registers. */
#define DCPX_RESC_KEYS(k, m, stmt)                                           \
  _Pragma("unroll") for (uint32_t u_ = 0; u_ < DCPX_RESC_U; u_++)           \
    _Pragma("unroll") for (uint32_t e_ = 0; e_ < 8; e_++)                   \
      if (((m)[u_] >> e_) & 1u) {                                           \
        const uint32_t o = dcpx_dev_u4get((k)[u_], e_);                     \
        const uint32_t bit = 8u * u_ + e_;                                  \
        (void)bit;                                                          \
        stmt;                                                               \
      }

/* The masks of this lane's qualifying keys above T and equal to T. */
DCPX_D void dcpx_dev_resc_masks(const uint4 *k, const uint32_t *m, uint32_t T,
                                uint32_t *ret_gt, uint32_t *ret_eq) {
  uint32_t gtm = 0, eqm = 0;
  DCPX_RESC_KEYS(k, m, {
    gtm |= (uint32_t)(o > T) << bit;
    eqm |= (uint32_t)(o == T) << bit;
  });
  *ret_gt = gtm;
  *ret_eq = eqm;
}

/* The top-cap list of a row with more than cap qualifying keys (key != 0,
 * key >= t1: the masks), in ascending l, into words (zeroed, planes
 * included): the flat selection (dcpx_dev_flat_select: one level when the
 * qualifying keys span fewer than 4,096 values, else two) over the row
 * itself, whose keys stay in registers when each warp's range is one step
 * (`one`; else every pass loads its steps again). Its entries are the
 * row's top cap: when more than cap keys are >= t1, the cap-th best is >=
 * t1 too. Histograms dirty on entry; every thread calls it; ends with a
 * barrier. */
DCPX_D void dcpx_dev_resc_top(dcpx_sel_smem *S, const dcpx_rowgeo *R, int one,
                              uint32_t cap, uint32_t t1, uint32_t *words,
                              uint4 *k, uint32_t *m, unsigned long long *pf) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t step = 32u * DCPX_RESC_U;
  uint32_t nz, kmn = 0xFFFFu, kmx = 0;
  dcpx_dev_sel_zero(S);
  if (threadIdx.x == 0)
    S->kmin = 0xFFFFu;
  /* the qualifying keys' range */
#pragma unroll 1
  for (uint32_t g0 = R->gbeg; g0 < R->gend; g0 += step) {
    if (!one)
      dcpx_dev_resc_load(R, g0, t1, k, m);
    DCPX_RESC_KEYS(k, m, {
      kmn = min(kmn, o);
      kmx = max(kmx, o);
    });
  }
  __syncthreads(); /* sel_zero and kmin's reset before the range */
  dcpx_dev_range_publish(kmn, kmx, &S->kmin, S);
  __syncthreads();
  const uint32_t kmin = S->kmin, one_level = S->kmax - kmin < DCPX_HI_BINS;
  dcpx_dev_stamp(pf, 0);
  /* pass A: keys per value - kmin (one level) or per ord >> 4 */
#pragma unroll 1
  for (uint32_t g0 = R->gbeg; g0 < R->gend; g0 += step) {
    if (!one)
      dcpx_dev_resc_load(R, g0, t1, k, m);
    DCPX_RESC_KEYS(k, m,
                   atomicAdd(S->hist + (one_level ? o - kmin : o >> 4), 1u));
  }
  if (one_level)
    dcpx_dev_sel1_pick(S, cap, kmin, &nz); /* nz > cap: not "all" */
  else
    dcpx_dev_sel_after_a(S, cap, &nz);
  dcpx_dev_stamp(pf, 1);
  /* pass B: keys > T and == T per warp (one level: the masks, which pass
   * C reuses when the row is one step), or the keys inside bucket hb per
   * warp and those above it */
  const uint32_t lim = S->hb << 4;
  uint32_t *h16w = S->h16 + 16u * warp, gt = 0, eq = 0, gtm = 0, eqm = 0;
#pragma unroll 1
  for (uint32_t g0 = R->gbeg; g0 < R->gend; g0 += step) {
    if (!one)
      dcpx_dev_resc_load(R, g0, t1, k, m);
    if (one_level) {
      dcpx_dev_resc_masks(k, m, S->T, &gtm, &eqm);
      gt += __popc(gtm);
      eq += __popc(eqm);
    } else {
      DCPX_RESC_KEYS(k, m, gt += dcpx_dev_passb(h16w, o, lim));
    }
  }
  gt = __reduce_add_sync(DCPX_FULL, gt);
  eq = __reduce_add_sync(DCPX_FULL, eq);
  if (lane == 0) {
    S->wgtb[warp] = gt;
    S->weqc[warp] = eq;
  }
  if (one_level)
    dcpx_dev_sel1_bases(S);
  else
    dcpx_dev_sel_finish(S, cap, 0);
  dcpx_dev_stamp(pf, 2);
  /* pass C: the selected keys in order (T != 0: the cap-th key is one):
   * this lane's keys > T, and of its keys == T those that the tie count
   * still takes, placed after the selected keys before the lane */
  const uint32_t T = S->T, take = S->take;
  uint32_t rg = S->wgt[warp], rq = S->weq[warp];
#pragma unroll 1
  for (uint32_t g0 = R->gbeg; g0 < R->gend; g0 += step) {
    if (!one)
      dcpx_dev_resc_load(R, g0, t1, k, m);
    if (!one || !one_level)
      dcpx_dev_resc_masks(k, m, T, &gtm, &eqm);
    const uint32_t packed = (__popc(gtm) << 16) | __popc(eqm);
    const uint32_t incl = dcpx_dev_warp_incl(packed);
    const uint32_t ex = incl - packed;
    const uint32_t gb = rg + (ex >> 16), qb = rq + (ex & 0xFFFFu);
    const uint32_t ntie = qb < take ? min((uint32_t)__popc(eqm), take - qb) : 0u;
#pragma unroll 1
    while ((uint32_t)__popc(eqm) > ntie) /* keep the first ntie ties */
      eqm ^= 1u << (31 - __clz(eqm));
    dcpx_dev_resc_place(R, g0 + lane * DCPX_RESC_U, k, gtm | eqm,
                        gb + min(qb, take), cap, words);
    const uint32_t tot = __shfl_sync(DCPX_FULL, incl, 31);
    rg += tot >> 16;
    rq += tot & 0xFFFFu;
  }
  __syncthreads();
}

/* The rescue list of a saturated rank's row into words[0..row_words(cap))
 * (shared): the entries of its local top-cap list with ord16 >= t1, in
 * ascending l, then zeros, then the bit-16 plane. When at most cap
 * elements of the row have ord16 >= t1 (the usual case) that is all of
 * them: a counting step and a placing step over the row (the row read
 * once when each warp's range is one step). Otherwise the top-cap list
 * itself (dcpx_dev_resc_top: the same row in the same registers, selected
 * in three more steps), whose entries are then all >= t1.
 * prof (diagnostics, or NULL): thread 0's clock64 after the count, after
 * its warp's placing, before the count's barrier (prof[11]); with more than cap keys >= t1, prof[8..10] after
 * the top cap's key range, threshold and per-warp bases. raw_ok: a
 * positive t1 may be tested on the raw bf16 of whole groups (0: every
 * key's ord16, a bench's A/B). Every thread must call it; it ends with a barrier;
 * it leaves the selection's histograms dirty. Returns the list's entries
 * (block-uniform). */
DCPX_D uint32_t dcpx_dev_rescue_list(dcpx_sel_smem *S, const uint16_t *row,
                                 uint32_t len, uint32_t cap, uint32_t t1,
                                 uint32_t *words, unsigned long long *prof,
                                 int raw_ok) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t nw = blockDim.x >> 5, step = 32u * DCPX_RESC_U;
  dcpx_rowgeo R = dcpx_dev_rowgeo(row, len);
  R.raw_ok = (uint32_t)raw_ok;
  const uint32_t rw = dcpx_dev_row_words(cap);
  const int one = R.gend - R.gbeg <= step; /* warp-uniform */
  uint4 k[DCPX_RESC_U];
  uint32_t m[DCPX_RESC_U];

#pragma unroll 1
  for (uint32_t i = threadIdx.x; i < rw; i += blockDim.x)
    words[i] = 0;
  uint32_t c = 0;
#pragma unroll 1
  for (uint32_t g0 = R.gbeg; g0 < R.gend; g0 += step) {
    dcpx_dev_resc_load(&R, g0, t1, k, m);
#pragma unroll
    for (uint32_t u = 0; u < DCPX_RESC_U; u++)
      c += __popc(m[u]);
  }
  if (prof && threadIdx.x == 0) /* point 23: its own count, after its loads */
    prof[11] = clock64();
  c = __reduce_add_sync(DCPX_FULL, c);
  if (lane == 0)
    S->wcnt[warp] = c;
  __syncthreads();
  const uint32_t wc = lane < nw ? S->wcnt[lane] : 0u;
  const uint32_t total = __reduce_add_sync(DCPX_FULL, wc);
  if (prof && threadIdx.x == 0)
    prof[0] = clock64();
  if (total > cap) {
    dcpx_dev_resc_top(S, &R, one, cap, t1, words, k, m, prof ? prof + 8 : NULL);
    if (prof && threadIdx.x == 0)
      prof[1] = clock64();
    return cap;
  }
  uint32_t pos = __reduce_add_sync(DCPX_FULL, lane < warp ? wc : 0u);
#pragma unroll 1
  for (uint32_t g0 = R.gbeg; g0 < R.gend; g0 += step) {
    if (!one)
      dcpx_dev_resc_load(&R, g0, t1, k, m);
    uint32_t n = 0;
#pragma unroll
    for (uint32_t u = 0; u < DCPX_RESC_U; u++)
      n += __popc(m[u]);
    const uint32_t incl = dcpx_dev_warp_incl(n);
    dcpx_dev_resc_place(&R, g0 + lane * DCPX_RESC_U, k, dcpx_dev_resc_bits(m),
                        pos + incl - n, cap, words);
    pos += __shfl_sync(DCPX_FULL, incl, 31);
  }
  if (prof && threadIdx.x == 0)
    prof[1] = clock64();
  __syncthreads();
  return total;
}

/* ---- call counters (dcpx_kernels.h dcpx_k_counters) ---------------------- */

/* Thread 0 of a merge block (NCCL: round-1 block), as each row ends:
 * a finished row (fire-and-forget reductions), or a failed one (the first
 * of a call counts the call as failed, once: the key is the group's
 * generation, which a recovery advances, over the call sequence, which a
 * recovery zeroes; read from the control page only on this rare path). */
DCPX_D void dcpx_dev_count_row(dcpx_k_counters *c, uint32_t rescued) {
  atomicAdd(&c->rows, 1ull);
  if (rescued)
    atomicAdd(&c->rescue_rows, 1ull);
}

DCPX_D void dcpx_dev_count_failed(dcpx_k_counters *c,
                                  const dcpx_ctl_header *ctl, uint64_t call) {
  const unsigned long long key = ((unsigned long long)ctl->generation << 40) |
                                 ((call + 1ull) & ((1ull << 40) - 1ull));
  if (atomicMax(&c->last_failed, key) < key)
    atomicAdd(&c->failed_calls, 1ull);
}

/* Block 0, thread 0, at its kernel's start: an asynchronous copy of the
 * first 32 bytes of c (launched, rows, rescue_rows, failed_calls: the
 * previous calls' totals) into snap (shared, 16-byte aligned). */
DCPX_D void dcpx_dev_count_fetch(const dcpx_k_counters *c,
                                 unsigned long long *snap) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(snap);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d),
               "l"(c)
               : "memory");
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d + 16u),
               "l"((const char *)c + 16)
               : "memory");
  asm volatile("cp.async.commit_group;" ::: "memory");
}

/* The same thread, later in the kernel (the copy has long landed, and
 * the kernel has microseconds to go, so the host stores drain before it
 * ends): the totals into the rank's health block (plain stores, one
 * writer), then this launch counted. */
DCPX_D void dcpx_dev_count_publish(dcpx_k_counters *c,
                                   const unsigned long long *snap,
                                   dcpx_rank_health *h) {
  asm volatile("cp.async.wait_all;" ::: "memory");
  h->calls = snap[0] - snap[3];
  h->rows = snap[1];
  h->rescue_rows = snap[2];
  h->failed_calls = snap[3];
  atomicAdd(&c->launched, 1ull);
}

/* ---- outputs (docs/PROTOCOL.md section 5.6) ------------------------------------ */

/* What the output stage needs besides the row's selection. */
typedef struct dcpx_out_args {
  const int32_t *block_table;
  int32_t *rows_out, *valid_out, *ids_out;
  uint32_t K, W, me, B, I, bt_rows, bt_cols;
  uint32_t sh_b, sh_i; /* log2 of B and of I when a power of two, else 32 */
  float rcp_b, rcp_i;
  /* The request's first nbs block-table entries in shared memory (the
   * LL merge copies them after its round-1 poll), or nbs = 0. */
  const int32_t *bts;
  uint32_t nbs;
} dcpx_out_args;

/* log2(d) for a power of two d, else 32 (dcpx_dev_div_sh divides). */
DCPX_D uint32_t dcpx_dev_log2_or32(uint32_t d) {
  return d && !(d & (d - 1u)) ? (uint32_t)(__ffs(d) - 1) : 32u;
}

/* x / d: a shift when d is a power of two (sh = its log2, the common
 * block sizes and interleave 1), else dcpx_dev_div. sh is the same for
 * every thread, so the branch does not diverge. */
DCPX_D uint32_t dcpx_dev_div_sh(uint32_t x, uint32_t d, float rcp,
                                uint32_t sh) {
  return sh < 32u ? x >> sh : dcpx_dev_div(x, d, rcp);
}

/* The output arguments every merge kernel (LL, and the NCCL transport's
 * round kernels) passes to dcpx_dev_outputs. */
DCPX_D void dcpx_dev_out_args_init(dcpx_out_args *oa, const int32_t *bt,
                                   uint32_t bt_rows, uint32_t bt_cols,
                                   int32_t *rows_out, int32_t *valid_out,
                                   int32_t *ids_out, uint32_t K, uint32_t W,
                                   uint32_t me, uint32_t B, uint32_t I,
                                   float rcp_b, float rcp_i) {
  oa->block_table = bt;
  oa->rows_out = rows_out;
  oa->valid_out = valid_out;
  oa->ids_out = ids_out;
  oa->K = K;
  oa->W = W;
  oa->me = me;
  oa->B = B;
  oa->I = I;
  oa->bt_rows = bt_rows;
  oa->bt_cols = bt_cols;
  oa->rcp_b = rcp_b;
  oa->rcp_i = rcp_i;
  oa->sh_b = dcpx_dev_log2_or32(B);
  oa->sh_i = dcpx_dev_log2_or32(I);
  oa->bts = NULL;
  oa->nbs = 0;
}

/* Round 2's key offsets (docs/PROTOCOL.md 5.5, rank-major): rank s
 * contributes its K-list if saturated, else its N-list's S1 entries;
 * off2[W] is the total. One thread writes; the caller synchronises. (The
 * NCCL transport's round 2, which reads unpadded lists from the buffer.) */
DCPX_D void dcpx_dev_round2_offsets(uint32_t *off2, uint32_t mask, uint32_t W,
                                    uint32_t K, uint32_t N) {
  uint32_t o = 0;
#pragma unroll 1
  for (uint32_t s = 0; s < W; s++) {
    off2[s] = o;
    o += ((mask >> s) & 1u) ? K : N;
  }
  off2[W] = o;
}

/* Outputs of row t from list[0..total) (entries r << 17 | l, in (r, l)
 * order); rank me's entries are list[base .. base + cnt). Each thread owns
 * entries p = tid + u * blockDim.x. */
DCPX_D void dcpx_dev_outputs(const dcpx_out_args *o, uint32_t t, int32_t req,
                          const uint32_t *list, uint32_t base, uint32_t cnt,
                          uint32_t total) {
  const uint32_t K = o->K, B = o->B, I = o->I;
  const int req_ok = req >= 0 && (uint32_t)req < o->bt_rows;
  const int32_t *bt = o->block_table + (uint64_t)(req_ok ? req : 0) * o->bt_cols;
  int32_t *ro = o->rows_out + (uint64_t)t * K;
  int32_t *io = o->ids_out ? o->ids_out + (uint64_t)t * K : NULL;
  int bad = 0;

  /* One rolled loop (a few iterations per thread): this phase runs once
   * per row, cold, and Nsight Compute showed its unrolled form waiting
   * mostly for instruction fetch; the block-table loads hit L1 (the row
   * start prefetched the request's row). */
#pragma unroll 1
  for (uint32_t p = threadIdx.x; p < K; p += blockDim.x) {
    if (io) {
      int32_t g = -1;
      if (p < total) {
        const uint32_t x = list[p], l = x & 0x1FFFFu;
        const uint32_t q = dcpx_dev_div_sh(l, I, o->rcp_i, o->sh_i);
        g = (int32_t)(q * I * o->W + (x >> 17) * I + (l - q * I));
      }
      io[p] = g;
    }
    int32_t v = -1;
    if (p < cnt) {
      const uint32_t l = list[base + p] & 0x1FFFFu;
      const uint32_t col = dcpx_dev_div_sh(l, B, o->rcp_b, o->sh_b);
      if (req_ok && col < o->bt_cols) {
        const int32_t blk = col < o->nbs ? o->bts[col] : __ldg(bt + col);
        const int64_t kv = (int64_t)blk * B + (l - col * B);
        if (blk < 0 || kv > INT32_MAX)
          bad = 1;
        v = (int32_t)kv;
      } else {
        bad = 1;
      }
    }
    ro[p] = v;
  }
  /* A request outside the table, or an own element outside it, costs the
   * row its rows_out and valid_out (as the host backend does), never a
   * wild read; ids_out stays. */
  const int anybad = __syncthreads_or(bad || !req_ok);
  if (anybad) {
#pragma unroll 1
    for (uint32_t p = threadIdx.x; p < K; p += blockDim.x)
      ro[p] = -1;
  }
  if (threadIdx.x == 0)
    o->valid_out[t] = anybad ? -1 : (int32_t)cnt;
}

#endif /* DCPX_DEVICE_CUH */
