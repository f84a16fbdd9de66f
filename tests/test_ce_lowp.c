/* Cross-entropy on f16 / bf16 logits on the CPU (tests/ce_lowp.h):
 *  1. the logits read directly with an f32 loss give the loss bits and the gradient bits of the logits cast to f32
 *     first, over ignore index, label smoothing, mean and sum, 2-D and N-D;
 *  2. under bf16 autocast the loss reads the bf16 logits with no f32 copy of them and is f32, and its value has the
 *     bits of the program built by hand with the cast (what the policy compiled before);
 *  3. bad input: a loss dtype other than the logits' or f32, a dloss of a third dtype: DEFT_ERR_DTYPE, graph as
 *     it was. */
#include "ce_lowp.h"

/* logits = x @ w ([16, 40] @ [40, 300]) and cross-entropy with the defaults; under autocast the matmul is bf16. */
static void test_autocast_reads_low(void) {
    uint64_t rng = 0xa17cull;
    const int64_t xs[2] = {16, 40}, ws[2] = {40, 300};
    ref_tensor xv = ref_random(&rng, DEFT_F32, 2, xs, -1, 1), wv = ref_random(&rng, DEFT_F32, 2, ws, -1, 1);
    int32_t tv[16];
    for (int i = 0; i < 16; i++) tv[i] = i % 5 == 0 ? -100 : (int32_t)(ref_next(&rng) % 300);
    float loss[2] = {NAN, NAN};
    for (int hand = 0; hand < 2; hand++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *x = deft_constant(g, DEFT_F32, 2, xs, deft_cpu(), xv.raw, (size_t)xv.n * 4);
        deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, ws, deft_cpu(), DEFT_INIT_ZEROS);
        CHECK_OK(deft_param_set(w, wv.raw, (size_t)wv.n * 4));
        deft_tensor *t = deft_constant(g, DEFT_I32, 1, (int64_t[]){16}, deft_cpu(), tv, sizeof tv);
        const deft_cross_entropy_options o = deft_cross_entropy_defaults();
        deft_tensor *logits, *l;
        if (hand) {
            /* what autocast built before: bf16 matmul, the logits cast to f32, an f32 loss */
            logits = deft_matmul(deft_cast(x, DEFT_BF16), deft_cast(w, DEFT_BF16));
            l = deft_cross_entropy_ex(deft_cast(logits, DEFT_F32), t, &o);
        } else {
            logits = deft_matmul(x, w);
            deft_set_name(logits, "logits");
            l = deft_cross_entropy_ex(logits, t, &o);
        }
        CHECK_OK(deft_backward(l));
        deft_program *p = deft_compile(g, &l, 1, hand ? NULL : &(deft_compile_options){.autocast = DEFT_BF16});
        CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
        if (p) {
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, l, &loss[hand], sizeof(float)));
        }
        if (!hand) {
            const deft_tensor *lb = deft_graph_find(g, "logits@bf16");
            CHECK(lb && deft_tensor_dtype(lb) == DEFT_BF16);
            CHECK_MSG(deft_graph_find(g, "logits@bf16.f32") == NULL, "autocast cast the logits to f32");
        }
        deft_program_free(p);
        deft_graph_free(g);
    }
    uint32_t a, b;
    memcpy(&a, &loss[0], 4);
    memcpy(&b, &loss[1], 4);
    CHECK_MSG(isfinite(loss[0]) && a == b, "autocast loss %.9g, by hand with the cast %.9g", loss[0], loss[1]);
    ref_free(&xv), ref_free(&wv);
}

static void test_bad_dtypes(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_BF16, 2, (int64_t[]){4, 6}, deft_cpu());
    deft_tensor *t = deft_input(g, "t", DEFT_I32, 1, (int64_t[]){4}, deft_cpu());
    const int before = deft_graph_node_count(g);
    CHECK(deft_cross_entropy_as(x, t, NULL, DEFT_F16) == NULL);
    CHECK(deft_graph_error(g) == DEFT_ERR_DTYPE);
    CHECK(deft_graph_node_count(g) == before);
    deft_graph_free(g);

    g = deft_graph_new();
    x = deft_input(g, "x", DEFT_BF16, 2, (int64_t[]){4, 6}, deft_cpu());
    t = deft_input(g, "t", DEFT_I32, 1, (int64_t[]){4}, deft_cpu());
    deft_tensor *d = deft_input(g, "d", DEFT_F16, 0, NULL, deft_cpu());
    const int n2 = deft_graph_node_count(g);
    CHECK(deft_cross_entropy_grad(d, x, t) == NULL);
    CHECK(deft_graph_error(g) == DEFT_ERR_DTYPE);
    CHECK(deft_graph_node_count(g) == n2);
    deft_graph_free(g);
}

int main(void) {
    ce_lowp_check_bits(deft_cpu(), "cpu");
    test_autocast_reads_low();
    test_bad_dtypes();
    return deft_check_finish();
}
