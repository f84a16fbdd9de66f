/* conv2d and its input and weight gradients on the CPU: im2col (col2im for dx) and a gemm per image and group, the
 * CBLAS's when the build has one. f32 and f64; other dtypes are DEFT_ERR_DTYPE. */
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "cpu_internal.h"

#ifdef DEFT_HAVE_BLAS
#include <cblas.h>
#endif

/* The sizes of one convolution, whichever of its three ops runs. K orders (c, kh, kw) for NCHW weights and
 * (kh, kw, c) for NHWC ones, as each stores a filter. */
typedef struct conv_geom {
    int64_t N, C, H, W, O, OH, OW, KH, KW, G, Cg, Og, K, P;
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t xsN, xsC, xsH, xsW;   /* strides of x in elements */
    int nhwc;
} conv_geom;

static void conv_decode(const conv_geom *g, int64_t r, int64_t *c, int64_t *kh, int64_t *kw) {
    if (g->nhwc) {
        *c = r % g->Cg;
        *kw = (r / g->Cg) % g->KW;
        *kh = r / (g->Cg * g->KW);
    } else {
        *kw = r % g->KW;
        *kh = (r / g->KW) % g->KH;
        *c = r / (g->KW * g->KH);
    }
}

static int64_t conv_row(const conv_geom *g, int64_t c, int64_t kh, int64_t kw) {
    return g->nhwc ? (kh * g->KW + kw) * g->Cg + c : (c * g->KH + kh) * g->KW + kw;
}

/* C = op(A) op(B) + beta C, row-major (op(A) [M, K] is A^T when ta, A then stored [K, M]; likewise B). */
#ifdef DEFT_HAVE_BLAS
static void conv_gemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                          const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                1.0f, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}
static void conv_gemm_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, const double *A, int64_t lda,
                          const double *B, int64_t ldb, double beta, double *C, int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                1.0, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}
#else
/* The plain loop: beta 0 never reads C, which may hold anything. */
#define DEFINE_CONV_GEMM(name, T)                                                                                \
    static void name(int ta, int tb, int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, const T *B,       \
                     int64_t ldb, T beta, T *C, int64_t ldc) {                                                   \
        DEFT_OMP(parallel for schedule(static) if (M * N * K > DEFT_CPU_PAR_MIN && M > 1))                       \
        for (int64_t i = 0; i < M; i++) {                                                                        \
            for (int64_t j = 0; j < N; j++) {                                                                    \
                T acc = 0;                                                                                       \
                for (int64_t k = 0; k < K; k++)                                                                  \
                    acc += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);      \
                C[i * ldc + j] = beta == 0 ? acc : beta * C[i * ldc + j] + acc;                                  \
            }                                                                                                    \
        }                                                                                                        \
    }
DEFINE_CONV_GEMM(conv_gemm_f32, float)
DEFINE_CONV_GEMM(conv_gemm_f64, double)
#endif

#define CONV_T float
#define CONV_SFX f32
#define CONV_GEMM conv_gemm_f32
#include "cpu_conv_impl.h"
#undef CONV_T
#undef CONV_SFX
#undef CONV_GEMM
#define CONV_T double
#define CONV_SFX f64
#define CONV_GEMM conv_gemm_f64
#include "cpu_conv_impl.h"
#undef CONV_T
#undef CONV_SFX
#undef CONV_GEMM

/* x, w and dy (or y) of node n: which sources they are depends on the op. */
static void conv_operands(const deft_tensor *n, const deft_tensor **x, const deft_tensor **w, const deft_tensor **y) {
    switch (n->op) {
    case DEFT_OP_CONV2D: *x = n->src[0], *w = n->src[1], *y = n; break;
    case DEFT_OP_CONV2D_INPUT_GRAD: *x = n, *w = n->src[1], *y = n->src[0]; break;
    default: *x = n->src[1], *w = n, *y = n->src[0]; break;
    }
}

static void conv_geometry(const deft_tensor *n, conv_geom *g) {
    const deft_tensor *x, *w, *y;
    conv_operands(n, &x, &w, &y);
    g->nhwc = n->p.conv.layout == DEFT_NHWC;
    const int c = g->nhwc ? 3 : 1, h = g->nhwc ? 1 : 2, wd = g->nhwc ? 2 : 3;
    g->N = x->shape[0], g->C = x->shape[c], g->H = x->shape[h], g->W = x->shape[wd];
    g->O = w->shape[0], g->KH = w->shape[g->nhwc ? 1 : 2], g->KW = w->shape[g->nhwc ? 2 : 3];
    g->OH = y->shape[h], g->OW = y->shape[wd];
    g->G = n->p.conv.groups, g->Cg = g->C / g->G, g->Og = g->O / g->G;
    g->K = g->Cg * g->KH * g->KW, g->P = g->OH * g->OW;
    g->sh = n->p.conv.stride[0], g->sw = n->p.conv.stride[1];
    g->ph = n->p.conv.pad[0], g->pw = n->p.conv.pad[1];
    g->dh = n->p.conv.dil[0], g->dw = n->p.conv.dil[1];
    g->xsN = g->C * g->H * g->W;
    g->xsC = g->nhwc ? 1 : g->H * g->W;
    g->xsH = g->nhwc ? g->W * g->C : g->W;
    g->xsW = g->nhwc ? g->C : 1;
}

deft_status deft_cpu_conv2d(const deft_tensor *n, void *out, const void *const *in) {
    if (n->dtype != DEFT_F32 && n->dtype != DEFT_F64) return deft_cpu_dtype_error(n, n->dtype);
    conv_geom g;
    conv_geometry(n, &g);
#ifdef DEFT_HAVE_BLAS
    if (g.K > INT32_MAX || g.P > INT32_MAX || g.O > INT32_MAX)
        return deft_set_error(DEFT_ERR_SHAPE, "%s: a gemm dimension over 2^31 is beyond CBLAS's int indices",
                              deft_op_name(n->op));
#endif
    return n->dtype == DEFT_F32 ? conv_run_f32(n, &g, out, in) : conv_run_f64(n, &g, out, in);
}
