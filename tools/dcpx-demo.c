/* dcpx-demo - the main job: W rank processes merge their top-K through
 * dcpxd, every call checked against the CPU reference.
 *
 *   dcpx-demo [--world W] [--rows R] [--calls C] [--topk K] [--local-topk N]
 *             [--local-len L] [--block-size B] [--interleave I]
 *             [--socket PATH] [--dcpxd PATH] [--seed S] [--group NAME]
 *             [--quiet] [--backend host|cuda] [--device N] [--spread]
 *             [--transport auto|ll|nccl]
 *             [--fault-at CALL | --kill-at CALL | --stop-at CALL]
 *             [--fault-rank R]
 *             [--restart-at CALL [--restart-signal kill|term]]
 *             [--daemon-log PATH]
 *
 * Without --socket it starts a private dcpxd in a fresh runtime folder
 * (found next to this program as ../daemon/dcpxd, or $DCPXD) and stops it
 * at the end. It then forks W ranks that join one group and run C calls of
 * R rows on DSA-like logits: a heavy-tailed bulk, a few hot runs of
 * positions, and rows in which one rank holds most of the best scores (so
 * the rescue round runs). Each call starts at a barrier, is timed from push
 * to merge return, and then each rank checks its outputs (rows_out,
 * valid_out, ids_out, sat_word) bit for bit against dcpx_ref_call. It prints
 * latency percentiles, the rescue rate, and `exact: n/m calls` (m: the
 * calls an injected fault did not fail). At the
 * end each rank reads its call counters (dcpx_health: calls, rows,
 * rescue_rows, failed_calls) and compares them with its own tally of its
 * calls (tally_call); the parent prints `counters: ok ...` or a
 * `counters:` line per rank that disagrees. The exit status is 0 only if
 * every call was exact and every rank's counters agreed.
 *
 * --restart-at stops the private dcpxd after call CALL (SIGKILL, or
 * SIGTERM) and starts it again on the same socket and state folder while
 * the ranks go on calling: the calls need no daemon, and each rank's
 * dcpx_poll (once per call) reattaches, so that the new dcpxd adopts the
 * group from the memory the ranks hand back (docs/ARCHITECTURE.md,
 * "Daemon restart"). Every rank must be attached to the new dcpxd before
 * a fault injected after the restart (which that dcpxd must then see and
 * recover from) and at the end, within DEMO_REATTACH_MS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <linux/futex.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifdef HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "dcpx.h"
#include "dcpxd-util.h"
#include "layout.h"
#include "rng.h"

extern char **environ;

typedef struct opts {
  uint32_t world, rows, calls, topk, local_topk, local_len, block_size,
      interleave;
  uint64_t seed;
  const char *socket, *dcpxd, *group;
  const char *daemon_log; /* the private dcpxd's log, or NULL: its folder's */
  int quiet;
  int cuda;   /* 1: CUDA backend on `device` (one GPU for all ranks) */
  int device;
  int spread; /* CUDA: rank r on device r % (device count) instead */
  int device_given; /* --device was given (refused with --spread or host) */
  int fault_at; /* call index whose merge stalls fault_rank, or -1 */
  int kill_at;  /* call index in which fault_rank is killed (-9) after its
                   push, then replaced by a new process; or -1 */
  int stop_at;  /* call index before whose push fault_rank stops (SIGSTOP)
                   until the parent continues it, DEMO_STOP_LIMITS wait
                   limits later; or -1 */
  int restart_at;     /* call index after which dcpxd restarts, or -1 */
  int restart_sig;    /* SIGKILL or SIGTERM */
  int restart_sig_given;
  uint32_t transport; /* DCPX_TRANSPORT_* of the join */
  uint32_t fault_rank;   /* default: 1, or 0 when W = 1 */
  int fault_rank_given;
  char self_dir[512]; /* where this program lives (dcpxd, dcpxctl) */
} opts;

/* Call counters, as in dcpx_health_info. */
typedef struct tally {
  uint64_t calls, rows, rescue_rows, failed_calls;
} tally;

/* A rank's check of its health block's counters against its own calls. */
typedef struct ctr_check {
  int checked; /* 1 once the rank compared them */
  tally want;  /* what the rank's own calls say the page must show */
  tally seen;  /* what dcpx_health showed */
} ctr_check;

/* Shared between the parent and the ranks (MAP_SHARED before fork). */
/* The ranks' barrier (process-shared). A rank that stops early breaks it,
 * and so does the parent when a rank dies of a signal, so that the others
 * stop at their next wait instead of waiting forever for it.
 *
 * It takes no lock: a rank can be killed anywhere in it and leave nothing
 * held. (Its first form, a robust mutex with a process-shared condition
 * variable, could not be made safe: a rank killed inside
 * pthread_cond_broadcast or pthread_cond_wait can die holding the
 * condition variable's internal lock, which is not robust, and the
 * parent's break then blocked forever.) Arrivals count in `count`; the
 * last one resets it and bumps `gen`; a break sets `broken` and bumps
 * `gen` too. Waiters sleep in futex(2) on `gen` (shared, not private: the
 * ranks are processes), re-checking at least every 100 ms. */
typedef struct rank_barrier {
  atomic_uint count; /* arrivals in this generation */
  atomic_uint gen;   /* bumped when all have arrived, and by a break */
  atomic_int broken;
  uint32_t n;
} rank_barrier;

typedef struct shared {
  rank_barrier barrier;
  int32_t status[DCPX_MAX_WORLD];      /* first error, or 0 */
  double join_start[DCPX_MAX_WORLD];   /* when dcpx_join was called, us */
  double join_end[DCPX_MAX_WORLD];     /* when it returned */
  uint64_t rescue_rows, rows;          /* rank 0's reference counts */
  uint8_t *bad;                        /* [calls]: some rank mismatched */
  uint8_t *faulted;                    /* [calls]: failed as injected */
  uint8_t *checked;                    /* [calls]: ranks that checked it */
  double recover_ms[DCPX_MAX_WORLD];   /* dcpx_recover time, last fault */
  /* --restart-at: rank 0 asks (restart_req = 1) after call restart_at;
   * the parent stops dcpxd, starts it again and sets restarted (1, or -1
   * if the new one did not start) and restarted_us (when it accepted
   * connections); each rank's first dcpx_poll of 0 after that, in ms
   * from restarted_us (-1: not attached), and its polls until then. */
  atomic_int restart_req, restarted;
  double restarted_us;
  double reattach_ms[DCPX_MAX_WORLD];
  uint32_t reattach_polls[DCPX_MAX_WORLD];
  ctr_check ctr[DCPX_MAX_WORLD];       /* written by the rank's last process */
  double lat_us[];                     /* [world][calls] */
} shared;

static void rb_init(rank_barrier *b, uint32_t n) {
  atomic_init(&b->count, 0);
  atomic_init(&b->gen, 0);
  atomic_init(&b->broken, 0);
  b->n = n;
}

