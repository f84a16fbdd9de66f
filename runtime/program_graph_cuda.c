/* Streams and CUDA Graphs for programs (runtime/program_graph.c decides when). */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "cuda_workspace.h"
#include "device_internal.h"
#include "program_graph.h"

static deft_status deft_cuda_graph_error(cudaError_t e, const char *what, int device) {
    (void)cudaGetLastError();
    return deft_set_error(DEFT_ERR_RUNTIME, "%s on cuda:%d failed: %s (%s)", what, device, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

/* A blocking stream: the legacy stream's synchronous copies (feeds, reads, parameter updates from the host) stay
 * ordered with the program's kernels without extra events. */
deft_status deft_cuda_stream_create(int device, int side, void **stream) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaStream_t st;
    cudaError_t e = cudaStreamCreate(&st);
    if (e != cudaSuccess) return deft_cuda_graph_error(e, "cudaStreamCreate", device);
    if (side) s = deft_stream_workspace_limit(device, st, DEFT_WORKSPACE_CUDNN, DEFT_CUDNN_SIDE_WORKSPACE_BYTES);
    if (side && s == DEFT_OK)
        s = deft_stream_workspace_limit(device, st, DEFT_WORKSPACE_CUBLAS, DEFT_CUBLAS_SIDE_WORKSPACE_BYTES);
    if (s != DEFT_OK) {
        deft_cuda_stream_destroy(device, st);
        return s;
    }
    *stream = st;
    return DEFT_OK;
}

void deft_cuda_stream_destroy(int device, void *stream) {
    if (!stream || deft_cuda_set_device(device) != DEFT_OK) return;
    if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) (void)cudaGetLastError();
    deft_stream_workspaces_release(device, stream);
    if (cudaStreamDestroy((cudaStream_t)stream) != cudaSuccess) (void)cudaGetLastError();
}

/* Thread-local mode: another thread's unrelated CUDA calls do not invalidate this capture. */
deft_status deft_cuda_capture_begin(int device, void *stream) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal);
    return e == cudaSuccess ? DEFT_OK : deft_cuda_graph_error(e, "cudaStreamBeginCapture", device);
}

deft_status deft_cuda_capture_end(int device, void *stream, void **graph, void **exec) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    *graph = *exec = NULL;
    deft_status s = deft_cuda_set_device(device);   /* the steps of another GPU may have left theirs current */
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return deft_cuda_graph_error(e, "cudaStreamEndCapture", device);
    }
    e = cudaGraphInstantiate(&x, g, 0);
    if (e != cudaSuccess) {
        cudaGraphDestroy(g);
        return deft_cuda_graph_error(e, "cudaGraphInstantiate", device);
    }
    *graph = g;
    *exec = x;
    return DEFT_OK;
}

deft_status deft_cuda_graph_launch(int device, void *exec, void *stream) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
    return e == cudaSuccess ? DEFT_OK : deft_cuda_graph_error(e, "cudaGraphLaunch", device);
}

void deft_cuda_graph_destroy(int device, void *graph, void *exec) {
    if ((!graph && !exec) || deft_cuda_set_device(device) != DEFT_OK) return;
    if (exec && cudaGraphExecDestroy((cudaGraphExec_t)exec) != cudaSuccess) (void)cudaGetLastError();
    if (graph && cudaGraphDestroy((cudaGraph_t)graph) != cudaSuccess) (void)cudaGetLastError();
}

deft_status deft_cuda_stream_sync(int device, void *stream) {
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    return e == cudaSuccess ? DEFT_OK : deft_cuda_graph_error(e, "cudaStreamSynchronize", device);
}

size_t deft_cuda_stream_workspace_bytes(int device, void *stream, int asked) {
    size_t sum = 0;
    for (int k = 0; k < DEFT_WORKSPACE_KINDS; k++)
        sum += asked ? deft_stream_workspace_asked(device, stream, (deft_workspace_kind)k)
                     : deft_stream_workspace_held(device, stream, (deft_workspace_kind)k);
    return sum;
}

deft_status deft_cuda_peer_enable(int device, int peer) {
    int can = 0;
    cudaError_t e = cudaDeviceCanAccessPeer(&can, device, peer);
    if (e != cudaSuccess) return deft_cuda_graph_error(e, "cudaDeviceCanAccessPeer", device);
    if (!can) return DEFT_OK;
    deft_status s = deft_cuda_set_device(device);
    if (s != DEFT_OK) return s;
    /* Already enabled (by another program) is what was asked; a refusal (too many peers) leaves staged copies,
     * which are right too: neither fails the compile. */
    if (cudaDeviceEnablePeerAccess(peer, 0) != cudaSuccess) (void)cudaGetLastError();
    return DEFT_OK;
}

deft_status deft_cuda_copy_async(deft_device dst_dev, void *dst, deft_device src_dev, const void *src, size_t bytes,
                                 void *stream) {
    if (bytes == 0) return DEFT_OK;
    const int on = dst_dev.type == DEFT_CUDA ? dst_dev.index : src_dev.index;
    deft_status s = deft_cuda_set_device(on);
    if (s != DEFT_OK) return s;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    const char *what;
    if (dst_dev.type == DEFT_CUDA && src_dev.type == DEFT_CUDA && dst_dev.index != src_dev.index) {
        /* Unified addressing tells the GPUs apart; cudaMemcpyPeerAsync would do the same copy but cannot be
         * captured into a CUDA Graph (cudaErrorStreamCaptureUnsupported on an H200 pair, CUDA 13), this can. */
        what = "cudaMemcpyAsync (between GPUs)";
        e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st);
    } else {
        enum cudaMemcpyKind kind = dst_dev.type == DEFT_CPU   ? cudaMemcpyDeviceToHost
                                   : src_dev.type == DEFT_CPU ? cudaMemcpyHostToDevice
                                                              : cudaMemcpyDeviceToDevice;
        what = kind == cudaMemcpyDeviceToHost ? "cudaMemcpyAsync (to the host)" : "cudaMemcpyAsync (from the host)";
        if (kind == cudaMemcpyDeviceToDevice) what = "cudaMemcpyAsync (device to device)";
        e = cudaMemcpyAsync(dst, src, bytes, kind, st);
    }
    return e == cudaSuccess ? DEFT_OK : deft_cuda_graph_error(e, what, on);
}
