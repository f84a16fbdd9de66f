/* Max, average and adaptive average pooling and their gradients on the CPU, one (image, channel) plane per thread,
 * so that gradients scatter without races. f32 and f64, read and summed as double. */
#include <string.h>

#include "cpu_internal.h"

typedef struct pool_geom {
    int64_t planes, C, H, W, OH, OW;
    int64_t xsN, xsC, xsH, xsW;   /* strides of x (or dx), elements */
    int64_t ysN, ysC, ysH, ysW;   /* strides of y (or dy) */
} pool_geom;

/* One window along an axis: the input range [lo, hi) it covers, and its share of the average's divisor. */
typedef struct pool_win {
    int64_t lo, hi, count;
} pool_win;

static bool pool_is_grad(deft_op op) {
    return op == DEFT_OP_MAX_POOL2D_GRAD || op == DEFT_OP_AVG_POOL2D_GRAD || op == DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD;
}

static void pool_strides(int nhwc, int64_t C, int64_t H, int64_t W, int64_t *sN, int64_t *sC, int64_t *sH,
                         int64_t *sW) {
    *sN = C * H * W;
    *sC = nhwc ? 1 : H * W;
    *sH = nhwc ? W * C : W;
    *sW = nhwc ? C : 1;
}

static void pool_geometry(const deft_tensor *n, pool_geom *g) {
    const deft_tensor *x = pool_is_grad(n->op) ? n : n->src[0], *y = pool_is_grad(n->op) ? n->src[0] : n;
    const int nhwc = n->p.pool.layout == DEFT_NHWC;
    const int c = nhwc ? 3 : 1, h = nhwc ? 1 : 2, w = nhwc ? 2 : 3;
    g->C = x->shape[c], g->H = x->shape[h], g->W = x->shape[w];
    g->OH = y->shape[h], g->OW = y->shape[w];
    g->planes = x->shape[0] * g->C;
    pool_strides(nhwc, g->C, g->H, g->W, &g->xsN, &g->xsC, &g->xsH, &g->xsW);
    pool_strides(nhwc, g->C, g->OH, g->OW, &g->ysN, &g->ysC, &g->ysH, &g->ysW);
}

static pool_win pool_window(const deft_tensor *n, int axis, int64_t o, int64_t in_len, int64_t out_len) {
    if (n->op == DEFT_OP_ADAPTIVE_AVG_POOL2D || n->op == DEFT_OP_ADAPTIVE_AVG_POOL2D_GRAD) {
        const int64_t lo = o * in_len / out_len, hi = ((o + 1) * in_len + out_len - 1) / out_len;
        return (pool_win){lo, hi, hi - lo};
    }
    const int64_t start = o * n->p.pool.stride[axis] - n->p.pool.pad[axis];
    int64_t end = start + n->p.pool.kernel[axis];
    if (end > in_len + n->p.pool.pad[axis]) end = in_len + n->p.pool.pad[axis];
    const int64_t lo = start < 0 ? 0 : start, hi = end > in_len ? in_len : end;
    return (pool_win){lo, hi, n->p.pool.count_include_pad ? end - start : hi - lo};
}

