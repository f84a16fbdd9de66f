/* An activation and its gradient over the same x in one pass (a pair of passes/fusion_pairs.c): y = act(x) and
 * dx = dy act'(x), where apart the activation's kernel reads x and the gradient's reads it again. Each value is the
 * one-op kernel's functor (cuda_elementwise_fn.cuh) in the compute type, rounded once on its store, so the pair
 * stores what the two kernels would. Element i's x and dy are read before its y and dx are written, so either
 * output may take over x's or dy's buffer. */
#include <string.h>

#include "config.h"
#include "cuda_common.cuh"
#include "cuda_elementwise_fn.cuh"
#include "cuda_kernels.h"

/* The plain kernel: one element a thread. */
template <class T, class FA, class FG>
__global__ void deft_k_act_pair(T *y, T *dx, const T *x, const T *dy, int64_t n, FA fa, FG fg) {
    typedef deft_ty<T> Ty;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        const typename Ty::C xi = Ty::load(x[i]), gi = Ty::load(dy[i]);
        y[i] = Ty::store(fa(xi));
        dx[i] = Ty::store(fg(gi, xi));
    }
}

/* 16 bytes of each operand a load, where all four pointers start on 16 bytes; the last n mod W elements one to a
 * thread. */
template <class T, class FA, class FG>
__global__ void deft_k_act_pair_vec(T *y, T *dx, const T *x, const T *dy, int64_t n, FA fa, FG fg) {
    typedef deft_ty<T> Ty;
    constexpr int W = (int)(16 / sizeof(T));
    typedef deft_vec<T, W> V;
    const int64_t nvec = n / W;
    for (int64_t v = deft_tid(); v < nvec; v += deft_nthreads()) {
        const V xv = reinterpret_cast<const V *>(x)[v], gv = reinterpret_cast<const V *>(dy)[v];
        V yv, dv;
#pragma unroll
        for (int u = 0; u < W; u++) {
            const typename Ty::C xi = Ty::load(xv.e[u]);
            yv.e[u] = Ty::store(fa(xi));
            dv.e[u] = Ty::store(fg(Ty::load(gv.e[u]), xi));
        }
        reinterpret_cast<V *>(y)[v] = yv;
        reinterpret_cast<V *>(dx)[v] = dv;
    }
    const int64_t j = nvec * W + deft_tid();
    if (j < n) {
        const typename Ty::C xj = Ty::load(x[j]);
        y[j] = Ty::store(fa(xj));
        dx[j] = Ty::store(fg(Ty::load(dy[j]), xj));
    }
}

template <template <class> class FN, class FG>
static deft_status deft_act_pair_launch(const deft_tensor *grad, void *y, void *dx, const void *x, const void *dy,
                                        cudaStream_t st, FG fg) {
    const int64_t total = deft_shape_numel(grad->ndim, grad->shape);
    return deft_with_float_dtype(grad, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        typedef typename deft_ty<T>::C C;
        const FN<C> fa = {C(0)};
        const bool vec = deft_is_aligned(y, 16) && deft_is_aligned(dx, 16) && deft_is_aligned(x, 16) &&
                         deft_is_aligned(dy, 16);
        if (vec && !deft_debug(DEFT_DEBUG_MAP_SCALAR))
            deft_k_act_pair_vec<T, FN<C>, FG>
                <<<deft_cuda_blocks(total / (int64_t)(16 / sizeof(T)) + 1, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0,
                   st>>>((T *)y, (T *)dx, (const T *)x, (const T *)dy, total, fa, fg);
        else
            deft_k_act_pair<T, FN<C>, FG><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                (T *)y, (T *)dx, (const T *)x, (const T *)dy, total, fa, fg);
        return deft_cuda_check_launch(grad, "act_pair");
    });
}

static bool deft_act_pair_same(const deft_tensor *a, const deft_tensor *b) {
    return a->ndim == b->ndim && a->dtype == b->dtype &&
           memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

extern "C" deft_status deft_cuda_act_pair(const deft_tensor *act, const deft_tensor *grad, void *y, void *dx,
                                          const void *x, const void *dy, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if (grad->op != DEFT_OP_ACT_GRAD || act->op != grad->p.act || act->src[0] != grad->src[1] ||
        !deft_act_pair_same(act, grad) || !deft_act_pair_same(grad->src[0], grad) ||
        !deft_act_pair_same(grad->src[1], grad))
        return deft_set_error(DEFT_ERR_INVALID, "act_pair: %s and %s are not an activation and its gradient over the "
                              "same x, of one shape and dtype", act->name, grad->name);
    switch (act->op) {
    case DEFT_OP_GELU: return deft_act_pair_launch<deft_m_gelu>(grad, y, dx, x, dy, st, deft_ag_gelu());
    case DEFT_OP_GELU_TANH:
        return deft_act_pair_launch<deft_m_gelu_tanh>(grad, y, dx, x, dy, st, deft_ag_gelu_tanh());
    case DEFT_OP_SILU: return deft_act_pair_launch<deft_m_silu>(grad, y, dx, x, dy, st, deft_ag_silu());
    case DEFT_OP_TANH: return deft_act_pair_launch<deft_m_tanh>(grad, y, dx, x, dy, st, deft_ag_tanh());
    case DEFT_OP_SIGMOID: return deft_act_pair_launch<deft_m_sigmoid>(grad, y, dx, x, dy, st, deft_ag_sigmoid());
    default:
        return deft_set_error(DEFT_ERR_INVALID, "act_pair: %s has no pair kernel", deft_op_name(act->op));
    }
}
