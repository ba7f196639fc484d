/* gpu_group.h - W ranks of one dcpx group on ONE GPU, as streams of one
 * process, for tests/gpu/test_kernels.c and tests/gpu/bench_kernels.c.
 *
 * Each rank gets a cudaMalloc'd (zeroed) workspace laid out by
 * common/layout.h, a stream, and its own input and output buffers; the
 * peers table is one device array of the W workspace addresses; the control
 * page is host memory from cudaHostAlloc(Mapped | Portable), seen by the
 * kernels through its device alias.
 *
 * Nothing here may hang: gg_wait() polls the streams against a wall-clock
 * limit, aborts the group through the control page when it passes, and
 * exits the process if the kernels still do not end. Every CUDA call is
 * checked and reports file:line.
 */
#ifndef DCPX_TESTS_GPU_GROUP_H
#define DCPX_TESTS_GPU_GROUP_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "dcpx.h"
#include "dcpx_kernels.h"
#include "layout.h"

#define CK(call)                                                              \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,      \
              cudaGetErrorName(e_), cudaGetErrorString(e_));                  \
      fflush(stderr);                                                         \
      _exit(2);                                                               \
    }                                                                         \
  } while (0)

#define KCK(call)                                                             \
  do {                                                                        \
    int r_ = (call);                                                          \
    if (r_ < 0) {                                                             \
      cudaError_t e_ = cudaGetLastError();                                    \
      fprintf(stderr, "%s:%d: %s: %d (%s); last CUDA error %s\n", __FILE__,   \
              __LINE__, #call, r_, dcpx_strerror(r_), cudaGetErrorString(e_)); \
      fflush(stderr);                                                         \
      _exit(2);                                                               \
    }                                                                         \
  } while (0)

static inline double gg_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* $name as a number in [lo, hi], else def (the benches' settings). */
static inline uint32_t gg_env_u32(const char *name, uint32_t lo,
                                  uint32_t hi, uint32_t def) {
  const char *e = getenv(name);
  const long v = e ? atol(e) : -1;
  return v >= (long)lo && v <= (long)hi ? (uint32_t)v : def;
}

/* GPU 0's properties, with the kernels prepared: 0, or 77 (the tests'
 * SKIP) when there is no GPU. */
static inline int gg_gpu0(struct cudaDeviceProp *prop) {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 1) {
    fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  CK(cudaGetDeviceProperties(prop, 0));
  KCK(dcpx_k_prepare());
  return 0;
}

typedef struct gg {
  dcpx_shape sh;
  dcpx_layout L;
  uint32_t W, rows; /* rows per call (<= sh.rows) */
  uint64_t stride;  /* logits row stride, elements */
  uint32_t lofs;    /* logits pointer offset, elements (misalignment) */
  uint32_t bt_rows, bt_cols;
  int sms;

  char *ws[DCPX_MAX_WORLD];
  char **d_peers;
  void *ctl_h;  /* host view of the control page */
  char *ctl_d;  /* device view */
  dcpx_ctl_header *hdr;
  dcpx_rank_health *health;
  dcpx_wait_record *rec;
  dcpx_kctx kc[DCPX_MAX_WORLD];
  cudaStream_t st[DCPX_MAX_WORLD];

  /* per rank: host inputs, device inputs, device and host outputs */
  uint16_t *h_logits[DCPX_MAX_WORLD], *d_logits_base[DCPX_MAX_WORLD];
  int32_t *h_ends[DCPX_MAX_WORLD], *d_ends[DCPX_MAX_WORLD];
  int32_t *h_req[DCPX_MAX_WORLD], *d_req[DCPX_MAX_WORLD];
  int32_t *h_bt[DCPX_MAX_WORLD], *d_bt[DCPX_MAX_WORLD];
  int32_t *d_rows[DCPX_MAX_WORLD], *d_valid[DCPX_MAX_WORLD];
  int32_t *d_ids[DCPX_MAX_WORLD];
  uint32_t *d_sat[DCPX_MAX_WORLD];
  int no_ids; /* gg_merge passes no ids_out (a bench: as a DCP engine, which
                 needs only its own rows_out) */
  int32_t *g_rows[DCPX_MAX_WORLD], *g_valid[DCPX_MAX_WORLD];
  int32_t *g_ids[DCPX_MAX_WORLD];
  uint32_t *g_sat[DCPX_MAX_WORLD];
} gg;

static inline const uint16_t *gg_dlogits(const gg *g, uint32_t r) {
  return g->d_logits_base[r] + g->lofs;
}

/* Fills the shape; rows_max = R, rows per call = rows <= R. */
static inline void gg_init(gg *g, uint32_t W, uint32_t R, uint32_t rows,
                           uint32_t N, uint32_t K, uint32_t B, uint32_t I,
                           uint32_t max_local, uint64_t stride, uint32_t lofs,
                           uint32_t max_blocks) {
  dcpx_shape s = DCPX_SHAPE_INIT;
  memset(g, 0, sizeof(*g));
  s.world = W;
  s.rows = R;
  s.topk = K;
  s.local_topk = N;
  s.block_size = B;
  s.interleave = I;
  s.max_local = max_local;
  KCK(dcpx_shape_check(&s));
  g->sh = s;
  g->W = W;
  g->rows = rows;
  g->stride = stride;
  g->lofs = lofs;
  g->bt_rows = rows + 2;
  g->bt_cols = (max_local + B - 1) / B;
  dcpx_layout_compute(&g->L, W, R, K, N);
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev));

  /* control page */
  CK(cudaHostAlloc(&g->ctl_h, g->L.ctl_bytes,
                   cudaHostAllocMapped | cudaHostAllocPortable));
  memset(g->ctl_h, 0, g->L.ctl_bytes);
  CK(cudaHostGetDevicePointer((void **)&g->ctl_d, g->ctl_h, 0));
  g->hdr = (dcpx_ctl_header *)g->ctl_h;
  g->health = (dcpx_rank_health *)((char *)g->ctl_h + g->L.off_ranks);
  g->rec = (dcpx_wait_record *)((char *)g->ctl_h + g->L.off_records);
  g->hdr->magic = DCPX_CTL_MAGIC;
  g->hdr->version = DCPX_CTL_VERSION;
  g->hdr->world = W;
  g->hdr->rows = R;
  g->hdr->timeout_ns = 2000000000ull;
  g->hdr->generation = 1;
  for (uint32_t r = 0; r < W; r++)
    g->health[r].joined = 1;

  for (uint32_t r = 0; r < W; r++) {
    CK(cudaMalloc((void **)&g->ws[r], g->L.ws_bytes));
    CK(cudaMemset(g->ws[r], 0, g->L.ws_bytes));
    CK(cudaStreamCreateWithFlags(&g->st[r], cudaStreamNonBlocking));
  }
  CK(cudaMalloc((void **)&g->d_peers, sizeof(char *) * W));
  CK(cudaMemcpy(g->d_peers, g->ws, sizeof(char *) * W, cudaMemcpyHostToDevice));

  const size_t nlog = (size_t)rows * stride + 16;
  const size_t nout = (size_t)rows * K;
  for (uint32_t r = 0; r < W; r++) {
    dcpx_kctx *c = &g->kc[r];
    c->world = W;
    c->rank = r;
    c->rows_max = R;
    c->topk = K;
    c->local_topk = N;
    c->block_size = B;
    c->interleave = I;
    c->max_local = max_local;
    c->max_blocks = max_blocks;
    c->L = g->L;
    c->peers = g->d_peers;
    c->ws = g->ws[r];
    c->ctl = (dcpx_ctl_header *)g->ctl_d;
    c->health = (dcpx_rank_health *)(g->ctl_d + g->L.off_ranks);
    c->records = (dcpx_wait_record *)(g->ctl_d + g->L.off_records);
    c->poll_storm = getenv("DCPX_POLL_STORM") != NULL;
    c->pdl = getenv("DCPX_PDL") != NULL; /* W ranks share one GPU here */
    /* As libdcpx sets it (the SM count); DCPX_PUSH_SPLIT_ROWS overrides
     * it (0: full push blocks always), for the benches. */
    c->push_split_rows = getenv("DCPX_PUSH_SPLIT_ROWS")
                             ? (uint32_t)atoi(getenv("DCPX_PUSH_SPLIT_ROWS"))
                             : (uint32_t)g->sms;
    {
      int split = 0;
      KCK(dcpx_k_merge_split_ok(c, &split));
      c->merge_split_rows = getenv("DCPX_MERGE_SPLIT_ROWS")
                                ? (uint32_t)atoi(getenv("DCPX_MERGE_SPLIT_ROWS"))
                                : split ? (uint32_t)g->sms : 0u;
    }
    c->merge_threads = getenv("DCPX_MERGE_THREADS")
                           ? (uint32_t)atoi(getenv("DCPX_MERGE_THREADS"))
                           : 0u;
    c->push_threads = getenv("DCPX_PUSH_THREADS")
                          ? (uint32_t)atoi(getenv("DCPX_PUSH_THREADS"))
                          : 0u;
    c->stage = NULL;
    c->prof = NULL;
    if (dcpx_k_merge_stage_bytes(c))
      CK(cudaMalloc((void **)&c->stage, dcpx_k_merge_stage_bytes(c)));
    c->resc_early = dcpx_k_resc_early_rows(c, (int)g->sms);
    c->klist = NULL;
    if (dcpx_k_klist_wanted(c))
      CK(cudaMalloc((void **)&c->klist, dcpx_k_klist_bytes(c)));
    CK(cudaMalloc((void **)&c->ctr, sizeof(dcpx_k_counters)));
    CK(cudaMemset(c->ctr, 0, sizeof(dcpx_k_counters)));
    c->diag = getenv("DCPX_BENCH_DIAG")
                  ? (uint32_t)atoi(getenv("DCPX_BENCH_DIAG"))
                  : 0u;
    if (getenv("DCPX_BENCH_NOCTR")) { /* benches: what the counters cost */
      CK(cudaFree(c->ctr));
      c->ctr = NULL;
    }
    KCK(dcpx_k_ctx_check(c));

    g->h_logits[r] = (uint16_t *)calloc(nlog, 2);
    g->h_ends[r] = (int32_t *)calloc(rows, 4);
    g->h_req[r] = (int32_t *)calloc(rows, 4);
    g->h_bt[r] = (int32_t *)calloc((size_t)g->bt_rows * g->bt_cols, 4);
    g->g_rows[r] = (int32_t *)calloc(nout, 4);
    g->g_valid[r] = (int32_t *)calloc(rows, 4);
    g->g_ids[r] = (int32_t *)calloc(nout, 4);
    g->g_sat[r] = (uint32_t *)calloc(rows, 4);
    if (!g->h_logits[r] || !g->h_ends[r] || !g->h_req[r] || !g->h_bt[r] ||
        !g->g_rows[r] || !g->g_valid[r] || !g->g_ids[r] || !g->g_sat[r]) {
      fprintf(stderr, "%s:%d: out of host memory\n", __FILE__, __LINE__);
      _exit(2);
    }
    CK(cudaMalloc((void **)&g->d_logits_base[r], nlog * 2));
    CK(cudaMalloc((void **)&g->d_ends[r], rows * 4));
    CK(cudaMalloc((void **)&g->d_req[r], rows * 4));
    CK(cudaMalloc((void **)&g->d_bt[r], (size_t)g->bt_rows * g->bt_cols * 4));
    CK(cudaMalloc((void **)&g->d_rows[r], nout * 4));
    CK(cudaMalloc((void **)&g->d_valid[r], rows * 4));
    CK(cudaMalloc((void **)&g->d_ids[r], nout * 4));
    CK(cudaMalloc((void **)&g->d_sat[r], rows * 4));
  }
  /* the memsets above ran on the null stream, which the rank streams
   * (non-blocking) do not wait for */
  CK(cudaDeviceSynchronize());
}

