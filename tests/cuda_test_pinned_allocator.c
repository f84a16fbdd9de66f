/* The pinned host allocator with a GPU: its blocks are page-locked, real copies run from them, and a block freed
 * while a copy on a stream still reads it is not handed out again until that stream has passed the free.
 *
 * Streams are held still from the host, not with kernels: cudaLaunchHostFunc queues a host function that waits for
 * the test to open a gate, so the copy queued behind it cannot run before the test says so. While a gate is closed
 * the test makes no call that may synchronise with the device (cudaMalloc, cudaFree, cudaHostAlloc, synchronous
 * copies): the allocations it makes are served from segments already cached, which it checks. A gate opens by
 * itself after GATE_TIMEOUT_S, so a bug shows as a failed check rather than a hang. Skips (77) where no GPU works. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "deft_testing.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#define KiB ((size_t)1024)
#define N (256 * KiB)   /* a small-pool block: eight of them fit one cached 2 MiB segment */
#define GATE_TIMEOUT_S 20.0

#include "cuda_util.h"

static void nap(void) {
    struct timespec ts = {0, 100000};   /* 0.1 ms */
    nanosleep(&ts, NULL);
}

static deft_memory_stats stats(void) {
    deft_memory_stats s;
    memset(&s, 0xff, sizeof s);
    CHECK_OK(deft_pinned_stats(&s));
    return s;
}

static unsigned char *palloc(size_t bytes) {
    void *p = NULL;
    CHECK_OK(deft_pinned_alloc(bytes, &p));
    CHECK(p != NULL);
    return p;
}

static void release(void *p) { CHECK_OK(deft_pinned_free(p)); }

static void check_empty(void) {
    CHECK_OK(deft_pinned_empty_cache());
    deft_memory_stats s = stats();
    CHECK(s.allocated_bytes.current == 0 && s.reserved_bytes.current == 0 && s.active_bytes.current == 0);
    CHECK_OK(deft_pinned_check());
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + seed);
}

static int has_pattern(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 7 + seed)) return 0;
    return 1;
}

/* ---- gates: a stream held still by a host function until the test opens it ---- */

typedef struct gate {
    atomic_int open, entered, timed_out;
} gate;

static void CUDART_CB gate_hold(void *arg) {
    gate *g = arg;
    atomic_store(&g->entered, 1);
    double t0 = now_s();
    while (!atomic_load(&g->open)) {
        if (now_s() - t0 > GATE_TIMEOUT_S) {
            atomic_store(&g->timed_out, 1);
            return;
        }
        nap();
    }
}

static void gate_close(gate *g, cudaStream_t s) {
    atomic_store(&g->open, 0);
    atomic_store(&g->entered, 0);
    atomic_store(&g->timed_out, 0);
    CUDA_OK(cudaLaunchHostFunc(s, gate_hold, g));
}

static void gate_open(gate *g) { atomic_store(&g->open, 1); }

/* The stream has not got past the gate: the premise of every "not yet" check below. */
static void check_held(cudaStream_t s, const gate *g) {
    cudaError_t e = cudaStreamQuery(s);
    (void)cudaGetLastError();
    CHECK_MSG(e == cudaErrorNotReady, "the gated stream is not busy: %s", cudaGetErrorString(e));
    CHECK(!atomic_load(&g->timed_out));
}

/* ---- tests ---- */

