/* The autocast optimizer on cuda:0 (the CPU's version is tests/test_autocast_optimizer.c): the step twin reads the
 * bf16 gradients of the f32 weights through the gather table, each segment in its own dtype
 * (ops/cuda/cuda_optimizer.cu):
 *  1. tests/amp_net.h's MLP under autocast gives, bit for bit, the losses and parameters of the same training with the
 *     optimizer fed f32 gradients (tests/amp_ref.h), replayed as CUDA Graphs, through every kernel that reads the
 *     table: the one-warp step (every parameter <= 32 elements), the one-block step, the many-block step (> 65536
 *     elements), the gather with two micro-batches and clipping, the direct step (one micro-batch, clipped), and the
 *     pieces of optimizer_in_backward; SGD with momentum and AdamW; and the direct step (bf16 AdamW clipped) bit
 *     for bit against the plain kernels (the debug knob OPT_REFERENCE);
 *  2. the casts back to f32 are not computed on the GPU either (fusion on);
 *  3. the CPU and cuda:0 agree on 5 autocast steps (bf16; SGD, AdamW, and optimizer in backward): losses within 2%;
 *     under SGD every parameter within 5% of its largest magnitude. AdamW's parameters are not compared: its update
 *     is about lr times the sign of the gradient whatever its size, so the CPU's and the GPU's bf16 roundings, which
 *     flip the signs of tiny gradients, move them apart by up to lr a step (on the H200, 14% of the largest after 5).
 * Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0. */
#include <stdint.h>

#include "amp_ref.h"

static deft_device GPU;

typedef struct net_size {
    const char *name;
    int64_t batch, in, hidden, classes;
} net_size;

static const net_size WARP = {"warp", 16, 4, 4, 4};     /* every parameter <= 32 elements */
static const net_size ONE = {"one block", 64, 32, 64, 8};
static const net_size MANY = {"many blocks", 64, 32, 256, 8};   /* 76296 elements */

static void reference_case(const net_size *z, const char *what, amp_optim o, const deft_compile_options *opts,
                           int steps) {
    amp_net n;
    char label[160];
    snprintf(label, sizeof label, "%s, %s %s", z->name, deft_dtype_name(opts->autocast), what);
    if (!amp_build_with(&n, GPU, z->batch, z->in, z->hidden, z->classes, o)) return;
    deft_program *p = amp_compile(&n, opts);
    CHECK_MSG(p != NULL, "%s: compile: %s", label, deft_errmsg());
    if (p) amp_ref_compare(&n, p, GPU, o, opts->autocast, steps, label);
    amp_free(&n);
}

static void test_same_as_f32_gradients(void) {
    const deft_compile_options bf16 = {.autocast = DEFT_BF16};
    const deft_compile_options split = {.autocast = DEFT_BF16, .optimizer_in_backward = 1};
    const deft_step_options accum_clip = {.accumulate_steps = 2, .max_grad_norm = 0.5};
    const deft_step_options clip = {.max_grad_norm = 0.5};
    const net_size *sizes[] = {&WARP, &ONE, &MANY};
    for (int i = 0; i < 3; i++) {
        reference_case(sizes[i], "sgd", (amp_optim){0, NULL}, &bf16, 6);
        reference_case(sizes[i], "adamw", (amp_optim){1, NULL}, &bf16, 6);
        reference_case(sizes[i], "sgd, clipped", (amp_optim){0, &clip}, &bf16, 6);
        reference_case(sizes[i], "adamw, clipped", (amp_optim){1, &clip}, &bf16, 6);
        reference_case(sizes[i], "sgd, 2 micro-batches, clipped", (amp_optim){0, &accum_clip}, &bf16, 8);
        reference_case(sizes[i], "adamw, 2 micro-batches, clipped", (amp_optim){1, &accum_clip}, &bf16, 8);
        reference_case(sizes[i], "sgd, optimizer in backward", (amp_optim){0, NULL}, &split, 6);
        reference_case(sizes[i], "adamw, optimizer in backward", (amp_optim){1, NULL}, &split, 6);
    }
}

