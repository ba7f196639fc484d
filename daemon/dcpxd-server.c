/* dcpxd-server.c - the listening socket and the client connections.
 *
 * Sockets. One AF_UNIX SOCK_SEQPACKET listening socket, bound here (path and
 * mode from the settings) or passed by systemd socket activation. libuv's
 * stream API cannot carry SCM_RIGHTS on a SEQPACKET socket, so the daemon
 * watches the raw fds with uv_poll and does accept4/sendmsg/recvmsg itself
 * (proto/frame.c); every socket is non-blocking.
 *
 * A connection's life:
 *
 *   accepted --(SO_PEERCRED refused)--> Reply ACCES, closing
 *      |
 *      v
 *   wait Hello --(other frame, bad version)--> Reply error, closing
 *      |
 *      v
 *   open: Join / Leave / RecoverAck / Query / Command, any number, each
 *      |  answered before the next is read (a Join that waits for its
 *      |  group holds the rest unread in the socket, conn_watch)
 *      |
 *      |--(send failure)--> muted: nothing more sent; its requests still
 *      |                      |  read and handled, in order (a Leave is a
 *      |                      |  Leave, a Join refused), answers dropped
 *      |                      v (reaper, next loop turn: what the socket
 *      |                         holds is read, conn_drain)
 *      v (EOF, HUP, error, malformed or unexpected frame, output bounds)
 *   closing --(reaper, next loop turn)--> removed from its group, handles
 *                                         closed, fd closed, freed
 *
 * Invariants:
 *   1. Client input never crashes the daemon: every received frame comes
 *      through dcpx__frame_recv (size-bounded, unpacked by protobuf-c), and
 *      every handler checks the message pointers it uses.
 *   2. An error on one connection closes that connection only.
 *   3. Sends never block the loop: a frame that does not fit in the socket
 *      is queued (fds dup'ed) and sent when the socket is writable; a peer
 *      that lets DCPXD_OUT_MAX bytes pile up is cut off. A send that fails
 *      (the peer closed its socket, or shut its reading side down) does
 *      not end the reading of what the peer sent before: the connection
 *      is muted (conn_mute), and closed once that is read; a peer that
 *      keeps sending gets at most one bounded drain (conn_drain) more.
 *   4. Nothing is freed under a running handler (dcpxd.h, re-entrancy).
 *   5. A member's death is seen two ways, whichever comes first: its socket
 *      hangs up (the kernel closes it when the process dies), or its pidfd
 *      turns readable (the process exited, though a child it forked may
 *      still hold the socket open). Both answer first what it sent that
 *      the socket holds (a Leave is a Leave), then end in
 *      dcpxd_conn_close.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "dcpxd-closer.h"
#include "dcpxd-log.h"
#include "dcpxd-notify.h"
#include "dcpxd-util.h"
#include "dcpxd.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same on every architecture */
#endif

#define ACCEPT_BATCH 64
#define RECV_BATCH 32
#define ACCEPT_RETRY_MS 100

/* ---- sending ------------------------------------------------------------- */

/* A peer that hung up before reading its answer (libdcpx's Leave does not
 * wait for the Reply) is routine; other send errors are worth a line. */
static int send_error_level(int r) {
  return r == -EPIPE || r == DCPX_E_CONNRESET ? LOG_DEBUG : LOG_INFO;
}

static void outmsg_free(dcpxd_outmsg *o) {
  for (int i = 0; i < o->nfds; i++)
    if (o->fds[i] >= 0)
      close(o->fds[i]);
  free(o);
}

static void on_conn_io(uv_poll_t *h, int status, int events);
static void on_reap(uv_idle_t *h);

static void reaper_start(dcpxd_manager *m) {
  if (!uv_is_closing((uv_handle_t *)&m->reaper))
    uv_idle_start(&m->reaper, on_reap);
}

static void conn_set_events(dcpxd_conn *c, unsigned events) {
  if (c->closing || c->poll_events == events)
    return;
  if (uv_poll_start(&c->poll, (int)events, on_conn_io) == 0)
    c->poll_events = events;
}

bool dcpxd_conn_join_waits(const dcpxd_conn *c) {
  return uv_is_active((const uv_handle_t *)&c->join_timer);
}

/* What c's poll watches: a hang-up always; its requests unless its Join
 * waits (they stay in the socket, unread, until it is answered: one
 * answer per request, in order, docs/PROTOCOL.md 10.3); room to send
 * while output is queued. */
static void conn_watch(dcpxd_conn *c) {
  unsigned events = UV_DISCONNECT;

  if (!dcpxd_conn_join_waits(c))
    events |= UV_READABLE;
  if (c->out_head)
    events |= UV_WRITABLE;
  conn_set_events(c, events);
}

/* Frees c's queued output. */
static void conn_out_drop(dcpxd_conn *c) {
  while (c->out_head) {
    dcpxd_outmsg *o = c->out_head;
    c->out_head = o->next;
    outmsg_free(o);
  }
  c->m->out_bytes -= c->out_bytes;
  c->out_bytes = 0;
  c->out_tail = NULL;
}

/* A send to c failed (r): c is muted, not closed. Its queued output is
 * dropped and nothing more is sent to it, but what its peer sent before
 * is still read and handled, in order, the answers dropped: a client that
 * sends a Query and a Leave and closes its socket at once, the Query's
 * answer failing, still leaves (a Leave is a Leave however the connection
 * ends, docs/PROTOCOL.md 10.3); a Join is refused (dcpxd_group_join).
 * Reading goes on as before (the rest of the batch in hand, the socket's
 * events); the reaper, on the next loop turn, reads what the socket
 * holds then (conn_drain: no waiting, bounded) and closes c, so that a
 * peer that shut its reading side down and keeps sending does not keep
 * its connection. */
