/* A float's bits and back, and IEEE half and bfloat16 conversions on the host, round to nearest even; NaN stays
 * NaN. */
#ifndef DEFT_HALF_H
#define DEFT_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t deft_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float deft_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint64_t deft_f64_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static inline double deft_bits_f64(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static inline uint16_t deft_half_pack(float f) {
    uint32_t x = deft_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* overflow (after rounding) or inf */
    if (absx < 0x38800000u) {                                            /* subnormal half or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;                   /* below half the smallest subnormal */
        uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absx >> 23);                             /* 14 .. 24 */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static inline float deft_half_unpack(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f) return deft_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return deft_bits_f32(sign);
        float v = (float)m * (1.0f / 16777216.0f);                      /* m * 2^-24 */
        return sign ? -v : v;
    }
    return deft_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t deft_bf16_pack(float f) {
    uint32_t x = deft_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);   /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float deft_bf16_unpack(uint16_t b) {
    return deft_bits_f32((uint32_t)b << 16);
}

#endif
