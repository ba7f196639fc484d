/* nccl.c - libdcpx's NCCL transport (HAVE_NCCL only): the fallback
 * exchange for groups whose ranks lack P2P access (docs/PROTOCOL.md section 7).
 *
 * At join (cuda.c calls in here once the transport resolved to nccl):
 *   - rank 0 made an NCCL unique id before its Join (dcpx__nccl_unique_id)
 *     and sent it in Join.nccl_id; dcpxd, which needs no NCCL, keeps rank
 *     0's id and hands it to every rank in JoinReply.nccl_id;
 *   - every rank cudaMallocs its NCCL buffer (common/layout.h,
 *     dcpx_nccl_layout), zeroed, and creates a non-blocking communicator
 *     (ncclCommInitRankConfig, blocking = 0) on its device, then polls it
 *     until all W ranks have joined it.
 * Per call, on the caller's stream, nothing else (kernels/dcpx_kernels.h,
 * "the NCCL transport"): push = lists kernel + ncclAllGather; merge =
 * round-1 kernel + ncclAllGather of the rescue lists + round-2 kernel. No
 * sync, no allocation; ncclAllGather is graph-capturable, so the whole
 * call is.
 * At leave: ncclCommFinalize, polled, then ncclCommDestroy; ncclCommAbort
 * instead when the group was aborted or the finalize does not end in time.
 *
 * Health: a dead peer must never hang a rank, and NCCL has no timeouts of
 * its own, so the communicator is non-blocking and every host-side wait
 * for it is ours (nccl_wait): a poll of ncclCommGetAsyncError, bounded in
 * time and ended early by the group's abort word (which dcpxd sets when it
 * sees a rank die):
 *   - setup (a peer that died after the JoinReply never joins the
 *     communicator): the join timeout, then ncclCommAbort and
 *     DCPX_E_TIMEDOUT (DCPX_E_ABORTED on abort), the reason in
 *     dcpx_client_last_error;
 *   - a collective that NCCL could not enqueue at once (ncclInProgress:
 *     connections are set up on first use): the larger of the call and
 *     join timeouts.
 *     NCCL forbids any other call on the comm, and any launch on the
 *     stream, until it settles. One that does not settle, or fails, leaves
 *     the comm unusable (and the ranks' collectives out of step): it is
 *     aborted, the call fails and so does every later call of the member
 *     (DCPX_E_NCCL) until dcpx_recover makes a new one;
 *   - leave: the finalize is bounded by the join timeout, and the abort
 *     (which makes NCCL's kernels still waiting for a dead peer exit) comes
 *     before cuda.c's device-wide sync, so that sync cannot wait on NCCL.
 * A collective already on the stream whose peer died waits until the
 * comm is aborted: by the watchdog thread once the group's abort word or
 * the rank's failed word is set (a graph replay or a stream sync makes no
 * library call), at leave, after a failed call, or by dcpx_recover before
 * it drains the stream (cuda.c dcpx__cuda_sync). A peer that stalls
 * without dying sets neither word: the watchdog's stall watch fails this
 * rank when one of its all-gathers stays pending for the group's wait
 * limit (the kernels' heartbeat, stall_look). Every abort first sets
 * the device word `voided` (comm_abort), so that the round kernels queued
 * behind an all-gather the abort ended without its data fail their rows
 * instead of merging the last call's lists.
 * Recovery (docs/PROTOCOL.md 6.9): dcpx_recover aborts the comm of an
 * aborted group's member, rank 0 acknowledges with a fresh unique id,
 * dcpxd publishes it in the control page for the next generation, and
 * every member makes a new comm from it once the group runs again
 * (dcpx__nccl_rebuild, bounded as the setup at join). A rank that joins
 * an aborted group (a replacement) makes none at its join, only then.
 * The common path adds an uncontended lock and one compare per call (is
 * the comm still there?) and no syscall: the polls run only when NCCL
 * answers ncclInProgress.
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <cuda_runtime_api.h>
/* nccl.h declares some functions without prototypes */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_log.h"
#include "dcpx_kernels.h"
#include "member.h"

/* An NCCL call that failed: logged (WARN) with NCCL's error string and,
 * for a communicator, its last error text (ncclGetLastError). */
