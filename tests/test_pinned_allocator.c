/* The pinned host allocator on the CPU side: counters against hand-computed sequences, rounding, segments,
 * splitting and merging, reuse, empty_cache, the OOM path with its retry, zero-byte and huge requests, bad frees,
 * blocks that wait for recorded streams (with fake events), and many threads at once. Each section starts and ends
 * with an empty pool, and deft_pinned_check verifies every invariant of the pool after it.
 *
 * It runs where a GPU works too: the pool is then page-locked (cudaHostAlloc) and every figure is the same, since
 * the rules do not depend on the backend. tests/cuda_test_pinned_allocator.c covers real streams. */
#include "alloc_test.h"

static int page_locked;   /* a GPU works: the blocks are page-locked */

static deft_memory_stats stats(void) {
    deft_memory_stats s;
    memset(&s, 0xff, sizeof s);
    CHECK_OK(deft_pinned_stats(&s));
    return s;
}

static void *palloc(size_t bytes) {
    void *p = (void *)1;
    CHECK_OK(deft_pinned_alloc(bytes, &p));
    CHECK(p != NULL);
    if (!p) return p;
    alloc_test_touch(p, bytes);
    CHECK((uintptr_t)p % 512 == 0);
    return p;
}

static void release(void *p) { CHECK_OK(deft_pinned_free(p)); }

static void consistent(void) { CHECK_OK(deft_pinned_check()); }

static deft_status empty_cache(void) { return deft_pinned_empty_cache(); }

static const alloc_test_pool pool = {palloc, stats, release, consistent, empty_cache};

static void check_empty(void) { alloc_test_check_empty(&pool); }

/* Runs first: nothing has been asked yet, and asking about the pool allocates nothing. */
static void test_fresh(void) {
    deft_memory_stats s = stats();
    deft_memory_stats zero;
    memset(&zero, 0, sizeof zero);
    CHECK(memcmp(&s, &zero, sizeof s) == 0);
    CHECK(deft_pinned_is_page_locked(NULL) == 0);
    int on_stack = 0;
    CHECK(deft_pinned_is_page_locked(&on_stack) == 0);
    CHECK_OK(deft_pinned_empty_cache());
    CHECK_OK(deft_pinned_free(NULL));
    CHECK_ERR(deft_pinned_free(&on_stack), DEFT_ERR_INVALID, "was not handed out");
    CHECK_ERR(deft_pinned_record_stream(&on_stack, NULL), DEFT_ERR_INVALID, "is not a live block");
    void *z = (void *)1;
    CHECK_OK(deft_pinned_alloc(0, &z));   /* zero bytes: NULL, no segment */
    CHECK(z == NULL);
    CHECK(stats().segment.allocated == 0 && stats().num_device_alloc == 0);
    consistent();
}

/* The same sequence as the device allocator's test, and the same figures. */
static void test_counters(void) {
    deft_memory_stats s0 = stats();
    void *a = palloc(1000);
    CHECK((uintptr_t)a % 4096 == 0);   /* the first block of a fresh, page-aligned segment */
    CHECK(deft_pinned_is_page_locked(a) == page_locked);
    CHECK(deft_pinned_is_page_locked((char *)a + 999) == page_locked);   /* inside the block */
    CHECK(deft_pinned_is_page_locked((char *)a + 1024) == 0);            /* past it: free memory of the segment */
    deft_memory_stats s = stats();
    alloc_test_counters_first(&s0, &s);
    consistent();

    release(a);
    CHECK(deft_pinned_is_page_locked(a) == 0);   /* freed */
    s = stats();
    alloc_test_counters_freed(&s0, &s);   /* kept in the cache */

    void *b = palloc(1000);   /* the cached block comes back: no new segment */
    CHECK(b == a);
    s = stats();
    alloc_test_counters_reused(&s0, &s);
    void *c = palloc(5000);   /* 5120, right after b */
    CHECK((char *)c == (char *)b + 1024);
    s = stats();
    CHECK(s.allocated_bytes.current == 1024 + 5120 && s.allocated_bytes.peak == 1024 + 5120);
    CHECK(s.requested_bytes.current == 6000 && s.requested_bytes.peak == 6000 && s.allocation.peak == 2);
    release(b);
    release(c);

    CHECK_OK(deft_pinned_empty_cache());
    s = stats();
    alloc_test_counters_emptied(&s0, &s);
    CHECK(s.allocated_bytes.allocated - s0.allocated_bytes.allocated == 1024 + 1024 + 5120);
    check_empty();
}

