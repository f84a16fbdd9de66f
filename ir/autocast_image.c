/* The autocast policy for image ops (ir/autocast_policy.c has the rest): conv2d, pooling and batch norm, each
 * re-built on the sources the policy gave it, and the CPU's stand-in for the half kernels it lacks.
 *
 *   conv2d      to L: x, weight and bias cast to L (a weight's cast is made once per step, whatever reads it); the
 *               result in L. cuDNN accumulates in f32.
 *   pooling     keep: max, average and adaptive average pooling run in their input's dtype (the CUDA kernels load
 *               halves into float, accumulate there and round once on the store: ops/cuda/cuda_pool.cu).
 *   batch norm  computes in f32 ("fp32 for normalisation") on x in its dtype (L after a convolution) with f32
 *               weight, bias and statistics, as torch's cuDNN batch norm: y in x's dtype, statistics f32.
 *
 * The CPU's convolution and pooling kernels run f32 and f64 only (ops/cpu/cpu_conv.c, cpu_pool.c). On the CPU such a
 * node in L computes in f32 on its L sources widened (exact) and its result is rounded to L: the numbers cuDNN gives
 * (f32 accumulation of L values, one rounding of the result), summed in another order. The casts are drawn in the
 * DOT dump like the others. */
#include <stdio.h>

#include "autocast.h"
#include "node.h"

bool deft_autocast_is_image_op(deft_op op) {
    switch (op) {
    case DEFT_OP_CONV2D:
    case DEFT_OP_MAX_POOL2D:
    case DEFT_OP_AVG_POOL2D:
    case DEFT_OP_ADAPTIVE_AVG_POOL2D:
    case DEFT_OP_BN_STATS:
    case DEFT_OP_BATCH_NORM: return true;
    default: return false;
    }
}

/* The dtype source k of a batch norm node (BN_STATS or BATCH_NORM) is cast to under L: none (DEFT_DTYPE_COUNT).
 * Its kernels take x in L or f32 with f32 weight, bias and statistics and compute in f32, so x stays as the
 * convolution left it: no cast up, no f32 copy kept for the backward pass (half the activation bytes). */
deft_dtype deft_batch_norm_input_dtype(const deft_autocast *ac, const deft_tensor *bn, int k) {
    (void)ac, (void)bn, (void)k;
    return DEFT_DTYPE_COUNT;
}

/* Whether the kernels of `dev` run op in the low dtype; where they do not, deft_autocast_image widens. */
static bool deft_runs_low(deft_op op, deft_device dev) {
    if (dev.type != DEFT_CPU) return true;
    return op != DEFT_OP_CONV2D && op != DEFT_OP_MAX_POOL2D && op != DEFT_OP_AVG_POOL2D &&
           op != DEFT_OP_ADAPTIVE_AVG_POOL2D;
}

static deft_tensor *deft_rebuild_conv(const deft_tensor *t, deft_tensor **src) {
    deft_conv2d_options o = {.groups = t->p.conv.groups, .layout = (deft_layout)t->p.conv.layout};
    for (int i = 0; i < 2; i++) {
        o.stride[i] = t->p.conv.stride[i];
        o.padding[i] = t->p.conv.pad[i];
        o.dilation[i] = t->p.conv.dil[i];
    }
    return deft_conv2d(src[0], src[1], t->nsrc > 2 ? src[2] : NULL, &o);
}

static deft_tensor *deft_rebuild_pool(const deft_tensor *t, deft_tensor *x) {
    const deft_layout layout = (deft_layout)t->p.pool.layout;
    if (t->op == DEFT_OP_ADAPTIVE_AVG_POOL2D) {
        const int h = layout == DEFT_NHWC ? 1 : 2;
        return deft_adaptive_avg_pool2d(x, t->shape[h], t->shape[h + 1], layout);
    }
    deft_pool2d_options o = {.exclude_pad = !t->p.pool.count_include_pad, .layout = layout};
    for (int i = 0; i < 2; i++) {
        o.kernel[i] = t->p.pool.kernel[i];
        o.stride[i] = t->p.pool.stride[i];
        o.padding[i] = t->p.pool.pad[i];
    }
    return t->op == DEFT_OP_MAX_POOL2D ? deft_max_pool2d(x, &o) : deft_avg_pool2d(x, &o);
}

/* Batch norm's two nodes have no public builder of their own: the same node on the new sources; the statistics
 * stay in the f32 they were built in (ir/build_norm.c keeps them f32 for a half x), y takes x's dtype. */
static deft_tensor *deft_rebuild_batch_norm(const deft_tensor *t, deft_tensor **src) {
    const deft_dtype dt = t->op == DEFT_OP_BN_STATS ? t->dtype : src[0]->dtype;
    deft_tensor *n = deft_node_new(t->graph, t->op, dt, t->device, t->ndim, t->shape, t->nsrc, src);
    if (n) n->p = t->p;
    return n;
}

static deft_tensor *deft_rebuild_image(const deft_tensor *t, deft_tensor **src) {
    switch (t->op) {
    case DEFT_OP_CONV2D: return deft_rebuild_conv(t, src);
    case DEFT_OP_BN_STATS:
    case DEFT_OP_BATCH_NORM: return deft_rebuild_batch_norm(t, src);
    default: return deft_rebuild_pool(t, src[0]);
    }
}

deft_tensor *deft_autocast_image(deft_autocast *ac, const deft_tensor *t, deft_tensor **src) {
    const bool low = src[0]->dtype == ac->dtype;
    if (!low || deft_runs_low(t->op, t->device)) return deft_rebuild_image(t, src);
    for (int k = 0; k < t->nsrc; k++)
        if (!(src[k] = deft_autocast_cast(ac, src[k], DEFT_F32))) return NULL;
    deft_tensor *wide = deft_rebuild_image(t, src);
    if (!wide) return NULL;
    char name[64];
    snprintf(name, sizeof name, "%.52s@%s", t->name, deft_dtype_name(ac->dtype));
    deft_set_name(wide, name);
    wide->autocast = DEFT_AUTOCAST_NODE;
    return deft_autocast_cast(ac, wide, ac->dtype);
}
