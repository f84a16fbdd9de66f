/* bench_ddp: data parallel training over N GPUs of one process (deft_dist_init_local, deft_dist_run; the gradients
 * all-reduced in 8 MiB buckets inside each replica's CUDA Graph), every replica built on its own GPU. bench/peers/ddp.py
 * runs the same with PyTorch DDP; scripts/bench_ddp.sh runs both for N = 1, 2, 4 and prints the scaling efficiencies
 * and ratios.
 *
 *   ./bench_ddp [--model mlp|resnet] [--precision f32|bf16] [--gpus N] [--no-graphs] [--bucket-mib M]
 *               [--last-bucket-mib M] [--bucket-pieces] [--tf32]
 *
 * --model (bench/ddp_models.h): mlp, the mid MLP (batch 256 per GPU, the default), or resnet, ResNet-18 of
 * examples/resnet18.h (batch 128 per GPU, 32x32 images, SGD momentum 0.9 and weight decay 5e-4). --precision bf16
 * (resnet only): NHWC compiled with the autocast option DEFT_BF16, as bench_resnet; f32 (the default) is NCHW, every
 * op in f32. --tf32: the compile option tf32 (f32 matmuls and convolutions may use TF32; the peer's --tf32 the same).
 * M: the compile options bucket_bytes and last_bucket_bytes, in MiB. --bucket-pieces: the compile option
 * dist_bucket_pieces (the optimizer's update in one piece per bucket instead of one node after every bucket).
 *
 * The batch comes from bench_util.h's hash, rank k's rows offset by k (the global batch differs per rank); it is fed
 * once and stays on the devices. Timing as bench_mlp_train: 10 warm-up steps, N steps calibrated to about 100 ms
 * (200 ms for resnet), 5 repeats of a host clock around the steps and one read of every replica's loss (which waits
 * for all of them); the median. Figures, <key> = mid or resnet_<precision>: ddp.<key>.gpus<N>.deft_step_ms,
 * ..._step_ms_min, ..._host_queue_us (the host's time to queue one step, the median: when the host has run far enough
 * ahead of the GPUs, CUDA's launch queue is full and this includes the wait for room in it),
 * ..._images_per_s (the global batch over the step time), ..._loss_step1 and ..._loss_step10 (the
 * mean over the replicas). Without NCCL or with fewer GPUs than asked for it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#define BENCH_NAME "bench_ddp"
#include "bench_util.h"
#include "ddp_models.h"

#define MAX_GPUS 16
#define WARMUP 10
#define REPEATS 5

typedef struct bench_args {
    int resnet, bf16, n, graphs, tf32, bucket_pieces;
    size_t bucket_bytes, last_bucket_bytes;
    deft_compile_options ab;   /* the A/B switches (bench_ab_option) */
} bench_args;

static void build(ddp_replica *r, deft_dist *d, int k, const bench_args *a) {
    const deft_device dev = deft_dist_device(d, k);
    if (a->resnet) ddp_build_resnet(r, dev, a->bf16);
    else ddp_build_mlp(r, dev);
    deft_compile_options o = a->ab;
    o.dist = d;
    o.dist_local = k;
    o.no_cuda_graphs = !a->graphs;
    o.bucket_bytes = a->bucket_bytes;
    o.last_bucket_bytes = a->last_bucket_bytes;
    o.dist_bucket_pieces = a->bucket_pieces;
    o.tf32 = a->tf32;
    o.autocast = a->bf16 ? DEFT_BF16 : DEFT_F32;
    r->p = deft_compile(r->g, (deft_tensor *[]){r->loss, r->step}, 2, &o);
    if (!r->p) die("compile");
    if (a->resnet) ddp_feed_resnet(r, k, a->bf16);
    else ddp_feed_mlp(r, k);
}

/* Runs `steps` steps and reads the mean loss; *queue_s (if given): the host's time to queue them, the reads left out. */
static float run(deft_dist *d, ddp_replica *r, deft_program **ps, int n, int64_t steps, double *queue_s) {
    const double t = seconds();
    for (int64_t s = 0; s < steps; s++) CHECK(deft_dist_run(d, ps, n));
    if (queue_s) *queue_s = seconds() - t;
    float loss = 0, l;
    for (int k = 0; k < n; k++) {
        CHECK(deft_program_read(r[k].p, r[k].loss, &l, sizeof l));
        loss += l / (float)n;
    }
    return loss;
}

static const char help[] =
    "usage: bench_ddp [--model mlp|resnet] [--precision f32|bf16] [--gpus N] [--no-graphs] [--bucket-mib M]\n"
    "                 [--last-bucket-mib M] [--bucket-pieces] [--tf32] [A/B options]\n"
    "\n"
    "Data parallel training over N GPUs of one process, gradients all-reduced in buckets inside each replica's\n"
    "CUDA Graph. Without NCCL or with fewer GPUs than asked for it says so and exits 0.\n"
    "\n"
    "  --model mlp|resnet     the model (default: mlp, the mid MLP, batch 256 per GPU)\n"
    "  --precision f32|bf16   bf16: NHWC with autocast bf16, resnet only (default: f32)\n"
    "  --gpus N               GPUs, 1 to 8 (default: 1)\n"
    "  --no-graphs            no CUDA Graphs (default: graphs)\n"
    "  --bucket-mib M         the gradient buckets' size in MiB (default: 8)\n"
    "  --last-bucket-mib M    the last bucket's size in MiB (default: the compile option's default)\n"
    "  --bucket-pieces        the compile option dist_bucket_pieces (default: off)\n"
    "  --tf32                 the compile option tf32 (default: off)\n"
    BENCH_AB_HELP
    "  -h, --help             this help\n";

