/* Batch norm's running statistics: after several training runs they equal the textbook update (torch's
 * BatchNorm2d: r = (1 - momentum) r + momentum s, unbiased variance), once per run even when checkpointing
 * recomputes the forward pass; they get no gradient and no optimizer moves them; evaluation normalises by them and
 * leaves them alone. */
#include "conv_ref.h"
#include "ref.h"

#define CPU deft_cpu()
enum { N = 4, C = 3, H = 5, W = 3, RUNS = 4 };

static uint64_t rng = 99;

/* The textbook update for one batch x (NCHW, f64). */
static void textbook_update(const double *x, double momentum, double *rm, double *rv) {
    const ref4 xs = {{N, C, H, W}};
    double mean[C], var[C];
    ref_moments(xs, x, mean, var);
    const double m = (double)(N * H * W);
    for (int c = 0; c < C; c++) {
        rm[c] = (1 - momentum) * rm[c] + momentum * mean[c];
        rv[c] = (1 - momentum) * rv[c] + momentum * var[c] * m / (m - 1);
    }
}

static void random_batch(double *x) {
    for (int i = 0; i < N * C * H * W; i++) x[i] = ref_unif(&rng, -2, 3) + (double)(i / (H * W) % C);
}

/* Trains conv -> bn -> mean for RUNS runs (SGD steps included) and compares the running statistics. */
static void check_training(int checkpoint, double momentum) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F64, 4, (int64_t[]){N, C, H, W}, CPU);
    deft_tensor *scale = deft_param(g, "scale", DEFT_F64, 4, (int64_t[]){1, C, 1, 1}, CPU, DEFT_INIT_ONES);
    deft_batch_norm_options o = deft_batch_norm_defaults();
    o.momentum = momentum;
    deft_tensor *scaled = deft_mul(x, scale);
    deft_tensor *y = deft_relu(deft_tanh(deft_batch_norm_layer(scaled, "bn", &o)));   /* tanh reads bn's output late */
    deft_tensor *loss = deft_mean(deft_mul(y, y), 0, NULL, 0);
    if (checkpoint) CHECK_OK(deft_checkpoint_span(scaled, y));
    CHECK_OK(deft_backward(loss));
    deft_tensor *rm = deft_graph_find(g, "bn.running_mean"), *rv = deft_graph_find(g, "bn.running_var");
    CHECK(rm && rv && deft_grad(rm) == NULL && deft_grad(rv) == NULL);
    CHECK(deft_grad(deft_graph_find(g, "bn.weight")) != NULL);
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    deft_tensor *outs[2] = {loss, deft_optimizer_step(opt)};
    deft_compile_options co = {.checkpoint = checkpoint ? DEFT_CHECKPOINT_MARKED : DEFT_CHECKPOINT_NONE};
    deft_program *p = deft_compile(g, outs, 2, &co);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    deft_checkpoint_report cr = {0};
    if (p && checkpoint) {
        CHECK_OK(deft_program_checkpoint(p, &cr));
        CHECK_MSG(cr.recomputed >= 1, "checkpointing recomputed %d nodes", cr.recomputed);
    }
    double want_m[C] = {0, 0, 0}, want_v[C] = {1, 1, 1}, xb[N * C * H * W], sc[C];
    for (int run = 0; p && run < RUNS; run++) {
        CHECK_OK(deft_param_get(scale, sc, sizeof sc));
        random_batch(xb);
        CHECK_OK(deft_program_feed(p, x, xb, sizeof xb));
        CHECK_OK(deft_program_run(p));
        for (int i = 0; i < N * C * H * W; i++) xb[i] *= sc[i / (H * W) % C];   /* what bn saw */
        textbook_update(xb, momentum, want_m, want_v);
    }
    double got_m[C], got_v[C];
    CHECK_OK(deft_param_get(rm, got_m, sizeof got_m));
    CHECK_OK(deft_param_get(rv, got_v, sizeof got_v));
    char what[64];
    snprintf(what, sizeof what, "running_mean (momentum %g%s)", momentum, checkpoint ? ", checkpointed" : "");
    ref_close_tol(what, got_m, want_m, C, 1e-12);
    snprintf(what, sizeof what, "running_var (momentum %g%s)", momentum, checkpoint ? ", checkpointed" : "");
    ref_close_tol(what, got_v, want_v, C, 1e-12);
    deft_graph_free(g);
}

