/* fuzz_conn.c - libFuzzer target: dcpxd's whole connection handler. An
 * in-process dcpxd (the daemon's own sources: manager, listening socket,
 * accept, Hello, dispatch, groups, memory, queries, commands, the reaper)
 * is driven by up to four client connections over its real AF_UNIX
 * SOCK_SEQPACKET socket, with descriptors attached, as a hostile local
 * client would. Built by `make fuzz`; corpus in tests/fuzz/corpus/conn
 * (tests/fuzz/make-conn-corpus.py writes it).
 *
 * Input: a session, a list of records
 *   byte 0    bits 0-1: connection 0..3 (connected at its first record)
 *             bits 2-4: descriptors to attach (0..7: sealed memfds of
 *                       4 KiB, and /dev/null for every third)
 *             bit 5:    the length has a third byte (packets past 64 KiB)
 *             bit 7:    close this connection instead (the rest unused)
 *   byte 1-2  packet length, little endian (cut to what is left)
 *   (byte 3   its bits 16-23, with bit 5)
 *   then      the packet, sent as one SEQPACKET message
 * After each record the daemon's loop runs until it has nothing to do, and
 * every client reads (and drops) what it was sent, closing descriptors.
 * At the end every client closes, and the daemon must free every
 * connection and every group: anything left is a leak, and aborts.
 *
 * The daemon runs as the fuzzer's uid (an admin if root), with a 256 MiB
 * workspace cap, fault injection on, its state dir and socket in a
 * private directory, and its log off.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "dcpxd-conf.h"
#include "dcpxd-log.h"
#include "dcpxd-records.h"
#include "dcpxd-secrets.h"
#include "dcpxd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

#define N_CLIENTS 4

static dcpxd_manager M;
static dcpxd_conf C;
static uv_loop_t L;
static char g_dir[64], g_sock[128];

/* The private directory goes at exit. */
static void daemon_files_remove(void) {
  static const char *const names[] = {"state/records.log",
                                      "state/records.log.1", "state/groups",
                                      "state/groups.tmp", "s"};
  char p[192];
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    snprintf(p, sizeof(p), "%s/%s", g_dir, names[i]);
    unlink(p);
  }
  snprintf(p, sizeof(p), "%s/state", g_dir);
  rmdir(p);
  rmdir(g_dir);
}

static void die(const char *what) {
  fprintf(stderr, "fuzz_conn: %s: %s\n", what, strerror(errno));
  abort();
}

/* The daemon, as dcpxd.c's main sets it up, minus signals and notify. */
static void daemon_setup(void) {
  char *dir = g_dir;
  char a_sock[160], a_state[160];
  char *argv[] = {"dcpxd",
                  "--config=",
                  a_sock,
                  a_state,
                  "--max-workspace-bytes=256M",
                  "--enable-fault-injection",
                  "--join-timeout-ms=2000",
                  "--log-level=err",
                  NULL};

  strcpy(dir, "/dev/shm/fuzz_conn.XXXXXX");
  if (!mkdtemp(dir)) {
    strcpy(dir, "/tmp/fuzz_conn.XXXXXX");
    if (!mkdtemp(dir))
      die("mkdtemp");
  }
  atexit(daemon_files_remove);
  snprintf(g_sock, sizeof(g_sock), "%s/s", dir);
  snprintf(a_sock, sizeof(a_sock), "--socket=%s", g_sock);
  snprintf(a_state, sizeof(a_state), "--state-dir=%s/state", dir);
  if (dcpxd_conf_load(&C, (int)(sizeof(argv) / sizeof(argv[0])) - 1, argv) !=
      DCPXD_CONF_RUN)
    die("dcpxd_conf_load");
  dcpxd_log_max_level = getenv("FUZZ_CONN_LOG") ? LOG_DEBUG : -1;

  dcpxd_manager_init(&M, &C);
  if (dcpxd_records_open(C.state_dir, C.records_max_bytes, DCPXD_RECORDS_RING,
                         &M.records) < 0 ||
      dcpxd_secrets_open(C.state_dir, &M.secrets) < 0)
    die("state dir");
  if (uv_loop_init(&L) < 0)
    die("uv_loop_init");
  M.loop = &L;
  uv_idle_init(&L, &M.reaper);
  M.reaper.data = &M;
  uv_timer_init(&L, &M.health_timer);
  M.health_timer.data = &M;
  uv_timer_init(&L, &M.watchdog_timer);
  M.watchdog_timer.data = &M;
  uv_timer_init(&L, &M.log_timer);
  M.log_timer.data = &M;
  if (dcpxd_server_listen(&M) < 0)
    die("dcpxd_server_listen");
}

