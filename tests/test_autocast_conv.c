/* Autocast of a convolution net on the CPU (tests/amp_conv_net.h; the policy is ir/autocast_image.c's):
 *  1. where the casts are, read from the compiled graph, under bf16 and f16, NHWC and NCHW: every convolution on
 *     sources in L (on the CPU: widened from L, its result rounded to L), batch norm on its L x, each pool in its input's
 *     dtype; one cast to L of x and of each conv and fc parameter (w3, read by two convolutions, too), none of batch
 *     norm's; each of those casts runs once per step (2 runs after 2 steps); the DOT dump draws them;
 *  2. the losses follow the f32 run: 20 steps of bf16 and of f16 (NHWC) each within 0.01 + 1% of the f32 loss
 *     (8 and 11 significant bits, a dozen roundings deep; the largest difference seen is about 0.002), and the net
 *     learns (the last loss under 80% of the first; it falls to about 45%);
 *  3. autocast off (no options, and DEFT_F32) is the f32 program bit for bit: losses and w3 after 4 steps. */
#include <stdint.h>
#include <string.h>

#include "amp_conv_policy.h"
#include "read_file.h"

#define B 16
#define STEPS 20

static void test_casts(deft_dtype L, deft_layout layout) {
    amp_conv_net n;
    if (!acn_build(&n, deft_cpu(), B, layout)) return;
    deft_program *p = acn_compile(&n, &(deft_compile_options){.autocast = L});
    CHECK_MSG(p != NULL, "compile under %s: %s", deft_dtype_name(L), deft_errmsg());
    if (!p) return;
    deft_tensor *casts[8];
    int n_casts = 0;
    CHECK(acp_check_image_nodes(p, &n, L, 1) == 0);
    CHECK(acp_check_param_casts(p, &n, L, casts, &n_casts) == 0);
    CHECK(acp_check_named(&n, L, 1) == 0);
    for (int k = 0; k < 2; k++) CHECK(isfinite(acn_step(&n, p, (uint64_t)k)));
    for (int i = 0; i < n_casts; i++)
        CHECK_MSG(deft_program_node_runs(p, casts[i]) == 2, "%s ran %lld times in 2 steps", deft_tensor_name(casts[i]),
                  (long long)deft_program_node_runs(p, casts[i]));
    acn_free(&n);
}

static void test_dot(void) {
    amp_conv_net n;
    if (!acn_build(&n, deft_cpu(), B, DEFT_NHWC)) return;
    deft_program *p = acn_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    CHECK_OK(deft_graph_dump_dot(n.g, p, "test_autocast_conv.dot"));
    char *dot = read_file("test_autocast_conv.dot");
    CHECK(dot != NULL);
    if (dot) {
        CHECK(strstr(dot, "c2.weight.bf16\\ncast bf16 [16, 3, 3, 8] cpu\\nautocast") != NULL);
        CHECK(strstr(dot, "c3.weight.bf16\\ncast bf16 [16, 1, 1, 16] cpu\\nautocast") != NULL);
        CHECK(strstr(dot, "x.bf16\\ncast bf16 [16, 8, 8, 3] cpu\\nautocast") != NULL);
        CHECK(strstr(dot, "c2@bf16.bf16.f32") == NULL);   /* batch norm takes the bf16 x as it is */
        CHECK(strstr(dot, "bn2.weight.bf16") == NULL);
    }
    free(dot);
    acn_free(&n);
}

static void test_follows_f32(deft_dtype L) { (void)acn_check_follows_f32(deft_cpu(), L, B, STEPS); }

static void test_off_is_f32(void) {
    const deft_compile_options off[] = {{0}, {.autocast = DEFT_F32}};
    for (int v = 0; v < 2; v++) {
        amp_conv_net a, b;
        if (!acn_build(&a, deft_cpu(), B, DEFT_NHWC) || !acn_build(&b, deft_cpu(), B, DEFT_NHWC)) return;
        const int built = deft_graph_node_count(b.g);
        deft_program *pa = acn_compile(&a, NULL), *pb = acn_compile(&b, &off[v]);
        CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
        CHECK(deft_graph_node_count(b.g) == built);
        if (pa && pb) acn_check_same_bits(&a, pa, &b, pb, 4, v ? "autocast f32" : "no autocast");
        acn_free(&a);
        acn_free(&b);
    }
}

int main(void) {
    test_casts(DEFT_BF16, DEFT_NHWC);
    test_casts(DEFT_F16, DEFT_NHWC);
    test_casts(DEFT_BF16, DEFT_NCHW);
    test_dot();
    test_follows_f32(DEFT_BF16);
    test_follows_f32(DEFT_F16);
    test_off_is_f32();
    return deft_check_finish();
}
