/* notready.cu - does a query that answers cudaErrorNotReady leave that
 * answer as the thread's last runtime error? libdcpx polls streams and
 * events with cudaStreamQuery / cudaEventQuery on the engine's thread
 * (cuda_sync in dcpx_recover; set_voided in an NCCL abort); an engine
 * that checks cudaGetLastError() after our call must not find our
 * NotReady there, nor lose its own pending error.
 *   nvcc -o notready notready.cu && ./notready */
#include <stdio.h>
#include <cuda_runtime.h>

__global__ void spin(unsigned long long ns) {
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > ns)
      break;
  }
}

static int probe(const char *what, int pending) {
  cudaStream_t s;
  cudaEvent_t ev;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  (void)cudaGetLastError();
  if (pending) { /* the engine's own error, left pending */
    void *p = NULL;
    if (cudaMalloc(&p, (size_t)1 << 60) == cudaSuccess)
      cudaFree(p);
  }
  spin<<<1, 1, 0, s>>>(200000000ull); /* 200 ms */
  cudaEventRecord(ev, s);
  const cudaError_t q1 = cudaStreamQuery(s), q2 = cudaEventQuery(ev);
  const cudaError_t last = cudaGetLastError();
  printf("%s: cudaStreamQuery %s, cudaEventQuery %s, then cudaGetLastError "
         "%s\n", what, cudaGetErrorName(q1), cudaGetErrorName(q2),
         cudaGetErrorName(last));
  cudaStreamSynchronize(s);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  const cudaError_t want = pending ? cudaErrorMemoryAllocation : cudaSuccess;
  return q1 == cudaErrorNotReady && q2 == cudaErrorNotReady && last == want;
}

int main(void) {
  int ok = probe("no pending error", 0);
  ok &= probe("a pending cudaErrorMemoryAllocation", 1);
  printf("notready: %s\n", ok ? "queries leave the last error alone"
                              : "a query changed the last error");
  return ok ? 0 : 1;
}
