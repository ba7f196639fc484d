/* cuda.c - libdcpx's CUDA backend: maps the group's memory for the GPU and
 * enqueues the push and merge kernels (kernels/dcpx_kernels.h).
 *
 * At join (never on the call path):
 *   - every rank's workspace fd (a VMM allocation dcpxd made on that rank's
 *     device) is imported, mapped at a reserved address range, and made
 *     readable and writable by this rank's device. A peer on another GPU
 *     needs P2P access to that GPU (NVLink); ranks sharing a GPU need none;
 *   - the control page (host memory, a memfd this process already mapped)
 *     is registered with cudaHostRegister(Mapped | Portable), so the
 *     kernels write records, alarm and FAILED with plain system-scope
 *     stores and dcpxd sees them without a copy;
 *   - the peer pointer table is copied to device memory once.
 * Per call: dcpx_k_push / dcpx_k_merge on the caller's stream, kernel
 * arguments by value: no sync, no allocation, no syscall, capturable into
 * a CUDA graph.
 *
 * The transport (common/transport.h) is resolved first: ll as above; nccl
 * (libclient/nccl.c) maps only this rank's own workspace (for sat_word and
 * stats) and exchanges through NCCL. With transport auto, each rank
 * decides from JoinReply.devices and cudaDeviceCanAccessPeer (device
 * ordinals are taken to be this node's: set the transport explicitly for
 * a group that spans nodes), writes its choice into its health block, and
 * waits (bounded by the join timeout) until every rank's choice is there
 * and the same, else the join fails with DCPX_E_TRANSPORT.
 *
 * When several ranks of the group share this rank's GPU (tests, MPS), every
 * merge grid must be co-resident with the others, so the grid is capped to
 * a share of what the GPU holds (kernels/dcpx_kernels.h, max_blocks).
 *
 * The driver's VMM calls come through cudaGetDriverEntryPointByVersion, so
 * libdcpx links only the static CUDA runtime and loads on machines without
 * a driver (where a CUDA join fails with DCPX_E_CUDA).
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "cuda_drv.h"
#include "cuda_log.h"
#include "dcpx_kernels.h"
#include "devptr.h"
#include "member.h"
#include "merge.h"
#include "transport.h"

struct dcpx__cuda {
  int device;
  dcpx_kctx k;
  CUmemGenericAllocationHandle h[DCPX_MAX_WORLD];
  CUdeviceptr va[DCPX_MAX_WORLD];
  size_t size[DCPX_MAX_WORLD];
  char **peers; /* device array [W] */
  uint32_t *stage; /* the merge's private staging, when it needs one */
  uint32_t *klist; /* the push's local top-K lists (rank-private) */
  dcpx_k_counters *ctr; /* the kernels' call counters (kept across
                           recoveries; published into the health block) */
  int registered;
  struct dcpx__nccl *nccl; /* transport nccl */
  /* k without its klist, for calls whose push built none: after a
   * dcpx_push_list (list_push, until the next dcpx_push), and for good
   * once an engine kernel may push (device_ctx given out). A merge of
   * such a call selects a rescue list from the logits (push_list.cu). */
  dcpx_kctx kx;
  int list_push, device_ctx;
  CUcontext ctx; /* the member's device's primary context */
  /* rank 0 of an nccl group: the NCCL unique id sent with its
   * RecoverAcks for generation ack_id_gen (ack_id_len 0: none yet) */
  uint8_t ack_id[DCPX_NCCL_ID_BYTES];
  size_t ack_id_len;
  uint32_t ack_id_gen;
  dcpx__ptr_check pc; /* the calls' arrays (common/devptr.h) */
  int check_ptrs;     /* 0 with DCPX_PTR_CHECK=0 */
};

static dcpx_cuda_drv D; /* common/cuda_drv.h */
static int D_status = 1;
static pthread_once_t D_once = PTHREAD_ONCE_INIT;

/* A driver call that failed: logged (WARN) with the driver's error
 * string, like CUDA_OK (cuda_log.h). */
static int drv_ok(CUresult e, const char *what, int line) {
  const char *str = NULL;
  if (e == CUDA_SUCCESS)
    return 1;
  if (dcpx__log_on(DCPX__LOG_WARN)) {
    if (!D.error_string || D.error_string(e, &str) != CUDA_SUCCESS || !str)
      str = "unknown driver error";
    dcpx__log(DCPX__LOG_WARN, __FILE__, line, "%s failed: %s (CUresult %d)",
              what, str, (int)e);
  }
  return 0;
}
#define DRV_OK(call) drv_ok((call), #call, __LINE__)

static void load_once(void) {
  const char *missing = "?";
  D_status = dcpx__cuda_drv_load(&D, &missing);
  if (D_status < 0)
    DCPX_WARN("cudaGetDriverEntryPointByVersion(%s) failed: no usable CUDA "
              "driver", missing);
}

/* devptr.h's query: what the driver says of address a (the member's
 * context is current: every call runs inside ctx_enter). The range to
 * cache is the mapping that holds a (VMM allocations: a reservation may
 * hold unmapped parts), else the allocation's range, else none. The
 * device address of host memory must be the host address, as it is for
 * cudaHostAlloc and registered memory under unified addressing unless the
 * GPU cannot use host pointers for registered memory. */
static int mem_query(void *ctx, uintptr_t a, dcpx__mem_info *ret) {
  uint32_t type = 0, managed = 0; /* the driver writes a bool or an int */
  int ord = -1;
  CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                               CU_POINTER_ATTRIBUTE_IS_MANAGED,
                               CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void *data[3] = {&type, &managed, &ord};
  (void)ctx;
  *ret = (dcpx__mem_info){DCPX__MEM_UNKNOWN, -1, 0, 0};
  if (!DRV_OK(D.ptr_attrs(3, at, data, (CUdeviceptr)a)))
    return DCPX_E_CUDA;
  if (managed)
    ret->kind = DCPX__MEM_MANAGED;
  else if (type == CU_MEMORYTYPE_DEVICE) {
    uint32_t mapped = 1; /* a reserved address with nothing mapped: 0 */
    CUpointer_attribute at1 = CU_POINTER_ATTRIBUTE_MAPPED;
    void *d1 = &mapped;
    if (D.ptr_attrs(1, &at1, &d1, (CUdeviceptr)a) == CUDA_SUCCESS &&
        !(mapped & 0xFFu))
      return 0;
    ret->kind = DCPX__MEM_DEVICE;
  } else if (type == CU_MEMORYTYPE_HOST) {
    CUdeviceptr dp = 0;
    CUpointer_attribute at1 = CU_POINTER_ATTRIBUTE_DEVICE_POINTER;
    void *d1 = &dp;
    if (D.ptr_attrs(1, &at1, &d1, (CUdeviceptr)a) != CUDA_SUCCESS ||
        dp != (CUdeviceptr)a)
      return 0; /* unknown to kernels at this address */
    ret->kind = DCPX__MEM_HOST;
  } else
    return 0;
  ret->device = ord;
  uint64_t beg = 0, size = 0;
  CUpointer_attribute ra[2] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                               CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
  void *rd[2] = {&beg, &size};
  if (D.ptr_attrs(2, ra, rd, (CUdeviceptr)a) != CUDA_SUCCESS || !size) {
    ra[0] = CU_POINTER_ATTRIBUTE_RANGE_START_ADDR;
    ra[1] = CU_POINTER_ATTRIBUTE_RANGE_SIZE;
    beg = size = 0;
    if (D.ptr_attrs(2, ra, rd, (CUdeviceptr)a) != CUDA_SUCCESS)
      size = 0;
  }
  if (size && a >= beg && a - beg < size) {
    ret->beg = (uintptr_t)beg;
    ret->end = (uintptr_t)(beg + size);
  }
  return 0;
}

