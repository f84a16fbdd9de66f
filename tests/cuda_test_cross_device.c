/* Programs across devices (runtime/program_lanes.c, runtime/program_graph.c): deft_to copies between the CPU and
 * cuda:0 and between two GPUs run as asynchronous steps on a stream per GPU, and the whole step is one CUDA Graph.
 *  1. a CPU input copied to cuda:0, a small network, the result copied back to the CPU: equal to the all-CPU program
 *     within tolerance for new inputs every run, equal bit for bit between replays and eager runs (no_cuda_graphs);
 *     the runs after the first are replays; feeding a CPU input through feed_async works too;
 *  2. a training step whose data lives on the CPU and whose model is on cuda:0: losses and parameters bit for bit
 *     between replays and eager runs, close to the same net with its data on the GPU and on the CPU, and falling;
 *  3. a compute step on the CPU between GPU steps: right values, eager, and the status says why;
 *  4. a copy from a CPU parameter (pageable memory): right values, also after the parameter changes, eager, and why;
 *  5. with two GPUs: copies cuda:0 -> cuda:1 -> cuda:0 exact; a network over both GPUs against the CPU, replayed;
 *     larger matmuls on both GPUs at once (their streams overlap), against the CPU, eager and replayed (skipped,
 *     saying so, with fewer than two GPUs).
 * Skips (exit 77) where no GPU works. DEFT_TEST_GPU_AS_CPU=1 runs the value checks with the CPU standing in for every
 * GPU (no copy is left then, so the graph checks are skipped), which checks the test itself without a GPU. */
#include <stdint.h>

#include "check.h"
#include "ref.h"

static deft_device GPU0, GPU1;
static int as_cpu;

#define B 16
#define IN 12
#define HID 20
#define OUT 6
#define RUNS 6

/* max |a - b| over n values, scaled by max(max |b|, 1). */
static double max_rel_diff(const float *a, const float *b, int n) {
    double diff = 0, mag = 1;
    for (int i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
        mag = fmax(mag, fabs((double)b[i]));
    }
    return diff / mag;
}

#define CHECK_CLOSE(a, b, n, tol, what, run)                                                                      \
    CHECK_MSG(max_rel_diff(a, b, n) < (tol), "run %d: %s off by %g", run, what, max_rel_diff(a, b, n))

static void fill(float *x, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) x[i] = (float)ref_unif(&seed, -2, 2);
}

static void check_replays(deft_program *p, int64_t want, const char *what) {
    if (as_cpu) return;
    CHECK_MSG(deft_program_graph_replays(p) == want, "%s: %lld replays, wanted %lld (%s)", what,
              (long long)deft_program_graph_replays(p), (long long)want, deft_program_graph_status(p));
    CHECK_MSG(strcmp(deft_program_graph_status(p), "replaying a CUDA Graph") == 0, "%s: %s", what,
              deft_program_graph_status(p));
}

static void check_eager_because(deft_program *p, const char *needle, const char *what) {
    if (as_cpu) return;
    CHECK_MSG(deft_program_graph_replays(p) == 0, "%s: %lld replays", what, (long long)deft_program_graph_replays(p));
    CHECK_MSG(strstr(deft_program_graph_status(p), needle) != NULL, "%s: status \"%s\" lacks \"%s\"", what,
              deft_program_graph_status(p), needle);
}

/* ---------------------------------------------------------------- 1. cpu -> cuda:0 -> cpu */
typedef struct roundtrip {
    deft_graph *g;
    deft_tensor *x, *y;
    deft_program *p;
} roundtrip;

static int roundtrip_build(roundtrip *r, deft_device dev, int graphs) {
    r->g = deft_graph_new();
    deft_graph_set_seed(r->g, 77);
    r->x = deft_input(r->g, "x", DEFT_F32, 2, (int64_t[]){B, IN}, deft_cpu());
    deft_tensor *h = deft_tanh(deft_linear(deft_to(r->x, dev, DEFT_F32), HID, "fc1", NULL));
    h = deft_linear(deft_mul_scalar(h, 1.5), OUT, "fc2", NULL);
    r->y = deft_to(deft_softmax(h, 1), deft_cpu(), DEFT_F32);
    CHECK_MSG(r->y != NULL, "building: %s", deft_errmsg());
    if (!r->y) return 0;
    r->p = deft_compile(r->g, &r->y, 1, &(deft_compile_options){.no_cuda_graphs = !graphs});
    CHECK_MSG(r->p != NULL, "compile: %s", deft_errmsg());
    return r->p != NULL;
}

