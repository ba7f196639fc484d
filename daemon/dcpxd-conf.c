/* dcpxd-conf.c - defaults, config file and flags (dcpxd-conf.h).
 *
 * The config file is an INI file without sections, "key = value" lines,
 * read by inih (dcpxd.conf(5)); blank lines and lines whose first non-blank
 * character is '#' or ';' are ignored, and so is the rest of a line from a
 * '#' or ';' that follows a blank. A value may be "double quoted". Keys are
 * the long flag names; '_' is accepted for '-'. inih splits the lines; the
 * reader and handler below add line numbers to its errors and the rest of
 * the format (conf_read_line, conf_handler).
 *
 * Loading runs getopt twice: the first pass only looks for --config,
 * --help and --version; then the file is read; then the second pass applies
 * every other flag over it. Every setting goes through conf_set(), which
 * validates it and names its source in any error.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <ini.h>

#include <dcpx/version.h>

#include "dcpx.h"
#include "dcpxd-conf.h"
#include "dcpxd-log.h"
#include "dcpxd-util.h"
#include "frame.h"

enum { SRC_DEFAULT = 0, SRC_FILE = 1, SRC_FLAG = 2 };

/* The id lists are parsed as uint32_t (as uid_t and gid_t are on Linux). */
_Static_assert(sizeof(uid_t) == sizeof(uint32_t) &&
                   sizeof(gid_t) == sizeof(uint32_t),
               "uid_t and gid_t are 32-bit");

/* Flags that are settings use their index in this table + OPT_SETTING as
 * getopt value; the table's name is then the setting's key. */
enum {
  OPT_SETTING = 0x100,
  OPT_CONFIG = 'c',
  OPT_HELP = 'h',
  OPT_VERSION = 'V'
};
static const struct option long_options[] = {
    {"socket", required_argument, NULL, OPT_SETTING + 0},
    {"socket-mode", required_argument, NULL, OPT_SETTING + 1},
    {"state-dir", required_argument, NULL, OPT_SETTING + 2},
    {"poll-ms", required_argument, NULL, OPT_SETTING + 3},
    {"join-timeout-ms", required_argument, NULL, OPT_SETTING + 4},
    {"allow-uid", required_argument, NULL, OPT_SETTING + 5},
    {"allow-gid", required_argument, NULL, OPT_SETTING + 6},
    {"enable-fault-injection", optional_argument, NULL, OPT_SETTING + 7},
    {"records-max-bytes", required_argument, NULL, OPT_SETTING + 8},
    {"log-level", required_argument, NULL, OPT_SETTING + 9},
    {"admin-gid", required_argument, NULL, OPT_SETTING + 10},
    {"hello-timeout-ms", required_argument, NULL, OPT_SETTING + 11},
    {"idle-timeout-ms", required_argument, NULL, OPT_SETTING + 12},
    {"max-conns-per-uid", required_argument, NULL, OPT_SETTING + 13},
    {"group-owner", required_argument, NULL, OPT_SETTING + 14},
    {"max-groups-per-uid", required_argument, NULL, OPT_SETTING + 15},
    {"max-workspace-bytes", required_argument, NULL, OPT_SETTING + 16},
    {"max-workspace-bytes-per-uid", required_argument, NULL,
     OPT_SETTING + 17},
    {"max-queued-bytes", required_argument, NULL, OPT_SETTING + 18},
    {"log-rate-burst", required_argument, NULL, OPT_SETTING + 19},
    {"log-rate-interval-ms", required_argument, NULL, OPT_SETTING + 20},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};
#define N_SETTINGS 21