static int nccl_ok(ncclResult_t e, ncclComm_t comm, const char *what,
                   int line) {
  if (__builtin_expect(e == ncclSuccess, 1))
    return 1;
  if (dcpx__log_on(DCPX__LOG_WARN)) {
    const char *last = ncclGetLastError(comm);
    dcpx__log(DCPX__LOG_WARN, __FILE__, line, "%s failed: %s%s%s", what,
              ncclGetErrorString(e), last && *last ? ": " : "",
              last ? last : "");
  }
  return 0;
}
#define NCCL_OK(call, comm) nccl_ok((call), (comm), #call, __LINE__)

struct dcpx__nccl {
  ncclComm_t comm; /* NULL once aborted or destroyed, or not made yet */
  int live;        /* comm != NULL, for the watchdog's lock-free looks */
  int setting_up;  /* 1 while a call waits for NCCL to set connections up
                      (all_gather): no stall, whatever the heartbeat says */
  uint32_t gen;    /* the group generation comm was made for (0: none) */
  int device;
  dcpx__nccl_bounds b;
  uint32_t rank, world; /* for the logs */
  dcpx_nkctx k;
  uint32_t *voided;    /* device word: k.voided (comm_abort sets it) */
  cudaStream_t side;   /* non-blocking: sets voided past a stuck stream */
  cudaEvent_t side_done; /* the memset on side, polled with a bound */
  unsigned long long *beat; /* k.beat's host address (cudaHostAlloc) */
  /* comm's users: the caller's thread (calls, recovery, leave) and the
   * watchdog, which aborts it when the group aborts or the rank fails */
  pthread_mutex_t mu;
  pthread_t wd;
  int wd_on, wd_stop;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t ms_to_ns(uint32_t ms) { return (uint64_t)ms * 1000000u; }

/* n->comm and the watchdog's view of it (n->mu held). */
static void set_comm(struct dcpx__nccl *n, ncclComm_t c) {
  n->comm = c;
  __atomic_store_n(&n->live, c != NULL, __ATOMIC_RELEASE);
}

/* Waits until comm leaves ncclInProgress: 0 when it settled with
 * ncclSuccess, DCPX_E_NCCL when with an error, DCPX_E_TIMEDOUT after
 * limit_ns, DCPX_E_ABORTED as soon as *abort_word (if any) is non-zero;
 * each failure logged (WARN) with `what`. The comm is left as it is: the
 * caller aborts it. The naps grow from 50 us to 1 ms, so that a short
 * wait (a collective's connection setup) costs little latency and a long
 * one (setup of the communicator, seconds) little CPU. */
static int nccl_wait(ncclComm_t comm, uint64_t limit_ns,
                     const volatile uint32_t *abort_word, const char *what) {
  const uint64_t t0 = now_ns();
  struct timespec nap = {0, 50000};
  for (;;) {
    ncclResult_t st = ncclInProgress;
    const ncclResult_t e = ncclCommGetAsyncError(comm, &st);
    if (e != ncclSuccess)
      st = e;
    if (st == ncclSuccess)
      return 0;
    if (st != ncclInProgress) {
      nccl_ok(st, comm, what, __LINE__);
      return DCPX_E_NCCL;
    }
    if (abort_word && __atomic_load_n(abort_word, __ATOMIC_ACQUIRE)) {
      DCPX_WARN("%s: the group was aborted while NCCL was still in "
                "progress", what);
      return DCPX_E_ABORTED;
    }
    const uint64_t waited = now_ns() - t0;
    if (waited >= limit_ns) {
      DCPX_WARN("%s: NCCL still in progress after %llu ms (a rank that "
                "died, or never came?)", what,
                (unsigned long long)(waited / 1000000u));
      return DCPX_E_TIMEDOUT;
    }
    nanosleep(&nap, NULL);
    nap.tv_nsec = nap.tv_nsec < 500000 ? nap.tv_nsec * 2 : 1000000;
  }
}

/* One ncclAllGather of count words on s. On a non-blocking comm NCCL may
 * answer ncclInProgress (it sets connections up on first use); until the
 * comm settles nothing else may be issued on it nor launched on s, so the
 * call waits here, bounded by b (NULL: a blocking comm of the tests,
 * where ncclInProgress is an error). */
static int all_gather(const void *send, void *recv, size_t count,
                      ncclComm_t comm, const dcpx__nccl_bounds *b,
                      int *setting_up, cudaStream_t s, const char *what) {
  const ncclResult_t e =
      ncclAllGather(send, recv, count, ncclUint32, comm, s);
  if (__builtin_expect(e == ncclSuccess, 1))
    return 0;
  if (e == ncclInProgress && b) {
    if (setting_up) /* the stall watch waits too */
      __atomic_store_n(setting_up, 1, __ATOMIC_RELEASE);
    const int r = nccl_wait(comm, b->call_ns, b->abort_word, what);
    if (setting_up)
      __atomic_store_n(setting_up, 0, __ATOMIC_RELEASE);
    return r;
  }
  nccl_ok(e, comm, what, __LINE__);
  return DCPX_E_NCCL;
}

/* Why the join failed, for dcpx_client_last_error (why may be NULL). */
__attribute__((format(printf, 3, 4))) static void
say_why(char *why, size_t n, const char *fmt, ...) {
  va_list ap;
  if (!why || !n)
    return;
  va_start(ap, fmt);
  vsnprintf(why, n, fmt, ap);
  va_end(ap);
}

/* How long set_voided waits for its memset: with one hardware queue for
 * every stream (CUDA_DEVICE_MAX_CONNECTIONS=1) the memset may wait behind
 * the very collective the abort is to end, and an unbounded wait would
 * hang the abort (and, holding n->mu, every later call, the recovery and
 * the leave). Past it the abort goes ahead unmarked: the rounds queued
 * before the memset then run on what the all-gather left (as before
 * voided existed), and the rounds after it fail. */
#define VOIDED_WAIT_NS 100000000ull /* 100 ms */

/* Sets (v = 1) or clears (v = 0) the device word voided, past anything
 * the caller's stream still runs (a collective stuck on a dead peer): a
 * non-blocking stream of its own, waited for up to VOIDED_WAIT_NS. */
static int set_voided(struct dcpx__nccl *n, int v) {
  int prev = -1, r = 0;
  if (!n->voided || !n->side || !n->side_done)
    return 0;
  cudaGetDevice(&prev); /* the caller's (an engine thread's) stays */
  /* Relaxed, as stop_mirror (cuda.c) does: the memset and the event are
   * on a stream of our own, never captured, but in the default (global)
   * mode the event query below is refused while any thread captures in
   * global mode (an engine capturing a graph while the watchdog aborts),
   * and that refusal invalidates the other thread's capture. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  int swapped = 0;
  if (!CUDA_OK(cudaSetDevice(n->device)))
    r = DCPX_E_CUDA;
  else
    swapped = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  if (r == 0 &&
      (!CUDA_OK(cudaMemsetAsync(n->voided, v ? 1 : 0, sizeof(uint32_t),
                                n->side)) ||
       !CUDA_OK(cudaEventRecord(n->side_done, n->side))))
    r = DCPX_E_CUDA;
  const uint64_t t0 = now_ns();
  struct timespec nap = {0, 20000};
  while (r == 0) {
    const cudaError_t e = cudaEventQuery(n->side_done);
    if (e == cudaSuccess)
      break;
    if (e != cudaErrorNotReady) {
      CUDA_OK(e);
      r = DCPX_E_CUDA;
    } else if (now_ns() - t0 > VOIDED_WAIT_NS) {
      DCPX_WARN("rank %u of %u: marking the queued NCCL rounds void did "
                "not finish in %llu ms (one hardware queue for every "
                "stream?); aborting anyway",
                n->rank, n->world,
                (unsigned long long)(VOIDED_WAIT_NS / 1000000u));
      r = DCPX_E_TIMEDOUT;
    } else {
      nanosleep(&nap, NULL);
    }
  }
  if (swapped)
    (void)cudaThreadExchangeStreamCaptureMode(&mode); /* the caller's */
  if (prev >= 0 && prev != n->device)
    cudaSetDevice(prev);
  return r;
}

/* Aborts comm (n->mu held): first voided, so that the round kernels still
 * queued behind an all-gather that the abort ends without its data fail
 * their rows instead of merging the last call's lists (the abort is what
 * lets those kernels run at all); then ncclCommAbort, which ends NCCL's
 * kernels that still wait. */
static void comm_abort(struct dcpx__nccl *n, const char *why) {
  if (!n->comm)
    return;
  if (why)
    DCPX_WARN("rank %u of %u: NCCL communicator aborted (%s)", n->rank,
              n->world, why);
  if (set_voided(n, 1) < 0)
    DCPX_WARN("rank %u of %u: could not mark the queued NCCL rounds void",
              n->rank, n->world);
  ncclCommAbort(n->comm);
  set_comm(n, NULL);
}

/* The stall watch's state (the watchdog thread's own). */
typedef struct stall_watch {
  unsigned long long last; /* the heartbeat at the last look */
  uint64_t since;          /* when it took that value (CLOCK_MONOTONIC) */
  int fired;               /* stalled() was called for this value */
} stall_watch;

/* One look of the stall watch: the kernels' heartbeat (dcpx_nkctx.beat)
 * says which collective of this rank is on the stream, if any, and
 * changes with every kernel of the transport. A collective that a peer
 * never joins (it stalled, or its calls do not match this rank's) leaves
 * the word as it is; after the group's wait limit, stalled() records a
 * timeout and fails the rank, as an LL wait that gives up does. Nothing
 * is a stall while NCCL sets connections up (a bounded wait of its own),
 * without a communicator, or while the group is aborted or the rank
 * failed (stop). */
static void stall_look(struct dcpx__nccl *n, stall_watch *w, int stop) {
  const uint64_t now = now_ns();
  const unsigned long long beat =
      __atomic_load_n(n->beat, __ATOMIC_ACQUIRE);
  const uint32_t which = (uint32_t)(beat & 3u);
  if (beat != w->last || stop || which == DCPX_NCCL_BEAT_IDLE ||
      !__atomic_load_n(&n->live, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&n->setting_up, __ATOMIC_ACQUIRE)) {
    if (beat != w->last)
      w->fired = 0;
    w->last = beat;
    w->since = now;
    return;
  }
  const uint64_t lim_word = *n->b.timeout_word;
  const uint64_t lim = lim_word ? lim_word : DCPX_K_DEFAULT_TIMEOUT_NS;
  if (w->fired || now - w->since < lim)
    return;
  w->fired = 1;
  DCPX_WARN("rank %u of %u: the NCCL all-gather of the %s still "
            "pending after %llu ms (a peer stalled, or the ranks' calls do "
            "not match): this rank fails",
            n->rank, n->world,
            which == DCPX_NCCL_BEAT_LISTS ? "lists" : "rescue lists",
            (unsigned long long)((now - w->since) / 1000000u));
  n->b.stalled(n->b.stalled_arg, which);
}

/* The watchdog: a collective already on the stream waits for its peers
 * without a bound, and a CUDA graph replay or a stream sync makes no
 * library call that could end it. Every DCPX_NCCL_WATCH_MS this thread
 * looks at the group's abort word and the rank's failed word (host
 * memory, the control page) and aborts the communicator when either is
 * set: dcpxd sets abort when it sees a rank die, so a dead peer ends the
 * waits in about its polling delay plus this one. A peer that stalls
 * without dying is the stall watch's (stall_look): this rank fails after
 * the group's wait limit, dcpxd aborts the group, and every rank's
 * watchdog then aborts its communicator. */
#define DCPX_NCCL_WATCH_MS 2
/* Whether the group is aborted or this rank failed (the watchdog's
 * reason to abort the communicator). */
static int wd_bad(const struct dcpx__nccl *n) {
  return (n->b.abort_word &&
          __atomic_load_n(n->b.abort_word, __ATOMIC_ACQUIRE)) ||
         (n->b.failed_word &&
          __atomic_load_n(n->b.failed_word, __ATOMIC_ACQUIRE));
}

static void *watchdog(void *arg) {
  struct dcpx__nccl *n = arg;
  const struct timespec nap = {0, DCPX_NCCL_WATCH_MS * 1000000L};
  stall_watch sw = {0, now_ns(), 0};
  /* The member's device, current on this thread for good: set_voided's
   * "previous device" of a thread without one would read 0 and make a
   * context on GPU 0 when it gives it back. */
  cudaSetDevice(n->device);
  /* This thread never captures; relaxed for good, so that its CUDA calls
   * (set_voided's, ncclCommAbort's) are not refused while an engine
   * thread captures a graph in global mode, which would invalidate that
   * capture (PyTorch's NCCL watchdog leaves the global mode for its event
   * queries for the same reason). */
  {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
  }
  while (!__atomic_load_n(&n->wd_stop, __ATOMIC_ACQUIRE)) {
    nanosleep(&nap, NULL);
    const int bad = wd_bad(n);
    if (n->beat && n->b.stalled && n->b.timeout_word)
      stall_look(n, &sw, bad);
    if (!bad)
      continue;
    pthread_mutex_lock(&n->mu);
    /* Looked at again under the lock: dcpx__nccl_rebuild holds it while
     * it makes the next generation's communicator, which it starts only
     * once the recovery cleared abort and failed. A `bad` read before the
     * lock may be from the generation before; acting on it would abort
     * the communicator just made (its calls then fail, and the group
     * needs another recovery). */
    if (n->comm && wd_bad(n))
      comm_abort(n, "the group aborted or this rank failed (watchdog): its "
                    "collectives end, the rows after them fail");
    pthread_mutex_unlock(&n->mu);
  }
  return NULL;
}

void dcpx__nccl_counters(struct dcpx__nccl *n, void *ctr, void *health) {
  n->k.ctr = (dcpx_k_counters *)ctr;
  n->k.health = (dcpx_rank_health *)health;
}

int dcpx__nccl_unique_id(uint8_t *out, size_t cap, size_t *ret_len) {
  ncclUniqueId id;
  if (cap < sizeof(id))
    return DCPX_E_RANGE;
  if (!NCCL_OK(ncclGetUniqueId(&id), NULL))
    return DCPX_E_NCCL;
  memcpy(out, &id, sizeof(id));
  *ret_len = sizeof(id);
  return 0;
}

/* Creates n->comm, non-blocking, and waits (nccl_wait) until every rank
 * has joined it. On failure n->comm may be set: the caller aborts it. */
static int comm_init(struct dcpx__nccl *n, const ncclUniqueId *uid,
                     char *why, size_t why_len) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0; /* so that the wait is ours, and bounded */
  const ncclResult_t e = ncclCommInitRankConfig(
      &n->comm, (int)n->world, *uid, (int)n->rank, &cfg);
  if (e != ncclSuccess && e != ncclInProgress) {
    nccl_ok(e, n->comm, "ncclCommInitRankConfig", __LINE__);
    say_why(why, why_len, "NCCL communicator setup failed: %s",
            ncclGetErrorString(e));
    return DCPX_E_NCCL;
  }
  const int r = nccl_wait(n->comm, ms_to_ns(n->b.setup_ms), n->b.abort_word,
                          "NCCL communicator setup");
  if (r == 0)
    set_comm(n, n->comm); /* live for the stall watch */
  if (r == DCPX_E_TIMEDOUT)
    say_why(why, why_len,
            "NCCL communicator setup (rank %u of %u) did not finish "
            "within %u ms: a rank died after the group formed, or never "
            "reached it", n->rank, n->world, n->b.setup_ms);
  else if (r == DCPX_E_ABORTED)
    say_why(why, why_len, "the group was aborted during the NCCL "
                          "communicator setup (rank %u of %u)",
            n->rank, n->world);
  else if (r < 0) {
    const char *last = ncclGetLastError(n->comm);
    say_why(why, why_len, "NCCL communicator setup failed: %s",
            last && *last ? last : "an NCCL error (see the log)");
  }
  return r;
}

