/* A few assertion macros for plain ctest executables: a failed check prints where and why, and the test exits 1
 * at its end (main returns deft_check_finish()). */
#ifndef DEFT_TEST_CHECK_H
#define DEFT_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deft.h"

static int deft_check_failures = 0;
static int deft_check_count = 0;

#define CHECK(cond)                                                                                   \
    do {                                                                                              \
        deft_check_count++;                                                                           \
        if (!(cond)) {                                                                                \
            deft_check_failures++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                  \
        }                                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                          \
    do {                                                                                              \
        deft_check_count++;                                                                           \
        if (!(cond)) {                                                                                \
            deft_check_failures++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                  \
            fprintf(stderr, __VA_ARGS__);                                                             \
            fputc('\n', stderr);                                                                      \
        }                                                                                             \
    } while (0)

#define CHECK_OK(expr)                                                                                \
    do {                                                                                              \
        deft_status check_s_ = (expr);                                                                \
        CHECK_MSG(check_s_ == DEFT_OK, "%s returned %s: %s", #expr, deft_status_name(check_s_),       \
                  deft_errmsg());                                                                     \
    } while (0)

/* The status must be `want` and the thread's message must contain `needle`. */
#define CHECK_ERR(expr, want, needle)                                                                 \
    do {                                                                                              \
        deft_status check_s_ = (expr);                                                                \
        CHECK_MSG(check_s_ == (want), "%s returned %s, wanted %s (%s)", #expr,                        \
                  deft_status_name(check_s_), deft_status_name(want), deft_errmsg());                 \
        CHECK_MSG(strstr(deft_errmsg(), (needle)) != NULL, "message \"%s\" lacks \"%s\"",             \
                  deft_errmsg(), (needle));                                                           \
    } while (0)

/* A builder must return NULL with a message containing `needle`. */
#define CHECK_NULL_ERR(expr, needle)                                                                  \
    do {                                                                                              \
        const void *check_p_ = (const void *)(expr);                                                  \
        CHECK_MSG(check_p_ == NULL, "%s did not fail", #expr);                                        \
        CHECK_MSG(strstr(deft_errmsg(), (needle)) != NULL, "message \"%s\" lacks \"%s\"",             \
                  deft_errmsg(), (needle));                                                           \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                         \
    do {                                                                                              \
        double check_a_ = (double)(a), check_b_ = (double)(b);                                        \
        CHECK_MSG(fabs(check_a_ - check_b_) <= (tol), "%s = %.9g, %s = %.9g (tol %g)", #a, check_a_,  \
                  #b, check_b_, (double)(tol));                                                       \
    } while (0)

/* The status ctest counts as a skip (SKIP_RETURN_CODE): a cuda test on a machine without a GPU, or built without
 * CUDA. */
#define DEFT_CHECK_SKIP 77

/* 1, after saying so, when no GPU is usable: the cuda test then skips. */
static inline int deft_check_no_gpu(void) {
    if (deft_cuda_device_count() > 0) return 0;
    printf("no GPU: skipped\n");
    return 1;
}
#define SKIP_WITHOUT_GPU()                                                                            \
    do {                                                                                              \
        if (deft_check_no_gpu()) return DEFT_CHECK_SKIP;                                              \
    } while (0)
/* The whole main of a cuda test built without CUDA. */
#define DEFT_CHECK_MAIN_WITHOUT_CUDA                                                                  \
    int main(void) {                                                                                  \
        printf("built without CUDA: skipped\n");                                                      \
        return DEFT_CHECK_SKIP;                                                                       \
    }

/* The device a cuda test runs on: cuda:0, or the CPU standing in for it when DEFT_TEST_GPU_AS_CPU=1 (to check
 * the test itself on a machine without a GPU). 0 when neither: the test then skips (DEFT_CHECK_SKIP). */
static inline int deft_test_gpu(deft_device *out) {
    const char *as_cpu = getenv("DEFT_TEST_GPU_AS_CPU");
    if (as_cpu && strcmp(as_cpu, "1") == 0) {
        *out = deft_cpu();
        printf("DEFT_TEST_GPU_AS_CPU=1: the cpu stands in for cuda:0\n");
        return 1;
    }
    if (deft_check_no_gpu()) return 0;
    *out = deft_cuda(0);
    return 1;
}

/* The end of every test: the caches go back first (deft_memory_release_all), so that leak checkers (valgrind,
 * compute-sanitizer --leak-check full) see only what the test itself kept. */
static inline int deft_check_finish(void) {
    const deft_status released = deft_memory_release_all();
    CHECK_MSG(released == DEFT_OK, "deft_memory_release_all: %s", deft_errmsg());
    if (deft_check_failures) {
        fprintf(stderr, "%d of %d checks failed\n", deft_check_failures, deft_check_count);
        return 1;
    }
    printf("%d checks passed\n", deft_check_count);
    return 0;
}

#endif
