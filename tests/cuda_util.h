/* What the cuda tests that call the CUDA runtime themselves share: a checked call, a host clock for the timeouts of
 * tests that hold a stream still, and (after ref.h) device buffers filled with NaN and read back as doubles. Include
 * after check.h and cuda_runtime_api.h. */
#ifndef DEFT_TEST_CUDA_UTIL_H
#define DEFT_TEST_CUDA_UTIL_H

#include <stdlib.h>
#include <time.h>

#define CUDA_OK(expr)                                                                                 \
    do {                                                                                              \
        cudaError_t cuda_e_ = (expr);                                                                 \
        CHECK_MSG(cuda_e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(cuda_e_));              \
    } while (0)

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Set by scripts/check_gpu_sanitizers.sh to the compute-sanitizer tool the test runs under. */
static inline const char *under_compute_sanitizer(void) { return getenv("DEFT_TEST_COMPUTE_SANITIZER"); }

#ifdef DEFT_TEST_REF_H
/* bytes of device memory, every byte 0xff: NaN in every float dtype, so what a kernel never writes shows. */
static inline void *dev_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes));
    if (p) CUDA_OK(cudaMemset(p, 0xff, bytes));
    return p;
}

/* n values of dtype dt at byte offset off of a device buffer, as doubles (caller frees). */
static inline double *dev_read(const void *buf, size_t off, deft_dtype dt, int64_t n) {
    void *raw = malloc((size_t)n * deft_dtype_size(dt) + 8);
    double *out = calloc((size_t)n + 1, sizeof *out);
    CUDA_OK(cudaMemcpy(raw, (const char *)buf + off, (size_t)n * deft_dtype_size(dt), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; i++) out[i] = ref_load(raw, dt, i);
    free(raw);
    return out;
}
#endif

#endif
