/* Batched matrix products: the dispatch, the shape analysis, and the reference path through cuBLAS, with broadcast
 * batch dims. cuda_matmul_lt.cu runs the same products through cuBLASLt (TF32 when allowed, fused epilogues); every
 * product it takes goes there, and this file's cublasGemmEx path stays as the plain, obviously correct reference:
 * f64, broadcasts no single stride describes, shapes cuBLASLt has no algorithm for, and every product under the
 * debug knob DEFT_DEBUG_MATMUL_REFERENCE (so tests can run both on the same node).
 *
 * cuBLAS is column-major and deft row-major: a row-major X is a column-major X^T with the same leading dimension,
 * so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, i.e. cuBLAS gets B first, A second and (m, n) = (N, M).
 *
 * Precision on the reference path: f32 computes in f32 (CUBLAS_COMPUTE_32F, never TF32, whatever the flags), f64
 * in f64, f16 and bf16 accumulate in f32 with reduced-precision split-K reductions disallowed, so only the final
 * store rounds (as the CPU, which widens halves to f32 scratch). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <mutex>

#include "config.h"
#include "cuda_matmul_impl.cuh"
#include "cuda_matmul_small.cuh"

/* ---- one cuBLAS handle per device, created on first use and kept for the life of the process ---- */

/* Handles are never destroyed: destroying one at exit can run after the CUDA runtime has torn down its contexts.
 * The lock also serialises the set-stream-then-launch pair, since a handle holds one stream at a time. */
static cublasHandle_t deft_cublas_handles[DEFT_CUBLAS_MAX_DEVICES];
static std::mutex deft_cublas_lock;

/* The workspace is the stream's (cuda_workspace.cu), from the caching allocator, so that it shows in the statistics
 * and snapshots and in the program's reports. cuBLAS and cuBLASLt share it: both enqueue on the caller's stream, so
 * their calls never overlap in it. cuBLASLt's calls ask for what their algorithm needs; a plain cuBLAS call chooses
 * its kernel inside cuBLAS, within what cublasSetWorkspace gives it, so it asks for cuBLAS's documented
 * recommendation (cuda_tuning.h's DEFT_CUBLAS_PLAIN_WORKSPACE_*). */

/* The recommendation for cuda:dev: Hopper's from compute capability 9 on (asked of the device once and kept). */
extern "C" size_t deft_cuda_cublas_floor(int dev) {
    static int majors[DEFT_CUBLAS_MAX_DEVICES];   /* 0: not asked yet */
    if (dev < 0 || dev >= DEFT_CUBLAS_MAX_DEVICES) return DEFT_CUBLAS_PLAIN_WORKSPACE_BYTES;
    int major = __atomic_load_n(&majors[dev], __ATOMIC_RELAXED);
    if (!major) {
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return DEFT_CUBLAS_PLAIN_WORKSPACE_BYTES;
        }
        __atomic_store_n(&majors[dev], major, __ATOMIC_RELAXED);
    }
    return major >= 9 ? DEFT_CUBLAS_PLAIN_WORKSPACE_HOPPER_BYTES : DEFT_CUBLAS_PLAIN_WORKSPACE_BYTES;
}

deft_status deft_cublas_error(const char *what, cublasStatus_t s) {
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda matmul: %s failed: %s", what, cublasGetStatusString(s));
}

deft_status deft_matmul_device(int *dev) {
    cudaError_t e = cudaGetDevice(dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda matmul: cudaGetDevice failed: %s", cudaGetErrorString(e));
    }
    if (*dev < 0 || *dev >= DEFT_CUBLAS_MAX_DEVICES)
        return deft_set_error(DEFT_ERR_DEVICE, "cuda matmul: cuda:%d is past the %d devices deft supports", *dev,
                              DEFT_CUBLAS_MAX_DEVICES);
    return DEFT_OK;
}

/* Makes cuda:dev's handle if it has none (dev is current); the caller holds deft_cublas_lock. */
static deft_status deft_cublas_create(int dev) {
    if (deft_cublas_handles[dev]) return DEFT_OK;
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) return deft_cublas_error("cublasCreate", s);
    const int mode = CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    s = cublasSetMathMode(h, (cublasMath_t)mode);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        return deft_cublas_error("cublasSetMathMode", s);
    }
    deft_cublas_handles[dev] = h;
    return DEFT_OK;
}

