/* Library scratch (cuBLAS, cuBLASLt, cuDNN) per device, stream and library. A library call leaves work in flight on
 * its stream that still uses the scratch, so two streams sharing one (two programs on one GPU, or a replayed CUDA
 * Graph and the eager run queued after it) would overwrite each other's partial results. The scratch of a stream is
 * allocated from the caching allocator when a call first needs it, and given back when the stream is destroyed.
 *
 * It is sized to what the algorithms chosen on the stream ask for, not to a fixed size: each call asks for its
 * algorithm's workspace, and outside a capture the scratch grows to it (the old block is freed on the same stream,
 * so the allocator reuses it only after the work queued before). A program's first run is eager, so every problem
 * of its step has grown the scratch before the second run captures the step: a replay never needs more. A capture
 * only reads what the stream holds, and the scratch it took is frozen from then on, since the graph holds its
 * address; a larger need met later (an eager traced run) chooses again within what is held. */
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
    size_t bytes[DEFT_WORKSPACE_KINDS];    /* what ptr holds; 0 with ptr NULL */
    size_t cap[DEFT_WORKSPACE_KINDS];      /* 0: the kind's default */
    size_t asked[DEFT_WORKSPACE_KINDS];    /* the largest need met outside a capture, cut to the cap */
    bool frozen[DEFT_WORKSPACE_KINDS];     /* a capture took ptr: it never moves again */
} deft_stream_scratch;

static deft_stream_scratch *deft_scratch;
static int deft_n_scratch, deft_cap_scratch;
static std::mutex deft_scratch_lock;

static const size_t deft_workspace_default_cap[DEFT_WORKSPACE_KINDS] = {
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
    *e = deft_stream_scratch{dev, stream, {}, {}, {}, {}, {}};
    return e;
}

static size_t deft_scratch_cap(const deft_stream_scratch *e, int kind) {
    return e && e->cap[kind] ? e->cap[kind] : deft_workspace_default_cap[kind];
}

/* Whether `stream` is capturing into a CUDA Graph; a stream that cannot be asked counts as capturing. */
static bool deft_scratch_capturing(void *stream) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* Replaces e's scratch of `kind` by one of `bytes`; the caller holds the lock and has checked it may. On failure the
 * stream holds none (the old block is given back first, so that the allocator may reuse it for the new one). */
static deft_status deft_scratch_grow(deft_stream_scratch *e, int kind, size_t bytes) {
    if (e->ptr[kind]) (void)deft_caching_free(deft_cuda(e->dev), e->ptr[kind]);
    e->ptr[kind] = NULL;
    e->bytes[kind] = 0;
    void *p = NULL;
    deft_status s = deft_caching_alloc(deft_cuda(e->dev), bytes, e->stream, deft_workspace_tag[kind], &p);
    if (s != DEFT_OK) return s;
    cudaError_t ce = deft_workspace_zeroed[kind]
                         ? cudaMemsetAsync(p, 0, deft_workspace_zeroed[kind], (cudaStream_t)e->stream)
                         : cudaSuccess;
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        (void)deft_caching_free(deft_cuda(e->dev), p);
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda: zeroing the %s: %s", deft_workspace_tag[kind],
                              cudaGetErrorString(ce));
    }
    e->ptr[kind] = p;
    e->bytes[kind] = bytes;
    return DEFT_OK;
}

size_t deft_stream_workspace_cap(int dev, void *stream, deft_workspace_kind kind) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    return deft_scratch_cap(deft_scratch_lookup(dev, stream), kind);
}

deft_status deft_stream_workspace_limit(int dev, void *stream, deft_workspace_kind kind, size_t bytes) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    deft_stream_scratch *e = deft_scratch_entry(dev, stream);
    if (!e) return deft_set_error(DEFT_ERR_OOM, "cuda: out of host memory for the library workspaces");
    if (e->bytes[kind] > bytes)
        return deft_set_error(DEFT_ERR_STATE, "cuda: the stream's %s holds %zu bytes already, past %zu",
                              deft_workspace_tag[kind], e->bytes[kind], bytes);
    e->cap[kind] = bytes;
    return DEFT_OK;
}

deft_status deft_stream_workspace_reserve(int dev, void *stream, deft_workspace_kind kind, size_t need, void **out,
                                          size_t *bytes) {
    const bool capturing = deft_scratch_capturing(stream);
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    *out = NULL;
    *bytes = 0;
    deft_stream_scratch *e = capturing ? deft_scratch_lookup(dev, stream) : deft_scratch_entry(dev, stream);
    if (!e && !capturing) return deft_set_error(DEFT_ERR_OOM, "cuda: out of host memory for the library workspaces");
    if (!e) return DEFT_OK;   /* a new stream met in a capture holds nothing, and no capture may allocate */
    const size_t cap = deft_scratch_cap(e, kind), want = need < cap ? need : cap;
    if (!capturing) {
        if (want > e->asked[kind]) e->asked[kind] = want;
        if (want > e->bytes[kind] && !e->frozen[kind]) {
            deft_status s = deft_scratch_grow(e, kind, want);
            if (s != DEFT_OK) return s;
        }
    } else if (e->ptr[kind]) {
        e->frozen[kind] = true;
    }
    *out = e->ptr[kind];
    *bytes = e->bytes[kind];
    return DEFT_OK;
}

deft_status deft_stream_workspace(int dev, void *stream, deft_workspace_kind kind, void **out) {
    size_t cap = deft_stream_workspace_cap(dev, stream, kind), bytes = 0;
    deft_status s = deft_stream_workspace_reserve(dev, stream, kind, cap, out, &bytes);
    if (s == DEFT_OK && bytes < cap) {   /* asked inside a capture, or held smaller by one: never so for NORM */
        *out = NULL;
        return deft_set_error(DEFT_ERR_STATE, "cuda: the stream's %s cannot be taken here (%zu of %zu bytes held)",
                              deft_workspace_tag[kind], bytes, cap);
    }
    return s;
}

void *deft_stream_workspace_existing(int dev, void *stream, deft_workspace_kind kind) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    deft_stream_scratch *e = deft_scratch_lookup(dev, stream);
    if (e && e->ptr[kind] && deft_scratch_capturing(stream)) e->frozen[kind] = true;
    return e ? e->ptr[kind] : NULL;
}

size_t deft_stream_workspace_held(int dev, void *stream, deft_workspace_kind kind) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    const deft_stream_scratch *e = deft_scratch_lookup(dev, stream);
    return e ? e->bytes[kind] : 0;
}

size_t deft_stream_workspace_asked(int dev, void *stream, deft_workspace_kind kind) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    const deft_stream_scratch *e = deft_scratch_lookup(dev, stream);
    return e ? e->asked[kind] : 0;
}

deft_status deft_stream_workspace_probe(int dev, void *stream, size_t bytes, void **out) {
    return deft_caching_alloc(deft_cuda(dev), bytes, stream, "cudnn.find", out);
}

void deft_stream_workspace_probe_end(int dev, void *ptr) {
    if (ptr) (void)deft_caching_free(deft_cuda(dev), ptr);
}

void deft_stream_workspaces_release(int dev, void *stream) {
    std::lock_guard<std::mutex> guard(deft_scratch_lock);
    deft_stream_scratch *e = deft_scratch_lookup(dev, stream);
    if (!e) return;
    for (int k = 0; k < DEFT_WORKSPACE_KINDS; k++)
        if (e->ptr[k]) (void)deft_caching_free(deft_cuda(dev), e->ptr[k]);
    *e = deft_scratch[--deft_n_scratch];
}
