/* Batch norm on CUDA: the entry point, and the plain kernels that mirror the CPU's (ops/cpu/cpu_norm.c), kept as the
 * reference for the fast ones (cuda_norm_fast.cu; DEFT_DEBUG_BN_REFERENCE selects these). The statistics node computes
 * each channel's mean and 1 / sqrt(var + eps) (and, in training with running statistics, updates them in place
 * with the momentum rule and the unbiased variance); the sums node gives the sums of dy and of dy xhat per channel;
 * the normalising node and dx read them. Per-channel sums run one block per channel, in double as on the CPU, the
 * mean first and the squared deviations after (two passes), so no scratch memory is needed and every kernel is
 * capturable. Data T is f32, f64, f16 or bf16; statistics and parameters P are f32 for the half types (torch's
 * cuDNN contract) and T otherwise. */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda_block_reduce.cuh"
#include "cuda_kernels.h"
#include "cuda_norm.cuh"

__device__ __forceinline__ int64_t deft_bn_at(const deft_bn_geom &g, int64_t c, int64_t j) {
    return (j / g.S) * g.sN + c * g.sC + j % g.S;   /* j-th element of channel c, j over N S */
}

template <class T> __device__ __forceinline__ double deft_bn_ld(const T *p, int64_t i) {
    return (double)deft_ty<T>::load(p[i]);
}

template <class T, bool MASK> __device__ __forceinline__ double deft_bn_ld(const deft_bn_dy<T, MASK> &p, int64_t i) {
    return (double)deft_ty<T>::load(p[i]);
}

/* The sum over channel c's elements of f(j-th element's offset); every thread of the block gets it. */
template <class F> __device__ double deft_bn_channel_sum(const deft_bn_geom &g, int64_t c, F f) {
    const int64_t m = g.N * g.S;
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) acc += f(deft_bn_at(g, c, j));
    return deft_block_reduce(acc, deft_r_sum());
}

/* Training: one block per channel. rm and rv are NULL when there is nothing to update. */
template <class T, class P>
__global__ void deft_bn_stats_kernel(deft_bn_geom g, const T *x, P *stats, P *rm, P *rv, double eps, double mom) {
    const double m = (double)(g.N * g.S);
    for (int64_t c = blockIdx.x; c < g.C; c += gridDim.x) {
        const double mean = deft_bn_channel_sum(g, c, [&](int64_t at) { return deft_bn_ld(x, at); }) / m;
        const double var = deft_bn_channel_sum(g, c, [&](int64_t at) {
                               const double d = deft_bn_ld(x, at) - mean;
                               return d * d;
                           }) / m;
        if (threadIdx.x != 0) continue;
        stats[c] = deft_ty<P>::from_f64(mean);
        stats[g.C + c] = deft_ty<P>::from_f64(1.0 / sqrt(var + eps));
        if (!rm) continue;
        rm[c] = deft_ty<P>::from_f64((1.0 - mom) * deft_bn_ld(rm, c) + mom * mean);
        rv[c] = deft_ty<P>::from_f64((1.0 - mom) * deft_bn_ld(rv, c) + mom * var * m / (m - 1.0));
    }
}

/* Evaluation: the running statistics become the stats node's values (the fast path uses it too). */
template <class P> __global__ void deft_bn_eval_stats_kernel(int64_t C, const P *rm, const P *rv, P *stats,
                                                             double eps) {
    for (int64_t c = deft_tid(); c < C; c += deft_nthreads()) {
        stats[c] = deft_ty<P>::from_f64(deft_bn_ld(rm, c));
        stats[C + c] = deft_ty<P>::from_f64(1.0 / sqrt(deft_bn_ld(rv, c) + eps));
    }
}

/* y = (x - mean) invstd weight + bias; w and b may be NULL. */
template <class T, class P>
__global__ void deft_bn_forward_kernel(deft_bn_geom g, const T *x, const P *stats, const P *w, const P *b,
                                       const T *r, bool relu, T *y, int64_t total) {
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t c = (i / g.sC) % g.C;
        double v = (deft_bn_ld(x, i) - deft_bn_ld(stats, c)) * deft_bn_ld(stats, g.C + c);
        if (w) v *= deft_bn_ld(w, c);
        if (b) v += deft_bn_ld(b, c);
        y[i] = deft_bn_epilogue(deft_ty<T>::from_f64(v), r, i, relu);
    }
}

/* dx: in training w invstd (dy - mean(dy) - xhat mean(dy xhat)) from the sums node; in evaluation (x and sums
 * NULL) dy invstd w. */
