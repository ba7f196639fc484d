/* dcpxd-query.c - the operator side: Query (groups, health, stats, records)
 * and Command (reset, fault stall), as sent by dcpxctl.
 *
 * Every Query gets a QueryReply, every Command a Reply. Replies are built
 * on the stack or in one allocation per group and freed once sent; nothing
 * here changes a group except through dcpxd-group.c.
 *
 * A reply must fit one packet: the frame limit (DCPX_FRAME_MAX) and, on
 * kernels with the default wmem_max, the socket's send buffer (about
 * 200 KiB). Replies are therefore held under REPLY_BUDGET bytes: a records
 * answer drops its oldest entries (and says so in records_note), a groups
 * answer its last groups, the groups that are not healthy coming first
 * (and says how many in groups_left_out). Both fit in one pass over the
 * items' sizes (fit_items).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcpxd-log.h"
#include "dcpxd-util.h"
#include "dcpxd.h"

#define REPLY_BUDGET (128u * 1024u)

typedef struct ginfo {
  Dcpx__GroupInfo gi;
  Dcpx__Shape shape;
  Dcpx__RankInfo ri[DCPX_MAX_WORLD];
  Dcpx__RankInfo *rip[DCPX_MAX_WORLD];
  Dcpx__Record last;
} ginfo;

static void fill_record(Dcpx__Record *out, const dcpxd_record *r) {
  dcpx__record__init(out);
  out->group = (char *)r->group;
  out->generation = r->generation;
  out->rank = r->rank;
  out->kind = r->kind;
  out->region = r->region;
  out->region_name = (char *)dcpxd_region_name(r->region);
  out->index = r->index;
  out->expected = r->expected;
  out->seen = r->seen;
  out->block = r->block;
  out->time_ns = r->time_ns;
  out->call_tag = r->call_tag;
  out->has_awaited_rank = r->has_awaited_rank;
  out->awaited_rank = r->awaited_rank;
}

/* Rank health h's fault hook into ri (armed, with what; or fired). The
 * words are dcpxd's own (dcpxd_group_fault_stall) but fault_fired, which
 * the stalling rank writes. */
static void fill_fault(Dcpx__RankInfo *ri, const dcpx_rank_health *h) {
  if (!__atomic_load_n(&h->fault_armed, __ATOMIC_ACQUIRE))
    return;
  ri->fault = h->fault_fired ? DCPX__RANK_INFO__FAULT_HOOK__FAULT_FIRED
                             : DCPX__RANK_INFO__FAULT_HOOK__FAULT_ARMED;
  ri->fault_epoch = h->fault_epoch;
  ri->fault_any_call = h->fault_call == ~(uint64_t)0;
  ri->fault_call = ri->fault_any_call ? 0 : h->fault_call;
  ri->fault_ticks = h->fault_ticks;
}

