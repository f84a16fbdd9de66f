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
    default: *flops = deft_per_element(t->op) * deft_numel_of(t); break;
    }
}