extern "C" deft_status deft_cuda_cublas_prepare(int dev) {
    if (dev < 0 || dev >= DEFT_CUBLAS_MAX_DEVICES) return DEFT_OK;   /* its products report it */
    std::lock_guard<std::mutex> guard(deft_cublas_lock);
    return deft_cublas_create(dev);
}

/* The current device's handle, bound to `st`; the caller holds deft_cublas_lock. */
static deft_status deft_cublas_handle(cudaStream_t st, cublasHandle_t *out) {
    int dev = 0;
    deft_status ds = deft_matmul_device(&dev);
    if (ds != DEFT_OK) return ds;
    void *ws = NULL;
    size_t ws_bytes = 0;
    /* Less than the floor inside a capture (a stream first met there holds nothing): cuBLAS then picks within it. */
    ds = deft_stream_workspace_reserve(dev, st, DEFT_WORKSPACE_CUBLAS, deft_cuda_cublas_floor(dev), &ws, &ws_bytes);
    if (ds != DEFT_OK) return ds;
    ds = deft_cublas_create(dev);
    if (ds != DEFT_OK) return ds;
    cublasStatus_t s = cublasSetStream(deft_cublas_handles[dev], st);
    if (s != CUBLAS_STATUS_SUCCESS) return deft_cublas_error("cublasSetStream", s);
    /* Setting the stream drops a user workspace, so it is set again after every stream change. */
    s = cublasSetWorkspace(deft_cublas_handles[dev], ws, ws_bytes);
    if (s != CUBLAS_STATUS_SUCCESS) return deft_cublas_error("cublasSetWorkspace", s);
    *out = deft_cublas_handles[dev];
    return DEFT_OK;
}

extern "C" void deft_cuda_cublas_release(int dev) {
    if (dev < 0 || dev >= DEFT_CUBLAS_MAX_DEVICES) return;
    std::lock_guard<std::mutex> guard(deft_cublas_lock);
    if (deft_cublas_handles[dev] && cublasDestroy(deft_cublas_handles[dev]) != CUBLAS_STATUS_SUCCESS)
        (void)cudaGetLastError();
    deft_cublas_handles[dev] = NULL;
}

/* ---- the product's shape ---- */
deft_status deft_mm_make(const deft_tensor *n, deft_mm *s) {
    const deft_tensor *ta = n->src[0], *tb = n->src[1];
    if (ta->ndim < 2 || tb->ndim < 2 || n->ndim < 2)
        return deft_set_error(DEFT_ERR_SHAPE, "matmul: operands need rank >= 2 (got %d and %d)", ta->ndim, tb->ndim);
    s->ta = n->p.matmul.trans_a != 0;
    s->tb = n->p.matmul.trans_b != 0;
    s->M = ta->shape[ta->ndim - (s->ta ? 1 : 2)];
    s->K = ta->shape[ta->ndim - (s->ta ? 2 : 1)];
    s->N = tb->shape[tb->ndim - (s->tb ? 2 : 1)];
    if (tb->shape[tb->ndim - (s->tb ? 1 : 2)] != s->K || n->shape[n->ndim - 2] != s->M ||
        n->shape[n->ndim - 1] != s->N)
        return deft_set_error(DEFT_ERR_SHAPE, "matmul: operand and output shapes do not agree");
    s->nbatch = n->ndim - 2;
    for (int d = 0; d < s->nbatch; d++) s->bshape[d] = n->shape[d];
    deft_broadcast_strides(ta->ndim - 2, ta->shape, s->nbatch, s->bshape, s->sa);
    deft_broadcast_strides(tb->ndim - 2, tb->shape, s->nbatch, s->bshape, s->sb);
    s->batch = deft_shape_numel(s->nbatch, s->bshape);
    s->a_mats = deft_shape_numel(ta->ndim - 2, ta->shape);
    s->b_mats = deft_shape_numel(tb->ndim - 2, tb->shape);
    /* cuBLAS takes int dimensions and counts; the folded M is batch * M. */
    if (s->batch * s->M > INT_MAX || s->N > INT_MAX || s->K > INT_MAX)
        return deft_set_error(DEFT_ERR_SHAPE, "matmul: dimensions past 2^31 - 1 are not supported on CUDA");
    return DEFT_OK;
}

