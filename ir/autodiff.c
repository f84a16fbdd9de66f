/* Reverse-mode differentiation: deft_backward appends the gradient nodes to the graph, so that they are scheduled,
 * planned, dumped and (later) checkpointed like every other node. Node ids are a topological order, so one sweep
 * from the loss down to id 0 visits every node after all of its consumers. */
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "autodiff_rules.h"
#include "node.h"

/* A node needs a gradient when a parameter that wants one lies upstream of it along float tensors. */
static void deft_mark_reach(const deft_graph *g, int last, bool *reach) {
    for (int id = 0; id <= last; id++) {
        const deft_tensor *t = g->nodes[id];
        reach[id] = false;
        if (!deft_dtype_is_float(t->dtype)) continue;
        if (t->op == DEFT_OP_PARAM) {
            reach[id] = !t->no_grad;
            continue;
        }
        for (int k = 0; k < t->nsrc && !reach[id]; k++) reach[id] = reach[t->src[k]->id];
    }
}

/* d loss / d loss: a constant, so a step runs no kernel to make it. */
static deft_tensor *deft_one_like(const deft_tensor *loss) {
    unsigned char one[8];
    switch (loss->dtype) {
    case DEFT_F64: memcpy(one, &(double){1.0}, 8); break;
    case DEFT_F16: memcpy(one, &(uint16_t){0x3C00}, 2); break;
    case DEFT_BF16: memcpy(one, &(uint16_t){0x3F80}, 2); break;
    default: memcpy(one, &(float){1.0f}, 4); break;
    }
    return deft_constant(loss->graph, loss->dtype, loss->ndim, loss->shape, loss->device, one,
                         deft_dtype_size(loss->dtype));
}

/* A refused loss leaves the graph as it was (its first error untouched), so that a valid loss still differentiates. */
static deft_status deft_check_loss(const deft_tensor *loss) {
    if (!loss) return deft_set_error(DEFT_ERR_INVALID, "backward: the loss is NULL (an earlier builder failed: %s)",
                                     deft_errmsg());
    deft_graph *g = loss->graph;
    if (g->first_error != DEFT_OK)
        return deft_set_error(g->first_error, "backward: the graph has an error: %s", g->first_errmsg);
    if (deft_shape_numel(loss->ndim, loss->shape) != 1) {
        char s[96];
        return deft_set_error(DEFT_ERR_SHAPE,
                              "backward: the loss must be a scalar (one element), got shape %s; reduce it first "
                              "(deft_mean or deft_sum)",
                              deft_shape_str(loss->ndim, loss->shape, s, sizeof s));
    }
    if (!deft_dtype_is_float(loss->dtype))
        return deft_set_error(DEFT_ERR_DTYPE, "backward: the loss is %s; it must be a floating dtype",
                              deft_dtype_name(loss->dtype));
    return DEFT_OK;
}

static void deft_name_grad(deft_tensor *grad, const deft_tensor *of) {
    if (grad && grad != of) {
        char name[64];
        snprintf(name, sizeof name, "%.58s.grad", of->name);
        deft_set_name(grad, name);
    }
}

/* Hands each node's summed gradient to the node, adding to one an earlier backward left there. */
static void deft_publish_grads(deft_graph *g, int last, deft_tensor **grads) {
    for (int id = 0; id <= last; id++) {
        deft_tensor *t = g->nodes[id], *dt = grads[id];
        if (!dt) continue;
        if (t->grad) dt = deft_add(t->grad, dt);
        if (t->op == DEFT_OP_PARAM) deft_name_grad(dt, t);
        t->grad = dt;
    }
}

/* Sweeps from the loss (whose gradient is `seed`, or a constant 1 when NULL) down to id 0, leaving each node's summed
 * gradient in grads. */
