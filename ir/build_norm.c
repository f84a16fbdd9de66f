/* Batch norm: a stats node ([2, C]: mean and 1 / sqrt(var + eps)) and the normalising node that reads it; the
 * backward nodes read the stats node too. In training the stats node also updates the running statistics in place,
 * so checkpointing keeps its value and never runs it twice (deft_op_updates_state). */
#include <math.h>
#include <stdio.h>

#include "build_conv.h"
#include "node.h"

deft_batch_norm_options deft_batch_norm_defaults(void) {
    return (deft_batch_norm_options){.eval = 0, .momentum = 0.1, .eps = 1e-5, .layout = DEFT_NCHW};
}

static bool deft_check_bn_options(deft_graph *g, const deft_batch_norm_options *o) {
    if (o->layout != DEFT_NCHW && o->layout != DEFT_NHWC) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "batch_norm: unknown layout %d (DEFT_NCHW or DEFT_NHWC)", (int)o->layout);
        return false;
    }
    if (!(o->momentum >= 0.0 && o->momentum <= 1.0) || !(o->eps >= 0.0 && isfinite(o->eps))) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "batch_norm: momentum %g must be in [0, 1] and eps %g finite and >= 0",
                        o->momentum, o->eps);
        return false;
    }
    return true;
}

/* The dtype of the statistics, the parameters and the running statistics for an input of dtype x: f32 for f16 and
 * bf16 inputs (torch's cuDNN batch norm contract: statistics rounded to a half type lose too much), x's own
 * otherwise. */
static deft_dtype deft_bn_param_dtype(deft_dtype x) { return x == DEFT_F16 || x == DEFT_BF16 ? DEFT_F32 : x; }

/* A [C] tensor of the parameter dtype: weight, bias, running_mean or running_var. */
static bool deft_check_channel_vector(deft_graph *g, const deft_tensor *v, const char *what, int64_t c,
                                      deft_dtype xdt) {
    if (!v) return true;
    char s[96];
    if (v->ndim != 1 || v->shape[0] != c) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "batch_norm: %s is %s; expected [%lld] (one per channel)", what,
                        deft_shape_str(v->ndim, v->shape, s, sizeof s), (long long)c);
        return false;
    }
    const deft_dtype want = deft_bn_param_dtype(xdt);
    if (v->dtype == want) return true;
    deft_graph_fail(g, DEFT_ERR_DTYPE, "batch_norm: %s is %s for an input of %s; expected %s (weight, bias and "
                    "running statistics are f32 for f16 and bf16 inputs, and the input's dtype otherwise)", what,
                    deft_dtype_name(v->dtype), deft_dtype_name(xdt), deft_dtype_name(want));
    return false;
}

static bool deft_check_running(deft_graph *g, const deft_tensor *rm, const deft_tensor *rv) {
    if (!rm != !rv) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "batch_norm: give both running_mean and running_var, or neither");
        return false;
    }
    const deft_tensor *r[2] = {rm, rv};
    for (int i = 0; rm && i < 2; i++) {
        if (r[i]->op != DEFT_OP_PARAM) {
            deft_graph_fail(g, DEFT_ERR_INVALID, "batch_norm: %s (%s) is a %s; running statistics must be parameters "
                            "(deft_param), which the op updates in place", i ? "running_var" : "running_mean",
                            r[i]->name, deft_op_name(r[i]->op));
            return false;
        }
    }
    return true;
}

static int64_t deft_bn_channels(const deft_tensor *x, int layout) {
    return x->shape[layout == DEFT_NHWC ? x->ndim - 1 : 1];
}

static bool deft_check_bn(deft_graph *g, deft_tensor *const *s, const deft_batch_norm_options *o) {
    const deft_tensor *x = s[0];
    if (!deft_check_bn_options(g, o) || !deft_require_float(g, "batch_norm", x->dtype)) return false;
    if (x->ndim < 2) {
        char xs[96];
        deft_graph_fail(g, DEFT_ERR_SHAPE, "batch_norm: the input is %s; it needs a batch and a channel axis",
                        deft_shape_str(x->ndim, x->shape, xs, sizeof xs));
        return false;
    }
    const int64_t c = deft_bn_channels(x, o->layout);
    const char *what[5] = {"x", "weight", "bias", "running_mean", "running_var"};
    for (int i = 1; i < 5; i++)
        if (!deft_check_channel_vector(g, s[i], what[i], c, x->dtype)) return false;
    if (!deft_check_running(g, s[3], s[4])) return false;
    const bool batch = !o->eval || !s[3];
    if (batch && deft_shape_numel(x->ndim, x->shape) / c < 2) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "batch_norm: expected more than 1 value per channel when using the "
                        "batch's statistics (got %lld channels of 1)", (long long)c);
        return false;
    }
    return true;
}

static deft_tensor *deft_bn_stats(deft_graph *g, deft_tensor *x, deft_tensor *rm, deft_tensor *rv,
                                  const deft_op_params *p) {
    deft_tensor *srcs[3] = {x, rm, rv};
    const int64_t shape[2] = {2, deft_bn_channels(x, p->bn.layout)};
    const deft_dtype dt = deft_bn_param_dtype(x->dtype);
    deft_tensor *t = p->bn.batch ? deft_node_new(g, DEFT_OP_BN_STATS, dt, x->device, 2, shape, rm ? 3 : 1, srcs)
                                 : deft_node_new(g, DEFT_OP_BN_STATS, dt, x->device, 2, shape, 2, srcs + 1);
    if (t) t->p = *p;
    return t;
}