/* One array of a call: its name, address and the bytes the kernels may
 * touch from there. */
typedef struct call_array {
  const char *what;
  const void *p;
  uint64_t bytes;
} call_array;

/* The bytes a call may read of logits: row t starts at t * stride
 * elements and ends by stride (row_end <= stride); only the first row's
 * start and the last row's start are sure to be read (row_ends are
 * device memory), so the extent ends at the last row's first element.
 * UINT64_MAX when it does not fit (refused as beyond the address space). */
static uint64_t logits_bytes(uint32_t rows, uint64_t stride) {
  if (!rows)
    return 0;
  if (stride && (uint64_t)(rows - 1u) > (UINT64_MAX / 2u - 1u) / stride)
    return UINT64_MAX;
  return ((uint64_t)(rows - 1u) * stride + 1u) * 2u;
}

/* Refuses (DCPX_E_INVAL; DCPX_E_CUDA when the driver could not be asked)
 * a call whose arrays a kernel could not use (devptr.h): before anything
 * is enqueued; the reason into out[on] (when not NULL: the member's, for
 * dcpx_member_last_error) and logged. Compares only, once the buffers
 * were seen. */
static int arrays_ok(struct dcpx_member *m, const char *fn,
                     const call_array *a, size_t n, char *out, size_t on) {
  struct dcpx__cuda *cu = m->cuda;
  char why[224];
  if (!cu->check_ptrs) {
    /* DCPX_PTR_CHECK=0 turns off the driver's view only: an extent past
     * the end of the address space (a stride of 2^63) is still refused,
     * by compares, as dcpx.h promises, before a kernel reads a wrapped
     * address */
    for (size_t i = 0; i < n; i++)
      if (a[i].p && a[i].bytes &&
          (a[i].bytes == UINT64_MAX ||
           a[i].bytes - 1u > (uint64_t)(UINTPTR_MAX - (uintptr_t)a[i].p))) {
        dcpx__why_at(out, on, __FILE__, __LINE__,
                     "%s: group %s rank %u: %s runs past the end of the "
                     "address space", fn, m->group, m->rank, a[i].what);
        return DCPX_E_INVAL;
      }
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    const int r = dcpx__ptr_ok(&cu->pc, a[i].what, a[i].p, a[i].bytes, why,
                               sizeof(why));
    if (r < 0) {
      dcpx__why_at(out, on, __FILE__, __LINE__, "%s: group %s rank %u: %s",
                   fn, m->group, m->rank, why);
      return r;
    }
  }
  return 0;
}

#ifdef HAVE_NCCL
/* rank 0's NCCL id for generation gen from the control page into id
 * (DCPX_NCCL_ID_BYTES): its length, or 0 when the page has none for gen
 * (docs/PROTOCOL.md 6.9). nccl_gen first (acquire: the id and its length
 * were written before it), then the length once (every member may write
 * the page). */
static size_t ctl_nccl_id(const struct dcpx_member *m, uint32_t gen,
                          uint8_t *id) {
  if (__atomic_load_n(&m->hdr->nccl_gen, __ATOMIC_ACQUIRE) != gen)
    return 0;
  const size_t len = __atomic_load_n(&m->hdr->nccl_id_len, __ATOMIC_RELAXED);
  if (len > DCPX_NCCL_ID_BYTES)
    return 0;
  memcpy(id, m->hdr->nccl_id, len);
  return len;
}
#endif

void dcpx__cuda_fini(struct dcpx_member *m) {
  struct dcpx__cuda *cu = m->cuda;
  CUcontext prev = NULL;
  if (!cu)
    return;
  /* The caller's context is given back as it was, none included: a
   * cudaSetDevice to "the previous device" would make a context on GPU 0
   * for a thread that had none (cudaGetDevice says 0 then). */
  (void)D.ctx_get(&prev);
  cudaSetDevice(cu->device);
#ifdef HAVE_NCCL
  /* Before the device-wide sync, which has no bound: an NCCL collective
   * whose peer died never completes until its comm is aborted. The stop
   * is bounded (nccl.c) and aborts at once for an aborted group. */
  dcpx__nccl_stop(cu->nccl, m->hdr && m->hdr->abort);
#endif
  cudaDeviceSynchronize(); /* nothing of ours may still run */
#ifdef HAVE_NCCL
  dcpx__nccl_fini(cu->nccl, 1); /* the comm is gone: frees the buffer */
  cu->nccl = NULL;
#endif
  if (cu->peers)
    cudaFree(cu->peers);
  if (cu->stage)
    cudaFree(cu->stage);
  if (cu->klist)
    cudaFree(cu->klist);
  if (cu->ctr)
    cudaFree(cu->ctr);
  if (cu->registered)
    cudaHostUnregister(m->ctl);
  for (uint32_t d = 0; d < DCPX_MAX_WORLD; d++) {
    if (cu->va[d]) {
      D.unmap(cu->va[d], cu->size[d]);
      D.addr_free(cu->va[d], cu->size[d]);
    }
    if (cu->h[d])
      D.release(cu->h[d]);
  }
  (void)D.ctx_set(prev);
  free(cu);
  m->cuda = NULL;
}

