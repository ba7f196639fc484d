/* transport.c - the transport rule (common/transport.h). Pure C. */
#include <string.h>

#include "transport.h"
#include "layout.h"

int dcpx__transport_resolve(uint32_t requested, uint32_t world,
                            const int32_t *devices,
                            const uint8_t *can_access) {
  if (world < 1 || world > DCPX_MAX_WORLD)
    return DCPX_E_INVAL;
  if (requested == DCPX_TRANSPORT_LL || requested == DCPX_TRANSPORT_NCCL)
    return (int)requested;
  if (requested != DCPX_TRANSPORT_AUTO || !devices)
    return DCPX_E_INVAL;
  for (uint32_t i = 0; i < world; i++)
    for (uint32_t j = i + 1; j < world; j++) {
      if (devices[i] == devices[j])
        continue;
      if (!can_access)
        return DCPX_E_INVAL;
      if (!can_access[i * world + j] || !can_access[j * world + i])
        return DCPX_TRANSPORT_NCCL;
    }
  return DCPX_TRANSPORT_LL;
}

void dcpx__gpu_map(uint32_t world, const int32_t *devices, const uint8_t *uuids,
                   const uint8_t *local_uuids, int nlocal, int32_t *gpu,
                   int32_t *local) {
  for (uint32_t r = 0; r < world; r++) {
    gpu[r] = (int32_t)r;
    for (uint32_t q = 0; q < r; q++)
      if (uuids ? memcmp(uuids + 16u * q, uuids + 16u * r, 16) == 0
                : devices[q] == devices[r]) {
        gpu[r] = (int32_t)q;
        break;
      }
    local[r] = -1;
    if (!uuids) {
      if (devices[r] >= 0 && devices[r] < nlocal)
        local[r] = devices[r];
      continue;
    }
    for (int d = 0; d < nlocal; d++)
      if (memcmp(local_uuids + 16u * (uint32_t)d, uuids + 16u * r, 16) == 0) {
        local[r] = d;
        break;
      }
  }
}

const char *dcpx__transport_name(uint32_t t) {
  static const char *const names[] = {
      [DCPX_TRANSPORT_AUTO] = "auto",
      [DCPX_TRANSPORT_LL] = "ll",
      [DCPX_TRANSPORT_NCCL] = "nccl",
  };
  return t < sizeof(names) / sizeof(names[0]) ? names[t] : "unknown";
}

const char *dcpx__backend_name(uint32_t b) {
  static const char *const names[] = {
      [DCPX_BACKEND_HOST] = "host",
      [DCPX_BACKEND_CUDA] = "cuda",
  };
  return b < sizeof(names) / sizeof(names[0]) ? names[b] : "unknown";
}

const char *dcpx__abort_reason_name(uint32_t reason) {
  static const char *const names[] = {
      [0] = "none",
      [DCPX_ABORT_ALARM] = "alarm",
      [DCPX_ABORT_DEAD] = "dead",
      [DCPX_ABORT_OPERATOR] = "operator",
  };
  return reason < sizeof(names) / sizeof(names[0]) ? names[reason]
                                                   : "unknown";
}
