/* transport.h - the choice of transport (docs/PROTOCOL.md section 7; internal).
 *
 * ll needs every rank to load and store every other rank's workspace: two
 * ranks on one GPU, or on two GPUs with peer access (NVLink / P2P). When
 * any pair lacks that, the group falls back to nccl (an all-gather of the
 * candidate rows, then the same merge). A group setting (Join.transport ll
 * or nccl) overrides the choice.
 *
 * The CUDA backend decides at join from JoinReply.devices and
 * cudaDeviceCanAccessPeer. Every rank decides for itself: the daemon has
 * no CUDA context to ask, and a rank on another node cannot be asked at
 * all. Peer access is symmetric in practice, so the ranks agree; the client
 * still compares the ranks' choices through the control page (each rank's
 * health block `transport` word) before the first call, and refuses the
 * join with DCPX_E_TRANSPORT when they differ.
 */
#ifndef DCPX_COMMON_TRANSPORT_H
#define DCPX_COMMON_TRANSPORT_H

#include <stdint.h>

#include "dcpx.h"

/* Resolves `requested` (DCPX_TRANSPORT_*) for a group of `world` ranks on
 * devices[0..world): LL if requested, NCCL if requested; AUTO gives LL iff
 * every pair (i, j), i != j, is on the same device (devices[i] ==
 * devices[j]) or can_access[i * world + j] and can_access[j * world + i]
 * are both nonzero, else NCCL. can_access may be NULL for AUTO only when
 * every rank is on the same device. Returns DCPX_TRANSPORT_LL or
 * DCPX_TRANSPORT_NCCL, or DCPX_E_INVAL (world 0 or > 16, NULL devices, an
 * unknown request, a needed can_access missing). */
__attribute__((visibility("hidden"))) int
dcpx__transport_resolve(uint32_t requested, uint32_t world,
                        const int32_t *devices, const uint8_t *can_access);

/* The ranks' GPUs as one rank sees them (dcpx__cuda_init). A device
 * ordinal names a GPU only under one CUDA_VISIBLE_DEVICES, and ranks and
 * dcpxd need not share theirs; a GPU's UUID is the same everywhere.
 * uuids: 16 bytes per rank (JoinReply.device_uuids), or NULL when not
 * every rank sent one; local_uuids: the 16-byte UUIDs of this process's
 * devices 0 .. nlocal-1. Writes, for r < world:
 *   gpu[r]: equal for two ranks iff they are on one GPU (the index of the
 *           first rank on theirs);
 *   local[r]: this process's ordinal of rank r's GPU, -1 where it does
 *           not see it.
 * Without uuids, devices[] (JoinReply.devices) are taken as this
 * process's ordinals, as before the UUIDs (a daemon or rank that predates
 * them). */
__attribute__((visibility("hidden"))) void
dcpx__gpu_map(uint32_t world, const int32_t *devices, const uint8_t *uuids,
              const uint8_t *local_uuids, int nlocal, int32_t *gpu,
              int32_t *local);

/* The names of transports and backends, the one table of each for dcpxd
 * and libdcpx (logs, error texts): DCPX_TRANSPORT_* -> "auto", "ll",
 * "nccl"; DCPX_BACKEND_* -> "host", "cuda"; anything else -> "unknown".
 * The protobuf enums (Dcpx__Transport, Dcpx__Backend) have the same
 * values (proto/frame.c checks it at compile time). */
__attribute__((visibility("hidden"))) const char *
dcpx__transport_name(uint32_t transport);
__attribute__((visibility("hidden"))) const char *
dcpx__backend_name(uint32_t backend);
/* The abort reasons of the control page (DCPX_ABORT_*, layout.h): 0 ->
 * "none", "alarm", "dead", "operator"; anything else -> "unknown". One
 * table for dcpxd's logs and dcpxctl. */
__attribute__((visibility("hidden"))) const char *
dcpx__abort_reason_name(uint32_t reason);

#endif /* DCPX_COMMON_TRANSPORT_H */
