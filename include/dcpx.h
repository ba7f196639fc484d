/* dcpx.h - public interface of libdcpx.
 *
 * dcpx merges, for every query row of a decode-context-parallel group, the
 * ranks' local top-N indexer candidates into the exact global top-K
 * (docs/PROTOCOL.md is the contract; docs/ARCHITECTURE.md the tour).
 *
 * Who owns what:
 *   - The caller owns every buffer it passes in; libdcpx never keeps a
 *     pointer to one past the call that received it.
 *   - Every function that returns an int returns >= 0 on success (0, or
 *     the count or 1/0 its comment names), a negative error code (negative
 *     errno, or one of DCPX_E_* below) on failure. The others return no
 *     code: dcpx_disconnect is void, and the functions that return text or
 *     a number (dcpx_strerror, dcpx_struct_size, dcpx_row_words, ...) say
 *     in their comments what they return for a bad argument. Out-parameters
 *     are named ret_*, come last, and are left untouched on failure.
 *   - Everything takes pointers and integers only (no struct by value), so
 *     Python ctypes can call all of it.
 *
 * Logits are bf16 bit patterns (uint16_t). Local indices l are < 2^17.
 */
#ifndef DCPX_H
#define DCPX_H

#include <stddef.h>
#include <stdint.h>

#include <dcpx/version.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DCPX_API __attribute__((visibility("default")))
#else
#define DCPX_API
#endif

/* ---- limits (docs/PROTOCOL.md section 1) ------------------------------ */

#define DCPX_MAX_WORLD 16
#define DCPX_MAX_TOPK 4096
#define DCPX_MAX_LOCAL (1u << 17)
/* Upper bound on rows per call that any group may declare. The largest
 * shape's LL slots (W=16, N=4095, R=4096) take about 4.4 GB in each
 * rank's workspace (a group holds W of them: host memory with the host
 * backend, committed as the calls touch it), so offsets
 * are 64-bit everywhere. */
#define DCPX_MAX_ROWS 4096
/* Group names: 1..DCPX_GROUP_NAME_MAX bytes of [A-Za-z0-9._-], nothing
 * else (no NUL, no blank, no other byte); checked by libdcpx and dcpxd. */
#define DCPX_GROUP_NAME_MAX 63

/* ---- errors ------------------------------------------------------------ */

/* X(name, value, message). Values below -1000 are dcpx's own; the rest are
 * negative errno values, named here so callers need not include errno.h. */
#define DCPX_ERROR_TABLE(X)                                                   \
  X(DCPX_OK, 0, "success")                                                    \
  X(DCPX_E_PERM, -1, "operation not permitted")                               \
  X(DCPX_E_NOENT, -2, "no such group or file")                                \
  X(DCPX_E_INTR, -4, "interrupted")                                           \
  X(DCPX_E_IO, -5, "input/output error")                                      \
  X(DCPX_E_AGAIN, -11, "try again")                                           \
  X(DCPX_E_NOMEM, -12, "out of memory")                                       \
  X(DCPX_E_ACCES, -13, "permission denied")                                   \
  X(DCPX_E_BUSY, -16, "busy")                                                 \
  X(DCPX_E_EXIST, -17, "already exists")                                      \
  X(DCPX_E_INVAL, -22, "invalid argument")                                    \
  X(DCPX_E_RANGE, -34, "value out of range")                                  \
  X(DCPX_E_NOSYS, -38, "not supported by this build")                         \
  X(DCPX_E_PROTO, -71, "protocol error")                                      \
  X(DCPX_E_MSGSIZE, -90, "message too long")                                  \
  X(DCPX_E_CONNRESET, -104, "connection reset by peer")                       \
  X(DCPX_E_NOTCONN, -107, "not connected")                                    \
  X(DCPX_E_TIMEDOUT, -110, "timed out")                                       \
  X(DCPX_E_CONNREFUSED, -111, "connection refused")                           \
  X(DCPX_E_SHAPE, -1001, "group shape does not match the group's")           \
  X(DCPX_E_DUPRANK, -1002, "rank already joined")                             \
  X(DCPX_E_BADRANK, -1003, "rank out of range for the group")                 \
  X(DCPX_E_LIMIT, -1004, "shape exceeds dcpx limits")                         \
  X(DCPX_E_VERSION, -1005, "protocol version mismatch")                       \
  X(DCPX_E_ABORTED, -1006, "group aborted")                                   \
  X(DCPX_E_FAILED, -1007, "rank failed (a wait timed out or a call refused)") \
  X(DCPX_E_TRANSPORT, -1008, "transport not available")                       \
  X(DCPX_E_CUDA, -1009, "CUDA error")                                         \
  X(DCPX_E_NCCL, -1010, "NCCL error")                                         \
  X(DCPX_E_STATE, -1011, "operation not valid in the current state")          \
  X(DCPX_E_RECOVER, -1012, "group is recovering; call dcpx_recover")       \
  X(DCPX_E_FDS, -1013, "too many file descriptors in one message")           \
  X(DCPX_E_TEXT, -1014, "text field is not valid UTF-8 or holds a NUL")

enum dcpx_error {
#define DCPX__ENUM(name, value, msg) name = (value),
  DCPX_ERROR_TABLE(DCPX__ENUM)
#undef DCPX__ENUM
};

/* A static string for any code (never NULL; unknown codes get a generic
 * text, negative errno values their strerror text). */
DCPX_API const char *dcpx_strerror(int code);

/* The library's version string, e.g. "0.1.0" (compare DCPX_VERSION_STRING). */
DCPX_API const char *dcpx_version(void);

/* ---- struct sizes ------------------------------------------------------ */

/* The structs of this header, for dcpx_struct_size. */
#define DCPX_STRUCT_SHAPE 1u       /* dcpx_shape */
#define DCPX_STRUCT_JOIN_OPTS 2u   /* dcpx_join_opts */
#define DCPX_STRUCT_HEALTH_INFO 3u /* dcpx_health_info */
#define DCPX_STRUCT_REF_STATS 4u   /* dcpx_ref_stats */
#define DCPX_STRUCT_CALL 5u        /* dcpx_call */
#define DCPX_STRUCT_MERGE_OUT 6u   /* dcpx_merge_out */
#define DCPX_STRUCT_REF_IN 7u      /* dcpx_ref_in */
#define DCPX_STRUCT_ASYNC_ERROR 8u /* dcpx_async_error */
#define DCPX_STRUCT_LISTS 9u        /* dcpx_lists */
#define DCPX_STRUCT_DEVICE 10u      /* dcpx_device */

/* sizeof the struct `kind` (DCPX_STRUCT_*) as this library was compiled,
 * or 0 for an unknown kind: bindings that mirror the structs (Python
 * ctypes) check their layouts against it. */
DCPX_API size_t dcpx_struct_size(uint32_t kind);

/* ---- shape -------------------------------------------------------------- */

