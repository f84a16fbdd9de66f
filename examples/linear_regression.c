/* The classic first training run: Linear(10, 1), MSE, SGD with lr 0.01, batch 32, 100 epochs over 1024 samples of
 * y = x . w_true + b_true + noise, the loss printed every 10 epochs. Runs on the CPU.
 *
 *   ./linear_regression [epochs]
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "deft.h"
#include "example_util.h"

#define N_SAMPLES 1024
#define FEATURES 10
#define BATCH 32

/* The synthetic dataset: uniform features, a fixed true weight vector, a little noise. */
static void make_dataset(float *x, float *y) {
    uint64_t s = 1;
    for (int i = 0; i < N_SAMPLES; i++) {
        double t = 0.7;   /* b_true */
        for (int k = 0; k < FEATURES; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double v = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
            x[i * FEATURES + k] = (float)v;
            t += v * (0.5 - 0.1 * k);   /* w_true[k] */
        }
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = (float)(t + 0.01 * ((double)(s >> 11) / 9007199254740992.0 - 0.5));
    }
}

static int fail(deft_graph *g, const char *what) {
    fprintf(stderr, "linear_regression: %s: %s\n", what, deft_errmsg());
    deft_graph_free(g);
    return 1;
}

static const char help[] =
    "usage: linear_regression [EPOCHS] [--trace FILE]\n"
    "\n"
    "The classic first training run on the CPU: Linear(10, 1), MSE, SGD with lr 0.01, batch 32, over 1024\n"
    "generated samples of y = x . w_true + b_true + noise; prints the loss every 10 epochs and the learned weights and bias against the true ones.\n"
    "\n"
    "  EPOCHS        epochs to train, more than 0 (default: 100)\n"
    "  --trace FILE  after training, run one more step (an update too) traced: a Chrome trace-event JSON file of\n"
    "                its steps' times (open it in ui.perfetto.dev or chrome://tracing)\n"
    "  -h, --help    this help\n";

int main(int argc, char **argv) {
    example_help(argc, argv, help);
    int bad = 0;
    const char *trace = example_trace_arg(&argc, argv, &bad);
    int epochs = argc > 1 ? atoi(argv[1]) : 100;
    if (bad || epochs <= 0 || argc > 2) {
        fprintf(stderr, "usage: %s [epochs > 0] [--trace FILE]\n", argv[0]);
        return 2;
    }
    static float xs[N_SAMPLES * FEATURES], ys[N_SAMPLES];
    make_dataset(xs, ys);

    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, 0);
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){BATCH, FEATURES}, deft_cpu());
    deft_tensor *y = deft_input(g, "y", DEFT_F32, 2, (int64_t[]){BATCH, 1}, deft_cpu());
    deft_tensor *loss = deft_mse_loss(deft_linear(x, 1, "fc", NULL), y);
    if (deft_backward(loss) != DEFT_OK) return fail(g, "backward");
    deft_optimizer *sgd = deft_sgd(g, &(deft_sgd_options){.lr = 0.01}, NULL);
    deft_tensor *step = deft_optimizer_step(sgd);
    deft_program *p = deft_compile(g, (deft_tensor *[]){loss, step}, 2, NULL);
    if (!p) return fail(g, "compile");

    double start = seconds();
    for (int epoch = 1; epoch <= epochs; epoch++) {
        double sum = 0;
        for (int b = 0; b < N_SAMPLES / BATCH; b++) {
            float l;
            if (deft_program_feed(p, x, xs + b * BATCH * FEATURES, sizeof(float) * BATCH * FEATURES) != DEFT_OK ||
                deft_program_feed(p, y, ys + b * BATCH, sizeof(float) * BATCH) != DEFT_OK ||
                deft_program_run(p) != DEFT_OK || deft_program_read(p, loss, &l, sizeof l) != DEFT_OK)
                return fail(g, "step");
            sum += l;
        }
        if (epoch % 10 == 0 || epoch == 1) {
            double rate = (double)epoch * N_SAMPLES / (seconds() - start);
            printf("epoch %3d  loss %.6f  %.0f samples/s\n", epoch, sum / (N_SAMPLES / BATCH), rate);
        }
    }
    float w[FEATURES], b;
    deft_param_get(deft_graph_find(g, "fc.weight"), w, sizeof w);
    deft_param_get(deft_graph_find(g, "fc.bias"), &b, sizeof b);
    printf("learned w:");
    for (int k = 0; k < FEATURES; k++) printf(" %.3f", w[k]);
    printf("\ntrue    w:");
    for (int k = 0; k < FEATURES; k++) printf(" %.3f", 0.5 - 0.1 * k);
    printf("\nlearned b: %.3f (true 0.700)\n", b);
    if (trace && deft_program_trace(p, trace) != DEFT_OK) return fail(g, "trace");
    if (trace) printf("trace of one more step written to %s (open it in ui.perfetto.dev or chrome://tracing)\n", trace);
    deft_graph_free(g);
    deft_memory_release_all();   /* the caches back to the driver: leak checkers see nothing left */
    return 0;
}
