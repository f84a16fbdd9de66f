/* Elementwise kernels: broadcasting binary ops and comparisons, tensor-scalar ops, unary ops and casts. One
 * grid-stride loop per op and dtype; the formulas are the CPU backend's (ops/cpu/cpu_binary.c, cpu_unary.c), written
 * once for float and double through the overloads below. */
#include <math.h>
#include <string.h>

#include "config.h"
#include "cuda_common.cuh"
#include "cuda_elementwise_fn.cuh"

/* ---- binary (the functors are in cuda_elementwise_fn.cuh) ---- */
template <class T, class Op>
__global__ void deft_k_binary_flat(T *o, const T *a, const T *b, int64_t n, Op op) {
    typedef deft_ty<T> Ty;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) o[i] = Ty::store(op(Ty::load(a[i]), Ty::load(b[i])));
}

template <class T, class Op>
__global__ void deft_k_binary_strided(T *o, const T *a, const T *b, int64_t n, deft_cuda_strides s, Op op) {
    typedef deft_ty<T> Ty;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        int64_t oa, ob;
        deft_cuda_offsets(s, i, &oa, &ob);
        o[i] = Ty::store(op(Ty::load(a[oa]), Ty::load(b[ob])));
    }
}

template <class T, class Op>
static deft_status deft_binary_launch(const deft_tensor *n, T *o, const T *a, const T *b, cudaStream_t st, Op op) {
    const deft_tensor *ta = n->src[0], *tb = n->src[1];
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    deft_cuda_strides s;
    s.ndim = n->ndim;
    memcpy(s.shape, n->shape, sizeof s.shape);
    deft_broadcast_strides(ta->ndim, ta->shape, n->ndim, n->shape, s.st[0]);
    deft_broadcast_strides(tb->ndim, tb->shape, n->ndim, n->shape, s.st[1]);
    deft_cuda_coalesce(&s, 2);
    const unsigned blocks = deft_cuda_blocks(total, DEFT_CUDA_THREADS);
    if (s.ndim == 0 || (s.ndim == 1 && s.st[0][0] == 1 && s.st[1][0] == 1))
        deft_k_binary_flat<T, Op><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(o, a, b, total, op);
    else
        deft_k_binary_strided<T, Op><<<blocks, DEFT_CUDA_THREADS, 0, st>>>(o, a, b, total, s, op);
    return deft_cuda_check_launch(n, "binary");
}

template <class Op>
static deft_status deft_binary_typed(const deft_tensor *n, void *out, const void *a, const void *b, cudaStream_t st,
                                     Op op) {
    return deft_cuda_with_dtype(n->dtype, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        return deft_binary_launch<T, Op>(n, (T *)out, (const T *)a, (const T *)b, st, op);
    });
}

deft_status deft_cuda_binary(const deft_tensor *n, void *out, const void *a, const void *b, cudaStream_t st) {
    switch (n->op) {
    case DEFT_OP_ADD: return deft_binary_typed(n, out, a, b, st, deft_f_add());
    case DEFT_OP_SUB: return deft_binary_typed(n, out, a, b, st, deft_f_sub());
    case DEFT_OP_MUL: return deft_binary_typed(n, out, a, b, st, deft_f_mul());
    case DEFT_OP_MAXIMUM: return deft_binary_typed(n, out, a, b, st, deft_f_maximum());
    case DEFT_OP_EQ: return deft_binary_typed(n, out, a, b, st, deft_f_eq());
    case DEFT_OP_GT: return deft_binary_typed(n, out, a, b, st, deft_f_gt());
    case DEFT_OP_GE: return deft_binary_typed(n, out, a, b, st, deft_f_ge());
    case DEFT_OP_DIV:
        /* Integer division is not an op deft has (the builder asks for a floating dtype), as on the CPU. */
        if (n->dtype == DEFT_I32)
            return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype i32 is not supported on CUDA", deft_op_name(n->op));
        return deft_binary_typed(n, out, a, b, st, deft_f_div());
    default: return deft_set_error(DEFT_ERR_INVALID, "cuda binary: %s is not a binary op", deft_op_name(n->op));
    }
}

