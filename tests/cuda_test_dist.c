/* Data parallel training over NCCL on 2 GPUs (skips, exit 77, with fewer or without NCCL):
 * - one process driving both GPUs (deft_dist_init_local + deft_dist_run): an MLP trained for STEPS steps on two
 *   replicas of batch B each equals the same MLP trained on one GPU with the batch 2B (the two halves), within
 *   tolerance; the two replicas hold bit-identical parameters after every step; the replicas replay a CUDA Graph and
 *   equal eagerly run ones (no_cuda_graphs); small buckets (several per step, all-reduced in place) give the same
 *   parameters as one bucket (packed into one buffer for a single all-reduce);
 * - the optimizer's update in pieces per bucket (dist_bucket_pieces) gives bit-identical parameters to the one-node step
 *   (without dist_bucket_pieces) after STEPS steps, on one rank (needs one GPU only) and on two, with one bucket
 *   and several;
 *   the bucket layout: the last bucket is one gradient (last_bucket_bytes), each bucket joins at its own piece, the
 *   pieces after the backward pass in bucket order (without dist_bucket_pieces every bucket joins at the one step);
 * - on one rank under TF32, the side lane's weight gradients (passes/side_lane.h) and one stream give the same bits;
 * - param_copies under bf16 autocast, replica 1's weight rewritten before the first run (the broadcast undoes it):
 *   bit for bit the run that casts the weights;
 * - dist_reduce_dtype bf16 under bf16 autocast: the steps read the averaged bf16 gradients (none with the f32
 *   average), the replicas stay bit-identical and the parameters within 1e-2 (relative to their norm) of the f32
 *   average's; refused without autocast;
 * - misuse: a local replica run alone, a replica on the wrong GPU, optimizer_in_backward, dist_local out of range;
 *   deft_dist_run given replicas out of place, one twice, or a program that is no replica; a run whose replicas all
 *   fail (never fed) names a rank, and the kept threads of deft_dist_run run the next one;
 * - two processes (this executable run again with --child) meeting through a file rendezvous train the same way and
 *   end bit-identical and equal to the one-GPU run; when rank 1 dies after joining, rank 0's read fails with
 *   DEFT_ERR_RUNTIME within its timeout instead of hanging. */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "deft_testing.h"   /* deft_ddp_bucket_layout, deft_compile_into: the status of a compile */
#include "dist_mlp.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define B 32
#define STEPS 5

static deft_optimizer *dist_sgd(deft_graph *g, void *ctx) {
    (void)ctx;
    return deft_sgd(g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, NULL);
}

/* The MLP (dist_mlp.h) with SGD and momentum. */
static int mlp_build(mlp *m, deft_device dev, int64_t batch, const deft_compile_options *o) {
    return mlp_build_with(m, dev, batch, o, dist_sgd, NULL);
}

/* The one-GPU run with the doubled batch: parameters after each step, STEPS * n floats. */
static float *reference(size_t *n_out) {
    mlp ref;
    if (!mlp_build(&ref, deft_cuda(0), 2 * B, NULL)) return NULL;
    const size_t n = mlp_param_floats(&ref);
    float *all = malloc(STEPS * n * sizeof *all);
    for (int s = 0; s < STEPS; s++) {
        mlp_feed(&ref, s, 0, 2 * B);
        CHECK_OK(deft_program_run(ref.p));
        mlp_params(&ref, all + (size_t)s * n);
    }
    deft_graph_free(ref.g);
    *n_out = n;
    return all;
}

/* Two replicas in this process; their parameters after the last step into out (when not NULL). */
static int packed_seen, buckets_seen;   /* packed buckets, and buckets, of the last train_local's replica 0 */
static int bf16_grads_seen;             /* bf16 gradients its step nodes read */
static float rank1_gain;                /* nonzero: replica 1's first weight scaled by it before the first run */

/* Replica 1's first weight scaled (deft_param_set): the first run's broadcast of rank 0's parameters undoes it. */
static void scale_first_weight(mlp *m, float gain) {
    const int64_t k = deft_tensor_numel(m->params[0]);
    float *w = malloc((size_t)k * sizeof *w);
    if (!w) return;
    CHECK_OK(deft_param_get(m->params[0], w, (size_t)k * sizeof *w));
    for (int64_t i = 0; i < k; i++) w[i] *= gain;
    CHECK_OK(deft_param_set(m->params[0], w, (size_t)k * sizeof *w));
    free(w);
}

