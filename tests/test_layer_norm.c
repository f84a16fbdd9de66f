/* deft_layer_norm on the CPU: one node (and two backward nodes) against a float64 reference computed here, in f64,
 * f32, f16 and bf16, with and without weight and bias, rows of 1 to 97 elements; gradients against finite
 * differences in f64; the build errors (each with its status and message, and the graph unchanged); the node's
 * buffer (its value and the rows' statistics past it) in the plan; checkpointing drops and recomputes it to the same
 * bits, and the DOT dump and plan table name its ops; bf16 autocast runs it in f32. */
#include "check.h"
#include "ref.h"
#include "grad_check.h"
#include "layer_norm_run.h"
#include "deft_testing.h"

static uint64_t rng = 0x1a7e5a11ull;

static void check_against_reference(const ln_case *c, deft_dtype dt) {
    ln_values v = ln_random(&rng, c, dt);
    ln_result want = {0}, got = {0};
    ln_reference(c, &v, &want);
    if (ln_run(c, &v, dt, deft_cpu(), NULL, &got)) {
        char what[160];
        const int64_t n = ln_numel(c), cols = ln_cols(c);
        /* f32 stores round once (and the statistics once, to f32): 1e-5 of the largest value covers it */
        const double tol = ref_tol(dt);
        snprintf(what, sizeof what, "%s [%lld] of %lld w %d b %d eps %g", deft_dtype_name(dt), (long long)cols,
                 (long long)n, c->weight, c->bias, c->eps);
        char part[200];
        snprintf(part, sizeof part, "%s: y", what);
        ref_close_tol(part, got.y, want.y, n, tol);
        snprintf(part, sizeof part, "%s: dx", what);
        ref_close_tol(part, got.dx, want.dx, n, tol);
        if (c->weight) {
            snprintf(part, sizeof part, "%s: dw", what);
            ref_close_tol(part, got.dw, want.dw, cols, tol);
        }
        if (c->bias) {
            snprintf(part, sizeof part, "%s: db", what);
            ref_close_tol(part, got.db, want.db, cols, tol);
        }
    }
    ln_result_free(&got);
    ln_result_free(&want);
    ln_values_free(&v);
}

static void test_against_reference(void) {
    static const ln_case cases[] = {
        {2, {3, 1}, 1, 1, 1e-5, 0, DEFT_F32},       {2, {4, 5}, 1, 1, 1e-5, 0, DEFT_F32},
        {3, {2, 3, 7}, 0, 0, 1e-5, 0, DEFT_F32},    {2, {5, 33}, 1, 0, 0.1, 0, DEFT_F32},
        {1, {64}, 0, 1, 1e-5, 0, DEFT_F32},         {4, {2, 2, 3, 97}, 1, 1, 1e-3, 0, DEFT_F32},
        {2, {70, 16}, 1, 1, 0.0, 0, DEFT_F32},      /* more rows than the GPU's row blocks */
    };
    static const deft_dtype dts[4] = {DEFT_F64, DEFT_F32, DEFT_F16, DEFT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 4; d++) check_against_reference(&cases[i], dts[d]);
}

/* Central differences in f64 for x, weight and bias, a tanh after it so that dy varies, and a row of one element
 * (its output is the bias alone: dx is 0). */
static void test_finite_differences(void) {
    static const int64_t shapes[3][3] = {{2, 3, 6}, {1, 4, 1}, {3, 1, 17}};
    for (int i = 0; i < 3; i++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *p[3];
        p[0] = grad_check_param(g, &rng, 0, 3, shapes[i], -2.0, 2.0);
        p[1] = grad_check_param(g, &rng, 1, 1, shapes[i] + 2, 0.5, 1.5);
        p[2] = grad_check_param(g, &rng, 2, 1, shapes[i] + 2, -0.5, 0.5);
        char name[64];
        snprintf(name, sizeof name, "finite differences [%lld, %lld, %lld]", (long long)shapes[i][0],
                 (long long)shapes[i][1], (long long)shapes[i][2]);
        grad_check_case(name, g, &rng, deft_tanh(deft_layer_norm(p[0], p[1], p[2], 1e-3)), p, 3, NULL, NULL, 0,
                        1e-6);
        deft_graph_free(g);
    }
    deft_graph *g = deft_graph_new();
    const int64_t s[2] = {3, 8};
    deft_tensor *x = grad_check_param(g, &rng, 0, 2, s, -1.0, 1.0);
    grad_check_case("finite differences, no weight or bias", g, &rng, deft_layer_norm(x, NULL, NULL, 1e-5), &x, 1,
                    NULL, NULL, 0, 1e-6);
    deft_graph_free(g);
}

