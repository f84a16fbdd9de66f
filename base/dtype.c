/* dtype facts and the public half-precision conversions. */
#include <math.h>

#include "base.h"
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




uint16_t deft_f32_to_f16(float f) { return deft_half_pack(f); }
float deft_f16_to_f32(uint16_t h) { return deft_half_unpack(h); }
uint16_t deft_f32_to_bf16(float f) { return deft_bf16_pack(f); }
float deft_bf16_to_f32(uint16_t h) { return deft_bf16_unpack(h); }
