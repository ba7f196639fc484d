/* devptr.h - checking a call's arrays before a kernel reads or writes them
 * (libdcpx's CUDA backend, libclient/cuda.c; internal).
 *
 * A kernel that is handed host memory CUDA does not know, memory of
 * another GPU, or an array shorter than the call needs faults (or reads
 * another allocation), and a fault kills the engine's CUDA context: the
 * whole process, not only its dcpx calls. So before every launch, each
 * array of the call must be memory the member's GPU can reach, from its
 * first byte to its last:
 *   - device memory of the member's own GPU;
 *   - managed memory;
 *   - host memory CUDA knows (cudaHostAlloc, cudaHostRegister: mapped
 *     for every device under unified addressing).
 * Refused: addresses CUDA does not know (malloc, the stack), device memory
 * of another GPU, and an array whose last byte is not in one of the kinds
 * above (it runs past its allocation into unmapped space). On a GPU that
 * reaches pageable host memory itself (cudaDevAttrPageableMemoryAccess:
 * HMM, or the NVLink-C2C of a Grace Hopper), memory CUDA does not know may
 * be the caller's malloc'd buffer, which the kernels can read: it is let
 * through (pageable_ok), and a wild pointer faults there as it would
 * without the check. The first and
 * the last byte are checked, each on its own, since an array may span two
 * mappings (PyTorch's expandable segments); an array that runs past its
 * allocation into another allocation of the same GPU is not caught.
 *
 * The hot path makes no syscall and no driver call: an address inside an
 * allocation this checker accepted before is accepted from a small cache
 * (DCPX__PTR_CACHE ranges, replaced round-robin), so an engine whose
 * buffers stay put pays compares only; a new buffer costs one driver query
 * (cuPointerGetAttributes) the first time. A range freed and reused for
 * another kind of memory at the same addresses is still taken from the
 * cache (the check is there to catch mistakes, not to police frees).
 * The query is a function pointer, so that the rules are tested without a
 * GPU (tests/check_transport.c). */
#ifndef DCPX_COMMON_DEVPTR_H
#define DCPX_COMMON_DEVPTR_H

#include <stddef.h>
#include <stdint.h>

enum {
  DCPX__MEM_UNKNOWN = 0, /* CUDA does not know the address */
  DCPX__MEM_HOST = 1,    /* page-locked host memory CUDA knows */
  DCPX__MEM_DEVICE = 2,  /* device memory of GPU `device` */
  DCPX__MEM_MANAGED = 3  /* managed (unified) memory */
};

/* What the driver says of one address. [beg, end): the mapping that holds
 * it, end == beg when not known (then nothing is cached). */
typedef struct dcpx__mem_info {
  int kind;
  int device; /* DCPX__MEM_DEVICE: this process's ordinal */
  uintptr_t beg, end;
} dcpx__mem_info;

/* 0 with *ret filled, or < 0 when the driver could not be asked. */
typedef int (*dcpx__mem_query_fn)(void *ctx, uintptr_t addr,
                                  dcpx__mem_info *ret);

#define DCPX__PTR_CACHE 16

typedef struct dcpx__ptr_check {
  int device; /* the member's GPU, this process's ordinal */
  int pageable_ok; /* the GPU reaches pageable host memory */
  dcpx__mem_query_fn query;
  void *ctx;
  uintptr_t beg[DCPX__PTR_CACHE], end[DCPX__PTR_CACHE];
  uint32_t n, next; /* ranges cached; the next to replace */
  uint64_t queries; /* driver queries made (tests, diagnostics) */
} dcpx__ptr_check;

/* A checker for `device`'s calls, with an empty cache; pageable_ok: the
 * device reaches pageable host memory (memory CUDA does not know passes). */
__attribute__((visibility("hidden"))) void
dcpx__ptr_check_init(dcpx__ptr_check *c, int device, int pageable_ok,
                     dcpx__mem_query_fn query, void *ctx);

/* Whether the `bytes` bytes from p may be handed to a kernel of c's
 * device. 0 (also for p NULL or bytes 0: those are the caller's to
 * refuse); DCPX_E_INVAL with why (what, the address and the reason, for
 * the log) when refused; DCPX_E_CUDA when the driver could not be asked. */
__attribute__((visibility("hidden"))) int
dcpx__ptr_ok(dcpx__ptr_check *c, const char *what, const void *p,
             uint64_t bytes, char *why, size_t why_len);

#endif /* DCPX_COMMON_DEVPTR_H */
