/* GPT-2's ops and optimizer groups on a GPU against the CPU, from the same host data:
 *  1. gelu_tanh forward (f32, f64, f16, bf16) and its gradient (f32, f64), within the dtype's tolerance; the fused
 *     elementwise chain holding it gives the unfused kernels' bits (compile option no_fusion);
 *  2. cross_entropy_ex with an ignore index, label smoothing, mean and sum, all targets ignored, over N-D logits, in
 *     f32 and bf16 (and under bf16 autocast): loss and gradient;
 *  3. AdamW and SGD with two parameter groups: the parameters after several steps, through the one-launch step (a
 *     small and a large model), the general path (clipping) and optimizer in backward (pieces).
 * Skips (exit 77) without a GPU; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in (to check the test). */
#include "check.h"
#include "ref.h"
#include "param_groups_net.h"

static deft_device GPU;
static uint64_t rng = 0x6e7a11ull;

typedef deft_tensor *(*gpt_build_fn)(deft_tensor *const *x, const void *ctx);

/* sum(y * w) with fixed weights (so each element's gradient differs), or y itself when it is one element. */
static deft_tensor *weighted_sum(deft_graph *g, deft_tensor *y) {
    const int64_t n = deft_tensor_numel(y);
    if (n == 1) return y;
    int64_t shape[DEFT_MAX_DIMS];
    for (int d = 0; d < deft_tensor_ndim(y); d++) shape[d] = deft_tensor_dim(y, d);
    double *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = sin(0.37 * (double)i + 0.1);
    deft_tensor *wt = deft_constant(g, DEFT_F64, deft_tensor_ndim(y), shape, deft_tensor_device(y), w,
                                    (size_t)n * sizeof *w);
    free(w);
    return deft_sum(deft_mul(y, deft_cast(wt, deft_tensor_dtype(y))), 0, NULL, 0);
}

/* Builds f on dev from the inputs (constants; in[0] a parameter when it is to be differentiated), realises its value
 * (and, with grad, the gradient of sum(value * w) for the first input) as doubles into out (and gout). */
static int build_run(deft_device dev, int nin, const ref_tensor *in, gpt_build_fn f, const void *ctx, int grad,
                     const deft_compile_options *opts, double **out, int64_t *n_out, double **gout) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x[4];
    for (int i = 0; i < nin; i++) {
        const size_t bytes = (size_t)in[i].n * deft_dtype_size(in[i].dt);
        if (i == 0 && grad) {
            x[i] = deft_param(g, "x0", in[i].dt, in[i].ndim, in[i].shape, dev, DEFT_INIT_ZEROS);
            CHECK_OK(deft_param_set(x[i], in[i].raw, bytes));
        } else {
            x[i] = deft_constant(g, in[i].dt, in[i].ndim, in[i].shape, dev, in[i].raw, bytes);
        }
    }
    deft_tensor *y = f(x, ctx);
    deft_tensor *outs[2] = {y, NULL};
    int nouts = 1, ok = y != NULL;
    if (ok && grad) {
        deft_tensor *loss = weighted_sum(g, y);
        CHECK_OK(deft_backward(loss));
        outs[1] = deft_grad(x[0]);
        nouts = 2;
    }
    deft_program *p = ok ? deft_compile(g, outs, nouts, opts) : NULL;
    CHECK_MSG(p != NULL, "compile on %s: %s", dev.type == DEFT_CPU ? "cpu" : "cuda", deft_errmsg());
    if (p) CHECK_OK(deft_program_run(p));
    for (int k = 0; p && k < nouts; k++) {
        const int64_t n = deft_tensor_numel(outs[k]);
        const deft_dtype dt = deft_tensor_dtype(outs[k]);
        void *raw = malloc((size_t)n * deft_dtype_size(dt));
        CHECK_OK(deft_program_read(p, outs[k], raw, (size_t)n * deft_dtype_size(dt)));
        double *v = malloc((size_t)n * sizeof *v);
        for (int64_t i = 0; i < n; i++) v[i] = ref_load(raw, dt, i);
        free(raw);
        if (k == 0) *out = v, *n_out = n;
        else *gout = v;
    }
    deft_program_free(p);
    deft_graph_free(g);
    return p != NULL;
}

