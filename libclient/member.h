/* member.h - a rank's membership of a group, as libdcpx holds it
 * (internal). The connection, the mapped control page and workspaces, and
 * the host backend's preallocated scratch, so that the call path needs no
 * allocation. */
#ifndef DCPX_LIBCLIENT_MEMBER_H
#define DCPX_LIBCLIENT_MEMBER_H

#include <stddef.h>
#include <stdint.h>

#include "dcpx.h"
#include "layout.h"
#include "merge.h"
#include "log.h"

struct dcpx_client {
  char path[108]; /* sun_path */
  /* dcpxd's reason for refusing the last dcpx_join, or "" */
  char last_error[512];
  /* dcpx_client_interrupt's flag: while set, dcpx_join returns
   * DCPX_E_INTR (any thread or a signal handler sets it: atomics only) */
  int interrupt;
};

struct dcpx__cuda; /* cuda.c */
struct dcpx__nccl; /* nccl.c */
struct dcpx_nkctx; /* kernels/dcpx_kernels.h */

struct dcpx_member {
  int sock;
  char group[64];
  char warning[512]; /* the join reply's, or "" (dcpxd: up to 511 bytes) */
  /* why this member refused its last call, or "" (dcpx_member_last_error;
   * cleared as each push or merge starts; DCPX_REFUSE writes it) */
  char why[384]; /* the longest reason, with a 63-byte group name, fits */
  dcpx_shape shape;
  uint32_t rank, backend;
  uint32_t transport;     /* in use: DCPX_TRANSPORT_LL or _NCCL */
  uint32_t transport_req; /* the join's setting (AUTO, LL, NCCL) */
  uint64_t timeout_ns;
  dcpx_layout L;

  /* Mappings of the fds dcpxd passed (host backend). */
  void *ctl;
  size_t ctl_bytes;
  char *ws[DCPX_MAX_WORLD];
  size_t ws_bytes;
  dcpx_ctl_header *hdr;
  dcpx_rank_health *health;   /* [W] */
  dcpx_wait_record *records;  /* [W][R] */

  /* CUDA backend state (cuda.c), NULL with the host backend. */
  struct dcpx__cuda *cuda;

  /* What dcpx_member_async_error knows beyond the control page, noted by
   * the calls (plain stores; the bitmap only on a failure):
   * refused_gen: generation + 1 in which this rank refused a call (0:
   * none); last_rows: rows of the last call (push or merge); row_err
   * (host backend): the rows of the last call that failed (a merge's
   * valid_out -1, all of a failed push's), row_err_set when any
   * bit is; bt_rows_bad: the last merge completed with rows outside the
   * block table. */
  uint32_t refused_gen;
  uint32_t last_rows;
  /* The call order (include/dcpx.h, client.c call_order): pushed_gen is
   * the control page generation (never 0) of a dcpx_push or
   * dcpx_push_list whose dcpx_merge is due, 0 when none is (a recovery,
   * which starts a new generation, ends it); order_off is 1 once the
   * library cannot see every push and merge of the member:
   * dcpx_device_ctx handed out a context (its kernels push), or a call
   * went into a CUDA graph (its replays are not calls of the library). */
  uint32_t pushed_gen;
  uint32_t pushed_rows; /* that push's rows: its merge must take as many */
  /* The call of this member in progress (client.c call_enter): 0, or the
   * DCPX__CALL_* of the dcpx_push, dcpx_push_list, dcpx_merge,
   * dcpx_recover or dcpx_device_ctx that holds the member's call state.
   * One atomic compare-and-swap at a call's start and one store at its
   * end: a call that finds another thread's there is refused with
   * DCPX_E_BUSY and touches nothing else of the member. */
  int call_busy;
  uint32_t order_off;
  uint32_t row_err_set;
  uint32_t bt_rows_bad;
  uint64_t row_err[DCPX_MAX_ROWS / 64];

  /* Host backend scratch, sized at join. */
  dcpx__merge_ws mws;
  uint32_t *lists_buf; /* [W][rw_n] */
  uint32_t *klist;     /* [rw_k]: this rank's rescue list */
  uint32_t *rlists;    /* [S][rw_k]: the rescue lists read, by slot */
  const uint32_t *lists[DCPX_MAX_WORLD];

