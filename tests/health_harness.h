/* health_harness.h - what tests/check_health.c and bench/bench_health.c
 * share: a private dcpxd, dcpxctl runs, a tiny JSON checker, and rank
 * processes that run exact calls in a loop under the parent's direction.
 *
 * Header-only (static functions), free of Check, so that the benchmark can
 * use it too. Everything returns 0 or a negative code / a status; the
 * caller asserts.
 *
 * The rank processes. The parent maps an hh_shared block (MAP_SHARED,
 * anonymous) before forking; each rank process joins, then runs calls
 * c = first, first+1, ... while c < stop_at. Every call's inputs depend
 * only on (c, rank), so every process can check every call against
 * dcpx_ref_call. After a failed call a rank records what happened (code,
 * times) and, if told to, recovers and continues at resume_at: after a
 * recovery the epochs restart, and all ranks must agree on the next call.
 * A "victim" rank stops between its push and its merge of victim_call
 * (mid-call) and waits there to be killed. A "late" rank sleeps before its
 * push of late_call, so that its peers' waits of that call begin first.
 *
 * Fault injections and wait records name a call by its call_seq: 1 for
 * the first call after the join or the last recovery (hh_call_seq).
 */
#ifndef DCPX_TESTS_HEALTH_HARNESS_H
#define DCPX_TESTS_HEALTH_HARNESS_H

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dcpx.h"
#include "call.h"
#include "daemon_proc.h"
#include "frame.h"
#include "layout.h"
#include "member.h"
#include "rng.h"

/* Every function: the test and the benchmark each use a part. */
#define HH_FN static __attribute__((unused))

/* ---- clocks ------------------------------------------------------------- */

HH_FN inline uint64_t hh_ns(clockid_t clk) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
HH_FN inline uint64_t hh_mono(void) { return hh_ns(CLOCK_MONOTONIC); }
HH_FN inline uint64_t hh_real(void) { return hh_ns(CLOCK_REALTIME); }
HH_FN inline void hh_sleep_ms(unsigned ms) { usleep(ms * 1000u); }

/* ---- a private dcpxd ---------------------------------------------------- */

typedef struct hh_daemon {
  char dir[64];    /* the test's folder; made by the first start */
  char sock[128];  /* dir/d.sock */
  char state[128]; /* dir/state */
  char log[128];   /* dir/dcpxd.log: every run's stderr, appended */
  pid_t pid;
} hh_daemon;

/* Whether a client can say Hello to the daemon now. */
HH_FN int hh_daemon_up(const hh_daemon *d) { return dp_daemon_up(d->sock); }

/* The test program's pid, set by its main() before any test forks: every
 * daemon folder is /tmp/dcpx-health.<owner>.XXXXXX, so that the program can
 * remove what a failed (or timed-out) test left behind
 * (hh_cleanup_owned). 0: the calling process's pid. */
static pid_t hh_owner __attribute__((unused));

/* Starts dcpxd ($DCPXD) on d's socket and state dir, with the extra
 * arguments (NULL-terminated list), and waits until it answers. The first
 * start makes the folder. Returns 0, or -1 if it did not come up in 5 s. */
