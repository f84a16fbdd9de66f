/* bench_checkpoint: memory against time for activation checkpointing. One training step (forward, cross-entropy,
 * backward, SGD with momentum) compiled with DEFT_CHECKPOINT_BUDGET under a range of memory budgets, from none (no
 * checkpointing) down to the smallest budget that can be met; bench/peers/checkpoint.py runs the same step in PyTorch
 * with torch.utils.checkpoint.checkpoint_sequential over segment counts, and scripts/bench_checkpoint.sh prints both
 * as one table. One figure per line: `<name> <value> <unit>`. Two models (--model):
 *   mlp     (the default) a 36-layer MLP, Linear(2048, 2048) + ReLU x35 then Linear(2048, 10), batch 4096, f32
 *   resnet  ResNet-18 (examples/resnet18.h, as bench_resnet builds it: 10 classes, 32x32 images), batch 256, f32
 *           NHWC compiled with tf32 (the peer: torchvision's resnet18, channels_last, cuDNN's TF32 on), SGD with
 *           weight decay 5e-4; figures named checkpoint.resnet.deft.<pt>.* where the MLP's are checkpoint.deft.<pt>.*.
 *           On the CPU (--device cpu) batch 4: a check that every point runs, not a figure to compare.
 *
 *   ./bench_checkpoint [--model mlp|resnet] [--device cuda:N|cpu] [--layers L] [--width W] [--batch B] [--points K]
 *                      [--budgets b1,b2,...] [--plan-only] [--optimizer-in-backward]
 *
 * Points: "none" (no checkpointing) and "b1".."bK": budgets spread evenly from the plan without checkpointing down to
 * the smallest budget (the compile error of a 1-byte budget names it; K is 8 for the MLP, 5 for the ResNet), then any
 * --budgets given (bytes; the script passes PyTorch's peaks). The ResNet adds "sqrt": DEFT_CHECKPOINT_SEGMENTS with
 * checkpoint_segments 0 (the square root of its weighted layers). Per point: .budget_bytes, .plan_bytes (arena +
 * persistent, what the budget bounds), .dropped, .recompute_gflop, .peak_bytes (the caching allocator's peak of
 * allocated bytes over the point: parameters, optimizer state, the batch, the arena and cuBLAS's and cuDNN's
 * workspaces, as torch.cuda.max_memory_allocated), .step_ms (median over repeats, fastest and slowest beside it) and
 * .loss (after the timed steps). --plan-only plans every point without running (any device, the CPU too) and prints
 * the plan figures only. --optimizer-in-backward compiles every point with the compile option optimizer_in_backward
 * (each layer's update runs as soon as its gradient is computed, so the gradients never all live at once): the same
 * figures, for comparing the peaks with and without it.
 *
 * Inputs and initial weights come from the same index hash as bench_mlp_train and bench_resnet (the peer computes it
 * bit for bit), so for the MLP both sides train the same model on the same batch: the losses after the warm-up steps
 * agree to f32 rounding (the ResNet's convolution weights are drawn differently on each side: its losses agree
 * roughly). Timing as bench_mlp_train, with fewer, longer steps: WARMUP_STEPS steps, CALIBRATE_STEPS to choose N
 * steps of about TARGET_REPEAT_S, then REPEATS repeats of a host clock around N runs and a read of the loss. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench_checkpoint"
#include "../examples/resnet18.h"
#include "bench_util.h"

#define WARMUP_STEPS 5
#define CALIBRATE_STEPS 3
#define REPEATS 5
#define TARGET_REPEAT_S 0.3
#define MAX_POINTS 64
#define CLASSES 10

typedef struct net_config {
    int resnet;              /* --model resnet */
    int layers;
    int64_t width, batch;
} net_config;

typedef struct net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
} net;

static int64_t layer_out(const net_config *c, int l) { return l == c->layers - 1 ? CLASSES : c->width; }

/* bench_mlp_train's initial values (bench_util.h), so the losses can be compared with the peer's. */
static void set_params(const net *n, const net_config *c) {
    for (int l = 0; l < c->layers; l++) bench_set_linear(n->g, l, c->width, layer_out(c, l));
}

/* examples/resnet18.h's ResNet-18 in NHWC with bench_resnet's SGD (resnet.py's). */
static void build_resnet(net *n, const net_config *c, deft_device dev) {
    const resnet_config rc = resnet18_config(CLASSES, DEFT_NHWC);
    const deft_sgd_options sgd = {.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-4};
    resnet_train t = {0};
    deft_status s = resnet_train_build(&t, &rc, c->batch, 0, 32, dev, &sgd, 1);
    n->g = t.g;
    if (s != DEFT_OK) die("building the ResNet");
    n->x = t.x;
    n->y = t.y;
    n->loss = t.loss;
    n->step = t.step;
}

