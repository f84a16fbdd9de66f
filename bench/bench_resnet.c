/* bench_resnet: images per second of a ResNet-18 training step (torchvision's layout with 10 classes, 32x32 inputs:
 * examples/resnet18.h; forward, cross-entropy, backward, SGD with momentum 0.9 and weight decay 5e-4) compiled by
 * deft, and the device memory it needs. bench/peers/resnet.py runs the same steps in PyTorch (torchvision's
 * resnet18, eager and CUDA Graphs) and prints the same names with "torch_eager_" / "torch_graph_" in place of
 * "deft_"; scripts/bench_resnet.sh runs both and prints the ratios. One figure per line: `<name> <value> <unit>`.
 *
 *   ./bench_resnet [--batch N] [--precision f32|bf16|f16] [--device cuda:N|cpu] [--no-graphs] [--tf32] [--nhwc]
 *
 * The configurations, named "b<batch>_<precision>": batch 128 and 512 (or --batch), each in
 *   f32    NCHW (NHWC with --nhwc), every op in f32 (--tf32 compiles with deft_compile_options.tf32, and the peer's
 *          --tf32 lets its matmuls use TF32; its convolutions use cuDNN's TF32 as torch does by default unless
 *          --no-cudnn-tf32)
 *   bf16   NHWC, compiled with deft_compile_options.autocast = DEFT_BF16 (the peer: channels_last and
 *          torch.autocast(dtype=torch.bfloat16)): convolutions and fc in bf16, batch norm on bf16 x with f32
 *          weight and statistics, pooling in its input's dtype (ir/autocast_image.c)
 *   f16    as bf16 with DEFT_F16 and its dynamic loss scaling on the device (the peer: a GradScaler); the scale and
 *          the skipped steps are printed
 * The batch is generated (x uniform in [-1, 1) and labels from an integer hash of each element's index, the same
 * values as the peer's), fed once and kept on the device: the per-step feed is not measured.
 *
 * Timing (as bench_mlp_train): 20 warm-up steps (the loss of the first and of the 20th printed), 10 steps to choose N
 * so that N steps take about 200 ms, then 7 repeats of a host clock around N deft_program_run calls and one read of
 * the loss; the figures are the median of (time / N) and batch / that time, with the fastest and slowest repeat.
 * CUDA Graphs are on (the program replays the step from its second run); --no-graphs turns them off and names the
 * figures "deft_nographs_". Memory: deft_peak_bytes is the caching allocator's peak of allocated bytes from before
 * the graph was built to the end (parameters, gradients, momentum, the batch, the arena, workspaces), as
 * torch.cuda.max_memory_allocated; the planned arena and persistent bytes beside it, and deft_activation_bytes (of
 * the arena, the peak of forward values kept for the backward pass: deft_device_footprint.activation_bytes).
 * --device cpu runs batch 16 with fewer steps (a check that it runs, not a figure to compare). Without a usable GPU (and without --device cpu)
 * the bench says so and exits 0. A configuration that fails prints "# <config>: ..." with the reason and the others
 * still run; the exit status is then 1. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench_resnet"
#include "../examples/resnet18.h"
#include "bench_util.h"

#define REPEATS 7
#define TARGET_REPEAT_S 0.2

typedef struct bench_config {
    int64_t batch;
    deft_dtype precision;   /* DEFT_F32, or the autocast dtype */
} bench_config;

typedef struct timing {
    int warmup, calibrate;
} timing;

