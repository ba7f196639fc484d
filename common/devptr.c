/* devptr.c - the rules of devptr.h: which memory a call's arrays may be. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <stdio.h>

#include "dcpx.h"
#include "devptr.h"

void dcpx__ptr_check_init(dcpx__ptr_check *c, int device, int pageable_ok,
                          dcpx__mem_query_fn query, void *ctx) {
  *c = (dcpx__ptr_check){0};
  c->device = device;
  c->pageable_ok = pageable_ok;
  c->query = query;
  c->ctx = ctx;
}

static int cached(const dcpx__ptr_check *c, uintptr_t a) {
  for (uint32_t i = 0; i < c->n; i++)
    if (a >= c->beg[i] && a < c->end[i])
      return 1;
  return 0;
}

static void remember(dcpx__ptr_check *c, uintptr_t beg, uintptr_t end) {
  if (end <= beg)
    return;
  const uint32_t i = c->n < DCPX__PTR_CACHE ? c->n++ : c->next;
  c->beg[i] = beg;
  c->end[i] = end;
  c->next = (i + 1) % DCPX__PTR_CACHE;
}

/* Checks one address a (the array's first byte, or its last when `last`).
 * *ret_end: where the memory holding it ends, 0 when not known. */
static int check_addr(dcpx__ptr_check *c, const char *what, const void *p,
                      uint64_t bytes, uintptr_t a, int last,
                      uintptr_t *ret_end, char *why, size_t why_len) {
  dcpx__mem_info mi = {DCPX__MEM_UNKNOWN, -1, 0, 0};
  *ret_end = 0;
  if (cached(c, a))
    return 0;
  c->queries++;
  if (c->query(c->ctx, a, &mi) < 0) {
    snprintf(why, why_len, "%s %p: the CUDA driver could not say what "
             "memory it is", what, p);
    return DCPX_E_CUDA;
  }
  switch (mi.kind) {
  case DCPX__MEM_DEVICE:
    if (mi.device == c->device)
      break;
    snprintf(why, why_len, "%s %p: device memory of GPU %d, not of this "
             "member's GPU %d", what, p, mi.device, c->device);
    return DCPX_E_INVAL;
  case DCPX__MEM_HOST:
  case DCPX__MEM_MANAGED:
    break;
  default:
    if (c->pageable_ok)
      return 0; /* the GPU reads pageable memory itself; not cached */
    if (last)
      snprintf(why, why_len, "%s %p: the call needs %llu bytes from there, "
               "but its last byte is not memory of a CUDA allocation (the "
               "array is shorter than the call's rows and sizes say)",
               what, p, (unsigned long long)bytes);
    else
      snprintf(why, why_len, "%s %p: not memory that CUDA knows (host "
               "memory from malloc or the stack?); pass device memory of "
               "GPU %d, or managed or registered host memory", what, p,
               c->device);
    return DCPX_E_INVAL;
  }
  remember(c, mi.beg, mi.end);
  *ret_end = mi.end > mi.beg ? mi.end : 0;
  return 0;
}

int dcpx__ptr_ok(dcpx__ptr_check *c, const char *what, const void *p,
                 uint64_t bytes, char *why, size_t why_len) {
  const uintptr_t a = (uintptr_t)p;
  uintptr_t end = 0;
  int r;
  if (!p || !bytes)
    return 0;
  if (bytes - 1u > (uint64_t)(UINTPTR_MAX - a)) {
    snprintf(why, why_len, "%s %p: %llu bytes from there run past the "
             "address space", what, p, (unsigned long long)bytes);
    return DCPX_E_INVAL;
  }
  const uintptr_t z = a + (uintptr_t)(bytes - 1u);
  if ((r = check_addr(c, what, p, bytes, a, 0, &end, why, why_len)) < 0)
    return r;
  if (z == a || (end && z < end))
    return 0; /* one mapping holds the whole array */
  return check_addr(c, what, p, bytes, z, 1, &end, why, why_len);
}
