/* gpu_tools.h - kernels of the GPU tests only (tests/gpu/gpu_tools.cu),
 * linked into the tests/gpu programs and never into libdcpx: the LL
 * ping-pong (tests/gpu/pingpong), a start gate (test_nccl --bench), the
 * launch floor (bench_kernels) and the copy bandwidth (roofline). */
#ifndef DCPX_TESTS_GPU_TOOLS_H
#define DCPX_TESTS_GPU_TOOLS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the LL ping-pong (gpu_tools.cu; tests/gpu/pingpong.c) ----------------
 *
 * One-way LL latency between two GPUs: one thread per side, `iters` round
 * trips in one launch. `mine` is a 16-byte slot in this GPU's memory that
 * the other side stores into; `peer` the other side's slot (a P2P address).
 * The initiator (initiator != 0) stores pair i tagged tag_base + i into
 * peer and polls mine for the answer; the responder answers each pair.
 * Both sides must use the same iters and tag_base (>= 1; tag_base + iters
 * < 2^32), and their slots must not already hold one of those tags. Every
 * poll gives up after timeout_ns of %globaltimer. out (device, 4 uint64):
 * status (0 ok, 1 timeout, 2 wrong words), globaltimer ns and clock64
 * cycles from the first store to the last answer (meaningful on the
 * initiator), round trips done. A test tool, not the call path. */
int dcpx_k_pingpong(void *mine, void *peer, uint32_t iters, int initiator,
                    uint32_t tag_base, uint64_t timeout_ns, uint64_t *out,
                    cudaStream_t s);

/* A start gate: one thread spins on `flag` (host-mapped, device address)
 * until (int32_t)(*flag - value) >= 0 or timeout_ns passes. Enqueue one
 * before timed work on every rank's stream, then store value on the host:
 * all ranks start together. A test tool. */
int dcpx_k_gate(const uint32_t *flag, uint32_t value, uint64_t timeout_ns,
                cudaStream_t s);

/* The launch floor: `rows` blocks of `threads` threads with `smem` bytes
 * of dynamic shared memory; block t loads word[t], passes one barrier and
 * stores it back (word: device, rows words). The bench times it like a
 * merge to separate launch cost from row time. dcpx_k_floor_prepare
 * (outside any stream capture) allows up to `smem` bytes. A test tool. */
int dcpx_k_floor_prepare(size_t smem);
int dcpx_k_floor(uint32_t *word, uint32_t rows, uint32_t threads,
                 size_t smem, cudaStream_t s);

/* The copy bandwidth: `blocks` blocks of `threads` threads copy n16
 * 16-byte words from src to dst (device memory, 16-byte aligned); one
 * block measures one SM's bandwidth. A test tool (roofline.c). */
int dcpx_k_copy(const void *src, void *dst, size_t n16, uint32_t blocks,
                uint32_t threads, cudaStream_t s);

/* The poll's loads alone: one block of `threads` threads, each loading
 * `per` (<= 8) 16-byte words of src (device memory) with load kind `kind`
 * (0 ld.volatile, the poll's; 1 ld.relaxed.gpu; 2 ld.global.cg; 3
 * ld.global through L1), all issued before any is used, then (stage)
 * stored into shared memory, `passes` times; out (device, passes + 1
 * words): thread 0's clock64 cycles of each pass. A test tool
 * (roofline.c). */
int dcpx_k_loadlat(const void *src, uint32_t threads, uint32_t per, int kind,
                   int stage, uint32_t passes, unsigned long long *out,
                   cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* DCPX_TESTS_GPU_TOOLS_H */