static void roundtrip_run(roundtrip *r, const float *x, float *y) {
    CHECK_OK(deft_program_feed(r->p, r->x, x, sizeof(float) * B * IN));
    CHECK_OK(deft_program_run(r->p));
    CHECK_OK(deft_program_read(r->p, r->y, y, sizeof(float) * B * OUT));
}

static void test_cpu_gpu_cpu(void) {
    roundtrip rep, eager, ref;
    int ok = roundtrip_build(&rep, GPU0, 1) & roundtrip_build(&eager, GPU0, 0) & roundtrip_build(&ref, deft_cpu(), 0);
    if (!ok) return;
    float x[B * IN], yr[B * OUT], ye[B * OUT], yc[B * OUT], prev[B * OUT] = {0};
    for (int run = 0; run < RUNS; run++) {
        fill(x, B * IN, 1000 + (uint64_t)run);
        roundtrip_run(&rep, x, yr);
        roundtrip_run(&eager, x, ye);
        roundtrip_run(&ref, x, yc);
        CHECK_MSG(memcmp(yr, ye, sizeof yr) == 0, "run %d: replay and eager differ", run);
        CHECK_CLOSE(yr, yc, B * OUT, 1e-5, "y (against the CPU)", run);
        CHECK_MSG(memcmp(yr, prev, sizeof yr) != 0, "run %d: the new input changed nothing", run);
        memcpy(prev, yr, sizeof prev);
    }
    check_replays(rep.p, RUNS - 1, "cpu -> cuda:0 -> cpu");
    if (!as_cpu) CHECK(strstr(deft_program_graph_status(eager.p), "turned off") != NULL);
    CHECK(deft_program_graph_replays(eager.p) == 0);
    CHECK(deft_program_node_runs(rep.p, rep.y) == RUNS);

    /* Read twice without a run: the same values. feed_async of a CPU input is a plain feed, from any memory. */
    float again[B * OUT];
    CHECK_OK(deft_program_read(rep.p, rep.y, again, sizeof again));
    CHECK(memcmp(again, yr, sizeof again) == 0);
    fill(x, B * IN, 4242);
    CHECK_OK(deft_program_feed_async(rep.p, rep.x, x, sizeof x));
    CHECK_OK(deft_program_run(rep.p));
    CHECK_OK(deft_program_read(rep.p, rep.y, yr, sizeof yr));
    roundtrip_run(&ref, x, yc);
    CHECK_CLOSE(yr, yc, B * OUT, 1e-5, "y after feed_async", RUNS);
    check_replays(rep.p, RUNS, "after feed_async");
    CHECK_ERR(deft_program_feed(rep.p, rep.x, x, sizeof x - 4), DEFT_ERR_INVALID, "bytes given for input x");
    deft_graph_free(rep.g);
    deft_graph_free(eager.g);
    deft_graph_free(ref.g);
}

/* ---------------------------------------------------------------- 2. training with the data on the cpu */
#define STEPS 8

typedef struct trainer {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_program *p;
} trainer;

static int trainer_build(trainer *t, deft_device data, deft_device model, int graphs) {
    t->g = deft_graph_new();
    deft_graph_set_seed(t->g, 4242);   /* the same initial parameters on every device */
    t->x = deft_input(t->g, "x", DEFT_F32, 2, (int64_t[]){B, IN}, data);
    t->y = deft_input(t->g, "y", DEFT_I32, 1, (int64_t[]){B}, data);
    deft_tensor *h = deft_tanh(deft_linear(deft_to(t->x, model, DEFT_F32), HID, "l1", NULL));
    t->loss = deft_cross_entropy(deft_linear(h, OUT, "l2", NULL), deft_to(t->y, model, DEFT_I32));
    CHECK_MSG(t->loss != NULL, "building: %s", deft_errmsg());
    if (!t->loss) return 0;
    CHECK_OK(deft_backward(t->loss));
    deft_optimizer *opt = deft_sgd(t->g, &(deft_sgd_options){.lr = 0.1, .momentum = 0.9}, NULL);
    t->step = deft_optimizer_step(opt);
    CHECK_MSG(t->step != NULL, "optimizer: %s", deft_errmsg());
    if (!t->step) return 0;
    t->p = deft_compile(t->g, (deft_tensor *[]){t->loss, t->step}, 2,
                        &(deft_compile_options){.no_cuda_graphs = !graphs});
    CHECK_MSG(t->p != NULL, "compile: %s", deft_errmsg());
    return t->p != NULL;
}

