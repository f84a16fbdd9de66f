/* The ops of training: activation gradients, expand (a materialised broadcast), slice gradients and dropout
 * (cross-entropy is in cpu_cross_entropy.c). Float ops run on f32, f64, f16 and bf16 (halves compute in float and
 * round once on the store); expand and slice_grad move elements without looking at them and serve every dtype. */
#include <string.h>

#include "cpu_internal.h"
#include "cpu_tuning.h"
#include "rng.h"

#define LD_ID(v) (v)
#define ST_ID(v) (v)

#define SQRT1_2 0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794

/* ---------------------------------------------------------------- activation gradients */

/* act'(x). gelu is the exact form: Phi(x) + x * phi(x), with Phi written through erfc as the forward is. */
static inline float dgelu_f(float x) {
    return 0.5f * erfcf(-x * (float)SQRT1_2) + x * (float)INV_SQRT_2PI * expf(-0.5f * x * x);
}
static inline double dgelu_d(double x) { return 0.5 * erfc(-x * SQRT1_2) + x * INV_SQRT_2PI * exp(-0.5 * x * x); }
/* gelu_tanh'(x), torch's gelu_backward(approximate='tanh'): 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 k x^2)
 * with t = tanh(sqrt(2/pi) (x + k x^3)), k = 0.044715. */
#define SQRT_2_PI 0.79788456080286535588
#define GELU_KAPPA 0.044715
static inline float dgelu_tanh_f(float x) {
    const float x2 = x * x, t = tanhf((float)SQRT_2_PI * (x + (float)GELU_KAPPA * x2 * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * ((float)SQRT_2_PI * (1.0f + 3.0f * (float)GELU_KAPPA * x2));
}
static inline double dgelu_tanh_d(double x) {
    const double x2 = x * x, t = tanh(SQRT_2_PI * (x + GELU_KAPPA * x2 * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (SQRT_2_PI * (1.0 + 3.0 * GELU_KAPPA * x2));
}
static inline float dsilu_f(float x) {
    float s = sigmoid_f(x);
    return s + x * s * (1.0f - s);
}
static inline double dsilu_d(double x) {
    double s = sigmoid_d(x);
    return s + x * s * (1.0 - s);
}
static inline float dtanh_f(float x) {
    float t = tanhf(x);
    return 1.0f - t * t;
}
static inline double dtanh_d(double x) {
    double t = tanh(x);
    return 1.0 - t * t;
}
static inline float dsigmoid_f(float x) {
    float s = sigmoid_f(x);
    return s * (1.0f - s);
}
static inline double dsigmoid_d(double x) {
    double s = sigmoid_d(x);
    return s * (1.0 - s);
}

typedef void (*act_grad_fn)(void *o, const void *dy, const void *x, int64_t n);
/* The output may be dy's or x's own buffer (the planner reuses it in place): element i is read before it is
 * written, and there is no `restrict`. */
#define ACT_LOOP(T, C, LD, ST, EXPR)                                                                             \
    do {                                                                                                         \
        T *o = o_;                                                                                               \
        const T *g = dy_;                                                                                        \
        const T *a = x_;                                                                                         \
        DEFT_OMP(parallel for schedule(static) if (n > DEFT_CPU_PAR_MIN / 4))                                    \
        for (int64_t i = 0; i < n; i++) {                                                                        \
            C dy = LD(g[i]), x = LD(a[i]);                                                                       \
            o[i] = ST(EXPR);                                                                                     \
        }                                                                                                        \
    } while (0)

/* EXPR_F is the float form (f32, f16, bf16), EXPR_D the double form (f64); both read dy and x. */
#define DEFINE_ACT_GRAD(op, EXPR_F, EXPR_D)                                                                      \
    static void op##_f32(void *o_, const void *dy_, const void *x_, int64_t n) {                                 \
        ACT_LOOP(float, float, LD_ID, ST_ID, EXPR_F);                                                            \
    }                                                                                                            \
    static void op##_f64(void *o_, const void *dy_, const void *x_, int64_t n) {                                 \
        ACT_LOOP(double, double, LD_ID, ST_ID, EXPR_D);                                                          \
    }                                                                                                            \
    static void op##_f16(void *o_, const void *dy_, const void *x_, int64_t n) {                                 \
        ACT_LOOP(uint16_t, float, deft_half_unpack, deft_half_pack, EXPR_F);                                     \
    }                                                                                                            \
    static void op##_bf16(void *o_, const void *dy_, const void *x_, int64_t n) {                                \
        ACT_LOOP(uint16_t, float, deft_bf16_unpack, deft_bf16_pack, EXPR_F);                                     \
    }

/* relu'(0) = 0, and x <= 0 rather than x > 0 so that a NaN input passes dy on, as torch's threshold_backward. */
DEFINE_ACT_GRAD(relu_grad, x <= 0.0f ? 0.0f : dy, x <= 0.0 ? 0.0 : dy)
DEFINE_ACT_GRAD(gelu_grad, dy * dgelu_f(x), dy * dgelu_d(x))
DEFINE_ACT_GRAD(silu_grad, dy * dsilu_f(x), dy * dsilu_d(x))
DEFINE_ACT_GRAD(tanh_grad, dy * dtanh_f(x), dy * dtanh_d(x))
DEFINE_ACT_GRAD(sigmoid_grad, dy * dsigmoid_f(x), dy * dsigmoid_d(x))
DEFINE_ACT_GRAD(gelu_tanh_grad, dy * dgelu_tanh_f(x), dy * dgelu_tanh_d(x))

