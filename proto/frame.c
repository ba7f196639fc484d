/* frame.c - framing of dcpx messages over SOCK_SEQPACKET (see frame.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dcpx.h"
#include "frame.h"
#include "log.h"

/* The wire enums are the public constants (common/transport.h's name
 * tables and the client pass one for the other). */
_Static_assert(DCPX__TRANSPORT__TRANSPORT_AUTO == DCPX_TRANSPORT_AUTO &&
                   DCPX__TRANSPORT__TRANSPORT_LL == DCPX_TRANSPORT_LL &&
                   DCPX__TRANSPORT__TRANSPORT_NCCL == DCPX_TRANSPORT_NCCL,
               "Transport enum != DCPX_TRANSPORT_*");
_Static_assert(DCPX__BACKEND__BACKEND_HOST == DCPX_BACKEND_HOST &&
                   DCPX__BACKEND__BACKEND_CUDA == DCPX_BACKEND_CUDA,
               "Backend enum != DCPX_BACKEND_*");

/* ---- text: UTF-8, group names ------------------------------------------ */

/* Length of the valid UTF-8 sequence (no NUL, no surrogate, no overlong
 * form) at p, or 0. */
static size_t utf8_seq(const uint8_t *p, size_t n) {
  uint32_t c;
  size_t k;

  if (p[0] == 0)
    return 0;
  if (p[0] < 0x80)
    return 1;
  if (p[0] >= 0xC2 && p[0] <= 0xDF)
    k = 2, c = p[0] & 0x1F;
  else if (p[0] >= 0xE0 && p[0] <= 0xEF)
    k = 3, c = p[0] & 0x0F;
  else if (p[0] >= 0xF0 && p[0] <= 0xF4)
    k = 4, c = p[0] & 0x07;
  else
    return 0;
  if (n < k)
    return 0;
  for (size_t i = 1; i < k; i++) {
    if ((p[i] & 0xC0) != 0x80)
      return 0;
    c = (c << 6) | (p[i] & 0x3F);
  }
  if ((k == 3 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) ||
      (k == 4 && (c < 0x10000 || c > 0x10FFFF)))
    return 0;
  return k;
}

int dcpx__text_ok(const void *data, size_t n) {
  const uint8_t *p = data;
  for (size_t i = 0, k; i < n; i += k)
    if (!(k = utf8_seq(p + i, n - i)))
      return 0;
  return 1;
}

void dcpx__text_clean(char *s) {
  uint8_t *p = (uint8_t *)s;
  size_t n = strlen(s);
  for (size_t i = 0, k; i < n; i += k)
    if (!(k = utf8_seq(p + i, n - i)))
      p[i] = '?', k = 1;
}

int dcpx__group_name_ok(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > DCPX_GROUP_NAME_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
          (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'))
      return 0;
  }
  return 1;
}

/* ---- the string fields of a packed message ----------------------------- */

static size_t get_varint(const uint8_t *p, size_t n, uint64_t *v) {
  *v = 0;
  for (size_t i = 0; i < n && i < 10; i++) {
    *v |= (uint64_t)(p[i] & 0x7F) << (7 * i);
    if (!(p[i] & 0x80))
      return i + 1;
  }
  return 0;
}

static void (*frame_closer)(int fd);

void dcpx__frame_set_closer(void (*fn)(int fd)) { frame_closer = fn; }

/* A received descriptor this side does not keep. */
static void frame_close(int fd) {
  if (frame_closer)
    frame_closer(fd);
  else
    close(fd);
}

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

/* One pass over a packet's wire format, before protobuf-c unpacks it: a
 * field key 3..7 bits wide and every length as protobuf reads them, into
 * the sub-messages that protobuf-c unpacks (the fields typed as messages
 * in `d`; a bytes or string field is not walked into). */
struct wire_walk {
  uint32_t cases;      /* the Frame cases this side receives */
  unsigned max_fields; /* 0: any number */
  unsigned fields;     /* fields read so far, every level */
  int refused;         /* dcpx__frame_peek's answer once not 0 */
  int text_bad;        /* a string field that is not text */
  int malformed;       /* not wire format (the unpack refuses it too) */
};

/* One field of the message p[0..n): its key into *key, its value into *v
 * (a varint's value; a length-delimited field's length, its bytes *at
 * bytes past p). Returns the bytes of the whole field, or 0 when they are
 * not wire format as far as n goes (or a group, which dcpx never uses). */