static inline void gg_free(gg *g) {
  for (uint32_t r = 0; r < g->W; r++) {
    CK(cudaStreamSynchronize(g->st[r]));
    cudaStreamDestroy(g->st[r]);
    cudaFree(g->ws[r]);
    if (g->kc[r].stage)
      cudaFree(g->kc[r].stage);
    if (g->kc[r].klist)
      cudaFree(g->kc[r].klist);
    cudaFree(g->kc[r].ctr);
    cudaFree(g->d_logits_base[r]);
    cudaFree(g->d_ends[r]);
    cudaFree(g->d_req[r]);
    cudaFree(g->d_bt[r]);
    cudaFree(g->d_rows[r]);
    cudaFree(g->d_valid[r]);
    cudaFree(g->d_ids[r]);
    cudaFree(g->d_sat[r]);
    free(g->h_logits[r]);
    free(g->h_ends[r]);
    free(g->h_req[r]);
    free(g->h_bt[r]);
    free(g->g_rows[r]);
    free(g->g_valid[r]);
    free(g->g_ids[r]);
    free(g->g_sat[r]);
  }
  cudaFree(g->d_peers);
  cudaFreeHost(g->ctl_h);
  memset(g, 0, sizeof(*g));
}

/* Merge blocks per rank so that all W merge grids are resident at once and
 * at least half the GPU stays free for the pushes (a push block takes a
 * whole multiprocessor's registers). */
