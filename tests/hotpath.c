/* hotpath.c - the call path's promise (include/dcpx.h): with the log off
 * and no error, dcpx_push and dcpx_merge make no system call and allocate
 * nothing. One host-backend member (W = 1, so no wait ever spins into
 * sched_yield) over memory this program maps; 200 calls between two
 * marker syscalls, write(-1, "dcpx-hotpath-begin"/"-end"), that
 * tests/hotpath.sh finds in strace's output and counts the system calls
 * between. Allocations are counted here, by interposing malloc and
 * friends (not under ASan, which owns them). Exit: 0 ok, 1 a wrong
 * result or an allocation, 77 nothing to check. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcpx.h"
#include "layout.h"
#include "member.h"

#if defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COUNT_ALLOCS 0
#endif
#endif
#ifndef COUNT_ALLOCS
#define COUNT_ALLOCS 1
#endif

static volatile int g_counting;
static volatile unsigned long g_allocs;

#if COUNT_ALLOCS
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

void *malloc(size_t n) {
  if (g_counting)
    g_allocs++;
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  if (g_counting)
    g_allocs++;
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  if (g_counting)
    g_allocs++;
  return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
#endif

int main(void) {
  enum { R = 8, K = 64, N = 16, L = 512, CALLS = 200 };
  dcpx_shape sh = DCPX_SHAPE_INIT;
  dcpx_layout lay;
  dcpx_member *m;
  sh.world = 1;
  sh.rows = R;
  sh.topk = K;
  sh.local_topk = N;
  sh.block_size = 16;
  sh.interleave = 1;
  sh.max_local = L;
  dcpx_layout_compute(&lay, 1, R, K, N);
  dcpx_ctl_header *hdr = calloc(1, lay.ctl_bytes);
  char *ws[1] = {calloc(1, lay.ws_bytes)};
  hdr->magic = DCPX_CTL_MAGIC;
  hdr->version = DCPX_CTL_VERSION;
  hdr->world = 1;
  hdr->rows = R;
  hdr->generation = 1;
  hdr->timeout_ns = 1000000000ull;
  if (dcpx__member_attach(&sh, 0, 1000000000ull, hdr, ws, &m) != 0)
    return 77;

  static uint16_t logits[R * L];
  static int32_t ends[R], req[R], bt[R * (L / 16)], rows_out[R * K],
      ids[R * K], valid[R];
  static uint32_t sat[R];
  for (uint32_t i = 0; i < R * L; i++)
    logits[i] = (uint16_t)(0x3F00 + (i * 2654435761u >> 20) % 0x80);
  for (uint32_t t = 0; t < R; t++) {
    ends[t] = L - (int32_t)t;
    req[t] = (int32_t)t;
  }
  for (uint32_t i = 0; i < R * (L / 16); i++)
    bt[i] = (int32_t)i;
  dcpx_call in = DCPX_CALL_INIT;
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  in.rows = R;
  in.logits = logits;
  in.stride = L;
  in.row_ends = ends;
  in.req_id = req;
  in.block_table = bt;
  in.bt_rows = R;
  in.bt_cols = L / 16;
  out.rows_out = rows_out;
  out.valid_out = valid;
  out.ids_out = ids;
  out.sat_word = sat;

  int bad = 0;
  /* A first call outside the markers: first-use work (DCPX_DEBUG is read
   * once) is allowed there. */
  bad |= dcpx_push(m, &in, NULL) != 0 || dcpx_merge(m, &in, &out, NULL) != 0;
  if (write(-1, "dcpx-hotpath-begin", 18) != -1)
    bad = 1;
  g_counting = 1;
  for (uint64_t c = 0; c < CALLS; c++) {
    in.call_tag = c;
    bad |= dcpx_push(m, &in, NULL) != 0;
    bad |= dcpx_merge(m, &in, &out, NULL) != 0;
  }
  g_counting = 0;
  if (write(-1, "dcpx-hotpath-end", 16) != -1)
    bad = 1;
  for (uint32_t t = 0; t < R; t++)
    bad |= valid[t] != K;
  dcpx__member_detach(m);
  free(ws[0]);
  free(hdr);
  printf("hotpath: %d calls, %lu allocations%s, results %s\n", CALLS,
         g_allocs, COUNT_ALLOCS ? "" : " (not counted under ASan)",
         bad ? "WRONG" : "ok");
  return bad || g_allocs ? 1 : 0;
}