static int client_connect(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int big = 1 << 20;

  if (s < 0)
    die("socket");
  setsockopt(s, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
  setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  strcpy(sa.sun_path, g_sock);
  if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0)
    die("connect");
  return s;
}

/* A descriptor to attach: a sealed 4 KiB memfd (what a reattach sends),
 * or /dev/null. */
static int attach_fd(int i) {
  int fd;
  if (i % 3 == 2)
    return open("/dev/null", O_RDONLY | O_CLOEXEC);
  fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd >= 0 && (ftruncate(fd, 4096) < 0 ||
                  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static void client_send(int s, const uint8_t *p, size_t n, int nfds) {
  int fds[8], k = 0;
  union {
    char b[CMSG_SPACE(sizeof(fds))];
    struct cmsghdr a;
  } ctl;
  struct iovec iov = {(void *)p, n};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

  for (int i = 0; i < nfds; i++) {
    int fd = attach_fd(i);
    if (fd >= 0)
      fds[k++] = fd;
  }
  if (k) {
    struct cmsghdr *cm;
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_control = ctl.b;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)k);
    cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)k);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)k);
  }
  (void)sendmsg(s, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  for (int i = 0; i < k; i++)
    close(fds[i]);
}

/* Reads and drops everything the daemon sent to s; closes its fds. */
static void client_drain(int s) {
  static char buf[1 << 18];
  union {
    char b[CMSG_SPACE(sizeof(int) * 64)];
    struct cmsghdr a;
  } ctl;

  for (;;) {
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.b,
                        .msg_controllen = sizeof(ctl.b)};
    ssize_t r = recvmsg(s, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r <= 0)
      return;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm;
         cm = CMSG_NXTHDR(&mh, cm))
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        int *fds = (int *)CMSG_DATA(cm);
        size_t nf = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nf; i++)
          close(fds[i]);
      }
  }
}

/* Whether the daemon's loop has nothing to do now: no descriptor ready
 * (its epoll fd not readable), no idle handle, pending callback or due
 * timer (uv_backend_timeout 0), no thread pool work in flight, no
 * connection waiting for the reaper. */
static int loop_quiet(void) {
  struct pollfd p = {.fd = uv_backend_fd(&L), .events = POLLIN};
  return L.active_reqs.count == 0 && TAILQ_EMPTY(&M.reap) &&
         uv_backend_timeout(&L) != 0 && poll(&p, 1, 0) == 0;
}

/* Runs the daemon's loop until it has nothing to do (bounded), with the
 * clients reading their answers in between. */
static void pump(const int *cl) {
  for (int i = 0; i < 16; i++) {
    struct pollfd p[N_CLIENTS];
    nfds_t np = 0;
    uv_run(&L, UV_RUN_NOWAIT);
    for (int k = 0; k < N_CLIENTS; k++)
      if (cl[k] >= 0)
        p[np++] = (struct pollfd){.fd = cl[k], .events = POLLIN};
    if (np && poll(p, np, 0) > 0)
      for (nfds_t k = 0; k < np; k++)
        if (p[k].revents)
          client_drain(p[k].fd);
    if (loop_quiet())
      break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  int cl[N_CLIENTS] = {-1, -1, -1, -1};

  if (!M.loop)
    daemon_setup();
  while (n >= 3) {
    unsigned h = data[0], k = h & 3;
    size_t len = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3, n -= 3;
    if ((h & 0x20) && n >= 1) {
      len |= (size_t)data[0] << 16;
      data++, n--;
    }
    if (len > n)
      len = n;
    if (h & 0x80) {
      if (cl[k] >= 0)
        close(cl[k]);
      cl[k] = -1;
    } else {
      if (cl[k] < 0) {
        cl[k] = client_connect();
        pump(cl); /* accepted */
      }
      client_send(cl[k], data, len, (int)((h >> 2) & 7));
    }
    data += len, n -= len;
    pump(cl);
  }
  for (int k = 0; k < N_CLIENTS; k++)
    if (cl[k] >= 0)
      close(cl[k]);
  /* Every connection goes, and with its last member every group (and
   * workspace zeroing on the thread pool ends). */
  for (int i = 0; i < 2000 && (M.n_conns || !TAILQ_EMPTY(&M.groups)); i++) {
    uv_run(&L, UV_RUN_NOWAIT);
    if (i > 16)
      usleep(1000);
  }
  if (M.n_conns || !TAILQ_EMPTY(&M.groups)) {
    fprintf(stderr, "fuzz_conn: %u connections and %s left after the "
                    "clients closed\n",
            M.n_conns, TAILQ_EMPTY(&M.groups) ? "no groups" : "groups");
    abort();
  }
  return 0;
}
