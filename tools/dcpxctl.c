/* dcpxctl - the operator's tool for dcpxd: groups, health, stats, timeout
 * records, reset and fault injection, as a human-readable tree or --json.
 *
 * It opens an "ops connection" (dcpx.proto: Hello, then one Query or
 * Command), prints the answer and exits with a status that monitoring can
 * act on:
 *
 *   0  ok (for health: every group healthy)
 *   1  unhealthy (health: a group aborted, recovering or unattached, or a
 *      rank dead, awaited, alarmed, failed or unwatched)
 *   2  usage error
 *   3  cannot reach the daemon (not running, no permission, version
 *      mismatch, no answer)
 *   4  the daemon answered with an error (unknown group, refused command)
 *   5  stats --output FILE could not be written
 *
 * except `check`, a monitoring plugin, which exits with the Nagios codes:
 * 0 OK, 1 WARNING, 2 CRITICAL (also when dcpxd is unreachable), 3 UNKNOWN.
 * `stats --format=openmetrics|prometheus` writes metrics for Prometheus.
 *
 * JSON (--json) is written by json-c: compact, one document a line, UTF-8
 * text as it is (a byte of invalid UTF-8 from the daemon becomes '?'), so the
 * output is always valid JSON whatever the daemon sent.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <langinfo.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <dcpx/version.h>

#include "dcpx.h"
#include "dcpxctl-json.h"
#include "dcpxd-util.h"
#include "frame.h"
#include "layout.h"
#include "transport.h"

/* The default socket: libdcpx's, from dcpx.h. */
#define DEFAULT_SOCKET DCPX_DEFAULT_SOCKET

enum {
  EXIT_OK = 0,
  EXIT_UNHEALTHY = 1,
  EXIT_USAGE = 2,
  EXIT_UNREACHABLE = 3,
  EXIT_DAEMON_ERROR = 4,
  EXIT_OUTPUT = 5,
};

enum { FMT_TEXT, FMT_OPENMETRICS, FMT_PROMETHEUS };

static const char *arg_socket;
static bool arg_json;
static int arg_timeout_ms = 10000;

/* ---- parsing helpers ----------------------------------------------------- */

static int usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  fputs("dcpxctl: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs(" (see dcpxctl --help)\n", stderr);
  return EXIT_USAGE;
}

/* What getopt_long found wrong with an option, as text for usage_error or
 * check's status line: opt is its '?' (unknown, ambiguous, or a value given
 * to an option that takes none) or ':' (a missing value; the option string
 * begins with ':', so getopt itself prints nothing). A long option's
 * element is argv[optind - 1]; a short option is optopt, which may sit
 * inside a cluster ("-xh") that optind still points at, with an earlier
 * element at argv[optind - 1]. A long option's error is told from that by
 * optopt: 0 for an unknown or ambiguous name, its val for a missing value
 * (':'), or for "--NAME=VALUE" given to one that takes none. */
static void option_problem(char *b, size_t n, int opt, int argc, char **argv,
                           const struct option *opts) {
  const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
  const size_t len = strcspn(arg, "=");
  const struct option *found = NULL;
  int matches = 0;

  if (strncmp(arg, "--", 2) == 0 && len > 2) {
    for (const struct option *o = opts; o->name; o++)
      if (strncmp(o->name, arg + 2, len - 2) == 0) {
        matches++;
        if (optopt != 0 && o->val == optopt &&
            (opt == ':' ? o->has_arg == required_argument
                        : o->has_arg == no_argument && arg[len] == '='))
          found = o;
      }
    if (optopt == 0) {
      snprintf(b, n, "%s option '%.*s'",
               matches > 1 ? "ambiguous" : "unknown", (int)len, arg);
      return;
    }
    if (found) {
      snprintf(b, n,
               opt == ':' ? "option '--%s' requires an argument"
                          : "option '--%s' takes no argument",
               found->name);
      return;
    }
  }
  if (opt == ':')
    snprintf(b, n, "option '-%c' requires an argument", optopt);
  else if (optopt > 0 && optopt < 128 && isprint(optopt))
    snprintf(b, n, "unknown option '-%c'", optopt);
  else
    snprintf(b, n, "unknown option '%s'", arg);
}

/* A command's bad option, as its other usage errors (exit status 2). */
static int option_error(int opt, int argc, char **argv,
                        const struct option *opts) {
  char b[256];
  option_problem(b, sizeof(b), opt, argc, argv, opts);
  return usage_error("%s", b);
}

/* A number: decimal, or hexadecimal after "0x" (call tags are printed
 * both ways); never octal. */
static bool parse_u64(const char *s, uint64_t *ret) {
  return dcpxd_parse_num(s, ret) == 0;
}

/* A signed number: an optional "-", then what parse_u64 takes. */
static bool parse_i32(const char *s, int32_t *ret) {
  const int neg = s && *s == '-';
  uint64_t v;
  if (!s || !parse_u64(s + neg, &v) || v > INT32_MAX + (uint64_t)neg)
    return false;
  *ret = neg ? (int32_t)-(int64_t)v : (int32_t)v;
  return true;
}

/* A duration: "500" (ns), "500ns", "20us", "5ms", "2s", "3m", "1h", "1d". */
static bool parse_duration_ns(const char *s, uint64_t *ret) {
  static const struct {
    const char *suffix;
    uint64_t mul;
  } units[] = {{"ns", 1},
               {"us", 1000ull},
               {"ms", 1000000ull},
               {"s", 1000000000ull},
               {"m", 60000000000ull},
               {"h", 3600000000000ull},
               {"d", 86400000000000ull},
               {"", 1}};
  char *end;
  if (!s || !*s || *s == '-' || *s == '+')
    return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s)
    return false;
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
    if (strcmp(end, units[i].suffix) == 0) {
      if (v > UINT64_MAX / units[i].mul)
        return false;
      *ret = v * units[i].mul;
      return true;
    }
  return false;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The fraction of a second after a time's seconds, ".123456789" (1 to 9
 * digits), as ns: *end moves past it. No dot: 0 and true. */
static bool parse_frac_ns(const char **end, uint64_t *ret) {
  const char *p = *end;
  uint64_t ns = 0, scale = 100000000ull;
  *ret = 0;
  if (*p != '.')
    return true;
  p++;
  if (*p < '0' || *p > '9')
    return false;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (!scale)
      return false; /* a tenth digit: finer than the records' ns */
    ns += (uint64_t)(*p - '0') * scale;
    scale /= 10;
  }
  *ret = ns;
  *end = p;
  return true;
}

/* A point in time: "now", "10m" (that long ago), "@1700000000" (unix
 * seconds), "2025-11-29T15:00:00Z" (UTC; a space may stand for the T;
 * with up to 9 digits of a second after the seconds, as the records'
 * TIME column prints it: "2025-11-29T15:00:00.065643673Z"), or plain ns
 * since the epoch. A date and time without the Z is refused with
 * *no_zone set: it was taken as UTC, silently, though journalctl and
 * syslog print local time, from which an operator would copy it. */
static bool parse_time_ns(const char *s, uint64_t *ret, bool *no_zone) {
  uint64_t v, frac = 0;
  struct tm tm;
  const char *end;

  *no_zone = false;
  if (!s || !*s)
    return false;
  if (strcmp(s, "now") == 0) {
    *ret = now_ns();
    return true;
  }
  if (s[0] == '@')
    return parse_u64(s + 1, &v) && v <= UINT64_MAX / 1000000000ull &&
           ((*ret = v * 1000000000ull), true);
  memset(&tm, 0, sizeof(tm));
  end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end)
    end = strptime(s, "%Y-%m-%d %H:%M:%S", &tm);
  if (end && !parse_frac_ns(&end, &frac))
    return false;
  if (end && *end == '\0') {
    *no_zone = true;
    return false;
  }
  if (end && strcmp(end, "Z") == 0) {
    const struct tm want = tm;
    struct tm back;
    time_t t = timegm(&tm);
    /* timegm normalises: 2025-02-30 would become 2 March */
    /* A time past 2554-07-21 has no uint64 nanosecond count: refused, as
     * a wrapped one would be a time in the past (records --until
     * 2600-01-01T00:00:00Z listed nothing). */
    if (t < 0 || (uint64_t)t > UINT64_MAX / 1000000000ull ||
        !gmtime_r(&t, &back) || back.tm_year != want.tm_year ||
        back.tm_mon != want.tm_mon || back.tm_mday != want.tm_mday ||
        back.tm_hour != want.tm_hour || back.tm_min != want.tm_min ||
        back.tm_sec != want.tm_sec)
      return false;
    *ret = (uint64_t)t * 1000000000ull;
    if (*ret > UINT64_MAX - frac)
      return false;
    *ret += frac;
    return true;
  }
  if (parse_u64(s, &v)) {
    *ret = v;
    return true;
  }
  if (parse_duration_ns(s, &v)) {
    uint64_t now = now_ns();
    *ret = v > now ? 0 : now - v;
    return true;
  }
  return false;
}

static void format_time(uint64_t ns, char *buf, size_t n) {
  time_t t = (time_t)(ns / 1000000000ull);
  struct tm tm;
  if (ns == 0 || !gmtime_r(&t, &tm)) {
    snprintf(buf, n, "-");
    return;
  }
  size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + k, n - k, ".%09" PRIu64 "Z", (uint64_t)(ns % 1000000000ull));
}

/* ---- talking to dcpxd ---------------------------------------------------- */

static int sock_fd = -1;
/* The last error, for check's status line; check prints only that line
 * (quiet_errors: nothing on stderr). */
static char last_error[704];
static int last_code; /* the dcpx error code of last_error */
static bool quiet_errors;

/* dcpxd cannot be reached (code: the dcpx error code of why): says so on
 * stderr, and with --json also as {"status": code, "error": text, ...} on
 * stdout, as a refusal is; returns EXIT_UNREACHABLE. */
static int die_unreachable(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int die_unreachable(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof(last_error), fmt, ap);
  va_end(ap);
  last_code = code;
  if (!quiet_errors)
    fprintf(stderr, "dcpxctl: %s\n", last_error);
  if (arg_json && !quiet_errors) {
    jw w = jw_start(stdout);
    jw_obj(&w, NULL);
    jw_i64(&w, "status", code);
    jw_str(&w, "error", last_error);
    jw_bool(&w, "unreachable", true);
    jw_obj_end(&w);
    jw_end(&w);
  }
  return EXIT_UNREACHABLE;
}

/* Receives the next frame that is not an Event; NULL on failure (printed). */
static Dcpx__Frame *recv_answer(void) {
  Dcpx__Frame *f = NULL;
  int r = dcpx__frame_recv_answer(sock_fd, arg_timeout_ms, &f);
  if (r == DCPX_E_TIMEDOUT)
    die_unreachable(r, "no answer from dcpxd within %d ms", arg_timeout_ms);
  else if (r < 0)
    die_unreachable(r, "receiving from dcpxd: %s", dcpx_strerror(r));
  return r < 0 ? NULL : f;
}

static int send_frame(const Dcpx__Frame *f) {
  int r = dcpx__frame_send(sock_fd, f, NULL, 0);
  if (r < 0)
    return die_unreachable(r, "sending to dcpxd: %s", dcpx_strerror(r));
  return 0;
}

/* Connects and says Hello (dcpx__ops_connect: $DCPX_SOCKET, the default
 * socket). Returns 0 or an exit status. */
static int connect_daemon(void) {
  char err[512];
  int r = dcpx__ops_connect(arg_socket, "dcpxctl " DCPX_VERSION_STRING,
                            arg_timeout_ms, err, sizeof(err));
  if (r == DCPX_E_INVAL) { /* e.g. a socket path too long: check says it
                             * on its status line, the others on stderr */
    snprintf(last_error, sizeof(last_error), "%s", err);
    last_code = r;
    return quiet_errors ? EXIT_USAGE : usage_error("%s", err);
  }
  if (r < 0)
    return die_unreachable(r, "%s", err);
  sock_fd = r;
  return 0;
}

