/* What the benchmark executables share: exiting with deft's message, a host clock, and the integer hash that gives
 * deft and the PyTorch peers (bench/peers/peer_common.py computes it bit for bit) the same data and initial weights.
 * Define BENCH_NAME (the program's name, for messages) before including. Header-only: each benchmark is one file. */
#ifndef DEFT_BENCH_UTIL_H
#define DEFT_BENCH_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deft.h"

#ifndef BENCH_NAME
#error "define BENCH_NAME before including bench_util.h"
#endif

static const char *const prog = BENCH_NAME;

/* The switches of the GPU optimisations for A/B runs (the environment's DEFT_SIDE_STREAM=0 and its kin before they
 * became compile options): --no-side-lane, --no-product-batches, --no-relu-grad-fold, --fuse-low-precision,
 * --conv-gemm never|f32, --cudnn-find, --matmul-find, --no-cheap-recompute, --reorder and --param-copies set the
 * compile options of those names.
 * Returns 1 when argv[*i] is one (its value consumed). */
#define BENCH_AB_USAGE                                                                                         \
    "[--no-side-lane] [--no-product-batches] [--no-relu-grad-fold] [--fuse-low-precision] [--conv-gemm never|f32] " \
    "[--cudnn-find] [--matmul-find] [--no-cheap-recompute] [--reorder] [--param-copies]"
#define BENCH_AB_HELP                                                                                          \
    "  --no-side-lane        compile option no_side_lane: no second stream for independent steps (default: on)\n"  \
    "  --no-product-batches  compile option no_product_batches: no batched products (default: batched)\n"         \
    "  --no-relu-grad-fold   compile option no_relu_grad_fold (default: folded)\n"                                 \
    "  --fuse-low-precision  compile option fuse_low_precision (default: off)\n"                                   \
    "  --conv-gemm never|f32 compile option conv_gemm (default: the library's choice)\n"                          \
    "  --cudnn-find          compile option cudnn_find: time cuDNN's algorithms (default: heuristics)\n"      \
    "  --matmul-find         compile option matmul_find: time cuBLASLt's algorithms (default: heuristics)\n"  \
    "  --no-cheap-recompute  compile option no_cheap_recompute: keep what one pass recomputes (default: recomputed)\n" \
    "  --reorder             compile option reorder: steps reordered to lower the peak (default: the given order)\n" \
    "  --param-copies        compile option param_copies: autocast reads the optimizer's low-precision copies of\n" \
    "                        the weights (default: a cast per step)\n"
static inline int bench_ab_option(int argc, char **argv, int *i, deft_compile_options *co) {
    const char *a = argv[*i];
    if (!strcmp(a, "--no-side-lane")) co->no_side_lane = 1;
    else if (!strcmp(a, "--no-product-batches")) co->no_product_batches = 1;
    else if (!strcmp(a, "--no-relu-grad-fold")) co->no_relu_grad_fold = 1;
    else if (!strcmp(a, "--fuse-low-precision")) co->fuse_low_precision = 1;
    else if (!strcmp(a, "--cudnn-find")) co->cudnn_find = 1;
    else if (!strcmp(a, "--matmul-find")) co->matmul_find = 1;
    else if (!strcmp(a, "--no-cheap-recompute")) co->no_cheap_recompute = 1;
    else if (!strcmp(a, "--reorder")) co->reorder = 1;
    else if (!strcmp(a, "--param-copies")) co->param_copies = 1;
    else if (!strcmp(a, "--conv-gemm") && *i + 1 < argc) {
        const char *m = argv[++*i];
        co->conv_gemm = !strcmp(m, "never") ? DEFT_CONV_GEMM_NEVER : !strcmp(m, "f32") ? DEFT_CONV_GEMM_WITH_F32 : -1;
    } else
        return 0;
    return 1;
}

/* --help or -h anywhere in argv: help (its usage line, what the bench does, every option and its default) on
 * stdout and exit 0, so that it is never taken for a bad option (those print the usage on stderr and exit 2). */
