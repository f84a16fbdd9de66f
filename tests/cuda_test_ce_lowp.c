/* Cross-entropy on f16 / bf16 logits on a GPU (tests/ce_lowp.h):
 *  1. the logits read directly with an f32 loss give the loss bits and the gradient bits of the logits cast to f32
 *     first, on the GPU, over ignore index, label smoothing, mean and sum, 2-D and N-D, through both kernels (a warp
 *     per row below 1024 classes; a block per row from there, rows on 16 bytes or not);
 *  2. the direct path on the GPU against the CPU: the loss within 1e-5 relative (the kernels sum in other orders),
 *     the gradient within the dtype's tolerance.
 * Skips (exit 77) without a GPU; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in (to check the test). */
#include "ce_lowp.h"

static void test_against_cpu(deft_device gpu) {
    static const deft_dtype dts[] = {DEFT_BF16, DEFT_F16};
    uint64_t rng = 0x5eed77ull;
    for (size_t ci = 0; ci < sizeof ce_lowp_cases / sizeof ce_lowp_cases[0]; ci++)
        for (int di = 0; di < 2; di++) {
            const ce_lowp_case *c = &ce_lowp_cases[ci];
            ref_tensor x, t;
            ce_lowp_inputs(c, dts[di], &rng, &x, &t);
            uint16_t *gg = calloc((size_t)x.n, 2), *gc = calloc((size_t)x.n, 2);
            double *dg = calloc((size_t)x.n, sizeof *dg), *dc = calloc((size_t)x.n, sizeof *dc);
            float lg = NAN, lc = NAN;
            if (ce_lowp_run(gpu, c, &x, &t, 1, &lg, gg) && ce_lowp_run(deft_cpu(), c, &x, &t, 1, &lc, gc)) {
                CHECK_MSG(fabs((double)lg - (double)lc) <= 1e-5 * (1.0 + fabs((double)lc)),
                          "%s %s: gpu loss %.9g, cpu %.9g", c->name, deft_dtype_name(x.dt), lg, lc);
                for (int64_t i = 0; i < x.n; i++) {
                    dg[i] = ref_load(gg, x.dt, i);
                    dc[i] = ref_load(gc, x.dt, i);
                }
                char what[160];
                snprintf(what, sizeof what, "%.100s %s: gradient", c->name, deft_dtype_name(x.dt));
                ref_close_tol(what, dg, dc, x.n, ref_tol(x.dt));
            }
            free(gg), free(gc), free(dg), free(dc);
            ref_free(&x), ref_free(&t);
        }
}

int main(void) {
    deft_device gpu;
    if (!deft_test_gpu(&gpu)) return DEFT_CHECK_SKIP;
    ce_lowp_check_bits(gpu, "cuda");
    test_against_cpu(gpu);
    return deft_check_finish();
}