/* Batch k: labels from a fixed linear teacher, so that the loss can fall. */
static void make_batch(uint64_t k, float *x, int32_t *y) {
    fill(x, B * IN, 0x7a11 + k);
    for (int r = 0; r < B; r++) {
        double best = -1e30;
        for (int c = 0; c < OUT; c++) {
            double s = 0;
            for (int i = 0; i < IN; i++) s += x[r * IN + i] * (double)((i * 7 + c * 3) % 5 - 2);
            if (s > best) {
                best = s;
                y[r] = c;
            }
        }
    }
}

static float trainer_step(trainer *t, const float *x, const int32_t *y) {
    float loss = NAN;
    CHECK_OK(deft_program_feed(t->p, t->x, x, sizeof(float) * B * IN));
    CHECK_OK(deft_program_feed(t->p, t->y, y, sizeof(int32_t) * B));
    CHECK_OK(deft_program_run(t->p));
    CHECK_OK(deft_program_read(t->p, t->loss, &loss, sizeof loss));
    return loss;
}

static void get_weight(trainer *t, float *w) {
    CHECK_OK(deft_param_get(deft_graph_find(t->g, "l1.weight"), w, sizeof(float) * IN * HID));
}

static void test_training_with_cpu_data(void) {
    trainer rep, eager, on_gpu, cpu;
    int ok = trainer_build(&rep, deft_cpu(), GPU0, 1) & trainer_build(&eager, deft_cpu(), GPU0, 0) &
             trainer_build(&on_gpu, GPU0, GPU0, 1) & trainer_build(&cpu, deft_cpu(), deft_cpu(), 0);
    if (!ok) return;
    float x[B * IN], first = NAN, last = NAN;
    int32_t y[B];
    for (int k = 0; k < STEPS; k++) {
        make_batch((uint64_t)k, x, y);
        float lr = trainer_step(&rep, x, y), le = trainer_step(&eager, x, y);
        float lg = trainer_step(&on_gpu, x, y), lc = trainer_step(&cpu, x, y);
        CHECK_MSG(lr == le, "step %d: loss %.9g replayed, %.9g eager", k, lr, le);
        CHECK_MSG(fabsf(lr - lg) <= 1e-5f * fmaxf(fabsf(lg), 1), "step %d: %.9g, data on the GPU %.9g", k, lr, lg);
        CHECK_MSG(fabsf(lr - lc) <= 1e-4f * fmaxf(fabsf(lc), 1), "step %d: %.9g, on the CPU %.9g", k, lr, lc);
        if (k == 0) first = lr;
        last = lr;
    }
    CHECK_MSG(last < first, "the loss did not fall: %g then %g", first, last);
    float wr[IN * HID], we[IN * HID], wc[IN * HID];
    get_weight(&rep, wr);
    get_weight(&eager, we);
    get_weight(&cpu, wc);
    CHECK(memcmp(wr, we, sizeof wr) == 0);
    CHECK_CLOSE(wr, wc, IN * HID, 1e-4, "l1.weight (against the CPU)", STEPS);
    check_replays(rep.p, STEPS - 1, "training with cpu data");
    deft_graph_free(rep.g);
    deft_graph_free(eager.g);
    deft_graph_free(on_gpu.g);
    deft_graph_free(cpu.g);
}

/* ---------------------------------------------------------------- 3. a CPU step between GPU steps */
typedef struct sandwich {
    deft_graph *g;
    deft_tensor *x, *y, *mid;
    deft_program *p;
} sandwich;

/* x (cpu) -> exp(x / 2) on `gpu` -> cpu: minus the mean of each column -> `gpu`: relu(v + 1/4) -> cpu. mid stays on
 * `gpu`. */
