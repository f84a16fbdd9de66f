/* ZeRO-1's refusals that need no GPU (the compile option zero_stage; dist/dist_zero.c): a stage other than 0 and 1,
 * stage 1 without dist, with optimizer_in_backward or with dist_bucket_pieces are DEFT_ERR_INVALID naming the option
 * (and so are dist_reduce_dtype bf16 without dist and any other reduce dtype),
 * from deft_compile_into and deft_plan_memory alike; a refused compile leaves the graph as it was: compiled without
 * zero_stage afterwards it trains to the same bits as a graph that never saw the refusals. The sharded step itself
 * needs two GPUs (tests/cuda_test_zero.c). */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"   /* deft_compile_into: the status of a compile */

#define ROWS 8
#define IN 6
#define CLASSES 3

typedef struct net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step, *w;
} net;

static void net_build(net *n) {
    *n = (net){.g = deft_graph_new()};
    deft_graph_set_seed(n->g, 7);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){ROWS, IN}, deft_cpu());
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){ROWS}, deft_cpu());
    n->loss = deft_cross_entropy(deft_linear(deft_relu(deft_linear(n->x, 5, "fc0", NULL)), CLASSES, "fc1", NULL), n->y);
    CHECK_OK(deft_backward(n->loss));
    deft_optimizer *opt = deft_adamw(n->g, NULL, &(deft_step_options){.max_grad_norm = 1.0});
    n->step = deft_optimizer_step(opt);
    n->w = deft_graph_find(n->g, "fc0.weight");
    CHECK(n->step && n->w);
}

/* Two steps on fixed batches; fc0's weight afterwards into w (IN * 5 floats). */
static void net_train(net *n, deft_program *p, float *w) {
    float x[ROWS * IN];
    int32_t y[ROWS];
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < ROWS * IN; i++) x[i] = (float)((i * 37 + s * 11) % 17) / 8.0f - 1.0f;
        for (int i = 0; i < ROWS; i++) y[i] = (int32_t)((i + s) % CLASSES);
        CHECK_OK(deft_program_feed(p, n->x, x, sizeof x));
        CHECK_OK(deft_program_feed(p, n->y, y, sizeof y));
        CHECK_OK(deft_program_run(p));
    }
    CHECK_OK(deft_param_get(n->w, w, IN * 5 * sizeof *w));
}

static void refuse(net *n, const deft_compile_options *o, const char *needle) {
    deft_program *p = (deft_program *)1;
    deft_tensor *outs[2] = {n->loss, n->step};
    CHECK_ERR(deft_compile_into(n->g, outs, 2, o, &p), DEFT_ERR_INVALID, needle);
    CHECK(p == NULL);
    deft_memory_report r;
    CHECK_ERR(deft_plan_memory(n->g, outs, 2, o, &r), DEFT_ERR_INVALID, needle);
}

int main(void) {
    net a, b;
    net_build(&a);
    net_build(&b);
    refuse(&a, &(deft_compile_options){.zero_stage = 2}, "zero_stage 2");
    refuse(&a, &(deft_compile_options){.zero_stage = -1}, "zero_stage -1");
    refuse(&a, &(deft_compile_options){.zero_stage = 1}, "give the option dist");
    refuse(&a, &(deft_compile_options){.zero_stage = 1, .optimizer_in_backward = 1}, "optimizer_in_backward");
    refuse(&a, &(deft_compile_options){.zero_stage = 1, .dist_bucket_pieces = 1}, "dist_bucket_pieces");
    /* The gradients' dtype on the wire: bf16 needs dist and bf16 autocast; nothing else is one. */
    refuse(&a, &(deft_compile_options){.autocast = DEFT_BF16, .dist_reduce_dtype = DEFT_BF16},
           "give dist and autocast bf16 too");
    refuse(&a, &(deft_compile_options){.dist_reduce_dtype = DEFT_F16}, "must be f32 (0) or bf16, got f16");
    /* zero_stage 0 is plain data parallel, or nothing without dist. */
    deft_program *pa = NULL, *pb = NULL;
    CHECK_OK(deft_compile_into(a.g, (deft_tensor *[]){a.loss, a.step}, 2, &(deft_compile_options){.zero_stage = 0}, &pa));
    CHECK_OK(deft_compile_into(b.g, (deft_tensor *[]){b.loss, b.step}, 2, NULL, &pb));
    float wa[IN * 5], wb[IN * 5], w0[IN * 5];
    CHECK_OK(deft_param_get(b.w, w0, sizeof w0));
    if (pa && pb) {
        net_train(&a, pa, wa);
        net_train(&b, pb, wb);
        CHECK_MSG(memcmp(wa, wb, sizeof wa) == 0, "a graph that saw the refusals trains to other parameters");
        CHECK_MSG(memcmp(wb, w0, sizeof wb) != 0, "two AdamW steps left the weight as it was");
    }
    deft_program_free(pa);
    deft_program_free(pb);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
    return deft_check_finish();
}
