/* conv2d and its input and weight gradients on CUDA, through cuDNN's convolution calls (the bias is added by a
 * small kernel here; its gradient is a channel sum the graph builds). NCHW and NHWC (cuDNN's NHWC filter is
 * deft's [O, KH, KW, C/groups]), stride, padding, dilation and groups. f32 computes in f32 (FMA only unless the
 * program allows TF32), f16 and bf16 accumulate in f32, f64 in f64.
 *
 * Each distinct problem (device, op, shape, options, dtype, math mode, pointer alignments, way of choosing) chooses
 * its algorithm once and keeps its descriptors and choice in a host cache for the life of the process: the
 * heuristic's first choice (cudnnGet*_v7), which needs no run. With the compile option cudnn_find
 * (DEFT_CUDA_CUDNN_FIND) the choice is measured instead (cudnnFind*Ex, on the op's own buffers and stream, which it
 * synchronises), outside a stream capture only.
 * The heuristic is the default because it gave the faster steps: ResNet-18 ran slower on the algorithms cudnnFind
 * timed fastest one by one (bench/RESULTS.md, "cuDNN algorithm choice: heuristic against cudnnFind").
 *
 * The choice is made within the stream's cap (cuda_workspace.h; cudnnFind measures in a block of that size lent for
 * the measurement), and the stream's scratch then grows to what the chosen algorithm asks for: outside a capture, so
 * the eager run before a capture has grown it for every problem of the step and a replay never needs more. Where the
 * stream holds less than a choice asks (inside a capture, or a scratch a capture froze), the call chooses again,
 * for itself, within what the stream holds. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <mutex>
#include <vector>

#include "cuda_conv_gemm.cuh"
#include "cuda_image.cuh"

#ifndef DEFT_HAVE_CUDNN

deft_status deft_cuda_conv2d(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st,
                             unsigned flags) {
    (void)out, (void)in, (void)st, (void)flags;
    return deft_set_error(DEFT_ERR_DEVICE, "%s on CUDA needs cuDNN, which this build did not find (cudnn.h and "
                          "libcudnn); build this part of the graph on the CPU", deft_op_name(n->op));
}

extern "C" void deft_cuda_cudnn_release(int dev) { (void)dev; }

#else

#include <cudnn.h>

/* ---- the bias, over the output channels (CPU: add_bias_ in cpu_conv_impl.h) ---- */
template <class T>
__global__ void deft_conv_bias_kernel(T *y, const T *b, int64_t total, int64_t O, int64_t P, int nhwc) {
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t o = nhwc ? i % O : (i / P) % O;
        y[i] = deft_ty<T>::store(deft_ty<T>::load(y[i]) + deft_ty<T>::load(b[o]));
    }
}

static deft_status deft_conv_add_bias(const deft_tensor *n, void *y, const void *b, cudaStream_t st) {
    const int nhwc = n->p.conv.layout == DEFT_NHWC;
    const int64_t total = deft_shape_numel(n->ndim, n->shape), O = n->shape[nhwc ? 3 : 1];
    const int64_t P = n->shape[nhwc ? 1 : 2] * n->shape[nhwc ? 2 : 3];
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        deft_conv_bias_kernel<T><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (T *)y, (const T *)b, total, O, P, nhwc);
        return deft_cuda_check_launch(n, "conv2d bias");
    });
}

#define DEFT_CUDNN_MAX_DEVICES 64
/* Distinct problems kept; past this, new ones take the heuristic's choice each time rather than grow the cache. */
#define DEFT_CONV_CACHE_MAX 4096
/* Algorithms asked of cuDNN per problem (more than it has of any kind). */
#define DEFT_CONV_ALGOS 16

/* ---- one cuDNN handle per device, never destroyed (as the cuBLAS handles); the workspace is the stream's ---- */
static cudnnHandle_t deft_cudnn_handles[DEFT_CUDNN_MAX_DEVICES];
/* Per device, guards its handle and its cache, held across a whole call: a handle holds one stream at a time.
 * Per device rather than one for all, so that the replicas of a data parallel step, one host thread per GPU, never
 * wait on one another's cuDNN calls: one stuck behind another GPU's collective would leave its own unqueued. */
static std::mutex deft_cudnn_locks[DEFT_CUDNN_MAX_DEVICES];

