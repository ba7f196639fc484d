/* soak.c - many clients churning through a private dcpxd for a while:
 * the daemon must serve every operation, and neither its memory nor its
 * descriptors may grow (issue 12, "Soak").
 *
 *   bench/soak [--seconds=S] [--gangs=G] [--world=W] [--calls=C]
 *              [--rss-growth-kib=K] [--warmup=S]
 *
 * G gangs of W client processes each (default 4 x 2). Every process loops
 * until the time is up: connect (Hello), join its gang's group (W ranks;
 * the name cycles through 8 per gang, so groups are made and destroyed
 * all the time), run C exact calls (push + merge on the host backend, each
 * checked against dcpx_ref_call), ask the daemon for its groups on an ops
 * connection (Hello + Query, as dcpxctl does), wait for its gang, leave,
 * disconnect. Every one of those is an operation.
 *
 * The parent samples the daemon's RSS and open descriptors every 0.5 s.
 * After the warm-up (default 2 s, or a tenth of the run if longer), the
 * baseline is the largest RSS seen so far; the run fails (exit 1) if any
 * operation failed or was not exact, if the RSS at the end exceeds the
 * baseline by more than K KiB (default 2048), or if the daemon holds more
 * descriptors at the end (every client gone) than at the start. It
 * prints ops/s, and RSS and fds over time. Runs dcpxd from $DCPXD (default
 * ./daemon/dcpxd). make check runs it for 15 s (tests/soak.sh);
 * bench/RESULTS.md has a 60 s run.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdatomic.h>

#include "health_harness.h"

#define NAMES_PER_GANG 8

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

typedef struct gang_state {
  atomic_uint arrived; /* barrier: processes that reached it */
  atomic_uint round;
} gang_state;

typedef struct soak_shared {
  atomic_uint_fast64_t ops, calls, joins, queries;
  atomic_uint failures;
  char first_error[256];
  atomic_flag error_set;
  volatile int stop;
  gang_state gang[64];
} soak_shared;

static soak_shared *S;

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