/* The bf16 sources of the step nodes that p computes. */
static int bf16_step_sources(const deft_program *p, const deft_graph *g) {
    int k = 0;
    for (int id = 0; id < deft_graph_node_count(g); id++) {
        const deft_tensor *t = deft_testing_node(g, id);
        if (!deft_testing_is_op(t, "optimizer") || !deft_program_schedules(p, t)) continue;
        for (int i = 0; i < deft_testing_src_count(t); i++) k += deft_tensor_dtype(deft_testing_src(t, i)) == DEFT_BF16;
    }
    return k;
}

/* Two replicas trained STEPS steps; with ref (the one-GPU run of the doubled batch), each step's parameters are held
 * to it. */

static void train_local(deft_dist *d, const float *ref, size_t n, const deft_compile_options *base, const char *what,
                        float *out) {
    mlp r[2];
    deft_compile_options o = base ? *base : (deft_compile_options){0};
    o.dist = d;
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        o.dist_local = k;
        ok &= mlp_build(&r[k], deft_dist_device(d, k), B, &o);
    }
    float *p0 = malloc(n * sizeof *p0), *p1 = malloc(n * sizeof *p1);
    if (ok && rank1_gain != 0.0f) scale_first_weight(&r[1], rank1_gain);
    for (int s = 0; ok && s < STEPS; s++) {
        for (int k = 0; k < 2; k++) mlp_feed(&r[k], s, k * B, B);
        CHECK_OK(deft_dist_run(d, (deft_program *[]){r[0].p, r[1].p}, 2));
        float l0, l1;
        CHECK_OK(deft_program_read(r[0].p, r[0].loss, &l0, sizeof l0));
        CHECK_OK(deft_program_read(r[1].p, r[1].loss, &l1, sizeof l1));
        mlp_params(&r[0], p0);
        mlp_params(&r[1], p1);
        CHECK_MSG(memcmp(p0, p1, n * sizeof *p0) == 0, "%s: the replicas differ after step %d", what, s);
        const double diff = ref ? max_rel_diff(p0, ref + (size_t)s * n, n) : 0.0;
        CHECK_MSG(diff < 2e-3, "%s: step %d: 2 GPUs x batch %d vs 1 GPU x batch %d: max relative difference %g", what,
                  s, B, 2 * B, diff);
    }
    if (ok && !(base && base->no_cuda_graphs))
        CHECK_MSG(strcmp(deft_program_graph_status(r[0].p), "replaying a CUDA Graph") == 0, "%s: %s", what,
                  deft_program_graph_status(r[0].p));
    if (ok && out) memcpy(out, p0, n * sizeof *p0);
    packed_seen = deft_ddp_packed_buckets(r[0].p);
    buckets_seen = deft_ddp_bucket_layout(r[0].p, NULL, NULL, 0);
    bf16_grads_seen = ok ? bf16_step_sources(r[0].p, r[0].g) : -1;
    free(p0);
    free(p1);
    for (int k = 0; k < 2; k++) deft_graph_free(r[k].g);
}

/* A one-layer classifier with SGD on dev: its graph, its loss and its step (for compiles that must be refused). */
static deft_graph *small_step_graph(deft_device dev, deft_tensor **loss, deft_tensor **step) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){4, 8}, dev);
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){4}, dev);
    *loss = deft_cross_entropy(deft_linear(x, CLASSES, "fc", NULL), y);
    CHECK_OK(deft_backward(*loss));
    *step = deft_optimizer_step(deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL));
    return g;
}

/* dist_reduce_dtype bf16 under bf16 autocast: the weights' bf16 gradients averaged as they are. The replicas stay
 * bit-identical (checked by train_local), the steps read bf16 gradients where the f32 average's read none, and the
 * parameters stay within bf16 rounding of the f32 average's (relative to their norm). Refused without autocast. */
