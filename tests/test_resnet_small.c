/* A small ResNet (examples/resnet18.h's builder: a 3x3 stem of 8 channels, two stages of one BasicBlock each, the
 * second with stride 2 and a downsample branch, batch norm, adaptive average pool, fc) trained with SGD and
 * momentum on generated 8x8 colour images whose class is the quadrant holding a bright square; held-out accuracy
 * through the evaluation pass (batch norm on the running statistics the training steps updated) must pass 90%, in
 * NCHW and NHWC. ResNet-18 itself, as the example and the bench build it, has torchvision's parameters. The sqrt(n)
 * checkpoint segment policy counts its convolutions as layers. */
#include "check.h"
#include "ref.h"

#include "../examples/resnet18.h"

enum { S = 8, CLASSES = 4, TRAIN = 512, TEST = 256, BATCH = 32, EPOCHS = 6 };

/* NCHW images: noise in each channel, and a 3x3 square raised in all three inside the class's quadrant. */
static void make_dataset(uint64_t seed, int n, float *x, int32_t *y) {
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        int k = (int)(ref_next(&rng) % CLASSES), top = (k / 2) * 4, left = (k % 2) * 4;
        int r = top + (int)(ref_next(&rng) % 2), c = left + (int)(ref_next(&rng) % 2);
        float *img = x + (size_t)i * 3 * S * S;
        for (int p = 0; p < 3 * S * S; p++) img[p] = (float)ref_unif(&rng, 0.0, 0.5);
        for (int ch = 0; ch < 3; ch++)
            for (int dr = 0; dr < 3; dr++)
                for (int dc = 0; dc < 3; dc++) img[ch * S * S + (r + dr) * S + c + dc] += 1.0f;
        y[i] = k;
    }
}

static void to_nhwc(const float *in, float *out, int n) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < S * S; p++) out[((size_t)i * S * S + p) * 3 + c] = in[((size_t)i * 3 + c) * S * S + p];
}

static double train_and_test(deft_layout layout) {
    const resnet_config c = {CLASSES, 8, 2, {1, 1}, 0, layout};
    resnet_train t = {0};
    deft_status s = resnet_train_build(&t, &c, BATCH, TEST, S, deft_cpu(),
                                       &(deft_sgd_options){.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4}, 3);
    CHECK_MSG(s == DEFT_OK, "building: %s", deft_errmsg());
    CHECK(deft_graph_find(t.g, "layer2.0.downsample.0.weight") != NULL);
    CHECK(deft_graph_find(t.g, "layer1.0.downsample.0.weight") == NULL);   /* same shape: identity */
    deft_program *p = s == DEFT_OK ? deft_compile(t.g, (deft_tensor *[]){t.loss, t.step}, 2, NULL) : NULL;
    deft_program *pe = p ? deft_compile(t.g, &t.logits_eval, 1, NULL) : NULL;
    CHECK_MSG(p && pe, "compile: %s", deft_errmsg());

    float *xs = malloc(sizeof(float) * TRAIN * 3 * S * S), *xt = malloc(sizeof(float) * TEST * 3 * S * S);
    float *tmp = malloc(sizeof(float) * TRAIN * 3 * S * S), *out = malloc(sizeof(float) * TEST * CLASSES);
    int32_t ys[TRAIN], yt[TEST];
    make_dataset(21, TRAIN, xs, ys);
    make_dataset(22, TEST, xt, yt);
    if (layout == DEFT_NHWC) {
        to_nhwc(xs, tmp, TRAIN);
        memcpy(xs, tmp, sizeof(float) * TRAIN * 3 * S * S);
        to_nhwc(xt, tmp, TEST);
        memcpy(xt, tmp, sizeof(float) * TEST * 3 * S * S);
    }
    float l = NAN, first = NAN;
    const size_t img = 3 * S * S;
    for (int e = 0; pe && e < EPOCHS; e++)
        for (int b = 0; b < TRAIN / BATCH; b++) {
            CHECK_OK(deft_program_feed(p, t.x, xs + (size_t)b * BATCH * img, sizeof(float) * BATCH * img));
            CHECK_OK(deft_program_feed(p, t.y, ys + b * BATCH, sizeof(int32_t) * BATCH));
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, t.loss, &l, sizeof l));
            if (e == 0 && b == 0) first = l;
        }
    CHECK_MSG(isfinite(l) && l < 0.3f * first, "training loss %g from %g", l, first);

    /* The running statistics moved away from their start (zeros and ones). */
    float rm[8], rv[8];
    CHECK_OK(deft_param_get(deft_graph_find(t.g, "bn1.running_mean"), rm, sizeof rm));
    CHECK_OK(deft_param_get(deft_graph_find(t.g, "bn1.running_var"), rv, sizeof rv));
    int moved = 0;
    for (int i = 0; i < 8; i++) moved += rm[i] != 0.0f && rv[i] != 1.0f;
    CHECK_MSG(moved == 8, "only %d of 8 channels' running statistics moved", moved);

    int correct = 0;
    if (pe) {
        CHECK_OK(deft_program_feed(pe, t.x_eval, xt, sizeof(float) * TEST * img));
        CHECK_OK(deft_program_run(pe));
        CHECK_OK(deft_program_read(pe, t.logits_eval, out, sizeof(float) * TEST * CLASSES));
        for (int i = 0; i < TEST; i++) {
            int best = 0;
            for (int k = 1; k < CLASSES; k++)
                if (out[i * CLASSES + k] > out[i * CLASSES + best]) best = k;
            correct += best == yt[i];
        }
    }
    free(xs), free(xt), free(tmp), free(out);
    deft_graph_free(t.g);
    return (double)correct / TEST;
}

