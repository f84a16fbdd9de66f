/* The mixed-precision tests' convolution net (tests/amp_net.h is the MLP), on any device, NHWC or NCHW:
 *   x [B, 8, 8, 3] -> c1 (conv 3x3, pad 1, 8 channels, bias) -> relu -> p1 (max pool 2x2)
 *     -> c2 (conv 3x3, pad 1, 16, no bias) -> bn2 (batch norm, training) -> relu -> p2 (average pool 2x2)
 *     -> c3a (conv 1x1, 16, weight w3) -> relu -> c3b (conv 1x1 with the same weight w3) -> gap (adaptive average
 *     pool to 1x1) -> reshape [B, 16] -> fc (linear to 4 classes) -> cross-entropy; backward; SGD with momentum.
 * Under autocast every image op meets the low dtype L: max pooling after c1, batch norm on c2's L output (with f32
 * weight and statistics), average pooling after it, adaptive pooling after c3b; w3 is read by two convolutions. Each class shifts
 * the channels' means (acn_make_batch), so the net learns; two nets of one size start from the same parameters and
 * see the same batches. */
#ifndef DEFT_TEST_AMP_CONV_NET_H
#define DEFT_TEST_AMP_CONV_NET_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

#define ACN_HW 8
#define ACN_CLASSES 4

typedef struct amp_conv_net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step, *w3;
    deft_optimizer *opt;
    int64_t batch;
    deft_layout layout;
    float *hx;
    int32_t *hy;
} amp_conv_net;

static inline deft_tensor *acn_named(deft_tensor *t, const char *name) { return deft_set_name(t, name); }

static inline deft_tensor *acn_forward(amp_conv_net *n) {
    const deft_layout L = n->layout;
    const int c_axis = L == DEFT_NHWC ? 3 : 1;
    const deft_conv2d_options pad1 = {.padding = {1, 1}, .layout = L};
    const deft_pool2d_options two = {.kernel = {2, 2}, .layout = L};
    deft_tensor *h = acn_named(deft_conv2d_layer(n->x, 8, 3, 3, "c1", &pad1, 0), "c1");
    h = acn_named(deft_max_pool2d(deft_relu(h), &two), "p1");
    h = acn_named(deft_conv2d_layer(h, 16, 3, 3, "c2", &pad1, 1), "c2");
    deft_batch_norm_options bo = deft_batch_norm_defaults();
    bo.layout = L;
    h = deft_relu(acn_named(deft_batch_norm_layer(h, "bn2", &bo), "bn2"));
    h = acn_named(deft_avg_pool2d(h, &two), "p2");
    const deft_conv2d_options one = {.layout = L};
    h = acn_named(deft_conv2d_layer(h, 16, 1, 1, "c3", &one, 1), "c3a");
    n->w3 = deft_graph_find(n->g, "c3.weight");
    h = acn_named(deft_conv2d(deft_relu(h), n->w3, NULL, &one), "c3b");
    h = acn_named(deft_adaptive_avg_pool2d(h, 1, 1, L), "gap");
    if (!h) return NULL;
    h = deft_reshape(h, 2, (int64_t[]){n->batch, deft_tensor_dim(h, c_axis)});
    return acn_named(deft_linear(h, ACN_CLASSES, "fc", NULL), "logits");
}

static inline int acn_build(amp_conv_net *n, deft_device dev, int64_t batch, deft_layout layout) {
    *n = (amp_conv_net){.batch = batch, .layout = layout};
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 2468);
    const int64_t nhwc[4] = {batch, ACN_HW, ACN_HW, 3}, nchw[4] = {batch, 3, ACN_HW, ACN_HW};
    n->x = deft_input(n->g, "x", DEFT_F32, 4, layout == DEFT_NHWC ? nhwc : nchw, dev);
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){batch}, dev);
    n->loss = acn_named(deft_cross_entropy(acn_forward(n), n->y), "loss");
    CHECK_OK(deft_backward(n->loss));
    n->opt = deft_sgd(n->g, &(deft_sgd_options){.lr = 0.1, .momentum = 0.9}, NULL);
    n->step = deft_optimizer_step(n->opt);
    n->hx = malloc((size_t)(batch * ACN_HW * ACN_HW * 3) * sizeof *n->hx);
    n->hy = malloc((size_t)batch * sizeof *n->hy);
    int ok = n->step && n->w3 && n->hx && n->hy && deft_graph_error(n->g) == DEFT_OK;
    CHECK_MSG(ok, "building the conv net: %s", deft_graph_errmsg(n->g));
    return ok;
}

static inline void acn_free(amp_conv_net *n) {
    deft_graph_free(n->g);
    free(n->hx);
    free(n->hy);
    *n = (amp_conv_net){0};
}

static inline deft_program *acn_compile(amp_conv_net *n, const deft_compile_options *o) {
    return deft_compile(n->g, (deft_tensor *[]){n->loss, n->step}, 2, o);
}

/* Batch k: labels drawn at random; x uniform in [-1, 1] plus half of its class's channel pattern (drawn in NCHW order,
 * stored in the net's layout), so the label can be told from each channel's mean. */