/* ---- unary and scalar ops on the floating dtypes: a functor of the compute type C ---- */
template <class T, class F> __global__ void deft_k_map(T *o, const T *a, int64_t n, F f) {
    typedef deft_ty<T> Ty;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) o[i] = Ty::store(f(Ty::load(a[i])));
}

/* The same with 16 bytes a load and store where both start on 16 bytes: GPT-2's GELU over bf16 moved 2 bytes a load
 * one element a thread and ran well under the memory's rate. The last n mod V elements go one to a thread. */
template <class T, class F> __global__ void deft_k_map_vec(T *o, const T *a, int64_t n, F f) {
    typedef deft_ty<T> Ty;
    constexpr int V = (int)(16 / sizeof(T));
    typedef deft_vec<T, V> Vec;
    const int64_t nvec = n / V;
    for (int64_t v = deft_tid(); v < nvec; v += deft_nthreads()) {
        const Vec in = reinterpret_cast<const Vec *>(a)[v];
        Vec r;
#pragma unroll
        for (int u = 0; u < V; u++) r.e[u] = Ty::store(f(Ty::load(in.e[u])));
        reinterpret_cast<Vec *>(o)[v] = r;
    }
    const int64_t j = nvec * V + deft_tid();
    if (j < n) o[j] = Ty::store(f(Ty::load(a[j])));
}

/* FN<C> is a functor of the compute type; `y` is the op's scalar rounded to C (torch computes a float tensor with a
 * python scalar in the tensor's precision, and so does the CPU backend). */
template <template <class> class FN>
static deft_status deft_map_float(const deft_tensor *n, void *out, const void *a, cudaStream_t st, double y) {
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        typedef typename deft_ty<T>::C C;
        FN<C> f;
        f.y = (C)y;
        if (deft_is_aligned(out, 16) && deft_is_aligned(a, 16) && !deft_debug(DEFT_DEBUG_MAP_SCALAR))
            deft_k_map_vec<T, FN<C>><<<deft_cuda_blocks(total / (int64_t)(16 / sizeof(T)) + 1, DEFT_CUDA_THREADS),
                                       DEFT_CUDA_THREADS, 0, st>>>((T *)out, (const T *)a, total, f);
        else
            deft_k_map<T, FN<C>><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                (T *)out, (const T *)a, total, f);
        return deft_cuda_check_launch(n, "map");
    });
}

/* ---- i32: integral scalars keep integer semantics (wrapping); others go through double and truncate ---- */
enum { DEFT_SK_ADD, DEFT_SK_RSUB, DEFT_SK_MUL, DEFT_SK_DIV, DEFT_SK_MAX };

__global__ void deft_k_scalar_i32(int32_t *o, const int32_t *a, int64_t n, int kind, double s, int integral) {
    const int64_t yi = integral ? (int64_t)s : 0;
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        if (integral) {
            /* Unsigned 64-bit arithmetic wraps where int64 would overflow; the low 32 bits are the same. */
            uint64_t x = (uint64_t)(int64_t)a[i], y = (uint64_t)yi, r;
            switch (kind) {
            case DEFT_SK_ADD: r = x + y; break;
            case DEFT_SK_RSUB: r = y - x; break;
            case DEFT_SK_MUL: r = x * y; break;
            default: r = (int64_t)a[i] > yi ? x : y; break;
            }
            o[i] = (int32_t)(uint32_t)r;
        } else {
            double x = (double)a[i], r;
            switch (kind) {
            case DEFT_SK_ADD: r = x + s; break;
            case DEFT_SK_RSUB: r = s - x; break;
            case DEFT_SK_MUL: r = x * s; break;
            case DEFT_SK_DIV: r = x / s; break;
            default: r = deft_max_nan(x, s); break;
            }
            o[i] = deft_f64_to_i32(r);
        }
    }
}

