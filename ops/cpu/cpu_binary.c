/* Broadcasting binary ops (add, sub, mul, div, maximum), comparisons (eq, gt, ge) and tensor-scalar ops, on every
 * dtype. */
#include <string.h>

#include "cpu_internal.h"

/* ---- element access per dtype: storage type T, compute type C, load LD and store ST ---- */
#define LD_ID(v) (v)
#define ST_ID(v) (v)
#define LD_I32(v) ((int64_t)(v))
#define ST_I32(v) deft_cpu_wrap_i32(v)

/* MAXIMUM propagates NaN from either side, as torch.maximum: x != x is the NaN test that also vectorises. */
#define MAX_F(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))
#define MAX_I(x, y) ((x) > (y) ? (x) : (y))

/* ---- binary: one row function per (op, dtype); sa/sb are the inputs' strides along the row (0 or 1 almost
 * always, so those cases get loops the compiler can vectorise) ---- */
typedef void (*bin_row_fn)(void *o, const void *a, int64_t sa, const void *b, int64_t sb, int64_t n);
/* No `restrict`: the output may be an input's own buffer (in-place reuse by the planner), which these loops allow
 * because element i is read before it is written; the compiler still vectorises behind a runtime overlap check. */

#define DEFINE_BIN_ROW(name, T, C, LD, ST, EXPR)                                                                 \
    static void name(void *o_, const void *a_, int64_t sa, const void *b_, int64_t sb, int64_t n) {              \
        T *o = o_;                                                                                               \
        const T *a = a_;                                                                                         \
        const T *b = b_;                                                                                         \
        if (sa == 1 && sb == 1) {                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                                    \
                C x = LD(a[i]), y = LD(b[i]);                                                                    \
                o[i] = ST(EXPR);                                                                                 \
            }                                                                                                    \
        } else if (sa == 1 && sb == 0) {                                                                         \
            const C y = LD(b[0]);                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                                    \
                C x = LD(a[i]);                                                                                  \
                o[i] = ST(EXPR);                                                                                 \
            }                                                                                                    \
        } else if (sa == 0 && sb == 1) {                                                                         \
            const C x = LD(a[0]);                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                                    \
                C y = LD(b[i]);                                                                                  \
                o[i] = ST(EXPR);                                                                                 \
            }                                                                                                    \
        } else {                                                                                                 \
            for (int64_t i = 0; i < n; i++) {                                                                    \
                C x = LD(a[i * sa]), y = LD(b[i * sb]);                                                          \
                o[i] = ST(EXPR);                                                                                 \
            }                                                                                                    \
        }                                                                                                        \
    }

