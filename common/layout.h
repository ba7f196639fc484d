/* layout.h - the memory every implementation shares: a rank's workspace
 * (the exchange buffers of docs/PROTOCOL.md sections 4 and 5) and the group's
 * control page (section 6). Plain C, also included by the CUDA kernels.
 *
 * Workspace of rank d (one per rank; CUDA backend: device memory allocated
 * by dcpxd with cuMemCreate; host backend: a memfd). Every region starts on
 * a 256-byte boundary; all words are little-endian 32/64-bit integers:
 *
 *   ll_slots  [2][W][R][P] pairs     P = ceil(row_words(N)/2): (parity,
 *                                     source rank, row, 16-byte LL pair
 *                                     (word, tag, word, tag))
 *   rescue    [R][S][PK] pairs       S = min(W, floor(K/N)) slots per row,
 *                                     PK = row_words(K)/2 LL pairs tagged
 *                                     with the row's round-2 epoch q2
 *   epoch     uint32 [R]             row t's epoch word (4.3: call half,
 *                                     row half of the last merge)
 *   seq2      uint32 [R]             last round-2 epoch of row t
 *   sat_word  uint32 [R]             (mask << 16) | ord16 of S1's K-th key
 *   stats     uint64 [R][2]          per row: calls merged, rescues run
 *   state     dcpx_rank_state        call_seq: calls pushed since the
 *                                     workspace was zeroed (the call tag of
 *                                     wait records); CUDA backend: the
 *                                     device mirror of the control page
 *
 * Writers: ll_slots and rescue are written by every rank's push or merge
 * (remote LL stores); epoch, seq2, sat_word and stats only by rank d's own
 * merge (one writer per row, but a merge block also gives the rows the
 * call does not hold their call half: docs/PROTOCOL.md 4.3); call_seq only
 * by rank d's own push. Zeroed memory is the initial state: epoch 0 and
 * tag 0 never match (dcpx_epoch_tag and dcpx_epoch_next never give 0).
 *
 * Region ids name the regions in the join reply and in wait records; id 2
 * (the rescue flags of layout version 1) is retired.
 *
 * Control page (one per group, host memory owned by dcpxd, mapped by every
 * client and registered for device access): a header, then per rank a
 * health block, then the wait records [W][R] (record slot (d, t) has a
 * single writer: block t of rank d's merge, or the host backend's row t;
 * with the NCCL transport, slot (d, 0) only, libdcpx's watchdog thread).
 * Every word is written with plain stores (no CPU-GPU atomics: PCIe hosts
 * lack them); a writer orders "record, then alarm, then failed" with
 * system-scope fences.
 */
#ifndef DCPX_COMMON_LAYOUT_H
#define DCPX_COMMON_LAYOUT_H

#include <stdint.h>

#define DCPX_CTL_MAGIC 0x44435058u /* "DCPX" */
#define DCPX_CTL_VERSION 3u
#define DCPX_CTL_SECRET_BYTES 32
#define DCPX_ALIGN 256u

/* Region ids (join reply, wait records), the index in dcpx_layout.reg. */
#define DCPX_REGION_LL_SLOTS 1u
#define DCPX_REGION_RESCUE 3u
#define DCPX_REGION_EPOCH 4u
#define DCPX_REGION_SEQ2 5u
#define DCPX_REGION_SAT_WORD 6u
#define DCPX_REGION_STATS 7u
#define DCPX_REGION_CALL_SEQ 8u
#define DCPX_REGION_MAX 8u

#define DCPX_REC_EMPTY 0u
#define DCPX_REC_TIMEOUT 1u /* a bounded wait gave up (an LL wait) */
/* The NCCL transport: a collective of the rank stayed pending for the
 * group's wait limit (libclient/nccl.c's stall watch). Region 0, index
 * 1 (the all-gather of the lists) or 2 (of the rescue lists), block 0,
 * tags and call 0. */
