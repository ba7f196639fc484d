/* dcpxd-mem-cuda.c - the CUDA memory backend: one VMM allocation per rank
 * workspace, on that rank's device, exported as a POSIX fd.
 *
 * Why VMM (cuMemCreate) rather than cudaMalloc + IPC handles: the handle is
 * a plain file descriptor, so it rides SCM_RIGHTS like the host backend's
 * memfds, dies with its last reference, and can be handed back to a
 * restarted daemon (adopt). Where the device reports fabric handle support
 * and a probe allocation with it succeeds, allocations also carry the
 * fabric handle type (for multi-node NVLink); otherwise POSIX fds only.
 *
 * Sizes are rounded up to the allocation granularity. Clients compute the
 * same rounding from the imported handle's properties, so the protocol
 * keeps carrying the layout's unrounded ws_bytes.
 *
 * The driver API is reached through cudaGetDriverEntryPointByVersion: the
 * daemon links only the static CUDA runtime, so the same binary starts (and
 * serves host-backend groups) on machines with no NVIDIA driver; a CUDA
 * join there gets DCPX_E_CUDA.
 *
 * zero() maps the allocation into the daemon (reserve, map, set access for
 * its device) and runs cudaMemset on it, on the libuv worker thread that
 * calls it; the primary context of the device is made current there.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_drv.h"
#include "dcpx.h"
#include "dcpxd-log.h"
#include "dcpxd-closer.h"
#include "dcpxd-mem.h"

static dcpx_cuda_drv D; /* common/cuda_drv.h */
static int D_status = 1; /* 1: not loaded, 0: loaded, < 0: unavailable */
static pthread_once_t D_once = PTHREAD_ONCE_INIT;

static void drv_load_once(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    D_status = DCPX_E_CUDA;
    return;
  }
  D_status = dcpx__cuda_drv_load(&D, NULL);
}

static int drv_get(void) {
  pthread_once(&D_once, drv_load_once);
  return D_status;
}

typedef struct cuda_priv {
  CUmemGenericAllocationHandle h;
  size_t size; /* rounded to the granularity */
} cuda_priv;

static void prop_init(CUmemAllocationProp *p, int device,
                      CUmemAllocationHandleType types) {
  memset(p, 0, sizeof(*p));
  p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->location.id = device;
  p->requestedHandleTypes = types;
}

static size_t round_up(size_t x, size_t g) { return (x + g - 1) / g * g; }

/* POSIX fd, plus fabric where the device has it and a probe works. */
static CUmemAllocationHandleType handle_types(int device) {
  static int fabric_ok[64]; /* 0 unknown, 1 yes, -1 no */
  CUmemAllocationHandleType fd = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemAllocationHandleType both =
      (CUmemAllocationHandleType)(fd | CU_MEM_HANDLE_TYPE_FABRIC);
  if (device < 0 || device >= 64)
    return fd;
  if (!fabric_ok[device]) {
    int sup = 0;
    CUmemAllocationProp p;
    size_t g = 0;
    CUmemGenericAllocationHandle h;
    fabric_ok[device] = -1;
    if (D.attr(&sup, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
               device) == CUDA_SUCCESS &&
        sup) {
      prop_init(&p, device, both);
      if (D.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
              CUDA_SUCCESS &&
          D.mem_create(&h, g, &p, 0) == CUDA_SUCCESS) {
        D.release(h);
        fabric_ok[device] = 1;
      }
    }
    log_info("device %d: workspace handles: POSIX fd%s", device,
             fabric_ok[device] > 0 ? " + fabric" : " (fabric probe failed)");
  }
  return fabric_ok[device] > 0 ? both : fd;
}

static int cuda_zero(dcpxd_buf *b);

/* The buffer of allocation h (size bytes, rounded; `bytes` as asked) on
 * `device`, exported as fd; on failure h is released and fd closed. */
static int cuda_wrap(CUmemGenericAllocationHandle h, size_t size, int fd,
                     uint64_t bytes, int device, dcpxd_buf **ret) {
  cuda_priv *pv = calloc(1, sizeof(*pv));
  dcpxd_buf *b = calloc(1, sizeof(*b));
  if (!pv || !b) {
    free(pv);
    free(b);
    close(fd);
    D.release(h);
    return -ENOMEM;
  }
  pv->h = h;
  pv->size = size;
  b->ops = &dcpxd_mem_cuda;
  b->fd = fd;
  b->bytes = bytes;
  b->device = device;
  b->priv = pv;
  *ret = b;
  return 0;
}

/* The device's primary context made current on this thread (created on
 * its first use in the process: about 0.1 s on an H200). */
static int cuda_current(int device) {
  return cudaSetDevice(device) == cudaSuccess && cudaFree(NULL) == cudaSuccess
             ? 0
             : DCPX_E_CUDA;
}