/* Imports and maps rank d's workspace for this device. */
static int map_ws(struct dcpx__cuda *cu, uint32_t d, int fd, size_t bytes) {
  CUmemAllocationProp p;
  CUmemAccessDesc acc;
  size_t g = 0;

  if (!DRV_OK(D.import_fd(&cu->h[d], (void *)(uintptr_t)fd,
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)))
    return DCPX_E_CUDA;
  if (!DRV_OK(D.props(&p, cu->h[d])) ||
      !DRV_OK(D.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
    return DCPX_E_CUDA;
  cu->size[d] = (bytes + g - 1) / g * g;
  if (!DRV_OK(D.reserve(&cu->va[d], cu->size[d], g, 0, 0))) {
    cu->va[d] = 0;
    return DCPX_E_NOMEM;
  }
  if (!DRV_OK(D.map(cu->va[d], cu->size[d], 0, cu->h[d], 0))) {
    D.addr_free(cu->va[d], cu->size[d]);
    cu->va[d] = 0;
    return DCPX_E_CUDA;
  }
  memset(&acc, 0, sizeof(acc));
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = cu->device;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  /* Fails for a peer GPU without P2P access: the transport must then be
   * NCCL, not LL. */
  if (!DRV_OK(D.set_access(cu->va[d], cu->size[d], &acc, 1))) {
    DCPX_WARN("rank workspace %u: no peer access from device %d (transport "
              "ll needs P2P; use nccl)", d, cu->device);
    return DCPX_E_TRANSPORT;
  }
  return 0;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int dcpx__cuda_device_uuid(int device, uint8_t *out) {
  CUuuid u;
  pthread_once(&D_once, load_once);
  if (D_status < 0)
    return D_status;
  if (D.uuid(&u, (CUdevice)device) != CUDA_SUCCESS)
    return DCPX_E_CUDA;
  memcpy(out, u.bytes, sizeof(u.bytes));
  return 0;
}

/* The ranks' GPUs as this process sees them (common/transport.h
 * dcpx__gpu_map): by UUID when every rank sent one, else by the ordinals
 * of JoinReply.devices. */
static int gpu_map(const struct dcpx_member *m, const dcpx__join_gpus *jg,
                   int ndev_local, int32_t *gpu, int32_t *local) {
  uint8_t mine[64 * 16];
  const uint32_t W = m->shape.world;
  if (!jg->devices || jg->ndevices < W)
    return DCPX_E_PROTO;
  if (ndev_local > 64)
    ndev_local = 64;
  for (int d = 0; jg->uuids && d < ndev_local; d++)
    if (dcpx__cuda_device_uuid(d, mine + 16u * (uint32_t)d) < 0)
      memset(mine + 16u * (uint32_t)d, 0, 16); /* matches no real GPU */
  dcpx__gpu_map(W, jg->devices, jg->uuids, mine, ndev_local, gpu, local);
  return 0;
}

/* The transport of this group (common/transport.h), from the ranks' GPUs
 * and this node's peer access. A pair on GPUs of which this process sees
 * one only (CUDA_VISIBLE_DEVICES isolating each rank) cannot be asked
 * about: ll is assumed, and the mapping of the peer's workspace then
 * says whether peer access works (map_ws: DCPX_E_TRANSPORT, naming
 * transport nccl). */
static int resolve(const struct dcpx_member *m, const int32_t *gpu,
                   const int32_t *local) {
  const uint32_t W = m->shape.world;
  uint8_t acc[DCPX_MAX_WORLD * DCPX_MAX_WORLD];
  if (m->transport_req != DCPX_TRANSPORT_AUTO)
    return dcpx__transport_resolve(m->transport_req, W, NULL, NULL);
  memset(acc, 0, sizeof(acc));
  for (uint32_t i = 0; i < W; i++)
    for (uint32_t j = 0; j < W; j++) {
      int a = 1;
      if (i == j || gpu[i] == gpu[j])
        continue;
      if (local[i] >= 0 && local[j] >= 0 &&
          cudaDeviceCanAccessPeer(&a, local[i], local[j]) != cudaSuccess)
        a = 0;
      acc[i * W + j] = a != 0;
    }
  return dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, W, gpu, acc);
}

/* The join timeout (member.h): it bounds the transport agreement and the
 * NCCL communicator's setup and finalize. */
static uint32_t join_ms(const struct dcpx_member *m) {
  return dcpx__join_ms(m);
}

/* With transport auto: every rank's choice, through the control page. */
static int agree(struct dcpx_member *m) {
  const uint32_t W = m->shape.world;
  const uint64_t end = now_ms() + join_ms(m);
  for (;;) {
    uint32_t seen = 0;
    for (uint32_t d = 0; d < W; d++) {
      uint32_t t = __atomic_load_n(&m->health[d].transport, __ATOMIC_ACQUIRE);
      if (t && t != m->transport)
        return DCPX_E_TRANSPORT; /* the ranks resolved differently */
      seen += t != 0;
    }
    if (seen == W)
      return 0;
    if (now_ms() >= end)
      return DCPX_E_TIMEDOUT;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

#ifdef HAVE_NCCL
/* The NCCL stall watch's verdict (libclient/nccl.c, on its watchdog
 * thread): a collective of this rank stayed pending for the group's
 * wait limit. As an LL wait that gives up (docs/PROTOCOL.md 6.3): the
 * record (row 0's slot, if empty; kind DCPX_REC_NCCL_TIMEOUT, index the
 * all-gather: DCPX_NCCL_BEAT_LISTS or _RESCUE), then alarm and FAILED. */
static void nccl_stalled(void *arg, uint32_t which) {
  dcpx_wait_record x = {0}; /* region 0, row 0, tags and call 0 */
  x.index = which;
  dcpx__member_give_up(arg, DCPX_REC_NCCL_TIMEOUT, &x);
}
#endif

/* Every workspace this rank reads or writes (ll: all W; nccl: its own),
 * the control page mapped into the device, and the peers' addresses in
 * device memory, into *ret_ctl_dev and cu. */
static int cuda_map(const struct dcpx_member *m, struct dcpx__cuda *cu,
                    void **ret_ctl_dev) {
  const uint32_t W = m->shape.world;
  int r = 0;
  for (uint32_t d = 0; d < W && r == 0; d++)
    if (m->transport == DCPX_TRANSPORT_LL || d == m->rank)
      r = map_ws(cu, d, m->ws_fd[d], m->L.ws_bytes);
  if (r < 0)
    return r;
  if (!CUDA_OK(cudaHostRegister(m->ctl, m->ctl_bytes,
                                cudaHostRegisterMapped |
                                    cudaHostRegisterPortable)))
    return DCPX_E_CUDA;
  cu->registered = 1;
  if (!CUDA_OK(cudaHostGetDevicePointer(ret_ctl_dev, m->ctl, 0)) ||
      !CUDA_OK(cudaMalloc((void **)&cu->peers, sizeof(char *) * W)) ||
      !CUDA_OK(cudaMemcpy(cu->peers, cu->va, sizeof(char *) * W,
                          cudaMemcpyHostToDevice)))
    return DCPX_E_CUDA;
  return 0;
}

/* The kernels' context from the group's shape and the mappings. */
static void kctx_fill(const struct dcpx_member *m, struct dcpx__cuda *cu,
                      char *ctl_dev) {
  dcpx_kctx *k = &cu->k;
  k->world = m->shape.world;
  k->rank = m->rank;
  k->rows_max = m->shape.rows;
  k->topk = m->shape.topk;
  k->local_topk = m->shape.local_topk;
  k->block_size = m->shape.block_size;
  k->interleave = m->shape.interleave;
  k->max_local = m->shape.max_local;
  k->L = m->L;
  k->peers = cu->peers;
  k->ws = (char *)(uintptr_t)cu->va[m->rank];
  k->ctl = (dcpx_ctl_header *)ctl_dev;
  k->health = (dcpx_rank_health *)(ctl_dev + m->L.off_ranks);
  k->records = (dcpx_wait_record *)(ctl_dev + m->L.off_records);
  k->poll_storm = getenv("DCPX_POLL_STORM") != NULL; /* measurement only */
}

/* The merge's staging buffer (when a row's lists do not fit in shared
 * memory), the call counters, and the kernels' one-time setup. */
static int kctx_buffers(struct dcpx__cuda *cu) {
  dcpx_kctx *k = &cu->k;
  const size_t stage = dcpx_k_merge_stage_bytes(k);
  if (stage && !CUDA_OK(cudaMalloc((void **)&cu->stage, stage)))
    return DCPX_E_NOMEM;
  k->stage = cu->stage;
  if (!CUDA_OK(cudaMalloc((void **)&cu->ctr, sizeof(dcpx_k_counters)))) {
    cu->ctr = NULL;
    return DCPX_E_NOMEM;
  }
  /* zeroed before any kernel of ours can run on the caller's stream (which
   * may not wait for the legacy stream) */
  if (!CUDA_OK(cudaMemset(cu->ctr, 0, sizeof(dcpx_k_counters))) ||
      !CUDA_OK(cudaStreamSynchronize(0)))
    return DCPX_E_CUDA;
  k->ctr = cu->ctr;
  return DCPX_KLOG(dcpx_k_prepare(), "dcpx_k_prepare");
}

#ifdef HAVE_NCCL
/* The NCCL transport's communicator, for the generation the group runs
 * (or 0 while it recovers: made anew when the recovery completes). */
static int nccl_setup(struct dcpx_member *m, struct dcpx__cuda *cu,
                      const uint8_t *nccl_id, size_t nccl_id_len, char *why,
                      size_t why_len) {
  dcpx_kctx *k = &cu->k;
  /* No NCCL wait may outlast a dead peer (nccl.c's file comment). */
  /* A collective NCCL could not enqueue at once is setting up its
   * connections (seconds, on first use): the larger of the call and
   * join timeouts, so that a short call timeout cannot abort a healthy
   * communicator for good. */
  const uint64_t setup_ns = (uint64_t)join_ms(m) * 1000000u;
  const dcpx__nccl_bounds b = {
      join_ms(m), m->timeout_ns > setup_ns ? m->timeout_ns : setup_ns,
      &m->hdr->abort, &m->health[m->rank].failed,
      &m->hdr->timeout_ns, nccl_stalled, m};
  /* A group aborted (a replacement joins it) or recovering: its
   * communicators are made anew when the recovery completes, in
   * dcpx_recover (dcpx__cuda_recovered). */
  /* The generation and the recovery test as one snapshot (the
   * generation unchanged around the test): a recovery that completed
   * between two separate reads gave a replacement rank 0 below an
   * ack_id_gen one past the generation its id was sent for, and its
   * next acknowledgement sent that used id again. */
  uint32_t gen_now, gen_after;
  int recovering;
  do {
    gen_now = __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE);
    recovering = dcpx__member_needs_recovery(m);
    gen_after = __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE);
  } while (gen_now != gen_after);
  const uint32_t gen = recovering ? 0u : gen_now;
  /* The group runs (gen != 0): the id every other member uses for gen
   * is the control page's (written before the generation), not
   * necessarily the JoinReply's: a replacement's reply carries the id
   * dcpxd held at its join, and rank 0 may send a fresh one (its
   * RecoverAck) before the recovery completes, which can happen before
   * this read. At formation both are the same. */
  uint8_t hid[DCPX_NCCL_ID_BYTES];
  const size_t hlen = gen ? ctl_nccl_id(m, gen, hid) : 0;
  /* A replacement rank 0 of an aborted group: dcpxd holds its Join's id
   * for the recovery (docs/PROTOCOL.md 6.9 step 5), so its RecoverAck
   * sends that one again instead of making another (whose bootstrap
   * root would listen for ranks that never come). */
  if (!gen && m->rank == 0 && m->join_nccl_id_len) {
    memcpy(cu->ack_id, m->join_nccl_id, m->join_nccl_id_len);
    cu->ack_id_len = m->join_nccl_id_len;
    cu->ack_id_gen = gen_now;
  }
  if (hlen) {
    nccl_id = hid;
    nccl_id_len = hlen;
  }
  int r = dcpx__nccl_init(&m->shape, m->rank, cu->device, k->ws, nccl_id,
                          nccl_id_len, gen, &b, why, why_len, &cu->nccl);
  if (r >= 0)
    dcpx__nccl_counters(cu->nccl, cu->ctr, k->health + m->rank);
  return r;
}
#else
static int nccl_setup(struct dcpx_member *m, struct dcpx__cuda *cu,
                      const uint8_t *nccl_id, size_t nccl_id_len, char *why,
                      size_t why_len) {
  (void)m, (void)cu, (void)nccl_id, (void)nccl_id_len, (void)why,
      (void)why_len;
  return DCPX_E_TRANSPORT; /* unreachable: refused before (no NCCL) */
}
#endif

/* The LL transport's launch shapes: half blocks past one wave of rows,
 * the grid cap of ranks sharing a GPU, PDL, and the saturated rank's
 * top-K list; then the context's own check. */
static int ll_setup(const struct dcpx_member *m, struct dcpx__cuda *cu,
                    const int32_t *gpu) {
  const uint32_t W = m->shape.world;
  dcpx_kctx *k = &cu->k;
  /* A call with more rows than the GPU has SMs pushes with half blocks,
   * two per SM, in one wave (push.cu dcpx_k_push_threads). */
  int nsm = 0, split = 0;
  if (!CUDA_OK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount,
                                      cu->device)))
    return DCPX_E_CUDA;
  k->push_split_rows = (uint32_t)nsm;
  if (DCPX_KLOG(dcpx_k_merge_split_ok(k, &split), "dcpx_k_merge_split_ok") <
      0)
    return DCPX_E_CUDA;
  k->merge_split_rows = split ? (uint32_t)nsm : 0u;
  /* Ranks sharing this GPU must all fit at once (see the file comment). */
  uint32_t share = 0;
  for (uint32_t d = 0; d < W; d++)
    share += gpu[d] == gpu[m->rank];
  if (share > 1) {
    int bps = 0;
    if (DCPX_KLOG(dcpx_k_merge_occupancy(k, &bps), "dcpx_k_merge_occupancy") <
        0)
      return DCPX_E_CUDA;
    /* One share per rank, and one more left for the push grids. */
    uint32_t cap = (uint32_t)(nsm * (bps > 0 ? bps : 1)) / (share + 1);
    k->max_blocks = cap ? cap : 1;
  }
  /* PDL with one rank per GPU (bench/RESULTS.md: 1-2 us per call there;
   * ranks sharing a GPU lose SMs to merges that start early). */
  k->pdl = share <= 1 ? !getenv("DCPX_NO_PDL") : getenv("DCPX_PDL") != NULL;
  /* A saturated rank's top-K list: selected by the merge while it waits
   * for the lists (PDL, calls that fit the GPU twice), or kept by the push
   * (dcpx_kernels.h). */
  k->resc_early = dcpx_k_resc_early_rows(k, nsm);
  if (dcpx_k_klist_wanted(k) &&
      !CUDA_OK(cudaMalloc((void **)&cu->klist, dcpx_k_klist_bytes(k))))
    return DCPX_E_NOMEM;
  k->klist = cu->klist;
  cu->kx = *k;
  cu->kx.klist = NULL;
  return dcpx_k_ctx_check(k);
}

