/* deft_layer_norm on cuda:0 (ops/cuda/cuda_layer_norm.cu): the value, dx and the weight and bias gradients of
 * loss = sum(layer_norm(x) * r) against the float64 reference (tests/layer_norm_run.h) and against the CPU's op, in
 * f32, f64, f16 and bf16, for rows on and off the kernels' 16-byte vectors (C = 1, 7, 768, 1600, 5000) and more rows
 * than the weight gradient's row blocks. Tolerances relative to the largest reference magnitude: ref.h's by dtype
 * (f32 1e-5, f16 2e-3, bf16 1e-2), twice that for the residual block (its gradient passes a tanh).
 * The residual block of a pre-norm transformer (s = a + b, y = layer_norm(s), h = s + tanh(y)) runs fused (the add
 * and the layer norm as one kernel, dx and the residual gradient's add as one, with the weight gradient where there is
 * one (ln_grad_sums); with b a bf16 value cast to f32, the cast too): the groups are formed, and every value equals
 * the unfused program's (no_fusion) bit for bit. The weight
 * gradient is deterministic (two runs, the same bits). Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1
 * runs it on the CPU instead (the group checks then stand down). */
#include "check.h"
#include "ref.h"
#include "layer_norm_run.h"
#include "deft_testing.h"

static uint64_t rng = 0x1a7e6b0full;
static deft_device GPU;

static void compare_result(const char *what, const ln_case *c, const ln_result *got, const ln_result *want,
                           double tol) {
    const int64_t n = ln_numel(c), cols = ln_cols(c);
    char part[200];
    const double *g[6] = {got->y, got->dx, got->dw, got->db, got->s, got->db2};
    const double *w[6] = {want->y, want->dx, want->dw, want->db, want->s, want->db2};
    static const char *const names[6] = {"y", "dx", "dw", "db", "s", "db2"};
    for (int i = 0; i < 6; i++) {
        if (!w[i] || (i == 2 && !c->weight) || (i == 3 && !c->bias)) continue;
        CHECK_MSG(g[i] != NULL, "%s: %s missing", what, names[i]);
        if (!g[i]) continue;
        snprintf(part, sizeof part, "%s: %s", what, names[i]);
        /* db2 is stored in b's dtype: a sum a rounding apart on the two devices can round to neighbouring halves */
        const double t = i == 5 && c->b2_dtype != DEFT_F32 ? fmax(tol, 2 * ref_tol(c->b2_dtype)) : tol;
        ref_close_tol(part, g[i], w[i], i == 2 || i == 3 ? cols : n, t);
    }
}

static void plain_case(const ln_case *c, deft_dtype dt) {
    ln_values v = ln_random(&rng, c, dt);
    ln_result want = {0}, cpu = {0}, gpu = {0};
    ln_reference(c, &v, &want);
    char what[160];
    snprintf(what, sizeof what, "%s [%lld] of %lld w %d b %d", deft_dtype_name(dt), (long long)ln_cols(c),
             (long long)ln_numel(c), c->weight, c->bias);
    if (ln_run(c, &v, dt, GPU, NULL, &gpu)) {
        compare_result(what, c, &gpu, &want, ref_tol(dt));
        if (ln_run(c, &v, dt, deft_cpu(), NULL, &cpu)) compare_result(what, c, &gpu, &cpu, ref_tol(dt));
        ln_result_free(&cpu);
    }
    ln_result_free(&gpu);
    ln_result_free(&want);
    ln_values_free(&v);
}

static void test_against_reference(void) {
    static const ln_case cases[] = {
        {2, {4, 1}, 1, 1, 1e-5, 0, DEFT_F32},       {3, {2, 3, 7}, 1, 1, 1e-5, 0, DEFT_F32},
        {3, {2, 64, 768}, 1, 1, 1e-5, 0, DEFT_F32}, {2, {300, 768}, 1, 0, 1e-5, 0, DEFT_F32},
        {2, {33, 1600}, 0, 1, 1e-3, 0, DEFT_F32},   {2, {3, 5000}, 1, 1, 1e-5, 0, DEFT_F32},
        {2, {65, 40}, 0, 0, 0.0, 0, DEFT_F32},
    };
    static const deft_dtype dts[4] = {DEFT_F32, DEFT_F64, DEFT_F16, DEFT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 4; d++) plain_case(&cases[i], dts[d]);
}

static int results_equal(const ln_case *c, const ln_result *a, const ln_result *b) {
    const int64_t n = ln_numel(c), cols = ln_cols(c);
    const double *x[6] = {a->y, a->dx, a->dw, a->db, a->s, a->db2}, *y[6] = {b->y, b->dx, b->dw, b->db, b->s, b->db2};
    for (int i = 0; i < 6; i++) {
        if (!x[i] || !y[i]) continue;
        if (memcmp(x[i], y[i], (size_t)(i == 2 || i == 3 ? cols : n) * sizeof(double)) != 0) return 0;
    }
    return 1;
}

