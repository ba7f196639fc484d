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
 *                  Random rows: no rescue. The notes also give the same
 *                  merges back to back (DCPX_K_DIAG_KEEP_EPOCH: no memset
 *                  between them), since the memset's transitions cost
 *                  0.6-0.9 us per launch that the subtraction leaves in.
 *   merge+rescue   the same with rank 0 dominating every row: rank 0 is
 *                  saturated, recomputes its top-K, pushes it to all 8
 *                  rescue areas, sets the flags and runs round 2.
 *   floor          (notes) a kernel of the merge's launch shape (blocks,
 *                  threads, dynamic shared memory) and of the push's that
 *                  only loads, passes a barrier and stores: timed like the
 *                  merge (with the epoch memset), it is what a launch
 *                  costs in this graph before any row work.
 *   e2e            a whole call: all 8 ranks' push then merge, 8 streams
 *                  forked from and joined to one, merge grids capped so that
 *                  all 8 are resident (8 ranks share one GPU here, so this
 *                  is not what 8 GPUs would see).
 *
 * Output: a markdown table on stdout. BENCH_ITERS / BENCH_REPS override the
 * counts; BENCH_LEN / BENCH_ROWS run only that local length / row count;
 * BENCH_QUICK=1 times push and merge only; BENCH_W (2 .. 8) and BENCH_N
 * set W and N (e.g. W=2, N=1280: two ranks' whole calls on one GPU, where
 * a skewed row rescues with T1 > 0). BENCH_FLOOR_SWEEP=1 times only the
 * launch floor by block size and dynamic shared memory (bench_floor_sweep).
 * BENCH_NO_IDS=1: merges without ids_out (a DCP engine needs only its own
 * rows_out), else with it.
 */
#include <stdarg.h>

#include "gpu_group.h"
#include "gpu_tools.h"

static uint32_t g_iters = 20, g_reps = 15;
static double g_min, g_max; /* of the last time_graph, us per iteration */

static uint64_t xs_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t xs(void) {
  uint64_t x = xs_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return xs_state = x;
}

/* Random finite bf16 around +-[2^-7, 2^3). mode 0: every rank alike (rescue
 * rare); FILL_SKEW: rank 0's values are one binade larger, so it holds
 * about half of the top K and is saturated on every row, with fewer than K
 * elements >= T1 (its rescue list is a filter of its row: the realistic
 * rescue); FILL_DOMINANT: rank 0's are positive and 2^10 larger, so all
 * of its row is >= T1 and its rescue needs its whole top K (the worst
 * case). FILL_CLUSTER (the push only): every rank alike, but the last
 * 1/16 of each row is 8x larger, so a row's top N lies in one contiguous
 * window (a recent-token window scoring high), in a few warps' ranges of
 * the push's row pass. BENCH_SKEW_FEW=X: FILL_SKEW boosts only about X
 * elements of rank 0's row (every (local / X)-th) above every other
 * rank's values, the rest like the others': with X a little above N,
 * rank 0 is saturated with a rescue list of about X entries plus its
 * share of the rest (a rescue where one rank holds slightly more than N
 * of the top K, as in DCP rows that rescue). */