static deft_status deft_cudnn_error(const deft_tensor *n, const char *what, cudnnStatus_t s) {
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s (%s): %s failed: %s", deft_op_name(n->op),
                          deft_dtype_name(n->dtype), what, cudnnGetErrorString(s));
}

/* The current device, checked against DEFT_CUDNN_MAX_DEVICES. */
static deft_status deft_cudnn_device(const deft_tensor *n, int *dev) {
    cudaError_t e = cudaGetDevice(dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: cudaGetDevice failed: %s", deft_op_name(n->op),
                              cudaGetErrorString(e));
    }
    if (*dev < 0 || *dev >= DEFT_CUDNN_MAX_DEVICES)
        return deft_set_error(DEFT_ERR_DEVICE, "cuda %s: cuda:%d is past the %d devices deft supports",
                              deft_op_name(n->op), *dev, DEFT_CUDNN_MAX_DEVICES);
    return DEFT_OK;
}

/* The current device's handle bound to `st`; the caller holds the device's lock. */
static deft_status deft_cudnn_handle(const deft_tensor *n, cudaStream_t st, int dev, cudnnHandle_t *h) {
    cudnnStatus_t cs;
    if (!deft_cudnn_handles[dev]) {
        cs = cudnnCreate(&deft_cudnn_handles[dev]);
        if (cs != CUDNN_STATUS_SUCCESS) {
            deft_cudnn_handles[dev] = NULL;
            return deft_cudnn_error(n, "cudnnCreate", cs);
        }
    }
    cs = cudnnSetStream(deft_cudnn_handles[dev], st);
    if (cs != CUDNN_STATUS_SUCCESS) return deft_cudnn_error(n, "cudnnSetStream", cs);
    *h = deft_cudnn_handles[dev];
    return DEFT_OK;
}

/* ---- the problem and its cache entry ---- */
typedef struct deft_conv_key {
    int dev, op, dtype, nhwc, math, deterministic;
    int find;   /* chosen by measuring (DEFT_CUDA_CUDNN_FIND): a program without it never takes a measured choice */
    int N, C, H, W, O, KH, KW, OH, OW, G;
    int sh, sw, ph, pw, dh, dw;
    unsigned align_x, align_w, align_y;
} deft_conv_key;

typedef struct deft_conv_entry {
    deft_conv_key key;
    cudnnTensorDescriptor_t x, y;   /* x (or dx) and y (or dy) */
    cudnnFilterDescriptor_t w;      /* w (or dw) */
    cudnnConvolutionDescriptor_t conv;
    int algo;                       /* a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by the op */
    size_t ws_bytes;
} deft_conv_entry;

static std::vector<deft_conv_entry> deft_conv_caches[DEFT_CUDNN_MAX_DEVICES];

/* The largest power of two dividing p, up to 256 bytes: algorithms may depend on it. */
static unsigned deft_conv_align(const void *p) {
    const uintptr_t v = (uintptr_t)p, low = v & (~v + 1);
    return (low == 0 || low > 256) ? 256u : (unsigned)low;
}

/* x, w and y (dy) of node n and their pointers, whichever of the three ops it is (as the CPU's conv_operands). */
typedef struct deft_conv_ptrs {
    const deft_tensor *x, *w, *y;
    void *px, *pw, *py;
    size_t ws_bytes;   /* the most a chosen algorithm may ask for: the stream's cap, or what it holds */
} deft_conv_ptrs;

static deft_conv_ptrs deft_conv_operands(const deft_tensor *n, void *out, const void *const *in) {
    switch (n->op) {
    case DEFT_OP_CONV2D: return deft_conv_ptrs{n->src[0], n->src[1], n, (void *)in[0], (void *)in[1], out, 0};
    case DEFT_OP_CONV2D_INPUT_GRAD:
        return deft_conv_ptrs{n, n->src[1], n->src[0], out, (void *)in[1], (void *)in[0], 0};
    default: return deft_conv_ptrs{n->src[1], n, n->src[0], (void *)in[1], out, (void *)in[0], 0};
    }
}

/* cuDNN's 4-d descriptors take int sizes and hold at most 2^31 - 1 elements. */
static bool deft_conv_fits_int(const deft_tensor *t) {
    return deft_shape_numel(t->ndim, t->shape) <= INT_MAX;
}

