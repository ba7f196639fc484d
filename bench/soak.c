/* soak.c - client processes churning through a private dcpxd for a while,
 * with faults: every call that completes must be exact, the daemon's memory
 * and descriptors must stay flat, and a group whose rank was killed must
 * recover within a bound (issue 12, "Soak"). `soak --help` lists the
 * options; bench/RESULTS.md ("Soak") has the recorded runs.
 *
 * Who runs what. The parent starts dcpxd ($DCPXD, default ./daemon/dcpxd)
 * on a private socket and state dir, forks G gangs of W client processes
 * (one process per rank; default 8 x 8 = 64), samples dcpxd, and injects
 * the faults. Every client loops over "instances" of its gang's group:
 *
 *   B1   gang barrier (the process must be attached to dcpxd first)
 *        leave the previous instance, connect, join the next one (W ranks;
 *        the name cycles through 8 per gang, so groups are made and
 *        destroyed all the time), a GROUPS query on an ops connection
 *   B2   gang barrier
 *        C calls k = 1..C (push + merge on the host backend; call number
 *        (instance, generation, k), so inputs are the same in every rank;
 *        each checked against dcpx_ref_call), dcpx_poll before each
 *
 * The faults, one at a time, from the parent:
 *
 *   kill   every --kill-every s, the next gang in turn: one rank (chosen at
 *          random) stops between its push and its merge of call k (1 <= k
 *          <= C-2, so that every peer must wait for its next push) and the
 *          parent kills it with SIGKILL. Its peers' calls fail
 *          (DCPX_E_ABORTED, counted as expected failures; only while a
 *          kill of their gang is under way), they dcpx_recover; a new
 *          process joins the instance as that rank (retrying while dcpxd
 *          still sees the dead one: DCPX_E_DUPRANK), recovers, and the
 *          gang resumes at k = 1 of the new generation. The recovery is
 *          complete when all W ranks made an exact call after it; it must
 *          be within --recover-bound s of the kill.
 *   restart every --restart-every s: gangs finish their joins and leaves
 *          and hold off new ones (calls go on), then dcpxd is stopped,
 *          SIGTERM and SIGKILL in turn, and started again on the same
 *          socket and state dir while the ranks keep calling; dcpx_poll
 *          reattaches every member (PROTOCOL.md 10.3, ARCHITECTURE.md
 *          "Daemon restart": the new dcpxd adopts the groups). Every rank
 *          must be attached to the new dcpxd within --recover-bound s.
 *
 * The parent samples dcpxd's RSS and fds every 0.5 s and prints a line
 * every --report s. It fails (exit 1, "soak: FAIL" and the first reason)
 * when a completed call is not exact; a call fails when no kill of its
 * gang is under way; a join, leave, query, recovery or reattach fails; a
 * rank does not recover (or reattach) within the bound; dcpxd's RSS
 * exceeds the largest RSS of the warm-up by more than --rss-growth-kib at
 * any sample after it; dcpxd's fds exceed the bound printed at the start
 * (idle + what G groups of W may hold) at any sample, or are more at the
 * end (every client gone) than those of the freshly started dcpxd; a fault asked for
 * never happened; or a client process dies unasked.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>

#include "health_harness.h"

#define NAMES_PER_GANG 8
#define MAX_GANGS 64
#define MAX_PROCS 256

/* Under ASan (the sanitizer build of .ci/run compiles this and dcpxd with
 * the same flags) freed blocks wait in ASan's quarantine before reuse, so
 * dcpxd's RSS grows by up to the quarantine: it is capped at this many MiB
 * (ASAN_OPTIONS) and allowed on top of the bound, as in check_health's
 * alarm flood. 0 otherwise. */
#if defined(__SANITIZE_ADDRESS__)
#define QUARANTINE_MB 16
#else
#define QUARANTINE_MB 0
#endif

/* The daemon gate: bit 31 is set while the parent wants to restart dcpxd;
 * the low bits count gangs between B1 and B2 (joining, leaving, querying). */
#define GATE_PENDING 0x80000000u

typedef struct gang_state {
  atomic_uint arrived, round; /* the barrier */
  atomic_uint instance;       /* set by B1's last arrival */
  atomic_int quit;            /* likewise: leave and exit */
  atomic_int kill_pending;    /* a kill of this gang is under way */
  atomic_int victim_rank;     /* -1: none */
  atomic_uint victim_k;
  atomic_int victim_ready;    /* the victim pushed and waits to be killed */
  atomic_uint recovered;      /* ranks with an exact call since recovering */
} gang_state;

typedef struct soak_shared {
  atomic_uint_fast64_t calls, exact, expected_fails, joins, leaves, queries;
  atomic_uint_fast64_t rank_recoveries, reattaches;
  atomic_uint failures;
  atomic_uint restarts; /* dcpxd restarts completed */
  atomic_uint gate;
  atomic_uint link_epoch[MAX_PROCS]; /* restarts when last seen attached */
  /* Where each client is (a phase and its call k, since when): printed at
   * the first failure, to tell a rank held up from one that waited */
  atomic_uint where[MAX_PROCS];
  atomic_uint_fast64_t where_since[MAX_PROCS];
  char first_error[320];
  atomic_flag error_set;
  volatile int stop;
  gang_state gang[MAX_GANGS];
} soak_shared;

typedef struct soak_opts {
  double seconds, warmup, report, kill_every, restart_every, recover_bound;
  unsigned gangs, W, calls, wait_timeout_ms;
  long growth_kib;
} soak_opts;

static soak_shared *S;
static soak_opts O;

/* A client's phases (soak_shared.where: phase << 16 | call k; 0, with
 * where_since 0, before its first). */
enum { AT_NONE, AT_POLL, AT_PUSH, AT_MERGE, AT_CHECK, AT_RECOVER,
       AT_ATTACH, AT_LEAVE, AT_JOIN, AT_QUERY, AT_BARRIER, AT_N };