/* A group's shape (docs/PROTOCOL.md section 1). `size` is
 * sizeof(dcpx_shape) as the caller compiled it, so the struct can grow:
 * initialise with DCPX_SHAPE_INIT and then set the fields. */
typedef struct dcpx_shape {
  uint32_t size;
  uint32_t world;      /* W, 1..16 */
  uint32_t rows;       /* R, max rows per call, 1..DCPX_MAX_ROWS */
  uint32_t topk;       /* K, 2..4096 */
  uint32_t local_topk; /* N, 1 <= N < K */
  uint32_t block_size; /* B >= 1 */
  uint32_t interleave; /* I >= 1 (DCP KV interleave) */
  uint32_t max_local;  /* bound on row_end, 1..2^17 */
} dcpx_shape;

#define DCPX_SHAPE_INIT {sizeof(dcpx_shape), 1, 1, 2, 1, 1, 1, 1}

/* 0 if the shape is within the limits, else DCPX_E_LIMIT (a limit exceeded)
 * or DCPX_E_INVAL (NULL, wrong size, zero fields, N >= K). local_topk = 0
 * is the library's choice, as at dcpx_join: the shape is checked with
 * dcpx_shape_auto_local_topk's N (so are dcpx_shape_explain and
 * dcpx_shape_warning). */
DCPX_API int dcpx_shape_check(const dcpx_shape *shape);

/* dcpx_shape_check's code, with its reason written into buf[n] (n > 0) as
 * a NUL-terminated text naming the field and the rule ("local_topk 2048
 * must be less than topk 2048"); "" for a valid shape. */
DCPX_API int dcpx_shape_explain(const dcpx_shape *shape, char *buf,
                                size_t n);

/* The local_topk that a shape with local_topk = 0 gets: K/W plus three
 * standard deviations of one rank's share of a balanced row's top K,
 * rounded up to 32, below K (bench/RESULTS.md, "Choosing N"). 0 for W or K
 * out of range. Rows where one rank holds much more than its share still
 * rescue; with W * N <= K every full row does. */
DCPX_API uint32_t dcpx_shape_auto_local_topk(uint32_t world, uint32_t topk);

/* A warning about a valid shape, or NULL: with W >= 2 and W * N <= K every
 * full row saturates every rank and rescues, always. dcpxd logs it when
 * such a group forms and sends it in the join reply
 * (dcpx_member_warning). */
DCPX_API const char *dcpx_shape_warning(const dcpx_shape *shape);

/* ---- the order and the wire words (docs/PROTOCOL.md sections 2, 3) ---
 *
 * These functions state the wire format of docs/PROTOCOL.md in code, and
 * they are a stable part of API v1: the reference lists below
 * (dcpx_ref_local_list, dcpx_ref_rescue_list) are given in wire words, and
 * a second implementation checks its own lists against them word for
 * word. A change of the wire format is a new protocol version, and a new
 * symbol version (DCPX_2), never a silent change of these functions. */

/* 1 if the bf16 bits are a NaN (never a candidate). */
DCPX_API int dcpx_bf16_isnan(uint32_t bits);

/* Order key of a bf16: larger float, larger key; -0 just below +0; every
 * non-NaN value maps to >= 0x007F, so 0 can mean "empty". */
DCPX_API uint32_t dcpx_ord16(uint32_t bits);

/* Words of a candidate list of capacity c: c + ceil(c/32), rounded up to a
 * multiple of 4. 0 for c == 0 or c > DCPX_MAX_TOPK. */
DCPX_API uint32_t dcpx_row_words(uint32_t c);

/* Entry j of a capacity-c list: store (ord16, l) / read it back. encode
 * sets word j and bit j of the plane; the caller zeroes the list first.
 * decode returns 1 with ret_ord16/ret_l set for a full entry, 0 for an empty
 * one. Both return DCPX_E_INVAL for a NULL or misaligned (not 4-byte)
 * words, j >= c or c > 4096;
 * encode also for ord16 0 (the empty word) or above 0xFFFF, and for
 * l >= 2^17. */
DCPX_API int dcpx_word_encode(uint32_t *words, uint32_t c, uint32_t j,
                              uint32_t ord16, uint32_t l);
DCPX_API int dcpx_word_decode(const uint32_t *words, uint32_t c, uint32_t j,
                              uint32_t *ret_ord16, uint32_t *ret_l);

/* The 32-bit step: skips 0, wraps 0xFFFFFFFE -> 1. 0xFFFFFFFF (a
 * damaged word) gives 1 too, never 0 ("never used"). The rescue tag of a
 * row is dcpx_epoch_next(seq2[t]) (docs/PROTOCOL.md 5.4). */
DCPX_API uint32_t dcpx_epoch_next(uint32_t e);

/* Epoch words and tags (docs/PROTOCOL.md 4.3). A rank's epoch word of
 * row t has two halves: bits 16-31 count the calls the rank merged (mod
 * 2^16, every row alike), bits 0-15 the merges of row t (1..0xFFFE,
 * wrapping 0xFFFE -> 1; 0 before the first). The row's tag in the next
 * call is dcpx_epoch_tag(w): both halves one step on. The call half gives
 * a list of another call another tag even where the ranks disagree on a
 * call's rows, 0 rows included (not where a rank skips a call); the row
 * half keeps a slot's stale list (two uses of the
 * row back) from ever carrying the current tag. Never 0 and never
 * 0xFFFFFFFF; its parity (bit 0) alternates on every use of the row. A
 * row half of 0xFFFF (a damaged word) steps to 1, as 0 does. */
DCPX_API uint32_t dcpx_epoch_tag(uint32_t w);
/* The largest row half: row halves run 1..DCPX_EPOCH_ROW_MAX. */
#define DCPX_EPOCH_ROW_MAX 0xFFFEu
/* The epoch word w, after a call, of a row t >= rows that the call did
 * not hold: the call half of e, the tag of any row the call held (all of
 * a rank's epoch words have one call half), the row half of w. */
DCPX_API uint32_t dcpx_epoch_pass(uint32_t w, uint32_t e);

/* Global id (token position) of local index l on rank r, into *ret_gid.
 * Returns 0, DCPX_E_INVAL (world or interleave 0, r >= world, ret_gid
 * NULL) or DCPX_E_LIMIT (world > DCPX_MAX_WORLD); *ret_gid is then
 * untouched. */
DCPX_API int dcpx_gid(uint32_t l, uint32_t r, uint32_t world,
                      uint32_t interleave, int64_t *ret_gid);

/* ---- a call's arguments -------------------------------------------------
 *
 * dcpx_push, dcpx_merge and dcpx_ref_call take their arguments in structs.
 * Each starts with `size`, sizeof the struct as the caller compiled it:
 * initialise with the *_INIT macro, then set the fields. A struct whose
 * size this library does not know (too small, or from a newer dcpx.h) or
 * whose `reserved` field is not 0 is refused with DCPX_E_INVAL (and a
 * WARN line under DCPX_DEBUG). New fields are only ever appended. */

