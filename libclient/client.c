/* client.c - libdcpx's side of dcpxd: connect, join, leave, health and
 * recovery; and the dispatch of push/merge to the member's backend.
 *
 * Every membership has its own connection to dcpxd, so that the daemon
 * sees a rank die when its socket closes, whatever else the process holds.
 * After the JoinReply the connection carries only events (abort, reset
 * requested/done), which libdcpx reads in dcpx_poll and dcpx_recover; the
 * call path never touches the socket. Health is read from the mapped
 * control page.
 *
 * The link (member.h, DCPX__LINK_*). dcpxd may restart while a group runs
 * (docs/ARCHITECTURE.md, "Daemon restart"): the member's socket then reads
 * EOF, and dcpx_poll reconnects to the same path, without blocking: a
 * non-blocking connect, then Hello and a Join with reattach set, carrying
 * the ctl and W workspace fds that the member kept open since its join;
 * the answers are read by later dcpx_poll calls. The new daemon adopts the
 * group from that memory. Nothing here touches the mappings, so the calls
 * in between run on as before.
 */
#define _GNU_SOURCE
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include "frame.h"
#include "log.h"
#include "member.h"

#define HELLO_TIMEOUT_MS 5000
/* Slack on top of the join timeout for the daemon's own answer. */
#define JOIN_SLACK_MS 10000
/* How long a join's wait looks away from dcpx_client_interrupt at most */
#define INTR_SLICE_MS 50
/* How long an interrupted join waits for dcpxd to drop its rank at most */
#define WITHDRAW_MS 1000
/* Reconnecting: next attempt after no daemon listened, after a daemon
 * refused the reattach, and how long a reattach's answers may take. */
#define RETRY_DOWN_MS 10
#define RETRY_REFUSED_MS 1000
#define REATTACH_ANSWER_MS 5000
/* dcpx_poll handles at most this many frames per call. */
#define POLL_BATCH 64

/* Receives one frame within ms milliseconds. */
static int recv_within(int sock, int ms, Dcpx__Frame **ret, int *fds,
                       int maxfds, int *ret_nfds) {
  const int n = dcpx__poll_until(sock, POLLIN, dcpx__deadline_ms(ms));
  if (n < 0)
    return n;
  if (n == 0)
    return DCPX_E_TIMEDOUT;
  return dcpx__frame_recv(sock, ret, fds, maxfds, ret_nfds);
}

/* Copies the daemon's reason of a refusal (Reply.error) into err. */
static void keep_error(char *err, size_t errlen, const Dcpx__Reply *rep) {
  if (err && errlen && rep && rep->error && rep->error[0])
    dcpx__textf(err, errlen, "%s", rep->error);
}

/* A call refused before there is a client or member to keep the reason
 * (a NULL handle or ret_* argument): a WARN line naming the function and
 * the argument, as a NULL struct's has (dcpx__struct_check) and the
 * calls' other refusals (DCPX_DEBUG, log.h). Not in dcpx_client_interrupt
 * and dcpx_member_interrupt: they may run in a signal handler, where
 * stdio is not safe. */
static int refuse_null_at(int line, const char *fn, const char *what) {
  dcpx__why_at(NULL, 0, __FILE__, line, "%s: %s is NULL", fn, what);
  return DCPX_E_INVAL;
}
#define REFUSE_NULL(fn, what) refuse_null_at(__LINE__, (fn), (what))

/* Connects and says hello (proto/frame.c's dcpx__ops_connect, as dcpxctl
 * does). err gets one line of why, with the daemon's reason when it
 * refused; *ret_join_ms (NULL: not wanted) the daemon's join timeout. */
static int open_conn(const char *path, int *ret_sock, char *err,
                     size_t errlen, uint32_t *ret_join_ms) {
  const int s = dcpx__ops_connect_join(path, "libdcpx " DCPX_VERSION_STRING,
                                       HELLO_TIMEOUT_MS, err, errlen,
                                       ret_join_ms);
  if (s < 0)
    return s;
  *ret_sock = s;
  return 0;
}

/* A relative socket path made absolute (into buf), so that the joins and
 * reattaches that open it later reach the dcpxd dcpx_connect checked
 * whatever the process's working directory is by then; the path as given
 * when it is absolute, or when the working directory is unknown or the
 * absolute path too long for a socket (a WARN line says so). */
static const char *absolute_path(const char *path, char *buf, size_t n) {
  char cwd[4096];
  if (path[0] == '/')
    return path;
  if (getcwd(cwd, sizeof(cwd)) &&
      (size_t)snprintf(buf, n, "%s/%s", cwd, path) < n)
    return buf;
  DCPX_WARN("dcpx_connect %s: a relative socket path, kept as is (the "
            "absolute path is unknown or over %zu bytes): a join or "
            "reattach after a chdir opens it from the new directory",
            path, n - 1);
  return path;
}

int dcpx_connect(const char *path, dcpx_client **ret_client) {
  dcpx_client *c;
  int s, r;

  if (!ret_client)
    return REFUSE_NULL("dcpx_connect", "ret_client");
  path = dcpx__socket_path(path); /* as dcpxctl finds it */
  if (strlen(path) >= sizeof(c->path)) {
    DCPX_WARN("dcpx_connect %s: a path of %zu bytes; a Unix socket's is "
              "%zu at most (%s)", path, strlen(path), sizeof(c->path) - 1,
              dcpx_strerror(DCPX_E_RANGE));
    return DCPX_E_RANGE;
  }
  char why[512] = "", abs_path[sizeof(c->path)];
  /* made absolute first: the path checked is the path kept */
  path = absolute_path(path, abs_path, sizeof(abs_path));
  r = open_conn(path, &s, why, sizeof(why), NULL); /* fails early if no daemon
                                                speaks our version */
  if (r < 0) {
    DCPX_WARN("dcpx_connect %s: %s (%s)", path, why, dcpx_strerror(r));
    return r;
  }
  close(s);
  c = calloc(1, sizeof(*c));
  if (!c)
    return DCPX_E_NOMEM;
  memcpy(c->path, path, strlen(path) + 1);
  *ret_client = c;
  return 0;
}

void dcpx_disconnect(dcpx_client *c) { free(c); }

static void member_unmap(dcpx_member *m) {
  if (m->ctl && m->ctl != MAP_FAILED)
    munmap(m->ctl, m->ctl_bytes);
  m->ctl = NULL;
  for (uint32_t d = 0; d < DCPX_MAX_WORLD; d++) {
    if (m->ws[d] && m->ws[d] != MAP_FAILED)
      munmap(m->ws[d], m->ws_bytes);
    m->ws[d] = NULL;
  }
}

/* A new member's fds and link: none yet. */
static void member_link_init(dcpx_member *m) {
  m->sock = -1;
  m->link = DCPX__LINK_NONE;
  m->ctl_fd = -1;
  for (uint32_t d = 0; d < DCPX_MAX_WORLD; d++)
    m->ws_fd[d] = -1;
}

/* fork(): the child gets a copy of every member, with the parent's
 * socket to dcpxd, workspace mappings and rank. Driving it from the child
 * would interleave two processes' calls under one rank (the peers'
 * results go wrong without an error), and its leave would tell dcpxd that
 * the parent's rank left. So the child counts its forks (an atfork
 * handler, registered at the first join), and a member joined before the
 * last fork refuses every call (DCPX_E_STATE) and leaves by releasing its
 * copies only: no Leave, no shutdown of the shared socket, no CUDA (which
 * a forked child cannot use). One relaxed load per call: no syscall. */
static unsigned g_forks;
static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;

static void fork_child(void) { __atomic_add_fetch(&g_forks, 1u, __ATOMIC_RELAXED); }

static void fork_watch(void) { (void)pthread_atfork(NULL, NULL, fork_child); }

static int member_forked(const dcpx_member *m) {
  return m->fork_gen != __atomic_load_n(&g_forks, __ATOMIC_RELAXED);
}

/* A call on a member that a forked child inherited: refused, and the
 * parent's rank left as it is. */
static int forked_refuse(dcpx_member *m, const char *fn) {
  DCPX_REFUSE(m, "%s: group %s rank %u was joined by the parent of this "
              "process (fork); a child must connect and join itself "
              "(nothing done; dcpx_leave here only releases the copy)",
              fn, m->group, m->rank);
  return DCPX_E_STATE;
}

static void member_free(dcpx_member *m) {
  if (!m)
    return;
#ifdef HAVE_CUDA
  if (!member_forked(m)) /* the parent's CUDA state: not the child's */
    dcpx__cuda_fini(m);
#endif
  dcpx__host_fini(m);
  member_unmap(m);
  if (m->sock >= 0)
    close(m->sock);
  if (m->ctl_fd >= 0)
    close(m->ctl_fd);
  for (uint32_t d = 0; d < DCPX_MAX_WORLD; d++)
    if (m->ws_fd[d] >= 0)
      close(m->ws_fd[d]);
  free(m);
}

static int map_fd(int fd, size_t bytes, void **ret) {
  struct stat st;
  void *p;
  if (fstat(fd, &st) < 0)
    return -errno;
  if ((uint64_t)st.st_size < bytes)
    return DCPX_E_PROTO;
  p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return -errno;
  *ret = p;
  return 0;
}

/* The workspaces a member of m's backend maps: every rank's with the host
 * backend, none with CUDA (device memory). */
static uint32_t map_workspaces(const dcpx_member *m) {
  return m->backend == DCPX_BACKEND_HOST ? m->shape.world : 0u;
}

/* The address space a member maps: the control page and those
 * workspaces. */
static uint64_t map_bytes(const dcpx_member *m) {
  return m->L.ctl_bytes + (uint64_t)map_workspaces(m) * m->L.ws_bytes;
}

static double gib(uint64_t bytes) { return (double)bytes / (1ull << 30); }

