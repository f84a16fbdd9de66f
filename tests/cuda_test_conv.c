/* The image ops on cuda:0 against the CPU backend: conv2d (cuDNN) and its input and weight gradients, max, average
 * and adaptive average pooling and their gradients, and batch norm (training with the running statistics' update,
 * evaluation, and batch statistics only) with its gradients, on random inputs in both layouts, over awkward sizes,
 * strides, padding, dilation and groups, in f32, f64, f16 and bf16 (halves are checked against the CPU run in f32
 * on the same rounded values; batch norm's halves keep f32 statistics and parameters). The fast batch-norm and
 * pooling kernels against the plain ones, over odd sizes: tests/cuda_test_norm_pool.c. Then a small conv net trained a few
 * steps on the CPU and on the GPU must give the same losses and weights, and the GPU program replayed as a CUDA
 * Graph must give what it gives eagerly. Skips (exit 77) where no GPU works. */
#include "deft_testing.h"
#include "cuda_compare.h"

#define CPU deft_cpu()
#define GPU deft_cuda(0)

static uint64_t rng = 0x5eedc0de2dull;
static const deft_dtype dtypes[] = {DEFT_F32, DEFT_F64, DEFT_F16, DEFT_BF16};

static int is_half(deft_dtype dt) { return dt == DEFT_F16 || dt == DEFT_BF16; }

/* The CPU runs halves in f32: its graph takes the (rounded) values up to f32 and the result back down. */
static deft_tensor *up(deft_device dev, deft_tensor *t) {
    return t && dev.type == DEFT_CPU && is_half(deft_tensor_dtype(t)) ? deft_to(t, dev, DEFT_F32) : t;
}

static deft_tensor *down(deft_device dev, deft_tensor *t, deft_dtype dt) {
    return t && dev.type == DEFT_CPU && deft_tensor_dtype(t) != dt ? deft_to(t, dev, dt) : t;
}

/* Tolerances relative to the largest reference magnitude: cuDNN's algorithms (Winograd, FFT, split reductions) sum
 * in other orders than im2col; halves round the result once. */
static double conv_tol(deft_dtype dt) {
    switch (dt) {
    case DEFT_F64: return 1e-10;
    case DEFT_F32: return 1e-4;
    case DEFT_F16: return 4e-3;
    default: return 2e-2;
    }
}

/* Stored 4-d shape of logical [a, b, c, d] (N, C, H, W or O, C/g, KH, KW) in a layout. */
static void stored4(int nhwc, int64_t a, int64_t b, int64_t c, int64_t d, int64_t *s) {
    if (nhwc) s[0] = a, s[1] = c, s[2] = d, s[3] = b;
    else s[0] = a, s[1] = b, s[2] = c, s[3] = d;
}

/* ---------------------------------------------------------------- conv2d */
typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
    int bias;
} conv_case;

typedef struct conv_ctx {
    const conv_case *k;
    int nhwc, op;   /* op 0: forward, 1: input gradient, 2: weight gradient */
    deft_dtype dt;
} conv_ctx;

