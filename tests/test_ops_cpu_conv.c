/* conv2d, pooling, adaptive pooling and batch norm on the CPU against plain float64 references (tests/conv_ref.h),
 * in f32 and f64, NCHW and NHWC, on awkward sizes: odd H and W, strides, padding, dilation, groups, depthwise. */
#include "conv_ref.h"
#include "ref.h"

#define CPU deft_cpu()

static uint64_t rng = 7;

/* Values exactly representable in dt, in logical NCHW order. */
static double *random_values(deft_dtype dt, int64_t n, double lo, double hi) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = ref_round(dt, ref_unif(&rng, lo, hi));
    return v;
}

/* A constant holding logical values `v` of shape s, stored in the layout. */
static deft_tensor *image_const(deft_graph *g, deft_dtype dt, ref4 s, int nhwc, const double *v) {
    const int64_t n = ref4_numel(s);
    double *stored = malloc((size_t)n * sizeof *stored);
    ref4_pack(s, nhwc, v, stored);
    int64_t shape[4];
    ref4_stored(s, nhwc, shape);
    ref_tensor t = ref_alloc(dt, 4, shape);
    for (int64_t i = 0; i < n; i++) ref_set(&t, i, stored[i]);
    deft_tensor *c = ref_const(g, &t);
    ref_free(&t);
    free(stored);
    return c;
}

static deft_tensor *vector_const(deft_graph *g, deft_dtype dt, int64_t n, const double *v) {
    ref_tensor t = ref_alloc(dt, 1, &n);
    for (int64_t i = 0; i < n; i++) ref_set(&t, i, v[i]);
    deft_tensor *c = ref_const(g, &t);
    ref_free(&t);
    return c;
}

/* Realizes an image tensor and returns its values in logical NCHW order. */
static double *realize_image(deft_tensor *t, ref4 s, int nhwc) {
    double *stored = ref_realize(t);
    if (!stored) return NULL;
    CHECK(deft_tensor_numel(t) == ref4_numel(s));
    double *logical = malloc((size_t)ref4_numel(s) * sizeof *logical);
    ref4_unpack(s, nhwc, stored, logical);
    free(stored);
    return logical;
}

typedef struct conv_case {
    int64_t N, C, H, W, O, KH, KW;
    ref_conv p;
    int bias;
} conv_case;

static void check_conv(const conv_case *k, deft_dtype dt) {
    ref4 xs = {{k->N, k->C, k->H, k->W}}, ws = {{k->O, k->C / k->p.groups, k->KH, k->KW}};
    double *x = random_values(dt, ref4_numel(xs), -1, 1), *w = random_values(dt, ref4_numel(ws), -1, 1);
    double *b = k->bias ? random_values(dt, k->O, -1, 1) : NULL, *want;
    ref4 ys = ref_conv2d(xs, x, ws, w, b, k->p, &want);
    double *got[2] = {NULL, NULL};
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        deft_graph *g = deft_graph_new();
        deft_conv2d_options o = {{k->p.stride[0], k->p.stride[1]}, {k->p.pad[0], k->p.pad[1]},
                                 {k->p.dil[0], k->p.dil[1]}, k->p.groups, nhwc ? DEFT_NHWC : DEFT_NCHW};
        deft_tensor *y = deft_conv2d(image_const(g, dt, xs, nhwc, x), image_const(g, dt, ws, nhwc, w),
                                     b ? vector_const(g, dt, k->O, b) : NULL, &o);
        int64_t shape[4];
        ref4_stored(ys, nhwc, shape);
        CHECK_MSG(ref_shape_eq(y, 4, shape), "conv2d output shape (%s)", deft_errmsg());
        got[nhwc] = y ? realize_image(y, ys, nhwc) : NULL;
        char what[128];
        snprintf(what, sizeof what, "conv2d %s %s C%lld O%lld %lldx%lld s%lld p%lld d%lld g%lld",
                 deft_dtype_name(dt), nhwc ? "NHWC" : "NCHW", (long long)k->C, (long long)k->O, (long long)k->KH,
                 (long long)k->KW, (long long)k->p.stride[0], (long long)k->p.pad[0], (long long)k->p.dil[0],
                 (long long)k->p.groups);
        if (got[nhwc]) ref_close(what, dt, got[nhwc], want, ref4_numel(ys));
        deft_graph_free(g);
    }
    if (got[0] && got[1]) ref_close("conv2d NCHW against NHWC", dt, got[1], got[0], ref4_numel(ys));
    free(got[0]), free(got[1]), free(x), free(w), free(b), free(want);
}