/* Prints a daemon error (human or JSON) and returns EXIT_DAEMON_ERROR. */
/* A code's symbolic name (DCPX_E_NOENT), or NULL for a code dcpx does not
 * name. */
static const char *code_name(int code) {
  switch (code) {
#define DCPX__NAME(name, value, msg)                                          \
  case value:                                                                  \
    return #name;
    DCPX_ERROR_TABLE(DCPX__NAME)
#undef DCPX__NAME
  default:
    return NULL;
  }
}

/* code_name, or "unknown" for a code dcpx does not name. */
static const char *code_label(int code) {
  const char *n = code_name(code);
  return n ? n : "unknown";
}

/* dcpxd's answer: its message when it sent one, with the code's name
 * after it ("no group 'x' (DCPX_E_NOENT)"), else the code's text. */
static int daemon_error(int status, const char *msg) {
  char why[640];
  const char *name = code_name(status);
  if (msg && *msg && name)
    snprintf(why, sizeof(why), "%s (%s)", msg, name);
  else if (msg && *msg)
    snprintf(why, sizeof(why), "%s (%s)", msg, dcpx_strerror(status));
  else
    snprintf(why, sizeof(why), "%s", dcpx_strerror(status));
  if (arg_json) {
    jw w = jw_start(stdout);
    jw_obj(&w, NULL);
    jw_i64(&w, "status", status);
    jw_str(&w, "error", msg && *msg ? msg : dcpx_strerror(status));
    jw_obj_end(&w);
    jw_end(&w);
  }
  if (!quiet_errors)
    fprintf(stderr, "dcpxctl: dcpxd: %s\n", why);
  snprintf(last_error, sizeof(last_error), "dcpxd: %s", why);
  return EXIT_DAEMON_ERROR;
}

/* Sends f to dcpxd and takes its answer: 0 and *ret, or the exit status. */
static int exchange(const Dcpx__Frame *f, Dcpx__Frame **ret) {
  int r = connect_daemon();
  if (r)
    return r;
  if (send_frame(f) < 0)
    return EXIT_UNREACHABLE;
  *ret = recv_answer();
  return *ret ? 0 : EXIT_UNREACHABLE;
}

static int run_query(Dcpx__Query *q, Dcpx__Frame **ret) {
  Dcpx__Frame f = DCPX__FRAME__INIT, *in;
  int r;
  f.msg_case = DCPX__FRAME__MSG_QUERY;
  f.query = q;
  if ((r = exchange(&f, &in)))
    return r;
  if (in->msg_case == DCPX__FRAME__MSG_REPLY && in->reply) {
    r = daemon_error(in->reply->status ? in->reply->status : DCPX_E_PROTO,
                     in->reply->error);
    dcpx__frame_free(in);
    return r;
  }
  if (in->msg_case != DCPX__FRAME__MSG_QUERY_REPLY || !in->query_reply ||
      !in->query_reply->reply) {
    dcpx__frame_free(in);
    return die_unreachable(DCPX_E_PROTO, "unexpected answer from dcpxd");
  }
  if (in->query_reply->reply->status < 0) {
    r = daemon_error(in->query_reply->reply->status,
                     in->query_reply->reply->error);
    dcpx__frame_free(in);
    return r;
  }
  *ret = in;
  return 0;
}

/* Sends cmd; on success the note of dcpxd's answer (its text with status
 * 0, e.g. a reset that dropped an unattached group) into note (n bytes),
 * "" without one. */
static int run_command(Dcpx__Command *cmd, char *note, size_t n) {
  Dcpx__Frame f = DCPX__FRAME__INIT, *in;
  int r;
  note[0] = '\0';
  f.msg_case = DCPX__FRAME__MSG_COMMAND;
  f.command = cmd;
  if ((r = exchange(&f, &in)))
    return r;
  if (in->msg_case != DCPX__FRAME__MSG_REPLY || !in->reply) {
    dcpx__frame_free(in);
    return die_unreachable(DCPX_E_PROTO, "unexpected answer from dcpxd");
  }
  if (in->reply->status < 0) {
    r = daemon_error(in->reply->status, in->reply->error);
    dcpx__frame_free(in);
    return r;
  }
  if (in->reply->error)
    snprintf(note, n, "%s", in->reply->error);
  dcpx__frame_free(in);
  if (arg_json) {
    jw w = jw_start(stdout);
    jw_obj(&w, NULL);
    jw_i64(&w, "status", 0);
    if (*note)
      jw_str(&w, "note", note);
    jw_end(&w);
  }
  return EXIT_OK;
}

/* ---- rendering ----------------------------------------------------------- */

/* The name tables are common/transport.c's, shared with dcpxd (the
 * protobuf enums have the public constants' values). */
static const char *transport_name(int t) {
  return dcpx__transport_name((uint32_t)t);
}
static const char *backend_name(int b) {
  return dcpx__backend_name((uint32_t)b);
}

/* The rank's GPU UUID as nvidia-smi writes it ("GPU-" and the 16 bytes in
 * hex, grouped 8-4-4-4-12); false when it sent none. */
static bool gpu_uuid(const Dcpx__RankInfo *r, char *out, size_t n) {
  const uint8_t *u = r->device_uuid.data;
  if (r->device_uuid.len != 16 || n < 41)
    return false;
  snprintf(out, n,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x"
           "%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
           u[11], u[12], u[13], u[14], u[15]);
  return true;
}

static bool recovering(const Dcpx__GroupInfo *g) {
  return g->state && strcmp(g->state, "recovering") == 0;
}

/* A rank's state; the bad ones in capitals for humans (`shout`), all in
 * lower case for JSON. */
static const char *rank_state(const Dcpx__GroupInfo *g, const Dcpx__RankInfo *r,
                              bool shout) {
  if (r->failed)
    return shout ? "FAILED" : "failed";
  if (r->alarm)
    return shout ? "ALARM" : "alarm";
  if (!r->joined && r->rank < 32 && ((g->awaiting_reattach >> r->rank) & 1u))
    return shout ? "AWAITED" : "awaited"; /* since dcpxd restarted */
  if (!r->joined)
    return strcmp(g->state, "forming") == 0 ? "waiting"
           : shout                          ? "DEAD"
                                            : "dead";
  return "live";
}

static double rescue_rate(uint64_t rescue, uint64_t rows) {
  return rows ? (double)rescue / (double)rows : 0.0;
}

/* "rescue_rate": rescued rows / rows, null without rows (the text's
 * "-"). */
static void json_rate(jw *w, uint64_t rescue, uint64_t rows) {
  if (rows)
    jw_double(w, "rescue_rate", rescue_rate(rescue, rows));
  else
    jw_null(w, "rescue_rate");
}

/* A timeout whose slot held the awaited row half under another call half
 * (dcpx_tag_other_call, docs/PROTOCOL.md 4.3 and 6.2): the awaited rank
 * stored that row in another call. */
static bool other_call(const Dcpx__Record *rec) {
  return rec->kind == DCPX_REC_TIMEOUT &&
         dcpx_tag_other_call(rec->region, rec->expected, rec->seen);
}

static void json_record(jw *w, const char *key, const Dcpx__Record *r) {
  char t[64];
  format_time(r->time_ns, t, sizeof(t));
  jw_obj(w, key);
  jw_str(w, "group", r->group);
  jw_u64(w, "generation", r->generation);
  jw_u64(w, "rank", r->rank);
  jw_str(w, "kind", dcpx_rec_kind_name(r->kind));
  jw_u64(w, "region", r->region);
  jw_str(w, "region_name", r->region_name);
  jw_u64(w, "index", r->index);
  jw_u64(w, "expected", r->expected);
  jw_u64(w, "seen", r->seen);
  jw_u64(w, "block", r->block);
  jw_u64(w, "call_tag", r->call_tag);
  jw_u64(w, "time_ns", r->time_ns);
  jw_str(w, "time", t);
  if (r->has_awaited_rank)
    jw_u64(w, "awaited_rank", r->awaited_rank);
  else
    jw_null(w, "awaited_rank"); /* unknown (dcpx.proto), never rank 0 */
  jw_bool(w, "other_call", other_call(r));
  jw_obj_end(w);
}

static void json_shape(jw *w, const Dcpx__Shape *s) {
  jw_obj(w, "shape");
  jw_u64(w, "world", s->world);
  jw_u64(w, "rows", s->rows);
  jw_u64(w, "topk", s->topk);
  jw_u64(w, "local_topk", s->local_topk);
  jw_u64(w, "block_size", s->block_size);
  jw_u64(w, "interleave", s->interleave);
  jw_u64(w, "max_local", s->max_local);
  jw_obj_end(w);
}

/* A group's counts, summed over its ranks. */
typedef struct json_totals {
  uint64_t calls, rows, rescue, failed;
} json_totals;

/* The rank's fault hook, flat (a rank's object has no nested one):
 * "fault" none, armed or fired; what it was armed with, or nulls. */
static void json_fault(jw *w, const Dcpx__RankInfo *r) {
  static const char *const state[] = {"none", "armed", "fired"};
  const bool hook = r->fault == DCPX__RANK_INFO__FAULT_HOOK__FAULT_ARMED ||
                    r->fault == DCPX__RANK_INFO__FAULT_HOOK__FAULT_FIRED;
  jw_str(w, "fault", state[hook ? r->fault : 0]);
  if (hook && r->fault_epoch)
    jw_u64(w, "fault_epoch", r->fault_epoch);
  else
    jw_null(w, "fault_epoch"); /* any epoch, or no hook */
  if (hook && !r->fault_any_call)
    jw_u64(w, "fault_call", r->fault_call);
  else
    jw_null(w, "fault_call"); /* any call, or no hook */
  if (hook)
    jw_u64(w, "fault_ticks_ns", r->fault_ticks);
  else
    jw_null(w, "fault_ticks_ns");
}

/* Rank r of group g, added to *t. */
static void json_rank(jw *w, const Dcpx__GroupInfo *g,
                      const Dcpx__RankInfo *r, json_totals *t) {
  char uuid[48];
  jw_obj(w, NULL);
  jw_u64(w, "rank", r->rank);
  jw_str(w, "state", rank_state(g, r, false));
  jw_bool(w, "joined", r->joined);
  jw_u64(w, "pid", r->pid);
  if (r->pid) /* a rank that never joined has neither */
    jw_i64(w, "device", r->device);
  else
    jw_null(w, "device");
  if (gpu_uuid(r, uuid, sizeof(uuid)))
    jw_str(w, "device_uuid", uuid);
  else
    jw_null(w, "device_uuid");
  jw_bool(w, "alarm", r->alarm);
  jw_bool(w, "failed", r->failed);
  if (recovering(g))
    jw_bool(w, "acknowledged", r->acknowledged);
  else
    jw_null(w, "acknowledged");
  jw_u64(w, "calls", r->calls);
  jw_u64(w, "rows", r->rows);
  jw_u64(w, "rescue_rows", r->rescue_rows);
  jw_u64(w, "failed_calls", r->failed_calls);
  jw_u64(w, "timeouts", r->timeouts);
  jw_u64(w, "awaited_timeouts", r->awaited_timeouts);
  json_rate(w, r->rescue_rows, r->rows);
  json_fault(w, r);
  jw_obj_end(w);
  t->rows += r->rows;
  t->rescue += r->rescue_rows;
  t->calls += r->calls;
  t->failed += r->failed_calls;
}

/* A group dcpxd restarted without: only its name, world and live ranks
 * are known until one of them reattaches (dcpxd-query.c). */
static bool unattached(const Dcpx__GroupInfo *g) {
  return g->state && strcmp(g->state, "unattached") == 0;
}

/* Key `key` as n, or null where the group is unattached (not known). */
static void json_known_u64(jw *w, const char *key, uint64_t n, bool un) {
  if (un)
    jw_null(w, key);
  else
    jw_u64(w, key, n);
}

static void json_known_str(jw *w, const char *key, const char *s, bool un) {
  if (un)
    jw_null(w, key);
  else
    jw_str(w, key, s);
}

