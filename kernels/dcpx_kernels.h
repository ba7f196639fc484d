/* dcpx_kernels.h - the plain C face of the CUDA kernels in kernels/.
 *
 * Host code (libclient's CUDA backend, tests, benches) sees only this
 * header; the device code lives in kernels/dcpx_device.cuh, push.cu and
 * merge.cu. Everything here is pointers and integers.
 *
 * Who owns what:
 *   - The caller owns the context and every buffer. A context describes one
 *     rank of one group as mapped in this process: the shape, the layout
 *     (common/layout.h), the device addresses of every rank's workspace
 *     (`peers`, itself a DEVICE array) and of the control page.
 *   - The launch functions only enqueue: no host sync, no allocation, no
 *     syscall, so they can be captured into CUDA graphs. Kernel arguments
 *     are passed by value; per-call state lives in the workspace (epochs,
 *     seq2, the rank state). They return 0, DCPX_E_INVAL for bad arguments, or
 *     DCPX_E_CUDA when the launch itself failed.
 *   - dcpx_k_prepare() must run once per device, before the first launch and
 *     outside any stream capture: it raises the kernels' dynamic shared
 *     memory limits.
 *
 * Ordering the caller must keep (docs/PROTOCOL.md section 4): on a rank's
 * stream, push(n) -> merge(n) -> push(n+1) -> merge(n+1) ... The merge
 * writes the epochs, and the stream order is what guarantees that the
 * rank's own push grid has completed before that.
 *
 * Several ranks on ONE GPU (tests, benches): every merge grid must be
 * co-resident with every other rank's merge grid and leave room for the
 * pushes. Set max_blocks so that W * max_blocks merge blocks fit (see
 * dcpx_k_merge_occupancy); each block then walks rows t = blockIdx.x,
 * t += gridDim.x, in the same order on every rank. With one rank per GPU,
 * max_blocks = 0 (one block per row) is the fast choice.
 */
#ifndef DCPX_KERNELS_H
#define DCPX_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "dcpx.h"
#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per block (compile-time in the kernels). */
#define DCPX_K_PUSH_THREADS 1024
#define DCPX_K_MERGE_THREADS 512
/* Block-table entries of a merge row's request staged in shared memory
 * (4 KB: every column of a local length up to 65,536 at B = 64; half as
 * many in the half-size blocks). Columns past them are read through L1. */
#define DCPX_K_BT_STAGE 1024u

/* Phase points of the merge's diagnostic timestamps (kctx.prof): row
 * start, poll done, round 1 done, rescue list built, rescue stored,
 * round-2 keys copied, rescue polled, round 2 done, outputs done, row end
 * (the rescue points stay 0 on a row without a rescue); then, inside round
 * 1: its threshold found (10), its keys placed (11); inside a rescue list
 * built from the row: counted (12), thread 0's warp placed (13), thread 0
 * done with its own count, before the count's barrier (23); and the
 * block's kernel entry (14) and exit (15), slot of its first row; the
 * rescue poll's (16-19); inside a rescue list that selects its top K
 * (more than K elements >= T1): its key range (20), its threshold (21),
 * its per-warp bases (22); inside the round-2 copy: thread 0 after its
 * first barrier (36), after the own rescue list's copy (37), after its
 * warp's copy (38), and the last warp's lane 0 after its copy (39). The push's from DCPX_K_PROF_PUSH: kernel entry
 * (+0, slot of the block's first row), row start (+1), inside the local
 * list (+2 .. +9: dcpx_dev_local_list_p's pf[0..7]), the list done
 * (+10), the LL stores done (+11). */
#define DCPX_K_PROF_POINTS 40
#define DCPX_K_PROF_PUSH 24
/* 16..19: inside the rescue poll: thread 0 after its polls (16) and after
 * publishing the key range (17); thread 480 (warp 15) at the section's
 * start (18) and after publishing (19). */

