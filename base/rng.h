/* Counter-based random numbers: value i of stream `seed` depends on nothing else, so the CPU and every GPU thread
 * compute the same tensor, in any order, and a recomputed tensor gets the same values. */
#ifndef DEFT_RNG_H
#define DEFT_RNG_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DEFT_HD __host__ __device__ __forceinline__
#else
#define DEFT_HD static inline
#endif

DEFT_HD uint64_t deft_rng_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
DEFT_HD double deft_rng_uniform01(uint64_t seed, uint64_t i) {
    uint64_t r = deft_rng_mix(deft_rng_mix(seed) ^ (i * 0xd1b54a32d192ed03ull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller over the pair (2i, 2i+1) of the stream. */
DEFT_HD double deft_rng_normal(uint64_t seed, uint64_t i) {
    double u1 = deft_rng_uniform01(seed, 2 * i);
    double u2 = deft_rng_uniform01(seed, 2 * i + 1);
    double r = sqrt(-2.0 * log(1.0 - u1));   /* 1 - u1 is in (0, 1]: never log(0) */
    return r * cos(6.283185307179586 * u2);
}

#endif
