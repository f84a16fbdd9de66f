/* CPU kernels, training ops: comparisons (eq, gt, ge), activation gradients, expand, slice gradients,
 * cross-entropy and its gradient, and dropout, checked through the public API (and the builders of the backward
 * pass's own ops, through deft_testing.h) against float64 references on seeded random inputs of awkward shapes and
 * several dtypes. */
#include "deft_testing.h"
#include "ref.h"

static uint64_t rng = 0x7a1e0001ull;

/* Realizes t and compares it with want (n values) at tolerance tol relative to max|want|; frees nothing. */
static void expect_close(const char *what, deft_tensor *t, const double *want, int64_t n, double tol) {
    double *got = ref_realize(t);
    if (!got) {
        fprintf(stderr, "  (while checking %s)\n", what);
        return;
    }
    CHECK_MSG(deft_tensor_numel(t) == n, "%s: %lld elements, want %lld", what, (long long)deft_tensor_numel(t),
              (long long)n);
    if (deft_tensor_numel(t) == n) ref_close_tol(what, got, want, n, tol);
    free(got);
}

/* ---------------------------------------------------------------- comparisons */
static const ref_bshape cmp_shapes[] = {
    {1, {1}, 1, {1}},
    {2, {7, 13}, 2, {7, 13}},
    {3, {7, 1, 13}, 2, {5, 1}},        /* -> [7, 5, 13] */
    {1, {1}, 2, {13, 7}},              /* scalar-shaped on the left */
    {2, {7, 13}, 1, {13}},             /* row broadcast */
    {2, {33, 1}, 2, {1, 1000}},        /* outer product, large enough to run in parallel */
    {4, {2, 3, 1, 5}, 3, {3, 4, 1}},
};

/* eq, gt, ge (k = 0, 1, 2): 1 where true. */
static double compare_want(double x, double y, int k) {
    return (k == 0 ? x == y : k == 1 ? x > y : x >= y) ? 1.0 : 0.0;
}

static void test_compare(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const char *const names[] = {"eq", "gt", "ge"};
    for (size_t si = 0; si < sizeof cmp_shapes / sizeof cmp_shapes[0]; si++) {
        const ref_bshape *bs = &cmp_shapes[si];
        for (int di = 0; di < 5; di++) {
            const deft_dtype dt = dts[di];
            /* Few distinct values, so ties are common; halves hold them exactly. */
            ref_tensor a = ref_alloc(dt, bs->na, bs->a), b = ref_alloc(dt, bs->nb, bs->b);
            for (int64_t i = 0; i < a.n; i++) ref_set(&a, i, floor(ref_unif(&rng, -3, 4)) * 0.5);
            for (int64_t i = 0; i < b.n; i++) ref_set(&b, i, floor(ref_unif(&rng, -3, 4)) * 0.5);
            if (dt != DEFT_I32 && a.n >= 7 && b.n >= 7) {
                ref_set(&a, 1, NAN), ref_set(&b, 1, NAN);     /* NaN == NaN is false */
                ref_set(&a, 3, INFINITY), ref_set(&b, 4, -INFINITY);
            }
            deft_graph *g = deft_graph_new();
            deft_tensor *ta = ref_const(g, &a), *tb = ref_const(g, &b);
            for (int k = 0; k < 3; k++) {
                deft_tensor *c = k == 0 ? deft_eq(ta, tb) : k == 1 ? deft_gt(ta, tb) : deft_ge(ta, tb);
                if (!c) {
                    CHECK_MSG(0, "%s builder failed: %s", names[k], deft_errmsg());
                    continue;
                }
                CHECK(deft_tensor_dtype(c) == dt);
                const int64_t n = deft_tensor_numel(c);
                double *want = ref_binary_want(c, &a, &b, compare_want, k);
                char what[160], sa[64], sb[64];
                snprintf(what, sizeof what, "%s %s %s %s", names[k], deft_dtype_name(dt),
                         ref_shape_str(a.ndim, a.shape, sa, sizeof sa), ref_shape_str(b.ndim, b.shape, sb, sizeof sb));
                expect_close(what, c, want, n, 0.0);
                free(want);
            }
            deft_graph_free(g);
            ref_free(&a);
            ref_free(&b);
        }
    }
}

/* ---------------------------------------------------------------- activation gradients */
#define REF_PI 3.14159265358979323846

static double sigmoid_ref(double x) { return 1.0 / (1.0 + exp(-x)); }