static deft_status deft_conv_key_of(const deft_tensor *n, const deft_conv_ptrs &p, int dev, unsigned flags,
                                    deft_conv_key *k) {
    if (!deft_conv_fits_int(p.x) || !deft_conv_fits_int(p.w) || !deft_conv_fits_int(p.y) ||
        n->p.conv.groups > INT_MAX)
        return deft_set_error(DEFT_ERR_SHAPE, "cuda %s: a tensor of 2^31 elements or more is past cuDNN's limit",
                              deft_op_name(n->op));
    for (int i = 0; i < 2; i++)
        if (n->p.conv.stride[i] > INT_MAX || n->p.conv.pad[i] > INT_MAX || n->p.conv.dil[i] > INT_MAX)
            return deft_set_error(DEFT_ERR_SHAPE, "cuda %s: stride, padding or dilation past 2^31 - 1",
                                  deft_op_name(n->op));
    memset(k, 0, sizeof *k);
    const int nhwc = n->p.conv.layout == DEFT_NHWC, c = nhwc ? 3 : 1, h = nhwc ? 1 : 2, w = nhwc ? 2 : 3;
    k->dev = dev, k->op = (int)n->op, k->dtype = (int)n->dtype, k->nhwc = nhwc;
    k->deterministic = (flags & DEFT_CUDA_DETERMINISTIC) != 0;
    k->find = (flags & DEFT_CUDA_CUDNN_FIND) != 0;
    /* f32 without TF32 is FMA_MATH, which keeps cuDNN to FMA kernels; f64 has nothing else */
    if (n->dtype == DEFT_F64) k->math = (int)CUDNN_DEFAULT_MATH;
    else if (n->dtype == DEFT_F32 && !(flags & DEFT_CUDA_ALLOW_TF32)) k->math = (int)CUDNN_FMA_MATH;
    else k->math = (int)CUDNN_TENSOR_OP_MATH;
    k->N = (int)p.x->shape[0], k->C = (int)p.x->shape[c], k->H = (int)p.x->shape[h], k->W = (int)p.x->shape[w];
    k->O = (int)p.w->shape[0], k->KH = (int)p.w->shape[nhwc ? 1 : 2], k->KW = (int)p.w->shape[nhwc ? 2 : 3];
    k->OH = (int)p.y->shape[h], k->OW = (int)p.y->shape[w], k->G = (int)n->p.conv.groups;
    k->sh = (int)n->p.conv.stride[0], k->sw = (int)n->p.conv.stride[1];
    k->ph = (int)n->p.conv.pad[0], k->pw = (int)n->p.conv.pad[1];
    k->dh = (int)n->p.conv.dil[0], k->dw = (int)n->p.conv.dil[1];
    k->align_x = deft_conv_align(p.px), k->align_w = deft_conv_align(p.pw), k->align_y = deft_conv_align(p.py);
    return DEFT_OK;
}

static cudnnDataType_t deft_cudnn_data_type(int dtype) {
    switch (dtype) {
    case DEFT_F64: return CUDNN_DATA_DOUBLE;
    case DEFT_F16: return CUDNN_DATA_HALF;
    case DEFT_BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
    }
}

static void deft_conv_entry_free(deft_conv_entry *e) {
    if (e->x) cudnnDestroyTensorDescriptor(e->x);
    if (e->y) cudnnDestroyTensorDescriptor(e->y);
    if (e->w) cudnnDestroyFilterDescriptor(e->w);
    if (e->conv) cudnnDestroyConvolutionDescriptor(e->conv);
    e->x = e->y = NULL;
    e->w = NULL;
    e->conv = NULL;
}