#define DEFINE_BIN_FLOAT(op, EXPR)                                                                               \
    DEFINE_BIN_ROW(op##_f32, float, float, LD_ID, ST_ID, EXPR)                                                   \
    DEFINE_BIN_ROW(op##_f64, double, double, LD_ID, ST_ID, EXPR)                                                 \
    DEFINE_BIN_ROW(op##_f16, uint16_t, float, deft_half_unpack, deft_half_pack, EXPR)                            \
    DEFINE_BIN_ROW(op##_bf16, uint16_t, float, deft_bf16_unpack, deft_bf16_pack, EXPR)

DEFINE_BIN_FLOAT(add, x + y)
DEFINE_BIN_FLOAT(sub, x - y)
DEFINE_BIN_FLOAT(mul, x * y)
DEFINE_BIN_FLOAT(div, x / y)
DEFINE_BIN_FLOAT(maximum, MAX_F(x, y))
/* int32 operands widened to int64 cannot overflow in +, - or *; the result wraps as torch's does. */
DEFINE_BIN_ROW(add_i32, int32_t, int64_t, LD_I32, ST_I32, x + y)
DEFINE_BIN_ROW(sub_i32, int32_t, int64_t, LD_I32, ST_I32, x - y)
DEFINE_BIN_ROW(mul_i32, int32_t, int64_t, LD_I32, ST_I32, x * y)
DEFINE_BIN_ROW(maximum_i32, int32_t, int64_t, LD_I32, ST_I32, MAX_I(x, y))
/* Comparisons give 1 or 0 in the operands' dtype; any comparison with NaN is false, as in torch. Halves compare
 * their exact float values. */
DEFINE_BIN_FLOAT(eq, (float)(x == y))
DEFINE_BIN_FLOAT(gt, (float)(x > y))
DEFINE_BIN_FLOAT(ge, (float)(x >= y))
DEFINE_BIN_ROW(eq_i32, int32_t, int64_t, LD_I32, ST_I32, (int64_t)(x == y))
DEFINE_BIN_ROW(gt_i32, int32_t, int64_t, LD_I32, ST_I32, (int64_t)(x > y))
DEFINE_BIN_ROW(ge_i32, int32_t, int64_t, LD_I32, ST_I32, (int64_t)(x >= y))

/* Indexed [bin_row_of(op)][dtype]; NULL where the op does not exist for the dtype. */
static const bin_row_fn bin_rows[8][DEFT_DTYPE_COUNT] = {
    {add_f32, add_f64, add_f16, add_bf16, add_i32},
    {sub_f32, sub_f64, sub_f16, sub_bf16, sub_i32},
    {mul_f32, mul_f64, mul_f16, mul_bf16, mul_i32},
    {div_f32, div_f64, div_f16, div_bf16, NULL},
    {maximum_f32, maximum_f64, maximum_f16, maximum_bf16, maximum_i32},
    {eq_f32, eq_f64, eq_f16, eq_bf16, eq_i32},
    {gt_f32, gt_f64, gt_f16, gt_bf16, gt_i32},
    {ge_f32, ge_f64, ge_f16, ge_bf16, ge_i32},
};

/* The row of bin_rows for a binary op, or -1. */
static int bin_row_of(deft_op op) {
    switch (op) {
    case DEFT_OP_ADD: return 0;
    case DEFT_OP_SUB: return 1;
    case DEFT_OP_MUL: return 2;
    case DEFT_OP_DIV: return 3;
    case DEFT_OP_MAXIMUM: return 4;
    case DEFT_OP_EQ: return 5;
    case DEFT_OP_GT: return 6;
    case DEFT_OP_GE: return 7;
    default: return -1;
    }
}

deft_status deft_cpu_binary(const deft_tensor *n, void *out, const void *a, const void *b) {
    const deft_tensor *ta = n->src[0], *tb = n->src[1];
    if ((unsigned)n->dtype >= DEFT_DTYPE_COUNT || ta->dtype != n->dtype || tb->dtype != n->dtype)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: inputs are %s and %s, output %s (the CPU kernel wants one dtype)",
                              deft_op_name(n->op), deft_dtype_name(ta->dtype), deft_dtype_name(tb->dtype),
                              deft_dtype_name(n->dtype));
    const int which = bin_row_of(n->op);
    if (which < 0)
        return deft_set_error(DEFT_ERR_INVALID, "cpu binary: %s is not a binary op", deft_op_name(n->op));
    bin_row_fn fn = bin_rows[which][n->dtype];
    if (!fn) return deft_cpu_dtype_error(n, n->dtype);

    const size_t esz = deft_dtype_size(n->dtype);
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    const int64_t na = deft_shape_numel(ta->ndim, ta->shape), nb = deft_shape_numel(tb->ndim, tb->shape);
    if (total == 0) return DEFT_OK;

    /* Shape the output as rows of `len`; each input is either a whole row of the output's layout or a stride
     * pattern from the broadcast. Equal shapes and scalars collapse to one long row. */
    int64_t shape[DEFT_MAX_DIMS], strs[2][DEFT_MAX_DIMS];
    int nd;
    if (na == total && nb == total) {
        nd = 1, shape[0] = total, strs[0][0] = 1, strs[1][0] = 1;
    } else if (na == 1 || nb == 1) {
        nd = 1, shape[0] = total, strs[0][0] = na == 1 ? 0 : 1, strs[1][0] = nb == 1 ? 0 : 1;
    } else {
        memcpy(shape, n->shape, sizeof(int64_t) * (size_t)n->ndim);
        deft_broadcast_strides(ta->ndim, ta->shape, n->ndim, n->shape, strs[0]);
        deft_broadcast_strides(tb->ndim, tb->shape, n->ndim, n->shape, strs[1]);
        nd = deft_cpu_coalesce(n->ndim, shape, 2, strs);
    }
    if (nd == 0) {
        fn(out, a, 0, b, 0, 1);
        return DEFT_OK;
    }

    const int64_t len = shape[nd - 1], rows = total / len;
    const int64_t nseg = (len + DEFT_CPU_SEGMENT - 1) / DEFT_CPU_SEGMENT, tasks = rows * nseg;
    const int64_t sa = strs[0][nd - 1], sb = strs[1][nd - 1];
    DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && tasks > 1))
    for (int64_t t = 0; t < tasks; t++) {
        int64_t row = t / nseg, start = (t % nseg) * DEFT_CPU_SEGMENT;
        int64_t cnt = len - start < DEFT_CPU_SEGMENT ? len - start : DEFT_CPU_SEGMENT;
        int64_t oa = start * sa, ob = start * sb, r = row;
        for (int d = nd - 2; d >= 0 && r > 0; d--) {
            int64_t idx = r % shape[d];
            r /= shape[d];
            oa += idx * strs[0][d];
            ob += idx * strs[1][d];
        }
        fn((char *)out + (size_t)(row * len + start) * esz, (const char *)a + (size_t)oa * esz, sa,
           (const char *)b + (size_t)ob * esz, sb, cnt);
    }
    return DEFT_OK;
}

/* ---- tensor op scalar ---- */
typedef enum scalar_kind { SK_ADD, SK_RSUB, SK_MUL, SK_DIV, SK_RDIV, SK_MAX, SK_POW } scalar_kind;

static scalar_kind scalar_kind_of(deft_op op) {
    switch (op) {
    case DEFT_OP_ADD_SCALAR: return SK_ADD;
    case DEFT_OP_RSUB_SCALAR: return SK_RSUB;
    case DEFT_OP_MUL_SCALAR: return SK_MUL;
    case DEFT_OP_DIV_SCALAR: return SK_DIV;
    case DEFT_OP_RDIV_SCALAR: return SK_RDIV;
    case DEFT_OP_MAXIMUM_SCALAR: return SK_MAX;
    default: return SK_POW;
    }
}

/* pow(x, 2) is the common case (squares in losses and norms): x * x is exact-rounded and cheaper. */
static inline float pow_f(float x, float s) { return s == 2.0f ? x * x : powf(x, s); }
static inline double pow_d(double x, double s) { return s == 2.0 ? x * x : pow(x, s); }

/* One flat loop per (dtype, kind); torch computes a float tensor with a python scalar in the tensor's precision,
 * so f32/f16/bf16 use s rounded to float and float arithmetic. */
#define SCALAR_LOOP(T, C, LD, ST, EXPR)                                                                          \
    do {                                                                                                         \
        T *o = out;                                                                                              \
        const T *a = in;                                                                                         \
        DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN))                                      \
        for (int64_t i = 0; i < cnt; i++) {                                                                      \
            C x = LD(a[i]);                                                                                      \
            o[i] = ST(EXPR);                                                                                     \
        }                                                                                                        \
    } while (0)

