/* bench_mlp_train: the time of one MLP training step (forward, loss, backward, optimizer update) compiled by deft, on
 * four sizes from launch-bound to matmul-bound. bench/peers/mlp_train.py runs the same steps in PyTorch (eager and
 * CUDA Graphs) and prints the same names with "torch_" in place of "deft_"; scripts/bench_mlp.sh runs both and
 * prints the ratios. One figure per line: `<name> <value> <unit>`.
 *
 *   ./bench_mlp_train [--config tiny|small|mid|large] [--device cuda:N|cpu] [--no-graphs]
 *                     [--no-fusion] [--tf32] [--feed device|host|prefetch] [--amp bf16|f16]
 *
 * The configurations (all f32; `layers` Linear layers, ReLU between them, none after the last):
 *   tiny   Linear(10, 1), batch 32, MSE against f32 targets [32, 1], SGD lr 0.01 (no momentum)
 *   small  Linear(256,256)+ReLU x3, Linear(256,10);   batch 64,   cross-entropy on i32 labels, SGD lr 0.01 momentum 0.9
 *   mid    Linear(1024,1024)+ReLU x7, Linear(1024,10); batch 256,  as small
 *   large  Linear(4096,4096)+ReLU x7, Linear(4096,10); batch 2048, as small
 * The input dimension is the width (10 for tiny). The inputs, targets, weights and biases are not drawn from deft's
 * generator but from a hash of each element's index (below), which mlp_train.py computes bit for bit the same, so
 * both start from the same model on the same batch: their losses at a given step agree to f32 rounding (TF32 is
 * off in the peer), which checks that both train the same network.
 *
 * Timing: the batch is fed once and stays on the device (the per-step feed is not measured here). 20 warm-up steps
 * (the loss of the first and of the 20th is printed), then 10 steps to estimate a step's time and choose N so that N
 * steps take about 100 ms, then 7 repeats of: a host clock around N deft_program_run calls and one read of the loss
 * (the read waits for the device). The figure is the median over the repeats of (time / N), with the fastest and
 * slowest repeat beside it. --no-graphs compiles with deft_compile_options.no_cuda_graphs (every step launched
 * kernel by kernel) and names the figures "deft_nographs_" instead of "deft_"; --no-fusion compiles with
 * deft_compile_options.no_fusion (one kernel per node) and adds "_nofusion" to the tag; --tf32 compiles with
 * deft_compile_options.tf32, runs mid and large unless --config says otherwise, and names the configuration
 * "<config>_tf32" (bench/peers/mlp_train.py --tf32 does the same in PyTorch). --device cpu runs tiny and small
 * (any one with --config). Without a usable GPU (and without --device cpu) the bench says so and exits 0.
 *
 * --feed says where each step's batch comes from (the figures' tag gets "_feed_host" / "_feed_prefetch"):
 *   device    (the default) the one batch above, fed once, stays on the device;
 *   host      FEED_BATCHES batches held in pageable host memory, cycled, each step fed by deft_program_feed
 *             (a synchronous copy before the run);
 *   prefetch  the same batches through a deft_loader (depth 3) whose thread copies each into a pinned buffer, fed
 *             by deft_loader_next (deft_program_feed_async: the copy of batch k+1 overlaps step k).
 * Batch k's inputs are the hash streams above at offset k * (elements of a batch); batch 0 is the device batch.
 *
 * --amp bf16|f16 compiles with deft_compile_options.autocast (f16 with the default dynamic loss scaling) and names
 * the configuration "<config>_bf16" / "<config>_f16" (every configuration runs; mlp_train.py --amp does the same with
 * torch.autocast and, for f16, a GradScaler). Beside the arena it prints the arena the f32 program plans for the same
 * graph (_arena_bytes_f32) and the ratio (_arena_over_f32); under f16 also the loss scale and the skipped steps at
 * the end. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench_mlp_train"
#include "bench_util.h"

#define WARMUP_STEPS 20
#define CALIBRATE_STEPS 10
#define REPEATS 7
#define TARGET_REPEAT_S 0.1
#define MAX_LAYERS 16
#define FEED_BATCHES 64

typedef enum feed_mode { FEED_DEVICE, FEED_HOST, FEED_PREFETCH } feed_mode;

typedef struct mlp_config {
    const char *name;
    int layers;
    int64_t in_dim, width, classes, batch;
    int mse;          /* 1: MSE against f32 targets [batch, classes]; 0: cross-entropy on i32 labels [batch] */
    double lr, momentum;
    int cpu_default;  /* run by --device cpu without --config */
} mlp_config;