static double act_grad_ref(const char *act, double x) {
    if (!strcmp(act, "relu")) return x > 0 ? 1.0 : 0.0;
    if (!strcmp(act, "gelu")) return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * REF_PI);
    if (!strcmp(act, "silu")) {
        double s = sigmoid_ref(x);
        return s * (1.0 + x * (1.0 - s));
    }
    if (!strcmp(act, "tanh")) return 1.0 - tanh(x) * tanh(x);
    return sigmoid_ref(x) * (1.0 - sigmoid_ref(x));
}

static void test_act_grad(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    static const char *const acts[] = {"relu", "gelu", "silu", "tanh", "sigmoid"};
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 13}, {3, 5, 7}, {2, 33, 1000}};
    for (int si = 0; si < 4; si++)
        for (int di = 0; di < 4; di++) {
            const deft_dtype dt = dts[di];
            ref_tensor x = ref_random(&rng, dt, 3, shapes[si], -4.0, 4.0);
            ref_tensor dy = ref_random(&rng, dt, 3, shapes[si], -2.0, 2.0);
            for (int64_t i = 0; i < x.n; i += 11) ref_set(&x, i, 0.0);   /* relu'(0) = 0 */
            deft_graph *g = deft_graph_new();
            deft_tensor *tx = ref_const(g, &x), *tdy = ref_const(g, &dy);
            for (int k = 0; k < 5; k++) {
                double *want = malloc((size_t)x.n * sizeof(double));
                for (int64_t i = 0; i < x.n; i++) want[i] = ref_round(dt, dy.v[i] * act_grad_ref(acts[k], x.v[i]));
                char what[128];
                snprintf(what, sizeof what, "act_grad(%s) %s [%lld,%lld,%lld]", acts[k],
                         deft_dtype_name(dt), (long long)shapes[si][0], (long long)shapes[si][1],
                         (long long)shapes[si][2]);
                expect_close(what, deft_testing_act_grad(acts[k], tdy, tx), want, x.n, ref_tol(dt));
                free(want);
            }
            deft_graph_free(g);
            ref_free(&x);
            ref_free(&dy);
        }
    /* relu's gradient is exactly dy or 0 (0 at x = 0), whatever the dtype. */
    const int64_t four[1] = {4};
    ref_tensor x = ref_alloc(DEFT_F32, 1, four), dy = ref_alloc(DEFT_F32, 1, four);
    const double xv[] = {-1.0, 0.0, 1e-30, 3.0};
    for (int i = 0; i < 4; i++) ref_set(&x, i, xv[i]), ref_set(&dy, i, 1.5 + i);
    deft_graph *g = deft_graph_new();
    const double want[] = {0.0, 0.0, 3.5, 4.5};
    expect_close("relu grad at 0", deft_testing_act_grad("relu", ref_const(g, &dy), ref_const(g, &x)), want, 4, 0.0);
    deft_graph_free(g);
    ref_free(&x);
    ref_free(&dy);
}