static int64_t out_len(int64_t len, int64_t pad, int64_t k, int64_t dil, int64_t stride) {
    return (len + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* Sources: x, w[, b], dy. */
static deft_tensor *build_conv(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g;
    const conv_ctx *c = ctx;
    const conv_case *k = c->k;
    const deft_conv2d_options o = {.stride = {k->sh, k->sw}, .padding = {k->ph, k->pw}, .dilation = {k->dh, k->dw},
                                   .groups = k->groups, .layout = c->nhwc ? DEFT_NHWC : DEFT_NCHW};
    deft_tensor *y = deft_conv2d(up(dev, x[0]), up(dev, x[1]), k->bias ? up(dev, x[2]) : NULL, &o);
    if (!y || c->op == 0) return down(dev, y, c->dt);
    deft_tensor *dy = up(dev, x[k->bias ? 3 : 2]);
    return down(dev, c->op == 1 ? deft_conv2d_input_grad(dy, y) : deft_conv2d_weight_grad(dy, y), c->dt);
}

static void conv_one(const conv_case *k, int nhwc, deft_dtype dt, int op) {
    const int64_t oh = out_len(k->h, k->ph, k->kh, k->dh, k->sh), ow = out_len(k->w, k->pw, k->kw, k->dw, k->sw);
    int64_t xs[4], ws[4], ys[4];
    stored4(nhwc, k->n, k->c, k->h, k->w, xs);
    stored4(nhwc, k->o, k->c / k->groups, k->kh, k->kw, ws);
    stored4(nhwc, k->n, k->o, oh, ow, ys);
    ref_tensor in[4];
    int nin = 0;
    in[nin++] = ref_random(&rng, dt, 4, xs, -1.0, 1.0);
    in[nin++] = ref_random(&rng, dt, 4, ws, -1.0, 1.0);
    if (k->bias) in[nin++] = ref_random(&rng, dt, 1, &k->o, -1.0, 1.0);
    in[nin++] = ref_random(&rng, dt, 4, ys, -1.0, 1.0);
    const conv_ctx ctx = {k, nhwc, op, dt};
    char name[160];
    snprintf(name, sizeof name, "conv2d%s %s %s x[%lld,%lld,%lld,%lld] o%lld k%lldx%lld s%lld,%lld p%lld,%lld "
             "d%lld,%lld g%lld", op == 0 ? "" : op == 1 ? " dx" : " dw", dt_names[dt], nhwc ? "NHWC" : "NCHW",
             (long long)k->n, (long long)k->c, (long long)k->h, (long long)k->w, (long long)k->o, (long long)k->kh,
             (long long)k->kw, (long long)k->sh, (long long)k->sw, (long long)k->ph, (long long)k->pw,
             (long long)k->dh, (long long)k->dw, (long long)k->groups);
    compare_case(name, nin, in, build_conv, &ctx, conv_tol(dt), 1);
    for (int i = 0; i < nin; i++) ref_free(&in[i]);
}

static const conv_case conv_cases[] = {
    /* n  c   h   w   o  kh kw sh sw ph pw dh dw  g bias */
    {2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},       /* 3x3 "same" */
    {3, 4, 10, 11, 6, 3, 2, 2, 1, 1, 0, 1, 1, 2, 1},     /* strides and padding per axis, 2 groups */
    {2, 6, 13, 12, 6, 3, 3, 1, 1, 2, 2, 2, 2, 3, 0},     /* dilation 2, 3 groups */
    {1, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 8, 0},       /* depthwise, stride 2 */
    {4, 16, 8, 8, 32, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1},     /* 1x1 */
    {2, 3, 17, 15, 5, 5, 5, 3, 2, 2, 1, 1, 2, 1, 1},     /* odd sizes, mixed stride and dilation */
    {2, 3, 32, 32, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1, 0},    /* a ResNet stem */
};

static void test_conv(void) {
    const int ncases = (int)(sizeof conv_cases / sizeof conv_cases[0]);
    for (int i = 0; i < ncases; i++)
        for (int nhwc = 0; nhwc < 2; nhwc++)
            for (int d = 0; d < 4; d++)
                for (int op = 0; op < 3; op++) {
                    /* cuDNN has no f64 NHWC convolution; test_conv_f64_nhwc checks that it says so */
                    if (nhwc && dtypes[d] == DEFT_F64) continue;
                    conv_one(&conv_cases[i], nhwc, dtypes[d], op);
                }
}

/* f64 in NHWC either runs and agrees with the CPU, or fails with a message that names the op: never garbage. */
static void test_conv_f64_nhwc(void) {
    const conv_case *k = &conv_cases[0];
    int64_t xs[4], ws[4];
    stored4(1, k->n, k->c, k->h, k->w, xs);
    stored4(1, k->o, k->c, k->kh, k->kw, ws);
    ref_tensor x = ref_random(&rng, DEFT_F64, 4, xs, -1, 1), w = ref_random(&rng, DEFT_F64, 4, ws, -1, 1);
    deft_graph *g = deft_graph_new();
    const deft_conv2d_options o = {.padding = {1, 1}, .layout = DEFT_NHWC};
    deft_tensor *y = deft_conv2d(deft_constant(g, DEFT_F64, 4, xs, GPU, x.raw, (size_t)x.n * 8),
                                 deft_constant(g, DEFT_F64, 4, ws, GPU, w.raw, (size_t)w.n * 8), NULL, &o);
    CHECK_MSG(y != NULL, "builds: %s", deft_errmsg());
    double *got = y ? malloc(deft_tensor_nbytes(y)) : NULL;
    deft_status s = y ? deft_realize(y, got, deft_tensor_nbytes(y)) : DEFT_ERR_INVALID;
    if (s != DEFT_OK) {
        CHECK_MSG(strstr(deft_errmsg(), "conv2d") != NULL, "f64 NHWC fails without naming the op: %s",
                  deft_errmsg());
        printf("f64 NHWC conv2d on cuda:0: %s\n", deft_errmsg());
    } else {
        const ref_tensor in[2] = {x, w};
        const conv_ctx ctx = {k, 1, 0, DEFT_F64};
        compare_case("conv2d f64 NHWC", 2, in, build_conv, &ctx, conv_tol(DEFT_F64), 1);
    }
    free(got);
    deft_graph_free(g);
    ref_free(&x);
    ref_free(&w);
}

/* The gradients of an f64 NHWC convolution: cuDNN has no algorithm for either, so a program that needs one is
 * refused when compiled, with the reason, and the graph stays usable: its forward pass compiles and runs. */
static void test_conv_f64_nhwc_grads(void) {
    const conv_case *k = &conv_cases[0];
    int64_t xs[4], ws[4];
    stored4(1, k->n, k->c, k->h, k->w, xs);
    stored4(1, k->o, k->c, k->kh, k->kw, ws);
    deft_graph *g = deft_graph_new();
    const deft_conv2d_options o = {.padding = {1, 1}, .layout = DEFT_NHWC};
    deft_tensor *x = deft_param(g, "x", DEFT_F64, 4, xs, GPU, DEFT_INIT_UNIFORM);
    deft_tensor *w = deft_param(g, "w", DEFT_F64, 4, ws, GPU, DEFT_INIT_UNIFORM);
    deft_tensor *loss = deft_sum(deft_conv2d(x, w, NULL, &o), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    const char *grads[2] = {"conv2d_input_grad", "conv2d_weight_grad"};
    deft_tensor *of[2] = {x, w};
    for (int i = 0; i < 2; i++) {
        CHECK(deft_compile(g, (deft_tensor *[]){loss, deft_grad(of[i])}, 2, NULL) == NULL);
        CHECK_MSG(strstr(deft_errmsg(), "gradients of an f64 NHWC convolution") != NULL &&
                      strstr(deft_errmsg(), grads[i]) != NULL,
                  "%s refused at compile: %s", grads[i], deft_errmsg());
    }
    CHECK_MSG(deft_graph_error(g) == DEFT_OK, "a refused compile leaves the graph as it was");
    deft_program *p = deft_compile(g, &loss, 1, NULL);
    CHECK_MSG(p != NULL, "the forward pass alone compiles: %s", deft_errmsg());
    if (p) CHECK_MSG(deft_program_run(p) == DEFT_OK, "and runs: %s", deft_errmsg());
    deft_graph_free(g);
}

/* An op whose operands sit on two devices is refused when built, naming both. */
static void test_conv_mixed_devices(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_full(g, DEFT_F32, 4, (int64_t[]){1, 2, 5, 5}, GPU, 1.0);
    deft_tensor *w = deft_full(g, DEFT_F32, 4, (int64_t[]){3, 2, 3, 3}, CPU, 1.0);
    CHECK_NULL_ERR(deft_conv2d(x, w, NULL, NULL), "cuda:0");
    CHECK_MSG(strstr(deft_errmsg(), "cpu") != NULL, "names both devices: %s", deft_errmsg());
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- pooling */
typedef struct pool_case {
    int kind;   /* 0: max, 1: avg, 2: adaptive avg */
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;   /* adaptive: kh, kw are the output size */
    int exclude_pad;
} pool_case;

typedef struct pool_ctx {
    const pool_case *k;
    int nhwc, grad;
    deft_dtype dt;
} pool_ctx;

static deft_tensor *build_pool(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g;
    const pool_ctx *c = ctx;
    const pool_case *k = c->k;
    const deft_layout layout = c->nhwc ? DEFT_NHWC : DEFT_NCHW;
    const deft_pool2d_options o = {.kernel = {k->kh, k->kw}, .stride = {k->sh, k->sw}, .padding = {k->ph, k->pw},
                                   .exclude_pad = k->exclude_pad, .layout = layout};
    deft_tensor *xi = up(dev, x[0]), *y;
    if (k->kind == 0) y = deft_max_pool2d(xi, &o);
    else if (k->kind == 1) y = deft_avg_pool2d(xi, &o);
    else y = deft_adaptive_avg_pool2d(xi, k->kh, k->kw, layout);
    if (!y || !c->grad) return down(dev, y, c->dt);
    return down(dev, deft_pool2d_grad(up(dev, x[1]), y), c->dt);
}

static void pool_one(const pool_case *k, int nhwc, deft_dtype dt, int grad) {
    const int64_t oh = k->kind == 2 ? k->kh : (k->h + 2 * k->ph - k->kh) / k->sh + 1;
    const int64_t ow = k->kind == 2 ? k->kw : (k->w + 2 * k->pw - k->kw) / k->sw + 1;
    int64_t xs[4], ys[4];
    stored4(nhwc, k->n, k->c, k->h, k->w, xs);
    stored4(nhwc, k->n, k->c, oh, ow, ys);
    ref_tensor in[2] = {ref_alloc(dt, 4, xs), ref_random(&rng, dt, 4, ys, -1.0, 1.0)};
    /* few distinct values, so windows hold ties (the gradient goes to the first maximum), and a NaN */
    for (int64_t i = 0; i < in[0].n; i++) ref_set(&in[0], i, floor(ref_unif(&rng, -2.0, 3.0)) * 0.5);
    if (k->kind == 0) ref_set(&in[0], 5, NAN);
    const pool_ctx ctx = {k, nhwc, grad, dt};
    static const char *const kinds[] = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"};
    char name[160];
    snprintf(name, sizeof name, "%s%s %s %s x[%lld,%lld,%lld,%lld] k%lldx%lld s%lld,%lld p%lld,%lld%s",
             kinds[k->kind], grad ? " grad" : "", dt_names[dt], nhwc ? "NHWC" : "NCHW", (long long)k->n,
             (long long)k->c, (long long)k->h, (long long)k->w, (long long)k->kh, (long long)k->kw,
             (long long)k->sh, (long long)k->sw, (long long)k->ph, (long long)k->pw,
             k->exclude_pad ? " exclude_pad" : "");
    /* max pooling picks values and adds gradients in the CPU's order: exact */
    const double tol = k->kind == 0 ? 0.0 : ref_tol(dt);
    compare_case(name, grad ? 2 : 1, in, build_pool, &ctx, tol, 1);
    ref_free(&in[0]);
    ref_free(&in[1]);
}

static void test_pool(void) {
    static const pool_case cases[] = {
        {0, 2, 3, 9, 11, 3, 3, 2, 2, 1, 1, 0},   /* ResNet's max pool, odd sizes */
        {0, 2, 4, 8, 7, 2, 2, 2, 2, 0, 0, 0},
        {0, 1, 5, 6, 7, 3, 2, 1, 2, 1, 1, 0},    /* overlapping windows along H */
        {1, 2, 3, 9, 11, 3, 3, 2, 2, 1, 1, 0},   /* count_include_pad */
        {1, 2, 3, 9, 11, 3, 3, 2, 2, 1, 1, 1},   /* exclude_pad */
        {1, 3, 2, 7, 6, 2, 3, 1, 1, 0, 1, 0},
        {2, 2, 5, 7, 7, 1, 1, 0, 0, 0, 0, 0},    /* global average */
        {2, 2, 3, 7, 5, 3, 2, 0, 0, 0, 0, 0},    /* uneven windows */
        {2, 1, 4, 3, 3, 4, 4, 0, 0, 0, 0, 0},    /* more outputs than inputs: windows overlap */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int nhwc = 0; nhwc < 2; nhwc++)
            for (int d = 0; d < 4; d++)
                for (int grad = 0; grad < 2; grad++) pool_one(&cases[i], nhwc, dtypes[d], grad);
}

/* ---------------------------------------------------------------- batch norm */
typedef struct bn_case {
    int ndim;
    int64_t shape[4];   /* logical: [N, C, ...] */
} bn_case;

/* mode 0: training with running statistics, weight and bias (momentum 0.3); 1: evaluation on them; 2: batch
 * statistics only, no weight or bias. */
typedef struct bn_result {
    double *y, *dx, *dw, *db, *rm, *rv;
} bn_result;

static double *param_doubles(deft_tensor *p, deft_dtype dt, int64_t n) {
    void *raw = malloc((size_t)n * deft_dtype_size(dt) + 8);
    CHECK_OK(deft_param_get(p, raw, (size_t)n * deft_dtype_size(dt)));
    double *v = to_doubles(raw, dt, n);
    free(raw);
    return v;
}

static double *read_doubles(deft_program *p, deft_tensor *t) {
    const deft_dtype dt = deft_tensor_dtype(t);
    const int64_t n = deft_tensor_numel(t);
    void *raw = calloc((size_t)n + 1, deft_dtype_size(dt));
    CHECK_OK(deft_program_read(p, t, raw, (size_t)n * deft_dtype_size(dt)));
    double *v = to_doubles(raw, dt, n);
    free(raw);
    return v;
}

/* A parameter on dev holding t's values, in dt (f32 for halves on the CPU). */
static deft_tensor *param_of(deft_graph *g, const char *name, const ref_tensor *t, deft_device dev, deft_dtype dt) {
    deft_tensor *p = deft_param(g, name, dt, t->ndim, t->shape, dev, DEFT_INIT_ZEROS);
    void *raw = calloc((size_t)t->n + 1, deft_dtype_size(dt));
    for (int64_t i = 0; i < t->n; i++) ref_store(raw, dt, i, t->v[i]);
    CHECK_OK(deft_param_set(p, raw, (size_t)t->n * deft_dtype_size(dt)));
    free(raw);
    return p;
}

/* in: x, dy, weight, bias, running_mean, running_var. */
static bn_result bn_run(deft_device dev, const ref_tensor *in, int layout, int mode) {
    bn_result r = {0};
    const deft_dtype dt = dev.type == DEFT_CPU && is_half(in[0].dt) ? DEFT_F32 : in[0].dt;
    const deft_dtype pdt = is_half(dt) ? DEFT_F32 : dt;   /* halves take f32 parameters (torch's cuDNN contract) */
    deft_graph *g = deft_graph_new();
    deft_tensor *x = param_of(g, "x", &in[0], dev, dt), *w = NULL, *b = NULL, *rm = NULL, *rv = NULL;
    deft_tensor *dy = deft_to(ref_const(g, &in[1]), dev, dt);
    if (mode != 2) {
        w = param_of(g, "w", &in[2], dev, pdt), b = param_of(g, "b", &in[3], dev, pdt);
        rm = param_of(g, "rm", &in[4], dev, pdt), rv = param_of(g, "rv", &in[5], dev, pdt);
        CHECK_OK(deft_param_set_requires_grad(rm, 0));
        CHECK_OK(deft_param_set_requires_grad(rv, 0));
    }
    deft_batch_norm_options o = deft_batch_norm_defaults();
    o.eval = mode == 1, o.momentum = 0.3, o.layout = (deft_layout)layout;
    deft_tensor *y = deft_batch_norm(x, w, b, rm, rv, &o);
    CHECK_MSG(y != NULL, "batch_norm: %s", deft_errmsg());
    CHECK_OK(deft_backward(deft_sum(deft_mul(y, dy), 0, NULL, 0)));
    deft_tensor *outs[4] = {y, deft_grad(x), w ? deft_grad(w) : NULL, b ? deft_grad(b) : NULL};
    const int nout = w ? 4 : 2;
    deft_program *p = deft_compile(g, outs, nout, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p && deft_program_run(p) == DEFT_OK) {
        r.y = read_doubles(p, y), r.dx = read_doubles(p, outs[1]);
        if (w) r.dw = read_doubles(p, outs[2]), r.db = read_doubles(p, outs[3]);
        if (rm) r.rm = param_doubles(rm, pdt, in[4].n), r.rv = param_doubles(rv, pdt, in[5].n);
    } else {
        CHECK_MSG(0, "batch norm on %s failed: %s", dev.type == DEFT_CPU ? "cpu" : "cuda:0", deft_errmsg());
    }
    deft_graph_free(g);
    return r;
}

static void bn_free(bn_result *r) {
    free(r->y), free(r->dx), free(r->dw), free(r->db), free(r->rm), free(r->rv);
}

static void bn_compare(const char *name, const char *what, const double *got, const double *want, int64_t n,
                       double tol) {
    if (!got || !want) return;   /* the run's failure is already a failed check */
    char label[200];
    snprintf(label, sizeof label, "%s %s", name, what);
    ref_close_tol(label, got, want, n, tol);
}

static void bn_one(const bn_case *k, int layout, deft_dtype dt, int mode) {
    int64_t shape[4];
    memcpy(shape, k->shape, sizeof shape);
    if (layout == DEFT_NHWC && k->ndim == 4) stored4(1, k->shape[0], k->shape[1], k->shape[2], k->shape[3], shape);
    const int64_t C = k->shape[1];
    const deft_dtype pdt = is_half(dt) ? DEFT_F32 : dt;
    ref_tensor in[6] = {ref_random(&rng, dt, k->ndim, shape, -2.0, 3.0), ref_random(&rng, dt, k->ndim, shape, -1, 1),
                        ref_random(&rng, pdt, 1, &C, 0.5, 1.5),          ref_random(&rng, pdt, 1, &C, -0.5, 0.5),
                        ref_random(&rng, pdt, 1, &C, -0.2, 0.2),         ref_random(&rng, pdt, 1, &C, 0.5, 2.0)};
    bn_result want = bn_run(CPU, in, layout, mode), got = bn_run(GPU, in, layout, mode);
    char name[160];
    snprintf(name, sizeof name, "batch_norm %s %s %s rank %d C %lld", mode == 0 ? "train" : mode == 1 ? "eval" : "batch",
             dt_names[dt], layout == DEFT_NHWC ? "NHWC" : "NCHW", k->ndim, (long long)C);
    const double tol = ref_tol(dt) * (dt == DEFT_F32 ? 10.0 : 1.0);   /* dx subtracts sums of the batch */
    bn_compare(name, "y", got.y, want.y, in[0].n, tol);
    /* dx is what is left of dy once its batch sums are taken out: with few values per channel (2 of them below)
     * that remainder is far smaller than dy, so its error is measured against dy's scale when that is larger. */
    double dy_scale = 0, dx_scale = 0;
    for (int64_t i = 0; i < in[1].n; i++) dy_scale = fmax(dy_scale, fabs(in[1].v[i]));
    for (int64_t i = 0; want.dx && i < in[0].n; i++) dx_scale = fmax(dx_scale, fabs(want.dx[i]));
    const double dx_tol = dx_scale > 0 && dy_scale > dx_scale ? tol * dy_scale / dx_scale : tol;
    bn_compare(name, "dx", got.dx, want.dx, in[0].n, dx_tol);
    bn_compare(name, "dweight", got.dw, want.dw, C, tol);
    bn_compare(name, "dbias", got.db, want.db, C, tol);
    bn_compare(name, "running_mean", got.rm, want.rm, C, tol);
    bn_compare(name, "running_var", got.rv, want.rv, C, tol);
    bn_free(&want), bn_free(&got);
    for (int i = 0; i < 6; i++) ref_free(&in[i]);
}

static void test_batch_norm(void) {
    static const bn_case cases[] = {
        {4, {4, 3, 5, 7}}, {4, {2, 16, 1, 1}}, {2, {8, 5, 0, 0}}, {4, {3, 7, 2, 9}}, {4, {16, 64, 8, 8}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int layout = 0; layout < 2; layout++)
            for (int d = 0; d < 4; d++)   /* halves with f32 statistics and parameters */
                for (int mode = 0; mode < 3; mode++) bn_one(&cases[i], layout, dtypes[d], mode);
}

/* ---------------------------------------------------------------- a conv net, trained */
enum { NET_B = 16, NET_S = 12, NET_CLASSES = 4, NET_STEPS = 6 };

/* The net's parameters, in the order of net_names: host values shared by every run. */
#define NET_PARAMS 12
typedef struct net_init {
    ref_tensor t[NET_PARAMS];
} net_init;

static const char *const net_names[NET_PARAMS] = {"conv1.w", "conv1.b", "bn1.w", "bn1.b",  "bn1.rm", "bn1.rv",
                                                  "conv2.w", "bn2.w",   "bn2.b", "bn2.rm", "bn2.rv", "fc.w"};

static net_init net_make_init(int nhwc) {
    net_init in;
    int64_t w1[4], w2[4];
    stored4(nhwc, 8, 3, 3, 3, w1);
    stored4(nhwc, 16, 4, 3, 3, w2);   /* 2 groups over 8 channels */
    const int64_t c8 = 8, c16 = 16, fc[2] = {16, NET_CLASSES};
    in.t[0] = ref_random(&rng, DEFT_F32, 4, w1, -0.3, 0.3), in.t[1] = ref_random(&rng, DEFT_F32, 1, &c8, -0.1, 0.1);
    in.t[2] = ref_random(&rng, DEFT_F32, 1, &c8, 0.9, 1.1), in.t[3] = ref_random(&rng, DEFT_F32, 1, &c8, -0.1, 0.1);
    in.t[4] = ref_random(&rng, DEFT_F32, 1, &c8, 0.0, 0.0), in.t[5] = ref_random(&rng, DEFT_F32, 1, &c8, 1.0, 1.0);
    in.t[6] = ref_random(&rng, DEFT_F32, 4, w2, -0.2, 0.2), in.t[7] = ref_random(&rng, DEFT_F32, 1, &c16, 0.9, 1.1);
    in.t[8] = ref_random(&rng, DEFT_F32, 1, &c16, -0.1, 0.1), in.t[9] = ref_random(&rng, DEFT_F32, 1, &c16, 0, 0);
    in.t[10] = ref_random(&rng, DEFT_F32, 1, &c16, 1.0, 1.0);
    in.t[11] = ref_random(&rng, DEFT_F32, 2, fc, -0.4, 0.4);
    return in;
}

static void net_free_init(net_init *in) {
    for (int i = 0; i < NET_PARAMS; i++) ref_free(&in->t[i]);
}

/* conv(8, 3x3, pad 1, bias) -> bn -> relu -> max pool 3x3/2 pad 1 -> conv(16, 3x3, dilation 2, 2 groups) -> bn ->
 * relu -> avg pool 2x2 -> adaptive avg pool 1x1 -> linear -> cross-entropy. Every parameter lands in p. */
static deft_tensor *net_loss(deft_graph *g, const net_init *in, deft_device dev, int nhwc, deft_tensor *x,
                             deft_tensor *y, deft_tensor **p) {
    const deft_layout L = nhwc ? DEFT_NHWC : DEFT_NCHW;
    for (int i = 0; i < NET_PARAMS; i++) p[i] = param_of(g, net_names[i], &in->t[i], dev, DEFT_F32);
    const int stats[4] = {4, 5, 9, 10};
    for (int i = 0; i < 4; i++) CHECK_OK(deft_param_set_requires_grad(p[stats[i]], 0));
    deft_batch_norm_options bo = deft_batch_norm_defaults();
    bo.layout = L;
    deft_tensor *h = deft_conv2d(x, p[0], p[1], &(deft_conv2d_options){.padding = {1, 1}, .layout = L});
    h = deft_relu(deft_batch_norm(h, p[2], p[3], p[4], p[5], &bo));
    h = deft_max_pool2d(h, &(deft_pool2d_options){.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .layout = L});
    h = deft_conv2d(h, p[6], NULL,
                    &(deft_conv2d_options){.padding = {2, 2}, .dilation = {2, 2}, .groups = 2, .layout = L});
    h = deft_relu(deft_batch_norm(h, p[7], p[8], p[9], p[10], &bo));
    h = deft_avg_pool2d(h, &(deft_pool2d_options){.kernel = {2, 2}, .layout = L});
    h = deft_adaptive_avg_pool2d(h, 1, 1, L);
    return deft_cross_entropy(deft_matmul(deft_reshape(h, 2, (int64_t[]){NET_B, 16}), p[11]), y);
}

/* What a training run gives: the loss of each step and every parameter after the last. */
typedef struct net_run {
    float loss[NET_STEPS];
    double *params[NET_PARAMS];
    int64_t replays;
} net_run;

/* NET_STEPS steps of SGD with momentum on dev from the same parameters and batches. */
static net_run net_train(const net_init *in, deft_device dev, int nhwc, int no_cuda_graphs) {
    net_run r;
    memset(&r, 0, sizeof r);
    deft_graph *g = deft_graph_new();
    int64_t xs[4];
    stored4(nhwc, NET_B, 3, NET_S, NET_S, xs);
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, xs, dev);
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){NET_B}, dev);
    deft_tensor *p[NET_PARAMS];
    deft_tensor *loss = net_loss(g, in, dev, nhwc, x, y, p);
    CHECK_MSG(loss != NULL, "net: %s", deft_errmsg());
    CHECK_OK(deft_backward(loss));
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, NULL);
    deft_tensor *outs[2] = {loss, deft_optimizer_step(opt)};
    deft_program *prog = deft_compile(g, outs, 2, &(deft_compile_options){.no_cuda_graphs = no_cuda_graphs});
    CHECK_MSG(prog != NULL, "compile: %s", deft_errmsg());
    uint64_t data_rng = 0xba7c4ull;   /* the same batches for every run */
    static float xb[NET_B * 3 * NET_S * NET_S];
    int32_t yb[NET_B];
    for (int s = 0; prog && s < NET_STEPS; s++) {
        for (int i = 0; i < NET_B * 3 * NET_S * NET_S; i++) xb[i] = (float)ref_unif(&data_rng, -1.0, 1.0);
        for (int i = 0; i < NET_B; i++) yb[i] = (int32_t)(ref_next(&data_rng) % NET_CLASSES);
        CHECK_OK(deft_program_feed(prog, x, xb, sizeof xb));
        CHECK_OK(deft_program_feed(prog, y, yb, sizeof yb));
        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, loss, &r.loss[s], sizeof(float)));
    }
    for (int i = 0; prog && i < NET_PARAMS; i++) r.params[i] = param_doubles(p[i], DEFT_F32, in->t[i].n);
    r.replays = prog ? deft_program_graph_replays(prog) : 0;
    if (prog && dev.type == DEFT_CUDA)
        printf("conv net %s on cuda:0 (%s): %s\n", nhwc ? "NHWC" : "NCHW", no_cuda_graphs ? "eager" : "graphs",
               deft_program_graph_status(prog));
    deft_graph_free(g);
    return r;
}

