/* Products too small to occupy more than a few warps (a linear layer of a handful of units, such as Linear(10, 1)
 * on a batch of 32): one warp per output element, its lanes splitting K, with the epilogues of cuda_matmul.h in
 * the same launch. cuBLASLt spends a launch on the product and another on a bias gradient, each costing more than
 * the arithmetic here; in a step of a few kernels replayed from a CUDA Graph those launches are the step's time.
 *
 * f32 only, accumulated in f32 (lane partial sums, then a fixed shuffle tree: the same value on every run). The
 * bias is added and the ReLU applied to the rounded product exactly as the separate bias kernel does, so a fused
 * and an unfused program give the same outputs. */
#include "cuda_matmul_small.cuh"

#define DEFT_SMALL_WARPS_PER_BLOCK 4

/* Largest product (M * N * K multiply-adds) and K taken here. */
#define DEFT_SMALL_MAX_MACS ((int64_t)1 << 15)
#define DEFT_SMALL_MAX_K 4096

__device__ __forceinline__ float deft_warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Warps 0 .. M*N-1 compute out[m, n]; with a bias gradient, warps M*N .. M*N+N-1 sum column n of op(b). */
__global__ void deft_k_matmul_small(float *out, const float *a, const float *b, int64_t M, int64_t N, int64_t K,
                                    int ta, int tb, const float *bias, int relu, float *bias_grad) {
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp < M * N) {
        const int64_t m = warp / N, n = warp % N;
        float acc = 0.0f;
        for (int64_t k = lane; k < K; k += 32)
            acc += a[ta ? k * M + m : m * K + k] * b[tb ? n * K + k : k * N + n];
        acc = deft_warp_sum(acc);
        if (lane == 0) {
            float v = acc;
            if (bias) {
                v = acc + bias[n];
                if (relu && v < 0.0f) v = 0.0f;   /* NaN stays NaN, as relu does */
            }
            out[m * N + n] = v;
        }
    } else if (bias_grad && warp < M * N + N) {
        const int64_t n = warp - M * N;
        float acc = 0.0f;
        for (int64_t k = lane; k < K; k += 32) acc += b[tb ? n * K + k : k * N + n];
        acc = deft_warp_sum(acc);
        if (lane == 0) bias_grad[n] = acc;
    }
}

bool deft_matmul_small_fits(const deft_tensor *n, const deft_mm &s) {
    if (n->dtype != DEFT_F32 || s.M <= 0 || s.N <= 0 || s.K <= 0 || s.K > DEFT_SMALL_MAX_K) return false;
    const bool folded = s.b_mats == 1 && !s.ta && s.a_mats == s.batch;
    if (!folded && s.batch != 1) return false;
    const int64_t M = folded ? s.batch * s.M : s.M;
    return M <= DEFT_SMALL_MAX_MACS && M * s.N <= DEFT_SMALL_MAX_MACS / s.K;
}

deft_status deft_cuda_matmul_small(const deft_tensor *n, const deft_mm &s, void *out, const void *a, const void *b,
                                   const deft_mm_epilogue *ep, cudaStream_t st) {
    const bool folded = s.b_mats == 1 && !s.ta && s.a_mats == s.batch;
    const int64_t M = folded ? s.batch * s.M : s.M;
    const bool grad = ep && ep->kind == DEFT_MM_EPI_BGRAD_B;
    const bool add_bias = ep && (ep->kind == DEFT_MM_EPI_BIAS || ep->kind == DEFT_MM_EPI_BIAS_RELU);
    const int64_t warps = M * s.N + (grad ? s.N : 0);
    const int threads = 32 * DEFT_SMALL_WARPS_PER_BLOCK;
    const unsigned blocks = (unsigned)((warps + DEFT_SMALL_WARPS_PER_BLOCK - 1) / DEFT_SMALL_WARPS_PER_BLOCK);
    deft_k_matmul_small<<<blocks, threads, 0, st>>>(
        (float *)out, (const float *)a, (const float *)b, M, s.N, s.K, s.ta, s.tb,
        add_bias ? (const float *)ep->bias : NULL, ep && ep->kind == DEFT_MM_EPI_BIAS_RELU,
        grad ? (float *)ep->bias_grad : NULL);
    return deft_cuda_check_launch(n, "matmul (small)");
}