static void test_bf16_reduce(deft_dist *d, size_t n) {
    float *f32 = malloc(n * sizeof *f32), *bf16 = malloc(n * sizeof *bf16);
    if (!f32 || !bf16) {
        free(f32);
        free(bf16);
        return;
    }
    train_local(d, NULL, n, &(deft_compile_options){.autocast = DEFT_BF16}, "bf16 autocast, f32 average", f32);
    const int f32_reads = bf16_grads_seen;
    train_local(d, NULL, n, &(deft_compile_options){.autocast = DEFT_BF16, .dist_reduce_dtype = DEFT_BF16},
                "bf16 autocast, bf16 average", bf16);
    CHECK_MSG(f32_reads == 0 && bf16_grads_seen >= 3, "bf16 gradients read: %d with the f32 average, %d with bf16",
              f32_reads, bf16_grads_seen);
    double dd = 0.0, nn = 0.0;
    for (size_t i = 0; i < n; i++) {
        dd += ((double)f32[i] - bf16[i]) * ((double)f32[i] - bf16[i]);
        nn += (double)f32[i] * f32[i];
    }
    const double rel = nn > 0 ? sqrt(dd / nn) : 1.0;
    printf("bf16 average vs f32 average after %d steps: relative difference %g\n", STEPS, rel);
    CHECK_MSG(rel > 0.0 && rel < 1e-2, "bf16 average vs f32 average: relative difference %g", rel);
    free(f32);
    free(bf16);
    deft_tensor *loss, *step;
    deft_graph *g = small_step_graph(deft_cuda(0), &loss, &step);
    deft_program *bad = NULL;
    const deft_compile_options no_amp = {.dist = d, .dist_local = 0, .dist_reduce_dtype = DEFT_BF16};
    CHECK_ERR(deft_compile_into(g, (deft_tensor *[]){loss, step}, 2, &no_amp, &bad), DEFT_ERR_INVALID,
              "give dist and autocast bf16 too");
    deft_graph_free(g);
}

/* param_copies under dist: replica 1's weight rewritten before the first run, then overwritten by rank 0's broadcast;
 * its copy is written again behind the broadcast, so the replicas stay bit-identical (train_local checks) and equal,
 * bit for bit, the same training casting the weights. */
static void test_param_copies_replicas(deft_dist *d, size_t n) {
    float *cast = malloc(n * sizeof *cast), *copied = malloc(n * sizeof *copied);
    if (cast && copied) {
        rank1_gain = 3.0f;
        train_local(d, NULL, n, &(deft_compile_options){.autocast = DEFT_BF16}, "bf16 autocast, casts", cast);
        train_local(d, NULL, n, &(deft_compile_options){.autocast = DEFT_BF16, .param_copies = 1},
                    "bf16 autocast, param_copies", copied);
        rank1_gain = 0.0f;
        CHECK_MSG(memcmp(cast, copied, n * sizeof *cast) == 0, "2 ranks: param_copies and casts differ");
    }
    free(cast);
    free(copied);
}