static void help(void) {
  printf("Usage: dcpxd [OPTION]...\n"
         "The dcpx node daemon: rendezvous, shared buffers, health and "
         "recovery\nof dcpx groups.\n"
         "\n"
         "Every option can also be set in the config file as \"name = "
         "value\";\n"
         "options given here override the file.\n"
         "\n"
         "  -c, --config=FILE            read FILE (default %s\n"
         "                               if it exists; --config= reads none)\n"
         "      --socket=PATH            listening socket (default %s;\n"
         "                               ignored under socket activation)\n"
         "      --socket-mode=MODE       its permission bits, octal "
         "(default 0660)\n"
         "      --state-dir=DIR          durable timeout records and the "
         "groups\n"
         "                               it created, for reattach (default "
         "%s)\n"
         "      --poll-ms=N              alarm scan period, 1..%u ms "
         "(default %u)\n"
         "      --join-timeout-ms=N      default join timeout (default "
         "%u)\n"
         "      --allow-uid=LIST         users who may connect, by uid or "
         "name,\n"
         "                               comma separated (root and the "
         "daemon's\n"
         "                               own user always may)\n"
         "      --allow-gid=LIST         groups whose members may connect\n"
         "      --admin-gid=LIST         groups whose members are admins "
         "(reset,\n"
         "                               fault, every group in queries; "
         "root\n"
         "                               and the daemon's user always are)\n"
         "      --group-owner=PATTERN:uid:USER or PATTERN:gid:GROUP\n"
         "                               groups named PATTERN (a glob) "
         "belong to\n"
         "                               USER, or to the members of GROUP "
         "(may be\n"
         "                               repeated; the first match "
         "applies)\n"
         "      --hello-timeout-ms=N     close a connection without Hello "
         "after N\n"
         "                               ms (default %u)\n"
         "      --idle-timeout-ms=N      close a connection that holds no "
         "group\n"
         "                               after N idle ms (default %u)\n"
         "      --max-conns-per-uid=N    connections per uid, root exempt "
         "(default\n"
         "                               %u)\n"
         "      --max-queued-bytes=SIZE  output queued for all peers that "
         "do not\n"
         "                               read (default 64M); past it, the "
         "peer\n"
         "                               adding to it is cut off\n"
         "      --max-groups-per-uid=N   groups a uid may create, root "
         "exempt\n"
         "                               (default %u)\n"
         "      --max-workspace-bytes=SIZE\n"
         "                               memory all groups may commit (K, "
         "M, G, T;\n"
         "                               default 0: no cap)\n"
         "      --max-workspace-bytes-per-uid=SIZE\n"
         "                               memory one uid's groups may commit, "
         "root\n"
         "                               exempt (default 0: no cap)\n"
         "      --enable-fault-injection[=BOOL]\n"
         "                               allow dcpxctl fault stall (off by "
         "default)\n"
         "      --records-max-bytes=SIZE rotate records.log beyond SIZE "
         "(K, M, G, T\n"
         "                               suffixes; default 4M)\n"
         "      --log-level=LEVEL        err, warning, notice, info (default) "
         "or debug\n"
         "                               (also emerg, alert, crit, error, "
         "warn, 0-7)\n"
         "      --log-rate-burst=N       log at most N lines of one kind "
         "(format)\n"
         "                               per interval, then a count (default "
         "%u;\n"
         "                               0: no limit)\n"
         "      --log-rate-interval-ms=N the interval, 1..3600000 (default "
         "%u)\n"
         "  -h, --help                   this text\n"
         "  -V, --version                the version\n"
         "\n"
         "Exit status: 0 after a clean shutdown (SIGTERM, SIGINT), 1 on a "
         "runtime\n"
         "failure, 2 on a bad option or config file.\n",
         DCPXD_DEFAULT_CONFIG, DCPXD_DEFAULT_SOCKET, DCPXD_DEFAULT_STATE_DIR,
         DCPXD_MAX_POLL_MS, DCPXD_DEFAULT_POLL_MS,
         DCPXD_DEFAULT_JOIN_TIMEOUT_MS, DCPXD_DEFAULT_HELLO_TIMEOUT_MS,
         DCPXD_DEFAULT_IDLE_TIMEOUT_MS, DCPXD_DEFAULT_MAX_CONNS_PER_UID,
         DCPXD_DEFAULT_MAX_GROUPS_PER_UID, DCPXD_LOG_DEFAULT_BURST,
         DCPXD_LOG_DEFAULT_INTERVAL_MS);
}

static void version(void) {
  printf("dcpxd %s (protocol %u, %s)\n", DCPX_VERSION_STRING,
         DCPX_PROTO_VERSION,
#ifdef HAVE_LIBSYSTEMD
         "+libsystemd"
#else
         "-libsystemd"
#endif
  );
}

static int parse_bool(const char *v) {
  static const char *const yes[] = {"1", "yes", "true", "on"};
  static const char *const no[] = {"0", "no", "false", "off"};
  for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
    if (strcasecmp(v, yes[i]) == 0)
      return 1;
    if (strcasecmp(v, no[i]) == 0)
      return 0;
  }
  return -EINVAL;
}

