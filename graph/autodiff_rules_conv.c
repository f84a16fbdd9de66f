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
 * from the running statistics, which never want one. */
static void deft_rule_batch_norm(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    int k = 2;
    if (reach[t->src[0]->id]) deft_add_grad(grads, reach, t->src[0], deft_batch_norm_input_grad(dy, t));
    if (t->p.bn.has_weight) {
        if (reach[t->src[k]->id]) deft_add_grad(grads, reach, t->src[k], deft_batch_norm_weight_grad(dy, t));
        k++;
    }
    if (t->p.bn.has_bias && reach[t->src[k]->id])
        deft_add_grad(grads, reach, t->src[k], deft_channel_sum(dy, t->p.bn.layout));
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
