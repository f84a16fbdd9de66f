/* Library scratch per device and stream (mem/cuda_workspace.cu says why). Callable from C. */
#ifndef DEFT_CUDA_WORKSPACE_H
#define DEFT_CUDA_WORKSPACE_H

#include <stddef.h>

#include "cuda_tuning.h"
#include "deft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sizes are cuda_tuning.h's: DEFT_CUBLAS_WORKSPACE_BYTES and DEFT_CUDNN_WORKSPACE_BYTES for a main stream. A
 * program's side lane (passes/side_lane.h) runs weight gradients beside the main stream, each stream with scratch
 * of its own: smaller scratch there (DEFT_CUDNN_SIDE_WORKSPACE_BYTES, DEFT_CUBLAS_SIDE_WORKSPACE_BYTES) keeps the
 * second stream from adding 96 MiB to the program's peak. Batch norm's fast reductions (cuda_norm_fast.cu):
 * DEFT_NORM_COUNTERS per-column arrival counts, kept at zero between launches, then DEFT_NORM_PARTIALS per-chunk
 * partial sums. */
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
/* Sets the size of the stream's scratch of `kind` (the kind's default otherwise), before its first use:
 * DEFT_ERR_STATE when it is allocated already at another size. Callers that size their work by it (cuDNN's choice of
 * algorithm) read it through deft_stream_workspace_sized. */
deft_status deft_stream_workspace_limit(int dev, void *stream, deft_workspace_kind kind, size_t bytes);
/* The scratch if the stream already has it, else NULL: nothing is allocated (for use inside a stream capture). */
void *deft_stream_workspace_existing(int dev, void *stream, deft_workspace_kind kind);
/* Gives back the stream's scratch; the caller has waited for the stream's work. */
void deft_stream_workspaces_release(int dev, void *stream);

#ifdef __cplusplus
}
#endif
#endif
