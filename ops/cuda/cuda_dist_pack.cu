/* Data parallel's packed buckets (dist/dist_program.c): a bucket of many small gradients is copied into one
 * contiguous buffer, all-reduced by one NCCL call and copied back, since NCCL runs a group of small all-reduces below
 * its bandwidth.
 *
 * The table goes by value (a captured graph keeps it); each row of blocks (blockIdx.y) copies one gradient, 16 bytes
 * at a time when both sides are aligned for it, a byte at a time otherwise and for the tail. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include "cuda_tuning.h"

struct deft_pack_args {
    char *tensor[DEFT_PACK_MAX];
    size_t offset[DEFT_PACK_MAX];
    size_t bytes[DEFT_PACK_MAX];
};

__global__ void deft_k_dist_pack(const deft_pack_args a, char *packed, bool unpack) {
    const int t = blockIdx.y;
    char *const at = packed + a.offset[t];
    const char *src = unpack ? at : a.tensor[t];
    char *dst = unpack ? a.tensor[t] : at;
    const size_t bytes = a.bytes[t];
    size_t done = 0;
    if (deft_is_aligned(src, 16) && deft_is_aligned(dst, 16)) {
        done = bytes / 16 * 16;
        for (int64_t i = deft_tid(); i < (int64_t)(bytes / 16); i += deft_nthreads())
            reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
    }
    for (int64_t i = (int64_t)done + deft_tid(); i < (int64_t)bytes; i += deft_nthreads()) dst[i] = src[i];
}

deft_status deft_cuda_dist_pack(void *const *tensors, const size_t *offsets, const size_t *bytes, int n, void *packed,
                                int unpack, void *stream) {
    for (int first = 0; first < n; first += DEFT_PACK_MAX) {
        const int rows = n - first < DEFT_PACK_MAX ? n - first : DEFT_PACK_MAX;
        deft_pack_args a = {};
        size_t most = 0;
        for (int i = 0; i < rows; i++) {
            a.tensor[i] = (char *)tensors[first + i];
            a.offset[i] = offsets[first + i];
            a.bytes[i] = bytes[first + i];
            if (a.bytes[i] > most) most = a.bytes[i];
        }
        /* A few blocks per gradient (at most DEFT_PACK_BLOCKS_MAX, cuda_tuning.h): the largest sets the width, the
         * small ones' extra blocks leave at once. */
        unsigned x = deft_cuda_blocks((int64_t)(most / 16) + 1, DEFT_CUDA_THREADS);
        if (x > DEFT_PACK_BLOCKS_MAX) x = DEFT_PACK_BLOCKS_MAX;
        deft_k_dist_pack<<<dim3(x, (unsigned)rows), DEFT_CUDA_THREADS, 0, (cudaStream_t)stream>>>(a, (char *)packed,
                                                                                                 unpack != 0);
        cudaError_t e = deft_cuda_launch_error();
        if (e != cudaSuccess)
            return deft_set_error(DEFT_ERR_RUNTIME, "cuda data parallel (%s kernel): %s", unpack ? "unpack" : "pack",
                                  cudaGetErrorString(e));
    }
    return DEFT_OK;
}
