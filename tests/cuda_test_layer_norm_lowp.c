/* Layer norm on cuda:0 with its value in bf16 or f16 from f32 x (autocast's form: ir/autocast_layer_norm.c), and its
 * fast kernels against the plain ones (debug knob LN_REFERENCE):
 *   - tests/ln_lowp.h's pre-norm block under bf16 and f16 autocast, at a small shape and at GPT-2's width: the loss
 *     and every gradient the same bits as the f32 layer norms cast down (LN_WIDE), activation bytes lower by the f32
 *     values, the f32 nodes not computed, the residual add fused with the layer norm (ln_add) either way; and the GPU's
 *     loss and gradients close to the CPU's;
 *   - the forward held in registers and dx against the plain kernels: the same bits (the same additions in the same
 *     order); the weight and bias gradients' strip kernel against the plain column sums within the dtype's tolerance
 *     (another order), and the same bits on a second run; over f32, f16, bf16 and f64, rows on and off the 16-byte
 *     vectors, rows longer than the registers hold, more rows than the row blocks.
 * Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it on the CPU (the group check stands down). */
#include <math.h>

#include "ln_lowp.h"
#include "layer_norm_run.h"

static deft_device GPU;
static uint64_t rng = 0x9e11b0ull;

static double *f32_doubles(const void *raw, size_t bytes) {
    const size_t n = bytes / 4;
    double *d = malloc((n ? n : 1) * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = ref_load(raw, DEFT_F32, (int64_t)i);
    return d;
}

static void test_block(void) {
    static const int64_t shapes[2][3] = {{2, 8, 64}, {4, 64, 768}};
    static const deft_dtype dts[2] = {DEFT_BF16, DEFT_F16};
    for (int si = 0; si < 2; si++)
        for (int di = 0; di < 2; di++) {
            lnl_run gpu, cpu;
            lnl_check(GPU, shapes[si], dts[di], &gpu);
            if (GPU.type == DEFT_CUDA)
                CHECK_MSG(gpu.s_group && strcmp(gpu.s_group, "ln_add") == 0, "%s: s in group %s, want ln_add",
                          deft_dtype_name(dts[di]), gpu.s_group ? gpu.s_group : "none");
            if (lnl_step(deft_cpu(), shapes[si], dts[di], 0, 0, &cpu) && gpu.grads[0]) {
                char what[64];
                snprintf(what, sizeof what, "%s block: gpu against cpu", deft_dtype_name(dts[di]));
                const double gl = gpu.loss, cl = cpu.loss;
                ref_close_tol(what, &gl, &cl, 1, 2e-2);
                for (int i = 0; i < LNL_PARAMS; i++) {
                    double *g = f32_doubles(gpu.grads[i], gpu.grad_bytes[i]), *c = f32_doubles(cpu.grads[i],
                                                                                             cpu.grad_bytes[i]);
                    ref_close_tol(what, g, c, (int64_t)(gpu.grad_bytes[i] / 4), 5e-2);
                    free(g), free(c);
                }
            }
            lnl_free(&gpu);
            lnl_free(&cpu);
        }
}

static int same(const double *a, const double *b, int64_t n) { return a && b && !memcmp(a, b, (size_t)n * 8); }

/* One case with the fast kernels and with the plain ones. */
static void fast_case(const ln_case *c, deft_dtype dt) {
    ln_values v = ln_random(&rng, c, dt);
    ln_result fast = {0}, again = {0}, plain = {0};
    const int64_t n = ln_numel(c), cols = ln_cols(c);
    char what[160];
    snprintf(what, sizeof what, "%s [%lld] of %lld%s", deft_dtype_name(dt), (long long)cols, (long long)n,
             c->residual ? " residual" : "");
    CHECK_OK(deft_testing_set_debug("LN_REFERENCE", 1));
    const int ok_plain = ln_run(c, &v, dt, GPU, NULL, &plain);
    CHECK_OK(deft_testing_set_debug("LN_REFERENCE", 0));
    if (ok_plain && ln_run(c, &v, dt, GPU, NULL, &fast) && ln_run(c, &v, dt, GPU, NULL, &again)) {
        CHECK_MSG(same(fast.y, plain.y, n), "%s: the forward's value differs from the plain kernel's", what);
        CHECK_MSG(same(fast.dx, plain.dx, n), "%s: dx differs from the plain kernels'", what);
        if (c->residual) CHECK_MSG(same(fast.s, plain.s, n), "%s: s differs from the plain kernel's", what);
        char part[200];
        if (c->weight) {
            snprintf(part, sizeof part, "%s: dw, strip against plain sums", what);
            ref_close_tol(part, fast.dw, plain.dw, cols, ref_tol(dt));
            CHECK_MSG(same(fast.dw, again.dw, cols), "%s: dw differs between two runs", what);
        }
        if (c->bias) {
            snprintf(part, sizeof part, "%s: db, strip against plain sums", what);
            ref_close_tol(part, fast.db, plain.db, cols, ref_tol(dt));
            CHECK_MSG(same(fast.db, again.db, cols), "%s: db differs between two runs", what);
        }
    }
    ln_result_free(&fast), ln_result_free(&again), ln_result_free(&plain);
    ln_values_free(&v);
}

static void test_fast_kernels(void) {
    static const ln_case cases[] = {
        {3, {8, 128, 768}, 1, 1, 1e-5, 0, DEFT_F32},   /* 1024 rows: 256 row blocks of 4 */
        {2, {300, 768}, 1, 0, 1e-5, 0, DEFT_F32},      {2, {33, 1600}, 0, 1, 1e-3, 0, DEFT_F32},
        {2, {3, 5000}, 1, 1, 1e-5, 0, DEFT_F32},       /* longer than the registers hold */
        {2, {65, 40}, 1, 1, 1e-5, 0, DEFT_F32},        {2, {9, 7}, 1, 1, 1e-5, 0, DEFT_F32},
        {2, {70, 96}, 1, 1, 1e-5, 1, DEFT_F32},        {3, {2, 32, 768}, 1, 1, 1e-5, 1, DEFT_BF16},
        {2, {8192, 768}, 1, 1, 1e-5, 0, DEFT_F32},     /* GPT-2's B 8, T 1024 rows: 256 blocks of 32 */
        {2, {64, 771}, 1, 1, 1e-5, 0, DEFT_F32},       /* an odd width: element by element */
    };
    static const deft_dtype dts[4] = {DEFT_F32, DEFT_F16, DEFT_BF16, DEFT_F64};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 4; d++) {
            ln_case c = cases[i];
            if (c.residual && d == 3) continue;
            if (c.residual && c.b2_dtype != DEFT_F32) {
                if (dts[d] != DEFT_F32) continue;   /* autocast's stream: f32 plus a bf16 value cast up */
            } else {
                c.b2_dtype = dts[d];
            }
            fast_case(&c, dts[d]);
        }
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return 77;
    test_block();
    test_fast_kernels();
    return deft_check_finish();
}
