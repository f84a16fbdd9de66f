/* CPU kernels, elementwise: broadcasting binary ops, scalar ops, unary ops and casts on every dtype they support,
 * checked through the public API against a float64 reference on seeded random inputs of awkward shapes. */
#include "ref.h"

static uint64_t rng = 0x5eed0001ull;

/* ---------------------------------------------------------------- binary */
typedef deft_tensor *(*bin_builder)(deft_tensor *, deft_tensor *);
typedef enum { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX } bin_kind;
static const bin_builder bin_builders[] = {deft_add, deft_sub, deft_mul, deft_div, deft_maximum};
static const char *const bin_names[] = {"add", "sub", "mul", "div", "maximum"};

static double bin_want(double x, double y, int k) {
    switch ((bin_kind)k) {
    case B_ADD: return x + y;
    case B_SUB: return x - y;
    case B_MUL: return x * y;
    case B_DIV: return x / y;
    default: return (isnan(x) || isnan(y)) ? NAN : (x > y ? x : y);
    }
}

static const ref_bshape bshapes[] = {
    {1, {1}, 1, {1}},
    {1, {7}, 1, {7}},
    {2, {33, 1000}, 2, {33, 1000}},     /* same shape, large enough to run in parallel */
    {3, {7, 1, 33}, 2, {5, 1}},         /* -> [7, 5, 33] */
    {1, {1}, 2, {33, 7}},               /* scalar-shaped on the left */
    {2, {1000, 33}, 1, {1}},            /* scalar-shaped on the right */
    {2, {40, 1000}, 1, {1000}},         /* row broadcast */
    {2, {1000, 1}, 2, {1, 40}},         /* outer-product shape */
    {4, {2, 3, 4, 5}, 3, {3, 1, 5}},
    {3, {1, 7, 1}, 3, {33, 1, 5}},      /* both sides broadcast */
    {2, {1, 70001}, 2, {3, 1}},         /* long rows cut into segments */
};

/* Values bounded away from 0 so division is well conditioned; i32 stays small so nothing overflows. */
static ref_tensor random_operand(deft_dtype dt, int nd, const int64_t *shape, int away_from_zero) {
    if (dt == DEFT_I32) return ref_random(&rng, dt, nd, shape, -50, 50);
    ref_tensor t = ref_random(&rng, dt, nd, shape, -3.0, 3.0);
    if (away_from_zero)
        for (int64_t i = 0; i < t.n; i++) ref_set(&t, i, (ref_unif(&rng, 0.5, 3.0)) * (ref_next(&rng) & 1 ? 1 : -1));
    return t;
}

static void test_binary(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    for (size_t si = 0; si < sizeof bshapes / sizeof bshapes[0]; si++) {
        const ref_bshape *bs = &bshapes[si];
        for (size_t di = 0; di < 5; di++) {
            const deft_dtype dt = dts[di];
            ref_tensor a = random_operand(dt, bs->na, bs->a, 0);
            ref_tensor b = random_operand(dt, bs->nb, bs->b, 1);
            /* Some ties, so maximum's choice between equal values is exercised too. */
            for (int64_t i = 0; i < a.n && i < b.n; i += 5) ref_set(&a, i, b.v[i]);
            deft_graph *g = deft_graph_new();
            deft_tensor *ta = ref_const(g, &a), *tb = ref_const(g, &b);
            for (int k = 0; k < 5; k++) {
                if (k == B_DIV && dt == DEFT_I32) continue;
                deft_tensor *c = bin_builders[k](ta, tb);
                double *got = ref_realize(c);
                if (!got) continue;
                const int64_t n = deft_tensor_numel(c);
                double *want = ref_binary_want(c, &a, &b, bin_want, k);
                for (int64_t i = 0; i < n; i++) want[i] = ref_round(dt, want[i]);
                char what[160], sa[64], sb[64];
                snprintf(what, sizeof what, "%s %s %s %s", bin_names[k], deft_dtype_name(dt),
                         ref_shape_str(a.ndim, a.shape, sa, sizeof sa), ref_shape_str(b.ndim, b.shape, sb, sizeof sb));
                /* One rounding in float then one to the dtype: at most an ulp or so of the dtype. */
                ref_close(what, dt, got, want, n);
                free(got);
                free(want);
            }
            deft_graph_free(g);
            ref_free(&a);
            ref_free(&b);
        }
    }
}

