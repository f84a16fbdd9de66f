/* The networks bench_ddp trains, one replica per GPU: each builder makes replica k's training graph on its device
 * and feeds rank k's share of the global batch. Include after bench_util.h (die, CHECK, the hash). Header-only, as
 * bench_util.h: bench_ddp is one executable.
 *
 *   mid MLP    Linear(1024,1024)+ReLU x7, Linear(1024,10); batch 256 per GPU; SGD lr 0.01 momentum 0.9; weights
 *              from the hash (bench_set_linear), so the peer starts from the same ones
 *   ResNet-18  examples/resnet18.h (torchvision's layout, 10 classes, 32x32 images); batch 128 per GPU; SGD lr 0.01
 *              momentum 0.9 weight decay 5e-4, as bench_resnet; f32 NCHW, or NHWC for bf16 autocast (the layout
 *              is chosen here, the autocast is a compile option). Its weights are resnet18.h's draws (torch
 *              draws its own), so the peer's losses are alike, not equal.
 *   GPT-2      examples/gpt2.h (124M by default: 12 layers, width 768, 12 heads, vocabulary 50304; --layers, --seq and
 *              --batch change it), built by its own builder with seed 1337; AdamW lr 6e-4 betas 0.9 and 0.95 eps
 *              1e-8 weight decay 0.1 on the 2-D weights only, gradients clipped to norm 1.0, as bench_gpt2 and
 *              gpt2_train; bf16 autocast is the compile option. Tokens x[i] = hash32(1, k B T + i) mod V and
 *              y[i] = hash32(2, k B T + i) mod V for rank k (bench_gpt2's batch 0 on rank 0; bench/peers/ddp.py
 *              computes the same); the peer draws its own weights.
 *
 * Rank k's batch is rows k * batch .. (k + 1) * batch - 1 of the hashed streams (1: inputs, 2: labels), so the
 * global batch of N GPUs is the first N * batch rows and differs per rank. */
#ifndef DEFT_BENCH_DDP_MODELS_H
#define DEFT_BENCH_DDP_MODELS_H

#include "../examples/gpt2.h"
#include "../examples/resnet18.h"

#define DDP_MLP_LAYERS 8
#define DDP_MLP_WIDTH 1024
#define DDP_CLASSES 10
#define DDP_MLP_BATCH 256
#define DDP_RESNET_BATCH 128
#define DDP_RESNET_IMAGE 32

typedef struct ddp_replica {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_program *p;
    deft_optimizer *opt;   /* GPT-2's (its state's bytes are reported); NULL for the others */
} ddp_replica;

static void ddp_build_mlp(ddp_replica *r, deft_device dev) {
    r->g = deft_graph_new();
    r->x = deft_input(r->g, "x", DEFT_F32, 2, (int64_t[]){DDP_MLP_BATCH, DDP_MLP_WIDTH}, dev);
    r->y = deft_input(r->g, "y", DEFT_I32, 1, (int64_t[]){DDP_MLP_BATCH}, dev);
    deft_tensor *h = r->x;
    for (int l = 0; l < DDP_MLP_LAYERS; l++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l);
        h = deft_linear(h, l == DDP_MLP_LAYERS - 1 ? DDP_CLASSES : DDP_MLP_WIDTH, name, NULL);
        if (l < DDP_MLP_LAYERS - 1) h = deft_relu(h);
    }
    r->loss = deft_cross_entropy(h, r->y);
    if (!r->loss) die("building the MLP");
    CHECK(deft_backward(r->loss));
    for (int l = 0; l < DDP_MLP_LAYERS; l++)
        bench_set_linear(r->g, l, DDP_MLP_WIDTH, l == DDP_MLP_LAYERS - 1 ? DDP_CLASSES : DDP_MLP_WIDTH);
    r->step = deft_optimizer_step(deft_sgd(r->g, &(deft_sgd_options){.lr = 0.01, .momentum = 0.9}, NULL));
    if (!r->step) die("building the MLP's optimizer");
}

static void ddp_feed_mlp(ddp_replica *r, int k) {
    const int64_t n = (int64_t)DDP_MLP_BATCH * DDP_MLP_WIDTH, first = (int64_t)k * n;
    float *x = xmalloc((size_t)n * sizeof *x);
    int32_t *y = xmalloc((size_t)DDP_MLP_BATCH * sizeof *y);
    for (int64_t i = 0; i < n; i++) x[i] = hash_uniform(1, (uint64_t)(first + i), 1.0);
    for (int64_t i = 0; i < DDP_MLP_BATCH; i++)
        y[i] = (int32_t)(hash32(2, (uint64_t)((int64_t)k * DDP_MLP_BATCH + i)) % DDP_CLASSES);
    CHECK(deft_program_feed(r->p, r->x, x, (size_t)n * sizeof *x));
    CHECK(deft_program_feed(r->p, r->y, y, (size_t)DDP_MLP_BATCH * sizeof *y));
    free(x);
    free(y);
}

static deft_layout ddp_resnet_layout(int bf16) { return bf16 ? DEFT_NHWC : DEFT_NCHW; }