#define DCPX_REC_NCCL_TIMEOUT 2u

/* A record kind's name, as dcpxd logs and dcpxctl prints it. */
static inline const char *dcpx_rec_kind_name(uint32_t kind) {
  return kind == DCPX_REC_TIMEOUT        ? "timeout"
         : kind == DCPX_REC_NCCL_TIMEOUT ? "nccl_timeout"
                                         : "unknown";
}

/* Reasons in the abort word (0 = not aborted). */
#define DCPX_ABORT_ALARM 1u   /* a rank raised its alarm */
#define DCPX_ABORT_DEAD 2u    /* a rank's process died or disconnected */
#define DCPX_ABORT_OPERATOR 3u /* dcpxctl reset (a shutdown aborts nothing) */

typedef struct dcpx_layout {
  uint32_t world, rows, topk, local_topk;
  uint32_t rw_n, rw_k; /* row_words(N), row_words(K) */
  uint32_t pairs;      /* P: 16-byte LL stores per list */
  uint32_t rescue_slots;
  uint32_t rpairs;     /* PK: LL pairs of a rescue slot, row_words(K)/2 */
  /* Byte offsets in a rank's workspace, and its total size. */
  uint64_t off_ll, off_rescue, off_epoch, off_seq2, off_sat, off_stats,
      off_call, ws_bytes;
  /* The same regions by id: reg[id] = {offset, bytes}; {0, 0} for the
   * ids that name no region (0, 2). */
  struct {
    uint64_t off, bytes;
  } reg[DCPX_REGION_MAX + 1];
  /* Control page: offsets of the rank blocks and records, total size. */
  uint64_t off_ranks, off_records, ctl_bytes;
} dcpx_layout;

/* A rank's health block in the control page (128 bytes). */
typedef struct dcpx_rank_health {
  volatile uint32_t alarm;  /* raised by a waiter that timed out */
  volatile uint32_t failed; /* set after the alarm store drained */
  volatile uint32_t joined; /* written by dcpxd: a live process holds it */
  volatile uint32_t pid;    /* written by dcpxd */
  /* Fault hook, written by dcpxd only when fault injection is enabled:
   * block 0 of this rank stalls fault_ticks ns once (at most the group's
   * wait timeout, less if the group aborts or the rank fails meanwhile),
   * in the call whose epoch (the row half of row 0's tag, 1..0xFFFE; 0 =
   * any) and call_seq (~0 = any) match.
   * fault_fired is written by the stalling block. */
  volatile uint32_t fault_armed;
  volatile uint32_t fault_epoch;
  volatile uint64_t fault_call;
  volatile uint64_t fault_ticks;
  volatile uint32_t fault_fired;
  volatile uint32_t pad0;
  /* Written by the client at the end of each call (single writer; CUDA:
   * block 0 of the next merge); zeroed by the client at join, kept by
   * dcpxd at a recovery. last_call_tag is the caller's by-value tag,
   * bookkeeping only. */
  volatile uint64_t calls, rows, rescue_rows, failed_calls;
  volatile uint64_t last_call_tag;
  /* Written by the client at join: the transport this rank resolved and
   * uses (DCPX_TRANSPORT_LL or _NCCL; 0 = not yet known). dcpxd reports it
   * and keeps it across a recovery; with transport AUTO the ranks compare
   * their words before the first call (common/transport.h). */
  volatile uint32_t transport;
  uint32_t pad1[9];
} dcpx_rank_health;

/* A rank's own state in its workspace (64 bytes, region "state", at
 * off_call). call_seq is advanced by the rank's push, in every backend.
 * The other words are the CUDA kernels' device-memory mirror of the
 * control page, so that no kernel reads host memory on every spin: a
 * waiting block wins the rank-wide election on ctl_next (an L2 atomic) at
 * most every 20 us, reads the control page over PCIe, and publishes the
 * timeout and stop (abort or own FAILED seen); everyone else reads these
 * words from device memory. Zeroed with the workspace at recovery. */