static void test_local(const float *ref, size_t n) {
    deft_dist *d = NULL;
    CHECK_OK(deft_dist_init_local(2, 60, &d));
    if (!d) return;
    CHECK(deft_dist_world(d) == 2 && deft_dist_local_count(d) == 2 && deft_dist_rank(d, 1) == 1);
    float *graphs = malloc(n * sizeof *graphs), *eager = malloc(n * sizeof *eager), *small = malloc(n * sizeof *small);
    train_local(d, ref, n, NULL, "local, graphs", graphs);
    /* One bucket holds all eight gradients: packed into one buffer and all-reduced by one call. The 64 KiB buckets
     * below hold one or two each: all-reduced in place, one call per gradient; both give the same parameters. */
    CHECK_MSG(packed_seen == 1, "one bucket: %d packed", packed_seen);
    train_local(d, ref, n, &(deft_compile_options){.no_cuda_graphs = 1}, "local, eager", eager);
    /* The whole MLP (0.8 MB) fits the last bucket's 1 MiB: both limits are cut to 64 KiB for several buckets. */
    const deft_compile_options small_o = {.bucket_bytes = 64 << 10, .last_bucket_bytes = 64 << 10};
    train_local(d, ref, n, &small_o, "local, 64 KiB buckets", small);
    CHECK_MSG(packed_seen == 0 && buckets_seen > 1, "64 KiB buckets: %d of %d packed", packed_seen, buckets_seen);
    const double ge = max_rel_diff(graphs, eager, n), gs = max_rel_diff(graphs, small, n);
    printf("graph vs eager: max relative difference %g; one bucket vs 64 KiB buckets: %g\n", ge, gs);
    CHECK(ge < 1e-6 && gs < 1e-6);
    /* The pieces per bucket against the one-node step: the same bits, with one bucket and with several. */
    float *pieces = malloc(n * sizeof *pieces);
    train_local(d, ref, n, &(deft_compile_options){.dist_bucket_pieces = 1}, "local, pieces", pieces);
    CHECK_MSG(memcmp(graphs, pieces, n * sizeof *pieces) == 0, "2 ranks: pieces per bucket and the whole step differ");
    train_local(d, ref, n,
                &(deft_compile_options){.bucket_bytes = 64 << 10, .last_bucket_bytes = 64 << 10, .dist_bucket_pieces = 1},
                "local, 64 KiB buckets, pieces", pieces);
    CHECK_MSG(memcmp(small, pieces, n * sizeof *pieces) == 0,
              "2 ranks, 64 KiB buckets: pieces per bucket and the whole step differ");
    free(pieces);
    /* Communicators of 4 NCCL blocks per collective instead of 32: with two ranks each element's sum has one order,
     * so the parameters are the same bits. */
    deft_dist *few = NULL;
    CHECK_OK(deft_dist_init_local_with(&(deft_dist_local_options){.ngpus = 2, .timeout_s = 60, .collective_blocks = 4},
                                       &few));
    if (few) {
        float *blocks4 = malloc(n * sizeof *blocks4);
        train_local(few, ref, n, NULL, "local, 4 NCCL blocks", blocks4);
        CHECK_MSG(memcmp(graphs, blocks4, n * sizeof *blocks4) == 0, "2 ranks: 4 NCCL blocks and 32 differ");
        free(blocks4);
        deft_dist_free(few);
    }
    free(graphs);
    free(eager);
    free(small);
    test_bf16_reduce(d, n);
    test_param_copies_replicas(d, n);

    /* Misuse. */
    mlp m;
    deft_compile_options o = {.dist = d, .dist_local = 0};
    if (mlp_build(&m, deft_cuda(0), B, &o)) {
        mlp_feed(&m, 0, 0, B);
        CHECK_ERR(deft_program_run(m.p), DEFT_ERR_STATE, "deft_dist_run");
        CHECK_ERR(deft_dist_run(d, (deft_program *[]){m.p}, 1), DEFT_ERR_INVALID, "1 replicas for 2");
    }
    deft_graph_free(m.g);
    /* A run in which every replica fails (none was fed) names the first rank; the threads kept for the runs then
     * run the next one, and both replicas hold the same parameters after it. */
    mlp u[2];
    int built = 1;
    for (int r = 0; r < 2; r++)
        built &= mlp_build(&u[r], deft_cuda(r), B, &(deft_compile_options){.dist = d, .dist_local = r});
    if (built) {
        /* Replicas out of place, one twice, or a program that is no replica: refused before anything is queued. */
        CHECK_ERR(deft_dist_run(d, (deft_program *[]){u[1].p, u[0].p}, 2), DEFT_ERR_INVALID, "dist_local = 1");
        CHECK_ERR(deft_dist_run(d, (deft_program *[]){u[0].p, u[0].p}, 2), DEFT_ERR_INVALID, "dist_local = 0;");
        mlp plain;
        if (mlp_build(&plain, deft_cuda(1), B, NULL))
            CHECK_ERR(deft_dist_run(d, (deft_program *[]){u[0].p, plain.p}, 2), DEFT_ERR_INVALID, "not a replica");
        deft_graph_free(plain.g);
        CHECK_ERR(deft_dist_run(d, (deft_program *[]){u[0].p, u[1].p}, 2), DEFT_ERR_STATE, "rank 0");
        for (int r = 0; r < 2; r++) mlp_feed(&u[r], 0, r * B, B);
        CHECK_OK(deft_dist_run(d, (deft_program *[]){u[0].p, u[1].p}, 2));
        const size_t nf = mlp_param_floats(&u[0]);
        float *p0 = malloc(nf * sizeof *p0), *p1 = malloc(nf * sizeof *p1);
        if (p0 && p1) {
            mlp_params(&u[0], p0);
            mlp_params(&u[1], p1);
            CHECK_MSG(memcmp(p0, p1, nf * sizeof *p0) == 0, "after a failed run: the replicas differ");
        }
        free(p0);
        free(p1);
    }
    for (int r = 0; r < 2; r++) deft_graph_free(u[r].g);
    deft_program *bad = NULL;
    deft_tensor *loss, *step;
    deft_graph *g = small_step_graph(deft_cuda(1), &loss, &step);
    CHECK_ERR(deft_compile_into(g, (deft_tensor *[]){loss, step}, 2, &o, &bad), DEFT_ERR_DEVICE,
              "must run on cuda:0 alone");
    o.dist_local = 5;
    CHECK_ERR(deft_compile_into(g, (deft_tensor *[]){loss, step}, 2, &o, &bad), DEFT_ERR_INVALID, "dist_local 5");
    o = (deft_compile_options){.dist = d, .dist_local = 1, .optimizer_in_backward = 1};
    CHECK_ERR(deft_compile_into(g, (deft_tensor *[]){loss, step}, 2, &o, &bad), DEFT_ERR_INVALID,
              "optimizer_in_backward");
    o.optimizer_in_backward = 0;
    CHECK_ERR(deft_compile_into(g, &loss, 1, &o, &bad), DEFT_ERR_INVALID, "no optimizer step");
    deft_graph_free(g);
    deft_dist_free(d);
}

