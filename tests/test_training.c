/* Training: SGD and AdamW against their textbook formulas, clipping, accumulation, learning-rate changes, a run
 * whose losses follow a float64 reference step by step, and the errors of bad hyperparameters. */
#include <stdint.h>

#include "check.h"
#include "ref.h"

#define CPU deft_cpu()

/* loss = sum(p * c): the gradient is c whatever p is, so the expected updates can be written out by hand. */
typedef struct linear_case {
    deft_graph *g;
    deft_optimizer *opt;
    deft_tensor *p, *loss, *step;
    deft_program *prog;
} linear_case;

static const double C[3] = {0.5, -2.0, 4.0};
static const double P0[3] = {1.0, -1.0, 0.25};

static void linear_build(linear_case *lc, deft_optimizer *(*make)(linear_case *, void *), void *opts) {
    lc->g = deft_graph_new();
    lc->p = deft_param(lc->g, "p", DEFT_F64, 1, (int64_t[]){3}, CPU, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(lc->p, P0, sizeof P0));
    deft_tensor *c = deft_constant(lc->g, DEFT_F64, 1, (int64_t[]){3}, CPU, C, sizeof C);
    lc->loss = deft_sum(deft_mul(lc->p, c), 0, NULL, 0);
    CHECK_OK(deft_backward(lc->loss));
    lc->opt = make(lc, opts);
    CHECK(lc->opt != NULL);
    lc->step = deft_optimizer_step(lc->opt);
    lc->prog = deft_compile(lc->g, (deft_tensor *[]){lc->loss, lc->step}, 2, NULL);
    CHECK(lc->prog != NULL);
}

static deft_optimizer *make_sgd(linear_case *lc, void *o) { return deft_sgd(lc->g, o, NULL); }
static deft_optimizer *make_adamw(linear_case *lc, void *o) { return deft_adamw(lc->g, o, NULL); }

static void test_sgd_formulas(void) {
    deft_sgd_options variants[] = {{0.1, 0, 0, 0, 0}, {0.1, 0.9, 0, 0, 0}, {0.1, 0.9, 0, 0.01, 1},
                                   {0.05, 0.8, 0.3, 0.1, 0}};
    for (int v = 0; v < 4; v++) {
        deft_sgd_options o = variants[v];
        linear_case lc;
        linear_build(&lc, make_sgd, &o);
        double p[3], buf[3] = {0};
        memcpy(p, P0, sizeof p);
        for (int step = 0; step < 4; step++) {
            CHECK_OK(deft_program_run(lc.prog));
            for (int j = 0; j < 3; j++) {   /* torch.optim.SGD, written out */
                double d = C[j] + o.weight_decay * p[j];
                if (o.momentum != 0) {
                    buf[j] = step == 0 ? d : o.momentum * buf[j] + (1 - o.dampening) * d;
                    d = o.nesterov ? d + o.momentum * buf[j] : buf[j];
                }
                p[j] -= o.lr * d;
            }
            double got[3];
            CHECK_OK(deft_param_get(lc.p, got, sizeof got));
            for (int j = 0; j < 3; j++) CHECK_NEAR(got[j], p[j], 1e-14);
        }
        CHECK(deft_optimizer_updates(lc.opt) == 4);
        deft_graph_free(lc.g);
    }
}