HH_FN int hh_daemon_start(hh_daemon *d, const char *const *extra) {
  const char *bin = dp_dcpxd();
  const char *argv[32];
  int n = 0;

  if (!d->dir[0]) {
    snprintf(d->dir, sizeof(d->dir), "/tmp/dcpx-health.%ld.XXXXXX",
             (long)(hh_owner ? hh_owner : getpid()));
    if (!mkdtemp(d->dir))
      return -1;
    snprintf(d->sock, sizeof(d->sock), "%s/d.sock", d->dir);
    snprintf(d->state, sizeof(d->state), "%s/state", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/dcpxd.log", d->dir);
  }
  argv[n++] = bin;
  argv[n++] = "--config=";
  argv[n++] = "--socket";
  argv[n++] = d->sock;
  argv[n++] = "--state-dir";
  argv[n++] = d->state;
  argv[n++] = "--join-timeout-ms";
  argv[n++] = "20000";
  for (int i = 0; extra && extra[i] && n < 30; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  d->pid = fork();
  if (d->pid < 0)
    return -1;
  if (d->pid == 0) {
    int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    /* A test that fails (and exits) takes its daemon along. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (fd >= 0)
      dup2(fd, 2);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = 0;
      return -1; /* it exited */
    }
    if (hh_daemon_up(d))
      return 0;
    hh_sleep_ms(10);
  }
  return -1;
}

/* Stops it with sig and reaps it. Returns the wait status, or -1. */
HH_FN int hh_daemon_stop(hh_daemon *d, int sig) {
  const int st = d->pid > 0 ? dp_stop(d->pid, sig) : -1;
  d->pid = 0;
  return st;
}

HH_FN void hh_daemon_cleanup(hh_daemon *d) {
  if (d->pid > 0)
    hh_daemon_stop(d, SIGKILL);
  if (d->dir[0])
    dp_rm_tree(d->dir);
  d->dir[0] = 0;
}

/* Removes every daemon folder of this test program (hh_owner), also those
 * of tests that failed before their own cleanup: call it from main() after
 * the suite ran. */
HH_FN void hh_cleanup_owned(void) {
  char prefix[64], path[320];
  DIR *dir = opendir("/tmp");
  struct dirent *e;

  if (!dir)
    return;
  snprintf(prefix, sizeof(prefix), "dcpx-health.%ld.",
           (long)(hh_owner ? hh_owner : getpid()));
  while ((e = readdir(dir))) {
    if (strncmp(e->d_name, prefix, strlen(prefix)))
      continue;
    snprintf(path, sizeof(path), "/tmp/%s", e->d_name);
    dp_rm_tree(path);
  }
  closedir(dir);
}

/* The daemon's resident set, in KiB (-1 if unreadable). */
HH_FN long hh_rss_kib(pid_t pid) {
  char path[64], line[256];
  long kib = -1;
  FILE *f;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  f = fopen(path, "r");
  if (!f)
    return -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

/* ---- dcpxctl -------------------------------------------------------------- */

typedef struct hh_out {
  char out[4 * 1024 * 1024]; /* a node of thousands of groups */
  char err[16 * 1024];
  size_t n_out, n_err;
} hh_out;

/* Runs $DCPXCTL --socket d->sock ARGS... (NULL-terminated); fills o with
 * its stdout and stderr. Returns its exit status (0..255), or -1 if it did
 * not exit normally. */
HH_FN int hh_ctl(const hh_daemon *d, hh_out *o, ...) {
  const char *bin = getenv("DCPXCTL");
  const char *argv[40];
  int po[2], pe[2], n = 0, st;
  va_list ap;
  pid_t pid;

  if (!bin)
    bin = "./tools/dcpxctl";
  argv[n++] = bin;
  argv[n++] = "--socket";
  argv[n++] = d->sock;
  va_start(ap, o);
  for (const char *a; (a = va_arg(ap, const char *)) && n < 38;)
    argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0)
    return -1;
  pid = fork();
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  o->n_out = o->n_err = 0;
  struct pollfd p[2] = {{.fd = po[0], .events = POLLIN},
                        {.fd = pe[0], .events = POLLIN}};
  int open_ = 2;
  while (open_ > 0) {
    if (poll(p, 2, 30000) <= 0)
      break;
    for (int i = 0; i < 2; i++) {
      if (p[i].fd < 0 || !p[i].revents)
        continue;
      char *buf = i == 0 ? o->out : o->err;
      size_t cap = (i == 0 ? sizeof(o->out) : sizeof(o->err)) - 1;
      size_t *len = i == 0 ? &o->n_out : &o->n_err;
      char scratch[4096];
      ssize_t k = read(p[i].fd, *len < cap ? buf + *len : scratch,
                       *len < cap ? cap - *len : sizeof(scratch));
      if (k <= 0) {
        close(p[i].fd);
        p[i].fd = -1;
        open_--;
      } else if (*len < cap) {
        *len += (size_t)k;
      }
    }
  }
  for (int i = 0; i < 2; i++)
    if (p[i].fd >= 0)
      close(p[i].fd);
  o->out[o->n_out] = 0;
  o->err[o->n_err] = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
    return -1;
  return WEXITSTATUS(st);
}

/* dcpxctl ARGS... (hh_ctl on d, its output in *o), asserted to exit with
 * want by the caller's ASSERT(cond, format, ...): the message names the
 * arguments and shows what dcpxctl wrote. The tests' CTL macros. */
#define HH_CTL(ASSERT, d, o, want, ...)                                      \
  do {                                                                       \
    int rc_ = hh_ctl(d, o, __VA_ARGS__, (char *)NULL);                       \
    ASSERT(rc_ == (want), "dcpxctl %s: exit %d, expected %d\n%s%s",          \
           #__VA_ARGS__, rc_, (want), (o)->out, (o)->err);                   \
  } while (0)

/* ---- a small JSON checker ------------------------------------------------- */

/* Recursive descent over RFC 8259 values; returns the end, or NULL. */
HH_FN const char *hh_json_value(const char *p, int depth);

HH_FN const char *hh_json_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
    p++;
  return p;
}

HH_FN const char *hh_json_string(const char *p) {
  if (*p++ != '"')
    return NULL;
  while (*p && *p != '"') {
    if ((unsigned char)*p < 0x20)
      return NULL;
    if (*p == '\\') {
      p++;
      if (*p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i])
            return NULL;
        p += 4;
      } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
        return NULL;
      }
    }
    p++;
  }
  return *p == '"' ? p + 1 : NULL;
}

HH_FN const char *hh_json_number(const char *p) {
  const char *s = p;
  if (*p == '-')
    p++;
  if (*p == '0')
    p++;
  else if (*p >= '1' && *p <= '9')
    while (*p >= '0' && *p <= '9')
      p++;
  else
    return NULL;
  if (*p == '.') {
    p++;
    if (!(*p >= '0' && *p <= '9'))
      return NULL;
    while (*p >= '0' && *p <= '9')
      p++;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-')
      p++;
    if (!(*p >= '0' && *p <= '9'))
      return NULL;
    while (*p >= '0' && *p <= '9')
      p++;
  }
  return p > s ? p : NULL;
}

