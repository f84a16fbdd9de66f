/* The caching allocator: pools, segments, blocks, and the rules that decide which block serves a request.
 *
 * The rules are PyTorch's (c10/cuda/CUDACachingAllocator.cpp), so that its statistics, and the intuitions of people
 * who have tuned PyTorch's memory, carry over:
 * - Every request is rounded up to a multiple of 512 bytes. That keeps every block 512-byte aligned inside a
 *   256-byte aligned segment (vector loads, cuBLAS and cuDNN want >= 256), and bounds the sizes a block can have so
 *   that freed blocks fit later requests; the waste is < 512 bytes a block.
 * - Requests up to 1 MiB come from the small pool, carved from 2 MiB segments; larger ones from the large pool.
 *   Small, short-lived tensors (biases, norms, scalars) then never fragment the segments that big activations need,
 *   and one 2 MiB device call serves up to 4096 small blocks.
 * - A large request below 10 MiB gets a 20 MiB segment (several mid-size tensors share one device call); from
 *   10 MiB on, the request rounded up to 2 MiB (a huge segment is not worth padding). When the 20 MiB segment does
 *   not fit (a device that is nearly full, or the limit), the request rounded to 2 MiB is tried before giving up:
 *   the padding is an optimisation and must never be the reason an allocation fails (PyTorch lacks this fallback).
 * - The free block chosen is the smallest that fits (best fit, ties to the lowest address), from the segment's
 *   stream only. A block is split when the rest is worth keeping: >= 512 bytes in the small pool, > 1 MiB in the
 *   large pool, so that large segments do not decay into slivers no large request can use.
 * - A freed block merges at once with free neighbours in its segment, so that a segment whose blocks are all free
 *   is one block again and can be given back by empty_cache.
 * - Stream order: a block is reused only by requests on the stream it was allocated on. Work on one stream runs in
 *   order, so a block freed (in program order) after its last kernel was queued may be handed to the next kernel on
 *   that stream without waiting. A block used by other streams too (deft_caching_record_stream) waits, after its
 *   free, for events recorded on those streams; the events are polled on later allocations (no callbacks, no
 *   threads), and waited for before the cache is released.
 * - When the device (or the limit) refuses a segment, every cached segment with nothing allocated is given back and
 *   the request is tried once more (num_alloc_retries counts those retries; none is made, and none counted, when the
 *   cache held nothing to give back). If it still fails, num_ooms counts it and the caller gets DEFT_ERR_OOM with
 *   what was asked, what the device has, what deft holds and what to try.
 * Each pool (one per device) has one mutex; no call holds two pool mutexes at once, except
 * deft_caching_set_event_hooks, which takes them in index order.
 * The pinned host allocator (pinned_allocator.c) is one more pool, outside the device table, run by the same
 * deft_pool_alloc, deft_pool_free and deft_pool_record_stream under its own mutex. */
#include <stdlib.h>
#include <string.h>

#include "caching_internal.h"
#include "device_internal.h"
#include "base.h"

#define DEFT_MIN_BLOCK ((size_t)512)
#define DEFT_SMALL_SIZE ((size_t)1 << 20)
#define DEFT_SMALL_BUFFER ((size_t)2 << 20)
#define DEFT_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define DEFT_LARGE_BUFFER ((size_t)20 << 20)
#define DEFT_ROUND_LARGE ((size_t)2 << 20)
#define DEFT_CPU_ALIGN ((size_t)256)
/* Larger requests cannot be rounded without overflow; no device has that much anyway. */
#define DEFT_MAX_REQUEST (SIZE_MAX / 4)

/* Under AddressSanitizer, cached CPU memory is poisoned while no caller owns it, so a use after free or an overrun
 * into a neighbouring block is still caught, as it was when every tensor had its own aligned_alloc. */
#if defined(__SANITIZE_ADDRESS__)
#define DEFT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DEFT_ASAN 1
#endif
#endif
#ifdef DEFT_ASAN
#include <sanitizer/asan_interface.h>
#endif

