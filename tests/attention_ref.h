/* A plain attention reference for tests/test_attention.c and tests/cuda_test_attention.c: the T x T scores and
 * probabilities materialised per (batch, head), in double, and the backward pass written from them. Layout
 * [B, H, T, D] row-major, as deft_attention's. */
#ifndef DEFT_TEST_ATTENTION_REF_H
#define DEFT_TEST_ATTENTION_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct att_shape {
    int64_t b, h, t, d;
    int causal;
    double scale;   /* 0: 1/sqrt(d) */
} att_shape;

static inline double att_scale(const att_shape *s) { return s->scale != 0.0 ? s->scale : 1.0 / sqrt((double)s->d); }
static inline int64_t att_numel(const att_shape *s) { return s->b * s->h * s->t * s->d; }

/* p[i][j] of one (batch, head) at offset base: softmax over keys of scale * q_i . k_j, 0 where masked. */
static inline void att_ref_probs(const att_shape *s, const double *q, const double *k, int64_t base, double *p) {
    const int64_t t = s->t, d = s->d;
    for (int64_t i = 0; i < t; i++) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < t; j++) {
            double v = -INFINITY;
            if (!(s->causal && j > i)) {
                v = 0.0;
                for (int64_t c = 0; c < d; c++) v += q[base + i * d + c] * k[base + j * d + c];
                v *= att_scale(s);
            }
            p[i * t + j] = v;
            if (v > mx) mx = v;
        }
        for (int64_t j = 0; j < t; j++) {
            p[i * t + j] = p[i * t + j] == -INFINITY ? 0.0 : exp(p[i * t + j] - mx);
            sum += p[i * t + j];
        }
        for (int64_t j = 0; j < t; j++) p[i * t + j] /= sum;
    }
}

/* out = p v (loops in memory order: the reference runs at T = 1000 in the GPU test) */
static inline void att_ref_forward(const att_shape *s, const double *q, const double *k, const double *v,
                                   double *out) {
    const int64_t t = s->t, d = s->d;
    double *p = malloc((size_t)(t * t) * sizeof *p);
    for (int64_t bh = 0; bh < s->b * s->h; bh++) {
        const int64_t base = bh * t * d;
        att_ref_probs(s, q, k, base, p);
        for (int64_t i = 0; i < t; i++) {
            double *o = out + base + i * d;
            for (int64_t c = 0; c < d; c++) o[c] = 0.0;
            for (int64_t j = 0; j < t; j++)
                for (int64_t c = 0; c < d; c++) o[c] += p[i * t + j] * v[base + j * d + c];
        }
    }
    free(p);
}

/* dq, dk, dv for the output gradient dout: dp = dout v^T, ds = p * (dp - rowsum(p * dp)), dq = scale ds k,
 * dk = scale ds^T q, dv = p^T dout. */
static inline void att_ref_backward(const att_shape *s, const double *q, const double *k, const double *v,
                                    const double *dout, double *dq, double *dk, double *dv) {
    const int64_t t = s->t, d = s->d, n = s->b * s->h * t * d;
    const double sc = att_scale(s);
    double *p = malloc((size_t)(t * t) * sizeof *p), *ds = malloc((size_t)(t * t) * sizeof *ds);
    for (int64_t e = 0; e < n; e++) dq[e] = dk[e] = dv[e] = 0.0;
    for (int64_t bh = 0; bh < s->b * s->h; bh++) {
        const int64_t base = bh * t * d;
        att_ref_probs(s, q, k, base, p);
        for (int64_t i = 0; i < t; i++) {
            double row = 0.0;
            for (int64_t j = 0; j < t; j++) {
                double dp = 0.0;
                for (int64_t c = 0; c < d; c++) dp += dout[base + i * d + c] * v[base + j * d + c];
                ds[i * t + j] = dp;
                row += p[i * t + j] * dp;
            }
            for (int64_t j = 0; j < t; j++) ds[i * t + j] = p[i * t + j] * (ds[i * t + j] - row);
        }
        for (int64_t i = 0; i < t; i++)
            for (int64_t j = 0; j < t; j++) {
                const double pij = p[i * t + j], dsij = sc * ds[i * t + j];
                if (pij == 0.0) continue;   /* masked (or underflowed): ds is 0 too */
                const double *qi = q + base + i * d, *kj = k + base + j * d, *doi = dout + base + i * d;
                double *dqi = dq + base + i * d, *dkj = dk + base + j * d, *dvj = dv + base + j * d;
                for (int64_t c = 0; c < d; c++) {
                    dqi[c] += dsij * kj[c];
                    dkj[c] += dsij * qi[c];
                    dvj[c] += pij * doi[c];
                }
            }
    }
    free(p);
    free(ds);
}

/* The largest |got - want| over the largest |want| (at least 0.01, so that a gradient that is exactly zero, as dq
 * and dk are at T = 1, compares absolutely): a relative error for the whole tensor. */
static inline double att_rel_err(const double *got, const double *want, int64_t n) {
    double worst = 0.0, mag = 0.01;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(want[i]) > mag) mag = fabs(want[i]);
        const double e = fabs(got[i] - want[i]);
        if (!(e <= worst)) worst = e;   /* NaN sticks */
    }
    return worst / mag;
}

#endif
