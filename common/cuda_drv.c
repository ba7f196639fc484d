/* cuda_drv.c - the driver entry-point table (cuda_drv.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "cuda_drv.h"
#include "dcpx.h"

static const struct {
  const char *sym;
  size_t off;
  int optional;
} entries[] = {
    {"cuMemCreate", offsetof(dcpx_cuda_drv, mem_create), 0},
    {"cuMemRelease", offsetof(dcpx_cuda_drv, release), 0},
    {"cuMemExportToShareableHandle", offsetof(dcpx_cuda_drv, export_fd), 0},
    {"cuMemImportFromShareableHandle", offsetof(dcpx_cuda_drv, import_fd), 0},
    {"cuMemGetAllocationGranularity", offsetof(dcpx_cuda_drv, granularity),
     0},
    {"cuMemGetAllocationPropertiesFromHandle",
     offsetof(dcpx_cuda_drv, props), 0},
    {"cuMemAddressReserve", offsetof(dcpx_cuda_drv, reserve), 0},
    {"cuMemAddressFree", offsetof(dcpx_cuda_drv, addr_free), 0},
    {"cuMemMap", offsetof(dcpx_cuda_drv, map), 0},
    {"cuMemUnmap", offsetof(dcpx_cuda_drv, unmap), 0},
    {"cuMemSetAccess", offsetof(dcpx_cuda_drv, set_access), 0},
    {"cuDeviceGetAttribute", offsetof(dcpx_cuda_drv, attr), 0},
    {"cuDeviceGetUuid", offsetof(dcpx_cuda_drv, uuid), 0},
    {"cuCtxGetCurrent", offsetof(dcpx_cuda_drv, ctx_get), 0},
    {"cuCtxSetCurrent", offsetof(dcpx_cuda_drv, ctx_set), 0},
    {"cuPointerGetAttributes", offsetof(dcpx_cuda_drv, ptr_attrs), 0},
    {"cuStreamIsCapturing", offsetof(dcpx_cuda_drv, stream_capturing), 0},
    {"cuMemsetD32Async", offsetof(dcpx_cuda_drv, memset32_async), 0},
    {"cuThreadExchangeStreamCaptureMode", offsetof(dcpx_cuda_drv, capture_mode),
     0},
    {"cuGetErrorString", offsetof(dcpx_cuda_drv, error_string), 1},
};

int dcpx__cuda_drv_load(dcpx_cuda_drv *d, const char **ret_missing) {
  for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
    void **fn = (void **)((char *)d + entries[i].off);
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    *fn = NULL;
    if (cudaGetDriverEntryPointByVersion(entries[i].sym, fn, 12000,
                                         cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess && *fn)
      continue;
    *fn = NULL;
    if (entries[i].optional)
      continue;
    if (ret_missing)
      *ret_missing = entries[i].sym;
    return DCPX_E_CUDA;
  }
  return 0;
}