/* Group g: what dcpxd knows of it, its ranks and their totals. Of an
 * unattached group (dcpxd restarted, no rank back yet) it knows the name,
 * state, world and the live ranks awaited: the rest is null, as its
 * metrics leave it out, not a 0 or a default that reads as a value. */
static void json_group(jw *w, const Dcpx__GroupInfo *g, bool ok) {
  json_totals t = {0};
  const bool un = unattached(g);
  jw_obj(w, NULL);
  jw_str(w, "name", g->name);
  jw_str(w, "state", g->state);
  jw_bool(w, "healthy", ok);
  json_known_u64(w, "generation", g->generation, un);
  json_known_u64(w, "abort", g->abort, un);
  json_known_str(w, "abort_reason", dcpx__abort_reason_name(g->abort), un);
  jw_u64(w, "joined", g->joined);
  if (g->shape) {
    jw_u64(w, "world", g->shape->world);
    if (un)
      jw_null(w, "shape");
    else
      json_shape(w, g->shape);
  }
  json_known_str(w, "transport", transport_name(g->transport), un);
  json_known_str(w, "backend", backend_name(g->backend), un);
  json_known_u64(w, "timeout_ns", g->timeout_ns, un);
  json_known_u64(w, "aborts", g->aborts, un);
  json_known_u64(w, "recoveries", g->recoveries, un);
  jw_bool(w, "adopted", g->adopted);
  jw_u64(w, "awaiting_reattach", g->awaiting_reattach);
  jw_arr(w, "ranks");
  for (size_t k = 0; k < g->n_ranks; k++)
    if (g->ranks[k])
      json_rank(w, g, g->ranks[k], &t);
  jw_arr_end(w);
  jw_obj(w, "totals");
  jw_u64(w, "calls", t.calls);
  jw_u64(w, "rows", t.rows);
  jw_u64(w, "rescue_rows", t.rescue);
  jw_u64(w, "failed_calls", t.failed);
  json_rate(w, t.rescue, t.rows);
  jw_obj_end(w);
  if (g->last_record)
    json_record(w, "last_record", g->last_record);
  else
    jw_null(w, "last_record");
  jw_obj_end(w);
}

/* dcpxd cannot save its groups file: no group can form
 * (QueryReply.state_error). */
static bool state_failing(const Dcpx__QueryReply *qr) {
  return qr->state_error && *qr->state_error;
}

static void json_refusals(jw *w, const Dcpx__QueryReply *qr) {
  jw_arr(w, "refused_reattaches");
  for (size_t i = 0; i < qr->n_refused_reattaches; i++) {
    const Dcpx__ReattachRefusal *r = qr->refused_reattaches[i];
    jw_obj(w, NULL);
    jw_str(w, "group", r->group);
    jw_u64(w, "rank", r->rank);
    jw_i64(w, "pid", r->pid);
    jw_str(w, "status", code_label(r->status));
    jw_str(w, "reason", r->reason);
    jw_u64(w, "attempts", r->attempts);
    jw_u64(w, "last_ns", r->last_ns);
    jw_obj_end(w);
  }
  jw_arr_end(w);
}

static void json_groups(const Dcpx__QueryReply *qr, bool with_health) {
  jw w = jw_start(stdout);
  bool all_ok = true;

  jw_obj(&w, NULL);
  jw_arr(&w, "groups");
  for (size_t i = 0; i < qr->n_groups; i++) {
    bool ok = dcpx__group_info_healthy(qr->groups[i]);
    all_ok = all_ok && ok;
    json_group(&w, qr->groups[i], ok);
  }
  jw_arr_end(&w);
  json_refusals(&w, qr);
  if (state_failing(qr))
    jw_str(&w, "state_error", qr->state_error);
  else
    jw_null(&w, "state_error");
  if (with_health)
    jw_bool(&w, "healthy", all_ok && !qr->n_refused_reattaches &&
                               !state_failing(qr));
  jw_u64(&w, "groups_left_out", qr->groups_left_out);
  if (qr->records_note && *qr->records_note)
    jw_str(&w, "note", qr->records_note);
  jw_obj_end(&w);
  jw_end(&w);
}


/* dcpxd's note on its answer (what it left out), for a reader. */
static void human_note(const Dcpx__QueryReply *qr) {
  if (qr->records_note && *qr->records_note)
    fprintf(stderr, "note: %s\n", qr->records_note);
}

static void print_shape(const Dcpx__GroupInfo *g) {
  if (!g->shape || unattached(g))
    return;
  printf("rows=%u topk=%u local_topk=%u block=%u interleave=%u "
         "max_local=%u",
         g->shape->rows, g->shape->topk, g->shape->local_topk,
         g->shape->block_size, g->shape->interleave, g->shape->max_local);
}

/* Ranks that run unwatched: dcpxd refused their reattach (text). */
static void human_refusals(const Dcpx__QueryReply *qr) {
  for (size_t i = 0; i < qr->n_refused_reattaches; i++) {
    const Dcpx__ReattachRefusal *r = qr->refused_reattaches[i];
    printf("! %s rank %u (pid %d): reattach refused %" PRIu64 " time%s, "
           "runs unwatched by dcpxd: %s (%s)\n",
           r->group, r->rank, (int)r->pid, r->attempts,
           r->attempts == 1 ? "" : "s", r->reason,
           code_label(r->status));
  }
}

/* dcpxd cannot save its groups file: no group can form (text). */
static void human_state_error(const Dcpx__QueryReply *qr) {
  if (state_failing(qr))
    printf("! dcpxd %s\n", qr->state_error);
}

static void human_groups(const Dcpx__QueryReply *qr) {
  human_state_error(qr);
  human_refusals(qr); /* ranks that run, unwatched: not "no groups" alone */
  if (qr->n_groups == 0) {
    printf("no groups\n");
    return;
  }
  printf("%-24s %-10s %5s %6s %-9s %-7s %s\n", "GROUP", "STATE", "GEN", "RANKS",
         "TRANSPORT", "BACKEND", "SHAPE");
  for (size_t i = 0; i < qr->n_groups; i++) {
    const Dcpx__GroupInfo *g = qr->groups[i];
    char ranks[32];
    snprintf(ranks, sizeof(ranks), "%u/%u", g->joined,
             g->shape ? g->shape->world : 0);
    printf("%-24s %-10s %5u %6s %-9s %-7s ", g->name, g->state, g->generation,
           ranks, unattached(g) ? "-" : transport_name(g->transport),
           unattached(g) ? "-" : backend_name(g->backend));
    print_shape(g);
    putchar('\n');
  }
  human_note(qr); /* groups left out */
}



/* A rank's fault hook on its line: "fault armed (call 5, epoch any,
 * 1200000000 ns)", "fault fired (...)", or nothing. */
static void human_fault(const Dcpx__RankInfo *r) {
  char call[24] = "any", epoch[16] = "any";
  if (r->fault != DCPX__RANK_INFO__FAULT_HOOK__FAULT_ARMED &&
      r->fault != DCPX__RANK_INFO__FAULT_HOOK__FAULT_FIRED)
    return;
  if (!r->fault_any_call)
    snprintf(call, sizeof(call), "%" PRIu64, r->fault_call);
  if (r->fault_epoch)
    snprintf(epoch, sizeof(epoch), "%u", r->fault_epoch);
  printf("  fault %s (call %s, epoch %s, %" PRIu64 " ns)",
         r->fault == DCPX__RANK_INFO__FAULT_HOOK__FAULT_FIRED ? "fired"
                                                              : "armed",
         call, epoch, r->fault_ticks);
}

/* One rank's line of group g, under branch (a tree's tee or elbow). */
static void human_rank(const Dcpx__GroupInfo *g, const Dcpx__RankInfo *r,
                       const char *branch, bool stats) {
  char dev[16] = "-", uuid[48];
  if (r->pid)
    snprintf(dev, sizeof(dev), "%d", (int)r->device);
  if (r->pid && gpu_uuid(r, uuid, sizeof(uuid)))
    snprintf(dev + strlen(dev), sizeof(dev) - strlen(dev), " %.12s",
             uuid); /* "GPU-" and 8 hex digits: enough to tell GPUs apart */
  printf("  %s rank %-2u %-7s pid %-7u device %-3s calls %-10" PRIu64,
         branch, r->rank, rank_state(g, r, true), r->pid, dev, r->calls);
  if (r->rows)
    printf(" rescue %6.2f%%", 100.0 * rescue_rate(r->rescue_rows, r->rows));
  else
    printf(" rescue      -");
  if (stats)
    printf("  rows %" PRIu64 " rescued %" PRIu64 " failed_calls %" PRIu64,
           r->rows, r->rescue_rows, r->failed_calls);
  else if (r->failed_calls)
    printf("  failed_calls %" PRIu64, r->failed_calls);
  if (r->awaited_timeouts) /* the others timed out waiting for this one */
    printf("  awaited_timeouts %" PRIu64, r->awaited_timeouts);
  if (recovering(g)) /* who holds the recovery up */
    printf("  %s", r->acknowledged ? "acknowledged" : "NOT ACKNOWLEDGED");
  human_fault(r);
  /* A rank that failed, then left or died: its state says FAILED (or
   * ALARM), what it last was; its pid is gone (JSON: "joined": false). */
  const bool awaited =
      r->rank < 32 && ((g->awaiting_reattach >> r->rank) & 1u);
  if (!r->joined && r->pid && (r->failed || r->alarm) && !awaited)
    printf("  gone (left or died)"); /* an awaited rank lives on */
  putchar('\n');
}

/* Group g's first line: its name, state, ranks, aborts and recoveries. */
static void human_group_head(const Dcpx__GroupInfo *g) {
  printf("%s %s: %s, generation %u, %u/%u ranks",
         dcpx__group_info_healthy(g) ? "*" : "!", g->name, g->state,
         g->generation, g->joined, g->shape ? g->shape->world : 0);
  if (g->abort)
    printf(", abort=%s", dcpx__abort_reason_name(g->abort));
  printf(", %" PRIu64 " abort%s, %" PRIu64 " recover%s", g->aborts,
         g->aborts == 1 ? "" : "s", g->recoveries,
         g->recoveries == 1 ? "y" : "ies");
  if (g->adopted)
    printf(", adopted after a dcpxd restart");
  if (g->awaiting_reattach) {
    printf(" (awaiting ranks");
    for (uint32_t k = 0; k < 32; k++)
      if ((g->awaiting_reattach >> k) & 1u)
        printf(" %u", k);
    printf(")");
  }
  putchar('\n');
}

/* Group g as a tree: its head, its set-up, its ranks and last record. */
static void human_group(const Dcpx__GroupInfo *g, bool stats, const char *tee,
                        const char *elbow) {
  uint64_t rows = 0, rescue = 0, calls = 0, failed = 0;

  human_group_head(g);
  if (unattached(g)) {
    printf("  not reattached since dcpxd restarted: its live ranks come "
           "back at their next dcpx_poll (or recover, or leave)\n");
    return;
  }
  printf("  %s transport, %s backend, wait timeout %.3f ms, ",
         transport_name(g->transport), backend_name(g->backend),
         (double)g->timeout_ns / 1e6);
  print_shape(g);
  putchar('\n');
  for (size_t k = 0; k < g->n_ranks; k++)
    if (g->ranks[k]) {
      rows += g->ranks[k]->rows;
      rescue += g->ranks[k]->rescue_rows;
      calls += g->ranks[k]->calls;
      failed += g->ranks[k]->failed_calls;
    }
  if (stats)
    printf("  totals: %" PRIu64 " calls, %" PRIu64 " rows, %" PRIu64
           " rescued (%.2f%%), %" PRIu64 " failed calls\n",
           calls, rows, rescue, 100.0 * rescue_rate(rescue, rows), failed);
  for (size_t k = 0; k < g->n_ranks; k++)
    if (g->ranks[k])
      human_rank(g, g->ranks[k],
                 k + 1 == g->n_ranks && !g->last_record ? elbow : tee, stats);
  if (g->last_record) {
    const Dcpx__Record *rec = g->last_record;
    char t[64], from[32] = "";
    format_time(rec->time_ns, t, sizeof(t));
    if (rec->has_awaited_rank)
      snprintf(from, sizeof(from), " from rank %u", rec->awaited_rank);
    printf("  %s last record: gen %u rank %u waited on %s[%u]%s for tag "
           "0x%08x, saw 0x%08x (block %u, call %" PRIu64 ") at %s%s\n",
           elbow, rec->generation, rec->rank, rec->region_name, rec->index,
           from, rec->expected, rec->seen, rec->block, rec->call_tag, t,
           other_call(rec) ? "; the slot held that rank's list of another "
                             "call (the ranks' calls disagree)"
                           : "");
  }
}