/* The NCCL buffer, zeroed, the voided word and its stream, on the
 * current device. */
static int buf_init(struct dcpx__nccl *n) {
  if (!CUDA_OK(cudaMalloc((void **)&n->k.buf, n->k.NL.bytes))) {
    n->k.buf = NULL;
    return DCPX_E_NOMEM;
  }
  if (!CUDA_OK(cudaMalloc((void **)&n->voided, sizeof(uint32_t)))) {
    n->voided = NULL;
    return DCPX_E_NOMEM;
  }
  n->k.voided = n->voided;
  if (!CUDA_OK(cudaStreamCreateWithFlags(&n->side, cudaStreamNonBlocking))) {
    n->side = NULL;
    return DCPX_E_CUDA;
  }
  if (!CUDA_OK(cudaEventCreateWithFlags(&n->side_done,
                                        cudaEventDisableTiming))) {
    n->side_done = NULL;
    return DCPX_E_CUDA;
  }
  /* The heartbeat: host memory the kernels store into (8 bytes, one
   * writer at a time: stream order) and the watchdog reads. */
  if (!CUDA_OK(cudaHostAlloc((void **)&n->beat, sizeof(*n->beat),
                             cudaHostAllocMapped | cudaHostAllocPortable))) {
    n->beat = NULL;
    return DCPX_E_NOMEM;
  }
  *n->beat = 0;
  if (!CUDA_OK(cudaHostGetDevicePointer((void **)&n->k.beat, n->beat, 0)))
    return DCPX_E_CUDA;
  if (!CUDA_OK(cudaMemset(n->voided, 0, sizeof(uint32_t))) ||
      !CUDA_OK(cudaMemset(n->k.buf, 0, n->k.NL.bytes)) ||
      !CUDA_OK(cudaDeviceSynchronize()) ||
      DCPX_KLOG(dcpx_kn_prepare(), "dcpx_kn_prepare") < 0)
    return DCPX_E_CUDA;
  return 0;
}