static void build(net *n, const net_config *c, deft_device dev) {
    if (c->resnet) {
        build_resnet(n, c, dev);
        return;
    }
    n->g = deft_graph_new();
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){c->batch, c->width}, dev);
    n->y = deft_input(n->g, "labels", DEFT_I32, 1, (int64_t[]){c->batch}, dev);
    deft_tensor *h = n->x;
    for (int l = 0; l < c->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "fc%d", l);
        h = deft_linear(h, layer_out(c, l), name, NULL);
        if (l < c->layers - 1) h = deft_relu(h);
    }
    n->loss = deft_cross_entropy(h, n->y);
    if (!n->loss) die("building the MLP");
    CHECK(deft_backward(n->loss));
    deft_optimizer *opt = deft_sgd(n->g, &(deft_sgd_options){.lr = 0.01, .momentum = 0.9}, NULL);
    n->step = opt ? deft_optimizer_step(opt) : NULL;
    if (!n->step) die("deft_sgd");
    set_params(n, c);
}

/* bench_resnet's batch: x uniform in [-1, 1) from stream 1 indexed in the NCHW order (stored NHWC), labels from
 * stream 2. */
static void feed_resnet(const net *n, deft_program *p, const net_config *c) {
    const size_t xn = (size_t)c->batch * 3 * 32 * 32;
    float *x = xmalloc(xn * sizeof *x);
    int32_t *y = xmalloc((size_t)c->batch * sizeof *y);
    bench_image_batch(c->batch, 0, DEFT_NHWC, CLASSES, x, y);
    CHECK(deft_program_feed(p, n->x, x, xn * sizeof *x));
    CHECK(deft_program_feed(p, n->y, y, (size_t)c->batch * sizeof *y));
    free(x);
    free(y);
}

static void feed(const net *n, deft_program *p, const net_config *c) {
    if (c->resnet) {
        feed_resnet(n, p, c);
        return;
    }
    size_t xn = (size_t)(c->batch * c->width);
    float *x = xmalloc(xn * sizeof *x);
    for (size_t i = 0; i < xn; i++) x[i] = hash_uniform(1, i, 1.0);
    CHECK(deft_program_feed(p, n->x, x, xn * sizeof *x));
    free(x);
    int32_t *y = xmalloc((size_t)c->batch * sizeof *y);
    for (int64_t i = 0; i < c->batch; i++) y[i] = (int32_t)(hash32(2, (uint64_t)i) % CLASSES);
    CHECK(deft_program_feed(p, n->y, y, (size_t)c->batch * sizeof *y));
    free(y);
}

static int optimizer_in_backward;   /* --optimizer-in-backward */
static int tf32;                    /* the ResNet's convolutions and fc may use TF32, as the peer's cuDNN does */
static const char *fig = "checkpoint.deft";   /* the figures' prefix: "checkpoint.resnet.deft" for the ResNet */

static deft_compile_options options(size_t budget) {
    return (deft_compile_options){.memory_budget = budget, .checkpoint = budget ? DEFT_CHECKPOINT_BUDGET : 0,
                                  .optimizer_in_backward = optimizer_in_backward, .tf32 = tf32};
}

/* DEFT_CHECKPOINT_SEGMENTS, as checkpoint_sequential (0 segments: the square root of the weighted layers). */
static deft_compile_options segment_options(int segments) {
    return (deft_compile_options){.checkpoint = DEFT_CHECKPOINT_SEGMENTS, .checkpoint_segments = segments,
                                  .optimizer_in_backward = optimizer_in_backward, .tf32 = tf32};
}

/* The plan's bytes (arena + persistent) without checkpointing, and the smallest budget checkpointing meets. */
static void plan_range(const net_config *c, deft_device dev, size_t *without, size_t *smallest) {
    net n;
    build(&n, c, dev);
    deft_tensor *outs[2] = {n.loss, n.step};
    deft_memory_report r;
    deft_compile_options none = options(0);
    CHECK(deft_plan_memory(n.g, outs, 2, &none, &r));
    *without = r.arena_bytes + r.persistent_bytes;
    deft_compile_options tiny = options(1);
    if (deft_plan_memory(n.g, outs, 2, &tiny, &r) == DEFT_OK) die("a budget of 1 byte was met");
    const char *m = strstr(deft_errmsg(), "fits is ");
    if (!m) die("reading the smallest budget");
    *smallest = (size_t)strtoull(m + 8, NULL, 10);
    deft_graph_free(n.g);
}