static void test_page_locked(void) {
    unsigned char *p = palloc(1000);
    CHECK(deft_pinned_is_page_locked(p) == 1 && deft_pinned_is_page_locked(p + 999) == 1);
    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof attr);
    CUDA_OK(cudaPointerGetAttributes(&attr, p));
    CHECK_MSG(attr.type == cudaMemoryTypeHost, "cudaPointerGetAttributes says type %d", (int)attr.type);
    void *m = malloc(64);
    CHECK(deft_pinned_is_page_locked(m) == 0);
    free(m);

    /* A round trip through the GPU, asynchronous both ways, from one pinned block to another. */
    unsigned char *back = palloc(N), *src = palloc(N);
    void *d = NULL;
    cudaStream_t s = NULL;
    CUDA_OK(cudaMalloc(&d, N));
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fill(src, N, 3);
    memset(back, 0, N);
    CUDA_OK(cudaMemcpyAsync(d, src, N, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(back, d, N, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(has_pattern(back, N, 3));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(d));
    release(p), release(src), release(back);
    CHECK(deft_pinned_is_page_locked(p) == 0);
    check_empty();
}

/* A copy on a non-default stream reads block p after it is freed: p stays out of reuse until the stream is past. */
static void test_stream_holds_block(void) {
    cudaStream_t s = NULL;
    void *d = NULL;
    unsigned char *out = malloc(N);
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&d, N));
    unsigned char *p = palloc(N);
    fill(p, N, 1);
    deft_memory_stats s0 = stats();
    CHECK(s0.reserved_bytes.current == (int64_t)(2 * KiB * KiB));

    static gate g;
    gate_close(&g, s);
    CUDA_OK(cudaMemcpyAsync(d, p, N, cudaMemcpyHostToDevice, s));   /* queued behind the gate */
    CHECK_OK(deft_pinned_record_stream(p, s));
    release(p);   /* returns at once: the free never waits */
    deft_memory_stats s1 = stats();
    CHECK(s1.allocated_bytes.current == 0 && s1.active_bytes.current == (int64_t)N);
    check_held(s, &g);

    unsigned char *q = palloc(N);   /* p is pending: another block, from the same cached segment */
    CHECK_MSG(q != p && (q >= p + N || q + N <= p), "p = %p was handed out again as %p while a copy reads it",
              (void *)p, (void *)q);
    fill(q, N, 200);   /* would corrupt the copy if q were p */
    release(q);
    unsigned char *r = palloc(N);
    CHECK(r != p);
    check_held(s, &g);
    release(r);
    CHECK(stats().num_device_alloc == s0.num_device_alloc);   /* nothing was asked of CUDA while the gate held */

    gate_open(&g);
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(atomic_load(&g.entered) && !atomic_load(&g.timed_out));
    unsigned char *p2 = palloc(N);   /* the event has completed: p is free again, and the best fit */
    CHECK_MSG(p2 == p, "after the stream passed the free, got %p rather than %p", (void *)p2, (void *)p);
    CHECK(stats().active_bytes.current == (int64_t)N);
    CUDA_OK(cudaMemcpy(out, d, N, cudaMemcpyDeviceToHost));
    CHECK_MSG(has_pattern(out, N, 1), "the copy did not read what p held when it was queued");
    release(p2);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(s));
    free(out);
    check_empty();
}

/* The same on the legacy default stream (NULL), and deft_pinned_empty_cache waiting for a pending block. */
static void test_default_stream(void) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, N));
    unsigned char *p = palloc(N);
    fill(p, N, 5);
    deft_memory_stats s0 = stats();
    static gate g;
    gate_close(&g, NULL);
    CUDA_OK(cudaMemcpyAsync(d, p, N, cudaMemcpyHostToDevice, NULL));
    CHECK_OK(deft_pinned_record_stream(p, NULL));
    release(p);
    check_held(NULL, &g);
    unsigned char *q = palloc(N);
    CHECK_MSG(q != p, "p = %p was handed out again while the default stream reads it", (void *)p);
    fill(q, N, 100);
    release(q);
    CHECK(stats().num_device_alloc == s0.num_device_alloc);
    gate_open(&g);
    CHECK_OK(deft_pinned_empty_cache());   /* waits for p's event, then the whole segment goes back */
    deft_memory_stats s = stats();
    CHECK(s.reserved_bytes.current == 0 && s.active_bytes.current == 0);
    CHECK(s.num_device_free == s0.num_device_free + 1);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(!atomic_load(&g.timed_out));
    unsigned char *out = malloc(N);
    CUDA_OK(cudaMemcpy(out, d, N, cudaMemcpyDeviceToHost));
    CHECK(has_pattern(out, N, 5));
    free(out);
    CUDA_OK(cudaFree(d));
    check_empty();
}

