/* bench_ddp: data parallel training over N GPUs of one process (deft_dist_init_local, deft_dist_run; the gradients
 * all-reduced in 8 MiB buckets inside each replica's CUDA Graph), every replica built on its own GPU. bench/peers/ddp.py
 * runs the same with PyTorch DDP; scripts/bench_ddp.sh runs both for N = 1, 2, 4 and prints the scaling efficiencies
 * and ratios.
 *
 *   ./bench_ddp [--model mlp|resnet|gpt2] [--precision f32|bf16] [--gpus N] [--no-graphs] [--bucket-mib M]
 *               [--last-bucket-mib M] [--bucket-pieces] [--tf32] [--zero] [--reduce-bf16] [--efficiency]
 *               [--nccl-blocks K] [--batch B] [--seq T] [--layers L]
 *
 * --model (bench/ddp_models.h): mlp, the mid MLP (batch 256 per GPU, the default), resnet, ResNet-18 of
 * examples/resnet18.h (batch 128 per GPU, 32x32 images, SGD momentum 0.9 and weight decay 5e-4), or gpt2, GPT-2 124M
 * of examples/gpt2.h (AdamW with clipping 1.0 and weight decay on the 2-D weights, as bench_gpt2; --batch B
 * sequences per GPU, default 16, of --seq T tokens, default 1024, and --layers L blocks, default 12, so that it can
 * be tried small). --precision bf16: for resnet NHWC compiled with the autocast option DEFT_BF16, as bench_resnet; f32
 * (resnet's default) is NCHW, every op in f32. gpt2 defaults to bf16 autocast (f32: none). --tf32: the compile option
 * tf32 (f32 matmuls and convolutions may use TF32; the peer's --tf32 the same). M: the compile options bucket_bytes
 * and last_bucket_bytes, in MiB. --bucket-pieces: the compile option dist_bucket_pieces (the optimizer's update in
 * one piece per bucket instead of one node after every bucket). --zero: the compile option zero_stage = 1 (ZeRO-1:
 * the optimizer's state sharded over the ranks); the figures' tag becomes deft_zero. --reduce-bf16: the compile option
 * dist_reduce_dtype = DEFT_BF16 (bf16 autocast's weight gradients averaged in bf16). --efficiency (N > 1): first the
 * same run on one GPU, then on N, in this process, and <tag>_scaling_efficiency = tokens (images) per second on N
 * over N times one GPU's. --nccl-blocks K: the dist option collective_blocks (NCCL's blocks per collective; default
 * 32), printed as ddp.<key>.gpus<N>.nccl_blocks when given.
 *
 * The batch comes from bench_util.h's hash, rank k's rows offset by k (the global batch differs per rank); it is fed
 * once and stays on the devices. Timing as bench_mlp_train: 10 warm-up steps, N steps calibrated to about 100 ms
 * (200 ms for resnet, 500 ms for gpt2), 5 repeats of a host clock around the steps and one read of every replica's
 * loss (which waits for all of them); the median. Figures, <key> = mid, resnet_<precision> or gpt2_<model>_b<B>_<precision>
 * (<model> 124m, or l<L>_t<T> when --layers or --seq change it): ddp.<key>.gpus<N>.deft_step_ms, ..._step_ms_min,
 * ..._host_queue_us (the host's time to queue one step, the median: when the host has run far enough ahead of the
 * GPUs, CUDA's launch queue is full and this includes the wait for room in it), ..._images_per_s (gpt2:
 * ..._tokens_per_s; the global batch over the step time), ..._loss_step1 and ..._loss_step10 (the mean over the
 * replicas). gpt2 adds ..._peak_bytes (the largest over the GPUs of deft's caching allocator's peak of allocated
 * bytes, from before the graphs were built to the end: as torch.cuda.max_memory_allocated) and
 * ..._optimizer_state_bytes (rank 0's plan: its persistent bytes beyond the parameters and the batch, i.e. AdamW's
 * moments, or their shard under --zero). Without NCCL or with fewer GPUs than asked for it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#define BENCH_NAME "bench_ddp"
#include "bench_util.h"
#include "ddp_models.h"

#define MAX_GPUS 16
#define WARMUP 10
#define REPEATS 5

enum { MODEL_MLP, MODEL_RESNET, MODEL_GPT2 };

typedef struct bench_args {
    int model, bf16, n, graphs, tf32, bucket_pieces, zero, efficiency, nccl_blocks;
    int precision_set, gpt2_size_set;   /* --precision, and --batch, --seq or --layers, given */
    size_t bucket_bytes, last_bucket_bytes;
    ddp_gpt2_size gpt2;
    deft_compile_options ab;   /* the A/B switches (bench_ab_option) */
} bench_args;

