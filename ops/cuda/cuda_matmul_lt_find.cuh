/* Timing cuBLASLt's candidate algorithms for one product (the compile option matmul_find): what cuda_matmul_lt.cu
 * asks of cuda_matmul_lt_find.cu (C++ only, not installed). The caller decides which call may be timed and where the
 * workspace comes from; this only runs the candidates on the stream and measures them. */
#ifndef DEFT_CUDA_MATMUL_LT_FIND_CUH
#define DEFT_CUDA_MATMUL_LT_FIND_CUH

#include <cublasLt.h>

#include "cuda_common.cuh"

/* One product as cublasLtMatmul takes it, with beta 0 (D written whole, C = D): its descriptors (the bias pointer,
 * if any, already set on desc), its operands (cuBLASLt's A and B) and its stream. */
typedef struct deft_lt_find_problem {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    const void *A, *B;
    void *D;
    cudaStream_t st;
} deft_lt_find_problem;

/* Runs each of the n algorithms whose workspace need fits `room` bytes (the block at ws) on p: one warm-up run, then
 * timed runs between two events, and sets *best to the index of the one of least time (-1 where none ran). The stream
 * is synchronised. A candidate cuBLASLt refuses, or whose launch fails with an error CUDA does not keep, is skipped;
 * an error the stream or the context keeps (a kernel's fault), or an event's failure, is returned as a status. */
deft_status deft_lt_time_candidates(const deft_lt_find_problem &p, const cublasLtMatmulAlgo_t *algo,
                                    const size_t *ws_need, int n, void *ws, size_t room, int *best);

#endif
