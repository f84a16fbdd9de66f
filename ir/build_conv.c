/* Builders of conv2d and pooling, with their shape, dtype and layout checks, and the gradient ops their backward
 * rules make. */
#include <math.h>
#include <stdio.h>

#include "build_conv.h"
#include "checked.h"
#include "node.h"

/* An image input: 4-D, floating, in a known layout. */
static bool deft_check_image(deft_graph *g, const char *op, const deft_tensor *x, int layout) {
    if (layout != DEFT_NCHW && layout != DEFT_NHWC) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "%s: unknown layout %d (DEFT_NCHW or DEFT_NHWC)", op, layout);
        return false;
    }
    if (!deft_require_float(g, op, x->dtype)) return false;
    if (x->ndim != 4) {
        char s[96];
        deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: the input is %s; expected 4 dimensions %s", op,
                        deft_shape_str(x->ndim, x->shape, s, sizeof s),
                        layout == DEFT_NHWC ? "[N, H, W, C]" : "[N, C, H, W]");
        return false;
    }
    return true;
}

/* An option pair: 0 takes `dflt`; negatives (and zeros where not allowed) are refused. */
static bool deft_pair(deft_graph *g, const char *op, const char *what, const int64_t *in, int64_t dflt,
                      int64_t min, int64_t *out) {
    for (int i = 0; i < 2; i++) {
        int64_t v = in ? in[i] : 0;
        if (v == 0 && dflt > 0) v = dflt;
        if (v < min) {
            deft_graph_fail(g, DEFT_ERR_INVALID, "%s: %s[%d] is %lld; it must be >= %lld", op, what, i,
                            (long long)v, (long long)min);
            return false;
        }
        out[i] = v;
    }
    return true;
}

/* The output length of a window of `kernel` taps `dil` apart sliding along `len` (padding both sides), or a message
 * when it has no room. The options are the user's int64s, so the span and the padded length are checked. */
static bool deft_out_len(deft_graph *g, const char *op, const char *axis, int64_t len, int64_t pad, int64_t kernel,
                         int64_t dil, int64_t stride, int64_t *out) {
    int64_t span, padded;
    if (!deft_i64_mul(dil, kernel - 1, &span) || !deft_i64_add(span, 1, &span) || !deft_i64_mul(pad, 2, &padded) ||
        !deft_i64_add(padded, len, &padded)) {
        deft_graph_fail(g, DEFT_ERR_SHAPE,
                        "%s: along %s, the input of %lld with padding %lld and a kernel of %lld dilated %lld spans "
                        "more than %lld", op, axis, (long long)len, (long long)pad, (long long)kernel, (long long)dil,
                        (long long)INT64_MAX);
        return false;
    }
    const int64_t room = padded - span;
    if (room < 0) {
        deft_graph_fail(g, DEFT_ERR_SHAPE,
                        "%s: the window spans %lld along %s but the padded input has only %lld (%lld + 2 x %lld)", op,
                        (long long)span, axis, (long long)padded, (long long)len, (long long)pad);
        return false;
    }
    *out = room / stride + 1;
    return true;
}

static void deft_image_shape(int layout, int64_t n, int64_t c, int64_t h, int64_t w, int64_t *shape) {
    deft_image_axes a = deft_image_axes_of(layout);
    shape[a.n] = n, shape[a.c] = c, shape[a.h] = h, shape[a.w] = w;
}

/* ---- conv2d ---- */

static bool deft_conv_params(deft_graph *g, const deft_conv2d_options *o, deft_op_params *p) {
    const deft_conv2d_options d = {{0, 0}, {0, 0}, {0, 0}, 0, DEFT_NCHW};
    if (!o) o = &d;
    p->conv.layout = (int)o->layout;
    p->conv.groups = o->groups ? o->groups : 1;
    if (p->conv.groups < 1) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "conv2d: groups is %lld; it must be >= 1", (long long)o->groups);
        return false;
    }
    return deft_pair(g, "conv2d", "stride", o->stride, 1, 1, p->conv.stride) &&
           deft_pair(g, "conv2d", "padding", o->padding, 0, 0, p->conv.pad) &&
           deft_pair(g, "conv2d", "dilation", o->dilation, 1, 1, p->conv.dil);
}

