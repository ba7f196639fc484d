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

#include "dcpx.h"

/* The socket libdcpx connects to by default: one definition, in dcpx.h. */
#define DCPXD_DEFAULT_SOCKET DCPX_DEFAULT_SOCKET
#define DCPXD_DEFAULT_STATE_DIR "/var/lib/dcpx"
#define DCPXD_DEFAULT_CONFIG "/etc/dcpx/dcpxd.conf"
#define DCPXD_DEFAULT_POLL_MS 2u
#define DCPXD_MAX_POLL_MS 5u
#define DCPXD_DEFAULT_JOIN_TIMEOUT_MS 30000u
#define DCPXD_DEFAULT_RECORDS_MAX_BYTES (4ull << 20)
#define DCPXD_DEFAULT_HELLO_TIMEOUT_MS 5000u
#define DCPXD_DEFAULT_IDLE_TIMEOUT_MS 60000u
#define DCPXD_DEFAULT_MAX_CONNS_PER_UID 256u
#define DCPXD_DEFAULT_MAX_GROUPS_PER_UID 64u
#define DCPXD_DEFAULT_MAX_QUEUED_BYTES (64ull << 20)

/* group-owner = PATTERN:uid:ID or PATTERN:gid:ID (docs/PROTOCOL.md 7.1):
 * groups whose name matches PATTERN (fnmatch) belong to that uid, or to
 * every member of that gid. The first matching rule applies. */
typedef struct dcpxd_owner_rule {
  char *pattern;
  bool is_gid;
  uint32_t id;
} dcpxd_owner_rule;

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
  dcpxd_owner_rule *owner_rules;
  size_t n_owner_rules;
  /* Members of these groups are admins (docs/PROTOCOL.md 7.1). */
  gid_t *admin_gids;
  size_t n_admin_gids;
  /* Bounds on connections (docs/PROTOCOL.md 7.2). */
  uint32_t hello_timeout_ms;  /* from accept to Hello */
  uint32_t idle_timeout_ms;   /* a connection that holds no group */
  uint32_t max_conns_per_uid; /* root is exempt */
  uint64_t max_queued_bytes;  /* output queued for peers not reading */
  /* Bounds on groups (7.3); 0 bytes: no cap. Root is exempt per uid. */
  uint32_t max_groups_per_uid;
  uint64_t max_ws_bytes;         /* committed by all groups */
  uint64_t max_ws_bytes_per_uid; /* committed by a uid's groups */
  bool fault_injection;
  uint64_t records_max_bytes; /* rotate records.log beyond this */
  int log_level;
  uint32_t log_rate_burst;       /* lines per format per interval; 0: all */
  uint32_t log_rate_interval_ms; /* the rate limiter's interval */
  char *config_path; /* the file read, or NULL */

  /* Which source last set each list, so that flags replace the file's
   * list while repeated flags add to each other. */
  int uids_source, gids_source, admin_source, owner_source;
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

/* The first owner rule whose pattern matches the group name, or NULL. */
const dcpxd_owner_rule *dcpxd_conf_owner_rule(const dcpxd_conf *c,
                                              const char *group);

/* True if a peer with these credentials is an admin: root, dcpxd's own
 * uid, or a member of an admin-gid group. */
bool dcpxd_conf_peer_admin(const dcpxd_conf *c, uid_t uid, const gid_t *gids,
                           size_t n_gids);

#endif /* DCPXD_CONF_H */
