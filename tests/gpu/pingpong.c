/* pingpong.c - the LL one-way latency between two GPUs.
 *
 *   pingpong [--iters N] [--launches L] [--timeout-ms T]
 *
 * For every pair (GPU i, GPU j), i < j, with P2P access both ways (and,
 * with more than two GPUs, a matrix of them at the end): GPU j runs the
 * responder and GPU i the initiator of
 * tests/gpu/gpu_tools.cu (dcpx_k_pingpong), N round trips (default 10000) in
 * one launch per side, L launches (default 7) after one warm-up launch.
 * Each round trip is two LL pair stores over the link (st.volatile v2.u64
 * into the other GPU's memory), each seen by a volatile poll of local
 * memory. One-way latency = (GPU 0's %globaltimer span / N) / 2; the table
 * gives the median over the launches, and their min and max. Then, for
 * reference only, the same on ONE GPU (two streams of GPU 0, so both slots
 * are local): that is the floor of a poll seeing a store, without a link.
 *
 * Nothing may hang: every device poll gives up after T ms (default 1000),
 * and the host waits for each launch at most DCPX_TEST_LIMIT_S (default 30)
 * seconds, then exits 3. Exit 0: every pair answered every round trip; 1:
 * a pair failed (timeout or wrong words); 2: setup error; 77: fewer than
 * two GPUs, or no pair with P2P access.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_group.h" /* CK, KCK, gg_now */
#include "gpu_tools.h"

static double g_limit_s = 30.0;

static void wait_stream(cudaStream_t st, int dev, const char *what) {
  double t0 = gg_now();
  CK(cudaSetDevice(dev));
  for (;;) {
    cudaError_t e = cudaStreamQuery(st);
    if (e == cudaSuccess)
      return;
    if (e != cudaErrorNotReady) {
      fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
      _exit(2);
    }
    if (gg_now() - t0 > g_limit_s) {
      fprintf(stderr, "FATAL: %s still running after %.0f s (hang)\n", what,
              g_limit_s);
      fflush(stdout);
      fflush(stderr);
      _exit(3);
    }
    usleep(100);
  }
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct side {
  int dev;
  cudaStream_t st;
  char *slot;    /* 256 bytes of this side's GPU; the pair lives at +0 */
  uint64_t *out; /* 4 words, device */
} side;

static void side_init(side *s, int dev) {
  s->dev = dev;
  CK(cudaSetDevice(dev));
  CK(cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking));
  CK(cudaMalloc((void **)&s->slot, 256));
  CK(cudaMemset(s->slot, 0, 256));
  CK(cudaMalloc((void **)&s->out, 4 * sizeof(uint64_t)));
  CK(cudaMemset(s->out, 0, 4 * sizeof(uint64_t)));
  CK(cudaDeviceSynchronize());
}

static void side_free(side *s) {
  CK(cudaSetDevice(s->dev));
  cudaFree(s->slot);
  cudaFree(s->out);
  cudaStreamDestroy(s->st);
}

static uint32_t g_tag = 1; /* tags never repeat within the process */

/* L timed launches (after one warm-up) of `iters` round trips between a
 * (initiator) and b (responder). Fills one-way ns per launch; returns the
 * number of good launches, or -1 on a failure (printed). */
static int run_pair(side *a, side *b, uint32_t iters, int launches,
                    uint64_t timeout_ns, double *oneway_ns,
                    double *cycles_rt) {
  int good = 0;
  for (int l = -1; l < launches; l++) {
    if ((uint64_t)g_tag + iters >= 0xFFFFFFF0ull) {
      fprintf(stderr, "pingpong: tag space exhausted\n");
      _exit(2);
    }
    const uint32_t base = g_tag;
    g_tag += iters;
    /* responder first, so that it is polling when the first pair lands */
    CK(cudaSetDevice(b->dev));
    KCK(dcpx_k_pingpong(b->slot, a->slot, iters, 0, base, timeout_ns, b->out,
                        b->st));
    CK(cudaSetDevice(a->dev));
    KCK(dcpx_k_pingpong(a->slot, b->slot, iters, 1, base, timeout_ns, a->out,
                        a->st));
    wait_stream(a->st, a->dev, "pingpong initiator");
    wait_stream(b->st, b->dev, "pingpong responder");
    uint64_t oa[4], ob[4];
    CK(cudaSetDevice(a->dev));
    CK(cudaMemcpy(oa, a->out, sizeof(oa), cudaMemcpyDeviceToHost));
    CK(cudaSetDevice(b->dev));
    CK(cudaMemcpy(ob, b->out, sizeof(ob), cudaMemcpyDeviceToHost));
    if (oa[0] || ob[0] || oa[3] != iters || ob[3] != iters) {
      printf("  FAIL launch %d: initiator status %llu after %llu round trips, "
             "responder status %llu after %llu (1 = timeout, 2 = wrong "
             "words)\n",
             l, (unsigned long long)oa[0], (unsigned long long)oa[3],
             (unsigned long long)ob[0], (unsigned long long)ob[3]);
      return -1;
    }
    if (l >= 0) {
      oneway_ns[good] = (double)oa[1] / iters / 2.0;
      cycles_rt[good] = (double)oa[2] / iters;
      good++;
    }
  }
  return good;
}

/* Peer access from GPU a to GPU b (already enabled is fine). */
static void enable_peer(int a, int b) {
  CK(cudaSetDevice(a));
  cudaError_t pe = cudaDeviceEnablePeerAccess(b, 0);
  if (pe == cudaErrorPeerAccessAlreadyEnabled)
    (void)cudaGetLastError();
  else
    CK(pe);
}