/* 512-byte rounding; <= 1 MiB in 2 MiB segments; 1-10 MiB in 20 MiB; larger rounded to 2 MiB; the large pool
 * splits only when more than 1 MiB would be left. */
static void test_rounding_and_segments(void) {
    deft_memory_stats s0 = stats();
    void *tiny = palloc(1);
    void *mib = palloc(MiB);   /* exactly 1 MiB is still small: the same 2 MiB segment */
    CHECK((char *)mib == (char *)tiny + 512);
    deft_memory_stats s = stats();
    CHECK(s.allocated_bytes.current == (int64_t)(512 + MiB) && s.reserved_bytes.current == (int64_t)(2 * MiB));
    CHECK(s.requested_bytes.current == (int64_t)(1 + MiB));

    void *big = palloc(12 * MiB + 1);   /* 12 MiB + 512, in a 14 MiB segment; 2 MiB - 512 left over, split off */
    CHECK((uintptr_t)big % 4096 == 0);
    s = stats();
    CHECK(s.reserved_bytes.current == (int64_t)(16 * MiB) && s.segment.current == 2);
    CHECK(s.allocated_bytes.current == (int64_t)(512 + MiB + 12 * MiB + 512));

    /* 1 MiB + 512 fits the 2 MiB - 512 remainder; what would be left (< 1 MiB) is not split off */
    void *mid = palloc(MiB + 1);
    CHECK((char *)mid == (char *)big + 12 * MiB + 512);
    s = stats();
    CHECK(s.segment.current == 2 && s.allocated_bytes.current == (int64_t)(512 + MiB + 14 * MiB));
    CHECK(s.requested_bytes.current == (int64_t)(1 + MiB + 12 * MiB + 1 + MiB + 1));

    void *five = palloc(5 * MiB);   /* a new 20 MiB segment */
    s = stats();
    CHECK(s.reserved_bytes.current == (int64_t)(36 * MiB) && s.num_device_alloc - s0.num_device_alloc == 3);
    void *four = palloc(4 * MiB);   /* the 15 MiB rest of that segment */
    CHECK((char *)four == (char *)five + 5 * MiB);
    CHECK(stats().num_device_alloc - s0.num_device_alloc == 3);
    consistent();
    release(tiny), release(mib), release(big), release(mid), release(five), release(four);
    consistent();
    s = stats();
    CHECK(s.allocated_bytes.current == 0 && s.reserved_bytes.current == (int64_t)(36 * MiB));
    CHECK_OK(deft_pinned_empty_cache());
    s = stats();
    CHECK(s.reserved_bytes.current == 0 && s.num_device_free - s0.num_device_free == 3);
    check_empty();
}

static void test_split_merge_and_reuse(void) {
    deft_memory_stats s0 = stats();
    char *a = alloc_test_split_merge(&pool);

    /* A steady loop of staging buffers costs one segment, whatever the number of rounds. */
    for (size_t i = 0; i < 100; i++) {
        char *x = palloc(64 * KiB + i), *y = palloc(300 * KiB);
        CHECK(x == a && y == a + 64 * KiB + (i ? 512 : 0));
        release(x), release(y);
    }
    deft_memory_stats s = stats();
    CHECK(s.num_device_alloc == s0.num_device_alloc + 1 && s.segment.current == 1);
    CHECK(s.allocation.allocated - s0.allocation.allocated == 3 + 1 + 2 + 2 + 200);
    /* Only a segment that is one free block again can be given back. */
    char *held = palloc(100);
    CHECK_OK(deft_pinned_empty_cache());
    CHECK(stats().num_device_free == s0.num_device_free && stats().segment.current == 1);
    release(held);
    CHECK_OK(deft_pinned_empty_cache());
    CHECK(stats().num_device_free == s0.num_device_free + 1);
    check_empty();
}