static void deft_poison(const deft_pool *p, uintptr_t addr, size_t n, bool poison) {
#ifdef DEFT_ASAN
    if (p->device.type != DEFT_CPU || n == 0) return;
    if (poison) __asan_poison_memory_region((void *)addr, n);
    else __asan_unpoison_memory_region((void *)addr, n);
#else
    (void)p, (void)addr, (void)n, (void)poison;
#endif
}

/* ---- the raw side: where segments come from ---- */

static deft_status deft_cpu_raw_alloc(int index, size_t bytes, void **out) {
    (void)index;
    *out = aligned_alloc(DEFT_CPU_ALIGN, bytes);   /* bytes is a multiple of 512, as aligned_alloc requires */
    return *out ? DEFT_OK : DEFT_ERR_OOM;
}

static void deft_cpu_raw_free(int index, void *ptr) {
    (void)index;
    free(ptr);
}

static deft_status deft_cpu_raw_memory(int index, size_t *free_bytes, size_t *total_bytes) {
    (void)index;
    return deft_device_memory(deft_cpu(), free_bytes, total_bytes);
}

static const deft_raw_backend deft_cpu_raw = {deft_cpu_raw_alloc, deft_cpu_raw_free, deft_cpu_raw_memory};
static const deft_raw_backend deft_cuda_raw = {deft_cuda_alloc, deft_cuda_free, deft_cuda_memory};

/* The CPU has no streams: work is done when the call that queued it returns, so nothing is ever waited for. */
static deft_status deft_cpu_event_record(int index, void *stream, void **event) {
    (void)index, (void)stream;
    *event = NULL;
    return DEFT_OK;
}
static int deft_cpu_event_query(int index, void *event) {
    (void)index, (void)event;
    return 1;
}
static void deft_cpu_event_nothing(int index, void *event) { (void)index, (void)event; }

static const deft_caching_event_hooks deft_cpu_events = {deft_cpu_event_record, deft_cpu_event_query,
                                                         deft_cpu_event_nothing, deft_cpu_event_nothing};

/* ---- pools ---- */

#define DEFT_POOL_COUNT (1 + DEFT_CACHING_MAX_CUDA)
static deft_pool deft_pools[DEFT_POOL_COUNT];
static pthread_once_t deft_pools_once = PTHREAD_ONCE_INIT;

static const deft_caching_event_hooks *deft_default_events(deft_device_type type) {
    return type == DEFT_CPU ? &deft_cpu_events : deft_caching_cuda_events();
}

static void deft_pools_init(void) {
    for (int i = 0; i < DEFT_POOL_COUNT; i++) {
        deft_pool *p = &deft_pools[i];
        pthread_mutex_init(&p->mu, NULL);
        p->device = i == 0 ? deft_cpu() : deft_cuda(i - 1);
        p->raw = i == 0 ? &deft_cpu_raw : &deft_cuda_raw;
        p->events = deft_default_events(p->device.type);
        p->rng = 0x9E3779B9u ^ (uint32_t)i;   /* any nonzero seed: priorities only need to look random */
    }
}

int deft_pool_count(void) { return DEFT_POOL_COUNT; }

deft_pool *deft_pool_at(int i) {
    pthread_once(&deft_pools_once, deft_pools_init);
    return &deft_pools[i];
}

deft_status deft_pool_of(deft_device d, deft_pool **out) {
    *out = NULL;
    deft_status s = deft_device_check(d);
    if (s != DEFT_OK) return s;
    if (d.type == DEFT_CUDA && d.index >= DEFT_CACHING_MAX_CUDA)
        return deft_set_error(DEFT_ERR_DEVICE, "cuda:%d: the caching allocator serves cuda:0 to cuda:%d", d.index,
                              DEFT_CACHING_MAX_CUDA - 1);
    *out = deft_pool_at(d.type == DEFT_CPU ? 0 : 1 + d.index);
    return DEFT_OK;
}