typedef struct dcpx_rank_state {
  volatile uint64_t call_seq;
  unsigned long long ctl_next; /* globaltimer of the next control-page read */
  volatile uint64_t timeout_ns; /* the group's wait limit as last read */
  volatile uint32_t stop;       /* 1: abort or own FAILED seen */
  uint32_t pad[9];
} dcpx_rank_state;

/* A wait record (48 bytes). `kind` is written last. */
typedef struct dcpx_wait_record {
  volatile uint32_t kind;
  volatile uint32_t region;
  volatile uint32_t index;    /* 8-byte (word, tag) half within the region */
  volatile uint32_t expected; /* tag awaited */
  volatile uint32_t seen;     /* tag last read */
  volatile uint32_t block;    /* block id (row) */
  volatile uint64_t time_ns;  /* CLOCK_REALTIME ns (host) / globaltimer */
  volatile uint64_t call_tag; /* the waiting rank's call_seq */
  volatile uint32_t generation;
  volatile uint32_t rank;
} dcpx_wait_record;

/* The control page header (256 bytes). */
/* The bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES; dcpxd, which
 * does not link NCCL, relays at most this many). */
#define DCPX_NCCL_ID_BYTES 128

typedef struct dcpx_ctl_header {
  uint32_t magic, version;
  uint32_t world, rows;
  volatile uint32_t abort;      /* DCPX_ABORT_* or 0 */
  volatile uint32_t generation; /* bumped by every recovery */
  volatile uint64_t timeout_ns; /* bounded-wait limit */
  volatile uint32_t recovering; /* dcpxd: ranks must drain and ack */
  uint32_t pad0;
  /* Random, written by dcpxd when the group forms; a reattach after a
   * restart is adopted only if it matches (daemon/dcpxd-secrets.h). */
  uint8_t secret[DCPX_CTL_SECRET_BYTES];
  /* The NCCL transport's communicator for generation nccl_gen (0: none):
   * rank 0's unique id, written by dcpxd when the group forms (from rank
   * 0's Join) and when a recovery completes if rank 0 sent a fresh one
   * (its RecoverAck, or a replacement rank 0's Join), before the
   * generation is bumped. A member rebuilds its communicator from it
   * when nccl_gen is the current generation (docs/PROTOCOL.md 6.9). */
  volatile uint32_t nccl_gen;
  uint32_t nccl_id_len; /* <= DCPX_NCCL_ID_BYTES */
  uint8_t nccl_id[DCPX_NCCL_ID_BYTES];
  uint32_t pad[12];
} dcpx_ctl_header;
#ifndef __cplusplus
_Static_assert(sizeof(dcpx_ctl_header) == 256, "the header is 256 bytes");
_Static_assert(__builtin_offsetof(dcpx_ctl_header, nccl_gen) == 72 &&
                   __builtin_offsetof(dcpx_ctl_header, nccl_id) == 80,
               "docs/PROTOCOL.md's header offsets");
_Static_assert(sizeof(dcpx_rank_health) == 128, "a health block is 128 bytes");
#endif

/* The offset helpers below are the one place each formula is written; the
 * CUDA kernels call them too. */
#ifdef __CUDACC__
#define DCPX_LAYOUT_FN static inline __host__ __device__
#else
#define DCPX_LAYOUT_FN static inline
#endif

static inline uint64_t dcpx__align(uint64_t x) {
  return (x + DCPX_ALIGN - 1) & ~(uint64_t)(DCPX_ALIGN - 1);
}

/* row_words(C) of docs/PROTOCOL.md section 3: C entry words, then
 * ceil(C/32) plane words, rounded up to a multiple of 4. The one place
 * this is written (dcpx_row_words, the kernels and the layout use it). */
#define DCPX_ROW_WORDS(c) (((c) + ((c) + 31u) / 32u + 3u) & ~3u)