/* The pinned pool is its own: neither the CPU device pool's counters nor its blocks. */
static void test_separate_from_cpu_pool(void) {
    deft_memory_stats c0;
    CHECK_OK(deft_memory_stats_get(deft_cpu(), &c0));
    void *p = palloc(3000);
    void *q = NULL;
    CHECK_OK(deft_caching_alloc(deft_cpu(), 3000, NULL, "cpu pool", &q));
    deft_memory_stats c1;
    CHECK_OK(deft_memory_stats_get(deft_cpu(), &c1));
    CHECK(c1.allocated_bytes.allocated - c0.allocated_bytes.allocated == 3072);   /* q only */
    CHECK(stats().allocated_bytes.current == 3072);                                /* p only */
    CHECK(deft_pinned_is_page_locked(q) == 0);
    CHECK_ERR(deft_pinned_free(q), DEFT_ERR_INVALID, "was not handed out by deft's caching allocator on pinned host");
    CHECK_ERR(deft_caching_free(deft_cpu(), p), DEFT_ERR_INVALID, "free on cpu");
    CHECK_OK(deft_caching_free(deft_cpu(), q));
    release(p);
    CHECK_OK(deft_memory_empty_cache(deft_cpu()));
    check_empty();
}

static void test_oom(void) {
    deft_memory_stats s0 = stats();
    /* Beyond what can be rounded: refused before any memory is asked for, the cache left as it is. */
    release(palloc(1000));   /* a cached 2 MiB segment */
    void *huge = (void *)1;
    CHECK_ERR(deft_pinned_alloc(SIZE_MAX - 100, &huge), DEFT_ERR_OOM,
              "out of memory on pinned host memory: tried to allocate ");
    CHECK(huge == NULL);
    CHECK(strstr(deft_errmsg(), "deft has 0 bytes allocated and 2.00 MiB reserved but unused (cached)") != NULL);
    CHECK(strstr(deft_errmsg(), "call deft_pinned_empty_cache") != NULL);
    deft_memory_stats s = stats();
    CHECK(s.num_ooms == s0.num_ooms + 1 && s.num_alloc_retries == s0.num_alloc_retries);
    CHECK(s.reserved_bytes.current == (int64_t)(2 * MiB) && s.num_device_free == s0.num_device_free);

    /* A request no host can pin (1 PiB): the cache is given back, the request retried once, then refused. */
    void *keep = palloc(1000);   /* a segment in use stays */
    void *c = palloc(5 * MiB);
    release(c);                  /* and a cached 20 MiB one goes */
    s0 = stats();
    huge = (void *)1;
    CHECK_ERR(deft_pinned_alloc((size_t)1 << 50, &huge), DEFT_ERR_OOM,
              "out of memory on pinned host memory: tried to allocate 1.00 PiB");
    CHECK(huge == NULL);
    CHECK(strstr(deft_errmsg(), "deft has 1.00 KiB allocated and 2.00 MiB reserved but unused (cached)") != NULL);
    s = stats();
    CHECK(s.num_ooms == s0.num_ooms + 1 && s.num_alloc_retries == s0.num_alloc_retries + 1);
    CHECK(s.num_device_free == s0.num_device_free + 1 && s.reserved_bytes.current == (int64_t)(2 * MiB));
    CHECK(s.allocated_bytes.current == 1024 && s.requested_bytes.current == 1000);
    consistent();

    /* With nothing cached there is nothing to retry with: no retry is counted. */
    s0 = stats();
    CHECK_ERR(deft_pinned_alloc((size_t)1 << 50, &huge), DEFT_ERR_OOM, "tried to allocate 1.00 PiB");
    s = stats();
    CHECK(s.num_ooms == s0.num_ooms + 1 && s.num_alloc_retries == s0.num_alloc_retries);
    void *after = palloc(2000);   /* the pool still works */
    CHECK((char *)after == (char *)keep + 1024);
    release(after), release(keep);
    consistent();
    check_empty();
}

