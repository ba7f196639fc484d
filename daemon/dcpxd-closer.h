/* dcpxd-closer.h - closing descriptors on threads of their own.
 *
 * A close can take long: the last reference of a large memfd frees its
 * pages in it (about 40 ms a GiB), and a FUSE file's close waits on its
 * server's flush for as long as the server likes (a flush the server has
 * read is waited out even by SIGKILL). dcpxd closes the fds that clients
 * send on one closer thread and those of the buffers it frees on another,
 * never on its event loop, and not on libuv's thread pool either, where
 * the records writer and the recoveries' zeroing run: a client's files
 * must not hold those up, nor dcpxd's own memory. dcpxd takes a client's
 * fds only with a reattaching Join, and not while the clients' closer
 * is behind (dcpxd_closer_backlog): a stuck close then costs a bounded
 * number of descriptors. */
#ifndef DCPXD_CLOSER_H
#define DCPXD_CLOSER_H

#include <stddef.h>

/* Starts the closer threads: 0 or -errno (then fds are closed at once). */
int dcpxd_closer_start(void);
/* close(fd) of an fd a client sent, on the clients' closer, in no
 * particular order; at once when it is not running or its queue cannot
 * grow. fd < 0 is ignored. */
void dcpxd_closer_close(int fd);
/* The same for an fd of dcpxd's own buffers (a memfd, a CUDA handle). */
void dcpxd_closer_close_own(int fd);
/* The clients' fds queued or being closed. */
size_t dcpxd_closer_backlog(void);
/* Waits up to ms milliseconds for the queued closes, then stops taking
 * more (dcpxd_closer_close closes at once after it). A close that does
 * not return in time is left to its thread (a FUSE flush may hold the
 * process's exit until its server answers or its connection is
 * aborted). */
void dcpxd_closer_stop(int ms);

#endif /* DCPXD_CLOSER_H */