static void human_health(const Dcpx__QueryReply *qr, bool stats) {
  const bool utf8 = strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
  const char *tee = utf8 ? "\u251c\u2500" : "|-";
  const char *elbow = utf8 ? "\u2514\u2500" : "`-";

  human_state_error(qr);
  human_refusals(qr);
  if (qr->n_groups == 0) {
    if (!qr->n_refused_reattaches)
      printf("no groups\n");
    return;
  }
  for (size_t i = 0; i < qr->n_groups; i++)
    human_group(qr->groups[i], stats, tee, elbow);
  human_note(qr);
}

/* ---- metrics: OpenMetrics and Prometheus text ---------------------------- */

/* A label value, escaped as both formats want (\\, \", \n). */
static void metric_label(const char *v) {
  for (const char *p = v ? v : ""; *p; p++) {
    if (*p == '\\')
      fputs("\\\\", stdout);
    else if (*p == '"')
      fputs("\\\"", stdout);
    else if (*p == '\n')
      fputs("\\n", stdout);
    else
      putchar(*p);
  }
}

enum {
  M_CALLS,
  M_ROWS,
  M_RESCUE_ROWS,
  M_FAILED_CALLS,
  M_TIMEOUTS,
  M_AWAITED_TIMEOUTS,
  M_RANK_JOINED,
  M_RANK_ALARM,
  M_RANK_FAILED,
  M_GROUP_INFO,
  M_GENERATION,
  M_JOINED,
  M_WORLD,
  M_ABORTED,
  M_ABORTS,
  M_RECOVERIES,
  M_TIMEOUT_SECONDS,
};

static const struct {
  int id;
  const char *name; /* the family; counters get _total, info _info */
  const char *type; /* counter, gauge, info */
  bool per_rank;
  const char *help;
} metric_defs[] = {
    {M_CALLS, "dcpx_calls", "counter", true,
     "Calls completed by the rank (since it joined the group)"},
    {M_ROWS, "dcpx_rows", "counter", true, "Rows merged by the rank"},
    {M_RESCUE_ROWS, "dcpx_rescue_rows", "counter", true,
     "Rows that needed a rescue round"},
    {M_FAILED_CALLS, "dcpx_failed_calls", "counter", true,
     "Calls that failed (timeout, abort)"},
    {M_TIMEOUTS, "dcpx_timeouts", "counter", true,
     "Wait timeouts of the rank seen by dcpxd (from 0 at its start)"},
    {M_AWAITED_TIMEOUTS, "dcpx_awaited_timeouts", "counter", true,
     "Timeouts other ranks recorded while waiting for this rank, where the "
     "layout names it (from 0 at dcpxd's start)"},
    {M_RANK_JOINED, "dcpx_rank_joined", "gauge", true,
     "1 when the rank is attached to the group"},
    {M_RANK_ALARM, "dcpx_rank_alarm", "gauge", true,
     "1 when the rank raised an alarm"},
    {M_RANK_FAILED, "dcpx_rank_failed", "gauge", true,
     "1 while the rank is FAILED (a call of it failed; until the next recovery)"},
    {M_GROUP_INFO, "dcpx_group", "info", false,
     "The group's state, transport and backend"},
    {M_GENERATION, "dcpx_group_generation", "gauge", false,
     "The group's generation (1 + recoveries)"},
    {M_JOINED, "dcpx_group_joined_ranks", "gauge", false,
     "Ranks joined to the group"},
    {M_WORLD, "dcpx_group_world_size", "gauge", false,
     "Ranks the group was created for"},
    {M_ABORTED, "dcpx_group_aborted", "gauge", false,
     "1 when the group is aborted"},
    {M_ABORTS, "dcpx_group_aborts", "counter", false, "Aborts of the group"},
    {M_RECOVERIES, "dcpx_group_recoveries", "counter", false,
     "Recoveries of the group"},
    {M_TIMEOUT_SECONDS, "dcpx_group_wait_timeout_seconds", "gauge", false,
     "The group's bounded-wait timeout"},
};

/* qr: the STATS answer. om: OpenMetrics 1.0 (a counter family "x" has samples "x_total", the text
 * ends with "# EOF"); else the Prometheus text format 0.0.4 (the family is
 * named as its samples). */
static const char left_out_help[] =
    "Groups this scrape left out for dcpxd's reply size limit (the "
    "healthy ones: the others come first)";
static const char state_help[] =
    "1 while dcpxd cannot save its groups file (a full disk, a read-only "
    "state dir): no new group can form";

/* A family's HELP and TYPE lines, and UNIT, in the format's order: the
 * OpenMetrics family is named without its samples' suffix; the Prometheus
 * text names it as its samples and has no info type (a gauge of 1). */
static void metric_family(const char *name, const char *suffix,
                          const char *type, const char *help,
                          const char *unit, bool om) {
  if (om) {
    printf("# TYPE %s %s\n", name, type);
    printf("# HELP %s %s.\n", name, help);
    if (unit)
      printf("# UNIT %s %s\n", name, unit);
  } else {
    printf("# HELP %s%s %s.\n", name, suffix, help);
    printf("# TYPE %s%s %s\n", name, suffix,
           strcmp(type, "info") == 0 ? "gauge" : type);
  }
}

/* A sample's name and its group label, up to the closing quote. */
static void metric_sample(const char *name, const char *suffix,
                          const Dcpx__GroupInfo *g) {
  printf("%s%s{group=\"", name, suffix);
  metric_label(g->name);
}

/* Group g's sample of group family id (name, suffix). */
static void group_metric(const Dcpx__GroupInfo *g, int id, const char *name,
                         const char *suffix) {
  /* A group dcpxd knows only from its groups file (restarted, no rank back
   * yet): its name, world and state; its generation, abort state, counts
   * and timeout are not known, and a 0 would read as a value */
  const bool un = unattached(g);
  if (un && id != M_GROUP_INFO && id != M_WORLD && id != M_JOINED)
    return;
  metric_sample(name, suffix, g);
  if (id == M_GROUP_INFO) {
    printf("\",state=\"");
    metric_label(g->state);
    printf("\",transport=\"%s\",backend=\"%s\"} 1\n",
           un ? "unknown" : transport_name(g->transport),
           un ? "unknown" : backend_name(g->backend));
    return;
  }
  printf("\"} ");
  switch (id) {
  case M_GENERATION:
    printf("%u\n", g->generation);
    break;
  case M_JOINED:
    printf("%u\n", g->joined);
    break;
  case M_WORLD:
    printf("%u\n", g->shape ? g->shape->world : 0);
    break;
  case M_ABORTED:
    printf("%d\n", (g->state && strcmp(g->state, "aborted") == 0) ||
                       g->abort != 0);
    break;
  case M_ABORTS:
    printf("%" PRIu64 "\n", g->aborts);
    break;
  case M_RECOVERIES:
    printf("%" PRIu64 "\n", g->recoveries);
    break;
  case M_TIMEOUT_SECONDS:
    printf("%.9f\n", (double)g->timeout_ns / 1e9);
    break;
  default:
    printf("0\n");
  }
}

/* Rank r's value of per-rank family id. */
static uint64_t rank_metric(const Dcpx__RankInfo *r, int id) {
  switch (id) {
  case M_CALLS:
    return r->calls;
  case M_ROWS:
    return r->rows;
  case M_RESCUE_ROWS:
    return r->rescue_rows;
  case M_FAILED_CALLS:
    return r->failed_calls;
  case M_TIMEOUTS:
    return r->timeouts;
  case M_AWAITED_TIMEOUTS:
    return r->awaited_timeouts;
  case M_RANK_JOINED:
    return r->joined;
  case M_RANK_ALARM:
    return r->alarm;
  case M_RANK_FAILED:
    return r->failed;
  default:
    return 0;
  }
}

static void metrics_out(const Dcpx__QueryReply *qr, bool om) {
  for (size_t m = 0; m < sizeof(metric_defs) / sizeof(metric_defs[0]); m++) {
    const char *name = metric_defs[m].name, *type = metric_defs[m].type;
    const char *suffix = strcmp(type, "counter") == 0 ? "_total"
                         : strcmp(type, "info") == 0  ? "_info"
                                                      : "";
    int id = metric_defs[m].id;
    metric_family(name, suffix, type, metric_defs[m].help,
                  id == M_TIMEOUT_SECONDS ? "seconds" : NULL, om);
    for (size_t i = 0; i < qr->n_groups; i++) {
      const Dcpx__GroupInfo *g = qr->groups[i];
      if (!metric_defs[m].per_rank) {
        group_metric(g, id, name, suffix);
        continue;
      }
      for (size_t k = 0; k < g->n_ranks; k++) {
        const Dcpx__RankInfo *r = g->ranks[k];
        if (!r)
          continue;
        metric_sample(name, suffix, g);
        printf("\",rank=\"%u\"} %" PRIu64 "\n", r->rank, rank_metric(r, id));
      }
    }
  }
  /* Groups the reply had no room for (dcpxd puts the unhealthy first):
   * an alert on it says the scrape is not the whole node. */
  metric_family("dcpx_groups_left_out", "", "gauge", left_out_help, NULL, om);
  printf("dcpx_groups_left_out %u\n", qr->groups_left_out);
  metric_family("dcpx_state_save_failing", "", "gauge", state_help, NULL, om);
  printf("dcpx_state_save_failing %d\n",
         state_failing(qr) ? 1 : 0);
  if (om)
    printf("# EOF\n");
}

/* ---- help on each command ---------------------------------------------- */

