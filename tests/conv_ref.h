/* Plain float64 references of conv2d, pooling and batch norm for the tests, written on logical NCHW indices, and
 * the packing of NCHW values into either layout (NHWC: [N, H, W, C]; a conv weight [O, C/g, KH, KW] becomes
 * [O, KH, KW, C/g], the same permutation). Static inline, so each test uses what it needs. */
#ifndef DEFT_TEST_CONV_REF_H
#define DEFT_TEST_CONV_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "deft.h"

/* A 4-D shape in logical NCHW order, and where logical element (a, b, c, d) lies in a layout. */
typedef struct ref4 {
    int64_t d[4];
} ref4;

static inline int64_t ref4_numel(ref4 s) { return s.d[0] * s.d[1] * s.d[2] * s.d[3]; }

static inline int64_t ref4_at(ref4 s, int nhwc, int64_t a, int64_t b, int64_t c, int64_t d) {
    return nhwc ? ((a * s.d[2] + c) * s.d[3] + d) * s.d[1] + b : ((a * s.d[1] + b) * s.d[2] + c) * s.d[3] + d;
}

/* The stored shape of a logical NCHW shape in a layout. */
static inline void ref4_stored(ref4 s, int nhwc, int64_t *out) {
    if (nhwc) out[0] = s.d[0], out[1] = s.d[2], out[2] = s.d[3], out[3] = s.d[1];
    else out[0] = s.d[0], out[1] = s.d[1], out[2] = s.d[2], out[3] = s.d[3];
}

/* Logical NCHW values -> stored order (pack) and back (unpack). */
static inline void ref4_pack(ref4 s, int nhwc, const double *logical, double *stored) {
    int64_t i = 0;
    for (int64_t a = 0; a < s.d[0]; a++)
        for (int64_t b = 0; b < s.d[1]; b++)
            for (int64_t c = 0; c < s.d[2]; c++)
                for (int64_t d = 0; d < s.d[3]; d++) stored[ref4_at(s, nhwc, a, b, c, d)] = logical[i++];
}

static inline void ref4_unpack(ref4 s, int nhwc, const double *stored, double *logical) {
    int64_t i = 0;
    for (int64_t a = 0; a < s.d[0]; a++)
        for (int64_t b = 0; b < s.d[1]; b++)
            for (int64_t c = 0; c < s.d[2]; c++)
                for (int64_t d = 0; d < s.d[3]; d++) logical[i++] = stored[ref4_at(s, nhwc, a, b, c, d)];
}

typedef struct ref_conv {
    int64_t stride[2], pad[2], dil[2], groups;
} ref_conv;

static inline int64_t ref_out_len(int64_t len, int64_t pad, int64_t span, int64_t stride) {
    return (len + 2 * pad - span) / stride + 1;
}

/* y [N, O, OH, OW] = conv(x [N, C, H, W], w [O, C/g, KH, KW]) + b (b may be NULL). */
static inline ref4 ref_conv2d(ref4 xs, const double *x, ref4 ws, const double *w, const double *b, ref_conv p,
                              double **out) {
    const int64_t N = xs.d[0], C = xs.d[1], H = xs.d[2], W = xs.d[3], O = ws.d[0], KH = ws.d[2], KW = ws.d[3];
    const int64_t Cg = C / p.groups, Og = O / p.groups;
    ref4 ys = {{N, O, ref_out_len(H, p.pad[0], p.dil[0] * (KH - 1) + 1, p.stride[0]),
                ref_out_len(W, p.pad[1], p.dil[1] * (KW - 1) + 1, p.stride[1])}};
    double *y = calloc((size_t)ref4_numel(ys), sizeof *y);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t oh = 0; oh < ys.d[2]; oh++)
                for (int64_t ow = 0; ow < ys.d[3]; ow++) {
                    double acc = b ? b[o] : 0.0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kh = 0; kh < KH; kh++)
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t ih = oh * p.stride[0] - p.pad[0] + kh * p.dil[0];
                                int64_t iw = ow * p.stride[1] - p.pad[1] + kw * p.dil[1];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += x[((n * C + (o / Og) * Cg + c) * H + ih) * W + iw] *
                                       w[((o * Cg + c) * KH + kh) * KW + kw];
                            }
                    y[((n * O + o) * ys.d[2] + oh) * ys.d[3] + ow] = acc;
                }
    *out = y;
    return ys;
}