static void test_conv2d(void) {
    const conv_case cases[] = {
        {2, 3, 7, 9, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, 1},
        {2, 4, 9, 7, 6, 3, 2, {{2, 2}, {1, 0}, {1, 1}, 2}, 1},      /* groups 2, stride 2, uneven padding */
        {1, 4, 11, 10, 4, 3, 3, {{1, 1}, {2, 2}, {2, 2}, 1}, 0},    /* dilation 2 */
        {2, 6, 8, 7, 6, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 6}, 1},      /* depthwise */
        {3, 2, 5, 5, 5, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 1}, 1},      /* 1x1 */
        {1, 3, 13, 12, 8, 5, 5, {{3, 2}, {2, 1}, {1, 2}, 1}, 1},    /* strides and dilations per axis */
        {2, 4, 6, 6, 8, 2, 2, {{2, 2}, {0, 0}, {1, 1}, 4}, 0},      /* O = 2 C per group */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_conv(&cases[i], DEFT_F32);
        check_conv(&cases[i], DEFT_F64);
    }
}

static void check_pool(ref4 xs, ref_pool p, deft_dtype dt) {
    double *x = random_values(dt, ref4_numel(xs), -2, 2), *want;
    ref4 ys = ref_pool2d(xs, x, p, &want);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *xt = image_const(g, dt, xs, nhwc, x), *y;
        deft_layout layout = nhwc ? DEFT_NHWC : DEFT_NCHW;
        deft_pool2d_options o = {{p.kernel[0], p.kernel[1]}, {p.stride[0], p.stride[1]}, {p.pad[0], p.pad[1]},
                                 p.exclude_pad, layout};
        if (p.adaptive) y = deft_adaptive_avg_pool2d(xt, p.out[0], p.out[1], layout);
        else y = p.max ? deft_max_pool2d(xt, &o) : deft_avg_pool2d(xt, &o);
        double *got = y ? realize_image(y, ys, nhwc) : NULL;
        CHECK_MSG(got != NULL, "pool: %s", deft_errmsg());
        char what[128];
        snprintf(what, sizeof what, "%s %s %s %lldx%lld from %lldx%lld", p.adaptive ? "adaptive" : p.max ? "max" : "avg",
                 deft_dtype_name(dt), nhwc ? "NHWC" : "NCHW", (long long)ys.d[2], (long long)ys.d[3],
                 (long long)xs.d[2], (long long)xs.d[3]);
        if (got) ref_close(what, dt, got, want, ref4_numel(ys));
        free(got);
        deft_graph_free(g);
    }
    free(x), free(want);
}

static void test_pools(void) {
    const ref4 shapes[] = {{{2, 3, 7, 9}}, {{1, 2, 8, 7}}, {{2, 2, 9, 11}}};
    const ref_pool pools[] = {
        {{3, 3}, {2, 2}, {1, 1}, 0, 0, 0, {0, 0}},
        {{2, 2}, {2, 2}, {0, 0}, 0, 0, 0, {0, 0}},
        {{3, 2}, {2, 1}, {1, 1}, 0, 0, 0, {0, 0}},
        {{3, 3}, {2, 2}, {1, 1}, 1, 0, 0, {0, 0}},   /* count_include_pad = False */
    };
    for (int dt = 0; dt < 2; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t k = 0; k < sizeof pools / sizeof pools[0]; k++)
                for (int max = 0; max < 2; max++) {
                    ref_pool p = pools[k];
                    p.max = max;
                    check_pool(shapes[s], p, dt ? DEFT_F64 : DEFT_F32);
                }
    const int64_t adaptive[][4] = {{7, 9, 3, 4}, {5, 5, 1, 1}, {4, 6, 4, 6}, {6, 10, 4, 3}, {3, 3, 5, 2}};
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof adaptive / sizeof adaptive[0]; i++) {
            ref_pool p = {.adaptive = 1, .out = {adaptive[i][2], adaptive[i][3]}};
            check_pool((ref4){{2, 3, adaptive[i][0], adaptive[i][1]}}, p, dt ? DEFT_F64 : DEFT_F32);
        }
}

/* Stride 0 means the kernel's size, as torch's default. */
static void test_pool_default_stride(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){1, 1, 6, 9}, CPU);
    deft_tensor *y = deft_max_pool2d(x, &(deft_pool2d_options){.kernel = {2, 3}});
    CHECK(ref_shape_eq(y, 4, (int64_t[]){1, 1, 3, 3}));
    deft_graph_free(g);
}