/* One call's inputs, on one rank (dcpx_push and dcpx_merge). */
typedef struct dcpx_call {
  uint32_t size;              /* sizeof(dcpx_call) */
  uint32_t rows;              /* rows of this call, <= the shape's rows;
                                 the same on every rank (on the ll
                                 transport ranks whose rows differ fail
                                 the call: PROTOCOL.md 4.3; a rank that
                                 skips a call can take a later call's
                                 lists with no error; on nccl see 6) */
  uint64_t stride;            /* elements between rows of logits */
  const uint16_t *logits;     /* [rows][stride] bf16 bits */
  const int32_t *row_ends;    /* [rows]: row t is logits[t][0..row_ends[t]),
                                 0..max_local and <= stride */
  const int32_t *req_id;      /* [rows]: block_table row of each row (merge) */
  const int32_t *block_table; /* [bt_rows][bt_cols] (merge) */
  uint32_t bt_rows, bt_cols;
  uint64_t call_tag;          /* the caller's name for the call (dcpx_push) */
} dcpx_call;

#define DCPX_CALL_INIT                                                        \
  {sizeof(dcpx_call), 0, 0, NULL, NULL, NULL, NULL, 0, 0, 0}

/* One call's outputs, on one rank (dcpx_merge and dcpx_ref_call). */
typedef struct dcpx_merge_out {
  uint32_t size;       /* sizeof(dcpx_merge_out) */
  uint32_t reserved;   /* 0 */
  int32_t *rows_out;   /* [rows][K]: KV rows of this rank's selected
                          elements, ascending l, -1 padded */
  int32_t *valid_out;  /* [rows]: their count (-1: the row failed) */
  int32_t *ids_out;    /* [rows][K] or NULL: gids of all K selected, (r, l)
                          order, -1 padded */
  uint32_t *sat_word;  /* [rows] or NULL: (mask << 16) | ord16 of S1's K-th
                          key */
} dcpx_merge_out;

#define DCPX_MERGE_OUT_INIT                                                   \
  {sizeof(dcpx_merge_out), 0, NULL, NULL, NULL, NULL}

/* Lists an engine computed itself (dcpx_push_list, and dcpx_ref_in.lists):
 * row t's entries are values[t * n + j] (bf16 bits) and indices[t * n + j]
 * (local index l) for j < n. Full entries come first, in ascending l,
 * each l once, each below the row's row_end, no value NaN; a negative
 * index marks an empty entry, and only empty entries may follow one (a
 * row with fewer than n candidates). The list must be the rank's local
 * top-n of its logits (docs/PROTOCOL.md section 2, ties to the lower l)
 * for the call's result to be the exact top-K of the logits; any other
 * valid list gives the result "exact for the lists given" (section 5.8:
 * dcpx_ref_call with these lists). */
typedef struct dcpx_lists {
  uint32_t size;          /* sizeof(dcpx_lists) */
  uint32_t rows;          /* rows of values and indices: the call's rows */
  uint32_t n;             /* entries per row: the shape's local_topk N */
  uint32_t flags;         /* DCPX_LISTS_* */
  const uint16_t *values; /* [rows][n] bf16 bits */
  const int32_t *indices; /* [rows][n] local indices, negative: empty */
} dcpx_lists;

/* Accepted, and without effect since 0.x session 34: dcpx_push_list
 * always checks every rule of dcpx_lists, strictly ascending l (so each l
 * once) included, as dcpx_ref_call does. Unchecked, a repeated index gave
 * the same KV row twice in rows_out, as a success. */
#define DCPX_LISTS_CHECK_ORDER 1u

#define DCPX_LISTS_INIT {sizeof(dcpx_lists), 0, 0, 0, NULL, NULL}

/* ---- the CPU reference (docs/PROTOCOL.md sections 2, 3 and 5) -------- */

/* A rank's local top-`cap` list of one row, in wire words: its `cap` best
 * non-NaN elements of logits[0..len) in ascending l, then zeros, with the
 * bit-16 plane. ret_words holds dcpx_row_words(cap) words. Returns the
 * number of entries (<= cap). 1 <= cap <= 4096, logits (unless len is
 * 0) and ret_words non-NULL and aligned to their element (else
 * DCPX_E_INVAL); len <= DCPX_MAX_LOCAL (else DCPX_E_LIMIT). */
DCPX_API int dcpx_ref_local_list(const uint16_t *logits, uint32_t len,
                                 uint32_t cap, uint32_t *ret_words);

/* A saturated rank's rescue list of one row (what it sends for round 2):
 * the entries of its local top-`cap` list whose ord16 >= t1, in ascending
 * l, packed at the front, then zeros, with the bit-16 plane (the same
 * dcpx_row_words(cap) words as dcpx_ref_local_list). t1 is the row's
 * sat_word & 0xFFFF (0: every entry). No element below t1 can be in the
 * exact top-K, so round 2 gives the same result with these lists as with
 * the whole top-K lists. Returns the number of entries; the errors of
 * dcpx_ref_local_list, and DCPX_E_INVAL for t1 > 0xFFFF. */
DCPX_API int dcpx_ref_rescue_list(const uint16_t *logits, uint32_t len,
                                  uint32_t cap, uint32_t t1,
                                  uint32_t *ret_words);

/* Statistics of a reference call. */
typedef struct dcpx_ref_stats {
  uint64_t rows;        /* rows merged */
  uint64_t rescue_rows; /* rows in which at least one rank was saturated */
  uint64_t saturated;   /* sum over rows of saturated ranks */
} dcpx_ref_stats;

/* The inputs of a reference call: every rank's logits and row ends, and
 * rank `rank`'s block table. */
typedef struct dcpx_ref_in {
  uint32_t size;                  /* sizeof(dcpx_ref_in) */
  uint32_t rows;                  /* <= shape->rows */
  uint32_t rank;                  /* whose outputs, < W */
  uint32_t reserved;              /* 0 */
  uint64_t stride;                /* of every rank's logits */
  const uint16_t *const *logits;  /* [W]: rank r's [rows][stride] bf16 */
  const int32_t *const *row_ends; /* [W]: rank r's [rows] row ends */
  const int32_t *req_id;          /* [rows] (rank `rank`'s) */
  const int32_t *block_table;     /* [bt_rows][bt_cols] (rank `rank`'s) */
  uint32_t bt_rows, bt_cols;
  /* [W] or NULL: rank r's round-1 list of every row is lists[r]'s (as
   * dcpx_push_list pushes it) instead of its local top-N of logits[r];
   * NULL, or lists[r] NULL, computes it from the logits. A saturated
   * rank's rescue list always comes from its logits (section 5.8). */
  const dcpx_lists *const *lists;
} dcpx_ref_in;

#define DCPX_REF_IN_INIT                                                      \
  {sizeof(dcpx_ref_in), 0, 0, 0, 0, NULL, NULL, NULL, NULL, 0, 0, NULL}

