/* Without CUDA no CUDA pool can be used (deft_device_check refuses cuda:N first), but the pools still need hooks to
 * point at: these say there is never anything to wait for. */
#include "caching_allocator.h"

static deft_status deft_nocuda_event_record(int index, void *stream, void **event) {
    (void)index, (void)stream;
    *event = NULL;
    return DEFT_OK;
}

static int deft_nocuda_event_query(int index, void *event) {
    (void)index, (void)event;
    return 1;
}

static void deft_nocuda_event_nothing(int index, void *event) { (void)index, (void)event; }

static const deft_caching_event_hooks deft_nocuda_event_hooks = {deft_nocuda_event_record, deft_nocuda_event_query,
                                                                 deft_nocuda_event_nothing, deft_nocuda_event_nothing};

const deft_caching_event_hooks *deft_caching_cuda_events(void) { return &deft_nocuda_event_hooks; }
