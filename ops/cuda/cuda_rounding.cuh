/* Arithmetic rounded once per operation and never contracted into a fused multiply-add. Kernels that promise the
 * same bits across separate instantiations (a node writing f32 and its twin writing bf16, a plain kernel and its fast
 * one) must not leave it to the compiler to contract each alike. */
#ifndef DEFT_CUDA_ROUNDING_CUH
#define DEFT_CUDA_ROUNDING_CUH

__device__ __forceinline__ float deft_rn_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double deft_rn_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float deft_rn_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double deft_rn_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float deft_rn_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double deft_rn_mul(double a, double b) { return __dmul_rn(a, b); }

#endif
