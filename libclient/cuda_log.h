/* cuda_log.h - CUDA and NCCL failures, logged where they happen (internal,
 * cuda.c and nccl.c; common/log.h).
 *
 *   if (!CUDA_OK(cudaMalloc(&p, n))) return DCPX_E_NOMEM;
 *
 * CUDA_OK(call) is 1 when the call returned cudaSuccess; otherwise it logs
 * a WARN line with this file and line, the call's text and the CUDA error's
 * name and string, and is 0. DCPX_KLOG(r, what) does the same for a kernel
 * launcher (kernels/dcpx_kernels.h) that returned r < 0: its DCPX code,
 * and the thread's last CUDA error (cudaPeekAtLastError, which leaves it
 * in place). Nothing is called on success, so the call path pays one
 * compare. */
#ifndef DCPX_LIBCLIENT_CUDA_LOG_H
#define DCPX_LIBCLIENT_CUDA_LOG_H

#include <cuda_runtime_api.h>

#include "dcpx.h"
#include "log.h"

static inline int dcpx__cuda_ok(cudaError_t e, const char *what,
                                const char *file, int line) {
  if (__builtin_expect(e == cudaSuccess, 1))
    return 1;
  if (dcpx__log_on(DCPX__LOG_WARN))
    dcpx__log(DCPX__LOG_WARN, file, line, "%s failed: %s (%s)", what,
              cudaGetErrorString(e), cudaGetErrorName(e));
  return 0;
}
#define CUDA_OK(call) dcpx__cuda_ok((call), #call, __FILE__, __LINE__)

static inline int dcpx__klog(int r, const char *what, const char *file,
                             int line) {
  if (r < 0 && dcpx__log_on(DCPX__LOG_WARN)) {
    cudaError_t e = cudaPeekAtLastError();
    dcpx__log(DCPX__LOG_WARN, file, line, "%s failed: %s; last CUDA error: %s",
              what, dcpx_strerror(r),
              e == cudaSuccess ? "none" : cudaGetErrorString(e));
  }
  return r;
}
#define DCPX_KLOG(r, what) dcpx__klog((r), (what), __FILE__, __LINE__)

#endif /* DCPX_LIBCLIENT_CUDA_LOG_H */