static inline uint32_t gg_auto_max_blocks(const gg *g) {
  int occ = 0;
  KCK(dcpx_k_merge_occupancy(&g->kc[0], &occ));
  if (occ < 1) {
    fprintf(stderr, "merge kernel does not fit on a multiprocessor\n");
    _exit(2);
  }
  uint32_t cap = (uint32_t)g->sms / 2 / g->W;
  return cap ? cap : 1;
}

static inline void gg_set_max_blocks(gg *g, uint32_t mb) {
  for (uint32_t r = 0; r < g->W; r++)
    g->kc[r].max_blocks = mb;
}

static inline void gg_upload(gg *g) {
  const size_t nlog = (size_t)g->rows * g->stride + 16;
  for (uint32_t r = 0; r < g->W; r++) {
    CK(cudaMemcpy(g->d_logits_base[r], g->h_logits[r], nlog * 2,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->d_ends[r], g->h_ends[r], g->rows * 4,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->d_req[r], g->h_req[r], g->rows * 4,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g->d_bt[r], g->h_bt[r],
                  (size_t)g->bt_rows * g->bt_cols * 4,
                  cudaMemcpyHostToDevice));
  }
}

/* Poisons the outputs so that an unwritten entry is caught. */
static inline void gg_poison(gg *g) {
  const size_t nout = (size_t)g->rows * g->sh.topk;
  for (uint32_t r = 0; r < g->W; r++) {
    CK(cudaMemsetAsync(g->d_rows[r], 0x5A, nout * 4, g->st[r]));
    CK(cudaMemsetAsync(g->d_ids[r], 0x5A, nout * 4, g->st[r]));
    CK(cudaMemsetAsync(g->d_valid[r], 0x5A, g->rows * 4, g->st[r]));
    CK(cudaMemsetAsync(g->d_sat[r], 0x5A, g->rows * 4, g->st[r]));
  }
}

