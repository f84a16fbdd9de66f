/* Attention as one node (DEFT_OP_ATTENTION) and its gradient as one more (DEFT_OP_ATTENTION_GRAD), like
 * FlashAttention: the forward keeps its value and each row's log-sum-exp, never the T x T probabilities, and the
 * backward recomputes them tile by tile. A node has one value, so the statistics live past the value in the node's
 * own buffer (graph_internal.h's deft_node_extra_bytes): they are born, kept, recomputed (checkpointing) and freed
 * with the output, which the backward pass reads anyway. The gradient node's value stacks dq, dk and dv ([3, B, H,
 * T, D]); each is a view of its slice, as batch norm's weight and bias gradients are rows of one sums node.
 *
 * The packed form (deft_attention_packed, p.attn.heads = H) is the same two ops over another layout: q, k and v are
 * the thirds of one [B, T, 3C] source (GPT-2's c_attn product), the value is [B, T, C] laid out [B, T, H, D] and the
 * gradient node's value is that source's gradient [B, T, 3C] itself. Every place that knows attention (statistics
 * bytes, op cost, checkpointing, the kernels) asks graph_internal.h's deft_attention_dims_of and
 * deft_attention_layout_of, so both forms run the same code; only the slices and permutes around the node go. */
#include <math.h>

#include "build_grad_ops.h"
#include "checked.h"
#include "node.h"

static bool deft_attention_check_dtypes(deft_graph *g, deft_tensor *const *s) {
    if (!deft_require_float(g, "attention", s[0]->dtype)) return false;
    if (s[1]->dtype == s[0]->dtype && s[2]->dtype == s[0]->dtype) return true;
    deft_graph_fail(g, DEFT_ERR_DTYPE, "attention: q, k and v must have one dtype, got %s, %s and %s",
                    deft_dtype_name(s[0]->dtype), deft_dtype_name(s[1]->dtype), deft_dtype_name(s[2]->dtype));
    return false;
}

static bool deft_attention_check_shapes(deft_graph *g, deft_tensor *const *s) {
    char a[96], b[96], c[96];
    deft_shape_str(s[0]->ndim, s[0]->shape, a, sizeof a);
    deft_shape_str(s[1]->ndim, s[1]->shape, b, sizeof b);
    deft_shape_str(s[2]->ndim, s[2]->shape, c, sizeof c);
    bool same = s[1]->ndim == s[0]->ndim && s[2]->ndim == s[0]->ndim;
    for (int d = 0; same && d < s[0]->ndim; d++)
        same = s[1]->shape[d] == s[0]->shape[d] && s[2]->shape[d] == s[0]->shape[d];
    if (!same || s[0]->ndim != 4) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "attention: q, k and v must all be [B, H, T, D] of one shape, got q %s, "
                        "k %s, v %s", a, b, c);
        return false;
    }
    const int64_t d = s[0]->shape[3];
    if (d < 1 || d > DEFT_ATTENTION_MAX_HEAD) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "attention: q, k and v are %s: head size D = %lld; the kernels take 1 to %d "
                        "(split the heads further)", a, (long long)d, DEFT_ATTENTION_MAX_HEAD);
        return false;
    }
    return true;
}

/* The node's value with its statistics past it (deft_node_buffer_bytes) fits one buffer: checked here, so that the
 * planner's sizes never wrap. rows: the value's B * H * T (at most its element count: a factor of the checked size). */
static bool deft_attention_check_bytes(deft_graph *g, const char *op, deft_dtype dt, int ndim, const int64_t *shape,
                                       int heads) {
    if (!deft_check_size(g, op, dt, ndim, shape)) return false;
    size_t bytes = 0, rows = 1, extra = 0, total = 0;
    deft_shape_bytes(ndim, shape, deft_dtype_size(dt), &bytes);   /* deft_check_size passed: it fits */
    if (heads > 0) rows = (size_t)shape[0] * (size_t)heads * (size_t)shape[1];
    else
        for (int d = ndim - 4; d < ndim - 1; d++) rows *= (size_t)shape[d];
    if (deft_size_mul(rows, dt == DEFT_F64 ? 8 : 4, &extra) && deft_size_add(bytes, 255 + extra, &total) &&
        total <= DEFT_MAX_BYTES)
        return true;
    char s[96];
    deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: %s of %s with its row statistics is past the %zu bytes a buffer may have",
                    op, deft_shape_str(ndim, shape, s, sizeof s), deft_dtype_name(dt), DEFT_MAX_BYTES);
    return false;
}

static bool deft_attention_resolve(deft_graph *g, const deft_attention_options *o, int64_t d, deft_op_params *p) {
    const double scale = o ? o->scale : 0.0;
    if (!isfinite(scale)) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "attention: scale %g must be finite (0 for 1/sqrt(D))", scale);
        return false;
    }
    p->attn.scale = scale != 0.0 ? scale : 1.0 / sqrt((double)d);
    p->attn.causal = o && o->causal ? 1 : 0;
    return true;
}