int dcpx__nccl_init(const dcpx_shape *sh, uint32_t rank, int device,
                    char *ws, const uint8_t *id, size_t id_len, uint32_t gen,
                    const dcpx__nccl_bounds *b, char *why, size_t why_len,
                    struct dcpx__nccl **ret) {
  struct dcpx__nccl *n;
  ncclUniqueId uid;
  int prev = -1, r = 0;

  if (!gen) {
    id = NULL; /* no communicator yet */
  } else if (!id || id_len != sizeof(uid)) {
    /* rank 0 sent no (or a foreign) nccl id */
    DCPX_WARN("no NCCL unique id from rank 0 (%zu bytes, want %zu)", id_len,
              sizeof(uid));
    say_why(why, why_len, "no NCCL unique id from rank 0");
    return DCPX_E_TRANSPORT;
  }
  if (id)
    memcpy(&uid, id, sizeof(uid));
  n = calloc(1, sizeof(*n));
  if (!n)
    return DCPX_E_NOMEM;
  n->b = *b;
  n->rank = rank;
  n->world = sh->world;
  n->device = device;
  n->gen = gen;
  pthread_mutex_init(&n->mu, NULL);
  dcpx_kn_ctx_init(&n->k, sh, rank);
  n->k.ws = ws;
  cudaGetDevice(&prev);
  if (!CUDA_OK(cudaSetDevice(device)))
    r = DCPX_E_CUDA;
  if (r == 0)
    r = buf_init(n);
  if (r == 0 && id)
    r = comm_init(n, &uid, why, why_len);
  if (r == 0)
    r = dcpx_kn_ctx_check(&n->k);
  if (r == 0 && (b->abort_word || b->failed_word)) {
    if (pthread_create(&n->wd, NULL, watchdog, n) != 0) {
      say_why(why, why_len, "cannot start the NCCL watchdog thread");
      r = DCPX_E_NOMEM;
    } else {
      n->wd_on = 1;
    }
  }
  if (r < 0)
    dcpx__nccl_fini(n, 1); /* on `device`, where the comm and buffer are */
  else
    *ret = n;
  if (prev >= 0)
    cudaSetDevice(prev);
  return r;
}

