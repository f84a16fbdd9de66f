/* conv2d and its weight gradient as an explicit product, for NHWC convolutions with fewer than 8 input channels
 * (a network's stem: 3 colour channels). cuDNN pads such inputs to 8 channels itself and then runs kernels made for
 * wide channels, which made ResNet-18's 7x7 stem its largest single cost (bench/RESULTS.md, "Sixth round"). Here the
 * input windows are laid out as rows (im2col), and one cuBLASLt product per chunk of rows does the arithmetic:
 *   forward:        y[m, o]   = sum_k cols[m, k] w[o, k]          (m: an output pixel, k: (kh, kw, c))
 *   weight grad:    dw[o, k]  = sum_m dy[m, o] cols[m, k]
 * The rows are padded to a multiple of 8 elements with zeros (and the weights with them) so that every operand is
 * 16-byte aligned for the tensor cores. The columns live in the stream's cuDNN scratch, which this path stands in
 * for; rows that do not fit are done in several chunks, and the weight gradient sums the chunks in f32 before
 * rounding once to its dtype.
 *
 * Halves only by default: f32's columns are twice the bytes, and f32 with TF32 was not faster than cuDNN at every
 * batch, where the halves were (bench/RESULTS.md, "Sixth round"). The compile option conv_gemm
 * (DEFT_CUDA_CONV_GEMM_* in the kernels' flags) sends these convolutions back to cuDNN, or takes f32 too (to
 * compare); the debug knob DEFT_DEBUG_CONV_GEMM_ROWS caps the rows per chunk (tests use it to exercise chunking on
 * small inputs). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cuda_conv_gemm.cuh"
#include "cuda_kernels.h"
#include "cuda_matmul_impl.cuh"
#include "cuda_tuning.h"

/* Widest input taken: cuDNN's NHWC kernels want 8-channel multiples; from 8 on they are its business. */
#define DEFT_CONV_GEMM_MAX_C 7
/* cuda_tuning.h's DEFT_CONV_GEMM_MAX_K: the largest window row (KH * KW * C, padded) taken (the stems of image
 * networks are well below it); DEFT_CONV_GEMM_MIN_ROWS: the fewest rows worth a chunk (below it the products are too
 * thin to beat cuDNN). */

typedef struct deft_conv_geom {
    int64_t N, H, W, C, O, KH, KW, OH, OW;
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t K, Kp;   /* window row length, and padded to a multiple of 8 */
    int64_t rows;    /* N * OH * OW */
} deft_conv_geom;

static deft_conv_geom deft_conv_geom_of(const deft_tensor *n, const deft_tensor *x, const deft_tensor *w,
                                        const deft_tensor *y) {
    deft_conv_geom g;
    g.N = x->shape[0], g.H = x->shape[1], g.W = x->shape[2], g.C = x->shape[3];
    g.O = w->shape[0], g.KH = w->shape[1], g.KW = w->shape[2];
    g.OH = y->shape[1], g.OW = y->shape[2];
    g.sh = n->p.conv.stride[0], g.sw = n->p.conv.stride[1];
    g.ph = n->p.conv.pad[0], g.pw = n->p.conv.pad[1];
    g.dh = n->p.conv.dil[0], g.dw = n->p.conv.dil[1];
    g.K = g.KH * g.KW * g.C;
    g.Kp = (g.K + 7) / 8 * 8;
    g.rows = g.N * g.OH * g.OW;
    return g;
}

/* ---- the plain kernels: one thread per element written ---- */

/* cols[r, k] for rows r0 .. r0 + nrows of the whole problem: the input under window tap k = (kh, kw, c) of output
 * pixel r, zero in the padding around the image and in the columns K .. Kp. */
template <class T>
__global__ void deft_im2col_nhwc_kernel(T *cols, const T *x, deft_conv_geom g, int64_t r0, int64_t nrows) {
    const int64_t total = nrows * g.Kp;
    for (int64_t i = deft_tid(); i < total; i += deft_nthreads()) {
        const int64_t k = i % g.Kp, r = r0 + i / g.Kp;
        T v = deft_ty<T>::store(0.0f);
        if (k < g.K) {
            const int64_t c = k % g.C, kw = (k / g.C) % g.KW, kh = k / (g.C * g.KW);
            const int64_t ow = r % g.OW, oh = (r / g.OW) % g.OH, b = r / (g.OW * g.OH);
            const int64_t ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
            if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) v = x[((b * g.H + ih) * g.W + iw) * g.C + c];
        }
        cols[i] = v;
    }
}