static const mlp_config configs[] = {
    {"tiny", 1, 10, 1, 1, 32, 1, 0.01, 0.0, 1},
    {"small", 4, 256, 256, 10, 64, 0, 0.01, 0.9, 1},
    {"mid", 8, 1024, 1024, 10, 256, 0, 0.01, 0.9, 0},
    {"large", 8, 4096, 4096, 10, 2048, 0, 0.01, 0.9, 0},
};
#define N_CONFIGS ((int)(sizeof configs / sizeof configs[0]))

typedef struct mlp {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_optimizer *opt;
    deft_program *p;
    /* --feed host / prefetch: FEED_BATCHES batches in host memory, the next one to feed, and the loader */
    feed_mode feed;
    void *xs, *ys;
    size_t x_bytes, y_bytes;
    int64_t next_batch;
    deft_loader *loader;
} mlp;

static int64_t layer_in(const mlp_config *c, int l) { return l == 0 ? c->in_dim : c->width; }
static int64_t layer_out(const mlp_config *c, int l) { return l == c->layers - 1 ? c->classes : c->width; }

static void build(mlp *m, const mlp_config *c, deft_device dev, const deft_compile_options *co) {
    deft_graph *g = m->g = deft_graph_new();
    if (!g) die("deft_graph_new");
    m->x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){c->batch, c->in_dim}, dev);
    m->y = c->mse ? deft_input(g, "y", DEFT_F32, 2, (int64_t[]){c->batch, c->classes}, dev)
                  : deft_input(g, "labels", DEFT_I32, 1, (int64_t[]){c->batch}, dev);
    deft_tensor *h = m->x;
    for (int l = 0; l < c->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "fc%d", l);
        h = deft_linear(h, layer_out(c, l), name, NULL);
        if (l < c->layers - 1) h = deft_relu(h);
    }
    m->loss = c->mse ? deft_mse_loss(h, m->y) : deft_cross_entropy(h, m->y);
    if (!m->loss) die("building the forward pass");
    CHECK(deft_backward(m->loss));
    deft_optimizer *opt = m->opt = deft_sgd(g, &(deft_sgd_options){.lr = c->lr, .momentum = c->momentum}, NULL);
    if (!opt) die("deft_sgd");
    m->step = deft_optimizer_step(opt);
    if (!m->step) die("deft_optimizer_step");
    if (deft_graph_error(g) != DEFT_OK) {
        fprintf(stderr, "%s: building %s: %s\n", prog, c->name, deft_graph_errmsg(g));
        exit(1);
    }

    /* The shared initial values (bench_util.h), set before compiling. */
    for (int l = 0; l < c->layers; l++) bench_set_linear(g, l, layer_in(c, l), layer_out(c, l));

    m->p = deft_compile(g, (deft_tensor *[]){m->loss, m->step}, 2, co);
    if (!m->p) die("deft_compile");

    /* One fixed batch, fed once: it stays on the device for every step. */
    size_t xn = (size_t)(c->batch * c->in_dim);
    float *x = xmalloc(xn * sizeof *x);
    for (size_t i = 0; i < xn; i++) x[i] = hash_uniform(1, i, 1.0);
    CHECK(deft_program_feed(m->p, m->x, x, xn * sizeof *x));
    free(x);
    if (c->mse) {
        size_t yn = (size_t)(c->batch * c->classes);
        float *y = xmalloc(yn * sizeof *y);
        for (size_t i = 0; i < yn; i++) y[i] = hash_uniform(2, i, 1.0);
        CHECK(deft_program_feed(m->p, m->y, y, yn * sizeof *y));
        free(y);
    } else {
        int32_t *y = xmalloc((size_t)c->batch * sizeof *y);
        for (int64_t i = 0; i < c->batch; i++) y[i] = (int32_t)(hash32(2, (uint64_t)i) % (uint32_t)c->classes);
        CHECK(deft_program_feed(m->p, m->y, y, (size_t)c->batch * sizeof *y));
        free(y);
    }
}

/* Batch k of the cycled host data (the inputs at hash offset k * elements of a batch). */
static void make_feed_data(mlp *m, const mlp_config *c) {
    size_t xn = (size_t)(c->batch * c->in_dim), yn = c->mse ? (size_t)(c->batch * c->classes) : (size_t)c->batch;
    m->x_bytes = xn * sizeof(float);
    m->y_bytes = yn * (c->mse ? sizeof(float) : sizeof(int32_t));
    m->xs = xmalloc(m->x_bytes * FEED_BATCHES);
    m->ys = xmalloc(m->y_bytes * FEED_BATCHES);
    float *x = m->xs;
    for (size_t i = 0; i < xn * FEED_BATCHES; i++) x[i] = hash_uniform(1, i, 1.0);
    for (size_t i = 0; i < yn * FEED_BATCHES; i++) {
        if (c->mse) ((float *)m->ys)[i] = hash_uniform(2, i, 1.0);
        else ((int32_t *)m->ys)[i] = (int32_t)(hash32(2, (uint64_t)i) % (uint32_t)c->classes);
    }
}

