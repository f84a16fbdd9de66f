/* The CUDA side of prefetching (runtime/prefetch.c): the copy streams, events and asynchronous host-to-device
 * copies. Every call makes its device current first, as the rest of runtime/ does. */
#include <pthread.h>

#include <cuda_runtime_api.h>

#include "device_internal.h"
#include "prefetch.h"

#define DEFT_COPY_STREAMS 64   /* GPUs with a copy stream; a device index past it is refused with a message */

static pthread_mutex_t deft_copy_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t deft_copy_streams[DEFT_COPY_STREAMS];

static deft_status deft_prefetch_fail(cudaError_t e, const char *what, int device) {
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "%s on cuda:%d failed: %s (%s)", what, device, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

/* Non-blocking: a copy of the next batch must not wait for the legacy stream's synchronous reads of the last loss,
 * nor they for it. The stream lives until the process exits (like PyTorch's stream pool). */
deft_status deft_prefetch_cuda_copy_stream(int device, void **stream) {
    *stream = NULL;
    if (device < 0 || device >= DEFT_COPY_STREAMS)
        return deft_set_error(DEFT_ERR_DEVICE, "prefetch: cuda:%d is past the %d GPUs prefetching supports", device,
                              DEFT_COPY_STREAMS);
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    pthread_mutex_lock(&deft_copy_mu);
    if (!deft_copy_streams[device]) {
        cudaError_t e = cudaStreamCreateWithFlags(&deft_copy_streams[device], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            deft_copy_streams[device] = NULL;
            s = deft_prefetch_fail(e, "cudaStreamCreateWithFlags (the copy stream)", device);
        }
    }
    *stream = deft_copy_streams[device];
    pthread_mutex_unlock(&deft_copy_mu);
    return s;
}

deft_status deft_prefetch_cuda_event_new(int device, void **event) {
    *event = NULL;
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return deft_prefetch_fail(e, "cudaEventCreateWithFlags", device);
    *event = ev;
    return DEFT_OK;
}

void deft_prefetch_cuda_event_free(int device, void *event) {
    if (!event || deft_cuda_set_device(device) != DEFT_OK) return;
    if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess) (void)cudaGetLastError();
}

deft_status deft_prefetch_cuda_record(int device, void *event, void *stream) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
    return e == cudaSuccess ? DEFT_OK : deft_prefetch_fail(e, "cudaEventRecord", device);
}

deft_status deft_prefetch_cuda_stream_wait(int device, void *stream, void *event) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
    return e == cudaSuccess ? DEFT_OK : deft_prefetch_fail(e, "cudaStreamWaitEvent", device);
}

deft_status deft_prefetch_cuda_event_sync(int device, void *event) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)event);
    return e == cudaSuccess ? DEFT_OK : deft_prefetch_fail(e, "cudaEventSynchronize", device);
}

/* cudaErrorNotReady is an answer, not a failure: it is cleared so that it does not surface from a later call. */
int deft_prefetch_cuda_event_done(int device, void *event, deft_status *status) {
    *status = deft_cuda_set_device(device);
    if (*status != DEFT_OK) return 0;
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    *status = deft_prefetch_fail(e, "cudaEventQuery", device);
    return 0;
}

deft_status deft_prefetch_cuda_copy_h2d(int device, void *dst, const void *src, size_t bytes, void *stream) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream);
    return e == cudaSuccess ? DEFT_OK : deft_prefetch_fail(e, "cudaMemcpyAsync (host to device)", device);
}

int deft_prefetch_cuda_host_is_pinned(const void *host) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, host);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
}