/* ---- one rank (one GPU) ---- */

/* The buckets of a compiled replica: as many as the split's pieces, the last one fc0's weight alone, each joined at
 * its own piece (whole: all at the one step), the pieces after every other step. */
static void check_layout(const mlp *m, bool whole) {
    size_t bytes[64];
    int joins[64];
    const deft_program *p = m->p;
    const int nb = deft_ddp_bucket_layout(p, bytes, joins, 64);
    CHECK_MSG(nb >= 3 && nb <= 64, "%d buckets", nb);
    if (nb < 3 || nb > 64) return;
    printf("%s: %d buckets, the last %zu bytes\n", whole ? "whole step" : "pieces", nb, bytes[nb - 1]);
    CHECK_MSG(bytes[nb - 1] == (size_t)WIDTH * WIDTH * sizeof(float), "the last bucket has %zu bytes", bytes[nb - 1]);
    deft_testing_split sp;
    const int n_steps = deft_program_step_count(p);
    CHECK(whole == !deft_testing_program_split(p, &sp));
    if (whole) {
        for (int k = 0; k < nb; k++) CHECK(joins[k] == joins[0] && joins[k] < n_steps);
        return;
    }
    CHECK(sp.per_bucket && sp.n_pieces == nb);
    int first_piece = n_steps;
    for (int i = n_steps - 1; i >= 0; i--)
        if (deft_testing_is_op(deft_testing_step_node(p, i), "optimizer")) first_piece = i;
    CHECK_MSG(first_piece == n_steps - nb - 1, "the pieces start at step %d of %d", first_piece, n_steps);
    for (int k = 0; k < nb; k++) {
        const deft_tensor *t = deft_testing_step_node(p, joins[k]);
        int finisher = 1;
        const int piece = deft_testing_optimizer_part(deft_testing_step_optimizer(t), NULL, &finisher) != NULL;
        CHECK_MSG(piece && !finisher && sp.bucket_of[deft_testing_node_id(t) - sp.n_before] == k &&
                      joins[k] == first_piece + k,
                  "bucket %d joins at step %d (%s)", k, joins[k], deft_tensor_name(t));
    }
}

/* One rank: pieces per bucket and the whole step train to the same bits (a replica of one rank runs alone). */
static void test_one_rank(void) {
    deft_dist *d = NULL;
    CHECK_OK(deft_dist_init_local(1, 60, &d));
    if (!d) return;
    const deft_compile_options small = {.dist = d, .bucket_bytes = 64 << 10, .last_bucket_bytes = 16 << 10};
    mlp m[2];
    float *params[2] = {NULL, NULL};
    for (int w = 0; w < 2; w++) {
        deft_compile_options o = small;
        o.dist_bucket_pieces = !w;
        if (!mlp_build(&m[w], deft_dist_device(d, 0), B, &o)) continue;
        check_layout(&m[w], w);
        for (int s = 0; s < STEPS; s++) {
            mlp_feed(&m[w], s, 0, B);
            CHECK_OK(deft_program_run(m[w].p));
        }
        float norm;
        CHECK_OK(deft_program_read(m[w].p, m[w].step, &norm, sizeof norm));
        CHECK_MSG(isfinite(norm) && norm > 0, "the step's norm %g", norm);
        params[w] = malloc(mlp_param_floats(&m[w]) * sizeof(float));
        mlp_params(&m[w], params[w]);
    }
    if (params[0] && params[1])
        CHECK_MSG(memcmp(params[0], params[1], mlp_param_floats(&m[0]) * sizeof(float)) == 0,
                  "1 rank: pieces per bucket and the whole step differ after %d steps", STEPS);
    for (int w = 0; w < 2; w++) {
        free(params[w]);
        deft_graph_free(m[w].g);
    }
    deft_dist_free(d);
}

