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
 * adopt() is the way back after a daemon restart (docs/ARCHITECTURE.md,
 * "Daemon restart"): a client returns the fds it was given. Only what
 * host_alloc makes is accepted: a memfd with the seals it sets (against
 * shrinking, growing and more seals; none against writing), open for
 * reading and writing, of exactly the expected size. The daemon maps the
 * control page and must never fault on it, and zeroes the workspaces at
 * every recovery, whoever sent the fds (a read-only fd, or one sealed
 * against writing, made every recovery of the group fail). The seals are
 * read first: F_GET_SEALS answers for a memfd alone and calls into no
 * file system, where an fstat of a FUSE file waits on its server.
 *
 * zero() writes zeros through a mapping rather than punching a hole: a
 * client that registered the pages for device access holds them pinned,
 * and after a hole punch its device mapping would keep the old pages while
 * its CPU mapping got new zero pages. It writes only where the memfd has
 * pages (SEEK_DATA / SEEK_HOLE: resident or swapped), since the rest
 * reads as zeros already: a recovery must not commit every page of a
 * workspace (4.4 GB each at the largest shape) that the calls never
 * touched.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcpx.h"
#include "dcpxd-closer.h"
#include "dcpxd-mem.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* The seals of every host buffer (host_alloc), and so of an adopted one. */
#define HOST_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)


#include "dcpxd-util.h"
#include "proto/dcpx.pb-c.h"

/* A host buffer of the memfd *fd (taken: -1 after), bytes long. */
static int host_buf_new(int *fd, uint64_t bytes, int device,
                        dcpxd_buf **ret) {
  dcpxd_buf *b = calloc(1, sizeof(*b));
  if (!b)
    return -ENOMEM;
  b->ops = &dcpxd_mem_host;
  b->fd = TAKE_FD(*fd);
  b->bytes = bytes;
  b->device = device;
  *ret = b;
  return 0;
}

static int host_alloc(int device, uint64_t bytes, const char *label,
                      dcpxd_buf **ret) {
  _cleanup_close_ int fd = -1;

  if (bytes == 0 || bytes > (uint64_t)INT64_MAX)
    return -EINVAL;
  fd = memfd_create(label ? label : "dcpx", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return -errno;
  if (ftruncate(fd, (off_t)bytes) < 0)
    return -errno;
  if (fcntl(fd, F_ADD_SEALS, HOST_SEALS) < 0)
    return -errno;
  return host_buf_new(&fd, bytes, device, ret);
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

/* Zeros into p[0, bytes) where fd has pages; all of it when the file
 * system cannot say where (SEEK_DATA unsupported). */
static void zero_data(int fd, char *p, off_t bytes) {
  off_t off = 0;
  while (off < bytes) {
    const off_t d = lseek(fd, off, SEEK_DATA);
    if (d < 0 && errno == ENXIO)
      return; /* only holes past off */
    if (d < 0) {
      memset(p + off, 0, (size_t)(bytes - off));
      return;
    }
    off_t h = lseek(fd, d, SEEK_HOLE);
    if (h < 0 || h > bytes)
      h = bytes;
    memset(p + d, 0, (size_t)(h - d));
    off = h;
  }
}

static int host_zero(dcpxd_buf *b) {
  void *p;

  if (b->map) {
    zero_data(b->fd, b->map, (off_t)b->bytes);
    return 0;
  }
  p = mmap(NULL, (size_t)b->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd,
           0);
  if (p == MAP_FAILED)
    return -errno;
  zero_data(b->fd, p, (off_t)b->bytes);
  munmap(p, (size_t)b->bytes);
  return 0;
}

static void host_free(dcpxd_buf *b) {
  if (b->map)
    munmap(b->map, (size_t)b->bytes);
  dcpxd_closer_close_own(b->fd); /* the last reference frees the pages */
  free(b);
}

/* Whether fd is a memfd as host_alloc makes them (HOST_SEALS, no seal
 * against writing), open for reading and writing: 0, or a code with
 * *ret_why. Calls into no file system (F_GET_SEALS answers for a memfd
 * alone). */
static int host_memfd_ok(int fd, const char **ret_why) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & HOST_SEALS) != HOST_SEALS) {
    *ret_why = "not a memfd sealed against shrinking, growing and more "
               "seals, as dcpxd makes them";
    return DCPX_E_PERM;
  }
  if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
    *ret_why = "a memfd sealed against writing (dcpxd could not zero it)";
    return DCPX_E_PERM;
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != O_RDWR) {
    *ret_why = "not open for reading and writing";
    return DCPX_E_ACCES;
  }
  return 0;
}

static int host_adopt(int fd, uint64_t bytes, int device, dcpxd_buf **ret,
                      const char **ret_why) {
  struct stat st;
  int r = host_memfd_ok(fd, ret_why);

  if (r == 0 && fstat(fd, &st) < 0) { /* a memfd: no file system waits */
    *ret_why = "fstat failed";
    r = -errno;
  } else if (r == 0 && (!S_ISREG(st.st_mode) ||
                        (uint64_t)st.st_size != bytes)) {
    *ret_why = "a memfd of another size";
    r = DCPX_E_SHAPE; /* not the buffer of this shape */
  }
  if (r == 0 && (r = host_buf_new(&fd, bytes, device, ret)) < 0)
    *ret_why = "out of memory";
  if (r < 0)
    dcpxd_closer_close(fd);
  return r;
}

/* fstat of a host buffer's fd (a memfd: it waits on no file system). */
static bool host_stat(const dcpxd_buf *b, struct stat *st) {
  return b && b->ops == &dcpxd_mem_host && b->fd >= 0 && fstat(b->fd, st) == 0;
}

bool dcpxd_buf_same(const dcpxd_buf *a, const dcpxd_buf *b) {
  struct stat x, y;
  return host_stat(a, &x) && host_stat(b, &y) && x.st_dev == y.st_dev &&
         x.st_ino == y.st_ino;
}

bool dcpxd_buf_is_fd(const dcpxd_buf *b, int fd) {
  struct stat x, y;
  return fcntl(fd, F_GET_SEALS) >= 0 && host_stat(b, &x) &&
         fstat(fd, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

const dcpxd_mem_ops dcpxd_mem_host = {
    .name = "host",
    .alloc = host_alloc,
    .zero = host_zero,
    .map = host_map,
    .free = host_free,
    .adopt = host_adopt,
};

int dcpxd_buf_adopt(const dcpxd_mem_ops *ops, int fd, uint64_t bytes,
                    int device, dcpxd_buf **ret, const char **ret_why) {
  if (!ops->adopt) {
    dcpxd_closer_close(fd);
    *ret_why = "this backend cannot adopt memory";
    return DCPX_E_NOSYS;
  }
  return ops->adopt(fd, bytes, device, ret, ret_why);
}

const dcpxd_mem_ops *dcpxd_mem_backend(int backend, const char **ret_why) {
  switch (backend) {
  case DCPX__BACKEND__BACKEND_HOST:
    return &dcpxd_mem_host;
  case DCPX__BACKEND__BACKEND_CUDA:
#ifdef HAVE_CUDA
    return &dcpxd_mem_cuda; /* dcpxd-mem-cuda.c */
#else
    *ret_why = "CUDA backend not built";
    return NULL;
#endif
  default:
    *ret_why = "unknown backend";
    return NULL;
  }
}