/* A rank's call counters in device memory (kctx.ctr, allocated by the
 * library at join and kept across recoveries). Every merge block adds its
 * finished and rescued rows with fire-and-forget reductions, block 0
 * counts the launch, and the first block of a call's merge that has a
 * failed row counts the call as failed (last_failed: the highest
 * (generation, call sequence + 1) counted). Nothing waits at the end of a
 * merge: block 0 of the NEXT merge (its own previous merge has completed
 * by then, stream order) copies the totals asynchronously at its start
 * and stores them into the rank's health block after its first round 1, so
 * the control page shows the calls up to the previous one: calls =
 * launched - failed_calls; a failed call's rows that finished count in
 * rows and rescue_rows (the host backend counts none of them). */
typedef struct dcpx_k_counters {
  unsigned long long launched, rows, rescue_rows, failed_calls;
  unsigned long long last_failed;
  unsigned long long pad[3];
} dcpx_k_counters;

/* kctx.diag bits, for benches that take one cost out to see its size:
 * the merge neither reads nor checks the fault hook; the merge stores no
 * rescue list (this breaks the protocol: only for a merge whose peers do
 * not run, as bench_kernels' one-rank merge). */
#define DCPX_K_DIAG_NO_HOOK 1u
#define DCPX_K_DIAG_NO_RESCUE_STORES 2u
/* The merge runs its round-1 poll and its rescue poll twice in a row each
 * (is a poll's cost the code's first run, e.g. instruction fetch, or the
 * work?). */
#define DCPX_K_DIAG_POLL_TWICE 4u
/* The merge sleeps 3 us before its rescue poll (is that poll's cost
 * something still draining from the phases before it?). */
#define DCPX_K_DIAG_SLEEP 8u
/* A saturated rank's merge stores its rescue list with every thread, then
 * prepares round 2 with every thread (the order before 2026-12: by
 * default half the block stores while the other half prepares). */
#define DCPX_K_DIAG_NO_OVERLAP 16u
/* A saturated rank's merge stores every pair of its rescue slot, not only
 * the pairs that are sent (docs/PROTOCOL.md 5.4; still a valid exchange:
 * the others are the zeros a receiver assumes): what the trimming saves. */
#define DCPX_K_DIAG_FULL_RESCUE 32u
/* The merge leaves epoch[t] as it found it, so that the same lists can be
 * merged again by the next launch with nothing between them (the merge
 * bench's back-to-back figure; the protocol's next call would then find
 * its lists stale). */
#define DCPX_K_DIAG_KEEP_EPOCH 64u
/* The merge's round-1 placement covers only the first half of each warp's
 * keys, and its outputs only the first K / 2 positions, with the rank
 * bounds made up (s * total / W; no rescue): the outputs are wrong. What
 * two blocks per row, each placing and writing half of a row it selected
 * in full, could save at most (the bench's merge timings only). */
#define DCPX_K_DIAG_HALF_TAIL 128u
/* The merge reads the block table from global memory (L1), not from its
 * shared copy of the request's first DCPX_K_BT_STAGE entries (what the
 * copy saves the outputs). */
#define DCPX_K_DIAG_NO_BT_STAGE 256u
/* A rescue list from the row tests every element's ord16 against T1, as
 * for T1 < 0x8000, not the raw bf16 of a whole group (what the raw test
 * saves a positive T1). */
#define DCPX_K_DIAG_RESC_ORD 512u

/* A wait whose control page says timeout_ns == 0 uses this bound. */
#define DCPX_K_DEFAULT_TIMEOUT_NS 5000000000ull