/* Under TF32 at batch 1024, over two GPUs where there are two (else one rank): fc0..fc2's weight gradients run on
 * the side lane (passes/side_lane.h) and the buckets' all-reduces wait for both streams; rank 0's parameters follow
 * those of the same replicas compiled with no_side_lane within 1e-4 (relative) after every step, with several
 * buckets and with one. Not bit for bit: the side lane's smaller cuBLAS scratch may take another split of the
 * products' sums. A bucket reduced before its last gradient was written would be off by the whole update (a world
 * of one rank queues no all-reduce, so only the pair checks that). */
#define SIDE_RANKS_MAX 2
static void test_side_lane_replicas(void) {
    const int nr = deft_cuda_device_count() >= SIDE_RANKS_MAX ? SIDE_RANKS_MAX : 1;
    deft_dist *d = NULL;
    CHECK_OK(deft_dist_init_local(nr, 60, &d));
    if (!d) return;
    const int64_t batch = 1024;
    for (int buckets = 0; buckets < 2; buckets++) {
        mlp m[2][SIDE_RANKS_MAX];   /* [side lane off?][rank] */
        deft_program *reps[2][SIDE_RANKS_MAX] = {{NULL}};
        int ok = 1;
        for (int w = 0; w < 2; w++) {
            for (int r = 0; r < nr; r++) {
                /* The MLP (0.8 MB) fits the last bucket's 1 MiB default: both limits are cut for several. */
                const deft_compile_options o = {.dist = d, .dist_local = r, .tf32 = 1,
                                                .bucket_bytes = buckets ? 64 << 10 : 0,
                                                .last_bucket_bytes = buckets ? 64 << 10 : 0, .no_side_lane = w};
                ok &= mlp_build(&m[w][r], deft_dist_device(d, r), batch, &o);
                reps[w][r] = m[w][r].p;
            }
        }
        if (ok) {
            CHECK_MSG(deft_program_side_steps(m[0][0].p) == LAYERS - 1 && deft_program_side_steps(m[1][0].p) == 0,
                      "side steps %d and %d", deft_program_side_steps(m[0][0].p), deft_program_side_steps(m[1][0].p));
            const int nb = deft_ddp_bucket_layout(m[0][0].p, NULL, NULL, 0);
            CHECK_MSG(buckets ? nb > 1 : nb == 1, "side lane, %s: %d buckets", buckets ? "64 KiB buckets" : "one bucket",
                      nb);
            const size_t n = mlp_param_floats(&m[0][0]);
            float *pa = malloc(n * sizeof *pa), *pb = malloc(n * sizeof *pb);
            for (int s = 0; pa && pb && s < STEPS; s++) {
                for (int w = 0; w < 2; w++) {
                    for (int r = 0; r < nr; r++) mlp_feed(&m[w][r], s, r * batch, batch);
                    CHECK_OK(deft_dist_run(d, reps[w], nr));
                }
                mlp_params(&m[0][0], pa);
                mlp_params(&m[1][0], pb);
                const double diff = max_rel_diff(pa, pb, n);
                CHECK_MSG(diff < 1e-4, "side lane, %d rank(s), %s: step %d: max relative difference %g", nr,
                          buckets ? "64 KiB buckets" : "one bucket", s, diff);
                if (s == STEPS - 1)
                    printf("side lane, %d rank(s), %s: max relative difference after %d steps %g\n", nr,
                           buckets ? "64 KiB buckets" : "one bucket", STEPS, diff);
            }
            free(pa);
            free(pb);
        }
        for (int w = 0; w < 2; w++)
            for (int r = 0; r < nr; r++) deft_graph_free(m[w][r].g);
    }
    deft_dist_free(d);
}

/* ---- two processes ---- */