int dcpx__nccl_rebuild(struct dcpx__nccl *n, const uint8_t *id,
                       size_t id_len, uint32_t gen, char *why,
                       size_t why_len) {
  ncclUniqueId uid;
  int prev = -1, r = 0;
  if (!id || id_len != sizeof(uid)) {
    say_why(why, why_len, "no NCCL unique id from rank 0 for generation %u",
            gen);
    return DCPX_E_PROTO;
  }
  memcpy(&uid, id, sizeof(uid));
  cudaGetDevice(&prev);
  if (!CUDA_OK(cudaSetDevice(n->device))) /* comm_init's device */
    return DCPX_E_CUDA;
  pthread_mutex_lock(&n->mu);
  comm_abort(n, "a recovery makes a new one");
  /* The recovery drained the caller's stream before its acknowledgement:
   * no round kernel of the old communicator is left to fail, and no
   * collective is on the stream, whatever the heartbeat says (a stuck
   * all-gather that the abort ended before its next kernel ran). */
  r = set_voided(n, 0);
  if (n->beat)
    __atomic_store_n(n->beat, 0ull, __ATOMIC_RELEASE);
  if (r == 0)
    r = comm_init(n, &uid, why, why_len);
  if (r < 0 && n->comm)
    comm_abort(n, NULL);
  pthread_mutex_unlock(&n->mu);
  if (r == 0) {
    n->gen = gen;
    DCPX_INFO("rank %u of %u: NCCL communicator made again for generation "
              "%u", n->rank, n->world, gen);
  }
  if (prev >= 0)
    cudaSetDevice(prev);
  return r;
}

