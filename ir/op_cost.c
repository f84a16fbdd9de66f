/* What one node's kernel costs: floating-point operations and bytes moved, from the op and the shapes. The
 * checkpoint rewrite weighs recomputation with these; they are estimates of the work, not of any one kernel's
 * speed. */
#include "graph_internal.h"

static double deft_numel_of(const deft_tensor *t) { return (double)deft_shape_numel(t->ndim, t->shape); }

/* Operations per output element for elementwise work, per input element for reductions and losses. */
static double deft_per_element(deft_op op) {
    switch (op) {
    case DEFT_OP_EXP:
    case DEFT_OP_LOG:
    case DEFT_OP_TANH:
    case DEFT_OP_SIGMOID:
    case DEFT_OP_GELU:
    case DEFT_OP_SILU:
    case DEFT_OP_POW_SCALAR: return 8.0;   /* a transcendental call */
    case DEFT_OP_SOFTMAX:
    case DEFT_OP_LOG_SOFTMAX:
    case DEFT_OP_CROSS_ENTROPY:
    case DEFT_OP_CROSS_ENTROPY_GRAD: return 12.0;   /* max, exp, sum, normalise */
    case DEFT_OP_ACT_GRAD:
    case DEFT_OP_DROPOUT: return 4.0;
    default: return 1.0;
    }
}

/* 2 M N K per matrix of the output: the inner dimension is a's last (or, transposed, its second last). */
static double deft_matmul_flops(const deft_tensor *t) {
    const deft_tensor *a = t->src[0];
    int64_t k = a->shape[t->p.matmul.trans_a ? a->ndim - 2 : a->ndim - 1];
    return 2.0 * deft_numel_of(t) * (double)k;
}

/* 2 per multiply-add: each output element of the convolution (dy's, for the gradients) takes C/groups * KH * KW of
 * them, the weight's elements per output channel. */
static double deft_conv_flops(const deft_tensor *t) {
    const deft_tensor *dy = t->op == DEFT_OP_CONV2D ? t : t->src[0];
    const deft_tensor *w = t->op == DEFT_OP_CONV2D_WEIGHT_GRAD ? t : t->src[1];
    return 2.0 * deft_numel_of(dy) * deft_numel_of(w) / (double)w->shape[0];
}

/* Pooling reads a window per output element (dy's for the gradients); adaptive windows cover the input once. */
static double deft_pool_flops(const deft_tensor *t) {
    const bool grad = t->op == DEFT_OP_MAX_POOL2D_GRAD || t->op == DEFT_OP_AVG_POOL2D_GRAD ||
                      t->op == DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD;
    const deft_tensor *x = grad ? t : t->src[0], *y = grad ? t->src[0] : t;
    if (t->op == DEFT_OP_ADAPTIVE_AVG_POOL2D || t->op == DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD) return deft_numel_of(x);
    return deft_numel_of(y) * (double)(t->p.pool.kernel[0] * t->p.pool.kernel[1]);
}

void deft_op_cost(const deft_tensor *t, double *flops, double *bytes) {
    *flops = 0.0;
    *bytes = 0.0;
    if (deft_op_is_leaf(t->op) || t->is_view) return;
    *bytes = (double)deft_tensor_bytes(t);
    double in_elems = 0.0;
    for (int k = 0; k < t->nsrc; k++) {
        *bytes += (double)deft_tensor_bytes(t->src[k]);
        in_elems += deft_numel_of(t->src[k]);
    }
    switch (t->op) {
    case DEFT_OP_MATMUL: *flops = deft_matmul_flops(t); break;
    case DEFT_OP_SUM:
    case DEFT_OP_MEAN:
    case DEFT_OP_MAX:
    case DEFT_OP_SOFTMAX:
    case DEFT_OP_LOG_SOFTMAX:
    case DEFT_OP_CROSS_ENTROPY:
    case DEFT_OP_CROSS_ENTROPY_GRAD: *flops = deft_per_element(t->op) * in_elems; break;
    case DEFT_OP_OPTIMIZER: *flops = 8.0 * in_elems; break;
    case DEFT_OP_CONV2D:
    case DEFT_OP_CONV2D_INPUT_GRAD:
    case DEFT_OP_CONV2D_WEIGHT_GRAD: *flops = deft_conv_flops(t); break;
    case DEFT_OP_MAX_POOL2D:
    case DEFT_OP_MAX_POOL2D_GRAD:
    case DEFT_OP_AVG_POOL2D:
    case DEFT_OP_AVG_POOL2D_GRAD:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD: *flops = deft_pool_flops(t); break;
    /* two passes for the moments (three with the recomputation in the backward kernels), then a pass to apply */
    case DEFT_OP_BN_STATS: *flops = 3.0 * in_elems; break;
    case DEFT_OP_BATCH_NORM: *flops = 4.0 * deft_numel_of(t); break;
    case DEFT_OP_BATCH_NORM_GRAD:
    case DEFT_OP_BATCH_NORM_WEIGHT_GRAD: *flops = 8.0 * in_elems; break;
    default: *flops = deft_per_element(t->op) * deft_numel_of(t); break;
    }
}
