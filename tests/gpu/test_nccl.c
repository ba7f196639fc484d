/* test_nccl.c - the NCCL transport (kernels/nccl.cu, libclient/nccl.c)
 * against the CPU reference, bit for bit, beside the LL path on the same
 * inputs; and the benchmark hook that times both transports.
 *
 *   test_nccl            exactness: W=1 on GPU 0, then, when there are
 *                        >= 2 GPUs, W = 2 .. min(#GPUs, 8) with rank r on
 *                        GPU r (LL too when every pair has P2P access)
 *   test_nccl --bench [W]
 *                        per-call time of both transports in one run, CUDA
 *                        graphs: W ranks (default: the GPU count, at most
 *                        8), rank r on GPU r, rows in {1, 8, 64, 256},
 *                        N=512, K=2048, local length 16384 (see run_gbench);
 *                        exactness checked on graph-replayed calls
 *   DCPX_TEST_RANDOM=n test_nccl
 *                        n cases of random shape instead (see random_main),
 *                        for at most DCPX_TEST_RANDOM_S seconds
 *   test_nccl --bench-host
 *                        the older host-driven timing (threads + a stream
 *                        sync per run of calls; dominated by the host)
 *
 * NCCL refuses two ranks on one GPU, so W >= 2 needs several GPUs. One
 * process, one thread per rank (ncclCommInitAll): a thread runs its rank's
 * push and merge on its own stream, so the NCCL calls of one thread never
 * need ncclGroupStart. With W=1, a full row's N entries are all of S1, so
 * the rank is saturated and the rescue round (second all-gather, round 2)
 * runs on nearly every row.
 *
 * Then, on GPU 0, the bounds of libdcpx's NCCL setup (run_bounded):
 * dcpx__nccl_init as rank 0 of a W=2 group whose rank 1 never comes must
 * give up at its timeout (DCPX_E_TIMEDOUT), or when the group's abort
 * word is set, before or during the setup (DCPX_E_ABORTED), with a
 * reason; "nccl-bounded: X/Y cases".
 *
 * Nothing may hang: every wait polls its stream against a wall-clock limit
 * (DCPX_TEST_LIMIT_S, default 60), a bounded case runs under a 10 s
 * alarm, and the program exits 3 with a message when either passes. Exit
 * 0: every case exact and every bound kept; 1: a mismatch or a bound not
 * kept; 2: a setup error; 77: no GPU.
 */
#include <math.h>
#include <signal.h>
/* nccl.h declares some functions without prototypes */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>

#include "../call.h"
#include "gpu_group.h" /* CK, KCK, gg_now */
#include "gpu_tools.h"
#include "member.h"
#include "rng.h"

#define NCK(call)                                                             \
  do {                                                                        \
    ncclResult_t n_ = (call);                                                 \
    if (n_ != ncclSuccess) {                                                  \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,           \
              ncclGetErrorString(n_));                                        \
      fflush(stderr);                                                         \
      _exit(2);                                                               \
    }                                                                         \
  } while (0)

static double g_limit_s = 60.0;