/* Fills e's descriptors from its key; on failure the caller frees what was made. */
static cudnnStatus_t deft_conv_describe(deft_conv_entry *e) {
    const deft_conv_key &k = e->key;
    const cudnnDataType_t dt = deft_cudnn_data_type(k.dtype);
    const cudnnTensorFormat_t fmt = k.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    /* halves accumulate in f32; f64 in f64 */
    const cudnnDataType_t compute = k.dtype == DEFT_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    cudnnStatus_t s;
    if ((s = cudnnCreateTensorDescriptor(&e->x)) || (s = cudnnCreateTensorDescriptor(&e->y)) ||
        (s = cudnnCreateFilterDescriptor(&e->w)) || (s = cudnnCreateConvolutionDescriptor(&e->conv)))
        return s;
    if ((s = cudnnSetTensor4dDescriptor(e->x, fmt, dt, k.N, k.C, k.H, k.W)) ||
        (s = cudnnSetTensor4dDescriptor(e->y, fmt, dt, k.N, k.O, k.OH, k.OW)) ||
        (s = cudnnSetFilter4dDescriptor(e->w, dt, fmt, k.O, k.C / k.G, k.KH, k.KW)) ||
        (s = cudnnSetConvolution2dDescriptor(e->conv, k.ph, k.pw, k.sh, k.sw, k.dh, k.dw, CUDNN_CROSS_CORRELATION,
                                             compute)) ||
        (s = cudnnSetConvolutionGroupCount(e->conv, k.G)))
        return s;
    return cudnnSetConvolutionMathType(e->conv, (cudnnMathType_t)k.math);
}

/* One algorithm's measurement or estimate, whichever of the three kinds it came from. */
typedef struct deft_conv_perf {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnMathType_t math;
    cudnnDeterminism_t determinism;
} deft_conv_perf;

template <class P> static int deft_conv_perfs(const P *r, int got, deft_conv_perf *out) {
    for (int i = 0; i < got; i++)
        out[i] = deft_conv_perf{(int)r[i].algo, r[i].status, r[i].memory, r[i].mathType, r[i].determinism};
    return got;
}

/* The measured (find) or estimated algorithms of e's problem, best first. */
static cudnnStatus_t deft_conv_rank(cudnnHandle_t h, deft_conv_entry *e, const deft_conv_ptrs &p, void *ws,
                                    bool find, deft_conv_perf *perf, int *got) {
    const size_t wsb = p.ws_bytes;
    cudnnStatus_t s;
    *got = 0;
    if (e->key.op == DEFT_OP_CONV2D) {
        cudnnConvolutionFwdAlgoPerf_t r[DEFT_CONV_ALGOS];
        s = find ? cudnnFindConvolutionForwardAlgorithmEx(h, e->x, p.px, e->w, p.pw, e->conv, e->y, p.py,
                                                          DEFT_CONV_ALGOS, got, r, ws, wsb)
                 : cudnnGetConvolutionForwardAlgorithm_v7(h, e->x, e->w, e->conv, e->y, DEFT_CONV_ALGOS, got, r);
        if (s == CUDNN_STATUS_SUCCESS) deft_conv_perfs(r, *got, perf);
    } else if (e->key.op == DEFT_OP_CONV2D_INPUT_GRAD) {
        cudnnConvolutionBwdDataAlgoPerf_t r[DEFT_CONV_ALGOS];
        s = find ? cudnnFindConvolutionBackwardDataAlgorithmEx(h, e->w, p.pw, e->y, p.py, e->conv, e->x, p.px,
                                                               DEFT_CONV_ALGOS, got, r, ws, wsb)
                 : cudnnGetConvolutionBackwardDataAlgorithm_v7(h, e->w, e->y, e->conv, e->x, DEFT_CONV_ALGOS, got,
                                                               r);
        if (s == CUDNN_STATUS_SUCCESS) deft_conv_perfs(r, *got, perf);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[DEFT_CONV_ALGOS];
        s = find ? cudnnFindConvolutionBackwardFilterAlgorithmEx(h, e->x, p.px, e->y, p.py, e->conv, e->w, p.pw,
                                                                 DEFT_CONV_ALGOS, got, r, ws, wsb)
                 : cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, e->x, e->y, e->conv, e->w, DEFT_CONV_ALGOS,
                                                                 got, r);
        if (s == CUDNN_STATUS_SUCCESS) deft_conv_perfs(r, *got, perf);
    }
    return s;
}

/* Whether an algorithm may be used: it ran (or would run) and fits the workspace; strictly, it also reports the
 * math asked for (FMA_MATH, f32 without TF32, takes only FMA kernels; torch asserts the same of cuDNN's answers).
 * Under the `deterministic` compile option only algorithms cuDNN reports deterministic qualify. */
