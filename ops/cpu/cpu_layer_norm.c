/* Layer norm on the CPU: the plain reference the CUDA kernels are checked against. Each row's moments in double, in
 * two passes (so that a large mean costs no precision); the statistics stored past the value (graph_internal.h) in
 * f32 (f64 for f64), and the backward pass reads them back as stored, as the GPU's does. x, y, dy and dx are f32,
 * f64, f16 or bf16, computed in double and rounded once on the store (halves through f32, as a cast of the f32
 * value rounds). The value may be bf16 or f16 from f32 x (deft_layer_norm_as): y rounds to the value's dtype, dy is
 * read in it, dx and the sums are in x's. One row per thread; the weight and bias gradients are column sums in row
 * order, one block of columns per thread. */
#include "cpu_internal.h"

#define DEFT_LN_COLS 64   /* columns one thread sums together: its accumulators stay in cache */

typedef struct ln_geom {
    int64_t rows, c;
    deft_dtype dt;    /* x's, the weight's and bias's, dx's and the sums' */
    deft_dtype ydt;   /* the forward node's value's, and dy's */
} ln_geom;

/* ln: the forward node */
static ln_geom ln_geometry(const deft_tensor *ln) {
    return (ln_geom){deft_layer_norm_rows(ln), ln->shape[ln->ndim - 1], ln->src[0]->dtype, ln->dtype};
}

static inline double ln_ld(const void *p, deft_dtype dt, int64_t i) {
    if (dt == DEFT_F32) return (double)((const float *)p)[i];
    if (dt == DEFT_F64) return ((const double *)p)[i];
    return deft_load_as_f64(p, dt, i);
}

static inline void ln_st(void *p, deft_dtype dt, int64_t i, double v) {
    if (dt == DEFT_F32) ((float *)p)[i] = (float)v;
    else if (dt == DEFT_F64) ((double *)p)[i] = v;
    else deft_store_from_f64(p, dt, i, v);
}

/* The statistics' dtype: f64 beside f64 values, f32 beside the others. */
static inline deft_dtype ln_stat_dtype(deft_dtype dt) { return dt == DEFT_F64 ? DEFT_F64 : DEFT_F32; }

static void ln_row_forward(const ln_geom *g, int64_t r, const void *const *w, void *out, void *stats, double eps) {
    const void *x = w[0];
    const int64_t base = r * g->c;
    double sum = 0.0, sq = 0.0;
    for (int64_t j = 0; j < g->c; j++) sum += ln_ld(x, g->dt, base + j);
    const double mean = sum / (double)g->c;
    for (int64_t j = 0; j < g->c; j++) {
        const double d = ln_ld(x, g->dt, base + j) - mean;
        sq += d * d;
    }
    const double rstd = 1.0 / sqrt(sq / (double)g->c + eps);
    const deft_dtype sdt = ln_stat_dtype(g->dt);
    ln_st(stats, sdt, r, mean);
    ln_st(stats, sdt, g->rows + r, rstd);
    for (int64_t j = 0; j < g->c; j++) {
        double y = (ln_ld(x, g->dt, base + j) - mean) * rstd;
        if (w[1]) y *= ln_ld(w[1], g->dt, j);
        if (w[2]) y += ln_ld(w[2], g->dt, j);
        ln_st(out, g->ydt, base + j, y);
    }
}

/* in: x[, weight][, bias] */
static void ln_forward(const deft_tensor *n, void *out, const void *const *in) {
    const ln_geom g = ln_geometry(n);
    const void *w[3] = {in[0], n->p.ln.has_weight ? in[1] : NULL,
                        n->p.ln.has_bias ? in[1 + n->p.ln.has_weight] : NULL};
    void *stats = (char *)out + deft_node_extra_offset(n);
    const double eps = n->p.ln.eps;
    DEFT_OMP(parallel for schedule(static) if (g.rows * g.c > DEFT_CPU_PAR_MIN))
    for (int64_t r = 0; r < g.rows; r++) ln_row_forward(&g, r, w, out, stats, eps);
}

/* in: dy, x, ln[, weight]: dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy * weight. */
static void ln_row_backward(const ln_geom *g, int64_t r, const void *const *in, const void *w, const void *stats,
                            void *out) {
    const deft_dtype sdt = ln_stat_dtype(g->dt);
    const double mean = ln_ld(stats, sdt, r), rstd = ln_ld(stats, sdt, g->rows + r);
    const int64_t base = r * g->c;
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = 0; j < g->c; j++) {
        const double gj = ln_ld(in[0], g->ydt, base + j) * (w ? ln_ld(w, g->dt, j) : 1.0);
        sg += gj;
        sgx += gj * (ln_ld(in[1], g->dt, base + j) - mean) * rstd;
    }
    const double c1 = sg / (double)g->c, c2 = sgx / (double)g->c;
    for (int64_t j = 0; j < g->c; j++) {
        const double gj = ln_ld(in[0], g->ydt, base + j) * (w ? ln_ld(w, g->dt, j) : 1.0);
        const double xhat = (ln_ld(in[1], g->dt, base + j) - mean) * rstd;
        ln_st(out, g->dt, base + j, rstd * (gj - c1 - xhat * c2));
    }
}

