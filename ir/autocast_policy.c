/* The autocast policy, op by op (as torch.autocast's lists): which dtype each node of the forward pass computes in
 * under a low precision L (bf16 or f16), and the node re-built in it.
 *
 *   to L        matmul, conv2d, attention: f32 inputs cast to L (the kernels accumulate in f32), an L result
 *               (attention's row statistics stay f32)
 *   to f32      reductions (sum, mean, max), softmax, log_softmax, exp, log, pow, sqrt, rsqrt,
 *               reciprocal, layer_norm: L inputs cast up, an f32 result (torch's fp32 list; a pre-norm transformer's
 *               residual stream is f32 already, so layer norm then reads it with no cast). A layer norm that only
 *               products read (each through its cast to L) writes its value in L directly, computed in f32 and
 *               rounded once: the cast's bits, without the f32 value the backward pass would keep alive for the
 *               statistics past it (ir/autocast_layer_norm.c)
 *   f32 loss    cross-entropy (torch's fp32 list too): the logits stay as they are, L included, and the loss is f32;
 *               its kernels compute in f32 as if the logits had been cast (exact), so the loss has the bits the cast
 *               would give, and the gradient comes out in L rounded once, as the cast of the f32 one would: no
 *               [N, C] cast each way, which on a GPT-2 step cost more than the loss itself
 *   promote     binary ops, where and concat with mixed inputs run in f32, except where every f32 input is a parameter
 *               (a bias, a scale): then it is cast to L, as torch's F.linear casts its bias
 *   norm        batch norm: per source, as deft_batch_norm_input_dtype says (each keeps its dtype)
 *   keep        activations, scalar ops, shape ops, dropout, device moves, pooling, embedding, index_select,
 *               masked_fill: their input's dtype (the table's for a gather)
 * Conv2d, pooling and batch norm are re-built by ir/autocast_image.c, which says more about them.
 * Only f32 nodes change: f64 and i32 ones, and explicit casts, keep the dtype the user gave them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autocast.h"
#include "build_grad_ops.h"
#include "node.h"
#include "optimizer.h"

typedef enum deft_policy {
    DEFT_POLICY_LOW,
    DEFT_POLICY_F32,
    DEFT_POLICY_PROMOTE,
    DEFT_POLICY_NORM,
    DEFT_POLICY_KEEP
} deft_policy;

static deft_policy deft_policy_of(deft_op op) {
    switch (op) {
    case DEFT_OP_MATMUL:
    case DEFT_OP_ATTENTION:
    case DEFT_OP_CONV2D: return DEFT_POLICY_LOW;
    case DEFT_OP_BN_STATS:
    case DEFT_OP_BATCH_NORM: return DEFT_POLICY_NORM;
    case DEFT_OP_SUM:
    case DEFT_OP_MEAN:
    case DEFT_OP_MAX:
    case DEFT_OP_SOFTMAX:
    case DEFT_OP_LOG_SOFTMAX:
    case DEFT_OP_EXP:
    case DEFT_OP_LOG:
    case DEFT_OP_POW_SCALAR:
    case DEFT_OP_SQRT:
    case DEFT_OP_RSQRT:
    case DEFT_OP_LAYER_NORM:
    case DEFT_OP_RDIV_SCALAR: return DEFT_POLICY_F32;
    case DEFT_OP_ADD:
    case DEFT_OP_SUB:
    case DEFT_OP_MUL:
    case DEFT_OP_DIV:
    case DEFT_OP_MAXIMUM:
    case DEFT_OP_EQ:
    case DEFT_OP_GT:
    case DEFT_OP_GE:
    case DEFT_OP_CONCAT:
    case DEFT_OP_WHERE: return DEFT_POLICY_PROMOTE;
    default: return DEFT_POLICY_KEEP;
    }
}

static deft_status deft_memo_grow(deft_autocast *ac, int need) {
    if (need <= ac->cap) return DEFT_OK;
    int cap = ac->cap ? ac->cap : 64;
    while (cap < need) cap *= 2;
    deft_tensor **lo = realloc(ac->to_low, (size_t)cap * sizeof *lo);
    if (lo) ac->to_low = lo;
    deft_tensor **hi = lo ? realloc(ac->to_f32, (size_t)cap * sizeof *hi) : NULL;
    if (hi) ac->to_f32 = hi;
    if (!lo || !hi) return deft_set_error(DEFT_ERR_OOM, "autocast: out of host memory");
    memset(ac->to_low + ac->cap, 0, (size_t)(cap - ac->cap) * sizeof *lo);
    memset(ac->to_f32 + ac->cap, 0, (size_t)(cap - ac->cap) * sizeof *hi);
    ac->cap = cap;
    return DEFT_OK;
}

deft_tensor **deft_autocast_memo(deft_autocast *ac, const deft_tensor *x, deft_dtype dt) {
    if ((dt != ac->dtype && dt != DEFT_F32) || deft_memo_grow(ac, x->id + 1) != DEFT_OK) return NULL;
    return dt == DEFT_F32 ? &ac->to_f32[x->id] : &ac->to_low[x->id];
}

deft_tensor *deft_autocast_cast(deft_autocast *ac, deft_tensor *x, deft_dtype dt) {
    if (!x || x->dtype == dt) return x;
    deft_tensor **slot = NULL;
    if (dt == ac->dtype || dt == DEFT_F32) {
        if (!(slot = deft_autocast_memo(ac, x, dt))) return NULL;
        if (*slot) return *slot;
    }
    deft_tensor *c = dt == ac->dtype && ac->param_copies ? deft_param_copy(x, dt) : NULL;
    if (!c && !(c = deft_cast(x, dt))) return NULL;
    char name[64];
    snprintf(name, sizeof name, "%.52s.%s", x->name, deft_dtype_name(dt));
    deft_set_name(c, name);
    c->autocast = DEFT_AUTOCAST_CAST;
    if (slot) *slot = c;
    return c;
}

static bool deft_is_low(const deft_autocast *ac, const deft_tensor *x) { return x->dtype == ac->dtype; }

bool deft_autocast_reads_low(const deft_tensor *r) {
    return r->dtype == DEFT_F32 && deft_policy_of(r->op) == DEFT_POLICY_LOW && !deft_autocast_is_image_op(r->op);
}

/* The dtype the policy gives all of t's inputs, or DEFT_DTYPE_COUNT to leave them as they are (or, for batch norm,
 * to ask deft_batch_norm_input_dtype input by input). */
