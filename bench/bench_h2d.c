/* bench_h2d: host-to-device copy bandwidth, 1 MiB to 256 MiB, from pageable and from pinned memory, through deft's
 * feeding calls and through raw CUDA copies. bench/peers/h2d.py measures torch's tensor.to("cuda") the same way;
 * scripts/bench_h2d.sh runs both. One figure per line: `<name> <value> <unit>`.
 *
 *   ./bench_h2d [--device cuda:N]
 *
 * Per size S (MiB), in GB/s (1e9 bytes a second):
 *   h2d.<S>MiB.cuda_memcpy_pageable_gbs   cudaMemcpy from malloc'd memory
 *   h2d.<S>MiB.cuda_memcpy_pinned_gbs     cudaMemcpy from cudaHostAlloc'd memory: the pinned bandwidth of this run
 *   h2d.<S>MiB.deft_feed_pageable_gbs     deft_program_feed from malloc'd memory
 *   h2d.<S>MiB.deft_feed_pinned_gbs       deft_program_feed from deft_pinned_alloc'd memory
 *   h2d.<S>MiB.deft_feed_async_gbs        deft_program_feed_async from deft_pinned_alloc'd memory (queued back to
 *                                         back on the copy stream, then one device synchronisation)
 *   h2d.<S>MiB.deft_feed_async_vs_pinned  deft_feed_async_gbs / the largest cuda_memcpy_pinned_gbs of the run (x)
 * and h2d.pinned_peak_gbs, that largest pinned figure. The program fed is one input [S MiB / 4] f32 and its double,
 * compiled on the GPU; it never runs, so only copies are timed. Each figure is the median of 5 trials of k copies
 * (k so that a trial moves at least 512 MiB), after 2 untimed copies. Without a GPU the bench says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deft.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define TRIALS 5
#define MiB ((size_t)1 << 20)

static const char *prog = "bench_h2d";

/* --help (or -h) answers on stdout with exit 0. */
static void bench_help(int argc, char **argv, const char *help) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            exit(0);
        }
}

#ifdef DEFT_HAVE_CUDA
static void die(const char *what, const char *why) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, why);
    exit(1);
}

#define CHECK(call)                                            \
    do {                                                       \
        if ((call) != DEFT_OK) die(#call, deft_errmsg());      \
    } while (0)

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CUDA(call)                                                        \
    do {                                                                  \
        cudaError_t e_ = (call);                                          \
        if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_));        \
    } while (0)

typedef enum method { RAW_PAGEABLE, RAW_PINNED, FEED_PAGEABLE, FEED_PINNED, FEED_ASYNC, N_METHODS } method;
static const char *const method_names[] = {"cuda_memcpy_pageable", "cuda_memcpy_pinned", "deft_feed_pageable",
                                           "deft_feed_pinned", "deft_feed_async"};

typedef struct target {
    deft_graph *g;
    deft_tensor *x;
    deft_program *p;
    void *dev;              /* for the raw copies */
    void *pageable, *pinned_cuda, *pinned_deft;
    size_t bytes;
} target;

static void copy_once(target *t, method m) {
    switch (m) {
    case RAW_PAGEABLE: CUDA(cudaMemcpy(t->dev, t->pageable, t->bytes, cudaMemcpyHostToDevice)); break;
    case RAW_PINNED: CUDA(cudaMemcpy(t->dev, t->pinned_cuda, t->bytes, cudaMemcpyHostToDevice)); break;
    case FEED_PAGEABLE: CHECK(deft_program_feed(t->p, t->x, t->pageable, t->bytes)); break;
    case FEED_PINNED: CHECK(deft_program_feed(t->p, t->x, t->pinned_deft, t->bytes)); break;
    case FEED_ASYNC: CHECK(deft_program_feed_async(t->p, t->x, t->pinned_deft, t->bytes)); break;
    default: break;
    }
}

static double bandwidth(target *t, method m) {
    int k = (int)((512 * MiB + t->bytes - 1) / t->bytes);
    for (int i = 0; i < 2; i++) copy_once(t, m);
    CUDA(cudaDeviceSynchronize());
    double gbs[TRIALS];
    for (int r = 0; r < TRIALS; r++) {
        double t0 = seconds();
        for (int i = 0; i < k; i++) copy_once(t, m);
        CUDA(cudaDeviceSynchronize());
        gbs[r] = (double)t->bytes * k / (seconds() - t0) / 1e9;
    }
    for (int i = 1; i < TRIALS; i++)
        for (int j = i; j > 0 && gbs[j] < gbs[j - 1]; j--) {
            double s = gbs[j];
            gbs[j] = gbs[j - 1];
            gbs[j - 1] = s;
        }
    return gbs[TRIALS / 2];
}

