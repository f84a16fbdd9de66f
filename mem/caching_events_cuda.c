/* CUDA events for the caching allocator: how it learns, without callbacks, that the other streams a freed block was
 * used on have finished with it (see deft_caching_record_stream). */
#include <cuda_runtime_api.h>

#include "caching_allocator.h"
#include "base.h"

/* An event belongs to the device current when it is created and must be recorded on a stream of that device, so
 * `index` is made current for the call and the caller's device is restored. */
static deft_status deft_cuda_event_record(int index, void *stream, void **event) {
    *event = NULL;
    int prev = index;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != index) e = cudaSetDevice(index);
    cudaEvent_t ev = NULL;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ev, (cudaStream_t)stream);
        if (e != cudaSuccess) (void)cudaEventDestroy(ev);
    }
    if (prev != index && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "recording an event for a freed block on cuda:%d failed: %s", index,
                              cudaGetErrorString(e));
    }
    *event = ev;
    return DEFT_OK;
}

/* cudaErrorNotReady is an answer, not a failure: it is cleared so that it does not surface from a later call. Any
 * other error means the context is broken and nothing queued will run again, so the block is as good as free. */
static int deft_cuda_event_query(int index, void *event) {
    (void)index;
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();
    return e == cudaErrorNotReady ? 0 : 1;
}

static void deft_cuda_event_wait(int index, void *event) {
    (void)index;
    if (cudaEventSynchronize((cudaEvent_t)event) != cudaSuccess) (void)cudaGetLastError();
}

static void deft_cuda_event_destroy(int index, void *event) {
    (void)index;
    if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess) (void)cudaGetLastError();
}

static const deft_caching_event_hooks deft_cuda_event_hooks = {deft_cuda_event_record, deft_cuda_event_query,
                                                               deft_cuda_event_wait, deft_cuda_event_destroy};

const deft_caching_event_hooks *deft_caching_cuda_events(void) { return &deft_cuda_event_hooks; }