/* Before the Join goes out: whether the memory a member maps fits this
 * process's address-space limit (RLIMIT_AS), so that a rank that could
 * not map it is refused here instead of after its group formed (which
 * its peers see as an abort). 0 or DCPX_E_NOMEM with why. */
static int map_fits(const dcpx_member *m, char *why, size_t n) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
      map_bytes(m) < (uint64_t)rl.rlim_cur)
    return 0;
  snprintf(why, n,
           "the group's memory (the control page and %u workspaces of %llu "
           "bytes, %.1f GiB) does not fit this process's address-space "
           "limit (RLIMIT_AS, ulimit -v: %.1f GiB)",
           map_workspaces(m), (unsigned long long)m->L.ws_bytes,
           gib(map_bytes(m)), gib((uint64_t)rl.rlim_cur));
  return DCPX_E_NOMEM;
}

/* Maps what a successful JoinReply carries and checks it against the
 * layout this library computes for the same shape. */
/* The workspace regions the daemon laid out (JoinReply.regions) are the
 * ones this library computes for the shape, every one of them: a dcpxd
 * and a libdcpx of different layouts would otherwise store into each
 * other's words. */
static int regions_agree(const dcpx_member *m, const Dcpx__JoinReply *jr) {
  uint32_t seen = 0, want = 0; /* bit id: region id */
  for (uint32_t id = 1; id <= DCPX_REGION_MAX; id++)
    want |= (m->L.reg[id].bytes != 0) << id;
  for (size_t i = 0; i < jr->n_regions; i++) {
    const Dcpx__Region *g = jr->regions[i];
    if (!g || g->id < 1 || g->id > DCPX_REGION_MAX ||
        g->offset != m->L.reg[g->id].off ||
        g->bytes != m->L.reg[g->id].bytes || !g->bytes) {
      DCPX_WARN("dcpx_join: dcpxd's workspace region %s (id %u) at %llu, "
                "%llu bytes is not this library's",
                g && g->name ? g->name : "?", g ? g->id : 0u,
                g ? (unsigned long long)g->offset : 0ull,
                g ? (unsigned long long)g->bytes : 0ull);
      return 0;
    }
    seen |= 1u << g->id;
  }
  if (seen != want)
    DCPX_WARN("dcpx_join: dcpxd named workspace regions 0x%x, this library "
              "has 0x%x", seen, want);
  return seen == want;
}

static int member_map(dcpx_member *m, const Dcpx__JoinReply *jr,
                      const int *fds, int nfds) {
  const uint32_t W = m->shape.world;
  int r;

  if (nfds != (int)W + 1 || jr->n_fds != W + 1)
    return DCPX_E_PROTO;
  if (jr->ws_bytes != m->L.ws_bytes || jr->ctl_bytes != m->L.ctl_bytes ||
      !regions_agree(m, jr))
    return DCPX_E_PROTO; /* daemon and library disagree on the layout */
  m->ctl_bytes = m->L.ctl_bytes;
  m->ws_bytes = m->L.ws_bytes;
  r = map_fd(fds[0], m->ctl_bytes, &m->ctl);
  if (r < 0)
    return r;
  /* CUDA workspaces are VMM handles: cuda.c maps them for the device. */
  for (uint32_t d = 0; d < W && m->backend == DCPX_BACKEND_HOST; d++) {
    r = map_fd(fds[1 + d], m->ws_bytes, (void **)&m->ws[d]);
    if (r < 0)
      return r;
  }
  m->hdr = (dcpx_ctl_header *)m->ctl;
  m->health = (dcpx_rank_health *)((char *)m->ctl + m->L.off_ranks);
  m->records = (dcpx_wait_record *)((char *)m->ctl + m->L.off_records);
  if (m->hdr->magic == DCPX_CTL_MAGIC && m->hdr->version != DCPX_CTL_VERSION) {
    DCPX_WARN("the control page has layout version %u, this libdcpx %u",
              m->hdr->version, DCPX_CTL_VERSION);
    return DCPX_E_VERSION; /* as dcpxd refuses such a reattach */
  }
  if (m->hdr->magic != DCPX_CTL_MAGIC || m->hdr->world != W ||
      m->hdr->rows != m->shape.rows)
    return DCPX_E_PROTO;
  return 0;
}

/* Keeps the fds of a successful JoinReply (ctl, ws0..) open: a restarted
 * daemon gets them back. The link is up from here on. */
static void member_keep_fds(dcpx_member *m, const int *fds, int nfds) {
  m->ctl_fd = fds[0];
  for (int i = 1; i < nfds && i <= DCPX_MAX_WORLD; i++)
    m->ws_fd[i - 1] = fds[i];
  m->link = DCPX__LINK_UP;
}

int dcpx__member_attach(const dcpx_shape *shape, uint32_t rank,
                        uint64_t timeout_ns, void *ctl, char *const *ws,
                        dcpx_member **ret_member) {
  dcpx_member *m;
  dcpx_shape auto_shape;
  int r = dcpx_shape_check(shape);
  if (r < 0)
    return r;
  shape = dcpx__shape_resolved(shape, &auto_shape); /* local_topk 0: N */
  if (rank >= shape->world || !ctl || !ws || !ret_member)
    return DCPX_E_INVAL;
  m = calloc(1, sizeof(*m));
  if (!m)
    return DCPX_E_NOMEM;
  member_link_init(m);
  m->shape = *shape;
  m->rank = rank;
  m->timeout_ns = timeout_ns;
  dcpx_layout_compute(&m->L, shape->world, shape->rows, shape->topk,
                      shape->local_topk);
  m->hdr = (dcpx_ctl_header *)ctl;
  m->health = (dcpx_rank_health *)((char *)ctl + m->L.off_ranks);
  m->records = (dcpx_wait_record *)((char *)ctl + m->L.off_records);
  for (uint32_t d = 0; d < shape->world; d++)
    m->ws[d] = ws[d];
  r = dcpx__host_init(m);
  if (r < 0) {
    free(m);
    return r;
  }
  *ret_member = m;
  return 0;
}

void dcpx__member_detach(dcpx_member *m) {
  if (!m)
    return;
  dcpx__host_fini(m);
  free(m);
}

/* dcpx_join, step 1: the arguments, as far as libdcpx can judge them;
 * the reason of a refusal into why[n] (dcpx_client_last_error). */
#define JOIN_NO(code, ...)                                                   \
  do {                                                                       \
    snprintf(why, n, __VA_ARGS__);                                           \
    return (code);                                                           \
  } while (0)
static int join_check(const dcpx_shape *shape, const dcpx_join_opts *o,
                      char *why, size_t n) {
  int r = dcpx__shape_why(shape, why, n);
  if (r < 0)
    return r; /* dcpx_join's failure log says why */
  if (!dcpx__group_name_ok(o->group))
    JOIN_NO(DCPX_E_INVAL, "the group name must be 1..63 bytes of "
                          "[A-Za-z0-9._-]");
  if (o->timeout_ns < DCPX_MIN_TIMEOUT_NS)
    JOIN_NO(DCPX_E_INVAL, "timeout_ns %llu is below 1 ms",
            (unsigned long long)o->timeout_ns);
  if (o->timeout_ns > DCPX_MAX_TIMEOUT_NS)
    JOIN_NO(DCPX_E_INVAL, "timeout_ns %llu is above 1 hour "
                          "(DCPX_MAX_TIMEOUT_NS)",
            (unsigned long long)o->timeout_ns);
  if (o->join_timeout_ms > DCPX_MAX_JOIN_TIMEOUT_MS)
    JOIN_NO(DCPX_E_INVAL, "join_timeout_ms %u is above 24 hours "
                          "(DCPX_MAX_JOIN_TIMEOUT_MS)",
            o->join_timeout_ms);
  if (o->rank >= shape->world)
    JOIN_NO(DCPX_E_BADRANK, "rank %u is not below world %u", o->rank,
            shape->world);
  if (o->backend != DCPX_BACKEND_HOST && o->backend != DCPX_BACKEND_CUDA)
    JOIN_NO(DCPX_E_INVAL, "backend %u: no such backend", o->backend);
#ifdef HAVE_CUDA
  if (o->backend == DCPX_BACKEND_CUDA && o->device < 0)
    JOIN_NO(DCPX_E_INVAL, "the CUDA backend needs a device >= 0 (device %d)",
            o->device);
#else
  if (o->backend == DCPX_BACKEND_CUDA)
    JOIN_NO(DCPX_E_NOSYS, "this libdcpx was built without CUDA");
#endif
  if (o->transport > DCPX_TRANSPORT_NCCL)
    JOIN_NO(DCPX_E_INVAL, "transport %u: no such transport", o->transport);
  /* nccl needs the CUDA backend and a libdcpx built with NCCL: refused
   * here, before the daemon sees the join (DCPX_E_TRANSPORT). */
  if (o->transport == DCPX_TRANSPORT_NCCL && o->backend != DCPX_BACKEND_CUDA)
    JOIN_NO(DCPX_E_TRANSPORT, "the nccl transport needs the CUDA backend");
#ifndef HAVE_NCCL
  if (o->transport == DCPX_TRANSPORT_NCCL)
    JOIN_NO(DCPX_E_TRANSPORT, "this libdcpx was built without NCCL");
#endif
  return 0;
}
#undef JOIN_NO

