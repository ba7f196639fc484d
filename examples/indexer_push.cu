/* indexer_push.cu - an engine's own kernel that pushes from its epilogue.
 *
 * A toy sparse-attention indexer, one block per query row t: it scores
 * q[t] . k[l] over this rank's KV (bf16 in, fp32 accumulate, bf16 out)
 * into logits[t][l] for l < row_end[t], selects the row's local top-N
 * exactly as docs/PROTOCOL.md section 2 defines it (its N best by ord16,
 * ties to the lower l), and, in FUSED mode, stores the list straight into
 * every rank's LL slots through include/dcpx/device.cuh. The engine then
 * launches dcpx_merge as after dcpx_push. What the kernel keeps of the
 * device header's contract:
 *
 *   1. It is launched on the stream of dcpx_merge, after the previous
 *      call's merge (stream order; no PDL attribute, so no wait needed).
 *   2. Block 0's thread 0 calls dcpx_device_call_begin, also for 0 rows
 *      (the grid is then one block); the kernel never triggers its
 *      dependents early, so the merge starts after its last logit.
 *   3. Each row is one block's, stored once by dcpx_device_store_row_at
 *      (its epoch and the stop word read at the kernel's start).
 *   4. The selection puts entry j at its rank in ascending l (below), so
 *      the list is ascending, unique, below row_end and NaN-free (scores
 *      are finite).
 *
 * The selection: a histogram of ord16 >> 8 finds the bucket of the N-th
 * best key, a second one over the low byte inside it finds the threshold
 * T and how many keys equal to T are taken (the first ones in l order).
 * Each thread then owns a contiguous run of l; a block scan of its counts
 * (> T, == T) gives every selected key its output position.
 */
#include <cuda_bf16.h>
#include <string.h>

#include <dcpx/device.cuh>

#include "indexer_push.h"

#define IT 512u     /* threads per block */
#define MAX_DIM 256u

/* Bucket of the need-th best key among hist[256] (counts per key byte),
 * by warp 0: *ret_b the bucket, *ret_above the keys in higher buckets,
 * *ret_total all keys. */
static __device__ void find_bucket(const uint32_t *hist, uint32_t need,
                                   uint32_t *ret_b, uint32_t *ret_above,
                                   uint32_t *ret_total) {
  const uint32_t lane = threadIdx.x & 31u;
  uint32_t c = 0;
  for (uint32_t i = 0; i < 8; i++)
    c += hist[lane * 8u + i];
  uint32_t incl = c; /* keys in this lane's bins and every higher lane's */
  for (uint32_t d = 1; d < 32; d <<= 1) {
    const uint32_t y = __shfl_down_sync(0xFFFFFFFFu, incl, d);
    if (lane + d < 32)
      incl += y;
  }
  const uint32_t above = incl - c;
  if (lane == 0)
    *ret_total = incl;
  if (above < need && need <= incl) {
    uint32_t acc = above;
    for (int i = 7; i >= 0; i--) {
      const uint32_t h = hist[lane * 8u + (uint32_t)i];
      if (acc + h >= need) {
        *ret_b = lane * 8u + (uint32_t)i;
        *ret_above = acc;
        break;
      }
      acc += h;
    }
  }
}

/* Exclusive block scan of v (every thread calls it). */
static __device__ unsigned long long block_excl(unsigned long long v,
                                                unsigned long long *scratch) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  unsigned long long incl = v;
  for (uint32_t d = 1; d < 32; d <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xFFFFFFFFu, incl, d);
    if (lane >= d)
      incl += y;
  }
  if (lane == 31)
    scratch[warp] = incl;
  __syncthreads();
  unsigned long long base = 0;
  for (uint32_t w = 0; w < warp; w++)
    base += scratch[w];
  __syncthreads();
  return base + incl - v;
}

typedef struct sel_smem {
  uint32_t hist[256];
  unsigned long long scan[IT / 32];
  uint32_t b, above, total, b2, above2;
} sel_smem;