typedef struct dcpx_kctx {
  uint32_t world, rank, rows_max, topk, local_topk, block_size, interleave,
      max_local;
  uint32_t max_blocks; /* cap on the merge grid; 0 = one block per row */
  uint32_t poll_storm; /* 0; 1 = every waiter reads the control page every
                          2 us (the old behaviour, for measurement only) */
  uint32_t diag;       /* 0; measurement only (benches): DCPX_K_DIAG_* */
  uint32_t push_split_rows; /* calls with more rows push with half-size
                          blocks, two per SM (dcpx_k_push_threads); set it
                          to the SM count; 0 = always full blocks */
  uint32_t merge_split_rows; /* calls with more rows merge with half-size
                          blocks, two per SM (dcpx_k_merge_threads); set it
                          to the SM count when dcpx_k_merge_split_ok; 0 =
                          always full blocks */
  uint32_t merge_threads; /* 0: as merge_split_rows says; else the merge's
                          block size, DCPX_K_MERGE_THREADS or half of it
                          (measurement only, benches) */
  uint32_t push_threads; /* 0: as push_split_rows says; else the push's
                          block size, DCPX_K_PUSH_THREADS or half of it
                          (measurement only, benches) */
  uint32_t pdl;        /* 1: launch push and merge with programmatic
                          dependent launch (the merge starts polling while
                          its push runs). Use with one rank per GPU: ranks
                          sharing a GPU lose SMs to early merges. */
  dcpx_layout L; /* dcpx_layout_compute(world, rows_max, topk, local_topk) */
  char *const *peers; /* DEVICE array [world]: each rank's workspace */
  char *ws;           /* this rank's workspace (device address) */
  dcpx_ctl_header *ctl;       /* device-accessible control page header */
  dcpx_rank_health *health;   /* [world] */
  dcpx_wait_record *records;  /* [world][rows_max] */
  uint32_t *stage; /* merge staging, dcpx_k_merge_stage_bytes (device), or
                      NULL when that is 0 */
  unsigned long long *prof; /* NULL, or (diagnostics) device [rows_max]
                      [DCPX_K_PROF_POINTS]: the merge's and the push's
                      clock64 at their phase points, thread 0 of each
                      row */
  dcpx_k_counters *ctr; /* device, zeroed at join; NULL: no counters */
  uint32_t *klist; /* dcpx_k_klist_bytes (device), or NULL: the push keeps
                      each row's local top-K list here, so that a rescue
                      only filters it; with NULL a saturated rank's merge
                      selects it from the row again (slower) */
  uint32_t resc_early; /* calls of 1 .. resc_early rows (0: none) run the
                      early rescue list: the merge selects this rank's
                      local top-K list of each row at the row's start,
                      before it polls, and uses it as the rescue list when
                      T1 = 0 (always when W*N < K); their push builds no
                      klist and their merge ignores it. With PDL the merge
                      starts while its push runs, and this selection fills
                      time it would spend waiting for the lists, as long
                      as push and merge blocks fit on the GPU together
                      (dcpx_k_resc_early_rows). */
} dcpx_kctx;

/* The shape rules (dcpx_shape_check, common/wire.c) over a context's
 * fields, and its rank. */
static inline int dcpx_k_shape_ok(uint32_t world, uint32_t rank,
                                  uint32_t rows, uint32_t topk,
                                  uint32_t local_topk, uint32_t block_size,
                                  uint32_t interleave, uint32_t max_local) {
  dcpx_shape sh = DCPX_SHAPE_INIT;
  sh.world = world;
  sh.rows = rows;
  sh.topk = topk;
  sh.local_topk = local_topk;
  sh.block_size = block_size;
  sh.interleave = interleave;
  sh.max_local = max_local;
  return dcpx_shape_check(&sh) == 0 && rank < world;
}

