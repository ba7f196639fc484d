/* dcpxd-group.c - a dcpx group's life in the daemon: rendezvous, memory,
 * abort, recovery (docs/PROTOCOL.md sections 6 and 7).
 *
 * A group is named and has W ranks. It is created by its first Join, whose
 * shape (the 7 shape fields, backend, transport and wait timeout) becomes
 * the group's; every later Join must match it field for field.
 *
 *   FORMING --all W joined--> READY --alarm, member gone, reset,--> ABORTED
 *      |     (memory made,       ^      unprompted RecoverAck          |
 *      |      JoinReply + fds    |                                     |
 *      |      to every rank)     |              first RecoverAck, a    |
 *      |                         |              replacement or reset:  |
 *      |                         |              RESET_REQUESTED to all v
 *      |                         +------ RESET_DONE ---------- RECOVERING
 *      |                  every rank live and acknowledged: workspaces,
 *      |                  health blocks and records zeroed, generation + 1,
 *      v                  abort word 0
 *   destroyed when its last member leaves or goes away (from any state)
 *
 * A Leave of one rank of a formed group aborts it (reason "dead") just like
 * a disconnect: the other ranks would otherwise wait on pushes that never
 * come. Once every member is gone the group and its memory are freed.
 *
 * Invariants:
 *   1. A member link is two pointers, group->member[r].conn and
 *      conn->group/rank; member_attach/member_detach change both.
 *   2. Memory (control page + W workspaces) exists from formation until
 *      the group is destroyed; its fds go to each member in its JoinReply,
 *      in the order "ctl", "ws0".."ws{W-1}".
 *   3. The daemon writes the control page header and the health blocks'
 *      joined/pid/fault words; clients write alarm/failed/stats and the
 *      records. All plain stores: the daemon sets abort with a store and a
 *      full fence, and clears it only after everything else was zeroed and
 *      the generation bumped.
 *   4. Once the abort word is set, it stays set until a recovery completes,
 *      and a recovery completes only when every rank is held by a live
 *      process that acknowledged (drained) in this round. A process that
 *      joins as a rank whose holder is gone replaces it and counts as
 *      acknowledged (it has nothing in flight).
 *   5. Workspaces are zeroed on a libuv worker thread (they can be GiBs);
 *      while that runs the group is `zeroing`, and a destroy only marks it
 *      `doomed`: the work's completion frees it.
 *   6. A forming group holds no memory; a Join that times out, or a client
 *      that goes away, simply leaves it, and the others keep waiting on
 *      their own timers.
 *   7. dcpxd's own exit is not a member's death: at shutdown the daemon
 *      lets go of its groups without aborting them or writing their
 *      control pages, because the ranks keep calling (the daemon is not on
 *      the data path) and reattach to the next dcpxd.
 *
 * Reattach (docs/ARCHITECTURE.md, "Daemon restart"). A member whose
 * connection broke reconnects and sends a Join with reattach set and its
 * ctl + W workspace fds. For a group this daemon does not know, the first
 * such Join recreates it from that memory ("adopted"): the control page is
 * checked against the shape (magic, version, world, rows, sizes, seals),
 * the state follows its abort and recovering words, the generation is the
 * page's, and the ranks the page says were held are awaited. Later
 * reattaches must match the shape and bring the very same control page
 * (same inode). An awaited rank whose pid is gone is dead: the group is
 * aborted and waits for a replacement, as for any dead rank. A replacement
 * Join for an awaited rank whose process still lives is refused as a
 * duplicate, and so is a reattach, adopting or not, from a process other
 * than the rank's recorded one while that one lives (held_by_other).
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>

#include "dcpxd-closer.h"
#include "dcpxd-log.h"
#include "dcpxd-util.h"
#include "dcpxd.h"
#include "merge.h"
#include "transport.h"



/* ---- names --------------------------------------------------------------- */

const char *dcpxd_region_name(uint32_t id) {
  switch (id) {
  case DCPX_REGION_LL_SLOTS:
    return "ll_slots";
  case DCPX_REGION_RESCUE:
    return "rescue";
  case DCPX_REGION_EPOCH:
    return "epoch";
  case DCPX_REGION_SEQ2:
    return "seq2";
  case DCPX_REGION_SAT_WORD:
    return "sat_word";
  case DCPX_REGION_STATS:
    return "stats";
  case DCPX_REGION_CALL_SEQ:
    return "state";
  case 0: /* an NCCL timeout's (DCPX_REC_NCCL_TIMEOUT): no region */
    return "-";
  default:
    return "unknown";
  }
}

const char *dcpxd_group_state_name(const dcpxd_group *g) {
  switch (g->state) {
  case DCPXD_GROUP_FORMING:
    return "forming";
  case DCPXD_GROUP_READY:
    return "ready";
  case DCPXD_GROUP_ABORTED:
    return "aborted";
  case DCPXD_GROUP_RECOVERING:
    return "recovering";
  }
  return "unknown";
}

/* rank 0's NCCL id into the control page, for the generation about to
 * start (g->generation: the formation's, or the one a recovery is about
 * to publish), before the members can see that generation
 * (docs/PROTOCOL.md 6.9): nothing when rank 0 sent none. */
static void ctl_nccl_id(dcpxd_group *g) {
  if (!g->nccl_id_len)
    return;
  memcpy(g->hdr->nccl_id, g->nccl_id, g->nccl_id_len);
  g->hdr->nccl_id_len = (uint32_t)g->nccl_id_len;
  __atomic_store_n(&g->hdr->nccl_gen, g->generation, __ATOMIC_RELEASE);
  g->nccl_fresh = false;
}

/* rank 0's NCCL id (its Join's, a replacement rank 0's, its RecoverAck's,
 * at most DCPX_NCCL_ID_BYTES: checked by the caller), the one the next
 * generation's communicators use: ctl_nccl_id publishes it. */
static void keep_nccl_id(dcpxd_group *g, const ProtobufCBinaryData *id) {
  memcpy(g->nccl_id, id->data, id->len);
  g->nccl_id_len = id->len;
  g->nccl_fresh = true;
}

/* The common tables (common/transport.h), for the protobuf enums. */
static const char *transport_name(int t) {
  return dcpx__transport_name((uint32_t)t);
}

static const char *backend_name(int b) {
  return dcpx__backend_name((uint32_t)b);
}

dcpxd_group *dcpxd_group_find(dcpxd_manager *m, const char *name) {
  dcpxd_group *g;
  TAILQ_FOREACH(g, &m->groups, link) {
    if (strcmp(g->name, name) == 0)
      return g;
  }
  return NULL;
}

/* ---- events and replies -------------------------------------------------- */

static void send_event(dcpxd_group *g, dcpxd_conn *c, int kind, uint32_t reason,
                       int32_t rank, const char *detail) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__Event ev = DCPX__EVENT__INIT;
  char text[384];

  dcpxd_bprintf(text, "%s", detail ? detail : "");
  dcpx__text_clean(text);
  ev.kind = kind;
  ev.group = g->name;
  ev.reason = reason;
  ev.generation = g->generation;
  ev.rank = rank;
  ev.detail = text;
  f.msg_case = DCPX__FRAME__MSG_EVENT;
  f.event = &ev;
  dcpxd_conn_send(c, &f, NULL, 0);
}

static void broadcast_event(dcpxd_group *g, int kind, uint32_t reason,
                            int32_t rank, const char *detail) {
  for (uint32_t r = 0; r < g->shape.world; r++)
    if (dcpxd_member_live(&g->member[r]))
      send_event(g, g->member[r].conn, kind, reason, rank, detail);
}