/* Step 2: a member with the join's settings and layout, no link yet. */
static dcpx_member *member_new(const dcpx_client *c, const dcpx_shape *shape,
                               const dcpx_join_opts *o) {
  (void)pthread_once(&g_fork_once, fork_watch);
  dcpx_member *m = calloc(1, sizeof(*m));
  if (!m)
    return NULL;
  m->fork_gen = __atomic_load_n(&g_forks, __ATOMIC_RELAXED);
  member_link_init(m);
  memcpy(m->path, c->path, sizeof(m->path));
  m->device = o->device;
  m->join_timeout_ms = o->join_timeout_ms;
  m->shape = *shape;
  m->shape.size = sizeof(dcpx_shape);
  m->rank = o->rank;
  m->backend = o->backend;
  m->transport = DCPX_TRANSPORT_LL; /* the CUDA backend resolves it */
  m->transport_req = o->transport;
  m->timeout_ns = o->timeout_ns;
  memcpy(m->group, o->group, strlen(o->group) + 1);
  dcpx_layout_compute(&m->L, shape->world, shape->rows, shape->topk,
                      shape->local_topk);
  return m;
}

/* Join.node: this host's name, as text. Linux takes any bytes as a
 * hostname (sethostname), and a Join whose string is not valid UTF-8 is
 * refused as a whole (DCPX_E_TEXT, docs/PROTOCOL.md 7), which no caller
 * could act on: bytes that are not valid UTF-8 become '?', as in the text
 * dcpxd sends. */
static void node_name(char *node, size_t n) {
  if (gethostname(node, n) < 0)
    snprintf(node, n, "?");
  node[n - 1] = 0;
  dcpx__text_clean(node);
}

/* The Join of member m's settings (those of its dcpx_join; the timeout
 * the group's, once joined), into j, with sh and node[n] for its shape and
 * host name: the first Join and a reattach's. */
static void join_fill(dcpx_member *m, Dcpx__Join *j, Dcpx__Shape *sh,
                      char *node, size_t n) {
  dcpx__shape_to_pb(&m->shape, sh);
  node_name(node, n);
  j->group = m->group;
  j->shape = sh;
  j->transport = (Dcpx__Transport)m->transport_req;
  j->timeout_ns = m->timeout_ns;
  j->rank = m->rank;
  j->device = m->device;
  /* by UUID too (dcpx_join finds it): dcpxd checks the device, or a
   * reattach's adopted workspace, is on that GPU by its own ordinal */
  j->device_uuid.data = m->device_uuid;
  j->device_uuid.len = m->device_uuid_len;
  j->node = node;
  j->backend = (Dcpx__Backend)m->backend;
  j->join_timeout_ms = m->join_timeout_ms;
}

/* Step 3: the Join, on the member's connection. */
static int join_send(dcpx_client *c, dcpx_member *m,
                     const dcpx_join_opts *o) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__Join j = DCPX__JOIN__INIT;
  Dcpx__Shape sh;
  char node[256];

#ifdef HAVE_CUDA
  /* The GPU by its UUID: dcpxd's ordinals need not be ours (our
   * CUDA_VISIBLE_DEVICES). Without one dcpxd takes the ordinal as its
   * own; dcpx__cuda_init fails the join later where CUDA cannot answer. */
  if (o->backend == DCPX_BACKEND_CUDA && o->device >= 0 &&
      dcpx__cuda_device_uuid(o->device, m->device_uuid) == 0)
    m->device_uuid_len = sizeof(m->device_uuid);
#endif
  join_fill(m, &j, &sh, node, sizeof(node));
#ifdef HAVE_NCCL
  /* Rank 0 of a group that may use NCCL makes the unique id; dcpxd relays
   * it to every rank. With auto, a failure only rules out nccl. */
  if (o->rank == 0 && o->backend == DCPX_BACKEND_CUDA &&
      o->transport != DCPX_TRANSPORT_LL) {
    /* one id per dcpx_join: a Join sent again (DCPX_E_AGAIN) reuses it,
     * since each id starts a bootstrap thread of its own */
    int r = m->join_nccl_id_len
                ? 0
                : dcpx__nccl_unique_id(m->join_nccl_id,
                                       sizeof(m->join_nccl_id),
                                       &m->join_nccl_id_len);
    if (r < 0 && o->transport == DCPX_TRANSPORT_NCCL)
      return r;
    if (r < 0)
      m->join_nccl_id_len = 0;
    j.nccl_id.data = m->join_nccl_id;
    j.nccl_id.len = m->join_nccl_id_len;
  }
#endif
  f.msg_case = DCPX__FRAME__MSG_JOIN;
  f.join = &j;
  return dcpx__frame_send_or_reply(m->sock, &f, c->last_error,
                                   sizeof(c->last_error));
}

/* A join that stops early (DCPX_E_INTR): says it is going (shutdown)
 * and waits, at most ms, until dcpxd closes its end, which it does once
 * it has dropped the rank, so that a join of the same rank right after is
 * not refused as a duplicate. Whatever arrives meanwhile is discarded (the
 * kernel closes fds passed with it). */
static void join_withdraw(int sock, int ms) {
  const uint64_t end = dcpx__mono_ms() + (uint64_t)ms;
  char buf[256];
  if (shutdown(sock, SHUT_WR) < 0)
    return;
  for (;;) {
    const uint64_t now = dcpx__mono_ms();
    if (now >= end ||
        dcpx__poll_until(sock, POLLIN, dcpx__deadline_ms((int)(end - now))) <= 0)
      return;
    const ssize_t k = recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
      return;
  }
}

static int client_interrupted(const dcpx_client *c) {
  return __atomic_load_n(&c->interrupt, __ATOMIC_ACQUIRE);
}

/* How often a Join that dcpxd asked to retry (DCPX_E_AGAIN) goes again. */
#define JOIN_RETRY_MS 100

/* dcpxd asked this join to try again (DCPX_E_AGAIN: the group awaits its
 * ranks' reattach after a dcpxd restart): the connection and what came
 * with the refusal are dropped, and after JOIN_RETRY_MS (in slices that
 * see dcpx_client_interrupt) the caller sends the Join again, until the
 * join timeout counted from the first refusal (*end, 0 until then).
 * Returns 0 to go again, DCPX_E_TIMEDOUT (dcpxd's reason kept) or
 * DCPX_E_INTR. */
static int join_retry(dcpx_client *c, dcpx_member *m, Dcpx__Frame **rep,
                      int *fds, int *nfds, uint64_t *end) {
  for (int i = 0; i < *nfds; i++)
    close(fds[i]);
  *nfds = 0;
  dcpx__frame_free(*rep);
  *rep = NULL;
  close(m->sock);
  m->sock = -1;
  const uint64_t now = dcpx__mono_ms();
  if (!*end)
    *end = now + dcpx__join_ms(m);
  if (now >= *end) { /* dcpxd's reason stays */
    const size_t n = strlen(c->last_error);
    dcpx__textf(c->last_error + n, sizeof(c->last_error) - n,
                " (still so after %u ms of retries)", dcpx__join_ms(m));
    return DCPX_E_TIMEDOUT;
  }
  c->last_error[0] = '\0'; /* the next attempt's own, if any */
  for (uint64_t t = now; t < now + JOIN_RETRY_MS; t = dcpx__mono_ms()) {
    if (client_interrupted(c))
      return DCPX_E_INTR;
    struct timespec nap = {0, INTR_SLICE_MS * 1000000L};
    nanosleep(&nap, NULL);
  }
  return 0;
}

/* Step 4: waits for the JoinReply (with its fds), or a refusal (whose
 * reason goes to c->last_error). dcpxd answers within the join timeout:
 * opts', else its own (m->daemon_join_ms); this wait is the bound should
 * it not. */
static int join_wait_reply(dcpx_client *c, dcpx_member *m,
                           Dcpx__Frame **ret_rep, int *fds, int *ret_nfds) {
  Dcpx__Frame *rep = NULL;
  int nfds = 0, r;
  uint64_t wait_ms = (uint64_t)dcpx__join_ms(m) + JOIN_SLACK_MS;
  if (wait_ms > INT32_MAX) /* poll() takes an int */
    wait_ms = INT32_MAX;
  const uint64_t end = dcpx__mono_ms() + wait_ms;
  for (;;) {
    uint64_t now = dcpx__mono_ms();
    if (now >= end)
      return DCPX_E_TIMEDOUT;
    if (client_interrupted(c))
      return DCPX_E_INTR;
    /* Short slices, so that dcpx_client_interrupt is seen */
    r = recv_within(m->sock, end - now < INTR_SLICE_MS ? (int)(end - now)
                                                        : INTR_SLICE_MS,
                    &rep, fds, DCPX_FRAME_MAX_FDS, &nfds);
    if (r == DCPX_E_TIMEDOUT)
      continue;
    if (r < 0)
      return r;
    if (rep->msg_case == DCPX__FRAME__MSG_JOIN_REPLY)
      break;
    if (rep->msg_case == DCPX__FRAME__MSG_REPLY && rep->reply &&
        rep->reply->status < 0)
      r = rep->reply->status;
    keep_error(c->last_error, sizeof(c->last_error),
               r < 0 ? rep->reply : NULL);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    nfds = 0;
    dcpx__frame_free(rep);
    rep = NULL;
    if (r < 0)
      return r;
  }
  *ret_rep = rep;
  *ret_nfds = nfds;
  if (!rep->join_reply->reply)
    return DCPX_E_PROTO;
  r = rep->join_reply->reply->status;
  if (r < 0)
    keep_error(c->last_error, sizeof(c->last_error), rep->join_reply->reply);
  return r;
}

/* Step 5: maps the group's memory from the JoinReply and starts the
 * member's backend. Takes the fds (closed or kept by the member); the
 * reason of a backend's failure goes to why[n] (dcpx_client_last_error). */