static void conn_mute(dcpxd_conn *c, int r) {
  if (c->closing || c->send_err)
    return;
  c->send_err = r < 0 ? r : -EIO;
  log_debug("conn %" PRIu64 " (pid %d): send failed: %s; reading what it "
            "sent, then closing",
            c->id, (int)c->pid, dcpx_strerror(c->send_err));
  conn_out_drop(c);
  TAILQ_INSERT_TAIL(&c->m->muted, c, muted_link);
  c->muted_listed = true;
  reaper_start(c->m);
  conn_watch(c);
}

/* Closes muted c, what its peer sent having been read. */
static void conn_close_muted(dcpxd_conn *c) {
  dcpxd_conn_close(c, send_error_level(c->send_err), "send failed: %s",
                   dcpx_strerror(c->send_err));
}

void dcpxd_conn_join_wait(dcpxd_conn *c, uv_timer_cb on_timeout,
                          uint64_t timeout_ms) {
  uv_timer_start(&c->join_timer, on_timeout, timeout_ms, 0);
  conn_watch(c);
}

void dcpxd_conn_join_done(dcpxd_conn *c) {
  uv_timer_stop(&c->join_timer);
  conn_watch(c);
}

/* Sends one queued message; 0 sent, -EAGAIN full, else an error. */
static int outmsg_send(int fd, const dcpxd_outmsg *o) {
  struct iovec iov = {.iov_base = (void *)o->data, .iov_len = o->len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  union {
    char buf[CMSG_SPACE(sizeof(int) * DCPX_FRAME_MAX_FDS)];
    struct cmsghdr align;
  } ctl;
  ssize_t n;

  if (o->nfds) {
    struct cmsghdr *cm;
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)o->nfds);
    cm = CMSG_FIRSTHDR(&mh);
    if (!cm)
      return -EINVAL;
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)o->nfds);
    memcpy(CMSG_DATA(cm), o->fds, sizeof(int) * (size_t)o->nfds);
  }
  do
    n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return (errno == EWOULDBLOCK) ? -EAGAIN : -errno;
  return (size_t)n == o->len ? 0 : -EIO;
}

void dcpxd_conn_flush(dcpxd_conn *c) {
  while (c->out_head && !c->closing) {
    dcpxd_outmsg *o = c->out_head;
    int r = outmsg_send(c->fd, o);
    if (r == -EAGAIN)
      return;
    if (r < 0) {
      conn_mute(c, r); /* drops the queue */
      break;
    }
    c->out_head = o->next;
    if (!c->out_head)
      c->out_tail = NULL;
    c->out_bytes -= o->len;
    c->m->out_bytes -= o->len;
    outmsg_free(o);
  }
  conn_watch(c);
}

static int conn_enqueue(dcpxd_conn *c, const Dcpx__Frame *f, const int *fds,
                        int nfds) {
  size_t len = dcpx__frame__get_packed_size(f);
  dcpxd_outmsg *o;

  if (c->out_bytes + len > DCPXD_OUT_MAX) {
    dcpxd_conn_close(c, LOG_WARNING,
                     "peer is not reading its socket (%zu bytes queued)",
                     c->out_bytes);
    return -ENOBUFS;
  }
  if (c->m->out_bytes + len > c->m->conf->max_queued_bytes) {
    dcpxd_conn_close(c, LOG_WARNING,
                     "peer is not reading its socket and dcpxd's queued "
                     "output is at max-queued-bytes (%zu bytes, %zu of them "
                     "this peer's)",
                     c->m->out_bytes, c->out_bytes);
    return -ENOBUFS;
  }
  o = malloc(sizeof(*o) + (len ? len : 1));
  if (!o) {
    dcpxd_conn_close(c, LOG_ERR, "out of memory queueing a message");
    return -ENOMEM;
  }
  o->next = NULL;
  o->len = len;
  dcpx__frame__pack(f, o->data);
  o->nfds = 0;
  for (int i = 0; i < nfds; i++) {
    int d = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
    if (d < 0) {
      int r = -errno;
      outmsg_free(o);
      dcpxd_conn_close(c, LOG_ERR, "cannot queue descriptors: %s",
                       dcpx_strerror(r));
      return r;
    }
    o->fds[o->nfds++] = d;
  }
  if (c->out_tail)
    c->out_tail->next = o;
  else
    c->out_head = o;
  c->out_tail = o;
  c->out_bytes += len;
  c->m->out_bytes += len;
  conn_watch(c);
  return 0;
}

int dcpxd_conn_send(dcpxd_conn *c, const Dcpx__Frame *f, const int *fds,
                    int nfds) {
  int r;

  if (c->closing)
    return DCPX_E_NOTCONN;
  if (c->send_err) /* muted: dropped */
    return c->send_err;
  if (dcpx__frame__get_packed_size(f) > DCPX_FRAME_MAX)
    return DCPX_E_MSGSIZE;
  if (!c->out_head) {
    r = dcpx__frame_send(c->fd, f, fds, nfds);
    if (r == 0)
      return 0;
    if (r == DCPX_E_MSGSIZE) /* over the socket's send buffer */
      return r;
    if (r != -EAGAIN && r != -ENOBUFS) {
      conn_mute(c, r);
      return r;
    }
  }
  return conn_enqueue(c, f, fds, nfds);
}

