/* bench_health.c - how fast the health plane reacts, measured end to end
 * on a private dcpxd ($DCPXD, default ./daemon/dcpxd) with rank processes
 * of tests/health_harness.h (host backend, small shape, calls checked
 * against the CPU reference).
 *
 *   detection    A rank comes late and stalls (fault hook, at most the
 *                timeout) before its rescue, which its peer awaits; the
 *                peer gives up and writes its wait record (time_ns). The
 *                figures: record time -> the peer sees the group's abort
 *                word set (dcpxd noticed the alarm and aborted), and record
 *                time -> the ABORT event arrives on the peer's socket.
 *                Bounded below by nothing and above by dcpxd's poll period.
 *   kill         kill -9 of a rank between its push and its merge while its
 *                peers wait for it (10 s timeout, so only dcpxd can end the
 *                wait): kill -> the last peer's call returns; then the
 *                recovery with a replacement process: the first
 *                dcpx_recover -> the last rank resumed (the replacement's
 *                fork and join included).
 *   reset        dcpxd aborts a running group (Command RESET, what dcpxctl
 *                reset sends); every rank's call fails and it recovers: the
 *                first dcpx_recover -> the last rank resumed (all alive).
 *   join         dcpx_join of a one-rank group, then its leave, --reps
 *                times from this process: the join's time is dcpxd's
 *                formation (buffers, the groups file saved) and the
 *                socket's round trip; bench/join-disk-load.sh runs it
 *                with and without a disk load beside it. Not in "all".
 *
 * Medians (and p90, max) over --reps repetitions. Times are CLOCK_REALTIME
 * where they cross processes through a record (detection), else
 * CLOCK_MONOTONIC.
 *
 *   bench_health [--world W] [--reps N] [--timeout-ms T] [--poll-ms P]
 *                [--what detection|kill|reset|join|all]
 */
#define _GNU_SOURCE
#include <getopt.h>

#include "bench_args.h"
#include "health_harness.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* "median p90 max" in ms of n samples (sorted in place). */
static void report(const char *what, uint64_t *v, int n) {
  if (n == 0) {
    printf("| %s | - | - | - | 0 |\n", what);
    return;
  }
  qsort(v, (size_t)n, sizeof(*v), cmp_u64);
  printf("| %s | %.3f | %.3f | %.3f | %d |\n", what, v[n / 2] / 1e6,
         v[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1] / 1e6, v[n - 1] / 1e6, n);
  fflush(stdout);
}

static hh_daemon g_d;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_health: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  hh_daemon_cleanup(&g_d);
  exit(1);
}

static void wait_nfails(const hh_shared *sh, uint32_t mask, uint32_t n) {
  uint64_t end = hh_mono() + 30000000000ull;
  for (;;) {
    int all = 1;
    for (uint32_t r = 0; r < DCPX_MAX_WORLD; r++)
      if ((mask >> r) & 1u)
        all = all && sh->r[r].nfails >= n;
    if (all)
      return;
    if (hh_mono() > end)
      die("ranks 0x%x did not fail %u times: %s", mask, n,
          hh_rank_errors(sh, DCPX_MAX_WORLD));
    usleep(200);
  }
}

static void stop_all(hh_shared *sh, pid_t *pids, uint32_t W) {
  if (hh_stop_ranks(sh, pids, W))
    die("a rank failed: %s", hh_rank_errors(sh, W));
}

/* ---- detection -------------------------------------------------------- */