/* The weight against the input: [O, C/groups, KH, KW] (NHWC: [O, KH, KW, C/groups]), O a multiple of groups. */
static bool deft_check_weight(deft_graph *g, const deft_tensor *x, const deft_tensor *w, const deft_op_params *p) {
    char xs[96], ws[96];
    const deft_image_axes a = deft_image_axes_of(p->conv.layout);
    const int64_t c = x->shape[a.c], groups = p->conv.groups;
    const int cin_axis = p->conv.layout == DEFT_NHWC ? 3 : 1;
    if (w->dtype != x->dtype) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "conv2d: the weight is %s and the input %s", deft_dtype_name(w->dtype),
                        deft_dtype_name(x->dtype));
        return false;
    }
    if (c % groups != 0 || (w->ndim == 4 && w->shape[0] % groups != 0)) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "conv2d: %lld groups do not divide the %lld input channels and the "
                        "%lld output channels", (long long)groups, (long long)c,
                        (long long)(w->ndim == 4 ? w->shape[0] : 0));
        return false;
    }
    if (w->ndim != 4 || w->shape[cin_axis] != c / groups) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "conv2d: the weight is %s for an input %s (%s) with %lld groups; expected "
                        "%s with C/groups = %lld", deft_shape_str(w->ndim, w->shape, ws, sizeof ws),
                        deft_shape_str(x->ndim, x->shape, xs, sizeof xs),
                        p->conv.layout == DEFT_NHWC ? "NHWC" : "NCHW", (long long)groups,
                        p->conv.layout == DEFT_NHWC ? "[O, KH, KW, C/groups]" : "[O, C/groups, KH, KW]",
                        (long long)(c / groups));
        return false;
    }
    return true;
}

static bool deft_check_bias(deft_graph *g, const deft_tensor *x, const deft_tensor *w, const deft_tensor *b) {
    if (!b) return true;
    if (b->ndim == 1 && b->shape[0] == w->shape[0] && b->dtype == x->dtype) return true;
    char s[96];
    deft_graph_fail(g, DEFT_ERR_SHAPE, "conv2d: the bias is %s %s; expected [%lld] of %s",
                    deft_shape_str(b->ndim, b->shape, s, sizeof s), deft_dtype_name(b->dtype),
                    (long long)w->shape[0], deft_dtype_name(x->dtype));
    return false;
}

deft_tensor *deft_conv2d(deft_tensor *x, deft_tensor *weight, deft_tensor *bias, const deft_conv2d_options *opts) {
    deft_tensor *srcs[3] = {x, weight, bias};
    const int nsrc = bias ? 3 : 2;
    deft_graph *g = deft_srcs_graph("conv2d", nsrc, srcs);
    deft_op_params p = {0};
    if (!g || !deft_conv_params(g, opts, &p) || !deft_check_image(g, "conv2d", x, p.conv.layout) ||
        !deft_check_weight(g, x, weight, &p) || !deft_check_bias(g, x, weight, bias))
        return NULL;
    const deft_image_axes a = deft_image_axes_of(p.conv.layout);
    const bool nhwc = p.conv.layout == DEFT_NHWC;
    const int64_t kh = weight->shape[nhwc ? 1 : 2], kw = weight->shape[nhwc ? 2 : 3];
    int64_t oh, ow, shape[4];
    if (!deft_out_len(g, "conv2d", "H", x->shape[a.h], p.conv.pad[0], kh, p.conv.dil[0], p.conv.stride[0], &oh) ||
        !deft_out_len(g, "conv2d", "W", x->shape[a.w], p.conv.pad[1], kw, p.conv.dil[1], p.conv.stride[1], &ow))
        return NULL;
    deft_image_shape(p.conv.layout, x->shape[a.n], weight->shape[0], oh, ow, shape);
    deft_tensor *t = deft_node_new(g, DEFT_OP_CONV2D, x->dtype, x->device, 4, shape, nsrc, srcs);
    if (t) t->p = p;
    return t;
}