static void join_refuse(dcpxd_conn *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void join_refuse(dcpxd_conn *c, int status, const char *fmt, ...) {
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__JoinReply jr = DCPX__JOIN_REPLY__INIT;
  Dcpx__Reply rep = DCPX__REPLY__INIT;
  char msg[512]; /* fits dcpx_client_last_error's 512 */
  va_list ap;

  va_start(ap, fmt);
  dcpx__vtextf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  dcpx__text_clean(msg);
  log_notice( "conn %" PRIu64 " (pid %d): join refused (%s): %s",
                  c->id, (int)c->pid, dcpx_strerror(status), msg);
  if (c->reattach_j)
    dcpxd_refusal_note(c, c->reattach_j, status, msg);
  rep.status = status;
  rep.error = msg;
  rep.version = DCPX_PROTO_VERSION;
  jr.reply = &rep;
  f.msg_case = DCPX__FRAME__MSG_JOIN_REPLY;
  f.join_reply = &jr;
  dcpxd_conn_send(c, &f, NULL, 0);
}

/* Bytes a group commits once formed: W workspaces and the control page. */
static uint64_t group_bytes(const dcpx_layout *L, uint32_t W) {
  return (uint64_t)W * L->ws_bytes + L->ctl_bytes;
}

/* Ownership (docs/PROTOCOL.md 7.1): the group g, or the group of this
 * name that c would create (g NULL). False after refusing the Join. */
static bool join_allowed(dcpxd_conn *c, const dcpxd_group *g,
                         const char *name) {
  const dcpxd_owner_rule *rule =
      g ? g->rule : dcpxd_conf_owner_rule(c->m->conf, name);

  if (g ? dcpxd_may_use(c, g)
        : c->uid == 0 || !rule || dcpxd_rule_matches(c, rule))
    return true;
  if (rule)
    join_refuse(c, DCPX_E_ACCES,
                "groups named '%s' belong to %s %u (group-owner): nobody "
                "else but root may create or join them",
                rule->pattern, rule->is_gid ? "the members of gid" : "uid",
                (unsigned)rule->id);
  else
    join_refuse(c, DCPX_E_ACCES,
                "group '%s' belongs to uid %u: only its owner and root may "
                "join it, replace its ranks or reattach to it",
                g->name, (unsigned)g->owner);
  return false;
}

/* The group's warnings for its JoinReply and log, into buf[GROUP_WARNING]
 * ("" when none): the shape's (W*N <= K), and, with the host backend,
 * workspaces past this machine's memory and swap. They are sparse (memfd),
 * so such a group forms and works while its calls hold few rows; a call
 * of up to the shape's rows fills them, and the OOM killer then ends
 * dcpxd or a rank, or another process, with no error. */
#define GROUP_WARNING 512 /* libdcpx keeps up to 511 bytes of it */
static const char *group_warnings(const dcpxd_group *g, char *buf) {
  const char *sw = dcpx_shape_warning(&g->shape);
  const uint64_t need = (uint64_t)g->shape.world * g->L.ws_bytes;
  struct sysinfo si;
  size_t n = 0;

  buf[0] = '\0';
  if (sw)
    n = (size_t)snprintf(buf, GROUP_WARNING, "%s", sw);
  if (g->backend != DCPX__BACKEND__BACKEND_HOST || sysinfo(&si) != 0)
    return buf;
  const uint64_t have =
      ((uint64_t)si.totalram + si.totalswap) * (si.mem_unit ? si.mem_unit : 1);
  if (need <= have || n >= GROUP_WARNING)
    return buf;
  snprintf(buf + n, GROUP_WARNING - n,
           "%sits %u workspaces (%.1f GiB) exceed this machine's memory and "
           "swap (%.1f GiB): calls of up to %u rows fill them, and the OOM "
           "killer may end dcpxd, a rank or another process; give the group "
           "fewer rows or a smaller max_local",
           n ? "; " : "", g->shape.world, (double)need / (1ull << 30),
           (double)have / (1ull << 30), g->shape.rows);
  return buf;
}

/* The JoinReply of a formed group, with its fds (invariant 2); a
 * reattaching member already holds them and gets none. */
static void send_join_reply_fds(dcpxd_group *g, uint32_t rank, bool with_fds) {
  const dcpx_layout *L = &g->L;
  const uint32_t W = g->shape.world;
  Dcpx__Frame f = DCPX__FRAME__INIT;
  Dcpx__JoinReply jr = DCPX__JOIN_REPLY__INIT;
  Dcpx__Reply rep = DCPX__REPLY__INIT;
  Dcpx__Shape sh;
  Dcpx__Region regs[DCPX_REGION_MAX], *regp[DCPX_REGION_MAX];
  size_t nreg = 0;
  char names[DCPX_MAX_WORLD + 1][8], *namep[DCPX_MAX_WORLD + 1];
  int fds[DCPX_MAX_WORLD + 1];
  int32_t devices[DCPX_MAX_WORLD];
  ProtobufCBinaryData uuids[DCPX_MAX_WORLD];

  rep.version = DCPX_PROTO_VERSION;
  jr.reply = &rep;
  jr.generation = g->generation;
  dcpx__shape_to_pb(&g->shape, &sh);
  jr.shape = &sh;
  jr.transport = g->transport;
  jr.backend = g->backend;
  jr.timeout_ns = g->timeout_ns;
  jr.ws_bytes = L->ws_bytes;
  jr.ctl_bytes = L->ctl_bytes;
  for (uint32_t id = 1; id <= DCPX_REGION_MAX; id++) {
    if (!L->reg[id].bytes)
      continue;
    dcpx__region__init(&regs[nreg]);
    regs[nreg].name = (char *)dcpxd_region_name(id);
    regs[nreg].id = id;
    regs[nreg].offset = L->reg[id].off;
    regs[nreg].bytes = L->reg[id].bytes;
    regp[nreg] = &regs[nreg];
    nreg++;
  }
  jr.n_regions = nreg;
  jr.regions = regp;
  dcpxd_bprintf(names[0], "ctl");
  fds[0] = g->ctl->fd;
  for (uint32_t r = 0; r < W; r++) {
    dcpxd_bprintf(names[r + 1], "ws%u", r);
    fds[r + 1] = g->ws[r]->fd;
    devices[r] = g->member[r].device;
    uuids[r].len = g->member[r].uuid_len;
    uuids[r].data = g->member[r].uuid;
  }
  for (uint32_t i = 0; i <= W; i++)
    namep[i] = names[i];
  jr.n_fds = with_fds ? W + 1 : 0;
  jr.fds = namep;
  jr.n_devices = W;
  jr.devices = devices;
  jr.n_device_uuids = W;
  jr.device_uuids = uuids;
  jr.nccl_id.len = g->nccl_id_len;
  jr.nccl_id.data = g->nccl_id;
  char warning[GROUP_WARNING]; /* also for a reattach to an adopted group */
  if (group_warnings(g, warning)[0])
    jr.warning = warning;
  f.msg_case = DCPX__FRAME__MSG_JOIN_REPLY;
  f.join_reply = &jr;
  dcpxd_conn_send(g->member[rank].conn, &f, fds, with_fds ? (int)W + 1 : 0);
}

static void send_join_reply(dcpxd_group *g, uint32_t rank) {
  send_join_reply_fds(g, rank, true);
}

/* ---- creation and destruction -------------------------------------------- */

static void group_free(dcpxd_group *g) {
  for (uint32_t r = 0; r < DCPX_MAX_WORLD; r++)
    g->ws[r] = dcpxd_buf_free(g->ws[r]);
  g->ctl = dcpxd_buf_free(g->ctl); /* unmaps hdr */
  free(g->harvested);
  free(g);
}

static void member_detach(dcpxd_group *g, uint32_t rank) {
  dcpxd_member *mb = &g->member[rank];
  dcpxd_conn *c = mb->conn;

  if (!c)
    return;
  dcpxd_conn_join_done(c);
  c->group = NULL;
  mb->conn = NULL;
  mb->acked = false;
  g->live--;
  if (rank == 0) {
    /* An NCCL unique id names its sender's bootstrap root, which goes
     * with it: the next rank 0 brings its own. An id the departed rank 0
     * sent during this recovery is not published; in a forming group no
     * communicator used its Join's id yet, so it goes too (a later
     * rank 0 that sends none gets none, not the departed one's). A
     * formed group keeps the id of its current communicators (6.9). */
    g->nccl_fresh = false;
    if (g->state == DCPXD_GROUP_FORMING)
      g->nccl_id_len = 0;
  }
  dcpxd_conn_idle_arm(c);
}

static void group_destroy(dcpxd_group *g) {
  dcpxd_manager *m = g->m;

  for (uint32_t r = 0; r < g->shape.world; r++)
    member_detach(g, r);
  if (g->hdr)
    dcpxd_health_harvest(g); /* late records */
  if (g->hdr && !m->stopping) /* at shutdown its ranks live on */
    dcpxd_secrets_remove(m->secrets, g->name);
  TAILQ_REMOVE(&m->groups, g, link);
  if (m->stopping && g->state != DCPXD_GROUP_FORMING)
    log_info("group=%s released at shutdown: its ranks keep running and "
             "reattach to the next dcpxd (gen %u)",
             g->name, g->generation);
  else
    log_info("group=%s destroyed (gen %u, %" PRIu64 " aborts, %" PRIu64
             " recoveries)",
             g->name, g->generation, g->aborts, g->recoveries);
  if (g->zeroing) {
    g->doomed = true; /* invariant 5: freed by zero_done() */
    return;
  }
  group_free(g);
}

static void member_attach(dcpxd_group *g, uint32_t rank, dcpxd_conn *c,
                          const Dcpx__Join *j) {
  dcpxd_member *mb = &g->member[rank];
  size_t k = 0;

  dcpxd_refusal_clear(c->m, g->name, rank); /* the rank is watched again */
  mb->conn = c;
  mb->pid = c->pid;
  mb->device = j->device;
  mb->uuid_len = j->device_uuid.len == sizeof(mb->uuid) ? sizeof(mb->uuid) : 0;
  if (mb->uuid_len)
    memcpy(mb->uuid, j->device_uuid.data, sizeof(mb->uuid));
  mb->acked = false;
  for (const char *p = j->node ? j->node : ""; *p && k + 1 < sizeof(mb->node);
       p++)
    mb->node[k++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
  mb->node[k] = '\0';
  c->group = g;
  c->rank = rank;
  g->live++;
  g->awaiting &= ~(1u << rank);
  (void)dcpxd_conn_watch_pid(c);
  if (g->hdr) /* formed: a replacement or a reattach */
    dcpxd_secrets_set_pid(g->m->secrets, g->name, g->shape.world, rank,
                          c->pid);
}

/* A group's buffer of `bytes` past dcpxd's file size limit (its memfds
 * are files: ftruncate's EFBIG): DCPX_E_NOMEM, with what to do in
 * *what (buf). It was the raw -27, which no caller knows. */
static int past_fsize(uint64_t bytes, char *buf, size_t n,
                      const char **what) {
  snprintf(buf, n,
           "allocate group memory (a buffer of %" PRIu64 " bytes is past "
           "dcpxd's file size limit, RLIMIT_FSIZE: LimitFSIZE= in its unit)",
           bytes);
  *what = buf;
  return DCPX_E_NOMEM;
}

/* Allocates the memory of a group whose W ranks all joined, fills the
 * control page, and answers every member (invariant 2). On failure every
 * member gets the error and the group is destroyed. */
static void group_form(dcpxd_group *g) {
  const uint32_t W = g->shape.world;
  const char *what = "allocate group memory";
  char label[96], what_fsize[160];
  void *map;
  int r;

  dcpxd_bprintf(label, "dcpx-ctl:%s", g->name);
  r = dcpxd_buf_alloc(&dcpxd_mem_host, -1, g->L.ctl_bytes, label, &g->ctl);
  if (r == -EFBIG)
    r = past_fsize(g->L.ctl_bytes, what_fsize, sizeof(what_fsize), &what);
  if (r < 0)
    goto fail;
  r = dcpxd_mem_host.map(g->ctl, &map);
  if (r < 0)
    goto fail;
  for (uint32_t i = 0; i < W; i++) {
    dcpxd_bprintf(label, "dcpx-ws%u:%s", i, g->name);
    r = dcpxd_buf_alloc(g->mem, g->member[i].device, g->L.ws_bytes, label,
                        &g->ws[i]);
    if (r == -EFBIG)
      r = past_fsize(g->L.ws_bytes, what_fsize, sizeof(what_fsize), &what);
    if (r < 0)
      goto fail;
  }
  g->harvested = calloc(((size_t)W * g->shape.rows + 7) / 8, 1);
  if (!g->harvested) {
    r = -ENOMEM;
    goto fail;
  }

  g->hdr = map;
  g->generation = 1;
  g->hdr->magic = DCPX_CTL_MAGIC;
  g->hdr->version = DCPX_CTL_VERSION;
  g->hdr->world = W;
  g->hdr->rows = g->shape.rows;
  g->hdr->timeout_ns = g->timeout_ns;
  g->hdr->generation = g->generation;
  g->hdr->abort = 0;
  g->hdr->recovering = 0;
  ctl_nccl_id(g);
  {
    pid_t pids[DCPX_MAX_WORLD];
    for (uint32_t i = 0; i < W; i++)
      pids[i] = g->member[i].pid;
    r = dcpxd_secrets_add(g->m->secrets, g->name, g->owner, W, pids,
                          g->hdr->secret);
  }
  if (r < 0) {
    what = "record the group in the state dir's groups file";
    goto fail;
  }
  for (uint32_t i = 0; i < W; i++) {
    dcpx_rank_health *h = dcpxd_group_health(g, i);
    h->pid = (uint32_t)g->member[i].pid;
    h->joined = 1;
  }
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  g->state = DCPXD_GROUP_READY;

  log_info("group=%s formed: world %u rows %u topk %u local_topk %u, %s "
           "transport, %s backend, workspace %" PRIu64
           " bytes per rank, control page %" PRIu64 " bytes",
           g->name, W, g->shape.rows, g->shape.topk, g->shape.local_topk,
           transport_name(g->transport), backend_name(g->backend),
           g->L.ws_bytes, g->L.ctl_bytes);
  char warning[GROUP_WARNING];
  if (group_warnings(g, warning)[0])
    log_warning("group=%s: %s", g->name, warning);
  for (uint32_t i = 0; i < W; i++) {
    dcpxd_conn_join_done(g->member[i].conn);
    send_join_reply(g, i);
  }
  return;

fail:
  log_error_errno(r, "group=%s: cannot %s: %m", g->name, what);
  for (uint32_t i = 0; i < W; i++)
    if (g->member[i].conn)
      join_refuse(g->member[i].conn, r, "cannot %s: %s", what,
                  dcpx_strerror(r));
  group_destroy(g);
}

/* ---- Join ---------------------------------------------------------------- */

/* The message for a shape dcpx_shape_check refused, naming the field
 * (common/wire.c holds the rules). */
static int shape_explain(const dcpx_shape *s, char *buf, size_t n) {
  return dcpx__shape_why(s, buf, n);
}

/* Compares a Join with the group; 0 if identical, else DCPX_E_SHAPE with
 * the first differing field and both values in buf. */
static int group_compare(const dcpxd_group *g, const dcpx_shape *s,
                         int transport, int backend, uint64_t timeout_ns,
                         char *buf, size_t n) {
  const struct {
    const char *name;
    uint32_t mine, theirs;
  } f[] = {
      {"world", s->world, g->shape.world},
      {"rows", s->rows, g->shape.rows},
      {"topk", s->topk, g->shape.topk},
      {"local_topk", s->local_topk, g->shape.local_topk},
      {"block_size", s->block_size, g->shape.block_size},
      {"interleave", s->interleave, g->shape.interleave},
      {"max_local", s->max_local, g->shape.max_local},
  };
  for (size_t i = 0; i < ELEMENTSOF(f); i++)
    if (f[i].mine != f[i].theirs) {
      snprintf(buf, n, "%s %u differs from group '%s': %s %u", f[i].name,
               f[i].mine, g->name, f[i].name, f[i].theirs);
      return DCPX_E_SHAPE;
    }
  if (backend != g->backend) {
    snprintf(buf, n, "backend %s differs from group '%s': backend %s",
             backend_name(backend), g->name, backend_name(g->backend));
    return DCPX_E_SHAPE;
  }
  if (transport != g->transport) {
    snprintf(buf, n, "transport %s differs from group '%s': transport %s",
             transport_name(transport), g->name, transport_name(g->transport));
    return DCPX_E_SHAPE;
  }
  if (timeout_ns != g->timeout_ns) {
    snprintf(buf, n,
             "timeout_ns %" PRIu64 " differs from group '%s': timeout_ns "
             "%" PRIu64,
             timeout_ns, g->name, g->timeout_ns);
    return DCPX_E_SHAPE;
  }
  return 0;
}

static void on_join_timeout(uv_timer_t *t) {
  dcpxd_conn *c = t->data;
  dcpxd_group *g = c->group;
  dcpxd_manager *m = c->m;
  char have[3 * DCPX_MAX_WORLD + 1] = "";
  uint32_t rank = c->rank, joined;
  size_t k = 0;

  if (!g || g->state != DCPXD_GROUP_FORMING)
    return;
  /* Counted before this rank leaves: it had joined too. */
  joined = g->live;
  for (uint32_t r = 0; r < g->shape.world; r++)
    if (g->member[r].conn)
      k +=
          (size_t)snprintf(have + k, sizeof(have) - k, "%s%u", k ? "," : "", r);
  member_detach(g, rank);
  /* A peer refused for its shape, if its rank is still missing. */
  const char *refused =
      g->refused[0] && (g->refused_dup || !g->member[g->refused_rank].conn)
          ? g->refused
          : "";
  join_refuse(c, DCPX_E_TIMEDOUT,
              "group '%s' did not form in time: %u of %u ranks joined "
              "(ranks %s)%s",
              g->name, joined, g->shape.world, k ? have : "none", refused);
  if (g->live == 0)
    group_destroy(g);
  dcpxd_manager_update(m);
}

static void group_recover_maybe(dcpxd_group *g);
static void group_request_reset(dcpxd_group *g, const char *detail);

/* ---- reattach ------------------------------------------------------------ */

/* Whether the W + 1 fds of a reattach are the group's memory: the control
 * page always; the workspaces too when they are host memory (a CUDA
 * workspace's fd is a handle exported afresh for each rank, not a file
 * to compare). Calls into no file system but a memfd's. */
static bool fds_are_the_groups(const dcpxd_group *g, const int *fds) {
  if (!dcpxd_buf_is_fd(g->ctl, fds[0]))
    return false;
  for (uint32_t i = 0; i < g->shape.world; i++)
    if (g->ws[i]->ops == &dcpxd_mem_host && !dcpxd_buf_is_fd(g->ws[i], fds[1 + i]))
      return false;
  return true;
}

/* An awaited rank of an adopted group will not come back. */
static void awaited_rank_dead(dcpxd_group *g, uint32_t r) {
  char detail[160];

  g->awaiting &= ~(1u << r);
  dcpxd_group_health(g, r)->joined = 0;
  if (g->member[r].pid > 0)
    dcpxd_bprintf(detail,
                  "rank %u (pid %d) died while dcpxd was away, before "
                  "reattaching",
                  r, (int)g->member[r].pid);
  else
    dcpxd_bprintf(detail,
                  "rank %u (its pid not visible to dcpxd) did not reattach "
                  "within the join timeout (%u ms) of the restart",
                  r, g->m->conf->join_timeout_ms);
  dcpxd_group_abort(g, DCPX_ABORT_DEAD, (int32_t)r, detail);
}

/* Whether an awaited rank's process is gone: as for an unattached group
 * (dcpxd_secrets_rank_live: a zombie, or a pid another process took since,
 * is gone). A rank whose pid dcpxd cannot see (SO_PEERCRED's 0: a process
 * of another pid namespace) cannot be asked whether it lives: it is given
 * the join timeout from the adoption to reattach. */
static bool awaited_gone(const dcpxd_group *g, uint32_t r) {
  const pid_t pid = g->member[r].pid;
  if (pid > 0)
    return !dcpxd_secrets_rank_live(g->m->secrets, g->name, r, pid);
  return dcpxd_now_ns(CLOCK_MONOTONIC) - g->adopted_ns >
         (uint64_t)g->m->conf->join_timeout_ms * 1000000ull;
}

void dcpxd_group_check_awaiting(dcpxd_group *g) {
  for (uint32_t r = 0; r < g->shape.world && g->awaiting; r++)
    if ((g->awaiting >> r) & 1u && awaited_gone(g, r))
      awaited_rank_dead(g, r);
}

void dcpxd_group_release_unheld(dcpxd_manager *m) {
  dcpxd_group *g, *next;

  for (g = TAILQ_FIRST(&m->groups); g; g = next) {
    next = TAILQ_NEXT(g, link);
    if (!g->live)
      group_destroy(g); /* stopping: its entry stays, as its ranks live */
  }
}

bool dcpxd_group_reap_empty(dcpxd_group *g) {
  if (g->state == DCPXD_GROUP_FORMING || g->live || g->awaiting)
    return false;
  log_info("group=%s: no rank is left to it (none attached, none awaited "
           "since the restart)",
           g->name);
  group_destroy(g);
  return true;
}

void dcpxd_refusal_note(dcpxd_conn *c, const Dcpx__Join *j, int status,
                        const char *reason) {
  dcpxd_manager *m = c->m;
  dcpxd_refusal *r = NULL;
  if (!j->group || !*j->group)
    return;
  for (size_t i = 0; i < m->n_refusals && !r; i++)
    if (m->refusals[i].pid == c->pid && m->refusals[i].rank == j->rank &&
        strcmp(m->refusals[i].group, j->group) == 0)
      r = &m->refusals[i];
  if (!r) {
    /* Full, or this uid holds its share: its (or else anyone's) oldest
     * goes, so that one uid's bogus reattaches cannot push out the
     * others' */
    size_t mine = 0, o = SIZE_MAX;
    for (size_t i = 0; i < m->n_refusals; i++)
      mine += m->refusals[i].uid == c->uid;
    const bool own = mine >= DCPXD_REFUSALS_PER_UID;
    if (own || m->n_refusals == DCPXD_REFUSALS_MAX) {
      for (size_t i = 0; i < m->n_refusals; i++)
        if ((!own || m->refusals[i].uid == c->uid) &&
            (o == SIZE_MAX || m->refusals[i].last_ns < m->refusals[o].last_ns))
          o = i;
      m->refusals[o] = m->refusals[--m->n_refusals];
    }
    r = &m->refusals[m->n_refusals++];
    memset(r, 0, sizeof(*r));
    dcpxd_bprintf(r->group, "%s", j->group);
    r->rank = j->rank;
    r->pid = c->pid;
    log_warning("group=%s rank=%u (pid %d) cannot reattach: it runs on, "
                "unwatched by dcpxd, until it leaves or is restarted",
                j->group, j->rank, (int)c->pid);
  }
  r->uid = c->uid;
  r->status = status;
  dcpxd_bprintf(r->reason, "%s", reason);
  r->attempts++;
  r->last_ns = dcpxd_now_ns(CLOCK_REALTIME);
}

void dcpxd_refusal_clear(dcpxd_manager *m, const char *group, uint32_t rank) {
  for (size_t i = 0; i < m->n_refusals;)
    if (m->refusals[i].rank == rank &&
        strcmp(m->refusals[i].group, group) == 0)
      m->refusals[i] = m->refusals[--m->n_refusals];
    else
      i++;
}

/* Whether rank `rank` of g is held by a live process other than c's:
 * holder is the rank's recorded pid (its health block's, as the adoption
 * takes it, or the member's since). A process that dcpxd cut off from a
 * rank while it lived (its output over the limit, a rank taken for dead)
 * and that another process replaced keeps retrying its reattach; it must
 * not take the rank back from the live replacement, in the adoption of
 * the group after a restart nor after it. A holder that is gone (a
 * zombie, a pid that another process took since: the groups file's start
 * time, as for an awaited rank) or unseen (0: another pid namespace)
 * does not count; neither does the holder itself, of one or more ranks. */
static bool held_by_other(const dcpxd_group *g, uint32_t rank, pid_t holder,
                          const dcpxd_conn *c) {
  return holder > 0 && holder != c->pid &&
         dcpxd_secrets_rank_live(g->m->secrets, g->name, rank, holder);
}

static void refuse_other_holder(dcpxd_conn *c, const char *group, uint32_t rank,
                                pid_t holder) {
  join_refuse(c, DCPX_E_DUPRANK,
              "rank %u of group '%s' is held by pid %d, which lives, not by "
              "this process (pid %d): it lost the rank (cut off or taken for "
              "dead, and replaced) and cannot reattach as it",
              rank, group, (int)holder, (int)c->pid);
}

/* The reattached member learns what it missed: a recovery in progress asks
 * it to drain and acknowledge again (acks do not survive a restart). */
static void reattach_done(dcpxd_group *g, dcpxd_conn *c, uint32_t rank) {
  send_join_reply_fds(g, rank, false);
  if (g->state == DCPXD_GROUP_RECOVERING)
    send_event(g, c, DCPX__EVENT__KIND__RESET_REQUESTED, g->hdr->abort, -1,
               "dcpxd restarted during a recovery: drain and acknowledge");
  else if (g->state == DCPXD_GROUP_ABORTED)
    send_event(g, c, DCPX__EVENT__KIND__ABORT, g->hdr->abort, -1,
               "the group is aborted");
}

/* group_adopt, step 1: the group's memory from the reattaching member's
 * fds (takes them all), then the checks that it is a group this daemon
 * created and that the caller may use it. Returns 0, or -1 after refusing
 * the join (g freed). */
static int adopt_memory(dcpxd_conn *c, dcpxd_group *g, const Dcpx__Join *j,
                        int *fds) {
  const uint32_t W = g->shape.world;
  dcpx_ctl_header *hdr;
  void *map;
  const char *why = "";
  uint32_t bad = 0; /* the workspace refused */
  int r;

  r = dcpxd_buf_adopt(&dcpxd_mem_host, TAKE_FD(fds[0]), g->L.ctl_bytes, -1,
                      &g->ctl, &why);
  if (r < 0) {
    uint64_t bytes = g->L.ctl_bytes;
    for (uint32_t i = 1; i <= W; i++)
      dcpxd_closer_close(TAKE_FD(fds[i]));
    group_free(g);
    join_refuse(c, r,
                "cannot adopt the control page of group '%s' (%" PRIu64
                " bytes, a sealed memfd expected): %s",
                j->group, bytes, why);
    return -1;
  }
  for (uint32_t i = 0; i < W; i++) {
    int fd = TAKE_FD(fds[1 + i]);
    if (r == 0) {
      r = dcpxd_buf_adopt(g->mem, fd, g->L.ws_bytes,
                          i == j->rank ? j->device : -1, &g->ws[i], &why);
      bad = i;
    } else {
      dcpxd_closer_close(fd);
    }
  }
  /* W + 1 buffers, not one twice: an fd given for two workspaces shared
   * one workspace between two ranks (and left the other unzeroed), the
   * control page given for a workspace of its size was zeroed at the
   * next recovery, secret and all */
  for (uint32_t i = 0; r == 0 && i < W; i++) {
    if (dcpxd_buf_same(g->ws[i], g->ctl))
      r = DCPX_E_INVAL, bad = i, why = "it is the control page";
    for (uint32_t k = 0; r == 0 && k < i; k++)
      if (dcpxd_buf_same(g->ws[i], g->ws[k]))
        r = DCPX_E_INVAL, bad = i, why = "the same memfd as an earlier one";
  }
  if (r < 0) {
    uint64_t bytes = g->L.ws_bytes;
    group_free(g);
    join_refuse(c, r,
                "cannot adopt the workspaces of group '%s' (%" PRIu64
                " bytes each): ws%u: %s",
                j->group, bytes, bad, why);
    return -1;
  }
  r = dcpxd_mem_host.map(g->ctl, &map);
  if (r < 0) {
    group_free(g);
    join_refuse(c, r, "cannot map the control page: %s", dcpx_strerror(r));
    return -1;
  }
  hdr = map;
  if (hdr->magic != DCPX_CTL_MAGIC || hdr->version != DCPX_CTL_VERSION ||
      hdr->world != W || hdr->rows != g->shape.rows) {
    int bad_version = hdr->magic == DCPX_CTL_MAGIC &&
                      hdr->version != DCPX_CTL_VERSION;
    char seen[160];
    dcpxd_bprintf(seen,
                  "magic 0x%08x version %u world %u rows %u, expected "
                  "0x%08x %u %u %u",
                  hdr->magic, hdr->version, hdr->world, hdr->rows,
                  DCPX_CTL_MAGIC, DCPX_CTL_VERSION, W, g->shape.rows);
    group_free(g);
    join_refuse(c, bad_version ? DCPX_E_VERSION : DCPX_E_SHAPE,
                "the control page does not match the group: %s", seen);
    return -1;
  }
  if (!dcpxd_secrets_match(c->m->secrets, g->name, hdr->secret, &g->owner)) {
    group_free(g);
    join_refuse(c, DCPX_E_ACCES,
                "cannot adopt group '%s': its control page's secret is not "
                "that of a group '%s' this dcpxd created",
                j->group, j->group);
    return -1;
  }
  if (!dcpxd_may_use(c, g)) {
    uid_t owner = g->owner;
    group_free(g);
    join_refuse(c, DCPX_E_ACCES,
                "group '%s' belongs to uid %u: only its owner and root may "
                "reattach to it",
                j->group, (unsigned)owner);
    return -1;
  }
  g->harvested = calloc(((size_t)W * g->shape.rows + 7) / 8, 1);
  if (!g->harvested) {
    group_free(g);
    join_refuse(c, DCPX_E_NOMEM, "out of memory");
    return -1;
  }
  g->hdr = hdr;
  return 0;
}

/* group_adopt, step 2: the group's state as its control page says it,
 * the ranks' pids and devices, and the ranks awaited back (besides the
 * reattaching `rank`; their list into awaited). */
static void adopt_state(dcpxd_group *g, const Dcpx__Join *j, char *awaited,
                        size_t n) {
  const dcpx_ctl_header *hdr = g->hdr;
  size_t k = 0;

  g->generation = hdr->generation;
  g->adopted = true;
  /* The length once: the page is writable by the members, so a second
   * load could exceed the bound just checked (g->nccl_id's 128 bytes). */
  const uint32_t nccl_id_len =
      __atomic_load_n(&hdr->nccl_id_len, __ATOMIC_RELAXED);
  if (hdr->nccl_gen && nccl_id_len <= DCPX_NCCL_ID_BYTES) {
    /* for a replacement's JoinReply */
    memcpy(g->nccl_id, hdr->nccl_id, nccl_id_len);
    g->nccl_id_len = nccl_id_len;
  }
  if (hdr->abort)
    g->state = hdr->recovering ? DCPXD_GROUP_RECOVERING : DCPXD_GROUP_ABORTED;
  else
    g->state = DCPXD_GROUP_READY;
  if (hdr->timeout_ns != j->timeout_ns)
    log_warning("group=%s: the control page says timeout %" PRIu64
                " ns, rank %u's reattach %" PRIu64 " ns; using the latter",
                g->name, (uint64_t)hdr->timeout_ns, j->rank, j->timeout_ns);
  awaited[0] = '\0';
  for (uint32_t i = 0; i < g->shape.world; i++) {
    const dcpx_rank_health *h = dcpxd_group_health(g, i);
    g->member[i].pid = (pid_t)h->pid;
    g->member[i].device = g->ws[i]->device; /* -1 for host memory */
    if (h->joined && i != j->rank) {
      g->awaiting |= 1u << i;
      k += (size_t)snprintf(awaited + k, n - k, "%s%u", k ? "," : "", i);
    }
  }
}

/* An adopted group's devices made ready for its first recovery's zeroing
 * (dcpxd_mem_ops.warm: the CUDA context, which a restarted dcpxd has not
 * made yet), one worker-thread job per device. A job holds the device
 * only, so the group may go meanwhile; best effort. */
typedef struct warm_job {
  uv_work_t req;
  int (*warm)(int device);
  int device;
  int status; /* warm's: set on the worker thread, read in warm_done */
} warm_job;

/* On a worker thread: nothing here may log (dcpxd-log.c takes no lock;
 * a line dropped by its rate limiter arms a loop timer). */
static void warm_work(uv_work_t *req) {
  warm_job *w = req->data;
  w->status = w->warm(w->device);
}

/* Back on the loop thread: a failure is logged here. */
static void warm_done(uv_work_t *req, int status) {
  warm_job *w = req->data;
  if (status == 0 && w->status < 0)
    log_warning("device %d: not made ready ahead of a recovery (%s); "
                "the recovery will try again",
                w->device, dcpx_strerror(w->status));
  free(w);
}

static void group_warm(const dcpxd_group *g) {
  uint64_t queued = 0; /* bit d: device d's job */
  if (!g->mem->warm)
    return;
  for (uint32_t i = 0; i < g->shape.world; i++) {
    const int d = g->ws[i]->device;
    if (d < 0 || d >= 64 || ((queued >> d) & 1u))
      continue;
    warm_job *w = calloc(1, sizeof(*w));
    if (!w)
      return;
    w->req.data = w;
    w->warm = g->mem->warm;
    w->device = d;
    if (uv_queue_work(g->m->loop, &w->req, warm_work, warm_done) < 0) {
      free(w);
      return;
    }
    queued |= 1ull << d;
  }
}

/* Recreates a group from the memory of its first reattaching member. Takes
 * every fd. */
static void group_adopt(dcpxd_conn *c, const Dcpx__Join *j,
                        const dcpx_shape *shape, int transport,
                        const dcpxd_mem_ops *mem, int *fds) {
  const uint32_t W = shape->world, rank = j->rank;
  dcpxd_manager *m = c->m;
  dcpxd_group *g;
  char awaited[3 * DCPX_MAX_WORLD + 1];

  g = calloc(1, sizeof(*g));
  if (!g) {
    for (uint32_t i = 0; i <= W; i++)
      dcpxd_closer_close(TAKE_FD(fds[i]));
    return join_refuse(c, DCPX_E_NOMEM, "out of memory");
  }
  g->m = m;
  memcpy(g->name, j->group, strlen(j->group) + 1);
  g->owner = c->uid;
  g->rule = dcpxd_conf_owner_rule(m->conf, g->name);
  g->shape = *shape;
  g->transport = transport;
  g->backend = (int)j->backend;
  g->timeout_ns = j->timeout_ns;
  g->mem = mem;
  dcpx_layout_compute(&g->L, W, shape->rows, shape->topk, shape->local_topk);
  g->bytes = group_bytes(&g->L, W); /* counted, never refused: it exists */
  g->adopted_ns = dcpxd_now_ns(CLOCK_MONOTONIC);
  if (adopt_memory(c, g, j, fds) < 0)
    return;
  const double import_ms =
      (double)(dcpxd_now_ns(CLOCK_MONOTONIC) - g->adopted_ns) / 1e6;
  /* read once: the page is writable by the members */
  const pid_t holder = (pid_t)__atomic_load_n(&dcpxd_group_health(g, rank)->pid,
                                              __ATOMIC_RELAXED);
  if (held_by_other(g, rank, holder, c)) {
    group_free(g);
    return refuse_other_holder(c, j->group, rank, holder);
  }
  adopt_state(g, j, awaited, sizeof(awaited));

  TAILQ_INSERT_TAIL(&m->groups, g, link);
  dcpxd_health_adopt(g);
  member_attach(g, rank, c, j);
  dcpxd_group_health(g, rank)->pid = (uint32_t)c->pid;
  dcpxd_group_health(g, rank)->joined = 1;
  group_warm(g);
  log_notice("group=%s adopted after a dcpxd restart: rank %u (pid %d) "
             "brought back its memory (taken in %.1f ms); generation %u, "
             "%s, abort=%s; awaiting ranks %s",
             g->name, rank, (int)c->pid, import_ms, g->generation,
             dcpxd_group_state_name(g), dcpx__abort_reason_name(g->hdr->abort),
             awaited[0] ? awaited : "none");
  if (j->generation && j->generation != g->generation)
    log_info("group=%s: rank %u saw generation %u, the page says %u",
             g->name, rank, j->generation, g->generation);
  reattach_done(g, c, rank);
  /* Records written while no daemon watched (their alarms too). */
  if (g->hdr->abort)
    dcpxd_health_harvest(g);
  dcpxd_group_check_awaiting(g);
  g->next_pid_check_ns =
      dcpxd_now_ns(CLOCK_MONOTONIC) + DCPXD_PID_CHECK_MS * 1000000ull;
}

/* A Join with reattach set (see the top of this file). Takes every fd. */
static void group_reattach(dcpxd_conn *c, const Dcpx__Join *j,
                           const dcpx_shape *shape, int transport,
                           const dcpxd_mem_ops *mem, int *fds, int nfds) {
  const uint32_t W = shape->world, rank = j->rank;
  dcpxd_group *g;
  dcpxd_member *mb;
  char msg[256];
  int r;

  if (nfds != (int)W + 1)
    return join_refuse(c, DCPX_E_PROTO,
                       "a reattach carries %u fds (ctl, ws0..ws%u), not %d",
                       W + 1, W - 1, nfds);
  g = dcpxd_group_find(c->m, j->group);
  if (!join_allowed(c, g, j->group))
    return;
  if (g) {
    r = group_compare(g, shape, transport, (int)j->backend, j->timeout_ns,
                      msg, sizeof(msg));
    if (r < 0)
      return join_refuse(c, r, "shape mismatch: %s", msg);
    mb = &g->member[rank];
    if (mb->conn && mb->conn->closing) {
      dcpxd_group_member_gone(mb->conn);
      g = dcpxd_group_find(c->m, j->group);
    }
  }
  if (!g)
    return group_adopt(c, j, shape, transport, mem, fds);

  mb = &g->member[rank];
  if (g->state == DCPXD_GROUP_FORMING || !g->ctl)
    return join_refuse(c, DCPX_E_STATE,
                       "group '%s' is forming anew; this member's memory "
                       "belongs to an earlier instance of it",
                       g->name);
  if (!fds_are_the_groups(g, fds))
    return join_refuse(c, DCPX_E_STATE,
                       "this member's memory (control page and workspaces) "
                       "is not that of group '%s' (another instance of the "
                       "group)",
                       g->name);
  if (dcpxd_member_live(mb))
    return join_refuse(c, DCPX_E_DUPRANK,
                       "rank %u of group '%s' is already held by pid %d", rank,
                       g->name, (int)mb->pid);
  if (held_by_other(g, rank, mb->pid, c))
    return refuse_other_holder(c, g->name, rank, mb->pid);
  member_attach(g, rank, c, j);
  dcpxd_group_health(g, rank)->pid = (uint32_t)c->pid;
  dcpxd_group_health(g, rank)->joined = 1;
  log_notice("group=%s gen=%u rank=%u reattached (pid %d, %s): %u/%u ranks "
             "live%s",
             g->name, g->generation, rank, (int)c->pid,
             dcpxd_group_state_name(g), g->live, W,
             g->awaiting ? ", more awaited" : "");
  reattach_done(g, c, rank);
}

/* The caps on groups (docs/PROTOCOL.md 7.3): groups per uid, committed
 * bytes per uid and in all. Root is exempt from the per-uid caps. False
 * after refusing the Join. */
static bool group_fits(dcpxd_conn *c, uint64_t bytes) {
  const dcpxd_conf *conf = c->m->conf;
  uint64_t total = bytes, mine = bytes;
  unsigned groups = 1;
  dcpxd_group *g;

  TAILQ_FOREACH(g, &c->m->groups, link) {
    total += g->bytes;
    if (g->owner == c->uid)
      mine += g->bytes, groups++;
  }
  if (c->uid != 0 && groups > conf->max_groups_per_uid)
    join_refuse(c, DCPX_E_BUSY,
                "too many groups for uid %u (max-groups-per-uid %u)",
                (unsigned)c->uid, conf->max_groups_per_uid);
  else if (c->uid != 0 && conf->max_ws_bytes_per_uid &&
           mine > conf->max_ws_bytes_per_uid)
    join_refuse(c, DCPX_E_NOMEM,
                "the group's %" PRIu64 " bytes would take uid %u past "
                "max-workspace-bytes-per-uid (%" PRIu64 " committed of %" PRIu64
                ")",
                bytes, (unsigned)c->uid, mine - bytes,
                conf->max_ws_bytes_per_uid);
  else if (conf->max_ws_bytes && total > conf->max_ws_bytes)
    join_refuse(c, DCPX_E_NOMEM,
                "the group's %" PRIu64 " bytes would take dcpxd past "
                "max-workspace-bytes (%" PRIu64 " committed of %" PRIu64 ")",
                bytes, total - bytes, conf->max_ws_bytes);
  else
    return true;
  return false;
}

/* The group a first Join creates (forming, no memory yet), or NULL after
 * refusing the Join. */
static dcpxd_group *group_new(dcpxd_conn *c, const Dcpx__Join *j,
                              const dcpx_shape *shape, int transport,
                              const dcpxd_mem_ops *mem) {
  dcpx_layout L;
  dcpxd_group *g;

  dcpx_layout_compute(&L, shape->world, shape->rows, shape->topk,
                      shape->local_topk);
  if (!group_fits(c, group_bytes(&L, shape->world)))
    return NULL;
  g = calloc(1, sizeof(*g));
  if (!g) {
    join_refuse(c, DCPX_E_NOMEM, "out of memory");
    return NULL;
  }
  g->m = c->m;
  memcpy(g->name, j->group, strlen(j->group) + 1);
  g->owner = c->uid;
  g->rule = dcpxd_conf_owner_rule(c->m->conf, g->name);
  g->shape = *shape;
  g->transport = transport;
  g->backend = (int)j->backend;
  g->timeout_ns = j->timeout_ns;
  g->mem = mem;
  g->state = DCPXD_GROUP_FORMING;
  g->L = L;
  g->bytes = group_bytes(&L, shape->world);
  TAILQ_INSERT_TAIL(&c->m->groups, g, link);
  log_info("group=%s forming: world %u, first rank %u (pid %d)", g->name,
           shape->world, j->rank, (int)c->pid);
  return g;
}

/* dcpxd_group_join, step 1: the Join's own arguments (the connection holds
 * no rank yet; name, shape, rank, transport, backend, timeout, NCCL id).
 * Returns 0 with *shape, *transport and *mem, or -1 after refusing. */
static int join_args(dcpxd_conn *c, const Dcpx__Join *j, dcpx_shape *shape,
                     int *transport, const dcpxd_mem_ops **mem) {
  const char *why = NULL;
  char msg[256];
  int r;

  if (c->group) {
    join_refuse(c, DCPX_E_STATE,
                "this connection already holds rank %u of group '%s'", c->rank,
                c->group->name);
    return -1;
  }
  if (!dcpx__group_name_ok(j->group)) {
    join_refuse(c, DCPX_E_INVAL, DCPXD_BAD_NAME_FMT, DCPX_GROUP_NAME_MAX);
    return -1;
  }
  if (!j->shape) {
    join_refuse(c, DCPX_E_INVAL, "Join without a shape");
    return -1;
  }
  dcpx__shape_from_pb(j->shape, shape);
  r = shape_explain(shape, msg, sizeof(msg));
  if (r < 0) {
    join_refuse(c, r, "%s", msg);
    return -1;
  }
  if (j->rank >= shape->world) {
    join_refuse(c, DCPX_E_BADRANK, "rank %u out of range for world %u",
                j->rank, shape->world);
    return -1;
  }
  /* auto stays auto for the CUDA backend: each rank resolves it from the
   * devices and its peer access (libclient/cuda.c; this daemon has no
   * CUDA context to ask) and writes the result into its health block,
   * where queries read it. The host backend always uses ll. */
  switch ((int)j->transport) {
  case DCPX__TRANSPORT__TRANSPORT_AUTO:
    *transport = j->backend == DCPX__BACKEND__BACKEND_CUDA
                     ? DCPX__TRANSPORT__TRANSPORT_AUTO
                     : DCPX__TRANSPORT__TRANSPORT_LL;
    break;
  case DCPX__TRANSPORT__TRANSPORT_LL:
    *transport = DCPX__TRANSPORT__TRANSPORT_LL;
    break;
  case DCPX__TRANSPORT__TRANSPORT_NCCL:
    *transport = DCPX__TRANSPORT__TRANSPORT_NCCL;
    break;
  default:
    join_refuse(c, DCPX_E_INVAL, "unknown transport %d", (int)j->transport);
    return -1;
  }
  *mem = dcpxd_mem_backend((int)j->backend, &why);
  if (!*mem) {
    join_refuse(c,
                j->backend == DCPX__BACKEND__BACKEND_CUDA ? DCPX_E_NOSYS
                                                          : DCPX_E_INVAL,
                "%s (backend %d)", why, (int)j->backend);
    return -1;
  }
  if (j->timeout_ns == 0 ||
      (!j->reattach && j->timeout_ns < DCPX_MIN_TIMEOUT_NS)) {
    /* docs/PROTOCOL.md 1: a group's wait timeout is at least 1 ms (a
     * shorter one fails healthy calls whose peers are merely scheduled
     * late); a reattach keeps the group's, whatever an older dcpxd
     * accepted */
    join_refuse(c, DCPX_E_INVAL,
                "timeout_ns %" PRIu64 " is below 1 ms (1000000 ns)",
                (uint64_t)j->timeout_ns);
    return -1;
  }
  if (!j->reattach && j->timeout_ns > DCPX_MAX_TIMEOUT_NS) {
    /* no bound at all: 2^64 - 1 ns held a wait for good */
    join_refuse(c, DCPX_E_INVAL,
                "timeout_ns %" PRIu64 " is above 1 hour (%llu ns)",
                (uint64_t)j->timeout_ns, DCPX_MAX_TIMEOUT_NS);
    return -1;
  }
  if (!j->reattach && j->join_timeout_ms > DCPX_MAX_JOIN_TIMEOUT_MS) {
    join_refuse(c, DCPX_E_INVAL,
                "join_timeout_ms %u is above 24 hours (%u ms)",
                (unsigned)j->join_timeout_ms, DCPX_MAX_JOIN_TIMEOUT_MS);
    return -1;
  }
  if (j->nccl_id.len > DCPX_NCCL_ID_BYTES) {
    join_refuse(c, DCPX_E_INVAL, "nccl_id longer than %d bytes",
                DCPX_NCCL_ID_BYTES);
    return -1;
  }
  return 0;
}

/* dcpxd_group_join, step 2, for a group that exists: the same shape, and
 * the rank free (a holder whose connection is closing is retired first,
 * which may destroy the group: *g is looked up again). Returns 0, or -1
 * after refusing. */
/* Whether c's peer has hung up, though this loop has not handled its EOF
 * yet (a rank process that exited and one that replaces it at once can
 * land in the same epoll batch, the join first). */
static bool conn_hung_up(const dcpxd_conn *c) {
  struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

/* Notes a Join a forming group refused, for the reason of the joins of
 * that group that time out later (on_join_timeout). */
static void forming_refused(dcpxd_group *g, const dcpxd_conn *c,
                            uint32_t rank, bool dup, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void forming_refused(dcpxd_group *g, const dcpxd_conn *c,
                            uint32_t rank, bool dup, const char *fmt, ...) {
  char why[200];
  va_list ap;

  if (g->state != DCPXD_GROUP_FORMING)
    return;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  g->refused_rank = rank;
  g->refused_dup = dup;
  dcpxd_bprintf(g->refused, "; rank %u (pid %d) was refused: %s", rank,
                (int)c->pid, why);
}

static int join_existing(dcpxd_conn *c, const Dcpx__Join *j,
                         const dcpx_shape *shape, int transport,
                         dcpxd_group **g) {
  dcpxd_member *mb = &(*g)->member[j->rank < (*g)->shape.world ? j->rank : 0];
  char msg[256];
  int r = group_compare(*g, shape, transport, (int)j->backend, j->timeout_ns,
                        msg, sizeof(msg));

  if (r < 0) {
    if (j->rank < (*g)->shape.world)
      forming_refused(*g, c, j->rank, false, "shape mismatch: %.180s", msg);
    join_refuse(c, r, "shape mismatch: %s", msg);
    return -1;
  }
  if (mb->conn && !mb->conn->closing && conn_hung_up(mb->conn)) {
    if (dcpxd_conn_join_waits(mb->conn)) {
      /* its Join is refused and what it sent after answered, as when its
       * hang-up is handled first (docs/PROTOCOL.md 10.3) */
      dcpxd_group_join_gone(mb->conn);
    } else {
      /* what it sent before its hang-up is answered first, a Leave
       * among it counting as a Leave (docs/PROTOCOL.md 10.3) */
      dcpxd_conn_hangup(mb->conn);
    }
    /* Either may have changed the group or destroyed it, and the
     * holder's requests may have made another of the name: over again
     * (the holder no longer holds the rank, or is closing). */
    *g = dcpxd_group_find(c->m, j->group);
    return *g ? join_existing(c, j, shape, transport, g) : 0;
  }
  if (mb->conn && mb->conn->closing) {
    /* Its holder hung up and the reaper has not run yet: retire it now,
     * then look again (that may have destroyed the group). */
    dcpxd_group_member_gone(mb->conn);
    *g = dcpxd_group_find(c->m, j->group);
    if (!*g)
      return 0;
  }
  if (dcpxd_member_live(&(*g)->member[j->rank])) {
    dcpxd_bprintf(msg, "rank %u of group '%s' is already held by pid %d",
                  j->rank, (*g)->name, (int)(*g)->member[j->rank].pid);
    forming_refused(*g, c, j->rank, true, "%s", msg);
    join_refuse(c, DCPX_E_DUPRANK, "%s", msg);
    return -1;
  }
  if ((*g)->state != DCPXD_GROUP_FORMING && !(*g)->live && (*g)->awaiting) {
    /* Nobody holds the group a restart left behind, only ranks that have
     * not reattached yet, and a rank joins afresh. If a member left it
     * (a Leave), its ranks are moving on (the awaited ones left while we
     * were away: their Leave could not reach us): it goes, and this join
     * starts a new group of the name. If its members only died (the
     * adopter, say), an awaited rank whose process lives may still come
     * back (its wait has not timed out): the group stays, and this join
     * replaces a dead rank; it goes only when no awaited process is
     * left (dcpxd_group_check_awaiting). (It went at once, with its live
     * ranks cut off for good.) */
    if (!(*g)->left)
      dcpxd_group_check_awaiting(*g);
    if ((*g)->left || !(*g)->awaiting) {
      log_info("group=%s: no rank attached since the restart (awaiting "
               "0x%x), and rank %u joins afresh: the old group goes",
               (*g)->name, (*g)->awaiting, j->rank);
      (*g)->awaiting = 0;
      if (dcpxd_group_reap_empty(*g)) {
        *g = NULL;
        return 0;
      }
    }
  }
  if (((*g)->awaiting >> j->rank) & 1u && c->pid > 0 &&
      (*g)->member[j->rank].pid == c->pid) {
    /* The awaited rank's own process joins afresh: it dropped the
     * membership it had before the restart (its Leave could not reach
     * us). That rank is gone from the group, as a dead one; a group no
     * rank is left to goes, and this join makes a new one. */
    char detail[160];
    (*g)->awaiting &= ~(1u << j->rank);
    dcpxd_group_health(*g, j->rank)->joined = 0;
    dcpxd_bprintf(detail,
                  "rank %u (pid %d) joined afresh instead of reattaching",
                  j->rank, (int)c->pid);
    if (dcpxd_group_reap_empty(*g)) {
      *g = NULL;
      return 0;
    }
    dcpxd_group_abort(*g, DCPX_ABORT_DEAD, (int32_t)j->rank, detail);
  }
  if (((*g)->awaiting >> j->rank) & 1u) {
    /* Awaited since a restart: a replacement only if its holder died. */
    dcpxd_group_check_awaiting(*g);
    if (((*g)->awaiting >> j->rank) & 1u) {
      if ((*g)->member[j->rank].pid > 0)
        join_refuse(c, DCPX_E_DUPRANK,
                    "rank %u of group '%s' is still held by pid %d, which "
                    "has not reattached since dcpxd restarted",
                    j->rank, (*g)->name, (int)(*g)->member[j->rank].pid);
      else
        join_refuse(c, DCPX_E_DUPRANK,
                    "rank %u of group '%s' is still awaited since dcpxd "
                    "restarted (its pid is not visible here: given up %u "
                    "ms after the restart)",
                    j->rank, (*g)->name, c->m->conf->join_timeout_ms);
      return -1;
    }
  }
  return 0;
}

/* A replacement for a rank whose process is gone, in a formed group
 * (invariant 4). */
static void join_replace(dcpxd_conn *c, const Dcpx__Join *j, dcpxd_group *g) {
  dcpx_rank_health *h = dcpxd_group_health(g, j->rank);
  char msg[96];

  member_attach(g, j->rank, c, j);
  g->member[j->rank].acked = true;
  if (j->rank == 0 && j->nccl_id.len)
    keep_nccl_id(g, &j->nccl_id); /* a new rank 0's */
  h->pid = (uint32_t)c->pid;
  h->joined = 1;
  log_notice("group=%s gen=%u rank=%u: replaced by pid %d (%s), %u/%u "
             "ranks live",
             g->name, g->generation, j->rank, (int)c->pid,
             dcpxd_group_state_name(g), g->live, g->shape.world);
  send_join_reply(g, j->rank);
  if (g->state == DCPXD_GROUP_ABORTED) {
    dcpxd_bprintf(msg, "rank %u was replaced; drain and acknowledge",
                  j->rank);
    group_request_reset(g, msg);
  }
  group_recover_maybe(g);
}

/* A rank joins a forming group (g) and waits for the others, at most the
 * join timeout; the last one forms it. */
static void join_forming(dcpxd_conn *c, const Dcpx__Join *j, dcpxd_group *g) {
  const uint32_t W = g->shape.world;
  uint32_t timeout_ms;

  if (j->rank == 0 && j->nccl_id.len)
    keep_nccl_id(g, &j->nccl_id); /* published when the group forms */
  member_attach(g, j->rank, c, j);
  timeout_ms =
      j->join_timeout_ms ? j->join_timeout_ms : c->m->conf->join_timeout_ms;
  dcpxd_conn_join_wait(c, on_join_timeout, timeout_ms);
  log_info("group=%s rank=%u joined (pid %d, node '%s', device %d): %u/%u",
           g->name, j->rank, (int)c->pid, g->member[j->rank].node,
           (int)j->device, g->live, W);
  /* The group forms only with live processes: retire members whose
   * connection is closing but not yet reaped, and give up the waiting
   * Joins whose client hung up though this loop has not handled it yet
   * (a hang-up and the Join that completes the group can land in one
   * epoll batch, the Join first): each is refused and what its client
   * sent after answered, as when the hang-up is handled first
   * (docs/PROTOCOL.md 10.3). This Join's own client last, since giving
   * it up may destroy the group. */
  for (uint32_t i = 0; i < W; i++) {
    dcpxd_conn *o = g->member[i].conn;
    if (!o || o == c)
      continue;
    if (o->closing)
      dcpxd_group_member_gone(o);
    else if (dcpxd_conn_join_waits(o) && conn_hung_up(o))
      dcpxd_group_join_gone(o);
  }
  if (conn_hung_up(c))
    return dcpxd_group_join_gone(c);
  if (g->live == W)
    group_form(g);
}

/* dcpxd_group_join, step 1b: the Join's device in this daemon's numbering.
 * A rank's ordinal counts the GPUs its own CUDA_VISIBLE_DEVICES shows, so
 * with a UUID the daemon looks the GPU up among its own; without one (a
 * client that predates Join.device_uuid) the ordinal is taken as ours.
 * Returns 0 with *ret_device, or -1 after refusing. */
static int join_device(dcpxd_conn *c, const Dcpx__Join *j,
                       const dcpxd_mem_ops *mem, int32_t *ret_device) {
  const size_t n = j->device_uuid.len;
  const uint8_t *u = j->device_uuid.data;
  int dev = -1, r;

  *ret_device = j->device;
  if (n != 0 && n != 16) {
    join_refuse(c, DCPX_E_INVAL, "device_uuid of %zu bytes (16 expected)", n);
    return -1;
  }
  if (n == 0 || !mem->device_of_uuid)
    return 0; /* the host backend has no devices: the UUID means nothing */
  r = mem->device_of_uuid(u, &dev);
  if (r < 0) {
    join_refuse(c, r == DCPX_E_NOENT ? DCPX_E_CUDA : r,
                "rank %u's GPU (device %d there, UUID %02x%02x%02x%02x-"
                "%02x%02x-...) is not one this dcpxd sees%s",
                j->rank, (int)j->device, u[0], u[1], u[2], u[3], u[4], u[5],
                r == DCPX_E_NOENT
                    ? " (does dcpxd's CUDA_VISIBLE_DEVICES hide it?)"
                    : ": dcpxd has no usable CUDA driver");
    return -1;
  }
  if (dev != j->device)
    log_info("group=%s rank=%u: its device %d is this daemon's device %d "
             "(by UUID)",
             j->group, j->rank, (int)j->device, dev);
  *ret_device = dev;
  return 0;
}

static void group_join(dcpxd_conn *c, const Dcpx__Join *j0, int *fds,
                       int nfds);
static bool join_unattached(dcpxd_conn *c, const Dcpx__Join *j);

/* A Join. Any refusal of a reattaching one, its arguments' and its
 * device's included (a dcpxd restarted without the rank's GPU), is noted
 * in the refusal table (join_refuse). */
void dcpxd_group_join(dcpxd_conn *c, const Dcpx__Join *j0, int *fds,
                      int nfds) {
  if (c->exited) /* read after its process exited (dcpxd-server.c) */
    return join_refuse(c, DCPX_E_CONNRESET,
                       "process %d exited before dcpxd read its Join",
                       (int)c->pid);
  if (c->send_err) /* muted: it could not be answered (dcpxd-server.c) */
    return join_refuse(c, DCPX_E_CONNRESET,
                       "an answer to this connection could not be sent "
                       "(%s): its Join takes no rank",
                       dcpx_strerror(c->send_err));
  if (j0->reattach && j0->group && dcpx__group_name_ok(j0->group))
    c->reattach_j = j0;
  group_join(c, j0, fds, nfds);
  c->reattach_j = NULL;
}

static void group_join(dcpxd_conn *c, const Dcpx__Join *j0, int *fds,
                       int nfds) {
  dcpx_shape shape = DCPX_SHAPE_INIT;
  const dcpxd_mem_ops *mem;
  dcpxd_group *g;
  int transport;
  Dcpx__Join jd;
  const Dcpx__Join *j = &jd;

  if (join_args(c, j0, &shape, &transport, &mem) < 0)
    return;
  /* The rest of the join sees the Join with its device in our numbering
   * (a shallow copy: the same strings and bytes). */
  jd = *j0;
  if (join_device(c, j0, mem, &jd.device) < 0)
    return;
  if (j->reattach)
    return group_reattach(c, j, &shape, transport, mem, fds, nfds);
  if (transport == DCPX__TRANSPORT__TRANSPORT_NCCL &&
      j->backend != DCPX__BACKEND__BACKEND_CUDA)
    return join_refuse(c, DCPX_E_TRANSPORT,
                       "transport nccl needs the cuda backend");
  if (transport == DCPX__TRANSPORT__TRANSPORT_NCCL && j->rank == 0 &&
      j->nccl_id.len == 0)
    return join_refuse(c, DCPX_E_INVAL,
                       "rank 0 of an nccl group must send its nccl_id");
  g = dcpxd_group_find(c->m, j->group);
  if (!join_allowed(c, g, j->group))
    return;
  if (g && join_existing(c, j, &shape, transport, &g) < 0)
    return;
  if (g && g->state != DCPXD_GROUP_FORMING)
    return join_replace(c, j, g);
  /* a new group, possibly where join_existing just let an old one go:
   * its creation is checked as such (the old group's owner may not
   * create groups of the name under the group-owner rules) */
  if (!g && !join_allowed(c, NULL, j->group))
    return;
  if (!g && !join_unattached(c, j))
    return;
  if (!g && !(g = group_new(c, j, &shape, transport, mem)))
    return;
  join_forming(c, j, g);
}

/* A fresh Join (not a reattach) of a name that a restart left unattached
 * (docs/PROTOCOL.md 10.3): its live ranks hold the group's workspace and
 * reattach at their next poll or recover (an idle engine may not for a
 * long time), and a new group now would split the name in two. So while
 * any of them lives the joiner is asked to retry (DCPX_E_AGAIN; libdcpx
 * does, until its own join timeout), and once a rank reattached the same
 * Join replaces a dead rank. A joiner whose process held the rank it
 * joins left that rank while dcpxd was down (its Leave was lost: a member
 * that held it would reattach, not join), so that rank is forgotten first
 * (only that one: the process may hold other ranks, one member per GPU,
 * that reattach on their own); when no live rank is left, the old group
 * is given up (its entry dropped) and the Join forms a new one. An admin's RESET gives
 * it up at once. false: refused. */
static bool join_unattached(dcpxd_conn *c, const Dcpx__Join *j) {
  if (dcpxd_secrets_forget_rank(c->m->secrets, j->group, j->rank, c->pid))
    log_notice("group=%s: pid %d, which held rank %u of it before dcpxd "
               "restarted, joins it afresh: it is taken to have left it",
               j->group, (int)c->pid, j->rank);
  const uint32_t live = dcpxd_secrets_live(c->m->secrets, j->group);
  if (!live) {
    if (dcpxd_secrets_remove(c->m->secrets, j->group))
      log_notice("group=%s: the unattached group is given up (no rank of "
                 "it lives): a new group of the name forms",
                 j->group);
    return true;
  }
  join_refuse(c, DCPX_E_AGAIN,
              "group '%s' awaits the reattach of its ranks after a dcpxd "
              "restart (ranks of mask 0x%x still live): retry once they "
              "have reattached (at their next dcpx_poll or dcpx_recover); "
              "an admin's 'dcpxctl reset --group %s' gives the old group "
              "up",
              j->group, live, j->group);
  return false;
}

/* ---- abort --------------------------------------------------------------- */

void dcpxd_group_abort(dcpxd_group *g, uint32_t reason, int32_t rank,
                       const char *detail) {
  if (g->state == DCPXD_GROUP_FORMING || !g->hdr)
    return;
  if (g->hdr->abort == 0) {
    g->hdr->abort = reason;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    g->aborts++;
    if (g->state == DCPXD_GROUP_READY)
      g->state = DCPXD_GROUP_ABORTED;
    log_warning("group=%s gen=%u aborted: reason=%s rank=%d: %s", g->name,
                g->generation, dcpx__abort_reason_name(reason), (int)rank,
                detail);
  } else {
    log_info("group=%s gen=%u (already aborted): reason=%s rank=%d: %s",
             g->name, g->generation, dcpx__abort_reason_name(reason), (int)rank,
             detail);
  }
  dcpxd_health_harvest(g);
  broadcast_event(g, DCPX__EVENT__KIND__ABORT, reason, rank, detail);
}

/* ---- recovery ------------------------------------------------------------ */

/* ABORTED -> RECOVERING: ask every member to drain and acknowledge. */
static void group_request_reset(dcpxd_group *g, const char *detail) {
  if (g->state == DCPXD_GROUP_ABORTED) {
    g->state = DCPXD_GROUP_RECOVERING;
    g->hdr->recovering = 1;
    log_info("group=%s gen=%u recovering: %s", g->name, g->generation, detail);
  }
  broadcast_event(g, DCPX__EVENT__KIND__RESET_REQUESTED, g->hdr->abort, -1,
                  detail);
}

static void zero_work(uv_work_t *req) {
  dcpxd_group *g = req->data;
  g->zero_status = 0;
  for (uint32_t r = 0; r < g->shape.world; r++) {
    int k = dcpxd_buf_zero(g->ws[r]);
    if (k < 0 && g->zero_status == 0)
      g->zero_status = k;
  }
}

static bool group_all_acked(const dcpxd_group *g) {
  for (uint32_t r = 0; r < g->shape.world; r++)
    if (!dcpxd_member_live(&g->member[r]) || !g->member[r].acked)
      return false;
  return true;
}

/* The workspaces are zero: finish (invariant 3's order). */
static void group_recovered(dcpxd_group *g) {
  const uint32_t W = g->shape.world;

  for (uint32_t r = 0; r < W; r++) {
    dcpx_rank_health *h = dcpxd_group_health(g, r);
    uint32_t joined = h->joined, pid = h->pid, transport = h->transport;
    /* The call counters are the rank process's totals: a recovery keeps
     * them (the CUDA kernels keep theirs in device memory and publish
     * them again; zeroing the host backend's here lost its calls before
     * the fault). A replacement's client zeroes them at its join. */
    uint64_t calls = h->calls, rows = h->rows, rescue_rows = h->rescue_rows,
             failed_calls = h->failed_calls;
    memset((void *)h, 0, sizeof(*h));
    h->joined = joined;
    h->pid = pid;
    h->transport = transport; /* resolved at join, still in use */
    h->calls = calls;
    h->rows = rows;
    h->rescue_rows = rescue_rows;
    h->failed_calls = failed_calls;
    g->member[r].acked = false;
  }
  memset((uint8_t *)g->hdr + g->L.off_records, 0,
         sizeof(dcpx_wait_record) * (size_t)W * g->shape.rows);
  memset(g->harvested, 0, ((size_t)W * g->shape.rows + 7) / 8);
  g->generation = g->generation + 1 ? g->generation + 1 : 1;
  if (g->nccl_fresh)
    ctl_nccl_id(g); /* the members rebuild their communicators from it */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  g->hdr->generation = g->generation;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  g->hdr->recovering = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST); /* PROTOCOL.md 6.9 step 5 */
  g->hdr->abort = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  g->state = DCPXD_GROUP_READY;
  g->recoveries++;
  log_notice("group=%s recovered: generation %u", g->name, g->generation);
  broadcast_event(g, DCPX__EVENT__KIND__RESET_DONE, 0, -1, "");
}

static void zero_done(uv_work_t *req, int status) {
  dcpxd_group *g = req->data;
  dcpxd_manager *m = g->m;

  g->zeroing = false;
  if (g->doomed) {
    group_free(g);
    dcpxd_manager_update(m);
    return;
  }
  if (status < 0 && g->zero_status == 0)
    g->zero_status = status == UV_ECANCELED ? -ECANCELED : status;
  if (g->zero_status < 0) {
    char detail[160];
    dcpxd_bprintf(detail, "recovery failed: cannot zero the workspaces: %s",
                  dcpx_strerror(g->zero_status));
    log_error("group=%s: %s", g->name, detail);
    for (uint32_t r = 0; r < g->shape.world; r++)
      g->member[r].acked = false;
    broadcast_event(g, DCPX__EVENT__KIND__ABORT, g->hdr->abort, -1, detail);
  } else if (group_all_acked(g)) {
    log_info("group=%s: %u workspaces zeroed in %.1f ms", g->name,
             g->shape.world,
             (double)(dcpxd_now_ns(CLOCK_MONOTONIC) - g->zero_start_ns) / 1e6);
    group_recovered(g);
  } else {
    /* A member went away meanwhile: wait for its replacement; the zeroing
     * runs again then. */
    log_info("group=%s: a rank was lost during recovery; waiting for it",
             g->name);
  }
  dcpxd_manager_update(m);
}

static void group_recover_maybe(dcpxd_group *g) {
  int r;

  if (g->state != DCPXD_GROUP_RECOVERING || g->zeroing || !group_all_acked(g))
    return;
  dcpxd_health_harvest(g); /* store late records before they are zeroed */
  log_info("group=%s gen=%u: every rank drained, zeroing %u workspaces of "
           "%" PRIu64 " bytes",
           g->name, g->generation, g->shape.world, g->L.ws_bytes);
  g->zeroing = true;
  g->zero_start_ns = dcpxd_now_ns(CLOCK_MONOTONIC);
  g->zero_work.data = g;
  r = uv_queue_work(g->m->loop, &g->zero_work, zero_work, zero_done);
  if (r < 0) {
    log_warning("group=%s: cannot queue the zeroing (%s); doing it inline",
                g->name, uv_strerror(r));
    zero_work(&g->zero_work);
    zero_done(&g->zero_work, 0);
  }
}

void dcpxd_group_recover_ack(dcpxd_conn *c, const Dcpx__RecoverAck *a) {
  dcpxd_group *g = c->group;
  dcpxd_member *mb;

  if (!g) {
    dcpxd_conn_reply(c, DCPX_E_STATE, "not a member of any group");
    return;
  }
  mb = &g->member[c->rank];
  if (g->state == DCPXD_GROUP_FORMING) {
    dcpxd_conn_reply(c, DCPX_E_STATE, "group '%s' is still forming", g->name);
    return;
  }
  if (a->generation != g->generation) {
    dcpxd_conn_reply(c, DCPX_E_STATE,
                     "stale generation %u (group '%s' is at %u)", a->generation,
                     g->name, g->generation);
    return;
  }
  if (a->nccl_id.len > DCPX_NCCL_ID_BYTES ||
      (a->nccl_id.len && c->rank != 0)) {
    dcpxd_conn_reply(c, DCPX_E_INVAL,
                     "nccl_id: %zu bytes from rank %u (rank 0 only, at most "
                     "%d)", a->nccl_id.len, c->rank, DCPX_NCCL_ID_BYTES);
    return;
  }
  if (a->nccl_id.len)
    keep_nccl_id(g, &a->nccl_id);
  if (g->state == DCPXD_GROUP_READY) {
    /* Unprompted: the rank asks for a recovery after a failed call. */
    const dcpx_rank_health *h = dcpxd_group_health(g, c->rank);
    char detail[96];
    dcpxd_bprintf(detail, "rank %u asked for a recovery", c->rank);
    dcpxd_group_abort(
        g, (h->alarm || h->failed) ? DCPX_ABORT_ALARM : DCPX_ABORT_OPERATOR,
        (int32_t)c->rank, detail);
  }
  mb->acked = true;
  dcpxd_conn_reply(c, 0, NULL);
  log_info("group=%s gen=%u rank=%u drained and acknowledged", g->name,
           g->generation, c->rank);
  if (g->state == DCPXD_GROUP_ABORTED) {
    char detail[96];
    dcpxd_bprintf(detail, "rank %u acknowledged; drain and acknowledge",
                  c->rank);
    group_request_reset(g, detail);
  }
  group_recover_maybe(g);
}

int dcpxd_group_reset(dcpxd_group *g, char *err, size_t errlen) {
  if (g->state == DCPXD_GROUP_FORMING) {
    snprintf(err, errlen, "group '%s' is still forming", g->name);
    return DCPX_E_STATE;
  }
  if (g->state == DCPXD_GROUP_READY)
    dcpxd_group_abort(g, DCPX_ABORT_OPERATOR, -1, "reset by the operator");
  group_request_reset(g, "reset by the operator: drain and acknowledge");
  group_recover_maybe(g);
  return 0;
}

/* ---- members leaving ----------------------------------------------------- */

/* Common end of Leave and of a connection going away. */
static void member_leaves(dcpxd_conn *c, bool graceful) {
  dcpxd_group *g = c->group;
  uint32_t rank = c->rank;
  char detail[224];

  member_detach(g, rank);
  if (g->m->stopping) {
    /* Invariant 7: the rank lives on; leave its control page alone. */
    if (g->live == 0)
      group_destroy(g);
    return;
  }
  if (g->state == DCPXD_GROUP_FORMING) {
    log_info("group=%s rank=%u %s while forming: %u/%u", g->name, rank,
             graceful ? "left" : "went away", g->live, g->shape.world);
    if (g->live == 0)
      group_destroy(g);
    return;
  }
  dcpxd_group_health(g, rank)->joined = 0;
  /* The rank is not held any more: the groups file must not name this
   * process (which may live on after a Leave) as a rank that a restart
   * leaves to reattach (dcpxd-secrets.h). */
  dcpxd_secrets_set_pid(g->m->secrets, g->name, g->shape.world, rank,
                        DCPXD_PID_NONE);
  g->left |= graceful;
  if (g->live == 0 && !g->awaiting) {
    log_info("group=%s: its last member %s", g->name,
             graceful ? "left" : "went away");
    group_destroy(g);
    return;
  }
  /* (With ranks awaited since a restart the group lives on, aborted, for
   * them to come back and for a replacement of this one.) A rank that
   * raised its alarm before (a wait that timed out, which the next scan
   * would have seen) is the cause: a rank whose call failed may well
   * leave before that scan, and the abort then named it "dead". */
  dcpxd_bprintf(detail, "rank %u (pid %d) %s", rank, (int)c->pid,
                graceful ? "left the group" : c->close_reason);
  if (g->hdr && !g->hdr->abort) {
    char also[240];
    dcpxd_bprintf(also, "; then %s", detail);
    if (dcpxd_health_alarm_abort(g, also))
      return;
  }
  dcpxd_group_abort(g, DCPX_ABORT_DEAD, (int32_t)rank, detail);
}

void dcpxd_group_leave(dcpxd_conn *c) {
  if (!c->group) {
    dcpxd_conn_reply(c, DCPX_E_STATE, "not a member of any group");
    return;
  }
  member_leaves(c, true);
  dcpxd_conn_reply(c, 0, NULL);
}

void dcpxd_group_member_gone(dcpxd_conn *c) {
  if (c->group)
    member_leaves(c, false);
}

void dcpxd_group_join_gone(dcpxd_conn *c) {
  char name[DCPX_GROUP_NAME_MAX + 1];
  const uint32_t rank = c->rank;

  dcpxd_bprintf(name, "%s", c->group->name);
  member_leaves(c, false); /* may destroy the group */
  join_refuse(c, DCPX_E_CONNRESET,
              "the client hung up while its Join for rank %u of group '%s' "
              "waited: the rank is given up",
              rank, name);
}

/* The rank stays attached until the reaper (manager_stop closes c next):
 * freed here, it was missing from the count of the next waiting Join of
 * the group that this shutdown answers ("1 of 3 ranks joined" where two
 * had). */
void dcpxd_group_join_stopped(dcpxd_conn *c, const char *why) {
  const dcpxd_group *g = c->group;

  dcpxd_conn_join_done(c); /* answered: it waits no more */
  join_refuse(c, DCPX_E_CONNRESET,
              "dcpxd is shutting down (%s): the Join for rank %u of group "
              "'%s' waited for its group (%u of %u ranks joined), which "
              "will not form; join again once dcpxd is back",
              why, c->rank, g->name, g->live, g->shape.world);
}

/* ---- fault hook ---------------------------------------------------------- */

int dcpxd_group_fault_clear(dcpxd_group *g, int32_t rank, char *note,
                            size_t notelen, char *err, size_t errlen) {
  if (g->state == DCPXD_GROUP_FORMING) {
    snprintf(err, errlen, "group '%s' is still forming", g->name);
    return DCPX_E_STATE;
  }
  if (rank < 0 || (uint32_t)rank >= g->shape.world) {
    snprintf(err, errlen, "rank %d out of range for world %u", (int)rank,
             g->shape.world);
    return DCPX_E_BADRANK;
  }
  dcpx_rank_health *h = dcpxd_group_health(g, (uint32_t)rank);
  const bool armed = h->fault_armed, fired = h->fault_fired;
  /* A block that read fault_armed just before may still stall once (as
   * when the hook is armed again): bounded by the timeout like any. */
  h->fault_armed = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (armed)
    log_notice("group=%s gen=%u rank=%d: fault hook disarmed (%s)", g->name,
               g->generation, (int)rank, fired ? "it had fired" : "unfired");
  snprintf(note, notelen, "group %s rank %d: %s", g->name, (int)rank,
           !armed  ? "no fault hook was armed"
           : fired ? "fault hook disarmed (it had fired)"
                   : "fault hook disarmed before it fired");
  return 0;
}

int dcpxd_group_fault_stall(dcpxd_group *g, int32_t rank, uint32_t epoch,
                            bool has_call, uint64_t call, uint64_t ticks,
                            char *err, size_t errlen) {
  dcpx_rank_health *h;

  if (g->state == DCPXD_GROUP_FORMING) {
    snprintf(err, errlen, "group '%s' is still forming", g->name);
    return DCPX_E_STATE;
  }
  /* A recovery zeroes the health blocks, hooks included: one armed now
   * would be gone before any call of the next generation could fire it,
   * with a success reply (docs/PROTOCOL.md 6.6). */
  if (g->state != DCPXD_GROUP_READY) {
    snprintf(err, errlen,
             "group '%s' is %s: its recovery disarms every fault hook; arm "
             "it once the group is ready",
             g->name, dcpxd_group_state_name(g));
    return DCPX_E_STATE;
  }
  if (rank < 0 || (uint32_t)rank >= g->shape.world) {
    snprintf(err, errlen, "rank %d out of range for world %u", (int)rank,
             g->shape.world);
    return DCPX_E_BADRANK;
  }
  if (ticks == 0) {
    snprintf(err, errlen, "ticks must be > 0");
    return DCPX_E_INVAL;
  }
  /* The hook matches the row half of row 0's tag (docs/PROTOCOL.md 4.3,
   * 6.6), which runs 1..0xFFFE: a hook armed for more would never fire,
   * and nothing would say so. */
  if (epoch > DCPX_EPOCH_ROW_MAX) {
    snprintf(err, errlen, "epoch %u never occurs (epochs run 1..%u; 0: any)",
             epoch, DCPX_EPOCH_ROW_MAX);
    return DCPX_E_INVAL;
  }
  /* Call tags count from 1 (docs/PROTOCOL.md 6.5): a hook armed for call
   * 0 would never fire either. (~0 is "any call", as has_call unset.) */
  if (has_call && call == 0) {
    snprintf(err, errlen, "call 0 never occurs (calls count from 1)");
    return DCPX_E_INVAL;
  }
  /* The hook is read by the LL merge only (docs/PROTOCOL.md 6.6): on an
   * nccl group, asked for at join or chosen by auto (the ranks' transport
   * words), nothing would ever fire it. */
  bool nccl = g->transport == DCPX__TRANSPORT__TRANSPORT_NCCL;
  for (uint32_t r = 0; !nccl && r < g->shape.world; r++)
    nccl = __atomic_load_n(&dcpxd_group_health(g, r)->transport,
                           __ATOMIC_ACQUIRE) == DCPX_TRANSPORT_NCCL;
  if (nccl) {
    snprintf(err, errlen,
             "group '%s' uses the nccl transport, which has no fault hook "
             "(fault injection needs the ll transport or the host backend)",
             g->name);
    return DCPX_E_NOSYS;
  }
  /* Disarm, write the parameters, then arm: a stalling block reads them
   * only after it saw fault_armed. */
  h = dcpxd_group_health(g, (uint32_t)rank);
  h->fault_armed = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  h->fault_epoch = epoch;
  h->fault_call = has_call ? call : ~(uint64_t)0;
  h->fault_ticks = ticks;
  h->fault_fired = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  h->fault_armed = 1;
  log_notice("group=%s gen=%u rank=%d: fault armed: stall %" PRIu64
             " ns at epoch %u call_seq %" PRIu64 " (~0: any)",
             g->name, g->generation, (int)rank, ticks, epoch, h->fault_call);
  return 0;
}