/* The case on the CPU and on the GPU; the value (and gradient) within tol (< 0: the dtype's) of each other. */
static void compare(const char *name, int nin, const ref_tensor *in, gpt_build_fn f, const void *ctx, int grad,
                    double tol, const deft_compile_options *gpu_opts) {
    double *want = NULL, *have = NULL, *gwant = NULL, *ghave = NULL;
    int64_t nw = 0, nh = 0;
    const int a = build_run(deft_cpu(), nin, in, f, ctx, grad, NULL, &want, &nw, &gwant);
    const int b = build_run(GPU, nin, in, f, ctx, grad, gpu_opts, &have, &nh, &ghave);
    CHECK_MSG(a && b && nw == nh, "%s: cpu %d, gpu %d, %lld and %lld elements", name, a, b, (long long)nw,
              (long long)nh);
    if (a && b && nw == nh) {
        const double t = tol < 0 ? ref_tol(in[0].dt) : tol;
        ref_close_tol(name, have, want, nw, t);
        if (grad) {
            char what[160];
            snprintf(what, sizeof what, "%.140s: gradient", name);
            ref_close_tol(what, ghave, gwant, in[0].n, t);
        }
    }
    free(want), free(have), free(gwant), free(ghave);
}

/* ---------------------------------------------------------------- gelu_tanh */
static deft_tensor *build_gelu_tanh(deft_tensor *const *x, const void *ctx) {
    (void)ctx;
    return deft_gelu_tanh(x[0]);
}

/* A chain the fusion pass takes: gelu_tanh(x * a + b) * a, and its backward pass. */
static deft_tensor *build_chain(deft_tensor *const *x, const void *ctx) {
    (void)ctx;
    return deft_mul(deft_gelu_tanh(deft_add(deft_mul(x[0], x[1]), x[2])), x[1]);
}

static void test_gelu_tanh(void) {
    static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {33, 1000}, {9, 1001}};
    for (int si = 0; si < 4; si++)
        for (int dt = 0; dt < 4; dt++) {
            ref_tensor x = ref_random(&rng, (deft_dtype)dt, 2, shapes[si], -7, 7);
            char name[96];
            snprintf(name, sizeof name, "gelu_tanh %s [%lld,%lld]", deft_dtype_name((deft_dtype)dt),
                     (long long)shapes[si][0], (long long)shapes[si][1]);
            compare(name, 1, &x, build_gelu_tanh, NULL, dt == DEFT_F32 || dt == DEFT_F64, -1, NULL);
            ref_free(&x);
        }
    /* The fused chain against the same program without fusion, on the GPU: the same bits. */
    const int64_t shape[2] = {64, 1000};
    ref_tensor in[3] = {ref_random(&rng, DEFT_F32, 2, shape, -4, 4), ref_random(&rng, DEFT_F32, 2, shape, 0.5, 1.5),
                        ref_random(&rng, DEFT_F32, 2, shape, -1, 1)};
    double *fused = NULL, *plain = NULL, *gf = NULL, *gp = NULL;
    int64_t nf = 0, np = 0;
    const int a = build_run(GPU, 3, in, build_chain, NULL, 1, NULL, &fused, &nf, &gf);
    const deft_compile_options unfused = {.no_fusion = 1};
    const int b = build_run(GPU, 3, in, build_chain, NULL, 1, &unfused, &plain, &np, &gp);
    if (a && b && nf == np) {
        CHECK_MSG(memcmp(fused, plain, (size_t)nf * sizeof *fused) == 0, "gelu_tanh chain: fused values differ");
        CHECK_MSG(memcmp(gf, gp, (size_t)in[0].n * sizeof *gf) == 0, "gelu_tanh chain: fused gradients differ");
    }
    compare("gelu_tanh chain against the cpu", 3, in, build_chain, NULL, 1, 1e-5, NULL);
    free(fused), free(plain), free(gf), free(gp);
    for (int i = 0; i < 3; i++) ref_free(&in[i]);
}