enum { FILL_PLAIN, FILL_SKEW, FILL_DOMINANT, FILL_CLUSTER };
static void fill(gg *g, uint32_t rows, int mode) {
  const char *fe = getenv("BENCH_SKEW_FEW");
  const uint32_t few = fe ? (uint32_t)atoi(fe) : 0;
  const uint32_t every = few ? (g->sh.max_local / few ? g->sh.max_local / few : 1) : 0;
  for (uint32_t r = 0; r < g->W; r++) {
    for (uint32_t t = 0; t < rows; t++) {
      uint16_t *row = g->h_logits[r] + g->lofs + (uint64_t)t * g->stride;
      g->h_ends[r][t] = (int32_t)g->sh.max_local;
      for (uint32_t l = 0; l < g->sh.max_local; l += 4) {
        uint64_t x = xs();
        for (uint32_t k = 0; k < 4 && l + k < g->sh.max_local; k++) {
          uint32_t b = (uint32_t)(x >> (16 * k));
          uint32_t exp = 120 + (b >> 8) % 10, sign = (b >> 15) & 1;
          if (mode == FILL_SKEW && r == 0 && !few)
            exp += 1;
          if (mode == FILL_SKEW && r == 0 && few && (l + k) % every == 0)
            exp = 131;
          if (mode == FILL_DOMINANT && r == 0) {
            exp += 10;
            sign = 0;
          }
          if (mode == FILL_CLUSTER &&
              l + k >= g->sh.max_local - g->sh.max_local / 16u)
            exp += 3;
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
  g_min = 1000.0 * ms[0] / g_iters;
  g_max = 1000.0 * ms[g_reps - 1] / g_iters;
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
    gg_push(g, 0);
  cudaGraphExec_t ge = end_capture(s);
  double us = time_graph(ge, s);
  CK(cudaGraphExecDestroy(ge));
  return us;
}

/* Rank 0's merge over lists every rank pushed once, epochs reset after
 * each merge. Returns us per merge; *ret_rescued: rows that rescued;
 * g_merge_b2b: us per merge of the same merges back to back. */
static double g_merge_b2b;

static double bench_merge(gg *g, uint32_t *ret_rescued) {
  cudaStream_t s = g->st[0];
  const size_t eb = 4 * (size_t)g->rows;
  for (uint32_t r = 0; r < g->W; r++)
    CK(cudaMemset(g->ws[r], 0, g->L.ws_bytes));
  CK(cudaDeviceSynchronize()); /* the streams do not wait for the null one */
  for (uint32_t r = 0; r < g->W; r++)
    gg_push(g, r);
  CK(cudaDeviceSynchronize());
  char *ep = g->ws[0] + g->L.off_epoch;

  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++) {
    gg_merge(g, 0);
    CK(cudaMemsetAsync(ep, 0, eb, s));
  }
  cudaGraphExec_t ge = end_capture(s);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++)
    CK(cudaMemsetAsync(ep, 0, eb, s));
  cudaGraphExec_t ge0 = end_capture(s);

  double us = time_graph(ge, s) - time_graph(ge0, s);
  /* The same merges back to back, each leaving the epochs as it found
   * them (DCPX_K_DIAG_KEEP_EPOCH): no memset between launches, whose
   * transitions the subtraction above does not remove. */
  const uint32_t diag = g->kc[0].diag;
  g->kc[0].diag |= DCPX_K_DIAG_KEEP_EPOCH;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++)
    gg_merge(g, 0);
  cudaGraphExec_t ge1 = end_capture(s);
  g->kc[0].diag = diag;
  g_merge_b2b = time_graph(ge1, s);
  CK(cudaGraphExecDestroy(ge1));
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

/* The launch floor of rank 0's merge (push: 0) shape at g->rows rows, in
 * the graph pattern of bench_merge (each launch followed by the epoch
 * memset, the memsets' own graph subtracted) or of bench_push (launches
 * back to back): us per launch. */
static double bench_floor(gg *g, int push) {
  cudaStream_t s = g->st[0];
  const size_t eb = 4 * (size_t)g->rows;
  uint32_t *ep = (uint32_t *)(g->ws[0] + g->L.off_epoch);
  const uint32_t nt = push ? dcpx_k_push_threads(&g->kc[0], g->rows)
                           : dcpx_k_merge_threads(&g->kc[0], g->rows);
  const size_t smem =
      push ? dcpx_k_push_smem(&g->kc[0]) : dcpx_k_merge_smem(&g->kc[0]);
  double us0 = 0;
  KCK(dcpx_k_floor_prepare(smem));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++) {
    KCK(dcpx_k_floor(ep, g->rows, nt, smem, s));
    if (!push)
      CK(cudaMemsetAsync(ep, 0, eb, s));
  }
  cudaGraphExec_t ge = end_capture(s);
  if (!push) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (uint32_t i = 0; i < g_iters; i++)
      CK(cudaMemsetAsync(ep, 0, eb, s));
    cudaGraphExec_t ge0 = end_capture(s);
    us0 = time_graph(ge0, s);
    CK(cudaGraphExecDestroy(ge0));
  }
  const double us = time_graph(ge, s) - us0;
  CK(cudaGraphExecDestroy(ge));
  return us;
}

