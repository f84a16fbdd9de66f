/* The backward rule of every differentiable op, written with ordinary builders: the gradient graph is a graph like
 * any other. Gradients of broadcast inputs are summed back to the input's shape. */
#include <string.h>

#include "autodiff_rules.h"
#include "build_grad_ops.h"
#include "node.h"

/* Sums g over the dims along which `like` was broadcast, giving like's shape. */
deft_tensor *deft_reduce_to(deft_tensor *g, const deft_tensor *like) {
    if (!g) return NULL;
    if (g->ndim == like->ndim && memcmp(g->shape, like->shape, (size_t)g->ndim * sizeof *g->shape) == 0) return g;
    int axes[DEFT_MAX_DIMS], n = 0, lead = g->ndim - like->ndim;
    for (int d = 0; d < g->ndim; d++)
        if (d < lead || (like->shape[d - lead] == 1 && g->shape[d] != 1)) axes[n++] = d;
    deft_tensor *r = n ? deft_sum(g, n, axes, 1) : g;
    return deft_reshape(r, like->ndim, like->shape);
}

static void deft_accumulate(deft_tensor **grads, const bool *reach, deft_tensor *src, deft_tensor *g) {
    if (!reach[src->id] || !g) return;
    g = deft_reduce_to(g, src);
    grads[src->id] = grads[src->id] ? deft_add(grads[src->id], g) : g;
}

/* The reduced output's shape with the reduced axes kept as 1s. */
static deft_tensor *deft_keepdim_view(deft_tensor *y, const deft_tensor *t) {
    const deft_tensor *a = t->src[0];
    int64_t shape[DEFT_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) shape[d] = (t->p.reduce.mask & (1u << d)) ? 1 : a->shape[d];
    return deft_reshape(y, a->ndim, shape);
}

static int64_t deft_reduced_count(const deft_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->src[0]->ndim; d++)
        if (t->p.reduce.mask & (1u << d)) n *= t->src[0]->shape[d];
    return n;
}

static void deft_rule_reduce(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    deft_tensor *a = t->src[0], *dk = deft_keepdim_view(dy, t), *da;
    if (t->op == DEFT_OP_MAX) {
        /* Ties share the gradient equally, as torch.amax does. */
        deft_tensor *mask = deft_eq(a, deft_keepdim_view(t, t));
        int axes[DEFT_MAX_DIMS], n = 0;
        for (int d = 0; d < a->ndim; d++)
            if (t->p.reduce.mask & (1u << d)) axes[n++] = d;
        da = deft_div(deft_mul(mask, dk), deft_sum(mask, n, axes, 1));
    } else {
        da = deft_expand(dk, a->ndim, a->shape);
        if (t->op == DEFT_OP_MEAN) da = deft_mul_scalar(da, 1.0 / (double)deft_reduced_count(t));
    }
    deft_accumulate(grads, reach, a, da);
}

/* c = op(a) @ op(b): da = dy @ op(b)^T and db = op(a)^T @ dy, written with the transposes folded into the matmul. */
static void deft_rule_matmul(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    deft_tensor *a = t->src[0], *b = t->src[1];
    int ta = t->p.matmul.trans_a, tb = t->p.matmul.trans_b;
    if (reach[a->id])
        deft_accumulate(grads, reach, a, ta ? deft_matmul_t(b, dy, tb, 1) : deft_matmul_t(dy, b, 0, !tb));
    if (!reach[b->id]) return;
    if (b->ndim == 2 && a->ndim > 2 && !ta) {
        /* A weight shared over a batch: fold the batch into the rows, one matmul instead of a batch and a sum. */
        int64_t k = a->shape[a->ndim - 1], n = dy->shape[dy->ndim - 1];
        deft_tensor *a2 = deft_reshape(a, 2, (int64_t[]){-1, k}), *dy2 = deft_reshape(dy, 2, (int64_t[]){-1, n});
        deft_accumulate(grads, reach, b, tb ? deft_matmul_t(dy2, a2, 1, 0) : deft_matmul_t(a2, dy2, 1, 0));
        return;
    }
    deft_accumulate(grads, reach, b, tb ? deft_matmul_t(dy, a, 1, ta) : deft_matmul_t(a, dy, !ta, 0));
}