static void fill_group(ginfo *x, dcpxd_group *g) {
  Dcpx__GroupInfo *gi = &x->gi;

  dcpx__group_info__init(gi);
  dcpx__shape_to_pb(&g->shape, &x->shape);
  gi->name = g->name;
  gi->shape = &x->shape;
  gi->transport = g->transport;
  if (g->transport == DCPX__TRANSPORT__TRANSPORT_AUTO && g->hdr) {
    /* auto: the transport the ranks resolved, once all agree */
    uint32_t t = dcpxd_group_health(g, 0)->transport;
    for (uint32_t r = 1; r < g->shape.world && t; r++)
      if (dcpxd_group_health(g, r)->transport != t)
        t = 0;
    if (t == DCPX_TRANSPORT_LL || t == DCPX_TRANSPORT_NCCL)
      gi->transport = (Dcpx__Transport)t;
  }
  gi->backend = g->backend;
  gi->state = (char *)dcpxd_group_state_name(g);
  gi->generation = g->generation;
  gi->abort = g->hdr ? g->hdr->abort : 0;
  gi->joined = g->live;
  gi->timeout_ns = g->timeout_ns;
  gi->aborts = g->aborts;
  gi->recoveries = g->recoveries;
  gi->awaiting_reattach = g->awaiting;
  gi->adopted = g->adopted;
  for (uint32_t r = 0; r < g->shape.world; r++) {
    Dcpx__RankInfo *ri = &x->ri[r];
    dcpx__rank_info__init(ri);
    ri->rank = r;
    ri->device = g->member[r].device;
    ri->device_uuid.len = g->member[r].uuid_len;
    ri->device_uuid.data = (uint8_t *)g->member[r].uuid;
    ri->timeouts = g->member[r].timeouts;
    ri->awaited_timeouts = g->member[r].awaited_timeouts;
    ri->acknowledged =
        g->state == DCPXD_GROUP_RECOVERING && g->member[r].acked;
    if (g->hdr) {
      const dcpx_rank_health *h = dcpxd_group_health(g, r);
      /* a rank awaited since a restart is not attached to this daemon,
       * though its page says joined (it comes back, or it is dead) */
      ri->joined = h->joined != 0 && !((g->awaiting >> r) & 1u);
      ri->pid = h->pid;
      ri->alarm = h->alarm != 0;
      ri->failed = h->failed != 0;
      ri->calls = h->calls;
      ri->rows = h->rows;
      ri->rescue_rows = h->rescue_rows;
      ri->failed_calls = h->failed_calls;
      fill_fault(ri, h);
    } else {
      ri->joined = g->member[r].conn != NULL;
      ri->pid = ri->joined ? (uint32_t)g->member[r].pid : 0;
    }
    x->rip[r] = ri;
  }
  gi->n_ranks = g->shape.world;
  gi->ranks = x->rip;
  if (g->has_last_record) {
    fill_record(&x->last, &g->last_record);
    gi->last_record = &x->last;
  }
}

/* The groups file's entries with no group here: dcpxd restarted and none
 * of the group's ranks has reattached yet (a member reattaches at its
 * next exchange with dcpxd: dcpx_poll, dcpx_recover, dcpx_leave). Without
 * them a query would show nothing of a node whose groups run on, and a
 * health check would say OK. Entry i of the file, if c may see it and
 * the query asks for it: its ranks whose processes are alive, as a mask
 * (ranks < 32; 0: none alive, or an entry of an older dcpxd without
 * pids: not shown). */
static int cmp_name(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names of the daemon's groups, sorted (n of them), for the entries'
 * look-ups: one bsearch each, not a walk of the group list (a node may
 * hold thousands). */
static const char **group_names(dcpxd_manager *m, size_t n) {
  const char **v = calloc(n ? n : 1, sizeof(*v));
  dcpxd_group *g;
  size_t k = 0;
  if (!v)
    return NULL;
  TAILQ_FOREACH(g, &m->groups, link) {
    if (k < n)
      v[k++] = g->name;
  }
  qsort(v, k, sizeof(*v), cmp_name);
  return v;
}

static uint32_t unattached_mask(dcpxd_conn *c, const Dcpx__Query *q,
                                const char **names, size_t n_names,
                                size_t i, const char **ret_name,
                                uint32_t *ret_world) {
  uid_t owner;
  uint32_t n_pids;
  const char *name = dcpxd_secrets_entry(c->m->secrets, i, &owner, &n_pids);
  if (!name ||
      bsearch(&name, names, n_names, sizeof(*names), cmp_name) ||
      (q->group && *q->group && strcmp(q->group, name) != 0) ||
      (!c->admin && c->uid != owner))
    return 0;
  *ret_name = name;
  *ret_world = n_pids;
  return dcpxd_secrets_live_at(c->m->secrets, i);
}

/* Such a group as a GroupInfo: state "unattached", its world (the rest of
 * its shape is not known until a rank reattaches), the live ranks as
 * awaiting_reattach. */
static void fill_unattached(ginfo *x, const char *name, uint32_t world,
                            uint32_t mask) {
  Dcpx__GroupInfo *gi = &x->gi;
  dcpx__group_info__init(gi);
  dcpx__shape__init(&x->shape);
  x->shape.world = world;
  gi->name = (char *)name;
  gi->shape = &x->shape;
  gi->state = "unattached";
  gi->awaiting_reattach = mask;
}

static void send_query_reply(dcpxd_conn *c, Dcpx__QueryReply *qr) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  int r;

  f.msg_case = DCPX__FRAME__MSG_QUERY_REPLY;
  f.query_reply = qr;
  r = dcpxd_conn_send(c, &f, NULL, 0);
  if (r == DCPX_E_MSGSIZE) {
    /* Still too big for this socket: answer with the reason instead. */
    Dcpx__QueryReply err = DCPX__QUERY_REPLY__INIT;
    Dcpx__Reply rep = DCPX__REPLY__INIT;
    rep.status = DCPX_E_MSGSIZE;
    rep.error = "reply too large for one packet; narrow the query";
    rep.version = DCPX_PROTO_VERSION;
    err.reply = &rep;
    f.query_reply = &err;
    dcpxd_conn_send(c, &f, NULL, 0);
  }
}