/* rep (its version set here) as a Reply frame. */
static int conn_send_reply(dcpxd_conn *c, Dcpx__Reply *rep) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  rep->version = DCPX_PROTO_VERSION;
  f.msg_case = DCPX__FRAME__MSG_REPLY;
  f.reply = rep;
  return dcpxd_conn_send(c, &f, NULL, 0);
}

int dcpxd_conn_reply(dcpxd_conn *c, int status, const char *fmt, ...) {
  Dcpx__Reply rep = DCPX__REPLY__INIT;
  char msg[512] = "";

  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    dcpx__vtextf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
  }
  dcpx__text_clean(msg);
  rep.status = status;
  rep.error = msg;
  return conn_send_reply(c, &rep);
}

/* ---- closing ------------------------------------------------------------- */

static void on_conn_handle_closed(uv_handle_t *h) {
  dcpxd_conn *c = h->data;
  if (--c->open_handles > 0)
    return;
  close(c->fd);
  if (c->pidfd >= 0)
    close(c->pidfd);
  free(c);
}

static void conn_drain(dcpxd_conn *c);

/* The reaper: runs on the loop turn after connections were muted or
 * marked closing. A muted one has what its socket holds read (conn_drain)
 * and is closed; a closing one leaves its group (this is the only place
 * where a connection leaves its group because it went away) and is
 * freed. Either may mute or close others (a Leave's ABORT event, a
 * departed member's): they are handled in the same pass. Each connection
 * is muted at most once, and its drain is bounded. */
static void on_reap(uv_idle_t *h) {
  dcpxd_manager *m = h->data;
  dcpxd_conn *c;

  for (;;) {
    if ((c = TAILQ_FIRST(&m->muted))) {
      TAILQ_REMOVE(&m->muted, c, muted_link);
      c->muted_listed = false;
      conn_drain(c);
      if (!c->closing)
        conn_close_muted(c);
      continue;
    }
    if (!(c = TAILQ_FIRST(&m->reap)))
      break;
    TAILQ_REMOVE(&m->reap, c, reap_link);
    if (c->group)
      dcpxd_group_member_gone(c);
    conn_out_drop(c);
    TAILQ_REMOVE(&m->conns, c, link);
    m->n_conns--;
    uv_close((uv_handle_t *)&c->poll, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->join_timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->idle_timer, on_conn_handle_closed);
    if (c->pidfd >= 0)
      uv_close((uv_handle_t *)&c->pid_poll, on_conn_handle_closed);
  }
  uv_idle_stop(h);
  if (m->stopping && TAILQ_EMPTY(&m->conns) && !uv_is_closing((uv_handle_t *)h))
    uv_close((uv_handle_t *)h, NULL);
  dcpxd_manager_update(m);
}

void dcpxd_conn_close(dcpxd_conn *c, int level, const char *fmt, ...) {
  va_list ap;

  if (c->closing)
    return;
  c->closing = true;
  if (c->muted_listed) {
    TAILQ_REMOVE(&c->m->muted, c, muted_link);
    c->muted_listed = false;
  }
  va_start(ap, fmt);
  vsnprintf(c->close_reason, sizeof(c->close_reason), fmt, ap);
  va_end(ap);
  /* Often a client's doing: rate-limited per format, as every line. */
  log_full(level, "conn %" PRIu64 " (pid %d uid %u%s%s): closing: %s", c->id,
           (int)c->pid, (unsigned)c->uid, c->agent[0] ? ", " : "", c->agent,
           c->close_reason);
  uv_poll_stop(&c->poll);
  uv_timer_stop(&c->join_timer);
  uv_timer_stop(&c->idle_timer);
  if (c->pidfd >= 0)
    uv_poll_stop(&c->pid_poll);
  TAILQ_INSERT_TAIL(&c->m->reap, c, reap_link);
  reaper_start(c->m);
}

/* ---- the Hello deadline and the idle timeout ----------------------------- */

static void on_idle_timeout(uv_timer_t *t) {
  dcpxd_conn *c = t->data;
  const dcpxd_conf *conf = c->m->conf;

  if (c->closing || c->group)
    return;
  if (c->hello) {
    dcpxd_conn_reply(c, DCPX_E_TIMEDOUT,
                     "idle for %u ms without a group (idle-timeout-ms)",
                     conf->idle_timeout_ms);
    dcpxd_conn_close(c, LOG_INFO, "idle for %u ms without a group",
                     conf->idle_timeout_ms);
  } else {
    dcpxd_conn_reply(c, DCPX_E_TIMEDOUT,
                     "no Hello within %u ms (hello-timeout-ms)",
                     conf->hello_timeout_ms);
    dcpxd_conn_close(c, LOG_INFO, "no Hello within %u ms",
                     conf->hello_timeout_ms);
  }
  dcpxd_manager_update(c->m);
}

void dcpxd_conn_idle_arm(dcpxd_conn *c) {
  const dcpxd_conf *conf = c->m->conf;

  if (c->closing)
    return;
  if (c->group) {
    uv_timer_stop(&c->idle_timer);
    return;
  }
  uv_timer_start(&c->idle_timer, on_idle_timeout,
                 c->hello ? conf->idle_timeout_ms : conf->hello_timeout_ms, 0);
}

/* ---- the peer process ------------------------------------------------------ */