static inline void gg_push(gg *g, uint32_t r) {
  KCK(dcpx_k_push(&g->kc[r], g->rows, gg_dlogits(g, r), g->stride,
                  g->d_ends[r], g->st[r]));
}

static inline void gg_merge(gg *g, uint32_t r) {
  KCK(dcpx_k_merge(&g->kc[r], g->rows, gg_dlogits(g, r), g->stride,
                   g->d_ends[r], g->d_req[r], g->d_bt[r], g->bt_rows,
                   g->bt_cols, g->d_rows[r], g->d_valid[r],
                   g->no_ids ? NULL : g->d_ids[r], g->d_sat[r], g->st[r]));
}

/* One call on every rank: all pushes, then all merges (each merge after
 * its own push on its stream; nothing orders ranks against each other).
 * The call's tag in wait records is the call sequence (layout.h). */
static inline void gg_call(gg *g) {
  for (uint32_t r = 0; r < g->W; r++)
    gg_push(g, r);
  for (uint32_t r = 0; r < g->W; r++)
    gg_merge(g, r);
}

/* Waits for every stream, at most limit_s seconds; then aborts the group
 * and waits 10 s more; then gives up on the process. done_s[r] (may be
 * NULL): when stream r was seen complete, seconds after t0. Returns 0, or
 * -1 if the abort was needed. */