static bool deft_conv_usable(const deft_conv_entry *e, const deft_conv_perf &r, size_t ws_bytes, bool strict) {
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > ws_bytes) return false;
    if (e->key.deterministic && r.determinism != CUDNN_DETERMINISTIC) return false;
    return !strict || e->key.math != (int)CUDNN_FMA_MATH || r.math == CUDNN_FMA_MATH;
}

/* Picks e's algorithm; DEFT_ERR_RUNTIME with a message when cuDNN has none for the problem. */
static deft_status deft_conv_choose(const deft_tensor *n, cudnnHandle_t h, deft_conv_entry *e,
                                    const deft_conv_ptrs &p, void *ws, bool find) {
    deft_conv_perf perf[DEFT_CONV_ALGOS];
    int got = 0;
    cudnnStatus_t s = deft_conv_rank(h, e, p, ws, find, perf, &got);
    if (s != CUDNN_STATUS_SUCCESS)
        return deft_cudnn_error(n, find ? "cudnnFindConvolution*AlgorithmEx" : "cudnnGetConvolution*Algorithm_v7", s);
    /* Should cuDNN report another math type for every algorithm under FMA_MATH, the second pass takes the best one
     * but leaves the descriptor at FMA_MATH, so it still runs without TF32. */
    for (int strict = 1; strict >= 0; strict--) {
        for (int i = 0; i < got; i++) {
            if (!deft_conv_usable(e, perf[i], p.ws_bytes, strict)) continue;
            /* the math type the algorithm was measured with is the one it must run with */
            const cudnnMathType_t math = strict ? perf[i].math : (cudnnMathType_t)e->key.math;
            s = cudnnSetConvolutionMathType(e->conv, math);
            if (s != CUDNN_STATUS_SUCCESS) return deft_cudnn_error(n, "cudnnSetConvolutionMathType", s);
            e->algo = perf[i].algo;
            e->ws_bytes = perf[i].memory;
            return DEFT_OK;
        }
    }
    const deft_conv_key &k = e->key;
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: cuDNN has no algorithm for %s %s x [%d, %d, %d, %d] with "
                          "%d x %d filters, %d groups, within its %zu MiB workspace%s%s", deft_op_name(n->op),
                          deft_dtype_name(n->dtype), k.nhwc ? "NHWC" : "NCHW", k.N, k.C, k.H, k.W, k.KH, k.KW, k.G,
                          p.ws_bytes >> 20,
                          k.math == (int)CUDNN_FMA_MATH && n->dtype == DEFT_F32 ? " without TF32" : "",
                          k.deterministic ? " that is deterministic" : "");
}


/* Whether `st` is capturing into a CUDA Graph; a stream that cannot be asked counts as capturing. */
static bool deft_conv_capturing(cudaStream_t st) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* Enqueues the convolution of e on the handle's stream. */
static cudnnStatus_t deft_conv_launch(cudnnHandle_t h, const deft_conv_entry *e, const deft_conv_ptrs &p,
                                      void *ws) {
    static const float one_f = 1.0f, zero_f = 0.0f;
    static const double one_d = 1.0, zero_d = 0.0;
    const bool f64 = e->key.dtype == DEFT_F64;
    const void *one = f64 ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = f64 ? (const void *)&zero_d : (const void *)&zero_f;
    if (e->key.op == DEFT_OP_CONV2D)
        return cudnnConvolutionForward(h, one, e->x, p.px, e->w, p.pw, e->conv, (cudnnConvolutionFwdAlgo_t)e->algo,
                                       ws, e->ws_bytes, zero, e->y, p.py);
    if (e->key.op == DEFT_OP_CONV2D_INPUT_GRAD)
        return cudnnConvolutionBackwardData(h, one, e->w, p.pw, e->y, p.py, e->conv,
                                            (cudnnConvolutionBwdDataAlgo_t)e->algo, ws, e->ws_bytes, zero, e->x,
                                            p.px);
    return cudnnConvolutionBackwardFilter(h, one, e->x, p.px, e->y, p.py, e->conv,
                                          (cudnnConvolutionBwdFilterAlgo_t)e->algo, ws, e->ws_bytes, zero, e->w,
                                          p.pw);
}

