/* dcpxd-conf.h - dcpxd's settings: defaults, the config file, the flags.
 *
 * Every setting has one name, used both as the config file key and as the
 * long flag ("state-dir = /x" in the file, --state-dir=/x on the command
 * line). Precedence: built-in default < config file < flag. */
#ifndef DCPXD_CONF_H
#define DCPXD_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DCPXD_DEFAULT_SOCKET "/run/dcpx/dcpxd.sock"
#define DCPXD_DEFAULT_STATE_DIR "/var/lib/dcpx"
#define DCPXD_DEFAULT_CONFIG "/etc/dcpx/dcpxd.conf"
#define DCPXD_DEFAULT_POLL_MS 2u
#define DCPXD_MAX_POLL_MS 5u
#define DCPXD_DEFAULT_JOIN_TIMEOUT_MS 30000u
#define DCPXD_DEFAULT_RECORDS_MAX_BYTES (4ull << 20)

typedef struct dcpxd_conf {
  char *socket_path;
  mode_t socket_mode;
  char *state_dir;
  uint32_t poll_ms;         /* alarm scan period, 1..DCPXD_MAX_POLL_MS */
  uint32_t join_timeout_ms; /* for joins that pass 0 */
  /* Who may connect, besides root and the daemon's own uid. */
  uid_t *allow_uids;
  size_t n_allow_uids;
  gid_t *allow_gids;
  size_t n_allow_gids;
  bool fault_injection;
  uint64_t records_max_bytes; /* rotate records.log beyond this */
  int log_level;
  char *config_path; /* the file read, or NULL */

  /* Which source last set each list, so that flags replace the file's
   * list while repeated flags add to each other. */
  int uids_source, gids_source;
} dcpxd_conf;

/* Outcome of dcpxd_conf_load() besides errors. */
enum {
  DCPXD_CONF_RUN = 0,  /* start the daemon */
  DCPXD_CONF_EXIT = 1, /* --help or --version was printed */
};

/* Fills *c from the defaults, the config file (--config FILE, else
 * DCPXD_DEFAULT_CONFIG if it exists) and argv. On a bad setting it prints
 * a message naming the source, and returns -EINVAL: exit with status 2. */
int dcpxd_conf_load(dcpxd_conf *c, int argc, char **argv);

void dcpxd_conf_done(dcpxd_conf *c);

/* True if a peer with these credentials may talk to the daemon. */
bool dcpxd_conf_peer_allowed(const dcpxd_conf *c, uid_t uid, const gid_t *gids,
                             size_t n_gids);

#endif /* DCPXD_CONF_H */
