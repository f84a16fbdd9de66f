/* Optimizer in backward on cuda:0 (fusion and CUDA Graph replays on): a deep MLP stepped by SGD with momentum and by
 * AdamW, compiled with and without optimizer_in_backward, side by side over six runs (the first eager, the rest
 * replays of a captured graph): losses, step norms, parameters, optimizer state and update counts bit for bit equal
 * after every run (the pieces run the one-launch step's per-element formulas with the same coefficients and add the
 * same block sums in the same order). Also with activation checkpointing (segments) and with CUDA Graphs off; and
 * the plan of the split program: its lower bound drops by at least the gradients less the two largest, less the
 * activations the backward pass keeps. Both programs compile on one GPU with the same shapes, so cuBLASLt is expected
 * to choose the same algorithms for both: a loss that differs already at run 0 points at the matmuls, not at the
 * step (DEFT_MATMUL_REFERENCE=1 tells them apart).
 * Skips (exit 77) where no GPU works. DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0. */
#define _POSIX_C_SOURCE 200809L
#include "obwd_net.h"

static deft_device GPU;

static void test_bit_identical(void) {
    obwd_spec s = {.depth = 8, .batch = 64, .width = 512, .classes = 10, .adamw = 0, .device = GPU};
    obwd_spec a = s;
    a.adamw = 1;
    CHECK(obwd_compare(&s, NULL, 6, "sgd") == 6);
    CHECK(obwd_compare(&a, NULL, 6, "adamw") == 6);
    const deft_compile_options eager = {.no_cuda_graphs = 1};
    CHECK(obwd_compare(&s, &eager, 3, "sgd, eager") == 3);
    const deft_compile_options ck = {.checkpoint = DEFT_CHECKPOINT_SEGMENTS, .checkpoint_segments = 3};
    CHECK(obwd_compare(&s, &ck, 4, "sgd, checkpoint segments") == 4);
    CHECK(obwd_compare(&a, &ck, 4, "adamw, checkpoint segments") == 4);
    /* Many small parameters: more norm blocks than threads in the finisher's block. */
    obwd_spec many = {.depth = 300, .batch = 8, .width = 16, .classes = 4, .adamw = 1, .device = GPU};
    CHECK(obwd_compare(&many, NULL, 3, "adamw, 301 layers") == 3);
    /* Models under 64K parameters: the whole step is one thread block looping over the norm blocks (fewer, then
     * more of them than its threads), which must add the same sums in the same order as the finisher. */
    obwd_spec tiny = {.depth = 2, .batch = 8, .width = 4, .classes = 2, .adamw = 0, .device = GPU};
    CHECK(obwd_compare(&tiny, NULL, 4, "sgd, parameters of at most 32 elements") == 4);   /* one warp */
    tiny.adamw = 1;
    CHECK(obwd_compare(&tiny, NULL, 4, "adamw, parameters of at most 32 elements") == 4);
    obwd_spec few = {.depth = 4, .batch = 8, .width = 16, .classes = 4, .adamw = 1, .device = GPU};
    CHECK(obwd_compare(&few, NULL, 4, "adamw, 5 small layers") == 4);   /* at most 16 blocks: side by side */
    obwd_spec small = {.depth = 40, .batch = 8, .width = 16, .classes = 4, .adamw = 0, .device = GPU};
    CHECK(obwd_compare(&small, NULL, 4, "sgd, 41 small layers") == 4);
    obwd_spec small_many = {.depth = 200, .batch = 8, .width = 12, .classes = 4, .adamw = 1, .device = GPU};
    CHECK(obwd_compare(&small_many, NULL, 4, "adamw, 201 small layers") == 4);
}

static void test_plan(void) {
    obwd_spec s = {.depth = 16, .batch = 32, .width = 1024, .classes = 10, .device = GPU};
    obwd_net n;
    if (!obwd_build(&n, &s)) return;
    deft_program *whole = obwd_compile(&n, NULL);
    deft_program *split = obwd_compile(&n, &(deft_compile_options){.optimizer_in_backward = 1});
    CHECK_MSG(whole && split, "compile: %s", deft_errmsg());
    deft_memory_report rw, rs;
    if (whole && split) {
        CHECK_OK(deft_program_memory(whole, &rw));
        CHECK_OK(deft_program_memory(split, &rs));
        size_t grads = 0, largest2 = 0, a = 0, b = 0;
        for (int i = 0; i < deft_testing_optimizer_param_count(n.opt); i++) {
            const size_t bytes = deft_tensor_nbytes(deft_testing_optimizer_param(n.opt, i));
            grads += bytes;
            if (bytes > a) {
                b = a;
                a = bytes;
            } else if (bytes > b) {
                b = bytes;
            }
        }
        largest2 = a + b;
        const size_t acts = (size_t)(2 * s.depth + 2) * (size_t)(s.batch * s.width) * sizeof(float);
        printf("lower bound %zu -> %zu bytes, arena %zu -> %zu bytes (gradients %zu)\n", rw.lower_bound_bytes,
               rs.lower_bound_bytes, rw.arena_bytes, rs.arena_bytes, grads);
        CHECK(rs.lower_bound_bytes + grads <= rw.lower_bound_bytes + largest2 + acts);
        CHECK(rs.persistent_bytes == rw.persistent_bytes);
        float l, norm;
        CHECK(obwd_run(&n, split, 0, &l, &norm) && isfinite(norm));
        CHECK(obwd_run(&n, split, 1, &l, &norm) && isfinite(norm));
        CHECK(deft_optimizer_updates(n.opt) == 2);
    }
    obwd_free(&n);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    test_bit_identical();
    test_plan();
    return deft_check_finish();
}
