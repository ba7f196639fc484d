/* indexer_push_main.c - the engine side of the device-push example: W rank
 * processes (forked here) join a group through dcpxd and, call after call,
 * run the toy indexer of indexer_push.cu and dcpx_merge, each call checked
 * bit for bit against dcpx_ref_call; then, with --bench, time the indexer
 * with the push in its epilogue against the indexer followed by dcpx_push.
 *
 *   indexer_push --socket PATH [--world W] [--rows R] [--len L] [--dim D]
 *                [--topk K] [--local-topk N] [--calls C] [--spread]
 *                [--bench] [--reps N]
 *
 * dcpxd must listen at PATH (scripts/gpu-run.sh step devapi starts one).
 * Ranks share GPU 0 (run under MPS), or with --spread take GPU r % count.
 * The calls cycle through four ways to push, all merged by dcpx_merge:
 *   fused     the indexer pushes from its epilogue (dcpx_device_ctx);
 *   push      the indexer writes logits only, then dcpx_push;
 *   list      the indexer writes its top-N (values, indices), then
 *             dcpx_push_list;
 *   given     lists that are not the local top-N (odd rows lose their
 *             last entry), dcpx_push_list: the result must be the one
 *             exact for the lists given (dcpx_ref_in.lists).
 * Inputs alternate between random bf16 keys and keys in {-1, 0, 1} (scores
 * that tie everywhere). Every rank computes every rank's logits with the
 * same kernel (from the same seeds) for the reference.
 *
 * --bench: rank 0 alone (the others wait) times, per rows in 1, 8, 32,
 * 64 (<= R), CUDA graphs of --reps launches of: score (logits only),
 * score + dcpx_push, select (the indexer's top-N without the push) and
 * fused; 5 replays each, min / median / max per launch. Then every rank
 * replays graphs of --reps whole calls (fused + merge, score + dcpx_push +
 * merge), rank 0 reporting. Exit status 0 when every call was exact.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <dcpx.h>

#include "indexer_push.h"

typedef struct opts {
  const char *socket;
  uint32_t world, rows, len, dim, topk, local_topk, calls, reps;
  int spread, bench;
} opts;

/* A barrier of the rank processes (shared memory made before fork). */
typedef struct barrier {
  volatile uint32_t count, gen;
} barrier;

static barrier *B;

static void sync_ranks(uint32_t world) {
  const uint32_t g = __atomic_load_n(&B->gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&B->count, 1, __ATOMIC_ACQ_REL) == world) {
    __atomic_store_n(&B->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&B->gen, g + 1, __ATOMIC_RELEASE);
  } else {
    while (__atomic_load_n(&B->gen, __ATOMIC_ACQUIRE) == g)
      sched_yield();
  }
}

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,              \
              cudaGetErrorString(e_));                                        \
      exit(2);                                                                \
    }                                                                         \
  } while (0)

#define DK(x)                                                                 \
  do {                                                                        \
    int r_ = (x);                                                             \
    if (r_ < 0) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,              \
              dcpx_strerror(r_));                                             \
      exit(2);                                                                \
    }                                                                         \
  } while (0)

static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint16_t bf16_of(float f) { /* round to nearest even; no NaN here */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* One call's inputs, the same in every process: the query rows (shared
 * by all ranks, as a decode token is) and rank s's keys and row ends. */
static void make_q(const opts *o, uint32_t call, uint16_t *q) {
  uint64_t s = 1000 + call;
  for (uint32_t i = 0; i < o->rows * o->dim; i++)
    q[i] = call % 2 ? bf16_of((float)(int)(mix(&s) % 3) - 1.f)
                    : bf16_of(((float)(mix(&s) % 2001) - 1000.f) / 1000.f);
}