static void test_adamw_formulas(void) {
    deft_adamw_options o = {0.01, 0.9, 0.999, 1e-8, 0.1};
    linear_case lc;
    linear_build(&lc, make_adamw, &o);
    double p[3], m[3] = {0}, v[3] = {0};
    memcpy(p, P0, sizeof p);
    for (int t = 1; t <= 5; t++) {
        CHECK_OK(deft_program_run(lc.prog));
        for (int j = 0; j < 3; j++) {   /* Loshchilov & Hutter, as torch.optim.AdamW */
            p[j] -= o.lr * o.weight_decay * p[j];
            m[j] = o.beta1 * m[j] + (1 - o.beta1) * C[j];
            v[j] = o.beta2 * v[j] + (1 - o.beta2) * C[j] * C[j];
            double mhat = m[j] / (1 - pow(o.beta1, t)), vhat = v[j] / (1 - pow(o.beta2, t));
            p[j] -= o.lr * mhat / (sqrt(vhat) + o.eps);
        }
        double got[3];
        CHECK_OK(deft_param_get(lc.p, got, sizeof got));
        for (int j = 0; j < 3; j++) CHECK_NEAR(got[j], p[j], 1e-12);
    }
    deft_adamw_options d = deft_adamw_defaults();
    CHECK(d.lr == 1e-3 && d.beta1 == 0.9 && d.beta2 == 0.999 && d.eps == 1e-8 && d.weight_decay == 1e-2);
    deft_graph_free(lc.g);
}

/* The step node reports the gradient norm; with max_grad_norm the update uses the clipped gradient. */
static void test_clipping_and_lr(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_param(g, "p", DEFT_F64, 1, (int64_t[]){3}, CPU, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(p, P0, sizeof P0));
    deft_tensor *c = deft_constant(g, DEFT_F64, 1, (int64_t[]){3}, CPU, C, sizeof C);
    deft_tensor *loss = deft_sum(deft_mul(p, c), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, &(deft_step_options){.max_grad_norm = 1.0});
    deft_tensor *step = deft_optimizer_step(opt);
    deft_program *prog = deft_compile(g, (deft_tensor *[]){loss, step}, 2, NULL);
    CHECK_OK(deft_program_run(prog));
    float norm = 0;
    CHECK_OK(deft_program_read(prog, step, &norm, sizeof norm));
    double full = sqrt(C[0] * C[0] + C[1] * C[1] + C[2] * C[2]);
    CHECK_NEAR(norm, full, 1e-5);
    double got[3], clip = 1.0 / (full + 1e-6);
    CHECK_OK(deft_param_get(p, got, sizeof got));
    for (int j = 0; j < 3; j++) CHECK_NEAR(got[j], P0[j] - 0.1 * C[j] * clip, 1e-14);
    /* A new learning rate takes effect at the next run, without recompiling. */
    CHECK_OK(deft_optimizer_set_lr(opt, 0.5));
    CHECK(deft_optimizer_lr(opt) == 0.5);
    CHECK_OK(deft_program_run(prog));
    double after[3];
    CHECK_OK(deft_param_get(p, after, sizeof after));
    for (int j = 0; j < 3; j++) CHECK_NEAR(after[j], got[j] - 0.5 * C[j] * clip, 1e-14);
    CHECK(deft_optimizer_updates(opt) == 2);
    CHECK_ERR(deft_optimizer_set_lr(opt, NAN), DEFT_ERR_INVALID, "must be finite and >= 0");
    CHECK_ERR(deft_optimizer_set_lr(opt, -0.1), DEFT_ERR_INVALID, "must be finite and >= 0");
    CHECK(deft_optimizer_lr(opt) == 0.5);
    deft_graph_free(g);
}

/* A linear regression y = x w + b with MSE, sized so that a batch can be cut into micro-batches. */
typedef struct regression {
    deft_graph *g;
    deft_tensor *x, *y, *w, *b, *loss, *step;
    deft_optimizer *opt;
    deft_program *prog;
} regression;

static void regression_build(regression *r, int64_t batch, int accumulate, int adamw) {
    r->g = deft_graph_new();
    r->x = deft_input(r->g, "x", DEFT_F64, 2, (int64_t[]){batch, 3}, CPU);
    r->y = deft_input(r->g, "y", DEFT_F64, 2, (int64_t[]){batch, 1}, CPU);
    r->w = deft_param(r->g, "w", DEFT_F64, 2, (int64_t[]){3, 1}, CPU, DEFT_INIT_ZEROS);
    r->b = deft_param(r->g, "b", DEFT_F64, 1, (int64_t[]){1}, CPU, DEFT_INIT_ZEROS);
    r->loss = deft_mse_loss(deft_add(deft_matmul(r->x, r->w), r->b), r->y);
    CHECK_OK(deft_backward(r->loss));
    deft_step_options so = {.accumulate_steps = accumulate};
    r->opt = adamw ? deft_adamw(r->g, NULL, &so) : deft_sgd(r->g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, &so);
    r->step = deft_optimizer_step(r->opt);
    r->prog = deft_compile(r->g, (deft_tensor *[]){r->loss, r->step}, 2, NULL);
    CHECK(r->prog != NULL);
}

