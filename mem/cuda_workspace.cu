/* Library scratch (cuBLAS, cuBLASLt, cuDNN) per device, stream and library. A library call leaves work in flight on
 * its stream that still uses the scratch, so two streams sharing one (two programs on one GPU, or a replayed CUDA
 * Graph and the eager run queued after it) would overwrite each other's partial results. The scratch of a stream is
 * allocated on its first use, from the caching allocator, and given back when the stream is destroyed. */
#include <mutex>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "caching_allocator.h"
#include "cuda_workspace.h"
#include "base.h"

typedef struct deft_stream_scratch {
    int dev;
    void *stream;
    void *ptr[DEFT_WORKSPACE_KINDS];
    size_t bytes[DEFT_WORKSPACE_KINDS];   /* its size; 0 until set or allocated: the kind's default */
} deft_stream_scratch;

static deft_stream_scratch *deft_scratch;
static int deft_n_scratch, deft_cap_scratch;
static std::mutex deft_scratch_lock;

static const size_t deft_workspace_size[DEFT_WORKSPACE_KINDS] = {
    DEFT_CUBLAS_WORKSPACE_BYTES, DEFT_CUDNN_WORKSPACE_BYTES, DEFT_NORM_WORKSPACE_BYTES};
static const size_t deft_workspace_zeroed[DEFT_WORKSPACE_KINDS] = {0, 0, (size_t)DEFT_NORM_COUNTERS * 4};
static const char *const deft_workspace_tag[DEFT_WORKSPACE_KINDS] = {"cublas.workspace", "cudnn.workspace",
                                                                     "batch_norm.workspace"};

/* The entry of (dev, stream), NULL if it has none; the caller holds the lock. */
static deft_stream_scratch *deft_scratch_lookup(int dev, void *stream) {
    for (int i = 0; i < deft_n_scratch; i++)
        if (deft_scratch[i].dev == dev && deft_scratch[i].stream == stream) return &deft_scratch[i];
    return NULL;
}

/* The entry of (dev, stream), made if new; NULL when the host is out of memory. */
static deft_stream_scratch *deft_scratch_entry(int dev, void *stream) {
    deft_stream_scratch *found = deft_scratch_lookup(dev, stream);
    if (found) return found;
    if (deft_n_scratch == deft_cap_scratch) {
        int cap = deft_cap_scratch ? 2 * deft_cap_scratch : 8;
        deft_stream_scratch *grown = (deft_stream_scratch *)realloc(deft_scratch, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        deft_scratch = grown;
        deft_cap_scratch = cap;
    }
    deft_stream_scratch *e = &deft_scratch[deft_n_scratch++];
    *e = deft_stream_scratch{dev, stream, {}, {}};
    return e;
}

static size_t deft_scratch_bytes(const deft_stream_scratch *e, int kind) {
    return e->bytes[kind] ? e->bytes[kind] : deft_workspace_size[kind];
}

deft_status deft_stream_workspace_limit(int dev, void *stream, deft_workspace_kind kind, size_t bytes) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    deft_stream_scratch *e = deft_scratch_entry(dev, stream);
    if (!e) return deft_set_error(DEFT_ERR_OOM, "cuda: out of host memory for the library workspaces");
    if (e->ptr[kind] && deft_scratch_bytes(e, kind) != bytes)
        return deft_set_error(DEFT_ERR_STATE, "cuda: the stream's %s is in use already", deft_workspace_tag[kind]);
    e->bytes[kind] = bytes;
    return DEFT_OK;
}

deft_status deft_stream_workspace(int dev, void *stream, deft_workspace_kind kind, void **out) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    deft_stream_scratch *e = deft_scratch_entry(dev, stream);
    if (!e) return deft_set_error(DEFT_ERR_OOM, "cuda: out of host memory for the library workspaces");
    if (!e->ptr[kind]) {
        void *p = NULL;
        deft_status s = deft_caching_alloc(deft_cuda(dev), deft_scratch_bytes(e, kind), stream,
                                           deft_workspace_tag[kind], &p);
        if (s != DEFT_OK) return s;
        cudaError_t ce = deft_workspace_zeroed[kind]
                             ? cudaMemsetAsync(p, 0, deft_workspace_zeroed[kind], (cudaStream_t)stream)
                             : cudaSuccess;
        if (ce != cudaSuccess) {
            (void)cudaGetLastError();
            (void)deft_caching_free(deft_cuda(dev), p);
            return deft_set_error(DEFT_ERR_RUNTIME, "cuda: zeroing the %s: %s", deft_workspace_tag[kind],
                                  cudaGetErrorString(ce));
        }
        e->ptr[kind] = p;
    }
    *out = e->ptr[kind];
    return DEFT_OK;
}

deft_status deft_stream_workspace_sized(int dev, void *stream, deft_workspace_kind kind, void **out, size_t *bytes) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        cs = cudaStreamCaptureStatusActive;   /* a stream that cannot be asked is treated as capturing */
    }
    *out = NULL;
    *bytes = 0;
    if (cs != cudaStreamCaptureStatusNone) {
        std::lock_guard<std::mutex> guard(deft_scratch_lock);
        const deft_stream_scratch *e = deft_scratch_lookup(dev, stream);
        *out = e ? e->ptr[kind] : NULL;
        *bytes = *out ? deft_scratch_bytes(e, kind) : 0;
        return DEFT_OK;
    }
    deft_status s = deft_stream_workspace(dev, stream, kind, out);
    if (s != DEFT_OK) return s;
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    *bytes = deft_scratch_bytes(deft_scratch_lookup(dev, stream), kind);   /* deft_stream_workspace made it */
    return DEFT_OK;
}

void *deft_stream_workspace_existing(int dev, void *stream, deft_workspace_kind kind) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    const deft_stream_scratch *e = deft_scratch_lookup(dev, stream);
    return e ? e->ptr[kind] : NULL;
}

void deft_stream_workspaces_release(int dev, void *stream) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    deft_stream_scratch *e = deft_scratch_lookup(dev, stream);
    if (!e) return;
    for (int k = 0; k < DEFT_WORKSPACE_KINDS; k++)
        if (e->ptr[k]) (void)deft_caching_free(deft_cuda(dev), e->ptr[k]);
    *e = deft_scratch[--deft_n_scratch];
}