static void query_error(dcpxd_conn *c, int status, const char *msg) {
  Dcpx__QueryReply qr = DCPX__QUERY_REPLY__INIT;
  Dcpx__Reply rep = DCPX__REPLY__INIT;
  char text[256];
  dcpxd_bprintf(text, "%s", msg);
  dcpx__text_clean(text);
  rep.status = status;
  rep.error = text;
  rep.version = DCPX_PROTO_VERSION;
  qr.reply = &rep;
  send_query_reply(c, &qr);
}

/* Bytes of a length-delimited field of `len` bytes (tag of a field number
 * below 16: one byte; the length as a varint). */
static size_t field_bytes(size_t len) {
  size_t v = 1;
  for (size_t x = len; x >= 0x80; x >>= 7)
    v++;
  return 1 + v + len;
}

/* How many of the n groups (or records: one of the two arrays set) fit
 * the reply budget with the reply qr holds besides them, taking them from
 * the front (groups) or the back (records, the newest): one pass over
 * their sizes, not a packing of the whole reply per one left out. */
static size_t fit_items(Dcpx__QueryReply *qr, Dcpx__GroupInfo **gs,
                        Dcpx__Record **rs, size_t n) {
  const size_t ng = qr->n_groups, nr = qr->n_records;
  size_t used, k = 0;
  qr->n_groups = 0;
  qr->n_records = 0;
  /* the note may grow to its buffer's size once the count is known */
  used = dcpx__query_reply__get_packed_size(qr) + 3u + 768u;
  qr->n_groups = ng;
  qr->n_records = nr;
  for (; k < n; k++) {
    const size_t b =
        field_bytes(gs ? dcpx__group_info__get_packed_size(gs[k])
                       : dcpx__record__get_packed_size(rs[n - 1 - k]));
    if (used + b > REPLY_BUDGET)
      break;
    used += b;
  }
  return k;
}

/* The refused reattaches c may see (an admin all, anyone else those of
 * its own uid), of processes that live, of group q->group if named:
 * into out[] (DCPXD_REFUSALS_MAX), pointers into ptrs; returns how many. */
static size_t refusals_of(dcpxd_conn *c, const Dcpx__Query *q,
                          Dcpx__ReattachRefusal *out,
                          Dcpx__ReattachRefusal **ptrs) {
  dcpxd_manager *m = c->m;
  size_t n = 0;
  const uint64_t now = dcpxd_now_ns(CLOCK_REALTIME);
  for (size_t i = 0; i < m->n_refusals; i++) {
    dcpxd_refusal *r = &m->refusals[i];
    if (!dcpxd_pid_live(r->pid, 0) ||
        now - r->last_ns > DCPXD_REFUSAL_TTL_NS)
      continue; /* gone, or left (no retry for a minute) */
    if ((!c->admin && r->uid != c->uid) ||
        (q->group && *q->group && strcmp(q->group, r->group) != 0))
      continue;
    Dcpx__ReattachRefusal *o = &out[n];
    dcpx__reattach_refusal__init(o);
    o->group = r->group;
    o->rank = r->rank;
    o->pid = (int32_t)r->pid;
    o->status = r->status;
    o->reason = r->reason;
    o->attempts = r->attempts;
    o->last_ns = r->last_ns;
    ptrs[n++] = o;
  }
  return n;
}

