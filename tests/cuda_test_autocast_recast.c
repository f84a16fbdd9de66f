/* Autocast recasts its inputs where the backward pass reads them, on cuda:0 (tests/amp_recast.h; the CPU's version
 * is test_autocast_recast.c):
 *  1. bf16, and f16 with loss scaling, replayed as CUDA Graphs: losses and weights bit-identical to the program that
 *     keeps x's cast, and the report counts the one recast value;
 *  2. the same with fusion off (each node its own kernel), and with two checkpoint segments;
 *  3. the conv net (cuDNN, NCHW and NHWC) recasting x: losses bit-identical to keeping its cast.
 * Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0. */
#include "amp_recast.h"

static deft_device GPU;

static void test_variant(const deft_compile_options *o, const char *what) {
    rc_trace ref;
    rc_reference(GPU, o, &ref);
    deft_checkpoint_report r;
    rc_check_same(GPU, o, &ref, what, &r);
    CHECK_MSG(r.dropped >= 1 && r.recomputed >= 1, "%s: %d dropped, %d recomputed", what, r.dropped, r.recomputed);
    printf("%s: bit-identical over %d steps; %d dropped, peak %zu bytes, %zu keeping everything\n", what, RC_STEPS,
           r.dropped, r.peak_bytes, r.peak_bytes_without);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    rc_check_no_policy(GPU, DEFT_BF16);
    rc_check_no_policy(GPU, DEFT_F16);
    test_variant(&(deft_compile_options){.autocast = DEFT_BF16, .no_fusion = 1}, "bf16, no fusion");
    test_variant(&(deft_compile_options){.autocast = DEFT_F16, .no_cuda_graphs = 1}, "f16, eager");
    test_variant(&(deft_compile_options){.autocast = DEFT_BF16, .checkpoint = DEFT_CHECKPOINT_SEGMENTS,
                                         .checkpoint_segments = 2},
                 "bf16, two segments");
    /* cuDNN reads x's bf16 cast itself: one recomputation (the CPU standing in widens it too: two) */
    const int want = GPU.type == DEFT_CPU ? 2 : 1;
    CHECK(rc_check_conv(GPU, DEFT_NCHW) == want);
    CHECK(rc_check_conv(GPU, DEFT_NHWC) == want);
    return deft_check_finish();
}
