/* GPT-2 (examples/gpt2.h) on a GPU with its loss in row blocks, compiled with the option reorder against the given
 * order: the loss and every parameter's gradient are the same bits, in f32 and under bf16 autocast, and the planned
 * arena is smaller (each block's logits die after its gradient has gone through the head's products,
 * plan/schedule_order.c). On a GPU the reordered steps then go through fusion, the side lane and a CUDA Graph
 * capture, which the CPU's test_gpt2_loss_chunks does not exercise. */
#include <stdlib.h>
#include <string.h>

#include "../examples/gpt2.h"
#include "check.h"

static const gpt2_config cfg = {4096, 64, 64, 2, 4};
#define BATCH 4
#define MAX_GRADS 64

typedef struct outcome {
    float loss;
    int n_grads;
    float *grads[MAX_GRADS];
    size_t bytes[MAX_GRADS];
    char names[MAX_GRADS][48];
    size_t activation_bytes;
    size_t arena;
} outcome;

static void run(const deft_compile_options *o, outcome *out) {
    memset(out, 0, sizeof *out);
    gpt2 m = {0};
    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, 5);
    const deft_status built = gpt2_build_with(&m, g, &cfg, BATCH, deft_cuda(0), &(gpt2_build_options){.loss_chunks = 4});
    if (built != DEFT_OK || deft_backward(m.loss) != DEFT_OK) {
        CHECK_MSG(0, "build: %s", deft_errmsg());
        deft_graph_free(g);
        return;
    }
    /* The parameters, in build order, as an optimizer collects them (its step is not compiled). */
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    const int n = opt ? deft_optimizer_param_count(opt) : 0;
    CHECK_MSG(n > 0 && n <= MAX_GRADS, "%d parameters: %s", n, deft_errmsg());
    deft_tensor *outs[1 + MAX_GRADS] = {m.loss};
    for (int k = 0; k < n && k < MAX_GRADS; k++) {
        const deft_tensor *w = deft_optimizer_param(opt, k);
        snprintf(out->names[k], sizeof out->names[k], "%s", deft_tensor_name(w));
        outs[1 + out->n_grads++] = deft_grad(w);
    }
    deft_program *p = deft_compile(g, outs, 1 + out->n_grads, o);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        int32_t x[BATCH * 64], y[BATCH * 64];
        for (int i = 0; i < BATCH * 64; i++) x[i] = (i * 7919 + 13) % 4096, y[i] = (i * 104729 + 7) % 4096;
        CHECK_OK(deft_program_feed(p, m.x, x, sizeof x));
        CHECK_OK(deft_program_feed(p, m.y, y, sizeof y));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, m.loss, &out->loss, sizeof out->loss));
        for (int k = 0; k < out->n_grads; k++) {
            out->bytes[k] = deft_tensor_nbytes(outs[1 + k]);
            out->grads[k] = malloc(out->bytes[k]);
            if (out->grads[k]) CHECK_OK(deft_program_read(p, outs[1 + k], out->grads[k], out->bytes[k]));
        }
        for (int i = 0; i < 2; i++) CHECK_OK(deft_program_run(p));   /* captured, then replayed: the same values */
        float again = 0;
        CHECK_OK(deft_program_read(p, m.loss, &again, sizeof again));
        CHECK_MSG(memcmp(&again, &out->loss, sizeof again) == 0, "replayed loss %.9g, eager %.9g", (double)again,
                  (double)out->loss);
        deft_memory_report r;
        CHECK_OK(deft_program_memory(p, &r));
        out->arena = r.arena_bytes;
    }
    deft_program_free(p);
    deft_graph_free(g);
}

static void compare(deft_dtype autocast, const char *what) {
    outcome re, given;
    run(&(deft_compile_options){.autocast = autocast, .reorder = 1}, &re);
    run(&(deft_compile_options){.autocast = autocast}, &given);
    CHECK_MSG(memcmp(&re.loss, &given.loss, sizeof re.loss) == 0, "%s: loss %.9g reordered, %.9g in order",
              what, (double)re.loss, (double)given.loss);
    CHECK_MSG(re.n_grads == given.n_grads && re.n_grads > 0, "%s: %d and %d gradients", what, re.n_grads,
              given.n_grads);
    for (int k = 0; k < re.n_grads && k < given.n_grads; k++)
        CHECK_MSG(re.grads[k] && given.grads[k] && re.bytes[k] == given.bytes[k] &&
                      memcmp(re.grads[k], given.grads[k], re.bytes[k]) == 0,
                  "%s: the gradient of %s differs", what, re.names[k]);
    CHECK_MSG(re.arena < given.arena, "%s: arena %zu reordered, %zu in order", what, re.arena, given.arena);
    for (int k = 0; k < MAX_GRADS; k++) free(re.grads[k]), free(given.grads[k]);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    compare(DEFT_F32, "f32");
    compare(DEFT_BF16, "bf16");
    return deft_check_finish();
}