static deft_conv_entry *deft_conv_find_cached(const deft_conv_key &k) {
    for (deft_conv_entry &e : deft_conv_caches[k.dev])
        if (memcmp(&e.key, &k, sizeof k) == 0) return &e;
    return NULL;
}

/* Runs the problem once with a choice not kept: inside a capture, with the cache full, or where the stream holds
 * less than the kept choice asks. Chosen within the cap, and again within what the stream holds where it cannot
 * grow to that (a stream first met in a capture holds nothing: an algorithm that needs no workspace). */
static deft_status deft_conv_run_uncached(const deft_tensor *n, cudnnHandle_t h, const deft_conv_key &k,
                                          deft_conv_ptrs p, cudaStream_t st, size_t cap) {
    deft_conv_entry e;
    memset(&e, 0, sizeof e);
    e.key = k;
    p.ws_bytes = cap;
    void *ws = NULL;
    size_t held = 0;
    cudnnStatus_t cs = deft_conv_describe(&e);
    deft_status s = cs == CUDNN_STATUS_SUCCESS ? deft_conv_choose(n, h, &e, p, NULL, false)
                                               : deft_cudnn_error(n, "cuDNN descriptor setup", cs);
    if (s == DEFT_OK) s = deft_stream_workspace_reserve(k.dev, st, DEFT_WORKSPACE_CUDNN, e.ws_bytes, &ws, &held);
    if (s == DEFT_OK && e.ws_bytes > held) {
        p.ws_bytes = held;
        s = deft_conv_choose(n, h, &e, p, NULL, false);
    }
    if (s == DEFT_OK) {
        cs = deft_conv_launch(h, &e, p, ws);
        if (cs != CUDNN_STATUS_SUCCESS) s = deft_cudnn_error(n, "cudnnConvolution*", cs);
    }
    deft_conv_entry_free(&e);
    return s;
}

/* The cached entry for k, made and chosen within `cap` on a miss (measured with the compile option cudnn_find, in a
 * block of `cap` bytes lent for it). The caller holds the lock. */
static deft_status deft_conv_entry_for(const deft_tensor *n, cudnnHandle_t h, const deft_conv_key &k,
                                       deft_conv_ptrs p, cudaStream_t st, size_t cap, deft_conv_entry **out) {
    *out = deft_conv_find_cached(k);
    if (*out) return DEFT_OK;
    deft_conv_entry e;
    memset(&e, 0, sizeof e);
    e.key = k;
    p.ws_bytes = cap;
    void *probe = NULL;
    cudnnStatus_t cs = deft_conv_describe(&e);
    deft_status s = cs == CUDNN_STATUS_SUCCESS ? DEFT_OK : deft_cudnn_error(n, "cuDNN descriptor setup", cs);
    if (s == DEFT_OK && k.find) s = deft_stream_workspace_probe(k.dev, st, cap, &probe);
    if (s == DEFT_OK) s = deft_conv_choose(n, h, &e, p, probe, k.find != 0);
    deft_stream_workspace_probe_end(k.dev, probe);   /* Find has synchronised: its work is done */
    if (s != DEFT_OK) {
        deft_conv_entry_free(&e);
        return s;
    }
    deft_conv_caches[k.dev].push_back(e);
    *out = &deft_conv_caches[k.dev].back();
    return DEFT_OK;
}

/* The convolutions of few input channels that run as products, in the columns' scratch they ask for. */
static deft_status deft_conv_gemm_try(const deft_tensor *n, const deft_conv_ptrs &p, cudaStream_t st, int dev,
                                      unsigned flags, bool *done) {
    void *ws = NULL;
    size_t held = 0;
    const size_t want = deft_conv_gemm_bytes(n, p.x, p.w, p.y);
    deft_status s = deft_stream_workspace_reserve(dev, st, DEFT_WORKSPACE_CUDNN, want, &ws, &held);
    if (s != DEFT_OK) return s;
    return deft_conv_gemm_run(n, p.x, p.w, p.y, p.px, n->op == DEFT_OP_CONV2D ? p.pw : p.py,
                              n->op == DEFT_OP_CONV2D ? p.py : p.pw, ws, held, st, flags, done);
}