template <class T, class P, bool MASK>
__global__ void deft_bn_input_grad_kernel(deft_bn_geom g, deft_bn_dy<T, MASK> dy, const T *x, const P *stats,
                                          const P *sums, const P *w, T *dx, int64_t total) {
    const double m = (double)(g.N * g.S);
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t c = (i / g.sC) % g.C;
        const double invstd = deft_bn_ld(stats, g.C + c), scale = invstd * (w ? deft_bn_ld(w, c) : 1.0);
        if (!x) {
            dx[i] = deft_ty<T>::from_f64(deft_bn_ld(dy, i) * scale);
            continue;
        }
        const double xhat = (deft_bn_ld(x, i) - deft_bn_ld(stats, c)) * invstd;
        dx[i] = deft_ty<T>::from_f64(
            scale * (deft_bn_ld(dy, i) - deft_bn_ld(sums, c) / m - xhat * deft_bn_ld(sums, g.C + c) / m));
    }
}

/* sums [2, C] = the sums of dy and of dy xhat, one block per channel. */
template <class T, class P, bool MASK>
__global__ void deft_bn_grad_sums_kernel(deft_bn_geom g, deft_bn_dy<T, MASK> dy, const T *x, const P *stats, P *sums) {
    for (int64_t c = blockIdx.x; c < g.C; c += gridDim.x) {
        const double mean = deft_bn_ld(stats, c), invstd = deft_bn_ld(stats, g.C + c);
        const double s_dy = deft_bn_channel_sum(g, c, [&](int64_t at) { return deft_bn_ld(dy, at); });
        const double s_dy_xhat = deft_bn_channel_sum(g, c, [&](int64_t at) {
            return deft_bn_ld(dy, at) * (deft_bn_ld(x, at) - mean) * invstd;
        });
        if (threadIdx.x != 0) continue;
        sums[c] = deft_ty<P>::from_f64(s_dy);
        sums[g.C + c] = deft_ty<P>::from_f64(s_dy_xhat);
    }
}

static unsigned deft_bn_channel_blocks(int64_t C) {
    return (unsigned)(C > DEFT_CUDA_MAX_BLOCKS ? DEFT_CUDA_MAX_BLOCKS : (C < 1 ? 1 : C));
}

/* src (x[, running_mean, running_var]) in training, (running_mean, running_var) in evaluation. */
template <class T, class P> static deft_status deft_bn_stats(const deft_tensor *n, void *out, const void *const *in,
                                                             cudaStream_t st) {
    const int64_t C = n->shape[1];
    if (!n->p.bn.batch) {
        deft_bn_eval_stats_kernel<P><<<deft_cuda_blocks(C, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            C, (const P *)in[0], (const P *)in[1], (P *)out, n->p.bn.eps);
        return deft_cuda_check_launch(n, "batch norm eval stats");
    }
    const deft_bn_geom g = deft_bn_geometry(n->src[0], n->p.bn.layout);
    P *rm = n->p.bn.update ? (P *)in[1] : NULL, *rv = n->p.bn.update ? (P *)in[2] : NULL;
    const int threads = deft_reduce_threads(g.N * g.S);
    deft_bn_stats_kernel<T, P><<<deft_bn_channel_blocks(C), threads, 0, st>>>(g, (const T *)in[0], (P *)out, rm, rv,
                                                                              n->p.bn.eps, n->p.bn.momentum);
    return deft_cuda_check_launch(n, "batch norm stats");
}

/* src (x, stats[, weight][, bias]); then the add of r (NULL: none) and a ReLU when relu. */
template <class T, class P> static deft_status deft_bn_forward(const deft_tensor *n, void *out,
                                                               const void *const *in, const void *r, bool relu,
                                                               cudaStream_t st) {
    const deft_bn_geom g = deft_bn_geometry(n, n->p.bn.layout);
    const deft_bn_pass_inputs<T, P> a = deft_bn_forward_inputs<T, P>(n, in);
    const int64_t total = g.N * g.C * g.S;
    deft_bn_forward_kernel<T, P><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        g, a.x, a.stats, a.w, a.b, (const T *)r, relu, (T *)out, total);
    return deft_cuda_check_launch(n, "batch norm");
}