/* 0 if the context is complete and its layout matches its shape. */
static inline int dcpx_k_ctx_check(const dcpx_kctx *c) {
  dcpx_layout L;
  if (!c || !c->peers || !c->ws || !c->ctl || !c->health || !c->records)
    return DCPX_E_INVAL;
  if (!dcpx_k_shape_ok(c->world, c->rank, c->rows_max, c->topk,
                       c->local_topk, c->block_size, c->interleave,
                       c->max_local))
    return DCPX_E_INVAL;
  dcpx_layout_compute(&L, c->world, c->rows_max, c->topk, c->local_topk);
  if (L.world != c->L.world || L.rows != c->L.rows || L.topk != c->L.topk ||
      L.local_topk != c->L.local_topk || L.rw_n != c->L.rw_n ||
      L.rw_k != c->L.rw_k || L.pairs != c->L.pairs ||
      L.rpairs != c->L.rpairs || L.rescue_slots != c->L.rescue_slots ||
      L.ws_bytes != c->L.ws_bytes)
    return DCPX_E_INVAL;
  for (uint32_t i = 0; i <= DCPX_REGION_MAX; i++)
    if (L.reg[i].off != c->L.reg[i].off || L.reg[i].bytes != c->L.reg[i].bytes)
      return DCPX_E_INVAL;
  return 0;
}

/* A merge's arrays (dcpx_k_merge, and the NCCL transport's round 1): the
 * inputs and outputs present (ids_out and sat_out may be NULL) and aligned
 * to their elements, else DCPX_E_INVAL: a misaligned access faults in the
 * kernel and kills the engine's context. */
static inline int dcpx_k_merge_args(const uint16_t *logits, uint64_t stride,
                                    const int32_t *row_ends,
                                    const int32_t *req_id,
                                    const int32_t *block_table,
                                    uint32_t bt_rows, uint32_t bt_cols,
                                    const int32_t *rows_out,
                                    const int32_t *valid_out,
                                    const int32_t *ids_out,
                                    const uint32_t *sat_out) {
  if (!logits || !stride || !row_ends || !req_id || !block_table ||
      !bt_rows || !bt_cols || !rows_out || !valid_out)
    return DCPX_E_INVAL;
  if (((uintptr_t)logits & 1u) ||
      (((uintptr_t)row_ends | (uintptr_t)req_id | (uintptr_t)block_table |
        (uintptr_t)rows_out | (uintptr_t)valid_out | (uintptr_t)ids_out |
        (uintptr_t)sat_out) &
       3u))
    return DCPX_E_INVAL;
  return 0;
}

/* Raises the dynamic shared memory limits of both kernels on the current
 * device. 0 or DCPX_E_CUDA. */
int dcpx_k_push_prepare(void);
int dcpx_k_merge_prepare(void);
static inline int dcpx_k_prepare(void) {
  int r = dcpx_k_push_prepare();
  return r < 0 ? r : dcpx_k_merge_prepare();
}

/* Dynamic shared memory a launch of this context uses (bytes). */
size_t dcpx_k_push_smem(const dcpx_kctx *c);
size_t dcpx_k_merge_smem(const dcpx_kctx *c);

/* Device memory the merge needs in kctx.stage (bytes): 0 when a row's
 * staged words (round-1 lists, round-2 keys) fit in shared memory, else
 * rows_max rows of them. Rank-private; allocate once at join. */
size_t dcpx_k_merge_stage_bytes(const dcpx_kctx *c);

/* Device memory of kctx.klist: rows_max local top-K lists (bytes). */
size_t dcpx_k_klist_bytes(const dcpx_kctx *c);

/* 0 or 1 when the environment variable is exactly "0" or "1", else -1. */
static inline int dcpx_k_env01(const char *name) {
  const char *e = getenv(name);
  return e && (e[0] == '0' || e[0] == '1') && !e[1] ? e[0] - '0' : -1;
}

#ifdef __CUDACC__
#define DCPX_K_HD __host__ __device__
#else
#define DCPX_K_HD
#endif

/* Whether a call of `rows` rows runs the early rescue list (kctx
 * resc_early); push and merge of a call decide alike. */
static inline DCPX_K_HD int dcpx_k_early(uint32_t resc_early, uint32_t rows) {
  return rows && rows <= resc_early;
}