static void make_kv(const opts *o, uint32_t call, uint32_t s, uint16_t *kv,
                    int32_t *ends) {
  uint64_t x = ((uint64_t)call << 32) + s + 7;
  for (uint64_t i = 0; i < (uint64_t)o->len * o->dim; i++)
    kv[i] = call % 2 ? bf16_of((float)(int)(mix(&x) % 3) - 1.f)
                     : bf16_of(((float)(mix(&x) % 2001) - 1000.f) / 1000.f);
  for (uint32_t t = 0; t < o->rows; t++)
    ends[t] = t % 3 ? (int32_t)(mix(&x) % (o->len + 1)) : (int32_t)o->len;
}

/* The device buffers of one rank. */
typedef struct bufs {
  uint16_t *q, *kv, *logits, *values;
  int32_t *ends, *indices, *req, *bt, *rows_out, *valid, *ids;
  uint32_t *sat;
} bufs;

static void bufs_alloc(bufs *b, const opts *o, uint32_t N, uint32_t bt_cols) {
  const size_t R = o->rows, K = o->topk;
  CK(cudaMalloc((void **)&b->q, 2 * R * o->dim));
  CK(cudaMalloc((void **)&b->kv, 2 * (size_t)o->len * o->dim));
  CK(cudaMalloc((void **)&b->logits, 2 * R * o->len));
  CK(cudaMalloc((void **)&b->values, 2 * R * N));
  CK(cudaMalloc((void **)&b->indices, 4 * R * N));
  CK(cudaMalloc((void **)&b->ends, 4 * R));
  CK(cudaMalloc((void **)&b->req, 4 * R));
  CK(cudaMalloc((void **)&b->bt, 4 * R * bt_cols));
  CK(cudaMalloc((void **)&b->rows_out, 4 * R * K));
  CK(cudaMalloc((void **)&b->valid, 4 * R));
  CK(cudaMalloc((void **)&b->ids, 4 * R * K));
  CK(cudaMalloc((void **)&b->sat, 4 * R));
}

static ix_args ix_of(const bufs *b, uint32_t rows, const opts *o) {
  ix_args a;
  memset(&a, 0, sizeof(a));
  a.rows = rows;
  a.len = o->len;
  a.dim = o->dim;
  a.q = b->q;
  a.kv = b->kv;
  a.row_ends = b->ends;
  a.logits = b->logits;
  a.values = b->values;
  a.indices = b->indices;
  return a;
}

/* Host lists that are not the local top-N: the reference's own list with
 * the last entry dropped on odd rows (a valid list all the same). */
static void given_lists(const uint16_t *logits, const int32_t *ends,
                        uint32_t rows, uint32_t len, uint32_t N,
                        uint16_t *v, int32_t *ix) {
  uint32_t *w = calloc(dcpx_row_words(N), 4);
  for (uint32_t t = 0; t < rows; t++) {
    const uint16_t *row = logits + (size_t)t * len;
    int n = dcpx_ref_local_list(row, (uint32_t)ends[t], N, w);
    if (n > 0 && t % 2)
      n--;
    for (uint32_t j = 0; j < N; j++) {
      uint32_t ord, l;
      const int full = (int)j < n && dcpx_word_decode(w, N, j, &ord, &l) == 1;
      v[(size_t)t * N + j] = full ? row[l] : 0;
      ix[(size_t)t * N + j] = full ? (int32_t)l : -1;
    }
  }
  free(w);
}

static const char *const MODES[] = {"fused", "push", "list", "given"};