/* ---- the fast im2col: one thread per 8 consecutive columns of a row, written as one aligned vector, in 32-bit
 * index arithmetic with the divisions done once per thread (the plain kernel's 64-bit divisions and 2-byte stores
 * per element made it far slower than the product it feeds: bench/RESULTS.md, "Sixth round"); the 8 is cuda_tuning.h's
 * DEFT_IM2COL_VEC ---- */

typedef struct deft_conv_geom32 {
    int H, W, C, KW, OH, OW, sh, sw, ph, pw, dh, dw, K, Kp;
} deft_conv_geom32;

static bool deft_conv_geom32_of(const deft_conv_geom &g, int64_t nrows, deft_conv_geom32 *q) {
    if (g.N * g.H * g.W * g.C > INT32_MAX || g.rows > INT32_MAX || nrows * g.Kp > INT32_MAX) return false;
    *q = deft_conv_geom32{(int)g.H, (int)g.W, (int)g.C, (int)g.KW, (int)g.OH, (int)g.OW, (int)g.sh, (int)g.sw,
                          (int)g.ph, (int)g.pw, (int)g.dh, (int)g.dw, (int)g.K, (int)g.Kp};
    return true;
}

template <class T>
__global__ void deft_im2col_vec_kernel(T *cols, const T *x, deft_conv_geom32 g, int r0, int nrows) {
    const int per_row = g.Kp / DEFT_IM2COL_VEC, total = nrows * per_row;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int r = i / per_row, k0 = (i - r * per_row) * DEFT_IM2COL_VEC, R = r0 + r;
        const int ow = R % g.OW, t = R / g.OW, oh = t % g.OH, b = t / g.OH;
        const T *img = x + (int64_t)b * g.H * g.W * g.C;
        int tap = k0 / g.C, c = k0 - tap * g.C, kh = tap / g.KW, kw = tap - kh * g.KW;
        deft_vec<T, DEFT_IM2COL_VEC> v;
#pragma unroll
        for (int j = 0; j < DEFT_IM2COL_VEC; j++) {
            const int ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
            const bool in = k0 + j < g.K && ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
            v.e[j] = in ? img[(ih * g.W + iw) * g.C + c] : deft_ty<T>::store(0.0f);
            if (++c == g.C) {
                c = 0;
                if (++kw == g.KW) kw = 0, kh++;
            }
        }
        *reinterpret_cast<deft_vec<T, DEFT_IM2COL_VEC> *>(cols + (int64_t)r * g.Kp + k0) = v;
    }
}

/* Lays out rows r0 .. r0 + nrows: the fast kernel where the indices fit 32 bits, unless the debug knob
 * DEFT_DEBUG_CONV_GEMM_PLAIN asks for the plain one (the tests run both). */
template <class T>
static deft_status deft_im2col(const deft_tensor *n, T *cols, const T *x, const deft_conv_geom &g, int64_t r0,
                               int64_t nrows, cudaStream_t st) {
    deft_conv_geom32 q;
    if (deft_debug(DEFT_DEBUG_CONV_GEMM_PLAIN) == 0 && deft_conv_geom32_of(g, nrows, &q)) {
        const int64_t total = nrows * (q.Kp / DEFT_IM2COL_VEC);
        deft_im2col_vec_kernel<T><<<deft_cuda_blocks(total, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            cols, x, q, (int)r0, (int)nrows);
    } else {
        deft_im2col_nhwc_kernel<T><<<deft_cuda_blocks(nrows * g.Kp, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
            cols, x, g, r0, nrows);
    }
    return deft_cuda_check_launch(n, "conv2d im2col");
}

/* wp[o, k] = w[o, k] for k < K, 0 up to Kp. */
template <class T> __global__ void deft_conv_pad_weights_kernel(T *wp, const T *w, int64_t O, int64_t K, int64_t Kp) {
    for (int64_t i = deft_tid(); i < O * Kp; i += deft_nthreads()) {
        const int64_t k = i % Kp, o = i / Kp;
        wp[i] = k < K ? w[o * K + k] : deft_ty<T>::store(0.0f);
    }
}

/* dw[o, k] = dwp[o, k] (f32 sums) rounded to T, dropping the pad columns. */
template <class T>
__global__ void deft_conv_unpad_grad_kernel(T *dw, const float *dwp, int64_t O, int64_t K, int64_t Kp) {
    for (int64_t i = deft_tid(); i < O * K; i += deft_nthreads()) {
        const int64_t k = i % K, o = i / K;
        dw[i] = deft_ty<T>::store(dwp[o * Kp + k]);
    }
}

