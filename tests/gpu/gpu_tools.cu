/* gpu_tools.cu - test-only kernels (tests/gpu/gpu_tools.h), never in
 * libdcpx: the LL one-way latency between two GPUs (tests/gpu/pingpong.c),
 * a start gate for multi-GPU timings (test_nccl --bench), and the launch
 * floor of bench_kernels (a kernel of a merge's or push's launch shape
 * that does nothing but one load, a barrier and one store per block).
 *
 * One thread per side, one launch per side for `iters` round trips. The
 * initiator stores a tagged 16-byte LL pair (dcpx_dev_ll_store: words i, ~i,
 * tag base + i in both halves, st.volatile.global.v2.u64) into the
 * responder's slot, in the responder's memory (a peer address, P2P), then
 * polls its own slot (dcpx_dev_ll_load, ld.volatile.global.v2.u64) until
 * both halves carry that tag; the responder polls its slot and answers with
 * the same pair into the initiator's slot. So a round trip is two remote
 * LL stores, each seen by a local volatile poll: exactly the LL path's
 * cost of one exchange (a store over the link, a poll in local memory).
 *
 * The initiator reads %globaltimer and clock64() before the first store and
 * after the last answer. Every poll gives up after timeout_ns of
 * %globaltimer (checked every 64 polls), so a launch always ends.
 *
 * out (device, this side's GPU), 4 uint64:
 *   [0] status: 0 ok, 1 timed out (then [3] is the round trip that failed),
 *       2 a pair with the right tag but wrong words
 *   [1] globaltimer ns from the first store to the last answer (initiator)
 *   [2] clock64 cycles over the same span (initiator)
 *   [3] round trips done
 */
#include "dcpx_device.cuh"
#include "gpu_tools.h"

__global__ void dcpx_pingpong_kernel(uint4 *mine, uint4 *peer, uint32_t iters,
                                     int initiator, uint32_t tag_base,
                                     uint64_t timeout_ns, uint64_t *out) {
  if (threadIdx.x != 0 || blockIdx.x != 0)
    return;
  uint64_t status = 0, done = 0;
  const uint64_t g0 = dcpx_dev_now();
  const long long c0 = clock64();
  for (uint32_t i = 0; i < iters; i++) {
    const uint32_t tag = tag_base + i; /* never 0: the caller's base >= 1 */
    if (initiator)
      dcpx_dev_ll_store(peer, i, ~i, tag);
    /* wait for pair i in my slot */
    uint64_t a, b, start = 0;
    uint32_t spins = 0;
    for (;;) {
      dcpx_dev_ll_load(mine, &a, &b);
      if ((uint32_t)(a >> 32) == tag && (uint32_t)(b >> 32) == tag)
        break;
      if ((++spins & 63u) == 0) {
        const uint64_t now = dcpx_dev_now();
        if (!start)
          start = now;
        else if (now - start > timeout_ns) {
          status = 1;
          break;
        }
      }
    }
    if (status)
      break;
    if ((uint32_t)a != i || (uint32_t)b != ~i) {
      status = 2;
      break;
    }
    if (!initiator)
      dcpx_dev_ll_store(peer, i, ~i, tag);
    done++;
  }
  const long long c1 = clock64();
  const uint64_t g1 = dcpx_dev_now();
  out[0] = status;
  out[1] = g1 - g0;
  out[2] = (uint64_t)(c1 - c0);
  out[3] = done;
}