deft_tensor *deft_conv2d_layer(deft_tensor *x, int64_t out_channels, int64_t kernel_h, int64_t kernel_w,
                               const char *name, const deft_conv2d_options *opts, int no_bias) {
    deft_graph *g = deft_srcs_graph("conv2d_layer", 1, &x);
    deft_op_params p = {0};
    if (!g || !deft_conv_params(g, opts, &p) || !deft_check_image(g, "conv2d_layer", x, p.conv.layout)) return NULL;
    const int64_t c = x->shape[deft_image_axes_of(p.conv.layout).c];
    if (out_channels <= 0 || kernel_h <= 0 || kernel_w <= 0 || c % p.conv.groups || out_channels % p.conv.groups) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "conv2d_layer: %lld output channels and a %lld x %lld kernel over %lld "
                        "input channels in %lld groups", (long long)out_channels, (long long)kernel_h,
                        (long long)kernel_w, (long long)c, (long long)p.conv.groups);
        return NULL;
    }
    const int64_t cg = c / p.conv.groups;
    const int64_t wshape[4] = {out_channels, p.conv.layout == DEFT_NHWC ? kernel_h : cg,
                               p.conv.layout == DEFT_NHWC ? kernel_w : kernel_h,
                               p.conv.layout == DEFT_NHWC ? cg : kernel_w};
    char wname[64], bname[64], what[96];
    snprintf(wname, sizeof wname, "%.50s.weight", name ? name : "conv");
    snprintf(bname, sizeof bname, "%.50s.bias", name ? name : "conv");
    snprintf(what, sizeof what, "conv2d_layer %s", wname);
    if (!deft_check_size(g, what, x->dtype, 4, wshape)) return NULL;
    /* torch's kaiming_uniform(a = sqrt(5)) and its bias both come to U(+-1 / sqrt(fan_in)) */
    const double bound = 1.0 / sqrt((double)cg * (double)kernel_h * (double)kernel_w);
    deft_tensor *w = deft_param(g, wname, x->dtype, 4, wshape, x->device, DEFT_INIT_ZEROS);
    deft_tensor *b = no_bias ? NULL : deft_param(g, bname, x->dtype, 1, &out_channels, x->device, DEFT_INIT_ZEROS);
    if (!w || (!no_bias && !b)) return NULL;
    deft_param_fill_uniform(w, bound);
    if (b) deft_param_fill_uniform(b, bound);
    return deft_conv2d(x, w, b, opts);
}

deft_tensor *deft_conv2d_input_grad(deft_tensor *dy, const deft_tensor *conv) {
    deft_tensor *srcs[2] = {dy, conv->src[1]};
    deft_graph *g = deft_srcs_graph("conv2d_input_grad", 2, srcs);
    if (!g) return NULL;
    const deft_tensor *x = conv->src[0];
    deft_tensor *t = deft_node_new(g, DEFT_OP_CONV2D_INPUT_GRAD, x->dtype, x->device, 4, x->shape, 2, srcs);
    if (t) t->p = conv->p;
    return t;
}

deft_tensor *deft_conv2d_weight_grad(deft_tensor *dy, const deft_tensor *conv) {
    deft_tensor *srcs[2] = {dy, conv->src[0]};
    deft_graph *g = deft_srcs_graph("conv2d_weight_grad", 2, srcs);
    if (!g) return NULL;
    const deft_tensor *w = conv->src[1];
    deft_tensor *t = deft_node_new(g, DEFT_OP_CONV2D_WEIGHT_GRAD, w->dtype, w->device, 4, w->shape, 2, srcs);
    if (t) t->p = conv->p;
    return t;
}

/* ---- pooling ---- */

static bool deft_pool_params(deft_graph *g, const char *op, const deft_pool2d_options *o, deft_op_params *p) {
    if (!o) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "%s: options are NULL; the kernel size is required", op);
        return false;
    }
    p->pool.layout = (int)o->layout;
    p->pool.count_include_pad = !o->exclude_pad;
    if (!deft_pair(g, op, "kernel", o->kernel, 0, 1, p->pool.kernel)) return false;
    if (!deft_pair(g, op, "stride", o->stride, 0, 0, p->pool.stride)) return false;
    for (int i = 0; i < 2; i++)
        if (p->pool.stride[i] == 0) p->pool.stride[i] = p->pool.kernel[i];
    if (!deft_pair(g, op, "padding", o->padding, 0, 0, p->pool.pad)) return false;
    for (int i = 0; i < 2; i++) {
        if (p->pool.pad[i] > p->pool.kernel[i] / 2) {   /* 2 x pad > kernel, without doubling a huge pad */
            deft_graph_fail(g, DEFT_ERR_INVALID, "%s: padding[%d] is %lld; it must be at most half the kernel (%lld)",
                            op, i, (long long)p->pool.pad[i], (long long)p->pool.kernel[i]);
            return false;
        }
    }
    return true;
}

