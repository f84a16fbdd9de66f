/* The CUDA side of the pinned host allocator (pinned_allocator.c): page-locked segments from cudaHostAlloc, and the
 * events that say when the streams a freed block was recorded on have passed it.
 *
 * Unlike a device pool, whose blocks only ever meet streams of its own GPU, a pinned block can feed copies on
 * streams of any GPU, and an event must be created on the device of the stream it is recorded on. That device is
 * asked of the stream (cudaStreamGetDevice, CUDA 12.8 on); NULL, cudaStreamLegacy and cudaStreamPerThread mean the
 * calling thread's current device, as they do for any CUDA call. Where that fails (an older runtime, or a stream
 * of another GPU than guessed), every other GPU is tried before giving up: an event that cannot be recorded
 * anywhere means the stream's context is broken and nothing queued on it will run again. The caller's current
 * device is always restored. */
#include <cuda_runtime_api.h>

#include "device_internal.h"
#include "base.h"
#include "pinned_allocator.h"

deft_status deft_pinned_host_alloc(int index, size_t bytes, void **out) {
    (void)index;
    *out = NULL;
    void *mem = NULL;
    cudaError_t e = cudaHostAlloc(&mem, bytes, cudaHostAllocDefault);
    if (e == cudaSuccess) {
        *out = mem;
        return DEFT_OK;
    }
    (void)cudaGetLastError();
    /* Our flags and pointer are valid, so an invalid value can only be the size: more than can ever be pinned. */
    if (e == cudaErrorMemoryAllocation || e == cudaErrorInvalidValue) return DEFT_ERR_OOM;
    return deft_set_error(DEFT_ERR_RUNTIME, "cudaHostAlloc of %zu bytes of pinned host memory failed: %s (%s)", bytes,
                          cudaGetErrorString(e), cudaGetErrorName(e));
}

void deft_pinned_host_free(int index, void *ptr) {
    (void)index;
    if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
}

static int deft_stream_is_implicit(cudaStream_t stream) {
    return stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

/* Creates an event on `dev` and records it on `stream`; `current` is made current again afterwards. */
static cudaError_t deft_record_on(int dev, int current, cudaStream_t stream, cudaEvent_t *out) {
    *out = NULL;
    cudaError_t e = dev == current ? cudaSuccess : cudaSetDevice(dev);
    cudaEvent_t ev = NULL;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ev, stream);
        if (e != cudaSuccess) (void)cudaEventDestroy(ev);
    }
    if (dev != current && cudaSetDevice(current) != cudaSuccess) (void)cudaGetLastError();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return e;
    }
    *out = ev;
    return cudaSuccess;
}

static deft_status deft_pinned_event_record(int index, void *stream, void **event) {
    (void)index;
    *event = NULL;
    cudaStream_t st = (cudaStream_t)stream;
    int current = 0;
    cudaError_t e = cudaGetDevice(&current);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "recording an event for a freed pinned block: cudaGetDevice failed: %s",
                              cudaGetErrorString(e));
    }
    int dev = current;
#if CUDART_VERSION >= 12080
    if (!deft_stream_is_implicit(st) && cudaStreamGetDevice(st, &dev) != cudaSuccess) {
        (void)cudaGetLastError();
        dev = current;
    }
#else
    (void)deft_stream_is_implicit;
#endif
    cudaEvent_t ev = NULL;
    e = deft_record_on(dev, current, st, &ev);
    for (int i = 0, n = deft_cuda_count(); e != cudaSuccess && !deft_stream_is_implicit(st) && i < n; i++)
        if (i != dev) e = deft_record_on(i, current, st, &ev);
    if (e != cudaSuccess)
        return deft_set_error(DEFT_ERR_RUNTIME, "recording an event on stream %p for a freed pinned block failed: %s",
                              stream, cudaGetErrorString(e));
    *event = ev;
    return DEFT_OK;
}

/* cudaErrorNotReady is an answer, not a failure: it is cleared so that it does not surface from a later call. Any
 * other error means the context is broken and nothing queued will run again, so the block is as good as free. */
static int deft_pinned_event_query(int index, void *event) {
    (void)index;
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();
    return e == cudaErrorNotReady ? 0 : 1;
}

static void deft_pinned_event_wait(int index, void *event) {
    (void)index;
    if (cudaEventSynchronize((cudaEvent_t)event) != cudaSuccess) (void)cudaGetLastError();
}

static void deft_pinned_event_destroy(int index, void *event) {
    (void)index;
    if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess) (void)cudaGetLastError();
}

static const deft_caching_event_hooks deft_pinned_event_hooks = {deft_pinned_event_record, deft_pinned_event_query,
                                                                 deft_pinned_event_wait, deft_pinned_event_destroy};

const deft_caching_event_hooks *deft_pinned_cuda_events(void) { return &deft_pinned_event_hooks; }
