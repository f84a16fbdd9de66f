/* bench_conv: one training step of a ResNet basic block's first half on the CPU, conv 3x3 (C -> C, padding 1, no
 * bias) -> batch norm (training) -> relu -> max pool 2x2 -> mean, forward, backward and an SGD step, in NCHW and
 * NHWC. bench/peers/conv.py runs the same step in PyTorch (channels_last for NHWC) and prints the same names with
 * "torch" in place of "deft"; scripts/bench_conv.sh runs both and prints the ratios. One figure per line:
 * `<name> <value> <unit>`, names `conv.cpu.<layout>.*`.
 *
 *   ./bench_conv [--batch N] [--channels C] [--size S]      (default: 16, 64, 32: x is [16, 64, 32, 32])
 *
 * The CUDA kernels of these ops come later (issue 8); the bench then gains --device. Timing: 2 warm-up runs, then
 * 7 repeats of a host clock around N runs (N chosen so that N runs take about 300 ms); the figure is the median of
 * (time / N), with the fastest and slowest repeat. images_per_s = batch / step time. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench_conv"
#include "bench_util.h"

#define REPEATS 7
#define TARGET_REPEAT_S 0.3

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_or_die(deft_program *p) {
    if (deft_program_run(p) != DEFT_OK) die("run");
}

/* Median, fastest and slowest seconds per run. */
static void time_runs(deft_program *p, double *med, double *lo, double *hi) {
    run_or_die(p);
    run_or_die(p);
    double t0 = seconds();
    run_or_die(p);
    double per = seconds() - t0;
    int n = per > 0 ? (int)(TARGET_REPEAT_S / per) : 1;
    if (n < 1) n = 1;
    double times[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        t0 = seconds();
        for (int i = 0; i < n; i++) run_or_die(p);
        times[r] = (seconds() - t0) / n;
    }
    qsort(times, REPEATS, sizeof times[0], cmp_double);
    *med = times[REPEATS / 2], *lo = times[0], *hi = times[REPEATS - 1];
}

static void bench_layout(int64_t batch, int64_t channels, int64_t size, deft_layout layout) {
    const char *name = layout == DEFT_NHWC ? "nhwc" : "nchw";
    deft_graph *g = deft_graph_new();
    int64_t xshape[4] = {batch, channels, size, size};
    if (layout == DEFT_NHWC) xshape[1] = size, xshape[3] = channels;
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, xshape, deft_cpu());
    deft_tensor *h = deft_conv2d_layer(x, channels, 3, 3, "conv", &(deft_conv2d_options){.padding = {1, 1},
                                                                                         .layout = layout}, 1);
    deft_batch_norm_options bo = deft_batch_norm_defaults();
    bo.layout = layout;
    h = deft_relu(deft_batch_norm_layer(h, "bn", &bo));
    h = deft_max_pool2d(h, &(deft_pool2d_options){.kernel = {2, 2}, .layout = layout});
    deft_tensor *loss = deft_mean(h, 0, NULL, 0);
    if (!loss || deft_backward(loss) != DEFT_OK) die("build");
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.01, .momentum = 0.9}, NULL);
    deft_tensor *outs[2] = {loss, deft_optimizer_step(opt)};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    if (!p) die("compile");
    size_t n = deft_tensor_nbytes(x) / sizeof(float);
    float *xb = malloc(n * sizeof *xb);
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        xb[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    if (deft_program_feed(p, x, xb, n * sizeof *xb) != DEFT_OK) die("feed");
    double med, lo, hi;
    time_runs(p, &med, &lo, &hi);
    printf("conv.cpu.%s.deft_step_ms %.3f ms\n", name, med * 1e3);
    printf("conv.cpu.%s.deft_step_ms_min %.3f ms\n", name, lo * 1e3);
    printf("conv.cpu.%s.deft_step_ms_max %.3f ms\n", name, hi * 1e3);
    printf("conv.cpu.%s.deft_images_per_s %.1f img/s\n", name, (double)batch / med);
    free(xb);
    deft_graph_free(g);
}

static const char help[] =
    "usage: bench_conv [--batch N] [--channels C] [--size S]\n"
    "\n"
    "One training step of a ResNet basic block's first half on the CPU (conv 3x3, batch norm, relu, max pool 2x2,\n"
    "mean; forward, backward, SGD) in NCHW and NHWC. One figure per line: <name> <value> <unit>.\n"
    "\n"
    "  --batch N       images per batch (default: 16)\n"
    "  --channels C    channels in and out of the convolution (default: 64)\n"
    "  --size S        image height and width (default: 32)\n"
    "  -h, --help      this help\n";

int main(int argc, char **argv) {
    int64_t batch = 16, channels = 64, size = 32;
    bench_help(argc, argv, help);
    for (int i = 1; i < argc; i += 2) {
        int64_t *to = !strcmp(argv[i], "--batch") ? &batch : !strcmp(argv[i], "--channels") ? &channels
                      : !strcmp(argv[i], "--size") ? &size : NULL;
        if (!to || i + 1 == argc) {
            fprintf(stderr, "usage: bench_conv [--batch N] [--channels C] [--size S]\n");
            return 2;
        }
        *to = strtoll(argv[i + 1], NULL, 10);
        if (*to <= 0) {
            fprintf(stderr, "bench_conv: %s needs a positive number\n", argv[i]);
            return 2;
        }
    }
    bench_layout(batch, channels, size, DEFT_NCHW);
    bench_layout(batch, channels, size, DEFT_NHWC);
    return 0;
}