/* The loader's thread: copies batch `index` of the host data into the pinned buffers (the "decode" of a real
 * pipeline). */
static deft_status fill_from_host(void *ctx, int64_t epoch, int64_t index, void *const *buffers) {
    (void)epoch;
    mlp *m = ctx;
    memcpy(buffers[0], (char *)m->xs + (size_t)index * m->x_bytes, m->x_bytes);
    memcpy(buffers[1], (char *)m->ys + (size_t)index * m->y_bytes, m->y_bytes);
    return DEFT_OK;
}

static void feed_next(mlp *m) {
    if (m->feed == FEED_HOST) {
        size_t k = (size_t)(m->next_batch++ % FEED_BATCHES);
        CHECK(deft_program_feed(m->p, m->x, (char *)m->xs + k * m->x_bytes, m->x_bytes));
        CHECK(deft_program_feed(m->p, m->y, (char *)m->ys + k * m->y_bytes, m->y_bytes));
    } else if (m->feed == FEED_PREFETCH) {
        deft_loader_batch b;
        do CHECK(deft_loader_next(m->loader, m->p, &b));
        while (b.end);   /* an epoch is FEED_BATCHES batches: go on into the next */
    }
}

static float run_steps(mlp *m, int64_t n) {
    float loss = 0;
    for (int64_t i = 0; i < n; i++) {
        feed_next(m);
        CHECK(deft_program_run(m->p));
    }
    CHECK(deft_program_read(m->p, m->loss, &loss, sizeof loss));
    return loss;
}

/* Matmul work of one step: forward, the weights' gradients, and the inputs' gradients of every layer but the first
 * (the batch needs no gradient). */
static double step_flop(const mlp_config *c) {
    double f = 0;
    for (int l = 0; l < c->layers; l++) f += (l ? 3.0 : 2.0) * 2.0 * (double)c->batch * layer_in(c, l) * layer_out(c, l);
    return f;
}

/* Under autocast: the arena the f32 program would plan for the same graph, and f16's loss scale. */
static void print_amp_figures(mlp *m, const deft_compile_options *co, const char *k, const char *tag, size_t arena) {
    deft_compile_options f32 = *co;
    f32.autocast = DEFT_F32;
    f32.loss_scale = (deft_loss_scale_options){0};
    deft_memory_report r;
    CHECK(deft_plan_memory(m->g, (deft_tensor *[]){m->loss, m->step}, 2, &f32, &r));
    printf("mlp_train.%s.%s_arena_bytes_f32 %zu bytes\n", k, tag, r.arena_bytes);
    printf("mlp_train.%s.%s_arena_over_f32 %.3f x\n", k, tag, r.arena_bytes ? (double)arena / (double)r.arena_bytes : 0.0);
    if (co->autocast != DEFT_F16) return;
    double scale;
    int64_t skipped;
    CHECK(deft_optimizer_loss_scale(m->opt, &scale, &skipped));
    printf("mlp_train.%s.%s_loss_scale %.0f scale\n", k, tag, scale);
    printf("mlp_train.%s.%s_skipped_steps %lld count\n", k, tag, (long long)skipped);
}

/* Runs kept alive under --repeat N --keep: timed once more, in build order, after the last run, then freed. */
#define MAX_REPEAT_RUNS 16
typedef struct kept_run {
    mlp m;
    char name[160];   /* the figure's name up to "_step_us" */
} kept_run;
static kept_run kept[MAX_REPEAT_RUNS];
static int n_kept;

/* The median of REPEATS timed repeats of n steps each (sorted times in us[]); returns the last loss. */
static float time_repeats(mlp *m, int64_t n, double *us) {
    float loss = 0;
    for (int r = 0; r < REPEATS; r++) {
        const double t0 = seconds();
        loss = run_steps(m, n);
        us[r] = (seconds() - t0) / (double)n * 1e6;
    }
    sort_times(us, REPEATS);
    return loss;
}

/* --keep: every kept run timed again after all were built and timed once. A run that was fast when first timed and
 * is slow now is slowed by what ran since (time, other programs); one slow both times, by how it was built. */
