/* The ops of training: activation gradients, expand (a materialised broadcast), slice gradients and dropout
 * (cross-entropy is in cuda_cross_entropy.cu). The formulas are the CPU backend's (ops/cpu/cpu_train.c): halves
 * compute in float and round once on the store; dropout draws the same counter-based numbers (rng.h), so both
 * backends drop the same elements. */
#include <string.h>

#include "config.h"
#include "cuda_common.cuh"
#include "cuda_tuning.h"
#include "cuda_elementwise_fn.cuh"
#include "rng.h"

/* ---------------------------------------------------------------- activation gradients: out = dy * act'(x) */
/* The output may be dy's or x's own buffer (in-place reuse by the planner): element i is read before it is written. */
template <class T, class F> __global__ void deft_k_act_grad(T *o, const T *dy, const T *x, int64_t n, F f) {
    typedef deft_ty<T> Ty;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) o[i] = Ty::store(f(Ty::load(dy[i]), Ty::load(x[i])));
}

/* The same, 16 bytes a load where out, dy and x all start on 16 bytes: thread t takes vectors t, t + threads, ...,
 * then the last n mod W elements go one to a thread. One element a load moved 4 bytes at a time, and the mid MLP's
 * ReLU gradients were slower that way (bench/RESULTS.md, "Ninth round"); GPT-2's bf16 GELU gradients likewise moved
 * 8 bytes a load with four elements. */
template <class T, class F> __global__ void deft_k_act_grad_vec(T *o, const T *dy, const T *x, int64_t n, F f) {
    typedef deft_ty<T> Ty;
    constexpr int W = (int)(16 / sizeof(T));
    typedef deft_vec<T, W> V;
    const int64_t nvec = n / W;
    for (int64_t v = deft_tid(); v < nvec; v += deft_nthreads()) {
        const V g = reinterpret_cast<const V *>(dy)[v], in = reinterpret_cast<const V *>(x)[v];
        V r;
#pragma unroll
        for (int u = 0; u < W; u++) r.e[u] = Ty::store(f(Ty::load(g.e[u]), Ty::load(in.e[u])));
        reinterpret_cast<V *>(o)[v] = r;
    }
    const int64_t j = nvec * W + deft_tid();
    if (j < n) o[j] = Ty::store(f(Ty::load(dy[j]), Ty::load(x[j])));
}

template <class F>
static deft_status deft_act_grad_launch(const deft_tensor *n, void *out, const void *dy, const void *x,
                                        cudaStream_t st, F f) {
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        const bool vec = deft_is_aligned(out, 16) && deft_is_aligned(dy, 16) && deft_is_aligned(x, 16);
        if (vec && !deft_debug(DEFT_DEBUG_MAP_SCALAR))
            deft_k_act_grad_vec<T, F><<<deft_cuda_blocks(total / (int64_t)(16 / sizeof(T)) + 1, DEFT_CUDA_THREADS),
                                        DEFT_CUDA_THREADS, 0, st>>>(
                (T *)out, (const T *)dy, (const T *)x, total, f);
        else
            deft_k_act_grad<T, F><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                (T *)out, (const T *)dy, (const T *)x, total, f);
        return deft_cuda_check_launch(n, "act_grad");
    });
}

static bool deft_same_shape(const deft_tensor *a, const deft_tensor *b) {
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

deft_status deft_cuda_act_grad(const deft_tensor *n, void *out, const void *dy, const void *x, cudaStream_t st) {
    if (!deft_same_shape(n->src[0], n) || !deft_same_shape(n->src[1], n))
        return deft_set_error(DEFT_ERR_SHAPE, "act_grad: the gradient, the input and the output differ in shape");
    switch (n->p.act) {
    case DEFT_OP_RELU: return deft_act_grad_launch(n, out, dy, x, st, deft_ag_relu());
    case DEFT_OP_GELU: return deft_act_grad_launch(n, out, dy, x, st, deft_ag_gelu());
    case DEFT_OP_GELU_TANH: return deft_act_grad_launch(n, out, dy, x, st, deft_ag_gelu_tanh());
    case DEFT_OP_SILU: return deft_act_grad_launch(n, out, dy, x, st, deft_ag_silu());
    case DEFT_OP_TANH: return deft_act_grad_launch(n, out, dy, x, st, deft_ag_tanh());
    case DEFT_OP_SIGMOID: return deft_act_grad_launch(n, out, dy, x, st, deft_ag_sigmoid());
    default:
        return deft_set_error(DEFT_ERR_INVALID, "act_grad: %s is not an activation with a gradient kernel",
                              deft_op_name(n->p.act));
    }
}

/* ---------------------------------------------------------------- expand and slice_grad: moving bits */
/* out (contiguous over s.shape) [i] = in[sum of index * s.st[0]], the strides 0 on broadcast dims. */
template <class E> __global__ void deft_k_expand(E *o, const E *in, int64_t n, deft_cuda_strides s) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        int64_t off, unused;
        deft_cuda_offsets(s, i, &off, &unused);
        o[i] = in[off];
    }
}