deft_tensor *deft_batch_norm(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, deft_tensor *running_mean,
                             deft_tensor *running_var, const deft_batch_norm_options *opts) {
    deft_tensor *given[5] = {x, weight, bias, running_mean, running_var}, *srcs[5];
    int n = 0;
    for (int i = 0; i < 5; i++)
        if (given[i] || i == 0) srcs[n++] = given[i];
    deft_graph *g = deft_srcs_graph("batch_norm", n, srcs);
    const deft_batch_norm_options o = opts ? *opts : deft_batch_norm_defaults();
    if (!g || !deft_check_bn(g, given, &o)) return NULL;
    deft_op_params p = {0};
    p.bn.momentum = o.momentum;
    p.bn.eps = o.eps;
    p.bn.layout = (int)o.layout;
    p.bn.batch = !o.eval || !running_mean;
    p.bn.update = !o.eval && running_mean;
    p.bn.has_weight = weight != NULL;
    p.bn.has_bias = bias != NULL;
    deft_tensor *stats = deft_bn_stats(g, x, running_mean, running_var, &p);
    if (!stats) return NULL;
    deft_tensor *bsrc[4] = {x, stats};
    int nb = 2;
    if (weight) bsrc[nb++] = weight;
    if (bias) bsrc[nb++] = bias;
    deft_tensor *t = deft_node_new(g, DEFT_OP_BATCH_NORM, x->dtype, x->device, x->ndim, x->shape, nb, bsrc);
    if (t) t->p = p;
    return t;
}

static deft_tensor *deft_bn_param(deft_graph *g, const char *layer, const char *what, const deft_tensor *x,
                                  int64_t c, deft_init init) {
    char name[64];
    snprintf(name, sizeof name, "%.48s.%s", layer, what);
    return deft_param(g, name, deft_bn_param_dtype(x->dtype), 1, &c, x->device, init);
}

deft_tensor *deft_batch_norm_layer(deft_tensor *x, const char *name, const deft_batch_norm_options *opts) {
    deft_graph *g = deft_srcs_graph("batch_norm_layer", 1, &x);
    const deft_batch_norm_options o = opts ? *opts : deft_batch_norm_defaults();
    if (!g || !deft_check_bn_options(g, &o)) return NULL;
    if (x->ndim < 2) return deft_batch_norm(x, NULL, NULL, NULL, NULL, &o);   /* says what is wrong */
    const char *layer = name ? name : "bn";
    const int64_t c = deft_bn_channels(x, o.layout);
    deft_tensor *w = deft_bn_param(g, layer, "weight", x, c, DEFT_INIT_ONES);
    deft_tensor *b = deft_bn_param(g, layer, "bias", x, c, DEFT_INIT_ZEROS);
    deft_tensor *rm = deft_bn_param(g, layer, "running_mean", x, c, DEFT_INIT_ZEROS);
    deft_tensor *rv = deft_bn_param(g, layer, "running_var", x, c, DEFT_INIT_ONES);
    if (!w || !b || !rm || !rv) return NULL;
    deft_param_set_requires_grad(rm, 0);
    deft_param_set_requires_grad(rv, 0);
    return deft_batch_norm(x, w, b, rm, rv, &o);
}

/* The weight, when the node has one: after x and stats. */
static deft_tensor *deft_bn_weight_of(const deft_tensor *bn) { return bn->p.bn.has_weight ? bn->src[2] : NULL; }

deft_tensor *deft_batch_norm_input_grad(deft_tensor *dy, const deft_tensor *bn, deft_tensor *sums) {
    deft_tensor *srcs[5];
    int n = 0;
    srcs[n++] = dy;
    if (bn->p.bn.batch) {   /* evaluation's dx is dy scaled: neither x nor the sums are needed */
        srcs[n++] = bn->src[0];
        srcs[n++] = bn->src[1];
        srcs[n++] = sums;
    } else {
        srcs[n++] = bn->src[1];
    }
    if (bn->p.bn.has_weight) srcs[n++] = deft_bn_weight_of(bn);
    deft_graph *g = deft_srcs_graph("batch_norm_grad", n, srcs);
    if (!g) return NULL;
    deft_tensor *t = deft_node_new(g, DEFT_OP_BATCH_NORM_GRAD, dy->dtype, dy->device, bn->ndim, bn->shape, n, srcs);
    if (t) t->p = bn->p;
    return t;
}

deft_tensor *deft_batch_norm_grad_sums(deft_tensor *dy, const deft_tensor *bn) {
    deft_tensor *srcs[3] = {dy, bn->src[0], bn->src[1]};
    deft_graph *g = deft_srcs_graph("batch_norm_grad_sums", 3, srcs);
    if (!g) return NULL;
    const deft_tensor *stats = bn->src[1];
    deft_tensor *t = deft_node_new(g, DEFT_OP_BATCH_NORM_WEIGHT_GRAD, stats->dtype, dy->device, 2, stats->shape, 3,
                                   srcs);
    if (t) t->p = bn->p;
    return t;
}

deft_tensor *deft_batch_norm_sums_row(deft_tensor *sums, int row) {
    if (!sums) return NULL;
    const int64_t c = sums->shape[1];
    return deft_reshape(deft_slice(sums, 0, row, row + 1, 1), 1, &c);
}