static int sandwich_build(sandwich *s, deft_device gpu) {
    s->g = deft_graph_new();
    s->x = deft_input(s->g, "x", DEFT_F32, 2, (int64_t[]){B, IN}, deft_cpu());
    s->mid = deft_exp(deft_mul_scalar(deft_to(s->x, gpu, DEFT_F32), 0.5));
    deft_tensor *back = deft_to(s->mid, deft_cpu(), DEFT_F32);
    deft_tensor *column_sum = deft_set_name(deft_sum(back, 1, (int[]){0}, 1), "column_sum");
    deft_tensor *host = deft_add(back, deft_mul_scalar(column_sum, -1.0 / B));
    deft_tensor *v = deft_relu(deft_add_scalar(deft_to(host, gpu, DEFT_F32), 0.25));
    s->y = deft_to(v, deft_cpu(), DEFT_F32);
    CHECK_MSG(s->y != NULL, "building: %s", deft_errmsg());
    if (!s->y) return 0;
    s->p = deft_compile(s->g, (deft_tensor *[]){s->y, s->mid}, 2, NULL);
    CHECK_MSG(s->p != NULL, "compile: %s", deft_errmsg());
    return s->p != NULL;
}

static void test_cpu_step_between_gpu_steps(void) {
    sandwich gpu, cpu;
    if (!(sandwich_build(&gpu, GPU0) & sandwich_build(&cpu, deft_cpu()))) return;
    float x[B * IN], yg[B * IN], yc[B * IN], mg[B * IN], mc[B * IN];
    for (int run = 0; run < 4; run++) {
        fill(x, B * IN, 50 + (uint64_t)run);
        sandwich *both[2] = {&gpu, &cpu};
        for (int i = 0; i < 2; i++) {
            CHECK_OK(deft_program_feed(both[i]->p, both[i]->x, x, sizeof x));
            CHECK_OK(deft_program_run(both[i]->p));
        }
        CHECK_OK(deft_program_read(gpu.p, gpu.y, yg, sizeof yg));
        CHECK_OK(deft_program_read(gpu.p, gpu.mid, mg, sizeof mg));
        CHECK_OK(deft_program_read(cpu.p, cpu.y, yc, sizeof yc));
        CHECK_OK(deft_program_read(cpu.p, cpu.mid, mc, sizeof mc));
        CHECK_CLOSE(yg, yc, B * IN, 1e-5, "y", run);
        CHECK_CLOSE(mg, mc, B * IN, 1e-6, "mid", run);
    }
    int positive = 0;
    for (int i = 0; i < B * IN; i++) positive += yc[i] > 0;
    CHECK(positive > 0 && positive < B * IN);   /* the relu cut some values and kept others */
    check_eager_because(gpu.p, "(column_sum, sum) runs on the cpu", "a CPU step");
    check_eager_because(gpu.p, "runs on the cpu, which a CUDA Graph cannot hold", "a CPU step");
    deft_graph_free(gpu.g);
    deft_graph_free(cpu.g);
}

/* ---------------------------------------------------------------- 4. a copy from a CPU parameter */
static void test_copy_from_cpu_param(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){B, IN}, GPU0);
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){IN, OUT}, deft_cpu(), DEFT_INIT_UNIFORM);
    deft_tensor *y = deft_matmul(x, deft_to(w, GPU0, DEFT_F32));
    deft_program *p = deft_compile(g, &y, 1, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) {
        deft_graph_free(g);
        return;
    }
    float hx[B * IN], hw[IN * OUT], hy[B * OUT];
    fill(hx, B * IN, 9);
    for (int run = 0; run < 4; run++) {
        fill(hw, IN * OUT, 90 + (uint64_t)run);
        CHECK_OK(deft_param_set(w, hw, sizeof hw));   /* a new value every run: the next run must see it */
        CHECK_OK(deft_program_feed(p, x, hx, sizeof hx));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, y, hy, sizeof hy));
        double worst = 0;
        for (int r = 0; r < B; r++)
            for (int c = 0; c < OUT; c++) {
                double s = 0;
                for (int i = 0; i < IN; i++) s += (double)hx[r * IN + i] * hw[i * OUT + c];
                worst = fmax(worst, fabs(s - hy[r * OUT + c]));
            }
        CHECK_MSG(worst < 1e-4, "run %d: off by %g", run, worst);
    }
    check_eager_because(p, "copies w from pageable cpu memory", "a copy from a CPU parameter");
    deft_graph_free(g);
}