/* "4194304", "4M", "4MiB", "512K", "1G" (binary units). */
static int parse_size(const char *v, uint64_t *ret) {
  char *end;
  unsigned long long n;
  uint64_t mul = 1;

  if (!isdigit((unsigned char)*v))
    return -EINVAL;
  errno = 0;
  n = strtoull(v, &end, 10);
  if (errno)
    return -errno;
  switch (toupper((unsigned char)*end)) {
  case '\0':
    break;
  case 'K':
    mul = 1ull << 10;
    end++;
    break;
  case 'M':
    mul = 1ull << 20;
    end++;
    break;
  case 'G':
    mul = 1ull << 30;
    end++;
    break;
  case 'T':
    mul = 1ull << 40;
    end++;
    break;
  default:
    return -EINVAL;
  }
  if (mul > 1 && (strcasecmp(end, "ib") == 0 || strcasecmp(end, "b") == 0))
    end += strlen(end);
  if (*end)
    return -EINVAL;
  if (n > UINT64_MAX / mul)
    return -ERANGE;
  *ret = n * mul;
  return 0;
}

/* The error for SIZE value v of key that parse_size refused (r): what is
 * wrong with it, not the key's range, which a value that is no size at all
 * does not help with ("4 K" got "must be a size from 4K to 1T"). A blank
 * inside is named, with the value to write instead. */
static int size_error(const char *where, const char *key, const char *v,
                      int r) {
  char packed[64];
  size_t n = 0;
  uint64_t u;

  if (r == -ERANGE)
    return log_error_errno(-EINVAL, "%s: %s '%s' is not a size: 2^64 bytes "
                           "or more", where, key, v);
  for (const char *p = v; *p && n < sizeof(packed) - 1; p++)
    if (!isblank((unsigned char)*p))
      packed[n++] = *p;
  packed[n] = '\0';
  if (strpbrk(v, " \t") && parse_size(packed, &u) == 0)
    return log_error_errno(-EINVAL, "%s: %s '%s' is not a size: a size has "
                           "no blank inside (write '%s')",
                           where, key, v, packed);
  return log_error_errno(-EINVAL, "%s: %s '%s' is not a size (bytes, or a "
                         "number with K, M, G or T, such as 4096 or 4M)",
                         where, key, v);
}

/* Appends the ids of a comma/blank separated list of numbers or names. */
static int parse_id_list(const char *v, bool group, uint32_t **list, size_t *n,
                         const char *where) {
  _cleanup_free_ char *copy = strdup(v);
  char *save = NULL;

  if (!copy)
    return -ENOMEM;
  for (char *tok = strtok_r(copy, ", \t", &save); tok;
       tok = strtok_r(NULL, ", \t", &save)) {
    uint32_t id;
    if (dcpxd_parse_u32(tok, 10, &id) < 0) {
      if (group) {
        struct group *g = getgrnam(tok);
        if (!g)
          return log_error_errno(-EINVAL, "%s: unknown group '%s'", where, tok);
        id = (uint32_t)g->gr_gid;
      } else {
        struct passwd *p = getpwnam(tok);
        if (!p)
          return log_error_errno(-EINVAL, "%s: unknown user '%s'", where, tok);
        id = (uint32_t)p->pw_uid;
      }
    }
    uint32_t *nl = realloc(*list, (*n + 1) * sizeof(**list));
    if (!nl)
      return -ENOMEM;
    nl[(*n)++] = id;
    *list = nl;
  }
  return 0;
}

static int set_string(char **dst, const char *v) {
  char *s = strdup(v);
  if (!s)
    return -ENOMEM;
  free(*dst);
  *dst = s;
  return 0;
}

/* allow-uid, allow-gid, admin-gid: a later source replaces the list,
 * repeated flags add to it. */
static int set_id_list(dcpxd_conf *c, const char *key, const char *v,
                       int source, const char *where) {
  bool admin = key[1] == 'd', group = admin || key[6] == 'g';
  int *src = admin ? &c->admin_source
                   : group ? &c->gids_source : &c->uids_source;
  uint32_t **list = admin   ? (uint32_t **)&c->admin_gids
                    : group ? (uint32_t **)&c->allow_gids
                            : (uint32_t **)&c->allow_uids;
  size_t *n = admin ? &c->n_admin_gids
                    : group ? &c->n_allow_gids : &c->n_allow_uids;
  if (*src != source) {
    free(*list);
    *list = NULL;
    *n = 0;
    *src = source;
  }
  return parse_id_list(v, group, list, n, where);
}