/* maximum returns NaN when either side is NaN (torch.maximum), also through a broadcast scalar. */
static void test_maximum_nan(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    const double av[] = {1.0, NAN, 3.0, -INFINITY, 0.0, -2.0};
    const double bv[] = {NAN, 2.0, 1.0, 5.0, -0.0, -1.0};
    for (int di = 0; di < 4; di++) {
        const int64_t shape[1] = {6}, one[1] = {1};
        ref_tensor a = ref_alloc(dts[di], 1, shape), b = ref_alloc(dts[di], 1, shape), s = ref_alloc(dts[di], 1, one);
        for (int i = 0; i < 6; i++) ref_set(&a, i, av[i]), ref_set(&b, i, bv[i]);
        ref_set(&s, 0, NAN);
        deft_graph *g = deft_graph_new();
        deft_tensor *ta = ref_const(g, &a), *tb = ref_const(g, &b), *ts = ref_const(g, &s);
        double *m = ref_realize(deft_maximum(ta, tb));
        double *ms = ref_realize(deft_maximum(ts, ta));
        double *mscal = ref_realize(deft_maximum_scalar(ta, NAN));
        if (m && ms && mscal) {
            const double want[] = {NAN, NAN, 3.0, 5.0, 0.0, -1.0};
            ref_close_tol("maximum with NaN", m, want, 6, 0.0);
            for (int i = 0; i < 6; i++) CHECK_MSG(isnan(ms[i]), "maximum(NaN scalar, a)[%d] = %g", i, ms[i]);
            for (int i = 0; i < 6; i++) CHECK_MSG(isnan(mscal[i]), "maximum_scalar(a, NaN)[%d] = %g", i, mscal[i]);
        }
        free(m), free(ms), free(mscal);
        deft_graph_free(g);
        ref_free(&a), ref_free(&b), ref_free(&s);
    }
}

/* ---------------------------------------------------------------- scalar ops */
typedef enum { S_ADD, S_SUB, S_RSUB, S_MUL, S_DIV, S_RDIV, S_MAX, S_POW, S_COUNT } scal_kind;
static const char *const scal_names[] = {"add_scalar", "sub_scalar", "rsub_scalar", "mul_scalar",
                                         "div_scalar", "rdiv_scalar", "maximum_scalar", "pow_scalar"};

static deft_tensor *scal_build(scal_kind k, deft_tensor *a, double s) {
    switch (k) {
    case S_ADD: return deft_add_scalar(a, s);
    case S_SUB: return deft_sub_scalar(a, s);
    case S_RSUB: return deft_rsub_scalar(a, s);
    case S_MUL: return deft_mul_scalar(a, s);
    case S_DIV: return deft_div_scalar(a, s);
    case S_RDIV: return deft_rdiv_scalar(a, s);
    case S_MAX: return deft_maximum_scalar(a, s);
    default: return deft_pow_scalar(a, s);
    }
}

static double scal_ref(scal_kind k, double x, double s) {
    switch (k) {
    case S_ADD: return x + s;
    case S_SUB: return x - s;
    case S_RSUB: return s - x;
    case S_MUL: return x * s;
    case S_DIV: return x / s;
    case S_RDIV: return s / x;
    case S_MAX: return (isnan(x) || isnan(s)) ? NAN : (x > s ? x : s);
    default: return pow(x, s);
    }
}

