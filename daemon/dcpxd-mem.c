/* dcpxd-mem.c - the host memory backend: one memfd per buffer.
 *
 * Why memfd: it is anonymous shared memory with an fd, so SCM_RIGHTS hands
 * it to every rank process, each maps it MAP_SHARED, and (CUDA engines on
 * a host-backend group) may cudaHostRegister it. It needs no name in
 * /dev/shm and dies with its last reference.
 *
 * Every buffer is sealed against shrinking and growing (F_SEAL_SHRINK,
 * F_SEAL_GROW, then F_SEAL_SEAL): the daemon maps the control page and
 * zeroes workspaces, and a client that truncated its copy of the fd would
 * otherwise make the daemon fault (SIGBUS) on the next access.
 *
 * zero() writes zeros through a temporary mapping rather than punching a
 * hole: a client that registered the pages for device access holds them
 * pinned, and after a hole punch its device mapping would keep the old
 * pages while its CPU mapping got new zero pages.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dcpx.h"
#include "dcpxd-mem.h"
#include "dcpxd-util.h"
#include "proto/dcpx.pb-c.h"

static int host_alloc(int device, uint64_t bytes, const char *label,
                      dcpxd_buf **ret) {
  _cleanup_close_ int fd = -1;
  dcpxd_buf *b;

  if (bytes == 0 || bytes > (uint64_t)INT64_MAX)
    return -EINVAL;
  fd = memfd_create(label ? label : "dcpx", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return -errno;
  if (ftruncate(fd, (off_t)bytes) < 0)
    return -errno;
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
    return -errno;
  b = calloc(1, sizeof(*b));
  if (!b)
    return -ENOMEM;
  b->ops = &dcpxd_mem_host;
  b->fd = TAKE_FD(fd);
  b->bytes = bytes;
  b->device = device;
  *ret = b;
  return 0;
}

static int host_map(dcpxd_buf *b, void **ret) {
  if (!b->map) {
    void *p = mmap(NULL, (size_t)b->bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   b->fd, 0);
    if (p == MAP_FAILED)
      return -errno;
    b->map = p;
  }
  *ret = b->map;
  return 0;
}

static int host_zero(dcpxd_buf *b) {
  void *p;

  if (b->map) {
    memset(b->map, 0, (size_t)b->bytes);
    return 0;
  }
  p = mmap(NULL, (size_t)b->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd,
           0);
  if (p == MAP_FAILED)
    return -errno;
  memset(p, 0, (size_t)b->bytes);
  munmap(p, (size_t)b->bytes);
  return 0;
}

static void host_free(dcpxd_buf *b) {
  if (b->map)
    munmap(b->map, (size_t)b->bytes);
  if (b->fd >= 0)
    close(b->fd);
  free(b);
}

const dcpxd_mem_ops dcpxd_mem_host = {
    .name = "host",
    .alloc = host_alloc,
    .zero = host_zero,
    .map = host_map,
    .free = host_free,
};

const dcpxd_mem_ops *dcpxd_mem_backend(int backend, const char **ret_why) {
  switch (backend) {
  case DCPX__BACKEND__BACKEND_HOST:
    return &dcpxd_mem_host;
  case DCPX__BACKEND__BACKEND_CUDA:
    /* dcpxd-mem-cuda.c: cuMemCreate + cuMemExportToShareableHandle
     * (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). */
    *ret_why = "CUDA backend not built";
    return NULL;
  default:
    *ret_why = "unknown backend";
    return NULL;
  }
}