unsigned long long *dcpx__nccl_beat(struct dcpx__nccl *n) {
  return n->beat;
}

uint32_t dcpx__nccl_gen(const struct dcpx__nccl *n) {
  return n->comm ? n->gen : 0u;
}

/* ncclCommFinalize, polled: 0 once the comm is quiescent (its operations
 * done, ncclCommDestroy is then local), else the wait's error. */
static int comm_finalize(struct dcpx__nccl *n) {
  const ncclResult_t e = ncclCommFinalize(n->comm);
  if (e != ncclSuccess && e != ncclInProgress) {
    nccl_ok(e, n->comm, "ncclCommFinalize", __LINE__);
    return DCPX_E_NCCL;
  }
  return nccl_wait(n->comm, ms_to_ns(n->b.setup_ms), n->b.abort_word,
                   "ncclCommFinalize at leave");
}

void dcpx__nccl_stop(struct dcpx__nccl *n, int abort) {
  if (!n)
    return;
  if (n->wd_on) { /* nobody aborts behind our back from here on */
    __atomic_store_n(&n->wd_stop, 1, __ATOMIC_RELEASE);
    pthread_join(n->wd, NULL);
    n->wd_on = 0;
  }
  if (!n->comm)
    return;
  if (abort)
    comm_abort(n, NULL); /* the group aborted: ends kernels still waiting */
  else if (comm_finalize(n) == 0) {
    ncclCommDestroy(n->comm);
    set_comm(n, NULL);
  } else {
    comm_abort(n, "its finalize at leave did not end");
  }
}

