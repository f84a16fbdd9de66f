/* The ResNet of examples/resnet18.h on a GPU: a small one (a 3x3 stem, two stages of one BasicBlock, the second with
 * a downsample branch) trained for a few steps on cuda:0 and on the CPU from the same parameters and batches gives
 * the same losses, parameters and running statistics, in NCHW and NHWC, with the step replayed as a CUDA Graph; the
 * evaluation pass agrees too; under bf16 autocast the loss falls; a loader over a CIFAR feed brings the GPU program
 * exactly the batches deft_cifar_batch makes. Needs the conv-family ops on CUDA. */
#include "check.h"
#include "ref.h"

#include "../examples/resnet18.h"

#define GPU deft_cuda(0)
enum { S = 8, CLASSES = 4, BATCH = 16, STEPS = 6 };

static const char *const param_names[] = {
    "conv1.weight", "layer1.0.conv1.weight", "layer1.0.conv2.weight", "layer2.0.conv1.weight",
    "layer2.0.conv2.weight", "layer2.0.downsample.0.weight", "fc.weight", "fc.bias"};
static const char *const bn_names[] = {"bn1", "layer1.0.bn1", "layer1.0.bn2", "layer2.0.bn1", "layer2.0.bn2",
                                       "layer2.0.downsample.1"};
static const char *const bn_parts[] = {"weight", "bias", "running_mean", "running_var"};
#define N_PARAMS ((int)(sizeof param_names / sizeof *param_names))
#define N_BN ((int)(sizeof bn_names / sizeof *bn_names))

/* Calls fn on every parameter name of the small net. */
static void each_param(void (*fn)(const char *, void *), void *ctx) {
    for (int i = 0; i < N_PARAMS; i++) fn(param_names[i], ctx);
    for (int i = 0; i < N_BN; i++)
        for (int k = 0; k < 4; k++) {
            char n[96];
            snprintf(n, sizeof n, "%s.%s", bn_names[i], bn_parts[k]);
            fn(n, ctx);
        }
}

typedef struct pair {
    deft_graph *from, *to;
    double worst;   /* compare: the largest difference relative to the largest magnitude */
} pair;

static float *read_param(deft_graph *g, const char *name, size_t *bytes) {
    deft_tensor *t = deft_graph_find(g, name);
    CHECK_MSG(t != NULL, "no parameter %s", name);
    if (!t) return NULL;
    *bytes = deft_tensor_nbytes(t);
    float *v = malloc(*bytes);
    CHECK_OK(deft_param_get(t, v, *bytes));
    return v;
}

static void copy_one(const char *name, void *ctx) {
    pair *p = ctx;
    size_t n;
    float *v = read_param(p->from, name, &n);
    if (v) CHECK_OK(deft_param_set(deft_graph_find(p->to, name), v, n));
    free(v);
}

static void compare_one(const char *name, void *ctx) {
    pair *p = ctx;
    size_t n, m;
    float *a = read_param(p->from, name, &n), *b = read_param(p->to, name, &m);
    double diff = 0, mag = 1e-6;
    for (size_t i = 0; a && b && n == m && i < n / sizeof(float); i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        mag = fmax(mag, fabs((double)a[i]));
    }
    CHECK_MSG(diff <= 2e-3 * mag, "%s: CPU and GPU differ by %g (largest magnitude %g)", name, diff, mag);
    free(a);
    free(b);
}

static void make_batch(uint64_t seed, float *x, int32_t *y, deft_layout layout) {
    uint64_t rng = seed;
    for (int i = 0; i < BATCH; i++) {
        int k = (int)(ref_next(&rng) % CLASSES), top = (k / 2) * 4, left = (k % 2) * 4;
        for (int c = 0; c < 3; c++)
            for (int r = 0; r < S; r++)
                for (int q = 0; q < S; q++) {
                    float v = (float)ref_unif(&rng, 0.0, 0.5) + (r >= top && r < top + 3 && q >= left && q < left + 3);
                    size_t at = layout == DEFT_NHWC ? (((size_t)i * S + r) * S + q) * 3 + c
                                                    : (((size_t)i * 3 + c) * S + r) * S + q;
                    x[at] = v;
                }
        y[i] = k;
    }
}

