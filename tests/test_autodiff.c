/* Gradients of every differentiable op against central finite differences, in float64 on the CPU.
 *
 * Each case builds f(params) -> tensor, and the test takes loss = sum(f * w) with a fixed random w, so that every
 * element of f's gradient is exercised with a different weight. The analytic gradients come from deft_backward; the
 * numeric ones from (loss(p + h) - loss(p - h)) / 2h element by element. */
#include <stdint.h>

#include "check.h"
#include "ref.h"
#include "grad_check.h"

#define CPU deft_cpu()
#define MAXP 4

typedef struct gcase {
    const char *name;
    deft_graph *g;
    deft_tensor *params[MAXP];
    int n_params;
    deft_tensor *inputs[2];     /* inputs fed with fixed data (no gradient) */
    double *input_data[2];
    int n_inputs;
    uint64_t seed;
} gcase;

static deft_tensor *param(gcase *c, int ndim, const int64_t *shape, double lo, double hi) {
    deft_tensor *p = grad_check_param(c->g, &c->seed, c->n_params, ndim, shape, lo, hi);
    c->params[c->n_params++] = p;
    return p;
}

static void check_case(gcase *c, deft_tensor *f, double tol) {
    grad_check_case(c->name, c->g, &c->seed, f, c->params, c->n_params, c->inputs, c->input_data, c->n_inputs, tol);
}

static gcase start(const char *name) {
    static uint64_t seed = 42;
    gcase c = {.name = name, .g = deft_graph_new(), .seed = seed++};
    return c;
}

static void finish(gcase *c) {
    CHECK_MSG(deft_graph_error(c->g) == DEFT_OK, "%s: %s", c->name, deft_graph_errmsg(c->g));
    for (int i = 0; i < c->n_inputs; i++) free(c->input_data[i]);
    deft_graph_free(c->g);
}

typedef deft_tensor *(*binary_fn)(deft_tensor *, deft_tensor *);

static void test_binary(void) {
    struct { const char *name; binary_fn fn; } ops[] = {
        {"add", deft_add}, {"sub", deft_sub}, {"mul", deft_mul}, {"div", deft_div}, {"maximum", deft_maximum}};
    const int64_t sa[2][3] = {{3, 4}, {2, 1, 3}}, sb[2][3] = {{4}, {4, 1}};
    const int na[2] = {2, 3}, nb[2] = {1, 2};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int s = 0; s < 2; s++) {
            gcase c = start(ops[o].name);
            deft_tensor *a = param(&c, na[s], sa[s], -2, 2);
            deft_tensor *b = o == 3 ? param(&c, nb[s], sb[s], 0.5, 2) : param(&c, nb[s], sb[s], -2, 2);
            check_case(&c, ops[o].fn(a, b), 1e-6);
            finish(&c);
        }
}

static void test_scalar_and_unary(void) {
    for (int op = 0; op < 17; op++) {
        gcase c = start("unary");
        double lo = -2, hi = 2;
        if (op == 5 || op == 8 || op == 9 || op == 10 || op == 6) lo = 0.3;   /* domains of log, sqrt, pow, ... */
        deft_tensor *a = param(&c, 2, (int64_t[]){3, 5}, lo, hi), *f = NULL;
        switch (op) {
        case 0: f = deft_add_scalar(a, 1.5); break;
        case 1: f = deft_rsub_scalar(a, 2.0); break;
        case 2: f = deft_mul_scalar(a, -3.0); break;
        case 3: f = deft_div_scalar(a, 4.0); break;
        case 4: f = deft_maximum_scalar(a, 0.25); break;
        case 5: f = deft_rdiv_scalar(a, 2.0); break;
        case 6: f = deft_pow_scalar(a, 2.5); break;
        case 7: f = deft_exp(a); break;
        case 8: f = deft_log(a); break;
        case 9: f = deft_sqrt(a); break;
        case 10: f = deft_rsqrt(a); break;
        case 11: f = deft_tanh(a); break;
        case 12: f = deft_sigmoid(a); break;
        case 13: f = deft_relu(a); break;
        case 14: f = deft_gelu(a); break;
        case 15: f = deft_silu(a); break;
        default: f = deft_neg(a); break;
        }
        check_case(&c, f, 1e-6);
        finish(&c);
    }
}