static uint32_t deft_pool_prio(deft_pool *p) {
    uint32_t x = p->rng;   /* xorshift32 */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return p->rng = x;
}

static deft_block **deft_pool_tree(deft_pool *p, const deft_segment *seg) {
    return seg->small ? &p->free_small : &p->free_large;
}

static const char *deft_pool_name(const deft_pool *p, char *buf, size_t n) {
    if (p->name) {
        snprintf(buf, n, "%s", p->name);
        return buf;
    }
    return deft_device_str(p->device, buf, n);
}

static void deft_pool_history(const deft_pool *p, deft_history_action action, uintptr_t addr, size_t size,
                              void *stream, const char *tag) {
    if (!p->no_history) deft_history_add(action, p->device, addr, size, stream, tag);
}

/* One spare block struct is kept, so that the split/merge churn of a steady loop does no malloc. */
static deft_block *deft_pool_take_spare(deft_pool *p) {
    deft_block *b = p->spare;
    p->spare = NULL;
    return b ? b : calloc(1, sizeof *b);
}

static void deft_pool_recycle(deft_pool *p, deft_block *b) {
    free(b->uses);
    if (p->spare) {
        free(b);
        return;
    }
    memset(b, 0, sizeof *b);
    p->spare = b;
}

/* ---- sizes ---- */

static size_t deft_round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

static size_t deft_round_size(size_t bytes) {
    return bytes < DEFT_MIN_BLOCK ? DEFT_MIN_BLOCK : deft_round_up(bytes, DEFT_MIN_BLOCK);
}

static bool deft_is_small(size_t size) { return size <= DEFT_SMALL_SIZE; }

static size_t deft_segment_size(size_t size) {
    if (deft_is_small(size)) return DEFT_SMALL_BUFFER;
    if (size < DEFT_MIN_LARGE_ALLOC) return DEFT_LARGE_BUFFER;
    return deft_round_up(size, DEFT_ROUND_LARGE);
}

static bool deft_should_split(const deft_block *b, size_t size) {
    size_t rest = b->size - size;
    return b->segment->small ? rest >= DEFT_MIN_BLOCK : rest > DEFT_SMALL_SIZE;
}

/* ---- segments ---- */

/* DEFT_ERR_OOM without a message when the limit or the device refuses (the caller may retry and then reports);
 * any other error from the device is returned with its message. */
static deft_status deft_segment_new(deft_pool *p, size_t size, bool small, void *stream, deft_block **out) {
    if (p->limit && (size_t)p->stats.reserved_bytes.current + size > p->limit) return DEFT_ERR_OOM;
    deft_segment *seg = calloc(1, sizeof *seg);
    deft_block *b = deft_pool_take_spare(p);
    void *mem = NULL;
    deft_status s = seg && b ? p->raw->alloc(p->device.index, size, &mem) : DEFT_ERR_OOM;
    if (s != DEFT_OK) {
        free(seg);
        if (b) deft_pool_recycle(p, b);
        return s;
    }
    *seg = (deft_segment){.base = (uintptr_t)mem, .size = size, .stream = stream, .small = small, .first = b,
                          .next = p->segments};
    if (p->segments) p->segments->prev = seg;
    p->segments = seg;
    *b = (deft_block){.addr = seg->base, .size = size, .stream = stream, .segment = seg, .prio = deft_pool_prio(p)};
    deft_stat_add(&p->stats.segment, 1);
    deft_stat_add(&p->stats.reserved_bytes, (int64_t)size);
    p->stats.num_device_alloc++;
    deft_poison(p, seg->base, size, true);
    deft_pool_history(p, DEFT_HIST_SEGMENT_ALLOC, seg->base, size, stream, NULL);
    *out = b;
    return DEFT_OK;
}