int dcpx_k_pingpong(void *mine, void *peer, uint32_t iters, int initiator,
                    uint32_t tag_base, uint64_t timeout_ns, uint64_t *out,
                    cudaStream_t s) {
  if (!mine || !peer || !out || !iters || !tag_base ||
      (uint64_t)tag_base + iters > 0xFFFFFFFFull ||
      ((uintptr_t)mine & 15u) || ((uintptr_t)peer & 15u))
    return DCPX_E_INVAL;
  dcpx_pingpong_kernel<<<1, 32, 0, s>>>((uint4 *)mine, (uint4 *)peer, iters,
                                        initiator, tag_base, timeout_ns, out);
  if (cudaGetLastError() != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

/* ---- the start gate (tests/gpu/test_nccl.c --bench) ----------------------
 *
 * One thread spins on a host-mapped word until (int32_t)(*flag - value) >=
 * 0, or timeout_ns of %globaltimer: the host enqueues a gate, then timed
 * work, on every rank's stream, and releases all ranks at once with one
 * store, so launch skew between ranks stays out of the timings. */
__global__ void dcpx_gate_kernel(const uint32_t *flag, uint32_t value,
                                 uint64_t timeout_ns) {
  if (threadIdx.x != 0 || blockIdx.x != 0)
    return;
  const uint64_t t0 = dcpx_dev_now();
  uint32_t spins = 0;
  while ((int32_t)(dcpx_dev_ld_acquire_sys(flag) - value) < 0) {
    if ((++spins & 63u) == 0 && dcpx_dev_now() - t0 > timeout_ns)
      break;
  }
}

int dcpx_k_gate(const uint32_t *flag, uint32_t value, uint64_t timeout_ns,
                cudaStream_t s) {
  if (!flag)
    return DCPX_E_INVAL;
  dcpx_gate_kernel<<<1, 32, 0, s>>>(flag, value, timeout_ns);
  if (cudaGetLastError() != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

/* ---- the launch floor (tests/gpu/bench_kernels.c) -------------------------
 *
 * What a launch of the merge's (or push's) shape costs with no work in
 * it: block t loads word[t], every thread passes one barrier, thread 0
 * stores the word back. The bench times it in the same graph pattern as
 * the merge (with the epoch memset between launches), so the difference
 * between a merge and this floor is the merge's own row time. */
__global__ void dcpx_floor_kernel(uint32_t *word, uint32_t rows) {
  extern __shared__ uint32_t dyn_floor[];
  uint32_t v = 0;
  if (threadIdx.x == 0 && blockIdx.x < rows)
    v = word[blockIdx.x];
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x < rows) {
    dyn_floor[0] = v;
    word[blockIdx.x] = dyn_floor[0];
  }
}

int dcpx_k_floor_prepare(size_t smem) {
  if (cudaFuncSetAttribute(dcpx_floor_kernel,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           (int)smem) != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

int dcpx_k_floor(uint32_t *word, uint32_t rows, uint32_t threads,
                 size_t smem, cudaStream_t s) {
  if (!word || !rows || !threads || threads > 1024)
    return DCPX_E_INVAL;
  dcpx_floor_kernel<<<rows, threads, smem, s>>>(word, rows);
  if (cudaGetLastError() != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

/* ---- the copy bandwidth (tests/gpu/roofline.c) ---------------------------
 *
 * What the kernels' bytes could cost at best: `blocks` blocks of `threads`
 * threads copy n16 16-byte words from src to dst, each thread four words
 * in flight (all four loads issued before any store), the blocks taking
 * interleaved chunks. With one block it measures what one SM moves (a
 * push or merge row is one block); with many, the whole GPU. */
__global__ void dcpx_copy_kernel(const uint4 *src, uint4 *dst, size_t n16) {
  const size_t step = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * step < n16; i += 4 * step) {
    const uint4 a = src[i], b = src[i + step], c = src[i + 2 * step],
                d = src[i + 3 * step];
    dst[i] = a;
    dst[i + step] = b;
    dst[i + 2 * step] = c;
    dst[i + 3 * step] = d;
  }
  for (; i < n16; i += step)
    dst[i] = src[i];
}

int dcpx_k_copy(const void *src, void *dst, size_t n16, uint32_t blocks,
                uint32_t threads, cudaStream_t s) {
  if (!src || !dst || !blocks || !threads || threads > 1024)
    return DCPX_E_INVAL;
  dcpx_copy_kernel<<<blocks, threads, 0, s>>>((const uint4 *)src,
                                               (uint4 *)dst, n16);
  if (cudaGetLastError() != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}

/* ---- the poll's loads alone (tests/gpu/roofline.c) ------------------------
 *
 * One block of blockDim.x threads; thread x loads `per` 16-byte words of
 * src, x + j * blockDim.x (a warp's lanes take consecutive words, as the
 * merge's poll does), with the load kind `kind`, all issued before any is
 * used; then, with stage, stores them into shared memory as the poll
 * stages its pairs. `passes` times over the same words; out[p] = thread
 * 0's clock64 cycles of pass p, from before its loads to after the barrier
 * that follows the last thread's (out[passes]: a sum, so that nothing is
 * optimised away). The kinds: 0 ld.volatile.global.v2.u64 (the poll's), 1
 * ld.relaxed.gpu.global.v2.u64, 2 ld.global.cg.v4.u32 (L2, weak), 3
 * ld.global.v4.u32 (through L1, weak). */
#define DCPX_LOADLAT_PER 8
__device__ __forceinline__ uint4 dcpx_loadlat_one(const uint4 *p, int kind) {
  uint4 v;
  unsigned long long x, y;
  switch (kind) {
  case 0:
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(x), "=l"(y) : "l"(p) : "memory");
    v = make_uint4((uint32_t)x, (uint32_t)(x >> 32), (uint32_t)y,
                   (uint32_t)(y >> 32));
    break;
  case 1:
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(x), "=l"(y) : "l"(p) : "memory");
    v = make_uint4((uint32_t)x, (uint32_t)(x >> 32), (uint32_t)y,
                   (uint32_t)(y >> 32));
    break;
  case 2:
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    break;
  default:
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    break;
  }
  return v;
}

__global__ void dcpx_loadlat_kernel(const uint4 *src, uint32_t per, int kind,
                                    int stage, uint32_t passes,
                                    unsigned long long *out) {
  __shared__ uint4 st[2048]; /* 32 KiB: the 33.8 KB of W=8 lists, nearly */
  uint32_t sum = 0;
  for (uint32_t pass = 0; pass < passes; pass++) {
    __syncthreads();
    const long long t0 = clock64();
    uint4 v[DCPX_LOADLAT_PER];
#pragma unroll
    for (uint32_t j = 0; j < DCPX_LOADLAT_PER; j++)
      if (j < per)
        v[j] = dcpx_loadlat_one(src + threadIdx.x + j * blockDim.x, kind);
#pragma unroll
    for (uint32_t j = 0; j < DCPX_LOADLAT_PER; j++)
      if (j < per) {
        if (stage)
          st[(threadIdx.x + j * blockDim.x) & 2047u] = v[j];
        sum += v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
      }
    __syncthreads();
    if (threadIdx.x == 0)
      out[pass] = (unsigned long long)(clock64() - t0);
  }
  if (stage)
    sum += st[(threadIdx.x * 7u) & 2047u].x;
  atomicAdd(out + passes, (unsigned long long)sum);
}

int dcpx_k_loadlat(const void *src, uint32_t threads, uint32_t per, int kind,
                   int stage, uint32_t passes, unsigned long long *out,
                   cudaStream_t s) {
  if (!src || !out || !threads || threads > 1024 || !per ||
      per > DCPX_LOADLAT_PER || kind < 0 || kind > 3 || !passes)
    return DCPX_E_INVAL;
  dcpx_loadlat_kernel<<<1, threads, 0, s>>>((const uint4 *)src, per, kind,
                                            stage, passes, out);
  if (cudaGetLastError() != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}
