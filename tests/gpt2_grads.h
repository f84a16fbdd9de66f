/* A small GPT-2 (examples/gpt2.h) trained one step's worth on a device: its loss and every parameter's gradient, read
 * back, with what the program planned (checkpointing's drops, activation bytes, arena), for tests that compile the
 * same model two ways and want the same bits (tests/cuda_test_gpt2_cheap.c, tests/cuda_test_gpt2_reorder.c).
 * Include after check.h and ../examples/gpt2.h. */
#ifndef DEFT_TEST_GPT2_GRADS_H
#define DEFT_TEST_GPT2_GRADS_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT2_GRADS_MAX 64

typedef struct gpt2_grads {
    float loss, loss_replayed;   /* the first (eager) run's, and the third's (a CUDA Graph replay on a GPU) */
    int n_grads;
    float *grads[GPT2_GRADS_MAX];
    size_t bytes[GPT2_GRADS_MAX];
    char names[GPT2_GRADS_MAX][48];
    int dropped;                 /* deft_program_checkpoint's */
    size_t activation_bytes, arena;
} gpt2_grads;

/* Builds c at `batch` on dev (seed 5, loss in `chunks` row blocks), compiles the loss and every parameter's gradient
 * with o, feeds fixed tokens and runs it three times. */
static inline void gpt2_grads_run(const gpt2_config *c, int64_t batch, int64_t chunks, deft_device dev,
                                  const deft_compile_options *o, gpt2_grads *out) {
    memset(out, 0, sizeof *out);
    gpt2 m = {0};
    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, 5);
    const deft_status built = gpt2_build_with(&m, g, c, batch, dev, &(gpt2_build_options){.loss_chunks = chunks});
    if (built != DEFT_OK || deft_backward(m.loss) != DEFT_OK) {
        CHECK_MSG(0, "build: %s", deft_errmsg());
        deft_graph_free(g);
        return;
    }
    /* The parameters, in build order, as an optimizer collects them (its step is not compiled). */
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    const int n = opt ? deft_optimizer_param_count(opt) : 0;
    CHECK_MSG(n > 0 && n <= GPT2_GRADS_MAX, "%d parameters: %s", n, deft_errmsg());
    deft_tensor *outs[1 + GPT2_GRADS_MAX] = {m.loss};
    for (int k = 0; k < n && k < GPT2_GRADS_MAX; k++) {
        const deft_tensor *w = deft_optimizer_param(opt, k);
        snprintf(out->names[k], sizeof out->names[k], "%s", deft_tensor_name(w));
        outs[1 + out->n_grads++] = deft_grad(w);
    }
    deft_program *p = deft_compile(g, outs, 1 + out->n_grads, o);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    const int64_t tokens = batch * c->seq;
    int32_t *x = malloc(sizeof(int32_t) * (size_t)tokens), *y = malloc(sizeof(int32_t) * (size_t)tokens);
    if (p && x && y) {
        for (int64_t i = 0; i < tokens; i++)
            x[i] = (int32_t)((i * 7919 + 13) % c->vocab), y[i] = (int32_t)((i * 104729 + 7) % c->vocab);
        CHECK_OK(deft_program_feed(p, m.x, x, sizeof(int32_t) * (size_t)tokens));
        CHECK_OK(deft_program_feed(p, m.y, y, sizeof(int32_t) * (size_t)tokens));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, m.loss, &out->loss, sizeof out->loss));
        for (int k = 0; k < out->n_grads; k++) {
            out->bytes[k] = deft_tensor_nbytes(outs[1 + k]);
            out->grads[k] = malloc(out->bytes[k]);
            if (out->grads[k]) CHECK_OK(deft_program_read(p, outs[1 + k], out->grads[k], out->bytes[k]));
        }
        for (int i = 0; i < 2; i++) CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, m.loss, &out->loss_replayed, sizeof out->loss_replayed));
        deft_checkpoint_report ck;
        CHECK_OK(deft_program_checkpoint(p, &ck));
        out->dropped = ck.dropped;
        deft_device_footprint fp[2];
        int n_fp = 0;
        CHECK_OK(deft_program_footprint(p, fp, 2, &n_fp));
        for (int i = 0; i < n_fp; i++) out->activation_bytes += fp[i].activation_bytes;
        deft_memory_report r;
        CHECK_OK(deft_program_memory(p, &r));
        out->arena = r.arena_bytes;
    }
    free(x);
    free(y);
    deft_program_free(p);
    deft_graph_free(g);
}

/* That a and b hold the same losses, eager and replayed, bit for bit, and as many gradients. */
static inline void gpt2_losses_same(const gpt2_grads *a, const gpt2_grads *b, const char *what) {
    CHECK_MSG(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0 &&
                  memcmp(&a->loss_replayed, &a->loss, sizeof a->loss) == 0 &&
                  memcmp(&b->loss_replayed, &b->loss, sizeof b->loss) == 0,
              "%s: losses %.9g and %.9g (replayed %.9g and %.9g)", what, (double)a->loss, (double)b->loss,
              (double)a->loss_replayed, (double)b->loss_replayed);
    CHECK_MSG(a->n_grads == b->n_grads && a->n_grads > 0, "%s: %d and %d gradients", what, a->n_grads, b->n_grads);
}

/* That a and b hold the same loss (eager and replayed) and gradients, bit for bit; frees both. */
static inline void gpt2_grads_same(gpt2_grads *a, gpt2_grads *b, const char *what) {
    gpt2_losses_same(a, b, what);
    for (int k = 0; k < a->n_grads && k < b->n_grads; k++)
        CHECK_MSG(a->grads[k] && b->grads[k] && a->bytes[k] == b->bytes[k] &&
                      memcmp(a->grads[k], b->grads[k], a->bytes[k]) == 0,
                  "%s: the gradient of %s differs", what, a->names[k]);
    for (int k = 0; k < GPT2_GRADS_MAX; k++) free(a->grads[k]), free(b->grads[k]);
}

/* That a and b hold the same losses bit for bit and gradients within tol of each gradient's largest magnitude: for
 * two compiles whose fusion differs in a way that rounds differently (under bf16 a bias gradient summed in a
 * product's epilogue or by a sum of its own); frees both. */
static inline void gpt2_grads_close(gpt2_grads *a, gpt2_grads *b, double tol, const char *what) {
    gpt2_losses_same(a, b, what);
    for (int k = 0; k < a->n_grads && k < b->n_grads; k++) {
        const bool same_size = a->grads[k] && b->grads[k] && a->bytes[k] == b->bytes[k];
        CHECK_MSG(same_size, "%s: the gradient of %s is missing or of another size", what, a->names[k]);
        if (!same_size) continue;
        double top = 0.0, diff = 0.0;
        for (size_t i = 0; i < a->bytes[k] / sizeof(float); i++) {
            const double x = a->grads[k][i], y = b->grads[k][i];
            top = fabs(x) > top ? fabs(x) : top;
            diff = fabs(x - y) > diff || x != x || y != y ? (x != x || y != y ? INFINITY : fabs(x - y)) : diff;
        }
        CHECK_MSG(top > 0.0 && diff <= tol * top, "%s: the gradient of %s differs by %.3g, %.3g of its largest %.3g",
                  what, a->names[k], diff, diff / top, top);
    }
    for (int k = 0; k < GPT2_GRADS_MAX; k++) free(a->grads[k]), free(b->grads[k]);
}

#endif