/* The threshold of the row's top-N keys: T (0: every non-empty key) and
 * take (keys == T selected, first in l order); returns the count. */
static __device__ uint32_t select_top(sel_smem *S, const uint16_t *keys,
                                      uint32_t n, uint32_t N, uint32_t *T,
                                      uint32_t *take) {
  for (uint32_t i = threadIdx.x; i < 256; i += IT)
    S->hist[i] = 0;
  __syncthreads();
  for (uint32_t l = threadIdx.x; l < n; l += IT)
    if (keys[l])
      atomicAdd(&S->hist[keys[l] >> 8], 1u);
  __syncthreads();
  if (threadIdx.x < 32)
    find_bucket(S->hist, N, &S->b, &S->above, &S->total);
  __syncthreads();
  if (S->total <= N) {
    *T = 0;
    *take = 0;
    return S->total;
  }
  const uint32_t b = S->b, above = S->above;
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < 256; i += IT)
    S->hist[i] = 0;
  __syncthreads();
  for (uint32_t l = threadIdx.x; l < n; l += IT)
    if ((uint32_t)(keys[l] >> 8) == b)
      atomicAdd(&S->hist[keys[l] & 0xFFu], 1u);
  __syncthreads();
  if (threadIdx.x < 32)
    find_bucket(S->hist, N - above, &S->b2, &S->above2, &S->total);
  __syncthreads();
  *T = (b << 8) | S->b2;
  *take = N - above - S->above2;
  return N;
}

static __device__ float bf16_to_float(uint16_t b) {
  return __uint_as_float((uint32_t)b << 16);
}

template <int MODE>
static __global__ void __launch_bounds__(IT)
    ix_kernel(const __grid_constant__ dcpx_device dev, const ix_args a) {
  __shared__ float qs[MAX_DIM];
  __shared__ sel_smem S;
  extern __shared__ uint32_t dyn[];
  const uint32_t N = dev.local_topk, rw = dev.row_words;
  uint32_t *words = dyn;                     /* [rw] */
  uint16_t *keys = (uint16_t *)(dyn + rw);   /* [len] ord16 */

  if (MODE == IX_FUSED && blockIdx.x == 0 && threadIdx.x == 0)
    dcpx_device_call_begin(&dev);
  const uint32_t t = blockIdx.x;
  if (t >= a.rows)
    return;
  /* The epilogue's epoch and stop word, read now: their latency hides
   * behind the scoring. */
  dcpx_device_row dr = {0u, 0u};
  if (MODE == IX_FUSED)
    dr = dcpx_device_row_begin(&dev, t);
  const int32_t re = a.row_ends[t];
  const uint32_t n = re < 0 ? 0u : ((uint32_t)re > a.len ? a.len : (uint32_t)re);

  /* Scores. */
  for (uint32_t d = threadIdx.x; d < a.dim; d += IT)
    qs[d] = bf16_to_float(a.q[(uint64_t)t * a.dim + d]);
  if (MODE != IX_SCORE)
    dcpx_device_list_zero(&dev, words);
  __syncthreads();
  for (uint32_t l = threadIdx.x; l < n; l += IT) {
    const uint16_t *k = a.kv + (uint64_t)l * a.dim;
    float acc = 0.f;
    for (uint32_t d = 0; d < a.dim; d++)
      acc = __fmaf_rn(qs[d], bf16_to_float(k[d]), acc);
    const uint16_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(acc));
    a.logits[(uint64_t)t * a.len + l] = bits;
    keys[l] = (uint16_t)dcpx_device_ord16(bits);
  }
  if (MODE == IX_SCORE)
    return;
  __syncthreads();

  /* The local top-N, in ascending l. */
  uint32_t T, take;
  const uint32_t count = select_top(&S, keys, n, N, &T, &take);
  const uint32_t chunk = (n + IT - 1) / IT;
  const uint32_t lo = min(n, threadIdx.x * chunk), hi = min(n, lo + chunk);
  uint32_t gt = 0, eq = 0;
  for (uint32_t l = lo; l < hi; l++) {
    gt += keys[l] > T;
    eq += keys[l] == T && T;
  }
  const unsigned long long before =
      block_excl(((unsigned long long)gt << 32) | eq, S.scan);
  gt = (uint32_t)(before >> 32);
  eq = (uint32_t)before;
  for (uint32_t l = lo; l < hi; l++) {
    const uint32_t k = keys[l];
    const int sel = k > T || (k == T && T && eq < take);
    const uint32_t pos = gt + min(eq, take);
    gt += k > T;
    eq += k == T && T;
    if (!sel)
      continue;
    const uint16_t bits = a.logits[(uint64_t)t * a.len + l];
    if (MODE == IX_LISTS) {
      a.values[(uint64_t)t * N + pos] = bits;
      a.indices[(uint64_t)t * N + pos] = (int32_t)l;
    } else {
      dcpx_device_put_entry(&dev, words, pos, bits, l);
    }
  }
  if (MODE == IX_LISTS) {
    for (uint32_t j = count + threadIdx.x; j < N; j += IT) {
      a.values[(uint64_t)t * N + j] = 0;
      a.indices[(uint64_t)t * N + j] = -1;
    }
    return;
  }
  __syncthreads();
  if (MODE == IX_FUSED) /* the epilogue: the row into every rank */
    dcpx_device_store_row_at(&dev, dr, t, words);
  else if (a.sink)
    for (uint32_t i = threadIdx.x; i < rw; i += IT)
      a.sink[(uint64_t)t * rw + i] = words[i];
}

