/* GPT-2's ops on the CPU:
 *  1. deft_gelu_tanh (torch's approximate='tanh') against the formula in double, in every float dtype, and its
 *     gradient against the derivative and finite differences; it is not the erf form;
 *  2. deft_cross_entropy_ex (ignore index, label smoothing, mean or sum, N-D logits) against a plain reference (log
 *     softmax by hand in double), its gradient against the reference's and finite differences; all targets ignored
 *     gives NaN (mean) or 0 (sum) and a zero gradient; NULL options are deft_cross_entropy bit for bit;
 *  3. under bf16 autocast the options carry over (an ignored target is not an error, the smoothing stays);
 *  4. bad options, shapes and dtypes are refused at build time without adding a node; a target outside [0, C) that
 *     is not the ignore index fails the run. */
#include "check.h"
#include "ref.h"
#include "grad_check.h"

static uint64_t rng = 0x9e7a2ull;

/* deft_realize of t into a malloc'd double array (t is f64). */
static double *realize_f64(deft_tensor *t) {
    const int64_t n = deft_tensor_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    CHECK_OK(deft_realize(t, v, (size_t)n * sizeof *v));
    return v;
}

/* ---------------------------------------------------------------- gelu, tanh form */
static double ref_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}
static double ref_dgelu_tanh(double x) {
    const double k = sqrt(2.0 / 3.14159265358979323846), u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_gelu_tanh_values(void) {
    enum { N = 301 };
    double xs[N], want[N];
    for (int i = 0; i < N; i++) xs[i] = -7.5 + 0.05 * i;
    for (int dt = 0; dt < 4; dt++) {
        deft_graph *g = deft_graph_new();
        ref_tensor in = ref_alloc((deft_dtype)dt, 1, (const int64_t[]){N});
        for (int i = 0; i < N; i++) ref_set(&in, i, xs[i]);
        for (int i = 0; i < N; i++) want[i] = ref_gelu_tanh(in.v[i]);
        deft_tensor *x = deft_constant(g, (deft_dtype)dt, 1, in.shape, deft_cpu(), in.raw,
                                       (size_t)in.n * deft_dtype_size((deft_dtype)dt));
        deft_tensor *y = deft_cast(deft_gelu_tanh(x), DEFT_F64);
        double *got = realize_f64(y);
        char what[64];
        snprintf(what, sizeof what, "gelu_tanh %s", deft_dtype_name((deft_dtype)dt));
        ref_close_tol(what, got, want, N, ref_tol((deft_dtype)dt));
        if (dt == DEFT_F64) {
            /* The tanh form is not the erf form: at x = -3 they differ by about 4e-4. */
            double *erf_form = realize_f64(deft_gelu(x));
            CHECK_MSG(fabs(erf_form[90] - got[90]) > 1e-4, "gelu_tanh(-3) = %g equals gelu's %g", got[90],
                      erf_form[90]);
            free(erf_form);
        }
        free(got);
        ref_free(&in);
        deft_graph_free(g);
    }
}

static void test_gelu_tanh_grad(void) {
    /* The backward pass's own kernel against the derivative in double... */
    enum { N = 201 };
    deft_graph *g = deft_graph_new();
    const int64_t shape[1] = {N};
    double x[N], dy[N], want[N];
    for (int i = 0; i < N; i++) {
        x[i] = -6.0 + 0.06 * i;
        dy[i] = ref_unif(&rng, -2, 2);
        want[i] = dy[i] * ref_dgelu_tanh(x[i]);
    }
    deft_tensor *p = deft_param(g, "p", DEFT_F64, 1, shape, deft_cpu(), DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(p, x, sizeof x));
    deft_tensor *w = deft_constant(g, DEFT_F64, 1, shape, deft_cpu(), dy, sizeof dy);
    deft_tensor *loss = deft_sum(deft_mul(deft_gelu_tanh(p), w), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    double *got = realize_f64(deft_grad(p));
    ref_close_tol("gelu_tanh gradient", got, want, N, 1e-12);
    free(got);
    deft_graph_free(g);
    /* ...and against finite differences. */
    g = deft_graph_new();
    deft_tensor *q = grad_check_param(g, &rng, 0, 2, (const int64_t[]){7, 9}, -4, 4);
    grad_check_case("gelu_tanh", g, &rng, deft_gelu_tanh(q), &q, 1, NULL, NULL, 0, 1e-6);
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- cross-entropy */
/* torch.nn.functional.cross_entropy in double, by hand: the loss and d loss / d x. */
static double ref_ce(const double *x, const int32_t *t, int64_t n, int64_t c, const deft_cross_entropy_options *o,
                     double *grad) {
    const double ls = o ? o->label_smoothing : 0.0;
    double total = 0.0;
    int64_t count = 0;
    for (int64_t r = 0; r < n; r++)
        if (!(o && o->use_ignore_index && t[r] == o->ignore_index)) count++;
    const int sum = o && o->reduction == DEFT_REDUCTION_SUM;
    for (int64_t r = 0; r < n; r++) {
        const double *xr = x + r * c;
        const int ignored = o && o->use_ignore_index && t[r] == o->ignore_index;
        double mx = -INFINITY, s = 0.0, mean_logp = 0.0;
        for (int64_t k = 0; k < c; k++) mx = fmax(mx, xr[k]);
        for (int64_t k = 0; k < c; k++) s += exp(xr[k] - mx);
        const double lse = mx + log(s);
        for (int64_t k = 0; k < c; k++) mean_logp += (xr[k] - lse) / (double)c;
        if (!ignored) total += (1.0 - ls) * -(xr[t[r]] - lse) + ls * -mean_logp;
        const double scale = sum ? 1.0 : 1.0 / (double)count;
        for (int64_t k = 0; k < c; k++) {
            const double target = (1.0 - ls) * (k == t[r] ? 1.0 : 0.0) + ls / (double)c;
            grad[r * c + k] = ignored ? 0.0 : (exp(xr[k] - lse) - target) * scale;
        }
    }
    return sum ? total : total / (double)count;
}

typedef struct ce_case {
    const char *name;
    int use_options;
    deft_cross_entropy_options o;
    int ignore_every;          /* every k-th target is set to the ignore index (0: none) */
} ce_case;

/* logits [2, 3, C] f64 (a parameter) and targets [2, 3]. */
static void run_ce_case(const ce_case *cc) {
    enum { B = 2, T = 3, C = 5, N = B * T };
    double x[N * C], grad_want[N * C];
    int32_t t[N];
    for (int i = 0; i < N * C; i++) x[i] = ref_unif(&rng, -3, 3);
    for (int r = 0; r < N; r++) {
        t[r] = (int32_t)(ref_next(&rng) % C);
        if (cc->ignore_every && r % cc->ignore_every == 0) t[r] = cc->o.ignore_index;
    }
    const deft_cross_entropy_options *o = cc->use_options ? &cc->o : NULL;
    const double loss_want = ref_ce(x, t, N, C, o, grad_want);
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_param(g, "logits", DEFT_F64, 3, (const int64_t[]){B, T, C}, deft_cpu(), DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(p, x, sizeof x));
    deft_tensor *tt = deft_constant(g, DEFT_I32, 2, (const int64_t[]){B, T}, deft_cpu(), t, sizeof t);
    deft_tensor *loss = deft_cross_entropy_ex(p, tt, o);
    CHECK_MSG(loss && deft_tensor_ndim(loss) == 0, "%s: not a 0-d loss: %s", cc->name, deft_errmsg());
    if (!loss) {
        deft_graph_free(g);
        return;
    }
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[2] = {loss, deft_grad(p)};
    deft_program *prog = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(prog != NULL, "%s: compile: %s", cc->name, deft_errmsg());
    if (prog) {
        double l = NAN, grad[N * C];
        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, loss, &l, sizeof l));
        CHECK_OK(deft_program_read(prog, outs[1], grad, sizeof grad));
        if (isnan(loss_want)) CHECK_MSG(isnan(l), "%s: loss %g, want NaN", cc->name, l);
        else CHECK_MSG(fabs(l - loss_want) <= 1e-12 * fmax(1.0, fabs(loss_want)), "%s: loss %.17g, want %.17g",
                       cc->name, l, loss_want);
        char what[96];
        snprintf(what, sizeof what, "%s: gradient", cc->name);
        ref_close_tol(what, grad, grad_want, N * C, 1e-12);
    }
    deft_program_free(prog);
    deft_graph_free(g);
    /* Finite differences, where the loss is a number. */
    if (!isnan(loss_want)) {
        g = deft_graph_new();
        deft_tensor *q = grad_check_param(g, &rng, 0, 3, (const int64_t[]){B, T, C}, -3, 3);
        deft_tensor *tq = deft_constant(g, DEFT_I32, 2, (const int64_t[]){B, T}, deft_cpu(), t, sizeof t);
        char what[96];
        snprintf(what, sizeof what, "%s: finite differences", cc->name);
        grad_check_case(what, g, &rng, deft_cross_entropy_ex(q, tq, o), &q, 1, NULL, NULL, 0, 1e-6);
        deft_graph_free(g);
    }
}

static void test_cross_entropy_cases(void) {
    deft_cross_entropy_options d = deft_cross_entropy_defaults();
    CHECK(d.use_ignore_index == 1 && d.ignore_index == -100 && d.label_smoothing == 0.0 &&
          d.reduction == DEFT_REDUCTION_MEAN);
    const ce_case cases[] = {
        {"plain (NULL options)", 0, {0}, 0},
        {"torch defaults, -100 ignored", 1, d, 2},
        {"ignore index 3 (a class)", 1, {.use_ignore_index = 1, .ignore_index = 3}, 3},
        {"label smoothing 0.1", 1, {.label_smoothing = 0.1}, 0},
        {"smoothing 0.25, ignore -1, sum", 1,
         {.use_ignore_index = 1, .ignore_index = -1, .label_smoothing = 0.25, .reduction = DEFT_REDUCTION_SUM}, 2},
        {"smoothing 0.3, ignore -100, mean", 1, {.use_ignore_index = 1, .ignore_index = -100, .label_smoothing = 0.3},
         3},
        {"all ignored, mean", 1, d, 1},
        {"all ignored, sum", 1, {.use_ignore_index = 1, .ignore_index = -100, .reduction = DEFT_REDUCTION_SUM}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_ce_case(&cases[i]);
}

/* NULL options are deft_cross_entropy, bit for bit, for the loss and its gradient, in f32. */
static void test_cross_entropy_null_is_plain(void) {
    enum { N = 37, C = 11 };
    float x[N * C];
    int32_t t[N];
    for (int i = 0; i < N * C; i++) x[i] = (float)ref_unif(&rng, -5, 5);
    for (int r = 0; r < N; r++) t[r] = (int32_t)(ref_next(&rng) % C);
    float l[2], gr[2][N * C];
    for (int k = 0; k < 2; k++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *p = deft_param(g, "x", DEFT_F32, 2, (const int64_t[]){N, C}, deft_cpu(), DEFT_INIT_ZEROS);
        CHECK_OK(deft_param_set(p, x, sizeof x));
        deft_tensor *tt = deft_constant(g, DEFT_I32, 1, (const int64_t[]){N}, deft_cpu(), t, sizeof t);
        deft_tensor *loss = k ? deft_cross_entropy_ex(p, tt, NULL) : deft_cross_entropy(p, tt);
        CHECK_OK(deft_backward(loss));
        CHECK_OK(deft_realize(loss, &l[k], sizeof l[k]));
        CHECK_OK(deft_realize(deft_grad(p), gr[k], sizeof gr[k]));
        deft_graph_free(g);
    }
    CHECK(memcmp(&l[0], &l[1], sizeof l[0]) == 0);
    CHECK(memcmp(gr[0], gr[1], sizeof gr[0]) == 0);
}

/* Under bf16 autocast the loss node is rebuilt: its options must come with it. */
static void test_cross_entropy_autocast(void) {
    enum { N = 24, K = 16, C = 9 };
    float xv[N * K], wv[K * C];
    int32_t t[N];
    for (int i = 0; i < N * K; i++) xv[i] = (float)ref_unif(&rng, -1, 1);
    for (int i = 0; i < K * C; i++) wv[i] = (float)ref_unif(&rng, -1, 1);
    for (int r = 0; r < N; r++) t[r] = r % 4 == 0 ? -100 : (int32_t)(ref_next(&rng) % C);
    const deft_cross_entropy_options o = {.use_ignore_index = 1, .ignore_index = -100, .label_smoothing = 0.2};
    float loss[2] = {NAN, NAN}, grad[2][K * C];
    for (int k = 0; k < 2; k++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *x = deft_constant(g, DEFT_F32, 2, (const int64_t[]){N, K}, deft_cpu(), xv, sizeof xv);
        deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (const int64_t[]){K, C}, deft_cpu(), DEFT_INIT_ZEROS);
        CHECK_OK(deft_param_set(w, wv, sizeof wv));
        deft_tensor *tt = deft_constant(g, DEFT_I32, 1, (const int64_t[]){N}, deft_cpu(), t, sizeof t);
        deft_tensor *l = deft_cross_entropy_ex(deft_matmul(x, w), tt, &o);
        CHECK_OK(deft_backward(l));
        deft_tensor *outs[2] = {l, deft_grad(w)};
        deft_program *p = deft_compile(g, outs, 2, &(deft_compile_options){.autocast = k ? DEFT_BF16 : DEFT_F32});
        CHECK_MSG(p != NULL, "compile (autocast %d): %s", k, deft_errmsg());
        if (p) {
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, l, &loss[k], sizeof loss[k]));
            CHECK_OK(deft_program_read(p, outs[1], grad[k], sizeof grad[k]));
        }
        deft_program_free(p);
        deft_graph_free(g);
    }
    CHECK_MSG(fabs(loss[1] - loss[0]) < 2e-2 * fabs(loss[0]), "bf16 loss %g against f32 %g", loss[1], loss[0]);
    double worst = 0.0, big = 0.0;
    for (int i = 0; i < K * C; i++) {
        worst = fmax(worst, fabs((double)grad[1][i] - grad[0][i]));
        big = fmax(big, fabs((double)grad[0][i]));
    }
    CHECK_MSG(worst < 3e-2 * big, "bf16 gradient off by %g (largest %g)", worst, big);
    /* Without the smoothing and the ignore index the f32 loss is another number: the options did act. */
    float plain = NAN;
    deft_graph *g = deft_graph_new();
    for (int r = 0; r < N; r++)
        if (t[r] < 0) t[r] = 0;
    deft_tensor *x = deft_constant(g, DEFT_F32, 2, (const int64_t[]){N, K}, deft_cpu(), xv, sizeof xv);
    deft_tensor *w = deft_constant(g, DEFT_F32, 2, (const int64_t[]){K, C}, deft_cpu(), wv, sizeof wv);
    deft_tensor *tt = deft_constant(g, DEFT_I32, 1, (const int64_t[]){N}, deft_cpu(), t, sizeof t);
    CHECK_OK(deft_realize(deft_cross_entropy(deft_matmul(x, w), tt), &plain, sizeof plain));
    CHECK_MSG(fabs(plain - loss[0]) > 1e-3, "the options changed nothing: %g and %g", plain, loss[0]);
    deft_graph_free(g);
}

