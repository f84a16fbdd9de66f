/* Without CUDA no kernel runs on a GPU, so no device error record exists: there is never anything to report. */
#include "device_errors.h"
#include "base.h"

deft_status deft_device_errors_get(int device, void *stream, deft_device_errors **out) {
    (void)stream;
    *out = NULL;
    return deft_set_error(DEFT_ERR_NO_CUDA, "deft was built without CUDA: cuda:%d is not available", device);
}

deft_status deft_device_errors_take(int device) {
    (void)device;
    return DEFT_OK;
}

void deft_device_errors_release(int device) { (void)device; }