/* ---- host side ------------------------------------------------------------ */

static size_t ix_smem(const dcpx_device *dev, uint32_t len) {
  return 4u * (size_t)dev->row_words + 2u * (size_t)len + 16u;
}

template <int MODE> static int ix_attr(uint32_t len) {
  const int bytes = 4 * 4224 + 2 * (int)len + 16;
  return cudaFuncSetAttribute(ix_kernel<MODE>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes) == cudaSuccess
             ? 0
             : DCPX_E_CUDA;
}

extern "C" int ix_prepare(uint32_t len) {
  int r = ix_attr<IX_SCORE>(len);
  if (r == 0)
    r = ix_attr<IX_SELECT>(len);
  if (r == 0)
    r = ix_attr<IX_LISTS>(len);
  return r == 0 ? ix_attr<IX_FUSED>(len) : r;
}

extern "C" int ix_launch(enum ix_mode mode, const dcpx_device *dev,
                         const ix_args *a, cudaStream_t s) {
  if (a->dim > MAX_DIM || !dev || dev->row_words > 4224)
    return DCPX_E_INVAL;
  void (*k)(const dcpx_device, const ix_args) = NULL;
  switch (mode) {
  case IX_SCORE:
    k = ix_kernel<IX_SCORE>;
    break;
  case IX_SELECT:
    k = ix_kernel<IX_SELECT>;
    break;
  case IX_LISTS:
    k = ix_kernel<IX_LISTS>;
    break;
  case IX_FUSED:
    k = ix_kernel<IX_FUSED>;
    break;
  }
  if (!k)
    return DCPX_E_INVAL;
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.gridDim = dim3(a->rows ? a->rows : 1u);
  cfg.blockDim = dim3(IT);
  cfg.dynamicSmemBytes = ix_smem(dev, a->len);
  cfg.stream = s;
  /* The launch's own status: an engine's earlier, unrelated error (which
   * cudaPeekAtLastError would report) must not fail this call. */
  return cudaLaunchKernelEx(&cfg, k, *dev, *a) == cudaSuccess ? 0
                                                              : DCPX_E_CUDA;
}
