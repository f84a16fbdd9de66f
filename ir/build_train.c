/* Builders for losses, layers and the ops the backward pass needs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "build_grad_ops.h"
#include "node.h"

static bool deft_is_activation(deft_op op) {
    return op == DEFT_OP_RELU || op == DEFT_OP_GELU || op == DEFT_OP_GELU_TANH || op == DEFT_OP_SILU ||
           op == DEFT_OP_TANH || op == DEFT_OP_SIGMOID;
}

deft_tensor *deft_act_grad(deft_op act, deft_tensor *dy, deft_tensor *x) {
    deft_tensor *srcs[2] = {dy, x};
    deft_graph *g = deft_srcs_graph("act_grad", 2, srcs);
    if (!g) return NULL;
    if (!deft_is_activation(act) || dy->dtype != x->dtype || dy->ndim != x->ndim ||
        memcmp(dy->shape, x->shape, (size_t)x->ndim * sizeof *x->shape) != 0) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "act_grad: %s with mismatched gradient and input", deft_op_name(act));
        return NULL;
    }
    deft_tensor *t = deft_node_new(g, DEFT_OP_ACT_GRAD, x->dtype, x->device, x->ndim, x->shape, 2, srcs);
    if (t) t->p.act = act;
    return t;
}

deft_tensor *deft_expand(deft_tensor *a, int ndim, const int64_t *shape) {
    deft_graph *g = deft_srcs_graph("expand", 1, &a);
    if (!g) return NULL;
    int nout;
    int64_t out[DEFT_MAX_DIMS];
    deft_status s = deft_shape_broadcast(a->ndim, a->shape, ndim, shape, &nout, out);
    if (s != DEFT_OK || nout != ndim || memcmp(out, shape, (size_t)ndim * sizeof *shape) != 0) {
        char as[96], bs[96];
        deft_graph_fail(g, DEFT_ERR_SHAPE, "expand: %s does not broadcast to %s",
                        deft_shape_str(a->ndim, a->shape, as, sizeof as), deft_shape_str(ndim, shape, bs, sizeof bs));
        return NULL;
    }
    if (a->ndim == ndim && memcmp(a->shape, shape, (size_t)ndim * sizeof *shape) == 0) return a;
    return deft_node_new(g, DEFT_OP_EXPAND, a->dtype, a->device, ndim, shape, 1, &a);
}

deft_tensor *deft_slice_grad(deft_tensor *dy, const deft_tensor *slice) {
    deft_graph *g = deft_srcs_graph("slice_grad", 1, &dy);
    if (!g) return NULL;
    const deft_tensor *like = slice->src[0];
    deft_tensor *t = deft_node_new(g, DEFT_OP_SLICE_GRAD, dy->dtype, dy->device, like->ndim, like->shape, 1, &dy);
    if (t) {
        t->p.slice = slice->p.slice;
        t->p.slice.is_view = 0;
    }
    return t;
}

static bool deft_check_ce(deft_graph *g, const deft_tensor *logits, const deft_tensor *targets) {
    char ls[96], ts[96];
    if (!deft_require_float(g, "cross_entropy", logits->dtype)) return false;
    if (targets->dtype != DEFT_I32) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "cross_entropy: targets must be i32 class indices, got %s",
                        deft_dtype_name(targets->dtype));
        return false;
    }
    if (logits->ndim != 2 || targets->ndim != 1 || targets->shape[0] != logits->shape[0]) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "cross_entropy: logits %s and targets %s: expected [N, C] and [N]",
                        deft_shape_str(logits->ndim, logits->shape, ls, sizeof ls),
                        deft_shape_str(targets->ndim, targets->shape, ts, sizeof ts));
        return false;
    }
    return true;
}

deft_cross_entropy_options deft_cross_entropy_defaults(void) {
    return (deft_cross_entropy_options){.use_ignore_index = 1, .ignore_index = -100, .label_smoothing = 0.0,
                                        .reduction = DEFT_REDUCTION_MEAN};
}

static bool deft_check_ce_options(deft_graph *g, const deft_cross_entropy_options *o) {
    if (!(o->label_smoothing >= 0.0 && o->label_smoothing < 1.0)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "cross_entropy: label_smoothing %g is not in [0, 1)", o->label_smoothing);
        return false;
    }
    if (o->reduction != DEFT_REDUCTION_MEAN && o->reduction != DEFT_REDUCTION_SUM) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "cross_entropy: unknown reduction %d (mean %d or sum %d)",
                        (int)o->reduction, (int)DEFT_REDUCTION_MEAN, (int)DEFT_REDUCTION_SUM);
        return false;
    }
    return true;
}

/* logits [..., C] and targets [...] flattened to [N, C] and [N] (views, no copy); *l and *t are left as they were
 * when the shapes do not fit, and the 2-D check then names them. */
