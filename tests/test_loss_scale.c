/* f16 autocast with dynamic loss scaling (deft_loss_scale_options) on the CPU, as torch.cuda.amp.GradScaler:
 *  1. an f16 run follows the f32 loss curve (every one of 30 steps within 0.02 + 2%) with the default scale 65536
 *     and nothing skipped;
 *  2. one batch 1e6 times too large overflows f16: exactly that step is skipped (the weights do not move, the update
 *     count stays, the step's value is not finite), the scale halves, and the steps after it update and learn;
 *  3. a scale too large for the gradients (2^40) is halved step after step until they fit: the skipped count and the
 *     scale agree (scale = 2^40 / 2^skipped), and the run then goes on; growth_interval 3 doubles it after every 3
 *     clean steps;
 *  4. loss_scale.disable starts the backward pass from 1 and never skips; scaled and unscaled steps of one optimizer
 *     in two live programs are refused;
 *  5. options out of range are errors naming the option. */
#include <stdint.h>

#include "amp_net.h"

#define B 128
#define IN 32
#define HID 64
#define CLS 8

static const deft_compile_options F16 = {.autocast = DEFT_F16};

static void scale_of(amp_net *n, double *scale, int64_t *skipped) { CHECK_OK(deft_optimizer_loss_scale(n->opt, scale, skipped)); }

static void test_follows_f32(void) {
    amp_net a, b;
    if (!amp_build(&a, deft_cpu(), B, IN, HID, CLS) || !amp_build(&b, deft_cpu(), B, IN, HID, CLS)) return;
    double scale;
    int64_t skipped;
    scale_of(&b, &scale, &skipped);
    CHECK(scale == 1.0 && skipped == 0);   /* nothing compiled under f16 yet */
    deft_program *pa = amp_compile(&a, NULL), *pb = amp_compile(&b, &F16);
    CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
    scale_of(&b, &scale, &skipped);
    CHECK(scale == 65536.0 && skipped == 0);
    float first = NAN, last = NAN;
    for (int k = 0; pa && pb && k < 30; k++) {
        float la = amp_step(&a, pa, (uint64_t)k, 1.0f), lb = amp_step(&b, pb, (uint64_t)k, 1.0f);
        CHECK_MSG(isfinite(lb) && fabsf(lb - la) <= 0.02f + 0.02f * fabsf(la), "step %d: f16 %.6g, f32 %.6g", k, lb, la);
        if (k == 0) first = lb;
        last = lb;
    }
    CHECK(last < 0.6f * first);
    scale_of(&b, &scale, &skipped);
    CHECK(scale == 65536.0 && skipped == 0);
    CHECK(deft_optimizer_updates(b.opt) == 30);
    amp_free(&a);
    amp_free(&b);
}

static void test_forced_overflow(void) {
    amp_net n;
    deft_program *p = amp_build_compiled(&n, deft_cpu(), B, IN, HID, CLS, &F16);
    if (!p) return;
    static float before[HID * HID], after[HID * HID];
    float losses[12], norm;
    for (int k = 0; k < 12; k++) {
        if (k == 5) amp_weight(&n, before);
        losses[k] = amp_step(&n, p, (uint64_t)k, k == 5 ? 1e6f : 1.0f);
        CHECK_OK(deft_program_read(p, n.step, &norm, sizeof norm));
        double scale;
        int64_t skipped;
        scale_of(&n, &scale, &skipped);
        CHECK_MSG(skipped == (k >= 5) && scale == (k >= 5 ? 32768.0 : 65536.0), "step %d: scale %g, skipped %lld",
                  k, scale, (long long)skipped);
        CHECK(deft_optimizer_updates(n.opt) == (k >= 5 ? k : k + 1));
        CHECK_MSG(isfinite(norm) == (k != 5), "step %d: norm %g", k, norm);
        if (k == 5) {
            amp_weight(&n, after);
            CHECK(memcmp(before, after, sizeof before) == 0);   /* the step was skipped */
            CHECK(!isfinite(losses[5]));
        }
        if (k == 6) {
            amp_weight(&n, after);
            CHECK(memcmp(before, after, sizeof before) != 0);   /* the next one updates */
        }
    }
    for (int k = 0; k < 12; k++) CHECK_MSG(k == 5 || isfinite(losses[k]), "step %d: loss %g", k, losses[k]);
    CHECK(losses[11] < losses[0]);
    amp_free(&n);
}