static int member_start(dcpx_member *m, const Dcpx__JoinReply *jr, int *fds,
                        int *nfds, char *why, size_t n) {
  int r = member_map(m, jr, fds, *nfds);
  if (r < 0) {
    /* the group has formed: its peers see this rank go (an abort) */
    if (r != DCPX_E_PROTO && r != DCPX_E_VERSION)
      snprintf(why, n,
               "cannot map the group's memory (%s): the control page and "
               "%u workspaces of %llu bytes, %.1f GiB of address space "
               "(RLIMIT_AS, ulimit -v?)",
               dcpx_strerror(r), map_workspaces(m),
               (unsigned long long)m->L.ws_bytes, gib(map_bytes(m)));
    return r;
  }
  /* The call counters count this process's calls (dcpx_health): a
   * replacement for a dead rank starts from zero, not from the dead
   * process's totals, which dcpxd keeps across recoveries. */
  dcpx_rank_health *h = &m->health[m->rank];
  h->calls = h->rows = h->rescue_rows = h->failed_calls = 0;
  if (jr->timeout_ns)
    m->timeout_ns = jr->timeout_ns;
  if (jr->warning)
    snprintf(m->warning, sizeof(m->warning), "%s", jr->warning);
  member_keep_fds(m, fds, *nfds); /* for a reattach; see dcpx_poll */
  *nfds = 0;
#ifdef HAVE_CUDA
  if (m->backend == DCPX_BACKEND_CUDA) {
    uint8_t uuids[DCPX_MAX_WORLD * 16];
    dcpx__join_gpus jg = {jr->devices, (uint32_t)jr->n_devices, uuids};
    for (uint32_t d = 0; d < m->shape.world; d++) {
      if (d >= jr->n_device_uuids || jr->device_uuids[d].len != 16) {
        jg.uuids = NULL; /* some rank (or the daemon) predates them */
        break;
      }
      memcpy(uuids + 16u * d, jr->device_uuids[d].data, 16);
    }
    return dcpx__cuda_init(m, &jg, jr->nccl_id.data, jr->nccl_id.len,
                           why, n);
  }
#endif
  (void)why;
  (void)n;
  r = dcpx__host_init(m);
  /* the host backend always exchanges through shared memory */
  __atomic_store_n(&m->health[m->rank].transport, DCPX_TRANSPORT_LL,
                   __ATOMIC_RELEASE);
  return r;
}

/* A failed join's reason when dcpxd gave none: the connection's own, by
 * its code (dcpxd answers a join that does not form with DCPX_E_TIMEDOUT
 * and why, so a timeout here means it did not answer at all). */
static void join_fail_why(dcpx_client *c, int r) {
  const char *why = NULL;
  if (c->last_error[0])
    return;
  if (r == DCPX_E_INTR)
    why = "dcpx_client_interrupt stopped the join";
  else if (r == DCPX_E_TIMEDOUT) {
    snprintf(c->last_error, sizeof(c->last_error),
             "no answer from dcpxd within the join timeout and %d s more: "
             "dcpxd hung or is stopped", JOIN_SLACK_MS / 1000);
    return;
  } else if (r == DCPX_E_CONNRESET)
    why = "dcpxd closed the connection during the join (it stopped or "
          "restarted): join again";
  else if (r == -EMFILE)
    why = "the descriptors of dcpxd's reply did not fit: this process is "
          "at its open-file limit (RLIMIT_NOFILE, ulimit -n)";
  else if (r == DCPX_E_IO || r == DCPX_E_NOTCONN || r == -EPIPE) {
    snprintf(c->last_error, sizeof(c->last_error),
             "the connection to dcpxd failed during the join (%s)",
             dcpx_strerror(r));
    return;
  }
  if (why)
    snprintf(c->last_error, sizeof(c->last_error), "%s", why);
}

int dcpx_join(dcpx_client *c, const dcpx_shape *shape,
              const dcpx_join_opts *o, dcpx_member **ret_member) {
  Dcpx__Frame *rep = NULL;
  int fds[DCPX_FRAME_MAX_FDS], nfds = 0, r;
  dcpx_member *m = NULL;
  dcpx_shape auto_shape;

  if (!c)
    return REFUSE_NULL("dcpx_join", "client");
  c->last_error[0] = '\0';
  if (!o || !ret_member || o->size != sizeof(dcpx_join_opts)) {
    /* NULL, or a size this library does not know */
    snprintf(c->last_error, sizeof(c->last_error), "%s",
             !o            ? "no join options: pass a dcpx_join_opts set "
                             "from DCPX_JOIN_OPTS_INIT"
             : !ret_member ? "ret_member is NULL"
                           : "dcpx_join_opts.size is not this library's "
                             "(a header of another libdcpx version?)");
    DCPX_WARN("dcpx_join: %s: %s", dcpx_strerror(DCPX_E_INVAL),
              c->last_error);
    return DCPX_E_INVAL;
  }
  shape = dcpx__shape_resolved(shape, &auto_shape);
  r = join_check(shape, o, c->last_error, sizeof(c->last_error));
  if (r == 0 && client_interrupted(c))
    r = DCPX_E_INTR;
  if (r < 0)
    goto fail;
  m = member_new(c, shape, o);
  if (!m) {
    r = DCPX_E_NOMEM;
    goto fail;
  }
  r = map_fits(m, c->last_error, sizeof(c->last_error));
  if (r < 0)
    goto fail;
  for (uint64_t retry_end = 0;;) {
    r = open_conn(c->path, &m->sock, c->last_error, sizeof(c->last_error),
                  &m->daemon_join_ms);
    if (r == 0 && client_interrupted(c)) /* the Hello took up to 5 s */
      r = DCPX_E_INTR;
    if (r == 0)
      r = join_send(c, m, o);
    if (r == 0)
      r = join_wait_reply(c, m, &rep, fds, &nfds);
    if (r != DCPX_E_AGAIN ||
        (r = join_retry(c, m, &rep, fds, &nfds, &retry_end)) < 0)
      break;
  }
  /* The reply came in the slice the interrupt did: the group formed, and
   * the rank leaves it again (dcpx.h) */
  if (r == 0 && client_interrupted(c))
    r = DCPX_E_INTR;
  if (r == 0)
    r = member_start(m, rep->join_reply, fds, &nfds, c->last_error,
                     sizeof(c->last_error));
  if (r < 0)
    goto fail;
  dcpx__frame_free(rep);
  DCPX_INFO("joined group %s as rank %u of %u (%s backend, transport %s)",
            m->group, m->rank, m->shape.world,
            m->backend == DCPX_BACKEND_CUDA ? "cuda" : "host",
            m->transport == DCPX_TRANSPORT_NCCL ? "nccl" : "ll");
  *ret_member = m;
  return 0;

fail:
  join_fail_why(c, r);
  if (r == DCPX_E_INTR && m && m->sock >= 0)
    join_withdraw(m->sock, WITHDRAW_MS);
  DCPX_WARN("dcpx_join group %s rank %u: %s%s%s", o->group ? o->group : "?",
            o->rank, dcpx_strerror(r), c->last_error[0] ? ": " : "",
            c->last_error);
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  dcpx__frame_free(rep);
  member_free(m);
  return r;
}

int dcpx_client_interrupt(dcpx_client *c, int on) {
  if (!c)
    return DCPX_E_INVAL;
  __atomic_store_n(&c->interrupt, on != 0, __ATOMIC_RELEASE);
  return 0;
}

int dcpx_member_interrupt(dcpx_member *m, int on) {
  if (!m)
    return DCPX_E_INVAL;
  __atomic_store_n(&m->interrupt, on != 0, __ATOMIC_RELEASE);
  return 0;
}

const char *dcpx_client_last_error(const dcpx_client *c) {
  return c && c->last_error[0] ? c->last_error : NULL;
}

const char *dcpx_member_warning(const dcpx_member *m) {
  return m && m->warning[0] ? m->warning : NULL;
}

const char *dcpx_member_last_error(const dcpx_member *m) {
  return m ? m->why : NULL;
}

int dcpx_leave(dcpx_member *m) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__Leave lv = DCPX__LEAVE__INIT;
  int r = 0;

  if (!m)
    return 0;
  if (member_forked(m)) { /* the parent's rank stays joined */
    DCPX_INFO("releasing a forked child's copy of group %s rank %u", m->group,
              m->rank);
    member_free(m);
    return 0;
  }
  DCPX_INFO("leaving group %s as rank %u", m->group, m->rank);
  f.msg_case = DCPX__FRAME__MSG_LEAVE;
  f.leave = &lv;
#ifdef HAVE_CUDA
  /* Drain first: the daemon may recover (zero) the group as soon as it
   * hears we left, and our kernels must not store into it after that. */
  dcpx__cuda_fini(m);
#endif
  if (m->sock >= 0)
    r = dcpx__frame_send(m->sock, &f, NULL, 0);
  member_free(m);
  /* The daemon may already be gone; leaving is still done. */
  return r == DCPX_E_CONNRESET || r == -EPIPE ? 0 : r;
}

/* The call structs' size and reserved words; a refused struct fails the
 * rank, as any bad argument does (dcpx_merge in include/dcpx.h). */
static int call_check(dcpx_member *m, const char *fn, const dcpx_call *in,
                      const dcpx_merge_out *out, int merge, void *stream) {
  m->why[0] = '\0'; /* this call's refusal, if any, says why */
  int r = dcpx__struct_check_at(__FILE__, __LINE__, fn, "dcpx_call", in,
                                sizeof(dcpx_call), 0, m->why,
                                sizeof(m->why));
  if (r == 0 && merge)
    r = dcpx__struct_check_at(__FILE__, __LINE__, fn, "dcpx_merge_out", out,
                              sizeof(dcpx_merge_out),
                              DCPX__RESERVED_OF(out), m->why,
                              sizeof(m->why));
  if (r < 0) {
    /* its rows are not known (the struct is not trusted): none, rather
     * than the rows of the call before (dcpx_member_async_error) */
    dcpx__member_rows_begin(m, 0);
    dcpx__member_refuse(m);
#ifdef HAVE_CUDA
    if (m->cuda)
      dcpx__cuda_refused(m, stream, "a call with a bad struct");
#endif
  }
  return r;
}

