/* The CUDA backend's entry point, callable from C. Declared in every build; defined only when CUDA is built. */
#ifndef DEFT_CUDA_KERNELS_H
#define DEFT_CUDA_KERNELS_H

#include "graph_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a program asks kernels to run (bits of `flags`). */
#define DEFT_CUDA_ALLOW_TF32 1u      /* f32 matmuls may use TF32 tensor cores (compile option `tf32`) */
#define DEFT_CUDA_DETERMINISTIC 2u   /* only cuDNN algorithms that give the same bits every run (`deterministic`) */

/* Runs node n on the current CUDA device, enqueued on `stream` (a cudaStream_t; NULL for the legacy stream).
 * Pointers are device pointers with the same contract as deft_cpu_run_node. Returns a status carrying the CUDA or
 * cuBLAS error string on failure. */
deft_status deft_cuda_run_node(const deft_tensor *n, void *out, const void *const *in, void *stream, unsigned flags);

/* Batch norm node n (DEFT_OP_BATCH_NORM) followed by the add of `residual` (n's shape and dtype, contiguous; NULL for
 * none) and a ReLU (relu != 0), stored once in `out`: each step rounded as its own kernel would round it, so the
 * result is that of the three kernels bit for bit. Runs a fused group of runtime/fusion_norm.c. */
deft_status deft_cuda_batch_norm_epilogue(const deft_tensor *n, void *out, const void *const *in, const void *residual,
                                          int relu, void *stream);

/* Batch norm's backward node n (DEFT_OP_BATCH_NORM_WEIGHT_GRAD or DEFT_OP_BATCH_NORM_GRAD) reading, in place of its
 * dy, the gradient of a ReLU: in[0] is that ReLU's incoming gradient and relu_out its output, masked on load as the
 * act_grad kernel masks them (the same values bit for bit); the other inputs as n's own step passes them. Runs a
 * fused group of runtime/fusion_norm_grad.c. */
deft_status deft_cuda_batch_norm_grad_masked(const deft_tensor *n, void *out, const void *const *in,
                                             const void *relu_out, void *stream);

/* Casts casts[0..n) (DEFT_OP_CAST nodes of one source and one destination dtype) in one launch: in[i] the source of
 * casts[i], out[i] its value; the same values as n separate casts. Runs a fused group of runtime/fusion_casts.c. */
#define DEFT_CASTS_MAX 24   /* casts per launch: a fused group's members (DEFT_FUSED_MAX_OPS) */
deft_status deft_cuda_casts_run(const deft_tensor *const *casts, void *const *out, const void *const *in, int n,
                                void *stream);

/* DEFT_CUBLAS_WORKSPACE_BYTES and DEFT_CUDNN_WORKSPACE_BYTES: the scratch a stream's cuBLAS and cuDNN calls get
 * from the caching allocator (shown in memory footprints). */
#include "cuda_workspace.h"

#ifdef __cplusplus
}
#endif
#endif
