/* dcpxd-notify.h - the daemon's side of systemd: readiness and status
 * notifications, the watchdog, and socket activation. Uses libsystemd when
 * configure found it (HAVE_LIBSYSTEMD); otherwise speaks the (small, stable)
 * protocols itself, so dcpxd behaves the same under systemd either way. */
#ifndef DCPXD_NOTIFY_H
#define DCPXD_NOTIFY_H

#include <stdint.h>

/* Sends a notification ("READY=1", "STATUS=...", "WATCHDOG=1", ...).
 * Returns > 0 if sent, 0 if not run under a service manager, < 0 on error. */
int dcpxd_notify(const char *state);

/* The watchdog interval in us, or 0 if the service manager set none for
 * this process. */
uint64_t dcpxd_watchdog_usec(void);

/* Descriptors passed by socket activation (they start at fd 3), 0 if none,
 * or < 0 on error. Unsets LISTEN_* so that children do not inherit them. */
int dcpxd_listen_fds(void);

#define DCPXD_LISTEN_FDS_START 3

#endif /* DCPXD_NOTIFY_H */