static void build(ddp_replica *r, deft_dist *d, int k, const bench_args *a) {
    const deft_device dev = deft_dist_device(d, k);
    if (a->model == MODEL_GPT2) ddp_build_gpt2(r, dev, &a->gpt2);
    else if (a->model == MODEL_RESNET) ddp_build_resnet(r, dev, a->bf16);
    else ddp_build_mlp(r, dev);
    deft_compile_options o = a->ab;
    o.dist = d;
    o.dist_local = k;
    o.no_cuda_graphs = !a->graphs;
    o.bucket_bytes = a->bucket_bytes;
    o.last_bucket_bytes = a->last_bucket_bytes;
    o.dist_bucket_pieces = a->bucket_pieces;
    o.zero_stage = a->zero;
    o.tf32 = a->tf32;
    o.autocast = a->bf16 ? DEFT_BF16 : DEFT_F32;
    r->p = deft_compile(r->g, (deft_tensor *[]){r->loss, r->step}, 2, &o);
    if (!r->p) {
        fprintf(stderr, "%s: compiling replica %d%s: %s\n", prog, k, a->zero ? " (zero_stage 1)" : "",
                deft_graph_error(r->g) != DEFT_OK ? deft_graph_errmsg(r->g) : deft_errmsg());
        exit(1);
    }
    if (a->model == MODEL_GPT2) ddp_feed_gpt2(r, k, &a->gpt2);
    else if (a->model == MODEL_RESNET) ddp_feed_resnet(r, k, a->bf16);
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

/* What one world's run measured. */
typedef struct world_result {
    float first, warm;
    double step_s[REPEATS], queue_s[REPEATS];   /* sorted */
    size_t peak_bytes, state_bytes;             /* gpt2 only */
} world_result;

static void measure(deft_dist *d, ddp_replica *r, deft_program **ps, int n, const bench_args *a, world_result *w) {
    w->first = run(d, r, ps, n, 1, NULL);
    w->warm = run(d, r, ps, n, WARMUP - 1, NULL);
    double t = seconds();
    run(d, r, ps, n, 10, NULL);
    const double est = (seconds() - t) / 10;
    const double target = a->model == MODEL_GPT2 ? 0.5 : a->model == MODEL_RESNET ? 0.2 : 0.1;
    int64_t steps = (int64_t)(target / (est > 1e-6 ? est : 1e-6));
    if (steps < 5) steps = 5;
    for (int i = 0; i < REPEATS; i++) {
        t = seconds();
        run(d, r, ps, n, steps, &w->queue_s[i]);
        w->step_s[i] = (seconds() - t) / (double)steps;
        w->queue_s[i] /= (double)steps;
    }
    sort_times(w->step_s, REPEATS);
    sort_times(w->queue_s, REPEATS);
}

/* GPT-2's memory figures: the largest per-GPU peak of the allocator, and rank 0's optimizer state. */
static void memory_figures(deft_dist *d, const ddp_replica *r, int n, world_result *w) {
    for (int k = 0; k < n; k++) {
        deft_memory_stats ms;
        CHECK(deft_memory_stats_get(deft_dist_device(d, k), &ms));
        if ((size_t)ms.allocated_bytes.peak > w->peak_bytes) w->peak_bytes = (size_t)ms.allocated_bytes.peak;
    }
    w->state_bytes = ddp_optimizer_state_bytes(&r[0], deft_dist_device(d, 0));
}

static const char *tag_of(const bench_args *a) {
    if (a->zero) return a->graphs ? "deft_zero" : "deft_zero_nographs";
    return a->graphs ? "deft" : "deft_nographs";
}

static int64_t batch_of(const bench_args *a) {
    return a->model == MODEL_GPT2 ? a->gpt2.batch * a->gpt2.seq : a->model == MODEL_RESNET ? DDP_RESNET_BATCH
                                                                                            : DDP_MLP_BATCH;
}

static void print_world(const bench_args *a, const char *key, int n, const world_result *w, const char *status) {
    const char *tag = tag_of(a), *unit = a->model == MODEL_GPT2 ? "tokens" : "images";
    const double med = w->step_s[REPEATS / 2];
    printf("ddp.%s.gpus%d.%s_loss_step1 %.6f loss\n", key, n, tag, w->first);
    printf("ddp.%s.gpus%d.%s_loss_step%d %.6f loss\n", key, n, tag, WARMUP, w->warm);
    printf("ddp.%s.gpus%d.%s_step_ms %.4f ms\n", key, n, tag, med * 1e3);
    printf("ddp.%s.gpus%d.%s_step_ms_min %.4f ms\n", key, n, tag, w->step_s[0] * 1e3);
    printf("ddp.%s.gpus%d.%s_host_queue_us %.1f us\n", key, n, tag, w->queue_s[REPEATS / 2] * 1e6);
    printf("ddp.%s.gpus%d.%s_%s_per_s %.1f %s/s\n", key, n, tag, unit, (double)n * (double)batch_of(a) / med, unit);
    if (a->model == MODEL_GPT2) {
        printf("ddp.%s.gpus%d.%s_peak_bytes %zu bytes\n", key, n, tag, w->peak_bytes);
        printf("ddp.%s.gpus%d.%s_optimizer_state_bytes %zu bytes\n", key, n, tag, w->state_bytes);
    }
    printf("# %s: %s\n", prog, status);
    fflush(stdout);
}

/* One run over n GPUs, its figures printed. */
static void bench_world(const bench_args *a, const char *key, int n, world_result *w) {
    deft_dist *d;
    CHECK(deft_dist_init_local_with(
        &(deft_dist_local_options){.ngpus = n, .timeout_s = 120, .collective_blocks = a->nccl_blocks}, &d));
    if (a->nccl_blocks) printf("ddp.%s.gpus%d.nccl_blocks %d count\n", key, n, a->nccl_blocks);
    for (int k = 0; k < n; k++) CHECK(deft_memory_reset_peak(deft_dist_device(d, k)));
    ddp_replica r[MAX_GPUS];
    deft_program *ps[MAX_GPUS];
    for (int k = 0; k < n; k++) {
        build(&r[k], d, k, a);
        ps[k] = r[k].p;
    }
    *w = (world_result){0};
    measure(d, r, ps, n, a, w);
    if (a->model == MODEL_GPT2) memory_figures(d, r, n, w);
    print_world(a, key, n, w, deft_program_graph_status(r[0].p));
    for (int k = 0; k < n; k++) deft_graph_free(r[k].g);
    deft_dist_free(d);
    CHECK(deft_memory_release_all());
}

static const char help[] =
    "usage: bench_ddp [--model mlp|resnet|gpt2] [--precision f32|bf16] [--gpus N] [--no-graphs] [--bucket-mib M]\n"
    "                 [--last-bucket-mib M] [--bucket-pieces] [--tf32] [--zero] [--reduce-bf16] [--efficiency]\n"
    "                 [--nccl-blocks K] [--batch B] [--seq T] [--layers L] [A/B options]\n"
    "\n"
    "Data parallel training over N GPUs of one process, gradients all-reduced in buckets inside each replica's\n"
    "CUDA Graph. Without NCCL or with fewer GPUs than asked for it says so and exits 0.\n"
    "\n"
    "  --model mlp|resnet|gpt2  the model (default: mlp, the mid MLP, batch 256 per GPU; resnet: ResNet-18, batch\n"
    "                         128 per GPU; gpt2: GPT-2 124M, AdamW, clipping 1.0, batch --batch per GPU)\n"
    "  --precision f32|bf16   bf16: autocast bf16 (resnet: NHWC), resnet or gpt2 (default: f32; gpt2: bf16)\n"
    "  --gpus N               GPUs, 1 to 16 (default: 1)\n"
    "  --no-graphs            no CUDA Graphs (default: graphs)\n"
    "  --bucket-mib M         the gradient buckets' size in MiB (default: 8)\n"
    "  --last-bucket-mib M    the last bucket's size in MiB (default: the compile option's default)\n"
    "  --bucket-pieces        the compile option dist_bucket_pieces (default: off)\n"
    "  --tf32                 the compile option tf32 (default: off)\n"
    "  --zero                 the compile option zero_stage = 1: ZeRO-1, the optimizer's state sharded (default: 0)\n"
    "  --reduce-bf16          the compile option dist_reduce_dtype = bf16: bf16 gradients averaged as they are (bf16\n"
    "                         autocast only; default: f32, as PyTorch's DDP)\n"
    "  --efficiency           with N > 1: the same run on 1 GPU first, then the scaling efficiency (default: off)\n"
    "  --nccl-blocks K        NCCL's blocks per collective, 1 to 64 (the dist option collective_blocks; default: 32)\n"
    "  --batch B              gpt2: sequences per GPU (default: 16)\n"
    "  --seq T                gpt2: sequence length, 1 to 1024 (default: 1024)\n"
    "  --layers L             gpt2: blocks, 1 to 64 (default: 12)\n"
    BENCH_AB_HELP
    "  -h, --help             this help\n";

static void usage(void) {
    fprintf(stderr,
            "usage: %s [--model mlp|resnet|gpt2] [--precision f32|bf16] [--gpus N] [--no-graphs] [--bucket-mib M] "
            "[--last-bucket-mib M] [--bucket-pieces] [--tf32] [--zero] [--reduce-bf16] [--efficiency] "
            "[--nccl-blocks K] [--batch B] "
            "[--seq T] [--layers L] " BENCH_AB_USAGE "\n",
            prog);
    exit(2);
}

/* A whole decimal integer in [lo, hi], else a message naming the option and exit 2. */
static int64_t count_arg(const char *opt, const char *s, int64_t lo, int64_t hi) {
    char *end = NULL;
    const long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s %s: want an integer in [%lld, %lld]\n", prog, opt, s, (long long)lo, (long long)hi);
        exit(2);
    }
    return v;
}