/* The peer process exited. What it sent before is answered first, in
 * order, as far as its socket holds it now (no waiting: a child it forked
 * may keep the socket open): a Leave among it counts as a Leave, not as a
 * death (they differ for a group adopted after a restart, dcpxd-group.c),
 * even when this event comes before the socket's. The rest, its rank if
 * it still holds one, is its death. */
static void on_pid_exit(uv_poll_t *h, int status, int events) {
  dcpxd_conn *c = h->data;

  uv_poll_stop(h);
  if (c->closing)
    return;
  c->exited = true;
  conn_drain(c);
  if (!c->closing)
    dcpxd_conn_close(c, LOG_INFO, "process %d exited", (int)c->pid);
  dcpxd_manager_update(c->m);
}

int dcpxd_conn_watch_pid(dcpxd_conn *c) {
  int fd, r;

  if (c->pidfd >= 0 || c->pid <= 0 || c->closing)
    return 0;
  fd = (int)syscall(SYS_pidfd_open, c->pid, 0);
  if (fd < 0) {
    r = -errno;
    log_debug("conn %" PRIu64 ": cannot watch pid %d (%s); relying on its "
              "socket",
              c->id, (int)c->pid, strerror(-r));
    return r;
  }
  (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
  r = uv_poll_init(c->m->loop, &c->pid_poll, fd);
  if (r < 0) {
    close(fd);
    return r;
  }
  c->pid_poll.data = c;
  c->pidfd = fd;
  c->open_handles++;
  /* A pidfd is readable once the process has exited. */
  uv_poll_start(&c->pid_poll, UV_READABLE, on_pid_exit);
  return 0;
}

/* ---- receiving ----------------------------------------------------------- */

static const char *frame_name(int msg_case) {
  switch (msg_case) {
  case DCPX__FRAME__MSG_HELLO:
    return "Hello";
  case DCPX__FRAME__MSG_REPLY:
    return "Reply";
  case DCPX__FRAME__MSG_JOIN:
    return "Join";
  case DCPX__FRAME__MSG_JOIN_REPLY:
    return "JoinReply";
  case DCPX__FRAME__MSG_LEAVE:
    return "Leave";
  case DCPX__FRAME__MSG_EVENT:
    return "Event";
  case DCPX__FRAME__MSG_RECOVER_ACK:
    return "RecoverAck";
  case DCPX__FRAME__MSG_QUERY:
    return "Query";
  case DCPX__FRAME__MSG_QUERY_REPLY:
    return "QueryReply";
  case DCPX__FRAME__MSG_COMMAND:
    return "Command";
  default:
    return "unknown message";
  }
}

/* Replies with a protocol error and closes the connection. */
static void conn_protocol_error(dcpxd_conn *c, int status, const char *why) {
  dcpxd_conn_reply(c, status, "%s", why);
  dcpxd_conn_close(c, LOG_WARNING, "%s", why);
}

static void conn_hello(dcpxd_conn *c, const Dcpx__Hello *h) {
  char why[128];
  size_t k = 0;

  if (!h)
    return conn_protocol_error(c, DCPX_E_PROTO, "Hello without content");
  if (h->version != DCPX_PROTO_VERSION) {
    dcpxd_bprintf(why, "protocol version %u not supported (dcpxd speaks %u)",
                  h->version, DCPX_PROTO_VERSION);
    return conn_protocol_error(c, DCPX_E_VERSION, why);
  }
  /* Keep a printable copy of the agent string for logs. */
  for (const char *p = h->agent ? h->agent : ""; *p && k + 1 < sizeof(c->agent);
       p++)
    c->agent[k++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
  c->agent[k] = '\0';
  c->hello = true;
  log_debug("conn %" PRIu64 " (pid %d): hello from '%s'", c->id, (int)c->pid,
            c->agent);
  /* the Reply, with the join timeout a Join of 0 gets (libdcpx's bound
   * on its own wait for the JoinReply) */
  Dcpx__Reply rep = DCPX__REPLY__INIT;
  rep.join_timeout_ms = c->m->conf->join_timeout_ms;
  (void)conn_send_reply(c, &rep);
}

static void conn_dispatch(dcpxd_conn *c, const Dcpx__Frame *f, int *fds,
                          int nfds) {
  char why[128];

  if (!c->hello && f->msg_case != DCPX__FRAME__MSG_HELLO) {
    dcpxd_bprintf(why, "expected Hello first, got %s", frame_name(f->msg_case));
    return conn_protocol_error(c, DCPX_E_PROTO, why);
  }
  switch (f->msg_case) {
  case DCPX__FRAME__MSG_HELLO:
    if (c->hello)
      return conn_protocol_error(c, DCPX_E_PROTO, "duplicate Hello");
    return conn_hello(c, f->hello);
  case DCPX__FRAME__MSG_JOIN:
    if (!f->join)
      return conn_protocol_error(c, DCPX_E_PROTO, "Join without content");
    return dcpxd_group_join(c, f->join, fds, nfds);
  case DCPX__FRAME__MSG_LEAVE:
    return dcpxd_group_leave(c);
  case DCPX__FRAME__MSG_RECOVER_ACK:
    if (!f->recover_ack)
      return conn_protocol_error(c, DCPX_E_PROTO, "RecoverAck without content");
    return dcpxd_group_recover_ack(c, f->recover_ack);
  case DCPX__FRAME__MSG_QUERY:
    if (!f->query)
      return conn_protocol_error(c, DCPX_E_PROTO, "Query without content");
    return dcpxd_query(c, f->query);
  case DCPX__FRAME__MSG_COMMAND:
    if (!f->command)
      return conn_protocol_error(c, DCPX_E_PROTO, "Command without content");
    return dcpxd_command(c, f->command);
  default:
    dcpxd_bprintf(why, "unexpected %s from a client", frame_name(f->msg_case));
    return conn_protocol_error(c, DCPX_E_PROTO, why);
  }
}

/* Why a received packet was refused (dcpx__frame_recv's codes). */
static const char *recv_error_text(int r) {
  static char size[64], fds[96];

  switch (r) {
  case DCPX_E_MSGSIZE:
    dcpxd_bprintf(size, "frame larger than %u bytes", DCPX_FRAME_MAX);
    return size;
  case DCPX_E_FDS:
    dcpxd_bprintf(fds, "more than %d file descriptors in one message",
                  DCPX_FRAME_MAX_FDS);
    return fds;
  case DCPX_E_TEXT:
    return "a string field is not valid UTF-8 or holds a NUL byte";
  default:
    return "malformed frame (not a dcpx Frame)";
  }
}

/* The Frame messages a client sends (conn_dispatch's cases); a packet
 * with any other is refused before it is unpacked. */
#define CLIENT_CASES                                                         \
  ((1u << DCPX__FRAME__MSG_HELLO) | (1u << DCPX__FRAME__MSG_JOIN) |           \
   (1u << DCPX__FRAME__MSG_LEAVE) | (1u << DCPX__FRAME__MSG_RECOVER_ACK) |    \
   (1u << DCPX__FRAME__MSG_QUERY) | (1u << DCPX__FRAME__MSG_COMMAND))

/* The fds a client sends are taken with a reattaching Join only (the one
 * request that carries any), and not while more than this many are
 * queued for closing: a close that hangs (a client's FUSE file) then
 * costs dcpxd a bounded number of descriptors, and the reattach is
 * refused for its fd count until the backlog clears. Every other
 * packet's fds are dropped by the kernel unseen (dcpx__frame_recv_cases):
 * dcpxd never holds, nor closes, one. */
#define CLOSE_BACKLOG_MAX 1024

static int take_fds(const uint8_t *pkt, size_t n) {
  return dcpx__frame_is_reattach(pkt, n) &&
         dcpxd_closer_backlog() < CLOSE_BACKLOG_MAX;
}

/* Up to RECV_BATCH frames of c, each dispatched, until none is left, the
 * peer is gone, c closes or a Join of it waits (conn_watch). Returns
 * whether it found the socket empty (nothing more to read now). */
static bool read_frames(dcpxd_conn *c) {
  bool empty = false;

  c->reading = true;
  for (int i = 0; i < RECV_BATCH && !c->closing && !dcpxd_conn_join_waits(c);
       i++) {
    Dcpx__Frame *f = NULL;
    int fds[DCPX_FRAME_MAX_FDS], nfds = 0;
    /* Only a reattaching Join carries fds; any others are closed. */
    int refused = 0;
    int r = dcpx__frame_recv_cases(c->fd, CLIENT_CASES, DCPX_FRAME_MAX_FIELDS,
                                   take_fds, &f, fds, DCPX_FRAME_MAX_FDS,
                                   &nfds, &refused);
    if (r == -EAGAIN) {
      empty = true;
      break;
    }
    if (r == DCPX_E_CONNRESET) {
      if (c->send_err) /* muted: what it sent is read */
        conn_close_muted(c);
      else
        dcpxd_conn_close(c, c->group ? LOG_INFO : LOG_DEBUG,
                         "connection closed by peer");
      break;
    }
    if (refused) { /* not unpacked: what dcpxd sends, or junk fields */
      char why[80];
      if (refused == DCPX_FRAME_PEEK_FIELDS)
        dcpxd_bprintf(why, "a request of more than %u fields",
                      DCPX_FRAME_MAX_FIELDS);
      else
        dcpxd_bprintf(why, "unexpected %s from a client", frame_name(refused));
      conn_protocol_error(c, DCPX_E_PROTO, why);
      break;
    }
    if (r == DCPX_E_MSGSIZE || r == DCPX_E_FDS || r == DCPX_E_PROTO ||
        r == DCPX_E_TEXT) {
      conn_protocol_error(c, r, recv_error_text(r));
      break;
    }
    if (r == -EMFILE) { /* the descriptors a reattach brings: no room */
      conn_protocol_error(c, DCPX_E_BUSY,
                          "dcpxd is out of file descriptors (its open-file "
                          "limit, LimitNOFILE): retry later");
      break;
    }
    if (r < 0) {
      dcpxd_conn_close(c, LOG_INFO, "receive failed: %s", dcpx_strerror(r));
      break;
    }
    conn_dispatch(c, f, fds, nfds);
    dcpxd_conn_idle_arm(c); /* activity, or a group joined or left */
    for (int k = 0; k < nfds; k++)
      dcpxd_closer_close(fds[k]); /* the fds it did not take, off the loop */
    dcpx__frame_free(f);
  }
  c->reading = false;
  return empty;
}

/* What c's peer sent before it went away (or before a send to it failed,
 * conn_mute) is answered, in order, as far as it can be read now (a
 * Leave among it counts as a Leave); a Join of it that waits is given up
 * first. Each pass reads at most RECV_BATCH frames; what a socket can
 * hold is bounded, and its end of stream closes c. The bound is a guard;
 * so is `reading`: requests of c being handled led here (they cannot be
 * answered ahead of the one in hand). */
static void conn_drain(dcpxd_conn *c) {
  for (int i = 0; i < 64 && !c->closing && !c->reading; i++) {
    if (dcpxd_conn_join_waits(c))
      dcpxd_group_join_gone(c);
    if (read_frames(c))
      break;
  }
}

void dcpxd_conn_hangup(dcpxd_conn *c) {
  conn_drain(c);
  if (!c->closing)
    dcpxd_conn_close(c, LOG_INFO, "the peer hung up");
}

static void on_conn_io(uv_poll_t *h, int status, int events) {
  dcpxd_conn *c = h->data;

  if (c->closing)
    return;
  if (status < 0) {
    /* libuv reports POLLERR as UV_EBADF. On a Unix socket that is the
     * pending socket error, typically ECONNRESET: the peer closed with
     * frames it had not read (a member that leaves with an abort event
     * unread). What it sent before closing is still queued here: read
     * it first, all of it (conn_drain: a Leave behind more requests than
     * one batch), so that its Leave counts as a Leave, not as a death
     * (they differ for a group adopted after a restart, dcpxd-group.c);
     * its end of stream then closes c. Else report the error. */
    int err = 0;
    socklen_t len = sizeof(err);
    const int sockerr =
        status == UV_EBADF &&
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err;
    conn_drain(c);
    if (c->closing)
      goto out;
    if (sockerr)
      dcpxd_conn_close(c, c->group ? LOG_INFO : LOG_DEBUG,
                       "connection error: %s", strerror(err));
    else
      dcpxd_conn_close(c, LOG_INFO, "poll error: %s", uv_strerror(status));
    goto out;
  }
  if (events & UV_WRITABLE)
    dcpxd_conn_flush(c);
  if (!(events & (UV_READABLE | UV_DISCONNECT)))
    goto out;
  if (dcpxd_conn_join_waits(c) && (events & UV_DISCONNECT))
    dcpxd_group_join_gone(c); /* then what it sent after, in order */
  if (!dcpxd_conn_join_waits(c))
    read_frames(c);
out:
  dcpxd_manager_update(c->m);
}


/* ---- accepting ----------------------------------------------------------- */

/* The peer's supplementary groups (SO_PEERGROUPS, Linux >= 4.13), plus its
 * primary group. Returns the count stored in gids (at most max). */
static size_t peer_groups(int fd, gid_t primary, gid_t *gids, size_t max) {
  socklen_t len = (socklen_t)((max - 1) * sizeof(gid_t));
  size_t n = 0;

  gids[n++] = primary;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, gids + 1, &len) == 0)
    n += len / sizeof(gid_t);
  return n;
}

