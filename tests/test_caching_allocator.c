/* The caching allocator on the CPU: counters against hand-computed sequences, rounding, pools, splitting and
 * merging, the limit and the OOM path with its retry, bad frees, stream-ordered reuse, blocks waiting on other
 * streams, the summary table, and many threads at once. Each section starts and ends with an empty pool, and
 * deft_caching_check verifies every invariant of the pool after it. */
#include "alloc_test.h"

static deft_device cpu;

static deft_memory_stats stats(void) {
    deft_memory_stats s;
    memset(&s, 0xff, sizeof s);
    CHECK_OK(deft_memory_stats_get(cpu, &s));
    return s;
}

static void *alloc_on(size_t bytes, void *stream, const char *tag) {
    void *p = (void *)1;
    CHECK_OK(deft_caching_alloc(cpu, bytes, stream, tag, &p));
    CHECK(p != NULL);
    if (!p) return p;
    alloc_test_touch(p, bytes);
    return p;
}

static void *alloc(size_t bytes) { return alloc_on(bytes, NULL, "test"); }

static void release(void *p) { CHECK_OK(deft_caching_free(cpu, p)); }

static void consistent(void) { CHECK_OK(deft_caching_check(cpu)); }

static deft_status empty_cache(void) { return deft_memory_empty_cache(cpu); }

static const alloc_test_pool pool = {alloc, stats, release, consistent, empty_cache};

/* Every section leaves nothing allocated and nothing cached. */
static void check_empty(void) { alloc_test_check_empty(&pool); }

/* Current values and peaks are absolute (each section starts empty, after a reset of the peaks); running totals and
 * event counts are checked as increments over the section. */
static void test_counters(void) {
    CHECK_OK(deft_memory_reset_peak(cpu));
    deft_memory_stats s0 = stats();
    CHECK(s0.allocated_bytes.peak == 0 && s0.reserved_bytes.peak == 0 && s0.allocation.peak == 0);
    void *a = alloc(1000);
    CHECK((uintptr_t)a % 256 == 0);
    deft_memory_stats s = stats();
    alloc_test_counters_first(&s0, &s);
    consistent();

    release(a);
    s = stats();
    alloc_test_counters_freed(&s0, &s);   /* kept in the cache */

    void *b = alloc(1000);   /* the cached block comes back: no device call */
    CHECK(b == a);
    s = stats();
    alloc_test_counters_reused(&s0, &s);
    release(b);

    CHECK_OK(deft_memory_empty_cache(cpu));
    s = stats();
    alloc_test_counters_emptied(&s0, &s);

    CHECK_OK(deft_memory_reset_peak(cpu));
    s = stats();
    CHECK(s.reserved_bytes.peak == 0 && s.allocated_bytes.peak == 0 && s.allocation.peak == 0);
    CHECK(s.allocated_bytes.allocated - s0.allocated_bytes.allocated == 2048);   /* totals survive the reset */
    void *c = alloc(5000);   /* 5120 */
    s = stats();
    CHECK(s.allocated_bytes.peak == 5120 && s.reserved_bytes.peak == (int64_t)(2 * MiB));
    release(c);
    check_empty();
}

/* 512-byte rounding; <= 1 MiB in 2 MiB segments; 1-10 MiB in 20 MiB; larger rounded to 2 MiB; the large pool
 * splits only when more than 1 MiB would be left. */