static int child_main(int rank, const char *mode, const char *path) {
    char spec[300];
    snprintf(spec, sizeof spec, "file:%s", path);
    deft_dist *d = NULL;
    deft_dist_options o = {.rank = rank, .world = 2, .rendezvous = spec, .device = rank, .timeout_s = 8};
    if (deft_dist_init(&o, &d) != DEFT_OK) {
        fprintf(stderr, "rank %d: dist_init: %s\n", rank, deft_errmsg());
        return 2;
    }
    if (strcmp(mode, "die") == 0 && rank == 1) _exit(0);   /* joined, then gone without a word */
    mlp m;
    if (!mlp_build(&m, deft_cuda(rank), B, &(deft_compile_options){.dist = d})) return 3;
    const int die = strcmp(mode, "die") == 0;
    deft_status s = DEFT_OK;
    double t0 = 0;
    for (int step = 0; step < STEPS && s == DEFT_OK; step++) {
        mlp_feed(&m, step, rank * B, B);
        t0 = now_s();
        s = deft_program_run(m.p);
        float l;
        if (s == DEFT_OK) s = deft_program_read(m.p, m.loss, &l, sizeof l);
    }
    if (die) {
        const double waited = now_s() - t0;
        printf("rank 0 without its peer: %s after %.1f s: %s\n", deft_status_name(s), waited, deft_errmsg());
        return s == DEFT_ERR_RUNTIME && strstr(deft_errmsg(), "rank 0") && waited < 60 ? 0 : 4;
    }
    if (s != DEFT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, deft_errmsg());
        return 5;
    }
    const size_t n = mlp_param_floats(&m);
    float *p = malloc(n * sizeof *p);
    mlp_params(&m, p);
    char out[300];
    snprintf(out, sizeof out, "%s.out%d", path, rank);
    FILE *f = fopen(out, "wb");
    int ok = f && fwrite(p, sizeof *p, n, f) == n;
    if (f) fclose(f);
    free(p);
    deft_graph_free(m.g);
    deft_dist_free(d);
    return ok && deft_check_finish() == 0 ? 0 : 6;
}

/* Runs this executable as ranks 0 and 1; their exit codes into codes. */
static void spawn_pair(const char *self, const char *mode, const char *path, int codes[2]) {
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            char rank[4];
            snprintf(rank, sizeof rank, "%d", r);
            execl(self, self, "--child", rank, mode, path, (char *)NULL);
            _exit(127);
        }
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    }
}

static void test_processes(const char *self, const float *ref, size_t n) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/deft_cuda_test_dist_%ld", (long)getpid());
    int codes[2];
    spawn_pair(self, "train", path, codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0, "train: ranks exited %d and %d", codes[0], codes[1]);
    float *p[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    for (int r = 0; r < 2; r++) {
        char out[160];
        snprintf(out, sizeof out, "%s.out%d", path, r);
        FILE *f = fopen(out, "rb");
        CHECK_MSG(f && fread(p[r], sizeof(float), n, f) == n, "rank %d's parameters", r);
        if (f) fclose(f);
        remove(out);
    }
    CHECK_MSG(memcmp(p[0], p[1], n * sizeof(float)) == 0, "two processes: the ranks' parameters differ");
    const double diff = max_rel_diff(p[0], ref + (size_t)(STEPS - 1) * n, n);
    CHECK_MSG(diff < 2e-3, "two processes vs 1 GPU with the doubled batch: max relative difference %g", diff);
    free(p[0]);
    free(p[1]);
    spawn_pair(self, "die", path, codes);
    CHECK_MSG(codes[0] == 0, "die: rank 0 exited %d (4: no clear error in time)", codes[0]);
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--child") == 0) return child_main(atoi(argv[2]), argv[3], argv[4]);
    if (!deft_has_nccl_build() || deft_cuda_device_count() < 1) {
        printf("skipped: needs NCCL and a GPU\n");
        return DEFT_CHECK_SKIP;
    }
    test_one_rank();
    test_side_lane_replicas();
    if (deft_cuda_device_count() < 2) {
        printf("the tests of 2 ranks skipped: needs 2 GPUs\n");
        return deft_check_finish();
    }
    size_t n = 0;
    float *ref = reference(&n);
    if (ref) {
        test_local(ref, n);
        test_processes("/proc/self/exe", ref, n);
    }
    free(ref);
    return deft_check_finish();
}