static void net_free_run(net_run *r) {
    for (int i = 0; i < NET_PARAMS; i++) free(r->params[i]);
}

static void net_compare(const char *what, const net_run *got, const net_run *want, const net_init *in,
                        double tol) {
    char label[128];
    for (int s = 0; s < NET_STEPS; s++) {
        const double a = got->loss[s], b = want->loss[s];
        CHECK_MSG(isfinite(a) && fabs(a - b) <= tol * fmax(1.0, fabs(b)), "%s: step %d loss %.7g vs %.7g", what, s,
                  a, b);
    }
    for (int i = 0; i < NET_PARAMS; i++) {
        if (!got->params[i] || !want->params[i]) continue;   /* a failed run is already a failed check */
        snprintf(label, sizeof label, "%s: %s after %d steps", what, net_names[i], NET_STEPS);
        ref_close_tol(label, got->params[i], want->params[i], in->t[i].n, tol);
    }
}

/* CPU against GPU (eager), and the GPU's CUDA Graph replays against its eager runs, in both layouts. */
static void test_conv_net(void) {
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        net_init in = net_make_init(nhwc);
        net_run cpu = net_train(&in, CPU, nhwc, 1), eager = net_train(&in, GPU, nhwc, 1);
        net_run graphs = net_train(&in, GPU, nhwc, 0);
        net_compare(nhwc ? "NHWC cuda vs cpu" : "NCHW cuda vs cpu", &eager, &cpu, &in, 1e-3);
        /* the same kernels and algorithms, captured: only cuDNN's nondeterministic reductions may differ */
        net_compare(nhwc ? "NHWC graphs vs eager" : "NCHW graphs vs eager", &graphs, &eager, &in, 1e-5);
        CHECK_MSG(graphs.replays >= NET_STEPS - 2, "%s: %lld of %d steps were CUDA Graph replays",
                  nhwc ? "NHWC" : "NCHW", (long long)graphs.replays, NET_STEPS);
        net_free_run(&cpu), net_free_run(&eager), net_free_run(&graphs);
        net_free_init(&in);
    }
}

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_util.h"

