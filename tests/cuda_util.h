/* What the cuda tests that call the CUDA runtime themselves share: a checked call, and a host clock for the
 * timeouts of tests that hold a stream still. Include after check.h and cuda_runtime_api.h. */
#ifndef DEFT_TEST_CUDA_UTIL_H
#define DEFT_TEST_CUDA_UTIL_H

#include <stdlib.h>
#include <time.h>

#define CUDA_OK(expr)                                                                                 \
    do {                                                                                              \
        cudaError_t cuda_e_ = (expr);                                                                 \
        CHECK_MSG(cuda_e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(cuda_e_));              \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Set by scripts/check_gpu_sanitizers.sh to the compute-sanitizer tool the test runs under. */
static inline const char *under_compute_sanitizer(void) { return getenv("DEFT_TEST_COMPUTE_SANITIZER"); }

#endif