/* ---------------------------------------------------------------- expand */
static void test_expand(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const ref_bshape cases[] = {
        /* a = from, b = to */
        {1, {1}, 2, {7, 13}},
        {1, {13}, 2, {7, 13}},
        {2, {7, 1}, 2, {7, 13}},
        {3, {7, 1, 13}, 4, {3, 7, 5, 13}},
        {2, {1, 13}, 3, {2, 1, 13}},             /* only new leading dims: contiguous copies */
        {2, {1, 70001}, 2, {3, 70001}},          /* long rows, in parallel */
        {3, {33, 1, 1}, 3, {33, 40, 30}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int di = 0; di < 5; di++) {
            const ref_bshape *c = &cases[ci];
            const deft_dtype dt = dts[di];
            ref_tensor a = ref_random(&rng, dt, c->na, c->a, -100, 100);
            deft_graph *g = deft_graph_new();
            deft_tensor *e = deft_expand(ref_const(g, &a), c->nb, c->b);
            CHECK_MSG(e && ref_shape_eq(e, c->nb, c->b), "expand case %zu: wrong shape (%s)", ci, deft_errmsg());
            const int64_t n = ref_numel(c->nb, c->b);
            double *want = malloc((size_t)n * sizeof(double));
            int64_t idx[DEFT_MAX_DIMS];
            for (int64_t i = 0; i < n; i++) {
                ref_unravel(c->nb, c->b, i, idx);
                want[i] = a.v[ref_bcast_offset(a.ndim, a.shape, c->nb, idx)];
            }
            char what[160], sa[64], sb[64];
            snprintf(what, sizeof what, "expand %s %s -> %s", deft_dtype_name(dt),
                     ref_shape_str(c->na, c->a, sa, sizeof sa), ref_shape_str(c->nb, c->b, sb, sizeof sb));
            expect_close(what, e, want, n, 0.0);
            free(want);
            deft_graph_free(g);
            ref_free(&a);
        }
    /* A shape that does not broadcast is refused by the builder. */
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_zeros(g, DEFT_F32, 2, (int64_t[]){3, 4}, deft_cpu());
    CHECK_NULL_ERR(deft_expand(x, 2, (int64_t[]){3, 5}), "does not broadcast");
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- slice gradient */
typedef struct slice_case {
    int ndim;
    int64_t shape[4];
    int axis;
    int64_t start, end, step;
} slice_case;

static void test_slice_grad(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const slice_case cases[] = {
        {2, {7, 13}, 0, 1, 7, 2},
        {2, {7, 13}, 1, 2, 12, 3},
        {2, {7, 13}, 1, -5, 13, 2},          /* negative start */
        {3, {4, 50, 33}, 1, 3, 50, 7},
        {3, {4, 50, 33}, 2, 0, 33, 4},       /* innermost axis */
        {2, {1000, 40}, 0, 5, 1000, 3},      /* in parallel */
        {2, {7, 13}, 0, 2, 5, 1},            /* step 1 (not a view: rows of a 2-D tensor after the first) */
        {2, {1, 13}, 1, 3, 9, 1},            /* a contiguous view slice */
        {1, {13}, 0, 12, 13, 5},             /* a single element */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int di = 0; di < 5; di++) {
            const slice_case *c = &cases[ci];
            const deft_dtype dt = dts[di];
            deft_graph *g = deft_graph_new();
            deft_tensor *x = deft_zeros(g, dt, c->ndim, c->shape, deft_cpu());
            deft_tensor *s = deft_slice(x, c->axis, c->start, c->end, c->step);
            CHECK_MSG(s != NULL && s != x, "slice case %zu: %s", ci, deft_errmsg());
            if (!s || s == x) {
                deft_graph_free(g);
                continue;
            }
            int64_t sshape[4];
            for (int d = 0; d < c->ndim; d++) sshape[d] = deft_tensor_dim(s, d);
            ref_tensor dy = ref_random(&rng, dt, c->ndim, sshape, -100, 100);
            deft_tensor *gr = deft_slice_grad(ref_const(g, &dy), s);
            CHECK_MSG(gr && ref_shape_eq(gr, c->ndim, c->shape), "slice_grad case %zu: wrong shape (%s)", ci,
                      deft_errmsg());
            const int64_t n = ref_numel(c->ndim, c->shape), start = c->start < 0 ? c->start + c->shape[c->axis]
                                                                                   : c->start;
            double *want = calloc((size_t)n, sizeof(double));
            int64_t idx[DEFT_MAX_DIMS];
            for (int64_t i = 0; i < dy.n; i++) {
                ref_unravel(c->ndim, sshape, i, idx);
                idx[c->axis] = start + idx[c->axis] * c->step;
                int64_t off = 0;
                for (int d = 0; d < c->ndim; d++) off = off * c->shape[d] + idx[d];
                want[off] = dy.v[i];
            }
            char what[160], sa[64];
            snprintf(what, sizeof what, "slice_grad %s %s axis %d [%lld:%lld:%lld]", deft_dtype_name(dt),
                     ref_shape_str(c->ndim, c->shape, sa, sizeof sa), c->axis, (long long)c->start,
                     (long long)c->end, (long long)c->step);
            expect_close(what, gr, want, n, 0.0);
            free(want);
            ref_free(&dy);
            deft_graph_free(g);
        }
}

/* ---------------------------------------------------------------- cross-entropy */
/* Loss and gradient (for dloss) of logits v [N, C] and targets t, in double. */
static double ce_ref(const double *v, const int32_t *t, int64_t rows, int64_t c, double dloss, double *grad) {
    double total = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double *x = v + r * c;
        double m = -INFINITY, s = 0.0;
        for (int64_t l = 0; l < c; l++) m = x[l] > m ? x[l] : m;
        for (int64_t l = 0; l < c; l++) s += exp(x[l] - m);
        total += m + log(s) - x[t[r]];
        for (int64_t l = 0; l < c; l++)
            grad[r * c + l] = (exp(x[l] - m) / s - (l == t[r] ? 1.0 : 0.0)) * dloss / (double)rows;
    }
    return total / (double)rows;
}

static void ce_case(deft_dtype dt, int64_t rows, int64_t c, double centre, double spread) {
    const int64_t shape[2] = {rows, c};
    ref_tensor x = ref_random(&rng, dt, 2, shape, centre - spread, centre + spread);
    int32_t *t = malloc((size_t)rows * sizeof(int32_t));
    for (int64_t r = 0; r < rows; r++) t[r] = (int32_t)(ref_next(&rng) % (uint64_t)c);
    const double dloss = 0.75;
    double *grad = malloc((size_t)(rows * c) * sizeof(double));
    double loss = ce_ref(x.v, t, rows, c, dloss, grad);
    for (int64_t i = 0; i < rows * c; i++) grad[i] = ref_round(dt, grad[i]);
    loss = ref_round(dt, loss);

    deft_graph *g = deft_graph_new();
    deft_tensor *tx = ref_const(g, &x);
    deft_tensor *tt = deft_constant(g, DEFT_I32, 1, &rows, deft_cpu(), t, (size_t)rows * sizeof(int32_t));
    deft_tensor *td = deft_full(g, dt, 0, NULL, deft_cpu(), dloss);
    deft_tensor *l = deft_cross_entropy(tx, tt);
    CHECK_MSG(l && deft_tensor_ndim(l) == 0 && deft_tensor_numel(l) == 1 && deft_tensor_dtype(l) == dt,
              "cross_entropy: not a 0-d %s tensor (%s)", deft_dtype_name(dt), deft_errmsg());
    char what[128];
    snprintf(what, sizeof what, "cross_entropy %s [%lld,%lld] around %g", deft_dtype_name(dt), (long long)rows,
             (long long)c, centre);
    double *got = ref_realize(l);
    if (got) {
        CHECK_MSG(isfinite(got[0]), "%s: loss %g is not finite", what, got[0]);
        /* The loss is one value rounded once: within the dtype's tolerance of itself. */
        ref_close_tol(what, got, &loss, 1, ref_tol(dt));
    }
    free(got);
    snprintf(what, sizeof what, "cross_entropy_grad %s [%lld,%lld] around %g", deft_dtype_name(dt),
             (long long)rows, (long long)c, centre);
    expect_close(what, deft_cross_entropy_grad(td, tx, tt), grad, rows * c, ref_tol(dt));
    deft_graph_free(g);
    free(grad);
    free(t);
    ref_free(&x);
}

static void test_cross_entropy(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {1, 1000}, {300, 10}, {33, 1000}, {1000, 33}};
    for (int di = 0; di < 4; di++) {
        for (int si = 0; si < 6; si++) ce_case(dts[di], shapes[si][0], shapes[si][1], 0.0, 5.0);
        /* Huge logits: exp would overflow without the row maximum; the loss must stay finite and exact-ish. */
        ce_case(dts[di], 7, 13, 1e4, 5.0);
        ce_case(dts[di], 33, 100, -1e4, 20.0);
    }
    /* A row whose target holds the one huge logit has a loss of (almost) exactly 0, and a far-off target the gap. */
    const int64_t shape[2] = {2, 3}, two = 2;
    const float lv[] = {1e4f, 0.0f, 0.0f, 0.0f, 1e4f, 0.0f};
    const int32_t tv[] = {0, 0};
    deft_graph *g = deft_graph_new();
    deft_tensor *l = deft_cross_entropy(deft_constant(g, DEFT_F32, 2, shape, deft_cpu(), lv, sizeof lv),
                                        deft_constant(g, DEFT_I32, 1, &two, deft_cpu(), tv, sizeof tv));
    const double want = 1e4 / 2.0;   /* row 0: 0; row 1: 1e4 + log(1 + 2 e^-1e4) - 0 */
    expect_close("cross_entropy of one-hot huge logits", l, &want, 1, 1e-7);
    deft_graph_free(g);
}