static void rb_sleep(atomic_uint *w, unsigned seen) {
  struct timespec ts = {0, 100000000};
  syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void rb_wake(atomic_uint *w) {
  syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* 0 when all n ranks arrived; -1 when the barrier is broken. (gen is read
 * before this rank counts itself in: it cannot move until it has.) */
static int rb_wait(rank_barrier *b) {
  const unsigned gen = atomic_load(&b->gen);
  if (atomic_load(&b->broken))
    return -1;
  if (atomic_fetch_add(&b->count, 1) + 1 == b->n) {
    atomic_store(&b->count, 0);
    atomic_fetch_add(&b->gen, 1);
    rb_wake(&b->gen);
    return 0;
  }
  while (atomic_load(&b->gen) == gen && !atomic_load(&b->broken))
    rb_sleep(&b->gen, gen);
  return atomic_load(&b->broken) ? -1 : 0;
}

static void rb_break(rank_barrier *b) {
  atomic_store(&b->broken, 1);
  atomic_fetch_add(&b->gen, 1);
  rb_wake(&b->gen);
}

static double unif(uint64_t *s) {
  return (double)(dcpx_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

/* Rank r's logits and row ends of call c: deterministic in (seed, c, r),
 * so every rank can rebuild every rank's inputs for the reference. */
static void gen_inputs(const opts *o, uint32_t c, uint32_t r, uint16_t *lg,
                       int32_t *ends) {
  for (uint32_t t = 0; t < o->rows; t++) {
    uint64_t rs = o->seed ^ ((uint64_t)c << 40) ^ ((uint64_t)t << 20) ^ 0x5151;
    uint64_t s = rs ^ ((uint64_t)r << 8);
    /* Row-wide choices (same on every rank): who is hot, and length. */
    uint32_t hot_rank = (uint32_t)(dcpx_splitmix64(&rs) % o->world);
    int one_rank_hot = unif(&rs) < 0.25;
    if ((int)c == o->fault_at) {
      /* The stalled rank holds every row's best (and no row of it is
       * short): its peers must wait for its rescue of row 0, so the stall
       * is felt (and the timeout fires). */
      hot_rank = o->fault_rank;
      one_rank_hot = 1;
    }
    double scale = 0.5 + 2.0 * unif(&rs);
    uint32_t len = o->local_len;
    double u = unif(&s);
    if (u < 0.05 && !((int)c == o->fault_at && r == o->fault_rank))
      len = (uint32_t)(dcpx_splitmix64(&s) % ((o->local_topk < o->local_len
                                            ? o->local_topk
                                            : o->local_len) +
                                       1)); /* short row */
    else
      len -= (uint32_t)(dcpx_splitmix64(&s) % (o->local_len / 4 + 1));
    ends[t] = (int32_t)len;
    double shift = (one_rank_hot && r == hot_rank) ? 3.0 : 0.0;
    uint16_t *row = lg + (size_t)t * o->local_len;
    uint32_t hot_at = (uint32_t)(dcpx_splitmix64(&s) % (len ? len : 1));
    for (uint32_t l = 0; l < o->local_len; l++) {
      double g = sqrt(-2.0 * log(unif(&s) + 1e-300)) *
                 cos(6.283185307179586 * unif(&s));
      double x = g * scale + shift;
      if (l >= hot_at && l < hot_at + 64) /* a hot run of positions */
        x += 2.5;
      if (unif(&s) < 0.001) /* heavy tail */
        x += 6.0 * unif(&s);
      if ((int)c == o->fault_at && t == 0 && r != o->fault_rank)
        x -= 100.0; /* row 0's top K is all the stalled rank's */
      row[l] = to_bf16((float)x);
    }
  }
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A rank's device buffers (CUDA backend). */
typedef struct gpu_bufs {
#ifdef HAVE_CUDA
  cudaStream_t st;
#endif
  uint16_t *lg;
  int32_t *en, *req, *bt, *rows, *ids, *valid;
  uint32_t *sat;
} gpu_bufs;

/* The stalled rank comes late to its call: the stall lasts at most the
 * timeout and the peers' waits count from the start of their row, so they
 * time out (the stall is felt) only if their row began before it. */
static void late(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull),
                        (long)(ns % 1000000000ull)};
  nanosleep(&ts, NULL);
}

/* The wait limit of a run with a fault injected: short, so the demo shows
 * the whole failure and recovery in well under a second. */
#define DEMO_FAULT_TIMEOUT_NS 300000000ull
/* How long a stopped rank stays stopped, in wait limits: its peers' waits
 * (LL) or all-gathers (NCCL, the stall watch) give up meanwhile. */
#define DEMO_STOP_LIMITS 3u

/* The call whose failure is injected (stall, kill or stop), or -1. */
static int injected_call(const opts *o) {
  return o->fault_at >= 0 ? o->fault_at
         : o->kill_at >= 0 ? o->kill_at
                           : o->stop_at;
}

/* What the injected fault does to its rank, for the report. */
static const char *fault_done(const opts *o) {
  return o->fault_at >= 0  ? "stalled"
         : o->kill_at >= 0 ? "killed (-9) and replaced"
                           : "stopped (SIGSTOP) before its push";
}

/* ---- a rank process ------------------------------------------------------
 *
 * rank_setup (host buffers, block table, device buffers), rank_join, then
 * per call: call_inputs, arm_fault, call_run (barrier, push, merge, the
 * latency), fetch_outputs, settle_fault (the ranks agree on a failed call
 * and recover) and check_call (the reference); rank_free at the end. */

/* What one rank process holds. */
typedef struct rank_ctx {
  const opts *o;
  shared *sh;
  uint32_t rank;
  uint32_t first_call; /* a replacement starts at the dead rank's call */
  int replacement;
  uint32_t bt_cols;
  size_t per; /* logits of one rank and call: rows * local_len */
  dcpx_shape shape;
  dcpx_join_opts jo;
  dcpx_client *cl;
  dcpx_member *m;
  /* Every rank's inputs (the reference needs them all), this rank's
   * outputs and the reference's. */
  uint16_t *all;
  int32_t *ends, *req, *bt;
  int32_t *rows_out, *ids_out, *valid;
  uint32_t *sat;
  int32_t *x_rows, *x_ids, *x_valid;
  uint32_t *x_sat;
  const uint16_t *lg[DCPX_MAX_WORLD];
  const int32_t *en[DCPX_MAX_WORLD];
  gpu_bufs g;
  int merged;        /* this call reached dcpx_merge (CUDA: it launched) */
  tally mine;        /* what this process's calls did (tally_call) */
  tally before_last; /* CUDA: mine before the last launched merge */
} rank_ctx;

static int rank_alloc(rank_ctx *x) {
  const uint32_t W = x->o->world, R = x->o->rows, K = x->o->topk;
  x->all = malloc(sizeof(uint16_t) * x->per * W);
  x->ends = malloc(sizeof(int32_t) * R * W);
  x->req = malloc(sizeof(int32_t) * R);
  x->bt = malloc(sizeof(int32_t) * (size_t)R * x->bt_cols);
  x->rows_out = malloc(sizeof(int32_t) * (size_t)R * K);
  x->ids_out = malloc(sizeof(int32_t) * (size_t)R * K);
  x->valid = malloc(sizeof(int32_t) * R);
  x->sat = malloc(sizeof(uint32_t) * R);
  x->x_rows = malloc(sizeof(int32_t) * (size_t)R * K);
  x->x_ids = malloc(sizeof(int32_t) * (size_t)R * K);
  x->x_valid = malloc(sizeof(int32_t) * R);
  x->x_sat = malloc(sizeof(uint32_t) * R);
  if (!x->all || !x->ends || !x->req || !x->bt || !x->rows_out ||
      !x->ids_out || !x->valid || !x->sat || !x->x_rows || !x->x_ids ||
      !x->x_valid || !x->x_sat)
    return DCPX_E_NOMEM;
  for (uint32_t s = 0; s < W; s++) {
    x->lg[s] = x->all + x->per * s;
    x->en[s] = x->ends + (size_t)R * s;
  }
  return 0;
}

/* This rank's block table: a permutation of block ids per request. */
static void make_block_table(rank_ctx *x) {
  const uint32_t R = x->o->rows, cols = x->bt_cols;
  uint64_t bs = x->o->seed ^ (0xB10Cull << 32) ^ x->rank;
  for (uint32_t t = 0; t < R; t++) {
    int32_t *row = x->bt + (size_t)t * cols;
    x->req[t] = (int32_t)((t * 7u) % R);
    for (uint32_t b = 0; b < cols; b++)
      row[b] = (int32_t)(t * cols + b);
    for (uint32_t b = cols; b > 1; b--) {
      uint32_t k = (uint32_t)(dcpx_splitmix64(&bs) % b);
      int32_t tmp = row[b - 1];
      row[b - 1] = row[k];
      row[k] = tmp;
    }
  }
}

/* CUDA backend: picks the device (--spread: rank % device count), names
 * it in the join options, and allocates the rank's device buffers. */
static int gpu_setup(rank_ctx *x) {
  const opts *o = x->o;
  int device = o->device;
#ifdef HAVE_CUDA
  const uint32_t R = o->rows, K = o->topk;
  gpu_bufs *g = &x->g;
  if (o->cuda && o->spread) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
      fprintf(stderr, "dcpx-demo: rank %u: --spread: no CUDA device (%s)\n",
              x->rank, cudaGetErrorString(cudaGetLastError()));
      return DCPX_E_CUDA;
    }
    device = (int)(x->rank % (uint32_t)n);
  }
#endif
  if (!o->cuda)
    return 0;
  x->jo.backend = DCPX_BACKEND_CUDA;
  x->jo.device = device;
#ifdef HAVE_CUDA
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking) !=
          cudaSuccess ||
      cudaMalloc((void **)&g->lg, sizeof(uint16_t) * x->per) != cudaSuccess ||
      cudaMalloc((void **)&g->en, sizeof(int32_t) * R) != cudaSuccess ||
      cudaMalloc((void **)&g->req, sizeof(int32_t) * R) != cudaSuccess ||
      cudaMalloc((void **)&g->bt, sizeof(int32_t) * (size_t)R * x->bt_cols) !=
          cudaSuccess ||
      cudaMalloc((void **)&g->rows, sizeof(int32_t) * (size_t)R * K) !=
          cudaSuccess ||
      cudaMalloc((void **)&g->ids, sizeof(int32_t) * (size_t)R * K) !=
          cudaSuccess ||
      cudaMalloc((void **)&g->valid, sizeof(int32_t) * R) != cudaSuccess ||
      cudaMalloc((void **)&g->sat, sizeof(uint32_t) * R) != cudaSuccess ||
      cudaMemcpy(g->req, x->req, sizeof(int32_t) * R,
                 cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(g->bt, x->bt, sizeof(int32_t) * (size_t)R * x->bt_cols,
                 cudaMemcpyHostToDevice) != cudaSuccess) {
    /* (it said only "CUDA error (-1009)", e.g. on a machine without a GPU) */
    fprintf(stderr, "dcpx-demo: rank %u: CUDA device %d: setting up the "
            "rank's buffers failed: %s\n", x->rank, device,
            cudaGetErrorString(cudaGetLastError()));
    return DCPX_E_CUDA;
  }
#endif
  return 0;
}

/* Block-table columns of a request: blocks of block_size over local_len
 * (check_opts keeps rows x that x block_size within int32). */
static uint64_t bt_cols_of(const opts *o) {
  return ((uint64_t)o->local_len + o->block_size - 1) / o->block_size;
}

/* The shape, the join options, the buffers. */
static int rank_setup(rank_ctx *x) {
  const opts *o = x->o;
  x->bt_cols = (uint32_t)bt_cols_of(o);
  x->per = (size_t)o->rows * o->local_len;
  x->shape.world = o->world;
  x->shape.rows = o->rows;
  x->shape.topk = o->topk;
  x->shape.local_topk = o->local_topk;
  x->shape.block_size = o->block_size;
  x->shape.interleave = o->interleave;
  x->shape.max_local = o->local_len;
  x->jo.rank = x->rank;
  x->jo.group = o->group;
  x->jo.transport = o->transport;
  x->jo.timeout_ns =
      injected_call(o) >= 0 ? DEMO_FAULT_TIMEOUT_NS : 5000000000ull;
  int r = rank_alloc(x);
  if (r < 0)
    return r;
  make_block_table(x);
  return gpu_setup(x);
}

static int rank_join(rank_ctx *x) {
  int r = dcpx_connect(x->o->socket, &x->cl);
  if (r < 0) {
    const char *p = x->o->socket && x->o->socket[0] ? x->o->socket
                    : getenv("DCPX_SOCKET") && getenv("DCPX_SOCKET")[0]
                        ? getenv("DCPX_SOCKET")
                        : DCPX_DEFAULT_SOCKET;
    fprintf(stderr, "dcpx-demo: rank %u: cannot connect to dcpxd at %s%s\n",
            x->rank, p,
            access(p, F_OK) ? " (no such socket: is dcpxd running there?)"
                            : "");
    return r;
  }
  x->sh->join_start[x->rank] = now_us();
  r = dcpx_join(x->cl, &x->shape, &x->jo, &x->m);
  x->sh->join_end[x->rank] = r == 0 ? now_us() : 0; /* 0: not joined */
  if (r < 0 && dcpx_client_last_error(x->cl))
    fprintf(stderr, "dcpx-demo: rank %u: join refused: %s\n", x->rank,
            dcpx_client_last_error(x->cl));
  /* e.g. W*N <= K: every full row rescues (the library's word on it) */
  if (r == 0 && x->rank == 0 && dcpx_member_warning(x->m))
    fprintf(stderr, "dcpx-demo: note: %s\n", dcpx_member_warning(x->m));
  return r;
}

