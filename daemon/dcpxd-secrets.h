/* dcpxd-secrets.h - the groups this daemon created, and their secrets, kept
 * in STATE_DIR/groups so that a reattach after a restart can be told from
 * a forgery (docs/PROTOCOL.md 7.1, "Reattach").
 *
 * A formed group gets DCPX_CTL_SECRET_BYTES random bytes in its control
 * page header (`secret`) and an entry here: its name, its owner's uid and
 * the secret. The entry goes when the group is destroyed while dcpxd runs,
 * and stays across a shutdown (the ranks live on and reattach). A reattach
 * that would adopt a group is accepted only if its control page's secret
 * is the entry of that very name.
 *
 * The entry also holds the pid of each rank's process, kept as members
 * join, are replaced or reattach (none once a rank leaves or dies: a
 * process that left lives on, and must not keep its group unattached
 * across a restart). A process of another pid namespace has no pid that
 * dcpxd sees (SO_PEERCRED's 0): its rank is held "unseen", and taken as
 * live, since nothing tells, until dcpxd_secrets_unseen_until. At start,
 * the entries whose processes are all gone are removed: nobody is left to
 * reattach to them (the memory of a group lives in its ranks' processes),
 * so they are state of dead groups.
 *
 * The file is rewritten whole (temporary file, names exchanged; no
 * fsync: it serves one boot, and a dcpxd crash keeps the page cache): at
 * once when a group is added (its secret must be in the file before the
 * Join reply hands it out), and for the changes of
 * dcpxd_secrets_set_pid and dcpxd_secrets_remove once per turn of the
 * event loop (dcpxd_secrets_flush), so that a client whose exit ends
 * thousands of groups costs one save, not one per group. One line
 * "NAME UID HEX PID[@START],..." per group (pids of ranks 0..W-1, 0 for a
 * rank not held, 0@0 for one held unseen, which versions before it read
 * as 0; files of older dcpxd versions have no
 * pids, and those entries are kept). Each pid may carry "@START", when its
 * process started (/proc/PID/stat starttime): a live pid of another start
 * time is another process, not the rank's. A first line "#boot ID" names
 * the boot (/proc/sys/kernel/random/boot_id) the pids belong to; at the
 * start of another boot every entry is dropped. Unreadable lines (a name
 * that is no group name, a uid that is no uint32, a secret that is not 64
 * hex digits) and a second entry of a name are skipped with a warning; a
 * groups.tmp left by a crash is removed. */
#ifndef DCPXD_SECRETS_H
#define DCPXD_SECRETS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "layout.h"

typedef struct dcpxd_secrets dcpxd_secrets;

/* Loads STATE_DIR/groups (missing: none), and removes the entries of
 * groups whose rank processes are all gone. 0 or a negative errno. */
int dcpxd_secrets_open(const char *state_dir, dcpxd_secrets **ret);
dcpxd_secrets *dcpxd_secrets_free(dcpxd_secrets *s);

/* Makes a random secret for a new group, records it with its owner and
 * the pids of its W ranks (0: unseen), and saves the file. 0 or a negative errno (then
 * the group must not form). */
int dcpxd_secrets_add(dcpxd_secrets *s, const char *name, uid_t owner,
                      uint32_t world, const pid_t *pids,
                      uint8_t secret[DCPX_CTL_SECRET_BYTES]);

/* For dcpxd_secrets_set_pid: a rank held by no process. */
#define DCPXD_PID_NONE ((pid_t)-1)

/* Records that rank `rank` of the W-rank group `name` is held by pid (0:
 * by a process whose pid dcpxd does not see; DCPXD_PID_NONE: by none);
 * saved by the next dcpxd_secrets_flush (or add). */
void dcpxd_secrets_set_pid(dcpxd_secrets *s, const char *name, uint32_t world,
                           uint32_t rank, pid_t pid);

/* Forgets a group (destroyed, or an unattached one an operator reset):
 * false if there was no entry; saved by the next flush (or add). */
bool dcpxd_secrets_remove(dcpxd_secrets *s, const char *name);

/* Saves the changes not saved yet, if any: dcpxd calls it once per turn
 * of its event loop. After a failed save it tries again only a second
 * later (0 before then). 0 or a negative errno (logged). */
int dcpxd_secrets_flush(dcpxd_secrets *s);
/* The same at exit: tries at once, even within a second of a failed save,
 * and logs an error if the changes are lost. */
int dcpxd_secrets_flush_last(dcpxd_secrets *s);

/* The last save's error (-errno: a full disk, a read-only state dir, a
 * file size limit), or 0 if it worked (or none was made). No group can
 * form while it is not 0; a failed save is retried, at most once a
 * second, while changes wait (dcpxd_secrets_flush, on the loop's turns). */
int dcpxd_secrets_save_error(const dcpxd_secrets *s);

/* The groups file's path. */
const char *dcpxd_secrets_path(const dcpxd_secrets *s);

/* The entries, for the queries (dcpxd-query.c: the groups a restart left
 * whose ranks have not reattached): entry i < dcpxd_secrets_count, its
 * name (NULL past the end), owner and the number of its ranks' pids (0
 * for an entry of an older dcpxd); which of them live:
 * dcpxd_secrets_live. */
size_t dcpxd_secrets_count(const dcpxd_secrets *s);
const char *dcpxd_secrets_entry(const dcpxd_secrets *s, size_t i,
                                uid_t *owner, uint32_t *n_pids);

/* The ranks of entry `name` whose recorded process lives (bit r), those
 * held unseen too until dcpxd_secrets_unseen_until; 0 when there is no
 * such entry. */
uint32_t dcpxd_secrets_live(const dcpxd_secrets *s, const char *name);
/* The same for entry i (< dcpxd_secrets_count), without a lookup. */
uint32_t dcpxd_secrets_live_at(const dcpxd_secrets *s, size_t i);

/* Until when (CLOCK_MONOTONIC ns) a rank held by a process whose pid
 * dcpxd does not see counts as live: dcpxd gives such a process its join
 * timeout from the start to reattach, as it does an awaited rank of an
 * adopted group. Until it is called, always (the pruning at open keeps
 * such entries). */
void dcpxd_secrets_unseen_until(dcpxd_secrets *s, uint64_t until_ns);

/* Forgets that process pid holds rank `rank` of entry `name` (it left
 * it); false if it did not. Only that rank: a process may hold several
 * ranks of a group (a member per GPU), and its others reattach on their
 * own. Saved by the next flush. */
bool dcpxd_secrets_forget_rank(dcpxd_secrets *s, const char *name,
                               uint32_t rank, pid_t pid);

/* Whether process pid lives: it exists, is not a zombie, and, if start is
 * not 0, started then (/proc/PID/stat starttime: a reused pid is another
 * process). Without procfs, whether it exists. */
bool dcpxd_pid_live(pid_t pid, uint64_t start);

/* Whether pid lives as the process of rank `rank` of entry `name`
 * (dcpxd_pid_live with the start time recorded for it, if the entry holds
 * that pid for the rank). */
bool dcpxd_secrets_rank_live(const dcpxd_secrets *s, const char *name,
                             uint32_t rank, pid_t pid);

/* True if `name` is a group this daemon created with this secret; its
 * owner in *owner. */
bool dcpxd_secrets_match(const dcpxd_secrets *s, const char *name,
                         const uint8_t secret[DCPX_CTL_SECRET_BYTES],
                         uid_t *owner);

#endif /* DCPXD_SECRETS_H */