static inline void acn_make_batch(amp_conv_net *n, uint64_t k) {
    static const float pattern[ACN_CLASSES][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {-1, -1, -1}};
    const int64_t hw = ACN_HW, img = 3 * hw * hw;
    uint64_t rng = 0xc0417ull + k;
    for (int64_t b = 0; b < n->batch; b++) n->hy[b] = (int32_t)(ref_unif(&rng, 0, ACN_CLASSES - 1e-9));
    for (int64_t i = 0; i < n->batch * img; i++) {
        const int64_t b = i / img, c = i / (hw * hw) % 3, pix = i % (hw * hw);
        const int64_t at = n->layout == DEFT_NHWC ? b * img + pix * 3 + c : i;
        n->hx[at] = (float)ref_unif(&rng, -1, 1) + 0.5f * pattern[n->hy[b]][c];
    }
}

/* Feeds batch k, runs one step and returns its loss (NaN when the run failed). */
static inline float acn_step(amp_conv_net *n, deft_program *p, uint64_t k) {
    float loss = NAN;
    acn_make_batch(n, k);
    CHECK_OK(deft_program_feed(p, n->x, n->hx, (size_t)(n->batch * ACN_HW * ACN_HW * 3) * sizeof *n->hx));
    CHECK_OK(deft_program_feed(p, n->y, n->hy, (size_t)n->batch * sizeof *n->hy));
    deft_status s = deft_program_run(p);
    CHECK_MSG(s == DEFT_OK, "run of batch %llu: %s", (unsigned long long)k, deft_errmsg());
    if (s == DEFT_OK) CHECK_OK(deft_program_read(p, n->loss, &loss, sizeof loss));
    return loss;
}

/* Two nets on dev from the same start, one in f32 and one under autocast L, trained side by side for `steps` steps:
 * every loss of L within 0.01 + 1 % of f32's, and falling by a fifth. Prints the largest difference and the loss
 * scale; returns the autocast program's CUDA Graph replays. */
static inline int64_t acn_check_follows_f32(deft_device dev, deft_dtype L, int64_t batch, int steps) {
    amp_conv_net a, b;
    if (!acn_build(&a, dev, batch, DEFT_NHWC) || !acn_build(&b, dev, batch, DEFT_NHWC)) return 0;
    deft_program *pa = acn_compile(&a, NULL), *pb = acn_compile(&b, &(deft_compile_options){.autocast = L});
    CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
    float first = NAN, last = NAN, worst = 0;
    for (int k = 0; pa && pb && k < steps; k++) {
        const float la = acn_step(&a, pa, (uint64_t)k), lb = acn_step(&b, pb, (uint64_t)k);
        CHECK_MSG(isfinite(lb) && fabsf(lb - la) <= 0.01f + 0.01f * fabsf(la), "%s step %d: loss %.6g, f32 %.6g",
                  deft_dtype_name(L), k, lb, la);
        if (fabsf(lb - la) > worst) worst = fabsf(lb - la);
        if (k == 0) first = lb;
        last = lb;
    }
    printf("conv net on %s, %s vs f32 over %d steps: largest loss difference %.4g; loss %.4g -> %.4g; %s\n",
           dev.type == DEFT_CPU ? "cpu" : "cuda", deft_dtype_name(L), steps, worst, first, last,
           pb && dev.type != DEFT_CPU ? deft_program_graph_status(pb) : "");
    CHECK_MSG(last < 0.8f * first, "%s did not learn: %.4g -> %.4g", deft_dtype_name(L), first, last);
    double scale;
    int64_t skipped;
    CHECK_OK(deft_optimizer_loss_scale(b.opt, &scale, &skipped));
    printf("  loss scale %g, %lld steps skipped\n", scale, (long long)skipped);
    const int64_t replays = pb ? deft_program_graph_replays(pb) : 0;
    acn_free(&a);
    acn_free(&b);
    return replays;
}

/* w3 (16 x 16 floats) into w. */
static inline void acn_w3(amp_conv_net *n, float *w) { CHECK_OK(deft_param_get(n->w3, w, 256 * sizeof *w)); }

/* Two nets of one size, compiled as pa and pb, trained side by side for `steps` steps: every loss and, at the end,
 * w3 must be the same bits. */
static inline void acn_check_same_bits(amp_conv_net *a, deft_program *pa, amp_conv_net *b, deft_program *pb,
                                       int steps, const char *what) {
    for (int k = 0; pa && pb && k < steps; k++) {
        const float la = acn_step(a, pa, (uint64_t)k), lb = acn_step(b, pb, (uint64_t)k);
        CHECK_MSG(isfinite(la) && memcmp(&la, &lb, sizeof la) == 0, "%s, step %d: loss %.9g and %.9g", what, k,
                  (double)la, (double)lb);
    }
    float wa[256], wb[256];
    acn_w3(a, wa);
    acn_w3(b, wb);
    CHECK_MSG(memcmp(wa, wb, sizeof wa) == 0, "%s: w3 differs", what);
}

#endif