static inline uint32_t dcpx__row_words_raw(uint32_t c) {
  return DCPX_ROW_WORDS(c);
}

static inline uint64_t dcpx__layout_add(dcpx_layout *L, uint32_t id,
                                        uint64_t *o, uint64_t bytes) {
  const uint64_t at = *o;
  L->reg[id].off = at;
  L->reg[id].bytes = bytes;
  *o = dcpx__align(at + bytes);
  return at;
}

/* Fills *L for a shape already checked by dcpx_shape_check. */
static inline void dcpx_layout_compute(dcpx_layout *L, uint32_t world,
                                       uint32_t rows, uint32_t topk,
                                       uint32_t local_topk) {
  uint64_t o = 0;
  uint32_t s = topk / local_topk;
  for (uint32_t i = 0; i <= DCPX_REGION_MAX; i++)
    L->reg[i].off = L->reg[i].bytes = 0;
  L->world = world;
  L->rows = rows;
  L->topk = topk;
  L->local_topk = local_topk;
  L->rw_n = dcpx__row_words_raw(local_topk);
  L->rw_k = dcpx__row_words_raw(topk);
  L->pairs = (L->rw_n + 1) / 2;
  L->rpairs = L->rw_k / 2;
  L->rescue_slots = s < world ? s : world;
  L->off_ll = dcpx__layout_add(L, DCPX_REGION_LL_SLOTS, &o,
                               16ull * 2 * world * rows * L->pairs);
  L->off_rescue = dcpx__layout_add(L, DCPX_REGION_RESCUE, &o,
                                   16ull * rows * L->rescue_slots * L->rpairs);
  L->off_epoch = dcpx__layout_add(L, DCPX_REGION_EPOCH, &o, 4ull * rows);
  L->off_seq2 = dcpx__layout_add(L, DCPX_REGION_SEQ2, &o, 4ull * rows);
  L->off_sat = dcpx__layout_add(L, DCPX_REGION_SAT_WORD, &o, 4ull * rows);
  L->off_stats = dcpx__layout_add(L, DCPX_REGION_STATS, &o, 16ull * rows);
  L->off_call = dcpx__layout_add(L, DCPX_REGION_CALL_SEQ, &o,
                                 sizeof(dcpx_rank_state));
  L->ws_bytes = o;
  L->off_ranks = sizeof(dcpx_ctl_header);
  L->off_records = L->off_ranks + sizeof(dcpx_rank_health) * world;
  L->ctl_bytes = dcpx__align(L->off_records +
                             sizeof(dcpx_wait_record) * (uint64_t)world * rows);
}

/* The rescue slot of saturated rank s in a row whose mask is `mask`. */
static inline uint32_t dcpx_rescue_slot(uint32_t mask, uint32_t s) {
  return (uint32_t)__builtin_popcount(mask & ((1u << s) - 1u));
}

/* Byte offset, within the rescue region, of pair i of slot `slot`, row t. */
DCPX_LAYOUT_FN uint64_t dcpx_rescue_offset(const dcpx_layout *L, uint32_t t,
                                          uint32_t slot, uint32_t i) {
  return (((uint64_t)t * L->rescue_slots + slot) * L->rpairs + i) * 16u;
}

/* Whether word j of a rescue list of capacity K holding c entries is
 * sent (docs/PROTOCOL.md 5.4): the entries, the first empty entry after
 * them (the end mark; none when c == K), and the plane words of the
 * entries. The rest is 0 by definition and never sent. */
DCPX_LAYOUT_FN int dcpx_rescue_word_sent(uint32_t K, uint32_t c, uint32_t j) {
  if (j < K)
    return j <= c;
  j -= K;
  return j < (K + 31u) / 32u && 32u * j < c;
}

/* Whether pair i (words 2i, 2i + 1) of such a list is sent. */
DCPX_LAYOUT_FN int dcpx_rescue_pair_sent(uint32_t K, uint32_t c, uint32_t i) {
  return dcpx_rescue_word_sent(K, c, 2u * i) ||
         dcpx_rescue_word_sent(K, c, 2u * i + 1u);
}