/* This rank's GPU side, in order: the transport (auto: agreed by every
 * rank through the control page), the mappings, the kernels' context and
 * buffers, then NCCL's communicator or the LL launch shapes. On failure
 * everything made is undone (dcpx__cuda_fini); the caller's current
 * context is given back either way. */
int dcpx__cuda_init(struct dcpx_member *m, const dcpx__join_gpus *jg,
                    const uint8_t *nccl_id, size_t nccl_id_len, char *why,
                    size_t why_len) {
  struct dcpx__cuda *cu;
  CUcontext prev = NULL; /* the caller's, given back (dcpx__cuda_fini) */
  int32_t gpu[DCPX_MAX_WORLD], local[DCPX_MAX_WORLD];
  int r = 0, n = 0;

  pthread_once(&D_once, load_once);
  if (D_status < 0)
    return D_status;
  (void)D.ctx_get(&prev);
  if (m->device < 0 || !CUDA_OK(cudaGetDeviceCount(&n)) || m->device >= n) {
    DCPX_WARN("CUDA device %d: not usable (%d devices)", m->device, n);
    return DCPX_E_CUDA;
  }
  r = gpu_map(m, jg, n, gpu, local);
  if (r < 0)
    return r;
  r = resolve(m, gpu, local);
  if (r < 0)
    return r;
  m->transport = (uint32_t)r;
  r = 0;
#ifndef HAVE_NCCL
  if (m->transport == DCPX_TRANSPORT_NCCL)
    return DCPX_E_TRANSPORT; /* this libdcpx was built without NCCL */
#endif
  __atomic_store_n(&m->health[m->rank].transport, m->transport,
                   __ATOMIC_RELEASE);
  if (m->transport_req == DCPX_TRANSPORT_AUTO && (r = agree(m)) < 0)
    return r;
  cu = calloc(1, sizeof(*cu));
  if (!cu)
    return DCPX_E_NOMEM;
  m->cuda = cu;
  cu->device = m->device;
  int pageable = 0;
  if (cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess,
                             cu->device) != cudaSuccess)
    pageable = 0;
  dcpx__ptr_check_init(&cu->pc, cu->device, pageable, mem_query, NULL);
  {
    const char *e = getenv("DCPX_PTR_CHECK");
    cu->check_ptrs = !(e && e[0] == '0' && !e[1]);
  }
  void *ctl_dev = NULL;
  if (!CUDA_OK(cudaSetDevice(cu->device)) ||
      !DRV_OK(D.ctx_get(&cu->ctx)) || !cu->ctx)
    r = DCPX_E_CUDA;
  if (r == 0)
    r = cuda_map(m, cu, &ctl_dev);
  if (r == 0) {
    kctx_fill(m, cu, (char *)ctl_dev);
    r = kctx_buffers(cu);
  }
  if (r == 0 && m->transport == DCPX_TRANSPORT_NCCL)
    r = nccl_setup(m, cu, nccl_id, nccl_id_len, why, why_len);
  else if (r == 0)
    r = ll_setup(m, cu, gpu);
  if (r < 0)
    dcpx__cuda_fini(m);
  (void)D.ctx_set(prev);
  return r;
}

