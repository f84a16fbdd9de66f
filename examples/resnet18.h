/* ResNet in torchvision's layout, built with deft: shared by examples/resnet18_cifar.c, bench/bench_resnet.c and
 * tests/test_resnet_small.c so that all three train the same network.
 *
 * torchvision.models.resnet18(num_classes=10): conv1 7x7 stride 2 pad 3 (no bias), bn1, ReLU, max pool 3x3 stride 2
 * pad 1; four stages of BasicBlocks ([2, 2, 2, 2]) of 64, 128, 256 and 512 channels, each stage after the first
 * starting with stride 2; a block is conv 3x3 (stride s) - bn - ReLU - conv 3x3 - bn, plus the input (through
 * downsample = conv 1x1 stride s + bn when the shape changes), then ReLU; adaptive average pool to 1x1; fc. The
 * parameters have torchvision's names ("layer2.0.downsample.0.weight", "fc.bias", ...) and its initialisation:
 * convolutions Kaiming-normal (fan_out, ReLU gain), batch norm weight 1 and bias 0, fc as torch.nn.Linear.
 *
 * The forward pass can be built more than once over the same parameters (found by name): the training pass with
 * batch norm in training mode, and an evaluation pass (eval = 1) on another input that normalises by the running
 * statistics the training steps update. */
#ifndef DEFT_EXAMPLES_RESNET18_H
#define DEFT_EXAMPLES_RESNET18_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "deft.h"

#define RESNET_MAX_STAGES 4

typedef struct resnet_config {
    int64_t classes;
    int64_t width;                   /* channels of the stem and the first stage; each later stage doubles them */
    int stages;                      /* 1..4 */
    int blocks[RESNET_MAX_STAGES];   /* BasicBlocks per stage */
    int imagenet_stem;               /* 1: conv 7x7/2 + max pool 3x3/2 (torchvision); 0: conv 3x3/1, no pool */
    deft_layout layout;
} resnet_config;

static inline resnet_config resnet18_config(int64_t classes, deft_layout layout) {
    return (resnet_config){classes, 64, 4, {2, 2, 2, 2}, 1, layout};
}

