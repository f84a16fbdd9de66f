/* Batched matrix products with broadcast batch dims: CBLAS when the build found one, a plain loop otherwise.
 * f16/bf16 go through f32 scratch (as torch's CPU path does), so only the final store rounds. */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

#ifdef DEFT_HAVE_BLAS
#include <cblas.h>
#endif

/* One product C[M,N] = op(A) op(B), row-major; op(A) is A^T when ta (A stored [K,M]), op(B) is B^T when tb (B
 * stored [N,K]). The leading dimensions are the stored row lengths. */
#ifndef DEFT_HAVE_BLAS
/* No BLAS: i-k-j order streams rows of B and C (a row of C stays in cache while K rows of B pass through it); with
 * B transposed its rows are the dot-product operands instead, so i-j-k reads both contiguously. */
#define DEFINE_GEMM_LOOP(name, T)                                                                                \
    static void name(int ta, int tb, int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, const T *B,       \
                     int64_t ldb, T *C, int64_t ldc) {                                                           \
        DEFT_OMP(parallel for schedule(static) if (M * N * K > DEFT_CPU_PAR_MIN && M > 1))                       \
        for (int64_t i = 0; i < M; i++) {                                                                        \
            T *restrict c = C + i * ldc;                                                                         \
            if (!tb) {                                                                                           \
                for (int64_t j = 0; j < N; j++) c[j] = 0;                                                        \
                for (int64_t k = 0; k < K; k++) {                                                                \
                    const T aik = ta ? A[k * lda + i] : A[i * lda + k];                                          \
                    const T *restrict b = B + k * ldb;                                                           \
                    for (int64_t j = 0; j < N; j++) c[j] += aik * b[j];                                          \
                }                                                                                                \
            } else {                                                                                             \
                for (int64_t j = 0; j < N; j++) {                                                                \
                    const T *restrict b = B + j * ldb;                                                           \
                    T acc = 0;                                                                                   \
                    if (!ta)                                                                                     \
                        for (int64_t k = 0; k < K; k++) acc += A[i * lda + k] * b[k];                            \
                    else                                                                                         \
                        for (int64_t k = 0; k < K; k++) acc += A[k * lda + i] * b[k];                            \
                    c[j] = acc;                                                                                  \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }
DEFINE_GEMM_LOOP(gemm_f32, float)
DEFINE_GEMM_LOOP(gemm_f64, double)
#else
/* CBLAS takes int dimensions; deft's shapes are int64, so larger products are refused by the caller. */
static void gemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                1.0f, A, (int)lda, B, (int)ldb, 0.0f, C, (int)ldc);
}
static void gemm_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, const double *A, int64_t lda,
                     const double *B, int64_t ldb, double *C, int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                1.0, A, (int)lda, B, (int)ldb, 0.0, C, (int)ldc);
}
#endif

/* The batched product over already-typed buffers (f32 or f64). */
typedef struct mm_shape {
    int ta, tb;
    int64_t M, N, K;
    int nbatch;                          /* output batch dims */
    int64_t bshape[DEFT_MAX_DIMS];       /* output batch shape */
    int64_t sa[DEFT_MAX_DIMS], sb[DEFT_MAX_DIMS];   /* batch strides of a and b, in matrices (0: broadcast) */
    int64_t batch;                       /* product of bshape */
    int64_t a_mats, b_mats;              /* matrices stored in a and b */
} mm_shape;

#define DEFINE_BATCHED(name, T, GEMM)                                                                            \
    static void name(const mm_shape *s, const T *A, const T *B, T *C) {                                          \
        const int64_t M = s->M, N = s->N, K = s->K;                                                              \
        const int64_t lda = s->ta ? M : K, ldb = s->tb ? K : N;                                                  \
        /* b shared by every batch and a stacked plainly: the batch folds into M, one large call instead of many \
         * small ones (the linear-layer case). */                                                                \
        if (s->b_mats == 1 && !s->ta && s->a_mats == s->batch) {                                                 \
            GEMM(0, s->tb, s->batch * M, N, K, A, lda, B, ldb, C, N);                                            \
            return;                                                                                              \
        }                                                                                                        \
        for (int64_t t = 0; t < s->batch; t++) {                                                                 \
            int64_t ia = 0, ib = 0, r = t;                                                                       \
            for (int d = s->nbatch - 1; d >= 0; d--) {                                                           \
                int64_t idx = r % s->bshape[d];                                                                  \
                r /= s->bshape[d];                                                                               \
                ia += idx * s->sa[d];                                                                            \
                ib += idx * s->sb[d];                                                                            \
            }                                                                                                    \
            GEMM(s->ta, s->tb, M, N, K, A + ia * M * K, lda, B + ib * K * N, ldb, C + t * M * N, N);             \
        }                                                                                                        \
    }
