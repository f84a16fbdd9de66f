/* The pinned (page-locked) host allocator: staging buffers for asynchronous host<->device copies, cached like
 * PyTorch's CachingHostAllocator.
 *
 * It is one more pool of the caching allocator, outside the device table, run by the same code
 * (deft_pool_alloc, deft_pool_free, deft_pool_record_stream in caching_allocator.c) under its own mutex. So its
 * rules are the device allocator's, and so are the meanings of its statistics:
 * - Requests are rounded up to 512 bytes; up to 1 MiB they are carved from 2 MiB segments (split down to 512-byte
 *   rests), from 1 to 10 MiB from 20 MiB segments, larger ones get a segment of their size rounded to 2 MiB; best
 *   fit, and a freed block merges with its free neighbours at once. Why these sizes for host memory: taking pages
 *   (cudaHostAlloc pins every page, a syscall and page-table work per call, milliseconds for some MiB, and it may
 *   synchronise the device) is what the cache exists to avoid, so segments are few and shared; and page-locked
 *   memory is taken from what the OS can swap, so waste matters too: 512-byte rounding loses < 512 bytes a small
 *   block and at most about 1 MiB of an unsplit large one, where PyTorch's power-of-two classes lose up to half.
 * - Segments are page-aligned (cudaHostAlloc gives whole pages; the fallback asks aligned_alloc for 4096), blocks
 *   512-byte aligned inside them.
 * - No stream owns host memory: every block carries the same private key (the address of deft_pinned_owner, which
 *   no stream handle can equal), so any freed block serves any later request, and every stream given to
 *   deft_pinned_record_stream, the legacy default stream (NULL) included, is waited for. A block freed with no
 *   recorded stream is reusable at once (as with free(), the caller says it is done with it). A block with
 *   recorded streams gets an event on each at the free and stays out of reuse (pending, counted in active_bytes)
 *   until all have completed; they are queried on later allocations, so a free never blocks the host. Only
 *   deft_pinned_empty_cache and the retry after a failed cudaHostAlloc wait for them, as the device pools do.
 * - When cudaHostAlloc refuses, every cached segment with nothing allocated is given back and the request tried
 *   once more; then DEFT_ERR_OOM says what was asked, what the host has and what the pool holds (allocated and
 *   cached). A segment larger than the host's physical memory is refused without asking (see deft_beyond_host).
 * - The backend is chosen at the first allocation (never at load time, so a CPU-only program does not start the
 *   CUDA runtime by linking this): page-locked memory from cudaHostAlloc when a GPU works; otherwise plain host
 *   memory aligned to 4096 with the same caching and counters, for which deft_pinned_is_page_locked says 0 and no
 *   event is ever waited for (without a GPU no stream can be reading it).
 * - The pool is not in memory snapshots or the history (their entries name a device); its counters are its own
 *   (deft_pinned_stats), apart from the CPU device pool's.
 * - At exit nothing is released, as with the device pools: by then the CUDA runtime may be shutting down, and a
 *   cudaFreeHost from an atexit handler can fail or hang. The pool is a static, so cached segments stay reachable
 *   (valgrind counts them "still reachable", not lost); deft_pinned_empty_cache gives them back earlier. */
#include <stdlib.h>

#include "caching_internal.h"
#include "device_internal.h"
#include "base.h"
#include "pinned_allocator.h"

#define DEFT_PINNED_PAGE ((size_t)4096)

/* ---- the two backends ---- */

/* Page-locked pages stay resident, so no host can pin more than its physical memory: such a segment is refused
 * without asking (cudaHostAlloc would take its time to find out, and a sanitizer's allocator aborts on a size that
 * large). The plain fallback refuses the same, so that both backends answer alike. */
static bool deft_beyond_host(size_t bytes) {
    size_t free_b = 0, total_b = 0;
    return deft_device_memory(deft_cpu(), &free_b, &total_b) == DEFT_OK && total_b > 0 && bytes > total_b;
}

/* Segment sizes are multiples of 2 MiB, hence of 4096, as aligned_alloc requires. */
static deft_status deft_plain_alloc(int index, size_t bytes, void **out) {
    (void)index;
    *out = deft_beyond_host(bytes) ? NULL : aligned_alloc(DEFT_PINNED_PAGE, bytes);
    return *out ? DEFT_OK : DEFT_ERR_OOM;
}

static deft_status deft_locked_alloc(int index, size_t bytes, void **out) {
    *out = NULL;
    return deft_beyond_host(bytes) ? DEFT_ERR_OOM : deft_pinned_host_alloc(index, bytes, out);
}

static void deft_plain_free(int index, void *ptr) {
    (void)index;
    free(ptr);
}

/* For the OOM message: pinned memory is host memory. */
static deft_status deft_host_memory(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    return deft_device_memory(deft_cpu(), free_bytes, total_bytes);
}

static const deft_raw_backend deft_plain_raw = {deft_plain_alloc, deft_plain_free, deft_host_memory};
static const deft_raw_backend deft_locked_raw = {deft_locked_alloc, deft_pinned_host_free, deft_host_memory};