static size_t wire_field(const uint8_t *p, size_t n, uint64_t *key,
                         uint64_t *v, size_t *at) {
  const size_t k = get_varint(p, n, key);
  size_t m;
  if (!k)
    return 0;
  *v = 0;
  *at = k;
  switch (*key & 7) {
  case 0:
    m = get_varint(p + k, n - k, v);
    return m ? k + m : 0;
  case 1:
    return n - k >= 8 ? k + 8 : 0;
  case 5:
    return n - k >= 4 ? k + 4 : 0;
  case 2:
    if (!(m = get_varint(p + k, n - k, v)) || *v > n - k - m)
      return 0;
    *at = k + m;
    return k + m + (size_t)*v;
  default:
    return 0;
  }
}

static void walk_message(const ProtobufCMessageDescriptor *d,
                         const uint8_t *p, size_t n, int depth,
                         struct wire_walk *w) {
  while (n && !w->refused) {
    uint64_t key, v;
    size_t at;
    const size_t k = wire_field(p, n, &key, &v, &at);
    if (!k) {
      w->malformed = 1;
      return;
    }
    if (w->max_fields && ++w->fields > w->max_fields) {
      w->refused = DCPX_FRAME_PEEK_FIELDS;
      return;
    }
    if ((key & 7) == 2) {
      const uint8_t *body = p + at;
      const size_t len = (size_t)v;
      const ProtobufCFieldDescriptor *fd;
      if (depth == 0 && key >> 3 >= 1 && key >> 3 <= DCPX__FRAME__MSG_COMMAND &&
          !(w->cases & (1u << (key >> 3)))) {
        w->refused = (int)(key >> 3);
        return;
      }
      fd = protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
      if (fd && fd->type == PROTOBUF_C_TYPE_STRING &&
          !dcpx__text_ok(body, len))
        w->text_bad = 1;
      if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE) {
        if (depth > 8) {
          w->malformed = 1;
          return;
        }
        walk_message(fd->descriptor, body, len, depth + 1, w);
      }
    }
    p += k, n -= k;
  }
}

int dcpx__frame_peek(const uint8_t *buf, size_t n, uint32_t cases,
                     unsigned max_fields) {
  struct wire_walk w = {.cases = cases, .max_fields = max_fields};
  walk_message(&dcpx__frame__descriptor, buf, n, 0, &w);
  return w.refused;
}

_Static_assert(DCPX__FRAME__MSG_COMMAND == 10 && DCPX__FRAME__MSG_HELLO == 1,
               "Frame cases are its field numbers 1..10");

int dcpx__frame_recv(int sock, Dcpx__Frame **ret_frame, int *fds, int maxfds,
                     int *ret_nfds) {
  return dcpx__frame_recv_cases(sock, ~0u, 0, NULL, ret_frame, fds, maxfds,
                                ret_nfds, NULL);
}

/* The value of field `field` (a varint) at the top level of the message
 * p[0..n) into *v if present (the last one): 1, or 0 when the message is
 * not wire format. */
static int wire_find_varint(const uint8_t *p, size_t n, uint64_t field,
                            uint64_t *v) {
  while (n) {
    uint64_t key, x;
    size_t at;
    const size_t k = wire_field(p, n, &key, &x, &at);
    if (!k)
      return 0;
    if ((key & 7) == 0 && key >> 3 == field)
      *v = x;
    p += k, n -= k;
  }
  return 1;
}

int dcpx__frame_is_reattach(const uint8_t *buf, size_t n) {
  const uint8_t *p = buf;
  int found = 0;
  while (n) { /* the Frame's fields: a Join is field 3 */
    uint64_t key, len, v = 0;
    size_t at;
    const size_t k = wire_field(p, n, &key, &len, &at);
    if (!k || (key & 7) != 2)
      return 0;
    /* the last message field is the Frame's (protobuf's oneof) */
    found = key >> 3 == DCPX__FRAME__MSG_JOIN &&
            wire_find_varint(p + at, (size_t)len, 11, &v) && v != 0;
    p += k, n -= k;
  }
  return found;
}