static void query_groups(dcpxd_conn *c, const Dcpx__Query *q) {
  dcpxd_manager *m = c->m;
  Dcpx__QueryReply qr = DCPX__QUERY_REPLY__INIT;
  Dcpx__Reply rep = DCPX__REPLY__INIT;
  _cleanup_free_ ginfo *infos = NULL;
  _cleanup_free_ Dcpx__GroupInfo **ptrs = NULL;
  char note[128] = "", msg[128];
  dcpxd_group *g;
  size_t n = 0, total;
  const size_t nsec = dcpxd_secrets_count(m->secrets);
  const char *uname = NULL;
  uint32_t uworld = 0;
  _cleanup_free_ const char **names = NULL;
  size_t n_names = 0;

  TAILQ_FOREACH(g, &m->groups, link) {
    n_names++;
  }
  names = group_names(m, n_names);
  if (!names)
    return query_error(c, DCPX_E_NOMEM, "out of memory");
  Dcpx__ReattachRefusal refusals[DCPXD_REFUSALS_MAX];
  Dcpx__ReattachRefusal *refusal_ptrs[DCPXD_REFUSALS_MAX];
  qr.n_refused_reattaches = refusals_of(c, q, refusals, refusal_ptrs);
  qr.refused_reattaches = refusal_ptrs;
  char state_error[PATH_MAX + 160];
  const int save_error = dcpxd_secrets_save_error(m->secrets);
  if (save_error) {
    dcpxd_bprintf(state_error, "cannot save %s (written through its .tmp): "
                  "%s: new groups cannot form until it can (retried at "
                  "most once a second)",
                  dcpxd_secrets_path(m->secrets), strerror(-save_error));
    qr.state_error = state_error;
  }
  if (q->group && *q->group) {
    g = dcpxd_group_find(m, q->group);
    bool unattached = false;
    for (size_t i = 0; !g && !unattached && i < nsec; i++)
      unattached =
          unattached_mask(c, q, names, n_names, i, &uname, &uworld) != 0;
    if ((!g || !dcpxd_may_see(c, g)) && !unattached &&
        !qr.n_refused_reattaches) {
      dcpxd_bprintf(msg, "no group '%.*s'", DCPXD_GROUP_NAME_MAX, q->group);
      return query_error(c, DCPX_E_NOENT, msg);
    }
  }
  n = n_names + nsec;
  infos = calloc(n ? n : 1, sizeof(*infos));
  ptrs = calloc(n ? n : 1, sizeof(*ptrs));
  if (!infos || !ptrs)
    return query_error(c, DCPX_E_NOMEM, "out of memory");
  n = 0;
  TAILQ_FOREACH(g, &m->groups, link) {
    if ((q->group && *q->group && strcmp(q->group, g->name) != 0) ||
        !dcpxd_may_see(c, g))
      continue;
    fill_group(&infos[n], g);
    n++;
  }
  for (size_t i = 0; i < nsec; i++) {
    const uint32_t mask =
        unattached_mask(c, q, names, n_names, i, &uname, &uworld);
    if (mask)
      fill_unattached(&infos[n++], uname, uworld, mask);
  }
  /* The groups that are not healthy first (in list order, then the
   * others): a reply that must be trimmed keeps them, so that a health
   * check never misses a broken group for the size limit. */
  total = 0;
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < n; i++)
      if (dcpx__group_info_healthy(&infos[i].gi) == pass)
        ptrs[total++] = &infos[i].gi;
  rep.version = DCPX_PROTO_VERSION;
  qr.reply = &rep;
  qr.groups = ptrs;
  qr.n_groups = fit_items(&qr, ptrs, NULL, total);
  qr.groups_left_out = (uint32_t)(total - qr.n_groups);
  if (qr.n_groups < total)
    dcpxd_bprintf(note, "showing %zu of %zu groups (reply size limit)",
                  qr.n_groups, total);
  qr.records_note = note;
  qr.partial_view = !c->admin;
  send_query_reply(c, &qr);
}

/* A group that exists and that c may see (docs/PROTOCOL.md 7.1). */
static bool group_visible(dcpxd_conn *c, const char *name) {
  dcpxd_group *g = dcpxd_group_find(c->m, name);
  return g && dcpxd_may_see(c, g);
}

/* Records carry no owner: a non-admin sees those of the groups it can see
 * now, and none of a group that is gone. */
static bool record_visible(dcpxd_conn *c, const dcpxd_record *r) {
  return c->admin || group_visible(c, r->group);
}

