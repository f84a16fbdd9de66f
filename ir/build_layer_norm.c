/* Layer norm as one node (DEFT_OP_LAYER_NORM) instead of ten primitives, each a pass over [..., C]: the forward
 * kernel keeps each row's mean and 1 / sqrt(var + eps) past its value in the node's own buffer (graph_internal.h's
 * deft_node_extra_bytes), as attention keeps its log-sum-exp, so they are born, kept, recomputed (checkpointing) and
 * freed with the value. The backward pass is two nodes reading them: dx (DEFT_OP_LAYER_NORM_GRAD), and the weight and
 * bias gradients stacked as the rows of one sums node (DEFT_OP_LAYER_NORM_WEIGHT_GRAD, [2, C]), as batch norm's are.
 * dx reads x rather than the output, so that a weight near zero costs no precision.
 *
 * Under autocast the node may write its value in bf16 or f16 from an f32 x, weight and bias (deft_layer_norm_as,
 * ir/autocast_layer_norm.c): computed in f32 as the f32 node computes it and rounded once on the store, so the value
 * has the bits of the f32 node's value cast down, while the f32 value, which the backward pass would otherwise keep
 * alive for the statistics past it, never exists. Its statistics stay f32, its gradients take dy in the value's
 * dtype as they are (exact in f32) and give dx and the sums in x's dtype. */
#include <math.h>

#include "build_grad_ops.h"
#include "checked.h"
#include "node.h"

static bool deft_ln_check_affine(deft_graph *g, const deft_tensor *x, const deft_tensor *w, const char *what) {
    if (!w) return true;
    const int64_t c = x->shape[x->ndim - 1];
    const bool shape_ok = w->ndim == 1 && w->shape[0] == c;
    if (shape_ok && w->dtype == x->dtype) return true;
    char s[96];
    deft_graph_fail(g, shape_ok ? DEFT_ERR_DTYPE : DEFT_ERR_SHAPE, "layer_norm: %s must be [%lld] of %s, got %s %s",
                    what, (long long)c, deft_dtype_name(x->dtype), deft_shape_str(w->ndim, w->shape, s, sizeof s),
                    deft_dtype_name(w->dtype));
    return false;
}

/* The value with its statistics past it (and the weight gradient with its partial sums) fits one buffer: checked
 * here, so that the planner's sizes never wrap. */
static bool deft_ln_check_bytes(deft_graph *g, const deft_tensor *x) {
    size_t bytes = 0, stats = 0, parts = 0, total = 0;
    const size_t esz = x->dtype == DEFT_F64 ? 8 : 4;
    const int64_t rows = deft_layer_norm_rows(x), c = x->shape[x->ndim - 1];
    deft_shape_bytes(x->ndim, x->shape, deft_dtype_size(x->dtype), &bytes);   /* deft_node_new checks it fits */
    if (bytes <= DEFT_MAX_BYTES && deft_size_mul((size_t)rows, 2 * esz, &stats) &&
        deft_size_add(bytes, 255 + stats, &total) && total <= DEFT_MAX_BYTES &&
        deft_size_mul((size_t)deft_layer_norm_parts(rows) * 2 * esz, (size_t)c, &parts) && parts <= DEFT_MAX_BYTES)
        return true;
    char s[96];
    deft_graph_fail(g, DEFT_ERR_SHAPE, "layer_norm: %s of %s with its row statistics is past the %zu bytes a buffer "
                    "may have", deft_shape_str(x->ndim, x->shape, s, sizeof s), deft_dtype_name(x->dtype),
                    DEFT_MAX_BYTES);
    return false;
}

static bool deft_ln_check(deft_graph *g, const deft_tensor *x, const deft_tensor *w, const deft_tensor *b,
                          double eps) {
    if (!deft_require_float(g, "layer_norm", x->dtype)) return false;
    if (x->ndim < 1) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "layer_norm: the input has no dimension to normalise over (it is 0-d)");
        return false;
    }
    if (!deft_ln_check_affine(g, x, w, "weight") || !deft_ln_check_affine(g, x, b, "bias")) return false;
    if (!(eps >= 0.0 && isfinite(eps))) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "layer_norm: eps %g must be >= 0 and finite", eps);
        return false;
    }
    return deft_ln_check_bytes(g, x);
}