/* The context of this call's push and merge: k, or kx when the push
 * builds no klist (struct dcpx__cuda). */
static const dcpx_kctx *merge_ctx(const struct dcpx__cuda *cu) {
  return cu->list_push || cu->device_ctx ? &cu->kx : &cu->k;
}

/* Refused, not enqueued, while the group is aborted or this rank FAILED
 * (two loads of the mapped control page, no syscall): such a push must
 * store nothing (docs/PROTOCOL.md 4), and after a refused call the
 * device's stop word may not know yet. dcpx_recover clears both. */
static int push_allowed(const struct dcpx_member *m) {
  if (m->hdr->abort)
    return DCPX_E_ABORTED;
  if (m->health[m->rank].failed)
    return DCPX_E_FAILED;
  return 0;
}

/* Driver calls (D), so that a failure here neither sets nor replaces the
 * runtime's last error, which is the engine's. */
static int cuda_capturing(void *stream) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!stream) /* the legacy stream: a launch under capture fails anyway */
    return 0;
  if (D.stream_capturing((CUstream)stream, &st) != CUDA_SUCCESS)
    return 0; /* not a stream this thread can use: the launch fails and the
                 call is refused; the order check stays on */
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* A refused call of an NCCL member (dcpx__nccl_abort: the ranks'
 * collectives can no longer be matched, and a collective waits without a
 * bound). Nothing for the ll transport, whose waits are bounded. */
static void nccl_refused(struct dcpx_member *m, const char *why) {
#ifdef HAVE_NCCL
  dcpx__nccl_abort(m->cuda->nccl, why);
#else
  (void)m;
  (void)why;
#endif
}

/* A call this rank refused (not enqueued, the rank now FAILED) leaves its
 * epochs a call behind, as a merge that ended early does; that merge sets
 * the device's stop word, which the next push and merge read at their
 * start (a graph replay too, which makes no library call: its merge could
 * otherwise take the complete lists of the call it failed, docs/PROTOCOL.md
 * 6.4). Set it here as well, on the call's stream, so that what the engine
 * enqueues there after this call sees it; dcpx_recover clears it. Not on a
 * stream under capture (the graph would carry the store) or one the
 * thread cannot use; the engine's sticky error is left as it was. The
 * nccl transport aborts its communicator instead. */