/* kctx.resc_early for a context whose pdl is set, on a GPU of `sms`
 * multiprocessors: when every full row rescues with T1 = 0 (W*N < K) and
 * the merge starts while its push runs (pdl), calls whose push and merge
 * blocks fit on the GPU together (2 * rows <= sms: both kernels run one
 * block per SM) select the rescue list early; larger calls keep the
 * push's klist (bench/RESULTS.md, session 7). DCPX_RESC_EARLY=0 (never)
 * or 1 (every call) in the environment overrides (measurement). Host
 * query, at join. */
static inline uint32_t dcpx_k_resc_early_rows(const dcpx_kctx *c, int sms) {
  const int e = dcpx_k_env01("DCPX_RESC_EARLY");
  if (e >= 0)
    return e ? 0xFFFFFFFFu : 0u;
  if (!c->pdl || (uint64_t)c->world * c->local_topk >= c->topk || sms < 2)
    return 0;
  return (uint32_t)sms / 2u;
}

/* Whether a context should have a klist. It costs every push a top-K
 * selection (+5.7 us at local 16,384 on an H200) and saves a rescued row
 * its top-K selection from the row (about 13 us), which a rescue needs only
 * when the saturated rank has more than K elements >= T1: always when
 * W*N <= K (every full row rescues, with T1 = 0 when W*N < K), rarely
 * otherwise (the merge
 * then filters the row in two passes). So: on when W*N <= K, unless the
 * merge selects that list early in every call (resc_early >= rows_max).
 * DCPX_KLIST=0 or 1 in the environment overrides (measurement). Host
 * query, at join, after resc_early is set. */
static inline int dcpx_k_klist_wanted(const dcpx_kctx *c) {
  const int e = dcpx_k_env01("DCPX_KLIST");
  if (e >= 0)
    return e;
  return (uint64_t)c->world * c->local_topk <= c->topk &&
         c->resc_early < c->rows_max;
}

/* Merge blocks of this context that fit on one multiprocessor
 * (cudaOccupancyMaxActiveBlocksPerMultiprocessor). Host query; not for the
 * call path. */
int dcpx_k_merge_occupancy(const dcpx_kctx *c, int *ret_blocks_per_sm);

/* What one kernel instance takes (the benches' roofline: tests/gpu/
 * roofline.c): its registers per thread, local memory per thread (spills),
 * static and (for this context) dynamic shared memory per block, and its
 * blocks of `threads` threads that fit on one multiprocessor. Host query. */
typedef struct dcpx_k_res {
  int regs, local_bytes, static_smem;
  size_t dyn_smem;
  uint32_t threads;
  int blocks_per_sm;
} dcpx_k_res;
/* The push of this context in blocks of nt threads (DCPX_K_PUSH_THREADS
 * or half of it). */
int dcpx_k_push_res(const dcpx_kctx *c, uint32_t nt, dcpx_k_res *ret);
/* The merge (without the early rescue list) in blocks of nt threads
 * (DCPX_K_MERGE_THREADS or half of it). */
int dcpx_k_merge_res(const dcpx_kctx *c, uint32_t nt, dcpx_k_res *ret);

/* Push (docs/PROTOCOL.md sections 3-4): for each row t < rows, this rank's
 * local top-N of logits[t * stride + 0 .. row_ends[t]) in wire words,
 * stored with tag dcpx_epoch_tag(epoch[t]) into every rank's LL slots.
 * row_ends[t] is clamped to [0, min(max_local, stride)]. Block 0 advances the call sequence
 * (layout.h call_seq, the call tag of wait records: it lives in device
 * memory, so a CUDA graph replay counts too). The push reads the `stop`
 * word of the rank's state block in device memory once (set when the
 * group aborted or this rank FAILED: the merge and one elected reader of
 * the control page write it, PROTOCOL.md 6.7; the push never reads the
 * control page) and, when it is set, stores nothing into any rank's slots
 * (the call fails in the merge). */
int dcpx_k_push(const dcpx_kctx *c, uint32_t rows, const uint16_t *logits,
                uint64_t stride, const int32_t *row_ends, cudaStream_t s);