/* ResNet-18 as built for the example and the bench has torchvision's parameters: resnet18(num_classes=10) holds
 * 11,181,642 (sum of p.numel() over model.parameters()) and 9,600 running statistics (4,800 batch norm channels),
 * under torchvision's names, and gives [N, 10] logits for 32x32 images in either layout. Built and planned only. */
static void test_resnet18_layout(deft_layout layout) {
    const resnet_config c = resnet18_config(10, layout);
    deft_graph *g = deft_graph_new();
    deft_tensor *x = resnet_images(g, "x", &c, 2, 32, deft_cpu());
    deft_tensor *logits = resnet_forward(g, &c, x, 0);
    CHECK_MSG(logits != NULL, "building ResNet-18: %s", deft_errmsg());
    CHECK(logits && deft_tensor_ndim(logits) == 2);
    CHECK(logits && deft_tensor_dim(logits, 0) == 2 && deft_tensor_dim(logits, 1) == 10);
    deft_memory_report r;
    CHECK_OK(deft_plan_memory(g, &logits, 1, NULL, &r));
    const size_t want = (11181642u + 9600u + 2u * 3072u) * sizeof(float);   /* parameters, statistics, the input */
    CHECK_MSG(r.persistent_bytes == want, "persistent bytes %zu, torchvision's resnet18 and the input: %zu",
              r.persistent_bytes, want);
    const char *names[] = {"conv1.weight", "bn1.running_var", "layer1.1.conv2.weight", "layer2.0.downsample.0.weight",
                           "layer4.1.bn2.bias", "layer4.0.downsample.1.running_mean", "fc.weight", "fc.bias"};
    for (int i = 0; i < 8; i++) CHECK_MSG(deft_graph_find(g, names[i]) != NULL, "no parameter %s", names[i]);
    CHECK(deft_graph_find(g, "layer1.0.downsample.0.weight") == NULL);
    deft_tensor *w = deft_graph_find(g, "layer3.0.conv1.weight");
    const int64_t nchw[4] = {256, 128, 3, 3}, nhwc[4] = {256, 3, 3, 128};
    for (int i = 0; w && i < 4; i++) CHECK(deft_tensor_dim(w, i) == (layout == DEFT_NHWC ? nhwc : nchw)[i]);
    /* Kaiming-normal (fan_out): the standard deviation of conv1's weights near sqrt(2 / (64 * 7 * 7)). */
    float *v = malloc(64 * 3 * 7 * 7 * sizeof *v);
    CHECK_OK(deft_param_get(deft_graph_find(g, "conv1.weight"), v, 64 * 3 * 7 * 7 * sizeof *v));
    double ss = 0;
    for (int i = 0; i < 64 * 3 * 7 * 7; i++) ss += (double)v[i] * v[i];
    CHECK_NEAR(sqrt(ss / (64 * 3 * 7 * 7)), sqrt(2.0 / (64 * 7 * 7)), 0.05 * sqrt(2.0 / (64 * 7 * 7)));
    free(v);
    deft_graph_free(g);
}