/* BENCH_FLOOR_SWEEP=1: what a launch costs by block shape and dynamic
 * shared memory, in three graph patterns: the floor kernel back to back;
 * each launch followed by a 1 KiB memset (the memsets' own graph
 * subtracted: bench_merge's pattern); and alternating with a push-shaped
 * launch (1024 threads, `psmem` bytes; that kernel's back-to-back figure
 * subtracted: a call's push then merge). Prints a markdown table, us per
 * launch. */
static void floor_graph(uint32_t *w, uint32_t rows, uint32_t nt, size_t smem,
                        int pattern, size_t psmem, cudaStream_t s,
                        double *ret) {
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < g_iters; i++) {
    if (pattern == 2)
      KCK(dcpx_k_floor(w, rows, 1024, psmem, s));
    KCK(dcpx_k_floor(w, rows, nt, smem, s));
    if (pattern == 1)
      CK(cudaMemsetAsync(w + 256, 0, 1024, s));
  }
  cudaGraphExec_t ge = end_capture(s);
  *ret = time_graph(ge, s);
  CK(cudaGraphExecDestroy(ge));
}

static void bench_floor_sweep(size_t psmem) {
  const uint32_t rowsv[] = {1, 64, 132};
  const uint32_t ntv[] = {256, 512, 1024};
  const size_t smemv[] = {16, 16384, 49152, 100352, 115712, 200704};
  uint32_t *w;
  cudaStream_t s;
  double ms0, p0;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc((void **)&w, 4096));
  CK(cudaMemset(w, 0, 4096));
  KCK(dcpx_k_floor_prepare(smemv[5]));
  printf("\n### Launch floor by shape (BENCH_FLOOR_SWEEP; us per launch, "
         "median of %u replays of %u)\n\n", g_reps, g_iters);
  printf("| rows | threads | dyn smem | back to back | with memset (memsets "
         "subtracted) | after a push-shaped launch (that one subtracted) |\n");
  printf("|---:|---:|---:|---:|---:|---:|\n");
  for (size_t ri = 0; ri < 3; ri++) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (uint32_t i = 0; i < g_iters; i++)
      CK(cudaMemsetAsync(w + 256, 0, 1024, s));
    cudaGraphExec_t ge = end_capture(s);
    ms0 = time_graph(ge, s);
    CK(cudaGraphExecDestroy(ge));
    floor_graph(w, rowsv[ri], 1024, psmem, 0, psmem, s, &p0);
    for (size_t ti = 0; ti < 3; ti++)
      for (size_t si = 0; si < 6; si++) {
        double a, b, c;
        floor_graph(w, rowsv[ri], ntv[ti], smemv[si], 0, psmem, s, &a);
        floor_graph(w, rowsv[ri], ntv[ti], smemv[si], 1, psmem, s, &b);
        floor_graph(w, rowsv[ri], ntv[ti], smemv[si], 2, psmem, s, &c);
        printf("| %u | %u | %zu | %.2f | %.2f | %.2f |\n", rowsv[ri],
               ntv[ti], smemv[si], a, b - ms0, c - p0);
        fflush(stdout);
      }
  }
  printf("\nPush-shaped launch alone (1024 threads, %zu bytes): see the "
         "1024-thread rows' back-to-back column.\n", psmem);
  CK(cudaFree(w));
  CK(cudaStreamDestroy(s));
}

/* One more merge of rank 0 (after bench_merge: the same lists) with the
 * phase timestamps on; prints row 0's phases in us. */