static void test_cpu_equals_gpu(deft_layout layout) {
    const resnet_config c = {CLASSES, 8, 2, {1, 1}, 0, layout};
    const deft_sgd_options sgd = {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};
    resnet_train t[2] = {{0}, {0}};
    deft_program *p[2] = {NULL, NULL}, *pe[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        deft_status s = resnet_train_build(&t[d], &c, BATCH, BATCH, S, d ? GPU : deft_cpu(), &sgd, 7);
        CHECK_MSG(s == DEFT_OK, "build on %s: %s", d ? "cuda:0" : "cpu", deft_errmsg());
        if (s != DEFT_OK) goto out;
    }
    pair cp = {t[0].g, t[1].g, 0};
    each_param(copy_one, &cp);
    for (int d = 0; d < 2; d++) {
        p[d] = deft_compile(t[d].g, (deft_tensor *[]){t[d].loss, t[d].step}, 2, NULL);
        pe[d] = p[d] ? deft_compile(t[d].g, &t[d].logits_eval, 1, NULL) : NULL;
        CHECK_MSG(p[d] && pe[d], "compile on %s: %s", d ? "cuda:0" : "cpu", deft_errmsg());
        if (!pe[d]) goto out;
    }
    float x[BATCH * 3 * S * S], loss[2], logits[2][BATCH * CLASSES];
    int32_t y[BATCH];
    for (int step = 0; step < STEPS; step++) {
        make_batch(100 + (uint64_t)step, x, y, layout);
        for (int d = 0; d < 2; d++) {
            CHECK_OK(deft_program_feed(p[d], t[d].x, x, sizeof x));
            CHECK_OK(deft_program_feed(p[d], t[d].y, y, sizeof y));
            CHECK_OK(deft_program_run(p[d]));
            CHECK_OK(deft_program_read(p[d], t[d].loss, &loss[d], sizeof loss[d]));
        }
        CHECK_MSG(fabsf(loss[0] - loss[1]) <= 1e-3f * fmaxf(1.0f, fabsf(loss[0])), "step %d: loss cpu %g, gpu %g",
                  step, loss[0], loss[1]);
    }
    CHECK_MSG(deft_program_graph_replays(p[1]) >= STEPS - 2, "%lld replays in %d steps: %s",
              (long long)deft_program_graph_replays(p[1]), STEPS, deft_program_graph_status(p[1]));
    pair cmp = {t[0].g, t[1].g, 0};
    each_param(compare_one, &cmp);
    make_batch(999, x, y, layout);
    for (int d = 0; d < 2; d++) {
        CHECK_OK(deft_program_feed(pe[d], t[d].x_eval, x, sizeof x));
        CHECK_OK(deft_program_run(pe[d]));
        CHECK_OK(deft_program_read(pe[d], t[d].logits_eval, logits[d], sizeof logits[d]));
    }
    for (int i = 0; i < BATCH * CLASSES; i++)
        CHECK_MSG(fabsf(logits[0][i] - logits[1][i]) <= 2e-3f * fmaxf(1.0f, fabsf(logits[0][i])),
                  "eval logit %d: cpu %g, gpu %g", i, logits[0][i], logits[1][i]);
out:
    deft_graph_free(t[0].g);
    deft_graph_free(t[1].g);
}

