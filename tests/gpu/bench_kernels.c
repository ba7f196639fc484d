/* bench_kernels.c - timings of the CUDA push and merge, W = 8 ranks on ONE
 * GPU, N = 512, K = 2048, local lengths 16384 and 65536, rows 1/8/64/256.
 *
 * Every number is the median over REPS replays of a CUDA graph holding
 * ITERS launches, divided by ITERS (so launch gaps inside a graph count,
 * host launch overhead does not):
 *
 *   push           rank 0's push alone (it stores into all 8 workspaces).
 *   merge          rank 0's merge alone, the other ranks' lists pushed
 *                  beforehand; each merge is followed by a memset that
 *                  resets rank 0's epochs (so the same lists are merged
 *                  again), and a graph of the memsets alone is subtracted.
 *                  Random rows: no rescue.
 *   merge+rescue   the same with rank 0 dominating every row: rank 0 is
 *                  saturated, recomputes its top-K, pushes it to all 8
 *                  rescue areas, sets the flags and runs round 2.
 *   e2e            a whole call: all 8 ranks' push then merge, 8 streams
 *                  forked from and joined to one, merge grids capped so that
 *                  all 8 are resident (8 ranks share one GPU here, so this
 *                  is not what 8 GPUs would see).
 *
 * Output: a markdown table on stdout. BENCH_ITERS / BENCH_REPS override the
 * counts; BENCH_LEN / BENCH_ROWS run only that local length / row count;
 * BENCH_QUICK=1 times push and merge only.
 */
#include "gpu_group.h"

static uint32_t g_iters = 20, g_reps = 15;

static uint64_t xs_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t xs(void) {
  uint64_t x = xs_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return xs_state = x;
}

/* Random finite bf16 around +-[2^-7, 2^3); a dominant rank's are positive
 * and 2^10 larger. */
static void fill(gg *g, uint32_t rows, int dominant0) {
  for (uint32_t r = 0; r < g->W; r++) {
    for (uint32_t t = 0; t < rows; t++) {
      uint16_t *row = g->h_logits[r] + g->lofs + (uint64_t)t * g->stride;
      g->h_ends[r][t] = (int32_t)g->sh.max_local;
      for (uint32_t l = 0; l < g->sh.max_local; l += 4) {
        uint64_t x = xs();
        for (uint32_t k = 0; k < 4 && l + k < g->sh.max_local; k++) {
          uint32_t b = (uint32_t)(x >> (16 * k));
          uint32_t exp = 120 + (b >> 8) % 10, sign = (b >> 15) & 1;
          if (dominant0 && r == 0) {
            exp += 10;
            sign = 0;
          }
          row[l + k] = (uint16_t)((sign << 15) | (exp << 7) | (b & 0x7F));
        }
      }
      g->h_req[r][t] = (int32_t)(t % g->bt_rows);
    }
    for (size_t i = 0; i < (size_t)g->bt_rows * g->bt_cols; i++)
      g->h_bt[r][i] = (int32_t)(i % 100000);
  }
}

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Median microseconds per iteration of graph `ge` replayed on s. */
static double time_graph(cudaGraphExec_t ge, cudaStream_t s) {
  cudaEvent_t a, b;
  float ms[64];
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 2; i++)
    CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  for (uint32_t i = 0; i < g_reps; i++) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms[i], a, b));
  }
  qsort(ms, g_reps, sizeof(float), cmp_f);
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 1000.0 * ms[g_reps / 2] / g_iters;
}

static cudaGraphExec_t end_capture(cudaStream_t s) {
  cudaGraph_t gr;
  cudaGraphExec_t ge;
  CK(cudaStreamEndCapture(s, &gr));
  CK(cudaGraphInstantiate(&ge, gr, 0));
  CK(cudaGraphDestroy(gr));
  return ge;
}

static double bench_push(gg *g) {
  cudaStream_t s = g->st[0];
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++)
    gg_push(g, 0, i);
  cudaGraphExec_t ge = end_capture(s);
  double us = time_graph(ge, s);
  CK(cudaGraphExecDestroy(ge));
  return us;
}

/* Rank 0's merge over lists every rank pushed once, epochs reset after
 * each merge. Returns us per merge; *ret_rescued: rows that rescued. */
static double bench_merge(gg *g, uint32_t *ret_rescued) {
  cudaStream_t s = g->st[0];
  const size_t eb = 4 * (size_t)g->rows;
  for (uint32_t r = 0; r < g->W; r++)
    CK(cudaMemset(g->ws[r], 0, g->L.ws_bytes));
  CK(cudaDeviceSynchronize()); /* the streams do not wait for the null one */
  for (uint32_t r = 0; r < g->W; r++)
    gg_push(g, r, 0);
  CK(cudaDeviceSynchronize());
  char *ep = g->ws[0] + g->L.off_epoch;

  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++) {
    gg_merge(g, 0, i);
    CK(cudaMemsetAsync(ep, 0, eb, s));
  }
  cudaGraphExec_t ge = end_capture(s);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++)
    CK(cudaMemsetAsync(ep, 0, eb, s));
  cudaGraphExec_t ge0 = end_capture(s);

  double us = time_graph(ge, s) - time_graph(ge0, s);
  CK(cudaDeviceSynchronize());
  if (g->hdr->abort || g->health[0].failed) {
    fprintf(stderr, "bench: rank 0 failed during the merge bench\n");
    _exit(2);
  }
  uint32_t *sat = (uint32_t *)calloc(g->rows, 4);
  CK(cudaMemcpy(sat, g->d_sat[0], eb, cudaMemcpyDeviceToHost));
  uint32_t n = 0;
  for (uint32_t t = 0; t < g->rows; t++)
    n += (sat[t] >> 16) != 0;
  free(sat);
  *ret_rescued = n;
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphExecDestroy(ge0));
  return us;
}

