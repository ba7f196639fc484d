/* dcpxd.c - the dcpx node daemon: main loop, signals, service manager.
 *
 * dcpxd owns, per group, the shared memory the ranks exchange through and
 * the control page they report health in; it does the rendezvous, watches
 * the alarm words, aborts and recovers groups, and keeps timeout records
 * (docs/PROTOCOL.md section 7). It is never on the data path: a rank's
 * calls touch only memory it mapped from the fds the daemon handed out.
 *
 * One thread runs one libuv loop with these handles:
 *
 *   listen_poll    the listening socket          (dcpxd-server.c)
 *   conn->poll     each connection               (dcpxd-server.c)
 *   conn->join_timer  a join waiting for its group  (dcpxd-group.c)
 *   reaper         idle: retires closed conns    (dcpxd-server.c)
 *   health_timer   every poll-ms while some group is ready (or awaits
 *                  a rank's reattach after a restart)
 *   watchdog_timer WATCHDOG=1 at half of WATCHDOG_USEC
 *   signals        SIGTERM, SIGINT: shut down; SIGHUP: ignored (logged)
 *
 * plus one worker-thread job per recovery that zeroes the workspaces.
 *
 * Startup: settings (exit 2 if bad), the records store (exit 1 if the
 * state dir is unusable; never because of damaged records), the socket,
 * then READY=1. Shutdown: STOPPING=1, every Join that waits for its group
 * refused (DCPX_E_CONNRESET, with the reason), every connection closed,
 * the socket unlinked if we made it, the loop drained, everything freed.
 * Groups are not aborted: the ranks keep calling on the memory they
 * mapped, see their connection close, and reattach to the next dcpxd,
 * which adopts the groups from their memory (dcpxd-group.c;
 * docs/ARCHITECTURE.md, "Daemon restart"). A SIGKILLed or crashed daemon
 * is the same to them.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dcpx/version.h>

#include "dcpxd-closer.h"
#include "dcpxd-log.h"
#include "dcpxd-notify.h"
#include "dcpxd-util.h"
#include "dcpxd.h"

static void on_health_tick(uv_timer_t *t) {
  dcpxd_manager *m = t->data;
  dcpxd_health_scan(m);
  dcpxd_manager_update(m);
}

void dcpxd_manager_update(dcpxd_manager *m) {
  unsigned n[4] = {0, 0, 0, 0}, groups = 0, members = 0, awaiting = 0;
  char status[sizeof(m->status)];
  dcpxd_group *g;

  TAILQ_FOREACH(g, &m->groups, link) {
    n[g->state]++;
    groups++;
    members += g->live;
    awaiting += g->awaiting != 0;
  }
  /* Not the connection count: dcpxctl polls would make it churn. */
  dcpxd_bprintf(status,
                "STATUS=%u group%s (%u ready, %u forming, %u aborted, %u "
                "recovering), %u member%s",
                groups, groups == 1 ? "" : "s", n[DCPXD_GROUP_READY],
                n[DCPXD_GROUP_FORMING], n[DCPXD_GROUP_ABORTED],
                n[DCPXD_GROUP_RECOVERING], members, members == 1 ? "" : "s");
  if (strcmp(status, m->status) != 0) {
    memcpy(m->status, status, sizeof(status));
    (void)dcpxd_notify(status);
  }

  /* The alarm scan runs only while there is something to scan: a ready
   * group's alarms, or the pids of ranks awaited since a restart. */
  if (m->stopping)
    return;
  bool scan = n[DCPXD_GROUP_READY] || awaiting;
  if (scan && !m->health_active) {
    uv_timer_start(&m->health_timer, on_health_tick, m->conf->poll_ms,
                   m->conf->poll_ms);
    m->health_active = true;
  } else if (!scan && m->health_active) {
    uv_timer_stop(&m->health_timer);
    m->health_active = false;
  }
}

static void on_watchdog(uv_timer_t *t) { (void)dcpxd_notify("WATCHDOG=1"); }

static void on_records_retry(uv_timer_t *t) {
  dcpxd_manager *m = t->data;
  if (dcpxd_records_retry(m->records) == 0) {
    uv_timer_stop(t);
    m->records_retrying = false;
  }
}

static void on_records_unstored(void *arg) { dcpxd_records_retry_arm(arg); }