static void owner_rules_free(dcpxd_conf *c) {
  for (size_t i = 0; i < c->n_owner_rules; i++)
    free(c->owner_rules[i].pattern);
  free(c->owner_rules);
  c->owner_rules = NULL;
  c->n_owner_rules = 0;
}

/* PATTERN:uid:ID or PATTERN:gid:ID; the pattern of name bytes and the glob
 * characters *?[]!. A later source replaces the rules, repeated flags add
 * to them. */
static int add_owner_rule(dcpxd_conf *c, const char *v, int source,
                          const char *where) {
  const char *k = strchr(v, ':');
  dcpxd_owner_rule *nr, rule = {0};
  uint32_t *ids = NULL;
  size_t n = 0;
  int r;

  if (!k || k == v || (strncmp(k, ":uid:", 5) && strncmp(k, ":gid:", 5)) ||
      strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                "0123456789._-*?[]!") != (size_t)(k - v))
    return log_error_errno(-EINVAL,
                           "%s: group-owner '%s' must be PATTERN:uid:USER or "
                           "PATTERN:gid:GROUP",
                           where, v);
  rule.is_gid = k[1] == 'g';
  r = parse_id_list(k + 5, rule.is_gid, &ids, &n, where);
  if (r < 0 || n != 1) {
    free(ids);
    return r < 0 ? r
                 : log_error_errno(-EINVAL, "%s: group-owner '%s' names %zu "
                                            "ids, not one",
                                   where, v, n);
  }
  rule.id = ids[0];
  free(ids);
  if (c->owner_source != source) {
    owner_rules_free(c);
    c->owner_source = source;
  }
  nr = realloc(c->owner_rules, (c->n_owner_rules + 1) * sizeof(*nr));
  if (!nr || !(rule.pattern = strndup(v, (size_t)(k - v)))) {
    if (nr)
      c->owner_rules = nr;
    return -ENOMEM;
  }
  c->owner_rules = nr;
  c->owner_rules[c->n_owner_rules++] = rule;
  return 0;
}

const dcpxd_owner_rule *dcpxd_conf_owner_rule(const dcpxd_conf *c,
                                              const char *group) {
  for (size_t i = 0; i < c->n_owner_rules; i++)
    if (fnmatch(c->owner_rules[i].pattern, group, 0) == 0)
      return &c->owner_rules[i];
  return NULL;
}

/* A duration in ms, 1..max. */
static int set_ms(uint32_t *dst, const char *key, const char *v, uint32_t max,
                  const char *where) {
  uint64_t u;
  if (dcpxd_parse_u64(v, 10, &u) < 0 || u < 1 || u > max)
    return log_error_errno(-EINVAL, "%s: %s '%s' must be 1..%u", where, key, v,
                           max);
  *dst = (uint32_t)u;
  return 0;
}