  /* The link to dcpxd (client.c). The socket path and the join's own
   * settings are kept so that dcpx_poll can reconnect after a daemon
   * restart, and so are the fds dcpxd passed (-1: none): a restarted
   * daemon adopts the group's memory from them. A backend must leave them
   * open. */
  int link; /* DCPX__LINK_* */
  char path[108];
  int32_t device;
  uint8_t device_uuid[16]; /* Join.device_uuid, sent again at a reattach */
  uint8_t device_uuid_len; /* 0 (none: the host backend) or 16 */
  /* Join.nccl_id (rank 0 of a CUDA group that may use NCCL; else len 0) */
  uint8_t join_nccl_id[DCPX_NCCL_ID_BYTES];
  size_t join_nccl_id_len;
  uint32_t join_timeout_ms;
  uint32_t daemon_join_ms; /* dcpxd's join timeout (Hello reply; 0: unsaid) */
  int ctl_fd;
  int ws_fd[DCPX_MAX_WORLD];
  uint64_t retry_at_ms;   /* DOWN: next reconnect attempt */
  uint64_t link_sent_ms;  /* REATTACHING: when the Join went out */
  uint32_t reattach_step; /* REATTACHING: 0 Hello answer due, 1 JoinReply */
  uint32_t reattaches;    /* successful reattaches so far */
  int link_busy; /* dcpx_poll, dcpx_health or dcpx_recover runs (atomic) */
  int refused;            /* DOWN: dcpxd's code if it refused the last
                             reattach (what dcpx_poll says until the
                             retry), else 0 */
  /* dcpx_member_interrupt's flag: while set, dcpx_recover returns
   * DCPX_E_INTR (atomics only, as the client's) */
  int interrupt;
  /* The process's fork count when it joined (client.c dcpx__forked): a
   * copy of the member in a child of fork() is the parent's rank, which the
   * child must neither drive nor leave */
  unsigned fork_gen;
};

/* The join's timeout: its own, else dcpxd's (the one a Join of 0 gets),
 * else, from a dcpxd that did not say, 30 s (dcpxd's built-in default). */
static inline uint32_t dcpx__join_ms(const struct dcpx_member *m) {
  return m->join_timeout_ms   ? m->join_timeout_ms
         : m->daemon_join_ms ? m->daemon_join_ms
                             : 30000u;
}

/* Whether dcpx_member_interrupt's flag is set. */
static inline int dcpx__member_interrupted(const struct dcpx_member *m) {
  return __atomic_load_n(&m->interrupt, __ATOMIC_ACQUIRE);
}

/* Whether this rank has anything to recover: the group is aborted or being
 * recovered, or this rank failed (and the daemon has not noticed yet).
 * Loads of the control page. */
static inline int dcpx__member_needs_recovery(const struct dcpx_member *m) {
  return __atomic_load_n(&m->hdr->abort, __ATOMIC_ACQUIRE) ||
         __atomic_load_n(&m->hdr->recovering, __ATOMIC_ACQUIRE) ||
         __atomic_load_n(&m->health[m->rank].failed, __ATOMIC_ACQUIRE);
}

/* The calls that hold call_busy (its values; 0: none). */
#define DCPX__CALL_PUSH 1
#define DCPX__CALL_PUSH_LIST 2
#define DCPX__CALL_MERGE 3
#define DCPX__CALL_RECOVER 4
#define DCPX__CALL_DEVICE_CTX 5

/* Link states. NONE: no daemon (dcpx__member_attach). UP: joined or
 * reattached. REATTACHING: Hello + Join{reattach} sent, answers pending.
 * DOWN: no connection; dcpx_poll reconnects from retry_at_ms on. */
#define DCPX__LINK_NONE 0
#define DCPX__LINK_UP 1
#define DCPX__LINK_REATTACHING 2
#define DCPX__LINK_DOWN 3

/* client.c: a member over memory the caller mapped (tests, no daemon).
 * detach frees the member, not the memory. */
__attribute__((visibility("hidden"))) int
dcpx__member_attach(const dcpx_shape *shape, uint32_t rank,
                    uint64_t timeout_ns, void *ctl, char *const *ws,
                    struct dcpx_member **ret_member);
__attribute__((visibility("hidden"))) void
dcpx__member_detach(struct dcpx_member *m);

