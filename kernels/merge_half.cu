/* merge_half.cu - the merge in half-size blocks (DCPX_K_MERGE_THREADS / 2
 * threads, two per SM: calls with more rows than one wave of full blocks
 * holds, dcpx_k_merge_threads). The same source as merge.cu, compiled
 * with 16 histogram buckets per lane in dcpx_dev_hist_find (a block of
 * 256 threads owns 4096 / 256 of them), which the full blocks' code does
 * not pay for. */
#define DCPX_HF_PER_MAX 16
#define DCPX_MERGE_HALF 1
#include "merge.cu"