/* Gives a segment that is one free block back to the device. */
static void deft_segment_release(deft_pool *p, deft_segment *seg) {
    deft_block *b = seg->first;
    deft_tree_remove(deft_pool_tree(p, seg), b);
    if (seg->prev) seg->prev->next = seg->next;
    else p->segments = seg->next;
    if (seg->next) seg->next->prev = seg->prev;
    deft_poison(p, seg->base, seg->size, false);
    p->raw->free(p->device.index, (void *)seg->base);
    deft_stat_add(&p->stats.segment, -1);
    deft_stat_add(&p->stats.reserved_bytes, -(int64_t)seg->size);
    p->stats.num_device_free++;
    deft_pool_history(p, DEFT_HIST_SEGMENT_FREE, seg->base, seg->size, seg->stream, NULL);
    deft_pool_recycle(p, b);
    free(seg);
}

/* The preferred segment size, then the least that serves the request (see the rules above). */
static deft_status deft_segment_try(deft_pool *p, size_t size, void *stream, deft_block **out) {
    bool small = deft_is_small(size);
    size_t want = deft_segment_size(size), least = small ? want : deft_round_up(size, DEFT_ROUND_LARGE);
    deft_status s = deft_segment_new(p, want, small, stream, out);
    if (s == DEFT_ERR_OOM && least != want) s = deft_segment_new(p, least, small, stream, out);
    return s;
}

static deft_status deft_pool_grow(deft_pool *p, size_t size, void *stream, deft_block **out) {
    deft_status s = deft_segment_try(p, size, stream, out);
    if (s != DEFT_ERR_OOM || deft_pool_release_cached(p) == 0) return s;
    p->stats.num_alloc_retries++;
    return deft_segment_try(p, size, stream, out);
}

/* ---- blocks ---- */

/* Cuts b to `size`; the rest becomes a free block right after it. */
static void deft_block_split(deft_pool *p, deft_block *b, size_t size, deft_block *rest) {
    *rest = (deft_block){.addr = b->addr + size, .size = b->size - size, .stream = b->stream,
                         .segment = b->segment, .prev = b, .next = b->next, .prio = deft_pool_prio(p)};
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    deft_tree_insert(deft_pool_tree(p, b->segment), rest);
}

/* b swallows its next neighbour. */
static void deft_block_absorb_next(deft_pool *p, deft_block *b) {
    deft_block *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    deft_pool_recycle(p, n);
}

/* Makes a block free for reuse: merges it with free neighbours and puts the result in its tree. */
static void deft_block_release(deft_pool *p, deft_block *b) {
    deft_block **tree = deft_pool_tree(p, b->segment);
    deft_block *prev = b->prev, *next = b->next;
    deft_stat_add(&p->stats.active_bytes, -(int64_t)b->size);
    b->state = DEFT_BLOCK_FREE;
    b->requested = 0;
    b->tag[0] = '\0';
    if (prev && prev->state == DEFT_BLOCK_FREE) {
        deft_tree_remove(tree, prev);
        deft_block_absorb_next(p, prev);
        b = prev;
    }
    if (next && next->state == DEFT_BLOCK_FREE) {
        deft_tree_remove(tree, next);
        deft_block_absorb_next(p, b);
    }
    deft_tree_insert(tree, b);
}

static void deft_block_hand_out(deft_pool *p, deft_block *b, size_t bytes, const char *tag) {
    b->state = DEFT_BLOCK_ALLOCATED;
    b->requested = bytes;
    snprintf(b->tag, sizeof b->tag, "%s", tag);
    deft_map_put(&p->live, b);
    deft_stat_add(&p->stats.allocation, 1);
    deft_stat_add(&p->stats.allocated_bytes, (int64_t)b->size);
    deft_stat_add(&p->stats.active_bytes, (int64_t)b->size);
    deft_stat_add(&p->stats.requested_bytes, (int64_t)bytes);
    /* What the caller may touch: its bytes rounded to 64, as when each tensor had its own aligned_alloc(64). */
    deft_poison(p, b->addr, deft_round_up(bytes, 64), false);
    deft_pool_history(p, DEFT_HIST_ALLOC, b->addr, b->size, b->stream, b->tag);
}