static void report(const char *name, double *ow, double *cy, int n,
                   int clock_khz) {
  qsort(ow, (size_t)n, sizeof(double), cmp_d);
  qsort(cy, (size_t)n, sizeof(double), cmp_d);
  const double med = ow[n / 2], cmed = cy[n / 2];
  printf("| %-22s | %8.0f | %8.0f | %6.0f - %-6.0f | %8.0f | %8.0f |\n", name,
         med, 2 * med, ow[0], ow[n - 1], cmed,
         clock_khz > 0 ? cmed / (clock_khz * 1e-6) / 2.0 : 0.0);
}

int main(int argc, char **argv) {
  uint32_t iters = 10000;
  int launches = 7, ndev = 0;
  double timeout_ms = 1000.0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = (uint32_t)strtoul(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--launches") && i + 1 < argc)
      launches = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc)
      timeout_ms = atof(argv[++i]);
    else {
      fprintf(stderr,
              "usage: pingpong [--iters N] [--launches L] [--timeout-ms T]\n");
      return 2;
    }
  }
  if (iters < 1 || iters > 10000000 || launches < 1 || launches > 1000 ||
      timeout_ms <= 0) {
    fprintf(stderr, "pingpong: bad arguments\n");
    return 2;
  }
  const char *e = getenv("DCPX_TEST_LIMIT_S");
  if (e && atof(e) > 0)
    g_limit_s = atof(e);
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
    printf("pingpong: %d GPU(s): needs two: skipped\n", ndev);
    return 77;
  }
  const uint64_t timeout_ns = (uint64_t)(timeout_ms * 1e6);
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("pingpong: %d GPUs, %u round trips per launch, %d launches (+1 "
         "warm-up), poll timeout %.0f ms, GPU 0 clock attribute %d kHz\n\n",
         ndev, iters, launches, timeout_ms, clock_khz);
  printf("| pair                   | one-way ns (median) | round trip ns | "
         "one-way min - max | cycles/round trip | one-way ns from cycles |\n"
         "|---|---:|---:|---:|---:|---:|\n");
  fflush(stdout);

  double *ow = calloc((size_t)launches, sizeof(double));
  double *cy = calloc((size_t)launches, sizeof(double));
  side sd[DCPX_MAX_WORLD];
  double mat[DCPX_MAX_WORLD][DCPX_MAX_WORLD]; /* one-way median ns; < 0: none */
  if (ndev > DCPX_MAX_WORLD)
    ndev = DCPX_MAX_WORLD;
  for (int i = 0; i < ndev; i++) {
    side_init(&sd[i], i);
    for (int j = 0; j < ndev; j++)
      mat[i][j] = -1.0;
  }
  int pairs = 0, failed = 0;
  double first_med = -1.0;
  int first_i = 0, first_j = 0;
  for (int i = 0; i < ndev; i++)
    for (int j = i + 1; j < ndev; j++) {
      int ab = 0, ba = 0;
      CK(cudaDeviceCanAccessPeer(&ab, i, j));
      CK(cudaDeviceCanAccessPeer(&ba, j, i));
      char name[64];
      snprintf(name, sizeof(name), "GPU %d <-> GPU %d", i, j);
      if (!ab || !ba) {
        printf("| %-22s | no P2P access (%d/%d) | | | | |\n", name, ab, ba);
        continue;
      }
      enable_peer(i, j);
      enable_peer(j, i);
      pairs++;
      int n = run_pair(&sd[i], &sd[j], iters, launches, timeout_ns, ow, cy);
      if (n < 0) {
        failed++;
        printf("| %-22s | FAILED | | | | |\n", name);
      } else {
        report(name, ow, cy, n, clock_khz);
        mat[i][j] = mat[j][i] = ow[n / 2];
        if (first_med < 0) {
          first_med = ow[n / 2];
          first_i = i;
          first_j = j;
        }
      }
      fflush(stdout);
    }
  side s0 = sd[0];
  /* reference: both sides on GPU 0 (two streams); informational only */
  {
    side sl;
    side_init(&sl, 0);
    int n = run_pair(&s0, &sl, iters, launches, timeout_ns, ow, cy);
    if (n < 0)
      printf("| %-22s | failed (the two kernels did not run at once?); "
             "informational | | | | |\n",
             "same GPU (reference)");
    else
      report("same GPU (reference)", ow, cy, n, clock_khz);
    side_free(&sl);
  }
  for (int i = 0; i < ndev; i++)
    side_free(&sd[i]);
  free(ow);
  free(cy);
  if (!pairs) {
    printf("\npingpong: no GPU pair with P2P access: skipped\n");
    return 77;
  }
  if (ndev > 2) { /* every pair at a glance (nvidia-smi topo -m beside it) */
    printf("\nOne-way ns (median), GPU i -> GPU j:\n\n|   |");
    for (int j = 0; j < ndev; j++)
      printf(" %d |", j);
    printf("\n|---|");
    for (int j = 0; j < ndev; j++)
      printf("---:|");
    printf("\n");
    for (int i = 0; i < ndev; i++) {
      printf("| %d |", i);
      for (int j = 0; j < ndev; j++)
        if (i == j || mat[i][j] < 0)
          printf(" %s |", i == j ? "-" : "n/a");
        else
          printf(" %.0f |", mat[i][j]);
      printf("\n");
    }
  }
  if (first_med >= 0)
    printf("\nll-oneway: GPU %d <-> GPU %d median %.0f ns\n", first_i,
           first_j, first_med);
  printf("pingpong: %d pair(s), %d failed\n", pairs, failed);
  return failed ? 1 : 0;
}