/* One whole call as every backend must compute it, giving rank in->rank's
 * outputs (dcpx_merge_out; rows_out and valid_out required). ret_stats,
 * or NULL, is added to, not overwritten.
 *
 * Returns 0, or DCPX_E_INVAL (a NULL or a struct of unknown size, the
 * arrays included when rows is 0: unlike dcpx_push and dcpx_merge, whose
 * empty call may pass NULL pointers, the reference wants them all; a
 * block table whose 4 bt_rows bt_cols bytes run past the end of the
 * address space; a dcpx_lists whose rows or n is not the call's, an array not aligned to
 * its element, a stride whose rows of
 * logits would run past the end of the address space, outputs that share
 * a byte with one another or with anything the call reads: every rank's
 * logits rows and row_ends, req_id, the block table, given lists, the
 * structs and pointer arrays themselves; as dcpx_merge refuses them, with
 * a WARN line naming both arrays) / DCPX_E_LIMIT /
 * DCPX_E_RANGE (a row_end over max_local, a req_id or block outside the
 * table, a given list that breaks a rule of dcpx_lists), DCPX_E_NOMEM.
 * Unlike a backend, which gives only such a row valid_out -1 and
 * computes the others (docs/PROTOCOL.md 5.7), the reference refuses the
 * whole call on a req_id or block outside the table: its outputs are then
 * not defined. */
DCPX_API int dcpx_ref_call(const dcpx_shape *shape, const dcpx_ref_in *in,
                           const dcpx_merge_out *out,
                           dcpx_ref_stats *ret_stats);

/* ---- the client: connect, join, push, merge, health, recover ------------
 *
 * A dcpx_client names the node's dcpxd (dcpx_connect checks that it
 * answers, then keeps only its socket path and the reason of the last
 * refused join; each dcpx_join opens its own connection, which its member
 * keeps); a dcpx_member is one rank's membership of one group (a process
 * may hold several). Both are
 * opaque, and not safe to share between threads without a lock: give each
 * engine thread its own member. The calls that use a member's call state
 * (dcpx_push, dcpx_push_list, dcpx_merge, dcpx_recover, dcpx_device_ctx)
 * run one at a time: one made while another thread is inside one of them
 * on the same member is refused with DCPX_E_BUSY and does nothing else
 * (the running call goes on, the rank does not fail, no valid_out is
 * written, and dcpx_member_last_error stays the running call's; the
 * reason, naming both calls, is a WARN line: DCPX_DEBUG). One atomic
 * compare-and-swap at a call's start and one store at its end. Calls of
 * one member made in turn from several threads, each after the other
 * returned, are fine. dcpx_poll and dcpx_health may run beside them
 * (dcpx_poll); dcpx_leave must not overlap any call of the member.
 * fork(): a member belongs to the process
 * that joined it. In a child of fork() every call on an inherited member
 * (push, merge, poll, health, recover, device context) is refused with
 * DCPX_E_STATE and does nothing, and dcpx_leave only releases the child's
 * copy (the parent's rank stays joined); a child that takes part in a
 * group connects and joins itself.
 *
 * Lifetime: dcpx_connect -> dcpx_join (blocks until all W ranks joined with
 * an identical shape, or the join times out) -> any number of
 * dcpx_push/dcpx_merge pairs, with dcpx_poll (or dcpx_health) once in a
 * while off the hot path, e.g. once per step -> dcpx_leave ->
 * dcpx_disconnect. A failed call (DCPX_E_FAILED, DCPX_E_ABORTED) is
 * followed by dcpx_recover before the next call. A call may complete on
 * one rank and fail on another: after the recovery every rank must
 * resume at the same call (the engine agrees on a failed step across
 * ranks and all redo it; docs/PROTOCOL.md 6.4).
 *
 * The call path (dcpx_push, dcpx_merge) never allocates and never enters
 * the kernel except in a wait that has spun without success (it then
 * yields the CPU). With the CUDA backend both only enqueue kernels on
 * `stream` (a cudaStream_t of the member's device, or 0 / the per-thread
 * default stream, which are then the member's device's) and are
 * capturable into CUDA graphs; every CUDA call of the library makes the
 * member's device's context current for its duration and gives the
 * caller's back as it was (none included), so the calling thread may sit
 * on any GPU. All pointers of a call are memory of the member's device
 * (the kernels read and write them as such; managed memory and page-locked
 * host memory CUDA knows also do), aligned to their element, and hold
 * what the call's rows and sizes say, else DCPX_E_INVAL before anything
 * is enqueued, the reason in the log: the library asks the driver
 * (cuPointerGetAttributes) about each array's first and last byte the
 * first time it sees the allocation, and takes later calls on the same
 * buffers from a cache of 16 allocations, without a driver call (memory
 * the driver does not report a range for, such as pageable memory on a
 * GPU that reads it itself, is asked about again on every call; host
 * memory from malloc, another GPU's memory and an array that runs into
 * unmapped space are refused, memory CUDA does not know not on a GPU that
 * reads pageable memory itself (HMM, Grace Hopper); one that runs into
 * another allocation of the same GPU is not seen; DCPX_PTR_CHECK=0 in
 * the environment at join turns the driver's check off, not the refusal
 * of an array that runs past the end of the address space). An empty call (rows 0) may pass NULL pointers.
 * With the host backend they run on the calling thread and `stream` is
 * ignored.
 */

typedef struct dcpx_client dcpx_client;
typedef struct dcpx_member dcpx_member;

#define DCPX_BACKEND_HOST 0u
#define DCPX_BACKEND_CUDA 1u
/* The exchange: auto (ll when the ranks' GPUs have P2P access or share a
 * GPU, else nccl; docs/PROTOCOL.md 7), ll, or nccl. With auto or nccl, rank
 * 0's join (CUDA backend, a libdcpx built with NCCL) makes an NCCL unique
 * id for the group, and NCCL starts a bootstrap thread and a listening
 * socket for it that stay until W ranks check in: when auto then picks
 * ll, nobody does, and they stay for the life of the process (one per
 * join of rank 0). An engine that joins many times, or knows its GPUs,
 * passes ll (or nccl). */
#define DCPX_TRANSPORT_AUTO 0u
#define DCPX_TRANSPORT_LL 1u
#define DCPX_TRANSPORT_NCCL 2u

/* Default socket, used when dcpx_connect gets NULL and $DCPX_SOCKET is
 * unset. */
#define DCPX_DEFAULT_SOCKET "/run/dcpx/dcpxd.sock"

typedef struct dcpx_join_opts {
  uint32_t size;            /* sizeof(dcpx_join_opts) */
  uint32_t rank;            /* this member's rank, < W */
  const char *group;        /* group name (DCPX_GROUP_NAME_MAX) */
  int32_t device;           /* CUDA device (>= 0) with the CUDA backend,
                               this process's ordinal (the join also sends
                               the GPU's UUID: dcpxd's and the peers'
                               CUDA_VISIBLE_DEVICES may differ); the host
                               backend uses none and only reports it
                               (dcpxctl health), -1: none */
  uint32_t backend;         /* DCPX_BACKEND_* */
  uint32_t transport;       /* DCPX_TRANSPORT_* */
  uint32_t join_timeout_ms; /* 0: the daemon's default; at most
                               DCPX_MAX_JOIN_TIMEOUT_MS */
  uint64_t timeout_ns;      /* bounded-wait limit of every wait,
                               DCPX_MIN_TIMEOUT_NS .. DCPX_MAX_TIMEOUT_NS */
} dcpx_join_opts;

