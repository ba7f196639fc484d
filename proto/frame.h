/* frame.h - one protobuf Frame per SOCK_SEQPACKET packet, with optional
 * file descriptors (SCM_RIGHTS). Shared by libdcpx, dcpxd and dcpxctl.
 *
 * Limits: a packed frame is at most DCPX_FRAME_MAX bytes; a packet carries
 * at most DCPX_FRAME_MAX_FDS descriptors. A receiver treats a truncated
 * packet (over the limit), a packet with more descriptors than it takes, a
 * packet that does not unpack, a frame with no message, or a string field
 * that is not text (valid UTF-8 without NUL) as an error, and closes every
 * descriptor of a packet it refuses (and any it did not ask for).
 */
#ifndef DCPX_PROTO_FRAME_H
#define DCPX_PROTO_FRAME_H

#include <stddef.h>

#include "dcpx.h"
#include "proto/dcpx.pb-c.h"

#define DCPX_PROTO_VERSION 1u
#define DCPX_FRAME_MAX (256u * 1024u)
#define DCPX_FRAME_MAX_FDS 20 /* ctl + 16 workspaces + spare */
/* dcpxd's bound on the wire fields of a request, every level counted (the
 * largest a client sends, a Join, has 21; unknown fields count, and each
 * is a malloc in the unpack): see dcpx__frame_recv_cases. */
#define DCPX_FRAME_MAX_FIELDS 256u

#ifndef DCPX__HIDDEN
#define DCPX__HIDDEN __attribute__((visibility("hidden")))
#endif

/* Packs and sends f with nfds descriptors. Returns 0 or a negative code
 * (DCPX_E_MSGSIZE if the frame is over the limit, -errno from sendmsg).
 * Never raises SIGPIPE. */
DCPX__HIDDEN int dcpx__frame_send(int sock, const Dcpx__Frame *f,
                                  const int *fds, int nfds);

/* Receives one frame. Blocks unless the socket is non-blocking. A packet
 * the peer sent before it closed is returned even when the close reset the
 * connection (Linux reports the reset first); the reset comes after it.
 * Returns 0 with *ret_frame (free with dcpx__frame_free) and up to maxfds
 * descriptors in fds (*ret_nfds of them, O_CLOEXEC; with fds NULL any are
 * closed); DCPX_E_CONNRESET at end of stream; -EAGAIN if non-blocking and
 * nothing is queued; DCPX_E_MSGSIZE for an oversized packet; DCPX_E_FDS
 * for one with more than maxfds (or DCPX_FRAME_MAX_FDS) descriptors;
 * -EMFILE when this process had no room for the descriptors sent (its
 * open-file limit);
 * DCPX_E_PROTO for one that does not unpack or names no message;
 * DCPX_E_TEXT for a string field that is not text. */
DCPX__HIDDEN int dcpx__frame_recv(int sock, Dcpx__Frame **ret_frame, int *fds,
                                  int maxfds, int *ret_nfds);

/* dcpx__frame_recv of a side that receives only the Frame messages whose
 * case numbers (DCPX__FRAME__MSG_*) are set in `cases` (bit 1 << case),
 * and packets of at most max_fields wire fields, every level counted
 * (0: any number). A packet past either is DCPX_E_PROTO before protobuf-c
 * unpacks anything, with *ret_refused (else 0) the case it named or
 * DCPX_FRAME_PEEK_FIELDS (dcpxd: the replies and events, whose repeated
 * fields cost it milliseconds a packet to unpack, and junk fields, each
 * one a malloc). take_fds (NULL: every packet's) says from a peek at the
 * packet whether its fds are taken; those of a packet it declines are
 * never installed here (the kernel drops them) and *ret_nfds is 0. */
DCPX__HIDDEN int dcpx__frame_recv_cases(
    int sock, uint32_t cases, unsigned max_fields,
    int (*take_fds)(const uint8_t *pkt, size_t n), Dcpx__Frame **ret_frame,
    int *fds, int maxfds, int *ret_nfds, int *ret_refused);

/* Whether the packet buf[0..n) is a Frame whose message is a Join with
 * reattach set (the only request that carries fds), as far as its wire
 * format says without unpacking. */
DCPX__HIDDEN int dcpx__frame_is_reattach(const uint8_t *buf, size_t n);

/* What dcpx__frame_recv_cases would refuse the packet buf[0..n) for before
 * unpacking it: the first Frame case (1..DCPX__FRAME__MSG_COMMAND) not in
 * `cases`, as a message field of the packet's top level;
 * DCPX_FRAME_PEEK_FIELDS when its wire fields, at the top level and in
 * the sub-messages protobuf-c unpacks, number more than max_fields (not
 * 0); else 0, also for a packet that is not wire format as far as it was
 * read (its unpack refuses it). */
#define DCPX_FRAME_PEEK_FIELDS (-1)
DCPX__HIDDEN int dcpx__frame_peek(const uint8_t *buf, size_t n,
                                  uint32_t cases, unsigned max_fields);

DCPX__HIDDEN void dcpx__frame_free(Dcpx__Frame *f);

/* How the receive functions close the descriptors of a packet they refuse
 * (or past maxfds): fn (dcpxd: off its event loop, since a client's fd
 * may be a FUSE file whose close waits on its server), or close(2) when
 * NULL (the default). */