static void test_bad_free(void) {
    void *a = palloc(1000), *keep = palloc(2000);
    release(a);
    deft_memory_stats before = stats();
    CHECK_ERR(deft_pinned_free(a), DEFT_ERR_INVALID, "double free on pinned host memory");
    CHECK(strstr(deft_errmsg(), "was already freed") != NULL);
    int on_stack = 0;
    CHECK_ERR(deft_pinned_free(&on_stack), DEFT_ERR_INVALID, "was not handed out by deft's caching allocator");
    void *m = malloc(64);
    CHECK_ERR(deft_pinned_free(m), DEFT_ERR_INVALID, "was not handed out by deft's caching allocator");
    CHECK(deft_pinned_is_page_locked(m) == 0);
    free(m);
    CHECK_ERR(deft_pinned_free((char *)keep + 8), DEFT_ERR_INVALID, "points 8 bytes into the block at");
    CHECK_ERR(deft_pinned_record_stream(a, (void *)0x10), DEFT_ERR_INVALID, "is not a live block");
    CHECK_ERR(deft_pinned_record_stream((char *)keep + 8, NULL), DEFT_ERR_INVALID, "is not a live block");
    CHECK_ERR(deft_pinned_alloc(10, NULL), DEFT_ERR_INVALID, "out is NULL");
    CHECK_ERR(deft_pinned_stats(NULL), DEFT_ERR_INVALID, "out is NULL");
    deft_memory_stats after = stats();
    CHECK(memcmp(&before, &after, sizeof before) == 0);   /* the errors changed nothing */
    consistent();
    void *again = palloc(1000);   /* the pool still works, and hands the freed block out again */
    CHECK(again == a);
    release(again);
    release(keep);   /* merges into the free block at `again` */
    CHECK_ERR(deft_pinned_free(keep), DEFT_ERR_INVALID, "double free on pinned host memory");
    CHECK(strstr(deft_errmsg(), "now inside the cached free block at") != NULL);
    CHECK_OK(deft_pinned_empty_cache());
    CHECK_ERR(deft_pinned_free(keep), DEFT_ERR_INVALID, "segment was given back");
    check_empty();
}