/* One checked call; returns 1 when exact. */
static int one_call(const opts *o, dcpx_member *m, const dcpx_device *dev,
                    const bufs *b, uint32_t rank, uint32_t c, uint32_t bt_cols,
                    cudaStream_t st, uint64_t *rescued) {
  const uint32_t W = o->world, R = o->rows, K = o->topk, L = o->len;
  const uint32_t N = dev->local_topk, mode = c % 4;
  uint16_t *q = malloc(2 * (size_t)R * o->dim);
  uint16_t *kv = malloc(2 * (size_t)L * o->dim);
  uint16_t *lg[16], *gv[16];
  int32_t *en[16], *gi[16];
  dcpx_lists gl[16];
  const dcpx_lists *glp[16];
  ix_args a = ix_of(b, R, o);

  /* Every rank's logits by the same kernel, for the reference. */
  make_q(o, c, q);
  /* Every upload and the memset on st: the stream is non-blocking, so
   * legacy-stream copies and memsets would not be ordered with its kernels
   * (a memset still running once the indexer wrote logits made rows NaN). */
  CK(cudaMemcpyAsync(b->q, q, 2 * (size_t)R * o->dim, cudaMemcpyHostToDevice,
                     st));
  for (uint32_t s = 0; s < W; s++) {
    lg[s] = malloc(2 * (size_t)R * L);
    en[s] = malloc(4 * (size_t)R);
    gv[s] = malloc(2 * (size_t)R * N);
    gi[s] = malloc(4 * (size_t)R * N);
    make_kv(o, c, s, kv, en[s]);
    CK(cudaMemcpyAsync(b->kv, kv, 2 * (size_t)L * o->dim,
                       cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(b->ends, en[s], 4 * (size_t)R, cudaMemcpyHostToDevice,
                       st));
    DK(ix_launch(IX_SCORE, dev, &a, st));
    CK(cudaMemcpyAsync(lg[s], b->logits, 2 * (size_t)R * L,
                       cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    given_lists(lg[s], en[s], R, L, N, gv[s], gi[s]);
    gl[s] = (dcpx_lists)DCPX_LISTS_INIT;
    gl[s].rows = R;
    gl[s].n = N;
    gl[s].values = gv[s];
    gl[s].indices = gi[s];
    glp[s] = &gl[s];
  }
  /* This rank's own inputs back in place. */
  make_kv(o, c, rank, kv, en[rank]);
  CK(cudaMemcpyAsync(b->kv, kv, 2 * (size_t)L * o->dim, cudaMemcpyHostToDevice,
                     st));
  CK(cudaMemcpyAsync(b->ends, en[rank], 4 * (size_t)R, cudaMemcpyHostToDevice,
                     st));
  CK(cudaMemsetAsync(b->logits, 0xFF, 2 * (size_t)R * L, st)); /* NaN until scored */

  dcpx_call in = DCPX_CALL_INIT;
  in.rows = R;
  in.logits = b->logits;
  in.stride = L;
  in.row_ends = b->ends;
  in.req_id = b->req;
  in.block_table = b->bt;
  in.bt_rows = R;
  in.bt_cols = bt_cols;
  in.call_tag = c;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  out.rows_out = b->rows_out;
  out.valid_out = b->valid;
  out.ids_out = b->ids;
  out.sat_word = b->sat;
  dcpx_lists li = DCPX_LISTS_INIT;
  li.rows = R;
  li.n = N;
  li.flags = DCPX_LISTS_CHECK_ORDER;
  li.values = b->values;
  li.indices = b->indices;
  switch (mode) {
  case 0:
    DK(ix_launch(IX_FUSED, dev, &a, st));
    break;
  case 1:
    DK(ix_launch(IX_SCORE, dev, &a, st));
    DK(dcpx_push(m, &in, st));
    break;
  case 2:
    DK(ix_launch(IX_LISTS, dev, &a, st));
    DK(dcpx_push_list(m, &in, &li, st));
    break;
  default:
    DK(ix_launch(IX_SCORE, dev, &a, st)); /* the merge reads the logits */
    CK(cudaMemcpyAsync(b->values, gv[rank], 2 * (size_t)R * N,
                       cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(b->indices, gi[rank], 4 * (size_t)R * N,
                       cudaMemcpyHostToDevice, st));
    DK(dcpx_push_list(m, &in, &li, st));
  }
  DK(dcpx_merge(m, &in, &out, st));
  CK(cudaStreamSynchronize(st));
  if (getenv("IX_CHECK_LISTS")) { /* the indexer's lists against the reference's */
    const uint32_t rw = dcpx_row_words(N);
    uint32_t *sink = NULL, *hs = malloc(4 * (size_t)R * rw), *w = malloc(4 * rw);
    uint16_t *hl = malloc(2 * (size_t)R * L);
    CK(cudaMalloc((void **)&sink, 4 * (size_t)R * rw));
    ix_args a2 = a;
    a2.sink = sink;
    DK(ix_launch(IX_SELECT, dev, &a2, st));
    CK(cudaMemcpyAsync(hs, sink, 4 * (size_t)R * rw, cudaMemcpyDeviceToHost, st));
    CK(cudaMemcpyAsync(hl, b->logits, 2 * (size_t)R * L, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    for (uint32_t t = 0; t < R; t++) {
      const uint32_t re = (uint32_t)en[rank][t];
      if (memcmp(hl + (size_t)t * L, lg[rank] + (size_t)t * L, 2 * (size_t)re))
        fprintf(stderr, "LOGITS rank %u call %u row %u differ from the score kernel's\n",
                rank, c, t);
      dcpx_ref_local_list(lg[rank] + (size_t)t * L, re, N, w);
      for (uint32_t j = 0; j < rw; j++)
        if (w[j] != hs[(size_t)t * rw + j]) {
          fprintf(stderr, "LIST rank %u call %u row %u (end %u, N %u): word %u "
                  "device %08x reference %08x\n", rank, c, t, re, N, j,
                  hs[(size_t)t * rw + j], w[j]);
          break;
        }
    }
    CK(cudaFree(sink));
    free(hs), free(w), free(hl);
  }

  int32_t *rows_out = malloc(4 * (size_t)R * K), *ids = malloc(4 * (size_t)R * K);
  int32_t *valid = malloc(4 * R), *xr = malloc(4 * (size_t)R * K);
  int32_t *xi = malloc(4 * (size_t)R * K), *xv = malloc(4 * R);
  uint32_t *sat = malloc(4 * R), *xs = malloc(4 * R);
  int32_t *req = malloc(4 * R), *bt = malloc(4 * (size_t)R * bt_cols);
  CK(cudaMemcpy(rows_out, b->rows_out, 4 * (size_t)R * K, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ids, b->ids, 4 * (size_t)R * K, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(valid, b->valid, 4 * R, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sat, b->sat, 4 * R, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(req, b->req, 4 * R, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(bt, b->bt, 4 * (size_t)R * bt_cols, cudaMemcpyDeviceToHost));

  dcpx_shape sh = DCPX_SHAPE_INIT;
  sh.world = W;
  sh.rows = R;
  sh.topk = K;
  sh.local_topk = N;
  sh.block_size = 64;
  sh.interleave = 1;
  sh.max_local = L;
  dcpx_ref_in ri = DCPX_REF_IN_INIT;
  ri.rows = R;
  ri.rank = rank;
  ri.stride = L;
  ri.logits = (const uint16_t *const *)lg;
  ri.row_ends = (const int32_t *const *)en;
  ri.req_id = req;
  ri.block_table = bt;
  ri.bt_rows = R;
  ri.bt_cols = bt_cols;
  ri.lists = mode == 3 ? glp : NULL;
  dcpx_merge_out ro = DCPX_MERGE_OUT_INIT;
  ro.rows_out = xr;
  ro.valid_out = xv;
  ro.ids_out = xi;
  ro.sat_word = xs;
  dcpx_ref_stats rs = {0, 0, 0};
  DK(dcpx_ref_call(&sh, &ri, &ro, &rs));
  *rescued += rs.rescue_rows;
  int ok = !memcmp(rows_out, xr, 4 * (size_t)R * K) &&
           !memcmp(ids, xi, 4 * (size_t)R * K) && !memcmp(valid, xv, 4 * R) &&
           !memcmp(sat, xs, 4 * R);
  if (!ok)
    for (uint32_t t = 0; t < R; t++)
      if (valid[t] != xv[t] || sat[t] != xs[t] ||
          memcmp(ids + (size_t)t * K, xi + (size_t)t * K, 4 * (size_t)K)) {
        fprintf(stderr, "MISMATCH rank %u call %u (%s) row %u: valid %d/%d "
                "sat %08x/%08x\n", rank, c, MODES[mode], t, valid[t], xv[t],
                sat[t], xs[t]);
        break;
      }
  for (uint32_t s = 0; s < W; s++) {
    free(lg[s]);
    free(en[s]);
    free(gv[s]);
    free(gi[s]);
  }
  free(q), free(kv), free(rows_out), free(ids), free(valid), free(xr);
  free(xi), free(xv), free(sat), free(xs), free(req), free(bt);
  return ok;
}

static int cmp_f(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* 5 replays of g (after one to warm up): min, median, max per launch. */
static void time_graph(cudaGraphExec_t g, cudaStream_t st, uint32_t per,
                       float ret[3]) {
  cudaEvent_t e0, e1;
  float ms[5];
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(g, st));
  CK(cudaStreamSynchronize(st));
  for (int i = 0; i < 5; i++) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(g, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms[i], e0, e1));
    ms[i] *= 1000.f / (float)per;
  }
  qsort(ms, 5, sizeof(float), cmp_f);
  ret[0] = ms[0];
  ret[1] = ms[2];
  ret[2] = ms[4];
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

enum { B_SCORE, B_PUSH, B_SELECT, B_FUSED, B_CALL_FUSED, B_CALL_PUSH };

/* A graph of reps launches of what `what` names, rows rows. */
static cudaGraphExec_t capture(int what, const opts *o, dcpx_member *m,
                               const dcpx_device *dev, const bufs *b,
                               uint32_t rows, uint32_t bt_cols,
                               cudaStream_t st) {
  cudaGraph_t g;
  cudaGraphExec_t x;
  ix_args a = ix_of(b, rows, o);
  dcpx_call in = DCPX_CALL_INIT;
  in.rows = rows;
  in.logits = b->logits;
  in.stride = o->len;
  in.row_ends = b->ends;
  in.req_id = b->req;
  in.block_table = b->bt;
  in.bt_rows = o->rows;
  in.bt_cols = bt_cols;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  out.rows_out = b->rows_out;
  out.valid_out = b->valid;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (uint32_t i = 0; i < o->reps; i++) {
    const int fused = what == B_FUSED || what == B_CALL_FUSED;
    DK(ix_launch(fused ? IX_FUSED : what == B_SELECT ? IX_SELECT : IX_SCORE,
                 dev, &a, st));
    if (what == B_PUSH || what == B_CALL_PUSH)
      DK(dcpx_push(m, &in, st));
    if (what >= B_CALL_FUSED)
      DK(dcpx_merge(m, &in, &out, st));
  }
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&x, g, 0));
  cudaGraphDestroy(g);
  return x;
}

static void bench(const opts *o, dcpx_member *m, const dcpx_device *dev,
                  const bufs *b, uint32_t rank, uint32_t bt_cols,
                  cudaStream_t st) {
  static const uint32_t rows_of[] = {1, 8, 32, 64};
  float r[6][3];
  if (rank == 0) {
    printf("\n| rows | score | score + dcpx_push | select | fused | fused - "
           "select | (us per launch, min / median / max of 5 replays of %u)"
           " |\n| --- | --- | --- | --- | --- | --- | --- |\n", o->reps);
    for (unsigned i = 0; i < 4 && rows_of[i] <= o->rows; i++) {
      for (int w = B_SCORE; w <= B_FUSED; w++) {
        cudaGraphExec_t x = capture(w, o, m, dev, b, rows_of[i], bt_cols, st);
        time_graph(x, st, o->reps, r[w]);
        cudaGraphExecDestroy(x);
      }
      printf("| %u |", rows_of[i]);
      for (int w = B_SCORE; w <= B_FUSED; w++)
        printf(" %.2f / %.2f / %.2f |", r[w][0], r[w][1], r[w][2]);
      printf(" %.2f | devapi-bench rows %u fused-select median %.2f us%s\n",
             r[B_FUSED][1] - r[B_SELECT][1], rows_of[i],
             r[B_FUSED][1] - r[B_SELECT][1],
             r[B_FUSED][1] - r[B_SELECT][1] <= 1.f ? "" : " (target <= 1 us)");
    }
    fflush(stdout);
  }
  sync_ranks(o->world);
  /* Whole calls, every rank replaying the same graphs. */
  for (int w = B_CALL_FUSED; w <= B_CALL_PUSH; w++) {
    cudaGraphExec_t x = capture(w, o, m, dev, b, o->rows, bt_cols, st);
    sync_ranks(o->world);
    time_graph(x, st, o->reps, r[w]);
    cudaGraphExecDestroy(x);
  }
  int32_t *valid = malloc(4 * o->rows);
  CK(cudaMemcpy(valid, b->valid, 4 * o->rows, cudaMemcpyDeviceToHost));
  for (uint32_t t = 0; t < o->rows; t++)
    if (valid[t] < 0)
      printf("devapi-bench: rank %u row %u failed in the call bench\n", rank,
             t);
  free(valid);
  if (rank == 0)
    printf("devapi-calls rows %u: fused + merge %.2f / %.2f / %.2f us, "
           "score + dcpx_push + merge %.2f / %.2f / %.2f us per call\n",
           o->rows, r[B_CALL_FUSED][0], r[B_CALL_FUSED][1],
           r[B_CALL_FUSED][2], r[B_CALL_PUSH][0], r[B_CALL_PUSH][1],
           r[B_CALL_PUSH][2]);
}

static int rank_main(const opts *o, uint32_t rank, const char *group) {
  int ngpu = 0;
  CK(cudaGetDeviceCount(&ngpu));
  const int device = o->spread ? (int)(rank % (uint32_t)ngpu) : 0;
  CK(cudaSetDevice(device));
  DK(ix_prepare(o->len));
  dcpx_client *cl;
  dcpx_member *m;
  dcpx_shape sh = DCPX_SHAPE_INIT;
  dcpx_join_opts jo = DCPX_JOIN_OPTS_INIT;
  sh.world = o->world;
  sh.rows = o->rows;
  sh.topk = o->topk;
  sh.local_topk = o->local_topk;
  sh.block_size = 64;
  sh.interleave = 1;
  sh.max_local = o->len;
  jo.rank = rank;
  jo.group = group;
  jo.device = device;
  jo.backend = DCPX_BACKEND_CUDA;
  jo.transport = DCPX_TRANSPORT_LL;
  jo.timeout_ns = 5000000000ull;
  DK(dcpx_connect(o->socket, &cl));
  DK(dcpx_join(cl, &sh, &jo, &m));
  dcpx_device dev = DCPX_DEVICE_INIT;
  DK(dcpx_device_ctx(m, &dev));

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const uint32_t bt_cols = (o->len + 63) / 64;
  bufs b;
  bufs_alloc(&b, o, dev.local_topk, bt_cols);
  int32_t *req = malloc(4 * o->rows), *bt = malloc(4 * (size_t)o->rows * bt_cols);
  for (uint32_t t = 0; t < o->rows; t++) {
    req[t] = (int32_t)((t * 7u) % o->rows);
    for (uint32_t x = 0; x < bt_cols; x++)
      bt[(size_t)t * bt_cols + x] = (int32_t)(t * bt_cols + (x * 5u) % bt_cols);
  }
  CK(cudaMemcpy(b.req, req, 4 * o->rows, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b.bt, bt, 4 * (size_t)o->rows * bt_cols, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize()); /* st is non-blocking: the uploads first */

  uint32_t exact = 0, per[4] = {0, 0, 0, 0};
  uint64_t rescued = 0;
  for (uint32_t c = 0; c < o->calls; c++) {
    sync_ranks(o->world); /* the reference's kernels run outside the calls */
    const int ok = one_call(o, m, &dev, &b, rank, c, bt_cols, st, &rescued);
    exact += ok;
    per[c % 4] += ok;
  }
  printf("indexer_push: rank %u (GPU %d, N=%u): exact %u/%u calls (fused %u, "
         "push %u, list %u, given %u), %llu rescued rows\n",
         rank, device, dev.local_topk, exact, o->calls, per[0], per[1],
         per[2], per[3], (unsigned long long)rescued);
  fflush(stdout);
  if (o->bench)
    bench(o, m, &dev, &b, rank, bt_cols, st);
  sync_ranks(o->world); /* leave together */
  dcpx_leave(m);
  dcpx_disconnect(cl);
  free(req);
  free(bt);
  return exact == o->calls ? 0 : 1;
}

int main(int argc, char **argv) {
  opts o = {getenv("DCPX_SOCKET"), 8, 64, 16384, 64, 2048, 0, 16, 20, 0, 0};
  static const struct option lo[] = {
      {"socket", 1, 0, 's'},     {"world", 1, 0, 'w'},
      {"rows", 1, 0, 'r'},       {"len", 1, 0, 'l'},
      {"dim", 1, 0, 'd'},        {"topk", 1, 0, 'k'},
      {"local-topk", 1, 0, 'n'}, {"calls", 1, 0, 'c'},
      {"reps", 1, 0, 'p'},       {"spread", 0, 0, 'S'},
      {"bench", 0, 0, 'b'},      {0, 0, 0, 0}};
  for (int ch; (ch = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
    const uint32_t v = optarg ? (uint32_t)strtoul(optarg, NULL, 0) : 0;
    switch (ch) {
    case 's': o.socket = optarg; break;
    case 'w': o.world = v; break;
    case 'r': o.rows = v; break;
    case 'l': o.len = v; break;
    case 'd': o.dim = v; break;
    case 'k': o.topk = v; break;
    case 'n': o.local_topk = v; break;
    case 'c': o.calls = v; break;
    case 'p': o.reps = v; break;
    case 'S': o.spread = 1; break;
    case 'b': o.bench = 1; break;
    default:
      fprintf(stderr, "usage: see the top of examples/indexer_push_main.c\n");
      return 2;
    }
  }
  if (!o.world || o.world > 16 || !o.rows || !o.len || !o.dim || !o.reps) {
    fprintf(stderr, "indexer_push: bad --world/--rows/--len/--dim/--reps\n");
    return 2;
  }
  B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (B == MAP_FAILED)
    return 2;
  char group[64];
  snprintf(group, sizeof(group), "indexer-push-%d", (int)getpid());
  pid_t pids[16];
  for (uint32_t r = 0; r < o.world; r++) {
    pids[r] = fork();
    if (pids[r] == 0) { /* CUDA starts in the child only */
      const int rc = rank_main(&o, r, group);
      fflush(stdout);
      _exit(rc);
    }
  }
  /* The ranks as they end; the first failure stops the others, which
   * would otherwise wait in sync_ranks for it forever. */
  int rc = 0;
  for (uint32_t left = o.world; left > 0;) {
    int status = 0;
    const pid_t p = waitpid(-1, &status, 0);
    if (p < 0)
      break;
    uint32_t r = 0;
    while (r < o.world && pids[r] != p)
      r++;
    if (r == o.world)
      continue;
    pids[r] = 0;
    left--;
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
      fprintf(stderr, "indexer_push: rank %u failed (status %d)%s\n", r,
              status, rc ? "" : "; stopping the other ranks");
      if (!rc)
        for (uint32_t q = 0; q < o.world; q++)
          if (pids[q] > 0)
            kill(pids[q], SIGKILL);
      rc = 1;
    }
  }
  printf("indexer_push: %s\n", rc ? "FAILED" : "every call exact");
  return rc;
}
