/* The CUDA kernels of the training ops against the CPU backend: comparisons (eq, gt, ge), activation gradients,
 * expand, slice gradients, cross-entropy and its gradient, and dropout, each built twice through the public API
 * (and the builders of the backward pass's own ops, through deft_testing.h), once on the CPU and once on cuda:0,
 * from the same host data. The ops that only move or compare values, and dropout (the same counter-based mask on
 * both), must agree exactly; the others within a tolerance by dtype relative to the largest reference magnitude.
 * Skips (exit 77) where no GPU works. */
#include "cuda_compare.h"
#include "deft_testing.h"

static uint64_t rng = 0xc0da7a11ull;
static int cases_run = 0;

/* One case: the CPU result is the reference (and must exist: every op here has a CPU kernel for every dtype it
 * is given). tol < 0 means the dtype's tolerance. */
static void run_case(const char *name, int nin, const ref_tensor *ins, build_fn f, const void *ctx, double tol) {
    if (compare_case(name, nin, ins, f, ctx, tol, 1)) cases_run++;
}

/* ---------------------------------------------------------------- comparisons */
static deft_tensor *build_compare(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    switch (*(const int *)ctx) {
    case 0: return deft_eq(x[0], x[1]);
    case 1: return deft_gt(x[0], x[1]);
    default: return deft_ge(x[0], x[1]);
    }
}

static void test_compare(void) {
    static const ref_bshape shapes[] = {
        {1, {1}, 1, {1}},        {2, {7, 13}, 2, {7, 13}},   {3, {7, 1, 13}, 2, {5, 1}},
        {1, {1}, 2, {13, 7}},    {2, {33, 1}, 2, {1, 1000}}, {4, {2, 3, 1, 5}, 3, {3, 4, 1}},
    };
    static const char *const names[] = {"eq", "gt", "ge"};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int dt = 0; dt < 5; dt++)
            for (int k = 0; k < 3; k++) {
                ref_tensor in[2];
                in[0] = ref_alloc((deft_dtype)dt, shapes[si].na, shapes[si].a);
                in[1] = ref_alloc((deft_dtype)dt, shapes[si].nb, shapes[si].b);
                /* Few distinct values, so ties are common; NaN and infinities where the dtype has them. */
                for (int j = 0; j < 2; j++)
                    for (int64_t i = 0; i < in[j].n; i++) ref_set(&in[j], i, floor(ref_unif(&rng, -3, 4)) * 0.5);
                if (dt != DEFT_I32 && in[0].n >= 7 && in[1].n >= 7) {
                    ref_set(&in[0], 1, NAN), ref_set(&in[1], 1, NAN);
                    ref_set(&in[0], 3, INFINITY), ref_set(&in[1], 4, -INFINITY);
                }
                char name[96];
                snprintf(name, sizeof name, "%s %s shapes#%zu", names[k], dt_names[dt], si);
                run_case(name, 2, in, build_compare, &k, 0.0);
                ref_free(&in[0]);
                ref_free(&in[1]);
            }
}

/* ---------------------------------------------------------------- activation gradients */
static deft_tensor *build_act_grad(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    return deft_testing_act_grad((const char *)ctx, x[0], x[1]);
}

static void test_act_grad(void) {
    static const char *const acts[] = {"relu", "gelu", "silu", "tanh", "sigmoid"};
    /* [33, 1000] takes the four-element kernel, [9, 1001] it and its tail, the rest the one-element one. */
    static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {33, 1000}, {9, 1001}};
    for (int si = 0; si < 4; si++)
        for (int dt = 0; dt < 4; dt++)
            for (int k = 0; k < 5; k++) {
                ref_tensor in[2];
                in[0] = ref_random(&rng, (deft_dtype)dt, 2, shapes[si], -2, 2);    /* dy */
                in[1] = ref_random(&rng, (deft_dtype)dt, 2, shapes[si], -6, 6);    /* x */
                for (int64_t i = 0; i < in[1].n; i += 9) ref_set(&in[1], i, 0.0);
                char name[96];
                snprintf(name, sizeof name, "act_grad(%s) %s [%lld,%lld]", acts[k], dt_names[dt],
                         (long long)shapes[si][0], (long long)shapes[si][1]);
                run_case(name, 2, in, build_act_grad, acts[k], -1);
                ref_free(&in[0]);
                ref_free(&in[1]);
            }
}

/* ---------------------------------------------------------------- expand */
static deft_tensor *build_expand(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const ref_bshape *c = ctx;
    return deft_expand(x[0], c->nb, c->b);
}