static void ln_input_grad(const deft_tensor *n, void *out, const void *const *in) {
    const ln_geom g = ln_geometry(n->src[2]);
    const void *stats = (const char *)in[2] + deft_node_extra_offset(n->src[2]);
    const void *w = n->nsrc > 3 ? in[3] : NULL;
    DEFT_OMP(parallel for schedule(static) if (g.rows * g.c > DEFT_CPU_PAR_MIN))
    for (int64_t r = 0; r < g.rows; r++) ln_row_backward(&g, r, in, w, stats, out);
}

/* in: dy, x, ln. out [2, C]: the sums of dy xhat and of dy over the rows, in row order. */
static void ln_weight_grad(const deft_tensor *n, void *out, const void *const *in) {
    const ln_geom g = ln_geometry(n->src[2]);
    const deft_dtype sdt = ln_stat_dtype(g.dt);
    const void *stats = (const char *)in[2] + deft_node_extra_offset(n->src[2]);
    const int64_t blocks = (g.c + DEFT_LN_COLS - 1) / DEFT_LN_COLS;
    DEFT_OMP(parallel for schedule(static) if (g.rows * g.c > DEFT_CPU_PAR_MIN))
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t j0 = blk * DEFT_LN_COLS, nj = g.c - j0 < DEFT_LN_COLS ? g.c - j0 : DEFT_LN_COLS;
        double dw[DEFT_LN_COLS] = {0}, db[DEFT_LN_COLS] = {0};
        for (int64_t r = 0; r < g.rows; r++) {
            const double mean = ln_ld(stats, sdt, r), rstd = ln_ld(stats, sdt, g.rows + r);
            for (int64_t j = 0; j < nj; j++) {
                const int64_t i = r * g.c + j0 + j;
                const double dy = ln_ld(in[0], g.ydt, i);
                dw[j] += dy * (ln_ld(in[1], g.dt, i) - mean) * rstd;
                db[j] += dy;
            }
        }
        for (int64_t j = 0; j < nj; j++) {
            ln_st(out, g.dt, j0 + j, dw[j]);
            ln_st(out, g.dt, g.c + j0 + j, db[j]);
        }
    }
}

/* The builder's pairs: y and dy in x's dtype, or bf16 or f16 beside f32 x; dx and the sums in x's. */
static bool ln_dtypes_ok(const deft_tensor *n) {
    const deft_tensor *ln = n->op == DEFT_OP_LAYER_NORM ? n : n->src[2];
    const deft_dtype x = ln->src[0]->dtype, y = ln->dtype;
    const bool pair = y == x || (x == DEFT_F32 && (y == DEFT_BF16 || y == DEFT_F16));
    return pair && (n->op == DEFT_OP_LAYER_NORM || (n->dtype == x && n->src[0]->dtype == y));
}

deft_status deft_cpu_layer_norm(const deft_tensor *n, void *out, const void *const *in) {
    if (!deft_cpu_is_float(n->dtype)) return deft_cpu_dtype_error(n, n->dtype);
    if (n->op >= DEFT_OP_LAYER_NORM && n->op <= DEFT_OP_LAYER_NORM_WEIGHT_GRAD && !ln_dtypes_ok(n))
        return deft_set_error(DEFT_ERR_DTYPE, "cpu %s %s: its dtypes are not a pair layer_norm computes (%s from %s)",
                              deft_op_name(n->op), n->name, deft_dtype_name(n->dtype),
                              deft_dtype_name(n->src[0]->dtype));
    switch (n->op) {
    case DEFT_OP_LAYER_NORM: ln_forward(n, out, in); return DEFT_OK;
    case DEFT_OP_LAYER_NORM_GRAD: ln_input_grad(n, out, in); return DEFT_OK;
    case DEFT_OP_LAYER_NORM_WEIGHT_GRAD: ln_weight_grad(n, out, in); return DEFT_OK;
    default: return deft_set_error(DEFT_ERR_INVALID, "cpu layer_norm: %s is not a layer norm op", deft_op_name(n->op));
    }
}