static char g_notes[16384];

static void note(const char *fmt, ...) {
  const size_t n = strlen(g_notes);
  va_list ap;
  va_start(ap, fmt);
  if (n < sizeof(g_notes))
    vsnprintf(g_notes + n, sizeof(g_notes) - n, fmt, ap);
  va_end(ap);
}

/* Phase names of the merge's timestamps 1..9 (kernels/dcpx_kernels.h). */
static const char *const g_phase[10] = {
    "", "poll", "round 1", "rescue list", "rescue stores", "round-2 copy",
    "rescue poll", "round 2", "outputs", "end"};

/* One more push (push = 1) or merge of rank 0 with the phase timestamps
 * on (a merge's grid capped at max_blocks, 0: one block per row; its
 * epochs reset after it); returns every row's points (calloc'd,
 * [rows][DCPX_K_PROF_POINTS]). */
static unsigned long long *profiled_call(gg *g, int push,
                                         uint32_t max_blocks) {
  const size_t n = (size_t)g->sh.rows * DCPX_K_PROF_POINTS;
  unsigned long long *d = NULL;
  unsigned long long *hh = (unsigned long long *)calloc(n, 8);
  const uint32_t mb = g->kc[0].max_blocks;
  CK(cudaMalloc((void **)&d, n * 8));
  CK(cudaMemset(d, 0, n * 8));
  CK(cudaDeviceSynchronize());
  g->kc[0].prof = d;
  if (push) {
    gg_push(g, 0);
  } else {
    g->kc[0].max_blocks = max_blocks;
    gg_merge(g, 0);
  }
  CK(cudaStreamSynchronize(g->st[0]));
  g->kc[0].prof = NULL;
  g->kc[0].max_blocks = mb;
  CK(cudaMemcpy(hh, d, n * 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  if (!push)
    CK(cudaMemset(g->ws[0] + g->L.off_epoch, 0, 4 * (size_t)g->rows));
  CK(cudaDeviceSynchronize());
  return hh;
}

/* The phases 1..9 of one row's points q, then its total. */
static void note_phases(const unsigned long long *q, int khz) {
  unsigned long long prev = q[0];
  for (int i = 1; i < 10; i++) {
    if (!q[i])
      continue;
    note(" %s %.2f;", g_phase[i], (double)(q[i] - prev) * 1e3 / khz);
    prev = q[i];
  }
  note(" total %.2f", (double)(q[9] - q[0]) * 1e3 / khz);
}

/* Cold against warm code: the same merge with ONE block walking the rows,
 * so row 0 runs the kernel's code for the first time on its SM and rows
 * 1.. run it again (instruction caches warm). Prints rows 0-3's phases. */
static void profile_warm(gg *g, int khz) {
  unsigned long long *hh = profiled_call(g, 0, 1);
  for (uint32_t t = 0; t < 4; t++) {
    note("  one block, row %u (%s):", t, t ? "warm" : "cold");
    note_phases(hh + (size_t)t * DCPX_K_PROF_POINTS, khz);
    note("\n");
  }
  free(hh);
}

static void profile_merge(gg *g, const char *what) {
  unsigned long long h[DCPX_K_PROF_POINTS];
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  unsigned long long *all = profiled_call(g, 0, g->kc[0].max_blocks);
  memcpy(h, all, sizeof(h));
  note("- %s (us at %d MHz):", what, khz / 1000);
  note_phases(h, khz);
  note("; round 1 = threshold %.2f + placement %.2f + bounds "
       "and mask %.2f\n",
       (double)(h[10] - h[1]) * 1e3 / khz,
       (double)(h[11] - h[10]) * 1e3 / khz, (double)(h[2] - h[11]) * 1e3 / khz);
  if (h[14] && h[15])
    note("  kernel entry to row start %.2f, row end to kernel exit (call "
         "counters) %.2f, entry to exit %.2f\n",
         (double)(h[0] - h[14]) * 1e3 / khz, (double)(h[15] - h[9]) * 1e3 / khz,
         (double)(h[15] - h[14]) * 1e3 / khz);
  /* The other rows' blocks (no fault-hook or counter duty): entry to
   * row start and the row's total, mean over rows 1.. of their first row. */
  if (g->rows > 1) {
    double es = 0, tot = 0;
    uint32_t cnt = 0;
    for (uint32_t t = 1; t < g->rows; t++) {
      const unsigned long long *q = all + (size_t)t * DCPX_K_PROF_POINTS;
      if (!q[14] || !q[0] || !q[9])
        continue;
      es += (double)(q[0] - q[14]) * 1e3 / khz;
      tot += (double)(q[9] - q[0]) * 1e3 / khz;
      cnt++;
    }
    if (cnt)
      note("  rows 1..%u (mean of %u blocks): kernel entry to row start "
           "%.2f, row total %.2f\n",
           g->rows - 1, cnt, es / cnt, tot / cnt);
  }
  free(all);
  if (g->rows >= 4)
    profile_warm(g, khz);
  if (h[16] && h[17] && h[18] && h[19])
    note("  rescue poll: thread 0 polls %.2f, publishes %.2f, waits at the "
         "barrier %.2f; thread 480 from the section's start to its barrier "
         "%.2f (its start %.2f after thread 0's)\n",
         (double)(h[16] - h[5]) * 1e3 / khz, (double)(h[17] - h[16]) * 1e3 / khz,
         (double)(h[6] - h[17]) * 1e3 / khz, (double)(h[19] - h[18]) * 1e3 / khz,
         ((double)h[18] - (double)h[5]) * 1e3 / khz);
  if (h[12] && h[13])
    note("  rescue list from the row = start and count %.2f + thread 0's "
         "placing %.2f + the rest %.2f\n",
         (double)(h[12] - h[2]) * 1e3 / khz, (double)(h[13] - h[12]) * 1e3 / khz,
         (double)(h[3] - h[13]) * 1e3 / khz);
  if (h[12] && h[23] && h[2] < h[23] && h[23] < h[12])
    note("  start and count = thread 0 to its own count %.2f + the count's "
         "barrier and sum %.2f\n",
         (double)(h[23] - h[2]) * 1e3 / khz, (double)(h[12] - h[23]) * 1e3 / khz);
  if (h[3] && h[36] && h[37] && h[38] && h[39] && h[4] && h[36] < h[4])
    note("  stores beside the copy: from the list's end, the stores (first "
         "half) end at %.2f; the copy (second half) starts at %.2f, has its "
         "own rescue list at %.2f, its first warp's copy at %.2f (the last "
         "warp at %.2f); the barrier passes at %.2f\n",
         (double)(h[4] - h[3]) * 1e3 / khz, (double)(h[36] - h[3]) * 1e3 / khz,
         (double)(h[37] - h[3]) * 1e3 / khz, (double)(h[38] - h[3]) * 1e3 / khz,
         (double)(h[39] - h[3]) * 1e3 / khz, (double)(h[5] - h[3]) * 1e3 / khz);
  else if (h[4] && h[36] && h[37] && h[38] && h[39] && h[5])
    note("  round-2 copy = first barrier %.2f + own rescue list %.2f + "
         "thread 0's warp's copy %.2f (the last warp done at %.2f) + the rest "
         "%.2f\n",
         (double)(h[36] - h[4]) * 1e3 / khz, (double)(h[37] - h[36]) * 1e3 / khz,
         (double)(h[38] - h[37]) * 1e3 / khz,
         ((double)h[39] - (double)h[36]) * 1e3 / khz,
         (double)(h[5] - h[38]) * 1e3 / khz);
  if (h[12] && h[20] && h[21] && h[22] && h[13])
    note("  its top K from the row = key range %.2f + threshold %.2f + "
         "bases %.2f + placing %.2f\n",
         (double)(h[20] - h[12]) * 1e3 / khz, (double)(h[21] - h[20]) * 1e3 / khz,
         (double)(h[22] - h[21]) * 1e3 / khz, (double)(h[13] - h[22]) * 1e3 / khz);
}

/* Where one push of rank 0 goes (kctx.prof, thread 0 of row 0): its
 * phases, in us, on one line. */
static void profile_push(gg *g, const char *what) {
  static const char *const name[12] = {
      "", "entry to row start", "list: zeroing", "sample", "tau",
      "row pass", "counts", "threshold", "bases", "placing", "end of list",
      "LL stores"};
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  unsigned long long *hh = profiled_call(g, 1, 0);
  const unsigned long long *q = hh + DCPX_K_PROF_PUSH;
  note("- push, %s (us at %d MHz):", what, khz / 1000);
  unsigned long long prev = q[0];
  for (int i = 1; i < 12; i++) {
    if (!q[i])
      continue;
    note(" %s %.2f;", name[i], (double)(q[i] - prev) * 1e3 / khz);
    prev = q[i];
  }
  note(" total %.2f\n", (double)(prev - q[0]) * 1e3 / khz);
  free(hh);
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
      gg_push(g, r);
      gg_merge(g, r);
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
  const uint32_t K = 2048, B = 64, RMAX = 256;
  uint32_t W = 8;
  uint32_t N = 512;
  const uint32_t lens[] = {16384, 65536};
  const uint32_t rowsv[] = {1, 8, 64, 256};
  const char *e;

  g_iters = gg_env_u32("BENCH_ITERS", 1, 64, g_iters);
  g_reps = gg_env_u32("BENCH_REPS", 1, 64, g_reps);
  N = gg_env_u32("BENCH_N", 1, K - 1, N);
  W = gg_env_u32("BENCH_W", 2, 8, W);
  struct cudaDeviceProp prop;
  const int skip = gg_gpu0(&prop);
  if (skip)
    return skip;

  printf("## dcpx kernels on %s (%d SMs)\n\n", prop.name,
         prop.multiProcessorCount);
  const int no_ids = getenv("BENCH_NO_IDS") != NULL;
  printf("W=%u ranks on one GPU, N=%u, K=%u, B=%u, ids_out %s; median of %u "
         "graph replays of %u launches each, us per launch.\n\n",
         W, N, K, B, no_ids ? "off (BENCH_NO_IDS)" : "on", g_reps, g_iters);
  printf("| local | rows | push | merge | merge+rescue, skewed (rescued) | "
         "ratio | merge+rescue, dominant (rescued) | ratio | e2e call, "
         "rescue rare | e2e, every row rescues (skewed) | e2e, every row "
         "rescues (dominant) | merge blocks/rank | push, clustered |\n");
  printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  fflush(stdout);
  const uint32_t only_len = (e = getenv("BENCH_LEN")) ? (uint32_t)atoi(e) : 0;
  const uint32_t only_rows = (e = getenv("BENCH_ROWS")) ? (uint32_t)atoi(e) : 0;
  for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
    if (only_len && lens[li] != only_len)
      continue;
    gg g;
    gg_init(&g, W, RMAX, RMAX, N, K, B, 1, lens[li], lens[li], 0, 0);
    g.hdr->timeout_ns = 2000000000ull;
    g.no_ids = no_ids;
    if (getenv("BENCH_FLOOR_SWEEP")) {
      printf("| (BENCH_FLOOR_SWEEP: the sweep only; merge smem here %zu "
             "bytes at %u threads) |\n",
             dcpx_k_merge_smem(&g.kc[0]), dcpx_k_merge_threads(&g.kc[0], 1));
      bench_floor_sweep(dcpx_k_push_smem(&g.kc[0]));
      gg_free(&g);
      return 0;
    }
    for (size_t ri = 0; ri < sizeof(rowsv) / sizeof(rowsv[0]); ri++) {
      const uint32_t rows = rowsv[ri];
      if (only_rows && rows != only_rows)
        continue;
      uint32_t resc[3] = {0, 0, 0};
      double tm[3], te[3], tlo[3], thi[3], tp = 0, tpc;
      g.rows = RMAX;
      fill(&g, rows, FILL_CLUSTER);
      gg_upload(&g);
      g.rows = rows;
      gg_set_max_blocks(&g, 0);
      tpc = bench_push(&g);
      if (rows == 1) {
        char pw[32];
        snprintf(pw, sizeof(pw), "rows %u, clustered", rows);
        profile_push(&g, pw);
      }
      for (int mode = FILL_PLAIN; mode <= FILL_DOMINANT; mode++) {
        g.rows = RMAX;
        fill(&g, rows, mode);
        gg_upload(&g);
        g.rows = rows;
        gg_set_max_blocks(&g, 0);
        if (mode == FILL_PLAIN) {
          tp = bench_push(&g);
          if (rows == 1 || rows == 64) {
            char pw[32];
            snprintf(pw, sizeof(pw), "rows %u", rows);
            profile_push(&g, pw);
          }
        }
        tm[mode] = bench_merge(&g, &resc[mode]);
        note("Merge back to back (no memset between launches), local %u, "
             "rows %u, %s: %.2f us per launch (the table's, memset "
             "pattern: %.2f).\n",
             lens[li], rows,
             mode == FILL_PLAIN ? "plain" : mode == FILL_SKEW ? "skewed" : "dominant",
             g_merge_b2b, tm[mode]);
        if (mode == FILL_PLAIN) {
          const double fm = bench_floor(&g, 0), fp = bench_floor(&g, 1);
          note("Launch floor, local %u, rows %u: merge shape %.2f us, push "
               "shape %.2f us per launch (merge %.2f, push %.2f).\n",
               lens[li], rows, fm, fp, tm[mode], tp);
        }
        if (rows == 1 || rows == 64) {
          char what[64];
          snprintf(what, sizeof(what), "rows %u, %s", rows,
                   mode == FILL_PLAIN ? "plain" : mode == FILL_SKEW ? "skewed" : "dominant");
          profile_merge(&g, what);
        }
        /* Without rescue stores (DCPX_BENCH_DIAG bit 2) the peers of a
         * whole call would wait for lists that never come: merge only. */
        if (getenv("BENCH_QUICK") || (g.kc[0].diag & DCPX_K_DIAG_NO_RESCUE_STORES)) {
          te[mode] = tlo[mode] = thi[mode] = 0;
          continue;
        }
        gg_set_max_blocks(&g, gg_auto_max_blocks(&g));
        te[mode] = bench_e2e(&g);
        tlo[mode] = g_min;
        thi[mode] = g_max;
      }
      printf("| %u | %u | %.1f | %.1f%s | %.1f (%u/%u) | %.2f | %.1f (%u/%u) | "
             "%.2f | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) "
             "| %u | %.1f |\n",
             lens[li], rows, tp, tm[0], resc[0] ? " (some rescued)" : "",
             tm[1], resc[1], rows, tm[1] / tm[0], tm[2], resc[2], rows,
             tm[2] / tm[0], te[0], tlo[0], thi[0], te[1], tlo[1], thi[1],
             te[2], tlo[2], thi[2], gg_auto_max_blocks(&g), tpc);
      fflush(stdout);
    }
    g.rows = RMAX;
    gg_free(&g);
  }
  printf("\nPhases of one merge of rank 0, row 0 (clock64 of thread 0; a "
         "single launch, not a median):\n%s", g_notes);
  printf("\nTargets (H200, W=8, N=512, K=2048, rows <= 64): push <= 10 us, "
         "merge <= 6 us; merge+rescue <= 1.5 x merge. klist (the push keeps "
         "its top K): %s.\n",
         getenv("DCPX_KLIST") ? getenv("DCPX_KLIST")
                              : "auto (on when W*N <= K)");
  return 0;
}
