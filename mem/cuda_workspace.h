/* Library scratch per device and stream (mem/cuda_workspace.cu says why). Callable from C. */
#ifndef DEFT_CUDA_WORKSPACE_H
#define DEFT_CUDA_WORKSPACE_H

#include <stddef.h>

#include "cuda_tuning.h"
#include "deft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A stream's cuBLAS and cuDNN scratch is as large as the largest workspace that the algorithms chosen for work on
 * that stream asked for, and never larger than its cap: cuda_tuning.h's DEFT_CUBLAS_WORKSPACE_BYTES and
 * DEFT_CUDNN_WORKSPACE_BYTES on a main stream. A program's side lane (passes/side_lane.h) runs weight gradients
 * beside the main stream, each stream with scratch of its own: smaller caps there (DEFT_CUDNN_SIDE_WORKSPACE_BYTES,
 * DEFT_CUBLAS_SIDE_WORKSPACE_BYTES) keep the second stream from adding much to the program's peak. Batch norm's fast
 * reductions (cuda_norm_fast.cu) take a fixed size: DEFT_NORM_COUNTERS per-column arrival counts, kept at zero
 * between launches, then DEFT_NORM_PARTIALS per-chunk partial sums. */
#define DEFT_NORM_WORKSPACE_BYTES ((size_t)DEFT_NORM_COUNTERS * 4 + (size_t)DEFT_NORM_PARTIALS * 16)

typedef enum deft_workspace_kind {
    DEFT_WORKSPACE_CUBLAS,   /* cuBLAS and cuBLASLt */
    DEFT_WORKSPACE_CUDNN,    /* cuDNN, and the columns of the convolutions run as products (cuda_conv_gemm.cu) */
    DEFT_WORKSPACE_NORM,     /* its counts are zeroed on the stream when it is first taken */
    DEFT_WORKSPACE_KINDS
} deft_workspace_kind;

/* The scratch of `kind` for work queued on `stream` (a cudaStream_t; NULL for the legacy stream) of cuda:dev, at its
 * cap's size (for DEFT_WORKSPACE_NORM, whose size is fixed). */
deft_status deft_stream_workspace(int dev, void *stream, deft_workspace_kind kind, void **out);
/* The most the stream's scratch of `kind` may hold: what library calls offer their algorithm choice. */
size_t deft_stream_workspace_cap(int dev, void *stream, deft_workspace_kind kind);
/* The stream's scratch of `kind`, grown first to `need` bytes (cut to the cap) where it holds less and may grow: the
 * stream is not capturing into a CUDA Graph, and no capture has taken this scratch (a graph holds its address, so
 * it is never given back while the stream lives). *out and *bytes say what the stream holds after (NULL and 0 for
 * nothing): less than `need` inside a capture (a stream first met in a capture holds nothing), where the caller
 * chooses again within *bytes. A growth outside a capture counts `need` as asked (deft_stream_workspace_asked). */
deft_status deft_stream_workspace_reserve(int dev, void *stream, deft_workspace_kind kind, size_t need, void **out,
                                          size_t *bytes);
/* Sets the cap of the stream's scratch of `kind` (the kind's default otherwise), before its first use:
 * DEFT_ERR_STATE when it holds more already. */
deft_status deft_stream_workspace_limit(int dev, void *stream, deft_workspace_kind kind, size_t bytes);
/* The scratch if the stream already has it, else NULL: nothing is allocated (for use inside a stream capture). */
void *deft_stream_workspace_existing(int dev, void *stream, deft_workspace_kind kind);
/* Bytes the stream's scratch of `kind` holds now (0 for none), and the largest need any growth outside a capture was
 * asked for (what the reports count, and what the tests check the first against). */
size_t deft_stream_workspace_held(int dev, void *stream, deft_workspace_kind kind);
size_t deft_stream_workspace_asked(int dev, void *stream, deft_workspace_kind kind);
/* A block of `bytes` for a measurement on `stream` (cuDNN's Find, which times algorithms in scratch up to the cap)
 * outside the stream's scratch, from the caching allocator (so the statistics' peak shows it); given back with
 * deft_stream_workspace_probe_end once the measurement has finished (Find synchronises). */
deft_status deft_stream_workspace_probe(int dev, void *stream, size_t bytes, void **out);
void deft_stream_workspace_probe_end(int dev, void *ptr);
/* Gives back the stream's scratch; the caller has waited for the stream's work. */
void deft_stream_workspaces_release(int dev, void *stream);

#ifdef __cplusplus
}
#endif
#endif