static const char *const at_name[AT_N] = {
    "not started", "dcpx_poll", "dcpx_push", "dcpx_merge",
    "after dcpx_merge", "dcpx_recover", "attaching", "leaving", "joining",
    "the query", "a gang barrier"};

static void at(uint32_t slot, unsigned phase, uint32_t k) {
  atomic_store(&S->where[slot], phase << 16 | (k & 0xFFFFu));
  atomic_store(&S->where_since[slot], hh_mono());
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
  va_list ap;
  atomic_fetch_add(&S->failures, 1);
  if (atomic_flag_test_and_set(&S->error_set))
    return;
  va_start(ap, fmt);
  vsnprintf(S->first_error, sizeof(S->first_error), fmt, ap);
  va_end(ap);
}

/* ---- a client process ------------------------------------------------- */

typedef struct client {
  const char *sock;
  uint32_t gang, rank, slot;
  gang_state *g;
  hh_spec sp;
  dcpx_shape shape;
  dcpx_client *c;
  dcpx_member *m;
  int link_down;      /* the last dcpx_poll did not say attached */
  int just_recovered; /* count the next exact call as the recovery's */
  uint16_t *lg[DCPX_MAX_WORLD];
  int32_t *en[DCPX_MAX_WORLD];
} client;

/* dcpx_poll, and what it says about the link: 0 attached, 1 not yet (the
 * daemon is away or the reattach is under way), -1 refused (failed). */
static int client_poll(client *cl) {
  unsigned ep = atomic_load(&S->restarts);
  int r = dcpx_poll(cl->m);
  if (r == 0) {
    if (cl->link_down)
      atomic_fetch_add(&S->reattaches, 1);
    cl->link_down = 0;
    atomic_store(&S->link_epoch[cl->slot], ep);
    return 0;
  }
  if (r == DCPX_E_NOTCONN || r == DCPX_E_CONNREFUSED ||
      r == DCPX_E_CONNRESET || r == DCPX_E_TIMEDOUT) {
    cl->link_down = 1;
    return 1;
  }
  fail("gang %u rank %u: dcpx_poll: %s (the new dcpxd refused the reattach)",
       cl->gang, cl->rank, dcpx_strerror(r));
  return -1;
}

static uint64_t bound_ns(void) { return (uint64_t)(O.recover_bound * 1e9); }

/* Polls until attached; 0, or -1 past the bound. */
static int client_attach(client *cl) {
  const uint64_t end = hh_mono() + bound_ns();
  if (!cl->m)
    return 0;
  for (;;) {
    int r = client_poll(cl);
    if (r <= 0)
      return r;
    if (hh_mono() > end) {
      fail("gang %u rank %u: not attached to dcpxd %.0f s after it went",
           cl->gang, cl->rank, O.recover_bound);
      return -1;
    }
    hh_sleep_ms(5);
  }
}

/* Every process of the gang arrives; the last one runs `last` first.
 * Meanwhile the member (if any) keeps its link. 0, or -1 (failed). */
static int gang_wait(client *cl, void (*last)(gang_state *)) {
  gang_state *g = cl->g;
  const uint64_t end = hh_mono() + 4 * bound_ns();
  unsigned round = atomic_load(&g->round);
  if (atomic_fetch_add(&g->arrived, 1) + 1 == O.W) {
    atomic_store(&g->arrived, 0);
    if (last)
      last(g);
    atomic_fetch_add(&g->round, 1);
    return 0;
  }
  while (atomic_load(&g->round) == round) {
    if (cl->m && client_poll(cl) < 0)
      return -1;
    if (hh_mono() > end) {
      fail("gang %u rank %u: its peers did not come to the barrier in %.0f s",
           cl->gang, cl->rank, 4 * O.recover_bound);
      return -1;
    }
    if (atomic_load(&S->failures))
      return -1;
    hh_sleep_ms(1);
  }
  return 0;
}

/* B1's last arrival: the next instance, and whether to quit; unless
 * quitting, the gang holds a place at the daemon gate (waiting while a
 * restart is pending). */
static void b1_last(gang_state *g) {
  int quit = S->stop || atomic_load(&S->failures);
  atomic_store(&g->quit, quit);
  atomic_fetch_add(&g->instance, 1);
  while (!quit) {
    unsigned v = atomic_load(&S->gate);
    if (v & GATE_PENDING) {
      hh_sleep_ms(1);
      continue;
    }
    if (atomic_compare_exchange_weak(&S->gate, &v, v + 1))
      break;
  }
}

static void b2_last(gang_state *g) {
  (void)g;
  atomic_fetch_sub(&S->gate, 1);
}

/* Hello + Query GROUPS on a connection of its own; 0 or a code. */
static int ops_query(const char *sock) {
  Dcpx__Frame f = DCPX__FRAME__INIT, *in = NULL;
  Dcpx__Query q = DCPX__QUERY__INIT;
  char err[256];
  int s = dcpx__ops_connect(sock, "soak", 10000, err, sizeof(err)), r;

  if (s < 0)
    return s;
  q.what = DCPX__QUERY__WHAT__GROUPS;
  q.group = "";
  q.rank = -1;
  f.msg_case = DCPX__FRAME__MSG_QUERY;
  f.query = &q;
  r = dcpx__frame_send(s, &f, NULL, 0);
  if (r == 0)
    r = dcpx__frame_recv_answer(s, 10000, &in);
  if (r == 0)
    r = in->msg_case == DCPX__FRAME__MSG_QUERY_REPLY && in->query_reply &&
                in->query_reply->reply
            ? in->query_reply->reply->status
            : DCPX_E_PROTO;
  dcpx__frame_free(in);
  close(s);
  return r;
}

static void instance_name(const client *cl, char *name, size_t n) {
  snprintf(name, n, "soak-%u-%u", cl->gang,
           atomic_load(&cl->g->instance) % NAMES_PER_GANG);
}

