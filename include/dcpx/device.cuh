/* dcpx/device.cuh - push from an engine's own CUDA kernel (API v1).
 *
 * An engine whose indexer kernel already selects each row's local top-N
 * can store the row's candidates straight into every rank's LL slots from
 * that kernel's epilogue, instead of writing logits and launching
 * dcpx_push. The host side is dcpx_device_ctx(member, &dev) (dcpx.h): a
 * plain struct of device addresses and constants, passed to the kernel by
 * value. Everything here is a static inline device function over it; the
 * wire words and the LL store are the very ones the library's kernels use
 * (docs/PROTOCOL.md sections 3 and 4; section 4.7 is this contract).
 *
 * A kernel that pushes call n of a member must guarantee:
 *
 *   1. Order. It runs after the member's dcpx_merge of call n-1 has
 *      completed and before its dcpx_merge of call n: on the stream of
 *      both, or ordered as stream order would order it. Launched with
 *      programmatic dependent launch, it calls dcpx_device_pdl_wait()
 *      before any other function of this header (dcpx_merge lets its
 *      successor launch early). So does every kernel launched with PDL
 *      between that merge and this kernel, even one that uses nothing of
 *      dcpx: one that never waits may end while the merge still runs,
 *      and this kernel's wait would then not cover the merge.
 *   2. The call sequence. Exactly one thread of the grid calls
 *      dcpx_device_call_begin() once per call, also for a call of 0 rows,
 *      anywhere in the kernel (the merge reads the word only after its
 *      predecessor has completed). If the kernel lets its dependents
 *      launch early (dcpx_device_pdl_trigger) while dev.pdl is 1, it does
 *      so only after its last write of the logits that dcpx_merge of
 *      call n will read, and a __threadfence() (a saturated rank's merge
 *      reads them without waiting); a kernel that never triggers is
 *      always right (the merge then starts when it ends).
 *   3. Every row t < rows of the call is stored exactly once, whole: all
 *      its LL pairs into every rank (dcpx_device_store_row, or
 *      dcpx_device_store_row_at with dcpx_device_row_begin(t) read
 *      earlier in the same kernel, or dcpx_device_store_pair for every
 *      pair i < row_words / 2), by any threads of any blocks, with the
 *      epoch dcpx_device_row_epoch(t).
 *   4. The list. Entries j < c are the row's c candidates in ascending
 *      local index l, each l once, l below the row's row_end, no NaN;
 *      then empty entries (word 0) up to N; the bit-16 plane; padding 0
 *      (dcpx_device_list_zero, then dcpx_device_put_entry per entry).
 *      For the result to be the exact top-K of the logits they must be
 *      the row's local top-N (section 2: its N best, ties to the lower
 *      l); any other list gives the result exact for the lists given
 *      (section 5.8). dcpx_merge needs the call's logits either way.
 *
 * Breaking 3 (a row not stored, or stored with the wrong epoch) shows as
 * failed rows: the merges' tag checks wait for the missing words and
 * give up (valid_out -1, the rank FAILED, dcpx_recover), never as a
 * wrong answer. Breaking 1 can give a wrong answer without an error: a
 * kernel that stores call n + 1 before the rank's merge of call n has
 * completed reads epochs that merge has not advanced, so it stores under
 * call n's tags, into slots its peers may still be reading for call n
 * (docs/PROTOCOL.md 4.6). Rule 4 is past what tags can see too:
 * dcpx_device_list_words checks it for a list given as (values,
 * indices), and a kernel refuses a bad row with dcpx_device_refuse, as
 * dcpx_push_list does. Breaking 2 leaves the records and the fault hook
 * with wrong call numbers.
 *
 * Compile with nvcc, sm_70 or later (griddepcontrol needs sm_90: below it
 * the PDL functions are empty).
 */
#ifndef DCPX_PUBLIC_DEVICE_CUH
#define DCPX_PUBLIC_DEVICE_CUH

#include <stdint.h>

#include <dcpx.h>

#define DCPX_DEVICE_FN static __device__ __forceinline__

/* ---- the order and the wire words (sections 2, 3) ------------------------ */

/* ord16 of a bf16 (bits in the low 16), or 0 for NaN (never a candidate). */
DCPX_DEVICE_FN uint32_t dcpx_device_ord16(uint32_t bf16) {
  const uint32_t b = bf16 & 0xFFFFu;
  if ((b & 0x7FFFu) > 0x7F80u)
    return 0;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}