/* Open connections of a uid (not those already closing). */
static unsigned conns_of_uid(dcpxd_manager *m, uid_t uid) {
  dcpxd_conn *c;
  unsigned n = 0;
  TAILQ_FOREACH(c, &m->conns, link) {
    n += c->uid == uid && !c->closing;
  }
  return n;
}

bool dcpxd_rule_matches(const dcpxd_conn *c, const dcpxd_owner_rule *rule) {
  gid_t gids[129];
  size_t n;

  if (!rule->is_gid)
    return c->uid == rule->id;
  n = peer_groups(c->fd, c->gid, gids, ELEMENTSOF(gids));
  for (size_t i = 0; i < n; i++)
    if (gids[i] == rule->id)
      return true;
  return false;
}

static void conn_new(dcpxd_manager *m, int fd) {
  struct ucred uc;
  socklen_t len = sizeof(uc);
  gid_t gids[129];
  size_t ngids;
  dcpxd_conn *c;
  int sndbuf = 2 * DCPX_FRAME_MAX;

  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0) {
    log_warning_errno(-errno, "Cannot read peer credentials, dropping "
                              "connection: %m");
    close(fd);
    return;
  }
  /* So that frames up to DCPX_FRAME_MAX fit (capped by wmem_max). */
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));

  c = calloc(1, sizeof(*c));
  if (!c) {
    log_error("Out of memory accepting a connection");
    close(fd);
    return;
  }
  c->m = m;
  c->fd = fd;
  c->id = ++m->next_conn_id;
  c->pid = uc.pid;
  if (uc.pid <= 0)
    log_info("conn %" PRIu64 ": the peer's pid is not visible here (another "
             "pid namespace): its death shows only as its socket closing, "
             "and after a restart as a reattach that does not come",
             c->id);
  c->uid = uc.uid;
  c->gid = uc.gid;
  uv_poll_init(m->loop, &c->poll, fd);
  uv_timer_init(m->loop, &c->join_timer);
  uv_timer_init(m->loop, &c->idle_timer);
  c->poll.data = c;
  c->join_timer.data = c;
  c->idle_timer.data = c;
  c->open_handles = 3;
  c->pidfd = -1;
  TAILQ_INSERT_TAIL(&m->conns, c, link);
  m->n_conns++;

  ngids = peer_groups(fd, uc.gid, gids, ELEMENTSOF(gids));
  c->admin = dcpxd_conf_peer_admin(m->conf, uc.uid, gids, ngids);
  if (!dcpxd_conf_peer_allowed(m->conf, uc.uid, gids, ngids)) {
    dcpxd_conn_reply(c, DCPX_E_ACCES, "uid %u not allowed", (unsigned)uc.uid);
    dcpxd_conn_close(c, LOG_WARNING, "uid %u not allowed", (unsigned)uc.uid);
    return;
  }
  if (m->n_conns > DCPXD_MAX_CONNS + (c->admin ? DCPXD_ADMIN_CONNS : 0u)) {
    dcpxd_conn_reply(c, DCPX_E_BUSY, "too many connections (%u)",
                     DCPXD_MAX_CONNS);
    dcpxd_conn_close(c, LOG_WARNING, "too many connections");
    return;
  }
  if (uc.uid != 0 && conns_of_uid(m, uc.uid) > m->conf->max_conns_per_uid) {
    dcpxd_conn_reply(c, DCPX_E_BUSY,
                     "too many connections for uid %u (max-conns-per-uid "
                     "%u)",
                     (unsigned)uc.uid, m->conf->max_conns_per_uid);
    dcpxd_conn_close(c, LOG_WARNING, "too many connections for uid %u",
                     (unsigned)uc.uid);
    return;
  }
  dcpxd_conn_idle_arm(c);
  conn_watch(c);
  log_debug("conn %" PRIu64 ": accepted pid %d uid %u gid %u", c->id,
            (int)uc.pid, (unsigned)uc.uid, (unsigned)uc.gid);
}

