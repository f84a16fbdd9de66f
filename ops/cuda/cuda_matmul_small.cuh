/* The small-product kernel (cuda_matmul_small.cu), used by both matmul paths before cuBLAS(Lt). */
#ifndef DEFT_CUDA_MATMUL_SMALL_CUH
#define DEFT_CUDA_MATMUL_SMALL_CUH

#include "cuda_matmul.h"
#include "cuda_matmul_impl.cuh"

/* Whether s (the product of node n) is one of the small or thin products cuda_matmul_small.cu takes. */
bool deft_matmul_small_fits(const deft_tensor *n, const deft_mm &s);
/* Runs it, with ep's epilogue (NULL or NONE: the plain product). Only for products deft_matmul_small_fits takes. */
deft_status deft_cuda_matmul_small(const deft_tensor *n, const deft_mm &s, void *out, const void *a, const void *b,
                                   const deft_mm_epilogue *ep, cudaStream_t st);

#endif