/* cuda.c (HAVE_CUDA only): init after the join mapped the control page
 * and kept the workspace fds; jg is what JoinReply says about the ranks'
 * GPUs: devices[r] (the daemon's ordinals) and, when every rank sent its
 * GPU's UUID, uuids (16 bytes per rank; else NULL); nccl_id is
 * JoinReply.nccl_id (rank 0's NCCL unique id, or empty). Resolves the
 * transport (m->transport) from m->transport_req. why[why_len] (may be
 * NULL) gets the reason of a failure the caller should hear of
 * (dcpx_client_last_error), e.g. an NCCL setup that timed out. */
typedef struct dcpx__join_gpus {
  const int32_t *devices;
  uint32_t ndevices;
  const uint8_t *uuids;
} dcpx__join_gpus;

__attribute__((visibility("hidden"))) int
dcpx__cuda_init(struct dcpx_member *m, const dcpx__join_gpus *jg,
                const uint8_t *nccl_id, size_t nccl_id_len, char *why,
                size_t why_len);
/* A call of the member refused before it reached the backend (a bad
 * struct): with the nccl transport its communicator is aborted
 * (dcpx__nccl_abort); with ll the device's stop word is set on `stream`
 * (cuda.c stop_mirror). */
__attribute__((visibility("hidden"))) void
dcpx__cuda_refused(struct dcpx_member *m, void *stream, const char *why);
/* The 16-byte UUID of this process's CUDA device `device` (Join.device_uuid). */
__attribute__((visibility("hidden"))) int
dcpx__cuda_device_uuid(int device, uint8_t *out);
__attribute__((visibility("hidden"))) void
dcpx__cuda_fini(struct dcpx_member *m);
__attribute__((visibility("hidden"))) int
dcpx__cuda_push(struct dcpx_member *m, const dcpx_call *in, void *stream);
__attribute__((visibility("hidden"))) int
dcpx__cuda_push_list(struct dcpx_member *m, const dcpx_call *in,
                     const dcpx_lists *lists, void *stream);
__attribute__((visibility("hidden"))) int
dcpx__cuda_device_ctx(struct dcpx_member *m, dcpx_device *ret);
__attribute__((visibility("hidden"))) int
dcpx__cuda_merge(struct dcpx_member *m, const dcpx_call *in,
                 const dcpx_merge_out *out, void *stream);
__attribute__((visibility("hidden"))) int
dcpx__cuda_sync(struct dcpx_member *m, void *stream, uint32_t timeout_ms);
/* dcpx_recover, for its acknowledgement of generation gen: rank 0 of an
 * nccl member makes a fresh NCCL unique id (RecoverAck.nccl_id), the same
 * one again for a re-ack of the same generation; DCPX_E_NOSYS for anyone
 * else. */
__attribute__((visibility("hidden"))) int
dcpx__cuda_nccl_id(struct dcpx_member *m, uint32_t gen, uint8_t *out,
                   size_t cap, size_t *ret_len);
/* dcpx_recover, once the group runs again: an nccl member whose
 * communicator is not of the current generation makes a new one from the
 * control page's id (dcpx__nccl_rebuild); 0, or why not. */
__attribute__((visibility("hidden"))) int
dcpx__cuda_recovered(struct dcpx_member *m);
/* 1 when stream (of m's device, or 0) is capturing into a CUDA graph (or
 * its state cannot be told), else 0. */
__attribute__((visibility("hidden"))) int
dcpx__cuda_capturing(struct dcpx_member *m, void *stream);

/* nccl.c (HAVE_NCCL only). unique_id: an ncclUniqueId (rank 0, before its
 * Join). init: a non-blocking communicator on `device` (waits, bounded by
 * b, until all W ranks joined it) and the NCCL buffer; ws is this rank's
 * mapped workspace; why[why_len] (may be NULL) the reason of a failure.
 * stop: ends the communicator, bounded (ncclCommFinalize, polled, then
 * ncclCommDestroy; ncclCommAbort when abort is set, or when the finalize
 * does not end in time), so that no NCCL kernel of it can run on; fini:
 * stop, then frees the rest (the caller makes sure no kernel of ours
 * still uses the buffer). The *_k forms take the kernel context and a
 * blocking ncclComm_t (tests). */
/* The bounds of the NCCL transport's waits (nccl.c's file comment):
 * setup_ms the communicator's setup and the finalize at leave (the join
 * timeout), call_ns a collective that NCCL could not enqueue at once (the
 * larger of the call and join timeouts: that is connection setup);
 * abort_word (the group's, or NULL) ends any of them
 * early. */