/* ---- events: blocks freed while other streams may still use them ---- */

static void deft_event_done(deft_pool *p, deft_pending_event e) {
    p->events->destroy(p->device.index, e.event);
    if (--e.block->pending_events == 0) deft_block_release(p, e.block);
}

static void deft_pool_process_events(deft_pool *p) {
    int kept = 0;
    for (int i = 0; i < p->n_pending; i++) {
        if (p->events->query(p->device.index, p->pending[i].event)) deft_event_done(p, p->pending[i]);
        else p->pending[kept++] = p->pending[i];
    }
    p->n_pending = kept;
}

static void deft_pool_wait_events(deft_pool *p) {
    for (int i = 0; i < p->n_pending; i++) {
        p->events->wait(p->device.index, p->pending[i].event);
        deft_event_done(p, p->pending[i]);
    }
    p->n_pending = 0;
}

static deft_status deft_pool_reserve_pending(deft_pool *p, int more) {
    if (p->n_pending + more <= p->cap_pending) return DEFT_OK;
    int cap = p->cap_pending ? p->cap_pending : 16;
    while (cap < p->n_pending + more) cap *= 2;
    deft_pending_event *n = realloc(p->pending, (size_t)cap * sizeof *n);
    if (!n) return DEFT_ERR_OOM;
    p->pending = n;
    p->cap_pending = cap;
    return DEFT_OK;
}

/* Records an event on every other stream that used b; returns the number it must wait for. If an event cannot be
 * recorded the device is in a sticky error state where no queued work will run again, so there is nothing to wait
 * for and the block is freed. */
static int deft_block_record_uses(deft_pool *p, deft_block *b) {
    for (int i = 0; i < b->n_uses; i++) {
        void *ev = NULL;
        if (p->events->record(p->device.index, b->uses[i], &ev) != DEFT_OK || !ev) continue;
        p->pending[p->n_pending++] = (deft_pending_event){ev, b};
        b->pending_events++;
    }
    free(b->uses);
    b->uses = NULL;
    b->n_uses = b->cap_uses = 0;
    return b->pending_events;
}

size_t deft_pool_release_cached(deft_pool *p) {
    deft_pool_wait_events(p);
    size_t released = 0;
    for (deft_segment *seg = p->segments, *next; seg; seg = next) {
        next = seg->next;
        if (seg->first->state != DEFT_BLOCK_FREE || seg->first->next) continue;
        released += seg->size;
        deft_segment_release(p, seg);
    }
    return released;
}

/* ---- alloc ---- */

static deft_status deft_pool_oom(deft_pool *p, size_t bytes, void *stream, const char *tag) {
    p->stats.num_ooms++;
    deft_pool_history(p, DEFT_HIST_OOM, 0, bytes, stream, tag);
    size_t free_b = 0, total_b = 0;
    if (p->raw->memory(p->device.index, &free_b, &total_b) != DEFT_OK) free_b = total_b = 0;
    int64_t allocated = p->stats.allocated_bytes.current, reserved = p->stats.reserved_bytes.current;
    char dev[32], want[32], total[32], fr[32], al[32], cached[32], lim[32], limit_note[96] = "", for_note[80] = "";
    if (p->limit)
        snprintf(limit_note, sizeof limit_note, "; the limit set with deft_memory_set_limit is %s",
                 deft_format_size(p->limit, lim, sizeof lim));
    /* Allocations made lazily inside a run (library workspaces, tables) are named, or the size alone would leave the
     * reader guessing what asked for it. */
    if (tag && tag[0]) snprintf(for_note, sizeof for_note, " The request was for %s.", tag);
    return deft_set_error(DEFT_ERR_OOM,
                          "out of memory on %s: tried to allocate %s; the device has %s in total, %s free; deft has "
                          "%s allocated and %s reserved but unused (cached)%s. Free tensors, call "
                          "%s, lower the batch size or set a memory budget.%s",
                          deft_pool_name(p, dev, sizeof dev), deft_format_size(bytes, want, sizeof want),
                          deft_format_size(total_b, total, sizeof total), deft_format_size(free_b, fr, sizeof fr),
                          deft_format_bytes(allocated, al, sizeof al),
                          deft_format_bytes(reserved - allocated, cached, sizeof cached), limit_note,
                          p->empty_cache_call ? p->empty_cache_call : "deft_memory_empty_cache", for_note);
}

