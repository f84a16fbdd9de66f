/* bench_ddp: data parallel training of the mid MLP (Linear(1024,1024)+ReLU x7, Linear(1024,10); batch 256 per GPU,
 * cross-entropy, SGD lr 0.01 momentum 0.9, f32) over N GPUs of one process (deft_dist_init_local, deft_dist_run; the
 * gradients all-reduced in 25 MiB buckets inside each replica's CUDA Graph). bench/peers/ddp.py runs the same with
 * PyTorch DDP; scripts/bench_ddp.sh runs both for N = 1, 2, 4 and prints the scaling efficiencies and ratios.
 *
 *   ./bench_ddp [--gpus N] [--no-graphs] [--bucket-mib M]   (M: the compile option bucket_bytes, in MiB)
 *
 * Weights and the batch come from bench_util.h's hash (the same on every replica and in the peer). Timing as
 * bench_mlp_train: the batch stays on the devices, 10 warm-up steps, N steps calibrated to about 100 ms, 5 repeats
 * of a host clock around the steps and one read of every replica's loss (which waits for all of them); the median.
 * Figures: ddp.mid.gpus<N>.deft_step_ms and ddp.mid.gpus<N>.deft_images_per_s (the global batch N * 256 over the
 * step time). Without NCCL or with fewer GPUs than asked for it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#define BENCH_NAME "bench_ddp"
#include "bench_util.h"

#define LAYERS 8
#define WIDTH 1024
#define CLASSES 10
#define BATCH 256
#define MAX_GPUS 16
#define WARMUP 10
#define REPEATS 5

typedef struct replica {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_program *p;
} replica;

static void build(replica *r, deft_dist *d, int k, int graphs, size_t bucket_bytes) {
    const deft_device dev = deft_dist_device(d, k);
    r->g = deft_graph_new();
    r->x = deft_input(r->g, "x", DEFT_F32, 2, (int64_t[]){BATCH, WIDTH}, dev);
    r->y = deft_input(r->g, "y", DEFT_I32, 1, (int64_t[]){BATCH}, dev);
    deft_tensor *h = r->x;
    for (int l = 0; l < LAYERS; l++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l);
        h = deft_linear(h, l == LAYERS - 1 ? CLASSES : WIDTH, name, NULL);
        if (l < LAYERS - 1) h = deft_relu(h);
    }
    r->loss = deft_cross_entropy(h, r->y);
    if (!r->loss) die("building the MLP");
    CHECK(deft_backward(r->loss));
    for (int l = 0; l < LAYERS; l++) bench_set_linear(r->g, l, WIDTH, l == LAYERS - 1 ? CLASSES : WIDTH);
    r->step = deft_optimizer_step(deft_sgd(r->g, &(deft_sgd_options){.lr = 0.01, .momentum = 0.9}, NULL));
    const deft_compile_options o = {
        .dist = d, .dist_local = k, .no_cuda_graphs = !graphs, .bucket_bytes = bucket_bytes};
    r->p = deft_compile(r->g, (deft_tensor *[]){r->loss, r->step}, 2, &o);
    if (!r->p) die("compile");
    /* Replica k's rows of the global batch: rows k * BATCH .. of the hashed streams. */
    float *x = xmalloc((size_t)BATCH * WIDTH * sizeof *x);
    int32_t *y = xmalloc((size_t)BATCH * sizeof *y);
    for (int64_t i = 0; i < (int64_t)BATCH * WIDTH; i++) x[i] = hash_uniform(1, (uint64_t)(k * BATCH * WIDTH + i), 1.0);
    for (int64_t i = 0; i < BATCH; i++) y[i] = (int32_t)(hash32(2, (uint64_t)(k * BATCH + i)) % CLASSES);
    CHECK(deft_program_feed(r->p, r->x, x, (size_t)BATCH * WIDTH * sizeof *x));
    CHECK(deft_program_feed(r->p, r->y, y, (size_t)BATCH * sizeof *y));
    free(x);
    free(y);
}

static float run(deft_dist *d, replica *r, deft_program **ps, int n, int64_t steps) {
    for (int64_t s = 0; s < steps; s++) CHECK(deft_dist_run(d, ps, n));
    float loss = 0, l;
    for (int k = 0; k < n; k++) {
        CHECK(deft_program_read(r[k].p, r[k].loss, &l, sizeof l));
        loss += l / (float)n;
    }
    return loss;
}

int main(int argc, char **argv) {
    int n = 1, graphs = 1;
    size_t bucket_bytes = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gpus") == 0 && i + 1 < argc) n = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-graphs") == 0) graphs = 0;
        else if (strcmp(argv[i], "--bucket-mib") == 0 && i + 1 < argc)
            bucket_bytes = (size_t)(atof(argv[++i]) * 1048576);
        else {
            fprintf(stderr, "usage: %s [--gpus N] [--no-graphs] [--bucket-mib M]\n", prog);
            return 2;
        }
    }
    if (n < 1 || n > MAX_GPUS) return fprintf(stderr, "%s: --gpus in 1..%d\n", prog, MAX_GPUS), 2;
    if (!deft_has_nccl_build() || deft_cuda_device_count() < n) {
        printf("# %s: needs NCCL and %d GPUs (%d visible): skipped\n", prog, n, deft_cuda_device_count());
        return 0;
    }
    deft_dist *d;
    CHECK(deft_dist_init_local(n, 120, &d));
    replica r[MAX_GPUS];
    deft_program *ps[MAX_GPUS];
    for (int k = 0; k < n; k++) {
        build(&r[k], d, k, graphs, bucket_bytes);
        ps[k] = r[k].p;
    }
    const float first = run(d, r, ps, n, 1);
    const float warm = run(d, r, ps, n, WARMUP - 1);
    double t = seconds();
    run(d, r, ps, n, 10);
    const double est = (seconds() - t) / 10;
    int64_t steps = (int64_t)(0.1 / (est > 1e-6 ? est : 1e-6));
    if (steps < 5) steps = 5;
    double times[REPEATS];
    for (int i = 0; i < REPEATS; i++) {
        t = seconds();
        run(d, r, ps, n, steps);
        times[i] = (seconds() - t) / (double)steps;
    }
    sort_times(times, REPEATS);
    const char *tag = graphs ? "deft" : "deft_nographs";
    printf("ddp.mid.gpus%d.%s_loss_step1 %.6f loss\n", n, tag, first);
    printf("ddp.mid.gpus%d.%s_loss_step%d %.6f loss\n", n, tag, WARMUP, warm);
    printf("ddp.mid.gpus%d.%s_step_ms %.4f ms\n", n, tag, times[REPEATS / 2] * 1e3);
    printf("ddp.mid.gpus%d.%s_step_ms_min %.4f ms\n", n, tag, times[0] * 1e3);
    printf("ddp.mid.gpus%d.%s_images_per_s %.1f images/s\n", n, tag, (double)(n * BATCH) / times[REPEATS / 2]);
    printf("# %s: %s\n", prog, deft_program_graph_status(r[0].p));
    for (int k = 0; k < n; k++) deft_graph_free(r[k].g);
    deft_dist_free(d);
    return 0;
}
