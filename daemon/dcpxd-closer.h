/* dcpxd-closer.h - closing descriptors on a thread of their own.
 *
 * A close can take long: the last reference of a large memfd frees its
 * pages in it (about 40 ms a GiB), and a FUSE file's close waits on its
 * server's flush for as long as the server likes. dcpxd closes the fds
 * that clients send, and those of the buffers it frees, here, never on
 * its event loop, and not on libuv's thread pool either, where the
 * records writer and the recoveries' zeroing run: a client's files must
 * not hold those up. */
#ifndef DCPXD_CLOSER_H
#define DCPXD_CLOSER_H

/* Starts the closer thread: 0 or -errno (then fds are closed at once). */
int dcpxd_closer_start(void);
/* close(fd) on the closer thread, in no particular order; at once when it
 * is not running or its queue cannot grow. fd < 0 is ignored. */
void dcpxd_closer_close(int fd);
/* Waits up to ms milliseconds for the queued closes, then stops taking
 * more (dcpxd_closer_close closes at once after it). A close that does
 * not return in time is left to the thread, which exit ends. */
void dcpxd_closer_stop(int ms);

#endif /* DCPXD_CLOSER_H */