static void test_cross_entropy_errors(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 3, (const int64_t[]){2, 3, 5}, deft_cpu());
    deft_tensor *t = deft_input(g, "t", DEFT_I32, 2, (const int64_t[]){2, 3}, deft_cpu());
    deft_tensor *t_bad = deft_input(g, "tb", DEFT_I32, 2, (const int64_t[]){2, 4}, deft_cpu());
    deft_tensor *t_f = deft_input(g, "tf", DEFT_F32, 2, (const int64_t[]){2, 3}, deft_cpu());
    const int before = deft_graph_node_count(g);
    CHECK_NULL_ERR(deft_cross_entropy_ex(x, t, &(deft_cross_entropy_options){.label_smoothing = 1.0}),
                   "label_smoothing 1 is not in [0, 1)");
    CHECK_NULL_ERR(deft_cross_entropy_ex(x, t, &(deft_cross_entropy_options){.label_smoothing = -0.1}),
                   "not in [0, 1)");
    CHECK_NULL_ERR(deft_cross_entropy_ex(x, t, &(deft_cross_entropy_options){.label_smoothing = NAN}),
                   "not in [0, 1)");
    CHECK_NULL_ERR(deft_cross_entropy_ex(x, t, &(deft_cross_entropy_options){.reduction = (deft_reduction)7}),
                   "unknown reduction 7");
    CHECK_NULL_ERR(deft_cross_entropy_ex(x, t_bad, NULL), "logits [2, 3, 5] and targets [2, 4]");
    CHECK_NULL_ERR(deft_cross_entropy_ex(x, t_f, NULL), "targets must be i32");
    CHECK_MSG(deft_graph_node_count(g) == before, "refused calls added %d nodes", deft_graph_node_count(g) - before);
    deft_graph_free(g);

    /* A target outside [0, C) that is not the ignore index fails the run; -100 without the ignore index too. */
    const deft_cross_entropy_options d = deft_cross_entropy_defaults();
    for (int k = 0; k < 2; k++) {
        g = deft_graph_new();
        float xv[4 * 5] = {0};
        const int32_t tv[4] = {1, -100, 7, 2}, tn[4] = {1, -100, 4, 2};
        deft_tensor *xc = deft_constant(g, DEFT_F32, 2, (const int64_t[]){4, 5}, deft_cpu(), xv, sizeof xv);
        deft_tensor *tc = deft_constant(g, DEFT_I32, 1, (const int64_t[]){4}, deft_cpu(), k ? tn : tv, sizeof tv);
        float l = 0.0f;
        if (k == 0)
            CHECK_ERR(deft_realize(deft_cross_entropy_ex(xc, tc, &d), &l, sizeof l), DEFT_ERR_INVALID,
                      "target 7 of row 2 is outside [0, 5)");
        else
            CHECK_ERR(deft_realize(deft_cross_entropy(xc, tc), &l, sizeof l), DEFT_ERR_INVALID,
                      "target -100 of row 1 is outside [0, 5)");
        deft_graph_free(g);
    }
}

int main(void) {
    test_gelu_tanh_values();
    test_gelu_tanh_grad();
    test_cross_entropy_cases();
    test_cross_entropy_null_is_plain();
    test_cross_entropy_autocast();
    test_cross_entropy_errors();
    return deft_check_finish();
}