static void bench_detection(int reps, uint64_t timeout_ns) {
  hh_spec sp = hh_spec_small("detect", 2, timeout_ns);
  hh_shared *sh = hh_shared_new();
  uint64_t *to_abort = calloc((size_t)reps, 8), *to_event = calloc((size_t)reps, 8);
  pid_t pids[2];
  int n = 0;

  sh->recover = 1;
  sh->measure = 1;
  if (hh_ranks_run(g_d.sock, &sp, sh, pids, 2, 5, 20000))
    die("ranks did not start: %s", hh_rank_errors(sh, 2));
  for (int k = 0; k < reps; k++) {
    uint64_t G = hh_gate(sh, 2, hh_max_progress(sh, 2) + 3);
    if (G == UINT64_MAX)
      die("gate");
    /* A stall rank 0 feels (hh_pick_call); the group last (re)started at
     * the previous rep's resume_at. */
    hh_expect x;
    uint64_t F =
        hh_pick_call(&sp, 1000000ull * (uint64_t)k, G, 1, "rescue", &x);
    if (F == UINT64_MAX)
      die("no call in which rank 0 waits for rank 1's rescue");
    sh->resume_at = 1000000ull * (uint64_t)(k + 1);
    int r = hh_command(g_d.sock, DCPX__COMMAND__KIND__FAULT_STALL, "detect", 1,
                       x.call_seq, 5 * timeout_ns);
    if (r < 0)
      die("fault stall: %s", dcpx_strerror(r));
    sh->late_rank = 1;
    sh->late_call = F;
    sh->late_ms = (uint32_t)(timeout_ns / 3000000u);
    sh->gate_open = 1;
    wait_nfails(sh, 0x3, (uint32_t)k + 1);
    if (hh_wait_progress(sh, 2, sh->resume_at + 3, 20000))
      die("no resume: %s", hh_rank_errors(sh, 2));
    const hh_fail *f = &sh->r[0].fails[k];
    if (f->rc != DCPX_E_FAILED || !f->rec_time_ns)
      continue; /* rank 0 did not time out itself */
    to_abort[n] = f->abort_seen_ns - f->rec_time_ns;
    to_event[n] = f->event_ns ? f->event_ns - f->rec_time_ns : 0;
    n++;
  }
  stop_all(sh, pids, 2);
  report("detection: record -> abort word seen by the waiter", to_abort, n);
  report("detection: record -> ABORT event at the waiter", to_event, n);
}

/* ---- kill -9 and recovery with a replacement --------------------------- */

static void bench_kill(int reps, uint32_t W) {
  hh_spec sp = hh_spec_small("kill", W, 10000000000ull);
  hh_shared *sh = hh_shared_new();
  const uint32_t victim = W - 1, peers = (1u << victim) - 1;
  uint64_t *prop = calloc((size_t)reps, 8), *rec = calloc((size_t)reps, 8);
  pid_t pids[DCPX_MAX_WORLD];

  sh->recover = 1;
  if (hh_ranks_run(g_d.sock, &sp, sh, pids, W, 5, 60000))
    die("ranks did not start: %s", hh_rank_errors(sh, W));
  for (int k = 0; k < reps; k++) {
    uint64_t G = hh_gate(sh, W, hh_max_progress(sh, W) + 3);
    if (G == UINT64_MAX)
      die("gate");
    sh->victim_ready = 0;
    sh->victim_rank = (int32_t)victim;
    sh->victim_call = G + 2;
    sh->resume_at = 1000000ull * (uint64_t)(k + 1);
    sh->gate_open = 1;
    while (!sh->victim_ready)
      usleep(200);
    usleep(50000); /* the peers are in their waits for the victim */
    uint64_t t_kill = hh_mono();
    kill(pids[victim], SIGKILL);
    waitpid(pids[victim], NULL, 0);
    sh->victim_call = UINT64_MAX;
    /* The replacement comes once the peers failed: dcpxd has retired the
     * dead rank by then (earlier, its Join could find the rank still held). */
    wait_nfails(sh, peers, (uint32_t)k + 1);
    pids[victim] = hh_rank_fork(g_d.sock, &sp, sh, victim, 0, 1);
    uint64_t last = 0, r0 = UINT64_MAX, r1 = 0;
    for (uint32_t r = 0; r < victim; r++) {
      const hh_fail *f = &sh->r[r].fails[k];
      if (f->rc != DCPX_E_ABORTED)
        die("rank %u: %s", r, dcpx_strerror(f->rc));
      if (f->t_fail_ns - t_kill > last)
        last = f->t_fail_ns - t_kill;
    }
    if (hh_wait_progress(sh, W, sh->resume_at + 3, 60000))
      die("no resume: %s", hh_rank_errors(sh, W));
    for (uint32_t r = 0; r < W; r++) {
      uint64_t a = r == victim ? sh->r[r].t_rep_rec_start_ns
                               : sh->r[r].fails[k].t_rec_start_ns;
      uint64_t b = r == victim ? sh->r[r].t_rep_rec_end_ns
                               : sh->r[r].fails[k].t_rec_end_ns;
      r0 = a < r0 ? a : r0;
      r1 = b > r1 ? b : r1;
    }
    prop[k] = last;
    rec[k] = r1 - r0;
  }
  stop_all(sh, pids, W);
  char what[128];
  snprintf(what, sizeof(what), "abort propagation, W=%u: kill -9 -> last peer's call returns", W);
  report(what, prop, reps);
  snprintf(what, sizeof(what), "recovery with a replacement, W=%u: first dcpx_recover -> all resumed", W);
  report(what, rec, reps);
}