static void test_matmul(void) {
    struct { int na, nb; int64_t sa[3], sb[3]; int ta, tb; } cases[] = {
        {2, 2, {3, 4}, {4, 5}, 0, 0}, {2, 2, {4, 3}, {4, 5}, 1, 0}, {2, 2, {3, 4}, {5, 4}, 0, 1},
        {2, 2, {4, 3}, {5, 4}, 1, 1}, {3, 2, {2, 3, 4}, {4, 5}, 0, 0}, {3, 3, {2, 3, 4}, {2, 4, 5}, 0, 0},
        {3, 3, {2, 3, 4}, {1, 5, 4}, 0, 1}, {2, 3, {3, 4}, {2, 4, 5}, 0, 0}, {3, 2, {2, 4, 3}, {5, 4}, 1, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gcase c = start("matmul");
        deft_tensor *a = param(&c, cases[i].na, cases[i].sa, -1, 1);
        deft_tensor *b = param(&c, cases[i].nb, cases[i].sb, -1, 1);
        check_case(&c, deft_matmul_t(a, b, cases[i].ta, cases[i].tb), 1e-6);
        finish(&c);
    }
}

static void test_shape_ops(void) {
    for (int op = 0; op < 6; op++) {
        gcase c = start("shape");
        deft_tensor *a = param(&c, 3, (int64_t[]){2, 3, 4}, -1, 1), *f = NULL;
        switch (op) {
        case 0: f = deft_reshape(a, 2, (int64_t[]){4, 6}); break;
        case 1: f = deft_permute(a, (int[]){2, 0, 1}); break;
        case 2: f = deft_slice(a, 2, 1, 4, 2); break;
        case 3: f = deft_slice(a, 0, 1, 2, 1); break;   /* a view */
        case 4: {
            deft_tensor *b = param(&c, 3, (int64_t[]){2, 2, 4}, -1, 1);
            f = deft_concat((deft_tensor *[]){a, b, a}, 3, 1);
            break;
        }
        default: f = deft_transpose(a, 0, 2); break;
        }
        check_case(&c, f, 1e-6);
        finish(&c);
    }
}

static void test_reductions(void) {
    for (int op = 0; op < 8; op++) {
        gcase c = start("reduce");
        deft_tensor *a = param(&c, 3, (int64_t[]){3, 4, 5}, -2, 2), *f = NULL;
        switch (op) {
        case 0: f = deft_sum(a, 1, (int[]){1}, 0); break;
        case 1: f = deft_sum(a, 2, (int[]){0, 2}, 1); break;
        case 2: f = deft_mean(a, 1, (int[]){-1}, 0); break;
        case 3: f = deft_mean(a, 0, NULL, 0); break;
        case 4: f = deft_max(a, 1, (int[]){2}, 0); break;
        case 5: f = deft_max(a, 2, (int[]){0, 1}, 1); break;
        case 6: f = deft_softmax(a, 1); break;
        default: f = deft_log_softmax(a, -1); break;
        }
        check_case(&c, f, 1e-6);
        finish(&c);
    }
}

/* A tensor read by several ops gets the sum of their gradients. */
static void test_fan_out(void) {
    gcase c = start("fan_out");
    deft_tensor *a = param(&c, 2, (int64_t[]){4, 3}, -1, 1);
    deft_tensor *f = deft_add(deft_mul(a, a), deft_exp(deft_sum(a, 1, (int[]){0}, 1)));
    check_case(&c, deft_add(f, deft_tanh(a)), 1e-6);
    finish(&c);
}

static void test_losses_and_layers(void) {
    gcase c = start("cross_entropy");
    deft_tensor *logits = param(&c, 2, (int64_t[]){5, 7}, -3, 3);
    int32_t labels[5] = {0, 6, 3, 3, 1};
    deft_tensor *t = deft_constant(c.g, DEFT_I32, 1, (int64_t[]){5}, CPU, labels, sizeof labels);
    check_case(&c, deft_cross_entropy(logits, t), 1e-6);
    finish(&c);

    c = start("mse");
    deft_tensor *pred = param(&c, 2, (int64_t[]){6, 2}, -1, 1);
    c.input_data[0] = malloc(12 * sizeof(double));
    for (int i = 0; i < 12; i++) c.input_data[0][i] = 0.1 * i - 0.5;
    c.inputs[0] = deft_input(c.g, "target", DEFT_F64, 2, (int64_t[]){6, 2}, CPU);
    c.n_inputs = 1;
    check_case(&c, deft_mse_loss(pred, c.inputs[0]), 1e-6);
    finish(&c);

    c = start("layer_norm");
    deft_tensor *x = param(&c, 2, (int64_t[]){4, 6}, -2, 2);
    deft_tensor *w = param(&c, 1, (int64_t[]){6}, 0.5, 1.5), *b = param(&c, 1, (int64_t[]){6}, -1, 1);
    check_case(&c, deft_layer_norm(x, w, b, 1e-5), 1e-5);
    finish(&c);

    c = start("linear");
    deft_tensor *in = param(&c, 3, (int64_t[]){2, 3, 4}, -1, 1);
    deft_tensor *y = deft_linear(in, 5, "fc", NULL);
    c.params[c.n_params++] = deft_graph_find(c.g, "fc.weight");
    c.params[c.n_params++] = deft_graph_find(c.g, "fc.bias");
    check_case(&c, deft_gelu(y), 1e-6);
    finish(&c);
}

/* Dropout's gradient is its mask scaled by 1/(1-p): where the output is zero the gradient is zero. */
static void test_dropout_grad(void) {
    deft_graph *g = deft_graph_new();
    const int n = 4000;
    const double p = 0.3;
    deft_tensor *x = deft_param(g, "x", DEFT_F64, 1, (int64_t[]){n}, CPU, DEFT_INIT_ONES);
    deft_tensor *y = deft_dropout(x, p, 7);
    deft_tensor *loss = deft_sum(y, 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[3] = {loss, y, deft_grad(x)};
    deft_program *prog = deft_compile(g, outs, 3, NULL);
    CHECK(prog != NULL);
    double *yv = malloc(n * sizeof *yv), *gv = malloc(n * sizeof *gv), *first = malloc(n * sizeof *first);
    int changed = 0;
    for (int run = 0; run < 2; run++) {
        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, y, yv, n * sizeof *yv));
        CHECK_OK(deft_program_read(prog, outs[2], gv, n * sizeof *gv));
        int mismatch = 0;
        for (int i = 0; i < n; i++) {
            if (fabs(gv[i] - yv[i]) > 1e-12) mismatch++;   /* x is 1: y and dy/dx are the same mask */
            if (run == 1 && yv[i] != first[i]) changed++;
        }
        CHECK_MSG(mismatch == 0, "run %d: %d gradients differ from the mask", run, mismatch);
        memcpy(first, yv, n * sizeof *yv);
    }
    CHECK_MSG(changed > n / 10, "only %d of %d mask entries changed between runs", changed, n);
    free(yv);
    free(gv);
    free(first);
    deft_graph_free(g);
}