/* ---- the plan: where the scratch goes, how many rows a chunk takes ---- */
typedef struct deft_conv_gemm_plan {
    deft_conv_geom g;
    size_t elt;
    void *wbuf;       /* padded weights (forward, T) or the gradient's f32 sums (weight grad) */
    void *cols;
    int64_t chunk;    /* rows per chunk, a multiple of 256 (so each chunk's y or dy keeps the base's alignment) */
} deft_conv_gemm_plan;

static size_t deft_round_up(size_t v, size_t to) {
    return (v + to - 1) / to * to;
}

/* The padded weights' (forward) or the gradient's f32 sums' bytes, at the start of the scratch. */
static size_t deft_conv_gemm_wbytes(const deft_conv_geom &g, const deft_tensor *n) {
    const size_t elt = n->op == DEFT_OP_CONV2D ? deft_dtype_size(n->dtype) : 4;
    return deft_round_up((size_t)g.O * (size_t)g.Kp * elt, 256);
}

/* The rows of a chunk at most: the debug knob's cap, else all of them. */
static int64_t deft_conv_gemm_rows_cap(const deft_conv_geom &g) {
    const int64_t cap = deft_debug(DEFT_DEBUG_CONV_GEMM_ROWS);
    return cap > 0 && cap < g.rows ? cap : g.rows;
}

/* false where the scratch cannot hold the weights and a chunk worth running. A chunk is a multiple of 256 rows
 * unless it is the whole problem (one chunk). */
static bool deft_conv_gemm_plan_make(const deft_conv_geom &g, const deft_tensor *n, void *ws, size_t ws_bytes,
                                     deft_conv_gemm_plan *p) {
    p->g = g;
    p->elt = deft_dtype_size(n->dtype);
    const size_t wbytes = deft_conv_gemm_wbytes(g, n);
    if (!ws || ws_bytes < wbytes) return false;
    p->wbuf = ws;
    p->cols = (char *)ws + wbytes;
    int64_t fit = (int64_t)((ws_bytes - wbytes) / ((size_t)g.Kp * p->elt));
    const int64_t cap = deft_conv_gemm_rows_cap(g);
    if (cap < fit) fit = cap;
    p->chunk = fit >= g.rows ? g.rows : fit / 256 * 256;
    return p->chunk >= DEFT_CONV_GEMM_MIN_ROWS || (p->chunk == g.rows && g.rows > 0);
}

size_t deft_conv_gemm_bytes(const deft_tensor *n, const deft_tensor *x, const deft_tensor *w, const deft_tensor *y) {
    const deft_conv_geom g = deft_conv_geom_of(n, x, w, y);
    const size_t rows = (size_t)deft_conv_gemm_rows_cap(g), row_bytes = (size_t)g.Kp * deft_dtype_size(n->dtype);
    const size_t wbytes = deft_conv_gemm_wbytes(g, n);
    size_t cols = 0, total = 0;
    /* past size_t, the most there is: the stream's cap cuts it (base/checked.h's helpers are C only) */
    if (__builtin_mul_overflow(rows, row_bytes, &cols) || __builtin_add_overflow(wbytes, cols, &total)) return SIZE_MAX;
    return total;
}

/* The product for rows r0 .. r0 + nrows. */
static deft_lt_gemm deft_conv_gemm_chunk(const deft_tensor *n, const deft_conv_gemm_plan &p, const void *dy,
                                      void *out, int64_t r0, int64_t nrows) {
    const deft_conv_geom &g = p.g;
    deft_lt_gemm m;
    memset(&m, 0, sizeof m);
    m.dtype = n->dtype;
    if (n->op == DEFT_OP_CONV2D) {   /* y[r0.., O] = cols[nrows, Kp] wp[O, Kp]^T */
        m.out_dtype = n->dtype;
        m.ta = 0, m.tb = 1;
        m.M = nrows, m.N = g.O, m.K = g.Kp;
        m.a = p.cols, m.b = p.wbuf;
        m.out = (char *)out + (size_t)(r0 * g.O) * p.elt;
    } else {                         /* dwp[O, Kp] (+)= dy[r0.., O]^T cols[nrows, Kp] */
        m.out_dtype = DEFT_F32;
        m.ta = 1, m.tb = 0;
        m.M = g.O, m.N = g.Kp, m.K = nrows;
        m.a = (const char *)dy + (size_t)(r0 * g.O) * p.elt, m.b = p.cols;
        m.out = p.wbuf;
        m.accumulate = r0 > 0;
    }
    return m;
}