HH_FN const char *hh_json_value(const char *p, int depth) {
  if (depth > 64)
    return NULL;
  p = hh_json_ws(p);
  if (*p == '{' || *p == '[') {
    char close_ = *p == '{' ? '}' : ']';
    int obj = *p == '{';
    p = hh_json_ws(p + 1);
    if (*p == close_)
      return p + 1;
    for (;;) {
      if (obj) {
        p = hh_json_string(hh_json_ws(p));
        if (!p)
          return NULL;
        p = hh_json_ws(p);
        if (*p++ != ':')
          return NULL;
      }
      p = hh_json_value(p, depth + 1);
      if (!p)
        return NULL;
      p = hh_json_ws(p);
      if (*p == ',') {
        p++;
        continue;
      }
      return *p == close_ ? p + 1 : NULL;
    }
  }
  if (*p == '"')
    return hh_json_string(p);
  if (!strncmp(p, "true", 4))
    return p + 4;
  if (!strncmp(p, "false", 5))
    return p + 5;
  if (!strncmp(p, "null", 4))
    return p + 4;
  return hh_json_number(p);
}

/* 1 if s is exactly one JSON value (and whitespace). */
HH_FN int hh_json_valid(const char *s) {
  const char *e = hh_json_value(s, 0);
  return e && *hh_json_ws(e) == 0;
}

/* The number after "key": at or after p (before `end`, if given); 0 and
 * *v set, or -1. */
HH_FN int hh_json_u64(const char *p, const char *end, const char *key,
                       uint64_t *v) {
  char pat[64];
  snprintf(pat, sizeof(pat), "\"%s\":", key);
  const char *q = strstr(p, pat);
  if (!q || (end && q >= end))
    return -1;
  q += strlen(pat);
  if (*q == '-' || !(*q >= '0' && *q <= '9'))
    return -1;
  *v = strtoull(q, NULL, 10);
  return 0;
}

/* The string after "key": (copied into buf); 0, or -1. */
HH_FN int hh_json_str(const char *p, const char *end, const char *key,
                       char *buf, size_t n) {
  char pat[64];
  size_t k = 0;
  snprintf(pat, sizeof(pat), "\"%s\":\"", key);
  const char *q = strstr(p, pat);
  if (!q || (end && q >= end))
    return -1;
  q += strlen(pat);
  while (*q && *q != '"' && k + 1 < n)
    buf[k++] = *q++;
  buf[k] = 0;
  return 0;
}

/* A timeout record as dcpxctl records --json prints it. */
typedef struct hh_rec {
  char group[64], region_name[32], kind[16];
  uint64_t generation, rank, region, index, expected, seen, block, call_tag,
      time_ns;
  int64_t awaited_rank; /* -1: null (dcpxd cannot tell) */
  int other_call;       /* the slot held the row of another call */
} hh_rec;

/* "key": true (*v = 1) or false (*v = 0), before `end`; 0, or -1. */
HH_FN int hh_json_bool(const char *p, const char *end, const char *key,
                       int *v) {
  char pat[64];
  for (int b = 0; b < 2; b++) {
    snprintf(pat, sizeof(pat), "\"%s\":%s", key, b ? "true" : "false");
    const char *q = strstr(p, pat);
    if (q && q < end) {
      *v = b;
      return 0;
    }
  }
  return -1;
}

/* "key": a number (*v) or null (*v = -1), before `end`; 0, or -1. */
HH_FN int hh_json_rank_or_null(const char *p, const char *end,
                               const char *key, int64_t *v) {
  char pat[64];
  uint64_t u;
  snprintf(pat, sizeof(pat), "\"%s\":null", key);
  const char *q = strstr(p, pat);
  if (q && q < end) {
    *v = -1;
    return 0;
  }
  if (hh_json_u64(p, end, key, &u))
    return -1;
  *v = (int64_t)u;
  return 0;
}

/* Parses the records of `dcpxctl records --json` output; returns how many
 * (at most max), or -1 if a record lacks a field. */
HH_FN int hh_parse_records(const char *json, hh_rec *recs, int max) {
  const char *p = strstr(json, "\"records\":[");
  int n = 0;
  if (!p)
    return -1;
  p += strlen("\"records\":[");
  while (n < max && (p = strstr(p, "{\"group\":"))) {
    const char *e = strchr(p, '}');
    hh_rec *r = &recs[n];
    if (!e)
      return -1;
    if (hh_json_str(p, e, "group", r->group, sizeof(r->group)) ||
        hh_json_str(p, e, "region_name", r->region_name,
                    sizeof(r->region_name)) ||
        hh_json_str(p, e, "kind", r->kind, sizeof(r->kind)) ||
        hh_json_u64(p, e, "generation", &r->generation) ||
        hh_json_u64(p, e, "rank", &r->rank) ||
        hh_json_u64(p, e, "region", &r->region) ||
        hh_json_u64(p, e, "index", &r->index) ||
        hh_json_u64(p, e, "expected", &r->expected) ||
        hh_json_u64(p, e, "seen", &r->seen) ||
        hh_json_u64(p, e, "block", &r->block) ||
        hh_json_u64(p, e, "call_tag", &r->call_tag) ||
        hh_json_u64(p, e, "time_ns", &r->time_ns) ||
        hh_json_rank_or_null(p, e, "awaited_rank", &r->awaited_rank) ||
        hh_json_bool(p, e, "other_call", &r->other_call))
      return -1;
    n++;
    p = e;
  }
  return n;
}

/* ---- rank processes ------------------------------------------------------- */

typedef struct hh_spec {
  char group[32];
  uint32_t W, R, K, N, L;
  uint64_t timeout_ns;
} hh_spec;

/* The group the tests run: W ranks of R = 2 rows, K = 64, N = 16 (every
 * row rescues while W*N < K), L = 256, named group, with timeout_ns. */
