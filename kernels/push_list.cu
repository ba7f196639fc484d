/* push_list.cu - dcpx_push_list on the GPU: the push of docs/PROTOCOL.md
 * section 4.4 with the caller's lists (section 5.8) in place of a
 * selection, one block per row, written with the public device header
 * only (include/dcpx/device.cuh), as an engine kernel would be.
 *
 * Per row t: the list from values/indices[t][0 .. N), checked (indices
 * ascending and below row_end, no NaN, empties last) and
 * encoded into shared memory, then stored as LL pairs into every rank. A
 * bad row is stored nowhere and refuses the call: the rank raises its
 * alarm and sets FAILED (dcpx_device_refuse), dcpxd aborts the group, and
 * every merge of the call fails instead of computing something else.
 *
 * The ordering is dcpx_push's (push.cu): under PDL, wait for the stream's
 * earlier kernels (this rank's previous merge) before reading an epoch,
 * then let the merge launch at once; block 0 advances the call sequence
 * (the merge reads it after its own PDL wait). The merge reads no klist
 * after such a push (cuda.c merges with a klist-free context), and the
 * LL slots are all it needs from this kernel.
 */
#include <dcpx/device.cuh>

#include "dcpx_device.cuh" /* the host side's launch configurations only */

#define LT 256u /* threads per block: N <= 4095 entries, 16 per thread */

static __global__ void __launch_bounds__(LT)
    dcpx_push_list_kernel(const __grid_constant__ dcpx_device dev,
                          uint32_t rows, const uint16_t *values,
                          const int32_t *indices, const int32_t *row_ends) {
  extern __shared__ uint32_t words[]; /* [row_words] */
  const uint32_t N = dev.local_topk;

  dcpx_device_pdl_wait();
  dcpx_device_pdl_trigger();
  if (blockIdx.x == 0 && threadIdx.x == 0)
    dcpx_device_call_begin(&dev);

#pragma unroll 1
  for (uint32_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const dcpx_device_row dr = dcpx_device_row_begin(&dev, t); /* early */
    const int32_t re = row_ends[t];
    const uint32_t len =
        re < 0 ? 0u : ((uint32_t)re > dev.max_local ? dev.max_local
                                                    : (uint32_t)re);
    const uint64_t at = (uint64_t)t * N;
    if (dcpx_device_list_words(&dev, values + at, indices + at, len,
                               words)) {
      if (threadIdx.x == 0)
        dcpx_device_refuse(&dev);
      continue; /* list_words ended with a barrier: words are free */
    }
    dcpx_device_store_row_at(&dev, dr, t, words);
    __syncthreads(); /* words are rewritten by the next row */
  }
}

/* ---- host side ------------------------------------------------------------ */

int dcpx_k_push_list(const dcpx_kctx *c, uint32_t rows,
                     const uint16_t *values, const int32_t *indices,
                     const int32_t *row_ends, cudaStream_t s) {
  int r = dcpx_k_ctx_check(c);
  if (r < 0)
    return r;
  if (rows > c->rows_max || (rows && (!values || !indices || !row_ends)))
    return DCPX_E_INVAL;
  if (((uintptr_t)values & 1u) ||
      (((uintptr_t)indices | (uintptr_t)row_ends) & 3u))
    return DCPX_E_INVAL; /* misaligned: would fault in the kernel */
  dcpx_device dev;
  dcpx_k_device(c, &dev);
  cudaLaunchAttribute pdl;
  const uint32_t grid = rows ? rows : 1u; /* block 0 counts an empty call */
  const size_t smem = 4u * (size_t)dev.row_words;
  const cudaLaunchConfig_t cfg =
      c->pdl ? dcpx_launch_cfg_pdl(grid, LT, smem, s, &pdl)
             : dcpx_launch_cfg(grid, LT, smem, s);
  /* The launch's own status, not cudaGetLastError's (merge.cu). */
  if (cudaLaunchKernelEx(&cfg, dcpx_push_list_kernel, dev, rows, values,
                         indices, row_ends) != cudaSuccess)
    return DCPX_E_CUDA;
  return 0;
}