/* Memory no GPU can reach is never read by a stream: nothing to wait for. */
static deft_status deft_plain_event_record(int index, void *stream, void **event) {
    (void)index, (void)stream;
    *event = NULL;
    return DEFT_OK;
}
static int deft_plain_event_query(int index, void *event) {
    (void)index, (void)event;
    return 1;
}
static void deft_plain_event_nothing(int index, void *event) { (void)index, (void)event; }

static const deft_caching_event_hooks deft_plain_events = {deft_plain_event_record, deft_plain_event_query,
                                                           deft_plain_event_nothing, deft_plain_event_nothing};

/* ---- the pool ---- */

static char deft_pinned_owner;   /* its address is the stream key of every block */
#define DEFT_PINNED_KEY ((void *)&deft_pinned_owner)

static deft_pool deft_pinned = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .device = {DEFT_CPU, 0},   /* what the raw backend and the events are passed (index 0), and ASan's poisoning */
    .rng = 0x2545F491u,
    .name = "pinned host memory",
    .empty_cache_call = "deft_pinned_empty_cache",
    .no_history = true,
};
static bool deft_pinned_page_locked;   /* the backend is cudaHostAlloc (set with p->raw, under the lock) */

static const deft_caching_event_hooks *deft_pinned_default_events(void) {
    return deft_pinned_page_locked ? deft_pinned_cuda_events() : &deft_plain_events;
}

/* Chooses the backend once, at the first allocation. Call locked. */
static void deft_pinned_ready(deft_pool *p) {
    if (p->raw) return;
    deft_pinned_page_locked = deft_cuda_count() > 0;
    p->raw = deft_pinned_page_locked ? &deft_locked_raw : &deft_plain_raw;
    if (!p->events) p->events = deft_pinned_default_events();   /* unless a test set its own */
    p->used = true;
}

/* ---- public ---- */

deft_status deft_pinned_alloc(size_t bytes, void **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "pinned_alloc: out is NULL");
    *out = NULL;
    if (bytes == 0) return DEFT_OK;
    deft_pool *p = &deft_pinned;
    pthread_mutex_lock(&p->mu);
    deft_pinned_ready(p);
    deft_status s = deft_pool_alloc(p, bytes, DEFT_PINNED_KEY, "", out);
    pthread_mutex_unlock(&p->mu);
    return s;
}

deft_status deft_pinned_free(void *ptr) {
    if (!ptr) return DEFT_OK;
    deft_pool *p = &deft_pinned;
    pthread_mutex_lock(&p->mu);
    deft_status s = deft_pool_free(p, ptr);
    pthread_mutex_unlock(&p->mu);
    return s;
}

deft_status deft_pinned_record_stream(void *ptr, void *stream) {
    deft_pool *p = &deft_pinned;
    pthread_mutex_lock(&p->mu);
    deft_status s = deft_pool_record_stream(p, ptr, stream);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* 1 when ptr lies in (at the start of or inside) a block handed out and not yet freed, of a page-locked pool. */
int deft_pinned_is_page_locked(const void *ptr) {
    deft_pool *p = &deft_pinned;
    uintptr_t a = (uintptr_t)ptr;
    const deft_block *found = NULL;
    pthread_mutex_lock(&p->mu);
    const deft_segment *seg = deft_pinned_page_locked && a ? p->segments : NULL;
    while (seg && (a < seg->base || a >= seg->base + seg->size)) seg = seg->next;
    for (const deft_block *b = seg ? seg->first : NULL; b && !found; b = b->next)
        if (a >= b->addr && a < b->addr + b->size) found = b;
    int locked = found && found->state == DEFT_BLOCK_ALLOCATED;
    pthread_mutex_unlock(&p->mu);
    return locked;
}

deft_status deft_pinned_stats(deft_memory_stats *out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "pinned_stats: out is NULL");
    deft_pool *p = &deft_pinned;
    pthread_mutex_lock(&p->mu);
    *out = p->stats;
    pthread_mutex_unlock(&p->mu);
    return DEFT_OK;
}

/* Waits for the events of blocks still used by streams (their blocks may complete a segment), then gives every
 * segment with nothing allocated back (cudaFreeHost, or free). */
deft_status deft_pinned_empty_cache(void) {
    deft_pool *p = &deft_pinned;
    pthread_mutex_lock(&p->mu);
    deft_pool_release_cached(p);
    pthread_mutex_unlock(&p->mu);
    return DEFT_OK;
}

/* ---- for tests ---- */

deft_status deft_pinned_check(void) {
    deft_pool *p = &deft_pinned;
    pthread_mutex_lock(&p->mu);
    deft_status s = deft_pool_check(p);
    pthread_mutex_unlock(&p->mu);
    return s;
}

deft_status deft_pinned_set_event_hooks(const deft_caching_event_hooks *hooks) {
    if (hooks && !(hooks->record && hooks->query && hooks->wait && hooks->destroy))
        return deft_set_error(DEFT_ERR_INVALID, "pinned_set_event_hooks: every hook must be set");
    deft_pool *p = &deft_pinned;
    pthread_mutex_lock(&p->mu);
    bool busy = p->n_pending > 0;
    if (!busy) p->events = hooks ? hooks : p->raw ? deft_pinned_default_events() : NULL;
    pthread_mutex_unlock(&p->mu);
    if (busy)
        return deft_set_error(DEFT_ERR_STATE, "pinned_set_event_hooks: blocks still wait on events of the old hooks");
    return DEFT_OK;
}
