/* Autocast and f16 loss scaling on cuda:0 (the CPU's versions are tests/test_autocast.c and test_loss_scale.c):
 *  1. bf16 and f16 runs of tests/amp_net.h follow the f32 run on the GPU (every one of 30 steps within 0.02 + 2%),
 *     replaying the step as a CUDA Graph;
 *  2. f16 with one batch 1e6 times too large: exactly that step is skipped on the device (weights unchanged, update
 *     count held, the scale halved), during graph replays; later steps update;
 *  3. the scale grows on the device: growth_interval 2 doubles it every 2 replayed steps, with no host in between;
 *  4. the CPU and cuda:0 agree on 5 autocast steps (bf16 and f16): losses within 2%, fc2's weight within 2% of its
 *     largest magnitude.
 * Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0. */
#include <stdint.h>

#include "amp_net.h"

#define B 256
#define IN 32
#define HID 64
#define CLS 8

static deft_device GPU;

static void test_follows_f32(deft_dtype dt) {
    amp_net a, b;
    if (!amp_build(&a, GPU, B, IN, HID, CLS) || !amp_build(&b, GPU, B, IN, HID, CLS)) return;
    deft_program *pa = amp_compile(&a, NULL), *pb = amp_compile(&b, &(deft_compile_options){.autocast = dt});
    CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
    float worst = 0, first = NAN, last = NAN;
    for (int k = 0; pa && pb && k < 30; k++) {
        float la = amp_step(&a, pa, (uint64_t)k, 1.0f), lb = amp_step(&b, pb, (uint64_t)k, 1.0f);
        CHECK_MSG(isfinite(lb) && fabsf(lb - la) <= 0.02f + 0.02f * fabsf(la), "%s step %d: %.6g, f32 %.6g",
                  deft_dtype_name(dt), k, lb, la);
        if (fabsf(lb - la) > worst) worst = fabsf(lb - la);
        if (k == 0) first = lb;
        last = lb;
    }
    printf("%s vs f32 on %s: largest loss difference %.4g; loss %.4g -> %.4g; %s\n", deft_dtype_name(dt),
           GPU.type == DEFT_CPU ? "cpu" : "cuda:0", worst, first, last, pb ? deft_program_graph_status(pb) : "");
    CHECK(last < 0.6f * first);
    if (GPU.type == DEFT_CUDA && pb) CHECK(deft_program_graph_replays(pb) >= 25);
    amp_free(&a);
    amp_free(&b);
}

static void test_overflow_on_device(void) {
    amp_net n;
    if (!amp_build(&n, GPU, B, IN, HID, CLS)) return;
    deft_program *p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_F16});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    static float before[HID * HID], after[HID * HID];
    float losses[12];
    for (int k = 0; p && k < 12; k++) {
        if (k == 5) amp_weight(&n, before);
        losses[k] = amp_step(&n, p, (uint64_t)k, k == 5 ? 1e6f : 1.0f);
        double scale;
        int64_t skipped;
        CHECK_OK(deft_optimizer_loss_scale(n.opt, &scale, &skipped));
        CHECK_MSG(skipped == (k >= 5) && scale == (k >= 5 ? 32768.0 : 65536.0), "step %d: scale %g, skipped %lld",
                  k, scale, (long long)skipped);
        CHECK(deft_optimizer_updates(n.opt) == (k >= 5 ? k : k + 1));
        if (k == 5 || k == 6) {
            amp_weight(&n, after);
            CHECK((memcmp(before, after, sizeof before) == 0) == (k == 5));
        }
    }
    for (int k = 0; p && k < 12; k++) CHECK_MSG(k == 5 || isfinite(losses[k]), "step %d: loss %g", k, losses[k]);
    if (p) CHECK(losses[11] < losses[0]);
    if (GPU.type == DEFT_CUDA && p) CHECK(deft_program_graph_replays(p) >= 9);
    amp_free(&n);
}

static void test_growth_on_device(void) {
    amp_net n;
    if (!amp_build(&n, GPU, B, IN, HID, CLS)) return;
    deft_program *p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_F16,
                                                              .loss_scale = {.init_scale = 64, .growth_interval = 2}});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    /* No read between the steps: the scale changes only on the device. */
    for (int k = 0; p && k < 10; k++) {
        amp_make_batch(&n, (uint64_t)k, 1.0f);
        CHECK_OK(deft_program_feed(p, n.x, n.hx, (size_t)(B * IN) * sizeof *n.hx));
        CHECK_OK(deft_program_feed(p, n.y, n.hy, (size_t)B * sizeof *n.hy));
        CHECK_OK(deft_program_run(p));
    }
    double scale;
    int64_t skipped;
    CHECK_OK(deft_optimizer_loss_scale(n.opt, &scale, &skipped));
    CHECK_MSG(scale == 64.0 * 32.0 && skipped == 0, "scale %g, skipped %lld", scale, (long long)skipped);
    amp_free(&n);
}

static void test_cpu_agrees(deft_dtype dt) {
    amp_net c, g;
    if (!amp_build(&c, deft_cpu(), B, IN, HID, CLS) || !amp_build(&g, GPU, B, IN, HID, CLS)) return;
    const deft_compile_options o = {.autocast = dt};
    deft_program *pc = amp_compile(&c, &o), *pg = amp_compile(&g, &o);
    CHECK_MSG(pc && pg, "compile: %s", deft_errmsg());
    for (int k = 0; pc && pg && k < 5; k++) {
        float lc = amp_step(&c, pc, (uint64_t)k, 1.0f), lg = amp_step(&g, pg, (uint64_t)k, 1.0f);
        CHECK_MSG(fabsf(lc - lg) <= 0.02f * fabsf(lc), "%s step %d: cpu %.6g, gpu %.6g", deft_dtype_name(dt), k, lc,
                  lg);
    }
    static float wc[HID * HID], wg[HID * HID];
    amp_weight(&c, wc);
    amp_weight(&g, wg);
    float big = 0, diff = 0;
    for (int i = 0; i < HID * HID; i++) {
        big = fmaxf(big, fabsf(wc[i]));
        diff = fmaxf(diff, fabsf(wc[i] - wg[i]));
    }
    CHECK_MSG(diff <= 0.02f * big, "%s: fc2 weights differ by %g (largest %g)", deft_dtype_name(dt), diff, big);
    amp_free(&c);
    amp_free(&g);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_follows_f32(DEFT_BF16);
    test_follows_f32(DEFT_F16);
    test_overflow_on_device();
    test_growth_on_device();
    test_cpu_agrees(DEFT_BF16);
    test_cpu_agrees(DEFT_F16);
    return deft_check_finish();
}
