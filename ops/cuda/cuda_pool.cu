/* Max, average and adaptive average pooling and their gradients on CUDA: the entry point, and plain kernels that
 * mirror the CPU's (ops/cpu/cpu_pool.c) window for window, kept as the reference for the fast ones
 * (cuda_pool_fast.cu; DEFT_DEBUG_POOL_REFERENCE selects these). Forward: one thread per output element. Backward: one
 * thread per input element, which gathers from every window that covers it (in the order the CPU scatters them), so no two threads
 * write one element and no atomics are needed. Max pooling's gradient goes to each window's first maximum in
 * row-major order (the last NaN where there is one), found again from x, as the CPU does. f32, f64, f16 and bf16
 * (halves load into float and round once on the store). */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda_pool.cuh"

typedef deft_pool_span<int64_t> deft_pool_win;

/* Offset of element (n, c, h, w) of an [N, C, Hn, Wn] tensor in the layout. */
__device__ __forceinline__ int64_t deft_pool_at(const deft_pool_geom &g, int64_t n, int64_t c, int64_t h, int64_t w,
                                                int64_t Hn, int64_t Wn) {
    return g.nhwc ? ((n * Hn + h) * Wn + w) * g.C + c : ((n * g.C + c) * Hn + h) * Wn + w;
}

/* Splits a linear index of an [N, C, Hn, Wn] tensor stored in the layout into its logical coordinates. */
__device__ __forceinline__ void deft_pool_coords(const deft_pool_geom &g, int64_t i, int64_t Hn, int64_t Wn,
                                                 int64_t *n, int64_t *c, int64_t *h, int64_t *w) {
    if (g.nhwc) {
        *c = i % g.C, i /= g.C;
        *w = i % Wn, i /= Wn;
        *h = i % Hn, *n = i / Hn;
    } else {
        *w = i % Wn, i /= Wn;
        *h = i % Hn, i /= Hn;
        *c = i % g.C, *n = i / g.C;
    }
}

/* The offset in x of a window's maximum, as pool_argmax in cpu_pool.c: the first maximum, or the last NaN. */
template <class T>
__device__ int64_t deft_pool_argmax(const deft_pool_geom &g, const T *x, int64_t n, int64_t c, deft_pool_win wh,
                                    deft_pool_win ww, typename deft_ty<T>::C *best) {
    typedef typename deft_ty<T>::C C;
    int64_t at = deft_pool_at(g, n, c, wh.lo, ww.lo, g.H, g.W);
    *best = -(C)INFINITY;
    for (int64_t ih = wh.lo; ih < wh.hi; ih++) {
        for (int64_t iw = ww.lo; iw < ww.hi; iw++) {
            const int64_t off = deft_pool_at(g, n, c, ih, iw, g.H, g.W);
            const C v = deft_ty<T>::load(x[off]);
            if (v > *best || v != v) *best = v, at = off;
        }
    }
    return at;
}

template <class T> __global__ void deft_pool_forward_kernel(deft_pool_geom g, const T *x, T *y, int64_t total) {
    typedef typename deft_ty<T>::C C;
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        int64_t n, c, oh, ow;
        deft_pool_coords(g, i, g.OH, g.OW, &n, &c, &oh, &ow);
        const deft_pool_win wh = deft_pool_window<int64_t>(g, 0, oh), ww = deft_pool_window<int64_t>(g, 1, ow);
        C v = 0;
        if (g.max) {
            deft_pool_argmax(g, x, n, c, wh, ww, &v);
        } else {
            for (int64_t ih = wh.lo; ih < wh.hi; ih++)
                for (int64_t iw = ww.lo; iw < ww.hi; iw++) v += deft_ty<T>::load(x[deft_pool_at(g, n, c, ih, iw, g.H, g.W)]);
            v /= (C)wh.count * (C)ww.count;   /* huge kernels: no int64 product */
        }
        y[i] = deft_ty<T>::store(v);
    }
}

