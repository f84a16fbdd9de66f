/* Products too small or too thin for cuBLAS(Lt) to do well, with the epilogues of cuda_matmul.h in the same launch:
 *  - f32 products of a few warps (a linear layer of a handful of units, such as Linear(10, 1) on a batch of 32).
 *    cuBLASLt spends a launch on the product and another on a bias gradient, each costing more than the arithmetic
 *    here; in a step of a few kernels replayed from a CUDA Graph those launches are the step's time.
 *  - products with a side of at most 16 (a classifier's layer and its gradients), below. cuBLASLt runs the mid MLP's
 *    f32 classifier (256 x 10 x 1024) and its gradients in six launches (split K, its reduction, a separate bias
 *    gradient), which took longer than these kernels (bench/RESULTS.md, "Figures formerly in code comments").
 * One warp per output element, its lanes splitting K (partial sums, then a fixed shuffle tree: the same value on
 * every run), or for halves with K <= 32 one thread per output summing in k order. Accumulated in f32. */
#include "cuda_matmul_small.cuh"
#include "cuda_tuning.h"

/* The bounds are cuda_tuning.h's: DEFT_SMALL_WARPS_PER_BLOCK warps a block; the largest f32 product (M * N * K
 * multiply-adds) and K taken here, DEFT_SMALL_MAX_MACS and DEFT_SMALL_MAX_K; K up to which one thread computes an
 * output alone (no lanes to split K over), DEFT_SMALL_THREAD_K. Products with a side of at most DEFT_SKINNY_SIDE (a
 * classifier of 10 classes, or its gradients, where K is the 10) and up to DEFT_SKINNY_MAX_MACS are taken too:
 * cuBLAS(Lt) has no aligned kernel for a leading dimension of 10 halves (20 bytes) and falls back to slower ones
 * (bench/RESULTS.md, "Sixth round"). */

__device__ __forceinline__ float deft_warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The epilogue of one output: the bias is added and the ReLU applied to the rounded product exactly as the
 * separate bias kernel does, so a fused and an unfused program give the same outputs. */
template <class T> __device__ __forceinline__ T deft_small_finish(float acc, const T *bias, int64_t n, int relu) {
    if (!bias) return deft_ty<T>::store(acc);
    float v = deft_ty<T>::load(deft_ty<T>::store(acc)) + deft_ty<T>::load(bias[n]);
    if (relu && v < 0.0f) v = 0.0f;   /* NaN stays NaN, as relu does */
    return deft_ty<T>::store(v);
}

/* Warps 0 .. M*N-1 compute out[m, n]; with a bias gradient, warps M*N .. M*N+N-1 sum column n of op(b). */
template <class T>
__global__ void deft_k_matmul_small(T *out, const T *a, const T *b, int64_t M, int64_t N, int64_t K, int ta, int tb,
                                    const T *bias, int relu, T *bias_grad) {
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp < M * N) {
        const int64_t m = warp / N, n = warp % N;
        float acc = 0.0f;
        for (int64_t k = lane; k < K; k += 32)
            acc += deft_ty<T>::load(a[ta ? k * M + m : m * K + k]) * deft_ty<T>::load(b[tb ? n * K + k : k * N + n]);
        acc = deft_warp_sum(acc);
        if (lane == 0) out[m * N + n] = deft_small_finish<T>(acc, bias, n, relu);
    } else if (bias_grad && warp < M * N + N) {
        const int64_t n = warp - M * N;
        float acc = 0.0f;
        for (int64_t k = lane; k < K; k += 32) acc += deft_ty<T>::load(b[tb ? n * K + k : k * N + n]);
        acc = deft_warp_sum(acc);
        if (lane == 0) bias_grad[n] = deft_ty<T>::store(acc);
    }
}

/* Short K: threads 0 .. M*N-1 each compute out[m, n] alone, in k order; threads M*N .. M*N+N-1 the bias gradient. */
template <class T>
__global__ void deft_k_matmul_short_k(T *out, const T *a, const T *b, int64_t M, int64_t N, int64_t K, int ta,
                                      int tb, const T *bias, int relu, T *bias_grad) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M * N) {
        const int64_t m = i / N, n = i % N;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++)
            acc += deft_ty<T>::load(a[ta ? k * M + m : m * K + k]) * deft_ty<T>::load(b[tb ? n * K + k : k * N + n]);
        out[i] = deft_small_finish<T>(acc, bias, n, relu);
    } else if (bias_grad && i < M * N + N) {
        const int64_t n = i - M * N;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) acc += deft_ty<T>::load(b[tb ? n * K + k : k * N + n]);
        bias_grad[n] = deft_ty<T>::store(acc);
    }
}