static deft_status deft_backward_sweep(deft_tensor *loss, deft_tensor *seed, deft_tensor **grads) {
    deft_graph *g = loss->graph;
    int last = loss->id;
    bool *reach = malloc((size_t)(last + 1) * sizeof *reach);
    if (!reach) return deft_graph_fail(g, DEFT_ERR_OOM, "backward: out of host memory");
    deft_mark_reach(g, last, reach);
    if (!reach[last]) {
        free(reach);
        return deft_set_error(DEFT_ERR_INVALID,
                              "backward: the loss %s does not depend on any parameter that requires a gradient",
                              loss->name);
    }
    const int first = g->n_nodes;
    grads[last] = seed ? seed : deft_one_like(loss);
    deft_status s = DEFT_OK;
    for (int id = last; id >= 0 && g->first_error == DEFT_OK; id--) {
        deft_tensor *t = g->nodes[id];
        /* Every consumer of node id has a higher id, so its gradient is complete here. */
        grads[id] = deft_join_slice_grads(grads[id], first);
        /* A parameter's copy is a leaf to everything but autodiff: its gradient goes on to the parameter. */
        if (!grads[id] || !reach[id] || (deft_op_is_leaf(t->op) && t->op != DEFT_OP_PARAM_COPY)) continue;
        s = deft_grad_rule(t, grads[id], reach, grads);
        if (s != DEFT_OK) break;
    }
    free(reach);
    if (s == DEFT_OK && g->first_error != DEFT_OK)
        s = deft_set_error(g->first_error, "backward: %s", g->first_errmsg);
    return s;
}

/* Remembers the call, so that a rewrite of the forward pass (autocast) can differentiate its own loss again. */
static deft_status deft_record_call(deft_graph *g, deft_tensor *loss, int first) {
    deft_backward_call *c = realloc(g->backward_calls, (size_t)(g->n_backward_calls + 1) * sizeof *c);
    if (!c) return deft_graph_fail(g, DEFT_ERR_OOM, "backward: out of host memory");
    g->backward_calls = c;
    c[g->n_backward_calls++] = (deft_backward_call){loss, first, g->n_nodes};
    return DEFT_OK;
}

deft_status deft_backward(deft_tensor *loss) {
    deft_status s = deft_check_loss(loss);
    if (s != DEFT_OK) return s;
    deft_graph *g = loss->graph;
    int first = g->n_nodes;
    deft_tensor **grads = calloc((size_t)(loss->id + 1), sizeof *grads);
    if (!grads) return deft_graph_fail(g, DEFT_ERR_OOM, "backward: out of host memory");
    s = deft_backward_sweep(loss, NULL, grads);
    if (s == DEFT_OK) deft_publish_grads(g, loss->id, grads);
    free(grads);
    if (s == DEFT_OK && g->first_error != DEFT_OK)
        s = deft_set_error(g->first_error, "backward: %s", g->first_errmsg);
    if (s == DEFT_OK) s = deft_record_call(g, loss, first);
    return s;
}

deft_status deft_backward_collect(deft_tensor *loss, deft_tensor *seed, deft_tensor ***out) {
    *out = NULL;
    deft_status s = deft_check_loss(loss);
    if (s != DEFT_OK) return s;
    deft_tensor **grads = calloc((size_t)(loss->id + 1), sizeof *grads);
    if (!grads) return deft_graph_fail(loss->graph, DEFT_ERR_OOM, "backward: out of host memory");
    s = deft_backward_sweep(loss, seed, grads);
    if (s != DEFT_OK) {
        free(grads);
        return s;
    }
    *out = grads;
    return DEFT_OK;
}

deft_tensor *deft_grad(const deft_tensor *t) {
    if (!t) {
        deft_set_error(DEFT_ERR_INVALID, "grad: tensor is NULL");
        return NULL;
    }
    if (!t->grad)
        deft_set_error(DEFT_ERR_STATE,
                       "grad: %s has no gradient (call deft_backward first; it must lie on the loss's path to a "
                       "parameter that requires a gradient)",
                       t->name);
    return t->grad;
}

deft_status deft_param_set_requires_grad(deft_tensor *param, int requires_grad) {
    if (!param) return deft_set_error(DEFT_ERR_INVALID, "set_requires_grad: tensor is NULL");
    if (param->op != DEFT_OP_PARAM)
        return deft_set_error(DEFT_ERR_INVALID, "set_requires_grad: %s is a %s, not a parameter", param->name,
                              deft_op_name(param->op));
    param->no_grad = !requires_grad;
    return DEFT_OK;
}