static void test_rounding_and_pools(void) {
    deft_memory_stats s0 = stats();
    void *tiny = alloc(1);
    void *mib = alloc(MiB);   /* exactly 1 MiB is still small: same 2 MiB segment */
    CHECK((char *)mib == (char *)tiny + 512);
    deft_memory_stats s = stats();
    CHECK(s.allocated_bytes.current == (int64_t)(512 + MiB) && s.reserved_bytes.current == (int64_t)(2 * MiB));

    void *big = alloc(12 * MiB + 1);   /* 12 MiB + 512, in a 14 MiB segment; 2 MiB - 512 left over, split off */
    s = stats();
    CHECK(s.reserved_bytes.current == (int64_t)(16 * MiB) && s.segment.current == 2);
    CHECK(s.allocated_bytes.current == (int64_t)(512 + MiB + 12 * MiB + 512));

    /* 1 MiB + 512 fits the 2 MiB - 512 remainder; what would be left (< 1 MiB) is not split off */
    void *mid = alloc(MiB + 1);
    CHECK((char *)mid == (char *)big + 12 * MiB + 512);
    s = stats();
    CHECK(s.segment.current == 2);
    CHECK(s.allocated_bytes.current == (int64_t)(512 + MiB + 14 * MiB));
    CHECK(s.requested_bytes.current == (int64_t)(1 + MiB + 12 * MiB + 1 + MiB + 1));

    void *five = alloc(5 * MiB);   /* a new 20 MiB segment */
    s = stats();
    CHECK(s.reserved_bytes.current == (int64_t)(36 * MiB) && s.num_device_alloc - s0.num_device_alloc == 3);
    consistent();
    release(tiny), release(mib), release(big), release(mid), release(five);
    consistent();
    check_empty();
}

static void test_split_and_merge(void) {
    deft_memory_stats s0 = stats();
    char *a = alloc_test_split_merge(&pool);
    char *most = alloc(MiB);   /* the largest small request, served from the merged block */
    CHECK(most == a);
    deft_memory_stats s = stats();
    CHECK(s.num_device_alloc == s0.num_device_alloc + 1);
    release(most);
    /* Only a segment that is one free block again can be given back. */
    s = stats();
    CHECK_OK(deft_memory_empty_cache(cpu));
    CHECK(stats().num_device_free == s.num_device_free + 1);
    check_empty();
}

static void test_limit_and_oom(void) {
    deft_memory_stats s0 = stats();
    CHECK_OK(deft_memory_set_limit(cpu, 4 * MiB));
    /* 20 MiB would pass the limit; the request rounded to 2 MiB (4 MiB) does not */
    void *a = alloc(3 * MiB);
    deft_memory_stats s = stats();
    CHECK(s.reserved_bytes.current == (int64_t)(4 * MiB) && s.allocated_bytes.current == (int64_t)(4 * MiB));
    void *b = (void *)1;
    CHECK_ERR(deft_caching_alloc(cpu, 3 * MiB, NULL, "second", &b), DEFT_ERR_OOM,
              "out of memory on cpu: tried to allocate 3.00 MiB; the device has ");
    CHECK(b == NULL);
    CHECK(strstr(deft_errmsg(), "deft has 4.00 MiB allocated and 0 bytes reserved but unused (cached)") != NULL);
    CHECK(strstr(deft_errmsg(), "the limit set with deft_memory_set_limit is 4.00 MiB") != NULL);
    CHECK(strstr(deft_errmsg(), "deft_memory_empty_cache") != NULL);
    s = stats();
    CHECK(s.num_ooms == s0.num_ooms + 1 && s.num_alloc_retries == s0.num_alloc_retries);   /* nothing to retry with */
    release(a);
    consistent();
    check_empty();

    /* The retry: a cached 2 MiB segment stands in the way; it is given back and the second try succeeds. */
    s0 = stats();
    release(alloc(1000));
    void *c = alloc(3 * MiB);
    s = stats();
    CHECK(s.num_alloc_retries == s0.num_alloc_retries + 1 && s.num_ooms == s0.num_ooms);
    CHECK(s.num_device_free == s0.num_device_free + 1 && s.reserved_bytes.current == (int64_t)(4 * MiB));
    release(c);

    /* Lifting the limit lets the same request through; requests beyond any memory fail cleanly. */
    CHECK_OK(deft_memory_set_limit(cpu, 0));
    void *d = alloc(5 * MiB);
    CHECK(stats().reserved_bytes.current == (int64_t)(4 * MiB + 20 * MiB));
    void *huge = (void *)1;
    CHECK_ERR(deft_caching_alloc(cpu, SIZE_MAX - 100, NULL, NULL, &huge), DEFT_ERR_OOM, "out of memory on cpu");
    CHECK(huge == NULL);
    release(d);
    consistent();
    check_empty();
}

