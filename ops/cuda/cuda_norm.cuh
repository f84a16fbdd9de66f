/* What the batch-norm files share (C++ only, not installed): cuda_norm.cu holds the entry point, the dtype dispatch
 * and the plain kernels (one block per channel, sums in double: the reference the fast ones are checked against);
 * cuda_norm_fast.cu the fast kernels (many blocks per channel, the layout's own memory walk). */
#ifndef DEFT_CUDA_NORM_CUH
#define DEFT_CUDA_NORM_CUH

#include <type_traits>

#include "cuda_elementwise_fn.cuh"
#include "cuda_image.cuh"

/* x seen as [N, C, S] (as bn_geom in cpu_norm.c): element (n, c, s) at n sN + c sC + s; NCHW has S = H W, NHWC
 * folds every non-channel axis into N (S = 1, sN = C, sC = 1). */
typedef struct deft_bn_geom {
    int64_t N, C, S, sN, sC;
} deft_bn_geom;

static inline deft_bn_geom deft_bn_geometry(const deft_tensor *x, int layout) {
    deft_bn_geom g;
    if (layout == DEFT_NHWC) {
        g.C = x->shape[x->ndim - 1];
        g.N = deft_shape_numel(x->ndim, x->shape) / g.C;
        g.S = 1, g.sN = g.C, g.sC = 1;
    } else {
        g.N = x->shape[0], g.C = x->shape[1];
        g.S = deft_shape_numel(x->ndim - 2, x->shape + 2);
        g.sN = g.C * g.S, g.sC = g.S;
    }
    return g;
}

/* The channel of linear element i, with 32-bit divisions where the tensor allows (most do). */
__device__ __forceinline__ int64_t deft_bn_channel_of(const deft_bn_geom &g, int64_t i, bool small) {
    if (small) return (int64_t)(((uint32_t)i / (uint32_t)g.sC) % (uint32_t)g.C);
    return (i / g.sC) % g.C;
}

/* Whether every element index of the tensor fits 32 bits. */
static inline bool deft_bn_small(const deft_bn_geom &g) { return g.N * g.C * g.S < ((int64_t)1 << 32); }

/* The node's data dtype (x, y, dy, dx) and parameter dtype (statistics, weight, bias, running statistics, sums). */
static inline void deft_bn_dtypes(const deft_tensor *n, deft_dtype *data, deft_dtype *param) {
    switch (n->op) {
    case DEFT_OP_BN_STATS:
        *param = n->dtype;
        *data = n->p.bn.batch ? n->src[0]->dtype : n->dtype;
        return;
    case DEFT_OP_BATCH_NORM: *data = n->dtype, *param = n->src[1]->dtype; return;
    case DEFT_OP_BATCH_NORM_GRAD: *data = n->dtype, *param = n->src[1 + n->p.bn.batch]->dtype; return;
    default: *data = n->src[0]->dtype, *param = n->dtype; return;
    }
}

/* Calls f(data tag, param tag) for the pairs batch norm runs: f32/f32, f64/f64, f16/f32 and bf16/f32 (the graph
 * builder admits no other; anything else is an error here too). */
template <class F> static inline deft_status deft_bn_with_dtypes(const deft_tensor *n, F f) {
    deft_dtype d, p;
    deft_bn_dtypes(n, &d, &p);
    if (d == DEFT_F32 && p == DEFT_F32) return f(deft_tag<float>(), deft_tag<float>());
    if (d == DEFT_F64 && p == DEFT_F64) return f(deft_tag<double>(), deft_tag<double>());
    if (d == DEFT_F16 && p == DEFT_F32) return f(deft_tag<__half>(), deft_tag<float>());
    if (d == DEFT_BF16 && p == DEFT_F32) return f(deft_tag<__nv_bfloat16>(), deft_tag<float>());
    return deft_set_error(DEFT_ERR_DTYPE, "%s: batch norm on CUDA takes f32, f64, or f16/bf16 data with f32 "
                          "statistics; got %s data with %s statistics", n->name, deft_dtype_name(d),
                          deft_dtype_name(p));
}

/* What an add of r and a ReLU after the normalisation store, from the normalised value y already rounded to T: each
 * step rounded to T as its own one-op kernel rounds it (cuda_elementwise.cu), so that a fused group
 * (passes/fusion_norm.c) stores what the three kernels would, bit for bit. r NULL: no add. */