static int cuda_alloc(int device, uint64_t bytes, const char *label,
                      dcpxd_buf **ret) {
  CUmemAllocationProp p;
  CUmemGenericAllocationHandle h;
  dcpxd_buf *b;
  size_t g = 0;
  int fd = -1, r;
  (void)label;

  r = drv_get();
  if (r < 0)
    return r;
  if (device < 0 || bytes == 0)
    return DCPX_E_INVAL;
  /* The driver needs a context on this thread for some of the calls. */
  if (cuda_current(device) < 0)
    return DCPX_E_CUDA;
  prop_init(&p, device, handle_types(device));
  if (D.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
    return DCPX_E_CUDA;
  size_t size = round_up((size_t)bytes, g);
  if (D.mem_create(&h, size, &p, 0) != CUDA_SUCCESS)
    return DCPX_E_NOMEM;
  if (D.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
      CUDA_SUCCESS) {
    D.release(h);
    return DCPX_E_CUDA;
  }
  r = cuda_wrap(h, size, fd, bytes, device, &b);
  if (r < 0)
    return r;
  /* cuMemCreate does not promise zeroed memory; the protocol needs it. */
  r = cuda_zero(b);
  if (r < 0) {
    dcpxd_mem_cuda.free(b);
    return r;
  }
  *ret = b;
  return 0;
}

static int cuda_zero(dcpxd_buf *b) {
  cuda_priv *pv = b->priv;
  CUdeviceptr va = 0;
  CUmemAccessDesc acc;
  int r = 0;

  if (cuda_current(b->device) < 0)
    return DCPX_E_CUDA;
  if (D.reserve(&va, pv->size, 0, 0, 0) != CUDA_SUCCESS)
    return DCPX_E_CUDA;
  if (D.map(va, pv->size, 0, pv->h, 0) != CUDA_SUCCESS) {
    D.addr_free(va, pv->size);
    return DCPX_E_CUDA;
  }
  memset(&acc, 0, sizeof(acc));
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = b->device;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (D.set_access(va, pv->size, &acc, 1) != CUDA_SUCCESS ||
      cudaMemset((void *)(uintptr_t)va, 0, pv->size) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess)
    r = DCPX_E_CUDA;
  D.unmap(va, pv->size);
  D.addr_free(va, pv->size);
  return r;
}

static void cuda_free(dcpxd_buf *b) {
  cuda_priv *pv = b->priv;
  if (pv) {
    D.release(pv->h);
    free(pv);
  }
  dcpxd_closer_close_own(b->fd);
  free(b);
}

static int cuda_adopt(int fd, uint64_t bytes, int device, dcpxd_buf **ret,
                      const char **ret_why) {
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp p;
  size_t g = 0;
  int r = drv_get();

  if (r < 0) {
    dcpxd_closer_close(fd);
    *ret_why = "the CUDA driver is not available";
    return r;
  }
  if (D.import_fd(&h, (void *)(uintptr_t)fd,
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS) {
    dcpxd_closer_close(fd);
    *ret_why = "not a CUDA allocation handle";
    return DCPX_E_PERM;
  }
  if (D.props(&p, h) != CUDA_SUCCESS ||
      p.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      (device >= 0 && p.location.id != device) ||
      D.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
          CUDA_SUCCESS) {
    D.release(h);
    dcpxd_closer_close(fd);
    *ret_why = "not a device allocation on the rank's GPU";
    return DCPX_E_SHAPE;
  }
  r = cuda_wrap(h, round_up((size_t)bytes, g), fd, bytes, p.location.id,
                ret);
  if (r < 0)
    *ret_why = "out of memory";
  return r;
}

/* An adopted group's device, before its first recovery: its context. On
 * a worker thread, so it does not log (dcpxd-mem.h): the caller does. */
static int cuda_warm(int device) {
  return drv_get() == 0 ? cuda_current(device) : 0;
}

/* This daemon's ordinal of the GPU with that UUID: the ranks' ordinals
 * are theirs (their CUDA_VISIBLE_DEVICES), the UUID is the GPU's. A scan
 * of a few driver queries per join; no context is made. */
static int cuda_device_of_uuid(const uint8_t *uuid, int *ret_device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n < 1))
    return DCPX_E_NOENT; /* we see no GPU at all */
  if (e != cudaSuccess || drv_get() < 0)
    return DCPX_E_CUDA;
  for (int d = 0; d < n; d++) {
    CUuuid u;
    if (D.uuid(&u, (CUdevice)d) == CUDA_SUCCESS &&
        memcmp(u.bytes, uuid, sizeof(u.bytes)) == 0) {
      *ret_device = d;
      return 0;
    }
  }
  return DCPX_E_NOENT;
}

const dcpxd_mem_ops dcpxd_mem_cuda = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .zero = cuda_zero,
    .map = NULL,
    .free = cuda_free,
    .adopt = cuda_adopt,
    .device_of_uuid = cuda_device_of_uuid,
    .warm = cuda_warm,
};