/* The shortest and the longest wait timeout a group may have (1 ms, 1
 * hour): libdcpx and dcpxd refuse others with DCPX_E_INVAL. A shorter one
 * fails healthy calls whose peers are merely scheduled late; a longer one
 * is no bound (a rank stopped but alive, which dcpxd cannot see die,
 * would hold its peers that long; 2^64 - 1 ns never ended). */
#define DCPX_MIN_TIMEOUT_NS 1000000ull
#define DCPX_MAX_TIMEOUT_NS 3600000000000ull
/* The longest join timeout (24 hours): libdcpx and dcpxd refuse a longer
 * one with DCPX_E_INVAL, as dcpxd.conf's join-timeout-ms. */
#define DCPX_MAX_JOIN_TIMEOUT_MS 86400000u

#define DCPX_JOIN_OPTS_INIT                                                   \
  {sizeof(dcpx_join_opts), 0, NULL, -1, DCPX_BACKEND_HOST,                    \
   DCPX_TRANSPORT_AUTO, 0, 1000000000ull}

/* Connects to dcpxd at socket_path (NULL or "": $DCPX_SOCKET, else
 * DCPX_DEFAULT_SOCKET) and checks the protocol version. Errors:
 * DCPX_E_INVAL (NULL ret_client), DCPX_E_RANGE (a path of 108 bytes or
 * more: a Unix socket's limit), DCPX_E_CONNREFUSED (no dcpxd there),
 * DCPX_E_VERSION, DCPX_E_TIMEDOUT (no answer in 5 s), the daemon's
 * refusal (e.g. DCPX_E_BUSY: too many connections), or another negative
 * errno of the connect (e.g. -ENOTDIR, or -EPROTOTYPE for a path that is
 * a socket of another kind: not dcpxd's). A relative path is kept as the
 * absolute path of the working directory at this call (when that fits a
 * socket's 107 bytes), so a later chdir does not move the joins and
 * dcpx_poll's reattaches to another path. */
DCPX_API int dcpx_connect(const char *socket_path, dcpx_client **ret_client);
DCPX_API void dcpx_disconnect(dcpx_client *client);

/* Joins group opts->group as opts->rank with the given shape; blocks until
 * the group has formed (and, with the nccl transport, until every rank
 * has joined the NCCL communicator: bounded by the join timeout too, and
 * ended early by a group abort, so a rank that died after the group formed
 * gives DCPX_E_TIMEDOUT or DCPX_E_ABORTED, never a hang;
 * dcpx_client_last_error says which). shape->local_topk = 0 asks the
 * library to choose N: dcpx_shape_auto_local_topk(world, topk), the same
 * on every rank (a rank may also pass that value itself). Errors:
 * DCPX_E_INVAL (a NULL, a shape or opts `size` this library does not
 * know, a bad name, timeout or backend, the CUDA backend with device < 0),
 * DCPX_E_SHAPE, DCPX_E_DUPRANK, DCPX_E_BADRANK, DCPX_E_LIMIT,
 * DCPX_E_TIMEDOUT, DCPX_E_VERSION, DCPX_E_NOSYS (the CUDA backend in a
 * build without it), DCPX_E_ABORTED, DCPX_E_TRANSPORT, DCPX_E_CUDA,
 * DCPX_E_NCCL, DCPX_E_INTR (dcpx_client_interrupt), dcpxd's refusals of
 * docs/PROTOCOL.md 7.1-7.3 (DCPX_E_ACCES: a group another uid owns;
 * DCPX_E_BUSY: too many groups or connections of this uid; DCPX_E_NOMEM:
 * the workspace cannot be allocated, or over dcpxd's byte cap),
 * connection errors, -EMFILE (this process has no room under its
 * open-file limit for the descriptors of dcpxd's reply). A join of join_timeout_ms 0 waits as long as dcpxd's
 * own join timeout (it says it in its Hello reply), plus 10 s should dcpxd
 * hang. After a dcpxd restart, a join into a group whose live ranks have
 * not reattached yet (a replacement started at once) is refused by dcpxd
 * for now (DCPX_E_AGAIN); dcpx_join sends it again every 100 ms, for up to
 * the join timeout (then DCPX_E_TIMEDOUT, with dcpxd's reason), and joins
 * as the dead rank's replacement once the others are back. */
DCPX_API int dcpx_join(dcpx_client *client, const dcpx_shape *shape,
                       const dcpx_join_opts *opts, dcpx_member **ret_member);

/* Why the last dcpx_join on this client was refused: libdcpx's own reason
 * for an argument it refused itself (e.g. "local_topk 2048 must be less
 * than topk 2048"), else dcpxd's text (Reply.error, e.g. "shape mismatch:
 * topk 2048 differs from group 'g': topk 1024"), or a connection
 * error's, or libdcpx's reason for a join that failed after the group
 * formed (e.g. an NCCL communicator setup that timed out); NULL when the
 * last join succeeded, or nobody gave a reason (dcpx_strerror of the
 * returned code still names the error then). A text longer than 511
 * bytes is cut at a whole UTF-8 character and ends with "...".
 * Valid until the next dcpx_join on the client or dcpx_disconnect. Like
 * the client, not safe to share between threads. */
DCPX_API const char *dcpx_client_last_error(const dcpx_client *client);

/* Stopping a wait, e.g. on Ctrl-C. dcpx_join waits up to its join timeout
 * for the other ranks, dcpx_recover up to timeout_ms for the group's
 * reset. While dcpx_client_interrupt(client, 1) is in effect, a dcpx_join
 * on that client returns DCPX_E_INTR without joining: one already waiting
 * within about 50 ms (it closes its connection, so dcpxd forgets the
 * rank and the same rank may join again; should the group form at that
 * very moment, the rank leaves it again and its peers see it leave), one
 * that starts, at once.
 * dcpx_client_interrupt(client, 0) ends it; the flag stays until then,
 * so that an interrupt that comes just before a join starts is not
 * lost. dcpx_member_interrupt does the same for dcpx_recover on that
 * member (the ack it may have sent stands: call dcpx_recover again to
 * go on, as after DCPX_E_TIMEDOUT). Not stopped: the Hello (at most 5 s)
 * and, with the CUDA backend, the backend's setup once the group formed
 * (bounded by the join timeout; with the nccl transport also the new
 * communicator at the end of a recovery). Each is one atomic store: safe
 * from any thread, while dcpx_join or dcpx_recover runs on another, and
 * from a signal handler. Returns 0, or DCPX_E_INVAL for NULL. */
