/* The compile option matmul_find on a program without a GPU: it is accepted (by deft_compile_into, deft_plan_memory
 * and deft_compile) and changes nothing there: an MLP trained three AdamW steps on the CPU gives the same losses and
 * parameters, bit for bit, as the same graph compiled without it, the same plan, and no product problem is timed or
 * kept (the library's counts stay as they were). What it does on a GPU is tests/cuda_test_matmul_find.c's. */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"   /* deft_compile_into, deft_testing_matmul_find_counts */

#define ROWS 24
#define IN 40
#define HIDDEN 48
#define CLASSES 5
#define STEPS 3

typedef struct net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step, *w;
} net;

static void net_build(net *n) {
    *n = (net){.g = deft_graph_new()};
    deft_graph_set_seed(n->g, 11);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){ROWS, IN}, deft_cpu());
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){ROWS}, deft_cpu());
    deft_tensor *h = deft_relu(deft_linear(n->x, HIDDEN, "fc0", NULL));
    n->loss = deft_cross_entropy(deft_linear(h, CLASSES, "fc1", NULL), n->y);
    CHECK_OK(deft_backward(n->loss));
    deft_optimizer *opt = deft_adamw(n->g, NULL, NULL);
    n->step = opt ? deft_optimizer_step(opt) : NULL;
    n->w = deft_graph_find(n->g, "fc0.weight");
    CHECK(n->step && n->w);
}

/* STEPS steps on fixed batches: each step's loss into losses, fc0's weight afterwards into w (IN * HIDDEN). */
static void net_train(net *n, deft_program *p, float *losses, float *w) {
    float x[ROWS * IN];
    int32_t y[ROWS];
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < ROWS * IN; i++) x[i] = (float)((i * 37 + s * 11) % 19) / 9.0f - 1.0f;
        for (int i = 0; i < ROWS; i++) y[i] = (int32_t)((i * 3 + s) % CLASSES);
        CHECK_OK(deft_program_feed(p, n->x, x, sizeof x));
        CHECK_OK(deft_program_feed(p, n->y, y, sizeof y));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, n->loss, &losses[s], sizeof losses[s]));
    }
    CHECK_OK(deft_param_get(n->w, w, IN * HIDDEN * sizeof *w));
}

int main(void) {
    net a, b;
    net_build(&a);
    net_build(&b);
    const deft_compile_options off = {0}, on = {.matmul_find = 1};
    deft_tensor *outs_a[2] = {a.loss, a.step}, *outs_b[2] = {b.loss, b.step};
    deft_memory_report ra, rb;
    CHECK_OK(deft_plan_memory(a.g, outs_a, 2, &on, &ra));
    CHECK_OK(deft_plan_memory(b.g, outs_b, 2, &off, &rb));
    CHECK_MSG(ra.arena_bytes == rb.arena_bytes && ra.persistent_bytes == rb.persistent_bytes &&
                  ra.buffers == rb.buffers && ra.workspace_bytes == rb.workspace_bytes,
              "matmul_find changed a CPU program's memory plan: arena %zu against %zu bytes, %d against %d buffers",
              ra.arena_bytes, rb.arena_bytes, ra.buffers, rb.buffers);
    int64_t t0, k0, t1, k1;
    deft_testing_matmul_find_counts(&t0, &k0);
    deft_program *pa = NULL, *pb = NULL;
    CHECK_OK(deft_compile_into(a.g, outs_a, 2, &on, &pa));
    CHECK_OK(deft_compile_into(b.g, outs_b, 2, &off, &pb));
    float la[STEPS], lb[STEPS], wa[IN * HIDDEN], wb[IN * HIDDEN], w0[IN * HIDDEN];
    CHECK_OK(deft_param_get(b.w, w0, sizeof w0));
    if (pa && pb) {
        net_train(&a, pa, la, wa);
        net_train(&b, pb, lb, wb);
        CHECK_MSG(memcmp(la, lb, sizeof la) == 0, "matmul_find changed a CPU program's losses: %.9g %.9g %.9g against "
                  "%.9g %.9g %.9g", (double)la[0], (double)la[1], (double)la[2], (double)lb[0], (double)lb[1],
                  (double)lb[2]);
        CHECK_MSG(memcmp(wa, wb, sizeof wa) == 0, "matmul_find changed a CPU program's trained weights");
        CHECK_MSG(memcmp(wb, w0, sizeof wb) != 0, "three AdamW steps left the weight as it was");
        CHECK_MSG(la[STEPS - 1] < la[0], "the loss did not fall: %.9g then %.9g", (double)la[0],
                  (double)la[STEPS - 1]);
    }
    deft_testing_matmul_find_counts(&t1, &k1);
    CHECK_MSG(t1 == t0 && k1 == k0, "CPU programs timed %lld product problems and kept %lld", (long long)(t1 - t0),
              (long long)(k1 - k0));
    deft_program_free(pa);
    deft_program_free(pb);
    /* deft_compile, the plain entry point, takes it too */
    deft_program *pc = deft_compile(a.g, outs_a, 2, &on);
    CHECK_MSG(pc != NULL, "deft_compile with matmul_find on the CPU: %s", deft_errmsg());
    deft_program_free(pc);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
    return deft_check_finish();
}
