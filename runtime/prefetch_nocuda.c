/* Without CUDA no program runs on a GPU's stream, so runtime/prefetch.c never reaches these with a device; they
 * answer DEFT_ERR_NO_CUDA (or "nothing to wait for") so that it links. */
#include "prefetch.h"

static deft_status deft_prefetch_no_cuda(int device) {
    return deft_set_error(DEFT_ERR_NO_CUDA, "deft was built without CUDA: cuda:%d is not available", device);
}

deft_status deft_prefetch_cuda_copy_stream(int device, void **stream) {
    *stream = NULL;
    return deft_prefetch_no_cuda(device);
}

deft_status deft_prefetch_cuda_event_new(int device, void **event) {
    *event = NULL;
    return deft_prefetch_no_cuda(device);
}

void deft_prefetch_cuda_event_free(int device, void *event) { (void)device, (void)event; }

deft_status deft_prefetch_cuda_record(int device, void *event, void *stream) {
    (void)event, (void)stream;
    return deft_prefetch_no_cuda(device);
}

deft_status deft_prefetch_cuda_stream_wait(int device, void *stream, void *event) {
    (void)stream, (void)event;
    return deft_prefetch_no_cuda(device);
}

deft_status deft_prefetch_cuda_event_sync(int device, void *event) {
    (void)event;
    return deft_prefetch_no_cuda(device);
}

int deft_prefetch_cuda_event_done(int device, void *event, deft_status *status) {
    (void)device, (void)event;
    *status = DEFT_OK;
    return 1;
}

deft_status deft_prefetch_cuda_copy_h2d(int device, void *dst, const void *src, size_t bytes, void *stream) {
    (void)dst, (void)src, (void)bytes, (void)stream;
    return deft_prefetch_no_cuda(device);
}

int deft_prefetch_cuda_host_is_pinned(const void *host) {
    (void)host;
    return 0;
}