/* ---- reset: recovery of a group whose ranks all live ------------------- */

static void bench_reset(int reps, uint32_t W) {
  hh_spec sp = hh_spec_small("reset", W, 10000000000ull);
  hh_shared *sh = hh_shared_new();
  uint64_t *rec = calloc((size_t)reps, 8), *fail = calloc((size_t)reps, 8);
  pid_t pids[DCPX_MAX_WORLD];
  const uint32_t all = (1u << W) - 1;

  sh->recover = 1;
  if (hh_ranks_run(g_d.sock, &sp, sh, pids, W, 5, 60000))
    die("ranks did not start: %s", hh_rank_errors(sh, W));
  for (int k = 0; k < reps; k++) {
    sh->resume_at = 1000000ull * (uint64_t)(k + 1);
    usleep(20000);
    uint64_t t0 = hh_mono();
    int r = hh_command(g_d.sock, DCPX__COMMAND__KIND__RESET, "reset", -1,
                       UINT64_MAX, 0);
    if (r < 0)
      die("reset: %s", dcpx_strerror(r));
    wait_nfails(sh, all, (uint32_t)k + 1);
    if (hh_wait_progress(sh, W, sh->resume_at + 3, 60000))
      die("no resume: %s", hh_rank_errors(sh, W));
    uint64_t a = UINT64_MAX, b = 0, f = 0;
    for (uint32_t q = 0; q < W; q++) {
      const hh_fail *x = &sh->r[q].fails[k];
      a = x->t_rec_start_ns < a ? x->t_rec_start_ns : a;
      b = x->t_rec_end_ns > b ? x->t_rec_end_ns : b;
      f = x->t_fail_ns - t0 > f ? x->t_fail_ns - t0 : f;
    }
    rec[k] = b - a;
    fail[k] = f;
  }
  stop_all(sh, pids, W);
  char what[128];
  snprintf(what, sizeof(what), "operator abort, W=%u: command sent -> last rank's call returns", W);
  report(what, fail, reps);
  snprintf(what, sizeof(what), "recovery, W=%u, all ranks alive: first dcpx_recover -> all resumed", W);
  report(what, rec, reps);
}

/* ---- join: a group's formation, as its one rank sees it --------------- */