/* The options with a value that only gpt2 takes; 0 when argv[*i] is none of them. */
static int parse_gpt2_size(int argc, char **argv, int *i, bench_args *a) {
    const char *o = argv[*i];
    if (*i + 1 >= argc || (strcmp(o, "--batch") && strcmp(o, "--seq") && strcmp(o, "--layers"))) return 0;
    const char *v = argv[++*i];
    if (!strcmp(o, "--batch")) a->gpt2.batch = count_arg(o, v, 1, 1 << 16);
    else if (!strcmp(o, "--seq")) a->gpt2.seq = count_arg(o, v, 1, gpt2_124m().seq);
    else a->gpt2.layers = count_arg(o, v, 1, 64);
    a->gpt2_size_set = 1;
    return 1;
}

static void check(const bench_args *a) {
    const char *why = NULL;
    if (a->n < 1 || a->n > MAX_GPUS) why = "--gpus must be in 1..16";
    else if (a->bf16 && a->model == MODEL_MLP) why = "--precision bf16 is for --model resnet or gpt2";
    else if (a->gpt2_size_set && a->model != MODEL_GPT2) why = "--batch, --seq and --layers are for --model gpt2";
    else if (a->efficiency && a->n < 2) why = "--efficiency compares N > 1 GPUs with one: give --gpus 2 or more";
    if (why) fprintf(stderr, "%s: %s\n", prog, why), exit(2);
}

