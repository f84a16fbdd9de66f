/* Backward rules of the image ops: each gradient is an op of its own (ops/cpu/cpu_conv.c, cpu_pool.c, cpu_norm.c)
 * but for the biases', which are sums of dy over every axis but the channel's. Gradients here always have their
 * source's shape: nothing was broadcast. */
#include "autodiff_rules.h"
#include "build_conv.h"
#include "node.h"

static void deft_add_grad(deft_tensor **grads, const bool *reach, const deft_tensor *src, deft_tensor *g) {
    if (!reach[src->id] || !g) return;
    grads[src->id] = grads[src->id] ? deft_add(grads[src->id], g) : g;
}

/* Sums dy over every axis but the channel's (axis 1 in NCHW, the last in NHWC). */
static deft_tensor *deft_channel_sum(deft_tensor *dy, int layout) {
    int axes[DEFT_MAX_DIMS], n = 0;
    const int channel = layout == DEFT_NHWC ? dy->ndim - 1 : 1;
    for (int d = 0; d < dy->ndim; d++)
        if (d != channel) axes[n++] = d;
    return deft_sum(dy, n, axes, 0);
}

static void deft_rule_conv2d(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    if (reach[t->src[0]->id]) deft_add_grad(grads, reach, t->src[0], deft_conv2d_input_grad(dy, t));
    if (reach[t->src[1]->id]) deft_add_grad(grads, reach, t->src[1], deft_conv2d_weight_grad(dy, t));
    if (t->nsrc > 2 && reach[t->src[2]->id])
        deft_add_grad(grads, reach, t->src[2], deft_channel_sum(dy, t->p.conv.layout));
}

/* The statistics get no gradient: in training dx already carries their dependence on x, and in evaluation they come
 * from the running statistics, which never want one. One sums node (one pass over dy and x) gives the weight and
 * bias gradients and what the training dx needs. */
static void deft_rule_batch_norm(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    const deft_tensor *x = t->src[0];
    const deft_tensor *w = t->p.bn.has_weight ? t->src[2] : NULL, *b = t->p.bn.has_bias ? t->src[2 + !!w] : NULL;
    const bool want_w = w && reach[w->id], want_b = b && reach[b->id];
    deft_tensor *sums = NULL;
    if (want_w || want_b || (reach[x->id] && t->p.bn.batch)) sums = deft_batch_norm_grad_sums(dy, t);
    if (reach[x->id]) deft_add_grad(grads, reach, x, deft_batch_norm_input_grad(dy, t, sums));
    if (want_w) deft_add_grad(grads, reach, w, deft_batch_norm_sums_row(sums, 1));
    if (want_b) deft_add_grad(grads, reach, b, deft_batch_norm_sums_row(sums, 0));
}

bool deft_grad_rule_image(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    switch (t->op) {
    case DEFT_OP_CONV2D: deft_rule_conv2d(t, dy, reach, grads); return true;
    case DEFT_OP_MAX_POOL2D:
    case DEFT_OP_AVG_POOL2D:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D: deft_add_grad(grads, reach, t->src[0], deft_pool2d_grad(dy, t)); return true;
    case DEFT_OP_BATCH_NORM: deft_rule_batch_norm(t, dy, reach, grads); return true;
    case DEFT_OP_BN_STATS: return true;   /* never reached: no rule hands it a gradient */
    default: return false;
    }
}
