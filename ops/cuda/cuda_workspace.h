/* Library scratch per device and stream (ops/cuda/cuda_workspace.cu says why). Callable from C. */
#ifndef DEFT_CUDA_WORKSPACE_H
#define DEFT_CUDA_WORKSPACE_H

#include <stddef.h>

#include "deft.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DEFT_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define DEFT_CUDNN_WORKSPACE_BYTES ((size_t)64 << 20)
/* Batch norm's fast reductions (cuda_norm_fast.cu): per-column arrival counts, kept at zero between launches, then
 * the per-chunk partial sums. */
#define DEFT_NORM_COUNTERS 65536
#define DEFT_NORM_PARTIALS 229376
#define DEFT_NORM_WORKSPACE_BYTES ((size_t)DEFT_NORM_COUNTERS * 4 + (size_t)DEFT_NORM_PARTIALS * 16)

typedef enum deft_workspace_kind {
    DEFT_WORKSPACE_CUBLAS,   /* cuBLAS and cuBLASLt */
    DEFT_WORKSPACE_CUDNN,
    DEFT_WORKSPACE_NORM,     /* its counts are zeroed on the stream when it is first taken */
    DEFT_WORKSPACE_KINDS
} deft_workspace_kind;

/* The scratch of `kind` for work queued on `stream` (a cudaStream_t; NULL for the legacy stream) of cuda:dev. */
deft_status deft_stream_workspace(int dev, void *stream, deft_workspace_kind kind, void **out);
/* As deft_stream_workspace, but a stream capturing into a CUDA Graph that has no scratch yet (never run eagerly)
 * gets none, NULL and *bytes = 0, rather than an allocation no capture may make: the call then runs without. */
deft_status deft_stream_workspace_sized(int dev, void *stream, deft_workspace_kind kind, void **out, size_t *bytes);
/* The scratch if the stream already has it, else NULL: nothing is allocated (for use inside a stream capture). */
void *deft_stream_workspace_existing(int dev, void *stream, deft_workspace_kind kind);
/* Gives back the stream's scratch; the caller has waited for the stream's work. */
void deft_stream_workspaces_release(int dev, void *stream);

#ifdef __cplusplus
}
#endif
#endif