static void test_scalar(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const int64_t shapes[][2] = {{1, 1}, {1, 7}, {33, 1000}};
    const double scalars[] = {2.0, -1.75, 0.5, 3.0, -0.3};
    for (int di = 0; di < 5; di++) {
        const deft_dtype dt = dts[di];
        for (int si = 0; si < 3; si++) {
            for (int k = 0; k < S_COUNT; k++) {
                const int float_only = k == S_DIV || k == S_RDIV || k == S_POW;
                if (float_only && dt == DEFT_I32) continue;
                for (int ci = 0; ci < 5; ci++) {
                    const double s = scalars[ci];
                    /* pow: a negative base only with an integral exponent; rdiv: away from 0. */
                    ref_tensor a = dt == DEFT_I32 ? ref_random(&rng, dt, 2, shapes[si], -1000, 1000)
                                   : (k == S_POW && s != floor(s)) ? ref_random(&rng, dt, 2, shapes[si], 0.05, 3.0)
                                   : k == S_RDIV ? random_operand(dt, 2, shapes[si], 1)
                                                 : ref_random(&rng, dt, 2, shapes[si], -3.0, 3.0);
                    deft_graph *g = deft_graph_new();
                    double *got = ref_realize(scal_build((scal_kind)k, ref_const(g, &a), s));
                    if (got) {
                        double *want = malloc((size_t)a.n * sizeof(double));
                        for (int64_t i = 0; i < a.n; i++) want[i] = ref_round(dt, scal_ref((scal_kind)k, a.v[i], s));
                        char what[128];
                        snprintf(what, sizeof what, "%s(%g) %s [%lld,%lld]", scal_names[k], s, deft_dtype_name(dt),
                                 (long long)shapes[si][0], (long long)shapes[si][1]);
                        /* The scalar is rounded to float for f32/f16/bf16 (as torch does), hence not exact. */
                        ref_close(what, dt, got, want, a.n);
                        free(want);
                    }
                    free(got);
                    deft_graph_free(g);
                    ref_free(&a);
                }
            }
        }
    }
}

/* i32 scalar ops: integral scalars wrap like integer arithmetic; others compute in double and truncate. */
static void test_scalar_i32_semantics(void) {
    const int64_t shape[1] = {4};
    ref_tensor a = ref_alloc(DEFT_I32, 1, shape);
    const double av[] = {-3, 7, INT32_MAX, -8};
    for (int i = 0; i < 4; i++) ref_set(&a, i, av[i]);
    deft_graph *g = deft_graph_new();
    deft_tensor *ta = ref_const(g, &a);
    double *add = ref_realize(deft_add_scalar(ta, 1.0));
    double *frac = ref_realize(deft_add_scalar(ta, 2.5));
    double *mul = ref_realize(deft_mul_scalar(ta, -2.0));
    if (add && frac && mul) {
        const double want_add[] = {-2, 8, INT32_MIN, -7};          /* INT32_MAX + 1 wraps */
        const double want_frac[] = {0, 9, INT32_MAX, -5};           /* -0.5 -> 0, 9.5 -> 9, saturates, -5.5 -> -5 */
        const double want_mul[] = {6, -14, 2, 16};   /* INT32_MAX * -2 wraps to 2 */
        ref_close_tol("i32 add_scalar(1)", add, want_add, 4, 0.0);
        ref_close_tol("i32 add_scalar(2.5)", frac, want_frac, 4, 0.0);
        ref_close_tol("i32 mul_scalar(-2)", mul, want_mul, 4, 0.0);
    }
    free(add), free(frac), free(mul);
    deft_graph_free(g);
    ref_free(&a);
}

/* ---------------------------------------------------------------- unary */
typedef struct unary_case {
    const char *name;
    deft_tensor *(*build)(deft_tensor *);
    double (*ref)(double);
    double lo, hi;
    int int_ok;
} unary_case;

static double r_neg(double x) { return -x; }
static double r_exp(double x) { return exp(x); }
static double r_log(double x) { return log(x); }
static double r_sqrt(double x) { return sqrt(x); }
static double r_rsqrt(double x) { return 1.0 / sqrt(x); }
static double r_tanh(double x) { return tanh(x); }
static double r_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_relu(double x) { return x > 0 ? x : 0.0; }
static double r_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double r_silu(double x) { return x / (1.0 + exp(-x)); }

static const unary_case unary_cases[] = {
    {"neg", deft_neg, r_neg, -3, 3, 1},
    {"exp", deft_exp, r_exp, -4, 4, 0},
    {"log", deft_log, r_log, 0.01, 100, 0},
    {"sqrt", deft_sqrt, r_sqrt, 0, 100, 0},
    {"rsqrt", deft_rsqrt, r_rsqrt, 0.01, 100, 0},
    {"tanh", deft_tanh, r_tanh, -5, 5, 0},
    {"sigmoid", deft_sigmoid, r_sigmoid, -20, 20, 0},
    {"relu", deft_relu, r_relu, -3, 3, 1},
    {"gelu", deft_gelu, r_gelu, -5, 5, 0},
    {"silu", deft_silu, r_silu, -20, 20, 0},
};