int dcpx__merge_disjoint(struct dcpx_member *m, const char *fn,
                         const dcpx_call *in, const dcpx_merge_out *out,
                         int *ret_shared) {
  const uint64_t rows = in->rows, K = m->shape.topk;
  size_t i, j;
  *ret_shared = 0;
  if (!rows)
    return 0; /* an empty call touches no array */
  const int fits = dcpx__table_fits(in->block_table, in->bt_rows, in->bt_cols);
  const dcpx__span s[] = {
      /* the outputs first (merge.h dcpx__spans_overlap) */
      {"rows_out", (uintptr_t)out->rows_out, dcpx__words4(rows, K), 0, 0},
      {"valid_out", (uintptr_t)out->valid_out, 4u * rows, 0, 0},
      {"ids_out", (uintptr_t)out->ids_out, dcpx__words4(rows, K), 0, 0},
      {"sat_word", (uintptr_t)out->sat_word, 4u * rows, 0, 0},
      dcpx__logits_span("logits", in->logits, rows, in->stride,
                        m->shape.max_local),
      {"row_ends", (uintptr_t)in->row_ends, 4u * rows, 0, 0},
      {"req_id", (uintptr_t)in->req_id, 4u * rows, 0, 0},
      /* the structs, read again after outputs are written */
      {"the dcpx_call", (uintptr_t)in, sizeof(*in), 0, 0},
      {"the dcpx_merge_out", (uintptr_t)out, sizeof(*out), 0, 0},
      {"block_table", (uintptr_t)in->block_table,
       dcpx__words4(in->bt_rows, in->bt_cols), 0, 0},
  };
  /* a table that does not fit is left out of the overlap check (its
   * extent is not one; it is the last span), which still tells whether an
   * output shares another array (then not even valid_out -1 may be
   * written) */
  const size_t ns = sizeof(s) / sizeof(s[0]) - (fits ? 0u : 1u);
  if (!dcpx__spans_overlap(s, ns, 4, &i, &j)) {
    if (fits)
      return 0;
    DCPX_REFUSE(m, "%s: group %s rank %u: block_table of %u x %u int32 "
                "entries runs past the end of the address space", fn,
                m->group, m->rank, in->bt_rows, in->bt_cols);
    return DCPX_E_INVAL;
  }
  DCPX_REFUSE(m, "%s: group %s rank %u: %s overlaps %s (each output "
              "needs memory of its own, apart from the inputs)",
              fn, m->group, m->rank, s[i].what, s[j].what);
  *ret_shared = 1;
  return DCPX_E_INVAL;
}

/* The calls of one member run one at a time (include/dcpx.h): dcpx_push,
 * dcpx_push_list, dcpx_merge, dcpx_recover and dcpx_device_ctx hold the
 * member's call state (m->call_busy) from their start to their return. A
 * call that finds another thread's call there is refused with
 * DCPX_E_BUSY and does nothing else: it writes no word of the member (not
 * its reason, dcpx_member_last_error, which is the running call's), fails
 * nobody, and the running call goes on as if it had not come. Its reason
 * is a WARN line (DCPX_DEBUG) naming both calls. Two threads that called
 * at once raced on the member's state (its lists, its pending push, its
 * reason): a wrong result or a torn reason, without an error. One
 * compare-and-swap at the start and one store at the end: no syscall, no
 * allocation (tests/hotpath.c). A member inherited across fork() is
 * refused before (forked_refuse): the parent's thread may have held it
 * at the fork. */
static const char *call_name(int which) {
  switch (which) {
  case DCPX__CALL_PUSH: return "dcpx_push";
  case DCPX__CALL_PUSH_LIST: return "dcpx_push_list";
  case DCPX__CALL_MERGE: return "dcpx_merge";
  case DCPX__CALL_RECOVER: return "dcpx_recover";
  case DCPX__CALL_DEVICE_CTX: return "dcpx_device_ctx";
  default: return "a call";
  }
}

__attribute__((noinline, cold)) static int call_busy_refuse(
    const dcpx_member *m, int which, int running) {
  dcpx__why_at(NULL, 0, __FILE__, __LINE__,
               "%s: group %s rank %u: another thread is inside %s of this "
               "member; the calls of one member run one at a time (%s; "
               "nothing done, the running call goes on)",
               call_name(which), m->group, m->rank, call_name(running),
               dcpx_strerror(DCPX_E_BUSY));
  return DCPX_E_BUSY;
}

static inline int call_enter(dcpx_member *m, int which) {
  int none = 0;
  if (__builtin_expect(__atomic_compare_exchange_n(&m->call_busy, &none,
                                                   which, 0, __ATOMIC_ACQUIRE,
                                                   __ATOMIC_RELAXED),
                       1))
    return 0;
  return call_busy_refuse(m, which, none);
}

static inline void call_exit(dcpx_member *m) {
  __atomic_store_n(&m->call_busy, 0, __ATOMIC_RELEASE);
}

/* The call order: on a rank that has not failed (and a group not
 * aborted), a push while this rank's previous push of the same generation
 * waits for its merge, a merge with no such push before it, or a merge of
 * other rows than that push's, is refused with DCPX_E_STATE and does
 * nothing (the push stays pending): the rank is not failed, its group
 * stays in step, and no recovery is needed. A second push would overwrite
 * the lists its peers may still be reading; a merge without one would wait
 * out the group timeout for lists that never come, and abort the group; a
 * merge of fewer rows would leave the others' epochs behind, so that the
 * next call's push of them overwrites slots a peer may still be reading
 * (under another call half: the peer's wait times out, docs/PROTOCOL.md
 * 4.3), and a merge of more rows would wait out the timeout for rows
 * nobody pushed. Checked before the call's arguments (dcpx.h), its
 * structs included: a merge with no push and a NULL dcpx_merge_out is
 * DCPX_E_STATE, not a refusal that fails the rank. On
 * a failed rank every call fails as dcpx_merge says, in any order, until
 * dcpx_recover; a recovery (a new generation) ends a pending push. Not
 * checked once the library cannot see every call (m->order_off): a device
 * context's kernels push, and CUDA graph replays are not library calls, so
 * a call that goes into a capture turns the check off for the member.
 * Loads of the control page and, with CUDA, one stream query; no
 * syscall. */
static int call_order(dcpx_member *m, const char *fn, int merge,
                      const dcpx_call *in, void *stream) {
  m->why[0] = '\0'; /* this call's refusal, if any, says why */
#ifdef HAVE_CUDA
  if (m->cuda && !m->order_off && dcpx__cuda_capturing(m, stream))
    m->order_off = 1;
#else
  (void)stream;
#endif
  if (m->order_off || !m->hdr)
    return 0;
  const uint32_t gen = __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE);
  const int pending = m->pushed_gen == gen;
  /* A struct that call_check will refuse (NULL, another size) has no rows
   * to compare: the order holds as far as it can be told. */
  const int rows_known = in && in->size == sizeof(*in);
  if (merge ? pending && (!rows_known || in->rows == m->pushed_rows)
            : !pending)
    return 0;
  if (__atomic_load_n(&m->hdr->abort, __ATOMIC_RELAXED) ||
      __atomic_load_n(&m->health[m->rank].failed, __ATOMIC_RELAXED))
    return 0;
  if (merge && pending)
    DCPX_REFUSE(m, "dcpx_merge: group %s rank %u: a merge of %u rows after "
                "a push of %u (a call's push and merge take the same rows)",
                m->group, m->rank, in->rows, m->pushed_rows);
  else
    DCPX_REFUSE(m, "%s: group %s rank %u: %s", fn, m->group, m->rank,
                merge ? "no dcpx_push (or dcpx_push_list) before this merge"
                      : "the previous push has not been merged yet");
  return DCPX_E_STATE;
}

/* After a push of `rows` rows: pending (its merge due) if it succeeded. */
static void call_pushed(dcpx_member *m, int r, uint32_t rows) {
  m->pushed_gen = r == 0 && m->hdr ? __atomic_load_n(&m->hdr->generation,
                                                     __ATOMIC_ACQUIRE)
                                   : 0;
  m->pushed_rows = rows;
}

static int push_held(dcpx_member *m, const dcpx_call *in, void *stream);

int dcpx_push(dcpx_member *m, const dcpx_call *in, void *stream) {
  int r;
  if (!m)
    return REFUSE_NULL("dcpx_push", "member");
  if (member_forked(m))
    return forked_refuse(m, "dcpx_push");
  if ((r = call_enter(m, DCPX__CALL_PUSH)) < 0)
    return r;
  r = push_held(m, in, stream);
  call_exit(m);
  return r;
}

/* dcpx_push's work, the member's call state held. */
static int push_held(dcpx_member *m, const dcpx_call *in, void *stream) {
  int r;
  if ((r = call_order(m, "dcpx_push", 0, in, stream)) < 0)
    return r;
  if ((r = call_check(m, "dcpx_push", in, NULL, 0, stream)) < 0)
    return r;
  DCPX_TRACE("dcpx_push group %s rank %u rows %u tag %llu", m->group,
             m->rank, in->rows, (unsigned long long)in->call_tag);
#ifdef HAVE_CUDA
  if (m->cuda)
    r = dcpx__cuda_push(m, in, stream);
  else
#endif
    r = dcpx__host_push(m, in);
  (void)stream;
  call_pushed(m, r, in->rows);
  return r;
}

static int push_list_held(dcpx_member *m, const dcpx_call *in,
                          const dcpx_lists *lists, void *stream);

int dcpx_push_list(dcpx_member *m, const dcpx_call *in,
                   const dcpx_lists *lists, void *stream) {
  int r;
  if (!m)
    return REFUSE_NULL("dcpx_push_list", "member");
  if (member_forked(m))
    return forked_refuse(m, "dcpx_push_list");
  if ((r = call_enter(m, DCPX__CALL_PUSH_LIST)) < 0)
    return r;
  r = push_list_held(m, in, lists, stream);
  call_exit(m);
  return r;
}