static void time_kept_again(void) {
    for (int i = 0; i < n_kept; i++) {
        double us[REPEATS];
        const int64_t n = (int64_t)ceil(TARGET_REPEAT_S / 1e-4);
        (void)time_repeats(&kept[i].m, n > 2000 ? 2000 : n, us);
        printf("%s_again_step_us %.2f us\n", kept[i].name, us[REPEATS / 2]);
    }
    for (int i = 0; i < n_kept; i++) {
        deft_loader_free(kept[i].m.loader);
        deft_graph_free(kept[i].m.g);
        free(kept[i].m.xs);
        free(kept[i].m.ys);
    }
    fflush(stdout);
}

/* --probe-second: after run 1 is timed, a second program of the same configuration goes through its life one stage
 * at a time (built and compiled with its batch fed; its first step; two more, which capture and replay its CUDA
 * Graph; freed), and run 1 is timed again after each stage: the first stage after which run 1 is slower names what
 * slows every later program. */
static const char *probe_trace;   /* --probe-trace PREFIX */

/* --probe-with FLAG (repeatable): a compile option (--no-fusion, --no-graphs or one of BENCH_AB_USAGE's) given to the
 * other program only (--probe-second's or --probe-other's), to tell which part of its first step leaves the first
 * program slower. */
#define MAX_PROBE_WITH 4
static const char *probe_with[MAX_PROBE_WITH];
static int n_probe_with;

static deft_compile_options probe_options(const deft_compile_options *co) {
    deft_compile_options o = *co;
    for (int i = 0; i < n_probe_with; i++) {
        char *one[] = {(char *)prog, (char *)probe_with[i]};
        int at = 1;
        if (!strcmp(probe_with[i], "--no-fusion")) o.no_fusion = 1;
        else if (!strcmp(probe_with[i], "--no-graphs")) o.no_cuda_graphs = 1;
        else if (!bench_ab_option(2, one, &at, &o)) {
            fprintf(stderr, "%s: --probe-with takes --no-fusion, --no-graphs or a switch of %s, not %s\n", prog,
                    BENCH_AB_USAGE, probe_with[i]);
            exit(2);
        }
    }
    return o;
}

/* With --probe-trace, one traced step of run 1 written to PREFIX_<stage>.json (deft_program_trace): each kernel's
 * time before and after a stage, to tell a slower kernel from a longer gap between kernels. */
static void probe_trace_at(mlp *first, const char *stage) {
    if (!probe_trace) return;
    char path[512];
    if (snprintf(path, sizeof path, "%s_%s.json", probe_trace, stage) >= (int)sizeof path)
        fprintf(stderr, "probe trace: the prefix %s is too long for a path\n", probe_trace);
    else if (deft_program_trace(first->p, path) != DEFT_OK)
        fprintf(stderr, "probe trace %s: %s\n", path, deft_errmsg());
}

static void probe_second(mlp *first, int64_t n, const mlp_config *c, deft_device dev, const deft_compile_options *co,
                         const char *k, const char *tag) {
    static const char *const stage[] = {"after_build", "after_first_step", "after_capture", "after_free"};
    mlp second = {.feed = FEED_DEVICE};
    const deft_compile_options second_co = probe_options(co);
    double us[REPEATS];
    probe_trace_at(first, "before");
    for (int s = 0; s < 4; s++) {
        if (s == 0) build(&second, c, dev, &second_co);
        else if (s == 1) (void)run_steps(&second, 1);
        else if (s == 2) (void)run_steps(&second, 2);
        else deft_graph_free(second.g);
        (void)time_repeats(first, n, us);
        printf("mlp_train.%s.%s_%s_step_us %.2f us\n", k, tag, stage[s], us[REPEATS / 2]);
        probe_trace_at(first, stage[s]);
    }
    fflush(stdout);
}

/* --probe-other N: as --probe-second, but the other program is y = 2 x + 1 over N floats on the same GPU, whatever
 * the configuration: if run 1 slows after this one's first step too, the cause is what any program's first step does
 * (and, between a small and a large N, whether the memory it first touches counts), not the MLP's own work.
 * --probe-kind matmul makes it y = x W (x [N / 1024, 1024], W [1024, 1024]: a cuBLASLt product), train the mean of
 * (x W)^2 with its backward pass and an SGD step: which part of a training step's first run slows the others. */
static int64_t probe_elems;
static enum {
    PROBE_SCALE, PROBE_MATMUL, PROBE_TRAIN, PROBE_LINEAR, PROBE_RELU,
    PROBE_CE, PROBE_MOMENTUM, PROBE_TWO, PROBE_BIAS, PROBE_TWICE
} probe_kind;
static const char *const probe_kind_names[] = {"scale", "matmul", "train", "linear", "relu",
                                               "ce",    "momentum", "two", "bias", "twice"};