static double bench_e2e(gg *g) {
  cudaStream_t s = g->st[0];
  cudaEvent_t fork[64], join[64][DCPX_MAX_WORLD];
  for (uint32_t r = 0; r < g->W; r++)
    CK(cudaMemset(g->ws[r], 0, g->L.ws_bytes));
  CK(cudaDeviceSynchronize());
  for (uint32_t i = 0; i < g_iters; i++) {
    CK(cudaEventCreateWithFlags(&fork[i], cudaEventDisableTiming));
    for (uint32_t r = 0; r < g->W; r++)
      CK(cudaEventCreateWithFlags(&join[i][r], cudaEventDisableTiming));
  }
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++) {
    CK(cudaEventRecord(fork[i], s));
    for (uint32_t r = 1; r < g->W; r++)
      CK(cudaStreamWaitEvent(g->st[r], fork[i], 0));
    for (uint32_t r = 0; r < g->W; r++) {
      gg_push(g, r, i);
      gg_merge(g, r, i);
    }
    for (uint32_t r = 1; r < g->W; r++) {
      CK(cudaEventRecord(join[i][r], g->st[r]));
      CK(cudaStreamWaitEvent(s, join[i][r], 0));
    }
  }
  cudaGraphExec_t ge = end_capture(s);
  double us = time_graph(ge, s);
  CK(cudaDeviceSynchronize());
  for (uint32_t r = 0; r < g->W; r++)
    if (g->health[r].failed) {
      fprintf(stderr, "bench: rank %u failed during the e2e bench\n", r);
      _exit(2);
    }
  CK(cudaGraphExecDestroy(ge));
  for (uint32_t i = 0; i < g_iters; i++) {
    CK(cudaEventDestroy(fork[i]));
    for (uint32_t r = 0; r < g->W; r++)
      CK(cudaEventDestroy(join[i][r]));
  }
  return us;
}

int main(void) {
  const uint32_t W = 8, N = 512, K = 2048, B = 64, RMAX = 256;
  const uint32_t lens[] = {16384, 65536};
  const uint32_t rowsv[] = {1, 8, 64, 256};
  const char *e;
  int n = 0;

  if ((e = getenv("BENCH_ITERS")) && atoi(e) > 0 && atoi(e) <= 64)
    g_iters = (uint32_t)atoi(e);
  if ((e = getenv("BENCH_REPS")) && atoi(e) > 0 && atoi(e) <= 64)
    g_reps = (uint32_t)atoi(e);
  CK(cudaGetDeviceCount(&n));
  if (n < 1) {
    fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  KCK(dcpx_k_prepare());

  printf("## dcpx kernels on %s (%d SMs)\n\n", prop.name,
         prop.multiProcessorCount);
  printf("W=%u ranks on one GPU, N=%u, K=%u, B=%u, ids_out on; median of %u "
         "graph replays of %u launches each, us per launch.\n\n",
         W, N, K, B, g_reps, g_iters);
  printf("| local | rows | push | merge | merge+rescue (rescued rows) | "
         "e2e call, 8 ranks on 1 GPU (merge blocks/rank) |\n");
  printf("|---:|---:|---:|---:|---:|---:|\n");
  fflush(stdout);
  const uint32_t only_len = (e = getenv("BENCH_LEN")) ? (uint32_t)atoi(e) : 0;
  const uint32_t only_rows = (e = getenv("BENCH_ROWS")) ? (uint32_t)atoi(e) : 0;
  for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
    if (only_len && lens[li] != only_len)
      continue;
    gg g;
    gg_init(&g, W, RMAX, RMAX, N, K, B, 1, lens[li], lens[li], 0, 0);
    g.hdr->timeout_ns = 2000000000ull;
    for (size_t ri = 0; ri < sizeof(rowsv) / sizeof(rowsv[0]); ri++) {
      const uint32_t rows = rowsv[ri];
      if (only_rows && rows != only_rows)
        continue;
      g.rows = RMAX;
      fill(&g, rows, 0);
      gg_upload(&g);
      g.rows = rows;
      gg_set_max_blocks(&g, 0);
      double tp = bench_push(&g);
      uint32_t resc0 = 0, resc1 = 0;
      double tm = bench_merge(&g, &resc0);
      if (getenv("BENCH_QUICK")) {
        printf("| %u | %u | %.1f | %.1f | - | - |\n", lens[li], rows, tp, tm);
        fflush(stdout);
        continue;
      }
      g.rows = RMAX;
      fill(&g, rows, 1);
      gg_upload(&g);
      g.rows = rows;
      double tr = bench_merge(&g, &resc1);
      g.rows = RMAX;
      fill(&g, rows, 0);
      gg_upload(&g);
      g.rows = rows;
      const uint32_t mb = gg_auto_max_blocks(&g);
      gg_set_max_blocks(&g, mb);
      double te = bench_e2e(&g);
      printf("| %u | %u | %.1f | %.1f%s | %.1f (%u/%u) | %.1f (%u) |\n",
             lens[li], rows, tp, tm, resc0 ? " (rescued!)" : "", tr, resc1,
             rows, te, mb);
      fflush(stdout);
    }
    g.rows = RMAX;
    gg_free(&g);
  }
  printf("\nTargets (H200, W=8, N=512, K=2048, rows <= 64): push <= 10 us, "
         "merge <= 6 us.\n");
  return 0;
}
