/* Creation ops: full, arange, uniform, normal. Values are computed in double and rounded once to the dtype; random
 * values come from the counter-based generator in rng.h, indexed by flat position, so the CUDA backend produces
 * the same tensor. */
#include "cpu_internal.h"
#include "rng.h"

#define FILL(T, V)                                                                                               \
    do {                                                                                                         \
        T *o = out;                                                                                              \
        const T v = (V);                                                                                         \
        DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN))                                      \
        for (int64_t i = 0; i < cnt; i++) o[i] = v;                                                              \
    } while (0)

/* The value is rounded to the dtype once, as deft_cpu_store would, then copied. */
static void fill(void *out, deft_dtype dt, int64_t cnt, double x) {
    switch (dt) {
    case DEFT_F32: FILL(float, (float)x); break;
    case DEFT_F64: FILL(double, x); break;
    case DEFT_F16: FILL(uint16_t, deft_half_pack((float)x)); break;
    case DEFT_BF16: FILL(uint16_t, deft_bf16_pack((float)x)); break;
    default: FILL(int32_t, deft_f64_to_i32(x)); break;
    }
}

/* EXPR computes element i as a double. */
#define CREATE_LOOP(EXPR)                                                                                        \
    do {                                                                                                         \
        switch (dt) {                                                                                            \
        case DEFT_F32: {                                                                                         \
            float *o = out;                                                                                      \
            DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN / 8))                              \
            for (int64_t i = 0; i < cnt; i++) o[i] = (float)(EXPR);                                              \
            break;                                                                                               \
        }                                                                                                        \
        case DEFT_F64: {                                                                                         \
            double *o = out;                                                                                     \
            DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN / 8))                              \
            for (int64_t i = 0; i < cnt; i++) o[i] = (EXPR);                                                     \
            break;                                                                                               \
        }                                                                                                        \
        default:                                                                                                 \
            DEFT_OMP(parallel for schedule(static) if (cnt > DEFT_CPU_PAR_MIN / 8))                              \
            for (int64_t i = 0; i < cnt; i++) deft_store_from_f64(out, dt, i, (EXPR));                                \
            break;                                                                                               \
        }                                                                                                        \
    } while (0)

deft_status deft_cpu_create(const deft_tensor *n, void *out) {
    const deft_dtype dt = n->dtype;
    const int64_t cnt = deft_shape_numel(n->ndim, n->shape);
    if ((unsigned)dt >= DEFT_DTYPE_COUNT) return deft_cpu_dtype_error(n, dt);
    switch (n->op) {
    case DEFT_OP_FULL:
        fill(out, dt, cnt, n->p.scalar);
        return DEFT_OK;
    case DEFT_OP_ARANGE: {
        const double start = n->p.arange.start, step = n->p.arange.step;
        CREATE_LOOP(start + (double)i * step);
        return DEFT_OK;
    }
    case DEFT_OP_UNIFORM: {
        if (!deft_cpu_is_float(dt)) return deft_cpu_dtype_error(n, dt);
        const double a = n->p.rng.a, w = n->p.rng.b - n->p.rng.a;
        const uint64_t seed = n->p.rng.seed;
        CREATE_LOOP(a + w * deft_rng_uniform01(seed, (uint64_t)i));
        return DEFT_OK;
    }
    case DEFT_OP_NORMAL: {
        if (!deft_cpu_is_float(dt)) return deft_cpu_dtype_error(n, dt);
        const double mean = n->p.rng.a, sd = n->p.rng.b;
        const uint64_t seed = n->p.rng.seed;
        CREATE_LOOP(mean + sd * deft_rng_normal(seed, (uint64_t)i));
        return DEFT_OK;
    }
    default:
        return deft_set_error(DEFT_ERR_INVALID, "cpu create: %s is not a creation op", deft_op_name(n->op));
    }
}