/* dcpx_push_list's work, the member's call state held. */
static int push_list_held(dcpx_member *m, const dcpx_call *in,
                          const dcpx_lists *lists, void *stream) {
  int r;
  if ((r = call_order(m, "dcpx_push_list", 0, in, stream)) < 0)
    return r;
  if ((r = call_check(m, "dcpx_push_list", in, NULL, 0, stream)) < 0)
    return r;
  DCPX_TRACE("dcpx_push_list group %s rank %u rows %u tag %llu", m->group,
             m->rank, in->rows, (unsigned long long)in->call_tag);
#ifdef HAVE_CUDA
  if (m->cuda)
    r = dcpx__cuda_push_list(m, in, lists, stream);
  else
#endif
    r = dcpx__host_push_list(m, in, lists);
  (void)stream;
  call_pushed(m, r, in->rows);
  return r;
}

int dcpx_device_ctx(dcpx_member *m, dcpx_device *ret_ctx) {
  int r = dcpx__struct_check("dcpx_device_ctx", "dcpx_device", ret_ctx,
                             sizeof(dcpx_device), 0);
  if (r < 0)
    return DCPX_E_INVAL;
  if (!m)
    return REFUSE_NULL("dcpx_device_ctx", "member");
  if (member_forked(m))
    return forked_refuse(m, "dcpx_device_ctx");
#ifdef HAVE_CUDA
  if (m->cuda) {
    if ((r = call_enter(m, DCPX__CALL_DEVICE_CTX)) < 0)
      return r;
    r = dcpx__cuda_device_ctx(m, ret_ctx);
    if (r == 0)
      m->order_off = 1; /* its kernels push unseen */
    call_exit(m);
    return r;
  }
#endif
  DCPX_WARN("dcpx_device_ctx: group %s rank %u uses the host backend; a "
            "device context needs the CUDA backend", m->group, m->rank);
  return DCPX_E_NOSYS;
}

static int merge_held(dcpx_member *m, const dcpx_call *in,
                      const dcpx_merge_out *out, void *stream);

int dcpx_merge(dcpx_member *m, const dcpx_call *in, const dcpx_merge_out *out,
               void *stream) {
  int r;
  if (!m)
    return REFUSE_NULL("dcpx_merge", "member");
  if (member_forked(m))
    return forked_refuse(m, "dcpx_merge");
  if ((r = call_enter(m, DCPX__CALL_MERGE)) < 0)
    return r;
  r = merge_held(m, in, out, stream);
  call_exit(m);
  return r;
}

/* dcpx_merge's work, the member's call state held. */
static int merge_held(dcpx_member *m, const dcpx_call *in,
                      const dcpx_merge_out *out, void *stream) {
  int r;
  if ((r = call_order(m, "dcpx_merge", 1, in, stream)) < 0)
    return r;
  if ((r = call_check(m, "dcpx_merge", in, out, 1, stream)) < 0)
    return r;
  m->pushed_gen = 0;
  DCPX_TRACE("dcpx_merge group %s rank %u rows %u tag %llu", m->group,
             m->rank, in->rows, (unsigned long long)in->call_tag);
#ifdef HAVE_CUDA
  if (m->cuda)
    return dcpx__cuda_merge(m, in, out, stream);
#endif
  (void)stream;
  return dcpx__host_merge(m, in, out);
}

int dcpx_member_async_error(const dcpx_member *m, dcpx_async_error *ret) {
  int r = dcpx__struct_check("dcpx_member_async_error", "dcpx_async_error",
                             ret, sizeof(dcpx_async_error),
                             DCPX__RESERVED_OF(ret));
  if (r < 0)
    return r;
  if (!m || !m->hdr)
    return REFUSE_NULL("dcpx_member_async_error", "member");
  dcpx_async_error e = DCPX_ASYNC_ERROR_INIT;
  const uint32_t gen = __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE);
  e.abort = __atomic_load_n(&m->hdr->abort, __ATOMIC_ACQUIRE);
  e.generation = gen;
  for (uint32_t d = 0; d < m->shape.world; d++)
    if (__atomic_load_n(&m->health[d].failed, __ATOMIC_ACQUIRE))
      e.failed_mask |= 1u << d;
  const int self_failed = (e.failed_mask >> m->rank) & 1u;
  e.state = e.abort ? DCPX_E_ABORTED : self_failed ? DCPX_E_FAILED : DCPX_OK;
  e.rows = m->last_rows;
  /* This rank's timed-out rows of this generation: a rank stops calling
   * at its first failure until a recovery (which clears the records), so
   * they are the last call's. */
  int timed_out = 0;
  const dcpx_wait_record *rec = m->records + (size_t)m->rank * m->L.rows;
  for (uint32_t t = 0; t < m->L.rows; t++)
    if (__atomic_load_n(&rec[t].kind, __ATOMIC_ACQUIRE) == DCPX_REC_TIMEOUT &&
        rec[t].generation == gen) {
      e.row_mask[t / 64] |= 1ull << (t % 64);
      timed_out = 1;
    }
  e.rows_exact = m->cuda == NULL;
  if (e.rows_exact)
    for (uint32_t w = 0; w < DCPX_MAX_ROWS / 64; w++)
      e.row_mask[w] |= m->row_err[w];
  for (uint32_t w = 0; w < DCPX_MAX_ROWS / 64; w++)
    e.failed_rows += (uint32_t)__builtin_popcountll(e.row_mask[w]);

  if (self_failed && m->refused_gen == gen + 1u)
    e.reason = DCPX_REASON_REFUSED;
  else if (timed_out || self_failed)
    e.reason = DCPX_REASON_TIMEOUT; /* FAILED is set only by these two */
  else if (e.abort == DCPX_ABORT_DEAD)
    e.reason = DCPX_REASON_DEAD_RANK;
  else if (e.abort == DCPX_ABORT_OPERATOR)
    e.reason = DCPX_REASON_OPERATOR;
  else if (e.abort || e.failed_mask)
    e.reason = DCPX_REASON_PEER_FAILED;
  else if (e.failed_rows && m->bt_rows_bad)
    e.reason = DCPX_REASON_BLOCK_TABLE;
  *ret = e;
  return 0;
}

/* ---- the link: reconnect and reattach (dcpx_poll) --------------------- */

static void link_down(dcpx_member *m, uint64_t retry_in_ms) {
  if (m->sock >= 0)
    close(m->sock);
  m->sock = -1;
  m->link = DCPX__LINK_DOWN;
  m->refused = 0;
  m->retry_at_ms = dcpx__mono_ms() + retry_in_ms;
}

/* A reattach's connection to dcpxd at m->path, without waiting: its
 * socket, blocking once connected, or DCPX_E_CONNREFUSED where no
 * daemon takes it now, or -errno. */
static int reattach_connect(const dcpx_member *m) {
  struct sockaddr_un sa;
  int s, r;

  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, m->path, sizeof(m->path));
  s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0)
    return -errno;
  if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    /* EAGAIN: the backlog is full; like no daemon, try again soon. */
    r = errno == ECONNREFUSED || errno == ENOENT || errno == EAGAIN
            ? DCPX_E_CONNREFUSED
            : -errno;
    close(s);
    return r;
  }
  /* Connected: two small frames fit the empty socket buffer, and the rest
   * of libdcpx expects a blocking socket. */
  (void)fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
  return s;
}

/* Connects without blocking and sends Hello and the reattach Join, with
 * the member's fds; the answers come later (link_frame). */
static int link_reattach_start(dcpx_member *m) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__Hello hello = DCPX__HELLO__INIT;
  Dcpx__Join j = DCPX__JOIN__INIT;
  Dcpx__Shape sh;
  const uint32_t W = m->shape.world;
  int fds[DCPX_MAX_WORLD + 1];
  char node[256];
  int s, r;

  if (m->ctl_fd < 0)
    return DCPX_E_STATE; /* nothing to hand back */
  s = reattach_connect(m);
  if (s < 0)
    return s;
  hello.version = DCPX_PROTO_VERSION;
  hello.agent = (char *)"libdcpx " DCPX_VERSION_STRING;
  f.msg_case = DCPX__FRAME__MSG_HELLO;
  f.hello = &hello;
  r = dcpx__frame_send(s, &f, NULL, 0);
  if (r < 0)
    goto fail;

  join_fill(m, &j, &sh, node, sizeof(node));
  j.reattach = 1;
  j.generation = __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE);
  fds[0] = m->ctl_fd;
  for (uint32_t d = 0; d < W; d++)
    fds[1 + d] = m->ws_fd[d];
  f.msg_case = DCPX__FRAME__MSG_JOIN;
  f.join = &j;
  r = dcpx__frame_send(s, &f, fds, (int)W + 1);
  if (r < 0)
    goto fail;
  m->sock = s;
  m->link = DCPX__LINK_REATTACHING;
  m->reattach_step = 0;
  m->link_sent_ms = dcpx__mono_ms();
  return 0;
fail:
  if (r == -EPIPE || r == DCPX_E_CONNRESET || r == -ENOTCONN) {
    /* The daemon closed before our sends were through: it refused us at
     * accept (its Reply says why, and is queued), or it went away (one
     * killed as it accepted): like no daemon, try again soon. */
    char why[256] = "";
    const int q = dcpx__frame_queued_refusal(s, why, sizeof(why));
    if (q < 0)
      DCPX_WARN("group %s rank %u: dcpxd refused the reattach: %s (%s)",
                m->group, m->rank, why[0] ? why : "-", dcpx_strerror(q));
    r = q < 0 ? q : DCPX_E_CONNREFUSED;
  }
  close(s);
  return r;
}