/* The other program's graph; *out: what it computes; *labels: its class labels (all 0) for the kind ce. The kinds past
 * train each change one thing of train towards the MLP: linear adds a bias, relu a ReLU before the loss, ce takes
 * cross-entropy over 1024 classes as the loss, momentum gives SGD a momentum of 0.9; two trains x W1 + x W2 (two
 * parameters, no bias), twice x W + x W (two products, one parameter), bias trains x + b alone (a bias's broadcast and
 * its gradient's column sum, no product). */
static deft_tensor *probe_build(deft_graph *g, deft_device dev, deft_tensor **x, deft_tensor **labels) {
    if (probe_kind == PROBE_SCALE) {
        *x = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){probe_elems}, dev);
        return deft_add_scalar(deft_mul_scalar(*x, 2.0), 1.0);
    }
    const int64_t rows = probe_elems / 1024 > 0 ? probe_elems / 1024 : 1;
    *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){rows, 1024}, dev);
    deft_tensor *y;
    if (probe_kind == PROBE_LINEAR) y = deft_linear(*x, 1024, "probe", NULL);
    else if (probe_kind == PROBE_BIAS)
        y = deft_add(*x, deft_param(g, "b", DEFT_F32, 1, (int64_t[]){1024}, dev, DEFT_INIT_ZEROS));
    else if (probe_kind == PROBE_TWICE) {
        deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){1024, 1024}, dev, DEFT_INIT_XAVIER);
        y = deft_add(deft_matmul(*x, w), deft_matmul(*x, w));
    } else if (probe_kind == PROBE_TWO)
        y = deft_add(deft_matmul(*x, deft_param(g, "w1", DEFT_F32, 2, (int64_t[]){1024, 1024}, dev, DEFT_INIT_XAVIER)),
                     deft_matmul(*x, deft_param(g, "w2", DEFT_F32, 2, (int64_t[]){1024, 1024}, dev, DEFT_INIT_XAVIER)));
    else y = deft_matmul(*x, deft_param(g, "w", DEFT_F32, 2, (int64_t[]){1024, 1024}, dev, DEFT_INIT_XAVIER));
    if (probe_kind == PROBE_MATMUL || !y) return y;
    if (probe_kind == PROBE_RELU) y = deft_relu(y);
    deft_tensor *loss;
    if (probe_kind == PROBE_CE) {
        *labels = deft_input(g, "labels", DEFT_I32, 1, (int64_t[]){rows}, dev);
        loss = deft_cross_entropy(y, *labels);
    } else
        loss = deft_mean(deft_mul(y, y), 0, NULL, 0);
    if (!loss || deft_backward(loss) != DEFT_OK) return NULL;
    const double momentum = probe_kind == PROBE_MOMENTUM ? 0.9 : 0.0;
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 1e-6, .momentum = momentum}, NULL);
    return opt ? deft_optimizer_step(opt) : NULL;
}

static void probe_other(mlp *first, int64_t n, deft_device dev, const deft_compile_options *co, const char *k,
                        const char *tag) {
    static const char *const stage[] = {"after_build", "after_first_step", "after_capture", "after_free"};
    deft_graph *g = deft_graph_new();
    deft_tensor *x = NULL, *labels = NULL, *y = g ? probe_build(g, dev, &x, &labels) : NULL;
    deft_program *p = NULL;
    const size_t in_bytes = x ? deft_tensor_nbytes(x) : 0, out_bytes = y ? deft_tensor_nbytes(y) : 0;
    float *host = calloc((in_bytes > out_bytes ? in_bytes : out_bytes) / sizeof(float) + 1, sizeof(float));
    if (!host) die("probe-other: host memory");
    double us[REPEATS];
    for (int s = 0; s < 4; s++) {
        if (s == 0) {
            const deft_compile_options other_co = probe_options(co);
            if (!y || !(p = deft_compile(g, &y, 1, &other_co))) die("probe-other: build");
            CHECK(deft_program_feed(p, x, host, in_bytes));
            if (labels) CHECK(deft_program_feed(p, labels, host, deft_tensor_nbytes(labels)));
        } else if (s == 3) {
            deft_program_free(p);
            deft_graph_free(g);
        } else {
            for (int i = 0; i < s; i++) CHECK(deft_program_run(p));   /* the first eager; then capture, replay */
            CHECK(deft_program_read(p, y, host, out_bytes));
        }
        (void)time_repeats(first, n, us);
        printf("mlp_train.%s.%s_other_%s%lld_%s_step_us %.2f us\n", k, tag, probe_kind_names[probe_kind],
               (long long)probe_elems, stage[s], us[REPEATS / 2]);
    }
    free(host);
    fflush(stdout);
}


/* run: 1 for the first build of a configuration in this process; --repeat's later ones (2, 3, ...) name their
 * figures "_run<k>", so one log holds them all. */