/* ---------------------------------------------------------------- 5. two GPUs */
static void test_copies_between_gpus(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){1000}, GPU0);
    deft_tensor *on1 = deft_to(x, GPU1, DEFT_F32);
    deft_tensor *back = deft_to(deft_to(on1, GPU0, DEFT_F32), deft_cpu(), DEFT_F32);
    deft_program *p = deft_compile(g, (deft_tensor *[]){on1, back}, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    float hx[1000], h1[1000], hb[1000];
    for (int run = 0; p && run < 3; run++) {
        fill(hx, 1000, 300 + (uint64_t)run);
        CHECK_OK(deft_program_feed(p, x, hx, sizeof hx));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, on1, h1, sizeof h1));
        CHECK_OK(deft_program_read(p, back, hb, sizeof hb));
        CHECK_MSG(memcmp(h1, hx, sizeof hx) == 0, "run %d: cuda:0 -> cuda:1 changed the values", run);
        CHECK_MSG(memcmp(hb, hx, sizeof hx) == 0, "run %d: the round trip changed the values", run);
    }
    if (p) check_replays(p, 2, "cuda:0 -> cuda:1 -> cuda:0 -> cpu");
    deft_graph_free(g);
}

typedef struct split {
    deft_graph *g;
    deft_tensor *x, *y, *z, *h1;
    deft_program *p;
} split;

/* x (cpu) -> d0: h0 = tanh(a(x)) -> d1: h1 = relu(b(h0)) -> d0: z = h0 + h1 -> d1: 2 z -> cpu: y. */
static int split_build(split *s, deft_device d0, deft_device d1, int graphs) {
    s->g = deft_graph_new();
    deft_graph_set_seed(s->g, 31337);
    s->x = deft_input(s->g, "x", DEFT_F32, 2, (int64_t[]){B, IN}, deft_cpu());
    deft_tensor *h0 = deft_tanh(deft_linear(deft_to(s->x, d0, DEFT_F32), HID, "a", NULL));
    s->h1 = deft_relu(deft_linear(deft_to(h0, d1, DEFT_F32), HID, "b", NULL));
    s->z = deft_add(h0, deft_to(s->h1, d0, DEFT_F32));
    s->y = deft_to(deft_mul_scalar(deft_to(s->z, d1, DEFT_F32), 2.0), deft_cpu(), DEFT_F32);
    CHECK_MSG(s->y != NULL, "building: %s", deft_errmsg());
    if (!s->y) return 0;
    s->p = deft_compile(s->g, (deft_tensor *[]){s->y, s->z, s->h1}, 3,
                        &(deft_compile_options){.no_cuda_graphs = !graphs});
    CHECK_MSG(s->p != NULL, "compile: %s", deft_errmsg());
    return s->p != NULL;
}

static void split_run(split *s, const float *x, float *y, float *z, float *h1) {
    CHECK_OK(deft_program_feed(s->p, s->x, x, sizeof(float) * B * IN));
    CHECK_OK(deft_program_run(s->p));
    CHECK_OK(deft_program_read(s->p, s->y, y, sizeof(float) * B * HID));
    CHECK_OK(deft_program_read(s->p, s->z, z, sizeof(float) * B * HID));
    CHECK_OK(deft_program_read(s->p, s->h1, h1, sizeof(float) * B * HID));
}

static void test_two_gpu_program(void) {
    split rep, eager, ref;
    int ok = split_build(&rep, GPU0, GPU1, 1) & split_build(&eager, GPU0, GPU1, 0) &
             split_build(&ref, deft_cpu(), deft_cpu(), 0);
    if (!ok) return;
    float x[B * IN], y[3][B * HID], z[3][B * HID], h1[3][B * HID];
    for (int run = 0; run < RUNS; run++) {
        fill(x, B * IN, 700 + (uint64_t)run);
        split_run(&rep, x, y[0], z[0], h1[0]);
        split_run(&eager, x, y[1], z[1], h1[1]);
        split_run(&ref, x, y[2], z[2], h1[2]);
        CHECK_MSG(memcmp(y[0], y[1], sizeof y[0]) == 0 && memcmp(z[0], z[1], sizeof z[0]) == 0 &&
                      memcmp(h1[0], h1[1], sizeof h1[0]) == 0,
                  "run %d: replay and eager differ", run);
        CHECK_CLOSE(y[0], y[2], B * HID, 1e-5, "y", run);
        CHECK_CLOSE(z[0], z[2], B * HID, 1e-5, "z", run);
        CHECK_CLOSE(h1[0], h1[2], B * HID, 1e-5, "h1", run);
    }
    check_replays(rep.p, RUNS - 1, "a program over two GPUs");
    deft_graph_free(rep.g);
    deft_graph_free(eager.g);
    deft_graph_free(ref.g);
}

