/* bench_ref - throughput of the CPU reference (dcpx_ref_call).
 *
 *   bench_ref [W [N [K [LOCAL [ROWS [REPS]]]]]]   (default 8 512 2048 16384
 *                                                 64 15)
 *
 * One call computes, for every row, all W ranks' local top-N lists, the
 * merge with its rescue round, and rank 0's outputs: the work one
 * verifying process does per call. Logits are random normal bf16 with a
 * quarter of the rows dominated by one rank (so the rescue runs). Prints
 * the median, min and max of REPS timed calls and rows per second; the
 * figures in bench/RESULTS.md come from this program.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_args.h"
#include "dcpx.h"
#include "rng.h"

static double unif(uint64_t *s) {
  return (double)(dcpx_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench_ref [W [N [K [LOCAL [ROWS [REPS]]]]]]  (default "
             "8 512 2048 16384 64 15; REPS 1..10000; the shape as "
             "dcpx_shape_check takes it)\n");
}

int main(int argc, char **argv) {
  uint32_t W, N, K, L, R, reps;
  if (bench_wants_help(argc, argv)) {
    usage(stdout);
    return 0;
  }
  if (argc > 7 || bench_arg_u32(argc, argv, 1, 8, 0, UINT32_MAX, "W", &W) < 0 ||
      bench_arg_u32(argc, argv, 2, 512, 0, UINT32_MAX, "N", &N) < 0 ||
      bench_arg_u32(argc, argv, 3, 2048, 0, UINT32_MAX, "K", &K) < 0 ||
      bench_arg_u32(argc, argv, 4, 16384, 0, UINT32_MAX, "LOCAL", &L) < 0 ||
      bench_arg_u32(argc, argv, 5, 64, 0, UINT32_MAX, "ROWS", &R) < 0 ||
      bench_arg_u32(argc, argv, 6, 15, 1, 10000, "REPS", &reps) < 0) {
    usage(stderr);
    return 2;
  }
  dcpx_shape sh = DCPX_SHAPE_INIT;
  uint64_t s = 42;

  sh.world = W;
  sh.rows = R;
  sh.topk = K;
  sh.local_topk = N;
  sh.block_size = 64;
  sh.interleave = 1;
  sh.max_local = L;
  char why[200];
  int r = dcpx_shape_explain(&sh, why, sizeof(why));
  if (r < 0) {
    fprintf(stderr, "bench_ref: bad shape: %s\n", why);
    return 2;
  }
  uint32_t bt_cols = (L + 63) / 64;
  uint16_t *lg[DCPX_MAX_WORLD];
  int32_t *en[DCPX_MAX_WORLD];
  int32_t *req = malloc(sizeof(int32_t) * R);
  int32_t *bt = malloc(sizeof(int32_t) * (size_t)R * bt_cols);
  int32_t *rows_out = malloc(sizeof(int32_t) * (size_t)R * K);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)R * K);
  int32_t *valid = malloc(sizeof(int32_t) * R);
  uint32_t *sat = malloc(sizeof(uint32_t) * R);
  double *times = malloc(sizeof(double) * (size_t)reps);
  if (!req || !bt || !rows_out || !ids || !valid || !sat || !times) {
    fprintf(stderr, "bench_ref: out of memory\n");
    return 1;
  }
  for (uint32_t t = 0; t < R; t++) {
    req[t] = (int32_t)t;
    for (uint32_t b = 0; b < bt_cols; b++)
      bt[(size_t)t * bt_cols + b] = (int32_t)(t * bt_cols + b);
  }
  for (uint32_t d = 0; d < W; d++) {
    lg[d] = malloc(sizeof(uint16_t) * (size_t)R * L);
    en[d] = malloc(sizeof(int32_t) * R);
    if (!lg[d] || !en[d]) {
      fprintf(stderr, "bench_ref: out of memory: %u ranks x %u rows x %u "
                      "logits need %.1f GiB\n", W, R, L,
              2.0 * W * R * (double)L / 1073741824.0);
      return 1;
    }
    for (uint32_t t = 0; t < R; t++) {
      double shift = (t % 4 == 0 && d == t % W) ? 3.0 : 0.0;
      en[d][t] = (int32_t)L;
      for (uint32_t l = 0; l < L; l++) {
        double g = sqrt(-2.0 * log(unif(&s) + 1e-300)) *
                   cos(6.283185307179586 * unif(&s));
        lg[d][(size_t)t * L + l] = to_bf16((float)(g + shift));
      }
    }
  }
  dcpx_ref_stats st = {0, 0, 0};
  dcpx_ref_in in = DCPX_REF_IN_INIT;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  in.rows = R;
  in.stride = L;
  in.logits = (const uint16_t *const *)lg;
  in.row_ends = (const int32_t *const *)en;
  in.req_id = req;
  in.block_table = bt;
  in.bt_rows = R;
  in.bt_cols = bt_cols;
  out.rows_out = rows_out;
  out.valid_out = valid;
  out.ids_out = ids;
  out.sat_word = sat;
  for (uint32_t i = 0; i < reps + 1; i++) {
    double t0 = now_s();
    r = dcpx_ref_call(&sh, &in, &out, i ? &st : NULL);
    double dt = now_s() - t0;
    if (r < 0) {
      fprintf(stderr, "bench_ref: %s\n", dcpx_strerror(r));
      return 1;
    }
    if (i)
      times[i - 1] = dt; /* call 0 warms the caches */
  }
  qsort(times, (size_t)reps, sizeof(double), cmp);
  double med = times[reps / 2];
  printf("bench_ref: W=%u N=%u K=%u local=%u rows=%u reps=%u\n", W, N, K, L,
         R, reps);
  printf("call median %.2f ms (min %.2f, max %.2f); %.0f rows/s; "
         "%.1f us/row; rescue rows %.1f%%\n",
         med * 1e3, times[0] * 1e3, times[reps - 1] * 1e3, R / med,
         med / R * 1e6,
         st.rows ? 100.0 * (double)st.rescue_rows / (double)st.rows : 0.0);
  for (uint32_t d = 0; d < W; d++) {
    free(lg[d]);
    free(en[d]);
  }
  free(req);
  free(bt);
  free(rows_out);
  free(ids);
  free(valid);
  free(sat);
  free(times);
  return 0;
}
