/* Batches of products of one shape (cuda_matmul.h): the weight gradients of an MLP's layers, each too small to fill a
 * GPU (fewer 128 x 128 output tiles than one wave: cuda_tuning.h), run as one cuBLASLt pointer-array call, which
 * fills it. The bias gradients the single products would compute in their epilogue take one launch of their own,
 * since cuBLASLt offers no bias-gradient epilogue over arrays of pointers. */
#include <string.h>

#include "cuda_matmul.h"
#include "cuda_matmul_impl.cuh"

extern "C" int deft_cuda_matmul_batchable(const deft_tensor *first, const deft_tensor *mm) {
    if (!first || !mm || first->ndim != 2 || mm->ndim != 2 || !deft_cuda_matmul_fusable(first, DEFT_MM_EPI_NONE, 0) ||
        !deft_cuda_matmul_fusable(mm, DEFT_MM_EPI_NONE, 0))
        return 0;   /* 2-d products only: fusable also takes a's stacked rows, which a batch does not */
    const deft_tensor *a0 = first->src[0], *b0 = first->src[1], *a = mm->src[0], *b = mm->src[1];
    return first->dtype == mm->dtype && first->device.index == mm->device.index &&
           first->p.matmul.trans_a == mm->p.matmul.trans_a && first->p.matmul.trans_b == mm->p.matmul.trans_b &&
           a0->shape[0] == a->shape[0] && a0->shape[1] == a->shape[1] && b0->shape[0] == b->shape[0] &&
           b0->shape[1] == b->shape[1];
}

static deft_status deft_batch_check(const deft_mm_part *parts, int n, deft_mm *shape) {
    if (!parts || n < 1 || n > DEFT_MM_BATCH_MAX)
        return deft_set_error(DEFT_ERR_INVALID, "cuda matmul batch: %d products (1 to %d)", n, DEFT_MM_BATCH_MAX);
    for (int i = 0; i < n; i++) {
        const deft_tensor *mm = parts[i].mm;
        if (!mm || !parts[i].out || !parts[i].a || !parts[i].b)
            return deft_set_error(DEFT_ERR_INVALID, "cuda matmul batch: part %d lacks its node or a pointer", i);
        if (!deft_cuda_matmul_batchable(parts[0].mm, mm))
            return deft_set_error(DEFT_ERR_INVALID, "cuda matmul batch: %s cannot be batched with %s", mm->name,
                                  parts[0].mm->name);
        if (parts[i].bias_grad && !deft_cuda_matmul_fusable(mm, DEFT_MM_EPI_BGRAD_B, 0))
            return deft_set_error(DEFT_ERR_INVALID, "cuda matmul batch: %s has a transposed b, no bias gradient",
                                  mm->name);
    }
    return deft_mm_make(parts[0].mm, shape);
}

typedef struct deft_bgrad_table {
    const void *b[DEFT_MM_BATCH_MAX];
    void *grad[DEFT_MM_BATCH_MAX];
} deft_bgrad_table;

/* For part blockIdx.y: grad[n] = the sum of b[k, n] over its K rows. A block takes 32 columns; its 16 rows of
 * threads each sum every 16th row (four rows a load round, for the loads to overlap), and the 16 partial sums are
 * added in row order: a fixed order, the same bits every run. */
#define DEFT_BGRAD_ROWS 16
template <class T>
__global__ void deft_bias_grad_batch_kernel(deft_bgrad_table t, int64_t K, int64_t N) {
    __shared__ float partial[DEFT_BGRAD_ROWS][33];
    const T *b = (const T *)t.b[blockIdx.y];
    const int64_t n = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (n < N) {
        int64_t k = threadIdx.y;
        for (; k + 3 * DEFT_BGRAD_ROWS < K; k += 4 * DEFT_BGRAD_ROWS)
            for (int u = 0; u < 4; u++) sum[u] += deft_ty<T>::load(b[(k + u * DEFT_BGRAD_ROWS) * N + n]);
        for (; k < K; k += DEFT_BGRAD_ROWS) sum[0] += deft_ty<T>::load(b[k * N + n]);
    }
    partial[threadIdx.y][threadIdx.x] = (sum[0] + sum[1]) + (sum[2] + sum[3]);
    __syncthreads();
    if (threadIdx.y != 0 || n >= N) return;
    float total = 0.0f;
    for (int r = 0; r < DEFT_BGRAD_ROWS; r++) total += partial[r][threadIdx.x];
    ((T *)t.grad[blockIdx.y])[n] = deft_ty<T>::store(total);
}

static deft_status deft_bias_grads(const deft_mm_part *parts, int n, const deft_mm &s, cudaStream_t st) {
    deft_bgrad_table t;
    memset(&t, 0, sizeof t);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!parts[i].bias_grad) continue;
        t.b[k] = parts[i].b;
        t.grad[k++] = parts[i].bias_grad;
    }
    if (k == 0) return DEFT_OK;
    const dim3 grid((unsigned)((s.N + 31) / 32), (unsigned)k), block(32, DEFT_BGRAD_ROWS);
    switch (parts[0].mm->dtype) {
    case DEFT_F32: deft_bias_grad_batch_kernel<float><<<grid, block, 0, st>>>(t, s.K, s.N); break;
    case DEFT_F16: deft_bias_grad_batch_kernel<__half><<<grid, block, 0, st>>>(t, s.K, s.N); break;
    default: deft_bias_grad_batch_kernel<__nv_bfloat16><<<grid, block, 0, st>>>(t, s.K, s.N); break;
    }
    return deft_cuda_check_launch(parts[0].mm, "bias gradient batch");
}

/* The batch as one cuBLASLt call: *done = false, nothing queued, where it cannot be. */
static deft_status deft_batch_lt(const deft_mm_part *parts, int n, const deft_mm &s, cudaStream_t st,
                                 unsigned flags, bool *done) {
    *done = false;
    if (n < 2 || deft_matmul_reference_requested()) return DEFT_OK;
    const void *a[DEFT_MM_BATCH_MAX], *b[DEFT_MM_BATCH_MAX];
    void *out[DEFT_MM_BATCH_MAX];
    for (int i = 0; i < n; i++) {
        a[i] = parts[i].a;
        b[i] = parts[i].b;
        out[i] = parts[i].out;
    }
    const deft_dtype dt = parts[0].mm->dtype;
    const deft_lt_gemm g = {dt, dt, s.ta, s.tb, s.M, s.N, s.K, NULL, NULL, NULL, false};
    deft_status r = deft_cuda_gemm_lt_batch(g, a, b, out, n, st, flags, done);
    if (r != DEFT_OK || !*done) return r;
    return deft_bias_grads(parts, n, s, st);
}

extern "C" deft_status deft_cuda_matmul_batch(const deft_mm_part *parts, int n, void *stream, unsigned flags) {
    deft_mm s;
    deft_status r = deft_batch_check(parts, n, &s);
    if (r != DEFT_OK) return r;
    bool done = false;
    if (s.M > 0 && s.N > 0 && s.K > 0) r = deft_batch_lt(parts, n, s, (cudaStream_t)stream, flags, &done);
    for (int i = 0; r == DEFT_OK && !done && i < n; i++) {
        const deft_mm_epilogue ep = {parts[i].bias_grad ? DEFT_MM_EPI_BGRAD_B : DEFT_MM_EPI_NONE, NULL,
                                     parts[i].bias_grad};
        r = deft_cuda_matmul_fused(parts[i].mm, parts[i].out, parts[i].a, parts[i].b, &ep, stream, flags);
    }
    return r;
}