static void test_unary(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    static const int64_t sizes[] = {1, 7, 1000, 33 * 1001};
    for (size_t ci = 0; ci < sizeof unary_cases / sizeof unary_cases[0]; ci++) {
        const unary_case *uc = &unary_cases[ci];
        for (int di = 0; di < 5; di++) {
            const deft_dtype dt = dts[di];
            if (dt == DEFT_I32 && !uc->int_ok) continue;
            for (int si = 0; si < 4; si++) {
                ref_tensor a = dt == DEFT_I32 ? ref_random(&rng, dt, 1, &sizes[si], -100000, 100000)
                                              : ref_random(&rng, dt, 1, &sizes[si], uc->lo, uc->hi);
                deft_graph *g = deft_graph_new();
                double *got = ref_realize(uc->build(ref_const(g, &a)));
                if (got) {
                    double *want = malloc((size_t)a.n * sizeof(double));
                    for (int64_t i = 0; i < a.n; i++) want[i] = ref_round(dt, uc->ref(a.v[i]));
                    char what[96];
                    snprintf(what, sizeof what, "%s %s [%lld]", uc->name, deft_dtype_name(dt), (long long)a.n);
                    ref_close(what, dt, got, want, a.n);
                    free(want);
                }
                free(got);
                deft_graph_free(g);
                ref_free(&a);
            }
        }
    }
}

/* Large arguments: sigmoid and silu must not overflow into NaN, tanh saturates, relu passes NaN. */
static void test_unary_extremes(void) {
    static const deft_dtype dts[] = {DEFT_F32, DEFT_F64};
    const double xv[] = {-1000.0, -100.0, 100.0, 1000.0};
    for (int di = 0; di < 2; di++) {
        const int64_t shape[1] = {4};
        ref_tensor a = ref_alloc(dts[di], 1, shape);
        for (int i = 0; i < 4; i++) ref_set(&a, i, xv[i]);
        deft_graph *g = deft_graph_new();
        deft_tensor *ta = ref_const(g, &a);
        double *sg = ref_realize(deft_sigmoid(ta)), *si = ref_realize(deft_silu(ta));
        double *th = ref_realize(deft_tanh(ta)), *ge = ref_realize(deft_gelu(ta));
        if (sg && si && th && ge) {
            const double want_sg[] = {0.0, r_sigmoid(-100.0), 1.0, 1.0};
            const double want_si[] = {0.0, -100.0 * r_sigmoid(-100.0), 100.0, 1000.0};
            const double want_th[] = {-1.0, -1.0, 1.0, 1.0};
            const double want_ge[] = {0.0, 0.0, 100.0, 1000.0};
            ref_close_tol("sigmoid extremes", sg, want_sg, 4, 1e-6);
            ref_close_tol("silu extremes", si, want_si, 4, 1e-6);
            ref_close_tol("tanh extremes", th, want_th, 4, 0.0);
            ref_close_tol("gelu extremes", ge, want_ge, 4, 0.0);
            CHECK_MSG(sg[1] > 0.0, "sigmoid(-100) underflowed to %g (a float gives 3.7e-44)", sg[1]);
        }
        free(sg), free(si), free(th), free(ge);
        deft_graph_free(g);
        ref_free(&a);

        const int64_t two[1] = {2};
        ref_tensor n = ref_alloc(dts[di], 1, two);
        ref_set(&n, 0, NAN);
        ref_set(&n, 1, -1.0);
        g = deft_graph_new();
        double *r = ref_realize(deft_relu(ref_const(g, &n)));
        if (r) CHECK_MSG(isnan(r[0]) && r[1] == 0.0, "relu(NaN, -1) = (%g, %g)", r[0], r[1]);
        free(r);
        deft_graph_free(g);
        ref_free(&n);
    }
}

