/* Backward rules of the gathers and selection. The gathers' gradients are ops of their own that sum rows in a fixed
 * order (ir/build_gather.c); where and masked_fill route dy with themselves, so their gradients need no new kernel. */
#include "autodiff_rules.h"
#include "build_grad_ops.h"
#include "node.h"

static void deft_add_to(deft_tensor **grads, const bool *reach, deft_tensor *src, deft_tensor *g) {
    if (!reach[src->id] || !g) return;
    g = deft_reduce_to(g, src);
    grads[src->id] = grads[src->id] ? deft_add(grads[src->id], g) : g;
}

/* A zero of dy's dtype with no dims: it broadcasts against anything, and as a constant it costs no step. */
static deft_tensor *deft_zero_like(const deft_tensor *dy) {
    static const unsigned char zero[8] = {0};
    return deft_constant(dy->graph, dy->dtype, 0, NULL, dy->device, zero, deft_dtype_size(dy->dtype));
}

/* dy goes to a where cond holds and to b elsewhere, summed back over what each broadcast. */
static void deft_rule_where(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    deft_tensor *cond = t->src[0], *a = t->src[1], *b = t->src[2];
    if (reach[a->id]) deft_add_to(grads, reach, a, deft_where(cond, dy, deft_zero_like(dy)));
    if (reach[b->id]) deft_add_to(grads, reach, b, deft_where(cond, deft_zero_like(dy), dy));
}

/* The gradient of the first source (the table, a); built only where it is wanted: a float mask may be what reached
 * t, and the mask and the index get no gradient (piecewise constant). */
static deft_tensor *deft_first_source_grad(deft_tensor *t, deft_tensor *dy) {
    switch (t->op) {
    case DEFT_OP_EMBEDDING: return deft_embedding_grad(dy, t);
    case DEFT_OP_INDEX_SELECT: return deft_index_select_grad(dy, t);
    default: return deft_masked_fill(dy, t->src[1], 0.0);   /* the filled elements do not depend on a */
    }
}

bool deft_grad_rule_gather(deft_tensor *t, deft_tensor *dy, const bool *reach, deft_tensor **grads) {
    switch (t->op) {
    case DEFT_OP_WHERE: deft_rule_where(t, dy, reach, grads); return true;
    case DEFT_OP_EMBEDDING:
    case DEFT_OP_INDEX_SELECT:
    case DEFT_OP_MASKED_FILL:
        if (reach[t->src[0]->id]) deft_add_to(grads, reach, t->src[0], deft_first_source_grad(t, dy));
        return true;
    default: return false;
    }
}