static void test_expand(void) {
    static const ref_bshape cases[] = {
        {1, {1}, 2, {7, 13}},           {1, {13}, 2, {7, 13}},           {2, {7, 1}, 2, {7, 13}},
        {3, {7, 1, 13}, 4, {3, 7, 5, 13}}, {2, {1, 70001}, 2, {3, 70001}}, {3, {33, 1, 1}, 3, {33, 40, 30}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int dt = 0; dt < 5; dt++) {
            ref_tensor in = ref_random(&rng, (deft_dtype)dt, cases[ci].na, cases[ci].a, -100, 100);
            char name[96];
            snprintf(name, sizeof name, "expand %s case#%zu", dt_names[dt], ci);
            run_case(name, 1, &in, build_expand, &cases[ci], 0.0);
            ref_free(&in);
        }
}

/* ---------------------------------------------------------------- slice gradient */
typedef struct slice_case {
    int ndim;
    int64_t shape[3];   /* the sliced tensor's */
    int axis;
    int64_t start, end, step;
} slice_case;

/* x[0] is dy, of the slice's shape; the slice itself is taken of zeros of the case's shape on the device. */
static deft_tensor *build_slice_grad(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    const slice_case *c = ctx;
    deft_tensor *src = deft_zeros(g, deft_tensor_dtype(x[0]), c->ndim, c->shape, dev);
    deft_tensor *s = deft_slice(src, c->axis, c->start, c->end, c->step);
    if (!s || s == src) return NULL;
    return deft_slice_grad(x[0], s);
}

static void test_slice_grad(void) {
    static const slice_case cases[] = {
        {2, {7, 13}, 0, 1, 7, 2},       {2, {7, 13}, 1, -5, 13, 2},     {3, {4, 50, 33}, 1, 3, 50, 7},
        {3, {4, 50, 33}, 2, 0, 33, 4},  {2, {1000, 40}, 0, 5, 1000, 3}, {2, {1, 13}, 1, 3, 9, 1},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int dt = 0; dt < 5; dt++) {
            const slice_case *c = &cases[ci];
            int64_t sshape[3];
            for (int d = 0; d < c->ndim; d++) sshape[d] = c->shape[d];
            const int64_t dim = c->shape[c->axis], start = c->start < 0 ? c->start + dim : c->start;
            sshape[c->axis] = (c->end - start + c->step - 1) / c->step;
            ref_tensor in = ref_random(&rng, (deft_dtype)dt, c->ndim, sshape, -100, 100);
            char name[96];
            snprintf(name, sizeof name, "slice_grad %s case#%zu", dt_names[dt], ci);
            run_case(name, 1, &in, build_slice_grad, c, 0.0);
            ref_free(&in);
        }
}

/* ---------------------------------------------------------------- cross-entropy */
static deft_tensor *build_ce(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev, (void)ctx;
    return deft_cross_entropy(x[0], x[1]);
}

static deft_tensor *build_ce_grad(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)ctx;
    deft_tensor *dloss = deft_full(g, deft_tensor_dtype(x[0]), 0, NULL, dev, 0.75);
    return deft_cross_entropy_grad(dloss, x[0], x[1]);
}

static void test_cross_entropy(void) {
    static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {33, 1000}, {1000, 33}, {4099, 10}, {3, 50257}};
    static const double centres[] = {0.0, 1e4, -1e4};
    for (int si = 0; si < 6; si++)
        for (int ci = 0; ci < 3; ci++)
            for (int dt = 0; dt < 4; dt++) {
                ref_tensor in[2];
                in[0] = ref_random(&rng, (deft_dtype)dt, 2, shapes[si], centres[ci] - 8, centres[ci] + 8);
                in[1] = ref_alloc(DEFT_I32, 1, shapes[si]);
                for (int64_t r = 0; r < in[1].n; r++)
                    ref_set(&in[1], r, (double)(ref_next(&rng) % (uint64_t)shapes[si][1]));
                char name[128];
                snprintf(name, sizeof name, "cross_entropy %s [%lld,%lld] around %g", dt_names[dt],
                         (long long)shapes[si][0], (long long)shapes[si][1], centres[ci]);
                run_case(name, 2, in, build_ce, NULL, -1);
                snprintf(name, sizeof name, "cross_entropy_grad %s [%lld,%lld] around %g", dt_names[dt],
                         (long long)shapes[si][0], (long long)shapes[si][1], centres[ci]);
                run_case(name, 2, in, build_ce_grad, NULL, -1);
                ref_free(&in[0]);
                ref_free(&in[1]);
            }
}

/* A bad target is found on the GPU without a host wait in the run and reported, with the CPU's message, by the next
 * read of an output (mem/device_errors.h); a good run afterwards is not affected. */
