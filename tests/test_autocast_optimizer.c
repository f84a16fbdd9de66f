/* The autocast optimizer on the CPU: the step twin of a bf16 rewrite reads the bf16 gradients of the f32 weights and
 * widens them on load (ir/autocast.h, runtime/optimizer_run.c):
 *  1. tests/amp_net.h's MLP trained under autocast gives, bit for bit, the losses and parameters of the same training
 *     with the optimizer fed the f32 gradients (tests/amp_ref.h): SGD with momentum and AdamW under bf16, SGD with
 *     two micro-batches per update and clipping, AdamW with clipping under f16 (no loss scaling), and under
 *     optimizer_in_backward;
 *  2. the casts of the weights' gradients back to f32 are gone: the twin (and each piece of a split step) reads the
 *     bf16 values, the casts run only when a program asks for deft_grad() of a weight, one step fewer per weight;
 *     f16 (with loss scaling) reads the f32 gradients (test_loss_scale.c checks its skipping); a rewrite for data
 *     parallel training keeps f32 gradients;
 *  3. the gradient check: bf16/f16 for f32 weights and the weights' own dtype pass; f64, i32, a wrong element count
 *     or count of gradients, and bf16 for f64 weights are errors naming the gradient and the parameter. */
#include <stdint.h>

#include "amp_ref.h"
#include "deft_testing.h"

#define B 64
#define IN 32
#define HID 64
#define CLS 8

static const deft_compile_options BF16 = {.autocast = DEFT_BF16};

static void reference_case(const char *what, amp_optim o, const deft_compile_options *opts, int steps) {
    amp_net n;
    if (!amp_build_with(&n, deft_cpu(), B, IN, HID, CLS, o)) return;
    deft_program *p = amp_compile(&n, opts);
    CHECK_MSG(p != NULL, "%s: compile: %s", what, deft_errmsg());
    if (p) amp_ref_compare(&n, p, deft_cpu(), o, opts->autocast, steps, what);
    amp_free(&n);
}

static void test_same_as_f32_gradients(void) {
    const deft_step_options accum_clip = {.accumulate_steps = 2, .max_grad_norm = 0.5};
    const deft_step_options clip = {.accumulate_steps = 1, .max_grad_norm = 0.5};
    const deft_compile_options f16 = {.autocast = DEFT_F16, .loss_scale.disable = 1};
    const deft_compile_options split = {.autocast = DEFT_BF16, .optimizer_in_backward = 1};
    reference_case("bf16 sgd", (amp_optim){0, NULL}, &BF16, 8);
    reference_case("bf16 adamw", (amp_optim){1, NULL}, &BF16, 6);
    reference_case("bf16 sgd, 2 micro-batches, clipped", (amp_optim){0, &accum_clip}, &BF16, 8);
    reference_case("f16 adamw, clipped", (amp_optim){1, &clip}, &f16, 6);
    reference_case("bf16 sgd, optimizer in backward", (amp_optim){0, NULL}, &split, 6);
    reference_case("bf16 adamw, optimizer in backward", (amp_optim){1, NULL}, &split, 6);
}

static void test_casts_gone(void) {
    amp_net n;
    deft_program *p = amp_build_compiled(&n, deft_cpu(), B, IN, HID, CLS, &BF16);
    if (!p) return;
    const deft_graph *g = n.g;
    int steps = 0;
    const int low = amp_step_sources(p, g, DEFT_BF16, &steps);
    CHECK_MSG(steps == 1 && low >= 3, "%d step nodes read %d bf16 gradients (the three weights at least)", steps, low);
    const deft_tensor *twin = NULL;
    for (int id = 0; id < deft_graph_node_count(g) && !twin; id++) {
        const deft_tensor *t = deft_testing_node(g, id);
        if (deft_testing_is_op(t, "optimizer") && deft_program_schedules(p, t)) twin = t;
    }
    int gone = 0;
    for (int k = 0; twin && k < deft_testing_src_count(twin); k++) {
        const deft_tensor *src = deft_testing_src(twin, k), *param = deft_testing_optimizer_param(n.opt, k);
        const deft_dtype sdt = deft_tensor_dtype(src);
        const int weight = strstr(deft_tensor_name(param), ".weight") != NULL;
        CHECK_MSG(!weight || sdt == DEFT_BF16, "the step reads %s's gradient in %s", deft_tensor_name(param),
                  deft_dtype_name(sdt));
        CHECK(sdt == DEFT_BF16 || sdt == DEFT_F32);
        if (sdt != DEFT_BF16) continue;
        /* A gradient the checkpoint rewrite copied (the first layer's, which reads the recast input) has no cast
         * back at all; the others have one that is not computed. */
        const deft_tensor *cast = amp_cast_back(g, src);
        if (!cast || !deft_program_schedules(p, cast)) gone++;
    }
    CHECK_MSG(gone == low, "%d of the %d casts back to f32 are not computed", gone, low);

    /* Asking for every parameter's gradient brings exactly those casts back: one step each. */
    deft_tensor *outs[2 + AMP_REF_MAX] = {n.loss, n.step};
    const int np = deft_testing_optimizer_param_count(n.opt);
    for (int i = 0; i < np && i < AMP_REF_MAX; i++) outs[2 + i] = deft_grad(deft_testing_optimizer_param(n.opt, i));
    deft_program *with_grads = deft_compile(n.g, outs, 2 + np, &BF16);
    CHECK_MSG(with_grads != NULL, "compile with the gradients: %s", deft_errmsg());
    if (with_grads)
        CHECK_MSG(deft_program_step_count(with_grads) == deft_program_step_count(p) + low,
                  "steps: %d with the gradients as outputs, %d without, %d casts", deft_program_step_count(with_grads),
                  deft_program_step_count(p), low);
    amp_step(&n, p, 0, 1.0f);
    for (int k = 0; twin && k < deft_testing_src_count(twin); k++) {
        const deft_tensor *src = deft_testing_src(twin, k);
        const deft_tensor *cast = deft_tensor_dtype(src) == DEFT_BF16 ? amp_cast_back(g, src) : NULL;
        if (cast) CHECK_MSG(deft_program_node_runs(p, cast) == 0, "%s ran", deft_tensor_name(cast));
    }

    /* Optimizer in backward: the pieces (a finisher and at least one piece) read the same bf16 gradients. */
    deft_program *split = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .optimizer_in_backward = 1});
    CHECK_MSG(split != NULL, "compile, optimizer in backward: %s", deft_errmsg());
    int parts = 0;
    const int split_low = split ? amp_step_sources(split, g, DEFT_BF16, &parts) : -1;
    CHECK_MSG(split_low == low && parts >= 2, "%d parts read %d bf16 gradients", parts, split_low);

    /* f16 (with loss scaling): the twin reads the f32 gradients (passes/autocast_program.c keeps f16's widened). */
    deft_program_free(split);
    deft_program_free(with_grads);
    deft_program_free(p);
    deft_program *f16 = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_F16});
    CHECK_MSG(f16 != NULL, "compile, f16: %s", deft_errmsg());
    if (f16) CHECK(amp_step_sources(f16, g, DEFT_F16, &steps) == 0 && steps == 1);
    amp_free(&n);
}

