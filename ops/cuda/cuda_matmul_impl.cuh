/* What the two matmul files share (C++ only, not installed): cuda_matmul.cu holds the shape analysis, the device
 * workspace and the reference path (cublasGemmEx); cuda_matmul_lt.cu the cuBLASLt path (plain products and fused
 * epilogues), which falls back to the reference where cuBLASLt has no algorithm. */
#ifndef DEFT_CUDA_MATMUL_IMPL_CUH
#define DEFT_CUDA_MATMUL_IMPL_CUH

#include <cublas_v2.h>

#include "cuda_common.cuh"

#define DEFT_CUBLAS_MAX_DEVICES 64

/* One product's shape: row-major out[..., M, N] = op(a)[..., M, K] op(b)[..., K, N]. */
typedef struct deft_mm {
    int ta, tb;
    int64_t M, N, K;
    int nbatch;                                      /* output batch dims */
    int64_t bshape[DEFT_MAX_DIMS];                   /* output batch shape */
    int64_t sa[DEFT_MAX_DIMS], sb[DEFT_MAX_DIMS];    /* batch strides of a and b in matrices (0: broadcast) */
    int64_t batch, a_mats, b_mats;                   /* output matrices; matrices stored in a and in b */
} deft_mm;

deft_status deft_mm_make(const deft_tensor *n, deft_mm *s);
deft_status deft_cublas_error(const char *what, cublasStatus_t s);

/* The current device's index, checked against DEFT_CUBLAS_MAX_DEVICES. */
deft_status deft_matmul_device(int *dev);

/* Whether the debug knob DEFT_DEBUG_MATMUL_REFERENCE sends every product down the reference path (cuda_matmul.cu). */
bool deft_matmul_reference_requested(void);

/* The reference path: cublasGemmEx / cublasGemmStridedBatchedEx, f32 never TF32 (cuda_matmul.cu). */
deft_status deft_cuda_matmul_reference(const deft_tensor *n, const deft_mm &s, void *out, const void *a,
                                       const void *b, cudaStream_t st);

/* The plain product through cuBLASLt when its shape is one cuBLASLt takes (2-d, foldable or uniformly strided
 * batches; f32, f16, bf16) and it has an algorithm for it: *done = true. Otherwise nothing runs and *done = false,
 * and the caller takes the reference path. */
deft_status deft_cuda_matmul_lt_plain(const deft_tensor *n, const deft_mm &s, void *out, const void *a,
                                      const void *b, cudaStream_t st, unsigned flags, bool *done);

/* A plain product of row-major matrices for other ops built on products (cuda_conv_gemm.cu): out[M, N] =
 * op(a)[M, K] op(b)[K, N], or out += that, with a and b of `dtype` and out of out_dtype (dtype, or f32 for halves
 * summed across several calls); ld of each is its stored row length. */
typedef struct deft_lt_gemm {
    deft_dtype dtype, out_dtype;
    int ta, tb;
    int64_t M, N, K;
    const void *a, *b;
    void *out;
    bool accumulate;
} deft_lt_gemm;

/* Runs g through cuBLASLt (TF32 for f32 where flags allow): *done = false, nothing queued, where it cannot (no
 * algorithm, a problem first met inside a capture, a shape past int). dry: only choose and report whether it
 * would run, so that a caller can commit to a series of products before queuing the first. */
deft_status deft_cuda_gemm_lt(const deft_lt_gemm &g, cudaStream_t st, unsigned flags, bool dry, bool *done);

/* count products of g's shape (its a, b and out unused) as one cuBLASLt pointer-array batch: a[i], b[i] and out[i]
 * are device pointers (DEFT_MM_BATCH_MAX at most). *done = false, nothing queued, where cuBLASLt cannot run it (the
 * caller then runs them one by one). */
deft_status deft_cuda_gemm_lt_batch(const deft_lt_gemm &g, const void *const *a, const void *const *b,
                                    void *const *out, int count, cudaStream_t st, unsigned flags, bool *done);

#endif