bool deft_conv_gemm_takes(const deft_tensor *n, const deft_tensor *x, const deft_tensor *w, unsigned flags) {
    if (n->op != DEFT_OP_CONV2D && n->op != DEFT_OP_CONV2D_WEIGHT_GRAD) return false;
    if (n->p.conv.layout != DEFT_NHWC || n->p.conv.groups != 1) return false;
    if (flags & DEFT_CUDA_CONV_GEMM_NEVER) return false;
    const bool f32 = (flags & DEFT_CUDA_CONV_GEMM_F32) != 0;
    if (n->dtype != DEFT_F16 && n->dtype != DEFT_BF16 && !(n->dtype == DEFT_F32 && f32)) return false;
    if (x->shape[3] > DEFT_CONV_GEMM_MAX_C || w->shape[1] * w->shape[2] * x->shape[3] > DEFT_CONV_GEMM_MAX_K)
        return false;
    return true;
}

/* Whether every product of the plan would run through cuBLASLt (each distinct chunk shape: the full one and the
 * last), checked before anything is queued so that a refusal leaves the whole convolution to cuDNN. */
static deft_status deft_conv_gemm_ready(const deft_tensor *n, const deft_conv_gemm_plan &p, const void *in1, void *out,
                                        cudaStream_t st, unsigned flags, bool *ready) {
    const int64_t rows = p.g.rows, last = rows - (rows - 1) / p.chunk * p.chunk;
    bool full_ok = false, last_ok = false;
    deft_status s = deft_cuda_gemm_lt(deft_conv_gemm_chunk(n, p, in1, out, 0, p.chunk), st, flags, true, &full_ok);
    if (s == DEFT_OK && full_ok)
        s = deft_cuda_gemm_lt(deft_conv_gemm_chunk(n, p, in1, out, rows - last, last), st, flags, true, &last_ok);
    *ready = full_ok && last_ok;
    return s;
}

template <class T>
static deft_status deft_conv_gemm_queue(const deft_tensor *n, const deft_conv_gemm_plan &p, const T *x,
                                        const void *in1, void *out, cudaStream_t st, unsigned flags) {
    const deft_conv_geom &g = p.g;
    const bool fwd = n->op == DEFT_OP_CONV2D;
    if (fwd) {
        deft_conv_pad_weights_kernel<T><<<deft_cuda_blocks(g.O * g.Kp, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0,
                                          st>>>((T *)p.wbuf, (const T *)in1, g.O, g.K, g.Kp);
        deft_status s = deft_cuda_check_launch(n, "conv2d weight padding");
        if (s != DEFT_OK) return s;
    }
    for (int64_t r0 = 0; r0 < g.rows; r0 += p.chunk) {
        const int64_t nrows = g.rows - r0 < p.chunk ? g.rows - r0 : p.chunk;
        deft_status s = deft_im2col<T>(n, (T *)p.cols, x, g, r0, nrows, st);
        bool done = false;
        if (s == DEFT_OK)
            s = deft_cuda_gemm_lt(deft_conv_gemm_chunk(n, p, in1, out, r0, nrows), st, flags, false, &done);
        if (s != DEFT_OK) return s;
        if (!done)   /* the dry run said it would: only a changed cuBLASLt state gets here */
            return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: cuBLASLt refused a product it had accepted",
                                  deft_op_name(n->op));
    }
    if (fwd) return DEFT_OK;
    deft_conv_unpad_grad_kernel<T><<<deft_cuda_blocks(g.O * g.K, DEFT_CUDA_THREADS), DEFT_CUDA_THREADS, 0, st>>>(
        (T *)out, (const float *)p.wbuf, g.O, g.K, g.Kp);
    return deft_cuda_check_launch(n, "conv2d weight gradient");
}

deft_status deft_conv_gemm_run(const deft_tensor *n, const deft_tensor *x, const deft_tensor *w,
                               const deft_tensor *y, const void *px, const void *in1, void *out, void *ws,
                               size_t ws_bytes, cudaStream_t st, unsigned flags, bool *done) {
    *done = false;
    deft_conv_gemm_plan p;
    if (!deft_conv_gemm_plan_make(deft_conv_geom_of(n, x, w, y), n, ws, ws_bytes, &p)) return DEFT_OK;
    bool ready = false;
    deft_status s = deft_conv_gemm_ready(n, p, in1, out, st, flags, &ready);
    if (s != DEFT_OK || !ready) return s;
    *done = true;
    return deft_with_float_dtype(n, [&](auto tag) -> deft_status {
        typedef typename decltype(tag)::type T;
        return deft_conv_gemm_queue<T>(n, p, (const T *)px, in1, out, st, flags);
    });
}
