/* What one node's kernel costs: floating-point operations and bytes moved, from the op and the shapes. The
 * checkpoint rewrite weighs recomputation with these; they are estimates of the work, not of any one kernel's
 * speed. */
#include <math.h>

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
    case DEFT_OP_GELU_TANH:
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

/* Forward: q k^T and p v, 2 T T D each per (b, h); backward: p recomputed, dv, dp, dq and dk, 2 T T D each.
 * A causal mask halves the products. */
static double deft_attention_flops(const deft_tensor *t) {
    const deft_attention_dims a = deft_attention_dims_of(t);
    const double rows = (double)deft_attention_rows(t), tq = (double)a.t;
    const double d = (double)a.d, per = t->op == DEFT_OP_ATTENTION ? 4.0 : 10.0;
    return per * rows * tq * d * (t->p.attn.causal ? 0.5 : 1.0);
}

/* Gathers read the rows they select, not the whole table: the value's bytes again, and the index. Their gradients
 * add each dy element once (reading dy, the index and its order) and write the whole table, zeros included; the
 * order sorts n keys (the GPU's bitonic network: about log2(P)^2 / 2 passes over them). */
static bool deft_gather_cost(const deft_tensor *t, double *flops, double *bytes) {
    double out = (double)deft_tensor_bytes(t), idx = t->nsrc > 1 ? (double)deft_tensor_bytes(t->src[1]) : 0.0;
    switch (t->op) {
    case DEFT_OP_EMBEDDING:
    case DEFT_OP_INDEX_SELECT: *bytes = 2.0 * out + idx; return true;
    case DEFT_OP_EMBEDDING_GRAD:
    case DEFT_OP_INDEX_SELECT_GRAD:
        *flops = deft_numel_of(t->src[0]);
        *bytes = out + (double)deft_tensor_bytes(t->src[0]) + idx + (double)deft_tensor_bytes(t->src[2]);
        return true;
    case DEFT_OP_INDEX_ORDER: {
        const double keys = (double)deft_index_order_pad(deft_shape_numel(t->src[0]->ndim, t->src[0]->shape));
        const double passes = keys > 1.0 ? 0.5 * log2(keys) * (log2(keys) + 1.0) : 1.0;
        *flops = keys * passes;
        *bytes = out + (double)deft_tensor_bytes(t->src[0]) + 16.0 * keys * passes;
        return true;
    }
    default: return false;
    }
}

void deft_op_cost(const deft_tensor *t, double *flops, double *bytes) {
    *flops = 0.0;
    *bytes = 0.0;
    if (deft_op_is_leaf(t->op) || t->is_view || deft_gather_cost(t, flops, bytes)) return;
    *bytes = (double)deft_node_buffer_bytes(t);
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
    case DEFT_OP_ATTENTION:
    case DEFT_OP_ATTENTION_GRAD: *flops = deft_attention_flops(t); break;
    /* layer norm: the moments, then a pass to apply; its gradients: two reductions per row and a pass to apply */
    case DEFT_OP_LAYER_NORM: *flops = 6.0 * deft_numel_of(t); break;
    case DEFT_OP_LAYER_NORM_GRAD:
    case DEFT_OP_LAYER_NORM_WEIGHT_GRAD: *flops = 8.0 * deft_numel_of(t->src[0]); break;
    default: *flops = deft_per_element(t->op) * deft_numel_of(t); break;
    }
}
