/* indexer_push.h - the plain C face of the example engine kernel
 * (examples/indexer_push.cu): a toy sparse-attention indexer that scores
 * q . k over this rank's KV in bf16 and selects each row's local top-N,
 * and pushes the list from its epilogue through include/dcpx/device.cuh.
 * The driver is examples/indexer_push_main.c.
 */
#ifndef DCPX_EXAMPLE_INDEXER_PUSH_H
#define DCPX_EXAMPLE_INDEXER_PUSH_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include <dcpx.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the kernel does after scoring row t into logits[t][0 .. row_end):
 *   SCORE  nothing more (then dcpx_push selects and pushes);
 *   SELECT its local top-N too, into sink when sink is not NULL (the
 *          benchmark's baseline: the selection without the push);
 *   LISTS  its local top-N as (values, indices) [rows][N], for
 *          dcpx_push_list;
 *   FUSED  its local top-N, pushed from the epilogue (dcpx_device). */
enum ix_mode { IX_SCORE, IX_SELECT, IX_LISTS, IX_FUSED };

typedef struct ix_args {
  uint32_t rows, len, dim;     /* rows of the call, KV length, head dim */
  const uint16_t *q;           /* [rows][dim] bf16 */
  const uint16_t *kv;          /* [len][dim] bf16: this rank's keys */
  const int32_t *row_ends;     /* [rows], <= len */
  uint16_t *logits;            /* [rows][len] bf16 (the merge reads them) */
  uint16_t *values;            /* LISTS: [rows][N] */
  int32_t *indices;            /* LISTS: [rows][N] */
  uint32_t *sink;              /* SELECT: [rows][row_words] or NULL */
} ix_args;

/* Raises the kernels' shared memory limit (once, outside capture). */
int ix_prepare(uint32_t len);

/* One launch of the indexer in `mode` (dev: dcpx_device_ctx's, used by
 * FUSED, and for N and row_words by every selecting mode). */
int ix_launch(enum ix_mode mode, const dcpx_device *dev, const ix_args *a,
              cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* DCPX_EXAMPLE_INDEXER_PUSH_H */
