/* examples/gpt2.h's loss over row blocks (gpt2_build_options.loss_chunks), on the CPU: the loss and every gradient
 * equal the whole-logits loss's up to the order of the sum; a checkpoint budget reaches a lower floor, since one
 * block's logits at a time can be recomputed; with the compile option reorder each block's logits die right after its
 * loss and gradient (the same bits, a smaller arena); a count of blocks that is negative or does not divide B T is
 * refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/gpt2.h"
#include "check.h"

/* Logits dominate: a small model with a large vocabulary. */
static const gpt2_config cfg = {2048, 32, 32, 2, 4};
#define BATCH 4

static void feed(deft_program *p, const gpt2 *m) {
    int32_t x[BATCH * 32], y[BATCH * 32];
    for (int i = 0; i < BATCH * 32; i++) x[i] = (i * 7919 + 13) % 2048, y[i] = (i * 104729 + 7) % 2048;
    CHECK_OK(deft_program_feed(p, m->x, x, sizeof x));
    CHECK_OK(deft_program_feed(p, m->y, y, sizeof y));
}

/* The loss and the gradients of wte and of the first block's qkv weight, compiled with o (NULL: defaults); the
 * planned arena's bytes when arena is not NULL. */
static void loss_and_grads_with(int64_t chunks, const deft_compile_options *o, float *loss, float *gwte, float *gqkv,
                                size_t *arena) {
    gpt2 m;
    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, 3);
    const gpt2_build_options bo = {.loss_chunks = chunks};
    CHECK_MSG(gpt2_build_with(&m, g, &cfg, BATCH, deft_cpu(), &bo) == DEFT_OK, "build: %s", deft_errmsg());
    CHECK_OK(deft_backward(m.loss));
    deft_tensor *qkv = deft_graph_find(g, "h0.attn.c_attn.weight");
    deft_tensor *outs[3] = {m.loss, deft_grad(m.wte), qkv ? deft_grad(qkv) : NULL};
    deft_program *p = outs[2] ? deft_compile(g, outs, 3, o) : NULL;
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p && arena) {
        deft_memory_report r;
        CHECK_OK(deft_program_memory(p, &r));
        *arena = r.arena_bytes;
    }
    if (p) {
        feed(p, &m);
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, m.loss, loss, sizeof *loss));
        CHECK_OK(deft_program_read(p, outs[1], gwte, deft_tensor_nbytes(outs[1])));
        CHECK_OK(deft_program_read(p, outs[2], gqkv, deft_tensor_nbytes(outs[2])));
    }
    deft_program_free(p);
    deft_graph_free(g);
}

static void loss_and_grads(int64_t chunks, float *loss, float *gwte, float *gqkv) {
    loss_and_grads_with(chunks, NULL, loss, gwte, gqkv, NULL);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
    return scale > 0 ? worst / scale : worst;
}

static void test_same_loss(void) {
    const size_t nw = 2048 * 32, nq = 32 * 96;
    float l1 = 0, l4 = 0, *w1 = calloc(nw, 4), *w4 = calloc(nw, 4), *q1 = calloc(nq, 4), *q4 = calloc(nq, 4);
    loss_and_grads(1, &l1, w1, q1);
    loss_and_grads(4, &l4, w4, q4);
    CHECK_MSG(isfinite(l1) && fabs(l1 - l4) <= 1e-6 * fabs(l1), "loss %.9g whole, %.9g in 4 blocks", l1, l4);
    CHECK_MSG(l1 > 7.0f && l1 < 8.5f, "loss %.6g: about ln 2048 = 7.62 at the start", l1);
    const double ew = max_rel(w4, w1, nw), eq = max_rel(q4, q1, nq);
    CHECK_MSG(ew <= 1e-5 && eq <= 1e-5, "gradients in 4 blocks against whole: wte %.3g, qkv %.3g (relative)", ew, eq);
    free(w1), free(w4), free(q1), free(q4);
}