static void usage(void) {
    fprintf(stderr,
            "usage: %s [--model mlp|resnet] [--precision f32|bf16] [--gpus N] [--no-graphs] [--bucket-mib M] "
            "[--last-bucket-mib M] [--bucket-pieces] [--tf32] " BENCH_AB_USAGE "\n",
            prog);
    exit(2);
}

static bench_args parse(int argc, char **argv) {
    bench_args a = {.n = 1, .graphs = 1};
    bench_help(argc, argv, help);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gpus") == 0 && i + 1 < argc) a.n = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-graphs") == 0) a.graphs = 0;
        else if (strcmp(argv[i], "--tf32") == 0) a.tf32 = 1;
        else if (strcmp(argv[i], "--bucket-pieces") == 0) a.bucket_pieces = 1;
        else if ((strcmp(argv[i], "--bucket-mib") == 0 || strcmp(argv[i], "--last-bucket-mib") == 0) && i + 1 < argc) {
            const int last = strcmp(argv[i], "--last-bucket-mib") == 0;
            const double mib = atof(argv[++i]);
            if (!(mib > 0 && mib <= 65536)) fprintf(stderr, "%s: %s in (0, 65536]\n", prog, argv[i - 1]), exit(2);
            *(last ? &a.last_bucket_bytes : &a.bucket_bytes) = (size_t)(mib * 1048576);
        }
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            const char *m = argv[++i];
            if (strcmp(m, "mlp") && strcmp(m, "resnet")) usage();
            a.resnet = strcmp(m, "resnet") == 0;
        } else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
            const char *p = argv[++i];
            if (strcmp(p, "f32") && strcmp(p, "bf16")) usage();
            a.bf16 = strcmp(p, "bf16") == 0;
        } else if (!bench_ab_option(argc, argv, &i, &a.ab)) usage();
    }
    if (a.n < 1 || a.n > MAX_GPUS) fprintf(stderr, "%s: --gpus in 1..%d\n", prog, MAX_GPUS), exit(2);
    if (a.bf16 && !a.resnet) fprintf(stderr, "%s: --precision bf16 is for --model resnet\n", prog), exit(2);
    return a;
}

int main(int argc, char **argv) {
    const bench_args a = parse(argc, argv);
    const int n = a.n;
    const char *key = !a.resnet ? "mid" : a.bf16 ? "resnet_bf16" : "resnet_f32";
    if (!deft_has_nccl_build() || deft_cuda_device_count() < n) {
        printf("# %s: ddp.%s needs NCCL and %d GPUs (%d visible): skipped\n", prog, key, n,
               deft_cuda_device_count());
        return 0;
    }
    deft_dist *d;
    CHECK(deft_dist_init_local(n, 120, &d));
    ddp_replica r[MAX_GPUS];
    deft_program *ps[MAX_GPUS];
    for (int k = 0; k < n; k++) {
        build(&r[k], d, k, &a);
        ps[k] = r[k].p;
    }
    const float first = run(d, r, ps, n, 1, NULL);
    const float warm = run(d, r, ps, n, WARMUP - 1, NULL);
    double t = seconds();
    run(d, r, ps, n, 10, NULL);
    const double est = (seconds() - t) / 10, target = a.resnet ? 0.2 : 0.1;
    int64_t steps = (int64_t)(target / (est > 1e-6 ? est : 1e-6));
    if (steps < 5) steps = 5;
    double times[REPEATS], queue[REPEATS];
    for (int i = 0; i < REPEATS; i++) {
        t = seconds();
        run(d, r, ps, n, steps, &queue[i]);
        times[i] = (seconds() - t) / (double)steps;
        queue[i] /= (double)steps;
    }
    sort_times(times, REPEATS);
    sort_times(queue, REPEATS);
    const char *tag = a.graphs ? "deft" : "deft_nographs";
    const int batch = a.resnet ? DDP_RESNET_BATCH : DDP_MLP_BATCH;
    printf("ddp.%s.gpus%d.%s_loss_step1 %.6f loss\n", key, n, tag, first);
    printf("ddp.%s.gpus%d.%s_loss_step%d %.6f loss\n", key, n, tag, WARMUP, warm);
    printf("ddp.%s.gpus%d.%s_step_ms %.4f ms\n", key, n, tag, times[REPEATS / 2] * 1e3);
    printf("ddp.%s.gpus%d.%s_step_ms_min %.4f ms\n", key, n, tag, times[0] * 1e3);
    printf("ddp.%s.gpus%d.%s_host_queue_us %.1f us\n", key, n, tag, queue[REPEATS / 2] * 1e6);
    printf("ddp.%s.gpus%d.%s_images_per_s %.1f images/s\n", key, n, tag, (double)(n * batch) / times[REPEATS / 2]);
    printf("# %s: %s\n", prog, deft_program_graph_status(r[0].p));
    for (int k = 0; k < n; k++) deft_graph_free(r[k].g);
    deft_dist_free(d);
    return 0;
}
