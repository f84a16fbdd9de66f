/* Unary elementwise ops and dtype casts. f16/bf16 compute in float and round once on the store. */
#include <string.h>

#include "cpu_internal.h"

#define SQRT1_2 0.70710678118654752440
#define SQRT_2_PI 0.79788456080286535588   /* sqrt(2 / pi) */
#define GELU_KAPPA 0.044715


typedef void (*unary_fn)(void *o, const void *a, int64_t n);
/* Like the binary loops, safe in place (out == in): no `restrict`. */

#define UNARY_LOOP(T, C, LD, ST, EXPR)                                                                           \
    do {                                                                                                         \
        T *o = o_;                                                                                               \
        const T *a = a_;                                                                                         \
        DEFT_OMP(parallel for schedule(static) if (n > DEFT_CPU_PAR_MIN))                                        \
        for (int64_t i = 0; i < n; i++) {                                                                        \
            C x = LD(a[i]);                                                                                      \
            o[i] = ST(EXPR);                                                                                     \
        }                                                                                                        \
    } while (0)

#define LD_ID(v) (v)
#define ST_ID(v) (v)

/* EXPR_F is the float form (f32, f16, bf16), EXPR_D the double form (f64); both read x. */
#define DEFINE_UNARY(op, EXPR_F, EXPR_D)                                                                         \
    static void op##_f32(void *o_, const void *a_, int64_t n) { UNARY_LOOP(float, float, LD_ID, ST_ID, EXPR_F); } \
    static void op##_f64(void *o_, const void *a_, int64_t n) {                                                  \
        UNARY_LOOP(double, double, LD_ID, ST_ID, EXPR_D);                                                        \
    }                                                                                                            \
    static void op##_f16(void *o_, const void *a_, int64_t n) {                                                  \
        UNARY_LOOP(uint16_t, float, deft_half_unpack, deft_half_pack, EXPR_F);                                   \
    }                                                                                                            \
    static void op##_bf16(void *o_, const void *a_, int64_t n) {                                                 \
        UNARY_LOOP(uint16_t, float, deft_bf16_unpack, deft_bf16_pack, EXPR_F);                                   \
    }

DEFINE_UNARY(neg, -x, -x)
DEFINE_UNARY(exp, expf(x), exp(x))
DEFINE_UNARY(log, logf(x), log(x))
DEFINE_UNARY(sqrt, sqrtf(x), sqrt(x))
DEFINE_UNARY(rsqrt, 1.0f / sqrtf(x), 1.0 / sqrt(x))
DEFINE_UNARY(tanh, tanhf(x), tanh(x))
DEFINE_UNARY(sigmoid, sigmoid_f(x), sigmoid_d(x))
/* x < 0 ? 0 : x rather than x > 0 ? x : 0, so that NaN passes through as in torch. */
DEFINE_UNARY(relu, x < 0.0f ? 0.0f : x, x < 0.0 ? 0.0 : x)
/* 1 + erf(t) = erfc(-t): the erfc form keeps its precision where erf(t) nears -1 (x below about -2). */
DEFINE_UNARY(gelu, 0.5f * x * erfcf(-x * (float)SQRT1_2), 0.5 * x * erfc(-x * SQRT1_2))
DEFINE_UNARY(silu, x * sigmoid_f(x), x * sigmoid_d(x))
/* torch's approximate='tanh' with its order of operations: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
DEFINE_UNARY(gelu_tanh, 0.5f * x * (1.0f + tanhf((float)SQRT_2_PI * (x + (float)GELU_KAPPA * (x * x * x)))),
             0.5 * x * (1.0 + tanh(SQRT_2_PI * (x + GELU_KAPPA * (x * x * x)))))

#define LD_I32(v) ((int64_t)(v))
static void neg_i32(void *o_, const void *a_, int64_t n) { UNARY_LOOP(int32_t, int64_t, LD_I32, deft_cpu_wrap_i32, -x); }
static void relu_i32(void *o_, const void *a_, int64_t n) {
    UNARY_LOOP(int32_t, int32_t, LD_ID, ST_ID, x < 0 ? 0 : x);
}

/* Indexed [op - DEFT_OP_NEG][dtype]; NULL where the op does not exist for the dtype. */
static const unary_fn unary_fns[11][DEFT_DTYPE_COUNT] = {
    {neg_f32, neg_f64, neg_f16, neg_bf16, neg_i32},
    {exp_f32, exp_f64, exp_f16, exp_bf16, NULL},
    {log_f32, log_f64, log_f16, log_bf16, NULL},
    {sqrt_f32, sqrt_f64, sqrt_f16, sqrt_bf16, NULL},
    {rsqrt_f32, rsqrt_f64, rsqrt_f16, rsqrt_bf16, NULL},
    {tanh_f32, tanh_f64, tanh_f16, tanh_bf16, NULL},
    {sigmoid_f32, sigmoid_f64, sigmoid_f16, sigmoid_bf16, NULL},
    {relu_f32, relu_f64, relu_f16, relu_bf16, relu_i32},
    {gelu_f32, gelu_f64, gelu_f16, gelu_bf16, NULL},
    {silu_f32, silu_f64, silu_f16, silu_bf16, NULL},
    {gelu_tanh_f32, gelu_tanh_f64, gelu_tanh_f16, gelu_tanh_bf16, NULL},
};