static void make_data(double *x, double *y, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 3; k++) x[i * 3 + k] = ref_unif(&seed, -1, 1);
        y[i] = 2 * x[i * 3] - x[i * 3 + 1] + 0.5 * x[i * 3 + 2] + 0.3 + 0.01 * ref_unif(&seed, -1, 1);
    }
}

static double regression_step(regression *r, const double *x, const double *y, int n) {
    double loss = NAN;
    CHECK_OK(deft_program_feed(r->prog, r->x, x, (size_t)n * 3 * sizeof *x));
    CHECK_OK(deft_program_feed(r->prog, r->y, y, (size_t)n * sizeof *y));
    CHECK_OK(deft_program_run(r->prog));
    CHECK_OK(deft_program_read(r->prog, r->loss, &loss, sizeof loss));
    return loss;
}

/* Four micro-batches of 8 accumulate into the same update as one batch of 32. */
static void test_accumulation(void) {
    for (int adamw = 0; adamw < 2; adamw++) {
        regression big, small;
        regression_build(&big, 32, 1, adamw);
        regression_build(&small, 8, 4, adamw);
        double x[32 * 3], y[32];
        for (int step = 0; step < 3; step++) {
            make_data(x, y, 32, 100 + (uint64_t)step);
            regression_step(&big, x, y, 32);
            for (int m = 0; m < 4; m++) {
                regression_step(&small, x + m * 8 * 3, y + m * 8, 8);
                CHECK(deft_optimizer_updates(small.opt) == step + (m == 3));
            }
            double wb[3], ws[3], bb, bs;
            CHECK_OK(deft_param_get(big.w, wb, sizeof wb));
            CHECK_OK(deft_param_get(small.w, ws, sizeof ws));
            CHECK_OK(deft_param_get(big.b, &bb, sizeof bb));
            CHECK_OK(deft_param_get(small.b, &bs, sizeof bs));
            for (int k = 0; k < 3; k++) CHECK_NEAR(wb[k], ws[k], 1e-12);
            CHECK_NEAR(bb, bs, 1e-12);
        }
        deft_graph_free(big.g);
        deft_graph_free(small.g);
    }
}

/* The same regression trained by hand in float64: loss and gradient formulas written out, SGD with momentum. */
static void test_losses_follow_reference(void) {
    regression r;
    regression_build(&r, 16, 1, 0);
    double w[3] = {0}, b = 0, buf[4] = {0};
    double x[16 * 3], y[16];
    for (int step = 0; step < 20; step++) {
        make_data(x, y, 16, 7 + (uint64_t)step);
        double ref_loss = 0, gw[3] = {0}, gb = 0;
        for (int i = 0; i < 16; i++) {
            double e = x[i * 3] * w[0] + x[i * 3 + 1] * w[1] + x[i * 3 + 2] * w[2] + b - y[i];
            ref_loss += e * e / 16;
            for (int k = 0; k < 3; k++) gw[k] += 2 * e * x[i * 3 + k] / 16;
            gb += 2 * e / 16;
        }
        double loss = regression_step(&r, x, y, 16);
        CHECK_MSG(fabs(loss - ref_loss) <= 1e-12 * fmax(1, ref_loss), "step %d: loss %.15g, reference %.15g", step,
                  loss, ref_loss);
        double g4[4] = {gw[0], gw[1], gw[2], gb}, *p4[4] = {&w[0], &w[1], &w[2], &b};
        for (int k = 0; k < 4; k++) {
            buf[k] = step == 0 ? g4[k] : 0.9 * buf[k] + g4[k];
            *p4[k] -= 0.05 * buf[k];
        }
    }
    deft_graph_free(r.g);
}

