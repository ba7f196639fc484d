/* roofline.c - what bounds the push and the merge (issue 11: "report the
 * roofline beside each figure"): each kernel's resources (registers,
 * spills, shared memory, blocks per SM), the copy bandwidth measured on
 * this GPU for one block (a row is one block, on one SM) and for the whole
 * GPU, what the merge poll's 16-byte loads cost alone by load kind, and
 * each kernel's bytes per row with the time those bytes take at the
 * measured bandwidth. The kernels' own figures come from bench_kernels
 * in the same job (scripts/gpu-run.sh step roofline). Shape: W=8 ranks,
 * N=512, K=2048, B=64, local 16,384 (bench_kernels' first rows), or
 * BENCH_W / BENCH_N / BENCH_LEN. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu_group.h"
#include "gpu_tools.h"

#define ITERS 20u
#define REPS 5u

static int cmp_f(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Median us per copy of `bytes` by `blocks` blocks of `threads` threads:
 * REPS graph replays of ITERS copies each (the launch included). */
static double copy_us(void *src, void *dst, size_t bytes, uint32_t blocks,
                      uint32_t threads, cudaStream_t s) {
  cudaGraph_t gr;
  cudaGraphExec_t ge;
  cudaEvent_t a, b;
  float ms[REPS];
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < ITERS; i++)
    KCK(dcpx_k_copy(src, dst, bytes / 16u, blocks, threads, s));
  CK(cudaStreamEndCapture(s, &gr));
  CK(cudaGraphInstantiate(&ge, gr, 0));
  CK(cudaGraphDestroy(gr));
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  for (uint32_t r = 0; r < REPS; r++) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms[r], a, b));
  }
  qsort(ms, REPS, sizeof(float), cmp_f);
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  return 1000.0 * ms[REPS / 2] / ITERS;
}

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void res_row(const char *what, const dcpx_k_res *r) {
  printf("| %s | %u | %d | %d | %d | %zu | %d |\n", what, r->threads,
         r->regs, r->local_bytes, r->static_smem, r->dyn_smem,
         r->blocks_per_sm);
}

/* The merge's round-1 poll moves W lists of `pairs` 16-byte pairs into
 * shared memory (264 threads, 8 pairs each at W=8, N=512). What those
 * loads cost alone, by load kind and by how many threads share them:
 * median over REPS launches of thread 0's cycles from before its loads to
 * the barrier after everyone's, the first pass (the words in L2) and a
 * second pass over the same words. */
static void poll_loads(const void *src, cudaStream_t s) {
  static const char *kinds[4] = {"ld.volatile (the poll's)",
                                 "ld.relaxed.gpu", "ld.global.cg",
                                 "ld.global (L1)"};
  static const uint32_t shapes[3][2] = {{264, 8}, {512, 4}, {1024, 2}};
  unsigned long long *out, h[3];
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  CK(cudaMalloc((void **)&out, sizeof(h)));
  printf("\nThe poll's loads alone (one block; each thread's words all "
         "loaded before any is used, then staged into shared memory or "
         "not; us at %d MHz, median of %u launches: first pass / a second "
         "pass over the same words):\n\n| load | threads x words | bytes "
         "| loads only | loads, staged |\n|---|---|---:|---:|---:|\n",
         khz / 1000, REPS);
  for (int k = 0; k < 4; k++)
    for (int sh = 0; sh < 3; sh++) {
      const uint32_t nt = shapes[sh][0], per = shapes[sh][1];
      printf("| %s | %u x %u | %u |", kinds[k], nt, per, nt * per * 16u);
      for (int stage = 0; stage < 2; stage++) {
        double c0[REPS], c1[REPS];
        KCK(dcpx_k_loadlat(src, nt, per, k, stage, 2, out, s)); /* warm */
        for (uint32_t r = 0; r < REPS; r++) {
          CK(cudaMemsetAsync(out, 0, sizeof(h), s));
          KCK(dcpx_k_loadlat(src, nt, per, k, stage, 2, out, s));
          CK(cudaMemcpyAsync(h, out, sizeof(h), cudaMemcpyDeviceToHost, s));
          CK(cudaStreamSynchronize(s));
          c0[r] = (double)h[0] * 1000.0 / khz;
          c1[r] = (double)h[1] * 1000.0 / khz;
        }
        qsort(c0, REPS, sizeof(double), cmp_d);
        qsort(c1, REPS, sizeof(double), cmp_d);
        printf(" %.2f / %.2f |", c0[REPS / 2], c1[REPS / 2]);
      }
      printf("\n");
    }
  CK(cudaFree(out));
}

