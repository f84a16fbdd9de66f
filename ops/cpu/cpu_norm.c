/* Batch norm on the CPU: the statistics (and the running statistics' update), the normalisation, the gradient sums
 * (of dy and dy xhat per channel: the bias and weight gradients) and the input gradient from the stats node's and
 * the sums node's values. Sums run in double, one channel per thread. x, y, dy and dx are f32, f64, f16 or bf16; the
 * statistics, parameters and sums have the parameter dtype (f32 for the half types, x's otherwise). */
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
    if (dt == DEFT_F32) return (double)((const float *)p)[i];
    if (dt == DEFT_F64) return ((const double *)p)[i];
    return deft_load_as_f64(p, dt, i);
}

static inline void bn_st(void *p, deft_dtype dt, int64_t i, double v) {
    if (dt == DEFT_F32) ((float *)p)[i] = (float)v;
    else if (dt == DEFT_F64) ((double *)p)[i] = v;
    else deft_store_from_f64(p, dt, i, v);
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
    const deft_dtype dt = n->dtype, xdt = n->p.bn.batch ? n->src[0]->dtype : dt;
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
        bn_batch_moments(&g, in[0], xdt, c, &mean, &var);
        bn_st(out, dt, c, mean);
        bn_st(out, dt, C + c, 1.0 / sqrt(var + n->p.bn.eps));
        if (!rm) continue;
        bn_st(rm, dt, c, (1.0 - mom) * bn_ld(rm, dt, c) + mom * mean);
        bn_st(rv, dt, c, (1.0 - mom) * bn_ld(rv, dt, c) + mom * var * m / (m - 1.0));
    }
}

/* y = (x - mean) invstd weight + bias; src (x, stats[, weight][, bias]). */
static void bn_forward(const deft_tensor *n, void *y, const void *const *in) {
    const deft_dtype dt = n->dtype, pdt = n->src[1]->dtype;
    const bn_geom g = bn_geometry(n, n->p.bn.layout);
    const void *w = n->p.bn.has_weight ? in[2] : NULL;
    const void *b = n->p.bn.has_bias ? in[2 + n->p.bn.has_weight] : NULL;
    const int64_t total = g.N * g.C * g.S;
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < total; i++) {
        const int64_t c = bn_channel_of(&g, i);
        double v = (bn_ld(in[0], dt, i) - bn_ld(in[1], pdt, c)) * bn_ld(in[1], pdt, g.C + c);
        if (w) v *= bn_ld(w, pdt, c);
        if (b) v += bn_ld(b, pdt, c);
        bn_st(y, dt, i, v);
    }
}

/* sums [2, C]: the sums of dy and of dy xhat per channel; src (dy, x, stats). */
static void bn_grad_sums(const deft_tensor *n, void *sums, const void *const *in) {
    const bn_geom g = bn_geometry(n->src[0], n->p.bn.layout);
    const deft_dtype xdt = n->src[0]->dtype, pdt = n->dtype;
    DEFT_OMP(parallel for schedule(static) if (g.N * g.S * g.C > DEFT_CPU_PAR_MIN))
    for (int64_t c = 0; c < g.C; c++) {
        const double mean = bn_ld(in[2], pdt, c), invstd = bn_ld(in[2], pdt, g.C + c);
        double sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int64_t i = 0; i < g.N; i++) {
            for (int64_t s = 0; s < g.S; s++) {
                const int64_t at = i * g.sN + c * g.sC + s;
                const double d = bn_ld(in[0], xdt, at);
                sum_dy += d;
                sum_dy_xhat += d * (bn_ld(in[1], xdt, at) - mean) * invstd;
            }
        }
        bn_st(sums, pdt, c, sum_dy);
        bn_st(sums, pdt, g.C + c, sum_dy_xhat);
    }
}

/* Training: dx = w invstd (dy - mean(dy) - xhat mean(dy xhat)), src (dy, x, stats, sums[, w]); evaluation:
 * dx = dy invstd w, src (dy, stats[, w]). */
static void bn_input_grad(const deft_tensor *n, void *dx, const void *const *in) {
    const deft_dtype dt = n->dtype;
    const bn_geom g = bn_geometry(n, n->p.bn.layout);
    const bool batch = n->p.bn.batch;
    const void *x = batch ? in[1] : NULL, *stats = in[1 + batch], *sums = batch ? in[3] : NULL;
    const void *w = n->p.bn.has_weight ? in[batch ? 4 : 2] : NULL;
    const deft_dtype pdt = n->src[1 + batch]->dtype;
    const double m = (double)(g.N * g.S);
    const int64_t total = g.N * g.C * g.S;
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < total; i++) {
        const int64_t c = bn_channel_of(&g, i);
        const double invstd = bn_ld(stats, pdt, g.C + c);
        const double scale = invstd * (w ? bn_ld(w, pdt, c) : 1.0), d = bn_ld(in[0], dt, i);
        if (!batch) {
            bn_st(dx, dt, i, d * scale);
            continue;
        }
        const double xhat = (bn_ld(x, dt, i) - bn_ld(stats, pdt, c)) * invstd;
        const double mean_dy = bn_ld(sums, pdt, c) / m, mean_dy_xhat = bn_ld(sums, pdt, g.C + c) / m;
        bn_st(dx, dt, i, scale * (d - mean_dy - xhat * mean_dy_xhat));
    }
}

static bool bn_dtype_ok(deft_dtype dt) {
    return dt == DEFT_F32 || dt == DEFT_F64 || dt == DEFT_F16 || dt == DEFT_BF16;
}

deft_status deft_cpu_batch_norm(const deft_tensor *n, void *out, const void *const *in) {
    for (int i = 0; i < n->nsrc; i++)
        if (!bn_dtype_ok(n->src[i]->dtype)) return deft_cpu_dtype_error(n, n->src[i]->dtype);
    if (!bn_dtype_ok(n->dtype)) return deft_cpu_dtype_error(n, n->dtype);
    switch (n->op) {
    case DEFT_OP_BN_STATS: bn_stats(n, out, in); break;
    case DEFT_OP_BATCH_NORM: bn_forward(n, out, in); break;
    case DEFT_OP_BATCH_NORM_GRAD: bn_input_grad(n, out, in); break;
    default: bn_grad_sums(n, out, in); break;
    }
    return DEFT_OK;
}
