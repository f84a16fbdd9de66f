/* The caching allocator's own structures, shared by its files: caching_allocator.c (pools, alloc, free, segments),
 * caching_index.c (the free-block trees and the map of live blocks), memory_stats.c (counters and the summary)
 * and memory_snapshot.c (history and the JSON snapshot). Not for the rest of the library. */
#ifndef DEFT_CACHING_INTERNAL_H
#define DEFT_CACHING_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "caching_allocator.h"

#define DEFT_CACHING_TAG_MAX 64
/* Pools exist for the CPU and cuda:0 .. cuda:(this - 1). */
#define DEFT_CACHING_MAX_CUDA 64

typedef enum deft_block_state {
    DEFT_BLOCK_FREE = 0,         /* cached: in a free tree, ready for reuse */
    DEFT_BLOCK_ALLOCATED,        /* handed out, in the live map */
    DEFT_BLOCK_PENDING           /* freed by its owner, waiting on events of other streams */
} deft_block_state;

typedef struct deft_segment deft_segment;
typedef struct deft_block deft_block;

struct deft_block {
    uintptr_t addr;
    size_t size;                 /* a multiple of 512 */
    size_t requested;            /* the caller's size while allocated or pending; 0 when free */
    void *stream;                /* the segment's stream: the only one that may reuse the block */
    deft_segment *segment;
    deft_block *prev, *next;     /* address-ordered neighbours in the segment */
    deft_block *left, *right;    /* children in a free tree (only while free) */
    uint32_t prio;               /* treap priority */
    deft_block_state state;
    int pending_events;          /* events still to complete before a pending block is free */
    void **uses;                 /* other streams that used it (record_stream) */
    int n_uses, cap_uses;
    char tag[DEFT_CACHING_TAG_MAX];
};

struct deft_segment {
    uintptr_t base;
    size_t size;
    void *stream;
    bool small;                  /* from the small pool (<= 1 MiB blocks) */
    deft_block *first;
    deft_segment *prev, *next;   /* the pool's segments, newest first */
};

/* Live blocks by address: open addressing, linear probing, a power-of-two capacity. */
typedef struct deft_block_map {
    uintptr_t *keys;             /* 0 = empty: no block starts at address 0 */
    deft_block **vals;
    size_t cap, count;
} deft_block_map;

typedef struct deft_pending_event {
    void *event;
    deft_block *block;
} deft_pending_event;

typedef struct deft_raw_backend {
    deft_status (*alloc)(int index, size_t bytes, void **out);   /* DEFT_OK or any error: the caller reports */
    void (*free)(int index, void *ptr);
    deft_status (*memory)(int index, size_t *free_bytes, size_t *total_bytes);
} deft_raw_backend;

typedef struct deft_pool {
    pthread_mutex_t mu;
    deft_device device;
    const deft_raw_backend *raw;
    const deft_caching_event_hooks *events;
    bool used;                   /* something was asked of it: it shows in snapshots */
    deft_block *free_small, *free_large;   /* treaps keyed by (stream, size, address) */
    deft_segment *segments;
    deft_block_map live;
    deft_block *spare;           /* one recycled block struct (see deft_pool_take_spare) */
    deft_pending_event *pending;
    int n_pending, cap_pending;
    deft_memory_stats stats;
    size_t limit;                /* 0: none */
    uint32_t rng;
    /* Set only for a pool outside the device table (the pinned host pool, pinned_allocator.c): */
    const char *name;            /* named in messages instead of the device ("pinned host memory"); NULL: the device */
    const char *empty_cache_call;   /* the call an OOM message advises; NULL: "deft_memory_empty_cache" */
    bool no_history;             /* history entries name a device, which such a pool is not: it records none */
} deft_pool;

/* ---- pools (caching_allocator.c) ---- */
/* The pool of d, checked (a CUDA pool needs a usable GPU); DEFT_ERR_DEVICE or DEFT_ERR_NO_CUDA otherwise. */
deft_status deft_pool_of(deft_device d, deft_pool **out);
/* Every pool, for the snapshot: the CPU first, then cuda:0.. (n = 1 + DEFT_CACHING_MAX_CUDA). */
deft_pool *deft_pool_at(int i);
int deft_pool_count(void);
/* Gives every cached segment with nothing allocated in it back to the device; returns the bytes released. Waits
 * for pending events first, as their blocks may complete a segment. Call with the pool locked. */
size_t deft_pool_release_cached(deft_pool *p);
/* The rules of caching_allocator.c on any pool, for pools outside the device table (the pinned host pool), which
 * set up their own deft_pool (mutex, raw backend, events, nonzero rng, name). Call with the pool locked; each does
 * what deft_caching_alloc, deft_caching_free and deft_caching_record_stream do on a device's pool (bytes > 0). */
deft_status deft_pool_alloc(deft_pool *p, size_t bytes, void *stream, const char *tag, void **out);
deft_status deft_pool_free(deft_pool *p, void *ptr);
deft_status deft_pool_record_stream(deft_pool *p, void *ptr, void *stream);
/* Every invariant of the pool, as deft_caching_check (caching_check.c); call with the pool locked. */
deft_status deft_pool_check(const deft_pool *p);

/* ---- free trees and the live map (caching_index.c) ---- */
void deft_tree_insert(deft_block **root, deft_block *b);
void deft_tree_remove(deft_block **root, deft_block *b);
/* The smallest free block of `stream` with size >= size (ties: lowest address), or NULL. */
deft_block *deft_tree_best_fit(deft_block *root, void *stream, size_t size);

/* DEFT_ERR_OOM (no message) when the map cannot grow to hold one more. */
deft_status deft_map_reserve_one(deft_block_map *m);
void deft_map_put(deft_block_map *m, deft_block *b);   /* after deft_map_reserve_one */
deft_block *deft_map_get(const deft_block_map *m, uintptr_t addr);
deft_block *deft_map_take(deft_block_map *m, uintptr_t addr);   /* removes and returns, or NULL */

/* ---- counters (memory_stats.c) ---- */
void deft_stat_add(deft_memory_stat *s, int64_t delta);
/* "2.00 MiB", "1000 bytes": for messages and the summary. Sizes (requests, limits, device totals) are size_t and
 * go through deft_format_size: through int64_t, SIZE_MAX would print as "-1 bytes". */
const char *deft_format_size(size_t bytes, char *buf, size_t n);
const char *deft_format_bytes(int64_t bytes, char *buf, size_t n);   /* counters, which are int64_t */

/* ---- history (memory_snapshot.c) ---- */
typedef enum deft_history_action {
    DEFT_HIST_ALLOC = 0,
    DEFT_HIST_FREE,
    DEFT_HIST_SEGMENT_ALLOC,
    DEFT_HIST_SEGMENT_FREE,
    DEFT_HIST_OOM
} deft_history_action;

/* Cheap when history is off (one relaxed atomic load). */
void deft_history_add(deft_history_action action, deft_device d, uintptr_t addr, size_t size, void *stream,
                      const char *tag);

#endif