DCPX_API int dcpx_client_interrupt(dcpx_client *client, int on);
DCPX_API int dcpx_member_interrupt(dcpx_member *member, int on);

/* The warning dcpxd sent with the join reply (dcpx_shape_warning's, and
 * for a host-backend group whose workspaces exceed the machine's memory
 * and swap, that), or NULL. Valid until dcpx_leave. */
DCPX_API const char *dcpx_member_warning(const dcpx_member *member);

/* Leaves the group and frees the member (NULL is fine). With the CUDA
 * backend it first waits for the device; with the nccl transport it ends
 * the NCCL communicator before that, bounded: ncclCommFinalize within the
 * join timeout, else (or at once, when the group is aborted)
 * ncclCommAbort, so a collective whose peer died cannot hang it.
 * Returns 0, or the error of sending the Leave (a dcpxd that is gone is
 * 0); the member is freed either way, and dcpxd sees its connection
 * close: never call dcpx_leave twice on one member. */
DCPX_API int dcpx_leave(dcpx_member *member);

/* Push: this rank's local top-N of each of in->rows rows of in->logits
 * to every rank (in->logits, stride, row_ends and call_tag are read;
 * req_id and the block table are not). in->call_tag is the caller's name
 * for the call (e.g. step * layers + layer); the library keeps it in the
 * rank's health block (last_call_tag: the host backend at the merge, the
 * CUDA backend at the push; under a CUDA graph it is the tag of capture
 * time). Wait records and fault injections name a call by its sequence
 * number instead: 1 for the first push since the join or the last
 * recovery, +1 for each push (kept in device memory, so that CUDA graphs
 * replay it). */
DCPX_API int dcpx_push(dcpx_member *m, const dcpx_call *in, void *stream);

/* Merge: the exact top-K of every row, this rank's outputs (the fields mean
 * what they mean for dcpx_ref_call; in->logits/row_ends are this rank's
 * and must be those given to the matching dcpx_push). Returns 0, or:
 *   DCPX_E_FAILED   a wait timed out on this rank (or it was FAILED);
 *   DCPX_E_ABORTED  the group was aborted;
 *   DCPX_E_INVAL / DCPX_E_RANGE before any work: bad arguments (a struct
 *                   of unknown size, NULL outputs, rows > R, an array
 *                   not aligned to its element (bf16 2 bytes, int32 4:
 *                   both backends), a stride
 *                   whose rows of logits would run past the end of the
 *                   address space (DCPX_E_INVAL); with the host
 *                   backend also a row_end outside 0..max_local, which
 *                   the CUDA kernels, reading row_ends on the device,
 *                   clamp instead: docs/PROTOCOL.md 1); the rank then marks itself
 *                   FAILED, since skipping its part would leave it a call
 *                   behind its peers;
 *   DCPX_E_RANGE after the protocol completed (host backend): some row's
 *                   own element fell outside block_table; that row has
 *                   valid_out -1, the others are exact, nobody failed;
 *   DCPX_E_BUSY     another thread is inside a call of this member
 *                   (dcpx_push, dcpx_push_list, dcpx_merge, dcpx_recover,
 *                   dcpx_device_ctx): nothing is done, nobody fails, the
 *                   running call goes on (the client section above);
 *   DCPX_E_STATE    out of order, on a rank that has not failed: a merge
 *                   with no dcpx_push / dcpx_push_list before it, a merge
 *                   of other `rows` than that push's, or a push while the
 *                   previous push waits for its merge (a recovery after
 *                   a failure ends a pending push; dcpx_recover on a
 *                   healthy member leaves it). Nothing is done, nobody
 *                   fails and no recovery is needed: merge the pending
 *                   push with its rows, or push first (a second push
 *                   would overwrite lists the peers may be reading; a
 *                   merge without one, or of more rows, would wait out
 *                   the timeout; a merge of fewer rows would leave the
 *                   other rows' epochs behind, and the next call's push
 *                   of them would overwrite slots a peer may still read:
 *                   that peer's wait gives up, at once or at the
 *                   timeout). The order is checked before
 *                   the call's arguments: a merge of more rows than R
 *                   after a push is DCPX_E_STATE, not a refusal. Not
 *                   checked once the library cannot see every call: after
 *                   dcpx_device_ctx (its kernels push), or once a call
 *                   went into a CUDA graph capture (replays are not
 *                   library calls).
 * After FAILED, ABORTED or a call refused for its arguments (not
 * DCPX_E_STATE), valid_out[t] = -1 for every row
 * t < min(rows, R) (not when the call was refused for one of its structs,
 * of unknown size or with a reserved word that is not 0, whose pointers
 * are not trusted then, for a NULL or misaligned valid_out, or when its
 * outputs overlap
 * one another, an input, or the dcpx_call or dcpx_merge_out struct itself
 * (DCPX_E_INVAL naming both: each output needs memory of its own, and -1s
 * could land on the other array); with the
 * CUDA backend a refused merge sets
 * them with a memset on the stream, cuMemsetD32Async), and the member must
 * dcpx_recover before the next call. With the CUDA
 * backend waits end inside the kernel: the call returns 0 (or a launch
 * error), and a failed row shows as valid_out[t] = -1, in
 * dcpx_member_async_error and in dcpx_health. With the nccl transport a
 * collective that NCCL cannot enqueue at once (it sets connections up on
 * first use) is waited for on the host, bounded by the larger of
 * timeout_ns and the join timeout and ended by a group abort:
 * DCPX_E_TIMEDOUT or DCPX_E_ABORTED. Any call of an nccl member that
 * fails or is refused (a merge while the group is aborted returns
 * DCPX_E_ABORTED there) aborts its communicator, since the ranks'
 * collectives can no longer be matched and an NCCL kernel waits without a
 * bound: every later call fails (DCPX_E_NCCL, and the rank fails, as
 * after any refused call: DCPX_E_FAILED) until dcpx_recover, which makes
 * a new communicator (docs/PROTOCOL.md 6.9). A thread of the member's
 * aborts the communicator as soon as the group aborts or the rank fails
 * (a peer that died: no call needed, so a stream sync or a graph replay
 * already on the stream ends too); the merges already on the stream whose
 * all-gathers that ended then give valid_out[t] = -1 on their rows, never
 * the last call's rows. A graph launched after that abort is not safe:
 * its captured all-gathers name the aborted communicator, whose memory
 * NCCL has freed, and no library call is there to refuse them. With nccl,
 * check dcpx_member_async_error before each replay of a graph holding
 * dcpx calls (host loads only) and launch it only while state is DCPX_OK;
 * else dcpx_recover and capture again (docs/PROTOCOL.md 6.4). With ll such
 * a replay is safe: its merge fails its rows. The same thread bounds the collectives: one of this rank's
 * all-gathers still pending after timeout_ns (a peer stopped or hung
 * without dying, or a peer that skipped a call) fails the rank with an
 * nccl_timeout record, as an LL wait that gives up (docs/PROTOCOL.md 7).
 * The same argument rules hold for dcpx_push. */