static void check_batch_norm(ref4 xs, deft_dtype dt, int nhwc, int eval, int affine) {
    const int64_t C = xs.d[1];
    double *x = random_values(dt, ref4_numel(xs), -3, 5), *w = random_values(dt, C, 0.5, 2);
    double *b = random_values(dt, C, -1, 1), *rm = random_values(dt, C, -1, 1), *rv = random_values(dt, C, 0.5, 3);
    double *mean = malloc((size_t)C * sizeof *mean), *var = malloc((size_t)C * sizeof *var);
    double *want = malloc((size_t)ref4_numel(xs) * sizeof *want);
    if (eval) memcpy(mean, rm, (size_t)C * sizeof *mean), memcpy(var, rv, (size_t)C * sizeof *var);
    else ref_moments(xs, x, mean, var);
    ref_batch_norm(xs, x, mean, var, 1e-3, affine ? w : NULL, affine ? b : NULL, want);
    deft_graph *g = deft_graph_new();
    deft_tensor *rmt = deft_param(g, "rm", dt, 1, &C, CPU, DEFT_INIT_ZEROS);
    deft_tensor *rvt = deft_param(g, "rv", dt, 1, &C, CPU, DEFT_INIT_ZEROS);
    ref_tensor r = ref_alloc(dt, 1, &C);
    for (int64_t i = 0; i < C; i++) ref_set(&r, i, rm[i]);
    CHECK_OK(deft_param_set(rmt, r.raw, deft_tensor_nbytes(rmt)));
    for (int64_t i = 0; i < C; i++) ref_set(&r, i, rv[i]);
    CHECK_OK(deft_param_set(rvt, r.raw, deft_tensor_nbytes(rvt)));
    ref_free(&r);
    deft_batch_norm_options o = deft_batch_norm_defaults();
    o.eval = eval, o.eps = 1e-3, o.layout = nhwc ? DEFT_NHWC : DEFT_NCHW;
    deft_tensor *y = deft_batch_norm(image_const(g, dt, xs, nhwc, x), affine ? vector_const(g, dt, C, w) : NULL,
                                     affine ? vector_const(g, dt, C, b) : NULL, rmt, rvt, &o);
    double *got = y ? realize_image(y, xs, nhwc) : NULL;
    CHECK_MSG(got != NULL, "batch_norm: %s", deft_errmsg());
    char what[96];
    snprintf(what, sizeof what, "batch_norm %s %s %s%s", deft_dtype_name(dt), nhwc ? "NHWC" : "NCHW",
             eval ? "eval" : "train", affine ? "" : " (no affine)");
    /* f32 normalises by an f32 mean and 1/sqrt(var + eps): a few ulps of x's range */
    if (got) ref_close_tol(what, got, want, ref4_numel(xs), dt == DEFT_F32 ? 2e-5 : 1e-11);
    free(got), free(x), free(w), free(b), free(rm), free(rv), free(mean), free(var), free(want);
    deft_graph_free(g);
}

static void test_batch_norm(void) {
    const ref4 shapes[] = {{{4, 3, 5, 7}}, {{3, 5, 1, 1}}, {{2, 4, 3, 9}}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int dt = 0; dt < 2; dt++)
            for (int nhwc = 0; nhwc < 2; nhwc++)
                for (int eval = 0; eval < 2; eval++)
                    for (int affine = 0; affine < 2; affine++)
                        check_batch_norm(shapes[s], dt ? DEFT_F64 : DEFT_F32, nhwc, eval, affine);
}

/* Half dtypes build (a GPU will run them) but the CPU's convolution and pooling kernels refuse them with a message at
 * run (batch norm takes them: tests/test_batch_norm_mixed.c). */
static void test_half_dtypes_refused(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_full(g, DEFT_BF16, 4, (int64_t[]){1, 2, 4, 4}, CPU, 1.0);
    deft_tensor *w = deft_full(g, DEFT_BF16, 4, (int64_t[]){2, 2, 3, 3}, CPU, 1.0);
    deft_tensor *y = deft_conv2d(x, w, NULL, NULL);
    CHECK(y != NULL);
    uint16_t out[8];
    CHECK_ERR(deft_realize(y, out, sizeof out), DEFT_ERR_DTYPE, "conv2d: dtype bf16 is not supported on the CPU");
    deft_tensor *p = deft_max_pool2d(x, &(deft_pool2d_options){.kernel = {2, 2}});
    CHECK_ERR(deft_realize(p, out, sizeof out), DEFT_ERR_DTYPE, "max_pool2d: dtype bf16 is not supported on the CPU");
    deft_graph_free(g);
}

int main(void) {
    test_conv2d();
    test_pools();
    test_pool_default_stride();
    test_batch_norm();
    test_half_dtypes_refused();
    return deft_check_finish();
}