static void on_listen(uv_poll_t *h, int status, int events);

static void on_accept_retry(uv_timer_t *t) {
  dcpxd_manager *m = t->data;
  if (!m->stopping && m->listening)
    uv_poll_start(&m->listen_poll, UV_READABLE, on_listen);
}

static void reserve_open(dcpxd_manager *m) {
  if (m->reserve_fd < 0)
    m->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* Out of fds (EMFILE): the reserve-fd trick. Give up the reserve, accept
 * the pending connection, tell it why and close it, take the reserve
 * again; so the backlog drains instead of keeping the socket readable
 * (which would wake the loop over and over). What the peer already sent is
 * read first, so that the close does not reset the connection before the
 * peer reads the reason. 0: one refused; 1: none was pending; -1: no
 * reserve (pause). */
static int refuse_with_reserve(dcpxd_manager *m) {
  char junk[512];
  int fd;

  if (m->reserve_fd < 0)
    return -1;
  close(m->reserve_fd);
  m->reserve_fd = -1;
  fd = accept4(m->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    while (recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0)
      ;
    (void)dcpx__send_reply(fd, DCPX_E_BUSY,
                           "dcpxd is out of file descriptors; try again "
                           "later");
    close(fd);
    m->fd_refused++;
  }
  reserve_open(m);
  if (fd >= 0)
    log_warning(
                    "Out of file descriptors: connection refused (%" PRIu64
                    " so far)",
                    m->fd_refused);
  return fd >= 0 ? 0 : 1;
}

static void on_listen(uv_poll_t *h, int status, int events) {
  dcpxd_manager *m = h->data;

  if (status < 0) {
    log_error("Listening socket error: %s", uv_strerror(status));
    return;
  }
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    int fd = accept4(m->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
      if (errno == EMFILE) {
        int q = refuse_with_reserve(m);
        if (q == 0)
          continue;
        if (q == 1)
          break;
        errno = EMFILE;
      }
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        /* The pending connection stays readable: stop watching for a
         * moment rather than spin. */
        log_warning( "accept() failed, pausing %d ms: %s",
                        ACCEPT_RETRY_MS, strerror(errno));
        uv_poll_stop(&m->listen_poll);
        uv_timer_start(&m->accept_retry, on_accept_retry, ACCEPT_RETRY_MS, 0);
        break;
      }
      log_error_errno(-errno, "accept() failed: %m");
      break;
    }
    conn_new(m, fd);
  }
  dcpxd_manager_update(m);
}

