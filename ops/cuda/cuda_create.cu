/* Creation ops: full, arange, uniform, normal. Element i is computed in double and rounded once to the dtype, with
 * the same counter-based generator (rng.h) and the same formulas as the CPU (ops/cpu/cpu_create.c), so a tensor
 * made on a GPU equals the one made on the CPU. */
#include "cuda_common.cuh"
#include "rng.h"

/* __dmul_rn / __dadd_rn keep nvcc from fusing the multiply-add: the CPU rounds twice, and so must this. */
struct deft_g_full {
    double v;
    __device__ double operator()(int64_t) const { return v; }
};
struct deft_g_arange {
    double start, step;
    __device__ double operator()(int64_t i) const { return __dadd_rn(start, __dmul_rn((double)i, step)); }
};
struct deft_g_uniform {
    double a, w;
    uint64_t seed;
    __device__ double operator()(int64_t i) const {
        return __dadd_rn(a, __dmul_rn(w, deft_rng_uniform01(seed, (uint64_t)i)));
    }
};
struct deft_g_normal {
    double mean, sd;
    uint64_t seed;
    __device__ double operator()(int64_t i) const {
        return __dadd_rn(mean, __dmul_rn(sd, deft_rng_normal(seed, (uint64_t)i)));
    }
};

template <class T, class G> __global__ void deft_k_create(T *o, int64_t n, G g) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) o[i] = deft_ty<T>::from_f64(g(i));
}

template <class G> static deft_status deft_create_launch(const deft_tensor *n, void *out, cudaStream_t st, G g) {
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    return deft_cuda_with_dtype(n->dtype, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        deft_k_create<T, G><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>((T *)out,
                                                                                                      total, g);
        return deft_cuda_check_launch(n, "create");
    });
}

/* Random tensors are floating only, as on the CPU (the builder asks for a floating dtype too). */
static deft_status deft_require_float_dtype(const deft_tensor *n) {
    if (n->dtype == DEFT_F32 || n->dtype == DEFT_F64 || n->dtype == DEFT_F16 || n->dtype == DEFT_BF16) return DEFT_OK;
    return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype %s is not supported on CUDA", deft_op_name(n->op),
                          deft_dtype_name(n->dtype));
}

deft_status deft_cuda_create(const deft_tensor *n, void *out, cudaStream_t st) {
    switch (n->op) {
    case DEFT_OP_FULL: return deft_create_launch(n, out, st, deft_g_full{n->p.scalar});
    case DEFT_OP_ARANGE:
        return deft_create_launch(n, out, st, deft_g_arange{n->p.arange.start, n->p.arange.step});
    case DEFT_OP_UNIFORM: {
        deft_status s = deft_require_float_dtype(n);
        if (s != DEFT_OK) return s;
        return deft_create_launch(n, out, st, deft_g_uniform{n->p.rng.a, n->p.rng.b - n->p.rng.a, n->p.rng.seed});
    }
    case DEFT_OP_NORMAL: {
        deft_status s = deft_require_float_dtype(n);
        if (s != DEFT_OK) return s;
        return deft_create_launch(n, out, st, deft_g_normal{n->p.rng.a, n->p.rng.b, n->p.rng.seed});
    }
    default:
        return deft_set_error(DEFT_ERR_INVALID, "cuda create: %s is not a creation op", deft_op_name(n->op));
    }
}