HH_FN hh_spec hh_spec_small(const char *group, uint32_t W,
                            uint64_t timeout_ns) {
  hh_spec sp;
  memset(&sp, 0, sizeof(sp));
  snprintf(sp.group, sizeof(sp.group), "%s", group);
  sp.W = W;
  sp.R = 2;
  sp.K = 64;
  sp.N = 16;
  sp.L = 256;
  sp.timeout_ns = timeout_ns;
  return sp;
}

#define HH_MAX_FAILS 64

/* One failed call as a rank saw it. */
typedef struct hh_fail {
  int32_t rc;
  uint64_t call;
  uint64_t t_merge_ns, t_fail_ns;       /* MONOTONIC: merge began, returned */
  uint64_t t_rec_start_ns, t_rec_end_ns; /* MONOTONIC: dcpx_recover */
  /* measure: after its own timeout (DCPX_E_FAILED), the rank's record time
   * (REALTIME), when it saw the abort word set, and when the ABORT event
   * arrived. 0 when not measured. */
  uint64_t rec_time_ns, abort_seen_ns, event_ns;
} hh_fail;

typedef struct hh_rank_state {
  volatile uint64_t progress; /* the call after the last exact one */
  volatile uint64_t ok;       /* exact calls */
  volatile uint64_t ok_since_resume;
  volatile uint32_t nfails;
  hh_fail fails[HH_MAX_FAILS];
  volatile uint64_t at_merge; /* call+1 whose merge this rank is in, or 0 */
  volatile uint64_t at_gate;  /* call+1 at whose gate this rank waits, or 0 */
  volatile uint32_t reattaches;
  volatile int32_t poll_bad;  /* a dcpx_poll code that is not a reconnect's */
  /* A replacement's dcpx_recover right after its join (MONOTONIC). */
  volatile uint64_t t_join_ns, t_rep_rec_start_ns, t_rep_rec_end_ns;
  volatile uint32_t status;   /* 0 running, 1 done, 2 error */
  char err[200];
} hh_rank_state;

typedef struct hh_shared {
  volatile uint64_t stop_at;     /* run calls c < stop_at */
  volatile uint64_t resume_at;   /* after a recovery, continue here */
  volatile uint64_t victim_call; /* victim stops after this call's push */
  volatile int32_t victim_rank;  /* -1: none */
  volatile uint32_t victim_ready;
  /* The victim first forks a child that keeps its socket (and every other
   * fd) open, so that only the pid tells its death; the child's pid. */
  volatile uint32_t victim_holder;
  volatile pid_t holder_pid;
  volatile uint32_t poll_each;   /* dcpx_poll before every call */
  volatile uint32_t no_poll;     /* bit r: rank r does not (poll_each) */
  volatile uint32_t recover;     /* recover after a failure, else stop */
  volatile uint32_t hold;        /* bit r: after a failure, rank r waits */
  volatile uint32_t release;     /* until bit r is set here */
  volatile uint32_t measure;     /* fill hh_fail's measurement fields */
  /* A gate: every rank waits before call gate_at until gate_open, so that
   * the parent can arm a fault for a call no rank has started yet. */
  volatile uint64_t gate_at;
  volatile uint32_t gate_open;
  volatile uint32_t check;       /* check every call against the reference */
  volatile int32_t late_rank;    /* -1: none */
  volatile uint64_t late_call;
  volatile uint32_t late_ms;
  /* Rank processes done with their last call; each leaves only once all
   * W are (or after HH_LEAVE_WAIT_MS): a Leave aborts the group, and a
   * rank that left first failed a slower peer's last call under load. */
  volatile uint32_t leaving;
  hh_rank_state r[DCPX_MAX_WORLD];
} hh_shared;

#define HH_LEAVE_WAIT_MS 5000u

HH_FN hh_shared *hh_shared_new(void) {
  hh_shared *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED)
    return NULL;
  memset(s, 0, sizeof(*s));
  s->stop_at = UINT64_MAX;
  s->victim_call = UINT64_MAX;
  s->victim_rank = -1;
  s->late_rank = -1;
  s->check = 1;
  s->gate_at = UINT64_MAX;
  return s;
}

HH_FN void hh_shape(const hh_spec *sp, dcpx_shape *sh) {
  dcpx_shape s = DCPX_SHAPE_INIT;
  s.world = sp->W;
  s.rows = sp->R;
  s.topk = sp->K;
  s.local_topk = sp->N;
  s.block_size = 4;
  s.interleave = 1;
  s.max_local = sp->L;
  *sh = s;
}

/* Every rank's inputs of call c, the same in every process. */
HH_FN void hh_inputs(const hh_spec *sp, uint64_t c, uint16_t **lg,
                      int32_t **en) {
  for (uint32_t d = 0; d < sp->W; d++) {
    uint64_t s = (c << 20) ^ (d * 7919u) ^ 0x4EA1;
    for (uint32_t t = 0; t < sp->R; t++) {
      int hot = (c + t) % 3 == 0 && d == (c + t) % sp->W; /* rescues */
      en[d][t] = (int32_t)(sp->L / 2 + dcpx_splitmix64(&s) % (sp->L / 2 + 1));
      for (uint32_t l = 0; l < sp->L; l++)
        lg[d][t * sp->L + l] =
            (uint16_t)((hot ? 0x4100 : 0x3F00) + dcpx_splitmix64(&s) % 0x60);
    }
  }
}

