/* What the pooling files share (C++ only, not installed): cuda_pool.cu holds the entry point and the plain kernels
 * (the reference), cuda_pool_fast.cu the fast ones. */
#ifndef DEFT_CUDA_POOL_CUH
#define DEFT_CUDA_POOL_CUH

#include "cuda_image.cuh"

/* The geometry of one pooling op: x (or dx) [N, C, H, W] and y (or dy) [N, C, OH, OW] in either layout. */
typedef struct deft_pool_geom {
    int64_t N, C, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw;
    int adaptive, max, include_pad, nhwc;
} deft_pool_geom;

/* A pooling window along one axis: inputs [lo, hi) and the divisor (the window's size with padding counted, or the
 * inputs it covers). I is the index type: int64_t in the plain kernels, int in the fast ones (cuda_pool_fast.cu's
 * 32-bit geometry); Geom either geometry. */
template <class I> struct deft_pool_span {
    I lo, hi, count;
};

/* Output o's window along axis (0: rows, 1: columns), as pool_window in cpu_pool.c. */
template <class I, class Geom>
__device__ __forceinline__ deft_pool_span<I> deft_pool_window(const Geom &g, int axis, I o) {
    const I in_len = axis ? g.W : g.H, out_len = axis ? g.OW : g.OH;
    if (g.adaptive) {
        const I lo = o * in_len / out_len, hi = ((o + 1) * in_len + out_len - 1) / out_len;
        return deft_pool_span<I>{lo, hi, hi - lo};
    }
    const I k = axis ? g.kw : g.kh, s = axis ? g.sw : g.sh, p = axis ? g.pw : g.ph;
    const I start = o * s - p;
    I end = start + k;
    if (end > in_len + p) end = in_len + p;
    const I lo = start < 0 ? 0 : start, hi = end > in_len ? in_len : end;
    return deft_pool_span<I>{lo, hi, g.include_pad ? end - start : hi - lo};
}

/* The range [first, last] of outputs along an axis whose windows may cover input index i (checked again by the
 * caller against the window itself). */
template <class I, class Geom>
__device__ __forceinline__ void deft_pool_covering(const Geom &g, int axis, I i, I *first, I *last) {
    const I in_len = axis ? g.W : g.H, out_len = axis ? g.OW : g.OH;
    I a, b;
    if (g.adaptive) {
        a = i * out_len / in_len;
        b = ((i + 1) * out_len + in_len - 1) / in_len - 1;
    } else {
        const I k = axis ? g.kw : g.kh, s = axis ? g.sw : g.sh, p = axis ? g.pw : g.ph;
        const I num = i + p - k + 1;   /* o s - p + k > i */
        a = num <= 0 ? 0 : (num - 1) / s + 1;   /* rounds up without adding s, which may be huge */
        b = (i + p) / s;               /* o s - p <= i */
    }
    *first = a < 0 ? 0 : a;
    *last = b > out_len - 1 ? out_len - 1 : b;
}

/* The fast kernels for a pooling op or its gradient (cuda_pool_fast.cu); *done = false (nothing ran) where the
 * tensors are past their 32-bit indices, and the caller takes the plain path. */
deft_status deft_cuda_pool2d_fast(const deft_tensor *n, const deft_pool_geom &g, bool grad, void *out,
                                  const void *const *in, cudaStream_t st, bool *done);

#endif