static const act_grad_fn act_grad_fns[6][4] = {
    {relu_grad_f32, relu_grad_f64, relu_grad_f16, relu_grad_bf16},
    {gelu_grad_f32, gelu_grad_f64, gelu_grad_f16, gelu_grad_bf16},
    {silu_grad_f32, silu_grad_f64, silu_grad_f16, silu_grad_bf16},
    {tanh_grad_f32, tanh_grad_f64, tanh_grad_f16, tanh_grad_bf16},
    {sigmoid_grad_f32, sigmoid_grad_f64, sigmoid_grad_f16, sigmoid_grad_bf16},
    {gelu_tanh_grad_f32, gelu_tanh_grad_f64, gelu_tanh_grad_f16, gelu_tanh_grad_bf16},
};

static int act_row_of(deft_op act) {
    switch (act) {
    case DEFT_OP_RELU: return 0;
    case DEFT_OP_GELU: return 1;
    case DEFT_OP_SILU: return 2;
    case DEFT_OP_TANH: return 3;
    case DEFT_OP_SIGMOID: return 4;
    case DEFT_OP_GELU_TANH: return 5;
    default: return -1;
    }
}

static int same_shape(const deft_tensor *a, const deft_tensor *b) {
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

deft_status deft_cpu_act_grad(const deft_tensor *n, void *out, const void *dy, const void *x) {
    const deft_tensor *tg = n->src[0], *tx = n->src[1];
    if (!deft_cpu_is_float(n->dtype)) return deft_cpu_dtype_error(n, n->dtype);
    if (tg->dtype != n->dtype || tx->dtype != n->dtype)
        return deft_set_error(DEFT_ERR_DTYPE, "act_grad: inputs are %s and %s, output %s",
                              deft_dtype_name(tg->dtype), deft_dtype_name(tx->dtype), deft_dtype_name(n->dtype));
    if (!same_shape(tg, n) || !same_shape(tx, n))
        return deft_set_error(DEFT_ERR_SHAPE, "act_grad: the gradient, the input and the output differ in shape");
    const int row = act_row_of(n->p.act);
    if (row < 0)
        return deft_set_error(DEFT_ERR_INVALID, "act_grad: %s is not an activation with a gradient kernel",
                              deft_op_name(n->p.act));
    /* Columns in deft_dtype order: f32, f64, f16, bf16. */
    act_grad_fns[row][n->dtype](out, dy, x, deft_shape_numel(n->ndim, n->shape));
    return DEFT_OK;
}

/* ---------------------------------------------------------------- expand */
/* One output row of len elements from `a` at stride s (0: one element repeated; 1: a straight copy). */
#define EXPAND_ROW(E)                                                                                            \
    do {                                                                                                         \
        E *o = (E *)out + row * len;                                                                             \
        const E *from = (const E *)a + off;                                                                      \
        if (s == 0) {                                                                                            \
            const E v = from[0];                                                                                 \
            for (int64_t j = 0; j < len; j++) o[j] = v;                                                          \
        } else {                                                                                                 \
            for (int64_t j = 0; j < len; j++) o[j] = from[j * s];                                                \
        }                                                                                                        \
    } while (0)

deft_status deft_cpu_expand(const deft_tensor *n, void *out, const void *a) {
    const deft_tensor *src = n->src[0];
    if (src->dtype != n->dtype)
        return deft_set_error(DEFT_ERR_DTYPE, "expand: input is %s, output %s", deft_dtype_name(src->dtype),
                              deft_dtype_name(n->dtype));
    if ((unsigned)n->dtype >= DEFT_DTYPE_COUNT) return deft_cpu_dtype_error(n, n->dtype);
    deft_status shape_ok = deft_check_expand_shape(src, n);
    if (shape_ok != DEFT_OK) return shape_ok;
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    if (total == 0) return DEFT_OK;
    const size_t esz = deft_dtype_size(n->dtype);
    int64_t shape[DEFT_MAX_DIMS], strs[1][DEFT_MAX_DIMS];
    memcpy(shape, n->shape, sizeof(int64_t) * (size_t)n->ndim);
    deft_broadcast_strides(src->ndim, src->shape, n->ndim, n->shape, strs[0]);
    const int nd = deft_cpu_coalesce(n->ndim, shape, 1, strs);
    if (nd == 0) {
        memcpy(out, a, esz);
        return DEFT_OK;
    }
    const int64_t len = shape[nd - 1], rows = total / len, s = strs[0][nd - 1];
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && rows > 1))
    for (int64_t row = 0; row < rows; row++) {
        int64_t off = 0, r = row;
        for (int d = nd - 2; d >= 0 && r > 0; d--) {
            off += (r % shape[d]) * strs[0][d];
            r /= shape[d];
        }
        switch (esz) {
        case 2: EXPAND_ROW(uint16_t); break;
        case 4: EXPAND_ROW(uint32_t); break;
        default: EXPAND_ROW(uint64_t); break;
        }
    }
    return DEFT_OK;
}