/* ---- cuBLAS types per dtype ---- */
typedef struct deft_gemm_types {
    cudaDataType_t data;
    cublasComputeType_t compute;
    const void *one, *zero;   /* alpha and beta, in the compute type's scalar */
} deft_gemm_types;

static const float deft_one_f = 1.0f, deft_zero_f = 0.0f;
static const double deft_one_d = 1.0, deft_zero_d = 0.0;

static deft_status deft_gemm_types_of(const deft_tensor *n, deft_gemm_types *t) {
    switch (n->dtype) {
    case DEFT_F32: *t = deft_gemm_types{CUDA_R_32F, CUBLAS_COMPUTE_32F, &deft_one_f, &deft_zero_f}; return DEFT_OK;
    case DEFT_F64: *t = deft_gemm_types{CUDA_R_64F, CUBLAS_COMPUTE_64F, &deft_one_d, &deft_zero_d}; return DEFT_OK;
    case DEFT_F16: *t = deft_gemm_types{CUDA_R_16F, CUBLAS_COMPUTE_32F, &deft_one_f, &deft_zero_f}; return DEFT_OK;
    case DEFT_BF16: *t = deft_gemm_types{CUDA_R_16BF, CUBLAS_COMPUTE_32F, &deft_one_f, &deft_zero_f}; return DEFT_OK;
    default:
        return deft_set_error(DEFT_ERR_DTYPE, "matmul: dtype %s is not supported on CUDA", deft_dtype_name(n->dtype));
    }
}

/* ---- one (strided batched) row-major product ---- */
typedef struct deft_gemm_call {
    int ta, tb;
    int64_t M, N, K;
    const void *A, *B;
    void *C;
    int64_t stride_a, stride_b, stride_c;   /* elements between consecutive matrices; 0 repeats one */
    int64_t count;
} deft_gemm_call;