/* Threads of a push block for a call of `rows` rows (host, no CUDA call). */
uint32_t dcpx_k_push_threads(const dcpx_kctx *c, uint32_t rows);

/* The merge's block size for a call of `rows` rows: DCPX_K_MERGE_THREADS,
 * or half of it (two blocks per SM, one wave for up to twice the SMs;
 * dcpx_k_merge_split_ok) when rows > merge_split_rows and the grid is not
 * capped (max_blocks 0). */
uint32_t dcpx_k_merge_threads(const dcpx_kctx *c, uint32_t rows);

/* *ret_ok = 1 when this context's merge may run half-size blocks: K <=
 * 2048 (a rescue filter's 8 entries per thread) and two of them fit on a
 * multiprocessor (shared memory, which bounds W * N). Host query, at
 * join. 0, DCPX_E_INVAL or DCPX_E_CUDA. */
int dcpx_k_merge_split_ok(const dcpx_kctx *c, int *ret_ok);

/* The public device context (dcpx.h dcpx_device; include/dcpx/device.cuh)
 * of a kernel context: what an engine kernel, or dcpx_k_push_list, needs
 * to push as this rank. */
static inline void dcpx_k_device(const dcpx_kctx *c, dcpx_device *ret) {
  char *st = c->ws + c->L.off_call;
  ret->size = sizeof(dcpx_device);
  ret->world = c->world;
  ret->rank = c->rank;
  ret->rows = c->rows_max;
  ret->local_topk = c->local_topk;
  ret->row_words = c->L.rw_n;
  ret->max_local = c->max_local;
  ret->pdl = c->pdl;
  ret->off_ll = c->L.off_ll;
  ret->peers = c->peers;
  ret->epoch = (const uint32_t *)(c->ws + c->L.off_epoch);
  ret->call_seq = (uint64_t *)(st + offsetof(dcpx_rank_state, call_seq));
  ret->stop = (uint32_t *)(st + offsetof(dcpx_rank_state, stop));
  ret->alarm = (uint32_t *)&c->health[c->rank].alarm;
  ret->failed = (uint32_t *)&c->health[c->rank].failed;
}

/* Push of lists the caller computed (dcpx_push_list): row t's list is
 * values/indices[t * N .. t * N + N) (device), checked and encoded by
 * dcpx_device_list_words, stored with
 * tag dcpx_epoch_tag(epoch[t]) into every rank's LL slots; a bad row is stored
 * nowhere and refuses the call (dcpx_device_refuse: alarm, then FAILED).
 * row_ends[t] is clamped to [0, max_local]. Block 0 advances the call
 * sequence. The merge of such a call must not use the klist (the push
 * built none): the caller merges with a context whose klist is NULL. */
int dcpx_k_push_list(const dcpx_kctx *c, uint32_t rows,
                     const uint16_t *values, const int32_t *indices,
                     const int32_t *row_ends, cudaStream_t s);

/* Merge (docs/PROTOCOL.md sections 4-6) of rows t < rows. Outputs (device):
 *   rows_out  [rows][K]  KV rows of this rank's selected elements, ascending
 *                        l, -1 padded
 *   valid_out [rows]     their count; -1 when the row's call failed (a wait
 *                        gave up: timeout, own rank FAILED, group aborted)
 *                        or an own element fell outside block_table
 *   ids_out   [rows][K]  or NULL: gids of all K selected, (r, l) order
 *   sat_out   [rows]     or NULL: a copy of sat_word (0 on a row that failed
 *                        before round 1 finished)
 * req_id [rows] indexes block_table [bt_rows][bt_cols]. logits/row_ends are
 * the same as the push's (a saturated rank re-reads its row for its
 * rescue list). Wait records carry the call sequence the push advanced. */
