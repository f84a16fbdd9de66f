/* Reductions and softmax. */
#include "node.h"

static deft_tensor *deft_reduce(deft_op op, deft_tensor *a, int naxes, const int *axes, int keepdim) {
    const char *name = deft_op_name(op);
    deft_graph *g = deft_srcs_graph(name, 1, &a);
    if (!g) return NULL;
    if (op == DEFT_OP_MEAN && !deft_require_float(g, name, a->dtype)) return NULL;
    if (naxes < 0 || (naxes > 0 && !axes)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "%s: %d axes given", name, naxes);
        return NULL;
    }
    uint32_t mask = 0;
    for (int i = 0; i < naxes; i++) {
        int ax;
        if (!deft_norm_axis(g, name, axes[i], a->ndim, &ax)) return NULL;
        if (mask & (1u << ax)) {
            deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: axis %d is listed twice", name, axes[i]);
            return NULL;
        }
        mask |= 1u << ax;
    }
    if (naxes == 0) mask = a->ndim ? (1u << a->ndim) - 1u : 0;
    if (mask == 0) return a;   /* a 0-d tensor: nothing to reduce */
    int ndim = 0;
    int64_t shape[DEFT_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) {
        if (!(mask & (1u << i))) shape[ndim++] = a->shape[i];
        else if (keepdim) shape[ndim++] = 1;
    }
    deft_tensor *t = deft_node_new(g, op, a->dtype, a->device, ndim, shape, 1, &a);
    if (t) {
        t->p.reduce.mask = mask;
        t->p.reduce.keepdim = keepdim != 0;
    }
    return t;
}

deft_tensor *deft_sum(deft_tensor *a, int naxes, const int *axes, int keepdim) {
    return deft_reduce(DEFT_OP_SUM, a, naxes, axes, keepdim);
}

deft_tensor *deft_mean(deft_tensor *a, int naxes, const int *axes, int keepdim) {
    return deft_reduce(DEFT_OP_MEAN, a, naxes, axes, keepdim);
}

deft_tensor *deft_max(deft_tensor *a, int naxes, const int *axes, int keepdim) {
    return deft_reduce(DEFT_OP_MAX, a, naxes, axes, keepdim);
}

static deft_tensor *deft_softmax_like(deft_op op, deft_tensor *a, int axis) {
    const char *name = deft_op_name(op);
    deft_graph *g = deft_srcs_graph(name, 1, &a);
    int ax;
    if (!g || !deft_require_float(g, name, a->dtype) || !deft_norm_axis(g, name, axis, a->ndim, &ax)) return NULL;
    deft_tensor *t = deft_node_new(g, op, a->dtype, a->device, a->ndim, a->shape, 1, &a);
    if (t) t->p.axis = ax;
    return t;
}

deft_tensor *deft_softmax(deft_tensor *a, int axis) { return deft_softmax_like(DEFT_OP_SOFTMAX, a, axis); }

deft_tensor *deft_log_softmax(deft_tensor *a, int axis) {
    return deft_softmax_like(DEFT_OP_LOG_SOFTMAX, a, axis);
}
