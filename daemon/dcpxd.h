/* dcpxd.h - the daemon's internal objects and how its files divide the work.
 *
 *   dcpxd.c          main(): settings, the libuv loop, signals, sd_notify
 *                    READY/STATUS/WATCHDOG, orderly shutdown
 *   dcpxd-conf.c     defaults, config file, flags
 *   dcpxd-server.c   the listening socket and the connections: accept,
 *                    peer credentials, framing, send queue, Hello, dispatch
 *   dcpxd-group.c    groups: rendezvous (Join), memory, abort, recovery,
 *                    Leave and dead members, operator reset, fault hook
 *   dcpxd-health.c   the alarm scan of every ready group's control page and
 *                    the harvest of its wait records
 *   dcpxd-query.c    Query and Command (dcpxctl)
 *   dcpxd-records.c  durable, bounded record storage
 *   dcpxd-secrets.c  the groups it created and their secrets (reattach)
 *   dcpxd-mem.c      the host memory backend (memfd); dcpxd-mem-cuda.c
 *                    the CUDA one (VMM, POSIX fds)
 *   dcpxd-notify.c   systemd notify / watchdog / socket activation
 *   dcpxd-log.c      logging
 *
 * Ownership: the manager owns every connection and every group. A group
 * points at its members' connections and a member connection back at its
 * group; both links are cut together (dcpxd-group.c), never one alone.
 *
 * Re-entrancy rule: nothing closes a connection synchronously. A protocol
 * error or a hang-up only marks the connection closing (dcpxd_conn_close);
 * a failed send only mutes it (nothing more is sent to it; what its peer
 * sent is still read); the "reaper" idle handle then, on the next loop
 * turn, reads what a muted connection's socket holds and closes it, and
 * removes a closing one from its group. So group code may send to all
 * members in a loop without members vanishing under it.
 */
#ifndef DCPXD_H
#define DCPXD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <uv.h>

#include "dcpx.h"
#include "dcpxd-conf.h"
#include "dcpxd-mem.h"
#include "dcpxd-records.h"
#include "dcpxd-secrets.h"
#include "frame.h"
#include "layout.h"

typedef struct dcpxd_manager dcpxd_manager;
typedef struct dcpxd_conn dcpxd_conn;
typedef struct dcpxd_group dcpxd_group;

/* ---- connections (dcpxd-server.c) ------------------------------------- */

#define DCPXD_MAX_CONNS 4096
/* Connections past DCPXD_MAX_CONNS that only admins (root, dcpxd's user,
 * admin-gid) may open: an operator can still run dcpxctl on a node whose
 * clients took every ordinary slot. */
#define DCPXD_ADMIN_CONNS 16
/* Bytes a connection may have queued (peer not reading) before it is cut. */
#define DCPXD_OUT_MAX (2u << 20)

typedef struct dcpxd_outmsg {
  struct dcpxd_outmsg *next;
  size_t len;
  int nfds;
  int fds[DCPX_FRAME_MAX_FDS]; /* our dups, closed once sent */
  uint8_t data[];
} dcpxd_outmsg;

struct dcpxd_conn {
  dcpxd_manager *m;
  uint64_t id; /* for logs: "conn 7" */
  int fd;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  uv_poll_t poll;
  uv_timer_t join_timer; /* armed while a Join waits in a forming group
                          * (dcpxd_conn_join_wait) */
  uv_timer_t idle_timer; /* armed while the connection holds no group */
  /* A member's process, watched through a pidfd: its death is noticed
   * even when its socket stays open (inherited by a child). -1: none. */
  int pidfd;
  uv_poll_t pid_poll;
  int open_handles; /* freed when every handle has closed */
  unsigned poll_events;
  bool hello;   /* Hello accepted */
  bool admin;   /* root, dcpxd's uid or an admin-gid member (7.1) */
  bool closing; /* dcpxd_conn_close() called; in the reap list */
  bool reading; /* its requests are being read (read_frames) */
  bool exited;  /* its process exited (pid_poll): what it sent is read, a
                 * Join refused, and then it closes */
  /* A send to it failed (the negative code; 0: none): nothing more is
   * sent, but what the peer sent is still read and handled, in order (a
   * Leave counts as a Leave, a Join is refused), until the reaper, on
   * the next loop turn, has read what the socket holds and closes it. */
  int send_err;
  bool muted_listed; /* in manager->muted (send_err, not yet closing) */
  char agent[64];
  char close_reason[160];

