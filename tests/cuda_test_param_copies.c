/* The compile option param_copies on cuda:0 (tests/param_copies_case.h; test_param_copies.c on the CPU): the same
 * cases, the programs replayed as CUDA Graphs, so that the copies written by the optimizer's kernels (the plain,
 * one-launch, direct and split steps) and the refresh after deft_param_set (queued before a replay) are what the
 * next step reads. Skips (exit 77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in. */
#include "param_copies_case.h"

int main(void) {
    deft_device gpu;
    if (!deft_test_gpu(&gpu)) return DEFT_CHECK_SKIP;
    pc_suite(gpu);
    return deft_check_finish();
}