static void drop_member(client *cl, int leave) {
  if (cl->m) {
    int r = leave ? dcpx_leave(cl->m) : 0;
    if (r < 0)
      fail("gang %u rank %u: leave: %s", cl->gang, cl->rank,
           dcpx_strerror(r));
    else if (leave)
      atomic_fetch_add(&S->leaves, 1);
  }
  if (cl->c)
    dcpx_disconnect(cl->c);
  cl->m = NULL;
  cl->c = NULL;
}

/* Connect and join the gang's current instance (as a replacement: retried
 * while dcpxd still sees the dead holder). 0 or -1 (failed). */
static int client_join(client *cl, int replacement) {
  const uint64_t end = hh_mono() + bound_ns();
  dcpx_join_opts jo = DCPX_JOIN_OPTS_INIT;
  char name[32];
  int r;

  instance_name(cl, name, sizeof(name));
  jo.group = name;
  jo.rank = cl->rank;
  jo.timeout_ns = cl->sp.timeout_ns;
  jo.join_timeout_ms = (uint32_t)(O.recover_bound * 1000);
  for (;;) {
    unsigned ep = atomic_load(&S->restarts);
    r = dcpx_connect(cl->sock, &cl->c);
    if (r < 0) {
      fail("gang %u rank %u: connect: %s", cl->gang, cl->rank,
           dcpx_strerror(r));
      return -1;
    }
    r = dcpx_join(cl->c, &cl->shape, &jo, &cl->m);
    if (r == 0) {
      atomic_fetch_add(&S->joins, 1);
      atomic_store(&S->link_epoch[cl->slot], ep);
      cl->link_down = 0;
      return 0;
    }
    const char *why = dcpx_client_last_error(cl->c);
    if (!(replacement && r == DCPX_E_DUPRANK) || hh_mono() > end) {
      fail("gang %u rank %u: join %s%s: %s (%s)", cl->gang, cl->rank, name,
           replacement ? " as a replacement" : "", dcpx_strerror(r),
           why ? why : "no reason given");
      dcpx_disconnect(cl->c);
      cl->c = NULL;
      return -1;
    }
    dcpx_disconnect(cl->c);
    cl->c = NULL;
    hh_sleep_ms(20);
  }
}

/* The group's generation (the same in every rank between recoveries). */
static uint32_t client_generation(client *cl) {
  dcpx_health_info hi = DCPX_HEALTH_INFO_INIT;
  return dcpx_health(cl->m, &hi) == 0 ? hi.generation : 0;
}

static int client_recover(client *cl, const char *after) {
  int r = dcpx_recover(cl->m, NULL, (uint32_t)(O.recover_bound * 1000));
  if (r < 0) {
    fail("gang %u rank %u: recover %s: %s", cl->gang, cl->rank, after,
         dcpx_strerror(r));
    return -1;
  }
  atomic_fetch_add(&S->rank_recoveries, 1);
  cl->just_recovered = 1;
  return 0;
}

/* Call number k of the instance at generation gen: the same inputs in
 * every rank, and never those of another call of the run. */
static uint64_t call_number(const client *cl, uint32_t gen, uint32_t k) {
  return ((uint64_t)atomic_load(&cl->g->instance) << 40) |
         ((uint64_t)gen << 20) | k;
}

/* The C calls of an instance (from k = 1 again after each recovery).
 * 0, or -1 (failed). */
static int client_calls(client *cl) {
  const uint32_t R = cl->sp.R, K = cl->sp.K, bt_cols = (cl->sp.L + 3) / 4;
  const uint32_t rank = cl->rank;
  int32_t req[8], bt[8 * 64], ro[8 * 64], xo[8 * 64], io[8 * 64], xi[8 * 64];
  int32_t vo[8], xv[8];
  uint32_t so[8], xs[8];
  uint32_t gen = client_generation(cl);

  for (uint32_t t = 0; t < R; t++) {
    req[t] = (int32_t)t;
    for (uint32_t b = 0; b < bt_cols; b++)
      bt[t * bt_cols + b] = (int32_t)(rank * 100000 + t * bt_cols + b);
  }
  for (uint32_t k = 1; k <= O.calls;) {
    const uint64_t c = call_number(cl, gen, k);
    dcpx_call in = DCPX_CALL_INIT;
    dcpx_merge_out out = DCPX_MERGE_OUT_INIT, ref = DCPX_MERGE_OUT_INIT;
    dcpx_ref_in rin = DCPX_REF_IN_INIT;
    int r, rm;

    at(cl->slot, AT_POLL, k);
    if (client_poll(cl) < 0)
      return -1;
    hh_inputs(&cl->sp, c, cl->lg, cl->en);
    in.rows = R;
    in.logits = cl->lg[rank];
    in.stride = cl->sp.L;
    in.row_ends = cl->en[rank];
    in.req_id = req;
    in.block_table = bt;
    in.bt_rows = R;
    in.bt_cols = bt_cols;
    in.call_tag = c;
    out.rows_out = ro;
    out.valid_out = vo;
    out.ids_out = io;
    out.sat_word = so;
    at(cl->slot, AT_PUSH, k);
    r = dcpx_push(cl->m, &in, NULL);
    if (atomic_load(&cl->g->victim_rank) == (int)rank &&
        atomic_load(&cl->g->victim_k) == k) {
      atomic_store(&cl->g->victim_ready, 1); /* mid-call: killed here */
      for (;;)
        pause();
    }
    at(cl->slot, AT_MERGE, k);
    rm = dcpx_merge(cl->m, &in, &out, NULL);
    at(cl->slot, AT_CHECK, k);
    if (r == 0)
      r = rm;
    if (r == DCPX_E_ABORTED || r == DCPX_E_FAILED) {
      if (!atomic_load(&cl->g->kill_pending)) {
        fail("gang %u rank %u: call %u of generation %u failed (%s) with no "
             "fault injected",
             cl->gang, rank, k, gen, dcpx_strerror(r));
        return -1;
      }
      atomic_fetch_add(&S->expected_fails, 1);
      at(cl->slot, AT_RECOVER, k);
      if (client_recover(cl, "after a peer was killed") < 0)
        return -1;
      gen = client_generation(cl);
      k = 1;
      continue;
    }
    if (r < 0) {
      fail("gang %u rank %u: call %u: %s", cl->gang, rank, k,
           dcpx_strerror(r));
      return -1;
    }
    atomic_fetch_add(&S->calls, 1);
    rin.rows = R;
    rin.rank = rank;
    rin.stride = cl->sp.L;
    rin.logits = (const uint16_t *const *)cl->lg;
    rin.row_ends = (const int32_t *const *)cl->en;
    rin.req_id = req;
    rin.block_table = bt;
    rin.bt_rows = R;
    rin.bt_cols = bt_cols;
    ref.rows_out = xo;
    ref.valid_out = xv;
    ref.ids_out = xi;
    ref.sat_word = xs;
    r = dcpx_ref_call(&cl->shape, &rin, &ref, NULL);
    if (r < 0 || memcmp(ro, xo, (size_t)R * K * 4) ||
        memcmp(io, xi, (size_t)R * K * 4) || memcmp(vo, xv, R * 4) ||
        memcmp(so, xs, R * 4)) {
      fail("gang %u rank %u: call %u of generation %u (number %#" PRIx64
           ") is not exact",
           cl->gang, rank, k, gen, c);
      return -1;
    }
    atomic_fetch_add(&S->exact, 1);
    if (cl->just_recovered) {
      cl->just_recovered = 0;
      atomic_fetch_add(&cl->g->recovered, 1);
    }
    k++;
  }
  return 0;
}