/* ---- the listening socket ------------------------------------------------ */

static int use_activated_socket(dcpxd_manager *m, int n) {
  int fd = DCPXD_LISTEN_FDS_START, type = 0, domain = 0, acc = 0;
  socklen_t len = sizeof(int);

  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) < 0)
    return log_error_errno(-errno, "Passed fd %d is not a socket: %m", fd);
  if (type != SOCK_SEQPACKET || domain != AF_UNIX || !acc)
    return log_error_errno(-EINVAL,
                           "Passed fd %d is not a listening AF_UNIX "
                           "SOCK_SEQPACKET socket "
                           "(ListenSequentialPacket= in dcpxd.socket)",
                           fd);
  for (int extra = fd + 1; extra < fd + n; extra++) {
    log_warning("Ignoring extra socket-activation fd %d", extra);
    close(extra);
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
    return log_error_errno(-errno, "Cannot make fd %d non-blocking: %m", fd);
  m->listen_fd = fd;
  m->socket_created = false;
  log_info("Listening on the socket passed by the service manager (fd %d)", fd);
  return 0;
}

/* Removes a socket file nobody listens on any more (a crashed daemon's);
 * refuses to touch anything else. The probe's connect() waits at most
 * DCPXD_PROBE_MS: one to a listener whose backlog is full (a hung or
 * stopped dcpxd) blocked for ever. A signal that comes meanwhile ends the
 * wait (SO_SNDTIMEO: no SA_RESTART): -EINTR, unlogged, for the caller to
 * handle the signal (dcpxd.c, server_listen). */