deft_status deft_cpu_unary(const deft_tensor *n, void *out, const void *a) {
    const deft_tensor *ta = n->src[0];
    if ((unsigned)n->dtype >= DEFT_DTYPE_COUNT || ta->dtype != n->dtype)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: input is %s, output %s", deft_op_name(n->op),
                              deft_dtype_name(ta->dtype), deft_dtype_name(n->dtype));
    unary_fn fn = unary_fns[n->op - DEFT_OP_NEG][n->dtype];
    if (!fn) return deft_cpu_dtype_error(n, n->dtype);
    fn(out, a, deft_shape_numel(n->ndim, n->shape));
    return DEFT_OK;
}

/* ---- casts ---- */
#define CAST_LOOP(TO, TI, EXPR)                                                                                  \
    do {                                                                                                         \
        TO *o = out;                                                                                             \
        const TI *a = in;                                                                                        \
        DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN))                                      \
        for (int64_t i = 0; i < cnt; i++) o[i] = EXPR;                                                           \
    } while (0)

deft_status deft_cpu_cast(const deft_tensor *n, void *out, const void *in) {
    const deft_dtype from = n->src[0]->dtype, to = n->dtype;
    const int64_t cnt = deft_shape_numel(n->ndim, n->shape);
    if ((unsigned)from >= DEFT_DTYPE_COUNT) return deft_cpu_dtype_error(n, from);
    if ((unsigned)to >= DEFT_DTYPE_COUNT) return deft_cpu_dtype_error(n, to);
    if (from == to) {
        memcpy(out, in, (size_t)cnt * deft_dtype_size(to));
        return DEFT_OK;
    }
    /* The common mixed-precision casts get typed loops; the rest go through double, which holds every value of
     * every dtype exactly, so only the final store rounds. */
    if (from == DEFT_F32 && to == DEFT_F64) CAST_LOOP(double, float, (double)a[i]);
    else if (from == DEFT_F64 && to == DEFT_F32) CAST_LOOP(float, double, (float)a[i]);
    else if (from == DEFT_F32 && to == DEFT_F16) CAST_LOOP(uint16_t, float, deft_half_pack(a[i]));
    else if (from == DEFT_F16 && to == DEFT_F32) CAST_LOOP(float, uint16_t, deft_half_unpack(a[i]));
    else if (from == DEFT_F32 && to == DEFT_BF16) CAST_LOOP(uint16_t, float, deft_bf16_pack(a[i]));
    else if (from == DEFT_BF16 && to == DEFT_F32) CAST_LOOP(float, uint16_t, deft_bf16_unpack(a[i]));
    else if (from == DEFT_F32 && to == DEFT_I32) CAST_LOOP(int32_t, float, deft_f64_to_i32(a[i]));
    else if (from == DEFT_I32 && to == DEFT_F32) CAST_LOOP(float, int32_t, (float)a[i]);
    else {
        DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN))
        for (int64_t i = 0; i < cnt; i++) deft_store_from_f64(out, to, i, deft_load_as_f64(in, from, i));
    }
    return DEFT_OK;
}