static deft_dtype deft_inputs_dtype(const deft_autocast *ac, const deft_tensor *t, deft_tensor **src) {
    if (t->dtype != DEFT_F32) return DEFT_DTYPE_COUNT;
    switch (deft_policy_of(t->op)) {
    case DEFT_POLICY_LOW: return ac->dtype;
    case DEFT_POLICY_F32: return DEFT_F32;
    case DEFT_POLICY_PROMOTE: {
        bool any_low = false, f32_params_only = true;
        for (int k = 0; k < t->nsrc; k++) {
            if (deft_is_low(ac, src[k])) any_low = true;
            else if (src[k]->dtype == DEFT_F32 && src[k]->op != DEFT_OP_PARAM) f32_params_only = false;
        }
        if (!any_low) return DEFT_DTYPE_COUNT;
        return f32_params_only ? ac->dtype : DEFT_F32;
    }
    default: return DEFT_DTYPE_COUNT;
    }
}

static void deft_reduce_axes(const deft_tensor *t, int *axes, int *n) {
    *n = 0;
    for (int d = 0; d < t->src[0]->ndim; d++)
        if (t->p.reduce.mask & (1u << d)) axes[(*n)++] = d;
}

/* The slice's end from its normalised start, step and length. */
static int64_t deft_slice_end(const deft_tensor *t) {
    int64_t len = t->shape[t->p.slice.axis];
    return len == 0 ? t->p.slice.start : t->p.slice.start + (len - 1) * t->p.slice.step + 1;
}