/* Targets outside [0, C) fail the run with a message naming the target and the row; the program stays usable. */
static void test_cross_entropy_targets(void) {
    const int64_t shape[2] = {4, 10}, rows = 4;
    float logits[40];
    for (int i = 0; i < 40; i++) logits[i] = (float)ref_unif(&rng, -1, 1);
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "logits", DEFT_F32, 2, shape, deft_cpu());
    deft_tensor *t = deft_input(g, "targets", DEFT_I32, 1, &rows, deft_cpu());
    deft_tensor *l = deft_cross_entropy(x, t);
    deft_tensor *d = deft_full(g, DEFT_F32, 0, NULL, deft_cpu(), 1.0);
    deft_tensor *gr = deft_cross_entropy_grad(d, x, t);
    deft_tensor *outs[2] = {l, gr};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        CHECK_OK(deft_program_feed(p, x, logits, sizeof logits));
        const int32_t bad[4] = {1, 2, 3, 12};
        CHECK_OK(deft_program_feed(p, t, bad, sizeof bad));
        CHECK_ERR(deft_program_run(p), DEFT_ERR_INVALID, "cross_entropy: target 12 of row 3 is outside [0, 10)");
        const int32_t neg[4] = {-1, 0, 0, 0};
        CHECK_OK(deft_program_feed(p, t, neg, sizeof neg));
        CHECK_ERR(deft_program_run(p), DEFT_ERR_INVALID, "target -1 of row 0 is outside [0, 10)");
        const int32_t ok[4] = {0, 9, 5, 3};
        CHECK_OK(deft_program_feed(p, t, ok, sizeof ok));
        CHECK_OK(deft_program_run(p));
        float loss = NAN;
        CHECK_OK(deft_program_read(p, l, &loss, sizeof loss));
        double v[40], grad[40];
        for (int i = 0; i < 40; i++) v[i] = logits[i];
        const double want = ce_ref(v, ok, 4, 10, 1.0, grad);
        CHECK_NEAR(loss, want, 1e-5 * fabs(want));
    }
    deft_program_free(p);
    /* The gradient alone checks its targets too. */
    const int32_t bad2[4] = {0, 10, 0, 0};
    deft_tensor *tc = deft_constant(g, DEFT_I32, 1, &rows, deft_cpu(), bad2, sizeof bad2);
    deft_tensor *xc = deft_constant(g, DEFT_F32, 2, shape, deft_cpu(), logits, sizeof logits);
    float gbuf[40];
    CHECK_ERR(deft_realize(deft_cross_entropy_grad(d, xc, tc), gbuf, sizeof gbuf), DEFT_ERR_INVALID,
              "cross_entropy: target 10 of row 1 is outside [0, 10)");
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- dropout */
/* The value a kept element takes: x times the scale rounded to the compute type, rounded once (through float for
 * the halves, as the kernels compute them). */