/* Training: src (dy, x, stats, sums[, w]); evaluation: src (dy, stats[, w]). dy masked by `mask` with MASK. */
template <class T, class P, bool MASK>
static deft_status deft_bn_input_grad(const deft_tensor *n, void *out, const void *const *in, const void *mask,
                                      cudaStream_t st) {
    const deft_bn_geom g = deft_bn_geometry(n, n->p.bn.layout);
    const deft_bn_pass_inputs<T, P> a = deft_bn_input_grad_inputs<T, P>(n, in);
    const int64_t total = g.N * g.C * g.S;
    deft_bn_input_grad_kernel<T, P, MASK><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        g, deft_bn_dy<T, MASK>{a.dy, (const T *)mask}, a.x, a.stats, a.sums, a.w, (T *)out, total);
    return deft_cuda_check_launch(n, "batch norm grad");
}

/* src (dy, x, stats); dy masked by `mask` with MASK. */
template <class T, class P, bool MASK>
static deft_status deft_bn_grad_sums(const deft_tensor *n, void *out, const void *const *in, const void *mask,
                                     cudaStream_t st) {
    const deft_bn_geom g = deft_bn_geometry(n->src[0], n->p.bn.layout);
    deft_bn_grad_sums_kernel<T, P, MASK><<<deft_bn_channel_blocks(g.C), deft_reduce_threads(g.N * g.S), 0, st>>>(
        g, deft_bn_dy<T, MASK>{(const T *)in[0], (const T *)mask}, (const T *)in[1], (const P *)in[2], (P *)out);
    return deft_cuda_check_launch(n, "batch norm grad sums");
}

bool deft_bn_reference_requested(void) {
    return deft_debug(DEFT_DEBUG_BN_REFERENCE) != 0;
}

/* Every op, the fast kernels first unless the plain ones are asked for; `mask` as in deft_cuda_batch_norm_fast. */
static deft_status deft_bn_run(const deft_tensor *n, void *out, const void *const *in, const void *mask,
                               cudaStream_t st) {
    if (!deft_bn_reference_requested()) {
        bool done = false;
        const deft_status s = deft_cuda_batch_norm_fast(n, out, in, mask, st, &done);
        if (s != DEFT_OK || done) return s;
    }
    return deft_bn_with_dtypes(n, [&](auto data, auto param) -> deft_status {
        typedef typename decltype(data)::type T;
        typedef typename decltype(param)::type P;
        switch (n->op) {
        case DEFT_OP_BN_STATS: return deft_bn_stats<T, P>(n, out, in, st);
        case DEFT_OP_BATCH_NORM: return deft_bn_forward<T, P>(n, out, in, NULL, false, st);
        default: break;
        }
        return deft_bn_with_mask(mask, [&](auto masked) -> deft_status {
            constexpr bool MASK = decltype(masked)::value;
            if (n->op == DEFT_OP_BATCH_NORM_GRAD) return deft_bn_input_grad<T, P, MASK>(n, out, in, mask, st);
            return deft_bn_grad_sums<T, P, MASK>(n, out, in, mask, st);
        });
    });
}

deft_status deft_cuda_batch_norm(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st) {
    return deft_bn_run(n, out, in, NULL, st);
}

deft_status deft_cuda_batch_norm_grad_masked(const deft_tensor *n, void *out, const void *const *in,
                                             const void *relu_out, void *stream) {
    if (n->op != DEFT_OP_BATCH_NORM_GRAD && n->op != DEFT_OP_BATCH_NORM_WEIGHT_GRAD)
        return deft_set_error(DEFT_ERR_INVALID, "%s: a ReLU's gradient folds into batch norm's backward, not %s",
                              n->name, deft_op_name(n->op));
    if (!relu_out || !in[0])
        return deft_set_error(DEFT_ERR_INVALID, "%s: a folded ReLU gradient needs its gradient and its output",
                              n->name);
    return deft_bn_run(n, out, in, relu_out, (cudaStream_t)stream);
}

deft_status deft_cuda_batch_norm_epilogue(const deft_tensor *n, void *out, const void *const *in, const void *residual,
                                          int relu, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if (n->op != DEFT_OP_BATCH_NORM)
        return deft_set_error(DEFT_ERR_INVALID, "%s: a batch norm epilogue follows a normalisation, not %s", n->name,
                              deft_op_name(n->op));
    if (!deft_bn_reference_requested()) return deft_cuda_batch_norm_fast_epilogue(n, out, in, residual, relu != 0, st);
    return deft_bn_with_dtypes(n, [&](auto data, auto param) -> deft_status {
        typedef typename decltype(data)::type T;
        typedef typename decltype(param)::type P;
        return deft_bn_forward<T, P>(n, out, in, residual, relu != 0, st);
    });
}
