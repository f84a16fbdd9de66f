/* The caching allocator on cuda:0: the CPU test's counter sequence, the limit, a real device OOM, bad frees, and
 * stream-ordered reuse with real streams and events. Skips (77) where no GPU works. */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MiB ((size_t)1024 * 1024)

static deft_device gpu;

static deft_memory_stats stats(void) {
    deft_memory_stats s;
    memset(&s, 0xff, sizeof s);
    CHECK_OK(deft_memory_stats_get(gpu, &s));
    return s;
}

static void *alloc_on(size_t bytes, void *stream) {
    void *p = NULL;
    CHECK_OK(deft_caching_alloc(gpu, bytes, stream, "cuda test", &p));
    CHECK(p != NULL);
    return p;
}

static void release(void *p) { CHECK_OK(deft_caching_free(gpu, p)); }

static void check_empty(void) {
    CHECK_OK(deft_memory_empty_cache(gpu));
    deft_memory_stats s = stats();
    CHECK(s.allocated_bytes.current == 0 && s.reserved_bytes.current == 0 && s.active_bytes.current == 0);
    CHECK_OK(deft_caching_check(gpu));
}

/* The block is real device memory: a round trip through it keeps the bytes. */
static void check_usable(void *p, size_t bytes) {
    unsigned char in[1000], out[1000];
    size_t n = bytes < sizeof in ? bytes : sizeof in;
    for (size_t i = 0; i < n; i++) in[i] = (unsigned char)(i * 7 + 1);
    memset(out, 0, sizeof out);
    CHECK_OK(deft_mem_copy(gpu, p, deft_cpu(), in, n));
    CHECK_OK(deft_mem_copy(deft_cpu(), out, gpu, p, n));
    CHECK(memcmp(in, out, n) == 0);
}

static void test_counters(void) {
    CHECK_OK(deft_memory_reset_peak(gpu));
    deft_memory_stats s0 = stats();
    void *a = alloc_on(1000, NULL);
    CHECK((uintptr_t)a % 256 == 0);
    check_usable(a, 1000);
    deft_memory_stats s = stats();
    CHECK(s.allocated_bytes.current == 1024 && s.requested_bytes.current == 1000 && s.active_bytes.current == 1024);
    CHECK(s.reserved_bytes.current == (int64_t)(2 * MiB) && s.segment.current == 1);
    CHECK(s.num_device_alloc - s0.num_device_alloc == 1);
    release(a);
    s = stats();
    CHECK(s.allocated_bytes.current == 0 && s.reserved_bytes.current == (int64_t)(2 * MiB));
    void *b = alloc_on(1000, NULL);
    CHECK(b == a && stats().num_device_alloc - s0.num_device_alloc == 1);
    release(b);
    CHECK_OK(deft_memory_empty_cache(gpu));
    s = stats();
    CHECK(s.reserved_bytes.current == 0 && s.num_device_free - s0.num_device_free == 1);
    CHECK(s.allocated_bytes.peak == 1024 && s.reserved_bytes.peak == (int64_t)(2 * MiB));
    CHECK_OK(deft_memory_reset_peak(gpu));
    CHECK(stats().reserved_bytes.peak == 0);
    check_empty();
}

static void test_limit_and_oom(void) {
    deft_memory_stats s0 = stats();
    CHECK_OK(deft_memory_set_limit(gpu, 4 * MiB));
    void *a = alloc_on(3 * MiB, NULL);
    void *b = (void *)1;
    CHECK_ERR(deft_caching_alloc(gpu, 3 * MiB, NULL, "second", &b), DEFT_ERR_OOM,
              "out of memory on cuda:0: tried to allocate 3.00 MiB");
    CHECK(b == NULL && stats().num_ooms == s0.num_ooms + 1);
    release(a);
    check_empty();
    release(alloc_on(1000, NULL));   /* a cached 2 MiB segment that must go for the next request to fit */
    void *c = alloc_on(3 * MiB, NULL);
    CHECK(stats().num_alloc_retries == s0.num_alloc_retries + 1);
    release(c);
    CHECK_OK(deft_memory_set_limit(gpu, 0));
    check_empty();

    /* The device itself refuses: more than it has. */
    size_t free_b = 0, total_b = 0;
    CHECK_OK(deft_device_memory(gpu, &free_b, &total_b));
    void *d = (void *)1;
    CHECK_ERR(deft_caching_alloc(gpu, total_b + 64 * MiB, NULL, "too big", &d), DEFT_ERR_OOM,
              "out of memory on cuda:0: tried to allocate ");
    CHECK(d == NULL && strstr(deft_errmsg(), "reserved but unused (cached)") != NULL);
    CHECK(stats().num_ooms == s0.num_ooms + 2);
    check_empty();
}