void dcpxd_records_retry_arm(dcpxd_manager *m) {
  if (m->records_retrying || m->stopping ||
      !dcpxd_records_unstored(m->records))
    return;
  uv_timer_start(&m->records_timer, on_records_retry, 1000, 1000);
  m->records_retrying = true;
}

/* The log rate limiter's summaries: a timer armed when a key starts
 * dropping lines, for the end of the earliest window that drops, so that
 * "suppressed N similar lines" comes at the end of its interval even if
 * that line is never logged again. (It was armed a whole interval after
 * the first drop and again after each flush, so a second kind's summary
 * came up to an interval late.) A window that opens later ends later, so
 * a timer already running is due no later than a new one would be. */
static uv_timer_t *log_timer;

static void on_log_timer(uv_timer_t *t);

static void log_timer_due(uv_timer_t *t) {
  const int64_t ms = dcpxd_log_ratelimit_due_ms();
  if (ms >= 0)
    uv_timer_start(t, on_log_timer, (uint64_t)ms, 0);
}

static void on_log_timer(uv_timer_t *t) {
  dcpxd_log_ratelimit_flush(false);
  log_timer_due(t); /* early (loop time): again, for what is left */
}

static void arm_log_timer(void) {
  if (log_timer && !uv_is_active((uv_handle_t *)log_timer) &&
      !uv_is_closing((uv_handle_t *)log_timer))
    log_timer_due(log_timer);
}

/* Begins the orderly shutdown; the loop ends once every handle closed and
 * every recovery job returned. */
static void manager_stop(dcpxd_manager *m, const char *why) {
  dcpxd_conn *c, *next;

  if (m->stopping)
    return;
  log_info("Shutting down (%s)", why);
  (void)dcpxd_notify("STOPPING=1");
  /* Groups are not aborted: their ranks keep calling on the memory they
   * mapped, and reattach to the next dcpxd (docs/ARCHITECTURE.md, "Daemon
   * restart"). */
  {
    unsigned n = 0;
    dcpxd_group *g;
    TAILQ_FOREACH(g, &m->groups, link) {
      if (g->state != DCPXD_GROUP_FORMING)
        n++;
    }
    if (n)
      log_notice("Leaving %u group%s running; their members reattach to the "
                 "next dcpxd",
                 n, n == 1 ? "" : "s");
  }
  m->stopping = true;
  dcpxd_group_release_unheld(m);
  dcpxd_server_stop(m);
  for (c = TAILQ_FIRST(&m->conns); c; c = next) {
    next = TAILQ_NEXT(c, link);
    if (dcpxd_conn_join_waits(c)) /* answered, not left to an EOF */
      dcpxd_group_join_stopped(c, why);
    dcpxd_conn_flush(c); /* the ABORT events, best effort */
    dcpxd_conn_close(c, LOG_DEBUG, "dcpxd is shutting down");
  }
  if (TAILQ_EMPTY(&m->conns))
    uv_close((uv_handle_t *)&m->reaper, NULL);
  uv_close((uv_handle_t *)&m->health_timer, NULL);
  uv_close((uv_handle_t *)&m->watchdog_timer, NULL);
  uv_close((uv_handle_t *)&m->secrets_check, NULL);
  uv_close((uv_handle_t *)&m->log_timer, NULL);
  uv_close((uv_handle_t *)&m->records_timer, NULL);
  uv_close((uv_handle_t *)&m->sig_term, NULL);
  uv_close((uv_handle_t *)&m->sig_int, NULL);
  uv_close((uv_handle_t *)&m->sig_hup, NULL);
  /* the last close of a signal's handle gave it back its default action,
   * which for SIGHUP ends dcpxd: it stays ignored while the loop drains */
  signal(SIGHUP, SIG_IGN);
}

/* After each turn's I/O: the groups file's changes of that turn (members
 * gone, groups destroyed), in one save. */
static void on_secrets_check(uv_check_t *h) {
  dcpxd_manager *m = h->data;
  (void)dcpxd_secrets_flush(m->secrets);
}

