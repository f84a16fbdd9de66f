/* Layer norm's dx and weight gradient fused on cuda:0 (group ln_grad_sums: passes/fusion_layer_norm.c, the kernel in
 * ops/cuda/cuda_layer_norm.cu): loss = sum(layer_norm(x) * r), and the pre-norm residual block (s = a + b,
 * y = layer_norm(s), h = s + tanh(y), loss = sum(h * r), whose dx is added to the residual gradient in the same
 * kernel), from tests/layer_norm_run.h. For each case:
 *   - the group forms: the layer_norm_grad and layer_norm_weight_grad nodes of the compiled graph are in an
 *     ln_grad_sums group (with the residual gradient's add in the residual block), none without weight and bias;
 *   - every value but the weight and bias gradients (y, dx or the add, s, b's gradient) equals the no_fusion
 *     program's bit for bit;
 *   - the weight and bias gradients equal a second program's bit for bit (a fixed order), the no_fusion program's
 *     within the dtype's tolerance and also bit for bit (the fused kernel adds in the strip kernel's order), the
 *     plain kernels' (debug knob LN_REFERENCE) within the tolerance, and the float64 reference (plain cases);
 * in f32, f16 and bf16, and autocast's f32 x with a bf16 value and dy, at C = 768, 1600 and odd C (the kernels'
 * fallback), rows fewer and more than the weight gradient's row blocks and not a multiple of a block's warps. Skips
 * (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it on the CPU (the group checks then stand down). */
#include "check.h"
#include "ref.h"
#include "layer_norm_run.h"

static uint64_t rng = 0x5e11a7f0c3ull;
static deft_device GPU;

typedef struct group_seen {
    int dx, wg, add;   /* layer_norm_grad, layer_norm_weight_grad and add nodes in ln_grad_sums groups */
} group_seen;

/* The layer norm's value dtype (DEFT_F32: x's) beside a case of layer_norm_run.h. */
typedef struct sums_case {
    ln_case c;
    deft_dtype value;
} sums_case;

static void count_groups(deft_program *p, deft_tensor *const *outs, int n, void *ctx) {
    (void)outs, (void)n;
    group_seen *seen = ctx;
    deft_graph *g = deft_testing_program_graph(p);
    for (int id = 0;; id++) {
        const deft_tensor *t = deft_testing_node(g, id);
        if (!t) break;
        const int dx = deft_testing_is_op(t, "layer_norm_grad"), wg = deft_testing_is_op(t, "layer_norm_weight_grad");
        const int add = deft_testing_is_op(t, "add");
        if (!dx && !wg && !add) continue;
        deft_testing_node_plan np;
        deft_testing_program_node_plan(p, t, &np);
        if (!np.group_kind || strcmp(np.group_kind, "ln_grad_sums") != 0) continue;
        seen->dx += dx, seen->wg += wg, seen->add += add;
    }
}

static int bits_equal(const double *a, const double *b, int64_t n) {
    return a && b && memcmp(a, b, (size_t)n * sizeof(double)) == 0;
}

/* The values other than the weight and bias gradients, bit for bit. */
static void check_values_equal(const char *what, const ln_case *c, const ln_result *got, const ln_result *want) {
    const int64_t n = ln_numel(c);
    const double *g[4] = {got->y, got->dx, got->s, got->db2}, *w[4] = {want->y, want->dx, want->s, want->db2};
    static const char *const names[4] = {"y", "dx", "s", "db2"};
    for (int i = 0; i < 4; i++)
        if (w[i]) CHECK_MSG(bits_equal(g[i], w[i], n), "%s: %s differs from the unfused program's", what, names[i]);
}

/* The weight and bias gradients: bit for bit when `bits`, and within tol. */
static void check_sums(const char *what, const char *against, const ln_case *c, const ln_result *got,
                       const ln_result *want, int bits, double tol) {
    const int64_t cols = ln_cols(c);
    const double *g[2] = {got->dw, got->db}, *w[2] = {want->dw, want->db};
    static const char *const names[2] = {"dw", "db"};
    char part[240];
    for (int i = 0; i < 2; i++) {
        if (!(i == 0 ? c->weight : c->bias)) continue;
        CHECK_MSG(g[i] && w[i], "%s: %s missing", what, names[i]);
        if (!g[i] || !w[i]) continue;
        if (bits) CHECK_MSG(bits_equal(g[i], w[i], cols), "%s: %s differs from %s", what, names[i], against);
        snprintf(part, sizeof part, "%s: %s against %s", what, names[i], against);
        ref_close_tol(part, g[i], w[i], cols, tol);
    }
}