static void ddp_build_resnet(ddp_replica *r, deft_device dev, int bf16) {
    const resnet_config rc = resnet18_config(DDP_CLASSES, ddp_resnet_layout(bf16));
    const deft_sgd_options sgd = {.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-4};
    resnet_train t = {0};
    if (resnet_train_build(&t, &rc, DDP_RESNET_BATCH, 0, DDP_RESNET_IMAGE, dev, &sgd, 1) != DEFT_OK)
        die("building ResNet-18");
    *r = (ddp_replica){t.g, t.x, t.y, t.loss, t.step, NULL, NULL};
}

/* As bench_resnet's feed (x uniform in [-1, 1) indexed in NCHW order whatever the layout), from rank k's rows. */
static void ddp_feed_resnet(ddp_replica *r, int k, int bf16) {
    const int64_t n = (int64_t)DDP_RESNET_BATCH * 3 * DDP_RESNET_IMAGE * DDP_RESNET_IMAGE;
    float *x = xmalloc((size_t)n * sizeof *x);
    int32_t *y = xmalloc((size_t)DDP_RESNET_BATCH * sizeof *y);
    bench_image_batch(DDP_RESNET_BATCH, (int64_t)k * DDP_RESNET_BATCH, ddp_resnet_layout(bf16), DDP_CLASSES, x, y);
    CHECK(deft_program_feed(r->p, r->x, x, (size_t)n * sizeof *x));
    CHECK(deft_program_feed(r->p, r->y, y, (size_t)DDP_RESNET_BATCH * sizeof *y));
    free(x);
    free(y);
}

/* GPT-2's sizes in bench_ddp (gpt2_124m() with these changed). */
typedef struct ddp_gpt2_size {
    int64_t layers, batch, seq;
} ddp_gpt2_size;

static gpt2_config ddp_gpt2_config(const ddp_gpt2_size *z) {
    gpt2_config c = gpt2_124m();
    c.layers = z->layers;
    c.seq = z->seq;
    return c;
}

/* The training step bench_gpt2 times (examples/gpt2.h's model, backward, AdamW with clipping and weight decay on the
 * 2-D weights), built on dev. */
static void ddp_build_gpt2(ddp_replica *r, deft_device dev, const ddp_gpt2_size *z) {
    const gpt2_config c = ddp_gpt2_config(z);
    gpt2 m = {0};   /* m.g stays NULL when no graph could be made */
    if (gpt2_build(&m, &c, z->batch, dev, 1337) != DEFT_OK || deft_backward(m.loss) != DEFT_OK) {
        fprintf(stderr, "%s: building GPT-2: %s\n", prog, m.g ? deft_graph_errmsg(m.g) : deft_errmsg());
        exit(1);
    }
    const deft_adamw_options ao = {.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    deft_optimizer *opt = deft_adamw(m.g, &ao, &(deft_step_options){.max_grad_norm = 1.0});
    if (!opt || deft_optimizer_decay_2d_only(opt) != DEFT_OK) die("building GPT-2's optimizer");
    deft_tensor *step = deft_optimizer_step(opt);
    if (!step) die("building GPT-2's optimizer step");
    *r = (ddp_replica){m.g, m.x, m.y, m.loss, step, NULL, opt};
}

/* Rank k's tokens: rows k B .. (k + 1) B - 1 of the hashed streams. */
static void ddp_feed_gpt2(ddp_replica *r, int k, const ddp_gpt2_size *z) {
    const int64_t n = z->batch * z->seq, vocab = gpt2_124m().vocab;
    int32_t *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++) {
        x[i] = (int32_t)(hash32(1, (uint64_t)((int64_t)k * n + i)) % (uint64_t)vocab);
        y[i] = (int32_t)(hash32(2, (uint64_t)((int64_t)k * n + i)) % (uint64_t)vocab);
    }
    CHECK(deft_program_feed(r->p, r->x, x, (size_t)n * sizeof *x));
    CHECK(deft_program_feed(r->p, r->y, y, (size_t)n * sizeof *y));
    free(x);
    free(y);
}

/* The bytes of the optimizer's state on replica r's device: what the plan holds there beyond the parameters and
 * the batch (deft_program_footprint's persistent bytes: parameters, inputs, constants and the optimizer's flat
 * storage), so AdamW's moments (and its flat gradients where it keeps them), plus GPT-2's few constants (the
 * positions, T int32). Under ZeRO-1 it is the shard a rank holds. */
static size_t ddp_optimizer_state_bytes(const ddp_replica *r, deft_device dev) {
    deft_device_footprint fp[4];
    int n = 0;
    CHECK(deft_program_footprint(r->p, fp, 4, &n));
    size_t persistent = 0, leaves = deft_tensor_nbytes(r->x) + deft_tensor_nbytes(r->y);
    for (int i = 0; i < n; i++)
        if (deft_device_equal(fp[i].device, dev)) persistent += fp[i].persistent_bytes;
    for (int i = 0; i < deft_optimizer_param_count(r->opt); i++)
        leaves += deft_tensor_nbytes(deft_optimizer_param(r->opt, i));
    return persistent > leaves ? persistent - leaves : 0;
}

#endif