static void target_make(target *t, size_t bytes, deft_device dev) {
    memset(t, 0, sizeof *t);
    t->bytes = bytes;
    t->g = deft_graph_new();
    t->x = deft_input(t->g, "x", DEFT_F32, 1, (int64_t[]){(int64_t)(bytes / 4)}, dev);
    deft_tensor *y = deft_mul_scalar(t->x, 2.0);
    if (!y) die("building", deft_errmsg());
    t->p = deft_compile(t->g, &y, 1, NULL);
    if (!t->p) die("deft_compile", deft_errmsg());
    CUDA(cudaMalloc(&t->dev, bytes));
    CUDA(cudaHostAlloc(&t->pinned_cuda, bytes, cudaHostAllocDefault));
    CHECK(deft_pinned_alloc(bytes, &t->pinned_deft));
    t->pageable = malloc(bytes);
    if (!t->pageable) die("malloc", "out of host memory");
    /* Touched, so that page faults are not timed. */
    memset(t->pageable, 1, bytes);
    memset(t->pinned_cuda, 1, bytes);
    memset(t->pinned_deft, 1, bytes);
}

static void target_free(target *t) {
    CUDA(cudaDeviceSynchronize());
    deft_graph_free(t->g);
    CUDA(cudaFree(t->dev));
    CUDA(cudaFreeHost(t->pinned_cuda));
    CHECK(deft_pinned_free(t->pinned_deft));
    free(t->pageable);
}
#endif

static const char help[] =
    "usage: bench_h2d [--device cuda:N]\n"
    "\n"
    "Host-to-device copy bandwidth, 1 MiB to 256 MiB, from pageable and from pinned memory, through deft's feeding\n"
    "calls and through raw CUDA copies. One figure per line: <name> <value> <unit>. Without a GPU it says so.\n"
    "\n"
    "  --device cuda:N    the GPU (default: cuda:0)\n"
    "  -h, --help         this help\n";

int main(int argc, char **argv) {
    const char *device = NULL;
    bench_help(argc, argv, help);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--device cuda:N]\n", prog);
            return 2;
        }
    }
    if (deft_cuda_device_count() < 1) {
        printf("%s: skipped: no usable CUDA device\n", prog);
        return 0;
    }
#ifdef DEFT_HAVE_CUDA
    deft_device dev = deft_cuda(0);
    if (device) CHECK(deft_device_parse(device, &dev));
    if (dev.type != DEFT_CUDA) die("--device", "host-to-device copies need a GPU");
    CUDA(cudaSetDevice(dev.index));
    char dname[256], dstr[32];
    CHECK(deft_device_name(dev, dname, sizeof dname));
    printf("# %s: deft %s on %s (%s)\n", prog, deft_version(), deft_device_str(dev, dstr, sizeof dstr), dname);
    fflush(stdout);

    static const int sizes_mib[] = {1, 4, 16, 64, 256};
    enum { N_SIZES = sizeof sizes_mib / sizeof sizes_mib[0] };
    double gbs[N_SIZES][N_METHODS], peak = 0;
    for (int s = 0; s < N_SIZES; s++) {
        target t;
        target_make(&t, (size_t)sizes_mib[s] * MiB, dev);
        for (int m = 0; m < N_METHODS; m++) {
            gbs[s][m] = bandwidth(&t, (method)m);
            printf("h2d.%dMiB.%s_gbs %.2f GB/s\n", sizes_mib[s], method_names[m], gbs[s][m]);
            fflush(stdout);
        }
        if (gbs[s][RAW_PINNED] > peak) peak = gbs[s][RAW_PINNED];
        target_free(&t);
    }
    printf("h2d.pinned_peak_gbs %.2f GB/s\n", peak);
    for (int s = 0; s < N_SIZES; s++)
        printf("h2d.%dMiB.deft_feed_async_vs_pinned %.3f x\n", sizes_mib[s], gbs[s][FEED_ASYNC] / peak);
    CHECK(deft_pinned_empty_cache());
#else
    (void)device;
#endif
    return 0;
}
