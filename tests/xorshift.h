/* The small xorshift generators the planner, schedule-order and allocator tests draw their seeded random cases
 * from. They live here so that every test steps them the same way; each test keeps its own state and seed, so
 * the sequences (and with them the cases each test checks) are unchanged. */
#ifndef DEFT_TEST_XORSHIFT_H
#define DEFT_TEST_XORSHIFT_H

#include <stdint.h>

/* Marsaglia's xorshift64 (13, 7, 17): advances *s and returns the new state. */
static inline uint64_t xorshift64(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A value in [0, n), n > 0. */
static inline int xorshift64_below(uint64_t *s, int n) { return (int)(xorshift64(s) % (uint64_t)n); }

/* Marsaglia's xorshift32 (13, 17, 5): advances *x and returns the new state. */
static inline uint32_t xorshift32(uint32_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

#endif
