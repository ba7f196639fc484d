/* cuda_drv.h - the CUDA driver entry points dcpx uses (the VMM calls), one
 * table for libdcpx (libclient/cuda.c) and dcpxd (daemon/dcpxd-mem-cuda.c).
 *
 * They come through cudaGetDriverEntryPointByVersion (CUDA 12.0 ABI), not
 * by linking libcuda: the binaries link the CUDA runtime only, so they
 * start, and serve host-backend groups, on machines without an NVIDIA
 * driver; a CUDA group there gets DCPX_E_CUDA. Compiled only with CUDA. */
#ifndef DCPX_CUDA_DRV_H
#define DCPX_CUDA_DRV_H

#include <cuda.h>

typedef struct dcpx_cuda_drv {
  CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t,
                         const CUmemAllocationProp *, unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*export_fd)(void *, CUmemGenericAllocationHandle,
                        CUmemAllocationHandleType, unsigned long long);
  CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *,
                        CUmemAllocationHandleType);
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                          CUmemAllocationGranularity_flags);
  CUresult (*props)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                      unsigned long long);
  CUresult (*addr_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *,
                         size_t);
  CUresult (*attr)(int *, CUdevice_attribute, CUdevice);
  CUresult (*uuid)(CUuuid *, CUdevice); /* cuDeviceGetUuid */
  CUresult (*ctx_get)(CUcontext *); /* cuCtxGetCurrent */
  CUresult (*ctx_set)(CUcontext);   /* cuCtxSetCurrent */
  CUresult (*ptr_attrs)(unsigned int, CUpointer_attribute *, void **,
                        CUdeviceptr); /* cuPointerGetAttributes */
  /* libdcpx's best-effort stream work after a refused call: driver calls
   * leave the runtime's last error (the engine's) as it was */
  CUresult (*stream_capturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*memset32_async)(CUdeviceptr, unsigned int, size_t, CUstream);
  CUresult (*capture_mode)(CUstreamCaptureMode *);
  CUresult (*error_string)(CUresult, const char **); /* NULL if absent */
} dcpx_cuda_drv;

/* Fills d. 0, or DCPX_E_CUDA with *ret_missing naming the first entry
 * point the runtime could not give (cuGetErrorString is optional: it only
 * words log lines). */
__attribute__((visibility("hidden"))) int
dcpx__cuda_drv_load(dcpx_cuda_drv *d, const char **ret_missing);

#endif /* DCPX_CUDA_DRV_H */