static void check_groups(const char *what, const ln_case *c, const group_seen *seen) {
    if (GPU.type != DEFT_CUDA) return;
    const int want = c->weight || c->bias;
    CHECK_MSG(seen->dx == want && seen->wg == want, "%s: %d dx and %d weight gradient nodes in ln_grad_sums, want %d",
              what, seen->dx, seen->wg, want);
    CHECK_MSG(seen->add == (want && c->residual), "%s: %d adds in ln_grad_sums, want %d", what, seen->add,
              want && c->residual);
}

static void run_case(const sums_case *sc, deft_dtype dt) {
    const ln_case *c = &sc->c;
    const deft_dtype value = sc->value;
    ln_values v = ln_random(&rng, c, dt);
    ln_result fused = {0}, again = {0}, plain = {0}, slow = {0}, want = {0};
    const deft_compile_options unfused = {.no_fusion = 1};
    group_seen seen = {0};
    char what[200];
    snprintf(what, sizeof what, "%s%s (value %s) [%lld] of %lld w %d b %d", c->residual ? "residual " : "",
             deft_dtype_name(dt), deft_dtype_name(value != DEFT_F32 ? value : dt), (long long)ln_cols(c),
             (long long)ln_numel(c), c->weight, c->bias);
    /* bf16 and f16 gradients summed over thousands of rows: a few of their units apart on different orders */
    const double tol = (dt == DEFT_F32 && value == DEFT_F32 ? 1 : 2) * ref_tol(dt);
    if (ln_run_with(c, &v, dt, value, GPU, NULL, &fused, count_groups, &seen) &&
        ln_run_with(c, &v, dt, value, GPU, NULL, &again, NULL, NULL) &&
        ln_run_with(c, &v, dt, value, GPU, &unfused, &plain, NULL, NULL)) {
        check_groups(what, c, &seen);
        check_values_equal(what, c, &fused, &plain);
        check_sums(what, "a second program", c, &fused, &again, 1, tol);
        check_sums(what, "the unfused program", c, &fused, &plain, 1, tol);
        CHECK_OK(deft_testing_set_debug("LN_REFERENCE", 1));
        if (ln_run_with(c, &v, dt, value, GPU, NULL, &slow, NULL, NULL)) {
            CHECK_MSG(bits_equal(fused.dx, slow.dx, ln_numel(c)), "%s: dx differs from the plain kernels'", what);
            check_sums(what, "the plain kernels (LN_REFERENCE)", c, &fused, &slow, 0, tol);
        }
        CHECK_OK(deft_testing_set_debug("LN_REFERENCE", 0));
        if (!c->residual && value == DEFT_F32) {
            ln_reference(c, &v, &want);
            ref_close_tol(what, fused.dx, want.dx, ln_numel(c), ref_tol(dt));
            check_sums(what, "the float64 reference", c, &fused, &want, 0, tol);
        }
    }
    ln_result_free(&fused), ln_result_free(&again), ln_result_free(&plain), ln_result_free(&slow);
    ln_result_free(&want);
    ln_values_free(&v);
}

#define F32 DEFT_F32
#define BF16 DEFT_BF16
#define F16 DEFT_F16

/* A plain layer norm's backward: dx is the program's output (stored), the group has no add. */
static void test_plain(void) {
    static const sums_case cases[] = {
        {{2, {4096, 768}, 1, 1, 1e-5, 0, F32}, F32}, {{3, {4, 250, 1600}, 1, 1, 1e-5, 0, F32}, F32},
        {{2, {1000, 771}, 1, 1, 1e-5, 0, F32}, F32}, {{2, {100, 768}, 1, 0, 1e-5, 0, F32}, F32},
        {{2, {2051, 512}, 0, 1, 1e-3, 0, F32}, F32}, {{2, {64, 40}, 0, 0, 1e-5, 0, F32}, F32},
    };
    static const deft_dtype dts[3] = {F32, BF16, F16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 3; d++) run_case(&cases[i], dts[d]);
}