/* ---------------------------------------------------------------- cross-entropy */
static deft_tensor *build_ce(deft_tensor *const *x, const void *ctx) {
    return deft_cross_entropy_ex(x[0], x[1], ctx);
}

typedef struct ce_gpu_case {
    const char *name;
    deft_cross_entropy_options o;
    int ignore_every;
} ce_gpu_case;

static void test_cross_entropy(void) {
    static const int64_t shapes[][3] = {{1, 7, 13}, {2, 2050, 10}, {3, 1, 50257}, {8, 8, 1000}};
    const ce_gpu_case cases[] = {
        {"defaults, every 3rd ignored", deft_cross_entropy_defaults(), 3},
        {"smoothing 0.1, sum", {.label_smoothing = 0.1, .reduction = DEFT_REDUCTION_SUM}, 0},
        {"ignore 2 (a class), smoothing 0.2",
         {.use_ignore_index = 1, .ignore_index = 2, .label_smoothing = 0.2}, 2},
        {"all ignored", deft_cross_entropy_defaults(), 1},
    };
    for (int si = 0; si < 4; si++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int dt = 0; dt < 4; dt += 3) {   /* f32 and bf16 */
                ref_tensor in[2];
                in[0] = ref_random(&rng, (deft_dtype)dt, 3, shapes[si], -8, 8);
                in[1] = ref_alloc(DEFT_I32, 2, shapes[si]);
                for (int64_t r = 0; r < in[1].n; r++) {
                    double v = (double)(ref_next(&rng) % (uint64_t)shapes[si][2]);
                    if (cases[ci].ignore_every && r % cases[ci].ignore_every == 0) v = cases[ci].o.ignore_index;
                    ref_set(&in[1], r, v);
                }
                char name[160];
                snprintf(name, sizeof name, "cross_entropy_ex %s %s [%lld,%lld,%lld]", cases[ci].name,
                         deft_dtype_name((deft_dtype)dt), (long long)shapes[si][0], (long long)shapes[si][1],
                         (long long)shapes[si][2]);
                if (cases[ci].ignore_every == 1) {
                    /* NaN (mean of nothing) on both, and zero gradients. */
                    double *v = NULL, *gv = NULL;
                    int64_t n = 0;
                    if (build_run(GPU, 2, in, build_ce, &cases[ci].o, 1, NULL, &v, &n, &gv)) {
                        CHECK_MSG(n == 1 && isnan(v[0]), "%s: loss %g, want NaN", name, v[0]);
                        int64_t nonzero = 0;
                        for (int64_t i = 0; i < in[0].n; i++) nonzero += gv[i] != 0.0;
                        CHECK_MSG(nonzero == 0, "%s: %lld gradient elements not zero", name, (long long)nonzero);
                    }
                    free(v), free(gv);
                } else {
                    compare(name, 2, in, build_ce, &cases[ci].o, 1, -1, NULL);
                }
                ref_free(&in[0]);
                ref_free(&in[1]);
            }
}

/* The options survive the autocast rewrite on the GPU as on the CPU: f32 logits from a matmul, bf16 autocast. */
static deft_tensor *build_ce_matmul(deft_tensor *const *x, const void *ctx) {
    return deft_cross_entropy_ex(deft_matmul(x[0], x[1]), x[2], ctx);
}