static deft_status deft_gemm(cublasHandle_t h, const deft_gemm_types &t, const deft_gemm_call &c) {
    const int lda = (int)(c.ta ? c.M : c.K), ldb = (int)(c.tb ? c.K : c.N);
    const cublasOperation_t op_b = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (c.count == 1) {
        s = cublasGemmEx(h, op_b, op_a, (int)c.N, (int)c.M, (int)c.K, t.one, c.B, t.data, ldb, c.A, t.data, lda,
                         t.zero, c.C, t.data, (int)c.N, t.compute, CUBLAS_GEMM_DEFAULT);
        return s == CUBLAS_STATUS_SUCCESS ? DEFT_OK : deft_cublas_error("cublasGemmEx", s);
    }
    s = cublasGemmStridedBatchedEx(h, op_b, op_a, (int)c.N, (int)c.M, (int)c.K, t.one, c.B, t.data, ldb,
                                   (long long)c.stride_b, c.A, t.data, lda, (long long)c.stride_a, t.zero, c.C,
                                   t.data, (int)c.N, (long long)c.stride_c, (int)c.count, t.compute,
                                   CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? DEFT_OK : deft_cublas_error("cublasGemmStridedBatchedEx", s);
}

/* Batches that no single stride describes (a [B1, 1] against b [1, B2]): one call per output matrix. */
static deft_status deft_gemm_each(cublasHandle_t h, const deft_gemm_types &t, const deft_mm &s, const char *a,
                                  const char *b, char *c, size_t esz) {
    for (int64_t i = 0; i < s.batch; i++) {
        int64_t ia = 0, ib = 0, r = i;
        for (int d = s.nbatch - 1; d >= 0; d--) {
            const int64_t idx = r % s.bshape[d];
            r /= s.bshape[d];
            ia += idx * s.sa[d];
            ib += idx * s.sb[d];
        }
        deft_gemm_call call = {s.ta, s.tb, s.M, s.N, s.K, a + (size_t)(ia * s.M * s.K) * esz,
                               b + (size_t)(ib * s.K * s.N) * esz, c + (size_t)(i * s.M * s.N) * esz, 0, 0, 0, 1};
        deft_status st = deft_gemm(h, t, call);
        if (st != DEFT_OK) return st;
    }
    return DEFT_OK;
}

static deft_status deft_matmul_run(cublasHandle_t h, const deft_gemm_types &t, const deft_mm &s, const void *a,
                                   const void *b, void *c, size_t esz) {
    /* b shared by every batch and a stacked plainly: the batch folds into M, one large product instead of many
     * small ones (the linear-layer case). */
    if (s.b_mats == 1 && !s.ta && s.a_mats == s.batch) {
        deft_gemm_call call = {0, s.tb, s.batch * s.M, s.N, s.K, a, b, c, 0, 0, 0, 1};
        return deft_gemm(h, t, call);
    }
    /* Each operand either repeats one matrix or holds one per output matrix: one strided batched call. Any other
     * broadcast holds fewer matrices than the output, but more than one. */
    const bool a_uniform = s.a_mats == 1 || s.a_mats == s.batch, b_uniform = s.b_mats == 1 || s.b_mats == s.batch;
    if (a_uniform && b_uniform && s.batch <= INT_MAX) {
        deft_gemm_call call = {s.ta, s.tb, s.M, s.N, s.K, a, b, c, s.a_mats == 1 ? 0 : s.M * s.K,
                               s.b_mats == 1 ? 0 : s.K * s.N, s.M * s.N, s.batch};
        return deft_gemm(h, t, call);
    }
    return deft_gemm_each(h, t, s, (const char *)a, (const char *)b, (char *)c, esz);
}

/* The debug knob DEFT_DEBUG_MATMUL_REFERENCE sends every product down the reference path. Read at each call (an
 * atomic load, and replays do not call here), so a test can switch it between runs. */
bool deft_matmul_reference_requested(void) {
    return deft_debug(DEFT_DEBUG_MATMUL_REFERENCE) != 0;
}

deft_status deft_cuda_matmul_reference(const deft_tensor *n, const deft_mm &mm, void *out, const void *a,
                                       const void *b, cudaStream_t st) {
    deft_gemm_types t;
    deft_status s = deft_gemm_types_of(n, &t);
    if (s != DEFT_OK) return s;
    std::lock_guard<std::mutex> guard(deft_cublas_lock);
    cublasHandle_t h = NULL;
    s = deft_cublas_handle(st, &h);
    if (s != DEFT_OK) return s;
    return deft_matmul_run(h, t, mm, a, b, out, deft_dtype_size(n->dtype));
}

deft_status deft_cuda_matmul(const deft_tensor *n, void *out, const void *a, const void *b, cudaStream_t st,
                             unsigned flags) {
    deft_gemm_types t;
    deft_status s = deft_gemm_types_of(n, &t);
    if (s != DEFT_OK) return s;
    deft_mm mm;
    s = deft_mm_make(n, &mm);
    if (s != DEFT_OK) return s;
    if (mm.K == 0) {
        /* An empty sum is zero; cuBLAS may leave C untouched for k = 0. */
        const size_t bytes = (size_t)(mm.batch * mm.M * mm.N) * deft_dtype_size(n->dtype);
        cudaError_t e = cudaMemsetAsync(out, 0, bytes, st);
        if (e == cudaSuccess) return DEFT_OK;
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda matmul: memset failed: %s", cudaGetErrorString(e));
    }
    if (n->dtype != DEFT_F64 && !deft_matmul_reference_requested()) {
        if (deft_matmul_small_fits(n, mm)) return deft_cuda_matmul_small(n, mm, out, a, b, NULL, st);
        bool done = false;
        s = deft_cuda_matmul_lt_plain(n, mm, out, a, b, st, flags, &done);
        if (s != DEFT_OK || done) return s;
    }
    return deft_cuda_matmul_reference(n, mm, out, a, b, st);
}