static double rnd_normal(uint64_t *s) {
  double u = (double)(dcpx_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
  double v = (double)(dcpx_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
  if (u < 1e-300)
    u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static const uint16_t specials[] = {0x7FC0, 0xFFC0, 0x7F81, 0x7F80, 0xFF80,
                                    0x0000, 0x8000, 0x7F7F, 0xFF7F, 0x0001,
                                    0x3F80, 0xBF80};

/* Row t of rank r: a generator by row, a row end by row. */
static uint16_t value(uint32_t gen, uint64_t *s, uint32_t r, uint32_t l) {
  switch (gen % 9) {
  case 0:
    return f2bf((float)(rnd_normal(s) * 3.0));
  case 1: {
    static const float v[] = {1.0f, 0.5f, -2.0f, 1.0078125f, 3.0f};
    return f2bf(v[dcpx_rnd_below(s, 5)]);
  }
  case 2:
    return 0x3F80; /* all equal */
  case 3:
    if (dcpx_rnd_below(s, 10) < 4)
      return specials[dcpx_rnd_below(s, sizeof(specials) / 2)];
    return f2bf((float)rnd_normal(s));
  case 4:
    return 0x7FC0; /* all NaN: no candidates */
  case 5:
    return f2bf((float)((int)dcpx_rnd_below(s, 9) - 4));
  case 6:
    return f2bf((float)(rnd_normal(s) + (r == 0 ? 60.0 : 0.0))); /* dominant */
  case 7:
    return f2bf((float)(100.0 - 0.001 * l)); /* descending, bf16 ties */
  default:
    return f2bf((float)(-1.0 - rnd_normal(s) * rnd_normal(s))); /* negative */
  }
}

typedef struct tcase {
  const char *name;
  uint32_t R, rows, N, K, B, I, max_local;
  uint64_t stride;
} tcase;

static const tcase cases[] = {
    {"small", 16, 16, 8, 64, 4, 1, 700, 701},
    {"typical", 32, 32, 512, 2048, 64, 1, 32768, 32768},
    {"k4096", 8, 8, 100, 4096, 16, 2, 20000, 20003},
    {"n1", 8, 6, 1, 64, 1, 1, 300, 300},
    {"long", 4, 4, 2048, 4096, 64, 4, 131072, 131072},
    {"partial", 64, 40, 31, 100, 8, 1, 5000, 5000},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

/* One rank: its device, inputs, outputs, both transports' state. */
typedef struct rank_t {
  uint32_t r;
  int dev;
  cudaStream_t st;
  uint16_t *h_log, *d_log;
  int32_t *h_end, *d_end, *d_req, *d_bt;
  int32_t *d_rows, *d_valid, *d_ids;
  uint32_t *d_sat;
  int32_t *g_rows, *g_valid, *g_ids;
  uint32_t *g_sat;
  char *ws; /* workspace (LL slots etc.; sat/stats for nccl) */
  dcpx_k_counters *ctr; /* call counters, shared by both transports */
  dcpx_nkctx nk;
  unsigned long long *beat; /* nk.beat's host address */
  ncclComm_t comm;
  dcpx_kctx kc;
  /* graph bench */
  cudaGraphExec_t ge;
  cudaEvent_t ea, eb;
  double *ms; /* per rep: ms per graph launch */
} rank_t;

typedef struct world_t {
  uint32_t W;
  int ll_ok; /* every pair has P2P (or W == 1) */
  dcpx_shape sh;
  dcpx_layout L;
  tcase tc;
  uint32_t bt_rows, bt_cols;
  int32_t *h_req, *h_bt;
  void *ctl_h;
  char *ctl_d;
  char **d_peers[DCPX_MAX_WORLD];
  rank_t rk[DCPX_MAX_WORLD];
  /* reference outputs of every rank */
  int32_t *x_rows[DCPX_MAX_WORLD], *x_valid[DCPX_MAX_WORLD],
      *x_ids[DCPX_MAX_WORLD];
  uint32_t *x_sat[DCPX_MAX_WORLD];
  int transport; /* of the current run */
  int iters;     /* calls per thread run (and per captured graph) */
  int bench_in; /* gen_call: full rows (max_local), normal values */
  uint32_t *gate_h, *gate_d; /* graph bench: start gate (host-mapped) */
  uint32_t gate_seq;
  double rescue_pct; /* rows whose reference rescued, last compare */
} world_t;

static void wait_stream(cudaStream_t st, const char *what) {
  double t0 = gg_now();
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

/* The shape of case tc at world W (checked). */
static dcpx_shape shape_of(const tcase *tc, uint32_t W) {
  dcpx_shape s = DCPX_SHAPE_INIT;
  s.world = W;
  s.rows = tc->R;
  s.topk = tc->K;
  s.local_topk = tc->N;
  s.block_size = tc->B;
  s.interleave = tc->I;
  s.max_local = tc->max_local;
  KCK(dcpx_shape_check(&s));
  return s;
}

static void world_init(world_t *w, uint32_t W, const tcase *tc,
                       const int *devs) {
  memset(w, 0, sizeof(*w));
  const dcpx_shape s = shape_of(tc, W);
  w->W = W;
  w->sh = s;
  w->tc = *tc;
  dcpx_layout_compute(&w->L, W, tc->R, tc->K, tc->N);
  w->bt_rows = tc->rows + 1;
  w->bt_cols = (tc->max_local + tc->B - 1) / tc->B;
  w->h_req = calloc(tc->rows, 4);
  w->h_bt = calloc((size_t)w->bt_rows * w->bt_cols, 4);
  for (uint32_t t = 0; t < tc->rows; t++)
    w->h_req[t] = (int32_t)((t * 5u + 1u) % w->bt_rows);
  /* block ids whose KV rows (id * B + l % B) fit in int32 for any B */
  uint32_t vmax = (uint32_t)(INT32_MAX / tc->B);
  vmax = vmax < 1 ? 1 : vmax > 200003u ? 200003u : vmax;
  for (size_t i = 0; i < (size_t)w->bt_rows * w->bt_cols; i++)
    w->h_bt[i] = (int32_t)((i * 7919u + 13u) % vmax);

  /* P2P for LL */
  w->ll_ok = 1;
  for (uint32_t i = 0; i < W; i++)
    for (uint32_t j = 0; j < W; j++) {
      int a = 1;
      if (devs[i] != devs[j])
        CK(cudaDeviceCanAccessPeer(&a, devs[i], devs[j]));
      if (!a)
        w->ll_ok = 0;
    }

  CK(cudaHostAlloc(&w->ctl_h, w->L.ctl_bytes,
                   cudaHostAllocMapped | cudaHostAllocPortable));
  memset(w->ctl_h, 0, w->L.ctl_bytes);
  CK(cudaHostGetDevicePointer((void **)&w->ctl_d, w->ctl_h, 0));
  dcpx_ctl_header *hdr = (dcpx_ctl_header *)w->ctl_h;
  hdr->magic = DCPX_CTL_MAGIC;
  hdr->version = DCPX_CTL_VERSION;
  hdr->world = W;
  hdr->rows = tc->R;
  hdr->timeout_ns = 5000000000ull;
  hdr->generation = 1;

  const size_t nlog = (size_t)tc->rows * tc->stride + 16;
  const size_t nout = (size_t)tc->rows * tc->K;
  int ids[DCPX_MAX_WORLD];
  ncclComm_t comms[DCPX_MAX_WORLD];
  char *wsv[DCPX_MAX_WORLD];
  for (uint32_t r = 0; r < W; r++) {
    rank_t *k = &w->rk[r];
    k->r = r;
    k->dev = devs[r];
    ids[r] = devs[r];
    CK(cudaSetDevice(k->dev));
    CK(dcpx_k_prepare() < 0 ? cudaErrorUnknown : cudaSuccess);
    CK(dcpx_kn_prepare() < 0 ? cudaErrorUnknown : cudaSuccess);
    CK(cudaStreamCreateWithFlags(&k->st, cudaStreamNonBlocking));
    k->h_log = calloc(nlog, 2);
    k->h_end = calloc(tc->rows, 4);
    k->g_rows = calloc(nout, 4);
    k->g_ids = calloc(nout, 4);
    k->g_valid = calloc(tc->rows, 4);
    k->g_sat = calloc(tc->rows, 4);
    w->x_rows[r] = calloc(nout, 4);
    w->x_ids[r] = calloc(nout, 4);
    w->x_valid[r] = calloc(tc->rows, 4);
    w->x_sat[r] = calloc(tc->rows, 4);
    CK(cudaMalloc((void **)&k->d_log, nlog * 2));
    CK(cudaMalloc((void **)&k->d_end, tc->rows * 4));
    CK(cudaMalloc((void **)&k->d_req, tc->rows * 4));
    CK(cudaMalloc((void **)&k->d_bt, (size_t)w->bt_rows * w->bt_cols * 4));
    CK(cudaMalloc((void **)&k->d_rows, nout * 4));
    CK(cudaMalloc((void **)&k->d_ids, nout * 4));
    CK(cudaMalloc((void **)&k->d_valid, tc->rows * 4));
    CK(cudaMalloc((void **)&k->d_sat, tc->rows * 4));
    CK(cudaMalloc((void **)&k->ws, w->L.ws_bytes));
    CK(cudaMemset(k->ws, 0, w->L.ws_bytes));
    CK(cudaMemcpy(k->d_req, w->h_req, tc->rows * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k->d_bt, w->h_bt, (size_t)w->bt_rows * w->bt_cols * 4,
                  cudaMemcpyHostToDevice));
    dcpx_kn_ctx_init(&k->nk, &s, r);
    k->nk.ws = k->ws;
    CK(cudaMalloc((void **)&k->ctr, sizeof(dcpx_k_counters)));
    CK(cudaMemset(k->ctr, 0, sizeof(dcpx_k_counters)));
    k->nk.ctr = k->ctr;
    k->nk.health = (dcpx_rank_health *)(w->ctl_d + w->L.off_ranks) + r;
    CK(cudaMalloc((void **)&k->nk.buf, k->nk.NL.bytes));
    CK(cudaMemset(k->nk.buf, 0, k->nk.NL.bytes));
    /* the stall watch's heartbeat, as libdcpx gives it (nccl.c) */
    CK(cudaHostAlloc((void **)&k->beat, sizeof(*k->beat),
                     cudaHostAllocMapped | cudaHostAllocPortable));
    *k->beat = 0;
    CK(cudaHostGetDevicePointer((void **)&k->nk.beat, k->beat, 0));
    KCK(dcpx_kn_ctx_check(&k->nk));
    wsv[r] = k->ws;
  }
  if (w->ll_ok) {
    for (uint32_t i = 0; i < W; i++) {
      CK(cudaSetDevice(devs[i]));
      for (uint32_t j = 0; j < W; j++)
        if (devs[j] != devs[i]) {
          cudaError_t e = cudaDeviceEnablePeerAccess(devs[j], 0);
          if (e == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError();
          else
            CK(e);
        }
      CK(cudaMalloc((void **)&w->d_peers[i], sizeof(char *) * W));
      CK(cudaMemcpy(w->d_peers[i], wsv, sizeof(char *) * W,
                    cudaMemcpyHostToDevice));
      dcpx_kctx *c = &w->rk[i].kc;
      c->world = W;
      c->rank = i;
      c->rows_max = tc->R;
      c->topk = tc->K;
      c->local_topk = tc->N;
      c->block_size = tc->B;
      c->interleave = tc->I;
      c->max_local = tc->max_local;
      c->L = w->L;
      c->peers = w->d_peers[i];
      c->ws = wsv[i];
      c->ctl = (dcpx_ctl_header *)w->ctl_d;
      c->health = (dcpx_rank_health *)(w->ctl_d + w->L.off_ranks);
      c->records = (dcpx_wait_record *)(w->ctl_d + w->L.off_records);
      c->poll_storm = getenv("DCPX_POLL_STORM") != NULL;
      c->pdl = devs[i] != devs[(i + 1) % W] || W == 1 ? !getenv("DCPX_NO_PDL")
                                                       : 0;
      c->stage = NULL;
      c->klist = NULL;
      c->ctr = w->rk[i].ctr;
      if (dcpx_k_merge_stage_bytes(c))
        CK(cudaMalloc((void **)&c->stage, dcpx_k_merge_stage_bytes(c)));
      int sms = 0;
      CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                devs[i]));
      c->resc_early = dcpx_k_resc_early_rows(c, sms);
      /* As libdcpx sets it: half push blocks past one wave (before
       * session 9 this bench pushed full blocks in two waves at rows >
       * SMs, slower than the library at rows 256). */
      c->push_split_rows = (uint32_t)sms;
      int split = 0;
      KCK(dcpx_k_merge_split_ok(c, &split)); /* as libdcpx sets it */
      c->merge_split_rows = split ? (uint32_t)sms : 0u;
      if (dcpx_k_klist_wanted(c))
        CK(cudaMalloc((void **)&c->klist, dcpx_k_klist_bytes(c)));
      KCK(dcpx_k_ctx_check(c));
    }
  }
  for (uint32_t r = 0; r < W; r++) {
    CK(cudaSetDevice(devs[r]));
    CK(cudaDeviceSynchronize());
  }
  NCK(ncclCommInitAll(comms, (int)W, ids));
  for (uint32_t r = 0; r < W; r++)
    w->rk[r].comm = comms[r];
}

static void world_free(world_t *w) {
  for (uint32_t r = 0; r < w->W; r++) {
    rank_t *k = &w->rk[r];
    CK(cudaSetDevice(k->dev));
    wait_stream(k->st, "teardown");
    ncclCommDestroy(k->comm);
    cudaFree(k->d_log);
    if (k->kc.stage)
      cudaFree(k->kc.stage);
    if (k->kc.klist)
      cudaFree(k->kc.klist);
    cudaFree(k->ctr);
    cudaFree(k->d_end);
    cudaFree(k->d_req);
    cudaFree(k->d_bt);
    cudaFree(k->d_rows);
    cudaFree(k->d_ids);
    cudaFree(k->d_valid);
    cudaFree(k->d_sat);
    cudaFree(k->ws);
    cudaFree(k->nk.buf);
    cudaFreeHost(k->beat);
    if (w->d_peers[r])
      cudaFree(w->d_peers[r]);
    cudaStreamDestroy(k->st);
    free(k->h_log);
    free(k->h_end);
    free(k->g_rows);
    free(k->g_ids);
    free(k->g_valid);
    free(k->g_sat);
    free(w->x_rows[r]);
    free(w->x_ids[r]);
    free(w->x_valid[r]);
    free(w->x_sat[r]);
  }
  cudaFreeHost(w->ctl_h);
  free(w->h_req);
  free(w->h_bt);
}

/* Inputs of call c (same generator and row end on every rank per row). */
static void gen_call(world_t *w, uint64_t seed, uint32_t c) {
  const tcase *tc = &w->tc;
  for (uint32_t r = 0; r < w->W; r++) {
    rank_t *k = &w->rk[r];
    uint64_t s = seed ^ (0x1234567ull * (r + 1)) ^ ((uint64_t)c << 40);
    for (uint32_t t = 0; t < tc->rows; t++) {
      const uint32_t gen = w->bench_in ? 0 : t + c;
      uint32_t len = tc->max_local;
      switch (w->bench_in ? 0 : (t + 3 * c) % 7) {
      case 1:
        len = 0;
        break;
      case 2:
        len = tc->N > 1 ? tc->N - 1 : 1;
        break;
      case 3:
        len = tc->N;
        break;
      case 4:
        len = 1 + dcpx_rnd_below(&s, tc->max_local);
        break;
      default:
        break;
      }
      if (len > tc->max_local)
        len = tc->max_local;
      k->h_end[t] = (int32_t)len;
      uint16_t *row = k->h_log + (size_t)t * tc->stride;
      for (uint32_t l = 0; l < tc->stride; l++)
        row[l] = value(gen, &s, r, l);
    }
    CK(cudaSetDevice(k->dev));
    CK(cudaMemcpy(k->d_log, k->h_log,
                  ((size_t)tc->rows * tc->stride + 16) * 2,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k->d_end, k->h_end, tc->rows * 4, cudaMemcpyHostToDevice));
  }
  const uint16_t *lp[DCPX_MAX_WORLD];
  const int32_t *ep[DCPX_MAX_WORLD];
  for (uint32_t r = 0; r < w->W; r++) {
    lp[r] = w->rk[r].h_log;
    ep[r] = w->rk[r].h_end;
  }
  for (uint32_t r = 0; r < w->W; r++)
    KCK(t_ref_call(&w->sh, tc->rows, lp, tc->stride, ep, r, w->h_req,
                      w->h_bt, w->bt_rows, w->bt_cols, w->x_rows[r],
                      w->x_valid[r], w->x_ids[r], w->x_sat[r], NULL));
}

/* Enqueues one whole call of rank k on its stream: push + merge (LL), or
 * lists + all-gather + round 1 + all-gather + round 2 (NCCL). */
static void enqueue_call(world_t *w, rank_t *k) {
  const tcase *tc = &w->tc;
  if (w->transport == DCPX_TRANSPORT_NCCL) {
    KCK(dcpx__nccl_push_k(&k->nk, k->comm, tc->rows, k->d_log, tc->stride,
                          k->d_end, k->st));
    KCK(dcpx__nccl_merge_k(&k->nk, k->comm, tc->rows, k->d_log, tc->stride,
                           k->d_end, k->d_req, k->d_bt, w->bt_rows,
                           w->bt_cols, k->d_rows, k->d_valid, k->d_ids,
                           k->d_sat, k->st));
  } else {
    KCK(dcpx_k_push(&k->kc, tc->rows, k->d_log, tc->stride, k->d_end,
                    k->st));
    KCK(dcpx_k_merge(&k->kc, tc->rows, k->d_log, tc->stride, k->d_end,
                     k->d_req, k->d_bt, w->bt_rows, w->bt_cols, k->d_rows,
                     k->d_valid, k->d_ids, k->d_sat, k->st));
  }
}

static world_t *world_of(rank_t *k) {
  return (world_t *)((char *)(k - k->r) - offsetof(world_t, rk));
}

/* A rank's thread: `iters` calls on the current transport. */
static void *rank_thread(void *p) {
  rank_t *k = (rank_t *)p;
  world_t *w = world_of(k);
  CK(cudaSetDevice(k->dev));
  for (int i = 0; i < w->iters; i++)
    enqueue_call(w, k);
  wait_stream(k->st, w->transport == DCPX_TRANSPORT_NCCL ? "nccl call"
                                                         : "ll call");
  return NULL;
}

/* Runs `iters` calls on every rank; returns the wall time in seconds. */
static double run_calls(world_t *w, int transport, int iters) {
  pthread_t th[DCPX_MAX_WORLD];
  w->transport = transport;
  w->iters = iters;
  const double t0 = gg_now();
  for (uint32_t r = 0; r < w->W; r++)
    if (pthread_create(&th[r], NULL, rank_thread, &w->rk[r]) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      _exit(2);
    }
  for (uint32_t r = 0; r < w->W; r++)
    pthread_join(th[r], NULL);
  return gg_now() - t0;
}

static void poison(world_t *w) {
  const size_t nout = (size_t)w->tc.rows * w->tc.K;
  for (uint32_t r = 0; r < w->W; r++) {
    rank_t *k = &w->rk[r];
    CK(cudaSetDevice(k->dev));
    CK(cudaMemset(k->d_rows, 0x5A, nout * 4));
    CK(cudaMemset(k->d_ids, 0x5A, nout * 4));
    CK(cudaMemset(k->d_valid, 0x5A, w->tc.rows * 4));
    CK(cudaMemset(k->d_sat, 0x5A, w->tc.rows * 4));
    CK(cudaDeviceSynchronize());
  }
}

/* Compares every rank's outputs with the reference; returns mismatches. */
static uint64_t compare(world_t *w, const char *what, uint32_t call) {
  const tcase *tc = &w->tc;
  const size_t nout = (size_t)tc->rows * tc->K;
  uint64_t bad = 0;
  uint32_t resc = 0;
  for (uint32_t t = 0; t < tc->rows; t++)
    resc += (w->x_sat[0][t] >> 16) != 0;
  w->rescue_pct = 100.0 * resc / (tc->rows ? tc->rows : 1);
  for (uint32_t r = 0; r < w->W; r++) {
    rank_t *k = &w->rk[r];
    CK(cudaSetDevice(k->dev));
    CK(cudaMemcpy(k->g_rows, k->d_rows, nout * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(k->g_ids, k->d_ids, nout * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(k->g_valid, k->d_valid, tc->rows * 4,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(k->g_sat, k->d_sat, tc->rows * 4, cudaMemcpyDeviceToHost));
    for (uint32_t t = 0; t < tc->rows; t++) {
      int rb = k->g_valid[t] != w->x_valid[r][t] ||
               k->g_sat[t] != w->x_sat[r][t] ||
               memcmp(k->g_rows + (size_t)t * tc->K,
                      w->x_rows[r] + (size_t)t * tc->K, tc->K * 4) ||
               memcmp(k->g_ids + (size_t)t * tc->K,
                      w->x_ids[r] + (size_t)t * tc->K, tc->K * 4);
      if (rb && bad < 5)
        printf("  MISMATCH %s %s W=%u call %u rank %u row %u: valid %d/%d "
               "sat %08x/%08x\n",
               what, tc->name, w->W, call, r, t, k->g_valid[t],
               w->x_valid[r][t], k->g_sat[t], w->x_sat[r][t]);
      bad += rb;
    }
  }
  return bad;
}

/* Exactness of one case at world W; returns 1 if exact. */
static int run_exact(const tcase *tc, uint32_t W, const int *devs,
                     uint64_t seed) {
  world_t *w = calloc(1, sizeof(*w));
  world_init(w, W, tc, devs);
  uint64_t bad_n = 0, bad_l = 0;
  const uint32_t calls = 3;
  for (uint32_t c = 0; c < calls; c++) {
    gen_call(w, seed, c);
    poison(w);
    run_calls(w, DCPX_TRANSPORT_NCCL, 1);
    bad_n += compare(w, "nccl", c);
    if (w->ll_ok) {
      poison(w);
      run_calls(w, DCPX_TRANSPORT_LL, 1);
      bad_l += compare(w, "ll", c);
    }
  }
  /* the stats words: every row counted once per call by both paths */
  uint64_t st[2];
  CK(cudaSetDevice(w->rk[0].dev));
  CK(cudaMemcpy(st, w->rk[0].ws + w->L.off_stats, 16,
                cudaMemcpyDeviceToHost));
  const uint64_t want = (uint64_t)calls * (w->ll_ok ? 2 : 1);
  int stats_ok = st[0] == want;
  /* the call counters in the control page, shared by both paths: each
   * call publishes the totals of the calls before it (all but the last) */
  for (uint32_t r = 0; r < W; r++) {
    const dcpx_rank_health *h =
        (const dcpx_rank_health *)((char *)w->ctl_h + w->L.off_ranks) + r;
    if (h->calls != want - 1 || h->rows != (want - 1) * tc->rows ||
        h->failed_calls) {
      printf("  rank %u counters calls=%llu rows=%llu failed=%llu, want %llu "
             "%llu 0\n",
             r, (unsigned long long)h->calls, (unsigned long long)h->rows,
             (unsigned long long)h->failed_calls,
             (unsigned long long)(want - 1),
             (unsigned long long)((want - 1) * tc->rows));
      stats_ok = 0;
    }
  }
  int ok = bad_n == 0 && bad_l == 0 && stats_ok;
  printf("%s %-8s W=%-2u R=%-3u rows=%-3u N=%-4u K=%-4u len<=%-6u nccl %s, "
         "ll %s%s\n",
         ok ? "ok  " : "FAIL", tc->name, W, tc->R, tc->rows, tc->N, tc->K,
         tc->max_local, bad_n ? "MISMATCH" : "exact",
         !w->ll_ok ? "skipped (no P2P)" : bad_l ? "MISMATCH" : "exact",
         stats_ok ? "" : ", stats wrong");
  fflush(stdout);
  world_free(w);
  free(w);
  return ok;
}

/* A member's bounds with a setup limit and an abort word only (1 s for a
 * collective that NCCL could not enqueue at once; no failed word, no
 * stall watch). */
static dcpx__nccl_bounds abort_bounds(uint32_t setup_ms,
                                      const volatile uint32_t *abort_word) {
  const dcpx__nccl_bounds b = {setup_ms, 1000000000ull, abort_word, NULL,
                               NULL,     NULL,          NULL};
  return b;
}

/* The round kernels' voided word (dcpx_nkctx.voided, libclient/nccl.c):
 * once the library aborted the communicator, an all-gather before a round
 * kernel may have ended without its data, and the kernel must fail every
 * row (valid_out = -1, rows and ids -1) instead of merging the previous
 * call's lists as exact. W=1, the word set by hand, then cleared: the
 * next call is exact again. */
static int run_voided(const tcase *tc, const int *devs, uint64_t seed) {
  world_t *w = calloc(1, sizeof(*w));
  uint32_t *vw = NULL, one = 1, zero = 0;
  world_init(w, 1, tc, devs);
  rank_t *k = &w->rk[0];
  CK(cudaSetDevice(k->dev));
  CK(cudaMalloc((void **)&vw, 4));
  CK(cudaMemcpy(vw, &one, 4, cudaMemcpyHostToDevice));
  k->nk.voided = vw;
  gen_call(w, seed, 0);
  poison(w);
  run_calls(w, DCPX_TRANSPORT_NCCL, 1);
  const size_t nout = (size_t)tc->rows * tc->K;
  CK(cudaMemcpy(k->g_rows, k->d_rows, nout * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(k->g_ids, k->d_ids, nout * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(k->g_valid, k->d_valid, tc->rows * 4, cudaMemcpyDeviceToHost));
  uint64_t not_failed = 0;
  for (uint32_t t = 0; t < tc->rows; t++) {
    int rb = k->g_valid[t] != -1;
    for (uint32_t p = 0; p < tc->K; p++)
      rb |= k->g_rows[(size_t)t * tc->K + p] != -1 ||
            k->g_ids[(size_t)t * tc->K + p] != -1;
    not_failed += rb;
  }
  /* A failed row leaves sat_word and stats alone (docs/PROTOCOL.md 5.7),
   * rescued rows included (this case rescues every full row: their state
   * is round 2's), and the call counts once as failed, none of its rows */
  dcpx_k_counters ctr;
  const size_t nstat = 2u * tc->rows;
  uint64_t *stat = calloc(nstat, 8);
  uint32_t *satw = calloc(tc->rows, 4);
  uint64_t state_bad = 0;
  CK(cudaMemcpy(stat, k->ws + w->L.off_stats, nstat * 8,
                cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(satw, k->ws + w->L.off_sat, tc->rows * 4,
                cudaMemcpyDeviceToHost));
  for (uint32_t t = 0; t < tc->rows; t++)
    state_bad += stat[2 * t] || stat[2 * t + 1] || satw[t];
  CK(cudaMemcpy(&ctr, k->ctr, sizeof(ctr), cudaMemcpyDeviceToHost));
  state_bad += ctr.failed_calls != 1 || ctr.rows || ctr.rescue_rows;
  CK(cudaMemcpy(vw, &zero, 4, cudaMemcpyHostToDevice));
  gen_call(w, seed, 1);
  poison(w);
  run_calls(w, DCPX_TRANSPORT_NCCL, 1);
  const uint64_t bad = compare(w, "nccl after voided", 1);
  CK(cudaMemcpy(stat, k->ws + w->L.off_stats, nstat * 8,
                cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(satw, k->ws + w->L.off_sat, tc->rows * 4,
                cudaMemcpyDeviceToHost));
  uint32_t resc = 0;
  for (uint32_t t = 0; t < tc->rows; t++) {
    const uint32_t m = w->x_sat[0][t] >> 16;
    resc += m != 0;
    state_bad += stat[2 * t] != 1 || stat[2 * t + 1] != (m != 0) ||
                 satw[t] != w->x_sat[0][t];
  }
  CK(cudaMemcpy(&ctr, k->ctr, sizeof(ctr), cudaMemcpyDeviceToHost));
  state_bad += ctr.failed_calls != 1 || ctr.rows != tc->rows ||
               ctr.rescue_rows != resc;
  free(stat);
  free(satw);
  const int ok = not_failed == 0 && bad == 0 && state_bad == 0;
  printf("%s voided   W=1 rows=%u: %llu rows not failed while voided, then "
         "%s; state and counters %s (failed_calls %llu, rows %llu, rescued "
         "%llu of %u)\n",
         ok ? "ok  " : "FAIL", tc->rows, (unsigned long long)not_failed,
         bad ? "MISMATCH" : "exact", state_bad ? "WRONG" : "right",
         (unsigned long long)ctr.failed_calls, (unsigned long long)ctr.rows,
         (unsigned long long)ctr.rescue_rows, resc);
  k->nk.voided = NULL;
  CK(cudaFree(vw));
  world_free(w);
  free(w);
  return ok;
}

/* The watchdog (libclient/nccl.c): a member's communicator is aborted,
 * within a few ms, once the group's abort word is set, without any call
 * of the member's (a graph replay, a stream sync make none): its next
 * call finds no communicator. W=1. */
static int run_watchdog(void) {
  const tcase *tc = &cases[0];
  const dcpx_shape sh = shape_of(tc, 1);
  dcpx_layout L;
  uint8_t id[DCPX_NCCL_ID_BYTES];
  size_t id_len = 0;
  char *ws = NULL, why[512] = "";
  volatile uint32_t abort_word = 0;
  const dcpx__nccl_bounds b = abort_bounds(10000, &abort_word);
  struct dcpx__nccl *n = NULL;

  dcpx_layout_compute(&L, 1, tc->R, tc->K, tc->N);
  CK(cudaSetDevice(0));
  CK(cudaMalloc((void **)&ws, L.ws_bytes));
  KCK(dcpx__nccl_unique_id(id, sizeof(id), &id_len));
  KCK(dcpx__nccl_init(&sh, 0, 0, ws, id, id_len, 1, &b, why, sizeof(why),
                      &n));
  const int before = dcpx__nccl_push(n, 0, NULL, 0, NULL, NULL);
  abort_word = DCPX_ABORT_DEAD;
  int after = 0;
  const double t0 = gg_now();
  while (gg_now() - t0 < 10.0 &&
         (after = dcpx__nccl_push(n, 0, NULL, 0, NULL, NULL)) == 0)
    usleep(1000);
  const double dt = gg_now() - t0;
  dcpx__nccl_fini(n, 1);
  CK(cudaFree(ws));
  /* ncclCommAbort itself takes about 1 s (H200, NCCL 2.28) */
  const int ok = before == 0 && after == DCPX_E_NCCL && dt < 5.0;
  printf("%s watchdog W=1: a call before the abort %s, after it %s in "
         "%.1f ms\n",
         ok ? "ok  " : "FAIL", dcpx_strerror(before), dcpx_strerror(after),
         1000.0 * dt);
  return ok;
}

/* The stall watch (libclient/nccl.c): a collective of the member's that
 * stays pending for the group's wait limit fails the rank (the callback),
 * once; a finished call, or a push whose merge has not come (its
 * all-gather done: the stream marks its end), followed by idle time does
 * not. W=1, where no peer can stall: the heartbeat is set by hand to what
 * a lists kernel stores before an all-gather that never ends. The
 * callback here does not fail the rank, so that a second firing for the
 * same heartbeat would show; then the failed word is set and the
 * watchdog aborts the communicator. */
static volatile uint32_t g_stalls, g_stall_which;
static void test_stalled(void *arg, uint32_t which) {
  (void)arg;
  g_stall_which = which;
  g_stalls++;
}

static int run_stall(const int *devs) {
  const tcase *tc = &cases[0];
  world_t *w = calloc(1, sizeof(*w));
  uint8_t id[DCPX_NCCL_ID_BYTES];
  size_t id_len = 0;
  char why[512] = "";
  volatile uint32_t abort_word = 0, failed_word = 0;
  volatile uint64_t limit_ns = 300000000ull; /* the group's wait limit */
  const dcpx__nccl_bounds b = {10000,       1000000000ull, &abort_word,
                               &failed_word, &limit_ns,     test_stalled,
                               NULL};
  struct dcpx__nccl *n = NULL;

  world_init(w, 1, tc, devs);
  rank_t *k = &w->rk[0];
  CK(cudaSetDevice(k->dev));
  gen_call(w, 0x57A11ull, 0);
  KCK(dcpx__nccl_unique_id(id, sizeof(id), &id_len));
  KCK(dcpx__nccl_init(&w->sh, 0, k->dev, k->ws, id, id_len, 1, &b, why,
                      sizeof(why), &n));
  volatile unsigned long long *beat = dcpx__nccl_beat(n);
  /* a whole call, then idle for twice the limit: no stall */
  const int c1 = dcpx__nccl_push(n, tc->rows, k->d_log, tc->stride,
                                 k->d_end, k->st);
  const int c2 = dcpx__nccl_merge(n, tc->rows, k->d_log, tc->stride,
                                  k->d_end, k->d_req, k->d_bt, w->bt_rows,
                                  w->bt_cols, k->d_rows, k->d_valid,
                                  k->d_ids, k->d_sat, k->st);
  wait_stream(k->st, "stall: a whole call");
  const unsigned long long after_call = *beat;
  usleep(600000);
  /* a push alone (its merge later): its all-gather's end marked, no stall */
  const int c3 = dcpx__nccl_push(n, tc->rows, k->d_log, tc->stride,
                                 k->d_end, k->st);
  wait_stream(k->st, "stall: a push");
  const unsigned long long after_push = *beat;
  usleep(600000);
  const uint32_t idle_stalls = g_stalls;
  const int c4 = dcpx__nccl_merge(n, tc->rows, k->d_log, tc->stride,
                                  k->d_end, k->d_req, k->d_bt, w->bt_rows,
                                  w->bt_cols, k->d_rows, k->d_valid,
                                  k->d_ids, k->d_sat, k->st);
  wait_stream(k->st, "stall: the merge");
  /* an all-gather of the lists that never ends */
  const double t0 = gg_now();
  *beat = (0x1234ull << 2) | DCPX_NCCL_BEAT_LISTS;
  while (gg_now() - t0 < 5.0 && !g_stalls)
    usleep(1000);
  const double dt = gg_now() - t0;
  usleep(900000); /* three limits more: no second firing */
  const uint32_t stalls = g_stalls;
  failed_word = 1; /* what cuda.c's callback does: the watchdog aborts */
  usleep(1500000); /* ncclCommAbort takes about 1 s */
  const int after = dcpx__nccl_push(n, tc->rows, k->d_log, tc->stride,
                                    k->d_end, k->st);
  dcpx__nccl_fini(n, 1);
  world_free(w);
  free(w);
  const int ok = c1 == 0 && c2 == 0 && c3 == 0 && c4 == 0 &&
                 (after_call & 3u) == DCPX_NCCL_BEAT_IDLE && after_call &&
                 (after_push & 3u) == DCPX_NCCL_BEAT_IDLE && idle_stalls == 0 &&
                 stalls == 1 && g_stall_which == DCPX_NCCL_BEAT_LISTS &&
                 dt >= 0.3 && dt < 1.0 && after == DCPX_E_NCCL;
  printf("%s stall    W=1: heartbeat after a call %#llx, after a push "
         "%#llx; %u stalls in 1.2 s of idle time; a pending all-gather: %u "
         "stall (the %s) after %.0f ms (limit 300), none again in 900 ms; "
         "failed, the next call %s\n",
         ok ? "ok  " : "FAIL", after_call, after_push, idle_stalls, stalls,
         g_stall_which == DCPX_NCCL_BEAT_LISTS ? "lists" : "other",
         1000.0 * dt, dcpx_strerror(after));
  return ok;
}

static void run_bench_host(const tcase *tc, uint32_t W, const int *devs) {
  world_t *w = calloc(1, sizeof(*w));
  world_init(w, W, tc, devs);
  gen_call(w, 0xBE7C4ull, 0);
  const int iters = 50;
  double tn, tl = -1.0;
  run_calls(w, DCPX_TRANSPORT_NCCL, 5); /* warm-up */
  tn = run_calls(w, DCPX_TRANSPORT_NCCL, iters) / iters;
  if (w->ll_ok) {
    run_calls(w, DCPX_TRANSPORT_LL, 5);
    tl = run_calls(w, DCPX_TRANSPORT_LL, iters) / iters;
  }
  if (tl >= 0)
    printf("| %-8s | %2u | %4u | %4u | %4u | %8.1f | %8.1f |\n", tc->name, W,
           tc->rows, tc->N, tc->K, tl * 1e6, tn * 1e6);
  else
    printf("| %-8s | %2u | %4u | %4u | %4u | %8s | %8.1f |\n", tc->name, W,
           tc->rows, tc->N, tc->K, "no P2P", tn * 1e6);
  fflush(stdout);
  world_free(w);
  free(w);
}

/* ---- the graph bench (--bench) -------------------------------------------
 *
 * Per call, end to end, without the host in the loop: each rank's whole
 * call (push + merge for LL; lists + all-gather + round 1 + all-gather +
 * round 2 for NCCL) is captured ITERS times into one CUDA graph per rank
 * (one capturing thread per rank, after eager calls of the same size have
 * set up NCCL's connections). A rep launches every rank's graph (one host
 * thread, back to back) behind a start gate (dcpx_k_gate) that one host
 * store opens for all ranks, each graph bracketed by CUDA events on its
 * stream after the gate; the rank's time per call is its span / ITERS. Per rank: the median over
 * REPS; per transport: the max over ranks of those medians. Every rank
 * replays the same number of calls, so the LL epochs (device memory, one
 * step per call) stay in step. Outputs are checked against dcpx_ref_call after
 * the eager call, after the first graph launch and after the timed reps. */
static int g_gb_iters = 50, g_gb_reps = 5;
static uint32_t g_gb_n = 512; /* DCPX_BENCH_N */

static void *capture_thread(void *p) {
  rank_t *k = (rank_t *)p;
  world_t *w = world_of(k);
  cudaGraph_t gr;
  CK(cudaSetDevice(k->dev));
  CK(cudaStreamBeginCapture(k->st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < w->iters; i++)
    enqueue_call(w, k);
  CK(cudaStreamEndCapture(k->st, &gr));
  CK(cudaGraphInstantiate(&k->ge, gr, 0));
  CK(cudaGraphDestroy(gr));
  return NULL;
}

/* Captures every rank's graph of w->iters calls of `transport`. */
static void capture_all(world_t *w, int transport) {
  pthread_t th[DCPX_MAX_WORLD];
  w->transport = transport;
  w->iters = g_gb_iters;
  for (uint32_t r = 0; r < w->W; r++)
    if (pthread_create(&th[r], NULL, capture_thread, &w->rk[r]) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      _exit(2);
    }
  for (uint32_t r = 0; r < w->W; r++)
    pthread_join(th[r], NULL);
}

/* Launches every rank's graph once behind a start gate, then opens the
 * gate: every rank starts within a poll of host memory of the others, so
 * the host's launch skew stays out of the span. rep >= 0: timed into
 * ms[rep]. */
static void launch_all(world_t *w, int rep) {
  const uint32_t v = ++w->gate_seq;
  for (uint32_t r = 0; r < w->W; r++) {
    rank_t *k = &w->rk[r];
    CK(cudaSetDevice(k->dev));
    KCK(dcpx_k_gate(w->gate_d, v, 10000000000ull, k->st));
    if (rep >= 0)
      CK(cudaEventRecord(k->ea, k->st));
    CK(cudaGraphLaunch(k->ge, k->st));
    if (rep >= 0)
      CK(cudaEventRecord(k->eb, k->st));
  }
  __atomic_store_n(w->gate_h, v, __ATOMIC_SEQ_CST);
  for (uint32_t r = 0; r < w->W; r++) {
    CK(cudaSetDevice(w->rk[r].dev));
    wait_stream(w->rk[r].st, w->transport == DCPX_TRANSPORT_NCCL
                                 ? "nccl graph"
                                 : "ll graph");
  }
  if (rep >= 0)
    for (uint32_t r = 0; r < w->W; r++) {
      rank_t *k = &w->rk[r];
      float ms = 0;
      CK(cudaSetDevice(k->dev));
      CK(cudaEventElapsedTime(&ms, k->ea, k->eb));
      k->ms[rep] = ms;
    }
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Times one transport: a rep's us/call is its slowest rank's span over
 * ITERS calls; returns the median rep (min and max in *ret_min, *ret_max);
 * *ret_bad: mismatching rows. */
static double gbench_transport(world_t *w, int transport, double *ret_min,
                               double *ret_max, uint64_t *ret_bad,
                               char *detail, size_t dcap) {
  const char *name = transport == DCPX_TRANSPORT_NCCL ? "nccl" : "ll";
  uint64_t bad = 0;
  capture_all(w, transport);
  poison(w);
  launch_all(w, -1);
  bad += compare(w, name, 1);
  launch_all(w, -1); /* warm */
  for (int i = 0; i < g_gb_reps; i++)
    launch_all(w, i);
  poison(w);
  launch_all(w, -1);
  bad += compare(w, name, 2);
  /* A rep's per-call time: the slowest rank's span / ITERS. */
  double rep[64];
  const int nrep = g_gb_reps < 64 ? g_gb_reps : 64;
  for (int i = 0; i < nrep; i++) {
    rep[i] = 0;
    for (uint32_t r = 0; r < w->W; r++)
      if (w->rk[r].ms[i] * 1e3 / g_gb_iters > rep[i])
        rep[i] = w->rk[r].ms[i] * 1e3 / g_gb_iters;
  }
  qsort(rep, (size_t)nrep, sizeof(double), cmp_dbl);
  const double mn = rep[0], mx = rep[nrep - 1], med = rep[nrep / 2];
  size_t n = (size_t)snprintf(detail, dcap, "%s rank medians us/call:", name);
  for (uint32_t r = 0; r < w->W; r++) {
    rank_t *k = &w->rk[r];
    qsort(k->ms, (size_t)g_gb_reps, sizeof(double), cmp_dbl);
    if (n < dcap)
      n += (size_t)snprintf(detail + n, dcap - n, " %.2f",
                            k->ms[g_gb_reps / 2] * 1e3 / g_gb_iters);
    CK(cudaSetDevice(k->dev));
    CK(cudaGraphExecDestroy(k->ge));
    k->ge = NULL;
  }
  *ret_max = mx;
  *ret_min = mn;
  *ret_bad = bad;
  return med;
}

/* One configuration: W ranks, `rows` rows, N=512, K=2048, local length
 * 16384, B=64. Prints a table row; returns 1 if every check was exact. */
static int run_gbench(uint32_t W, uint32_t rows, const int *devs,
                      uint64_t seed, char *notes, size_t ncap) {
  const tcase tc = {"bench", rows, rows, g_gb_n, 2048, 64, 1, 16384, 16384};
  world_t *w = calloc(1, sizeof(*w));
  world_init(w, W, &tc, devs);
  w->bench_in = 1;
  /* an LL wait that never sees its peer gives up after 2 s (valid -1, so
   * the check fails), well inside the host's limit */
  ((dcpx_ctl_header *)w->ctl_h)->timeout_ns = 2000000000ull;
  CK(cudaHostAlloc((void **)&w->gate_h, 64,
                   cudaHostAllocMapped | cudaHostAllocPortable));
  *w->gate_h = 0;
  CK(cudaHostGetDevicePointer((void **)&w->gate_d, w->gate_h, 0));
  for (uint32_t r = 0; r < W; r++) {
    rank_t *k = &w->rk[r];
    CK(cudaSetDevice(k->dev));
    CK(cudaEventCreate(&k->ea));
    CK(cudaEventCreate(&k->eb));
    k->ms = calloc((size_t)g_gb_reps, sizeof(double));
  }
  gen_call(w, seed, 0);
  /* eager calls: exactness, and NCCL's connections for these sizes */
  uint64_t bad_n = 0, bad_l = 0;
  poison(w);
  run_calls(w, DCPX_TRANSPORT_NCCL, 1);
  bad_n += compare(w, "nccl eager", 0);
  run_calls(w, DCPX_TRANSPORT_NCCL, 3);
  if (w->ll_ok) {
    poison(w);
    run_calls(w, DCPX_TRANSPORT_LL, 1);
    bad_l += compare(w, "ll eager", 0);
    run_calls(w, DCPX_TRANSPORT_LL, 3);
  }
  char dl[512] = "ll: no P2P", dn[512];
  double ll = -1, ll_min = 0, ll_max = 0, nc, nc_min, nc_max;
  uint64_t b;
  if (w->ll_ok) {
    ll = gbench_transport(w, DCPX_TRANSPORT_LL, &ll_min, &ll_max, &b, dl,
                          sizeof(dl));
    bad_l += b;
  }
  nc = gbench_transport(w, DCPX_TRANSPORT_NCCL, &nc_min, &nc_max, &b, dn,
                        sizeof(dn));
  bad_n += b;
  char lls[64], ratio[32];
  if (ll >= 0) {
    snprintf(lls, sizeof(lls), "%.2f (%.2f-%.2f)", ll, ll_min, ll_max);
    snprintf(ratio, sizeof(ratio), "%.2f", nc / ll);
  } else {
    snprintf(lls, sizeof(lls), "no P2P");
    snprintf(ratio, sizeof(ratio), "-");
  }
  printf("| %4u | %u | %s | %.2f (%.2f-%.2f) | %s | %.0f%% | %-8s | %-8s |\n",
         rows, g_gb_n, lls, nc, nc_min, nc_max, ratio, w->rescue_pct,
         !w->ll_ok ? "-" : bad_l ? "MISMATCH" : "exact",
         bad_n ? "MISMATCH" : "exact");
  fflush(stdout);
  size_t n = strlen(notes);
  if (n < ncap)
    snprintf(notes + n, ncap - n, "- W=%u rows=%u: %s; %s\n", W, rows, dl,
             dn);
  for (uint32_t r = 0; r < W; r++) {
    rank_t *k = &w->rk[r];
    CK(cudaSetDevice(k->dev));
    CK(cudaEventDestroy(k->ea));
    CK(cudaEventDestroy(k->eb));
    free(k->ms);
  }
  world_free(w);
  cudaFreeHost(w->gate_h);
  free(w);
  return bad_n == 0 && bad_l == 0;
}

static int gbench_main(uint32_t W, int ndev, const int *devs, uint64_t seed) {
  static const uint32_t rows_list[] = {1, 8, 64, 256};
  const char *e;
  if ((e = getenv("DCPX_BENCH_ITERS")) && atoi(e) > 0)
    g_gb_iters = atoi(e);
  if ((e = getenv("DCPX_BENCH_REPS")) && atoi(e) > 0 && atoi(e) <= 64)
    g_gb_reps = atoi(e);
  if ((e = getenv("DCPX_BENCH_N")) && !strcmp(e, "auto"))
    g_gb_n = dcpx_shape_auto_local_topk(W, 2048); /* local_topk = 0's N */
  else if (e && atoi(e) > 0 && atoi(e) < 2048)
    g_gb_n = (uint32_t)atoi(e);
  char gpu[256] = "";
  struct cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  snprintf(gpu, sizeof(gpu), "%s", pr.name);
  e = getenv("NCCL_NVLS_ENABLE");
  printf("\n## Per call, CUDA graphs: W=%u (one rank per GPU, %d GPU(s) %s), "
         "N=%u, K=2048, local length 16384, B=64%s\n\n"
         "%d calls per graph launch; a rep = one launch, its us/call the "
         "slowest rank's; median (min-max) of %d reps; "
         "NCCL_NVLS_ENABLE=%s\n\n",
         W, ndev, gpu, g_gb_n, getenv("DCPX_POLL_STORM") ? ", POLL STORM (old control-page polling)" : "",
         g_gb_iters, g_gb_reps, e ? e : "(unset)");
  printf("| rows | N | LL us/call | NCCL us/call | NCCL/LL ratio (medians) | "
         "rows rescued | LL check | NCCL check |\n"
         "|---:|---:|---:|---:|---:|---:|---|---|\n");
  fflush(stdout);
  static char notes[8192];
  notes[0] = 0;
  int ok = 1;
  for (size_t i = 0; i < sizeof(rows_list) / sizeof(rows_list[0]); i++)
    ok &= run_gbench(W, rows_list[i], devs, seed + i, notes, sizeof(notes));
  printf("\nPer rank (rank 0 first):\n%s", notes);
  printf("\ngbench: %s\n", ok ? "every call checked was exact"
                             : "MISMATCH (see above)");
  return ok ? 0 : 1;
}

/* ---- the bounds of the NCCL setup (one GPU) ---------------------------------
 *
 * libdcpx's dcpx__nccl_init as rank 0 of a W=2 group whose rank 1 never
 * joins the communicator (a peer that died after dcpxd's JoinReply): the
 * blocking ncclCommInitRank it used before session 11 waited forever
 * there. Each case runs under an alarm that fails the program (exit 3)
 * if the call is still blocked after BOUNDED_HANG_S, so a setup without
 * a bound cannot pass, nor hang the run. */
#define BOUNDED_HANG_S 10

static void on_hang(int sig) {
  static const char msg[] = "FATAL: dcpx__nccl_init still blocked after 10 "
                            "s: the NCCL setup has no bound (hang)\n";
  (void)sig;
  ssize_t n = write(2, msg, sizeof(msg) - 1); /* async-signal-safe */
  (void)n;
  _exit(3);
}

typedef struct abort_later {
  volatile uint32_t *word;
  useconds_t after_us;
} abort_later;

static void *abort_later_thread(void *p) {
  abort_later *a = (abort_later *)p;
  usleep(a->after_us);
  __atomic_store_n(a->word, DCPX_ABORT_DEAD, __ATOMIC_RELEASE);
  return NULL;
}

/* One case: setup bound setup_ms; the group's abort word set abort_ms
 * after the call began (0: before it, < 0: never). Passes when the init
 * returns `want`, with a reason, after min_s to max_s seconds. */
static int run_bounded(const char *name, uint32_t setup_ms, int abort_ms,
                       int want, double min_s, double max_s) {
  const tcase *tc = &cases[0];
  const dcpx_shape sh = shape_of(tc, 2);
  dcpx_layout L;
  uint8_t id[DCPX_NCCL_ID_BYTES];
  size_t id_len = 0;
  char *ws = NULL, why[512] = "";
  volatile uint32_t abort_word = abort_ms == 0 ? DCPX_ABORT_DEAD : 0;
  const dcpx__nccl_bounds b = abort_bounds(setup_ms, &abort_word);
  abort_later al = {&abort_word, (useconds_t)(abort_ms > 0 ? abort_ms : 0) *
                                     1000u};
  struct dcpx__nccl *n = NULL;
  pthread_t th;

  dcpx_layout_compute(&L, 2, tc->R, tc->K, tc->N);
  CK(cudaSetDevice(0));
  CK(cudaMalloc((void **)&ws, L.ws_bytes));
  KCK(dcpx__nccl_unique_id(id, sizeof(id), &id_len));
  alarm(BOUNDED_HANG_S);
  const double t0 = gg_now();
  if (abort_ms > 0 && pthread_create(&th, NULL, abort_later_thread, &al)) {
    fprintf(stderr, "pthread_create failed\n");
    _exit(2);
  }
  const int r = dcpx__nccl_init(&sh, 0, 0, ws, id, id_len, 1, &b, why,
                                sizeof(why), &n);
  const double dt = gg_now() - t0;
  alarm(0);
  if (abort_ms > 0)
    pthread_join(th, NULL);
  const int ok = r == want && dt >= min_s && dt <= max_s && why[0];
  printf("%s bounded %-12s W=2, rank 1 never joins: %s after %.2f s (want "
         "%s after %.2f-%.1f s)%s%s\n",
         ok ? "ok  " : "FAIL", name, r ? dcpx_strerror(r) : "success", dt,
         dcpx_strerror(want), min_s, max_s, why[0] ? ": " : ", no reason",
         why);
  fflush(stdout);
  if (r == 0)
    dcpx__nccl_fini(n, 1);
  CK(cudaFree(ws));
  return ok;
}

/* The bounded cases; *ret_total gets their number. */
static uint32_t run_bounded_all(uint32_t *ret_total) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_hang;
  sigaction(SIGALRM, &sa, NULL);
  uint32_t pass = 0;
  /* the join timeout passes: given up after 500 ms */
  pass += (uint32_t)run_bounded("timeout", 500, -1, DCPX_E_TIMEDOUT, 0.5,
                                5.0);
  /* aborted during the setup (a peer died): at once, not after 60 s */
  pass += (uint32_t)run_bounded("abort-during", 60000, 100, DCPX_E_ABORTED,
                                0.1, 5.0);
  /* aborted before it */
  pass += (uint32_t)run_bounded("abort-before", 60000, 0, DCPX_E_ABORTED,
                                0.0, 5.0);
  *ret_total = 3;
  return pass;
}

/* ---- misaligned arrays (one GPU) ------------------------------------------
 *
 * The NCCL kernels' launch functions refuse misaligned arrays with
 * DCPX_E_INVAL, as dcpx_k_push and dcpx_k_merge do (include/dcpx.h: "aligned
 * to their element (else DCPX_E_INVAL)"): an odd bf16 or int32 address
 * faults in the kernel and leaves the process's CUDA context unusable.
 * Each case checks the code and that nothing faulted after a device sync. */
static int run_misaligned(const int *devs) {
  world_t *w = calloc(1, sizeof(*w));
  world_init(w, 1, &cases[0], devs);
  rank_t *k = &w->rk[0];
  const tcase *tc = &w->tc;
  const uint16_t *log1 = (const uint16_t *)((const char *)k->d_log + 1);
  const int32_t *end2 = (const int32_t *)((const char *)k->d_end + 2);
  const int32_t *req2 = (const int32_t *)((const char *)k->d_req + 2);
  int32_t *rows2 = (int32_t *)((char *)k->d_rows + 2);
  int pass = 0, total = 0;
  CK(cudaSetDevice(k->dev));
#define MIS(call)                                                              \
  do {                                                                         \
    const int r_ = (call);                                                     \
    const cudaError_t e_ = cudaDeviceSynchronize();                            \
    const int ok_ = r_ == DCPX_E_INVAL && e_ == cudaSuccess;                   \
    total++;                                                                   \
    pass += ok_;                                                               \
    printf("%s misaligned %s: %s, device %s\n", ok_ ? "ok  " : "FAIL", #call, \
           r_ ? dcpx_strerror(r_) : "launched", cudaGetErrorString(e_));       \
    fflush(stdout);                                                            \
  } while (0)
  MIS(dcpx_kn_lists(&k->nk, tc->rows, log1, tc->stride, k->d_end, k->st));
  MIS(dcpx_kn_lists(&k->nk, tc->rows, k->d_log, tc->stride, end2, k->st));
  MIS(dcpx_kn_round1(&k->nk, tc->rows, k->d_log, tc->stride, k->d_end, req2,
                     k->d_bt, w->bt_rows, w->bt_cols, k->d_rows, k->d_valid,
                     k->d_ids, k->d_sat, k->st));
  MIS(dcpx_kn_round2(&k->nk, tc->rows, k->d_req, k->d_bt, w->bt_rows,
                     w->bt_cols, rows2, k->d_valid, k->d_ids, k->st));
#undef MIS
  printf("nccl-misaligned: %d/%d cases\n", pass, total);
  world_free(w);
  free(w);
  return pass == total;
}

/* DCPX_TEST_RANDOM=n: n cases of random shape (R, rows, N, K, B, I, local
 * length, stride drawn from the seed within the shape rules) through
 * run_exact at every W this machine runs, until DCPX_TEST_RANDOM_S
 * seconds have passed; "nccl-random: P/T". */
static int random_main(uint32_t n, double secs, uint32_t wmax,
                       const int *devs, uint64_t seed) {
  static const uint32_t Bs[] = {1, 3, 12, 16, 64, 0x80000001u};
  const double t0 = gg_now();
  uint32_t pass = 0, total = 0;
  for (uint32_t i = 0; i < n && (secs <= 0 || gg_now() - t0 < secs); i++) {
    uint64_t s = seed ^ ((uint64_t)(i + 1) * 0xD1B54A32D192ED03ull);
    dcpx_splitmix64(&s);
    tcase tc;
    char name[24];
    snprintf(name, sizeof(name), "rnd%u", i);
    tc.name = name;
    tc.K = dcpx_rnd_log(&s, 2, DCPX_MAX_TOPK);
    tc.N = 1 + dcpx_rnd_below(&s, tc.K - 1);
    tc.max_local = dcpx_rnd_log(&s, 1, DCPX_MAX_LOCAL);
    tc.rows = dcpx_rnd_log(&s, 1, 48);
    while (tc.rows > 1 && (uint64_t)tc.rows * tc.max_local > (1u << 23))
      tc.rows /= 2;
    tc.R = tc.rows + dcpx_rnd_below(&s, 4);
    tc.B = Bs[dcpx_rnd_below(&s, sizeof(Bs) / sizeof(Bs[0]))];
    tc.I = 1 + dcpx_rnd_below(&s, 4);
    tc.stride = tc.max_local + dcpx_rnd_below(&s, 9);
    const uint32_t W = 1 + dcpx_rnd_below(&s, wmax);
    printf("  %s: stride=%llu B=%u I=%u\n", name,
           (unsigned long long)tc.stride, tc.B, tc.I);
    total++;
    pass += (uint32_t)run_exact(&tc, W, devs, dcpx_splitmix64(&s));
  }
  printf("nccl-random: %u/%u random shapes exact (seed 0x%llx, %.1f s)\n",
         pass, total, (unsigned long long)seed, gg_now() - t0);
  return pass == total && total > 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  int ndev = 0, bench = 0;
  if (argc > 1 && !strcmp(argv[1], "--bench"))
    bench = 1;
  else if (argc > 1 && !strcmp(argv[1], "--bench-host"))
    bench = 2;
  else if (argc > 1) {
    fprintf(stderr, "usage: test_nccl [--bench [W] | --bench-host]\n");
    return 2;
  }
  const char *e = getenv("DCPX_TEST_LIMIT_S");
  if (e && atof(e) > 0)
    g_limit_s = atof(e);
  setenv("NCCL_NVLS_ENABLE", "0", 0); /* docs/GPU.md: no NVLink multicast */
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("test_nccl: no GPU: skipped\n");
    return 77;
  }
  int devs[DCPX_MAX_WORLD];
  for (int i = 0; i < DCPX_MAX_WORLD; i++)
    devs[i] = i % ndev;
  uint32_t wmax = ndev >= 8 ? 8u : (uint32_t)ndev;
  uint64_t seed = 0xDC9C0FFEE5EEDull;
  if ((e = getenv("DCPX_TEST_SEED")))
    seed = strtoull(e, NULL, 0);
  printf("test_nccl: %d GPU(s), NCCL %d.%d.%d, seed 0x%llx, limit %.0f s\n",
         ndev, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, (unsigned long long)seed,
         g_limit_s);
  if (bench == 1) {
    uint32_t W = wmax;
    if (argc > 2) {
      W = (uint32_t)strtoul(argv[2], NULL, 0);
      if (W < 1 || W > wmax) {
        fprintf(stderr, "test_nccl --bench: W=%s: 1 .. %u here\n", argv[2],
                wmax);
        return 2;
      }
    }
    return gbench_main(W, ndev, devs, seed);
  }
  if ((e = getenv("DCPX_TEST_RANDOM")) && *e) {
    const char *es = getenv("DCPX_TEST_RANDOM_S");
    return random_main((uint32_t)strtoul(e, NULL, 0),
                       es && *es ? strtod(es, NULL) : 0.0, wmax, devs, seed);
  }
  if (bench == 2) {
    printf("\n| shape    |  W | rows |    N |    K | ll us/call | nccl us/call |\n"
           "|---|---|---|---|---|---|---|\n");
    for (uint32_t W = 1; W <= wmax; W *= 2)
      for (size_t i = 0; i < NCASES; i++)
        if (!strcmp(cases[i].name, "typical") || !strcmp(cases[i].name, "long"))
          run_bench_host(&cases[i], W, devs);
    return 0;
  }
  uint32_t pass = 0, total = 0;
  for (uint32_t W = 1; W <= wmax; W = W < 2 ? 2 : W * 2) {
    if (W > 1 && W > wmax)
      break;
    for (size_t i = 0; i < NCASES; i++) {
      total++;
      pass += (uint32_t)run_exact(&cases[i], W, devs, seed + i);
    }
  }
  if (ndev < 2)
    printf("test_nccl: one GPU: W >= 2 needs several GPUs (NCCL refuses two "
           "ranks on one GPU); not run\n");
  total += 3;
  pass += (uint32_t)run_voided(&cases[0], devs, seed);
  pass += (uint32_t)run_watchdog();
  pass += (uint32_t)run_stall(devs);
  printf("nccl-exact: %u/%u cases\n", pass, total);
  uint32_t btotal = 0;
  const uint32_t bpass = run_bounded_all(&btotal);
  printf("nccl-bounded: %u/%u cases\n", bpass, btotal);
  /* last: without its checks a case faults and kills the context */
  const int mis_ok = run_misaligned(devs);
  return pass == total && bpass == btotal && mis_ok ? 0 : 1;
}
