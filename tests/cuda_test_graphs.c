/* A program on one GPU replays its step as a CUDA Graph from the third run on: replays give the same values as
 * eager runs, see new inputs and parameter values, and programs a replay cannot stand for stay eager, saying why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

#define GPU deft_cuda(0)
#define BATCH 16
#define IN 24
#define OUT 5

typedef struct net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *gw, *w;
    deft_program *p;
} net;

/* A forward and backward pass with no optimizer: loss and the gradient of the first weight. */
static void net_build(net *n, int graphs) {
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 5);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){BATCH, IN}, GPU);
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){BATCH}, GPU);
    deft_tensor *h = deft_gelu(deft_linear(n->x, 32, "fc1", NULL));
    h = deft_layer_norm(h, NULL, NULL, 1e-5);
    n->loss = deft_cross_entropy(deft_linear(h, OUT, "fc2", NULL), n->y);
    CHECK_OK(deft_backward(n->loss));
    n->w = deft_graph_find(n->g, "fc1.weight");
    n->gw = deft_grad(n->w);
    n->p = deft_compile(n->g, (deft_tensor *[]){n->loss, n->gw}, 2, &(deft_compile_options){.no_cuda_graphs = !graphs});
    CHECK_MSG(n->p != NULL, "compile: %s", deft_errmsg());
}

static void make_batch(float *x, int32_t *y, uint64_t seed) {
    for (int i = 0; i < BATCH * IN; i++) x[i] = (float)ref_unif(&seed, -2, 2);
    for (int i = 0; i < BATCH; i++) y[i] = (int32_t)(ref_next(&seed) % OUT);
}

static void net_run(net *n, const float *x, const int32_t *y, float *loss, float *gw) {
    CHECK_OK(deft_program_feed(n->p, n->x, x, sizeof(float) * BATCH * IN));
    CHECK_OK(deft_program_feed(n->p, n->y, y, sizeof(int32_t) * BATCH));
    CHECK_OK(deft_program_run(n->p));
    CHECK_OK(deft_program_read(n->p, n->loss, loss, sizeof *loss));
    CHECK_OK(deft_program_read(n->p, n->gw, gw, sizeof(float) * IN * 32));
}

static void test_replay_equals_eager(void) {
    net graphs, eager;
    net_build(&graphs, 1);
    net_build(&eager, 0);
    if (!graphs.p || !eager.p) return;
    float x[BATCH * IN], lg, le, gg[IN * 32], ge[IN * 32], prev = NAN;
    int32_t y[BATCH];
    for (int run = 0; run < 6; run++) {
        make_batch(x, y, 100 + (uint64_t)run);
        net_run(&graphs, x, y, &lg, gg);
        net_run(&eager, x, y, &le, ge);
        CHECK_MSG(lg == le, "run %d: loss %.9g replayed, %.9g eager", run, lg, le);
        CHECK(memcmp(gg, ge, sizeof gg) == 0);
        CHECK(lg != prev);   /* each replay read the new batch */
        prev = lg;
    }
    CHECK_MSG(deft_program_graph_replays(graphs.p) == 5, "replays %lld", (long long)deft_program_graph_replays(graphs.p));
    CHECK(strcmp(deft_program_graph_status(graphs.p), "replaying a CUDA Graph") == 0);
    CHECK(deft_program_graph_replays(eager.p) == 0);
    CHECK(strstr(deft_program_graph_status(eager.p), "turned off") != NULL);
    CHECK(deft_program_node_runs(graphs.p, graphs.loss) == 6);

    /* A parameter changed from the host between replays is what the next replay reads. */
    float w[IN * 32];
    for (int i = 0; i < IN * 32; i++) w[i] = 0.01f * (float)(i % 7);
    CHECK_OK(deft_param_set(graphs.w, w, sizeof w));
    CHECK_OK(deft_param_set(eager.w, w, sizeof w));
    net_run(&graphs, x, y, &lg, gg);
    net_run(&eager, x, y, &le, ge);
    CHECK(lg == le && lg != prev);
    deft_graph_free(graphs.g);
    deft_graph_free(eager.g);
}