int dcpx__frame_recv_cases(int sock, uint32_t cases, unsigned max_fields,
                           int (*take_fds)(const uint8_t *pkt, size_t n),
                           Dcpx__Frame **ret_frame, int *fds, int maxfds,
                           int *ret_nfds, int *ret_refused) {
  struct msghdr mh;
  struct iovec iov;
  union {
    char buf[CMSG_SPACE(sizeof(int) * DCPX_FRAME_MAX_FDS)];
    struct cmsghdr align;
  } ctl;
  uint8_t *buf;
  ssize_t n;
  int got = 0, r = 0;
  size_t nfds_sent = 0;
  Dcpx__Frame *f;
  struct wire_walk w;

  if (ret_refused)
    *ret_refused = 0;

  /* One byte more than the limit, so an oversized packet shows as such
   * even on kernels that do not report MSG_TRUNC. */
#ifdef DCPX_FRAME_RECV_STATIC
  /* Fuzz builds only (make fuzz's fuzz_conn, one receiving thread): the
   * packet lands in a static buffer and is copied below into one of its
   * exact size, which ASan then bounds; a 256 KiB malloc per packet is an
   * mmap and munmap under ASan. */
  static uint8_t rx[DCPX_FRAME_MAX + 1];
  buf = NULL;
#else
  uint8_t *rx = buf = malloc(DCPX_FRAME_MAX + 1);
  if (!buf)
    return DCPX_E_NOMEM;
#endif
  memset(&mh, 0, sizeof(mh));
  iov.iov_base = rx;
  iov.iov_len = DCPX_FRAME_MAX + 1;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl.buf;
  mh.msg_controllen = sizeof(ctl.buf);
  /* A side that takes the fds of some packets only looks first (no
   * control buffer: nothing is installed); a packet whose fds it does not
   * take is then read with none, and the kernel drops them without this
   * process ever holding one (nor closing it: a FUSE file's close waits
   * on its server). A peek that fails or sees the end stands as the
   * read's answer. */
  int take = 1;
  n = 1;
  if (take_fds) {
    struct msghdr pm;
    memset(&pm, 0, sizeof(pm));
    pm.msg_iov = &iov;
    pm.msg_iovlen = 1;
    do
      n = recvmsg(sock, &pm, MSG_PEEK);
    while (n < 0 && errno == EINTR);
    if (n > 0 && !take_fds(rx, (size_t)n)) {
      take = 0;
      mh.msg_control = NULL;
      mh.msg_controllen = 0;
    }
  }
  if (n > 0) {
    do
      n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
  } else {
    /* no read filled mh: no descriptors (its control buffer holds
     * garbage, and read as a message would close fds at random) */
    mh.msg_controllen = 0;
    mh.msg_flags = 0;
  }
  if (n < 0 && errno == ECONNRESET) {
    /* A peer that closed with our packet unread resets the connection,
     * and Linux reports that once, ahead of the packets it sent before
     * it closed (dcpxd's reason for refusing us): take those first. */
    mh.msg_controllen = sizeof(ctl.buf);
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n <= 0)
      errno = ECONNRESET, n = -1;
  }
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
    nfds_sent += k;
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fds && got < maxfds)
        fds[got++] = fd;
      else
        frame_close(fd);
    }
  }
  if (n == 0) {
    r = DCPX_E_CONNRESET;
    goto fail;
  }
  if ((mh.msg_flags & MSG_TRUNC) || n > DCPX_FRAME_MAX) {
    r = DCPX_E_MSGSIZE;
    goto fail;
  }
  /* Descriptors cut short: fewer than the buffer holds came in, so the
   * kernel could not install the rest here (this process is at its
   * open-file limit: -EMFILE), or more were sent than the buffer holds
   * (the sender's fault: DCPX_E_FDS). */
  if (!take)
    mh.msg_flags &= ~MSG_CTRUNC; /* the fds not taken, dropped unseen */
  if ((mh.msg_flags & MSG_CTRUNC) &&
      nfds_sent < (sizeof(ctl.buf) - CMSG_LEN(0)) / sizeof(int)) {
    r = -EMFILE;
    goto fail;
  }
  if ((mh.msg_flags & MSG_CTRUNC) || (fds && nfds_sent > (size_t)maxfds)) {
    r = DCPX_E_FDS;
    goto fail;
  }
  /* One walk over the packet before protobuf-c unpacks anything: a
   * message this side never receives (the replies and events have
   * repeated fields: a packet of 131,068 empty Records held dcpxd's loop
   * 17 ms), or more fields than max_fields (each unknown one is a
   * malloc), is refused unpacked; the text rule waits for the unpack, so
   * a packet that does not unpack is DCPX_E_PROTO first. */
  memset(&w, 0, sizeof(w));
  w.cases = cases;
  w.max_fields = max_fields;
  walk_message(&dcpx__frame__descriptor, rx, (size_t)n, 0, &w);
  if (w.refused) {
    if (ret_refused)
      *ret_refused = w.refused;
    r = DCPX_E_PROTO;
    goto fail;
  }