deft_tensor *deft_attention(deft_tensor *q, deft_tensor *k, deft_tensor *v, const deft_attention_options *o) {
    deft_tensor *s[3] = {q, k, v};
    deft_graph *g = deft_srcs_graph("attention", 3, s);
    if (!g || !deft_attention_check_shapes(g, s) || !deft_attention_check_dtypes(g, s)) return NULL;
    deft_op_params p = {0};
    if (!deft_attention_resolve(g, o, q->shape[3], &p) ||
        !deft_attention_check_bytes(g, "attention", q->dtype, 4, q->shape, 0))
        return NULL;
    deft_tensor *t = deft_node_new(g, DEFT_OP_ATTENTION, q->dtype, q->device, 4, q->shape, 3, s);
    if (t) t->p = p;
    return t;
}

/* qkv [B, T, 3C] with C = heads * D, 1 <= D <= DEFT_ATTENTION_MAX_HEAD; false with the graph's error when not. */
static bool deft_attention_packed_check(deft_graph *g, const deft_tensor *qkv, int heads) {
    char a[96];
    deft_shape_str(qkv->ndim, qkv->shape, a, sizeof a);
    if (heads < 1) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "attention_packed: heads %d must be positive (qkv %s)", heads, a);
        return false;
    }
    if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "attention_packed: qkv must be [B, T, 3C] (q, k and v the thirds of its "
                        "last dim), got %s", a);
        return false;
    }
    const int64_t c = qkv->shape[2] / 3;
    if (c % heads != 0) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "attention_packed: qkv %s: C = %lld is not divisible by %d heads", a,
                        (long long)c, heads);
        return false;
    }
    const int64_t d = c / heads;
    if (d < 1 || d > DEFT_ATTENTION_MAX_HEAD) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "attention_packed: qkv %s with %d heads: head size D = %lld; the kernels "
                        "take 1 to %d (use more heads)", a, heads, (long long)d, DEFT_ATTENTION_MAX_HEAD);
        return false;
    }
    return true;
}

deft_tensor *deft_attention_packed(deft_tensor *qkv, int heads, const deft_attention_options *o) {
    deft_graph *g = deft_srcs_graph("attention_packed", 1, &qkv);
    if (!g || !deft_attention_packed_check(g, qkv, heads) || !deft_require_float(g, "attention_packed", qkv->dtype))
        return NULL;
    deft_op_params p = {0};
    const int64_t shape[3] = {qkv->shape[0], qkv->shape[1], qkv->shape[2] / 3};
    if (!deft_attention_resolve(g, o, shape[2] / heads, &p) ||
        !deft_attention_check_bytes(g, "attention_packed", qkv->dtype, 3, shape, heads))
        return NULL;
    p.attn.heads = heads;
    deft_tensor *t = deft_node_new(g, DEFT_OP_ATTENTION, qkv->dtype, qkv->device, 3, shape, 1, &qkv);
    if (t) t->p = p;
    return t;
}

/* Apart: src (dout, q, k, v, attn), value [3, B, H, T, D]. Packed: src (dout, qkv, attn), value qkv's shape. */
deft_tensor *deft_attention_grad(deft_tensor *dout, const deft_tensor *attn) {
    if (!dout || !attn) return NULL;
    deft_graph *g = attn->graph;
    if (dout->dtype != attn->dtype) dout = deft_cast(dout, attn->dtype);
    const bool packed = attn->p.attn.heads > 0;
    deft_tensor *s[5] = {dout, attn->src[0], packed ? (deft_tensor *)attn : attn->src[1],
                         packed ? NULL : attn->src[2], (deft_tensor *)attn};
    const int nsrc = packed ? 3 : 5;
    if (!deft_srcs_graph("attention_grad", nsrc, s)) return NULL;
    const int ndim = packed ? 3 : 5;
    int64_t shape[5] = {3};
    for (int d = 0; d < attn->ndim; d++) shape[packed ? d : d + 1] = attn->shape[d];
    if (packed) shape[2] *= 3;
    if (!deft_attention_check_bytes(g, "attention_grad", attn->dtype, ndim, shape, attn->p.attn.heads)) return NULL;
    deft_tensor *t = deft_node_new(g, DEFT_OP_ATTENTION_GRAD, attn->dtype, attn->device, ndim, shape, nsrc, s);
    if (t) t->p = attn->p;
    return t;
}

deft_tensor *deft_attention_grad_part(deft_tensor *grad, int which) {
    if (!grad) return NULL;
    return deft_reshape(deft_slice(grad, 0, which, which + 1, 1), 4, grad->shape + 1);
}