/* The daemon refused the reattach: says why (DCPX_DEBUG=WARN), drops the
 * link until the retry, and returns the daemon's code. */
static int reattach_refused(dcpx_member *m, const Dcpx__Reply *rep) {
  DCPX_WARN("group %s rank %u: dcpxd refused the reattach: %s (%s); "
            "retrying in %d ms",
            m->group, m->rank, rep->error && rep->error[0] ? rep->error : "-",
            dcpx_strerror(rep->status), RETRY_REFUSED_MS);
  link_down(m, RETRY_REFUSED_MS);
  m->refused = rep->status;
  return rep->status;
}

/* Handles a frame that answers the reattach. Returns 0 (consumed), or a
 * negative code after which the link is down. */
static int link_reattach_frame(dcpx_member *m, const Dcpx__Frame *f,
                               int nfds) {
  if (m->reattach_step == 0) { /* the Hello's answer */
    if (f->msg_case != DCPX__FRAME__MSG_REPLY || !f->reply)
      goto proto;
    if (f->reply->status < 0)
      return reattach_refused(m, f->reply);
    m->reattach_step = 1;
    return 0;
  }
  if (f->msg_case == DCPX__FRAME__MSG_REPLY && f->reply &&
      f->reply->status < 0)
    return reattach_refused(m, f->reply);
  if (f->msg_case != DCPX__FRAME__MSG_JOIN_REPLY || !f->join_reply ||
      !f->join_reply->reply)
    goto proto;
  if (f->join_reply->reply->status < 0)
    return reattach_refused(m, f->join_reply->reply);
  /* A daemon that gives out memory did not adopt ours (it predates
   * reattach): our calls would run on memory it does not watch. */
  if (nfds > 0 || f->join_reply->n_fds > 0)
    goto proto;
  m->link = DCPX__LINK_UP;
  m->reattaches++;
  DCPX_INFO("group %s rank %u: reattached to a new dcpxd (%u so far)",
            m->group, m->rank, m->reattaches);
  return 0;
proto:
  link_down(m, RETRY_REFUSED_MS);
  return DCPX_E_PROTO;
}

/* One step of the link. If it is down and a retry is due, starts a
 * reattach; if down and not due, sleeps up to wait_ms. Then receives at
 * most one frame within wait_ms and handles the reattach's answers itself.
 * Returns 1 with *ret_frame (to free) for a frame for the caller (an Event,
 * or a Reply while up); 0 if nothing came or the frame was the link's own;
 * or a negative code: the link is down or the daemon refused the reattach
 * (DCPX_E_NOTCONN: a reattach is still waiting for its answers). */
static int link_step(dcpx_member *m, int wait_ms, Dcpx__Frame **ret_frame) {
  int fds[DCPX_FRAME_MAX_FDS], nfds = 0, r;
  Dcpx__Frame *f = NULL;
  uint64_t now = dcpx__mono_ms();

  if (m->link == DCPX__LINK_DOWN) {
    /* until the retry: dcpxd's refusal of the last reattach, if it
     * refused it, else "no dcpxd answers" */
    const int down = m->refused ? m->refused : DCPX_E_CONNREFUSED;
    if (now < m->retry_at_ms) {
      uint64_t nap = m->retry_at_ms - now;
      if (wait_ms > 0)
        (void)poll(NULL, 0, nap < (uint64_t)wait_ms ? (int)nap : wait_ms);
      return down;
    }
    r = link_reattach_start(m);
    if (r < 0) { /* not there (soon again), or a refusal (in a second) */
      m->retry_at_ms = now + (r == DCPX_E_CONNREFUSED ? RETRY_DOWN_MS
                                                      : RETRY_REFUSED_MS);
      m->refused = r == DCPX_E_CONNREFUSED ? 0 : r;
      return r;
    }
  }
  r = recv_within(m->sock, wait_ms, &f, fds, DCPX_FRAME_MAX_FDS, &nfds);
  for (int i = 0; i < nfds; i++)
    close(fds[i]); /* no answer here carries fds we want */
  if (r == DCPX_E_TIMEDOUT) {
    if (m->link == DCPX__LINK_REATTACHING) {
      if (dcpx__mono_ms() - m->link_sent_ms > REATTACH_ANSWER_MS) {
        link_down(m, RETRY_REFUSED_MS);
        return DCPX_E_TIMEDOUT;
      }
      return DCPX_E_NOTCONN;
    }
    return 0;
  }
  if (r < 0) {
    /* EOF: the daemon went away. Reconnect at once (it may be back, and
     * one that closes before it answers the Hello is still coming up);
     * but a reattach that dcpxd closed after answering its Hello, without
     * a JoinReply, waits as after a refusal: no reconnect storm. */
    link_down(m, m->link == DCPX__LINK_REATTACHING && m->reattach_step
                     ? RETRY_REFUSED_MS
                     : 0);
    return r == -ECONNRESET || r == -EPIPE ? DCPX_E_CONNRESET : r;
  }
  if (m->link == DCPX__LINK_REATTACHING) {
    r = link_reattach_frame(m, f, nfds);
    dcpx__frame_free(f);
    if (r < 0)
      return r;
    return m->link == DCPX__LINK_UP ? 0 : DCPX_E_NOTCONN;
  }
  *ret_frame = f;
  return 1;
}

/* dcpx_poll, dcpx_health and dcpx_recover drive the member's link (its
 * socket, its reattach), one at a time (dcpx.h): a second one that
 * overlaps is refused with DCPX_E_BUSY instead of reading the same socket
 * (which could leave the member unattached for good). Atomics only. */
static int link_enter(dcpx_member *m) {
  return __atomic_exchange_n(&m->link_busy, 1, __ATOMIC_ACQUIRE)
             ? DCPX_E_BUSY
             : 0;
}

static void link_exit(dcpx_member *m) {
  __atomic_store_n(&m->link_busy, 0, __ATOMIC_RELEASE);
}

/* dcpx_poll's work, the link entered. */
static int poll_link(dcpx_member *m) {
  int r = 0;

  if (m->link == DCPX__LINK_NONE)
    return 0;
  for (int i = 0; i < POLL_BATCH; i++) {
    Dcpx__Frame *f = NULL;
    const int link0 = m->link;
    const uint32_t step0 = m->reattach_step;
    r = link_step(m, 0, &f);
    /* Events need no action here: the control page already says what
     * they say, and dcpx_recover looks at it. */
    dcpx__frame_free(f);
    if (r == 0 && m->link == DCPX__LINK_UP)
      break; /* drained */
    if (r == DCPX_E_CONNRESET)
      continue; /* went down just now: one attempt to reattach */
    /* A reattach that moved (sent just now, or its Hello answered): its
     * next answer may be in already, so look again rather than leave it
     * to the next poll (an engine polls once per step: a reattach took
     * four of them). */
    if (r == DCPX_E_NOTCONN && m->link == DCPX__LINK_REATTACHING &&
        (link0 != DCPX__LINK_REATTACHING || m->reattach_step != step0))
      continue;
    if (r < 0)
      break;
  }
  if (r == 1 || (r == 0 && m->link == DCPX__LINK_UP))
    return 0;
  return r < 0 ? r : DCPX_E_NOTCONN;
}

int dcpx_poll(dcpx_member *m) {
  int r;
  if (!m)
    return REFUSE_NULL("dcpx_poll", "member");
  if (member_forked(m)) /* the link is the parent's */
    return forked_refuse(m, "dcpx_poll");
  if ((r = link_enter(m)) < 0)
    return r;
  r = poll_link(m);
  link_exit(m);
  return r;
}

int dcpx_health(dcpx_member *m, dcpx_health_info *ret) {
  dcpx_health_info h;
  size_t n;
  int r;
  if (!m || !ret)
    return REFUSE_NULL("dcpx_health", !m ? "member" : "dcpx_health_info");
  if (ret->size < offsetof(dcpx_health_info, daemon_link)) {
    DCPX_WARN("dcpx_health: dcpx_health_info.size is %u, below the %zu of "
              "the first dcpx_health_info (initialise the struct with "
              "DCPX_HEALTH_INFO_INIT)", ret->size,
              offsetof(dcpx_health_info, daemon_link));
    return DCPX_E_INVAL;
  }
  if (member_forked(m))
    return forked_refuse(m, "dcpx_health");
  if ((r = link_enter(m)) < 0)
    return r;
  (void)poll_link(m); /* keeps the link, as documented */
  n = ret->size < sizeof(h) ? ret->size : sizeof(h);
  memset(&h, 0, sizeof(h));
  h.size = (uint32_t)n;
  h.generation = m->hdr->generation;
  h.abort = m->hdr->abort;
  h.world = m->shape.world;
  h.rank = m->rank;
  h.backend = m->backend;
  h.transport = m->transport;
  for (uint32_t d = 0; d < m->shape.world; d++) {
    const dcpx_rank_health *rh = &m->health[d];
    h.failed_mask |= (rh->failed ? 1u : 0u) << d;
    h.alarm_mask |= (rh->alarm ? 1u : 0u) << d;
    h.joined_mask |= (rh->joined ? 1u : 0u) << d;
  }
  h.calls = m->health[m->rank].calls;
  h.rows = m->health[m->rank].rows;
  h.rescue_rows = m->health[m->rank].rescue_rows;
  h.failed_calls = m->health[m->rank].failed_calls;
  h.daemon_link = m->link == DCPX__LINK_UP;
  h.reattaches = m->reattaches;
  memcpy(ret, &h, n);
  link_exit(m);
  return 0;
}


/* The recovery that gen was acknowledged for is complete: dcpxd bumps the
 * generation before it clears the abort word. */
static int recovered_since(const dcpx_member *m, uint32_t gen) {
  return !__atomic_load_n(&m->hdr->abort, __ATOMIC_ACQUIRE) &&
         __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE) != gen;
}

