/* The CUDA side of device_internal.h in a build without CUDA: no GPU exists, and every request for one is a clear
 * DEFT_ERR_NO_CUDA rather than a crash or a link error, so the same program runs everywhere on the CPU. */
#include "device_internal.h"
#include "base.h"

static deft_status deft_no_cuda(int index) {
    return deft_set_error(DEFT_ERR_NO_CUDA,
                          "deft was built without CUDA: cuda:%d is not available (rebuild with -DDEFT_CUDA=ON)",
                          index);
}

int deft_cuda_count(void) { return 0; }

/* Without CUDA there is no runtime to start. */
int deft_cuda_started(void) { return 0; }

deft_status deft_cuda_name(int index, char *buf, size_t n) {
    if (buf && n) buf[0] = '\0';
    return deft_no_cuda(index);
}

deft_status deft_cuda_memory(int index, size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return deft_no_cuda(index);
}

deft_status deft_cuda_alloc(int index, size_t bytes, void **out) {
    (void)bytes;
    if (out) *out = NULL;
    return deft_no_cuda(index);
}

/* Nothing can have been allocated, so there is nothing to free. */
void deft_cuda_free(int index, void *ptr) {
    (void)index;
    (void)ptr;
}

deft_status deft_cuda_copy(int dst_index, void *dst, int src_index, const void *src, size_t bytes, int kind) {
    (void)dst;
    (void)src;
    (void)bytes;
    return deft_no_cuda(kind == 1 ? src_index : dst_index);
}

deft_status deft_cuda_synchronize(int index) { return deft_no_cuda(index); }

deft_status deft_cuda_set_device(int index) { return deft_no_cuda(index); }

/* No device to ask: the fallback, so that sizes derived from it stay sensible. */
int deft_cuda_sm_count(int index) {
    (void)index;
    return DEFT_CUDA_SMS_FALLBACK;
}
