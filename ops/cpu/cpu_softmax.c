/* Softmax and log-softmax along one axis, on floating dtypes. The row maximum is subtracted before exp, so logits
 * of any size stay finite; the sum of exponentials accumulates in double. f16/bf16 compute in float. */
#include "cpu_internal.h"
#include "cpu_tuning.h"

/* Columns handled together when the axis is not the innermost one: the passes then read contiguous rows. How many is
 * cpu_tuning.h's. */
#define SM_CHUNK DEFT_CPU_SOFTMAX_CHUNK

/* The input viewed as [outer, len, inner] around the axis. Three passes per row: the maximum, the sum of
 * exponentials, the output. When the output type is the compute type (f32, f64) the exponentials of pass two are
 * kept in the output and only scaled in pass three, which saves one exp per element; for halves that would round
 * them twice, so pass three recomputes them. SCRATCH is 1 for the former. */
#define DEFINE_SOFTMAX(name, T, C, LD, ST, EXPF, SCRATCH)                                                        \
    /* inner == 1: each row is contiguous. */                                                                    \
    static void name##_rows(const T *x, T *y, int64_t outer, int64_t len, int logsm) {                           \
        DEFT_OMP(parallel for schedule(static) if (outer * len > DEFT_CPU_PAR_MIN / 4 && outer > 1))             \
        for (int64_t o = 0; o < outer; o++) {                                                                    \
            const T *xs = x + o * len;                                                                           \
            T *ys = y + o * len;                                                                                 \
            C m = -INFINITY;                                                                                     \
            for (int64_t l = 0; l < len; l++) {                                                                  \
                C v = LD(xs[l]);                                                                                 \
                /* NaN wins, so a row holding NaN comes out all NaN as in torch. */                             \
                m = (v > m || v != v) ? v : m;                                                                   \
            }                                                                                                    \
            double s = 0.0;                                                                                      \
            if (SCRATCH && !logsm) {                                                                             \
                C *e = (C *)(void *)ys;                                                                          \
                for (int64_t l = 0; l < len; l++) {                                                              \
                    e[l] = EXPF(LD(xs[l]) - m);                                                                  \
                    s += (double)e[l];                                                                           \
                }                                                                                                \
                const C inv = (C)(1.0 / s);                                                                      \
                for (int64_t l = 0; l < len; l++) e[l] *= inv;                                                   \
                continue;                                                                                        \
            }                                                                                                    \
            for (int64_t l = 0; l < len; l++) s += (double)EXPF(LD(xs[l]) - m);                                 \
            if (logsm) {                                                                                         \
                const C lse = (C)log(s);                                                                         \
                for (int64_t l = 0; l < len; l++) ys[l] = ST(LD(xs[l]) - m - lse);                               \
            } else {                                                                                             \
                const C inv = (C)(1.0 / s);                                                                      \
                for (int64_t l = 0; l < len; l++) ys[l] = ST(EXPF(LD(xs[l]) - m) * inv);                         \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
    /* inner > 1: a task is (outer index, chunk of up to SM_CHUNK columns), so every pass reads contiguous       \
     * stretches of a row of the [len, inner] block and vectorises across columns. */                           \
    static void name##_cols(const T *x, T *y, int64_t outer, int64_t len, int64_t inner, int logsm) {            \
        const int64_t nchunk = (inner + SM_CHUNK - 1) / SM_CHUNK, tasks = outer * nchunk;                        \
        DEFT_OMP(parallel for schedule(static) if (outer * len * inner > DEFT_CPU_PAR_MIN / 4 && tasks > 1))     \
        for (int64_t t = 0; t < tasks; t++) {                                                                    \
            const int64_t o = t / nchunk, c0 = t % nchunk * SM_CHUNK;                                            \
            const int64_t nc = inner - c0 < SM_CHUNK ? inner - c0 : SM_CHUNK;                                    \
            const T *xs = x + o * len * inner + c0;                                                              \
            T *ys = y + o * len * inner + c0;                                                                    \
            C mx[SM_CHUNK], k[SM_CHUNK];                                                                         \
            double sum[SM_CHUNK];                                                                                \
            for (int64_t j = 0; j < nc; j++) mx[j] = -INFINITY, sum[j] = 0.0;                                    \
            for (int64_t l = 0; l < len; l++)                                                                    \
                for (int64_t j = 0; j < nc; j++) {                                                               \
                    C v = LD(xs[l * inner + j]);                                                                 \
                    mx[j] = (v > mx[j] || v != v) ? v : mx[j];                                                   \
                }                                                                                                \
            if (SCRATCH && !logsm) {                                                                             \
                C *e = (C *)(void *)ys;                                                                          \
                for (int64_t l = 0; l < len; l++)                                                                \
                    for (int64_t j = 0; j < nc; j++) {                                                           \
                        e[l * inner + j] = EXPF(LD(xs[l * inner + j]) - mx[j]);                                  \
                        sum[j] += (double)e[l * inner + j];                                                      \
                    }                                                                                            \
                for (int64_t j = 0; j < nc; j++) k[j] = (C)(1.0 / sum[j]);                                       \
                for (int64_t l = 0; l < len; l++)                                                                \
                    for (int64_t j = 0; j < nc; j++) e[l * inner + j] *= k[j];                                   \
                continue;                                                                                        \
            }                                                                                                    \
            for (int64_t l = 0; l < len; l++)                                                                    \
                for (int64_t j = 0; j < nc; j++) sum[j] += (double)EXPF(LD(xs[l * inner + j]) - mx[j]);          \
            /* k is log(sum) for log_softmax and 1 / sum for softmax. */                                         \
            for (int64_t j = 0; j < nc; j++) k[j] = logsm ? (C)log(sum[j]) : (C)(1.0 / sum[j]);                  \
            for (int64_t l = 0; l < len; l++)                                                                    \
                for (int64_t j = 0; j < nc; j++) {                                                               \
                    C v = LD(xs[l * inner + j]) - mx[j];                                                         \
                    ys[l * inner + j] = ST(logsm ? v - k[j] : EXPF(v) * k[j]);                                   \
                }                                                                                                \
        }                                                                                                        \
    }                                                                                                            \
    static void name(const T *x, T *y, int64_t outer, int64_t len, int64_t inner, int logsm) {                   \
        if (inner == 1) name##_rows(x, y, outer, len, logsm);                                                    \
        else name##_cols(x, y, outer, len, inner, logsm);                                                        \
    }

#define LD_ID(v) (v)
#define ST_ID(v) (v)

DEFINE_SOFTMAX(softmax_f32, float, float, LD_ID, ST_ID, expf, 1)
DEFINE_SOFTMAX(softmax_f64, double, double, LD_ID, ST_ID, exp, 1)
DEFINE_SOFTMAX(softmax_f16, uint16_t, float, deft_half_unpack, deft_half_pack, expf, 0)
DEFINE_SOFTMAX(softmax_bf16, uint16_t, float, deft_bf16_unpack, deft_bf16_pack, expf, 0)

deft_status deft_cpu_softmax(const deft_tensor *n, void *out, const void *in) {
    const deft_tensor *src = n->src[0];
    const deft_dtype dt = n->dtype;
    if (!deft_cpu_is_float(dt)) return deft_cpu_dtype_error(n, dt);
    if (src->dtype != dt)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: input is %s, output %s", deft_op_name(n->op),
                              deft_dtype_name(src->dtype), deft_dtype_name(dt));
    const int ax = n->p.axis;
    if (ax < 0 || ax >= src->ndim)
        return deft_set_error(DEFT_ERR_SHAPE, "%s: axis %d out of range for rank %d", deft_op_name(n->op), ax,
                              src->ndim);
    const int64_t outer = deft_shape_numel(ax, src->shape), len = src->shape[ax];
    const int64_t inner = deft_shape_numel(src->ndim - ax - 1, src->shape + ax + 1);
    if (outer * len * inner == 0) return DEFT_OK;
    const int logsm = n->op == DEFT_OP_LOG_SOFTMAX;
    switch (dt) {
    case DEFT_F32: softmax_f32(in, out, outer, len, inner, logsm); break;
    case DEFT_F64: softmax_f64(in, out, outer, len, inner, logsm); break;
    case DEFT_F16: softmax_f16(in, out, outer, len, inner, logsm); break;
    default: softmax_bf16(in, out, outer, len, inner, logsm); break;
    }
    return DEFT_OK;
}
