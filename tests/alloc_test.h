/* What the CPU tests of the caching allocator and of the pinned host allocator share. The two pools follow the
 * same rules (rounding, segments, counters, blocks waiting on recorded streams), so their tests run the same
 * sequences against the same figures: the fake event hooks, the counter checks, the thread and random sections
 * live here once. Each test hands in its pool as an alloc_test_pool. */
#ifndef DEFT_TEST_ALLOC_TEST_H
#define DEFT_TEST_ALLOC_TEST_H

#include <pthread.h>
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"
#include "xorshift.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* The pool under test. */
typedef struct alloc_test_pool {
    void *(*alloc)(size_t bytes);
    deft_memory_stats (*stats)(void);
    void (*release)(void *p);
    void (*consistent)(void);
    deft_status (*empty_cache)(void);
} alloc_test_pool;

/* Splitting and merging in a fresh 2 MiB small segment, the same rules in both pools: neighbours merge when freed,
 * best fit picks the merged block, and even a 512-byte rest is split off. Returns the segment's first block. */
static inline char *alloc_test_split_merge(const alloc_test_pool *pool) {
    char *a = pool->alloc(256 * 1024), *b = pool->alloc(256 * 1024), *c = pool->alloc(256 * 1024);
    CHECK(b == a + 256 * 1024 && c == b + 256 * 1024);
    pool->release(b);
    pool->release(a);   /* merges with b behind it: 512 KiB free at a */
    pool->consistent();
    char *ab = pool->alloc(512 * 1024);   /* best fit is the merged block, not the 1.25 MiB tail */
    CHECK(ab == a);
    pool->release(ab);
    pool->release(c);   /* merges with a+b before it and the tail after it: the segment is one free block */
    pool->consistent();
    char *gap = pool->alloc(1024), *fence = pool->alloc(1000);
    pool->release(gap);
    char *h0 = pool->alloc(512), *h1 = pool->alloc(512);
    CHECK(h0 == gap && h1 == gap + 512);
    pool->release(h0), pool->release(h1), pool->release(fence);
    pool->consistent();
    return a;
}

/* The bytes asked for are usable (valgrind and ASan would catch an overrun); big blocks at both ends only. */
static inline void alloc_test_touch(void *p, size_t bytes) {
    size_t edge = bytes < 8192 ? bytes : 4096;
    memset(p, 0xab, edge);
    memset((char *)p + bytes - edge, 0xab, edge);
}

/* Every section leaves nothing allocated and nothing cached. */
static inline void alloc_test_check_empty(const alloc_test_pool *pool) {
    CHECK_OK(pool->empty_cache());
    deft_memory_stats s = pool->stats();
    CHECK(s.allocated_bytes.current == 0 && s.reserved_bytes.current == 0 && s.active_bytes.current == 0);
    CHECK(s.requested_bytes.current == 0 && s.allocation.current == 0 && s.segment.current == 0);
    pool->consistent();
}

/* ---- the counter sequence both tests run: 1000 bytes, freed, asked again; figures against the section's start */

/* After the first 1000-byte block of an empty pool. */
static inline void alloc_test_counters_first(const deft_memory_stats *s0, const deft_memory_stats *s) {
    CHECK(s->allocated_bytes.current == 1024 && s->allocated_bytes.peak == 1024);
    CHECK(s->allocated_bytes.allocated - s0->allocated_bytes.allocated == 1024);
    CHECK(s->requested_bytes.current == 1000 && s->active_bytes.current == 1024);
    CHECK(s->reserved_bytes.current == (int64_t)(2 * MiB) && s->segment.current == 1 && s->allocation.current == 1);
    CHECK(s->num_device_alloc - s0->num_device_alloc == 1 && s->num_device_free == s0->num_device_free);
    CHECK(s->num_alloc_retries == s0->num_alloc_retries && s->num_ooms == s0->num_ooms);
}

/* After that block is freed: kept in the cache. */
static inline void alloc_test_counters_freed(const deft_memory_stats *s0, const deft_memory_stats *s) {
    CHECK(s->allocated_bytes.current == 0 && s->allocated_bytes.peak == 1024);
    CHECK(s->allocated_bytes.freed - s0->allocated_bytes.freed == 1024);
    CHECK(s->requested_bytes.current == 0 && s->requested_bytes.freed - s0->requested_bytes.freed == 1000);
    CHECK(s->active_bytes.current == 0 && s->allocation.current == 0);
    CHECK(s->reserved_bytes.current == (int64_t)(2 * MiB));
}

/* After the same request again: the cached block came back, no new segment. */
static inline void alloc_test_counters_reused(const deft_memory_stats *s0, const deft_memory_stats *s) {
    CHECK(s->num_device_alloc - s0->num_device_alloc == 1);
    CHECK(s->allocated_bytes.allocated - s0->allocated_bytes.allocated == 2048);
    CHECK(s->allocation.allocated - s0->allocation.allocated == 2);
}