static deft_status deft_scalar_i32(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    int kind;
    switch (n->op) {
    case DEFT_OP_ADD_SCALAR: kind = DEFT_SK_ADD; break;
    case DEFT_OP_RSUB_SCALAR: kind = DEFT_SK_RSUB; break;
    case DEFT_OP_MUL_SCALAR: kind = DEFT_SK_MUL; break;
    case DEFT_OP_DIV_SCALAR: kind = DEFT_SK_DIV; break;
    case DEFT_OP_MAXIMUM_SCALAR: kind = DEFT_SK_MAX; break;
    default:
        return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype i32 is not supported on CUDA", deft_op_name(n->op));
    }
    const double s = n->p.scalar;
    const int integral = s == floor(s) && fabs(s) < 9007199254740992.0 && kind != DEFT_SK_DIV;
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    deft_k_scalar_i32<<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        (int32_t *)out, (const int32_t *)a, total, kind, s, integral);
    return deft_cuda_check_launch(n, "scalar_i32");
}

deft_status deft_cuda_scalar(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    if (n->dtype == DEFT_I32) return deft_scalar_i32(n, out, a, st);
    const double s = n->p.scalar;
    switch (n->op) {
    case DEFT_OP_ADD_SCALAR: return deft_map_float<deft_m_add_s>(n, out, a, st, s);
    case DEFT_OP_RSUB_SCALAR: return deft_map_float<deft_m_rsub_s>(n, out, a, st, s);
    case DEFT_OP_MUL_SCALAR: return deft_map_float<deft_m_mul_s>(n, out, a, st, s);
    case DEFT_OP_DIV_SCALAR: return deft_map_float<deft_m_div_s>(n, out, a, st, s);
    case DEFT_OP_RDIV_SCALAR: return deft_map_float<deft_m_rdiv_s>(n, out, a, st, s);
    case DEFT_OP_MAXIMUM_SCALAR: return deft_map_float<deft_m_max_s>(n, out, a, st, s);
    case DEFT_OP_POW_SCALAR: return deft_map_float<deft_m_pow_s>(n, out, a, st, s);
    default: return deft_set_error(DEFT_ERR_INVALID, "cuda scalar: %s is not a scalar op", deft_op_name(n->op));
    }
}

/* i32 has only the two unary ops that make sense on integers; -INT32_MIN wraps to itself, as on the CPU. */
__global__ void deft_k_unary_i32(int32_t *o, const int32_t *a, int64_t n, int neg) {
    for (int64_t i = deft_tid(); i < n; i += deft_nthreads()) {
        int32_t x = a[i];
        o[i] = neg ? (int32_t)(0u - (uint32_t)x) : (x < 0 ? 0 : x);
    }
}

static deft_status deft_unary_i32(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    if (n->op != DEFT_OP_NEG && n->op != DEFT_OP_RELU)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: dtype i32 is not supported on CUDA", deft_op_name(n->op));
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    deft_k_unary_i32<<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        (int32_t *)out, (const int32_t *)a, total, n->op == DEFT_OP_NEG);
    return deft_cuda_check_launch(n, "unary_i32");
}

