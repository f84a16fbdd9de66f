/* dtype facts and the public half-precision conversions. */
#include <math.h>

#include "graph_internal.h"
#include "half.h"

size_t deft_dtype_size(deft_dtype dt) {
    switch (dt) {
    case DEFT_F32: return 4;
    case DEFT_F64: return 8;
    case DEFT_F16: return 2;
    case DEFT_BF16: return 2;
    case DEFT_I32: return 4;
    default: return 0;
    }
}

const char *deft_dtype_name(deft_dtype dt) {
    switch (dt) {
    case DEFT_F32: return "f32";
    case DEFT_F64: return "f64";
    case DEFT_F16: return "f16";
    case DEFT_BF16: return "bf16";
    case DEFT_I32: return "i32";
    default: return "invalid";
    }
}

double deft_load_as_f64(const void *base, deft_dtype dt, int64_t i) {
    switch (dt) {
    case DEFT_F32: return ((const float *)base)[i];
    case DEFT_F64: return ((const double *)base)[i];
    case DEFT_F16: return deft_half_unpack(((const uint16_t *)base)[i]);
    case DEFT_BF16: return deft_bf16_unpack(((const uint16_t *)base)[i]);
    case DEFT_I32: return ((const int32_t *)base)[i];
    default: return 0.0;
    }
}

static int32_t deft_f64_to_i32(double v) {
    if (isnan(v)) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}

void deft_store_from_f64(void *base, deft_dtype dt, int64_t i, double v) {
    switch (dt) {
    case DEFT_F32: ((float *)base)[i] = (float)v; break;
    case DEFT_F64: ((double *)base)[i] = v; break;
    case DEFT_F16: ((uint16_t *)base)[i] = deft_half_pack((float)v); break;
    case DEFT_BF16: ((uint16_t *)base)[i] = deft_bf16_pack((float)v); break;
    case DEFT_I32: ((int32_t *)base)[i] = deft_f64_to_i32(v); break;
    default: break;
    }
}

uint16_t deft_f32_to_f16(float f) { return deft_half_pack(f); }
float deft_f16_to_f32(uint16_t h) { return deft_half_unpack(h); }
uint16_t deft_f32_to_bf16(float f) { return deft_bf16_pack(f); }
float deft_bf16_to_f32(uint16_t h) { return deft_bf16_unpack(h); }