deft_status deft_pool_alloc(deft_pool *p, size_t bytes, void *stream, const char *tag, void **out) {
    p->used = true;
    deft_pool_process_events(p);
    if (bytes > DEFT_MAX_REQUEST) return deft_pool_oom(p, bytes, stream, tag);
    /* Everything that can fail for want of host memory happens before the pool changes. */
    deft_block *spare = deft_pool_take_spare(p);
    if (!spare || deft_map_reserve_one(&p->live) != DEFT_OK) {
        if (spare) deft_pool_recycle(p, spare);
        return deft_set_error(DEFT_ERR_OOM, "out of host memory for the caching allocator's bookkeeping");
    }
    size_t size = deft_round_size(bytes);
    deft_block **tree = deft_is_small(size) ? &p->free_small : &p->free_large;
    deft_block *b = deft_tree_best_fit(*tree, stream, size);
    deft_status s = DEFT_OK;
    if (b) deft_tree_remove(tree, b);
    else s = deft_pool_grow(p, size, stream, &b);
    if (s == DEFT_OK && deft_should_split(b, size)) {
        deft_block_split(p, b, size, spare);
        spare = NULL;
    }
    if (spare) deft_pool_recycle(p, spare);
    if (s == DEFT_ERR_OOM) return deft_pool_oom(p, bytes, stream, tag);
    if (s != DEFT_OK) return s;
    deft_block_hand_out(p, b, bytes, tag);
    *out = (void *)b->addr;
    return DEFT_OK;
}

deft_status deft_caching_alloc(deft_device d, size_t bytes, void *stream, const char *tag, void **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "caching_alloc: out is NULL");
    *out = NULL;
    if (bytes == 0) return DEFT_OK;
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    s = deft_pool_alloc(p, bytes, stream, tag ? tag : "", out);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* ---- free ---- */

/* Why ptr is not a live block: a second free, a pointer into a block, or not ours at all. */
static deft_status deft_pool_bad_free(const deft_pool *p, void *ptr) {
    char dev[32];
    deft_pool_name(p, dev, sizeof dev);
    uintptr_t a = (uintptr_t)ptr;
    for (const deft_segment *seg = p->segments; seg; seg = seg->next) {
        if (a < seg->base || a >= seg->base + seg->size) continue;
        for (const deft_block *b = seg->first; b; b = b->next) {
            if (a == b->addr)
                return deft_set_error(DEFT_ERR_INVALID, "double free on %s: %p was already freed%s", dev, ptr,
                                      b->state == DEFT_BLOCK_PENDING ? " (it still waits on another stream)" : "");
            if (a < b->addr || a >= b->addr + b->size) continue;
            /* Inside a free block: most likely freed before, then merged with a free neighbour. */
            if (b->state != DEFT_BLOCK_ALLOCATED)
                return deft_set_error(DEFT_ERR_INVALID,
                                      "double free on %s: %p lies in memory already freed (now inside the cached "
                                      "free block at %p)", dev, ptr, (void *)b->addr);
            return deft_set_error(DEFT_ERR_INVALID,
                                  "free on %s: %p points %zu bytes into the block at %p; free the pointer the "
                                  "allocator returned", dev, ptr, (size_t)(a - b->addr), (void *)b->addr);
        }
    }
    return deft_set_error(DEFT_ERR_INVALID,
                          "free on %s: %p was not handed out by deft's caching allocator on %s (a foreign pointer, one "
                          "from another device, or one freed already whose segment was given back)", dev, ptr, dev);
}