static void test_bad_free(void) {
    void *a = alloc(1000), *keep = alloc(2000);
    release(a);
    deft_memory_stats before = stats();
    CHECK_ERR(deft_caching_free(cpu, a), DEFT_ERR_INVALID, "double free on cpu");
    int on_stack = 0;
    CHECK_ERR(deft_caching_free(cpu, &on_stack), DEFT_ERR_INVALID, "was not handed out by deft's caching allocator");
    void *m = malloc(64);
    CHECK_ERR(deft_caching_free(cpu, m), DEFT_ERR_INVALID, "was not handed out by deft's caching allocator");
    free(m);
    CHECK_ERR(deft_caching_free(cpu, (char *)keep + 8), DEFT_ERR_INVALID, "points 8 bytes into the block at");
    CHECK_ERR(deft_caching_record_stream(cpu, a, (void *)0x10), DEFT_ERR_INVALID, "is not a live block");
    CHECK_ERR(deft_caching_alloc(cpu, 10, NULL, NULL, NULL), DEFT_ERR_INVALID, "out is NULL");
    deft_memory_stats after = stats();
    CHECK(memcmp(&before, &after, sizeof before) == 0);   /* the errors changed nothing */
    consistent();
    CHECK_OK(deft_caching_free(cpu, NULL));
    void *z = (void *)1;
    CHECK_OK(deft_caching_alloc(cpu, 0, NULL, NULL, &z));
    CHECK(z == NULL);
    void *again = alloc(1000);   /* the pool still works, and hands the freed block out again */
    CHECK(again == a);
    release(again);
    release(keep);   /* merges into the free block at `again` */
    CHECK_ERR(deft_caching_free(cpu, keep), DEFT_ERR_INVALID, "double free on cpu");
    CHECK(strstr(deft_errmsg(), "now inside the cached free block at") != NULL);
    CHECK_OK(deft_memory_empty_cache(cpu));
    CHECK_ERR(deft_caching_free(cpu, keep), DEFT_ERR_INVALID, "segment was given back");
    CHECK_ERR(deft_memory_stats_get((deft_device){(deft_device_type)7, 0}, &after), DEFT_ERR_DEVICE, "");
    check_empty();
}

static void test_stream_order(void) {
    deft_memory_stats s0 = stats();
    void *a = alloc_on(1000, S1, "s1");
    release(a);
    void *b = alloc_on(1000, S2, "s2");   /* S1's cached block is not S2's to take */
    CHECK(b != a);
    CHECK(stats().num_device_alloc == s0.num_device_alloc + 2);
    void *c = alloc_on(1000, S1, "s1 again");
    CHECK(c == a);
    /* On the CPU a block used by another stream is free at once. */
    CHECK_OK(deft_caching_record_stream(cpu, c, S2));
    release(c);
    CHECK(stats().active_bytes.current == 1024);
    release(b);
    /* S1's and S2's segments are cached, and neither is the default stream's. */
    deft_memory_stats s1 = stats();
    void *d = alloc_on(1000, NULL, "default");
    CHECK(stats().num_device_alloc == s1.num_device_alloc + 1);
    release(d);
    consistent();
    check_empty();
}

/* Blocks that wait for other streams, with the fake events of alloc_test.h. */
static void test_record_stream(void) {
    CHECK_OK(deft_testing_caching_set_event_hooks(DEFT_CPU, &fake_hooks));
    void *a = alloc_on(1000, S1, "shared");
    CHECK_OK(deft_caching_record_stream(cpu, a, S2));
    CHECK_OK(deft_caching_record_stream(cpu, a, S2));   /* once per stream */
    CHECK_OK(deft_caching_record_stream(cpu, a, S1));   /* its own stream: nothing to record */
    release(a);
    CHECK(n_fake_events == 1);
    deft_memory_stats s = stats();
    CHECK(s.allocated_bytes.current == 0 && s.active_bytes.current == 1024 && s.allocation.current == 0);
    consistent();
    CHECK_ERR(deft_caching_free(cpu, a), DEFT_ERR_INVALID, "waits on another stream");
    CHECK_ERR(deft_testing_caching_set_event_hooks(DEFT_CPU, NULL), DEFT_ERR_STATE, "still wait");

    void *b = alloc_on(1000, S1, "meanwhile");   /* a still waits: not reused */
    CHECK(b != a);
    fake_events[0].done = 1;
    void *c = alloc_on(1000, S1, "after");   /* the event is seen, a is free again and the best fit */
    CHECK(c == a && fake_events[0].destroyed == 1);
    CHECK(stats().active_bytes.current == 2048);

    /* empty_cache waits for what is pending, so the segment can go back. */
    CHECK_OK(deft_caching_record_stream(cpu, c, S2));
    release(c);
    release(b);
    CHECK(n_fake_events == 2 && !fake_events[1].done);
    CHECK_OK(deft_memory_empty_cache(cpu));
    CHECK(fake_events[1].waited && fake_events[1].destroyed == 1);
    CHECK_OK(deft_testing_caching_set_event_hooks(DEFT_CPU, NULL));
    CHECK_ERR(deft_testing_caching_set_event_hooks(DEFT_CPU, &(deft_testing_event_hooks){0}), DEFT_ERR_INVALID, "hook");
    check_empty();
}

