/* The activation figure of the plan (deft_device_footprint.activation_bytes, passes/activation_bytes.c) on a tiny
 * MLP, against the bytes counted by hand from the shapes:
 *   x [B, IN] -> fc1 -> relu (a [B, H]) -> fc2 (logits [B, C]) -> cross-entropy with i32 labels; backward; SGD.
 * The backward pass reads, of the forward values: a (relu's gradient reads its output; fc2's weight gradient reads
 * its input), the logits (cross-entropy's gradient), and fc1's matmul input (its weight gradient). In f32 that input
 * is x, an input kept in persistent storage, so the arena holds a and the logits:
 *   f32:   4 B H + 4 B C
 * Under bf16 the matmuls read x.bf16 and a is bf16 (saved in L); the cross-entropy reads the bf16 logits as they are
 * (an f32 loss, no f32 copy of the logits: ir/autocast_policy.c), so its gradient keeps them in bf16; the weights'
 * bf16 copies depend on no input and are not activations; x.bf16, the cast of an input, is not kept for fc1's
 * weight gradient but cast again from x just before it (passes/checkpoint.h), so it lives in the forward pass only:
 *   bf16:  2 B H + 2 B C
 * so the activations are exactly half. Both are live together at the cross-entropy's gradient, so each sum is
 * the peak. Keeping x.bf16 (the internal switch deft_testing_keep_input_casts) would add its 2 B IN. A program without
 * the backward pass keeps nothing for it: 0. */
#include <stdbool.h>

#include "amp_net.h"
#include "deft_testing.h"

#define B 32
#define IN 8
#define H 64
#define C 8

static size_t activation_bytes(deft_program *p) {
    deft_device_footprint fp[2];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 2, &n));
    CHECK(n == 1);
    CHECK_MSG(fp[0].activation_bytes <= fp[0].arena_bytes, "%zu activation bytes in an arena of %zu",
              fp[0].activation_bytes, fp[0].arena_bytes);
    return n == 1 ? fp[0].activation_bytes : 0;
}

typedef struct tiny {
    deft_graph *g;
    deft_tensor *logits, *loss, *step;
} tiny;

static int tiny_build(tiny *t) {
    t->g = deft_graph_new();
    deft_tensor *x = deft_input(t->g, "x", DEFT_F32, 2, (int64_t[]){B, IN}, deft_cpu());
    deft_tensor *y = deft_input(t->g, "y", DEFT_I32, 1, (int64_t[]){B}, deft_cpu());
    deft_tensor *a = deft_relu(deft_linear(x, H, "fc1", NULL));
    t->logits = deft_linear(a, C, "fc2", NULL);
    t->loss = deft_cross_entropy(t->logits, y);
    CHECK_OK(deft_backward(t->loss));
    deft_optimizer *opt = deft_sgd(t->g, &(deft_sgd_options){.lr = 0.1}, NULL);
    t->step = opt ? deft_optimizer_step(opt) : NULL;
    CHECK_MSG(t->step != NULL, "build: %s", deft_graph_errmsg(t->g));
    return t->step != NULL;
}

static size_t compiled_activations(tiny *t, deft_tensor **outs, int n, deft_dtype autocast, bool keep_casts) {
    deft_testing_keep_input_casts(t->g, keep_casts);
    deft_program *p = deft_compile(t->g, outs, n, &(deft_compile_options){.autocast = autocast});
    deft_testing_keep_input_casts(t->g, 0);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    size_t bytes = p ? activation_bytes(p) : 0;
    deft_program_free(p);
    return bytes;
}

static void test_by_hand(void) {
    tiny t;
    if (!tiny_build(&t)) return;
    deft_tensor *train[] = {t.loss, t.step}, *infer[] = {t.logits};
    const size_t f32 = compiled_activations(&t, train, 2, DEFT_F32, false);
    const size_t bf16 = compiled_activations(&t, train, 2, DEFT_BF16, false);
    const size_t f16 = compiled_activations(&t, train, 2, DEFT_F16, false);
    const size_t kept = compiled_activations(&t, train, 2, DEFT_BF16, true);
    const size_t want_f32 = 4 * B * H + 4 * B * C, want_low = 2 * B * H + 2 * B * C;
    printf("activation bytes: f32 %zu (by hand %zu), bf16 %zu, f16 %zu (by hand %zu); bf16 keeping x's cast %zu\n",
           f32, (size_t)want_f32, bf16, f16, (size_t)want_low, kept);
    CHECK(f32 == want_f32);
    CHECK(bf16 == want_low);
    CHECK(f16 == want_low);
    CHECK(kept == want_low + 2 * B * IN);
    /* a and the logits, both kept in bf16: halved exactly */
    CHECK(f32 == 2 * bf16);
    CHECK(compiled_activations(&t, infer, 1, DEFT_F32, false) == 0);
    CHECK(compiled_activations(&t, infer, 1, DEFT_BF16, false) == 0);
    deft_graph_free(t.g);
}

/* The amp_net MLP (three layers, batch 256, 32 -> 64 -> 64 -> 8), counted the same way. */
static void test_mlp_ratio(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), 256, 32, 64, 8)) return;
    deft_program *pf = amp_compile(&n, NULL), *pb = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16});
    CHECK_MSG(pf && pb, "compile: %s", deft_errmsg());
    if (pf && pb) {
        const size_t f = activation_bytes(pf), b = activation_bytes(pb);
        printf("amp_net activation bytes: f32 %zu, bf16 %zu (%.3fx)\n", f, b, (double)b / (double)f);
        /* f32: two hidden activations and the logits; bf16: the same in bf16, the logits too (the cross-entropy
         * reads them as they are; x.bf16 is recast for the backward pass), so exactly half */
        CHECK(f == 4 * (2 * 256 * 64 + 256 * 8));
        CHECK(b == 2 * (2 * 256 * 64 + 256 * 8));
        CHECK(f == 2 * b);
    }
    amp_free(&n);
}

int main(void) {
    test_by_hand();
    test_mlp_ratio();
    return deft_check_finish();
}