static void test_programs_that_stay_eager(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_full(g, DEFT_F32, 1, (int64_t[]){8}, GPU, 2.0);
    deft_tensor *back = deft_to(deft_exp(a), deft_cpu(), DEFT_F32);
    deft_tensor *mixed = deft_sum(back, 0, NULL, 0);
    deft_program *p = deft_compile(g, &mixed, 1, NULL);
    float v = 0;
    for (int i = 0; i < 3; i++) CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, mixed, &v, sizeof v));
    CHECK_NEAR(v, 8 * exp(2.0), 1e-3);
    CHECK(deft_program_graph_replays(p) == 0);
    CHECK_MSG(strstr(deft_program_graph_status(p), "cpu") != NULL, "%s", deft_program_graph_status(p));

    deft_tensor *d = deft_sum(deft_dropout(a, 0.5, 3), 0, NULL, 0);
    deft_program *pd = deft_compile(g, &d, 1, NULL);
    float seen[4];
    int differ = 0;
    for (int i = 0; i < 4; i++) {
        CHECK_OK(deft_program_run(pd));
        CHECK_OK(deft_program_read(pd, d, &seen[i], sizeof seen[i]));
        differ += i > 0 && seen[i] != seen[i - 1];
    }
    CHECK(differ > 0);   /* new masks each run: not frozen by a replay */
    CHECK(deft_program_graph_replays(pd) == 0);
    CHECK(strstr(deft_program_graph_status(pd), "dropout") != NULL);
    deft_graph_free(g);
}

/* Products with a long inner dimension, which cuBLAS splits over K through its workspace. */
#define SB_ROWS 64
#define SB_K 8192
static deft_program *side_program(deft_graph **g, deft_tensor **x, deft_tensor **y, int graphs) {
    *g = deft_graph_new();
    deft_graph_set_seed(*g, 77);
    *x = deft_input(*g, "x", DEFT_F32, 2, (int64_t[]){SB_ROWS, SB_K}, GPU);
    deft_tensor *h = deft_tanh(deft_linear(*x, 512, "a", NULL));
    h = deft_linear(deft_linear(h, SB_K, "b", NULL), 256, "c", NULL);
    *y = deft_linear(h, 128, "d", NULL);
    deft_program *p = deft_compile(*g, y, 1, &(deft_compile_options){.no_cuda_graphs = !graphs});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    return p;
}

/* Two programs on one GPU whose steps overlap (a replay still running while the other's step is queued) each
 * compute what a program run alone does: library calls on different streams do not share scratch. */
static void test_programs_side_by_side(void) {
    deft_graph *ga, *gb, *gr;
    deft_tensor *xa, *xb, *xr, *ya, *yb, *yr;
    deft_program *a = side_program(&ga, &xa, &ya, 1), *b = side_program(&gb, &xb, &yb, 1);
    deft_program *r = side_program(&gr, &xr, &yr, 0);
    float *x = malloc(sizeof(float) * SB_ROWS * SB_K), *out = malloc(sizeof(float) * 3 * SB_ROWS * 128);
    CHECK(x && out);
    for (int run = 0; a && b && r && x && out && run < 6; run++) {
        uint64_t seed = 900 + (uint64_t)run;
        for (int i = 0; i < SB_ROWS * SB_K; i++) x[i] = (float)ref_unif(&seed, -1, 1);
        CHECK_OK(deft_program_feed(a, xa, x, sizeof(float) * SB_ROWS * SB_K));
        CHECK_OK(deft_program_feed(b, xb, x, sizeof(float) * SB_ROWS * SB_K));
        for (int k = 0; k < 3; k++) {   /* both queued before either is read */
            CHECK_OK(deft_program_run(a));
            CHECK_OK(deft_program_run(b));
        }
        CHECK_OK(deft_program_read(a, ya, out, sizeof(float) * SB_ROWS * 128));
        CHECK_OK(deft_program_read(b, yb, out + SB_ROWS * 128, sizeof(float) * SB_ROWS * 128));
        CHECK_OK(deft_program_feed(r, xr, x, sizeof(float) * SB_ROWS * SB_K));
        CHECK_OK(deft_program_run(r));
        CHECK_OK(deft_program_read(r, yr, out + 2 * SB_ROWS * 128, sizeof(float) * SB_ROWS * 128));
        CHECK_MSG(memcmp(out, out + 2 * SB_ROWS * 128, sizeof(float) * SB_ROWS * 128) == 0,
                  "run %d: the first of two programs side by side differs from one run alone", run);
        CHECK_MSG(memcmp(out + SB_ROWS * 128, out + 2 * SB_ROWS * 128, sizeof(float) * SB_ROWS * 128) == 0,
                  "run %d: the second of two programs side by side differs from one run alone", run);
    }
    CHECK(deft_program_graph_replays(a) > 0 && deft_program_graph_replays(b) > 0);
    free(x);
    free(out);
    deft_graph_free(ga);
    deft_graph_free(gb);
    deft_graph_free(gr);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_replay_equals_eager();
    test_programs_that_stay_eager();
    test_programs_side_by_side();
    return deft_check_finish();
}