static const struct {
  const char *name, *text;
} cmd_help[] = {
    {"groups", "Usage: dcpxctl groups [OPTIONS]\n"
               "List the groups: state, generation, ranks joined, transport,\n"
               "backend and shape.\n"},
    {"health", "Usage: dcpxctl health [GROUP] [OPTIONS]\n"
               "The groups' ranks (or GROUP's): state, pid, device, calls,\n"
               "rescue rate, the last timeout record. Exit status 1 when a\n"
               "group is aborted, recovering or unattached, or a rank dead,\n"
               "awaited (not back since a dcpxd restart), alarmed or failed,\n"
               "or running unwatched (dcpxd refused its reattach).\n"},
    {"stats", "Usage: dcpxctl stats [GROUP] [--format=FORMAT] [--output=FILE]\n"
              "                     [OPTIONS]\n"
              "Per-rank calls, rows, rescued rows and failed calls.\n"
              "\n"
              "  --format=text         the tree (the default)\n"
              "  --format=json         the same as --json\n"
              "  --format=openmetrics  OpenMetrics text for Prometheus, per\n"
              "                        group and rank (ends with # EOF)\n"
              "  --format=prometheus   Prometheus text format 0.0.4, for the\n"
              "                        node_exporter textfile collector\n"
              "  --output=FILE         write to FILE instead of stdout: to a\n"
              "                        temporary file renamed to FILE once\n"
              "                        complete (exit status 5 if it cannot)\n"},
    {"records",
     "Usage: dcpxctl records [--group G] [--rank R] [--since T] [--until T]\n"
     "                       [--limit N] [OPTIONS]\n"
     "Timeout records, oldest first. AWAITED_RANK: the rank whose list\n"
     "the wait never got, or - when dcpxd cannot tell.\n"
     "\n"
     "  --group G   only group G\n"
     "  --rank R    only rank R, 0..15 (-1: any)\n"
     "  --since T   only records at or after T\n"
     "  --until T   only records before T\n"
     "  --limit N   only the newest N (N >= 1)\n"
     "\n"
     "Times (T): now, 10m / 2h / 1d (that long ago), @UNIXSECONDS,\n"
     "2025-01-31T12:00:00Z (UTC; the Z is required, a space may replace\n"
     "the T; up to 9 digits of a second may follow the seconds, as the\n"
     "TIME column prints them: 2025-01-31T12:00:00.065643673Z), or\n"
     "nanoseconds since the epoch.\n"},
    {"reset", "Usage: dcpxctl reset --group G [OPTIONS]\n"
              "Abort group G (if it is not yet) and recover it: its ranks\n"
              "drain, acknowledge and resume at the next generation. Needs\n"
              "an admin (root, or the daemon's uid or admin group).\n"},
    {"fault",
     "Usage: dcpxctl fault stall --group G --rank R [--epoch E] [--call C]\n"
     "                           --ticks T [OPTIONS]\n"
     "       dcpxctl fault clear --group G --rank R [OPTIONS]\n"
     "stall: stall block 0 of rank R once for T, at most the group's wait\n"
     "timeout (needs dcpxd --enable-fault-injection; not on the nccl\n"
     "transport). The hook waits for its call, and a recovery disarms it\n"
     "(health shows it, armed or fired); clear disarms it. Both need an\n"
     "admin.\n"
     "\n"
     "  --group G   the group\n"
     "  --rank R    the rank that stalls\n"
     "  --epoch E   the call in which row 0's epoch (the row half of its\n"
     "              tag) is E: the E-th call since the rank joined or the\n"
     "              group last recovered, modulo 65534 (0: any; 1..65534)\n"
     "  --call C    the C-th call since the rank joined or the group last\n"
     "              recovered (1 = the first, up to 2^64-2; not the\n"
     "              engine's call tag; left out: any call)\n"
     "  --ticks T   the stall: nanoseconds, or a number with ns, us, ms, s,\n"
     "              m, h or d\n"},
    {"check",
     "Usage: dcpxctl check [GROUP] [THRESHOLDS] [--socket PATH] [--timeout SEC]\n"
     "A monitoring check (Nagios, Icinga, Sensu): one line of status text\n"
     "and the plugin exit codes.\n"
     "\n"
     "  --rescue-warning PCT    WARNING when a group's rescue rate (rescued\n"
     "                          rows / rows) is over PCT percent (default 50;\n"
     "                          100 never warns)\n"
     "  --rescue-critical PCT   CRITICAL when over PCT percent (default 100:\n"
     "                          never)\n"
     "  --records-window DUR    timeout records this recent count (default\n"
     "                          15m; with a unit: ns, us, ms, s, m, h, d)\n"
     "  --records-warning N     WARNING at N or more recent timeout records\n"
     "                          (default 1; 0: never)\n"
     "  --records-critical N    CRITICAL at N or more (default 0: never)\n"
     "\n"
     "CRITICAL: a group aborted, a rank failed, dead or alarmed, dcpxd\n"
     "unable to save its groups file (no new group can form), or dcpxd\n"
     "unreachable. WARNING: a group recovering or unattached, a rank\n"
     "awaiting its reattach after a dcpxd restart or running unwatched\n"
     "(dcpxd refused its reattach), recent timeout records, records dcpxd\n"
     "could not store yet (a full disk), groups left out of dcpxd's reply\n"
     "(healthy ones: check them by name), or a rescue rate over the\n"
     "threshold. A critical threshold below its warning one is refused\n"
     "(UNKNOWN).\n"
     "\n"
     "Exit status: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (usage error,\n"
     "dcpxd answered with an error, e.g. an unknown GROUP, the caller is no\n"
     "admin, or it may not reach dcpxd: permission denied, a uid not\n"
     "allowed; or the status line could not be written).\n"},
};

static const char common_opts_help[] =
    "\n"
    "Options of every command:\n"
    "  --socket PATH   dcpxd's socket (default $DCPX_SOCKET, else\n"
    "                  " DEFAULT_SOCKET ")\n"
    "  --json          machine-readable output (check refuses it)\n"
    "  --timeout SEC   wait at most SEC seconds for an answer (default 10)\n"
    "  -h, --help      this text\n";

/* Prints the help of command `name`; returns EXIT_OK. */
static void help(void);

static int cmd_usage(const char *name) {
  /* help's own help (help help, help --help, help -h): the overview */
  if (strcmp(name, "help") == 0 || strcmp(name, "--help") == 0 ||
      strcmp(name, "-h") == 0) {
    help();
    return EXIT_OK;
  }
  for (size_t i = 0; i < sizeof(cmd_help) / sizeof(cmd_help[0]); i++)
    if (strcmp(cmd_help[i].name, name) == 0) {
      fputs(cmd_help[i].text, stdout);
      fputs(common_opts_help, stdout);
      return EXIT_OK;
    }
  return usage_error("no help on '%s'", name);
}

/* help [COMMAND]: one COMMAND at most ("fault stall" names fault), as
 * other commands refuse an argument they do not take; `help groups extra`
 * printed groups' help and exited 0. */
static int cmd_help_command(int argc, char **argv) {
  int extra = 2;

  if (argc < 2) {
    help();
    return EXIT_OK;
  }
  if (strcmp(argv[1], "fault") == 0 && argc > 2 &&
      (strcmp(argv[2], "stall") == 0 || strcmp(argv[2], "clear") == 0))
    extra = 3;
  if (argc > extra)
    return usage_error("unexpected argument '%s' (help takes one COMMAND)",
                       argv[extra]);
  return cmd_usage(argv[1]);
}

/* ---- commands ------------------------------------------------------------ */

/* The global options, accepted before the command and among its own
 * options (each command's table includes them; global_opt handles them). */
#define GLOBAL_OPTS                                                            \
  {"socket", required_argument, NULL, 'S'}, {"json", no_argument, NULL, 'J'},   \
      {"timeout", required_argument, NULL, 'T'},                               \
      {"version", no_argument, NULL, 'V'}

/* What is wrong with global option opt's value arg, or NULL. An empty
 * --socket is refused: libdcpx would take it for no path at all and ask
 * $DCPX_SOCKET's or the default dcpxd instead, so that `--socket "$S"`
 * with S unset checked another daemon than the one meant, and said
 * nothing (dcpxd refuses an empty --socket too). */
static const char *global_problem(int opt, const char *arg) {
  uint64_t v;
  if (opt == 'S' && !arg[0])
    return "--socket needs a path (leave it out for $DCPX_SOCKET, else "
           DEFAULT_SOCKET ")";
  if (opt == 'T' && (!parse_u64(arg, &v) || v == 0 || v > 3600))
    return "--timeout must be 1..3600 seconds";
  return NULL;
}

/* Handles a global option (--socket, --json, --timeout). */
static int global_opt(int opt) {
  const char *why = opt == 'J' ? NULL : global_problem(opt, optarg);
  uint64_t v;
  if (why)
    return usage_error("%s", why);
  switch (opt) {
  case 'S':
    arg_socket = optarg;
    return 0;
  case 'J':
    arg_json = true;
    return 0;
  case 'T':
    (void)parse_u64(optarg, &v);
    arg_timeout_ms = (int)v * 1000;
    return 0;
  default:
    return EXIT_USAGE;
  }
}

static int print_version(void) {
  printf("dcpxctl %s (protocol %u)\n", DCPX_VERSION_STRING,
         DCPX_PROTO_VERSION);
  return EXIT_OK;
}

/* A group name given on the command line: refused here, as a usage error
 * (exit 2), by the rule dcpxd applies (PROTOCOL.md 7.2), rather than sent.
 * what names the argument ("GROUP", "--group"). 0 if the name is good. */
static int bad_group(const char *name, const char *what) {
  if (dcpx__group_name_ok(name))
    return 0;
  return usage_error("%s must be " DCPX__GROUP_NAME_RULE " (a group name)",
                     what, DCPX_GROUP_NAME_MAX);
}

/* The options each command takes besides its own: --help (name's help),
 * a bad option (the error), the global ones. Returns -1 to go on, or the
 * exit status. */
static int other_opt(int opt, int argc, char **argv, const struct option *opts,
                     const char *name) {
  int r;
  if (opt == 'h')
    return cmd_usage(name);
  if (opt == 'V') /* dcpxctl(1): before the command or among its options */
    return print_version();
  if (opt == '?' || opt == ':')
    return option_error(opt, argc, argv, opts);
  r = global_opt(opt);
  return r ? r : -1;
}

/* stats --output FILE. A FILE that does not exist or is a regular file is
 * replaced: the output goes to a new FILE.tmp.XXXXXX (mkstemp: never an
 * existing file or link), renamed to FILE once complete, so that a reader
 * (the node_exporter textfile collector) never sees half a file; only once
 * the answers are in: a failed query leaves FILE as it was. An existing
 * FILE that is no regular file (a device, a FIFO, or a symbolic link to
 * one, such as /dev/stdout on a pipe or a terminal) is written in place
 * (tmp[0] = 0): renaming over it would replace the device node or the
 * link. A symbolic link to a regular file, or one that leads nowhere, is
 * refused: writing through it would let whoever made the link choose the
 * file written. */
static int output_begin(const char *path, char *tmp, size_t n) {
  struct stat lst, st;
  int fd;
  tmp[0] = 0;
  if (lstat(path, &lst) == 0 && !S_ISREG(lst.st_mode)) {
    fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC); /* no create, no trunc */
    if (fd < 0 && S_ISLNK(lst.st_mode) && (errno == ENOENT || errno == ELOOP)) {
      fprintf(stderr, "dcpxctl: %s is a symbolic link that leads nowhere: "
                      "give --output the file itself\n", path);
      return EXIT_OUTPUT;
    }
    if (fd < 0) {
      fprintf(stderr, "dcpxctl: cannot write %s: %s\n", path,
              strerror(errno));
      return EXIT_OUTPUT;
    }
    if (fstat(fd, &st) != 0 || S_ISREG(st.st_mode)) {
      close(fd);
      fprintf(stderr, "dcpxctl: %s is a symbolic link to a file: give "
                      "--output the file itself\n", path);
      return EXIT_OUTPUT;
    }
  } else {
    if ((size_t)snprintf(tmp, n, "%s.tmp.XXXXXX", path) >= n) {
      tmp[0] = 0;
      fprintf(stderr, "dcpxctl: --output path too long\n");
      return EXIT_OUTPUT;
    }
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) { /* the file named, not its temporary twin */
      fprintf(stderr, "dcpxctl: cannot write %s (a new file in its folder, "
                      "renamed over it at the end): %s\n", path,
              strerror(errno));
      tmp[0] = 0;
      return EXIT_OUTPUT;
    }
    const mode_t um = umask(0);
    umask(um);
    (void)fchmod(fd, 0666 & ~um); /* as a file created by fopen would be */
  }
  fflush(stdout);
  if (dup2(fd, STDOUT_FILENO) < 0) {
    fprintf(stderr, "dcpxctl: cannot write %s: %s\n", path, strerror(errno));
    close(fd);
    if (tmp[0])
      unlink(tmp);
    return EXIT_OUTPUT;
  }
  close(fd);
  return 0;
}

/* Set once output_end closed stdout (the --output FILE): main's check of
 * standard output is then done. */
static bool stdout_closed;

static int output_end(const char *path, const char *tmp) {
  /* fsync only what is renamed: a pipe or a terminal cannot sync. */
  bool ok = fflush(stdout) == 0 && !ferror(stdout) &&
            (!tmp[0] || fsync(fileno(stdout)) == 0);
  int err = errno;
  stdout_closed = true;
  if (fclose(stdout) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && tmp[0] && rename(tmp, path) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    fprintf(stderr, "dcpxctl: cannot write %s: %s\n", path, strerror(err));
    if (tmp[0])
      unlink(tmp);
    return EXIT_OUTPUT;
  }
  return 0;
}