/* The saturation masks (sat_word >> 16) of call c's rows, as every rank
 * computes them. 0 or a negative code. */
HH_FN int hh_ref_masks(const hh_spec *sp, uint64_t c, uint32_t *masks) {
  const uint32_t R = sp->R, K = sp->K, bt_cols = (sp->L + 3) / 4;
  uint16_t *lg[DCPX_MAX_WORLD];
  int32_t *en[DCPX_MAX_WORLD];
  int32_t *req = calloc(R, 4), *bt = calloc((size_t)R * bt_cols, 4);
  int32_t *ro = calloc((size_t)R * K, 4), *vo = calloc(R, 4);
  uint32_t *sw = calloc(R, 4);
  dcpx_shape shape;
  int r;

  hh_shape(sp, &shape);
  for (uint32_t d = 0; d < sp->W; d++) {
    lg[d] = calloc((size_t)R * sp->L, 2);
    en[d] = calloc(R, 4);
  }
  for (uint32_t t = 0; t < R; t++)
    req[t] = (int32_t)t;
  hh_inputs(sp, c, lg, en);
  r = t_ref_call(&shape, R, (const uint16_t *const *)lg, sp->L,
                    (const int32_t *const *)en, 0, req, bt, R, bt_cols, ro, vo,
                    NULL, sw, NULL);
  for (uint32_t t = 0; t < R && r == 0; t++)
    masks[t] = sw[t] >> 16;
  for (uint32_t d = 0; d < sp->W; d++) {
    free(lg[d]);
    free(en[d]);
  }
  free(req);
  free(bt);
  free(ro);
  free(vo);
  free(sw);
  return r;
}

/* The call_seq of call c (the fault hook's --call, the records' call
 * tag) in a group that started, or last recovered, at call `first`. */
HH_FN uint64_t hh_call_seq(uint64_t first, uint64_t c) { return c - first + 1; }

/* Where the other ranks wait, and what their wait record says, when rank
 * s pushed call F and then stopped (stalled or paused before its merge),
 * the group having started at call `first` with zeroed memory. If rank s
 * is saturated in some row of call F, the others wait in call F, in the
 * first such row, for the first half of its rescue slot (its tag: the q
 * of the last rescue of that row that used the slot, or 0); else in call
 * F+1, row 0, for its LL list. */
typedef struct hh_expect {
  uint64_t call, call_seq, index, expected, seen, block;
  const char *region;
} hh_expect;

/* The rescue case of hh_expect_stop: rank s in row t, mask `mask`. */
HH_FN void hh_expect_rescue(const dcpx_layout *L, uint32_t t, uint32_t mask,
                            uint32_t s, uint32_t q, const uint32_t *tags,
                            hh_expect *x) {
  const uint32_t slot = dcpx_rescue_slot(mask, s);
  x->region = "rescue";
  x->index = dcpx_rescue_offset(L, t, slot, 0) / 8;
  x->expected = q;
  x->seen = tags[slot];
  x->block = t;
}

HH_FN int hh_expect_stop(const hh_spec *sp, uint64_t first, uint64_t F,
                          uint32_t s, hh_expect *x) {
  uint32_t seq2[64] = {0}, tags[64][DCPX_MAX_WORLD], masks[64];
  dcpx_layout L;

  if (sp->R > 64)
    return -1;
  memset(tags, 0, sizeof(tags));
  dcpx_layout_compute(&L, sp->W, sp->R, sp->K, sp->N);
  for (uint64_t c = first; c <= F; c++) {
    if (hh_ref_masks(sp, c, masks) < 0)
      return -1;
    for (uint32_t t = 0; t < sp->R; t++) {
      const uint32_t q = dcpx_epoch_next(seq2[t]);
      if (c == F && ((masks[t] >> s) & 1u)) {
        x->call = F;
        x->call_seq = hh_call_seq(first, F);
        hh_expect_rescue(&L, t, masks[t], s, q, tags[t], x);
        return 0;
      }
      if (!masks[t])
        continue;
      seq2[t] = q;
      for (uint32_t k = 0; k < (uint32_t)__builtin_popcount(masks[t]); k++)
        tags[t][k] = q;
    }
  }
  const uint64_t e = F + 1 - first + 1; /* epoch of call F+1 */
  x->call = F + 1;
  x->call_seq = hh_call_seq(first, F + 1);
  x->region = "ll_slots";
  x->index = dcpx_ll_offset(&L, (uint32_t)(e & 1), s, 0, 0) / 8;
  /* row 0 is in every call: both halves of its tag count the calls */
  x->expected = (e << 16) | e;
  x->seen = e > 2 ? ((e - 2) << 16) | (e - 2) : 0;
  x->block = 0;
  return 0;
}

/* The first call F in [from, from + 64) after which, with rank s stopped,
 * the others wait in `region`, in row 0 (*x: hh_expect_stop of F), or
 * UINT64_MAX. A stall that the others feel, now that a stall lasts at most
 * the timeout and their waits count from the start of their row, is one
 * of rank s in such a "rescue" call that it also comes late to: their row
 * 0 then began to wait before its stall did. */
HH_FN uint64_t hh_pick_call(const hh_spec *sp, uint64_t first, uint64_t from,
                            uint32_t s, const char *region, hh_expect *x) {
  for (uint64_t F = from; F < from + 64; F++) {
    if (hh_expect_stop(sp, first, F, s, x) < 0)
      return UINT64_MAX;
    if (!strcmp(x->region, region) && x->block == 0)
      return F;
  }
  return UINT64_MAX;
}

