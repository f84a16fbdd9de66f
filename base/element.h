/* One element of any dtype as a double, and back: the slow, general path shared by the builder (parameter
 * initialisation) and the CPU kernels (f16, bf16 and i32 loops). */
#ifndef DEFT_ELEMENT_H
#define DEFT_ELEMENT_H

#include <stdint.h>

#include "deft.h"
#include "half.h"

/* Float to i32 truncates toward zero as torch does; out-of-range values saturate and NaN gives 0, because the bare
 * C conversion is undefined for all three. */
static inline int32_t deft_f64_to_i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}

static inline double deft_load_as_f64(const void *base, deft_dtype dt, int64_t i) {
    switch (dt) {
    case DEFT_F32: return ((const float *)base)[i];
    case DEFT_F64: return ((const double *)base)[i];
    case DEFT_F16: return deft_half_unpack(((const uint16_t *)base)[i]);
    case DEFT_BF16: return deft_bf16_unpack(((const uint16_t *)base)[i]);
    case DEFT_I32: return ((const int32_t *)base)[i];
    default: return 0.0;
    }
}

/* Halves are rounded from float (double -> float -> half), as the CUDA backend and torch do. */
static inline void deft_store_from_f64(void *base, deft_dtype dt, int64_t i, double v) {
    switch (dt) {
    case DEFT_F32: ((float *)base)[i] = (float)v; break;
    case DEFT_F64: ((double *)base)[i] = v; break;
    case DEFT_F16: ((uint16_t *)base)[i] = deft_half_pack((float)v); break;
    case DEFT_BF16: ((uint16_t *)base)[i] = deft_bf16_pack((float)v); break;
    case DEFT_I32: ((int32_t *)base)[i] = deft_f64_to_i32(v); break;
    default: break;
    }
}

#endif
