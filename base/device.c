/* Device values: what a deft_device names, compared and printed. Which devices exist is mem/device.c's. */
#include <stdio.h>

#include "base.h"

deft_device deft_cpu(void) { return (deft_device){DEFT_CPU, 0}; }

deft_device deft_cuda(int index) { return (deft_device){DEFT_CUDA, index}; }

int deft_device_equal(deft_device a, deft_device b) {
    return a.type == b.type && (a.type == DEFT_CPU || a.index == b.index);
}

const char *deft_device_str(deft_device d, char *buf, size_t n) {
    if (d.type == DEFT_CPU) snprintf(buf, n, "cpu");
    else snprintf(buf, n, "cuda:%d", d.index);
    return buf;
}

int deft_has_cuda_build(void) {
#ifdef DEFT_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}
