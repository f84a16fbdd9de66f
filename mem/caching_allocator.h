/* The caching device allocator: everything the memory plan does not place (arenas, persistent tensors, scratch)
 * comes from here, on the CPU and on every GPU alike.
 *
 * Memory is taken from the device in segments (aligned_alloc on the CPU, cudaMalloc on a GPU), split into blocks,
 * and kept after a free so that the next request of a similar size costs no device call. The rules follow PyTorch's
 * CUDACachingAllocator (sizes, pools, splitting, stream-ordered reuse, the retry after freeing the cache), so that
 * its statistics mean what PyTorch users expect; caching_allocator.c explains each rule.
 *
 * The public side (statistics, peaks, empty_cache, the limit, summary, history, snapshot) is declared in deft.h. */
#ifndef DEFT_CACHING_ALLOCATOR_H
#define DEFT_CACHING_ALLOCATOR_H

#include "deft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A block of at least `bytes` on d for work queued on `stream` (a cudaStream_t; NULL is the default stream; on the
 * CPU any handle works and only keys reuse). The block is reused only by later requests on the same stream, so no
 * synchronisation is needed between a free and the next use. `tag` (may be NULL) names the caller or graph node
 * in snapshots and history. bytes == 0 gives NULL and DEFT_OK. On failure *out is NULL and the status is
 * DEFT_ERR_OOM (with a message that says what was asked, free, allocated and cached), or a device error. */
deft_status deft_caching_alloc(deft_device d, size_t bytes, void *stream, const char *tag, void **out);

/* Gives a block back to the cache. NULL is a no-op. A pointer this allocator did not hand out on d, a pointer
 * inside a block, or a second free is DEFT_ERR_INVALID with a message, and changes nothing. */
deft_status deft_caching_free(deft_device d, void *ptr);

/* Says that `stream` also uses the block at ptr (as torch's Tensor.record_stream): when the block is freed, it is
 * not reused until the work queued on `stream` by then has finished. On the CPU that is at once. */
deft_status deft_caching_record_stream(deft_device d, void *ptr, void *stream);

/* How the allocator learns that a stream has passed a point, without callbacks: an event recorded at the free and
 * queried on later allocator calls. Each device type has a default (CUDA events; nothing to wait for on the CPU);
 * tests swap in their own to see blocks that wait. */
typedef struct deft_caching_event_hooks {
    /* Marks the current end of `stream`'s work. *event = NULL means there is nothing to wait for. */
    deft_status (*record)(int index, void *stream, void **event);
    int (*query)(int index, void *event);      /* 1 when the work before the event is done, 0 while it is not */
    void (*wait)(int index, void *event);      /* blocks until it is done */
    void (*destroy)(int index, void *event);
} deft_caching_event_hooks;

/* Replaces the event hooks of every pool of `type` (NULL restores the default). DEFT_ERR_STATE while any block of
 * that type is waiting on an event recorded with the old hooks. */
deft_status deft_caching_set_event_hooks(deft_device_type type, const deft_caching_event_hooks *hooks);

/* Checks every invariant of d's pool (blocks tile their segments, free neighbours are merged, the free trees and
 * the live map hold exactly the free and the allocated blocks, the statistics match the blocks); DEFT_ERR_STATE
 * with the first broken one. For tests: it walks everything under the pool's lock. */
deft_status deft_caching_check(deft_device d);

/* The CUDA events behind the default hooks of CUDA pools (caching_events_cuda.c; caching_events_nocuda.c without
 * CUDA, where no CUDA pool can be used). */
const deft_caching_event_hooks *deft_caching_cuda_events(void);

#ifdef __cplusplus
}
#endif
#endif