/* Two training steps of a 4-stage small ResNet (13 weighted layers: 12 convolutions and fc) compiled with the policy
 * and segment count given; the losses into loss[2] and the checkpoint report into *r. */
static void two_steps(int policy, int segments, float loss[2], deft_checkpoint_report *r) {
    const resnet_config c = {CLASSES, 8, 4, {1, 1, 1, 1}, 0, DEFT_NHWC};
    const deft_sgd_options sgd = {.lr = 0.05, .momentum = 0.9};
    resnet_train t = {0};
    deft_status s = resnet_train_build(&t, &c, BATCH, 0, S, deft_cpu(), &sgd, 3);
    CHECK_MSG(s == DEFT_OK, "building: %s", deft_errmsg());
    const deft_compile_options o = {.checkpoint = policy, .checkpoint_segments = segments};
    deft_program *p = s == DEFT_OK ? deft_compile(t.g, (deft_tensor *[]){t.loss, t.step}, 2, &o) : NULL;
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    float *x = malloc(sizeof(float) * BATCH * 3 * S * S), *xh = malloc(sizeof(float) * BATCH * 3 * S * S);
    int32_t y[BATCH];
    make_dataset(5, BATCH, x, y);
    to_nhwc(x, xh, BATCH);
    for (int i = 0; p && i < 2; i++) {
        CHECK_OK(deft_program_feed(p, t.x, xh, sizeof(float) * BATCH * 3 * S * S));
        CHECK_OK(deft_program_feed(p, t.y, y, sizeof y));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, t.loss, &loss[i], sizeof loss[i]));
    }
    if (p) CHECK_OK(deft_program_checkpoint(p, r));
    free(x);
    free(xh);
    deft_program_free(p);
    deft_graph_free(t.g);
}

/* checkpoint_segments 0 counts convolutions as layers: a conv net gets sqrt(13) -> 4 segments (one matmul alone
 * would give one segment, which drops nothing), and the losses are those without checkpointing, bit for bit. */
static void test_default_segments(void) {
    float plain[2] = {0}, by_default[2] = {0}, four[2] = {0};
    deft_checkpoint_report r0 = {0}, rd = {0}, r4 = {0};
    two_steps(DEFT_CHECKPOINT_NONE, 0, plain, &r0);
    two_steps(DEFT_CHECKPOINT_SEGMENTS, 0, by_default, &rd);
    two_steps(DEFT_CHECKPOINT_SEGMENTS, 4, four, &r4);
    CHECK_MSG(rd.dropped > 0 && rd.peak_bytes < rd.peak_bytes_without, "default segments: dropped %d, peak %zu of %zu",
              rd.dropped, rd.peak_bytes, rd.peak_bytes_without);
    CHECK_MSG(rd.dropped == r4.dropped && rd.peak_bytes == r4.peak_bytes,
              "default segments dropped %d (peak %zu), 4 segments %d (peak %zu)", rd.dropped, rd.peak_bytes,
              r4.dropped, r4.peak_bytes);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(memcmp(&plain[i], &by_default[i], sizeof plain[i]) == 0 && isfinite(plain[i]),
                  "step %d: loss %.9g without checkpointing, %.9g with the default segments", i, plain[i],
                  by_default[i]);
}

int main(void) {
    test_default_segments();
    test_resnet18_layout(DEFT_NCHW);
    test_resnet18_layout(DEFT_NHWC);
    for (int layout = 0; layout < 2; layout++) {
        double acc = train_and_test(layout ? DEFT_NHWC : DEFT_NCHW);
        printf("small resnet %s: held-out accuracy %.3f\n", layout ? "NHWC" : "NCHW", acc);
        CHECK_MSG(acc > 0.9, "%s accuracy %.3f", layout ? "NHWC" : "NCHW", acc);
    }
    return deft_check_finish();
}
