/* Without CUDA no program runs on a GPU, so none of these is reached with a device; they answer DEFT_ERR_NO_CUDA. */
#include "program_graph.h"

static deft_status deft_graph_no_cuda(int device) {
    return deft_set_error(DEFT_ERR_NO_CUDA, "deft was built without CUDA: cuda:%d is not available", device);
}

deft_status deft_cuda_stream_create(int device, int side, void **stream) {
    (void)side;
    *stream = NULL;
    return deft_graph_no_cuda(device);
}

void deft_cuda_stream_destroy(int device, void *stream) {
    (void)device;
    (void)stream;
}

deft_status deft_cuda_capture_begin(int device, void *stream) {
    (void)stream;
    return deft_graph_no_cuda(device);
}

deft_status deft_cuda_capture_end(int device, void *stream, void **graph, void **exec) {
    (void)stream;
    *graph = *exec = NULL;
    return deft_graph_no_cuda(device);
}

deft_status deft_cuda_graph_launch(int device, void *exec, void *stream) {
    (void)exec;
    (void)stream;
    return deft_graph_no_cuda(device);
}

void deft_cuda_graph_destroy(int device, void *graph, void *exec) {
    (void)device;
    (void)graph;
    (void)exec;
}

deft_status deft_cuda_stream_sync(int device, void *stream) {
    (void)stream;
    return deft_graph_no_cuda(device);
}

size_t deft_cuda_stream_workspace_bytes(int device, void *stream, int asked) {
    (void)device, (void)stream, (void)asked;
    return 0;
}

deft_status deft_cuda_peer_enable(int device, int peer) {
    (void)peer;
    return deft_graph_no_cuda(device);
}

deft_status deft_cuda_copy_async(deft_device dst_dev, void *dst, deft_device src_dev, const void *src, size_t bytes,
                                 void *stream) {
    (void)dst;
    (void)src;
    (void)bytes;
    (void)stream;
    return deft_graph_no_cuda(dst_dev.type == DEFT_CUDA ? dst_dev.index : src_dev.index);
}