/* ---------------------------------------------------------------- casts */
static void test_cast(void) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    const double specials[] = {2.5,    -2.5,    0.7,     -0.7,     1e10, -1e10, NAN, INFINITY, -INFINITY,
                               65519., 65520.,  1e-8,    -0.0,     3e38, 16777217., 2147483647., -2147483648.,
                               -2147483649., 0.1, 1.0 / 3.0, 4096.5};
    const int nspec = (int)(sizeof specials / sizeof specials[0]);
    const int64_t n = 1000 + nspec;
    for (int fi = 0; fi < 5; fi++) {
        const deft_dtype from = dts[fi];
        ref_tensor a = ref_alloc(from, 1, &n);
        for (int64_t i = 0; i < n; i++) {
            double v = i < nspec ? specials[i] : ref_unif(&rng, -300.0, 300.0);
            if (from == DEFT_I32 && i >= nspec) v = floor(ref_unif(&rng, -3e9, 3e9));   /* saturates sometimes */
            ref_set(&a, i, v);
        }
        deft_graph *g = deft_graph_new();
        deft_tensor *ta = ref_const(g, &a);
        for (int ti = 0; ti < 5; ti++) {
            const deft_dtype to = dts[ti];
            deft_tensor *c = deft_cast(ta, to);
            CHECK(c != NULL && deft_tensor_dtype(c) == to);
            double *got = ref_realize(c);
            if (!got) continue;
            double *want = malloc((size_t)n * sizeof(double));
            for (int64_t i = 0; i < n; i++) want[i] = ref_round(to, a.v[i]);
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", deft_dtype_name(from), deft_dtype_name(to));
            /* A cast rounds exactly once (through float for the halves): bit-exact. */
            ref_close_tol(what, got, want, n, 0.0);
            if (to == DEFT_I32 && from != DEFT_I32) {
                CHECK_MSG(got[0] == 2 && got[1] == -2 && got[2] == 0 && got[3] == 0, "%s truncation: %g %g %g %g",
                          what, got[0], got[1], got[2], got[3]);
                CHECK_MSG(got[6] == 0, "%s: NaN gave %g, want 0", what, got[6]);
                CHECK_MSG(got[7] == 2147483647.0 && got[8] == -2147483648.0, "%s: inf gave %g, -inf %g", what,
                          got[7], got[8]);
            }
            free(got);
            free(want);
        }
        deft_graph_free(g);
        ref_free(&a);
    }
    /* Known roundings of the half formats, independent of the reference's own conversions. */
    const int64_t four[1] = {4};
    ref_tensor f = ref_alloc(DEFT_F64, 1, four);
    const double fv[] = {65519.0, 65520.0, 1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0};
    for (int i = 0; i < 4; i++) ref_set(&f, i, fv[i]);
    deft_graph *g = deft_graph_new();
    double *h = ref_realize(deft_cast(ref_const(g, &f), DEFT_F16));
    if (h) {
        const double want[] = {65504.0, INFINITY, 1.0, 1.0 + 4.0 / 2048.0};   /* ties to even */
        ref_close_tol("f64 -> f16 rounding", h, want, 4, 0.0);
    }
    free(h);
    deft_graph_free(g);
    ref_free(&f);
}

/* ---------------------------------------------------------------- compile, feed, run twice */
static void test_program_feed(void) {
    const int64_t xs[2] = {33, 7}, ys[1] = {7};
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, xs, deft_cpu());
    deft_tensor *y = deft_input(g, "y", DEFT_F32, 1, ys, deft_cpu());
    deft_tensor *z = deft_relu(deft_add(deft_mul(x, y), deft_mul_scalar(x, 0.5)));
    CHECK(z != NULL);
    deft_program *p = deft_compile(g, &z, 1, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) {
        deft_graph_free(g);
        return;
    }
    for (int round = 0; round < 2; round++) {
        ref_tensor a = ref_random(&rng, DEFT_F32, 2, xs, -2, 2), b = ref_random(&rng, DEFT_F32, 1, ys, -2, 2);
        CHECK_OK(deft_program_feed(p, x, a.raw, (size_t)a.n * 4));
        CHECK_OK(deft_program_feed(p, y, b.raw, (size_t)b.n * 4));
        CHECK_OK(deft_program_run(p));
        float out[33 * 7];
        CHECK_OK(deft_program_read(p, z, out, sizeof out));
        double got[33 * 7], want[33 * 7];
        for (int i = 0; i < 33 * 7; i++) {
            double v = a.v[i] * b.v[i % 7] + a.v[i] * 0.5;
            want[i] = v > 0 ? v : 0;
            got[i] = out[i];
        }
        ref_close_tol(round ? "fed program, second run" : "fed program, first run", got, want, 33 * 7, 1e-6);
        ref_free(&a), ref_free(&b);
    }
    deft_graph_free(g);
}

int main(void) {
    test_binary();
    test_maximum_nan();
    test_scalar();
    test_scalar_i32_semantics();
    test_unary();
    test_unary_extremes();
    test_cast();
    test_program_feed();
    return deft_check_finish();
}