/* The value's dtype: x's, or bf16 or f16 from f32 x. */
static bool deft_ln_check_out(deft_graph *g, const deft_tensor *x, deft_dtype out) {
    if (out == x->dtype || (x->dtype == DEFT_F32 && (out == DEFT_BF16 || out == DEFT_F16))) return true;
    deft_graph_fail(g, DEFT_ERR_DTYPE, "layer_norm: a %s value from %s x (x's dtype, or bf16 or f16 from f32)",
                    deft_dtype_name(out), deft_dtype_name(x->dtype));
    return false;
}

deft_tensor *deft_layer_norm_as(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, double eps,
                                deft_dtype out_dtype) {
    deft_tensor *srcs[3] = {x};
    int n = 1;
    if (weight) srcs[n++] = weight;
    if (bias) srcs[n++] = bias;
    deft_graph *g = deft_srcs_graph("layer_norm", n, srcs);
    if (!g || !deft_ln_check(g, x, weight, bias, eps) || !deft_ln_check_out(g, x, out_dtype)) return NULL;
    deft_tensor *t = deft_node_new(g, DEFT_OP_LAYER_NORM, out_dtype, x->device, x->ndim, x->shape, n, srcs);
    if (t) {
        t->p.ln.eps = eps;
        t->p.ln.has_weight = weight != NULL;
        t->p.ln.has_bias = bias != NULL;
    }
    return t;
}

deft_tensor *deft_layer_norm(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, double eps) {
    return deft_layer_norm_as(x, weight, bias, eps, x ? x->dtype : DEFT_F32);
}

deft_tensor *deft_layer_norm_weight_of(const deft_tensor *ln) { return ln->p.ln.has_weight ? ln->src[1] : NULL; }
deft_tensor *deft_layer_norm_bias_of(const deft_tensor *ln) {
    return ln->p.ln.has_bias ? ln->src[1 + ln->p.ln.has_weight] : NULL;
}

/* dy in the value's dtype (read as it is by the kernels); the gradients in x's. */
static deft_tensor *deft_ln_dy(deft_tensor *dy, const deft_tensor *ln) {
    return dy && dy->dtype != ln->dtype ? deft_cast(dy, ln->dtype) : dy;
}

deft_tensor *deft_layer_norm_input_grad(deft_tensor *dy, const deft_tensor *ln) {
    dy = deft_ln_dy(dy, ln);
    if (!dy) return NULL;
    deft_tensor *srcs[4] = {dy, ln->src[0], (deft_tensor *)ln, deft_layer_norm_weight_of(ln)};
    const int n = srcs[3] ? 4 : 3;
    deft_graph *g = deft_srcs_graph("layer_norm_grad", n, srcs);
    if (!g) return NULL;
    deft_tensor *t =
        deft_node_new(g, DEFT_OP_LAYER_NORM_GRAD, ln->src[0]->dtype, ln->device, ln->ndim, ln->shape, n, srcs);
    if (t) t->p = ln->p;
    return t;
}

deft_tensor *deft_layer_norm_grad_sums(deft_tensor *dy, const deft_tensor *ln) {
    dy = deft_ln_dy(dy, ln);
    if (!dy) return NULL;
    deft_tensor *srcs[3] = {dy, ln->src[0], (deft_tensor *)ln};
    deft_graph *g = deft_srcs_graph("layer_norm_weight_grad", 3, srcs);
    if (!g) return NULL;
    const int64_t shape[2] = {2, ln->shape[ln->ndim - 1]};
    deft_tensor *t = deft_node_new(g, DEFT_OP_LAYER_NORM_WEIGHT_GRAD, ln->src[0]->dtype, ln->device, 2, shape, 3, srcs);
    if (t) t->p = ln->p;
    return t;
}

deft_tensor *deft_layer_norm_sums_row(deft_tensor *sums, int row) {
    if (!sums) return NULL;
    const int64_t c = sums->shape[1];
    return deft_reshape(deft_slice(sums, 0, row, row + 1, 1), 1, &c);
}