static void test_casts_gone(void) {
    amp_net n;
    if (!amp_build(&n, GPU, ONE.batch, ONE.in, ONE.hidden, ONE.classes)) return;
    deft_program *p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) return;
    int steps = 0;
    const int low = amp_step_sources(p, n.g, DEFT_BF16, &steps);
    CHECK_MSG(steps == 1 && low >= 3, "%d step nodes read %d bf16 gradients", steps, low);
    int computed = 0;
    for (int id = 0; id < deft_graph_node_count(n.g); id++) {
        const deft_tensor *t = deft_testing_node(n.g, id);
        if (!deft_testing_is_op(t, "optimizer") || !deft_program_schedules(p, t)) continue;
        for (int k = 0; k < deft_testing_src_count(t); k++) {
            const deft_tensor *src = deft_testing_src(t, k);
            const deft_tensor *cast = deft_tensor_dtype(src) == DEFT_BF16 ? amp_cast_back(n.g, src) : NULL;
            computed += cast && deft_program_schedules(p, cast);
        }
    }
    CHECK_MSG(computed == 0, "%d casts of gradients back to f32 still computed", computed);
    for (int k = 0; k < 3; k++) amp_step(&n, p, (uint64_t)k, 1.0f);
    CHECK(deft_optimizer_updates(n.opt) == 3);
    amp_free(&n);
}

/* The direct step (AdamW over f32 parameters, one micro-batch, clipped, no loss scaling: ir/optimizer.h,
 * ops/cuda/cuda_optimizer_direct.cu) reads the low-precision gradients where they lie; the plain kernels (an optimizer
 * built under the debug knob OPT_REFERENCE) gather them into flat f32 first. Both give the same losses, norms,
 * parameters and state bit for bit, step after step, replayed; the plain one holds the flat gradients (persistent
 * bytes), so the other did take the direct step. */
static void direct_case(const char *what, amp_optim o, const deft_compile_options *opts) {
    amp_net a, b;
    CHECK_OK(deft_testing_set_debug("OPT_REFERENCE", 1));
    const int built_b = amp_build_with(&b, GPU, MANY.batch, MANY.in, MANY.hidden, MANY.classes, o);
    CHECK_OK(deft_testing_set_debug("OPT_REFERENCE", 0));
    const int built_a = amp_build_with(&a, GPU, MANY.batch, MANY.in, MANY.hidden, MANY.classes, o);
    deft_program *pa = built_a ? amp_compile(&a, opts) : NULL, *pb = built_b ? amp_compile(&b, opts) : NULL;
    CHECK_MSG(pa && pb, "%s: compile: %s", what, deft_errmsg());
    if (pa && pb && GPU.type == DEFT_CUDA) {
        deft_memory_report ma, mb;
        CHECK_OK(deft_program_memory(pa, &ma));
        CHECK_OK(deft_program_memory(pb, &mb));
        CHECK_MSG(mb.persistent_bytes > ma.persistent_bytes, "%s: persistent bytes %zu, the plain kernels' %zu: the "
                  "direct step kept flat gradients", what, ma.persistent_bytes, mb.persistent_bytes);
    }
    const size_t bytes = pa && pb ? deft_testing_optimizer_array_bytes(a.opt) : 0;
    char *x = malloc(bytes ? bytes : 1), *y = malloc(bytes ? bytes : 1);
    for (int k = 0; pa && pb && x && y && k < 8; k++) {
        const float la = amp_step(&a, pa, (uint64_t)k, 1.0f), lb = amp_step(&b, pb, (uint64_t)k, 1.0f);
        float na = 0, nb = 0;
        CHECK_OK(deft_program_read(pa, a.step, &na, sizeof na));
        CHECK_OK(deft_program_read(pb, b.step, &nb, sizeof nb));
        CHECK_MSG(memcmp(&la, &lb, sizeof la) == 0 && memcmp(&na, &nb, sizeof na) == 0,
                  "%s, step %d: loss %.9g and norm %.9g, the plain kernels' %.9g and %.9g", what, k, la, na, lb, nb);
        for (int arr = 0; arr < deft_testing_optimizer_arrays(a.opt); arr++) {
            CHECK_OK(deft_testing_optimizer_read(a.opt, arr, x, bytes));
            CHECK_OK(deft_testing_optimizer_read(b.opt, arr, y, bytes));
            CHECK_MSG(memcmp(x, y, bytes) == 0, "%s, step %d: array %d (0 the parameters) differs from the plain "
                      "kernels'", what, k, arr);
        }
    }
    if (pa && pb) CHECK(deft_optimizer_updates(a.opt) == deft_optimizer_updates(b.opt));
    if (pa && GPU.type == DEFT_CUDA) CHECK(deft_program_graph_replays(pa) >= 5);
    free(x);
    free(y);
    amp_free(&a);
    amp_free(&b);
}