/* bf16 autocast, NHWC: the same batches over and over; the loss must fall well below where it started. */
static void test_bf16_trains(void) {
    const resnet_config c = {CLASSES, 16, 2, {1, 1}, 0, DEFT_NHWC};
    resnet_train t = {0};
    deft_status s = resnet_train_build(&t, &c, BATCH, 0, S, GPU,
                                       &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, 7);
    CHECK_MSG(s == DEFT_OK, "build: %s", deft_errmsg());
    deft_program *p = s == DEFT_OK ? deft_compile(t.g, (deft_tensor *[]){t.loss, t.step}, 2,
                                                  &(deft_compile_options){.autocast = DEFT_BF16})
                                   : NULL;
    CHECK_MSG(p != NULL, "compile bf16: %s", deft_errmsg());
    float x[4][BATCH * 3 * S * S], first = NAN, last = NAN;
    int32_t y[4][BATCH];
    for (int b = 0; b < 4; b++) make_batch(200 + (uint64_t)b, x[b], y[b], DEFT_NHWC);
    for (int step = 0; p && step < 60; step++) {
        CHECK_OK(deft_program_feed(p, deft_graph_find(t.g, "x"), x[step % 4], sizeof x[0]));
        CHECK_OK(deft_program_feed(p, deft_graph_find(t.g, "labels"), y[step % 4], sizeof y[0]));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, t.loss, &last, sizeof last));
        if (step == 0) first = last;
    }
    CHECK_MSG(isfinite(last) && last < 0.5f * first, "bf16 loss %g from %g", last, first);
    deft_graph_free(t.g);
}

/* The CIFAR feed through a loader into a GPU program (pinned buffers, copies on the copy stream). */
static void test_cifar_loader_gpu(void) {
    enum { N = 40, B = 8 };
    deft_cifar d = {.n = N, .pixels = malloc((size_t)N * 3072), .labels = malloc(N * sizeof(int32_t))};
    for (int i = 0; i < N * 3072; i++) d.pixels[i] = (uint8_t)((i * 2654435761u) >> 24);
    for (int i = 0; i < N; i++) d.labels[i] = i % 10;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){B, 3, 32, 32}, GPU);
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){B}, GPU);
    deft_tensor *x2 = deft_mul_scalar(x, 2.0), *y1 = deft_add_scalar(y, 0.0);
    deft_program *p = deft_compile(g, (deft_tensor *[]){x2, y1}, 2, NULL);
    CHECK(p != NULL);
    const deft_cifar_options o = {.crop_padding = 4, .flip = 1, .shuffle = 1, .seed = 5};
    deft_cifar_feed *f = NULL;
    deft_loader *l = NULL;
    CHECK_OK(deft_cifar_feed_new(&d, B, &o, &f));
    CHECK_OK(deft_loader_new_cifar(f, x, y, 3, &l));
    float *got = malloc(sizeof(float) * B * 3072), *want = malloc(sizeof(float) * B * 3072);
    int64_t order[N];
    int32_t gy[B], wy[B];
    for (int64_t e = 0; l && e < 2; e++) {
        CHECK_OK(deft_shuffle(order, N, 5 + (uint64_t)e * 0x9e3779b97f4a7c15ull));
        for (int64_t i = 0; i < N / B; i++) {
            CHECK_OK(deft_loader_next(l, p, NULL));
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, x2, got, sizeof(float) * B * 3072));
            CHECK_OK(deft_program_read(p, y1, gy, sizeof gy));
            CHECK_OK(deft_cifar_batch(&d, order, i * B, B, &o, e, want, wy));
            int ok = memcmp(gy, wy, sizeof gy) == 0;
            for (int k = 0; k < B * 3072; k++) ok &= got[k] == 2.0f * want[k];
            CHECK_MSG(ok, "epoch %lld batch %lld differs from deft_cifar_batch", (long long)e, (long long)i);
        }
        deft_loader_batch b;
        CHECK_OK(deft_loader_next(l, p, &b));
        CHECK(b.end);
    }
    deft_loader_free(l);
    deft_cifar_feed_free(f);
    deft_graph_free(g);
    free(got), free(want);
    deft_cifar_free(&d);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_cifar_loader_gpu();
    test_cpu_equals_gpu(DEFT_NCHW);
    test_cpu_equals_gpu(DEFT_NHWC);
    test_bf16_trains();
    return deft_check_finish();
}