/* The data, as resnet.py makes it (bench_util.h's bench_image_batch). */
static deft_status feed_batch(deft_program *p, const resnet_train *t, int64_t batch, deft_layout layout) {
    const size_t n = (size_t)batch * 3 * 32 * 32;
    float *x = malloc(n * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    deft_status s = x && y ? DEFT_OK : DEFT_ERR_OOM;
    if (s == DEFT_OK) bench_image_batch(batch, 0, layout, 10, x, y);
    if (s == DEFT_OK) s = deft_program_feed(p, t->x, x, n * sizeof *x);
    if (s == DEFT_OK) s = deft_program_feed(p, t->y, y, (size_t)batch * sizeof *y);
    free(x);
    free(y);
    return s;
}

static deft_status run_steps(deft_program *p, const resnet_train *t, int64_t n, float *loss) {
    deft_status s = DEFT_OK;
    for (int64_t i = 0; s == DEFT_OK && i < n; i++) s = deft_program_run(p);
    if (s == DEFT_OK) s = deft_program_read(p, t->loss, loss, sizeof *loss);
    return s;
}

typedef struct result {
    double us[REPEATS];
    int64_t n, steps;
    float loss_first, loss_warmup, loss;
} result;

static deft_status measure(deft_program *p, const resnet_train *t, const timing *tm, result *r) {
    deft_status s = run_steps(p, t, 1, &r->loss_first);
    for (int i = 1; s == DEFT_OK && i < tm->warmup; i++) s = run_steps(p, t, 1, &r->loss_warmup);
    double t0 = seconds();
    if (s == DEFT_OK) s = run_steps(p, t, tm->calibrate, &r->loss);
    double per = (seconds() - t0) / tm->calibrate;
    r->n = (int64_t)ceil(TARGET_REPEAT_S / (per > 1e-9 ? per : 1e-9));
    if (r->n < 1) r->n = 1;
    r->steps = tm->warmup + tm->calibrate;
    for (int k = 0; s == DEFT_OK && k < REPEATS; k++) {
        t0 = seconds();
        s = run_steps(p, t, r->n, &r->loss);
        r->us[k] = (seconds() - t0) / (double)r->n * 1e6;
        r->steps += r->n;
    }
    sort_times(r->us, REPEATS);
    return s;
}

static deft_status report(deft_program *p, const resnet_train *t, deft_device dev, const char *k, const char *tag,
                          int64_t batch, const result *r) {
    deft_memory_report mr;
    deft_memory_stats ms;
    deft_device_footprint fp[4];
    int nfp = 0;
    deft_status s = deft_program_memory(p, &mr);
    if (s == DEFT_OK) s = deft_program_footprint(p, fp, 4, &nfp);
    if (s == DEFT_OK) s = deft_memory_stats_get(dev, &ms);
    if (s != DEFT_OK) return s;
    size_t footprint = 0, activations = 0;
    for (int i = 0; i < nfp; i++) footprint += fp[i].total_bytes, activations += fp[i].activation_bytes;
    const double med = r->us[REPEATS / 2];
    printf("resnet.%s.%s_images_per_s %.1f images/s\n", k, tag, (double)batch / (med * 1e-6));
    printf("resnet.%s.%s_step_us %.2f us\n", k, tag, med);
    printf("resnet.%s.%s_step_us_min %.2f us\n", k, tag, r->us[0]);
    printf("resnet.%s.%s_step_us_max %.2f us\n", k, tag, r->us[REPEATS - 1]);
    printf("resnet.%s.%s_steps_per_repeat %lld count\n", k, tag, (long long)r->n);
    printf("resnet.%s.%s_peak_bytes %lld bytes\n", k, tag, (long long)ms.allocated_bytes.peak);
    printf("resnet.%s.%s_arena_bytes %zu bytes\n", k, tag, mr.arena_bytes);
    printf("resnet.%s.%s_persistent_bytes %zu bytes\n", k, tag, mr.persistent_bytes);
    printf("resnet.%s.%s_footprint_bytes %zu bytes\n", k, tag, footprint);
    printf("resnet.%s.%s_activation_bytes %zu bytes\n", k, tag, activations);
    printf("resnet.%s.%s_graph_replays %lld count\n", k, tag, (long long)deft_program_graph_replays(p));
    printf("resnet.%s.%s_loss_first %.6f loss\n", k, tag, (double)r->loss_first);
    printf("resnet.%s.%s_loss_warmup %.6f loss\n", k, tag, (double)r->loss_warmup);
    printf("resnet.%s.%s_loss %.6f loss\n", k, tag, (double)r->loss);
    double scale = 0;
    int64_t skipped = 0;
    if (deft_optimizer_loss_scale(t->opt, &scale, &skipped) == DEFT_OK && scale != 1.0) {
        printf("resnet.%s.%s_loss_scale %.1f scale\n", k, tag, scale);
        printf("resnet.%s.%s_skipped_steps %lld count\n", k, tag, (long long)skipped);
    }
    printf("resnet.%s.%s_loss_steps %lld count\n", k, tag, (long long)r->steps);
    fflush(stdout);
    return DEFT_OK;
}

/* One configuration; a failure is printed and returned, and the caller goes on with the next. */
static int f32_nhwc;   /* --nhwc */

static deft_status bench(const bench_config *c, deft_device dev, const deft_compile_options *base, const timing *tm) {
    char k[32], tag[32];
    snprintf(k, sizeof k, "b%lld_%s", (long long)c->batch, deft_dtype_name(c->precision));
    snprintf(tag, sizeof tag, "%s", base->no_cuda_graphs ? "deft_nographs" : "deft");
    deft_compile_options co = *base;
    if (c->precision != DEFT_F32) co.autocast = c->precision;
    const resnet_config rc = resnet18_config(10, c->precision != DEFT_F32 || f32_nhwc ? DEFT_NHWC : DEFT_NCHW);
    const deft_sgd_options sgd = {.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-4};
    resnet_train t = {0};
    deft_program *p = NULL;
    result r = {{0}, 0, 0, 0, 0, 0};
    deft_status s = deft_memory_reset_peak(dev);
    if (s == DEFT_OK) s = resnet_train_build(&t, &rc, c->batch, 0, 32, dev, &sgd, 1);
    if (s == DEFT_OK && !(p = deft_compile(t.g, (deft_tensor *[]){t.loss, t.step}, 2, &co))) s = DEFT_ERR_INVALID;
    if (s == DEFT_OK) s = feed_batch(p, &t, c->batch, rc.layout);
    if (s == DEFT_OK) s = measure(p, &t, tm, &r);
    if (s == DEFT_OK) s = report(p, &t, dev, k, tag, c->batch, &r);
    if (s != DEFT_OK) {
        printf("# resnet.%s: %s failed: %s: %s\n", k, tag, deft_status_name(s), deft_errmsg());
        fflush(stdout);
    }
    deft_graph_free(t.g);
    return s;
}

static const char help[] =
    "usage: bench_resnet [--batch N] [--precision f32|bf16|f16] [--device cuda:N|cpu] [--no-graphs] [--tf32]\n"
    "                    [--nhwc] [A/B options]\n"
    "\n"
    "Images per second of a ResNet-18 training step (10 classes, 32x32 images, SGD with momentum) compiled by\n"
    "deft, and the device memory it needs. One figure per line: <name> <value> <unit>.\n"
    "\n"
    "  --batch N                   one batch size (default: both 128 and 512)\n"
    "  --precision f32|bf16|f16    one precision (default: every one)\n"
    "  --device cuda:N|cpu         where it runs (default: cuda:0 when a GPU works, else the CPU)\n"
    "  --no-graphs                 no CUDA Graphs (default: graphs)\n"
    "  --tf32                      the compile option tf32 (default: off)\n"
    "  --nhwc                      f32 in NHWC (default: NCHW)\n"
    BENCH_AB_HELP
    "  -h, --help                  this help\n";

static void usage(void) {
    fprintf(stderr,
            "usage: %s [--batch N] [--precision f32|bf16|f16] [--device cuda:N|cpu] [--no-graphs] [--tf32] [--nhwc] "
            BENCH_AB_USAGE "\n",
            prog);
    exit(2);
}

int main(int argc, char **argv) {
    const char *device = NULL, *precision = NULL;
    int64_t only_batch = 0;
    deft_compile_options co = {0};
    bench_help(argc, argv, help);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) only_batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) precision = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--no-graphs")) co.no_cuda_graphs = 1;
        else if (!strcmp(argv[i], "--tf32")) co.tf32 = 1;
        else if (!strcmp(argv[i], "--nhwc")) f32_nhwc = 1;
        else if (!bench_ab_option(argc, argv, &i, &co)) usage();
    }
    if (only_batch < 0 ||
        (precision && strcmp(precision, "f32") && strcmp(precision, "bf16") && strcmp(precision, "f16")))
        usage();
    deft_device dev;
    if (device) {
        deft_status s = deft_device_parse(device, &dev);
        if (s == DEFT_ERR_NO_CUDA) {
            printf("%s: skipped: %s (--device cpu runs a small batch on the CPU)\n", prog, deft_errmsg());
            return 0;
        }
        if (s != DEFT_OK) {
            fprintf(stderr, "%s: --device %s: %s\n", prog, device, deft_errmsg());
            return 1;
        }
    } else {
        if (deft_cuda_device_count() < 1) {
            printf("%s: skipped: no usable CUDA device (--device cpu runs a small batch on the CPU)\n", prog);
            return 0;
        }
        dev = deft_cuda(0);
    }
    const int cpu = dev.type == DEFT_CPU;
    const timing tm = cpu ? (timing){3, 2} : (timing){20, 10};
    char dname[256], dstr[32];
    if (deft_device_name(dev, dname, sizeof dname) != DEFT_OK) snprintf(dname, sizeof dname, "?");
    printf("# %s: deft %s on %s (%s)%s%s\n", prog, deft_version(), deft_device_str(dev, dstr, sizeof dstr), dname,
           co.no_cuda_graphs ? ", CUDA Graphs off" : "", co.tf32 ? ", TF32 on" : "");
    fflush(stdout);

    const int64_t batches[2] = {128, 512};
    int failed = 0;
    const deft_dtype precisions[3] = {DEFT_F32, DEFT_BF16, DEFT_F16};
    for (int pi = 0; pi < 3; pi++) {
        if (precision && strcmp(precision, deft_dtype_name(precisions[pi]))) continue;
        for (int b = 0; b < 2; b++) {
            int64_t batch = only_batch ? only_batch : cpu ? 16 : batches[b];
            if ((only_batch || cpu) && b) continue;
            failed |= bench(&(bench_config){batch, precisions[pi]}, dev, &co, &tm) != DEFT_OK;
        }
    }
    return failed;
}
