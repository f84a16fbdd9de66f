/* Backward rule of layer norm: one node for dx, and one for the weight and bias gradients together (both are column
 * sums over the same rows of dy, one of them weighted by xhat), each a view of a row of it. Built only where a
 * gradient is wanted. */
#include "autodiff_rules.h"
#include "build_grad_ops.h"
#include "node.h"

static void deft_ln_add_to(deft_tensor **grads, const bool *reach, deft_tensor *src, deft_tensor *g) {
    if (!src || !reach[src->id] || !g) return;
    grads[src->id] = grads[src->id] ? deft_add(grads[src->id], g) : g;
}

bool deft_grad_rule_norm(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    if (t->op != DEFT_OP_LAYER_NORM) return false;
    deft_tensor *x = t->src[0], *w = deft_layer_norm_weight_of(t), *b = deft_layer_norm_bias_of(t);
    if (reach[x->id]) deft_ln_add_to(grads, reach, x, deft_layer_norm_input_grad(dy, t));
    if (!(w && reach[w->id]) && !(b && reach[b->id])) return true;
    deft_tensor *sums = deft_layer_norm_grad_sums(dy, t);
    if (w && reach[w->id]) deft_ln_add_to(grads, reach, w, deft_layer_norm_sums_row(sums, 0));
    if (b && reach[b->id]) deft_ln_add_to(grads, reach, b, deft_layer_norm_sums_row(sums, 1));
    return true;
}