template <class T>
__device__ __forceinline__ T deft_bn_epilogue(T y, const T *r, int64_t i, bool relu) {
    typedef typename deft_ty<T>::C A;
    if (r) y = deft_ty<T>::store(deft_f_add()(deft_ty<T>::load(y), deft_ty<T>::load(r[i])));
    if (relu) y = deft_ty<T>::store(deft_m_relu<A>()(deft_ty<T>::load(y)));
    return y;
}

/* The gradient batch norm's backward kernels read. With MASK, a ReLU's gradient folded into them
 * (passes/fusion_norm_grad.c): g is the ReLU's incoming gradient and y its output, and element i is what the
 * act_grad kernel (cuda_train.cu) would have stored there, deft_ag_relu's mask rounded to T, bit for bit (NaN and -0
 * included). Without it, g is dy and y is not read: the flag is a template parameter, so the unmasked kernels are
 * the same code as before. */
template <class T, bool MASK> struct deft_bn_dy {
    const T *g, *y;
    __device__ __forceinline__ T operator[](int64_t i) const {
        if (!MASK) return g[i];
        return deft_ty<T>::store(deft_ag_relu()(deft_ty<T>::load(g[i]), deft_ty<T>::load(y[i])));
    }
};

/* Calls f(std::true_type()) when `mask` is set (a folded ReLU gradient), f(std::false_type()) otherwise. */
template <class F> static inline deft_status deft_bn_with_mask(const void *mask, F f) {
    if (mask) return f(std::true_type());
    return f(std::false_type());
}

/* The inputs of an elementwise pass, by role, as the graph orders them (ir/build_norm.c): the normalisation reads
 * (x, stats[, weight][, bias]); dx in training (dy, x, stats, sums[, weight]), in evaluation (dy, stats[, weight]).
 * What a node lacks is NULL. */
template <class T, class P> struct deft_bn_pass_inputs {
    const T *x, *dy;
    const P *stats, *sums, *w, *b;
};

template <class T, class P>
static inline deft_bn_pass_inputs<T, P> deft_bn_forward_inputs(const deft_tensor *n, const void *const *in) {
    const int has_w = n->p.bn.has_weight;
    return deft_bn_pass_inputs<T, P>{(const T *)in[0], NULL, (const P *)in[1], NULL, has_w ? (const P *)in[2] : NULL,
                                      n->p.bn.has_bias ? (const P *)in[2 + has_w] : NULL};
}

template <class T, class P>
static inline deft_bn_pass_inputs<T, P> deft_bn_input_grad_inputs(const deft_tensor *n, const void *const *in) {
    const int batch = n->p.bn.batch;
    return deft_bn_pass_inputs<T, P>{batch ? (const T *)in[1] : NULL, (const T *)in[0], (const P *)in[1 + batch],
                                      batch ? (const P *)in[3] : NULL,
                                      n->p.bn.has_weight ? (const P *)in[batch ? 4 : 2] : NULL, NULL};
}

/* Whether the debug knob DEFT_DEBUG_BN_REFERENCE sends batch norm through the plain kernels (cuda_norm.cu). */
bool deft_bn_reference_requested(void);

/* The fast kernels (cuda_norm_fast.cu) for every op of deft_cuda_batch_norm. *done = false when they do not take
 * this node (their workspace cannot be had inside a capture, or the shape is past what it holds): nothing ran, and
 * the caller takes the plain path. `mask` (gradient ops only; NULL for none): the output of a ReLU whose gradient
 * in[0] is, masked on load (deft_bn_dy). */
deft_status deft_cuda_batch_norm_fast(const deft_tensor *n, void *out, const void *const *in, const void *mask,
                                      cudaStream_t st, bool *done);
/* The fast normalisation (DEFT_OP_BATCH_NORM) followed by the add of `residual` (n's shape and dtype; NULL for none)
 * and a ReLU when `relu`: always runs. */
deft_status deft_cuda_batch_norm_fast_epilogue(const deft_tensor *n, void *out, const void *const *in,
                                               const void *residual, bool relu, cudaStream_t st);

#endif