static void stop_mirror(struct dcpx_member *m, void *stream) {
  struct dcpx__cuda *cu = m->cuda;
  if (cu->nccl || cuda_capturing(stream))
    return;
  char *stop = cu->k.ws + cu->k.L.off_call + offsetof(dcpx_rank_state, stop);
  /* relaxed: another thread's capture in global mode does not make this
   * thread's store an error (it is not part of that capture); driver
   * calls, which leave the engine's last error as it was */
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (D.capture_mode(&mode) != CUDA_SUCCESS)
    return; /* the thread's mode stays the engine's; no store */
  (void)D.memset32_async((CUdeviceptr)(uintptr_t)stop, 0x01010101u, 1,
                         (CUstream)stream);
  (void)D.capture_mode(&mode);
}

/* A call that was not enqueued and has no reason yet (a kernel launcher
 * or NCCL refused it, or the group stopped it): why, for
 * dcpx_member_last_error. */
static void launch_why(struct dcpx_member *m, const char *fn, int r) {
  if (m->why[0] || r == DCPX_E_ABORTED || r == DCPX_E_FAILED)
    return;
  if (m->cuda->nccl)
    DCPX_REFUSE(m, "%s: group %s rank %u: not enqueued (%s): NCCL did not "
                "take it (DCPX_DEBUG=WARN logs NCCL's reason)",
                fn, m->group, m->rank, dcpx_strerror(r));
  else
    DCPX_REFUSE(m, "%s: group %s rank %u: not enqueued (%s): a NULL or "
                "misaligned array (logits 2-byte, the int32 arrays 4-byte "
                "aligned), or a launch error (DCPX_DEBUG=WARN logs it)",
                fn, m->group, m->rank, dcpx_strerror(r));
}

/* A push's arrays (arrays_ok): the rows' logits and row_ends. */
static int push_arrays_ok(struct dcpx_member *m, const char *fn,
                          const dcpx_call *in) {
  if (!in->rows)
    return 0; /* an empty call touches no array (they may be anything) */
  const call_array a[] = {
      {"logits", in->logits, logits_bytes(in->rows, in->stride)},
      {"row_ends", in->row_ends, 4ull * in->rows},
  };
  return arrays_ok(m, fn, a, sizeof(a) / sizeof(a[0]), m->why,
                   sizeof(m->why));
}

/* The block table's bytes; UINT64_MAX (refused as beyond the address
 * space) when 4 * bt_rows * bt_cols does not fit 64 bits. */
static uint64_t bt_bytes(uint32_t bt_rows, uint32_t bt_cols) {
  const uint64_t e = (uint64_t)bt_rows * bt_cols; /* < 2^64 */
  return e > UINT64_MAX / 4u ? UINT64_MAX : 4u * e;
}

/* A merge's arrays: the push's, the block table and the outputs. */
static int merge_arrays_ok(struct dcpx_member *m, const dcpx_call *in,
                           const dcpx_merge_out *out) {
  const uint64_t rows = in->rows, rk = 4ull * rows * m->shape.topk;
  if (!rows)
    return 0; /* as push_arrays_ok */
  const call_array a[] = {
      {"req_id", in->req_id, 4u * rows},
      {"block_table", in->block_table, bt_bytes(in->bt_rows, in->bt_cols)},
      {"rows_out", out->rows_out, rk},
      {"valid_out", out->valid_out, 4u * rows},
      {"ids_out", out->ids_out, rk},
      {"sat_word", out->sat_word, 4u * rows},
  };
  int r = push_arrays_ok(m, "dcpx_merge", in);
  return r < 0 ? r
               : arrays_ok(m, "dcpx_merge", a, sizeof(a) / sizeof(a[0]),
                           m->why, sizeof(m->why));
}

static int cuda_push(struct dcpx_member *m, const dcpx_call *in,
                     void *stream) {
  int r, refuse = 1;
  m->last_rows = in->rows;
  if ((r = push_allowed(m)) < 0) {
    nccl_refused(m, dcpx_strerror(r));
    return r;
  }
  if (in->rows > m->shape.rows) {
    DCPX_REFUSE(m, "dcpx_push: group %s rank %u: rows %u > the shape's %u",
                m->group, m->rank, in->rows, m->shape.rows);
    r = DCPX_E_RANGE;
    nccl_refused(m, "a push of too many rows");
  } else if ((r = push_arrays_ok(m, "dcpx_push", in)) < 0) {
    nccl_refused(m, "a push whose arrays the GPU cannot use");
  }
#ifdef HAVE_NCCL
  else if (m->cuda->nccl) {
    r = dcpx__nccl_push(m->cuda->nccl, in->rows, in->logits, in->stride,
                        in->row_ends, stream);
    /* the group was aborted while NCCL set its connections up (a peer
     * died): what stopped the group stays its reason, and this rank is
     * not FAILED (docs/PROTOCOL.md 6.4); the communicator is aborted */
    refuse = r != DCPX_E_ABORTED;
  }
#endif
  else {
    m->cuda->list_push = 0;
    r = DCPX_KLOG(dcpx_k_push(merge_ctx(m->cuda), in->rows, in->logits,
                              in->stride, in->row_ends, (cudaStream_t)stream),
                  "dcpx_k_push");
  }
  if (r < 0 && refuse) {
    launch_why(m, "dcpx_push", r);
    dcpx__member_refuse(m); /* the call was not enqueued: peers must know */
    stop_mirror(m, stream);
  } else if (r >= 0)
    m->health[m->rank].last_call_tag = in->call_tag; /* host bookkeeping */
  return r;
}

/* dcpx_push_list's arrays: the lists and row_ends (not the logits). */
static int list_arrays_ok(struct dcpx_member *m, const dcpx_call *in,
                          const dcpx_lists *li) {
  if (!in->rows)
    return 0; /* as push_arrays_ok (li may be NULL) */
  const uint64_t e = (uint64_t)li->rows * li->n;
  const call_array a[] = {
      {"row_ends", in->row_ends, 4ull * in->rows},
      {"lists->values", li->values, 2u * e},
      {"lists->indices", li->indices, 4u * e},
  };
  return arrays_ok(m, "dcpx_push_list", a, sizeof(a) / sizeof(a[0]),
                   m->why, sizeof(m->why));
}