deft_status deft_cuda_expand(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    deft_status shape_ok = deft_check_expand_shape(src, n);
    if (shape_ok != DEFT_OK) return shape_ok;
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    deft_cuda_strides s;
    memset(&s, 0, sizeof s);
    s.ndim = n->ndim;
    memcpy(s.shape, n->shape, sizeof(int64_t) * (size_t)n->ndim);
    deft_broadcast_strides(src->ndim, src->shape, n->ndim, n->shape, s.st[0]);
    deft_cuda_coalesce(&s, 1);
    return deft_with_elem_size(deft_dtype_size(n->dtype), [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type E;
        deft_k_expand<E><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (E *)out, (const E *)a, total, s);
        return deft_cuda_check_launch(n, "expand");
    });
}

/* The output seen as [outer, L, inner] around the axis, dy as [outer, m, inner]: element (o, l, j) is dy's
 * (o, (l - start) / step, j) where l is selected, zero (all zero bits, in every dtype) elsewhere. One pass writes
 * every output element once. */
template <class E>
__global__ void deft_k_slice_grad(E *o, const E *dy, int64_t n, int64_t L, int64_t inner, int64_t m, int64_t start,
                                  int64_t step) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        const int64_t j = i % inner, r = i / inner, l = r % L, outer = r / L, d = l - start;
        E v = E(0);
        if (d >= 0 && d % step == 0 && d / step < m) v = dy[(outer * m + d / step) * inner + j];
        o[i] = v;
    }
}

deft_status deft_cuda_slice_grad(const deft_tensor *n, void *out, const void *dy, cudaStream_t st) {
    const deft_tensor *src = n->src[0];
    const int ax = n->p.slice.axis;
    const int64_t start = n->p.slice.start, step = n->p.slice.step;
    bool ok = src->ndim == n->ndim && ax >= 0 && ax < n->ndim && start >= 0 && step > 0;
    for (int d = 0; ok && d < n->ndim; d++)
        if (d != ax && src->shape[d] != n->shape[d]) ok = false;
    if (ok && src->shape[ax] > 0 && start + (src->shape[ax] - 1) * step >= n->shape[ax]) ok = false;
    if (!ok) {
        char as[96], bs[96];
        return deft_set_error(DEFT_ERR_SHAPE, "slice_grad: %s does not fit %s at axis %d start %lld step %lld",
                              deft_shape_str(src->ndim, src->shape, as, sizeof as),
                              deft_shape_str(n->ndim, n->shape, bs, sizeof bs), ax, (long long)start,
                              (long long)step);
    }
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    const int64_t L = n->shape[ax], m = src->shape[ax];
    const int64_t inner = deft_shape_numel(n->ndim - ax - 1, n->shape + ax + 1);
    return deft_with_elem_size(deft_dtype_size(n->dtype), [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type E;
        deft_k_slice_grad<E><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (E *)out, (const E *)dy, total, L, inner, m, start, step);
        return deft_cuda_check_launch(n, "slice_grad");
    });
}

/* ---------------------------------------------------------------- dropout */
/* Element i is kept when uniform01(key, i) >= p; kept values are x * scale in the compute type, the scale rounded
 * to it, as on the CPU. In place is safe. */
template <class T>
__global__ void deft_k_dropout(T *o, const T *x, int64_t n, uint64_t key, double p, typename deft_ty<T>::C sc) {
    typedef deft_ty<T> Ty;
    typedef typename Ty::C C;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        const C v = Ty::load(x[i]);
        o[i] = deft_rng_uniform01(key, (uint64_t)i) >= p ? Ty::store(v * sc) : Ty::store(C(0));
    }
}

deft_status deft_cuda_dropout(const deft_tensor *n, void *out, const void *x, cudaStream_t st) {
    const double p = n->p.dropout.p;
    if (!(p >= 0.0 && p < 1.0)) return deft_set_error(DEFT_ERR_INVALID, "dropout: probability %g is not in [0, 1)", p);
    if (!deft_same_shape(n->src[0], n))
        return deft_set_error(DEFT_ERR_SHAPE, "dropout: the input and the output differ in shape");
    const uint64_t key = deft_rng_mix(n->p.dropout.seed ^ deft_rng_mix(n->p.dropout.run));
    const double scale = 1.0 / (1.0 - p);
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        typedef typename deft_ty<T>::C C;
        deft_k_dropout<T><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (T *)out, (const T *)x, total, key, p, (C)scale);
        return deft_cuda_check_launch(n, "dropout");
    });
}
