/* conv2d and its weight gradient as im2col + one cuBLASLt product per chunk of rows, for NHWC convolutions with
 * fewer than 8 input channels (cuda_conv_gemm.cu says why); cuda_conv.cu asks it before cuDNN. C++ only. */
#ifndef DEFT_CUDA_CONV_GEMM_CUH
#define DEFT_CUDA_CONV_GEMM_CUH

#include "cuda_common.cuh"

/* Whether node n (DEFT_OP_CONV2D or DEFT_OP_CONV2D_WEIGHT_GRAD, with input x and weights w) is one this path takes
 * under the program's DEFT_CUDA_* flags: NHWC, one group, f16/bf16 (f32 too with DEFT_CUDA_CONV_GEMM_F32), at most
 * 7 input channels, not turned off by DEFT_CUDA_CONV_GEMM_NEVER. */
bool deft_conv_gemm_takes(const deft_tensor *n, const deft_tensor *x, const deft_tensor *w, unsigned flags);

/* The scratch n would use at most: its padded weights (or f32 gradient sums) and the columns of every row (of a chunk
 * under the debug knob DEFT_DEBUG_CONV_GEMM_ROWS); SIZE_MAX past size_t. What it asks of the stream's cuDNN scratch,
 * which the stream's cap cuts (the rows are then done in chunks). */
size_t deft_conv_gemm_bytes(const deft_tensor *n, const deft_tensor *x, const deft_tensor *w, const deft_tensor *y);

/* Queues n on st: px is x's data; in1 is w's (forward) or dy's (weight gradient); out is n's output; ws and
 * ws_bytes the stream's cuDNN scratch, which holds the columns. *done = false, with nothing queued, where the
 * scratch is too small or cuBLASLt has no product for it: cuDNN then runs the convolution. */
deft_status deft_conv_gemm_run(const deft_tensor *n, const deft_tensor *x, const deft_tensor *w,
                               const deft_tensor *y, const void *px, const void *in1, void *out, void *ws,
                               size_t ws_bytes, cudaStream_t st, unsigned flags, bool *done);

#endif