#define DCPXD_PROBE_MS 1000
static int clear_stale_socket(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct timeval tv = {.tv_sec = DCPXD_PROBE_MS / 1000,
                       .tv_usec = (DCPXD_PROBE_MS % 1000) * 1000};
  struct stat st;
  _cleanup_close_ int probe = -1;

  if (lstat(path, &st) < 0) {
    if (errno == ENOENT)
      return 0;
    /* a folder on the way that is a file (ENOTDIR) or that dcpxd may not
     * search (EACCES): said, not only "startup failed" */
    return log_error_errno(-errno, "Cannot use socket path %s: %m", path);
  }
  if (!S_ISSOCK(st.st_mode))
    return log_error_errno(-EEXIST, "%s exists and is not a socket", path);
  probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (probe < 0)
    return log_error_errno(-errno, "Cannot probe %s: %m", path);
  /* For AF_UNIX, SO_SNDTIMEO bounds connect() (EAGAIN when it runs out). */
  if (setsockopt(probe, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
    return log_error_errno(-errno, "Cannot probe %s: %m", path);
  strncpy(sa.sun_path, path, sizeof(sa.sun_path) - 1);
  if (connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0)
    return log_error_errno(-EADDRINUSE,
                           "Another dcpxd is already listening on %s", path);
  if (errno == EINTR)
    return -EINTR;
  if (errno == EAGAIN || errno == EINPROGRESS)
    return log_error_errno(-EADDRINUSE,
                           "Another process listens on %s but accepted no "
                           "connection in %d ms (a hung or stopped dcpxd?); "
                           "not starting, and leaving the socket in place",
                           path, DCPXD_PROBE_MS);
  if (errno != ECONNREFUSED)
    return log_error_errno(-errno, "Cannot probe %s: %m", path);
  log_notice("Removing stale socket %s", path);
  if (unlink(path) < 0 && errno != ENOENT)
    return log_error_errno(-errno, "Cannot remove stale socket %s: %m", path);
  return 0;
}

static int create_socket(dcpxd_manager *m) {
  const char *path = m->conf->socket_path;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  _cleanup_close_ int fd = -1;
  char dir[PATH_MAX];
  mode_t old;
  int r;

  if (strlen(path) >= sizeof(sa.sun_path))
    return log_error_errno(-ENAMETOOLONG, "Socket path %s: %m", path);
  strcpy(sa.sun_path, path);

  /* Create the socket's directory if it is missing (one level; under
   * systemd, RuntimeDirectory= does it). */
  dcpxd_bprintf(dir, "%s", path);
  if (mkdir(dirname(dir), 0755) < 0 && errno != EEXIST)
    return log_error_errno(-errno, "Cannot create directory %s: %m", dir);

  r = clear_stale_socket(path);
  if (r < 0)
    return r;
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return log_error_errno(-errno, "Cannot create socket: %m");
  /* Bind with a umask that already gives the final mode, so that the
   * socket is never reachable with wider permissions; chmod makes it
   * exact. */
  old = umask(~m->conf->socket_mode & 0777);
  r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
  umask(old);
  if (r < 0)
    return log_error_errno(-errno, "Cannot bind %s: %m", path);
  m->socket_created = true;
  if (chmod(path, m->conf->socket_mode) < 0)
    return log_error_errno(-errno, "Cannot chmod %s: %m", path);
  if (listen(fd, 128) < 0)
    return log_error_errno(-errno, "Cannot listen on %s: %m", path);
  m->listen_fd = TAKE_FD(fd);
  log_info("Listening on %s (mode %04o)", path, (unsigned)m->conf->socket_mode);
  return 0;
}

int dcpxd_server_listen(dcpxd_manager *m) {
  int n, r;

  n = dcpxd_listen_fds();
  if (n < 0)
    return log_error_errno(n, "Bad socket activation environment: %m");
  r = n > 0 ? use_activated_socket(m, n) : create_socket(m);
  if (r < 0)
    return r;
  uv_poll_init(m->loop, &m->listen_poll, m->listen_fd);
  m->listen_poll.data = m;
  uv_timer_init(m->loop, &m->accept_retry);
  m->accept_retry.data = m;
  m->reserve_fd = -1;
  reserve_open(m);
  m->listening = true;
  uv_poll_start(&m->listen_poll, UV_READABLE, on_listen);
  return 0;
}

static void on_listen_closed(uv_handle_t *h) {
  dcpxd_manager *m = h->data;
  if (m->listen_fd >= 0)
    close(m->listen_fd);
  m->listen_fd = -1;
}

void dcpxd_server_stop(dcpxd_manager *m) {
  if (m->reserve_fd >= 0)
    close(m->reserve_fd);
  m->reserve_fd = -1;
  if (m->listening) {
    m->listening = false;
    uv_close((uv_handle_t *)&m->listen_poll, on_listen_closed);
    uv_close((uv_handle_t *)&m->accept_retry, NULL);
  } else if (m->listen_fd >= 0) {
    close(m->listen_fd);
    m->listen_fd = -1;
  }
  if (m->socket_created) {
    if (unlink(m->conf->socket_path) < 0 && errno != ENOENT)
      log_warning_errno(-errno, "Cannot remove %s: %m", m->conf->socket_path);
    m->socket_created = false;
  }
}

void dcpxd_manager_init(dcpxd_manager *m, dcpxd_conf *conf) {
  memset(m, 0, sizeof(*m));
  m->conf = conf;
  m->listen_fd = -1;
  m->reserve_fd = -1;
  TAILQ_INIT(&m->conns);
  TAILQ_INIT(&m->reap);
  TAILQ_INIT(&m->muted);
  TAILQ_INIT(&m->groups);
}