/* Measurement after this rank's own timeout: when the abort word is set
 * (the daemon saw the alarm), and when the ABORT event arrives. */
HH_FN void hh_measure(dcpx_member *m, hh_fail *f) {
  const dcpx_wait_record *rec = NULL;
  uint64_t until = hh_mono() + 2000000000ull;
  for (uint32_t t = 0; t < m->shape.rows; t++) {
    const dcpx_wait_record *w = &m->records[(size_t)m->rank * m->L.rows + t];
    if (w->kind != DCPX_REC_EMPTY) {
      rec = w;
      break;
    }
  }
  if (!rec)
    return;
  f->rec_time_ns = rec->time_ns;
  while (!__atomic_load_n(&m->hdr->abort, __ATOMIC_ACQUIRE) &&
         hh_mono() < until)
    ;
  f->abort_seen_ns = hh_real();
  while (m->sock >= 0 && hh_mono() < until) {
    struct pollfd p = {.fd = m->sock, .events = POLLIN};
    Dcpx__Frame *ev = NULL;
    if (poll(&p, 1, 100) <= 0)
      continue;
    if (dcpx__frame_recv(m->sock, &ev, NULL, 0, NULL) < 0)
      break;
    int abort_ev = ev->msg_case == DCPX__FRAME__MSG_EVENT &&
                   ev->event->kind == DCPX__EVENT__KIND__ABORT;
    dcpx__frame_free(ev);
    if (abort_ev) {
      f->event_ns = hh_real();
      break;
    }
  }
}

#define HH_ERR(st, ...) snprintf((st)->err, sizeof((st)->err), __VA_ARGS__)

/* A rank process's body; returns its exit status. replacement: join as a
 * replacement of a dead rank, recover, and start at resume_at. */
