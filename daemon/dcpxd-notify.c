/* dcpxd-notify.c - sd_notify, watchdog and socket activation (see
 * dcpxd-notify.h).
 *
 * Without libsystemd: a notification is one datagram to the AF_UNIX socket
 * named by $NOTIFY_SOCKET (a leading '@' means the abstract namespace);
 * $WATCHDOG_USEC (with $WATCHDOG_PID, if set, naming us) gives the watchdog
 * interval; $LISTEN_FDS descriptors from fd 3 on are ours when $LISTEN_PID
 * is our pid. These are the protocols documented in sd_notify(3),
 * sd_watchdog_enabled(3) and sd_listen_fds(3).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "dcpxd-notify.h"
#include "dcpxd-util.h"

#ifdef HAVE_LIBSYSTEMD

int dcpxd_notify(const char *state) { return sd_notify(0, state); }

uint64_t dcpxd_watchdog_usec(void) {
  uint64_t usec = 0;
  return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}

int dcpxd_listen_fds(void) { return sd_listen_fds(1); }

#else /* !HAVE_LIBSYSTEMD */

int dcpxd_notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  _cleanup_close_ int fd = -1;
  size_t len;
  socklen_t salen;

  if (!path || !*path)
    return 0;
  len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path))
    return -EINVAL;
  memcpy(sa.sun_path, path, len);
  if (path[0] == '@')
    sa.sun_path[0] = '\0';
  salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
                      (path[0] == '/'));
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
             salen) < 0)
    return -errno;
  return 1;
}

uint64_t dcpxd_watchdog_usec(void) {
  const char *s = getenv("WATCHDOG_USEC"), *p = getenv("WATCHDOG_PID");
  uint64_t usec, pid;

  if (!s || dcpxd_parse_u64(s, 10, &usec) < 0 || usec == 0)
    return 0;
  if (p && (dcpxd_parse_u64(p, 10, &pid) < 0 || pid != (uint64_t)getpid()))
    return 0;
  return usec;
}

int dcpxd_listen_fds(void) {
  const char *p = getenv("LISTEN_PID"), *n = getenv("LISTEN_FDS");
  uint64_t pid, nfds;
  int r = 0;

  if (!p || !n)
    goto out;
  if (dcpxd_parse_u64(p, 10, &pid) < 0 || dcpxd_parse_u64(n, 10, &nfds) < 0) {
    r = -EINVAL;
    goto out;
  }
  if (pid != (uint64_t)getpid())
    goto out;
  if (nfds > 64) {
    r = -EINVAL;
    goto out;
  }
  for (int fd = DCPXD_LISTEN_FDS_START; fd < DCPXD_LISTEN_FDS_START + (int)nfds;
       fd++)
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
      r = -errno;
      goto out;
    }
  r = (int)nfds;
out:
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return r;
}

#endif /* HAVE_LIBSYSTEMD */