void dcpx__nccl_fini(struct dcpx__nccl *n, int abort) {
  if (!n)
    return;
  dcpx__nccl_stop(n, abort);
  if (n->k.buf)
    cudaFree(n->k.buf);
  if (n->voided)
    cudaFree(n->voided);
  if (n->side_done)
    cudaEventDestroy(n->side_done);
  if (n->side)
    cudaStreamDestroy(n->side);
  if (n->beat)
    cudaFreeHost(n->beat);
  pthread_mutex_destroy(&n->mu);
  free(n);
}

void dcpx__nccl_abort(struct dcpx__nccl *n, const char *why) {
  if (!n)
    return;
  pthread_mutex_lock(&n->mu);
  comm_abort(n, why);
  pthread_mutex_unlock(&n->mu);
}

/* DCPX_NCCL_IDLE_MARK=none leaves the mark out (measurement only: what
 * it costs, gpu-run.sh idlemark); read once per process. */
static int g_no_mark;
static pthread_once_t g_mark_once = PTHREAD_ONCE_INIT;

static void mark_env(void) {
  const char *v = getenv("DCPX_NCCL_IDLE_MARK");
  g_no_mark = v && !strcmp(v, "none");
}

/* The heartbeat's IDLE on s after the push's all-gather (dcpx_nkctx.beat):
 * the all-gather is over once the stream gets here, and whatever the
 * engine runs before the merge is not one of this rank's collectives. A
 * one-thread kernel: about 1.0 us per call in a graph on an H200, where
 * a stream memory operation (cuStreamWriteValue64) cost 2.8 us (bench/
 * RESULTS.md, session 17). */
static int beat_idle(const struct dcpx_nkctx *k, cudaStream_t s) {
  if (!k->beat)
    return 0;
  pthread_once(&g_mark_once, mark_env);
  if (g_no_mark)
    return 0;
  return DCPX_KLOG(dcpx_kn_beat_idle(k, s), "dcpx_kn_beat_idle");
}

static int push_k(const struct dcpx_nkctx *k, ncclComm_t comm,
                  const dcpx__nccl_bounds *b, int *setting_up, uint32_t rows,
                  const uint16_t *logits, uint64_t stride,
                  const int32_t *row_ends, cudaStream_t s) {
  int r;
  if (rows > k->rows_max)
    return DCPX_E_RANGE;
  if (rows == 0)
    return 0;
  r = DCPX_KLOG(dcpx_kn_lists(k, rows, logits, stride, row_ends, s),
                "dcpx_kn_lists");
  if (r < 0)
    return r;
  r = all_gather(dcpx_kn_send(k), dcpx_kn_recv(k), (size_t)rows * k->L.rw_n,
                 comm, b, setting_up, s, "ncclAllGather of the lists");
  return r < 0 ? r : beat_idle(k, s);
}