int dcpx_k_merge(const dcpx_kctx *c, uint32_t rows, const uint16_t *logits,
                 uint64_t stride, const int32_t *row_ends,
                 const int32_t *req_id, const int32_t *block_table,
                 uint32_t bt_rows, uint32_t bt_cols, int32_t *rows_out,
                 int32_t *valid_out, int32_t *ids_out, uint32_t *sat_out,
                 cudaStream_t s);

/* ---- the NCCL transport (nccl.cu) ----------------------------------------
 *
 * For ranks without P2P access (docs/PROTOCOL.md section 7). The context names
 * this rank's workspace (only sat_word and stats are used) and its NCCL
 * buffer (common/layout.h, dcpx_nccl_layout: send, recv, rsend, rrecv,
 * mask, bits), both device memory of this rank's GPU. The caller
 * (libclient/nccl.c) enqueues on one stream, per call of `rows` rows:
 *
 *   dcpx_kn_lists    local top-N lists -> send [rows][rw_n]
 *   ncclAllGather    send -> recv, rows * rw_n uint32 per rank
 *   dcpx_kn_round1   round 1, mask, sat_word, stats; outputs of rows
 *                    without a saturated rank; a saturated rank's K-lists
 *                    -> rsend [rows][rw_k]
 *   ncclAllGather    rsend -> rrecv, rows * rw_k uint32 per rank
 *   dcpx_kn_round2   round 2 and the outputs of the other rows
 *
 * The outputs are those of dcpx_k_merge (and dcpx_ref_call), bit for bit;
 * valid_out is never -1 for a failed wait (there are none), only for an
 * own element outside block_table. No host sync, no allocation: the whole
 * sequence can be captured into a CUDA graph. dcpx_kn_prepare() runs once
 * per device before the first launch, outside any capture. */
typedef struct dcpx_nkctx {
  uint32_t world, rank, rows_max, topk, local_topk, block_size, interleave,
      max_local;
  dcpx_layout L;       /* dcpx_layout_compute(world, rows_max, topk, N) */
  dcpx_nccl_layout NL; /* dcpx_nccl_layout_compute(&NL, &L) */
  char *ws;            /* this rank's workspace (device) */
  char *buf;           /* this rank's NCCL buffer, NL.bytes (device) */
  dcpx_k_counters *ctr;     /* as kctx.ctr (round 1 counts), or NULL */
  dcpx_rank_health *health; /* this rank's health block (device address
                               of the control page), with ctr */
  const uint32_t *voided;   /* device word, or NULL: non-zero once the
                               library aborted the communicator (nccl.c):
                               an all-gather before a round kernel may
                               then have ended without its data, so the
                               round kernels fail every row they start
                               (valid_out = -1) instead of merging stale
                               lists */
  unsigned long long *beat; /* host memory mapped for the device, or NULL:
                               the stall watch's heartbeat. Each kernel's
                               block 0 stores (globaltimer << 2) | code at
                               its start, code saying which of this rank's
                               collectives follows it on the stream
                               (DCPX_NCCL_BEAT_*): libclient/nccl.c's
                               watchdog fails the rank when the word shows
                               a collective and stays the same for the
                               group's timeout (a peer that stalled, or
                               ranks whose calls do not match) */
} dcpx_nkctx;

/* dcpx_nkctx.beat's codes: what follows the kernel that stored it. The
 * push's all-gather is followed by a store of IDLE on the stream
 * (libclient/nccl.c), so that device work between push and merge is not
 * taken for a pending all-gather. */
#define DCPX_NCCL_BEAT_IDLE 0u   /* round 2, or the push's end: none */
#define DCPX_NCCL_BEAT_LISTS 1u  /* lists: the all-gather of the lists */
#define DCPX_NCCL_BEAT_RESCUE 2u /* round 1: that of the rescue lists */

