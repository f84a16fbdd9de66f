/* A small conv net (conv -> batch norm -> relu -> max pool -> conv -> adaptive avg pool -> linear) trained with SGD
 * on generated images whose class is the quadrant holding a bright square, in both layouts: held-out accuracy in
 * evaluation mode (running statistics) must pass 90%. */
#include "check.h"
#include "ref.h"

#define CPU deft_cpu()
enum { S = 8, CLASSES = 4, TRAIN = 512, TEST = 256, BATCH = 32, EPOCHS = 8 };

/* Image i (NCHW, one channel, so NHWC is the same bytes) and its class: a 3x3 square of 1s somewhere inside the
 * quadrant of its class, over uniform noise. */
static void make_dataset(uint64_t seed, int n, float *x, int32_t *y) {
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        int k = (int)(ref_next(&rng) % CLASSES), top = (k / 2) * 4, left = (k % 2) * 4;
        int r = top + (int)(ref_next(&rng) % 2), c = left + (int)(ref_next(&rng) % 2);
        float *img = x + (size_t)i * S * S;
        for (int p = 0; p < S * S; p++) img[p] = (float)ref_unif(&rng, 0.0, 0.5);
        for (int dr = 0; dr < 3; dr++)
            for (int dc = 0; dc < 3; dc++) img[(r + dr) * S + c + dc] += 1.0f;
        y[i] = k;
    }
}

typedef struct net {
    deft_tensor *w1, *b1, *w2, *fc;
} net;

/* The first call makes the first layer with deft_conv2d_layer (torch's initialisation); later ones reuse it. */
static deft_tensor *forward(net *m, deft_graph *g, deft_tensor *x, deft_layout layout, int eval) {
    deft_batch_norm_options bo = deft_batch_norm_defaults();
    bo.eval = eval, bo.layout = layout;
    const deft_conv2d_options co = {.padding = {1, 1}, .layout = layout};
    deft_tensor *h = m->w1 ? deft_conv2d(x, m->w1, m->b1, &co) : deft_conv2d_layer(x, 8, 3, 3, "conv1", &co, 0);
    m->w1 = deft_graph_find(g, "conv1.weight");
    m->b1 = deft_graph_find(g, "conv1.bias");
    h = deft_batch_norm_layer(h, eval ? "bn_eval" : "bn", &bo);
    h = deft_max_pool2d(deft_relu(h), &(deft_pool2d_options){.kernel = {2, 2}, .layout = layout});
    h = deft_relu(deft_conv2d(h, m->w2, NULL, &(deft_conv2d_options){.padding = {1, 1}, .layout = layout}));
    h = deft_adaptive_avg_pool2d(h, 2, 2, layout);
    return deft_matmul(deft_reshape(h, 2, (int64_t[]){deft_tensor_dim(x, 0), -1}), m->fc);
}

static void copy_param(deft_tensor *to, const deft_tensor *from) {
    size_t n = deft_tensor_nbytes(from);
    void *buf = malloc(n);
    CHECK_OK(deft_param_get(from, buf, n));
    CHECK_OK(deft_param_set(to, buf, n));
    free(buf);
}

static double train_and_test(deft_layout layout) {
    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, 5);
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){BATCH, 1, S, S}, CPU);
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){BATCH}, CPU);
    if (layout == DEFT_NHWC) x = deft_reshape(x, 4, (int64_t[]){BATCH, S, S, 1});   /* one channel: same bytes */
    net m = {NULL, NULL, NULL, NULL};
    int64_t w2shape[4] = {8, 8, 3, 3};   /* [O, C, KH, KW]; NHWC's [O, KH, KW, C] */
    if (layout == DEFT_NHWC) w2shape[1] = 3, w2shape[3] = 8;
    m.w2 = deft_param(g, "conv2.weight", DEFT_F32, 4, w2shape, CPU, DEFT_INIT_UNIFORM);
    m.fc = deft_param(g, "fc.weight", DEFT_F32, 2, (int64_t[]){32, CLASSES}, CPU, DEFT_INIT_KAIMING);
    deft_tensor *loss = deft_cross_entropy(forward(&m, g, x, layout, 0), y);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, NULL);
    deft_tensor *outs[2] = {loss, deft_optimizer_step(opt)};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());

    float *xs = malloc(sizeof(float) * TRAIN * S * S), *xt = malloc(sizeof(float) * TEST * S * S);
    int32_t ys[TRAIN], yt[TEST];
    make_dataset(11, TRAIN, xs, ys);
    make_dataset(12, TEST, xt, yt);
    float l = 0.0f;
    for (int e = 0; p && e < EPOCHS; e++)
        for (int b = 0; b < TRAIN / BATCH; b++) {
            CHECK_OK(deft_program_feed(p, deft_graph_find(g, "x"), xs + (size_t)b * BATCH * S * S,
                                       sizeof(float) * BATCH * S * S));
            CHECK_OK(deft_program_feed(p, y, ys + b * BATCH, sizeof(int32_t) * BATCH));
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, loss, &l, sizeof l));
        }
    CHECK_MSG(isfinite(l) && l < 0.5f, "last training loss %g", l);

    /* Evaluation: the test set in one batch through the same weights, batch norm on its running statistics (the
     * evaluation branch's own parameters, copied from the trained layer's). */
    deft_tensor *xe = deft_input(g, "x_eval", DEFT_F32, 4, (int64_t[]){TEST, 1, S, S}, CPU);
    if (layout == DEFT_NHWC) xe = deft_reshape(xe, 4, (int64_t[]){TEST, S, S, 1});
    deft_tensor *logits = forward(&m, g, xe, layout, 1);
    const char *names[4] = {"weight", "bias", "running_mean", "running_var"};
    for (int i = 0; i < 4; i++) {
        char a[32], b[32];
        snprintf(a, sizeof a, "bn_eval.%s", names[i]);
        snprintf(b, sizeof b, "bn.%s", names[i]);
        copy_param(deft_graph_find(g, a), deft_graph_find(g, b));
    }
    float *out = malloc(sizeof(float) * TEST * CLASSES);
    deft_program *pe = deft_compile(g, &logits, 1, NULL);
    CHECK_MSG(pe != NULL, "compile eval: %s", deft_errmsg());
    int correct = 0;
    if (pe) {
        CHECK_OK(deft_program_feed(pe, deft_graph_find(g, "x_eval"), xt, sizeof(float) * TEST * S * S));
        CHECK_OK(deft_program_run(pe));
        CHECK_OK(deft_program_read(pe, logits, out, sizeof(float) * TEST * CLASSES));
        for (int i = 0; i < TEST; i++) {
            int best = 0;
            for (int k = 1; k < CLASSES; k++)
                if (out[i * CLASSES + k] > out[i * CLASSES + best]) best = k;
            correct += best == yt[i];
        }
    }
    free(xs), free(xt), free(out);
    deft_graph_free(g);
    return (double)correct / TEST;
}

int main(void) {
    for (int layout = 0; layout < 2; layout++) {
        double acc = train_and_test(layout ? DEFT_NHWC : DEFT_NCHW);
        printf("conv net %s: held-out accuracy %.3f\n", layout ? "NHWC" : "NCHW", acc);
        CHECK_MSG(acc > 0.9, "%s accuracy %.3f", layout ? "NHWC" : "NCHW", acc);
    }
    return deft_check_finish();
}