static bench_args parse(int argc, char **argv) {
    bench_args a = {.n = 1, .graphs = 1, .gpt2 = {.layers = 12, .batch = 16, .seq = 1024}};
    bench_help(argc, argv, help);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gpus") == 0 && i + 1 < argc) a.n = (int)count_arg("--gpus", argv[++i], 1, MAX_GPUS);
        else if (strcmp(argv[i], "--no-graphs") == 0) a.graphs = 0;
        else if (strcmp(argv[i], "--tf32") == 0) a.tf32 = 1;
        else if (strcmp(argv[i], "--bucket-pieces") == 0) a.bucket_pieces = 1;
        else if (strcmp(argv[i], "--zero") == 0) a.zero = 1;
        else if (strcmp(argv[i], "--reduce-bf16") == 0) a.ab.dist_reduce_dtype = DEFT_BF16;
        else if (strcmp(argv[i], "--efficiency") == 0) a.efficiency = 1;
        else if (strcmp(argv[i], "--nccl-blocks") == 0 && i + 1 < argc)
            a.nccl_blocks = (int)count_arg("--nccl-blocks", argv[++i], 1, DEFT_DIST_MAX_BLOCKS);
        else if ((strcmp(argv[i], "--bucket-mib") == 0 || strcmp(argv[i], "--last-bucket-mib") == 0) && i + 1 < argc) {
            const int last = strcmp(argv[i], "--last-bucket-mib") == 0;
            const double mib = atof(argv[++i]);
            if (!(mib > 0 && mib <= 65536)) fprintf(stderr, "%s: %s in (0, 65536]\n", prog, argv[i - 1]), exit(2);
            *(last ? &a.last_bucket_bytes : &a.bucket_bytes) = (size_t)(mib * 1048576);
        }
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            const char *m = argv[++i];
            if (strcmp(m, "mlp") && strcmp(m, "resnet") && strcmp(m, "gpt2")) usage();
            a.model = !strcmp(m, "gpt2") ? MODEL_GPT2 : !strcmp(m, "resnet") ? MODEL_RESNET : MODEL_MLP;
        } else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
            const char *p = argv[++i];
            if (strcmp(p, "f32") && strcmp(p, "bf16")) usage();
            a.bf16 = strcmp(p, "bf16") == 0;
            a.precision_set = 1;
        } else if (!parse_gpt2_size(argc, argv, &i, &a) && !bench_ab_option(argc, argv, &i, &a.ab)) usage();
    }
    if (a.model == MODEL_GPT2 && !a.precision_set) a.bf16 = 1;
    check(&a);
    return a;
}

