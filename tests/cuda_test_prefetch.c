/* deft_program_feed_async and deft_loader on a GPU: training fed asynchronously (the copy of batch k+1 queued while
 * step k runs, slots alternating) ends with the same parameters, bit for bit, as the same training fed
 * synchronously, and keeps replaying CUDA Graphs; so does training through a loader, slow or fast. A pinned buffer
 * freed right after feed_async is not handed out again while its copy is held back, so overwriting the new block
 * does not reach the step; feeding one buffer twice in a row, and a synchronous feed after an asynchronous one,
 * give the batch fed last. Pageable memory is refused. The copy stream is held still with a host function (as in
 * cuda_test_pinned_allocator.c) so that "in flight" is certain. Skips (77) where no GPU works. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "deft_testing.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#define BATCH 64
#define IN 32
#define HIDDEN 64
#define CLASSES 10
#define STEPS 40
#define GATE_TIMEOUT_S 20.0

#include "cuda_util.h"

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---- a gate: a stream held still by a host function until the test opens it ---- */
typedef struct gate {
    atomic_int open, timed_out;
} gate;

static void CUDART_CB gate_hold(void *arg) {
    gate *g = arg;
    double t0 = now_s();
    while (!atomic_load(&g->open)) {
        if (now_s() - t0 > GATE_TIMEOUT_S) {
            atomic_store(&g->timed_out, 1);
            return;
        }
        sleep_us(100);
    }
}

static void gate_close(gate *g, void *stream) {
    atomic_store(&g->open, 0);
    atomic_store(&g->timed_out, 0);
    CUDA_OK(cudaLaunchHostFunc((cudaStream_t)stream, gate_hold, g));
}

static void *copy_stream(void) {
    void *s = NULL;
    CHECK_OK(deft_prefetch_cuda_copy_stream(0, &s));
    return s;
}

/* ---- data: a hash of (batch, element), the same for every way of feeding ---- */
static uint32_t hash32(uint64_t stream, uint64_t i) {
    uint64_t h = (i + stream * 0x9E3779B1ull) & 0xffffffffull;
    h = ((h ^ (h >> 16)) * 0x045D9F3Bull) & 0xffffffffull;
    h = ((h ^ (h >> 16)) * 0x045D9F3Bull) & 0xffffffffull;
    return (uint32_t)(h ^ (h >> 16));
}

static void make_batch(int64_t k, float *x, int32_t *y) {
    for (int i = 0; i < BATCH * IN; i++) x[i] = (float)hash32(1000 + (uint64_t)k, (uint64_t)i) / 4294967296.0f - 0.5f;
    for (int i = 0; i < BATCH; i++) y[i] = (int32_t)(hash32(5000 + (uint64_t)k, (uint64_t)i) % CLASSES);
}

/* ---- the model: Linear(IN, HIDDEN), ReLU, Linear(HIDDEN, CLASSES), cross-entropy, SGD with momentum ---- */
typedef struct mlp {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_program *p;
} mlp;