DCPX__HIDDEN void dcpx__frame_set_closer(void (*fn)(int fd));

/* Ops connections (dcpxctl, bench/soak): one place for the socket path
 * and the Hello exchange. (libdcpx's dcpx_connect does the same for
 * engines, non-blocking for its reattach.) */
/* path if not NULL or empty, else $DCPX_SOCKET if set and not empty, else
 * DCPX_DEFAULT_SOCKET. */
DCPX__HIDDEN const char *dcpx__socket_path(const char *path);
/* Milliseconds of CLOCK_MONOTONIC, and that clock ms >= 0 milliseconds
 * from now (a negative ms is 0). */
DCPX__HIDDEN uint64_t dcpx__mono_ms(void);
DCPX__HIDDEN uint64_t dcpx__deadline_ms(int ms);
/* Waits until sock has `events` (1), deadline_ms (dcpx__mono_ms) passes
 * (0), or poll fails (a negative errno). A signal does not start the wait
 * over: each retry after EINTR waits only for what is left. */
DCPX__HIDDEN int dcpx__poll_until(int sock, short events,
                                  uint64_t deadline_ms);
/* Receives the next frame that is not an Event, within timeout_ms in all
 * (Events skipped and signals do not restart it): 0 with *ret,
 * DCPX_E_TIMEDOUT, or dcpx__frame_recv's error. */
DCPX__HIDDEN int dcpx__frame_recv_answer(int sock, int timeout_ms,
                                         Dcpx__Frame **ret);
/* Connects to dcpxd at dcpx__socket_path(path) and exchanges Hello (as
 * agent), waiting at most timeout_ms for the Reply. Returns the connected
 * socket (blocking, O_CLOEXEC), or a negative code with one line of why
 * in err (the daemon's reason if it refused). */
DCPX__HIDDEN int dcpx__ops_connect(const char *path, const char *agent,
                                   int timeout_ms, char *err, size_t errlen);
/* The same, and *ret_join_ms: the daemon's join timeout from its Hello
 * reply (0 if it did not say). */
DCPX__HIDDEN int dcpx__ops_connect_join(const char *path, const char *agent,
                                        int timeout_ms, char *err,
                                        size_t errlen, uint32_t *ret_join_ms);

/* Text rules, one place for the client and the daemon. */
/* 1 if the n bytes are valid UTF-8 without NUL (every string field of a
 * frame must be). */
DCPX__HIDDEN int dcpx__text_ok(const void *data, size_t n);
/* Replaces every byte of s that is not part of a valid UTF-8 sequence
 * with '?', in place (texts the daemon sends, e.g. Reply.error). */
DCPX__HIDDEN void dcpx__text_clean(char *s);
/* 1 if s is a group name: 1..DCPX_GROUP_NAME_MAX bytes of [A-Za-z0-9._-]. */
DCPX__HIDDEN int dcpx__group_name_ok(const char *s);
/* The rule in words, for the errors that refuse a name (a printf format:
 * its %d takes DCPX_GROUP_NAME_MAX). */
#define DCPX__GROUP_NAME_RULE "1..%d bytes of [A-Za-z0-9._-]"

/* A shape on the wire and back: the one copy of its seven fields.
 * dcpx__shape_to_pb initialises *out; dcpx__shape_from_pb sets out->size to
 * sizeof(dcpx_shape), and fields a sender left out read as 0 (which
 * dcpx_shape_check refuses). */
DCPX__HIDDEN void dcpx__shape_to_pb(const dcpx_shape *in, Dcpx__Shape *out);
DCPX__HIDDEN void dcpx__shape_from_pb(const Dcpx__Shape *in, dcpx_shape *out);

/* The health a query reports, one rule for dcpxd (which puts the groups
 * that are not healthy first in a reply it must trim) and dcpxctl (exit
 * codes, check): a rank is healthy while its group forms, else when it is
 * joined with neither alarm nor failed; a group when it is not aborted or
 * recovering and every rank is healthy. */
DCPX__HIDDEN int dcpx__group_info_healthy(const Dcpx__GroupInfo *g);

/* Reply helpers. */
DCPX__HIDDEN int dcpx__send_reply(int sock, int status, const char *error);

/* Sends f (no descriptors) as dcpx__frame_send does; but when the send
 * fails because the peer already answered and closed (dcpxd refuses a
 * connection with a Reply and closes it at once: a uid not allowed, too
 * many connections), the answer still waits in the socket: it is read
 * (without blocking), and its status is returned instead of the send's
 * -EPIPE / DCPX_E_CONNRESET, with its text copied into err (errlen bytes,
 * NUL-terminated; err may be NULL). Any other failure is returned as
 * dcpx__frame_send gave it, and err is left alone. */
DCPX__HIDDEN int dcpx__frame_send_or_reply(int sock, const Dcpx__Frame *f,
                                           char *err, size_t errlen);

/* After a send found the peer gone: the refusal it queued before closing
 * (a Reply with a negative status), read without blocking, its text into
 * err as above; 0 if there is none. */
DCPX__HIDDEN int dcpx__frame_queued_refusal(int sock, char *err,
                                            size_t errlen);

#endif /* DCPX_PROTO_FRAME_H */