HH_FN int hh_rank_main(const char *sock, const hh_spec *sp, hh_shared *sh,
                        uint32_t rank, uint64_t first, int replacement) {
  hh_rank_state *st = &sh->r[rank];
  const uint32_t K = sp->K, R = sp->R, bt_cols = (sp->L + 3) / 4;
  dcpx_shape shape;
  dcpx_join_opts jo = DCPX_JOIN_OPTS_INIT;
  dcpx_client *c = NULL;
  dcpx_member *m = NULL;
  uint16_t *lg[DCPX_MAX_WORLD];
  int32_t *en[DCPX_MAX_WORLD];
  int32_t *req = calloc(R, 4), *bt = calloc((size_t)R * bt_cols, 4);
  int32_t *ro = calloc((size_t)R * K, 4), *xo = calloc((size_t)R * K, 4);
  int32_t *io = calloc((size_t)R * K, 4), *xi = calloc((size_t)R * K, 4);
  int32_t *vo = calloc(R, 4), *xv = calloc(R, 4);
  uint32_t *so = calloc(R, 4), *xs = calloc(R, 4);
  uint64_t resumed_at = first;
  int r, rc = 1;

  hh_shape(sp, &shape);
  for (uint32_t d = 0; d < sp->W; d++) {
    lg[d] = calloc((size_t)R * sp->L, 2);
    en[d] = calloc(R, 4);
  }
  for (uint32_t t = 0; t < R; t++) {
    req[t] = (int32_t)t;
    for (uint32_t b = 0; b < bt_cols; b++)
      bt[t * bt_cols + b] = (int32_t)(rank * 100000 + t * bt_cols + b);
  }
  jo.group = sp->group;
  jo.rank = rank;
  jo.timeout_ns = sp->timeout_ns;
  r = dcpx_connect(sock, &c);
  if (r == 0)
    r = dcpx_join(c, &shape, &jo, &m);
  if (r < 0) {
    HH_ERR(st, "rank %u: join: %s", rank, dcpx_strerror(r));
    st->status = 2;
    goto out;
  }
  st->t_join_ns = hh_mono();
  if (replacement) {
    st->ok_since_resume = 0; /* the slot was the dead rank's */
    st->t_rep_rec_start_ns = hh_mono();
    r = dcpx_recover(m, NULL, 60000);
    st->t_rep_rec_end_ns = hh_mono();
    if (r < 0) {
      HH_ERR(st, "rank %u (replacement): recover: %s", rank, dcpx_strerror(r));
      st->status = 2;
      goto out;
    }
    first = resumed_at = sh->resume_at;
  }
  for (uint64_t cl = first; cl < sh->stop_at; cl++) {
    /* The first call at or past the gate: if the parent set it late, all
     * ranks still stop at one call (none can be a call ahead of a peer
     * that has not pushed). */
    if (cl >= sh->gate_at && !sh->gate_open) {
      st->at_gate = cl + 1;
      while (!sh->gate_open)
        hh_sleep_ms(1);
      st->at_gate = 0;
    }
    if (sh->poll_each && !((sh->no_poll >> rank) & 1u)) {
      r = dcpx_poll(m);
      if (r < 0 && r != DCPX_E_NOTCONN && r != DCPX_E_CONNREFUSED &&
          r != DCPX_E_CONNRESET)
        st->poll_bad = r;
    }
    hh_inputs(sp, cl, lg, en);
    if ((int32_t)rank == sh->late_rank && cl == sh->late_call)
      hh_sleep_ms(sh->late_ms);
    r = t_push(m, R, lg[rank], sp->L, en[rank], cl, NULL);
    if ((int32_t)rank == sh->victim_rank && cl == sh->victim_call) {
      if (sh->victim_holder) {
        pid_t h = fork();
        if (h == 0) { /* holds the fds; gives up after a while */
          for (int i = 0; i < 600; i++)
            hh_sleep_ms(100);
          _exit(0);
        }
        sh->holder_pid = h;
      }
      sh->victim_ready = 1; /* mid-call: pushed, not merged */
      for (;;)
        pause();
    }
    st->at_merge = cl + 1;
    uint64_t t0 = hh_mono();
    /* Merge even after a failed push, as an engine would (it enqueues
     * both): the merge fails fast and marks every row invalid. */
    int rm = t_merge(m, R, lg[rank], sp->L, en[rank], req, bt, R, bt_cols,
                        ro, vo, io, so, cl, NULL);
    if (r == 0)
      r = rm;
    uint64_t t1 = hh_mono();
    st->at_merge = 0;
    if (r == DCPX_E_FAILED || r == DCPX_E_ABORTED) {
      uint32_t k = st->nfails < HH_MAX_FAILS ? st->nfails : HH_MAX_FAILS - 1;
      hh_fail *f = &st->fails[k];
      memset(f, 0, sizeof(*f));
      f->rc = r;
      f->call = cl;
      f->t_merge_ns = t0;
      f->t_fail_ns = t1;
      for (uint32_t t = 0; t < R; t++)
        if (vo[t] != -1) {
          HH_ERR(st, "rank %u call %llu failed (%s) but valid_out[%u] = %d",
                 rank, (unsigned long long)cl, dcpx_strerror(r), t, vo[t]);
          st->status = 2;
          goto out;
        }
      if (sh->measure && r == DCPX_E_FAILED)
        hh_measure(m, f);
      __atomic_store_n(&st->nfails, st->nfails + 1, __ATOMIC_RELEASE);
      if (!sh->recover)
        break;
      while (((sh->hold & ~sh->release) >> rank) & 1u)
        hh_sleep_ms(1);
      f->t_rec_start_ns = hh_mono();
      r = dcpx_recover(m, NULL, 60000);
      f->t_rec_end_ns = hh_mono();
      if (r < 0) {
        HH_ERR(st, "rank %u: recover after call %llu: %s", rank,
               (unsigned long long)cl, dcpx_strerror(r));
        st->status = 2;
        goto out;
      }
      uint64_t next = sh->resume_at > cl + 1 ? sh->resume_at : cl + 1;
      resumed_at = next;
      st->ok_since_resume = 0;
      cl = next - 1;
      continue;
    }
    if (r < 0) {
      HH_ERR(st, "rank %u call %llu: %s", rank, (unsigned long long)cl,
             dcpx_strerror(r));
      st->status = 2;
      goto out;
    }
    if (sh->check) {
      r = t_ref_call(&shape, R, (const uint16_t *const *)lg, sp->L,
                        (const int32_t *const *)en, rank, req, bt, R, bt_cols,
                        xo, xv, xi, xs, NULL);
      if (r < 0 || memcmp(ro, xo, (size_t)R * K * 4) ||
          memcmp(io, xi, (size_t)R * K * 4) || memcmp(vo, xv, R * 4) ||
          memcmp(so, xs, R * 4)) {
        HH_ERR(st, "rank %u call %llu: not exact", rank,
               (unsigned long long)cl);
        st->status = 2;
        goto out;
      }
    }
    st->ok++;
    st->ok_since_resume++;
    st->progress = cl + 1;
  }
  (void)resumed_at;
  dcpx_health_info hi = DCPX_HEALTH_INFO_INIT;
  if (dcpx_health(m, &hi) == 0)
    st->reattaches = hi.reattaches;
  /* Leave together (bounded: a rank killed for good never arrives). */
  __atomic_add_fetch(&sh->leaving, 1u, __ATOMIC_SEQ_CST);
  for (unsigned i = 0; i < HH_LEAVE_WAIT_MS &&
                       __atomic_load_n(&sh->leaving, __ATOMIC_SEQ_CST) < sp->W;
       i++)
    hh_sleep_ms(1);
  dcpx_leave(m);
  st->status = 1;
  rc = 0;
out:
  /* A failed rank returns without leaving (its process exit tells dcpxd,
   * as a crash would); everything it allocated goes either way. */
  dcpx_disconnect(c);
  for (uint32_t d = 0; d < sp->W; d++) {
    free(lg[d]);
    free(en[d]);
  }
  free(req), free(bt), free(ro), free(xo), free(io), free(xi);
  free(vo), free(xv), free(so), free(xs);
  return rc;
}

/* Forks a rank process. */
HH_FN pid_t hh_rank_fork(const char *sock, const hh_spec *sp, hh_shared *sh,
                          uint32_t rank, uint64_t first, int replacement) {
  pid_t p = fork();
  if (p == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    _exit(hh_rank_main(sock, sp, sh, rank, first, replacement));
  }
  return p;
}