static double dropout_kept(deft_dtype dt, double x, double p) {
    const double scale = 1.0 / (1.0 - p);
    if (dt == DEFT_F64) return x * scale;
    return ref_round(dt, ref_round(DEFT_F32, x * (double)(float)scale));
}

static void test_dropout_values(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    static const double ps[] = {0.5, 0.3, 0.9};
    const int64_t shape[2] = {100, 1000};
    for (int di = 0; di < 4; di++)
        for (int pi = 0; pi < 3; pi++) {
            const deft_dtype dt = dts[di];
            const double p = ps[pi];
            /* Nonzero inputs, so a zero in the output is a dropped element. */
            ref_tensor x = ref_random(&rng, dt, 2, shape, 0.5, 2.0);
            for (int64_t i = 0; i < x.n; i += 2) ref_set(&x, i, -x.v[i]);
            deft_graph *g = deft_graph_new();
            double *got = ref_realize(deft_dropout(ref_const(g, &x), p, 1234 + (uint64_t)pi));
            if (got) {
                int64_t kept = 0, bad = 0, worst = -1;
                for (int64_t i = 0; i < x.n; i++) {
                    if (got[i] == 0.0) continue;
                    kept++;
                    if (got[i] != dropout_kept(dt, x.v[i], p)) bad++, worst = i;
                }
                const double frac = (double)kept / (double)x.n;
                /* 100k Bernoulli draws: the standard deviation of the fraction is below 0.0016. */
                CHECK_MSG(fabs(frac - (1.0 - p)) < 0.01, "dropout %s p=%g keeps %.4f, want %.4f", deft_dtype_name(dt),
                          p, frac, 1.0 - p);
                CHECK_MSG(bad == 0, "dropout %s p=%g: %lld kept values are not x/(1-p); e.g. [%lld] %.9g for x %.9g",
                          deft_dtype_name(dt), p, (long long)bad, (long long)worst, worst >= 0 ? got[worst] : 0.0,
                          worst >= 0 ? x.v[worst] : 0.0);
            }
            free(got);
            deft_graph_free(g);
            ref_free(&x);
        }
    /* p = 0.5 scales by exactly 2. */
    const int64_t n1 = 1000;
    ref_tensor x = ref_random(&rng, DEFT_F32, 1, &n1, 1.0, 2.0);
    deft_graph *g = deft_graph_new();
    double *got = ref_realize(deft_dropout(ref_const(g, &x), 0.5, 99));
    if (got)
        for (int64_t i = 0; i < n1; i++)
            if (got[i] != 0.0 && got[i] != 2.0 * x.v[i]) {
                CHECK_MSG(0, "dropout p=0.5 [%lld]: %.9g for x %.9g", (long long)i, got[i], x.v[i]);
                break;
            }
    free(got);
    deft_graph_free(g);
    ref_free(&x);
}