/* The group runs again: an nccl member makes its communicator anew from
 * rank 0's id for this generation (docs/PROTOCOL.md 6.9). */
static int recover_done(dcpx_member *m) {
#ifdef HAVE_CUDA
  if (m->cuda)
    return dcpx__cuda_recovered(m);
#endif
  (void)m;
  return 0;
}

static int recover_link(dcpx_member *m, void *stream, uint32_t timeout_ms);

/* Something to recover: the group aborted or recovering, this rank
 * FAILED, or a rank's alarm or FAILED word set whose abort dcpxd has not
 * stored yet (its next alarm scan). A rank that completed the call a peer
 * failed then recovers with it (docs/PROTOCOL.md 6.4), instead of
 * returning at once and meeting the abort at its next call while the
 * peer waits for its acknowledgement. */
static int recovery_due(const dcpx_member *m) {
  if (dcpx__member_needs_recovery(m))
    return 1;
  for (uint32_t r = 0; r < m->shape.world; r++)
    if (__atomic_load_n(&m->health[r].alarm, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&m->health[r].failed, __ATOMIC_ACQUIRE))
      return 1;
  return 0;
}

/* A recovery that timed out, logged with what the control page says of
 * why: the ranks that no live process holds (dcpxd waits for their
 * replacements), or, when every rank is held, that some rank has not
 * called dcpx_recover (dcpxd's acknowledgements: dcpxctl health). Not
 * attached to a dcpxd (it is down, or a reattach is pending), this
 * rank's own acknowledgement is with no dcpxd: that is said instead (the
 * control page's joined words are then as the last dcpxd left them, and
 * "some have not called dcpx_recover" would blame the others). */
static int recover_timed_out(const dcpx_member *m, uint32_t timeout_ms) {
  char absent[DCPX_MAX_WORLD * 4 + 1];
  size_t n = 0;
  absent[0] = '\0';
  if (m->link != DCPX__LINK_UP) {
    DCPX_WARN("dcpx_recover group %s rank %u: not reset within %u ms: not "
              "attached to dcpxd (down or restarting; this rank "
              "acknowledges once it has reattached)",
              m->group, m->rank, timeout_ms);
    return DCPX_E_TIMEDOUT;
  }
  for (uint32_t d = 0; d < m->shape.world; d++)
    if (!__atomic_load_n(&m->health[d].joined, __ATOMIC_RELAXED))
      n += (size_t)snprintf(absent + n, sizeof(absent) - n, "%s%u",
                            n ? "," : "", d);
  if (n)
    DCPX_WARN("dcpx_recover group %s rank %u: not reset within %u ms: no "
              "live process holds rank(s) %s (dcpxd waits for their "
              "replacements to join)",
              m->group, m->rank, timeout_ms, absent);
  else
    DCPX_WARN("dcpx_recover group %s rank %u: not reset within %u ms: every "
              "rank is held; some have not called dcpx_recover (dcpxctl "
              "health shows the acknowledgements)",
              m->group, m->rank, timeout_ms);
  return DCPX_E_TIMEDOUT;
}

int dcpx_recover(dcpx_member *m, void *stream, uint32_t timeout_ms) {
  int r;
  if (!m)
    return REFUSE_NULL("dcpx_recover", "member");
  if (member_forked(m))
    return forked_refuse(m, "dcpx_recover");
  /* It clears the member's reason and (nccl) makes the communicator the
   * calls use anew: the member's call state, held as a push holds it */
  if ((r = call_enter(m, DCPX__CALL_RECOVER)) < 0)
    return r;
  if ((r = link_enter(m)) < 0) {
    call_exit(m);
    return r;
  }
  r = recover_link(m, stream, timeout_ms);
  if (r == 0)
    m->why[0] = '\0'; /* the refusal it recovered from is over */
  link_exit(m);
  call_exit(m);
  return r;
}

/* One RecoverAck for the generation being recovered, into *ret_gen (rank
 * 0 of an nccl group adds the next generation's communicator id). 0, or
 * the send's error: the link is then down. */
static int recover_ack_send(dcpx_member *m, uint32_t *ret_gen) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__RecoverAck ack = DCPX__RECOVER_ACK__INIT;
  const uint32_t gen = __atomic_load_n(&m->hdr->generation, __ATOMIC_ACQUIRE);
  ack.generation = gen;
#ifdef HAVE_CUDA
  uint8_t nccl_id[DCPX_NCCL_ID_BYTES];
  size_t nccl_id_len = 0;
  if (m->cuda && dcpx__cuda_nccl_id(m, gen, nccl_id, sizeof(nccl_id),
                                    &nccl_id_len) == 0) {
    ack.nccl_id.data = nccl_id;
    ack.nccl_id.len = nccl_id_len;
  }
#endif
  f.msg_case = DCPX__FRAME__MSG_RECOVER_ACK;
  f.recover_ack = &ack;
  const int r = dcpx__frame_send(m->sock, &f, NULL, 0);
  if (r < 0) {
    link_down(m, 0);
    return r;
  }
  *ret_gen = gen;
  return 0;
}

enum { RECOVER_WAIT, RECOVER_DONE, RECOVER_REACK };

/* What a frame read after acknowledging gen says (it is freed here):
 * RECOVER_DONE (a RESET_DONE event past gen, or a refusal that came
 * after the recovery completed), RECOVER_REACK (a refusal that raced
 * with a generation change: acknowledge again, at most 8 times), dcpxd's
 * refusal (< 0), or RECOVER_WAIT. */
static int recover_event(dcpx_member *m, Dcpx__Frame *ev, uint32_t gen,
                         int *reacks) {
  int r = RECOVER_WAIT;
  if (ev->msg_case == DCPX__FRAME__MSG_EVENT && ev->event &&
      ev->event->kind == DCPX__EVENT__KIND__RESET_DONE &&
      (int32_t)(ev->event->generation - gen) > 0)
    r = RECOVER_DONE;
  else if (ev->msg_case == DCPX__FRAME__MSG_REPLY && ev->reply &&
           ev->reply->status < 0) {
    r = ev->reply->status;
    DCPX_WARN("dcpx_recover group %s rank %u: dcpxd refused the "
              "acknowledgement: %s (%s)",
              m->group, m->rank,
              ev->reply->error && ev->reply->error[0] ? ev->reply->error
                                                      : "-",
              dcpx_strerror(r));
    if (recovered_since(m, gen))
      r = RECOVER_DONE;
    else if (r == DCPX_E_STATE && (*reacks)++ < 8)
      r = RECOVER_REACK; /* our ack raced with a generation change */
  }
  dcpx__frame_free(ev);
  return r;
}

/* dcpx_recover's work, the link entered. */
static int recover_link(dcpx_member *m, void *stream, uint32_t timeout_ms) {
  const uint64_t end = dcpx__mono_ms() + timeout_ms;
  Dcpx__Frame *ev;
  uint32_t gen = 0;
  int acked = 0, reacks = 0, r;
#ifdef HAVE_CUDA
  int drained = 0; /* the stream, before the first acknowledgement */
#endif

  DCPX_INFO("dcpx_recover group %s rank %u (abort %u, failed %u)", m->group,
            m->rank, m->hdr ? m->hdr->abort : 0,
            m->health ? m->health[m->rank].failed : 0);
  (void)stream; /* host backend: nothing is in flight once a call returned */
  if (m->link == DCPX__LINK_NONE)
    return DCPX_E_NOTCONN;
  (void)poll_link(m); /* drain old events; reattach if the daemon is new */
  for (;;) {
    if (acked && recovered_since(m, gen))
      return recover_done(m);
    if (dcpx__member_interrupted(m))
      return DCPX_E_INTR; /* as after a timeout: call it again later */
    if (!acked && !recovery_due(m))
      return recover_done(m); /* at once (a replacement whose group
                                 recovered before it asked, too) */
#ifdef HAVE_CUDA
    /* Drain before the first acknowledgement, which says nothing of ours
     * still runs (a member with nothing to recover returned above, at
     * once, without waiting for its stream); bounded by what is left of
     * timeout_ms. Then look again: time passed. */
    if (!acked && !drained && m->cuda) {
      const uint64_t t = dcpx__mono_ms();
      if ((r = dcpx__cuda_sync(m, stream, t < end ? (uint32_t)(end - t) : 0)) < 0)
        return r;
      drained = 1;
      continue;
    }
#endif
    /* Acknowledge for the generation being recovered. A daemon that
     * restarted since forgot earlier acks, so this runs again after every
     * reattach. A failed send took the link down: look again. */
    if (!acked && m->link == DCPX__LINK_UP) {
      if (recover_ack_send(m, &gen) < 0)
        continue;
      acked = 1;
    }
    uint64_t now = dcpx__mono_ms();
    if (now >= end)
      return recover_timed_out(m, timeout_ms);
    /* Short slices, so that the control page is looked at too. */
    int slice = (int)(end - now < 50u ? end - now : 50u);
    ev = NULL;
    r = link_step(m, slice, &ev);
    if (r < 0) {
      /* Down, or reattaching: the ack (if any) died with the old daemon.
       * A refusal other than "not there yet" ends the recovery. */
      acked = 0;
      if (r != DCPX_E_CONNREFUSED && r != DCPX_E_NOTCONN &&
          r != DCPX_E_CONNRESET && r != DCPX_E_TIMEDOUT)
        return r;
      continue;
    }
    if (r == 0)
      continue;
    if (!acked) {
      dcpx__frame_free(ev);
      continue;
    }
    r = recover_event(m, ev, gen, &reacks);
    if (r == RECOVER_DONE)
      return recover_done(m);
    if (r == RECOVER_REACK)
      acked = 0;
    else if (r < 0)
      return r;
  }
}