deft_status deft_pool_free(deft_pool *p, void *ptr) {
    deft_block *b = deft_map_get(&p->live, (uintptr_t)ptr);
    if (!b) return deft_pool_bad_free(p, ptr);
    if (deft_pool_reserve_pending(p, b->n_uses) != DEFT_OK)
        return deft_set_error(DEFT_ERR_OOM, "out of host memory for the caching allocator's bookkeeping");
    deft_map_take(&p->live, b->addr);
    deft_stat_add(&p->stats.allocation, -1);
    deft_stat_add(&p->stats.allocated_bytes, -(int64_t)b->size);
    deft_stat_add(&p->stats.requested_bytes, -(int64_t)b->requested);
    deft_pool_history(p, DEFT_HIST_FREE, b->addr, b->size, b->stream, b->tag);
    deft_poison(p, b->addr, b->size, true);
    if (deft_block_record_uses(p, b) > 0) b->state = DEFT_BLOCK_PENDING;
    else deft_block_release(p, b);
    return DEFT_OK;
}

deft_status deft_caching_free(deft_device d, void *ptr) {
    if (!ptr) return DEFT_OK;
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    s = deft_pool_free(p, ptr);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* ---- streams ---- */

deft_status deft_pool_record_stream(deft_pool *p, void *ptr, void *stream) {
    deft_block *b = deft_map_get(&p->live, (uintptr_t)ptr);
    char dev[32];
    if (!b)
        return deft_set_error(DEFT_ERR_INVALID, "record_stream on %s: %p is not a live block of the caching allocator",
                              deft_pool_name(p, dev, sizeof dev), ptr);
    if (stream == b->stream) return DEFT_OK;   /* its own stream orders itself */
    for (int i = 0; i < b->n_uses; i++)
        if (b->uses[i] == stream) return DEFT_OK;
    if (b->n_uses == b->cap_uses) {
        int cap = b->cap_uses ? b->cap_uses * 2 : 4;
        void **n = realloc(b->uses, (size_t)cap * sizeof *n);
        if (!n) return deft_set_error(DEFT_ERR_OOM, "out of host memory for the caching allocator's bookkeeping");
        b->uses = n;
        b->cap_uses = cap;
    }
    b->uses[b->n_uses++] = stream;
    return DEFT_OK;
}

deft_status deft_caching_record_stream(deft_device d, void *ptr, void *stream) {
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    s = deft_pool_record_stream(p, ptr, stream);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static bool deft_hooks_complete(const deft_caching_event_hooks *h) {
    return h->record && h->query && h->wait && h->destroy;
}

deft_status deft_caching_set_event_hooks(deft_device_type type, const deft_caching_event_hooks *hooks) {
    if (type != DEFT_CPU && type != DEFT_CUDA)
        return deft_set_error(DEFT_ERR_INVALID, "set_event_hooks: unknown device type %d", (int)type);
    if (hooks && !deft_hooks_complete(hooks))
        return deft_set_error(DEFT_ERR_INVALID, "set_event_hooks: every hook must be set");
    int first = type == DEFT_CPU ? 0 : 1, end = type == DEFT_CPU ? 1 : DEFT_POOL_COUNT;
    bool busy = false;
    for (int i = first; i < end; i++) {
        pthread_mutex_lock(&deft_pool_at(i)->mu);
        busy = busy || deft_pools[i].n_pending > 0;
    }
    for (int i = first; i < end; i++) {
        if (!busy) deft_pools[i].events = hooks ? hooks : deft_default_events(type);
        pthread_mutex_unlock(&deft_pools[i].mu);
    }
    if (busy) return deft_set_error(DEFT_ERR_STATE, "set_event_hooks: blocks still wait on events of the old hooks");
    return DEFT_OK;
}

/* ---- public: the cache ---- */

deft_status deft_memory_empty_cache(deft_device d) {
    deft_pool *p;
    deft_status s = deft_pool_of(d, &p);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&p->mu);
    deft_pool_release_cached(p);
    pthread_mutex_unlock(&p->mu);
    return DEFT_OK;
}
