/* Without CUDA no program runs on a GPU, so a trace never times one; these answer DEFT_ERR_NO_CUDA. */
#include "trace.h"

static deft_status deft_trace_no_cuda(int device) {
    return deft_set_error(DEFT_ERR_NO_CUDA, "deft was built without CUDA: cuda:%d is not available", device);
}

deft_status deft_trace_event_new(int device, void **event) {
    *event = NULL;
    return deft_trace_no_cuda(device);
}

deft_status deft_trace_event_ms(int device, void *from, void *to, float *ms) {
    (void)from;
    (void)to;
    *ms = 0;
    return deft_trace_no_cuda(device);
}
