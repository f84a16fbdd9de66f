/* What the fused-against-unfused tests share (cuda_test_norm_fusion, cuda_test_norm_grad_fusion): a graph's outputs
 * compiled with fusion on or off, run a few times (eager, captured, replayed) and read back byte for byte. Include
 * after check.h. */
#ifndef DEFT_TEST_FUSION_RUNS_H
#define DEFT_TEST_FUSION_RUNS_H

#include <stdio.h>
#include <stdlib.h>

#include "deft.h"

/* Compiles outs[0..n) of g (no_fusion unless `fusion`), runs it `runs` times and reads each output into a fresh
 * buffer bytes[i] of size[i] bytes (one spare byte, zeroed). The program comes back for the caller to inspect and
 * free; NULL when it did not compile (then nothing was read). */
static inline deft_program *fusion_run_read(deft_graph *g, deft_tensor **outs, int n, int fusion, int runs,
                                            void **bytes, size_t *size) {
    CHECK_MSG(deft_graph_error(g) == DEFT_OK, "build: %s", deft_graph_errmsg(g));
    deft_compile_options co = {0};
    co.no_fusion = !fusion;
    deft_program *p = deft_compile(g, outs, n, &co);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    for (int run = 0; p && run < runs; run++) CHECK_OK(deft_program_run(p));
    for (int i = 0; p && i < n; i++) {
        size[i] = deft_tensor_nbytes(outs[i]);
        bytes[i] = calloc(1, size[i] + 1);
        CHECK_OK(deft_program_read(p, outs[i], bytes[i], size[i]));
    }
    return p;
}

/* The GPU the fusion tests run on, in *gpu; 0 (the test then skips) without one. */
static inline int fusion_gpu(deft_device *gpu) {
    if (!deft_test_gpu(gpu)) return 0;
    if (gpu->type == DEFT_CUDA) return 1;
    printf("fusion runs on GPUs only: skipped\n");
    return 0;
}

#endif