static void deft_rule_binary(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    deft_tensor *a = t->src[0], *b = t->src[1];
    switch (t->op) {
    case DEFT_OP_ADD:
        deft_accumulate(grads, reach, a, dy);
        deft_accumulate(grads, reach, b, dy);
        break;
    case DEFT_OP_SUB:
        deft_accumulate(grads, reach, a, dy);
        if (reach[b->id]) deft_accumulate(grads, reach, b, deft_neg(dy));
        break;
    case DEFT_OP_MUL:
        if (a == b) {   /* a square: one product, doubled exactly, instead of two products summed */
            if (reach[a->id]) deft_accumulate(grads, reach, a, deft_mul_scalar(deft_mul(dy, a), 2.0));
            break;
        }
        if (reach[a->id]) deft_accumulate(grads, reach, a, deft_mul(dy, b));
        if (reach[b->id]) deft_accumulate(grads, reach, b, deft_mul(dy, a));
        break;
    case DEFT_OP_DIV:
        if (reach[a->id]) deft_accumulate(grads, reach, a, deft_div(dy, b));
        if (reach[b->id]) deft_accumulate(grads, reach, b, deft_neg(deft_div(deft_mul(dy, t), b)));
        break;
    default: { /* maximum: the gradient goes to a where a >= b, to b elsewhere */
        deft_tensor *to_a = deft_mul(dy, deft_ge(a, b));
        if (reach[a->id]) deft_accumulate(grads, reach, a, to_a);
        if (reach[b->id]) deft_accumulate(grads, reach, b, deft_sub(dy, to_a));
        break;
    }
    }
}

/* Gradients of ops with one input and the output's shape. */
static deft_tensor *deft_rule_pointwise(deft_tensor *t, deft_tensor *dy) {
    deft_tensor *a = t->src[0];
    double s = t->p.scalar;
    switch (t->op) {
    case DEFT_OP_ADD_SCALAR: return dy;
    case DEFT_OP_RSUB_SCALAR:
    case DEFT_OP_NEG: return deft_neg(dy);
    case DEFT_OP_MUL_SCALAR: return deft_mul_scalar(dy, s);
    case DEFT_OP_DIV_SCALAR: return deft_div_scalar(dy, s);
    case DEFT_OP_RDIV_SCALAR: return deft_neg(deft_div(deft_mul(dy, t), a));
    case DEFT_OP_MAXIMUM_SCALAR: return deft_mul(dy, deft_eq(t, a));
    case DEFT_OP_POW_SCALAR: return deft_mul(dy, deft_mul_scalar(deft_pow_scalar(a, s - 1.0), s));
    case DEFT_OP_EXP: return deft_mul(dy, t);
    case DEFT_OP_LOG: return deft_div(dy, a);
    case DEFT_OP_SQRT: return deft_div(deft_mul_scalar(dy, 0.5), t);
    case DEFT_OP_RSQRT: return deft_mul(dy, deft_mul_scalar(deft_pow_scalar(t, 3.0), -0.5));
    /* relu'(x) read off the output (y > 0 exactly where x > 0, NaN included): the pre-activation need not be kept
     * for the backward pass, so a bias add and the relu after a matmul can run as the matmul's epilogue. */
    case DEFT_OP_RELU: return deft_act_grad(t->op, dy, t);
    case DEFT_OP_TANH:
    case DEFT_OP_SIGMOID:
    case DEFT_OP_GELU:
    case DEFT_OP_GELU_TANH:
    case DEFT_OP_SILU: return deft_act_grad(t->op, dy, a);
    case DEFT_OP_CAST:
    case DEFT_OP_PARAM_COPY: return deft_cast(dy, a->dtype);
    case DEFT_OP_COPY: return deft_to(dy, a->device, a->dtype);
    case DEFT_OP_RESHAPE: return deft_reshape(dy, a->ndim, a->shape);
    case DEFT_OP_EXPAND: return dy;   /* deft_accumulate sums it back to a's shape */
    case DEFT_OP_SLICE: return deft_slice_grad(dy, t);
    case DEFT_OP_SOFTMAX: {
        int ax = t->p.axis;
        return deft_mul(t, deft_sub(dy, deft_sum(deft_mul(dy, t), 1, &ax, 1)));
    }
    case DEFT_OP_LOG_SOFTMAX: {
        int ax = t->p.axis;
        return deft_sub(dy, deft_mul(deft_exp(t), deft_sum(dy, 1, &ax, 1)));
    }
    case DEFT_OP_DROPOUT: {
        /* The same seed gives the same mask within a run, and the mask's derivative is the mask. */
        deft_tensor *d = deft_dropout(dy, t->p.dropout.p, t->p.dropout.seed);
        return d;
    }
    case DEFT_OP_PERMUTE: {
        int inv[DEFT_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++) inv[t->p.perm[d]] = d;
        return deft_permute(dy, inv);
    }
    default: return NULL;
    }
}

