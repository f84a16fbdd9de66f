/* The pinned (page-locked) host allocator, internal side: hooks for tests, and the backend that the CUDA build
 * (pinned_host_cuda.c) or the CPU-only build (pinned_host_nocuda.c) provides. The public calls (deft_pinned_alloc,
 * deft_pinned_free, deft_pinned_record_stream, deft_pinned_is_page_locked, deft_pinned_stats,
 * deft_pinned_empty_cache) are declared in deft.h and explained in pinned_allocator.c. */
#ifndef DEFT_PINNED_ALLOCATOR_H
#define DEFT_PINNED_ALLOCATOR_H

#include "caching_allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For tests: every invariant of the pinned pool (as deft_caching_check does for a device's pool); DEFT_ERR_STATE
 * with the first broken one. */
deft_status deft_pinned_check(void);

/* For tests: replaces the events that say when a stream has passed the uses of a freed block; NULL restores the
 * default (CUDA events when the pool is page-locked, nothing to wait for otherwise). DEFT_ERR_STATE while a block
 * still waits on an event of the old hooks. */
deft_status deft_pinned_set_event_hooks(const deft_caching_event_hooks *hooks);

/* ---- the backend (pinned_host_cuda.c; pinned_host_nocuda.c without CUDA, where none of it is ever chosen) ---- */

/* A page-locked segment from cudaHostAlloc(cudaHostAllocDefault). DEFT_ERR_OOM without a message when CUDA has no
 * page-locked memory to give (the caller frees its cache, retries, then reports); any other failure is
 * DEFT_ERR_RUNTIME with a message. `index` is unused (the raw backend's signature). */
deft_status deft_pinned_host_alloc(int index, size_t bytes, void **out);
void deft_pinned_host_free(int index, void *ptr);

/* Events for streams of any device: each is created on the device of the stream it is recorded on (the calling
 * thread's current device for NULL, cudaStreamLegacy and cudaStreamPerThread). */
const deft_caching_event_hooks *deft_pinned_cuda_events(void);

#ifdef __cplusplus
}
#endif
#endif