static deft_tensor *deft_rebuild_unary(const deft_tensor *t, deft_tensor *a) {
    double s = t->p.scalar;
    switch (t->op) {
    case DEFT_OP_ADD_SCALAR: return deft_add_scalar(a, s);
    case DEFT_OP_RSUB_SCALAR: return deft_rsub_scalar(a, s);
    case DEFT_OP_MUL_SCALAR: return deft_mul_scalar(a, s);
    case DEFT_OP_DIV_SCALAR: return deft_div_scalar(a, s);
    case DEFT_OP_RDIV_SCALAR: return deft_rdiv_scalar(a, s);
    case DEFT_OP_MAXIMUM_SCALAR: return deft_maximum_scalar(a, s);
    case DEFT_OP_POW_SCALAR: return deft_pow_scalar(a, s);
    case DEFT_OP_NEG: return deft_neg(a);
    case DEFT_OP_EXP: return deft_exp(a);
    case DEFT_OP_LOG: return deft_log(a);
    case DEFT_OP_SQRT: return deft_sqrt(a);
    case DEFT_OP_RSQRT: return deft_rsqrt(a);
    case DEFT_OP_TANH: return deft_tanh(a);
    case DEFT_OP_SIGMOID: return deft_sigmoid(a);
    case DEFT_OP_RELU: return deft_relu(a);
    case DEFT_OP_GELU: return deft_gelu(a);
    case DEFT_OP_SILU: return deft_silu(a);
    case DEFT_OP_GELU_TANH: return deft_gelu_tanh(a);
    case DEFT_OP_CAST: return deft_cast(a, t->dtype);
    case DEFT_OP_COPY: return deft_to(a, t->device, a->dtype);
    case DEFT_OP_RESHAPE: return deft_reshape(a, t->ndim, t->shape);
    case DEFT_OP_PERMUTE: return deft_permute(a, t->p.perm);
    case DEFT_OP_SLICE: return deft_slice(a, t->p.slice.axis, t->p.slice.start, deft_slice_end(t), t->p.slice.step);
    case DEFT_OP_SOFTMAX: return deft_softmax(a, t->p.axis);
    case DEFT_OP_LOG_SOFTMAX: return deft_log_softmax(a, t->p.axis);
    case DEFT_OP_DROPOUT: return deft_dropout(a, t->p.dropout.p, t->p.dropout.seed);
    case DEFT_OP_SUM:
    case DEFT_OP_MEAN:
    case DEFT_OP_MAX: {
        int axes[DEFT_MAX_DIMS], n;
        deft_reduce_axes(t, axes, &n);
        deft_tensor *(*fn)(deft_tensor *, int, const int *, int) =
            t->op == DEFT_OP_SUM ? deft_sum : t->op == DEFT_OP_MEAN ? deft_mean : deft_max;
        return fn(a, n, axes, t->p.reduce.keepdim);
    }
    default: return NULL;
    }
}