/* Evaluation reads the running statistics, changes nothing, and its output is the textbook normalisation. */
static void check_eval(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F64, 4, (int64_t[]){N, C, H, W}, CPU);
    deft_tensor *train = deft_batch_norm_layer(x, "bn", NULL);
    deft_tensor *w = deft_graph_find(g, "bn.weight"), *b = deft_graph_find(g, "bn.bias");
    deft_tensor *rm = deft_graph_find(g, "bn.running_mean"), *rv = deft_graph_find(g, "bn.running_var");
    deft_batch_norm_options eo = deft_batch_norm_defaults();
    eo.eval = 1;
    deft_tensor *eval = deft_batch_norm(x, w, b, rm, rv, &eo);
    CHECK_OK(deft_param_set(w, (double[]){1.5, 0.5, 2.0}, 3 * sizeof(double)));
    CHECK_OK(deft_param_set(b, (double[]){0.1, -0.2, 0.3}, 3 * sizeof(double)));
    deft_program *pt = deft_compile(g, &train, 1, NULL), *pe = deft_compile(g, &eval, 1, NULL);
    CHECK(pt && pe);
    double xb[N * C * H * W], want_m[C] = {0, 0, 0}, want_v[C] = {1, 1, 1};
    for (int run = 0; pt && run < RUNS; run++) {
        random_batch(xb);
        CHECK_OK(deft_program_feed(pt, x, xb, sizeof xb));
        CHECK_OK(deft_program_run(pt));
        textbook_update(xb, 0.1, want_m, want_v);
    }
    random_batch(xb);
    double y[N * C * H * W], want[N * C * H * W], m[C], v[C];
    for (int run = 0; pe && run < 2; run++) {
        CHECK_OK(deft_program_feed(pe, x, xb, sizeof xb));
        CHECK_OK(deft_program_run(pe));
    }
    CHECK_OK(deft_program_read(pe, eval, y, sizeof y));
    ref_batch_norm((ref4){{N, C, H, W}}, xb, want_m, want_v, 1e-5, (double[]){1.5, 0.5, 2.0},
                   (double[]){0.1, -0.2, 0.3}, want);
    ref_close_tol("eval output", y, want, N * C * H * W, 1e-12);
    CHECK_OK(deft_param_get(rm, m, sizeof m));
    CHECK_OK(deft_param_get(rv, v, sizeof v));
    ref_close_tol("running_mean unchanged by eval", m, want_m, C, 1e-12);
    ref_close_tol("running_var unchanged by eval", v, want_v, C, 1e-12);
    deft_graph_free(g);
}

/* Running statistics travel with the model's parameter file. */
static void check_saved(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_constant(g, DEFT_F32, 2, (int64_t[]){2, 2}, CPU, (float[]){1, 2, 5, 8}, 4 * sizeof(float));
    deft_tensor *y = deft_batch_norm_layer(x, "bn", NULL);
    float out[4], m[2];
    CHECK_OK(deft_realize(y, out, sizeof out));
    CHECK_OK(deft_params_save(g, "batch_norm_running.params"));
    deft_graph *h = deft_graph_new();
    deft_batch_norm_layer(deft_constant(h, DEFT_F32, 2, (int64_t[]){2, 2}, CPU, (float[]){0, 0, 0, 0},
                                        4 * sizeof(float)), "bn", NULL);
    CHECK_OK(deft_params_load(h, "batch_norm_running.params"));
    CHECK_OK(deft_param_get(deft_graph_find(h, "bn.running_mean"), m, sizeof m));
    CHECK_MSG(fabsf(m[0] - 0.3f) < 1e-6f && fabsf(m[1] - 0.5f) < 1e-6f, "loaded running_mean %g %g", m[0], m[1]);
    remove("batch_norm_running.params");
    deft_graph_free(g);
    deft_graph_free(h);
}

int main(void) {
    check_training(0, 0.1);
    check_training(0, 0.7);
    check_training(1, 0.1);
    check_training(0, 0.0);
    check_eval();
    check_saved();
    return deft_check_finish();
}
