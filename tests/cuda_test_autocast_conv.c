/* Autocast of the convolution net (tests/amp_conv_net.h) on cuda:0; the CPU's version is tests/test_autocast_conv.c:
 *  1. where the casts are, in the graph compiled for the GPU (bf16 and f16, NHWC and NCHW): every convolution in L on
 *     L sources (cuDNN in the low type, no widening as on the CPU), batch norm in f32, each pool in its input's dtype,
 *     one cast to L of x and of each conv and fc parameter, none of batch norm's, each run once per step;
 *  2. 20 steps of bf16 and of f16 follow the f32 run on the GPU, every loss within 0.01 + 1%, replaying the step as
 *     a CUDA Graph; the net learns (last loss under 80% of the first);
 *  3. the CPU and cuda:0 agree on 6 autocast steps (bf16 and f16): losses within 2% + 0.005, w3 within 2% of its
 *     largest magnitude;
 *  4. the planned activation bytes of the conv net and of tests/amp_net.h's MLP under bf16 against f32 (printed; the
 *     MLP's must be below 70% of f32's, as on the CPU, where test_autocast_activations counts them exactly).
 * Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0. */
#include <stdint.h>
#include <string.h>

#include "amp_conv_policy.h"
#include "amp_net.h"

#define B 16
#define STEPS 20

static deft_device GPU;

static int on_cpu(void) { return GPU.type == DEFT_CPU; }

static void test_casts(deft_dtype L, deft_layout layout) {
    amp_conv_net n;
    if (!acn_build(&n, GPU, B, layout)) return;
    deft_program *p = acn_compile(&n, &(deft_compile_options){.autocast = L});
    CHECK_MSG(p != NULL, "compile under %s: %s", deft_dtype_name(L), deft_errmsg());
    if (!p) return;
    deft_tensor *casts[8];
    int n_casts = 0;
    CHECK(acp_check_image_nodes(p, &n, L, on_cpu()) == 0);
    CHECK(acp_check_param_casts(p, &n, L, casts, &n_casts) == 0);
    CHECK(acp_check_named(&n, L, on_cpu()) == 0);
    for (int k = 0; k < 3; k++) CHECK(isfinite(acn_step(&n, p, (uint64_t)k)));
    for (int i = 0; i < n_casts; i++)
        CHECK_MSG(deft_program_node_runs(p, casts[i]) == 3, "%s ran %lld times in 3 steps", deft_tensor_name(casts[i]),
                  (long long)deft_program_node_runs(p, casts[i]));
    acn_free(&n);
}

static void test_follows_f32(deft_dtype L) {
    const int64_t replays = acn_check_follows_f32(GPU, L, B, STEPS);
    if (!on_cpu()) CHECK(replays >= STEPS - 2);
}

static void test_cpu_agrees(deft_dtype L) {
    amp_conv_net c, g;
    if (!acn_build(&c, deft_cpu(), B, DEFT_NHWC) || !acn_build(&g, GPU, B, DEFT_NHWC)) return;
    const deft_compile_options o = {.autocast = L};
    deft_program *pc = acn_compile(&c, &o), *pg = acn_compile(&g, &o);
    CHECK_MSG(pc && pg, "compile: %s", deft_errmsg());
    for (int k = 0; pc && pg && k < 6; k++) {
        const float lc = acn_step(&c, pc, (uint64_t)k), lg = acn_step(&g, pg, (uint64_t)k);
        CHECK_MSG(fabsf(lc - lg) <= 0.005f + 0.02f * fabsf(lc), "%s step %d: cpu %.6g, gpu %.6g", deft_dtype_name(L),
                  k, lc, lg);
    }
    float wc[256], wg[256], big = 0, diff = 0;
    acn_w3(&c, wc);
    acn_w3(&g, wg);
    for (int i = 0; i < 256; i++) {
        big = fmaxf(big, fabsf(wc[i]));
        diff = fmaxf(diff, fabsf(wc[i] - wg[i]));
    }
    printf("%s: w3 on the cpu and on %s differ by at most %g (largest %g)\n", deft_dtype_name(L),
           on_cpu() ? "cpu" : "cuda:0", diff, big);
    CHECK_MSG(diff <= 0.02f * big, "%s: w3 differs by %g (largest %g)", deft_dtype_name(L), diff, big);
    acn_free(&c);
    acn_free(&g);
}

static size_t activations(deft_program *p) {
    deft_device_footprint fp[2];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 2, &n));
    return n >= 1 ? fp[0].activation_bytes : 0;
}

static void test_activation_bytes(void) {
    amp_conv_net cn;
    amp_net mn;
    if (!acn_build(&cn, GPU, B, DEFT_NHWC) || !amp_build(&mn, GPU, 256, 32, 64, 8)) return;
    const deft_compile_options bf16 = {.autocast = DEFT_BF16};
    deft_program *cf = acn_compile(&cn, NULL), *cb = acn_compile(&cn, &bf16);
    deft_program *mf = amp_compile(&mn, NULL), *mb = amp_compile(&mn, &bf16);
    CHECK_MSG(cf && cb && mf && mb, "compile: %s", deft_errmsg());
    if (cf && cb && mf && mb) {
        const size_t a = activations(cf), b = activations(cb), c = activations(mf), d = activations(mb);
        printf("activation bytes on %s: conv net f32 %zu, bf16 %zu (%.3fx); mlp f32 %zu, bf16 %zu (%.3fx)\n",
               on_cpu() ? "cpu" : "cuda:0", a, b, (double)b / (double)a, c, d, (double)d / (double)c);
        CHECK(a > 0 && b > 0);
        CHECK(d < 0.7 * (double)c);
    }
    acn_free(&cn);
    amp_free(&mn);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_casts(DEFT_BF16, DEFT_NHWC);
    test_casts(DEFT_F16, DEFT_NHWC);
    test_casts(DEFT_BF16, DEFT_NCHW);
    test_follows_f32(DEFT_BF16);
    test_follows_f32(DEFT_F16);
    test_cpu_agrees(DEFT_BF16);
    test_cpu_agrees(DEFT_F16);
    test_activation_bytes();
    return deft_check_finish();
}