static void test_what_gets_gradients(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F64, 2, (int64_t[]){3, 2}, CPU);
    deft_tensor *w = deft_param(g, "w", DEFT_F64, 2, (int64_t[]){2, 2}, CPU, DEFT_INIT_KAIMING);
    deft_tensor *frozen = deft_param(g, "frozen", DEFT_F64, 1, (int64_t[]){2}, CPU, DEFT_INIT_ONES);
    CHECK_OK(deft_param_set_requires_grad(frozen, 0));
    deft_tensor *unused = deft_param(g, "unused", DEFT_F64, 1, (int64_t[]){2}, CPU, DEFT_INIT_ONES);
    deft_tensor *loss = deft_mean(deft_mul(deft_matmul(x, w), frozen), 0, NULL, 0);
    int before = deft_graph_node_count(g);
    CHECK_OK(deft_backward(loss));
    CHECK(deft_grad(w) != NULL);
    CHECK_NULL_ERR(deft_grad(x), "has no gradient");
    CHECK_NULL_ERR(deft_grad(frozen), "has no gradient");
    CHECK_NULL_ERR(deft_grad(unused), "has no gradient");
    /* Only w's path is differentiated: the gradient of x @ w with respect to x is never built. */
    int added = deft_graph_node_count(g) - before;
    CHECK_MSG(added <= 8, "backward added %d nodes", added);
    CHECK(strcmp(deft_tensor_name(deft_grad(w)), "w.grad") == 0);
    CHECK_ERR(deft_param_set_requires_grad(x, 1), DEFT_ERR_INVALID, "not a parameter");
    deft_graph_free(g);
}