DCPX_API int dcpx_merge(dcpx_member *m, const dcpx_call *in,
                        const dcpx_merge_out *out, void *stream);

/* Push lists the engine already has (e.g. torch.topk's, its indices
 * sorted ascending) instead of selecting them from the logits: in place
 * of dcpx_push, followed by dcpx_merge as usual. in->rows, row_ends and
 * call_tag are read (row_ends checked as dcpx_push checks them, but for
 * the stride); the logits are not, but the matching dcpx_merge still
 * needs them: a saturated rank's rescue list comes from them;
 * lists (dcpx_lists) holds in->rows rows of n = N entries. Checked before
 * anything is stored: lists->rows == in->rows and n == N, values and
 * indices aligned to their element, no flag bit but
 * DCPX_LISTS_CHECK_ORDER, else DCPX_E_INVAL; every index below its row's
 * row_end and above the one before it (strictly ascending l), no NaN
 * value, empty entries last, else DCPX_E_RANGE. A refused call marks the rank FAILED, as dcpx_push does.
 * CUDA backend: lists are device memory and are checked by the kernel; a
 * bad row is stored nowhere and marks the rank FAILED (alarm, then
 * FAILED: dcpxd aborts the group; dcpx_recover), so the call fails and
 * never gives a wrong answer. DCPX_E_NOSYS with the NCCL transport:
 * nothing is done and the rank does not fail (push with dcpx_push).
 * CUDA graphs: from a member's first dcpx_push_list (or dcpx_device_ctx)
 * on, its merges take a saturated rank's rescue list from the logits, not
 * from what dcpx_push kept; a graph holding a dcpx_merge without its push,
 * captured before that, must be captured again (its merge would read a
 * list kept by an earlier dcpx_push). */
DCPX_API int dcpx_push_list(dcpx_member *m, const dcpx_call *in,
                            const dcpx_lists *lists, void *stream);

/* What an engine's own CUDA kernel needs to push from its epilogue
 * (include/dcpx/device.cuh; docs/PROTOCOL.md section 4.7): device
 * addresses and constants of this member, valid until dcpx_leave (a
 * recovery keeps them). Everything is a device address of the member's
 * GPU, except alarm and failed (the control page, mapped for the
 * device). */
typedef struct dcpx_device {
  uint32_t size;       /* sizeof(dcpx_device), set by the caller */
  uint32_t world;      /* W */
  uint32_t rank;       /* this member's rank */
  uint32_t rows;       /* the shape's R: ll_slots are [2][W][R][pairs] */
  uint32_t local_topk; /* N: entries of a list */
  uint32_t row_words;  /* dcpx_row_words(N) (pairs = row_words / 2) */
  uint32_t max_local;  /* the shape's max_local */
  uint32_t pdl;        /* 1: the library launches dcpx_merge with
                          programmatic dependent launch (device.cuh says
                          what the engine kernel must then do) */
  uint64_t off_ll;     /* byte offset of ll_slots in every workspace */
  char *const *peers;  /* [W]: every rank's workspace (a device array) */
  const uint32_t *epoch; /* [R]: this rank's epoch words (read only) */
  uint64_t *call_seq;  /* this rank's call sequence (6.5) */
  uint32_t *stop;      /* this rank's stop word (6.7) */
  uint32_t *alarm, *failed; /* this rank's health words (6.3) */
} dcpx_device;

#define DCPX_DEVICE_INIT                                                      \
  {sizeof(dcpx_device), 0, 0, 0, 0, 0, 0, 0, 0, NULL, NULL, NULL, NULL,       \
   NULL, NULL}

/* Fills *ret_ctx for an engine kernel that pushes through
 * include/dcpx/device.cuh, and switches the member's merges to take a
 * saturated rank's rescue list from the logits rather than from the
 * push's saved top-K list (the engine's kernel saves none). CUDA backend
 * with the LL transport only: DCPX_E_NOSYS otherwise; DCPX_E_INVAL for a
 * NULL or a size this library does not know; DCPX_E_BUSY while another
 * thread is inside a call of the member (nothing done). */
DCPX_API int dcpx_device_ctx(dcpx_member *m, dcpx_device *ret_ctx);

typedef struct dcpx_health_info {
  uint32_t size;       /* sizeof(dcpx_health_info), set by the caller */
  uint32_t generation; /* bumped by every recovery */
  uint32_t abort;      /* 0, or why the group was aborted (1 alarm, 2 dead
                          rank, 3 operator) */
  uint32_t failed_mask; /* ranks whose FAILED word is set */
  uint32_t alarm_mask;  /* ranks whose alarm word is set */
  uint32_t joined_mask; /* ranks held by a live process */
  uint32_t world, rank;
  uint32_t backend, transport;
  uint64_t calls, rows, rescue_rows, failed_calls; /* this rank's */
  /* Appended fields: a caller whose `size` ends before them gets the
   * fields above only. */
  uint32_t daemon_link; /* 1: attached to dcpxd; 0: not (it is restarting,
                           and dcpx_poll reattaches) */
  uint32_t reattaches;  /* times this member reattached to a new dcpxd */
} dcpx_health_info;

#define DCPX_HEALTH_INFO_INIT                                                 \
  {sizeof(dcpx_health_info), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/* This member's view of its group, read from the control page; calls
 * dcpx_poll first. */
DCPX_API int dcpx_health(dcpx_member *m, dcpx_health_info *ret);

/* ---- errors the caller can see (as ncclCommGetAsyncError) -------------- */

/* Why (dcpx_async_error.reason), most specific first. */
#define DCPX_REASON_NONE 0u        /* nothing failed */
#define DCPX_REASON_REFUSED 1u     /* this rank refused a call (bad
                                      arguments, a launch that failed)
                                      and marked itself FAILED */
#define DCPX_REASON_TIMEOUT 2u     /* a wait of this rank timed out */
#define DCPX_REASON_PEER_FAILED 3u /* another rank failed (its alarm
                                      aborted the group); it may have
                                      left or died since (dcpxd names the
                                      alarm, not the leaving, since
                                      session 31): dcpx_health's joined
                                      words tell, and a recovery then
                                      waits for a replacement */
#define DCPX_REASON_DEAD_RANK 4u   /* a rank's process died or left */
#define DCPX_REASON_OPERATOR 5u    /* an operator reset the group
                                      (dcpxctl reset; a dcpxd that shuts
                                      down or restarts aborts nothing: the
                                      ranks reattach) */
#define DCPX_REASON_BLOCK_TABLE 6u /* the last call completed, but rows
                                      whose elements fell outside the
                                      block table have valid_out -1 (host
                                      backend; nobody failed) */