/* The residual block fused against unfused (bits) and against the CPU (tolerance). */
static void residual_case(const ln_case *c, deft_dtype dt) {
    ln_values v = ln_random(&rng, c, dt);
    ln_result fused = {0}, plain = {0}, cpu = {0};
    const deft_compile_options unfused = {.no_fusion = 1};
    char what[160];
    snprintf(what, sizeof what, "residual %s (b %s) [%lld] of %lld", deft_dtype_name(dt),
             deft_dtype_name(c->b2_dtype), (long long)ln_cols(c), (long long)ln_numel(c));
    if (ln_run(c, &v, dt, GPU, NULL, &fused) && ln_run(c, &v, dt, GPU, &unfused, &plain)) {
        CHECK_MSG(results_equal(c, &fused, &plain), "%s: the fused program's values differ from the unfused", what);
        if (ln_run(c, &v, dt, deft_cpu(), NULL, &cpu)) compare_result(what, c, &fused, &cpu, 2 * ref_tol(dt));
        ln_result_free(&cpu);
    }
    ln_result_free(&fused);
    ln_result_free(&plain);
    ln_values_free(&v);
}

static void test_residual(void) {
    static const ln_case cases[] = {
        {3, {2, 32, 768}, 1, 1, 1e-5, 1, DEFT_F32}, {2, {9, 7}, 1, 1, 1e-5, 1, DEFT_F32},
        {2, {40, 1600}, 1, 0, 1e-5, 1, DEFT_F32},
        {2, {40, 768}, 0, 0, 1e-5, 1, DEFT_F32},   /* no weight or bias: ln_grad_add */
    };
    static const deft_dtype dts[3] = {DEFT_F32, DEFT_F16, DEFT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 3; d++) {
            ln_case c = cases[i];
            c.b2_dtype = dts[d];
            residual_case(&c, dts[d]);
        }
    /* autocast's shape of it: an f32 stream plus a bf16 (or f16) value cast up, the cast folded in */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ln_case c = cases[i];
        c.b2_dtype = i == 1 ? DEFT_F16 : DEFT_BF16;
        residual_case(&c, DEFT_F32);
    }
}

/* The groups the fusion pass forms for the block, and that the weight gradient gives the same bits twice. */
static void test_groups(void) {
    if (GPU.type != DEFT_CUDA) return;
    const int64_t shape[2] = {64, 768}, cols = 768;
    deft_graph *g = deft_graph_new();
    deft_tensor *a = deft_param(g, "a", DEFT_F32, 2, shape, GPU, DEFT_INIT_XAVIER);
    deft_tensor *b = deft_param(g, "b", DEFT_BF16, 2, shape, GPU, DEFT_INIT_XAVIER);
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 1, &cols, GPU, DEFT_INIT_XAVIER);
    deft_tensor *cast = deft_cast(b, DEFT_F32), *s = deft_add(a, cast), *y = deft_layer_norm(s, w, NULL, 1e-5);
    deft_tensor *h = deft_add(s, deft_tanh(y));
    deft_tensor *loss = deft_sum(deft_mul(h, h), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[3] = {loss, deft_grad(a), deft_grad(w)};
    /* Kept, y is the layer norm these nodes are: made again in the backward pass (the cheap recomputations), its
     * gradient and the add after it would be the program's copies, grouped as these are, but not these nodes. */
    deft_program *p = deft_compile(g, outs, 3, &(deft_compile_options){.no_cheap_recompute = 1});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        const deft_tensor *members[4] = {cast, s, y, outs[1]};
        /* dx's add joins dx and the weight gradient (tests/cuda_test_layer_norm_sums.c) */
        static const char *const kinds[4] = {"ln_add", "ln_add", "ln_add", "ln_grad_sums"};
        for (int i = 0; i < 4; i++) {
            deft_testing_node_plan np;
            deft_testing_program_node_plan(p, members[i], &np);
            CHECK_MSG(np.group_kind && strcmp(np.group_kind, kinds[i]) == 0, "%s: group %s, want %s",
                      deft_tensor_name(members[i]), np.group_kind ? np.group_kind : "none", kinds[i]);
        }
        double *dw[2];
        for (int r = 0; r < 2; r++) {
            CHECK_OK(deft_program_run(p));
            dw[r] = ln_read(p, outs[2]);
        }
        CHECK_MSG(dw[0] && dw[1] && memcmp(dw[0], dw[1], (size_t)cols * sizeof(double)) == 0,
                  "the weight gradient differs between two runs");
        free(dw[0]), free(dw[1]);
    }
    deft_graph_free(g);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return 77;
    test_against_reference();
    test_residual();
    test_groups();
    return deft_check_finish();
}
