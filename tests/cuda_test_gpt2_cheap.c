/* GPT-2 (examples/gpt2.h) on a GPU with the cheap recomputations (the default: GELU outputs, permutes and layer
 * norms dropped and made again in the backward pass, passes/checkpoint_policy.c) against keeping every value
 * (no_cheap_recompute): the loss and every parameter's gradient are the same bits, in f32 and under bf16 autocast, every
 * layer norm is made again, and the planned activation bytes fall.
 * On a GPU a recomputed layer norm runs alone where the forward pass ran it fused with the residual add before it
 * (passes/fusion_layer_norm.c): the two kernels must round the normalised value alike. */
#include <stdlib.h>
#include <string.h>

#include "../examples/gpt2.h"
#include "check.h"

static const gpt2_config cfg = {512, 64, 64, 2, 4};
#define BATCH 4
#define MAX_GRADS 64

typedef struct outcome {
    float loss;
    int n_grads;
    float *grads[MAX_GRADS];
    size_t bytes[MAX_GRADS];
    char names[MAX_GRADS][48];
    size_t activation_bytes;
    int dropped;
} outcome;

static void run(const deft_compile_options *o, outcome *out) {
    memset(out, 0, sizeof *out);
    gpt2 m = {0};
    const deft_status built = gpt2_build(&m, &cfg, BATCH, deft_cuda(0), 5);
    deft_graph *g = m.g;
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
        for (int i = 0; i < BATCH * 64; i++) x[i] = (i * 7919 + 13) % 512, y[i] = (i * 104729 + 7) % 512;
        CHECK_OK(deft_program_feed(p, m.x, x, sizeof x));
        CHECK_OK(deft_program_feed(p, m.y, y, sizeof y));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, m.loss, &out->loss, sizeof out->loss));
        for (int k = 0; k < out->n_grads; k++) {
            out->bytes[k] = deft_tensor_nbytes(outs[1 + k]);
            out->grads[k] = malloc(out->bytes[k]);
            if (out->grads[k]) CHECK_OK(deft_program_read(p, outs[1 + k], out->grads[k], out->bytes[k]));
        }
        deft_checkpoint_report ck;
        CHECK_OK(deft_program_checkpoint(p, &ck));
        out->dropped = ck.dropped;
        deft_device_footprint fp[2];
        int n_fp = 0;
        CHECK_OK(deft_program_footprint(p, fp, 2, &n_fp));
        for (int i = 0; i < n_fp; i++) out->activation_bytes += fp[i].activation_bytes;
    }
    deft_program_free(p);
    deft_graph_free(g);
}

static void compare(deft_dtype autocast, const char *what) {
    outcome cheap, kept;
    run(&(deft_compile_options){.autocast = autocast}, &cheap);
    run(&(deft_compile_options){.autocast = autocast, .no_cheap_recompute = 1}, &kept);
    CHECK_MSG(memcmp(&cheap.loss, &kept.loss, sizeof cheap.loss) == 0, "%s: loss %.9g recomputing, %.9g keeping",
              what, (double)cheap.loss, (double)kept.loss);
    CHECK_MSG(cheap.n_grads == kept.n_grads && cheap.n_grads > 0, "%s: %d and %d gradients", what, cheap.n_grads,
              kept.n_grads);
    for (int k = 0; k < cheap.n_grads && k < kept.n_grads; k++)
        CHECK_MSG(cheap.grads[k] && kept.grads[k] && cheap.bytes[k] == kept.bytes[k] &&
                      memcmp(cheap.grads[k], kept.grads[k], cheap.bytes[k]) == 0,
                  "%s: the gradient of %s differs", what, cheap.names[k]);
    /* Each block's two layer norms and the final one, at the least (and the GELU outputs). */
    CHECK_MSG(cheap.dropped >= kept.dropped + 2 * cfg.layers + 1 && cheap.activation_bytes < kept.activation_bytes,
              "%s: %d dropped (%d keeping), activation bytes %zu (%zu keeping)", what, cheap.dropped, kept.dropped,
              cheap.activation_bytes, kept.activation_bytes);
    for (int k = 0; k < MAX_GRADS; k++) free(cheap.grads[k]), free(kept.grads[k]);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    compare(DEFT_F32, "f32");
    compare(DEFT_BF16, "bf16");
    return deft_check_finish();
}
