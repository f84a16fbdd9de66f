/* Batch norm on the CPU: the statistics (and the running statistics' update), the normalisation, and the input and
 * weight gradients from the stats node's values. Sums run in double, one channel per thread. f32 and f64. */
#include <stdlib.h>

#include "cpu_internal.h"

/* x seen as [N, C, S]: element (n, c, s) at n sN + c sC + s (NCHW: S is H W; NHWC: every non-channel axis is in
 * N and S is 1). */
typedef struct bn_geom {
    int64_t N, C, S, sN, sC;
} bn_geom;

static bn_geom bn_geometry(const deft_tensor *x, int layout) {
    bn_geom g;
    if (layout == DEFT_NHWC) {
        g.C = x->shape[x->ndim - 1];
        g.N = deft_shape_numel(x->ndim, x->shape) / g.C;
        g.S = 1;
        g.sN = g.C, g.sC = 1;
    } else {
        g.N = x->shape[0], g.C = x->shape[1];
        g.S = deft_shape_numel(x->ndim - 2, x->shape + 2);
        g.sN = g.C * g.S, g.sC = g.S;
    }
    return g;
}

static inline double bn_ld(const void *p, deft_dtype dt, int64_t i) {
    return dt == DEFT_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static inline void bn_st(void *p, deft_dtype dt, int64_t i, double v) {
    if (dt == DEFT_F32) ((float *)p)[i] = (float)v;
    else ((double *)p)[i] = v;
}

static inline int64_t bn_channel_of(const bn_geom *g, int64_t i) { return (i / g->sC) % g->C; }

/* The batch's mean and biased variance of channel c (two passes, so that a large mean costs no precision). */
static void bn_batch_moments(const bn_geom *g, const void *x, deft_dtype dt, int64_t c, double *mean, double *var) {
    const double m = (double)(g->N * g->S);
    double sum = 0.0, sq = 0.0;
    for (int64_t n = 0; n < g->N; n++)
        for (int64_t s = 0; s < g->S; s++) sum += bn_ld(x, dt, n * g->sN + c * g->sC + s);
    *mean = sum / m;
    for (int64_t n = 0; n < g->N; n++) {
        for (int64_t s = 0; s < g->S; s++) {
            const double d = bn_ld(x, dt, n * g->sN + c * g->sC + s) - *mean;
            sq += d * d;
        }
    }
    *var = sq / m;
}

/* src (x[, running_mean, running_var]) in training, (running_mean, running_var) in evaluation. The running
 * statistics are parameters, written here in place: this node is the only reader of them in a training step. */
static void bn_stats(const deft_tensor *n, void *out, const void *const *in) {
    const deft_dtype dt = n->dtype;
    const int64_t C = n->shape[1];
    if (!n->p.bn.batch) {
        for (int64_t c = 0; c < C; c++) {
            bn_st(out, dt, c, bn_ld(in[0], dt, c));
            bn_st(out, dt, C + c, 1.0 / sqrt(bn_ld(in[1], dt, c) + n->p.bn.eps));
        }
        return;
    }
    const bn_geom g = bn_geometry(n->src[0], n->p.bn.layout);
    const double mom = n->p.bn.momentum, m = (double)(g.N * g.S);
    void *rm = n->p.bn.update ? (void *)in[1] : NULL, *rv = n->p.bn.update ? (void *)in[2] : NULL;
    DEFT_OMP(parallel for schedule(static) if (g.N * g.S * C > DEFT_CPU_PAR_MIN))
    for (int64_t c = 0; c < C; c++) {
        double mean, var;
        bn_batch_moments(&g, in[0], dt, c, &mean, &var);
        bn_st(out, dt, c, mean);
        bn_st(out, dt, C + c, 1.0 / sqrt(var + n->p.bn.eps));
        if (!rm) continue;
        bn_st(rm, dt, c, (1.0 - mom) * bn_ld(rm, dt, c) + mom * mean);
        bn_st(rv, dt, c, (1.0 - mom) * bn_ld(rv, dt, c) + mom * var * m / (m - 1.0));
    }
}

/* y = (x - mean) invstd weight + bias; src (x, stats[, weight][, bias]). */
static void bn_forward(const deft_tensor *n, void *y, const void *const *in) {
    const deft_dtype dt = n->dtype;
    const bn_geom g = bn_geometry(n, n->p.bn.layout);
    const void *w = n->p.bn.has_weight ? in[2] : NULL;
    const void *b = n->p.bn.has_bias ? in[2 + n->p.bn.has_weight] : NULL;
    const int64_t total = g.N * g.C * g.S;
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < total; i++) {
        const int64_t c = bn_channel_of(&g, i);
        double v = (bn_ld(in[0], dt, i) - bn_ld(in[1], dt, c)) * bn_ld(in[1], dt, g.C + c);
        if (w) v *= bn_ld(w, dt, c);
        if (b) v += bn_ld(b, dt, c);
        bn_st(y, dt, i, v);
    }
}