/* The member's sticky state, and which rows of its last call failed. */
typedef struct dcpx_async_error {
  uint32_t size;        /* sizeof(dcpx_async_error) */
  int32_t state;        /* DCPX_OK; DCPX_E_FAILED: this rank is FAILED;
                           DCPX_E_ABORTED: the group is aborted (both
                           sticky until dcpx_recover) */
  uint32_t reason;      /* DCPX_REASON_* */
  uint32_t abort;       /* the group's abort word: 0, 1 alarm, 2 dead
                           rank, 3 operator */
  uint32_t failed_mask; /* ranks whose FAILED word is set */
  uint32_t generation;  /* the group's generation (bumped by recovery) */
  uint32_t rows;        /* rows of this member's last call (the last
                           dcpx_push or dcpx_merge); 0, and no row in
                           row_mask, for a call refused for one of its
                           structs (its rows are not known) */
  uint32_t failed_rows; /* rows set in row_mask */
  uint32_t rows_exact;  /* 1: row_mask is exactly the rows of the last
                           call with valid_out -1 (host backend); 0: the
                           rows whose own wait timed out only, from the
                           wait records (CUDA backend: known without a
                           device sync; the call's other rows may have
                           stopped too, and a bad block table shows only
                           in valid_out) */
  uint32_t reserved;    /* 0 */
  uint64_t row_mask[DCPX_MAX_ROWS / 64]; /* bit t % 64 of word t / 64:
                                            row t of the last call failed
                                            (a failed push fails all its
                                            rows) */
} dcpx_async_error;

#define DCPX_ASYNC_ERROR_INIT                                                 \
  {sizeof(dcpx_async_error), 0, 0, 0, 0, 0, 0, 0, 0, 0, {0}}

/* Why this member refused its last call (dcpx_push, dcpx_push_list,
 * dcpx_merge), as one line naming the function, the argument and the rule
 * (e.g. "dcpx_push: group g rank 0: row_ends[2] = 65 is outside 0..64
 * (max_local 64, stride 64)"), with no DCPX_DEBUG needed; also a call
 * refused for its order (DCPX_E_STATE) and, with the host backend, a
 * merge whose rows fell outside the block table (DCPX_E_RANGE, the call
 * completed; the CUDA backend finds those on the device: valid_out -1
 * and no reason here). "" when the
 * last call was not refused for its arguments or order (a wait that timed
 * out, an aborted group: dcpx_member_async_error), NULL for m NULL.
 * Cleared as each call starts and by a dcpx_recover that succeeds (the
 * refusal it recovered from is over); valid until the member's next call
 * or dcpx_leave. Read it on the thread that makes the calls. A reason
 * longer than 383 bytes is cut at a whole UTF-8 character and ends with
 * "..." (the library's reasons fit). */
DCPX_API const char *dcpx_member_last_error(const dcpx_member *m);

/* This member's sticky state and why, into *ret (ret->size set, e.g. by
 * DCPX_ASYNC_ERROR_INIT). It reads the mapped control page and what the
 * library noted at its calls: no system call, no device sync, no
 * allocation; the CUDA backend's failures show as soon as the kernels
 * wrote them, before the stream is synchronized. Call it between calls,
 * on the thread that makes them (e.g. after a merge returned an error, or
 * when valid_out shows -1). Returns 0, or DCPX_E_INVAL (NULL, a size this
 * library does not know, a `reserved` word that is not 0: it may carry a
 * meaning in a later version, so set the struct from
 * DCPX_ASYNC_ERROR_INIT). */
DCPX_API int dcpx_member_async_error(const dcpx_member *m,
                                     dcpx_async_error *ret);

/* Keeps the member's link to dcpxd alive; call it periodically off the hot
 * path, e.g. once per engine step (dcpx_health and dcpx_recover call it
 * too). Never blocks: it drains the daemon's pending events and, when the
 * daemon went away (restart, crash), reconnects to the same socket and
 * reattaches: it hands the group's memory back (the fds it was given), so
 * the new daemon adopts the running group and watches it again. Calls keep
 * running meanwhile: dcpx_push and dcpx_merge never touch the socket.
 *
 * Returns 0 when attached; DCPX_E_NOTCONN while a reattach is under way
 * (call again later); DCPX_E_CONNREFUSED while no daemon listens; or the
 * code with which a restarted daemon refused the reattach (retried after a
 * second). None of these affects the calls; they only mean that nothing
 * watches this rank's health until the member is attached again.
 *
 * It touches only the member's link to dcpxd, never what dcpx_push and
 * dcpx_merge use, so it may run on another thread while they run.
 * dcpx_poll, dcpx_health and dcpx_recover of one member run one at a time:
 * one called while another runs on another thread returns DCPX_E_BUSY and
 * does nothing. dcpx_leave must not overlap any call of the member. */
DCPX_API int dcpx_poll(dcpx_member *m);

/* After a failed call: acknowledge to dcpxd (the host backend has nothing
 * in flight; the CUDA backend, when there is something to recover,
 * synchronizes `stream` first, bounded by timeout_ms: the stream the member's calls went to; an engine that
 * enqueued them on several streams synchronizes the others itself before),
 * then wait up to timeout_ms for the group to be reset. With
 * the nccl transport a member of an aborted group (or a failed one) first
 * aborts its communicator, so that a collective whose peer died ends and
 * the stream drains; rank 0 sends a fresh NCCL unique id with its
 * acknowledgement, and once the group runs again every member makes a new
 * communicator from it (bounded by the join timeout: every rank must call
 * dcpx_recover, a replacement rank right after its join; a CUDA graph
 * captured with the old communicator must be captured again). Returns
 * DCPX_E_NCCL when no new communicator could be made: after a setup that
 * timed out the rank is FAILED, so dcpxd aborts the group again (unless
 * it was aborted during the setup already: a peer died), and calling
 * dcpx_recover again recovers it anew with a fresh id; with no id from
 * rank 0 for the new generation (a dcpxd or rank 0 that predates them)
 * the member's calls fail with DCPX_E_NCCL until dcpx_leave. Returns 0 at once if there is
 * nothing to recover (the group is not aborted and no rank has failed
 * or raised its alarm: e.g. a replacement that joined after the reset);
 * a rank whose call completed while a peer's failed acknowledges and
 * waits with the others, also before dcpxd has aborted the group. Survives a
 * daemon restart meanwhile (it reattaches and acknowledges again).
 * Returns 0 when the group runs again, DCPX_E_TIMEDOUT (with a WARN
 * line under DCPX_DEBUG that names the ranks no live process holds, for
 * which dcpxd waits for a replacement's join, or says that every rank is
 * held and some has not called dcpx_recover, or that the member is not
 * attached to a dcpxd: down or restarting), DCPX_E_INTR
 * (dcpx_member_interrupt), DCPX_E_BUSY (dcpx_poll or dcpx_health runs on
 * the member on another thread, or one of its calls (dcpx_push,
 * dcpx_push_list, dcpx_merge, dcpx_device_ctx): nothing done; or a
 * restarted dcpxd refused the reattach
 * for want of connections or file descriptors: call it again later), a
 * restarted dcpxd's other refusal of the reattach, or an error. */
DCPX_API int dcpx_recover(dcpx_member *m, void *stream, uint32_t timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* DCPX_H */