static inline int dcpx_kn_ctx_check(const dcpx_nkctx *c) {
  dcpx_layout L;
  dcpx_nccl_layout NL;
  if (!c || !c->ws || !c->buf)
    return DCPX_E_INVAL;
  if (!dcpx_k_shape_ok(c->world, c->rank, c->rows_max, c->topk,
                       c->local_topk, c->block_size, c->interleave,
                       c->max_local))
    return DCPX_E_INVAL;
  dcpx_layout_compute(&L, c->world, c->rows_max, c->topk, c->local_topk);
  dcpx_nccl_layout_compute(&NL, &L);
  if (L.rw_n != c->L.rw_n || L.rw_k != c->L.rw_k ||
      L.off_sat != c->L.off_sat || L.off_stats != c->L.off_stats ||
      NL.bits_words != c->NL.bits_words || NL.off_recv != c->NL.off_recv ||
      NL.off_rsend != c->NL.off_rsend || NL.off_rrecv != c->NL.off_rrecv ||
      NL.off_mask != c->NL.off_mask || NL.off_bits != c->NL.off_bits ||
      NL.bytes != c->NL.bytes)
    return DCPX_E_INVAL;
  return 0;
}

/* Fills a context's shape and layouts (ws and buf are the caller's). */
static inline void dcpx_kn_ctx_init(dcpx_nkctx *c, const dcpx_shape *sh,
                                    uint32_t rank) {
  c->world = sh->world;
  c->rank = rank;
  c->rows_max = sh->rows;
  c->topk = sh->topk;
  c->local_topk = sh->local_topk;
  c->block_size = sh->block_size;
  c->interleave = sh->interleave;
  c->max_local = sh->max_local;
  dcpx_layout_compute(&c->L, sh->world, sh->rows, sh->topk, sh->local_topk);
  dcpx_nccl_layout_compute(&c->NL, &c->L);
  c->ws = NULL;
  c->buf = NULL;
  c->ctr = NULL;
  c->health = NULL;
  c->voided = NULL;
  c->beat = NULL;
}

/* The all-gathers' buffers and counts (uint32 elements per rank). */
static inline uint32_t *dcpx_kn_send(const dcpx_nkctx *c) {
  return (uint32_t *)(c->buf + c->NL.off_send);
}
static inline uint32_t *dcpx_kn_recv(const dcpx_nkctx *c) {
  return (uint32_t *)(c->buf + c->NL.off_recv);
}
static inline uint32_t *dcpx_kn_rsend(const dcpx_nkctx *c) {
  return (uint32_t *)(c->buf + c->NL.off_rsend);
}
static inline uint32_t *dcpx_kn_rrecv(const dcpx_nkctx *c) {
  return (uint32_t *)(c->buf + c->NL.off_rrecv);
}

int dcpx_kn_prepare(void);
size_t dcpx_kn_lists_smem(const dcpx_nkctx *c);
size_t dcpx_kn_round1_smem(const dcpx_nkctx *c);
size_t dcpx_kn_round2_smem(const dcpx_nkctx *c);

int dcpx_kn_lists(const dcpx_nkctx *c, uint32_t rows, const uint16_t *logits,
                  uint64_t stride, const int32_t *row_ends, cudaStream_t s);
/* The heartbeat's IDLE after the push's all-gather (libclient/nccl.c), by
 * a one-thread kernel; nothing without c->beat. */
int dcpx_kn_beat_idle(const dcpx_nkctx *c, cudaStream_t s);
int dcpx_kn_round1(const dcpx_nkctx *c, uint32_t rows, const uint16_t *logits,
                   uint64_t stride, const int32_t *row_ends,
                   const int32_t *req_id, const int32_t *block_table,
                   uint32_t bt_rows, uint32_t bt_cols, int32_t *rows_out,
                   int32_t *valid_out, int32_t *ids_out, uint32_t *sat_out,
                   cudaStream_t s);
int dcpx_kn_round2(const dcpx_nkctx *c, uint32_t rows, const int32_t *req_id,
                   const int32_t *block_table, uint32_t bt_rows,
                   uint32_t bt_cols, int32_t *rows_out, int32_t *valid_out,
                   int32_t *ids_out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* DCPX_KERNELS_H */