/* Larger work on both GPUs at once, so that a missing wait would show: while cuda:1 runs three matmuls on what it
 * copied, cuda:0 runs its own and reuses its buffers; then the results meet on cuda:0. */
#define PB 256
#define PW 512

typedef struct pipeline {
    deft_graph *g;
    deft_tensor *x, *y;
    deft_program *p;
} pipeline;

static int pipeline_build(pipeline *q, deft_device d0, deft_device d1, int graphs) {
    q->g = deft_graph_new();
    deft_graph_set_seed(q->g, 99);
    q->x = deft_input(q->g, "x", DEFT_F32, 2, (int64_t[]){PB, PW}, deft_cpu());
    deft_tensor *h0 = deft_tanh(deft_linear(deft_to(q->x, d0, DEFT_F32), PW, "in", NULL));
    deft_tensor *far = deft_to(h0, d1, DEFT_F32);
    deft_tensor *near = h0;
    char name[16];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "far%d", i);
        far = deft_tanh(deft_linear(far, PW, name, NULL));
        snprintf(name, sizeof name, "near%d", i);
        near = deft_tanh(deft_linear(near, PW, name, NULL));
    }
    q->y = deft_to(deft_add(near, deft_to(far, d0, DEFT_F32)), deft_cpu(), DEFT_F32);
    CHECK_MSG(q->y != NULL, "building: %s", deft_errmsg());
    if (!q->y) return 0;
    q->p = deft_compile(q->g, &q->y, 1, &(deft_compile_options){.no_cuda_graphs = !graphs});
    CHECK_MSG(q->p != NULL, "compile: %s", deft_errmsg());
    return q->p != NULL;
}

static void test_two_gpu_pipeline(void) {
    pipeline rep, eager, ref;
    int ok = pipeline_build(&rep, GPU0, GPU1, 1) & pipeline_build(&eager, GPU0, GPU1, 0) &
             pipeline_build(&ref, deft_cpu(), deft_cpu(), 0);
    float *x = malloc(sizeof(float) * PB * PW), *y = malloc(sizeof(float) * 3 * PB * PW);
    CHECK(x && y);
    for (int run = 0; ok && x && y && run < 4; run++) {
        fill(x, PB * PW, 5000 + (uint64_t)run);
        pipeline *all[3] = {&rep, &eager, &ref};
        for (int i = 0; i < 3; i++) {
            CHECK_OK(deft_program_feed(all[i]->p, all[i]->x, x, sizeof(float) * PB * PW));
            CHECK_OK(deft_program_run(all[i]->p));
        }
        for (int i = 0; i < 3; i++)
            CHECK_OK(deft_program_read(all[i]->p, all[i]->y, y + (size_t)i * PB * PW, sizeof(float) * PB * PW));
        CHECK_MSG(memcmp(y, y + PB * PW, sizeof(float) * PB * PW) == 0, "run %d: replay and eager differ", run);
        CHECK_CLOSE(y, y + 2 * PB * PW, PB * PW, 1e-4, "y (against the CPU)", run);
    }
    if (ok) check_replays(rep.p, 3, "a pipeline over two GPUs");
    free(x);
    free(y);
    deft_graph_free(rep.g);
    deft_graph_free(eager.g);
    deft_graph_free(ref.g);
}

int main(void) {
    const char *as = getenv("DEFT_TEST_GPU_AS_CPU");
    as_cpu = as && strcmp(as, "1") == 0;
    if (!as_cpu && deft_check_no_gpu()) return DEFT_CHECK_SKIP;
    GPU0 = as_cpu ? deft_cpu() : deft_cuda(0);
    GPU1 = as_cpu ? deft_cpu() : deft_cuda(1);
    test_cpu_gpu_cpu();
    test_training_with_cpu_data();
    test_cpu_step_between_gpu_steps();
    test_copy_from_cpu_param();
    if (as_cpu || deft_cuda_device_count() >= 2) {
        test_copies_between_gpus();
        test_two_gpu_program();
        test_two_gpu_pipeline();
    } else {
        printf("one GPU: the cuda:0 <-> cuda:1 copies and the two-GPU program are skipped\n");
    }
    return deft_check_finish();
}