typedef struct dcpx__nccl_bounds {
  uint32_t setup_ms;
  uint64_t call_ns;
  const volatile uint32_t *abort_word;
  /* the rank's failed word (or NULL); with abort_word, what the
   * watchdog thread (nccl.c) watches: it aborts the communicator once
   * either is set. Neither set: no watchdog (the tests' own comms). */
  const volatile uint32_t *failed_word;
  /* The stall watch (with the watchdog; NULL stalled: none): when a
   * collective of this rank is on its stream (the kernels' heartbeat,
   * dcpx_nkctx.beat) and the heartbeat stays the same for the group's
   * wait limit (*timeout_word, the control page's timeout_ns; 0:
   * DCPX_K_DEFAULT_TIMEOUT_NS), the watchdog calls stalled(stalled_arg,
   * which) once (which: DCPX_NCCL_BEAT_LISTS or _RESCUE): it
   * records the timeout and fails the rank, and the watchdog's next look
   * aborts the communicator as for any failure. */
  const volatile uint64_t *timeout_word;
  void (*stalled)(void *arg, uint32_t which);
  void *stalled_arg;
} dcpx__nccl_bounds;
__attribute__((visibility("hidden"))) int
dcpx__nccl_unique_id(uint8_t *out, size_t cap, size_t *ret_len);
/* gen: the group generation the communicator is made for; 0 (the group
 * is aborted or recovering at the join) makes none: dcpx__nccl_rebuild
 * does, in dcpx_recover. */
__attribute__((visibility("hidden"))) int
dcpx__nccl_init(const dcpx_shape *sh, uint32_t rank, int device, char *ws,
                const uint8_t *id, size_t id_len, uint32_t gen,
                const dcpx__nccl_bounds *b, char *why, size_t why_len,
                struct dcpx__nccl **ret);
/* After a recovery (dcpx_recover): a new communicator for generation gen
 * from rank 0's id of the control page (docs/PROTOCOL.md 6.9), the old
 * one aborted; bounded as the setup at join. The caller (which asks
 * dcpx__nccl_gen first) has the member's context current. */
__attribute__((visibility("hidden"))) int
dcpx__nccl_rebuild(struct dcpx__nccl *n, const uint8_t *id, size_t id_len,
                   uint32_t gen, char *why, size_t why_len);
/* The stall watch's heartbeat word (host memory; tests write it to stand
 * for a pending all-gather). */
__attribute__((visibility("hidden"))) unsigned long long *
dcpx__nccl_beat(struct dcpx__nccl *n);
/* The generation the live communicator was made for; 0 when there is
 * none (aborted, or not made yet). */
__attribute__((visibility("hidden"))) uint32_t
dcpx__nccl_gen(const struct dcpx__nccl *n);
__attribute__((visibility("hidden"))) void
dcpx__nccl_stop(struct dcpx__nccl *n, int abort);
__attribute__((visibility("hidden"))) void
dcpx__nccl_fini(struct dcpx__nccl *n, int abort);
/* A call of the member that failed or was refused (`why`, for the log):
 * the ranks' collectives can no longer be matched (one rank skipped or
 * cut short what the others issued, or the group aborted and a peer will
 * issue nothing more), and NCCL's kernels wait without a bound: the
 * communicator is aborted, which ends them, and the member's later calls
 * fail with DCPX_E_NCCL until dcpx_recover makes a new one
 * (dcpx__nccl_rebuild). Once. */
__attribute__((visibility("hidden"))) void
dcpx__nccl_abort(struct dcpx__nccl *n, const char *why);
/* The call counters the round-1 kernel keeps (device memory, a
 * dcpx_k_counters) and publishes into `health` (the rank's health block,
 * device address). */
__attribute__((visibility("hidden"))) void
dcpx__nccl_counters(struct dcpx__nccl *n, void *ctr, void *health);
/* A call: DCPX_E_TIMEDOUT / DCPX_E_ABORTED when NCCL could not enqueue a
 * collective within its bound / before the group aborted; after any
 * failure the communicator is aborted (dcpx__nccl_abort) and every later
 * call fails with DCPX_E_NCCL. */
__attribute__((visibility("hidden"))) int
dcpx__nccl_push(struct dcpx__nccl *n, uint32_t rows, const uint16_t *logits,
                uint64_t stride, const int32_t *row_ends, void *stream);
