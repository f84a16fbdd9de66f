/* Test-only fault injection for kernel launches: not part of the public API (include/deft.h) and never installed.
 * Tests use it to see how a failed launch surfaces (a status carrying the CUDA error string and the node's name,
 * never an abort) without a GPU that fails on demand. Defined in ops/cuda/cuda_fault.cu, only in CUDA builds. */
#ifndef DEFT_CUDA_FAULT_H
#define DEFT_CUDA_FAULT_H

#ifdef __cplusplus
extern "C" {
#endif

/* The next launch check (deft_cuda_check_launch, ops/cuda/cuda_common.cuh) on any thread reports `cuda_error` (a
 * cudaError_t) as if that launch had failed, once; the kernel itself was queued normally. 0 cancels. */
void deft_cuda_fail_next_launch(int cuda_error);

/* The injected error for the launch being checked, consumed; 0 (cudaSuccess) when none is pending. */
int deft_cuda_take_injected_launch_error(void);

#ifdef __cplusplus
}
#endif
#endif