static void deft_rule_concat(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    int64_t start = 0;
    for (int k = 0; k < t->nsrc; k++) {
        int64_t len = t->src[k]->shape[t->p.axis];
        if (reach[t->src[k]->id])
            deft_accumulate(grads, reach, t->src[k], deft_slice(dy, t->p.axis, start, start + len, 1));
        start += len;
    }
}

/* One node computes dq, dk and dv together (they share the recomputed probabilities); each is a view of it. Packed,
 * that node's value is the gradient of qkv itself (dq, dk and dv written at their places). */
static void deft_rule_attention(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    deft_tensor *g = deft_attention_grad(dy, t);
    if (t->p.attn.heads > 0) {
        deft_accumulate(grads, reach, t->src[0], g);
        return;
    }
    for (int i = 0; i < 3; i++)
        if (reach[t->src[i]->id]) deft_accumulate(grads, reach, t->src[i], deft_attention_grad_part(g, i));
}

deft_status deft_grad_rule(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    if (deft_grad_rule_image(t, dy, reach, grads) || deft_grad_rule_gather(t, dy, reach, grads) ||
        deft_grad_rule_norm(t, dy, reach, grads))
        return DEFT_OK;
    switch (t->op) {
    case DEFT_OP_ADD:
    case DEFT_OP_SUB:
    case DEFT_OP_MUL:
    case DEFT_OP_DIV:
    case DEFT_OP_MAXIMUM: deft_rule_binary(t, dy, reach, grads); return DEFT_OK;
    case DEFT_OP_MATMUL: deft_rule_matmul(t, dy, reach, grads); return DEFT_OK;
    case DEFT_OP_SUM:
    case DEFT_OP_MEAN:
    case DEFT_OP_MAX: deft_rule_reduce(t, dy, reach, grads); return DEFT_OK;
    case DEFT_OP_CONCAT: deft_rule_concat(t, dy, reach, grads); return DEFT_OK;
    case DEFT_OP_ATTENTION: deft_rule_attention(t, dy, reach, grads); return DEFT_OK;
    case DEFT_OP_CROSS_ENTROPY:
        deft_accumulate(grads, reach, t->src[0], deft_cross_entropy_grad_for(dy, t));
        return DEFT_OK;
    case DEFT_OP_EQ:
    case DEFT_OP_GT:
    case DEFT_OP_GE: return DEFT_OK;   /* piecewise constant: no gradient flows */
    default: break;
    }
    deft_tensor *da = deft_rule_pointwise(t, dy);
    if (!da && t->graph->first_error == DEFT_OK)
        return deft_graph_fail(t->graph, DEFT_ERR_INVALID, "backward: %s (%s) has no gradient rule", t->name,
                               deft_op_name(t->op));
    deft_accumulate(grads, reach, t->src[0], da);
    return DEFT_OK;
}