static int cuda_push_list(struct dcpx_member *m, const dcpx_call *in,
                          const dcpx_lists *li, void *stream) {
  struct dcpx__cuda *cu = m->cuda;
  int r;
  if (cu->nccl) { /* nothing done: the rank may push with dcpx_push */
    DCPX_REFUSE(m, "dcpx_push_list: group %s uses the nccl transport, which "
                "dcpx_push_list does not support", m->group);
    return DCPX_E_NOSYS;
  }
  m->last_rows = in->rows;
  if ((r = push_allowed(m)) < 0)
    return r;
  if (in->rows > m->shape.rows) {
    DCPX_REFUSE(m, "dcpx_push_list: group %s rank %u: rows %u > the shape's "
                "%u", m->group, m->rank, in->rows, m->shape.rows);
    r = DCPX_E_RANGE;
  } else if ((r = dcpx__lists_check("dcpx_push_list", li, in->rows,
                                    m->shape.local_topk, m->why,
                                    sizeof(m->why))) == 0 &&
             (r = list_arrays_ok(m, in, li)) == 0) {
    cu->list_push = 1;
    r = DCPX_KLOG(dcpx_k_push_list(&cu->kx, in->rows, li ? li->values : NULL,
                                   li ? li->indices : NULL, in->row_ends,
                                   (cudaStream_t)stream),
                  "dcpx_k_push_list");
  }
  if (r < 0) {
    launch_why(m, "dcpx_push_list", r);
    dcpx__member_refuse(m); /* the call was not enqueued: peers must know */
    stop_mirror(m, stream);
  }
  else
    m->health[m->rank].last_call_tag = in->call_tag; /* host bookkeeping */
  return r;
}

int dcpx__cuda_device_ctx(struct dcpx_member *m, dcpx_device *ret) {
  struct dcpx__cuda *cu = m->cuda;
  if (cu->nccl) {
    DCPX_WARN("dcpx_device_ctx: group %s uses the nccl transport; a "
              "device context needs the ll transport", m->group);
    return DCPX_E_NOSYS;
  }
  cu->device_ctx = 1; /* from now on no merge reads the klist */
  dcpx_k_device(&cu->kx, ret);
  return 0;
}

static int cuda_merge(struct dcpx_member *m, const dcpx_call *in,
                      const dcpx_merge_out *out, void *stream) {
  int r, refuse = 1, shared = 0;
  /* in->call_tag: records carry the device call sequence (layout.h) */
  m->last_rows = in->rows;
  if (in->rows > m->shape.rows) {
    DCPX_REFUSE(m, "dcpx_merge: group %s rank %u: rows %u > the shape's %u",
                m->group, m->rank, in->rows, m->shape.rows);
    r = DCPX_E_RANGE;
    nccl_refused(m, "a merge of too many rows");
  } else if ((r = dcpx__merge_disjoint(m, "dcpx_merge", in, out,
                                       &shared)) < 0) {
    /* with shared, valid_out -1 could land on another array */
    nccl_refused(m, shared ? "a merge whose outputs overlap"
                           : "a merge whose block table does not fit");
  } else if ((r = merge_arrays_ok(m, in, out)) < 0) {
    nccl_refused(m, "a merge whose arrays the GPU cannot use");
  }
#ifdef HAVE_NCCL
  else if (m->cuda->nccl && (r = push_allowed(m)) < 0) {
    /* the ll merge fails its rows on the device; a collective would wait
     * for peers that issue nothing more. Not a refusal of this rank's:
     * the group is aborted or the rank FAILED already, so, as the push
     * here, it leaves the rank's state (and the reason that stopped the
     * group, e.g. a dead peer) as it is; a recovery comes next anyway. */
    nccl_refused(m, dcpx_strerror(r));
    refuse = 0;
  } else if (m->cuda->nccl) {
    r = dcpx__nccl_merge(m->cuda->nccl, in->rows, in->logits, in->stride,
                         in->row_ends, in->req_id, in->block_table,
                         in->bt_rows, in->bt_cols, out->rows_out,
                         out->valid_out, out->ids_out, out->sat_word, stream);
    refuse = r != DCPX_E_ABORTED; /* as in cuda_push */
  }
#endif
  else
    r = DCPX_KLOG(dcpx_k_merge(merge_ctx(m->cuda), in->rows, in->logits,
                               in->stride,
                               in->row_ends, in->req_id, in->block_table,
                               in->bt_rows, in->bt_cols, out->rows_out,
                               out->valid_out, out->ids_out, out->sat_word,
                               (cudaStream_t)stream),
                  "dcpx_k_merge");
  if (r < 0) {
    if (refuse) {
      launch_why(m, "dcpx_merge", r);
      dcpx__member_refuse(m); /* the call was not enqueued: peers must know */
      stop_mirror(m, stream);
    }
    /* valid_out -1 on the rows it can hold, in stream order (best effort:
     * after a launch error the stream may refuse this too) */
    const uint32_t n = in->rows < m->shape.rows ? in->rows : m->shape.rows;
    const call_array vo = {"valid_out", out->valid_out, 4ull * n};
    if (out->valid_out && n && !shared &&
        arrays_ok(m, "dcpx_merge", &vo, 1, NULL, 0) == 0)
      (void)D.memset32_async((CUdeviceptr)(uintptr_t)out->valid_out,
                             0xFFFFFFFFu, n, (CUstream)stream);
  }
  return r;
}

/* Drains the stream, but never for longer than timeout_ms: an NCCL
 * collective whose peer died can wait forever (it has no timeout of its
 * own over P2P), and recovery must not hang on it. */
static int cuda_sync(const struct dcpx_member *m, void *stream,
                     uint32_t timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const uint64_t end_ns = (uint64_t)ts.tv_sec * 1000000000ull +
                          (uint64_t)ts.tv_nsec + timeout_ms * 1000000ull;
  for (;;) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    if (e == cudaSuccess)
      return 0;
    if (e != cudaErrorNotReady) {
      CUDA_OK(e); /* logs cudaStreamQuery's error */
      return DCPX_E_CUDA;
    }
    if (m && dcpx__member_interrupted(m))
      return DCPX_E_INTR;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock, not a count of
                                            sleeps, which overrun */
    if ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec >= end_ns) {
      DCPX_WARN("stream still busy after %u ms (a collective whose peer "
                "died?)", timeout_ms);
      return DCPX_E_TIMEDOUT;
    }
    usleep(100);
  }
}

/* Each call runs with the member's device's context current on the
 * calling thread and gives the caller's back (none included): a thread
 * whose current context is another GPU's, or none (a new thread starts on
 * device 0), would launch the kernels there, where the workspaces are not
 * mapped, and with the legacy or per-thread stream it would not even be
 * refused. Two driver calls on thread state when the context differs, one
 * when not: no syscall, legal under capture. */