static void deft_ce_flatten(deft_tensor **l, deft_tensor **t) {
    const deft_tensor *a = *l, *b = *t;
    if (a->ndim == 2 || a->ndim < 1 || b->ndim != a->ndim - 1) return;
    for (int d = 0; d < b->ndim; d++)
        if (a->shape[d] != b->shape[d]) return;
    const int64_t c = a->shape[a->ndim - 1], n = deft_shape_numel(b->ndim, b->shape);
    deft_tensor *fl = deft_reshape(*l, 2, (const int64_t[]){n, c});
    deft_tensor *ft = deft_reshape(*t, 1, &n);
    if (fl && ft) {
        *l = fl;
        *t = ft;
    }
}

deft_tensor *deft_cross_entropy_as(deft_tensor *logits, deft_tensor *targets, const deft_cross_entropy_options *o,
                                   deft_dtype loss_dtype) {
    deft_tensor *srcs[2] = {logits, targets};
    deft_graph *g = deft_srcs_graph("cross_entropy", 2, srcs);
    if (!g) return NULL;
    const deft_cross_entropy_options opts = o ? *o : (deft_cross_entropy_options){0};
    if (!deft_check_ce_options(g, &opts)) return NULL;
    /* Flatten only once the dtypes are right, so a refused call adds no node. */
    if (!deft_require_float(g, "cross_entropy", logits->dtype)) return NULL;
    if (loss_dtype != logits->dtype && loss_dtype != DEFT_F32) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "cross_entropy: a %s loss from %s logits (the logits' dtype or f32)",
                        deft_dtype_name(loss_dtype), deft_dtype_name(logits->dtype));
        return NULL;
    }
    if (targets->dtype == DEFT_I32) deft_ce_flatten(&srcs[0], &srcs[1]);
    if (!deft_check_ce(g, srcs[0], srcs[1])) return NULL;
    deft_tensor *t = deft_node_new(g, DEFT_OP_CROSS_ENTROPY, loss_dtype, logits->device, 0, NULL, 2, srcs);
    if (t) {
        t->p.ce.has_ignore = opts.use_ignore_index ? 1 : 0;
        t->p.ce.ignore_index = opts.use_ignore_index ? opts.ignore_index : 0;
        t->p.ce.smoothing = opts.label_smoothing;
        t->p.ce.reduction = (int)opts.reduction;
    }
    return t;
}

deft_tensor *deft_cross_entropy_ex(deft_tensor *logits, deft_tensor *targets, const deft_cross_entropy_options *o) {
    return deft_cross_entropy_as(logits, targets, o, logits ? logits->dtype : DEFT_F32);
}

deft_tensor *deft_cross_entropy(deft_tensor *logits, deft_tensor *targets) {
    return deft_cross_entropy_ex(logits, targets, NULL);
}

deft_cross_entropy_options deft_cross_entropy_options_of(const deft_tensor *loss) {
    return (deft_cross_entropy_options){.use_ignore_index = loss->p.ce.has_ignore,
                                        .ignore_index = loss->p.ce.ignore_index,
                                        .label_smoothing = loss->p.ce.smoothing,
                                        .reduction = (deft_reduction)loss->p.ce.reduction};
}

deft_tensor *deft_cross_entropy_grad(deft_tensor *dloss, deft_tensor *logits, deft_tensor *targets) {
    deft_tensor *srcs[3] = {dloss, logits, targets};
    deft_graph *g = deft_srcs_graph("cross_entropy_grad", 3, srcs);
    if (!g || !deft_check_ce(g, logits, targets)) return NULL;
    /* An f32 loss of low-precision logits (deft_cross_entropy_as) gives an f32 dloss beside them. */
    if (dloss->dtype != logits->dtype && dloss->dtype != DEFT_F32) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "cross_entropy_grad: a %s loss gradient for %s logits",
                        deft_dtype_name(dloss->dtype), deft_dtype_name(logits->dtype));
        return NULL;
    }
    return deft_node_new(g, DEFT_OP_CROSS_ENTROPY_GRAD, logits->dtype, logits->device, 2, logits->shape, 3, srcs);
}