static deft_tensor *deft_rebuild(const deft_tensor *t, deft_tensor **src) {
    switch (t->op) {
    case DEFT_OP_ADD: return deft_add(src[0], src[1]);
    case DEFT_OP_SUB: return deft_sub(src[0], src[1]);
    case DEFT_OP_MUL: return deft_mul(src[0], src[1]);
    case DEFT_OP_DIV: return deft_div(src[0], src[1]);
    case DEFT_OP_MAXIMUM: return deft_maximum(src[0], src[1]);
    case DEFT_OP_EQ: return deft_eq(src[0], src[1]);
    case DEFT_OP_GT: return deft_gt(src[0], src[1]);
    case DEFT_OP_GE: return deft_ge(src[0], src[1]);
    case DEFT_OP_MATMUL: return deft_matmul_t(src[0], src[1], t->p.matmul.trans_a, t->p.matmul.trans_b);
    case DEFT_OP_CONCAT: {
        deft_tensor *c = deft_concat(src, t->nsrc, t->p.axis);
        if (c && c->op == DEFT_OP_CONCAT && t->nsrc > 1) c->p.concat.add_zero = t->p.concat.add_zero;
        return c;
    }
    /* gathers keep the table's dtype (torch's embedding is on no autocast list); their index is i32 */
    case DEFT_OP_EMBEDDING: return deft_embedding(src[0], src[1]);
    case DEFT_OP_INDEX_SELECT: return deft_index_select(src[0], t->p.gather.axis, src[1]);
    case DEFT_OP_WHERE: return deft_where(src[0], src[1], src[2]);
    case DEFT_OP_MASKED_FILL: return deft_masked_fill(src[0], src[1], t->p.scalar);
    case DEFT_OP_CROSS_ENTROPY: {
        const deft_cross_entropy_options o = deft_cross_entropy_options_of(t);
        return deft_cross_entropy_as(src[0], src[1], &o, t->dtype);
    }
    case DEFT_OP_ATTENTION: {
        const deft_attention_options o = {.causal = t->p.attn.causal, .scale = t->p.attn.scale};
        return t->p.attn.heads > 0 ? deft_attention_packed(src[0], t->p.attn.heads, &o)
                                   : deft_attention(src[0], src[1], src[2], &o);
    }
    case DEFT_OP_LAYER_NORM:
        return deft_layer_norm(src[0], t->p.ln.has_weight ? src[1] : NULL,
                               t->p.ln.has_bias ? src[1 + t->p.ln.has_weight] : NULL, t->p.ln.eps);
    default: return t->nsrc == 1 ? deft_rebuild_unary(t, src[0]) : NULL;
    }
}

/* Ops that only a backward pass makes, or that have no inputs (shared as they are). */
static bool deft_rebuildable(deft_op op) {
    return op != DEFT_OP_ACT_GRAD && op != DEFT_OP_EXPAND && op != DEFT_OP_SLICE_GRAD &&
           op != DEFT_OP_CROSS_ENTROPY_GRAD && op != DEFT_OP_OPTIMIZER && op != DEFT_OP_ATTENTION_GRAD &&
           op != DEFT_OP_INDEX_ORDER && op != DEFT_OP_EMBEDDING_GRAD && op != DEFT_OP_INDEX_SELECT_GRAD &&
           op != DEFT_OP_LAYER_NORM_GRAD && op != DEFT_OP_LAYER_NORM_WEIGHT_GRAD;
}

deft_tensor *deft_autocast_node(deft_autocast *ac, deft_tensor *t, deft_tensor **src) {
    if (t->nsrc == 0 || deft_op_is_leaf(t->op)) return t;
    const deft_dtype all = deft_inputs_dtype(ac, t, src);
    const bool norm = t->dtype == DEFT_F32 && deft_policy_of(t->op) == DEFT_POLICY_NORM;
    bool changed = false;
    for (int k = 0; k < t->nsrc; k++) {
        const deft_dtype want = norm ? deft_batch_norm_input_dtype(ac, t, k) : all;
        if (want != DEFT_DTYPE_COUNT && deft_dtype_is_float(src[k]->dtype))
            src[k] = want == ac->dtype ? deft_autocast_low(ac, t->src[k], src[k])
                                       : deft_autocast_cast(ac, src[k], want);
        if (!src[k]) return NULL;
        changed |= src[k] != t->src[k];
    }
    if (!changed) return t;
    if (!deft_rebuildable(t->op)) {
        deft_set_error(DEFT_ERR_INVALID, "autocast: %s (%s) cannot be re-built in %s", t->name, deft_op_name(t->op),
                       deft_dtype_name(ac->dtype));
        return NULL;
    }
    deft_tensor *n = deft_autocast_is_image_op(t->op) ? deft_autocast_image(ac, t, src) : deft_rebuild(t, src);
    if (!n) return NULL;
    if (n->id >= ac->n_user && n->autocast == DEFT_AUTOCAST_NONE) {
        char name[64];
        snprintf(name, sizeof name, "%.52s@%s", t->name, deft_dtype_name(ac->dtype));
        deft_set_name(n, name);
        n->autocast = DEFT_AUTOCAST_NODE;
    }
    return n;
}