static void bench(const mlp_config *c, deft_device dev, const deft_compile_options *co, feed_mode feed, int run,
                  int keep, int probe) {
    static const char *const feed_tags[] = {"", "_feed_host", "_feed_prefetch"};
    char tag[80], k[48], run_tag[16] = "";
    if (run > 1) snprintf(run_tag, sizeof run_tag, "_run%d", run);
    snprintf(tag, sizeof tag, "%s%s%s%s", co->no_cuda_graphs ? "deft_nographs" : "deft",
             co->no_fusion ? "_nofusion" : "", feed_tags[feed], run_tag);
    snprintf(k, sizeof k, "%s%s%s", c->name, co->tf32 ? "_tf32" : "",
             co->autocast == DEFT_BF16 ? "_bf16" : co->autocast == DEFT_F16 ? "_f16" : "");
    mlp m = {.feed = feed};
    CHECK(deft_memory_reset_peak(dev));
    build(&m, c, dev, co);
    if (feed != FEED_DEVICE) make_feed_data(&m, c);
    if (feed == FEED_PREFETCH)
        CHECK(deft_loader_new((deft_tensor *[]){m.x, m.y}, 2, FEED_BATCHES, 3, fill_from_host, &m, &m.loader));

    float loss_first = run_steps(&m, 1), loss_warmup = 0;
    for (int i = 1; i < WARMUP_STEPS; i++) loss_warmup = run_steps(&m, 1);
    int64_t steps = WARMUP_STEPS;

    double t0 = seconds();
    run_steps(&m, CALIBRATE_STEPS);
    double per = (seconds() - t0) / CALIBRATE_STEPS;
    steps += CALIBRATE_STEPS;
    int64_t n = (int64_t)ceil(TARGET_REPEAT_S / (per > 1e-9 ? per : 1e-9));
    if (n < 1) n = 1;
    if (n > 1000000) n = 1000000;

    double us[REPEATS];
    const float loss = time_repeats(&m, n, us);
    steps += REPEATS * n;

    deft_memory_report mr;
    CHECK(deft_program_memory(m.p, &mr));
    deft_device_footprint fp[4];
    int nfp = 0;
    CHECK(deft_program_footprint(m.p, fp, 4, &nfp));
    size_t footprint = 0, activations = 0;
    for (int i = 0; i < nfp; i++) footprint += fp[i].total_bytes, activations += fp[i].activation_bytes;
    deft_memory_stats ms;
    CHECK(deft_memory_stats_get(dev, &ms));

    printf("mlp_train.%s.step_gflop %.6f GFLOP\n", k, step_flop(c) / 1e9);
    printf("mlp_train.%s.%s_step_us %.2f us\n", k, tag, us[REPEATS / 2]);
    printf("mlp_train.%s.%s_step_us_min %.2f us\n", k, tag, us[0]);
    printf("mlp_train.%s.%s_step_us_max %.2f us\n", k, tag, us[REPEATS - 1]);
    printf("mlp_train.%s.%s_steps_per_repeat %lld count\n", k, tag, (long long)n);
    printf("mlp_train.%s.%s_tflops %.3f TFLOP/s\n", k, tag, step_flop(c) / (us[REPEATS / 2] * 1e-6) / 1e12);
    printf("mlp_train.%s.%s_arena_bytes %zu bytes\n", k, tag, mr.arena_bytes);
    printf("mlp_train.%s.%s_persistent_bytes %zu bytes\n", k, tag, mr.persistent_bytes);
    printf("mlp_train.%s.%s_footprint_bytes %zu bytes\n", k, tag, footprint);
    printf("mlp_train.%s.%s_activation_bytes %zu bytes\n", k, tag, activations);
    printf("mlp_train.%s.%s_peak_bytes %lld bytes\n", k, tag, (long long)ms.allocated_bytes.peak);
    printf("mlp_train.%s.%s_loss_first %.6f loss\n", k, tag, (double)loss_first);
    printf("mlp_train.%s.%s_loss_warmup %.6f loss\n", k, tag, (double)loss_warmup);
    printf("mlp_train.%s.%s_loss %.6f loss\n", k, tag, (double)loss);
    printf("mlp_train.%s.%s_loss_steps %lld count\n", k, tag, (long long)steps);
    if (co->autocast != DEFT_F32) print_amp_figures(&m, co, k, tag, mr.arena_bytes);
    fflush(stdout);
    if (keep && n_kept < MAX_REPEAT_RUNS) {
        double again[REPEATS];
        (void)time_repeats(&m, n, again);   /* at once, before anything else is built: the same state */
        printf("mlp_train.%s.%s_at_once_step_us %.2f us\n", k, tag, again[REPEATS / 2]);
        if (probe && run == 1 && probe_elems > 0) probe_other(&m, n, dev, co, k, tag);
        else if (probe && run == 1) probe_second(&m, n, c, dev, co, k, tag);
        kept[n_kept].m = m;
        snprintf(kept[n_kept++].name, sizeof kept[0].name, "mlp_train.%s.%s", k, tag);
        return;
    }
    deft_loader_free(m.loader);   /* before the graph: its buffers may still be read by the last copies */
    deft_graph_free(m.g);
    free(m.xs);
    free(m.ys);
}

