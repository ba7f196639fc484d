/* bench_rescue - how often rows rescue, measured with the CPU reference,
 * for the rule that picks N when a shape says local_topk = 0
 * (dcpx_shape_auto_local_topk).
 *
 *   bench_rescue [ROWS [LOCAL]]        (default 400 rows, local 4096)
 *
 * For each W in {2, 4, 8, 16} and K in {1024, 2048, 4096}, rows of
 * balanced logits (every rank's values i.i.d. normal, as with DCP's
 * token interleave) are merged by dcpx_ref_call at N = K/W + z * sd
 * (sd = sqrt(K/W * (1 - 1/W)), the spread of one rank's share of the top
 * K), rounded up to 32, for z in {1, 2, 3, 4}, and at the rule's N. Prints
 * the fraction of rows that rescued. A second column runs rows where one
 * rank's values are shifted up by one standard deviation (a "hot" rank):
 * those rescue whatever N is short of K, which no rule can avoid.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_args.h"

#include "dcpx.h"
#include "rng.h"

static double unif(uint64_t *s) {
  return (double)(dcpx_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Fraction of `rows` rows that rescued at shape (W, N, K), local L. */
static double rescue_rate(uint32_t W, uint32_t N, uint32_t K, uint32_t L,
                          uint32_t rows, double hot, uint64_t seed) {
  dcpx_shape sh = DCPX_SHAPE_INIT;
  sh.world = W;
  sh.rows = 16;
  sh.topk = K;
  sh.local_topk = N;
  sh.max_local = L;
  sh.block_size = L; /* one block per request: a one-entry table */
  uint16_t *lg[DCPX_MAX_WORLD];
  int32_t *ends[DCPX_MAX_WORLD];
  const uint16_t *lgc[DCPX_MAX_WORLD];
  const int32_t *endc[DCPX_MAX_WORLD];
  int32_t req[16] = {0}, bt[1] = {0}, valid[16];
  int32_t *rows_out = malloc(sizeof(int32_t) * 16 * K);
  dcpx_ref_stats st = {0, 0, 0};
  uint64_t s = seed;
  for (uint32_t r = 0; r < W; r++) {
    lg[r] = malloc(2 * (size_t)16 * L);
    ends[r] = malloc(4 * 16);
    lgc[r] = lg[r];
    endc[r] = ends[r];
  }
  for (uint32_t done = 0; done < rows; done += 16) {
    for (uint32_t r = 0; r < W; r++)
      for (uint32_t t = 0; t < 16; t++) {
        ends[r][t] = (int32_t)L;
        const double shift = (hot > 0 && r == t % W) ? hot : 0.0;
        for (uint32_t l = 0; l < L; l++) {
          double g = sqrt(-2.0 * log(unif(&s))) *
                     cos(6.283185307179586 * unif(&s));
          lg[r][(size_t)t * L + l] = to_bf16((float)(g + shift));
        }
      }
    dcpx_ref_in in = DCPX_REF_IN_INIT;
    dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
    in.rows = 16;
    in.stride = L;
    in.logits = lgc;
    in.row_ends = endc;
    in.req_id = req;
    in.block_table = bt;
    in.bt_rows = 1;
    in.bt_cols = 1;
    out.rows_out = rows_out;
    out.valid_out = valid;
    const int rc = dcpx_ref_call(&sh, &in, &out, &st);
    if (rc < 0) {
      fprintf(stderr, "dcpx_ref_call: %s\n", dcpx_strerror(rc));
      exit(2);
    }
  }
  for (uint32_t r = 0; r < W; r++) {
    free(lg[r]);
    free(ends[r]);
  }
  free(rows_out);
  return (double)st.rescue_rows / (double)st.rows;
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench_rescue [ROWS [LOCAL]]  (default 400 4096; ROWS "
             "1..1000000, LOCAL 1..%u)\n",
          DCPX_MAX_LOCAL);
}

int main(int argc, char **argv) {
  uint32_t rows, L;
  if (bench_wants_help(argc, argv)) {
    usage(stdout);
    return 0;
  }
  if (argc > 3 ||
      bench_arg_u32(argc, argv, 1, 400, 1, 1000000, "ROWS", &rows) < 0 ||
      bench_arg_u32(argc, argv, 2, 4096, 1, DCPX_MAX_LOCAL, "LOCAL", &L) < 0) {
    usage(stderr);
    return 2;
  }
  static const uint32_t Ws[] = {2, 4, 8, 16}, Ks[] = {1024, 2048, 4096};
  printf("rows %u per point, local %u, balanced i.i.d. normal logits; "
         "'hot': one rank shifted +1 sd\n\n",
         rows, L);
  printf("| W | K | N at z=1 | 2 | 3 | 4 | rule N | rescued at z=1 | z=2 | "
         "z=3 | z=4 | at the rule | at the rule, hot rank |\n"
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t ki = 0; ki < 3; ki++)
    for (size_t wi = 0; wi < 4; wi++) {
      const uint32_t W = Ws[wi], K = Ks[ki];
      uint32_t n[4];
      double f[4];
      for (int z = 1; z <= 4; z++) {
        const double m = (double)K / W, sd = sqrt(m * (1.0 - 1.0 / W));
        uint32_t v = ((uint32_t)ceil(m + z * sd) + 31u) & ~31u;
        if (v >= K)
          v = K - 1;
        n[z - 1] = v;
        f[z - 1] = rescue_rate(W, v, K, L, rows, 0, 1000u * W + K + z);
      }
      const uint32_t nr = dcpx_shape_auto_local_topk(W, K);
      const double fr = rescue_rate(W, nr, K, L, rows, 0, 7u * W + K);
      const double fh = rescue_rate(W, nr, K, L, rows, 1.0, 9u * W + K);
      printf("| %u | %u | %u | %u | %u | %u | %u | %.1f%% | %.1f%% | %.1f%% "
             "| %.1f%% | %.1f%% | %.1f%% |\n",
             W, K, n[0], n[1], n[2], n[3], nr, 100 * f[0], 100 * f[1],
             100 * f[2], 100 * f[3], 100 * fr, 100 * fh);
      fflush(stdout);
    }
  return 0;
}