typedef struct ref_pool {
    int64_t kernel[2], stride[2], pad[2];
    int exclude_pad, max, adaptive;
    int64_t out[2];   /* adaptive only */
} ref_pool;

/* Max, average or adaptive average pooling of x [N, C, H, W]. */
static inline ref4 ref_pool2d(ref4 xs, const double *x, ref_pool p, double **out) {
    const int64_t H = xs.d[2], W = xs.d[3];
    ref4 ys = {{xs.d[0], xs.d[1], p.adaptive ? p.out[0] : ref_out_len(H, p.pad[0], p.kernel[0], p.stride[0]),
                p.adaptive ? p.out[1] : ref_out_len(W, p.pad[1], p.kernel[1], p.stride[1])}};
    double *y = calloc((size_t)ref4_numel(ys), sizeof *y);
    for (int64_t pl = 0; pl < xs.d[0] * xs.d[1]; pl++)
        for (int64_t oh = 0; oh < ys.d[2]; oh++)
            for (int64_t ow = 0; ow < ys.d[3]; ow++) {
                int64_t h0, h1, w0, w1;
                double div;
                if (p.adaptive) {
                    h0 = (int64_t)floor((double)(oh * H) / (double)ys.d[2]);
                    h1 = (int64_t)ceil((double)((oh + 1) * H) / (double)ys.d[2]);
                    w0 = (int64_t)floor((double)(ow * W) / (double)ys.d[3]);
                    w1 = (int64_t)ceil((double)((ow + 1) * W) / (double)ys.d[3]);
                    div = (double)((h1 - h0) * (w1 - w0));
                } else {
                    h0 = oh * p.stride[0] - p.pad[0], w0 = ow * p.stride[1] - p.pad[1];
                    h1 = h0 + p.kernel[0], w1 = w0 + p.kernel[1];
                    div = (double)(p.kernel[0] * p.kernel[1]);   /* count_include_pad */
                    if (h0 < 0) h0 = 0;
                    if (w0 < 0) w0 = 0;
                    if (h1 > H) h1 = H;
                    if (w1 > W) w1 = W;
                    if (p.exclude_pad) div = (double)((h1 - h0) * (w1 - w0));
                }
                double acc = p.max ? -INFINITY : 0.0;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) {
                        double v = x[(pl * H + ih) * W + iw];
                        acc = p.max ? (v > acc ? v : acc) : acc + v;
                    }
                y[(pl * ys.d[2] + oh) * ys.d[3] + ow] = p.max ? acc : acc / div;
            }
    *out = y;
    return ys;
}

/* Batch norm of x [N, C, S] (logical NCHW, S = H W) by the given per-channel mean and variance. */
static inline void ref_batch_norm(ref4 xs, const double *x, const double *mean, const double *var, double eps,
                                  const double *w, const double *b, double *y) {
    const int64_t C = xs.d[1], S = xs.d[2] * xs.d[3];
    for (int64_t i = 0; i < ref4_numel(xs); i++) {
        int64_t c = (i / S) % C;
        y[i] = (x[i] - mean[c]) / sqrt(var[c] + eps) * (w ? w[c] : 1.0) + (b ? b[c] : 0.0);
    }
}

/* The batch's per-channel mean and biased variance. */
static inline void ref_moments(ref4 xs, const double *x, double *mean, double *var) {
    const int64_t C = xs.d[1], S = xs.d[2] * xs.d[3], M = xs.d[0] * S;
    for (int64_t c = 0; c < C; c++) {
        double s = 0.0, q = 0.0;
        for (int64_t n = 0; n < xs.d[0]; n++)
            for (int64_t k = 0; k < S; k++) s += x[(n * C + c) * S + k];
        mean[c] = s / (double)M;
        for (int64_t n = 0; n < xs.d[0]; n++)
            for (int64_t k = 0; k < S; k++) {
                double d = x[(n * C + c) * S + k] - mean[c];
                q += d * d;
            }
        var[c] = q / (double)M;
    }
}

#endif
