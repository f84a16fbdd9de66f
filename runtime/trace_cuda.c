/* The timing events of a trace (runtime/trace.h); recorded and freed as prefetch's events are (prefetch.h). Every call makes its device current first, as the rest of
 * runtime/ does. */
#include <cuda_runtime_api.h>

#include "device_internal.h"
#include "trace.h"

static deft_status deft_trace_fail(cudaError_t e, const char *what, int device) {
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "trace: %s on cuda:%d failed: %s (%s)", what, device,
                          cudaGetErrorString(e), cudaGetErrorName(e));
}

deft_status deft_trace_event_new(int device, void **event) {
    *event = NULL;
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreate(&ev);   /* with timing, unlike the ordering events of runtime/ */
    if (e != cudaSuccess) return deft_trace_fail(e, "cudaEventCreate", device);
    *event = ev;
    return DEFT_OK;
}

deft_status deft_trace_event_ms(int device, void *from, void *to, float *ms) {
    *ms = 0;
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)to);
    if (e != cudaSuccess) return deft_trace_fail(e, "cudaEventSynchronize", device);
    e = cudaEventElapsedTime(ms, (cudaEvent_t)from, (cudaEvent_t)to);
    return e == cudaSuccess ? DEFT_OK : deft_trace_fail(e, "cudaEventElapsedTime", device);
}
