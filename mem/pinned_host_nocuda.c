/* The pinned host allocator in a build without CUDA: no memory can be page-locked for a GPU, so
 * pinned_allocator.c always chooses plain host memory and never calls these; they exist so that it links, and say
 * so if they are ever reached. */
#include "base.h"
#include "pinned_allocator.h"

deft_status deft_pinned_host_alloc(int index, size_t bytes, void **out) {
    (void)index;
    *out = NULL;
    return deft_set_error(DEFT_ERR_NO_CUDA, "deft was built without CUDA: %zu bytes cannot be page-locked", bytes);
}

void deft_pinned_host_free(int index, void *ptr) { (void)index, (void)ptr; }

static deft_status deft_nocuda_record(int index, void *stream, void **event) {
    (void)index, (void)stream;
    *event = NULL;
    return DEFT_OK;
}

static int deft_nocuda_query(int index, void *event) {
    (void)index, (void)event;
    return 1;
}

static void deft_nocuda_nothing(int index, void *event) { (void)index, (void)event; }

static const deft_caching_event_hooks deft_nocuda_hooks = {deft_nocuda_record, deft_nocuda_query, deft_nocuda_nothing,
                                                           deft_nocuda_nothing};

const deft_caching_event_hooks *deft_pinned_cuda_events(void) { return &deft_nocuda_hooks; }