static const char *const param_names[] = {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"};
static const size_t param_floats[] = {IN * HIDDEN, HIDDEN, HIDDEN * CLASSES, CLASSES};

/* Every model starts from the same parameters (written from a hash, not drawn), so runs can be compared. */
static void mlp_build(mlp *m) {
    deft_device dev = deft_cuda(0);
    m->g = deft_graph_new();
    m->x = deft_input(m->g, "x", DEFT_F32, 2, (int64_t[]){BATCH, IN}, dev);
    m->y = deft_input(m->g, "labels", DEFT_I32, 1, (int64_t[]){BATCH}, dev);
    deft_tensor *h = deft_relu(deft_linear(m->x, HIDDEN, "fc0", NULL));
    m->loss = deft_cross_entropy(deft_linear(h, CLASSES, "fc1", NULL), m->y);
    CHECK_OK(deft_backward(m->loss));
    deft_optimizer *opt = deft_sgd(m->g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, NULL);
    m->step = deft_optimizer_step(opt);
    CHECK_MSG(m->step != NULL, "building: %s", deft_errmsg());
    for (int k = 0; k < 4; k++) {
        float *v = malloc(param_floats[k] * sizeof *v);
        for (size_t i = 0; i < param_floats[k]; i++)
            v[i] = ((float)hash32(77 + (uint64_t)k, i) / 4294967296.0f - 0.5f) * 0.3f;
        CHECK_OK(deft_param_set(deft_graph_find(m->g, param_names[k]), v, param_floats[k] * sizeof *v));
        free(v);
    }
    m->p = deft_compile(m->g, (deft_tensor *[]){m->loss, m->step}, 2, NULL);
    CHECK_MSG(m->p != NULL, "compile: %s", deft_errmsg());
}

/* 1 when both models hold the same parameters, bit for bit. */
static int same_params(const mlp *a, const mlp *b) {
    int same = 1;
    for (int k = 0; k < 4; k++) {
        size_t bytes = param_floats[k] * sizeof(float);
        float *va = malloc(bytes), *vb = malloc(bytes);
        CHECK_OK(deft_param_get(deft_graph_find(a->g, param_names[k]), va, bytes));
        CHECK_OK(deft_param_get(deft_graph_find(b->g, param_names[k]), vb, bytes));
        if (memcmp(va, vb, bytes) != 0) {
            fprintf(stderr, "%s differs\n", param_names[k]);
            same = 0;
        }
        free(va);
        free(vb);
    }
    return same;
}

/* The reference: every batch fed synchronously from pageable memory. */
static void train_sync(mlp *m) {
    static float x[BATCH * IN];
    static int32_t y[BATCH];
    for (int64_t k = 0; k < STEPS; k++) {
        make_batch(k, x, y);
        CHECK_OK(deft_program_feed(m->p, m->x, x, sizeof x));
        CHECK_OK(deft_program_feed(m->p, m->y, y, sizeof y));
        CHECK_OK(deft_program_run(m->p));
    }
}

/* The copy of batch k+1 is queued right after step k, with no host sync in between; every batch has its own pinned
 * buffers, freed right after their feed (the pool keeps them until their copies are done). With `labels_sync`, the
 * labels go through deft_program_feed instead, so one input alternates slots and the other does not. */
static void train_async(mlp *m, int labels_sync) {
    float *x = NULL;
    int32_t *y = NULL;
    for (int64_t k = 0; k < STEPS; k++) {
        CHECK_OK(deft_pinned_alloc(BATCH * IN * sizeof *x, (void **)&x));
        CHECK_OK(deft_pinned_alloc(BATCH * sizeof *y, (void **)&y));
        make_batch(k, x, y);
        CHECK_OK(deft_program_feed_async(m->p, m->x, x, BATCH * IN * sizeof *x));
        if (labels_sync) CHECK_OK(deft_program_feed(m->p, m->y, y, BATCH * sizeof *y));
        else CHECK_OK(deft_program_feed_async(m->p, m->y, y, BATCH * sizeof *y));
        CHECK_OK(deft_pinned_free(x));
        CHECK_OK(deft_pinned_free(y));
        CHECK_OK(deft_program_run(m->p));
    }
}

static void test_training_equal(void) {
    mlp ref, a, b;
    mlp_build(&ref);
    train_sync(&ref);
    mlp_build(&a);
    train_async(&a, 0);
    CHECK_MSG(same_params(&ref, &a), "training fed by feed_async differs from training fed by feed");
    CHECK_MSG(deft_program_graph_replays(a.p) >= STEPS - 4, "only %lld replays in %d runs",
              (long long)deft_program_graph_replays(a.p), STEPS);
    CHECK(strcmp(deft_program_graph_status(a.p), "replaying a CUDA Graph") == 0);
    mlp_build(&b);
    train_async(&b, 1);
    CHECK_MSG(same_params(&ref, &b), "training with x async and labels sync differs");
    CHECK(deft_program_graph_replays(b.p) >= STEPS - 4);
    float la, lr;
    CHECK_OK(deft_program_read(a.p, a.loss, &la, sizeof la));
    CHECK_OK(deft_program_read(ref.p, ref.loss, &lr, sizeof lr));
    CHECK(la == lr && isfinite(la));
    deft_graph_free(ref.g);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

/* ---- loaders ---- */
typedef struct loader_ctx {
    long sleep_us;
} loader_ctx;

static deft_status fill_batch(void *vctx, int64_t epoch, int64_t index, void *const *buffers) {
    loader_ctx *c = vctx;
    if (c->sleep_us) sleep_us(c->sleep_us);
    make_batch(epoch * 10 + index, buffers[0], buffers[1]);   /* 10 batches an epoch: the same sequence 0, 1, ... */
    return DEFT_OK;
}

static void test_loader_training(long fill_us, long loop_us, int depth) {
    fprintf(stderr, "loader: fill %ld us, loop %ld us, depth %d\n", fill_us, loop_us, depth);
    mlp ref, m;
    mlp_build(&ref);
    train_sync(&ref);
    mlp_build(&m);
    loader_ctx c = {fill_us};
    deft_loader *l = NULL;
    CHECK_OK(deft_loader_new((deft_tensor *[]){m.x, m.y}, 2, 10, depth, fill_batch, &c, &l));
    int64_t steps = 0;
    while (steps < STEPS) {
        deft_loader_batch b;
        CHECK_OK(deft_loader_next(l, m.p, &b));
        if (b.end) continue;
        CHECK(b.epoch * 10 + b.index == steps);
        CHECK_OK(deft_program_run(m.p));
        steps++;
        if (loop_us) sleep_us(loop_us);
    }
    deft_loader_free(l);
    CHECK_MSG(same_params(&ref, &m), "training through the loader differs from training fed by feed");
    CHECK(deft_program_graph_replays(m.p) >= STEPS - 4);
    deft_graph_free(ref.g);
    deft_graph_free(m.g);
}

/* ---- in-flight copies ---- */
#define N 4096

typedef struct twice {
    deft_graph *g;
    deft_tensor *x, *out;
    deft_program *p;
} twice;

static void twice_build(twice *t) {
    t->g = deft_graph_new();
    t->x = deft_input(t->g, "x", DEFT_F32, 1, (int64_t[]){N}, deft_cuda(0));
    t->out = deft_add_scalar(deft_mul_scalar(t->x, 2.0), 1.0);
    t->p = deft_compile(t->g, &t->out, 1, NULL);
    CHECK(t->p != NULL);
}

static void pattern(float *x, float base) {
    for (int i = 0; i < N; i++) x[i] = base + (float)i;
}

static int out_is(twice *t, float base) {
    static float out[N];
    CHECK_OK(deft_program_read(t->p, t->out, out, sizeof out));
    for (int i = 0; i < N; i++)
        if (out[i] != 2.0f * (base + (float)i) + 1.0f) return 0;
    return 1;
}

static void test_in_flight(void) {
    twice t;
    twice_build(&t);
    float *bufs[4];
    for (int i = 0; i < 4; i++) CHECK_OK(deft_pinned_alloc(N * sizeof(float), (void **)&bufs[i]));
    /* Warm up both slot combinations (graphs captured, spare slot and events made) so nothing below needs
     * cudaMalloc or an instantiation while the copy stream is held. */
    for (int i = 0; i < 4; i++) {
        pattern(bufs[i], (float)(1000 * i));
        CHECK_OK(deft_program_feed_async(t.p, t.x, bufs[i], N * sizeof(float)));
        CHECK_OK(deft_program_run(t.p));
        CHECK_MSG(out_is(&t, (float)(1000 * i)), "warm-up run %d", i);
    }
    CHECK(deft_program_graph_replays(t.p) >= 2);

    /* A buffer freed right after feed_async, while its copy is held: the pool does not hand it out again. */
    void *stream = copy_stream();
    static gate g;
    gate_close(&g, stream);
    float *a = bufs[0];
    pattern(a, 7.0f);
    CHECK_OK(deft_program_feed_async(t.p, t.x, a, N * sizeof(float)));
    CHECK_OK(deft_pinned_free(a));
    float *again = NULL;
    CHECK_OK(deft_pinned_alloc(N * sizeof(float), (void **)&again));
    CHECK_MSG(again != a, "the pool handed out a block whose copy is still in flight");
    pattern(again, -5.0f);   /* overwrite the new block at once */
    CHECK_OK(deft_program_run(t.p));
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    (void)cudaGetLastError();
    CHECK_MSG(e == cudaErrorNotReady, "the copy stream was not held: %s", cudaGetErrorString(e));
    atomic_store(&g.open, 1);
    CHECK_MSG(out_is(&t, 7.0f), "the step did not see the batch fed before the free");
    CHECK(!atomic_load(&g.timed_out));
    bufs[0] = again;

    /* The same buffer fed twice while the first copy is held: both copies run, in order. */
    gate_close(&g, stream);
    pattern(bufs[1], 11.0f);
    CHECK_OK(deft_program_feed_async(t.p, t.x, bufs[1], N * sizeof(float)));
    CHECK_OK(deft_program_feed_async(t.p, t.x, bufs[1], N * sizeof(float)));
    CHECK_OK(deft_program_run(t.p));
    atomic_store(&g.open, 1);
    CHECK_MSG(out_is(&t, 11.0f), "feeding one buffer twice");
    CHECK(!atomic_load(&g.timed_out));

    /* A synchronous feed after an asynchronous one still held: the synchronous one wins. */
    gate_close(&g, stream);
    pattern(bufs[2], 21.0f);
    static float pageable[N];
    pattern(pageable, 31.0f);
    CHECK_OK(deft_program_feed_async(t.p, t.x, bufs[2], N * sizeof(float)));
    CHECK_OK(deft_program_feed(t.p, t.x, pageable, sizeof pageable));
    CHECK_OK(deft_program_run(t.p));
    CHECK_MSG(out_is(&t, 31.0f), "a synchronous feed after an asynchronous one");
    atomic_store(&g.open, 1);
    CHECK_OK(deft_device_synchronize(deft_cuda(0)));
    /* compute-sanitizer makes the synchronous copy wait for the held stream, so only the watchdog opens it there. */
    if (under_compute_sanitizer() && atomic_load(&g.timed_out))
        printf("under compute-sanitizer: the synchronous feed waited for the held copy stream (the tool's "
               "serialisation); the values are checked all the same\n");
    else
        CHECK(!atomic_load(&g.timed_out));
    /* ... and the next asynchronous feed is read again. */
    pattern(bufs[3], 41.0f);
    CHECK_OK(deft_program_feed_async(t.p, t.x, bufs[3], N * sizeof(float)));
    CHECK_OK(deft_program_run(t.p));
    CHECK_MSG(out_is(&t, 41.0f), "an asynchronous feed after a synchronous one");

    /* Pageable memory cannot be copied asynchronously. */
    CHECK_ERR(deft_program_feed_async(t.p, t.x, pageable, sizeof pageable), DEFT_ERR_INVALID, "not pinned memory");
    /* Memory page-locked by CUDA itself is accepted. */
    float *host = NULL;
    CUDA_OK(cudaHostAlloc((void **)&host, N * sizeof(float), cudaHostAllocDefault));
    pattern(host, 51.0f);
    CHECK_OK(deft_program_feed_async(t.p, t.x, host, N * sizeof(float)));
    CHECK_OK(deft_program_run(t.p));
    CHECK_MSG(out_is(&t, 51.0f), "feeding from cudaHostAlloc memory");
    CUDA_OK(cudaFreeHost(host));

    deft_graph_free(t.g);   /* frees the program with a spare slot */
    for (int i = 0; i < 4; i++) CHECK_OK(deft_pinned_free(bufs[i]));
}
#endif

int main(void) {
    if (deft_cuda_device_count() == 0) {
        printf("no usable GPU: skipped\n");
        return DEFT_CHECK_SKIP;
    }
#ifdef DEFT_HAVE_CUDA
    CUDA_OK(cudaSetDevice(0));
    test_in_flight();
    test_training_equal();
    test_loader_training(0, 0, 0);       /* fast loader */
    test_loader_training(3000, 0, 2);    /* slow loader: 3 ms a batch */
    test_loader_training(0, 1000, 4);    /* slow loop */
    CHECK_OK(deft_pinned_check());
#endif
    return deft_check_finish();
}