/* After empty_cache gave the one 2 MiB segment back. */
static inline void alloc_test_counters_emptied(const deft_memory_stats *s0, const deft_memory_stats *s) {
    CHECK(s->reserved_bytes.current == 0 && s->reserved_bytes.peak == (int64_t)(2 * MiB));
    CHECK(s->reserved_bytes.freed - s0->reserved_bytes.freed == (int64_t)(2 * MiB));
    CHECK(s->segment.current == 0 && s->num_device_free - s0->num_device_free == 1);
}

/* ---- fake events, completed by the test, to see blocks that wait for the streams recorded on them */
#define S1 ((void *)0x1000)
#define S2 ((void *)0x2000)

typedef struct fake_event {
    void *stream;
    int done, waited, destroyed;
} fake_event;
static fake_event fake_events[16];
static int n_fake_events;

static inline deft_status fake_record(int index, void *stream, void **event) {
    (void)index;
    fake_events[n_fake_events].stream = stream;
    *event = &fake_events[n_fake_events++];
    return DEFT_OK;
}
static inline int fake_query(int index, void *event) {
    (void)index;
    return ((fake_event *)event)->done;
}
static inline void fake_wait(int index, void *event) {
    (void)index;
    ((fake_event *)event)->done = ((fake_event *)event)->waited = 1;
}
static inline void fake_destroy(int index, void *event) {
    (void)index;
    ((fake_event *)event)->destroyed++;
}
static const deft_testing_event_hooks fake_hooks = {fake_record, fake_query, fake_wait, fake_destroy};

/* ---- many threads on the pool: the mutex keeps the blocks and the counters whole */
#define THREADS 4
#define ROUNDS 3000

/* What a thread does with the pool: take a block of `bytes` (x: the generator's state, to pick a stream or an extra
 * check from) and give one back; each returns DEFT_OK when the call and its checks succeeded. */
typedef struct alloc_test_churn {
    deft_status (*take)(size_t bytes, uint32_t x, void **out);
    deft_status (*give)(void *p);
} alloc_test_churn;

typedef struct alloc_test_thread {
    const alloc_test_churn *churn;
    uint32_t seed;
} alloc_test_thread;

/* ROUNDS random takes and gives over 8 slots, writing the last byte of each block; NULL when every call succeeded. */
static inline void *alloc_test_churn_run(void *arg) {
    const alloc_test_thread *th = (const alloc_test_thread *)arg;
    uint32_t x = th->seed * 2654435761u + 1;
    void *held[8] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        xorshift32(&x);
        int slot = (int)(x % 8);
        if (held[slot] && th->churn->give(held[slot]) != DEFT_OK) return (void *)1;
        held[slot] = NULL;
        size_t bytes = (x >> 8) % 4 == 0 ? (x >> 12) % (3 * MiB) + 1 : (x >> 12) % (64 * KiB) + 1;
        if (th->churn->take(bytes, x, &held[slot]) != DEFT_OK) return (void *)1;
        ((char *)held[slot])[bytes - 1] = 1;
    }
    for (int i = 0; i < 8; i++)
        if (held[i] && th->churn->give(held[i]) != DEFT_OK) return (void *)1;
    return NULL;
}

/* THREADS threads churning the pool at once; then the counters add up and the pool is whole and empty. */
static inline void alloc_test_threads(const alloc_test_pool *pool, const alloc_test_churn *churn) {
    deft_memory_stats s0 = pool->stats();
    pthread_t t[THREADS];
    alloc_test_thread args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (alloc_test_thread){churn, (uint32_t)(i + 1)};
        CHECK(pthread_create(&t[i], NULL, alloc_test_churn_run, &args[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        void *r = (void *)1;
        CHECK(pthread_join(t[i], &r) == 0 && r == NULL);
    }
    deft_memory_stats s = pool->stats();
    CHECK(s.allocation.allocated - s0.allocation.allocated == THREADS * ROUNDS);
    CHECK(s.allocation.current == 0 && s.allocated_bytes.current == 0 && s.requested_bytes.current == 0);
    pool->consistent();
    alloc_test_check_empty(pool);
}

/* ---- a long random sequence, checked against every invariant as it goes; alloc(bytes, x) may pick a stream
 * from the generator's state x */
static inline void alloc_test_random(const alloc_test_pool *pool, void *(*alloc)(size_t bytes, uint32_t x)) {
    void *held[64] = {0};
    uint32_t x = 12345;
    for (int i = 0; i < 4000; i++) {
        xorshift32(&x);
        uint32_t r = x * 2654435761u;
        int slot = (int)(x % 64);
        if (held[slot]) pool->release(held[slot]);
        held[slot] = NULL;
        size_t bytes = r % ((x & 0x200) ? 30 * MiB : 200 * KiB) + 1;
        if (x & 0x100) held[slot] = alloc(bytes, x);
        if (i % 97 == 0) pool->consistent();
        if (i % 1000 == 999) CHECK_OK(pool->empty_cache());
    }
    for (int i = 0; i < 64; i++) pool->release(held[i]);
    pool->consistent();
    alloc_test_check_empty(pool);
}

#endif