deft_tensor *deft_cross_entropy_grad_for(deft_tensor *dloss, const deft_tensor *loss) {
    deft_tensor *t = deft_cross_entropy_grad(dloss, loss->src[0], loss->src[1]);
    if (t) t->p.ce = loss->p.ce;
    return t;
}

deft_tensor *deft_mse_loss(deft_tensor *pred, deft_tensor *target) {
    deft_tensor *srcs[2] = {pred, target};
    deft_graph *g = deft_srcs_graph("mse_loss", 2, srcs);
    if (!g) return NULL;
    if (pred->ndim != target->ndim || memcmp(pred->shape, target->shape, (size_t)pred->ndim * sizeof(int64_t))) {
        char ps[96], ts[96];
        deft_graph_fail(g, DEFT_ERR_SHAPE, "mse_loss: prediction %s and target %s differ in shape",
                        deft_shape_str(pred->ndim, pred->shape, ps, sizeof ps),
                        deft_shape_str(target->ndim, target->shape, ts, sizeof ts));
        return NULL;
    }
    deft_tensor *d = deft_sub(pred, target);
    return deft_mean(deft_mul(d, d), 0, NULL, 0);
}

deft_tensor *deft_dropout(deft_tensor *x, double p, uint64_t seed) {
    deft_graph *g = deft_srcs_graph("dropout", 1, &x);
    if (!g || !deft_require_float(g, "dropout", x->dtype)) return NULL;
    if (!(p >= 0.0 && p < 1.0)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "dropout: probability %g is not in [0, 1)", p);
        return NULL;
    }
    if (p == 0.0) return x;
    deft_tensor *t = deft_node_new(g, DEFT_OP_DROPOUT, x->dtype, x->device, x->ndim, x->shape, 1, &x);
    if (t) {
        t->p.dropout.p = p;
        t->p.dropout.seed = seed;
    }
    return t;
}

deft_tensor *deft_graph_find(const deft_graph *g, const char *name) {
    if (!g || !name) return NULL;
    for (int i = 0; i < g->n_nodes; i++)
        if (strcmp(g->nodes[i]->name, name) == 0) return g->nodes[i];
    return NULL;
}

static deft_tensor *deft_linear_param(deft_graph *g, const char *layer, const char *what, int ndim,
                                      const int64_t *shape, const deft_tensor *x, deft_init init) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", layer, what);
    return deft_param(g, name, x->dtype, ndim, shape, x->device, init);
}

deft_tensor *deft_linear(deft_tensor *x, int64_t out_features, const char *name, const deft_linear_options *opts) {
    deft_graph *g = deft_srcs_graph("linear", 1, &x);
    if (!g || !deft_require_float(g, "linear", x->dtype)) return NULL;
    if (x->ndim < 1 || out_features <= 0) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "linear: needs an input with a feature dim and out_features > 0 (got %lld)",
                        (long long)out_features);
        return NULL;
    }
    deft_linear_options o = opts ? *opts : (deft_linear_options){DEFT_INIT_KAIMING, 0, 0};
    const char *layer = name ? name : "linear";
    int64_t in_features = x->shape[x->ndim - 1];
    const int64_t wshape[2] = {in_features, out_features};
    char what[96];   /* the layer's own name in the message, not only its weight's */
    snprintf(what, sizeof what, "linear %.60s.weight", layer);
    if (!deft_check_size(g, what, x->dtype, 2, wshape)) return NULL;
    deft_tensor *w = deft_linear_param(g, layer, "weight", 2, wshape, x, o.weight_init);
    deft_tensor *y = deft_matmul(x, w);
    if (o.no_bias || !y) return y;
    deft_tensor *b = deft_linear_param(g, layer, "bias", 1, &out_features, x, DEFT_INIT_ZEROS);
    if (b && !o.zero_bias) deft_param_fill_uniform(b, 1.0 / sqrt((double)in_features));
    return deft_add(y, b);
}