static void client_main(const char *sock, uint32_t gang, uint32_t rank,
                        int replacement) {
  client cl = {.sock = sock, .gang = gang, .rank = rank,
               .slot = gang * O.W + rank, .g = &S->gang[gang]};

  cl.sp = (hh_spec){.W = O.W, .R = 2, .K = 16, .N = 8, .L = 64,
                    .timeout_ns = (uint64_t)O.wait_timeout_ms * 1000000ull};
  hh_shape(&cl.sp, &cl.shape);
  for (uint32_t d = 0; d < O.W; d++) {
    cl.lg[d] = calloc((size_t)cl.sp.R * cl.sp.L, 2);
    cl.en[d] = calloc(cl.sp.R, 4);
  }
  if (replacement) {
    at(cl.slot, AT_JOIN, 0); /* not the killed victim's phase */
    if (client_join(&cl, 1) < 0)
      goto out;
    at(cl.slot, AT_RECOVER, 0);
    if (client_recover(&cl, "as the replacement") < 0)
      goto out;
  }
  for (;;) {
    if (cl.m && client_calls(&cl) < 0)
      break;
    at(cl.slot, AT_ATTACH, 0);
    if (client_attach(&cl) < 0)
      break;
    at(cl.slot, AT_BARRIER, 1);
    if (gang_wait(&cl, b1_last) < 0)
      break;
    at(cl.slot, AT_LEAVE, 0);
    drop_member(&cl, 1);
    if (atomic_load(&cl.g->quit))
      break;
    at(cl.slot, AT_JOIN, 0);
    int r = client_join(&cl, 0);
    if (r == 0) {
      at(cl.slot, AT_QUERY, 0);
      r = ops_query(sock);
      if (r < 0)
        fail("gang %u rank %u: query: %s", gang, rank, dcpx_strerror(r));
      else
        atomic_fetch_add(&S->queries, 1);
    }
    at(cl.slot, AT_BARRIER, 2);
    if (gang_wait(&cl, b2_last) < 0 || r < 0)
      break;
  }
out:
  /* After a failure the member goes without a Leave: the process exit
   * tells dcpxd, as a crash would. */
  drop_member(&cl, 0);
  for (uint32_t d = 0; d < O.W; d++) {
    free(cl.lg[d]);
    free(cl.en[d]);
  }
}

/* ---- the parent ------------------------------------------------------- */

typedef struct sampler {
  hh_daemon d;
  pid_t pids[MAX_PROCS];
  uint64_t t0, next_sample, last_calls, last_t;
  double next_print;
  long rss0, base, rss_max, rss;
  int fds0, fds_max, fds, fd_bound;
  int inc_fds0;
  long inc_rss0;
} sampler;

static double secs(const sampler *s) {
  return (double)(hh_mono() - s->t0) / 1e9;
}

