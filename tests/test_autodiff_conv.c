/* Backward rules of conv2d, pooling and batch norm against central finite differences, in float64 on the CPU, in
 * both layouts. As in test_autodiff.c, loss = sum(f * r) with a fixed random r, so every element of f's gradient
 * carries a different weight. Max pooling's ties (the first maximum takes the gradient) are checked exactly. */
#include <stdint.h>

#include "check.h"
#include "ref.h"
#include "grad_check.h"

#define CPU deft_cpu()
#define MAXP 4

typedef struct gcase {
    char name[96];
    deft_graph *g;
    deft_tensor *params[MAXP];
    int n_params;
    uint64_t seed;
} gcase;

static gcase start(const char *name, int nhwc) {
    static uint64_t seed = 1234;
    gcase c = {.g = deft_graph_new(), .seed = seed++};
    snprintf(c.name, sizeof c.name, "%s %s", name, nhwc ? "NHWC" : "NCHW");
    return c;
}

static deft_tensor *param(gcase *c, int ndim, const int64_t *shape, double lo, double hi) {
    deft_tensor *p = grad_check_param(c->g, &c->seed, c->n_params, ndim, shape, lo, hi);
    c->params[c->n_params++] = p;
    return p;
}

/* A 4-D parameter given in logical NCHW order, stored in the layout. */
static deft_tensor *image_param(gcase *c, int nhwc, int64_t n, int64_t ch, int64_t h, int64_t w) {
    int64_t shape[4] = {n, nhwc ? h : ch, nhwc ? w : h, nhwc ? ch : w};
    return param(c, 4, shape, -1, 1);
}

static void check_case(gcase *c, deft_tensor *f) {
    CHECK_MSG(f != NULL, "%s: build: %s", c->name, deft_errmsg());
    grad_check_case(c->name, c->g, &c->seed, f, c->params, c->n_params, NULL, NULL, 0, 1e-6);
    CHECK_MSG(deft_graph_error(c->g) == DEFT_OK, "%s: %s", c->name, deft_graph_errmsg(c->g));
    deft_graph_free(c->g);
}

typedef struct conv_case {
    int64_t N, C, H, W, O, KH, KW;
    deft_conv2d_options o;
    int bias;
} conv_case;

static void test_conv2d(void) {
    const conv_case cases[] = {
        {2, 3, 5, 6, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1, DEFT_NCHW}, 1},
        {1, 4, 7, 6, 4, 3, 2, {{2, 2}, {1, 0}, {1, 1}, 2, DEFT_NCHW}, 1},   /* groups 2, stride 2 */
        {1, 2, 8, 7, 3, 3, 3, {{1, 2}, {2, 1}, {2, 2}, 1, DEFT_NCHW}, 0},   /* dilation 2 */
        {2, 3, 6, 5, 3, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 3, DEFT_NCHW}, 1},   /* depthwise */
        {1, 2, 7, 7, 2, 2, 2, {{3, 3}, {0, 0}, {1, 1}, 1, DEFT_NCHW}, 0},   /* stride past the last row and column */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            const conv_case *k = &cases[i];
            gcase c = start("conv2d", nhwc);
            deft_tensor *x = image_param(&c, nhwc, k->N, k->C, k->H, k->W);
            deft_tensor *w = image_param(&c, nhwc, k->O, k->C / k->o.groups, k->KH, k->KW);
            deft_tensor *b = k->bias ? param(&c, 1, &k->O, -1, 1) : NULL;
            deft_conv2d_options o = k->o;
            o.layout = nhwc ? DEFT_NHWC : DEFT_NCHW;
            check_case(&c, deft_conv2d(x, w, b, &o));
        }
}

static void test_pools(void) {
    const deft_pool2d_options pools[] = {
        {{3, 3}, {2, 2}, {1, 1}, 0, DEFT_NCHW},
        {{2, 3}, {1, 2}, {1, 0}, 0, DEFT_NCHW},
        {{3, 3}, {2, 2}, {1, 1}, 1, DEFT_NCHW},
    };
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++)
        for (int nhwc = 0; nhwc < 2; nhwc++)
            for (int max = 0; max < 2; max++) {
                gcase c = start(max ? "max_pool2d" : "avg_pool2d", nhwc);
                deft_pool2d_options o = pools[i];
                o.layout = nhwc ? DEFT_NHWC : DEFT_NCHW;
                deft_tensor *x = image_param(&c, nhwc, 2, 3, 7, 6);
                check_case(&c, max ? deft_max_pool2d(x, &o) : deft_avg_pool2d(x, &o));
            }
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        gcase c = start("adaptive_avg_pool2d", nhwc);
        deft_tensor *x = image_param(&c, nhwc, 2, 2, 7, 5);
        check_case(&c, deft_adaptive_avg_pool2d(x, 3, 2, nhwc ? DEFT_NHWC : DEFT_NCHW));
    }
}