static deft_tensor *deft_pool2d(deft_op op, deft_tensor *x, const deft_pool2d_options *opts) {
    const char *name = deft_op_name(op);
    deft_graph *g = deft_srcs_graph(name, 1, &x);
    deft_op_params p = {0};
    if (!g || !deft_pool_params(g, name, opts, &p) || !deft_check_image(g, name, x, p.pool.layout)) return NULL;
    const deft_image_axes a = deft_image_axes_of(p.pool.layout);
    int64_t oh, ow, shape[4];
    if (!deft_out_len(g, name, "H", x->shape[a.h], p.pool.pad[0], p.pool.kernel[0], 1, p.pool.stride[0], &oh) ||
        !deft_out_len(g, name, "W", x->shape[a.w], p.pool.pad[1], p.pool.kernel[1], 1, p.pool.stride[1], &ow))
        return NULL;
    deft_image_shape(p.pool.layout, x->shape[a.n], x->shape[a.c], oh, ow, shape);
    deft_tensor *t = deft_node_new(g, op, x->dtype, x->device, 4, shape, 1, &x);
    if (t) t->p = p;
    return t;
}

deft_tensor *deft_max_pool2d(deft_tensor *x, const deft_pool2d_options *opts) {
    return deft_pool2d(DEFT_OP_MAX_POOL2D, x, opts);
}

deft_tensor *deft_avg_pool2d(deft_tensor *x, const deft_pool2d_options *opts) {
    return deft_pool2d(DEFT_OP_AVG_POOL2D, x, opts);
}

deft_tensor *deft_adaptive_avg_pool2d(deft_tensor *x, int64_t out_h, int64_t out_w, deft_layout layout) {
    deft_graph *g = deft_srcs_graph("adaptive_avg_pool2d", 1, &x);
    if (!g || !deft_check_image(g, "adaptive_avg_pool2d", x, (int)layout)) return NULL;
    if (out_h <= 0 || out_w <= 0) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "adaptive_avg_pool2d: the output size %lld x %lld must be positive",
                        (long long)out_h, (long long)out_w);
        return NULL;
    }
    const deft_image_axes a = deft_image_axes_of((int)layout);
    /* The kernels map between the sizes by (out + 1) x (in + 1) products in int64. */
    int64_t t0, t1, t2, t3;
    if (!deft_i64_add(out_h, 1, &t0) || !deft_i64_mul(t0, x->shape[a.h] + 1, &t1) || !deft_i64_add(out_w, 1, &t2) ||
        !deft_i64_mul(t2, x->shape[a.w] + 1, &t3)) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "adaptive_avg_pool2d: the output size %lld x %lld is too large for an "
                        "input of %lld x %lld", (long long)out_h, (long long)out_w, (long long)x->shape[a.h],
                        (long long)x->shape[a.w]);
        return NULL;
    }
    int64_t shape[4];
    deft_image_shape((int)layout, x->shape[a.n], x->shape[a.c], out_h, out_w, shape);
    deft_tensor *t = deft_node_new(g, DEFT_OP_ADAPTIVE_AVG_POOL2D, x->dtype, x->device, 4, shape, 1, &x);
    if (t) t->p.pool.layout = (int)layout;
    return t;
}

deft_tensor *deft_pool2d_grad(deft_tensor *dy, const deft_tensor *pool) {
    deft_op op = pool->op == DEFT_OP_MAX_POOL2D   ? DEFT_OP_MAX_POOL2D_GRAD
                 : pool->op == DEFT_OP_AVG_POOL2D ? DEFT_OP_AVG_POOL2D_GRAD
                                                  : DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD;
    deft_tensor *srcs[2] = {dy, pool->src[0]};
    const int nsrc = op == DEFT_OP_MAX_POOL2D_GRAD ? 2 : 1;   /* only max pooling looks at x again */
    deft_graph *g = deft_srcs_graph(deft_op_name(op), nsrc, srcs);
    if (!g) return NULL;
    const deft_tensor *x = pool->src[0];
    deft_tensor *t = deft_node_new(g, op, x->dtype, x->device, 4, x->shape, nsrc, srcs);
    if (t) t->p = pool->p;
    return t;
}