static CUcontext ctx_enter(const struct dcpx__cuda *cu) {
  CUcontext cur = NULL;
  if (D.ctx_get(&cur) != CUDA_SUCCESS || cur == cu->ctx)
    return cu->ctx;
  (void)D.ctx_set(cu->ctx); /* if it failed, the launch says so */
  return cur;
}

static void ctx_leave(const struct dcpx__cuda *cu, CUcontext prev) {
  if (prev != cu->ctx)
    (void)D.ctx_set(prev);
}

/* Outside the backend's calls (a bad struct, client.c): ncclCommAbort
 * makes CUDA calls, so it too runs in the member's context. */
void dcpx__cuda_refused(struct dcpx_member *m, void *stream,
                        const char *why) {
  const CUcontext prev = ctx_enter(m->cuda);
  nccl_refused(m, why);
  stop_mirror(m, stream);
  ctx_leave(m->cuda, prev);
}

int dcpx__cuda_capturing(struct dcpx_member *m, void *stream) {
  const CUcontext prev = ctx_enter(m->cuda);
  const int r = cuda_capturing(stream);
  ctx_leave(m->cuda, prev);
  return r;
}

int dcpx__cuda_push(struct dcpx_member *m, const dcpx_call *in,
                    void *stream) {
  const CUcontext prev = ctx_enter(m->cuda);
  const int r = cuda_push(m, in, stream);
  ctx_leave(m->cuda, prev);
  return r;
}

int dcpx__cuda_push_list(struct dcpx_member *m, const dcpx_call *in,
                         const dcpx_lists *li, void *stream) {
  const CUcontext prev = ctx_enter(m->cuda);
  const int r = cuda_push_list(m, in, li, stream);
  ctx_leave(m->cuda, prev);
  return r;
}

int dcpx__cuda_merge(struct dcpx_member *m, const dcpx_call *in,
                     const dcpx_merge_out *out, void *stream) {
  const CUcontext prev = ctx_enter(m->cuda);
  const int r = cuda_merge(m, in, out, stream);
  ctx_leave(m->cuda, prev);
  return r;
}

int dcpx__cuda_nccl_id(struct dcpx_member *m, uint32_t gen, uint8_t *out,
                       size_t cap, size_t *ret_len) {
#ifdef HAVE_NCCL
  struct dcpx__cuda *cu = m->cuda;
  if (cu->nccl && m->rank == 0) {
    /* One id per generation acknowledged: every ncclGetUniqueId starts a
     * bootstrap root thread that listens until W ranks check in, so a new
     * id for each re-ack (a reattach, a stale-generation reply, a
     * dcpx_recover called again after a timeout) would leave a thread and
     * a listening socket behind for each id no communicator used. An id
     * sent for gen is used only once gen's recovery completes, and every
     * later ack is for a later generation. */
    /* ... and never an id a generation already runs on: the control
     * page's id of the current generation (a replacement rank 0 whose
     * join id the recovery it joined into published, while it read the
     * group as still recovering). */
    uint8_t used[DCPX_NCCL_ID_BYTES];
    const size_t ul = ctl_nccl_id(
        m, __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE), used);
    const int spent = cu->ack_id_len && ul == cu->ack_id_len &&
                      memcmp(used, cu->ack_id, ul) == 0;
    if (!cu->ack_id_len || cu->ack_id_gen != gen || spent) {
      size_t len = 0;
      const int r = dcpx__nccl_unique_id(cu->ack_id, sizeof(cu->ack_id),
                                         &len);
      if (r < 0) {
        cu->ack_id_len = 0;
        return r;
      }
      cu->ack_id_len = len;
      cu->ack_id_gen = gen;
    }
    if (cap < cu->ack_id_len)
      return DCPX_E_RANGE;
    memcpy(out, cu->ack_id, cu->ack_id_len);
    *ret_len = cu->ack_id_len;
    return 0;
  }
#else
  (void)gen;
  (void)out;
  (void)cap;
  (void)ret_len;
#endif
  (void)m;
  return DCPX_E_NOSYS;
}

int dcpx__cuda_recovered(struct dcpx_member *m) {
#ifdef HAVE_NCCL
  struct dcpx__cuda *cu = m->cuda;
  uint8_t id[DCPX_NCCL_ID_BYTES];
  char why[256] = "";
  if (!cu->nccl)
    return 0;
  const uint32_t gen = __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE);
  if (dcpx__nccl_gen(cu->nccl) == gen)
    return 0; /* made for this generation */
  const size_t len = ctl_nccl_id(m, gen, id);
  int r = DCPX_E_NCCL;
  if (!len) {
    /* Not failed: no recovery would bring an id (a dcpxd or rank 0 that
     * predates them), so aborting the group again would only repeat. */
    DCPX_WARN("group %s rank %u: no NCCL unique id from rank 0 for "
              "generation %u (a dcpxd or rank 0 that predates them): the "
              "member's calls fail with DCPX_E_NCCL until dcpx_leave",
              m->group, m->rank, gen);
    return DCPX_E_NCCL;
  } else {
    const CUcontext prev = ctx_enter(cu);
    r = dcpx__nccl_rebuild(cu->nccl, id, len, gen, why, sizeof(why));
    ctx_leave(cu, prev);
    if (r < 0)
      DCPX_WARN("group %s rank %u: no new NCCL communicator for generation "
                "%u: %s (%s)", m->group, m->rank, gen, why[0] ? why : "-",
                dcpx_strerror(r));
  }
  if (r < 0) {
    /* This generation's communicators cannot form without this rank: it
     * fails, so dcpxd aborts the group, and the next dcpx_recover of
     * every rank makes them from a fresh id of rank 0's. Not when the
     * group was aborted meanwhile (a peer died or failed during the
     * setup, the setup's wait said so): it recovers anyway, and this
     * rank's FAILED would read as a timeout of its own
     * (dcpx_member_async_error), not the abort's reason. */
    if (!__atomic_load_n(&m->hdr->abort, __ATOMIC_ACQUIRE))
      dcpx__member_fail(m);
    return DCPX_E_NCCL;
  }
  return 0;
#else
  (void)m;
  return 0;
#endif
}

/* dcpx_recover's drain. An NCCL member of a group being recovered (or a
 * failed one) aborts its communicator first: a collective whose peer died
 * waits without a bound, and after an abort the ranks' collectives can no
 * longer be matched anyway (dcpx__cuda_recovered makes a new one once the
 * group runs again). */
int dcpx__cuda_sync(struct dcpx_member *m, void *stream, uint32_t timeout_ms) {
  const CUcontext prev = ctx_enter(m->cuda);
  if (m->cuda->nccl && dcpx__member_needs_recovery(m))
    nccl_refused(m, "the group is being recovered");
  const int r = cuda_sync(m, stream, timeout_ms);
  ctx_leave(m->cuda, prev);
  return r;
}