static void on_signal(uv_signal_t *h, int signum) {
  dcpxd_manager *m = h->data;
  if (signum == SIGHUP) {
    log_info("SIGHUP ignored: restart dcpxd to apply new settings");
    return;
  }
  manager_stop(m, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void start_signal(dcpxd_manager *m, uv_signal_t *h, int signum) {
  uv_signal_init(m->loop, h);
  h->data = m;
  uv_signal_start(h, on_signal, signum);
}

/* Every connection and every group's memory is an fd: take the hard limit
 * (docs/PROTOCOL.md 7.3). */
/* Whether procfs hides other users' processes from dcpxd (mounted with
 * hidepid=, e.g. a unit's ProtectProc=): pid 1 exists (kill says so, or
 * EPERM) but its /proc/1/stat cannot be read. dcpxd then cannot tell a
 * rank that died as a zombie, or whose pid another process took, from a
 * live one (dcpxd_pid_live): after a restart such a rank's group is kept
 * for a reattach that never comes. Said once at start. */
static void warn_hidden_procs(void) {
  if (getpid() == 1 || (kill(1, 0) < 0 && errno != EPERM) ||
      access("/proc/self/stat", R_OK) != 0) /* no procfs: nothing hidden */
    return;
  FILE *f = fopen("/proc/1/stat", "re");
  if (f) {
    fclose(f);
    return;
  }
  if (errno == ENOENT || errno == EACCES || errno == EPERM)
    log_warning("procfs hides other processes from dcpxd (hidepid=, or "
                "the unit's ProtectProc=): a rank of another uid that "
                "died as a zombie or whose pid was reused counts as live "
                "after a dcpxd restart, and its group waits for it "
                "(dcpxctl reset drops it); run dcpxd with /proc visible");
}

static void raise_nofile(void) {
  struct rlimit rl;

  if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
    return;
  rlim_t old = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
    log_warning_errno(-errno, "Cannot raise the fd limit from %lu: %m",
                      (unsigned long)old);
  else
    log_info("fd limit raised from %lu to %lu", (unsigned long)old,
             (unsigned long)rl.rlim_max);
}

/* Makes the state dir if need be and holds an exclusive lock on
 * STATE_DIR/lock (with this pid in it) for the life of the process: two
 * daemons on one state dir would each rewrite its groups file from their
 * own memory, and a restart of either would then refuse to adopt the
 * other's running groups. Then checks that the groups file can be
 * written (its save goes through groups.tmp), so that a state dir dcpxd
 * cannot write stops it here rather than failing every join later.
 * Returns the lock's fd (kept open), or -1 (logged). */
static int state_dir_lock(const char *dir) {
  _cleanup_free_ char *lock = NULL, *tmp = NULL, *probe = NULL,
                      *groups = NULL;
  char held[32] = "";
  struct stat st;
  int fd, tf;

  if (mkdir(dir, 0750) < 0 && errno != EEXIST)
    return log_error_errno(-errno, "Cannot create state dir %s: %m", dir), -1;
  if (stat(dir, &st) < 0)
    return log_error_errno(-errno, "Cannot use state dir %s: %m", dir), -1;
  if (!S_ISDIR(st.st_mode))
    return log_error_errno(-ENOTDIR, "State dir %s: %m", dir), -1;
  if (asprintf(&lock, "%s/lock", dir) < 0 ||
      asprintf(&tmp, "%s/groups.tmp", dir) < 0 ||
      asprintf(&groups, "%s/groups", dir) < 0 ||
      asprintf(&probe, "%s/.write-test.%d", dir, (int)getpid()) < 0)
    return log_error_errno(-ENOMEM, "State dir %s: %m", dir), -1;
  fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd < 0)
    return log_error_errno(-errno, "Cannot open %s: %m", lock), -1;
  const int locked = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
  if (locked == ENOLCK || locked == EOPNOTSUPP) {
    /* a file system without locks (some network ones) */
    log_warning_errno(-locked, "Cannot lock %s (%m): running without the "
                               "guard against a second dcpxd on %s",
                      lock, dir);
  } else if (locked) {
    const ssize_t n = pread(fd, held, sizeof(held) - 1, 0);
    held[n > 0 ? n : 0] = '\0';
    held[strcspn(held, "\n")] = '\0';
    close(fd);
    if (locked == EWOULDBLOCK)
      log_error("State dir %s is in use by another dcpxd (pid %s); each "
                "dcpxd needs a state dir of its own (--state-dir)",
                dir, held[0] ? held : "?");
    else
      log_error_errno(-locked, "Cannot lock %s: %m", lock);
    return -1;
  }
  if (ftruncate(fd, 0) != 0 || dprintf(fd, "%d\n", (int)getpid()) < 0)
    log_warning_errno(-errno, "Cannot write this dcpxd's pid into %s (%m): "
                              "a second dcpxd on %s will not be told whose "
                              "it is",
                      lock, dir); /* a full disk; the lock still holds */
  /* A groups.tmp that is not a file would make every save fail (one left
   * by a crash is dcpxd_secrets_open's to remove), and so would a groups
   * file that is not one (a save puts groups.tmp in its place); then a
   * test that a new file can be made there, as each save makes
   * groups.tmp. */
  const char *const in_way[2] = {tmp, groups};
  for (int i = 0; i < 2; i++) /* groups: what a link to it names (the
                                 load, which runs before, refuses a link
                                 and a FIFO itself) */
    if ((i == 0 ? lstat(in_way[i], &st) : stat(in_way[i], &st)) == 0 &&
        !S_ISREG(st.st_mode)) {
      log_error("Cannot write the groups file: %s is in the way (not a "
                "regular file)", in_way[i]);
      close(fd);
      return -1;
    }
  if ((tf = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                 0600)) < 0) {
    log_error_errno(-errno, "State dir %s is not writable (%s): %m", dir,
                    probe);
    close(fd);
    return -1;
  }
  close(tf);
  (void)unlink(probe);
  return fd;
}

