/* dcpxd-mem.h - the memory behind a group: one buffer per rank workspace
 * and one for the control page, each exported to clients as a file
 * descriptor.
 *
 * A backend is a table of operations (NCCL-transport style: one backend,
 * one file). The host backend (dcpxd-mem.c) hands out sealed memfds; the
 * CUDA backend (dcpxd-mem-cuda.c) allocates with cuMemCreate on the rank's
 * device and exports a POSIX fd. The group code only ever sees
 * this interface:
 *
 *   alloc  a buffer of `bytes` on `device`, zero-filled, with an fd that
 *          can be passed by SCM_RIGHTS;
 *   zero   fill it with zeros again; may run on a libuv worker thread, and
 *          is only called while no client touches the buffer (every rank
 *          drained and acknowledged, docs/PROTOCOL.md section 6);
 *   map    (host memory only) map it read-write into the daemon;
 *   free   release it (the fd is closed; clients keep their own mapping);
 *   device_of_uuid  (may be NULL: the backend has no devices) this
 *          daemon's ordinal of the GPU whose 16-byte UUID is given, or
 *          DCPX_E_NOENT when it sees no such GPU;
 *   adopt  (may be NULL: not supported) take over a buffer that a client
 *          hands back after a daemon restart (its fd, passed by
 *          SCM_RIGHTS): check that it is one this backend could have made,
 *          of exactly `bytes`, and wrap it; on failure *ret_why says why
 *          in words. The fd becomes the buffer's, also on failure (closed
 *          through dcpxd_closer_close). Nothing here may wait on a file
 *          system: the fd is any a client sent (a FUSE file's fstat waits
 *          on its server);
 *   warm   (may be NULL: nothing to do) make `device` ready for zero(), so
 *          that the first recovery after an adoption does not pay for it
 *          (CUDA: the device's primary context, about 0.1 s); may block,
 *          so it runs on a libuv worker thread, where it must not log
 *          (dcpxd-log.c is the loop thread's: its rate limiter and timer
 *          take no lock); best effort: 0, or a code that the caller logs
 *          back on the loop thread.
 */
#ifndef DCPXD_MEM_H
#define DCPXD_MEM_H

#include <stdbool.h>
#include <stdint.h>

typedef struct dcpxd_buf dcpxd_buf;

typedef struct dcpxd_mem_ops {
  const char *name;
  int (*alloc)(int device, uint64_t bytes, const char *label, dcpxd_buf **ret);
  int (*zero)(dcpxd_buf *b);
  int (*map)(dcpxd_buf *b, void **ret); /* NULL: not host-mappable */
  void (*free)(dcpxd_buf *b);
  int (*adopt)(int fd, uint64_t bytes, int device, dcpxd_buf **ret,
               const char **ret_why);
  int (*device_of_uuid)(const uint8_t *uuid, int *ret_device);
  int (*warm)(int device);
} dcpxd_mem_ops;

struct dcpxd_buf {
  const dcpxd_mem_ops *ops;
  int fd;         /* exported handle; owned by the buffer */
  uint64_t bytes; /* as asked */
  int device;     /* -1 for host memory */
  void *map;      /* the daemon's mapping, if map() was called */
  void *priv;     /* backend's own state */
};

/* The host backend: memfd, sealed against resizing. Always built. */
extern const dcpxd_mem_ops dcpxd_mem_host;


/* Whether two host buffers are one memfd (one file, as fstat says): the
 * memory of an adopted group must be W + 1 buffers, not one twice. False
 * when either is not host memory. */
bool dcpxd_buf_same(const dcpxd_buf *a, const dcpxd_buf *b);

/* Whether fd, which a client sent, is the host buffer b's memfd: without
 * a call into the fd's file system unless it is a memfd (F_GET_SEALS
 * first). */
bool dcpxd_buf_is_fd(const dcpxd_buf *b, int fd);

#ifdef HAVE_CUDA
/* The CUDA backend: VMM allocations exported as POSIX fds
 * (dcpxd-mem-cuda.c). */
extern const dcpxd_mem_ops dcpxd_mem_cuda;
#endif

/* The backend for a Join's Backend value (dcpx.proto), or NULL with
 * *ret_why set when this build lacks it. */
const dcpxd_mem_ops *dcpxd_mem_backend(int backend, const char **ret_why);

static inline int dcpxd_buf_alloc(const dcpxd_mem_ops *ops, int device,
                                  uint64_t bytes, const char *label,
                                  dcpxd_buf **ret) {
  return ops->alloc(device, bytes, label, ret);
}
static inline int dcpxd_buf_zero(dcpxd_buf *b) { return b->ops->zero(b); }
/* DCPX_E_NOSYS when the backend cannot adopt memory. Consumes fd. On
 * failure *ret_why says why in words. */
int dcpxd_buf_adopt(const dcpxd_mem_ops *ops, int fd, uint64_t bytes,
                    int device, dcpxd_buf **ret, const char **ret_why);
/* Accepts NULL; returns NULL for `p = dcpxd_buf_free(p)`. */
static inline dcpxd_buf *dcpxd_buf_free(dcpxd_buf *b) {
  if (b)
    b->ops->free(b);
  return NULL;
}

#endif /* DCPXD_MEM_H */
