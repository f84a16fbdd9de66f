/* Checked arithmetic for counts and byte sizes. A wrapped product or sum is how a huge shape becomes a small malloc
 * and then a buffer overrun, so every element count, byte size and sum of sizes goes through these. Each returns
 * false (leaving *out unspecified) when the exact result does not fit. Host code only: nvcc's device side lacks the
 * builtins. */
#ifndef DEFT_CHECKED_H
#define DEFT_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most bytes one tensor, one arena or one program may have: pointer differences over a buffer must not
 * overflow, and no allocator serves more. */
#define DEFT_MAX_BYTES ((size_t)PTRDIFF_MAX)
_Static_assert(SIZE_MAX >= INT64_MAX, "an element count that fits int64 converts to size_t exactly");

static inline bool deft_i64_mul(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool deft_i64_add(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline bool deft_size_mul(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool deft_size_add(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

/* a + b, or SIZE_MAX when that passes DEFT_MAX_BYTES: for totals that are compared with a budget, where "too much"
 * is the whole answer. */
static inline size_t deft_size_add_sat(size_t a, size_t b) {
    size_t s;
    return deft_size_add(a, b, &s) && s <= DEFT_MAX_BYTES ? s : SIZE_MAX;
}

/* The element count of a shape: every dimension >= 0 and the product an int64. */
static inline bool deft_shape_count(int ndim, const int64_t *shape, int64_t *out) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || !deft_i64_mul(n, shape[i], &n)) return false;
    *out = n;
    return true;
}

/* The bytes of a shape of elements of elem_size bytes: the count checked, and the product at most DEFT_MAX_BYTES. */
static inline bool deft_shape_bytes(int ndim, const int64_t *shape, size_t elem_size, size_t *out) {
    int64_t n;
    size_t bytes;
    if (!deft_shape_count(ndim, shape, &n)) return false;
    if (!deft_size_mul((size_t)n, elem_size, &bytes) || bytes > DEFT_MAX_BYTES) return false;
    *out = bytes;
    return true;
}

#endif