/* Every rank's inputs of call c (and, CUDA, this rank's on the device). */
static int call_inputs(rank_ctx *x, uint32_t c) {
  const opts *o = x->o;
  for (uint32_t s = 0; s < o->world; s++)
    gen_inputs(o, c, s, (uint16_t *)x->lg[s], (int32_t *)x->en[s]);
#ifdef HAVE_CUDA
  if (o->cuda &&
      (cudaMemcpy(x->g.lg, x->lg[x->rank], sizeof(uint16_t) * x->per,
                  cudaMemcpyHostToDevice) != cudaSuccess ||
       cudaMemcpy(x->g.en, x->en[x->rank], sizeof(int32_t) * o->rows,
                  cudaMemcpyHostToDevice) != cudaSuccess))
    return DCPX_E_CUDA;
#endif
  return 0;
}

/* Arms the fault hook through the operator tool, as an SRE would: dcpxctl
 * run directly (no shell: the paths may hold any character), its output
 * dropped, its exit status said when it is not 0. */
static void arm_fault(const rank_ctx *x, uint32_t c) {
  const opts *o = x->o;
  char ctl[600], rank[16], call[16], ticks[32];
  /* dcpxctl sits beside us (or one up, from libtool's .libs). */
  snprintf(ctl, sizeof(ctl), "%s/dcpxctl", o->self_dir);
  if (access(ctl, X_OK) != 0)
    snprintf(ctl, sizeof(ctl), "%s/../dcpxctl", o->self_dir);
  /* --call counts calls since the join from 1: call c is c + 1. */
  snprintf(rank, sizeof(rank), "%u", o->fault_rank);
  snprintf(call, sizeof(call), "%u", c + 1);
  snprintf(ticks, sizeof(ticks), "%llu",
           (unsigned long long)(3 * x->jo.timeout_ns));
  char *const argv[] = {ctl, "--socket", (char *)o->socket, "fault",
                        "stall", "--group", (char *)o->group, "--rank", rank,
                        "--call", call, "--ticks", ticks, NULL};
  /* posix_spawn: no copy of this rank's (possibly large) memory, and
   * nothing but exec in the child */
  posix_spawn_file_actions_t fa;
  int st = -1, r = posix_spawn_file_actions_init(&fa);
  pid_t pid = -1;
  if (r == 0) {
    r = posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null",
                                         O_WRONLY, 0);
    if (r == 0)
      r = posix_spawn(&pid, ctl, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
  }
  if (r == 0)
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
      ;
  if (r != 0)
    fprintf(stderr, "dcpx-demo: arming the fault failed: cannot run %s: "
                    "%s\n", ctl, strerror(r));
  else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fprintf(stderr, "dcpx-demo: arming the fault failed: %s fault stall "
                    "--group %s --rank %s --call %s: %s %d\n",
            ctl, o->group, rank, call,
            WIFEXITED(st) ? "exit status" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* Whether this rank is the one killed (-9) in call c, after its push. */
static int killed_here(const rank_ctx *x, uint32_t c) {
  return (int)c == x->o->kill_at && x->rank == x->o->fault_rank;
}

/* Push and merge of call c on the host backend. */
static int call_host(rank_ctx *x, uint32_t c) {
  dcpx_call in = DCPX_CALL_INIT;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  in.rows = x->o->rows;
  in.logits = x->lg[x->rank];
  in.stride = x->o->local_len;
  in.row_ends = x->en[x->rank];
  in.req_id = x->req;
  in.block_table = x->bt;
  in.bt_rows = x->o->rows;
  in.bt_cols = x->bt_cols;
  in.call_tag = c;
  out.rows_out = x->rows_out;
  out.valid_out = x->valid;
  out.ids_out = x->ids_out;
  out.sat_word = x->sat;
  int r = dcpx_push(x->m, &in, NULL);
  if (killed_here(x, c))
    raise(SIGKILL); /* mid-call: pushed, not merged */
  if (r == 0) {
    x->merged = 1;
    r = dcpx_merge(x->m, &in, &out, NULL);
  }
  return r;
}

/* Push and merge of call c on the CUDA backend, then a stream sync. */
static int call_cuda(rank_ctx *x, uint32_t c) {
#ifdef HAVE_CUDA
  gpu_bufs *g = &x->g;
  dcpx_call in = DCPX_CALL_INIT;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  in.rows = x->o->rows;
  in.logits = g->lg;
  in.stride = x->o->local_len;
  in.row_ends = g->en;
  in.req_id = g->req;
  in.block_table = g->bt;
  in.bt_rows = x->o->rows;
  in.bt_cols = x->bt_cols;
  in.call_tag = c;
  out.rows_out = g->rows;
  out.valid_out = g->valid;
  out.ids_out = g->ids;
  out.sat_word = g->sat;
  int r = dcpx_push(x->m, &in, g->st);
  if (killed_here(x, c)) {
    cudaStreamSynchronize(g->st);
    raise(SIGKILL); /* mid-call: pushed, not merged */
  }
  if (r == 0) {
    r = dcpx_merge(x->m, &in, &out, g->st);
    x->merged = r == 0 && in.rows > 0; /* 0 rows: nothing is launched */
  }
  if (r == 0 && cudaStreamSynchronize(g->st) != cudaSuccess)
    r = DCPX_E_CUDA;
  return r;
#else
  (void)x;
  (void)c;
  return DCPX_E_CUDA;
#endif
}

/* Call c from the barrier to the merge's return, timed; `skip`: the dead
 * rank's call, which a replacement does not make. */
static int call_run(rank_ctx *x, uint32_t c, int skip) {
  const opts *o = x->o;
  if ((int)c == o->fault_at && x->rank == 0)
    arm_fault(x, c);
  if (!skip && rb_wait(&x->sh->barrier) < 0)
    return DCPX_E_ABORTED; /* another rank stopped: say so, and stop */
  double t0 = now_us();
  x->merged = 0;
  if ((int)c == o->fault_at && x->rank == o->fault_rank)
    late(x->jo.timeout_ns / 3);
  if ((int)c == o->stop_at && x->rank == o->fault_rank)
    raise(SIGSTOP); /* the parent continues it (run_ranks) */
  int r = skip ? DCPX_E_FAILED : o->cuda ? call_cuda(x, c) : call_host(x, c);
  x->sh->lat_us[(size_t)x->rank * o->calls + c] = now_us() - t0;
  return r;
}

/* CUDA: this rank's outputs back to the host buffers. */
static int fetch_outputs(rank_ctx *x) {
#ifdef HAVE_CUDA
  const size_t RK = (size_t)x->o->rows * x->o->topk;
  if (cudaMemcpy(x->rows_out, x->g.rows, sizeof(int32_t) * RK,
                 cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(x->ids_out, x->g.ids, sizeof(int32_t) * RK,
                 cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(x->valid, x->g.valid, sizeof(int32_t) * x->o->rows,
                 cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(x->sat, x->g.sat, sizeof(uint32_t) * x->o->rows,
                 cudaMemcpyDeviceToHost) != cudaSuccess)
    return DCPX_E_CUDA;
#else
  (void)x;
#endif
  return 0;
}

/* Counts this rank's call as the library counts it (docs/PROTOCOL.md,
 * the health block). A call that never reached dcpx_merge (a failed
 * push, the dead rank's call a replacement skips) counts nowhere. A merge
 * that returned 0 with no row marked failed adds 1 to calls, its rows to
 * rows and its rescued rows (sat_word's mask non-zero) to rescue_rows. A
 * failed merge (an error; with CUDA, a row marked -1) adds 1 to
 * failed_calls; the host backend counts none of its rows, the CUDA
 * kernels count the rows that finished (each row adds itself; none waits
 * to learn whether another row of its call fails). The kernels publish
 * the totals before each merge, so before_last keeps what the page shows
 * after the last one. Call it after fetch_outputs. (Exact for the LL
 * transport; the NCCL round kernels count a row at round 1, so a row that
 * then failed in its rescue would count there and not here.) */
static void tally_call(rank_ctx *x, int r) {
  const uint32_t R = x->o->rows;
  uint64_t rows = 0, rescued = 0;
  int failed = 0;
  if (!x->merged)
    return;
  if (x->o->cuda)
    x->before_last = x->mine;
  if (r < 0) { /* host: the merge failed; CUDA: the stream did */
    x->mine.failed_calls++;
    return;
  }
  for (uint32_t t = 0; t < R; t++) {
    if (x->valid[t] < 0) {
      failed = 1;
      continue;
    }
    rows++;
    rescued += (x->sat[t] >> 16) != 0;
  }
  if (failed)
    x->mine.failed_calls++;
  else
    x->mine.calls++;
  if (!failed || x->o->cuda) {
    x->mine.rows += rows;
    x->mine.rescue_rows += rescued;
  }
}

/* After the last call: this rank's counters in dcpx_health against its
 * tally, into sh->ctr[rank] (the parent reports them). The host backend
 * counts every call at its end; the CUDA kernels publish, from block 0
 * of each merge, the totals before it, so the page lacks the last merge
 * (the stream is synchronized: that merge is done, and so is its
 * publication). */
static int check_counters(rank_ctx *x) {
  dcpx_health_info h = DCPX_HEALTH_INFO_INIT;
#ifdef HAVE_CUDA
  if (x->o->cuda && cudaStreamSynchronize(x->g.st) != cudaSuccess)
    return DCPX_E_CUDA;
#endif
  int r = dcpx_health(x->m, &h);
  if (r < 0)
    return r;
  ctr_check *k = &x->sh->ctr[x->rank];
  k->want = x->o->cuda ? x->before_last : x->mine;
  k->seen.calls = h.calls;
  k->seen.rows = h.rows;
  k->seen.rescue_rows = h.rescue_rows;
  k->seen.failed_calls = h.failed_calls;
  k->checked = 1;
  return 0;
}

/* With a fault injected: a failed call (an error; with CUDA, rows marked
 * -1) is recovered from, and counted as exact only if it was not the
 * injected one. A rank can finish a call its peers failed (the stalled
 * rank, whose own waits were satisfied), so the ranks agree on the
 * outcome here, as an engine would through its own collective, and
 * recover together. *ret_recovered: the call failed somewhere and this
 * rank recovered. Returns r, or dcpx_recover's error. */
static int settle_fault(rank_ctx *x, uint32_t c, int r, int *ret_recovered) {
  const opts *o = x->o;
  int failed_call = r < 0;
  for (uint32_t t = 0; t < o->rows && !failed_call; t++)
    failed_call = x->valid[t] < 0;
  if (failed_call)
    x->sh->faulted[c] = 1;
  if (rb_wait(&x->sh->barrier) < 0) {
    *ret_recovered = 1; /* nothing to check: another rank stopped */
    return DCPX_E_ABORTED;
  }
  *ret_recovered = x->sh->faulted[c];
  if (!x->sh->faulted[c])
    return r;
  double r0 = now_us();
  if (!o->quiet)
    fprintf(stderr, "dcpx-demo: rank %u: call %u %s; recovering\n", x->rank,
            c,
            r < 0 ? dcpx_strerror(r)
                  : failed_call ? "failed (rows marked failed)"
                                : "failed on a peer");
#ifdef HAVE_CUDA
  r = dcpx_recover(x->m, o->cuda ? (void *)x->g.st : NULL, 20000);
#else
  r = dcpx_recover(x->m, NULL, 20000);
#endif
  x->sh->recover_ms[x->rank] = (now_us() - r0) / 1e3;
  return r;
}

/* Checks call c's outputs bit for bit against dcpx_ref_call. */
static int check_call(rank_ctx *x, uint32_t c) {
  const uint32_t R = x->o->rows, K = x->o->topk;
  dcpx_ref_stats st = {0, 0, 0};
  dcpx_ref_in xin = DCPX_REF_IN_INIT;
  dcpx_merge_out xout = DCPX_MERGE_OUT_INIT;
  xin.rows = R;
  xin.rank = x->rank;
  xin.stride = x->o->local_len;
  xin.logits = x->lg;
  xin.row_ends = x->en;
  xin.req_id = x->req;
  xin.block_table = x->bt;
  xin.bt_rows = R;
  xin.bt_cols = x->bt_cols;
  xout.rows_out = x->x_rows;
  xout.valid_out = x->x_valid;
  xout.ids_out = x->x_ids;
  xout.sat_word = x->x_sat;
  int r = dcpx_ref_call(&x->shape, &xin, &xout, &st);
  if (r < 0)
    return r;
  if (memcmp(x->rows_out, x->x_rows, sizeof(int32_t) * (size_t)R * K) ||
      memcmp(x->ids_out, x->x_ids, sizeof(int32_t) * (size_t)R * K) ||
      memcmp(x->valid, x->x_valid, sizeof(int32_t) * R) ||
      memcmp(x->sat, x->x_sat, sizeof(uint32_t) * R))
    x->sh->bad[c] = 1;
  __atomic_add_fetch(&x->sh->checked[c], 1, __ATOMIC_RELAXED);
  if (x->rank == 0) {
    x->sh->rescue_rows += st.rescue_rows;
    x->sh->rows += st.rows;
  }
  return 0;
}

/* How long a rank waits for its member to be attached to the restarted
 * dcpxd (--restart-at), from the restart. */
#define DEMO_REATTACH_MS 20000u

/* dcpx_poll; with --restart-at, once the new dcpxd is up, the polls
 * until the member is attached to it are counted, and the time of the
 * first that says so noted. */
static int demo_poll(rank_ctx *x) {
  shared *sh = x->sh;
  const int count = x->o->restart_at >= 0 &&
                    atomic_load(&sh->restarted) > 0 &&
                    sh->reattach_ms[x->rank] < 0;
  const int r = dcpx_poll(x->m);
  if (count) {
    sh->reattach_polls[x->rank]++;
    if (r == 0)
      sh->reattach_ms[x->rank] = (now_us() - sh->restarted_us) / 1e3;
  }
  return r;
}

/* --restart-at: waits until the parent has restarted dcpxd, then until
 * this rank's member is attached to the new one (dcpx_poll returns 0: it
 * reattached, and the new dcpxd adopted the group). Before a fault
 * injected after the restart, so that the new dcpxd watches every rank
 * when it hits, and before the counters at the end. Returns 0, or an
 * error after saying why. */
static int await_attach(rank_ctx *x) {
  shared *sh = x->sh;
  const double t0 = now_us();
  int r = DCPX_E_TIMEDOUT, st = 0;
  while (now_us() - t0 < DEMO_REATTACH_MS * 1e3) {
    st = atomic_load(&sh->restarted);
    if (st < 0)
      break; /* the new dcpxd did not start (the parent says so) */
    if (st > 0 && (r = demo_poll(x)) == 0)
      return 0;
    usleep(5000);
  }
  if (st < 0)
    fprintf(stderr, "dcpx-demo: rank %u: no restarted dcpxd to attach to "
                    "(it did not start)\n", x->rank);
  else
    fprintf(stderr, "dcpx-demo: rank %u: not attached to the restarted "
                    "dcpxd within %u ms (dcpx_poll: %s)\n",
            x->rank, DEMO_REATTACH_MS, dcpx_strerror(r));
  return r < 0 ? r : DCPX_E_TIMEDOUT;
}

/* One call, all of it. Returns 0 to go on, or the error that ends the
 * rank. */
static int rank_call(rank_ctx *x, uint32_t c) {
  const opts *o = x->o;
  int skip = x->replacement && c == x->first_call; /* the dead rank's */
  int r = call_inputs(x, c);
  if (r < 0)
    return r;
  r = call_run(x, c, skip);
  if (r < 0 && injected_call(o) < 0)
    return r;
  if (o->cuda && r == 0 && !skip && (r = fetch_outputs(x)) < 0)
    return r;
  tally_call(x, r);
  /* Once per call, off the timed path, as an engine does once per step:
   * events, and the reattach after a dcpxd restart (until then dcpxctl
   * lists the group as unattached). Its result is not the call's. */
  (void)demo_poll(x);
  if (injected_call(o) >= 0) {
    int recovered = 0;
    r = settle_fault(x, c, r, &recovered);
    if (recovered)
      return r;
  }
  return check_call(x, c);
}

static void gpu_free(gpu_bufs *g) {
#ifdef HAVE_CUDA
  cudaFree(g->lg);
  cudaFree(g->en);
  cudaFree(g->req);
  cudaFree(g->bt);
  cudaFree(g->rows);
  cudaFree(g->ids);
  cudaFree(g->valid);
  cudaFree(g->sat);
  if (g->st)
    cudaStreamDestroy(g->st);
#else
  (void)g;
#endif
}

static void rank_free(rank_ctx *x) {
  dcpx_leave(x->m);
  dcpx_disconnect(x->cl);
  free(x->all);
  free(x->ends);
  free(x->req);
  free(x->bt);
  free(x->rows_out);
  free(x->ids_out);
  free(x->valid);
  free(x->sat);
  free(x->x_rows);
  free(x->x_ids);
  free(x->x_valid);
  free(x->x_sat);
  if (x->o->cuda)
    gpu_free(&x->g);
}

/* A rank process. A replacement (for a killed rank) joins, takes the dead
 * rank's place from call first_call on, where its peers are failing, and
 * recovers with them. Returns the process's exit status. */
static int run_rank(const opts *o, uint32_t rank, shared *sh,
                    uint32_t first_call, int replacement) {
  rank_ctx x;
  const dcpx_shape shape0 = DCPX_SHAPE_INIT;
  const dcpx_join_opts jo0 = DCPX_JOIN_OPTS_INIT;

  memset(&x, 0, sizeof(x));
  x.o = o;
  x.sh = sh;
  x.rank = rank;
  x.first_call = first_call;
  x.replacement = replacement;
  x.shape = shape0;
  x.jo = jo0;
  int r = rank_setup(&x);
  if (r == 0)
    r = rank_join(&x);
  for (uint32_t c = first_call; c < o->calls && r == 0; c++) {
    /* a fault after a restart: the new dcpxd must watch every rank */
    if (o->restart_at >= 0 && (int)c == injected_call(o))
      r = await_attach(&x);
    if (r == 0)
      r = rank_call(&x, c);
    if (r == 0 && (int)c == o->restart_at && rank == 0)
      atomic_store(&sh->restart_req, 1); /* the parent restarts dcpxd */
  }
  if (r == 0 && o->restart_at >= 0)
    r = await_attach(&x);
  if (r == 0)
    r = check_counters(&x);
  /* Every rank has finished its calls before any leaves: a Leave aborts a
   * ready group, so a rank that left at once failed a peer still at the
   * start of its last merge (DCPX_E_ABORTED; seen in CI under load). An
   * engine ends its last step collectively too. A broken barrier (a rank
   * that stopped) lets the others go on. */
  if (r == 0)
    (void)rb_wait(&sh->barrier);
  sh->status[rank] = r;
  if (r < 0) {
    rb_break(&sh->barrier); /* the others stop at their next call */
    fprintf(stderr, "dcpx-demo: rank %u: %s (%d)\n", rank, dcpx_strerror(r),
            r);
  }
  rank_free(&x);
  return r < 0 ? 1 : 0;
}

/* Where the private dcpxd's log goes: --daemon-log, else its runtime
 * folder (removed at the end). */
static void daemon_log_path(const opts *o, const char *dir, char *buf,
                            size_t n) {
  if (o->daemon_log)
    snprintf(buf, n, "%s", o->daemon_log);
  else
    snprintf(buf, n, "%s/dcpxd.log", dir);
}

/* Starts a private dcpxd; returns its pid, with the socket path in sock.
 * again: a restart (--restart-at), whose log follows the first one's. */
static pid_t start_daemon(const opts *o, char *dir, char *sock, size_t n,
                          int again) {
  char state[700], exe[600], self[512];
  const char *bin = o->dcpxd ? o->dcpxd : getenv("DCPXD");
  pid_t pid;

  if (!bin) {
    ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (k < 0)
      return -1;
    self[k] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
      *slash = 0;
    /* tools/dcpx-demo -> daemon/dcpxd; libtool puts us in tools/.libs. */
    snprintf(exe, sizeof(exe), "%s/../daemon/dcpxd", self);
    if (access(exe, X_OK) != 0)
      snprintf(exe, sizeof(exe), "%s/../../daemon/dcpxd", self);
    if (access(exe, X_OK) != 0)
      snprintf(exe, sizeof(exe), "dcpxd");
    bin = exe;
  }
  snprintf(sock, n, "%s/dcpxd.sock", dir);
  snprintf(state, sizeof(state), "%s/state", dir);
  const pid_t parent = getpid();
  pid = fork();
  if (pid == 0) {
    /* It stops (and its runtime folder can go) if the demo is killed. */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
      _exit(1);
    /* The daemon's log goes to the runtime folder, not the report. */
    char log[700];
    daemon_log_path(o, dir, log, sizeof(log));
    if (!freopen(log, again || o->daemon_log ? "a" : "w", stderr))
      _exit(126);
    execlp(bin, bin, "--socket", sock, "--state-dir", state, "--config=",
           "--log-level=info",
           o->fault_at >= 0 ? "--enable-fault-injection" : (char *)NULL,
           (char *)NULL);
    fprintf(stderr, "dcpx-demo: cannot run %s: %s\n", bin, strerror(errno));
    fflush(stderr); /* freopen made it buffered; _exit flushes nothing */
    _exit(127);
  }
  if (pid < 0)
    return -1;
  /* Wait until it accepts connections. */
  for (int i = 0; i < 500; i++) {
    dcpx_client *c;
    if (dcpx_connect(sock, &c) == 0) {
      dcpx_disconnect(c);
      return pid;
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      if (WIFEXITED(st))
        fprintf(stderr, "dcpx-demo: %s exited with status %d at start\n",
                bin, WEXITSTATUS(st));
      else
        fprintf(stderr, "dcpx-demo: %s was killed by signal %d at start\n",
                bin, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      return -1;
    }
    usleep(10000);
  }
  fprintf(stderr, "dcpx-demo: %s did not accept connections within 5 s\n",
          bin);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  return -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: dcpx-demo [--world W] [--rows R] [--calls C] [--topk K]\n"
          "                 [--local-topk N] [--local-len L] [--block-size B]\n"
          "                 [--interleave I] [--socket PATH] [--dcpxd PATH]\n"
          "                 [--seed S] [--group NAME] [--quiet]\n"
          "                 [--backend host|cuda] [--device N] [--spread]\n"
          "                 [--transport auto|ll|nccl]\n"
          "                 [--fault-at CALL | --kill-at CALL | --stop-at "
          "CALL]\n"
          "                 [--fault-rank R]\n"
          "                 [--restart-at CALL [--restart-signal kill|term]]\n"
          "                 [--daemon-log PATH]\n"
          "                 [-h | --help]\n");
}

/* --help: the synopsis, then what each option means and its default. */
static void help(void) {
  usage(stdout);
  fputs(
      "\n"
      "W rank processes join one group through dcpxd and run C calls of R\n"
      "rows; every call is checked bit for bit against the CPU reference.\n"
      "Prints latency percentiles, the rescue rate, 'exact: n/m calls' (m:\n"
      "the calls an injected fault did not fail) and 'counters: ok ...';\n"
      "exit 0 only if every call was exact.\n"
      "\n"
      "  --world W        ranks (default 8; 1..16)\n"
      "  --rows R         rows per call (default 64)\n"
      "  --calls C        calls (default 50)\n"
      "  --topk K         the global top-K (default 2048)\n"
      "  --local-topk N   candidates each rank pushes (default 512; 0: the\n"
      "                   library's choice for W and K)\n"
      "  --local-len L    logits per rank and row (default 16384)\n"
      "  --block-size B   KV block size of the block table (default 64)\n"
      "  --interleave I   DCP interleave of token positions (default 1)\n"
      "  --socket PATH    use this running dcpxd (default: start a private\n"
      "                   one in a fresh $TMPDIR/dcpx-demo.* folder)\n"
      "  --dcpxd PATH     the dcpxd to start (default $DCPXD, else\n"
      "                   ../daemon/dcpxd next to this program, else PATH)\n"
      "  --seed S         input generator seed (default 1)\n"
      "  --group NAME     group name (default demo-PID)\n"
      "  --quiet          only the summary lines\n"
      "  --version        the version, and exit\n"
      "  --backend B      host (shared memory) or cuda (default host)\n"
      "  --device N       CUDA device of every rank (default 0)\n"
      "  --spread         CUDA: rank r on device r % (device count)\n"
      "  --transport T    auto (default), ll or nccl (CUDA only)\n"
      "  --fault-at CALL  stall --fault-rank's merge in call CALL (calls\n"
      "                   count from 0; needs a private dcpxd: fault\n"
      "                   injection); the group aborts,\n"
      "                   recovers, and the calls after it must be exact\n"
      "  --kill-at CALL   kill -9 --fault-rank after its push in call CALL;\n"
      "                   a new process replaces it\n"
      "  --stop-at CALL   stop --fault-rank (SIGSTOP) before its push in\n"
      "                   call CALL, for three wait limits (0.9 s): its\n"
      "                   peers' waits give up, the group aborts; continued,\n"
      "                   it recovers with them\n"
      "  --fault-rank R   the rank a fault hits (default 1, or 0 when\n"
      "                   W = 1)\n"
      "  --restart-at CALL  stop the private dcpxd after call CALL and\n"
      "                   start it again while the calls go on; every rank\n"
      "                   must reattach (the new dcpxd adopts the group)\n"
      "                   before a fault injected after it, and by the end\n"
      "  --restart-signal S  kill (SIGKILL, default) or term (SIGTERM)\n"
      "  --daemon-log PATH  the private dcpxd's log (appended to, and kept;\n"
      "                   default: its runtime folder's, removed at the end)\n"
      "  -h, --help       this text\n",
      stdout);
}

/* Where this program lives (dcpxd and dcpxctl are found from there). */
static void find_self_dir(opts *o) {
  ssize_t k = readlink("/proc/self/exe", o->self_dir, sizeof(o->self_dir) - 1);
  if (k > 0) {
    o->self_dir[k] = 0;
    char *slash = strrchr(o->self_dir, '/');
    if (slash)
      *slash = 0;
  } else {
    strcpy(o->self_dir, ".");
  }
}

/* A numeric option's value (dcpxd_parse_num: decimal or 0x hex, never
 * octal), from lo to hi. 0, or -1 after saying what is wrong. */
static int parse_num(const char *name, const char *s, uint64_t lo,
                     uint64_t hi, uint64_t *ret) {
  if (dcpxd_parse_num(s, ret) < 0 || *ret < lo || *ret > hi) {
    fprintf(stderr, "dcpx-demo: --%s: '%s' is not a number from %llu to "
                    "%llu\n",
            name, s, (unsigned long long)lo, (unsigned long long)hi);
    return -1;
  }
  return 0;
}

/* The range of numeric option ch: the shape's limits (dcpx.h) for the
 * shape's options, so that a value out of them is named with them. */
static void num_range(int ch, uint64_t *lo, uint64_t *hi) {
  *lo = 0;
  *hi = UINT32_MAX;
  switch (ch) {
  case 'w': *lo = 1; *hi = DCPX_MAX_WORLD; break;
  case 'r': *lo = 1; *hi = DCPX_MAX_ROWS; break;
  case 'k': *lo = 2; *hi = DCPX_MAX_TOPK; break;
  case 'n': *hi = DCPX_MAX_TOPK - 1u; break; /* 0: the library's choice */
  case 'l': *lo = 1; *hi = DCPX_MAX_LOCAL; break;
  case 'c': case 'b': case 'i': *lo = 1; break;
  case 'S': *hi = UINT64_MAX; break;
  case 'D': case 'F': case 'K': case 'X': case 'A': *hi = INT_MAX; break;
  default: break;
  }
}

/* A word option's value: vals[i] for arg == words[i] (n of them), or
 * -1 after naming the words --opt takes. */
static int pick_word(const char *opt, const char *arg,
                     const char *const *words, const int *vals, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(arg, words[i]))
      return vals[i];
  fprintf(stderr, "dcpx-demo: --%s", opt);
  for (int i = 0; i < n; i++)
    fprintf(stderr, "%c%s", i ? '|' : ' ', words[i]);
  fputc('\n', stderr);
  return -1;
}

/* Option ch of getopt_long's, with its value arg (v when a number): -1
 * to go on, or the exit status (0 after --help, 2 on a bad value). */
static int set_option(opts *o, int ch, const char *arg, uint64_t v) {
  static const char *const backends[] = {"host", "cuda"};
  static const int backend_v[] = {0, 1};
  static const char *const transports[] = {"auto", "ll", "nccl"};
  static const int transport_v[] = {DCPX_TRANSPORT_AUTO, DCPX_TRANSPORT_LL,
                                    DCPX_TRANSPORT_NCCL};
  static const char *const signals[] = {"kill", "term"};
  static const int signal_v[] = {SIGKILL, SIGTERM};
  int w;
  switch (ch) {
  case 'w': o->world = (uint32_t)v; break;
  case 'r': o->rows = (uint32_t)v; break;
  case 'c': o->calls = (uint32_t)v; break;
  case 'k': o->topk = (uint32_t)v; break;
  case 'n': o->local_topk = (uint32_t)v; break;
  case 'l': o->local_len = (uint32_t)v; break;
  case 'b': o->block_size = (uint32_t)v; break;
  case 'i': o->interleave = (uint32_t)v; break;
  case 's': o->socket = arg; break;
  case 'd': o->dcpxd = arg; break;
  case 'S': o->seed = v; break;
  case 'g': o->group = arg; break;
  case 'q': o->quiet = 1; break;
  case 'B':
    if ((w = pick_word("backend", arg, backends, backend_v, 2)) < 0)
      return 2;
    o->cuda = w;
    break;
  case 'D':
    o->device = (int)v;
    o->device_given = 1;
    break;
  case 'P': o->spread = 1; break;
  case 'F': o->fault_at = (int)v; break;
  case 'R':
    o->fault_rank = (uint32_t)v;
    o->fault_rank_given = 1;
    break;
  case 'K': o->kill_at = (int)v; break;
  case 'X': o->stop_at = (int)v; break;
  case 'A': o->restart_at = (int)v; break;
  case 'L': o->daemon_log = arg; break;
  case 'G':
    if ((w = pick_word("restart-signal", arg, signals, signal_v, 2)) < 0)
      return 2;
    o->restart_sig = w;
    o->restart_sig_given = 1;
    break;
  case 'T':
    if ((w = pick_word("transport", arg, transports, transport_v, 3)) < 0)
      return 2;
    o->transport = (uint32_t)w;
    break;
  case 'h': help(); return 0;
  case 'V': printf("dcpx-demo %s\n", dcpx_version()); return 0;
  default: usage(stderr); return 2;
  }
  return -1;
}

/* Returns -1 to run, or the exit status (0 after --help, 2 on bad
 * arguments). */
static int parse_args(opts *o, int argc, char **argv) {
  static const struct option lo[] = {
      {"world", 1, 0, 'w'},      {"rows", 1, 0, 'r'},
      {"calls", 1, 0, 'c'},      {"topk", 1, 0, 'k'},
      {"local-topk", 1, 0, 'n'}, {"local-len", 1, 0, 'l'},
      {"block-size", 1, 0, 'b'}, {"interleave", 1, 0, 'i'},
      {"socket", 1, 0, 's'},     {"dcpxd", 1, 0, 'd'},
      {"seed", 1, 0, 'S'},       {"group", 1, 0, 'g'},
      {"quiet", 0, 0, 'q'},      {"help", 0, 0, 'h'},
      {"backend", 1, 0, 'B'},    {"device", 1, 0, 'D'},
      {"spread", 0, 0, 'P'},     {"fault-at", 1, 0, 'F'},
      {"fault-rank", 1, 0, 'R'},  {"kill-at", 1, 0, 'K'},
      {"stop-at", 1, 0, 'X'},    {"transport", 1, 0, 'T'},
      {"restart-at", 1, 0, 'A'}, {"restart-signal", 1, 0, 'G'},
      {"daemon-log", 1, 0, 'L'}, {"version", 0, 0, 'V'},
      {0, 0, 0, 0}};
  int ch, rc, li = -1;

  while ((ch = getopt_long(argc, argv, "h", lo, &li)) != -1) {
    uint64_t v = 0;
    /* Every option with a value but these is a number. */
    uint64_t vlo, vhi;
    num_range(ch, &vlo, &vhi);
    if (optarg && !strchr("sdgBTGL", ch) &&
        parse_num(li >= 0 ? lo[li].name : "?", optarg, vlo, vhi, &v) < 0)
      return 2;
    li = -1;
    if ((rc = set_option(o, ch, optarg, v)) >= 0)
      return rc;
  }
  if (optind < argc) {
    fprintf(stderr, "dcpx-demo: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  /* before the build check: wrong in any build */
  if (o->device_given && o->spread) {
    fprintf(stderr, "dcpx-demo: --device and --spread each pick the ranks' "
                    "devices: give one of them\n");
    return 2;
  }
#ifndef HAVE_CUDA
  if (o->cuda) {
    fprintf(stderr, "dcpx-demo: --backend cuda: this build has no CUDA "
                    "(configure --with-cuda)\n");
    return 2;
  }
#endif
  if (!o->fault_rank_given && o->world == 1)
    o->fault_rank = 0;
  if (!o->local_topk) /* 0: the library's choice, as in dcpx_shape */
    o->local_topk = dcpx_shape_auto_local_topk(o->world, o->topk);
  return -1;
}

/* 1 if s is a group name dcpxd takes: 1..DCPX_GROUP_NAME_MAX bytes of
 * [A-Za-z0-9._-] (dcpx.h). */
static int group_name_ok(const char *s) {
  size_t n = strlen(s);
  if (n < 1 || n > DCPX_GROUP_NAME_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
          (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' ||
          s[i] == '-'))
      return 0;
  return 1;
}

/* The host memory this machine has for new work: MemAvailable, or the
 * free pages where /proc/meminfo lacks it; 0 if neither is known. */
static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[128];
  unsigned long long kib;
  if (f) {
    while (fgets(line, sizeof(line), f))
      if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        fclose(f);
        return (uint64_t)kib * 1024u;
      }
    fclose(f);
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

/* The parent's block shared with the ranks (shared_map): the header, the
 * latencies of every rank and call, three flags per call. */
static size_t shared_bytes(const opts *o) {
  return sizeof(shared) + sizeof(double) * o->world * (size_t)o->calls +
         3 * (size_t)o->calls;
}

/* The host memory a run takes: each rank process holds every rank's
 * logits and row ends (the reference needs them all), its block table and
 * four rows x K output arrays (its own and the reference's); the host
 * backend's workspaces (dcpxd's memfds, shared by the ranks) add
 * W x ws_bytes and the control page, the parent's shared block its
 * latency table (shared_bytes). A shape within dcpx's limits can
 * need far more than the machine has (W 16, rows 4096, local 131072:
 * about 256 GiB), and the ranks' allocations would succeed (overcommit)
 * until the OOM killer took a rank or dcpxd. Exact to within the ranks'
 * small fixed buffers. */
static uint64_t run_bytes(const opts *o, uint64_t *ws) {
  const uint64_t W = o->world, R = o->rows, K = o->topk;
  const uint64_t cols = bt_cols_of(o);
  uint64_t rank = 2 * W * R * o->local_len + 4 * W * R + 4 * R * cols +
                  4 * 4 * R * K + 16 * R;
  *ws = 0;
  if (!o->cuda) {
    dcpx_layout L;
    uint32_t n = o->local_topk ? o->local_topk
                               : dcpx_shape_auto_local_topk(o->world, o->topk);
    dcpx_layout_compute(&L, o->world, o->rows, o->topk, n);
    *ws = W * L.ws_bytes + L.ctl_bytes;
  }
  return W * rank + *ws + shared_bytes(o);
}

/* Returns 0, or 2 (and says why) if the shape, the group name or the
 * fault is bad, or the run needs more host memory than is available. */
static int check_opts(const opts *o) {
  dcpx_shape probe = DCPX_SHAPE_INIT;
  probe.world = o->world;
  probe.rows = o->rows;
  probe.topk = o->topk;
  probe.local_topk = o->local_topk;
  probe.block_size = o->block_size ? o->block_size : 1;
  probe.interleave = o->interleave;
  probe.max_local = o->local_len;
  char why[200];
  int sc = dcpx_shape_explain(&probe, why, sizeof(why));
  if (sc < 0 || !o->block_size) {
    fprintf(stderr, "dcpx-demo: bad shape: %s\n",
            sc < 0 ? why : "block size must be > 0");
    return 2;
  }
  if (!o->calls) {
    fprintf(stderr, "dcpx-demo: --calls must be > 0\n");
    return 2;
  }
  /* Refused here, before dcpxd and the ranks start: every rank's join
   * was refused, and the run printed latencies of no calls. */
  if (o->group && !group_name_ok(o->group)) {
    fprintf(stderr, "dcpx-demo: --group '%s': a group name is 1..%d bytes "
                    "of [A-Za-z0-9._-]\n", o->group, DCPX_GROUP_NAME_MAX);
    return 2;
  }
  /* An empty --socket (`--socket "$S"` with S unset): libdcpx takes it for
   * none and connects to $DCPX_SOCKET's or the default dcpxd, not to a
   * private one either. */
  if (o->socket && !o->socket[0]) {
    fprintf(stderr, "dcpx-demo: --socket needs a path (leave it out for a "
                    "private dcpxd)\n");
    return 2;
  }
  /* libdcpx refuses it (DCPX_E_RANGE), which read as "no such socket" */
  const size_t sun_max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
  if (o->socket && strlen(o->socket) > sun_max) {
    fprintf(stderr, "dcpx-demo: --socket: the path is %zu bytes; a socket "
                    "path is at most %zu\n", strlen(o->socket), sun_max);
    return 2;
  }
  /* Both pick devices: on the host backend there is none to pick, and
   * with both one of them would be ignored without a word. */
  if ((o->device_given || o->spread) && !o->cuda) {
    fprintf(stderr, "dcpx-demo: --device and --spread are options of "
                    "--backend cuda\n");
    return 2;
  }
  if (o->fault_rank_given &&
      (o->fault_rank >= o->world ||
       (o->fault_at < 0 && o->kill_at < 0 && o->stop_at < 0))) {
    fprintf(stderr, "dcpx-demo: --fault-rank needs a rank < world and one "
                    "of --fault-at, --kill-at, --stop-at\n");
    return 2;
  }
  /* Request t's KV blocks are ids t * cols .. (t + 1) * cols - 1, so
   * KV rows reach rows * cols * B - 1, which must be an int32. */
  const uint64_t cols = bt_cols_of(o);
  if ((uint64_t)o->rows * cols * o->block_size > (uint64_t)INT32_MAX + 1u) {
    fprintf(stderr, "dcpx-demo: bad shape: the block table's KV rows "
                    "(rows x blocks per row x block size) exceed int32\n");
    return 2;
  }
  if ((o->fault_at >= 0 || o->stop_at >= 0) && o->world < 2) {
    fprintf(stderr, "dcpx-demo: --fault-at and --stop-at need --world >= 2 "
                    "(a stall is felt by the peers that wait for it)\n");
    return 2;
  }
  const int faults =
      (o->fault_at >= 0) + (o->kill_at >= 0) + (o->stop_at >= 0);
  if (faults &&
      (o->fault_rank >= o->world || faults > 1 ||
       (uint32_t)injected_call(o) >= o->calls)) {
    fprintf(stderr, "dcpx-demo: --fault-at/--kill-at/--stop-at need a call "
                    "< calls, a --fault-rank < world, and only one of "
                    "them\n");
    return 2;
  }
  if (o->daemon_log && (o->socket || !o->daemon_log[0])) {
    fprintf(stderr, "dcpx-demo: --daemon-log needs a path, and the demo's "
                    "own dcpxd (no --socket)\n");
    return 2;
  }
  if (o->daemon_log) { /* dcpxd's child could only exit 126 */
    const int fd = open(o->daemon_log,
                        O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      fprintf(stderr, "dcpx-demo: --daemon-log %s: %s\n", o->daemon_log,
              strerror(errno));
      return 2;
    }
    close(fd);
  }
  if (o->restart_sig_given && o->restart_at < 0) {
    fprintf(stderr, "dcpx-demo: --restart-signal needs --restart-at\n");
    return 2;
  }
  if (o->restart_at >= 0 &&
      (o->socket || (uint32_t)o->restart_at >= o->calls ||
       (faults && injected_call(o) <= o->restart_at))) {
    fprintf(stderr, "dcpx-demo: --restart-at needs the demo's own dcpxd (no "
                    "--socket), a call < calls, and a fault injected after "
                    "it, if any\n");
    return 2;
  }
  if (o->transport == DCPX_TRANSPORT_NCCL && !o->cuda) {
    fprintf(stderr, "dcpx-demo: --transport nccl needs --backend cuda\n");
    return 2;
  }
  if (o->transport == DCPX_TRANSPORT_NCCL && o->fault_at >= 0) {
    fprintf(stderr, "dcpx-demo: --fault-at needs the ll transport (the nccl "
                    "transport has no fault hook: use --kill-at or "
                    "--stop-at)\n");
    return 2;
  }
  uint64_t ws;
  const uint64_t need = run_bytes(o, &ws), avail = mem_available();
  if (avail && need > avail) {
    fprintf(stderr, "dcpx-demo: this run needs about %.1f GiB of host "
                    "memory (each of the %u ranks holds every rank's logits "
                    "for the reference check; the host backend's workspaces "
                    "take %.1f GiB of it), and %.1f GiB is available: lower "
                    "--world, --rows, --local-len or --calls\n",
            need / 1073741824.0, o->world, ws / 1073741824.0,
            avail / 1073741824.0);
    return 2;
  }
  return 0;
}

/* The memory the parent shares with the ranks; NULL on failure. */
static shared *shared_map(const opts *o, size_t *ret_bytes) {
  size_t latbytes = sizeof(double) * o->world * o->calls;
  size_t shbytes = shared_bytes(o);
  shared *sh = mmap(NULL, shbytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("dcpx-demo: mmap");
    return NULL;
  }
  /* -1: a call this rank never timed (the run stopped before it) */
  for (size_t i = 0; i < (size_t)o->world * o->calls; i++)
    sh->lat_us[i] = -1.0;
  sh->bad = (uint8_t *)sh + sizeof(shared) + latbytes;
  sh->faulted = sh->bad + o->calls;
  sh->checked = sh->faulted + o->calls;
  rb_init(&sh->barrier, o->world);
  for (uint32_t r = 0; r < DCPX_MAX_WORLD; r++)
    sh->reattach_ms[r] = -1.0;
  *ret_bytes = shbytes;
  return sh;
}

/* SIGINT or SIGTERM to the parent: it stops the ranks and its dcpxd,
 * removes its runtime folder, then dies of that signal. */
static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

static void catch_signals(void (*fn)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = fn; /* no SA_RESTART: waitpid returns EINTR */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

static pid_t fork_rank(const opts *o, uint32_t r, shared *sh, uint32_t first,
                       int replacement) {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    catch_signals(SIG_DFL);
    /* A rank outlives no parent (killed, it breaks no barrier and reaps
     * nobody): it would run its calls out alone. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
      _exit(1);
    _exit(run_rank(o, r, sh, first, replacement));
  }
  return pid;
}

static void show_daemon_log(const opts *o, const char *dir);

/* --restart-at, in the parent: stops dcpxd (o->restart_sig), waits for it,
 * and starts it again on the same socket and state folder (the groups
 * file), while the ranks go on calling. A dcpxd that does not start
 * again is reported; *daemon_pid is then 0, which fails the run. */
static void restart_daemon(const opts *o, shared *sh, pid_t *daemon_pid,
                           char *dir, char *sock, size_t n) {
  int st;
  if (*daemon_pid > 0) {
    kill(*daemon_pid, o->restart_sig);
    while (waitpid(*daemon_pid, &st, 0) < 0 && errno == EINTR)
      ;
    *daemon_pid = start_daemon(o, dir, sock, n, 1);
  }
  if (*daemon_pid <= 0) {
    fprintf(stderr, "dcpx-demo: dcpxd did not start again after the "
                    "restart; its log:\n");
    show_daemon_log(o, dir);
    *daemon_pid = 0;
    atomic_store(&sh->restarted, -1);
    return;
  }
  sh->restarted_us = now_us();
  atomic_store(&sh->restarted, 1);
}

/* Forks the ranks and waits for them; with --kill-at, a new process
 * replaces the killed rank. Returns how many ranks failed; after a
 * signal, every rank is killed and reaped. *daemon_pid (the private
 * dcpxd, or 0) is a child too: if it exits during the run it is reported
 * and set to 0 (reaped), not counted as a rank. */
static int run_ranks(const opts *o, shared *sh, pid_t *daemon_pid,
                     char *dir, char *sock, size_t n) {
  pid_t kids[DCPX_MAX_WORLD];
  for (uint32_t r = 0; r < o->world; r++)
    kids[r] = fork_rank(o, r, sh, 0, 0);
  int failed = 0, replaced = 0, restart = o->restart_at >= 0;
  for (uint32_t left = o->world; left > 0;) {
    int st;
    if (restart && atomic_load(&sh->restart_req)) {
      restart = 0;
      restart_daemon(o, sh, daemon_pid, dir, sock, n);
    }
    /* until the restart, rank 0's request is looked for every 2 ms */
    const int flags =
        (o->stop_at >= 0 ? WUNTRACED : 0) | (restart ? WNOHANG : 0);
    pid_t p = g_signal ? -1 : waitpid(-1, &st, flags);
    if (p == 0) {
      usleep(2000);
      continue;
    }
    if (p < 0 && errno == EINTR && !g_signal)
      continue;
    if (p < 0) { /* a signal (or no children left) */
      for (uint32_t r = 0; g_signal && r < o->world; r++)
        if (kids[r] > 0 && kill(kids[r], SIGKILL) == 0)
          while (waitpid(kids[r], &st, 0) < 0 && errno == EINTR)
            ;
      break;
    }
    if (*daemon_pid > 0 && p == *daemon_pid) {
      if (WIFEXITED(st))
        fprintf(stderr, "dcpx-demo: dcpxd exited during the run (status "
                        "%d)\n", WEXITSTATUS(st));
      else
        fprintf(stderr, "dcpx-demo: dcpxd was killed during the run "
                        "(signal %d)\n", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      *daemon_pid = 0;
      continue;
    }
    uint32_t r = 0;
    while (r < o->world && kids[r] != p)
      r++;
    if (r == o->world)
      continue; /* not ours */
    if (WIFSTOPPED(st)) { /* --stop-at: its peers give up meanwhile */
      const uint64_t ns = DEMO_STOP_LIMITS * DEMO_FAULT_TIMEOUT_NS;
      struct timespec ts = {(time_t)(ns / 1000000000ull),
                            (long)(ns % 1000000000ull)};
      while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !g_signal)
        ;
      kill(p, SIGCONT);
      continue;
    }
    if (o->kill_at >= 0 && !replaced && p == kids[o->fault_rank] &&
        WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      /* The killed rank: a new process joins as that rank. */
      replaced = 1;
      kids[o->fault_rank] =
          fork_rank(o, o->fault_rank, sh, (uint32_t)o->kill_at, 1);
      continue;
    }
    left--;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      failed++;
      /* A rank killed by a signal never broke the barrier itself: its
       * peers would wait at it forever. */
      rb_break(&sh->barrier);
    }
  }
  return failed;
}

/* Latency percentiles, the rescue rate and join-to-ready: of the calls
 * and joins that were made. A run that stopped early (a rank failed, no
 * dcpxd) printed percentiles over its calls never made, as 0 us. */
static void report_perf(const opts *o, shared *sh, double wall) {
  size_t n = (size_t)o->world * o->calls, skip = 0;
  qsort(sh->lat_us, n, sizeof(double), cmp_double);
  while (skip < n && sh->lat_us[skip] < 0) /* never timed: sorted first */
    skip++;
  const double *lat = sh->lat_us + skip;
  n -= skip;
  printf("dcpx-demo: W=%u rows=%u N=%u K=%u local=%u calls=%u backend=%s "
         "(%.1f s wall, the ranks' start to their end)\n",
         o->world, o->rows, o->local_topk, o->topk, o->local_len, o->calls,
         o->cuda ? "cuda" : "host", wall);
  if (n == 0)
    printf("call latency (push+merge, per rank, us): no call was made\n");
  else
    printf("call latency (push+merge, per rank, us): p50 %.1f  p90 %.1f  "
           "p99 %.1f  max %.1f%s\n"
           "  (each rank's push + merge from the call's start barrier to the "
           "merge's return%s: waits for the slowest peer, includes injected "
           "faults; %s)\n",
           lat[n / 2], lat[n * 9 / 10], lat[n * 99 / 100], lat[n - 1],
           skip ? " (of the calls made)" : "",
           o->cuda ? " and its stream's sync" : "",
           o->cuda ? "kernel figures: bench/RESULTS.md"
                   : "host backend: CPU-bound, W processes on this machine's "
                     "cores, not comparable with GPU figures");
  printf("rescue rate: %.2f%% of rows (%llu of %llu)\n",
         sh->rows ? 100.0 * (double)sh->rescue_rows / (double)sh->rows : 0.0,
         (unsigned long long)sh->rescue_rows, (unsigned long long)sh->rows);
  /* Join-to-ready: from the last rank's dcpx_join call (the moment the
   * group can form) to the last rank's return (all members mapped). */
  double last_call = 0, last_ret = 0;
  uint32_t joined = 0;
  for (uint32_t r = 0; r < o->world; r++) {
    joined += sh->join_end[r] > 0;
    if (sh->join_start[r] > last_call)
      last_call = sh->join_start[r];
    if (sh->join_end[r] > last_ret)
      last_ret = sh->join_end[r];
  }
  if (joined < o->world)
    printf("join-to-ready: none (%u of %u ranks joined)\n", joined,
           o->world);
  else
    printf("join-to-ready: %.0f us (last join call to last member ready)\n",
           last_ret - last_call);
}

/* The fault and exact lines; returns the exit status. */
static int report_calls(const opts *o, const shared *sh, int failed) {
  uint32_t exact = 0, faulted = 0;
  if (failed) {
    /* The calls every rank checked before it stopped: exact or not. */
    uint32_t done = 0;
    for (uint32_t c = 0; c < o->calls; c++)
      if (sh->checked[c] >= o->world) {
        done++;
        exact += !sh->bad[c];
      }
    printf("ranks failed: %d\n", failed);
    printf("exact: %u/%u calls (the calls every rank completed before "
           "the failure, of %u)\n", exact, done, o->calls);
    return 1;
  }
  for (uint32_t c = 0; c < o->calls; c++) {
    faulted += sh->faulted[c];
    exact += !sh->bad[c] && !sh->faulted[c];
  }
  if (injected_call(o) >= 0 && !faulted) {
    printf("fault: no call failed: the %s of rank %u in call %d did not "
           "take (a dcpxd without --enable-fault-injection refuses to arm "
           "a stall)\n",
           o->fault_at >= 0 ? "stall" : o->kill_at >= 0 ? "kill" : "stop",
           o->fault_rank,
           injected_call(o));
  } else if (injected_call(o) >= 0) {
    double worst = 0;
    for (uint32_t r = 0; r < o->world; r++)
      if (sh->recover_ms[r] > worst)
        worst = sh->recover_ms[r];
    printf("fault: rank %u %s in call %d; %u call(s) failed as "
           "injected; recovery took %.1f ms (slowest rank)\n",
           o->fault_rank, fault_done(o), injected_call(o), faulted, worst);
  }
  /* Injected failures are not calls the reference can check. */
  uint32_t checked = o->calls - faulted;
  printf("exact: %u/%u calls\n", exact, checked);
  return (exact == checked &&
          (injected_call(o) < 0 ||
           (faulted == 1 && sh->faulted[injected_call(o)])))
             ? 0
             : 1;
}

/* --restart-at: one `restart:` line; returns 1 if dcpxd did not restart
 * or a rank was not seen attached to the new one. */
static int report_restart(const opts *o, const shared *sh) {
  uint32_t n = 0, polls = 0;
  double worst = 0;
  if (o->restart_at < 0)
    return 0;
  if (atomic_load(&sh->restarted) <= 0) {
    printf("restart: dcpxd was not restarted after call %d\n", o->restart_at);
    return 1;
  }
  for (uint32_t r = 0; r < o->world; r++)
    if (sh->reattach_ms[r] >= 0) {
      n++;
      worst = sh->reattach_ms[r] > worst ? sh->reattach_ms[r] : worst;
      polls = sh->reattach_polls[r] > polls ? sh->reattach_polls[r] : polls;
    }
  printf("restart: dcpxd stopped (%s) after call %d and started again; "
         "%u/%u ranks reattached (the last %.1f ms after the restart, "
         "each within %u dcpx_poll calls)\n",
         o->restart_sig == SIGKILL ? "SIGKILL" : "SIGTERM", o->restart_at, n,
         o->world, worst, polls);
  return n < o->world;
}

static int tally_eq(const tally *a, const tally *b) {
  return a->calls == b->calls && a->rows == b->rows &&
         a->rescue_rows == b->rescue_rows && a->failed_calls == b->failed_calls;
}

/* The counters line(s): one `counters: ok` line, or a `counters:` line
 * for each rank whose health block disagrees with its calls. Returns 0 if
 * every rank checked and agreed (or ranks failed: reported already). */
static int report_counters(const opts *o, const shared *sh, int failed) {
  uint32_t bad = 0;
  tally sum = {0, 0, 0, 0};
  if (failed)
    return 1;
  for (uint32_t r = 0; r < o->world; r++) {
    const ctr_check *k = &sh->ctr[r];
    if (!k->checked) {
      printf("counters: rank %u did not check its counters\n", r);
      bad++;
    } else if (!tally_eq(&k->want, &k->seen)) {
      printf("counters: MISMATCH rank %u: dcpx_health says calls %llu rows "
             "%llu rescue_rows %llu failed_calls %llu; its calls say %llu "
             "%llu %llu %llu\n",
             r, (unsigned long long)k->seen.calls,
             (unsigned long long)k->seen.rows,
             (unsigned long long)k->seen.rescue_rows,
             (unsigned long long)k->seen.failed_calls,
             (unsigned long long)k->want.calls,
             (unsigned long long)k->want.rows,
             (unsigned long long)k->want.rescue_rows,
             (unsigned long long)k->want.failed_calls);
      bad++;
    }
    sum.calls += k->seen.calls;
    sum.rows += k->seen.rows;
    sum.rescue_rows += k->seen.rescue_rows;
    sum.failed_calls += k->seen.failed_calls;
  }
  if (bad)
    return 1;
  printf("counters: ok: %u ranks' dcpx_health match their calls (%s; all "
         "ranks: calls %llu rows %llu rescue_rows %llu failed_calls %llu)\n",
         o->world,
         o->cuda ? "cuda: all but each rank's last merge" : "host: every call",
         (unsigned long long)sum.calls, (unsigned long long)sum.rows,
         (unsigned long long)sum.rescue_rows,
         (unsigned long long)sum.failed_calls);
  return 0;
}

static void remove_dir(const char *dir) {
  if (nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    fprintf(stderr, "dcpx-demo: could not remove %s\n", dir);
}

/* The private dcpxd's log (its last 4 KiB), to stderr. */
static void show_daemon_log(const opts *o, const char *dir) {
  char path[600], buf[4096];
  daemon_log_path(o, dir, path, sizeof(path));
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  if (fseek(f, 0, SEEK_END) == 0 && ftell(f) > (long)sizeof(buf))
    fseek(f, -(long)sizeof(buf), SEEK_END);
  else
    fseek(f, 0, SEEK_SET);
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
    fwrite(buf, 1, n, stderr);
  fclose(f);
}

static void stop_daemon(pid_t pid, const char *dir) {
  int st;
  kill(pid, SIGTERM);
  waitpid(pid, &st, 0);
  remove_dir(dir);
}

/* The report (or the help) must have reached standard output: on a full
 * disk or a closed descriptor it was lost, and a run that was all exact
 * exited 0 all the same. Says so, and fails the run. */
static int stdout_done(int rc) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout))
    return rc;
  fprintf(stderr, "dcpx-demo: cannot write standard output: %s\n",
          errno ? strerror(errno) : "write error");
  return rc ? rc : 1;
}

int main(int argc, char **argv) {
  opts o = {.world = 8, .rows = 64, .calls = 50, .topk = 2048,
            .local_topk = 512, .local_len = 16384, .block_size = 64,
            .interleave = 1, .seed = 1, .fault_at = -1, .kill_at = -1,
            .stop_at = -1, .restart_at = -1, .restart_sig = SIGKILL,
            .fault_rank = 1, .self_dir = "."};
  char dir[128], sock[600], group[64];
  pid_t daemon_pid = 0;
  size_t shbytes = 0;
  int rc;

  find_self_dir(&o);
  if ((rc = parse_args(&o, argc, argv)) >= 0 || (rc = check_opts(&o)) != 0)
    return stdout_done(rc);
  if (!o.group) {
    snprintf(group, sizeof(group), "demo-%d", (int)getpid());
    o.group = group;
  }
  catch_signals(on_signal);
  if (!o.socket) {
    /* $TMPDIR when its socket path fits sockaddr_un, else /tmp */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0] || strlen(tmp) > 64)
      tmp = "/tmp";
    snprintf(dir, sizeof(dir), "%s/dcpx-demo.XXXXXX", tmp);
    if (!mkdtemp(dir)) {
      perror("dcpx-demo: mkdtemp");
      return 1;
    }
    daemon_pid = start_daemon(&o, dir, sock, sizeof(sock), 0);
    if (daemon_pid < 0) {
      fprintf(stderr, "dcpx-demo: could not start dcpxd; its log:\n");
      show_daemon_log(&o, dir);
      remove_dir(dir);
      return 1;
    }
    o.socket = sock;
  }
  const int own_daemon = daemon_pid > 0;

  rc = 1;
  shared *sh = shared_map(&o, &shbytes);
  if (sh) {
    double t_start = now_us();
    int failed = run_ranks(&o, sh, &daemon_pid, dir, sock, sizeof(sock));
    if (!g_signal) {
      report_perf(&o, sh, (now_us() - t_start) / 1e6);
      rc = report_calls(&o, sh, failed);
      if (report_restart(&o, sh))
        rc = 1;
      if (report_counters(&o, sh, failed))
        rc = 1;
      if (own_daemon && daemon_pid == 0) /* it died: not a good run */
        rc = 1;
    }
    munmap(sh, shbytes);
  }
  if (daemon_pid > 0)
    stop_daemon(daemon_pid, dir);
  else if (own_daemon) /* reaped already: its folder only */
    remove_dir(dir);
  if (g_signal) {
    fprintf(stderr, "dcpx-demo: stopped by signal %d\n", (int)g_signal);
    catch_signals(SIG_DFL);
    raise(g_signal);
  }
  return stdout_done(rc);
}