/* Two optimizers over the same parameters are refused whichever order things happen in: here the second comes before
 * the first has a step node (it used to be let through, and its step then read storage the first had freed). */
static void test_two_optimizers_before_steps(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_param(g, "p", DEFT_F32, 1, (int64_t[]){3}, CPU, DEFT_INIT_ONES);
    deft_tensor *loss = deft_sum(p, 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *sgd = deft_sgd(g, &(deft_sgd_options){.lr = 0.5}, NULL);
    CHECK(sgd != NULL);
    CHECK_NULL_ERR(deft_adamw(g, NULL, NULL), "p is already updated by another optimizer");
    deft_tensor *step = deft_optimizer_step(sgd);
    CHECK(step != NULL);
    deft_program *prog = deft_compile(g, (deft_tensor *[]){loss, step}, 2, NULL);
    CHECK(prog != NULL);
    CHECK_OK(deft_program_run(prog));
    float v[3] = {0};
    CHECK_OK(deft_param_get(p, v, sizeof v));
    for (int i = 0; i < 3; i++) CHECK_NEAR(v[i], 0.5, 0);   /* 1 - 0.5 * d(sum)/dp */
    deft_graph_free(g);
}

static void test_bad_hyperparameters(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_param(g, "p", DEFT_F32, 1, (int64_t[]){3}, CPU, DEFT_INIT_ONES);
    CHECK_NULL_ERR(deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL), "no parameter has a gradient");
    CHECK_OK(deft_backward(deft_sum(p, 0, NULL, 0)));
    CHECK_NULL_ERR(deft_sgd(g, &(deft_sgd_options){.lr = NAN}, NULL), "learning rate nan must be finite");
    CHECK_NULL_ERR(deft_sgd(g, &(deft_sgd_options){.lr = -1}, NULL), "learning rate -1 must be finite");
    CHECK_NULL_ERR(deft_sgd(g, NULL, NULL), "options are NULL");
    CHECK_NULL_ERR(deft_sgd(g, &(deft_sgd_options){.lr = 0.1, .nesterov = 1}, NULL), "Nesterov");
    CHECK_NULL_ERR(deft_adamw(g, &(deft_adamw_options){.lr = 1e-3, .beta1 = 1.0, .beta2 = 0.9}, NULL), "betas");
    CHECK_NULL_ERR(deft_adamw(g, &(deft_adamw_options){.lr = INFINITY, .beta1 = 0.9, .beta2 = 0.9}, NULL),
                   "learning rate inf");
    CHECK_NULL_ERR(deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, &(deft_step_options){.accumulate_steps = -2}),
                   "accumulate_steps -2");
    deft_optimizer *ok = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    CHECK(ok != NULL && deft_optimizer_step(ok) != NULL);
    CHECK_NULL_ERR(deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL), "already updated by another optimizer");
    deft_graph_free(g);

    g = deft_graph_new();
    deft_tensor *a = deft_param(g, "a", DEFT_F32, 1, (int64_t[]){3}, CPU, DEFT_INIT_ONES);
    deft_tensor *b = deft_param(g, "b", DEFT_F64, 1, (int64_t[]){3}, CPU, DEFT_INIT_ONES);
    CHECK_OK(deft_backward(deft_add(deft_sum(a, 0, NULL, 0), deft_cast(deft_sum(b, 0, NULL, 0), DEFT_F32))));
    CHECK_NULL_ERR(deft_adamw(g, NULL, NULL), "must share one device and dtype");
    deft_graph_free(g);
}

int main(void) {
    test_sgd_formulas();
    test_adamw_formulas();
    test_clipping_and_lr();
    test_accumulation();
    test_losses_follow_reference();
    test_bad_hyperparameters();
    test_two_optimizers_before_steps();
    return deft_check_finish();
}
