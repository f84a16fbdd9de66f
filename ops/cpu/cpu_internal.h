/* Shared by the CPU kernel files in ops/cpu: element conversion, the OpenMP switch, and the entry point of each
 * file, which cpu_dispatch.c calls. Not installed. */
#ifndef DEFT_CPU_INTERNAL_H
#define DEFT_CPU_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "cpu_tuning.h"
#include "element.h"
#include "half.h"

/* `#pragma omp` in a build without OpenMP trips -Wunknown-pragmas (part of -Wall, and -Werror is on), so every
 * parallel loop goes through this macro, which vanishes when _OPENMP is not defined. */
#define DEFT_CPU_STR_(...) #__VA_ARGS__
#ifdef _OPENMP
#define DEFT_OMP(...) _Pragma(DEFT_CPU_STR_(omp __VA_ARGS__))
#else
#define DEFT_OMP(...)
#endif

/* cpu_tuning.h: below DEFT_CPU_PAR_MIN elements, starting a parallel region costs more than it saves; elementwise
 * walks split rows into segments of at most DEFT_CPU_SEGMENT elements, so that a few long rows still spread over
 * every thread. */

static inline int deft_cpu_is_float(deft_dtype dt) {
    return dt == DEFT_F32 || dt == DEFT_F64 || dt == DEFT_F16 || dt == DEFT_BF16;
}


/* Wrapping int64 -> int32, as torch's integer arithmetic overflows (two's complement). */
static inline int32_t deft_cpu_wrap_i32(int64_t v) {
    uint32_t u = (uint32_t)(uint64_t)v;
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)(u - 2147483648u) + INT32_MIN;
}



/* The branch keeps exp's argument non-positive, so neither side overflows for large |x|. */
static inline float sigmoid_f(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}
static inline double sigmoid_d(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* DEFT_ERR_DTYPE naming the op and the dtype. */
deft_status deft_cpu_dtype_error(const deft_tensor *n, deft_dtype dt);

/* Drops size-1 dims and merges neighbours that are contiguous in every operand. shape and each of the nops stride
 * arrays (strs[k][d], elements) are rewritten in place; returns the new rank (0 for a single element). The output
 * is taken to be contiguous over `shape`. */
int deft_cpu_coalesce(int ndim, int64_t *shape, int nops, int64_t (*strs)[DEFT_MAX_DIMS]);

/* ---- one entry per file ---- */
deft_status deft_cpu_binary(const deft_tensor *n, void *out, const void *a, const void *b);    /* cpu_binary.c */
deft_status deft_cpu_scalar(const deft_tensor *n, void *out, const void *a);                   /* cpu_binary.c */
deft_status deft_cpu_unary(const deft_tensor *n, void *out, const void *a);                    /* cpu_unary.c */
deft_status deft_cpu_cast(const deft_tensor *n, void *out, const void *a);                     /* cpu_unary.c */
deft_status deft_cpu_matmul(const deft_tensor *n, void *out, const void *a, const void *b);    /* cpu_matmul.c */
deft_status deft_cpu_permute(const deft_tensor *n, void *out, const void *a);                  /* cpu_shape.c */
deft_status deft_cpu_slice(const deft_tensor *n, void *out, const void *a);                    /* cpu_shape.c */
deft_status deft_cpu_concat(const deft_tensor *n, void *out, const void *const *in);           /* cpu_shape.c */
deft_status deft_cpu_reduce(const deft_tensor *n, void *out, const void *a);                   /* cpu_reduce.c */
deft_status deft_cpu_softmax(const deft_tensor *n, void *out, const void *a);                  /* cpu_softmax.c */
deft_status deft_cpu_create(const deft_tensor *n, void *out);                                  /* cpu_create.c */
/* cpu_train.c: the ops of training (activation gradients, expand, slice gradients, dropout); cross-entropy in
 * cpu_cross_entropy.c */
deft_status deft_cpu_act_grad(const deft_tensor *n, void *out, const void *dy, const void *x);
deft_status deft_cpu_expand(const deft_tensor *n, void *out, const void *a);
deft_status deft_cpu_slice_grad(const deft_tensor *n, void *out, const void *dy);
deft_status deft_cpu_cross_entropy(const deft_tensor *n, void *out, const void *logits, const void *targets);
deft_status deft_cpu_cross_entropy_grad(const deft_tensor *n, void *out, const void *dloss, const void *logits,
                                        const void *targets);
deft_status deft_cpu_dropout(const deft_tensor *n, void *out, const void *x);
/* conv2d, pooling and batch norm, with their gradients: one entry per file, switching on n->op */
deft_status deft_cpu_conv2d(const deft_tensor *n, void *out, const void *const *in);      /* cpu_conv.c */
deft_status deft_cpu_pool2d(const deft_tensor *n, void *out, const void *const *in);      /* cpu_pool.c */
deft_status deft_cpu_batch_norm(const deft_tensor *n, void *out, const void *const *in);  /* cpu_norm.c */
/* attention and its gradient (cpu_attention.c): src (q, k, v), or (dout, q, k, v, out); packed (qkv) and
 * (dout, qkv, out) */
deft_status deft_cpu_attention(const deft_tensor *n, void *out, const void *const *in);
/* layer norm and its gradients (cpu_layer_norm.c): in as the node's sources */
deft_status deft_cpu_layer_norm(const deft_tensor *n, void *out, const void *const *in);
/* gathers (cpu_gather.c): embedding and index_select; the order their gradients sum by; the gradients. where and
 * masked_fill (cpu_where.c): in as the node's sources */
deft_status deft_cpu_gather(const deft_tensor *n, void *out, const void *a, const void *index);
deft_status deft_cpu_index_order(const deft_tensor *n, void *out, const void *index);
deft_status deft_cpu_gather_grad(const deft_tensor *n, void *out, const void *dy, const void *order);
deft_status deft_cpu_where(const deft_tensor *n, void *out, const void *const *in);

#endif
