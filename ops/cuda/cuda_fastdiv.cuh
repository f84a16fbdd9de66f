/* Division by a divisor fixed before the launch, as a multiply-high, an add and a shift: index walks divide once per
 * dim per element, and a 64-bit division on the GPU is a long software routine. Exact for every dividend below 2^32
 * (Granlund and Montgomery's round-up method with a 33-bit multiplier, its top bit being the `+ n`). */
#ifndef DEFT_CUDA_FASTDIV_CUH
#define DEFT_CUDA_FASTDIV_CUH

#include <stdint.h>

typedef struct deft_fastdiv {
    uint32_t d, magic, shift;
} deft_fastdiv;

/* d in [1, 2^32): shift = ceil(log2 d), magic = floor(2^32 (2^shift - d) / d) + 1, which is below 2^32. */
static inline deft_fastdiv deft_fastdiv_make(uint32_t d) {
    uint32_t s = 0;
    while (s < 32 && ((uint64_t)1 << s) < d) s++;
    const uint64_t magic = (((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1;
    deft_fastdiv f = {d, (uint32_t)magic, s};
    return f;
}

__host__ __device__ __forceinline__ uint32_t deft_fastdiv_div(const deft_fastdiv &f, uint32_t n) {
#ifdef __CUDA_ARCH__
    const uint64_t hi = __umulhi(n, f.magic);
#else
    const uint64_t hi = ((uint64_t)n * f.magic) >> 32;
#endif
    return (uint32_t)((hi + n) >> f.shift);
}

#endif