/* out[M, N] = a^T b for a stored [K, M] and b [K, N], N at most DEFT_SKINNY_SIDE (a classifier's weight gradient,
 * x^T dy). A block takes DEFT_THIN_COLS columns m of a: thread t takes column t mod DEFT_THIN_COLS over rows k = s,
 * s + S, ... for its slice s = t / DEFT_THIN_COLS of the S = DEFT_THIN_SLICES slices, so each group's loads of a
 * are one 32-byte sector and its loads of b's row a broadcast, keeping N sums; then the slices' sums are added in
 * slice order and the epilogue applied as deft_small_finish does. The warp-per-output kernel strided its loads of a
 * by M and was slower than cuBLASLt there; 32 columns a block made too few blocks (bench/RESULTS.md, "Figures
 * formerly in code comments"). With a bias gradient, one more block sums b's columns, a warp a column.
 * DEFT_THIN_THREADS and DEFT_THIN_COLS are cuda_tuning.h's. */
#define DEFT_THIN_SLICES (DEFT_THIN_THREADS / DEFT_THIN_COLS)
template <class T>
__global__ void __launch_bounds__(DEFT_THIN_THREADS)
    deft_k_matmul_thin_at(T *out, const T *a, const T *b, int64_t M, int N, int64_t K, const T *bias, int relu,
                          T *bias_grad) {
    __shared__ float part[DEFT_THIN_SLICES][DEFT_SKINNY_SIDE][DEFT_THIN_COLS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t col_blocks = (M + DEFT_THIN_COLS - 1) / DEFT_THIN_COLS;
    if (blockIdx.x == col_blocks) {   /* the bias gradient's block */
        for (int n = w; n < N; n += DEFT_THIN_THREADS / 32) {
            float acc = 0.0f;
            for (int64_t k = lane; k < K; k += 32) acc += deft_ty<T>::load(b[k * N + n]);
            acc = deft_warp_sum(acc);
            if (lane == 0) bias_grad[n] = deft_ty<T>::store(acc);
        }
        return;
    }
    const int c = threadIdx.x % DEFT_THIN_COLS, slice = threadIdx.x / DEFT_THIN_COLS;
    const int64_t m = (int64_t)blockIdx.x * DEFT_THIN_COLS + c;
    float acc[DEFT_SKINNY_SIDE];
#pragma unroll
    for (int n = 0; n < DEFT_SKINNY_SIDE; n++) acc[n] = 0.0f;
    for (int64_t k = slice; m < M && k < K; k += DEFT_THIN_SLICES) {
        const float av = deft_ty<T>::load(a[k * M + m]);
#pragma unroll
        for (int n = 0; n < DEFT_SKINNY_SIDE; n++)
            if (n < N) acc[n] += av * deft_ty<T>::load(b[k * N + n]);
    }
#pragma unroll
    for (int n = 0; n < DEFT_SKINNY_SIDE; n++) part[slice][n][c] = acc[n];
    __syncthreads();
    const int t = threadIdx.x, oc = t % DEFT_THIN_COLS, on = t / DEFT_THIN_COLS;
    const int64_t om = (int64_t)blockIdx.x * DEFT_THIN_COLS + oc;
    if (on >= N || om >= M) return;
    float sum = 0.0f;
    for (int v = 0; v < DEFT_THIN_SLICES; v++) sum += part[v][on][oc];
    out[om * N + on] = deft_small_finish<T>(sum, bias, on, relu);
}

/* The rows of the product: a batch sharing b, stacked plainly, folds into M. */
static int64_t deft_small_rows(const deft_mm &s, bool *ok) {
    const bool folded = s.b_mats == 1 && !s.ta && s.a_mats == s.batch;
    *ok = folded || s.batch == 1;
    return folded ? s.batch * s.M : s.M;
}

bool deft_matmul_small_fits(const deft_tensor *n, const deft_mm &s) {
    bool ok = false;
    const int64_t M = deft_small_rows(s, &ok);
    if (!ok || M <= 0 || s.N <= 0 || s.K <= 0 || s.K > DEFT_SMALL_MAX_K) return false;
    if (n->dtype == DEFT_F32 && M <= DEFT_SMALL_MAX_MACS && M * s.N <= DEFT_SMALL_MAX_MACS / s.K) return true;
    if (n->dtype != DEFT_F32 && n->dtype != DEFT_F16 && n->dtype != DEFT_BF16) return false;
    const bool skinny = M <= DEFT_SKINNY_SIDE || s.N <= DEFT_SKINNY_SIDE || s.K <= DEFT_SKINNY_SIDE;
    /* f32 with a read transposed: only the classifier's weight gradient, which deft_k_matmul_thin_at takes. */
    if (n->dtype == DEFT_F32 && s.ta && (s.tb || s.N > DEFT_SKINNY_SIDE)) return false;
    return skinny && M <= DEFT_SKINNY_MAX_MACS && M * s.N <= DEFT_SKINNY_MAX_MACS / s.K;
}

template <class T>
static void deft_small_launch(const deft_mm &s, int64_t M, void *out, const void *a, const void *b,
                              const deft_mm_epilogue *ep, cudaStream_t st) {
    const bool grad = ep && ep->kind == DEFT_MM_EPI_BGRAD_B;
    const bool add_bias = ep && (ep->kind == DEFT_MM_EPI_BIAS || ep->kind == DEFT_MM_EPI_BIAS_RELU);
    const T *bias = add_bias ? (const T *)ep->bias : NULL;
    T *bias_grad = grad ? (T *)ep->bias_grad : NULL;
    const int relu = ep && ep->kind == DEFT_MM_EPI_BIAS_RELU;
    const int64_t items = M * s.N + (grad ? s.N : 0);
    /* The tiny f32 products keep one warp per output at every K, and their sums stay as they were. */
    const bool tiny = sizeof(T) == 4 && M * s.N <= DEFT_SMALL_MAX_MACS / s.K;
    if (sizeof(T) == 4 && !tiny && s.ta && !s.tb && s.N <= DEFT_SKINNY_SIDE) {
        const unsigned blocks = (unsigned)((M + DEFT_THIN_COLS - 1) / DEFT_THIN_COLS + (grad ? 1 : 0));
        deft_k_matmul_thin_at<T><<<blocks, DEFT_THIN_THREADS, 0, st>>>((T *)out, (const T *)a, (const T *)b, M,
                                                                          (int)s.N, s.K, bias, relu, bias_grad);
        return;
    }
    if (s.K <= DEFT_SMALL_THREAD_K && !tiny) {
        deft_k_matmul_short_k<T><<<deft_cuda_blocks(items, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            (T *)out, (const T *)a, (const T *)b, M, s.N, s.K, s.ta, s.tb, bias, relu, bias_grad);
        return;
    }
    const int threads = 32 * DEFT_SMALL_WARPS_PER_BLOCK;
    const unsigned blocks = (unsigned)((items + DEFT_SMALL_WARPS_PER_BLOCK - 1) / DEFT_SMALL_WARPS_PER_BLOCK);
    deft_k_matmul_small<T><<<blocks, threads, 0, st>>>((T *)out, (const T *)a, (const T *)b, M, s.N, s.K, s.ta,
                                                       s.tb, bias, relu, bias_grad);
}

deft_status deft_cuda_matmul_small(const deft_tensor *n, const deft_mm &s, void *out, const void *a, const void *b,
                                   const deft_mm_epilogue *ep, cudaStream_t st) {
    bool ok = false;
    const int64_t M = deft_small_rows(s, &ok);
    (void)ok;
    if (n->dtype == DEFT_F32) deft_small_launch<float>(s, M, out, a, b, ep, st);
    else if (n->dtype == DEFT_F16) deft_small_launch<__half>(s, M, out, a, b, ep, st);
    else deft_small_launch<__nv_bfloat16>(s, M, out, a, b, ep, st);
    return deft_cuda_check_launch(n, "matmul (small)");
}