/* Positions where one output is zero and the other is not. */
static int64_t mask_diff(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += (a[i] == 0.0f) != (b[i] == 0.0f);
    return d;
}

static void test_dropout_runs(void) {
    enum { N = 20000 };
    const int64_t n = N;
    const double p = 0.4;
    float *xv = malloc(N * sizeof(float)), *a1 = malloc(N * sizeof(float)), *a2 = malloc(N * sizeof(float));
    float *b1 = malloc(N * sizeof(float)), *c1 = malloc(N * sizeof(float)), *o1 = malloc(N * sizeof(float));
    float *r1 = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) xv[i] = (float)ref_unif(&rng, 0.5, 1.5);
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, &n, deft_cpu());
    /* a and b: two nodes with one seed (two readers of one mask); c: the mask read again through another op;
     * o: another seed. */
    deft_tensor *a = deft_dropout(x, p, 7), *b = deft_dropout(x, p, 7), *o = deft_dropout(x, p, 8);
    deft_tensor *c = deft_mul_scalar(a, 3.0);
    deft_tensor *outs[4] = {a, b, c, o};
    deft_program *prog = deft_compile(g, outs, 4, NULL);
    CHECK_MSG(prog != NULL, "compile: %s", deft_errmsg());
    if (prog) {
        CHECK_OK(deft_program_feed(prog, x, xv, N * sizeof(float)));
        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, a, a1, N * sizeof(float)));
        CHECK_OK(deft_program_read(prog, b, b1, N * sizeof(float)));
        CHECK_OK(deft_program_read(prog, c, c1, N * sizeof(float)));
        CHECK_OK(deft_program_read(prog, o, o1, N * sizeof(float)));
        CHECK_OK(deft_program_read(prog, a, r1, N * sizeof(float)));
        CHECK_MSG(memcmp(a1, r1, N * sizeof(float)) == 0, "reading one output twice gave two values");
        CHECK_MSG(memcmp(a1, b1, N * sizeof(float)) == 0, "two dropouts with one seed differ within a run");
        int64_t off = 0;
        for (int i = 0; i < N; i++) off += c1[i] != 3.0f * a1[i];
        CHECK_MSG(off == 0, "%lld elements of 3 * dropout differ from the dropout read beside them", (long long)off);
        /* Independent masks differ in about 2 p (1 - p) of the places. */
        const int64_t dseed = mask_diff(a1, o1, n);
        CHECK_MSG(fabs((double)dseed / N - 2 * p * (1 - p)) < 0.03, "seeds 7 and 8 differ in %lld of %d places",
                  (long long)dseed, N);

        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, a, a2, N * sizeof(float)));
        CHECK_OK(deft_program_read(prog, b, b1, N * sizeof(float)));
        const int64_t drun = mask_diff(a1, a2, n);
        CHECK_MSG(fabs((double)drun / N - 2 * p * (1 - p)) < 0.03,
                  "two runs of one program: masks differ in %lld of %d places (want a new mask each run)",
                  (long long)drun, N);
        CHECK_MSG(memcmp(a2, b1, N * sizeof(float)) == 0, "two dropouts with one seed differ in the second run");
    }
    deft_program_free(prog);
    deft_graph_free(g);
    free(xv), free(a1), free(a2), free(b1), free(c1), free(o1), free(r1);
}

int main(void) {
    test_compare();
    test_act_grad();
    test_expand();
    test_slice_grad();
    test_cross_entropy();
    test_cross_entropy_targets();
    test_dropout_values();
    test_dropout_runs();
    return deft_check_finish();
}
