/* The entry points of the image ops on CUDA (C++ only, not installed), which cuda_dispatch.cu calls:
 * cuda_conv.cu (conv2d and its gradients through cuDNN), cuda_pool.cu (max, average and adaptive average pooling
 * and their gradients) and cuda_norm.cu (batch norm). Each mirrors its CPU kernel in ops/cpu (cpu_conv.c,
 * cpu_pool.c, cpu_norm.c): same operands in the same order, same semantics. */
#ifndef DEFT_CUDA_IMAGE_CUH
#define DEFT_CUDA_IMAGE_CUH

#include "cuda_common.cuh"

/* Algorithms that need more than the cap of the stream's cuDNN scratch (DEFT_CUDNN_WORKSPACE_BYTES on a main
 * stream, cuda_workspace.h) are not chosen; the scratch holds what the chosen ones ask for. */

/* DEFT_OP_CONV2D (in: x, w[, bias]), DEFT_OP_CONV2D_INPUT_GRAD (in: dy, w) and DEFT_OP_CONV2D_WEIGHT_GRAD
 * (in: dy, x). flags: DEFT_CUDA_ALLOW_TF32 lets f32 use TF32 tensor cores. */
deft_status deft_cuda_conv2d(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st, unsigned flags);
/* The pooling ops and their gradients (in: x, or dy[, x] for the gradients). */
deft_status deft_cuda_pool2d(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st);
/* DEFT_OP_BN_STATS, DEFT_OP_BATCH_NORM, DEFT_OP_BATCH_NORM_GRAD, DEFT_OP_BATCH_NORM_WEIGHT_GRAD. */
deft_status deft_cuda_batch_norm(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st);

#endif
