/* Shared by layer norm's CUDA files (cuda_layer_norm.cu: the row kernels; cuda_layer_norm_sums.cu: the weight and
 * bias gradients): vector loads, the warp sum, the arithmetic every kernel does in one rounding per operation, and
 * the dtype pairs a node may have. Not installed. */
#ifndef DEFT_CUDA_LAYER_NORM_CUH
#define DEFT_CUDA_LAYER_NORM_CUH

#include <type_traits>

#include "config.h"
#include "cuda_common.cuh"
#include "cuda_rounding.cuh"

#define DEFT_LN_WARPS 4   /* rows per block of the row kernels */
/* Warps of a block summing the weight gradient's partials, on interleaved rows of its row block: the strip kernel's
 * (cuda_layer_norm_sums.cu) and the fused dx kernel's (cuda_layer_norm.cu), which add in the same order. */
#define DEFT_LN_SUM_WARPS 8


template <class A> __device__ __forceinline__ A deft_ln_warp_sum(A v) {
    /* A butterfly: every lane ends with the same sum, added in the same order whatever the lane. */
    for (int off = 16; off > 0; off >>= 1) v = deft_rn_add(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

template <class T, int V> __device__ __forceinline__ deft_vec<T, V> deft_ln_ld(const T *p) {
    return *reinterpret_cast<const deft_vec<T, V> *>(p);
}
template <class T, int V> __device__ __forceinline__ void deft_ln_st(T *p, const deft_vec<T, V> &v) {
    *reinterpret_cast<deft_vec<T, V> *>(p) = v;
}

/* x's dtype T and the value's (or dy's) TO: the builder's pairs, TO == T or TO bf16 / f16 beside f32 T. */
template <class F> static inline deft_status deft_ln_with_pair(const deft_tensor *n, deft_dtype x, deft_dtype to, F f) {
    if (x == DEFT_F32 && to == DEFT_BF16) return f(deft_tag<float>(), deft_tag<__nv_bfloat16>());
    if (x == DEFT_F32 && to == DEFT_F16) return f(deft_tag<float>(), deft_tag<__half>());
    if (x == to) {
        switch (x) {
        case DEFT_F32: return f(deft_tag<float>(), deft_tag<float>());
        case DEFT_F64: return f(deft_tag<double>(), deft_tag<double>());
        case DEFT_F16: return f(deft_tag<__half>(), deft_tag<__half>());
        case DEFT_BF16: return f(deft_tag<__nv_bfloat16>(), deft_tag<__nv_bfloat16>());
        default: break;
        }
    }
    return deft_set_error(DEFT_ERR_DTYPE,
                          "cuda %s %s: a %s value (or dy) beside %s x is not a pair layer_norm computes",
                          deft_op_name(n->op), n->name, deft_dtype_name(to), deft_dtype_name(x));
}

/* 16-byte vectors of T (V of them) when every row starts on one (C a multiple of V) and every pointer is aligned to
 * V of its elements: ptrs of T, and of a narrower `other` type whose V elements take `other_bytes`. */
static inline bool deft_ln_vec_ok(int64_t c, int v, const void *const *ptrs, int n, size_t bytes) {
    if (c % v != 0) return false;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && !deft_is_aligned(ptrs[i], bytes)) return false;
    return true;
}

/* The weight and bias gradients (DEFT_OP_LAYER_NORM_WEIGHT_GRAD) of node n (cuda_layer_norm_sums.cu). */
deft_status deft_cuda_layer_norm_sums(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st);
/* Its second stage alone: the partials the strip kernel's order left past its value added up into out. */
deft_status deft_cuda_layer_norm_sums_total(const deft_tensor *n, void *out, cudaStream_t st);

#endif
