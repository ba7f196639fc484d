/* fuzz_frame.c - libFuzzer target: one packet through dcpx__frame_recv, as
 * dcpxd and libdcpx receive it (size limit, descriptors, unpack, the text
 * rule of every string field). The first input byte says how many
 * descriptors (0..31) ride along, the rest is the packet. Built by
 * `make fuzz` (clang, ASan, UBSan); corpus in tests/fuzz/corpus/frame. */
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcpx.h"
#include "frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

static int send_packet(int s, const uint8_t *p, size_t n, int nfds) {
  int fds[32];
  union {
    char b[CMSG_SPACE(sizeof(fds))];
    struct cmsghdr a;
  } ctl;
  struct iovec iov = {(void *)p, n};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  int r;

  for (int i = 0; i < nfds; i++)
    fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (nfds) {
    struct cmsghdr *cm;
    mh.msg_control = ctl.b;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
  }
  r = (int)sendmsg(s, &mh, MSG_NOSIGNAL);
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  static int sv[2] = {-1, -1};
  Dcpx__Frame *f = NULL;
  int fds[DCPX_FRAME_MAX_FDS], nfds = 0;

  if (n < 1 || n > DCPX_FRAME_MAX + 2)
    return 0;
  if (sv[0] < 0) {
    int big = 4 * DCPX_FRAME_MAX;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
      return 0;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  }
  if (send_packet(sv[0], data + 1, n - 1, data[0] & 31) < 0)
    return 0;
  if (dcpx__frame_recv(sv[1], &f, fds, DCPX_FRAME_MAX_FDS, &nfds) == 0) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    dcpx__frame_free(f);
  }
  return 0;
}