static inline void bench_help(int argc, char **argv, const char *help) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            exit(0);
        }
}

static inline void die(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, deft_errmsg());
    exit(1);
}

#define CHECK(call)                                  \
    do {                                             \
        if ((call) != DEFT_OK) die(#call);           \
    } while (0)

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "%s: out of host memory (%zu bytes)\n", prog, bytes);
        exit(1);
    }
    return p;
}

static inline double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sorts n times in increasing order (for the median and the extremes of a run's repeats). */
static inline void sort_times(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
}

/* Element i of stream s: a 32-bit integer hash of (i + s * 0x9E3779B1) mod 2^32. Uniform values are
 * (2 * h / 2^32 - 1) * scale in double, rounded once to f32; labels are h mod classes. Streams: 1 the input x,
 * 2 the targets (labels or MSE targets), 100 + 2l the weight of layer l, 101 + 2l its bias. */
static inline uint32_t hash32(uint64_t stream, uint64_t i) {
    uint64_t h = (i + stream * 0x9E3779B1ull) & 0xffffffffull;
    h = ((h ^ (h >> 16)) * 0x045D9F3Bull) & 0xffffffffull;
    h = ((h ^ (h >> 16)) * 0x045D9F3Bull) & 0xffffffffull;
    return (uint32_t)(h ^ (h >> 16));
}

static inline float hash_uniform(uint64_t stream, uint64_t i, double scale) {
    return (float)((((double)hash32(stream, i) / 4294967296.0) * 2.0 - 1.0) * scale);
}

/* The ResNet benches' batch of 32x32 RGB images, the same values as bench/peers/resnet.py's: image i of the batch is
 * image first + i of the hashed streams, x uniform in [-1, 1) by its NCHW index (stored NHWC when asked), its label
 * hash32(2, first + i) % classes. x holds batch * 3072 floats, y batch labels. */
static inline void bench_image_batch(int64_t batch, int64_t first, deft_layout layout, int classes, float *x,
                                     int32_t *y) {
    const int64_t image = 3 * 32 * 32, plane = 32 * 32, n = batch * image;
    for (int64_t i = 0; i < n; i++) {   /* i is the NCHW index within the batch */
        const int64_t img = i / image, c = i / plane % 3, pix = i % plane;
        const int64_t at = layout == DEFT_NHWC ? img * image + pix * 3 + c : i;
        x[at] = hash_uniform(1, (uint64_t)(first * image + i), 1.0);
    }
    for (int64_t i = 0; i < batch; i++) y[i] = (int32_t)(hash32(2, (uint64_t)(first + i)) % (uint32_t)classes);
}

/* Sets layer l ("fc<l>.weight" [in, out] and "fc<l>.bias" [out]) of an MLP built with deft_linear to the hashed
 * values, indexed as torch stores the weight ([out, in], so deft's is filled transposed), scaled by 1 / sqrt(in):
 * the bound of torch.nn.Linear's default initialisation. */
static inline void bench_set_linear(deft_graph *g, int l, int64_t in, int64_t out) {
    const double scale = 1.0 / sqrt((double)in);
    float *w = xmalloc((size_t)(in * out) * sizeof *w), *b = xmalloc((size_t)out * sizeof *b);
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) w[i * out + o] = hash_uniform(100 + 2 * (uint64_t)l, (uint64_t)(o * in + i), scale);
    for (int64_t o = 0; o < out; o++) b[o] = hash_uniform(101 + 2 * (uint64_t)l, (uint64_t)o, scale);
    char name[48];
    snprintf(name, sizeof name, "fc%d.weight", l);
    deft_tensor *wt = deft_graph_find(g, name);
    if (!wt) die(name);
    CHECK(deft_param_set(wt, w, (size_t)(in * out) * sizeof *w));
    snprintf(name, sizeof name, "fc%d.bias", l);
    deft_tensor *bt = deft_graph_find(g, name);
    if (!bt) die(name);
    CHECK(deft_param_set(bt, b, (size_t)out * sizeof *b));
    free(w);
    free(b);
}

#endif