/* Each refusal: its status (on a fresh graph, whose first error it is), its message, and no node added. */
static void check_refused(deft_status want_status, const char *needle, int which) {
    deft_graph *g = deft_graph_new();
    const int64_t xs[2] = {2, 5}, w5[1] = {5}, w4[1] = {4};
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, xs, deft_cpu());
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 1, w5, deft_cpu(), DEFT_INIT_ONES);
    deft_tensor *bad = NULL;
    switch (which) {
    case 0: bad = deft_param(g, "w4", DEFT_F32, 1, w4, deft_cpu(), DEFT_INIT_ONES); break;
    case 1: bad = deft_param(g, "w64", DEFT_F64, 1, w5, deft_cpu(), DEFT_INIT_ONES); break;
    case 2: bad = deft_param(g, "w2d", DEFT_F32, 2, xs, deft_cpu(), DEFT_INIT_ONES); break;
    case 6: bad = deft_sum(x, 0, NULL, 0); break;   /* 0-d */
    case 7: bad = deft_input(g, "xi", DEFT_I32, 2, xs, deft_cpu()); break;
    default: break;
    }
    const int nodes = deft_graph_node_count(g);
    deft_tensor *t = NULL;
    switch (which) {
    case 0:
    case 1: t = deft_layer_norm(x, bad, NULL, 1e-5); break;
    case 2: t = deft_layer_norm(x, w, bad, 1e-5); break;
    case 3: t = deft_layer_norm(x, w, NULL, -1.0); break;
    case 4: t = deft_layer_norm(x, w, NULL, NAN); break;
    case 5: t = deft_layer_norm(x, w, NULL, INFINITY); break;
    case 6:
    case 7: t = deft_layer_norm(bad, NULL, NULL, 1e-5); break;
    default: break;
    }
    CHECK_MSG(t == NULL, "refusal %d: layer_norm did not fail", which);
    CHECK_MSG(strstr(deft_errmsg(), needle) != NULL, "refusal %d: message \"%s\" lacks \"%s\"", which, deft_errmsg(),
              needle);
    CHECK_MSG(deft_graph_error(g) == want_status, "refusal %d: status %s, want %s", which,
              deft_status_name(deft_graph_error(g)), deft_status_name(want_status));
    CHECK_MSG(deft_graph_node_count(g) == nodes, "refusal %d added nodes: %d -> %d", which, nodes,
              deft_graph_node_count(g));
    deft_graph_free(g);
}

static void test_build_errors(void) {
    check_refused(DEFT_ERR_SHAPE, "layer_norm: weight must be [5] of f32, got [4] f32", 0);
    check_refused(DEFT_ERR_DTYPE, "layer_norm: weight must be [5] of f32, got [5] f64", 1);
    check_refused(DEFT_ERR_SHAPE, "layer_norm: bias must be [5] of f32, got [2, 5] f32", 2);
    check_refused(DEFT_ERR_INVALID, "layer_norm: eps -1 must be >= 0", 3);
    check_refused(DEFT_ERR_INVALID, "layer_norm: eps nan must be >= 0", 4);
    check_refused(DEFT_ERR_INVALID, "layer_norm: eps inf must be >= 0 and finite", 5);
    check_refused(DEFT_ERR_SHAPE, "no dimension to normalise over (it is 0-d)", 6);
    check_refused(DEFT_ERR_DTYPE, "layer_norm", 7);
    CHECK(deft_layer_norm(NULL, NULL, NULL, 1e-5) == NULL);
}