/* Per channel: the mean and invstd that normalised, and the sums of dy and of dy xhat. */
typedef struct bn_channel {
    double mean, invstd, sum_dy, sum_dy_xhat;
} bn_channel;

/* x may be NULL (evaluation's dx needs no sums). */
static void bn_channel_sums(const deft_tensor *n, const bn_geom *g, const void *dy, const void *x, const void *stats,
                            bn_channel *ch) {
    const deft_dtype dt = n->dtype;
    DEFT_OMP(parallel for schedule(static) if (g->N * g->S * g->C > DEFT_CPU_PAR_MIN))
    for (int64_t c = 0; c < g->C; c++) {
        bn_channel k = {bn_ld(stats, dt, c), bn_ld(stats, dt, g->C + c), 0.0, 0.0};
        for (int64_t i = 0; x && i < g->N; i++) {
            for (int64_t s = 0; s < g->S; s++) {
                const int64_t at = i * g->sN + c * g->sC + s;
                const double d = bn_ld(dy, dt, at);
                k.sum_dy += d;
                k.sum_dy_xhat += d * (bn_ld(x, dt, at) - k.mean) * k.invstd;
            }
        }
        ch[c] = k;
    }
}

/* Training: dx = w invstd (dy - mean(dy) - xhat mean(dy xhat)), src (dy, x, stats[, w]); evaluation:
 * dx = dy invstd w, src (dy, stats[, w]). */
static void bn_input_grad(const deft_tensor *n, void *dx, const void *const *in, bn_channel *ch) {
    const deft_dtype dt = n->dtype;
    const bn_geom g = bn_geometry(n, n->p.bn.layout);
    const bool batch = n->p.bn.batch;
    const void *x = batch ? in[1] : NULL, *stats = in[1 + batch];
    const void *w = n->p.bn.has_weight ? in[2 + batch] : NULL;
    bn_channel_sums(n, &g, in[0], x, stats, ch);
    const double m = (double)(g.N * g.S);
    const int64_t total = g.N * g.C * g.S;
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < total; i++) {
        const int64_t c = bn_channel_of(&g, i);
        const bn_channel *k = &ch[c];
        const double scale = k->invstd * (w ? bn_ld(w, dt, c) : 1.0), d = bn_ld(in[0], dt, i);
        if (!batch) {
            bn_st(dx, dt, i, d * scale);
            continue;
        }
        const double xhat = (bn_ld(x, dt, i) - k->mean) * k->invstd;
        bn_st(dx, dt, i, scale * (d - k->sum_dy / m - xhat * k->sum_dy_xhat / m));
    }
}

/* dweight [C] = sum of dy xhat; src (dy, x, stats). */
static void bn_weight_grad(const deft_tensor *n, void *dw, const void *const *in, bn_channel *ch) {
    const bn_geom g = bn_geometry(n->src[0], n->p.bn.layout);
    bn_channel_sums(n, &g, in[0], in[1], in[2], ch);
    for (int64_t c = 0; c < g.C; c++) bn_st(dw, n->dtype, c, ch[c].sum_dy_xhat);
}

deft_status deft_cpu_batch_norm(const deft_tensor *n, void *out, const void *const *in) {
    if (n->dtype != DEFT_F32 && n->dtype != DEFT_F64) return deft_cpu_dtype_error(n, n->dtype);
    if (n->op == DEFT_OP_BN_STATS) {
        bn_stats(n, out, in);
        return DEFT_OK;
    }
    if (n->op == DEFT_OP_BATCH_NORM) {
        bn_forward(n, out, in);
        return DEFT_OK;
    }
    const deft_tensor *x = n->op == DEFT_OP_BATCH_NORM_GRAD ? n : n->src[0];
    const int64_t channels = x->shape[n->p.bn.layout == DEFT_NHWC ? x->ndim - 1 : 1];
    bn_channel *ch = malloc((size_t)channels * sizeof *ch);
    if (!ch) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory", deft_op_name(n->op));
    if (n->op == DEFT_OP_BATCH_NORM_GRAD) bn_input_grad(n, out, in, ch);
    else bn_weight_grad(n, out, in, ch);
    free(ch);
    return DEFT_OK;
}