int main(void) {
  const uint32_t K = 2048, B = 64, R = 256;
  const uint32_t W = gg_env_u32("BENCH_W", 1, 8, 8);
  const uint32_t N = gg_env_u32("BENCH_N", 1, K - 1, 512);
  const uint32_t L = gg_env_u32("BENCH_LEN", 1024, 131072, 16384);
  struct cudaDeviceProp prop;
  const int skip = gg_gpu0(&prop);
  if (skip)
    return skip;
  gg g;
  gg_init(&g, W, R, R, N, K, B, 1, L, L, 0, 0);

  printf("## What bounds the push and the merge on %s (%d SMs)\n\n",
         prop.name, prop.multiProcessorCount);
  printf("W=%u, N=%u, K=%u, local %u.\n\n", W, N, K, L);
  printf("| kernel | threads | registers | local bytes (spills, local "
         "arrays) | static "
         "smem | dynamic smem | blocks/SM |\n|---|---:|---:|---:|---:|---:|"
         "---:|\n");
  dcpx_k_res r;
  KCK(dcpx_k_push_res(&g.kc[0], DCPX_K_PUSH_THREADS, &r));
  res_row("push", &r);
  KCK(dcpx_k_push_res(&g.kc[0], DCPX_K_PUSH_THREADS / 2, &r));
  res_row("push, half blocks", &r);
  KCK(dcpx_k_merge_res(&g.kc[0], DCPX_K_MERGE_THREADS, &r));
  res_row("merge", &r);
  KCK(dcpx_k_merge_res(&g.kc[0], DCPX_K_MERGE_THREADS / 2, &r));
  res_row("merge, half blocks", &r);

  /* The copy bandwidth: one block (one SM) at the kernels' block sizes,
   * and the whole GPU (4 blocks per SM, and cudaMemcpy). */
  const size_t big = (size_t)1 << 30, sm_big = (size_t)16 << 20;
  void *src, *dst;
  cudaStream_t s;
  CK(cudaMalloc(&src, big));
  CK(cudaMalloc(&dst, big));
  CK(cudaMemset(src, 1, big));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double row_b = 2.0 * L;
  printf("\nCopy bandwidth (median of %u graph replays of %u copies, the "
         "launch included; GB/s copied, each byte read once and written "
         "once):\n\n| copy | bytes | us per copy | GB/s |\n"
         "|---|---:|---:|---:|\n", REPS, ITERS);
  const uint32_t nts[2] = {DCPX_K_MERGE_THREADS, DCPX_K_PUSH_THREADS};
  double sm_bw = 0;
  for (int i = 0; i < 2; i++) {
    const double t1 = copy_us(src, dst, (size_t)row_b, 1, nts[i], s);
    const double tb = copy_us(src, dst, sm_big, 1, nts[i], s);
    printf("| one block of %u threads, a row | %.0f | %.2f | %.1f |\n",
           nts[i], row_b, t1, row_b / t1 / 1e3);
    printf("| one block of %u threads | %zu | %.1f | %.1f |\n", nts[i],
           sm_big, tb, (double)sm_big / tb / 1e3);
    if (2.0 * (double)sm_big / tb / 1e3 > sm_bw) /* read + written */
      sm_bw = 2.0 * (double)sm_big / tb / 1e3;
  }
  const double tg = copy_us(src, dst, big, 4u * (uint32_t)prop.multiProcessorCount,
                            1024, s);
  printf("| %d blocks of 1024 threads | %zu | %.1f | %.1f |\n",
         4 * prop.multiProcessorCount, big, tg, (double)big / tg / 1e3);
  cudaEvent_t a, b;
  float ms = 0;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaMemcpyAsync(dst, src, big, cudaMemcpyDeviceToDevice, s));
  CK(cudaEventRecord(a, s));
  CK(cudaMemcpyAsync(dst, src, big, cudaMemcpyDeviceToDevice, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  CK(cudaEventElapsedTime(&ms, a, b));
  printf("| cudaMemcpyAsync, device to device | %zu | %.1f | %.1f |\n", big,
         1000.0 * ms, (double)big / (1000.0 * ms) / 1e3);
  const double gpu_bw = 2.0 * (double)big / tg / 1e3; /* read + written */

  poll_loads(src, s);

  /* Bytes per row: what each kernel must read and write at the least. */
  const double P = g.L.pairs, PK = g.L.rpairs;
  const double push_b = row_b + (double)W * P * 16.0;
  const double merge_b = (double)W * P * 16.0 + 2.0 * 4.0 * K + 8.0 +
                         4.0 * K / B;
  const double resc_b = row_b + (double)(W - 1) * PK * 16.0 + PK * 16.0;
  printf("\nBytes per row (read and written) and what they take at the "
         "measured traffic, twice the copy rate (one SM: %.1f GB/s; the "
         "GPU: %.1f GB/s), us:\n\n| kernel | bytes "
         "per row | one row at one SM | 64 rows | 256 rows |\n|---|---:|"
         "---:|---:|---:|\n", sm_bw, gpu_bw);
  const struct {
    const char *what;
    double bytes;
  } k[3] = {{"push: the row's logits, W lists of LL pairs", push_b},
            {"merge: W lists, rows_out and ids_out, the block table",
             merge_b},
            {"rescue, worst case (its row, a K-entry list to W - 1 peers, "
             "one list polled)",
             resc_b}};
  for (int i = 0; i < 3; i++) {
    const double one = k[i].bytes / sm_bw / 1e3;
    /* rows at a time: one per SM until the SMs run out, then the GPU */
    const double at = k[i].bytes * 64.0 / gpu_bw / 1e3;
    const double at2 = k[i].bytes * 256.0 / gpu_bw / 1e3;
    printf("| %s | %.0f | %.2f | %.2f | %.2f |\n", k[i].what, k[i].bytes, one,
           one > at ? one : at, one > at2 ? one : at2);
  }
  printf("\nA row is one block on one SM, so one SM's bandwidth bounds a "
         "row's bytes; with more rows than SMs, the GPU's. The launch (the "
         "launch floor in bench_kernels) and one memory latency come on "
         "top.\n");
  CK(cudaFree(src));
  CK(cudaFree(dst));
  CK(cudaStreamDestroy(s));
  gg_free(&g);
  return 0;
}