static float run_steps(const net *n, deft_program *p, int64_t k) {
    float loss = 0;
    for (int64_t i = 0; i < k; i++) CHECK(deft_program_run(p));
    CHECK(deft_program_read(p, n->loss, &loss, sizeof loss));
    return loss;
}

static void time_steps(const net *n, deft_program *p, const char *pt) {
    float warm = 0;
    for (int i = 0; i < WARMUP_STEPS; i++) warm = run_steps(n, p, 1);
    double t0 = seconds();
    run_steps(n, p, CALIBRATE_STEPS);
    double per = (seconds() - t0) / CALIBRATE_STEPS;
    int64_t k = (int64_t)ceil(TARGET_REPEAT_S / (per > 1e-9 ? per : 1e-9));
    if (k < 1) k = 1;
    double ms[REPEATS];
    float loss = 0;
    for (int r = 0; r < REPEATS; r++) {
        t0 = seconds();
        loss = run_steps(n, p, k);
        ms[r] = (seconds() - t0) / (double)k * 1e3;
    }
    sort_times(ms, REPEATS);
    printf("%s.%s.step_ms %.3f ms\n", fig, pt, ms[REPEATS / 2]);
    printf("%s.%s.step_ms_min %.3f ms\n", fig, pt, ms[0]);
    printf("%s.%s.step_ms_max %.3f ms\n", fig, pt, ms[REPEATS - 1]);
    printf("%s.%s.steps_per_repeat %lld count\n", fig, pt, (long long)k);
    printf("%s.%s.loss_warmup %.6f loss\n", fig, pt, (double)warm);
    printf("%s.%s.loss %.6f loss\n", fig, pt, (double)loss);
}

static void point(const net_config *c, deft_device dev, const char *pt, deft_compile_options co, int plan_only) {
    net n;
    const size_t budget = co.memory_budget;
    if (!plan_only) CHECK(deft_memory_empty_cache(dev));
    if (!plan_only) CHECK(deft_memory_reset_peak(dev));
    build(&n, c, dev);
    deft_tensor *outs[2] = {n.loss, n.step};
    double t0 = seconds();
    deft_program *p = NULL;
    deft_memory_report mr;
    if (plan_only) CHECK(deft_plan_memory(n.g, outs, 2, &co, &mr));
    else if (!(p = deft_compile(n.g, outs, 2, &co))) die("deft_compile");
    double compile_s = seconds() - t0;
    printf("%s.%s.budget_bytes %zu bytes\n", fig, pt, budget);
    printf("%s.%s.compile_s %.3f s\n", fig, pt, compile_s);
    if (plan_only) {
        printf("%s.%s.plan_bytes %zu bytes\n", fig, pt, mr.arena_bytes + mr.persistent_bytes);
        deft_graph_free(n.g);
        fflush(stdout);
        return;
    }
    deft_checkpoint_report r;
    CHECK(deft_program_checkpoint(p, &r));
    printf("%s.%s.plan_bytes %zu bytes\n", fig, pt, r.peak_bytes);
    printf("%s.%s.dropped %d count\n", fig, pt, r.dropped);
    printf("%s.%s.recompute_gflop %.3f GFLOP\n", fig, pt, r.recompute_flops / 1e9);
    feed(&n, p, c);
    time_steps(&n, p, pt);
    deft_memory_stats ms;
    CHECK(deft_memory_stats_get(dev, &ms));
    printf("%s.%s.peak_bytes %lld bytes\n", fig, pt, (long long)ms.allocated_bytes.peak);
    fflush(stdout);
    deft_graph_free(n.g);
}

static const char help[] =
    "usage: bench_checkpoint [--model mlp|resnet] [--device cuda:N|cpu] [--layers L] [--width W] [--batch B]\n"
    "                        [--points K] [--budgets b1,b2,...] [--plan-only] [--optimizer-in-backward]\n"
    "\n"
    "Memory against time for activation checkpointing: one training step compiled with DEFT_CHECKPOINT_BUDGET\n"
    "under budgets from none down to the smallest that can be met. One figure per line: <name> <value> <unit>.\n"
    "\n"
    "  --model mlp|resnet         the model (default: mlp, a 36-layer MLP of width 2048)\n"
    "  --device cuda:N|cpu        where it runs (default: cuda:0 when a GPU works, else the CPU)\n"
    "  --layers L                 the MLP's layers, 2 or more (default: 36)\n"
    "  --width W                  the MLP's width (default: 2048)\n"
    "  --batch B                  the batch (default: 4096 for the MLP, 256 for the ResNet, 4 on the CPU)\n"
    "  --points K                 budgets between none and the smallest (default: 8 for the MLP, 5 for the ResNet)\n"
    "  --budgets b1,b2,...        more budgets, in bytes (default: none)\n"
    "  --plan-only                plan every point without running it (default: run)\n"
    "  --optimizer-in-backward    compile with optimizer_in_backward (default: off)\n"
    "  -h, --help                 this help\n";