static void query_records(dcpxd_conn *c, const Dcpx__Query *q) {
  dcpxd_manager *m = c->m;
  Dcpx__QueryReply qr = DCPX__QUERY_REPLY__INIT;
  Dcpx__Reply rep = DCPX__REPLY__INIT;
  const dcpxd_records *s = m->records;
  const size_t count = dcpxd_records_count(s);
  const bool by_group = q->group && *q->group;
  const uint64_t until = q->until_ns ? q->until_ns : UINT64_MAX;
  _cleanup_free_ const dcpxd_record **sel = NULL;
  _cleanup_free_ Dcpx__Record *recs = NULL;
  _cleanup_free_ Dcpx__Record **ptrs = NULL;
  size_t n = 0, start = 0, limit = q->limit ? q->limit : count;
  char note[768], msg[128];
  const char *store_note = dcpxd_records_note(s);

  sel = calloc(count ? count : 1, sizeof(*sel));
  if (!sel)
    return query_error(c, DCPX_E_NOMEM, "out of memory");
  /* Newest first, up to the limit; then put them back in time order. */
  for (size_t i = count; i-- > 0 && n < limit;) {
    const dcpxd_record *r = dcpxd_records_get(s, i);
    if ((by_group && strcmp(r->group, q->group) != 0) ||
        !record_visible(c, r))
      continue;
    if (q->rank >= 0 && r->rank != (uint32_t)q->rank)
      continue;
    if (r->time_ns < q->since_ns || r->time_ns >= until) /* [since, until) */
      continue;
    sel[n++] = r;
  }
  if (n == 0 && by_group && !group_visible(c, q->group)) {
    dcpxd_bprintf(msg, "no group '%.*s' and no records of it",
                  DCPXD_GROUP_NAME_MAX, q->group);
    return query_error(c, DCPX_E_NOENT, msg);
  }
  recs = calloc(n ? n : 1, sizeof(*recs));
  ptrs = calloc(n ? n : 1, sizeof(*ptrs));
  if (!recs || !ptrs)
    return query_error(c, DCPX_E_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    fill_record(&recs[i], sel[n - 1 - i]);
    ptrs[i] = &recs[i];
  }
  rep.version = DCPX_PROTO_VERSION;
  qr.reply = &rep;
  qr.records = ptrs;
  qr.n_records = 0;
  {
    const size_t keep = fit_items(&qr, NULL, ptrs, n); /* the newest */
    start = n - keep;
    qr.records = ptrs + start;
    qr.n_records = keep;
  }
  if (start)
    dcpxd_bprintf(note,
                  "%s%sshowing the newest %zu of %zu matching records "
                  "(reply size limit; use --limit or --since)",
                  store_note, *store_note ? "; " : "", qr.n_records, n);
  else
    dcpxd_bprintf(note, "%s", store_note);
  qr.records_note = note;
  qr.records_unstored = (uint32_t)dcpxd_records_unstored(s);
  qr.partial_view = !c->admin;
  send_query_reply(c, &qr);
}

void dcpxd_query(dcpxd_conn *c, const Dcpx__Query *q) {
  char msg[96];

  if (q->group && *q->group && !dcpx__group_name_ok(q->group)) {
    dcpxd_bprintf(msg, DCPXD_BAD_NAME_FMT, DCPX_GROUP_NAME_MAX);
    return query_error(c, DCPX_E_INVAL, msg);
  }
  switch ((int)q->what) {
  case DCPX__QUERY__WHAT__GROUPS:
  case DCPX__QUERY__WHAT__HEALTH:
  case DCPX__QUERY__WHAT__STATS:
    return query_groups(c, q);
  case DCPX__QUERY__WHAT__RECORDS:
    if (q->rank < -1) { /* -1 is every rank (docs/PROTOCOL.md 10.4) */
      dcpxd_bprintf(msg, "rank %d: -1 (every rank) or a rank", (int)q->rank);
      return query_error(c, DCPX_E_BADRANK, msg);
    }
    return query_records(c, q);
  default:
    dcpxd_bprintf(msg, "unknown query %d", (int)q->what);
    return query_error(c, DCPX_E_INVAL, msg);
  }
}