/* The 32-bit step of dcpx_epoch_next (the rescue tags): skips 0, wraps
 * 0xFFFFFFFE -> 1; 0xFFFFFFFF (a damaged word) -> 1 too. */
DCPX_DEVICE_FN uint32_t dcpx_device_epoch_next(uint32_t e) {
  return e >= 0xFFFFFFFEu ? 1u : e + 1u;
}

/* The tag of a row in the next call from its epoch word w, as
 * dcpx_epoch_tag (dcpx.h): the call half (bits 16-31) and the row half
 * (bits 0-15, 1..0xFFFE) each one step on. */
DCPX_DEVICE_FN uint32_t dcpx_device_epoch_tag(uint32_t w) {
  const uint32_t row = w & 0xFFFFu;
  return ((w + 0x10000u) & 0xFFFF0000u) | (row >= 0xFFFEu ? 1u : row + 1u);
}

/* The entry word of candidate (bf16, l): (ord16 << 16) | (l & 0xFFFF);
 * bit 16 of l goes into the plane (dcpx_device_put_entry). 0 for NaN. */
DCPX_DEVICE_FN uint32_t dcpx_device_word(uint32_t bf16, uint32_t l) {
  const uint32_t o = dcpx_device_ord16(bf16);
  return o ? (o << 16) | (l & 0xFFFFu) : 0u;
}

/* Zeroes a list's dev->row_words words; every thread of the block calls
 * it, and a barrier must follow before entries are put. */
DCPX_DEVICE_FN void dcpx_device_list_zero(const dcpx_device *dev,
                                          uint32_t *words) {
  for (uint32_t i = threadIdx.x; i < dev->row_words; i += blockDim.x)
    words[i] = 0;
}

/* Entry j < N of a zeroed list: its word and its plane bit (an atomic OR,
 * so threads may put entries of one list concurrently). */
DCPX_DEVICE_FN void dcpx_device_put_entry(const dcpx_device *dev,
                                          uint32_t *words, uint32_t j,
                                          uint32_t bf16, uint32_t l) {
  const uint32_t n = dev->local_topk;
  words[j] = dcpx_device_word(bf16, l);
  if ((l >> 16) & 1u)
    atomicOr(&words[n + j / 32u], 1u << (j % 32u));
}

/* A row's list from (values, indices) as dcpx_push_list takes them (N
 * entries; a negative index is empty, only empties may follow one) into
 * words. Every thread of the block calls it; it ends with a barrier and
 * returns, in every thread, nonzero if the list breaks rule 4 of this
 * file (an index >= row_end, a NaN, an index not above the one before:
 * unsorted or repeated, a full entry after an empty one). */
DCPX_DEVICE_FN int dcpx_device_list_words(const dcpx_device *dev,
                                          const uint16_t *values,
                                          const int32_t *indices,
                                          uint32_t row_end, uint32_t *words) {
  const uint32_t n = dev->local_topk;
  int bad = 0;
  for (uint32_t i = n + threadIdx.x; i < dev->row_words; i += blockDim.x)
    words[i] = 0;
  __syncthreads();
  for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int32_t l = indices[j];
    const int32_t next = j + 1 < n ? indices[j + 1] : -1;
    if (l < 0) {
      words[j] = 0;
      bad |= next >= 0;
      continue;
    }
    bad |= (uint32_t)l >= row_end || !dcpx_device_ord16(values[j]) ||
           (next >= 0 && next <= l);
    dcpx_device_put_entry(dev, words, j, values[j], (uint32_t)l);
  }
  return __syncthreads_or(bad);
}

/* ---- the LL store (section 4.2) and programmatic dependent launch -------- */

/* One LL pair: words w0, w1 tagged with `tag`, as (w0, tag, w1, tag), in
 * one 16-byte volatile store (two single-copy-atomic 8-byte halves). */
DCPX_DEVICE_FN void dcpx_device_ll_store(void *p, uint32_t w0, uint32_t w1,
                                         uint32_t tag) {
  const uint64_t a = ((uint64_t)tag << 32) | w0;
  const uint64_t b = ((uint64_t)tag << 32) | w1;
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a),
               "l"(b)
               : "memory");
}

/* Waits until every earlier kernel of the stream has completed and its
 * memory is visible (a no-op in a kernel launched without PDL). */
DCPX_DEVICE_FN void dcpx_device_pdl_wait(void) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel of the stream launch (rule 2 says when). */
DCPX_DEVICE_FN void dcpx_device_pdl_trigger(void) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ---- the push (section 4.4) ---------------------------------------------- */