static void test_cross_entropy_targets(void) {
    const int64_t shape[2] = {300, 10}, rows = 300;
    float *logits = malloc(3000 * sizeof(float));
    int32_t t[300];
    for (int i = 0; i < 3000; i++) logits[i] = (float)ref_unif(&rng, -1, 1);
    for (int r = 0; r < 300; r++) t[r] = r % 10;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "logits", DEFT_F32, 2, shape, deft_cuda(0));
    deft_tensor *tt = deft_input(g, "targets", DEFT_I32, 1, &rows, deft_cuda(0));
    deft_tensor *l = deft_cross_entropy(x, tt);
    deft_tensor *gr = deft_cross_entropy_grad(deft_full(g, DEFT_F32, 0, NULL, deft_cuda(0), 1.0), x, tt);
    deft_program *pl = deft_compile(g, &l, 1, NULL), *pg = deft_compile(g, &gr, 1, NULL);
    CHECK_MSG(pl && pg, "compile: %s", deft_errmsg());
    if (pl && pg) {
        CHECK_OK(deft_program_feed(pl, x, logits, 3000 * sizeof(float)));
        CHECK_OK(deft_program_feed(pg, x, logits, 3000 * sizeof(float)));
        t[250] = 12, t[201] = -3;
        float bad_loss = 0.0f, *bad_grad = malloc(3000 * sizeof(float));
        CHECK_OK(deft_program_feed(pl, tt, t, sizeof t));
        CHECK_OK(deft_program_run(pl));
        CHECK_ERR(deft_program_read(pl, l, &bad_loss, sizeof bad_loss), DEFT_ERR_INVALID,
                  "cross_entropy: target -3 of row 201 is outside [0, 10)");
        CHECK(isnan(bad_loss));
        CHECK_OK(deft_program_feed(pg, tt, t, sizeof t));
        CHECK_OK(deft_program_run(pg));
        if (bad_grad)
            CHECK_ERR(deft_program_read(pg, gr, bad_grad, 3000 * sizeof(float)), DEFT_ERR_INVALID,
                      "cross_entropy: target -3 of row 201 is outside [0, 10)");
        free(bad_grad);
        t[250] = 0, t[201] = 0;
        CHECK_OK(deft_program_feed(pl, tt, t, sizeof t));
        CHECK_OK(deft_program_run(pl));
        CHECK_OK(deft_program_feed(pg, tt, t, sizeof t));
        CHECK_OK(deft_program_run(pg));
        float loss = NAN;
        CHECK_OK(deft_program_read(pl, l, &loss, sizeof loss));
        CHECK_MSG(isfinite(loss) && loss > 0.0f, "loss after good targets: %g", loss);
    }
    deft_program_free(pl);
    deft_program_free(pg);
    deft_graph_free(g);
    free(logits);
}

/* ---------------------------------------------------------------- dropout */
typedef struct dropout_case {
    double p;
    uint64_t seed;
} dropout_case;

static deft_tensor *build_dropout(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const dropout_case *c = ctx;
    return deft_dropout(x[0], c->p, c->seed);
}

static void test_dropout(void) {
    static const dropout_case cases[] = {{0.5, 1}, {0.3, 42}, {0.9, 0xdeadbeefull}};
    static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {1000, 1000}};
    for (int si = 0; si < 3; si++)
        for (int ci = 0; ci < 3; ci++)
            for (int dt = 0; dt < 4; dt++) {
                ref_tensor in = ref_random(&rng, (deft_dtype)dt, 2, shapes[si], -3, 3);
                char name[96];
                snprintf(name, sizeof name, "dropout(p %g, seed %llu) %s [%lld,%lld]", cases[ci].p,
                         (unsigned long long)cases[ci].seed, dt_names[dt], (long long)shapes[si][0],
                         (long long)shapes[si][1]);
                /* The same mask and the same values: exact. */
                run_case(name, 1, &in, build_dropout, &cases[ci], 0.0);
                ref_free(&in);
            }
}

/* Runs a dropout program `runs` times on dev, keeping each run's output (n floats per run). */
static void dropout_runs(deft_device dev, const float *x, int64_t n, int runs, float *out) {
    deft_graph *g = deft_graph_new();
    deft_tensor *in = deft_input(g, "x", DEFT_F32, 1, &n, dev);
    deft_tensor *y = deft_dropout(in, 0.5, 77);
    deft_program *p = deft_compile(g, &y, 1, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        CHECK_OK(deft_program_feed(p, in, x, (size_t)n * sizeof(float)));
        for (int r = 0; r < runs; r++) {
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, y, out + r * n, (size_t)n * sizeof(float)));
        }
    }
    deft_program_free(p);
    deft_graph_free(g);
}

/* Run after run, the CPU and the GPU draw the same masks. */
static void test_dropout_program(void) {
    enum { N = 4096, RUNS = 3 };
    float x[N], *c = malloc(RUNS * N * sizeof(float)), *gp = malloc(RUNS * N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)ref_unif(&rng, 0.5, 1.5);
    dropout_runs(deft_cpu(), x, N, RUNS, c);
    dropout_runs(deft_cuda(0), x, N, RUNS, gp);
    CHECK_MSG(memcmp(c, gp, RUNS * N * sizeof(float)) == 0, "dropout programs differ between the CPU and cuda:0");
    free(c);
    free(gp);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_compare();
    test_act_grad();
    test_expand();
    test_slice_grad();
    test_cross_entropy();
    test_cross_entropy_targets();
    test_dropout();
    test_dropout_program();
    printf("%d cases compared\n", cases_run);
    return deft_check_finish();
}
