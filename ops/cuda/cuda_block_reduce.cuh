/* Block-wide reductions shared by the reduction kernels (cuda_reduce.cu) and the fused elementwise kernel's
 * reduction (cuda_fused.cu): both must sum in the same order for a fused chain to give the unfused value bit for
 * bit. */
#ifndef DEFT_CUDA_BLOCK_REDUCE_CUH
#define DEFT_CUDA_BLOCK_REDUCE_CUH

#include "cuda_common.cuh"

/* ---- block-wide reduction: warp shuffles, then one warp over the warps' results ---- */
struct deft_r_sum { template <class A> __device__ A operator()(A x, A y) const { return x + y; } };
struct deft_r_max { template <class A> __device__ A operator()(A x, A y) const { return deft_max_nan(x, y); } };

/* Every thread of the block must call it (blockDim.x a multiple of 32); every thread gets the result. */
template <class A, class F> __device__ A deft_block_reduce(A v, F f) {
    __shared__ A warp_part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v = f(v, __shfl_down_sync(0xffffffffu, v, off));
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        /* Lanes past the last warp hold a copy of warp 0's value but are never combined. */
        v = warp_part[lane < nwarps ? lane : 0];
        for (int off = 16; off > 0; off >>= 1) {
            A o = __shfl_down_sync(0xffffffffu, v, off);
            if (lane + off < nwarps) v = f(v, o);
        }
        __syncwarp();   /* every lane has read warp_part before lane 0 writes over its first entry */
        if (lane == 0) warp_part[0] = v;
    }
    __syncthreads();
    A r = warp_part[0];
    __syncthreads();   /* the next call reuses warp_part */
    return r;
}

/* Threads per block for a reduction of `len` elements: whole warps, no more than the work. */
static inline int deft_reduce_threads(int64_t len) {
    int64_t t = (len + 31) / 32 * 32;
    return (int)(t > DEFT_CUDA_THREADS ? DEFT_CUDA_THREADS : t);
}

#endif