  /* Membership: group != NULL iff group->member[rank].conn == this. */
  dcpxd_group *group;
  uint32_t rank;
  /* The reattaching Join being handled, while it is: its refusal is
   * noted (dcpxd_refusal_note) */
  const Dcpx__Join *reattach_j;

  dcpxd_outmsg *out_head, *out_tail;
  size_t out_bytes;

  TAILQ_ENTRY(dcpxd_conn) link;      /* manager->conns */
  TAILQ_ENTRY(dcpxd_conn) reap_link; /* manager->reap, while closing */
  TAILQ_ENTRY(dcpxd_conn) muted_link; /* manager->muted */
};

int dcpxd_server_listen(dcpxd_manager *m);
void dcpxd_server_stop(dcpxd_manager *m);

/* Sends a frame (and fds, which stay the caller's), queueing it if the
 * socket is full. A connection whose send fails is muted (send_err: what
 * it sent is still read; the reaper closes it), one over its output
 * bounds marked closing. Returns 0 or a negative code; DCPX_E_MSGSIZE
 * leaves the connection as it was. */
int dcpxd_conn_send(dcpxd_conn *c, const Dcpx__Frame *f, const int *fds,
                    int nfds);
/* Sends Reply{status, formatted error}. */
int dcpxd_conn_reply(dcpxd_conn *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Marks c closing (logged at `level` with the reason); see the
 * re-entrancy rule above. Idempotent. */
void dcpxd_conn_close(dcpxd_conn *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* (Re)starts the Hello deadline or the idle timeout of a connection that
 * holds no group, or stops it for a member (docs/PROTOCOL.md 7.3). */
void dcpxd_conn_idle_arm(dcpxd_conn *c);
/* Tries to send what is queued (at shutdown, before closing). */
void dcpxd_conn_flush(dcpxd_conn *c);
/* A Join of c waits for its group, at most timeout_ms (then on_timeout
 * runs): until dcpxd_conn_join_done, c's next requests are not read, only
 * its hang-up, which gives the Join up (dcpxd_group_join_gone; docs/
 * PROTOCOL.md 10.3). */
void dcpxd_conn_join_wait(dcpxd_conn *c, uv_timer_cb on_timeout,
                          uint64_t timeout_ms);
/* c's Join is answered, or c leaves its group: its requests are read
 * again. */
void dcpxd_conn_join_done(dcpxd_conn *c);
/* Whether a Join of c waits for its group (between the two above). */
bool dcpxd_conn_join_waits(const dcpxd_conn *c);
/* c's peer hung up, though the loop has not handled that yet (another
 * connection's request found it, dcpx-group.c conn_hung_up): handled now
 * as the loop would, so that what c sent before is answered, in order (a
 * Leave counts as a Leave), down to its end of stream, which closes c.
 * That may change or destroy c's group, and any group c's requests name:
 * the caller looks its group up again. */
void dcpxd_conn_hangup(dcpxd_conn *c);
/* Watches the peer process (member connections): when it exits, what it
 * sent that the socket holds is answered first (a Leave counts as a
 * Leave), then the connection is closed as if it had hung up. 0, or a
 * negative code when the kernel has no pidfd (then only the socket's
 * hang-up tells). */
int dcpxd_conn_watch_pid(dcpxd_conn *c);

/* ---- groups (dcpxd-group.c) -------------------------------------------- */

typedef enum dcpxd_group_state {
  DCPXD_GROUP_FORMING,    /* waiting for all W ranks; no memory yet */
  DCPXD_GROUP_READY,      /* formed, abort word 0 */
  DCPXD_GROUP_ABORTED,    /* abort word set; waiting for a recovery */
  DCPXD_GROUP_RECOVERING, /* ranks asked to drain; collecting acks, then
                             zeroing */
} dcpxd_group_state;

typedef struct dcpxd_member {
  dcpxd_conn *conn; /* NULL: no live process holds this rank */
  pid_t pid;        /* of the last process that held it */
  int32_t device;  /* in this daemon's numbering (Join.device_uuid) */
  uint8_t uuid[16]; /* Join.device_uuid, uuid_len 0 or 16 bytes */
  uint8_t uuid_len;
  bool acked; /* drained, for the recovery in progress */
  char node[64];
  uint64_t timeouts; /* its wait records harvested (kept or not) */
  /* Timeout records of other ranks harvested that name this rank as the
   * one they awaited (has_awaited_rank): it is the straggler or the dead
   * peer. Like timeouts: kept across recoveries and replacements, from 0
   * for a group this dcpxd creates or adopts after a restart. */
  uint64_t awaited_timeouts;
} dcpxd_member;

struct dcpxd_group {
  dcpxd_manager *m;
  char name[DCPXD_GROUP_NAME_MAX + 1];
  uid_t owner; /* the uid that created (or adopted) it (7.1) */
  const dcpxd_owner_rule *rule; /* the group-owner rule of its name */
  uint64_t bytes; /* committed once formed (the caps of 7.3) */
  dcpx_shape shape;
  int transport; /* resolved: never TRANSPORT_AUTO */
  int backend;
  uint64_t timeout_ns;
  dcpx_layout L;

  dcpxd_group_state state;
  uint32_t generation;
  uint32_t live; /* members with a connection */
  bool left;     /* a member left it with a Leave: it is being given up */
  dcpxd_member member[DCPX_MAX_WORLD];
  /* rank 0's latest NCCL unique id (its Join, its RecoverAck): relayed in
   * JoinReply.nccl_id and through the control page (nccl_gen, nccl_id);
   * nccl_fresh: sent during the recovery under way. */
  uint8_t nccl_id[DCPX_NCCL_ID_BYTES];
  size_t nccl_id_len;
  bool nccl_fresh;
  /* While forming: the last join refused for its shape (its rank in
   * refused_rank), told to the ranks whose join then times out while
   * that rank is still missing ("" when none), or as a duplicate
   * (refused_dup: told whoever holds its rank, since a second claim of a
   * rank is why another rank may never come). */
  char refused[240];
  uint32_t refused_rank;
  bool refused_dup;

  /* Memory, from formation on. */
  const dcpxd_mem_ops *mem;
  dcpxd_buf *ctl;
  dcpxd_buf *ws[DCPX_MAX_WORLD];
  dcpx_ctl_header *hdr; /* the daemon's mapping of ctl */
  uint8_t *harvested;   /* bit per record slot already stored */

  /* Recovery: the workspaces are zeroed on a worker thread. */
  uv_work_t zero_work;
  bool zeroing;
  bool doomed; /* destroyed while zeroing: freed when the work returns */
  int zero_status;
  uint64_t zero_start_ns; /* CLOCK_MONOTONIC, for the log */

  /* Adopted: recreated from a reattaching member's memory after a daemon
   * restart (dcpxd-group.c, "reattach"). `awaiting`: ranks that held the
   * group before and have not reattached; their pids (member[r].pid) are
   * checked for liveness every DCPXD_PID_CHECK_MS; one whose pid this
   * daemon cannot see (0: another pid namespace) is awaited for the join
   * timeout from adopted_ns. */
  bool adopted;
  uint32_t awaiting;
  uint64_t next_pid_check_ns;
  uint64_t adopted_ns;

  uint64_t aborts, recoveries;
  bool has_last_record;
  dcpxd_record last_record;

  TAILQ_ENTRY(dcpxd_group) link;
};

static inline dcpx_rank_health *dcpxd_group_health(dcpxd_group *g, uint32_t r) {
  return (dcpx_rank_health *)((uint8_t *)g->hdr + g->L.off_ranks +
                              (uint64_t)r * sizeof(dcpx_rank_health));
}
static inline dcpx_wait_record *dcpxd_group_record(dcpxd_group *g, uint32_t d,
                                                   uint32_t t) {
  return (dcpx_wait_record *)((uint8_t *)g->hdr + g->L.off_records +
                              ((uint64_t)d * g->L.rows + t) *
                                  sizeof(dcpx_wait_record));
}
static inline bool dcpxd_member_live(const dcpxd_member *mb) {
  return mb->conn && !mb->conn->closing;
}

/* Group names go into logs (group=NAME), file entries and JSON, so they
 * are short and of a small alphabet (dcpx__group_name_ok, proto/frame.h);
 * the error text for a name that is not one (takes DCPX_GROUP_NAME_MAX). */
#define DCPXD_BAD_NAME_FMT "group name must be " DCPX__GROUP_NAME_RULE

dcpxd_group *dcpxd_group_find(dcpxd_manager *m, const char *name);

/* The ownership rules (docs/PROTOCOL.md 7.1), in one place. */
/* c's peer matches the rule: it is the rule's uid, or in its gid. */
bool dcpxd_rule_matches(const dcpxd_conn *c, const dcpxd_owner_rule *rule);
/* c owns g: g falls under an owner rule (group-owner) that c matches, or
 * under none and c's uid created it. */
static inline bool dcpxd_owns(const dcpxd_conn *c, const dcpxd_group *g) {
  return g->rule ? dcpxd_rule_matches(c, g->rule) : c->uid == g->owner;
}
/* Join, replace a rank, reattach (and so recover): the owner and root. */
static inline bool dcpxd_may_use(const dcpxd_conn *c, const dcpxd_group *g) {
  return c->uid == 0 || dcpxd_owns(c, g);
}
/* See it in queries: the owner and admins. */
static inline bool dcpxd_may_see(const dcpxd_conn *c, const dcpxd_group *g) {
  return c->admin || dcpxd_owns(c, g);
}
/* Operator commands (reset, fault injection): admins. */
static inline bool dcpxd_may_operate(const dcpxd_conn *c) { return c->admin; }
const char *dcpxd_group_state_name(const dcpxd_group *g);
const char *dcpxd_region_name(uint32_t id);
/* Abort reason names: dcpx__abort_reason_name (common/transport.h). */

/* Frame handlers. Each sends the reply. A Join may come with fds (a
 * reattach): the handler takes those it keeps by setting them to -1; the
 * caller closes the rest. */
void dcpxd_group_join(dcpxd_conn *c, const Dcpx__Join *j, int *fds, int nfds);
void dcpxd_group_leave(dcpxd_conn *c);
void dcpxd_group_recover_ack(dcpxd_conn *c, const Dcpx__RecoverAck *a);
/* The reaper: c (closing) was a member. */
void dcpxd_group_member_gone(dcpxd_conn *c);
/* c hung up while its Join waited (dcpxd_conn_join_wait): the rank is
 * freed and the Join refused, DCPX_E_CONNRESET (docs/PROTOCOL.md 10.3). */
void dcpxd_group_join_gone(dcpxd_conn *c);
/* At shutdown (m->stopping, `why`: the signal): c's Join waits for its
 * group, which will not form now: the Join is refused, DCPX_E_CONNRESET,
 * before c closes (docs/PROTOCOL.md 10.3); its rank is freed when c is
 * reaped, as every member's at shutdown, so that each waiting Join of the
 * group counts the ranks that had joined. */
void dcpxd_group_join_stopped(dcpxd_conn *c, const char *why);

/* Sets the abort word (if 0) to `reason`, stores the group's wait records,
 * and sends Event ABORT to every live member. rank: the rank concerned or
 * -1. */
void dcpxd_group_abort(dcpxd_group *g, uint32_t reason, int32_t rank,
                       const char *detail);
/* Adopted groups: checks whether the ranks still awaited are alive; a dead
 * one aborts the group (DCPX_ABORT_DEAD). */
void dcpxd_group_check_awaiting(dcpxd_group *g);
/* Destroys g if no rank holds it and none is awaited (an adopted group
 * whose ranks all died); returns whether it did. For the health scan,
 * whose walk allows it. */
bool dcpxd_group_reap_empty(dcpxd_group *g);
/* At shutdown (m->stopping): lets go of the groups no connection holds
 * (an adopted group whose attached ranks left while others are still
 * awaited), as the others go with their last member (invariant 7 of
 * dcpxd-group.c). */
void dcpxd_group_release_unheld(dcpxd_manager *m);

/* Operator commands: 0, or a negative code with a message in err. */
int dcpxd_group_reset(dcpxd_group *g, char *err, size_t errlen);
/* Disarms rank's fault hook; what it was (none armed, armed, fired) in
 * note. 0, or a code with the reason in err. */
int dcpxd_group_fault_clear(dcpxd_group *g, int32_t rank, char *note,
                            size_t notelen, char *err, size_t errlen);
int dcpxd_group_fault_stall(dcpxd_group *g, int32_t rank, uint32_t epoch,
                            bool has_call, uint64_t call, uint64_t ticks,
                            char *err, size_t errlen);

/* ---- health (dcpxd-health.c) ------------------------------------------ */

/* How often the pids of ranks awaiting reattach are checked. */
#define DCPXD_PID_CHECK_MS 50

/* Called every poll-ms while some group is ready or awaits a reattach. */
void dcpxd_health_scan(dcpxd_manager *m);
/* If a rank of g has raised its alarm, aborts g for it (DCPX_ABORT_ALARM,
 * the first such rank, `also` appended to the detail) and returns true. */
bool dcpxd_health_alarm_abort(dcpxd_group *g, const char *also);
/* After adopting a group's control page: marks the record slots whose
 * records the store already holds (from before the restart) as harvested,
 * so that they are not stored twice. */
void dcpxd_health_adopt(dcpxd_group *g);
/* Reads the group's not-yet-stored wait records, logs them, stores them
 * durably and in memory. Returns how many were new. */
size_t dcpxd_health_harvest(dcpxd_group *g);

/* ---- ops (dcpxd-query.c) ---------------------------------------------- */

void dcpxd_query(dcpxd_conn *c, const Dcpx__Query *q);
void dcpxd_command(dcpxd_conn *c, const Dcpx__Command *cmd);

/* ---- the manager (dcpxd.c) -------------------------------------------- */

/* A refused reattach (proto ReattachRefusal), kept while its process
 * lives; one per (group, rank, pid), the oldest replaced when full. */
#define DCPXD_REFUSALS_MAX 32
#define DCPXD_REFUSALS_PER_UID 8
/* Shown while the rank retried this recently (it retries at each
 * dcpx_poll, at most once a second): one that left stops retrying */
#define DCPXD_REFUSAL_TTL_NS (60ull * 1000000000ull)
typedef struct dcpxd_refusal {
  char group[DCPX_GROUP_NAME_MAX + 1];
  uint32_t rank;
  pid_t pid;
  uid_t uid;
  int status;
  char reason[192];
  uint64_t attempts, last_ns;
} dcpxd_refusal;

struct dcpxd_manager {
  uv_loop_t *loop;
  const dcpxd_conf *conf;
  dcpxd_records *records;
  dcpxd_secrets *secrets; /* the groups it created, for reattach */

  int listen_fd;
  bool socket_created; /* we bound it, so we unlink it */
  bool listening;
  uv_poll_t listen_poll;
  uv_timer_t accept_retry; /* after EMFILE: pause accepting a moment */
  int reserve_fd;          /* /dev/null, given up to refuse on EMFILE */
  uint64_t fd_refused;     /* connections refused for want of an fd */

  TAILQ_HEAD(, dcpxd_conn) conns;
  TAILQ_HEAD(, dcpxd_conn) reap;
  TAILQ_HEAD(, dcpxd_conn) muted; /* a send failed: read, then closed by
                                   * the reaper */
  TAILQ_HEAD(, dcpxd_group) groups;
  uv_idle_t reaper;
  uint64_t next_conn_id;
  unsigned n_conns;
  size_t out_bytes; /* queued output of every connection (max-queued-bytes) */

  uv_timer_t health_timer;
  bool health_active;
  uv_timer_t watchdog_timer;
  uv_check_t secrets_check; /* saves the groups file's changes, once a turn */
  uv_timer_t log_timer; /* writes the rate limiter's summaries on time */
  uv_timer_t records_timer; /* retries unstored records every second */
  bool records_retrying;
  dcpxd_refusal refusals[DCPXD_REFUSALS_MAX];
  size_t n_refusals;
  uv_signal_t sig_term, sig_int, sig_hup;

  bool stopping;
  char status[256];
};

/* Recomputes STATUS= (sent when it changed) and starts or stops the alarm
 * scan with the number of ready groups. Cheap; called after changes. */
/* m emptied for conf: no listening socket, no connection, group or
 * muted connection yet (its lists initialised); the loop and its handles
 * are the caller's. */
void dcpxd_manager_init(dcpxd_manager *m, dcpxd_conf *conf);
void dcpxd_manager_update(dcpxd_manager *m);
/* Records that could not be written wait in memory: retries them every
 * second until they are on disk (dcpxd_records_retry). */
void dcpxd_records_retry_arm(dcpxd_manager *m);

/* A reattach refused (dcpxd-group.c join_refuse): noted, so that queries
 * show a rank that runs unwatched; and forgotten when that rank of the
 * group reattaches. */
void dcpxd_refusal_note(dcpxd_conn *c, const Dcpx__Join *j, int status,
                        const char *reason);
void dcpxd_refusal_clear(dcpxd_manager *m, const char *group, uint32_t rank);

#endif /* DCPXD_H */