static const char help[] =
    "usage: bench_mlp_train [--config tiny|small|mid|large] [--device cuda:N|cpu] [--no-graphs] [--no-fusion]\n"
    "                       [--tf32] [--feed device|host|prefetch] [--amp bf16|f16] [--repeat N] [--keep]\n"
    "                       [--probe-second [--probe-trace PREFIX] [--probe-with FLAG] | --probe-other N\n"
    "                       [--probe-kind K]] [A/B options]\n"
    "\n"
    "The time of one MLP training step (forward, loss, backward, optimizer update) compiled by deft, on four sizes\n"
    "from launch-bound to matmul-bound. One figure per line: <name> <value> <unit>.\n"
    "\n"
    "  --config tiny|small|mid|large   one configuration (default: every one; tiny and small on the CPU)\n"
    "  --device cuda:N|cpu             where it runs (default: cuda:0 when a GPU works, else the CPU)\n"
    "  --no-graphs                     no CUDA Graphs (default: graphs)\n"
    "  --no-fusion                     the compile option no_fusion (default: fusion on)\n"
    "  --tf32                          the compile option tf32 (default: off)\n"
    "  --feed device|host|prefetch     where each step's batch comes from (default: device, fed once)\n"
    "  --amp bf16|f16                  autocast (default: off, f32)\n"
    BENCH_AB_HELP
    "  --repeat N                      build and time each configuration N times in this process, the later\n"
    "                                  runs' figures named _run2, _run3, ... (default: 1; at most 16)\n"
    "  --keep                          with --repeat, time each run twice at once (_at_once_step_us), keep its\n"
    "                                  program alive and, after the last run, time each once more in build order\n"
    "                                  (_again_step_us; default: freed)\n"
    "  --probe-second                  --keep, and after run 1 a second program of the configuration built, run\n"
    "                                  once, captured and freed, run 1 timed after each (_after_<stage>_step_us)\n"
    "  --probe-other N                 as --probe-second with y = 2 x + 1 over N floats as the other program\n"
    "                                  (_other_scale<N>_after_<stage>_step_us)\n"
    "  --probe-kind K                  the other program: scale, y = 2 x + 1 (default); matmul, y = x W with\n"
    "                                  x [N / 1024, 1024]; train, the mean of (x W)^2 with its backward pass and an\n"
    "                                  SGD step; linear, relu, ce, momentum: train with a bias, a ReLU, cross-entropy\n"
    "                                  as the loss, or SGD's momentum; two, x W1 + x W2; twice, x W + x W; bias,\n"
    "                                  x + b alone\n"
    "  --probe-trace PREFIX            with --probe-second, a traced step of run 1 before and after each stage,\n"
    "                                  written to PREFIX_<stage>.json (scripts/trace_summary.py reads them)\n"
    "  --probe-with FLAG               --no-fusion, --no-graphs or an A/B option given to the other program only\n"
    "                                  (--probe-second's or --probe-other's; repeatable, at most 4; default: the\n"
    "                                  first's options)\n"
    "  -h, --help                      this help\n";

static void usage(void) {
    fprintf(stderr,
            "usage: %s [--config tiny|small|mid|large] [--device cuda:N|cpu] [--no-graphs] "
            "[--no-fusion] [--tf32] [--feed device|host|prefetch] [--amp bf16|f16] [--repeat N] [--keep] "
            "[--probe-second [--probe-with FLAG] | --probe-other N [--probe-kind K]] "
            BENCH_AB_USAGE "\n",
            prog);
    exit(2);
}

