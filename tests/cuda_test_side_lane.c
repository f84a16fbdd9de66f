/* The side lane on cuda:0 (passes/side_lane.h):
 *  1. a deep MLP under TF32, whose weight gradients are big enough to leave the main stream, trained side by side
 *     with the same net compiled with no_side_lane (every step on one stream): losses, step norms, parameters,
 *     optimizer state and update counts bit for bit equal after every run, replayed as CUDA Graphs, eager, with SGD
 *     and AdamW;
 *  2. a convolution net (tests/amp_conv_net.h) at batch 4096, whose two 3x3 convolutions' weight gradients leave the
 *     main stream, the same way (deterministic algorithms on both sides): every loss and the shared weight equal;
 *  3. the plan marks exactly the layers' weight-gradient products under TF32; none in f32 without TF32 or in bf16
 *     (measured slower beside each other), where the products are small, with no_side_lane or with
 *     optimizer_in_backward; the side lane keeps its inputs alive, so its arena is at least the one-stream arena.
 * Skips (exit 77) where no GPU works. DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0, where no
 * step leaves the main stream. */
#define _POSIX_C_SOURCE 200809L
#include "amp_conv_net.h"
#include "deft_testing.h"
#include "obwd_net.h"

static deft_device GPU;

/* Every program here is compiled with no_product_batches: the MLPs' weight gradients would otherwise run as one batch
 * at the end of the backward pass, beside nothing. */

/* A GPU program marks the side steps; the CPU standing in for one has none. */
static int expected_side(int on_gpu_count) { return GPU.type == DEFT_CUDA ? on_gpu_count : 0; }

static void test_same_bits(void) {
    obwd_spec s = {.depth = 4, .batch = 256, .width = 512, .classes = 10, .device = GPU};
    obwd_spec a = s;
    a.adamw = 1;
    const deft_compile_options tf32 = {.tf32 = 1, .no_product_batches = 1},
                               eager = {.tf32 = 1, .no_cuda_graphs = 1, .no_product_batches = 1};
    CHECK(obwd_compare_programs(&s, &tf32, &tf32, 1, 6, "sgd, graphs") == 6);
    CHECK(obwd_compare_programs(&a, &tf32, &tf32, 1, 6, "adamw, graphs") == 6);
    CHECK(obwd_compare_programs(&s, &eager, &eager, 1, 3, "sgd, eager") == 3);
}

static void test_conv_same_bits(void) {
    amp_conv_net a, b;
    const int64_t batch = 4096;
    if (!acn_build(&a, GPU, batch, DEFT_NHWC) || !acn_build(&b, GPU, batch, DEFT_NHWC)) return;
    const deft_compile_options o = {.deterministic = 1, .no_product_batches = 1},
                               one_stream = {.deterministic = 1, .no_product_batches = 1, .no_side_lane = 1};
    deft_program *pa = acn_compile(&a, &o);
    deft_program *pb = acn_compile(&b, &one_stream);
    CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
    if (pa && pb) {
        CHECK_MSG(deft_program_side_steps(pa) == expected_side(2) && deft_program_side_steps(pb) == 0,
                  "side steps %d and %d", deft_program_side_steps(pa), deft_program_side_steps(pb));
        acn_check_same_bits(&a, pa, &b, pb, 5, "conv net, side lane against one stream");
    }
    acn_free(&a);
    acn_free(&b);
}

/* The footprint's scratch before the first run, at the caps (after it, what the chosen algorithms asked for:
 * cuda_test_workspace.c): the main stream's cuBLAS cap, and the side lane's smaller one when it has steps. */
static void check_workspaces(deft_program *p, int side) {
    deft_device_footprint fp[2];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 2, &n));
    const size_t want = GPU.type != DEFT_CUDA ? 0
                                              : DEFT_CUBLAS_WORKSPACE_BYTES + (side ? DEFT_CUBLAS_SIDE_WORKSPACE_BYTES : 0);
    CHECK_MSG(n == 1 && fp[0].workspace_bytes == want, "workspace %zu, expected %zu",
              n == 1 ? fp[0].workspace_bytes : 0, want);
}

static int side_steps_of(const obwd_spec *s, const deft_compile_options *o, int one_stream, size_t *arena) {
    obwd_net n;
    if (!obwd_build(&n, s)) return -1;
    deft_program *p = obwd_compile_without(&n, o, one_stream ? OBWD_NO_SIDE_LANE : OBWD_ALL_ON);
    int side = -1;
    if (p) {
        side = deft_program_side_steps(p);
        check_workspaces(p, side);
        deft_memory_report r;
        CHECK_OK(deft_program_memory(p, &r));
        if (arena) *arena = r.arena_bytes;
        float l, norm;
        CHECK(obwd_run(&n, p, 0, &l, &norm) && isfinite(l) && isfinite(norm));
    }
    obwd_free(&n);
    return side;
}

static void test_plan(void) {
    const obwd_spec big = {.depth = 4, .batch = 256, .width = 512, .classes = 10, .device = GPU};
    const obwd_spec small = {.depth = 4, .batch = 64, .width = 256, .classes = 10, .device = GPU};
    const deft_compile_options none = {.no_product_batches = 1}, tf32 = {.tf32 = 1, .no_product_batches = 1},
                               bf16 = {.autocast = DEFT_BF16, .tf32 = 1, .no_product_batches = 1};
    const deft_compile_options obwd = {.optimizer_in_backward = 1, .tf32 = 1, .no_product_batches = 1};
    size_t with = 0, without = 0;
    /* fc0..fc3's weight gradients: 2 * 256 * 512 * 512 flops each; the head's (512 x 10) is too small. */
    CHECK(side_steps_of(&big, &tf32, 0, &with) == expected_side(big.depth));
    CHECK(side_steps_of(&big, &tf32, 1, &without) == 0);
    CHECK_MSG(with >= without, "arena with the side lane %zu, without %zu", with, without);
    CHECK(side_steps_of(&big, &none, 0, NULL) == 0);
    CHECK(side_steps_of(&big, &bf16, 0, NULL) == 0);
    CHECK(side_steps_of(&small, &tf32, 0, NULL) == 0);
    CHECK(side_steps_of(&big, &obwd, 0, NULL) == 0);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_plan();
    test_same_bits();
    test_conv_same_bits();
    return deft_check_finish();
}