/* dcpxd_conf_load's answer other than "run": 2 for a bad command line;
 * for --help and --version, whose text must have reached standard output
 * (a full disk, a closed descriptor: it exited 0 with none), 0 or 1. */
static int conf_exit_status(int r) {
  if (r != DCPXD_CONF_EXIT)
    return 2;
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout))
    return EXIT_SUCCESS;
  log_error("Cannot write standard output: %s",
            errno ? strerror(errno) : "write error");
  return EXIT_FAILURE;
}

/* The loop's own handles: the reaper, the health, watchdog, records and
 * log timers, the secrets check (which keeps no loop alive) and the
 * signals. */
static void loop_handles_init(dcpxd_manager *m) {
  uv_idle_init(m->loop, &m->reaper);
  m->reaper.data = m;
  uv_timer_init(m->loop, &m->health_timer);
  m->health_timer.data = m;
  uv_timer_init(m->loop, &m->watchdog_timer);
  m->watchdog_timer.data = m;
  uv_timer_init(m->loop, &m->records_timer);
  m->records_timer.data = m;
  uv_check_init(m->loop, &m->secrets_check);
  m->secrets_check.data = m;
  uv_check_start(&m->secrets_check, on_secrets_check);
  uv_unref((uv_handle_t *)&m->secrets_check);
  uv_timer_init(m->loop, &m->log_timer);
  log_timer = &m->log_timer;
  dcpxd_log_on_suppress = arm_log_timer;
  start_signal(m, &m->sig_term, SIGTERM);
  start_signal(m, &m->sig_int, SIGINT);
  start_signal(m, &m->sig_hup, SIGHUP);
}

/* dcpxd_server_listen; when a signal ended its probe of an existing
 * socket (-EINTR), the signal's handler runs (on_signal, in one turn of
 * the loop) and the probe starts again, unless it was a stop. Returns 1
 * when SIGTERM or SIGINT stopped dcpxd there: it used to take the
 * interrupted probe for a failure ("Cannot probe ...: Interrupted system
 * call", exit 1), and a SIGHUP too. */
static int server_listen(dcpxd_manager *m) {
  int r;
  while ((r = dcpxd_server_listen(m)) == -EINTR) {
    uv_run(m->loop, UV_RUN_NOWAIT);
    if (m->stopping)
      return 1;
  }
  return r;
}

/* Once listening: the watchdog, and READY=1. */
static void serve(dcpxd_manager *m) {
  const uint64_t wd_usec = dcpxd_watchdog_usec();
  if (wd_usec) {
    uint64_t ms = wd_usec / 2000 ? wd_usec / 2000 : 1;
    uv_timer_start(&m->watchdog_timer, on_watchdog, ms, ms);
    log_info("Watchdog: WATCHDOG=1 every %" PRIu64 " ms", ms);
  }
  dcpxd_manager_update(m);
  (void)dcpxd_notify("READY=1");
  log_info("Ready");
}

/* After the loop has run out: the suppressed-lines summary written, the
 * groups list emptied (every member left when its connection closed, so
 * none is left; this only guards against a bug leaking them), the loop
 * closed. */