static int merge_k(const struct dcpx_nkctx *k, ncclComm_t comm,
                   const dcpx__nccl_bounds *b, int *setting_up, uint32_t rows,
                   const uint16_t *logits, uint64_t stride,
                   const int32_t *row_ends, const int32_t *req_id,
                   const int32_t *block_table, uint32_t bt_rows,
                   uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                   int32_t *ids_out, uint32_t *sat_word, cudaStream_t s) {
  int r;
  if (rows > k->rows_max)
    return DCPX_E_RANGE;
  if (rows == 0)
    return 0;
  r = DCPX_KLOG(dcpx_kn_round1(k, rows, logits, stride, row_ends, req_id,
                               block_table, bt_rows, bt_cols, rows_out,
                               valid_out, ids_out, sat_word, s),
                "dcpx_kn_round1");
  if (r < 0)
    return r;
  /* Unconditional: whether any row needs its rescue is known on the
   * device only (see kernels/nccl.cu). */
  r = all_gather(dcpx_kn_rsend(k), dcpx_kn_rrecv(k),
                 (size_t)rows * k->L.rw_k, comm, b, setting_up, s,
                 "ncclAllGather of the rescue lists");
  if (r < 0)
    return r;
  return DCPX_KLOG(dcpx_kn_round2(k, rows, req_id, block_table, bt_rows,
                                  bt_cols, rows_out, valid_out, ids_out, s),
                   "dcpx_kn_round2");
}

int dcpx__nccl_push_k(const struct dcpx_nkctx *k, void *comm, uint32_t rows,
                      const uint16_t *logits, uint64_t stride,
                      const int32_t *row_ends, void *stream) {
  return push_k(k, (ncclComm_t)comm, NULL, NULL, rows, logits, stride, row_ends,
                (cudaStream_t)stream);
}

int dcpx__nccl_merge_k(const struct dcpx_nkctx *k, void *comm, uint32_t rows,
                       const uint16_t *logits, uint64_t stride,
                       const int32_t *row_ends, const int32_t *req_id,
                       const int32_t *block_table, uint32_t bt_rows,
                       uint32_t bt_cols, int32_t *rows_out,
                       int32_t *valid_out, int32_t *ids_out,
                       uint32_t *sat_word, void *stream) {
  return merge_k(k, (ncclComm_t)comm, NULL, NULL, rows, logits, stride,
                 row_ends, req_id, block_table, bt_rows, bt_cols, rows_out,
                 valid_out, ids_out, sat_word, (cudaStream_t)stream);
}

int dcpx__nccl_push(struct dcpx__nccl *n, uint32_t rows,
                    const uint16_t *logits, uint64_t stride,
                    const int32_t *row_ends, void *stream) {
  int r = DCPX_E_NCCL; /* aborted (a failed call, the watchdog), or none */
  pthread_mutex_lock(&n->mu); /* uncontended: no syscall */
  if (n->comm) {
    r = push_k(&n->k, n->comm, &n->b, &n->setting_up, rows, logits, stride,
               row_ends, (cudaStream_t)stream);
    if (r < 0)
      comm_abort(n, "a failed push; the member's calls fail until "
                    "dcpx_recover makes a new one");
  }
  pthread_mutex_unlock(&n->mu);
  return r;
}

int dcpx__nccl_merge(struct dcpx__nccl *n, uint32_t rows,
                     const uint16_t *logits, uint64_t stride,
                     const int32_t *row_ends, const int32_t *req_id,
                     const int32_t *block_table, uint32_t bt_rows,
                     uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                     int32_t *ids_out, uint32_t *sat_word, void *stream) {
  int r = DCPX_E_NCCL; /* aborted (a failed call, the watchdog), or none */
  pthread_mutex_lock(&n->mu);
  if (n->comm) {
    r = merge_k(&n->k, n->comm, &n->b, &n->setting_up, rows, logits, stride,
                row_ends, req_id, block_table, bt_rows, bt_cols, rows_out,
                valid_out, ids_out, sat_word, (cudaStream_t)stream);
    if (r < 0)
      comm_abort(n, "a failed merge; the member's calls fail until "
                    "dcpx_recover makes a new one");
  }
  pthread_mutex_unlock(&n->mu);
  return r;
}