static inline int gg_wait(gg *g, double limit_s, double t0, double *done_s) {
  uint32_t left = g->W, done[DCPX_MAX_WORLD] = {0};
  int aborted = 0;
  double start = gg_now();
  while (left) {
    for (uint32_t r = 0; r < g->W; r++) {
      if (done[r])
        continue;
      cudaError_t e = cudaStreamQuery(g->st[r]);
      if (e == cudaSuccess) {
        done[r] = 1;
        left--;
        if (done_s)
          done_s[r] = gg_now() - t0;
      } else if (e != cudaErrorNotReady) {
        fprintf(stderr, "%s:%d: stream %u: %s\n", __FILE__, __LINE__, r,
                cudaGetErrorString(e));
        _exit(2);
      }
    }
    if (!left)
      break;
    double el = gg_now() - start;
    if (!aborted && el > limit_s) {
      fprintf(stderr, "kernels still running after %.1f s: aborting group\n",
              el);
      g->hdr->abort = DCPX_ABORT_OPERATOR;
      __sync_synchronize();
      aborted = 1;
    } else if (aborted && el > limit_s + 10.0) {
      fprintf(stderr, "FATAL: kernels hang even after abort\n");
      fflush(stdout);
      fflush(stderr);
      _exit(3);
    }
    usleep(200);
  }
  return aborted ? -1 : 0;
}

static inline void gg_download(gg *g) {
  const size_t nout = (size_t)g->rows * g->sh.topk;
  for (uint32_t r = 0; r < g->W; r++) {
    CK(cudaMemcpy(g->g_rows[r], g->d_rows[r], nout * 4,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->g_ids[r], g->d_ids[r], nout * 4,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->g_valid[r], g->d_valid[r], g->rows * 4,
                  cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(g->g_sat[r], g->d_sat[r], g->rows * 4,
                  cudaMemcpyDeviceToHost));
  }
}

/* Recovery as dcpxd coordinates it: drain, zero workspaces, health,
 * records, abort; bump the generation. */
static inline void gg_recover(gg *g) {
  for (uint32_t r = 0; r < g->W; r++)
    CK(cudaStreamSynchronize(g->st[r]));
  for (uint32_t r = 0; r < g->W; r++)
    CK(cudaMemset(g->ws[r], 0, g->L.ws_bytes));
  CK(cudaDeviceSynchronize());
  memset((char *)g->ctl_h + g->L.off_ranks, 0,
         g->L.ctl_bytes - g->L.off_ranks);
  for (uint32_t r = 0; r < g->W; r++)
    g->health[r].joined = 1;
  g->hdr->abort = 0;
  g->hdr->generation++;
  __sync_synchronize();
}

/* Reads a uint32 array region of rank r's workspace. */
static inline void gg_ws_read(gg *g, uint32_t r, uint64_t off, void *dst,
                              size_t bytes) {
  CK(cudaMemcpy(dst, g->ws[r] + off, bytes, cudaMemcpyDeviceToHost));
}

static inline void gg_ws_write(gg *g, uint32_t r, uint64_t off,
                               const void *src, size_t bytes) {
  CK(cudaMemcpy(g->ws[r] + off, src, bytes, cudaMemcpyHostToDevice));
}

#endif /* DCPX_TESTS_GPU_GROUP_H */