static void test_bad_backward(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){2, 3}, CPU, DEFT_INIT_ONES);
    CHECK_ERR(deft_backward(deft_mul_scalar(w, 2.0)), DEFT_ERR_SHAPE, "must be a scalar (one element), got shape [2, 3]");
    CHECK_ERR(deft_backward(deft_input(g, "count", DEFT_I32, 1, (int64_t[]){1}, CPU)), DEFT_ERR_DTYPE, "it must be a floating dtype");
    /* Refused calls leave the graph as it was: its valid loss still differentiates, compiles and runs. */
    CHECK(deft_graph_error(g) == DEFT_OK);
    deft_tensor *loss = deft_sum(w, 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_program *p = deft_compile(g, (deft_tensor *[]){loss, deft_grad(w)}, 2, NULL);
    CHECK(p != NULL);
    CHECK_OK(deft_program_run(p));
    float gw[6] = {0};
    CHECK_OK(deft_program_read(p, deft_grad(w), gw, sizeof gw));
    for (int i = 0; i < 6; i++) CHECK_NEAR(gw[i], 1.0, 0);
    deft_graph_free(g);

    g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){4}, CPU);
    CHECK_ERR(deft_backward(deft_sum(x, 0, NULL, 0)), DEFT_ERR_INVALID,
              "does not depend on any parameter that requires a gradient");
    CHECK(deft_graph_error(g) == DEFT_OK);
    CHECK_ERR(deft_backward(NULL), DEFT_ERR_INVALID, "the loss is NULL");
    deft_graph_free(g);
}

/* Losses and layers refuse wrong shapes, dtypes and values when built, with the reason. */
static void test_bad_layers(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *logits = deft_input(g, "logits", DEFT_F32, 2, (int64_t[]){4, 3}, CPU);
    deft_tensor *labels_f = deft_input(g, "labels_f", DEFT_F32, 1, (int64_t[]){4}, CPU);
    deft_tensor *labels_5 = deft_input(g, "labels_5", DEFT_I32, 1, (int64_t[]){5}, CPU);
    deft_tensor *ints = deft_input(g, "ints", DEFT_I32, 2, (int64_t[]){4, 3}, CPU);
    CHECK_NULL_ERR(deft_cross_entropy(logits, labels_f), "targets must be i32 class indices, got f32");
    CHECK_NULL_ERR(deft_cross_entropy(logits, labels_5), "logits [4, 3] and targets [5]");
    CHECK_NULL_ERR(deft_cross_entropy(ints, labels_5), "i32");
    CHECK_NULL_ERR(deft_mse_loss(logits, deft_transpose(logits, 0, 1)), "prediction [4, 3] and target [3, 4] differ");
    CHECK_NULL_ERR(deft_dropout(logits, 1.0, 1), "probability 1 is not in [0, 1)");
    CHECK_NULL_ERR(deft_dropout(logits, NAN, 1), "is not in [0, 1)");
    CHECK_NULL_ERR(deft_dropout(ints, 0.5, 1), "i32");
    CHECK(deft_dropout(logits, 0.0, 1) == logits);
    deft_tensor *w4 = deft_param(g, "w4", DEFT_F32, 1, (int64_t[]){4}, CPU, DEFT_INIT_ONES);
    CHECK_NULL_ERR(deft_layer_norm(logits, w4, NULL, 1e-5), "weight must be [3] of f32, got [4] f32");
    CHECK_NULL_ERR(deft_layer_norm(logits, NULL, NULL, -1.0), "eps -1 must be >= 0");
    CHECK_NULL_ERR(deft_layer_norm(deft_sum(logits, 0, NULL, 0), NULL, NULL, 1e-5), "no dimension to normalise");
    CHECK_NULL_ERR(deft_linear(logits, 0, "fc", NULL), "out_features > 0 (got 0)");
    CHECK_NULL_ERR(deft_linear(ints, 2, "fc", NULL), "i32");
    CHECK_NULL_ERR(deft_eq(logits, ints), "dtypes f32 and i32 differ");
    CHECK(deft_graph_find(g, "labels_5") == labels_5 && deft_graph_find(g, "nothing") == NULL);
    deft_graph_free(g);
}

int main(void) {
    test_binary();
    test_scalar_and_unary();
    test_matmul();
    test_shape_ops();
    test_reductions();
    test_fan_out();
    test_losses_and_layers();
    test_dropout_grad();
    test_what_gets_gradients();
    test_bad_backward();
    test_bad_layers();
    return deft_check_finish();
}