__attribute__((visibility("hidden"))) int
dcpx__nccl_merge(struct dcpx__nccl *n, uint32_t rows, const uint16_t *logits,
                 uint64_t stride, const int32_t *row_ends,
                 const int32_t *req_id, const int32_t *block_table,
                 uint32_t bt_rows, uint32_t bt_cols, int32_t *rows_out,
                 int32_t *valid_out, int32_t *ids_out, uint32_t *sat_word,
                 void *stream);
__attribute__((visibility("hidden"))) int
dcpx__nccl_push_k(const struct dcpx_nkctx *k, void *comm, uint32_t rows,
                  const uint16_t *logits, uint64_t stride,
                  const int32_t *row_ends, void *stream);
__attribute__((visibility("hidden"))) int
dcpx__nccl_merge_k(const struct dcpx_nkctx *k, void *comm, uint32_t rows,
                   const uint16_t *logits, uint64_t stride,
                   const int32_t *row_ends, const int32_t *req_id,
                   const int32_t *block_table, uint32_t bt_rows,
                   uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                   int32_t *ids_out, uint32_t *sat_word, void *stream);

/* A call's refusal (bad arguments, the call order): its reason, "fn: the
 * argument and the rule", into m->why for dcpx_member_last_error, and a
 * WARN line (common/log.h). */
#define DCPX_REFUSE(m, ...)                                                   \
  dcpx__why_at((m)->why, sizeof((m)->why), __FILE__, __LINE__, __VA_ARGS__)

/* client.c: 0 when a merge's outputs (rows_out, valid_out, ids_out,
 * sat_word) share no byte with one another or with an array the merge
 * reads (logits, as far as its rows reach, row_ends, req_id,
 * block_table); else DCPX_E_INVAL with both arrays named in m->why. The
 * merge writes each output while it reads the inputs and writes the
 * others, so a shared buffer gives a silently wrong result. Compares
 * only: no syscall. *ret_shared: 1 when the refusal is an overlap (then
 * not even valid_out may be written: it could land on another array),
 * 0 for a block table past the end of the address space. */
__attribute__((visibility("hidden"))) int
dcpx__merge_disjoint(struct dcpx_member *m, const char *fn,
                     const dcpx_call *in, const dcpx_merge_out *out,
                     int *ret_shared);

/* host.c. fail: alarm, then FAILED (a wait that timed out); refuse: the
 * same for a call this rank could not do (bad arguments, a launch that
 * failed), noted for dcpx_member_async_error. */
__attribute__((visibility("hidden"))) void
dcpx__member_fail(struct dcpx_member *m);
__attribute__((visibility("hidden"))) void
dcpx__member_refuse(struct dcpx_member *m);
/* host.c: a new call of `rows` rows (0: not known, a call refused for
 * its struct): the last call's rows, none of them failed yet, for
 * dcpx_member_async_error. */
__attribute__((visibility("hidden"))) void
dcpx__member_rows_begin(struct dcpx_member *m, uint32_t rows);
/* A wait that gave up (docs/PROTOCOL.md 6.3): the record of kind `kind`
 * into this rank's slot of row x->block, if that slot is empty (x's
 * region, index, tags, block and call; the time, generation and rank
 * filled here), then alarm and FAILED (dcpx__member_fail). The host
 * backend's waits, and the NCCL stall watch (cuda.c, on its thread). */
__attribute__((visibility("hidden"))) void
dcpx__member_give_up(struct dcpx_member *m, uint32_t kind,
                     const dcpx_wait_record *x);
__attribute__((visibility("hidden"))) int
dcpx__host_init(struct dcpx_member *m);
__attribute__((visibility("hidden"))) void
dcpx__host_fini(struct dcpx_member *m);
__attribute__((visibility("hidden"))) int
dcpx__host_push(struct dcpx_member *m, const dcpx_call *in);
__attribute__((visibility("hidden"))) int
dcpx__host_push_list(struct dcpx_member *m, const dcpx_call *in,
                     const dcpx_lists *lists);
__attribute__((visibility("hidden"))) int
dcpx__host_merge(struct dcpx_member *m, const dcpx_call *in,
                 const dcpx_merge_out *out);

#endif /* DCPX_LIBCLIENT_MEMBER_H */