static char *read_all(FILE *f) {
    long n = ftell(f);
    char *buf = calloc((size_t)n + 1, 1);
    rewind(f);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) buf[0] = '\0';
    return buf;
}

/* Runs first, in a fresh process, so that every figure of the table is known. */
static void test_summary(void) {
    CHECK_OK(deft_memory_set_limit(cpu, 64 * MiB));
    void *a = alloc(1000);
    release(alloc(3000));
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f) return;
    CHECK_OK(deft_memory_summary(cpu, f));
    char *text = read_all(f);
    fclose(f);
    if (!text) return;
    static const char *const rows[] = {
        "|                        deft memory summary, device cpu                        |",
        "| OOMs: 0                               | Allocation retries: 0                 |",
        "| Device allocs: 1                      | Device frees: 0                       |",
        "| Memory limit: 64.00 MiB                                                       |",
        "| Metric                |   Cur Usage |  Peak Usage |   Tot Alloc |   Tot Freed |",
        /* 1024 + 3072 were handed out; the 3072 came back; the peak held both */
        "| Allocated memory      |    1.00 KiB |    4.00 KiB |    4.00 KiB |    3.00 KiB |",
        "| Active memory         |    1.00 KiB |    4.00 KiB |    4.00 KiB |    3.00 KiB |",
        "| Requested memory      |  1000 bytes |    3.91 KiB |    3.91 KiB |    2.93 KiB |",
        "| Reserved memory       |    2.00 MiB |    2.00 MiB |    2.00 MiB |     0 bytes |",
        "| Allocations           |           1 |           2 |           2 |           1 |",
        "| Segments              |           1 |           1 |           1 |           0 |",
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        CHECK_MSG(strstr(text, rows[i]) != NULL, "the summary lacks the row\n%s\nin\n%s", rows[i], text);
    /* every line is as wide as the frame */
    for (char *line = text, *end; (end = strchr(line, '\n')); line = end + 1)
        CHECK_MSG(end - line == 81, "a summary line is %d wide: %.*s", (int)(end - line), (int)(end - line), line);
    free(text);
    release(a);
    CHECK_OK(deft_memory_set_limit(cpu, 0));
    CHECK_OK(deft_memory_summary(cpu, NULL));   /* to stdout, for the log */
    check_empty();
}

/* Many threads on one pool (alloc_test_threads runs them). */
static deft_status churn_take(size_t bytes, uint32_t x, void **out) {
    return deft_caching_alloc(cpu, bytes, (x >> 10) % 3 == 0 ? S1 : NULL, "thread", out);
}

static deft_status churn_give(void *p) { return deft_caching_free(cpu, p); }

static void test_threads(void) { alloc_test_threads(&pool, &(alloc_test_churn){churn_take, churn_give}); }

/* A long random sequence, checked against every invariant as it goes; some blocks on another stream. */
static void *random_alloc(size_t bytes, uint32_t x) { return alloc_on(bytes, (x & 0x400) ? S2 : NULL, "random"); }

static void test_random(void) { alloc_test_random(&pool, random_alloc); }

int main(void) {
    cpu = deft_cpu();
    test_summary();
    test_counters();
    test_rounding_and_pools();
    test_split_and_merge();
    test_limit_and_oom();
    test_bad_free();
    test_stream_order();
    test_record_stream();
    test_threads();
    test_random();
    return deft_check_finish();
}