deft_status deft_cuda_unary(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    if (n->dtype == DEFT_I32) return deft_unary_i32(n, out, a, st);
    switch (n->op) {
    case DEFT_OP_NEG: return deft_map_float<deft_m_neg>(n, out, a, st, 0.0);
    case DEFT_OP_EXP: return deft_map_float<deft_m_exp>(n, out, a, st, 0.0);
    case DEFT_OP_LOG: return deft_map_float<deft_m_log>(n, out, a, st, 0.0);
    case DEFT_OP_SQRT: return deft_map_float<deft_m_sqrt>(n, out, a, st, 0.0);
    case DEFT_OP_RSQRT: return deft_map_float<deft_m_rsqrt>(n, out, a, st, 0.0);
    case DEFT_OP_TANH: return deft_map_float<deft_m_tanh>(n, out, a, st, 0.0);
    case DEFT_OP_SIGMOID: return deft_map_float<deft_m_sigmoid>(n, out, a, st, 0.0);
    case DEFT_OP_RELU: return deft_map_float<deft_m_relu>(n, out, a, st, 0.0);
    case DEFT_OP_GELU: return deft_map_float<deft_m_gelu>(n, out, a, st, 0.0);
    case DEFT_OP_GELU_TANH: return deft_map_float<deft_m_gelu_tanh>(n, out, a, st, 0.0);
    case DEFT_OP_SILU: return deft_map_float<deft_m_silu>(n, out, a, st, 0.0);
    default: return deft_set_error(DEFT_ERR_INVALID, "cuda unary: %s is not a unary op", deft_op_name(n->op));
    }
}

/* ---- casts (deft_cast_one, cuda_common.cuh) ---- */

/* Four loads in flight per thread before their stores (the casts of weights and gradients under autocast move
 * hundreds of megabytes a step: one element at a time ran well under the memory's rate; bench/RESULTS.md, "Third
 * round"). */
template <class TI, class TO> __global__ void deft_k_cast(TO *__restrict__ o, const TI *__restrict__ a, int64_t n) {
    const int64_t stride = deft_nthreads();
    int64_t i = deft_tid();
    for (; i + 3 * stride < n; i += 4 * stride) {
        TI v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = a[i + u * stride];
#pragma unroll
        for (int u = 0; u < 4; u++) o[i + u * stride] = deft_cast_one<TI, TO>(v[u]);
    }
    for (; i < n; i += stride) o[i] = deft_cast_one<TI, TO>(a[i]);
}

/* The same with four neighbouring elements per load and store (16 bytes of f32, 8 of a half), for aligned storage;
 * the last n % 4 elements go one by one. */
template <class TI, class TO>
__global__ void deft_k_cast_vec4(TO *__restrict__ o, const TI *__restrict__ a, int64_t n) {
    const int64_t n4 = n / 4, stride = deft_nthreads();
    for (int64_t i = deft_tid(); i < n4; i += stride) deft_cast_four<TI, TO>(a + 4 * i, o + 4 * i);
    for (int64_t i = 4 * n4 + deft_tid(); i < n; i += stride) o[i] = deft_cast_one<TI, TO>(a[i]);
}

deft_status deft_cuda_cast(const deft_tensor *n, void *out, const void *a, cudaStream_t st) {
    const deft_dtype from = n->src[0]->dtype;
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    if (from == n->dtype) {
        cudaError_t e = cudaMemcpyAsync(out, a, (size_t)total * deft_dtype_size(from), cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) (void)cudaGetLastError();
        return e == cudaSuccess ? DEFT_OK
                                : deft_set_error(DEFT_ERR_RUNTIME, "cuda cast: copy failed: %s", cudaGetErrorString(e));
    }
    return deft_cuda_with_dtype(from, [&](auto tin) -> deft_status {
        typedef typename decltype(tin)::type TI;
        return deft_cuda_with_dtype(n->dtype, [&](auto tout) -> deft_status {
            typedef typename decltype(tout)::type TO;
            const bool aligned = (uintptr_t)a % (4 * sizeof(TI)) == 0 && (uintptr_t)out % (4 * sizeof(TO)) == 0;
            if (aligned && total >= 4)
                deft_k_cast_vec4<TI, TO><<<deft_cuda_blocks(total / 4, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                    (TO *)out, (const TI *)a, total);
            else
                deft_k_cast<TI, TO><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
                    (TO *)out, (const TI *)a, total);
            return deft_cuda_check_launch(n, "cast");
        });
    });
}