/* A rewrite that keeps f32 gradients (data parallel's, passes/autocast_program.c) makes a twin that reads them. */
static void test_f32_rewrite(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), B, IN, HID, CLS)) return;
    deft_testing_autocast *keep = NULL, *low = NULL;
    CHECK_OK(deft_testing_autocast_get(n.g, DEFT_BF16, 0, 1, &keep));
    CHECK_OK(deft_testing_autocast_get(n.g, DEFT_BF16, 0, 0, &low));
    CHECK(keep && low && keep != low);
    const deft_tensor *a = keep ? deft_testing_autocast_map(keep, n.step) : NULL;
    const deft_tensor *b = low ? deft_testing_autocast_map(low, n.step) : NULL;
    const int na = deft_testing_src_count(a);
    CHECK(a && b && a != b && na == deft_testing_src_count(b));
    int f32 = 0, bf16 = 0;
    for (int k = 0; a && b && k < na; k++) {
        f32 += deft_tensor_dtype(deft_testing_src(a, k)) == DEFT_F32;
        bf16 += deft_tensor_dtype(deft_testing_src(b, k)) == DEFT_BF16;
    }
    CHECK_MSG(a && f32 == na && bf16 >= 3, "f32 twin: %d of %d f32 sources; low twin: %d bf16", f32, na, bf16);
    amp_free(&n);
}

static void test_grad_check(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){4, 3}, deft_cpu(), DEFT_INIT_ONES);
    CHECK_OK(deft_backward(deft_sum(deft_mul(w, w), 0, NULL, 0)));
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    CHECK(opt != NULL);
    if (!opt) {
        deft_graph_free(g);
        return;
    }
    deft_tensor *gr[6];
    const deft_dtype dts[] = {DEFT_F32, DEFT_BF16, DEFT_F16, DEFT_F64, DEFT_I32};
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "g%d", i);
        gr[i] = deft_input(g, name, dts[i], 2, (int64_t[]){4, 3}, deft_cpu());
    }
    gr[5] = deft_input(g, "g5", DEFT_F32, 1, (int64_t[]){5}, deft_cpu());
    for (int i = 0; i < 3; i++) CHECK_OK(deft_optimizer_check_grads(opt, "step", &gr[i], 1));
    CHECK_ERR(deft_optimizer_check_grads(opt, "step", &gr[3], 1), DEFT_ERR_DTYPE,
              "optimizer step: the gradient g3 is f64 for the f32 parameter w; it must be f32 (or bf16 or f16");
    CHECK_ERR(deft_optimizer_check_grads(opt, "step", &gr[4], 1), DEFT_ERR_DTYPE, "the gradient g4 is i32");
    CHECK_ERR(deft_optimizer_check_grads(opt, "step", &gr[5], 1), DEFT_ERR_INVALID,
              "the gradient g5 has 5 elements, the parameter w 12");
    CHECK_ERR(deft_optimizer_check_grads(opt, "step", gr, 2), DEFT_ERR_INVALID, "2 gradients for 1 parameters");
    deft_graph_free(g);

    g = deft_graph_new();
    deft_tensor *w64 = deft_param(g, "w64", DEFT_F64, 1, (int64_t[]){3}, deft_cpu(), DEFT_INIT_ONES);
    CHECK_OK(deft_backward(deft_sum(deft_mul(w64, w64), 0, NULL, 0)));
    opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    deft_tensor *low = deft_input(g, "low", DEFT_BF16, 1, (int64_t[]){3}, deft_cpu());
    deft_tensor *own = deft_input(g, "own", DEFT_F64, 1, (int64_t[]){3}, deft_cpu());
    CHECK(opt && low && own);
    if (opt && low && own) {
        CHECK_OK(deft_optimizer_check_grads(opt, "step64", &own, 1));
        CHECK_ERR(deft_optimizer_check_grads(opt, "step64", &low, 1), DEFT_ERR_DTYPE,
                  "the gradient low is bf16 for the f64 parameter w64; it must be f64");
    }
    deft_graph_free(g);
}

int main(void) {
    test_same_as_f32_gradients();
    test_casts_gone();
    test_f32_rewrite();
    test_grad_check();
    return deft_check_finish();
}