#ifdef DCPX_FRAME_RECV_STATIC
  buf = malloc((size_t)n);
  if (!buf) {
    r = DCPX_E_NOMEM;
    goto fail;
  }
  memcpy(buf, rx, (size_t)n);
#endif
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
  if (w.text_bad || w.malformed) {
    dcpx__frame__free_unpacked(f, NULL);
    r = DCPX_E_TEXT;
    goto fail;
  }
  free(buf);
  *ret_frame = f;
  if (ret_nfds)
    *ret_nfds = got;
  return 0;

fail:
  for (int i = 0; i < got; i++)
    frame_close(fds[i]);
  free(buf);
  return r;
}

void dcpx__shape_to_pb(const dcpx_shape *in, Dcpx__Shape *out) {
  dcpx__shape__init(out);
  out->world = in->world;
  out->rows = in->rows;
  out->topk = in->topk;
  out->local_topk = in->local_topk;
  out->block_size = in->block_size;
  out->interleave = in->interleave;
  out->max_local = in->max_local;
}

void dcpx__shape_from_pb(const Dcpx__Shape *in, dcpx_shape *out) {
  memset(out, 0, sizeof(*out));
  out->size = sizeof(*out);
  out->world = in->world;
  out->rows = in->rows;
  out->topk = in->topk;
  out->local_topk = in->local_topk;
  out->block_size = in->block_size;
  out->interleave = in->interleave;
  out->max_local = in->max_local;
}

static int rank_info_healthy(const Dcpx__GroupInfo *g,
                             const Dcpx__RankInfo *r) {
  if (g->state && strcmp(g->state, "forming") == 0)
    return 1;
  return r->joined && !r->alarm && !r->failed;
}