DEFINE_BATCHED(batched_f32, float, gemm_f32)
DEFINE_BATCHED(batched_f64, double, gemm_f64)

/* Half inputs widen to f32 scratch; returns NULL when memory runs out. */
static float *widen(const void *src, deft_dtype dt, int64_t cnt) {
    float *w = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof(float));
    if (!w) return NULL;
    const uint16_t *h = src;
    DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < cnt; i++) w[i] = dt == DEFT_F16 ? deft_half_unpack(h[i]) : deft_bf16_unpack(h[i]);
    return w;
}

deft_status deft_cpu_matmul(const deft_tensor *n, void *out, const void *a, const void *b) {
    const deft_tensor *ta = n->src[0], *tb = n->src[1];
    const deft_dtype dt = n->dtype;
    if (!deft_cpu_is_float(dt)) return deft_cpu_dtype_error(n, dt);
    if (ta->dtype != dt || tb->dtype != dt)
        return deft_set_error(DEFT_ERR_DTYPE, "matmul: inputs are %s and %s, output %s", deft_dtype_name(ta->dtype),
                              deft_dtype_name(tb->dtype), deft_dtype_name(dt));
    if (ta->ndim < 2 || tb->ndim < 2 || n->ndim < 2)
        return deft_set_error(DEFT_ERR_SHAPE, "matmul: the CPU kernel needs operands of rank >= 2 (got %d and %d)",
                              ta->ndim, tb->ndim);

    mm_shape s;
    s.ta = n->p.matmul.trans_a != 0;
    s.tb = n->p.matmul.trans_b != 0;
    s.M = ta->shape[ta->ndim - (s.ta ? 1 : 2)];
    s.K = ta->shape[ta->ndim - (s.ta ? 2 : 1)];
    s.N = tb->shape[tb->ndim - (s.tb ? 2 : 1)];
    const int64_t kb = tb->shape[tb->ndim - (s.tb ? 1 : 2)];
    if (kb != s.K || n->shape[n->ndim - 2] != s.M || n->shape[n->ndim - 1] != s.N)
        return deft_set_error(DEFT_ERR_SHAPE, "matmul: inner dims %lld and %lld or output [.., %lld, %lld] do not fit",
                              (long long)s.K, (long long)kb, (long long)n->shape[n->ndim - 2],
                              (long long)n->shape[n->ndim - 1]);
#ifdef DEFT_HAVE_BLAS
    if (s.M > INT32_MAX || s.N > INT32_MAX || s.K > INT32_MAX)
        return deft_set_error(DEFT_ERR_SHAPE, "matmul: a dimension over 2^31 is beyond CBLAS's int indices");
#endif
    s.nbatch = n->ndim - 2;
    memcpy(s.bshape, n->shape, sizeof(int64_t) * (size_t)s.nbatch);
    deft_broadcast_strides(ta->ndim - 2, ta->shape, s.nbatch, s.bshape, s.sa);
    deft_broadcast_strides(tb->ndim - 2, tb->shape, s.nbatch, s.bshape, s.sb);
    s.batch = deft_shape_numel(s.nbatch, s.bshape);
    s.a_mats = deft_shape_numel(ta->ndim - 2, ta->shape);
    s.b_mats = deft_shape_numel(tb->ndim - 2, tb->shape);

    const int64_t out_cnt = s.batch * s.M * s.N;
    if (out_cnt == 0) return DEFT_OK;
    if (s.K == 0) {
        /* An empty sum is zero; BLAS may reject K = 0 leading dimensions. +0 is all-zero bits in every format. */
        memset(out, 0, (size_t)out_cnt * deft_dtype_size(dt));
        return DEFT_OK;
    }
    if (dt == DEFT_F32) {
        batched_f32(&s, a, b, out);
        return DEFT_OK;
    }
    if (dt == DEFT_F64) {
        batched_f64(&s, a, b, out);
        return DEFT_OK;
    }
    const int64_t a_cnt = s.a_mats * s.M * s.K, b_cnt = s.b_mats * s.K * s.N;
    float *wa = widen(a, dt, a_cnt), *wb = widen(b, dt, b_cnt);
    float *wc = malloc((size_t)out_cnt * sizeof(float));
    if (!wa || !wb || !wc) {
        free(wa), free(wb), free(wc);
        return deft_set_error(DEFT_ERR_OOM, "matmul: no host memory for %.0f bytes of f32 scratch",
                              4.0 * ((double)a_cnt + (double)b_cnt + (double)out_cnt));
    }
    batched_f32(&s, wa, wb, wc);
    uint16_t *o = out;
    DEFT_OMP(parallel for schedule(static) if (out_cnt > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < out_cnt; i++) o[i] = dt == DEFT_F16 ? deft_half_pack(wc[i]) : deft_bf16_pack(wc[i]);
    free(wa), free(wb), free(wc);
    return DEFT_OK;
}