static void loop_done(dcpxd_manager *m) {
  dcpxd_log_on_suppress = NULL;
  log_timer = NULL;
  dcpxd_log_ratelimit_flush(true);
  while (!TAILQ_EMPTY(&m->groups)) {
    dcpxd_group *g = TAILQ_FIRST(&m->groups);
    log_warning("group=%s still present at exit", g->name);
    TAILQ_REMOVE(&m->groups, g, link);
  }
  if (uv_loop_close(m->loop) < 0)
    log_warning("Event loop still had open handles at exit");
}

int main(int argc, char **argv) {
  dcpxd_conf conf;
  dcpxd_manager mgr, *m = &mgr;
  uv_loop_t loop;
  int r, ret = EXIT_FAILURE, lock_fd;

  /* SIGHUP is ignored (logged once the loop runs): also during the start
   * (reading the state dir), where its default action ended dcpxd */
  signal(SIGHUP, SIG_IGN);
  dcpxd_log_setup();
  r = dcpxd_conf_load(&conf, argc, argv);
  if (r != DCPXD_CONF_RUN) {
    dcpxd_conf_done(&conf);
    return conf_exit_status(r);
  }
  dcpxd_log_max_level = conf.log_level;
  dcpxd_log_rate_burst = conf.log_rate_burst;
  dcpxd_log_rate_interval_ms = conf.log_rate_interval_ms;
  signal(SIGPIPE, SIG_IGN); /* sends use MSG_NOSIGNAL; belt and braces */
  /* A file size limit (LimitFSIZE=, ulimit -f) fails a write with EFBIG,
   * handled as a full disk, instead of killing dcpxd with a core. */
  signal(SIGXFSZ, SIG_IGN);
  raise_nofile();
  warn_hidden_procs();

  dcpxd_manager_init(m, &conf);

  log_info("dcpxd %s starting (protocol %u, config %s, state dir %s, "
           "poll %u ms, fault injection %s)",
           DCPX_VERSION_STRING, DCPX_PROTO_VERSION,
           conf.config_path ? conf.config_path : "none", conf.state_dir,
           conf.poll_ms, conf.fault_injection ? "ENABLED" : "off");

  lock_fd = state_dir_lock(conf.state_dir);
  if (lock_fd < 0)
    goto out_conf;
  r = dcpxd_records_open(conf.state_dir, conf.records_max_bytes,
                         DCPXD_RECORDS_RING, &m->records);
  if (r < 0)
    goto out_lock;

  r = dcpxd_secrets_open(conf.state_dir, &m->secrets);
  if (r < 0)
    goto out_records;
  /* a rank held by a process whose pid dcpxd cannot see may live: it has
   * the join timeout to reattach (dcpxd-secrets.h) */
  dcpxd_secrets_unseen_until(m->secrets,
                             dcpxd_now_ns(CLOCK_MONOTONIC) +
                                 (uint64_t)conf.join_timeout_ms * 1000000ull);

  r = uv_loop_init(&loop);
  if (r < 0) {
    log_error("Cannot create the event loop: %s", uv_strerror(r));
    goto out_records;
  }
  m->loop = &loop;
  loop_handles_init(m);
  r = dcpxd_closer_start();
  if (r < 0)
    log_warning("Cannot start the closer thread (%s): fds are closed on "
                "the event loop",
                strerror(-r));
  dcpx__frame_set_closer(dcpxd_closer_close); /* at once if not started */
  dcpxd_records_use_loop(m->records, m->loop, on_records_unstored, m);

  r = server_listen(m);
  if (r < 0) {
    dcpxd_server_stop(m); /* unlinks a half-made socket */
    manager_stop(m, "startup failed");
    uv_run(m->loop, UV_RUN_DEFAULT);
    goto out_loop;
  }
  if (r == 0)
    serve(m);

  uv_run(m->loop, UV_RUN_DEFAULT);
  ret = EXIT_SUCCESS;
  log_info("Stopped");

out_loop:
  dcpxd_closer_stop(2000); /* later closes: at once */ /* what clients sent: not held up for long */
  loop_done(m);
out_records:
  (void)dcpxd_secrets_flush_last(m->secrets);
  m->secrets = dcpxd_secrets_free(m->secrets);
  m->records = dcpxd_records_free(m->records);
out_lock:
  if (lock_fd >= 0)
    close(lock_fd);
out_conf:
  dcpxd_conf_done(&conf);
  return ret;
}
