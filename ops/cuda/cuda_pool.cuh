/* What the pooling files share (C++ only, not installed): cuda_pool.cu holds the entry point and the plain kernels
 * (the reference), cuda_pool_fast.cu the fast ones. */
#ifndef DEFT_CUDA_POOL_CUH
#define DEFT_CUDA_POOL_CUH

#include "cuda_image.cuh"

/* The geometry of one pooling op: x (or dx) [N, C, H, W] and y (or dy) [N, C, OH, OW] in either layout. */
typedef struct deft_pool_geom {
    int64_t N, C, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw;
    int adaptive, max, include_pad, nhwc;
} deft_pool_geom;

/* The fast kernels for a pooling op or its gradient (cuda_pool_fast.cu); *done = false (nothing ran) where the
 * tensors are past their 32-bit indices, and the caller takes the plain path. */
deft_status deft_cuda_pool2d_fast(const deft_tensor *n, const deft_pool_geom &g, bool grad, void *out,
                                  const void *const *in, cudaStream_t st, bool *done);

#endif