/* Two streams recorded: the block waits for both; and its return is seen by polling, without synchronising. */
static void test_two_streams(void) {
    cudaStream_t s1 = NULL, s2 = NULL;
    void *d1 = NULL, *d2 = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&d1, N));
    CUDA_OK(cudaMalloc(&d2, N));
    unsigned char *p = palloc(N);
    fill(p, N, 9);
    static gate g1, g2;
    gate_close(&g1, s1);
    gate_close(&g2, s2);
    CUDA_OK(cudaMemcpyAsync(d1, p, N, cudaMemcpyHostToDevice, s1));
    CUDA_OK(cudaMemcpyAsync(d2, p, N, cudaMemcpyHostToDevice, s2));
    CHECK_OK(deft_pinned_record_stream(p, s1));
    CHECK_OK(deft_pinned_record_stream(p, s2));
    release(p);

    gate_open(&g1);
    CUDA_OK(cudaStreamSynchronize(s1));
    check_held(s2, &g2);
    unsigned char *q = palloc(N);   /* s1 is past, s2 is not: p still waits */
    CHECK_MSG(q != p, "p = %p was handed out again while s2 still reads it", (void *)p);
    fill(q, N, 77);
    release(q);

    gate_open(&g2);
    double t0 = now_s();
    unsigned char *p2 = NULL;
    while (now_s() - t0 < GATE_TIMEOUT_S) {   /* no synchronisation: the allocator itself sees the events done */
        p2 = palloc(N);
        if (p2 == p) break;
        release(p2);
        p2 = NULL;
        nap();
    }
    CHECK_MSG(p2 == p, "p did not come back after both streams passed it");
    CUDA_OK(cudaStreamSynchronize(s2));
    unsigned char *out = malloc(N);
    CUDA_OK(cudaMemcpy(out, d1, N, cudaMemcpyDeviceToHost));
    CHECK(has_pattern(out, N, 9));
    CUDA_OK(cudaMemcpy(out, d2, N, cudaMemcpyDeviceToHost));
    CHECK(has_pattern(out, N, 9));
    free(out);
    if (p2) release(p2);
    CUDA_OK(cudaFree(d1));
    CUDA_OK(cudaFree(d2));
    CUDA_OK(cudaStreamDestroy(s1));
    CUDA_OK(cudaStreamDestroy(s2));
    CHECK(!atomic_load(&g1.timed_out) && !atomic_load(&g2.timed_out));
    check_empty();
}

/* A stream of another GPU than the current one: the event goes on that GPU, and the current device is kept. */
static void test_other_device(void) {
    if (deft_cuda_device_count() < 2) {
        printf("one GPU: the cross-device case is skipped\n");
        return;
    }
    cudaStream_t s = NULL;
    void *d = NULL;
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&d, N));
    CUDA_OK(cudaSetDevice(0));
    unsigned char *p = palloc(N);   /* taken while cuda:0 is current; with unified addressing every GPU can use it */
    fill(p, N, 11);
    static gate g;
    CUDA_OK(cudaSetDevice(1));   /* the work is queued from cuda:1 ... */
    gate_close(&g, s);
    CUDA_OK(cudaMemcpyAsync(d, p, N, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaSetDevice(0));   /* ... and freed with cuda:0 current: the event must still go on cuda:1 */
    CHECK_OK(deft_pinned_record_stream(p, s));
    release(p);
    int cur = -1;
    CUDA_OK(cudaGetDevice(&cur));
    CHECK(cur == 0);
    check_held(s, &g);
    unsigned char *q = palloc(N);
    CHECK_MSG(q != p, "p = %p was handed out again while a stream of cuda:1 reads it", (void *)p);
    release(q);
    gate_open(&g);
    CUDA_OK(cudaStreamSynchronize(s));
    unsigned char *p2 = palloc(N);
    CHECK(p2 == p);
    release(p2);
    unsigned char *out = malloc(N);
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMemcpy(out, d, N, cudaMemcpyDeviceToHost));
    CHECK(has_pattern(out, N, 11));
    free(out);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaSetDevice(0));
    CHECK(!atomic_load(&g.timed_out));
    check_empty();
}

/* More than the host will ever pin: cudaHostAlloc refuses, and the error says what was asked and what is cached. */
static void test_oom(void) {
    deft_memory_stats s0 = stats();
    void *p = (void *)1;
    CHECK_ERR(deft_pinned_alloc((size_t)1 << 50, &p), DEFT_ERR_OOM,
              "out of memory on pinned host memory: tried to allocate 1.00 PiB");
    CHECK(p == NULL && stats().num_ooms == s0.num_ooms + 1);
    CUDA_OK(cudaGetLastError());   /* the failure left no CUDA error behind */
    release(palloc(1000));
    check_empty();
}
#endif

int main(void) {
    if (deft_cuda_device_count() == 0) {
        printf("no usable GPU: skipped\n");
        return DEFT_CHECK_SKIP;
    }
#ifdef DEFT_HAVE_CUDA
    CUDA_OK(cudaSetDevice(0));
    check_empty();
    test_page_locked();
    test_stream_holds_block();
    test_default_stream();
    test_two_streams();
    test_other_device();
    test_oom();
#endif
    return deft_check_finish();
}