static void test_cross_entropy_autocast(void) {
    const int64_t xs[2] = {96, 64}, ws[2] = {64, 300}, ts[1] = {96};
    ref_tensor in[3] = {ref_random(&rng, DEFT_F32, 2, xs, -1, 1), ref_random(&rng, DEFT_F32, 2, ws, -1, 1),
                        ref_alloc(DEFT_I32, 1, ts)};
    for (int64_t r = 0; r < 96; r++) ref_set(&in[2], r, r % 5 == 0 ? -100.0 : (double)(ref_next(&rng) % 300));
    const deft_cross_entropy_options o = {.use_ignore_index = 1, .ignore_index = -100, .label_smoothing = 0.1};
    compare("cross_entropy_ex under bf16 autocast", 3, in, build_ce_matmul, &o, 1, 3e-2,
            &(deft_compile_options){.autocast = DEFT_BF16});
    for (int i = 0; i < 3; i++) ref_free(&in[i]);
}

/* ---------------------------------------------------------------- optimizer groups */
static void compare_groups(const char *name, const pg_spec *s, int steps) {
    pg_net c, d;
    const int a = pg_build(&c, s, deft_cpu(), 3), b = pg_build(&d, s, GPU, 3);
    if (a && b) {
        for (int t = 0; t < steps; t++) {
            if (t == 2) {
                CHECK_OK(deft_optimizer_set_lr(c.opt, s->lr * 0.3));
                CHECK_OK(deft_optimizer_set_lr(d.opt, s->lr * 0.3));
            }
            CHECK_OK(deft_program_run(c.prog));
            CHECK_OK(deft_program_run(d.prog));
        }
        int64_t nc = 0, nd = 0;
        float *vc = pg_params(&c, &nc), *vd = pg_params(&d, &nd);
        double worst = 0.0;
        for (int64_t j = 0; j < nc && nc == nd; j++) worst = fmax(worst, fabs((double)vc[j] - vd[j]));
        /* AdamW divides by sqrt(v): on the large model some gradients are near eps, where cuBLAS's and the CPU BLAS's
         * summation orders move an update by a small fraction of lr. A group's decay or rate applied wrongly moves a
         * parameter by about lr (0.05) per step, far outside this tolerance. */
        const double tol = s->adamw && s->in > 64 ? 1e-3 : 2e-5;
        CHECK_MSG(nc == nd && worst < tol, "%s: parameters differ by %g (tolerance %g)", name, worst, tol);
        free(vc), free(vd);
    }
    pg_free(&c);
    pg_free(&d);
}

static void test_groups(void) {
    static const pg_spec small = {.adamw = 1, .groups = 1, .lr = 0.05, .wd = 0.2, .group_wd = 0.0,
                                  .group_lr_scale = 2.5, .in = 6, .hidden = 5, .out = 3, .batch = 8};
    for (int adamw = 0; adamw <= 1; adamw++) {
        pg_spec s = small;
        s.adamw = adamw;
        if (!adamw) s.lr = 0.02, s.wd = 0.05, s.group_wd = 0.5, s.group_lr_scale = 0.25;
        const char *k = adamw ? "adamw" : "sgd";
        char name[96];
        snprintf(name, sizeof name, "%s groups, small model (one-launch step)", k);
        compare_groups(name, &s, 5);
        pg_spec big = s;   /* w1 of 256 x 512 elements: the one-launch step over many blocks */
        big.in = 256, big.hidden = 512, big.out = 8, big.batch = 16;
        snprintf(name, sizeof name, "%s groups, large model", k);
        compare_groups(name, &big, 4);
        pg_spec clip = big;
        clip.step.max_grad_norm = 1e9;
        snprintf(name, sizeof name, "%s groups, general path (clipping)", k);
        compare_groups(name, &clip, 4);
        pg_spec split = big;
        split.copts.optimizer_in_backward = 1;
        snprintf(name, sizeof name, "%s groups, optimizer in backward", k);
        compare_groups(name, &split, 4);
        pg_spec helper = s;
        helper.groups = 2;
        snprintf(name, sizeof name, "%s decay_2d_only", k);
        compare_groups(name, &helper, 4);
    }
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_gelu_tanh();
    test_cross_entropy();
    test_cross_entropy_autocast();
    test_groups();
    return deft_check_finish();
}