static deft_status deft_conv_run(const deft_tensor *n, deft_conv_ptrs p, cudaStream_t st, unsigned flags) {
    int dev = 0;
    deft_status s = deft_cudnn_device(n, &dev);
    if (s != DEFT_OK) return s;
    std::lock_guard<std::mutex> guard(deft_cudnn_locks[dev]);
    cudnnHandle_t h = NULL;
    s = deft_cudnn_handle(n, st, dev, &h);
    if (s != DEFT_OK) return s;
    if (deft_conv_gemm_takes(n, p.x, p.w, flags)) {
        bool done = false;
        s = deft_conv_gemm_try(n, p, st, dev, flags, &done);
        if (s != DEFT_OK || done) return s;
    }
    deft_conv_key k;
    if ((s = deft_conv_key_of(n, p, dev, flags, &k)) != DEFT_OK) return s;
    const size_t cap = deft_stream_workspace_cap(dev, st, DEFT_WORKSPACE_CUDNN);
    deft_conv_entry *e = deft_conv_find_cached(k);
    if (!e && !deft_conv_capturing(st) && deft_conv_caches[dev].size() < DEFT_CONV_CACHE_MAX &&
        (s = deft_conv_entry_for(n, h, k, p, st, cap, &e)) != DEFT_OK)
        return s;
    void *ws = NULL;
    size_t held = 0;
    if (e && (s = deft_stream_workspace_reserve(dev, st, DEFT_WORKSPACE_CUDNN, e->ws_bytes, &ws, &held)) != DEFT_OK)
        return s;
    if (!e || e->ws_bytes > held) return deft_conv_run_uncached(n, h, k, p, st, cap);
    cudnnStatus_t cs = deft_conv_launch(h, e, p, ws);
    return cs == CUDNN_STATUS_SUCCESS ? DEFT_OK : deft_cudnn_error(n, "cudnnConvolution*", cs);
}

deft_status deft_cuda_conv2d(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st,
                             unsigned flags) {
    if (n->dtype != DEFT_F32 && n->dtype != DEFT_F64 && n->dtype != DEFT_F16 && n->dtype != DEFT_BF16)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype %s is not supported on CUDA", deft_op_name(n->op),
                              deft_dtype_name(n->dtype));
    const deft_conv_ptrs p = deft_conv_operands(n, out, in);
    /* an empty sum (no input channels or an empty batch) is zero; cuDNN refuses empty tensors */
    if (deft_shape_numel(p.x->ndim, p.x->shape) == 0 || deft_shape_numel(p.w->ndim, p.w->shape) == 0 ||
        deft_shape_numel(p.y->ndim, p.y->shape) == 0) {
        cudaError_t e = cudaMemsetAsync(out, 0, deft_tensor_bytes(n), st);
        if (e == cudaSuccess && n->op == DEFT_OP_CONV2D && n->nsrc > 2) return deft_conv_add_bias(n, out, in[2], st);
        if (e == cudaSuccess) return DEFT_OK;
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: memset failed: %s", deft_op_name(n->op),
                              cudaGetErrorString(e));
    }
    deft_status s = deft_conv_run(n, p, st, flags);
    if (s == DEFT_OK && n->op == DEFT_OP_CONV2D && n->nsrc > 2) s = deft_conv_add_bias(n, out, in[2], st);
    return s;
}

extern "C" void deft_cuda_cudnn_release(int dev) {
    if (dev < 0 || dev >= DEFT_CUDNN_MAX_DEVICES) return;
    std::lock_guard<std::mutex> guard(deft_cudnn_locks[dev]);
    if (deft_cudnn_handles[dev] && cudnnDestroy(deft_cudnn_handles[dev]) != CUDNN_STATUS_SUCCESS)
        (void)cudaGetLastError();
    deft_cudnn_handles[dev] = NULL;
}

#endif

extern "C" bool deft_cuda_conv_supported(const deft_tensor *n, char *why, size_t why_bytes) {
    if (n->op != DEFT_OP_CONV2D && n->dtype == DEFT_F64 && n->p.conv.layout == DEFT_NHWC) {
        snprintf(why, why_bytes, "cuDNN has no algorithm for the gradients of an f64 NHWC convolution; use "
                 "DEFT_NCHW for f64 or a float dtype for NHWC");
        return false;
    }
    return true;
}