static void test_bad_free(void) {
    void *a = alloc_on(1000, NULL);
    release(a);
    CHECK_ERR(deft_caching_free(gpu, a), DEFT_ERR_INVALID, "double free on cuda:0");
    int on_stack = 0;
    CHECK_ERR(deft_caching_free(gpu, &on_stack), DEFT_ERR_INVALID, "was not handed out");
    void *host = NULL;
    CHECK_OK(deft_caching_alloc(deft_cpu(), 100, NULL, NULL, &host));
    CHECK_ERR(deft_caching_free(gpu, host), DEFT_ERR_INVALID, "was not handed out");   /* the CPU's, not cuda:0's */
    CHECK_OK(deft_caching_free(deft_cpu(), host));
    check_empty();
}

#ifdef DEFT_HAVE_CUDA
static void test_streams(void) {
    cudaStream_t s1 = NULL, s2 = NULL;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
    void *a = alloc_on(1000, s1);
    release(a);
    void *b = alloc_on(1000, s2);   /* s1's cached block is not s2's to take */
    CHECK(b != a);
    void *c = alloc_on(1000, s1);
    CHECK(c == a);

    /* c is used on s2 too: after its free it waits for an event on s2, seen at the next allocation. */
    CHECK_OK(deft_caching_record_stream(gpu, c, s2));
    release(c);
    deft_memory_stats s = stats();
    CHECK(s.active_bytes.current == 2048 && s.allocated_bytes.current == 1024);
    CHECK_ERR(deft_caching_free(gpu, c), DEFT_ERR_INVALID, "waits on another stream");
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess);
    void *d = alloc_on(1000, s1);
    CHECK(d == a && stats().active_bytes.current == 2048);
    release(d);
    release(b);
    CHECK(cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess);
    check_empty();
}
#endif

static void test_snapshot(void) {
    CHECK_OK(deft_memory_record_history(16));
    void *a = alloc_on(1000, NULL);
    CHECK_OK(deft_memory_snapshot("cuda_test_caching_allocator.json"));
    FILE *f = fopen("cuda_test_caching_allocator.json", "r");
    char buf[8192] = {0};
    CHECK(f != NULL);
    if (f) {
        CHECK(fread(buf, 1, sizeof buf - 1, f) > 0);
        fclose(f);
    }
    CHECK(strstr(buf, "\"device\":\"cuda:0\"") != NULL);
    CHECK(strstr(buf, "\"state\":\"active_allocated\",\"tag\":\"cuda test\"") != NULL);
    CHECK(strstr(buf, "{\"action\":\"alloc\",\"device\":\"cuda:0\"") != NULL);
    CHECK_OK(deft_memory_record_history(0));
    release(a);
    check_empty();
}

int main(void) {
    if (deft_cuda_device_count() == 0) {
        printf("no usable GPU: skipped\n");
        return DEFT_CHECK_SKIP;
    }
    gpu = deft_cuda(0);
    test_counters();
    test_limit_and_oom();
    test_bad_free();
#ifdef DEFT_HAVE_CUDA
    test_streams();
#endif
    test_snapshot();
    CHECK_OK(deft_memory_summary(gpu, NULL));
    return deft_check_finish();
}