static void test_direct_against_plain(void) {
    const deft_compile_options bf16 = {.autocast = DEFT_BF16};
    const deft_step_options clip = {.max_grad_norm = 0.5};
    /* SGD, and any step under f16 loss scaling, keep the plain kernels (ir/optimizer.h says why). */
    direct_case("bf16 adamw, clipped", (amp_optim){1, &clip}, &bf16);
    const deft_step_options tight = {.max_grad_norm = 0.05};
    direct_case("bf16 adamw, clipped hard", (amp_optim){1, &tight}, &bf16);
}

/* The worst difference of a parameter of a and b over its largest magnitude; each must be within tol of it (tol < 0:
 * reported only). */
static double params_close(amp_net *a, amp_net *b, const char *what, float tol) {
    double worst = 0;
    for (int i = 0; i < deft_testing_optimizer_param_count(a->opt); i++) {
        const int64_t n = deft_tensor_numel(amp_param(a, i));
        float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
        if (!x || !y) {
            free(x);
            free(y);
            return INFINITY;
        }
        CHECK_OK(deft_param_get(amp_param(a, i), x, (size_t)n * sizeof *x));
        CHECK_OK(deft_param_get(amp_param(b, i), y, (size_t)n * sizeof *y));
        float diff = 0, big = 0;
        for (int64_t j = 0; j < n; j++) {
            diff = fmaxf(diff, fabsf(x[j] - y[j]));
            big = fmaxf(big, fabsf(x[j]));
        }
        if (tol >= 0)
            CHECK_MSG(diff <= tol * big, "%s: %s differs by %g (largest %g)", what, deft_tensor_name(amp_param(a, i)),
                      diff, big);
        if (big > 0 && diff / big > worst) worst = diff / big;
        free(x);
        free(y);
    }
    return worst;
}

static void test_cpu_agrees(const char *what, amp_optim o, const deft_compile_options *opts) {
    amp_net c, g;
    if (!amp_build_with(&c, deft_cpu(), ONE.batch, ONE.in, ONE.hidden, ONE.classes, o) ||
        !amp_build_with(&g, GPU, ONE.batch, ONE.in, ONE.hidden, ONE.classes, o))
        return;
    deft_program *pc = amp_compile(&c, opts), *pg = amp_compile(&g, opts);
    CHECK_MSG(pc && pg, "%s: compile: %s", what, deft_errmsg());
    for (int k = 0; pc && pg && k < 5; k++) {
        const float lc = amp_step(&c, pc, (uint64_t)k, 1.0f), lg = amp_step(&g, pg, (uint64_t)k, 1.0f);
        CHECK_MSG(isfinite(lg) && fabsf(lc - lg) <= 0.02f * fabsf(lc), "%s step %d: cpu %.6g, gpu %.6g", what, k, lc,
                  lg);
    }
    const float tol = o.adamw ? -1.0f : 0.05f;
    if (pc && pg)
        printf("%s: cpu and gpu parameters within %.3g of their largest\n", what, params_close(&c, &g, what, tol));
    amp_free(&c);
    amp_free(&g);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_same_as_f32_gradients();
    test_direct_against_plain();
    test_casts_gone();
    const deft_compile_options bf16 = {.autocast = DEFT_BF16};
    const deft_compile_options split = {.autocast = DEFT_BF16, .optimizer_in_backward = 1};
    test_cpu_agrees("bf16 sgd", (amp_optim){0, NULL}, &bf16);
    test_cpu_agrees("bf16 adamw", (amp_optim){1, NULL}, &bf16);
    test_cpu_agrees("bf16 sgd, optimizer in backward", (amp_optim){0, NULL}, &split);
    test_cpu_agrees("bf16 adamw, optimizer in backward", (amp_optim){1, NULL}, &split);
    return deft_check_finish();
}