/* Applies one setting. `where` names its source for error messages. */
static int conf_set(dcpxd_conf *c, const char *key, const char *v, int source,
                    const char *where) {
  uint64_t u = 0;
  int r;

  if (strcmp(key, "socket") == 0) {
    if (!*v || strlen(v) >= sizeof(((struct sockaddr_un *)0)->sun_path))
      return log_error_errno(-EINVAL,
                             "%s: socket path must be 1..%zu bytes long", where,
                             sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    if (v[0] != '/')
      log_warning("%s: socket path '%s' is relative: it is taken from "
                  "dcpxd's working directory, which engines do not share",
                  where, v);
    return set_string(&c->socket_path, v);
  }
  if (strcmp(key, "socket-mode") == 0) {
    if (dcpxd_parse_u64(v, 8, &u) < 0 || u > 0777)
      return log_error_errno(-EINVAL,
                             "%s: socket-mode '%s' is not an octal mode of "
                             "permission bits (0..0777)",
                             where, v);
    if (!(u & 0022) && !(u & 0200))
      log_warning("%s: socket-mode %04o lets nobody but root connect "
                  "(connecting needs write permission)",
                  where, (unsigned)u);
    c->socket_mode = (mode_t)u;
    return 0;
  }
  if (strcmp(key, "state-dir") == 0) {
    if (!*v)
      return log_error_errno(-EINVAL, "%s: state-dir is empty", where);
    return set_string(&c->state_dir, v);
  }
  if (strcmp(key, "poll-ms") == 0) {
    if (dcpxd_parse_u64(v, 10, &u) < 0 || u < 1 || u > DCPXD_MAX_POLL_MS)
      return log_error_errno(
          -EINVAL,
          "%s: poll-ms '%s' must be 1..%u (the alarm scan bounds how soon "
          "a group aborts after a timeout)",
          where, v, DCPXD_MAX_POLL_MS);
    c->poll_ms = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "join-timeout-ms") == 0) {
    if (dcpxd_parse_u64(v, 10, &u) < 0 || u < 1 ||
        u > DCPX_MAX_JOIN_TIMEOUT_MS)
      return log_error_errno(-EINVAL,
                             "%s: join-timeout-ms '%s' must be 1..%u", where,
                             v, DCPX_MAX_JOIN_TIMEOUT_MS);
    c->join_timeout_ms = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "allow-uid") == 0 || strcmp(key, "allow-gid") == 0 ||
      strcmp(key, "admin-gid") == 0)
    return set_id_list(c, key, v, source, where);
  if (strcmp(key, "group-owner") == 0)
    return add_owner_rule(c, v, source, where);
  if (strcmp(key, "hello-timeout-ms") == 0)
    return set_ms(&c->hello_timeout_ms, key, v, 600000u, where);
  if (strcmp(key, "idle-timeout-ms") == 0)
    return set_ms(&c->idle_timeout_ms, key, v, 86400000u, where);
  if (strcmp(key, "max-queued-bytes") == 0) {
    if ((r = parse_size(v, &u)) == -EINVAL)
      return size_error(where, key, v, r);
    if (r < 0 || u < 4096)
      return log_error_errno(
          -EINVAL, "%s: max-queued-bytes '%s' must be a size of 4K or more",
          where, v);
    c->max_queued_bytes = u;
    return 0;
  }
  if (strcmp(key, "max-groups-per-uid") == 0) {
    if (dcpxd_parse_u64(v, 10, &u) < 0 || u < 1 || u > 65536)
      return log_error_errno(
          -EINVAL, "%s: max-groups-per-uid '%s' must be 1..65536", where, v);
    c->max_groups_per_uid = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "max-workspace-bytes") == 0 ||
      strcmp(key, "max-workspace-bytes-per-uid") == 0) {
    if ((r = parse_size(v, &u)) < 0)
      return size_error(where, key, v, r);
    if (strcmp(key, "max-workspace-bytes") == 0)
      c->max_ws_bytes = u;
    else
      c->max_ws_bytes_per_uid = u;
    return 0;
  }
  if (strcmp(key, "max-conns-per-uid") == 0) {
    if (dcpxd_parse_u64(v, 10, &u) < 0 || u < 1 || u > 4096)
      return log_error_errno(
          -EINVAL, "%s: max-conns-per-uid '%s' must be 1..4096", where, v);
    c->max_conns_per_uid = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "enable-fault-injection") == 0) {
    r = parse_bool(v);
    if (r < 0)
      return log_error_errno(-EINVAL, "%s: '%s' is not a boolean", where, v);
    c->fault_injection = r;
    return 0;
  }
  if (strcmp(key, "records-max-bytes") == 0) {
    if ((r = parse_size(v, &u)) == -EINVAL)
      return size_error(where, key, v, r);
    if (r < 0 || u < 4096 || u > (1ull << 40))
      return log_error_errno(
          -EINVAL, "%s: records-max-bytes '%s' must be a size from 4K to 1T",
          where, v);
    c->records_max_bytes = u;
    return 0;
  }
  if (strcmp(key, "log-rate-burst") == 0) {
    if (dcpxd_parse_u64(v, 10, &u) < 0 || u > 1000000)
      return log_error_errno(
          -EINVAL, "%s: log-rate-burst '%s' must be 0..1000000", where, v);
    c->log_rate_burst = (uint32_t)u;
    return 0;
  }
  if (strcmp(key, "log-rate-interval-ms") == 0)
    return set_ms(&c->log_rate_interval_ms, key, v, 3600000u, where);
  if (strcmp(key, "log-level") == 0) {
    r = dcpxd_log_level_from_string(v);
    if (r < 0)
      return log_error_errno(-EINVAL, "%s: unknown log-level '%s'", where, v);
    c->log_level = r;
    return 0;
  }
  return log_error_errno(-EINVAL, "%s: unknown setting '%s'", where, key);
}