void dcpxd_command(dcpxd_conn *c, const Dcpx__Command *cmd) {
  dcpxd_group *g;
  char err[256] = "";
  int r;

  switch ((int)cmd->kind) {
  case DCPX__COMMAND__KIND__RESET:
  case DCPX__COMMAND__KIND__FAULT_STALL:
  case DCPX__COMMAND__KIND__FAULT_CLEAR:
    break;
  default:
    dcpxd_conn_reply(c, DCPX_E_INVAL, "unknown command %d", (int)cmd->kind);
    return;
  }
  if (!dcpxd_may_operate(c)) {
    log_notice(
                    "conn %" PRIu64 " (pid %d uid %u): command %d refused: "
                    "not an admin",
                    c->id, (int)c->pid, (unsigned)c->uid, (int)cmd->kind);
    dcpxd_conn_reply(c, DCPX_E_PERM,
                     "reset and fault injection need an admin: root, "
                     "dcpxd's user or a member of an admin-gid group");
    return;
  }
  if (cmd->kind == DCPX__COMMAND__KIND__FAULT_STALL &&
      !c->m->conf->fault_injection) {
    log_notice(
                    "conn %" PRIu64 " (pid %d uid %u): fault stall refused: "
                    "fault injection is disabled",
                    c->id, (int)c->pid, (unsigned)c->uid);
    dcpxd_conn_reply(c, DCPX_E_PERM,
                     "fault injection is disabled (start dcpxd with "
                     "--enable-fault-injection)");
    return;
  }
  if (!dcpx__group_name_ok(cmd->group)) {
    dcpxd_conn_reply(c, DCPX_E_INVAL, DCPXD_BAD_NAME_FMT, DCPX_GROUP_NAME_MAX);
    return;
  }
  g = dcpxd_group_find(c->m, cmd->group);
  if (!g && cmd->kind == DCPX__COMMAND__KIND__RESET &&
      dcpxd_secrets_remove(c->m->secrets, cmd->group)) {
    /* An unattached group (left by a restart; its ranks have not
     * reattached, and may never: they left while dcpxd was down): the
     * operator drops it. A rank of it that reattaches later is refused
     * (and then listed by health among the refused reattaches while it
     * retries). */
    log_notice("group=%s: unattached group dropped by a reset (pid %d uid "
               "%u); a reattach of its ranks will be refused",
               cmd->group, (int)c->pid, (unsigned)c->uid);
    dcpxd_conn_reply(c, 0,
                     "group '%.*s' was unattached (dcpxd restarted and none "
                     "of its ranks reattached): dropped; its name is free, "
                     "and a later reattach of its ranks is refused",
                     DCPXD_GROUP_NAME_MAX, cmd->group);
    return;
  }
  if (!g && dcpxd_secrets_live(c->m->secrets, cmd->group)) {
    dcpxd_conn_reply(c, DCPX_E_STATE,
                     "group '%.*s' is unattached: dcpxd restarted and none "
                     "of its ranks has reattached yet",
                     DCPXD_GROUP_NAME_MAX, cmd->group);
    return;
  }
  if (!g) {
    dcpxd_conn_reply(c, DCPX_E_NOENT, "no group '%.*s'", DCPXD_GROUP_NAME_MAX,
                     cmd->group ? cmd->group : "");
    return;
  }
  if (cmd->kind == DCPX__COMMAND__KIND__RESET) {
    log_notice("group=%s: reset requested by pid %d uid %u", g->name,
               (int)c->pid, (unsigned)c->uid);
    r = dcpxd_group_reset(g, err, sizeof(err));
  } else if (cmd->kind == DCPX__COMMAND__KIND__FAULT_CLEAR) {
    char note[256];
    r = dcpxd_group_fault_clear(g, cmd->rank, note, sizeof(note), err,
                                sizeof(err));
    if (r == 0) {
      dcpxd_conn_reply(c, 0, "%s", note);
      return;
    }
  } else {
    r = dcpxd_group_fault_stall(g, cmd->rank, cmd->epoch, cmd->has_call_tag,
                                cmd->call_tag, cmd->ticks, err, sizeof(err));
  }
  dcpxd_conn_reply(c, r, "%s", r < 0 ? err : "");
}