/* The smallest budget the checkpoint search reaches, from its refusal of a 1-byte budget. */
static size_t floor_of(int64_t chunks) {
    gpt2 m;
    deft_graph *g = deft_graph_new();
    CHECK_MSG(gpt2_build_with(&m, g, &cfg, BATCH, deft_cpu(), &(gpt2_build_options){.loss_chunks = chunks}) ==
                  DEFT_OK,
              "build: %s", deft_errmsg());
    CHECK_OK(deft_backward(m.loss));
    deft_tensor *outs[2] = {m.loss, deft_grad(m.wte)};
    const deft_compile_options o = {.checkpoint = DEFT_CHECKPOINT_BUDGET, .memory_budget = 1};
    CHECK(deft_compile(g, outs, 2, &o) == NULL);
    const char *at = strstr(deft_errmsg(), "fits is ");
    CHECK_MSG(at != NULL, "no smallest budget in \"%s\"", deft_errmsg());
    deft_graph_free(g);
    return at ? (size_t)strtoull(at + 8, NULL, 10) : 0;
}

static void test_lower_floor(void) {
    const size_t whole = floor_of(1), blocks = floor_of(4);
    const size_t logits = (size_t)BATCH * 32 * 2048 * 4;   /* f32: the CPU without autocast */
    CHECK_MSG(blocks > 0 && whole > blocks + logits / 4, "checkpoint floor %zu in 4 blocks against %zu whole (the "
              "logits: %zu bytes)", blocks, whole, logits);
}

/* With the compile option reorder, each block's loss gradient runs through the head's products (which free the
 * block's logits) right after the block's loss: the arena falls by a good part of the logits (3 of 4 blocks' at
 * best; the rest of this small model's step moves the peak too), with the same bits. */
static void test_reorder_frees_blocks(void) {
    const size_t nw = 2048 * 32, nq = 32 * 96;
    float l0 = 0, l1 = 0, *w0 = calloc(nw, 4), *w1 = calloc(nw, 4), *q0 = calloc(nq, 4), *q1 = calloc(nq, 4);
    size_t a0 = 0, a1 = 0;
    loss_and_grads_with(4, NULL, &l0, w0, q0, &a0);
    loss_and_grads_with(4, &(deft_compile_options){.reorder = 1}, &l1, w1, q1, &a1);
    CHECK_MSG(memcmp(&l0, &l1, sizeof l0) == 0, "loss %.9g in order, %.9g reordered", l0, l1);
    CHECK_MSG(w0 && w1 && memcmp(w0, w1, nw * 4) == 0 && q0 && q1 && memcmp(q0, q1, nq * 4) == 0,
              "reordered gradients differ");
    const size_t logits = (size_t)BATCH * 32 * 2048 * 4;
    CHECK_MSG(a1 + logits / 3 <= a0, "arena %zu reordered against %zu in order (the logits: %zu bytes)", a1, a0,
              logits);
    free(w0), free(w1), free(q0), free(q1);
}

static void test_refused(void) {
    gpt2 m;
    deft_graph *g = deft_graph_new();
    const int n0 = deft_graph_node_count(g);
    CHECK(gpt2_build_with(&m, g, &cfg, BATCH, deft_cpu(), &(gpt2_build_options){.loss_chunks = 3}) ==
          DEFT_ERR_INVALID);
    CHECK(gpt2_build_with(&m, g, &cfg, BATCH, deft_cpu(), &(gpt2_build_options){.loss_chunks = -2}) ==
          DEFT_ERR_INVALID);
    CHECK_MSG(deft_graph_node_count(g) == n0, "a refused build added %d nodes", deft_graph_node_count(g) - n0);
    deft_graph_free(g);
}

int main(void) {
    test_same_loss();
    test_lower_floor();
    test_reorder_frees_blocks();
    test_refused();
    return deft_check_finish();
}