/* N(0, 1) from a 64-bit state: splitmix64 and Box-Muller. */
static inline double resnet_normal(uint64_t *state) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        u[i] = ((double)((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* torch.nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu"): N(0, 2 / (out * kh * kw)). */
static inline deft_status resnet_init_conv(deft_tensor *w, int64_t out, int64_t k, uint64_t seed) {
    int64_t n = deft_tensor_numel(w);
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return DEFT_ERR_OOM;
    double std = sqrt(2.0 / (double)(out * k * k));
    for (int64_t i = 0; i < n; i++) v[i] = (float)(std * resnet_normal(&seed));
    deft_status s = deft_param_set(w, v, (size_t)n * sizeof *v);
    free(v);
    return s;
}

/* A seed per parameter name (FNV-1a), so every conv gets its own draw whatever order the graph is built in. */
static inline uint64_t resnet_name_seed(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
    return h;
}

typedef struct resnet_builder {
    deft_graph *g;
    const resnet_config *c;
    int eval;                /* 1: batch norm on its running statistics */
} resnet_builder;

/* A convolution without bias named `name` (padding k / 2), made and initialised the first time, found by name after. */
static inline deft_tensor *resnet_conv(const resnet_builder *b, deft_tensor *x, const char *name, int64_t out,
                                       int64_t k, int64_t stride) {
    if (!x) return NULL;
    const deft_conv2d_options o = {.stride = {stride, stride}, .padding = {k / 2, k / 2}, .layout = b->c->layout};
    char wname[160];
    snprintf(wname, sizeof wname, "%s.weight", name);
    deft_tensor *w = deft_graph_find(b->g, wname);
    if (w) return deft_conv2d(x, w, NULL, &o);
    deft_tensor *y = deft_conv2d_layer(x, out, k, k, name, &o, 1);
    w = deft_graph_find(b->g, wname);
    if (!y || !w || resnet_init_conv(w, out, k, resnet_name_seed(wname)) != DEFT_OK) return NULL;
    return y;
}

/* torch.nn.BatchNorm2d named `name`, in the builder's mode, over the one set of parameters. */
static inline deft_tensor *resnet_bn(const resnet_builder *b, deft_tensor *x, const char *name) {
    if (!x) return NULL;
    deft_batch_norm_options o = deft_batch_norm_defaults();
    o.eval = b->eval;
    o.layout = b->c->layout;
    char n[4][160];
    const char *what[4] = {"weight", "bias", "running_mean", "running_var"};
    deft_tensor *t[4];
    for (int i = 0; i < 4; i++) {
        snprintf(n[i], sizeof n[i], "%s.%s", name, what[i]);
        t[i] = deft_graph_find(b->g, n[i]);
    }
    if (!t[0]) return deft_batch_norm_layer(x, name, &o);
    return deft_batch_norm(x, t[0], t[1], t[2], t[3], &o);
}

/* torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + downsample(x)). */
static inline deft_tensor *resnet_block(const resnet_builder *b, deft_tensor *x, const char *name, int64_t in,
                                        int64_t out, int64_t stride) {
    char n[64];
    snprintf(n, sizeof n, "%s.conv1", name);
    deft_tensor *h = resnet_conv(b, x, n, out, 3, stride);
    snprintf(n, sizeof n, "%s.bn1", name);
    h = deft_relu(resnet_bn(b, h, n));
    snprintf(n, sizeof n, "%s.conv2", name);
    h = resnet_conv(b, h, n, out, 3, 1);
    snprintf(n, sizeof n, "%s.bn2", name);
    h = resnet_bn(b, h, n);
    deft_tensor *identity = x;
    if (stride != 1 || in != out) {
        snprintf(n, sizeof n, "%s.downsample.0", name);
        identity = resnet_conv(b, x, n, out, 1, stride);
        snprintf(n, sizeof n, "%s.downsample.1", name);
        identity = resnet_bn(b, identity, n);
    }
    return deft_relu(deft_add(h, identity));
}

/* fc: torch.nn.Linear(in, classes), found by name after the first time. */
static inline deft_tensor *resnet_fc(const resnet_builder *b, deft_tensor *h) {
    deft_tensor *w = deft_graph_find(b->g, "fc.weight"), *bias = deft_graph_find(b->g, "fc.bias");
    if (w && bias) return deft_add(deft_matmul(h, w), bias);
    return deft_linear(h, b->c->classes, "fc", NULL);
}

/* The logits [N, classes] of images x (f32 [N, C, H, W] for NCHW, [N, H, W, C] for NHWC). */
static inline deft_tensor *resnet_forward(deft_graph *g, const resnet_config *c, deft_tensor *x, int eval) {
    const resnet_builder b = {g, c, eval};
    deft_tensor *h;
    if (c->imagenet_stem) {
        h = deft_relu(resnet_bn(&b, resnet_conv(&b, x, "conv1", c->width, 7, 2), "bn1"));
        h = deft_max_pool2d(h, &(deft_pool2d_options){.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1},
                                                      .layout = c->layout});
    } else {
        h = deft_relu(resnet_bn(&b, resnet_conv(&b, x, "conv1", c->width, 3, 1), "bn1"));
    }
    int64_t in = c->width;
    for (int s = 0; s < c->stages && s < RESNET_MAX_STAGES; s++) {
        int64_t out = c->width << s;
        for (int k = 0; k < c->blocks[s]; k++) {
            char name[32];
            snprintf(name, sizeof name, "layer%d.%d", s + 1, k);
            h = resnet_block(&b, h, name, in, out, k == 0 && s > 0 ? 2 : 1);
            in = out;
        }
    }
    h = deft_adaptive_avg_pool2d(h, 1, 1, c->layout);
    if (!h) return NULL;
    return resnet_fc(&b, deft_reshape(h, 2, (int64_t[]){deft_tensor_dim(h, 0), in}));
}

/* A training step (cross-entropy, backward, SGD) on inputs x ([batch] images) and y (i32 labels), and, when
 * eval_batch > 0, the evaluation logits of x_eval ([eval_batch] images) over the same parameters. */
typedef struct resnet_train {
    deft_graph *g;
    deft_tensor *x, *y, *logits, *loss, *step, *x_eval, *logits_eval;
    deft_optimizer *opt;
} resnet_train;

static inline deft_tensor *resnet_images(deft_graph *g, const char *name, const resnet_config *c, int64_t n,
                                         int64_t image, deft_device dev) {
    const int64_t nchw[4] = {n, 3, image, image}, nhwc[4] = {n, image, image, 3};
    return deft_input(g, name, DEFT_F32, 4, c->layout == DEFT_NHWC ? nhwc : nchw, dev);
}

/* Builds t's graph; on failure the status, with deft_errmsg() saying why (t->g is freed by the caller). */
static inline deft_status resnet_train_build(resnet_train *t, const resnet_config *c, int64_t batch,
                                             int64_t eval_batch, int64_t image, deft_device dev,
                                             const deft_sgd_options *sgd, uint64_t seed) {
    deft_graph *g = t->g = deft_graph_new();
    if (!g) return DEFT_ERR_OOM;
    deft_graph_set_seed(g, seed);
    t->x = resnet_images(g, "x", c, batch, image, dev);
    t->y = deft_input(g, "labels", DEFT_I32, 1, (int64_t[]){batch}, dev);
    t->logits = resnet_forward(g, c, t->x, 0);
    t->loss = deft_cross_entropy(t->logits, t->y);
    if (!t->loss) return deft_graph_error(g) ? deft_graph_error(g) : DEFT_ERR_INVALID;
    deft_status s = deft_backward(t->loss);
    if (s != DEFT_OK) return s;
    t->opt = deft_sgd(g, sgd, NULL);
    t->step = t->opt ? deft_optimizer_step(t->opt) : NULL;
    if (!t->step) return deft_graph_error(g) ? deft_graph_error(g) : DEFT_ERR_INVALID;
    if (eval_batch > 0) {
        t->x_eval = resnet_images(g, "x_eval", c, eval_batch, image, dev);
        t->logits_eval = resnet_forward(g, c, t->x_eval, 1);
        if (!t->logits_eval) return deft_graph_error(g) ? deft_graph_error(g) : DEFT_ERR_INVALID;
    }
    return DEFT_OK;
}

#endif