/* Every process of the gang arrives, or the run stops. */
static int gang_wait(gang_state *g, uint32_t W) {
  unsigned round = atomic_load(&g->round);
  if (atomic_fetch_add(&g->arrived, 1) + 1 == W) {
    atomic_store(&g->arrived, 0);
    atomic_fetch_add(&g->round, 1);
    return 0;
  }
  while (atomic_load(&g->round) == round) {
    if (S->stop)
      return -1;
    usleep(200);
  }
  return 0;
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

/* One exact call c of the W-rank group, as rank `rank`. */
static int one_call(dcpx_member *m, const hh_spec *sp, uint32_t rank,
                    uint64_t c, uint16_t **lg, int32_t **en) {
  const uint32_t K = sp->K, R = sp->R, bt_cols = (sp->L + 3) / 4;
  int32_t req[8], bt[8 * 64], ro[8 * 64], xo[8 * 64], io[8 * 64], xi[8 * 64];
  int32_t vo[8], xv[8];
  uint32_t so[8], xs[8];
  dcpx_shape shape;
  int r, rm;

  hh_shape(sp, &shape);
  for (uint32_t t = 0; t < R; t++) {
    req[t] = (int32_t)t;
    for (uint32_t b = 0; b < bt_cols; b++)
      bt[t * bt_cols + b] = (int32_t)(rank * 100000 + t * bt_cols + b);
  }
  hh_inputs(sp, c, lg, en);
  dcpx_call in = DCPX_CALL_INIT;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT, ref = DCPX_MERGE_OUT_INIT;
  dcpx_ref_in rin = DCPX_REF_IN_INIT;
  in.rows = R;
  in.logits = lg[rank];
  in.stride = sp->L;
  in.row_ends = en[rank];
  in.req_id = req;
  in.block_table = bt;
  in.bt_rows = R;
  in.bt_cols = bt_cols;
  in.call_tag = c;
  out.rows_out = ro;
  out.valid_out = vo;
  out.ids_out = io;
  out.sat_word = so;
  r = dcpx_push(m, &in, NULL);
  rm = dcpx_merge(m, &in, &out, NULL);
  if (r == 0)
    r = rm;
  if (r < 0)
    return r;
  rin.rows = R;
  rin.rank = rank;
  rin.stride = sp->L;
  rin.logits = (const uint16_t *const *)lg;
  rin.row_ends = (const int32_t *const *)en;
  rin.req_id = req;
  rin.block_table = bt;
  rin.bt_rows = R;
  rin.bt_cols = bt_cols;
  ref.rows_out = xo;
  ref.valid_out = xv;
  ref.ids_out = xi;
  ref.sat_word = xs;
  r = dcpx_ref_call(&shape, &rin, &ref, NULL);
  if (r < 0 || memcmp(ro, xo, (size_t)R * K * 4) ||
      memcmp(io, xi, (size_t)R * K * 4) || memcmp(vo, xv, R * 4) ||
      memcmp(so, xs, R * 4))
    return DCPX_E_FAILED; /* not exact */
  return 0;
}

static void client_main(const char *sock, uint32_t gang, uint32_t rank,
                        uint32_t W, uint32_t calls) {
  hh_spec sp = {.W = W, .R = 2, .K = 16, .N = 8, .L = 64,
                .timeout_ns = 5000000000ull};
  uint16_t *lg[DCPX_MAX_WORLD];
  int32_t *en[DCPX_MAX_WORLD];
  gang_state *g = &S->gang[gang];
  dcpx_shape shape;

  for (uint32_t d = 0; d < W; d++) {
    lg[d] = calloc((size_t)sp.R * sp.L, 2);
    en[d] = calloc(sp.R, 4);
  }
  hh_shape(&sp, &shape);
  for (uint64_t it = 0; !S->stop; it++) {
    dcpx_join_opts jo = DCPX_JOIN_OPTS_INIT;
    char name[32];
    dcpx_client *c = NULL;
    dcpx_member *m = NULL;
    int r;

    snprintf(name, sizeof(name), "soak-%u-%" PRIu64, gang,
             it % NAMES_PER_GANG);
    jo.group = name;
    jo.rank = rank;
    jo.timeout_ns = sp.timeout_ns;
    jo.join_timeout_ms = 20000;
    r = dcpx_connect(sock, &c);
    if (r < 0) {
      fail("gang %u rank %u: connect: %s", gang, rank, dcpx_strerror(r));
      break;
    }
    atomic_fetch_add(&S->ops, 1);
    r = dcpx_join(c, &shape, &jo, &m);
    if (r < 0) {
      if (!S->stop) /* a peer may have stopped at the deadline */
        fail("gang %u rank %u: join %s: %s (%s)", gang, rank, name,
             dcpx_strerror(r), dcpx_client_last_error(c));
      dcpx_disconnect(c);
      break;
    }
    atomic_fetch_add(&S->ops, 1);
    atomic_fetch_add(&S->joins, 1);
    for (uint32_t k = 0; k < calls; k++) {
      r = one_call(m, &sp, rank, it * calls + k + 1, lg, en);
      if (r < 0) {
        fail("gang %u rank %u: %s call %u: %s", gang, rank, name, k,
             r == DCPX_E_FAILED ? "not exact" : dcpx_strerror(r));
        break;
      }
      atomic_fetch_add(&S->ops, 1);
      atomic_fetch_add(&S->calls, 1);
    }
    r = ops_query(sock);
    if (r < 0)
      fail("gang %u rank %u: query: %s", gang, rank, dcpx_strerror(r));
    atomic_fetch_add(&S->ops, 1);
    atomic_fetch_add(&S->queries, 1);
    /* Nobody leaves (which aborts the group) while a peer still calls. */
    int stopped = gang_wait(g, W);
    r = dcpx_leave(m);
    if (r < 0 && !stopped)
      fail("gang %u rank %u: leave: %s", gang, rank, dcpx_strerror(r));
    atomic_fetch_add(&S->ops, 1);
    dcpx_disconnect(c);
    if (stopped || atomic_load(&S->failures))
      break;
  }
  for (uint32_t d = 0; d < W; d++) {
    free(lg[d]);
    free(en[d]);
  }
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

static void usage(void) {
  fprintf(stderr,
          "usage: soak [--seconds=S] [--gangs=G] [--world=W] [--calls=C]\n"
          "            [--rss-growth-kib=K] [--warmup=S]\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"seconds", required_argument, NULL, 's'},
      {"gangs", required_argument, NULL, 'g'},
      {"world", required_argument, NULL, 'w'},
      {"calls", required_argument, NULL, 'c'},
      {"rss-growth-kib", required_argument, NULL, 'r'},
      {"warmup", required_argument, NULL, 'u'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  double seconds = 60, warmup = -1;
  unsigned gangs = 4, W = 2, calls = 4;
  long growth_kib = 2048;
  const char *extra[] = {"--log-level=warning", "--max-conns-per-uid=4096",
                         "--max-groups-per-uid=4096", NULL};
  hh_daemon d;
  pid_t pids[256];
  unsigned n = 0;
  int opt, rc = 0;

  while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (opt) {
    case 's': seconds = atof(optarg); break;
    case 'g': gangs = (unsigned)atoi(optarg); break;
    case 'w': W = (unsigned)atoi(optarg); break;
    case 'c': calls = (unsigned)atoi(optarg); break;
    case 'r': growth_kib = atol(optarg); break;
    case 'u': warmup = atof(optarg); break;
    case 'h': usage(); return 0;
    default: usage(); return 2;
    }
  }
  if (seconds <= 0 || gangs < 1 || gangs > 64 || W < 1 || W > 4 ||
      gangs * W > 256 || growth_kib < 0) {
    usage();
    return 2;
  }
  if (warmup < 0)
    warmup = seconds / 10 > 2 ? seconds / 10 : 2;

  S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (S == MAP_FAILED)
    return 1;
  memset((void *)S, 0, sizeof(*S));
  memset(&d, 0, sizeof(d));
  hh_owner = getpid();
  if (QUARANTINE_MB) {
    char o[512];
    const char *old = getenv("ASAN_OPTIONS");
    snprintf(o, sizeof(o), "%s%squarantine_size_mb=%d", old ? old : "",
             old && *old ? ":" : "", QUARANTINE_MB);
    setenv("ASAN_OPTIONS", o, 1); /* for dcpxd */
    growth_kib += QUARANTINE_MB * 1024;
  }
  if (hh_daemon_start(&d, extra) < 0) {
    fprintf(stderr, "soak: dcpxd did not start (see %s)\n", d.log);
    hh_daemon_cleanup(&d);
    return 1;
  }
  int fds0 = count_fds(d.pid);
  long rss0 = hh_rss_kib(d.pid);
  printf("soak: %u gangs x %u ranks, %u calls per join, %.0f s (warm-up "
         "%.0f s), dcpxd pid %d\n",
         gangs, W, calls, seconds, warmup, (int)d.pid);
  printf("%7s %12s %9s %9s %5s\n", "t (s)", "ops", "ops/s", "RSS KiB", "fds");
  uint64_t t0 = hh_mono();
  for (unsigned g = 0; g < gangs; g++)
    for (unsigned r = 0; r < W; r++) {
      pid_t p = fork();
      if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        client_main(d.sock, g, r, W, calls);
        _exit(0);
      }
      pids[n++] = p;
    }

  long base = -1, rss_max = rss0, rss = rss0;
  uint64_t last_ops = 0, last_t = t0;
  double next_print = 0;
  for (;;) {
    usleep(500000);
    double t = (double)(hh_mono() - t0) / 1e9;
    rss = hh_rss_kib(d.pid);
    if (rss > rss_max)
      rss_max = rss;
    if (t < warmup || base < 0)
      base = rss > base ? rss : base;
    if (t >= next_print || t >= seconds) {
      uint64_t ops = atomic_load(&S->ops), now = hh_mono();
      printf("%7.1f %12" PRIu64 " %9.0f %9ld %5d\n", t, ops,
             (double)(ops - last_ops) / ((double)(now - last_t) / 1e9), rss,
             count_fds(d.pid));
      fflush(stdout);
      last_ops = ops;
      last_t = now;
      next_print += seconds > 20 ? 5 : 1;
    }
    if (t >= seconds || atomic_load(&S->failures))
      break;
  }
  /* A rank that saw the stop flag before its peer may wait in a join for
   * it: after a grace time, such stragglers are killed (the daemon sees a
   * dead client, which it must handle as well). */
  S->stop = 1;
  unsigned left = n, killed = 0;
  for (int i = 0; i < 300 && left; i++) {
    for (unsigned k = 0; k < n; k++)
      if (pids[k] > 0 && waitpid(pids[k], NULL, WNOHANG) == pids[k])
        pids[k] = 0, left--;
    if (left)
      usleep(10000);
  }
  for (unsigned k = 0; k < n; k++)
    if (pids[k] > 0) {
      kill(pids[k], SIGKILL);
      waitpid(pids[k], NULL, 0);
      killed++;
    }
  double elapsed = (double)(hh_mono() - t0) / 1e9;
  if (killed)
    printf("(%u clients still in a join at the end, killed)\n", killed);
  usleep(300000); /* the daemon reaps the last connections */
  rss = hh_rss_kib(d.pid);
  int fds1 = count_fds(d.pid);
  uint64_t ops = atomic_load(&S->ops);

  printf("ops: %" PRIu64 " in %.1f s = %.0f ops/s (%" PRIu64 " joins, %" PRIu64
         " exact calls, %" PRIu64 " queries)\n",
         ops, elapsed, (double)ops / elapsed, (uint64_t)atomic_load(&S->joins),
         (uint64_t)atomic_load(&S->calls), (uint64_t)atomic_load(&S->queries));
  printf("dcpxd RSS: %ld KiB at start, %ld after the warm-up, %ld at the "
         "end, %ld at most (bound: end <= warm-up + %ld)\n",
         rss0, base, rss, rss_max, growth_kib);
  printf("dcpxd fds: %d at start, %d at the end\n", fds0, fds1);
  if (atomic_load(&S->failures)) {
    printf("FAIL: %u operations failed; first: %s\n",
           atomic_load(&S->failures), S->first_error);
    rc = 1;
  }
  if (rss - base > growth_kib) {
    printf("FAIL: dcpxd's RSS grew by %ld KiB after the warm-up (bound %ld)\n",
           rss - base, growth_kib);
    rc = 1;
  }
  if (fds1 > fds0) {
    printf("FAIL: dcpxd holds %d descriptors more than at start\n",
           fds1 - fds0);
    rc = 1;
  }
  if (atomic_load(&S->joins) == 0) {
    printf("FAIL: no join completed\n");
    rc = 1;
  }
  int st = hh_daemon_stop(&d, SIGTERM);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("FAIL: dcpxd did not exit cleanly (status 0x%x; log %s)\n", st,
           d.log);
    rc = 1;
  }
  if (rc)
    printf("dcpxd log: %s (kept)\n", d.log);
  else
    hh_daemon_cleanup(&d);
  printf("%s\n", rc ? "soak: FAIL" : "soak: ok");
  return rc;
}