/* A step holds the node once: one arena buffer with its value and 2 rows f32 statistics past it (256-aligned). */
static void test_plan(void) {
    const ln_case c = {3, {4, 6, 40}, 1, 1, 1e-5, 0, DEFT_F32};
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, c.ndim, c.shape, deft_cpu());
    const int64_t cols = 40;
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 1, &cols, deft_cpu(), DEFT_INIT_ONES);
    deft_tensor *y = deft_layer_norm(x, w, NULL, 1e-5);
    deft_tensor *loss = deft_sum(deft_mul(y, y), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[2] = {loss, deft_grad(w)};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        deft_testing_node_plan np;
        deft_testing_program_node_plan(p, y, &np);
        const size_t value = 4 * 6 * 40 * 4, want = ((value + 255) & ~(size_t)255) + 2 * 24 * 4;
        CHECK_MSG(np.place == DEFT_TESTING_PLACE_ARENA && np.size == want, "layer_norm: place %d size %zu, want %zu",
                  np.place, np.size, want);
        /* forward: the layer norm, its square and the sum; backward: the seed's expand and product, dx not asked
         * for, the weight gradient node: no primitive means, subtractions or square roots */
        int means = 0, lns = 0;
        for (int i = 0; deft_testing_step_node(p, i); i++) {
            const char *op = deft_testing_op(deft_testing_step_node(p, i));
            means += strcmp(op, "mean") == 0 || strcmp(op, "rsqrt") == 0;
            lns += strncmp(op, "layer_norm", 10) == 0;
        }
        CHECK_MSG(means == 0 && lns == 2, "steps: %d means or rsqrts, %d layer norm steps (want 0, 2)", means, lns);
    }
    deft_graph_free(g);
}

static char *read_text(FILE *f) {
    static char text[1 << 16];
    rewind(f);
    const size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    return text;
}

/* Checkpointing drops the node and recomputes it (statistics included) for the backward pass: the same bits. */
static void test_checkpoint(void) {
    const int64_t shape[3] = {2, 5, 24}, cols = 24, n = 2 * 5 * 24;
    ref_tensor xv = ref_random(&rng, DEFT_F64, 3, shape, -2.0, 2.0), rv = ref_random(&rng, DEFT_F64, 3, shape, -1, 1);
    ref_tensor wv = ref_random(&rng, DEFT_F64, 1, &cols, 0.5, 1.5), bv = ref_random(&rng, DEFT_F64, 1, &cols, -1, 1);
    double *grads[2][3] = {{NULL}};
    for (int ck = 0; ck < 2; ck++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *x = ln_param(g, "x", &xv, deft_cpu()), *w = ln_param(g, "w", &wv, deft_cpu());
        deft_tensor *b = ln_param(g, "b", &bv, deft_cpu());
        deft_tensor *a = deft_tanh(x), *l = deft_layer_norm(a, w, b, 1e-5), *y = deft_tanh(l);
        deft_tensor *loss = deft_sum(deft_mul(y, ref_const(g, &rv)), 0, NULL, 0);
        CHECK_OK(deft_backward(loss));
        if (ck) CHECK_OK(deft_checkpoint_span(a, y));   /* marks l alone */
        deft_tensor *outs[4] = {loss, deft_grad(x), deft_grad(w), deft_grad(b)};
        deft_compile_options opts = {.checkpoint = ck ? DEFT_CHECKPOINT_MARKED : DEFT_CHECKPOINT_NONE};
        deft_program *p = deft_compile(g, outs, 4, &opts);
        CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
        if (!p) {
            deft_graph_free(g);
            continue;
        }
        CHECK_OK(deft_program_run(p));
        for (int i = 0; i < 3; i++) grads[ck][i] = ln_read(p, outs[1 + i]);
        if (ck) {
            deft_checkpoint_report rep;
            CHECK_OK(deft_program_checkpoint(p, &rep));
            CHECK_MSG(rep.dropped == 1 && rep.recomputed == 1 && rep.recompute_flops == 6.0 * (double)n,
                      "checkpoint: dropped %d recomputed %d flops %g (want 1, 1, %g)", rep.dropped, rep.recomputed,
                      rep.recompute_flops, 6.0 * (double)n);
            deft_testing_node_plan np;
            deft_testing_program_node_plan(p, l, &np);
            CHECK_MSG(np.dropped, "the layer norm node was not dropped");
            CHECK_OK(deft_graph_dump_dot(g, p, "test_layer_norm.dot"));
            FILE *f = fopen("test_layer_norm.dot", "r");
            const char *text = f ? read_text(f) : "";
            CHECK_MSG(strstr(text, "layer_norm") && strstr(text, "layer_norm_grad") &&
                          strstr(text, "layer_norm_weight_grad"),
                      "the DOT dump lacks the layer norm nodes");
            if (f) fclose(f);
            f = tmpfile();
            CHECK_OK(deft_program_print_plan(p, f));
            text = read_text(f);
            fclose(f);
            CHECK_MSG(strstr(text, "layer_norm ") && strstr(text, "layer_norm_grad") && strstr(text, "recompute"),
                      "the plan table lacks the layer norm, its gradient or its recomputation");
        }
        deft_graph_free(g);
    }
    for (int i = 0; i < 3; i++) {
        const int64_t len = i ? cols : n;
        CHECK_MSG(grads[0][i] && grads[1][i] && memcmp(grads[0][i], grads[1][i], (size_t)len * sizeof(double)) == 0,
                  "gradient %d differs with checkpointing", i);
        free(grads[0][i]);
        free(grads[1][i]);
    }
    ref_free(&xv), ref_free(&rv), ref_free(&wv), ref_free(&bv);
}