/* The config file goes through inih (ini_parse_stream). inih itself knows
 * nothing of line numbers in its handler (Debian builds it without
 * INI_HANDLER_LINENO) and, built without INI_STOP_ON_FIRST_ERROR, goes on
 * after a bad line; so it reads through conf_read_line(), which counts the
 * lines, refuses what inih would silently mangle, and ends the parse (EOF)
 * at the first error, so that exactly one error, with its line, is logged. */
typedef struct conf_file {
  FILE *f;
  const char *path;
  dcpxd_conf *c;
  unsigned lineno;  /* the line inih has last been given */
  bool key_line;    /* that line holds a setting: the handler must see it */
  bool handled;     /* the handler has seen it */
  int error;        /* the first error, logged; stops the parse */
} conf_file;

static void conf_where(const conf_file *cf, char *where, size_t size) {
  snprintf(where, size, "%s:%u", cf->path, cf->lineno);
}

/* Logs the first error of the file, with its line, and ends the parse. */
static int conf_file_error(conf_file *cf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int conf_file_error(conf_file *cf, const char *fmt, ...) {
  char where[PATH_MAX + 32], text[512];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  conf_where(cf, where, sizeof(where));
  return cf->error = log_error_errno(-EINVAL, "%s: %s", where, text);
}

/* A line that inih took for a setting but did not hand over was one it
 * could not parse: no '=' (or ':'). */
static bool conf_check_last_line(conf_file *cf) {
  if (!cf->error && cf->key_line && !cf->handled)
    conf_file_error(cf, "expected 'key = value'");
  return !cf->error;
}

/* inih's reader (fgets-like). Hands inih one line at a time, with its
 * leading blanks removed: inih would take an indented line for the
 * continuation of the previous value, while here blanks before a key mean
 * nothing. A NUL byte, a line longer than inih's buffer (which inih would
 * split in two) and a [section] header are errors. */
static char *conf_read_line(char *str, int num, void *stream) {
  conf_file *cf = stream;
  size_t n = 0, cap = (size_t)num - 1;
  bool at_start = true;
  int ch;

  if (!conf_check_last_line(cf))
    return NULL;
  while ((ch = getc(cf->f)) != EOF) {
    if (at_start && (ch == ' ' || ch == '\t'))
      continue;
    at_start = false;
    if (ch == '\0') {
      cf->lineno++;
      conf_file_error(cf, "NUL byte in line");
      return NULL;
    }
    if (n == cap && ch == '\n')
      break; /* a full line: inih takes it without its newline */
    if (n == cap) {
      cf->lineno++;
      conf_file_error(cf, "line longer than %zu bytes", cap);
      return NULL;
    }
    str[n++] = (char)ch;
    if (ch == '\n')
      break;
  }
  if (n == 0 && ch == EOF)
    return NULL;
  str[n] = '\0';
  cf->lineno++;
  cf->handled = false;
  cf->key_line = !strchr("#;\r\n", str[0]);
  if (str[0] == '[') {
    conf_file_error(cf, "sections are not used: settings are 'key = value' "
                        "lines");
    return NULL;
  }
  return str;
}

/* inih's handler: one "key = value" line, the value with inih's
 * inline ';' comment gone and blanks stripped. What remains here is the
 * rest of the format: '_' for '-' in keys, a '#' comment after a blank,
 * "double quotes". Returns 0 (an error) to inih only for form; the parse
 * ends at the next read anyway. */
static int conf_handler(void *user, const char *section, const char *name,
                        const char *value) {
  conf_file *cf = user;
  char key[64], val[4096], where[PATH_MAX + 32];

  (void)section; /* always "": the reader refuses [section] lines */
  cf->handled = true;
  if (cf->error)
    return 0;
  if (!*name)
    return conf_file_error(cf, "missing key"), 0;
  if (strlen(name) >= sizeof(key))
    return conf_file_error(cf, "unknown setting '%.40s...'", name), 0;
  strcpy(key, name);
  for (char *p = key; *p; p++)
    if (*p == '_')
      *p = '-';
  if (strlen(value) >= sizeof(val))
    return conf_file_error(cf, "value too long"), 0;
  strcpy(val, value);
  if (*val == '"') {
    char *q = strchr(val + 1, '"'), *rest;
    if (!q)
      return conf_file_error(cf, "unterminated quote"), 0;
    *q = '\0';
    rest = q + 1 + strspn(q + 1, " \t\r");
    if (*rest && *rest != '#')
      return conf_file_error(cf, "text after closing quote"), 0;
    memmove(val, val + 1, strlen(val + 1) + 1);
  } else {
    for (char *h = val; (h = strchr(h, '#')); h++)
      if (h > val && isblank((unsigned char)h[-1])) {
        *h = '\0';
        while (h > val && isblank((unsigned char)h[-1]))
          *--h = '\0';
        break;
      }
    val[strcspn(val, "\r")] = '\0';
  }
  if (strcmp(key, "config") == 0)
    return conf_file_error(cf, "'config' cannot be set in a file"), 0;
  conf_where(cf, where, sizeof(where));
  cf->error = conf_set(cf->c, key, val, SRC_FILE, where);
  return cf->error == 0;
}

/* Opens the config file for reading. O_NONBLOCK: the open of a FIFO with
 * no writer would wait for one (dcpxd hung at start, before its first log
 * line); a FIFO or a socket is refused, a directory too. A regular file or
 * a character device (/dev/null: no settings) is read, blocking. NULL with
 * errno (ENOENT for a missing file: not logged here), else logged. */
static FILE *conf_open(const char *path, bool *logged) {
  struct stat st;
  FILE *f;
  int fd;

  *logged = false;
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return NULL;
  *logged = true;
  if (fstat(fd, &st) < 0)
    log_error_errno(-errno, "Cannot read config file %s: %m", path);
  else if (S_ISDIR(st.st_mode))
    log_error_errno(-EISDIR, "Cannot read config file %s: %m", path);
  else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
    log_error("Cannot read config file %s: not a regular file (a FIFO, a "
              "socket or a block device)",
              path);
  else
    *logged = false;
  if (*logged) {
    close(fd);
    return NULL;
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0 ||
      !(f = fdopen(fd, "r"))) {
    *logged = true;
    log_error_errno(-errno, "Cannot read config file %s: %m", path);
    close(fd);
    return NULL;
  }
  return f;
}

static int conf_load_file(dcpxd_conf *c, const char *path, bool must_exist) {
  bool logged;
  _cleanup_fclose_ FILE *f = conf_open(path, &logged);
  conf_file cf = {.f = f, .path = path, .c = c};
  int r;

  if (!f) {
    if (logged)
      return -EINVAL;
    if (errno == ENOENT && !must_exist)
      return 0;
    return log_error_errno(-errno, "Cannot read config file %s: %m", path);
  }
  r = ini_parse_stream(conf_read_line, &cf, conf_handler, &cf);
  if (cf.error)
    return cf.error;
  if (ferror(f))
    return log_error_errno(-EIO, "Cannot read config file %s", path);
  if (!conf_check_last_line(&cf))
    return cf.error;
  if (r > 0) /* inih found an error that the checks above did not */
    return log_error_errno(-EINVAL, "%s:%d: expected 'key = value'", path, r);
  if (r < 0)
    return log_error_errno(-ENOMEM, "Cannot parse config file %s", path);
  return 0;
}

static void conf_defaults(dcpxd_conf *c) {
  memset(c, 0, sizeof(*c));
  c->socket_mode = 0660;
  c->poll_ms = DCPXD_DEFAULT_POLL_MS;
  c->join_timeout_ms = DCPXD_DEFAULT_JOIN_TIMEOUT_MS;
  c->records_max_bytes = DCPXD_DEFAULT_RECORDS_MAX_BYTES;
  c->hello_timeout_ms = DCPXD_DEFAULT_HELLO_TIMEOUT_MS;
  c->idle_timeout_ms = DCPXD_DEFAULT_IDLE_TIMEOUT_MS;
  c->max_conns_per_uid = DCPXD_DEFAULT_MAX_CONNS_PER_UID;
  c->max_groups_per_uid = DCPXD_DEFAULT_MAX_GROUPS_PER_UID;
  c->max_queued_bytes = DCPXD_DEFAULT_MAX_QUEUED_BYTES;
  c->log_level = LOG_INFO;
  c->log_rate_burst = DCPXD_LOG_DEFAULT_BURST;
  c->log_rate_interval_ms = DCPXD_LOG_DEFAULT_INTERVAL_MS;
}

int dcpxd_conf_load(dcpxd_conf *c, int argc, char **argv) {
  const char *config = NULL;
  bool explicit_config = false;
  int opt, idx, r;

  conf_defaults(c);
  if (set_string(&c->socket_path, DCPXD_DEFAULT_SOCKET) < 0 ||
      set_string(&c->state_dir, DCPXD_DEFAULT_STATE_DIR) < 0)
    return -ENOMEM;

  /* Pass 1: --config, --help, --version (getopt is silent here; pass 2
   * reports bad flags). */
  opterr = 0;
  optind = 0;
  while ((opt = getopt_long(argc, argv, "c:hV", long_options, &idx)) != -1) {
    if (opt == OPT_HELP) {
      help();
      return DCPXD_CONF_EXIT;
    }
    if (opt == OPT_VERSION) {
      version();
      return DCPXD_CONF_EXIT;
    }
    if (opt == OPT_CONFIG) {
      config = optarg;
      explicit_config = true;
    }
  }

  if (!explicit_config)
    config = DCPXD_DEFAULT_CONFIG;
  if (config && *config) {
    r = conf_load_file(c, config, explicit_config);
    if (r < 0)
      return -EINVAL;
    if (explicit_config || access(config, F_OK) == 0)
      if (set_string(&c->config_path, config) < 0)
        return -ENOMEM;
  }

  /* Pass 2: every setting flag, over the file. getopt stays silent: the
   * reason goes through the log, with its priority (under journald a
   * bare line of getopt's would be logged as information). */
  opterr = 0;
  optind = 0;
  while ((opt = getopt_long(argc, argv, ":c:hV", long_options, &idx)) != -1) {
    if (opt == '?' || opt == ':') {
      const char *arg = argv[optind - 1];
      if (opt == ':')
        return log_error_errno(-EINVAL, "Option '%s' needs a value (see "
                                        "dcpxd --help)", arg);
      if (arg[0] == '-' && arg[1] == '-') /* optopt: not for long ones */
        return log_error_errno(-EINVAL, "Option '%s' is unknown, ambiguous "
                                        "or takes no value (see dcpxd "
                                        "--help)", arg);
      if (optopt)
        return log_error_errno(-EINVAL, "Unknown option '-%c' (see dcpxd "
                                        "--help)", optopt);
      return log_error_errno(-EINVAL, "Unknown option '%s' (see dcpxd "
                                      "--help)", arg);
    }
    if (opt >= OPT_SETTING && opt < OPT_SETTING + N_SETTINGS) {
      const char *key = long_options[opt - OPT_SETTING].name;
      char where[64];
      dcpxd_bprintf(where, "--%s", key);
      r = conf_set(c, key, optarg ? optarg : "yes", SRC_FLAG, where);
      if (r < 0)
        return -EINVAL;
    }
  }
  if (optind < argc)
    return log_error_errno(
        -EINVAL, "Unexpected argument '%s' (see dcpxd --help)", argv[optind]);
  return DCPXD_CONF_RUN;
}

void dcpxd_conf_done(dcpxd_conf *c) {
  free(c->socket_path);
  free(c->state_dir);
  free(c->allow_uids);
  free(c->allow_gids);
  free(c->admin_gids);
  owner_rules_free(c);
  free(c->config_path);
  memset(c, 0, sizeof(*c));
}

static bool gid_listed(const gid_t *list, size_t n, const gid_t *gids,
                       size_t n_gids) {
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n_gids; j++)
      if (list[i] == gids[j])
        return true;
  return false;
}

bool dcpxd_conf_peer_admin(const dcpxd_conf *c, uid_t uid, const gid_t *gids,
                           size_t n_gids) {
  return uid == 0 || uid == getuid() ||
         gid_listed(c->admin_gids, c->n_admin_gids, gids, n_gids);
}

bool dcpxd_conf_peer_allowed(const dcpxd_conf *c, uid_t uid, const gid_t *gids,
                             size_t n_gids) {
  if (uid == 0 || uid == getuid())
    return true;
  for (size_t i = 0; i < c->n_allow_uids; i++)
    if (c->allow_uids[i] == uid)
      return true;
  return gid_listed(c->allow_gids, c->n_allow_gids, gids, n_gids) ||
         gid_listed(c->admin_gids, c->n_admin_gids, gids, n_gids);
}