static int count_fds(pid_t pid) {
  char path[64];
  struct dirent *e;
  int n = 0;
  DIR *d;
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  d = opendir(path);
  if (!d)
    return -1;
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static pid_t spawn(const char *sock, uint32_t gang, uint32_t rank,
                   int replacement) {
  pid_t p = fork();
  if (p == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    client_main(sock, gang, rank, replacement);
    _exit(0);
  }
  return p;
}

static void print_header(void) {
  printf("%6s %6s %9s %5s %10s %10s %7s %7s %6s %5s %5s %8s\n", "t (s)",
         "dcpxd", "RSS KiB", "fds", "calls", "exact", "exp.f", "joins",
         "kills", "recov", "rest", "calls/s");
}

static unsigned g_kills, g_recoveries, g_restarts_term, g_restarts_kill;
static double g_rec_max_ms, g_rec_sum_ms, g_reatt_max_ms;

/* Once, at the first failure: where every client is, for how long, and
 * where the kernel has it (wchan): a rank held up somewhere (a call that
 * never came, the soak's own code, off the CPU) and one that waited look
 * alike in the failure's line alone. */
static void where_dump(const sampler *s) {
  static int done;
  const uint64_t now = hh_mono();
  if (done)
    return;
  done = 1;
  printf("# at %.1f s, the first failure: where the clients are\n", secs(s));
  for (uint32_t k = 0; k < O.gangs * O.W; k++) {
    const unsigned v = atomic_load(&S->where[k]);
    char path[64], wchan[64] = "?";
    FILE *f;
    snprintf(path, sizeof(path), "/proc/%d/wchan", (int)s->pids[k]);
    if (s->pids[k] > 0 && (f = fopen(path, "r"))) {
      if (!fgets(wchan, sizeof(wchan), f))
        snprintf(wchan, sizeof(wchan), "?");
      fclose(f);
    }
    const uint64_t since = atomic_load(&S->where_since[k]);
    printf("#   gang %u rank %u (pid %d): in %s (call %u) for %.3f s, "
           "wchan %s, instance %u, restarts seen %u\n",
           k / O.W, k % O.W, (int)s->pids[k],
           (v >> 16) < AT_N ? at_name[v >> 16] : "?", v & 0xFFFFu,
           since ? (double)(now - since) / 1e9 : 0.0, wchan,
           atomic_load(&S->gang[k / O.W].instance),
           atomic_load(&S->link_epoch[k]));
  }
  fflush(stdout);
}

/* Samples dcpxd (every 0.5 s), prints (every --report s), checks the
 * bounds and the client processes. 0, or -1 when the run has failed. */
static int tick(sampler *s) {
  uint64_t now = hh_mono();
  if (atomic_load(&S->failures))
    where_dump(s);
  if (now >= s->next_sample && s->d.pid > 0) {
    double t = secs(s);
    s->next_sample = now + 500000000ull;
    s->rss = hh_rss_kib(s->d.pid);
    s->fds = count_fds(s->d.pid);
    if (s->rss > s->rss_max)
      s->rss_max = s->rss;
    if (s->fds > s->fds_max)
      s->fds_max = s->fds;
    if (t < O.warmup) {
      if (s->rss > s->base)
        s->base = s->rss;
    } else if (s->rss - s->base > O.growth_kib) {
      fail("dcpxd's RSS is %ld KiB at %.1f s, %ld KiB over the warm-up's "
           "largest (bound %ld)",
           s->rss, t, s->rss - s->base, O.growth_kib);
    }
    if (s->fds > s->fd_bound)
      fail("dcpxd holds %d fds at %.1f s (bound %d)", s->fds, t,
           s->fd_bound);
    for (unsigned k = 0; k < O.gangs * O.W; k++) {
      int st;
      if (s->pids[k] > 0 && waitpid(s->pids[k], &st, WNOHANG) == s->pids[k]) {
        s->pids[k] = 0;
        if (!S->stop && !atomic_load(&S->failures))
          fail("client gang %u rank %u ended unasked (status 0x%x)",
               k / O.W, k % O.W, st);
      }
    }
    if (t >= s->next_print) {
      uint64_t calls = atomic_load(&S->calls);
      printf("%6.1f %6d %9ld %5d %10" PRIu64 " %10" PRIu64 " %7" PRIu64
             " %7" PRIu64 " %6u %5u %5u %8.0f\n",
             t, (int)s->d.pid, s->rss, s->fds, calls,
             (uint64_t)atomic_load(&S->exact),
             (uint64_t)atomic_load(&S->expected_fails),
             (uint64_t)atomic_load(&S->joins), g_kills, g_recoveries,
             atomic_load(&S->restarts),
             (double)(calls - s->last_calls) /
                 ((double)(now - s->last_t) / 1e9));
      fflush(stdout);
      s->last_calls = calls;
      s->last_t = now;
      while (s->next_print <= t)
        s->next_print += O.report;
    }
  }
  return atomic_load(&S->failures) ? -1 : 0;
}

/* Waits (ticking) until cond(arg) or the bound; 0, or -1. */
static int wait_for(sampler *s, int (*cond)(void *), void *arg,
                    double bound) {
  uint64_t end = hh_mono() + (uint64_t)(bound * 1e9);
  while (!cond(arg)) {
    if (tick(s) < 0 || hh_mono() > end)
      return -1;
    hh_sleep_ms(2);
  }
  return 0;
}

static int victim_ready(void *g) {
  return atomic_load(&((gang_state *)g)->victim_ready);
}
static int gang_recovered(void *g) {
  return atomic_load(&((gang_state *)g)->recovered) == O.W;
}

/* One kill -9 and replacement in gang gi; 0, or -1 (failed). */
static int do_kill(sampler *s, unsigned gi) {
  gang_state *g = &S->gang[gi];
  const uint32_t rank = (uint32_t)(random() % O.W);
  const uint32_t k = 1 + (uint32_t)(random() % (O.calls - 2));
  const unsigned slot = gi * O.W + rank;
  int st;

  atomic_store(&g->recovered, 0);
  atomic_store(&g->victim_ready, 0);
  atomic_store(&g->kill_pending, 1);
  atomic_store(&g->victim_k, k);
  atomic_store(&g->victim_rank, (int)rank);
  if (wait_for(s, victim_ready, g, O.recover_bound) < 0) {
    fail("gang %u rank %u did not reach call %u in %.0f s to be killed", gi,
         rank, k, O.recover_bound);
    return -1;
  }
  atomic_store(&g->victim_rank, -1);
  uint64_t t_kill = hh_mono();
  kill(s->pids[slot], SIGKILL);
  if (waitpid(s->pids[slot], &st, 0) != s->pids[slot] || !WIFSIGNALED(st) ||
      WTERMSIG(st) != SIGKILL) {
    fail("gang %u rank %u: not killed by SIGKILL (status 0x%x)", gi, rank,
         st);
    return -1;
  }
  g_kills++;
  s->pids[slot] = spawn(s->d.sock, gi, rank, 1);
  if (wait_for(s, gang_recovered, g, O.recover_bound) < 0) {
    if (!atomic_load(&S->failures))
      fail("gang %u: %u of %u ranks made an exact call within %.0f s of the "
           "kill -9 of rank %u (mid-call %u): the group did not recover",
           gi, atomic_load(&g->recovered), O.W, O.recover_bound, rank, k);
    return -1;
  }
  double ms = (double)(hh_mono() - t_kill) / 1e6;
  g_rec_sum_ms += ms;
  if (ms > g_rec_max_ms)
    g_rec_max_ms = ms;
  atomic_store(&g->kill_pending, 0);
  g_recoveries++;
  return 0;
}

static int gate_idle(void *unused) {
  (void)unused;
  return (atomic_load(&S->gate) & ~GATE_PENDING) == 0;
}
static int all_attached(void *unused) {
  unsigned ep = atomic_load(&S->restarts);
  (void)unused;
  for (unsigned k = 0; k < O.gangs * O.W; k++)
    if (atomic_load(&S->link_epoch[k]) != ep)
      return 0;
  return 1;
}

/* One dcpxd restart (SIGTERM and SIGKILL in turn); 0, or -1 (failed). */
static int do_restart(sampler *s, const char *const *extra) {
  const int sig = (g_restarts_term + g_restarts_kill) % 2 ? SIGKILL : SIGTERM;
  atomic_fetch_or(&S->gate, GATE_PENDING);
  if (wait_for(s, gate_idle, NULL, O.recover_bound) < 0) {
    fail("gangs still joining or leaving %.0f s after a restart was asked",
         O.recover_bound);
    return -1;
  }
  long rss = hh_rss_kib(s->d.pid);
  int fds = count_fds(s->d.pid);
  uint64_t calls0 = atomic_load(&S->calls);
  int st = hh_daemon_stop(&s->d, sig);
  if (sig == SIGTERM && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    fail("dcpxd did not exit 0 on SIGTERM (status 0x%x)", st);
    return -1;
  }
  hh_sleep_ms(200); /* away a while: the ranks keep calling */
  if (hh_daemon_start(&s->d, extra) < 0) {
    fail("dcpxd did not start again (log %s)", s->d.log);
    return -1;
  }
  uint64_t t_up = hh_mono();
  uint64_t away = atomic_load(&S->calls) - calls0;
  atomic_fetch_add(&S->restarts, 1);
  atomic_fetch_and(&S->gate, ~GATE_PENDING);
  sig == SIGTERM ? g_restarts_term++ : g_restarts_kill++;
  printf("# %.1f s: dcpxd stopped (%s; it had %ld KiB, %d fds), %" PRIu64
         " calls while it was away; new dcpxd pid %d\n",
         secs(s), sig == SIGTERM ? "SIGTERM" : "SIGKILL", rss, fds, away,
         (int)s->d.pid);
  if (wait_for(s, all_attached, NULL, O.recover_bound) < 0) {
    if (!atomic_load(&S->failures))
      fail("not every rank attached to the new dcpxd within %.0f s",
           O.recover_bound);
    return -1;
  }
  double ms = (double)(hh_mono() - t_up) / 1e6;
  if (ms > g_reatt_max_ms)
    g_reatt_max_ms = ms;
  return 0;
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: soak [OPTION]...\n"
      "G gangs of W client processes churn through a private dcpxd ($DCPXD,\n"
      "default ./daemon/dcpxd): join, C exact calls (checked against\n"
      "dcpx_ref_call), query, leave, over and over; with kill -9 of a rank\n"
      "mid-call and its replacement, and dcpxd restarts. Exit 0 when every\n"
      "completed call was exact and the bounds held, 1 on a failure, 2 on\n"
      "bad options.\n"
      "  --seconds=S         run time (600)\n"
      "  --gangs=G           groups, 1..64 (8)\n"
      "  --world=W           ranks per group, 1..16 (8); G*W <= 256\n"
      "  --calls=C           calls per join, >= 1 (8; >= 3 with kills)\n"
      "  --kill-every=S      kill -9 one rank every S s, gangs in turn\n"
      "                      (15, none in a run of 15 s or less; 0: none)\n"
      "  --restart-every=S   stop and start dcpxd every S s (60, none in a\n"
      "                      run of 60 s or less; 0: none)\n"
      "  --recover-bound=S   a killed rank's group recovers, every rank\n"
      "                      reattaches, within S s (30)\n"
      "  --wait-timeout-ms=T the groups' bounded-wait timeout (10000)\n"
      "  --rss-growth-kib=K  dcpxd's RSS may exceed the warm-up's largest\n"
      "                      by K KiB (2048)\n"
      "  --warmup=S          warm-up (a tenth of the run, at least 2 s and\n"
      "                      less than the run)\n"
      "  --report=S          print a line every S s (10)\n"
      "  --help\n");
}

