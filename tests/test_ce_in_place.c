/* Cross-entropy's gradient written over its logits on the CPU (tests/ce_in_place.h): shared buffer, the arena under
 * twice the logits, the same bits as a program where the logits stay an output, and the host's softmax - onehot;
 * f32 and bf16 logits, plain mean, ignore index with label smoothing, sum. And the rule names the logits alone: a
 * one-element loss gradient of the gradient's bytes that dies at it is not taken over. */
#include "ce_in_place.h"

static const ce_ip_case cases[] = {
    {"f32, 300 classes, plain mean", DEFT_F32, 16, 8, 300, 0, {0}, 0},
    {"f32, 37 classes, ignore -100 every 3rd, smoothing 0.1", DEFT_F32, 12, 5, 37, 1,
     {.use_ignore_index = 1, .ignore_index = -100, .label_smoothing = 0.1}, 3},
    {"bf16, 1027 classes, sum", DEFT_BF16, 24, 4, 1027, 1, {.reduction = DEFT_REDUCTION_SUM}, 0},
    {"bf16, 64 classes, ignore 2 (a class) every 2nd, smoothing 0.2", DEFT_BF16, 8, 4, 64, 1,
     {.use_ignore_index = 1, .ignore_index = 2, .label_smoothing = 0.2}, 2},
};

/* logits [1, 1]: the loss gradient (0.75 * the seed, an f32 of 4 bytes) dies at the gradient as the logits would,
 * with the gradient's bytes; the logits are an output, so nothing may be taken over. */
static void test_loss_gradient_not_taken(void) {
    deft_graph *g = deft_graph_new();
    const float one = 1.0f, two = 2.0f;
    const int32_t t0 = 0;
    deft_tensor *x = deft_param(g, "x", DEFT_F32, 2, (int64_t[]){1, 1}, deft_cpu(), DEFT_INIT_ZEROS);
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){1, 1}, deft_cpu(), DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(x, &one, 4));
    CHECK_OK(deft_param_set(w, &two, 4));
    CHECK_OK(deft_param_set_requires_grad(x, 0));
    deft_tensor *t = deft_constant(g, DEFT_I32, 1, (int64_t[]){1}, deft_cpu(), &t0, 4);
    deft_tensor *logits = deft_matmul(x, w), *loss = deft_cross_entropy(logits, t);
    CHECK_OK(deft_backward(deft_mul_scalar(loss, 0.75)));
    deft_tensor *outs[3] = {loss, deft_grad(w), logits}, *dlogits = deft_grad(logits);
    deft_program *p = deft_compile(g, outs, 3, NULL);
    CHECK_MSG(p != NULL && dlogits, "compile: %s", deft_errmsg());
    if (p && dlogits) {
        deft_testing_node_plan pg;
        deft_testing_program_node_plan(p, dlogits, &pg);
        CHECK(pg.place == DEFT_TESTING_PLACE_ARENA && pg.buffer >= 0);
        int sharing = 0;
        for (int i = 0; i < deft_graph_node_count(g); i++) {
            const deft_tensor *n = deft_testing_node(g, i);
            deft_testing_node_plan pn;
            deft_testing_program_node_plan(p, n, &pn);
            sharing += n != dlogits && pn.place == DEFT_TESTING_PLACE_ARENA && pn.buffer == pg.buffer;
        }
        CHECK_MSG(sharing == 0, "%d other nodes share the logits' gradient's buffer", sharing);
        float dw = NAN;
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, outs[1], &dw, 4));
        /* one class: softmax is 1, so the gradient is 0 */
        CHECK_MSG(dw == 0.0f, "dw %g", dw);
    }
    deft_program_free(p);
    deft_graph_free(g);
}

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) ce_ip_check(deft_cpu(), "cpu", &cases[i]);
    test_loss_gradient_not_taken();
    return deft_check_finish();
}