#define SCALAR_SWITCH(T, C, LD, ST, MAXF, POWF)                                                                  \
    do {                                                                                                         \
        const C y = (C)s;                                                                                        \
        switch (kind) {                                                                                          \
        case SK_ADD: SCALAR_LOOP(T, C, LD, ST, x + y); break;                                                    \
        case SK_RSUB: SCALAR_LOOP(T, C, LD, ST, y - x); break;                                                   \
        case SK_MUL: SCALAR_LOOP(T, C, LD, ST, x * y); break;                                                    \
        case SK_DIV: SCALAR_LOOP(T, C, LD, ST, x / y); break;                                                    \
        case SK_RDIV: SCALAR_LOOP(T, C, LD, ST, y / x); break;                                                   \
        case SK_MAX: SCALAR_LOOP(T, C, LD, ST, MAXF(x, y)); break;                                               \
        case SK_POW: SCALAR_LOOP(T, C, LD, ST, POWF(x, y)); break;                                               \
        }                                                                                                        \
    } while (0)

static void scalar_i32(scalar_kind kind, double s, int32_t *o, const int32_t *a, int64_t cnt) {
    /* An integral scalar keeps integer semantics (wrapping, exact); any other goes through double and truncates
     * toward zero, as a cast back to i32 would. */
    if (s == floor(s) && fabs(s) < 9007199254740992.0 && kind != SK_DIV && kind != SK_RDIV && kind != SK_POW) {
        const int64_t y = (int64_t)s;
        DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN))
        for (int64_t i = 0; i < cnt; i++) {
            int64_t x = a[i], r;
            switch (kind) {
            case SK_ADD: r = (int64_t)((uint64_t)x + (uint64_t)y); break;
            case SK_RSUB: r = (int64_t)((uint64_t)y - (uint64_t)x); break;
            case SK_MUL: r = (int64_t)((uint64_t)x * (uint64_t)y); break;
            default: r = x > y ? x : y; break;
            }
            o[i] = deft_cpu_wrap_i32(r);
        }
        return;
    }
    DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < cnt; i++) {
        double x = a[i], r;
        switch (kind) {
        case SK_ADD: r = x + s; break;
        case SK_RSUB: r = s - x; break;
        case SK_MUL: r = x * s; break;
        case SK_DIV: r = x / s; break;
        case SK_RDIV: r = s / x; break;
        case SK_MAX: r = MAX_F(x, s); break;
        default: r = pow(x, s); break;
        }
        o[i] = deft_f64_to_i32(r);
    }
}

deft_status deft_cpu_scalar(const deft_tensor *n, void *out, const void *in) {
    const deft_tensor *ta = n->src[0];
    if (ta->dtype != n->dtype)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: input is %s, output %s", deft_op_name(n->op),
                              deft_dtype_name(ta->dtype), deft_dtype_name(n->dtype));
    const scalar_kind kind = scalar_kind_of(n->op);
    const double s = n->p.scalar;
    const int64_t cnt = deft_shape_numel(n->ndim, n->shape);
    switch (n->dtype) {
    case DEFT_F32: SCALAR_SWITCH(float, float, LD_ID, ST_ID, MAX_F, pow_f); break;
    case DEFT_F64: SCALAR_SWITCH(double, double, LD_ID, ST_ID, MAX_F, pow_d); break;
    case DEFT_F16: SCALAR_SWITCH(uint16_t, float, deft_half_unpack, deft_half_pack, MAX_F, pow_f); break;
    case DEFT_BF16: SCALAR_SWITCH(uint16_t, float, deft_bf16_unpack, deft_bf16_pack, MAX_F, pow_f); break;
    case DEFT_I32:
        if (kind == SK_RDIV || kind == SK_POW) return deft_cpu_dtype_error(n, n->dtype);
        scalar_i32(kind, s, out, in, cnt);
        break;
    default: return deft_cpu_dtype_error(n, n->dtype);
    }
    return DEFT_OK;
}