/* Whether the rescue tagged q2 rewrites every copy of every slot of its
 * row (docs/PROTOCOL.md 5.4): each saturated rank stores every pair of
 * its slot, sent or not, into every region, its own included, and every
 * rank zeros the slots no rank holds in its own region. Once every 65,536
 * rescues of a row (131,070 apart where next() skips 0 and 0xFFFFFFFF),
 * so that no pair keeps a tag for the 2^32 - 2 rescues after which the
 * row's tags repeat. */
DCPX_LAYOUT_FN int dcpx_rescue_refresh(uint32_t q2) {
  return (q2 & 0xFFFFu) == 0;
}

/* A round-1 half that carries tag `seen` where `e` is awaited holds the
 * awaited row half under another call half (docs/PROTOCOL.md 4.3): its
 * source stored that row in another call, which only ranks that disagree
 * on the calls (their rows) do, and the awaited list never comes. A wait
 * gives up at once on it; dcpxd's log line of the record says so. */
DCPX_LAYOUT_FN int dcpx_tag_other_call(uint32_t region, uint32_t e,
                                      uint32_t seen) {
  return region == DCPX_REGION_LL_SLOTS && seen != e &&
         ((seen ^ e) & 0xFFFFu) == 0;
}

/* Byte offset, within ll_slots, of the pair i (words 2i, 2i+1) of source s,
 * row t, parity p. */
DCPX_LAYOUT_FN uint64_t dcpx_ll_offset(const dcpx_layout *L, uint32_t p,
                                      uint32_t s, uint32_t t, uint32_t i) {
  return ((((uint64_t)p * L->world + s) * L->rows + t) * L->pairs + i) * 16u;
}

/* The source rank of the ll_slots half `index` (a wait record's,
 * docs/PROTOCOL.md 6.3: 2 * ((((p * W + s) * R + t) * P) + i) + h): the
 * rank whose list the wait awaited. */
DCPX_LAYOUT_FN uint32_t dcpx_ll_index_source(const dcpx_layout *L,
                                            uint32_t index) {
  return (uint32_t)((index / 2u / L->pairs / L->rows) % L->world);
}

/* The sender of the rescue half `index` (2 * (((t * S + x) * PK) + i) + h)
 * that a wait of rank d awaited, when the layout alone tells it; else -1.
 * Slot x belongs to the saturated rank with x saturated ranks below it
 * (docs/PROTOCOL.md 5.4): some rank s >= x, and never d itself (a rank
 * stores its own list before it waits, or does not poll it: the CUDA
 * merge). Which one is the row's mask, and no record holds it: sat_word
 * is stored after the row's result, and a row whose wait gave up leaves
 * it alone (5.7). So the sender is known only when x..W-1 less d is one
 * rank: always at W = 2, else only for the last slots. */
static inline int32_t dcpx_rescue_index_source(const dcpx_layout *L,
                                               uint32_t d, uint32_t index) {
  uint32_t x;
  if (!L->rescue_slots || !L->rpairs || d >= L->world)
    return -1;
  x = index / 2u / L->rpairs % L->rescue_slots;
  if (L->world - x - (d >= x) != 1)
    return -1;
  return (int32_t)(d < x ? x : d == x ? x + 1 : x);
}

/* ---- the LL merge's staging area (CUDA kernels) ----------------------------
 *
 * An LL merge block copies every word of a row it reads (the W lists,
 * then round 2's keys) once into a staging area and selects from there:
 *   k1 [W*N, to 4]        round-1 entries, flat (r, l) order
 *   p1 [W][rw_n - N]      their bit-16 planes
 *   k2 [see below, to 4]  round-2 keys, rank-major, each rank's segment
 *                         (N, or K for a saturated rank) padded to 4
 *   p2 [S][rw_k - K]      the saturated ranks' rescue-list planes
 * in shared memory when it fits DCPX_STAGE_SMEM_BYTES, else in a
 * rank-private global area of `words` per block. */