/* Ties: the whole gradient goes to the first maximum of the window, in row-major order, as torch's. */
static void test_max_pool_ties(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_param(g, "x", DEFT_F32, 4, (int64_t[]){1, 1, 3, 4}, CPU, DEFT_INIT_ZEROS);
    const float v[12] = {1, 5, 5, 2, 5, 0, 3, 3, 1, 1, 3, 3};
    CHECK_OK(deft_param_set(x, v, sizeof v));
    deft_tensor *y = deft_max_pool2d(x, &(deft_pool2d_options){.kernel = {2, 2}, .stride = {1, 2}});
    deft_tensor *loss = deft_sum(y, 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    float dx[12], out[4];
    deft_tensor *outs[2] = {y, deft_grad(x)};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK(p != NULL);
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, y, out, sizeof out));
    CHECK_OK(deft_program_read(p, outs[1], dx, sizeof dx));
    const float want_y[4] = {5, 5, 5, 3}, want_dx[12] = {0, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0};
    for (int i = 0; i < 4; i++) CHECK_MSG(out[i] == want_y[i], "y[%d] = %g", i, out[i]);
    for (int i = 0; i < 12; i++) CHECK_MSG(dx[i] == want_dx[i], "dx[%d] = %g, want %g", i, dx[i], want_dx[i]);
    deft_graph_free(g);
}

static void test_batch_norm(void) {
    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int eval = 0; eval < 2; eval++)
            for (int affine = 0; affine < 2; affine++) {
                gcase c = start(eval ? "batch_norm eval" : "batch_norm train", nhwc);
                const int64_t C = 3;
                deft_tensor *x = image_param(&c, nhwc, 3, C, 3, 2);
                deft_tensor *w = affine ? param(&c, 1, &C, 0.5, 2) : NULL;
                deft_tensor *b = affine ? param(&c, 1, &C, -1, 1) : NULL;
                deft_tensor *rm = deft_param(c.g, "rm", DEFT_F64, 1, &C, CPU, DEFT_INIT_ZEROS);
                deft_tensor *rv = deft_param(c.g, "rv", DEFT_F64, 1, &C, CPU, DEFT_INIT_ONES);
                deft_param_set_requires_grad(rm, 0);
                deft_param_set_requires_grad(rv, 0);
                CHECK_OK(deft_param_set(rm, (double[]){0.3, -0.2, 0.1}, 3 * sizeof(double)));
                CHECK_OK(deft_param_set(rv, (double[]){0.5, 1.5, 2.0}, 3 * sizeof(double)));
                deft_batch_norm_options o = deft_batch_norm_defaults();
                o.eval = eval, o.layout = nhwc ? DEFT_NHWC : DEFT_NCHW;
                check_case(&c, deft_batch_norm(x, w, b, rm, rv, &o));
            }
    /* Rank 2 ([N, C], BatchNorm1d's case), no running statistics: the batch's are used. */
    gcase c = start("batch_norm [N, C]", 0);
    deft_tensor *x = param(&c, 2, (int64_t[]){5, 4}, -2, 2);
    check_case(&c, deft_batch_norm(x, NULL, NULL, NULL, NULL, NULL));
}

/* A chain: the gradients of conv -> batch norm -> relu -> max pool reach every parameter. */
static void test_chain(void) {
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        gcase c = start("conv-bn-relu-pool", nhwc);
        deft_layout layout = nhwc ? DEFT_NHWC : DEFT_NCHW;
        deft_tensor *x = image_param(&c, nhwc, 2, 2, 6, 6);
        deft_tensor *w = image_param(&c, nhwc, 3, 2, 3, 3);
        deft_tensor *g = param(&c, 1, (int64_t[]){3}, 0.5, 1.5);
        deft_tensor *h = deft_conv2d(x, w, NULL, &(deft_conv2d_options){.padding = {1, 1}, .layout = layout});
        deft_batch_norm_options o = deft_batch_norm_defaults();
        o.layout = layout;
        h = deft_relu(deft_batch_norm(h, g, NULL, NULL, NULL, &o));
        check_case(&c, deft_avg_pool2d(h, &(deft_pool2d_options){.kernel = {2, 2}, .layout = layout}));
    }
}

int main(void) {
    test_conv2d();
    test_pools();
    test_max_pool_ties();
    test_batch_norm();
    test_chain();
    return deft_check_finish();
}