static void usage(void) {
    fprintf(stderr,
            "usage: %s [--model mlp|resnet] [--device cuda:N|cpu] [--layers L] [--width W] [--batch B] [--points K] "
            "[--budgets b1,b2,...] [--plan-only] [--optimizer-in-backward]\n",
            prog);
    exit(2);
}

int main(int argc, char **argv) {
    net_config c = {0, 36, 2048, 0};
    const char *device = NULL, *extra = "", *model = "mlp";
    int points = 0, plan_only = 0;
    bench_help(argc, argv, help);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) c.layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--width") && i + 1 < argc) c.width = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) c.batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--points") && i + 1 < argc) points = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--budgets") && i + 1 < argc) extra = argv[++i];
        else if (!strcmp(argv[i], "--plan-only")) plan_only = 1;
        else if (!strcmp(argv[i], "--optimizer-in-backward")) optimizer_in_backward = 1;
        else usage();
    }
    if (strcmp(model, "mlp") && strcmp(model, "resnet")) usage();
    c.resnet = !strcmp(model, "resnet");
    if (!points) points = c.resnet ? 5 : 8;
    if (c.layers < 2 || c.width < 1 || c.batch < 0 || points < 1 || points > MAX_POINTS) usage();
    deft_device dev;
    if (device) {
        deft_status s = deft_device_parse(device, &dev);
        if (s == DEFT_ERR_NO_CUDA) {
            printf("%s: skipped: %s (--device cpu --plan-only plans on the CPU)\n", prog, deft_errmsg());
            return 0;
        }
        if (s != DEFT_OK) die("--device");
    } else {
        if (deft_cuda_device_count() < 1 && !plan_only) {
            printf("%s: skipped: no usable CUDA device (--plan-only plans without one)\n", prog);
            return 0;
        }
        dev = deft_cuda_device_count() > 0 ? deft_cuda(0) : deft_cpu();
    }
    if (!c.batch) c.batch = !c.resnet ? 4096 : dev.type == DEFT_CPU ? 4 : 256;
    char dstr[32], what[96];
    if (c.resnet) {
        tf32 = 1;
        fig = "checkpoint.resnet.deft";
        snprintf(what, sizeof what, "ResNet-18 (32x32, 10 classes), batch %lld, f32 NHWC with TF32", (long long)c.batch);
    } else {
        snprintf(what, sizeof what, "%d layers of width %lld, batch %lld, f32", c.layers, (long long)c.width,
                 (long long)c.batch);
    }
    printf("# %s: deft %s on %s: %s, SGD%s%s\n", prog, deft_version(), deft_device_str(dev, dstr, sizeof dstr), what,
           optimizer_in_backward ? " in backward" : "", plan_only ? ", planned only" : "");
    size_t without, smallest;
    plan_range(&c, dev, &without, &smallest);
    printf("%s.plan_without_bytes %zu bytes\n", fig, without);
    printf("%s.smallest_budget_bytes %zu bytes\n", fig, smallest);
    fflush(stdout);
    point(&c, dev, "none", options(0), plan_only);
    for (int k = 0; k < points; k++) {
        char pt[16];
        snprintf(pt, sizeof pt, "b%d", k + 1);
        size_t budget = without - (size_t)((double)(without - smallest) * (k + 1) / points);
        point(&c, dev, pt, options(budget), plan_only);
    }
    if (c.resnet) point(&c, dev, "sqrt", segment_options(0), plan_only);
    int k = points;
    for (const char *s = extra; *s;) {
        char *end;
        unsigned long long b = strtoull(s, &end, 10);
        if (end == s) usage();
        char pt[16];
        snprintf(pt, sizeof pt, "b%d", ++k);
        if (b >= smallest) point(&c, dev, pt, options((size_t)b), plan_only);
        else printf("# %s: budget %llu is below the smallest (%zu): skipped\n", prog, b, smallest);
        s = *end == ',' ? end + 1 : end;
    }
    return 0;
}