#define DCPX_STAGE_SMEM_BYTES (100u * 1024u)

typedef struct dcpx_stage_plan {
  uint32_t k1, p1, k2, p2, words; /* uint32 words of each part, and in all */
  uint32_t in_smem;
} dcpx_stage_plan;

DCPX_LAYOUT_FN uint32_t dcpx__pad4(uint32_t x) { return (x + 3u) & ~3u; }

static inline dcpx_stage_plan dcpx_stage_plan_of(const dcpx_layout *L) {
  const uint32_t W = L->world, N = L->local_topk, K = L->topk;
  const uint32_t S = L->rescue_slots;
  dcpx_stage_plan p;
  p.k1 = dcpx__pad4(W * N);
  p.p1 = dcpx__pad4(W * (L->rw_n - N));
  p.k2 = dcpx__pad4((W - S) * N + S * K + 3u * W);
  p.p2 = dcpx__pad4(S * (L->rw_k - K));
  p.words = p.k1 + p.p1 + p.k2 + p.p2;
  p.in_smem = (uint64_t)p.words * 4u <= DCPX_STAGE_SMEM_BYTES;
  return p;
}

/* ---- the NCCL transport's buffers -----------------------------------------
 *
 * With transport nccl the exchange does not use the LL slots or the rescue
 * area: each rank cudaMallocs, at join, one buffer of `bytes` on its own
 * device with these regions (each 256-byte aligned; all
 * words uint32; R = rows_max, and a call of `rows` rows uses the first
 * rows * ... words of each, packed with `rows`, not R, as the row count):
 *
 *   send   [R][rw_n]     this rank's local top-N lists, the wire words of
 *                        docs/PROTOCOL.md section 3 (no LL tags)
 *   recv   [W][R][rw_n]  ncclAllGather of every rank's send:
 *                        rank s's row t at (s * rows + t) * rw_n
 *   rsend  [R][rw_k]     this rank's local top-K list of each row in which
 *                        it is saturated (other rows: not written); round
 *                        2 over whole top-K lists gives the same result as
 *                        over rescue lists (docs/PROTOCOL.md 5.6)
 *   rrecv  [W][R][rw_k]  ncclAllGather of every rank's rsend
 *   mask   [R]           round 1's saturation mask of each row
 *   bits   [R][bw]       round 1's S1 membership, bit f = key s * N + j,
 *                        bw = ceil(W*N/32) rounded up to a multiple of 4

 * sat_word and stats stay in the workspace (its other regions are unused).
 */
typedef struct dcpx_nccl_layout {
  uint32_t bits_words; /* bw */
  uint64_t off_send, off_recv, off_rsend, off_rrecv, off_mask, off_bits,
      bytes;
} dcpx_nccl_layout;

static inline void dcpx_nccl_layout_compute(dcpx_nccl_layout *N,
                                            const dcpx_layout *L) {
  uint64_t o = 0;
  const uint64_t W = L->world, R = L->rows;
  N->bits_words = ((L->world * L->local_topk + 31u) / 32u + 3u) & ~3u;
  N->off_send = o;
  o = dcpx__align(o + 4ull * R * L->rw_n);
  N->off_recv = o;
  o = dcpx__align(o + 4ull * W * R * L->rw_n);
  N->off_rsend = o;
  o = dcpx__align(o + 4ull * R * L->rw_k);
  N->off_rrecv = o;
  o = dcpx__align(o + 4ull * W * R * L->rw_k);
  N->off_mask = o;
  o = dcpx__align(o + 4ull * R);
  N->off_bits = o;
  o = dcpx__align(o + 4ull * R * N->bits_words);
  N->bytes = o;
}

#endif /* DCPX_COMMON_LAYOUT_H */