static int cmd_groups_like(int argc, char **argv, int what) {
  static const struct option opts[] = {
      GLOBAL_OPTS,
      {"format", required_argument, NULL, 'F'},
      {"output", required_argument, NULL, 'o'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  Dcpx__Query q = DCPX__QUERY__INIT;
  Dcpx__Frame *in = NULL;
  int opt, r, format = FMT_TEXT;
  bool text_given = false;
  const char *output = NULL;
  char tmp[4096];

  /* Options may follow the group name ("health GROUP --json"). */
  while ((opt = getopt_long(argc, argv, ":hV", opts, NULL)) != -1) {
    if (opt == 'F') {
      if (what != DCPX__QUERY__WHAT__STATS)
        return usage_error("--format is an option of stats");
      if (strcmp(optarg, "text") == 0)
        format = FMT_TEXT, text_given = true;
      else if (strcmp(optarg, "json") == 0)
        arg_json = true;
      else if (strcmp(optarg, "openmetrics") == 0)
        format = FMT_OPENMETRICS;
      else if (strcmp(optarg, "prometheus") == 0)
        format = FMT_PROMETHEUS;
      else
        return usage_error("--format must be text, json, openmetrics or "
                           "prometheus");
      continue;
    }
    if (opt == 'o') {
      if (what != DCPX__QUERY__WHAT__STATS)
        return usage_error("--output is an option of stats");
      if (!*optarg || strlen(optarg) > sizeof(tmp) - 32)
        return usage_error("--output needs a file name");
      output = optarg;
      continue;
    }
    if ((r = other_opt(opt, argc, argv, opts, argv[0])) >= 0)
      return r;
  }
  if (arg_json && (format != FMT_TEXT || text_given))
    return usage_error("--json and --format=%s ask for two formats",
                       format == FMT_OPENMETRICS ? "openmetrics"
                       : format == FMT_PROMETHEUS ? "prometheus"
                                                  : "text");
  if (argc - optind > (what == DCPX__QUERY__WHAT__GROUPS ? 0 : 1))
    return usage_error("too many arguments");
  if (optind < argc && !*argv[optind]) /* "" is no name, not "every group" */
    return usage_error("GROUP must not be empty (leave it out for every "
                       "group)");
  if (optind < argc && (r = bad_group(argv[optind], "GROUP")))
    return r;
  q.what = what;
  q.group = optind < argc ? argv[optind] : "";
  q.rank = -1;
  r = run_query(&q, &in);
  if (r)
    return r;
  const Dcpx__QueryReply *qr = in->query_reply;
  bool healthy = !qr->n_refused_reattaches &&
                 !state_failing(qr);
  for (size_t i = 0; i < qr->n_groups; i++)
    healthy = healthy && dcpx__group_info_healthy(qr->groups[i]);
  if (output && (r = output_begin(output, tmp, sizeof(tmp)))) {
    dcpx__frame_free(in);
    return r;
  }
  if (format == FMT_OPENMETRICS || format == FMT_PROMETHEUS)
    metrics_out(qr, format == FMT_OPENMETRICS);
  else if (arg_json)
    json_groups(qr, what == DCPX__QUERY__WHAT__HEALTH);
  else if (what == DCPX__QUERY__WHAT__GROUPS)
    human_groups(qr);
  else
    human_health(qr, what == DCPX__QUERY__WHAT__STATS);
  dcpx__frame_free(in);
  if (output && (r = output_end(output, tmp)))
    return r;
  if (what == DCPX__QUERY__WHAT__HEALTH && !healthy)
    return EXIT_UNHEALTHY;
  return EXIT_OK;
}

static void json_records(const Dcpx__QueryReply *qr) {
  jw w = jw_start(stdout);
  jw_obj(&w, NULL);
  jw_arr(&w, "records");
  for (size_t i = 0; i < qr->n_records; i++)
    json_record(&w, NULL, qr->records[i]);
  jw_arr_end(&w);
  jw_str(&w, "note", qr->records_note);
  jw_obj_end(&w);
  jw_end(&w);
}

static void human_records(const Dcpx__QueryReply *qr) {
  if (qr->n_records == 0)
    printf("no records\n");
  else
    printf("%-30s %-16s %4s %4s %-8s %-9s %6s %10s %10s %5s %-6s %s\n",
           "TIME (UTC)", "GROUP", "GEN", "RANK", "KIND", "REGION", "INDEX",
           "EXPECTED", "SEEN", "BLOCK", "CALL", "AWAITED_RANK");
  for (size_t i = 0; i < qr->n_records; i++) {
    const Dcpx__Record *rec = qr->records[i];
    char t[64], awaited[16] = "-"; /* "-": dcpxd cannot tell */
    format_time(rec->time_ns, t, sizeof(t));
    if (rec->has_awaited_rank)
      snprintf(awaited, sizeof(awaited), "%u", rec->awaited_rank);
    printf("%-30s %-16s %4u %4u %-8s %-9s %6u 0x%08x 0x%08x %5u %-6" PRIu64
           " %s%s\n",
           t, rec->group, rec->generation, rec->rank,
           dcpx_rec_kind_name(rec->kind), rec->region_name, rec->index,
           rec->expected, rec->seen, rec->block, rec->call_tag, awaited,
           other_call(rec) ? " (another call)" : "");
  }
  human_note(qr);
}

static int cmd_records(int argc, char **argv) {
  static const struct option opts[] = {
      {"group", required_argument, NULL, 'g'},
      {"rank", required_argument, NULL, 'r'},
      {"since", required_argument, NULL, 's'},
      {"until", required_argument, NULL, 'u'},
      {"limit", required_argument, NULL, 'l'},
      GLOBAL_OPTS,
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  Dcpx__Query q = DCPX__QUERY__INIT;
  Dcpx__Frame *in = NULL;
  uint64_t v;
  int opt, r;
  bool no_zone;

  q.what = DCPX__QUERY__WHAT__RECORDS;
  q.group = "";
  q.rank = -1;
  while ((opt = getopt_long(argc, argv, "+:hV", opts, NULL)) != -1) {
    switch (opt) {
    case 'g':
      if (!*optarg) /* "" is no name, not "every group" */
        return usage_error("--group must not be empty (leave it out for "
                           "every group)");
      if ((r = bad_group(optarg, "--group")))
        return r;
      q.group = optarg;
      break;
    case 'r':
      /* a rank no group can have would only match nothing: say so */
      if (!parse_i32(optarg, &q.rank) || q.rank < -1 ||
          q.rank >= DCPX_MAX_WORLD)
        return usage_error("--rank must be a rank number 0..%d (or -1 for "
                           "any)", DCPX_MAX_WORLD - 1);
      break;
    case 's':
    case 'u':
      if (!parse_time_ns(optarg, opt == 's' ? &q.since_ns : &q.until_ns,
                         &no_zone))
        return no_zone
                   ? usage_error("--%s: '%s' has no time zone: dcpxctl "
                                 "takes UTC only, written with a Z ('%sZ' "
                                 "if that is UTC)",
                                 opt == 's' ? "since" : "until", optarg, optarg)
                   : usage_error("--%s: cannot parse time '%s' (a time "
                                 "from 1970 to 2554-07-21)",
                                 opt == 's' ? "since" : "until", optarg);
      if (opt == 's')
        break;
      /* 0 on the wire is no end at all (PROTOCOL.md 10.4): every record
       * would come back for a window that holds none */
      if (q.until_ns == 0)
        return usage_error("--until %s is the epoch itself: no record is "
                           "older (leave --until out for no end)",
                           optarg);
      break;
    case 'l':
      if (!parse_u64(optarg, &v) || v == 0 || v > UINT32_MAX)
        return usage_error("--limit must be a number from 1 to %u (leave "
                           "it out for every record)",
                           (unsigned)UINT32_MAX);
      q.limit = (uint32_t)v;
      break;
    default:
      if ((r = other_opt(opt, argc, argv, opts, "records")) >= 0)
        return r;
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if (q.since_ns && q.until_ns && q.until_ns <= q.since_ns)
    return usage_error("--until must come after --since (the window is "
                       "[since, until))");
  r = run_query(&q, &in);
  if (r)
    return r;
  if (arg_json)
    json_records(in->query_reply);
  else
    human_records(in->query_reply);
  dcpx__frame_free(in);
  return EXIT_OK;
}

static int cmd_reset(int argc, char **argv) {
  static const struct option opts[] = {
      {"group", required_argument, NULL, 'g'},
      GLOBAL_OPTS,
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  Dcpx__Command cmd = DCPX__COMMAND__INIT;
  int opt, r;

  cmd.kind = DCPX__COMMAND__KIND__RESET;
  cmd.group = NULL;
  cmd.rank = -1;
  while ((opt = getopt_long(argc, argv, "+:hV", opts, NULL)) != -1) {
    if (opt == 'g')
      cmd.group = optarg;
    else if ((r = other_opt(opt, argc, argv, opts, "reset")) >= 0)
      return r;
  }
  if (!cmd.group || !*cmd.group)
    return usage_error("reset needs --group GROUP");
  if ((r = bad_group(cmd.group, "--group")))
    return r;
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  char note[512];
  r = run_command(&cmd, note, sizeof(note));
  if (r == EXIT_OK && !arg_json && *note)
    printf("%s\n", note);
  else if (r == EXIT_OK && !arg_json)
    printf("reset of group %s requested: its ranks drain, acknowledge, and "
           "resume at the next generation\n",
           cmd.group);
  return r;
}

static int cmd_fault(int argc, char **argv) {
  static const struct option opts[] = {
      {"group", required_argument, NULL, 'g'},
      {"rank", required_argument, NULL, 'r'},
      {"epoch", required_argument, NULL, 'e'},
      {"call", required_argument, NULL, 'c'},
      {"ticks", required_argument, NULL, 't'},
      GLOBAL_OPTS,
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  Dcpx__Command cmd = DCPX__COMMAND__INIT;
  bool have_rank = false, have_ticks = false, stall_opts = false, clear;
  uint64_t v;
  int opt, r;

  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
      return cmd_usage("fault");
    else if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0)
      return print_version();
  if (argc < 2 ||
      (strcmp(argv[1], "stall") != 0 && strcmp(argv[1], "clear") != 0))
    return usage_error("usage: fault stall --group G --rank R [--epoch E] "
                       "[--call C] --ticks T, or fault clear --group G "
                       "--rank R");
  clear = strcmp(argv[1], "clear") == 0;
  argc--;
  argv++;
  cmd.kind = clear ? DCPX__COMMAND__KIND__FAULT_CLEAR
                   : DCPX__COMMAND__KIND__FAULT_STALL;
  cmd.group = NULL;
  cmd.call_tag = UINT64_MAX;
  while ((opt = getopt_long(argc, argv, "+:hV", opts, NULL)) != -1) {
    switch (opt) {
    case 'g':
      cmd.group = optarg;
      break;
    case 'r':
      if (!parse_i32(optarg, &cmd.rank) || cmd.rank < 0)
        return usage_error("--rank must be a rank number");
      have_rank = true;
      break;
    case 'e':
      stall_opts = true;
      if (!parse_u64(optarg, &v) || v > DCPX_EPOCH_ROW_MAX)
        return usage_error("--epoch must be 0 (any) or 1..%u",
                           DCPX_EPOCH_ROW_MAX);
      cmd.epoch = (uint32_t)v;
      break;
    case 'c':
      stall_opts = true;
      if (!parse_u64(optarg, &cmd.call_tag) || cmd.call_tag == 0)
        return usage_error("--call must be a call number >= 1 (the N-th "
                           "call since the join or the last recovery)");
      /* the health block's fault_call ~0 is "any call": a stall armed
       * for it would fire at the next call, not at that one */
      if (cmd.call_tag == UINT64_MAX)
        return usage_error("--call %" PRIu64 " is reserved: it means any "
                           "call (leave --call out for that); calls run "
                           "1..%" PRIu64,
                           cmd.call_tag, UINT64_MAX - 1);
      cmd.has_call_tag = true;
      break;
    case 't':
      stall_opts = true;
      if (!parse_duration_ns(optarg, &cmd.ticks) || cmd.ticks == 0)
        return usage_error("--ticks must be a duration > 0 (ns, or a "
                           "number with ns, us, ms, s, m, h or d)");
      have_ticks = true;
      break;
    default:
      if ((r = other_opt(opt, argc, argv, opts, "fault")) >= 0)
        return r;
    }
  }
  if (clear && stall_opts)
    return usage_error("--epoch, --call and --ticks are options of fault "
                       "stall, not of fault clear");
  if (clear && (!cmd.group || !*cmd.group || !have_rank))
    return usage_error("fault clear needs --group and --rank");
  if (!clear && (!cmd.group || !*cmd.group || !have_rank || !have_ticks))
    return usage_error("fault stall needs --group, --rank and --ticks");
  if ((r = bad_group(cmd.group, "--group")))
    return r;
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  char note[512];
  r = run_command(&cmd, note, sizeof(note));
  if (clear) {
    if (r == EXIT_OK && !arg_json)
      printf("%s\n", *note ? note : "fault hook disarmed");
    return r;
  }
  if (r == EXIT_OK && !arg_json) {
    char call[24] = "any";
    if (cmd.has_call_tag)
      snprintf(call, sizeof(call), "%" PRIu64, cmd.call_tag);
    printf("fault armed: group %s rank %d stalls %" PRIu64
           " ns (at most the group's timeout) once, at epoch %u (0: any), "
           "call %s\n",
           cmd.group, (int)cmd.rank, cmd.ticks, cmd.epoch, call);
  }
  return r;
}

/* ---- check: a monitoring plugin ------------------------------------------ */

enum { NAGIOS_OK = 0, NAGIOS_WARNING = 1, NAGIOS_CRITICAL = 2,
       NAGIOS_UNKNOWN = 3 };
static const char *const nagios_name[] = {"OK", "WARNING", "CRITICAL",
                                          "UNKNOWN"};

/* One status line ("DCPX STATE - text"), and the code. */
static int check_line(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int check_line(int code, const char *fmt, ...) {
  va_list ap;
  printf("DCPX %s - ", nagios_name[code]);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  return code;
}

/* Appends ", text" (or "text" at the start) to the problem list b. */
static void problem(char *b, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void problem(char *b, size_t n, const char *fmt, ...) {
  size_t k = strlen(b);
  va_list ap;
  if (k + 8 >= n)
    return;
  if (k)
    k += (size_t)snprintf(b + k, n - k, ", ");
  va_start(ap, fmt);
  vsnprintf(b + k, n - k, fmt, ap);
  va_end(ap);
}

/* A percentage 0..100, "%" optional. No minus: "-0" passed as -0.0, and
 * the performance data showed it as -0 (the counts refuse it too); the
 * sign bit, not the first byte, since strtod skips leading blanks (" -0"). */
static bool parse_pct(const char *s, double *ret) {
  char *end;
  double v;
  if (!s || !*s)
    return false;
  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || (*end && strcmp(end, "%") != 0) || !(v >= 0) ||
      signbit(v) || v > 100)
    return false;
  *ret = v;
  return true;
}

/* The answer of a query, or a check status (run_query's exit code mapped:
 * unreachable is CRITICAL, a daemon error or a usage error UNKNOWN, and
 * so is a dcpxd that this user may not reach: the socket's permissions
 * or dcpxd's allow lists keep it out, which says nothing of the node). */
static int check_query(Dcpx__Query *q, Dcpx__Frame **in) {
  int r;
  if (sock_fd >= 0) {
    close(sock_fd);
    sock_fd = -1;
  }
  r = run_query(q, in);
  if (r == EXIT_OK)
    return -1;
  if (r == EXIT_UNREACHABLE &&
      (last_code == DCPX_E_ACCES || last_code == DCPX_E_PERM))
    return check_line(NAGIOS_UNKNOWN,
                      "uid %u may not query dcpxd: %s (run check as root, as "
                      "dcpxd's user or as a user its allow lists name)",
                      (unsigned)getuid(), last_error);
  if (r == EXIT_UNREACHABLE)
    return check_line(NAGIOS_CRITICAL, "dcpxd unreachable: %s", last_error);
  return check_line(NAGIOS_UNKNOWN, "%s",
                    last_error[0] ? last_error : "query failed");
}

/* dcpxctl check: thresholds (parsed by check_parse), then the health
 * query (check_group per group), the records query (check_records), and
 * the status line with performance data (check_report). */
typedef struct check_limits {
  double rescue_warn, rescue_crit; /* percent */
  uint64_t window_ns;              /* how far back records count */
  uint64_t rec_warn, rec_crit;     /* timeout records; 0: never */
} check_limits;

/* What check found: problems so far, and the status line's figures. */
typedef struct check_found {
  char crit[1024], warn[1024], worst_group[128];
  double max_rescue;
  unsigned live, ranks;
  size_t n_groups;
  uint64_t n_timeouts;
} check_found;

/* Returns -1 to go on, or the exit status (after --help, or the UNKNOWN
 * status line for bad arguments). */
static int check_parse(int argc, char **argv, check_limits *l) {
  static const struct option opts[] = {
      {"rescue-warning", required_argument, NULL, 'w'},
      {"rescue-critical", required_argument, NULL, 'c'},
      {"records-window", required_argument, NULL, 'W'},
      {"records-warning", required_argument, NULL, 'r'},
      {"records-critical", required_argument, NULL, 'R'},
      GLOBAL_OPTS,
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  char bad[256];
  const char *why;
  int opt;

  opterr = 0; /* a bad option is the status line's UNKNOWN, not stderr */
  while ((opt = getopt_long(argc, argv, ":hV", opts, NULL)) != -1) {
    switch (opt) {
    case 'h':
      return cmd_usage("check");
    case 'V':
      return print_version();
    case 'w':
      if (!parse_pct(optarg, &l->rescue_warn))
        return check_line(NAGIOS_UNKNOWN,
                          "--rescue-warning must be a percentage 0..100");
      break;
    case 'c':
      if (!parse_pct(optarg, &l->rescue_crit))
        return check_line(NAGIOS_UNKNOWN,
                          "--rescue-critical must be a percentage 0..100");
      break;
    case 'W': /* a unit is required: a bare 900 would be 900 ns */
      if (!*optarg || !isalpha((unsigned char)optarg[strlen(optarg) - 1]) ||
          !parse_duration_ns(optarg, &l->window_ns) || l->window_ns == 0)
        return check_line(NAGIOS_UNKNOWN,
                          "--records-window must be a duration > 0 with a "
                          "unit: ns, us, ms, s, m, h or d (e.g. 15m)");
      break;
    case 'r':
      if (!parse_u64(optarg, &l->rec_warn))
        return check_line(NAGIOS_UNKNOWN,
                          "--records-warning must be a count (0: never)");
      break;
    case 'R':
      if (!parse_u64(optarg, &l->rec_crit))
        return check_line(NAGIOS_UNKNOWN,
                          "--records-critical must be a count (0: never)");
      break;
    case 'J': /* refused after the loop, wherever it was given */
      global_opt(opt);
      break;
    case 'S':
    case 'T':
      if ((why = global_problem(opt, optarg)))
        return check_line(NAGIOS_UNKNOWN, "%s", why);
      global_opt(opt);
      break;
    default: /* '?' or ':' */
      option_problem(bad, sizeof(bad), opt, argc, argv, opts);
      return check_line(NAGIOS_UNKNOWN, "%s (see dcpxctl check --help)", bad);
    }
  }
  if (argc - optind > 1)
    return check_line(NAGIOS_UNKNOWN, "too many arguments");
  if (arg_json) /* given before the command or among check's options */
    return check_line(NAGIOS_UNKNOWN,
                      "check has no --json (its output is one status line)");
  if (l->rescue_crit < l->rescue_warn)
    return check_line(NAGIOS_UNKNOWN,
                      "--rescue-critical is below --rescue-warning");
  if (l->rec_warn && l->rec_crit && l->rec_crit < l->rec_warn)
    return check_line(NAGIOS_UNKNOWN,
                      "--records-critical is below --records-warning");
  return -1;
}

/* One group's state, its ranks, and its rescue rate against the limits. */
static void check_group(const Dcpx__GroupInfo *g, const check_limits *l,
                        check_found *f) {
  bool forming = g->state && strcmp(g->state, "forming") == 0;
  uint64_t rows = 0, rescue = 0;
  /* A recovering group keeps its abort word until the recovery ends
   * (dcpxd-group.c), so "recovering" is tested first. */
  if (unattached(g)) {
    problem(f->warn, sizeof(f->warn),
            "group %s not reattached since dcpxd restarted", g->name);
    return;
  }
  if (recovering(g)) {
    char who[96] = "";
    for (size_t k = 0, n = 0; k < g->n_ranks && n < 8; k++)
      if (g->ranks[k] && !g->ranks[k]->acknowledged)
        snprintf(who + strlen(who), sizeof(who) - strlen(who), "%s%u",
                 n++ ? "," : "", g->ranks[k]->rank);
    problem(f->warn, sizeof(f->warn),
            "group %s recovering (not acknowledged by rank %s)", g->name,
            who[0] ? who : "-");
  } else if (!g->state || strcmp(g->state, "aborted") == 0 || g->abort)
    problem(f->crit, sizeof(f->crit), "group %s aborted (%s)", g->name,
            dcpx__abort_reason_name(g->abort));
  for (size_t k = 0; k < g->n_ranks; k++) {
    const Dcpx__RankInfo *rk = g->ranks[k];
    if (!rk)
      continue;
    f->ranks++;
    rows += rk->rows;
    rescue += rk->rescue_rows;
    if (rk->joined && !rk->alarm && !rk->failed)
      f->live++;
    if (!rk->joined && !rk->failed && !rk->alarm && rk->rank < 32 &&
        ((g->awaiting_reattach >> rk->rank) & 1u))
      problem(f->warn, sizeof(f->warn), "group %s rank %u awaiting reattach",
              g->name, rk->rank); /* dcpxd restarted; it comes back */
    else if (rk->failed || rk->alarm || (!rk->joined && !forming))
      problem(f->crit, sizeof(f->crit), "group %s rank %u %s", g->name,
              rk->rank, rank_state(g, rk, true));
  }
  double rate = 100.0 * rescue_rate(rescue, rows);
  if (rows && rate > f->max_rescue) {
    f->max_rescue = rate;
    snprintf(f->worst_group, sizeof(f->worst_group), "%s", g->name);
  }
  if (rows && rate > l->rescue_crit)
    problem(f->crit, sizeof(f->crit), "group %s rescue rate %.1f%% > %.1f%%",
            g->name, rate, l->rescue_crit);
  else if (rows && rate > l->rescue_warn)
    problem(f->warn, sizeof(f->warn), "group %s rescue rate %.1f%% > %.1f%%",
            g->name, rate, l->rescue_warn);
}

/* The health query: every group (or the one named). Returns -1, or the
 * exit status of a query that failed (its UNKNOWN line printed). */
static int check_health(const char *group, const check_limits *l,
                        check_found *f) {
  Dcpx__Query q = DCPX__QUERY__INIT;
  Dcpx__Frame *in = NULL;
  int code;
  q.what = DCPX__QUERY__WHAT__HEALTH;
  q.group = (char *)group;
  q.rank = -1;
  if ((code = check_query(&q, &in)) >= 0)
    return code;
  const Dcpx__QueryReply *qr = in->query_reply;
  if (qr->partial_view && !*group) {
    /* Not an admin: the node's other groups are hidden from it, and OK
     * would be a guess. */
    dcpx__frame_free(in);
    return check_line(NAGIOS_UNKNOWN,
                      "uid %u sees only its own groups: run check as root, "
                      "as dcpxd's user or in dcpxd's admin-gid",
                      (unsigned)getuid());
  }
  for (size_t i = 0; i < qr->n_groups; i++)
    check_group(qr->groups[i], l, f);
  for (size_t i = 0; i < qr->n_refused_reattaches; i++) {
    const Dcpx__ReattachRefusal *r = qr->refused_reattaches[i];
    problem(f->warn, sizeof(f->warn),
            "%s rank %u (pid %d) runs unwatched: dcpxd refused its reattach",
            r->group, r->rank, (int)r->pid);
  }
  if (state_failing(qr)) /* no group can form */
    problem(f->crit, sizeof(f->crit), "dcpxd %s", qr->state_error);
  f->n_groups = qr->n_groups + qr->groups_left_out;
  if (qr->groups_left_out) /* dcpxd sent the unhealthy ones first */
    problem(f->warn, sizeof(f->warn),
            "%u groups not checked (dcpxd's reply size limit: check them "
            "by name)",
            qr->groups_left_out);
  dcpx__frame_free(in);
  return -1;
}

/* Timeout records within the window, against their limits. Returns -1,
 * or the exit status of a query that failed. */
static int check_records(const char *group, const check_limits *l,
                         check_found *f) {
  Dcpx__Query rq = DCPX__QUERY__INIT;
  Dcpx__Frame *in = NULL;
  uint64_t now = now_ns();
  int code;
  /* Counted even with both thresholds off (0): the performance data
   * reports the count (timeout_records=N), which must not read 0 then. */
  rq.what = DCPX__QUERY__WHAT__RECORDS;
  rq.group = (char *)group;
  rq.rank = -1;
  rq.since_ns = l->window_ns < now ? now - l->window_ns : 1;
  if ((code = check_query(&rq, &in)) >= 0)
    return code;
  for (size_t i = 0; i < in->query_reply->n_records; i++)
    if (in->query_reply->records[i]->kind == DCPX_REC_TIMEOUT ||
        in->query_reply->records[i]->kind == DCPX_REC_NCCL_TIMEOUT)
      f->n_timeouts++;
  const uint32_t unstored = in->query_reply->records_unstored;
  dcpx__frame_free(in);
  if (unstored) /* a stop of dcpxd now would lose them */
    problem(f->warn, sizeof(f->warn),
            "%u timeout record%s not stored on disk (dcpxd cannot write its "
            "state dir: see its log)",
            unstored, unstored == 1 ? "" : "s");
  const uint64_t n = f->n_timeouts;
  const double secs = (double)l->window_ns / 1e9;
  if (l->rec_crit && n >= l->rec_crit)
    problem(f->crit, sizeof(f->crit), "%" PRIu64 " timeout record%s in %.0f s",
            n, n == 1 ? "" : "s", secs);
  else if (l->rec_warn && n >= l->rec_warn)
    problem(f->warn, sizeof(f->warn), "%" PRIu64 " timeout record%s in %.0f s",
            n, n == 1 ? "" : "s", secs);
  return -1;
}

/* The status line and its performance data; returns the Nagios code. */
static int check_report(const check_limits *l, const check_found *f) {
  int code = f->crit[0]   ? NAGIOS_CRITICAL
             : f->warn[0] ? NAGIOS_WARNING
                          : NAGIOS_OK;
  printf("DCPX %s - ", nagios_name[code]);
  if (f->crit[0])
    printf("%s%s", f->crit, f->warn[0] ? ", " : "");
  if (f->warn[0])
    printf("%s", f->warn);
  if (code == NAGIOS_OK) {
    printf("%zu group%s, %u/%u ranks live", f->n_groups,
           f->n_groups == 1 ? "" : "s", f->live, f->ranks);
    if (f->worst_group[0])
      printf(", rescue rate at most %.1f%% (%s)", f->max_rescue,
             f->worst_group);
  }
  /* Performance data: label=value;warn;crit;min;max, a threshold left
   * empty where it is off. Nagios alerts at value > threshold, so the
   * record thresholds (N or more) are given as N - 1. */
  char rw[24] = "", rc[24] = "";
  if (l->rec_warn)
    snprintf(rw, sizeof(rw), "%" PRIu64, l->rec_warn - 1);
  if (l->rec_crit)
    snprintf(rc, sizeof(rc), "%" PRIu64, l->rec_crit - 1);
  printf(" | groups=%zu ranks=%u live_ranks=%u timeout_records=%" PRIu64
         ";%s;%s;0; rescue_max=%.2f%%;%g;%g;0;100\n",
         f->n_groups, f->ranks, f->live, f->n_timeouts, rw, rc, f->max_rescue,
         l->rescue_warn, l->rescue_crit);
  return code;
}

static int cmd_check(int argc, char **argv) {
  check_limits l = {50.0, 100.0, 15ull * 60 * 1000000000ull, 1, 0};
  check_found f;
  int code;

  memset(&f, 0, sizeof(f));
  quiet_errors = true;
  if ((code = check_parse(argc, argv, &l)) >= 0)
    return code;
  const char *group = optind < argc ? argv[optind] : "";
  if (optind < argc && !*group)
    return check_line(NAGIOS_UNKNOWN, "GROUP must not be empty (leave it "
                                      "out for every group)");
  if (optind < argc && !dcpx__group_name_ok(group))
    return check_line(NAGIOS_UNKNOWN,
                      "GROUP must be " DCPX__GROUP_NAME_RULE " (a group "
                      "name)",
                      DCPX_GROUP_NAME_MAX);
  if ((code = check_health(group, &l, &f)) >= 0 ||
      (code = check_records(group, &l, &f)) >= 0)
    return code;
  return check_report(&l, &f);
}

static void help(void) {
  printf(
      "Usage: dcpxctl [--socket PATH] [--json] [--timeout SEC] COMMAND ...\n"
      "Query and control dcpxd, the dcpx node daemon.\n"
      "\n"
      "Commands:\n"
      "  groups                    list the groups\n"
      "  health [GROUP]            the groups' ranks: state, pid, calls, "
      "rescue rate\n"
      "  stats [GROUP] [--format=text|json|openmetrics|prometheus]\n"
      "        [--output=FILE]\n"
      "                            per-rank calls, rows, rescued rows, "
      "failed calls\n"
      "                            (openmetrics, prometheus: metrics for "
      "Prometheus)\n"
      "  check [GROUP] [THRESHOLDS]\n"
      "                            a monitoring check (Nagios exit codes; "
      "see\n"
      "                            dcpxctl check --help)\n"
      "  records [--group G] [--rank R] [--since T] [--until T] [--limit N]\n"
      "                            timeout records, oldest first (--limit N: "
      "the\n                            newest N)\n"
      "  reset --group G           abort the group and recover it (the ranks "
      "drain,\n"
      "                            acknowledge and resume at the next "
      "generation)\n"
      "  fault stall --group G --rank R [--epoch E] [--call C] --ticks T\n"
      "                            stall block 0 of rank R once for T, at "
      "most the\n"
      "                            group's wait timeout (needs dcpxd\n"
      "                            --enable-fault-injection); --call C: the "
      "C-th call\n"
      "                            since the rank joined or the group last "
      "recovered\n"
      "                            (1 = the first; not the engine's call "
      "tag);\n"
      "                            --epoch E: the call at that epoch\n"
      "  fault clear --group G --rank R\n"
      "                            disarm rank R's fault hook (health shows "
      "it,\n"
      "                            armed or fired)\n"
      "  help COMMAND              the help of COMMAND (also: dcpxctl "
      "COMMAND --help)\n"
      "\n"
      "Options:\n"
      "  --socket PATH   dcpxd's socket (default $DCPX_SOCKET, else\n"
      "                  %s)\n"
      "  --json          machine-readable output\n"
      "  --timeout SEC   wait at most SEC seconds for an answer (default 10)\n"
      "  -h, --help      this text;  -V, --version  the version\n"
      "\n"
      "Times (T): now, 10m / 2h / 1d (that long ago), @UNIXSECONDS,\n"
      "2025-01-31T12:00:00Z (UTC; the Z is required, a space may replace\n"
      "the T), or nanoseconds since the epoch.\n"
      "Durations (--ticks): nanoseconds, or a number with ns, us, ms, s, m,\n"
      "h or d.\n"
      "\n"
      "Exit status:\n"
      "  0  ok (health: every group healthy)\n"
      "  1  unhealthy (health: a group aborted, recovering or unattached, or "
      "a rank\n"
      "     dead, awaited, alarmed, failed or unwatched)\n"
      "  2  usage error\n"
      "  3  cannot reach dcpxd (not running, no permission, version "
      "mismatch,\n     no answer)\n"
      "  4  dcpxd answered with an error (unknown group, refused command)\n"
      "  5  the output could not be written (stats --output FILE, or\n"
      "     standard output: a full disk)\n"
      "check exits 0 OK, 1 WARNING, 2 CRITICAL (also: dcpxd unreachable), "
      "3 UNKNOWN.\n",
      DEFAULT_SOCKET);
}

/* The command run (NULL before it is known): check exits with its own
 * codes when standard output fails too. */
static const char *the_cmd;

/* Standard output, written as it went (stdio buffers it), must have
 * reached its file: a full disk or a closed descriptor would otherwise
 * leave a cut or empty answer behind an exit status of 0 (dcpxctl stats
 * > FILE). Says so, and returns EXIT_OUTPUT (check: UNKNOWN) instead of
 * a success; an error status the command had already stays. */
static int stdout_check(int r) {
  if (stdout_closed)
    return r;
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout))
    return r;
  const int err = errno;
  fprintf(stderr, "dcpxctl: cannot write standard output: %s\n",
          err ? strerror(err) : "write error");
  if (the_cmd && strcmp(the_cmd, "check") == 0)
    return NAGIOS_UNKNOWN;
  return r >= EXIT_USAGE ? r : EXIT_OUTPUT;
}

static int run(int argc, char **argv);

int main(int argc, char **argv) { return stdout_check(run(argc, argv)); }

static int run(int argc, char **argv) {
  static const struct option opts[] = {
      GLOBAL_OPTS,
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *cmd;
  char bad[200] = ""; /* the first bad global option */
  const char *why;
  int opt, r;

  setlocale(LC_CTYPE, "");
  /* Bad options are reported by dcpxctl, not by getopt (opterr = 0, and
   * every option string begins with ':'): here as check's UNKNOWN line
   * before check, or as a usage error, and the same in each command. */
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "+:hV", opts, NULL)) != -1) {
    switch (opt) {
    case 'h':
      help();
      return EXIT_OK;
    case 'V':
      return print_version();
    case 'S':
    case 'T':
      if ((why = global_problem(opt, optarg))) {
        if (!bad[0])
          snprintf(bad, sizeof(bad), "%s", why);
      } else {
        (void)global_opt(opt);
      }
      break;
    case '?':
    case ':':
      if (!bad[0])
        option_problem(bad, sizeof(bad), opt, argc, argv, opts);
      break;
    default:
      (void)global_opt(opt);
    }
  }
  cmd = the_cmd = optind < argc ? argv[optind] : NULL;
  if (bad[0]) /* dcpxctl(1): check exits 3 UNKNOWN on any usage error */
    return cmd && strcmp(cmd, "check") == 0
               ? check_line(NAGIOS_UNKNOWN, "%s", bad)
               : usage_error("%s", bad);
  if (!cmd)
    return usage_error("missing command");
  argc -= optind;
  argv += optind;
  optind = 0; /* reset getopt: the command's own options follow its name */

  if (strcmp(cmd, "groups") == 0)
    r = cmd_groups_like(argc, argv, DCPX__QUERY__WHAT__GROUPS);
  else if (strcmp(cmd, "health") == 0)
    r = cmd_groups_like(argc, argv, DCPX__QUERY__WHAT__HEALTH);
  else if (strcmp(cmd, "stats") == 0)
    r = cmd_groups_like(argc, argv, DCPX__QUERY__WHAT__STATS);
  else if (strcmp(cmd, "records") == 0)
    r = cmd_records(argc, argv);
  else if (strcmp(cmd, "reset") == 0)
    r = cmd_reset(argc, argv);
  else if (strcmp(cmd, "fault") == 0)
    r = cmd_fault(argc, argv);
  else if (strcmp(cmd, "check") == 0)
    r = cmd_check(argc, argv);
  else if (strcmp(cmd, "help") == 0)
    r = cmd_help_command(argc, argv);
  else
    r = usage_error("unknown command '%s'", cmd);
  if (sock_fd >= 0)
    close(sock_fd);
  return r;
}