/* The pre-norm residual block: dx added to the residual gradient in the kernel, dx never stored. */
static void test_residual(void) {
    static const sums_case cases[] = {
        {{3, {4, 1024, 768}, 1, 1, 1e-5, 1, F32}, F32}, {{2, {1000, 1600}, 1, 1, 1e-5, 1, F32}, F32},
        {{2, {333, 771}, 1, 0, 1e-5, 1, F32}, F32},
    };
    static const deft_dtype dts[2] = {F32, BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 2; d++) {
            sums_case c = cases[i];
            c.c.b2_dtype = dts[d];
            run_case(&c, dts[d]);
        }
}

/* Autocast's shapes (GPT-2 under bf16 autocast): f32 x and stream, the layer norm's value and dy in bf16 (f16 once),
 * the residual stream's other operand a bf16 value cast up. */
static void test_autocast(void) {
    static const sums_case cases[] = {
        {{3, {4, 1024, 768}, 1, 1, 1e-5, 1, BF16}, BF16}, {{2, {2048, 768}, 1, 1, 1e-5, 0, F32}, BF16},
        {{2, {1000, 1600}, 1, 1, 1e-5, 1, BF16}, BF16},   {{2, {777, 771}, 1, 1, 1e-5, 1, BF16}, BF16},
        {{2, {513, 768}, 1, 1, 1e-5, 1, F16}, F16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], F32);
}

/* h = x + layer_norm(x), loss = sum(h h): the residual gradient the add reads is dy itself (2 h), whose buffer the
 * add's value may take over; the weight gradient must still read dy as it was. Fused against no_fusion: bits. */
static void aliased_case(int64_t rows, int64_t cols) {
    const int64_t shape[2] = {rows, cols};
    double *got[2][3] = {{NULL}};
    for (int run = 0; run < 2; run++) {
        deft_graph *g = deft_graph_new();
        uint64_t seed = 0xa11a5ull + (uint64_t)cols;
        ref_tensor xv = ref_random(&seed, DEFT_F32, 2, shape, -2.0, 3.0);
        ref_tensor wv = ref_random(&seed, DEFT_F32, 1, &cols, 0.5, 1.5);
        deft_tensor *x = ln_param(g, "x", &xv, GPU), *w = ln_param(g, "w", &wv, GPU), *b = NULL;
        b = deft_param(g, "b", DEFT_F32, 1, &cols, GPU, DEFT_INIT_ZEROS);
        deft_tensor *h = deft_add(x, deft_layer_norm(x, w, b, 1e-5));
        deft_tensor *loss = deft_sum(deft_mul(h, h), 0, NULL, 0);
        CHECK_OK(deft_backward(loss));
        deft_tensor *outs[4] = {loss, deft_grad(x), deft_grad(w), deft_grad(b)};
        deft_program *p = deft_compile(g, outs, 4, run ? &(deft_compile_options){.no_fusion = 1} : NULL);
        CHECK_MSG(p != NULL, "aliased [%lld, %lld] compile: %s", (long long)rows, (long long)cols, deft_errmsg());
        if (p) {
            group_seen seen = {0};
            if (run == 0) count_groups(p, outs, 4, &seen);
            if (run == 0 && GPU.type == DEFT_CUDA)
                CHECK_MSG(seen.dx == 1 && seen.wg == 1 && seen.add == 1, "aliased [%lld]: %d dx, %d weight gradient "
                          "and %d add nodes in ln_grad_sums, want 1 each", (long long)cols, seen.dx, seen.wg, seen.add);
            CHECK_OK(deft_program_run(p));
            for (int k = 0; k < 3; k++) got[run][k] = ln_read(p, outs[k + 1]);
        }
        ref_free(&xv), ref_free(&wv);
        deft_graph_free(g);
    }
    static const char *const names[3] = {"dx", "dw", "db"};
    for (int k = 0; k < 3; k++) {
        CHECK_MSG(bits_equal(got[0][k], got[1][k], k ? cols : rows * cols),
                  "aliased [%lld, %lld]: %s differs from the unfused program's", (long long)rows, (long long)cols,
                  names[k]);
        free(got[0][k]), free(got[1][k]);
    }
}

static void test_aliased(void) {
    aliased_case(1024, 768);   /* the fused kernel */
    aliased_case(500, 771);    /* odd C: the two kernels */
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return 77;
    test_plain();
    test_residual();
    test_autocast();
    test_aliased();
    return deft_check_finish();
}