/* The highest progress of ranks 0..W-1, and the lowest. */
HH_FN uint64_t hh_max_progress(const hh_shared *sh, uint32_t W) {
  uint64_t m = 0;
  for (uint32_t r = 0; r < W; r++)
    if (sh->r[r].progress > m)
      m = sh->r[r].progress;
  return m;
}
HH_FN uint64_t hh_min_progress(const hh_shared *sh, uint32_t W) {
  uint64_t m = UINT64_MAX;
  for (uint32_t r = 0; r < W; r++)
    if (sh->r[r].progress < m)
      m = sh->r[r].progress;
  return m;
}

/* Waits until every rank's progress is >= p (or one of them errs).
 * Returns 0, or -1 after timeout_ms. */
HH_FN int hh_wait_progress(const hh_shared *sh, uint32_t W, uint64_t p,
                            unsigned timeout_ms) {
  uint64_t end = hh_mono() + timeout_ms * 1000000ull;
  while (hh_min_progress(sh, W) < p) {
    for (uint32_t r = 0; r < W; r++)
      if (sh->r[r].status == 2)
        return -1;
    if (hh_mono() > end)
      return -1;
    hh_sleep_ms(2);
  }
  return 0;
}

/* Forks ranks 0..W-1 (pids[r]) and waits until each has made p calls.
 * Returns 0, or -1 as hh_wait_progress. */
HH_FN int hh_ranks_run(const char *sock, const hh_spec *sp, hh_shared *sh,
                       pid_t *pids, uint32_t W, uint64_t p,
                       unsigned timeout_ms) {
  for (uint32_t r = 0; r < W; r++)
    pids[r] = hh_rank_fork(sock, sp, sh, r, 0, 0);
  return hh_wait_progress(sh, W, p, timeout_ms);
}

/* Closes a gate at call `at` (a few calls past hh_max_progress; if the
 * ranks are already past it, at their next call), and waits until every
 * rank stands at it. Returns the call they stopped before, or UINT64_MAX if
 * they did not all get there in 20 s. */
HH_FN uint64_t hh_gate(hh_shared *sh, uint32_t W, uint64_t at) {
  uint64_t end = hh_mono() + 20000000000ull;
  sh->gate_at = UINT64_MAX; /* the old gate must not catch anyone */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  sh->gate_open = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  sh->gate_at = at;
  for (;;) {
    uint64_t g = sh->r[0].at_gate;
    int all = g != 0;
    for (uint32_t r = 1; r < W; r++)
      all = all && sh->r[r].at_gate == g;
    if (all)
      return g - 1;
    if (hh_mono() > end)
      return UINT64_MAX;
    hh_sleep_ms(1);
  }
}

/* Asks every rank to stop a little after the furthest one, and reaps them.
 * Returns how many did not exit 0. */
HH_FN int hh_stop_ranks(hh_shared *sh, const pid_t *pids, uint32_t W) {
  int bad = 0;
  sh->stop_at = hh_max_progress(sh, W) + 2;
  for (uint32_t r = 0; r < W; r++) {
    int st;
    if (pids[r] <= 0)
      continue;
    waitpid(pids[r], &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  sh->leaving = 0; /* for ranks this test forks next */
  return bad;
}

/* The first rank error text, or "". */
HH_FN const char *hh_rank_errors(const hh_shared *sh, uint32_t W) {
  for (uint32_t r = 0; r < W; r++)
    if (sh->r[r].err[0])
      return sh->r[r].err;
  return "";
}

/* Sends a Command frame to the daemon (what dcpxctl fault/reset do), for
 * the benchmark, which should not fork dcpxctl in timed loops. call: the
 * call_seq a fault matches (UINT64_MAX: any). Returns the reply's
 * status. */
HH_FN int hh_command(const char *sock, int kind, const char *group,
                     int32_t rank, uint64_t call, uint64_t ticks) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  Dcpx__Frame f = DCPX__FRAME__INIT, *rep = NULL;
  Dcpx__Hello h = DCPX__HELLO__INIT;
  Dcpx__Command cmd = DCPX__COMMAND__INIT;
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), r;

  if (strlen(sock) >= sizeof(sa.sun_path)) {
    if (s >= 0)
      close(s);
    return DCPX_E_RANGE;
  }
  memcpy(sa.sun_path, sock, strlen(sock) + 1);
  if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    if (s >= 0)
      close(s);
    return DCPX_E_CONNREFUSED;
  }
  h.version = DCPX_PROTO_VERSION;
  f.msg_case = DCPX__FRAME__MSG_HELLO;
  f.hello = &h;
  r = dcpx__frame_send(s, &f, NULL, 0);
  if (r == 0)
    r = dcpx__frame_recv(s, &rep, NULL, 0, NULL);
  dcpx__frame_free(rep);
  rep = NULL;
  if (r == 0) {
    cmd.kind = kind;
    cmd.group = (char *)group;
    cmd.rank = rank;
    cmd.call_tag = call;
    cmd.has_call_tag = call != UINT64_MAX;
    cmd.ticks = ticks;
    f.msg_case = DCPX__FRAME__MSG_COMMAND;
    f.command = &cmd;
    r = dcpx__frame_send(s, &f, NULL, 0);
  }
  if (r == 0)
    r = dcpx__frame_recv(s, &rep, NULL, 0, NULL);
  if (r == 0)
    r = rep->msg_case == DCPX__FRAME__MSG_REPLY ? rep->reply->status
                                                : DCPX_E_PROTO;
  dcpx__frame_free(rep);
  close(s);
  return r;
}

#endif /* DCPX_TESTS_HEALTH_HARNESS_H */