/* ---------------------------------------------------------------- slice gradient */
/* The output, of the sliced tensor's shape, seen as [outer, L, inner] around the axis; dy is [outer, m, inner]. Row
 * (o, l) of `inner` elements is dy's row (o, (l - start) / step) where l is selected, zeros elsewhere. Every dtype's
 * zero is all zero bits. */
deft_status deft_cpu_slice_grad(const deft_tensor *n, void *out, const void *dy) {
    const deft_tensor *src = n->src[0];
    const int ax = n->p.slice.axis;
    const int64_t start = n->p.slice.start, step = n->p.slice.step;
    int ok = src->dtype == n->dtype && src->ndim == n->ndim && ax >= 0 && ax < n->ndim && start >= 0 && step > 0;
    for (int d = 0; ok && d < n->ndim; d++)
        if (d != ax && src->shape[d] != n->shape[d]) ok = 0;
    if (ok && src->shape[ax] > 0 && start + (src->shape[ax] - 1) * step >= n->shape[ax]) ok = 0;
    if (!ok) {
        char as[96], bs[96];
        return deft_set_error(DEFT_ERR_SHAPE, "slice_grad: %s %s does not fit %s %s at axis %d start %lld step %lld",
                              deft_dtype_name(src->dtype), deft_shape_str(src->ndim, src->shape, as, sizeof as),
                              deft_dtype_name(n->dtype), deft_shape_str(n->ndim, n->shape, bs, sizeof bs), ax,
                              (long long)start, (long long)step);
    }
    const size_t esz = deft_dtype_size(n->dtype);
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    if (total == 0) return DEFT_OK;
    const int64_t outer = deft_shape_numel(ax, n->shape), L = n->shape[ax], m = src->shape[ax];
    const int64_t inner = deft_shape_numel(n->ndim - ax - 1, n->shape + ax + 1);
    const int64_t rows = outer * L;
    const size_t rowb = (size_t)inner * esz;
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && rows > 1))
    for (int64_t r = 0; r < rows; r++) {
        const int64_t o = r / L, l = r % L, k = (l - start) / step;
        char *dst = (char *)out + (size_t)r * rowb;
        if (l >= start && (l - start) % step == 0 && k < m)
            memcpy(dst, (const char *)dy + (size_t)(o * m + k) * rowb, rowb);
        else
            memset(dst, 0, rowb);
    }
    return DEFT_OK;
}

/* ---------------------------------------------------------------- dropout */
/* Element i is kept when uniform01(key, i) >= p, key mixing the node's seed with the run count: the CUDA kernel
 * draws the same numbers, so both backends drop the same elements. Kept values are x * (1 / (1 - p)), computed in the
 * compute type (float for f32 and halves) with the scale rounded to it, as torch does. In place is safe. */
#define DROPOUT_LOOP(T, C, LD, ST)                                                                               \
    do {                                                                                                         \
        T *o = out;                                                                                              \
        const T *a = x;                                                                                          \
        const C sc = (C)scale;                                                                                   \
        DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN / 8))                                  \
        for (int64_t i = 0; i < cnt; i++) {                                                                      \
            const C v = LD(a[i]);                                                                                \
            o[i] = deft_rng_uniform01(key, (uint64_t)i) >= p ? ST(v * sc) : ST((C)0);                            \
        }                                                                                                        \
    } while (0)

deft_status deft_cpu_dropout(const deft_tensor *n, void *out, const void *x) {
    const deft_tensor *src = n->src[0];
    if (!deft_cpu_is_float(n->dtype)) return deft_cpu_dtype_error(n, n->dtype);
    if (src->dtype != n->dtype || !same_shape(src, n))
        return deft_set_error(DEFT_ERR_SHAPE, "dropout: the input and the output differ in dtype or shape");
    const double p = n->p.dropout.p;
    if (!(p >= 0.0 && p < 1.0)) return deft_set_error(DEFT_ERR_INVALID, "dropout: probability %g is not in [0, 1)", p);
    const uint64_t key = deft_rng_mix(n->p.dropout.seed ^ deft_rng_mix(n->p.dropout.run));
    const double scale = 1.0 / (1.0 - p);
    const int64_t cnt = deft_shape_numel(n->ndim, n->shape);
    switch (n->dtype) {
    case DEFT_F32: DROPOUT_LOOP(float, float, LD_ID, ST_ID); break;
    case DEFT_F64: DROPOUT_LOOP(double, double, LD_ID, ST_ID); break;
    case DEFT_F16: DROPOUT_LOOP(uint16_t, float, deft_half_unpack, deft_half_pack); break;
    default: DROPOUT_LOOP(uint16_t, float, deft_bf16_unpack, deft_bf16_pack); break;
    }
    return DEFT_OK;
}
