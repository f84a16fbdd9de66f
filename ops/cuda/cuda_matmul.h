/* Matrix products with fused epilogues on CUDA (cuBLASLt), callable from C: what the program's fusion pass
 * (passes/fusion.c) launches when a matmul node is followed by a bias add (and an activation), or when a bias
 * gradient (a sum over the rows of a matmul operand) can be computed by the product that reads that operand.
 * Defined in ops/cuda/cuda_matmul_lt.cu; declared in every build. */
#ifndef DEFT_CUDA_MATMUL_H
#define DEFT_CUDA_MATMUL_H

#include "graph_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum deft_mm_epilogue_kind {
    DEFT_MM_EPI_NONE = 0,
    DEFT_MM_EPI_BIAS,        /* out[m, n] = (a b)[m, n] + bias[n] */
    DEFT_MM_EPI_BIAS_RELU,   /* out[m, n] = max((a b)[m, n] + bias[n], 0) */
    DEFT_MM_EPI_BGRAD_B      /* out = a b as usual, and bias_grad[n] = sum over k of op(b)[k, n] */
} deft_mm_epilogue_kind;

typedef struct deft_mm_epilogue {
    deft_mm_epilogue_kind kind;
    const void *bias;   /* BIAS, BIAS_RELU: N elements of the output's dtype */
    void *bias_grad;    /* BGRAD_B: receives N elements of the output's dtype */
} deft_mm_epilogue;

/* Whether deft_cuda_matmul_fused can run `mm` (a DEFT_OP_MATMUL node) with this epilogue kind: a 2-d b, and a 2-d a
 * or (NONE, BIAS, BIAS_RELU) an untransposed a of more dims, whose stacked rows make one 2-d product (a linear layer
 * on [B, T, C]; the bias is over the last dim); on a CUDA device, in f32, f16 or bf16, with every dimension (a's rows
 * all together) below 2^31. NONE, BIAS and BIAS_RELU take any transposes of 2-d operands; BGRAD_B only 2-d operands
 * and an untransposed b (cuBLASLt's BGRADA, which computes it, needs transa = N).
 * TF32 changes nothing here. The fusion pass asks before rewriting the graph, so it never plans a fusion that would
 * fail at run time; where cuBLASLt has no algorithm for an accepted shape, the call still succeeds (the product
 * and separate epilogue kernels run instead). */
int deft_cuda_matmul_fusable(const deft_tensor *mm, deft_mm_epilogue_kind kind, unsigned flags);

/* Runs `mm` (operands a and b, device pointers) with the epilogue, on `stream` (a cudaStream_t), on the current
 * device. flags: the DEFT_CUDA_* bits of cuda_kernels.h (DEFT_CUDA_ALLOW_TF32). Capturable into a CUDA Graph; the
 * algorithm choice is cached per shape at its first run outside a capture (a shape first met inside a capture runs
 * the product and separate epilogue kernels). DEFT_ERR_INVALID when the kind is not fusable for mm. */
deft_status deft_cuda_matmul_fused(const deft_tensor *mm, void *out, const void *a, const void *b,
                                   const deft_mm_epilogue *ep, void *stream, unsigned flags);

/* ---- batches: products of one shape that the program runs together (passes/fusion_batch.c) ---- */
#define DEFT_MM_BATCH_MAX 12

typedef struct deft_mm_part {
    const deft_tensor *mm;   /* the DEFT_OP_MATMUL node */
    void *out;
    const void *a, *b;
    void *bias_grad;         /* NULL, or receives the sum over k of op(b)[k, n] (as DEFT_MM_EPI_BGRAD_B) */
} deft_mm_part;

/* Whether mm can join a batch led by `first`: both 2-d CUDA products deft_cuda_matmul_fusable takes, of one device,
 * dtype, shape and transposes. */
int deft_cuda_matmul_batchable(const deft_tensor *first, const deft_tensor *mm);

/* Runs the n parts (1 .. DEFT_MM_BATCH_MAX, each batchable with the first; a bias gradient only where b is not
 * transposed) on `stream`: one cuBLASLt call over arrays of pointers, and one launch for every bias gradient; where
 * cuBLASLt has no algorithm (or under DEFT_DEBUG_MATMUL_REFERENCE), each part as deft_cuda_matmul_fused would run
 * it. Capturable as deft_cuda_matmul_fused is. DEFT_ERR_INVALID for parts that cannot be batched together. */
deft_status deft_cuda_matmul_batch(const deft_mm_part *parts, int n, void *stream, unsigned flags);

/* Of the product problems met so far in the process under the compile option matmul_find (DEFT_CUDA_MATMUL_FIND):
 * how many were chosen by timing cuBLASLt's candidates, and how many kept the heuristic's first because the call
 * that first could settle them could not be timed (it accumulates into its output, or its output overlaps an
 * operand) or none of the candidates ran. Problems with a single candidate count in neither. */
void deft_cuda_matmul_find_counts(int64_t *timed, int64_t *kept);

#ifdef __cplusplus
}
#endif
#endif