static void bench_join(int reps) {
  uint64_t *t = calloc((size_t)reps, 8);
  dcpx_client *c;
  hh_spec sp = hh_spec_small("join", 1, 1000000000ull);
  dcpx_shape shape;
  int r;

  if (!t)
    die("out of memory");
  hh_shape(&sp, &shape);
  if ((r = dcpx_connect(g_d.sock, &c)) < 0)
    die("connect: %s", dcpx_strerror(r));
  for (int k = 0; k < reps; k++) {
    dcpx_join_opts jo = DCPX_JOIN_OPTS_INIT;
    dcpx_member *m;
    char name[32];
    snprintf(name, sizeof(name), "join-%d", k);
    jo.group = name;
    jo.timeout_ns = sp.timeout_ns;
    const uint64_t t0 = hh_mono();
    if ((r = dcpx_join(c, &shape, &jo, &m)) < 0)
      die("join %d: %s", k, dcpx_strerror(r));
    t[k] = hh_mono() - t0;
    if ((r = dcpx_leave(m)) < 0)
      die("leave %d: %s", k, dcpx_strerror(r));
  }
  dcpx_disconnect(c);
  report("dcpx_join of a one-rank group (its formation)", t, reps);
  free(t);
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"world", required_argument, NULL, 'w'},
      {"reps", required_argument, NULL, 'n'},
      {"timeout-ms", required_argument, NULL, 't'},
      {"poll-ms", required_argument, NULL, 'p'},
      {"what", required_argument, NULL, 'x'},
      {NULL, 0, NULL, 0}};
  uint32_t W = 8;
  int reps = 15, opt, bad = 0;
  uint64_t timeout_ms = 20, v;
  const char *poll_ms = "2", *what = "all";
  static const char usage[] =
      "usage: bench_health [--world W] [--reps N] [--timeout-ms T] "
      "[--poll-ms P] [--what detection|kill|reset|join|all]\n";

  if (bench_wants_help(argc, argv)) {
    fputs(usage, stdout);
    return 0;
  }
  /* numbers as the tools take them (dcpxd_parse_num), in range: atoi and
   * strtoull took "2x" for 2 and "-1" for 2^64 - 1 (a run that hung) */
  while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (opt) {
    case 'w':
      bad |= dcpxd_parse_num(optarg, &v) < 0 || v < 2 || v > DCPX_MAX_WORLD;
      W = (uint32_t)v;
      break;
    case 'n': /* the bound of the modes with ranks: checked below */
      bad |= dcpxd_parse_num(optarg, &v) < 0 || v < 1 || v > 100000;
      reps = (int)v;
      break;
    case 't':
      bad |= dcpxd_parse_num(optarg, &v) < 0 || v < 1 || v > 60000;
      timeout_ms = v;
      break;
    case 'p':
      poll_ms = optarg;
      break;
    case 'x':
      what = optarg;
      break;
    default:
      fputs(usage, stderr);
      return 2;
    }
  }
  const bool join = !strcmp(what, "join");
  if (strcmp(what, "all") && strcmp(what, "detection") &&
      strcmp(what, "kill") && strcmp(what, "reset") && !join)
    bad = 1;
  if (!join && reps > HH_MAX_FAILS - 1) /* a failure record per rep */
    bad = 1;
  if (bad || optind < argc) {
    fprintf(stderr, "bench_health: bad arguments (--world 2..%d, --reps "
                    "1..%d (join: 1..100000), --timeout-ms 1..60000, --what "
                    "one of detection, kill, reset, join, all; no other "
                    "arguments)\n",
            DCPX_MAX_WORLD, HH_MAX_FAILS - 1);
    fputs(usage, stderr);
    return 2;
  }
  const char *extra[] = {"--enable-fault-injection", "--poll-ms", poll_ms,
                         NULL};
  if (hh_daemon_start(&g_d, extra))
    die("dcpxd did not come up");
  printf("dcpxd poll %s ms; %d repetitions; times in ms\n\n", poll_ms, reps);
  printf("| measurement | median | p90 | max | n |\n|---|---|---|---|---|\n");
  if (!strcmp(what, "all") || !strcmp(what, "detection"))
    bench_detection(reps, timeout_ms * 1000000ull);
  if (!strcmp(what, "all") || !strcmp(what, "kill"))
    bench_kill(reps, W);
  if (!strcmp(what, "all") || !strcmp(what, "reset"))
    bench_reset(reps, W);
  if (join)
    bench_join(reps);
  hh_daemon_stop(&g_d, SIGTERM);
  hh_daemon_cleanup(&g_d);
  return 0;
}