static void make_key(const bench_args *a, char *key, size_t n) {
    if (a->model == MODEL_MLP) snprintf(key, n, "mid");
    else if (a->model == MODEL_RESNET) snprintf(key, n, "resnet_%s", a->bf16 ? "bf16" : "f32");
    else if (a->gpt2.layers == 12 && a->gpt2.seq == 1024)
        snprintf(key, n, "gpt2_124m_b%lld_%s", (long long)a->gpt2.batch, a->bf16 ? "bf16" : "f32");
    else
        snprintf(key, n, "gpt2_l%lld_t%lld_b%lld_%s", (long long)a->gpt2.layers, (long long)a->gpt2.seq,
                 (long long)a->gpt2.batch, a->bf16 ? "bf16" : "f32");
}

int main(int argc, char **argv) {
    const bench_args a = parse(argc, argv);
    const int n = a.n;
    char key[96];
    make_key(&a, key, sizeof key);
    if (!deft_has_nccl_build() || deft_cuda_device_count() < n) {
        printf("# %s: ddp.%s needs NCCL and %d GPUs (%d visible): skipped\n", prog, key, n,
               deft_cuda_device_count());
        return 0;
    }
    if (a.model == MODEL_GPT2)
        printf("# %s: GPT-2 %lld layers, T %lld, batch %lld per GPU, %s, %d GPU(s), zero_stage %d\n", prog,
               (long long)a.gpt2.layers, (long long)a.gpt2.seq, (long long)a.gpt2.batch,
               a.bf16 ? "bf16 autocast" : "f32", n, a.zero);
    world_result one = {0}, all = {0};
    if (a.efficiency) bench_world(&a, key, 1, &one);
    bench_world(&a, key, n, &all);
    if (a.efficiency)
        printf("ddp.%s.gpus%d.%s_scaling_efficiency %.4f x\n", key, n, tag_of(&a),
               one.step_s[REPEATS / 2] / all.step_s[REPEATS / 2]);
    return 0;
}