static void test_backoff_and_growth(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), B, IN, HID, CLS)) return;
    deft_program *p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_F16,
                                                              .loss_scale = {.init_scale = 1099511627776.0}});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    double scale = 0;
    int64_t skipped = 0;
    int k = 0;
    for (; p && k < 40; k++) {
        amp_step(&n, p, (uint64_t)k, 1.0f);
        scale_of(&n, &scale, &skipped);
        if (deft_optimizer_updates(n.opt) > 0) break;
    }
    printf("2^40 came down to %g after %lld skipped steps\n", scale, (long long)skipped);
    CHECK(skipped > 0 && skipped == k && scale == ldexp(1.0, 40 - (int)skipped));
    CHECK(deft_optimizer_updates(n.opt) == 1);
    amp_free(&n);

    if (!amp_build(&n, deft_cpu(), B, IN, HID, CLS)) return;
    p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_F16,
                                               .loss_scale = {.init_scale = 256, .growth_interval = 3,
                                                              .growth_factor = 4, .backoff_factor = 0.25}});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    for (k = 1; p && k <= 7; k++) {
        amp_step(&n, p, (uint64_t)k, 1.0f);
        scale_of(&n, &scale, &skipped);
        CHECK_MSG(scale == 256.0 * pow(4.0, k / 3) && skipped == 0, "after %d steps: scale %g", k, scale);
    }
    amp_step(&n, p, 99, 1e6f);   /* an overflow: the scale times 0.25, the clean run starts again */
    scale_of(&n, &scale, &skipped);
    CHECK(scale == 256.0 * 16.0 * 0.25 && skipped == 1);
    amp_free(&n);
}

static void test_disable_and_conflicts(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), B, IN, HID, CLS)) return;
    deft_program *p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_F16, .loss_scale = {.disable = 1}});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    float l = amp_step(&n, p, 0, 1.0f);
    CHECK(isfinite(l));
    double scale;
    int64_t skipped;
    scale_of(&n, &scale, &skipped);
    CHECK(scale == 1.0 && skipped == 0 && deft_optimizer_updates(n.opt) == 1);
    /* An f32 program and an unscaled f16 one may live together; a scaled one may not join them. */
    deft_program *f32 = amp_compile(&n, NULL);
    CHECK(f32 != NULL);
    CHECK_NULL_ERR(amp_compile(&n, &F16), "one optimizer cannot step both ways at once");
    deft_program_free(f32);
    deft_program_free(p);
    deft_program *scaled = amp_compile(&n, &F16);
    CHECK_MSG(scaled != NULL, "compile: %s", deft_errmsg());
    CHECK_NULL_ERR(amp_compile(&n, NULL), "steps its optimizer without f16 loss scaling, and a live program steps it with");
    /* Without the step the loss alone compiles beside it. */
    deft_program *fwd = deft_compile(n.g, &n.loss, 1, NULL);
    CHECK(fwd != NULL);
    CHECK(deft_graph_error(n.g) == DEFT_OK);
    amp_free(&n);
}

static void test_bad_options(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), 16, 8, 12, 4)) return;
    deft_tensor *outs[] = {n.loss, n.step};
    struct { deft_loss_scale_options o; const char *msg; } bad[] = {
        {{.init_scale = -1}, "loss_scale.init_scale -1 must be finite, > 0 and fit an f32"},
        {{.init_scale = INFINITY}, "loss_scale.init_scale inf"},
        {{.init_scale = 1e39}, "loss_scale.init_scale 1e+39"},
        {{.growth_factor = 0.5}, "loss_scale.growth_factor 0.5 must be finite and > 1"},
        {{.growth_factor = 1}, "loss_scale.growth_factor 1 must"},
        {{.backoff_factor = 1.5}, "loss_scale.backoff_factor 1.5 must lie in (0, 1)"},
        {{.backoff_factor = -0.5}, "loss_scale.backoff_factor -0.5"},
        {{.backoff_factor = NAN}, "loss_scale.backoff_factor nan"},
        {{.growth_interval = -3}, "loss_scale.growth_interval -3 must be >= 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_NULL_ERR(deft_compile(n.g, outs, 2, &(deft_compile_options){.autocast = DEFT_F16, .loss_scale = bad[i].o}),
                       bad[i].msg);
    double scale;
    CHECK_ERR(deft_optimizer_loss_scale(NULL, &scale, NULL), DEFT_ERR_INVALID, "optimizer is NULL");
    amp_free(&n);
}

int main(void) {
    test_follows_f32();
    test_forced_overflow();
    test_backoff_and_growth();
    test_disable_and_conflicts();
    test_bad_options();
    return deft_check_finish();
}