/* dx (i) = the sum of the dy of every window that covers i and, for max pooling, chose i. x is NULL but for max. */
template <class T>
__global__ void deft_pool_backward_kernel(deft_pool_geom g, const T *dy, const T *x, T *dx, int64_t total) {
    typedef typename deft_ty<T>::C C;
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        int64_t n, c, ih, iw, oh0, oh1, ow0, ow1;
        deft_pool_coords(g, i, g.H, g.W, &n, &c, &ih, &iw);
        deft_pool_covering<int64_t>(g, 0, ih, &oh0, &oh1);
        deft_pool_covering<int64_t>(g, 1, iw, &ow0, &ow1);
        C acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++) {
            const deft_pool_win wh = deft_pool_window<int64_t>(g, 0, oh);
            if (ih < wh.lo || ih >= wh.hi) continue;
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                const deft_pool_win ww = deft_pool_window<int64_t>(g, 1, ow);
                if (iw < ww.lo || iw >= ww.hi) continue;
                const C d = deft_ty<T>::load(dy[deft_pool_at(g, n, c, oh, ow, g.OH, g.OW)]);
                if (g.max) {
                    C best;
                    if (deft_pool_argmax(g, x, n, c, wh, ww, &best) == i) acc += d;
                } else {
                    acc += d / ((C)wh.count * (C)ww.count);
                }
            }
        }
        dx[i] = deft_ty<T>::store(acc);
    }
}

static bool deft_pool_is_grad(deft_op op) {
    return op == DEFT_OP_MAX_POOL2D_GRAD || op == DEFT_OP_AVG_POOL2D_GRAD || op == DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD;
}

static deft_pool_geom deft_pool_geometry(const deft_tensor *n) {
    const bool grad = deft_pool_is_grad(n->op);
    const deft_tensor *x = grad ? n : n->src[0], *y = grad ? n->src[0] : n;
    deft_pool_geom g;
    g.nhwc = n->p.pool.layout == DEFT_NHWC;
    const int c = g.nhwc ? 3 : 1, h = g.nhwc ? 1 : 2, w = g.nhwc ? 2 : 3;
    g.N = x->shape[0], g.C = x->shape[c], g.H = x->shape[h], g.W = x->shape[w];
    g.OH = y->shape[h], g.OW = y->shape[w];
    g.kh = n->p.pool.kernel[0], g.kw = n->p.pool.kernel[1];
    g.sh = n->p.pool.stride[0], g.sw = n->p.pool.stride[1];
    g.ph = n->p.pool.pad[0], g.pw = n->p.pool.pad[1];
    g.adaptive = n->op == DEFT_OP_ADAPTIVE_AVG_POOL2D || n->op == DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD;
    g.max = n->op == DEFT_OP_MAX_POOL2D || n->op == DEFT_OP_MAX_POOL2D_GRAD;
    g.include_pad = n->p.pool.count_include_pad;
    return g;
}

static bool deft_pool_reference_requested(void) {
    return deft_debug(DEFT_DEBUG_POOL_REFERENCE) != 0;
}

deft_status deft_cuda_pool2d(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    const deft_pool_geom g = deft_pool_geometry(n);
    const bool grad = deft_pool_is_grad(n->op);
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    /* an empty dy leaves dx zero: no window covers anything */
    if (grad && g.OH * g.OW == 0) {
        cudaError_t e = cudaMemsetAsync(out, 0, deft_tensor_bytes(n), st);
        if (e == cudaSuccess) return DEFT_OK;
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: memset failed: %s", deft_op_name(n->op),
                              cudaGetErrorString(e));
    }
    if (!deft_pool_reference_requested()) {
        bool done = false;
        const deft_status s = deft_cuda_pool2d_fast(n, g, grad, out, in, st, &done);
        if (s != DEFT_OK || done) return s;
    }
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        const unsigned blocks = deft_cuda_blocks(total, DEFT_CUDA_THREADS);
        if (!grad) {
            deft_pool_forward_kernel<T><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(g, (const T *)in[0], (T *)out, total);
            return deft_cuda_check_launch(n, "pool2d forward");
        }
        const T *x = g.max ? (const T *)in[1] : NULL;
        deft_pool_backward_kernel<T><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(g, (const T *)in[0], x, (T *)out, total);
        return deft_cuda_check_launch(n, "pool2d backward");
    });
}