/* Under bf16 autocast the layer norm after a product (bf16) reads it cast up and runs in f32, as torch's fp32
 * list has it: the result is f32 and close to the f32 step's. */
static void test_autocast(void) {
    const int64_t xs[2] = {6, 16}, ws[2] = {16, 32}, cols = 32;
    ref_tensor xv = ref_random(&rng, DEFT_F32, 2, xs, -1, 1), mv = ref_random(&rng, DEFT_F32, 2, ws, -0.5, 0.5);
    ref_tensor wv = ref_random(&rng, DEFT_F32, 1, &cols, 0.5, 1.5);
    double *res[2][2] = {{NULL}};
    for (int ac = 0; ac < 2; ac++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *x = ln_param(g, "x", &xv, deft_cpu()), *m = ln_param(g, "m", &mv, deft_cpu());
        deft_tensor *w = ln_param(g, "w", &wv, deft_cpu());
        deft_tensor *y = deft_layer_norm(deft_matmul(x, m), w, NULL, 1e-5);
        deft_tensor *loss = deft_sum(deft_mul(y, y), 0, NULL, 0);
        CHECK_OK(deft_backward(loss));
        deft_tensor *outs[3] = {loss, y, deft_grad(w)};
        const deft_compile_options o = {.autocast = ac ? DEFT_BF16 : DEFT_F32};
        deft_program *p = deft_compile(g, outs, 3, ac ? &o : NULL);
        CHECK_MSG(p != NULL, "compile (autocast %d): %s", ac, deft_errmsg());
        if (p) {
            CHECK_OK(deft_program_run(p));
            res[ac][0] = ln_read(p, y);
            res[ac][1] = ln_read(p, outs[2]);
        }
        deft_graph_free(g);
    }
    if (res[0][0] && res[1][0]) {
        ref_close_tol("autocast bf16 y", res[1][0], res[0][0], 6 * 32, 3e-2);
        ref_close_tol("autocast bf16 dw", res[1][1], res[0][1], 32, 3e-2);
        CHECK_MSG(memcmp(res[0][0], res[1][0], 6 * 32 * sizeof(double)) != 0, "autocast bf16 gave f32's bits");
    }
    for (int i = 0; i < 2; i++) free(res[i][0]), free(res[i][1]);
    ref_free(&xv), ref_free(&mv), ref_free(&wv);
}

int main(void) {
    test_against_reference();
    test_finite_differences();
    test_build_errors();
    test_plan();
    test_checkpoint();
    test_autocast();
    return deft_check_finish();
}