int dcpx__group_info_healthy(const Dcpx__GroupInfo *g) {
  if (!g->state || strcmp(g->state, "aborted") == 0 ||
      strcmp(g->state, "recovering") == 0 ||
      strcmp(g->state, "unattached") == 0 || g->abort)
    return 0;
  for (size_t i = 0; i < g->n_ranks; i++)
    if (g->ranks[i] && !rank_info_healthy(g, g->ranks[i]))
      return 0;
  return 1;
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

/* ---- ops connections (dcpxctl, bench/soak) ------------------------------ */

const char *dcpx__socket_path(const char *path) {
  if (!path || !*path)
    path = getenv("DCPX_SOCKET");
  return path && *path ? path : DCPX_DEFAULT_SOCKET;
}

uint64_t dcpx__mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int dcpx__poll_until(int sock, short events, uint64_t deadline_ms) {
  struct pollfd p = {.fd = sock, .events = events};
  for (;;) {
    const uint64_t now = dcpx__mono_ms();
    const uint64_t left = deadline_ms > now ? deadline_ms - now : 0;
    const int n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
    if (n > 0)
      return 1;
    if (n == 0 && dcpx__mono_ms() >= deadline_ms)
      return 0;
    if (n < 0 && errno != EINTR)
      return -errno;
  }
}

uint64_t dcpx__deadline_ms(int ms) {
  return dcpx__mono_ms() + (uint64_t)(ms > 0 ? ms : 0);
}

int dcpx__frame_recv_answer(int sock, int timeout_ms, Dcpx__Frame **ret) {
  /* One deadline for the whole wait: neither a signal (EINTR) nor an
   * Event frame skipped on the way starts the timeout over. */
  const uint64_t end = dcpx__deadline_ms(timeout_ms);
  for (;;) {
    Dcpx__Frame *f = NULL;
    int r = dcpx__poll_until(sock, POLLIN, end);
    if (r == 0)
      return DCPX_E_TIMEDOUT;
    if (r < 0)
      return r;
    r = dcpx__frame_recv(sock, &f, NULL, 0, NULL);
    if (r == -EAGAIN || r == -EINTR)
      continue;
    if (r < 0)
      return r;
    if (f->msg_case != DCPX__FRAME__MSG_EVENT) {
      *ret = f;
      return 0;
    }
    dcpx__frame_free(f);
  }
}

int dcpx__ops_connect(const char *path, const char *agent, int timeout_ms,
                      char *err, size_t errlen) {
  return dcpx__ops_connect_join(path, agent, timeout_ms, err, errlen, NULL);
}

int dcpx__ops_connect_join(const char *path, const char *agent,
                           int timeout_ms, char *err, size_t errlen,
                           uint32_t *ret_join_ms) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  Dcpx__Frame f = DCPX__FRAME__INIT, *in = NULL;
  Dcpx__Hello h = DCPX__HELLO__INIT;
  int s, r;

  path = dcpx__socket_path(path);
  if (strlen(path) >= sizeof(sa.sun_path)) {
    snprintf(err, errlen, "socket path too long: %s", path);
    return DCPX_E_INVAL;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  /* Non-blocking while connecting: a Unix socket's connect blocks for as
   * long as the daemon's backlog is full (a hung dcpxd that clients keep
   * trying), so it is retried until the timeout instead. */
  s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) {
    r = -errno;
    snprintf(err, errlen, "socket: %s", strerror(-r));
    return r;
  }
  const uint64_t end = dcpx__deadline_ms(timeout_ms);
  while (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    const int e = errno;
    if ((e == EAGAIN || e == EINTR) && dcpx__mono_ms() < end) {
      if (e == EAGAIN)
        usleep(5000); /* backlog full: no readiness to wait for */
      continue;
    }
    if (e == EAGAIN) {
      r = DCPX_E_TIMEDOUT;
      snprintf(err, errlen,
               "dcpxd at %s accepted no connection within %d ms (its "
               "backlog is full: is it hung?)",
               path, timeout_ms);
      goto fail;
    }
    snprintf(err, errlen, "cannot reach dcpxd at %s: %s", path, strerror(e));
    /* no socket file, or nobody listening on it: no daemon */
    r = e == ECONNREFUSED || e == ENOENT ? DCPX_E_CONNREFUSED : -e;
    goto fail;
  }
  {
    const int fl = fcntl(s, F_GETFL);
    if (fl < 0 || fcntl(s, F_SETFL, fl & ~O_NONBLOCK) < 0) {
      r = -errno;
      snprintf(err, errlen, "fcntl: %s", strerror(-r));
      goto fail;
    }
  }
  h.version = DCPX_PROTO_VERSION;
  h.agent = (char *)agent;
  f.msg_case = DCPX__FRAME__MSG_HELLO;
  f.hello = &h;
  /* A refused connection may be closed before the Hello is sent: its
   * reason is still there to read. */
  (void)dcpx__frame_send(s, &f, NULL, 0);
  {
    /* what the connect left of the timeout */
    const uint64_t now = dcpx__mono_ms();
    r = dcpx__frame_recv_answer(s, now < end ? (int)(end - now) : 0, &in);
  }
  if (r == DCPX_E_TIMEDOUT) {
    snprintf(err, errlen, "no answer from dcpxd within %d ms", timeout_ms);
    goto fail;
  }
  if (r < 0) {
    snprintf(err, errlen, "receiving from dcpxd: %s", dcpx_strerror(r));
    goto fail;
  }
  if (in->msg_case != DCPX__FRAME__MSG_REPLY || !in->reply) {
    r = DCPX_E_PROTO;
    snprintf(err, errlen,
             "dcpxd at %s answered Hello with an unexpected message", path);
    goto fail;
  }
  r = in->reply->status;
  if (r < 0) {
    dcpx__textf(err, errlen, "dcpxd at %s refused the connection: %s (%s)",
                path, in->reply->error ? in->reply->error : "",
                dcpx_strerror(r));
    goto fail;
  }
  if (ret_join_ms)
    *ret_join_ms = in->reply->join_timeout_ms;
  dcpx__frame_free(in);
  return s;
fail:
  dcpx__frame_free(in);
  close(s);
  return r < 0 ? r : DCPX_E_PROTO;
}

int dcpx__frame_queued_refusal(int sock, char *err, size_t errlen) {
  struct pollfd p = {.fd = sock, .events = POLLIN};
  Dcpx__Frame *rep = NULL;
  int r = 0;

  if (poll(&p, 1, 0) != 1 || !(p.revents & POLLIN) ||
      dcpx__frame_recv(sock, &rep, NULL, 0, NULL) < 0)
    return 0;
  if (rep->msg_case == DCPX__FRAME__MSG_REPLY && rep->reply &&
      rep->reply->status < 0) {
    r = rep->reply->status;
    if (err && errlen)
      snprintf(err, errlen, "%s", rep->reply->error ? rep->reply->error : "");
  }
  dcpx__frame_free(rep);
  return r;
}

int dcpx__frame_send_or_reply(int sock, const Dcpx__Frame *f, char *err,
                              size_t errlen) {
  int r = dcpx__frame_send(sock, f, NULL, 0), q;

  if (r != -EPIPE && r != DCPX_E_CONNRESET && r != -ENOTCONN)
    return r;
  /* The answer, if the peer sent one before it closed, is queued. */
  q = dcpx__frame_queued_refusal(sock, err, errlen);
  return q < 0 ? q : r;
}