/* Runs node n (its inputs already on the device) on a stream that is capturing into a CUDA Graph, then replays the
 * graph; the result is read back into host (bytes). */
static void run_captured(const deft_tensor *n, void *out, const void *const *in, void *host, size_t bytes) {
    cudaStream_t st;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    const deft_status s = deft_cuda_run_node(n, out, in, st, 0);
    CHECK_MSG(s == DEFT_OK, "%s inside a capture: %s", deft_testing_op(n), deft_errmsg());
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    if (graph) CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    if (exec) CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    CUDA_OK(cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost));
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    deft_stream_workspaces_release(0, st);
    cudaStreamDestroy(st);
}

/* A problem first met inside a capture, on a stream that never ran eagerly and so has no cuDNN workspace yet, takes
 * the heuristic's algorithm among those that need none (nothing may be measured or allocated there) and still
 * computes the convolution; met again outside, it is chosen and cached, and agrees. The shape is used nowhere else
 * in this test, so the cache cannot have seen it. */
static void test_conv_first_met_in_capture(void) {
    const conv_case k = {3, 5, 11, 13, 7, 3, 3, 2, 1, 1, 2, 1, 2, 1, 0};
    const int64_t oh = out_len(k.h, k.ph, k.kh, k.dh, k.sh), ow = out_len(k.w, k.pw, k.kw, k.dw, k.sw);
    int64_t xs[4], ws[4], ys[4];
    stored4(0, k.n, k.c, k.h, k.w, xs);
    stored4(0, k.o, k.c, k.kh, k.kw, ws);
    stored4(0, k.n, k.o, oh, ow, ys);
    ref_tensor in[2] = {ref_random(&rng, DEFT_F32, 4, xs, -1, 1), ref_random(&rng, DEFT_F32, 4, ws, -1, 1)};
    const conv_ctx ctx = {&k, 0, 0, DEFT_F32};
    deft_tensor *tc;
    deft_graph *gc, *gg = deft_graph_new();
    deft_status sc;
    float *want = build_and_realize(CPU, 2, in, build_conv, &ctx, &tc, &gc, &sc);
    CHECK_MSG(want != NULL, "cpu: %s", deft_errmsg());
    /* the node on cuda:0, for its shapes and options only: its inputs are fed by hand below */
    deft_tensor *y = deft_conv2d(deft_full(gg, DEFT_F32, 4, xs, GPU, 0.0), deft_full(gg, DEFT_F32, 4, ws, GPU, 0.0),
                                 NULL, &(deft_conv2d_options){.stride = {k.sh, k.sw}, .padding = {k.ph, k.pw},
                                                              .dilation = {k.dh, k.dw}});
    const int64_t ny = ref_numel(4, ys);
    float *got = malloc((size_t)ny * sizeof(float)), *again = malloc((size_t)ny * sizeof(float));
    void *dx = NULL, *dw = NULL, *dy = NULL;
    CUDA_OK(cudaMalloc(&dx, (size_t)in[0].n * 4));
    CUDA_OK(cudaMalloc(&dw, (size_t)in[1].n * 4));
    CUDA_OK(cudaMalloc(&dy, (size_t)ny * 4));
    CUDA_OK(cudaMemcpy(dx, in[0].raw, (size_t)in[0].n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dw, in[1].raw, (size_t)in[1].n * 4, cudaMemcpyHostToDevice));
    const void *srcs[2] = {dx, dw};
    if (want && y && dx && dw && dy) {
        run_captured(y, dy, srcs, got, (size_t)ny * 4);
        CUDA_OK(cudaMemset(dy, 0, (size_t)ny * 4));
        CHECK_OK(deft_cuda_run_node(y, dy, srcs, NULL, 0));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(again, dy, (size_t)ny * 4, cudaMemcpyDeviceToHost));
        double *w = to_doubles(want, DEFT_F32, ny), *a = to_doubles(got, DEFT_F32, ny);
        double *b = to_doubles(again, DEFT_F32, ny);
        ref_close_tol("conv2d first met in a capture", a, w, ny, conv_tol(DEFT_F32));
        ref_close_tol("conv2d met again outside", b, w, ny, conv_tol(DEFT_F32));
        free(w), free(a), free(b);
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
    free(got), free(again), free(want);
    deft_graph_free(gc), deft_graph_free(gg);
    ref_free(&in[0]), ref_free(&in[1]);
}
#else
static void test_conv_first_met_in_capture(void) {}
#endif

int main(void) {
    SKIP_WITHOUT_GPU();
    test_conv_mixed_devices();
    test_conv();
    test_conv_f64_nhwc();
    test_conv_f64_nhwc_grads();
    test_conv_first_met_in_capture();
    test_pool();
    test_batch_norm();
    test_conv_net();
    return deft_check_finish();
}