int main(int argc, char **argv) {
    const char *only = NULL, *device = NULL;
    deft_compile_options co = {0};
    feed_mode feed = FEED_DEVICE;
    int repeat = 1, keep = 0, probe = 0;
    bench_help(argc, argv, help);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--no-graphs")) co.no_cuda_graphs = 1;
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            char *end = NULL;
            const long r = strtol(argv[++i], &end, 10);
            if (!end || *end || r < 1 || r > MAX_REPEAT_RUNS) {
                fprintf(stderr, "%s: --repeat takes 1 to %d, not %s\n", prog, MAX_REPEAT_RUNS, argv[i]);
                return 2;
            }
            repeat = (int)r;
        }
        else if (!strcmp(argv[i], "--keep")) keep = 1;
        else if (!strcmp(argv[i], "--probe-second")) keep = probe = 1;
        else if (!strcmp(argv[i], "--probe-trace") && i + 1 < argc) probe_trace = argv[++i];
        else if (!strcmp(argv[i], "--probe-with") && i + 1 < argc) {
            if (n_probe_with == MAX_PROBE_WITH) {
                fprintf(stderr, "%s: at most %d --probe-with\n", prog, MAX_PROBE_WITH);
                return 2;
            }
            probe_with[n_probe_with++] = argv[++i];
        }
        else if (!strcmp(argv[i], "--probe-other") && i + 1 < argc) {
            char *end = NULL;
            const long long e = strtoll(argv[++i], &end, 10);
            if (!end || *end || e < 1 || e > ((int64_t)1 << 31)) {
                fprintf(stderr, "%s: --probe-other takes 1 to 2^31 floats, not %s\n", prog, argv[i]);
                return 2;
            }
            probe_elems = e;
            keep = probe = 1;
        } else if (!strcmp(argv[i], "--probe-kind") && i + 1 < argc) {
            const char *kind = argv[++i];
            if (!strcmp(kind, "scale")) probe_kind = PROBE_SCALE;
            else if (!strcmp(kind, "matmul")) probe_kind = PROBE_MATMUL;
            else {
                int found = 0;
                for (int k = PROBE_TRAIN; k <= PROBE_TWICE && !found; k++)
                    if (!strcmp(kind, probe_kind_names[k])) probe_kind = k, found = 1;
                if (!found) usage();
            }
        }
        else if (!strcmp(argv[i], "--no-fusion")) co.no_fusion = 1;
        else if (!strcmp(argv[i], "--tf32")) co.tf32 = 1;
        else if (!strcmp(argv[i], "--amp") && i + 1 < argc) {
            const char *a = argv[++i];
            if (!strcmp(a, "bf16")) co.autocast = DEFT_BF16;
            else if (!strcmp(a, "f16")) co.autocast = DEFT_F16;
            else usage();
        }
        else if (!strcmp(argv[i], "--feed") && i + 1 < argc) {
            const char *f = argv[++i];
            if (!strcmp(f, "device")) feed = FEED_DEVICE;
            else if (!strcmp(f, "host")) feed = FEED_HOST;
            else if (!strcmp(f, "prefetch")) feed = FEED_PREFETCH;
            else usage();
        }
        else if (!bench_ab_option(argc, argv, &i, &co)) usage();
    }
    (void)probe_options(&co);   /* a bad --probe-with is refused before anything runs */
    if (only) {
        int found = 0;
        for (int i = 0; i < N_CONFIGS; i++) found |= !strcmp(configs[i].name, only);
        if (!found) {
            fprintf(stderr, "%s: unknown config %s (tiny, small, mid, large)\n", prog, only);
            return 2;
        }
    }

    deft_device dev;
    if (device) {
        deft_status s = deft_device_parse(device, &dev);
        if (s == DEFT_ERR_NO_CUDA) {
            printf("%s: skipped: %s (--device cpu runs tiny and small on the CPU)\n", prog, deft_errmsg());
            return 0;
        }
        if (s != DEFT_OK) die("--device");
    } else {
        if (deft_cuda_device_count() < 1) {
            printf("%s: skipped: no usable CUDA device (--device cpu runs tiny and small on the CPU)\n", prog);
            return 0;
        }
        dev = deft_cuda(0);
    }
    char dname[256], dstr[32];
    CHECK(deft_device_name(dev, dname, sizeof dname));
    printf("# %s: deft %s on %s (%s)%s%s%s%s%s\n", prog, deft_version(), deft_device_str(dev, dstr, sizeof dstr),
           dname, co.no_cuda_graphs ? ", CUDA Graphs off" : "", co.no_fusion ? ", fusion off" : "",
           co.tf32 ? ", TF32 on" : "", co.autocast != DEFT_F32 ? ", autocast " : "",
           co.autocast != DEFT_F32 ? deft_dtype_name(co.autocast) : "");
    fflush(stdout);

    for (int i = 0; i < N_CONFIGS; i++) {
        const mlp_config *c = &configs[i];
        if (only ? strcmp(c->name, only) != 0 : dev.type == DEFT_CPU && !c->cpu_default) continue;
        if (!only && co.tf32 && c->cpu_default) continue;   /* TF32 figures: mid and large */
        for (int run = 1; run <= repeat; run++) bench(c, dev, &co, feed, run, keep, probe);
    }
    time_kept_again();
    return 0;
}