/* Blocks that wait for the streams recorded on them, with the fake events of alloc_test.h. */
static void test_record_stream(void) {
    CHECK_OK(deft_testing_pinned_set_event_hooks(&fake_hooks));
    /* Freed with no stream recorded: reusable at once, no event. */
    deft_memory_stats s0 = stats();
    void *z = palloc(1000);
    release(z);
    void *a = palloc(1000);
    CHECK(a == z && n_fake_events == 0);
    CHECK_OK(deft_pinned_record_stream(a, NULL));   /* the legacy default stream is waited for like any other */
    CHECK_OK(deft_pinned_record_stream(a, S1));
    CHECK_OK(deft_pinned_record_stream(a, S1));     /* once per stream */
    CHECK(n_fake_events == 0);                      /* events are recorded at the free, not before */
    release(a);
    CHECK(n_fake_events == 2 && fake_events[0].stream == NULL && fake_events[1].stream == S1);
    deft_memory_stats s = stats();
    CHECK(s.allocated_bytes.current == 0 && s.active_bytes.current == 1024 && s.allocation.current == 0);
    CHECK(s.requested_bytes.current == 0 && s.reserved_bytes.current == (int64_t)(2 * MiB));
    CHECK(deft_pinned_is_page_locked(a) == 0);
    consistent();
    CHECK_ERR(deft_pinned_free(a), DEFT_ERR_INVALID, "waits on another stream");
    CHECK_ERR(deft_pinned_record_stream(a, S2), DEFT_ERR_INVALID, "is not a live block");
    CHECK_ERR(deft_testing_pinned_set_event_hooks(NULL), DEFT_ERR_STATE, "still wait");

    char *b = palloc(1000);   /* a waits: not reused */
    CHECK(b == (char *)a + 1024);
    fake_events[0].done = 1;
    char *c = palloc(1000);   /* one of a's two events is done: a still waits */
    CHECK(c == b + 1024 && fake_events[0].destroyed == 1 && fake_events[1].destroyed == 0);
    CHECK(stats().active_bytes.current == 3 * 1024);
    consistent();
    fake_events[1].done = 1;
    void *d = palloc(1000);   /* both done, seen at this allocation: a is free again and the best fit */
    CHECK(d == a && fake_events[1].destroyed == 1);
    s = stats();
    CHECK(s.active_bytes.current == 3 * 1024 && s.allocated_bytes.current == 3 * 1024);
    CHECK(s.num_device_alloc == s0.num_device_alloc + 1);
    consistent();

    /* empty_cache waits for what is pending, so the segment can go back. */
    CHECK_OK(deft_pinned_record_stream(d, S2));
    release(d), release(b), release(c);
    CHECK(n_fake_events == 3 && !fake_events[2].done && fake_events[2].stream == S2);
    CHECK(stats().active_bytes.current == 1024);
    CHECK_OK(deft_pinned_empty_cache());
    CHECK(fake_events[2].waited && fake_events[2].destroyed == 1);
    CHECK(stats().reserved_bytes.current == 0 && stats().active_bytes.current == 0);
    CHECK_OK(deft_testing_pinned_set_event_hooks(NULL));
    CHECK_ERR(deft_testing_pinned_set_event_hooks(&(deft_testing_event_hooks){0}), DEFT_ERR_INVALID, "hook");
    check_empty();

    /* Without a GPU the default events never wait: no stream can be reading host memory. (With one, the stream
     * handles here would be fake; cuda_test_pinned_allocator covers real streams.) */
    if (!page_locked) {
        void *e = palloc(1000);
        CHECK_OK(deft_pinned_record_stream(e, S1));
        release(e);
        CHECK(stats().active_bytes.current == 0);
        void *f = palloc(1000);
        CHECK(f == e);
        release(f);
        check_empty();
    }
}

/* Many threads on the pool (alloc_test_threads runs them). */
static deft_status churn_take(size_t bytes, uint32_t x, void **out) {
    deft_status s = deft_pinned_alloc(bytes, out);
    if (s == DEFT_OK && (x >> 10) % 3 == 0) s = deft_pinned_record_stream(*out, NULL);
    if (s == DEFT_OK && (x >> 10) % 7 == 0 && deft_pinned_is_page_locked((char *)*out + bytes - 1) != page_locked)
        s = DEFT_ERR_RUNTIME;
    return s;
}

static deft_status churn_give(void *p) { return deft_pinned_free(p); }

static void test_threads(void) { alloc_test_threads(&pool, &(alloc_test_churn){churn_take, churn_give}); }

/* A long random sequence, checked against every invariant as it goes. */
static void *random_alloc(size_t bytes, uint32_t x) {
    (void)x;
    return palloc(bytes);
}

static void test_random(void) { alloc_test_random(&pool, random_alloc); }

int main(void) {
    test_fresh();
    page_locked = deft_cuda_device_count() > 0;
    printf("pinned blocks are %s\n", page_locked ? "page-locked (cudaHostAlloc)" : "plain host memory");
    test_counters();
    test_rounding_and_segments();
    test_split_merge_and_reuse();
    test_separate_from_cpu_pool();
    test_oom();
    test_bad_free();
    test_record_stream();
    test_threads();
    test_random();
    return deft_check_finish();
}
