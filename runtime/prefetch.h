/* Inputs fed by asynchronous copies from pinned host memory into a second slot while the current step computes
 * (runtime/prefetch.c), and the CUDA calls it needs (runtime/prefetch_cuda.c; prefetch_nocuda.c without CUDA). */
#ifndef DEFT_PREFETCH_H
#define DEFT_PREFETCH_H

#include "graph_internal.h"

struct deft_program;
typedef struct deft_prefetch deft_prefetch;   /* a program's prefetch state (runtime/prefetch.c) */

/* DEFT_OK when `input` is an input of p as compiled and host/bytes fit it; `what` names the caller. */
deft_status deft_feed_check(const struct deft_program *p, const deft_tensor *input, const void *host, size_t bytes,
                            const char *what);

/* Before a synchronous feed of `input`: a batch fed asynchronously but not yet run is dropped (the later feed wins),
 * and any copy still writing the slot the feed overwrites is waited for, as is the last run when the input is not on
 * lane 0's GPU (runtime/program_lanes.h). */
deft_status deft_prefetch_before_feed(struct deft_program *p, const deft_tensor *input);
/* Around a run on the program's stream: before it, inputs fed asynchronously switch to the slot their copy filled
 * and the stream waits for those copies (no host sync), and p->gpu->key names the slots; after it, each slot read
 * gets an event, so that the next copy into it waits for this step. No-ops until feed_async was first used. */
deft_status deft_prefetch_before_run(struct deft_program *p);
deft_status deft_prefetch_after_run(struct deft_program *p);
/* Waits for copies in flight, frees the second slots and the events. Before the inputs' slots are freed. */
void deft_prefetch_free(struct deft_program *p);

/* A fence on the copy stream of p's GPU (an event recorded after every copy queued so far), for the loader to know
 * when a pinned batch may be refilled. *event is created on first use and reused; *device says where it lives.
 * Programs that do not run on one GPU's stream copy synchronously: *recorded = 0 and nothing is to be waited for. */
deft_status deft_prefetch_fence(struct deft_program *p, void **event, int *device, int *recorded);

/* ---- the CUDA calls (runtime/prefetch_cuda.c; prefetch_nocuda.c answers DEFT_ERR_NO_CUDA) ---- */
/* The copy stream of a GPU: non-blocking, shared by every program on it and never destroyed, so that the pinned
 * allocator may record it on a block (deft_pinned_record_stream) that is freed after the program. */
deft_status deft_prefetch_cuda_copy_stream(int device, void **stream);
deft_status deft_prefetch_cuda_event_new(int device, void **event);
void deft_prefetch_cuda_event_free(int device, void *event);
deft_status deft_prefetch_cuda_record(int device, void *event, void *stream);
deft_status deft_prefetch_cuda_stream_wait(int device, void *stream, void *event);
deft_status deft_prefetch_cuda_event_sync(int device, void *event);
/* 1 when the work before the event is done, 0 when not yet; a failure is DEFT_ERR_RUNTIME through *status. */
int deft_prefetch_cuda_event_done(int device, void *event, deft_status *status);
deft_status deft_prefetch_cuda_copy_h2d(int device, void *dst, const void *src, size_t bytes, void *stream);
/* 1 when host memory is page-locked as CUDA sees it (cudaHostAlloc, cudaHostRegister). */
int deft_prefetch_cuda_host_is_pinned(const void *host);

#endif