/* Strict numbers: the whole argument, in [lo, hi]. */
static int opt_num(const char *name, const char *arg, double lo, double hi,
                   double *ret) {
  char *end;
  errno = 0;
  double v = strtod(arg, &end);
  if (errno || end == arg || *end || v != v || v < lo || v > hi) {
    fprintf(stderr, "soak: --%s: expected a number in %g..%g, got '%s'\n",
            name, lo, hi, arg);
    return -1;
  }
  *ret = v;
  return 0;
}

static int opt_uint(const char *name, const char *arg, unsigned lo,
                    unsigned hi, unsigned *ret) {
  double v;
  if (opt_num(name, arg, lo, hi, &v) < 0)
    return -1;
  if (v != (double)(unsigned)v) {
    fprintf(stderr, "soak: --%s: expected a whole number, got '%s'\n", name,
            arg);
    return -1;
  }
  *ret = (unsigned)v;
  return 0;
}

static int parse(int argc, char **argv) {
  static const struct option opts[] = {
      {"seconds", required_argument, NULL, 's'},
      {"gangs", required_argument, NULL, 'g'},
      {"world", required_argument, NULL, 'w'},
      {"calls", required_argument, NULL, 'c'},
      {"kill-every", required_argument, NULL, 'k'},
      {"restart-every", required_argument, NULL, 'R'},
      {"recover-bound", required_argument, NULL, 'b'},
      {"wait-timeout-ms", required_argument, NULL, 't'},
      {"rss-growth-kib", required_argument, NULL, 'r'},
      {"warmup", required_argument, NULL, 'u'},
      {"report", required_argument, NULL, 'p'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  double v;
  int opt, r = 0;

  /* kill_every and restart_every -1: not given (15 and 60, or none where
   * the run is shorter) */
  O = (soak_opts){.seconds = 600, .warmup = -1, .report = 10,
                  .kill_every = -1, .restart_every = -1, .recover_bound = 30,
                  .gangs = 8, .W = 8, .calls = 8, .wait_timeout_ms = 10000,
                  .growth_kib = 2048};
  while (r == 0 && (opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (opt) {
    case 's': r = opt_num("seconds", optarg, 1, 86400, &O.seconds); break;
    case 'g': r = opt_uint("gangs", optarg, 1, MAX_GANGS, &O.gangs); break;
    case 'w': r = opt_uint("world", optarg, 1, DCPX_MAX_WORLD, &O.W); break;
    case 'c': r = opt_uint("calls", optarg, 1, 1000000, &O.calls); break;
    case 'k': r = opt_num("kill-every", optarg, 0, 86400, &O.kill_every); break;
    case 'R':
      r = opt_num("restart-every", optarg, 0, 86400, &O.restart_every);
      break;
    case 'b':
      r = opt_num("recover-bound", optarg, 1, 3600, &O.recover_bound);
      break;
    case 't':
      r = opt_uint("wait-timeout-ms", optarg, 1, 600000, &O.wait_timeout_ms);
      break;
    case 'r':
      r = opt_num("rss-growth-kib", optarg, 0, 1e9, &v);
      O.growth_kib = (long)v;
      break;
    case 'u': r = opt_num("warmup", optarg, 0, 86400, &O.warmup); break;
    case 'p': r = opt_num("report", optarg, 0.5, 86400, &O.report); break;
    case 'h': usage(stdout); exit(0);
    default: r = -1; break;
    }
  }
  if (r == 0 && optind < argc) {
    fprintf(stderr, "soak: unexpected argument '%s'\n", argv[optind]);
    r = -1;
  }
  if (r == 0 && O.gangs * O.W > MAX_PROCS) {
    fprintf(stderr, "soak: %u gangs x %u ranks is over %d processes\n",
            O.gangs, O.W, MAX_PROCS);
    r = -1;
  }
  if (O.kill_every < 0)
    O.kill_every = O.seconds > 15 ? 15 : 0;
  if (O.restart_every < 0)
    O.restart_every = O.seconds > 60 ? 60 : 0;
  if (r == 0 && O.kill_every > 0 && (O.calls < 3 || O.W < 2)) {
    fprintf(stderr, "soak: kills need --calls >= 3 and --world >= 2 (a "
                    "victim stops mid-call k <= C-2, its peers in k+1); "
                    "or --kill-every=0\n");
    r = -1;
  }
  if (r < 0) {
    fprintf(stderr, "Try 'soak --help'.\n");
    return -1;
  }
  if (O.warmup < 0) /* a tenth, at least 2 s, less than the run */
    O.warmup = O.seconds / 10 > 2 ? O.seconds / 10
               : O.seconds > 2    ? 2
                                  : O.seconds / 2;
  /* checks that could not run would pass: "soak: ok" of nothing */
  if (O.warmup >= O.seconds) {
    fprintf(stderr, "soak: --warmup=%g must be shorter than --seconds=%g "
                    "(dcpxd's growth is measured after it)\n",
            O.warmup, O.seconds);
    r = -1;
  }
  if ((O.kill_every > 0 && O.kill_every >= O.seconds) ||
      (O.restart_every > 0 && O.restart_every >= O.seconds)) {
    fprintf(stderr, "soak: --kill-every and --restart-every must be shorter "
                    "than --seconds=%g (or 0: none)\n", O.seconds);
    r = -1;
  }
  if (r < 0) {
    fprintf(stderr, "Try 'soak --help'.\n");
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  static sampler s;
  const char *extra[] = {"--log-level=warning", "--max-conns-per-uid=4096",
                         "--max-groups-per-uid=4096", NULL};
  int rc = 0;

  if (parse(argc, argv) < 0)
    return 2;
  S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (S == MAP_FAILED)
    return 1;
  memset((void *)S, 0, sizeof(*S));
  for (unsigned g = 0; g < O.gangs; g++)
    atomic_store(&S->gang[g].victim_rank, -1);
  srandom((unsigned)getpid());
  hh_owner = getpid();
  if (QUARANTINE_MB) {
    char o[512];
    const char *old = getenv("ASAN_OPTIONS");
    snprintf(o, sizeof(o), "%s%squarantine_size_mb=%d", old ? old : "",
             old && *old ? ":" : "", QUARANTINE_MB);
    setenv("ASAN_OPTIONS", o, 1); /* for dcpxd */
    O.growth_kib += QUARANTINE_MB * 1024;
  }
  if (hh_daemon_start(&s.d, extra) < 0) {
    fprintf(stderr, "soak: dcpxd did not start (see %s)\n", s.d.log);
    hh_daemon_cleanup(&s.d);
    return 1;
  }
  s.fds0 = count_fds(s.d.pid);
  s.rss0 = s.base = s.rss_max = s.rss = hh_rss_kib(s.d.pid);
  s.fds_max = s.fds = s.fds0;
  /* What G groups may hold: per rank its member connection, pidfd and an
   * ops connection, per group a control page and W workspaces, twice over
   * while one instance goes and the next forms; and a little slack. */
  s.fd_bound = s.fds0 + (int)(O.gangs * (3 * O.W + 2 * (O.W + 1))) + 16;
  char kills[48] = "no kill -9", restarts[48] = "no dcpxd restart";
  if (O.kill_every > 0)
    snprintf(kills, sizeof(kills), "kill -9 every %g s", O.kill_every);
  if (O.restart_every > 0)
    snprintf(restarts, sizeof(restarts), "dcpxd restart every %g s",
             O.restart_every);
  printf("soak: %u gangs x %u ranks, %u calls per join, %g s (warm-up "
         "%g s); %s, %s, recovery bound %g s; wait timeout %u ms; dcpxd pid "
         "%d (%ld KiB, %d fds; fd bound %d)\n",
         O.gangs, O.W, O.calls, O.seconds, O.warmup, kills, restarts,
         O.recover_bound, O.wait_timeout_ms, (int)s.d.pid, s.rss0, s.fds0,
         s.fd_bound);
  print_header();
  s.t0 = s.last_t = hh_mono();
  for (unsigned g = 0; g < O.gangs; g++)
    for (unsigned r = 0; r < O.W; r++)
      s.pids[g * O.W + r] = spawn(s.d.sock, g, r, 0);

  double next_kill = O.kill_every > 0 ? O.kill_every : -1;
  double next_restart = O.restart_every > 0 ? O.restart_every : -1;
  unsigned kill_gang = 0;
  for (;;) {
    double t = secs(&s);
    if (tick(&s) < 0 || t >= O.seconds)
      break;
    if (next_kill > 0 && t >= next_kill) {
      if (do_kill(&s, kill_gang++ % O.gangs) < 0)
        break;
      next_kill += O.kill_every;
    } else if (next_restart > 0 && t >= next_restart) {
      if (do_restart(&s, extra) < 0)
        break;
      next_restart += O.restart_every;
    }
    hh_sleep_ms(10);
  }

  /* Every gang finishes its instance and leaves at its next barrier; a
   * process still running after the grace time is killed (and the run
   * fails unless it failed already: a client that cannot finish is a
   * finding). */
  if (atomic_load(&S->failures)) /* a failure the loop saw (tick, a kill
                                    or a restart): where_dump is once */
    where_dump(&s);
  S->stop = 1;
  unsigned n = O.gangs * O.W, left = n, killed = 0;
  for (int i = 0; i < (int)(O.recover_bound * 100) && left; i++) {
    left = 0;
    for (unsigned k = 0; k < n; k++)
      if (s.pids[k] > 0 && waitpid(s.pids[k], NULL, WNOHANG) == s.pids[k])
        s.pids[k] = 0;
      else if (s.pids[k] > 0)
        left++;
    if (left)
      hh_sleep_ms(10);
  }
  for (unsigned k = 0; k < n; k++)
    if (s.pids[k] > 0) {
      kill(s.pids[k], SIGKILL);
      waitpid(s.pids[k], NULL, 0);
      killed++;
    }
  double elapsed = secs(&s);
  if (killed && !atomic_load(&S->failures))
    fail("%u clients did not finish within %.0f s of the end", killed,
         O.recover_bound);
  hh_sleep_ms(300); /* the daemon reaps the last connections */
  s.rss = hh_rss_kib(s.d.pid);
  int fds1 = count_fds(s.d.pid);
  uint64_t calls = atomic_load(&S->calls);

  printf("calls: %" PRIu64 " completed in %.1f s = %.0f/s, %" PRIu64
         " exact; %" PRIu64 " failed as expected (peers of killed ranks)\n",
         calls, elapsed, (double)calls / elapsed,
         (uint64_t)atomic_load(&S->exact),
         (uint64_t)atomic_load(&S->expected_fails));
  printf("churn: %" PRIu64 " joins, %" PRIu64 " leaves, %" PRIu64
         " queries; %u kill -9 + replacement, %u group recoveries (%" PRIu64
         " rank recoveries), kill to all ranks exact again: mean %.0f ms, "
         "max %.0f ms\n",
         (uint64_t)atomic_load(&S->joins), (uint64_t)atomic_load(&S->leaves),
         (uint64_t)atomic_load(&S->queries), g_kills, g_recoveries,
         (uint64_t)atomic_load(&S->rank_recoveries),
         g_recoveries ? g_rec_sum_ms / g_recoveries : 0.0, g_rec_max_ms);
  printf("restarts: %u (%u SIGTERM, %u SIGKILL), %" PRIu64
         " reattaches, new dcpxd up to every rank attached: max %.0f ms\n",
         atomic_load(&S->restarts), g_restarts_term, g_restarts_kill,
         (uint64_t)atomic_load(&S->reattaches), g_reatt_max_ms);
  printf("dcpxd RSS: %ld KiB at start, %ld after the warm-up, %ld at the "
         "end, %ld at most (bound: every sample after the warm-up <= "
         "warm-up + %ld)\n",
         s.rss0, s.base, s.rss, s.rss_max, O.growth_kib);
  printf("dcpxd fds: %d at start, %d at the end, %d at most (bound %d)\n",
         s.fds0, fds1, s.fds_max, s.fd_bound);
  if (!atomic_load(&S->failures)) {
    if (s.rss - s.base > O.growth_kib)
      fail("dcpxd's RSS grew by %ld KiB after the warm-up (bound %ld)",
           s.rss - s.base, O.growth_kib);
    else if (fds1 > s.fds0)
      fail("dcpxd holds %d fds with every client gone, %d more than a "
           "fresh one",
           fds1, fds1 - s.fds0);
    else if (atomic_load(&S->joins) == 0 || calls == 0)
      fail("no join or call completed");
    else if (O.kill_every > 0 && O.kill_every < O.seconds && !g_recoveries)
      fail("no kill -9 and recovery happened (--kill-every=%g)",
           O.kill_every);
    else if (O.restart_every > 0 && O.restart_every < O.seconds &&
             !atomic_load(&S->restarts))
      fail("no dcpxd restart happened (--restart-every=%g)",
           O.restart_every);
    else if (atomic_load(&S->exact) != calls)
      fail("%" PRIu64 " calls completed, %" PRIu64 " exact", calls,
           (uint64_t)atomic_load(&S->exact));
  }
  if (atomic_load(&S->failures)) {
    printf("FAIL: %u failure(s); first: %s\n", atomic_load(&S->failures),
           S->first_error);
    rc = 1;
  }
  int st = hh_daemon_stop(&s.d, SIGTERM);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("FAIL: dcpxd did not exit cleanly (status 0x%x; log %s)\n", st,
           s.d.log);
    rc = 1;
  }
  if (rc)
    printf("dcpxd log: %s (kept)\n", s.d.log);
  else
    hh_daemon_cleanup(&s.d);
  printf("%s\n", rc ? "soak: FAIL" : "soak: ok");
  return rc;
}
