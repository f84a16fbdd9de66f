/* Memory (included by deft.h): the device caching allocator's statistics and controls, pinned host memory. */
#ifndef DEFT_PUBLIC_MEMORY_H
#define DEFT_PUBLIC_MEMORY_H

#include "deft/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device memory: the caching allocator and what it can show (named as PyTorch names them) ---- */
typedef struct deft_memory_stat {
    int64_t current, peak, allocated, freed;   /* allocated/freed: running totals since the process started */
} deft_memory_stat;

typedef struct deft_memory_stats {
    deft_memory_stat allocated_bytes;   /* bytes handed out in blocks (rounded sizes) */
    deft_memory_stat reserved_bytes;    /* bytes held in segments from the device (cached included) */
    deft_memory_stat active_bytes;      /* bytes in blocks in use or waiting on a stream */
    deft_memory_stat requested_bytes;   /* bytes callers asked for, before rounding */
    deft_memory_stat allocation;        /* block counts */
    deft_memory_stat segment;           /* segment counts */
    int64_t num_alloc_retries;          /* allocations that had to free the cache and retry */
    int64_t num_ooms;                   /* allocations that failed after the retry */
    int64_t num_device_alloc;           /* segments taken from the device (cudaMalloc or the host's allocator) */
    int64_t num_device_free;            /* segments given back */
} deft_memory_stats;

deft_status deft_memory_stats_get(deft_device d, deft_memory_stats *out);
/* Peaks back to the current values. */
deft_status deft_memory_reset_peak(deft_device d);
/* Gives every unused cached segment back to the device. */
deft_status deft_memory_empty_cache(deft_device d);
/* Caps the bytes the allocator may reserve on d (like set_per_process_memory_fraction); 0 removes the cap. */
deft_status deft_memory_set_limit(deft_device d, size_t bytes);
/* A human table of the statistics, like torch.cuda.memory_summary(); file is a FILE* (NULL = stdout). */
deft_status deft_memory_summary(deft_device d, void *file);
/* Records alloc and free events (size, tag, time) for snapshots, keeping the last max_entries; 0 turns it off. */
deft_status deft_memory_record_history(size_t max_entries);
/* Writes every device's segments and blocks (with their states) and the recorded history as JSON. */
deft_status deft_memory_snapshot(const char *path);

/* ---- pinned (page-locked) host memory, cached ----
 * Blocks come from cached page-locked segments (cudaHostAlloc) so that host-to-device copies run at full speed and
 * asynchronously. A freed block is reused only once every stream recorded on it has passed that point (an event per
 * use), so a copy still in flight never sees its source overwritten. Without CUDA the blocks are ordinary host
 * memory (aligned to 4096) and the same caching and counters apply. */
deft_status deft_pinned_alloc(size_t bytes, void **out);
deft_status deft_pinned_free(void *ptr);          /* a double free or a foreign pointer is DEFT_ERR_INVALID */
/* Marks that work queued on `stream` (a cudaStream_t; NULL is the legacy default stream) uses the block: freeing it
 * then waits for that work before the block is handed out again (like Tensor.record_stream). */
deft_status deft_pinned_record_stream(void *ptr, void *stream);
int deft_pinned_is_page_locked(const void *ptr); /* 1 if ptr lies in a page-locked pinned block */
deft_status deft_pinned_stats(deft_memory_stats *out);
deft_status deft_pinned_empty_cache(void);        /* gives every unused segment back */

/* Everything cached goes back to the driver and the host: every device's unused segments, the pinned cache, and the
 * library scratch (cuBLAS, cuDNN) of streams that programs no longer own, after waiting for each GPU's work. Memory
 * in use (live programs, parameters) stays. Call it at the end of a program that checks for leaks
 * (compute-sanitizer --leak-check full, valgrind): what the caches still hold is reported otherwise. A GPU runtime
 * that never started is not started for this. */
deft_status deft_memory_release_all(void);

#ifdef __cplusplus
}
#endif
#endif