/* Once per call, by one thread of the grid (rule 2): the call sequence
 * that wait records and the fault hook name the call by (section 6.5).
 * A reduction nothing waits for, as in the library's push. */
DCPX_DEVICE_FN void dcpx_device_call_begin(const dcpx_device *dev) {
  atomicAdd((unsigned long long *)dev->call_seq, 1ull);
}

/* 1 once this rank's kernels have seen its group aborted or itself
 * FAILED: the push then stores nothing (sections 4.4, 4.6). */
DCPX_DEVICE_FN int dcpx_device_stopped(const dcpx_device *dev) {
  return *(const volatile uint32_t *)dev->stop != 0;
}

/* The tag of row t in this call: dcpx_device_epoch_tag(epoch[t]). */
DCPX_DEVICE_FN uint32_t dcpx_device_row_epoch(const dcpx_device *dev,
                                              uint32_t t) {
  return dcpx_device_epoch_tag(
      *(const volatile uint32_t *)(dev->epoch + t));
}

/* Pair i of this rank's row-t list in rank d's ll_slots, parity e & 1. */
DCPX_DEVICE_FN char *dcpx_device_slot(const dcpx_device *dev, uint32_t d,
                                      uint32_t e, uint32_t t, uint32_t i) {
  const uint64_t pairs = dev->row_words / 2u;
  const uint64_t at =
      (((uint64_t)(e & 1u) * dev->world + dev->rank) * dev->rows + t) *
          pairs + i;
  return dev->peers[d] + dev->off_ll + at * 16u;
}

/* Pair i (words 2i, 2i + 1) of row t, epoch e, into every rank. */
DCPX_DEVICE_FN void dcpx_device_store_pair(const dcpx_device *dev,
                                           uint32_t t, uint32_t e,
                                           uint32_t i, uint32_t w0,
                                           uint32_t w1) {
  for (uint32_t d = 0; d < dev->world; d++)
    dcpx_device_ll_store(dcpx_device_slot(dev, d, e, t, i), w0, w1, e);
}

/* What storing row t needs from device memory: its epoch and whether
 * this rank's kernels were stopped. Both are fixed for the whole call
 * (the previous merge wrote them; rule 1 orders it before this kernel),
 * so a kernel can read them at its start, where their latency hides
 * behind its own work, instead of on the epilogue's path. */
typedef struct dcpx_device_row {
  uint32_t e;       /* dcpx_device_epoch_tag(epoch[t]) */
  uint32_t stopped; /* dcpx_device_stopped */
} dcpx_device_row;

DCPX_DEVICE_FN dcpx_device_row dcpx_device_row_begin(const dcpx_device *dev,
                                                     uint32_t t) {
  dcpx_device_row r;
  r.e = dcpx_device_row_epoch(dev, t);
  r.stopped = (uint32_t)dcpx_device_stopped(dev);
  return r;
}

/* Row t's finished list (words: row_words words, complete and visible to
 * every thread of the block: a barrier before) into every rank, pairs
 * spread over the block's threads, with r from dcpx_device_row_begin(t)
 * read in this kernel; nothing when stopped. No barrier inside: the
 * words may be rewritten only after one. */
DCPX_DEVICE_FN void dcpx_device_store_row_at(const dcpx_device *dev,
                                             dcpx_device_row r, uint32_t t,
                                             const uint32_t *words) {
  if (r.stopped)
    return;
  for (uint32_t i = threadIdx.x; i < dev->row_words / 2u; i += blockDim.x)
    dcpx_device_store_pair(dev, t, r.e, i, words[2 * i], words[2 * i + 1]);
}

/* The same, reading the epoch and the stop word here. */
DCPX_DEVICE_FN void dcpx_device_store_row(const dcpx_device *dev, uint32_t t,
                                          const uint32_t *words) {
  dcpx_device_store_row_at(dev, dcpx_device_row_begin(dev, t), t, words);
}

/* Refuses the call (one thread): the rank raises its alarm and, after it
 * drained, sets FAILED and stop, as a refused call or a timed-out wait
 * does (section 6.3); dcpxd aborts the group, every rank's merge fails
 * the call, and the member must dcpx_recover. The refused row must not
 * be stored. */
DCPX_DEVICE_FN void dcpx_device_refuse(const dcpx_device *dev) {
  *(volatile uint32_t *)dev->alarm = 1u;
  __threadfence_system();
  *(volatile uint32_t *)dev->failed = 1u;
  *(volatile uint32_t *)dev->stop = 1u;
  __threadfence_system();
}

#endif /* DCPX_PUBLIC_DEVICE_CUH */