static inline double pool_ld(const void *p, deft_dtype dt, int64_t i) {
    return dt == DEFT_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static inline void pool_st(void *p, deft_dtype dt, int64_t i, double v) {
    if (dt == DEFT_F32) ((float *)p)[i] = (float)v;
    else ((double *)p)[i] = v;
}

/* The offset in the plane of a window's maximum: the first in row-major order, or the last NaN (torch's rule). */
static int64_t pool_argmax(const pool_geom *g, const void *x, deft_dtype dt, int64_t base, pool_win wh, pool_win ww,
                           double *best) {
    int64_t at = wh.lo * g->xsH + ww.lo * g->xsW;
    *best = -INFINITY;
    for (int64_t ih = wh.lo; ih < wh.hi; ih++) {
        for (int64_t iw = ww.lo; iw < ww.hi; iw++) {
            const int64_t off = ih * g->xsH + iw * g->xsW;
            const double v = pool_ld(x, dt, base + off);
            if (v > *best || isnan(v)) *best = v, at = off;
        }
    }
    return at;
}

static double pool_window_sum(const pool_geom *g, const void *x, deft_dtype dt, int64_t base, pool_win wh,
                              pool_win ww) {
    double s = 0.0;
    for (int64_t ih = wh.lo; ih < wh.hi; ih++)
        for (int64_t iw = ww.lo; iw < ww.hi; iw++) s += pool_ld(x, dt, base + ih * g->xsH + iw * g->xsW);
    return s;
}

static void pool_forward_plane(const deft_tensor *n, const pool_geom *g, const void *x, void *y, int64_t plane) {
    const deft_dtype dt = n->dtype;
    const int64_t in = plane / g->C, c = plane % g->C;
    const int64_t xb = in * g->xsN + c * g->xsC, yb = in * g->ysN + c * g->ysC;
    for (int64_t oh = 0; oh < g->OH; oh++) {
        const pool_win wh = pool_window(n, 0, oh, g->H, g->OH);
        for (int64_t ow = 0; ow < g->OW; ow++) {
            const pool_win ww = pool_window(n, 1, ow, g->W, g->OW);
            double v;
            if (n->op == DEFT_OP_MAX_POOL2D) pool_argmax(g, x, dt, xb, wh, ww, &v);
            else v = pool_window_sum(g, x, dt, xb, wh, ww) / ((double)wh.count * (double)ww.count);
            pool_st(y, dt, yb + oh * g->ysH + ow * g->ysW, v);
        }
    }
}

/* dx of one plane (zeroed by the caller): each dy goes to its window's maximum, or spread over its window. */
static void pool_backward_plane(const deft_tensor *n, const pool_geom *g, const void *dy, const void *x, void *dx,
                                int64_t plane) {
    const deft_dtype dt = n->dtype;
    const int64_t in = plane / g->C, c = plane % g->C;
    const int64_t xb = in * g->xsN + c * g->xsC, yb = in * g->ysN + c * g->ysC;
    for (int64_t oh = 0; oh < g->OH; oh++) {
        const pool_win wh = pool_window(n, 0, oh, g->H, g->OH);
        for (int64_t ow = 0; ow < g->OW; ow++) {
            const pool_win ww = pool_window(n, 1, ow, g->W, g->OW);
            const double d = pool_ld(dy, dt, yb + oh * g->ysH + ow * g->ysW);
            if (n->op == DEFT_OP_MAX_POOL2D_GRAD) {
                double best;
                const int64_t at = xb + pool_argmax(g, x, dt, xb, wh, ww, &best);
                pool_st(dx, dt, at, pool_ld(dx, dt, at) + d);
                continue;
            }
            const double share = d / ((double)wh.count * (double)ww.count);   /* huge kernels: no int64 product */
            for (int64_t ih = wh.lo; ih < wh.hi; ih++) {
                for (int64_t iw = ww.lo; iw < ww.hi; iw++) {
                    const int64_t i = xb + ih * g->xsH + iw * g->xsW;
                    pool_st(dx, dt, i, pool_ld(dx, dt, i) + share);
                }
            }
        }
    }
}

deft_status deft_cpu_pool2d(const deft_tensor *n, void *out, const void *const *in) {
    if (n->dtype != DEFT_F32 && n->dtype != DEFT_F64) return deft_cpu_dtype_error(n, n->dtype);
    pool_geom g;
    pool_geometry(n, &g);
    const int64_t work = deft_shape_numel(n->ndim, n->shape);
    if (!pool_is_grad(n->op)) {
        DEFT_OMP(parallel for schedule(static) if (work > DEFT_CPU_PAR_MIN))
        for (int64_t p = 0; p < g.planes; p++) pool_forward_plane(n, &g, in[0], out, p);
        return DEFT_OK;
    }
    memset(out, 0, deft_tensor_bytes(n));
    const void *x = n->op == DEFT_OP_MAX_POOL2D_GRAD ? in[1] : NULL;
    DEFT_OMP(parallel for schedule(static) if (work > DEFT_CPU_PAR_MIN))
    for (int64_t p = 0; p < g.planes; p++) pool_backward_plane(n, &g, in[0], x, out, p);
    return DEFT_OK;
}
