/* frame.c - framing of dcpx messages over SOCK_SEQPACKET (see frame.h). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcpx.h"
#include "frame.h"

int dcpx__frame_send(int sock, const Dcpx__Frame *f, const int *fds,
                     int nfds) {
  size_t len = dcpx__frame__get_packed_size(f);
  uint8_t *buf;
  struct msghdr mh;
  struct iovec iov;
  union {
    char buf[CMSG_SPACE(sizeof(int) * DCPX_FRAME_MAX_FDS)];
    struct cmsghdr align;
  } ctl;
  ssize_t n;

  if (len > DCPX_FRAME_MAX)
    return DCPX_E_MSGSIZE;
  if (nfds < 0 || nfds > DCPX_FRAME_MAX_FDS || (nfds && !fds))
    return DCPX_E_INVAL;
  buf = malloc(len ? len : 1);
  if (!buf)
    return DCPX_E_NOMEM;
  dcpx__frame__pack(f, buf);

  memset(&mh, 0, sizeof(mh));
  iov.iov_base = buf;
  iov.iov_len = len;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds) {
    struct cmsghdr *c;
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  do
    n = sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  free(buf);
  if (n < 0)
    return -errno;
  return (size_t)n == len ? 0 : DCPX_E_IO;
}

int dcpx__frame_recv(int sock, Dcpx__Frame **ret_frame, int *fds, int maxfds,
                     int *ret_nfds) {
  struct msghdr mh;
  struct iovec iov;
  union {
    char buf[CMSG_SPACE(sizeof(int) * DCPX_FRAME_MAX_FDS)];
    struct cmsghdr align;
  } ctl;
  uint8_t *buf;
  ssize_t n;
  int got = 0, r = 0;
  Dcpx__Frame *f;

  /* One byte more than the limit, so an oversized packet shows as such
   * even on kernels that do not report MSG_TRUNC. */
  buf = malloc(DCPX_FRAME_MAX + 1);
  if (!buf)
    return DCPX_E_NOMEM;
  memset(&mh, 0, sizeof(mh));
  iov.iov_base = buf;
  iov.iov_len = DCPX_FRAME_MAX + 1;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl.buf;
  mh.msg_controllen = sizeof(ctl.buf);
  do
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    r = (errno == EAGAIN || errno == EWOULDBLOCK) ? -EAGAIN : -errno;
    if (r == -ECONNRESET)
      r = DCPX_E_CONNRESET;
    free(buf);
    return r;
  }

  /* Take the descriptors first, so that none leaks on any error path. */
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fds && got < maxfds)
        fds[got++] = fd;
      else
        close(fd);
    }
  }
  if (n == 0) {
    r = DCPX_E_CONNRESET;
    goto fail;
  }
  if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n > DCPX_FRAME_MAX) {
    r = DCPX_E_MSGSIZE;
    goto fail;
  }
  f = dcpx__frame__unpack(NULL, (size_t)n, buf);
  if (!f) {
    r = DCPX_E_PROTO;
    goto fail;
  }
  if (f->msg_case == DCPX__FRAME__MSG__NOT_SET) {
    dcpx__frame__free_unpacked(f, NULL);
    r = DCPX_E_PROTO;
    goto fail;
  }
  free(buf);
  *ret_frame = f;
  if (ret_nfds)
    *ret_nfds = got;
  return 0;

fail:
  for (int i = 0; i < got; i++)
    close(fds[i]);
  free(buf);
  return r;
}

void dcpx__frame_free(Dcpx__Frame *f) {
  if (f)
    dcpx__frame__free_unpacked(f, NULL);
}

int dcpx__send_reply(int sock, int status, const char *error) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__Reply rep = DCPX__REPLY__INIT;

  rep.status = status;
  rep.error = (char *)(error ? error : "");
  rep.version = DCPX_PROTO_VERSION;
  f.msg_case = DCPX__FRAME__MSG_REPLY;
  f.reply = &rep;
  return dcpx__frame_send(sock, &f, NULL, 0);
}
